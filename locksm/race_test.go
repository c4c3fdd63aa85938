//go:build race

package locksm

// raceEnabled: the race detector adds allocations of its own, so
// allocation-count tests are skipped under it.
const raceEnabled = true
