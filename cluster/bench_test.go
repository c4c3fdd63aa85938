package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/wire"
)

// BenchmarkAcquireRelease64 runs uncontended acquire+release cycles from 64
// clients (one connection and one key each) against an in-process 3-node
// cluster with production Raft timings; one op is one cycle. Profile with
// -cpuprofile / -mutexprofile.
func BenchmarkAcquireRelease64(b *testing.B) {
	c, err := local.Start(local.Options{Dir: b.TempDir(), Logger: testLogger(nil)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	li, err := c.Leader(wctx)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	const clients = 64
	conns := make([]*client.Conn, clients)
	for i := range conns {
		if conns[i], err = client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID}); err != nil {
			b.Fatal(err)
		}
		defer conns[i].Close()
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	b.ResetTimer()
	var wg sync.WaitGroup
	for i, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("bench/%d", i)
			for left.Add(-1) >= 0 {
				r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquire, Key: key, Owner: "bench", Lease: 30})
				if err != nil || r.Type != wire.TypeGranted {
					b.Errorf("acquire: %v %s", err, describe(r))
					return
				}
				r, _, err = conn.Do(ctx, wire.Msg{Type: wire.TypeRelease, Key: key, Owner: "bench", Token: r.Token})
				if err != nil || r.Type != wire.TypeOK {
					b.Errorf("release: %v %s", err, describe(r))
					return
				}
			}
		}()
	}
	wg.Wait()
}
