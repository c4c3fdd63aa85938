// Package wire owns Ticketing's TCP wire formats: the framing (codec.go),
// the handshake (version negotiation and mutual challenge-response
// authentication, handshake.go) of every port, the request/reply messages
// of the client protocol (this file and codec.go) and the admin frames
// (admin.go); the error codes and the package's sentinel errors are in
// codes.go. PROTOCOL.md, next to these files, is the contract: the code and
// that document must agree (its error tables are checked against codes.go
// and admin.go by a test).
package wire

import "ticketing/locksm"

// ProtocolVersion is the newest version this build speaks.
//
// History:
//
//	1 — first version: length-prefixed frames, mutual HMAC-SHA256 handshake,
//	    acquire/release/cancel/ping/status requests. Never released.
//	2 — the Challenge carries 1 or 2 server proofs (secret rollover); over
//	    TLS both proofs bind the TLS exporter value (ExporterLabel). Hello
//	    and Challenge carry the fencing domain; the members request 'm'
//	    and its reply 'L'. (Version 2 was never released without them.)
//	3 — quiet planned hand-overs and members' client addresses: the
//	    unsolicited notice 'N' (server → client: "handing over to X",
//	    "serving") and its acknowledgement request 'n'; the discovery
//	    Identity frame carries the node's client_addr. A version 2 peer or
//	    client negotiates 2 and sees none of this: no notices (requests that
//	    reach a leader during a hand-over are answered M, naming the
//	    target), an Identity without client_addr (a version 3 leader learns
//	    that member's client address only once it runs version 3).
//	4 — waiting rooms: the progress frame 'Q' (server → client: "your
//	    acquire joined the key's queue"), and the Welcome carries the
//	    node's per-connection limits (max_in_flight, max_waiters). A
//	    version 2 or 3 peer or client negotiates its own version and sees
//	    neither: no Q, an empty Welcome.
//	5 — seat blocks: the block acquire 'b' (2..16 keys granted all or
//	    none under one token; its replies are an acquire's). Frames may
//	    be up to MaxFrameLen = 8192 bytes, but only 'b' can exceed
//	    MaxFrameLenV4 (4096), the bound of versions 1–4, and 'b' is sent
//	    only on version 5 connections. A version 2, 3 or 4 peer or client
//	    negotiates its own version and never sees 'b'. The log gains a
//	    lock command (locksm's block acquire) that an older node cannot
//	    decode: the leader proposes one only once the cluster version is
//	    5 (PROTOCOL.md, "Log entries"), and answers E not_supported
//	    before.
//	6 — the holder knows: the extend request 'e' (renew a held lease by
//	    token; its replies are a release's) and the lost event 'X'
//	    (server → client, unsolicited: "the holding under this token
//	    ended without your release", from the leader that committed its
//	    expiry). A version 2–5 peer or client negotiates its own version
//	    and sees neither. The log gains a lock command (locksm's extend)
//	    that an older node cannot decode: the leader proposes one only
//	    once the cluster version is 6, and answers E not_supported
//	    before.
//	7 — sidecar sessions (docs/sessions.md): the open 'o', resume 'y',
//	    ack 'k' and close 'd' requests and the outcomes watermark 'O'
//	    (server → client). On a session connection a request's id is its
//	    sequence number in the session. A version 2–6 peer or client
//	    negotiates its own version and sees none of this; a version 7
//	    connection that attaches no session is exactly a version 6 one.
//	    The log gains ops 8–12 (sessions, drop-sessionless) that an older
//	    node cannot decode: the leader proposes them only once the
//	    cluster version is 7, and answers 'o' and 'y' E not_supported
//	    before.
//	8 — owner labels: an acquire 'a' or block acquire 'b' may end with
//	    the caller's label (label str8, 1..locksm.MaxLabelLen bytes, the
//	    key alphabet), which the leader writes into the log with the
//	    acquire and inspection shows with the holder. A version 2–7 peer
//	    or client negotiates its own version and never sends or receives
//	    a label. The log gains a flag (locksm's labelled acquire) that an
//	    older node cannot decode: the leader proposes a labelled acquire
//	    only once the cluster version is 8, and answers it E
//	    not_supported before (never sends it without its label: inspect
//	    would then show a holder without the name its caller gave).
//	9 — strict matching (issue 39, finding 8): no frame changes. Once
//	    the cluster version is 9, a release 'r' or extend 'e' that does
//	    not name its holding exactly is answered E not_held whichever
//	    part is wrong (codes token_mismatch and owner_mismatch are no
//	    longer sent), and a holding granted under a session is released
//	    or extended only by that session's requests. The rule changes
//	    what a log entry does, so every replica switches at the 'V'
//	    entry that raises the cluster version to 9; before it every
//	    replica applies the older rule. From the same entry a session's
//	    close 'd' releases every holding of the session instead of
//	    leaving them to their leases (finding 6), and the log may carry
//	    op 13, the ack-only entry the leader proposes after a quiet
//	    session's 'k' (finding 5).
//	10 — online log verification (issue 40): no frame changes. The log
//	    may carry the checkpoint entry 'C', which the serving leader
//	    appends every so often and whose Raft Extensions carry the
//	    checksum of the entries since the previous one; every node checks
//	    its stored copy against it. A version 9 node would log 'C' as an
//	    entry of unknown kind, so the leader appends one only once the
//	    cluster version is 10 (VersionLogVerify). From the 'V' entry that
//	    raises the cluster version to 10 an extend never shortens a lease
//	    (VersionExtendNeverShortens): an extend 'e' renews the longer of
//	    the holding's lease and its own, so an extend that was answered U
//	    (or never answered) and reaches the leader late cannot cut short
//	    a lease a later extend was told K for (issue 39, attack round 5).
//	11 — long waits (issue 41): no frame changes. An acquire 'a' or block
//	    acquire 'b' may wait up to an hour (wait_ms up to
//	    locksm.MaxWaitMs, 3,600,000) instead of 5 minutes. A version 10
//	    node would reject such an entry that the others queue, so the
//	    leader proposes one only once the cluster version is 11
//	    (VersionLongWaits) and answers it E not_supported before; every
//	    replica applies the 5-minute bound until the 'V' entry that
//	    raises the cluster version to 11 (locksm.State.SetShortWaits).
//	12 — places in line (issue 41): a connection that asks with the
//	    request 'w' (TypeWatchPositions) gets the progress frame 'R'
//	    (TypePosition), which tells a queued acquire its exact place in
//	    one key's line and an estimated wait, pushed by the leader at
//	    most once per PositionInterval and only when the place changed.
//	    No log change: a version 11 node or client never sees either.
//	13 — semaphores (issue 41): the permit acquire 'g' (one permit of a
//	    key an operator defined with n permits; the payload and the
//	    replies of 'a', and its G carries the permit's slot) and the
//	    operator's set-permits 'z' (define, resize or remove a
//	    semaphore; replies of a release). A version 2–12 peer or client
//	    negotiates its own version and sees neither. The log gains ops
//	    14 and 15 that an older node cannot decode: the leader proposes
//	    them only once the cluster version is 13 (VersionSemaphores)
//	    and answers E not_supported before.
//	14 — revokes (issue 42): an operator ends a stuck holding through
//	    the admin port (AdminOpRevoke). The log gains op 16 that an
//	    older node cannot decode: the leader proposes it only once the
//	    cluster version is 14 (VersionRevoke) and answers not_supported
//	    before. The lost event 'X' gains the reason LostRevoked, whose
//	    payload adds who revoked and why; the leader sends it only on
//	    connections that negotiated 14 (an older client learns of the
//	    loss as before: a fence, a not_held release or extend).
const ProtocolVersion = 14

// NewestProtocolVersion is the newest version this build implements:
// ProtocolVersion, unless a newer version is being built, which is then
// offered and accepted only where configured (HandshakeConfig.MaxVersion;
// a node's Config.ProtocolVersion), for tests and the parts under
// construction, never by default. Version 7 (sessions) was built that way
// and is the default now; versions 8 (labels) and 9 (strict matching)
// are small and came at once.
const NewestProtocolVersion = ProtocolVersion

// VersionNotices is the first version with the notice 'N' and its
// acknowledgement 'n' and with client_addr in the Identity frame: a node
// sends notices only on connections that negotiated at least this.
const VersionNotices = 3

// VersionQueued is the first version with the progress frame 'Q' and the
// Welcome that carries the node's per-connection limits: a node sends Q
// only on connections that negotiated at least this.
const VersionQueued = 4

// VersionBlocks is the first version with the block acquire 'b': a client
// sends 'b' only on a connection that negotiated at least this.
const VersionBlocks = 5

// VersionExtend is the first version with the extend request 'e' and the
// lost event 'X': a client sends 'e', and a node sends 'X', only on a
// connection that negotiated at least this.
const VersionExtend = 6

// VersionSessions is the first version with sessions: the requests 'o',
// 'y' and 'k' and the outcomes watermark 'O'. A client sends them, and a
// node sends 'O', only on a connection that negotiated at least this.
const VersionSessions = 7

// VersionLabels is the first version whose acquires may carry a label: a
// client sends one only on a connection that negotiated at least this,
// and a leader proposes one only once the cluster version is at least
// this.
const VersionLabels = 8

// VersionStrictMatch is the first cluster version whose releases and
// extends are matched strictly: any mismatch is not_held, and a session's
// holding is its session's alone (locksm.State.SetLegacyMatching). It
// changes no frame: a connection of any version gets the rule of the
// cluster's version.
const VersionStrictMatch = 9

// VersionAckEntry is the first cluster version whose log may carry the
// ack-only entry (locksm.OpAckSession, op 13): the leader proposes one
// after a quiet session's 'k', so that its acknowledged outcomes leave the
// table. An older node could not decode it.
const VersionAckEntry = 9

// VersionLogVerify is the first cluster version whose log may carry the
// checkpoint entry 'C' of online log verification (cluster/logverify.go):
// the serving leader appends one only once the cluster version is at least
// this, so that no member of an older build meets an entry kind it does
// not know.
const VersionLogVerify = 10

// VersionExtendNeverShortens is the first cluster version at which an
// extend never lowers a lease (locksm.State.SetExtendMayShorten off): the
// holding's lease becomes the longer of its own and the extend's, counted
// from the extend's Now. Before it, an extend sets the extend's lease from
// its Now, shorter or not. Every replica switches at the 'V' entry.
const VersionExtendNeverShortens = 10

// VersionLongWaits is the first cluster version whose acquires may wait
// longer than 5 minutes (locksm.MaxShortWaitMs), up to an hour
// (locksm.MaxWaitMs): the leader proposes a longer wait only once the
// cluster version is at least this, and every replica rejects one before
// (locksm.State.SetShortWaits). It changes no frame: a connection of any
// version may ask, and gets not_supported while the cluster is older.
const VersionLongWaits = 11

// VersionPositions is the first version with the request 'w'
// (TypeWatchPositions) and the progress frame 'R' (TypePosition): a
// leader sends R only on connections that negotiated it and asked with
// w, so a client of an older version, or one that does not ask, never
// sees one. (Version 13 is taken by semaphores.)
const VersionPositions = 12

// VersionSemaphores is the first version with semaphores: the requests
// 'g' (permit acquire) and 'z' (set permits) and the slot in a permit's
// G. A client sends them only on a connection that negotiated at least
// this, and the leader proposes their commands only once the cluster
// version is at least this.
const VersionSemaphores = 13

// VersionRevoke is the first version with revokes: the leader proposes
// an operator's revoke (locksm.OpRevoke) only once the cluster version is
// at least this, and sends the lost event with LostRevoked only on
// connections that negotiated at least this.
const VersionRevoke = 14

// SecretLen is the length of a session's secret in bytes.
const SecretLen = 16

// Frame layout, all integers big-endian:
//
//	length uint32   // bytes that follow: 1 (type) + len(payload); 1..MaxFrameLen
//	type   uint8    // one of the Type* constants
//	payload [length-1]byte
//
// Strings inside payloads are a length then bytes: str8 = uint8 length,
// str16 = uint16 length.
const (
	// MaxFrameLen bounds length. A larger length is a protocol error: the
	// receiver answers with a connection-level error and closes.
	MaxFrameLen = 8192

	// MaxFrameLenV4 is the bound of versions 1–4 (their MaxFrameLen). Every
	// frame type but TypeAcquireBlock stays within it (AppendMsg and
	// DecodeMsg hold them to it), so every frame a version 5 speaker sends
	// to an older peer fits: 'b' alone can be longer, and it is sent only
	// on version 5 connections.
	MaxFrameLenV4 = 4096
)

// Frame types. Lowercase letters are requests (client → server), capitals are
// replies (server → client). Handshake frames are only valid during the
// handshake; request/reply frames only after it.
const (
	// Handshake (see handshake.go for payloads).
	TypeHello     = 'h' // client → server
	TypeChallenge = 'C' // server → client
	TypeAuth      = 'x' // client → server
	TypeWelcome   = 'W' // server → client: handshake done
	TypeIdentity  = 'I' // server → client after a KindDiscover handshake, then close

	// Requests: every payload starts with id uint64 (client-chosen, nonzero,
	// unique among this connection's requests in flight).
	TypeAcquire = 'a' // id u64 | lease_sec u16 | wait_ms u32 | key str8 | owner str8 [| label str8 (version 8)]
	TypeRelease = 'r' // id u64 | token u64 | key str8 | owner str8
	TypeCancel  = 'c' // id u64 | target u64 (id of a pending acquire or block acquire on this connection)
	TypePing    = 'p' // id u64
	TypeStatus  = 's' // id u64
	TypeMembers = 'm' // id u64
	// TypeNoticeAck acknowledges a TypeNotice of event NoticeHandOver: the
	// client sends it right after it stopped sending lock requests on the
	// connection, so every request it wrote before is ahead of it. Reply:
	// K. From version 3.
	TypeNoticeAck = 'n' // id u64

	// TypeAcquireBlock acquires n distinct keys (locksm.MinBlockKeys..
	// locksm.MaxBlockKeys) all or none, in one command, under one token;
	// its replies are those of TypeAcquire. From version 5 (VersionBlocks):
	//
	//	id u64 | lease_sec u16 | wait_ms u32 | owner str8 | n u8 | n × key str8 [| label str8]
	//
	// The largest is 1+8+2+4+1+128+1+16×256+1+64 = 4306 bytes (type
	// included), the one frame above MaxFrameLenV4. The label, on 'a' and
	// 'b' alike, is optional and only from version 8 (VersionLabels): it
	// is present exactly when bytes follow the last field, and then 1..
	// locksm.MaxLabelLen bytes long (an empty label is no label and has
	// one encoding: absent).
	TypeAcquireBlock = 'b'

	// TypeAcquirePermit takes one permit of a semaphore key (a key an
	// operator defined with n permits: TypeSetPermits), FIFO with the
	// key's other permit waiters. Payload and replies are those of
	// TypeAcquire; its G carries the permit's slot (0..n-1: the
	// fencing domain is the key and the slot). A key that is not a
	// semaphore is E not_semaphore; a plain 'a' of a semaphore key is E
	// is_semaphore. From version 13 (VersionSemaphores):
	//
	//	id u64 | lease_sec u16 | wait_ms u32 | key str8 | owner str8 [| label str8]
	TypeAcquirePermit = 'g'

	// TypeSetPermits defines key as a semaphore of permits permits
	// (1..locksm.MaxPermits), changes its n (raising it grants waiters at
	// once; lowering it ends no permit), or, with 0, removes an idle
	// semaphore. An operator's request: it carries no session. Replies:
	// K, E (in_use, not_semaphore, invalid_permits, ...), M, U. From
	// version 13 (VersionSemaphores):
	//
	//	id u64 | permits u32 | key str8
	TypeSetPermits = 'z'

	// TypeExtend renews the lease of the holding of key under token, held
	// by owner: its lease becomes lease_sec (locksm.MinLeaseSec..
	// MaxLeaseSec) from when the leader applies it; the token and the
	// key's queue stay as they are, and for a block (any of its keys) the
	// whole holding is extended. Its replies are a release's: K extended,
	// E not_held / token_mismatch / owner_mismatch (not held so: the lease
	// ran out, or the key moved on), M, U. From version 6 (VersionExtend):
	//
	//	id u64 | token u64 | lease_sec u16 | key str8 | owner str8
	TypeExtend = 'e'

	// Sessions (version 7, VersionSessions; docs/sessions.md). A broker
	// opens one session and attaches it to its connection to the serving
	// leader with 'o' (a new session) or 'y' (an existing one), before any
	// lock request of the session on that connection; every lock request
	// on it then belongs to the session, and its id is its sequence number
	// (ids of a session only grow, on every connection).
	//
	// TypeOpenSession opens session (chosen at random by the broker,
	// nonzero) with timeout_ms (locksm.MinSessionTimeoutMs..
	// MaxSessionTimeoutMs) and secret (SecretLen random bytes; the leader
	// logs only its SHA-256). Replies: K (opened, attached), E, M, U.
	//
	//	id u64 | session u64 | timeout_ms u32 | secret [16]byte
	TypeOpenSession = 'o'
	// TypeResume attaches an existing session: the leader checks secret
	// against the session's, commits the resume (every seq <= high not
	// applied by then is void forever) and answers: each recorded outcome
	// whose serial is above ack, as the reply of its request (id = seq);
	// a Q (id = seq) for each queued request of the session; the outcomes
	// watermark O; then K to the resume. Replies: K, E, M, U.
	//
	//	id u64 | session u64 | secret [16]byte | high u64 | ack u64
	TypeResume = 'y'
	// TypeSessionAck reports the broker's ack (serial): it has received
	// every outcome of its session up to it. The leader stamps the latest
	// into the next command of the session it proposes, which trims them
	// from the replicated state. Reply: K.
	//
	//	id u64 | serial u64
	TypeSessionAck = 'k'
	// TypeCloseSession is the broker's clean stop: it closes the session
	// attached to this connection at once (through the log: its waiters
	// leave their queues, never granted; its holdings keep their leases),
	// instead of leaving it to expire. After its K the connection carries
	// no session and attaches no other. Replies: K, E, M, U.
	//
	//	id u64
	TypeCloseSession = 'd'

	// TypeWatchPositions asks for places in line on this connection
	// (version 12, VersionPositions):
	//
	//	id u64
	//
	// From its K on, the node's leader sends R (TypePosition) for this
	// connection's queued acquires (a session's: while the session is
	// attached to it); the next walk tells every one of them its place.
	// Without it a connection gets no R, so a client that does not ask
	// reads exactly what version 11 sent. Answered K by any node (the
	// choice is the connection's, kept by every node's core); per
	// connection, never undone.
	TypeWatchPositions = 'w'

	// Replies: every payload starts with the id of the request it answers;
	// exactly one reply per request.
	TypeGranted = 'G' // id u64 | token u64 [| slot u32]    acquire (block acquire, permit acquire: with its slot) granted (after commit)
	TypeBusy    = 'B' // id u64                             definite: not acquired (wait 0, key held; block: a key held or queued)
	TypeTimeout = 'T' // id u64                             definite: wait ran out, never granted
	TypeMoved   = 'M' // id u64 | leader_addr str8 | leader_id str8  not executed; empty addr = no leader known
	TypeOK      = 'K' // id u64                             release done / cancel done
	TypeUnknown = 'U' // id u64 | text str16                outcome unknown (the node cannot know whether it committed)
	TypeError   = 'E' // id u64 | code u16 | text str16     definite failure; id 0 = connection error, then close
	TypePong    = 'P' // id u64
	TypeStatusR = 'S' // id u64 | node_id str8 | role u8 | term u64 | leader_id str8 | leader_addr str8 | commit u64 | applied u64 | last_token u64 | held u64 | waiting u64
	// TypeMembersR answers TypeMembers with the node's view of the Raft
	// configuration: id u64 | n u8 | n × (server_id str8 | suffrage u8 | client_addr str8)
	// (client_addr "" when the member has not announced one yet).
	TypeMembersR = 'L'

	// TypeNotice is unsolicited (server → client, answering no request;
	// from version 3, only on connections that negotiated it):
	//
	//	id u64 (always 0) | event u8 | leader_id str8 | leader_addr str8
	//
	// NoticeHandOver: this node is about to hand its leadership to
	// leader_id at leader_addr; send it no more lock requests (what was
	// written is answered as usual), acknowledge with TypeNoticeAck, and
	// hold new requests until a leader serves. NoticeServing: this node
	// (leader_id, leader_addr) serves as the leader now — after winning an
	// election, or again after a hand-over that failed.
	TypeNotice = 'N'

	// TypeQueued is a progress frame (server → client, from version 4,
	// only on connections that negotiated it):
	//
	//	id u64 (the id of an acquire in flight)
	//
	// It says that the acquire's own command was applied as queued: it
	// joined the key's FIFO queue (a block acquire: the queues of its keys;
	// from version 5) and waits for its turn. It is not the
	// acquire's reply: exactly one final reply follows (G, T or U; never
	// B or M, since the acquire was executed), and no Q after it. At most one Q per acquire. A Q for any other request,
	// for an id not in flight, or on a version 2 or 3 connection is a
	// protocol violation (the client closes the connection).
	TypeQueued = 'Q'

	// TypeLost is an event (server → client, unsolicited, answering no
	// request; from version 6, only on connections that negotiated it):
	//
	//	id u64 (always 0) | token u64 | reason u8 | key str8
	//	    [| by str8 | why str8]   (only with reason LostRevoked)
	//
	// The leader sends it when it applies the end of a holding that its
	// holder did not release: LostExpired, the lease ran out and the
	// expiry was committed; LostRevoked (version 14), an operator revoked
	// it, by (Msg.Owner: who, as the operator's tool named them) and why
	// (Msg.Text: the reason given, possibly empty). key is the key the expiry named (for a block,
	// one of its keys; the token names the holding). It goes to the
	// connection the grant was told on when that connection is still
	// open, else to every open version 6 connection (the holder may have
	// reconnected, or the grant was told by an earlier leader): a client
	// ignores tokens it does not hold. It is sent before any grant the
	// same commit hands the key on with. It is a hint, never a promise:
	// a lost connection or leader change can swallow it, so a holder
	// still counts its lease from its own clock.
	TypeLost = 'X'

	// TypeOutcomes is an event (server → client, unsolicited; from version
	// 7, only on a connection its session is attached to):
	//
	//	id u64 (always 0) | session u64 | serial u64
	//
	// Every outcome of session up to serial has been written on this
	// connection before it: the broker's ack. The leader sends it after
	// the replies of each applied entry that recorded outcomes of the
	// session, and in a resume's answer.
	TypeOutcomes = 'O'

	// TypePosition is a progress frame (server → client, from version 12,
	// VersionPositions, only on connections that negotiated it):
	//
	//	id u64 | position u32 | estimate_ms u32 | key str8
	//
	// The queued acquire id stands at position (1 = next) in key's line
	// at the leader's latest walk of that line, and the leader estimates
	// its wait at estimate_ms (EstimateUnknown: not enough hand-offs seen
	// yet). A block acquire waits in each of its keys' lines and gets one
	// per key, which is why the key is in the frame. Like Q it is not a
	// reply: any number may come before the acquire's one reply, none
	// after it. Not 'W', the design's first name: 'W' is the handshake's
	// Welcome, and a Welcome after the handshake is unexpected_frame.
	TypePosition = 'R'
)

// EstimateUnknown is a TypePosition's estimate_ms when the leader cannot
// estimate the wait yet; MaxEstimateMs is the largest estimate sent (a
// longer one is capped to it: about 49 days, far beyond any wait).
const (
	EstimateUnknown = ^uint32(0)
	MaxEstimateMs   = EstimateUnknown - 1
)

// LostReason says why a TypeLost holding ended.
type LostReason uint8

const (
	LostExpired LostReason = 1 // the lease ran out; the expiry was committed
	LostRevoked LostReason = 2 // an operator's revoke was committed (version 14)
)

// String names the reason for logs and the unix API.
func (r LostReason) String() string {
	switch r {
	case LostExpired:
		return "expired"
	case LostRevoked:
		return "revoked"
	}
	return "unknown"
}

// NoticeEvent says what a TypeNotice announces.
type NoticeEvent uint8

const (
	NoticeHandOver NoticeEvent = 1
	NoticeServing  NoticeEvent = 2
)

// String names the event for logs.
func (e NoticeEvent) String() string {
	switch e {
	case NoticeHandOver:
		return "hand-over"
	case NoticeServing:
		return "serving"
	}
	return "unknown"
}

// Msg is any post-handshake message, request or reply. Only the fields its
// Type uses are encoded; the rest must be zero.
type Msg struct {
	Type   byte
	ID     uint64
	Key    string   // TypeAcquire, TypeRelease (empty for TypeAcquireBlock)
	Keys   []string // TypeAcquireBlock: 2..16 keys, in the client's order
	Owner  string   // requests; a TypeLost with LostRevoked: who revoked
	Token  uint64   // TypeRelease, TypeExtend, TypeGranted, TypeLost
	Lease  uint16   // seconds: TypeAcquire, TypeAcquireBlock, TypeExtend
	WaitMs uint32
	Target uint64 // TypeCancel
	// Sessions: TypeOpenSession (Session, TimeoutMs, Secret), TypeResume
	// (Session, Secret, High, Serial = the ack), TypeSessionAck (Serial),
	// TypeOutcomes (Session, Serial).
	Session   uint64
	TimeoutMs uint32
	Secret    [SecretLen]byte
	High      uint64
	Serial    uint64
	Code      Code   // TypeError
	Text      string // TypeError, TypeUnknown; a TypeLost with LostRevoked: why
	// TypeMoved and TypeStatusR.
	LeaderAddr string
	LeaderID   string
	// TypeStatusR.
	NodeID    string
	Role      Role
	Term      uint64
	Commit    uint64
	Applied   uint64
	LastToken uint64
	Held      uint64
	Waiting   uint64
	// TypeMembersR.
	Members []Member
	// TypeNotice (with LeaderID and LeaderAddr).
	Event NoticeEvent
	// TypeLost (with Token and Key).
	Reason LostReason
	// TypePosition (with Key): the place in line (1 = next) and the
	// estimated wait in ms (EstimateUnknown: none).
	Position   uint32
	EstimateMs uint32
	// Label is an acquire's or block acquire's label ("" = none; version
	// 8, VersionLabels).
	Label string
	// Permits: TypeSetPermits.
	Permits uint32
	// Permit: a TypeGranted that carries Slot (it answers a
	// TypeAcquirePermit; version 13).
	Permit bool
	Slot   uint32
}

// Member is one server of the Raft configuration, as a members reply lists it.
type Member struct {
	ServerID   string // NAME/INCARNATION
	Suffrage   Suffrage
	ClientAddr string // the address clients dial; "" if not announced yet
}

// Suffrage is a member's vote: a voter or a learner (a non-voter that
// receives the log, e.g. a replacement catching up).
type Suffrage uint8

const (
	SuffrageVoter   Suffrage = 0
	SuffrageLearner Suffrage = 1
)

// String names the suffrage for logs and the unix API.
func (s Suffrage) String() string {
	if s == SuffrageVoter {
		return "voter"
	}
	return "learner"
}

// Role of a node as reported in a status reply.
type Role uint8

const (
	RoleUnknown   Role = 0
	RoleFollower  Role = 1
	RoleCandidate Role = 2
	RoleLeader    Role = 3
	RoleShutdown  Role = 4
)

// String names the role for logs and the unix API status output.
func (r Role) String() string {
	switch r {
	case RoleFollower:
		return "follower"
	case RoleCandidate:
		return "candidate"
	case RoleLeader:
		return "leader"
	case RoleShutdown:
		return "shutdown"
	}
	return "unknown"
}

// IsRequest reports whether typ is a post-handshake request type.
func IsRequest(typ byte) bool {
	switch typ {
	case TypeAcquire, TypeAcquireBlock, TypeRelease, TypeExtend, TypeCancel, TypePing, TypeStatus, TypeMembers, TypeNoticeAck,
		TypeOpenSession, TypeResume, TypeSessionAck, TypeCloseSession, TypeAcquirePermit, TypeSetPermits, TypeWatchPositions:
		return true
	}
	return false
}

// RequestAllowed reports whether a client may send a request of type req on
// a connection that negotiated version: 'n' from VersionNotices, 'b' from
// VersionBlocks, 'e' from VersionExtend, 'o', 'y', 'k' and 'd' from
// VersionSessions, every other request in every version. An older node does
// not know the newer types (it answers unexpected_frame and closes).
func RequestAllowed(req byte, version uint16) bool {
	switch req {
	case TypeNoticeAck:
		return version >= VersionNotices
	case TypeAcquireBlock:
		return version >= VersionBlocks
	case TypeExtend:
		return version >= VersionExtend
	case TypeOpenSession, TypeResume, TypeSessionAck, TypeCloseSession:
		return version >= VersionSessions
	case TypeAcquirePermit, TypeSetPermits:
		return version >= VersionSemaphores
	case TypeWatchPositions:
		return version >= VersionPositions
	}
	return IsRequest(req)
}

// IsNotice reports whether typ is the unsolicited server → client notice,
// which answers no request (its id is always 0).
func IsNotice(typ byte) bool { return typ == TypeNotice }

// IsEvent reports whether typ is an unsolicited server → client event
// (TypeLost about a holding, TypeOutcomes about a session), which answers
// no request (its id is always 0).
func IsEvent(typ byte) bool { return typ == TypeLost || typ == TypeOutcomes }

// IsProgress reports whether typ is a progress frame: server → client,
// carrying the id of a request in flight, but not that request's reply
// (the reply follows): TypeQueued and TypePosition.
func IsProgress(typ byte) bool { return typ == TypeQueued || typ == TypePosition }

// ProgressAllowed reports whether a progress frame of type typ may be sent
// for a request of type req on a connection that negotiated version
// (PROTOCOL.md, "Q queued"): Q only for an acquire, only from
// VersionQueued (a block acquire: on its version 5 connection), and only
// before the acquire's reply. A client treats any other progress frame as a
// protocol violation.
//
// R (TypePosition) likewise, only from VersionPositions, any number of
// times before the reply.
func ProgressAllowed(req, typ byte, version uint16) bool {
	if typ == TypePosition {
		return (req == TypeAcquire || req == TypeAcquireBlock || req == TypeAcquirePermit) && version >= VersionPositions
	}
	if typ != TypeQueued {
		return false
	}
	switch req {
	case TypeAcquire:
		return version >= VersionQueued
	case TypeAcquireBlock:
		return version >= VersionBlocks
	case TypeAcquirePermit:
		return version >= VersionSemaphores
	}
	return false
}

// IsReply reports whether typ is a post-handshake reply type (a final
// reply: progress frames are not replies, see IsProgress).
func IsReply(typ byte) bool {
	switch typ {
	case TypeGranted, TypeBusy, TypeTimeout, TypeMoved, TypeOK, TypeUnknown,
		TypeError, TypePong, TypeStatusR, TypeMembersR:
		return true
	}
	return false
}

// isHandshake reports whether typ is only valid during the handshake.
func isHandshake(typ byte) bool {
	switch typ {
	case TypeHello, TypeChallenge, TypeAuth, TypeWelcome, TypeIdentity:
		return true
	}
	return false
}

// ReplyAllowed reports whether a reply of type reply may answer a request of
// type req (PROTOCOL.md, "Replies per request"). A client treats any
// other pairing as a protocol violation. E may answer every request; M and U
// only requests that the leader proposes through Raft. A progress frame
// (TypeQueued) is never a reply: see ProgressAllowed.
func ReplyAllowed(req, reply byte) bool {
	if reply == TypeError {
		return IsRequest(req)
	}
	switch req {
	case TypeAcquire, TypeAcquireBlock, TypeAcquirePermit:
		return reply == TypeGranted || reply == TypeBusy || reply == TypeTimeout ||
			reply == TypeMoved || reply == TypeUnknown
	case TypeRelease, TypeExtend, TypeCancel, TypeOpenSession, TypeResume, TypeCloseSession, TypeSetPermits:
		return reply == TypeOK || reply == TypeMoved || reply == TypeUnknown
	case TypePing:
		return reply == TypePong
	case TypeStatus:
		return reply == TypeStatusR
	case TypeMembers:
		return reply == TypeMembersR
	case TypeNoticeAck, TypeSessionAck, TypeWatchPositions:
		return reply == TypeOK
	}
	return false
}

// ValidKey checks a key's length and alphabet (locksm's rule, see
// locksm.MaxKeyLen). DecodeMsg checks only the length; the server may call
// this to reject a bad key before proposing anything.
func ValidKey(s string) error {
	if !validToken(s, locksm.MaxKeyLen) {
		return locksm.ErrInvalidKey
	}
	return nil
}

// ValidLabel checks an acquire's label: empty (none) or 1..
// locksm.MaxLabelLen bytes of the key alphabet (locksm.ValidateLabel).
func ValidLabel(s string) error { return locksm.ValidateLabel(s) }

// ValidOwner is ValidKey for owners (1..locksm.MaxOwnerLen bytes).
func ValidOwner(s string) error {
	if !validToken(s, locksm.MaxOwnerLen) {
		return locksm.ErrInvalidOwner
	}
	return nil
}

func validToken(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7E {
			return false
		}
	}
	return true
}
