package leader

// Sessions (protocol version 7; docs/sessions.md "The leader"): the
// leader's side of a broker's session.
//
//   - Attach. A connection of version >= wire.VersionSessions carries at
//     most one session, attached with an open 'o' or a resume 'y' before
//     any lock request on it. An open is proposed with the SHA-256 of its
//     secret and answered K once applied. A resume is checked against the
//     table's hash first (a mismatch: E bad_session, close; an unknown
//     session: E no_session; both logged with the connection, see
//     Ready.Refusals), then proposed with the broker's high and ack and the
//     attach epoch the leader observed (ErrStaleEpoch: proposed again with
//     the new one). Once applied it is answered, in this order: every kept
//     outcome (serial above the ack) as its request's reply (id = seq), a Q
//     for every still queued request of the session (whose final reply now
//     goes to this connection), the O watermark, and K. Resumes are
//     answered only while serving, so after the barrier of Serve: every
//     entry an old leader appended is applied or gone by then. One attach
//     of a session is in flight at a time; later ones, and those arriving
//     while the session's expiry is in flight, wait for it to settle.
//   - Requests. Every lock request on an attached connection is the
//     session's: its id is its seq (above the session's floor, growing on
//     the connection; else E voided / duplicate_seq and close), and its
//     command carries the session, the seq and the latest ack heard ('k' or
//     the resume's). Its replies, and the hand-off grants and timeouts of
//     its waits, go to the session's attached connection, whichever that is
//     by then; with none attached nothing is sent and the outcome waits in
//     the state for a resume. After the replies of each applied batch that
//     recorded outcomes of an attached session, O names its latest serial.
//     A connection's death, a planned hand-over and a leadership change
//     never cancel a session's waits: they stay in line.
//   - Liveness. A session without an attached connection for its timeout
//     (from its detach, or from Serve for every session of the table) is
//     expired through the log, naming the grants nobody was told: those
//     this core saw committed to the session while it was not attached here
//     and did not deliver at a resume since (untold). A connection that
//     silently died (lost host, cut network) is detected by the driver:
//     every attach names the connection and the session's timeout in
//     Ready.Silences, and the driver closes the connection once nothing
//     arrived on it for that long (the broker pings at a third of it), which
//     detaches the session here (Closed) as any close does.
//   - Leadership. A new leader adopts every session of the table at Serve:
//     their queued requests become owed replies again, with their wait
//     timers re-armed from the replicated EnqueuedAt + WaitMs against the
//     leader's wall clock. A leadership that ends sends nothing for the
//     session requests it owes (the state has them) and closes the session
//     connections, so their brokers resume where a leader serves.

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// session is what this leadership knows of one live session.
type session[C comparable] struct {
	id      uint64
	timeout time.Duration
	// conn is the attached connection (nil: none here).
	conn *conn[C]
	// home is the connection whose in-flight map holds the session's owed
	// requests: the attached one, else the last one attached (dead, or
	// taken over by another), else a placeholder made when the session was
	// adopted from the table. All of them are on one connection.
	home  *conn[C]
	ack   uint64 // the latest ack heard ('k', or a resume's)
	floor uint64 // seqs at or below it are void
	// gen counts attaches and detaches: a liveness timer armed under
	// another gen is stale.
	gen uint64
	// expiring: an expiry is proposed and not applied. overdue: the
	// liveness timer came due while an attach was in flight (if that
	// fails, the session expires at once).
	expiring, overdue bool
	// acking: an ack-only entry (OpAckSession) of it is proposed and
	// not applied.
	acking bool
	// waiting: resumes that wait for the attach or the expiry in flight.
	waiting []*pending[C]
	// ext is the pendingExt every lock request of the session shares.
	ext *pendingExt[C]
	// expiresAt is when the liveness timer armed by the latest detach
	// comes due (zero while attached), for inspection only.
	expiresAt time.Time
}

// attachReq is what an open or resume asked for.
type attachReq struct {
	sid       uint64
	hash      string // open: SHA-256 of the secret
	timeoutMs uint32 // open
	high, ack uint64 // resume
	epoch     uint64 // resume: the attach epoch proposed with
}

// untoldGrant is a grant nobody was told (Core.untold): its session, and
// the key (a block's primary key) and owner a release of it names.
type untoldGrant struct {
	session    uint64
	key, owner string
	// serial is the grant's outcome in its session: an ack at or above
	// it says the broker received it, whoever told it.
	serial uint64
}

// sessMark is the latest serial an applied batch recorded for a session.
type sessMark struct{ sid, serial uint64 }

func (k *Core[C]) newSession(id uint64, timeoutMs uint32) *session[C] {
	s := &session[C]{id: id, timeout: time.Duration(timeoutMs) * time.Millisecond}
	s.ext = &pendingExt[C]{sess: s}
	s.home = &conn[C]{dead: true, inflight: map[uint64]*pending[C]{}, version: wire.VersionSessions}
	k.sessions[id] = s
	return s
}

// sessExt is the pendingExt of a lock request of s (nil: no session).
func sessExt[C comparable](s *session[C]) *pendingExt[C] {
	if s == nil {
		return nil
	}
	return s.ext
}

// dest is where p's replies go: its session's attached connection (nil:
// none, nothing is sent), or its own connection.
func (k *Core[C]) dest(p *pending[C]) *conn[C] {
	if s := p.session(); s != nil {
		return attachedConn(s)
	}
	return p.conn
}

// attachedConn is s's attached connection, unless it is being closed.
func attachedConn[C comparable](s *session[C]) *conn[C] {
	if s.conn == nil || s.conn.closing {
		return nil
	}
	return s.conn
}

// answer sends m, a reply or progress frame of p, where p's replies go.
func (k *Core[C]) answer(p *pending[C], m wire.Msg) {
	if p.ext == nil {
		k.send(p.conn, m)
		return
	}
	if cn := k.dest(p); cn != nil {
		k.send(cn, m)
	}
}

// attached reports whether session id has a connection attached here.
func (k *Core[C]) attached(id uint64) bool {
	s := k.sessions[id]
	return s != nil && attachedConn(s) != nil
}

// refuse answers request id of cn with E for err and records the refusal
// for the log. It returns whether the connection stays open.
func (k *Core[C]) refuse(cn *conn[C], id, sid uint64, err error, keep bool) bool {
	k.event(Event{Kind: EventSessionRefused})
	k.rd.Refusals = append(k.rd.Refusals, Refusal[C]{Conn: cn.handle, Session: sid, Err: err})
	k.send(cn, errReply(id, err))
	return keep
}

// sessionOfRequest checks a lock request (or cancel) of cn against cn's
// session and stamps the session's fields into cmd. It returns the
// session (nil: none), and false when the connection must close (its E
// is queued).
func (k *Core[C]) sessionOfRequest(cn *conn[C], m *wire.Msg, cmd *locksm.Command) (*session[C], bool) {
	if m.Type == wire.TypeCancel {
		return nil, true // it names a seq; it has none of its own
	}
	if cn.sid == 0 {
		if cn.attaching {
			k.reply(cmd.Op, OutcomeError)
			return nil, k.refuse(cn, m.ID, 0, fmt.Errorf("%w: a lock request before the session's open or resume was answered", wire.ErrBadSession), false)
		}
		cn.used = true // session-less, as on every older connection
		return nil, true
	}
	s := cn.sess
	if s == nil {
		k.reply(cmd.Op, OutcomeError)
		return nil, k.refuse(cn, m.ID, cn.sid, fmt.Errorf("%w: session %d is no longer attached to this connection (resume it first)", wire.ErrBadSession, cn.sid), false)
	}
	switch {
	case m.ID <= s.floor:
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, errReply(m.ID, fmt.Errorf("%w: seq %d is at or below the session's floor %d", locksm.ErrVoided, m.ID, s.floor)))
		return nil, false
	case m.ID <= cn.lastSeq:
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, errReply(m.ID, fmt.Errorf("%w: seq %d does not grow on this connection (last %d)", locksm.ErrDuplicateSeq, m.ID, cn.lastSeq)))
		return nil, false
	}
	cn.lastSeq = m.ID
	cmd.Session, cmd.Seq, cmd.Ack = s.id, m.ID, s.ack
	return s, true
}

// sessionRequest takes an open, resume or ack frame of cn (version 7).
func (k *Core[C]) sessionRequest(now time.Time, cn *conn[C], m *wire.Msg) bool {
	if m.Type == wire.TypeSessionAck {
		if cn.sid == 0 {
			return k.refuse(cn, m.ID, 0, fmt.Errorf("%w: an ack on a connection without a session", wire.ErrBadSession), false)
		}
		if s := cn.sess; s != nil {
			s.ack = max(s.ack, m.Serial)
			k.ackedTold(s.id, s.ack)
			k.proposeAck(s, cn)
		}
		k.send(cn, wire.Msg{Type: wire.TypeOK, ID: m.ID})
		return true
	}
	if _, dup := cn.inflight[m.ID]; dup {
		k.send(cn, wire.Msg{Type: wire.TypeError, ID: m.ID, Code: wire.CodeDuplicateID, Text: "request id already in flight"})
		return false
	}
	if m.Type == wire.TypeCloseSession {
		return k.closeRequest(now, cn, m)
	}
	if cn.used || cn.attaching || (cn.sid != 0 && (m.Type == wire.TypeOpenSession || m.Session != cn.sid || cn.sess != nil)) {
		return k.refuse(cn, m.ID, m.Session, fmt.Errorf("%w: a connection carries one session, attached before any lock request", wire.ErrBadSession), false)
	}
	if !k.serving {
		addr, id := k.hint()
		k.send(cn, wire.Msg{Type: wire.TypeMoved, ID: m.ID, LeaderAddr: addr, LeaderID: id})
		return true
	}
	if v := k.table.ClusterVersion(); v < wire.VersionSessions {
		k.send(cn, errReply(m.ID, fmt.Errorf("%w: sessions need every member at protocol version %d; the cluster version is %d",
			wire.ErrNotSupported, wire.VersionSessions, v)))
		return true
	}
	hash := sha256.Sum256(m.Secret[:])
	p := &pending[C]{conn: cn, id: m.ID, start: now, ext: &pendingExt[C]{attach: &attachReq{sid: m.Session}}}
	if m.Type == wire.TypeOpenSession {
		cmd := locksm.Command{Op: locksm.OpOpenSession, Session: m.Session, SecretHash: string(hash[:]), TimeoutMs: m.TimeoutMs}
		if err := locksm.ValidateCommand(cmd); err != nil {
			k.send(cn, errReply(m.ID, err))
			return true
		}
		if k.sessions[m.Session] != nil || k.attachingTo[m.Session] != nil {
			k.send(cn, errReply(m.ID, locksm.ErrSessionExists))
			return true
		}
		if limit := k.cfg.MaxSessions; limit > 0 {
			if n := k.table.NumSessions() + k.opensInFlight(); n >= limit {
				// Each lives until closed or expired: a client looping
				// connect, open, close would keep open-rate × timeout of
				// them alive, each with state, a timer and snapshot bytes.
				k.event(Event{Kind: EventRefusedSessions})
				k.send(cn, errReply(m.ID, fmt.Errorf("%w: %d sessions live or opening; this node allows %d", wire.ErrTooManySessions, n, limit)))
				return true
			}
		}
		p.op, p.attachment().hash, p.attachment().timeoutMs = locksm.OpOpenSession, cmd.SecretHash, cmd.TimeoutMs
		k.oweAttach(p)
		k.attachingTo[m.Session] = p
		k.propose(cmd)
		return true
	}
	info, ok := k.table.Session(m.Session)
	if !ok {
		// Closed after the refusal: a connection looping resumes of
		// unknown sessions would otherwise cost a refusal (and a log line)
		// per frame, as fast as it can write them (issue 39, finding 9).
		return k.refuse(cn, m.ID, m.Session, fmt.Errorf("%w: session %d (expired, closed or never opened)", locksm.ErrNoSession, m.Session), false)
	}
	if subtle.ConstantTimeCompare(hash[:], []byte(info.SecretHash)) != 1 {
		return k.refuse(cn, m.ID, m.Session, fmt.Errorf("%w: resume of session %d", wire.ErrBadSession, m.Session), false)
	}
	s := k.sessions[m.Session]
	if s == nil { // unreachable once serving: Serve adopted every session
		s = k.newSession(m.Session, info.TimeoutMs)
		s.floor = info.Floor
	}
	p.op, p.attachment().high, p.attachment().ack = locksm.OpResumeSession, m.High, m.Serial
	k.oweAttach(p)
	s.waiting = append(s.waiting, p)
	k.nextAttach(s)
	return true
}

// opensInFlight counts the opens proposed and not yet applied.
func (k *Core[C]) opensInFlight() int {
	n := 0
	for _, p := range k.attachingTo {
		if p.op == locksm.OpOpenSession {
			n++
		}
	}
	return n
}

// proposeAck proposes an ack-only entry for s when its latest ack would
// drop kept outcomes and no request of it is in flight on cn to carry the
// ack (an active session's next command carries it anyway, for free): so
// a quiet session's acknowledged outcomes leave the table, and every
// snapshot, within one commit of its broker's 'k' (issue 39, finding 5).
// One at a time per session; needs every member at version 9.
func (k *Core[C]) proposeAck(s *session[C], cn *conn[C]) {
	if s.acking || !k.serving || cn.acquiring+cn.releasing > 0 || k.table.ClusterVersion() < wire.VersionAckEntry {
		return
	}
	info, ok := k.table.Session(s.id)
	if !ok || min(s.ack, info.Serial) <= info.Ack {
		return // nothing the ack would drop
	}
	s.acking = true
	k.propose(locksm.Command{Op: locksm.OpAckSession, Session: s.id, Ack: s.ack})
}

// closeRequest takes the broker's clean stop of the session attached to
// cn: proposed at once, K once applied (the session and its waits are
// gone; its holdings keep their leases).
func (k *Core[C]) closeRequest(now time.Time, cn *conn[C], m *wire.Msg) bool {
	s := cn.sess
	if s == nil {
		return k.refuse(cn, m.ID, cn.sid, fmt.Errorf("%w: no session attached to this connection", wire.ErrBadSession), false)
	}
	if !k.serving {
		addr, id := k.hint()
		k.send(cn, wire.Msg{Type: wire.TypeMoved, ID: m.ID, LeaderAddr: addr, LeaderID: id})
		return true
	}
	if k.closingSess[s.id] != nil {
		k.send(cn, errReply(m.ID, fmt.Errorf("%w: a close of session %d is in flight", wire.ErrBadSession, s.id)))
		return true
	}
	k.nextRef++
	p := &pending[C]{conn: cn, id: m.ID, op: locksm.OpCloseSession, ref: k.nextRef, start: now, ext: &pendingExt[C]{attach: &attachReq{sid: s.id}}}
	k.pend[p.ref] = p
	cn.owe(p)
	k.closingSess[s.id] = p
	k.propose(locksm.Command{Op: locksm.OpCloseSession, Session: s.id})
	return true
}

// oweAttach files p, an open or resume about to be proposed or to wait.
func (k *Core[C]) oweAttach(p *pending[C]) {
	k.nextRef++
	p.ref = k.nextRef
	k.pend[p.ref] = p
	p.conn.owe(p)
	p.conn.attaching = true
}

// finishAttach forgets p, an open or resume being answered.
func (k *Core[C]) finishAttach(p *pending[C]) {
	k.finish(p)
	p.conn.attaching = false
}

// nextAttach starts the next waiting resume of s if nothing of s is in
// flight; with none left, a session whose timer came due meanwhile
// expires.
func (k *Core[C]) nextAttach(s *session[C]) {
	for len(s.waiting) > 0 && k.attachingTo[s.id] == nil && !s.expiring {
		p := s.waiting[0]
		s.waiting = s.waiting[1:]
		if p.conn.dead {
			k.finishAttach(p)
			continue
		}
		info, ok := k.table.Session(s.id)
		if !ok {
			k.finishAttach(p)
			k.send(p.conn, errReply(p.id, locksm.ErrNoSession))
			continue
		}
		p.attachment().epoch = info.Epoch
		k.attachingTo[s.id] = p
		k.propose(locksm.Command{Op: locksm.OpResumeSession, Session: s.id, Seq: p.attachment().high,
			Ack: max(p.attachment().ack, s.ack), Epoch: info.Epoch})
	}
	if len(s.waiting) == 0 {
		s.waiting = nil
	}
	if s.overdue && s.conn == nil && k.attachingTo[s.id] == nil && !s.expiring {
		k.expire(s)
	}
}

// attach makes cn the connection of s (taking it over from another) and
// moves s's owed requests to it.
func (k *Core[C]) attach(cn *conn[C], s *session[C]) {
	if old := s.conn; old != nil && old != cn {
		old.sess = nil
	}
	s.conn, s.overdue, s.expiresAt = cn, false, time.Time{}
	s.gen++
	cn.sess, cn.sid = s, s.id
	cn.lastSeq = max(cn.lastSeq, s.floor)
	if h := s.home; h != cn {
		for _, p := range sortedByRef(h.inflight) {
			if p.session() == s {
				h.unowe(p)
				p.conn = cn
				cn.owe(p)
			}
		}
	}
	s.home = cn
	k.rd.Silences = append(k.rd.Silences, Silence[C]{Conn: cn.handle, Max: s.timeout})
}

// detach leaves s without a connection here and starts its timeout.
func (k *Core[C]) detach(now time.Time, s *session[C]) {
	if c := s.conn; c != nil {
		c.sess = nil
	}
	s.conn = nil
	s.gen++
	s.expiresAt = now.Add(s.timeout)
	k.rd.Timers = append(k.rd.Timers, Timer{At: s.expiresAt, Kind: TimerSession, Session: s.id, Gen: s.gen, Epoch: k.epoch})
}

// SessionLiveness is what this leadership knows of a session's
// connection, for inspection (`ticketing status`).
type SessionLiveness struct {
	// Attached: a connection of the session is attached here.
	Attached bool
	// ExpiresAt: without one, when the liveness timer expires the session
	// (on the clock of Core's now; zero while attached).
	ExpiresAt time.Time
	// Expiring: its expiry is proposed and not applied yet.
	Expiring bool
}

// SessionLiveness reports session id's liveness; false if this
// leadership does not track it (not leading, or not serving yet).
func (k *Core[C]) SessionLiveness(id uint64) (SessionLiveness, bool) {
	s := k.sessions[id]
	if s == nil {
		return SessionLiveness{}, false
	}
	if attachedConn(s) != nil {
		return SessionLiveness{Attached: true, Expiring: s.expiring}, true
	}
	return SessionLiveness{ExpiresAt: s.expiresAt, Expiring: s.expiring}, true
}

// sessionTimerDue expires a session still without a connection since the
// detach that armed t.
func (k *Core[C]) sessionTimerDue(t Timer) {
	s := k.sessions[t.Session]
	if s == nil || s.gen != t.Gen || s.conn != nil || s.expiring {
		return
	}
	if k.attachingTo[s.id] != nil || len(s.waiting) > 0 {
		s.overdue = true // decided when the attach settles
		return
	}
	k.expire(s)
}

// expire proposes the expiry of s, naming its untold grants.
func (k *Core[C]) expire(s *session[C]) {
	info, ok := k.table.Session(s.id)
	if !ok {
		delete(k.sessions, s.id)
		return
	}
	tokens := k.untoldOf(s.id)
	s.expiring, s.overdue = true, false
	k.propose(locksm.Command{Op: locksm.OpExpireSession, Session: s.id, Epoch: info.Epoch, Tokens: tokens})
}

// untoldOf lists the untold grants of session id, ascending.
func (k *Core[C]) untoldOf(id uint64) []uint64 {
	var tokens []uint64
	for t, g := range k.untold {
		if g.session == id {
			tokens = append(tokens, t)
		}
	}
	slices.Sort(tokens)
	return tokens
}

// noteUntold records the grants a's command committed to sessions not
// attached here: nobody was told them (an expiry releases them).
func (k *Core[C]) noteUntold(a *Applied) {
	if c := &a.Cmd; c.Session != 0 && a.Res.Status == locksm.StatusGranted && !k.attached(c.Session) {
		k.untold[a.Res.Token] = untoldGrant{session: c.Session, key: cmdKey(c), owner: c.Owner, serial: a.Res.Serial}
	}
	for _, e := range a.Effects {
		if e.Kind == locksm.EffectGranted && e.Session != 0 && !k.attached(e.Session) {
			k.untold[e.Token] = untoldGrant{session: e.Session, key: e.Key, owner: e.Owner, serial: e.Serial}
		}
	}
}

// ackedTold drops from the untold grants of session id those that its
// broker's ack covers: it received them, so they were told, by this
// leader or another.
func (k *Core[C]) ackedTold(id, ack uint64) {
	for t, g := range k.untold {
		if g.session == id && g.serial != 0 && g.serial <= ack {
			delete(k.untold, t)
		}
	}
}

// releaseLateUntold proposes the release of every grant to session id that
// is still untold when its expiry or close applies without naming it: one
// applied between the expiry's proposal, which fixed its Tokens, and its
// apply (issue 39, finding 3). The ended session forgets it, and its
// holding would otherwise keep its lease with nobody to release it.
// Nobody was told it, so nobody can use it; the release needs the exact
// token, so it changes nothing if the holding ended meanwhile.
func (k *Core[C]) releaseLateUntold(id uint64, named []uint64) {
	for _, t := range k.untoldOf(id) {
		if slices.Contains(named, t) {
			continue
		}
		g := k.untold[t]
		delete(k.untold, t)
		k.event(Event{Kind: EventAbandonedGrant})
		k.propose(locksm.Command{Op: locksm.OpRelease, Key: g.key, Owner: g.owner, Token: t})
	}
}

// mark notes that the batch being applied recorded serial for session
// sid (0: nothing).
func (k *Core[C]) mark(sid, serial uint64) {
	if sid == 0 || serial == 0 {
		return
	}
	// A scan while the batch touched few sessions (a sidecar's batch
	// touches one), the index beyond.
	if len(k.marks) <= markScan {
		for i := range k.marks {
			if k.marks[i].sid == sid {
				k.marks[i].serial = max(k.marks[i].serial, serial)
				return
			}
		}
	} else if i, ok := k.markAt[sid]; ok {
		k.marks[i].serial = max(k.marks[i].serial, serial)
		return
	}
	k.marks = append(k.marks, sessMark{sid, serial})
	switch n := len(k.marks); {
	case n == markScan+1:
		for i, m := range k.marks {
			k.markAt[m.sid] = i
		}
	case n > markScan+1:
		k.markAt[sid] = n - 1
	}
}

// markScan is how many marks a batch finds by a scan before it indexes
// them.
const markScan = 8

// clearMarks forgets the marks of the last batch.
func (k *Core[C]) clearMarks() {
	if len(k.marks) > markScan {
		for _, m := range k.marks {
			delete(k.markAt, m.sid)
		}
	}
	k.marks = k.marks[:0]
}

// watermarks sends O after a batch's replies to every attached session it
// recorded outcomes of.
func (k *Core[C]) watermarks() {
	if len(k.marks) == 0 {
		return
	}
	for _, mk := range k.marks {
		if s := k.sessions[mk.sid]; s != nil {
			if cn := attachedConn(s); cn != nil {
				k.send(cn, wire.Msg{Type: wire.TypeOutcomes, Session: mk.sid, Serial: mk.serial})
			}
		}
	}
	k.clearMarks()
}

// sessionApplied handles an applied session command (ops 8..12); later
// is the rest of its batch (applied to the table already, not yet
// answered).
func (k *Core[C]) sessionApplied(now time.Time, a *Applied, later []Applied) {
	c := &a.Cmd
	if k.ownTerm {
		k.noteUntold(a)
	}
	switch c.Op {
	case locksm.OpOpenSession:
		p := k.attachingTo[c.Session]
		if p == nil || p.op != c.Op || p.attachment().hash != c.SecretHash {
			p = nil
		} else {
			delete(k.attachingTo, c.Session)
			k.finishAttach(p)
		}
		if a.Res.Status != locksm.StatusOpened {
			if p != nil {
				k.send(p.conn, errReply(p.id, a.Res.Err))
			}
			return
		}
		if !k.ready || k.sessions[c.Session] != nil {
			return // Serve adopts it from the table
		}
		s := k.newSession(c.Session, c.TimeoutMs)
		if p == nil || p.conn.dead {
			k.detach(now, s)
			return
		}
		k.attach(p.conn, s)
		k.event(Event{Kind: EventSessionOpened})
		k.send(p.conn, wire.Msg{Type: wire.TypeOK, ID: p.id})
	case locksm.OpResumeSession:
		p := k.attachingTo[c.Session]
		if p == nil || p.op != c.Op || p.attachment().high != c.Seq || p.attachment().epoch != c.Epoch {
			return // not this leadership's resume
		}
		s := k.sessions[c.Session]
		switch {
		case a.Res.Status == locksm.StatusResumed && s != nil:
			delete(k.attachingTo, c.Session)
			k.resumed(now, p, s, later)
			k.nextAttach(s)
		case errors.Is(a.Res.Err, locksm.ErrStaleEpoch) && s != nil:
			// Another attach got in first: propose again with the epoch
			// it left.
			if info, ok := k.table.Session(c.Session); ok {
				p.attachment().epoch = info.Epoch
				k.propose(locksm.Command{Op: locksm.OpResumeSession, Session: s.id, Seq: p.attachment().high,
					Ack: max(p.attachment().ack, s.ack), Epoch: info.Epoch})
				return
			}
			fallthrough
		default:
			delete(k.attachingTo, c.Session)
			k.finishAttach(p)
			err := a.Res.Err
			if err == nil {
				err = locksm.ErrNoSession
			}
			k.send(p.conn, errReply(p.id, err))
			if s != nil {
				if errors.Is(err, locksm.ErrNoSession) {
					k.sessionEnded(s)
				} else {
					k.nextAttach(s)
				}
			}
		}
	case locksm.OpExpireSession, locksm.OpCloseSession:
		s := k.sessions[c.Session]
		k.effects(now, a.Effects, time.Time{})
		if p := k.closingSess[c.Session]; p != nil && c.Op == locksm.OpCloseSession {
			// Closed now, or gone before (expired): closed either way.
			delete(k.closingSess, c.Session)
			k.finish(p)
			k.send(p.conn, wire.Msg{Type: wire.TypeOK, ID: p.id})
		}
		if s == nil {
			return
		}
		if c.Op == locksm.OpExpireSession {
			s.expiring = false
		}
		switch a.Res.Status {
		case locksm.StatusSessionExpired, locksm.StatusSessionClosed:
			k.event(Event{Kind: EventSessionExpired, Keys: len(c.Tokens)})
			k.releaseLateUntold(s.id, c.Tokens)
			k.sessionEnded(s)
		default:
			// Stale: resumed since the expiry was decided (by an attach
			// now in line, or under an earlier leader). It lives.
			if len(s.waiting) == 0 && s.conn == nil && k.attachingTo[s.id] == nil {
				k.detach(now, s)
			}
			k.nextAttach(s)
		}
	case locksm.OpDropSessionless:
		k.effects(now, a.Effects, time.Time{})
	case locksm.OpAckSession:
		if s := k.sessions[c.Session]; s != nil {
			s.acking = false
		}
	}
}

// sessionEnded forgets s, expired or closed: its waiting resumes are told
// no_session; its requests still in flight will be refused ErrNoSession
// by the state, and nothing is sent for them (no connection is attached).
func (k *Core[C]) sessionEnded(s *session[C]) {
	delete(k.sessions, s.id)
	for t, g := range k.untold {
		if g.session == s.id {
			delete(k.untold, t)
		}
	}
	if c := s.conn; c != nil {
		c.sess = nil
		s.conn = nil
	}
	for _, p := range s.waiting {
		k.finishAttach(p)
		k.send(p.conn, errReply(p.id, locksm.ErrNoSession))
	}
	s.waiting = nil
}

// resumed answers p, a resume of s that applied: the kept outcomes, a Q
// for every queued request (now owed on p's connection), O and K, all as
// of the resume's own entry. The table already holds the whole batch, so
// what later entries of it (later) recorded for s is left out: a waiter
// they granted or timed out is still answered Q here, and its G or T
// follows after K, when its own entry is answered. Read after the whole
// batch, the resume would carry that outcome and the entry would send it
// again: two replies to one request (issue 39, finding 2).
func (k *Core[C]) resumed(now time.Time, p *pending[C], s *session[C], later []Applied) {
	s.floor = max(s.floor, p.attachment().high)
	s.ack = max(s.ack, p.attachment().ack)
	k.ackedTold(s.id, p.attachment().ack)
	cn := p.conn
	k.finishAttach(p)
	if cn.dead {
		// Nobody to answer: the broker resumes again. The session stays
		// as it was (attached to a live connection, or detached with its
		// timer running).
		return
	}
	k.attach(cn, s)
	serial := uint64(0)
	if info, ok := k.table.Session(s.id); ok {
		serial = info.Serial
	}
	// What the rest of the batch recorded for s: outcomes of waiters that
	// were still queued when the resume applied (a session's own commands
	// after its resume in one batch carry seqs at or below its high, so
	// they are void and record nothing).
	var left []uint64 // their seqs
	cutoff := serial  // the session's last serial as of the resume
	for i := range later {
		for _, e := range later[i].Effects {
			if e.Session == s.id && e.Serial != 0 {
				left = append(left, e.Seq)
				cutoff = min(cutoff, e.Serial-1)
			}
		}
		if c := &later[i].Cmd; c.Session == s.id && later[i].Res.Serial != 0 {
			cutoff = min(cutoff, later[i].Res.Serial-1)
		}
	}
	outs := k.table.SessionOutcomes(s.id)
	n := 0
	for _, o := range outs {
		if o.Serial > cutoff {
			break // in serial order
		}
		n++
		k.send(cn, outcomeMsg(o))
		if o.Status == locksm.StatusGranted {
			delete(k.untold, o.Token)
			if k.table.SessionHolds(s.id, o.Token) {
				// (A holding that ended is nobody's to tell: a revoked
				// one's lost event follows, below.)
				k.told[o.Token] = cn
			}
		}
	}
	k.tellSessionRevokes(cn, s, later)
	queued := k.table.SessionWaiters(s.id)
	for _, q := range queued {
		w := &q.Waiter
		if op := k.pend[w.Ref]; op == nil || op.session() != s {
			// Defensive: every queued request of a session has been
			// owed since Serve. Its wait runs in full from now.
			k.adopt(now, now.UnixMilli(), s, q)
		}
	}
	seqs := make([]uint64, 0, len(queued)+len(left))
	for _, q := range queued {
		seqs = append(seqs, q.Waiter.Seq)
		if op := k.pend[q.Waiter.Ref]; op != nil && op.session() == s {
			// The new connection has heard no place: the next walk
			// tells it, whatever the old one was told.
			k.untell(now, op)
		}
	}
	seqs = append(seqs, left...)
	slices.Sort(seqs)
	for _, seq := range seqs {
		k.send(cn, wire.Msg{Type: wire.TypeQueued, ID: seq})
	}
	k.send(cn, wire.Msg{Type: wire.TypeOutcomes, Session: s.id, Serial: cutoff})
	k.send(cn, wire.Msg{Type: wire.TypeOK, ID: p.id})
	k.event(Event{Kind: EventSessionResumed, Keys: n + len(seqs)})
}

// outcomeMsg is the reply a kept outcome stands for (id = its seq).
func outcomeMsg(o locksm.Outcome) wire.Msg {
	switch o.Status {
	case locksm.StatusGranted:
		// A permit's slot 0 goes without the field: the broker reads a
		// permit acquire's G without a slot as slot 0.
		return wire.Msg{Type: wire.TypeGranted, ID: o.Seq, Token: o.Token, Permit: o.Slot != 0, Slot: o.Slot}
	case locksm.StatusBusy:
		return wire.Msg{Type: wire.TypeBusy, ID: o.Seq}
	case locksm.StatusReleased, locksm.StatusExtended:
		return wire.Msg{Type: wire.TypeOK, ID: o.Seq}
	case locksm.StatusTimedOut:
		return wire.Msg{Type: wire.TypeTimeout, ID: o.Seq}
	case locksm.StatusRejected:
		if o.Err != nil {
			return errReply(o.Seq, o.Err)
		}
	}
	return wire.Msg{Type: wire.TypeError, ID: o.Seq, Code: wire.CodeInternal, Text: "unexpected outcome"}
}

// adopt makes a queued request of s (from the table) owed by this
// leadership, on s's home connection, its wait timer armed from the
// replicated stamps: EnqueuedAt + WaitMs by the proposers' wall clocks,
// against wall, this leader's (skew between leaders moves the bound by
// the skew; a wait bound is no safety property: T still means never
// granted).
func (k *Core[C]) adopt(now time.Time, wall int64, s *session[C], q locksm.SessionQueued) {
	w := &q.Waiter
	if k.pend[w.Ref] != nil {
		return // a ref of this leader's: cannot be (refs start at random)
	}
	left := max(w.EnqueuedAt+int64(w.WaitMs)-wall, 0)
	op := locksm.OpAcquire
	switch {
	case w.Keys != nil:
		op = locksm.OpAcquireBlock
	case q.Permit:
		op = locksm.OpAcquirePermit
	}
	p := &pending[C]{conn: s.home, id: w.Seq, op: op, key: q.Key, keys: w.Keys, owner: w.Owner, leaseSec: w.LeaseSec,
		ref: w.Ref, start: now, deadline: now.Add(time.Duration(left) * time.Millisecond), queued: true, mayWait: true, ext: s.ext}
	k.pend[p.ref] = p
	s.home.owe(p)
	k.sessQueued++
	k.rd.Timers = append(k.rd.Timers, Timer{At: p.deadline, Kind: TimerWait, Key: p.key, Ref: p.ref, Epoch: k.epoch})
	// Owed here from now on: the next walk tells it its place.
	k.moved(now, p.keySet()...)
}

// adoptSessions (Serve) adopts every session of the table: its queued
// requests are owed again, and it gets a full timeout from now.
func (k *Core[C]) adoptSessions(now time.Time, wall int64) {
	for _, id := range k.table.Sessions() {
		info, ok := k.table.Session(id)
		if !ok {
			continue
		}
		s := k.sessions[id]
		if s == nil {
			s = k.newSession(id, info.TimeoutMs)
		}
		s.floor = max(s.floor, info.Floor)
		for _, q := range k.table.SessionWaiters(id) {
			k.adopt(now, wall, s, q)
		}
		if s.conn == nil {
			k.detach(now, s)
		}
	}
}

// rearmSessions gives every session without a connection a full timeout
// from now (serving again after a hand-over that failed: expiries
// proposed meanwhile may have been refused).
func (k *Core[C]) rearmSessions(now time.Time) {
	for _, id := range sortedSessionIDs(k.sessions) {
		if s := k.sessions[id]; s.conn == nil && !s.expiring {
			k.detach(now, s)
		}
	}
}

// dropSessions forgets every session (leadership lost): the connections
// they are attached to close, so their brokers resume on the next leader.
func (k *Core[C]) dropSessions() {
	for _, id := range sortedSessionIDs(k.sessions) {
		s := k.sessions[id]
		if c := s.conn; c != nil {
			c.sess = nil
			if !c.dead {
				c.closing = true
				k.rd.Closes = append(k.rd.Closes, c.handle)
			}
		}
	}
	clear(k.sessions)
	clear(k.attachingTo)
	clear(k.closingSess)
	clear(k.untold)
	k.clearMarks()
}

func sortedSessionIDs[C comparable](m map[uint64]*session[C]) []uint64 {
	ids := make([]uint64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, cmp.Compare[uint64])
	return ids
}

// sessionProposalFailed answers what a failed session command owed; it
// reports whether c was one (ops 8..12).
func (k *Core[C]) sessionProposalFailed(c *locksm.Command, notAppended bool, addr, id string, err error) bool {
	switch c.Op {
	case locksm.OpOpenSession, locksm.OpResumeSession:
		p := k.attachingTo[c.Session]
		if p == nil || p.op != c.Op || (c.Op == locksm.OpResumeSession && (p.attachment().high != c.Seq || p.attachment().epoch != c.Epoch)) {
			return true
		}
		delete(k.attachingTo, c.Session)
		k.finishAttach(p)
		if notAppended {
			k.send(p.conn, wire.Msg{Type: wire.TypeMoved, ID: p.id, LeaderAddr: addr, LeaderID: id})
		} else {
			k.send(p.conn, wire.Msg{Type: wire.TypeUnknown, ID: p.id, Text: "not committed before " + err.Error() + ": outcome unknown"})
		}
		if s := k.sessions[c.Session]; s != nil {
			k.nextAttach(s)
		}
		return true
	case locksm.OpExpireSession:
		if s := k.sessions[c.Session]; s != nil && s.expiring {
			s.expiring = false
			k.nextAttach(s)
		}
		return true
	case locksm.OpCloseSession:
		if p := k.closingSess[c.Session]; p != nil {
			delete(k.closingSess, c.Session)
			k.finish(p)
			if notAppended {
				k.send(p.conn, wire.Msg{Type: wire.TypeMoved, ID: p.id, LeaderAddr: addr, LeaderID: id})
			} else {
				k.send(p.conn, wire.Msg{Type: wire.TypeUnknown, ID: p.id, Text: "not committed before " + err.Error() + ": outcome unknown"})
			}
		}
		return true
	case locksm.OpDropSessionless:
		return true
	case locksm.OpAckSession:
		if s := k.sessions[c.Session]; s != nil {
			s.acking = false
		}
		return true
	}
	return false
}
