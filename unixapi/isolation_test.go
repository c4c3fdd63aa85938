package unixapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/locksm"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// Isolation under load (issue 20), on a real cluster, a real broker and a
// real server: one connection's waiting room does not take the budgets the
// other connections need, and when waiter room must be refused, the
// connection that holds the most is refused.

// brokerFor starts a broker on c with tune applied, and a server on it.
func brokerFor(t *testing.T, c *local.Cluster, tune func(*sidecar.Config), utune func(*unixapi.Config)) (*sidecar.Broker, *unixapi.Server) {
	t.Helper()
	cfg := sidecar.DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.ClusterID, cfg.Logger = c.ClientAddrs(), c.ClientSecret, c.ClusterID, testLogger()
	if tune != nil {
		tune(&cfg)
	}
	b, err := sidecar.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ucfg := unixapi.DefaultConfig()
	ucfg.Path, ucfg.Logger = sockPath(t), testLogger()
	if utune != nil {
		utune(&ucfg)
	}
	s, err := unixapi.Listen(ucfg, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	testkit.WaitFor(t, "the broker to learn a leader", 20*time.Second, func() bool { return b.Info().Leader != "" })
	return b, s
}

// waitersOf lists the owners waiting for k at c's leader, in queue order.
func waitersOf(t *testing.T, c *local.Cluster, k string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	i, err := c.Leader(ctx)
	if err != nil {
		t.Errorf("no leader: %v", err)
		return nil
	}
	var owners []string
	c.Node(i).ReadState(func(st *locksm.State) {
		for _, w := range st.Waiters(k) {
			owners = append(owners, w.Owner)
		}
	})
	return owners
}

// ownerOf is the owner id a connection's requests carry: the test reads it
// from the holder of a key the connection acquired.
func ownerOf(t *testing.T, c *local.Cluster, conn *conn, k string) string {
	t.Helper()
	tok := token(t, conn.do("ACQUIRE "+k+" 30 0"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	i, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var h locksm.Holder
	c.Node(i).ReadState(func(st *locksm.State) { h, _ = st.Holder(k) })
	expect(t, conn.do(fmt.Sprintf("RELEASE %s %d", k, tok)), "OK")
	return h.Owner
}

// A connection floods its hot key with pipelined waiting ACQUIREs, far
// more than the node lets one connection have in flight, and never reads.
// Meanwhile another connection's ACQUIREs of free keys (with and without a
// wait) and RELEASEs are never refused. Before queued waiters left the
// in-flight budget, the flood took the sidecar's one connection to the
// leader past it, and every other request was answered unavailable.
func TestFloodOfWaitersDoesNotStarveOthers(t *testing.T) {
	const nodeInFlight, flood = 32, 200
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: testLogger(), Tune: func(cfg *cluster.Config) {
		patientRaft(cfg) // the flood must not cost the leader its lease
		cfg.MaxInFlightPerConn = nodeInFlight
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	reportElections(t, c)
	_, s := brokerFor(t, c, nil, nil)
	hot := key(t)
	holder := dial(t, s)
	hotTok := token(t, holder.do("ACQUIRE "+hot+" 250 0"))
	f := dial(t, s)
	lines := make([]string, flood)
	for i := range lines {
		lines[i] = "ACQUIRE " + hot + " 250 300"
	}
	good := dial(t, s)
	f.send(lines...) // and never read; the other connection starts at once

	for i := range 3 * nodeInFlight {
		k1, k2 := key(t), key(t)
		good.send("ACQUIRE "+k1+" 10 5", "ACQUIRE "+k2+" 60 0")
		t1, t2 := token(t, good.read()), token(t, good.read())
		good.send(fmt.Sprintf("RELEASE %s %d", k1, t1), fmt.Sprintf("RELEASE %s %d", k2, t2))
		if r1, r2 := good.read(), good.read(); r1 != "OK" || r2 != "OK" {
			t.Fatalf("cycle %d: releases answered %q, %q", i, r1, r2)
		}
	}
	// Every one of the flood's waiters is queued too: none was refused.
	testkit.WaitFor(t, fmt.Sprintf("%d waiters queued on the hot key", flood), 20*time.Second, func() bool {
		return len(waitersOf(t, c, hot)) == flood
	})
	// The flood's first waiter gets the key when the holder lets go.
	expect(t, holder.do(fmt.Sprintf("RELEASE %s %d", hot, hotTok)), "OK")
	if tok := token(t, f.read()); tok <= hotTok {
		t.Fatalf("flood's grant token %d after %d", tok, hotTok)
	}
}

// The sidecar-wide waiter room (4 here) is full: the connection holding
// the most is refused; a connection holding less evicts that connection's
// newest waiter (answered too_many_waiters, evicted) and takes its place in
// the key's queue; an ACQUIRE with wait 0 of a free key needs no room. The
// evicted connection's other waiters keep their order (FIFO per session).
func TestWaiterRoomRefusesTheLargestSession(t *testing.T) {
	const room = 4
	br, s := brokerFor(t, testCluster, func(cfg *sidecar.Config) { cfg.MaxWaiters = room }, nil)
	hot := key(t)
	reportElections(t, testCluster)
	holder := dial(t, s)
	hotTok := token(t, holder.do("ACQUIRE "+hot+" 60 0"))
	a, b, free := dial(t, s), dial(t, s), dial(t, s)
	aOwner, bOwner := ownerOf(t, testCluster, a, key(t)), ownerOf(t, testCluster, b, key(t))
	for range room {
		a.send("ACQUIRE " + hot + " 60 30")
	}
	testkit.WaitFor(t, "a's waiters queued", 10*time.Second, func() bool { return len(waitersOf(t, testCluster, hot)) == room })
	// Full. a holds all of it: its next waiter is refused.
	a.send("ACQUIRE " + hot + " 60 30")
	// No room needed for wait 0 of a free key, or for its release.
	fk := key(t)
	ftok := token(t, free.do("ACQUIRE "+fk+" 10 0"))
	expect(t, free.do(fmt.Sprintf("RELEASE %s %d", fk, ftok)), "OK")
	// b holds none: a's newest waiter makes room for it.
	b.send("ACQUIRE " + hot + " 60 30")
	want := []string{aOwner, aOwner, aOwner, bOwner}
	testkit.WaitFor(t, fmt.Sprintf("queue %v", want), 10*time.Second, func() bool {
		return strings.Join(waitersOf(t, testCluster, hot), " ") == strings.Join(want, " ")
	})
	// Hand the key down a's queue: its three waiters are granted in the
	// order they were sent, then come its evicted and refused ACQUIREs.
	expect(t, holder.do(fmt.Sprintf("RELEASE %s %d", hot, hotTok)), "OK")
	last := hotTok
	for i := range room - 1 {
		tok := token(t, a.read())
		if tok <= last {
			t.Fatalf("a's grant %d: token %d after %d", i, tok, last)
		}
		last = tok
		a.send(fmt.Sprintf("RELEASE %s %d", hot, tok))
	}
	evicted, refused := a.read(), a.read()
	if !strings.HasPrefix(evicted, "ERR too_many_waiters ") || !strings.Contains(evicted, "evicted") {
		t.Fatalf("a's newest waiter: %q, want too_many_waiters (evicted)", evicted)
	}
	if !strings.HasPrefix(refused, "ERR too_many_waiters ") || !strings.Contains(refused, "holds the most") {
		t.Fatalf("a's waiter asked with the room full: %q, want too_many_waiters (holds the most)", refused)
	}
	for range room - 1 {
		expect(t, a.read(), "OK")
	}
	if tok := token(t, b.read()); tok <= last {
		t.Fatalf("b's grant token %d after a's %d", tok, last)
	}
	// The metrics say so too.
	if n := counter(t, br, "ticketing_sidecar_waiter_evictions_total", ""); n != 1 {
		t.Errorf("evictions %v, want 1", n)
	}
	if n := counter(t, br, "ticketing_sidecar_waiter_refusals_total", "sidecar_full"); n != 1 {
		t.Errorf("refusals (sidecar_full) %v, want 1", n)
	}
}

// counter reads a counter of the broker's registry (with the label value
// reason, or unlabelled when "").
func counter(t *testing.T, b *sidecar.Broker, name, reason string) float64 {
	t.Helper()
	mfs, err := b.MetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if reason == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == reason) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s}", name, reason)
	return 0
}
