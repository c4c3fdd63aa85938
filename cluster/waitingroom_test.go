package cluster_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// rawConnVersion is rawConn speaking at most version v, returning what the
// handshake learned.
func (c *testCluster) rawConnVersion(i int, v uint16) (net.Conn, *wire.Reader, wire.Peer) {
	c.t.Helper()
	conn, err := net.DialTimeout("tcp", c.ClientAddr(i), 2*time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	peer, err := wire.ClientHandshake(conn, wire.HandshakeConfig{Kind: wire.KindClient, Secret: c.ClientSecret,
		ClusterID: c.ClusterID, MaxVersion: v})
	if err != nil {
		c.t.Fatal(err)
	}
	return conn, wire.NewReader(conn), peer
}

// A waiting room on one connection (issue 20): queued waiters do not take
// the budget of requests in flight, so one connection holds more waiters
// than MaxInFlightPerConn and is still served an acquire of a free key and
// a release; its waiters are bounded by MaxWaitersPerConn instead
// (too_many_waiters, per connection). A version 4 connection is told Q for
// each acquire that queued, and learns both limits from the Welcome; a
// version 3 connection is never sent Q.
func TestWaitingRoomOnOneConnection(t *testing.T) {
	const maxInFlight, maxWaiters = 8, 20
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) {
		cfg.MaxInFlightPerConn, cfg.MaxWaitersPerConn = maxInFlight, maxWaiters
	}})
	li := c.leader()
	leader := c.Node(li)
	holder := c.dial(li)
	hot := mustGrant(t, do(t, holder, acquireMsg("hot", "holder", 120, 0)))

	conn, r, peer := c.rawConnVersion(li, wire.VersionQueued)
	if peer.Version != wire.VersionQueued || peer.MaxInFlight != maxInFlight || peer.MaxWaiters != maxWaiters {
		t.Fatalf("version 4 handshake learned %+v, want the limits %d and %d", peer, maxInFlight, maxWaiters)
	}
	id := uint64(0)
	next := func() uint64 { id++; return id }
	waiter := func() wire.Msg {
		m := acquireMsg("hot", "room", 30, 60*time.Second)
		m.ID = next()
		return m
	}
	// Rounds of MaxInFlightPerConn waiters: each round is in flight until
	// its commands are applied as queued (each told Q), then no longer.
	queued := 0
	for queued+maxInFlight <= maxWaiters {
		var round []wire.Msg
		want := map[uint64]bool{}
		for range maxInFlight {
			m := waiter()
			round = append(round, m)
			want[m.ID] = true
		}
		rawSend(t, conn, round...)
		for len(want) > 0 {
			m := rawNext(t, r)
			if m.Type != wire.TypeQueued || !want[m.ID] {
				t.Fatalf("with %d waiters queued: %s, want Q for one of %v", queued, describe(m), want)
			}
			delete(want, m.ID)
			queued++
		}
	}
	if queued <= maxInFlight {
		t.Fatalf("only %d waiters queued", queued)
	}
	var q int
	leader.ReadState(func(st *locksm.State) { q = len(st.Waiters("hot")) })
	if q != queued {
		t.Fatalf("the leader's queue holds %d waiters, %d were told Q", q, queued)
	}

	// The connection is still served: a free key, and a release.
	free := acquireMsg("free", "room", 30, 0)
	free.ID = next()
	rawSend(t, conn, free)
	g := rawNext(t, r)
	if g.Type != wire.TypeGranted || g.ID != free.ID {
		t.Fatalf("acquire of a free key next to %d waiters: %s", queued, describe(g))
	}
	rel := releaseMsg("free", "room", g.Token)
	rel.ID = next()
	rawSend(t, conn, rel)
	if k := rawNext(t, r); k.Type != wire.TypeOK || k.ID != rel.ID {
		t.Fatalf("release next to %d waiters: %s", queued, describe(k))
	}

	// Up to MaxWaitersPerConn, then too_many_waiters naming the
	// per-connection limit; an acquire with wait 0 needs no waiter room.
	for queued < maxWaiters {
		m := waiter()
		rawSend(t, conn, m)
		if got := rawNext(t, r); got.Type != wire.TypeQueued || got.ID != m.ID {
			t.Fatalf("waiter %d: %s, want Q", queued+1, describe(got))
		}
		queued++
	}
	over := waiter()
	rawSend(t, conn, over)
	if e := rawNext(t, r); e.Type != wire.TypeError || e.ID != over.ID || e.Code != wire.CodeTooManyWaiters ||
		!strings.Contains(e.Text, "per connection") {
		t.Fatalf("waiter %d over MaxWaitersPerConn %d: %s", queued+1, maxWaiters, describe(e))
	}
	busy := acquireMsg("hot", "room", 30, 0)
	busy.ID = next()
	rawSend(t, conn, busy)
	if b := rawNext(t, r); b.Type != wire.TypeBusy || b.ID != busy.ID {
		t.Fatalf("wait-0 acquire with the waiter room full: %s", describe(b))
	}
	if st := leader.Stats(); st.ConnWaiterLimitRefusals != 1 || st.InFlightRefusals != 0 {
		t.Fatalf("refusals counted: %+v", st)
	}

	// A version 3 connection: its acquire queues (and is cancelled)
	// without a Q. Q would come before the T, which follows the queueing.
	v3, r3, p3 := c.rawConnVersion(li, 3)
	if p3.Version != 3 || p3.MaxInFlight != 0 || p3.MaxWaiters != 0 {
		t.Fatalf("version 3 handshake learned %+v", p3)
	}
	old := acquireMsg("hot", "old", 30, 60*time.Second)
	old.ID = 1
	rawSend(t, v3, old)
	waitQueue(t, leader, "hot", queued+1)
	rawSend(t, v3, wire.Msg{Type: wire.TypeCancel, ID: 2, Target: 1})
	for done := false; !done; {
		m := rawNext(t, r3)
		switch {
		case m.Type == wire.TypeOK && m.ID == 2:
		case m.Type == wire.TypeTimeout && m.ID == 1:
			done = true
		default:
			t.Fatalf("version 3 connection got %s", describe(m))
		}
	}

	// The holder's release hands the key to the room's head (FIFO).
	mustType(t, do(t, holder, releaseMsg("hot", "holder", hot)), wire.TypeOK)
	if m := rawNext(t, r); m.Type != wire.TypeGranted || m.ID != 1 {
		t.Fatalf("after the holder's release: %s, want G for the first waiter", describe(m))
	}
}

func waitQueue(t *testing.T, n *cluster.Node, key string, want int) {
	t.Helper()
	testkit.WaitFor(t, "the queue of "+key+" to grow", 10*time.Second, func() bool {
		var q int
		n.ReadState(func(st *locksm.State) { q = len(st.Waiters(key)) })
		return q == want
	})
}
