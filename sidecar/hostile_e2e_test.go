package sidecar

import (
	"fmt"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/wire"
)

// Invariant 6 (issue 39, finding 8) with a real sidecar as the victim: it
// holds a key through its cluster session, and another client of the
// cluster, with the client secret, speaking the wire protocol, tries to
// release and extend it: token probes around the status reply's
// last_token, owner guesses of the form <hostname>/<pid>.<n>, and at last
// the lock's exact key, token and owner. Every try gets the same E
// not_held with the same text; the lock stays the sidecar's on every
// replica, unextended; and the sidecar, which was told nothing, is right
// to believe it holds it: its own extend and release succeed.
//
// Before the fix the exact key, token and owner released the sidecar's
// lock from a connection without its session, and a wrong owner was told
// apart from a wrong token (owner_mismatch, token_mismatch).
func TestE2EHostileCannotTouchASidecarsLock(t *testing.T) {
	c, b := startSessionCluster(t)
	ctx := ctxT(t, 60*time.Second)
	const owner = "box-a/4242.1"
	lk, err := b.Acquire(ctx, "seats/1", owner, 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	li := leaderOf(t, c)

	h, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	do := func(m wire.Msg) wire.Msg {
		t.Helper()
		r, _, err := h.Do(ctx, m)
		if err != nil {
			t.Fatalf("%s: %v", wire.TypeName(m.Type), err)
		}
		return r
	}
	st := do(wire.Msg{Type: wire.TypeStatus})
	if st.LastToken != lk.Token {
		t.Fatalf("last_token %d, the sidecar's token %d", st.LastToken, lk.Token)
	}

	answers := map[string]int{}
	try := func(owner string, token uint64) {
		t.Helper()
		for _, m := range []wire.Msg{
			{Type: wire.TypeRelease, Key: "seats/1", Owner: owner, Token: token},
			{Type: wire.TypeExtend, Key: "seats/1", Owner: owner, Token: token, Lease: 250},
		} {
			r := do(m)
			if r.Type != wire.TypeError || r.Code != wire.CodeNotHeld {
				t.Fatalf("%s owner %q token %d: %+v, want E not_held", wire.TypeName(m.Type), owner, token, r)
			}
			answers[fmt.Sprintf("%d %q", r.Code, r.Text)]++
		}
	}
	for tok := st.LastToken - 2; tok <= st.LastToken+2; tok++ {
		try("box-a/4241.0", tok)
	}
	for pid := 4240; pid < 4245; pid++ {
		for n := 0; n < 4; n++ {
			try(fmt.Sprintf("box-a/%d.%d", pid, n), lk.Token)
		}
	}
	if len(answers) != 1 {
		t.Fatalf("the tries got %d distinguishable answers: %v", len(answers), answers)
	}

	for i := range 3 {
		hd, ok := holder(c, i, "seats/1")
		if !ok || hd.Token != lk.Token || hd.Owner != owner || hd.RenewedAt != 0 {
			t.Fatalf("node %d: seats/1 %+v held=%v, want the sidecar's, unextended", i, hd, ok)
		}
	}
	lk2, err := b.Extend(ctx, lk, 30*time.Second)
	if err != nil {
		t.Fatalf("the sidecar's own extend: %v", err)
	}
	if err := b.Release(ctx, lk2); err != nil {
		t.Fatalf("the sidecar's own release: %v", err)
	}
}
