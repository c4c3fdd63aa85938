package cluster_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// startSessionCluster starts 3 real nodes over TCP that speak protocol
// version 7 (sessions, the default), and waits for a serving leader that
// records cluster version 7.
func startSessionCluster(t *testing.T) (*testCluster, int) {
	t.Helper()
	c := startClusterOpts(t, local.Options{})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 7", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionSessions
	})
	return c, li
}

// sessionConn is a raw version 7 connection of a broker's session.
type sessionConn struct {
	t    *testing.T
	conn net.Conn
	r    *wire.Reader
	ack  uint64 // the latest O serial read
}

func (c *testCluster) sessionConn(i int) *sessionConn {
	c.t.Helper()
	conn, r, peer := c.rawConnVersion(i, wire.VersionSessions)
	if peer.Version != wire.VersionSessions {
		c.t.Fatalf("negotiated version %d, want %d", peer.Version, wire.VersionSessions)
	}
	return &sessionConn{t: c.t, conn: conn, r: r}
}

// next reads the next reply or progress frame, skipping notices and
// taking O watermarks as the ack.
func (sc *sessionConn) next() wire.Msg {
	sc.t.Helper()
	for {
		m := rawNext(sc.t, sc.r)
		switch m.Type {
		case wire.TypeNotice:
			continue
		case wire.TypeOutcomes:
			if m.Serial < sc.ack {
				sc.t.Fatalf("O serial %d after %d", m.Serial, sc.ack)
			}
			sc.ack = m.Serial
			continue
		}
		return m
	}
}

func (sc *sessionConn) send(ms ...wire.Msg) { sc.t.Helper(); rawSend(sc.t, sc.conn, ms...) }

// The line survives the leader (issue 31): a broker's session on a real
// 3-node cluster over TCP queues waiters on a hot key, the leader is
// killed, and the broker resumes on the new leader: every waiter is
// answered "still queued" (Q, in order), then granted in the order it was
// queued as the key is handed on; nothing was resent, nothing answered
// Indeterminate. A resume with a wrong secret is refused bad_session and
// its connection closed.
func TestSessionWaitersSurviveLeaderKill(t *testing.T) {
	c, li := startSessionCluster(t)
	holder := c.dial(li)
	hot := mustGrant(t, do(t, holder, acquireMsg("hot", "holder", 120, 0)))

	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	sid := binary.BigEndian.Uint64(idb[:])>>1 | 1
	const attach = 1 << 40 // ids of open and resume, above every seq

	sc := c.sessionConn(li)
	sc.send(wire.Msg{Type: wire.TypeOpenSession, ID: attach, Session: sid, TimeoutMs: 20_000, Secret: secret})
	if m := sc.next(); m.Type != wire.TypeOK || m.ID != attach {
		t.Fatalf("open: %s", describe(m))
	}
	const waiters = 20
	for seq := uint64(1); seq <= waiters; seq++ {
		m := acquireMsg("hot", "room", 30, 60*time.Second)
		m.ID = seq
		sc.send(m)
	}
	for seq := uint64(1); seq <= waiters; seq++ {
		// Replies come by id, not in order; every one is a Q here.
		if m := sc.next(); m.Type != wire.TypeQueued || m.ID < 1 || m.ID > waiters {
			t.Fatalf("waiter: %s, want Q", describe(m))
		}
	}

	// Kill the leader (no hand-over). The session's connection closes
	// with it; its waiters stay in the replicated line.
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	li2 := c.leader()

	// A hostile resume: the right session, a wrong secret.
	bad := c.sessionConn(li2)
	var wrong [wire.SecretLen]byte
	bad.send(wire.Msg{Type: wire.TypeResume, ID: attach, Session: sid, Secret: wrong, High: waiters})
	if m := bad.next(); m.Type != wire.TypeError || m.Code != wire.CodeBadSession {
		t.Fatalf("resume with a wrong secret: %s, want E bad_session", describe(m))
	}
	var m wire.Msg
	if err := bad.r.ReadMsg(&m); !errors.Is(err, io.EOF) && err == nil {
		t.Fatalf("after bad_session the connection stays open: %s", describe(m))
	}

	// The broker resumes, naming the highest seq it wrote and its ack.
	rc := c.sessionConn(li2)
	rc.send(wire.Msg{Type: wire.TypeResume, ID: attach, Session: sid, Secret: secret, High: waiters, Serial: sc.ack})
	for seq := uint64(1); seq <= waiters; seq++ {
		if m := rc.next(); m.Type != wire.TypeQueued || m.ID != seq {
			t.Fatalf("resume answer %d: %s, want Q id %d (every waiter still queued, in seq order)", seq, describe(m), seq)
		}
	}
	if m := rc.next(); m.Type != wire.TypeOK || m.ID != attach {
		t.Fatalf("resume: %s, want K", describe(m))
	}

	// The holder (whose connection died with the old leader) releases by
	// its token on the new leader; the key goes down the line in order.
	// Within one commit a hand-off to the next waiter comes before the
	// release's own K (serial order: effects first).
	other := c.dial(li2)
	mustType(t, do(t, other, releaseMsg("hot", "holder", hot)), wire.TypeOK)
	last := hot
	released := map[uint64]bool{}
	acks := 0
	for seq := uint64(1); seq <= waiters; {
		m := rc.next()
		switch {
		case m.Type == wire.TypeOK && m.ID > waiters && m.ID <= 2*waiters:
			released[m.ID-waiters] = true
			continue
		case m.Type == wire.TypeOK && m.ID > attach && m.ID <= attach+waiters:
			acks++
			continue
		case m.Type != wire.TypeGranted || m.ID != seq || m.Token <= last:
			t.Fatalf("grant %d: %s, want G id %d with a token above %d", seq, describe(m), seq, last)
		}
		last = m.Token
		rel := releaseMsg("hot", "room", m.Token)
		rel.ID = waiters + seq
		// The ack the broker reports is stamped into its next command,
		// whose apply trims the outcomes it has.
		rc.send(wire.Msg{Type: wire.TypeSessionAck, ID: attach + seq, Serial: rc.ack}, rel)
		seq++
	}
	acked := acks
	for len(released) < waiters || acked < waiters {
		switch m := rc.next(); {
		case m.Type == wire.TypeOK && m.ID > waiters && m.ID <= 2*waiters:
			released[m.ID-waiters] = true
		case m.Type == wire.TypeOK && m.ID > attach && m.ID <= attach+waiters:
			acked++
		default:
			t.Fatalf("with %d released and %d acks answered: %s", len(released), acked, describe(m))
		}
	}
	var info struct{ outcomes int }
	c.Node(li2).ReadState(func(st *locksm.State) {
		si, _ := st.Session(sid)
		info.outcomes = si.Outcomes
	})
	// Acked outcomes are gone from the replicated state (without the acks
	// all 2×waiters grants and releases would be kept): only those the
	// last acks stamped into a command did not cover remain.
	if info.outcomes >= waiters {
		t.Errorf("%d outcomes kept after the acks", info.outcomes)
	}
	if rc.ack == 0 {
		t.Fatal("no O watermark read")
	}
}

// A version 7 connection that opens no session behaves exactly as a
// version 6 one: the same requests get the same replies, and no O.
func TestSessionlessVersion7AsVersion6(t *testing.T) {
	c, li := startSessionCluster(t)
	holder := c.dial(li)
	mustGrant(t, do(t, holder, acquireMsg("busy", "holder", 60, 0)))
	run := func(v uint16, key string) []byte {
		conn, r, peer := c.rawConnVersion(li, v)
		if peer.Version != v {
			t.Fatalf("negotiated %d, want %d", peer.Version, v)
		}
		var types []byte
		next := func() wire.Msg {
			for {
				m := rawNext(t, r)
				if m.Type == wire.TypeOutcomes {
					t.Fatalf("version %d connection without a session got %s", v, describe(m))
				}
				if m.Type != wire.TypeNotice {
					types = append(types, m.Type)
					return m
				}
			}
		}
		a := acquireMsg(key, "o", 10, 0)
		a.ID = 1
		rawSend(t, conn, a)
		g := next()
		rel := releaseMsg(key, "o", g.Token)
		rel.ID = 2
		rawSend(t, conn, rel)
		next()
		b := acquireMsg("busy", "o", 10, 0)
		b.ID = 3
		rawSend(t, conn, b)
		next()
		w := acquireMsg("busy", "o", 10, 300*time.Millisecond)
		w.ID = 4
		rawSend(t, conn, w)
		next() // Q
		next() // T
		rel.ID, rel.Token = 5, 12345
		rawSend(t, conn, rel)
		next() // E not_held
		return types
	}
	v6, v7 := run(wire.VersionExtend, "k6"), run(wire.VersionSessions, "k7")
	if string(v6) != string(v7) || string(v6) != "GKBQTE" {
		t.Fatalf("version 6 replies %q, version 7 %q, want GKBQTE for both", v6, v7)
	}
}

// A broker that dies while its waiter heads a hot key (issue 31): the key
// is handed to the waiter while no connection is attached, so nobody was
// told the grant; when the session's timeout runs out the leader expires
// it through the log and the expiry releases that grant, so the next
// waiter gets the key instead of waiting for the lease.
func TestSessionExpiryReleasesUntoldGrant(t *testing.T) {
	c, li := startSessionCluster(t)
	holder := c.dial(li)
	hot := mustGrant(t, do(t, holder, acquireMsg("hot", "holder", 120, 0)))

	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	sc := c.sessionConn(li)
	sc.send(wire.Msg{Type: wire.TypeOpenSession, ID: 1 << 40, Session: 77, TimeoutMs: locksm.MinSessionTimeoutMs, Secret: secret})
	if m := sc.next(); m.Type != wire.TypeOK {
		t.Fatalf("open: %s", describe(m))
	}
	w := acquireMsg("hot", "broker", 120, 60*time.Second)
	w.ID = 1
	sc.send(w)
	if m := sc.next(); m.Type != wire.TypeQueued {
		t.Fatalf("waiter: %s", describe(m))
	}
	// Behind it, a session-less client waits too.
	next := c.dial(li)
	behind := make(chan wire.Msg, 1)
	go func() {
		r, _, err := next.Do(context.Background(), acquireMsg("hot", "next", 10, 60*time.Second))
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
	// The broker dies; then the holder releases: the key goes to the
	// dead broker's waiter, untold.
	conns := cluster.ClientConns(c.Node(li))
	sc.conn.Close()
	testkit.WaitFor(t, "the node saw the broker's connection close", 15*time.Second, func() bool {
		return cluster.ClientConns(c.Node(li)) < conns
	})
	mustType(t, do(t, holder, releaseMsg("hot", "holder", hot)), wire.TypeOK)
	select {
	case r := <-behind:
		if r.Type != wire.TypeGranted {
			t.Fatalf("the waiter behind the dead broker's: %s, want G", describe(r))
		}
		var owner string
		c.Node(li).ReadState(func(st *locksm.State) {
			h, _ := st.Holder("hot")
			owner = h.Owner
			if _, ok := st.Session(77); ok {
				t.Error("the session is still live after its expiry")
			}
		})
		if owner != "next" {
			t.Fatalf("hot held by %q, want next", owner)
		}
	case <-time.After(60 * time.Second): // hang guard: the lease alone would end it after 120 s
		t.Fatal("the key never moved on from the dead broker's untold grant")
	}
}

// A planned hand-over keeps a session's waiters in line (issue 31, part
// 7): they are not withdrawn with T, the hand-over does not wait for them,
// the old leader closes the session's connection when it steps down, and
// the broker resumes on the target, where they are still queued.
func TestSessionWaitersSurviveHandOver(t *testing.T) {
	c, li := startSessionCluster(t)
	holder := c.dial(li)
	mustGrant(t, do(t, holder, acquireMsg("hot", "holder", 120, 0)))

	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	const attach = 1 << 40
	sc := c.sessionConn(li)
	sc.send(wire.Msg{Type: wire.TypeOpenSession, ID: attach, Session: 88, TimeoutMs: 20_000, Secret: secret})
	if m := sc.next(); m.Type != wire.TypeOK {
		t.Fatalf("open: %s", describe(m))
	}
	const waiters = 5
	for seq := uint64(1); seq <= waiters; seq++ {
		m := acquireMsg("hot", "room", 30, 60*time.Second)
		m.ID = seq
		sc.send(m)
	}
	for range waiters {
		if m := sc.next(); m.Type != wire.TypeQueued {
			t.Fatalf("waiter: %s, want Q", describe(m))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	to, err := c.Node(li).HandOver(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	// The session's connection is closed by the old leader; nothing but
	// notices (and the hand-over's) came before: no T.
	for {
		var m wire.Msg
		if err := sc.r.ReadMsg(&m); err != nil {
			break
		}
		if m.Type != wire.TypeNotice && m.Type != wire.TypeOutcomes {
			t.Fatalf("during the hand-over: %s", describe(m))
		}
		if m.Type == wire.TypeNotice && m.Event == wire.NoticeHandOver {
			sc.send(wire.Msg{Type: wire.TypeNoticeAck, ID: attach + 1})
		}
	}
	li2 := -1
	for i := range c.Size() {
		if c.Node(i) != nil && c.Node(i).ServerID() == to {
			li2 = i
		}
	}
	if li2 < 0 {
		t.Fatalf("hand-over target %q not found", to)
	}
	testkit.WaitFor(t, "the target serves", 15*time.Second, func() bool { return c.Node(li2).Serving() })
	rc := c.sessionConn(li2)
	rc.send(wire.Msg{Type: wire.TypeResume, ID: attach, Session: 88, Secret: secret, High: waiters})
	for seq := uint64(1); seq <= waiters; seq++ {
		if m := rc.next(); m.Type != wire.TypeQueued || m.ID != seq {
			t.Fatalf("resume answer %d: %s, want Q id %d", seq, describe(m), seq)
		}
	}
	if m := rc.next(); m.Type != wire.TypeOK || m.ID != attach {
		t.Fatalf("resume: %s, want K", describe(m))
	}
}
