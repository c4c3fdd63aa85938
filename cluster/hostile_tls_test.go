package cluster_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// hostileLimits are small limits, so each can be hit quickly.
func hostileLimits(cfg *cluster.Config) {
	// Long enough for TLS and the handshake on a loaded 2-core machine
	// under the race detector; the silent connections wait it out.
	cfg.HandshakeTimeout = 3 * time.Second
	cfg.IdleTimeout = 2 * time.Second
	// The three nodes share the process, and its 2 loaded cores, with the
	// hostile clients: under the race detector the default 500 ms leader
	// lease ran out once (the first request after Serving was answered M),
	// and an election would fail the good client for a reason this test
	// is not about. Nothing here moves leadership on purpose.
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 3*time.Second, 3*time.Second, 3*time.Second
	cfg.MaxClientConns = 300
	cfg.MaxInFlightPerConn = 64
	cfg.MaxReplyBacklog = 256 << 10
	cfg.MaxKeys = 200
	cfg.MaxWaitersPerKey = 5
	cfg.AuthFailureDelay = 50 * time.Millisecond
	cfg.AuthFailureDelayMax = 400 * time.Millisecond
}

// tlsRaw opens a TLS connection to node i without the authentication
// handshake.
func (c *testCluster) tlsRaw(t *testing.T, i int) *tls.Conn {
	t.Helper()
	raw, err := net.DialTimeout("tcp", c.ClientAddr(i), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	cfg := c.ClientTLS.Clone()
	cfg.ServerName = "127.0.0.1"
	tc := tls.Client(raw, cfg)
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	return tc
}

func binding(t *testing.T, tc *tls.Conn) []byte {
	st := tc.ConnectionState()
	b, err := st.ExportKeyingMaterial(wire.ExporterLabel, nil, wire.ChannelBindingLen)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tlsAuthed is tlsRaw plus a successful authentication handshake.
func (c *testCluster) tlsAuthed(t *testing.T, i int) (*tls.Conn, *wire.Reader) {
	t.Helper()
	return c.tlsAuthedVersion(t, i, 0)
}

// tlsAuthedVersion is tlsAuthed offering protocol version v at most (0:
// wire.ProtocolVersion).
func (c *testCluster) tlsAuthedVersion(t *testing.T, i int, v uint16) (*tls.Conn, *wire.Reader) {
	t.Helper()
	tc := c.tlsRaw(t, i)
	if _, err := wire.ClientHandshake(tc, wire.HandshakeConfig{Kind: wire.KindClient, Secret: c.ClientSecret,
		ClusterID: c.ClusterID, ChannelBinding: binding(t, tc), MaxVersion: v}); err != nil {
		t.Fatal(err)
	}
	return tc, wire.NewReader(tc)
}

// expectConnError reads until a connection-level E arrives (replies to
// earlier requests may come first) and then the close.
func expectConnError(t *testing.T, name string, r *wire.Reader, code wire.Code) {
	t.Helper()
	var m wire.Msg
	for {
		m = wire.Msg{}
		if err := r.ReadMsg(&m); err != nil {
			t.Fatalf("%s: want E(%s), got %v", name, code, err)
		}
		if m.Type == wire.TypeError && m.ID == 0 {
			break
		}
	}
	if m.Code != code {
		t.Fatalf("%s: want E(%s), got E(%s: %s)", name, code, m.Code, m.Text)
	}
	m = wire.Msg{}
	if err := r.ReadMsg(&m); err == nil {
		t.Fatalf("%s: connection still open after E: %+v", name, m)
	}
}

// goodClient acquires and releases its own key in a loop and records each
// cycle's latency; any failure is an error, but one: while a case fills
// the node's key table (MaxKeys is node-wide, cluster/PROTOCOL.md
// too_many_keys), an acquire of its own key, which it does not hold
// between cycles, is refused too. Those refusals are counted apart, by
// the case during which the acquire was sent (phase).
type goodClient struct {
	conn *client.Conn
	key  string

	mu          sync.Mutex
	phase       string
	lat         []time.Duration
	errs        []string
	keyLimit    map[string]int // too_many_keys refusals by phase
	served      []cycle        // every successful cycle
	n, servedOK atomic.Int64
}

// cycle is one acquire+release of the good client: sent at start, the
// release's reply read at end.
type cycle struct{ start, end time.Time }

// servedDuring counts the successful cycles that overlap [from, to]: in
// flight at some moment of it (a phase shorter than one cycle still has
// the cycle it fell into).
func (g *goodClient) servedDuring(from, to time.Time) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, c := range g.served {
		if !c.start.After(to) && !c.end.Before(from) {
			n++
		}
	}
	return n
}

func (g *goodClient) setPhase(p string) {
	g.mu.Lock()
	g.phase = p
	g.mu.Unlock()
}

func (g *goodClient) run(stop <-chan struct{}, done *sync.WaitGroup) {
	defer done.Done()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		start := time.Now()
		g.mu.Lock()
		phase := g.phase
		g.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, _, err := g.conn.Do(ctx, acquireMsg(g.key, "good", 30, time.Second))
		limited := err == nil && r.Type == wire.TypeError && r.Code == wire.CodeTooManyKeys
		if err == nil && r.Type == wire.TypeGranted {
			var rr wire.Msg
			rr, _, err = g.conn.Do(ctx, releaseMsg(g.key, "good", r.Token))
			if err == nil && rr.Type != wire.TypeOK {
				err = errors.New("release: " + describe(rr))
			}
		} else if err == nil {
			err = errors.New("acquire: " + describe(r))
		}
		cancel()
		g.mu.Lock()
		switch {
		case limited:
			if g.keyLimit == nil {
				g.keyLimit = map[string]int{}
			}
			g.keyLimit[phase]++
		case err != nil:
			g.errs = append(g.errs, fmt.Sprintf("during %q: %v", phase, err))
		default:
			end := time.Now()
			g.lat = append(g.lat, end.Sub(start))
			g.served = append(g.served, cycle{start, end})
			g.servedOK.Add(1)
		}
		g.mu.Unlock()
		g.n.Add(1)
	}
}

// window returns the p50 and p99 of cycles recorded since from, and
// forgets them.
func (g *goodClient) window() (p50, p99 time.Duration, n int) {
	g.mu.Lock()
	l := g.lat
	g.lat = nil
	g.mu.Unlock()
	if len(l) == 0 {
		return 0, 0, 0
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	return l[len(l)/2], l[len(l)*99/100], len(l)
}

// fillsKeyTable is the case of TestHostileClientsOverTLS that fills the
// leader's key table up to MaxKeys.
const fillsKeyTable = "max keys and max waiters"

// TestHostileClientsOverTLS: every kind of hostile or broken client gets a
// clear error or a close, and a well-behaved client on the same node keeps
// its lock and keeps getting served throughout.
func TestHostileClientsOverTLS(t *testing.T) {
	c := startClusterOpts(t, local.Options{TLS: true, Tune: hostileLimits})
	li := c.leader()
	node := c.Node(li)

	// A holder whose lock must survive everything below.
	keeper := c.dialKeepAlive(li)
	keepTok := mustGrant(t, do(t, keeper, acquireMsg("keeper", "keeper", 120, 0)))

	good := &goodClient{conn: c.dialKeepAlive(li), key: "good-key"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go good.run(stop, &wg)
	time.Sleep(time.Second)
	quietP50, quietP99, quietN := good.window()

	type tcase struct {
		name string
		run  func(t *testing.T)
	}
	cases := []tcase{
		{"plaintext on the TLS port", func(t *testing.T) {
			raw, err := net.Dial("tcp", c.ClientAddr(li))
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			raw.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = wire.ClientHandshake(raw, wire.HandshakeConfig{Kind: wire.KindClient, Secret: c.ClientSecret, ClusterID: c.ClusterID})
			if !errors.Is(err, wire.ErrTLSRequired) {
				t.Fatalf("plaintext handshake on a TLS port: %v, want tls_required", err)
			}
		}},
		{"garbage bytes before TLS", func(t *testing.T) {
			raw, err := net.Dial("tcp", c.ClientAddr(li))
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			raw.SetDeadline(time.Now().Add(5 * time.Second))
			mustWrite(t, raw, []byte("\x00\xff\xfeGET / HTTP/1.1\r\n\r\n"))
			expectConnError(t, "garbage", wire.NewReader(raw), wire.CodeTLSRequired)
		}},
		{"garbage instead of the hello", func(t *testing.T) {
			tc := c.tlsRaw(t, li)
			mustWrite(t, tc, bytes.Repeat([]byte{0xff}, 64))
			expectConnError(t, "garbage hello", wire.NewReader(tc), wire.CodeFrameTooLarge)
		}},
		{"wrong protocol version", func(t *testing.T) {
			tc := c.tlsRaw(t, li)
			h := []byte{0, 0, 0, 0, wire.TypeHello}
			h = append(h, wire.Magic...)
			h = append(h, 0, 1, 0, 1, byte(wire.KindClient))
			h = append(h, make([]byte, wire.NonceLen)...)
			h = append(h, byte(len(c.ClusterID)))
			h = append(h, c.ClusterID...)
			h = append(h, 0, 0)
			binary.BigEndian.PutUint32(h, uint32(len(h)-4))
			mustWrite(t, tc, h)
			expectConnError(t, "version 1", wire.NewReader(tc), wire.CodeVersion)
		}},
		{"wrong secret, slowed down", func(t *testing.T) {
			before := node.Stats().ClientAuthFailures
			var last time.Duration
			for i := 0; i < 4; i++ {
				tc := c.tlsRaw(t, li)
				start := time.Now()
				_, err := wire.ClientHandshake(tc, wire.HandshakeConfig{Kind: wire.KindClient, Secret: []byte("not-the-secret-at-all"),
					ClusterID: c.ClusterID, ChannelBinding: binding(t, tc)})
				if !errors.Is(err, wire.ErrAuthFailed) {
					t.Fatalf("wrong secret: %v", err)
				}
				// The node holds a failed connection before closing it,
				// longer with each recent failure from this address.
				_, _ = io.Copy(io.Discard, tc) // until the node closes it: the time is what counts
				last = time.Since(start)
			}
			if got := node.Stats().ClientAuthFailures - before; got < 4 {
				t.Fatalf("auth failures counted: %d, want >= 4", got)
			}
			if last < 400*time.Millisecond {
				t.Fatalf("the 4th failure in a row was closed after %v, want the escalated delay (>= 400ms)", last)
			}
		}},
		{"replayed handshake transcript", func(t *testing.T) {
			tc := c.tlsRaw(t, li)
			rec := &recorder{Conn: tc}
			if _, err := wire.ClientHandshake(rec, wire.HandshakeConfig{Kind: wire.KindClient, Secret: c.ClientSecret,
				ClusterID: c.ClusterID, ChannelBinding: binding(t, tc)}); err != nil {
				t.Fatal(err)
			}
			// The same Hello and Auth bytes on a new session: the server's
			// nonce and the TLS exporter differ, so the proof is useless.
			tc2 := c.tlsRaw(t, li)
			mustWrite(t, tc2, rec.buf.Bytes())
			if typ, _ := readRawFrame(t, tc2); typ != wire.TypeChallenge {
				t.Fatalf("replay: first frame %q, want the challenge", typ)
			}
			typ, payload := readRawFrame(t, tc2)
			var m wire.Msg
			if typ != wire.TypeError || wire.DecodeMsg(typ, payload, &m) != nil || m.Code != wire.CodeAuthFailed {
				t.Fatalf("replay: got frame %q %+v, want E(auth_failed)", typ, m)
			}
		}},
		{"proof relayed from another TLS session", func(t *testing.T) {
			// A relay that knows no secret forwards a real client's bytes
			// into its own TLS session with the node: the client signed
			// the binding of its session with the relay, not this one.
			tc := c.tlsRaw(t, li)
			_, err := wire.ClientHandshake(tc, wire.HandshakeConfig{Kind: wire.KindClient, Secret: c.ClientSecret,
				ClusterID: c.ClusterID, ChannelBinding: bytes.Repeat([]byte{9}, wire.ChannelBindingLen)})
			if !errors.Is(err, wire.ErrAuthFailed) {
				t.Fatalf("mismatched channel binding: %v, want auth_failed", err)
			}
		}},
		{"truncated frame, then close", func(t *testing.T) {
			tc, _ := c.tlsAuthed(t, li)
			mustWrite(t, tc, []byte{0, 0, 0, 40, wire.TypeAcquire, 0, 0})
			tc.Close()
		}},
		{"oversize frame", func(t *testing.T) {
			tc, r := c.tlsAuthed(t, li)
			mustWrite(t, tc, binary.BigEndian.AppendUint32(nil, 1<<20))
			expectConnError(t, "oversize", r, wire.CodeFrameTooLarge)
		}},
		{"unknown frame type", func(t *testing.T) {
			tc, r := c.tlsAuthed(t, li)
			mustWrite(t, tc, frame('q', []byte{1, 2, 3}))
			expectConnError(t, "unknown type", r, wire.CodeUnexpectedFrame)
		}},
		{"session open on a version 6 connection", func(t *testing.T) {
			// Version 7 frames decode, but a connection that negotiated
			// 6 (an older client) may not send them.
			tc, r := c.tlsAuthedVersion(t, li, wire.VersionExtend)
			b, _ := wire.AppendMsg(nil, &wire.Msg{Type: wire.TypeOpenSession, ID: 1, Session: 9, TimeoutMs: 10_000})
			mustWrite(t, tc, b)
			expectConnError(t, "open session", r, wire.CodeUnexpectedFrame)
		}},
		{"an outcomes event sent to the node", func(t *testing.T) {
			tc, r := c.tlsAuthed(t, li)
			b, _ := wire.AppendMsg(nil, &wire.Msg{Type: wire.TypeOutcomes, Session: 9, Serial: 1})
			mustWrite(t, tc, b)
			expectConnError(t, "outcomes event", r, wire.CodeUnexpectedFrame)
		}},
		{"slowloris: half a frame, then silence", func(t *testing.T) {
			tc, r := c.tlsAuthed(t, li)
			mustWrite(t, tc, []byte{0, 0, 0, 20, wire.TypeAcquire, 0, 0, 0})
			expectConnError(t, "slowloris", r, wire.CodeIdleTimeout)
		}},
		{"huge pipeline of acquires", func(t *testing.T) {
			tc, r := c.tlsAuthed(t, li)
			var buf []byte
			const n = 1000
			for i := 1; i <= n; i++ {
				b, _ := wire.AppendMsg(nil, &wire.Msg{Type: wire.TypeAcquire, ID: uint64(i), Key: "pipe", Owner: "p" + itoa(i), Lease: 5, WaitMs: 0})
				buf = append(buf, b...)
			}
			go func() { _, _ = tc.Write(buf) }() // the node may close it mid-way; the replies tell
			counts := map[string]int{}
			for i := 0; i < n; i++ {
				var m wire.Msg
				if err := r.ReadMsg(&m); err != nil {
					t.Fatalf("after %d replies: %v", i, err)
				}
				switch {
				case m.Type == wire.TypeError:
					counts[m.Code.String()]++
				default:
					counts[string(rune(m.Type))]++
				}
			}
			// One grant, busy for the others admitted, and the rest refused
			// by the in-flight limit: each a definite reply of its own.
			if counts["G"] != 1 || counts["too_many_in_flight"] == 0 || counts["G"]+counts["B"]+counts["too_many_in_flight"] != n {
				t.Fatalf("replies %v", counts)
			}
		}},
		{"pings without reading the replies", func(t *testing.T) {
			tc, _ := c.tlsAuthed(t, li)
			before := node.Stats().SlowConsumerCloses
			ping := frame(wire.TypePing, binary.BigEndian.AppendUint64(nil, 1))
			// Distinct ids are not needed for pings to pile up replies.
			batch := bytes.Repeat(ping, 4096)
			tc.SetWriteDeadline(time.Now().Add(10 * time.Second))
			for i := 0; i < 200; i++ {
				if _, err := tc.Write(batch); err != nil {
					break // cut off: what we wanted
				}
			}
			testkit.WaitFor(t, "slow consumer cut off", 10*time.Second, func() bool { return node.Stats().SlowConsumerCloses > before })
		}},
		{fillsKeyTable, func(t *testing.T) {
			conn := c.dialKeepAlive(li)
			var toks []uint64
			var refusedKeys bool
			for i := 0; i < 250; i++ {
				r := do(t, conn, acquireMsg("k"+itoa(i), "many", 60, 0))
				if r.Type == wire.TypeError && r.Code == wire.CodeTooManyKeys {
					refusedKeys = true
					break
				}
				toks = append(toks, mustGrant(t, r))
			}
			if !refusedKeys || len(toks) > 200 {
				t.Fatalf("granted %d keys with MaxKeys 200, refused: %v", len(toks), refusedKeys)
			}
			for i, tok := range toks {
				mustType(t, do(t, conn, releaseMsg("k"+itoa(i), "many", tok)), wire.TypeOK)
			}
			// Five waiters fit on one key; the sixth is refused at once.
			tok := mustGrant(t, do(t, conn, acquireMsg("queue", "head", 60, 0)))
			var calls []*client.Call
			for i := 0; i < 5; i++ {
				call, err := conn.Start(acquireMsg("queue", "w"+itoa(i), 60, 30*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				calls = append(calls, call)
			}
			testkit.WaitFor(t, "five waiters", 5*time.Second, func() bool {
				n := 0
				node.ReadState(func(s *locksm.State) { n = s.QueueLen("queue") })
				return n == 5
			})
			r := do(t, conn, acquireMsg("queue", "sixth", 60, 30*time.Second))
			if r.Type != wire.TypeError || r.Code != wire.CodeTooManyWaiters {
				t.Fatalf("sixth waiter: %s, want E(too_many_waiters)", describe(r))
			}
			mustType(t, do(t, conn, releaseMsg("queue", "head", tok)), wire.TypeOK)
			<-calls[0].Done
			if calls[0].Reply.Type != wire.TypeGranted {
				t.Fatalf("first waiter after release: %s", describe(calls[0].Reply))
			}
		}},
		{"garbage and floods on the peer port", func(t *testing.T) {
			// Replication to the followers must go on (the good client's
			// commits prove it) while the leader's peer port is flooded.
			before := node.Stats().PeerAuthFailures
			var conns []net.Conn
			for i := 0; i < 300; i++ {
				nc, err := net.Dial("tcp", c.PeerAddr(li))
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, nc)
				if i%2 == 0 {
					_, _ = nc.Write([]byte("\x00\x00\x00\x05hello raft, let me in")) // the node may already have refused it: either way it is not admitted
				}
			}
			for _, nc := range conns {
				nc.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, _ = io.Copy(io.Discard, nc) // until the node closes it or the deadline
				nc.Close()
			}
			testkit.WaitFor(t, "peer admissions refused", 5*time.Second, func() bool { return node.Stats().PeerAuthFailures > before })
		}},
		{"thousands of idle connections", func(t *testing.T) {
			// 1,000 TCP connections that never speak: at most
			// MaxHandshakesPerIP wait in admission (closed after the
			// handshake timeout), the rest are closed at once.
			var conns []net.Conn
			for i := 0; i < 1000; i++ {
				nc, err := net.Dial("tcp", c.ClientAddr(li))
				if err != nil {
					t.Fatalf("dial %d: %v", i, err)
				}
				conns = append(conns, nc)
			}
			closed := 0
			for _, nc := range conns {
				nc.SetReadDeadline(time.Now().Add(15 * time.Second))
				if _, err := nc.Read(make([]byte, 1)); err != nil && !isTimeoutErr(err) {
					closed++
				}
				nc.Close()
			}
			if closed != len(conns) {
				t.Fatalf("%d of %d silent connections closed within the handshake timeout", closed, len(conns))
			}
			// Authenticated connections kept alive by pings, until the
			// node refuses one: MaxClientConns, not a timeout, decides.
			before := node.Stats().ConnLimitRefusals
			var alive []*client.Conn
			defer func() {
				for _, a := range alive {
					a.Close()
				}
			}()
			refused := false
			for i := 0; i < 400 && !refused; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				a, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID,
					TLS: c.ClientTLS, KeepAlive: 300 * time.Millisecond})
				cancel()
				if err != nil {
					refused = true
					break
				}
				alive = append(alive, a)
			}
			if !refused || node.Stats().ConnLimitRefusals == before {
				t.Fatalf("opened %d connections without hitting MaxClientConns (refusals %d)", len(alive), node.Stats().ConnLimitRefusals-before)
			}
			if len(alive) > 300 {
				t.Fatalf("%d connections served with MaxClientConns 300", len(alive))
			}
			for _, a := range alive {
				a.Close()
			}
			alive = nil
			testkit.WaitFor(t, "the connections to be gone", 10*time.Second, func() bool {
				_, err := dialWith(t, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS})
				return err == nil
			})
			// Authenticated connections that go quiet are closed after
			// IdleTimeout with E idle_timeout.
			var readers []*wire.Reader
			for i := 0; i < 100; i++ {
				tc, r := c.tlsAuthed(t, li)
				tc.SetDeadline(time.Now().Add(30 * time.Second))
				readers = append(readers, r)
			}
			for i, r := range readers {
				expectConnError(t, "idle "+itoa(i), r, wire.CodeIdleTimeout)
			}
		}},
	}
	type phase struct {
		name     string
		from, to time.Time
	}
	var phases []phase
	for _, tc := range cases {
		good.setPhase(tc.name)
		from := time.Now()
		t.Run(tc.name, tc.run)
		phases = append(phases, phase{tc.name, from, time.Now()})
		good.setPhase("")
		if tc.name == fillsKeyTable {
			// The flood let its keys go: the good client is served again
			// at once.
			served := good.servedOK.Load()
			testkit.WaitFor(t, "the good client to be served again after the key table emptied", 10*time.Second,
				func() bool { return good.servedOK.Load() > served })
		}
		p50, p99, n := good.window()
		t.Logf("good client during %q: %d cycles, p50 %v, p99 %v", tc.name, n, p50, p99)
	}
	close(stop)
	wg.Wait()
	t.Logf("good client quiet: %d cycles in 1s, p50 %v, p99 %v", quietN, quietP50, quietP99)
	if len(good.errs) > 0 {
		t.Fatalf("the well-behaved client saw %d failures, first: %s", len(good.errs), good.errs[0])
	}
	for phase, n := range good.keyLimit {
		if phase != fillsKeyTable {
			t.Fatalf("the well-behaved client's acquire was refused too_many_keys %d times during %q, which does not fill the key table", n, phase)
		}
		t.Logf("the well-behaved client's own key was refused too_many_keys %d times while %q held every key", n, phase)
	}
	// Served throughout: during every case, however short, at least one
	// of the good client's cycles succeeded (acquire granted, release
	// OK) while the case ran, not merely an attempt made (during the
	// key-table case some acquires are refused too_many_keys, which does
	// not count). With failures fatal above, the client was never refused
	// or cut off.
	for _, ph := range phases {
		if n := good.servedDuring(ph.from, ph.to); n == 0 {
			t.Errorf("the well-behaved client was not served during %q (%v, no successful cycle overlapping it)", ph.name, ph.to.Sub(ph.from))
		}
	}
	c.converged("keeper", locksm.Holder{Owner: "keeper", Token: keepTok}, true)
	mustType(t, do(t, keeper, releaseMsg("keeper", "keeper", keepTok)), wire.TypeOK)
	t.Logf("node stats: %+v", node.Stats())
}

// readRawFrame reads one frame of any type (handshake frames included).
func readRawFrame(t *testing.T, r io.Reader) (byte, []byte) {
	t.Helper()
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	b := make([]byte, binary.BigEndian.Uint32(h[:]))
	if len(b) == 0 || len(b) > wire.MaxFrameBytes {
		t.Fatalf("frame length %d", len(b))
	}
	if _, err := io.ReadFull(r, b); err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	return b[0], b[1:]
}

type recorder struct {
	net.Conn
	buf bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.buf.Write(p)
	return r.Conn.Write(p)
}

func isTimeoutErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func itoa(i int) string { return strconv.Itoa(i) }

// dialKeepAlive is dial with pings every 300 ms, for connections that sit
// quiet in a cluster with a short IdleTimeout.
func (c *testCluster) dialKeepAlive(i int) *client.Conn {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, c.ClientAddr(i), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID,
		TLS: c.ClientTLS, KeepAlive: 300 * time.Millisecond})
	if err != nil {
		c.t.Fatalf("dial node %d: %v", i, err)
	}
	c.t.Cleanup(func() { conn.Close() })
	return conn
}

// mustWrite writes a hostile client's bytes: a write that fails never
// reached the node, so the case would test nothing.
func mustWrite(t *testing.T, w io.Writer, b []byte) {
	t.Helper()
	if _, err := w.Write(b); err != nil {
		t.Fatalf("write %d hostile bytes: %v", len(b), err)
	}
}
