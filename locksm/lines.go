package locksm

import (
	"cmp"
	"container/heap"
	"slices"
)

// Line is one key's line of waiters, as TopLines reports it.
type Line struct {
	Key string
	// Waiters is the number queued (a block waiter counts in each of its
	// keys' lines).
	Waiters int
	// Semaphore: the line of a semaphore key's permit waiters.
	Semaphore bool
}

// TopLines returns the n longest lines of the table, longest first, ties
// in key order: the hot keys of an on-sale, for the operators' console.
// A pure read (it may run beside other readers under the same lock), in
// time linear in the number of keys that have a line and log n per line,
// with memory for n lines only.
func (s *State) TopLines(n int) []Line {
	if n <= 0 {
		return nil
	}
	h := make(lineHeap, 0, n)
	offer := func(l Line) {
		switch {
		case len(h) < n:
			heap.Push(&h, l)
		case shorterLine(h[0], l):
			h[0] = l
			heap.Fix(&h, 0)
		}
	}
	for key, e := range s.queued {
		if k := e.queue.len(); k > 0 {
			offer(Line{Key: key, Waiters: k})
		}
	}
	for key, m := range s.sems {
		if m.queue != nil && m.queue.len() > 0 {
			offer(Line{Key: key, Waiters: m.queue.len(), Semaphore: true})
		}
	}
	out := []Line(h)
	slices.SortFunc(out, func(a, b Line) int {
		if shorterLine(a, b) {
			return 1
		}
		if shorterLine(b, a) {
			return -1
		}
		return 0
	})
	return out
}

// shorterLine orders lines by length, then the later key first, so that
// the heap's root is the line to drop and the result is deterministic
// whatever the maps' order.
func shorterLine(a, b Line) bool {
	if a.Waiters != b.Waiters {
		return a.Waiters < b.Waiters
	}
	return cmp.Compare(a.Key, b.Key) > 0
}

// lineHeap is a min-heap of lines by shorterLine.
type lineHeap []Line

func (h lineHeap) Len() int           { return len(h) }
func (h lineHeap) Less(i, j int) bool { return shorterLine(h[i], h[j]) }
func (h lineHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *lineHeap) Push(x any)        { *h = append(*h, x.(Line)) }
func (h *lineHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	*h = old[:len(old)-1]
	return l
}
