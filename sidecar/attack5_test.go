package sidecar

import (
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// Attack round 5 (issue 39): an EXTEND attempt that the broker reported
// indeterminate still applies later, after a later extend succeeded.
//
// The broker (and the unix API and the client libraries after it) count
// on a successful extend's start + lease, and lift the cap of an earlier
// extend that ended indeterminate: the design assumes an extend applies no
// later than its start + ReleaseDeadline (held.go says so). Nothing at the
// node enforces that: a written frame delayed in the network (a link that
// stalls and recovers: TCP retransmits it) reaches the leader whenever it
// does, and the leader applies it, a shorter lease "from now".
//
// Interleaving: holder H (one seed, so two connections to the leader)
// extends to 7 s (A); A's frame is held on connection 1; at 5 s the broker
// answers ErrIndeterminate (H counts on min(previous, tA + 7 s)). H extends
// to 60 s (C), which goes on connection 2 and succeeds: H counts on tC +
// 60 s. The network delivers A: the leader sets the lease to 7 s from now,
// expires it and grants the key to the other broker's waiter, ~50 s inside
// H's lease.
func TestAttack5DelayedIndeterminateExtendShortensALaterExtend(t *testing.T) {
	c := startCluster(t)
	li := leaderOf(t, c)
	var heldConn atomic.Uint64
	f := netfault.NewFrames(func(fr netfault.Frame) netfault.Verdict {
		if fr.Dir == netfault.Sent && fr.Msg.Type == wire.TypeExtend && fr.Msg.Lease == 7 && heldConn.CompareAndSwap(0, fr.Conn) {
			return netfault.Hold
		}
		return netfault.Pass
	})
	a := newBroker(t, c, func(cfg *Config) { seedOnly(cfg, c.ClientAddr(li)); cfg.Dialer = f.Dial; sessionsOff(cfg) })
	t.Cleanup(f.Release)
	other := newBroker(t, c, nil)
	ctx := ctxT(t, 90*time.Second)
	lk, err := a.Acquire(ctx, "k", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	w := asyncAcquire(t, other, ctx, "k", 60*time.Second)
	testkit.WaitFor(t, "the other waiter queued", 10*time.Second, func() bool { return waiting(c, li) == 1 })

	nlA, err := a.Extend(ctx, lk, 7*time.Second)
	if !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("extend A: %v, want indeterminate (its frame is held)", err)
	}
	t.Logf("A indeterminate; holder counts on %v", time.Until(nlA.ValidUntil).Round(time.Millisecond))
	nlC, err := a.Extend(ctx, nlA, 60*time.Second)
	if err != nil {
		t.Fatalf("extend C: %v (inconclusive: it should go on the other connection to the leader)", err)
	}
	t.Logf("C ok; holder counts on %v (token %d)", time.Until(nlC.ValidUntil).Round(time.Millisecond), nlC.Token)
	// The stalled link recovers: A's frame arrives at the leader.
	f.Release()

	select {
	case r := <-w:
		got := time.Now()
		if r.err != nil {
			t.Logf("the other waiter: %v (no break this run)", r.err)
			return
		}
		if got.Before(nlC.ValidUntil) {
			t.Fatalf("two holders: the holder counts on token %d until %v (its extend C succeeded), and the other broker was granted k (token %d) at %v, %v before that: A, reported indeterminate, applied after C",
				nlC.Token, nlC.ValidUntil.Format(time.StampMilli), r.lk.Token, got.Format(time.StampMilli), nlC.ValidUntil.Sub(got).Round(time.Millisecond))
		}
	case <-time.After(20 * time.Second):
		t.Logf("the other waiter not granted within 20 s of the delivery: no break")
	}
}

// Attack round 5 (issue 39): a grant registered before Close but delivered
// (and watched) after Close reported the held locks lost. Close takes the
// registry after qclosed, so every grant answered before is in it, and
// fires its WatchLost watches before releasing. But a grant's caller can
// only watch once it has the Lock: done runs after qmu is released, and
// the caller calls WatchLost after Acquire returned. Close's fireLost can
// run in between: the caller gets a Lock (nil error, ValidUntil a minute
// away), its WatchLost registers after the fact and never fires, and Close
// releases the key, which another broker is then granted. (Close's doc
// says no lock may be counted on once Close is called; a caller that did
// not call Close itself has no way to learn of it but the watch.)
func TestAttack5GrantDeliveredAfterCloseNeverToldLost(t *testing.T) {
	c := startCluster(t)
	a := newBroker(t, c, sessionsOff)
	other := newBroker(t, c, nil)
	ctx := ctxT(t, 60*time.Second)
	const n = 300
	type got struct {
		key   string
		lk    Lock
		fired chan LostReason
	}
	res := make(chan got, n)
	var granted atomic.Int32
	start := make(chan struct{})
	for i := range n {
		key := "k" + strconv.Itoa(i)
		go func() {
			<-start
			lk, err := a.Acquire(ctx, key, "holder", 60*time.Second, 0)
			if err != nil {
				res <- got{key: key}
				return
			}
			granted.Add(1)
			fired := make(chan LostReason, 1)
			a.WatchLost(lk, func(why LostReason) { fired <- why })
			res <- got{key, lk, fired}
		}()
	}
	close(start)
	for granted.Load() < n/3 {
		time.Sleep(100 * time.Microsecond)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	var silent []got
	for range n {
		g := <-res
		if g.fired == nil {
			continue
		}
		select {
		case <-g.fired:
		case <-time.After(200 * time.Millisecond):
			silent = append(silent, g)
		}
	}
	t.Logf("%d of %d granted; %d granted holders never told lost", granted.Load(), n, len(silent))
	for _, g := range silent {
		l2, err := other.Acquire(ctx, g.key, "next", 10*time.Second, 0)
		if err != nil {
			continue // still held: not released (no break for this one)
		}
		t.Fatalf("two holders: the closed broker's caller holds %s (token %d, told acquired, never told lost, counts on it for %v more), and the other broker was granted it (token %d) %v after Close",
			g.key, g.lk.Token, time.Until(g.lk.ValidUntil).Round(time.Second), l2.Token, time.Since(closed).Round(time.Millisecond))
	}
}
