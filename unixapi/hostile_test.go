package unixapi_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/locksm"
	"ticketing/unixapi"
)

// The hostile-client suite: one server, one well-behaved client that keeps
// acquiring and releasing its own key, and connections that send garbage,
// over-long and unterminated lines, floods, bad fields, other connections'
// tokens, and more connections than allowed. Every hostile connection must
// get the error PROTOCOL.md promises (or a close), and the good client must
// keep every lock it is granted, get every acquire and see no error.

// hostileOwnerPrefix makes the good client's owner id recognisable in the
// cluster's state.
const hostileOwnerPrefix = "hostile-suite"

// holderOf reads key's holder from the leader's state machine.
func holderOf(t *testing.T, k string) (locksm.Holder, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	i, err := testCluster.Leader(ctx)
	if err != nil {
		t.Errorf("no leader: %v", err)
		return locksm.Holder{}, false
	}
	var h locksm.Holder
	var ok bool
	testCluster.Node(i).ReadState(func(st *locksm.State) { h, ok = st.Holder(k) })
	return h, ok
}

// queueLen is how many acquires wait for key k in the leader's state
// machine: a waiter counts once its acquire is committed and applied.
func queueLen(t *testing.T, k string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	i, err := testCluster.Leader(ctx)
	if err != nil {
		t.Errorf("no leader: %v", err)
		return -1
	}
	n := 0
	testCluster.Node(i).ReadState(func(st *locksm.State) { n = st.QueueLen(k) })
	return n
}

// waitQueued waits until n acquires wait for k at the leader.
func waitQueued(t *testing.T, k string, n int) {
	t.Helper()
	testkit.WaitFor(t, fmt.Sprintf("%d waiters queued on %s", n, k), 10*time.Second, func() bool { return queueLen(t, k) == n })
}

// goodClient acquires and releases its key in a loop on one connection and
// checks, while it holds the key, that the cluster says so.
//
// Everything here runs in one process on few cores, the cluster included;
// patientRaft's timeouts keep the leader's lease through the load, but the
// good client still survives an election should one happen: the replies
// that an election legitimately causes (INDETERMINATE, unavailable, moved,
// no_quorum) are tolerated only when the Raft term moves (within 5 s: a
// leader that steps down answers before the next election raises the
// term); the client then starts over on a new connection and a new key (an
// INDETERMINATE acquire may have left a holding its connection does not
// know of). Any other error, and any of those without an election, fails
// the test.
type goodClient struct {
	t     *testing.T
	s     *unixapi.Server
	c     *conn
	token atomic.Uint64 // token of the current holding, 0 between holdings
	phase atomic.Int32  // 0: baseline, 1: under hostile load
	stop  chan struct{}
	done  chan struct{}

	mu        sync.Mutex
	key       string
	cycles    [2][]time.Duration // ACQUIRE+RELEASE round trips per phase
	errs      []string
	elections []string
}

func startGoodClient(t *testing.T, s *unixapi.Server) *goodClient {
	g := &goodClient{t: t, s: s, c: dial(t, s), key: key(t), stop: make(chan struct{}), done: make(chan struct{})}
	go g.loop()
	return g
}

// baselineCycles is how many cycles the good client completes alone
// before the attacks start: enough for the quantiles it logs.
const baselineCycles = 50

// numCycles is how many cycles completed in phase.
func (g *goodClient) numCycles(phase int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.cycles[phase])
}

// Key returns the key the good client is using.
func (g *goodClient) Key() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.key
}

func (g *goodClient) fail(format string, a ...any) {
	g.mu.Lock()
	g.errs = append(g.errs, fmt.Sprintf(format, a...))
	g.mu.Unlock()
}

// rt sends one line and reads one reply without t.Fatal (it runs off the
// test goroutine).
func (g *goodClient) rt(line string) (string, error) {
	g.c.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := g.c.c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	g.c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	l, err := g.c.br.ReadString('\n')
	return strings.TrimSuffix(l, "\n"), err
}

// electionReply reports whether r is a reply an election may cause.
func electionReply(r string) bool {
	for _, p := range []string{"INDETERMINATE", "ERR unavailable ", "ERR moved ", "ERR no_quorum "} {
		if strings.HasPrefix(r, p) || r == p {
			return true
		}
	}
	return false
}

func (g *goodClient) loop() {
	defer close(g.done)
	defer func() { g.c.close() }()
	var last uint64
	term := termOf(testCluster)
	owner := ""
	k := g.Key()
	// restart handles a reply an election may cause: true if there was
	// one, and the client now starts over.
	restart := func(what, r string) bool {
		if !electionReply(r) || !testkit.Eventually(5*time.Second, func() bool { return termOf(testCluster) != term }) {
			return false
		}
		g.mu.Lock()
		g.elections = append(g.elections, fmt.Sprintf("%s: %q", what, r))
		g.mu.Unlock()
		c, err := net.Dial("unix", g.s.Path())
		if err != nil {
			return false
		}
		g.c.close()
		g.c = &conn{t: g.t, c: c, br: bufio.NewReader(c)}
		k = key(g.t)
		g.mu.Lock()
		g.key = k
		g.mu.Unlock()
		term, owner = termOf(testCluster), ""
		return true
	}
	for {
		select {
		case <-g.stop:
			return
		default:
		}
		phase := g.phase.Load()
		start := time.Now()
		r, err := g.rt("ACQUIRE " + k + " 30 5")
		acquired := time.Since(start)
		tok, perr := strconv.ParseUint(strings.TrimPrefix(r, "OK "), 10, 64)
		if err != nil || !strings.HasPrefix(r, "OK ") || perr != nil || tok <= last {
			if err == nil && restart("ACQUIRE", r) {
				continue
			}
			g.fail("ACQUIRE: %q, %v (previous token %d)", r, err, last)
			return
		}
		last = tok
		g.token.Store(tok)
		// Held: the cluster and the connection both say so, under this
		// connection's owner id, while the hostile clients do their worst.
		h, ok := holderOf(g.t, k)
		if owner == "" && ok {
			owner = h.Owner
		}
		if !ok || h.Token != tok || h.Owner != owner || !strings.HasPrefix(owner, hostileOwnerPrefix+".") {
			g.fail("cluster holder of %s: %+v %v, want token %d owner %q", k, h, ok, tok, owner)
			return
		}
		if r, err := g.rt("HELD"); err != nil || r != fmt.Sprintf("HELD 1 %s:%d", k, tok) {
			g.fail("HELD: %q, %v", r, err)
			return
		}
		time.Sleep(2 * time.Millisecond)
		g.token.Store(0)
		start2 := time.Now()
		// OK proves nobody released it meanwhile: a release by anyone
		// else would make this not_held or token_mismatch.
		if r, err := g.rt(fmt.Sprintf("RELEASE %s %d", k, tok)); err != nil || r != "OK" {
			if err == nil && restart("RELEASE", r) {
				continue
			}
			g.fail("RELEASE %d: %q, %v", tok, r, err)
			return
		}
		g.mu.Lock()
		g.cycles[phase] = append(g.cycles[phase], acquired+time.Since(start2))
		g.mu.Unlock()
	}
}

// finish stops the loop and reports its errors and latencies.
func (g *goodClient) finish() {
	close(g.stop)
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range g.errs {
		g.t.Errorf("good client: %s", e)
	}
	for _, e := range g.elections {
		g.t.Logf("good client: a Raft election (the process is CPU-starved) answered %s; started over on a new connection and key", e)
	}
	for i, name := range []string{"alone", "under hostile load"} {
		d := slices.Clone(g.cycles[i])
		if len(d) == 0 {
			g.t.Errorf("good client: no cycle completed %s", name)
			continue
		}
		slices.Sort(d)
		q := func(p float64) time.Duration { return d[min(len(d)-1, int(p*float64(len(d))))] }
		g.t.Logf("good client %s: %d ACQUIRE+RELEASE cycles, p50 %v, p90 %v, p99 %v, max %v",
			name, len(d), q(0.5), q(0.9), q(0.99), d[len(d)-1])
	}
}

// expectClosed checks that the server closed the connection (EOF or reset,
// not a timeout) without sending anything more.
func expectClosed(t *testing.T, c *conn) {
	t.Helper()
	c.c.SetReadDeadline(time.Now().Add(3 * time.Second))
	l, err := c.br.ReadString('\n')
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("connection not closed: %q, %v", l, err)
	}
}

// expectSilent checks that nothing arrives for d.
func expectSilent(t *testing.T, c *conn, d time.Duration) {
	t.Helper()
	c.c.SetReadDeadline(time.Now().Add(d))
	l, err := c.br.ReadString('\n')
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || l != "" {
		t.Fatalf("expected silence, got %q, %v", l, err)
	}
}

// expectCode reads one reply and checks it is ERR with one of codes, a
// reply line of visible ASCII.
func expectCode(t *testing.T, c *conn, what string, codes ...string) {
	t.Helper()
	l := c.read()
	for i := 0; i < len(l); i++ {
		if l[i] < 0x20 || l[i] > 0x7e {
			t.Fatalf("%s: reply %q has byte %#x", what, l, l[i])
		}
	}
	f := strings.SplitN(l, " ", 3)
	if len(f) < 3 || f[0] != "ERR" || !slices.Contains(codes, f[1]) {
		t.Fatalf("%s: got %q, want ERR %v", what, l, codes)
	}
}

func TestHostileClients(t *testing.T) {
	nIdle := 3000
	if raceEnabled {
		// The race detector allows 8128 live goroutines; a session has
		// two.
		nIdle = 2000
	}
	s := serve(t, func(c *unixapi.Config) {
		c.OwnerPrefix = hostileOwnerPrefix
		c.MaxConns = nIdle // the good client and nIdle-1 idle ones
		c.MaxWaiting = hostileMaxWaiting
	})
	reportElections(t, testCluster)
	g := startGoodClient(t, s)
	finished := false
	defer func() {
		if !finished {
			close(g.stop)
			<-g.done
		}
	}()
	// Baseline latency, alone.
	testkit.WaitFor(t, "the good client's baseline cycles", 30*time.Second, func() bool { return g.numCycles(0) >= baselineCycles })
	g.phase.Store(1)

	t.Run("attacks", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			fn   func(*testing.T, *unixapi.Server, *goodClient)
		}{
			{"garbage", hostileGarbage},
			{"line_too_long", hostileLongLines},
			{"partial_line_then_close", hostilePartialLine},
			{"no_newline_held_open", hostileNoNewline},
			{"pipeline_flood_unread", hostileFlood},
			{"too_many_waiting", hostileInFlight},
			{"unknown_verbs_and_arity", hostileVerbs},
			{"invalid_fields", hostileFields},
			{"release_others_lock", hostileRelease},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.fn(t, s, g)
			})
		}
	})
	// Every hostile session is gone, only the good client is left.
	if !testkit.Eventually(3*time.Second, func() bool { return s.Conns() == 1 }) {
		t.Fatalf("%d connections left after the attacks", s.Conns())
	}
	t.Run("idle_connections_and_max_conns", func(t *testing.T) { hostileIdle(t, s, nIdle) })

	finished = true
	g.finish()
}

// Binary garbage, NUL and 0xFF bytes: an ERR per line, the connection
// stays usable.
func hostileGarbage(t *testing.T, s *unixapi.Server, g *goodClient) {
	c := dial(t, s)
	rng := rand.New(rand.NewPCG(1, 2))
	lines := []string{"\x00", "\x00\x00\x00PING", "PING\x00", "\xff\xfe\xfd", "\xff", "\x00 \x00", "\x1b[2J\x07",
		"\xef\xbb\xbfPING", "RELEASE\x00" + g.Key() + " 1"}
	for range 200 {
		b := make([]byte, 1+rng.IntN(1000))
		for i := range b {
			if b[i] = byte(rng.Uint32()); b[i] == '\n' {
				b[i] = 0
			}
		}
		b[0] |= 0x80 // never a verb
		lines = append(lines, string(b))
	}
	c.send(append(lines, "PING")...)
	for i, l := range lines {
		expectCode(t, c, fmt.Sprintf("garbage line %d %q", i, l[:min(len(l), 16)]), "unknown_verb", "bad_request")
	}
	expect(t, c.read(), "PONG")
	// A blob without newlines under the limit is one line.
	blob := bytes.Repeat([]byte{0xff, 0x00, 0x80}, 300)
	c.send(string(blob), "HELD")
	expectCode(t, c, "blob", "unknown_verb")
	expect(t, c.read(), "HELD 0")
}

// Lines over MaxLineLen (the "\r" counts) answer line_too_long and close,
// however they arrive, and the closing connection's own locks are
// released. A line at the limit is just a line.
func hostileLongLines(t *testing.T, s *unixapi.Server, g *goodClient) {
	c := dial(t, s)
	c.send(strings.Repeat("A", unixapi.DefaultMaxLineLen), "PING "+strings.Repeat("x", unixapi.DefaultMaxLineLen-6)+"\r")
	expectCode(t, c, "line at the limit", "unknown_verb")
	expectCode(t, c, "line at the limit with the \\r", "bad_request")
	expect(t, c.do("PING"), "PONG")

	for name, line := range map[string]string{
		"limit + 1 bytes":   strings.Repeat("A", unixapi.DefaultMaxLineLen+1),
		"limit bytes + \\r": "PING " + strings.Repeat("x", unixapi.DefaultMaxLineLen-5) + "\r",
		"release":           "RELEASE " + g.Key() + " " + strings.Repeat("1", unixapi.DefaultMaxLineLen),
	} {
		c := dial(t, s)
		c.send("PING", line, "PING")
		expect(t, c.read(), "PONG")
		expectCode(t, c, name, "line_too_long")
		expectClosed(t, c)
	}

	// 1 MB without a newline, written as fast as the socket takes it: the
	// server answers after DefaultMaxLineLen+1 bytes and closes; the
	// writer is cut off.
	c = dial(t, s)
	wrote := make(chan int64, 1)
	c.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	go func() {
		n, _ := io.Copy(c.c, io.LimitReader(zeroReader{}, 1<<20))
		wrote <- n
	}()
	expectCode(t, c, "1 MB, no newline", "line_too_long")
	expectClosed(t, c)
	t.Logf("1 MB line without a newline: %d bytes written before the close", <-wrote)

	// Slowloris: the over-long line arrives in dribbles.
	c = dial(t, s)
	for range unixapi.DefaultMaxLineLen/100 + 1 {
		if _, err := c.c.Write(bytes.Repeat([]byte("s"), 100)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	expectCode(t, c, "dribbled", "line_too_long")
	expectClosed(t, c)

	// The connection closed for line_too_long loses its lock at once.
	k := key(t)
	c = dial(t, s)
	tok := token(t, c.do("ACQUIRE "+k+" 30 0"))
	c.send(strings.Repeat("z", unixapi.DefaultMaxLineLen+400))
	expectCode(t, c, "holder's long line", "line_too_long")
	expectClosed(t, c)
	if !testkit.Eventually(3*time.Second, func() bool { _, held := holderOf(t, k); return !held }) {
		t.Fatalf("lock %s:%d still held after its connection was closed", k, tok)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// An unterminated line is not a request: it is never executed, whether the
// connection then closes or only half-closes.
func hostilePartialLine(t *testing.T, s *unixapi.Server, g *goodClient) {
	k1, k2 := key(t), key(t)
	c := dial(t, s)
	c.send("PING")
	expect(t, c.read(), "PONG")
	// The partial line comes in the same write as a PING: once the PONG is
	// back, the server has read the PING, and the few bytes behind it came
	// in the same read.
	if _, err := c.c.Write([]byte("PING\nACQUIRE " + k1 + " 30 0")); err != nil {
		t.Fatal(err)
	}
	expect(t, c.read(), "PONG")
	c.close()

	c = dial(t, s)
	if _, err := c.c.Write([]byte("PING\nACQUIRE " + k2 + " 30 0")); err != nil {
		t.Fatal(err)
	}
	if err := c.c.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	expect(t, c.read(), "PONG")
	expectClosed(t, c)

	// Neither key was ever taken: both are free now, for anyone.
	for _, k := range []string{k1, k2} {
		if h, held := holderOf(t, k); held {
			t.Fatalf("%s held by %+v after an unterminated ACQUIRE", k, h)
		}
		d := dial(t, s)
		tok := token(t, d.do("ACQUIRE "+k+" 30 0"))
		expect(t, d.do(fmt.Sprintf("RELEASE %s %d", k, tok)), "OK")
		d.close()
	}
}

// A partial line held open gets no answer and no timeout (the server has
// none); completing it later works.
func hostileNoNewline(t *testing.T, s *unixapi.Server, g *goodClient) {
	c := dial(t, s)
	if _, err := c.c.Write([]byte("PI")); err != nil {
		t.Fatal(err)
	}
	expectSilent(t, c, 300*time.Millisecond)
	if _, err := c.c.Write([]byte("NG")); err != nil {
		t.Fatal(err)
	}
	expectSilent(t, c, 100*time.Millisecond)
	c.send("")
	expect(t, c.read(), "PONG")
}

// Thousands of requests written without reading a reply: the server stops
// reading once a bounded number of replies is queued (back-pressure), so the
// socket stops taking bytes, and every request it did take is answered in
// order once the client reads.
func hostileFlood(t *testing.T, s *unixapi.Server, g *goodClient) {
	c := dial(t, s)
	const attempt = 64 << 20
	chunk := bytes.Repeat([]byte("PING\n"), 64<<10/5)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	accepted := 0
	c.c.SetWriteDeadline(time.Now().Add(700 * time.Millisecond))
	for accepted < attempt {
		n, err := c.c.Write(chunk)
		accepted += n
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatal(err)
			}
			break
		}
	}
	runtime.ReadMemStats(&m1)
	t.Logf("flood: the socket took %d bytes (%d requests) of %d before pushing back; heap in use %+d KiB meanwhile",
		accepted, accepted/5, attempt, (int64(m1.HeapInuse)-int64(m0.HeapInuse))>>10)
	if accepted >= 8<<20 {
		t.Fatalf("the server kept reading %d bytes of requests nobody reads the replies to", accepted)
	}
	// Now read: every whole request is answered, in order.
	// A PING cut by the write deadline is completed first (the chunks are
	// whole PINGs, so when the socket took whole chunks nothing is cut).
	want := accepted / 5
	var rest []byte
	if accepted%5 != 0 {
		rest = []byte("PING\n")[accepted%5:]
		want++
	}
	got := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
			l, err := c.br.ReadString('\n')
			switch {
			case err != nil:
				got <- fmt.Errorf("reply %d: %v", i, err)
			case i < want && l != "PONG\n":
				got <- fmt.Errorf("reply %d: %q", i, l)
			case i == want && l != "HELD 0\n":
				got <- fmt.Errorf("reply %d: %q, want HELD", i, l)
			case i < want:
				continue
			default:
				got <- nil
			}
			return
		}
	}()
	c.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.c.Write(append(rest, "HELD\n"...)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// hostileMaxWaiting is the suite server's MaxWaiting: small enough to
// reach (the default is 100,000).
const hostileMaxWaiting = 256

// MaxWaiting (256 here) ACQUIREs with a wait may run at once on a
// connection; the next ones are answered too_many_waiters, in their place
// in the reply order, while the connection keeps working.
func hostileInFlight(t *testing.T, s *unixapi.Server, g *goodClient) {
	k := key(t)
	holder := dial(t, s)
	tok := token(t, holder.do("ACQUIRE "+k+" 30 0"))
	c := dial(t, s)
	const max, extra = hostileMaxWaiting, 20
	lines := make([]string, 0, max+extra+1)
	for range max + extra {
		lines = append(lines, "ACQUIRE "+k+" 30 1.5")
	}
	start := time.Now()
	c.send(append(lines, "PING")...)
	got := make([]string, 0, len(lines)+1)
	for range len(lines) + 1 {
		got = append(got, c.read())
	}
	took := time.Since(start)
	for i, r := range got {
		want := "TIMEOUT"
		switch {
		case i == len(lines):
			want = "PONG"
		case i >= max:
			want = "ERR too_many_waiters "
		}
		if !strings.HasPrefix(r, want) {
			t.Fatalf("reply %d: %q, want %q", i, r, want)
		}
	}
	t.Logf("%d waiting ACQUIREs and %d refused ones answered in %v", max, extra, took)
	expect(t, c.do("HELD"), "HELD 0")
	expect(t, holder.do(fmt.Sprintf("RELEASE %s %d", k, tok)), "OK")
}

// Unknown verbs and wrong field counts, aimed at the good client's key too.
func hostileVerbs(t *testing.T, s *unixapi.Server, g *goodClient) {
	c := dial(t, s)
	k := g.Key()
	for _, l := range []string{"LOCK " + k, "ping", "Acquire " + k + " 30 0", "GET / HTTP/1.1", "UNLOCK " + k + " 1",
		"FORCE_RELEASE " + k, "\x16\x03\x01\x02\x00", strings.Repeat("PING", 100)} {
		c.send(l)
		expectCode(t, c, l, "unknown_verb")
	}
	for _, l := range []string{"", "\r", " ", "PING x", "INFO all", "HELD " + k, "ACQUIRE", "ACQUIRE " + k,
		"ACQUIRE " + k + " 30",
		"RELEASE", "RELEASE " + k, "RELEASE " + k + " 1 hostile-suite.1", "ACQUIRE  " + k + " 30 0",
		"RELEASE " + k + "  1", " PING", "PING "} {
		c.send(l)
		expectCode(t, c, l, "bad_request")
	}
	// Since version 2 the field count decides an ACQUIRE: the last two
	// fields are the lease and the wait, the others keys. An extra field
	// (an owner to forge) shifts them, so these lines are blocks whose
	// lease is "0": refused before anything reaches the cluster.
	for _, l := range []string{"ACQUIRE " + k + " 30 0 someone-else", "ACQUIRE " + k + " 30 0 x y z"} {
		c.send(l)
		expectCode(t, c, l, "invalid_lease")
	}
	expect(t, c.do("HELD"), "HELD 0")
}

// Invalid keys, leases, waits and tokens answer their codes before anything
// reaches the cluster. There is no owner field to forge: the server derives
// the owner from the connection.
func hostileFields(t *testing.T, s *unixapi.Server, g *goodClient) {
	c := dial(t, s)
	k := g.Key()
	for _, tc := range []struct{ line, code string }{
		{"ACQUIRE " + strings.Repeat("k", 256) + " 30 0", "invalid_key"},
		{"ACQUIRE " + k + "\x00 30 0", "invalid_key"},
		{"ACQUIRE " + k + "\x7f 30 0", "invalid_key"},
		{"ACQUIRE " + k + "\xff 30 0", "invalid_key"},
		{"ACQUIRE s\u00e9ats 30 0", "invalid_key"},
		{"ACQUIRE \t 30 0", "invalid_key"},
		{"RELEASE " + strings.Repeat("k", 256) + " 1", "invalid_key"},
		{"RELEASE " + k + "\x01 1", "invalid_key"},
		{"ACQUIRE " + k + " 0 0", "invalid_lease"},
		{"ACQUIRE " + k + " 251 0", "invalid_lease"},
		{"ACQUIRE " + k + " -1 0", "invalid_lease"},
		{"ACQUIRE " + k + " 1.5 0", "invalid_lease"},
		{"ACQUIRE " + k + " 99999999999999999999999 0", "invalid_lease"},
		{"ACQUIRE " + k + " 0x10 0", "invalid_lease"},
		{"ACQUIRE " + k + " 30 301", "invalid_wait"},
		{"ACQUIRE " + k + " 30 300.001", "invalid_wait"},
		{"ACQUIRE " + k + " 30 -1", "invalid_wait"},
		{"ACQUIRE " + k + " 30 .5", "invalid_wait"},
		{"ACQUIRE " + k + " 30 1e3", "invalid_wait"},
		{"ACQUIRE " + k + " 30 NaN", "invalid_wait"},
		{"ACQUIRE " + k + " 30 0.0001", "invalid_wait"},
		{"RELEASE " + k + " 0", "invalid_token"},
		{"RELEASE " + k + " -1", "invalid_token"},
		{"RELEASE " + k + " 18446744073709551616", "invalid_token"},
		{"RELEASE " + k + " 0x1", "invalid_token"},
		{"RELEASE " + k + " " + strings.Repeat("9", 30), "invalid_token"},
	} {
		c.send(tc.line)
		expectCode(t, c, tc.line, tc.code)
	}
	expect(t, c.do("PING"), "PONG")
}

// RELEASE of the good client's key with its current token (and its
// neighbours), from fresh connections and from one that holds a lock of its
// own, over and over: always not_held (or token_mismatch on the own key),
// never touching the good client's lock.
func hostileRelease(t *testing.T, s *unixapi.Server, g *goodClient) {
	mine := key(t)
	c := dial(t, s)
	myTok := token(t, c.do("ACQUIRE "+mine+" 30 0"))
	tries, seen := 0, map[uint64]bool{}
	start := time.Now()
	for time.Since(start) < time.Second || (len(seen) < 3 && time.Since(start) < 10*time.Second) {
		tok := g.token.Load()
		if tok == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		seen[tok] = true
		tries++
		gk := g.Key()
		fresh := dial(t, s)
		fresh.send(fmt.Sprintf("RELEASE %s %d", gk, tok), fmt.Sprintf("RELEASE %s %d", gk, tok-1),
			fmt.Sprintf("RELEASE %s %d", gk, tok+1))
		for range 3 {
			expectCode(t, fresh, "fresh connection", "not_held")
		}
		fresh.close()
		c.send(fmt.Sprintf("RELEASE %s %d", gk, tok), fmt.Sprintf("RELEASE %s %d", mine, tok))
		expectCode(t, c, "other key", "not_held")
		expectCode(t, c, "own key, other token", "token_mismatch")
		if len(seen) > 50 {
			break
		}
	}
	t.Logf("%d rounds of releases against %d of the good client's holdings", tries, len(seen))
	expect(t, c.do("HELD"), fmt.Sprintf("HELD 1 %s:%d", mine, myTok))
	expect(t, c.do(fmt.Sprintf("RELEASE %s %d", mine, myTok)), "OK")
}

// Thousands of idle connections are served (each still answers), one more
// than MaxConns is refused with too_many_connections and closed, and once
// they go, new connections are accepted again.
func hostileIdle(t *testing.T, s *unixapi.Server, n int) {
	g0 := runtime.NumGoroutine()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	start := time.Now()
	for len(conns) < n-1 { // the good client is one of the n = MaxConns
		c, err := net.DialTimeout("unix", s.Path(), 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	if !testkit.Eventually(3*time.Second, func() bool { return s.Conns() == n }) {
		t.Fatalf("%d connections served, want %d", s.Conns(), n)
	}
	t.Logf("%d idle connections open after %v, %d goroutines more", len(conns), time.Since(start), runtime.NumGoroutine()-g0)
	extra := dial(t, s)
	expectCode(t, extra, "connection over MaxConns", "too_many_connections")
	expectClosed(t, extra)
	// Idle ones still answer.
	for _, i := range []int{0, len(conns) / 2, len(conns) - 1} {
		c := &conn{t: t, c: conns[i], br: bufio.NewReader(conns[i])}
		expect(t, c.do("PING"), "PONG")
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	if !testkit.Eventually(3*time.Second, func() bool { return s.Conns() == 1 }) {
		t.Fatalf("%d connections left after closing the idle ones", s.Conns())
	}
	expect(t, dial(t, s).do("PING"), "PONG")
}
