// Package leader is the leader's request handling as a pure, deterministic
// state machine, in the manner of etcd-io/raft's RawNode and Ready: a Core
// takes inputs (a client's request, a connection's death, the commands the
// log applied with what they did, proposals that failed, leadership gained
// and lost, the steps of a planned hand-over, a due timer) and collects
// outputs (replies and notices to send, commands to propose, timers to arm,
// metric events), which the caller takes with Ready and acknowledges with
// Advance. A Core has no sockets, no goroutines and no clock: time enters
// as a value with each input. It reads the applied lock table and who
// leads only through the read-only Table and Directory it is given.
//
// A Core is not safe for concurrent use: its caller (cluster.Node) feeds
// it under one mutex and performs its outputs in the order they come.
//
// # What the core decides
//
// Who is owed which reply. A request is answered exactly once:
//
//   - G (granted) after the command that granted it, its own or a release
//     or expiry that handed the key on, was applied; B (busy) and K (released)
//     after its own command was applied; T (timeout) after the cancel of
//     its wait was applied; E for a rejected command or a refused one.
//   - M (moved, with the leader hint) when it was never proposed (this node
//     does not serve) or its proposal was refused before being appended.
//   - U (outcome unknown) when leadership was lost while it was owed, when
//     its proposal failed after it may have been appended, and for a
//     waiter dropped by a new leader.
//
// A grant whose requester's connection died is never told; its release is
// proposed at once (nobody can know that token). A queued acquire whose
// connection died, that was cancelled, or that a hand-over withdraws has its
// wait cancelled through the log.
//
// Admission counts acquires proposed but not applied as if each created a
// key and, if it may wait, joined its key's queue (MaxKeys,
// MaxWaitersPerKey), so a burst cannot overshoot. Per connection:
//
//   - "In flight" is a request whose own command is not applied yet: the
//     work about to commit. MaxInFlightPerConn bounds a connection's
//     acquires in flight, and, separately, its releases in flight (the
//     same number again: room reserved for releases, so a flood of
//     acquires can never make a release wait or be refused). A queued
//     waiter is not in flight: it costs the leader memory, not work.
//   - MaxWaitersPerConn bounds a connection's waiters: its queued
//     acquires plus its acquires with a wait whose command is not applied
//     yet (each may join a queue). An acquire with wait 0 never needs
//     waiter room.
//
// An acquire whose own command is applied as queued is told Q (progress,
// not its reply) on a connection of version wire.VersionQueued or later;
// its reply (G, T or U) follows.
//
// An extend is answered like a release (K after its command applied, E
// for a rejected one, M, U). It counts against the connection's releases
// in flight. While an extend of a token is in flight the core never
// proposes that token's expiry: a due lease timer of it waits for the
// extend's outcome (an expiry proposed meanwhile would be applied after the
// extend and end a lease the holder was just told it has). Conversely an
// extend of a token whose expiry this core proposed and has not seen
// applied or failed is held back until it settles (the node's proposer
// may put a request in the log ahead of housekeeping queued before it),
// then proposed: it reaches the log after the expiry. An applied
// extend arms a fresh lease timer; older timers of the token are then
// superseded and do nothing when due.
//
// When the leader applies an expiry it tells the holder with a lost event
// (wire.TypeLost) on a connection of version wire.VersionExtend or later:
// the connection the grant was told on if it is still open (none if that
// one is older), else every such open connection (the holder may have
// reconnected, or an earlier leader told the grant). It goes out before any grant the expiry hands
// the key on with.
//
// Sessions (protocol version 7) are in sessions.go: a broker's session is
// attached to one connection at a time; its requests' replies follow the
// attachment, its waits survive connection deaths, hand-overs and leader
// changes, and a session left without a connection for its timeout is
// expired through the log.
//
// Timers run on the caller's monotonic clock: a lease timer for every grant
// applied while leading (a full lease from the moment the leader applied
// it), a wait timer for every acquire queued, and a full lease for every
// holder when serving starts or resumes. A due lease timer proposes the
// expiry only if the key is still held under that token; a due wait timer
// proposes the cancel only if the acquire is still queued. Timers carry the
// leadership epoch that armed them and are ignored in any other.
package leader

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Config is what a Core needs to know of its node.
type Config struct {
	// ServerID is this node's Raft server id (NAME/INCARNATION): the leader
	// id of its serving notices, and how it recognizes itself as the
	// Directory's leader. Required.
	ServerID string
	// Advertise is the client address named in serving notices ("" if not
	// known; one longer than 255 bytes is sent as "").
	Advertise string
	// MaxInFlightPerConn bounds, per connection, the acquires whose own
	// command is not applied yet, and separately the releases whose own
	// command is not applied yet (>= 1). A queued waiter does not count.
	MaxInFlightPerConn int
	// MaxKeys bounds the keys held plus the acquires proposed but not yet
	// applied (>= 1).
	MaxKeys int
	// MaxWaitersPerKey bounds a key's queue plus the waiting acquires of
	// that key proposed but not yet applied (>= 1).
	MaxWaitersPerKey int
	// MaxWaitersPerConn bounds, per connection, the queued acquires plus
	// the acquires with a wait (> 0) proposed but not yet applied (>= 1).
	MaxWaitersPerConn int
	// MaxSessions bounds the live sessions of the table plus the opens
	// proposed and not yet applied: an open past it is refused
	// too_many_sessions. Zero: no bound.
	MaxSessions int
	// MaxSessionOutcomes bounds a session's outcomes that its broker has
	// not acknowledged (above the latest ack heard, 'k' or a resume's): an
	// acquire of the session past it is refused too_many_outcomes. Its
	// releases and extends are never refused for it: they concern locks
	// held already. Zero: no bound.
	MaxSessionOutcomes int
	// FirstRef: the refs (locksm.Command.Ref) this core hands out are
	// FirstRef+1, FirstRef+2, ... Zero is a valid start. A node starts at
	// a random value, so refs of different leaders stay apart.
	FirstRef uint64
	// PositionInterval is how often the leader walks the lines that moved
	// and tells their waiters their places (wire.TypePosition, version
	// 12): the bound on how often one waiter hears its place, and the
	// delay before a new waiter hears its first. Zero: positions are
	// never sent (the node always sets one; see cluster.Config).
	PositionInterval time.Duration
}

// Validate checks the fields.
func (c Config) Validate() error {
	switch {
	case c.ServerID == "":
		return fmt.Errorf("%w: server id required", ErrBadConfig)
	case c.MaxInFlightPerConn < 1, c.MaxKeys < 1, c.MaxWaitersPerKey < 1, c.MaxWaitersPerConn < 1:
		return fmt.Errorf("%w: limits must be at least 1", ErrBadConfig)
	case c.MaxSessions < 0, c.MaxSessionOutcomes < 0:
		return fmt.Errorf("%w: session limits must not be negative", ErrBadConfig)
	case c.PositionInterval < 0:
		return fmt.Errorf("%w: position interval must not be negative", ErrBadConfig)
	}
	return nil
}

// Table is the core's read-only view of the applied lock table. The caller
// implements it under its own locking; the core calls it only from its
// inputs.
type Table interface {
	// ClusterVersion is the protocol version every member is known to
	// speak (the log's cluster version; 0 if none is recorded): block
	// acquires are taken from wire.VersionBlocks on.
	ClusterVersion() uint16
	// Occupancy reports, in one look, whether key has an entry (held, or
	// reserved for a block, or defined as a semaphore), how many holdings
	// the table has in all (keys with an entry, semaphores defined and
	// permits held: what MaxKeys bounds), and the length of key's queue.
	Occupancy(key string) (held bool, keys, queue int)
	// Semaphore describes key's semaphore (its n and the permits held):
	// false if key is not one.
	Semaphore(key string) (locksm.Semaphore, bool)
	// HeldUnder reports whether key is held under token.
	HeldUnder(key string, token uint64) bool
	// MatchesHolding reports whether a release or extend of key by owner
	// under token from session (0: none) names its holding exactly
	// (where the holding is a session's, the session too:
	// locksm.State.MatchesHolding), so that it can still succeed.
	MatchesHolding(key, owner string, token, session uint64) bool
	// RangeHolders calls fn for every holder until fn returns false.
	RangeHolders(fn func(key string, h locksm.Holder) bool)
	// Sessions lists the live sessions' ids, ascending.
	Sessions() []uint64
	// NumSessions is the number of live sessions.
	NumSessions() int
	// Session describes live session id (its secret's hash, timeout,
	// floor, serial, ack and attach epoch): false if it is unknown.
	Session(id uint64) (locksm.SessionInfo, bool)
	// SessionOutcomes lists the kept outcomes of session id in serial
	// order (those above its ack).
	SessionOutcomes(id uint64) []locksm.Outcome
	// SessionWaiters lists the still queued requests of session id in seq
	// order.
	SessionWaiters(id uint64) []locksm.SessionQueued
	// RangeWaiters calls fn for every waiter still queued on key, head
	// first, until fn returns false (locksm.State.RangeWaiters): the walk
	// of a line for positions. fn must take no lock.
	RangeWaiters(key string, fn func(w *locksm.Waiter) bool)
	// SessionHolds reports whether session id still holds what it was
	// granted under token (locksm.State.SessionHolds).
	SessionHolds(id, token uint64) bool
	// SessionRevokes lists the revokes of session id's holdings kept
	// for its broker (locksm.State.SessionRevokes).
	SessionRevokes(id uint64) []locksm.SessionRevoke
}

// Directory tells the core who leads, for the hint of an M reply.
type Directory interface {
	// Leader is the server id of the leader Raft knows ("" if none).
	Leader() string
	// ClientAddr is the client address the log records for server id
	// ("" if none).
	ClientAddr(id string) string
}

// Applied is one command the log applied and what it did, in log order.
type Applied struct {
	Cmd     locksm.Command
	Res     locksm.Result
	Effects []locksm.Effect
	// Term is the Raft term of the log entry it came in (0: unknown).
	Term uint64
	// Index is that entry's Raft log index (0: unknown): the audit of a
	// revoke names it, so that a restarted node's replay of its log can
	// be told from a new revoke.
	Index uint64
}

// Outcome is how a request was answered, for the reply metrics.
type Outcome uint8

const (
	OutcomeGranted       Outcome = iota // G
	OutcomeBusy                         // B
	OutcomeTimeout                      // T
	OutcomeIndeterminate                // U
	OutcomeMoved                        // M
	OutcomeError                        // E (any but the release's not-held family)
	OutcomeOK                           // K to a release
	OutcomeNotHeld                      // E not_held, token_mismatch or owner_mismatch to a release
	NumOutcomes
)

var outcomeNames = [NumOutcomes]string{
	OutcomeGranted: "granted", OutcomeBusy: "busy", OutcomeTimeout: "timeout", OutcomeIndeterminate: "indeterminate",
	OutcomeMoved: "moved", OutcomeError: "error", OutcomeOK: "ok", OutcomeNotHeld: "not_held",
}

// String is the outcome's metric label.
func (o Outcome) String() string {
	if o < NumOutcomes {
		return outcomeNames[o]
	}
	return "unknown"
}

// EventKind says what an Event counts.
type EventKind uint8

const (
	// EventReply: a request of Op was answered with Outcome (counted even
	// when its connection is gone). A grant also carries Queued (granted
	// from the queue) and Latency (from its arrival).
	EventReply EventKind = iota + 1
	// EventHandoffLatency: a key freed by a release or an expiry was
	// handed to a waiter that was told: Latency from the release's arrival
	// or the lease running out to the G.
	EventHandoffLatency
	// EventExpiry: the leader applied an expiry that ended a lease.
	EventExpiry
	// EventHandoff: the leader applied a hand-off to a queued waiter.
	EventHandoff
	// EventAbandonedGrant: a grant to a dead connection, released at once.
	EventAbandonedGrant
	// EventRefusedInFlight, EventRefusedKeys, EventRefusedWaiters,
	// EventRefusedConnWaiters: a request refused by MaxInFlightPerConn,
	// MaxKeys, MaxWaitersPerKey, MaxWaitersPerConn.
	EventRefusedInFlight
	EventRefusedKeys
	EventRefusedWaiters
	// EventUnexpectedResult: a client command's own result had a Status
	// the core does not expect for its Op (a bug: log it). It was
	// answered E internal.
	EventUnexpectedResult
	EventRefusedConnWaiters
	// EventLostSent: the leader told a holder (Keys connections: 1 for
	// the grant's own, more when it had to tell every connection) that
	// its holding expired.
	EventLostSent
	// EventSessionOpened, EventSessionResumed (Keys: the outcomes and
	// queued requests its answer named), EventSessionExpired (Keys: the
	// grants nobody was told that it released): the leader applied a
	// session's open, resume or expiry it proposed.
	EventSessionOpened
	EventSessionResumed
	EventSessionExpired
	// EventSessionRefused: an open or resume was refused before anything
	// was proposed (Ready.Refusals says which connection and why).
	EventSessionRefused
	// EventRefusedSessions, EventRefusedOutcomes: an open refused by
	// MaxSessions, an acquire by MaxSessionOutcomes.
	EventRefusedSessions
	EventRefusedOutcomes
	// EventSuperseded: an entry of a newer term than this leadership's
	// was applied, so another node leads; the core lost leadership at once
	// (Keys: the replies it owed, answered U). The caller drops what it
	// queued for proposal, as when Raft says leadership was lost.
	EventSuperseded
	// EventPositionsSent: a walk of the lines that moved told Keys
	// waiters their places (R frames queued; none: no event).
	EventPositionsSent
	// EventRevoked: this node applied an operator's revoke that ended a
	// holding (Revoke is the audit record; Leading, whether it led):
	// every node emits it once per revoke.
	EventRevoked
)

// Event is something for the metrics (or the log) to record.
type Event struct {
	Kind    EventKind
	Op      locksm.Op      // EventReply, EventUnexpectedResult
	Outcome Outcome        // EventReply
	Queued  bool           // EventReply of a grant
	Keys    int            // EventReply of a grant of a block: its number of keys (0 for one key); EventLostSent: connections told; EventPositionsSent: R frames
	Latency time.Duration  // EventReply of a grant, EventHandoffLatency
	Status  locksm.Status  // EventUnexpectedResult
	Revoke  *locksm.Revoke // EventRevoked
	Leading bool           // EventRevoked: this node led when it applied it
	Index   uint64         // EventRevoked: the log index it came in (0: unknown)
}

// TimerKind says what a due timer asks for.
type TimerKind uint8

const (
	TimerExpire TimerKind = iota + 1 // propose OpExpire(Key, Token) if still held so
	TimerWait                        // propose OpCancelWait(Key, Ref) if still queued
	// TimerSession: propose OpExpireSession(Session) if it is still
	// without a connection since the detach that armed it (Gen).
	TimerSession
	// TimerPositions: walk the lines that moved since the last walk and
	// tell their waiters their places (positions.go).
	TimerPositions
)

// Timer is a timer to arm: at At (a reading of the caller's monotonic
// clock), hand it back to TimerDue. Timers are never cancelled; a stale
// one is ignored when due.
type Timer struct {
	At    time.Time
	Kind  TimerKind
	Key   string
	Token uint64 // TimerExpire
	Ref   uint64 // TimerWait
	Epoch uint64 // the leadership epoch that armed it
	// Session and Gen (TimerSession): the session, and its detach count
	// when the timer was armed (a later attach or detach makes it stale).
	Session, Gen uint64
}

// Send is a message to write on connection To: a reply or a notice.
type Send[C comparable] struct {
	To  C
	Msg wire.Msg
}

// Ready is the outputs collected since the last Advance, in the order the
// core produced them. Perform ClearTimers before arming Timers. The slices
// belong to the core and are reused after Advance.
type Ready[C comparable] struct {
	Sends     []Send[C]
	Proposals []locksm.Command // Now is left 0 for the proposer to stamp
	// ClearTimers: drop every timer armed before (leadership was lost).
	ClearTimers bool
	Timers      []Timer
	Events      []Event
	// Closes: connections to close once what Sends queued for them is
	// written (the session connections of a leadership that ended, so
	// their brokers resume where a leader serves; a connection whose
	// session request may have been appended without its outcome known).
	Closes []C
	// Refusals: session requests refused as hostile or stale, for the
	// log (with the connection's remote address).
	Refusals []Refusal[C]
	// Epoch is the leadership epoch Proposals belong to. The driver hands
	// it back with ProposalFailed, which ignores another epoch's failures:
	// the epoch that proposed them answered what they owed when it ended,
	// and a late report must not settle what a later leadership of this
	// node proposed (issue 39: a stale expiry's failure let an extend held
	// for the new leadership's expiry of its token go ahead of it).
	Epoch uint64
	// Silences: connections that a session was just attached to, each
	// with the session's timeout. The driver closes such a connection
	// once nothing arrived on it for that long (or its idle timeout, if
	// shorter): its broker pings at a third of it (docs/sessions.md,
	// "Liveness"), so the silence means a lost host or network, and the
	// close detaches the session, whose own timeout then runs.
	Silences []Silence[C]
}

// Silence bounds how long a session connection may stay silent.
type Silence[C comparable] struct {
	Conn C
	Max  time.Duration
}

// Refusal is an open or resume refused before anything was proposed: Err
// is wire.ErrBadSession (the secret does not match, or the connection
// cannot carry that session) or locksm.ErrNoSession (unknown session).
type Refusal[C comparable] struct {
	Conn    C
	Session uint64
	Err     error
}

// pending is a client request whose reply is owed.
type pending[C comparable] struct {
	conn     *conn[C]
	id       uint64 // request id on conn
	op       locksm.Op
	leaseSec uint32
	key      string   // a block's primary key (keys[0]), which its commands and effects name
	keys     []string // a block's keys; nil for one key
	owner    string
	ref      uint64
	token    uint64    // an extend's token if it counts in Core.extending (0: it does not)
	start    time.Time // when the request arrived (latency metrics)
	deadline time.Time // acquire: when its wait runs out
	queued   bool      // acquire applied as StatusQueued, not yet granted/timed out
	cancel   bool      // the client asked to cancel it
	// uncommitted: an acquire (or a set-permits that may define a new
	// semaphore) counted in Core.uncommittedTotal (proposed,
	// its own command not applied yet), and if mayWait (wait > 0) in
	// Core.uncommitted too.
	uncommitted, mayWait bool
	// told: the place in line this leader last told it (0: none yet); a
	// block's places are in Core.blockTold.
	told uint32
	// ext: what a session's request adds (nil: none); see pendingExt.
	ext *pendingExt[C]
}

// pendingExt is what a request of a session adds to its pending: the
// session of a lock request on a session connection (its id is its seq;
// its replies go to the session's attached connection, whichever that is
// by then, and with none nothing is sent: the outcome waits in the state
// for a resume; conn is then the connection whose in-flight map holds it,
// see session.home), shared by every lock request of the session; or the
// open, resume or close it is (op OpOpenSession, OpResumeSession,
// OpCloseSession; its reply goes to conn). One pointer keeps pending as
// small as without sessions.
type pendingExt[C comparable] struct {
	sess   *session[C]
	attach *attachReq
}

// session is p's session (a lock request of one), or nil.
func (p *pending[C]) session() *session[C] {
	if p.ext == nil {
		return nil
	}
	return p.ext.sess
}

// attachment is the open, resume or close p is, or nil.
func (p *pending[C]) attachment() *attachReq {
	if p.ext == nil {
		return nil
	}
	return p.ext.attach
}

func (p *pending[C]) inFlight() bool { return !p.queued && p.attachment() == nil }

// waiter reports whether p counts in its connection's waiters: an acquire
// that may wait (queued, or not applied yet).
func (p *pending[C]) waiter() bool { return p.acquire() && p.mayWait }

// acquire reports whether p is an acquire, of one key or of a block.
func (p *pending[C]) acquire() bool {
	return p.op == locksm.OpAcquire || p.op == locksm.OpAcquireBlock || p.op == locksm.OpAcquirePermit
}

// keySet is the keys p's acquire takes: its block's, or its one key.
func (p *pending[C]) keySet() []string {
	if p.keys != nil {
		return p.keys
	}
	return []string{p.key}
}

// cmdKey is the key a command's pending request and effects are filed
// under: a block acquire's primary key, else its Key.
func cmdKey(c *locksm.Command) string {
	if c.Op == locksm.OpAcquireBlock && len(c.Keys) > 0 {
		return c.Keys[0]
	}
	return c.Key
}

// conn is what the core knows of one connection.
type conn[C comparable] struct {
	handle   C
	seq      uint64                 // opening order: the order notices go out in
	inflight map[uint64]*pending[C] // owed replies, by request id
	// acquiring and releasing count the acquires and the releases of
	// inflight whose own command is not applied yet (MaxInFlightPerConn
	// each); waiters its acquires that may wait, queued or not applied
	// yet (MaxWaitersPerConn).
	acquiring, releasing, waiters int
	dead                          bool   // closed: later grants are compensated
	version                       uint16 // negotiated protocol version
	// ackPending: told of a hand-over, not acknowledged yet.
	ackPending bool
	// Sessions (version 7). sess is the session attached to this
	// connection (nil: none, or detached since); sid the session it ever
	// carried (0: none): a connection carries at most one. attaching: an
	// open or resume of it is owed a reply. lastSeq: the highest seq
	// taken on it (ids of a session only grow). used: it sent a lock
	// request without a session, so it can carry none.
	sess      *session[C]
	sid       uint64
	attaching bool
	lastSeq   uint64
	used      bool
	// closing: told to close (Ready.Closes); nothing more of its
	// session is sent on it.
	closing bool
	// positions: it asked for places in line (wire.TypeWatchPositions,
	// version 12); only then does it get R frames.
	positions bool
}

// Core is the leader's request handling; see the package comment. C is the
// caller's connection handle.
type Core[C comparable] struct {
	cfg   Config
	table Table
	dir   Directory

	leading bool // Raft says we are leader (timers may be armed)
	// term is the Raft term this leadership was won in (0: unknown).
	term uint64
	// ownTerm: leading, and every entry of earlier terms is applied
	// (BarrierApplied, or Serve): every entry applied from now on was
	// appended by this leadership, so a grant it makes that this core did
	// not tell was told by nobody.
	ownTerm bool
	ready   bool   // leading and prepared (Serve done)
	serving bool   // ready and not handing over: lock requests are taken
	closed  bool   // the node is closing
	epoch   uint64 // bumped on every leadership change
	// handover is the hand-over of this node's leadership in progress, or
	// after one, its target as the leader hint until a leader is known.
	handover *HandOver
	pend     map[uint64]*pending[C] // by ref
	conns    map[C]*conn[C]
	connSeq  uint64
	nextRef  uint64
	// uncommitted counts acquires proposed but not applied: those that may
	// wait per key (for MaxWaitersPerKey), all in total (for MaxKeys).
	uncommitted      map[string]int
	uncommittedTotal int
	// raising: the grants each set-permits raise not applied yet may make
	// (by ref), counted in uncommittedTotal.
	raising map[uint64]int
	// revokeNext: the token the revoke being resolved granted in its
	// own commit (Applied sets it for resolve; 0: none).
	revokeNext uint64
	// expiring: when the lease of each expiry this leader proposed ran
	// out (by token), for the hand-off latency; emptied on apply.
	expiring map[uint64]time.Time
	// heldExtends: extends of a token whose expiry this leader proposed
	// and has not seen applied or failed (expiring), held back until it
	// settles: proposed at once, one could reach the log before the
	// expiry (the node's proposer puts housekeeping and requests in
	// separate queues, and a backlog of expiries spans batches), be told
	// K with a fresh lease, and then lose the holding to that stale
	// expiry (issue 39: two holders, shown on real nodes with a commit
	// stall). Proposed after it, each gets the state's answer.
	heldExtends map[uint64][]locksm.Command
	// refusedReleases: releases of grants nobody can use (Ref 0: a grant
	// to a dead connection, an untold grant of an ended session) that
	// Raft refused unappended during a hand-over; proposed again if this
	// leadership serves again (EndHandOver), else the grant would keep
	// its whole lease.
	refusedReleases []locksm.Command
	// extending counts, by token, the extends proposed and not yet
	// applied (nor failed); deferred holds a token's lease timer that came
	// due meanwhile, decided again when the count drops to 0.
	extending map[uint64]int
	deferred  map[uint64]Timer
	// extendedUntil: for a token extended while leading, the deadline of
	// the newest lease timer its extends armed. A timer of the token due
	// before it is superseded. Dropped when that timer comes due.
	extendedUntil map[uint64]time.Time
	// told: the connection each grant of this leadership was told on, by
	// token (an older connection than wire.VersionExtend too: its holder
	// gets no lost event, and nobody else need be told); dropped when the
	// holding's release or expiry is applied.
	told map[uint64]*conn[C]

	// sessions: what this leadership knows of each live session (every
	// session of the table from Serve on, and those opened since).
	sessions map[uint64]*session[C]
	// attachingTo: the open or resume in flight of each session (at most
	// one; later ones wait in session.waiting).
	attachingTo map[uint64]*pending[C]
	// closingSess: the broker's close in flight of each session.
	closingSess map[uint64]*pending[C]
	// untold: grants applied in this leadership's own term (after
	// BarrierApplied) to a session that was not attached here, not
	// delivered at a resume since, nor extended or released by anyone
	// (token → session): the Tokens of the session's expiry. A grant
	// applied before the barrier is never in it: an earlier leader may
	// have told it.
	untold map[uint64]untoldGrant
	// sessQueued counts the queued waiters of sessions among pend: they
	// are not owed by this leader alone (a hand-over does not wait for
	// them; the brokers resume them on the target).
	sessQueued int
	// marks: the sessions the batch being applied recorded outcomes of,
	// in the order first marked; markAt indexes them by session (a batch
	// touching thousands of sessions found each by a scan: quadratic,
	// 18 ms for 4096 sessions, BenchmarkAppliedManySessions).
	marks  []sessMark
	markAt map[uint64]int

	// Places in line (positions.go). posDirty: the keys whose lines moved
	// since the last walk; posArmed: the epoch whose walk timer is armed
	// (0: none); blockTold: what each block waiter was told per key (by
	// ref, in the order of its keys); rates: every key's pace of
	// hand-offs, kept on every node from the log.
	posDirty  map[string]lineMark
	posArmed  uint64
	blockTold map[uint64][]uint32
	rates     map[string]*handoffRate
	// walkRefs: the refs of the line being walked, copied out of the
	// table (reused between the lines of one walk).
	walkRefs []uint64

	rd Ready[C]
}

// New returns a core that does not lead. It panics on a config that does
// not Validate (the caller validated its own).
func New[C comparable](cfg Config, table Table, dir Directory) *Core[C] {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	return &Core[C]{
		cfg: cfg, table: table, dir: dir,
		pend:          map[uint64]*pending[C]{},
		conns:         map[C]*conn[C]{},
		nextRef:       cfg.FirstRef,
		uncommitted:   map[string]int{},
		raising:       map[uint64]int{},
		expiring:      map[uint64]time.Time{},
		extending:     map[uint64]int{},
		deferred:      map[uint64]Timer{},
		extendedUntil: map[uint64]time.Time{},
		told:          map[uint64]*conn[C]{},
		sessions:      map[uint64]*session[C]{},
		attachingTo:   map[uint64]*pending[C]{},
		closingSess:   map[uint64]*pending[C]{},
		untold:        map[uint64]untoldGrant{},
		markAt:        map[uint64]int{},
		heldExtends:   map[uint64][]locksm.Command{},
		posDirty:      map[string]lineMark{},
		blockTold:     map[uint64][]uint32{},
		rates:         map[string]*handoffRate{},
	}
}

// Ready returns the outputs collected since the last Advance.
func (k *Core[C]) Ready() *Ready[C] {
	k.rd.Epoch = k.epoch
	return &k.rd
}

// Advance acknowledges that the outputs of Ready were performed.
func (k *Core[C]) Advance() {
	clear(k.rd.Sends) // keep no strings alive
	clear(k.rd.Proposals)
	clear(k.rd.Timers)
	k.rd.Sends, k.rd.Proposals, k.rd.Timers, k.rd.Events = k.rd.Sends[:0], k.rd.Proposals[:0], k.rd.Timers[:0], k.rd.Events[:0]
	clear(k.rd.Closes)
	clear(k.rd.Refusals)
	clear(k.rd.Silences)
	k.rd.Closes, k.rd.Refusals, k.rd.Silences = k.rd.Closes[:0], k.rd.Refusals[:0], k.rd.Silences[:0]
	k.rd.ClearTimers = false
}

// ---- queries ----

// Leading reports whether the core leads, and the current epoch.
func (k *Core[C]) Leading() (bool, uint64) { return k.leading, k.epoch }

// Serving reports whether lock requests are taken.
func (k *Core[C]) Serving() bool { return k.serving }

// Owed is the number of requests whose reply is owed by this leadership:
// the queued waiters of sessions do not count (they stay in the line
// through a leader change, and their brokers resume them on the next
// leader).
func (k *Core[C]) Owed() int { return len(k.pend) - k.sessQueued }

// WaitDeadline is when the wait of the acquire with ref on key runs out,
// if that acquire is owed a reply.
func (k *Core[C]) WaitDeadline(ref uint64, key string) (time.Time, bool) {
	p := k.pend[ref]
	if p == nil || !p.acquire() || p.key != key || p.deadline.IsZero() {
		return time.Time{}, false
	}
	return p.deadline, true
}

// ExtendedUntil reports when the lease timer armed by the newest extend
// of token applied while leading runs out (the holding's leader-side
// deadline; earlier timers of the token are superseded), for inspection.
func (k *Core[C]) ExtendedUntil(token uint64) (time.Time, bool) {
	at, ok := k.extendedUntil[token]
	return at, ok
}

// ---- outputs ----

func (k *Core[C]) send(to *conn[C], m wire.Msg) {
	k.rd.Sends = append(k.rd.Sends, Send[C]{To: to.handle, Msg: m})
}

func (k *Core[C]) propose(c locksm.Command) { k.rd.Proposals = append(k.rd.Proposals, c) }

func (k *Core[C]) event(e Event) { k.rd.Events = append(k.rd.Events, e) }

func (k *Core[C]) reply(op locksm.Op, o Outcome) {
	k.rd.Events = append(k.rd.Events, Event{Kind: EventReply, Op: op, Outcome: o})
}

// ---- connections ----

// Open registers a connection whose handshake negotiated version. One
// opened during a hand-over that speaks notices is told of it (its
// acknowledgement is not waited for).
func (k *Core[C]) Open(h C, version uint16) {
	k.connSeq++
	cn := &conn[C]{handle: h, seq: k.connSeq, inflight: map[uint64]*pending[C]{}, version: version}
	k.conns[h] = cn
	if ho := k.handover; ho != nil && ho.active && version >= wire.VersionNotices {
		k.send(cn, wire.Msg{Type: wire.TypeNotice, Event: wire.NoticeHandOver, LeaderID: ho.id, LeaderAddr: ho.addr})
	}
}

// Closed records that connection h stopped reading (at now): its queued
// acquires are cancelled, and grants that arrive for it later are
// released. A connection's session is only detached: its requests stay
// (queued, or in flight), their outcomes wait in the state for the
// broker's resume, and the session's liveness timer starts. A connection
// never opened is ignored.
func (k *Core[C]) Closed(now time.Time, h C) {
	cn := k.conns[h]
	if cn == nil {
		return
	}
	k.noticeAcked(cn) // a hand-over need not wait for it any more
	cn.dead = true
	delete(k.conns, h)
	if s := cn.sess; s != nil {
		k.detach(now, s)
	}
	for _, p := range sortedByRef(cn.inflight) {
		if p.session() != nil {
			continue
		}
		if p.acquire() && p.queued && !p.cancel {
			p.cancel = true
			k.propose(locksm.Command{Op: locksm.OpCancelWait, Key: p.key, Ref: p.ref})
		}
	}
}

// ---- requests ----

// Request takes one request frame of connection h (opened): an acquire, a
// release, a cancel or a notice acknowledgement; any other type is answered
// E unexpected_frame. It returns false when the connection must be closed
// (after its queued output is written).
func (k *Core[C]) Request(now time.Time, h C, m *wire.Msg) bool {
	cn := k.conns[h]
	if cn == nil {
		// A wiring bug: requests come only between Open and Closed.
		k.rd.Sends = append(k.rd.Sends, Send[C]{To: h, Msg: wire.Msg{Type: wire.TypeError, ID: m.ID,
			Code: wire.CodeInternal, Text: "connection not open"}})
		return false
	}
	switch m.Type {
	case wire.TypeNoticeAck:
		k.noticeAcked(cn)
		k.send(cn, wire.Msg{Type: wire.TypeOK, ID: m.ID})
		return true
	case wire.TypeWatchPositions:
		if !wire.RequestAllowed(m.Type, cn.version) {
			k.send(cn, wire.Msg{Type: wire.TypeError, Code: wire.CodeUnexpectedFrame,
				Text: fmt.Sprintf("positions request on a version %d connection (from version %d)", cn.version, wire.VersionPositions)})
			return false
		}
		k.watchPositions(now, cn)
		k.send(cn, wire.Msg{Type: wire.TypeOK, ID: m.ID})
		return true
	case wire.TypeAcquireBlock, wire.TypeExtend, wire.TypeAcquirePermit, wire.TypeSetPermits:
		if !wire.RequestAllowed(m.Type, cn.version) {
			what, from := "block acquire", wire.VersionBlocks
			switch m.Type {
			case wire.TypeExtend:
				what, from = "extend", wire.VersionExtend
			case wire.TypeAcquirePermit, wire.TypeSetPermits:
				what, from = "semaphore request", wire.VersionSemaphores
			}
			k.send(cn, wire.Msg{Type: wire.TypeError, Code: wire.CodeUnexpectedFrame,
				Text: fmt.Sprintf("%s on a version %d connection (from version %d)", what, cn.version, from)})
			return false
		}
	case wire.TypeOpenSession, wire.TypeResume, wire.TypeSessionAck, wire.TypeCloseSession:
		if !wire.RequestAllowed(m.Type, cn.version) {
			k.send(cn, wire.Msg{Type: wire.TypeError, Code: wire.CodeUnexpectedFrame,
				Text: fmt.Sprintf("session frame on a version %d connection (from version %d)", cn.version, wire.VersionSessions)})
			return false
		}
		return k.sessionRequest(now, cn, m)
	case wire.TypeAcquire, wire.TypeRelease, wire.TypeCancel:
	default:
		k.send(cn, wire.Msg{Type: wire.TypeError, Code: wire.CodeUnexpectedFrame, Text: "not a request frame"})
		return false
	}
	if m.Label != "" && cn.version < wire.VersionLabels {
		// The frame was longer than its version allows: a broken client.
		k.send(cn, wire.Msg{Type: wire.TypeError, Code: wire.CodeUnexpectedFrame,
			Text: fmt.Sprintf("acquire with a label on a version %d connection (from version %d)", cn.version, wire.VersionLabels)})
		return false
	}

	// Checks that need no state give a definite error; nothing is proposed.
	var cmd locksm.Command
	switch m.Type {
	case wire.TypeAcquire:
		cmd = locksm.Command{Op: locksm.OpAcquire, Key: m.Key, Owner: m.Owner, Label: m.Label, LeaseSec: uint32(m.Lease), WaitMs: m.WaitMs}
	case wire.TypeAcquirePermit:
		cmd = locksm.Command{Op: locksm.OpAcquirePermit, Key: m.Key, Owner: m.Owner, Label: m.Label, LeaseSec: uint32(m.Lease), WaitMs: m.WaitMs}
	case wire.TypeSetPermits:
		cmd = locksm.Command{Op: locksm.OpSetPermits, Key: m.Key, Permits: m.Permits}
	case wire.TypeAcquireBlock:
		// The state keeps the keys: a copy, so nothing the caller reuses
		// can change them.
		cmd = locksm.Command{Op: locksm.OpAcquireBlock, Keys: slices.Clone(m.Keys), Owner: m.Owner, Label: m.Label,
			LeaseSec: uint32(m.Lease), WaitMs: m.WaitMs}
	case wire.TypeRelease:
		cmd = locksm.Command{Op: locksm.OpRelease, Key: m.Key, Owner: m.Owner, Token: m.Token}
	case wire.TypeExtend:
		cmd = locksm.Command{Op: locksm.OpExtend, Key: m.Key, Owner: m.Owner, Token: m.Token, LeaseSec: uint32(m.Lease)}
	}
	if m.Type != wire.TypeCancel {
		if err := locksm.ValidateCommand(cmd); err != nil {
			k.reply(cmd.Op, OutcomeError)
			k.send(cn, errReply(m.ID, err))
			return true
		}
	}

	if _, dup := cn.inflight[m.ID]; dup {
		// Two replies with one id could not be told apart: close.
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, wire.Msg{Type: wire.TypeError, ID: m.ID, Code: wire.CodeDuplicateID, Text: "request id already in flight"})
		return false
	}
	var sess *session[C]
	if m.Type != wire.TypeSetPermits {
		// An operator's set-permits carries no session: setting n twice
		// is harmless, and its log entry has no session fields.
		var ok bool
		if sess, ok = k.sessionOfRequest(cn, m, &cmd); !ok {
			return false
		}
	}
	if m.Type == wire.TypeCancel {
		p := cn.inflight[m.Target]
		if p == nil || !p.acquire() {
			k.send(cn, wire.Msg{Type: wire.TypeError, ID: m.ID, Code: wire.CodeUnknownTarget, Text: "no pending acquire with that id"})
			return true
		}
		if !p.cancel {
			p.cancel = true
			if p.queued {
				k.propose(locksm.Command{Op: locksm.OpCancelWait, Key: p.key, Ref: p.ref})
			}
		}
		// The target's own reply (T, or G if the grant won the race) is
		// the outcome; K only says the cancel was taken.
		k.send(cn, wire.Msg{Type: wire.TypeOK, ID: m.ID})
		return true
	}
	if !k.serving {
		addr, id := k.hint()
		k.reply(cmd.Op, OutcomeMoved)
		k.send(cn, wire.Msg{Type: wire.TypeMoved, ID: m.ID, LeaderAddr: addr, LeaderID: id})
		return true
	}
	if cmd.Op == locksm.OpAcquireBlock && k.table.ClusterVersion() < wire.VersionBlocks {
		// Older members could not apply it: they would skip the entry
		// and their tables would diverge.
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, errReply(m.ID, fmt.Errorf("%w: block acquires need every member at protocol version %d; the cluster version is %d (upgrade every node; the leader records the new version within %s)",
			wire.ErrNotSupported, wire.VersionBlocks, k.table.ClusterVersion(), "30s")))
		return true
	}
	if (cmd.Op == locksm.OpAcquirePermit || cmd.Op == locksm.OpSetPermits) && k.table.ClusterVersion() < wire.VersionSemaphores {
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, errReply(m.ID, fmt.Errorf("%w: semaphores need every member at protocol version %d; the cluster version is %d (upgrade every node; the leader records the new version within %s)",
			wire.ErrNotSupported, wire.VersionSemaphores, k.table.ClusterVersion(), "30s")))
		return true
	}
	if cmd.Op == locksm.OpExtend && k.table.ClusterVersion() < wire.VersionExtend {
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, errReply(m.ID, fmt.Errorf("%w: extends need every member at protocol version %d; the cluster version is %d (upgrade every node; the leader records the new version within %s)",
			wire.ErrNotSupported, wire.VersionExtend, k.table.ClusterVersion(), "30s")))
		return true
	}
	if cmd.WaitMs > locksm.MaxShortWaitMs && k.table.ClusterVersion() < wire.VersionLongWaits {
		// Older members would reject the entry the others queue.
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, errReply(m.ID, fmt.Errorf("%w: waits over %d s need every member at protocol version %d; the cluster version is %d (upgrade every node, or wait at most %d s; the leader records the new version within %s)",
			wire.ErrNotSupported, locksm.MaxShortWaitMs/1000, wire.VersionLongWaits, k.table.ClusterVersion(), locksm.MaxShortWaitMs/1000, "30s")))
		return true
	}
	if cmd.Label != "" && k.table.ClusterVersion() < wire.VersionLabels {
		// Refused rather than sent without its label: the caller asked
		// for a name that inspect and the logs would not show.
		k.reply(cmd.Op, OutcomeError)
		k.send(cn, errReply(m.ID, fmt.Errorf("%w: labels need every member at protocol version %d; the cluster version is %d (upgrade every node, or acquire without a label; the leader records the new version within %s)",
			wire.ErrNotSupported, wire.VersionLabels, k.table.ClusterVersion(), "30s")))
		return true
	}
	if n := cn.flying(cmd.Op); n >= k.cfg.MaxInFlightPerConn {
		k.event(Event{Kind: EventRefusedInFlight})
		k.reply(cmd.Op, OutcomeError)
		what := "acquires"
		if releasing(cmd.Op) {
			what = "releases and extends"
		}
		k.send(cn, errReply(m.ID, fmt.Errorf("%w: %d %s on this connection not committed yet; this node allows %d per connection",
			wire.ErrTooManyInFlight, n, what, k.cfg.MaxInFlightPerConn)))
		return true
	}
	var keys []string // the keys the acquire takes
	switch cmd.Op {
	case locksm.OpAcquire, locksm.OpAcquirePermit:
		keys = []string{m.Key}
	case locksm.OpAcquireBlock:
		keys = cmd.Keys
	}
	if keys != nil && sess != nil && k.cfg.MaxSessionOutcomes > 0 {
		if info, ok := k.table.Session(sess.id); ok && info.Serial-min(info.Serial, max(info.Ack, sess.ack)) >= uint64(k.cfg.MaxSessionOutcomes) {
			// A broker that never acks would grow the replicated state
			// (and every snapshot) by an outcome per request.
			k.event(Event{Kind: EventRefusedOutcomes})
			k.reply(cmd.Op, OutcomeError)
			k.send(cn, errReply(m.ID, fmt.Errorf("%w: session %d has %d outcomes not acknowledged; this node allows %d (ack with 'k')",
				wire.ErrTooManyOutcomes, sess.id, info.Serial-max(info.Ack, sess.ack), k.cfg.MaxSessionOutcomes)))
			return true
		}
	}
	if keys != nil {
		if m.WaitMs > 0 && cn.waiters >= k.cfg.MaxWaitersPerConn {
			k.event(Event{Kind: EventRefusedConnWaiters})
			k.reply(cmd.Op, OutcomeError)
			k.send(cn, errReply(m.ID, fmt.Errorf("%w on this connection: %d waiting or joining; this node allows %d per connection",
				wire.ErrTooManyWaiters, cn.waiters, k.cfg.MaxWaitersPerConn)))
			return true
		}
		if err := k.admitAcquire(keys, m.WaitMs > 0, cmd.Op == locksm.OpAcquirePermit); err != nil {
			k.reply(cmd.Op, OutcomeError)
			k.send(cn, errReply(m.ID, err))
			return true
		}
	}
	defining := false // a set-permits that may define a new semaphore
	raiseGrants := 0  // the permits a raise may grant at once
	if cmd.Op == locksm.OpSetPermits && cmd.Permits > 0 {
		// A new definition is sticky table memory, as a key is: MaxKeys
		// bounds it.
		if err := k.admitAcquire([]string{m.Key}, false, false); err != nil {
			k.reply(cmd.Op, OutcomeError)
			k.send(cn, errReply(m.ID, err))
			return true
		}
		held, _, _ := k.table.Occupancy(m.Key)
		defining = !held
		// A raise grants waiters in the same command, each a holding
		// MaxKeys counts, although none was admitted as one: a waiter
		// counts only while it joins. The attack round raised a semaphore
		// of 1 with 6 waiters to 7 past --max-keys 4.
		if err := k.admitRaise(m.Key, cmd.Permits, &raiseGrants); err != nil {
			k.reply(cmd.Op, OutcomeError)
			k.send(cn, errReply(m.ID, err))
			return true
		}
	}
	k.nextRef++
	cmd.Ref = k.nextRef
	p := &pending[C]{conn: cn, id: m.ID, op: cmd.Op, key: cmdKey(&cmd), owner: m.Owner, leaseSec: cmd.LeaseSec, ref: cmd.Ref, start: now, ext: sessExt(sess)}
	if cmd.Op == locksm.OpAcquireBlock {
		p.keys = cmd.Keys
	}
	if keys != nil {
		p.deadline = now.Add(time.Duration(m.WaitMs) * time.Millisecond)
		p.uncommitted, p.mayWait = true, m.WaitMs > 0
		for _, key := range keys {
			if p.mayWait {
				k.uncommitted[key]++
			}
			k.uncommittedTotal++
		}
	}
	if defining {
		// Counted until applied, as an acquire's key is: a pipelined
		// burst of definitions cannot pass the bound before any applies.
		p.uncommitted = true
		k.uncommittedTotal++
	}
	if raiseGrants > 0 {
		// So are a raise's grants, so that a burst of raises cannot.
		k.raising[p.ref] = raiseGrants
		k.uncommittedTotal += raiseGrants
	}
	k.pend[p.ref] = p
	cn.owe(p)
	if cmd.Op == locksm.OpExtend && k.table.MatchesHolding(cmd.Key, cmd.Owner, cmd.Token, cmd.Session) {
		// Only an extend that can still succeed holds the token's expiry
		// back: tokens never repeat and a holding's owner and session
		// never change, so one that names another owner or session, a key
		// the token does not hold, or a token already ended, can never be
		// applied as extended.
		// Counting it would let a stray or hostile client that keeps one
		// in flight stop any lease from ever expiring (issue 39, finding
		// 7).
		k.extending[cmd.Token]++
		p.token = cmd.Token
	}
	if cmd.Op == locksm.OpExtend {
		if _, expiring := k.expiring[cmd.Token]; expiring {
			k.heldExtends[cmd.Token] = append(k.heldExtends[cmd.Token], cmd)
			return true
		}
	}
	k.propose(cmd)
	return true
}

// expirySettled proposes the extends held back for token's expiry, which
// applied or failed.
func (k *Core[C]) expirySettled(token uint64) {
	delete(k.expiring, token)
	if held, ok := k.heldExtends[token]; ok {
		delete(k.heldExtends, token)
		for _, c := range held {
			k.propose(c)
		}
	}
}

// releasing reports whether op counts in a connection's releases in flight
// (a release, or an extend: both concern a lock held already, and neither
// may wait behind a flood of acquires; an operator's set-permits, which
// must not either: raising n is how an operator relieves such a flood).
func releasing(op locksm.Op) bool {
	return op == locksm.OpRelease || op == locksm.OpExtend || op == locksm.OpSetPermits || op == locksm.OpRevoke
}

// flying is how many requests of op cn has in flight (their own command
// not applied yet): the count MaxInFlightPerConn bounds for op.
func (cn *conn[C]) flying(op locksm.Op) int {
	if releasing(op) {
		return cn.releasing
	}
	return cn.acquiring
}

// owe files p, a request just proposed, under its connection.
func (cn *conn[C]) owe(p *pending[C]) {
	cn.inflight[p.id] = p
	cn.count(p, 1)
}

// unowe forgets p, whose reply is being sent (or lost with leadership).
func (cn *conn[C]) unowe(p *pending[C]) {
	delete(cn.inflight, p.id)
	cn.count(p, -1)
}

// count adds d to the counts p is in.
func (cn *conn[C]) count(p *pending[C], d int) {
	if p.attachment() != nil {
		return // an open or resume is no lock work
	}
	if p.inFlight() {
		if releasing(p.op) {
			cn.releasing += d
		} else {
			cn.acquiring += d
		}
	}
	if p.waiter() {
		cn.waiters += d
	}
}

// admitAcquire applies MaxKeys and MaxWaitersPerKey to an acquire of keys
// (one key, or a block's; mayWait: its wait is not zero, so it can join
// the queues). Acquires proposed but not yet applied count as if each of
// their keys were created and, if they may wait, joined by them, so a
// burst cannot overshoot. permit: a permit acquire, which adds a holding
// (a permit is table memory like a key) even though its key is defined
// already; it counts as fresh, so at the bound it is refused even where
// it would only queue.
func (k *Core[C]) admitAcquire(keys []string, mayWait, permit bool) error {
	fresh, total := 0, 0
	for _, key := range keys {
		held, n, queue := k.table.Occupancy(key)
		total = n
		if !held || permit {
			fresh++
		}
		if mayWait && queue+k.uncommitted[key] >= k.cfg.MaxWaitersPerKey {
			k.event(Event{Kind: EventRefusedWaiters})
			return fmt.Errorf("%w on key %q: %d waiting or joining; this node allows %d per key", wire.ErrTooManyWaiters, key, queue+k.uncommitted[key], k.cfg.MaxWaitersPerKey)
		}
	}
	if fresh > 0 && total+k.uncommittedTotal+fresh > k.cfg.MaxKeys {
		k.event(Event{Kind: EventRefusedKeys})
		return fmt.Errorf("%w: %d keys held or being acquired; this node allows %d", wire.ErrTooManyKeys, total+k.uncommittedTotal, k.cfg.MaxKeys)
	}
	return nil
}

// admitRaise refuses a set-permits of key to n that would grant more
// waiters at once than MaxKeys leaves room for, and sets *grants to how
// many it may grant (0 for a definition or a lowering).
func (k *Core[C]) admitRaise(key string, n uint32, grants *int) error {
	sem, ok := k.table.Semaphore(key)
	if !ok || int(n) <= sem.Held {
		return nil
	}
	_, total, queue := k.table.Occupancy(key)
	// The waiters it may grant: those queued, and those on their way
	// (proposed, may wait: counted in uncommittedTotal only until they
	// apply, which may be before this raise, leaving their room to
	// others; the second attack round of issue 41 raced six acquires
	// with a raise past the bound that way). Counting both may refuse a
	// raise the bound would have allowed; never one past it.
	g := min(int(n)-sem.Held, queue+k.uncommitted[key])
	if g > 0 && total+k.uncommittedTotal+g > k.cfg.MaxKeys {
		k.event(Event{Kind: EventRefusedKeys})
		return fmt.Errorf("%w: raising %q to %d permits would grant %d waiters with %d keys held or being acquired; this node allows %d",
			wire.ErrTooManyKeys, key, n, g, total+k.uncommittedTotal, k.cfg.MaxKeys)
	}
	*grants = g
	return nil
}

// committed drops p from the uncommitted-acquire counts (its command was
// applied, or will never be). Idempotent.
func (k *Core[C]) committed(p *pending[C]) {
	if g, ok := k.raising[p.ref]; ok {
		k.uncommittedTotal -= g
		delete(k.raising, p.ref)
	}
	if !p.uncommitted {
		return
	}
	p.uncommitted = false
	for _, key := range p.keySet() {
		if p.mayWait {
			if k.uncommitted[key]--; k.uncommitted[key] <= 0 {
				delete(k.uncommitted, key)
			}
		}
		k.uncommittedTotal--
	}
}

// finish forgets p (its reply is being sent).
func (k *Core[C]) finish(p *pending[C]) {
	if p.session() != nil && p.queued {
		k.sessQueued--
	}
	k.committed(p)
	delete(k.pend, p.ref)
	if p.keys != nil {
		delete(k.blockTold, p.ref)
	}
	p.conn.unowe(p)
	if p.op == locksm.OpExtend && p.token != 0 {
		k.extendSettled(p.token)
	}
}

// extendSettled counts an extend of token out of Core.extending (applied,
// failed, or lost with leadership) and, when none is left in flight,
// decides a lease timer of token that came due meanwhile.
func (k *Core[C]) extendSettled(token uint64) {
	if k.extending[token]--; k.extending[token] > 0 {
		return
	}
	delete(k.extending, token)
	if t, ok := k.deferred[token]; ok {
		delete(k.deferred, token)
		k.TimerDue(t)
	}
}

func errReply(id uint64, err error) wire.Msg {
	return wire.Msg{Type: wire.TypeError, ID: id, Code: wire.CodeOf(err), Text: err.Error()}
}

// ---- proposals and applies ----

// ProposalFailed answers the requests of commands whose proposal failed.
// epoch is Ready.Epoch of the Ready they came in: a failure of another
// leadership's proposals is ignored, since LoseLeadership answered and
// forgot everything that leadership owed, and the same tokens, sessions
// and refs may be in flight again in this one (an expiry of the same
// token, say, which an earlier expiry's failure must not settle).
// notAppended: the entry was never appended (definitely not executed: M
// with the leader hint); otherwise it may have been appended and may still
// commit under the next leader (U, saying err).
func (k *Core[C]) ProposalFailed(epoch uint64, cmds []locksm.Command, notAppended bool, err error) {
	if epoch != k.epoch || !k.leading {
		return
	}
	addr, id := "", ""
	if notAppended {
		addr, id = k.hint()
	}
	for _, c := range cmds {
		if c.Op == locksm.OpExpire {
			k.expirySettled(c.Token)
		}
		if c.Op == locksm.OpRelease && c.Ref == 0 && notAppended {
			k.refusedReleases = append(k.refusedReleases, c)
			continue
		}
		if k.sessionProposalFailed(&c, notAppended, addr, id, err) {
			continue
		}
		p := k.pend[c.Ref]
		if c.Ref == 0 || p == nil || p.op != c.Op || p.key != cmdKey(&c) || p.queued {
			continue
		}
		k.finish(p)
		switch {
		case notAppended:
			k.reply(p.op, OutcomeMoved)
			k.answer(p, wire.Msg{Type: wire.TypeMoved, ID: p.id, LeaderAddr: addr, LeaderID: id})
		case p.session() != nil:
			// It may still commit; only the state can tell. Nothing is
			// sent for it: its broker learns its outcome from a resume,
			// after this connection closes.
			if cn := p.session().conn; cn != nil && !cn.closing {
				cn.closing = true
				k.rd.Closes = append(k.rd.Closes, cn.handle)
			}
		default:
			k.reply(p.op, OutcomeIndeterminate)
			k.send(p.conn, wire.Msg{Type: wire.TypeUnknown, ID: p.id, Text: "not committed before " + err.Error() + ": outcome unknown"})
		}
	}
}

// Applied takes what the log applied, in log order (on every node; a
// follower owes nobody). now is when the batch reached the core: lease
// timers of new grants start then, since the holder's own clock started
// when it sent the acquire, before this. A grant is never told before the
// command that queued it, since commands come in log order.
func (k *Core[C]) Applied(now time.Time, batch []Applied) {
	k.clearMarks()
	for i := range batch {
		a := &batch[i]
		if k.leading && k.term != 0 && a.Term > k.term {
			term := k.term
			_, owed := k.LoseLeadership(fmt.Sprintf("an entry of term %d applied in the leadership of term %d: a newer leader appended it", a.Term, term))
			k.event(Event{Kind: EventSuperseded, Keys: owed})
		}
		k.notePace(a)
		k.movedBy(now, a)
		c := &a.Cmd
		key := cmdKey(c)
		if c.Op.SessionOp() {
			k.sessionApplied(now, a, batch[i+1:])
			continue
		}
		if c.Session != 0 || len(a.Effects) > 0 {
			// Only sessions' commands and hand-offs concern sessions.
			if k.ownTerm {
				k.noteUntold(a)
			}
			k.mark(c.Session, a.Res.Serial)
		}
		if k.leading && a.Res.Status == locksm.StatusGranted {
			k.armExpiry(now, key, a.Res.Token, c.LeaseSec)
		}
		if k.leading && a.Res.Status == locksm.StatusExtended {
			// Before the extend's own pending is resolved below, which may
			// decide a deferred timer of the token: it must find this one.
			// With the lease the state renewed: from cluster version 10
			// never lower than the holding's, so this timer is never
			// earlier than one armed before it for the token (apply
			// times only grow), and superseding them shortens nothing.
			at := k.armExpiry(now, c.Key, c.Token, a.Res.LeaseSec)
			k.extendedUntil[c.Token] = at
		}
		// freedAt: when the key this command frees was freed, as the
		// leader saw it (for the hand-off latency).
		var freedAt time.Time
		var own *pending[C] // a session's, resolved after the effects: serial order
		if p := k.pend[c.Ref]; c.Ref != 0 && p != nil && p.op == c.Op && p.key == key && !p.queued {
			if c.Op == locksm.OpRevoke {
				k.revokeNext = handedTo(a.Effects)
			}
			if c.Op == locksm.OpRelease {
				freedAt = p.start
			}
			if c.Session != 0 {
				own = p
			} else {
				k.resolve(p, a.Res, now)
			}
		}
		switch c.Op {
		case locksm.OpExpire:
			if at, ok := k.expiring[c.Token]; ok {
				freedAt = at
				k.expirySettled(c.Token)
			}
			if k.leading && a.Res.Status == locksm.StatusExpired {
				k.event(Event{Kind: EventExpiry})
				k.tellLost(c.Key, c.Token)
			}
			delete(k.told, c.Token)
			delete(k.untold, c.Token)
		case locksm.OpRelease:
			if a.Res.Status == locksm.StatusReleased {
				delete(k.told, c.Token)
				delete(k.untold, c.Token)
			}
		case locksm.OpRevoke:
			if a.Res.Status == locksm.StatusRevoked {
				k.revokeApplied(a)
			}
		case locksm.OpExtend:
			if a.Res.Status == locksm.StatusExtended {
				// Whoever extended it knows the token: told.
				delete(k.untold, c.Token)
			}
		}
		k.effects(now, a.Effects, freedAt)
		if own != nil {
			k.resolve(own, a.Res, now)
		}
	}
	k.watermarks()
}

// effects answers what a command's effects owe: hand-off grants, waits
// timed out or dropped. freedAt: when the key it frees was freed.
func (k *Core[C]) effects(now time.Time, effects []locksm.Effect, freedAt time.Time) {
	for _, e := range effects {
		k.mark(e.Session, e.Serial)
		switch e.Kind {
		case locksm.EffectGranted:
			if k.leading {
				k.armExpiry(now, e.Key, e.Token, e.LeaseSec)
				k.event(Event{Kind: EventHandoff})
			}
			if p := k.pend[e.Ref]; p != nil && p.queued && p.key == e.Key {
				if k.granted(p, e.Token, e.Slot, now) && !freedAt.IsZero() {
					k.event(Event{Kind: EventHandoffLatency, Latency: now.Sub(freedAt)})
				}
			}
		case locksm.EffectTimedOut, locksm.EffectDropped:
			if p := k.pend[e.Ref]; p != nil && p.queued && p.key == e.Key {
				k.finish(p)
				if e.Kind == locksm.EffectTimedOut {
					k.reply(p.op, OutcomeTimeout)
					k.answer(p, wire.Msg{Type: wire.TypeTimeout, ID: p.id})
				} else {
					k.reply(p.op, OutcomeIndeterminate)
					k.answer(p, wire.Msg{Type: wire.TypeUnknown, ID: p.id, Text: "waiter dropped by a new leader"})
				}
			}
		}
	}
}

// resolve handles the result of p's own command.
func (k *Core[C]) resolve(p *pending[C], res locksm.Result, now time.Time) {
	switch res.Status {
	case locksm.StatusGranted:
		k.granted(p, res.Token, res.Slot, now)
	case locksm.StatusQueued:
		k.committed(p)
		// Queued, it is no longer in flight (it stays a waiter).
		p.conn.count(p, -1)
		p.queued = true
		p.conn.count(p, 1)
		if p.session() != nil {
			k.sessQueued++
		}
		if cn := k.dest(p); cn != nil && !cn.dead && cn.version >= wire.VersionQueued {
			k.send(cn, wire.Msg{Type: wire.TypeQueued, ID: p.id})
		}
		switch {
		case p.cancel || (p.session() == nil && (p.conn.dead || k.withdrawing())):
			// Gone, cancelled, or a hand-over withdraws its waiters (a
			// session's waiter stays: its broker resumes it on the next
			// leader).
			p.cancel = true
			k.propose(locksm.Command{Op: locksm.OpCancelWait, Key: p.key, Ref: p.ref})
		default:
			k.rd.Timers = append(k.rd.Timers, Timer{At: p.deadline, Kind: TimerWait, Key: p.key, Ref: p.ref, Epoch: k.epoch})
		}
	case locksm.StatusBusy:
		k.finish(p)
		k.reply(p.op, OutcomeBusy)
		k.answer(p, wire.Msg{Type: wire.TypeBusy, ID: p.id})
	case locksm.StatusReleased, locksm.StatusExtended, locksm.StatusPermitsSet:
		k.finish(p)
		k.reply(p.op, OutcomeOK)
		k.answer(p, wire.Msg{Type: wire.TypeOK, ID: p.id})
	case locksm.StatusRevoked:
		// An in-process reply (the admin port answers in JSON): Token
		// the revoked token, High the token its commit granted next.
		k.finish(p)
		k.reply(p.op, OutcomeOK)
		k.answer(p, wire.Msg{Type: wire.TypeOK, ID: p.id, Token: res.Token, High: k.revokeNext})
		k.revokeNext = 0
	case locksm.StatusRejected:
		k.finish(p)
		if p.session() != nil && errors.Is(res.Err, locksm.ErrVoided) {
			// A resume already answered it "never applied"; a reply now
			// would be a second one.
			return
		}
		k.reply(p.op, rejected(p.op, res.Err))
		k.answer(p, wire.Msg{Type: wire.TypeError, ID: p.id, Code: wire.CodeOf(res.Err), Text: res.Err.Error()})
	default:
		k.finish(p)
		k.reply(p.op, OutcomeError)
		k.event(Event{Kind: EventUnexpectedResult, Op: p.op, Status: res.Status})
		k.answer(p, wire.Msg{Type: wire.TypeError, ID: p.id, Code: wire.CodeInternal, Text: "unexpected result"})
	}
}

// granted tells p its token (and, for a permit, its slot), or, if p's
// connection died before the grant could be written, releases it at once:
// nobody can know that token, so nobody can use it, and the next waiter
// should not wait for the lease. It reports whether the grant was told.
func (k *Core[C]) granted(p *pending[C], token uint64, slot uint32, now time.Time) bool {
	g := wire.Msg{Type: wire.TypeGranted, ID: p.id, Token: token, Permit: p.op == locksm.OpAcquirePermit, Slot: slot}
	k.finish(p)
	if s := p.session(); s != nil {
		// A session's grant waits in the state for the resume when no
		// connection is attached (Applied counted it among the untold).
		cn := attachedConn(s)
		if cn == nil {
			return false
		}
		k.event(Event{Kind: EventReply, Op: p.op, Outcome: OutcomeGranted, Queued: p.queued, Latency: now.Sub(p.start), Keys: len(p.keys)})
		k.send(cn, g)
		if k.leading {
			k.told[token] = cn
		}
		return true
	}
	if p.conn.dead {
		k.event(Event{Kind: EventAbandonedGrant})
		k.propose(locksm.Command{Op: locksm.OpRelease, Key: p.key, Owner: p.owner, Token: token})
		return false
	}
	k.event(Event{Kind: EventReply, Op: p.op, Outcome: OutcomeGranted, Queued: p.queued, Latency: now.Sub(p.start), Keys: len(p.keys)})
	k.send(p.conn, g)
	if k.leading {
		k.told[token] = p.conn
	}
	return true
}

// tellLost sends the lost event of the expired holding (key, token): to
// the connection its grant was told on while that is open, else to every
// open connection that takes lost events.
func (k *Core[C]) tellLost(key string, token uint64) {
	k.tellLostMsg(wire.Msg{Type: wire.TypeLost, Token: token, Reason: wire.LostExpired, Key: key}, wire.VersionExtend)
}

// tellLostMsg sends the lost event m to the connection its token's grant
// was told on while that is open, else to every open connection that
// takes such events: those that negotiated at least version.
func (k *Core[C]) tellLostMsg(m wire.Msg, version uint16) {
	token := m.Token
	if cn := k.told[token]; cn != nil && !cn.dead {
		// An older connection cannot take the event; its holder learns
		// of the loss as before (a fence, a not-held release).
		if cn.version >= version {
			k.send(cn, m)
			k.event(Event{Kind: EventLostSent, Keys: 1})
		}
		return
	}
	n := 0
	for _, cn := range k.sortedConns() {
		if cn.version >= version && !cn.dead {
			k.send(cn, m)
			n++
		}
	}
	if n > 0 {
		k.event(Event{Kind: EventLostSent, Keys: n})
	}
}

// rejected is the outcome of a rejected command of op.
func rejected(op locksm.Op, err error) Outcome {
	if releasing(op) && (errors.Is(err, locksm.ErrNotHeld) || errors.Is(err, locksm.ErrTokenMismatch) || errors.Is(err, locksm.ErrOwnerMismatch)) {
		return OutcomeNotHeld
	}
	return OutcomeError
}

// armExpiry starts the lease clock of a grant (or an extension) the leader
// just applied, and returns when it runs out.
func (k *Core[C]) armExpiry(now time.Time, key string, token uint64, leaseSec uint32) time.Time {
	at := now.Add(time.Duration(leaseSec) * time.Second)
	k.rd.Timers = append(k.rd.Timers, Timer{At: at, Kind: TimerExpire, Key: key, Token: token, Epoch: k.epoch})
	return at
}

// armHolders arms a full lease timer for every holder, from now, and
// returns how many.
func (k *Core[C]) armHolders(now time.Time) int {
	n := 0
	k.table.RangeHolders(func(key string, h locksm.Holder) bool {
		// A block is one holding: one timer, on its primary key.
		if h.Keys == nil || key == h.Keys[0] {
			k.armExpiry(now, key, h.Token, h.LeaseSec)
			n++
		}
		return true
	})
	return n
}

// TimerDue proposes what a due timer asks for, if it still applies: an
// expiry if the key is still held under the token, a cancel if the
// acquire is still queued. Timers of another epoch are ignored.
func (k *Core[C]) TimerDue(t Timer) {
	if !k.leading || t.Epoch != k.epoch {
		return
	}
	switch t.Kind {
	case TimerExpire:
		if until, ok := k.extendedUntil[t.Token]; ok {
			if t.At.Before(until) {
				return // superseded by an extension's timer
			}
			delete(k.extendedUntil, t.Token)
		}
		if k.extending[t.Token] > 0 {
			k.deferred[t.Token] = t // decided when the extend settles
			return
		}
		if _, proposed := k.expiring[t.Token]; proposed {
			return // a second timer of the token (armed at its grant, then at Serve)
		}
		if k.table.HeldUnder(t.Key, t.Token) {
			k.expiring[t.Token] = t.At
			k.propose(locksm.Command{Op: locksm.OpExpire, Key: t.Key, Token: t.Token})
		}
	case TimerWait:
		if p := k.pend[t.Ref]; p != nil && p.queued && !p.cancel {
			k.propose(locksm.Command{Op: locksm.OpCancelWait, Key: t.Key, Ref: t.Ref})
		}
	case TimerSession:
		k.sessionTimerDue(t)
	case TimerPositions:
		k.walkPositions()
	}
}

// ---- leadership ----

// GainLeadership records that Raft made this node leader. It does not
// serve yet: the caller first makes every earlier entry applied (and says
// so with BarrierApplied), records its client address and drops every
// queued waiter through the log, then calls Serve with the epoch returned
// here.
//
// term is the Raft term of the leadership (0: unknown, no check). An
// entry of a newer term applied while this core leads means another node
// appended it, so Raft's news that this leadership ended has not arrived
// yet: hashicorp/raft steps down and hands the newer leader's committed
// entries to the FSM in the same AppendEntries handler, before it tells
// LeaderCh. Applied loses leadership first (EventSuperseded): answered
// here, with this leadership's owed replies and attached session
// connections, such an entry would tell a hand-off that the newer leader,
// which applied it after its own barrier, counts as told to nobody, and
// its session's expiry would release a delivered lock (issue 39: found by
// an attack on real nodes with one-way network faults).
func (k *Core[C]) GainLeadership(term uint64) (epoch uint64) {
	k.epoch++
	k.leading = true
	k.term = term
	return k.epoch
}

// BarrierApplied records that every entry appended before this
// leadership's term has been applied (the caller's raft.Barrier in epoch
// returned). Grants applied before it may have been committed, applied
// and told by an earlier leader in its last moments (a follower learns the
// commit index late), so this core never counts them among the grants
// nobody was told: only from here on is a grant this core did not tell
// known to be untold (docs/sessions.md, "Untold grants"). It reports
// false if epoch is not the current leadership's.
func (k *Core[C]) BarrierApplied(epoch uint64) bool {
	if k.epoch != epoch || !k.leading {
		return false
	}
	k.ownTerm = true
	return true
}

// Serve makes a leader that is prepared serve: a full lease is armed for
// every holder (measured from now, never shorter than what the holder
// counted on: its lease started before the old leader applied it), and,
// unless a hand-over of this leadership started meanwhile (it decides
// then), lock requests
// are taken and every connection that speaks notices is told. It returns
// false if epoch is not the current leadership's (lost meanwhile), else
// the number of holders.
func (k *Core[C]) Serve(now time.Time, wall int64, epoch uint64) (holders int, ok bool) {
	if k.epoch != epoch || !k.leading {
		return 0, false
	}
	holders = k.armHolders(now)
	k.adoptSessions(now, wall)
	k.restartPaceSamples()
	k.ownTerm = true // the caller's barrier came before
	k.ready = true
	// Only a hand-over of this leadership decides: one begun in an
	// earlier epoch ended with that leadership (lost and regained while
	// it ran), and waiting for it would leave a leader that never serves.
	if h := k.handover; h == nil || !h.active || h.epoch != k.epoch {
		k.handover = nil
		k.serving = true
		k.broadcastServing()
	}
	return holders, true
}

// LoseLeadership stops serving and answers every owed reply with U (each
// of those commands may or may not commit under the next leader), saying
// why. It reports whether the core led, and how many replies were owed.
func (k *Core[C]) LoseLeadership(why string) (wasLeading bool, owed int) {
	wasLeading = k.leading
	k.epoch++
	k.leading, k.ownTerm, k.ready, k.serving = false, false, false, false
	ps := sortedByRef(k.pend)
	owed = len(ps) - k.sessQueued
	k.sessQueued = 0
	k.pend = map[uint64]*pending[C]{}
	k.uncommitted, k.uncommittedTotal, k.raising = map[string]int{}, 0, map[uint64]int{}
	clear(k.expiring)
	clear(k.heldExtends)
	clear(k.refusedReleases)
	k.refusedReleases = k.refusedReleases[:0]
	clear(k.extending)
	clear(k.deferred)
	clear(k.extendedUntil)
	clear(k.told)
	clear(k.posDirty)
	clear(k.blockTold)
	k.posArmed = 0
	k.dropSessions()
	for _, p := range ps {
		p.uncommitted = false
		p.conn.unowe(p)
		if p.attachment() != nil {
			p.conn.attaching = false
		}
		if p.session() != nil {
			// Not lost: the state has it, and its broker resumes it on
			// the next leader (its connection closes).
			continue
		}
		k.reply(p.op, OutcomeIndeterminate)
		k.send(p.conn, wire.Msg{Type: wire.TypeUnknown, ID: p.id, Text: why + ": outcome unknown"})
	}
	clear(k.rd.Timers)
	k.rd.Timers = k.rd.Timers[:0]
	k.rd.ClearTimers = true
	// What this leadership decided to propose and the caller has not
	// taken yet belongs to it: proposed later, in whatever term this node
	// leads next, a stale expiry could end a lease another leader had
	// just extended (its requests were answered U above).
	clear(k.rd.Proposals)
	k.rd.Proposals = k.rd.Proposals[:0]
	return wasLeading, owed
}

// Close records that the node is closing: a hand-over that fails after
// this does not serve again, and none can start.
func (k *Core[C]) Close() { k.closed = true }

// hint returns where lock requests should go, for an M reply: the
// leader's client address and id. During a hand-over of this node's
// leadership, and after it until Raft knows the new leader, that is the
// target. addr is "" when no leader is known (or its address is not yet
// known).
func (k *Core[C]) hint() (addr, id string) {
	lid := k.dir.Leader()
	if h := k.handover; h != nil {
		switch lid {
		case "", k.cfg.ServerID:
			return h.addr, h.id
		case h.id:
			// The target leads; the log may not have its address yet.
			if addr := k.dir.ClientAddr(h.id); addr != "" {
				if !h.active {
					k.handover = nil // Raft and the log know all the hint did
				}
				return addr, h.id
			}
			return h.addr, h.id
		}
		if !h.active {
			k.handover = nil // another leader is known: the hint has served
		}
	}
	if lid == "" {
		return "", ""
	}
	if lid == k.cfg.ServerID {
		// We are the leader but not yet serving: retry shortly.
		return "", lid
	}
	return k.dir.ClientAddr(lid), lid
}

// broadcastServing tells every connection that speaks notices that this
// node serves as the leader now.
func (k *Core[C]) broadcastServing() {
	m := wire.Msg{Type: wire.TypeNotice, Event: wire.NoticeServing, LeaderID: k.cfg.ServerID, LeaderAddr: k.cfg.Advertise}
	if len(m.LeaderAddr) > 255 {
		m.LeaderAddr = ""
	}
	for _, cn := range k.sortedConns() {
		if cn.version >= wire.VersionNotices && !cn.dead {
			k.send(cn, m)
		}
	}
}

func (k *Core[C]) sortedConns() []*conn[C] {
	cs := make([]*conn[C], 0, len(k.conns))
	for _, cn := range k.conns {
		cs = append(cs, cn)
	}
	slices.SortFunc(cs, func(a, b *conn[C]) int { return cmp.Compare(a.seq, b.seq) })
	return cs
}

// sortedByRef lists the pending requests of m in ref order (the order they
// were proposed in), so outputs do not depend on map order.
func sortedByRef[C comparable](m map[uint64]*pending[C]) []*pending[C] {
	if len(m) == 0 {
		return nil
	}
	ps := make([]*pending[C], 0, len(m))
	for _, p := range m {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b *pending[C]) int { return cmp.Compare(a.ref, b.ref) })
	return ps
}

// Housekeeping reports whether c is the leader's own work rather than a
// request a client waits for (the node proposes housekeeping from a queue
// of its own, which goes first in every batch, a share at least): a cancelled or timed-out wait, an expiry
// (of a lease or a session), or the release of a grant nobody can use
// (Ref 0).
func Housekeeping(c locksm.Command) bool {
	switch c.Op {
	case locksm.OpAcquire, locksm.OpAcquireBlock, locksm.OpExtend, locksm.OpAcquirePermit, locksm.OpSetPermits, locksm.OpRevoke:
		// A block acquire (a permit acquire, a set-permits) is a request
		// like any other: as housekeeping it
		// went ahead of requests written before it, and joined a key's
		// FIFO queue ahead of a single-key acquire sent earlier (found by
		// the fourth attack round on issue 39).
		return false
	case locksm.OpOpenSession, locksm.OpResumeSession:
		// A broker waits on it, and a resume keeps its place behind the
		// session's requests proposed before it: they apply before it and
		// are answered from their outcomes, instead of being voided (a
		// seq at or below the resume's high that applies after it).
		return false
	case locksm.OpRelease:
		return c.Ref == 0
	}
	return true
}
