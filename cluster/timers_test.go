package cluster

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestTimerHeapOrder checks the hand-written heap against a sort: any mix
// of pushes and pops yields the earliest item each time.
func TestTimerHeapOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	base := time.Now()
	for round := 0; round < 200; round++ {
		var h timerHeap
		var model []time.Duration
		for step := 0; step < 200; step++ {
			if len(model) == 0 || r.IntN(3) > 0 {
				d := time.Duration(r.IntN(50)) * time.Millisecond // ties included
				h.push(timerItem{At: base.Add(d), Key: "k"})
				model = append(model, d)
				continue
			}
			slices.Sort(model)
			got := h.pop()
			if want := base.Add(model[0]); !got.At.Equal(want) {
				t.Fatalf("round %d step %d: popped %v, want %v", round, step, got.At.Sub(base), model[0])
			}
			model = model[1:]
			if len(h) != len(model) {
				t.Fatalf("heap has %d items, want %d", len(h), len(model))
			}
		}
	}
}

// TestTimerQueueFiresInOrder runs the queue's goroutine on real timers.
func TestTimerQueueFiresInOrder(t *testing.T) {
	fired := make(chan string, 3)
	q := newTimerQueue(func(it timerItem) { fired <- it.Key })
	defer q.close()
	now := time.Now()
	q.add(timerItem{At: now.Add(60 * time.Millisecond), Key: "c"})
	q.add(timerItem{At: now.Add(20 * time.Millisecond), Key: "a"})
	q.add(timerItem{At: now.Add(40 * time.Millisecond), Key: "b"})
	for _, want := range []string{"a", "b", "c"} {
		select {
		case got := <-fired:
			if got != want {
				t.Fatalf("fired %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q never fired", want)
		}
	}
}
