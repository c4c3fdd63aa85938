package ticketing

import "errors"

// Definite outcomes of Acquire and Release that are not protocol errors.
var (
	// ErrBusy: the key was held and wait was 0. Not acquired.
	ErrBusy = errors.New("ticketing: busy")
	// ErrTimeout: the wait ran out before the turn came. Not acquired.
	ErrTimeout = errors.New("ticketing: timeout")
	// ErrIndeterminate: the sidecar could not learn the outcome. For
	// Acquire: do not enter the critical section. For Release: the lock may
	// stay held until its lease ends.
	ErrIndeterminate = errors.New("ticketing: indeterminate")
	// ErrClosed: the connection is closed (by Close, or it broke). Locks held
	// through it are released by the sidecar; a pending Acquire that fails
	// with it did not acquire.
	ErrClosed = errors.New("ticketing: connection closed")
	// ErrInvalidArgument: an argument outside the protocol's limits; nothing
	// was sent.
	ErrInvalidArgument = errors.New("ticketing: invalid argument")
	// ErrProtocol: the sidecar sent a line this client does not understand.
	ErrProtocol = errors.New("ticketing: protocol error")
	// ErrNoSidecar: Dial found no sidecar at the path: no socket file there,
	// or a stale one that nothing serves (a sidecar that stopped). The
	// message names the path and what to start.
	ErrNoSidecar = errors.New("ticketing: no sidecar")
	// ErrNotSupported: the sidecar speaks an older protocol version than
	// the call needs (AcquireBlock against a version-1 sidecar). Nothing
	// was acquired.
	ErrNotSupported = errors.New("ticketing: not supported by the sidecar")
	// ErrNoDomain: INFO names no fencing domain yet ("domain=-": the
	// sidecar has not reached a node of its cluster), so tokens cannot be
	// fenced under it yet. Client.Domain returns it.
	ErrNoDomain = errors.New("ticketing: no fencing domain known yet")
)
