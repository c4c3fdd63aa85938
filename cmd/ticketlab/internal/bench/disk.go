package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster"
)

// diskEntryBytes is the size of one appended entry: about a batch of 16
// lock commands, what a busy leader proposes at once.
const diskEntryBytes = 512

// benchDisk measures what bounds every commit on this machine: one durable
// append to a node's Raft log store, for each kind in kinds
// (raft-boltdb/v2 over bbolt: a transaction with two fdatasyncs;
// raft-wal: a write and one fsync of the tail segment), first with one
// store appending alone, then with `nodes` stores in one directory
// appending at once, as the nodes of a one-box cluster do. hashicorp/raft
// writes the leader's log before it replicates, and a follower
// acknowledges after its own append, so a commit takes at least two
// appends in series; the bounds printed follow from that alone, for any
// client, batching or network.
func benchDisk(ctx context.Context, dir string, kinds []cluster.LogStoreKind, nodes int, duration time.Duration, out io.Writer) error {
	for _, kind := range kinds {
		var concurrent time.Duration
		for _, n := range []int{1, nodes} {
			lat, err := diskAppends(ctx, filepath.Join(dir, fmt.Sprintf("disk-%s-%d", kind, n)), kind, n, duration)
			if err != nil {
				return fmt.Errorf("%s: %w", kind, err)
			}
			slices.Sort(lat)
			q := func(f float64) time.Duration { return lat[int(f*float64(len(lat)-1))].Round(time.Microsecond) }
			fmt.Fprintf(out, "disk (%s): %d store(s) appending at once, %d-byte entries: %d appends in %v; per append p50 %v p99 %v p99.9 %v\n",
				kind, n, diskEntryBytes, len(lat), duration, q(0.5), q(0.99), q(0.999))
			concurrent = q(0.5)
		}
		commit := 2 * concurrent
		fmt.Fprintf(out, "disk (%s): a commit is at least a leader append then a follower append: %v with %d stores busy\n", kind, commit, nodes)
		fmt.Fprintf(out, "disk (%s): so, at best: contended hand-offs on one key ≤ %.0f/s (one commit each); uncontended acquire+release at 64 clients ≤ %.0f cycles/s (two commits per cycle)\n",
			kind, 1/commit.Seconds(), 64/(2*commit.Seconds()))
	}
	return nil
}

// diskAppends runs n stores of the given kind, each appending one entry
// at a time for duration, and returns every append's latency.
func diskAppends(ctx context.Context, dir string, kind cluster.LogStoreKind, n int, duration time.Duration) ([]time.Duration, error) {
	var (
		mu   sync.Mutex
		all  []time.Duration
		errs = make(chan error, n)
		wg   sync.WaitGroup
	)
	payload := make([]byte, diskEntryBytes)
	deadline := time.Now().Add(duration)
	for i := range n {
		sdir := filepath.Join(dir, fmt.Sprintf("s%d", i))
		if err := os.MkdirAll(sdir, 0o700); err != nil {
			return nil, err
		}
		store, err := cluster.OpenLogStore(sdir, kind)
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer store.Close()
			var lat []time.Duration
			for idx := uint64(1); time.Now().Before(deadline) && ctx.Err() == nil; idx++ {
				t0 := time.Now()
				if err := store.StoreLogs([]*raft.Log{{Index: idx, Term: 1, Type: raft.LogCommand, Data: payload}}); err != nil {
					errs <- err
					return
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("no append completed")
	}
	return all, ctx.Err()
}
