package locksm

// RangeWaiters calls fn for every waiter still queued on key, head first,
// until fn returns false: the leader's walk of a line (issue 41, places
// in line), where a running count is each waiter's exact place, so the
// walk needs neither the rank tree nor a copy of the queue (Waiters would
// allocate the whole line once per walk). Unlike Position it is a pure
// read: it keeps no cache, so it may run beside other readers under the
// same lock. fn must not change s and must not keep w past its call (the
// queue reuses its storage).
func (s *State) RangeWaiters(key string, fn func(w *Waiter) bool) {
	q := s.queueOf(key) // a lock's queue or a semaphore's
	if q == nil {
		return
	}
	ws := q.ws
	for i := range ws {
		if w := &ws[i]; !hole(w) && !fn(w) {
			return
		}
	}
}
