package cluster

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// clientConn is one authenticated client connection. Replies are encoded
// into out by whoever owes them (the leader core's outputs, performed by
// the reader, the FSM goroutine or the timers) without blocking, and
// written by the connection's writer goroutine. What the leader knows of
// the connection (its requests in flight, whether it died, its protocol
// version, a hand-over notice it owes an acknowledgement for) is the
// core's, which knows it by this pointer.
type clientConn struct {
	n      *Node
	c      net.Conn // the TCP connection: closing it stops everything
	remote string
	// rw is what requests and replies travel on: c, or the TLS session
	// over it. Set by serveConn before the writer starts.
	rw net.Conn

	// mu guards out and closed. Lock order: Node.mu before clientConn.mu.
	mu       sync.Mutex
	out      []byte
	closed   bool
	draining bool // close once out is written
	writing  bool // writeLoop runs
	wake     chan struct{}

	// sink, when set, takes every message for this connection instead
	// of a socket: an in-process caller's (the admin port's revoke),
	// called with Node.mu held, so it must not block. Such a connection
	// has no c, rw or writer.
	sink func(*wire.Msg)

	// idleMu guards idle and readFrom, and orders the read deadlines set
	// from them (by the reader before each read, by bound when a session
	// attaches). A leaf lock.
	idleMu sync.Mutex
	// idle: the connection is closed once nothing arrived on it for this
	// long: the node's IdleTimeout, or, once a session is attached to it,
	// the session's timeout if shorter (Ready.Silences).
	idle time.Duration
	// readFrom: when the read in progress (or the last one) started.
	readFrom time.Time
}

func (n *Node) acceptClients() {
	defer n.wg.Done()
	for {
		c, err := n.clientLn.Accept()
		if err != nil {
			select {
			case <-n.closing:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			n.log.Error("client listener failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		cc := &clientConn{n: n, c: c, rw: c, remote: c.RemoteAddr().String(), wake: make(chan struct{}, 1), idle: n.cfg.IdleTimeout}
		n.mu.Lock()
		full := len(n.conns) >= n.cfg.MaxClientConns
		closed := n.closed
		if !full && !closed {
			n.conns[cc] = struct{}{}
		}
		n.mu.Unlock()
		if full || closed {
			if full {
				n.stats.connLimitRefusals.Add(1)
				n.log.Warn("refusing client connection: limit reached", "remote", cc.remote, "max", n.cfg.MaxClientConns)
				// Plaintext: the client has not started TLS, and the
				// refusal must not cost a TLS handshake.
				if n.cfg.ClientTLS == nil {
					writeConnError(c, fmt.Errorf("%w: this node serves at most %d", wire.ErrTooManyConns, n.cfg.MaxClientConns))
				}
			}
			c.Close()
			continue
		}
		n.wg.Add(1)
		go n.serveConn(cc)
	}
}

func (n *Node) serveConn(cc *clientConn) {
	defer n.wg.Done()
	defer n.connGone(cc)
	version, ok := n.admitClient(cc)
	if !ok {
		return
	}
	n.mu.Lock()
	n.core.Open(cc, version) // connected during a hand-over: told too
	n.performLocked()
	n.mu.Unlock()
	cc.mu.Lock()
	cc.writing = true
	cc.mu.Unlock()
	go cc.writeLoop()
	r := wire.NewReader(idleReader{cc})
	var m wire.Msg
	for {
		if err := r.ReadMsg(&m); err != nil {
			if wire.IsFieldError(err) && m.ID != 0 {
				// Well framed, one bad field: a definite error for that
				// request only; the others in flight stay unaffected.
				n.metrics.reply(opOf(m.Type), resError)
				cc.send(errReply(m.ID, err))
				continue
			}
			if isTimeout(err) {
				idle := cc.idleBound()
				n.stats.idleCloses.Add(1)
				if idle < n.cfg.IdleTimeout {
					// Its session's bound: the broker pings at a third of
					// it, so its host or the network is likely gone; the
					// close detaches the session, whose timeout now runs.
					n.log.Warn("closing silent session connection", "remote", cc.remote, "idle", idle)
				} else {
					n.log.Info("closing idle client connection", "remote", cc.remote, "idle", idle)
				}
				cc.send(&wire.Msg{Type: wire.TypeError, Code: wire.CodeIdleTimeout,
					Text: fmt.Sprintf("nothing received for %v; send pings to keep a connection open", idle)})
				cc.flushAndClose()
				return
			}
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isClosedConn(err) {
				return
			}
			n.stats.protocolErrorCloses.Add(1)
			n.log.Info("closing client connection after a protocol error", "remote", cc.remote, "err", err)
			cc.send(&wire.Msg{Type: wire.TypeError, Code: wire.CodeOf(err), Text: err.Error()})
			cc.flushAndClose()
			return
		}
		if !n.handle(cc, &m) {
			n.stats.protocolErrorCloses.Add(1)
			cc.flushAndClose()
			return
		}
	}
}

// awaitDomain waits, until shortly before deadline, for this node to know
// its cluster's fencing domain: a client is told the domain in the
// handshake and holds on to it (a sidecar pins it, and its fence helpers
// write under it), so a node that has not applied it yet (starting, or
// behind its leader) must not answer "" and let the client go on without
// one. A sidecar that reached a cluster as it started never learned its
// domain, and one pinned to another domain was served all the same
// (attack round of issue 41). The client sees a handshake timeout and
// dials again after its backoff.
func (n *Node) awaitDomain(deadline time.Time) error {
	select {
	case <-n.fsm.domainSet():
		return nil
	default:
	}
	t := time.NewTimer(max(0, time.Until(deadline)-domainWaitMargin))
	defer t.Stop()
	select {
	case <-n.fsm.domainSet():
		return nil
	case <-t.C:
	case <-n.closing:
	}
	return fmt.Errorf("%w: %w: not bootstrapped, still applying its log, or its cluster's first leader has not created one yet",
		wire.ErrHandshakeTimeout, errNoDomainYet)
}

// errNoDomainYet: a client handshake gave up waiting for the node's
// fencing domain. It says nothing of the client: not an authentication
// failure for the per-IP gate.
var errNoDomainYet = errors.New("cluster: this node does not know its cluster's fencing domain yet")

// domainWaitMargin is what awaitDomain leaves of the handshake's time to
// tell the client why it gives up.
const domainWaitMargin = 500 * time.Millisecond

// admitClient runs a new connection's admission (see admission.go): the
// per-IP gate, TLS when configured, and the authentication handshake, and
// returns the negotiated protocol version. On failure it holds the
// connection for the failure delay and returns false (the caller closes
// it).
func (n *Node) admitClient(cc *clientConn) (uint16, bool) {
	ip := ipOf(cc.remote)
	if !n.clientGate.enter(ip) {
		n.stats.gateRefusals.Add(1)
		return 0, false
	}
	deadline := time.Now().Add(n.cfg.HandshakeTimeout)
	_ = cc.c.SetDeadline(deadline)
	rw, binding, err := secureAccept(cc.c, n.cfg.ClientTLS)
	var peer wire.Peer
	if err == nil {
		err = n.awaitDomain(deadline)
		if err != nil {
			writeConnError(rw, err)
		}
	}
	if err == nil {
		peer, err = wire.ServerHandshake(rw, wire.HandshakeConfig{
			Kind:           wire.KindClient,
			Secret:         n.cfg.ClientSecret,
			NextSecret:     n.cfg.NextClientSecret,
			ClusterID:      n.cfg.ClusterID,
			Domain:         n.fsm.getDomain(),
			NodeID:         n.serverID,
			ChannelBinding: binding,
			MaxInFlight:    toldLimit(n.cfg.MaxInFlightPerConn),
			MaxWaiters:     toldLimit(n.cfg.MaxWaitersPerConn),
			MaxVersion:     n.cfg.ProtocolVersion,
		})
		if err != nil && isTimeout(err) {
			writeConnError(rw, fmt.Errorf("%w after %v", wire.ErrHandshakeTimeout, n.cfg.HandshakeTimeout))
		}
	}
	if errors.Is(err, errNoDomainYet) {
		n.clientGate.leave(ip, false)
		n.log.Debug("client admission deferred", "remote", cc.remote, "err", err)
		return 0, false
	}
	delay, failures := n.clientGate.leave(ip, err != nil)
	if err != nil {
		n.stats.clientAuthFailures.Add(1)
		if logFailure(failures) {
			n.log.Warn("client admission refused", "remote", cc.remote, "recent_failures_from_ip", failures, "err", err)
		}
		n.hold(delay)
		return 0, false
	}
	_ = cc.c.SetDeadline(time.Time{})
	cc.mu.Lock()
	cc.rw = rw
	cc.mu.Unlock()
	return peer.Version, true
}

// toldLimit is a limit as the Welcome tells it: a u32, so a larger one
// (no client could reach it) is told as the largest u32.
func toldLimit(v int) int { return int(min(uint64(v), math.MaxUint32)) }

// hold sleeps for d, or until the node closes.
func (n *Node) hold(d time.Duration) { holdFor(d, n.closing) }

// holdFor sleeps for d, or until closing is closed.
func holdFor(d time.Duration, closing <-chan struct{}) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-closing:
	}
}

// idleReader sets the read deadline before every read from the socket, so
// a connection that sends nothing for its idle bound (including one that
// stops in the middle of a frame) gets a timeout.
type idleReader struct{ cc *clientConn }

func (r idleReader) Read(p []byte) (int, error) {
	cc := r.cc
	cc.idleMu.Lock()
	cc.readFrom = time.Now()
	_ = cc.rw.SetReadDeadline(cc.readFrom.Add(cc.idle))
	cc.idleMu.Unlock()
	return cc.rw.Read(p)
}

// idleBound is the connection's idle bound now.
func (cc *clientConn) idleBound() time.Duration {
	cc.idleMu.Lock()
	defer cc.idleMu.Unlock()
	return cc.idle
}

// bound lowers the connection's idle bound to d (a session attached to it
// with timeout d; a bound above the node's IdleTimeout changes nothing),
// moving the deadline of the read in progress too.
func (cc *clientConn) bound(d time.Duration) {
	cc.idleMu.Lock()
	defer cc.idleMu.Unlock()
	if d <= 0 || d >= cc.idle {
		return
	}
	cc.idle = d
	if !cc.readFrom.IsZero() {
		_ = cc.rw.SetReadDeadline(cc.readFrom.Add(d))
	}
}

func isClosedConn(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// connGone runs when the reader stops: the core cancels the connection's
// queued acquires and releases grants that arrive for it later (and a
// hand-over need not wait for its acknowledgement any more).
func (n *Node) connGone(cc *clientConn) {
	n.mu.Lock()
	delete(n.conns, cc)
	n.core.Closed(time.Now(), cc)
	n.performLocked()
	n.mu.Unlock()
	// Whatever is queued (a final error reply, typically) still goes out.
	cc.flushAndClose()
}

// handle serves one request; false means close the connection.
func (n *Node) handle(cc *clientConn, m *wire.Msg) bool {
	switch m.Type {
	case wire.TypePing:
		cc.send(&wire.Msg{Type: wire.TypePong, ID: m.ID})
		return true
	case wire.TypeStatus:
		st := n.status()
		st.ID = m.ID
		cc.send(&st)
		return true
	case wire.TypeMembers:
		ms := n.membersReply()
		ms.ID = m.ID
		cc.send(&ms)
		return true
	}
	// Lock requests and notice acknowledgements are the leader core's (it
	// answers any other frame E unexpected_frame, and the connection
	// closes).
	now := time.Now()
	n.mu.Lock()
	keep := n.core.Request(now, cc, m)
	n.performLocked()
	n.mu.Unlock()
	return keep
}

// opOf is the lock operation of a request frame type (0 for the others).
func opOf(typ byte) locksm.Op {
	switch typ {
	case wire.TypeAcquire:
		return locksm.OpAcquire
	case wire.TypeAcquireBlock:
		return locksm.OpAcquireBlock
	case wire.TypeRelease:
		return locksm.OpRelease
	case wire.TypeExtend:
		return locksm.OpExtend
	}
	return 0
}

func errReply(id uint64, err error) *wire.Msg {
	return &wire.Msg{Type: wire.TypeError, ID: id, Code: wire.CodeOf(err), Text: err.Error()}
}

// send encodes m for the writer. Never blocks; a message that cannot be
// encoded is a bug, logged and dropped.
func (cc *clientConn) send(m *wire.Msg) {
	if cc.sink != nil {
		cc.sink(m)
		return
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.closed || cc.draining {
		return
	}
	out, err := wire.AppendMsg(cc.out, m)
	if err != nil {
		cc.n.log.Error("cannot encode reply", "type", string(rune(m.Type)), "err", err)
		return
	}
	cc.out = out
	if len(cc.out) > cc.n.cfg.MaxReplyBacklog {
		// The client does not read its replies: cut it off rather than
		// buffer without bound. Its locks are handled like any dead
		// connection's (queued acquires cancelled, late grants released).
		cc.n.stats.slowConsumerCloses.Add(1)
		cc.n.log.Warn("closing client connection: it does not read its replies", "remote", cc.remote,
			"backlog_bytes", len(cc.out), "max", cc.n.cfg.MaxReplyBacklog)
		cc.out = nil
		cc.closeLocked()
		return
	}
	cc.wakeLocked()
}

func (cc *clientConn) wakeLocked() {
	select {
	case cc.wake <- struct{}{}:
	default:
	}
}

func (cc *clientConn) writeLoop() {
	var buf []byte
	for range cc.wake {
		cc.mu.Lock()
		buf, cc.out = cc.out, buf[:0]
		draining := cc.draining
		cc.mu.Unlock()
		if len(buf) > 0 {
			_ = cc.rw.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := cc.rw.Write(buf); err != nil {
				cc.close()
				return
			}
		}
		if draining {
			cc.mu.Lock()
			empty := len(cc.out) == 0
			cc.mu.Unlock()
			if empty {
				cc.close()
				return
			}
		}
	}
}

// flushAndClose lets the writer send what is queued (an error reply,
// typically), then closes; nothing sent after this call goes out.
func (cc *clientConn) flushAndClose() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.closed {
		return
	}
	cc.draining = true
	cc.wakeLocked()
	// A writer that never started (handshake failed) cannot drain.
	if !cc.writing {
		cc.closeLocked()
	}
}

func (cc *clientConn) close() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.closeLocked()
}

func (cc *clientConn) closeLocked() {
	if cc.closed {
		return
	}
	cc.closed = true
	if cc.sink != nil {
		return // no socket, no writer
	}
	cc.c.Close()
	close(cc.wake)
}
