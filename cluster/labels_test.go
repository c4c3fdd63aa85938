package cluster_test

import (
	"errors"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// Owner labels on real nodes (version 8): a labelled acquire's label is
// replicated with it (every node's table has it on the holder), inspect
// shows it for a holder and a waiter, on the leader and on a follower, and
// a hand-off gives the key to the waiter with the waiter's label. A bad
// label is refused invalid_label, nothing executed.
func TestLabelsReplicatedAndInspected(t *testing.T) {
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 8", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionLabels
	})
	conn := c.dial(li)
	a := acquireMsg("k", "owner-a", 120, 0)
	a.Label = "job-1"
	tok := mustGrant(t, do(t, conn, a))
	w := acquireMsg("k", "owner-b", 120, 60*time.Second)
	w.Label = "req/42"
	waiter := queueWaiter(t, c, li, conn, "k", "owner-b", 120, 60*time.Second)
	_ = waiter // unlabelled: the queue shows "" for it
	labelled := c.dial(li)
	call, err := labelled.Start(w)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{li, follower(c, li)} {
		testkit.WaitFor(t, "the queue on every node", 20*time.Second, func() bool {
			kr, err := c.Node(i).Inspect("k")
			return err == nil && len(kr.Queue) == 2
		})
		kr, _ := c.Node(i).Inspect("k")
		if kr.Holder == nil || kr.Holder.Label != "job-1" || kr.Queue[0].Label != "" || kr.Queue[1].Label != "req/42" {
			t.Fatalf("node %d: inspect holder %+v queue %+v", i, kr.Holder, kr.Queue)
		}
	}
	for i := range c.Size() {
		testkit.WaitFor(t, "the label on every node's holder", 20*time.Second, func() bool {
			h, ok := c.holderOn(i, "k")
			return ok && h.Token == tok && h.Label == "job-1"
		})
	}
	// The release hands the key to the unlabelled waiter, then to the
	// labelled one.
	if m := do(t, conn, releaseMsg("k", "owner-a", tok)); m.Type != wire.TypeOK {
		t.Fatalf("release: %s", describe(m))
	}
	<-waiter.Done
	if waiter.Err != nil {
		t.Fatal(waiter.Err)
	}
	if m := do(t, conn, releaseMsg("k", "owner-b", mustGrant(t, waiter.Reply))); m.Type != wire.TypeOK {
		t.Fatalf("release: %s", describe(m))
	}
	<-call.Done
	if call.Err != nil {
		t.Fatal(call.Err)
	}
	tok = mustGrant(t, call.Reply)
	kr, err := c.Node(li).Inspect("k")
	if err != nil || kr.Holder == nil || kr.Holder.Token != tok || kr.Holder.Label != "req/42" {
		t.Fatalf("after the hand-off: %v %+v", err, kr.Holder)
	}
	bad := acquireMsg("x", "owner-a", 10, 0)
	bad.Label = "a b"
	if m := do(t, conn, bad); m.Type != wire.TypeError || m.Code != wire.CodeInvalidLabel {
		t.Fatalf("bad label: %s", describe(m))
	}
}

// Before every member speaks version 8 nobody can send a label: a client
// of a version 7 node refuses it before writing (not_supported), and a
// label written anyway on a version 7 connection closes it; an acquire
// without a label works as before.
func TestLabelsNeedVersion8(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionSessions }})
	li := c.leader()
	conn := c.dial(li)
	if conn.Peer().Version != wire.VersionSessions {
		t.Fatalf("negotiated %d", conn.Peer().Version)
	}
	a := acquireMsg("k", "o", 10, 0)
	a.Label = "job"
	if _, err := conn.Start(a); !errors.Is(err, wire.ErrNotSupported) {
		t.Fatalf("labelled acquire on a version 7 connection: %v", err)
	}
	a.Label = ""
	mustGrant(t, do(t, conn, a))

	raw, r, _ := c.rawConnVersion(li, wire.VersionSessions)
	m := acquireMsg("k2", "o", 10, 0)
	m.ID, m.Label = 1, "job"
	b, err := wire.AppendMsg(nil, &m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Write(b); err != nil {
		t.Fatal(err)
	}
	var got wire.Msg
	if err := r.ReadMsg(&got); err != nil || got.Type != wire.TypeError || got.Code != wire.CodeUnexpectedFrame {
		t.Fatalf("label on a version 7 connection: %v %s", err, describe(got))
	}
	if h, ok := c.holderOn(li, "k2"); ok {
		t.Fatalf("k2 held: %+v", h)
	}
}

// Owner labels live in the snapshot (locksm snapshot version 5), not only
// in the log: a follower restarted from a snapshot of its own, and a
// follower that fell behind the others' compacted logs and is brought back
// by InstallSnapshot, each show the holder's label and the waiter's in
// inspect, as the leader does.
func TestLabelsSurviveSnapshotRestore(t *testing.T) {
	// On bolt: raft-wal serves compacted entries from the segment it has
	// open until it is reopened (TestWALRestartKeepsLogAndTerm), so on wal
	// the stopped follower would catch up from the leader's log instead of
	// by InstallSnapshot.
	c := startClusterOpts(t, local.Options{LogStore: cluster.LogStoreBolt, Tune: func(cfg *cluster.Config) { cfg.TrailingLogs = 8 }})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 8", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionLabels
	})
	conn := c.dial(li)
	a := acquireMsg("k", "owner-a", 200, 0)
	a.Label = "job-1"
	tok := mustGrant(t, do(t, conn, a))
	w := acquireMsg("k", "owner-b", 200, 200*time.Second)
	w.Label = "req/42"
	waiter, err := c.dial(li).Start(w) // stays queued for the whole test
	if err != nil {
		t.Fatal(err)
	}
	labelsOn := func(when string, i int) {
		t.Helper()
		var kr wire.KeyReport
		ok := testkit.Eventually(20*time.Second, func() bool {
			kr, err = c.Node(i).Inspect("k")
			return err == nil && kr.Holder != nil && kr.Holder.Token == tok && len(kr.Queue) == 1
		})
		if !ok || kr.Holder.Label != "job-1" || kr.Queue[0].Owner != "owner-b" || kr.Queue[0].Label != "req/42" {
			t.Fatalf("%s: node %d: inspect %v holder %+v queue %+v", when, i, err, kr.Holder, kr.Queue)
		}
	}
	for i := range c.Size() {
		labelsOn("before any snapshot", i)
	}
	// A follower snapshots (the labelled acquire and the waiter are in it)
	// and restarts: its state comes from the snapshot, the log after it
	// holds neither.
	fi := follower(c, li)
	c.restartFromOwnSnapshot(fi)
	labelsOn("a follower restarted from its snapshot", fi)

	// The other follower stops; the leader grants on and compacts its log
	// past the follower's last entry, so the follower can only catch up
	// by InstallSnapshot.
	fo := c.restoreByInstallSnapshot(li, fi)
	labelsOn("a follower restored by InstallSnapshot", fo)
	labelsOn("the leader", li)
	select {
	case <-waiter.Done:
		t.Fatalf("the waiter was answered: %v %s", waiter.Err, describe(waiter.Reply))
	default:
	}
}
