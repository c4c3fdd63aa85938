package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Issue 41: a wait may be an hour once every member runs protocol version
// 11. Before, an older member would reject the entry the others queue, so
// a leader of a version 10 cluster refuses a wait over 5 minutes before
// proposing it (not_supported, definite), and queues a 5-minute one as
// before.
func TestLongWaitsNeedVersion11(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionLogVerify }})
	li := c.leader()
	if v := c.Node(li).ClusterVersion(); v != wire.VersionLogVerify {
		t.Fatalf("cluster version %d", v)
	}
	holder := c.dial(li)
	mustGrant(t, do(t, holder, acquireMsg("k", "h", 30, 0)))
	long := acquireMsg("k", "w", 30, locksm.MaxShortWaitMs*time.Millisecond+time.Millisecond)
	if r := do(t, c.dial(li), long); r.Type != wire.TypeError || r.Code != wire.CodeNotSupported {
		t.Fatalf("a wait of 300.001 s on a version 10 cluster: %s, want E(not_supported)", describe(r))
	}
	short, err := c.dial(li).Start(acquireMsg("k", "w", 30, locksm.MaxShortWaitMs*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the 5-minute waiter queued", 10*time.Second, func() bool {
		kr, err := c.Node(li).Inspect("k")
		return err == nil && len(kr.Queue) == 1 && kr.Queue[0].WaitMs == locksm.MaxShortWaitMs
	})
	select {
	case <-short.Done:
		t.Fatalf("the 5-minute waiter answered: %s", describe(short.Reply))
	default:
	}
}

// On a version 11 cluster an acquire waits up to an hour: it queues with
// its wait (inspect shows it on every node), takes the key in its turn,
// and one over an hour is invalid_wait.
func TestLongWaitQueuesAndIsGranted(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	testkit.WaitFor(t, "cluster version 11", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionLongWaits
	})
	holder := c.dial(li)
	tok := mustGrant(t, do(t, holder, acquireMsg("k", "h", 30, 0)))
	if r := do(t, c.dial(li), acquireMsg("k", "x", 30, time.Hour+time.Millisecond)); r.Type != wire.TypeError || r.Code != wire.CodeInvalidWait {
		t.Fatalf("a wait over an hour: %s, want E(invalid_wait)", describe(r))
	}
	w, err := c.dial(li).Start(acquireMsg("k", "w", 30, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.Size() {
		testkit.WaitFor(t, "the hour-long waiter queued on every node", 10*time.Second, func() bool {
			kr, err := c.Node(i).Inspect("k")
			return err == nil && len(kr.Queue) == 1 && kr.Queue[0].WaitMs == locksm.MaxWaitMs && kr.Queue[0].WaitRemainingMs > locksm.MaxShortWaitMs
		})
	}
	mustType(t, do(t, holder, releaseMsg("k", "h", tok)), wire.TypeOK)
	select {
	case <-w.Done:
	case <-time.After(20 * time.Second):
		t.Fatal("the hour-long waiter was not granted after the release")
	}
	if w.Err != nil || w.Reply.Type != wire.TypeGranted || w.Reply.Token <= tok {
		t.Fatalf("the hour-long waiter: %v %s", w.Err, describe(w.Reply))
	}
}

// A rolling upgrade from version 10 to 11: while any member is still at
// 10 the cluster version stays 10 and every leader (old or new) refuses a
// long wait before proposing it, so no entry the old member would reject
// reaches the log; a 5-minute waiter queued before the upgrade keeps its
// place on every node while the followers restart; once the last member
// runs 11 the cluster version rises and an hour-long waiter queues on
// every node alike.
func TestLongWaitsThroughARollingUpgrade(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionLogVerify }})
	long := func(owner string) wire.Msg { return acquireMsg("k", owner, 30, time.Hour) }
	li := c.leader()
	tok := mustGrant(t, do(t, c.dial(li), acquireMsg("k", "h", 200, 0)))
	if _, err := c.dial(li).Start(acquireMsg("k", "early", 30, locksm.MaxShortWaitMs*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	queuesAre := func(what string, owners ...string) {
		t.Helper()
		for i := range c.Size() {
			testkit.WaitFor(t, fmt.Sprintf("%s: node %d's queue of k is %v", what, i, owners), 20*time.Second, func() bool {
				kr, err := c.Node(i).Inspect("k")
				if err != nil || kr.Holder == nil || kr.Holder.Token != tok || len(kr.Queue) != len(owners) {
					return false
				}
				for j, w := range kr.Queue {
					if w.Owner != owners[j] {
						return false
					}
				}
				return true
			})
		}
	}
	queuesAre("before the upgrade", "early")
	for step, i := range []int{(li + 1) % 3, (li + 2) % 3, li} {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
		if err := c.RestartWith(i, func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionLongWaits }); err != nil {
			t.Fatal(err)
		}
		cur := c.leader()
		if step < 2 {
			// A member still at 10: refused by whichever leader serves.
			if v := c.Node(cur).ClusterVersion(); v != wire.VersionLogVerify {
				t.Fatalf("step %d: cluster version %d with a member at 10", step, v)
			}
			if r := do(t, c.dial(cur), long("refused")); r.Type != wire.TypeError || r.Code != wire.CodeNotSupported {
				t.Fatalf("step %d: an hour-long wait with a member at 10: %s, want E(not_supported)", step, describe(r))
			}
		}
		if step < 2 {
			queuesAre(fmt.Sprintf("after node %d runs 11", i), "early")
		} else {
			// The leader's restart ended the waiter's connection: a
			// waiter without a session leaves the line at a leader change.
			queuesAre("after the leader's restart")
		}
	}
	cur := c.leader()
	testkit.WaitFor(t, "cluster version 11", 30*time.Second, func() bool {
		return c.Node(cur).ClusterVersion() >= wire.VersionLongWaits
	})
	if _, err := c.dial(c.leader()).Start(long("late")); err != nil {
		t.Fatal(err)
	}
	queuesAre("after the upgrade", "late")
}
