//go:build race

package leader

// raceEnabled: the race detector adds allocations of its own, so
// allocation-count tests are skipped under it (make test-norace runs them
// without it, and .ci/allowed-skips allows only that skip).
const raceEnabled = true
