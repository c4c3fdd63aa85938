package client

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/wire"
)

// sessionServer is a fake node that speaks sessions (version 7) as
// PROTOCOL.md "Sessions" says, driven by the test: every request it reads
// is handed over on got, with the connection it came on.
type sessionServer struct {
	*fakeServer
	got   chan srvMsg
	pings *atomic.Int64 // answered P (a connection's keep-alives)
}

type srvMsg struct {
	sc *srvConn
	m  wire.Msg
}

func newSessionServer(t *testing.T) *sessionServer {
	got := make(chan srvMsg, 256)
	pings := new(atomic.Int64)
	s := newFakeServerV(t, wire.VersionSessions, func(sc *srvConn, m wire.Msg) {
		if m.Type == wire.TypePing { // keep-alives are not the test's business
			pings.Add(1)
			sc.reply(t, wire.Msg{Type: wire.TypePong, ID: m.ID})
			return
		}
		got <- srvMsg{sc, m}
	})
	return &sessionServer{fakeServer: s, got: got, pings: pings}
}

// next returns the next request the server read (hang guard 30 s).
func (s *sessionServer) next(t *testing.T) srvMsg {
	t.Helper()
	select {
	case r := <-s.got:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("fake server: no request")
		return srvMsg{}
	}
}

func (s *sessionServer) dial7(t *testing.T) *Conn {
	t.Helper()
	c, err := Dial(context.Background(), s.ln.Addr().String(), Config{Secret: secret, MaxVersion: wire.VersionSessions, KeepAlive: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testSession is a session with a fixed id (0x0102030405060708) and secret.
func testSession(t *testing.T, cfg SessionConfig) *Session {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	seed := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	for i := range wire.SecretLen {
		seed = append(seed, byte(0xa0+i))
	}
	cfg.Rand = bytes.NewReader(seed)
	s, err := NewSession(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.ID() != 0x0102030405060708 {
		t.Fatalf("id %x", s.ID())
	}
	return s
}

// openOn opens sess on c, answering the o as the fake server.
func openOn(t *testing.T, srv *sessionServer, sess *Session, c *Conn) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- sess.Open(context.Background(), c) }()
	r := srv.next(t)
	if r.m.Type != wire.TypeOpenSession || r.m.Session != sess.ID() || r.m.TimeoutMs != 10_000 || r.m.Secret != sess.secret {
		t.Fatalf("open frame %+v", r.m)
	}
	r.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: r.m.ID})
	if err := <-errc; err != nil {
		t.Fatalf("Open: %v", err)
	}
}

func waitDone(t *testing.T, call *Call) {
	t.Helper()
	select {
	case <-call.Done:
	case <-time.After(30 * time.Second):
		t.Fatalf("call %d never completed", call.ID)
	}
}

// connClosedWith waits until c closes (what: the event that should close
// it) and checks that its error is want.
func connClosedWith(t *testing.T, c *Conn, want error, what string) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not close the connection", what)
	}
	if !errors.Is(c.Err(), want) {
		t.Fatalf("%s: connection closed with %v, want %v", what, c.Err(), want)
	}
}

func notDone(t *testing.T, call *Call) {
	t.Helper()
	select {
	case <-call.Done:
		t.Fatalf("call %d completed: %+v err %v", call.ID, call.Reply, call.Err)
	default:
	}
}

func TestNewSessionRandomness(t *testing.T) {
	// A zero id is drawn again: the id must be nonzero.
	seed := append(make([]byte, 8), 0, 0, 0, 0, 0, 0, 0, 9)
	seed = append(seed, bytes.Repeat([]byte{7}, wire.SecretLen)...)
	s, err := NewSession(SessionConfig{Timeout: 5 * time.Second, Rand: bytes.NewReader(seed)})
	if err != nil || s.ID() != 9 || s.secret != [wire.SecretLen]byte(bytes.Repeat([]byte{7}, wire.SecretLen)) {
		t.Fatalf("session %+v err %v", s, err)
	}
	if _, err := NewSession(SessionConfig{Timeout: time.Second}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("timeout below the bound: %v", err)
	}
	if _, err := NewSession(SessionConfig{Timeout: time.Second, Rand: bytes.NewReader(nil)}); err == nil {
		t.Fatal("no randomness, no session")
	}
	a, _ := NewSession(SessionConfig{Timeout: 10 * time.Second})
	b, _ := NewSession(SessionConfig{Timeout: 10 * time.Second})
	if a.ID() == b.ID() || a.secret == b.secret {
		t.Fatal("crypto/rand gave two equal sessions")
	}
}

func TestSessionOpenAndIDs(t *testing.T) {
	srv := newSessionServer(t)
	c := srv.dial7(t)
	sess := testSession(t, SessionConfig{})
	// A request before the open takes the connection's own id.
	st, err := c.Start(wire.Msg{Type: wire.TypeStatus})
	if err != nil {
		t.Fatal(err)
	}
	r := srv.next(t)
	if r.m.ID != 1 {
		t.Fatalf("status id %d", r.m.ID)
	}
	// Attaching waits for what is in flight (its replies could not be
	// told from a resume's answers).
	if err := sess.Open(context.Background(), c); !errors.Is(err, ErrConnBusy) {
		t.Fatalf("Open with a request in flight: %v", err)
	}
	r.sc.reply(t, wire.Msg{Type: wire.TypeStatusR, ID: 1, NodeID: "n1", Role: wire.RoleLeader})
	waitDone(t, st)
	if sess.Stats().State != SessionNone {
		t.Fatalf("state %v", sess.Stats().State)
	}

	errc := make(chan error, 1)
	go func() { errc <- sess.Open(context.Background(), c) }()
	o := srv.next(t)
	if o.m.Type != wire.TypeOpenSession || o.m.ID != 2 {
		t.Fatalf("open %+v", o.m)
	}
	// Nothing of the session is written before the open is answered.
	if _, err := c.Start(acquire("k")); !errors.Is(err, ErrSessionNotAttached) {
		t.Fatalf("acquire before the open's K: %v", err)
	}
	o.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: o.m.ID})
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if sess.Conn() != c || sess.Stats().State != SessionAttached || !sess.Stats().Opened {
		t.Fatalf("stats %+v", sess.Stats())
	}
	call, err := c.Start(acquire("k"))
	if err != nil {
		t.Fatal(err)
	}
	a := srv.next(t)
	if a.m.ID != 3 || call.ID != 3 {
		t.Fatalf("acquire id %d call %d", a.m.ID, call.ID)
	}
	a.sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: 3, Token: 7})
	waitDone(t, call)
	if call.Err != nil || call.Reply.Token != 7 {
		t.Fatalf("call %+v err %v", call.Reply, call.Err)
	}
	if err := sess.Open(context.Background(), c); !errors.Is(err, ErrSessionState) {
		t.Fatalf("second open: %v", err)
	}
	// The o and y frames are the Session's alone.
	if _, err := c.Start(wire.Msg{Type: wire.TypeResume, Session: 1}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("raw y: %v", err)
	}
}

func TestSessionNeedsVersion7(t *testing.T) {
	srv := newSessionServer(t)
	c, err := Dial(context.Background(), srv.ln.Addr().String(), Config{Secret: secret, MaxVersion: wire.VersionExtend, KeepAlive: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	sess := testSession(t, SessionConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // hang guard
	defer cancel()
	if err := sess.Open(ctx, c); !errors.Is(err, wire.ErrNotSupported) {
		t.Fatalf("open on version %d: %v", c.Peer().Version, err)
	}
	if sess.Stats().State != SessionNone {
		t.Fatalf("state %v", sess.Stats().State)
	}
}

// heldSession opens a session on a first connection, writes acquires
// on it, lets the server answer some (first: G to the first acquire
// with serial 1 and its O; Q to the second), then kills the connection.
// It returns the session and the calls.
func heldSession(t *testing.T, srv *sessionServer, queuedHook func(*Call)) (*Session, []*Call) {
	t.Helper()
	c1 := srv.dial7(t)
	sess := testSession(t, SessionConfig{})
	openOn(t, srv, sess, c1)
	var calls []*Call
	var sc *srvConn
	queued := make(chan struct{}, 4)
	hook := func(call *Call) {
		if queuedHook != nil {
			queuedHook(call)
		}
		queued <- struct{}{}
	}
	for i := range 4 {
		call, err := c1.StartFunc(acquire("k"), Hooks{Queued: hook})
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call)
		r := srv.next(t)
		if r.m.ID != call.ID {
			t.Fatalf("acquire %d has id %d, call %d", i, r.m.ID, call.ID)
		}
		sc = r.sc
	}
	sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: calls[0].ID, Token: 11})
	sc.reply(t, wire.Msg{Type: wire.TypeOutcomes, Session: sess.ID(), Serial: 1})
	sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: calls[1].ID})
	waitDone(t, calls[0])
	<-queued // after the O: the reader handles frames in order
	if sess.Stats().Ack != 1 {
		t.Fatalf("O not taken: %+v", sess.Stats())
	}
	sc.nc.Close()
	<-c1.Done()
	for _, call := range calls[1:] {
		notDone(t, call)
		if !c1.Written(call) {
			t.Fatalf("held call %d not written", call.ID)
		}
	}
	if st := sess.Stats(); st.State != SessionNone || st.Held != 3 || st.High < calls[3].ID || sess.Conn() != nil {
		t.Fatalf("stats after the connection died: %+v", st)
	}
	return sess, calls
}

func TestSessionResumeAnswers(t *testing.T) {
	srv := newSessionServer(t)
	var queuedHooks atomic.Int32
	sess, calls := heldSession(t, srv, func(*Call) { queuedHooks.Add(1) })
	if n := queuedHooks.Load(); n != 1 {
		t.Fatalf("Queued hook ran %d times", n)
	}

	c2 := srv.dial7(t)
	type res struct {
		n   ResumeCounts
		err error
	}
	done := make(chan res, 1)
	go func() { n, err := sess.Resume(context.Background(), c2); done <- res{n, err} }()
	y := srv.next(t)
	if y.m.Type != wire.TypeResume || y.m.Session != sess.ID() || y.m.Secret != sess.secret || y.m.Serial != 1 ||
		y.m.High < calls[3].ID || y.m.ID <= y.m.High {
		t.Fatalf("resume frame %+v (calls up to %d)", y.m, calls[3].ID)
	}
	// The answer: the third acquire's outcome (granted, serial 2), the
	// second still queued, the watermark, K. The fourth was never applied.
	y.sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: calls[2].ID, Token: 12})
	y.sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: calls[1].ID})
	y.sc.reply(t, wire.Msg{Type: wire.TypeOutcomes, Session: sess.ID(), Serial: 2})
	y.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: y.m.ID})
	r := <-done
	if r.err != nil || r.n != (ResumeCounts{Outcomes: 1, Queued: 1, Void: 1}) {
		t.Fatalf("resume: %+v %v", r.n, r.err)
	}
	waitDone(t, calls[2])
	if calls[2].Err != nil || calls[2].Reply.Token != 12 {
		t.Fatalf("resumed grant %+v %v", calls[2].Reply, calls[2].Err)
	}
	waitDone(t, calls[3])
	if !errors.Is(calls[3].Err, ErrVoid) || !calls[3].Written {
		t.Fatalf("void call: %v written %v", calls[3].Err, calls[3].Written)
	}
	notDone(t, calls[1])
	if n := queuedHooks.Load(); n != 1 {
		t.Fatalf("Queued hook ran %d times after the resume", n)
	}
	st := sess.Stats()
	if st.State != SessionAttached || st.Resumes != 1 || st.Held != 0 || st.Ack != 2 || sess.Conn() != c2 || st.LastResume != r.n {
		t.Fatalf("stats %+v", st)
	}
	// The queued acquire's final reply comes on the new connection.
	y.sc.reply(t, wire.Msg{Type: wire.TypeTimeout, ID: calls[1].ID})
	waitDone(t, calls[1])
	if calls[1].Err != nil || calls[1].Reply.Type != wire.TypeTimeout {
		t.Fatalf("queued call %+v %v", calls[1].Reply, calls[1].Err)
	}
	// A second Q for an acquire outside a resume's answer is a violation.
	call, err := c2.Start(acquire("k2"))
	if err != nil {
		t.Fatal(err)
	}
	if a := srv.next(t); a.m.ID <= y.m.ID || call.ID != a.m.ID {
		t.Fatalf("new request id %d after the resume's %d", a.m.ID, y.m.ID)
	}
	y.sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: call.ID})
	y.sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: call.ID})
	connClosedWith(t, c2, ErrProtocol, "a second Q")
	// Written in the session: held for the next resume, not failed.
	notDone(t, call)
	if st := sess.Stats(); st.Held != 1 || st.State != SessionNone {
		t.Fatalf("stats %+v", st)
	}
}

// A Q in the resume's answer for an acquire whose first Q was lost runs
// its hook (the first time the caller hears it), and outcomes the session
// had already received (its ack lagged) are dropped.
func TestSessionResumeRepeatedAndLateQ(t *testing.T) {
	srv := newSessionServer(t)
	c1 := srv.dial7(t)
	sess := testSession(t, SessionConfig{})
	openOn(t, srv, sess, c1)
	var queued atomic.Int32
	a, _ := c1.StartFunc(acquire("k"), Hooks{Queued: func(*Call) { queued.Add(1) }})
	b, _ := c1.StartFunc(acquire("k"), Hooks{Queued: func(*Call) { queued.Add(1) }})
	r := srv.next(t)
	srv.next(t)
	r.sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: a.ID, Token: 5}) // its O is lost
	waitDone(t, a)
	r.sc.nc.Close()
	<-c1.Done()

	c2 := srv.dial7(t)
	done := make(chan error, 1)
	var n ResumeCounts
	go func() {
		var err error
		n, err = sess.Resume(context.Background(), c2)
		done <- err
	}()
	y := srv.next(t)
	if y.m.Serial != 0 {
		t.Fatalf("ack %d", y.m.Serial)
	}
	y.sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: a.ID, Token: 5})
	y.sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: b.ID})
	y.sc.reply(t, wire.Msg{Type: wire.TypeOutcomes, Session: sess.ID(), Serial: 1})
	y.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: y.m.ID})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n != (ResumeCounts{Queued: 1, Repeated: 1}) || queued.Load() != 1 {
		t.Fatalf("counts %+v, Queued hooks %d", n, queued.Load())
	}
	notDone(t, b)
	if c2.Err() != nil {
		t.Fatalf("connection: %v", c2.Err())
	}
}

// A resume answered E (the session expired, or the secret was refused):
// what the session held completes as today, outcome unknown, and the
// session is unusable.
func TestSessionResumeRefused(t *testing.T) {
	for _, tc := range []struct {
		code  wire.Code
		state SessionState
	}{{wire.CodeNoSession, SessionExpired}, {wire.CodeBadSession, SessionFailed}} {
		t.Run(tc.code.String(), func(t *testing.T) { testSessionResumeRefused(t, tc.code, tc.state) })
	}
}

func testSessionResumeRefused(t *testing.T, code wire.Code, state SessionState) {
	srv := newSessionServer(t)
	sess, calls := heldSession(t, srv, nil)
	c2 := srv.dial7(t)
	done := make(chan error, 1)
	go func() { _, err := sess.Resume(context.Background(), c2); done <- err }()
	y := srv.next(t)
	y.sc.reply(t, wire.Msg{Type: wire.TypeError, ID: y.m.ID, Code: code, Text: "refused"})
	err := <-done
	if !errors.Is(err, ErrSessionRefused) || !errors.Is(err, wire.ErrOf(code)) {
		t.Fatalf("resume: %v", err)
	}
	for _, call := range calls[1:] {
		waitDone(t, call)
		if !errors.Is(call.Err, ErrConnClosed) || !call.Written {
			t.Fatalf("call %d: %v written %v", call.ID, call.Err, call.Written)
		}
	}
	if sess.Usable() || sess.Stats().State != state {
		t.Fatalf("stats %+v", sess.Stats())
	}
	if _, err := sess.Resume(context.Background(), srv.dial7(t)); !errors.Is(err, ErrSessionState) {
		t.Fatalf("resume of a failed session: %v", err)
	}
	// The connection itself goes on, without a session.
	call, err := c2.Start(acquire("k"))
	if err != nil {
		t.Fatal(err)
	}
	if a := srv.next(t); a.m.ID != call.ID {
		t.Fatalf("id %d", a.m.ID)
	}
}

// A resume answered M (not the leader) leaves the held requests held; a
// resume elsewhere then answers them.
func TestSessionResumeMovedThenElsewhere(t *testing.T) {
	srv := newSessionServer(t)
	sess, calls := heldSession(t, srv, nil)
	c2 := srv.dial7(t)
	done := make(chan error, 1)
	go func() { _, err := sess.Resume(context.Background(), c2); done <- err }()
	y := srv.next(t)
	y.sc.reply(t, wire.Msg{Type: wire.TypeMoved, ID: y.m.ID})
	if err := <-done; !errors.Is(err, ErrSessionRefused) {
		t.Fatalf("resume: %v", err)
	}
	for _, call := range calls[1:] {
		notDone(t, call)
	}
	if st := sess.Stats(); st.Held != 3 || st.State != SessionNone || !sess.Usable() {
		t.Fatalf("stats %+v", st)
	}
	c3 := srv.dial7(t)
	go func() { _, err := sess.Resume(context.Background(), c3); done <- err }()
	y = srv.next(t)
	for _, call := range calls[1:] {
		y.sc.reply(t, wire.Msg{Type: wire.TypeBusy, ID: call.ID})
	}
	y.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: y.m.ID})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, call := range calls[1:] {
		waitDone(t, call)
		if call.Reply.Type != wire.TypeBusy {
			t.Fatalf("call %d: %+v %v", call.ID, call.Reply, call.Err)
		}
	}
}

// A resume not answered within the caller's deadline closes its
// connection and keeps the requests held; Fail completes them.
func TestSessionResumeDeadlineThenFail(t *testing.T) {
	srv := newSessionServer(t)
	sess, calls := heldSession(t, srv, nil)
	c2 := srv.dial7(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := sess.Resume(ctx, c2); done <- err }()
	srv.next(t) // the y, never answered
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("resume: %v", err)
	}
	<-c2.Done()
	for _, call := range calls[1:] {
		notDone(t, call)
	}
	if st := sess.Stats(); st.Held != 3 || !sess.Usable() {
		t.Fatalf("stats %+v", st)
	}
	cause := errors.New("no leader in time")
	sess.Fail(cause)
	for _, call := range calls[1:] {
		waitDone(t, call)
		if !errors.Is(call.Err, ErrConnClosed) || !errors.Is(call.Err, cause) || !call.Written {
			t.Fatalf("call %d: %v", call.ID, call.Err)
		}
	}
}

// The connection dies while the resume is answered: what was answered
// stays answered, the rest stays held for the next resume.
func TestSessionResumeCutShort(t *testing.T) {
	srv := newSessionServer(t)
	sess, calls := heldSession(t, srv, nil)
	c2 := srv.dial7(t)
	done := make(chan error, 1)
	go func() { _, err := sess.Resume(context.Background(), c2); done <- err }()
	y := srv.next(t)
	y.sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: calls[2].ID, Token: 12})
	waitDone(t, calls[2])
	y.sc.nc.Close()
	if err := <-done; !errors.Is(err, ErrConnClosed) {
		t.Fatalf("resume: %v", err)
	}
	notDone(t, calls[1])
	notDone(t, calls[3])
	if st := sess.Stats(); st.Held != 2 || st.State != SessionNone {
		t.Fatalf("stats %+v", st)
	}
	c3 := srv.dial7(t)
	go func() { _, err := sess.Resume(context.Background(), c3); done <- err }()
	y = srv.next(t)
	y.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: y.m.ID})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, call := range []*Call{calls[1], calls[3]} {
		waitDone(t, call)
		if !errors.Is(call.Err, ErrVoid) {
			t.Fatalf("call %d: %v", call.ID, call.Err)
		}
	}
}

// Resuming while attached to a live connection detaches it first: that
// connection is closed, and what it had written is held and resumed.
func TestSessionResumeMovesFromLiveConn(t *testing.T) {
	srv := newSessionServer(t)
	c1 := srv.dial7(t)
	sess := testSession(t, SessionConfig{})
	openOn(t, srv, sess, c1)
	call, _ := c1.Start(acquire("k"))
	srv.next(t)
	c2 := srv.dial7(t)
	done := make(chan error, 1)
	go func() { _, err := sess.Resume(context.Background(), c2); done <- err }()
	y := srv.next(t)
	if c1.Err() == nil {
		t.Fatal("the old connection of the session is still open")
	}
	y.sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: call.ID, Token: 3})
	y.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: y.m.ID})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitDone(t, call)
	if call.Reply.Token != 3 {
		t.Fatalf("%+v %v", call.Reply, call.Err)
	}
}

// Hostile or broken servers: the connection closes with ErrProtocol.
func TestSessionProtocolViolations(t *testing.T) {
	cases := []struct {
		name string
		bad  func(sess *Session, sc *srvConn, y wire.Msg, calls []*Call) wire.Msg
	}{
		{"outcomes of another session", func(sess *Session, _ *srvConn, _ wire.Msg, _ []*Call) wire.Msg {
			return wire.Msg{Type: wire.TypeOutcomes, Session: sess.ID() + 1, Serial: 1}
		}},
		{"reply to a seq above high", func(_ *Session, _ *srvConn, y wire.Msg, _ []*Call) wire.Msg {
			return wire.Msg{Type: wire.TypeGranted, ID: y.ID + 5, Token: 1}
		}},
		{"Q for a seq not held", func(_ *Session, _ *srvConn, _ wire.Msg, calls []*Call) wire.Msg {
			return wire.Msg{Type: wire.TypeQueued, ID: calls[0].ID} // answered before the connection died
		}},
		{"a reply type that cannot answer an acquire", func(_ *Session, _ *srvConn, _ wire.Msg, calls []*Call) wire.Msg {
			return wire.Msg{Type: wire.TypeOK, ID: calls[2].ID}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newSessionServer(t)
			sess, calls := heldSession(t, srv, nil)
			c2 := srv.dial7(t)
			done := make(chan error, 1)
			go func() { _, err := sess.Resume(context.Background(), c2); done <- err }()
			y := srv.next(t)
			y.sc.reply(t, tc.bad(sess, y.sc, y.m, calls))
			if err := <-done; !errors.Is(err, ErrProtocol) {
				t.Fatalf("resume: %v", err)
			}
			if !errors.Is(c2.Err(), ErrProtocol) {
				t.Fatalf("connection: %v", c2.Err())
			}
			// The session still holds them: the broken server told nothing.
			for _, call := range calls[1:] {
				notDone(t, call)
			}
		})
	}
	t.Run("outcomes on a connection without a session", func(t *testing.T) {
		srv := newSessionServer(t)
		c := srv.dial7(t)
		st, _ := c.Start(wire.Msg{Type: wire.TypeStatus})
		r := srv.next(t)
		r.sc.reply(t, wire.Msg{Type: wire.TypeOutcomes, Session: 1, Serial: 1})
		waitDone(t, st)
		if !errors.Is(c.Err(), ErrProtocol) {
			t.Fatalf("connection: %v", c.Err())
		}
	})
}

// The ack is reported with k: at once after AckEvery outcomes, else
// AckDelay after it changed.
func TestSessionAckReports(t *testing.T) {
	srv := newSessionServer(t)
	c := srv.dial7(t)
	sess := testSession(t, SessionConfig{AckEvery: 4, AckDelay: 20 * time.Millisecond})
	openOn(t, srv, sess, c)
	st, _ := c.Start(wire.Msg{Type: wire.TypeStatus})
	r := srv.next(t)
	r.sc.reply(t, wire.Msg{Type: wire.TypeStatusR, ID: r.m.ID, NodeID: "n1"})
	waitDone(t, st)
	r.sc.reply(t, wire.Msg{Type: wire.TypeOutcomes, Session: sess.ID(), Serial: 1})
	k := srv.next(t) // after AckDelay
	if k.m.Type != wire.TypeSessionAck || k.m.Serial != 1 {
		t.Fatalf("ack %+v", k.m)
	}
	k.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: k.m.ID})
	r.sc.reply(t, wire.Msg{Type: wire.TypeOutcomes, Session: sess.ID(), Serial: 5})
	k = srv.next(t)
	if k.m.Type != wire.TypeSessionAck || k.m.Serial != 5 {
		t.Fatalf("ack %+v", k.m)
	}
	k.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: k.m.ID})
	if sess.Stats().Ack != 5 {
		t.Fatalf("stats %+v", sess.Stats())
	}
}

// A U to a lock request of the session (the node lost leadership) closes
// the connection instead of ending the call: the session holds it, and a
// resume answers it.
func TestSessionUnknownIsHeld(t *testing.T) {
	srv := newSessionServer(t)
	c := srv.dial7(t)
	sess := testSession(t, SessionConfig{})
	openOn(t, srv, sess, c)
	call, err := c.Start(acquire("k"))
	if err != nil {
		t.Fatal(err)
	}
	a := srv.next(t)
	a.sc.reply(t, wire.Msg{Type: wire.TypeUnknown, ID: a.m.ID, Text: "leadership lost"})
	connClosedWith(t, c, ErrSessionUnknown, "U to a session request")
	notDone(t, call)
	if st := sess.Stats(); st.Held != 1 {
		t.Fatalf("stats %+v", st)
	}
	// Without a session, U is a reply as always.
	c2 := srv.dial7(t)
	call2, _ := c2.Start(acquire("k"))
	a = srv.next(t)
	a.sc.reply(t, wire.Msg{Type: wire.TypeUnknown, ID: a.m.ID})
	waitDone(t, call2)
	if call2.Err != nil || call2.Reply.Type != wire.TypeUnknown {
		t.Fatalf("%+v %v", call2.Reply, call2.Err)
	}
}

// Close sends d on the attached connection; after its K the session is
// closed and the connection goes on without it.
func TestSessionClose(t *testing.T) {
	srv := newSessionServer(t)
	c := srv.dial7(t)
	sess := testSession(t, SessionConfig{})
	if err := sess.Close(context.Background()); !errors.Is(err, ErrSessionState) {
		t.Fatalf("close before open: %v", err)
	}
	openOn(t, srv, sess, c)
	done := make(chan error, 1)
	go func() { done <- sess.Close(context.Background()) }()
	d := srv.next(t)
	if d.m.Type != wire.TypeCloseSession {
		t.Fatalf("close frame %+v", d.m)
	}
	d.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: d.m.ID})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if sess.Usable() || sess.Stats().State != SessionClosed || sess.Conn() != nil {
		t.Fatalf("stats %+v", sess.Stats())
	}
	if _, err := sess.Resume(context.Background(), c); !errors.Is(err, ErrSessionState) {
		t.Fatalf("resume after close: %v", err)
	}
	// The connection goes on without a session: an O is a violation now.
	d.sc.reply(t, wire.Msg{Type: wire.TypeOutcomes, Session: sess.ID(), Serial: 9})
	connClosedWith(t, c, ErrProtocol, "O after the close")
}

// A connection that carries a session pings at a third of the session's
// timeout whatever its KeepAlive says (dial7's: never), since the leader
// takes a session connection silent for the timeout for dead; before the
// session, it does not.
func TestSessionConnectionPingsWithinTimeout(t *testing.T) {
	srv := newSessionServer(t)
	c := srv.dial7(t)
	sess := testSession(t, SessionConfig{Timeout: 3 * time.Second}) // pings every 1 s
	time.Sleep(1500 * time.Millisecond)
	if n := srv.pings.Load(); n != 0 {
		t.Fatalf("%d pings before the session, with KeepAlive never", n)
	}
	errc := make(chan error, 1)
	go func() { errc <- sess.Open(context.Background(), c) }()
	r := srv.next(t)
	if r.m.Type != wire.TypeOpenSession {
		t.Fatalf("open frame %+v", r.m)
	}
	r.sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: r.m.ID})
	if err := <-errc; err != nil {
		t.Fatalf("Open: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); srv.pings.Load() < 3; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d pings in 30 s of a quiet session connection, want 3", srv.pings.Load())
		}
	}
	if c.InFlight() > 1 {
		t.Fatalf("%d calls in flight on a quiet connection whose pings are answered", c.InFlight())
	}
	if st := sess.Stats(); st.State != SessionAttached {
		t.Fatalf("session %v after its pings, want attached", st.State)
	}
}
