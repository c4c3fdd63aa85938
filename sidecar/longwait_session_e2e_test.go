// Hour-long waits across a leader change, on real nodes with a broker
// session: the new leader re-arms each adopted wait from the replicated
// stamps (EnqueuedAt + WaitMs) against its wall clock (Config.Now), so an
// hour-long waiter keeps the rest of its hour, and one whose hour has all
// but run out by the new leader's clock gets a definite TIMEOUT, never a
// grant, while the key stays with its holder.
package sidecar

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// startShiftedSessionCluster is startSessionCluster with every node's wall
// clock (cluster.Config.Now) shifted by *shift.
func startShiftedSessionCluster(t *testing.T, shift *atomic.Int64) (*local.Cluster, *Broker) {
	t.Helper()
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: testLogger(), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.Now = func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b := newBroker(t, c, nil)
	testkit.WaitFor(t, "the cluster session attached", 20*time.Second, func() bool {
		si := b.Info().Session
		return si != nil && si.State == "attached"
	})
	testkit.WaitFor(t, "cluster version 11", 20*time.Second, func() bool {
		return c.Node(leaderOf(t, c)).ClusterVersion() >= wire.VersionLongWaits
	})
	return c, b
}

type longAcqResult struct {
	lk  Lock
	err error
}

func queueLongWaiter(t *testing.T, c *local.Cluster, b *Broker, key, owner string) (<-chan longAcqResult, int) {
	t.Helper()
	out := make(chan longAcqResult, 1)
	if _, err := b.AcquireAsync(key, owner, 30*time.Second, time.Hour, func(lk Lock, err error) { out <- longAcqResult{lk, err} }); err != nil {
		t.Fatal(err)
	}
	li := leaderOf(t, c)
	testkit.WaitFor(t, "the hour-long waiter queued", 10*time.Second, func() bool {
		kr, err := c.Node(li).Inspect(key)
		return err == nil && len(kr.Queue) == 1 && kr.Queue[0].Owner == owner && kr.Queue[0].WaitMs == uint32(time.Hour/time.Millisecond)
	})
	return out, li
}

// With the clock unshifted the new leader adopts the hour-long waiter with
// (nearly) its whole hour on its timer, and hands it the key on release.
func TestE2ESessionLeaderKillKeepsHourLongWait(t *testing.T) {
	var shift atomic.Int64
	c, b := startShiftedSessionCluster(t, &shift)
	ctx := ctxT(t, 60*time.Second)
	held, err := b.Acquire(ctx, "k", "holder", 200*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, li := queueLongWaiter(t, c, b, "k", "w")
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	waitResumed(t, b)
	nl := leaderOf(t, c)
	testkit.WaitFor(t, "the new leader's timer holds the rest of the hour", 10*time.Second, func() bool {
		kr, err := c.Node(nl).Inspect("k")
		return err == nil && len(kr.Queue) == 1 && kr.Queue[0].WaitFrom == wire.FromLeaderTimer &&
			kr.Queue[0].WaitRemainingMs > (time.Hour-time.Minute).Milliseconds()
	})
	select {
	case r := <-out:
		t.Fatalf("the hour-long waiter answered after the leader change: %+v %v", r.lk, r.err)
	case <-time.After(2 * time.Second):
	}
	if err := b.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-out:
		if r.err != nil || r.lk.Token <= held.Token {
			t.Fatalf("the hour-long waiter after the release: %+v %v", r.lk, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the hour-long waiter was not granted after the release")
	}
}

// The nodes' wall clock jumps 59 min 55 s ahead while the waiter waits,
// then the leader dies: by the new leader's clock the wait has 5 s left,
// so it times out (TIMEOUT, definite) and the key stays with its holder.
func TestE2ESessionLeaderKillHourLongWaitEndsByStamps(t *testing.T) {
	var shift atomic.Int64
	c, b := startShiftedSessionCluster(t, &shift)
	ctx := ctxT(t, 60*time.Second)
	held, err := b.Acquire(ctx, "k", "holder", 200*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, li := queueLongWaiter(t, c, b, "k", "w")
	shift.Store(int64(time.Hour - 5*time.Second))
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	waitResumed(t, b)
	select {
	case r := <-out:
		if !errors.Is(r.err, ErrTimeout) {
			t.Fatalf("the waiter whose hour ran out by the new leader's clock: %+v %v, want ErrTimeout", r.lk, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter whose hour ran out by the new leader's clock was not answered")
	}
	nl := leaderOf(t, c)
	for i := range c.Size() {
		if i == li {
			continue
		}
		testkit.WaitFor(t, "the holder keeps k, nobody queued", 10*time.Second, func() bool {
			h, ok := holder(c, i, "k")
			kr, err := c.Node(i).Inspect("k")
			return ok && h.Token == held.Token && err == nil && len(kr.Queue) == 0
		})
	}
	_ = nl
	if err := b.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
}
