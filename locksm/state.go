package locksm

import (
	"maps"
	"math"
	"slices"
	"sync"
	"unique"
)

// State is the whole replicated lock table. The zero value is not usable;
// call New. A State is not safe for concurrent use: the caller (the Raft FSM
// in cluster/) serialises Apply and the read methods.
type State struct {
	// keys holds an entry for every held key and only for those: a key whose
	// holder goes away with an empty queue is deleted, so memory follows the
	// number of held keys, not the number of keys ever seen.
	keys map[string]*entry
	// queued is the subset of keys whose queue is non-empty, so that
	// OpDropWaiters costs O(waiters) rather than O(held keys) when a new
	// leader proposes it with a million held keys.
	queued map[string]*entry
	// last is the highest token ever issued. It only grows; snapshots carry
	// it, so a restored replica continues above every token it ever issued.
	last    uint64
	waiting int
	// blocks maps the token of every held block to its keys (the
	// requester's order); a single-key holding has no entry. Keeping it
	// beside the entries keeps entry small (TestEntrySize).
	blocks map[uint64][]string
	// blockWaiters maps the ref of every queued block to its keys: a
	// queued block's ref is unique in the table, so it names the one
	// waiter that stands in all those queues.
	blockWaiters map[uint64][]string
	// renewed maps the token of every holding that was extended to the
	// Now of its latest OpExtend (Holder.RenewedAt); a holding never
	// extended has no entry, and the entry goes when the holding ends.
	// Like blocks, it lives beside the entries so that entry stays small
	// (TestEntrySize), and the paths that end a holding look at it only when it is
	// non-empty.
	renewed map[uint64]int64
	// labels maps the token of every holding that has a label to it
	// (Holder.Label); a holding without one has no entry, and the entry
	// goes when the holding ends. Beside the entries for the same reason
	// as renewed: a label costs nothing to those that have none.
	labels map[uint64]string
	// waiterLabels maps every queued waiter that has a label, by its
	// primary key and ref (a block's first key: one entry for all its
	// queues), to the label, which it passes to labels when granted. A
	// waiter without a label has no entry, and Waiter has no label field,
	// so a label costs nothing to those that have none
	// (TestWaiterSize; cluster/memory_test.go's bytes per waiter).
	waiterLabels map[waiterRef]string
	// reserved counts entries without a holder (their queue head is a
	// block waiting for its other keys).
	reserved int
	// permitsHeld counts the permits held over all semaphores (sems), so
	// that the leader's MaxKeys bound can count them in O(1).
	permitsHeld int
	// clock is the Now of the latest command that changed the table and
	// carries one (acquires, releases, expiries, extends). A cancel
	// carries no Now, yet the cancel of a queued block can grant keys
	// reserved for it to the waiters behind it; those grants record this
	// as GrantedAt. It is replicated state (snapshots carry it when blocks
	// exist or a holding is extended), so every replica records the same
	// value.
	clock int64
	// spare recycles entries of released keys: an uncontended
	// acquire/release cycle then allocates nothing in steady state.
	spare []*entry
	// spareQ recycles emptied queues (recycleQueue).
	spareQ []*waitQueue
	// gen is the current generation: Freeze increments it. An entry whose
	// gen is older may be shared with a Frozen view and is never written
	// again; own replaces it with a private copy first (copy-on-write).
	// It wraps after 2^32 freezes, by when no view of that age exists.
	gen uint32
	// sessions are the live sessions by id (sessions.go).
	sessions map[uint64]*session
	// legacyMatch: the rules of protocol versions up to 8
	// (SetLegacyMatching): releases and extends are matched by the older
	// rule, and a session's close leaves its holdings to their leases.
	// Not in snapshots: the cluster derives it from its cluster version,
	// which they carry.
	legacyMatch bool
	// extendMayShorten: the rule of protocol versions up to 9
	// (SetExtendMayShorten): an extend sets its holding's lease from its
	// Now, even to end sooner. Not in snapshots, like legacyMatch.
	extendMayShorten bool
	// shortWaits: the rule of protocol versions up to 10 (SetShortWaits):
	// a wait above MaxShortWaitMs is ErrInvalidWait. Not in snapshots,
	// like legacyMatch.
	shortWaits bool
	// sems are the keys defined as semaphores (semaphore.go), apart from
	// keys: a key is in one map or the other, never both.
	sems map[string]*semaphore
	// revokes are the audit records of revokes (revoke.go): the latest
	// of each key, oldest first by log order, at most MaxRevokeRecords.
	// Never written in place (a revoke makes a new slice), so a Frozen
	// view shares it.
	revokes []Revoke
	// sessRevoked: by session, the revokes of its holdings its broker
	// must be told of (SessionRevokes), oldest first; each slice never
	// written in place (a Frozen view shares them, with a copy of the
	// map).
	sessRevoked map[uint64][]SessionRevoke
}

// waiterRef names one queued waiter: its primary key (a block's first
// key) and its ref, unique among the queued waiters (a queue refuses a
// ref twice, and a block's ref is refused in each of its queues).
type waiterRef struct {
	key string
	ref uint64
}

// takeWaiterLabel removes and returns the label of the waiter w queued on
// key ("" if it has none): it leaves its queue.
func (s *State) takeWaiterLabel(key string, w *Waiter) string {
	if len(s.waiterLabels) == 0 {
		return ""
	}
	r := waiterRef{w.primary(key), w.Ref}
	l, ok := s.waiterLabels[r]
	if ok {
		delete(s.waiterLabels, r)
	}
	return l
}

// grantLabel gives the label of waiter w (queued on key), granted under
// token, to its holding.
func (s *State) grantLabel(key string, w *Waiter, token uint64) {
	if l := s.takeWaiterLabel(key, w); l != "" {
		s.labels[token] = l
	}
}

// entry is one held or reserved key. Invariant: an entry exists iff the key
// is held (token != 0) or reserved (token == 0: its queue head is a block
// that cannot be granted yet), so a non-empty queue always has a holder or
// a waiting block in front of it and a free key can never be taken by
// someone who arrived after a waiter.
//
// The holder's fields are inline rather than a Holder, so that gen fits in
// what would be Holder's padding, and the queue is a pointer (nil for the
// million keys nobody waits for). With the holding's session and seq it
// is 64 bytes, the allocator's 64-byte class (48 before sessions; a Holder
// and a queue slice inline took 72, in the 80-byte class).
type entry struct {
	owner     string
	token     uint64
	grantedAt int64
	leaseSec  uint32
	// gen is the State generation this entry was created or copied in.
	gen uint32
	// queue is the key's waiters, FIFO; nil while nobody waits.
	queue *waitQueue
	// session and seq: the session command the holding was granted for
	// (0: none).
	session, seq uint64
}

func (e *entry) holder() Holder {
	return Holder{Owner: e.owner, Token: e.token, LeaseSec: e.leaseSec, GrantedAt: e.grantedAt, Session: e.session, Seq: e.seq}
}

func (e *entry) setHolder(h Holder) {
	e.owner, e.token, e.leaseSec, e.grantedAt = h.Owner, h.Token, h.LeaseSec, h.GrantedAt
	e.session, e.seq = h.Session, h.Seq
}

// intern returns the one shared copy of owner. An owner (a sidecar
// connection) typically holds many keys; without interning every holding
// keeps its own copy of the string: 8 MB more at a million keys held by a
// few owners (BenchmarkGCWith1M's heap).
func intern(owner string) string { return unique.Make(owner).Value() }

// maxSpare bounds the recycled entries kept after a burst of releases; more
// would just pin memory the GC could reclaim.
const maxSpare = 1024

// New returns an empty table whose token counter has issued nothing yet
// (the first grant gets token 1).
func New() *State {
	return &State{
		keys:         make(map[string]*entry),
		queued:       make(map[string]*entry),
		blocks:       make(map[uint64][]string),
		blockWaiters: make(map[uint64][]string),
		renewed:      make(map[uint64]int64),
		labels:       make(map[uint64]string),
		waiterLabels: make(map[waiterRef]string),
		sessions:     make(map[uint64]*session),
		sems:         make(map[string]*semaphore),
	}
}

// ValidateCommand reports the first stateless reason Apply would reject cmd
// for (nil if none), so a leader can refuse a bad request without proposing
// it. Only the fields cmd.Op uses are checked; the others are ignored by
// Apply and not carried by the batch encoding. Tokens are not checked: 0 is
// never issued, so a release or expiry naming it simply matches nothing.
func ValidateCommand(cmd Command) error { return validateCommand(&cmd) }

// validateCommand is ValidateCommand without copying the command (Apply's
// hot path).
func validateCommand(cmd *Command) error {
	switch cmd.Op {
	case OpAcquire, OpAcquirePermit:
		if err := ValidateKey(cmd.Key); err != nil {
			return err
		}
		return validateAcquireFields(cmd)
	case OpSetPermits:
		if err := ValidateKey(cmd.Key); err != nil {
			return err
		}
		if cmd.Permits > MaxPermits {
			return ErrInvalidPermits
		}
		return nil
	case OpRelease:
		if err := ValidateKey(cmd.Key); err != nil {
			return err
		}
		return ValidateOwner(cmd.Owner)
	case OpExpire, OpCancelWait:
		return ValidateKey(cmd.Key)
	case OpExtend:
		if err := ValidateKey(cmd.Key); err != nil {
			return err
		}
		if err := ValidateOwner(cmd.Owner); err != nil {
			return err
		}
		return validateLease(cmd.LeaseSec)
	case OpDropWaiters:
		return nil
	case OpAcquireBlock:
		if err := validateBlockKeys(cmd.Keys); err != nil {
			return err
		}
		return validateAcquireFields(cmd)
	case OpOpenSession, OpResumeSession, OpExpireSession, OpCloseSession, OpDropSessionless, OpAckSession:
		return validateSessionCommand(cmd)
	case OpRevoke:
		if err := ValidateKey(cmd.Key); err != nil {
			return err
		}
		if err := ValidateOwner(cmd.Owner); err != nil {
			return err
		}
		return ValidateReason(cmd.Reason)
	default:
		return ErrInvalidCommand
	}
}

// validateAcquireFields checks what an acquire of one key and of a block
// share, after their keys: owner, label, lease, wait.
func validateAcquireFields(cmd *Command) error {
	if err := ValidateOwner(cmd.Owner); err != nil {
		return err
	}
	if err := ValidateLabel(cmd.Label); err != nil {
		return err
	}
	if err := validateLease(cmd.LeaseSec); err != nil {
		return err
	}
	if cmd.WaitMs > MaxWaitMs {
		return ErrInvalidWait
	}
	return nil
}

// validateLease checks a lease: MinLeaseSec..MaxLeaseSec, never clamped.
func validateLease(leaseSec uint32) error {
	if leaseSec < MinLeaseSec || leaseSec > MaxLeaseSec {
		return ErrInvalidLease
	}
	return nil
}

// validateBlockKeys checks a block's keys: the count, each key, then that
// none is named twice (a quadratic scan: at most 16 keys).
func validateBlockKeys(keys []string) error {
	if len(keys) < MinBlockKeys || len(keys) > MaxBlockKeys {
		return ErrInvalidBlock
	}
	for _, k := range keys {
		if err := ValidateKey(k); err != nil {
			return err
		}
	}
	for i := 1; i < len(keys); i++ {
		if slices.Contains(keys[:i], keys[i]) {
			return ErrInvalidBlock
		}
	}
	return nil
}

// Apply applies one command, appending any effects it owes to effects, and
// returns the command's own result and the extended effects slice. Effects
// come in a deterministic order. Apply never panics on a bad command: it
// returns StatusRejected with a sentinel error and leaves the state as it was.
//
// Apply never looks at a clock and never decides that a lease ran out: cmd.Now
// is only recorded (GrantedAt, EnqueuedAt, RenewedAt). See the package
// documentation.
//
// A lock command of a session (Session != 0) applies only if the session
// exists and its seq is above the floor and new; then its final result is
// recorded as the session's next outcome (Result.Serial), or, if it queued,
// when a later command grants or times it out (Effect.Serial).
func (s *State) Apply(cmd Command, effects []Effect) (Result, []Effect) {
	r, serial, effects := s.apply(&cmd, effects)
	out := Result{Status: r.Status, Token: r.Token, Err: r.Err, Serial: serial}
	switch r.Status {
	case StatusExtended:
		out.LeaseSec = r.N
	case StatusGranted, StatusRevoked:
		out.Slot = r.N
	}
	return out, effects
}

// result is Result without Serial. Four words, so the compiler keeps it
// in registers through the internal calls; Result's five words go through
// memory at every return and copy (BenchmarkApplyHandoff +15%).
type result struct {
	Status Status
	// N shares Status's word: Result.LeaseSec of StatusExtended, or
	// Result.Slot of StatusGranted and StatusRevoked.
	N     uint32
	Token uint64
	Err   error
}

func (s *State) apply(cmd *Command, effects []Effect) (result, uint64, []Effect) {
	if err := validateCommand(cmd); err != nil {
		return result{Status: StatusRejected, Err: err}, 0, effects
	}
	if s.shortWaits && cmd.WaitMs > MaxShortWaitMs && (cmd.Op == OpAcquire || cmd.Op == OpAcquireBlock || cmd.Op == OpAcquirePermit) {
		return result{Status: StatusRejected, Err: ErrInvalidWait}, 0, effects
	}
	var ss *session
	if cmd.Session != 0 && sessionBearing(cmd.Op) {
		var rej result
		if ss, rej = s.sessionCheck(cmd); ss == nil {
			return rej, 0, effects
		}
	}
	var res result
	var m *semaphore // the semaphore cmd.Key names, if any
	if len(s.sems) > 0 && cmd.Key != "" {
		m = s.sems[cmd.Key]
	}
	switch cmd.Op {
	case OpAcquire:
		if m != nil {
			res = result{Status: StatusRejected, Err: ErrIsSemaphore}
			break
		}
		res = s.acquire(cmd)
	case OpAcquirePermit:
		res = s.acquirePermit(cmd)
	case OpSetPermits:
		res, effects = s.setPermits(cmd, effects)
	case OpRelease:
		if m != nil {
			res, effects = s.releasePermit(m, cmd, effects)
			break
		}
		res, effects = s.release(cmd, effects)
	case OpExpire:
		if m != nil {
			res, effects = s.expirePermit(m, cmd, effects)
			break
		}
		res, effects = s.expire(cmd, effects)
	case OpCancelWait:
		if m != nil {
			res, effects = s.cancelPermitWait(m, cmd, effects)
			return res, 0, effects
		}
		res, effects = s.cancelWait(cmd, effects)
		return res, 0, effects
	case OpAcquireBlock:
		if len(s.sems) > 0 && slices.ContainsFunc(cmd.Keys, s.isSemaphore) {
			res = result{Status: StatusRejected, Err: ErrIsSemaphore}
			break
		}
		res = s.acquireBlock(cmd)
	case OpExtend:
		if m != nil {
			res = s.extendPermit(m, cmd)
			break
		}
		res = s.extend(cmd)
	case OpDropWaiters:
		res, effects = s.dropWaiters(effects)
		return res, 0, effects
	case OpOpenSession:
		return s.openSession(cmd), 0, effects
	case OpResumeSession:
		return s.resumeSession(cmd), 0, effects
	case OpExpireSession, OpCloseSession:
		res, effects = s.endSession(cmd, effects)
	case OpAckSession:
		return s.ackSession(cmd), 0, effects
	case OpRevoke:
		res, effects = s.revoke(m, cmd, effects)
	default: // OpDropSessionless; validateCommand rejected everything else
		res, effects = s.dropSessionless(effects)
		return res, 0, effects
	}
	switch res.Status {
	case StatusGranted, StatusQueued, StatusReleased, StatusExpired, StatusExtended,
		StatusSessionExpired, StatusSessionClosed, StatusPermitsSet, StatusRevoked:
		s.clock = cmd.Now
	}
	if ss != nil {
		return res, s.recordCommand(ss, cmd, &res), effects
	}
	return res, 0, effects
}

func (s *State) acquire(cmd *Command) result {
	e := s.keys[cmd.Key]
	if e == nil {
		if s.last == math.MaxUint64 {
			return result{Status: StatusRejected, Err: ErrTokensExhausted}
		}
		s.last++
		e = s.newEntry()
		e.setHolder(Holder{Owner: intern(cmd.Owner), Token: s.last, LeaseSec: cmd.LeaseSec, GrantedAt: cmd.Now,
			Session: cmd.Session, Seq: cmd.Seq})
		s.keys[cmd.Key] = e
		if cmd.Label != "" {
			s.labels[s.last] = cmd.Label
		}
		return result{Status: StatusGranted, Token: s.last}
	}
	// Held, possibly by cmd.Owner itself: not reentrant, so no owner check.
	if cmd.WaitMs == 0 {
		return result{Status: StatusBusy}
	}
	if e.queue.find(cmd.Ref) >= 0 {
		return result{Status: StatusRejected, Err: ErrDuplicateRef}
	}
	e = s.own(cmd.Key, e)
	s.enqueue(cmd.Key, e, Waiter{
		Owner: intern(cmd.Owner), Ref: cmd.Ref, LeaseSec: cmd.LeaseSec, WaitMs: cmd.WaitMs, EnqueuedAt: cmd.Now,
		Session: cmd.Session, Seq: cmd.Seq,
	})
	if cmd.Label != "" {
		s.waiterLabels[waiterRef{cmd.Key, cmd.Ref}] = cmd.Label
	}
	s.waiting++
	return result{Status: StatusQueued}
}

// acquireBlock grants every key of cmd.Keys at once if none has an entry
// (no holder, no queue), or queues one waiter on all of them in this
// command.
func (s *State) acquireBlock(cmd *Command) result {
	free := true
	for _, k := range cmd.Keys {
		if s.keys[k] != nil {
			free = false
			break
		}
	}
	if free {
		if s.last == math.MaxUint64 {
			return result{Status: StatusRejected, Err: ErrTokensExhausted}
		}
		s.last++
		owner := intern(cmd.Owner)
		for _, k := range cmd.Keys {
			e := s.newEntry()
			e.setHolder(Holder{Owner: owner, Token: s.last, LeaseSec: cmd.LeaseSec, GrantedAt: cmd.Now,
				Session: cmd.Session, Seq: cmd.Seq})
			s.keys[k] = e
		}
		s.blocks[s.last] = cmd.Keys
		if cmd.Label != "" {
			s.labels[s.last] = cmd.Label
		}
		return result{Status: StatusGranted, Token: s.last}
	}
	if cmd.WaitMs == 0 {
		return result{Status: StatusBusy}
	}
	if _, dup := s.blockWaiters[cmd.Ref]; dup {
		return result{Status: StatusRejected, Err: ErrDuplicateRef}
	}
	for _, k := range cmd.Keys {
		if e := s.keys[k]; e != nil && e.queue.find(cmd.Ref) >= 0 {
			return result{Status: StatusRejected, Err: ErrDuplicateRef}
		}
	}
	w := Waiter{
		Owner: intern(cmd.Owner), Ref: cmd.Ref, LeaseSec: cmd.LeaseSec, WaitMs: cmd.WaitMs, EnqueuedAt: cmd.Now,
		Keys: cmd.Keys, Session: cmd.Session, Seq: cmd.Seq,
	}
	for _, k := range cmd.Keys {
		e := s.keys[k]
		if e == nil {
			// Free: reserved for the block from now on.
			e = s.newEntry()
			s.keys[k] = e
			s.reserved++
		} else {
			e = s.own(k, e)
		}
		s.enqueue(k, e, w)
	}
	s.blockWaiters[cmd.Ref] = cmd.Keys
	if cmd.Label != "" {
		s.waiterLabels[waiterRef{cmd.Keys[0], cmd.Ref}] = cmd.Label
	}
	s.waiting++
	return result{Status: StatusQueued}
}

func (s *State) release(cmd *Command, effects []Effect) (result, []Effect) {
	e, err := s.matchHolder(cmd)
	if err != nil {
		return result{Status: StatusRejected, Err: err}, effects
	}
	return result{Status: StatusReleased}, s.endHolding(cmd.Key, e, cmd.Now, effects)
}

// matchHolder returns the entry of cmd.Key if cmd (a release or an
// extend) names its holding exactly: the token, the owner and, for a
// holding granted under a session, that session. Anything else is
// ErrNotHeld, whichever part is wrong: neither the token nor the owner is
// a secret (tokens are sequential, owners readable names), so an answer
// that told a wrong owner from a wrong token would let a client with the
// cluster's secret find a holding's token in one probe and then guess its
// owner one try at a time, and release or extend someone else's lock
// (issue 39, finding 8). The session is the one part a stranger cannot
// name: a session's commands reach the log only over a connection that
// proved the session's secret. A holding whose session ended forgot it
// (Session 0) and is matched by token and owner, as it was granted.
//
// With legacyMatch (a cluster not yet all on protocol version 9) it is
// the older rule: the token, then the owner, each with its own error,
// and no session check, so that every replica of a mixed cluster applies
// the same entry the same way.
func (s *State) matchHolder(cmd *Command) (*entry, error) {
	e := s.keys[cmd.Key]
	if s.legacyMatch {
		switch {
		case e == nil || e.token == 0:
			return nil, ErrNotHeld
		case e.token != cmd.Token:
			return nil, ErrTokenMismatch
		case e.owner != cmd.Owner:
			return nil, ErrOwnerMismatch
		}
		return e, nil
	}
	if e == nil || e.token == 0 || e.token != cmd.Token || e.owner != cmd.Owner ||
		(e.session != 0 && e.session != cmd.Session) {
		return nil, ErrNotHeld
	}
	return e, nil
}

// MatchesHolding reports whether a release or an extend of key by owner
// under token, from session (0: none), names its holding exactly as
// matchHolder requires, so that it would apply now: the leader counts only
// such an extend as in flight (a due lease timer of its token waits for
// it). The fields come as values: the leader calls it through an
// interface for every extend, and a *Command would make its command
// escape to the heap on every request.
func (s *State) MatchesHolding(key, owner string, token, session uint64) bool {
	if m := s.sems[key]; m != nil {
		_, err := s.matchPermit(m, &Command{Key: key, Owner: owner, Token: token, Session: session})
		return err == nil
	}
	_, err := s.matchHolder(&Command{Key: key, Owner: owner, Token: token, Session: session})
	return err == nil
}

// SetLegacyMatching chooses how a release or an extend is matched to its
// holding, and what a session's close does with its holdings: on, the
// rules of protocol versions up to 8 (wrong token ErrTokenMismatch, then
// wrong owner ErrOwnerMismatch, no session check; a close leaves the
// holdings to their leases); off (New's default), the rules of version 9
// (matchHolder; a close releases every holding of the session).
// It is part of the replicated semantics: the caller must set it from
// replicated state (the cluster sets it from the cluster version in the
// log), so that every replica applies every entry alike.
func (s *State) SetLegacyMatching(on bool) { s.legacyMatch = on }

// SetExtendMayShorten chooses what an extend does to a holding whose
// lease is longer than the extend asks for: on, the rule of protocol
// versions up to 9 (the lease becomes the extend's, counted from its Now,
// and may end sooner than before); off (New's default), the rule of
// version 10: an extend never lowers a holding's lease, it renews the
// longer one from its Now (Result.LeaseSec says which). An extend that
// was answered indeterminate, or never answered, may reach the leader
// after a later extend was told it succeeded; under the older rule a
// shorter one then cut that lease short and the key went to another
// caller inside it (issue 39, attack round 5). No time is compared (a
// leader's clock may jump): lease lengths only. Like SetLegacyMatching
// it is part of the replicated semantics: the caller sets it from the
// cluster version in the log.
func (s *State) SetExtendMayShorten(on bool) { s.extendMayShorten = on }

// SetShortWaits chooses the longest wait an acquire may ask for: on, the
// rule of protocol versions up to 10 (MaxShortWaitMs, 5 minutes; a longer
// wait is ErrInvalidWait); off (New's default), the rule of version 11
// (MaxWaitMs, one hour). A leader proposes a longer wait only once every
// member runs version 11, so no entry should meet the older rule; the
// switch makes sure of it, since a replica of an older build would reject
// what the others queue. Like SetLegacyMatching it is part of the
// replicated semantics: the caller sets it from the cluster version in
// the log.
func (s *State) SetShortWaits(on bool) { s.shortWaits = on }

// extend renews the lease of the holding of cmd.Key, matched exactly as a
// release matches (matchHolder): the holding's lease becomes cmd.LeaseSec from cmd.Now.
// For a block every key's entry gets the lease (their leaseSec fields
// stay equal) and the holding gets one renewal time. Token, grant time and
// queues stay as they are; no effects.
func (s *State) extend(cmd *Command) result {
	e, err := s.matchHolder(cmd)
	if err != nil {
		return result{Status: StatusRejected, Err: err}
	}
	lease := cmd.LeaseSec
	if !s.extendMayShorten {
		lease = max(lease, e.leaseSec)
	}
	if keys, ok := s.blocks[e.token]; ok {
		for _, k := range keys {
			s.own(k, s.keys[k]).leaseSec = lease
		}
	} else {
		s.own(cmd.Key, e).leaseSec = lease
	}
	s.renewed[e.token] = cmd.Now
	return result{Status: StatusExtended, N: lease}
}

// expire deliberately ignores the owner: the leader's lease timer knows only
// (key, token), and the token alone identifies one holding.
func (s *State) expire(cmd *Command, effects []Effect) (result, []Effect) {
	e := s.keys[cmd.Key]
	if e == nil || e.token == 0 || e.token != cmd.Token {
		// Stale: released, expired or handed off before this committed.
		return result{Status: StatusNoop}, effects
	}
	return result{Status: StatusExpired}, s.endHolding(cmd.Key, e, cmd.Now, effects)
}

// endHolding ends the holding of key (entry e): the key alone, or every key
// of its block, and forgets its renewal, if any. Every key loses its
// holder first; then each, in the block's order, goes to its queue head
// (promote), so the key is never observably free while someone waits and
// nobody can cut the line.
func (s *State) endHolding(key string, e *entry, now int64, effects []Effect) []Effect {
	if e.session != 0 {
		s.holdingEnded(e.session, e.token)
	}
	if len(s.renewed) > 0 {
		delete(s.renewed, e.token)
	}
	if len(s.labels) > 0 {
		delete(s.labels, e.token)
	}
	if len(s.blocks) > 0 {
		if keys, ok := s.blocks[e.token]; ok {
			delete(s.blocks, e.token)
			for _, k := range keys {
				s.clearHolder(k)
			}
			for _, k := range keys {
				effects = s.promote(k, now, effects)
			}
			return effects
		}
	}
	if e.queue.len() == 0 {
		// The common case, kept free of the map writes below.
		delete(s.keys, key)
		s.recycle(e)
		return effects
	}
	if w := *e.queue.head(); w.Keys == nil && s.last != math.MaxUint64 {
		// A single key handed to a single-key head: what promote would
		// do, without its lookups (BenchmarkApplyHandoff: 220 → 150 ns).
		e = s.own(key, e)
		e.queue.popHead()
		s.waiting--
		s.dequeued(key, e)
		s.last++
		e.setHolder(Holder{Owner: w.Owner, Token: s.last, LeaseSec: w.LeaseSec, GrantedAt: now, Session: w.Session, Seq: w.Seq})
		s.grantLabel(key, &w, s.last)
		eff := Effect{
			Kind: EffectGranted, Key: key, Owner: w.Owner, Ref: w.Ref, Token: s.last, LeaseSec: w.LeaseSec,
			Session: w.Session, Seq: w.Seq,
		}
		if w.Session != 0 {
			eff.Serial = s.waiterGranted(&w, key, s.last, 0)
		}
		return append(effects, eff)
	}
	s.clearHolder(key)
	return s.promote(key, now, effects)
}

// clearHolder makes held key unheld: it becomes reserved until promote
// decides what it is.
func (s *State) clearHolder(key string) {
	e := s.own(key, s.keys[key])
	e.setHolder(Holder{})
	s.reserved++
}

// promote decides what unheld key becomes: deleted when nobody waits;
// held by its head if the head is a single-key waiter, or a block that
// now stands first on all its keys, none of them held (then every key of
// the block is granted); otherwise it stays reserved for its head.
func (s *State) promote(key string, now int64, effects []Effect) []Effect {
	e := s.keys[key]
	if e == nil || e.token != 0 {
		return effects
	}
	if e.queue.len() == 0 {
		delete(s.keys, key)
		s.reserved--
		s.recycle(e)
		return effects
	}
	if s.last == math.MaxUint64 {
		return s.exhausted(key, effects)
	}
	w := *e.queue.head()
	if w.Keys == nil {
		s.popHead(key)
		s.last++
		e = s.keys[key]
		e.setHolder(Holder{Owner: w.Owner, Token: s.last, LeaseSec: w.LeaseSec, GrantedAt: now, Session: w.Session, Seq: w.Seq})
		s.reserved--
		s.grantLabel(key, &w, s.last)
		eff := Effect{
			Kind: EffectGranted, Key: key, Owner: w.Owner, Ref: w.Ref, Token: s.last, LeaseSec: w.LeaseSec,
			Session: w.Session, Seq: w.Seq,
		}
		if w.Session != 0 {
			eff.Serial = s.waiterGranted(&w, key, s.last, 0)
		}
		return append(effects, eff)
	}
	if !s.grantable(w) {
		return effects // still waits for a holder or a waiter ahead
	}
	s.last++
	for _, k := range w.Keys {
		s.popHead(k)
		s.keys[k].setHolder(Holder{Owner: w.Owner, Token: s.last, LeaseSec: w.LeaseSec, GrantedAt: now, Session: w.Session, Seq: w.Seq})
		s.reserved--
	}
	s.waiting += len(w.Keys) - 1 // popHead counted the one waiter once per key
	delete(s.blockWaiters, w.Ref)
	s.blocks[s.last] = w.Keys
	s.grantLabel(key, &w, s.last)
	eff := Effect{
		Kind: EffectGranted, Key: w.Keys[0], Keys: w.Keys, Owner: w.Owner, Ref: w.Ref, Token: s.last, LeaseSec: w.LeaseSec,
		Session: w.Session, Seq: w.Seq,
	}
	if w.Session != 0 {
		eff.Serial = s.waiterGranted(&w, w.Keys[0], s.last, 0)
	}
	return append(effects, eff)
}

// grantable reports whether queued block w stands first on each of its
// keys, none of them held.
func (s *State) grantable(w Waiter) bool {
	for _, k := range w.Keys {
		o := s.keys[k]
		if o == nil || o.token != 0 || o.queue.len() == 0 || o.queue.head().Ref != w.Ref {
			return false
		}
	}
	return true
}

// popHead removes key's queue head, counting it out of waiting.
func (s *State) popHead(key string) {
	e := s.own(key, s.keys[key])
	e.queue.popHead()
	s.waiting--
	s.dequeued(key, e)
}

// exhausted frees unheld key when no token is left to hand it over with
// (only reachable from a crafted snapshot): granting with a reused token
// would break fencing, so every waiter of the key is told it will never be
// granted, and the keys of the blocks among them are decided again.
func (s *State) exhausted(key string, effects []Effect) []Effect {
	e := s.keys[key]
	var others []string
	for _, w := range e.queue.waiters() {
		s.takeWaiterLabel(key, &w)
		eff := Effect{Kind: EffectDropped, Key: w.primary(key), Keys: w.Keys, Owner: w.Owner, Ref: w.Ref, Session: w.Session, Seq: w.Seq}
		if w.Session != 0 {
			eff.Serial = s.waiterTimedOut(&w)
		}
		effects = append(effects, eff)
		if w.Keys != nil {
			delete(s.blockWaiters, w.Ref)
			for _, k := range w.Keys {
				if k != key {
					s.removeWaiter(k, w.Ref)
					others = append(others, k)
				}
			}
		}
	}
	s.waiting -= e.queue.len()
	delete(s.queued, key)
	delete(s.keys, key)
	s.reserved--
	s.recycle(e)
	for _, k := range others {
		effects = s.promote(k, 0, effects)
	}
	return effects
}

// primary is the key an effect about w names: its block's first key, or
// key, the one queue a single-key waiter stands in.
func (w *Waiter) primary(key string) string {
	if w.Keys != nil {
		return w.Keys[0]
	}
	return key
}

// removeWaiter takes the waiter ref out of key's queue (order of the others
// kept), without counting it out of waiting: a block stands in several
// queues but counts once.
func (s *State) removeWaiter(key string, ref uint64) {
	e := s.keys[key]
	if e == nil {
		return
	}
	if e.queue.find(ref) < 0 {
		return
	}
	e = s.own(key, e) // its queue is a copy now: find again
	e.queue.removeAt(e.queue.find(ref))
	s.dequeued(key, e)
}

func (s *State) cancelWait(cmd *Command, effects []Effect) (result, []Effect) {
	e := s.keys[cmd.Key]
	if e == nil {
		return result{Status: StatusNoop}, effects
	}
	i := e.queue.find(cmd.Ref)
	if i < 0 {
		// Already granted (hand-off won the race) or already gone.
		return result{Status: StatusNoop}, effects
	}
	w := e.queue.ws[i]
	s.takeWaiterLabel(cmd.Key, &w)
	eff := Effect{Kind: EffectTimedOut, Key: w.primary(cmd.Key), Keys: w.Keys, Owner: w.Owner, Ref: w.Ref, Session: w.Session, Seq: w.Seq}
	if w.Session != 0 {
		eff.Serial = s.waiterTimedOut(&w)
	}
	effects = append(effects, eff)
	s.waiting--
	if w.Keys == nil {
		s.removeWaiter(cmd.Key, w.Ref)
		// A single-key waiter behind a block on a reserved key leaves the
		// head as it was: nothing to decide.
		return result{Status: StatusCanceled}, effects
	}
	delete(s.blockWaiters, w.Ref)
	for _, k := range w.Keys {
		s.removeWaiter(k, w.Ref)
	}
	for _, k := range w.Keys {
		effects = s.promote(k, s.clock, effects)
	}
	return result{Status: StatusCanceled}, effects
}

func (s *State) dropWaiters(effects []Effect) (result, []Effect) {
	keys := s.queuedKeys() // sorted: map order must not leak into the effects
	effects = slices.Grow(effects, s.waiting)
	told := make(map[uint64]bool, len(s.blockWaiters))
	for _, k := range keys {
		if m := s.sems[k]; m != nil {
			m = s.ownSem(k, m)
			m.queue.each(func(w *Waiter) {
				eff := Effect{Kind: EffectDropped, Key: k, Owner: w.Owner, Ref: w.Ref, Session: w.Session, Seq: w.Seq}
				if w.Session != 0 {
					eff.Serial = s.waiterTimedOut(w)
				}
				effects = append(effects, eff)
			})
			s.recycleQueue(m.queue)
			m.queue = nil
			continue
		}
		e := s.queued[k]
		e.queue.each(func(w *Waiter) {
			if w.Keys != nil {
				if told[w.Ref] {
					return
				}
				told[w.Ref] = true
			}
			eff := Effect{Kind: EffectDropped, Key: w.primary(k), Keys: w.Keys, Owner: w.Owner, Ref: w.Ref, Session: w.Session, Seq: w.Seq}
			if w.Session != 0 {
				eff.Serial = s.waiterTimedOut(w)
			}
			effects = append(effects, eff)
		})
		e = s.own(k, e)
		s.recycleQueue(e.queue)
		e.queue = nil
		if e.token == 0 {
			delete(s.keys, k)
			s.reserved--
			s.recycle(e)
		}
	}
	clear(s.queued)
	clear(s.blockWaiters)
	clear(s.waiterLabels)
	s.waiting = 0
	return result{Status: StatusDropped}, effects
}

// queuedKeys lists, in ascending order, every key with a non-empty
// queue: the lock keys of s.queued and the semaphores that have waiters.
func (s *State) queuedKeys() []string {
	keys := make([]string, 0, len(s.queued))
	for k := range s.queued {
		keys = append(keys, k)
	}
	for k, m := range s.sems {
		if m.queue.len() > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

func (s *State) newEntry() *entry {
	if n := len(s.spare); n > 0 {
		e := s.spare[n-1]
		s.spare[n-1] = nil
		s.spare = s.spare[:n-1]
		e.gen = s.gen
		return e
	}
	return &entry{gen: s.gen}
}

// recycle keeps e for reuse unless a Frozen view may still read it.
func (s *State) recycle(e *entry) {
	if e.gen != s.gen {
		return
	}
	*e = entry{}
	if len(s.spare) < maxSpare {
		s.spare = append(s.spare, e)
	}
}

// own returns key's entry e in a form this State may write: e itself if it
// was created or copied since the last Freeze, otherwise a private copy
// (queue included) that replaces e in the table, leaving e as the frozen
// views see it.
func (s *State) own(key string, e *entry) *entry {
	if e.gen == s.gen {
		return e
	}
	c := new(entry)
	*c = *e
	c.queue, c.gen = e.queue.clone(), s.gen
	s.keys[key] = c
	if e.queue.len() > 0 {
		s.queued[key] = c
	}
	return c
}

// Frozen is the table as it was when Freeze was called. Later Applies to
// the State do not change it, so it may be read (WriteSnapshot) from
// another goroutine while the State goes on applying: the Raft FSM freezes
// in Snapshot, on the apply goroutine, and writes the bytes in Persist,
// concurrently with new applies.
type Frozen struct {
	sorted sync.Once   // the first WriteSnapshot sorts keys in place
	keys   []frozenKey // map order until sorted
	// head is the rest of the State's snapshot, its maps copied (nil when
	// empty; a block's key slices are never written, so they are shared).
	head snapHeader
}

type frozenKey struct {
	key string
	e   *entry
}

// Freeze returns a Frozen view of the current table. It lists the held
// keys with their entries (O(held keys), a key and a pointer each: about
// 30 ms for a million here); every entry then becomes read-only for the State,
// which copies an entry the first time it changes it afterwards.
func (s *State) Freeze() *Frozen {
	s.gen++
	keys := make([]frozenKey, 0, len(s.keys))
	for k, e := range s.keys {
		keys = append(keys, frozenKey{k, e})
	}
	head := s.snapHeader() // sems: pointers, copied on write from now on
	head.blocks = cloneOrNil(head.blocks)
	head.renewed = cloneOrNil(head.renewed)
	head.labels = cloneOrNil(head.labels)
	head.waiterLabels = cloneOrNil(head.waiterLabels)
	head.sessRevoked = cloneOrNil(head.sessRevoked) // its slices are never written in place
	f := &Frozen{keys: keys, head: head}
	return f
}

// cloneOrNil is a copy of m, nil when m is empty.
func cloneOrNil[M ~map[K]V, K comparable, V any](m M) M {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}

// hasBlockContent reports whether a block is held or queued (a reserved
// key implies a queued block).
func (s *State) hasBlockContent() bool { return len(s.blocks) > 0 || len(s.blockWaiters) > 0 }

// snapVersion is the lowest snapshot version that holds the table: 7 if
// a revoke record is kept, else 6 if a key is a semaphore or a kept
// outcome names a slot other than 0, else 5 if a holder or waiter has a
// label, else 4 if a session exists, else 3 if a holding was extended,
// else 2 if a block is held or queued, else 1.
func (s *State) snapVersion() byte {
	switch {
	case len(s.revokes) > 0 || len(s.sessRevoked) > 0:
		return snapV7
	case len(s.sems) > 0 || s.hasSlotOutcomes():
		return snapV6
	case s.hasLabels():
		return snapV5
	case len(s.sessions) > 0:
		return snapV4
	case len(s.renewed) > 0:
		return snapV3
	case s.hasBlockContent():
		return snapV2
	}
	return snapV1
}

// NumHeld is the number of held keys in the view.
func (f *Frozen) NumHeld() int { return len(f.keys) }

// LastToken is the highest token ever issued (0 before the first grant).
func (s *State) LastToken() uint64 { return s.last }

// Holder returns the holder of key, if any, with the time of its latest
// extension (RenewedAt), its label and, for a block, the block's keys. A
// semaphore key has no one holder: see PermitHolders.
func (s *State) Holder(key string) (Holder, bool) {
	if e := s.keys[key]; e != nil && e.token != 0 {
		h := e.holder()
		if len(s.blocks) > 0 {
			h.Keys = s.blocks[h.Token]
		}
		if len(s.renewed) > 0 {
			h.RenewedAt = s.renewed[h.Token]
		}
		if len(s.labels) > 0 {
			h.Label = s.labels[h.Token]
		}
		return h, true
	}
	return Holder{}, false
}

// Block returns the keys of the block held under token (nil if token is
// not a held block).
func (s *State) Block(token uint64) []string { return s.blocks[token] }

// Reserved reports whether key is reserved: not held, and its queue head is
// a block that waits for its other keys.
func (s *State) Reserved(key string) bool {
	e := s.keys[key]
	return e != nil && e.token == 0
}

// Waiters returns a copy of key's queue, head first (nil if none). A
// queued block appears in the queue of each of its keys.
func (s *State) Waiters(key string) []Waiter {
	return s.queueOf(key).waiters()
}

// Position is the place in line of the waiter ref on key: 1 for the head
// of the key's queue, counting only the waiters still queued (a block
// waiter has a place in each of its keys' queues). False if ref does not
// wait on key. O(log n) in the queue's length after the first call since
// the queue was last renumbered (O(n) then), so a waiting room of 100,000
// can be asked every second without work proportional to the line at
// every hand-off. It changes no replicated state, but it is not a pure
// read either (it keeps the queue's rank tree): call it where Apply may
// be called, not on a Frozen view.
func (s *State) Position(key string, ref uint64) (int, bool) {
	q := s.queueOf(key)
	i := q.find(ref)
	if i < 0 {
		return 0, false
	}
	return q.position(i), true
}

// queueOf is the queue of key, a lock's or a semaphore's (nil if none).
func (s *State) queueOf(key string) *waitQueue {
	if e := s.keys[key]; e != nil {
		return e.queue
	}
	if m := s.sems[key]; m != nil {
		return m.queue
	}
	return nil
}

// RaiseTokenFloor makes the next token issued greater than floor (it never
// lowers the counter). A cluster calls it once, through a committed log
// entry, when its fencing domain is created, so that a new domain's tokens
// start above an old one's.
func (s *State) RaiseTokenFloor(floor uint64) {
	if floor > s.last {
		s.last = floor
	}
}

// QueueLen is the length of key's queue (0 if the key is free).
func (s *State) QueueLen(key string) int {
	return s.queueOf(key).len()
}

// NumHeld is the number of held keys (a block counts each of its keys).
func (s *State) NumHeld() int { return len(s.keys) - s.reserved }

// NumReserved is the number of reserved keys (see Reserved).
func (s *State) NumReserved() int { return s.reserved }

// NumWaiting is the number of queued waiters over all keys (a queued block
// counts once).
func (s *State) NumWaiting() int { return s.waiting }

// NumBlocks is the number of held blocks.
func (s *State) NumBlocks() int { return len(s.blocks) }

// hasLabels reports whether a holding or a queued waiter has a label.
func (s *State) hasLabels() bool { return len(s.labels) > 0 || len(s.waiterLabels) > 0 }

// WaiterLabel is the label of w, a waiter of key's queue (as Waiters
// lists it), "" if it has none.
func (s *State) WaiterLabel(key string, w Waiter) string {
	if len(s.waiterLabels) == 0 {
		return ""
	}
	return s.waiterLabels[waiterRef{w.primary(key), w.Ref}]
}

// NumLabelled is the number of holdings that have a label (a block counts
// once).
func (s *State) NumLabelled() int { return len(s.labels) }

// NumRenewed is the number of holdings that were extended (a block counts
// once).
func (s *State) NumRenewed() int { return len(s.renewed) }

// RangeHolders calls fn for every held key in ascending key order until fn
// returns false. The keys are sorted on each call (O(n log n)); it is meant
// for inspection and for the leader rebuilding its lease timers, not for a
// hot path. fn may apply commands: the keys to visit are fixed when the call
// starts and each is looked up when its turn comes, so fn sees current
// holders and a key freed meanwhile is skipped.
//
// A semaphore's held permits are visited too, each as a Holder with
// Permit set, in slot order, in the key's place in the order.
func (s *State) RangeHolders(fn func(key string, h Holder) bool) {
	keys := s.sortedKeys()
	if len(s.sems) > 0 {
		for k := range s.sems {
			keys = append(keys, k)
		}
		slices.Sort(keys)
	}
	for _, k := range keys {
		if _, ok := s.sems[k]; ok {
			for _, h := range s.PermitHolders(k) {
				if !fn(k, h) {
					return
				}
			}
			continue
		}
		h, ok := s.Holder(k)
		if !ok {
			continue // freed meanwhile, or reserved
		}
		if !fn(k, h) {
			return
		}
	}
}

func (s *State) sortedKeys() []string {
	keys := make([]string, 0, len(s.keys))
	for k := range s.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
