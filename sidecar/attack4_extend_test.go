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

// Attack round 4 (issue 39): an EXTEND to a shorter lease whose reply is
// lost. The contract (Extend's doc, wire PROTOCOL.md `e` "U (unknown: the
// holder must count on its previous lease)", unixapi PROTOCOL.md
// "INDETERMINATE ... count on the previous one") tells the holder to keep
// counting on its previous ValidUntil. But the extend may have applied,
// and a shorter lease "from now" is allowed: the leader then expires the
// holding at extend+lease and hands the key on, well inside the previous
// ValidUntil. Two holders under the documented rule.
func TestAttack4IndeterminateShorterExtendKeepsPreviousValidUntil(t *testing.T) {
	c := startCluster(t)
	var deaf atomic.Bool // from the extend on, nothing reaches the holder's broker
	f := netfault.NewFrames(func(fr netfault.Frame) netfault.Verdict {
		if fr.Dir == netfault.Sent && fr.Msg.Type == wire.TypeExtend {
			deaf.Store(true)
			return netfault.Pass
		}
		if deaf.Load() && fr.Dir == netfault.Received {
			return netfault.Hold
		}
		return netfault.Pass
	})
	a := newBroker(t, c, func(cfg *Config) { cfg.Dialer = f.Dial })
	t.Cleanup(func() { deaf.Store(false); f.Release() })
	other := newBroker(t, c, nil)
	ctx := ctxT(t, 60*time.Second)
	lk, err := a.Acquire(ctx, "k", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	li := leaderOf(t, c)
	w := asyncAcquire(t, other, ctx, "k", 40*time.Second)
	testkit.WaitFor(t, "the other waiter queued", 10*time.Second, func() bool { return waiting(c, li) == 1 })

	// A shorter lease than the one held: allowed ("from now").
	nl, err := a.Extend(ctx, lk, 2*time.Second)
	if !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("extend: %v, want indeterminate (the reply was lost)", err)
	}
	// Documented: count on the previous ValidUntil.
	if !nl.ValidUntil.Equal(lk.ValidUntil) {
		t.Fatalf("ValidUntil after an indeterminate extend: %v, want the previous %v", nl.ValidUntil, lk.ValidUntil)
	}
	r := result(t, w)
	got := time.Now()
	if r.err == nil && got.Before(nl.ValidUntil) {
		t.Fatalf("two holders: broker A was told to count on its lease (token %d) until %v, and the other broker was granted k (token %d) at %v, %v before that",
			lk.Token, nl.ValidUntil.Format(time.StampMilli), r.lk.Token, got.Format(time.StampMilli), nl.ValidUntil.Sub(got).Round(time.Millisecond))
	}
}
