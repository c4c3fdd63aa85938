package cluster_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

func permitMsg(key, owner string, lease uint16, wait time.Duration) wire.Msg {
	return wire.Msg{Type: wire.TypeAcquirePermit, Key: key, Owner: owner, Lease: lease, WaitMs: uint32(wait / time.Millisecond)}
}

func setPermitsMsg(key string, n uint32) wire.Msg {
	return wire.Msg{Type: wire.TypeSetPermits, Key: key, Permits: n}
}

// mustPermit checks a permit's G: a token and its slot.
func mustPermit(t *testing.T, r wire.Msg, slot uint32) uint64 {
	t.Helper()
	if r.Type != wire.TypeGranted || r.Token == 0 || !r.Permit || r.Slot != slot {
		t.Fatalf("want G with a token in slot %d, got %s (permit %v, slot %d)", slot, describe(r), r.Permit, r.Slot)
	}
	return r.Token
}

// permitsOn is node i's view of semaphore k: n and the (slot, token) of
// each held permit, slot order; ok false if it is not a semaphore there.
func permitsOn(c *testCluster, i int, k string) (n uint32, held [][2]uint64, ok bool) {
	kr, err := c.Node(i).Inspect(k)
	if err != nil || kr.Semaphore == nil {
		return 0, nil, false
	}
	for _, p := range kr.Permits {
		held = append(held, [2]uint64{uint64(*p.Slot), p.Token})
	}
	return kr.Semaphore.Permits, held, true
}

// Issue 41, semaphores on real nodes: the operator's set-permits defines
// a key, permits are granted in the lowest free slots with tokens from the
// one counter (a lock grant in between takes the next), a waiter gets the
// freed slot, every node's inspect shows the same permits, and the
// semaphore with its permits and waiter survives a follower restarting
// from its own snapshot, one restored by InstallSnapshot, and the
// leader's death: the new leader expires a permit whose lease ran out
// (the expiry through the log) and hands its slot to the next waiter.
func TestSemaphoreOnRealNodes(t *testing.T) {
	// On bolt with few trailing logs, as TestLongWaitersSurviveSnapshotRestore:
	// the leader's log must be compacted past the stopped follower.
	c := startClusterOpts(t, local.Options{LogStore: cluster.LogStoreBolt, Tune: func(cfg *cluster.Config) { cfg.TrailingLogs = 8 }})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 13", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionSemaphores
	})
	lc := c.dial(li)
	mustType(t, do(t, lc, setPermitsMsg("s", 2)), wire.TypeOK)
	t0 := mustPermit(t, do(t, lc, permitMsg("s", "a", 200, 0)), 0)
	lt := mustGrant(t, do(t, lc, acquireMsg("lock", "a", 200, 0)))
	t1 := mustPermit(t, do(t, lc, permitMsg("s", "b", 3, 0)), 1)
	if !(t0 < lt && lt < t1) {
		t.Fatalf("tokens %d, %d (lock), %d: one counter for locks and permits", t0, lt, t1)
	}
	if r := do(t, lc, acquireMsg("s", "x", 30, 0)); r.Type != wire.TypeError || r.Code != wire.CodeIsSemaphore {
		t.Fatalf("a lock acquire of a semaphore: %s", describe(r))
	}
	mustType(t, do(t, lc, permitMsg("s", "x", 30, 0)), wire.TypeBusy)
	want := func(what string, n uint32, held ...[2]uint64) {
		t.Helper()
		for i := range c.Size() {
			if c.Node(i) == nil {
				continue
			}
			testkit.WaitFor(t, fmt.Sprintf("%s: node %d shows n=%d permits %v", what, i, n, held), 20*time.Second, func() bool {
				gn, gh, ok := permitsOn(c, i, "s")
				return ok && gn == n && slices.Equal(gh, held)
			})
		}
	}
	want("two granted", 2, [2]uint64{0, t0}, [2]uint64{1, t1})

	fi := follower(c, li)
	c.restartFromOwnSnapshot(fi)
	want("a follower restarted from its snapshot", 2, [2]uint64{0, t0}, [2]uint64{1, t1})
	fo := c.restoreByInstallSnapshot(li, fi)
	_ = fo
	want("a follower restored by InstallSnapshot", 2, [2]uint64{0, t0}, [2]uint64{1, t1})

	// b's 3 s lease runs out on whichever leader serves then: kill the
	// leader now; the new one re-arms the lease from its own applied
	// state and commits the expiry.
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	nl := c.leader()
	nc := c.dial(nl)
	// A waiter for the permit b's expiry frees: it gets slot 1.
	w := do(t, nc, permitMsg("s", "c", 30, 20*time.Second))
	t2 := mustPermit(t, w, 1)
	if t2 <= t1 {
		t.Fatalf("the new leader's grant %d is not above %d", t2, t1)
	}
	if err := c.Restart(li); err != nil {
		t.Fatal(err)
	}
	want("after the leader change", 2, [2]uint64{0, t0}, [2]uint64{1, t2})
	// Raising n grants at once; lowering it takes nothing away.
	mustType(t, do(t, nc, setPermitsMsg("s", 1)), wire.TypeOK)
	want("lowered", 1, [2]uint64{0, t0}, [2]uint64{1, t2})
	mustType(t, do(t, nc, releaseMsg("s", "a", t0)), wire.TypeOK)
	mustType(t, do(t, nc, permitMsg("s", "d", 30, 0)), wire.TypeBusy) // c still holds: 1 of n=1
	mustType(t, do(t, nc, setPermitsMsg("s", 3)), wire.TypeOK)
	t3 := mustPermit(t, do(t, nc, permitMsg("s", "d", 30, 0)), 0)
	want("raised", 3, [2]uint64{0, t3}, [2]uint64{1, t2})
	if r := do(t, nc, setPermitsMsg("s", 0)); r.Type != wire.TypeError || r.Code != wire.CodeInUse {
		t.Fatalf("removing a semaphore in use: %s", describe(r))
	}
}

// Before every member runs protocol version 13 the leader refuses both
// semaphore requests before proposing anything (not_supported): an older
// member could not decode their entries. Once the last member is
// upgraded the cluster version rises and they work.
func TestSemaphoresNeedVersion13(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionLongWaits }})
	li := c.leader()
	// Upgrade the followers, then the leader: while the old leader runs
	// 11, a version-13 node that leads has a version-13 connection but
	// an 11 cluster.
	upgrade := func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.ProtocolVersion }
	for _, i := range []int{(li + 1) % 3, (li + 2) % 3} {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
		if err := c.RestartWith(i, upgrade); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	nl := c.leader()
	if err := c.RestartWith(li, func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionLongWaits }); err != nil {
		t.Fatal(err)
	}
	conn := c.dial(nl)
	for _, m := range []wire.Msg{setPermitsMsg("s", 2), permitMsg("s", "a", 30, 0)} {
		if r := do(t, conn, m); r.Type != wire.TypeError || r.Code != wire.CodeNotSupported {
			t.Fatalf("%c on a cluster at version %d: %s, want E(not_supported)", m.Type, c.Node(nl).ClusterVersion(), describe(r))
		}
	}
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartWith(li, upgrade); err != nil {
		t.Fatal(err)
	}
	nl = c.leader()
	testkit.WaitFor(t, "cluster version 13 once every member runs it", 40*time.Second, func() bool {
		return c.Node(nl).ClusterVersion() >= wire.VersionSemaphores
	})
	conn = c.dial(nl)
	mustType(t, do(t, conn, setPermitsMsg("s", 2)), wire.TypeOK)
	mustPermit(t, do(t, conn, permitMsg("s", "a", 30, 0)), 0)
}

// MaxKeys bounds the lock table's memory (a node's key table, every
// replica's and every snapshot's): a semaphore's definition and each of
// its permits are holdings in that table like a key, so they count
// against it. Before, a client could define semaphores and take up to
// 100,000 permits of each with the lock table "full": the bound that
// turns a flood into too_many_keys did not see them.
func TestSemaphoresCountAgainstMaxKeys(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) { cfg.MaxKeys = 4 }})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 13", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionSemaphores
	})
	lc := c.dial(li)
	mustType(t, do(t, lc, setPermitsMsg("s", 100)), wire.TypeOK) // 1
	mustPermit(t, do(t, lc, permitMsg("s", "a", 60, 0)), 0)      // 2
	mustPermit(t, do(t, lc, permitMsg("s", "a", 60, 0)), 1)      // 3
	mustGrant(t, do(t, lc, acquireMsg("lock", "a", 60, 0)))      // 4
	if r := do(t, lc, permitMsg("s", "a", 60, 0)); r.Type != wire.TypeError || r.Code != wire.CodeTooManyKeys {
		t.Fatalf("a fifth holding (a permit) with MaxKeys 4: %s, want E(too_many_keys)", describe(r))
	}
	if r := do(t, lc, setPermitsMsg("t", 5)); r.Type != wire.TypeError || r.Code != wire.CodeTooManyKeys {
		t.Fatalf("a new semaphore with MaxKeys 4 reached: %s, want E(too_many_keys)", describe(r))
	}
	if r := do(t, lc, acquireMsg("lock2", "a", 60, 0)); r.Type != wire.TypeError || r.Code != wire.CodeTooManyKeys {
		t.Fatalf("a fifth holding (a lock) with MaxKeys 4: %s, want E(too_many_keys)", describe(r))
	}
	// Resizing a defined semaphore creates nothing: still allowed.
	mustType(t, do(t, lc, setPermitsMsg("s", 3)), wire.TypeOK)
}

// A burst of set-permits defining new semaphores, pipelined on one
// connection so none is applied before the next is admitted, cannot
// overshoot MaxKeys: a definition in flight counts as one, as an acquire
// in flight does.
func TestSetPermitsBurstCannotOvershootMaxKeys(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) { cfg.MaxKeys = 4 }})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 13", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionSemaphores
	})
	lc := c.dial(li)
	var calls []*client.Call
	for i := range 12 {
		call, err := lc.Start(setPermitsMsg(fmt.Sprintf("s%d", i), 2))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call)
	}
	ok := 0
	for _, call := range calls {
		<-call.Done
		switch r := call.Reply; {
		case r.Type == wire.TypeOK:
			ok++
		case r.Type == wire.TypeError && r.Code == wire.CodeTooManyKeys:
		default:
			t.Fatalf("set-permits: %s", describe(r))
		}
	}
	var defined int
	c.Node(li).ReadState(func(st *locksm.State) { defined = st.NumSemaphores() })
	if ok > 4 || defined > 4 {
		t.Fatalf("%d set-permits succeeded, %d semaphores defined with MaxKeys 4", ok, defined)
	}
}

// Lowering n while permits are held and waiters queue, then the leader's
// death: the new leader grants nobody while n or more are held (a permit
// in a slot at or above the new n stays held, none is granted there), and
// the first grant after enough releases takes the lowest free slot below
// n, to the queue's head.
func TestSemaphoreLoweredThenLeaderDies(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	testkit.WaitFor(t, "cluster version 13", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionSemaphores
	})
	lc := c.dial(li)
	mustType(t, do(t, lc, setPermitsMsg("s", 3)), wire.TypeOK)
	var toks []uint64
	for i := range 3 {
		toks = append(toks, mustPermit(t, do(t, lc, permitMsg("s", "h", 200, 0)), uint32(i)))
	}
	mustType(t, do(t, lc, setPermitsMsg("s", 1)), wire.TypeOK)
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	nl := c.leader()
	nc := c.dial(nl)
	w, err := nc.Start(permitMsg("s", "w", 200, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// Two releases leave one held (slot 2, above n=1): still n held.
	mustType(t, do(t, nc, releaseMsg("s", "h", toks[0])), wire.TypeOK)
	mustType(t, do(t, nc, releaseMsg("s", "h", toks[1])), wire.TypeOK)
	select {
	case <-w.Done:
		t.Fatalf("granted while %d permits are held with n=1: %s", 1, describe(w.Reply))
	case <-time.After(500 * time.Millisecond):
	}
	mustType(t, do(t, nc, releaseMsg("s", "h", toks[2])), wire.TypeOK)
	<-w.Done
	if tok := mustPermit(t, w.Reply, 0); tok <= toks[2] {
		t.Fatalf("token %d not above %d", tok, toks[2])
	}
}

// A pipelined burst of permit acquires cannot overshoot MaxKeys either:
// each in flight counts as a holding until applied.
func TestPermitBurstCannotOvershootMaxKeys(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) { cfg.MaxKeys = 4 }})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 13", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionSemaphores
	})
	lc := c.dial(li)
	mustType(t, do(t, lc, setPermitsMsg("s", 100)), wire.TypeOK)
	var calls []*client.Call
	for range 12 {
		call, err := lc.Start(permitMsg("s", "a", 60, 0))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call)
	}
	granted := 0
	for _, call := range calls {
		<-call.Done
		switch r := call.Reply; {
		case r.Type == wire.TypeGranted:
			granted++
		case r.Type == wire.TypeError && r.Code == wire.CodeTooManyKeys:
		default:
			t.Fatalf("permit: %s", describe(r))
		}
	}
	var held int
	c.Node(li).ReadState(func(st *locksm.State) { held = st.NumPermitsHeld() })
	if granted > 3 || held > 3 {
		t.Fatalf("%d permits granted, %d held, with MaxKeys 4 and the semaphore's definition counted", granted, held)
	}
}
