// Package locksm is Ticketing's lock table as a pure, deterministic state
// machine: it applies one command at a time to a State and reports what
// happened (a Result for the command itself and Effects owed to others, such
// as a hand-off grant to the head of a queue). It has no goroutines, reads no
// clock and does no I/O; time enters only as the Now value that the proposing
// leader stamped into each command. Every replica that applies the same
// commands in the same order reaches the same State and the same Effects.
//
// # Expiry is decided by the leader, not by Now
//
// OpExpire carries the token of the holding to end, and Apply ends it if that
// token still holds the key; it does not compare Command.Now with GrantedAt
// and the lease. The leader decides that a lease ran out with its own
// monotonic timers and proposes the expiry. Gating expiry on Now would tie
// correctness to wall clocks: Now is stamped by whichever node leads, and
// clocks of different leaders disagree. A leader whose clock is behind would
// see every lease as still running and could hold locks forever; one whose
// clock is ahead would cut leases short. Keeping Now out of the decision
// makes the replicated outcome depend only on the order of commands. A
// stale expiry (the holding already ended) is a harmless no-op, so the
// leader may propose expiries freely after a leader change.
//
// # Tokens
//
// One token counter serves the whole table. Every grant, immediate or by
// hand-off, takes the next value (the first is 1); tokens are never reused,
// and the counter is part of snapshots, so it never goes back.
//
// # Blocks
//
// OpAcquireBlock takes 2..16 keys at once, all or none, under one token: it
// joins every key's FIFO queue in one command, so on every key the waiters
// stand in log order and two blocks can never wait for each other in a
// cycle. A key whose queue head is a block still waiting for its other
// keys is reserved: unheld, but not free (MATRIX.md, "Blocks", says why).
// Releasing or expiring any key of a block ends the whole holding.
//
// # Extending
//
// OpExtend renews the lease of a holding, matched like a release (token,
// owner and, for a holding granted under a session, that session: any
// mismatch is ErrNotHeld): its lease becomes LeaseSec counted from Now
// (Holder.RenewedAt); for a block, naming any key extends every key. The
// token stays, so fencing is unaffected, and every queue stays as it is.
// Like every lease, the extended one is enforced by the leader's timers,
// not by Now: the leader re-arms its timer for the holding when the
// extend commits. An extension never narrows what an expiry can do: an
// OpExpire naming the same token still ends the extended holding if it is
// applied after the extend, because the state machine cannot tell a stale
// expiry of that token (proposed by a timer the extension superseded) from
// a current one. Preventing that order is the leader's job: it never
// proposes an expiry of a token while an extend of it is in flight, and it
// ignores lease timers superseded by an extension.
//
// # Snapshots beside applies
//
// Freeze returns a view of the table as it is, in time proportional to the
// number of held keys but with no per-key copying; the view's WriteSnapshot
// may then run on another goroutine while Apply goes on. Entries are copied
// on write: after a Freeze, the first change to a key's entry replaces it
// with a private copy, so a view never sees a later change and the State
// never writes memory a view reads. That is the one exception to "a State
// is used from one goroutine": a Frozen may be read concurrently.
//
// # Sessions
//
// A broker (sidecar) opens a session (OpOpenSession) and names it, with a
// sequence number, on every lock command it writes (Command.Session, Seq,
// Ack). The state remembers the final outcome of each such command until
// the broker acknowledges it, so a reply lost with a connection or a
// leader is answered from the replicated state instead of being guessed;
// a resume (OpResumeSession) raises the session's floor, which voids every
// sequence of it that was not applied by then. Waiters and holdings keep
// the (session, seq) they came from, so a new leader keeps a session's
// waiters (OpDropSessionless) and an expiry (OpExpireSession) removes
// them. Session 0 is no session: today's semantics exactly. The rules are
// in MATRIX.md, "Sessions"; the design in docs/sessions.md.
//
// # Labels
//
// An acquire may carry a Label (MaxLabelLen bytes at most, the key
// alphabet) that names the request for people: a job name, a request id.
// A waiter keeps it and a holding granted from it keeps it until it ends;
// inspection shows it. It changes no decision. Labels live beside the
// entries and queues (by token for a holding, by key and ref for a
// waiter), so a holding or waiter without one costs nothing. Labels came with
// protocol version 8: the codec marks a labelled acquire with a flag, so
// entries and snapshots without labels are byte for byte what older nodes
// wrote.
//
// # Revokes
//
// OpRevoke is an operator breaking a stuck holding: it names the key and
// the token of the holding to end, so that a revoke decided on what
// inspect showed can never end a newer holding of the same key. It ends
// the holding exactly as an expiry does (hand-off in the same command,
// session bookkeeping as for an expiry), owes the holder an
// EffectRevoked (its broker tells it the holding is lost, and why), and
// keeps an audit record of the latest revoke of each key (LastRevoke),
// at most MaxRevokeRecords of them. A revoke is safe with fencing: every
// grant takes a fresh token, so the revoked holder's next fenced write
// carries a token below the new holder's and is refused by the fence
// (MATRIX.md, "Revoke").
//
// The field constraints and the request × key-state matrix are in MATRIX.md
// next to this file; the testdata scripts pin every cell of it.
package locksm

// Field constraints. They are part of the replicated semantics: every replica
// must agree on them, so they are constants, not configuration. Changing one
// is a protocol change (see cluster/wire/PROTOCOL.md, "Field constraints").
const (
	// MaxKeyLen is the longest key in bytes. Keys are 1..MaxKeyLen bytes,
	// each in the visible ASCII range 0x21..0x7E (no space, no control byte),
	// so a key can travel unquoted in the unix line protocol.
	MaxKeyLen = 255
	// MaxOwnerLen is the longest owner id in bytes, same alphabet as keys.
	MaxOwnerLen = 128
	// MaxLabelLen is the longest owner label in bytes (Command.Label), same
	// alphabet as keys; empty means no label. 64 holds what a label is
	// for: a job name, a request id (a UUID is 36 bytes), a Kubernetes pod
	// name (up to 63), a host name with a short suffix. It keeps a HELD
	// line and an inspect row short, and bounds what a holder or waiter
	// can add to every replica's memory to 64 bytes.
	MaxLabelLen = 64
	// MinLeaseSec and MaxLeaseSec bound the lease in whole seconds. Anything
	// outside is rejected with ErrInvalidLease, never clamped.
	MinLeaseSec = 1
	MaxLeaseSec = 250
	// MaxWaitMs is the longest wait bound in milliseconds (one hour: a
	// waiting room holds buyers for tens of minutes). 0 means one
	// immediate try. There is no infinite wait.
	MaxWaitMs = 3_600_000
	// MaxShortWaitMs is the longest wait before protocol version 11 (5
	// minutes): while some member of the cluster is older, every replica
	// rejects a longer one (State.SetShortWaits).
	MaxShortWaitMs = 300_000
	// MinBlockKeys and MaxBlockKeys bound the keys of one OpAcquireBlock
	// (a seat block: several keys granted together under one token). The
	// keys must be distinct; anything else is ErrInvalidBlock.
	MinBlockKeys = 2
	MaxBlockKeys = 16
	// MinSessionTimeoutMs and MaxSessionTimeoutMs bound a session's
	// timeout (OpOpenSession): how long the leader lets it go without a
	// connection before it proposes the expiry. Outside: ErrInvalidSession.
	MinSessionTimeoutMs = 2_000
	MaxSessionTimeoutMs = 300_000
	// SecretHashLen is the length of a session's SecretHash: a SHA-256 of
	// the broker's secret (the secret itself never enters the log).
	SecretHashLen = 32
	// MaxPermits is the largest n of a semaphore key (OpSetPermits): a
	// general-admission section or a waiting room's checkout. Each held
	// permit costs its slot (about 64 bytes) on every replica, so the
	// bound keeps a full semaphore under 10 MB.
	MaxPermits = 100_000
	// MaxReasonLen is the longest reason of a revoke (Command.Reason), in
	// bytes of printable ASCII 0x20..0x7E, spaces allowed but not first
	// or last; empty means none given (ValidateReason). An operator
	// writes prose ("stuck since the 14:02 deploy, OPS-123"), so spaces
	// are allowed, unlike in keys. The alphabet is still safe to print
	// anywhere the reason goes: no control byte (no CR or LF, so a reason
	// can neither end a line of the unix line protocol nor forge a line
	// of the node log; no ESC, so no terminal escape) and no byte above
	// 0x7E (no invalid UTF-8, no look-alike or bidirectional characters).
	// Because of the spaces it is never an unquoted field in the middle
	// of a line: a line protocol carries it quoted, or as the rest of its
	// line; with no space at either end, trimming a line changes nothing.
	// 128 bytes hold a sentence and a ticket id, and bound each audit
	// record.
	MaxReasonLen = 128
	// MaxRevokeRecords bounds the audit records of revokes (LastRevoke):
	// one per key, the latest revoke of it; when a revoke would make
	// more, the records of the keys revoked longest ago (by log order)
	// go first. Every replica evicts the same ones, so snapshots agree.
	// At most MaxKeyLen + MaxOwnerLen*2 + MaxReasonLen + MaxLabelLen
	// bytes of strings each (plus a block's keys, shared by the records
	// of its keys): under 1 MB for a full table, on every replica.
	MaxRevokeRecords = 1024
	// MaxSessionRevokes bounds the revokes of one session's holdings
	// kept for its broker (SessionRevoke): a revoke past them is
	// refused (ErrRevokesPending).
	MaxSessionRevokes = 1024
)

// Op names a command.
type Op uint8

const (
	// OpAcquire asks for Key on behalf of Owner with LeaseSec and WaitMs.
	// Free key: granted at once with a fresh token. Held key and WaitMs == 0:
	// Busy. Held key and WaitMs > 0: queued at the tail (FIFO) under Ref.
	// Non-reentrant: the holder asking again is treated like anyone else.
	OpAcquire Op = 1
	// OpRelease releases Key if it is held by exactly (Owner, Token) and,
	// if the holding was granted under a session, the command is that
	// session's; else ErrNotHeld, whatever did not match (MATRIX.md). The
	// queue head (if any) becomes holder with a fresh token in this command.
	OpRelease Op = 2
	// OpExpire ends the holding of Key under Token because its lease ran out
	// (the leader decides when; see Command.Now). A stale Token is a no-op.
	// Hands off to the queue head like a release.
	OpExpire Op = 3
	// OpCancelWait removes the waiter Ref from Key's queue: its wait ran out
	// or its requester went away. The waiter is owed a timeout (EffectTimedOut)
	// and can never be granted afterwards. No-op if Ref is not queued there
	// (already granted, or already gone).
	OpCancelWait Op = 4
	// OpDropWaiters removes every queued waiter of every key. A new leader
	// proposes it before serving, because the connections those waiters were
	// queued from died with the old leader: handing a key to one of them would
	// leave it held by nobody who knows its token until its lease expires.
	OpDropWaiters Op = 5
	// OpAcquireBlock asks for every key of Keys (MinBlockKeys..MaxBlockKeys
	// distinct keys; Key is unused) at once, on behalf of Owner with
	// LeaseSec and WaitMs, under Ref: granted all together with one token,
	// or queued on every key at once, or Busy (see MATRIX.md, "Blocks").
	// The holding it creates is released or expired as a whole by naming
	// any of its keys with its token.
	OpAcquireBlock Op = 6
	// OpExtend renews the lease of the holding of Key under Token, if it
	// is matched exactly as by OpRelease: its lease becomes LeaseSec
	// (MinLeaseSec..MaxLeaseSec) counted from Now (Holder.RenewedAt). The
	// token, the grant time and every queue stay as they are; for a block
	// (any of its keys named) the whole holding is extended. Like every
	// lease, the extended one is enforced by the leader's timers, not by
	// Now (see the package documentation).
	OpExtend Op = 7
	// OpOpenSession creates the session Session (nonzero, not in use) with
	// SecretHash (SecretHashLen bytes) and TimeoutMs
	// (MinSessionTimeoutMs..MaxSessionTimeoutMs), opened at Now, with
	// floor, serial, ack and attach epoch 0.
	OpOpenSession Op = 8
	// OpResumeSession re-attaches Session on a leader: its attach epoch
	// must be Epoch (the one the leader observed; else ErrStaleEpoch) and
	// becomes Epoch+1; its floor becomes max(floor, Seq), which voids
	// every seq up to Seq not applied by now; outcomes up to Ack are
	// dropped. ErrNoSession if the session is unknown (expired).
	OpResumeSession Op = 9
	// OpExpireSession ends Session because it stayed without a connection
	// for its timeout: every waiter of it is removed (EffectTimedOut: never
	// granted), each holding named in Tokens that the session holds is
	// released (hand-off as a release), every other holding keeps its
	// lease (and no longer names the session), and the session with its
	// outcomes is gone. Noop if the session is unknown or its attach epoch
	// is not Epoch (it was resumed since the leader decided).
	OpExpireSession Op = 10
	// OpCloseSession is the broker's clean stop: OpExpireSession without
	// Tokens and without an epoch check. Noop if the session is unknown.
	OpCloseSession Op = 11
	// OpDropSessionless removes every queued waiter that has no session,
	// exactly as OpDropWaiters removes every waiter; waiters of sessions
	// keep their places. A new leader proposes it instead of OpDropWaiters
	// once every member knows sessions: only the waiters of session-less
	// connections died with the old leader.
	OpDropSessionless Op = 12
	// OpAckSession drops the outcomes of Session up to Ack, as the Ack of
	// its lock commands does, for a session that sends none (protocol
	// version 9): a quiet broker's acknowledged outcomes would otherwise
	// stay in the table, and in every snapshot, until its next command.
	// Noop if the session is unknown (it ended).
	OpAckSession Op = 13
	// OpAcquirePermit asks for one permit of the semaphore Key, with the
	// fields and outcomes of OpAcquire: granted at once (Result.Slot, the
	// lowest free slot, with a fresh token) if fewer than its n permits
	// are held and nobody waits, Busy with WaitMs == 0, else queued at the
	// tail under Ref. ErrNotSemaphore if Key is not defined as a
	// semaphore (MATRIX.md, "Semaphores").
	OpAcquirePermit Op = 14
	// OpSetPermits defines Key as a semaphore of Permits permits
	// (1..MaxPermits), or changes its n: raising it grants waiters in the
	// same command, lowering it ends no permit. Permits 0 removes the
	// definition of an idle semaphore (else ErrInUse). ErrInUse too when
	// Key is held or reserved as a lock.
	OpSetPermits Op = 15
	// OpRevoke is an operator ending the holding of Key under Token
	// (exactly: a lock's holder, any key of a block, which ends the whole
	// block, or the permit of the semaphore Key under Token), because it
	// is stuck. Owner is who asked (the operator's identity, the owner
	// alphabet), Reason why (0..MaxReasonLen bytes, ValidateReason), Now
	// when. The holding ends as an expiry ends it: the queue head is
	// granted with a fresh token in the same command, a session's holding
	// is forgotten by its session with nothing recorded. The result is
	// StatusRevoked with the revoked Token (and Slot of a permit); the
	// first effect is EffectRevoked, owed to the revoked holder, then the
	// hand-off grants. The latest revoke of each key is kept as an audit
	// record (LastRevoke). Anything else changes nothing: ErrNotHeld if
	// nothing holds Key (free, reserved for a block, unknown, a semaphore
	// without a permit held), ErrTokenMismatch if Key is held but not
	// under Token (a newer holding, or a waiter's ref taken for a token).
	// Op 16 came with revokes: a node of an older version cannot decode
	// it (codec.go), so the cluster must propose it only once every member
	// runs the version that brought it.
	OpRevoke Op = 16
)

// SessionOp reports whether op acts on a session itself (open, resume,
// expire, close, drop-sessionless, ack: 8..13) rather than on the lock
// table's keys. Ops are numbered in the order they came, so later lock
// ops (the semaphores' 14 and 15) are not session ops.
func (op Op) SessionOp() bool { return op >= OpOpenSession && op <= OpAckSession }

// maxOp is the highest op this version knows.
const maxOp = OpRevoke

// Command is one replicated state change. The leader fills Now with its wall
// clock (Unix milliseconds) when it proposes; the state machine records it
// (grant and enqueue times, for inspection) and never reads a clock itself.
type Command struct {
	Op Op
	// TimeoutMs is a session's timeout (OpOpenSession). It sits beside Op
	// in what would be padding: the cluster decodes up to MaxBatch
	// commands per entry.
	TimeoutMs uint32
	Now       int64  // Unix milliseconds stamped by the proposer
	Key       string // all ops but OpDropWaiters and OpAcquireBlock
	// Keys are the keys of an OpAcquireBlock, in the requester's order (the
	// first is the block's primary key, named by its effects). The state
	// keeps this slice (shared, never written): do not change it afterwards.
	Keys []string
	// Owner: the requester (OpAcquire, OpAcquireBlock, OpAcquirePermit,
	// OpRelease, OpExtend), or who revokes (OpRevoke: the operator).
	Owner string
	// Label is the caller's label for an acquire (OpAcquire,
	// OpAcquireBlock): 0..MaxLabelLen bytes in 0x21..0x7E, "" for none.
	// It names the holding for people (inspect, logs) and plays no part
	// in matching: releases and extends match by token and owner.
	Label string
	// Reason is why an operator revokes (OpRevoke): 0..MaxReasonLen bytes
	// of printable ASCII, ValidateReason; "" for none. It goes into the
	// audit record and to the revoked holder.
	Reason string
	Token  uint64 // OpRelease, OpExpire, OpExtend, OpRevoke
	// Ref is the proposer's identifier for an acquire, a release, a
	// set-permits or a revoke (so the
	// proposer can match the applied command to the request that owes a
	// reply): echoed in Effects that concern an acquire's waiter and used by
	// OpCancelWait. The state machine ignores it for releases. Unique per proposer; the
	// state machine rejects an acquire whose Ref is already queued on Key.
	Ref      uint64
	LeaseSec uint32 // OpAcquire, OpAcquirePermit, OpAcquireBlock, OpExtend: MinLeaseSec..MaxLeaseSec
	WaitMs   uint32 // OpAcquire, OpAcquirePermit, OpAcquireBlock: 0..MaxWaitMs
	// Permits is a semaphore's n (OpSetPermits): 1..MaxPermits, or 0 to
	// remove the definition.
	Permits uint32

	// Session names the session of a lock command (OpAcquire,
	// OpAcquireBlock, OpRelease, OpExtend; 0: none, today's semantics) or
	// the session a session op (8..11) acts on (nonzero).
	Session uint64
	// Seq is the broker's sequence number of a lock command of a session
	// (1, 2, ...; a seq at or below the floor is void), or, on
	// OpResumeSession, the highest seq the broker has written.
	Seq uint64
	// Ack is the broker's acknowledgement watermark: it has the final
	// reply of every outcome of the session with serial <= Ack. Lock
	// commands of a session and OpResumeSession.
	Ack uint64
	// Epoch is the session's attach epoch the leader observed
	// (OpResumeSession, OpExpireSession).
	Epoch uint64
	// SecretHash is the SHA-256 of the session's secret, SecretHashLen
	// bytes (OpOpenSession).
	SecretHash string
	// Tokens are the grants of the session that nobody was told
	// (OpExpireSession): released by the expiry if the session holds
	// them. The state does not keep this slice.
	Tokens []uint64
}

// Status says what a command did.
type Status uint8

const (
	StatusRejected Status = iota // validation or match failure: Result.Err says why
	StatusGranted                // acquire granted now: Result.Token
	StatusQueued                 // acquire queued: a later Effect grants it or times it out
	StatusBusy                   // acquire with WaitMs == 0 on a held key: definite no
	StatusReleased               // release done (hand-off, if any, in Effects)
	StatusExpired                // expiry done (hand-off, if any, in Effects)
	StatusCanceled               // waiter removed (its EffectTimedOut is in Effects)
	StatusNoop                   // expire/cancel that found nothing to do (stale)
	StatusDropped                // OpDropWaiters done (one EffectDropped per waiter)
	StatusExtended               // OpExtend done: the holding's lease renewed (no effects)
	// StatusTimedOut appears only in a session's Outcome, never as a
	// Result's: the session's queued acquire was removed without a grant
	// (cancel or drop-waiters). It was never granted.
	StatusTimedOut
	StatusOpened         // OpOpenSession done
	StatusResumed        // OpResumeSession done
	StatusSessionExpired // OpExpireSession done (waiters timed out, hand-offs in Effects)
	StatusSessionClosed  // OpCloseSession done (as an expiry)
	StatusAcked          // OpAckSession done: the outcomes up to Ack dropped
	StatusPermitsSet     // OpSetPermits done (grants of a raise in Effects)
	// StatusRevoked: OpRevoke ended the holding (Result.Token, and
	// Result.Slot of a permit; EffectRevoked and hand-offs in Effects).
	StatusRevoked
)

// Result is the outcome of a command for its proposer.
type Result struct {
	Status Status
	// LeaseSec: StatusExtended, the holding's lease from the extend's Now
	// (the extend's own, or the holding's longer one: from cluster
	// version 10 an extend never lowers it, SetExtendMayShorten). The
	// leader arms its lease timer with it.
	LeaseSec uint32
	// Token: StatusGranted, the token granted; StatusRevoked, the token
	// of the holding revoked.
	Token uint64
	// Slot: StatusGranted of OpAcquirePermit, the permit's slot
	// (0..n-1); StatusRevoked of a permit, the revoked permit's slot; 0
	// for a lock.
	Slot uint32
	Err  error // StatusRejected: one of the sentinels above
	// Serial is the serial of the outcome recorded for the command itself
	// (a lock command of a session that was applied and is final); 0 if
	// none was recorded (no session, queued, or rejected before it applied:
	// ErrNoSession, ErrVoided, ErrDuplicateSeq, a field constraint).
	Serial uint64
}

// EffectKind says what an Effect owes.
type EffectKind uint8

const (
	// EffectGranted: waiter Ref now holds Key under Token (hand-off).
	EffectGranted EffectKind = iota + 1
	// EffectTimedOut: waiter Ref was removed by OpCancelWait and will never
	// be granted. Its requester is owed a T.
	EffectTimedOut
	// EffectDropped: waiter Ref was removed by OpDropWaiters.
	EffectDropped
	// EffectRevoked: the holding of Key (a block's primary key, with
	// Keys) under Token was ended by OpRevoke. Owed to its holder: Owner,
	// Session and Seq name it as the holding had them (Session 0: none),
	// Slot a permit's slot; Ref and Serial are 0 (a holding has no ref,
	// and its session records nothing, as for an expiry). The leader
	// tells the holder's connection the holding is lost, with the
	// command's Reason, before the hand-off grants that follow it.
	EffectRevoked
)

// Effect is something a command owes to a party other than its proposer.
//
// An effect about a block names its primary key in Key and all its keys in
// Keys (nil for a single-key waiter); the slice is shared with the state
// and must not be changed.
type Effect struct {
	Kind EffectKind
	// LeaseSec (EffectGranted: the waiter's requested lease) sits beside
	// Kind in what would be padding: an effect is copied into every
	// hand-off's effects.
	LeaseSec uint32
	Key      string
	Keys     []string
	Owner    string
	Ref      uint64
	Token    uint64 // EffectGranted, EffectRevoked
	// Slot: EffectGranted of a semaphore's waiter, the permit's slot;
	// EffectRevoked of a permit, its slot; 0 for a lock.
	Slot uint32
	// Session and Seq are the waiter's (0 if it has none), or, of
	// EffectRevoked, the revoked holding's. Serial is the outcome
	// recorded for it (a grant, or a timeout by cancel or drop-waiters);
	// 0 when nothing was recorded: no session, the session's own expiry
	// timed it out, or a revoke (which records nothing).
	Session, Seq, Serial uint64
}

// Holder is the current holder of a key.
type Holder struct {
	Owner     string
	Token     uint64
	LeaseSec  uint32
	GrantedAt int64 // Now of the command that granted it (Unix ms)
	// RenewedAt is the Now of the latest OpExtend of this holding (Unix
	// ms; 0 if never extended). The lease, LeaseSec, counts from it.
	RenewedAt int64
	// Keys: for a block holding, every key of the block (the requester's
	// order; shared, do not change); nil for a single key.
	Keys []string
	// Session and Seq: the session command it was granted for (0: none,
	// or its session ended and the holding outlived it).
	Session, Seq uint64
	// Label is the acquire's label ("" if none).
	Label string
	// Permit: a permit of a semaphore key, in Slot (0..n-1); false for a
	// lock, whose Slot is 0.
	Permit bool
	Slot   uint32
}

// Waiter is one queued acquire.
type Waiter struct {
	Owner      string
	Ref        uint64
	LeaseSec   uint32
	WaitMs     uint32
	EnqueuedAt int64 // Now of the acquire (Unix ms)
	// Keys: for a queued block, every key of the block, in whose queues it
	// stands at once (the requester's order; shared, do not change); nil
	// for a single-key waiter.
	Keys []string
	// Session and Seq: the session command it was queued by (0: none).
	Session, Seq uint64
	// A waiter's label is not a field: the queues hold Waiters, and a
	// field would cost every waiter its string header, labelled or not.
	// State.WaiterLabel and SessionQueued.Label tell it.
}

// Outcome is the final result of a lock command of a session, kept until
// the broker acknowledges its serial. Status is StatusGranted (Token),
// StatusBusy, StatusReleased, StatusExtended, StatusTimedOut (a queued
// acquire removed without a grant) or StatusRejected (Err).
type Outcome struct {
	Seq    uint64
	Serial uint64
	Status Status
	// Slot: StatusGranted of a permit acquire, the permit's slot (the
	// fencing domain a resumed broker must be told with the token).
	Slot  uint32
	Token uint64
	Err   error
}

// SessionInfo describes a live session.
type SessionInfo struct {
	ID         uint64
	SecretHash string // SHA-256 of the broker's secret
	TimeoutMs  uint32
	// Floor: seqs at or below it that were not applied are void.
	Floor uint64
	// Serial is the last serial given to an outcome, Ack the broker's
	// watermark: the outcomes kept are serials Ack+1..Serial.
	Serial, Ack uint64
	// Epoch counts the resumes (attach epoch).
	Epoch    uint64
	OpenedAt int64 // Now of the open (Unix ms)
	// Outcomes kept, waiters queued, holdings held (a block counts once).
	Outcomes, Waiters, Holdings int
}

// SessionWaiter locates a still queued request of a session: its key (a
// block's primary key), its keys if a block, and its ref.
type SessionWaiter struct {
	Key  string
	Keys []string
	Ref  uint64
}

// SessionQueued is one still queued request of a session (SessionWaiters):
// its key (a block's primary key) and its waiter as it stands in the
// queue (Session, Seq, Ref, Owner, LeaseSec, WaitMs, EnqueuedAt, Keys).
type SessionQueued struct {
	Key    string
	Waiter Waiter
	// Label is the waiter's label ("" if none).
	Label string
	// Permit: it waits for a permit of the semaphore Key.
	Permit bool
}

// Revoke is the audit record of the latest revoke of a key
// (State.LastRevoke): what was ended, by whom, why and when. A block's
// revoke leaves one record on each of its keys.
type Revoke struct {
	// Key is the key the record is about; Keys, for a block, every key
	// of the revoked block (the requester's order; shared, do not change).
	Key  string
	Keys []string
	// Token is the token of the revoked holding.
	Token uint64
	// Who is the revoke's Owner (the operator), Reason its reason, At its
	// Now (Unix ms).
	Who, Reason string
	At          int64
	// Owner and Label are the revoked holder's.
	Owner, Label string
	// Permit: the revoked holding was a permit of the semaphore Key, in
	// Slot; false for a lock, whose Slot is 0.
	Permit bool
	Slot   uint32
	// Session is the revoked holding's session (0: none), as its
	// EffectRevoked names it: a leader tells a session's broker that
	// resumes of the revokes of its holdings it may not have heard.
	Session uint64
}

// SessionRevoke is a revoke of a session's holding, kept for the
// session's broker (State.SessionRevokes): a broker that was away when it
// applied, or that hears of the grant only in a resume's replayed
// outcomes, must still be told, whatever other revokes came after (the
// audit records keep only each key's latest). It is kept until the
// broker acknowledges an outcome recorded after it (its ack passes
// AfterSerial): a leader tells it on the session's connection before the
// outcomes watermark (O) of anything recorded later, and again at every
// resume while it is kept, so such an ack proves the broker read it. No
// time decides it (issue 42's third attack round: a note pruned by a
// later leader's clock left a broker holding a revoked lock). Also
// dropped when the session ends. At most MaxSessionRevokes per session:
// a revoke past them is refused (ErrRevokesPending), never one dropped.
type SessionRevoke struct {
	Session, Token uint64
	// Key is the holding's key (a block's primary key).
	Key string
	// Who and Reason are the revoke's Owner and Reason.
	Who, Reason string
	// AfterSerial is the session's last outcome serial when the revoke
	// applied: an ack above it drops the note.
	AfterSerial uint64
}

// LeaseEnd is when h's lease ends by the proposers' wall clocks (Unix ms):
// LeaseSec after RenewedAt if it was extended, else after GrantedAt. It is
// for inspection only: the leader ends leases with its monotonic timers,
// which never end one earlier than this promises a holder.
func (h Holder) LeaseEnd() int64 {
	start := max(h.GrantedAt, h.RenewedAt)
	return start + int64(h.LeaseSec)*1000
}
