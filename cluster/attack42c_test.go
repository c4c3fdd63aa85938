package cluster_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// Issue 42, third attack round, on real nodes over TCP: "every node
// audits each revoke it applies, once" holds per process only. A node
// that restarts applies the log tail after its last snapshot again
// (hashicorp/raft re-applies committed entries once it learns the commit
// index), and audits every revoke in it again: a second "lock revoked"
// line (and ticketing_node_revokes_total +1) for a revoke that happened
// before the restart, indistinguishable from a new one but for its at=.
// An auditor counting revokes (or alerting on the counter's rate) saw
// revokes nobody made. Now each line names its entry's log index: a
// replay repeats it, a new revoke never does.
func TestAttack42c_RestartAuditsOldRevokesAgain(t *testing.T) {
	logs := &revokeLogs{}
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: slog.New(logs), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	tc := &testCluster{Cluster: c, t: t}
	li := tc.leader()
	testkit.WaitFor(t, "cluster version 14", 40*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionRevoke
	})
	conn := tc.dial(li)
	tok := mustGrant(t, do(t, conn, acquireMsg("k", "a", 60, 0)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Node(li).Revoke(ctx, "k", tok, "ops", "stuck"); err != nil {
		t.Fatal(err)
	}
	fi := (li + 1) % c.Size()
	count := func(i int) int {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		n := 0
		for _, l := range logs.lines {
			if strings.Contains(l, "node="+c.ID(i)+" ") {
				n++
			}
		}
		return n
	}
	testkit.WaitFor(t, "the follower audits the revoke", 20*time.Second, func() bool { return count(fi) == 1 })
	if err := c.Stop(fi); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(fi); err != nil {
		t.Fatal(err)
	}
	// Let it catch up (a later write makes the leader send the commit).
	_ = mustGrant(t, do(t, conn, acquireMsg("other", "b", 60, 0)))
	time.Sleep(3 * time.Second)
	// A restarted process replays its log since its last snapshot, and
	// audits what it replays (it keeps no record of what it logged
	// before): the line names the entry's Raft log index, the same in
	// both, so an auditor tells a replay from a new revoke.
	logs.mu.Lock()
	defer logs.mu.Unlock()
	var indexes []string
	for _, l := range logs.lines {
		if strings.Contains(l, "node="+c.ID(fi)+" ") {
			i := strings.Index(l, "index=")
			if i < 0 {
				t.Fatalf("an audit line without its log index: %q", l)
			}
			indexes = append(indexes, strings.Fields(l[i:])[0])
		}
	}
	for _, ix := range indexes {
		if ix != indexes[0] || ix == "index=0" {
			t.Fatalf("one revoke (token %d), node %s restarted once: its lines name indexes %q (want one, nonzero)", tok, c.ID(fi), indexes)
		}
	}
}
