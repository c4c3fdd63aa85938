package cluster_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// A delivered grant keeps its lease when its sidecar is cut off together
// with the old leader (issue 39, finding 1; the CURATOR-206 case), on real
// nodes over TCP. The old leader commits a session's grant and tells it G;
// at once it is isolated from its peers and the sidecar never reaches
// another node. The new leader applies that grant in its barrier (a
// follower learns the commit index only from the next entry: here the
// commit timeout is long, so always; at stock timings usually). Its
// session expires after its timeout, and the expiry must leave the
// delivered holding to its lease: before the fix it was counted untold and
// released, and the next waiter got the key with the first holder's lease
// barely started: two holders.
func TestDeliveredGrantKeepsLeaseAcrossLeaderAndSidecarCutOff(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) {
		cfg.CommitTimeout = 5 * time.Second
	}})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 7", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionSessions
	})

	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	const sid = 91
	sc := c.sessionConn(li)
	sc.send(wire.Msg{Type: wire.TypeOpenSession, ID: 1 << 40, Session: sid, TimeoutMs: locksm.MinSessionTimeoutMs, Secret: secret})
	if m := sc.next(); m.Type != wire.TypeOK {
		t.Fatalf("open: %s", describe(m))
	}
	acq := acquireMsg("hot", "first", 60, 0)
	acq.ID = 1
	sc.send(acq)
	g := sc.next()
	token := mustGrant(t, g)
	// The holder was told. Now the old leader and its sidecar are cut off
	// from everyone else.
	c.faults.Isolate(c.ID(li), c.IDs())
	sc.conn.Close()

	ni := -1
	testkit.WaitFor(t, "a new leader serving", 20*time.Second, func() bool {
		for i := range c.Size() {
			if i != li && c.Node(i) != nil && c.Node(i).Serving() {
				ni = i
				return true
			}
		}
		return false
	})
	holderOn := func(i int) (h locksm.Holder, ok bool) {
		c.Node(i).ReadState(func(st *locksm.State) { h, ok = st.Holder("hot") })
		return h, ok
	}
	if h, ok := holderOn(ni); !ok || h.Token != token {
		t.Fatalf("the new leader's table: hot held %v by %+v, want token %d", ok, h, token)
	}

	// Another event server queues on the key at the new leader.
	next := c.dial(ni)
	got := make(chan wire.Msg, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		r, _, err := next.Do(ctx, acquireMsg("hot", "second", 10, 30*time.Second))
		if err != nil {
			r = wire.Msg{Type: wire.TypeError, Text: err.Error()}
		}
		got <- r
	}()
	testkit.WaitFor(t, "the second caller queued", 15*time.Second, func() bool {
		n := 0
		c.Node(ni).ReadState(func(st *locksm.State) { n = st.QueueLen("hot") })
		return n == 1
	})

	// The session expires (its sidecar never comes back).
	testkit.WaitFor(t, "the cut-off sidecar's session expired", 20*time.Second, func() bool {
		live := true
		c.Node(ni).ReadState(func(st *locksm.State) { _, live = st.Session(sid) })
		return !live
	})
	if h, ok := holderOn(ni); !ok || h.Token != token {
		t.Fatalf("after the session's expiry hot is held %v by %+v: the holder told G token %d with a 60 s lease lost it early", ok, h, token)
	}
	select {
	case r := <-got:
		t.Fatalf("the second caller got %s inside the first holder's lease", describe(r))
	case <-time.After(time.Second):
	}
	c.faults.Heal()
}
