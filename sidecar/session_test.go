package sidecar

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// fakeLeader is a stand-in for a serving leader that speaks sessions
// (protocol version 7) as PROTOCOL.md "Sessions" says: a real handshake,
// status and members answered as the serving leader, o and y checked
// against the one session it knows; lock requests go to the test's lock
// handler. It accepts version 7 (wire.ProtocolVersion, offered by a
// broker with sessions) unless made with an older version; with
// refuseOpens it answers an open E not_supported, as a leader of version 7
// does while the cluster version is 6.
type fakeLeader struct {
	t       *testing.T
	ln      net.Listener
	secret  []byte
	version uint16

	mu          sync.Mutex
	session     uint64
	sSecret     [wire.SecretLen]byte
	opens       int
	refuseOpens bool
	refused     int // opens answered not_supported
	conns       []*fakeConn
	// onLock handles a/b/r/e/c (and k) frames; onResume answers a y
	// whose secret matched (it must send the K itself).
	onLock   func(fc *fakeConn, m wire.Msg)
	onResume func(fc *fakeConn, m wire.Msg)
	got      chan wire.Msg // every lock request and y, for the test
	lockConn *fakeConn     // the connection of the last lock request
}

type fakeConn struct {
	nc   net.Conn
	mu   sync.Mutex
	buf  []byte
	gone chan struct{} // closed when the fake stops reading it (closed by either side)
}

func (fc *fakeConn) send(t *testing.T, m wire.Msg) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	b, err := wire.AppendMsg(fc.buf[:0], &m)
	if err != nil {
		t.Errorf("fake leader: %v", err)
		return
	}
	fc.buf = b
	_, _ = fc.nc.Write(b)
}

var fakeSecret = []byte("fake-leader-secret-0123456789")

func newFakeLeader(t *testing.T) *fakeLeader { return newFakeLeaderV(t, wire.VersionSessions) }

func newFakeLeaderV(t *testing.T, version uint16) *fakeLeader {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeLeader{t: t, ln: ln, secret: fakeSecret, version: version, got: make(chan wire.Msg, 1024)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				f.serve(nc)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		f.dropAll()
		wg.Wait()
	})
	return f
}

func (f *fakeLeader) addr() string { return f.ln.Addr().String() }

func (f *fakeLeader) serve(nc net.Conn) {
	f.mu.Lock()
	version := f.version
	f.mu.Unlock()
	if _, err := wire.ServerHandshake(nc, wire.HandshakeConfig{Kind: wire.KindClient, Secret: f.secret, NodeID: "fake/1",
		MaxVersion: version}); err != nil {
		return
	}
	fc := &fakeConn{nc: nc, gone: make(chan struct{})}
	defer close(fc.gone)
	f.mu.Lock()
	f.conns = append(f.conns, fc)
	f.mu.Unlock()
	r := wire.NewReader(nc)
	var m wire.Msg
	for r.ReadMsg(&m) == nil {
		f.handle(fc, m)
	}
}

func (f *fakeLeader) handle(fc *fakeConn, m wire.Msg) {
	t := f.t
	switch m.Type {
	case wire.TypePing:
		fc.send(t, wire.Msg{Type: wire.TypePong, ID: m.ID})
	case wire.TypeStatus:
		fc.send(t, wire.Msg{Type: wire.TypeStatusR, ID: m.ID, NodeID: "fake/1", Role: wire.RoleLeader, LeaderID: "fake/1",
			LeaderAddr: f.addr()})
	case wire.TypeMembers:
		fc.send(t, wire.Msg{Type: wire.TypeMembersR, ID: m.ID, Members: []wire.Member{{ServerID: "fake/1", ClientAddr: f.addr()}}})
	case wire.TypeOpenSession:
		f.mu.Lock()
		if f.refuseOpens {
			f.refused++
			f.mu.Unlock()
			fc.send(t, wire.Msg{Type: wire.TypeError, ID: m.ID, Code: wire.CodeNotSupported, Text: "cluster version 6"})
			return
		}
		f.session, f.sSecret = m.Session, m.Secret
		f.opens++
		f.mu.Unlock()
		fc.send(t, wire.Msg{Type: wire.TypeOK, ID: m.ID})
	case wire.TypeCloseSession:
		f.got <- m
		fc.send(t, wire.Msg{Type: wire.TypeOK, ID: m.ID})
	case wire.TypeResume:
		f.mu.Lock()
		known := m.Session == f.session
		ok := known && m.Secret == f.sSecret
		h := f.onResume
		f.mu.Unlock()
		f.got <- m
		switch {
		case !ok:
			code := wire.CodeBadSession
			if !known {
				code = wire.CodeNoSession
			}
			fc.send(t, wire.Msg{Type: wire.TypeError, ID: m.ID, Code: code, Text: "refused"})
		case h != nil:
			h(fc, m)
		default:
			fc.send(t, wire.Msg{Type: wire.TypeOK, ID: m.ID})
		}
	default:
		f.mu.Lock()
		h := f.onLock
		f.lockConn = fc
		f.mu.Unlock()
		if m.Type != wire.TypeSessionAck {
			f.got <- m
		}
		if h != nil {
			h(fc, m)
		} else if m.Type == wire.TypeSessionAck || m.Type == wire.TypeCancel {
			fc.send(t, wire.Msg{Type: wire.TypeOK, ID: m.ID})
		}
	}
}

// dropAll closes every connection the fake accepted.
func (f *fakeLeader) dropAll() {
	f.mu.Lock()
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	for _, fc := range conns {
		fc.nc.Close()
	}
}

func (f *fakeLeader) setHandlers(onLock, onResume func(fc *fakeConn, m wire.Msg)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onLock, f.onResume = onLock, onResume
}

// next returns the next lock request or resume the fake read.
func (f *fakeLeader) next(t *testing.T, typ byte) wire.Msg {
	t.Helper()
	for {
		select {
		case m := <-f.got:
			if m.Type == typ {
				return m
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("fake leader: no %s", wire.TypeName(typ))
		}
	}
}

func newSessionBroker(t *testing.T, f *fakeLeader, tune func(*Config)) *Broker {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.Logger = []string{f.addr()}, f.secret, testLogger()
	cfg.BackoffMin = 10 * time.Millisecond
	if tune != nil {
		tune(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func waitAttached(t *testing.T, b *Broker, resumes uint64) {
	t.Helper()
	testkit.WaitFor(t, "the cluster session attached", 30*time.Second, func() bool {
		si := b.Info().Session
		return si != nil && si.State == "attached" && si.Resumes >= resumes
	})
}

type acqResult struct {
	lk  Lock
	err error
}

func asyncAcquire(t *testing.T, b *Broker, ctx context.Context, key string, wait time.Duration) chan acqResult {
	ch := make(chan acqResult, 1)
	go func() {
		lk, err := b.Acquire(ctx, key, "me", 30*time.Second, wait)
		ch <- acqResult{lk, err}
	}()
	return ch
}

func result(t *testing.T, ch chan acqResult) acqResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("acquire never answered")
		return acqResult{}
	}
}

// A queued acquire whose connection dies keeps its place: the resume on
// the next connection delivers the grant the leader recorded meanwhile.
func TestBrokerSessionResumeDeliversGrant(t *testing.T) {
	f := newFakeLeader(t)
	b := newSessionBroker(t, f, nil)
	waitAttached(t, b, 0)
	ch := asyncAcquire(t, b, context.Background(), "k", 20*time.Second)
	a := f.next(t, wire.TypeAcquire)
	f.mu.Lock()
	sid := f.session
	f.mu.Unlock()
	// Queued; then the leader's connection drops, and the key is handed
	// to the waiter while the broker has no connection.
	f.mu.Lock()
	aconn := f.lockConn // the session's
	f.mu.Unlock()
	aconn.send(t, wire.Msg{Type: wire.TypeQueued, ID: a.ID})
	// The Q shows as the acquire leaving the in-flight count.
	testkit.WaitFor(t, "the acquire queued", 30*time.Second, func() bool {
		b.qmu.Lock()
		defer b.qmu.Unlock()
		return b.sc.pendingN == 0 && len(b.inflight) == 0
	})
	f.setHandlers(nil, func(fc *fakeConn, y wire.Msg) {
		if y.High < a.ID || y.Serial != 0 {
			t.Errorf("resume %+v: high below the acquire %d", y, a.ID)
		}
		fc.send(t, wire.Msg{Type: wire.TypeGranted, ID: a.ID, Token: 42})
		fc.send(t, wire.Msg{Type: wire.TypeOutcomes, Session: sid, Serial: 1})
		fc.send(t, wire.Msg{Type: wire.TypeOK, ID: y.ID})
	})
	f.dropAll()
	r := result(t, ch)
	if r.err != nil || r.lk.Token != 42 {
		t.Fatalf("acquire: %+v %v", r.lk, r.err)
	}
	waitAttached(t, b, 1)
	si := b.Info().Session
	if si.ID != sid || si.LastResume.Outcomes != 1 || si.Held != 0 || si.Opens != 1 {
		t.Fatalf("session info %+v", si)
	}
}

// An acquire the resume reports void (never applied) is sent again as a
// new request while its caller waits: a new seq, above the resume's.
func TestBrokerSessionVoidAcquireIsSentAgain(t *testing.T) {
	f := newFakeLeader(t)
	b := newSessionBroker(t, f, nil)
	waitAttached(t, b, 0)
	ch := asyncAcquire(t, b, context.Background(), "k", 20*time.Second)
	a := f.next(t, wire.TypeAcquire)
	f.dropAll() // the acquire never applied
	y := f.next(t, wire.TypeResume)
	if y.High < a.ID {
		t.Fatalf("resume high %d below the acquire's seq %d", y.High, a.ID)
	}
	f.setHandlers(func(fc *fakeConn, m wire.Msg) {
		if m.Type == wire.TypeAcquire {
			fc.send(t, wire.Msg{Type: wire.TypeGranted, ID: m.ID, Token: 7})
		}
	}, nil)
	again := f.next(t, wire.TypeAcquire)
	if again.ID <= y.ID || again.Key != "k" {
		t.Fatalf("sent again as %+v after the resume %d", again, y.ID)
	}
	r := result(t, ch)
	if r.err != nil || r.lk.Token != 7 {
		t.Fatalf("acquire: %+v %v", r.lk, r.err)
	}
	if si := b.Info().Session; si.LastResume.Void != 1 {
		t.Fatalf("session info %+v", si)
	}
}

// A grant learned only at the resume whose caller gave up meanwhile is
// released at once by its token.
func TestBrokerSessionCompensatesGrantOfGoneCaller(t *testing.T) {
	f := newFakeLeader(t)
	b := newSessionBroker(t, f, nil)
	waitAttached(t, b, 0)
	ctx, cancel := context.WithCancel(context.Background())
	ch := asyncAcquire(t, b, ctx, "k", 20*time.Second)
	a := f.next(t, wire.TypeAcquire)
	// Hold the resume until the caller has given up.
	resumed := make(chan struct{})
	f.setHandlers(func(fc *fakeConn, m wire.Msg) {
		if m.Type == wire.TypeRelease {
			fc.send(t, wire.Msg{Type: wire.TypeOK, ID: m.ID})
		}
	}, func(fc *fakeConn, y wire.Msg) {
		<-resumed
		fc.send(t, wire.Msg{Type: wire.TypeGranted, ID: a.ID, Token: 9})
		fc.send(t, wire.Msg{Type: wire.TypeOK, ID: y.ID})
	})
	f.dropAll()
	f.next(t, wire.TypeResume)
	cancel()
	if r := result(t, ch); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("acquire: %+v %v", r.lk, r.err)
	}
	close(resumed)
	rel := f.next(t, wire.TypeRelease)
	if rel.Token != 9 || rel.Key != "k" || rel.Owner != "me" {
		t.Fatalf("compensation %+v", rel)
	}
}

// A release whose connection dies waits for the resume; a void one is
// sent again within its deadline, and nil is reported on its K.
func TestBrokerSessionVoidReleaseIsSentAgain(t *testing.T) {
	f := newFakeLeader(t)
	b := newSessionBroker(t, f, nil)
	waitAttached(t, b, 0)
	errc := make(chan error, 1)
	go func() { errc <- b.Release(context.Background(), Lock{Key: "k", Owner: "me", Token: 3}) }()
	r1 := f.next(t, wire.TypeRelease)
	f.dropAll()
	y := f.next(t, wire.TypeResume)
	f.setHandlers(func(fc *fakeConn, m wire.Msg) {
		if m.Type == wire.TypeRelease {
			fc.send(t, wire.Msg{Type: wire.TypeOK, ID: m.ID})
		}
	}, nil)
	r2 := f.next(t, wire.TypeRelease)
	if r2.ID <= y.ID || r2.Token != 3 || r1.ID >= y.ID {
		t.Fatalf("release %+v, then %+v after the resume %d", r1, r2, y.ID)
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("release: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("release never answered")
	}
}

// A resume the leader refuses (the session expired): the written acquire
// is Indeterminate, and a new session is opened.
func TestBrokerSessionExpiredIsIndeterminate(t *testing.T) {
	f := newFakeLeader(t)
	b := newSessionBroker(t, f, nil)
	waitAttached(t, b, 0)
	ch := asyncAcquire(t, b, context.Background(), "k", 20*time.Second)
	f.next(t, wire.TypeAcquire)
	f.mu.Lock()
	f.session = 0 // forgotten: every resume is refused
	f.mu.Unlock()
	f.dropAll()
	if r := result(t, ch); !errors.Is(r.err, ErrIndeterminate) {
		t.Fatalf("acquire: %+v %v", r.lk, r.err)
	}
	testkit.WaitFor(t, "a new session opened", 30*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.opens == 2
	})
	waitAttached(t, b, 0)
	if si := b.Info().Session; si.Opens != 2 {
		t.Fatalf("session info %+v", si)
	}
}

// Against a version 6 leader, or with Config.Sessions off, the broker
// opens no session and sends as today.
func TestBrokerSessionsOffOrVersion6(t *testing.T) {
	for _, tc := range []struct {
		name    string
		version uint16
		tune    func(*Config)
	}{
		{"version 6", wire.VersionSessions - 1, nil},
		{"sessions off", wire.VersionSessions, func(c *Config) { c.Sessions = SessionsOff }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeLeaderV(t, tc.version)
			f.setHandlers(func(fc *fakeConn, m wire.Msg) {
				if m.Type == wire.TypeAcquire {
					fc.send(t, wire.Msg{Type: wire.TypeGranted, ID: m.ID, Token: 5})
				}
			}, nil)
			b := newSessionBroker(t, f, tc.tune)
			testkit.WaitFor(t, "the leader known", 30*time.Second, func() bool { return b.Info().Leader != "" })
			lk, err := b.Acquire(ctxT(t, 30*time.Second), "k", "me", 30*time.Second, 0)
			if err != nil || lk.Token != 5 {
				t.Fatalf("acquire: %+v %v", lk, err)
			}
			f.mu.Lock()
			opens := f.opens
			f.mu.Unlock()
			if opens != 0 || b.Info().Session != nil {
				t.Fatalf("a session was opened (%d): %+v", opens, b.Info().Session)
			}
			b.mu.Lock()
			for _, sl := range b.slots {
				if sl.conn != nil && sl.conn.Peer().Version != wire.VersionSessions-1 {
					t.Errorf("a connection speaks version %d", sl.conn.Peer().Version)
				}
			}
			b.mu.Unlock()
		})
	}
}

// A leader of version 7 in a cluster of version 6 (a rolling upgrade under
// way) refuses the open not_supported: the broker serves on that
// connection without a session, as today, and once the cluster takes
// sessions it opens one on a fresh connection, which replaces the one
// without (closed once nothing is in flight on it); from then on lock
// requests go on the session's connection.
func TestBrokerSessionRefusedNotSupportedServesWithoutOne(t *testing.T) {
	f := newFakeLeader(t)
	f.mu.Lock()
	f.refuseOpens = true
	f.mu.Unlock()
	var token atomic.Uint64
	f.setHandlers(func(fc *fakeConn, m wire.Msg) {
		if m.Type == wire.TypeAcquire {
			fc.send(t, wire.Msg{Type: wire.TypeGranted, ID: m.ID, Token: token.Add(1)})
		}
	}, nil)
	b := newSessionBroker(t, f, nil)
	testkit.WaitFor(t, "the open refused", 30*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.refused > 0
	})
	if lk, err := b.Acquire(ctxT(t, 30*time.Second), "k1", "me", 30*time.Second, 0); err != nil || lk.Token == 0 {
		t.Fatalf("acquire while the cluster refuses sessions: %+v %v", lk, err)
	}
	f.mu.Lock()
	plainConn := f.lockConn
	f.mu.Unlock()
	if si := b.Info().Session; si != nil {
		t.Fatalf("session info while refused: %+v", si)
	}
	f.mu.Lock()
	f.refuseOpens = false
	f.mu.Unlock()
	waitAttached(t, b, 0)
	if _, err := b.Acquire(ctxT(t, 30*time.Second), "k2", "me", 30*time.Second, 0); err != nil {
		t.Fatalf("acquire with the session: %v", err)
	}
	f.mu.Lock()
	sessConn, opens := f.lockConn, f.opens
	f.mu.Unlock()
	if sessConn == plainConn || opens != 1 {
		t.Fatalf("after the session opened: the acquire went on the connection without one (%v), opens %d", sessConn == plainConn, opens)
	}
	// The connection without a session is closed by the broker (it had
	// nothing in flight).
	select {
	case <-plainConn.gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the connection without a session was not closed")
	}
}

func TestSessionConfigValidate(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Addrs, cfg.Secret = []string{"127.0.0.1:1"}, fakeSecret
	for _, bad := range []time.Duration{time.Second, 301 * time.Second, 2*time.Second + time.Microsecond} {
		cfg.SessionTimeout = bad
		if err := cfg.Validate(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("timeout %v: %v", bad, err)
		}
	}
	cfg.SessionTimeout, cfg.Sessions = 0, SessionsOff+1
	if err := cfg.Validate(); !errors.Is(err, ErrBadConfig) {
		t.Errorf("mode: %v", err)
	}
	if c := cfg.withDefaults(); c.SessionTimeout != DefaultSessionTimeout {
		t.Errorf("default timeout %v", c.SessionTimeout)
	}
}

// A U to a written acquire of the session (the node lost leadership) is
// not Indeterminate: the resume answers it.
func TestBrokerSessionUnknownIsResumed(t *testing.T) {
	f := newFakeLeader(t)
	b := newSessionBroker(t, f, nil)
	waitAttached(t, b, 0)
	var seq atomic.Uint64
	f.setHandlers(func(fc *fakeConn, m wire.Msg) {
		if m.Type == wire.TypeAcquire {
			seq.Store(m.ID)
			fc.send(t, wire.Msg{Type: wire.TypeUnknown, ID: m.ID, Text: "leadership lost"})
		}
	}, func(fc *fakeConn, y wire.Msg) {
		fc.send(t, wire.Msg{Type: wire.TypeBusy, ID: seq.Load()})
		fc.send(t, wire.Msg{Type: wire.TypeOK, ID: y.ID})
	})
	ch := asyncAcquire(t, b, context.Background(), "k", 0)
	if r := result(t, ch); !errors.Is(r.err, ErrBusy) {
		t.Fatalf("acquire: %+v %v", r.lk, r.err)
	}
	waitAttached(t, b, 1)
	if si := b.Info().Session; si.LastResume.Outcomes != 1 {
		t.Fatalf("session info %+v", si)
	}
}

// A clean Close closes the session at the leader (d).
func TestBrokerSessionCloseSendsClose(t *testing.T) {
	f := newFakeLeader(t)
	b := newSessionBroker(t, f, nil)
	waitAttached(t, b, 0)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	f.next(t, wire.TypeCloseSession)
	if si := b.Info().Session; si == nil || si.State != "closed" {
		t.Fatalf("session info %+v", si)
	}
}

// A leader that no longer speaks sessions (a downgrade to version 6) cannot
// resume the session: after SessionTimeout the broker gives it up (its
// held acquire is Indeterminate) and sends as today.
func TestBrokerSessionLostToAVersion6Leader(t *testing.T) {
	f := newFakeLeader(t)
	b := newSessionBroker(t, f, func(c *Config) { c.SessionTimeout = 2 * time.Second })
	waitAttached(t, b, 0)
	ch := asyncAcquire(t, b, context.Background(), "k", 20*time.Second)
	f.next(t, wire.TypeAcquire)
	f.mu.Lock()
	f.version = wire.VersionSessions - 1
	f.mu.Unlock()
	f.dropAll()
	if r := result(t, ch); !errors.Is(r.err, ErrIndeterminate) || !errors.Is(r.err, ErrSessionLost) {
		t.Fatalf("acquire: %+v %v", r.lk, r.err)
	}
	if si := b.Info().Session; si == nil || si.State != "failed" {
		t.Fatalf("session info %+v", si)
	}
	wantValue(t, b.MetricsRegistry(), 1, "ticketing_sidecar_sessions_lost_total")
	f.setHandlers(func(fc *fakeConn, m wire.Msg) {
		if m.Type == wire.TypeAcquire {
			fc.send(t, wire.Msg{Type: wire.TypeGranted, ID: m.ID, Token: 8})
		}
	}, nil)
	if lk, err := b.Acquire(ctxT(t, 30*time.Second), "k", "me", 30*time.Second, 0); err != nil || lk.Token != 8 {
		t.Fatalf("acquire without a session: %+v %v", lk, err)
	}
}
