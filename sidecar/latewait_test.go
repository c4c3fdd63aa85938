package sidecar

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/testkit"
)

// An acquire with a wait that stayed unsent in the broker until its wait
// ran out (here queued behind a full in-flight budget) is answered
// ErrTimeout by the broker itself: it is never sent with what is left of
// its wait, 0, which the cluster answers BUSY for a held key (a one-try
// acquire's answer). A block the same. The broker's injected clock jumps
// past the waits while they are queued, so the test does not depend on
// how long anything takes.
func TestBrokerAcquireQueuedPastItsWaitTimesOut(t *testing.T) {
	c := startCluster(t)
	li := leaderOf(t, c)
	d := &stallDialer{}
	var skew atomic.Int64 // added to the broker's clock
	// One address, two connections, each with an in-flight budget of one
	// acquire; session-less, so both connections take acquires.
	b := newBroker(t, c, func(cfg *Config) {
		seedOnly(cfg, c.ClientAddr(li))
		cfg.Dialer = d.dial
		sessionsOff(cfg)
		cfg.MaxInFlight = 1
		// Far beyond the test: what ends the queued acquires must be
		// their waits, not the deadline for finding a leader.
		cfg.LeaderWait = 2 * time.Minute
		cfg.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	})
	ctx := ctxT(t, 60*time.Second)
	testkit.WaitFor(t, "two connections", 10*time.Second, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.slots[0].conn != nil && b.slots[1].conn != nil && b.leader != ""
	})
	held, err := b.Acquire(ctx, "held", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}

	// Fill both budgets with acquires whose bytes stay in a stalled write.
	for _, sc := range d.all() {
		sc.set(true, false)
	}
	fillers := make(chan error, 2)
	for _, k := range []string{"a1", "a2"} {
		go func() {
			_, err := b.Acquire(ctx, k, "filler", 60*time.Second, 30*time.Second)
			fillers <- err
		}()
	}
	testkit.WaitFor(t, "both in-flight budgets used", 10*time.Second, func() bool {
		b.qmu.Lock()
		defer b.qmu.Unlock()
		n := 0
		for _, v := range b.inflight {
			n += v
		}
		return n == 2
	})

	// Two waiters for the held key queue in the broker behind them.
	one, block := newQueuedRec(), newQueuedRec()
	if _, err := b.AcquireAsync("held", "late", 60*time.Second, 300*time.Millisecond, one.doneFn); err != nil {
		t.Fatal(err)
	}
	if _, err := b.AcquireBlockAsync([]string{"free", "held"}, "late", 60*time.Second, 300*time.Millisecond, block.doneFn); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the two waiters queued in the broker, unsent", 10*time.Second, func() bool {
		b.qmu.Lock()
		defer b.qmu.Unlock()
		return b.sc.pendingN == 2
	})
	// Their waits run out while they are queued; then the budget frees.
	skew.Add(int64(time.Second))
	for _, sc := range d.all() {
		sc.set(false, false)
	}
	for i := 0; i < 2; i++ {
		select {
		case err := <-fillers:
			if err != nil {
				t.Fatalf("an acquire of a free key: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the fillers got no outcome within 30s")
		}
	}
	for _, w := range []struct {
		what string
		rec  *queuedRec
	}{{"one key", one}, {"a block", block}} {
		err := w.rec.wait(t, w.what)
		if errors.Is(err, ErrBusy) {
			t.Fatalf("%s queued past its wait of 300ms: %v: sent with wait 0", w.what, err)
		}
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("%s queued past its wait of 300ms: %v, want ErrTimeout", w.what, err)
		}
	}
	if h, ok := holder(c, li, "held"); !ok || h.Token != held.Token {
		t.Fatalf("the held key: %+v %v, want token %d", h, ok, held.Token)
	}
	if _, ok := holder(c, li, "free"); ok {
		t.Fatal("the block's free key is held: the block was sent")
	}
}

// The wait an acquire carries on the wire is what is left of it rounded
// up to the millisecond: a tiny remainder is never sent as wait 0 (one
// try), and never more than was asked for.
func TestWireWaitRoundsUp(t *testing.T) {
	for _, tc := range []struct {
		remaining, wait time.Duration
		want            uint32
	}{
		{0, 0, 0},
		{time.Nanosecond, 500 * time.Millisecond, 1},
		{999 * time.Microsecond, 500 * time.Millisecond, 1},
		{time.Millisecond, 500 * time.Millisecond, 1},
		{time.Millisecond + time.Nanosecond, 500 * time.Millisecond, 2},
		{499*time.Millisecond + 1, 500 * time.Millisecond, 500},
		{500 * time.Millisecond, 500 * time.Millisecond, 500},
		{501 * time.Millisecond, 500 * time.Millisecond, 500}, // a clock stepped back
	} {
		if got := wireWaitMs(tc.remaining, tc.wait); got != tc.want {
			t.Errorf("wireWaitMs(%v, %v) = %d, want %d", tc.remaining, tc.wait, got, tc.want)
		}
	}
}
