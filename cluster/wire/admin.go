package wire

// The admin protocol: a node's admin port (cluster.Config.AdminAddr) serves
// the operator tools (`ticketing members`, `status`, `inspect`). TCP → TLS
// as on the client port → the handshake (handshake.go) with KindAdmin and
// the admin secret, which differs from the client and peer secrets → frames
// in the framing of this package (codec.go: u32 length, type byte, payload;
// at most MaxFrameLen), one reply per request, in order: the node answers
// each request before it reads the next. Admin traffic is rare, so the
// payloads are JSON, readable in a capture and easy to extend. The JSON
// objects are cluster.AdminRequest and cluster.AdminReply (the reply
// carries the node's reports, which its HTTP endpoint serves too);
// PROTOCOL.md, "Admin port", is the contract for both.
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
)

// Admin reply codes (AdminReply.Code): stable short names, never renamed;
// new ones are appended. Package cluster maps its sentinels to them.
const (
	AdminNotLeader    = "not_leader"     // ask the leader (the reply's leader names it when known)
	AdminNoQuorum     = "no_quorum"      // fewer than a majority of the voters answer: nothing can commit
	AdminUnsafe       = "unsafe"         // the change would break a membership rule
	AdminLagging      = "lagging"        // the learner is behind or does not answer
	AdminInProgress   = "in_progress"    // another membership change is running
	AdminNoSuchMember = "no_such_member" // the server id is not in the configuration
	AdminBadRequest   = "bad_request"    // unknown op, bad field, not a JSON request frame
	AdminInternal     = "internal"       // anything else; see the node's log
)

// AdminCodes lists every admin reply code, in PROTOCOL.md's order.
var AdminCodes = []string{
	AdminNotLeader, AdminNoQuorum, AdminUnsafe, AdminLagging, AdminInProgress,
	AdminNoSuchMember, AdminBadRequest, AdminInternal,
}
