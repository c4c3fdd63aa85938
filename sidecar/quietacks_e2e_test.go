package sidecar

import (
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/locksm"
)

// A quiet session keeps no outcomes (issue 39, finding 5): after some
// acquires and releases through a real sidecar, the sidecar goes quiet;
// its 'k' reaches the leader, which proposes an ack-only entry, and every
// replica's table soon keeps none of the session's outcomes. Before, the
// last outcomes stayed until the session's next command: an idle
// sidecar's showed UNACKED 2–7 in `ticketing status` indefinitely, and
// every snapshot carried them.
func TestE2EQuietSessionKeepsNoOutcomes(t *testing.T) {
	c, b := startSessionCluster(t)
	ctx := ctxT(t, 30*time.Second)
	for i := range 5 {
		lk, err := b.Acquire(ctx, "quiet", "o", 10*time.Second, 0)
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		if err := b.Release(ctx, lk); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	sid := b.Info().Session.ID
	testkit.WaitFor(t, "no outcome of the quiet session kept on any node", 10*time.Second, func() bool {
		for i := range c.Size() {
			kept := -1
			c.Node(i).ReadState(func(st *locksm.State) {
				if info, ok := st.Session(sid); ok {
					kept = info.Outcomes
				}
			})
			if kept != 0 {
				return false
			}
		}
		return true
	})
}
