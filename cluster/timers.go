package cluster

import (
	"sync"
	"time"

	"ticketing/cluster/leader"
)

// timerItem is one timer the leader core asked for. At is a monotonic
// reading (time.Now on this node): wall-clock jumps do not move it.
type timerItem = leader.Timer

// timerHeap is a binary min-heap on at. It is typed rather than built on
// container/heap, whose Push(any) boxes every item: one allocation per
// grant on the leader.
type timerHeap []timerItem

func (h *timerHeap) push(it timerItem) {
	*h = append(*h, it)
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if !s[i].At.Before(s[parent].At) {
			break
		}
		s[i], s[parent] = s[parent], s[i]
		i = parent
	}
}

func (h *timerHeap) pop() timerItem {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s[last] = timerItem{} // drop the key string with the slot
	s = s[:last]
	for i := 0; ; {
		smallest, l, r := i, 2*i+1, 2*i+2
		if l < len(s) && s[l].At.Before(s[smallest].At) {
			smallest = l
		}
		if r < len(s) && s[r].At.Before(s[smallest].At) {
			smallest = r
		}
		if smallest == i {
			break
		}
		s[i], s[smallest] = s[smallest], s[i]
		i = smallest
	}
	*h = s
	return top
}

// timerQueue runs the leader's lease and wait timers on one goroutine with a
// heap, instead of one runtime timer per lock: a million held keys cost a
// million small heap items, not a million timers. Items are never cancelled;
// a due item whose lock or waiter has moved on is dropped by the core, and
// the state machine ignores a stale expiry or cancel anyway.
type timerQueue struct {
	fire func(timerItem)

	mu    sync.Mutex
	items timerHeap
	wake  chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

func newTimerQueue(fire func(timerItem)) *timerQueue {
	q := &timerQueue{fire: fire, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go q.run()
	return q
}

func (q *timerQueue) add(it timerItem) {
	q.mu.Lock()
	q.items.push(it)
	first := q.items[0].At.Equal(it.At)
	q.mu.Unlock()
	if first {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// clear drops every item (leadership lost).
func (q *timerQueue) clear() {
	q.mu.Lock()
	q.items = nil
	q.mu.Unlock()
}

func (q *timerQueue) close() {
	close(q.stop)
	<-q.done
}

func (q *timerQueue) run() {
	defer close(q.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var due []timerItem
	for {
		q.mu.Lock()
		now := time.Now()
		due = due[:0]
		for len(q.items) > 0 && !q.items[0].At.After(now) {
			due = append(due, q.items.pop())
		}
		wait := time.Hour
		if len(q.items) > 0 {
			wait = q.items[0].At.Sub(now)
		}
		q.mu.Unlock()
		for _, it := range due {
			q.fire(it)
		}
		t.Reset(wait)
		select {
		case <-t.C:
		case <-q.wake:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		case <-q.stop:
			return
		}
	}
}

// expiryOf returns the earliest lease timer armed in epoch for the holding
// (key, token). It scans the whole heap (O(timers), one comparison of a
// token per item): meant for inspecting one key, not for a hot path.
func (q *timerQueue) expiryOf(key string, token, epoch uint64) (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var at time.Time
	found := false
	for i := range q.items {
		it := &q.items[i]
		if it.Token != token || it.Kind != leader.TimerExpire || it.Epoch != epoch || it.Key != key {
			continue
		}
		if !found || it.At.Before(at) {
			at, found = it.At, true
		}
	}
	return at, found
}
