package wire

// The JSON payloads of the admin frames (admin.go): AdminRequest in
// TypeAdminRequest, AdminReply in TypeAdminReply, and the node's reports
// that travel in a reply (StatusReport, KeyReport), which a node's HTTP
// report endpoint (cluster.Node.ReportHandler) serves too. The JSON field
// names are the contract (PROTOCOL.md, "Admin port"): never renamed; new
// fields are added with omitempty or as fields an older tool ignores. The
// node fills these from its state (package cluster); the admin client
// (package cluster/client) and the tools read them, without linking the
// node.

// AdminRequest is one admin operation.
type AdminRequest struct {
	// Op is AdminOpMembers, AdminOpAddLearner, AdminOpPromote,
	// AdminOpRemove (leader only), AdminOpStatus or AdminOpInspect (any
	// node; see LeaderOnly).
	Op string `json:"op"`
	// ID is the server id (NAME/INCARNATION) the change is about.
	ID string `json:"id,omitempty"`
	// Replaces (op "promote") is the voter that the promoted learner
	// replaces in the same step (cluster.Node.PromoteReplacing); ""
	// promotes only.
	Replaces string `json:"replaces,omitempty"`
	// Addr is the peer address of a new learner.
	Addr string `json:"addr,omitempty"`
	// Answering (op "add-learner") refuses, with ErrLearnerLagging, a
	// node that does not answer a discovery handshake at Addr, instead of
	// adding it unchecked: its protocol version can be checked only when
	// it answers. `members replace` sets it, so that it waits for NEW to
	// answer before adding it (issue 39); a leader older than that
	// ignores it.
	Answering bool `json:"answering,omitempty"`
	// Key is the key to inspect (op "inspect").
	Key string `json:"key,omitempty"`
	// LeaderOnly makes "status" and "inspect" answer not_leader on a node
	// that does not lead, so that a tool walking the addresses finds the
	// leader.
	LeaderOnly bool `json:"leader_only,omitempty"`
	// Token (op "revoke") is the token of the holding to end: a revoke
	// never ends a holding other than the one its operator saw (0 is
	// refused; the tool reads the holder's token with inspect first).
	Token uint64 `json:"token,omitempty"`
	// Reason (op "revoke") is why: 0..locksm.MaxReasonLen printable
	// ASCII bytes, kept in the audit record and told to the holder.
	Reason string `json:"reason,omitempty"`
	// By (op "revoke") is who revokes, as the tool names its operator
	// (user@host): an owner id (locksm.MaxOwnerLen, the keys' alphabet).
	By string `json:"by,omitempty"`
}

// AdminReply answers an AdminRequest.
type AdminReply struct {
	OK bool `json:"ok"`
	// Code is set on failure: one of AdminCodes (AdminErrOf maps it to its
	// sentinel).
	Code  string `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
	// Leader is the leader's server id as this node knows it.
	Leader string `json:"leader,omitempty"`
	// Members lists the configuration (op "members").
	Members []AdminMember `json:"members,omitempty"`
	// Commit is the answering leader's commit index (op "members").
	Commit uint64 `json:"commit,omitempty"`
	// Status is the answering node's StatusReport (op "status").
	Status *StatusReport `json:"status,omitempty"`
	// Key is the answering node's KeyReport (op "inspect"); its queue is
	// cut short (queue_truncated) to fit the reply in one frame.
	Key *KeyReport `json:"key,omitempty"`
	// Revoked is what a revoke ended (op "revoke"), with the token of
	// the holder it handed the key on to, if any.
	Revoked *RevokeReport `json:"revoked,omitempty"`
}

// RevokeReport is the audit record of a revoke (locksm.Revoke): the
// reply to a revoke, and a key's last revoke in its KeyReport.
type RevokeReport struct {
	// Key is the key revoked (the one named); Keys, for a block, all of
	// the revoked block's keys.
	Key  string   `json:"key"`
	Keys []string `json:"keys,omitempty"`
	// Token is the revoked holding's token.
	Token uint64 `json:"token"`
	// By is who revoked, Reason why, AtUnixMs when (the leader's stamp
	// in the revoke's command).
	By       string `json:"by"`
	Reason   string `json:"reason"`
	AtUnixMs int64  `json:"at_unix_ms"`
	// Owner and Label are the revoked holder's.
	Owner string `json:"owner"`
	Label string `json:"label,omitempty"`
	// Permit: the revoked holding was a permit of the semaphore Key, in
	// Slot.
	Permit bool   `json:"permit,omitempty"`
	Slot   uint32 `json:"slot,omitempty"`
	// NextToken (the revoke's reply only) is the token of the waiter the
	// revoke granted in the same commit (0: nobody was waiting).
	NextToken uint64 `json:"next_token,omitempty"`
}

// AdminMember is one member of the configuration with the leader's view
// of its health. The first six keys are capitalized, as they always were
// (they were a Go struct's field names).
type AdminMember struct {
	ServerID string `json:"ServerID"` // NAME/INCARNATION
	Name     string `json:"Name"`
	PeerAddr string `json:"PeerAddr"` // host:port of its peer port
	// ClientAddr is its client address as recorded in the log; "" until
	// the serving leader has recorded it.
	ClientAddr string `json:"ClientAddr"`
	Voter      bool   `json:"Voter"`
	Leader     bool   `json:"Leader"`
	// Lag is how many entries its applied index trails the leader's
	// commit index; -1 when it did not answer.
	Lag int64 `json:"lag"`
	// Answers: it proved exactly its server id over its peer port within
	// 2 s (the leader always does).
	Answers bool `json:"answers"`
	// FoundAtAddr, when it does not answer, is the server id that answered
	// at its peer address instead under the same node name: a wiped node's
	// new incarnation ("" if none did). `ticketing members replace
	// ServerID FoundAtAddr PeerAddr` repairs it.
	FoundAtAddr string `json:"found_at_addr,omitempty"`
}

// Times in the reports. The state machine records, per holder, the
// leader's wall clock (Unix ms) stamped into the command that granted it,
// and per waiter the stamp of its acquire; it records no deadline (the
// leader runs lease and wait timers on its monotonic clock). So a
// remaining time carries its source: FromLeaderTimer or FromClockEstimate
// (the node's side, cluster/status.go, says how each is computed).
const (
	// FromLeaderTimer: the answering node leads and read the deadline it
	// will act on. Exact up to the commit of the expiry or cancel.
	FromLeaderTimer = "leader_timer"
	// FromClockEstimate: the leader's stamp + lease (or + wait) minus the
	// answering node's wall clock; after a leader change the real lease
	// deadline is later (a new leader re-arms a full lease).
	FromClockEstimate = "clock_estimate"
)

// StatusReport is one node's view of the cluster.
type StatusReport struct {
	// ServerID is the node that answered (NAME/INCARNATION).
	ServerID string `json:"server_id"`
	// Role is "leader", "follower", "learner" (a follower without a vote),
	// "candidate" or "shutdown".
	Role string `json:"role"`
	// Serving: this node leads and is ready for lock requests.
	Serving bool   `json:"serving"`
	Term    uint64 `json:"term"`
	// Leader is the leader's server id as this node knows it ("" if none)
	// and LeaderClientAddr the client address it announced.
	Leader           string `json:"leader"`
	LeaderClientAddr string `json:"leader_client_addr"`
	// Domain is the fencing domain ("" until the first leader committed it).
	Domain string `json:"domain"`
	// ClusterVersion is the protocol version every member is known to
	// speak, as the log records it (0: not recorded yet). Block acquires
	// need VersionBlocks.
	ClusterVersion uint16 `json:"cluster_version"`
	ClusterID      string `json:"cluster_id"`
	CommitIndex    uint64 `json:"commit_index"`
	AppliedIndex   uint64 `json:"applied_index"`
	// KeysHeld, Waiters and LastToken (the highest token ever issued: the
	// token high-water mark) are from this node's applied state.
	KeysHeld  int    `json:"keys_held"`
	Waiters   int    `json:"waiters"`
	LastToken uint64 `json:"last_token"`
	// SessionsTotal counts the brokers' (sidecars') sessions in this
	// node's applied state (protocol version 7, docs/sessions.md);
	// Sessions lists them sorted by id, the first MaxReportSessions only
	// (fewer over the admin port when they do not fit one frame),
	// SessionsTruncated saying so.
	SessionsTotal     int             `json:"sessions_total"`
	Sessions          []SessionReport `json:"sessions,omitempty"`
	SessionsTruncated bool            `json:"sessions_truncated,omitempty"`
	// Members is the configuration, sorted by server id.
	Members []MemberReport `json:"members"`
	// MembersError says why Members is empty (Raft shut down).
	MembersError string `json:"members_error,omitempty"`
	// AtUnixMs is this node's wall clock when it answered.
	AtUnixMs int64 `json:"at_unix_ms"`
}

// SessionReport is one broker's session in a StatusReport.
type SessionReport struct {
	// ID is the session id in lower-case hex, as the sidecar's INFO
	// (session=) and logs write it.
	ID        string `json:"id"`
	TimeoutMs uint32 `json:"timeout_ms"`
	// OpenedAtUnixMs is the leader's stamp in the open.
	OpenedAtUnixMs int64 `json:"opened_at_unix_ms"`
	// Resumes counts the resumes applied (the attach epoch).
	Resumes uint64 `json:"resumes"`
	// Waiters and Holdings are the session's queued requests and the
	// holdings granted to it (a block counts once); Outcomes the outcomes
	// kept until the broker acknowledges them.
	Waiters  int `json:"waiters"`
	Holdings int `json:"holdings"`
	Outcomes int `json:"outcomes"`
	// Attached is whether a connection of the session is attached to the
	// leader, in the leader's view: null when the answering node does not
	// lead (or does not serve yet). ExpiresInMs, when not attached, is how
	// long until the leader expires it unless it is resumed first (at
	// least 0); Expiring says its expiry is proposed.
	Attached    *bool  `json:"attached"`
	ExpiresInMs *int64 `json:"expires_in_ms,omitempty"`
	Expiring    bool   `json:"expiring,omitempty"`
}

// MemberReport is one server of the configuration in a StatusReport.
type MemberReport struct {
	ServerID string `json:"server_id"`
	Voter    bool   `json:"voter"`
	Leader   bool   `json:"leader"`
	PeerAddr string `json:"peer_addr"`
	// ClientAddr is "" until the leader has recorded it in the log.
	ClientAddr string `json:"client_addr"`
	// Lag is how many entries the member's applied index trails the
	// leader's commit index, in the leader's view: null when the answering
	// node does not lead or the member did not answer within 3 s.
	Lag *uint64 `json:"lag"`
	// Answers is whether the member proved exactly its server id over its
	// peer port within 3 s, in the leader's view: null when the answering
	// node does not lead.
	Answers *bool `json:"answers"`
	// FoundAtAddr, when it does not answer, is the server id that answered
	// at its peer address under the same node name instead (a wiped node's
	// new incarnation; `ticketing members replace ServerID FoundAtAddr
	// PeerAddr` repairs it); "" if none did or the answering node does not
	// lead.
	FoundAtAddr string `json:"found_at_addr,omitempty"`
}

// KeyReport is one key as a node sees it.
type KeyReport struct {
	Key string `json:"key"`
	// ServerID and Role say which node answered (see StatusReport); Leader
	// is the leader it knows.
	ServerID string `json:"server_id"`
	Role     string `json:"role"`
	Leader   string `json:"leader"`
	// AtUnixMs is the answering node's wall clock when it read the key.
	AtUnixMs int64 `json:"at_unix_ms"`
	Held     bool  `json:"held"`
	// Reserved: not held, but its queue head is a block that waits for
	// its other keys, so nobody else may take the key (locksm/MATRIX.md,
	// "Blocks").
	Reserved bool `json:"reserved,omitempty"`
	// Holder is set when Held.
	Holder *HolderReport `json:"holder,omitempty"`
	// QueueLen is the number of waiters; Queue lists them head first, the
	// first 1000 only (cluster.MaxInspectQueue; fewer over the admin port
	// when they do not fit one frame), QueueTruncated saying so.
	QueueLen       int            `json:"queue_len"`
	Queue          []WaiterReport `json:"queue"`
	QueueTruncated bool           `json:"queue_truncated,omitempty"`
	// Semaphore is set when the key is defined as a semaphore (version
	// 13; locksm/MATRIX.md, "Semaphores"): Held is then false and Holder
	// nil, and Permits lists its held permits in slot order (the first
	// 1000 only, PermitsTruncated saying so; fewer over the admin port
	// when they do not fit one frame).
	Semaphore        *SemaphoreReport `json:"semaphore,omitempty"`
	Permits          []HolderReport   `json:"permits,omitempty"`
	PermitsTruncated bool             `json:"permits_truncated,omitempty"`
	// LastRevoke is the latest revoke of the key (version 14), if the
	// replicated state still keeps one (locksm.MaxRevokeRecords).
	LastRevoke *RevokeReport `json:"last_revoke,omitempty"`
}

// SemaphoreReport describes a semaphore key.
type SemaphoreReport struct {
	// Permits is its n; Held the permits held (more than n after n was
	// lowered, until they end).
	Permits uint32 `json:"permits"`
	Held    int    `json:"held"`
}

// HolderReport is the holder of a key.
type HolderReport struct {
	Owner    string `json:"owner"`
	Token    uint64 `json:"token"`
	LeaseSec uint32 `json:"lease_sec"`
	// GrantedAtUnixMs is the leader's stamp in the granting command.
	GrantedAtUnixMs int64 `json:"granted_at_unix_ms"`
	// HeldMs is AtUnixMs − GrantedAtUnixMs (at least 0).
	HeldMs int64 `json:"held_ms"`
	// RenewedAtUnixMs is the leader's stamp in the holding's latest
	// extend (0: never extended); the lease counts from it.
	RenewedAtUnixMs int64 `json:"renewed_at_unix_ms,omitempty"`
	// LeaseRemainingMs is when the leader will end the holding unless it
	// is released (or extended) first (at least 0), from LeaseFrom:
	// FromLeaderTimer or FromClockEstimate.
	LeaseRemainingMs int64  `json:"lease_remaining_ms"`
	LeaseFrom        string `json:"lease_from"`
	// LeaseEndsAtUnixMs is that end on the answering node's wall clock:
	// AtUnixMs + LeaseRemainingMs.
	LeaseEndsAtUnixMs int64 `json:"lease_ends_at_unix_ms"`
	// BlockKeys: the holding is a block; every one of its keys (this one
	// included), in the requester's order.
	BlockKeys []string `json:"block_keys,omitempty"`
	// Session is the id (hex) of the broker's session it was granted to;
	// "" without one, or once that session ended (its holding keeps its
	// lease).
	Session string `json:"session,omitempty"`
	// Label is the label its acquire carried ("" without one; version 8).
	Label string `json:"label,omitempty"`
	// Slot is a permit's slot (KeyReport.Permits; its fencing domain is
	// the key and the slot); nil for a lock's holder.
	Slot *uint32 `json:"slot,omitempty"`
}

// WaiterReport is one queued acquire.
type WaiterReport struct {
	// Position is the waiter's place in line: 1 for the head of the
	// key's queue (the next to be granted), counting only waiters still
	// queued. The rows are listed in this order.
	Position int    `json:"position"`
	Owner    string `json:"owner"`
	// Ref is the leader's reference of the request (it also appears in the
	// leader's logs).
	Ref      uint64 `json:"ref"`
	LeaseSec uint32 `json:"lease_sec"`
	// WaitMs is the wait the client asked for.
	WaitMs uint32 `json:"wait_ms"`
	// EnqueuedAtUnixMs is the leader's stamp in the acquire.
	EnqueuedAtUnixMs int64 `json:"enqueued_at_unix_ms"`
	// WaitedMs is AtUnixMs − EnqueuedAtUnixMs (at least 0).
	WaitedMs int64 `json:"waited_ms"`
	// WaitRemainingMs is how long until the leader gives up on it (at least
	// 0), from WaitFrom: FromLeaderTimer or FromClockEstimate.
	WaitRemainingMs int64  `json:"wait_remaining_ms"`
	WaitFrom        string `json:"wait_from"`
	// BlockKeys: the waiter is a block, queued on every one of these keys
	// at once (this one included), in the requester's order.
	BlockKeys []string `json:"block_keys,omitempty"`
	// Session is the id (hex) of the broker's session that queued it: it
	// keeps its place across a leader change; "" without one (a new leader
	// drops it).
	Session string `json:"session,omitempty"`
	// Label is the label its acquire carried ("" without one; version 8).
	Label string `json:"label,omitempty"`
}
