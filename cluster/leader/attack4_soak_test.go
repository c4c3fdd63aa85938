package leader

import (
	"os"
	"strconv"
	"testing"
)

// TestAttack4MultiLeaderSoak runs the multi-leader model on seeds the CI
// never runs (ATTACK4_FIRST, ATTACK4_SEEDS; skipped without them).
func TestAttack4MultiLeaderSoak(t *testing.T) {
	first, err1 := strconv.Atoi(os.Getenv("ATTACK4_FIRST"))
	n, err2 := strconv.Atoi(os.Getenv("ATTACK4_SEEDS"))
	if err1 != nil || err2 != nil {
		t.Skip("ATTACK4_FIRST and ATTACK4_SEEDS not set")
	}
	steps := 400
	if v, err := strconv.Atoi(os.Getenv("ATTACK4_STEPS")); err == nil {
		steps = v
	}
	var cov mlCoverage
	for seed := first; seed < first+n; seed++ {
		s := newMLSim(uint64(seed), &cov)
		s.reorder = os.Getenv("ATTACK4_REORDER") != ""
		if err := s.run(steps); err != nil {
			t.Fatalf("seed %d: %v\nlast steps:\n%s", seed, err, s.tail())
		}
	}
	t.Logf("coverage: %+v", cov)
}
