//go:build race

package cluster_test

// raceEnabled: the race detector inflates every allocation, so the tests
// that measure memory skip under it (make test-norace runs them without
// it, and .ci/allowed-skips allows only that skip).
const raceEnabled = true
