package cluster_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Hour-long waiters live in the snapshot, and a node restored from one
// applies the version 11 wait bound afterwards: SetShortWaits is not in
// the snapshot, the FSM sets it from the cluster version it restored. A
// follower restarted from its own snapshot and a follower brought back by
// InstallSnapshot each show the hour-long waiter with its wait, and an
// hour-long waiter queued after the restores joins every node's queue
// alike (a restored node that fell back to the 5-minute bound would
// reject it and its table would diverge).
func TestLongWaitersSurviveSnapshotRestore(t *testing.T) {
	// On bolt, as TestLabelsSurviveSnapshotRestore: on wal the stopped
	// follower would catch up from the leader's log.
	c := startClusterOpts(t, local.Options{LogStore: cluster.LogStoreBolt, Tune: func(cfg *cluster.Config) { cfg.TrailingLogs = 8 }})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 11", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionLongWaits
	})
	tok := mustGrant(t, do(t, c.dial(li), acquireMsg("k", "h", 200, 0)))
	first, err := c.dial(li).Start(acquireMsg("k", "w1", 30, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	queueIs := func(when string, i int, owners ...string) {
		t.Helper()
		var kr wire.KeyReport
		ok := testkit.Eventually(20*time.Second, func() bool {
			kr, err = c.Node(i).Inspect("k")
			if err != nil || kr.Holder == nil || kr.Holder.Token != tok || len(kr.Queue) != len(owners) {
				return false
			}
			for j, w := range kr.Queue {
				if w.Owner != owners[j] || w.WaitMs != locksm.MaxWaitMs || w.WaitRemainingMs <= locksm.MaxShortWaitMs {
					return false
				}
			}
			return true
		})
		if !ok {
			t.Fatalf("%s: node %d: inspect %v holder %+v queue %+v, want hour-long waiters %v", when, i, err, kr.Holder, kr.Queue, owners)
		}
	}
	for i := range c.Size() {
		queueIs("before any snapshot", i, "w1")
	}
	snapshotIndex := func(i int) uint64 {
		n, _ := strconv.ParseUint(c.Node(i).Raft().Stats()["last_snapshot_index"], 10, 64)
		return n
	}

	fi := follower(c, li)
	queuedAt := c.Node(fi).Raft().AppliedIndex()
	if err := c.Node(fi).Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(fi); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(fi); err != nil {
		t.Fatal(err)
	}
	if si := snapshotIndex(fi); si < queuedAt {
		t.Fatalf("restarted follower's snapshot index %d, before the waiter's applied index %d", si, queuedAt)
	}
	queueIs("a follower restarted from its snapshot", fi, "w1")
	if v := c.Node(fi).ClusterVersion(); v < wire.VersionLongWaits {
		t.Fatalf("a follower restarted from its snapshot: cluster version %d", v)
	}

	fo := (fi + 1) % c.Size()
	if fo == li {
		fo = (fo + 1) % c.Size()
	}
	if err := c.Stop(fo); err != nil {
		t.Fatal(err)
	}
	behind := c.Node(li).Raft().LastIndex()
	lc := c.client()
	defer lc.close()
	var last uint64
	for i := 0; i < 30; i++ {
		last = mustGrant(t, lc.do(acquireMsg(fmt.Sprintf("fill/%d", i), "o", 200, 0)))
	}
	for _, i := range []int{li, fi} {
		testkit.WaitFor(t, "the running nodes applied every grant", 10*time.Second, func() bool {
			return c.Node(i).LastToken() == last
		})
		if err := c.Node(i).Raft().Snapshot().Error(); err != nil {
			t.Fatal(err)
		}
	}
	if first, err := cluster.LogFirstIndex(c.Node(li)); err != nil || first <= behind {
		t.Fatalf("the leader's first log index %d (%v), want above the stopped follower's %d", first, err, behind)
	}
	if err := c.Restart(fo); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the follower restored from an installed snapshot", 20*time.Second, func() bool {
		return c.Node(fo).LastToken() == last && snapshotIndex(fo) > behind
	})
	queueIs("a follower restored by InstallSnapshot", fo, "w1")

	// After both restores: a second hour-long waiter joins every queue.
	second, err := c.dial(li).Start(acquireMsg("k", "w2", 30, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.Size() {
		queueIs("after the restores", i, "w1", "w2")
	}
	for _, w := range []struct {
		name string
		done <-chan struct{}
	}{{"w1", first.Done}, {"w2", second.Done}} {
		select {
		case <-w.done:
			t.Fatalf("hour-long waiter %s answered early", w.name)
		default:
		}
	}
}
