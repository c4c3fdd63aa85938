package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// Revoke, then snapshots, then a restart of every node: the audit records
// and the token counter survive (a check; expected to pass).
func TestAttack42_RevokeSurvivesSnapshotAndRestart(t *testing.T) {
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret, Tune: func(cfg *cluster.Config) {
		cfg.SnapshotThreshold, cfg.SnapshotInterval, cfg.TrailingLogs = 4, 200*time.Millisecond, 1
	}})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 14", 40*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionRevoke
	})
	conn := c.dial(li)
	tA := mustGrant(t, do(t, conn, acquireMsg("k", "alice", 120, 0)))
	call := queueWaiter(t, c, li, c.dial(li), "k", "bob", 120, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.admin().Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "k", Token: tA, By: "ops", Reason: "before restart"}); err != nil {
		t.Fatal(err)
	}
	<-call.Done
	tB := mustGrant(t, call.Reply)
	var last uint64
	for i := 0; i < 20; i++ {
		key := fmt.Sprintf("x%d", i)
		last = mustGrant(t, do(t, conn, acquireMsg(key, "filler", 60, 0)))
		mustType(t, do(t, conn, releaseMsg(key, "filler", last)), wire.TypeOK)
	}
	time.Sleep(2 * time.Second) // snapshots
	for i := 0; i < c.Size(); i++ {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < c.Size(); i++ {
		if err := c.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	li = c.leader()
	for i := 0; i < c.Size(); i++ {
		testkit.WaitFor(t, "node restored the revoke record", 30*time.Second, func() bool {
			kr, err := c.Node(i).Inspect("k")
			return err == nil && kr.LastRevoke != nil && kr.LastRevoke.Token == tA && kr.LastRevoke.Reason == "before restart" &&
				kr.Holder != nil && kr.Holder.Token == tB
		})
	}
	tN := mustGrant(t, do(t, c.dial(li), acquireMsg("fresh", "z", 60, 0)))
	if tN <= last || tN <= tB {
		t.Fatalf("token after restart %d not above %d / %d", tN, last, tB)
	}
}
