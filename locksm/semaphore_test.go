package locksm

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestSemaphoreSlotsAgainstNaive drives semaphores large enough to fill
// whole 64-slot words of the slot bitmap (TestModel's n of 0..3 never
// does) with random grants, releases, expiries, waiters and resizes, and
// checks every grant's slot against a plain array of held slots: the
// lowest free one, below n, never one held.
func TestSemaphoreSlotsAgainstNaive(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 41))
		s := New()
		n := uint32(1 + r.IntN(300))
		if res, _ := s.Apply(Command{Op: OpSetPermits, Key: "s", Permits: n, Now: 1}, nil); res.Status != StatusPermitsSet {
			t.Fatalf("define: %+v", res)
		}
		held := map[uint32]uint64{} // slot -> token
		tokenSlot := map[uint64]uint32{}
		ref := uint64(0)
		grant := func(token uint64, slot uint32) {
			t.Helper()
			want := uint32(0)
			for held[want] != 0 {
				want++
			}
			if slot != want || slot >= n {
				t.Fatalf("seed %d: granted slot %d, lowest free is %d (n %d)", seed, slot, want, n)
			}
			held[slot], tokenSlot[token] = token, slot
		}
		for step := range 3000 {
			var effects []Effect
			switch x := r.IntN(100); {
			case x < 45:
				ref++
				res, eff := s.Apply(Command{Op: OpAcquirePermit, Key: "s", Owner: "o", LeaseSec: 10, WaitMs: uint32(r.IntN(2)) * 1000, Ref: ref, Now: int64(step)}, nil)
				if res.Status == StatusGranted {
					grant(res.Token, res.Slot)
				}
				effects = eff
			case x < 85 && len(tokenSlot) > 0:
				var tok uint64
				for tok = range tokenSlot {
					break
				}
				op := OpRelease
				if r.IntN(3) == 0 {
					op = OpExpire
				}
				res, eff := s.Apply(Command{Op: op, Key: "s", Owner: "o", Token: tok, Now: int64(step)}, nil)
				if res.Status != StatusReleased && res.Status != StatusExpired {
					t.Fatalf("seed %d: end of %d: %+v", seed, tok, res)
				}
				delete(held, tokenSlot[tok])
				delete(tokenSlot, tok)
				effects = eff
			case x < 88:
				n = uint32(1 + r.IntN(300))
				_, effects = s.Apply(Command{Op: OpSetPermits, Key: "s", Permits: n, Now: int64(step)}, nil)
			}
			for _, e := range effects {
				if e.Kind == EffectGranted {
					grant(e.Token, e.Slot)
				}
			}
			if err := checkInvariants(s); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			if step%500 == 0 {
				s = checkSnapshotRoundTrip(t, s)
			}
		}
	}
}

// A permit alone in a high slot costs what one permit costs: the state
// and a snapshot restored from it keep no memory per empty slot, so a few
// bytes of a crafted snapshot cannot make a replica allocate a slot array.
func TestSemaphoreHighSlotIsCheap(t *testing.T) {
	s := New()
	s.Apply(Command{Op: OpSetPermits, Key: "s", Permits: MaxPermits, Now: 1}, nil)
	var last uint64
	for i := range MaxPermits {
		res, _ := s.Apply(Command{Op: OpAcquirePermit, Key: "s", Owner: "o", LeaseSec: 10, Ref: uint64(i + 1), Now: 2}, nil)
		if res.Status != StatusGranted || res.Slot != uint32(i) {
			t.Fatalf("grant %d: %+v", i, res)
		}
		last = res.Token
	}
	for tok := uint64(1); tok < last; tok++ {
		s.Apply(Command{Op: OpRelease, Key: "s", Owner: "o", Token: tok, Now: 3}, nil)
	}
	m := s.sems["s"]
	if len(m.held) != 1 || len(m.words) != 1 || len(m.full) != 0 {
		t.Fatalf("one permit left: %d held, %d words, %d full", len(m.held), len(m.words), len(m.full))
	}
	var buf bytes.Buffer
	if err := s.WriteSnapshot(&buf); err != nil {
		t.Fatal(err)
	}
	checkAllocBound(t, 64<<10+256*uint64(buf.Len()), fmt.Sprintf("reading %d bytes", buf.Len()), func() {
		if _, err := ReadSnapshot(bytes.NewReader(buf.Bytes())); err != nil {
			t.Fatal(err)
		}
	})
	if res, _ := s.Apply(Command{Op: OpAcquirePermit, Key: "s", Owner: "o", LeaseSec: 10, Ref: 1 << 40, Now: 4}, nil); res.Slot != 0 {
		t.Fatalf("after the releases: slot %d, want 0", res.Slot)
	}
}

// newSnap6 starts a version 6 snapshot without lock keys; sem appends a
// semaphore, permit one of its permits (session 0, no label), waiter6
// one of its waiters; tail6 closes the body (no blocks, renewals or
// sessions).
func newSnap6(last uint64, nsem uint64) *snapBuilder {
	sb := &snapBuilder{b: []byte(snapMagic + "\x06")}
	return sb.u(last).i(0).u(0).u(nsem)
}

func (sb *snapBuilder) sem(name string, permits, nheld uint64) *snapBuilder {
	return sb.s(name).u(permits).u(nheld)
}

func (sb *snapBuilder) permit(slot uint64, owner string, token, lease uint64) *snapBuilder {
	return sb.u(slot).s(owner).u(token).u(lease).i(0).u(0).s("")
}

func (sb *snapBuilder) waiter6(owner string, ref, lease, wait uint64) *snapBuilder {
	return sb.waiter(owner, ref, lease, wait).u(0).u(0).s("")
}

func (sb *snapBuilder) tail6() *snapBuilder { return sb.u(0).u(0).u(0) }

// sampleSnapV6 is a valid version 6 body: a semaphore with two permits
// held (slots 0 and 5) and a waiter, and an idle one.
func sampleSnapV6() *snapBuilder {
	return newSnap6(9, 2).
		sem("s", 2, 2).permit(0, "a", 3, 10).permit(5, "b", 9, 10).u(1).waiter6("w", 1, 10, 1000).
		sem("t", 1, 0).u(0).tail6()
}

// TestReadSnapshotV6Invariants: a valid version 6 snapshot restores its
// semaphores (and grants as the original would); each semaphore
// invariant broken once is refused.
func TestReadSnapshotV6Invariants(t *testing.T) {
	good := sampleSnapV6()
	s, err := ReadSnapshot(bytes.NewReader(good.done()))
	if err != nil {
		t.Fatal(err)
	}
	if got := snapshotBytes(t, s); !bytes.Equal(got, good.done()) {
		t.Fatalf("re-encoded differently:\n%x\n%x", got, good.done())
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
	// Slot 0's release hands slot 0 (the lowest free) to the waiter.
	_, eff := s.Apply(Command{Op: OpRelease, Key: "s", Owner: "a", Token: 3, Now: 5}, nil)
	if len(eff) != 1 || eff[0].Slot != 0 || eff[0].Token != 10 || eff[0].Ref != 1 {
		t.Fatalf("hand-off after restore: %+v", eff)
	}
	bad := map[string][]byte{
		"version 6 without semaphores": newSnap6(9, 0).tail6().done(),
		"permits 0":                    newSnap6(9, 1).sem("s", 0, 0).u(0).tail6().done(),
		"permits above the maximum":    newSnap6(9, 1).sem("s", MaxPermits+1, 0).u(0).tail6().done(),
		"names out of order":           newSnap6(9, 2).sem("t", 1, 0).u(0).sem("s", 1, 0).u(0).tail6().done(),
		"slots out of order":           newSnap6(9, 1).sem("s", 3, 2).permit(2, "a", 3, 10).permit(1, "b", 4, 10).u(0).tail6().done(),
		"slot twice":                   newSnap6(9, 1).sem("s", 3, 2).permit(1, "a", 3, 10).permit(1, "b", 4, 10).u(0).tail6().done(),
		"slot above the maximum":       newSnap6(9, 1).sem("s", 3, 1).permit(MaxPermits, "a", 3, 10).u(0).tail6().done(),
		"token twice in a semaphore":   newSnap6(9, 1).sem("s", 3, 2).permit(0, "a", 3, 10).permit(1, "b", 3, 10).u(0).tail6().done(),
		"token twice across":           newSnap6(9, 2).sem("s", 3, 1).permit(0, "a", 3, 10).u(0).sem("t", 3, 1).permit(0, "a", 3, 10).u(0).tail6().done(),
		"token above last":             newSnap6(9, 1).sem("s", 3, 1).permit(0, "a", 10, 10).u(0).tail6().done(),
		"token 0":                      newSnap6(9, 1).sem("s", 3, 1).permit(0, "a", 0, 10).u(0).tail6().done(),
		"lease 0":                      newSnap6(9, 1).sem("s", 3, 1).permit(0, "a", 3, 0).u(0).tail6().done(),
		"waiter with a free permit":    newSnap6(9, 1).sem("s", 2, 1).permit(0, "a", 3, 10).u(1).waiter6("w", 1, 10, 1000).tail6().done(),
		"waiter ref twice": newSnap6(9, 1).sem("s", 1, 1).permit(0, "a", 3, 10).u(2).
			waiter6("w", 1, 10, 1000).waiter6("v", 1, 10, 1000).tail6().done(),
		"waiter wait 0": newSnap6(9, 1).sem("s", 1, 1).permit(0, "a", 3, 10).u(1).waiter6("w", 1, 10, 0).tail6().done(),
		"block waiter": newSnap6(9, 1).sem("s", 1, 1).permit(0, "a", 3, 10).u(1).
			waiter("w", 1, 10, 1000).u(2).s("s").s("x").u(0).s("").tail6().done(),
		"also a lock key": (&snapBuilder{b: []byte(snapMagic + "\x06")}).u(9).i(0).u(1).
			s("s").u(4).s("o").u(10).i(0).u(0).s("").u(0).
			u(1).sem("s", 1, 0).u(0).tail6().done(),
	}
	for name, b := range bad {
		_, err := ReadSnapshot(bytes.NewReader(b))
		t.Logf("%s: %v", name, err)
		if !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v, want ErrCorruptSnapshot", name, err)
		}
	}
}

// fullSemaphore is a state with semaphore "s" of n permits, all held, and
// waiters queued behind them; it returns the tokens by slot.
func fullSemaphore(b testing.TB, n, waiters int) (*State, []uint64) {
	s := New()
	s.Apply(Command{Op: OpSetPermits, Key: "s", Permits: uint32(n)}, nil)
	owners := benchKeys(16)
	tokens := make([]uint64, n)
	for i := range n {
		res, _ := s.Apply(Command{Op: OpAcquirePermit, Key: "s", Owner: owners[i%16], LeaseSec: 30, Ref: uint64(i + 1)}, nil)
		if res.Status != StatusGranted {
			b.Fatal(res)
		}
		tokens[res.Slot] = res.Token
	}
	for i := range waiters {
		res, _ := s.Apply(Command{Op: OpAcquirePermit, Key: "s", Owner: owners[i%16], LeaseSec: 30, WaitMs: 1000, Ref: uint64(n + i + 1)}, nil)
		if res.Status != StatusQueued {
			b.Fatal(res)
		}
	}
	return s, tokens
}

// BenchmarkApplyPermitHandoff: a release of one permit of a semaphore of
// n, all held, hands the freed slot to the queue's head (and a new waiter
// joins the tail), as BenchmarkApplyHandoff does for a lock.
func BenchmarkApplyPermitHandoff(b *testing.B) {
	for _, n := range []int{1, 1000, MaxPermits} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			s, tokens := fullSemaphore(b, n, 8)
			owners := benchKeys(16)
			r := rand.New(rand.NewPCG(1, 2))
			ref := uint64(1 << 40)
			var eff []Effect
			b.ReportAllocs()
			for b.Loop() {
				ref++
				s.Apply(Command{Op: OpAcquirePermit, Key: "s", Owner: owners[ref%16], LeaseSec: 30, WaitMs: 1000, Ref: ref}, eff[:0])
				slot := r.IntN(n)
				h := s.sems["s"].held[uint32(slot)]
				_, eff = s.Apply(Command{Op: OpRelease, Key: "s", Owner: h.owner, Token: tokens[slot]}, eff[:0])
				if len(eff) != 1 || eff[0].Slot != uint32(slot) {
					b.Fatal(eff)
				}
				tokens[slot] = eff[0].Token
			}
		})
	}
}

// BenchmarkSemaphoreMemory reports the heap a semaphore of MaxPermits
// permits, all held, costs per permit (the map of held slots, the token
// index and the slot bitmap), and a snapshot's bytes per permit.
func BenchmarkSemaphoreMemory(b *testing.B) {
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s, _ := fullSemaphore(b, MaxPermits, 0)
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/MaxPermits, "heap-B/permit")
		var buf bytes.Buffer
		if err := s.WriteSnapshot(&buf); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(buf.Len())/MaxPermits, "snapshot-B/permit")
		runtime.KeepAlive(s)
	}
}
