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
