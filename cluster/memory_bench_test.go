package cluster_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"runtime"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// BenchmarkLeaderMemoryPerWaiter measures the heap a queued waiter costs
// (issue 20: at most 1 KiB on the leader; TestLeaderMemoryPerWaiter holds
// it to that). An in-process 3-node cluster takes N waiters on one hot key
// through one version 4 connection, in rounds of MaxInFlightPerConn, each
// told Q; the heap in use after a GC, before and after, gives bytes per
// waiter for the whole process (three nodes: the leader's core, wait timer
// and table entry, and both followers' table entries). A follower's share
// is one lock-table waiter, measured on a locksm.State alone, so the
// leader's is estimated as the process's less two of those. Run:
//
//	go test ./cluster -run '^$' -bench LeaderMemoryPerWaiter -benchtime 1x
//
// (not with -race, which inflates every allocation). Profile with
// -memprofile -memprofilerate 1.
func BenchmarkLeaderMemoryPerWaiter(b *testing.B) {
	m := measureLeaderMemory(b, 50_000)
	b.ReportMetric(m.process, "B/waiter-process")
	b.ReportMetric(m.table, "B/waiter-table")
	b.ReportMetric(m.leader(), "B/waiter-leader")
	for range b.N {
	}
}

// leaderMemory is what measureLeaderMemory measured, in bytes per waiter.
type leaderMemory struct {
	process float64 // the three nodes of the process together
	table   float64 // one lock table's waiter: a follower's share
}

// leader is the leader's share: the process's less the two followers'.
func (m leaderMemory) leader() float64 { return m.process - 2*m.table }

// measureLeaderMemory queues n waiters at an in-process cluster's leader
// and measures their heap (BenchmarkLeaderMemoryPerWaiter says how). The
// heartbeat, election and lease timeouts are long, so that no load of the
// machine costs the leader its lease halfway (they do not change a
// waiter's bytes).
func measureLeaderMemory(tb testing.TB, n int) leaderMemory {
	tb.Helper()
	table := tableBytesPerWaiter(n)
	c, err := local.Start(local.Options{Dir: tb.TempDir(), Logger: testLogger(nil), Tune: func(cfg *cluster.Config) {
		cfg.MaxWaitersPerKey = n
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 3*time.Second, 3*time.Second, 3*time.Second
	}})
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	li, err := c.Leader(wctx)
	cancel()
	if err != nil {
		tb.Fatal(err)
	}
	dial := func() (net.Conn, *wire.Reader, wire.Peer) {
		conn, err := net.DialTimeout("tcp", c.ClientAddr(li), 2*time.Second)
		if err != nil {
			tb.Fatal(err)
		}
		peer, err := wire.ClientHandshake(conn, wire.HandshakeConfig{Kind: wire.KindClient, Secret: c.ClientSecret, ClusterID: c.ClusterID})
		if err != nil {
			tb.Fatal(err)
		}
		return conn, wire.NewReader(conn), peer
	}
	hc, hr, _ := dial()
	defer hc.Close()
	send := func(conn net.Conn, msgs []wire.Msg) {
		var buf []byte
		for i := range msgs {
			if buf, err = wire.AppendMsg(buf, &msgs[i]); err != nil {
				tb.Fatal(err)
			}
		}
		if _, err := conn.Write(buf); err != nil {
			tb.Fatal(err)
		}
	}
	send(hc, []wire.Msg{{Type: wire.TypeAcquire, ID: 1, Key: "hot", Owner: "holder", Lease: 250}})
	var m wire.Msg
	if err := hr.ReadMsg(&m); err != nil || m.Type != wire.TypeGranted {
		tb.Fatalf("holder: %v %s", err, describe(m))
	}
	conn, r, peer := dial()
	defer conn.Close()
	round := peer.MaxInFlight

	before := heapAlloc()
	id := uint64(0)
	for queued := 0; queued < n; {
		k := min(round, n-queued)
		msgs := make([]wire.Msg, k)
		for i := range msgs {
			id++
			msgs[i] = wire.Msg{Type: wire.TypeAcquire, ID: id, Key: "hot", Owner: fmt.Sprintf("buyer-%06d", id), Lease: 30, WaitMs: 300_000}
		}
		send(conn, msgs)
		for range k {
			if err := r.ReadMsg(&m); err != nil || m.Type != wire.TypeQueued {
				tb.Fatalf("waiter %d: %v %s", queued, err, describe(m))
			}
			queued++
		}
	}
	// Every node has applied them (the followers learn the commit index
	// with the next append).
	for i := range c.Size() {
		testkit.WaitFor(tb, fmt.Sprintf("node %d to apply every waiter", i), 30*time.Second, func() bool {
			var q int
			c.Node(i).ReadState(func(st *locksm.State) { q = st.NumWaiting() })
			return q == n
		})
	}
	after := heapAlloc()
	return leaderMemory{process: (float64(after) - float64(before)) / float64(n), table: table}
}

// heapAlloc is the heap in use after a collection.
func heapAlloc() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// tableBytesPerWaiter is one follower's share of a waiter: n waiters in a
// lock table alone, measured before the cluster runs in the process (whose
// allocations would blur it). The most of three measurements: memory that
// something else frees meanwhile (a cluster an earlier test closed) makes
// one smaller, and a smaller share would make the leader's look larger.
func tableBytesPerWaiter(n int) float64 {
	most := math.Inf(-1)
	for range 3 {
		most = max(most, tableBytesOnce(n))
	}
	return most
}

func tableBytesOnce(n int) float64 {
	st := locksm.New()
	st.Apply(locksm.Command{Op: locksm.OpAcquire, Key: "hot", Owner: "holder", LeaseSec: 250, Ref: 1}, nil)
	before := heapAlloc()
	for i := 0; i < n; i++ {
		st.Apply(locksm.Command{Op: locksm.OpAcquire, Key: "hot", Owner: fmt.Sprintf("buyer-%06d", i+2), LeaseSec: 30,
			WaitMs: 300_000, Ref: uint64(i + 2)}, nil)
	}
	after := heapAlloc()
	runtime.KeepAlive(st)
	return (float64(after) - float64(before)) / float64(n)
}
