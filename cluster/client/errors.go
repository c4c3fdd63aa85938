package client

import "errors"

// Sentinel errors of this package.
var (
	// ErrConnClosed: the connection is dead (closed locally, by the server,
	// or by an I/O error); errors of calls that were in flight wrap it and
	// the cause.
	ErrConnClosed = errors.New("client: connection closed")
	// ErrProtocol: the server broke the protocol (reply to an unknown id, a
	// reply type that cannot answer the request, a malformed frame, or a
	// connection-level error). The connection is closed; the error wraps
	// ErrConnClosed too.
	ErrProtocol = errors.New("client: protocol violation")
	// ErrInvalidRequest: Start/Do was given a message it cannot send (not a
	// request type, nonzero ID, or a field that does not encode). Nothing
	// was sent.
	ErrInvalidRequest = errors.New("client: invalid request")
	// ErrAbandoned: the call was withdrawn by Abandon before it was sent.
	ErrAbandoned = errors.New("client: request abandoned before sending")
	// ErrHandingOver: Start refused an acquire or release because the node
	// announced that it is handing its leadership over (a NoticeHandOver
	// notice); nothing was written. Send it where the next leader serves.
	ErrHandingOver = errors.New("client: the node is handing its leadership over")
	// ErrAdmin wraps a failure reply from a node's admin port (AdminDo);
	// errors.Is also matches the sentinel of its code (wire.ErrNotLeader,
	// wire.ErrUnsafeChange, ...: wire.AdminErrOf; package cluster's
	// ErrNotLeader, ... are the same values).
	ErrAdmin = errors.New("client: admin request failed")
	// ErrAdminUnanswered wraps an AdminDo failure after the request was
	// (perhaps partly) written: the node may have received it and acted.
	// AdminCluster.Do does not send a revoke again after it (the second
	// one would find the key handed on and answer token_mismatch, as if
	// nothing had been revoked): it answers wire.ErrIndeterminate.
	ErrAdminUnanswered = errors.New("client: admin request sent, no reply read")
	// ErrVoid: a request of a session that was written on a connection
	// that died, and that the session's resume reported as never applied
	// (no outcome recorded, not queued): the resume raised the session's
	// floor above it, so it never will be. Definite: sending the same
	// operation again as a new request (a new seq) is not a resend.
	ErrVoid = errors.New("client: request void: never applied, never will be")
	// ErrSessionState: Open or Resume was called on a session that cannot
	// take it (already opened, expired, failed, or being attached
	// elsewhere), or the connection carries another session. Nothing sent.
	ErrSessionState = errors.New("client: session state does not allow it")
	// ErrConnBusy: Open or Resume on a connection with requests in flight,
	// whose replies could not be told from a resume's answers. Nothing
	// sent; try again when they are answered.
	ErrConnBusy = errors.New("client: connection has requests in flight")
	// ErrSessionRefused: the node did not attach the session (M, U, or an
	// E: errors.Is also matches the E code's sentinel; an E to a resume
	// makes the session unusable, locksm.ErrNoSession meaning it expired).
	ErrSessionRefused = errors.New("client: session not attached")
	// ErrSessionNotAttached: a lock request on a session connection before
	// its open or resume was answered. Nothing sent.
	ErrSessionNotAttached = errors.New("client: session not attached yet")
	// ErrSessionUnknown: the node answered U (leadership lost, outcome
	// unknown to it) to a lock request of the session attached to the
	// connection. The connection is closed (its error wraps this), and
	// the session holds its written requests for a resume.
	ErrSessionUnknown = errors.New("client: a session request was answered unknown")
	// ErrSessionClosed: the session was closed (Session.Close).
	ErrSessionClosed = errors.New("client: session closed")
)
