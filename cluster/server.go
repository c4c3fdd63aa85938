package cluster

import (
	"errors"
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
	c      net.Conn
	remote string

	// Guarded by Node.mu.
	inflight map[uint64]*pending // by request id
	dead     bool                // reader stopped: later grants are compensated

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
		cc := &clientConn{n: n, c: c, remote: c.RemoteAddr().String(), inflight: map[uint64]*pending{}, wake: make(chan struct{}, 1)}
		n.mu.Lock()
		full := len(n.conns) >= n.cfg.MaxClientConns
		closed := n.closed
		if !full && !closed {
			n.conns[cc] = struct{}{}
		}
		n.mu.Unlock()
		if full || closed {
			n.log.Warn("refusing client connection: limit reached", "remote", cc.remote, "max", n.cfg.MaxClientConns)
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
	_ = cc.c.SetDeadline(time.Now().Add(n.cfg.HandshakeTimeout))
	_, err := wire.ServerHandshake(cc.c, wire.HandshakeConfig{
		Kind:      wire.KindClient,
		Secret:    n.cfg.ClientSecret,
		ClusterID: n.cfg.ClusterID,
		NodeID:    n.cfg.NodeID,
	})
	if err != nil {
		n.log.Warn("client handshake refused", "remote", cc.remote, "err", err)
		return
	}
	_ = cc.c.SetDeadline(time.Time{})
	cc.mu.Lock()
	cc.writing = true
	cc.mu.Unlock()
	go cc.writeLoop()
	r := wire.NewReader(cc.c)
	var m wire.Msg
	for {
		if err := r.ReadMsg(&m); err != nil {
			if wire.IsFieldError(err) && m.ID != 0 {
				// Well framed, one bad field: a definite error for that
				// request only; the others in flight stay unaffected.
				cc.send(errReply(m.ID, err))
				continue
			}
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isClosedConn(err) {
				return
			}
			n.log.Info("closing client connection after a protocol error", "remote", cc.remote, "err", err)
			cc.send(&wire.Msg{Type: wire.TypeError, Code: wire.CodeOf(err), Text: err.Error()})
			cc.flushAndClose()
			return
		}
		if !n.handle(cc, &m) {
			cc.flushAndClose()
			return
		}
	}
}

func isClosedConn(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// connGone runs when the reader stops: the connection's queued acquires are
// cancelled, and grants that arrive later are released (see granted).
func (n *Node) connGone(cc *clientConn) {
	n.mu.Lock()
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
			cc.send(errReply(m.ID, err))
			return true
		}
	}

	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := cc.inflight[m.ID]; dup {
		// Two replies with one id could not be told apart: close.
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
		addr, id := n.leaderHint()
		cc.send(&wire.Msg{Type: wire.TypeMoved, ID: m.ID, LeaderAddr: addr, LeaderID: id})
		return true
	}
	if len(cc.inflight) >= n.cfg.MaxInFlightPerConn {
		cc.send(errReply(m.ID, wire.ErrTooManyInFlight))
		return true
	}
	n.nextRef++
	cmd.Ref = n.nextRef
	p := &pending{conn: cc, id: m.ID, op: cmd.Op, key: m.Key, owner: m.Owner, leaseSec: cmd.LeaseSec, ref: cmd.Ref}
	if cmd.Op == locksm.OpAcquire {
		p.deadline = time.Now().Add(time.Duration(m.WaitMs) * time.Millisecond)
	}
	n.pend[p.ref] = p
	cc.inflight[m.ID] = p
	n.propose(cmd)
	return true
}

func errReply(id uint64, err error) *wire.Msg {
	return &wire.Msg{Type: wire.TypeError, ID: id, Code: wire.CodeOf(err), Text: err.Error()}
}

// status builds a status reply (without its id).
func (n *Node) status() wire.Msg {
	st := wire.Msg{Type: wire.TypeStatusR, NodeID: n.cfg.NodeID}
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
	// still preparing (barrier, dropping orphaned waiters) leaves it empty.
	addr, id := n.leaderHint()
	if id == n.cfg.NodeID && n.Serving() {
		addr = n.advertise
	}
	st.LeaderAddr, st.LeaderID = addr, id
	n.fsm.read(func(s *locksm.State) {
		st.LastToken = s.LastToken()
		st.Held = uint64(s.NumHeld())
		st.Waiting = uint64(s.NumWaiting())
	})
	return st
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
			_ = cc.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := cc.c.Write(buf); err != nil {
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
