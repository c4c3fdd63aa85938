package sidecar

import "errors"

// Sentinel errors. Definite errors from the cluster come back as the
// locksm / wire sentinels (errors.Is(err, locksm.ErrNotHeld), ...).
var (
	// ErrBusy: the key was held and the wait was 0. Definite: not acquired.
	ErrBusy = errors.New("sidecar: busy")
	// ErrTimeout: the wait ran out before the turn came. Definite: not
	// acquired, and never will be. The broker answers it itself for an
	// acquire with a wait whose wait ran out before a byte of it was
	// written (held while no leader served, or queued behind the
	// in-flight budget): such an acquire is never sent with wait 0.
	ErrTimeout = errors.New("sidecar: timeout")
	// ErrIndeterminate: a written request got no definite reply. For an
	// acquire the caller must not enter the critical section (the lease ends
	// any holding it may have created); for a release, the lock may still be
	// held until its lease ends — or it is gone, but whether this release or
	// the lease ended it is unknown (an attempt whose reply was lost, then a
	// retry answered not_held).
	ErrIndeterminate = errors.New("sidecar: indeterminate")
	// ErrUnavailable: no connection to a serving leader could take the
	// request within its budget (not one byte was written), or the node
	// it was written to does not lead and named no leader (an M without
	// an address: it lost its quorum, or an election is under way; not
	// executed, and not resent). Definite either way.
	ErrUnavailable = errors.New("sidecar: cluster unavailable")
	// ErrRefused is wrapped beside ErrUnavailable when the nodes refused
	// this sidecar's settings (another cluster id, a wrong secret, no
	// common version, an unexpected node, a certificate the CA does not
	// verify) since it last connected: retrying will not help until a
	// setting is fixed. The message names the node and its refusal.
	ErrRefused = errors.New("sidecar: the nodes refuse this sidecar's settings")
	// ErrMoved: the node that got the request was not the leader (or was
	// handing its leadership over) and did not execute it. Definite. The
	// broker remembers the leader it named and sends later requests there
	// once connected to it (a named leader it cannot connect to is
	// forgotten, and the connected nodes are asked who serves); it never
	// resends a written request. A node that names no leader
	// gives ErrUnavailable instead.
	ErrMoved = errors.New("sidecar: moved")
	// ErrTooManyWaiters: an acquire with a wait found no waiter room
	// (Config.MaxWaiters sidecar-wide, where its session holds the most,
	// or MaxWaitersPerSession), or was evicted to make room for a session
	// holding less. Definite: not acquired, nothing left at the node. The
	// message says which.
	ErrTooManyWaiters = errors.New("sidecar: too many waiters")
	// ErrClosed: the broker is closed.
	ErrClosed = errors.New("sidecar: broker closed")
	// ErrWrongDomain: a node belongs to another fencing domain than the
	// one this broker holds to; the broker does not keep its connection.
	ErrWrongDomain = errors.New("sidecar: node of another fencing domain")
	// ErrBadConfig wraps every configuration error (Config.Validate).
	ErrBadConfig = errors.New("sidecar: bad config")
)
