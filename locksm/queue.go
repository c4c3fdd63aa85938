package locksm

// waitQueue is one key's FIFO of waiters. Push, pop, lookup and removal by
// ref all cost O(1) amortized, however long the queue: a waiting room of
// tens of thousands on one key is the product's central case, and waiters
// leave from the middle when their wait runs out or their connection
// closes. A slice with an O(n) search and shift per removal made 30,000
// cancels in random order cost 0.7 s of apply time on every replica
// (30,000² / 2 waiter moves), a stall of the whole table
// (BenchmarkCancelWaiters).
//
// A removed waiter leaves a hole (a zero Waiter: queued waiters have a
// lease of at least MinLeaseSec, holes have 0) instead of shifting the
// others; holes at either end are trimmed at once, so ws[0] is always the
// live head, and the slice is compacted when holes outnumber live waiters
// (amortized O(1) per removal). Long queues keep an index from ref to
// position.
type waitQueue struct {
	// ws holds the waiters in FIFO order, head first, with holes between
	// them; its first and last elements are live.
	ws []Waiter
	// live is the number of waiters in ws that are not holes.
	live int
	// index maps the ref of every live waiter to its position: its index
	// in ws plus off. Nil until ws grows to indexFrom; linear search is
	// cheaper below that, and short queues are the common case.
	index map[uint64]int
	// off is the number of elements popped off ws's front since index
	// was built.
	off int
	// rank counts the live waiters by absolute position (an index in ws
	// plus off), so that a waiter's place in line is O(log n) however
	// long the queue (position). Built on the first position asked
	// (nil until then: most queues are never asked), kept by push and
	// removeAt, dropped when reindex or compact renumber the positions or
	// when it grew to twice the queue.
	rank *fenwick
}

// indexFrom is the length at which a queue builds its ref index, and
// compactFrom the number of holes a queue keeps at most before it closes
// them once they outnumber its waiters. Variables so that tests exercise
// every path with short queues.
var (
	indexFrom   = 32
	compactFrom = 16
)

func hole(w *Waiter) bool { return w.LeaseSec == 0 }

// len is the number of waiters; a nil queue is empty.
func (q *waitQueue) len() int {
	if q == nil {
		return 0
	}
	return q.live
}

// head is the first waiter; q must not be empty.
func (q *waitQueue) head() *Waiter { return &q.ws[0] }

// push appends w (LeaseSec >= MinLeaseSec) at the tail.
func (q *waitQueue) push(w Waiter) {
	q.ws = append(q.ws, w)
	q.live++
	if q.rank != nil {
		if i := q.rankIndex(len(q.ws) - 1); i < 2*len(q.ws)+rankSlack {
			q.rank.set(i, 1)
		} else {
			q.rank = nil // most of it counts the long gone: rebuilt when asked
		}
	}
	switch {
	case q.index != nil:
		q.index[w.Ref] = len(q.ws) - 1 + q.off
	case len(q.ws) >= indexFrom:
		q.reindex()
	}
}

// reindex builds the index afresh (off becomes 0).
func (q *waitQueue) reindex() {
	q.rank = nil // positions are renumbered
	if q.index == nil {
		q.index = make(map[uint64]int, len(q.ws))
	} else {
		clear(q.index)
	}
	q.off = 0
	for i := range q.ws {
		if w := &q.ws[i]; !hole(w) {
			q.index[w.Ref] = i
		}
	}
}

// find returns the index in ws of the waiter ref, or -1.
func (q *waitQueue) find(ref uint64) int {
	if q == nil {
		return -1
	}
	if q.index != nil {
		if p, ok := q.index[ref]; ok {
			return p - q.off
		}
		return -1
	}
	for i := range q.ws {
		if w := &q.ws[i]; w.Ref == ref && !hole(w) {
			return i
		}
	}
	return -1
}

// popHead removes the head; q must not be empty.
func (q *waitQueue) popHead() {
	q.removeAt(0)
}

// removeAt removes the waiter at index i of ws, keeping the others' order.
func (q *waitQueue) removeAt(i int) {
	if q.index != nil {
		delete(q.index, q.ws[i].Ref)
	}
	if q.rank != nil {
		q.rank.set(q.rankIndex(i), 0)
	}
	q.ws[i] = Waiter{} // a hole; and the GC may have the owner string
	q.live--
	if q.live == 0 {
		q.ws, q.off, q.rank = q.ws[:0], 0, nil
		if q.index != nil {
			clear(q.index)
		}
		return
	}
	// Trim the ends, so that ws[0] is the head again. Re-slicing the front
	// costs nothing; append reallocates once capacity runs out and then
	// copies only what is left, so the popped prefix is reclaimed.
	n := 0
	for hole(&q.ws[n]) {
		n++
	}
	q.ws = q.ws[n:]
	q.off += n
	end := len(q.ws)
	for hole(&q.ws[end-1]) {
		end--
	}
	q.ws = q.ws[:end]
	if q.rank != nil && q.rankIndex(0) > len(q.ws)+rankSlack {
		q.rank = nil // most of it counts the long gone: rebuilt when asked
	}
	if holes := len(q.ws) - q.live; holes > compactFrom && holes > q.live {
		q.compact()
	}
}

// compact closes the holes, keeping the order.
func (q *waitQueue) compact() {
	q.rank = nil // positions are renumbered
	live := q.ws[:0]
	for i := range q.ws {
		if !hole(&q.ws[i]) {
			live = append(live, q.ws[i])
		}
	}
	clear(q.ws[len(live):])
	q.ws = live
	if q.index != nil {
		q.reindex()
	}
}

// rankSlack lets a short queue's rank tree grow a little past twice the
// queue before it is rebuilt.
const rankSlack = 64

// rankIndex is the rank tree's index of ws[i]: its absolute position
// (i + off) counted from where the tree began.
func (q *waitQueue) rankIndex(i int) int { return i + q.off - q.rank.base }

// position is the place in line of the waiter at index i of ws: 1 for the
// head, counting only live waiters. O(log n) once the rank tree is built;
// building it is O(n), once per renumbering of the queue.
func (q *waitQueue) position(i int) int {
	if q.rank == nil {
		q.rank = &fenwick{base: q.off}
		q.rank.build(len(q.ws), func(j int) bool { return !hole(&q.ws[j]) })
	}
	return q.rank.prefix(q.rankIndex(i)) + 1
}

// fenwick is a binary indexed tree of 0/1 counts over 0..n-1 that grows
// at the end: set and prefix are O(log n).
type fenwick struct {
	// base is the absolute position (ws index + off) of element 0.
	base int
	// tree is the 1-based tree (tree[0] unused); vals the counts, so
	// that set knows the difference.
	tree []int32
	vals []bool
}

// build makes the tree of n elements, element j live(j).
func (f *fenwick) build(n int, live func(j int) bool) {
	f.tree = make([]int32, n+1)
	f.vals = make([]bool, n)
	for j := range n {
		if live(j) {
			f.vals[j] = true
			f.tree[j+1]++
		}
	}
	for k := 1; k <= n; k++ { // O(n): push each node's sum to its parent
		if p := k + k&-k; p <= n {
			f.tree[p] += f.tree[k]
		}
	}
}

// set makes element j count one (live) or zero, growing the tree when j
// is past its end (the elements between count zero).
func (f *fenwick) set(j int, live int) {
	for len(f.vals) <= j {
		f.appendZero()
	}
	if f.vals[j] == (live == 1) {
		return
	}
	f.vals[j] = live == 1
	d := int32(1)
	if live == 0 {
		d = -1
	}
	for k := j + 1; k < len(f.tree); k += k & -k {
		f.tree[k] += d
	}
}

// appendZero adds a zero element at the end: its node covers
// (k-lowbit(k), k], whose sum is the sum of the elements before it in
// that range.
func (f *fenwick) appendZero() {
	k := len(f.tree) // the new node's 1-based index
	f.vals = append(f.vals, false)
	f.tree = append(f.tree, int32(f.prefix(k-1)-f.prefix(k-k&-k)))
}

// prefix is the count of live elements 0..j-1.
func (f *fenwick) prefix(j int) int {
	n := 0
	for k := min(j, len(f.vals)); k > 0; k -= k & -k {
		n += int(f.tree[k])
	}
	return n
}

// each calls fn for every waiter, head first.
func (q *waitQueue) each(fn func(w *Waiter)) {
	if q == nil {
		return
	}
	for i := range q.ws {
		if w := &q.ws[i]; !hole(w) {
			fn(w)
		}
	}
}

// waiters is a copy of the waiters, head first (nil if none).
func (q *waitQueue) waiters() []Waiter {
	if q.len() == 0 {
		return nil
	}
	out := make([]Waiter, 0, q.live)
	q.each(func(w *Waiter) { out = append(out, *w) })
	return out
}

// clone is a private copy of q (for copy-on-write), without holes.
func (q *waitQueue) clone() *waitQueue {
	if q == nil {
		return nil
	}
	c := &waitQueue{ws: make([]Waiter, 0, q.live), live: q.live}
	q.each(func(w *Waiter) { c.ws = append(c.ws, *w) })
	if len(c.ws) >= indexFrom {
		c.reindex()
	}
	return c
}

// spareQueues bounds the emptied queues a State keeps for reuse, and
// spareQueueCap the capacity such a queue may keep: a queue of a few
// waiters that forms and drains over and over then allocates nothing,
// while a drained waiting room's memory goes back to the GC.
const (
	spareQueues   = 256
	spareQueueCap = 64
)

// newQueue returns an empty queue, recycled when one is spare.
func (s *State) newQueue() *waitQueue {
	if n := len(s.spareQ); n > 0 {
		q := s.spareQ[n-1]
		s.spareQ[n-1] = nil
		s.spareQ = s.spareQ[:n-1]
		return q
	}
	return &waitQueue{}
}

// recycleQueue keeps emptied q for reuse. q must belong to an entry this
// State owns (own clones the queue with the entry, so such a queue is
// never shared with a Frozen view).
func (s *State) recycleQueue(q *waitQueue) {
	if len(s.spareQ) >= spareQueues {
		return
	}
	if cap(q.ws) > spareQueueCap {
		q.ws = nil
	}
	clear(q.ws)
	*q = waitQueue{ws: q.ws[:0]}
	s.spareQ = append(s.spareQ, q)
}

// enqueue appends w to the queue of key (entry e, owned), which joins
// s.queued if it was empty.
func (s *State) enqueue(key string, e *entry, w Waiter) {
	if e.queue == nil {
		e.queue = s.newQueue()
		s.queued[key] = e
	}
	e.queue.push(w)
}

// dequeued finishes a removal from the queue of key (entry e, owned): an
// emptied queue is recycled and key leaves s.queued.
func (s *State) dequeued(key string, e *entry) {
	if e.queue.len() == 0 {
		s.recycleQueue(e.queue)
		e.queue = nil
		delete(s.queued, key)
	}
}
