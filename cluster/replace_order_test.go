package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// history is the configurations in the log of the node that leads now,
// from index after on.
func (c *testCluster) history(after uint64) []cluster.ConfigEntry {
	c.t.Helper()
	hs, err := cluster.ConfigHistory(c.Node(c.leader()))
	if err != nil {
		c.t.Fatal(err)
	}
	var out []cluster.ConfigEntry
	for _, h := range hs {
		if h.Index > after {
			out = append(out, h)
		}
	}
	return out
}

func lastIndex(hs []cluster.ConfigEntry) uint64 {
	if len(hs) == 0 {
		return 0
	}
	return hs[len(hs)-1].Index
}

// replaceLogged runs AdminCluster.Replace and returns its progress lines.
func (c *testCluster) replaceLogged(t *testing.T, oldID, newID, addr string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var lines []string
	if err := c.admin().Replace(ctx, oldID, newID, addr, func(s string) { t.Log(s); lines = append(lines, s) }); err != nil {
		t.Fatalf("replace %s by %s: %v", oldID, newID, err)
	}
	return lines
}

// waitCaughtUp waits until the leader's members reply shows id answering
// within MaxPromoteLag.
func (c *testCluster) waitCaughtUp(id string) {
	c.t.Helper()
	testkit.WaitFor(c.t, id+" to catch up", 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rep, err := c.admin().Do(ctx, wire.AdminRequest{Op: "members"})
		if err != nil {
			return false
		}
		for _, m := range rep.Members {
			if m.ServerID == id {
				return m.Answers && m.Lag >= 0 && m.Lag <= cluster.MaxPromoteLag
			}
		}
		return false
	})
}

// A healthy voter of five is replaced promote-first: the configuration goes
// 5 voters + learner → 6 voters → 5 voters without OLD, the 6-voter one
// followed at once by the removal (one leader-side step). Plain promote
// still refuses the 6th voter, and the step refuses an OLD that does not
// answer or a learner that does not, adding no voter.
func TestReplaceHealthyVoterPromotesFirst(t *testing.T) {
	c := startClusterOpts(t, local.Options{Nodes: 6, Voters: 5, TLS: true, AdminSecret: adminSecret})
	li := c.leader()
	old, spare := (li+1)%5, 5
	oldID, newID := c.Node(old).ServerID(), c.Node(spare).ServerID()
	start := lastIndex(c.history(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := c.admin()
	if _, err := a.Do(ctx, wire.AdminRequest{Op: "add-learner", ID: newID, Addr: c.PeerAddrOf(spare)}); err != nil {
		t.Fatal(err)
	}
	c.waitCaughtUp(newID)
	_, err := a.Do(ctx, wire.AdminRequest{Op: "promote", ID: newID})
	if !errors.Is(err, cluster.ErrUnsafeChange) || !strings.Contains(err.Error(), "members replace") {
		t.Fatalf("plain promote to a 6th voter: %v, want unsafe pointing at replace", err)
	}
	// A learner that does not answer is never promoted in the step.
	if _, err := a.Do(ctx, wire.AdminRequest{Op: "add-learner", ID: "n9/aaaaaaaaaa", Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Do(ctx, wire.AdminRequest{Op: "promote", ID: "n9/aaaaaaaaaa", Replaces: oldID}); !errors.Is(err, cluster.ErrLearnerLagging) {
		t.Fatalf("promote of a silent learner replacing %s: %v", oldID, err)
	}
	if _, err := a.Do(ctx, wire.AdminRequest{Op: "remove", ID: "n9/aaaaaaaaaa"}); err != nil {
		t.Fatal(err)
	}
	// An OLD that does not answer must be removed first: the step refuses.
	if err := c.Stop(old); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Do(ctx, wire.AdminRequest{Op: "promote", ID: newID, Replaces: oldID}); !errors.Is(err, cluster.ErrUnsafeChange) {
		t.Fatalf("promote replacing a stopped voter: %v, want unsafe", err)
	}
	if err := c.Restart(old); err != nil {
		t.Fatal(err)
	}
	c.waitCaughtUp(oldID)
	for _, h := range c.history(start) {
		if len(h.Voters) != 5 {
			t.Fatalf("a refused step changed the voters: %+v", h)
		}
	}
	mid := lastIndex(c.history(0))

	lines := c.replaceLogged(t, oldID, newID, c.PeerAddrOf(spare))
	if !strings.Contains(strings.Join(lines, "\n"), "in one step") {
		t.Fatalf("replace did not take the promote-first step: %q", lines)
	}
	hs := c.history(mid)
	if len(hs) != 2 || len(hs[0].Voters) != 6 || !slices.Contains(hs[0].Voters, newID) ||
		len(hs[1].Voters) != 5 || slices.Contains(hs[1].Voters, oldID) || slices.Contains(hs[1].Learners, oldID) {
		t.Fatalf("configurations of the replacement: %+v; want 6 voters, then at once 5 without %s", hs, oldID)
	}
	// Again: nothing to do, nothing changes.
	c.replaceLogged(t, oldID, newID, c.PeerAddrOf(spare))
	if hs2 := c.history(mid); len(hs2) != 2 {
		t.Fatalf("a second replace changed the configuration: %+v", hs2)
	}
}

// The leader of three is replaced by a healthy spare: it hands its
// leadership over, the new leader runs the promote-and-remove step; the
// cluster never has a 4th voter outside that step.
func TestReplaceLeaderHandsOverFirst(t *testing.T) {
	c := startClusterOpts(t, local.Options{Nodes: 4, Voters: 3, TLS: true, AdminSecret: adminSecret})
	li := c.leader()
	oldID, newID := c.Node(li).ServerID(), c.Node(3).ServerID()
	start := lastIndex(c.history(0))
	c.replaceLogged(t, oldID, newID, c.PeerAddrOf(3))
	if nl := c.leader(); nl == li {
		t.Fatalf("%s still leads after its replacement", oldID)
	}
	hs := c.history(start)
	if len(hs) != 3 || len(hs[0].Learners) != 1 || len(hs[1].Voters) != 4 || len(hs[2].Voters) != 3 ||
		slices.Contains(hs[2].Voters, oldID) || !slices.Contains(hs[2].Voters, newID) {
		t.Fatalf("configurations: %+v; want learner, 4 voters, then 3 without %s", hs, oldID)
	}
}

// A voter of three that does not answer is removed first: the
// configurations go 3 → 2 voters → 2 + learner → 3, never 4 voters (which,
// with one of them dead, would need 3 of 3 answering to commit).
func TestReplaceDeadVoterRemovesFirst(t *testing.T) {
	c := startClusterOpts(t, local.Options{Nodes: 4, Voters: 3, TLS: true, AdminSecret: adminSecret})
	li := c.leader()
	dead := (li + 1) % 3
	oldID, newID := c.Node(dead).ServerID(), c.Node(3).ServerID()
	start := lastIndex(c.history(0))
	if err := c.Stop(dead); err != nil {
		t.Fatal(err)
	}
	lines := c.replaceLogged(t, oldID, newID, c.PeerAddrOf(3))
	if !strings.HasPrefix(lines[0], "remove "+oldID+" first") {
		t.Fatalf("first step %q, want the removal of %s", lines[0], oldID)
	}
	hs := c.history(start)
	if len(hs) != 3 || len(hs[0].Voters) != 2 || slices.Contains(hs[0].Voters, oldID) ||
		len(hs[1].Learners) != 1 || len(hs[2].Voters) != 3 || !slices.Contains(hs[2].Voters, newID) {
		t.Fatalf("configurations: %+v; want 2 voters, a learner, then 3 with %s", hs, newID)
	}
	lc := c.client()
	defer lc.close()
	mustGrant(t, lc.do(acquireMsg("after", "o", 10, 0)))
}

// A replacement cut short after the promotion (both OLD and NEW voting) is
// finished by running replace again: it only removes OLD.
func TestReplaceFinishesHalfDoneRun(t *testing.T) {
	c := startClusterOpts(t, local.Options{Nodes: 4, Voters: 3, TLS: true, AdminSecret: adminSecret})
	li := c.leader()
	old := (li + 2) % 3
	oldID, newID := c.Node(old).ServerID(), c.Node(3).ServerID()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := c.admin()
	if _, err := a.Do(ctx, wire.AdminRequest{Op: "add-learner", ID: newID, Addr: c.PeerAddrOf(3)}); err != nil {
		t.Fatal(err)
	}
	c.waitCaughtUp(newID)
	if _, err := a.Do(ctx, wire.AdminRequest{Op: "promote", ID: newID}); err != nil {
		t.Fatal(err)
	}
	mid := lastIndex(c.history(0))
	c.replaceLogged(t, oldID, newID, c.PeerAddrOf(3))
	hs := c.history(mid)
	if len(hs) != 1 || len(hs[0].Voters) != 3 || slices.Contains(hs[0].Voters, oldID) {
		t.Fatalf("configurations: %+v; want one removal of %s", hs, oldID)
	}
}

// With a majority of the voters down no order is safe (nothing commits):
// replace refuses with ErrNoQuorum and says what to do, instead of
// retrying until its deadline.
func TestReplaceRefusedWithoutMajority(t *testing.T) {
	c := startClusterOpts(t, local.Options{Nodes: 4, Voters: 3, TLS: true, AdminSecret: adminSecret})
	li := c.leader()
	oldID, newID := c.Node((li+1)%3).ServerID(), c.Node(3).ServerID()
	for _, i := range []int{(li + 1) % 3, (li + 2) % 3} {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	a := c.admin()
	a.NoLeaderWait = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := a.Replace(ctx, oldID, newID, c.PeerAddrOf(3), func(s string) { t.Log(s) })
	if !errors.Is(err, cluster.ErrNoQuorum) || ctx.Err() != nil || !strings.Contains(err.Error(), "The majority is lost for good") {
		t.Fatalf("replace without a majority: %v (ctx %v); want ErrNoQuorum with the runbook's advice", err, ctx.Err())
	}
	t.Logf("refused: %v", err)
}

// Remove is relaxed only where the tolerance does not drop: the dead voter
// of three may go (2 voters survive 0 failures, as 3 with one dead do), a
// healthy one of the remaining two may not.
func TestRemoveDeadVoterOfThree(t *testing.T) {
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret})
	li := c.leader()
	dead, other := (li+1)%3, (li+2)%3
	if err := c.Node(li).Remove(c.Node(other).ServerID(), 5*time.Second); !errors.Is(err, cluster.ErrUnsafeChange) {
		t.Fatalf("removing a healthy voter of 3: %v", err)
	}
	deadID := c.Node(dead).ServerID()
	if err := c.Stop(dead); err != nil {
		t.Fatal(err)
	}
	if err := c.Node(li).Remove(deadID, 10*time.Second); err != nil {
		t.Fatalf("removing the dead voter of 3: %v", err)
	}
	ms, err := c.Node(li).Members()
	if err != nil || len(ms) != 2 {
		t.Fatalf("members %+v %v", ms, err)
	}
	if err := c.Node(li).Remove(c.Node(other).ServerID(), 5*time.Second); !errors.Is(err, cluster.ErrUnsafeChange) {
		t.Fatalf("removing a healthy voter of 2: %v", err)
	}
	lc := c.client()
	defer lc.close()
	mustGrant(t, lc.do(acquireMsg("k", "o", 10, 0)))
}

// The JSON keys of a members reply and of a status report's members are
// the ones cluster/wire/PROTOCOL.md lists (so the contract cannot drift).
func TestAdminMemberJSONMatchesProtocol(t *testing.T) {
	b, err := os.ReadFile("wire/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(string(b)), " ")
	keysOf := func(v any) []string {
		raw, _ := json.Marshal(v)
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		return slices.Sorted(maps.Keys(m))
	}
	// "`members` lists every server as `{"ServerID", ...}`"
	_, rest, ok := strings.Cut(doc, "`members` lists every server as `{")
	list, _, ok2 := strings.Cut(rest, "}`")
	if !ok || !ok2 {
		t.Fatal("PROTOCOL.md no longer lists the members reply's keys")
	}
	var documented []string
	for _, k := range strings.Split(list, ",") {
		documented = append(documented, strings.Trim(strings.TrimSpace(k), `"`))
	}
	slices.Sort(documented)
	if got := keysOf(wire.AdminMember{FoundAtAddr: "x"}); !slices.Equal(got, documented) {
		t.Fatalf("members reply keys %v, PROTOCOL.md lists %v", got, documented)
	}
	// The status row names every member key in backquotes.
	_, row, _ := strings.Cut(doc, "| `status` | any node;")
	row, _, _ = strings.Cut(row, "| `inspect` |")
	for _, k := range keysOf(wire.MemberReport{FoundAtAddr: "x"}) {
		if !strings.Contains(row, "`"+k+"`") {
			t.Errorf("PROTOCOL.md's status row does not name the member key %q", k)
		}
	}
}

// Replace adds NEW only once it answers the leader, so that its protocol
// version is checked (issue 39, finding 10): run before the new machine is
// up, it waits for NEW, and gives up after NewNodeWait naming it, with NEW
// not added; when NEW comes up running version 6 in a cluster at version
// 8, it is refused (not added) with an error naming its version and the
// cluster's; at version 8 the same NEW is swapped in. Before, replace added
// NEW unchecked while it was down, then promoted it.
func TestReplaceWaitsForTheNewNodeToAnswer(t *testing.T) {
	c, li := startNewestVersion(t, local.Options{Nodes: 4, Voters: 3, AdminSecret: adminSecret})
	old := (li + 1) % 3
	oldID, newID, addr := c.Node(old).ServerID(), c.Node(3).ServerID(), c.PeerAddrOf(3)
	if err := c.Stop(3); err != nil {
		t.Fatal(err)
	}
	notMember := func(when string) {
		t.Helper()
		ms, err := c.Node(c.leader()).Members()
		if err != nil {
			t.Fatal(err)
		}
		if m, ok := memberOf(ms, newID); ok {
			t.Fatalf("%s: %s is a member (%+v)", when, newID, m)
		}
	}
	replace := func(wait time.Duration, progress func(string)) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		a := c.admin()
		a.NewNodeWait = wait
		err := a.Replace(ctx, oldID, newID, addr, func(s string) { t.Log(s); progress(s) })
		if ctx.Err() != nil {
			t.Fatalf("replace ran until its context ended: %v", err)
		}
		return err
	}

	// NEW never comes up.
	err := replace(2*time.Second, func(string) {})
	if !errors.Is(err, wire.ErrLearnerLagging) || !strings.Contains(err.Error(), newID) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("replace with NEW down: %v; want ErrLearnerLagging naming %s at %s", err, newID, addr)
	}
	t.Logf("gave up: %v", err)
	notMember("NEW never answered")

	// NEW comes up at version 6 while replace waits for it.
	started := false
	err = replace(30*time.Second, func(s string) {
		if !started && strings.Contains(s, "does not answer") {
			started = true
			if err := c.RestartWith(3, atVersion6); err != nil {
				t.Error(err)
			}
		}
	})
	if !started {
		t.Fatal("replace did not wait for NEW")
	}
	if !errors.Is(err, wire.ErrUnsafeChange) || !strings.Contains(err.Error(), "version 6") || !strings.Contains(err.Error(), fmt.Sprintf("cluster version %d", wire.ProtocolVersion)) {
		t.Fatalf("replace with NEW at version 6: %v; want ErrUnsafeChange naming its version and the cluster's", err)
	}
	t.Logf("refused: %v", err)
	notMember("NEW at version 6")

	// Upgraded, the same NEW is swapped in.
	if err := c.Stop(3); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartWith(3, func(cfg *cluster.Config) { cfg.ProtocolVersion = 0 }); err != nil {
		t.Fatal(err)
	}
	if err := replace(30*time.Second, func(string) {}); err != nil {
		t.Fatalf("replace with NEW at version 8: %v", err)
	}
	ms, err := c.Node(c.leader()).Members()
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := memberOf(ms, newID); !ok || !m.Voter || voters(ms) != 3 {
		t.Fatalf("members after the replacement: %+v", ms)
	}
}
