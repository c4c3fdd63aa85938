package cluster_test

import (
	"bytes"
	"crypto/rand"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// A session that never acks grows the replicated state only up to
// MaxSessionOutcomes (issue 39, finding 4), on real nodes: a raw protocol
// connection opens a session and writes busy acquires without ever
// sending 'k'. Once its unacknowledged outcomes fill the bound, its
// acquires are refused too_many_outcomes (nothing proposed), and every
// replica's table keeps exactly the bound; before, 200,000 busy acquires
// left 200,000 outcomes and a 784 KB snapshot of a table holding one key.
// The test logs the snapshot's bytes.
func TestNeverAckingSessionIsBounded(t *testing.T) {
	const bound, writes = 500, 700
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) {
		cfg.MaxSessionOutcomes = bound
		// One connection for the whole run: no leader change on a busy
		// machine (a session connection closes with its leadership).
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 3*time.Second, 3*time.Second, 2*time.Second
	}})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 9", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionAckEntry
	})
	holder := c.dial(li)
	mustGrant(t, do(t, holder, acquireMsg("hot", "holder", 120, 0)))

	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	sc := c.sessionConn(li)
	sc.send(wire.Msg{Type: wire.TypeOpenSession, ID: 1 << 40, Session: 5151, TimeoutMs: 30_000, Secret: secret})
	if m := sc.next(); m.Type != wire.TypeOK {
		t.Fatalf("open: %s", describe(m))
	}
	busy, refused := 0, 0
	for seq := uint64(1); seq <= writes; seq++ {
		m := acquireMsg("hot", "never-acks", 10, 0)
		m.ID = seq
		sc.send(m)
		// One at a time: the bound counts outcomes recorded, not
		// requests in flight.
		switch r := sc.next(); {
		case r.Type == wire.TypeBusy:
			busy++
		case r.Type == wire.TypeError && r.Code == wire.CodeTooManyOutcomes:
			refused++
		default:
			t.Fatalf("seq %d: %s", seq, describe(r))
		}
	}
	if busy != bound || refused != writes-bound {
		t.Fatalf("%d busy, %d refused too_many_outcomes; want %d and %d", busy, refused, bound, writes-bound)
	}
	for i := range c.Size() {
		testkit.WaitFor(t, "the replica caught up", 10*time.Second, func() bool {
			kept := -1
			c.Node(i).ReadState(func(st *locksm.State) {
				if info, ok := st.Session(5151); ok {
					kept = info.Outcomes
				}
			})
			return kept == bound
		})
	}
	var snap bytes.Buffer
	c.Node(li).ReadState(func(st *locksm.State) {
		if err := st.WriteSnapshot(&snap); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("a never-acking session at MaxSessionOutcomes %d: %d outcomes kept, snapshot %d bytes (%.1f per outcome)",
		bound, bound, snap.Len(), float64(snap.Len())/bound)
}
