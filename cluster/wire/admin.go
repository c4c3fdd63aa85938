package wire

import (
	"errors"
	"strings"

	"ticketing/locksm"
)

// The admin protocol: a node's admin port (cluster.Config.AdminAddr) serves
// the operator tools (`ticketing members`, `status`, `inspect`). TCP → TLS
// as on the client port → the handshake (handshake.go) with KindAdmin and
// the admin secret, which differs from the client and peer secrets → frames
// in the framing of this package (codec.go: u32 length, type byte, payload;
// at most MaxFrameLenV4), one reply per request, in order: the node answers
// each request before it reads the next. Admin traffic is rare, so the
// payloads are JSON, readable in a capture and easy to extend. The JSON
// objects are AdminRequest and AdminReply (admin_json.go; the reply
// carries the node's reports, which its HTTP endpoint serves too);
// PROTOCOL.md, "Admin port", is the contract for both. The node's side is
// package cluster (admin.go there), the client's cluster/client.
const (
	// TypeAdminRequest (tool → node): one JSON object
	//
	//	{"op": OP, "id": "NAME/INCARNATION", "addr": "HOST:PORT",
	//	 "replaces": "NAME/INCARNATION", "key": KEY, "leader_only": bool}
	//
	// with OP one of the AdminOp* names; fields an op does not use are
	// left out.
	TypeAdminRequest = 'j'
	// TypeAdminReply (node → tool): one JSON object
	//
	//	{"ok": bool, "code": CODE, "error": TEXT, "leader": SERVER_ID,
	//	 "members": [...], "commit": N, "status": {...}, "key": {...}}
	//
	// answering the request before it. CODE (only when ok is false) is one
	// of AdminCodes. A reply never exceeds MaxPayloadLen: the node cuts an
	// inspected key's queue short to fit (queue_truncated).
	TypeAdminReply = 'J'
)

// Admin operations (AdminRequest.Op).
const (
	AdminOpMembers    = "members"     // the leader's configuration with each member's health
	AdminOpAddLearner = "add-learner" // id, addr: add a non-voter (leader only)
	AdminOpPromote    = "promote"     // id, optional replaces: make a learner a voter (leader only)
	AdminOpRemove     = "remove"      // id: remove a member (leader only)
	AdminOpStatus     = "status"      // the answering node's StatusReport (any node; leader_only: the leader)
	AdminOpInspect    = "inspect"     // key: the answering node's KeyReport (any node; leader_only: the leader)
	// AdminOpRevoke: key, token, reason, by: end the holding of key under
	// token (leader only; version 14, every member at it). The reply's
	// revoked says what ended and what was handed on.
	AdminOpRevoke = "revoke"
)

// Admin reply codes (AdminReply.Code): stable short names, never renamed;
// new ones are appended. adminCodeTable pairs each with its sentinel.
const (
	AdminNotLeader    = "not_leader"     // ask the leader (the reply's leader names it when known)
	AdminNoQuorum     = "no_quorum"      // fewer than a majority of the voters answer: nothing can commit
	AdminUnsafe       = "unsafe"         // the change would break a membership rule
	AdminLagging      = "lagging"        // the learner is behind or does not answer
	AdminInProgress   = "in_progress"    // another membership change is running
	AdminNoSuchMember = "no_such_member" // the server id is not in the configuration
	AdminBadRequest   = "bad_request"    // unknown op, bad field, not a JSON request frame
	AdminInternal     = "internal"       // anything else; see the node's log
	// Revokes (version 14).
	AdminNotHeld        = "not_held"        // revoke: the key is not held (by anyone, or not as that holding)
	AdminTokenMismatch  = "token_mismatch"  // revoke: the key is held under another token: nothing changed
	AdminNotSupported   = "not_supported"   // revoke: some member runs a version before 14
	AdminInvalidReason  = "invalid_reason"  // revoke: the reason is too long or not printable
	AdminIndeterminate  = "indeterminate"   // revoke: proposed, outcome unknown (inspect the key's last revoke)
	AdminRevokesPending = "revokes_pending" // revoke: the holder's broker has not acknowledged 1024 earlier revokes
)

// AdminCodes lists every admin reply code, in PROTOCOL.md's order.
var AdminCodes = []string{
	AdminNotLeader, AdminNoQuorum, AdminUnsafe, AdminLagging, AdminInProgress,
	AdminNoSuchMember, AdminBadRequest, AdminInternal,
	AdminNotHeld, AdminTokenMismatch, AdminNotSupported, AdminInvalidReason, AdminIndeterminate, AdminRevokesPending,
}

// adminCodeTable is the one mapping between the admin reply codes and
// their sentinels (codes.go), for the node (AdminCodeOf, to answer) and
// the client (AdminErrOf, to match); package cluster's sentinels of the
// same names are these values. Order matters only to AdminCodeOf for an
// error that wraps several: ErrNoVoterMajority comes before
// ErrUnsafeChange, which a refusal for want of a quorum wraps too.
// AdminInternal has no sentinel.
var adminCodeTable = []struct {
	code string
	err  error
}{
	{AdminNotLeader, ErrNotLeader},
	{AdminNoQuorum, ErrNoVoterMajority},
	{AdminUnsafe, ErrUnsafeChange},
	{AdminLagging, ErrLearnerLagging},
	{AdminInProgress, ErrChangeInProgress},
	{AdminNoSuchMember, ErrNoSuchMember},
	{AdminBadRequest, ErrBadRequest},
	{AdminNotHeld, locksm.ErrNotHeld},
	{AdminTokenMismatch, locksm.ErrTokenMismatch},
	{AdminNotSupported, ErrNotSupported},
	{AdminInvalidReason, locksm.ErrInvalidReason},
	{AdminIndeterminate, ErrIndeterminate},
	{AdminRevokesPending, locksm.ErrRevokesPending},
}

// AdminCodeOf is the admin reply code of err (possibly wrapped):
// AdminInternal when no admin sentinel matches.
func AdminCodeOf(err error) string {
	for _, c := range adminCodeTable {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return AdminInternal
}

// AdminErrOf is the sentinel of an admin reply code (nil for AdminInternal
// and for codes this version does not know), so that a client's error
// matches errors.Is(err, ErrNotLeader) and the like.
func AdminErrOf(code string) error {
	for _, c := range adminCodeTable {
		if c.code == code {
			return c.err
		}
	}
	return nil
}

// Membership facts of the admin contract. The node enforces them (package
// cluster, members.go) and the admin client plans by them
// (client.AdminCluster.Replace), so both read them here; PROTOCOL.md
// states them too.

// MaxPromoteLag is how many entries a learner's applied index may trail
// the leader's commit index and still be promoted (a promote beyond it is
// refused with lagging).
const MaxPromoteLag = 64

// Tolerance is how many more voter failures a cluster of voters voters,
// of which answering answer, survives and still commits: answering −
// (⌊voters/2⌋+1). Negative: no majority answers now.
func Tolerance(voters, answering int) int { return answering - (voters/2 + 1) }

// SplitServerID splits a server id, NAME/INCARNATION (the ids of the
// handshake and of the admin requests and replies); a bare name has no
// incarnation.
func SplitServerID(id string) (name, incarnation string) {
	name, incarnation, _ = strings.Cut(id, "/")
	return name, incarnation
}
