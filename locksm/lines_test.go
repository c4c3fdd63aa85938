package locksm

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TopLines against the naive answer: every line, sorted by length (longest
// first) then key, cut at n; on random tables of locks, blocks and
// semaphores.
func TestTopLinesAgainstNaive(t *testing.T) {
	busy := 0 // tables with more than 3 lines and a semaphore's among them
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 7))
		s := New()
		now := int64(1000)
		ref := uint64(0)
		apply := func(c Command) {
			now++
			c.Now = now
			s.Apply(c, nil)
		}
		keys := r.IntN(30) + 1
		for k := range keys {
			key := fmt.Sprintf("k%02d", k)
			if r.IntN(4) == 0 {
				apply(Command{Op: OpSetPermits, Key: key, Permits: uint32(r.IntN(3) + 1)})
			}
		}
		for range r.IntN(400) {
			key := fmt.Sprintf("k%02d", r.IntN(keys))
			ref++
			c := Command{Op: OpAcquire, Key: key, Owner: "o", LeaseSec: 10, WaitMs: 60_000, Ref: ref}
			if _, ok := s.Semaphore(key); ok {
				c.Op = OpAcquirePermit
			} else if r.IntN(10) == 0 {
				other := fmt.Sprintf("k%02d", r.IntN(keys))
				if _, sem := s.Semaphore(other); other != key && !sem {
					c = Command{Op: OpAcquireBlock, Keys: []string{key, other}, Owner: "o", LeaseSec: 10, WaitMs: 60_000, Ref: ref}
				}
			}
			apply(c)
		}
		var all []Line
		for k := range keys {
			key := fmt.Sprintf("k%02d", k)
			if n := s.QueueLen(key); n > 0 {
				_, sem := s.Semaphore(key)
				all = append(all, Line{Key: key, Waiters: n, Semaphore: sem})
			}
		}
		slices.SortFunc(all, func(a, b Line) int {
			if a.Waiters != b.Waiters {
				return b.Waiters - a.Waiters
			}
			if a.Key < b.Key {
				return -1
			}
			return 1
		})
		if len(all) > 3 && slices.ContainsFunc(all, func(l Line) bool { return l.Semaphore }) {
			busy++
		}
		for _, n := range []int{0, 1, 3, 10, 100} {
			want := all[:min(n, len(all))]
			if got := s.TopLines(n); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Fatalf("seed %d: TopLines(%d) = %v, want %v", seed, n, got, want)
			}
		}
	}
	if busy < 10 {
		t.Fatalf("only %d of 50 tables had more than 3 lines with a semaphore's: the test does not exercise TopLines", busy)
	}
}
