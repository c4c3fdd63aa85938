package sidecar

import (
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// Attack 42, finding 3: the sidecar takes every lost event as an expiry.
// An operator revokes a broker's lock (Node.Revoke, the admin port's
// path): the node sends X with reason revoked, who and why, but the
// broker's onLost calls fireLost(..., LostExpired), so the application
// (WatchLost, the unix API's lost event and its per-reason metrics) is
// told the lease ran out, early, with nothing of the operator's who or
// why. Sequence: Acquire "rv/k" (lease 60 s); WatchLost; Node.Revoke of
// its token by "ops" for "stuck"; the watch hears LostExpired.
func TestAttack42_SidecarReportsRevokeAsExpiry(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	ctx := ctxT(t, 60*time.Second)
	li := leaderOf(t, c)
	lk, err := b.Acquire(ctx, "rv/k", "alice", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan LostReason, 1)
	b.WatchLost(lk, func(why LostReason) { lost <- why })
	for c.Node(li).ClusterVersion() < 14 {
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.Node(li).Revoke(ctx, "rv/k", lk.Token, "ops", "stuck"); err != nil {
		t.Fatal(err)
	}
	select {
	case why := <-lost:
		if why == LostExpired {
			t.Fatalf("a revoke 59 s before the lease's end was told to the holder as %v (the operator's who and why are dropped)", why)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the broker's watch never heard of the revoke")
	}
}

// Attack 42, finding 1 end to end: a sidecar broker's application is
// handed a lock that an operator already revoked. The broker's session
// waits on "k"; the hand-off's G to it is lost with its connection; the
// operator revokes that grant's token (the key goes to the next waiter,
// token+1, in the same commit); the broker resumes its session and the
// leader replays the session's kept outcome, G with the revoked token,
// which the broker delivered: Acquire returned a lock valid for most of
// its lease while another broker held the key with a larger token, and
// nothing told it otherwise. Now the lost event follows the G, and the
// caller's watch hears it even when it is set after the G arrived.
func TestAttack42_SidecarDeliversRevokedGrantAfterResume(t *testing.T) {
	c := startCluster(t)
	li := leaderOf(t, c)
	var cutDone, holdResumes atomic.Bool
	f := netfault.NewFrames(func(fr netfault.Frame) netfault.Verdict {
		if fr.Dir == netfault.Received && fr.Msg.Type == wire.TypeGranted && cutDone.CompareAndSwap(false, true) {
			holdResumes.Store(true)
			return netfault.Cut
		}
		if fr.Dir == netfault.Sent && fr.Msg.Type == wire.TypeResume && holdResumes.Load() {
			return netfault.Hold
		}
		return netfault.Pass
	})
	t.Cleanup(f.Release)
	h := newBroker(t, c, nil)
	b := newBroker(t, c, func(cfg *Config) { seedOnly(cfg, c.ClientAddr(li)); cfg.Dialer = f.Dial })
	w := newBroker(t, c, nil)
	ctx := ctxT(t, 90*time.Second)
	hl, err := h.Acquire(ctx, "k", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	bc := make(chan acqResult, 1)
	go func() {
		lk, err := b.Acquire(ctx, "k", "bob", 60*time.Second, 60*time.Second)
		bc <- acqResult{lk, err}
	}()
	testkit.WaitFor(t, "bob queued", 10*time.Second, func() bool { return waiting(c, li) == 1 })
	wc := asyncAcquire(t, w, ctx, "k", 60*time.Second)
	testkit.WaitFor(t, "the next waiter queued", 10*time.Second, func() bool { return waiting(c, li) == 2 })
	if err := h.Release(ctx, hl); err != nil {
		t.Fatal(err)
	}
	var tB uint64
	testkit.WaitFor(t, "bob's session holds k", 10*time.Second, func() bool {
		hd, ok := holder(c, li, "k")
		if ok && hd.Owner == "bob" {
			tB = hd.Token
		}
		return tB != 0
	})
	testkit.WaitFor(t, "bob's G cut", 10*time.Second, cutDone.Load)
	for c.Node(li).ClusterVersion() < 14 {
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.Node(li).Revoke(ctx, "k", tB, "ops", "stuck"); err != nil {
		t.Fatal(err)
	}
	wr := result(t, wc)
	if wr.err != nil {
		t.Fatal(wr.err)
	}
	time.Sleep(500 * time.Millisecond)
	holdResumes.Store(false)
	f.Release()
	select {
	case r := <-bc:
		if r.err == nil && r.lk.Token == tB {
			// The grant was real, then revoked: the resume replays the G,
			// then the revoke's lost event, so the caller's watch hears
			// at once that the lock is gone (before the fix it heard
			// nothing and held on for the lease).
			lost := make(chan Loss, 1)
			b.WatchLoss(r.lk, func(l Loss) { lost <- l })
			select {
			case l := <-lost:
				if l.Reason != LostRevoked || l.By != "ops" || l.Why != "stuck" {
					t.Fatalf("bob's replayed, revoked grant was lost as %+v, want revoked by ops: stuck", l)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("bob's Acquire returned token %d, revoked by the operator, valid for %v more, while the next waiter holds k with token %d, and no loss was told: two holders",
					tB, time.Until(r.lk.ValidUntil).Round(time.Second), wr.lk.Token)
			}
		}
		t.Logf("bob's Acquire: %+v %v", r.lk, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("bob's Acquire never returned")
	}
}
