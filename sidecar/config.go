package sidecar

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Config configures a Broker. Zero tunables take the defaults below.
type Config struct {
	// Addrs are the seeds: cluster nodes' client addresses (HOST:PORT),
	// as the nodes advertise them (the leader named in a status or M reply
	// is matched against these strings). The broker always keeps a
	// connection to each, and adds the members' client addresses it
	// learns from the leader (see MembersRefresh). Required.
	Addrs []string
	// Secret is the cluster's client secret. Required (>= 16 bytes).
	Secret []byte
	// NextSecret, when set, is tried when a node does not prove itself
	// with Secret (during a secret rollover). nil: Secret only.
	NextSecret []byte
	// TLS, when set, makes every connection TLS 1.3 (build it with
	// tlsconf.ClientConfig): the nodes' certificates must be signed by its
	// CA and name the host of the address dialled. nil: plaintext.
	TLS *tls.Config
	// ClusterID must match the nodes'.
	ClusterID string
	// Domain is the fencing domain the nodes must belong to; "" learns it
	// from the first node that names one and then holds to it. A node of
	// another domain is refused (its tokens are not comparable with the
	// ones already handed out through this broker).
	Domain string

	// DialTimeout bounds one dial + handshake. Zero: 2 s.
	DialTimeout time.Duration
	// BackoffMin and BackoffMax bound the reconnect backoff, which doubles
	// after every failed dial and after every connection that ended within
	// 1 s of its handshake without the node sending anything on it (a node
	// that accepts and drops at once is not redialled every BackoffMin),
	// and starts again at BackoffMin after a connection that served (the
	// node sent a reply, a notice or an event: the broker asks every new
	// connection for the node's status) or stayed up 1 s. The first redial
	// after such a connection drops comes BackoffMin later, so a killed or
	// restarted node is dialled again at once. Zero: 100 ms and 3.2 s.
	BackoffMin, BackoffMax time.Duration
	// LeaderWait is how long an acquire or release may wait for a serving
	// leader to be known and connected before it is sent (or, for an
	// acquire, the remaining wait if that is longer); past it, the
	// request is ErrUnavailable. Nothing is written while waiting. An
	// acquire with a wait is sent with what is left of its wait; if none
	// is left when it could be sent, it is answered ErrTimeout instead
	// (never sent with wait 0, a one-try acquire). Zero: 3 s, about one
	// failover.
	LeaderWait time.Duration
	// ReplyGrace is how long past its wait an acquire waits for the
	// server's reply before it reports Indeterminate. Zero: 5 s.
	ReplyGrace time.Duration
	// ReleaseDeadline is the absolute deadline of a release's retries,
	// counted from Release/Compensate. Zero: 5 s.
	ReleaseDeadline time.Duration
	// ReleasesInFlight is how many releases may be sent and unanswered at
	// once on their first attempt, which goes to the known leader straight
	// from Release/Compensate, without a worker. Beyond it, when no leader
	// is known, and for every retry, a release waits in the release queue
	// for one of ReleaseWorkers. The queue has no bound of its own (a
	// release is never refused for room; the locks held bound it). The
	// two together (1024 + 64) stay below the node's release budget per
	// connection (its MaxInFlightPerConn, 4096), so the node never refuses
	// a release for room. Zero: 1024.
	ReleasesInFlight int
	// ReleaseWorkers is how many goroutines retry releases (and send those
	// beyond ReleasesInFlight), each one release at a time. Zero: 64.
	ReleaseWorkers int

	// MaxInFlight caps the acquires in flight to commit on one connection
	// (sent, neither queued at the node nor answered yet); the others wait
	// in the broker, unsent, and are sent round-robin across sessions as
	// slots free. A request sent waits behind every acquire in flight
	// before it, so this is also the longest line a flood can put ahead
	// of another session's request; the leader needs no more than its
	// throughput times its commit latency to stay busy. Zero:
	// DefaultMaxInFlight. A value above the node's own bound (protocol
	// version 4 tells it: its MaxInFlightPerConn) is lowered to it. On a
	// connection to an older node (version 3: no Q, so a queued waiter
	// holds its slot until its final reply) the budget is 4096, that
	// node's default bound, whatever MaxInFlight says.
	MaxInFlight int
	// MaxWaiters bounds the waiters of the whole broker: acquires with a
	// wait, from the call until their final reply (queued at the node, or
	// on their way). Zero: the node's MaxWaitersPerConn as its handshake
	// tells it (version 4), else 200,000 (that node default). A waiter
	// costs the sidecar under 2 KiB (unixapi's BenchmarkWaiterMemory
	// measures about 1.2 KiB per waiting ACQUIRE, broker and unix API
	// together), so the default room takes some 200-400 MiB when full.
	MaxWaiters int
	// MaxWaitersPerSession bounds one session's (owner's) waiters. Zero:
	// 100,000: one whole queue at the node's default MaxWaitersPerKey, so
	// that one event server's connection can hold a sale's waiting room
	// for its hot key alone, while the sidecar-wide default still leaves
	// as much again to the others (fair shares beyond that are the
	// eviction rule's job, see AcquireAsync).
	MaxWaitersPerSession int
	// MembersRefresh is how often the serving leader's node is asked for
	// the members (as etcd's client AutoSyncInterval): the broker then
	// dials members' client addresses it does not keep yet and stops
	// keeping addresses that are neither seeds nor members. It also asks
	// on every leader change. Zero: 30 s; negative: only on leader
	// changes.
	MembersRefresh time.Duration
	// AllowAddr, when set, vets a member's client address learned from the
	// cluster before the broker dials it (the sidecar applies its plaintext
	// rule here); an address it refuses is not kept. nil: any.
	AllowAddr func(addr string) error

	// Logger; nil: slog.Default().
	Logger *slog.Logger
	// Now is the clock for deadlines and validity; nil: time.Now.
	Now func() time.Time
	// After is used for backoff and retry pauses; nil: time.After. Tests
	// record the schedule through it.
	After func(d time.Duration) <-chan time.Time
	// Dialer dials TCP for the connections; nil: net.Dialer. Tests and
	// the lab's `ticketlab sidecar` inject network faults through it
	// (cluster/netfault.Dropper drops every connection it dialled).
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

	// Sessions says when the broker holds a session in the cluster's
	// replicated state (docs/sessions.md): SessionsAuto (the default)
	// whenever the serving leader's connection speaks protocol version 7,
	// so that queued acquires keep their place and every written request
	// gets a definite answer across a leader change; SessionsOff never
	// (today's behaviour exactly, as with a leader of version 6).
	Sessions SessionsMode
	// SessionTimeout is how long the cluster may keep the session without
	// a connection from this broker before it expires it (its waiters
	// leave the lines; its holdings keep their leases). Zero:
	// DefaultSessionTimeout (10 s: a failover and a reconnect fit in it,
	// and a crashed sidecar's place in a line costs seconds; see
	// docs/sessions.md). Bounds: locksm's 2 s..300 s. It also sets the
	// heartbeat: the session's connection pings after a third of it
	// without a write, and the leader takes a session connection silent
	// for it for dead (a lost host costs about twice this).
	SessionTimeout time.Duration

	// maxVersion, when set (package tests), is the newest cluster protocol
	// version offered: a broker that talks as to an older node.
	maxVersion uint16
}

// Defaults.
const (
	DefaultDialTimeout      = 2 * time.Second
	DefaultBackoffMin       = 100 * time.Millisecond
	DefaultBackoffMax       = 3200 * time.Millisecond
	DefaultLeaderWait       = 3 * time.Second
	DefaultReplyGrace       = 5 * time.Second
	DefaultReleaseDeadline  = 5 * time.Second
	DefaultReleaseWorkers   = 64
	DefaultReleasesInFlight = 1024
	// DefaultMaxInFlight is MaxInFlight's default. Measured on the 2-core
	// machine (ticketlab bench isolation, the flood of 60,000 waiting
	// ACQUIREs): a well-behaved session's acquire+release p99 while the
	// flood was taken in was 300–375 ms at 4096 in flight, 180–225 ms at
	// 1024 and 110–117 ms at 256, p50 unchanged (about 3 ms); 256 is still
	// more than the leader's throughput times its commit latency here
	// (about 35,000/s × 4 ms), so the leader never idles for want of work.
	// On a faster cluster raise it to that product.
	DefaultMaxInFlight = 256
	// DefaultMaxWaiters is MaxWaiters for a node that does not tell its
	// own: the node's default MaxWaitersPerConn.
	DefaultMaxWaiters           = 200_000
	DefaultMaxWaitersPerSession = 100_000
	DefaultMembersRefresh       = 30 * time.Second
)

// DefaultConfig returns a Config with every tunable at its default.
func DefaultConfig() Config {
	return Config{
		DialTimeout: DefaultDialTimeout, BackoffMin: DefaultBackoffMin, BackoffMax: DefaultBackoffMax,
		LeaderWait: DefaultLeaderWait, ReplyGrace: DefaultReplyGrace, ReleaseDeadline: DefaultReleaseDeadline,
		ReleaseWorkers: DefaultReleaseWorkers, ReleasesInFlight: DefaultReleasesInFlight, MaxWaitersPerSession: DefaultMaxWaitersPerSession,
		MembersRefresh: DefaultMembersRefresh,
	}
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	if len(c.Addrs) == 0 {
		return fmt.Errorf("%w: at least one cluster address is required", ErrBadConfig)
	}
	for _, a := range c.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("%w: cluster address %q: %w", ErrBadConfig, a, err)
		}
	}
	if len(c.Secret) < wire.MinSecretLen {
		return fmt.Errorf("%w: the client secret must be at least %d bytes", ErrBadConfig, wire.MinSecretLen)
	}
	if len(c.Domain) > 255 {
		return fmt.Errorf("%w: fencing domain of %d bytes (at most 255)", ErrBadConfig, len(c.Domain))
	}
	if c.BackoffMin < 0 || c.BackoffMax < c.BackoffMin && c.BackoffMax != 0 {
		return fmt.Errorf("%w: backoff bounds %v..%v", ErrBadConfig, c.BackoffMin, c.BackoffMax)
	}
	if c.ReleaseWorkers < 0 || c.ReleasesInFlight < 0 {
		return fmt.Errorf("%w: release workers and releases in flight must not be negative", ErrBadConfig)
	}
	if t := c.SessionTimeout; t != 0 && (t%time.Millisecond != 0 || t.Milliseconds() < locksm.MinSessionTimeoutMs ||
		t.Milliseconds() > locksm.MaxSessionTimeoutMs) {
		return fmt.Errorf("%w: session timeout %v not whole milliseconds in %dms..%dms", ErrBadConfig, t,
			locksm.MinSessionTimeoutMs, locksm.MaxSessionTimeoutMs)
	}
	if c.Sessions > SessionsOff {
		return fmt.Errorf("%w: unknown sessions mode %d", ErrBadConfig, c.Sessions)
	}
	if c.MaxInFlight < 0 || c.MaxWaiters < 0 || c.MaxWaitersPerSession < 0 {
		return fmt.Errorf("%w: MaxInFlight, MaxWaiters and MaxWaitersPerSession must not be negative", ErrBadConfig)
	}
	return nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&c.DialTimeout, d.DialTimeout)
	set(&c.BackoffMin, d.BackoffMin)
	set(&c.BackoffMax, d.BackoffMax)
	set(&c.LeaderWait, d.LeaderWait)
	set(&c.ReplyGrace, d.ReplyGrace)
	set(&c.ReleaseDeadline, d.ReleaseDeadline)
	set(&c.MembersRefresh, d.MembersRefresh)
	set(&c.SessionTimeout, DefaultSessionTimeout)
	if c.MaxWaitersPerSession == 0 {
		c.MaxWaitersPerSession = d.MaxWaitersPerSession
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.ReleaseWorkers == 0 {
		c.ReleaseWorkers = d.ReleaseWorkers
	}
	if c.ReleasesInFlight == 0 {
		c.ReleasesInFlight = d.ReleasesInFlight
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.After == nil {
		c.After = time.After
	}
	return c
}
