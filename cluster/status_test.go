package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// follower returns the index of a node other than the leader li.
func follower(c *testCluster, li int) int { return (li + 1) % c.Size() }

// queueWaiter starts a waiting acquire of key on conn and waits until the
// leader li lists owner in key's queue (so pipelined waiters queue in FIFO
// order).
func queueWaiter(t *testing.T, c *testCluster, li int, conn *client.Conn, key, owner string, lease uint16, wait time.Duration) *client.Call {
	t.Helper()
	call, err := conn.Start(acquireMsg(key, owner, lease, wait))
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, owner+" queued on "+key, 20*time.Second, func() bool {
		kr, err := c.Node(li).Inspect(key)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range kr.Queue {
			if w.Owner == owner {
				return true
			}
		}
		return false
	})
	return call
}

// A status report on the leader and on a follower, locally and over the
// admin port: roles, members and their lag, domain, counts, token
// high-water mark.
func TestStatusReport(t *testing.T) {
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret})
	c.leader()
	lc := c.client()
	defer lc.close()
	mustGrant(t, lc.do(acquireMsg("a", "alice", 60, 0)))
	t2 := mustGrant(t, lc.do(acquireMsg("b", "bob", 60, 0)))
	li := c.leader()
	conn := c.dial(li)
	queueWaiter(t, c, li, conn, "a", "carol", 30, time.Minute)

	leaderID := c.Node(li).ServerID()
	var st wire.StatusReport
	testkit.WaitFor(t, "every member's lag in the leader's status", 20*time.Second, func() bool {
		st = c.Node(li).StatusReport()
		for _, m := range st.Members {
			if m.Lag == nil {
				return false
			}
		}
		return len(st.Members) == 3
	})
	if st.Role != "leader" || !st.Serving || st.ServerID != leaderID || st.Leader != leaderID ||
		st.LeaderClientAddr != c.Node(li).ClientAddr() || st.Domain == "" || st.Domain != c.Node(li).Domain() ||
		st.ClusterID != c.ClusterID || st.Term == 0 || st.CommitIndex == 0 {
		t.Fatalf("leader status %+v", st)
	}
	if st.KeysHeld != 2 || st.Waiters != 1 || st.LastToken != t2 {
		t.Fatalf("leader status: keys %d waiters %d last token %d, want 2, 1, %d", st.KeysHeld, st.Waiters, st.LastToken, t2)
	}
	leaders := 0
	for _, m := range st.Members {
		if !m.Voter || m.PeerAddr == "" {
			t.Fatalf("member %+v", m)
		}
		if m.Leader {
			leaders++
			if m.ServerID != leaderID {
				t.Fatalf("member %+v marked leader, want %s", m, leaderID)
			}
		}
	}
	if leaders != 1 {
		t.Fatalf("%d members marked leader: %+v", leaders, st.Members)
	}

	fi := follower(c, li)
	var fs wire.StatusReport
	testkit.WaitFor(t, "the follower to apply the acquires", 20*time.Second, func() bool {
		fs = c.Node(fi).StatusReport()
		return fs.KeysHeld == 2 && fs.Waiters == 1
	})
	if fs.Role != "follower" || fs.Serving || fs.ServerID != c.Node(fi).ServerID() || fs.Leader != leaderID ||
		fs.Domain != st.Domain || fs.LastToken != t2 || len(fs.Members) != 3 {
		t.Fatalf("follower status %+v", fs)
	}
	for _, m := range fs.Members {
		if m.Lag != nil {
			t.Fatalf("a follower reports lag %d for %s; only the leader knows", *m.Lag, m.ServerID)
		}
	}

	// Over the admin port: the leader by default, any node without
	// LeaderOnly.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a := c.admin()
	rep, err := a.Do(ctx, wire.AdminRequest{Op: "status", LeaderOnly: true})
	if err != nil || rep.Status == nil || rep.Status.ServerID != leaderID || rep.Status.KeysHeld != 2 || rep.Leader != leaderID {
		t.Fatalf("admin status: %v %+v", err, rep)
	}
	if _, err := client.AdminDo(ctx, c.AdminAddr(fi), a.Config, wire.AdminRequest{Op: "status", LeaderOnly: true}); !errors.Is(err, cluster.ErrNotLeader) {
		t.Fatalf("leader-only status from a follower: %v, want not_leader", err)
	}
	rep, err = client.AdminDo(ctx, c.AdminAddr(fi), a.Config, wire.AdminRequest{Op: "status"})
	if err != nil || rep.Status == nil || rep.Status.ServerID != c.Node(fi).ServerID() || rep.Status.Role != "follower" {
		t.Fatalf("status from a follower: %v %+v", err, rep)
	}
}

// Inspecting a held key with two waiters (FIFO, owners, remaining times
// from the leader's timers or, on a follower, estimated), after a hand-off,
// a free key and an invalid one.
func TestInspectKey(t *testing.T) {
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret})
	c.leader()
	lc := c.client()
	defer lc.close()
	tok := mustGrant(t, lc.do(acquireMsg("seats/12A", "alice", 30, 0)))
	li := c.leader()
	conn := c.dial(li)
	bob := queueWaiter(t, c, li, conn, "seats/12A", "bob", 20, time.Minute)
	queueWaiter(t, c, li, conn, "seats/12A", "carol", 25, 50*time.Second)

	check := func(kr wire.KeyReport, from string) {
		t.Helper()
		h := kr.Holder
		if !kr.Held || h == nil || h.Owner != "alice" || h.Token != tok || h.LeaseSec != 30 || h.GrantedAtUnixMs == 0 ||
			h.LeaseFrom != from || h.LeaseRemainingMs <= 0 || h.LeaseRemainingMs > 30_000 || h.HeldMs < 0 {
			t.Fatalf("holder %+v (from %s) in %+v", h, from, kr)
		}
		if kr.QueueLen != 2 || len(kr.Queue) != 2 || kr.QueueTruncated {
			t.Fatalf("queue %+v", kr)
		}
		for i, want := range []struct {
			owner  string
			lease  uint32
			waitMs uint32
		}{{"bob", 20, 60_000}, {"carol", 25, 50_000}} {
			w := kr.Queue[i]
			if w.Position != i+1 || w.Owner != want.owner || w.LeaseSec != want.lease || w.WaitMs != want.waitMs || w.Ref == 0 ||
				w.EnqueuedAtUnixMs < h.GrantedAtUnixMs || w.WaitedMs < 0 || w.WaitFrom != from ||
				w.WaitRemainingMs <= 0 || w.WaitRemainingMs > int64(want.waitMs) {
				t.Fatalf("waiter %d = %+v, want %s (from %s)", i, w, want.owner, from)
			}
		}
		if kr.Queue[0].EnqueuedAtUnixMs > kr.Queue[1].EnqueuedAtUnixMs {
			t.Fatalf("queue out of order: %+v", kr.Queue)
		}
	}
	kr, err := c.Node(li).Inspect("seats/12A")
	if err != nil {
		t.Fatal(err)
	}
	if kr.ServerID != c.Node(li).ServerID() || kr.Role != "leader" || kr.Key != "seats/12A" || kr.AtUnixMs == 0 {
		t.Fatalf("inspect on the leader: %+v", kr)
	}
	check(kr, wire.FromLeaderTimer)

	fi := follower(c, li)
	testkit.WaitFor(t, "the follower to apply the queue", 20*time.Second, func() bool {
		kr, err = c.Node(fi).Inspect("seats/12A")
		return err == nil && kr.QueueLen == 2
	})
	if kr.Role != "follower" || kr.Leader != c.Node(li).ServerID() {
		t.Fatalf("inspect on a follower: %+v", kr)
	}
	check(kr, wire.FromClockEstimate)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a := c.admin()
	rep, err := a.Do(ctx, wire.AdminRequest{Op: "inspect", Key: "seats/12A", LeaderOnly: true})
	if err != nil || rep.Key == nil || rep.Key.ServerID != c.Node(li).ServerID() {
		t.Fatalf("admin inspect: %v %+v", err, rep)
	}
	check(*rep.Key, wire.FromLeaderTimer)

	// Hand-off: bob holds, carol waits.
	mustType(t, lc.do(releaseMsg("seats/12A", "alice", tok)), wire.TypeOK)
	<-bob.Done
	if bob.Err != nil || bob.Reply.Type != wire.TypeGranted {
		t.Fatalf("bob: %v %s", bob.Err, describe(bob.Reply))
	}
	kr, err = c.Node(li).Inspect("seats/12A")
	if err != nil || !kr.Held || kr.Holder.Owner != "bob" || kr.Holder.Token != bob.Reply.Token || kr.Holder.LeaseSec != 20 ||
		kr.QueueLen != 1 || len(kr.Queue) != 1 || kr.Queue[0].Owner != "carol" {
		t.Fatalf("after the hand-off: %v %+v", err, kr)
	}

	kr, err = c.Node(li).Inspect("seats/free")
	if err != nil || kr.Held || kr.Holder != nil || kr.QueueLen != 0 || kr.Queue == nil || len(kr.Queue) != 0 {
		t.Fatalf("a free key: %v %+v", err, kr)
	}
	for _, bad := range []string{"", "has space", strings.Repeat("k", locksm.MaxKeyLen+1)} {
		if _, err := c.Node(li).Inspect(bad); !errors.Is(err, locksm.ErrInvalidKey) {
			t.Fatalf("inspect %q: %v, want invalid key", bad, err)
		}
		if _, err := a.Do(ctx, wire.AdminRequest{Op: "inspect", Key: bad}); !errors.Is(err, wire.ErrBadRequest) {
			t.Fatalf("admin inspect %q: %v, want bad_request", bad, err)
		}
	}
}

// A queue too long for one admin frame is cut short, head first, with the
// full count; Inspect itself lists them all.
func TestAdminInspectTruncatesQueue(t *testing.T) {
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret})
	c.leader()
	lc := c.client()
	defer lc.close()
	mustGrant(t, lc.do(acquireMsg("k", "holder", 60, 0)))
	li := c.leader()
	conn := c.dial(li)
	const waiters = 40
	owner := func(i int) string { return strings.Repeat("o", locksm.MaxOwnerLen-8) + fmt.Sprintf("%08d", i) }
	for i := 0; i < waiters; i++ {
		if _, err := conn.Start(acquireMsg("k", owner(i), 30, time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, "every waiter queued", 20*time.Second, func() bool {
		kr, err := c.Node(li).Inspect("k")
		return err == nil && kr.QueueLen == waiters
	})
	kr, _ := c.Node(li).Inspect("k")
	if len(kr.Queue) != waiters || kr.QueueTruncated {
		t.Fatalf("Inspect lists %d of %d waiters (truncated %v)", len(kr.Queue), kr.QueueLen, kr.QueueTruncated)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, err := c.admin().Do(ctx, wire.AdminRequest{Op: "inspect", Key: "k", LeaderOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	k := rep.Key
	if k == nil || k.QueueLen != waiters || !k.QueueTruncated || len(k.Queue) == 0 || len(k.Queue) >= waiters {
		t.Fatalf("admin inspect of %d waiters: %+v", waiters, k)
	}
	for i, w := range k.Queue {
		if w.Owner != kr.Queue[i].Owner {
			t.Fatalf("waiter %d is %s over the admin port, %s locally", i, w.Owner, kr.Queue[i].Owner)
		}
	}
	t.Logf("%d of %d waiters fit one admin frame", len(k.Queue), waiters)
}
