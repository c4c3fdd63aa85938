package cluster

import (
	"testing"
	"time"
)

// A flood of refusals logs burst lines an interval; the next line let
// through says how many were left out.
func TestLogLimiter(t *testing.T) {
	l := logLimiter{burst: 3, every: time.Second}
	t0 := time.Unix(1_700_000_000, 0)
	logged := 0
	for i := range 20_000 {
		if ok, _ := l.allow(t0.Add(time.Duration(i) * time.Microsecond)); ok {
			logged++
		}
	}
	if logged != 3 {
		t.Fatalf("20,000 refusals within 20 ms logged %d lines, want 3", logged)
	}
	ok, suppressed := l.allow(t0.Add(time.Second))
	if !ok || suppressed != 19_997 {
		t.Fatalf("a second later: allowed %v, left out %d; want true and 19997", ok, suppressed)
	}
	if ok, suppressed := l.allow(t0.Add(time.Second + time.Millisecond)); !ok || suppressed != 0 {
		t.Fatalf("the next line: allowed %v, left out %d; want true and 0", ok, suppressed)
	}
}
