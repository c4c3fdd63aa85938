package sidecar

import (
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/obs"
	"ticketing/cluster/testkit"
)

// A cluster at its MaxSessions (issue 39, finding 4) refuses a second
// sidecar's session open with too_many_sessions: that sidecar serves
// without a session meanwhile (its locks work), asks again every
// sessionProbeInterval rather than in a loop, and opens its session once
// the first sidecar's has closed.
func TestE2ESessionLimitServesWithoutAndOpensLater(t *testing.T) {
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: testLogger(), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.MaxSessions = 1
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	first := newBroker(t, c, nil)
	testkit.WaitFor(t, "the first sidecar's session attached", 20*time.Second, func() bool {
		si := first.Info().Session
		return si != nil && si.State == "attached"
	})
	second := newBroker(t, c, nil)
	ctx := ctxT(t, 30*time.Second)
	lk, err := second.Acquire(ctx, "k", "second", 10*time.Second, 0)
	if err != nil {
		t.Fatalf("an acquire through the sidecar without a session: %v", err)
	}
	if err := second.Release(ctx, lk); err != nil {
		t.Fatal(err)
	}
	if si := second.Info().Session; si != nil && si.State == "attached" {
		t.Fatalf("the second sidecar attached a session beyond MaxSessions 1: %+v", si)
	}
	time.Sleep(3 * time.Second)
	refusals := 0.0
	for i := range c.Size() {
		v, _, err := obs.Value(c.Node(i).MetricsRegistry(), "ticketing_node_limit_refusals_total", "limit", "sessions")
		if err != nil {
			t.Fatal(err)
		}
		refusals += v
	}
	// About one open every 2 s (and one per connection it tries on), not a loop.
	if refusals < 1 || refusals > 12 {
		t.Fatalf("%v session opens refused in about 3 s, want 1..12", refusals)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the second sidecar's session attached", 30*time.Second, func() bool {
		si := second.Info().Session
		return si != nil && si.State == "attached"
	})
}
