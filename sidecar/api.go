// Package sidecar is Ticketing's official client, the Broker: it keeps
// persistent, leader-aware, pipelined connections to the cluster and gives
// callers the client semantics of the product description (Indeterminate,
// no resend of a written request, bounded release retries with an absolute
// deadline, compensation of late grants). It follows membership (the
// configured addresses are seeds; members' client addresses are learned from
// the leader) and planned hand-overs (on a leader's notice it stops writing
// there and holds new requests until a leader serves). The sidecar process
// serves it over a unix socket (unixapi/); Go programs may also use it in
// process.
package sidecar

import (
	"errors"
	"time"

	"ticketing/cluster/wire"
)

// Sentinel errors. Definite errors from the cluster come back as the
// locksm / wire sentinels (errors.Is(err, locksm.ErrNotHeld), ...).
var (
	// ErrBusy: the key was held and the wait was 0. Definite: not acquired.
	ErrBusy = errors.New("sidecar: busy")
	// ErrTimeout: the wait ran out before the turn came. Definite: not
	// acquired, and never will be.
	ErrTimeout = errors.New("sidecar: timeout")
	// ErrIndeterminate: a written request got no definite reply. For an
	// acquire the caller must not enter the critical section (the lease ends
	// any holding it may have created); for a release, the lock may still be
	// held until its lease ends — or it is gone, but whether this release or
	// the lease ended it is unknown (an attempt whose reply was lost, then a
	// retry answered not_held).
	ErrIndeterminate = errors.New("sidecar: indeterminate")
	// ErrUnavailable: no connection to a serving leader could take the
	// request within its budget; not one byte was written. Definite.
	ErrUnavailable = errors.New("sidecar: cluster unavailable")
	// ErrMoved: the node that got the request was not the leader (or was
	// handing its leadership over) and did not execute it. Definite. The
	// broker remembers the leader it named and sends later requests there;
	// it never resends a written request.
	ErrMoved = errors.New("sidecar: moved")
	// ErrReleaseQueueFull: the bounded release queue is full; nothing was
	// sent (the lease remains the safety net).
	ErrReleaseQueueFull = errors.New("sidecar: release queue full")
	// ErrClosed: the broker is closed.
	ErrClosed = errors.New("sidecar: broker closed")
)

// Lock is a granted lock.
type Lock struct {
	Key   string
	Owner string
	Token uint64
	Lease time.Duration
	// ValidUntil is a conservative end of the holding: the moment the
	// acquire was sent plus the lease. The server's lease started later, so
	// this is never later than the real expiry (clock rate drift aside).
	ValidUntil time.Time
}

// Info describes the broker's view of the cluster.
type Info struct {
	ClusterID string
	Domain    string   // the fencing domain the nodes belong to, "" until known
	Leader    string   // client address of the known leader, "" if unknown
	Connected []string // addresses with a live connection
	// Addrs is every address the broker keeps: the seeds, then the
	// members' client addresses learned from the leader.
	Addrs []string
	Seeds []string // the configured addresses (Config.Addrs)
	// Members is the Raft configuration as the leader last reported it
	// (refreshed on leader changes and every Config.MembersRefresh; nil
	// until known).
	Members []wire.Member
}
