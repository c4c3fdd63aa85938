package sidecar

import (
	"errors"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/locksm"
)

// Extend renews a lease through the cluster (same token, the waiter keeps
// waiting), WatchLost hears the leader's lost event when the renewed lease
// runs out, an extend after that is refused and told as LostMoved, and a
// lock nobody extends is lost at its first lease: the broker never extends
// on its own.
func TestBrokerExtendAndWatchLost(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	reg := b.MetricsRegistry()
	ctx := ctxT(t, 60*time.Second)
	li := leaderOf(t, c)

	lk, err := b.Acquire(ctx, "ext/k", "alice", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	type lost struct {
		why LostReason
		at  time.Time
	}
	lostc := make(chan lost, 4)
	b.WatchLost(lk, func(why LostReason) { lostc <- lost{why, time.Now()} })
	stopped := make(chan LostReason, 1)
	b.WatchLost(lk, func(why LostReason) { stopped <- why })() // stopped at once

	if _, err := b.Extend(ctx, lk, 1500*time.Millisecond); !errors.Is(err, locksm.ErrInvalidLease) {
		t.Fatalf("extend by 1.5 s: %v, want ErrInvalidLease", err)
	}
	sent := time.Now()
	ext, err := b.Extend(ctx, lk, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ext.Token != lk.Token || ext.Lease != 3*time.Second || ext.ValidUntil.Before(sent.Add(3*time.Second)) ||
		ext.ValidUntil.After(time.Now().Add(3*time.Second)) {
		t.Fatalf("extended lock %+v (sent at %v)", ext, sent)
	}
	h, ok := holder(c, li, "ext/k")
	if !ok || h.Token != lk.Token || h.RenewedAt == 0 || h.LeaseSec != 3 {
		t.Fatalf("leader's holder after the extend: %+v held=%v", h, ok)
	}

	// A waiter keeps waiting past the first lease.
	waiter := make(chan Lock, 1)
	go func() {
		l, err := b.Acquire(ctx, "ext/k", "bob", 10*time.Second, 20*time.Second)
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		waiter <- l
	}()
	time.Sleep(1500 * time.Millisecond)
	select {
	case l := <-lostc:
		t.Fatalf("lost (%v) before the extended lease ran out", l.why)
	case <-waiter:
		t.Fatal("the waiter got the key before the extended lease ran out")
	default:
	}

	var l lost
	select {
	case l = <-lostc:
	case <-time.After(15 * time.Second):
		t.Fatal("no lost signal after the extended lease ran out")
	}
	if l.why != LostExpired || l.at.Sub(sent) < 3*time.Second {
		t.Fatalf("lost %v, %v after the extend was sent; want expired, after 3 s", l.why, l.at.Sub(sent))
	}
	if w := <-waiter; w.Token <= lk.Token {
		t.Fatalf("waiter's token %d not above %d", w.Token, lk.Token)
	}
	select {
	case why := <-stopped:
		t.Fatalf("a stopped watch was told %v", why)
	default:
	}

	// Too late: refused, and a watch of it hears LostMoved.
	b.WatchLost(lk, func(why LostReason) { lostc <- lost{why, time.Now()} })
	if _, err := b.Extend(ctx, lk, 3*time.Second); !errors.Is(err, locksm.ErrNotHeld) && !errors.Is(err, locksm.ErrTokenMismatch) {
		t.Fatalf("extend after the loss: %v, want not held", err)
	}
	if l := <-lostc; l.why != LostMoved {
		t.Fatalf("watch after a refused extend told %v, want moved", l.why)
	}

	// Nobody extends this one: it is gone at its first lease.
	idle, err := b.Acquire(ctx, "ext/idle", "carol", time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	b.WatchLost(idle, func(why LostReason) { lostc <- lost{why, time.Now()} })
	if l := <-lostc; l.why != LostExpired {
		t.Fatalf("idle lock lost as %v", l.why)
	}
	if _, held := holder(c, li, "ext/idle"); held {
		t.Fatal("idle lock still held after its lost event")
	}

	testkit.WaitFor(t, "extend counted", 5*time.Second, func() bool {
		return metricValue(t, reg, "ticketing_sidecar_extends_total", "result", "not_held") == 1
	})
	wantValue(t, reg, 1, "ticketing_sidecar_extends_total", "result", "ok")
	wantValue(t, reg, 2, "ticketing_sidecar_locks_lost_total", "reason", "expired")
	wantValue(t, reg, 1, "ticketing_sidecar_locks_lost_total", "reason", "moved")
	if n := metricValue(t, reg, "ticketing_sidecar_lost_events_total"); n < 2 {
		t.Fatalf("lost events received: %v, want at least 2", n)
	}
}
