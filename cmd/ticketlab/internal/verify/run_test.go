package verify

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestExpectedStop(t *testing.T) {
	for _, tc := range []struct {
		lost   []string
		voters int
		stop   bool
	}{
		{nil, 3, false},
		{[]string{"n1/a"}, 3, false},
		{[]string{"n1/a", "n2/b"}, 3, true},
		{[]string{"n1/a", "n2/b"}, 5, false},
		{[]string{"n1/a", "n2/b", "n3/c"}, 5, true},
	} {
		why := expectedStop(tc.lost, tc.voters)
		if (why != "") != tc.stop {
			t.Errorf("%d of %d voters lost: expected stop %q, want %v", len(tc.lost), tc.voters, why, tc.stop)
		}
		for _, id := range tc.lost {
			if tc.stop && !strings.Contains(why, id) {
				t.Errorf("the reason %q does not name %s", why, id)
			}
		}
	}
}

// A run with no grant after a heal reports that in words, never as a
// negative duration (the 5-node --wipe run of issue 15 printed -1ns).
func TestSummaryWithoutGrantsAfterAHeal(t *testing.T) {
	r := Result{
		Config:          Config{Seed: 1, Nodes: 5, RecoveryBound: 5 * time.Second},
		Recovery:        NoGrant,
		FaultRecoveries: []time.Duration{300 * time.Millisecond, NoGrant},
		Lost:            []string{"n2/abcdefghij"},
	}
	s := r.Summary()
	if negative := regexp.MustCompile(`(^|[^\w])-[0-9.]+(ns|µs|ms|s|m|h)\b`); negative.MatchString(s) {
		t.Fatalf("summary shows a negative duration:\n%s", s)
	}
	for _, want := range []string{"no grant after the final heal", "1 faults with no grant after them", "never replaced: n2/abcdefghij"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	r.ExpectedStop = expectedStop([]string{"n1/a", "n2/b", "n3/c"}, 5)
	if s := r.Summary(); !strings.Contains(s, "expected stop: 3 of 5 voters lost their state at once") {
		t.Errorf("summary lacks the expected stop:\n%s", s)
	}
}

// An inconclusive run fails (Passed) and says why, though nothing was
// violated; the summary gives the indeterminate share and its bound.
func TestSummaryOfAnInconclusiveRun(t *testing.T) {
	r := Result{
		Config: Config{Seed: 1, Nodes: 3, MaxIndeterminateShare: DefaultMaxIndeterminateShare},
		Check:  CheckReport{Acquires: 200, Indeterminate: 50, IndeterminateShare: 0.25},
	}
	if !r.Passed() {
		t.Fatal("a run with no violation and nothing inconclusive did not pass")
	}
	if s := r.Summary(); !strings.Contains(s, "indeterminate share: 25.0 % (50 of 200 acquires; bound 20.0 %)") || !strings.Contains(s, "verdict: pass") {
		t.Errorf("summary lacks the share or the verdict:\n%s", s)
	}
	r.Inconclusive = []string{"linearizability Unknown: porcupine's search did not finish"}
	if r.Passed() {
		t.Fatal("an inconclusive run passed")
	}
	s := r.Summary()
	for _, want := range []string{"inconclusive: 1\n  linearizability Unknown", "verdict: FAIL (inconclusive"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	r.Config.MaxIndeterminateShare = -1
	if s := r.Summary(); !strings.Contains(s, "bound none") || !strings.Contains(s, "--max-indeterminate-share 0") {
		t.Errorf("an unbounded run's summary lacks the bound or its replay flag:\n%s", s)
	}
}
