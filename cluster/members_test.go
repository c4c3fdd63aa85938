package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

var adminSecret = []byte("the-admin-secret-0123456789abcdef")

func (c *testCluster) admin() *client.AdminCluster {
	var addrs []string
	for i := 0; i < c.Size(); i++ {
		addrs = append(addrs, c.AdminAddr(i))
	}
	return &client.AdminCluster{Addrs: addrs, Config: client.AdminConfig{Secret: adminSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS}}
}

// replaceInPlace replaces node i (already wiped and restarted with a new
// incarnation) through the admin port: the old server id does not answer,
// so it is removed first, then the new one joins as a learner, catches up
// and is promoted.
func (c *testCluster) replaceInPlace(t *testing.T, i int, oldID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.admin().Replace(ctx, oldID, c.Node(i).ServerID(), c.PeerAddrOf(i), func(s string) { t.Log(s) }); err != nil {
		t.Fatal(err)
	}
}

// Every node of a 3-node cluster, the leader included, loses its disk and
// is replaced by a new server at the same address, one at a time, while
// clients keep acquiring and releasing. Tokens keep increasing, no grant
// is reported twice, and clients fail only around leader changes.
func TestRollingReplacementOfEveryNode(t *testing.T) {
	c := startClusterOpts(t, local.Options{TLS: true, AdminSecret: adminSecret})
	c.leader()

	type result struct {
		worker int
		at     time.Time
		token  uint64
		fail   string
	}
	var mu sync.Mutex
	var results []result
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			lc := c.client()
			defer lc.close()
			key, owner := fmt.Sprintf("k%d", w), fmt.Sprintf("o%d", w)
			for {
				select {
				case <-stop:
					return
				default:
				}
				// The wait covers a lease left by a release whose outcome
				// was unknown across a leader change.
				r := lc.do(acquireMsg(key, owner, 5, 8*time.Second))
				res := result{worker: w, at: time.Now()}
				switch r.Type {
				case wire.TypeGranted:
					res.token = r.Token
					if rr := lc.do(releaseMsg(key, owner, r.Token)); rr.Type != wire.TypeOK {
						// The release may be indeterminate across a leader
						// change; the lease (5 s) frees the key.
						res.fail = "release " + describe(rr)
					}
				default:
					res.fail = "acquire " + describe(r)
				}
				mu.Lock()
				results = append(results, res)
				mu.Unlock()
				if res.fail != "" {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}(w)
	}

	start := time.Now()
	for i := 0; i < 3; i++ {
		oldID := c.Node(i).ServerID()
		if err := c.Wipe(i); err != nil {
			t.Fatal(err)
		}
		if err := c.Restart(i); err != nil {
			t.Fatal(err)
		}
		c.replaceInPlace(t, i, oldID)
	}
	close(stop)
	wg.Wait()

	ms, err := c.Node(c.leader()).Members()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 || voters(ms) != 3 {
		t.Fatalf("members after the replacement: %+v", ms)
	}
	for _, m := range ms {
		for i := 0; i < 3; i++ {
			if m.Name == c.ID(i) && m.ServerID != c.Node(i).ServerID() {
				t.Fatalf("member %s is not the replacement %s", m.ServerID, c.Node(i).ServerID())
			}
		}
	}
	seen := map[uint64]bool{}
	var fails int
	last := map[int]uint64{}
	var failFirst, failLast time.Time
	for _, r := range results {
		if r.fail != "" {
			fails++
			if failFirst.IsZero() {
				failFirst = r.at
			}
			failLast = r.at
			continue
		}
		if seen[r.token] {
			t.Fatalf("token %d granted twice", r.token)
		}
		seen[r.token] = true
		if r.token <= last[r.worker] {
			t.Fatalf("worker %d got token %d after %d", r.worker, r.token, last[r.worker])
		}
		last[r.worker] = r.token
	}
	if len(seen) == 0 {
		t.Fatal("no grants during the replacement")
	}
	t.Logf("rolling replacement of 3 nodes in %v: %d grants, %d failed operations (first %v, last %v after start)",
		time.Since(start).Round(time.Millisecond), len(seen), fails, failFirst.Sub(start).Round(time.Millisecond),
		failLast.Sub(start).Round(time.Millisecond))
}

func voters(ms []cluster.Member) int {
	v := 0
	for _, m := range ms {
		if m.Voter {
			v++
		}
	}
	return v
}

// Unsafe requests are refused: removing a voter that would leave fewer
// than 3, promoting a learner that is not there or lags, a second change at
// once is covered by beginChange.
func TestUnsafeMembershipChangesRefused(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	n := c.Node(li)
	other := c.Node((li + 1) % 3).ServerID()
	if err := n.Remove(other, 5*time.Second); !errors.Is(err, cluster.ErrUnsafeChange) {
		t.Fatalf("removing a voter of 3: %v, want ErrUnsafeChange", err)
	}
	if err := n.Promote("n9/aaaaaaaaaa", 5*time.Second); !errors.Is(err, cluster.ErrNoSuchMember) {
		t.Fatalf("promoting a stranger: %v", err)
	}
	if err := n.AddLearner("n9", "127.0.0.1:1", 5*time.Second); !errors.Is(err, cluster.ErrBadConfig) {
		t.Fatalf("learner without an incarnation: %v", err)
	}
	// A learner that never answers cannot be promoted (its lag is unknown).
	if err := n.AddLearner("n9/aaaaaaaaaa", "127.0.0.1:1", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := n.Promote("n9/aaaaaaaaaa", 5*time.Second); !errors.Is(err, cluster.ErrLearnerLagging) {
		t.Fatalf("promoting a learner that cannot be reached: %v", err)
	}
	if err := c.Node((li+1)%3).Promote("n9/aaaaaaaaaa", time.Second); !errors.Is(err, cluster.ErrNotLeader) {
		t.Fatalf("promote on a follower: %v", err)
	}
	// A learner does not count toward the voter rules: it can be removed.
	if err := n.Remove("n9/aaaaaaaaaa", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// The admin port takes only the admin secret, and lists the members with
// the leader's view of their lag.
func TestAdminPortAuthAndMembers(t *testing.T) {
	c := startClusterOpts(t, local.Options{TLS: true, AdminSecret: adminSecret})
	c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a := c.admin()
	rep, err := a.Do(ctx, wire.AdminRequest{Op: "members"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Members) != 3 || rep.Leader == "" {
		t.Fatalf("members reply %+v", rep)
	}
	for _, m := range rep.Members {
		if !m.Voter || m.Lag < 0 {
			t.Fatalf("member %+v", m)
		}
	}
	for name, secret := range map[string][]byte{"client secret": c.ClientSecret, "wrong": []byte("some-other-secret-123456")} {
		cfg := a.Config
		cfg.Secret = secret
		if _, err := client.AdminDo(ctx, c.AdminAddr(0), cfg, wire.AdminRequest{Op: "members"}); !errors.Is(err, wire.ErrAuthFailed) {
			t.Fatalf("admin port with the %s: %v, want auth_failed", name, err)
		}
	}
	if _, err := a.Do(ctx, wire.AdminRequest{Op: "remove", ID: rep.Members[0].ServerID}); !errors.Is(err, cluster.ErrUnsafeChange) {
		t.Fatalf("removing a voter of 3 over the admin port: %v", err)
	}
	if _, err := a.Do(ctx, wire.AdminRequest{Op: "explode"}); !errors.Is(err, wire.ErrBadRequest) {
		t.Fatalf("unknown op: %v", err)
	}
}

// Growing 3 → 5 and shrinking 5 → 3 go through the same commands: learner,
// promote (4 voters is the transition step), and remove.
func TestGrowToFiveAndShrinkToThree(t *testing.T) {
	c := startClusterOpts(t, local.Options{Nodes: 5, Voters: 3, TLS: true, AdminSecret: adminSecret})
	c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := c.admin()
	lc := c.client()
	defer lc.close()
	tok := mustGrant(t, lc.do(acquireMsg("k", "a", 120, 0)))
	for _, i := range []int{3, 4} {
		id := c.Node(i).ServerID()
		if _, err := a.Do(ctx, wire.AdminRequest{Op: "add-learner", ID: id, Addr: c.PeerAddrOf(i)}); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, id+" to catch up", 20*time.Second, func() bool {
			h, ok := c.holderOn(i, "k")
			return ok && h.Token == tok
		})
		// Clients see the learner in the members reply (any node answers).
		if got := suffrageOf(t, lc.do(wire.Msg{Type: wire.TypeMembers}), id); got != wire.SuffrageLearner {
			t.Fatalf("%s is a %v in the members reply, want a learner", id, got)
		}
		for {
			_, err := a.Do(ctx, wire.AdminRequest{Op: "promote", ID: id})
			if err == nil {
				break
			}
			if !errors.Is(err, cluster.ErrLearnerLagging) && !errors.Is(err, cluster.ErrChangeInProgress) {
				t.Fatalf("promote %s: %v", id, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if got := suffrageOf(t, lc.do(wire.Msg{Type: wire.TypeMembers}), id); got != wire.SuffrageVoter {
			t.Fatalf("%s is a %v in the members reply after promote", id, got)
		}
	}
	rep, err := a.Do(ctx, wire.AdminRequest{Op: "members"})
	if err != nil || len(rep.Members) != 5 {
		t.Fatalf("members after growing: %+v %v", rep, err)
	}
	for _, m := range rep.Members {
		if !m.Voter {
			t.Fatalf("not a voter after growing: %+v", m)
		}
	}
	// Shrink: remove two voters (never below three).
	for _, i := range []int{3, 4} {
		if _, err := a.Do(ctx, wire.AdminRequest{Op: "remove", ID: c.Node(i).ServerID()}); err != nil {
			t.Fatalf("remove: %v", err)
		}
	}
	if _, err := a.Do(ctx, wire.AdminRequest{Op: "remove", ID: c.Node(0).ServerID()}); !errors.Is(err, cluster.ErrUnsafeChange) {
		t.Fatalf("removing a fourth voter: %v", err)
	}
	rep, err = a.Do(ctx, wire.AdminRequest{Op: "members"})
	if err != nil || len(rep.Members) != 3 {
		t.Fatalf("members after shrinking: %+v %v", rep, err)
	}
	if t2 := mustGrant(t, lc.do(acquireMsg("k2", "a", 30, 0))); t2 <= tok {
		t.Fatalf("token %d after %d", t2, tok)
	}
}

// suffrageOf finds id in a members reply (failing if absent).
func suffrageOf(t *testing.T, r wire.Msg, id string) wire.Suffrage {
	t.Helper()
	if r.Type != wire.TypeMembersR {
		t.Fatalf("members request answered %s %+v", wire.TypeName(r.Type), r)
	}
	for _, m := range r.Members {
		if m.ServerID == id {
			return m.Suffrage
		}
	}
	t.Fatalf("%s missing from members reply %+v", id, r.Members)
	return 0
}

// A configuration server whose address does not parse fails Members
// (ErrBadPeerAddr) instead of being listed with an empty peer address,
// which a promotion would re-add the server at.
func TestMembersRefusesADamagedAddress(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	r := c.Node(li).Raft()
	if err := r.AddNonvoter("n9/abcdefghij", "no-at-sign", 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if ms, err := c.Node(li).Members(); !errors.Is(err, cluster.ErrBadPeerAddr) {
		t.Fatalf("members with a damaged address: %+v, %v; want ErrBadPeerAddr", ms, err)
	}
	if err := r.RemoveServer("n9/abcdefghij", 0, 5*time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Node(li).Members(); err != nil {
		t.Fatalf("members once the damaged server is gone: %v", err)
	}
}

// startNewestVersion starts opts' cluster and waits until its leader has
// recorded the newest cluster version, wire.ProtocolVersion (issue 39,
// finding 10).
func startNewestVersion(t *testing.T, opts local.Options) (*testCluster, int) {
	t.Helper()
	c := startClusterOpts(t, opts)
	li := c.leader()
	testkit.WaitFor(t, "the newest cluster version", 20*time.Second, func() bool { return c.Node(li).ClusterVersion() == wire.ProtocolVersion })
	return c, li
}

// atVersion6 plays a node of an older build (protocol version 6).
func atVersion6(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionExtend }

// A learner that was down when it was added (so add-learner could not
// check its version) and then runs protocol version 6 in a cluster at
// version 8 is never promoted, by promote or by promote-replacing: the
// promotion learns its version and refuses, naming the node, its version
// and the cluster's. Before issue 39 it was promoted unchecked, and could
// then be handed the leadership and serve at version 6 (finding 10).
func TestPromoteRefusesALearnerOlderThanTheClusterVersion(t *testing.T) {
	c, li := startNewestVersion(t, local.Options{Nodes: 4, Voters: 3, AdminSecret: adminSecret})
	n := c.Node(li)
	id := c.Node(3).ServerID()
	if err := c.Stop(3); err != nil {
		t.Fatal(err)
	}
	if err := n.AddLearner(id, c.PeerAddrOf(3), 10*time.Second); err != nil {
		t.Fatalf("adding a learner that is down (unchecked, as documented): %v", err)
	}
	if err := c.RestartWith(3, atVersion6); err != nil {
		t.Fatal(err)
	}
	if got := c.Node(3).ServerID(); got != id {
		t.Fatalf("restarted as %s, want %s", got, id)
	}
	c.waitCaughtUp(id)
	err := n.Promote(id, 10*time.Second)
	if !errors.Is(err, cluster.ErrUnsafeChange) {
		t.Fatalf("promoting a version 6 learner at cluster version %d: %v, want ErrUnsafeChange", wire.ProtocolVersion, err)
	}
	for _, want := range []string{id, "version 6", fmt.Sprintf("cluster version %d", wire.ProtocolVersion), "upgrade"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	t.Logf("refused: %v", err)
	old := c.Node((li + 1) % 3).ServerID()
	if err := n.PromoteReplacing(id, old, 10*time.Second); !errors.Is(err, cluster.ErrUnsafeChange) || !strings.Contains(err.Error(), "version 6") {
		t.Fatalf("promoting a version 6 learner in place of %s: %v, want ErrUnsafeChange naming its version", old, err)
	}
	ms, err := n.Members()
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := memberOf(ms, id); !ok || m.Voter || voters(ms) != 3 {
		t.Fatalf("members after the refusals: %+v; want %s still a learner and 3 voters", ms, id)
	}
	if c.Node(li).ClusterVersion() != wire.ProtocolVersion {
		t.Fatalf("cluster version %d", c.Node(li).ClusterVersion())
	}
}

func memberOf(ms []cluster.Member, id string) (cluster.Member, bool) {
	for _, m := range ms {
		if m.ServerID == id {
			return m, true
		}
	}
	return cluster.Member{}, false
}
