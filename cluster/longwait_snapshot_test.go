package cluster_test

import (
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
	fi := follower(c, li)
	c.restartFromOwnSnapshot(fi)
	queueIs("a follower restarted from its snapshot", fi, "w1")
	if v := c.Node(fi).ClusterVersion(); v < wire.VersionLongWaits {
		t.Fatalf("a follower restarted from its snapshot: cluster version %d", v)
	}

	fo := c.restoreByInstallSnapshot(li, fi)
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
