package cluster_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// a42SessionConn is a raw version 14 connection of a broker's session.
func a42SessionConn(c *testCluster, i int) *sessionConn {
	c.t.Helper()
	conn, r, peer := c.rawConnVersion(i, wire.VersionRevoke)
	if peer.Version != wire.VersionRevoke {
		c.t.Fatalf("negotiated version %d, want %d", peer.Version, wire.VersionRevoke)
	}
	return &sessionConn{t: c.t, conn: conn, r: r}
}

// a42Start: 3 real nodes over TCP with an admin port, cluster version 14.
func a42Start(t *testing.T) (*testCluster, int) {
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 14", 40*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionRevoke
	})
	return c, li
}

// Attack 42, finding 1: a revoke of a session's grant that its broker was
// never told (the broker's connection was down when the key was handed to
// its waiter) is "told" to nobody: the broker resumes and the leader
// replays the kept outcome, G with the revoked token, and no lost event
// follows. The broker hands its application a lock that an operator
// already revoked and that the next waiter already holds with a larger
// token: two holders that both were told "granted", and the revoke's
// promise (the holder is told, reason revoked) is broken.
//
// Sequence: holder H holds "hot"; session S queues seq 1 on "hot";
// session-less N queues behind it; S's broker connection closes; H
// releases (hand-off to S, untold); operator revokes S's token T (admin
// port; N is granted T+1 in the same commit); S's broker resumes with
// High 1 and its ack: the leader answers G(id 1, token T), then K; no X.
func TestAttack42_RevokedUntoldSessionGrantReplayedOnResume(t *testing.T) {
	c, li := a42Start(t)
	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	const sid = 4242
	const attach = 1 << 40
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tS, tN, ack := a42UntoldRevoked(t, c, li, ctx, sid, attach, secret)

	// The broker resumes.
	grantedRevoked, lostTold := a42ResumeSees(t, c, li, sid, attach, secret, ack, tS)
	if grantedRevoked && !lostTold {
		t.Fatalf("the resumed broker was told G token %d, which the operator revoked (next holds %d), and never told it is lost: two holders of hot", tS, tN)
	}
	if !lostTold {
		t.Fatalf("the revoked session holder (token %d) was never told of the revoke", tS)
	}
}

// Attack 42, finding 1b: the same with a grant the broker was told. The
// session's broker holds "k" (G read, acked), its connection drops (a
// partition, a broker restart's reconnect), the operator revokes the
// token while it is away: the lost event goes to the open connections of
// that moment, none of them the broker's. The broker resumes within its
// session timeout: nothing tells it the holding ended (no X, no outcome),
// though MATRIX.md says the Revoked effect carries (session, seq) "so
// the leader can tell that session's broker". It keeps the lock for the
// rest of its lease while the waiter holds it with a larger token.
func TestAttack42_RevokeWhileBrokerAwayNeverTold(t *testing.T) {
	c, li := a42Start(t)
	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	const sid = 4343
	const attach = 1 << 40
	sc := a42SessionConn(c, li)
	sc.send(wire.Msg{Type: wire.TypeOpenSession, ID: attach, Session: sid, TimeoutMs: 30_000, Secret: secret})
	if m := sc.next(); m.Type != wire.TypeOK {
		t.Fatalf("open: %s", describe(m))
	}
	w := acquireMsg("k", "broker", 120, 0)
	w.ID = 1
	sc.send(w)
	g := sc.next()
	tS := mustGrant(t, g)
	// Ack it (stamped into a next command: a ping-like ack).
	sc.send(wire.Msg{Type: wire.TypeSessionAck, ID: attach + 1, Serial: sc.ack})
	if m := sc.next(); m.Type != wire.TypeOK {
		t.Fatalf("ack: %s", describe(m))
	}
	ack := sc.ack
	conns := cluster.ClientConns(c.Node(li))
	sc.conn.Close()
	testkit.WaitFor(t, "the node saw the broker's connection close", 15*time.Second, func() bool {
		return cluster.ClientConns(c.Node(li)) < conns
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.admin().Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "k", Token: tS, By: "ops", Reason: "stuck"}); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	tN := mustGrant(t, do(t, c.dial(li), acquireMsg("k", "next", 60, 0)))

	rc := a42SessionConn(c, li)
	rc.send(wire.Msg{Type: wire.TypeResume, ID: attach, Session: sid, Secret: secret, High: 1, Serial: ack})
	lostTold := false
	deadline := time.Now().Add(5 * time.Second)
	_ = rc.conn.SetReadDeadline(deadline)
	for time.Now().Before(deadline) {
		var m wire.Msg
		if err := rc.r.ReadMsg(&m); err != nil {
			break
		}
		t.Logf("resumed broker reads %s", describe(m))
		if m.Type == wire.TypeLost && m.Token == tS {
			lostTold = true
		}
	}
	if !lostTold {
		t.Fatalf("the session's broker resumed after its holding %d was revoked (next holds %d) and was never told: it holds the lock in its own eyes until its lease ends", tS, tN)
	}
}

// Attack 42, finding 1c: the lost event follows the connection the grant
// was told on, not the session that holds it. A broker's session holds
// "k" (told on connection A); the broker takes A for dead (a one-way
// fault: the node's frames stopped reaching it) and resumes its session
// on connection B, while the node still has A open (it learns of A's death
// only at the session's silence bound or TCP's timeout). The operator
// revokes the holding: the X goes to A alone (told[token] = A, open), and
// B — the session's attached connection, its broker's only live link —
// hears nothing.
func TestAttack42_RevokeLostEventGoesToStaleConnNotSession(t *testing.T) {
	c, li := a42Start(t)
	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	const sid = 4444
	const attach = 1 << 40
	a := a42SessionConn(c, li)
	a.send(wire.Msg{Type: wire.TypeOpenSession, ID: attach, Session: sid, TimeoutMs: 30_000, Secret: secret})
	if m := a.next(); m.Type != wire.TypeOK {
		t.Fatalf("open: %s", describe(m))
	}
	w := acquireMsg("k", "broker", 120, 0)
	w.ID = 1
	a.send(w)
	tS := mustGrant(t, a.next())
	a.send(wire.Msg{Type: wire.TypeSessionAck, ID: attach + 1, Serial: a.ack})
	if m := a.next(); m.Type != wire.TypeOK {
		t.Fatalf("ack: %s", describe(m))
	}
	// The broker gives up on A (without closing it: half-open) and
	// resumes on B.
	b := a42SessionConn(c, li)
	b.send(wire.Msg{Type: wire.TypeResume, ID: attach + 2, Session: sid, Secret: secret, High: 1, Serial: a.ack})
	for {
		m := b.next()
		if m.Type == wire.TypeOK && m.ID == attach+2 {
			break
		}
		if m.Type == wire.TypeError {
			t.Fatalf("resume: %s", describe(m))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.admin().Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "k", Token: tS, By: "ops", Reason: "stuck"}); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	got := func(sc *sessionConn) bool {
		deadline := time.Now().Add(3 * time.Second)
		_ = sc.conn.SetReadDeadline(deadline)
		for {
			var m wire.Msg
			if err := sc.r.ReadMsg(&m); err != nil {
				return false
			}
			if m.Type == wire.TypeLost && m.Token == tS {
				return true
			}
		}
	}
	onB, onA := got(b), got(a)
	if !onB {
		t.Fatalf("the session's attached connection B was not told of the revoke of %d (the stale connection A was told: %v)", tS, onA)
	}
}

// Attack 42, finding 6 (disclosure): once the holder's connection has
// closed, the revoke's X — the operator's identity and free-text reason
// included — was broadcast to every open version 14 connection: any
// client of the cluster, holding nothing, read who revoked whose lock
// and why. Now the broadcast names neither.
func TestAttack42_RevokeReasonBroadcastToBystanders(t *testing.T) {
	c, li := a42Start(t)
	var lost lostEvents
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bystander, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID,
		TLS: c.ClientTLS, OnLost: lost.add})
	if err != nil {
		t.Fatal(err)
	}
	defer bystander.Close()
	holder := c.dial(li)
	tA := mustGrant(t, do(t, holder, acquireMsg("payroll", "alice", 120, 0)))
	conns := cluster.ClientConns(c.Node(li))
	holder.Close()
	testkit.WaitFor(t, "holder's connection closed at the node", 10*time.Second, func() bool {
		return cluster.ClientConns(c.Node(li)) < conns
	})
	if _, err := c.admin().Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "payroll", Token: tA, By: "secops",
		Reason: "alice under investigation"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	// The event itself goes to every connection, as an expiry's does (a
	// holder that reconnected must hear it); who and why do not.
	for _, ev := range lost.list() {
		if ev.Token == tA && (ev.Owner != "" || ev.Text != "") {
			t.Fatalf("a bystander that holds nothing read the revoke of alice's lock: by %q, why %q", ev.Owner, ev.Text)
		}
	}
}

// a42UntoldRevoked plays the scenario of the resume findings: holder H
// holds "hot"; session sid's broker queues seq 1 on it, a session-less
// waiter "next" behind; the broker's connection closes; H releases (the
// key goes to the session, untold); the operator revokes that grant's
// token tS, and next is granted tN. ctx bounds the rest of the test.
func a42UntoldRevoked(t *testing.T, c *testCluster, li int, ctx context.Context, sid uint64, attach uint64, secret [wire.SecretLen]byte) (tS, tN, ack uint64) {
	t.Helper()
	holder := c.dial(li)
	hot := mustGrant(t, do(t, holder, acquireMsg("hot", "holder", 120, 0)))

	sc := a42SessionConn(c, li)
	sc.send(wire.Msg{Type: wire.TypeOpenSession, ID: attach, Session: sid, TimeoutMs: 30_000, Secret: secret})
	if m := sc.next(); m.Type != wire.TypeOK {
		t.Fatalf("open: %s", describe(m))
	}
	w := acquireMsg("hot", "broker", 120, 60*time.Second)
	w.ID = 1
	sc.send(w)
	if m := sc.next(); m.Type != wire.TypeQueued {
		t.Fatalf("waiter: %s", describe(m))
	}
	next := c.dial(li)
	behind := make(chan wire.Msg, 1)
	go func() {
		r, _, err := next.Do(context.Background(), acquireMsg("hot", "next", 60, 60*time.Second))
		if err != nil {
			r = wire.Msg{Type: wire.TypeError, Text: err.Error()}
		}
		behind <- r
	}()
	testkit.WaitFor(t, "two waiters queued", 15*time.Second, func() bool {
		n := 0
		c.Node(li).ReadState(func(st *locksm.State) { n = st.QueueLen("hot") })
		return n == 2
	})
	conns := cluster.ClientConns(c.Node(li))
	ack = sc.ack
	sc.conn.Close()
	testkit.WaitFor(t, "the node saw the broker's connection close", 15*time.Second, func() bool {
		return cluster.ClientConns(c.Node(li)) < conns
	})
	mustType(t, do(t, holder, releaseMsg("hot", "holder", hot)), wire.TypeOK)
	testkit.WaitFor(t, "the session's waiter holds hot", 15*time.Second, func() bool {
		c.Node(li).ReadState(func(st *locksm.State) {
			if h, ok := st.Holder("hot"); ok && h.Owner == "broker" {
				tS = h.Token
			}
		})
		return tS != 0
	})

	rep, err := c.admin().Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "hot", Token: tS, By: "ops", Reason: "stuck broker"})
	if err != nil {
		t.Fatalf("revoke: %v", err)
	}
	select {
	case r := <-behind:
		tN = mustGrant(t, r)
	case <-time.After(20 * time.Second):
		t.Fatal("next was not granted after the revoke")
	}
	t.Logf("revoked %d (reply %+v); next holds %d", tS, rep.Revoked, tN)
	return tS, tN, ack
}

// a42ResumeSees resumes session sid (High 1, its ack) and reports whether
// the broker reads, within 5 s, a G of token tS and a lost event of it.
func a42ResumeSees(t *testing.T, c *testCluster, li int, sid, attach uint64, secret [wire.SecretLen]byte, ack, tS uint64) (grantedRevoked, lostTold bool) {
	t.Helper()
	rc := a42SessionConn(c, li)
	rc.send(wire.Msg{Type: wire.TypeResume, ID: attach, Session: sid, Secret: secret, High: 1, Serial: ack})
	deadline := time.Now().Add(5 * time.Second)
	_ = rc.conn.SetReadDeadline(deadline)
	for time.Now().Before(deadline) {
		var m wire.Msg
		if err := rc.r.ReadMsg(&m); err != nil {
			break
		}
		t.Logf("resumed broker reads %s", describe(m))
		switch {
		case m.Type == wire.TypeGranted && m.Token == tS:
			grantedRevoked = true
		case m.Type == wire.TypeLost && m.Token == tS:
			lostTold = true
		}
	}
	return grantedRevoked, lostTold
}
