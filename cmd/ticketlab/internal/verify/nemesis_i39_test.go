package verify

import (
	"testing"
	"time"
)

// The hostile fault's bound on the paused holding's end: a holding seen
// free only past expiryBound after the leader's account is overdue, as
// one never seen free while the flood ran (finding 7 on 3bb9d25: held
// until the flood stopped, 4 s past its end); one that ended a few
// hundred milliseconds late, as the inspect polling sees it, is not.
func TestExpiryOverdue(t *testing.T) {
	end := time.Unix(1000, 0)
	for _, tc := range []struct {
		freed time.Duration // after end; -1: never seen free
		want  bool
	}{
		{0, false},
		{150 * time.Millisecond, false},
		{expiryBound, false},
		{expiryBound + time.Millisecond, true},
		{expiryBound + 900*time.Millisecond, true},
		{-1, true},
	} {
		var freedAt time.Time
		if tc.freed >= 0 {
			freedAt = end.Add(tc.freed)
		}
		if got := expiryOverdue(end, freedAt); got != tc.want {
			t.Errorf("freed %v after the leader's account: overdue %v, want %v", tc.freed, got, tc.want)
		}
	}
}
