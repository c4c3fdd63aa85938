package client

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Sessions (protocol version 7, docs/sessions.md, PROTOCOL.md "Sessions").
//
// A Session is the broker's half of a session in the replicated lock
// state. It is attached to at most one connection at a time, with Open
// (o) or Resume (y). On that connection every request takes its id from
// the session's counter, so ids of the session only grow across
// connections (a lock request's id is its sequence number) and, per
// connection, still increase (written accounting works as without a
// session).
//
// When the attached connection dies, its written lock requests
// (acquire, block acquire, release, extend) without a final reply are not
// completed: the Session keeps them, and a Resume on another connection
// learns what became of each. The resume's answer is, in order, the
// recorded outcomes (each completes its call as its reply would have), a Q
// for every request still queued (its final reply follows on the new
// connection), the O watermark and K. Every kept call that got neither an
// outcome nor a Q is void: never applied and never will be (the resume
// raised the session's floor above it): it completes with ErrVoid. Only
// when the session cannot be resumed (the leader answers E: expired or
// refused) or the caller gives it up (Fail) do the kept calls complete
// with ErrConnClosed, their outcome unknown, as without a session.
//
// Lock order: Conn.wmu → Conn.pmu as before, and Session.mu, a leaf taken
// under either or alone. No Conn method is called under Session.mu, and no
// call's hooks run under it.

// Session tunables.
const (
	// DefaultAckEvery: the broker reports its ack (k) once this many
	// outcomes arrived since the last report. Every reported ack lets the
	// leader drop that many outcomes from the replicated state (the next
	// command of the session carries it); 64 keeps that state small in a
	// waiting room (a few KiB per session) while costing one small frame
	// per 64 replies on the fast path.
	DefaultAckEvery = 64
	// DefaultAckDelay: an ack that changed is reported at the latest this
	// long after the change, so a quiet session's outcomes do not linger
	// in the replicated state (and in every snapshot) until the 64th.
	DefaultAckDelay = 200 * time.Millisecond
)

// SessionConfig configures NewSession.
type SessionConfig struct {
	// Timeout is how long the session may stay without a connection to
	// the serving leader before the leader expires it
	// (locksm.MinSessionTimeoutMs..MaxSessionTimeoutMs). Required.
	Timeout time.Duration
	// Rand supplies the id and the secret; nil: crypto/rand. Tests
	// inject it.
	Rand io.Reader
	// AckEvery and AckDelay: see DefaultAckEvery, DefaultAckDelay. Zero:
	// the defaults.
	AckEvery int
	AckDelay time.Duration
}

// SessionState is where a session is.
type SessionState uint8

const (
	SessionNone      SessionState = iota // never attached yet (or detached: its connection died)
	SessionAttaching                     // an open or resume is on its way
	SessionAttached                      // attached to a live connection
	SessionExpired                       // the leader no longer knows it (no_session): unusable
	SessionFailed                        // refused or given up (Fail): unusable
	SessionClosed                        // closed at the leader (Close): unusable
)

func (st SessionState) String() string {
	switch st {
	case SessionNone:
		return "none"
	case SessionAttaching:
		return "resuming"
	case SessionAttached:
		return "attached"
	case SessionExpired:
		return "expired"
	case SessionFailed:
		return "failed"
	case SessionClosed:
		return "closed"
	}
	return "unknown"
}

// ResumeCounts is what one resume's answer said about the session's
// requests without a final reply.
type ResumeCounts struct {
	Outcomes int // answered from the recorded outcomes
	Queued   int // still queued: their final reply comes later
	Void     int // never applied, never will be (ErrVoid)
	Repeated int // outcomes the broker already had (its ack was behind): dropped
}

// SessionStats describe a session (the sidecar's Info and metrics).
type SessionStats struct {
	ID          uint64
	State       SessionState
	Opened      bool   // an open was answered K
	Resumes     uint64 // resumes answered K
	Held        int    // written requests waiting for a resume's answer
	High, Ack   uint64 // the highest seq written, the latest O serial read
	LastResume  ResumeCounts
	LastFailure error // why the session became unusable, or the last failed attach
}

// Session is the client side of one session. Safe for concurrent use.
type Session struct {
	id       uint64
	secret   [wire.SecretLen]byte
	timeout  time.Duration
	ackEvery uint64
	ackDelay time.Duration

	mu       sync.Mutex
	seq      uint64 // the last id taken by a connection of the session
	high     uint64 // the highest seq written (conservatively) on a dead connection
	ack      uint64 // the latest O serial read
	acked    uint64 // the latest ack sent with k
	ackTimer *time.Timer
	conn     *Conn            // attached or attaching connection; nil when none
	held     map[uint64]*Call // written, no final reply, their connection dead
	state    SessionState
	opened   bool
	resumes  uint64
	last     ResumeCounts
	failure  error
}

// NewSession makes a session with a random nonzero id and a random secret.
func NewSession(cfg SessionConfig) (*Session, error) {
	ms := cfg.Timeout.Milliseconds()
	if cfg.Timeout%time.Millisecond != 0 || ms < locksm.MinSessionTimeoutMs || ms > locksm.MaxSessionTimeoutMs {
		return nil, fmt.Errorf("%w: session timeout %v not whole milliseconds in %dms..%dms", ErrInvalidRequest, cfg.Timeout,
			locksm.MinSessionTimeoutMs, locksm.MaxSessionTimeoutMs)
	}
	r := cfg.Rand
	if r == nil {
		r = rand.Reader
	}
	s := &Session{timeout: cfg.Timeout, ackEvery: DefaultAckEvery, ackDelay: DefaultAckDelay, held: map[uint64]*Call{}}
	if cfg.AckEvery > 0 {
		s.ackEvery = uint64(cfg.AckEvery)
	}
	if cfg.AckDelay > 0 {
		s.ackDelay = cfg.AckDelay
	}
	var buf [8]byte
	for s.id == 0 {
		if _, err := io.ReadFull(r, buf[:]); err != nil {
			return nil, fmt.Errorf("client: session id: %w", err)
		}
		s.id = binary.BigEndian.Uint64(buf[:])
	}
	if _, err := io.ReadFull(r, s.secret[:]); err != nil {
		return nil, fmt.Errorf("client: session secret: %w", err)
	}
	return s, nil
}

// ID is the session's id (public; the secret never leaves the Session but
// in o and y frames).
func (s *Session) ID() uint64 { return s.id }

// Stats describe the session now.
func (s *Session) Stats() SessionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SessionStats{ID: s.id, State: s.state, Opened: s.opened, Resumes: s.resumes, Held: len(s.held), High: s.high, Ack: s.ack,
		LastResume: s.last, LastFailure: s.failure}
}

// Conn returns the connection the session is attached to, nil if none
// (or still attaching).
func (s *Session) Conn() *Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != SessionAttached {
		return nil
	}
	return s.conn
}

// Usable reports whether the session may still be attached (neither
// expired nor failed).
func (s *Session) Usable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.endedLocked()
}

// endedLocked reports whether the session is unusable. Requires mu.
func (s *Session) endedLocked() bool {
	return s.state == SessionExpired || s.state == SessionFailed || s.state == SessionClosed
}

// Close closes the session at the leader (d), the broker's clean stop
// after its last releases: its queued requests leave their queues
// (answered T), its holdings keep their leases, and the session is gone
// at once instead of expiring after its timeout. Only an attached session
// can be closed (else ErrSessionState: it expires on its own). After the
// K the connection goes on without a session and the Session is
// unusable; what it still held completes with ErrConnClosed. ctx bounds
// the wait; errors: ErrSessionRefused (M, U, E), the connection's error,
// or ctx's.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	c, attached := s.conn, s.state == SessionAttached
	st := s.state
	s.mu.Unlock()
	if !attached {
		return fmt.Errorf("%w: session %x is %s, not attached", ErrSessionState, s.id, st)
	}
	call, err := c.Start(wire.Msg{Type: wire.TypeCloseSession})
	if err != nil {
		return err
	}
	select {
	case <-call.Done:
	case <-ctx.Done():
		return fmt.Errorf("client: session %x: no answer to its close: %w", s.id, ctx.Err())
	}
	if call.Err != nil {
		return call.Err
	}
	if r := call.Reply; r.Type != wire.TypeOK {
		return fmt.Errorf("%w: session %x: close answered %s %s: %s", ErrSessionRefused, s.id, wire.TypeName(r.Type), r.Code, r.Text)
	}
	s.mu.Lock()
	if s.conn == c {
		s.conn = nil
	}
	s.mu.Unlock()
	c.sess.CompareAndSwap(s, nil)
	s.end(SessionClosed, ErrSessionClosed)
	return nil
}

// nextID gives a connection of the session its next request id: above
// every id the session gave out and above the connection's last (ids it
// took before the session was attached). Requires the connection's wmu.
func (s *Session) nextID(connLast uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq = max(s.seq, connLast) + 1
	return s.seq
}

// attachedTo reports whether lock requests may be written on c now.
func (s *Session) attachedTo(c *Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn == c && s.state == SessionAttached
}

// isSessionLock reports whether a request of type typ belongs to the
// session (has a seq whose outcome is recorded).
func isSessionLock(typ byte) bool {
	switch typ {
	case wire.TypeAcquire, wire.TypeAcquireBlock, wire.TypeRelease, wire.TypeExtend, wire.TypeAcquirePermit:
		return true
	}
	return false
}

// Open opens the session on c (o) and attaches it: lock requests written
// on c from then on belong to the session. ctx bounds the wait for the
// answer; when it ends first, c is closed (the open may have committed: an
// orphan session expires empty, and the caller opens another). Errors:
// ErrSessionState (already opened), wire.ErrNotSupported (c speaks no
// sessions), ErrConnBusy, the E reply's sentinel (wrapping ErrSessionRefused),
// ErrSessionRefused for M or U, or the connection's error.
func (s *Session) Open(ctx context.Context, c *Conn) error {
	s.mu.Lock()
	if s.opened || s.conn != nil || s.state != SessionNone {
		s.mu.Unlock()
		return fmt.Errorf("%w: session %x is %s, already opened", ErrSessionState, s.id, s.state)
	}
	s.state = SessionAttaching
	s.conn = c
	s.mu.Unlock()
	m := wire.Msg{Type: wire.TypeOpenSession, Session: s.id, TimeoutMs: uint32(s.timeout.Milliseconds()), Secret: s.secret}
	call, err := c.attach(s, m, nil)
	if err != nil {
		s.attachFailed(c, err, SessionNone)
		return err
	}
	return s.awaitAttach(ctx, c, call)
}

// Resume attaches the session to c (y): the requests it holds (written on
// a connection that died, no final reply) are registered on c under their
// seqs before y is written, so that the answer finds them. A session
// attached to another live connection is detached from it first (that
// connection is closed: one connection per session). It returns what the
// answer said. ctx bounds the wait; when it ends first, c is closed and
// the held requests stay held (resume again elsewhere, or Fail).
// Errors: ErrSessionState (expired, failed, never opened), ErrConnBusy
// (c has requests in flight: try again shortly), wire.ErrNotSupported,
// ErrSessionRefused for M or U (the held requests stay held), an E reply's
// sentinel wrapping ErrSessionRefused (the session is unusable and its held
// requests completed with ErrConnClosed: locksm.ErrNoSession means it
// expired), or the connection's error.
func (s *Session) Resume(ctx context.Context, c *Conn) (ResumeCounts, error) {
	s.mu.Lock()
	if old := s.conn; old != nil && old != c && s.state == SessionAttached {
		s.mu.Unlock()
		old.Close() // its shutdown hands its written requests back to the session
		s.mu.Lock()
	}
	switch {
	case !s.opened || s.endedLocked():
		st := s.state
		s.mu.Unlock()
		return ResumeCounts{}, fmt.Errorf("%w: session %x is %s (opened %v)", ErrSessionState, s.id, st, s.opened)
	case s.conn == c && s.state == SessionAttached:
		s.mu.Unlock()
		return ResumeCounts{}, nil
	case s.conn != nil:
		s.mu.Unlock()
		return ResumeCounts{}, fmt.Errorf("%w: session %x is being attached elsewhere", ErrSessionState, s.id)
	}
	regs := make(map[uint64]*Call, len(s.held))
	for seq, call := range s.held {
		regs[seq] = call
	}
	high, ack := s.high, s.ack
	s.state = SessionAttaching
	s.conn = c
	s.mu.Unlock()
	m := wire.Msg{Type: wire.TypeResume, Session: s.id, Secret: s.secret, High: high, Serial: ack}
	rs := &resumeState{high: high, regs: regs}
	call, err := c.attach(s, m, rs)
	if err != nil {
		s.attachFailed(c, err, SessionNone)
		return ResumeCounts{}, err
	}
	err = s.awaitAttach(ctx, c, call)
	return rs.counts, err
}

// awaitAttach waits for the answer to an open or resume (the reader has
// already acted on it: sessionReply).
func (s *Session) awaitAttach(ctx context.Context, c *Conn, call *Call) error {
	select {
	case <-call.done:
	case <-ctx.Done():
		c.Close() // its shutdown detaches the session and hands the requests back
		<-call.done
		return fmt.Errorf("client: session %x: no answer to %s: %w", s.id, wire.TypeName(call.reqType), ctx.Err())
	}
	if call.Err != nil {
		return call.Err
	}
	r := call.Reply
	switch r.Type {
	case wire.TypeOK:
		return nil
	case wire.TypeError:
		return fmt.Errorf("%w: session %x: %s answered E %s: %w: %s", ErrSessionRefused, s.id, wire.TypeName(call.reqType),
			r.Code, wire.ErrOf(r.Code), r.Text)
	default:
		return fmt.Errorf("%w: session %x: %s answered %s (%s): not attached", ErrSessionRefused, s.id, wire.TypeName(call.reqType),
			wire.TypeName(r.Type), r.Text)
	}
}

// attachFailed undoes an attach that was not answered K on c; state is
// what the session becomes unless c was no longer its connection.
func (s *Session) attachFailed(c *Conn, err error, state SessionState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == c {
		s.conn = nil
		if !s.endedLocked() {
			s.state = state
		}
	}
	s.failure = err
}

// detached is called by a session connection's shutdown, before it
// completes any call: calls are its written lock requests without a final
// reply, which the session now holds, and written is the highest id the
// connection may have written.
func (s *Session) detached(c *Conn, calls []*Call, written uint64, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.high = max(s.high, written)
	for _, call := range calls {
		call.adopted.Store(true)
		s.held[call.ID] = call
	}
	if s.conn == c {
		s.conn = nil
		if s.state == SessionAttached || s.state == SessionAttaching {
			s.state = SessionNone
		}
		s.failure = cause
	}
	if s.ackTimer != nil {
		s.ackTimer.Stop()
		s.ackTimer = nil
	}
}

// Fail gives the session up (it could not be resumed in time, or the
// broker stops): its attached connection is closed, and every request it
// holds completes with an error wrapping ErrConnClosed and cause (Written:
// its outcome is unknown). The session is unusable afterwards.
func (s *Session) Fail(cause error) {
	s.mu.Lock()
	c := s.conn
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
	s.end(SessionFailed, cause)
}

// end makes the session unusable and completes what it holds.
func (s *Session) end(state SessionState, cause error) {
	s.mu.Lock()
	held := s.held
	s.held = map[uint64]*Call{}
	if !s.endedLocked() {
		s.state = state
	}
	s.failure = cause
	if s.ackTimer != nil {
		s.ackTimer.Stop()
		s.ackTimer = nil
	}
	s.mu.Unlock()
	for seq, call := range held {
		if !call.claimed.CompareAndSwap(false, true) {
			continue // its reply is being delivered
		}
		call.Err = fmt.Errorf("request %d: %w: session %x: %w", seq, ErrConnClosed, s.id, cause)
		call.Written = true
		call.complete()
	}
}

// outcomes takes an O watermark read on c: the ack moves up, and is
// reported now (every ackEvery outcomes) or soon (ackDelay).
func (s *Session) outcomes(c *Conn, serial uint64) {
	s.mu.Lock()
	if serial <= s.ack {
		s.mu.Unlock()
		return
	}
	s.ack = serial
	now := s.ack-s.acked >= s.ackEvery
	if !now && s.ackTimer == nil {
		s.ackTimer = time.AfterFunc(s.ackDelay, func() { s.reportAck(c) })
	}
	s.mu.Unlock()
	if now {
		s.reportAck(c)
	}
}

// reportAck sends k with the current ack on c, if it is still the
// session's connection and the ack moved since the last report.
func (s *Session) reportAck(c *Conn) {
	s.mu.Lock()
	if s.ackTimer != nil {
		s.ackTimer.Stop()
		s.ackTimer = nil
	}
	ack := s.ack
	ok := s.conn == c && s.state == SessionAttached && ack > s.acked
	if ok {
		s.acked = ack
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	// The K that answers it carries nothing: nobody waits for it.
	if _, err := c.StartFunc(wire.Msg{Type: wire.TypeSessionAck, Serial: ack}, Hooks{}); err != nil {
		s.mu.Lock()
		if s.acked == ack {
			s.acked = 0 // not sent: the next resume's y carries it anyway
		}
		s.mu.Unlock()
	}
}

// resumeState is a resume in progress on a connection (Conn.resume, under
// pmu): the held calls registered there, until the K.
type resumeState struct {
	call   *Call
	high   uint64
	regs   map[uint64]*Call // registered for the answer; removed on reply or Q
	counts ResumeCounts
}

// attach registers s on c and writes m (o or y) as c's first session
// request; for a resume, rs.regs are registered in c's pending under their
// seqs before m is buffered.
func (c *Conn) attach(s *Session, m wire.Msg, rs *resumeState) (*Call, error) {
	if c.peer.Version < wire.VersionSessions {
		return nil, fmt.Errorf("%w: sessions need protocol version %d; %s speaks %d", wire.ErrNotSupported,
			wire.VersionSessions, c.peer.NodeID, c.peer.Version)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed {
		return nil, c.closedErr()
	}
	if cur := c.sess.Load(); cur != nil {
		return nil, fmt.Errorf("%w: the connection carries session %x already", ErrSessionState, cur.id)
	}
	c.pmu.Lock()
	busy := len(c.pending)
	c.pmu.Unlock()
	if busy > 0 {
		// A reply to one of them could not be told from the answer for
		// an old seq of the session with the same id.
		return nil, fmt.Errorf("%w: %d requests in flight", ErrConnBusy, busy)
	}
	c.sess.Store(s)
	select { // the session's keep-alive interval applies from now
	case c.kaKick <- struct{}{}:
	default:
	}
	if rs != nil {
		c.pmu.Lock()
		for seq, call := range rs.regs {
			c.pending[seq] = call
		}
		c.resume = rs
		c.pmu.Unlock()
	}
	call, err := c.startLocked(m, Hooks{})
	if err != nil {
		c.sess.Store(nil)
		c.pmu.Lock()
		for seq := range rs.regsOrNil() {
			delete(c.pending, seq)
		}
		c.resume = nil
		c.pmu.Unlock()
		return nil, err
	}
	if rs != nil {
		rs.call = call
	}
	c.wake()
	return call, nil
}

func (rs *resumeState) regsOrNil() map[uint64]*Call {
	if rs == nil {
		return nil
	}
	return rs.regs
}

// sessionReply acts on the answer to an open or resume (the reader calls
// it before completing the call, so that Open and Resume return after
// the calls it settled).
func (c *Conn) sessionReply(call *Call, r wire.Msg) {
	s := c.sess.Load()
	if s == nil {
		return
	}
	c.pmu.Lock()
	rs := c.resume
	c.resume = nil
	var void, back []*Call
	if rs != nil {
		for seq, held := range rs.regs {
			if r.Type == wire.TypeOK {
				void = append(void, held)
			} else {
				back = append(back, held)
			}
			delete(c.pending, seq)
		}
		rs.counts.Void = len(void)
	}
	c.pmu.Unlock()

	s.mu.Lock()
	switch {
	case r.Type == wire.TypeOK:
		s.state = SessionAttached
		if call.reqType == wire.TypeOpenSession {
			s.opened = true
		} else {
			s.resumes++
			s.last = rs.counts
		}
		clear(s.held) // answered, queued here, or void
		s.failure = nil
	case r.Type == wire.TypeError && call.reqType == wire.TypeResume:
		// The leader will not resume it: expired (no_session) or not
		// proven (bad_session). What it held can never be learned.
		s.state = SessionFailed
		if errors.Is(wire.ErrOf(r.Code), locksm.ErrNoSession) {
			s.state = SessionExpired
		}
	default:
		// Not attached (M, U, or E to an open): the held requests stay
		// held for a resume elsewhere.
		if s.state == SessionAttaching {
			s.state = SessionNone
		}
	}
	if s.state != SessionAttached && s.conn == c {
		s.conn = nil
	}
	ended := s.endedLocked()
	s.mu.Unlock()
	if r.Type != wire.TypeOK {
		c.sess.Store(nil) // c goes on without a session
	}
	for _, v := range void {
		if !v.claimed.CompareAndSwap(false, true) {
			continue
		}
		v.Err = fmt.Errorf("request %d: %w", v.ID, ErrVoid)
		v.Written = true
		v.complete()
	}
	if ended {
		s.end(SessionFailed, fmt.Errorf("resume answered E %s: %w", r.Code, wire.ErrOf(r.Code)))
	}
	_ = back // still in s.held
}

// settled forgets a held request whose final reply arrived (in a resume's
// answer, or later after its Q).
func (s *Session) settled(seq uint64) {
	if s == nil {
		return
	}
	s.mu.Lock()
	delete(s.held, seq)
	s.mu.Unlock()
}
