package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// rawSend writes msgs on conn in one write (so the node reads them back to
// back, in order).
func rawSend(t *testing.T, conn net.Conn, msgs ...wire.Msg) {
	t.Helper()
	var b []byte
	for i := range msgs {
		var err error
		if b, err = wire.AppendMsg(b, &msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
}

// rawNext reads the next message.
func rawNext(t *testing.T, r *wire.Reader) wire.Msg {
	t.Helper()
	var m wire.Msg
	if err := r.ReadMsg(&m); err != nil {
		t.Fatalf("reading: %v", err)
	}
	return m
}

// waitAddrsRecorded waits until node i lists every member's client address
// (the leader records the other members' through the log).
func (c *testCluster) waitAddrsRecorded(i int) {
	c.t.Helper()
	testkit.WaitFor(c.t, "every member's client address in the log", 15*time.Second, func() bool {
		ms, err := c.Node(i).Members()
		if err != nil {
			return false
		}
		for _, m := range ms {
			want := ""
			for j := 0; j < c.Size(); j++ {
				if c.Node(j) != nil && c.Node(j).ServerID() == m.ServerID {
					want = c.ClientAddr(j)
				}
			}
			if m.ClientAddr == "" || m.ClientAddr != want {
				return false
			}
		}
		return true
	})
}

// Every member's client address is known to the cluster, not just the
// leaders': a follower that never led is listed with its address, on
// every node (members replies come from any node's own view).
func TestEveryMembersClientAddressIsRecorded(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	for i := 0; i < 3; i++ {
		c.waitAddrsRecorded(i)
	}
	r := do(t, c.dial((li+1)%3), wire.Msg{Type: wire.TypeMembers})
	if r.Type != wire.TypeMembersR || len(r.Members) != 3 {
		t.Fatalf("members reply %+v", r)
	}
	for _, m := range r.Members {
		if m.ClientAddr == "" {
			t.Fatalf("a follower's members reply lists %s without a client address: %+v", m.ServerID, r.Members)
		}
	}
}

// A hand-over whose transfer fails: the clients are told first (the notice
// names the target and its client address), a request written after the
// acknowledgement gets M naming the target (not executed), a queued waiter
// gets a definite T (withdrawn through the log; never U), and when the
// transfer fails the leader serves again, says so, and grants.
func TestHandOverFailedTransferResumesServing(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	ti := (li + 1) % 3
	c.waitAddrsRecorded(li)
	leader, target := c.Node(li), c.Node(ti).ServerID()

	// The only connection to the leader: so its acknowledgement is the
	// last one, and the leader stops serving when it reads it.
	conn, r := c.rawConn(li)
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	first := acquireMsg("k", "holder", 60, 0)
	first.ID = 1
	rawSend(t, conn, first)
	tok := mustGrant(t, rawNext(t, r))
	w := acquireMsg("k", "waiter", 60, 30*time.Second)
	w.ID = 2
	rawSend(t, conn, w)
	testkit.WaitFor(t, "the waiter to queue", 10*time.Second, func() bool {
		var q int
		leader.ReadState(func(st *locksm.State) { q = len(st.Waiters("k")) })
		return q == 1
	})
	// A version 4 connection is told that the waiter queued (progress,
	// not its reply: that is the T below).
	if m := rawNext(t, r); m.Type != wire.TypeQueued || m.ID != 2 {
		t.Fatalf("after the waiter queued: %s, want Q id 2", describe(m))
	}

	// The target cannot be reached: the transfer cannot finish (it cannot
	// even catch up with the waiter's withdrawal).
	c.faults.Cut(c.ID(li), c.ID(ti))
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := leader.HandOver(ctx, target)
		errc <- err
	}()
	n := rawNext(t, r)
	if n.Type != wire.TypeNotice || n.Event != wire.NoticeHandOver || n.LeaderID != target || n.LeaderAddr != c.ClientAddr(ti) {
		t.Fatalf("first frame of the hand-over %+v, want a hand-over notice naming %s at %s", n, target, c.ClientAddr(ti))
	}
	late := acquireMsg("late", "o", 30, 0)
	late.ID = 4
	rawSend(t, conn, wire.Msg{Type: wire.TypeNoticeAck, ID: 3}, late)
	got := map[uint64]wire.Msg{}
	for len(got) < 3 {
		m := rawNext(t, r)
		got[m.ID] = m
	}
	if m := got[3]; m.Type != wire.TypeOK {
		t.Fatalf("acknowledgement answered %s", describe(m))
	}
	if m := got[4]; m.Type != wire.TypeMoved || m.LeaderID != target || m.LeaderAddr != c.ClientAddr(ti) {
		t.Fatalf("acquire during the hand-over: %s, want M naming %s at %s", describe(m), target, c.ClientAddr(ti))
	}
	if m := got[2]; m.Type != wire.TypeTimeout {
		t.Fatalf("the queued waiter got %s, want T (withdrawn, never granted)", describe(m))
	}
	if h, ok := c.holderOn(li, "late"); ok {
		t.Fatalf("the acquire answered M was executed: %+v", h)
	}

	if err := <-errc; err == nil {
		t.Fatal("HandOver to an unreachable target succeeded")
	}
	n = rawNext(t, r)
	if n.Type != wire.TypeNotice || n.Event != wire.NoticeServing || n.LeaderID != leader.ServerID() || n.LeaderAddr != c.ClientAddr(li) {
		t.Fatalf("after the failed transfer %+v, want a serving notice from %s", n, leader.ServerID())
	}
	if !leader.Serving() {
		t.Fatal("the leader does not serve after the failed transfer")
	}
	again := acquireMsg("late", "o", 30, 0)
	again.ID = 5
	rawSend(t, conn, again)
	if t2 := mustGrant(t, rawNext(t, r)); t2 <= tok {
		t.Fatalf("token %d after %d", t2, tok)
	}
	if h, ok := c.holderOn(li, "k"); !ok || h.Token != tok || h.Owner != "holder" {
		t.Fatalf("the holding before the hand-over is %+v (held %v)", h, ok)
	}
	c.faults.Heal()
}

// A hand-over that succeeds: the notice names the chosen target and its
// client address, requests after the acknowledgement get M naming that
// address (never an empty one), and the target serves at the next term.
func TestHandOverNamesTheTarget(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	c.waitAddrsRecorded(li)
	leader := c.Node(li)
	term := leader.Raft().CurrentTerm()
	conn, r := c.rawConn(li)
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	errc := make(chan error, 1)
	toc := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		to, err := leader.HandOver(ctx, "")
		toc <- to
		errc <- err
	}()
	n := rawNext(t, r)
	if n.Type != wire.TypeNotice || n.Event != wire.NoticeHandOver {
		t.Fatalf("got %+v, want a hand-over notice", n)
	}
	ti := -1
	for i := 0; i < 3; i++ {
		if i != li && c.Node(i).ServerID() == n.LeaderID && c.ClientAddr(i) == n.LeaderAddr {
			ti = i
		}
	}
	if ti < 0 {
		t.Fatalf("notice names %s at %q: not another voter at its client address", n.LeaderID, n.LeaderAddr)
	}
	a := acquireMsg("k", "o", 30, 0)
	a.ID = 2
	rawSend(t, conn, wire.Msg{Type: wire.TypeNoticeAck, ID: 1}, a)
	if m := rawNext(t, r); m.Type != wire.TypeOK || m.ID != 1 {
		t.Fatalf("acknowledgement answered %s", describe(m))
	}
	if m := rawNext(t, r); m.Type != wire.TypeMoved || m.LeaderID != n.LeaderID || m.LeaderAddr != n.LeaderAddr {
		t.Fatalf("acquire during the hand-over: %s, want M naming %s at %s", describe(m), n.LeaderID, n.LeaderAddr)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if to := <-toc; to != n.LeaderID {
		t.Fatalf("HandOver returned %q, the notice named %q", to, n.LeaderID)
	}
	testkit.WaitFor(t, "the target to serve", 10*time.Second, func() bool { return c.Node(ti).Serving() })
	if got := c.Node(ti).Raft().CurrentTerm(); got != term+1 {
		t.Fatalf("term %d after a hand-over from term %d", got, term)
	}
	// The old leader, now a follower, names the new leader in M.
	m := do(t, c.dial(li), acquireMsg("k", "o", 30, 0))
	if m.Type != wire.TypeMoved || m.LeaderID != n.LeaderID || m.LeaderAddr != n.LeaderAddr {
		t.Fatalf("acquire at the old leader after the hand-over: %s", describe(m))
	}
}

// A voter that runs protocol version 6 in a cluster at version 8 (a node
// rolled back to an older build) is never handed the leadership: not as
// the best target, even when it is the only other voter that answers, and
// not when named. The leader keeps serving and says which voter is older
// than the cluster version; once a voter at version 8 answers again, it is
// the one chosen. Before issue 39 the older voter was chosen, and led the
// cluster at version 6 (finding 10).
func TestHandOverNeverChoosesAnOlderVoter(t *testing.T) {
	c, li := startNewestVersion(t, local.Options{})
	old, other := (li+1)%3, (li+2)%3
	oldID := c.Node(old).ServerID()
	if err := c.Stop(old); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartWith(old, atVersion6); err != nil {
		t.Fatal(err)
	}
	// The older voter catches up before the other one goes, so that the
	// leader keeps its majority throughout.
	testkit.WaitFor(t, oldID+" to catch up", 20*time.Second, func() bool {
		return c.Node(old).Raft().AppliedIndex() >= c.Node(li).Raft().CommitIndex()
	})
	if err := c.Stop(other); err != nil {
		t.Fatal(err)
	}
	if got := c.leader(); got != li {
		t.Fatalf("node %d leads, not %d", got, li)
	}
	handOver := func(to string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return c.Node(li).HandOver(ctx, to)
	}
	for _, to := range []string{"", oldID} {
		got, err := handOver(to)
		if !errors.Is(err, cluster.ErrNoTarget) {
			t.Fatalf("hand-over (target %q) with only a version 6 voter: to %q, %v; want ErrNoTarget", to, got, err)
		}
		for _, want := range []string{oldID, "version 6", fmt.Sprintf("cluster version %d", wire.ProtocolVersion)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the refusal %q does not say %q", err, want)
			}
		}
		t.Logf("refused: %v", err)
		if !c.Node(li).Serving() {
			t.Fatalf("the leader stopped serving after a refused hand-over")
		}
	}
	if err := c.Restart(other); err != nil {
		t.Fatal(err)
	}
	otherID := c.Node(other).ServerID()
	testkit.WaitFor(t, otherID+" to catch up", 20*time.Second, func() bool {
		return c.Node(other).Raft().AppliedIndex() >= c.Node(li).Raft().CommitIndex()
	})
	got, err := handOver("")
	if err != nil || got != otherID {
		t.Fatalf("hand-over with a version 8 voter back: to %q, %v; want %s", got, err, otherID)
	}
}
