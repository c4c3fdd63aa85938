package cluster_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/local"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// A resume naming an unknown session floods nothing (issue 39, finding
// 9): the node answers E no_session and closes the connection, so one
// connection gets one refusal however many resumes it writes, and the
// "session request refused" line is rate-limited across connections while
// every refusal is counted. Before, the connection stayed open and every
// resume in its stream cost a refusal and a warn line: 20,000 lines in
// 95 ms from one connection.
func TestResumeOfUnknownSessionClosesAndIsNotAFlood(t *testing.T) {
	var (
		mu    sync.Mutex
		lines int
		out   syncBuffer
	)
	h := &hookHandler{Handler: slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}),
		hook: func(r slog.Record, _ []slog.Attr) {
			if r.Message == "session request refused" {
				mu.Lock()
				lines++
				mu.Unlock()
			}
		}}
	lc, err := local.Start(local.Options{Nodes: 3, Dir: t.TempDir(), Tune: local.FastRaft, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	li, err := lc.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &testCluster{Cluster: lc, t: t}

	// One connection writes 20,000 resumes of a session nobody opened.
	conn, r, _ := c.rawConnVersion(li, wire.VersionSessions)
	flood := make([]wire.Msg, 20_000)
	for i := range flood {
		flood[i] = wire.Msg{Type: wire.TypeResume, ID: uint64(i + 1), Session: 4242, High: 1}
	}
	var b []byte
	for i := range flood {
		if b, err = wire.AppendMsg(b, &flood[i]); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _, _ = conn.Write(b) }() // the node stops reading: the write may fail at the close
	var m wire.Msg
	if err := r.ReadMsg(&m); err != nil {
		t.Fatalf("reading the refusal: %v", err)
	}
	if m.Type != wire.TypeError || m.Code != wire.CodeOf(locksm.ErrNoSession) {
		t.Fatalf("the first resume got %s, want E no_session", describe(m))
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		err := r.ReadMsg(&m)
		if isTimeoutErr(err) {
			t.Fatal("the connection stayed open after the refusal")
		}
		if err != nil {
			break // closed (EOF, or reset with our unread resumes)
		}
		if m.Type != wire.TypeNotice {
			t.Fatalf("after the refusal the connection answers %s", describe(m))
		}
	}

	// 40 connections, one unknown resume each, within a second or two.
	start := time.Now()
	for range 40 {
		cn, cr, _ := c.rawConnVersion(li, wire.VersionSessions)
		rawSend(t, cn, wire.Msg{Type: wire.TypeResume, ID: 1, Session: 4243, High: 1})
		if err := cr.ReadMsg(&m); err != nil || m.Type != wire.TypeError {
			t.Fatalf("unknown resume: %v %s", err, describe(m))
		}
		cn.Close()
	}
	elapsed := time.Since(start)
	mu.Lock()
	got := lines
	mu.Unlock()
	// 5 lines a second, and the first connection's one.
	if limit := 1 + 5*(int(elapsed/time.Second)+1); got > limit {
		t.Fatalf("41 refusals in %v logged %d lines, want at most %d", elapsed.Round(time.Millisecond), got, limit)
	}
	if n := metric(t, lc.Node(li).MetricsRegistry(), "ticketing_node_session_refusals_total"); n != 41 {
		t.Fatalf("ticketing_node_session_refusals_total = %v, want 41", n)
	}
}
