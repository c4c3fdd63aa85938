package bench

import (
	"context"
	"testing"
	"time"

	"ticketing/cmd/ticketlab/internal/labtest"
)

// Planned hand-overs of the leader on real processes (nodes and a
// `ticketing sidecar`), with 16 unix-socket clients doing acquire →
// release cycles the whole time (the harness of `ticketlab bench
// handover`): SIGTERM of the leader, and `members replace` of the leader
// by a spare server. Every call gets a definite reply: never INDETERMINATE,
// at most one ERR moved per hand-over (a request already on the wire when
// the leader stopped serving; the sidecar holds the others), no ERR
// unavailable. With every client on one key, the waiters queued at the
// leader get TIMEOUT (withdrawn through the log, never granted), also
// definite.
func TestPlannedHandOversAreQuiet(t *testing.T) {
	binary, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	for _, c := range []struct {
		mode      string
		handOvers int
		contended bool
	}{
		{"term", 2, false},
		{"replace", 1, false},
		{"term", 1, true},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		rounds, err := RunHandOvers(ctx, HandOverOptions{Binary: binary, Dir: t.TempDir(), Clients: 16,
			HandOvers: c.handOvers, Mode: c.mode, Contended: c.contended})
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", c.mode, err)
		}
		for _, r := range rounds {
			t.Logf("%s (contended %v): %v", c.mode, c.contended, r)
			if r.Indeterminate != 0 || r.Other != 0 || r.Unavailable != 0 || r.Moved > 1 || r.OK == 0 {
				t.Errorf("%s (contended %v), hand-over %d: %v", c.mode, c.contended, r.N, r)
			}
			if !c.contended && r.Timeout != 0 {
				t.Errorf("%s, hand-over %d: %d timeouts without contention", c.mode, r.N, r.Timeout)
			}
		}
	}
}

// --mode kill crashes the leader instead of handing over: another node
// takes over, the clients carry on after it (the round's longest pause is
// the failover as they saw it), and the killed node comes back.
func TestKillModeMeasuresTheFailover(t *testing.T) {
	binary, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rounds, err := RunHandOvers(ctx, HandOverOptions{Binary: binary, Dir: t.TempDir(), Clients: 8, HandOvers: 2, Mode: "kill"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rounds) != 2 {
		t.Fatalf("%d rounds, want 2", len(rounds))
	}
	for _, r := range rounds {
		t.Log(r)
		if r.OK == 0 || r.From == r.To || r.To == "" || r.LongestPause <= 0 {
			t.Errorf("kill %d: %v", r.N, r)
		}
	}
}
