package locksm

import (
	"math/rand/v2"
	"testing"
)

// RangeWaiters walks a line head first, and the running count it allows is
// the place Position answers, through random joins, cancels and
// hand-offs (holes, compaction and the ref index included: queues of up
// to 200 cross indexFrom and compactFrom).
func TestRangeWaitersCountIsPosition(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 2))
	s := New()
	apply := func(c Command) Result {
		t.Helper()
		res, _ := s.Apply(c, nil)
		return res
	}
	if res := apply(Command{Op: OpAcquire, Key: "k", Owner: "h", LeaseSec: 10, Now: 1}); res.Status != StatusGranted {
		t.Fatal(res)
	}
	token := uint64(1)
	var queued []uint64
	next := uint64(1)
	for step := range 3000 {
		switch r := rng.IntN(10); {
		case r < 5 && len(queued) < 200:
			apply(Command{Op: OpAcquire, Key: "k", Owner: "w", Ref: next, LeaseSec: 10, WaitMs: 1000, Now: int64(step)})
			queued = append(queued, next)
			next++
		case r < 8 && len(queued) > 0:
			i := rng.IntN(len(queued))
			apply(Command{Op: OpCancelWait, Key: "k", Ref: queued[i], Now: int64(step)})
			queued = append(queued[:i], queued[i+1:]...)
		default:
			res := apply(Command{Op: OpRelease, Key: "k", Owner: ownerOf(s, "k"), Token: token, Now: int64(step)})
			if res.Status != StatusReleased {
				t.Fatalf("step %d: release: %+v", step, res)
			}
			if len(queued) == 0 {
				apply(Command{Op: OpAcquire, Key: "k", Owner: "h", LeaseSec: 10, Now: int64(step)})
			} else {
				queued = queued[1:]
			}
			h, _ := s.Holder("k")
			token = h.Token
		}
		pos := 0
		s.RangeWaiters("k", func(w *Waiter) bool {
			pos++
			if pos > len(queued) || w.Ref != queued[pos-1] {
				t.Fatalf("step %d: place %d is ref %d, want the %d-long line %v", step, pos, w.Ref, len(queued), queued)
			}
			if p, ok := s.Position("k", w.Ref); !ok || p != pos {
				t.Fatalf("step %d: ref %d walked at %d, Position %d %v", step, w.Ref, pos, p, ok)
			}
			return true
		})
		if pos != len(queued) {
			t.Fatalf("step %d: walked %d of %d", step, pos, len(queued))
		}
	}
	n := 0
	s.RangeWaiters("k", func(*Waiter) bool { n++; return false })
	if len(queued) > 0 && n != 1 {
		t.Fatalf("a walk told to stop went on: %d", n)
	}
	s.RangeWaiters("none", func(*Waiter) bool { t.Fatal("a waiter on a free key"); return false })
}

func ownerOf(s *State, key string) string {
	h, _ := s.Holder(key)
	return h.Owner
}

// The walk of a line of 100,000, as the leader does it under the node's
// fsm lock (copying out the refs): what apply waits for, per walk
// (go test -bench RangeWaiters -run XXX ./locksm).
func BenchmarkRangeWaiters(b *testing.B) {
	s := New()
	s.Apply(Command{Op: OpAcquire, Key: "k", Owner: "h", LeaseSec: 10, Now: 1}, nil)
	const n = 100_000
	for i := range uint64(n) {
		s.Apply(Command{Op: OpAcquire, Key: "k", Owner: "w", Ref: i + 1, LeaseSec: 10, WaitMs: 1000, Now: 2}, nil)
	}
	refs := make([]uint64, 0, n)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		refs = refs[:0]
		s.RangeWaiters("k", func(w *Waiter) bool {
			refs = append(refs, w.Ref)
			return true
		})
		if len(refs) != n {
			b.Fatalf("%d refs", len(refs))
		}
	}
}
