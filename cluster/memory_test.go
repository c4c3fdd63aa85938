package cluster_test

import "testing"

// leaderBytesPerWaiter is the leader's promise (docs/performance.md, issue
// 20): a queued waiter costs it at most 1 KiB (about 530 to 630 bytes
// measured).
const leaderBytesPerWaiter = 1024

// The leader's memory per queued waiter stays within its promise: 20,000
// waiters (enough that the collector's noise is a few bytes each),
// measured as BenchmarkLeaderMemoryPerWaiter does. Bytes, not speed: the
// figure does not depend on the machine's load.
func TestLeaderMemoryPerWaiter(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector inflates every allocation (make test-norace runs this without it)")
	}
	m := measureLeaderMemory(t, 50_000)
	t.Logf("bytes per waiter: leader %.0f, all three nodes %.0f, one lock table %.0f", m.leader(), m.process, m.table)
	if m.leader() > leaderBytesPerWaiter {
		t.Errorf("the leader's memory per queued waiter: %.0f bytes, want at most %d", m.leader(), leaderBytesPerWaiter)
	}
}
