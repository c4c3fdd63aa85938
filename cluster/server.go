package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// clientConn is one authenticated client connection. Replies are encoded
// into out by whoever owes them (FSM goroutine, reader, timers) without
// blocking, and written by the connection's writer goroutine.
type clientConn struct {
	n      *Node
	c      net.Conn // the TCP connection: closing it stops everything
	remote string
	// rw is what requests and replies travel on: c, or the TLS session
	// over it. Set by serveConn before the writer starts.
	rw net.Conn

	// Guarded by Node.mu.
	inflight map[uint64]*pending // by request id
	dead     bool                // reader stopped: later grants are compensated
	// version is the protocol version the handshake negotiated (0 until
	// then): notices go only to connections of VersionNotices or later.
	version uint16
	// ackPending: told of a hand-over, not acknowledged yet (handover.go).
	ackPending bool

	// mu guards out and closed. Lock order: Node.mu before clientConn.mu.
	mu       sync.Mutex
	out      []byte
	closed   bool
	draining bool // close once out is written
	writing  bool // writeLoop runs
	wake     chan struct{}
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
		cc := &clientConn{n: n, c: c, rw: c, remote: c.RemoteAddr().String(), inflight: map[uint64]*pending{}, wake: make(chan struct{}, 1)}
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
	cc.version = version
	if h := n.handover; h != nil && h.active && version >= wire.VersionNotices {
		// Connected during a hand-over: told like the others (its
		// acknowledgement is not waited for).
		cc.send(&wire.Msg{Type: wire.TypeNotice, Event: wire.NoticeHandOver, LeaderID: h.id, LeaderAddr: h.addr})
	}
	n.mu.Unlock()
	cc.mu.Lock()
	cc.writing = true
	cc.mu.Unlock()
	go cc.writeLoop()
	r := wire.NewReader(idleReader{cc.rw, n.cfg.IdleTimeout})
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
				n.stats.idleCloses.Add(1)
				n.log.Info("closing idle client connection", "remote", cc.remote, "idle", n.cfg.IdleTimeout)
				cc.send(&wire.Msg{Type: wire.TypeError, Code: wire.CodeIdleTimeout,
					Text: fmt.Sprintf("nothing received for %v; send pings to keep a connection open", n.cfg.IdleTimeout)})
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
	_ = cc.c.SetDeadline(time.Now().Add(n.cfg.HandshakeTimeout))
	rw, binding, err := secureAccept(cc.c, n.cfg.ClientTLS)
	var peer wire.Peer
	if err == nil {
		peer, err = wire.ServerHandshake(rw, wire.HandshakeConfig{
			Kind:           wire.KindClient,
			Secret:         n.cfg.ClientSecret,
			NextSecret:     n.cfg.NextClientSecret,
			ClusterID:      n.cfg.ClusterID,
			Domain:         n.fsm.getDomain(),
			NodeID:         n.serverID,
			ChannelBinding: binding,
		})
		if err != nil && isTimeout(err) {
			writeConnError(rw, fmt.Errorf("%w after %v", wire.ErrHandshakeTimeout, n.cfg.HandshakeTimeout))
		}
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
// a connection that sends nothing for d (including one that stops in the
// middle of a frame) gets a timeout.
type idleReader struct {
	c net.Conn
	d time.Duration
}

func (r idleReader) Read(p []byte) (int, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(r.d))
	return r.c.Read(p)
}

func isClosedConn(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// connGone runs when the reader stops: the connection's queued acquires are
// cancelled, and grants that arrive later are released (see granted).
func (n *Node) connGone(cc *clientConn) {
	n.mu.Lock()
	n.noticeAckedLocked(cc) // a hand-over need not wait for it any more
	cc.dead = true
	delete(n.conns, cc)
	for _, p := range cc.inflight {
		if p.op == locksm.OpAcquire && p.queued && !p.cancel {
			p.cancel = true
			n.propose(locksm.Command{Op: locksm.OpCancelWait, Key: p.key, Ref: p.ref})
		}
	}
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
	case wire.TypeNoticeAck:
		n.mu.Lock()
		n.noticeAckedLocked(cc)
		n.mu.Unlock()
		cc.send(&wire.Msg{Type: wire.TypeOK, ID: m.ID})
		return true
	case wire.TypeAcquire, wire.TypeRelease, wire.TypeCancel:
	default:
		cc.send(&wire.Msg{Type: wire.TypeError, Code: wire.CodeUnexpectedFrame, Text: "not a request frame"})
		return false
	}

	// Checks that need no state give a definite error; nothing is proposed.
	var cmd locksm.Command
	switch m.Type {
	case wire.TypeAcquire:
		cmd = locksm.Command{Op: locksm.OpAcquire, Key: m.Key, Owner: m.Owner, LeaseSec: uint32(m.Lease), WaitMs: m.WaitMs}
	case wire.TypeRelease:
		cmd = locksm.Command{Op: locksm.OpRelease, Key: m.Key, Owner: m.Owner, Token: m.Token}
	}
	if m.Type != wire.TypeCancel {
		if err := locksm.ValidateCommand(cmd); err != nil {
			n.metrics.reply(cmd.Op, resError)
			cc.send(errReply(m.ID, err))
			return true
		}
	}

	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := cc.inflight[m.ID]; dup {
		// Two replies with one id could not be told apart: close.
		n.metrics.reply(cmd.Op, resError)
		cc.send(&wire.Msg{Type: wire.TypeError, ID: m.ID, Code: wire.CodeDuplicateID, Text: "request id already in flight"})
		return false
	}
	if m.Type == wire.TypeCancel {
		p := cc.inflight[m.Target]
		if p == nil || p.op != locksm.OpAcquire {
			cc.send(&wire.Msg{Type: wire.TypeError, ID: m.ID, Code: wire.CodeUnknownTarget, Text: "no pending acquire with that id"})
			return true
		}
		if !p.cancel {
			p.cancel = true
			if p.queued {
				n.propose(locksm.Command{Op: locksm.OpCancelWait, Key: p.key, Ref: p.ref})
			}
		}
		// The target's own reply (T, or G if the grant won the race) is
		// the outcome; K only says the cancel was taken.
		cc.send(&wire.Msg{Type: wire.TypeOK, ID: m.ID})
		return true
	}
	if !n.serving {
		addr, id := n.leaderHintLocked()
		n.metrics.reply(cmd.Op, resMoved)
		cc.send(&wire.Msg{Type: wire.TypeMoved, ID: m.ID, LeaderAddr: addr, LeaderID: id})
		return true
	}
	if len(cc.inflight) >= n.cfg.MaxInFlightPerConn {
		n.stats.inFlightRefusals.Add(1)
		n.metrics.reply(cmd.Op, resError)
		cc.send(errReply(m.ID, wire.ErrTooManyInFlight))
		return true
	}
	if cmd.Op == locksm.OpAcquire {
		if err := n.admitAcquire(m.Key, m.WaitMs > 0); err != nil {
			n.metrics.reply(cmd.Op, resError)
			cc.send(errReply(m.ID, err))
			return true
		}
	}
	n.nextRef++
	cmd.Ref = n.nextRef
	p := &pending{conn: cc, id: m.ID, op: cmd.Op, key: m.Key, owner: m.Owner, leaseSec: cmd.LeaseSec, ref: cmd.Ref, start: time.Now()}
	if cmd.Op == locksm.OpAcquire {
		p.deadline = p.start.Add(time.Duration(m.WaitMs) * time.Millisecond)
	}
	n.pend[p.ref] = p
	cc.inflight[m.ID] = p
	if cmd.Op == locksm.OpAcquire {
		p.uncommitted, p.mayWait = true, m.WaitMs > 0
		if p.mayWait {
			n.uncommitted[m.Key]++
		}
		n.uncommittedTotal++
	}
	n.propose(cmd)
	return true
}

// admitAcquire applies MaxKeys and MaxWaitersPerKey to an acquire of key
// (mayWait: its wait is not zero, so it can join the queue). Acquires
// proposed but not yet applied count as if each created a key and, if
// they may wait, joined the queue, so a burst cannot overshoot. Requires
// n.mu.
func (n *Node) admitAcquire(key string, mayWait bool) error {
	var held bool
	var keys, queue int
	n.fsm.read(func(s *locksm.State) {
		_, held = s.Holder(key)
		keys = s.NumHeld()
		queue = s.QueueLen(key)
	})
	if !held && keys+n.uncommittedTotal >= n.cfg.MaxKeys {
		n.stats.keyLimitRefusals.Add(1)
		return fmt.Errorf("%w: %d keys held or being acquired; this node allows %d", wire.ErrTooManyKeys, keys+n.uncommittedTotal, n.cfg.MaxKeys)
	}
	if mayWait && queue+n.uncommitted[key] >= n.cfg.MaxWaitersPerKey {
		n.stats.waiterLimitRefusals.Add(1)
		return fmt.Errorf("%w: %d waiting or joining; this node allows %d per key", wire.ErrTooManyWaiters, queue+n.uncommitted[key], n.cfg.MaxWaitersPerKey)
	}
	return nil
}

// committed drops p from the uncommitted-acquire counts (its command was
// applied, or will never be). Idempotent. Requires n.mu.
func (n *Node) committed(p *pending) {
	if !p.uncommitted {
		return
	}
	p.uncommitted = false
	if p.mayWait {
		if n.uncommitted[p.key]--; n.uncommitted[p.key] <= 0 {
			delete(n.uncommitted, p.key)
		}
	}
	n.uncommittedTotal--
}

// opOf is the lock operation of a request frame type (0 for the others).
func opOf(typ byte) locksm.Op {
	switch typ {
	case wire.TypeAcquire:
		return locksm.OpAcquire
	case wire.TypeRelease:
		return locksm.OpRelease
	}
	return 0
}

func errReply(id uint64, err error) *wire.Msg {
	return &wire.Msg{Type: wire.TypeError, ID: id, Code: wire.CodeOf(err), Text: err.Error()}
}

// status builds a status reply (without its id).
func (n *Node) status() wire.Msg {
	st := wire.Msg{Type: wire.TypeStatusR, NodeID: n.serverID}
	switch n.raft.State() {
	case raft.Leader:
		st.Role = wire.RoleLeader
	case raft.Follower:
		st.Role = wire.RoleFollower
	case raft.Candidate:
		st.Role = wire.RoleCandidate
	case raft.Shutdown:
		st.Role = wire.RoleShutdown
	}
	st.Term = n.raft.CurrentTerm()
	st.Commit = n.raft.CommitIndex()
	st.Applied = n.raft.AppliedIndex()
	// leader_addr is where requests are served right now: a leader that is
	// still preparing (barrier, dropping orphaned waiters) or handing its
	// leadership over leaves it empty. (Unlike M, status names Raft's
	// leader, never a hand-over's target: an older client takes a status
	// naming the node itself with an address for "serving".)
	var addr, id string
	if _, lid := n.raft.LeaderWithID(); lid != "" {
		id = string(lid)
		switch {
		case id != n.serverID:
			addr = n.fsm.clientAddr(id)
		case n.Serving():
			addr = n.advertise
		}
	}
	st.LeaderAddr, st.LeaderID = addr, id
	n.fsm.read(func(s *locksm.State) {
		st.LastToken = s.LastToken()
		st.Held = uint64(s.NumHeld())
		st.Waiting = uint64(s.NumWaiting())
	})
	return st
}

// membersReply builds a members reply (without its id): this node's view
// of the configuration, as many members as fit in one frame (a cluster has
// at most 5 voters and a learner or two, far below that).
func (n *Node) membersReply() wire.Msg {
	r := wire.Msg{Type: wire.TypeMembersR}
	ms, err := n.Members()
	if err != nil {
		return r
	}
	size := 1 + 8 + 1
	for _, m := range ms {
		mb := wire.Member{ServerID: m.ServerID, ClientAddr: m.ClientAddr, Suffrage: wire.SuffrageLearner}
		if m.Voter {
			mb.Suffrage = wire.SuffrageVoter
		}
		if len(mb.ClientAddr) > 255 {
			mb.ClientAddr = ""
		}
		if size += 1 + len(mb.ServerID) + 1 + 1 + len(mb.ClientAddr); size > wire.MaxFrameLen {
			break
		}
		r.Members = append(r.Members, mb)
	}
	return r
}

// send encodes m for the writer. Never blocks; a message that cannot be
// encoded is a bug, logged and dropped.
func (cc *clientConn) send(m *wire.Msg) {
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
	cc.c.Close()
	close(cc.wake)
}
