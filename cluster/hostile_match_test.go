package cluster_test

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// hostileClient is a client that holds the cluster's client secret and
// speaks the wire protocol frame by frame, one request at a time.
type hostileClient struct {
	t    *testing.T
	conn net.Conn
	r    *wire.Reader
	id   uint64
}

func (c *testCluster) hostile(i int) *hostileClient {
	conn, r := c.rawConn(i)
	return &hostileClient{t: c.t, conn: conn, r: r}
}

// do sends m under the next id and returns its reply (notices skipped).
func (h *hostileClient) do(m wire.Msg) wire.Msg {
	h.t.Helper()
	h.id++
	m.ID = h.id
	rawSend(h.t, h.conn, m)
	for {
		r := rawNext(h.t, h.r)
		if r.Type == wire.TypeNotice {
			continue
		}
		if r.ID != h.id {
			h.t.Fatalf("reply %s to request %d", describe(r), h.id)
		}
		return r
	}
}

// openVictimSession opens a broker's session on a raw connection to node
// li, as a sidecar does, and returns it with its id.
func openVictimSession(t *testing.T, c *testCluster, li int) (*sessionConn, uint64) {
	t.Helper()
	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	sid := binary.BigEndian.Uint64(idb[:])>>1 | 1
	const attach = 1 << 40 // the open's id, above every seq
	sc := c.sessionConn(li)
	sc.send(wire.Msg{Type: wire.TypeOpenSession, ID: attach, Session: sid, TimeoutMs: 20_000, Secret: secret})
	if m := sc.next(); m.Type != wire.TypeOK || m.ID != attach {
		t.Fatalf("open: %s", describe(m))
	}
	return sc, sid
}

// Invariant 6 (issue 39, finding 8): a client that holds the client
// secret cannot release or extend another host's lock, and learns nothing
// from trying. One victim holds its key through a broker's session, as a
// sidecar does; another holds its key on a plain connection under an
// owner with a random part, as a sidecar's owners now have. The hostile
// client reads last_token from the status reply, probes tokens around it
// and guesses owners of the old "<hostname>/<pid>.<n>" form for releases
// and extends of both keys, and then names the session victim's key,
// token and owner exactly, without a session and from a session of its
// own. Every answer is the same E not_held with the same text; both locks
// stay held by their victims, unextended, on every replica; and each
// victim still releases its own lock.
//
// Before the fix the answers told a wrong token (token_mismatch) from a
// wrong owner with the right token (owner_mismatch), and the exact key,
// token and owner released the session's lock from any connection.
func TestHostileCannotReleaseOrExtendAnotherHostsLock(t *testing.T) {
	c := startClusterOpts(t, local.Options{})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 9", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionStrictMatch
	})

	// Victim 1: a broker's session holds seats/1.
	sc, _ := openVictimSession(t, c, li)
	const sessionOwner = "box-a/4242.1"
	acq := acquireMsg("seats/1", sessionOwner, 120, 0)
	acq.ID = 1
	sc.send(acq)
	g := sc.next()
	if g.Type != wire.TypeGranted || g.ID != 1 {
		t.Fatalf("victim's session acquire: %s", describe(g))
	}
	tok1 := g.Token

	// Victim 2: a session-less connection holds seats/2 under an owner
	// with an unguessable part.
	plain := c.dial(li)
	const plainOwner = "box-b/77.9f3ac1d27b4e8a60.3"
	tok2 := mustGrant(t, do(t, plain, acquireMsg("seats/2", plainOwner, 120, 0)))

	h := c.hostile(li)
	st := h.do(wire.Msg{Type: wire.TypeStatus})
	if st.Type != wire.TypeStatusR || st.LastToken != tok2 {
		t.Fatalf("status: %s, want last_token %d", describe(st), tok2)
	}

	answers := map[string]int{}
	tries := 0
	try := func(m wire.Msg) {
		t.Helper()
		tries++
		r := h.do(m)
		if r.Type != wire.TypeError || r.Code != wire.CodeNotHeld {
			t.Fatalf("%s %s token %d owner %q: %s, want E not_held", wire.TypeName(m.Type), m.Key, m.Token, m.Owner, describe(r))
		}
		answers[fmt.Sprintf("%d %q", r.Code, r.Text)]++
	}
	probe := func(key, owner string, token uint64) {
		t.Helper()
		try(releaseMsg(key, owner, token))
		try(wire.Msg{Type: wire.TypeExtend, Key: key, Owner: owner, Token: token, Lease: 250})
	}
	// Token probes around last_token, then owner guesses with each
	// victim's right token: the old attack needed 1 and 68 of them.
	for _, key := range []string{"seats/1", "seats/2", "seats/3"} {
		for tok := st.LastToken - 3; tok <= st.LastToken+1; tok++ {
			probe(key, "box-a/4241.1", tok)
		}
	}
	for pid := 4240; pid < 4245; pid++ {
		for n := 0; n < 7; n++ {
			probe("seats/1", fmt.Sprintf("box-a/%d.%d", pid, n), tok1)
			probe("seats/2", fmt.Sprintf("box-b/%d.%d", pid-4240+75, n), tok2)
		}
	}
	// Even the session victim's exact key, token and owner: not from a
	// connection without its session...
	probe("seats/1", sessionOwner, tok1)
	// ...nor from a session of the hostile client's own.
	hs, _ := openVictimSession(t, c, li)
	rel := releaseMsg("seats/1", sessionOwner, tok1)
	rel.ID = 1
	ext := wire.Msg{Type: wire.TypeExtend, ID: 2, Key: "seats/1", Owner: sessionOwner, Token: tok1, Lease: 250}
	hs.send(rel, ext)
	for range 2 {
		r := hs.next()
		if r.Type != wire.TypeError || r.Code != wire.CodeNotHeld {
			t.Fatalf("from another session: %s, want E not_held", describe(r))
		}
		tries++
		answers[fmt.Sprintf("%d %q", r.Code, r.Text)]++
	}
	if len(answers) != 1 {
		t.Fatalf("%d tries got %d distinguishable answers: %v", tries, len(answers), answers)
	}

	// Nothing moved: both victims hold their keys on every replica, and
	// neither lease was renewed by a stranger.
	c.converged("seats/1", locksm.Holder{Owner: sessionOwner, Token: tok1}, true)
	c.converged("seats/2", locksm.Holder{Owner: plainOwner, Token: tok2}, true)
	for i := 0; i < c.Size(); i++ {
		for _, key := range []string{"seats/1", "seats/2"} {
			if hd, _ := c.holderOn(i, key); hd.RenewedAt != 0 || hd.LeaseSec != 120 {
				t.Errorf("node %d: %s extended by a stranger: %+v", i, key, hd)
			}
		}
	}

	// Each victim still releases its own lock.
	vrel := releaseMsg("seats/1", sessionOwner, tok1)
	vrel.ID = 2
	sc.send(vrel)
	if r := sc.next(); r.Type != wire.TypeOK || r.ID != 2 {
		t.Fatalf("the victim's own release: %s", describe(r))
	}
	mustType(t, do(t, plain, releaseMsg("seats/2", plainOwner, tok2)), wire.TypeOK)
}

// Until every member speaks version 9 the cluster applies the older
// matching rule on every replica (a version 8 member would apply it), so
// a mixed cluster never applies one entry two ways: a wrong token and a
// wrong owner are answered apart, and a session's holding is matched by
// token and owner. This pins the switch the cluster version makes.
func TestLegacyMatchingBelowVersion9(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionLabels }})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 8", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() == wire.VersionLabels
	})
	a := c.dial(li)
	tok := mustGrant(t, do(t, a, acquireMsg("k", "alice", 60, 0)))
	if r := do(t, a, releaseMsg("k", "alice", tok+1)); r.Type != wire.TypeError || r.Code != wire.CodeTokenMismatch {
		t.Fatalf("wrong token below version 9: %s, want token_mismatch", describe(r))
	}
	if r := do(t, a, releaseMsg("k", "bob", tok)); r.Type != wire.TypeError || r.Code != wire.CodeOwnerMismatch {
		t.Fatalf("wrong owner below version 9: %s, want owner_mismatch", describe(r))
	}

	sc, _ := openVictimSession(t, c, li)
	acq := acquireMsg("s", "carol", 60, 0)
	acq.ID = 1
	sc.send(acq)
	g := sc.next()
	if g.Type != wire.TypeGranted {
		t.Fatalf("session acquire: %s", describe(g))
	}
	mustType(t, do(t, a, releaseMsg("s", "carol", g.Token)), wire.TypeOK)
	c.converged("s", locksm.Holder{}, false)
}
