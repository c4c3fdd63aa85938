package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"ticketing/cmd/ticketlab/internal/floor"
)

// benchDisk measures what bounds every commit on this machine: one durable
// append to a node's Raft log store (by default raft-wal, as a node's new
// data dir: one fsync; raft-boltdb/v2 over bbolt: a transaction with two
// fdatasyncs), first with one
// store appending alone, then with `nodes` stores in one directory
// appending at once, as the nodes of a one-box cluster do. hashicorp/raft
// writes the leader's log before it replicates, and a follower
// acknowledges after its own append, so a commit takes at least two
// appends in series; the bounds printed follow from that alone, for any
// client, batching or network (floor.DiskFloor; `ticketlab compare`
// measures the same round in its run).
func benchDisk(ctx context.Context, dir, logStore string, nodes int, duration time.Duration, out io.Writer) error {
	var concurrent floor.DiskFloor
	for _, n := range []int{1, nodes} {
		d, err := floor.Disk(ctx, logStore, filepath.Join(dir, fmt.Sprintf("disk-%d", n)), n, duration)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "disk: %d %s store(s) appending at once, %d-byte entries: %d appends in %v; per append p50 %v p99 %v p99.9 %v\n",
			n, logStore, floor.DiskEntryBytes, d.Append.N, duration, d.Append.P50, d.Append.P99, d.Append.P999)
		concurrent = d
	}
	fmt.Fprintf(out, "disk: a commit is at least a leader append then a follower append: %v with %d stores busy\n", concurrent.Commit(), nodes)
	fmt.Fprintf(out, "disk: so, at best: contended hand-offs on one key ≤ %.0f/s (one commit each); uncontended acquire+release at 64 clients ≤ %.0f cycles/s (two commits per cycle)\n",
		concurrent.HandoffsPerS(), concurrent.CyclesPerS(64))
	return nil
}
