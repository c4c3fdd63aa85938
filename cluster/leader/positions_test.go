package leader

import (
	"testing"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// A hot key hands off several times per millisecond, and the commands'
// stamps are whole milliseconds: the intervals are mostly 0 and now and
// then 1. Their mean (a third of a millisecond here) must still make an
// estimate. Kept in whole milliseconds, the mean never left 0 (an eighth
// of a 1 ms step rounds to nothing), so every waiter of a fast line was
// told 0 s, however long its line.
func TestEstimateOfASubMillisecondPace(t *testing.T) {
	k := New[int](defaultConfig(Config{PositionInterval: time.Second}), stateTable{s: locksm.New()}, &directory{})
	stamp := int64(1_700_000_000_000)
	for i := range 3000 {
		if i%3 == 0 {
			stamp++
		}
		k.handoff("hot", stamp)
	}
	// 3,000 places at a third of a millisecond each: about a second.
	got := k.estimate("hot", 3000)
	if got < 900 || got > 1100 {
		t.Fatalf("estimate for place 3000 at 3 hand-offs per ms: %d ms, want about 1000", got)
	}
	if got := k.estimate("hot", 1); got != 0 {
		t.Errorf("estimate for place 1: %d ms, want 0 (a third of a millisecond)", got)
	}
}

// A fast line moves in bursts: the leader hands the key on as fast as
// the holders release, then does other work (walks the lines, a
// snapshot). Here 1,000 hand-offs in 100 ms, then 800 ms with none, then
// again: a thousand a second, so place 10,000 waits about 10 s. A mean
// over the last dozen intervals saw only the bursts (0.1 ms per hand-off)
// and promised 1 s.
func TestEstimateFollowsABurstyLine(t *testing.T) {
	k := New[int](defaultConfig(Config{PositionInterval: time.Second}), stateTable{s: locksm.New()}, &directory{})
	base := int64(1_700_000_000_000)
	for burst := range 10 {
		for i := range 1000 {
			k.handoff("hot", base+int64(burst)*1000+int64(i/10))
		}
		// Between bursts the line's estimate is asked for, as a walk does.
		if burst >= 2 {
			if got := k.estimate("hot", 10_000); got < 8000 || got > 12000 {
				t.Fatalf("after %d bursts of 1,000 hand-offs a second: estimate for place 10,000 is %d ms, want about 10,000", burst+1, got)
			}
		}
	}
}

// Two hand-offs make the first estimate, as before a whole sample of the
// line's pace was taken; one does not.
func TestEstimateFromTheFirstHandoffs(t *testing.T) {
	k := New[int](defaultConfig(Config{PositionInterval: time.Second}), stateTable{s: locksm.New()}, &directory{})
	k.handoff("k", 5000)
	if got := k.estimate("k", 3); got != wire.EstimateUnknown {
		t.Fatalf("estimate after one hand-off: %d, want unknown", got)
	}
	k.handoff("k", 5200)
	if got := k.estimate("k", 3); got != 600 {
		t.Fatalf("estimate for place 3 after hand-offs 200 ms apart: %d, want 600", got)
	}
	// A leader whose clock is behind the last stamp starts a new sample:
	// the estimate is unknown until its next hand-off, never negative.
	k.handoff("k", 4000)
	k.handoff("k", 4300)
	if got := k.estimate("k", 2); got != 600 {
		t.Fatalf("estimate for place 2 after a clock step back and hand-offs 300 ms apart: %d, want 600", got)
	}
}

// A leader whose clock jumped years ahead stamps one enormous interval:
// the estimate saturates at its maximum, it does not wrap around to a
// small one.
func TestEstimateOfAClockJumpSaturates(t *testing.T) {
	k := New[int](defaultConfig(Config{PositionInterval: time.Second}), stateTable{s: locksm.New()}, &directory{})
	k.handoff("k", 1_700_000_000_000)
	k.handoff("k", 1_700_000_000_000+1<<50)
	for _, pos := range []int{1, 2, 100_000, 1 << 30} {
		if got := k.estimate("k", pos); got != wire.MaxEstimateMs {
			t.Errorf("estimate for place %d after a jump of 2^50 ms: %d, want the maximum %d", pos, got, wire.MaxEstimateMs)
		}
	}
	// And an ordinary pace afterwards is followed again.
	k2 := New[int](defaultConfig(Config{PositionInterval: time.Second}), stateTable{s: locksm.New()}, &directory{})
	k2.handoff("k", 1000)
	k2.handoff("k", 3000)
	if got := k2.estimate("k", 3); got != 6000 {
		t.Errorf("estimate for place 3 at 2000 ms per hand-off: %d, want 6000", got)
	}
}

// A new leader does not count the election before it as a hand-off
// interval: its first sample of a key's pace starts at its own first
// hand-off, and the mean of before stands until then.
func TestEstimateSkipsTheElection(t *testing.T) {
	k := New[int](defaultConfig(Config{PositionInterval: time.Second}), stateTable{s: locksm.New()}, &directory{})
	base := int64(1_700_000_000_000)
	for i := range 3000 { // 5 ms a hand-off for 15 s
		k.handoff("hot", base+int64(i)*5)
	}
	before := k.estimate("hot", 1000)
	if before < 4500 || before > 5500 {
		t.Fatalf("estimate for place 1000 at 5 ms a hand-off: %d ms", before)
	}
	// The leader dies; 1.6 s later this core leads and serves.
	k.GainLeadership(1)
	_, epoch := k.Leading()
	now := time.Now()
	if _, ok := k.Serve(now, now.UnixMilli(), epoch); !ok {
		t.Fatal("Serve refused")
	}
	resume := base + 3000*5 + 1600
	for i := range 400 { // 5 ms a hand-off again, for 2 s
		k.handoff("hot", resume+int64(i)*5)
	}
	if after := k.estimate("hot", 1000); after < 4500 || after > 5500 {
		t.Fatalf("estimate for place 1000 at 5 ms a hand-off, after an election of 1.6 s: %d ms, want about %d (the election is no hand-off interval)", after, before)
	}
}

// A raise of a semaphore's n grants several waiters in one command, under
// one stamp: until time passed between two hand-offs the pace is unknown,
// never 0 ms (the attack round of issue 41 saw waiters behind 250 s
// leases promised 0 s).
func TestEstimateUnknownFromOneCommandsHandoffs(t *testing.T) {
	k := New[int](defaultConfig(Config{PositionInterval: time.Second}), stateTable{s: locksm.New()}, &directory{})
	for range 3 {
		k.handoff("s", 5000)
	}
	if got := k.estimate("s", 2); got != wire.EstimateUnknown {
		t.Fatalf("estimate after 3 hand-offs of one stamp: %d ms, want unknown", got)
	}
	k.handoff("s", 65000)
	if got := k.estimate("s", 2); got != 40000 {
		t.Fatalf("estimate for place 2 after 3 hand-offs at 5 s and one at 65 s: %d ms, want 40,000 (60 s for 3)", got)
	}
}

// A key whose line empties for a moment between hand-offs (one holder and
// one waiter taking turns) keeps its pace while it is held, and loses it
// once free: the console's hand-off rate of such a key was always unknown.
func TestPaceOutlivesAnEmptyLineWhileHeld(t *testing.T) {
	st := locksm.New()
	k := New[int](defaultConfig(Config{PositionInterval: time.Second}), stateTable{s: st}, &directory{})
	now, ref := int64(1_700_000_000_000), uint64(0)
	apply := func(c locksm.Command) {
		now += 20
		c.Now = now
		res, eff := st.Apply(c, nil)
		k.notePace(&Applied{Cmd: c, Res: res, Effects: eff})
	}
	acquire := func(owner string) {
		ref++
		apply(locksm.Command{Op: locksm.OpAcquire, Key: "k", Owner: owner, LeaseSec: 10, WaitMs: 60_000, Ref: ref})
	}
	acquire("a")
	for i := range 200 { // a and b take turns: a hand-off every 40 ms
		next := []string{"b", "a"}[i%2]
		acquire(next)
		h, _ := st.Holder("k")
		apply(locksm.Command{Op: locksm.OpRelease, Key: "k", Owner: h.Owner, Token: h.Token})
	}
	if r, ok := k.HandoffsPerSec("k"); !ok || r < 20 || r > 30 {
		t.Fatalf("hand-offs per second of a key handed on every 40 ms: %v %v, want about 25", r, ok)
	}
	h, _ := st.Holder("k")
	apply(locksm.Command{Op: locksm.OpRelease, Key: "k", Owner: h.Owner, Token: h.Token})
	if _, ok := k.rates["k"]; ok {
		t.Fatal("the pace of a free key is kept")
	}
}
