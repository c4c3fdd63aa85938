package cluster_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/local"
)

// hookHandler writes every record through its text handler, then shows
// it (with the attributes its logger was built with) to hook.
type hookHandler struct {
	slog.Handler
	attrs []slog.Attr
	hook  func(r slog.Record, attrs []slog.Attr)
}

func (h *hookHandler) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	h.hook(r, h.attrs)
	return err
}

func (h *hookHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &hookHandler{Handler: h.Handler.WithAttrs(as), attrs: append(slices.Clip(h.attrs), as...), hook: h.hook}
}

func (h *hookHandler) WithGroup(name string) slog.Handler {
	return &hookHandler{Handler: h.Handler.WithGroup(name), attrs: h.attrs, hook: h.hook}
}

// syncBuffer is a bytes.Buffer safe for the nodes' concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// nodeOf is the "node" attribute a record's logger carries.
func nodeOf(attrs []slog.Attr) string {
	for _, a := range attrs {
		if a.Key == "node" {
			return a.Value.String()
		}
	}
	return ""
}

// Issue 32, defect 4. A leader stopped together with both its followers
// (here: they stop as its hand-over begins, so the transfer cannot
// happen) hands nothing over, and its log says so: no "leadership handed
// over before shutdown" with an empty target, no "leadership
// transferred"; a warning that it was not handed over, and why. Shutdown
// reports no successor.
func TestLeaderShutdownWithItsFollowersClaimsNoHandOver(t *testing.T) {
	type rec struct {
		node, msg string
		level     slog.Level
	}
	var (
		mu   sync.Mutex
		recs []rec
		c    *local.Cluster
		li   = -1
		once sync.Once
		out  syncBuffer
	)
	stopFollowers := func() {
		for i := 0; i < c.Size(); i++ {
			if i != li {
				if err := c.Stop(i); err != nil {
					t.Errorf("stopping node %d: %v", i, err)
				}
			}
		}
	}
	h := &hookHandler{Handler: slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}),
		hook: func(r slog.Record, attrs []slog.Attr) {
			node := nodeOf(attrs)
			mu.Lock()
			recs = append(recs, rec{node, r.Message, r.Level})
			leaderID := ""
			if li >= 0 {
				leaderID = c.ID(li)
			}
			mu.Unlock()
			// The followers stop once the leader has chosen its target
			// and begun: on the leader's goroutine, so the transfer
			// starts only after they are gone.
			if r.Message == "handing leadership over" && leaderID != "" && node == leaderID {
				once.Do(stopFollowers)
			}
		}}
	var err error
	c, err = local.Start(local.Options{Nodes: 3, Dir: t.TempDir(), Tune: local.FastRaft, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	i, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	li = i
	leaderID := c.ID(li)
	mu.Unlock()

	to, err := c.Shutdown(ctx, li)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var began, warned bool
	for _, r := range recs {
		if r.node != leaderID {
			continue
		}
		switch {
		case r.msg == "handing leadership over":
			began = true
		case r.msg == "leadership handed over before shutdown", r.msg == "leadership transferred":
			t.Errorf("the leader claims a hand-over (%q) though its followers were gone; Shutdown named %q", r.msg, to)
		case strings.HasPrefix(r.msg, "leadership not handed over before shutdown") && r.level == slog.LevelWarn:
			warned = true
		}
	}
	if !began {
		t.Fatalf("the leader never began a hand-over; its log:\n%s", out.String())
	}
	if !warned {
		t.Errorf("no warning that leadership was not handed over; the log:\n%s", out.String())
	}
	if to != "" {
		t.Errorf("Shutdown reports leadership handed to %q", to)
	}
	if t.Failed() {
		t.Logf("the log:\n%s", out.String())
	}
}
