package cluster_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
)

// The hazard this guards against (reproduced with hashicorp/raft v1.8.0): an
// entry X is committed on the leader and one follower; the other follower
// lacks it. The leader dies and the follower that has X loses its disk and
// comes back empty under its old id. The follower that lacks X campaigns,
// the wiped node votes for it, and X is overwritten. Here the wiped node
// comes back with a new incarnation: the candidate dials the old server id,
// which the wiped node cannot prove, so no leader is elected until the old
// leader returns, and X survives. The wiped node can only rejoin as a new
// learner.
func TestWipedNodeCannotVoteUnderItsOldIdentity(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	lag, wiped := (li+1)%3, (li+2)%3
	c.faults.Isolate(c.ID(lag), c.IDs())
	lc := c.client()
	defer lc.close()
	tok := mustGrant(t, lc.do(acquireMsg("x", "a", 250, 0))) // committed on li and wiped only
	lc.drop()
	testkit.WaitFor(t, "x applied on the node to be wiped", 5*time.Second, func() bool {
		_, ok := c.holderOn(wiped, "x")
		return ok
	})
	if _, ok := c.holderOn(lag, "x"); ok {
		t.Fatal("the isolated follower has x")
	}
	oldID := c.Node(wiped).ServerID()
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	if err := c.Wipe(wiped); err != nil {
		t.Fatal(err)
	}
	c.faults.Heal()
	if err := c.Restart(wiped); err != nil {
		t.Fatal(err)
	}
	newID := c.Node(wiped).ServerID()
	if newID == oldID {
		t.Fatalf("wiped node came back as %s", oldID)
	}
	// The node lacking x must not become leader: its only possible voter
	// is the wiped node, which cannot prove the id it is dialled under.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if c.Node(lag).Raft().State() == raft.Leader {
			t.Fatal("the node lacking a committed entry was elected with the wiped node's vote")
		}
		if c.Node(wiped).Raft().State() == raft.Leader {
			t.Fatal("the wiped node became leader")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The old leader returns: it and the lagging node elect a leader that
	// has x, and x survives with its token.
	if err := c.Restart(li); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "x replicated to the lagging node", 20*time.Second, func() bool {
		h, ok := c.holderOn(lag, "x")
		return ok && h.Token == tok
	})
	lc2 := c.client()
	defer lc2.close()
	if t2 := mustGrant(t, lc2.do(acquireMsg("y", "a", 30, 0))); t2 <= tok {
		t.Fatalf("token %d not above %d", t2, tok)
	}
	// The wiped node is a stranger until added as a learner under its new
	// id; then it catches up (and still has no vote).
	if _, ok := c.holderOn(wiped, "x"); ok {
		t.Fatal("the wiped node received state before being added")
	}
	nl := c.leader()
	if err := c.Node(nl).AddLearner(newID, c.PeerAddrOf(wiped), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the learner to catch up", 20*time.Second, func() bool {
		h, ok := c.holderOn(wiped, "x")
		return ok && h.Token == tok
	})
	fut := c.Node(nl).Raft().GetConfiguration()
	if err := fut.Error(); err != nil {
		t.Fatal(err)
	}
	for _, s := range fut.Configuration().Servers {
		if string(s.ID) == newID && s.Suffrage != raft.Nonvoter {
			t.Fatalf("the learner has suffrage %v", s.Suffrage)
		}
		if string(s.ID) == oldID && s.Suffrage != raft.Voter {
			t.Fatalf("the old identity changed to %v", s.Suffrage)
		}
	}
}

// The first leader names the fencing domain through the log: every node
// holds the same one, it survives a restart from a snapshot, and the first
// token lies above the bootstrap time in microseconds (and above
// Config.TokenFloor).
func TestFencingDomainIsReplicatedAndTokensStartAboveTheFloor(t *testing.T) {
	start := time.Now()
	floor := uint64(start.UnixMicro()) + 5_000_000_000 // in the future: the floor wins
	c := startClusterOpts(t, local.Options{TokenFloor: floor})
	li := c.leader()
	var domain string
	testkit.WaitFor(t, "every node to know the domain", 10*time.Second, func() bool {
		domain = c.Node(0).Domain()
		for i := 1; i < c.Size(); i++ {
			if c.Node(i).Domain() != domain {
				return false
			}
		}
		return domain != ""
	})
	lc := c.client()
	defer lc.close()
	tok := mustGrant(t, lc.do(acquireMsg("k", "a", 30, 0)))
	if tok <= floor {
		t.Fatalf("first token %d not above the floor %d", tok, floor)
	}
	// Restart a follower from a snapshot: the domain comes back with it.
	fi := (li + 1) % 3
	if err := c.Node(fi).Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(fi); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(fi); err != nil {
		t.Fatal(err)
	}
	if got := c.Node(fi).Domain(); got != domain {
		t.Fatalf("after a restart from a snapshot the domain is %q, want %q", got, domain)
	}
	// A new cluster is a new domain, even on the same machine.
	c2 := startCluster(t, 3)
	c2.leader()
	testkit.WaitFor(t, "the second cluster's domain", 10*time.Second, func() bool { return c2.Node(0).Domain() != "" })
	if d2 := c2.Node(0).Domain(); d2 == domain {
		t.Fatalf("two clusters share the domain %s", d2)
	}
	lc2 := c2.client()
	defer lc2.close()
	if tok2 := mustGrant(t, lc2.do(acquireMsg("k", "a", 30, 0))); tok2 <= uint64(start.UnixMicro()) {
		t.Fatalf("a new domain's first token %d is not above its bootstrap time in µs %d", tok2, start.UnixMicro())
	}
}

// Losing every disk must not silently create a new cluster: empty nodes
// wait. Creating a new domain is the operator's explicit Bootstrap, which
// refuses while any initial voter still has state, and whose tokens start
// above the old domain's.
func TestNewDomainOnlyByExplicitBootstrap(t *testing.T) {
	c := startCluster(t, 3)
	lc := c.client()
	defer lc.close()
	oldTok := mustGrant(t, lc.do(acquireMsg("k", "a", 30, 0)))
	lc.drop()
	oldDomain := c.Domain

	// One disk lost: bootstrapping over it is refused, the others have state.
	if err := c.Wipe(0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bootstrap(0, cluster.BootstrapOptions{Timeout: 5 * time.Second}); !errors.Is(err, cluster.ErrClusterExists) {
		t.Fatalf("bootstrap next to live members: %v, want ErrClusterExists", err)
	}
	// Every disk lost: the nodes come back empty and nothing leads.
	for i := 1; i < 3; i++ {
		if err := c.Wipe(i); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < 3; i++ {
		if err := c.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for i := 1; i < 3; i++ {
			if c.Node(i).Raft().State() == raft.Leader {
				t.Fatal("an empty node made itself leader")
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The operator decides: a new domain, tokens above the old ones.
	os.RemoveAll(filepath.Join(c.Dir, c.ID(0))) // Bootstrap above left an identity
	res, err := c.Bootstrap(0, cluster.BootstrapOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Domain == oldDomain || res.Domain == "" {
		t.Fatalf("new domain %q (old %q)", res.Domain, oldDomain)
	}
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	lc2 := c.client()
	defer lc2.close()
	if tok := mustGrant(t, lc2.do(acquireMsg("k", "b", 30, 0))); tok <= oldTok {
		t.Fatalf("the new domain's token %d is not above the old domain's %d", tok, oldTok)
	}
	testkit.WaitFor(t, "every node in the new domain", 10*time.Second, func() bool {
		for i := 0; i < 3; i++ {
			if c.Node(i).Domain() != res.Domain {
				return false
			}
		}
		return true
	})
}

// Bootstrap fails closed when an initial voter cannot read its Raft
// state: that voter answers nothing rather than "no state", so Bootstrap
// refuses (no answer from it) instead of creating a cluster over it.
func TestBootstrapRefusedWhenAVoterCannotReadItsState(t *testing.T) {
	c := startCluster(t, 3)
	for i := 0; i < 3; i++ {
		if err := c.Wipe(i); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < 3; i++ {
		if err := c.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	// Node 1's snapshot store becomes unreadable: its directory
	// (raft.FileSnapshotStore's, DATA-DIR/snapshots/snapshots) replaced by
	// a file, so raft.HasExistingState fails listing snapshots.
	snaps := filepath.Join(c.Dir, c.ID(1), "snapshots", "snapshots")
	if err := os.RemoveAll(snaps); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(snaps, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bootstrap(0, cluster.BootstrapOptions{Timeout: 3 * time.Second}); err == nil {
		t.Fatal("bootstrap succeeded although a voter could not tell whether it has state")
	}
	store, err := cluster.OpenLogStore(filepath.Join(c.Dir, c.ID(0)), cluster.DefaultConfig().LogStore)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = store.Close() }() // closed again below: the second close fails harmlessly
	if last, err := store.LastIndex(); err != nil || last != 0 {
		t.Fatalf("the refused bootstrap wrote a log: last index %d, %v", last, err)
	}
	// Readable again, the same bootstrap goes through.
	if err := os.Remove(snaps); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(snaps, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bootstrap(0, cluster.BootstrapOptions{Timeout: 10 * time.Second}); err != nil {
		t.Fatalf("bootstrap with every voter readable: %v", err)
	}
}
