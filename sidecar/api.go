// Package sidecar is Ticketing's official client, the Broker: it keeps
// persistent, leader-aware, pipelined connections to the cluster and gives
// callers the client semantics of the product description (Indeterminate,
// no resend of a written request, bounded release retries with an absolute
// deadline, compensation of late grants). It follows membership (the
// configured addresses are seeds; members' client addresses are learned from
// the leader) and planned hand-overs (on a leader's notice it stops writing
// there and holds new requests until a leader serves). Acquires are
// asynchronous inside (AcquireAsync; Acquire waits for one), so a waiter
// costs memory and no goroutine; they are scheduled fairly between
// sessions (owners) within the leader connection's in-flight budget and a
// bounded waiter room (sched.go). The sidecar process
// serves it over a unix socket (unixapi/); Go programs may also use it in
// process.
package sidecar

import (
	"time"

	"ticketing/cluster/wire"
)

// Lock is a granted lock: one key, or a block of keys held together under
// one token (AcquireBlock).
type Lock struct {
	// Key is the lock's key; for a block, its first (primary) key, which
	// names the whole block to a release.
	Key string
	// Keys is every key of a block, in the order asked; nil for one key.
	Keys  []string
	Owner string
	// Label is the acquire's owner label (AcquireOptions.Label; "" = none).
	Label string
	Token uint64
	// Permit: a permit of the semaphore Key (AcquireOptions.Permit), in
	// Slot (0..n-1): the key and the slot are its fencing domain.
	Permit bool
	Slot   uint32
	Lease  time.Duration
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
	// Session is the broker's cluster session (protocol version 7); nil
	// while it has none (a leader of version 6, or Config.Sessions off).
	Session *SessionInfo
	// Sessions and SessionTimeout are the broker's configuration
	// (Config.Sessions, Config.SessionTimeout with its default applied),
	// so that a reader of Info can tell "off" from "none yet".
	Sessions       SessionsMode
	SessionTimeout time.Duration
}
