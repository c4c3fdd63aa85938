package cluster_test

import (
	"context"
	"fmt"
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
// (issue 20: at most 1 KiB on the leader). An in-process 3-node cluster
// (production Raft timings) takes N waiters on one hot key through one
// version 4 connection, in rounds of MaxInFlightPerConn, each told Q; the
// heap in use after a GC, before and after, gives bytes per waiter for the
// whole process (three nodes: the leader's core, wait timer and table
// entry, and both followers' table entries). A follower's share is one
// lock-table waiter, measured on a locksm.State alone, so the leader's is
// estimated as the process's less two of those. Run:
//
//	go test ./cluster -run '^$' -bench LeaderMemoryPerWaiter -benchtime 1x
//
// (not with -race, which inflates every allocation). Profile with
// -memprofile -memprofilerate 1.
func BenchmarkLeaderMemoryPerWaiter(b *testing.B) {
	const n = 50_000
	c, err := local.Start(local.Options{Dir: b.TempDir(), Logger: testLogger(nil), Tune: func(cfg *cluster.Config) {
		cfg.MaxWaitersPerKey = n
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	li, err := c.Leader(wctx)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	dial := func() (net.Conn, *wire.Reader, wire.Peer) {
		conn, err := net.DialTimeout("tcp", c.ClientAddr(li), 2*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		peer, err := wire.ClientHandshake(conn, wire.HandshakeConfig{Kind: wire.KindClient, Secret: c.ClientSecret, ClusterID: c.ClusterID})
		if err != nil {
			b.Fatal(err)
		}
		return conn, wire.NewReader(conn), peer
	}
	hc, hr, _ := dial()
	defer hc.Close()
	send := func(conn net.Conn, msgs []wire.Msg) {
		var buf []byte
		for i := range msgs {
			if buf, err = wire.AppendMsg(buf, &msgs[i]); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := conn.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	send(hc, []wire.Msg{{Type: wire.TypeAcquire, ID: 1, Key: "hot", Owner: "holder", Lease: 250}})
	var m wire.Msg
	if err := hr.ReadMsg(&m); err != nil || m.Type != wire.TypeGranted {
		b.Fatalf("holder: %v %s", err, describe(m))
	}
	conn, r, peer := dial()
	defer conn.Close()
	round := peer.MaxInFlight

	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
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
				b.Fatalf("waiter %d: %v %s", queued, err, describe(m))
			}
			queued++
		}
	}
	// Every node has applied them (the followers learn the commit index
	// with the next append).
	for i := range c.Size() {
		testkit.WaitFor(b, fmt.Sprintf("node %d to apply every waiter", i), 30*time.Second, func() bool {
			var q int
			c.Node(i).ReadState(func(st *locksm.State) { q = st.NumWaiting() })
			return q == n
		})
	}
	after := heap()

	// One follower's share: the same waiters in a lock table alone.
	st := locksm.New()
	st.Apply(locksm.Command{Op: locksm.OpAcquire, Key: "hot", Owner: "holder", LeaseSec: 250, Ref: 1}, nil)
	tbefore := heap()
	for i := 0; i < n; i++ {
		st.Apply(locksm.Command{Op: locksm.OpAcquire, Key: "hot", Owner: fmt.Sprintf("buyer-%06d", i+2), LeaseSec: 30,
			WaitMs: 300_000, Ref: uint64(i + 2)}, nil)
	}
	tafter := heap()
	runtime.KeepAlive(st)

	process := float64(after-before) / n
	table := float64(tafter-tbefore) / n
	b.ReportMetric(process, "B/waiter-process")
	b.ReportMetric(table, "B/waiter-table")
	b.ReportMetric(process-2*table, "B/waiter-leader")
}
