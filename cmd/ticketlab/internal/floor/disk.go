package floor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// DiskEntryBytes is the size of one appended entry in the disk floor:
// about a batch of 16 lock commands, what a busy leader proposes at once.
const DiskEntryBytes = 512

// DiskFloor is one round of the disk floor: Stores stores in one
// directory, each appending one DiskEntryBytes entry at a time, all at
// once, as the nodes of a one-box cluster do.
type DiskFloor struct {
	// LogStore is the kind of store (Bolt or WAL).
	LogStore string
	// Stores is how many stores appended at once.
	Stores int
	// Elapsed is how long they appended.
	Elapsed time.Duration
	// Append holds the latencies of every store's appends together.
	Append Quantiles
}

// Commit is the least a commit can take with this many stores busy:
// hashicorp/raft writes the leader's log before it replicates, and a
// follower acknowledges after its own append, so a commit is at least two
// appends in series (2 × the append p50).
func (d DiskFloor) Commit() time.Duration { return 2 * d.Append.P50 }

// HandoffsPerS bounds contended hand-offs on one key: one commit each.
func (d DiskFloor) HandoffsPerS() float64 {
	if c := d.Commit(); c > 0 {
		return 1 / c.Seconds()
	}
	return 0
}

// CyclesPerS bounds uncontended acquire+release cycles with this many
// clients: two commits per cycle.
func (d DiskFloor) CyclesPerS(clients int) float64 {
	if c := d.Commit(); c > 0 {
		return float64(clients) / (2 * c.Seconds())
	}
	return 0
}

// Disk measures one round of the disk floor in dir (created; the stores
// go in subdirectories of it).
func Disk(ctx context.Context, kind, dir string, stores int, duration time.Duration) (DiskFloor, error) {
	t0 := time.Now()
	lat, err := appends(ctx, kind, dir, stores, duration)
	d := DiskFloor{LogStore: kind, Stores: stores, Elapsed: time.Since(t0), Append: quantiles(lat)}
	return d, err
}

// appends runs n stores, each appending one entry at a time for
// duration, and returns every append's latency.
func appends(ctx context.Context, kind, dir string, n int, duration time.Duration) ([]time.Duration, error) {
	if n < 1 {
		return nil, fmt.Errorf("floor: %d stores: want at least 1", n)
	}
	var (
		mu   sync.Mutex
		all  []time.Duration
		errs = make(chan error, n)
		wg   sync.WaitGroup
	)
	var opened []Store
	for i := range n {
		store, err := Open(kind, filepath.Join(dir, fmt.Sprintf("s%d", i)))
		if err != nil {
			for _, s := range opened {
				_ = s.Close() // a throwaway store in a temporary dir; the open's error is the news
			}
			return nil, err
		}
		opened = append(opened, store)
	}
	payload := make([]byte, DiskEntryBytes)
	deadline := time.Now().Add(duration)
	for _, store := range opened {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { _ = store.Close() }() // a throwaway store: only its appends' latency counts
			var lat []time.Duration
			for idx := uint64(1); time.Now().Before(deadline) && ctx.Err() == nil; idx++ {
				t0 := time.Now()
				if err := store.StoreLogs([]*raft.Log{{Index: idx, Term: 1, Type: raft.LogCommand, Data: payload}}); err != nil {
					errs <- fmt.Errorf("floor: append %d: %w", idx, err)
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
	if err := ctx.Err(); err != nil {
		return all, err
	}
	if len(all) == 0 {
		return nil, errors.New("floor: no append completed")
	}
	return all, nil
}
