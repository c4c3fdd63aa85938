package locksm

import "errors"

// Sentinel errors reported in Result.Err. Wire codes for them are assigned in
// one table in cluster/wire.
var (
	ErrInvalidKey   = errors.New("locksm: invalid key")
	ErrInvalidOwner = errors.New("locksm: invalid owner")
	// ErrInvalidLabel: an acquire's label longer than MaxLabelLen or with
	// a byte outside 0x21..0x7E.
	ErrInvalidLabel = errors.New("locksm: invalid label")
	// ErrInvalidReason: a revoke's reason longer than MaxReasonLen, with
	// a byte outside 0x20..0x7E, or with a space first or last
	// (ValidateReason).
	ErrInvalidReason = errors.New("locksm: invalid reason")
	// ErrRevokesPending: a revoke of a session's holding while the
	// session keeps MaxSessionRevokes notes its broker has not
	// acknowledged (SessionRevoke): one more would forget a note still
	// owed (issue 42's fourth attack round). Nothing changed; revoke
	// again once the broker acks, or its session ends.
	ErrRevokesPending = errors.New("locksm: the holder's broker has not acknowledged its earlier revokes")
	ErrInvalidLease   = errors.New("locksm: invalid lease")
	ErrInvalidWait    = errors.New("locksm: invalid wait")
	ErrInvalidCommand = errors.New("locksm: invalid command")
	// ErrInvalidBlock: a block acquire with fewer than MinBlockKeys or more
	// than MaxBlockKeys keys, or with a key named twice.
	ErrInvalidBlock = errors.New("locksm: invalid key set")
	// ErrNotHeld: a release or extend that does not name a holding
	// exactly: the key is not held (unknown, expired, reserved), or its
	// token, owner or session is not the holding's. One error for all of
	// them, so that an answer never tells which part was right
	// (matchHolder).
	ErrNotHeld = errors.New("locksm: key not held")
	// ErrTokenMismatch: the key is held, but under another token. For a
	// release or an extend only under SetLegacyMatching (a cluster not
	// all on protocol version 9; kept so that older outcomes, snapshots
	// and wire codes still decode). For a revoke always: the key is held
	// (a semaphore: some permit of it), but no holding of it has that
	// token, so nothing was revoked, and the operator should look again
	// (inspect) before naming the current token. The revoke's caller holds
	// the admin secret and may inspect the key anyway, so telling it apart
	// from ErrNotHeld gives away nothing (unlike for a release: matchHolder).
	ErrTokenMismatch = errors.New("locksm: token mismatch")
	// ErrOwnerMismatch: the token matches the holder but the owner does
	// not. Only under SetLegacyMatching, like ErrTokenMismatch.
	ErrOwnerMismatch = errors.New("locksm: owner mismatch")
	// ErrDuplicateRef: an acquire whose Ref is already queued on that key.
	ErrDuplicateRef = errors.New("locksm: duplicate ref")
	// ErrCorruptCommand / ErrCorruptSnapshot: a decoder met bytes it cannot
	// accept (bad version, truncated, trailing bytes, out-of-range field).
	ErrCorruptCommand  = errors.New("locksm: corrupt command")
	ErrCorruptSnapshot = errors.New("locksm: corrupt snapshot")
	// ErrTokensExhausted: the counter reached 2^64-1, so no fresh token is
	// left to grant with (unreachable in practice: 584,000 years at a
	// million grants a second; possible only from a crafted snapshot).
	ErrTokensExhausted = errors.New("locksm: tokens exhausted")
	// ErrInvalidSession: a session op naming session 0, or an open with a
	// SecretHash not SecretHashLen bytes long or a timeout outside
	// MinSessionTimeoutMs..MaxSessionTimeoutMs.
	ErrInvalidSession = errors.New("locksm: invalid session")
	// ErrNoSession: the command names a session that does not exist (never
	// opened, or expired or closed): its broker must not act on it.
	ErrNoSession = errors.New("locksm: no such session")
	// ErrSessionExists: an open naming a session id already in use.
	ErrSessionExists = errors.New("locksm: session exists")
	// ErrVoided: a lock command of a session whose seq is at or below the
	// session's floor: a resume already answered it "never applied", so it
	// changes nothing, now or ever.
	ErrVoided = errors.New("locksm: sequence voided by a resume")
	// ErrDuplicateSeq: a lock command whose seq the session already has an
	// outcome or a queued waiter for (a broker never writes a seq twice).
	ErrDuplicateSeq = errors.New("locksm: duplicate sequence")
	// ErrStaleEpoch: a resume whose attach epoch is not the session's (it
	// was resumed since the leader looked).
	ErrStaleEpoch = errors.New("locksm: stale session epoch")
	// ErrIsSemaphore: a lock acquire (OpAcquire, or a block naming it) of
	// a key defined as a semaphore: take a permit of it (OpAcquirePermit).
	ErrIsSemaphore = errors.New("locksm: key is a semaphore")
	// ErrNotSemaphore: a permit acquire of a key not defined as a
	// semaphore, or OpSetPermits 0 of one.
	ErrNotSemaphore = errors.New("locksm: key is not a semaphore")
	// ErrInvalidPermits: OpSetPermits with n above MaxPermits.
	ErrInvalidPermits = errors.New("locksm: invalid permits")
	// ErrInUse: OpSetPermits of a key held or reserved as a lock, or the
	// removal (n 0) of a semaphore with a permit held or a waiter.
	ErrInUse = errors.New("locksm: key in use")
)
