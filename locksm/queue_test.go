package locksm

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// check verifies q's structure: its ends are live, live counts the
// waiters, and the index (if any) names every waiter at its position.
func (q *waitQueue) check() error {
	if q == nil {
		return nil
	}
	if q.live == 0 {
		return fmt.Errorf("an empty queue is kept (%d slots)", len(q.ws))
	}
	if hole(&q.ws[0]) || hole(&q.ws[len(q.ws)-1]) {
		return fmt.Errorf("a hole at an end of %d slots", len(q.ws))
	}
	live := 0
	for i := range q.ws {
		w := &q.ws[i]
		if hole(w) {
			if w.Owner != "" || w.Ref != 0 || w.WaitMs != 0 || w.EnqueuedAt != 0 || w.Keys != nil {
				return fmt.Errorf("slot %d: a hole that is not a zero waiter: %+v", i, *w)
			}
			continue
		}
		live++
		if q.index != nil {
			if p, ok := q.index[w.Ref]; !ok || p-q.off != i {
				return fmt.Errorf("ref %d at slot %d: index says %d (ok %v, off %d)", w.Ref, i, p-q.off, ok, q.off)
			}
		}
	}
	if live != q.live {
		return fmt.Errorf("live %d, counted %d", q.live, live)
	}
	if q.index != nil && len(q.index) != live {
		return fmt.Errorf("index has %d refs for %d waiters", len(q.index), live)
	}
	if holes := len(q.ws) - live; holes > compactFrom && holes > live {
		return fmt.Errorf("%d holes for %d waiters were not compacted", holes, live)
	}
	return nil
}

// withThresholds runs fn with the queue index and compaction thresholds
// set, restoring them after.
func withThresholds(t *testing.T, index, compact int) {
	t.Helper()
	oldIndex, oldCompact := indexFrom, compactFrom
	indexFrom, compactFrom = index, compact
	t.Cleanup(func() { indexFrom, compactFrom = oldIndex, oldCompact })
}

// TestWaitQueueAgainstSlice drives a waitQueue and a naive slice with the
// same random pushes, pops and removals by ref (from anywhere), at
// thresholds that make the index, the trims and the compaction all run
// often, and compares them after every step.
func TestWaitQueueAgainstSlice(t *testing.T) {
	for _, th := range []struct{ index, compact int }{{1000, 1000}, {2, 0}, {4, 2}, {32, 16}} {
		t.Run(fmt.Sprintf("index%d_compact%d", th.index, th.compact), func(t *testing.T) {
			withThresholds(t, th.index, th.compact)
			s := New()
			for seed := range uint64(50) {
				r := rand.New(rand.NewPCG(seed, 7))
				var q *waitQueue
				var naive []Waiter
				ref := uint64(0)
				for step := range 2000 {
					switch x := r.IntN(10); {
					case x < 4 || len(naive) == 0:
						ref++
						w := Waiter{Owner: "o", Ref: ref, LeaseSec: 1 + uint32(r.IntN(250)), WaitMs: 1}
						if q == nil {
							q = s.newQueue()
						}
						q.push(w)
						naive = append(naive, w)
					case x < 6:
						q.popHead()
						naive = naive[1:]
					default:
						i := r.IntN(len(naive))
						if r.IntN(4) == 0 {
							i = len(naive) - 1
						}
						gone := naive[i].Ref
						if j := q.find(gone); j < 0 || q.ws[j].Ref != gone {
							t.Fatalf("seed %d step %d: find(%d) = %d", seed, step, gone, j)
						}
						q.removeAt(q.find(gone))
						naive = slices.Delete(naive, i, i+1)
						if q.find(gone) >= 0 {
							t.Fatalf("seed %d step %d: removed ref %d still found", seed, step, gone)
						}
					}
					if q.len() != len(naive) {
						t.Fatalf("seed %d step %d: len %d, want %d", seed, step, q.len(), len(naive))
					}
					if len(naive) == 0 {
						if len(q.ws) != 0 {
							t.Fatalf("seed %d step %d: empty queue keeps %d slots", seed, step, len(q.ws))
						}
						s.recycleQueue(q)
						q = nil
						continue
					}
					if err := q.check(); err != nil {
						t.Fatalf("seed %d step %d: %v", seed, step, err)
					}
					if got := q.waiters(); !slices.EqualFunc(got, naive, sameWaiter) {
						t.Fatalf("seed %d step %d: queue %v, want %v", seed, step, got, naive)
					}
					if !sameWaiter(*q.head(), naive[0]) {
						t.Fatalf("seed %d step %d: head %v, want %v", seed, step, *q.head(), naive[0])
					}
					if c := q.clone(); !slices.EqualFunc(c.waiters(), naive, sameWaiter) || c.check() != nil {
						t.Fatalf("seed %d step %d: clone %v (%v)", seed, step, c.waiters(), c.check())
					}
				}
			}
		})
	}
}

// TestModelWithIndexedQueues is TestModel with every queue indexed and
// compacted from its first hole, so the model and the property checker
// judge those paths too (TestModel's queues are short).
func TestModelWithIndexedQueues(t *testing.T) {
	withThresholds(t, 2, 0)
	seeds := 100
	if testing.Short() {
		seeds = 10
	}
	var cov modelCoverage
	for seed := range uint64(seeds) {
		if err := runModel(t, seed, 400, &cov); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

// BenchmarkCancelWaiters: one op is a waiting room of n on one key
// cancelled in random order (connections closing, waits running out), as
// a leader's replicas apply it. Before waitQueue: n=30000 took 0.7 s.
func BenchmarkCancelWaiters(b *testing.B) {
	for _, n := range []int{1000, 30000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			perm := rand.New(rand.NewPCG(1, 2)).Perm(n)
			var eff []Effect
			for b.Loop() {
				b.StopTimer()
				s := New()
				s.Apply(Command{Op: OpAcquire, Key: "hot", Owner: "h", LeaseSec: 250, Now: 1}, nil)
				for i := 1; i <= n; i++ {
					_, eff = s.Apply(Command{Op: OpAcquire, Key: "hot", Owner: "w", Ref: uint64(i), LeaseSec: 250, WaitMs: 300000, Now: 1}, eff[:0])
				}
				b.StartTimer()
				for _, i := range perm {
					_, eff = s.Apply(Command{Op: OpCancelWait, Key: "hot", Ref: uint64(i + 1), Now: 2}, eff[:0])
				}
				if s.NumWaiting() != 0 {
					b.Fatal(s.NumWaiting())
				}
			}
		})
	}
}
