package sidecar

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// Issue 39, attack round 4: an EXTEND to a shorter lease whose reply is
// lost. The extend may have applied, and a shorter lease "from now" is
// allowed: the leader then expires the holding at apply time + lease and
// hands the key on, well inside the previous ValidUntil. Counting on the
// previous ValidUntil (the rule documented before) made two holders. The
// holder counts on the earlier of its previous ValidUntil and the moment
// the extend was asked for + the new lease, and the next holder is granted
// the key only after that. The cluster runs at protocol version 9: from
// version 10 an extend never lowers a lease, so the shorter one would not
// hand the key on (TestDelayedIndeterminateExtendCannotShortenALaterExtend),
// and the rule is what keeps a holder safe on an older cluster.
func TestIndeterminateShorterExtendCountsOnTheEarlierEnd(t *testing.T) {
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: testLogger(), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.ProtocolVersion = wire.VersionStrictMatch
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	leaderOf(t, c)
	if v := c.Node(leaderOf(t, c)).ClusterVersion(); v != wire.VersionStrictMatch {
		t.Fatalf("cluster version %d, want %d", v, wire.VersionStrictMatch)
	}
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
	asked := time.Now()
	nl, err := a.Extend(ctx, lk, 2*time.Second)
	if !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("extend: %v, want indeterminate (the reply was lost)", err)
	}
	answered := time.Now()
	if nl.ValidUntil.Before(asked.Add(2*time.Second)) || nl.ValidUntil.After(answered.Add(2*time.Second)) {
		t.Fatalf("ValidUntil after an indeterminate extend to 2s: %v, want the extend's start + 2s (between %v and %v), not the previous %v",
			nl.ValidUntil.Format(time.StampMilli), asked.Add(2*time.Second).Format(time.StampMilli),
			answered.Add(2*time.Second).Format(time.StampMilli), lk.ValidUntil.Format(time.StampMilli))
	}
	if nl.Lease != lk.Lease || nl.Token != lk.Token {
		t.Fatalf("indeterminate extend changed the lock: %+v, was %+v", nl, lk)
	}
	r := result(t, w)
	got := time.Now()
	if r.err != nil {
		t.Fatalf("the other waiter: %v (the applied 2s lease should have handed k on)", r.err)
	}
	if got.Before(nl.ValidUntil) {
		t.Fatalf("two holders: broker A counts on its lease (token %d) until %v, and the other broker was granted k (token %d) at %v, %v before that",
			lk.Token, nl.ValidUntil.Format(time.StampMilli), r.lk.Token, got.Format(time.StampMilli), nl.ValidUntil.Sub(got).Round(time.Millisecond))
	}
}

func TestExtendCapped(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := Lock{ValidUntil: t0.Add(60 * time.Second)}
	if got := extendCapped(l, t0.Add(time.Second), 2*time.Second); !got.Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("shorter: %v", got)
	}
	if got := extendCapped(l, t0.Add(time.Second), 120*time.Second); !got.Equal(l.ValidUntil) {
		t.Fatalf("longer: %v", got)
	}
}
