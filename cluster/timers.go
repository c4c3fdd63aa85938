package cluster

import (
	"container/heap"
	"sync"
	"time"
)

// timerKind says what a due timer asks the leader to propose.
type timerKind uint8

const (
	timerExpire timerKind = iota + 1 // propose OpExpire(key, token)
	timerWait                        // propose OpCancelWait(key, ref)
)

type timerItem struct {
	at    time.Time // monotonic reading: wall-clock jumps do not move it
	kind  timerKind
	key   string
	token uint64 // timerExpire
	ref   uint64 // timerWait
	epoch uint64 // leadership epoch that armed it
}

type timerHeap []timerItem

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerItem)) }
func (h *timerHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// timerQueue runs the leader's lease and wait timers on one goroutine with a
// heap, instead of one runtime timer per lock: a million held keys cost a
// million small heap items, not a million timers. Items are never cancelled;
// a due item whose lock or waiter has moved on is dropped by fire, and the
// state machine ignores a stale expiry or cancel anyway.
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
	heap.Push(&q.items, it)
	first := q.items[0].at.Equal(it.at)
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
		for len(q.items) > 0 && !q.items[0].at.After(now) {
			due = append(due, heap.Pop(&q.items).(timerItem))
		}
		wait := time.Hour
		if len(q.items) > 0 {
			wait = q.items[0].at.Sub(now)
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
