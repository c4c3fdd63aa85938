package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/locksm"
)

func testLogger() *slog.Logger {
	if os.Getenv("TICKETING_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func startCluster(t *testing.T) *local.Cluster {
	t.Helper()
	c, err := local.Start(local.Options{Dir: t.TempDir(), Tune: local.FastRaft, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func leaderOf(t *testing.T, c *local.Cluster) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	i, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func newBroker(t *testing.T, c *local.Cluster, tune func(*Config)) *Broker {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.ClusterID, cfg.Logger = c.ClientAddrs(), c.ClientSecret, c.ClusterID, testLogger()
	if tune != nil {
		tune(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	// Start from a settled state: the broker knows the serving leader (a
	// stale hint would earn a definite ErrMoved, which the tests below do
	// not expect unless they provoke it).
	testkit.WaitFor(t, "broker to know the serving leader", 10*time.Second, func() bool {
		return b.Info().Leader == c.ClientAddr(leaderOf(t, c))
	})
	return b
}

// sessionsOff pins a test to the session-less broker: what it checks is
// today's behaviour against a cluster of version 6, which a cluster of
// version 7 changes (definite outcomes across a lost connection).
func sessionsOff(cfg *Config) { cfg.Sessions = SessionsOff }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func holder(c *local.Cluster, i int, key string) (locksm.Holder, bool) {
	var h locksm.Holder
	var ok bool
	c.Node(i).ReadState(func(st *locksm.State) { h, ok = st.Holder(key) })
	return h, ok
}

func TestBrokerFIFOHandOff(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	ctx := ctxT(t, 30*time.Second)
	first, err := b.Acquire(ctx, "seats/1", "w0", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "seats/1", "w0", 30*time.Second, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("second acquire with wait 0: %v, want ErrBusy", err)
	}
	if time.Until(first.ValidUntil) > 30*time.Second || time.Until(first.ValidUntil) < 25*time.Second {
		t.Fatalf("validity deadline %v not about a lease from now", time.Until(first.ValidUntil))
	}
	// Three waiters queue in order; each release hands over to the next.
	type res struct {
		i  int
		lk Lock
		at time.Time
	}
	got := make(chan res, 3)
	li := leaderOf(t, c)
	for i := 1; i <= 3; i++ {
		go func(i int) {
			lk, err := b.Acquire(ctx, "seats/1", fmt.Sprintf("w%d", i), 30*time.Second, 20*time.Second)
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			got <- res{i, lk, time.Now()}
		}(i)
		testkit.WaitFor(t, "waiter queued", 5*time.Second, func() bool {
			var n int
			c.Node(li).ReadState(func(st *locksm.State) { n = len(st.Waiters("seats/1")) })
			return n == i
		})
	}
	prev := first
	for i := 1; i <= 3; i++ {
		if err := b.Release(ctx, prev); err != nil {
			t.Fatalf("release %d: %v", i-1, err)
		}
		r := <-got
		if r.i != i || r.lk.Token <= prev.Token {
			t.Fatalf("hand-off %d went to waiter %d with token %d (previous %d)", i, r.i, r.lk.Token, prev.Token)
		}
		prev = r.lk
	}
	if err := b.Release(ctx, prev); err != nil {
		t.Fatal(err)
	}
	// A release of something no longer held is a definite error.
	if err := b.Release(ctx, prev); !errors.Is(err, locksm.ErrNotHeld) {
		t.Fatalf("double release: %v, want ErrNotHeld", err)
	}
}

func TestBrokerTimeoutAndFieldErrors(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	ctx := ctxT(t, 30*time.Second)
	if _, err := b.Acquire(ctx, "k", "a", 30*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "k", "b", 30*time.Second, 200*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
	for _, tc := range []struct {
		lease, wait time.Duration
		key         string
		want        error
	}{
		{0, 0, "k", locksm.ErrInvalidLease},
		{1500 * time.Millisecond, 0, "k", locksm.ErrInvalidLease},
		{251 * time.Second, 0, "k", locksm.ErrInvalidLease},
		{time.Second, 3601 * time.Second, "k", locksm.ErrInvalidWait},
		{time.Second, 0, "bad key", locksm.ErrInvalidKey},
	} {
		if _, err := b.Acquire(ctx, tc.key, "a", tc.lease, tc.wait); !errors.Is(err, tc.want) {
			t.Errorf("lease %v wait %v key %q: %v, want %v", tc.lease, tc.wait, tc.key, err, tc.want)
		}
	}
}

// An M is a hint for later requests, never grounds to resend a written one.
func TestBrokerMovedIsRememberedNotResent(t *testing.T) {
	c := startCluster(t)
	// Session-less: with a session, lock requests go only on the
	// connection it is attached to, which is the serving leader's.
	b := newBroker(t, c, sessionsOff)
	ctx := ctxT(t, 30*time.Second)
	li := leaderOf(t, c)
	testkit.WaitFor(t, "broker knows the leader", 5*time.Second, func() bool { return b.Info().Leader == c.ClientAddr(li) })
	fi := (li + 1) % 3
	// Followers must know the leader's client address for a useful M.
	testkit.WaitFor(t, "follower knows the leader's client address", 5*time.Second, func() bool {
		st := c.Node(fi)
		return st != nil && st.StatusReport().LeaderClientAddr == c.ClientAddr(li)
	})
	b.setLeader(c.ClientAddr(fi)) // a stale hint, as after a leader change
	_, err := b.Acquire(ctx, "k", "a", 30*time.Second, 5*time.Second)
	if !errors.Is(err, ErrMoved) {
		t.Fatalf("acquire at a follower: %v, want ErrMoved", err)
	}
	if _, ok := holder(c, li, "k"); ok {
		t.Fatal("the acquire answered with M was executed")
	}
	if got := b.Info().Leader; got != c.ClientAddr(li) {
		t.Fatalf("broker remembers leader %q, want %q", got, c.ClientAddr(li))
	}
	if _, err := b.Acquire(ctx, "k", "a", 30*time.Second, 0); err != nil {
		t.Fatalf("next acquire, straight to the leader: %v", err)
	}
}

// The leader dies while an acquire waits there: Indeterminate, never a
// grant that is then lost.
func TestBrokerLeaderKillDuringPendingAcquire(t *testing.T) {
	c := startCluster(t)
	// Session-less semantics (a cluster of version 6, or Sessions off):
	// with a session the outcome is definite (session_e2e_test.go).
	b := newBroker(t, c, sessionsOff)
	ctx := ctxT(t, 30*time.Second)
	held, err := b.Acquire(ctx, "k", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	li := leaderOf(t, c)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "k", "waiter", 60*time.Second, 20*time.Second)
		errc <- err
	}()
	testkit.WaitFor(t, "waiter queued", 5*time.Second, func() bool {
		var n int
		c.Node(li).ReadState(func(st *locksm.State) { n = len(st.Waiters("k")) })
		return n == 1
	})
	c.Stop(li)
	if err := <-errc; !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("pending acquire at a killed leader: %v, want ErrIndeterminate", err)
	}
	// The holder keeps its lock on the new leader and releases it there;
	// the broker heals by itself.
	if err := b.Release(ctx, held); err != nil {
		t.Fatalf("release on the new leader: %v", err)
	}
	if _, err := b.Acquire(ctx, "k", "next", 10*time.Second, 0); err != nil {
		t.Fatalf("acquire after failover: %v", err)
	}
}

// stallConn lets a test hold back writes or reads of a connection.
type stallConn struct {
	net.Conn
	mu          sync.Mutex
	stallWrites bool
	stallReads  bool
	resume      chan struct{}
	closed      chan struct{}
	once        sync.Once
	blocked     int // writes waiting in gate
}

func (s *stallConn) gate(reads bool) {
	for {
		s.mu.Lock()
		stalled := s.stallWrites
		if reads {
			stalled = s.stallReads
		}
		resume := s.resume
		s.mu.Unlock()
		if !stalled {
			return
		}
		if !reads {
			s.mu.Lock()
			s.blocked++
			s.mu.Unlock()
			defer func() { s.mu.Lock(); s.blocked--; s.mu.Unlock() }()
		}
		select {
		case <-resume:
		case <-s.closed:
			return
		}
	}
}

func (s *stallConn) Write(p []byte) (int, error) { s.gate(false); return s.Conn.Write(p) }

// Read holds back what arrived, so a reader already blocked in Read is
// stalled too. What is held back when the connection closes is lost, as on
// a dropped connection.
func (s *stallConn) Read(p []byte) (int, error) {
	n, err := s.Conn.Read(p)
	s.gate(true)
	select {
	case <-s.closed:
		return 0, net.ErrClosed
	default:
	}
	return n, err
}

// Close closes the socket before it lets stalled calls go, so a stalled
// Write fails instead of slipping its bytes out.
func (s *stallConn) Close() error {
	err := s.Conn.Close()
	s.once.Do(func() { close(s.closed) })
	return err
}

func (s *stallConn) blockedWrites() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocked
}

func (s *stallConn) set(writes, reads bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stallWrites, s.stallReads = writes, reads
	close(s.resume)
	s.resume = make(chan struct{})
}

// seedOnly configures a broker with the one address seed and no
// membership following (it refuses every learned address), so that its
// two connections to seed are all it has.
func seedOnly(cfg *Config, seed string) {
	cfg.Addrs = []string{seed}
	cfg.AllowAddr = func(addr string) error {
		if addr != seed {
			return errors.New("test: seed only")
		}
		return nil
	}
}

type stallDialer struct {
	mu    sync.Mutex
	conns []*stallConn
}

func (d *stallDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	sc := &stallConn{Conn: c, resume: make(chan struct{}), closed: make(chan struct{})}
	d.mu.Lock()
	d.conns = append(d.conns, sc)
	d.mu.Unlock()
	return sc, nil
}

func (d *stallDialer) all() []*stallConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*stallConn(nil), d.conns...)
}

// An acquire that was still queued behind a stalled write when its
// connection dropped was never sent: the broker retries it on the other
// connection. The one whose bytes were being written is Indeterminate.
func TestBrokerUnwrittenAcquireIsRetried(t *testing.T) {
	c := startCluster(t)
	li := leaderOf(t, c)
	d := &stallDialer{}
	// One address: two connections to it (and none to the other members).
	// Session-less: both connections take acquires (a session uses only
	// its own).
	b := newBroker(t, c, func(cfg *Config) { seedOnly(cfg, c.ClientAddr(li)); cfg.Dialer = d.dial; sessionsOff(cfg) })
	ctx := ctxT(t, 30*time.Second)
	testkit.WaitFor(t, "two connections", 5*time.Second, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.slots[0].conn != nil && b.slots[1].conn != nil && b.leader != ""
	})
	if _, err := b.Acquire(ctx, "warm", "a", 10*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	conns := d.all()
	for _, sc := range conns {
		sc.set(true, false)
	}
	type out struct {
		lk  Lock
		err error
	}
	results := map[string]chan out{}
	launch := func(key string) {
		ch := make(chan out, 1)
		results[key] = ch
		go func() {
			lk, err := b.Acquire(ctx, key, "a", 10*time.Second, 5*time.Second)
			ch <- out{lk, err}
		}()
	}
	blockedOn := func() map[*stallConn]int {
		m := map[*stallConn]int{}
		for _, sc := range conns {
			if n := sc.blockedWrites(); n > 0 {
				m[sc] = n
			}
		}
		return m
	}
	// x goes to one connection, whose writer blocks in Write with x's bytes.
	launch("x")
	testkit.WaitFor(t, "x in a stalled write", 5*time.Second, func() bool { return len(blockedOn()) == 1 })
	var victim *stallConn
	for sc := range blockedOn() {
		victim = sc
	}
	// y goes to the other connection (round-robin), blocking it too.
	launch("y")
	testkit.WaitFor(t, "y in a stalled write", 5*time.Second, func() bool { return len(blockedOn()) == 2 })
	// z goes to x's connection again and waits behind the stalled write:
	// not one byte of it has been written.
	launch("z")
	testkit.WaitFor(t, "z queued", 5*time.Second, func() bool {
		n := 0
		b.mu.Lock()
		for _, s := range b.slots {
			if s.conn != nil {
				n += s.conn.InFlight()
			}
		}
		b.mu.Unlock()
		return n == 3
	})
	_ = victim.Close()
	for _, sc := range conns {
		if sc != victim {
			sc.set(false, false)
		}
	}
	x, y, z := <-results["x"], <-results["y"], <-results["z"]
	if !errors.Is(x.err, ErrIndeterminate) {
		t.Fatalf("x (written when the connection died): %v, want ErrIndeterminate", x.err)
	}
	if y.err != nil || z.err != nil {
		t.Fatalf("y: %v, z (never written, retried): %v", y.err, z.err)
	}
}

// Reconnects back off from 0.1 s, doubling to at most 3.2 s, and start over
// after a connection succeeds.
func TestBrokerBackoffSchedule(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // connection refused from now on
	var mu sync.Mutex
	var pauses []time.Duration
	enough := make(chan struct{})
	cfg := DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.Logger = []string{addr, addr}, []byte("0123456789abcdef"), testLogger()
	cfg.After = func(d time.Duration) <-chan time.Time {
		mu.Lock()
		defer mu.Unlock()
		// Only the first slot's schedule: both dial the same address, so
		// record every pause and check the sequence of one of them below.
		pauses = append(pauses, d)
		if len(pauses) == 20 {
			close(enough)
		}
		ch := make(chan time.Time, 1)
		ch <- time.Now()
		return ch
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-enough:
	case <-time.After(20 * time.Second):
		t.Fatal("broker did not retry")
	}
	b.Close()
	mu.Lock()
	defer mu.Unlock()
	// Two slots (one address given twice → 2 slots; ignore the duplicate)
	// interleave: count occurrences instead of order.
	want := []time.Duration{100, 200, 400, 800, 1600, 3200}
	for _, w := range want {
		found := false
		for _, p := range pauses {
			if p == w*time.Millisecond {
				found = true
			}
		}
		if !found {
			t.Fatalf("backoff %v never used: %v", w*time.Millisecond, pauses)
		}
	}
	for _, p := range pauses {
		if p > 3200*time.Millisecond || p < 100*time.Millisecond {
			t.Fatalf("backoff %v outside 0.1..3.2s: %v", p, pauses)
		}
	}
}

// Release retries end 5 s after the release was requested, and a release
// is reported successful only on a success reply.
func TestBrokerReleaseDeadline(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	ctx := ctxT(t, 30*time.Second)
	lk, err := b.Acquire(ctx, "k", "a", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	li := leaderOf(t, c)
	c.Stop((li + 1) % 3)
	c.Stop((li + 2) % 3) // no majority: nothing can commit
	start := time.Now()
	err = b.Release(ctx, lk)
	el := time.Since(start)
	if !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("release without a majority: %v, want ErrIndeterminate", err)
	}
	if el < DefaultReleaseDeadline-100*time.Millisecond || el > DefaultReleaseDeadline+2*time.Second {
		t.Fatalf("release gave up after %v, want about %v", el, DefaultReleaseDeadline)
	}
}

// A grant whose reply arrives after the caller gave up is released at once
// with its exact token.
func TestBrokerCompensatesLateGrant(t *testing.T) {
	c := startCluster(t)
	li := leaderOf(t, c)
	d := &stallDialer{}
	b := newBroker(t, c, func(cfg *Config) {
		seedOnly(cfg, c.ClientAddr(li))
		cfg.Dialer = d.dial
		cfg.ReplyGrace = 300 * time.Millisecond
	})
	ctx := ctxT(t, 30*time.Second)
	if _, err := b.Acquire(ctx, "warm", "a", 10*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	for _, sc := range d.all() {
		sc.set(false, true) // replies are held back
	}
	_, err := b.Acquire(ctx, "k", "late", 60*time.Second, 0)
	if !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("acquire without a timely reply: %v, want ErrIndeterminate", err)
	}
	h, ok := holder(c, li, "k")
	if !ok || h.Owner != "late" {
		t.Fatalf("the grant should have committed: %+v %v", h, ok)
	}
	for _, sc := range d.all() {
		sc.set(false, false) // the G arrives now
	}
	testkit.WaitFor(t, "the late grant released", 5*time.Second, func() bool {
		_, ok := holder(c, li, "k")
		return !ok
	})
	reg := b.MetricsRegistry()
	wantValue(t, reg, 1, "ticketing_sidecar_acquires_total", "result", "indeterminate")
	wantValue(t, reg, 1, "ticketing_sidecar_late_grants_total")
	testkit.WaitFor(t, "the compensation counted", 5*time.Second, func() bool {
		return metricValue(t, reg, "ticketing_sidecar_compensations_total", "result", "ok") == 1
	})
}

func TestBrokerSingleAddressSurvivesOneDrop(t *testing.T) {
	c := startCluster(t)
	li := leaderOf(t, c)
	d := &stallDialer{}
	b := newBroker(t, c, func(cfg *Config) { seedOnly(cfg, c.ClientAddr(li)); cfg.Dialer = d.dial })
	ctx := ctxT(t, 30*time.Second)
	testkit.WaitFor(t, "two connections", 5*time.Second, func() bool { return len(d.all()) == 2 && b.Info().Leader != "" })
	_ = d.all()[0].Close()
	testkit.WaitFor(t, "the broker to notice the drop", 5*time.Second, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.slots[0].conn == nil || b.slots[1].conn == nil
	})
	for i := 0; i < 10; i++ {
		lk, err := b.Acquire(ctx, fmt.Sprintf("k%d", i), "a", 10*time.Second, 0)
		if err != nil {
			t.Fatalf("acquire %d with one of two connections down: %v", i, err)
		}
		if err := b.Release(ctx, lk); err != nil {
			t.Fatal(err)
		}
	}
}

// Tokens of two fencing domains are not comparable, so one broker must
// never hand out tokens from both: it holds to the first domain a node
// names and refuses nodes of any other (a second cluster started with the
// same cluster id and secret, e.g. after `bootstrap --new-domain` on some
// of the old machines while a stale node still runs).
func TestBrokerRefusesASecondFencingDomain(t *testing.T) {
	a := startCluster(t)
	dirB := t.TempDir()
	secret, err := os.ReadFile(a.SecretFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dirB+"/client.secret", secret, 0o600); err != nil {
		t.Fatal(err)
	}
	b2, err := local.Start(local.Options{Dir: dirB, Tune: local.FastRaft, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b2.Close() })
	leaderOf(t, b2)
	if a.Domain == "" || b2.Domain == "" || a.Domain == b2.Domain {
		t.Fatalf("domains %q and %q", a.Domain, b2.Domain)
	}
	// Every node names its domain only once it applied the entry that
	// set it; until then a broker pinned to the domain refuses it and
	// backs off (up to 3.2 s between attempts), which under a loaded CI
	// outlasted the wait for A's three connections below.
	for _, c := range []*local.Cluster{a, b2} {
		testkit.WaitFor(t, "every node to know its domain", 20*time.Second, func() bool {
			for i := 0; i < c.Size(); i++ {
				if c.Node(i).Domain() != c.Domain {
					return false
				}
			}
			return true
		})
	}

	// Pinned to A's domain by config: B's nodes are refused at the handshake.
	dials := newDialLog()
	br := newBroker(t, a, func(cfg *Config) {
		cfg.Domain = a.Domain
		cfg.Addrs = append(a.ClientAddrs(), b2.ClientAddrs()...)
		cfg.Dialer = dials.dial
	})
	ctx := ctxT(t, 30*time.Second)
	testkit.WaitFor(t, "A's three nodes connected", 5*time.Second, func() bool { return len(br.Info().Connected) == 3 })
	// B's nodes had their chance: each was dialled and let go.
	testkit.WaitFor(t, "B's nodes refused", 10*time.Second, func() bool { return dials.allClosed(b2.ClientAddrs()) })
	in := br.Info()
	if in.Domain != a.Domain || len(in.Connected) != 3 {
		t.Fatalf("info %+v, want only A's nodes (domain %s)", in, a.Domain)
	}
	for _, addr := range in.Connected {
		for _, bad := range b2.ClientAddrs() {
			if addr == bad {
				t.Fatalf("connected to %s of domain %s", addr, b2.Domain)
			}
		}
	}
	lk, err := br.Acquire(ctx, "k", "o", 10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := holder(a, leaderOf(t, a), "k"); !ok {
		t.Fatal("the grant did not come from domain A")
	}
	if err := br.Release(ctx, lk); err != nil {
		t.Fatal(err)
	}

	// Unpinned: the first domain seen wins and the other is refused; it
	// never connects to both.
	dials = newDialLog()
	free := newBrokerAddrs(t, a, append(b2.ClientAddrs(), a.ClientAddrs()...), func(cfg *Config) { cfg.Dialer = dials.dial })
	testkit.WaitFor(t, "a domain pinned", 5*time.Second, func() bool { return free.Info().Domain != "" })
	want, other := a.ClientAddrs(), b2.ClientAddrs()
	if free.Info().Domain == b2.Domain {
		want, other = other, want
	}
	testkit.WaitFor(t, "the other domain's nodes refused, three connected", 10*time.Second, func() bool {
		return dials.allClosed(other) && len(free.Info().Connected) == 3
	})
	in = free.Info()
	if len(in.Connected) != 3 {
		t.Fatalf("connected %v in domain %s, want %v", in.Connected, in.Domain, want)
	}
	for _, addr := range in.Connected {
		ok := false
		for _, w := range want {
			ok = ok || addr == w
		}
		if !ok {
			t.Fatalf("connected %v in domain %s: %s is of the other domain", in.Connected, in.Domain, addr)
		}
	}

	// Pinned to a domain nobody serves: nothing connects, acquire is
	// unavailable (never a grant from a foreign domain).
	none := newBrokerAddrs(t, a, a.ClientAddrs(), func(cfg *Config) {
		cfg.Domain = "00000000000000000000000000000000"
		cfg.LeaderWait = 500 * time.Millisecond
	})
	if _, err := none.Acquire(ctx, "k2", "o", 10*time.Second, 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("acquire through a broker of a foreign domain: %v, want ErrUnavailable", err)
	}
	if got := none.Info(); len(got.Connected) != 0 {
		t.Fatalf("connected to %v of another domain", got.Connected)
	}
}

// dialLog is a broker's Dialer that notes, per address, whether a
// connection it dialled was closed: the broker closes the connections of
// the nodes it refuses.
type dialLog struct {
	mu     sync.Mutex
	closed map[string]bool
}

func newDialLog() *dialLog { return &dialLog{closed: map[string]bool{}} }

func (l *dialLog) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &loggedConn{Conn: c, onClose: func() {
		l.mu.Lock()
		l.closed[addr] = true
		l.mu.Unlock()
	}}, nil
}

// allClosed reports whether a connection to each of addrs was closed.
func (l *dialLog) allClosed(addrs []string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range addrs {
		if !l.closed[a] {
			return false
		}
	}
	return true
}

type loggedConn struct {
	net.Conn
	once    sync.Once
	onClose func()
}

func (c *loggedConn) Close() error {
	c.once.Do(c.onClose)
	return c.Conn.Close()
}

// newBrokerAddrs is a broker on addrs that does not wait for a leader.
func newBrokerAddrs(t *testing.T, c *local.Cluster, addrs []string, tune ...func(*Config)) *Broker {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.ClusterID, cfg.Logger = addrs, c.ClientSecret, c.ClusterID, testLogger()
	for _, f := range tune {
		f(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// Releases go out together, not one per worker: with a single release
// worker, 256 releases issued at once still share a few log entries
// (group commit), because each first attempt is sent straight to the
// leader. Sent one at a time by the worker, each would be its own entry.
// With ReleasesInFlight 1 the rest wait for the worker, and every release
// still succeeds. Their deadline (ReleaseDeadline, counted from each
// ReleaseAsync) is raised to 2 minutes: the worker sends 255 releases one
// after the other, one commit each, and under -race on two loaded cores
// that once took longer than the default 5 s (the last ones were
// Indeterminate), which is a speed the test does not claim.
func TestBrokerReleasesAreSentWithoutAWorker(t *testing.T) {
	for _, tc := range []struct {
		name       string
		inFlight   int
		maxEntries uint64 // log entries the 256 releases may take
	}{
		{"first attempts at once", 0, 64},
		{"one in flight, the rest by the worker", 1, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t)
			b := newBroker(t, c, func(cfg *Config) {
				cfg.ReleaseWorkers, cfg.ReleasesInFlight = 1, tc.inFlight
				cfg.ReleaseDeadline = 2 * time.Minute
			})
			ctx := ctxT(t, 3*time.Minute)
			const n = 256
			locks := make([]Lock, n)
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range locks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var err error
					locks[i], err = b.Acquire(ctx, fmt.Sprintf("k%d", i), "a", 60*time.Second, 0)
					if err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			r := c.Node(leaderOf(t, c)).Raft()
			before := r.LastIndex()
			done := make(chan error, n)
			for _, l := range locks {
				if err := b.ReleaseAsync(l, func(err error) { done <- err }); err != nil {
					t.Fatal(err)
				}
			}
			for range locks {
				if err := <-done; err != nil {
					t.Fatalf("release: %v", err)
				}
			}
			got := r.LastIndex() - before
			t.Logf("%d releases, %d log entries", n, got)
			if got > tc.maxEntries {
				t.Fatalf("%d releases took %d log entries, want at most %d", n, got, tc.maxEntries)
			}
			for i := range locks {
				if h, held := holder(c, leaderOf(t, c), fmt.Sprintf("k%d", i)); held {
					t.Fatalf("k%d still held after its release succeeded: %+v", i, h)
				}
			}
		})
	}
}

// Releases whose replies never come time out each at its own deadline,
// not before and not much after: their first attempts share one timer
// (deadlines.go), armed for the earliest and re-armed for the next.
func TestReleaseDeadlinesShareOneTimer(t *testing.T) {
	c := startCluster(t)
	li := leaderOf(t, c)
	d := &stallDialer{}
	const deadline = time.Second
	b := newBroker(t, c, func(cfg *Config) {
		seedOnly(cfg, c.ClientAddr(li))
		cfg.Dialer = d.dial
		sessionsOff(cfg)
		cfg.ReleaseDeadline = deadline
	})
	ctx := ctxT(t, 60*time.Second)
	var locks []Lock
	for i := 0; i < 5; i++ {
		lk, err := b.Acquire(ctx, fmt.Sprintf("k%d", i), "a", 60*time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, lk)
	}
	for _, sc := range d.all() {
		sc.mu.Lock()
		sc.stallReads = true // the releases are written; their replies are held back
		sc.mu.Unlock()
	}
	type result struct {
		i    int
		err  error
		took time.Duration
	}
	out := make(chan result, len(locks))
	for i, lk := range locks {
		start := time.Now()
		if err := b.ReleaseAsync(lk, func(err error) { out <- result{i, err, time.Since(start)} }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond)
	}
	for range locks {
		select {
		case r := <-out:
			if !errors.Is(r.err, ErrIndeterminate) {
				t.Errorf("release %d: %v, want ErrIndeterminate", r.i, r.err)
			}
			if r.took < deadline-20*time.Millisecond || r.took > deadline+2*time.Second {
				t.Errorf("release %d ended after %v, want its own deadline of %v", r.i, r.took, deadline)
			}
		case <-ctx.Done():
			t.Fatal("a release never ended: its deadline did not fire")
		}
	}
}
