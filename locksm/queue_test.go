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

// A waiter's place in line (waitQueue.position, State.Position) against a
// naive count of the live waiters before it, through random pushes, pops,
// removals from the middle, compactions and reindexes, with the rank tree
// built at random moments (it is built on the first question).
func TestPositionAgainstNaiveCount(t *testing.T) {
	defer func(i, c int) { indexFrom, compactFrom = i, c }(indexFrom, compactFrom)
	for seed := range 200 {
		r := rand.New(rand.NewPCG(uint64(seed), 41))
		indexFrom, compactFrom = 1+r.IntN(40), 1+r.IntN(20)
		q := &waitQueue{}
		var model []uint64 // live refs, head first
		next := uint64(1)
		for step := range 2000 {
			switch op := r.IntN(10); {
			case op < 4 || len(model) == 0:
				q.push(Waiter{Owner: "o", Ref: next, LeaseSec: 1})
				model = append(model, next)
				next++
			case op < 6:
				q.popHead()
				model = model[1:]
			case op < 8:
				k := r.IntN(len(model))
				i := q.find(model[k])
				if i < 0 {
					t.Fatalf("seed %d step %d: ref %d not found", seed, step, model[k])
				}
				q.removeAt(i)
				model = append(model[:k], model[k+1:]...)
			default:
				if len(model) == 0 {
					continue
				}
				for _, k := range []int{0, r.IntN(len(model)), len(model) - 1} {
					i := q.find(model[k])
					if got := q.position(i); got != k+1 {
						t.Fatalf("seed %d step %d: ref %d at %d of %d: position %d", seed, step, model[k], k+1, len(model), got)
					}
				}
			}
			if q.len() != len(model) {
				t.Fatalf("seed %d step %d: len %d, want %d", seed, step, q.len(), len(model))
			}
			// The tree never grows without bound: what lies before the
			// queue's head is at most the queue plus the slack, and it
			// reaches at most one past the tail.
			if q.rank != nil && (q.rankIndex(0) > len(q.ws)+rankSlack || len(q.rank.vals) > q.rankIndex(0)+len(q.ws)+2*len(q.ws)+rankSlack) {
				t.Fatalf("seed %d step %d: rank tree of %d starting %d before a queue of %d", seed, step, len(q.rank.vals), q.rankIndex(0), len(q.ws))
			}
		}
	}
}

// State.Position: the place of each waiter of a key, a block waiter's in
// each of its keys, none for the holder or an unknown ref, and places that
// move up as the line moves.
func TestStatePosition(t *testing.T) {
	s := New()
	apply := func(c Command) Result {
		t.Helper()
		res, _ := s.Apply(c, nil)
		return res
	}
	if res := apply(Command{Op: OpAcquire, Key: "k", Owner: "h", LeaseSec: 10, Now: 1}); res.Status != StatusGranted {
		t.Fatal(res)
	}
	for i := range uint64(5) {
		apply(Command{Op: OpAcquire, Key: "k", Owner: "w", Ref: 10 + i, LeaseSec: 10, WaitMs: 1000, Now: 2})
	}
	apply(Command{Op: OpAcquire, Key: "m", Owner: "h", LeaseSec: 10, Now: 1})
	apply(Command{Op: OpAcquireBlock, Keys: []string{"m", "k"}, Owner: "b", Ref: 20, LeaseSec: 10, WaitMs: 1000, Now: 3})
	for ref, want := range map[uint64]int{10: 1, 12: 3, 14: 5, 20: 6} {
		if got, ok := s.Position("k", ref); !ok || got != want {
			t.Errorf("k ref %d: %d %v, want %d", ref, got, ok, want)
		}
	}
	if got, ok := s.Position("m", 20); !ok || got != 1 {
		t.Errorf("the block on m: %d %v, want 1", got, ok)
	}
	for _, c := range []struct {
		key string
		ref uint64
	}{{"k", 0}, {"k", 99}, {"x", 10}} {
		if got, ok := s.Position(c.key, c.ref); ok {
			t.Errorf("%s ref %d: %d, want none", c.key, c.ref, got)
		}
	}
	apply(Command{Op: OpCancelWait, Key: "k", Ref: 11, Now: 4})
	apply(Command{Op: OpRelease, Key: "k", Owner: "h", Token: 1, Now: 5}) // ref 10 takes k
	for ref, want := range map[uint64]int{12: 1, 13: 2, 14: 3, 20: 4} {
		if got, ok := s.Position("k", ref); !ok || got != want {
			t.Errorf("after a cancel and a hand-off: k ref %d: %d %v, want %d", ref, got, ok, want)
		}
	}
}

// The place in line in a waiting room of 100,000 on one key, asked after
// every hand-off (the line moves up one, a newcomer joins the tail): its
// cost must not grow with the line (go test -bench Position ./locksm).
func BenchmarkPositionInWaitingRoom(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			q := &waitQueue{}
			for i := range n {
				q.push(Waiter{Owner: "o", Ref: uint64(i + 1), LeaseSec: 1})
			}
			next := uint64(n + 1)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				q.popHead()
				q.push(Waiter{Owner: "o", Ref: next, LeaseSec: 1})
				next++
				if p := q.position(q.find(next - uint64(n/2))); p != n-n/2+1 {
					b.Fatalf("position %d", p)
				}
			}
		})
	}
}
