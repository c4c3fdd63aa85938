package sidecar

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/testkit"
)

// Issue 39, attack round 4: Broker.Close ends every lock held through it,
// with or without a cluster session, and tells each holder that watches
// (WatchLost) before anything is released: another broker is granted the
// key only after the holder's loss notice. Before, Close said nothing of
// held locks: with a session its close released them silently inside
// their leases (two holders, as the holder counted on ValidUntil);
// without one they kept their leases.
func TestBrokerCloseReportsHeldLocksLostBeforeReleasing(t *testing.T) {
	for _, mode := range []struct {
		name string
		tune func(*Config)
	}{{"sessions-off", sessionsOff}, {"sessions-auto", nil}} {
		t.Run(mode.name, func(t *testing.T) {
			c := startCluster(t)
			a := newBroker(t, c, mode.tune)
			b := newBroker(t, c, nil)
			ctx := ctxT(t, 30*time.Second)
			if mode.tune == nil {
				waitAttached(t, a, 0)
			}
			lk, err := a.Acquire(ctx, "k", "holder", 60*time.Second, 0)
			if err != nil {
				t.Fatal(err)
			}
			blk, err := a.AcquireBlock(ctx, []string{"x", "y"}, "holder", 60*time.Second, 0)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			told := map[uint64]time.Time{}
			var reasons []LostReason
			for _, l := range []Lock{lk, blk} {
				a.WatchLost(l, func(why LostReason) {
					mu.Lock()
					defer mu.Unlock()
					told[l.Token] = time.Now()
					reasons = append(reasons, why)
				})
			}
			if n := a.heldCount(); n != 2 {
				t.Fatalf("%d locks registered as held, want 2", n)
			}
			// The other broker waits for k: it must be granted only after
			// the holder was told.
			w := asyncAcquire(t, b, ctx, "k", 20*time.Second)
			li := leaderOf(t, c)
			testkit.WaitFor(t, "the other broker's waiter queued", 10*time.Second, func() bool { return waiting(c, li) == 1 })
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			r := result(t, w)
			granted := time.Now()
			if r.err != nil {
				t.Fatalf("the waiter on the closed broker's key: %v (Close should have released it)", r.err)
			}
			mu.Lock()
			at, ok := told[lk.Token]
			_, blkOK := told[blk.Token]
			rs := append([]LostReason(nil), reasons...)
			mu.Unlock()
			if !ok || !blkOK {
				t.Fatalf("Close released held locks without telling their holders (told: %v)", told)
			}
			if at.After(granted) {
				t.Fatalf("k granted to the other broker at %v, before its holder was told it lost it at %v", granted, at)
			}
			for _, why := range rs {
				if why != LostCompensated {
					t.Fatalf("lost reason %v, want compensated", why)
				}
			}
			// No ghost holder: the block's keys are free at once too.
			for _, key := range []string{"x", "y"} {
				l2, err := b.Acquire(ctx, key, "next", 10*time.Second, 0)
				if err != nil {
					t.Fatalf("%s after Close: %v (a ghost holder)", key, err)
				}
				if err := b.Release(ctx, l2); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// A lock released (or lost) before Close is not reported again, and Close
// leaves nothing registered.
func TestBrokerCloseForgetsReleasedLocks(t *testing.T) {
	c := startCluster(t)
	a := newBroker(t, c, sessionsOff)
	ctx := ctxT(t, 30*time.Second)
	lk, err := a.Acquire(ctx, "k", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	fired := make(chan LostReason, 1)
	a.WatchLost(lk, func(why LostReason) { fired <- why })
	if err := a.Release(ctx, lk); err != nil {
		t.Fatal(err)
	}
	if n := a.heldCount(); n != 0 {
		t.Fatalf("%d held after the release", n)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case why := <-fired:
		t.Fatalf("a released lock was reported lost (%v) by Close", why)
	default:
	}
	if _, err := a.Acquire(context.Background(), "k", "o", time.Second, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire after Close: %v", err)
	}
}

// An acquire in flight when Close runs is cancelled: its caller is told it
// is not acquired (ErrClosed), and it leaves the key's line, so the key is
// not handed to a closed broker (no ghost holder), with or without a
// session.
func TestBrokerCloseCancelsAcquiresInFlight(t *testing.T) {
	for _, mode := range []struct {
		name string
		tune func(*Config)
	}{{"sessions-off", sessionsOff}, {"sessions-auto", nil}} {
		t.Run(mode.name, func(t *testing.T) {
			c := startCluster(t)
			a := newBroker(t, c, mode.tune)
			b := newBroker(t, c, nil)
			ctx := ctxT(t, 30*time.Second)
			lk, err := b.Acquire(ctx, "k", "holder", 60*time.Second, 0)
			if err != nil {
				t.Fatal(err)
			}
			w := asyncAcquire(t, a, ctx, "k", 20*time.Second)
			li := leaderOf(t, c)
			testkit.WaitFor(t, "the closing broker's waiter queued", 10*time.Second, func() bool { return waiting(c, li) == 1 })
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if r := result(t, w); r.err == nil {
				t.Fatalf("an acquire in flight at Close was granted (token %d) to the closed broker", r.lk.Token)
			} else if !errors.Is(r.err, ErrClosed) {
				t.Fatalf("the waiter: %v, want ErrClosed (cancelled: not acquired)", r.err)
			}
			if err := b.Release(ctx, lk); err != nil {
				t.Fatal(err)
			}
			l2, err := b.Acquire(ctx, "k", "next", 10*time.Second, 0)
			if err != nil {
				t.Fatalf("k after the release: %v (handed to the closed broker's waiter?)", err)
			}
			if err := b.Release(ctx, l2); err != nil {
				t.Fatal(err)
			}
		})
	}
}
