// Package floor measures what bounds a commit on this machine below any
// lock service: the disk (durable appends to a Raft log store, Disk) and
// the Raft library itself (three in-process hashicorp/raft nodes over
// loopback TCP, Library). `ticketlab bench disk` and `ticketlab compare`
// print them; a server's figures are read against them.
//
// The log store is either of the two `ticketing node --log-store` kinds,
// github.com/hashicorp/raft-wal (one fsync per append; what a node creates
// in a new data dir) or raft-boltdb/v2 (two), opened as a node opens it
// (cluster.OpenLogStore).
package floor

import (
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster"
)

// The log stores a floor can be measured on.
const (
	// Bolt is raft-boltdb/v2 over bbolt, opened by cluster.OpenLogStore:
	// a transaction with two fdatasyncs per append.
	Bolt = "bolt"
	// WAL is github.com/hashicorp/raft-wal: one fsync per append.
	WAL = "wal"
)

// LogStores lists the kinds Open accepts, the default first.
var LogStores = []string{WAL, Bolt}

// Store is a Raft log and stable store that can be closed.
type Store interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// Open opens (creating if need be) a store of the given kind in dir,
// which it creates too.
func Open(kind, dir string) (Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := CheckKind(kind); err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	// The node's own opening, options included.
	s, err := cluster.OpenLogStore(dir, cluster.LogStoreKind(kind))
	if err != nil {
		return nil, fmt.Errorf("floor: %s store in %s: %w", kind, dir, err)
	}
	return s, nil
}

// CheckKind reports whether kind is one of LogStores.
func CheckKind(kind string) error {
	if !slices.Contains(LogStores, kind) {
		return fmt.Errorf("unknown log store %q (known: wal, bolt)", kind)
	}
	return nil
}

// Quantiles are the p50, p99 and p99.9 of a set of latencies.
type Quantiles struct {
	// N is the number of latencies.
	N int
	// P50, P99 and P999 are the quantiles, rounded to the microsecond.
	P50, P99, P999 time.Duration
}

// quantiles sorts lat and returns its quantiles (zero for none).
func quantiles(lat []time.Duration) Quantiles {
	if len(lat) == 0 {
		return Quantiles{}
	}
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[int(f*float64(len(lat)-1))].Round(time.Microsecond) }
	return Quantiles{N: len(lat), P50: q(0.5), P99: q(0.99), P999: q(0.999)}
}
