package cluster_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Attack round 2 on issue 42: round 1's fix tells a resuming broker of
// its session's revoked holdings from the state's revoke records; but the
// state keeps one record per key (the key's LATEST revoke, at most 1024
// keys). A second revoke of the same key (the next holder is stuck too,
// an operator clearing a line), or of a block sharing one of its keys,
// or 1024 revokes of other keys, replaces the record before the broker
// resumes: the resume replays G with the revoked token and no X follows.
// Round 1's finding 1 again: the broker hands its application a revoked
// lock, as valid for most of its lease.
//
// Sequence: as TestAttack42_RevokedUntoldSessionGrantReplayedOnResume,
// plus: after the revoke of the session's token tS hands "hot" to next
// (tN), the operator revokes tN too; then the broker resumes.
func TestAttack42b_SecondRevokeOfKeyErasesSessionsLostEvent(t *testing.T) {
	c, li := a42Start(t)
	holder := c.dial(li)
	hot := mustGrant(t, do(t, holder, acquireMsg("hot", "holder", 120, 0)))

	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	const sid = 4242
	const attach = 1 << 40
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
	ack := sc.ack
	sc.conn.Close()
	testkit.WaitFor(t, "the node saw the broker's connection close", 15*time.Second, func() bool {
		return cluster.ClientConns(c.Node(li)) < conns
	})
	mustType(t, do(t, holder, releaseMsg("hot", "holder", hot)), wire.TypeOK)
	var tS uint64
	testkit.WaitFor(t, "the session's waiter holds hot", 15*time.Second, func() bool {
		c.Node(li).ReadState(func(st *locksm.State) {
			if h, ok := st.Holder("hot"); ok && h.Owner == "broker" {
				tS = h.Token
			}
		})
		return tS != 0
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := c.admin().Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "hot", Token: tS, By: "ops", Reason: "stuck broker"})
	if err != nil {
		t.Fatalf("revoke: %v", err)
	}
	var tN uint64
	select {
	case r := <-behind:
		tN = mustGrant(t, r)
	case <-time.After(20 * time.Second):
		t.Fatal("next was not granted after the revoke")
	}
	t.Logf("revoked %d (reply %+v); next holds %d", tS, rep.Revoked, tN)
	// The next holder is stuck too: the operator revokes it as well. The
	// key's audit record (one per key) is now tN's: the record that named
	// the session's revoked holding, the only thing a resume tells from,
	// is gone.
	if _, err := c.admin().Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "hot", Token: tN, By: "ops", Reason: "stuck too"}); err != nil {
		t.Fatalf("second revoke: %v", err)
	}

	// The broker resumes.
	rc := a42SessionConn(c, li)
	rc.send(wire.Msg{Type: wire.TypeResume, ID: attach, Session: sid, Secret: secret, High: 1, Serial: ack})
	var grantedRevoked, lostTold bool
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
	if grantedRevoked && !lostTold {
		t.Fatalf("the resumed broker was told G token %d, which the operator revoked (handed to %d, revoked in turn: hot is free for anyone), and never told it is lost: its application holds a revoked lock for most of its lease", tS, tN)
	}
	if !lostTold {
		t.Fatalf("the revoked session holder (token %d) was never told of the revoke", tS)
	}
}
