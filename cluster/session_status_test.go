package cluster_test

import (
	"context"
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// The status report lists the brokers' sessions (id in hex as the sidecar
// writes it, timeout, waiters, holdings, and in the leader's view whether
// a connection is attached or when the session expires), and inspect
// names the session of a holder and of a waiter, on real version 7 nodes.
// Over the admin port a long list of sessions is cut to what fits one
// frame, SessionsTotal still counting them all.
func TestSessionsInStatusAndInspect(t *testing.T) {
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret, Tune: func(cfg *cluster.Config) {
		cfg.ProtocolVersion = wire.VersionSessions
	}})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 7", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionSessions
	})
	holder := c.dial(li)
	mustGrant(t, do(t, holder, acquireMsg("hot", "plain", 120, 0)))

	const sid, timeoutMs = 0xabc0ffee, 20_000
	hex := strconv.FormatUint(sid, 16)
	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	sc := c.sessionConn(li)
	sc.send(wire.Msg{Type: wire.TypeOpenSession, ID: 1 << 40, Session: sid, TimeoutMs: timeoutMs, Secret: secret})
	if m := sc.next(); m.Type != wire.TypeOK {
		t.Fatalf("open: %s", describe(m))
	}
	a := acquireMsg("mine", "broker.1", 120, 0)
	a.ID = 1
	w := acquireMsg("hot", "broker.2", 120, 60*time.Second)
	w.ID = 2
	sc.send(a, w)
	for range 2 {
		if m := sc.next(); m.Type != wire.TypeGranted && m.Type != wire.TypeQueued {
			t.Fatalf("session request: %s", describe(m))
		}
	}

	st := c.Node(li).StatusReport()
	if st.SessionsTotal != 1 || len(st.Sessions) != 1 || st.SessionsTruncated {
		t.Fatalf("leader status sessions: %d %+v", st.SessionsTotal, st.Sessions)
	}
	s := st.Sessions[0]
	if s.ID != hex || s.TimeoutMs != timeoutMs || s.Waiters != 1 || s.Holdings != 1 || s.Resumes != 0 || s.OpenedAtUnixMs == 0 ||
		s.Attached == nil || !*s.Attached || s.ExpiresInMs != nil {
		t.Fatalf("leader status session %+v", s)
	}
	kr, err := c.Node(li).Inspect("mine")
	if err != nil || kr.Holder == nil || kr.Holder.Session != hex {
		t.Fatalf("inspect mine: %v %+v", err, kr.Holder)
	}
	kr, err = c.Node(li).Inspect("hot")
	if err != nil || kr.Holder == nil || kr.Holder.Session != "" || len(kr.Queue) != 1 || kr.Queue[0].Session != hex {
		t.Fatalf("inspect hot: %v holder %+v queue %+v", err, kr.Holder, kr.Queue)
	}

	// A follower lists the session from its applied state; only the
	// leader knows whether it is attached.
	fi := follower(c, li)
	testkit.WaitFor(t, "the follower to apply the session's requests", 20*time.Second, func() bool {
		fs := c.Node(fi).StatusReport()
		return len(fs.Sessions) == 1 && fs.Sessions[0].Waiters == 1 && fs.Sessions[0].Holdings == 1
	})
	if fs := c.Node(fi).StatusReport(); fs.Sessions[0].ID != hex || fs.Sessions[0].Attached != nil {
		t.Fatalf("follower status session %+v", fs.Sessions[0])
	}

	// The broker's connection dies: the leader counts down its timeout.
	sc.conn.Close()
	testkit.WaitFor(t, "the session detached", 15*time.Second, func() bool {
		ss := c.Node(li).StatusReport().Sessions
		return len(ss) == 1 && ss[0].Attached != nil && !*ss[0].Attached
	})
	s = c.Node(li).StatusReport().Sessions[0]
	if s.ExpiresInMs == nil || *s.ExpiresInMs > timeoutMs {
		t.Fatalf("detached session %+v: want an expiry within its %d ms timeout", s, timeoutMs)
	}

	// Many sessions: the admin reply cuts the list to one frame.
	const more = 60
	for i := range more {
		mc := c.sessionConn(li)
		mc.send(wire.Msg{Type: wire.TypeOpenSession, ID: 1 << 40, Session: uint64(1000 + i), TimeoutMs: locksm.MaxSessionTimeoutMs, Secret: secret})
		if m := mc.next(); m.Type != wire.TypeOK {
			t.Fatalf("open %d: %s", i, describe(m))
		}
	}
	full := c.Node(li).StatusReport()
	if full.SessionsTotal != more+1 || len(full.Sessions) != more+1 {
		t.Fatalf("local status lists %d of %d sessions", len(full.Sessions), full.SessionsTotal)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, err := c.admin().Do(ctx, wire.AdminRequest{Op: "status", LeaderOnly: true})
	if err != nil || rep.Status == nil {
		t.Fatalf("admin status: %v %+v", err, rep)
	}
	as := rep.Status
	if as.SessionsTotal != more+1 || !as.SessionsTruncated || len(as.Sessions) == 0 || len(as.Sessions) > more || len(as.Members) != 3 {
		t.Fatalf("admin status of %d sessions: total %d, %d listed, truncated %v", more+1, as.SessionsTotal, len(as.Sessions), as.SessionsTruncated)
	}
	for i, s := range as.Sessions {
		if s.ID != full.Sessions[i].ID {
			t.Fatalf("session %d is %s over the admin port, %s locally", i, s.ID, full.Sessions[i].ID)
		}
	}
	t.Logf("%d of %d sessions fit one admin frame", len(as.Sessions), as.SessionsTotal)
}
