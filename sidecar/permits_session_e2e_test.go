// Semaphores across a leader change, on real nodes with a broker session
// (issue 41): the line of permit waiters and the permits survive the
// leader's death; the new leader adopts a session's permit waiter as a
// permit acquire and grants it, with its slot, when a permit is released.
package sidecar

import (
	"errors"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

func TestE2ESessionLeaderKillKeepsPermitLine(t *testing.T) {
	c, b := startSessionCluster(t)
	ctx := ctxT(t, 90*time.Second)
	testkit.WaitFor(t, "cluster version 13", 20*time.Second, func() bool {
		return c.Node(leaderOf(t, c)).ClusterVersion() >= wire.VersionSemaphores
	})
	if err := b.SetPermits(ctx, "s", 2); err != nil {
		t.Fatal(err)
	}
	permit := AcquireOptions{Permit: true}
	take := func(owner string) Lock {
		t.Helper()
		type res struct {
			lk  Lock
			err error
		}
		ch := make(chan res, 1)
		if _, err := b.AcquireAsyncOpts([]string{"s"}, owner, 200*time.Second, 0, permit, func(lk Lock, err error) { ch <- res{lk, err} }); err != nil {
			t.Fatal(err)
		}
		r := <-ch
		if r.err != nil || !r.lk.Permit {
			t.Fatalf("permit for %s: %+v %v", owner, r.lk, r.err)
		}
		return r.lk
	}
	a, bb := take("a"), take("b")
	if a.Slot != 0 || bb.Slot != 1 {
		t.Fatalf("slots %d and %d, want 0 and 1", a.Slot, bb.Slot)
	}
	if _, err := b.Acquire(ctx, "s", "x", 30*time.Second, 0); !errors.Is(err, locksm.ErrIsSemaphore) {
		t.Fatalf("a lock acquire of the semaphore: %v", err)
	}
	type res struct {
		lk  Lock
		err error
	}
	out := make(chan res, 1)
	if _, err := b.AcquireAsyncOpts([]string{"s"}, "w", 30*time.Second, time.Minute, permit, func(lk Lock, err error) { out <- res{lk, err} }); err != nil {
		t.Fatal(err)
	}
	li := leaderOf(t, c)
	testkit.WaitFor(t, "the permit waiter queued", 10*time.Second, func() bool {
		kr, err := c.Node(li).Inspect("s")
		return err == nil && kr.QueueLen == 1 && kr.Semaphore != nil && kr.Semaphore.Held == 2
	})
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	waitResumed(t, b)
	nl := leaderOf(t, c)
	testkit.WaitFor(t, "the new leader keeps both permits and the waiter", 10*time.Second, func() bool {
		kr, err := c.Node(nl).Inspect("s")
		return err == nil && kr.QueueLen == 1 && len(kr.Permits) == 2 && kr.Permits[0].Token == a.Token && kr.Permits[1].Token == bb.Token &&
			kr.Queue[0].WaitFrom == wire.FromLeaderTimer
	})
	select {
	case r := <-out:
		t.Fatalf("the permit waiter answered after the leader change: %+v %v", r.lk, r.err)
	case <-time.After(time.Second):
	}
	if err := b.Release(ctx, bb); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-out:
		if r.err != nil || !r.lk.Permit || r.lk.Slot != 1 || r.lk.Token <= bb.Token {
			t.Fatalf("the permit waiter after the release: %+v %v, want slot 1 and a token above %d", r.lk, r.err, bb.Token)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the permit waiter was not granted after the release")
	}
}
