package cluster

import (
	"slices"
	"sync"
	"time"
)

// commitWindow keeps the latencies of the latest batches, from proposal to
// apply on this node (the leader): the console's commit latency chart.
// The metric ticketing_node_commit_duration_seconds has them all; this
// answers "the last second's p50 and p99" without a histogram's buckets.
// Its mutex is a leaf.
type commitWindow struct {
	mu   sync.Mutex
	at   [commitWindowLen]int64 // UnixNano of each apply
	took [commitWindowLen]time.Duration
	next int // the slot the next one takes
	n    int // how many slots hold one
}

// commitWindowLen bounds the batches kept: at a thousand batches a second,
// about four seconds of them.
const commitWindowLen = 4096

func (w *commitWindow) add(at time.Time, took time.Duration) {
	w.mu.Lock()
	w.at[w.next], w.took[w.next] = at.UnixNano(), took
	w.next = (w.next + 1) % commitWindowLen
	w.n = min(w.n+1, commitWindowLen)
	w.mu.Unlock()
}

// since returns the p50 and p99 of the latencies of the batches applied
// at or after from, and how many there were.
func (w *commitWindow) since(from time.Time) (p50, p99 time.Duration, n int) {
	f := from.UnixNano()
	w.mu.Lock()
	var d []time.Duration
	for i := range w.n {
		if w.at[i] >= f {
			d = append(d, w.took[i])
		}
	}
	w.mu.Unlock()
	if len(d) == 0 {
		return 0, 0, 0
	}
	slices.Sort(d)
	q := func(p float64) time.Duration { return d[int(p*float64(len(d)-1))] }
	return q(0.5), q(0.99), len(d)
}
