// Package client is the low-level client of a node's client port: one
// authenticated, pipelined TCP connection that sends requests and matches
// replies by id (cluster/wire/PROTOCOL.md, "Response matching rules"). It does not
// follow M, reconnect or retry: that is sidecar.Broker's job, built on it.
// It does act on a node's hand-over notice (protocol version 3): from then
// on it refuses acquires and releases without writing them
// (ErrHandingOver) and acknowledges the notice behind everything it wrote
// before, until the node says it serves again.
//
// Writes go through one combining buffer: callers append their encoded
// request under a mutex and wake a single writer goroutine, which sends
// everything buffered in one Write. Under many concurrent callers this turns
// dozens of requests into one syscall, and no caller ever blocks on the
// socket, so a cancelled context always returns promptly. Replies are read by
// one reader goroutine and handed to the waiting call by id.
//
// Written accounting: ids are assigned in buffer order, and before each
// Write the writer records the highest id in it. A request counts as written
// once a Write that contained it was attempted — conservatively, since some
// of those bytes may never have left, but never the other way round, so a
// request reported unwritten truly never reached the socket and may be sent
// again elsewhere.
//
// Sessions (protocol version 7, session.go): a Conn may carry one Session
// (Session.Open, Session.Resume). Its request ids then come from the
// session's counter, and its written lock requests without a final reply
// outlive it: when it dies they stay with the Session, and a resume on
// another connection answers each (its outcome, still queued, or void:
// ErrVoid). Without a session a Conn behaves exactly as before.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"ticketing/cluster/wire"
)

// DefaultHandshakeTimeout bounds dial + handshake when Config leaves it zero.
const DefaultHandshakeTimeout = 5 * time.Second

// frameRef is where one request's frame starts in Conn.wbuf.
type frameRef struct {
	id  uint64
	off int
}

// Config configures Dial.
type Config struct {
	// Secret is the client secret (the node's --secret-file content).
	Secret []byte
	// NextSecret, when set, is tried when the node does not prove itself
	// with Secret (during a secret rollover). nil: Secret only.
	NextSecret []byte
	// TLS, when set, runs TLS 1.3 before the handshake (build it with
	// tlsconf.ClientConfig); the handshake then signs the TLS exporter.
	// An empty ServerName is set to the host of the dialled address. nil:
	// plaintext.
	TLS *tls.Config
	// KeepAlive is the idle time after which the connection sends a ping,
	// so that the node's IdleTimeout (default 2 min) never closes a
	// connection that is merely quiet. Zero: 30 s; negative: never. A
	// connection that carries a session pings sooner whatever this says
	// (SessionKeepAliveDivisor): the leader takes a session connection
	// silent for the session's timeout for dead.
	KeepAlive time.Duration
	// ClusterID must match the node's; "" for the default.
	ClusterID string
	// Domain, when set, is the fencing domain the node must belong to
	// (the handshake fails with wrong_domain otherwise). "": any; the
	// node's domain is in Conn.Peer().Domain.
	Domain string
	// HandshakeTimeout bounds dial + handshake; zero means 5s.
	HandshakeTimeout time.Duration
	// Dialer dials TCP; nil means a net.Dialer.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	// OnNotice, when set, hears every notice the node sends (version 3:
	// a hand-over starting, or the node serving as leader). It runs on the
	// connection's reader goroutine before the connection acts on the
	// notice (for NoticeHandOver: refusing further acquires and releases
	// and acknowledging), possibly before Dial has returned; it must not
	// block. nil: notices are only acted on.
	OnNotice func(c *Conn, n wire.Msg)
	// OnLost, when set, hears every lost event (wire.TypeLost, version 6:
	// the leader committed the expiry of a holding, named by its token).
	// It runs on the connection's reader goroutine and must not block.
	// nil: lost events are dropped.
	OnLost func(c *Conn, ev wire.Msg)
	// MaxVersion is the newest protocol version to offer: lower to play
	// an older client (tests, the lab, a broker with sessions off), up to
	// wire.NewestProtocolVersion. Zero: wire.ProtocolVersion.
	MaxVersion uint16
}

// Conn is one client connection. Safe for concurrent use: many goroutines may
// have requests in flight at once; replies may arrive in any order.
type Conn struct {
	nc   net.Conn // requests and replies: the TCP conn or TLS over it
	raw  net.Conn // the TCP conn: closing it never blocks
	peer wire.Peer

	// wmu guards the write side: id assignment, the combining buffer and
	// closed. Ids are assigned under it so that buffer order is id order.
	wmu    sync.Mutex
	lastID uint64 // last id assigned
	wbuf   []byte // encoded requests not yet taken by the writer
	// wframes locates each request in wbuf, in id order, so that Abandon
	// can withdraw one that was never sent.
	wframes []frameRef
	closed  bool // no more appends once set

	// writtenUpTo is the highest id whose bytes were handed to a Write.
	writtenUpTo atomic.Uint64
	// lastWrite is when the writer last started a Write (Unix ns; the
	// connection's start before any): keepAlive pings once it is older
	// than the interval.
	lastWrite atomic.Int64

	kick chan struct{} // wakes the writer; capacity 1
	// kaKick wakes keepAlive when a session attaches, so that the
	// session's shorter interval applies at once; capacity 1.
	kaKick chan struct{}

	onNotice func(*Conn, wire.Msg)
	onLost   func(*Conn, wire.Msg)
	// handingOver: the node announced a hand-over (NoticeHandOver) and has
	// not said it serves again; Start refuses acquires and releases. Set
	// and cleared under wmu (so that no request is buffered behind the
	// acknowledgement), read without it by HandingOver.
	handingOver atomic.Bool

	// pmu guards pending. Lock order: wmu before pmu; neither is held while
	// calling out (OnNotice, a call's done) or writing the socket
	// (cluster/LOCKS.md, "cluster/client").
	pmu     sync.Mutex
	pending map[uint64]*Call
	// resume is the resume in progress on this connection (session.go),
	// from its y until its answer's K, E, M or U; guarded by pmu.
	resume *resumeState

	// sess is the session attached (or being attached) to this
	// connection, nil if none: set under wmu, read anywhere. While set,
	// request ids come from the session's counter.
	sess atomic.Pointer[Session]

	// served is set once the node sent c a frame it accepted after the
	// handshake: a reply, a Q, a notice or an event (Served).
	served atomic.Bool

	dead     chan struct{} // closed by shutdown
	deadOnce sync.Once
	deadErr  error // why the connection died; set before dead is closed
}

// Dial connects to addr and runs the handshake. Cancelling ctx, or
// HandshakeTimeout running out, aborts the dial and the handshake.
func Dial(ctx context.Context, addr string, cfg Config) (*Conn, error) {
	timeout := cfg.HandshakeTimeout
	if timeout <= 0 {
		timeout = DefaultHandshakeTimeout
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dial := cfg.Dialer
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	raw, err := dial(hctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", addr, err)
	}
	nc := raw
	deadline, _ := hctx.Deadline()
	if err := nc.SetDeadline(deadline); err != nil {
		nc.Close()
		return nil, fmt.Errorf("client: %s: %w", addr, err)
	}
	// A cancelled ctx must interrupt a handshake blocked in Read: a deadline
	// in the past does that without closing the socket under the handshake.
	stop := context.AfterFunc(hctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	var binding []byte
	if cfg.TLS != nil {
		tcfg := cfg.TLS
		if tcfg.ServerName == "" {
			tcfg = tcfg.Clone()
			tcfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(raw, tcfg)
		if err = tc.Handshake(); err == nil {
			nc = tc
			st := tc.ConnectionState()
			binding, err = st.ExportKeyingMaterial(wire.ExporterLabel, nil, wire.ChannelBindingLen)
		}
		if err != nil {
			err = fmt.Errorf("TLS: %w", err)
		}
	}
	var peer wire.Peer
	if err == nil {
		peer, err = wire.ClientHandshake(nc, wire.HandshakeConfig{
			Kind:           wire.KindClient,
			Secret:         cfg.Secret,
			NextSecret:     cfg.NextSecret,
			ClusterID:      cfg.ClusterID,
			Domain:         cfg.Domain,
			MaxVersion:     cfg.MaxVersion,
			ChannelBinding: binding,
		})
	}
	stopped := stop()
	switch {
	case err == nil && !stopped:
		// The AfterFunc may still be setting its deadline: do not race it.
		err = context.Cause(hctx)
	case err != nil && hctx.Err() != nil:
		err = fmt.Errorf("%w (%w)", context.Cause(hctx), err)
	case err != nil && errors.Is(err, os.ErrDeadlineExceeded):
		// The socket deadline (== hctx's) can fire just before hctx does.
		err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	case err == nil:
		err = nc.SetDeadline(time.Time{})
	}
	if err != nil {
		raw.Close()
		return nil, fmt.Errorf("client: handshake with %s: %w", addr, err)
	}
	c := newConn(nc, raw, peer, cfg.OnNotice)
	c.onLost = cfg.OnLost
	ka := cfg.KeepAlive
	if ka == 0 {
		ka = DefaultKeepAlive
	}
	go c.keepAlive(ka)
	return c, nil
}

// DefaultKeepAlive is Config.KeepAlive's default.
const DefaultKeepAlive = 30 * time.Second

// SessionKeepAliveDivisor: a connection that carries a session (attached
// or being attached) pings once nothing was written on it for the
// session's timeout / SessionKeepAliveDivisor (or Config.KeepAlive, if
// shorter). The leader closes a session connection from which nothing
// arrived for the session's timeout (docs/sessions.md, "Liveness"), so a
// quiet broker is heard from at least three times per timeout: two pings
// may be late or lost in a slow network before the third's absence costs
// the connection (ZooKeeper's choice too).
const SessionKeepAliveDivisor = 3

// keepAliveEvery is the silence after which c pings: base (<= 0: never)
// or, while c carries a session, at most the session's interval.
func (c *Conn) keepAliveEvery(base time.Duration) time.Duration {
	if s := c.sess.Load(); s != nil {
		every := s.timeout / SessionKeepAliveDivisor
		if base > 0 {
			every = min(every, base)
		}
		return every
	}
	return base
}

// keepAlive pings when nothing was written for a whole interval (base, or
// the session's: keepAliveEvery). The pong is matched like any reply and
// dropped.
func (c *Conn) keepAlive(base time.Duration) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	var due <-chan time.Time // nil: no interval (base < 0, no session)
	arm := func(d time.Duration) {
		t.Reset(d)
		due = t.C
	}
	if every := c.keepAliveEvery(base); every > 0 {
		arm(every)
	}
	defer t.Stop()
	for {
		select {
		case <-c.dead:
			return
		case <-c.kaKick:
			t.Stop() // Go >= 1.23: no stale value left in t.C
			due = nil
		case <-due:
			due = nil
		}
		every := c.keepAliveEvery(base)
		if every <= 0 {
			continue
		}
		idle := time.Since(time.Unix(0, c.lastWrite.Load()))
		if idle < every {
			arm(every - idle)
			continue
		}
		if _, err := c.Start(wire.Msg{Type: wire.TypePing}); err != nil {
			return
		}
		arm(every)
	}
}

// newConn starts the reader and writer of an authenticated connection.
func newConn(nc, raw net.Conn, peer wire.Peer, onNotice func(*Conn, wire.Msg)) *Conn {
	c := &Conn{
		nc:       nc,
		raw:      raw,
		peer:     peer,
		onNotice: onNotice,
		kick:     make(chan struct{}, 1),
		kaKick:   make(chan struct{}, 1),
		pending:  make(map[uint64]*Call),
		dead:     make(chan struct{}),
	}
	c.lastWrite.Store(time.Now().UnixNano())
	go c.readLoop()
	go c.writeLoop()
	return c
}

// Peer returns what the handshake learned about the node (its node id and
// the negotiated version).
func (c *Conn) Peer() wire.Peer { return c.peer }

// RemoteAddr is the node's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// LocalAddr is the local end of the connection.
func (c *Conn) LocalAddr() net.Addr { return c.nc.LocalAddr() }

// Do sends m (its ID is assigned by Conn; the caller leaves it 0) and waits
// for its reply. written reports whether any byte of the request reached the
// socket: if err != nil and written is true, the outcome is unknown.
// Cancelling ctx stops the wait (the request may still run on the server);
// the error then wraps ctx.Err().
//
// A reply is returned as is, TypeError included, with err == nil: err is set
// only when no reply was matched, which is exactly when the outcome may be
// unknown.
func (c *Conn) Do(ctx context.Context, m wire.Msg) (reply wire.Msg, written bool, err error) {
	call, err := c.Start(m)
	if err != nil {
		return wire.Msg{}, false, err
	}
	select {
	case <-call.done:
		return call.Reply, call.Written, call.Err
	case <-ctx.Done():
		written := c.Abandon(call)
		return wire.Msg{}, written, fmt.Errorf("client: waiting for reply to %d: %w", call.ID, ctx.Err())
	}
}

// Abandon gives up on call without closing the connection and reports
// whether its request was written. A request still in the send buffer is
// withdrawn (never sent: false, and Done is closed with an error wrapping
// ErrAbandoned, its Done hook running on the caller's goroutine); a written one stays pending and its reply is dropped when
// it arrives (true: its outcome is unknown to the caller). Abandoning a
// completed call just returns its Written.
func (c *Conn) Abandon(call *Call) (written bool) {
	if call.adopted.Load() {
		return true // written on a connection of its session that died
	}
	c.wmu.Lock()
	if c.closed || call.ID <= c.writtenUpTo.Load() {
		c.wmu.Unlock()
		// Closed: writtenUpTo is final. Otherwise it was already taken
		// by the writer. Either way no later Write can include it.
		return c.isWritten(call.ID)
	}
	// Still in wbuf: the writer has not seen it, cut it out.
	for i, f := range c.wframes {
		if f.id != call.ID {
			continue
		}
		end := len(c.wbuf)
		if i+1 < len(c.wframes) {
			end = c.wframes[i+1].off
		}
		size := end - f.off
		c.wbuf = append(c.wbuf[:f.off], c.wbuf[end:]...)
		for j := i + 1; j < len(c.wframes); j++ {
			c.wframes[j].off -= size
		}
		c.wframes = append(c.wframes[:i], c.wframes[i+1:]...)
		break
	}
	c.pmu.Lock()
	delete(c.pending, call.ID)
	c.pmu.Unlock()
	c.wmu.Unlock()
	call.Err = fmt.Errorf("request %d: %w", call.ID, ErrAbandoned)
	call.complete()
	return false
}

// complete closes the call's done channel and runs its Done hook. Its
// fields are set; no lock is held.
func (call *Call) complete() {
	close(call.done)
	if call.hooks.Done != nil {
		call.hooks.Done(call)
	}
}

// Written reports whether any byte of call's request may have reached the
// socket yet. Unlike Abandon it changes nothing, so a caller can keep
// watching for the reply (to compensate a late grant, say).
func (c *Conn) Written(call *Call) bool { return call.adopted.Load() || c.isWritten(call.ID) }

// Call is one request in flight.
type Call struct {
	// ID is the request id Conn assigned (usable as a TypeCancel target).
	ID uint64
	// Done is closed when Reply/Err are set.
	Done <-chan struct{}
	// Reply is the matched reply (valid after Done, when Err is nil).
	Reply wire.Msg
	// Err is set if the connection died before the reply arrived.
	Err error
	// Written reports whether any byte of the request reached the socket.
	Written bool
	// Queued reports that the node said the acquire joined its key's queue
	// (a Q frame, protocol version 4): it waits for its turn and no longer
	// counts against the node's in-flight limit. Its final reply is still
	// to come. Read it in a hook or after Done.
	Queued bool

	done    chan struct{}
	reqType byte
	hooks   Hooks
	// adopted: a session holds the call (written on a session connection
	// that died without its final reply); it counts as written wherever
	// it is registered next (session.go).
	adopted atomic.Bool
	// claimed: an adopted call is completed by whoever claims it first:
	// the reader of the connection it is registered on, or the session
	// giving up (Session.end) while that reader may be delivering it.
	claimed atomic.Bool
}

// Hooks are the callbacks of a call started with StartFunc, so that a
// caller can follow many calls without a goroutine per call. They must not
// block and must not wait for another call of the same connection: they
// run on the connection's reader goroutine (or, for Done, on the goroutine
// that closed the connection or abandoned the call), with none of the
// connection's locks held. Each may be nil.
type Hooks struct {
	// Queued runs once when the node reports that the acquire joined its
	// key's queue (Q, version 4), before its final reply. It may run while
	// Done runs on another goroutine, when the connection is being closed
	// at that moment: a caller must treat a Queued after Done as nothing.
	Queued func(*Call)
	// Position runs for each place in line the node tells the queued
	// acquire (an R frame, version 12: pos carries the key, Position and
	// EstimateMs), any number of times before its final reply, on the
	// reader goroutine like Queued (and like Queued, one that runs while
	// Done runs elsewhere, at the connection's close, is to be ignored).
	// nil: positions are dropped.
	Position func(c *Call, pos wire.Msg)
	// Done runs once, right after the call completed (Reply or Err set and
	// the Done channel closed): on its reply, on the death of the
	// connection, or on Abandon withdrawing it.
	Done func(*Call)
}

// Start sends m without waiting (m.ID must be 0; Conn assigns it). The
// request is queued for the writer goroutine; Start never blocks on the
// socket. Errors wrap ErrInvalidRequest (nothing queued),
// wire.ErrNotSupported (a block acquire on a connection that negotiated a
// version older than wire.VersionBlocks; nothing queued), ErrHandingOver
// (an acquire or release after the node announced a hand-over; nothing
// queued) or ErrConnClosed.
func (c *Conn) Start(m wire.Msg) (*Call, error) { return c.StartFunc(m, Hooks{}) }

// StartFunc is Start with hooks that run when the call is queued and when
// it completes (see Hooks), so that a caller needs no goroutine to wait for
// each call. When it returns an error, no hook ever runs.
func (c *Conn) StartFunc(m wire.Msg, h Hooks) (*Call, error) {
	if m.ID != 0 {
		return nil, fmt.Errorf("%w: ID must be 0, Conn assigns it", ErrInvalidRequest)
	}
	if !wire.IsRequest(m.Type) || m.Type == wire.TypeNoticeAck {
		return nil, fmt.Errorf("%w: %s is not a request type", ErrInvalidRequest, wire.TypeName(m.Type))
	}
	if !wire.RequestAllowed(m.Type, c.peer.Version) {
		need := uint16(wire.VersionBlocks)
		switch m.Type {
		case wire.TypeExtend:
			need = wire.VersionExtend
		case wire.TypeAcquirePermit, wire.TypeSetPermits:
			need = wire.VersionSemaphores
		case wire.TypeWatchPositions:
			need = wire.VersionPositions
		}
		return nil, fmt.Errorf("%w: %s needs protocol version %d; %s speaks %d", wire.ErrNotSupported, wire.TypeName(m.Type),
			need, c.peer.NodeID, c.peer.Version)
	}
	if m.Label != "" && c.peer.Version < wire.VersionLabels {
		// Not sent without it: the caller asked for a name that inspect
		// would not show (the leader would refuse it the same way).
		return nil, fmt.Errorf("%w: a label needs protocol version %d; %s speaks %d", wire.ErrNotSupported,
			wire.VersionLabels, c.peer.NodeID, c.peer.Version)
	}
	c.wmu.Lock()
	if c.closed {
		c.wmu.Unlock()
		return nil, c.closedErr()
	}
	if c.handingOver.Load() && (isSessionLock(m.Type) || m.Type == wire.TypeSetPermits) {
		c.wmu.Unlock()
		return nil, fmt.Errorf("%w (%s): %s not sent", ErrHandingOver, c.peer.NodeID, wire.TypeName(m.Type))
	}
	if m.Type == wire.TypeOpenSession || m.Type == wire.TypeResume {
		c.wmu.Unlock()
		return nil, fmt.Errorf("%w: %s is sent by Session.Open and Resume", ErrInvalidRequest, wire.TypeName(m.Type))
	}
	if s := c.sess.Load(); s != nil && isSessionLock(m.Type) && !s.attachedTo(c) {
		// Nothing new of the session is written before the open or
		// resume is answered (docs/sessions.md, "The broker").
		c.wmu.Unlock()
		return nil, fmt.Errorf("%w: session %x is not attached to %s yet: %s not sent", ErrSessionNotAttached, s.id, c.peer.NodeID,
			wire.TypeName(m.Type))
	}
	call, err := c.startLocked(m, h)
	c.wmu.Unlock()
	if err != nil {
		return nil, err
	}
	c.wake()
	return call, nil
}

// startLocked buffers m under a new id. Requires wmu, !closed.
func (c *Conn) startLocked(m wire.Msg, h Hooks) (*Call, error) {
	done := make(chan struct{})
	call := &Call{Done: done, done: done, reqType: m.Type, hooks: h}
	if s := c.sess.Load(); s != nil {
		m.ID = s.nextID(c.lastID)
	} else {
		m.ID = c.lastID + 1
	}
	buf, err := wire.AppendMsg(c.wbuf, &m)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	c.wframes = append(c.wframes, frameRef{id: m.ID, off: len(c.wbuf)})
	c.wbuf = buf
	c.lastID = m.ID
	call.ID = m.ID
	// Registered before the writer can take the bytes, so the reply can
	// never arrive for an id the reader does not know.
	c.pmu.Lock()
	c.pending[call.ID] = call
	c.pmu.Unlock()
	return call, nil
}

func (c *Conn) wake() {
	select {
	case c.kick <- struct{}{}:
	default: // the writer is already due to run
	}
}

// HandingOver reports whether the node announced a hand-over of its
// leadership (and has not said since that it serves again): acquires and
// releases are refused with ErrHandingOver.
func (c *Conn) HandingOver() bool { return c.handingOver.Load() }

// notice handles an unsolicited notice from the node.
func (c *Conn) notice(n wire.Msg) {
	if c.onNotice != nil {
		c.onNotice(c, n)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed {
		return
	}
	switch n.Event {
	case wire.NoticeHandOver:
		// Refuse what comes next, then acknowledge behind everything
		// already buffered: the node knows that whatever it reads after
		// the acknowledgement was not sent by this connection.
		c.handingOver.Store(true)
		if _, err := c.startLocked(wire.Msg{Type: wire.TypeNoticeAck}, Hooks{}); err == nil {
			c.wake()
		}
	case wire.NoticeServing:
		c.handingOver.Store(false)
	}
}

// Close closes the connection; calls waiting in Do return an error wrapping
// ErrConnClosed. Close is idempotent.
func (c *Conn) Close() error {
	c.shutdown(ErrConnClosed)
	return nil
}

// Done is closed when the connection is dead (closed by either side).
func (c *Conn) Done() <-chan struct{} { return c.dead }

// Err returns why the connection died (wrapping ErrConnClosed), or nil while
// it is alive.
func (c *Conn) Err() error {
	select {
	case <-c.dead:
		return c.deadErr
	default:
		return nil
	}
}

// Served reports whether the node has sent anything on c since the
// handshake that c accepted: a reply, a Q, a notice or an event. A
// connection-level E (the node closing the connection) and a frame that
// broke the protocol do not count. The broker's reconnect backoff uses it
// to tell a connection that served from one a node accepted and dropped.
func (c *Conn) Served() bool { return c.served.Load() }

// markServed sets served; the load first keeps the reader's hot path to a
// plain read once it is set (a store is a locked instruction on amd64).
func (c *Conn) markServed() {
	if !c.served.Load() {
		c.served.Store(true)
	}
}

// InFlight returns how many calls await a reply (cancelled Do calls
// included, until their reply comes).
func (c *Conn) InFlight() int {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return len(c.pending)
}

func (c *Conn) isWritten(id uint64) bool { return id <= c.writtenUpTo.Load() }

func (c *Conn) closedErr() error {
	<-c.dead // closed is set inside shutdown just before dead is closed
	return c.deadErr
}

// writeLoop sends whatever callers buffered, in one Write per wake-up. It
// owns two buffers and swaps them, so appends continue while it writes.
func (c *Conn) writeLoop() {
	var spare []byte
	for {
		select {
		case <-c.kick:
		case <-c.dead:
			return
		}
		// Let the goroutines already runnable (a sidecar's sessions,
		// each with a request read) add theirs first: one TLS record and
		// one write then carry them all, instead of a write for the first
		// and another for the rest. Measured at 256 clients: about ten
		// requests per write instead of one or two, and a tenth less CPU
		// per cycle in the sidecar and the leader. With nothing else
		// runnable it returns at once.
		runtime.Gosched()
		c.wmu.Lock()
		if c.closed {
			c.wmu.Unlock()
			return
		}
		out := c.wbuf
		c.wbuf = spare[:0]
		c.wframes = c.wframes[:0]
		// Recorded before the Write, under wmu, so that shutdown (which sets
		// closed under wmu) reads the final value: conservative "written".
		c.writtenUpTo.Store(c.lastID)
		c.wmu.Unlock()
		if len(out) == 0 {
			spare = out
			continue
		}
		c.lastWrite.Store(time.Now().UnixNano())
		if _, err := c.nc.Write(out); err != nil {
			c.shutdown(fmt.Errorf("writing: %w", err))
			return
		}
		if cap(out) > 1<<20 {
			out = nil // a burst grew it; do not keep a megabyte per idle conn
		}
		spare = out
	}
}

// readLoop matches replies to calls until the connection dies.
func (c *Conn) readLoop() {
	r := wire.NewReader(c.nc)
	var m wire.Msg
	for {
		if err := r.ReadMsg(&m); err != nil {
			if errors.Is(err, wire.ErrMalformed) || errors.Is(err, wire.ErrUnknownType) ||
				errors.Is(err, wire.ErrUnexpectedFrame) || errors.Is(err, wire.ErrFrameTooLarge) {
				err = fmt.Errorf("%w: %w", ErrProtocol, err)
			} else {
				err = fmt.Errorf("reading: %w", err)
			}
			c.shutdown(err)
			return
		}
		if wire.IsNotice(m.Type) {
			if c.peer.Version < wire.VersionNotices {
				c.shutdown(fmt.Errorf("%w: notice on a version %d connection", ErrProtocol, c.peer.Version))
				return
			}
			c.markServed()
			c.notice(m)
			continue
		}
		if m.Type == wire.TypeOutcomes {
			s := c.sess.Load()
			switch {
			case c.peer.Version < wire.VersionSessions:
				c.shutdown(fmt.Errorf("%w: outcomes event on a version %d connection", ErrProtocol, c.peer.Version))
				return
			case s == nil:
				c.shutdown(fmt.Errorf("%w: outcomes event for session %x on a connection without a session", ErrProtocol, m.Session))
				return
			case m.Session != s.id:
				c.shutdown(fmt.Errorf("%w: outcomes event for session %x on the connection of session %x", ErrProtocol, m.Session, s.id))
				return
			}
			c.markServed()
			s.outcomes(c, m.Serial)
			continue
		}
		if wire.IsEvent(m.Type) {
			if c.peer.Version < wire.VersionExtend {
				c.shutdown(fmt.Errorf("%w: lost event on a version %d connection", ErrProtocol, c.peer.Version))
				return
			}
			c.markServed()
			if c.onLost != nil {
				c.onLost(c, m)
			}
			continue
		}
		if m.Type == wire.TypeError && m.ID == 0 {
			// The server's connection-level error: it closes after it.
			c.shutdown(fmt.Errorf("%w: server error %s: %w: %q", ErrProtocol, m.Code, wire.ErrOf(m.Code), m.Text))
			return
		}
		if m.Type == wire.TypePosition {
			if err := c.position(&m); err != nil {
				c.shutdown(err)
				return
			}
			c.markServed()
			continue
		}
		if m.Type == wire.TypeQueued {
			if err := c.queued(m.ID); err != nil {
				c.shutdown(err)
				return
			}
			c.markServed()
			continue
		}
		if !wire.IsReply(m.Type) {
			c.shutdown(fmt.Errorf("%w: request frame %s from server", ErrProtocol, wire.TypeName(m.Type)))
			return
		}
		c.pmu.Lock()
		call := c.pending[m.ID]
		// U to a lock request of a session: the node lost leadership
		// and cannot know the outcome, but the replicated state does.
		// The call stays pending, so that the connection's end below
		// hands it to the session, whose resume where a leader serves
		// answers it: no Indeterminate.
		unknown := call != nil && m.Type == wire.TypeUnknown && isSessionLock(call.reqType) && c.sess.Load() != nil
		if call != nil && wire.ReplyAllowed(call.reqType, m.Type) && !unknown {
			delete(c.pending, m.ID)
		}
		repeated := false
		if rs := c.resume; rs != nil {
			if call != nil && rs.regs[m.ID] == call {
				delete(rs.regs, m.ID)
				rs.counts.Outcomes++
			} else if call == nil && m.ID <= rs.high {
				// An outcome the session had already received (its ack
				// lagged behind its replies when its connection died).
				rs.counts.Repeated++
				repeated = true
			}
		}
		c.pmu.Unlock()
		if repeated {
			c.markServed()
			continue
		}
		if unknown {
			c.markServed() // a reply all the same: the node answered
			c.shutdown(fmt.Errorf("%w: request %d of session %x answered U (%s): resume where a leader serves", ErrSessionUnknown,
				m.ID, c.sess.Load().id, m.Text))
			return
		}
		if call == nil {
			c.shutdown(fmt.Errorf("%w: reply %s to unknown id %d", ErrProtocol, wire.TypeName(m.Type), m.ID))
			return
		}
		if !wire.ReplyAllowed(call.reqType, m.Type) {
			c.shutdown(fmt.Errorf("%w: reply %s cannot answer request %s (id %d)", ErrProtocol, wire.TypeName(m.Type), wire.TypeName(call.reqType), m.ID))
			return
		}
		c.markServed()
		if call.adopted.Load() {
			if !call.claimed.CompareAndSwap(false, true) {
				continue // the session gave up on it meanwhile (Session.end)
			}
			c.sess.Load().settled(call.ID)
		}
		call.Reply = m
		call.Written = true
		if call.reqType == wire.TypeOpenSession || call.reqType == wire.TypeResume {
			c.sessionReply(call, m)
		}
		call.complete()
	}
}

// queued handles a Q frame: the acquire id joined its key's queue. Only
// one Q per acquire in flight, on a version 4 connection; anything else is
// a protocol violation.
func (c *Conn) queued(id uint64) error {
	if c.peer.Version < wire.VersionQueued {
		return fmt.Errorf("%w: Q frame on a version %d connection", ErrProtocol, c.peer.Version)
	}
	c.pmu.Lock()
	call := c.pending[id]
	again := false // a Q in a resume's answer for a held acquire
	if rs := c.resume; rs != nil && call != nil && rs.regs[id] == call {
		delete(rs.regs, id)
		rs.counts.Queued++
		again = call.Queued
	}
	ok := call != nil && wire.ProgressAllowed(call.reqType, wire.TypeQueued, c.peer.Version) && (!call.Queued || again)
	if ok {
		call.Queued = true // under pmu: shutdown, which completes it, reads pending under pmu
	}
	c.pmu.Unlock()
	if again && ok {
		return nil // its Queued hook ran when it was first queued
	}
	switch {
	case call == nil:
		return fmt.Errorf("%w: Q for unknown id %d", ErrProtocol, id)
	case !wire.ProgressAllowed(call.reqType, wire.TypeQueued, c.peer.Version):
		return fmt.Errorf("%w: Q for request %s (id %d), not an acquire", ErrProtocol, wire.TypeName(call.reqType), id)
	case !ok:
		return fmt.Errorf("%w: a second Q for acquire %d", ErrProtocol, id)
	}
	if call.hooks.Queued != nil {
		call.hooks.Queued(call)
	}
	return nil
}

// WatchPositions asks the node for places in line on this connection
// (the request w, version 12): from its K on, the leader tells this
// connection's queued acquires their places (R frames, to each call's
// Hooks.Position), every one of them at the next walk of its line. It
// returns the request's call without waiting for the K. On a connection
// older than wire.VersionPositions it sends nothing and returns
// wire.ErrNotSupported: an older node would take w for an unknown frame
// and close the connection.
func (c *Conn) WatchPositions() (*Call, error) {
	return c.Start(wire.Msg{Type: wire.TypeWatchPositions})
}

// position hands a place in line (R) to its call's Position hook. An R
// for an id not in flight, for anything but an acquire, or on a
// connection older than version 12 is a protocol violation (rule 4).
func (c *Conn) position(m *wire.Msg) error {
	if c.peer.Version < wire.VersionPositions {
		return fmt.Errorf("%w: R frame on a version %d connection", ErrProtocol, c.peer.Version)
	}
	c.pmu.Lock()
	call := c.pending[m.ID]
	c.pmu.Unlock()
	switch {
	case call == nil:
		return fmt.Errorf("%w: R for unknown id %d", ErrProtocol, m.ID)
	case !wire.ProgressAllowed(call.reqType, wire.TypePosition, c.peer.Version):
		return fmt.Errorf("%w: R for request %s (id %d), not an acquire", ErrProtocol, wire.TypeName(call.reqType), m.ID)
	}
	if call.hooks.Position != nil {
		call.hooks.Position(call, *m)
	}
	return nil
}

// shutdown kills the connection once: it stops new requests, closes the
// socket (which ends the reader and unblocks the writer) and fails every
// pending call with cause, recording whether each was written.
func (c *Conn) shutdown(cause error) {
	c.deadOnce.Do(func() {
		err := ErrConnClosed
		if cause != ErrConnClosed {
			err = fmt.Errorf("%w: %w", ErrConnClosed, cause)
		}
		c.wmu.Lock()
		c.closed = true
		c.wbuf, c.wframes = nil, nil
		c.wmu.Unlock()
		// From here writtenUpTo is final: the writer stores it only under
		// wmu while !closed.
		c.raw.Close()

		c.pmu.Lock()
		pending := c.pending
		c.pending = nil
		c.resume = nil
		c.pmu.Unlock()

		if s := c.sess.Load(); s != nil {
			// The session keeps its written lock requests for a resume:
			// their outcome is in the replicated state, not lost.
			var held []*Call
			for id, call := range pending {
				if isSessionLock(call.reqType) && (call.adopted.Load() || c.isWritten(id)) {
					held = append(held, call)
					delete(pending, id)
				}
			}
			s.detached(c, held, c.writtenUpTo.Load(), err)
		}
		c.deadErr = err
		close(c.dead)
		for id, call := range pending {
			call.Err = fmt.Errorf("request %d: %w", id, err)
			call.Written = c.isWritten(id)
			call.complete()
		}
	})
}
