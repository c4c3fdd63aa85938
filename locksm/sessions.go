package locksm

import (
	"maps"
	"slices"
)

// session is one broker's session (docs/sessions.md, MATRIX.md
// "Sessions"). Its indexes let an expiry find its waiters and holdings in
// O(their number), and a lock command check its seq in O(1).
type session struct {
	hash      string
	timeoutMs uint32
	openedAt  int64
	// floor: a lock command with seq <= floor is void.
	floor uint64
	// serial is the last serial given to an outcome; ack the broker's
	// watermark (never above serial, never lowered).
	serial, ack uint64
	// epoch counts resumes.
	epoch uint64
	// outcomes are the kept outcomes, serials ack+1..serial in order:
	// outcomes[i].Serial == ack+1+i: a window into base, trimmed by
	// re-slicing its front. A Frozen view shares the array (snapSessions),
	// so an element it may read is never written again: appends write past
	// every view's end, and the window moves back to the front of base
	// (compact) only if base was allocated in the current generation,
	// after the last Freeze; otherwise it moves to a new array.
	outcomes []Outcome
	base     []Outcome // the whole array outcomes lies in (len == cap)
	baseGen  uint32    // State.gen when base was allocated
	// bySeq maps the seq of every kept outcome to its serial.
	bySeq map[uint64]uint64
	// waiters maps the seq of every queued request of the session to where
	// it stands: its key (a block's primary key) and ref.
	waiters map[uint64]sessionWaiter
	// holdings maps the token of every holding granted for the session to
	// one of its keys (a block's primary key).
	holdings map[uint64]string
}

type sessionWaiter struct {
	key string
	ref uint64
}

// maxSerial bounds the serial counter a snapshot may carry (2^62 outcomes
// are out of reach), so that counting on never wraps.
const maxSerial = 1 << 62

func newSession(hash string, timeoutMs uint32, openedAt int64) *session {
	return &session{
		hash: hash, timeoutMs: timeoutMs, openedAt: openedAt,
		bySeq:    make(map[uint64]uint64),
		waiters:  make(map[uint64]sessionWaiter),
		holdings: make(map[uint64]string),
	}
}

// record keeps o as the session's next outcome and returns its serial;
// gen is the State's generation. A broker that acks promptly keeps a
// window of a few outcomes that slides along base: moving it back to the
// front now and then costs no allocation (TestSessionHandoffAllocations).
func (ss *session) record(o Outcome, gen uint32) uint64 {
	if n := len(ss.outcomes); n == cap(ss.outcomes) {
		if ss.baseGen == gen && len(ss.base) > 0 && n <= len(ss.base)/2 && len(ss.base) <= max(64, 8*n) {
			copy(ss.base, ss.outcomes) // memmove; no view shares base
			ss.outcomes = ss.base[:n]
		} else {
			ss.base = make([]Outcome, max(8, 2*n))
			ss.outcomes = ss.base[:copy(ss.base, ss.outcomes)]
			ss.baseGen = gen
		}
	}
	ss.serial++
	o.Serial = ss.serial
	ss.outcomes = append(ss.outcomes, o)
	ss.bySeq[o.Seq] = ss.serial
	return ss.serial
}

// trim drops the outcomes with serial <= ack. The watermark never goes
// down, and never above the last serial given: a broker cannot have the
// reply of an outcome not recorded yet, and acknowledging it early would
// drop that outcome the moment it is recorded.
func (ss *session) trim(ack uint64) {
	ack = min(ack, ss.serial)
	if ack <= ss.ack {
		return
	}
	n := ack - ss.ack
	for _, o := range ss.outcomes[:n] {
		delete(ss.bySeq, o.Seq)
	}
	ss.outcomes = ss.outcomes[n:]
	ss.ack = ack
}

// has reports whether seq has a kept outcome or a queued waiter.
func (ss *session) has(seq uint64) bool {
	if _, ok := ss.bySeq[seq]; ok {
		return true
	}
	_, ok := ss.waiters[seq]
	return ok
}

func (ss *session) info(id uint64) SessionInfo {
	return SessionInfo{
		ID: id, SecretHash: ss.hash, TimeoutMs: ss.timeoutMs, Floor: ss.floor, Serial: ss.serial, Ack: ss.ack,
		Epoch: ss.epoch, OpenedAt: ss.openedAt,
		Outcomes: len(ss.outcomes), Waiters: len(ss.waiters), Holdings: len(ss.holdings),
	}
}

// validateSessionCommand checks the stateless fields of ops 8..12.
func validateSessionCommand(cmd *Command) error {
	switch cmd.Op {
	case OpOpenSession:
		if cmd.Session == 0 || len(cmd.SecretHash) != SecretHashLen ||
			cmd.TimeoutMs < MinSessionTimeoutMs || cmd.TimeoutMs > MaxSessionTimeoutMs {
			return ErrInvalidSession
		}
	case OpResumeSession, OpExpireSession, OpCloseSession, OpAckSession:
		if cmd.Session == 0 {
			return ErrInvalidSession
		}
	}
	return nil
}

// sessionCheck decides whether a lock command of a session applies: the
// session must exist, its seq must be above the floor and new. It returns
// the session, or nil and the rejection. A command that passes drops the
// outcomes its Ack acknowledges.
func (s *State) sessionCheck(cmd *Command) (*session, result) {
	ss := s.sessions[cmd.Session]
	switch {
	case ss == nil:
		return nil, result{Status: StatusRejected, Err: ErrNoSession}
	case cmd.Seq <= ss.floor:
		return nil, result{Status: StatusRejected, Err: ErrVoided}
	case ss.has(cmd.Seq):
		return nil, result{Status: StatusRejected, Err: ErrDuplicateSeq}
	}
	ss.trim(cmd.Ack)
	s.sessionAcked(cmd.Session, ss)
	return ss, result{}
}

// recordCommand records what a lock command of session ss did: a queued
// request is indexed as the session's waiter (its outcome comes later); any
// other result is final and kept as an outcome, whose serial is returned.
func (s *State) recordCommand(ss *session, cmd *Command, res *result) uint64 {
	key := cmd.Key
	if cmd.Op == OpAcquireBlock {
		key = cmd.Keys[0]
	}
	switch res.Status {
	case StatusQueued:
		ss.waiters[cmd.Seq] = sessionWaiter{key: key, ref: cmd.Ref}
		return 0
	case StatusGranted:
		ss.holdings[res.Token] = key
	}
	o := Outcome{Seq: cmd.Seq, Status: res.Status, Token: res.Token, Err: res.Err}
	if res.Status == StatusGranted {
		o.Slot = res.N // 0 for a lock
	}
	return ss.record(o, s.gen)
}

// waiterGranted records the hand-off of session waiter w (standing on key,
// its primary key) under token (a permit's: in slot), and returns the
// outcome's serial.
func (s *State) waiterGranted(w *Waiter, key string, token uint64, slot uint32) uint64 {
	ss := s.sessions[w.Session]
	delete(ss.waiters, w.Seq)
	ss.holdings[token] = key
	return ss.record(Outcome{Seq: w.Seq, Status: StatusGranted, Token: token, Slot: slot}, s.gen)
}

// waiterTimedOut records that session waiter w left its queues without a
// grant (cancel, drop-waiters) and returns the outcome's serial.
func (s *State) waiterTimedOut(w *Waiter) uint64 {
	ss := s.sessions[w.Session]
	delete(ss.waiters, w.Seq)
	return ss.record(Outcome{Seq: w.Seq, Status: StatusTimedOut}, s.gen)
}

// endHoldingOf ends the holding under token on key (a session's): a
// lock's, or a semaphore's permit.
func (s *State) endHoldingOf(key string, token uint64, now int64, effects []Effect) []Effect {
	if m := s.sems[key]; m != nil {
		return s.endPermit(key, m, m.slotOf[token], now, effects)
	}
	return s.endHolding(key, s.keys[key], now, effects)
}

// SessionHolds reports whether session id still holds the holding granted
// to it under token (false once it ended, however, or if the session is
// gone).
func (s *State) SessionHolds(id, token uint64) bool {
	ss := s.sessions[id]
	if ss == nil {
		return false
	}
	_, ok := ss.holdings[token]
	return ok
}

// holdingEnded forgets token among the holdings of session id.
func (s *State) holdingEnded(id, token uint64) {
	if ss := s.sessions[id]; ss != nil {
		delete(ss.holdings, token)
	}
}

func (s *State) openSession(cmd *Command) result {
	if s.sessions[cmd.Session] != nil {
		return result{Status: StatusRejected, Err: ErrSessionExists}
	}
	s.sessions[cmd.Session] = newSession(cmd.SecretHash, cmd.TimeoutMs, cmd.Now)
	return result{Status: StatusOpened}
}

func (s *State) resumeSession(cmd *Command) result {
	ss := s.sessions[cmd.Session]
	switch {
	case ss == nil:
		return result{Status: StatusRejected, Err: ErrNoSession}
	case cmd.Epoch != ss.epoch:
		return result{Status: StatusRejected, Err: ErrStaleEpoch}
	}
	ss.epoch++
	ss.floor = max(ss.floor, cmd.Seq)
	ss.trim(cmd.Ack)
	s.sessionAcked(cmd.Session, ss)
	return result{Status: StatusResumed}
}

// ackSession drops the outcomes of cmd.Session up to cmd.Ack (clamped to
// its last serial, never lowered: session.trim), as a lock command's Ack
// does; Noop if the session ended.
func (s *State) ackSession(cmd *Command) result {
	ss := s.sessions[cmd.Session]
	if ss == nil {
		return result{Status: StatusNoop}
	}
	ss.trim(cmd.Ack)
	s.sessionAcked(cmd.Session, ss)
	return result{Status: StatusAcked}
}

// endSession expires (expire: epoch checked, Tokens released) or closes
// the session cmd.Session. First every waiter of it leaves every queue
// (seq order, one EffectTimedOut each, nothing recorded: the session
// goes), and only then are the keys of its blocks decided again, so none
// of them can be handed to another waiter of the same session. Then each
// holding named in Tokens that the session holds is released, handing off
// to the next waiter as a release does. Every other holding of the session
// keeps its lease and forgets the session: an id may be opened again, and
// a holding must never count as a later session's (a restored replica
// could not tell them apart).
func (s *State) endSession(cmd *Command, effects []Effect) (result, []Effect) {
	ss := s.sessions[cmd.Session]
	if ss == nil || (cmd.Op == OpExpireSession && cmd.Epoch != ss.epoch) {
		return result{Status: StatusNoop}, effects
	}
	var decide []string
	for _, seq := range slices.Sorted(maps.Keys(ss.waiters)) {
		sw := ss.waiters[seq]
		if m := s.sems[sw.key]; m != nil {
			w := m.queue.ws[m.queue.find(sw.ref)]
			s.takeWaiterLabel(sw.key, &w)
			effects = append(effects, Effect{
				Kind: EffectTimedOut, Key: sw.key, Owner: w.Owner, Ref: w.Ref, Session: w.Session, Seq: w.Seq,
			})
			s.waiting--
			s.removePermitWaiter(sw.key, w.Ref)
			continue
		}
		e := s.keys[sw.key]
		w := e.queue.ws[e.queue.find(sw.ref)]
		s.takeWaiterLabel(sw.key, &w)
		effects = append(effects, Effect{
			Kind: EffectTimedOut, Key: sw.key, Keys: w.Keys, Owner: w.Owner, Ref: w.Ref, Session: w.Session, Seq: w.Seq,
		})
		s.waiting--
		if w.Keys == nil {
			s.removeWaiter(sw.key, w.Ref)
			continue
		}
		delete(s.blockWaiters, w.Ref)
		for _, k := range w.Keys {
			s.removeWaiter(k, w.Ref)
		}
		decide = append(decide, w.Keys...)
	}
	clear(ss.waiters)
	for _, k := range decide {
		effects = s.promote(k, cmd.Now, effects)
	}
	if cmd.Op == OpExpireSession {
		for _, t := range cmd.Tokens {
			if key, ok := ss.holdings[t]; ok {
				effects = s.endHoldingOf(key, t, cmd.Now, effects)
			}
		}
	}
	if cmd.Op == OpCloseSession && !s.legacyMatch {
		// A broker's clean stop releases what its session holds, as
		// closing an etcd session revokes its lease and a ZooKeeper
		// session's close deletes its ephemeral nodes: a stopping
		// sidecar has ended every caller's connection, and a grant that
		// reached it during the stop (a hand-off to a waiter whose caller
		// had just been told "not acquired") would otherwise keep its key
		// for a lease with nobody to release it (issue 39, finding 6).
		for _, t := range slices.Sorted(maps.Keys(ss.holdings)) {
			if key, ok := ss.holdings[t]; ok {
				effects = s.endHoldingOf(key, t, cmd.Now, effects)
			}
		}
	}
	for t, key := range ss.holdings {
		if m := s.sems[key]; m != nil {
			m = s.ownSem(key, m)
			slot := m.slotOf[t]
			p := m.held[slot]
			p.session, p.seq = 0, 0
			m.held[slot] = p
			continue
		}
		keys := []string{key}
		if b, ok := s.blocks[t]; ok {
			keys = b
		}
		for _, k := range keys {
			e := s.own(k, s.keys[k])
			e.session, e.seq = 0, 0
		}
	}
	delete(s.sessions, cmd.Session)
	s.forgetSessionRevokes(cmd.Session)
	status := StatusSessionClosed
	if cmd.Op == OpExpireSession {
		status = StatusSessionExpired
	}
	return result{Status: status}, effects
}

// dropSessionless removes every waiter without a session, as dropWaiters
// removes them all (same effects, same order), and then decides every key
// that had waiters again in ascending order: a reserved key whose head
// block left may now go to a session's waiter, or be deleted.
func (s *State) dropSessionless(effects []Effect) (result, []Effect) {
	n := 0
	for _, ss := range s.sessions {
		n += len(ss.waiters)
	}
	if n == 0 {
		return s.dropWaiters(effects)
	}
	keys := s.queuedKeys()
	type gone struct {
		key string
		w   Waiter
	}
	var drop []gone
	told := map[uint64]bool{}
	for _, k := range keys {
		s.queueOf(k).each(func(w *Waiter) {
			if w.Session != 0 {
				return
			}
			if w.Keys != nil {
				if told[w.Ref] {
					return
				}
				told[w.Ref] = true
			}
			effects = append(effects, Effect{Kind: EffectDropped, Key: w.primary(k), Keys: w.Keys, Owner: w.Owner, Ref: w.Ref})
			drop = append(drop, gone{k, *w})
			s.takeWaiterLabel(k, w)
		})
	}
	for _, g := range drop {
		s.waiting--
		if s.isSemaphore(g.key) {
			s.removePermitWaiter(g.key, g.w.Ref)
			continue
		}
		if g.w.Keys == nil {
			s.removeWaiter(g.key, g.w.Ref)
			continue
		}
		delete(s.blockWaiters, g.w.Ref)
		for _, k := range g.w.Keys {
			s.removeWaiter(k, g.w.Ref)
		}
	}
	for _, k := range keys {
		if !s.isSemaphore(k) { // a permit waiter leaving frees no permit
			effects = s.promote(k, s.clock, effects)
		}
	}
	return result{Status: StatusDropped}, effects
}

// Session returns the live session id.
func (s *State) Session(id uint64) (SessionInfo, bool) {
	if ss := s.sessions[id]; ss != nil {
		return ss.info(id), true
	}
	return SessionInfo{}, false
}

// SessionOutcome returns the kept outcome of seq in session id: false if
// the session is unknown, or seq has no outcome kept (never applied, still
// queued, voided, or acknowledged).
func (s *State) SessionOutcome(id, seq uint64) (Outcome, bool) {
	ss := s.sessions[id]
	if ss == nil {
		return Outcome{}, false
	}
	serial, ok := ss.bySeq[seq]
	if !ok {
		return Outcome{}, false
	}
	if i := serial - ss.ack - 1; i < uint64(len(ss.outcomes)) {
		return ss.outcomes[i], true
	}
	return Outcome{}, false // unreachable: bySeq and outcomes agree
}

// SessionOutcomes returns a copy of the kept outcomes of session id, in
// serial order (nil if none or unknown).
func (s *State) SessionOutcomes(id uint64) []Outcome {
	if ss := s.sessions[id]; ss != nil && len(ss.outcomes) > 0 {
		return slices.Clone(ss.outcomes)
	}
	return nil
}

// SessionWaiter locates the still queued request seq of session id.
func (s *State) SessionWaiter(id, seq uint64) (SessionWaiter, bool) {
	ss := s.sessions[id]
	if ss == nil {
		return SessionWaiter{}, false
	}
	sw, ok := ss.waiters[seq]
	if !ok {
		return SessionWaiter{}, false
	}
	q := s.queueOf(sw.key)
	return SessionWaiter{Key: sw.key, Keys: q.ws[q.find(sw.ref)].Keys, Ref: sw.ref}, true
}

// SessionWaiters lists the still queued requests of session id in seq
// order (nil if none or unknown): each with its key (a block's primary
// key) and a copy of its waiter, for a new leader that takes over their
// waits (it re-arms each from EnqueuedAt and WaitMs) and for a resume's
// answer. O(waiters of the session · log of that).
func (s *State) SessionWaiters(id uint64) []SessionQueued {
	ss := s.sessions[id]
	if ss == nil || len(ss.waiters) == 0 {
		return nil
	}
	out := make([]SessionQueued, 0, len(ss.waiters))
	for _, seq := range slices.Sorted(maps.Keys(ss.waiters)) {
		sw := ss.waiters[seq]
		q := s.queueOf(sw.key)
		w := q.ws[q.find(sw.ref)]
		out = append(out, SessionQueued{Key: sw.key, Waiter: w, Label: s.WaiterLabel(sw.key, w), Permit: s.isSemaphore(sw.key)})
	}
	return out
}

// Sessions returns the ids of the live sessions, ascending.
func (s *State) Sessions() []uint64 { return slices.Sorted(maps.Keys(s.sessions)) }

// NumSessions is the number of live sessions.
func (s *State) NumSessions() int { return len(s.sessions) }

// snapSession is what a snapshot carries of a session. Its outcomes share
// the session's array (see session.outcomes for why a Frozen view keeps
// seeing exactly the outcomes of the moment it froze).
type snapSession struct {
	id                        uint64
	hash                      string
	timeoutMs                 uint32
	openedAt                  int64
	floor, serial, ack, epoch uint64
	outcomes                  []Outcome
}

// snapSessions lists the sessions for a snapshot, ids ascending (nil if
// none): O(sessions), no outcome copied.
func (s *State) snapSessions() []snapSession {
	if len(s.sessions) == 0 {
		return nil
	}
	out := make([]snapSession, 0, len(s.sessions))
	for _, id := range s.Sessions() {
		ss := s.sessions[id]
		out = append(out, snapSession{
			id: id, hash: ss.hash, timeoutMs: ss.timeoutMs, openedAt: ss.openedAt,
			floor: ss.floor, serial: ss.serial, ack: ss.ack, epoch: ss.epoch,
			outcomes: ss.outcomes[:len(ss.outcomes):len(ss.outcomes)],
		})
	}
	return out
}

// outcomeErrs are the rejections an outcome can record (all others are
// decided before a session command applies), numbered 1.. in snapshots.
var outcomeErrs = [...]error{ErrNotHeld, ErrTokenMismatch, ErrOwnerMismatch, ErrDuplicateRef, ErrTokensExhausted,
	ErrIsSemaphore, ErrNotSemaphore}

func outcomeErrCode(err error) byte {
	for i, e := range outcomeErrs {
		if e == err {
			return byte(i + 1)
		}
	}
	return 0
}
