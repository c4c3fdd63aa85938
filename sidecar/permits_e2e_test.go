package sidecar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// permit takes one permit of key through the broker (AcquireOptions.Permit).
func permit(ctx context.Context, b *Broker, key, owner string, lease, wait time.Duration) (Lock, error) {
	type res struct {
		lk  Lock
		err error
	}
	ch := make(chan res, 1)
	if _, err := b.AcquireAsyncOpts([]string{key}, owner, lease, wait, AcquireOptions{Permit: true},
		func(lk Lock, err error) { ch <- res{lk, err} }); err != nil {
		return Lock{}, err
	}
	select {
	case r := <-ch:
		return r.lk, r.err
	case <-ctx.Done():
		return Lock{}, ctx.Err()
	}
}

// Permit waiters of the broker's session survive the leader's death: the
// new leader adopts them as permit acquires when the session resumes, and
// each is granted, in order, the slot the release frees (its G carries
// it), never a slot another live permit holds.
func TestE2ESessionPermitWaitersSurviveLeaderKill(t *testing.T) {
	c, b := startSessionCluster(t)
	ctx := ctxT(t, 90*time.Second)
	testkit.WaitFor(t, "cluster version 13", 20*time.Second, func() bool {
		return c.Node(leaderOf(t, c)).ClusterVersion() >= wire.VersionSemaphores
	})
	if err := b.SetPermits(ctx, "s", 2); err != nil {
		t.Fatal(err)
	}
	p0, err := permit(ctx, b, "s", "a", 60*time.Second, 0)
	if err != nil || !p0.Permit || p0.Slot != 0 {
		t.Fatalf("first permit: %+v %v", p0, err)
	}
	p1, err := permit(ctx, b, "s", "b", 60*time.Second, 0)
	if err != nil || !p1.Permit || p1.Slot != 1 {
		t.Fatalf("second permit: %+v %v", p1, err)
	}
	li := leaderOf(t, c)
	const n = 2
	type res struct {
		i   int
		lk  Lock
		err error
	}
	out := make(chan res, n)
	for i := range n {
		go func() {
			lk, err := permit(ctx, b, "s", fmt.Sprintf("w%d", i), 60*time.Second, 50*time.Second)
			out <- res{i, lk, err}
		}()
		testkit.WaitFor(t, "permit waiter queued", 10*time.Second, func() bool {
			var q int
			c.Node(li).ReadState(func(st *locksm.State) { q = len(st.Waiters("s")) })
			return q == i+1
		})
	}
	c.Stop(li)
	waitResumed(t, b)
	// Free slot 1 first: the head waiter takes it; then slot 0.
	if err := b.Release(ctx, p1); err != nil {
		t.Fatalf("release slot 1 on the new leader: %v", err)
	}
	r := <-out
	if r.err != nil || r.i != 0 || !r.lk.Permit || r.lk.Slot != 1 || r.lk.Token <= p1.Token {
		t.Fatalf("head waiter: %d %+v %v, want w0 in slot 1 with a token above %d", r.i, r.lk, r.err, p1.Token)
	}
	if err := b.Release(ctx, p0); err != nil {
		t.Fatalf("release slot 0: %v", err)
	}
	r2 := <-out
	if r2.err != nil || r2.i != 1 || !r2.lk.Permit || r2.lk.Slot != 0 || r2.lk.Token <= r.lk.Token {
		t.Fatalf("second waiter: %d %+v %v, want w1 in slot 0 with a token above %d", r2.i, r2.lk, r2.err, r.lk.Token)
	}
	// Extends and releases of the adopted permits work by their tokens.
	if _, err := b.Extend(ctx, r.lk, 30*time.Second); err != nil {
		t.Fatalf("extend the adopted permit: %v", err)
	}
	for _, lk := range []Lock{r.lk, r2.lk} {
		if err := b.Release(ctx, lk); err != nil {
			t.Fatalf("release %+v: %v", lk, err)
		}
	}
}

// A permit grant whose G is lost with its leader reaches its caller, still
// waiting, through the session's resume on the new leader: the recorded
// outcome carries the permit's slot, and the caller's Lock names the slot
// the replicated state holds under its token (the fencing domain).
func TestE2EPermitOutcomeReplayKeepsSlot(t *testing.T) {
	for _, wantSlot := range []uint32{0, 1} {
		t.Run(fmt.Sprintf("slot%d", wantSlot), func(t *testing.T) {
			l := newFrameLog()
			f := netfault.NewFrames(nil)
			c, b := startFramesCluster(t, f)
			ctx := ctxT(t, 90*time.Second)
			testkit.WaitFor(t, "cluster version 13", 20*time.Second, func() bool {
				return c.Node(leaderOf(t, c)).ClusterVersion() >= wire.VersionSemaphores
			})
			if err := b.SetPermits(ctx, "s", 2); err != nil {
				t.Fatal(err)
			}
			var others []Lock
			for range wantSlot {
				lk, err := permit(ctx, b, "s", "other", 60*time.Second, 0)
				if err != nil {
					t.Fatal(err)
				}
				others = append(others, lk)
			}
			li := leaderOf(t, c)
			var gid uint64
			f.SetRule(func(fr netfault.Frame) netfault.Verdict {
				l.mu.Lock()
				defer l.mu.Unlock()
				m := fr.Msg
				switch {
				case fr.Dir == netfault.Sent && m.Type == wire.TypeAcquirePermit && m.Owner == "me" && gid == 0:
					gid = m.ID
				case fr.Dir == netfault.Received && m.Type == wire.TypeGranted && gid != 0 && m.ID == gid && l.ghostTok == 0:
					l.ghostTok = m.Token
					l.tell("G held")
					return netfault.Hold
				}
				return netfault.Pass
			})
			type res struct {
				lk  Lock
				err error
			}
			out := make(chan res, 1)
			go func() {
				lk, err := permit(ctx, b, "s", "me", 60*time.Second, 60*time.Second)
				out <- res{lk, err}
			}()
			l.await(t, "G held")
			c.Stop(li)
			leaderOf(t, c)
			r := <-out
			if r.err != nil {
				t.Fatalf("the permit whose G was lost: %v", r.err)
			}
			tok := l.get().ghostTok
			if r.lk.Token != tok || !r.lk.Permit || r.lk.Slot != wantSlot {
				t.Fatalf("replayed permit %+v, want token %d in slot %d", r.lk, tok, wantSlot)
			}
			nl := leaderOf(t, c)
			var hs []locksm.Holder
			c.Node(nl).ReadState(func(st *locksm.State) { hs = st.PermitHolders("s") })
			found := false
			for _, h := range hs {
				if h.Token == tok {
					found = true
					if h.Slot != r.lk.Slot {
						t.Fatalf("the state holds token %d in slot %d; the caller was told slot %d", tok, h.Slot, r.lk.Slot)
					}
				}
			}
			if !found {
				t.Fatalf("token %d not held: %+v", tok, hs)
			}
			_ = others
		})
	}
}

// A set-permits is not exact as a release is: a resend after an attempt
// whose reply was lost meets the state the first attempt left (and any
// set-permits applied since), so its answer says nothing of the first.
// Removing a semaphore whose K is lost with its connection: the first
// attempt removed it, and the caller must not be told a definite
// not_semaphore ("it never was one") from a resend; nor may a resend
// apply a stale n over a later operator's (so it is not resent at all:
// ErrIndeterminate, as the doc says "sending it again is harmless" is
// the operator's call).
func TestE2ESetPermitsLostReplyIsNotResent(t *testing.T) {
	f := netfault.NewFrames(nil)
	c, b := startFramesCluster(t, f)
	ctx := ctxT(t, 60*time.Second)
	testkit.WaitFor(t, "cluster version 13", 20*time.Second, func() bool {
		return c.Node(leaderOf(t, c)).ClusterVersion() >= wire.VersionSemaphores
	})
	if err := b.SetPermits(ctx, "s", 2); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var zid uint64
	sent := 0
	f.SetRule(func(fr netfault.Frame) netfault.Verdict {
		mu.Lock()
		defer mu.Unlock()
		m := fr.Msg
		switch {
		case fr.Dir == netfault.Sent && m.Type == wire.TypeSetPermits:
			sent++
			if zid == 0 {
				zid = m.ID
			}
		case fr.Dir == netfault.Received && m.Type == wire.TypeOK && zid != 0 && m.ID == zid:
			zid = ^uint64(0) // once
			return netfault.Cut
		}
		return netfault.Pass
	})
	err := b.SetPermits(ctx, "s", 0)
	li := leaderOf(t, c)
	var defined bool
	testkit.WaitFor(t, "the removal applied", 10*time.Second, func() bool {
		c.Node(li).ReadState(func(st *locksm.State) { _, defined = st.Semaphore("s") })
		return !defined
	})
	if errors.Is(err, locksm.ErrNotSemaphore) {
		t.Fatalf("set-permits 0 whose first attempt removed the semaphore: %v (a resend's answer), want nil or ErrIndeterminate", err)
	}
	if err != nil && !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("set-permits 0: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if sent != 1 {
		t.Fatalf("the set-permits was written %d times; a written set-permits must not be resent", sent)
	}
}
