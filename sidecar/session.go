package sidecar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/wire"
)

// The broker's cluster session (protocol version 7, docs/sessions.md "The
// broker"). Not to be confused with the scheduler's sessions (owners,
// sched.go): this is the one session the broker holds in the replicated
// lock state.
//
// One goroutine (keepSession) keeps it attached to a connection to the
// serving leader: it opens it on the first serving leader connection that
// speaks version 7 and resumes it after every lost connection or leader
// change. While the leader's connection speaks 7 (and Config.Sessions
// allows), acquires and releases go only on the attached connection
// (usableLocked), so nothing of the session is written before a resume is
// answered. Against a leader of version 6 nothing changes: no session,
// today's behaviour exactly. Nor against a leader of version 7 in a
// cluster whose version is still 6 (a rolling upgrade under way: the
// leader refuses the open not_supported): the connection it refused
// carries requests without a session (plain), and every
// sessionProbeInterval the broker tries to open the session on a fresh
// connection, which replaces the plain one once it carries the session.

// SessionsMode is Config.Sessions.
type SessionsMode uint8

const (
	// SessionsAuto (the default): a session whenever the serving leader's
	// connection speaks protocol version 7; today's behaviour otherwise.
	SessionsAuto SessionsMode = iota
	// SessionsOff: never a session (today's behaviour with every node).
	SessionsOff
)

// String is the mode as the binary's --sessions flag and the unix API's
// INFO name it: "auto" or "off".
func (m SessionsMode) String() string {
	switch m {
	case SessionsAuto:
		return "auto"
	case SessionsOff:
		return "off"
	}
	return fmt.Sprintf("SessionsMode(%d)", uint8(m))
}

// ParseSessionsMode reads "auto" or "off" (the --sessions flag); anything
// else is an error wrapping ErrBadConfig.
func ParseSessionsMode(s string) (SessionsMode, error) {
	switch s {
	case "auto":
		return SessionsAuto, nil
	case "off":
		return SessionsOff, nil
	}
	return 0, fmt.Errorf("%w: sessions mode %q: want auto or off", ErrBadConfig, s)
}

// DefaultSessionTimeout is Config.SessionTimeout's default. A failover
// takes 1-2.8 s to a serving leader, then the broker needs one reconnect
// (backoff at most 3.2 s): 10 s survives a failover with room, while a
// crashed sidecar's place in a key's line costs seconds, not a lease
// (docs/sessions.md, "Terms").
const DefaultSessionTimeout = 10 * time.Second

// sessionProbeInterval is how often the broker tries again to open its
// session while the serving leader refuses it not_supported: the cluster
// version rises at most one discovery round (30 s) after the last member
// runs version 7, and a try costs one handshake and one refused open.
const sessionProbeInterval = 2 * time.Second

// sessionRetryPause is the pause before attaching again after a failed
// attempt (the connection had requests in flight, the node answered M or
// U): short, since the held requests wait for it.
const sessionRetryPause = 20 * time.Millisecond

// ErrSessionLost: the broker's cluster session cannot be resumed: the
// leader refused it (expired: no_session, or bad_session), or the serving
// leader speaks no sessions and it was detached for its timeout; its
// written requests without a final reply are Indeterminate.
var ErrSessionLost = errors.New("sidecar: cluster session lost")

// SessionInfo describes the broker's cluster session (Info.Session).
type SessionInfo struct {
	ID uint64
	// State: "none" (not attached: no leader yet, or its connection was
	// lost), "resuming", "attached", "expired", "failed", "closed" (the
	// broker closed it as it stopped).
	State string
	// Resumes counts the resumes answered; Opens the sessions opened (a
	// new one after a session was lost).
	Resumes, Opens uint64
	// Held is how many written requests wait for a resume's answer.
	Held int
	// LastResume is what the last resume's answer said about the requests
	// without a final reply.
	LastResume client.ResumeCounts
}

// offerVersion is the newest protocol version the broker offers: with
// sessions, wire.ProtocolVersion (7); without, version 6 (the last before
// sessions), so that a broker with sessions off talks to every node as a
// broker of the previous build does.
func (b *Broker) offerVersion() uint16 {
	switch {
	case b.cfg.maxVersion != 0:
		return b.cfg.maxVersion
	case b.cfg.Sessions == SessionsOff:
		return wire.VersionSessions - 1
	}
	return wire.ProtocolVersion
}

// speaksSessions reports whether conn may carry the session:
// Config.Sessions allows it and conn speaks version 7.
func (b *Broker) speaksSessions(conn *client.Conn) bool {
	return b.cfg.Sessions == SessionsAuto && conn.Peer().Version >= wire.VersionSessions
}

// isPlain reports whether conn's node refused the session not_supported
// (the cluster version is below 7): it carries requests without one.
func (b *Broker) isPlain(conn *client.Conn) bool {
	_, ok := b.plain.Load(conn)
	return ok
}

// sessionsFor reports whether conn's requests must go through the
// session: it may carry one, and its node did not refuse it.
func (b *Broker) sessionsFor(conn *client.Conn) bool {
	return b.speaksSessions(conn) && !b.isPlain(conn)
}

// usableLocked reports whether lock requests may be sent on conn: without
// sessions, on a node of version 6, or (plain) while the cluster refuses
// sessions, always; else only on the connection the session is attached
// to. Once a session is open, a plain connection is not used any more:
// requests wait for the session's (attachFresh replaces it). Requires
// b.mu.
func (b *Broker) usableLocked(conn *client.Conn) bool {
	if conn == b.sconn {
		return true
	}
	if b.sessionsFor(conn) {
		return false
	}
	return b.sess == nil || !b.speaksSessions(conn)
}

// leaderConnLocked returns a live connection to the serving leader that
// is not handing over, preferring the session's. Requires b.mu.
func (b *Broker) leaderConnLocked() *client.Conn {
	if b.leader == "" {
		return nil
	}
	var found *client.Conn
	for _, s := range b.slots {
		if s.addr == b.leader && s.conn != nil && !s.conn.HandingOver() {
			if s.conn == b.sconn {
				return s.conn
			}
			if found == nil || b.isPlain(found) && !b.isPlain(s.conn) {
				found = s.conn
			}
		}
	}
	return found
}

// keepSession keeps the cluster session attached to the serving leader
// until the broker closes.
func (b *Broker) keepSession() {
	defer b.workerWG.Done()
	var detachedAt time.Time // since when the session has no connection
	for {
		b.mu.Lock()
		changed := b.changed
		conn := b.leaderConnLocked()
		sconn, sess := b.sconn, b.sess
		b.mu.Unlock()
		select {
		case <-b.qstop:
			return
		default:
		}
		if sconn != nil && sconn.Err() != nil {
			// The attached connection died: its written requests are held
			// by the session until a resume answers them.
			b.mu.Lock()
			if b.sconn == sconn {
				b.sconn = nil
				b.notifyLocked()
			}
			b.mu.Unlock()
			detachedAt = b.cfg.Now()
			b.log.Info("cluster session detached; resuming on the serving leader", "session", fmt.Sprintf("%x", sess.ID()),
				"err", sconn.Err())
			continue
		}
		if sess != nil && sconn == nil && conn != nil && !b.speaksSessions(conn) && !detachedAt.IsZero() &&
			b.cfg.Now().Sub(detachedAt) >= b.cfg.SessionTimeout {
			// The serving leader speaks no sessions (a downgrade): the
			// session cannot be resumed, and what it held is unknown.
			// While no leader serves, or one of version 7 does, the
			// session is kept: a new leader gives every session a full
			// timeout from the moment it serves, so a resume after a long
			// election may still find it (else no_session ends it).
			b.loseSession(sess, fmt.Errorf("%w: the serving leader speaks protocol version %d, and the session was not resumed within its timeout %v",
				ErrSessionLost, conn.Peer().Version, b.cfg.SessionTimeout))
			detachedAt = time.Time{}
			continue
		}
		var wake <-chan time.Time
		if !detachedAt.IsZero() && sconn == nil && sess != nil {
			wake = b.cfg.After(max(detachedAt.Add(b.cfg.SessionTimeout).Sub(b.cfg.Now()), 0))
		}
		plain := conn != nil && conn != sconn && b.speaksSessions(conn) && b.isPlain(conn)
		if plain {
			b.mu.Lock()
			probeIn := b.probeAt.Sub(b.cfg.Now())
			b.mu.Unlock()
			if probeIn > 0 {
				// The cluster refused sessions a moment ago: the
				// plain connection serves without one meanwhile.
				if wake == nil || probeIn < detachedAt.Add(b.cfg.SessionTimeout).Sub(b.cfg.Now()) {
					wake = b.cfg.After(probeIn)
				}
				conn = nil
			}
		}
		if conn == nil || conn == sconn || !b.speaksSessions(conn) {
			var dead <-chan struct{}
			if sconn != nil {
				dead = sconn.Done()
			}
			select {
			case <-changed:
			case <-dead:
			case <-wake:
			case <-b.qstop:
				return
			}
			continue
		}
		attached := false
		if plain {
			attached = b.attachFresh(conn)
		} else {
			attached = b.attachSession(conn, nil)
		}
		if attached {
			detachedAt = time.Time{}
			continue
		}
		if detachedAt.IsZero() && sess != nil {
			detachedAt = b.cfg.Now()
		}
		select {
		case <-b.cfg.After(sessionRetryPause):
		case <-b.qstop:
			return
		}
	}
}

// attachFresh attaches the session (opens it, or resumes it) on a fresh
// connection to the node of plain, a connection that node refused the
// session on and that carries requests without one; once attached, the
// fresh connection takes plain's place in its slot, and plain is retired
// when what is in flight on it has ended. true once attached.
func (b *Broker) attachFresh(plain *client.Conn) bool {
	b.mu.Lock()
	b.probeAt = b.cfg.Now().Add(sessionProbeInterval)
	var s *slot
	for _, sl := range b.slots {
		if sl.conn == plain {
			s = sl
		}
	}
	b.mu.Unlock()
	if s == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(b.qctx, b.cfg.DialTimeout)
	fresh, err := b.dial(ctx, s)
	cancel()
	if err != nil {
		b.log.Debug("a fresh connection for the cluster session failed", "addr", s.addr, "err", err)
		return false
	}
	install := func() bool {
		select {
		case <-s.stop:
			return false
		default:
		}
		if s.conn != plain || b.closed {
			return false
		}
		s.conn = fresh
		close(s.swapped)
		s.swapped = make(chan struct{})
		return true
	}
	if !b.speaksSessions(fresh) || !b.attachSession(fresh, install) {
		fresh.Close()
		b.plain.Delete(fresh) // refused again: it never served
		return false
	}
	b.log.Info("the cluster session replaces a connection without one", "addr", s.addr)
	return true
}

// attachSession opens the session on conn (or a new one, if the last was
// lost) or resumes it there; true once attached. install, when set, runs
// under b.mu before the session is recorded as attached to conn (a fresh
// connection: it puts conn in its slot); false from it leaves the session
// unattached (an opened one orphaned: it expires empty).
func (b *Broker) attachSession(conn *client.Conn, install func() bool) bool {
	b.mu.Lock()
	sess := b.sess
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(b.qctx, b.cfg.DialTimeout+b.cfg.ReplyGrace)
	defer cancel()
	if sess == nil {
		s, err := client.NewSession(client.SessionConfig{Timeout: b.cfg.SessionTimeout})
		if err != nil {
			b.log.Error("cannot make a cluster session", "err", err)
			return false
		}
		if err := s.Open(ctx, conn); err != nil {
			if full := errors.Is(err, wire.ErrTooManySessions); full || errors.Is(err, wire.ErrNotSupported) {
				// The cluster version is below 7 (a member runs an
				// older build), or the cluster has its MaxSessions
				// live sessions: conn serves without a session, as a
				// version 6 connection, and a fresh connection tries
				// again later.
				b.mu.Lock()
				b.plain.Store(conn, false) // true once retiring
				b.probeAt = b.cfg.Now().Add(sessionProbeInterval)
				b.notifyLocked()
				b.mu.Unlock()
				if full {
					b.log.Warn("the cluster has as many sessions as it allows (--max-sessions); serving without one, "+
						"so a leader change makes requests in flight indeterminate and drops waiters, until a session opens",
						"addr", conn.RemoteAddr(), "err", err, "retry_in", sessionProbeInterval)
				} else {
					b.log.Info("the cluster does not take sessions yet (a member runs an older version); serving without one",
						"addr", conn.RemoteAddr(), "err", err)
				}
				return false
			}
			// A lost open reply leaves an orphan session at most: it
			// expires empty. The next attempt opens another.
			b.log.Debug("opening the cluster session failed", "addr", conn.RemoteAddr(), "err", err)
			b.sessionRefused(err)
			return false
		}
		b.mu.Lock()
		if install != nil && !install() {
			b.mu.Unlock()
			return false
		}
		b.sess, b.sconn = s, conn
		b.sessOpens++
		b.notifyLocked()
		b.mu.Unlock()
		b.log.Info("cluster session opened", "session", fmt.Sprintf("%x", s.ID()), "timeout", b.cfg.SessionTimeout)
		b.retirePlain()
		return true
	}
	n, err := sess.Resume(ctx, conn)
	if err != nil {
		if !sess.Usable() {
			b.loseSession(sess, fmt.Errorf("%w: %w", ErrSessionLost, err))
			return false
		}
		b.log.Debug("resuming the cluster session failed", "addr", conn.RemoteAddr(), "err", err)
		b.sessionRefused(err)
		return false
	}
	b.mu.Lock()
	if install != nil && !install() {
		b.mu.Unlock()
		conn.Close() // its shutdown hands the session's requests back
		return false
	}
	b.sconn = conn
	b.notifyLocked()
	b.mu.Unlock()
	b.metrics.sessionResumed(n)
	b.log.Info("cluster session resumed", "session", fmt.Sprintf("%x", sess.ID()), "outcomes", n.Outcomes, "queued", n.Queued,
		"void", n.Void)
	b.resumedOps(conn)
	b.retirePlain()
	return true
}

// retirePlain closes the connections that carry requests without the
// session (plain) once nothing is in flight on them: with the session
// attached they take no new request, and their slots then dial fresh ones,
// which may carry it later.
func (b *Broker) retirePlain() {
	b.mu.Lock()
	var conns []*client.Conn
	for _, s := range b.slots {
		if s.conn != nil && s.conn != b.sconn && b.plain.CompareAndSwap(s.conn, false, true) {
			conns = append(conns, s.conn)
		}
	}
	b.slotWG.Add(len(conns))
	b.mu.Unlock()
	for _, conn := range conns {
		go b.retire(conn)
	}
}

// sessionRefused takes what a failed attach says about the leader.
func (b *Broker) sessionRefused(err error) {
	if errors.Is(err, client.ErrSessionRefused) && !errors.Is(err, client.ErrConnClosed) {
		// M, U or E from the node we took for the leader: ask again.
		b.forgetLeader()
	}
}

// loseSession gives the session up: its held requests complete as
// Indeterminate (their calls end with an error wrapping cause), and the
// next serving leader gets a new session.
func (b *Broker) loseSession(sess *client.Session, cause error) {
	b.log.Warn("cluster session lost; its requests without a reply are indeterminate", "session", fmt.Sprintf("%x", sess.ID()),
		"err", cause)
	b.metrics.sessionsLost.Inc()
	b.mu.Lock()
	mine := b.sess == sess
	if mine {
		b.sess, b.sconn, b.losing = nil, nil, sess
	}
	b.mu.Unlock()
	sess.Fail(cause) // sets its state before it completes its requests
	if mine {
		b.mu.Lock()
		b.lostSession = sess.Stats() // Info shows it failed or expired
		if b.losing == sess {
			b.losing = nil
		}
		b.notifyLocked()
		b.mu.Unlock()
	}
}

// resumedOps re-points the acquires that were written on the session's
// lost connection and are still queued at the node (the resume answered
// Q): their cancel goes to conn now. An acquire whose caller gave up
// meanwhile is cancelled there at once (a grant that still comes is
// compensated by onDone), and so is one being evicted: its cancel went
// to the lost connection, which may have died before the node read it
// (or refused it, dead already), and the session kept the waiter in its
// line; unsent again, the evicted waiter kept its place and the asker
// it made room for waited its whole wait (issue 39). A cancel the node
// did read, repeated, earns unknown_target (its target is over): harmless.
func (b *Broker) resumedOps(conn *client.Conn) {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	for o := range b.sessOps {
		if o.st == stDone || o.conn == conn || o.call == nil {
			continue
		}
		select {
		case <-o.call.Done:
			continue // answered: its onDone runs (or ran)
		default:
		}
		b.dropSlotLocked(o) // queued at the node, or it would have completed
		o.conn = conn
		if o.st == stSent {
			o.st = stQueued
		}
		if o.answered || o.evicting {
			b.giveUpLocked(o)
		}
	}
}

// closeSession ends the cluster session on Close, after the releases: if
// attached, it is closed at the leader (d), so that its waiters leave
// their lines at once instead of after its timeout; else (no serving
// leader now) it is left to expire. Either way what it still holds
// completes (Indeterminate: the connections close).
func (b *Broker) closeSession() {
	b.mu.Lock()
	sess, attached := b.sess, b.sconn != nil
	b.sess, b.sconn = nil, nil
	b.mu.Unlock()
	if sess == nil {
		return
	}
	defer func() {
		b.mu.Lock()
		b.lostSession = sess.Stats() // Info shows it closed (or failed)
		b.mu.Unlock()
	}()
	if attached {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.DialTimeout)
		err := sess.Close(ctx)
		cancel()
		if err == nil {
			b.log.Info("cluster session closed", "session", fmt.Sprintf("%x", sess.ID()))
			return
		}
		b.log.Warn("closing the cluster session failed; the cluster expires it", "session", fmt.Sprintf("%x", sess.ID()), "err", err)
	}
	sess.Fail(ErrClosed)
}

// sessionInfo describes the cluster session; requires b.mu.
func (b *Broker) sessionInfoLocked() *SessionInfo {
	st := b.lostSession
	switch {
	case b.sess != nil:
		st = b.sess.Stats()
	case b.losing != nil:
		st = b.losing.Stats()
	}
	if st.ID == 0 {
		return nil
	}
	return &SessionInfo{ID: st.ID, State: st.State.String(), Resumes: st.Resumes, Opens: b.sessOpens, Held: st.Held,
		LastResume: st.LastResume}
}
