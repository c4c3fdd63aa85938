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
