package unixapi_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/wire"
	"ticketing/locksm"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// event reads the next line and requires it to be a LOST event of token
// for keys, for reason.
func (c *conn) event(token uint64, reason string, keys ...string) {
	c.t.Helper()
	line := c.read()
	ev, err := unixapi.ParseEvent([]byte(line))
	if err != nil {
		c.t.Fatalf("want an event line, got %q: %v", line, err)
	}
	if ev.Name != unixapi.EventLost || ev.Token != token || ev.Reason != reason || strings.Join(ev.Keys, " ") != strings.Join(keys, " ") {
		c.t.Fatalf("event %q, want LOST %d %s %v", line, token, reason, keys)
	}
}

// EXTEND over the socket keeps a lock past its first lease (the waiter
// keeps waiting); with events on, the expiry of the renewed lease comes as
// `! LOST <token> expired <key>`, before the waiter's grant, and the lock
// is forgotten: EXTEND and RELEASE answer not_held, HELD omits it.
func TestExtendThenLostExpired(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a := dial(t, s)
	expect(t, a.do("HELLO 3 events"), "HELLO 3 events")
	tok := token(t, a.do("ACQUIRE "+k+" 1 0"))
	sent := time.Now()
	expect(t, a.do(fmt.Sprintf("EXTEND %s %d 3", k, tok)), "OK")

	b := dial(t, s)
	b.send("ACQUIRE " + k + " 10 20")
	waitQueued(t, k, 1)
	time.Sleep(1500 * time.Millisecond)
	// Past the first lease: no event yet, the lock is still this one's.
	expect(t, a.do("HELD"), fmt.Sprintf("HELD 1 %s:%d", k, tok))

	a.event(tok, "expired", k)
	if d := time.Since(sent); d < 3*time.Second {
		t.Fatalf("lost %v after the EXTEND was sent, before its 3 s lease", d)
	}
	if next := token(t, b.read()); next <= tok {
		t.Fatalf("waiter's token %d not above %d", next, tok)
	}
	expectPrefix(t, a.do(fmt.Sprintf("EXTEND %s %d 3", k, tok)), "ERR not_held ")
	expectPrefix(t, a.do(fmt.Sprintf("RELEASE %s %d", k, tok)), "ERR not_held ")
	expect(t, a.do("HELD"), "HELD 0")
}

// An event never takes a reply's place: a LOST line that arrives while a
// waiting ACQUIRE and a PING are pipelined comes between reply lines, and
// each reply keeps its position. A connection without events gets no
// event line, but forgets the lock all the same.
func TestLostEventBetweenPipelinedReplies(t *testing.T) {
	s := serve(t, nil)
	k1, k2 := key(t), key(t)
	holder := dial(t, s)
	t2 := token(t, holder.do("ACQUIRE "+k2+" 30 0"))

	a := dial(t, s)
	expect(t, a.do("HELLO 3 events"), "HELLO 3 events")
	t1 := token(t, a.do("ACQUIRE "+k1+" 1 0"))
	quiet := dial(t, s)
	t3 := token(t, quiet.do("ACQUIRE "+key(t)+" 1 0"))

	a.send("ACQUIRE "+k2+" 30 20", "PING")
	waitQueued(t, k2, 1)
	a.event(t1, "expired", k1)
	expect(t, holder.do(fmt.Sprintf("RELEASE %s %d", k2, t2)), "OK")
	if got := token(t, a.read()); got <= t2 {
		t.Fatalf("a's token %d not above %d", got, t2)
	}
	expect(t, a.read(), "PONG")

	// quiet's lock ran out too: no event line, and it is forgotten.
	deadline := time.Now().Add(15 * time.Second)
	for {
		held := quiet.do("HELD")
		if strings.HasPrefix(held, "!") {
			t.Fatalf("event line on a connection without events: %q", held)
		}
		if held == "HELD 0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("token %d still held after its lease: %q", t3, held)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A holding ended behind the sidecar's back (here: released directly on
// the cluster, so no lost event comes) is found out by the next EXTEND:
// `! LOST <token> moved <keys>` first, then its ERR. The broker runs
// without a session: a session's holding cannot be released behind its
// back any more (from protocol version 9 only the session releases it;
// cluster/hostile_match_test.go), so the way a holding vanishes here is a
// session-less one's.
func TestExtendOfAVanishedLockIsLostMoved(t *testing.T) {
	_, s := brokerFor(t, testCluster, func(cfg *sidecar.Config) { cfg.Sessions = sidecar.SessionsOff }, nil)
	k := key(t)
	a := dial(t, s)
	expect(t, a.do("HELLO 3 events"), "HELLO 3 events")
	tok := token(t, a.do("ACQUIRE "+k+" 30 0"))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	li, err := testCluster.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var h locksm.Holder
	testCluster.Node(li).ReadState(func(st *locksm.State) { h, _ = st.Holder(k) })
	cc, err := client.Dial(ctx, testCluster.ClientAddr(li), client.Config{Secret: testCluster.ClientSecret, ClusterID: testCluster.ClusterID})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	r, _, err := cc.Do(ctx, wire.Msg{Type: wire.TypeRelease, Key: k, Owner: h.Owner, Token: tok})
	if err != nil || r.Type != wire.TypeOK {
		t.Fatalf("release behind the sidecar's back: %+v %v", r, err)
	}

	a.send(fmt.Sprintf("EXTEND %s %d 30", k, tok))
	a.event(tok, "moved", k)
	expectPrefix(t, a.read(), "ERR not_held ")
	expect(t, a.do("HELD"), "HELD 0")
}

// When the sidecar shuts down it releases every session's locks; a
// connection with events is told `! LOST <token> compensated <keys>` for
// each (a block's keys in its order) before the connection closes. A
// connection without events is not.
func TestShutdownTellsCompensated(t *testing.T) {
	s := serve(t, nil)
	k1, k2, k3 := key(t), key(t), key(t)
	a := dial(t, s)
	expect(t, a.do("HELLO 3 events"), "HELLO 3 events")
	t1 := token(t, a.do("ACQUIRE "+k1+" 30 0"))
	tb := token(t, a.do("ACQUIRE "+k3+" "+k2+" 30 0"))
	quiet := dial(t, s)
	token(t, quiet.do("ACQUIRE "+key(t)+" 30 0"))

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for range 2 {
		line := a.read()
		ev, err := unixapi.ParseEvent([]byte(line))
		if err != nil || ev.Reason != "compensated" {
			t.Fatalf("at shutdown: %q (%v), want a compensated LOST", line, err)
		}
		got[strconv.FormatUint(ev.Token, 10)+" "+strings.Join(ev.Keys, " ")] = true
	}
	for _, want := range []string{fmt.Sprintf("%d %s", t1, k1), fmt.Sprintf("%d %s %s", tb, k3, k2)} {
		if !got[want] {
			t.Fatalf("compensated events %v, missing %q", got, want)
		}
	}
	if line, err := a.br.ReadString('\n'); err == nil {
		t.Fatalf("after the events: %q, want the connection closed", line)
	}
	if line, err := quiet.br.ReadString('\n'); err == nil {
		t.Fatalf("connection without events got %q at shutdown", line)
	}
}
