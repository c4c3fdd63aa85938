package sidecar

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// Issue 39, finding 14: the cancel of an eviction was written to the
// session's connection, which died with it unread; the session resumed on
// a new connection, and the cancel was never sent again. The evicted
// waiter kept its place in the key's line, and the asker it made room for
// waited for that room its whole wait. The broker sends the cancels of
// evictions still under way again after a resume.
func TestBrokerEvictionCancelSurvivesAResume(t *testing.T) {
	c := startCluster(t)
	li := leaderOf(t, c)
	var armed, cut atomic.Bool
	d := newReachDialer(t, func(fr netfault.Frame) netfault.Verdict {
		if fr.Dir == netfault.Sent && fr.Msg.Type == wire.TypeCancel && armed.Load() && !cut.Swap(true) {
			return netfault.Cut // the cancel is lost with its connection
		}
		return netfault.Pass
	})
	b := newBroker(t, c, func(cfg *Config) { cfg.Dialer = d.dial; cfg.MaxWaiters = 2 })
	d.endAtCleanup(t)
	testkit.WaitFor(t, "the session attached", 10*time.Second, func() bool {
		in := b.Info()
		return in.Session != nil && in.Session.State == "attached"
	})
	ctx := ctxT(t, 90*time.Second)
	if _, err := b.Acquire(ctx, "k", "h", 60*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		lk  Lock
		err error
	}
	waiter := func(owner string, wait time.Duration, queued func()) chan outcome {
		ch := make(chan outcome, 1)
		if _, err := b.AcquireAsyncOpts([]string{"k"}, owner, 60*time.Second, wait, AcquireOptions{Queued: queued},
			func(lk Lock, err error) { ch <- outcome{lk, err} }); err != nil {
			t.Fatal(err)
		}
		return ch
	}
	a1 := waiter("a", 60*time.Second, nil)
	testkit.WaitFor(t, "a's first waiter queued", 10*time.Second, func() bool { return waiting(c, li) == 1 })
	a2 := waiter("a", 60*time.Second, nil)
	testkit.WaitFor(t, "a's second waiter queued", 10*time.Second, func() bool { return waiting(c, li) == 2 })

	armed.Store(true)
	var bQueued atomic.Bool
	bw := waiter("b", 60*time.Second, func() { bQueued.Store(true) }) // evicts a's newest waiter
	testkit.WaitFor(t, "the eviction's cancel cut with its connection", 10*time.Second, cut.Load)

	// Its wait is 60 s: answered well before, only a cancel that reached
	// the leader ended it.
	select {
	case r := <-a2:
		if !errors.Is(r.err, ErrTooManyWaiters) {
			t.Fatalf("the evicted waiter: %v, want ErrTooManyWaiters (evicted)", r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the evicted waiter still waits 20 s after its eviction: its cancel was lost with the connection")
	}
	testkit.WaitFor(t, "b's waiter queued in the room the eviction freed", 20*time.Second, bQueued.Load)
	if in := b.Info(); in.Session == nil || in.Session.Resumes == 0 {
		t.Fatalf("the session was not resumed: %+v", in.Session)
	}
	select {
	case r := <-a1:
		t.Fatalf("a's first waiter ended: %v", r.err)
	case r := <-bw:
		t.Fatalf("b's waiter ended: %v", r.err)
	default:
	}
}
