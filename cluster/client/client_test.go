package client

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

var secret = []byte("client-secret-0123456789")

// fakeServer is a tiny stand-in for a node's client port: it runs the real
// server handshake, then hands every request to handle, which may answer at
// once, later, or never, through the srvConn.
type fakeServer struct {
	ln     net.Listener
	handle func(sc *srvConn, m wire.Msg)
	conns  chan *srvConn
	wg     sync.WaitGroup
}

type srvConn struct {
	nc  net.Conn
	mu  sync.Mutex
	buf []byte
}

func (sc *srvConn) reply(t testing.TB, m wire.Msg) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	b, err := wire.AppendMsg(sc.buf[:0], &m)
	if err != nil {
		t.Errorf("fake server: %v", err)
		return
	}
	sc.buf = b
	_, _ = sc.nc.Write(b)
}

func newFakeServer(t testing.TB, handle func(sc *srvConn, m wire.Msg)) *fakeServer {
	return newFakeServerV(t, 0, handle)
}

// newFakeServerV is newFakeServer accepting protocol versions up to
// maxVersion (0: wire.ProtocolVersion).
func newFakeServerV(t testing.TB, maxVersion uint16, handle func(sc *srvConn, m wire.Msg)) *fakeServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeServer{ln: ln, handle: handle, conns: make(chan *srvConn, 16)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer nc.Close()
				if _, err := wire.ServerHandshake(nc, wire.HandshakeConfig{Kind: wire.KindClient, Secret: secret, NodeID: "n1", MaxVersion: maxVersion}); err != nil {
					return
				}
				sc := &srvConn{nc: nc}
				s.conns <- sc
				r := wire.NewReader(nc)
				var m wire.Msg
				for r.ReadMsg(&m) == nil {
					s.handle(sc, m)
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		select {
		case sc := <-s.conns:
			sc.nc.Close()
		default:
		}
	})
	return s
}

func (s *fakeServer) dial(t testing.TB) *Conn {
	t.Helper()
	c, err := Dial(context.Background(), s.ln.Addr().String(), Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echo answers pings with pongs and acquires with a grant of token 10*id.
func echo(t testing.TB) func(sc *srvConn, m wire.Msg) {
	return func(sc *srvConn, m wire.Msg) {
		switch m.Type {
		case wire.TypePing:
			sc.reply(t, wire.Msg{Type: wire.TypePong, ID: m.ID})
		case wire.TypeAcquire:
			sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: m.ID, Token: 10 * m.ID})
		}
	}
}

func acquire(key string) wire.Msg {
	return wire.Msg{Type: wire.TypeAcquire, Lease: 30, WaitMs: 1000, Key: key, Owner: "me"}
}

func TestDialAndDo(t *testing.T) {
	s := newFakeServer(t, echo(t))
	c := s.dial(t)
	if c.Peer().NodeID != "n1" || c.Peer().Version != wire.ProtocolVersion {
		t.Errorf("peer %+v", c.Peer())
	}
	for want := uint64(1); want <= 3; want++ {
		r, written, err := c.Do(context.Background(), acquire("k"))
		if err != nil || !written || r.Type != wire.TypeGranted || r.ID != want || r.Token != 10*want {
			t.Fatalf("Do: %+v written %v err %v", r, written, err)
		}
	}
}

func TestPipelinedOutOfOrder(t *testing.T) {
	const n = 20
	got := make(chan wire.Msg, n)
	s := newFakeServer(t, func(sc *srvConn, m wire.Msg) {
		got <- m
		if len(got) == n { // all requests are in before any reply goes out
			var reqs []wire.Msg
			for range n {
				reqs = append(reqs, <-got)
			}
			for i := n - 1; i >= 0; i-- {
				sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: reqs[i].ID, Token: 100 + reqs[i].ID})
			}
		}
	})
	c := s.dial(t)
	var calls []*Call
	for range n {
		call, err := c.Start(acquire("k"))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call)
	}
	for i, call := range calls {
		select {
		case <-call.Done:
		case <-time.After(5 * time.Second):
			t.Fatal("no reply")
		}
		if call.Err != nil || call.ID != uint64(i+1) || call.Reply.ID != call.ID || call.Reply.Token != 100+call.ID || !call.Written {
			t.Fatalf("call %d: %+v", i, call)
		}
	}
}

func TestConcurrentCallers(t *testing.T) {
	s := newFakeServer(t, echo(t))
	c := s.dial(t)
	var wg sync.WaitGroup
	var seen sync.Map
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				r, _, err := c.Do(context.Background(), acquire("k"))
				if err != nil || r.Type != wire.TypeGranted || r.Token != 10*r.ID {
					t.Errorf("Do: %+v %v", r, err)
					return
				}
				if _, dup := seen.LoadOrStore(r.ID, true); dup {
					t.Errorf("id %d twice", r.ID)
				}
			}
		}()
	}
	wg.Wait()
	if c.InFlight() != 0 {
		t.Errorf("%d calls left pending", c.InFlight())
	}
}

func TestConnDeathFailsPending(t *testing.T) {
	var count atomic.Int32
	s := newFakeServer(t, func(sc *srvConn, m wire.Msg) {
		if count.Add(1) == 3 {
			sc.nc.Close() // the node dies with three requests unanswered
		}
	})
	c := s.dial(t)
	var calls []*Call
	for range 3 {
		call, err := c.Start(acquire("k"))
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call)
	}
	for _, call := range calls {
		select {
		case <-call.Done:
		case <-time.After(5 * time.Second):
			t.Fatal("pending call not failed")
		}
		if !errors.Is(call.Err, ErrConnClosed) || !call.Written {
			t.Fatalf("call %d: err %v written %v", call.ID, call.Err, call.Written)
		}
	}
	<-c.Done()
	if !errors.Is(c.Err(), ErrConnClosed) {
		t.Fatalf("Err: %v", c.Err())
	}
	if _, err := c.Start(acquire("k")); !errors.Is(err, ErrConnClosed) {
		t.Fatalf("Start after death: %v", err)
	}
	if _, written, err := c.Do(context.Background(), acquire("k")); !errors.Is(err, ErrConnClosed) || written {
		t.Fatalf("Do after death: written %v err %v", written, err)
	}
}

func TestCtxCancel(t *testing.T) {
	hold := make(chan wire.Msg, 1)
	s := newFakeServer(t, func(sc *srvConn, m wire.Msg) {
		switch m.Type {
		case wire.TypeAcquire:
			hold <- m // answered later
		case wire.TypePing:
			sc.reply(t, wire.Msg{Type: wire.TypePong, ID: m.ID})
		}
	})
	c := s.dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, written, err := c.Do(ctx, acquire("k"))
	if !errors.Is(err, context.DeadlineExceeded) || !written {
		t.Fatalf("written %v err %v", written, err)
	}
	// The late reply is dropped, not a protocol violation.
	m := <-hold
	sc := <-s.conns
	s.conns <- sc
	sc.reply(t, wire.Msg{Type: wire.TypeTimeout, ID: m.ID})
	r, _, err := c.Do(context.Background(), wire.Msg{Type: wire.TypePing})
	if err != nil || r.Type != wire.TypePong {
		t.Fatalf("ping after late reply: %+v %v", r, err)
	}
	if c.InFlight() != 0 {
		t.Errorf("%d pending", c.InFlight())
	}
}

// blockConn lets a test hold the writer inside Write, so later requests stay
// in the send buffer, never written.
type blockConn struct {
	net.Conn
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (b *blockConn) Write(p []byte) (int, error) {
	if b.armed.CompareAndSwap(true, false) {
		b.entered <- struct{}{}
		<-b.release
	}
	return b.Conn.Write(p)
}

func dialBlocking(t *testing.T, s *fakeServer) (*Conn, *blockConn) {
	bc := &blockConn{entered: make(chan struct{}), release: make(chan struct{})}
	c, err := Dial(context.Background(), s.ln.Addr().String(), Config{
		Secret: secret,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			nc, err := d.DialContext(ctx, network, addr)
			bc.Conn = nc
			return bc, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	bc.armed.Store(true)
	return c, bc
}

func TestWrittenAccounting(t *testing.T) {
	seen := make(chan uint64, 10)
	s := newFakeServer(t, func(sc *srvConn, m wire.Msg) { seen <- m.ID })
	c, bc := dialBlocking(t, s)
	a, _ := c.Start(acquire("a")) // taken by the writer, stuck in Write
	<-bc.entered
	b, _ := c.Start(acquire("b")) // stays in the buffer
	d, _ := c.Start(acquire("d"))

	// Abandoning an unsent request withdraws it.
	if c.Abandon(b) {
		t.Fatal("b reported written")
	}
	<-b.Done
	if !errors.Is(b.Err, ErrAbandoned) {
		t.Fatalf("b: %v", b.Err)
	}
	// ctx cancel of an unsent Do withdraws it too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, written, err := c.Do(ctx, acquire("e")); written || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled unsent Do: written %v err %v", written, err)
	}
	close(bc.release)
	if id := <-seen; id != a.ID {
		t.Fatalf("server saw %d first", id)
	}
	if id := <-seen; id != d.ID {
		t.Fatalf("server saw %d, want %d (b and e withdrawn)", id, d.ID)
	}
	c.Close()
	for _, call := range []*Call{a, d} {
		<-call.Done
		if !call.Written || !errors.Is(call.Err, ErrConnClosed) {
			t.Fatalf("call %d: written %v err %v", call.ID, call.Written, call.Err)
		}
	}
}

func TestDeathBeforeWrite(t *testing.T) {
	s := newFakeServer(t, func(sc *srvConn, m wire.Msg) {})
	c, bc := dialBlocking(t, s)
	a, _ := c.Start(acquire("a"))
	<-bc.entered
	b, _ := c.Start(acquire("b"))
	c.Close()
	close(bc.release)
	<-a.Done
	<-b.Done
	if !a.Written || b.Written {
		t.Fatalf("a written %v (want true), b written %v (want false)", a.Written, b.Written)
	}
	if !errors.Is(b.Err, ErrConnClosed) {
		t.Fatalf("b: %v", b.Err)
	}
}

func TestProtocolViolations(t *testing.T) {
	cases := []struct {
		name  string
		reply func(m wire.Msg) wire.Msg
		want  error
	}{
		{"unknown id", func(m wire.Msg) wire.Msg { return wire.Msg{Type: wire.TypeOK, ID: m.ID + 100} }, ErrProtocol},
		{"connection error", func(m wire.Msg) wire.Msg {
			return wire.Msg{Type: wire.TypeError, Code: wire.CodeShuttingDown, Text: "bye"}
		}, wire.ErrShuttingDown},
		{"wrong reply type", func(m wire.Msg) wire.Msg { return wire.Msg{Type: wire.TypeOK, ID: m.ID} }, ErrProtocol},
		{"request as reply", func(m wire.Msg) wire.Msg { return wire.Msg{Type: wire.TypePing, ID: m.ID} }, ErrProtocol},
		// Not a lost event: no connection speaks sessions yet.
		{"outcomes event", func(m wire.Msg) wire.Msg { return wire.Msg{Type: wire.TypeOutcomes, Session: 1, Serial: 1} }, ErrProtocol},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newFakeServer(t, func(sc *srvConn, m wire.Msg) { sc.reply(t, tc.reply(m)) })
			c := s.dial(t)
			_, written, err := c.Do(context.Background(), wire.Msg{Type: wire.TypePing})
			if !errors.Is(err, tc.want) || !errors.Is(err, ErrConnClosed) || !written {
				t.Fatalf("written %v err %v", written, err)
			}
			<-c.Done()
			if c.Served() {
				t.Errorf("Served after nothing but a frame that ended the connection")
			}
		})
	}
}

// Served tells a connection on which the node answered from one it only
// accepted (the broker's reconnect backoff, issue 39): false after the
// handshake, true once a reply was read, and still true after the node
// closed the connection.
func TestServed(t *testing.T) {
	s := newFakeServer(t, func(sc *srvConn, m wire.Msg) {
		sc.reply(t, wire.Msg{Type: wire.TypePong, ID: m.ID})
		sc.nc.Close()
	})
	c := s.dial(t)
	if c.Served() {
		t.Fatal("Served right after the handshake")
	}
	if _, _, err := c.Do(context.Background(), wire.Msg{Type: wire.TypePing}); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	if !c.Served() {
		t.Fatal("not Served after a reply")
	}
}

func TestErrorReplyIsAReply(t *testing.T) {
	s := newFakeServer(t, func(sc *srvConn, m wire.Msg) {
		sc.reply(t, wire.Msg{Type: wire.TypeError, ID: m.ID, Code: wire.CodeInvalidLease, Text: "lease 0"})
	})
	c := s.dial(t)
	r, written, err := c.Do(context.Background(), acquire("k"))
	if err != nil || !written || r.Type != wire.TypeError || r.Code != wire.CodeInvalidLease {
		t.Fatalf("%+v %v %v", r, written, err)
	}
}

func TestStartInvalid(t *testing.T) {
	s := newFakeServer(t, echo(t))
	c := s.dial(t)
	for _, m := range []wire.Msg{
		{Type: wire.TypePing, ID: 5},
		{Type: wire.TypePong},
		{Type: wire.TypeAcquire, Key: "", Owner: "o"},
	} {
		if _, err := c.Start(m); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%+v: %v", m, err)
		}
	}
	// A refused request does not use up an id.
	r, _, err := c.Do(context.Background(), wire.Msg{Type: wire.TypePing})
	if err != nil || r.ID != 1 {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestDialFailures(t *testing.T) {
	s := newFakeServer(t, echo(t))
	_, err := Dial(context.Background(), s.ln.Addr().String(), Config{Secret: []byte("wrong-secret-0123456789")})
	if !errors.Is(err, wire.ErrAuthFailed) {
		t.Fatalf("wrong secret: %v", err)
	}
	_, err = Dial(context.Background(), s.ln.Addr().String(), Config{Secret: secret, ClusterID: "other"})
	if !errors.Is(err, wire.ErrWrongCluster) {
		t.Fatalf("wrong cluster: %v", err)
	}

	// A listener that accepts and never answers: the timeout ends the
	// handshake, and so does cancelling ctx.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			defer nc.Close()
		}
	}()
	start := time.Now()
	_, err = Dial(context.Background(), ln.Addr().String(), Config{Secret: secret, HandshakeTimeout: 100 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("timeout: %v after %v", err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = Dial(ctx, ln.Addr().String(), Config{Secret: secret})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel: %v", err)
	}
}

// BenchmarkDoParallel measures round trips with 64 concurrent callers on one
// connection against the in-test fake server.
func BenchmarkDoParallel(b *testing.B) {
	s := newFakeServer(b, echo(b))
	c := s.dial(b)
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		m := acquire("event:42")
		for pb.Next() {
			if _, _, err := c.Do(context.Background(), m); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// A hand-over notice: the connection tells OnNotice, refuses acquires and
// releases from then on (nothing written: ErrHandingOver), still sends
// pings, and acknowledges behind every request it wrote before; a serving
// notice lifts the refusal.
func TestHandOverNotice(t *testing.T) {
	got := make(chan byte, 16)
	s := newFakeServer(t, func(sc *srvConn, m wire.Msg) {
		got <- m.Type
		switch m.Type {
		case wire.TypeAcquire:
			sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: m.ID, Token: 7})
		case wire.TypePing:
			sc.reply(t, wire.Msg{Type: wire.TypePong, ID: m.ID})
		case wire.TypeNoticeAck:
			sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: m.ID})
		}
	})
	notices := make(chan wire.Msg, 4)
	c, err := Dial(context.Background(), s.ln.Addr().String(), Config{Secret: secret,
		OnNotice: func(_ *Conn, n wire.Msg) { notices <- n }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc := <-s.conns
	first, err := c.Start(acquire("k"))
	if err != nil {
		t.Fatal(err)
	}
	if typ := <-got; typ != wire.TypeAcquire {
		t.Fatalf("server got %c first", typ)
	}
	sc.reply(t, wire.Msg{Type: wire.TypeNotice, Event: wire.NoticeHandOver, LeaderID: "n2/bbbbbbbbbb", LeaderAddr: "10.0.0.2:7001"})
	if n := <-notices; n.Event != wire.NoticeHandOver || n.LeaderID != "n2/bbbbbbbbbb" || n.LeaderAddr != "10.0.0.2:7001" {
		t.Fatalf("OnNotice got %+v", n)
	}
	// The acknowledgement follows what was written before the notice.
	if typ := <-got; typ != wire.TypeNoticeAck {
		t.Fatalf("after the notice the server got %c, want the acknowledgement", typ)
	}
	<-first.Done
	if first.Err != nil || first.Reply.Type != wire.TypeGranted {
		t.Fatalf("request written before the notice: %+v %v", first.Reply, first.Err)
	}
	if !c.HandingOver() {
		t.Fatal("HandingOver false after the notice")
	}
	for _, m := range []wire.Msg{acquire("k2"), {Type: wire.TypeRelease, Key: "k", Owner: "me", Token: 7}} {
		if _, err := c.Start(m); !errors.Is(err, ErrHandingOver) {
			t.Fatalf("%c after a hand-over notice: %v, want ErrHandingOver", m.Type, err)
		}
	}
	if r, _, err := c.Do(context.Background(), wire.Msg{Type: wire.TypePing}); err != nil || r.Type != wire.TypePong {
		t.Fatalf("ping during a hand-over: %+v %v", r, err)
	}
	if typ := <-got; typ != wire.TypePing {
		t.Fatalf("server got %c, want only the ping", typ)
	}
	sc.reply(t, wire.Msg{Type: wire.TypeNotice, Event: wire.NoticeServing, LeaderID: "n1"})
	if n := <-notices; n.Event != wire.NoticeServing {
		t.Fatalf("OnNotice got %+v", n)
	}
	testkit.WaitFor(t, "the serving notice to end the hand-over", 10*time.Second, func() bool { return !c.HandingOver() })
	if r, _, err := c.Do(context.Background(), acquire("k3")); err != nil || r.Type != wire.TypeGranted {
		t.Fatalf("acquire after the serving notice: %+v %v", r, err)
	}
}

// hookLog records the hooks of StartFunc calls, in the order they ran.
type hookLog struct {
	mu     sync.Mutex
	events []string
	done   chan *Call
}

func newHookLog() *hookLog { return &hookLog{done: make(chan *Call, 16)} }

func (h *hookLog) hooks(name string) Hooks {
	return Hooks{
		Queued: func(c *Call) {
			h.mu.Lock()
			h.events = append(h.events, name+" queued")
			h.mu.Unlock()
		},
		Done: func(c *Call) {
			h.mu.Lock()
			h.events = append(h.events, name+" done")
			h.mu.Unlock()
			h.done <- c
		},
	}
}

func (h *hookLog) wait(t *testing.T) *Call {
	t.Helper()
	select {
	case c := <-h.done:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no Done hook")
		return nil
	}
}

func (h *hookLog) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.events...)
}

// A queued acquire: Q runs the Queued hook and leaves the call in flight;
// the final reply completes it and runs Done. No goroutine waits on it.
func TestStartFuncQueuedThenGranted(t *testing.T) {
	ids := make(chan uint64, 4)
	s := newFakeServer(t, func(sc *srvConn, m wire.Msg) {
		switch m.Type {
		case wire.TypeAcquire:
			sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: m.ID})
			ids <- m.ID
		case wire.TypePing:
			sc.reply(t, wire.Msg{Type: wire.TypePong, ID: m.ID})
		}
	})
	c := s.dial(t)
	if c.Peer().Version < wire.VersionQueued {
		t.Fatalf("negotiated version %d", c.Peer().Version)
	}
	h := newHookLog()
	call, err := c.StartFunc(acquire("k"), h.hooks("a"))
	if err != nil {
		t.Fatal(err)
	}
	id := <-ids
	// A ping round trip after the Q: the reader has handled the Q by then.
	if r, _, err := c.Do(context.Background(), wire.Msg{Type: wire.TypePing}); err != nil || r.Type != wire.TypePong {
		t.Fatalf("ping: %+v %v", r, err)
	}
	if got := h.got(); len(got) != 1 || got[0] != "a queued" {
		t.Fatalf("hooks after Q: %v", got)
	}
	if c.InFlight() != 1 {
		t.Fatalf("%d in flight after Q, want the acquire still in flight", c.InFlight())
	}
	select {
	case <-call.Done:
		t.Fatal("Q completed the call")
	default:
	}
	sc := <-s.conns
	s.conns <- sc
	sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: id, Token: 7})
	if done := h.wait(t); done != call || !call.Queued || call.Reply.Type != wire.TypeGranted || call.Reply.Token != 7 || call.Err != nil {
		t.Fatalf("call %+v", call)
	}
	<-call.Done
	if got := h.got(); len(got) != 2 || got[1] != "a done" {
		t.Fatalf("hooks: %v", got)
	}
}

// Done hooks run when the connection dies (with the pending calls'
// errors) and when Abandon withdraws an unsent call; an answered call
// without Q has Queued false.
func TestStartFuncDoneOnDeathAndAbandon(t *testing.T) {
	s := newFakeServer(t, echo(t))
	c, bc := dialBlocking(t, s)
	h := newHookLog()
	first, err := c.StartFunc(acquire("a"), h.hooks("first"))
	if err != nil {
		t.Fatal(err)
	}
	<-bc.entered // the writer holds first's bytes inside Write
	second, err := c.StartFunc(acquire("b"), h.hooks("second"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Abandon(second) {
		t.Fatal("second was never written")
	}
	if got := h.wait(t); got != second || !errors.Is(second.Err, ErrAbandoned) || second.Written {
		t.Fatalf("abandoned: %+v", second)
	}
	close(bc.release)
	if got := h.wait(t); got != first || first.Err != nil || first.Reply.Type != wire.TypeGranted || first.Queued {
		t.Fatalf("first: %+v", first)
	}
	third, err := c.StartFunc(wire.Msg{Type: wire.TypeAcquire, Lease: 30, WaitMs: 0, Key: "silent", Owner: "me"}, h.hooks("third"))
	if err != nil {
		t.Fatal(err)
	}
	_ = third
	// echo answers acquires at once; close before it can matter or after:
	// either way Done runs exactly once.
	c.Close()
	if got := h.wait(t); got != third {
		t.Fatalf("Done for %+v", got)
	}
	select {
	case extra := <-h.done:
		t.Fatalf("a second Done hook: %+v", extra)
	case <-time.After(50 * time.Millisecond):
	}
}

// Q frames the protocol does not allow close the connection: for a
// request other than an acquire, a second Q for one acquire, and a Q for
// an id not in flight.
func TestQueuedProtocolViolations(t *testing.T) {
	for _, tc := range []struct {
		name  string
		req   wire.Msg
		reply func(sc *srvConn, m wire.Msg)
	}{
		{"for a ping", wire.Msg{Type: wire.TypePing}, func(sc *srvConn, m wire.Msg) {
			sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: m.ID})
		}},
		{"twice", acquire("k"), func(sc *srvConn, m wire.Msg) {
			sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: m.ID})
			sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: m.ID})
		}},
		{"unknown id", acquire("k"), func(sc *srvConn, m wire.Msg) {
			sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: m.ID + 100})
		}},
		{"after the reply", acquire("k"), func(sc *srvConn, m wire.Msg) {
			sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: m.ID, Token: 1})
			sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: m.ID})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newFakeServer(t, tc.reply)
			c := s.dial(t)
			h := newHookLog()
			if _, err := c.StartFunc(tc.req, h.hooks("x")); err != nil {
				t.Fatal(err)
			}
			select {
			case <-c.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("connection not closed")
			}
			if !errors.Is(c.Err(), ErrProtocol) {
				t.Fatalf("Err %v, want ErrProtocol", c.Err())
			}
			h.wait(t)
		})
	}
}
