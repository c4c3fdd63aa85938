package wire

import (
	"errors"
	"fmt"
	"strings"

	"ticketing/locksm"
)

// Code is a stable error code carried in TypeError replies. Codes are never
// renumbered; new ones are appended.
type Code uint16

const (
	CodeBadRequest       Code = 1  // malformed frame or field
	CodeInvalidKey       Code = 2  // locksm.ErrInvalidKey
	CodeInvalidOwner     Code = 3  // locksm.ErrInvalidOwner
	CodeInvalidLease     Code = 4  // locksm.ErrInvalidLease
	CodeInvalidWait      Code = 5  // locksm.ErrInvalidWait
	CodeNotHeld          Code = 6  // locksm.ErrNotHeld
	CodeTokenMismatch    Code = 7  // locksm.ErrTokenMismatch
	CodeOwnerMismatch    Code = 8  // locksm.ErrOwnerMismatch
	CodeDuplicateID      Code = 9  // request id already in flight on this connection
	CodeTooManyInFlight  Code = 10 // per-connection pipeline limit
	CodeNoQuorum         Code = 11 // leader cannot reach a majority: nothing was proposed
	CodeShuttingDown     Code = 12 // node is stopping: nothing was proposed
	CodeUnknownTarget    Code = 13 // cancel names no pending acquire of this connection
	CodeAuthFailed       Code = 14 // handshake proof wrong
	CodeVersion          Code = 15 // no common protocol version
	CodeWrongNode        Code = 16 // peer handshake: not the node id the dialler expects
	CodeWrongCluster     Code = 17 // handshake: cluster id differs
	CodeInternal         Code = 18 // bug or storage failure; see the node's log
	CodeFrameTooLarge    Code = 19 // frame length above MaxFrameLen
	CodeUnexpectedFrame  Code = 20 // frame type not valid in this state
	CodeDuplicateRef     Code = 21 // locksm.ErrDuplicateRef (a leader bug; never sent for client input)
	CodeInvalidCommand   Code = 22 // locksm.ErrInvalidCommand
	CodeTokensExhausted  Code = 23 // locksm.ErrTokensExhausted: the 2^64-1 token counter is spent
	CodeTooManyKeys      Code = 24 // the node's MaxKeys limit: the acquire would create one key too many
	CodeTooManyWaiters   Code = 25 // the node's MaxWaitersPerKey (the key's queue is full) or MaxWaitersPerConn limit
	CodeTLSRequired      Code = 26 // plaintext bytes on a TLS port (connection-level, then close)
	CodeIdleTimeout      Code = 27 // nothing received for IdleTimeout (connection-level, then close)
	CodeTooManyConns     Code = 28 // the node's connection limit (connection-level, then close)
	CodeHandshakeTimeout Code = 29 // the handshake did not finish in time (connection-level, then close)
	CodeWrongDomain      Code = 30 // handshake: the two sides belong to different fencing domains
	CodeInvalidKeys      Code = 31 // locksm.ErrInvalidBlock: a block acquire's keys are not 2..16 distinct keys
	CodeNotSupported     Code = 32 // the request needs a newer protocol than some cluster member speaks
	// Sessions (version 7, docs/sessions.md).
	CodeNoSession      Code = 33 // locksm.ErrNoSession: the session is unknown (never opened, expired or closed)
	CodeVoided         Code = 34 // locksm.ErrVoided: the seq is at or below the session's floor (void since a resume)
	CodeDuplicateSeq   Code = 35 // locksm.ErrDuplicateSeq: the seq has an outcome or waiter already, or did not grow on this connection
	CodeSessionExists  Code = 36 // locksm.ErrSessionExists: an open naming a session id in use
	CodeInvalidSession Code = 37 // locksm.ErrInvalidSession: session 0, or a timeout out of bounds
	CodeStaleEpoch     Code = 38 // locksm.ErrStaleEpoch: a resume raced another (the leader retries it; never sent for client input)
	CodeBadSession     Code = 39 // a resume whose secret does not match the session's (logged with the remote address)
	// Labels (version 8).
	CodeInvalidLabel Code = 40 // locksm.ErrInvalidLabel: an acquire's label too long or outside 0x21..0x7E
	// Session bounds (issue 39; no frame changes, any version 7 or later).
	CodeTooManySessions Code = 41 // the leader's MaxSessions: an open that would make one live session too many
	CodeTooManyOutcomes Code = 42 // the leader's MaxSessionOutcomes: an acquire of a session whose unacknowledged outcomes fill it
	// Semaphores (version 13).
	CodeIsSemaphore    Code = 43 // locksm.ErrIsSemaphore: a lock acquire (or a block) names a key defined as a semaphore
	CodeNotSemaphore   Code = 44 // locksm.ErrNotSemaphore: a permit acquire (or a removal) names a key that is not a semaphore
	CodeInvalidPermits Code = 45 // locksm.ErrInvalidPermits: a set-permits above locksm.MaxPermits
	CodeInUse          Code = 46 // locksm.ErrInUse: a set-permits of a key held as a lock, or the removal of a semaphore in use
	// Revokes (version 14; admin port, see AdminCodes).
	CodeInvalidReason  Code = 47 // locksm.ErrInvalidReason: a revoke's reason too long or not printable
	CodeRevokesPending Code = 48 // locksm.ErrRevokesPending: the holder's broker has not acknowledged 1024 earlier revokes
)

// Sentinel errors of this package (each but ErrRemote, ErrBadConfig and
// the admin failures has its code in codeTable below; the admin failures
// have theirs in adminCodeTable, admin.go).
var (
	ErrFrameTooLarge    = errors.New("wire: frame too large")
	ErrMalformed        = errors.New("wire: malformed frame")
	ErrUnknownType      = errors.New("wire: unknown frame type")
	ErrAuthFailed       = errors.New("wire: authentication failed")
	ErrVersion          = errors.New("wire: no common protocol version")
	ErrWrongNode        = errors.New("wire: peer is not the expected node")
	ErrWrongCluster     = errors.New("wire: peer belongs to another cluster")
	ErrDuplicateID      = errors.New("wire: request id already in flight")
	ErrTooManyInFlight  = errors.New("wire: too many requests in flight")
	ErrNoQuorum         = errors.New("wire: leader has no quorum")
	ErrShuttingDown     = errors.New("wire: node shutting down")
	ErrUnknownTarget    = errors.New("wire: no such pending acquire")
	ErrInternal         = errors.New("wire: internal error")
	ErrUnexpectedFrame  = errors.New("wire: unexpected frame type")
	ErrTooManyKeys      = errors.New("wire: too many keys")
	ErrTooManyWaiters   = errors.New("wire: too many waiters")
	ErrTLSRequired      = errors.New("wire: this port requires TLS")
	ErrIdleTimeout      = errors.New("wire: connection idle too long")
	ErrTooManyConns     = errors.New("wire: too many connections")
	ErrHandshakeTimeout = errors.New("wire: handshake timed out")
	ErrWrongDomain      = errors.New("wire: peer belongs to another fencing domain")
	// ErrNotSupported (not_supported): the request needs a newer protocol
	// than some cluster member speaks (a block acquire before every member
	// runs version 5); definite, nothing was executed.
	ErrNotSupported = errors.New("wire: not supported by the cluster yet")
	// ErrBadSession (bad_session): a resume whose secret does not match
	// the session's hash, or a session request on a connection that
	// cannot carry it; a hostile or broken broker. Nothing was executed,
	// and nobody else's session or lock was touched.
	ErrBadSession = errors.New("wire: bad session")
	// ErrTooManySessions (too_many_sessions): the cluster has its
	// MaxSessions live sessions (each lives until its broker closes it or
	// it expires, its timeout after its connection went); the open is
	// refused, nothing was executed. A broker tries again later.
	ErrTooManySessions = errors.New("wire: too many sessions")
	// ErrTooManyOutcomes (too_many_outcomes): the session's outcomes that
	// its broker has not acknowledged fill the leader's
	// MaxSessionOutcomes; the acquire is refused, nothing was executed.
	// A broker that acks ('k') never meets it.
	ErrTooManyOutcomes = errors.New("wire: too many unacknowledged outcomes")
	// ErrRemote wraps a TypeError reply whose code has no local sentinel.
	ErrRemote = errors.New("wire: remote error")
	// ErrBadConfig reports a HandshakeConfig that cannot work (short
	// secret, bad kind, missing ids); it is returned before any byte is
	// sent. It has no wire code: it never leaves the caller.
	ErrBadConfig = errors.New("wire: bad handshake config")

	// Admin failures: the sentinels of the admin reply codes (admin.go,
	// adminCodeTable). The node returns them (package cluster's
	// ErrNotLeader, ... are these values) and the admin client's errors
	// wrap the one of the reply's code.

	// ErrNotLeader (not_leader): the op must be asked of the leader.
	ErrNotLeader = errors.New("wire: not the leader")
	// ErrNoVoterMajority (no_quorum): fewer than a majority of the voters
	// answer, so no membership change can commit (and no order of changes
	// can help). Not ErrNoQuorum, the client port's no_quorum: the two
	// were always apart, and the admin port maps only this one.
	ErrNoVoterMajority = errors.New("wire: no majority of the voters answers")
	// ErrUnsafeChange (unsafe): the change would break a membership rule
	// (voter count, the failures the cluster survives, a voter that must
	// answer).
	ErrUnsafeChange = errors.New("wire: unsafe membership change")
	// ErrLearnerLagging (lagging): the learner trails the commit index by
	// more than MaxPromoteLag, or did not answer.
	ErrLearnerLagging = errors.New("wire: the learner has not caught up")
	// ErrChangeInProgress (in_progress): another membership change has not
	// finished.
	ErrChangeInProgress = errors.New("wire: a membership change is in progress")
	// ErrNoSuchMember (no_such_member): the server id is not in the
	// configuration.
	ErrNoSuchMember = errors.New("wire: no such member")
	// ErrBadRequest (bad_request): an unknown op, a bad field, an invalid
	// key. Package cluster's ErrBadConfig matches it (errors.Is), so the
	// node answers its configuration errors with this code.
	ErrBadRequest = errors.New("wire: bad request")
	// ErrIndeterminate (indeterminate): an admin change was proposed but
	// its outcome is unknown (the leader lost its leadership or the
	// connection before it applied): it may yet commit. A revoke's
	// outcome is then read back with inspect (the key's last revoke).
	ErrIndeterminate = errors.New("wire: outcome unknown")
)

// codeTable is the one mapping between sentinels and wire codes. Order
// matters only to CodeOf for an error that wraps several sentinels: the
// specific field errors come before the generic ErrMalformed, so a decode
// error for a bad key length (which wraps both) answers invalid_key.
var codeTable = []struct {
	code Code
	err  error
}{
	{CodeInvalidKey, locksm.ErrInvalidKey},
	{CodeInvalidOwner, locksm.ErrInvalidOwner},
	{CodeInvalidLabel, locksm.ErrInvalidLabel},
	{CodeInvalidLease, locksm.ErrInvalidLease},
	{CodeInvalidWait, locksm.ErrInvalidWait},
	{CodeBadRequest, ErrMalformed},
	{CodeNotHeld, locksm.ErrNotHeld},
	{CodeTokenMismatch, locksm.ErrTokenMismatch},
	{CodeOwnerMismatch, locksm.ErrOwnerMismatch},
	{CodeDuplicateID, ErrDuplicateID},
	{CodeTooManyInFlight, ErrTooManyInFlight},
	{CodeNoQuorum, ErrNoQuorum},
	{CodeShuttingDown, ErrShuttingDown},
	{CodeUnknownTarget, ErrUnknownTarget},
	{CodeAuthFailed, ErrAuthFailed},
	{CodeVersion, ErrVersion},
	{CodeWrongNode, ErrWrongNode},
	{CodeWrongCluster, ErrWrongCluster},
	{CodeInternal, ErrInternal},
	{CodeFrameTooLarge, ErrFrameTooLarge},
	{CodeUnexpectedFrame, ErrUnexpectedFrame},
	// A type this version does not know is as unexpected as a reply type
	// sent by a client; ErrOf(CodeUnexpectedFrame) stays ErrUnexpectedFrame.
	{CodeUnexpectedFrame, ErrUnknownType},
	{CodeDuplicateRef, locksm.ErrDuplicateRef},
	{CodeInvalidCommand, locksm.ErrInvalidCommand},
	{CodeTokensExhausted, locksm.ErrTokensExhausted},
	{CodeTooManyKeys, ErrTooManyKeys},
	{CodeTooManyWaiters, ErrTooManyWaiters},
	{CodeTooManySessions, ErrTooManySessions},
	{CodeTooManyOutcomes, ErrTooManyOutcomes},
	{CodeTLSRequired, ErrTLSRequired},
	{CodeIdleTimeout, ErrIdleTimeout},
	{CodeTooManyConns, ErrTooManyConns},
	{CodeHandshakeTimeout, ErrHandshakeTimeout},
	{CodeWrongDomain, ErrWrongDomain},
	{CodeInvalidKeys, locksm.ErrInvalidBlock},
	{CodeNotSupported, ErrNotSupported},
	{CodeNoSession, locksm.ErrNoSession},
	{CodeVoided, locksm.ErrVoided},
	{CodeDuplicateSeq, locksm.ErrDuplicateSeq},
	{CodeSessionExists, locksm.ErrSessionExists},
	{CodeInvalidSession, locksm.ErrInvalidSession},
	{CodeStaleEpoch, locksm.ErrStaleEpoch},
	{CodeBadSession, ErrBadSession},
	{CodeIsSemaphore, locksm.ErrIsSemaphore},
	{CodeNotSemaphore, locksm.ErrNotSemaphore},
	{CodeInvalidPermits, locksm.ErrInvalidPermits},
	{CodeInUse, locksm.ErrInUse},
	{CodeInvalidReason, locksm.ErrInvalidReason},
	{CodeRevokesPending, locksm.ErrRevokesPending},
}

// CodeOf maps an error (possibly wrapped) to its wire code; CodeInternal if
// none matches.
func CodeOf(err error) Code {
	for _, e := range codeTable {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	return CodeInternal
}

// RemoteErr is the error of a TypeError reply with code and text: its
// sentinel (ErrOf) wrapped with the text. The text of a node's reply
// usually starts with that sentinel's own message (the node wrapped it
// too); that prefix is not repeated.
func RemoteErr(code Code, text string) error {
	sentinel := ErrOf(code)
	rest, had := strings.CutPrefix(text, sentinel.Error())
	switch {
	case !had:
		return fmt.Errorf("%w: %s", sentinel, text)
	case rest == "":
		return sentinel
	case strings.HasPrefix(rest, ": "):
		return fmt.Errorf("%w: %s", sentinel, rest[2:])
	}
	return fmt.Errorf("%w%s", sentinel, rest) // "wire: too many waiters on key ..."
}

// ErrOf maps a wire code back to its sentinel (ErrRemote if unknown).
func ErrOf(c Code) error {
	for _, e := range codeTable {
		if e.code == c {
			return e.err
		}
	}
	return ErrRemote
}

// String is the code's stable short name, used in logs and in the unix API.
func (c Code) String() string {
	if name, ok := codeNames[c]; ok {
		return name
	}
	return "unknown"
}

var codeNames = map[Code]string{
	CodeBadRequest: "bad_request", CodeInvalidKey: "invalid_key", CodeInvalidOwner: "invalid_owner",
	CodeInvalidLease: "invalid_lease", CodeInvalidWait: "invalid_wait", CodeNotHeld: "not_held",
	CodeTokenMismatch: "token_mismatch", CodeOwnerMismatch: "owner_mismatch", CodeDuplicateID: "duplicate_id",
	CodeTooManyInFlight: "too_many_in_flight", CodeNoQuorum: "no_quorum", CodeShuttingDown: "shutting_down",
	CodeUnknownTarget: "unknown_target", CodeAuthFailed: "auth_failed", CodeVersion: "version",
	CodeWrongNode: "wrong_node", CodeWrongCluster: "wrong_cluster", CodeInternal: "internal",
	CodeFrameTooLarge: "frame_too_large", CodeUnexpectedFrame: "unexpected_frame",
	CodeDuplicateRef: "duplicate_ref", CodeInvalidCommand: "invalid_command", CodeTokensExhausted: "tokens_exhausted",
	CodeTooManyKeys: "too_many_keys", CodeTooManyWaiters: "too_many_waiters", CodeTLSRequired: "tls_required",
	CodeIdleTimeout: "idle_timeout", CodeTooManyConns: "too_many_connections", CodeHandshakeTimeout: "handshake_timeout",
	CodeWrongDomain: "wrong_domain", CodeInvalidKeys: "invalid_keys", CodeNotSupported: "not_supported",
	CodeNoSession: "no_session", CodeVoided: "voided", CodeDuplicateSeq: "duplicate_seq",
	CodeSessionExists: "session_exists", CodeInvalidSession: "invalid_session", CodeStaleEpoch: "stale_epoch",
	CodeIsSemaphore: "is_semaphore", CodeNotSemaphore: "not_semaphore", CodeInvalidPermits: "invalid_permits",
	CodeInUse: "in_use", CodeInvalidReason: "invalid_reason", CodeRevokesPending: "revokes_pending",
	CodeBadSession: "bad_session", CodeInvalidLabel: "invalid_label",
	CodeTooManySessions: "too_many_sessions", CodeTooManyOutcomes: "too_many_outcomes",
}
