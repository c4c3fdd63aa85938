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
	// 3,000 places at a third of a millisecond each: about a second (an
	// exponentially weighted mean sways with the intervals' pattern: two
	// 0 ms intervals after a 1 ms one leave it at about 0.29 ms).
	got := k.estimate("hot", 3000)
	if got < 750 || got > 1250 {
		t.Fatalf("estimate for place 3000 at 3 hand-offs per ms: %d ms, want about 1000", got)
	}
	if got := k.estimate("hot", 1); got != 0 {
		t.Errorf("estimate for place 1: %d ms, want 0 (a third of a millisecond)", got)
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
