package unixapi_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/locksm"
	"ticketing/unixapi"
)

// leaderQueueLen is how many acquires wait for key k in the leader's
// state machine (committed and applied).
func leaderQueueLen(t *testing.T, k string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	i, err := testCluster.Leader(ctx)
	if err != nil {
		t.Fatalf("no leader: %v", err)
	}
	n := 0
	testCluster.Node(i).ReadState(func(st *locksm.State) { n = st.QueueLen(k) })
	return n
}

// Version 4: HELLO agrees it (with or without events); a higher version
// agrees the newest, which INFO says.
func TestHelloVersion4(t *testing.T) {
	s := serve(t, nil)
	c := dial(t, s)
	for _, tc := range []struct{ hello, reply string }{
		{"HELLO 4 events", "HELLO 4 events"}, {"HELLO 65535 events", fmt.Sprintf("HELLO %d events", unixapi.ProtocolVersion)},
		{"HELLO 65535", fmt.Sprintf("HELLO %d", unixapi.ProtocolVersion)},
		{"HELLO 4", "HELLO 4"}, {"HELLO 3 events", "HELLO 3 events"},
	} {
		expect(t, c.do(tc.hello), tc.reply)
	}
	expectPrefix(t, c.do("INFO"), "INFO cluster=")
	if info := c.do("INFO"); !strings.Contains(info, fmt.Sprintf(" protocol=%d ", unixapi.ProtocolVersion)) {
		t.Fatalf("INFO %q does not say protocol=%d", info, unixapi.ProtocolVersion)
	}
}

// A waiting ACQUIRE on a version 4 events connection gets
// "! QUEUED <n> <keys>" once the cluster queued it, before its reply,
// with n its position among the connection's request lines (every line
// counts, a refused one too); two waiting ACQUIREs of the same key on one
// connection are told apart by n; a block names its keys in the order
// asked.
func TestQueuedEvent(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	before := s.Stats().QueuedEvents
	a := dial(t, s)
	tok := token(t, a.do("ACQUIRE "+k+" 30 0"))

	b := dial(t, s)
	b.send("HELLO 4 events", "FROB", "PING", "ACQUIRE "+k+" 30 20")
	expect(t, b.read(), "HELLO 4 events")
	expectPrefix(t, b.read(), "ERR unknown_verb ")
	expect(t, b.read(), "PONG")
	expect(t, b.read(), "! QUEUED 4 "+k)
	// Queued means committed: the leader has it in the key's queue.
	if n := leaderQueueLen(t, k); n != 1 {
		t.Fatalf("QUEUED read with %d waiters in the leader's queue, want 1", n)
	}
	// A second waiter of the same key on the same connection, behind the
	// first.
	b.send("ACQUIRE " + k + " 30 20")
	expect(t, b.read(), "! QUEUED 5 "+k)
	if n := leaderQueueLen(t, k); n != 2 {
		t.Fatalf("second QUEUED read with %d waiters queued, want 2", n)
	}
	// The replies still follow, in request order: the first waiter gets
	// the key; releasing it hands it to the second.
	expect(t, a.do(fmt.Sprintf("RELEASE %s %d", k, tok)), "OK")
	t1 := token(t, b.read())
	b.send(fmt.Sprintf("RELEASE %s %d", k, t1))
	t2 := token(t, b.read())
	expect(t, b.read(), "OK")
	if t1 <= tok || t2 <= t1 {
		t.Fatalf("tokens %d, %d, %d do not increase", tok, t1, t2)
	}
	expect(t, b.do(fmt.Sprintf("RELEASE %s %d", k, t2)), "OK")

	// A block: its keys in the order asked.
	k1, k2 := key(t), key(t)
	tok = token(t, a.do("ACQUIRE "+k2+" 30 0"))
	c := dial(t, s)
	expect(t, c.do("HELLO 4 events"), "HELLO 4 events")
	c.send("ACQUIRE " + k2 + " " + k1 + " 30 20")
	expect(t, c.read(), "! QUEUED 2 "+k2+" "+k1)
	if n1, n2 := leaderQueueLen(t, k1), leaderQueueLen(t, k2); n1 != 1 || n2 != 1 {
		t.Fatalf("block QUEUED read with queues %d and %d, want 1 and 1", n1, n2)
	}
	expect(t, a.do(fmt.Sprintf("RELEASE %s %d", k2, tok)), "OK")
	token(t, c.read())
	if got := s.Stats().QueuedEvents - before; got != 3 {
		t.Fatalf("Stats.QueuedEvents grew by %d, want 3", got)
	}
}

// No QUEUED for an ACQUIRE that was not queued (wait 0, a free key), nor
// on a connection without version 4 events (version 3 events, version 4
// without events, no HELLO), though the cluster queued its ACQUIRE.
func TestQueuedEventOnlyWhenQueuedAndAsked(t *testing.T) {
	s := serve(t, nil)
	before := s.Stats().QueuedEvents
	k := key(t)
	a := dial(t, s)
	tok := token(t, a.do("ACQUIRE "+k+" 30 0"))

	b := dial(t, s)
	expect(t, b.do("HELLO 4 events"), "HELLO 4 events")
	expect(t, b.do("ACQUIRE "+k+" 30 0"), "BUSY")
	free := key(t)
	ft := token(t, b.do("ACQUIRE "+free+" 30 5"))
	expect(t, b.do(fmt.Sprintf("RELEASE %s %d", free, ft)), "OK")
	expectPrefix(t, b.do("ACQUIRE "+free+" "+key(t)+" 30 5"), "OK ")

	// Three connections that asked for no QUEUED lines, each queued at
	// the leader behind the one before.
	var quiet []*conn
	for i, hello := range []string{"HELLO 3 events", "HELLO 4", ""} {
		c := dial(t, s)
		if hello != "" {
			expectPrefix(t, c.do(hello), "HELLO ")
		}
		c.send("ACQUIRE "+k+" 30 20", "PING")
		testkit.WaitFor(t, fmt.Sprintf("waiter %d queued at the leader", i+1), 20*time.Second, func() bool {
			return leaderQueueLen(t, k) == i+1
		})
		quiet = append(quiet, c)
	}
	holder, held := a, tok
	for i, c := range quiet {
		expect(t, holder.do(fmt.Sprintf("RELEASE %s %d", k, held)), "OK")
		// The reply, then the PING's: no line before, between or after.
		next := token(t, c.read())
		expect(t, c.read(), "PONG")
		if next <= held {
			t.Fatalf("waiter %d: token %d not above %d", i+1, next, held)
		}
		holder, held = c, next
	}
	expect(t, holder.do(fmt.Sprintf("RELEASE %s %d", k, held)), "OK")
	for _, c := range append(quiet, b) {
		expect(t, c.do("PING"), "PONG")
	}
	if got := s.Stats().QueuedEvents - before; got != 0 {
		t.Fatalf("Stats.QueuedEvents grew by %d, want 0", got)
	}
}

// FIFO hand-off ordered by QUEUED alone: each waiter is sent once the one
// before it read its QUEUED line, so the queue order is known without a
// sleep, and the key goes to them in that order.
func TestQueuedOrdersFIFO(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a := dial(t, s)
	tok := token(t, a.do("ACQUIRE "+k+" 30 0"))
	var waiters []*conn
	for range 4 {
		w := dial(t, s)
		w.send("HELLO 4 events", "ACQUIRE "+k+" 30 30")
		expect(t, w.read(), "HELLO 4 events")
		expect(t, w.read(), unixapi.FormatQueued(2, []string{k}))
		waiters = append(waiters, w)
	}
	holder, held := a, tok
	for i, w := range waiters {
		expect(t, holder.do(fmt.Sprintf("RELEASE %s %d", k, held)), "OK")
		next := token(t, w.read())
		if next <= held {
			t.Fatalf("waiter %d: token %d not above %d", i+1, next, held)
		}
		holder, held = w, next
	}
	expect(t, holder.do(fmt.Sprintf("RELEASE %s %d", k, held)), "OK")
}
