package unixapi_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/locksm"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// One real 3-node cluster and one real Broker serve every test of the
// package (each test uses its own keys and its own socket), to keep the
// package's run time short.
var (
	testCluster *local.Cluster
	testBroker  *sidecar.Broker
	keySeq      atomic.Int64
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(childClusterEnv); dir != "" {
		os.Exit(runChildCluster(dir))
	}
	dir, err := os.MkdirTemp("", "unixapi-test-")
	if err != nil {
		panic(err)
	}
	code := func() int {
		testCluster, err = local.Start(local.Options{Dir: dir, Tune: patientRaft, Logger: testLogger()})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer testCluster.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := testCluster.Leader(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		cfg := sidecar.DefaultConfig()
		cfg.Addrs, cfg.Secret, cfg.ClusterID, cfg.Logger = testCluster.ClientAddrs(), testCluster.ClientSecret, testCluster.ClusterID, testLogger()
		if testBroker, err = sidecar.New(cfg); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer testBroker.Close()
		return m.Run()
	}()
	os.RemoveAll(dir)
	os.Exit(code)
}

// patientRaft tunes the package's in-process clusters so that the tests'
// own load cannot cost the leader its leadership. Everything here (three
// Raft nodes, the broker, the server, and a test's thousands of client
// connections) shares one Go scheduler, under -race, on a 2-core machine
// that CI loads further. A goroutine woken by a timer then waits up to
// ~300 ms for a CPU (measured while TestHostileClients opens its 2,000 idle
// connections, with two `yes` processes beside it), and a heartbeat's round
// trip is several such wake-ups (the leader's heartbeat loop, the
// follower's transport, the reply): its age passed local.FastRaft's 500 ms
// leader lease ("failed to contact quorum of nodes, stepping down"), the
// leader stepped down, and the replies in flight said unavailable or
// INDETERMINATE, which is the very symptom the flood tests look for. No
// test of this package moves leadership on purpose, so the heartbeat,
// election and lease timeouts can be six times that: a cluster's first
// election takes 3 to 6 s instead of about 1 s, once per cluster.
func patientRaft(cfg *cluster.Config) {
	local.FastRaft(cfg)
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = patientTimeout, patientTimeout, patientTimeout
}

// patientTimeout is patientRaft's heartbeat, election and lease timeout.
const patientTimeout = 3 * time.Second

// reportElections makes a failing test say whether the Raft term of c
// moved while it ran: with patientRaft an election is not expected, and
// one means the process stalled for seconds, not a defect of the code
// under test (which a failure without an election does point to).
func reportElections(t *testing.T, c *local.Cluster) {
	term0 := termOf(c)
	t.Cleanup(func() {
		if term := termOf(c); t.Failed() && term != term0 {
			t.Logf("the Raft term moved from %d to %d during the test: an election happened (a stall longer than the %v leader lease?)",
				term0, term, patientTimeout)
		}
	})
}

// termOf is the highest Raft term of c's nodes: it moves when an election
// happens.
func termOf(c *local.Cluster) uint64 {
	var term uint64
	for i := range c.Size() {
		if n := c.Node(i); n != nil {
			term = max(term, n.Raft().CurrentTerm())
		}
	}
	return term
}

func testLogger() *slog.Logger {
	if os.Getenv("TICKETING_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func key(t *testing.T) string {
	return fmt.Sprintf("%s/%d", t.Name(), keySeq.Add(1))
}

// sockPath returns a short socket path (sun_path is limited to 107 bytes,
// and t.TempDir() paths can be long).
func sockPath(t testing.TB) string {
	dir, err := os.MkdirTemp("", "ux")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "s")
}

func serve(t *testing.T, tune func(*unixapi.Config)) *unixapi.Server {
	t.Helper()
	cfg := unixapi.DefaultConfig()
	cfg.Path = sockPath(t)
	cfg.Logger = testLogger()
	if tune != nil {
		tune(&cfg)
	}
	s, err := unixapi.Listen(cfg, testBroker)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// Wait until the broker knows a leader, so the first ACQUIRE is fast.
	c := dial(t, s)
	testkit.WaitFor(t, "the broker to learn a leader", 20*time.Second, func() bool { return !strings.Contains(c.do("INFO"), "leader=-") })
	c.close()
	testkit.WaitFor(t, "the INFO session to end", 10*time.Second, func() bool { return s.Conns() == 0 })
	return s
}

// conn is a raw protocol connection.
type conn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, s *unixapi.Server) *conn {
	t.Helper()
	c, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &conn{t: t, c: c, br: bufio.NewReader(c)}
}

func (c *conn) send(lines ...string) {
	c.t.Helper()
	c.c.SetWriteDeadline(time.Now().Add(15 * time.Second))
	if _, err := c.c.Write([]byte(strings.Join(lines, "\n") + "\n")); err != nil {
		c.t.Fatal(err)
	}
}

func (c *conn) read() string {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(15 * time.Second))
	l, err := c.br.ReadString('\n')
	if err != nil {
		c.t.Fatalf("read: %v (got %q)", err, l)
	}
	return strings.TrimSuffix(l, "\n")
}

func (c *conn) do(line string) string {
	c.t.Helper()
	c.send(line)
	return c.read()
}

func (c *conn) close() { c.c.Close() }

func token(t *testing.T, reply string) uint64 {
	t.Helper()
	s, ok := strings.CutPrefix(reply, "OK ")
	n, err := strconv.ParseUint(s, 10, 64)
	if !ok || err != nil || n == 0 {
		t.Fatalf("want OK <token>, got %q", reply)
	}
	return n
}

func expect(t *testing.T, got, want string) {
	t.Helper()
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func expectPrefix(t *testing.T, got, prefix string) {
	t.Helper()
	if !strings.HasPrefix(got, prefix) {
		t.Fatalf("got %q, want %q...", got, prefix)
	}
}

// Three connections queue on one key; each release hands the key to the
// next in arrival order with a larger token. A waiter's OK (not TIMEOUT)
// says its release handed the key over within its 10 s wait, long before
// the 30 s lease would have freed it; the queue losing its head says the
// key went to that waiter and not to a newcomer.
func TestFIFOHandoff(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a := dial(t, s)
	tok := token(t, a.do("ACQUIRE "+k+" 30 0"))
	waiters := []*conn{dial(t, s), dial(t, s), dial(t, s)}
	for i, w := range waiters {
		w.send("ACQUIRE " + k + " 30 10")
		waitQueued(t, k, i+1) // arrival order is the queue order
	}
	expect(t, dial(t, s).do("ACQUIRE "+k+" 30 0"), "BUSY")
	holder, held := a, tok
	for i, w := range waiters {
		expect(t, holder.do(fmt.Sprintf("RELEASE %s %d", k, held)), "OK")
		next := token(t, w.read())
		if next <= held {
			t.Fatalf("waiter %d: token %d not above %d", i, next, held)
		}
		if h, ok := holderOf(t, k); !ok || h.Token != next {
			t.Fatalf("waiter %d granted token %d; the cluster's holder: %+v %v", i, next, h, ok)
		}
		if n := queueLen(t, k); n != len(waiters)-i-1 {
			t.Fatalf("after waiter %d's grant %d waiters are left, want %d", i, n, len(waiters)-i-1)
		}
		holder, held = w, next
	}
	expect(t, holder.do(fmt.Sprintf("RELEASE %s %d", k, held)), "OK")
}

func TestBusyAndTimeout(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a, b := dial(t, s), dial(t, s)
	token(t, a.do("ACQUIRE "+k+" 10 0"))
	expect(t, b.do("ACQUIRE "+k+" 10 0"), "BUSY")
	// Not reentrant: the holder itself is busy too.
	expect(t, a.do("ACQUIRE "+k+" 10 0"), "BUSY")
	start := time.Now()
	expect(t, b.do("ACQUIRE "+k+" 10 0.3"), "TIMEOUT")
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("TIMEOUT after %v, before the 0.3 s wait", d)
	}
	expect(t, b.do("HELD"), "HELD 0")
}

// Malformed lines answer ERR, in order with everything else, and leave the
// connection and its locks alone.
func TestMalformedLinesKeepConnection(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a := dial(t, s)
	tok := token(t, a.do("ACQUIRE "+k+" 10 0"))
	a.send("FROBNICATE", "", "ACQUIRE", "ACQUIRE "+k+" 0 0", "ACQUIRE "+k+" 10 301", "ACQUIRE k\x01 1 0",
		"RELEASE "+k+" 0", "RELEASE "+k+" 99", "RELEASE other 1", "PING\r", "ping", "HELD")
	for _, want := range []string{"ERR unknown_verb ", "ERR bad_request ", "ERR bad_request ", "ERR invalid_lease ",
		"ERR invalid_wait ", "ERR invalid_key ", "ERR invalid_token ", "ERR token_mismatch ", "ERR not_held ",
		"PONG", "ERR unknown_verb ", fmt.Sprintf("HELD 1 %s:%d", k, tok)} {
		expectPrefix(t, a.read(), want)
	}
	expect(t, a.do(fmt.Sprintf("RELEASE %s %d", k, tok)), "OK")
}

// Replies come in request order, but a waiting ACQUIRE does not hold up
// the RELEASE pipelined behind it. a's ACQUIRE of k2 waits for b, which
// holds k2 until it has k1: b gets k1, so a's RELEASE of k1 ran while that
// ACQUIRE was still waiting (it cannot end before b lets k2 go, and the
// leader still queues it when b has k1). Were the RELEASE held up, neither
// would get anywhere until a's 30 s wait ran out. The broker sends an
// ACQUIRE from its dispatcher and a RELEASE at once, so a's RELEASE may
// reach the leader before a's ACQUIRE does: b may have k1 a moment before
// that ACQUIRE is queued, hence the poll (it cannot have ended meanwhile:
// b holds k2).
func TestPipelinedReleaseNotBlockedByWaitingAcquire(t *testing.T) {
	s := serve(t, nil)
	k1, k2 := key(t), key(t)
	a, b := dial(t, s), dial(t, s)
	t1 := token(t, a.do("ACQUIRE "+k1+" 30 0"))
	t2 := token(t, b.do("ACQUIRE "+k2+" 30 0"))
	a.send("ACQUIRE "+k2+" 30 30", fmt.Sprintf("RELEASE %s %d", k1, t1), "PING")
	token(t, b.do("ACQUIRE "+k1+" 30 30"))
	waitQueued(t, k2, 1) // a's ACQUIRE, still waiting while b has k1
	expect(t, b.do(fmt.Sprintf("RELEASE %s %d", k2, t2)), "OK")
	if got := token(t, a.read()); got <= t2 {
		t.Fatalf("a's grant of k2: token %d after %d", got, t2)
	}
	expect(t, a.read(), "OK")
	expect(t, a.read(), "PONG")
}

func TestOverlongLineClosesAndReleases(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a, b := dial(t, s), dial(t, s)
	tok := token(t, a.do("ACQUIRE "+k+" 30 0"))
	b.send("ACQUIRE " + k + " 30 10")
	waitQueued(t, k, 1)
	a.send("PING " + strings.Repeat("x", unixapi.DefaultMaxLineLen))
	expectPrefix(t, a.read(), "ERR line_too_long ")
	a.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if l, err := a.br.ReadString('\n'); err == nil {
		t.Fatalf("connection still open after line_too_long: %q", l)
	}
	// b's grant within its 10 s wait, with a's lease at 30 s: the close
	// released a's lock.
	if next := token(t, b.read()); next <= tok {
		t.Fatalf("token %d not above %d", next, tok)
	}
}

// A pending ACQUIRE is cancelled when its connection closes: the key is
// not granted to the dead connection (or, if the grant won the race, it is
// released at once). c's grant within its 5 s wait says so: a key granted
// to b's dead session and kept would stay taken for its 30 s lease.
func TestPendingAcquireCancelledOnClose(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a, b, c := dial(t, s), dial(t, s), dial(t, s)
	tok := token(t, a.do("ACQUIRE "+k+" 30 0"))
	b.send("ACQUIRE " + k + " 30 20")
	waitQueued(t, k, 1)
	b.close()
	waitQueued(t, k, 0) // the close cancelled it through the log
	expect(t, a.do(fmt.Sprintf("RELEASE %s %d", k, tok)), "OK")
	token(t, c.do("ACQUIRE "+k+" 30 5"))
}

// Another connection's bad input and releases never touch your locks.
func TestOtherConnectionCannotTouchLocks(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a, b := dial(t, s), dial(t, s)
	tok := token(t, a.do("ACQUIRE "+k+" 30 0"))
	b.send("RELEASE "+k+" "+strconv.FormatUint(tok, 10), "\x00\xff garbage", "ACQUIRE "+k+" 30 0")
	expectPrefix(t, b.read(), "ERR not_held ")
	expectPrefix(t, b.read(), "ERR ")
	expect(t, b.read(), "BUSY")
	b.send(strings.Repeat("y", unixapi.DefaultMaxLineLen+1))
	expectPrefix(t, b.read(), "ERR line_too_long ")
	expect(t, a.do("HELD"), fmt.Sprintf("HELD 1 %s:%d", k, tok))
	expect(t, dial(t, s).do("ACQUIRE "+k+" 30 0"), "BUSY")
}

func TestAllowList(t *testing.T) {
	uid := uint32(os.Getuid())
	s := serve(t, func(c *unixapi.Config) { c.AllowUIDs = []uint32{uid} })
	expect(t, dial(t, s).do("PING"), "PONG")
	s2 := func() *unixapi.Server {
		cfg := unixapi.DefaultConfig()
		cfg.Path, cfg.Logger, cfg.AllowUIDs = sockPath(t), testLogger(), []uint32{uid + 1}
		s, err := unixapi.Listen(cfg, testBroker)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}()
	// The refusal is sent on connect, and the connection closed at once:
	// writing a request first could race with the close (EPIPE).
	c := dial(t, s2)
	expectPrefix(t, c.read(), "ERR forbidden ")
	c.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if l, err := c.br.ReadString('\n'); err == nil {
		t.Fatalf("refused connection still open: %q", l)
	}
}

func TestSocketFile(t *testing.T) {
	s := serve(t, func(c *unixapi.Config) { c.Mode = 0o600 })
	fi, err := os.Lstat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want socket 0600", fi.Mode())
	}
	// A live socket is not taken over.
	cfg := unixapi.DefaultConfig()
	cfg.Path, cfg.Logger = s.Path(), testLogger()
	if _, err := unixapi.Listen(cfg, testBroker); !errors.Is(err, unixapi.ErrSocketInUse) {
		t.Fatalf("second Listen on a live socket: %v", err)
	}
	// Default mode 0660 whatever the umask; no temporary file left behind.
	s2 := serve(t, nil)
	fi, _ = os.Lstat(s2.Path())
	if fi.Mode().Perm() != 0o660 {
		t.Fatalf("default mode %v, want 0660", fi.Mode().Perm())
	}
	if ents, _ := os.ReadDir(filepath.Dir(s2.Path())); len(ents) != 1 {
		t.Fatalf("socket dir holds %d entries", len(ents))
	}
	// A stale socket (nobody accepts) is replaced.
	stale := sockPath(t)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	cfg.Path = stale
	s3, err := unixapi.Listen(cfg, testBroker)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	s3.Close()
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close left the socket file: %v", err)
	}
	// A regular file is never removed.
	if err := os.WriteFile(stale, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := unixapi.Listen(cfg, testBroker); !errors.Is(err, unixapi.ErrSocketInUse) {
		t.Fatalf("Listen over a regular file: %v", err)
	}
}

// Close releases every held lock and cancels pending acquires: b, on
// another server, gets the key within its 5 s wait, where a's 30 s lease
// would have kept it.
func TestServerCloseReleases(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a := dial(t, s)
	token(t, a.do("ACQUIRE "+k+" 30 0"))
	other := serve(t, nil)
	b := dial(t, other)
	b.send("ACQUIRE " + k + " 30 5")
	waitQueued(t, k, 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	token(t, b.read())
}

// noClusterBroker answers INFO as a broker that knows nothing yet, and
// refuses everything else: enough for the requests a session answers on
// its own.
type noClusterBroker struct{}

var errNoCluster = errors.New("noClusterBroker: no cluster")

func (noClusterBroker) AcquireAsyncOpts([]string, string, time.Duration, time.Duration, sidecar.AcquireOptions,
	func(sidecar.Lock, error)) (func(error), error) {
	return nil, errNoCluster
}
func (noClusterBroker) ReleaseAsync(sidecar.Lock, func(error)) error { return errNoCluster }
func (noClusterBroker) ExtendAsync(sidecar.Lock, time.Duration, func(sidecar.Lock, error)) error {
	return errNoCluster
}
func (noClusterBroker) SetPermitsAsync(string, uint32, func(error)) error       { return errNoCluster }
func (noClusterBroker) WatchLost(sidecar.Lock, func(sidecar.LostReason)) func() { return func() {} }
func (noClusterBroker) WatchLoss(sidecar.Lock, func(sidecar.Loss)) func()       { return func() {} }
func (noClusterBroker) Compensate(sidecar.Lock)                                 {}
func (noClusterBroker) Info() sidecar.Info                                      { return sidecar.Info{} }

// HELLO answers the version both speak, INFO says protocol=4 and the
// session fields (no session), and neither needs the cluster. A block
// ACQUIRE's key-set errors are answered by the parser, before the broker
// is asked.
func TestHelloAndProtocolVersion(t *testing.T) {
	cfg := unixapi.DefaultConfig()
	cfg.Path, cfg.Logger = sockPath(t), testLogger()
	s, err := unixapi.Listen(cfg, noClusterBroker{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c := dial(t, s)
	expect(t, c.do("PING"), "PONG") // HELLO is optional
	for _, tc := range []struct{ hello, reply string }{
		{"HELLO 1", "HELLO 1"}, {"HELLO 2", "HELLO 2"}, {"HELLO 3", "HELLO 3"}, {"HELLO 65535", fmt.Sprintf("HELLO %d", unixapi.ProtocolVersion)}, {"HELLO 1\r", "HELLO 1"},
		// The events option (version 3): echoed when the version both
		// speak has events, silently off below it.
		{"HELLO 3 events", "HELLO 3 events"}, {"HELLO 65535 events", fmt.Sprintf("HELLO %d events", unixapi.ProtocolVersion)}, {"HELLO 2 events", "HELLO 2"},
		{"HELLO 3", "HELLO 3"},
	} {
		expect(t, c.do(tc.hello), tc.reply)
	}
	for _, l := range []string{"HELLO", "HELLO 0", "HELLO 65536", "HELLO two", "HELLO 2 3", "HELLO 3 EVENTS", "HELLO 3 events x", "HELLO 3  events"} {
		expectPrefix(t, c.do(l), "ERR bad_request ")
	}
	expect(t, c.do("INFO"), "INFO cluster=- leader=- connected=0/0 domain=- members=- protocol="+strconv.Itoa(unixapi.ProtocolVersion)+" sessions=auto session=- session_state=- "+
		"session_timeout_ms=0 session_resumes=0 session_opens=0 session_held=0 session_last_resume=outcomes:0,queued:0,void:0,repeated:0")
	// EXTEND, like RELEASE, of a lock this connection does not hold is
	// answered at once; its fields are checked first.
	expectPrefix(t, c.do("EXTEND k 7 30"), "ERR not_held ")
	expectPrefix(t, c.do("EXTEND k 7 0"), "ERR invalid_lease ")
	expectPrefix(t, c.do("EXTEND k 7 251"), "ERR invalid_lease ")
	expectPrefix(t, c.do("EXTEND k 0 30"), "ERR invalid_token ")
	expectPrefix(t, c.do("EXTEND k 7"), "ERR bad_request ")
	expectPrefix(t, c.do("EXTEND k 7 30 5"), "ERR bad_request ")
	expectPrefix(t, c.do("ACQUIRE a b a 30 0"), "ERR invalid_keys ")
	expectPrefix(t, c.do("ACQUIRE a b c d e f g h i j k l m n o p q 30 0"), "ERR invalid_keys ")
	expectPrefix(t, c.do("ACQUIRE a b 30 0"), "ERR internal ") // the broker's errNoCluster
	// Pipelined, in order, and the connection stays usable.
	c.send("HELLO 2", "ACQUIRE a a 30 5", "HELD", "PING")
	expect(t, c.read(), "HELLO 2")
	expectPrefix(t, c.read(), "ERR invalid_keys ")
	expect(t, c.read(), "HELD 0")
	expect(t, c.read(), "PONG")
}

// A block over the socket, end to end: all keys under one token, HELD
// listing each, a key reserved for a waiting block refusing a try, a
// RELEASE of any key handing the whole block on, and a closed connection
// releasing its block.
func TestBlockOverTheSocket(t *testing.T) {
	s := serve(t, nil)
	a, b, d := dial(t, s), dial(t, s), dial(t, s)
	t1 := token(t, a.do("ACQUIRE blk/s1 blk/s2 blk/s3 30 0"))
	expect(t, a.do("HELD"), fmt.Sprintf("HELD 3 blk/s1:%d blk/s2:%d blk/s3:%d", t1, t1, t1))
	// b's block waits for s3 (and reserves s4); a try of s4 is busy.
	b.send("ACQUIRE blk/s4 blk/s3 30 10")
	testkit.WaitFor(t, "b's block to queue", 10*time.Second, func() bool {
		n := 0
		li, _ := testCluster.Leader(context.Background())
		testCluster.Node(li).ReadState(func(st *locksm.State) { n = st.QueueLen("blk/s4") })
		return n == 1
	})
	expect(t, d.do("ACQUIRE blk/s4 30 0"), "BUSY")
	// Releasing by the middle key frees the block; b gets both keys.
	expect(t, a.do(fmt.Sprintf("RELEASE blk/s2 %d", t1)), "OK")
	t2 := token(t, b.read())
	if t2 <= t1 {
		t.Fatalf("block token %d after %d", t2, t1)
	}
	expect(t, a.do("HELD"), "HELD 0")
	expect(t, b.do("HELD"), fmt.Sprintf("HELD 2 blk/s3:%d blk/s4:%d", t2, t2))
	// A RELEASE with the old token is not this connection's any more.
	expectPrefix(t, a.do(fmt.Sprintf("RELEASE blk/s1 %d", t1)), "ERR not_held ")
	// d waits for s3; b's connection closes: its block is released, d gets s3.
	d.send("ACQUIRE blk/s3 30 10")
	b.close()
	t3 := token(t, d.read())
	if t3 <= t2 {
		t.Fatalf("token %d after the block's %d", t3, t2)
	}
	expect(t, d.do(fmt.Sprintf("RELEASE blk/s3 %d", t3)), "OK")
	expectPrefix(t, d.do("ACQUIRE blk/x blk/x 30 0"), "ERR invalid_keys ")
}

func TestInfoAndConfig(t *testing.T) {
	s := serve(t, nil)
	got := dial(t, s).do("INFO")
	// The sidecar learns the cluster's fencing domain from the nodes.
	if !strings.HasPrefix(got, "INFO cluster=dev leader=127.0.0.1:") || !strings.Contains(got, " connected=3/3 ") ||
		!strings.Contains(got, " domain="+testCluster.Domain+" ") {
		t.Fatalf("INFO: %q (domain %s)", got, testCluster.Domain)
	}
	// And the members, as the leader reports them: every server id, each a
	// voter, the leader with its client address (a follower shows "-", or
	// its address if it led before).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	li, err := testCluster.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	addrOf := map[string]string{}
	for i := range testCluster.Size() {
		addrOf[testCluster.Node(i).ServerID()] = testCluster.ClientAddr(i)
	}
	// The broker asks for them right after it learns the leader.
	var members string
	for deadline := time.Now().Add(5 * time.Second); ; {
		_, members, _ = strings.Cut(got, " members=")
		members, _, _ = strings.Cut(members, " ")
		if members != "-" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
		got = dial(t, s).do("INFO")
	}
	var ids []string
	for _, e := range strings.Split(members, ",") {
		idRole, addr, _ := strings.Cut(e, "@")
		cut := strings.LastIndexByte(idRole, ':')
		if cut < 0 {
			t.Fatalf("INFO members %q: entry %q", members, e)
		}
		id, role := idRole[:cut], idRole[cut+1:]
		ids = append(ids, id)
		leader := id == testCluster.Node(li).ServerID()
		if role != "voter" || leader && addr != addrOf[id] || !leader && addr != "-" && addr != addrOf[id] {
			t.Fatalf("INFO members %q: entry %q (leader %s at %s)", members, e, testCluster.Node(li).ServerID(), testCluster.ClientAddr(li))
		}
	}
	if len(ids) != 3 || !sort.StringsAreSorted(ids) || len(addrOf) != 3 {
		t.Fatalf("INFO members %q, want the 3 server ids %v sorted", members, addrOf)
	}
	for _, id := range ids {
		if _, ok := addrOf[id]; !ok {
			t.Fatalf("INFO members %q: unknown server %s", members, id)
		}
	}

	for _, bad := range []func(*unixapi.Config){
		func(c *unixapi.Config) { c.Path = "" },
		func(c *unixapi.Config) { c.Path = strings.Repeat("p", 108) },
		func(c *unixapi.Config) { c.MaxLineLen = 100 },
		func(c *unixapi.Config) { c.OwnerPrefix = "has space" },
		func(c *unixapi.Config) { c.OwnerPrefix = strings.Repeat("o", 108) },
		func(c *unixapi.Config) { c.Mode = os.ModeSetuid | 0o600 },
		func(c *unixapi.Config) { c.MaxInFlight = 4097 },
		func(c *unixapi.Config) { c.MaxInFlight = -1 },
	} {
		cfg := unixapi.DefaultConfig()
		cfg.Path = "/tmp/x.sock"
		bad(&cfg)
		if err := cfg.Validate(); !errors.Is(err, unixapi.ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v", cfg, err)
		}
	}
}

func TestTooManyConnections(t *testing.T) {
	s := serve(t, func(c *unixapi.Config) { c.MaxConns = 2 })
	a, b := dial(t, s), dial(t, s)
	expect(t, a.do("PING"), "PONG")
	expect(t, b.do("PING"), "PONG")
	c := dial(t, s)
	expectPrefix(t, c.read(), "ERR too_many_connections ")
}

// A client that only shuts down its sending side (`printf ... | socat`)
// still gets every reply, HELD reflects the earlier requests, and its locks
// are released when the session then ends.
func TestHalfCloseAnswersThenReleases(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a := dial(t, s)
	a.send("ACQUIRE "+k+" 30 2", "HELD")
	if err := a.c.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	tok := token(t, a.read())
	expect(t, a.read(), fmt.Sprintf("HELD 1 %s:%d", k, tok))
	if line, err := a.br.ReadString('\n'); err == nil {
		t.Fatalf("session did not end after the replies: %q", line)
	}
	// The session ended and released the key: b gets it within its 5 s
	// wait, where the 30 s lease would have kept it.
	b := dial(t, s)
	token(t, b.do("ACQUIRE "+k+" 30 5"))
}

// An inherited listener (socket activation) is served as it is: no file is
// created at Path, the file's mode is left alone, and Close closes the
// listener but leaves the socket file, which belongs to systemd.
func TestInheritedListener(t *testing.T) {
	path := sockPath(t)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o606); err != nil {
		t.Fatal(err)
	}
	cfg := unixapi.DefaultConfig()
	cfg.Logger, cfg.Listener = testLogger(), ln
	s, err := unixapi.Listen(cfg, testBroker)
	if err != nil {
		t.Fatal(err)
	}
	if s.Path() != path {
		t.Fatalf("Path() = %q, want the listener's %q", s.Path(), path)
	}
	expect(t, dial(t, s).do("PING"), "PONG")
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != 0o606 {
		t.Fatalf("inherited socket file changed: %v %v", fi, err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Fatalf("socket dir holds %d entries", len(ents))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("Close removed the inherited socket file: %v %v", fi, err)
	}
	if _, err := net.Dial("unix", path); err == nil {
		t.Fatal("the listener still accepts after Close")
	}

	// Validate: Path is optional with a Listener; the listener must be a
	// unix stream socket.
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	cfg.Listener = tcp
	if err := cfg.Validate(); !errors.Is(err, unixapi.ErrInvalidConfig) {
		t.Fatalf("Validate with a TCP listener: %v", err)
	}
	pkt, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sockPath(t), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer pkt.Close()
	cfg.Listener = pkt
	if err := cfg.Validate(); !errors.Is(err, unixapi.ErrInvalidConfig) {
		t.Fatalf("Validate with a seqpacket listener: %v", err)
	}
	cfg.Listener, cfg.Path = nil, ""
	if err := cfg.Validate(); !errors.Is(err, unixapi.ErrInvalidConfig) {
		t.Fatalf("Validate without Path or Listener: %v", err)
	}
}

// An ACQUIRE still waiting when the server closes (the sidecar's SIGTERM)
// is answered ERR shutting_down, as PROTOCOL.md says, not cancelled.
func TestServerCloseAnswersWaitingAcquireShuttingDown(t *testing.T) {
	holder := serve(t, nil)
	k := key(t)
	a := dial(t, holder)
	token(t, a.do("ACQUIRE "+k+" 30 0"))
	s := serve(t, nil)
	b := dial(t, s)
	b.send("ACQUIRE " + k + " 30 20")
	// Wait until the leader has it queued.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		li, err := testCluster.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rep, err := testCluster.Node(li).Inspect(k); err == nil && rep.QueueLen == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the ACQUIRE never queued")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := b.read(); !strings.HasPrefix(got, "ERR shutting_down ") {
		t.Fatalf("waiting ACQUIRE at Close: %q, want ERR shutting_down", got)
	}
	// The holder on the other server is untouched.
	if got := a.do("HELD"); !strings.Contains(got, k+":") {
		t.Fatalf("holder after the other server's Close: %q", got)
	}
}

// Replies come back in request order whoever writes them: replies the
// sidecar gives at once (PONG, refusals) and the broker's (OK, BUSY),
// delivered by whichever goroutine answers them, and HELD, computed when
// its turn comes. The client reads slowly, through a small receive
// buffer, so deliveries meet a full socket and leave their rest to the
// writer.
func TestRepliesInRequestOrderUnderSlowReads(t *testing.T) {
	s := serve(t, nil)
	busy := key(t)
	token(t, dial(t, s).do("ACQUIRE "+busy+" 60 0"))
	c := dial(t, s)
	if uc, ok := c.c.(*net.UnixConn); ok {
		if err := uc.SetReadBuffer(1024); err != nil {
			t.Fatal(err)
		}
	}
	const groups = 200
	var lines []string
	for i := range groups {
		lines = append(lines,
			fmt.Sprintf("ACQUIRE %s/%d 60 0", busy, i),
			"PING",
			"ACQUIRE "+busy+" 60 0",
			"HELD",
			fmt.Sprintf("RELEASE %s/none 1", busy),
		)
	}
	go func() {
		// The requests outrun the reads: all of them are sent before the
		// first reply is read.
		c.c.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, _ = c.c.Write([]byte(strings.Join(lines, "\n") + "\n")) // a failed write shows as missing replies below
	}()
	time.Sleep(200 * time.Millisecond) // let replies pile up against the small buffer
	for i := range groups {
		token(t, c.read())
		expect(t, c.read(), "PONG")
		expect(t, c.read(), "BUSY")
		// HELD reflects every earlier request (and may already count
		// later grants: it is computed when written).
		held := c.read()
		if f := strings.Fields(held); len(f) < 2 || f[0] != "HELD" {
			t.Fatalf("group %d: got %.80q, want HELD ...", i, held)
		} else if n, err := strconv.Atoi(f[1]); err != nil || n < i+1 || n > groups {
			t.Fatalf("group %d: got HELD %s, want %d..%d", i, f[1], i+1, groups)
		}
		expectPrefix(t, c.read(), "ERR not_held")
		if i%20 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
}
