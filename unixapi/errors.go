package unixapi

import (
	"context"
	"errors"
	"strings"

	"ticketing/cluster/wire"
	"ticketing/locksm"
	"ticketing/sidecar"
)

// Parser errors (parser.go). The codes they answer with are in errorTable
// below. Field errors reuse the locksm sentinels (locksm.ErrInvalidKey,
// locksm.ErrInvalidBlock, locksm.ErrInvalidLease, locksm.ErrInvalidWait) so
// a bad key answers invalid_key, and a bad key set of a block (more than
// locksm.MaxBlockKeys keys, a key named twice) invalid_keys, whether the
// sidecar or the cluster noticed it.
var (
	// ErrBadRequest: wrong number of fields, empty fields, stray spaces.
	ErrBadRequest = errors.New("unixapi: bad request")
	// ErrUnknownVerb: the first field is not a verb of the protocol.
	ErrUnknownVerb = errors.New("unixapi: unknown verb")
	// ErrLineTooLong: a line exceeded the maximum length. The stream cannot
	// be resynchronised reliably, so the connection is closed after the
	// reply.
	ErrLineTooLong = errors.New("unixapi: line too long")
	// ErrInvalidToken: a token that is not a decimal u64 in 1..2^64-1.
	ErrInvalidToken = errors.New("unixapi: invalid token")
)

// Server-side sentinels (server.go, session.go).
var (
	// ErrNotHeld: RELEASE of a key+token this connection does not hold.
	// Answered without contacting the cluster.
	ErrNotHeld = errors.New("unixapi: not held by this connection")
	// ErrReleaseInProgress: a RELEASE of that key+token is already running.
	ErrReleaseInProgress = errors.New("unixapi: release already in progress")
	// ErrExtendInProgress: an EXTEND of that key+token is already running
	// (one at a time per lock).
	ErrExtendInProgress = errors.New("unixapi: extend already in progress")
	// ErrTooManyInFlight: the connection has MaxInFlight ACQUIREs with
	// wait 0 running already.
	ErrTooManyInFlight = errors.New("unixapi: too many requests in flight")
	// ErrTooManyWaiters: the connection has MaxWaiting ACQUIREs with a
	// wait running already.
	ErrTooManyWaiters = errors.New("unixapi: too many waiting requests")
	// ErrTooManyConns: the server has MaxConns connections already.
	ErrTooManyConns = errors.New("unixapi: too many connections")
	// ErrForbidden: the peer's uid is not in AllowUIDs.
	ErrForbidden = errors.New("unixapi: peer not allowed")
	// ErrServerClosed: the server is shutting down.
	ErrServerClosed = errors.New("unixapi: server closed")
	// ErrSocketInUse: another process listens on the socket path.
	ErrSocketInUse = errors.New("unixapi: socket in use")
	// ErrInvalidConfig wraps every Config.Validate failure.
	ErrInvalidConfig = errors.New("unixapi: invalid config")
)

// errorTable is the one mapping from errors to reply lines. The first entry
// that matches (errors.Is) wins, so specific errors come before generic
// ones. An entry with a reply word (BUSY, TIMEOUT, INDETERMINATE) answers
// with that word alone; the others answer "ERR <code> <message>". Errors
// that match nothing answer "ERR internal ...". PROTOCOL.md reproduces this
// table (TestProtocolErrorTableMatchesCode compares the two).
var errorTable = []struct {
	err   error
	reply string // a whole-line reply word, or "" for ERR
	code  string
}{
	// Definite outcomes of an ACQUIRE that are not errors.
	{sidecar.ErrBusy, "BUSY", ""},
	{sidecar.ErrTimeout, "TIMEOUT", ""},
	{sidecar.ErrIndeterminate, "INDETERMINATE", ""},
	// Input errors found by the sidecar itself.
	{ErrLineTooLong, "", "line_too_long"},
	{ErrUnknownVerb, "", "unknown_verb"},
	{ErrInvalidToken, "", "invalid_token"},
	{ErrBadRequest, "", "bad_request"},
	{locksm.ErrInvalidKey, "", "invalid_key"},
	{locksm.ErrInvalidBlock, "", "invalid_keys"},
	{locksm.ErrInvalidOwner, "", "invalid_owner"},
	{locksm.ErrInvalidLease, "", "invalid_lease"},
	{locksm.ErrInvalidWait, "", "invalid_wait"},
	{locksm.ErrInvalidLabel, "", "invalid_label"},
	{locksm.ErrInvalidPermits, "", "invalid_permits"},
	// Session and server limits.
	{ErrNotHeld, "", "not_held"},
	{ErrReleaseInProgress, "", "release_in_progress"},
	{ErrExtendInProgress, "", "extend_in_progress"},
	{ErrTooManyInFlight, "", "too_many_in_flight"},
	{ErrTooManyWaiters, "", "too_many_waiters"},
	{ErrTooManyConns, "", "too_many_connections"},
	{ErrForbidden, "", "forbidden"},
	{ErrServerClosed, "", "shutting_down"},
	// Definite answers of the cluster about a release: the holding this
	// connection knew of is gone (lease expired, maybe handed on).
	{locksm.ErrNotHeld, "", "not_held"},
	{locksm.ErrTokenMismatch, "", "token_mismatch"},
	{locksm.ErrOwnerMismatch, "", "owner_mismatch"},
	// The broker could not get a definite answer, but nothing was executed.
	{sidecar.ErrMoved, "", "moved"},
	{sidecar.ErrUnavailable, "", "unavailable"},
	{sidecar.ErrClosed, "", "shutting_down"},
	{wire.ErrNoQuorum, "", "no_quorum"},
	{wire.ErrShuttingDown, "", "shutting_down"},
	{wire.ErrTooManyInFlight, "", "too_many_in_flight"},
	{locksm.ErrTokensExhausted, "", "tokens_exhausted"},
	// Semaphores (version 8): definite, nothing was executed.
	{locksm.ErrIsSemaphore, "", "is_semaphore"},
	{locksm.ErrNotSemaphore, "", "not_semaphore"},
	{locksm.ErrInUse, "", "in_use"},
	// The cluster's table limits: definite, nothing was executed.
	{wire.ErrTooManyKeys, "", "too_many_keys"},
	{wire.ErrNotSupported, "", "not_supported"},
	{wire.ErrTooManyWaiters, "", "too_many_waiters"},
	{sidecar.ErrTooManyWaiters, "", "too_many_waiters"},
	{context.Canceled, "", "cancelled"},
	{context.DeadlineExceeded, "", "cancelled"},
}

// replyFor renders err as a reply line without its "\n".
func replyFor(err error) string {
	for _, e := range errorTable {
		if errors.Is(err, e.err) {
			if e.reply != "" {
				return e.reply
			}
			return "ERR " + e.code + " " + message(err)
		}
	}
	return "ERR internal " + message(err)
}

// codeOf returns the ERR code err answers with ("" for BUSY, TIMEOUT and
// INDETERMINATE).
func codeOf(err error) string {
	for _, e := range errorTable {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	return "internal"
}

// message makes err's text safe for one reply line: printable ASCII only,
// no newline, bounded length. The text is for humans and logs; clients
// decide on the code.
func message(err error) string {
	s := err.Error()
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < 400; i++ {
		c := s[i]
		if c < 0x20 || c > 0x7E {
			c = '?'
		}
		b.WriteByte(c)
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}
