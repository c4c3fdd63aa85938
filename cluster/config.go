package cluster

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster/wire"
)

// Peer is one initial voter: its Raft server id and its peer address.
type Peer struct {
	ID   string
	Addr string // host:port of its peer port
}

// Config configures a Node. Build it from DefaultConfig and check it with
// Validate (New does both checks again).
type Config struct {
	// NodeID is this node's id, unique in the cluster: 1..64 characters of
	// [A-Za-z0-9._-]. It is the Raft server id.
	NodeID string
	// DataDir holds the Raft log and stable store (wal/, or raft.db with
	// the bolt log store), snapshots/ and the server identity. Created if
	// missing. Required.
	DataDir string
	// LogStore is the Raft log store: LogStoreAuto (the default) opens
	// the store DataDir holds
	// and creates LogStoreWAL (hashicorp/raft-wal, segment files, one
	// fsync per append) in a DataDir that holds none; a DataDir written
	// by bolt stays on bolt, with a warning. LogStoreBolt
	// (raft-boltdb/v2, one file, two fdatasyncs per append) or LogStoreWAL
	// asks for that kind: a new DataDir gets it, and a DataDir that holds
	// the other kind is refused (ErrLogStoreMismatch). See LogStoreKind
	// for what each gives and costs. The kind is fixed per data dir; to
	// move a node, replace it with a fresh data dir (docs/operations.md).
	// Zero: DefaultLogStore (LogStoreAuto).
	LogStore LogStoreKind
	// ClientAddr is the host:port the client port listens on. Ignored when
	// ClientListener is set.
	ClientAddr string
	// AdvertiseClientAddr is the client address other nodes hand out in M
	// replies; "" means the listener's own address.
	AdvertiseClientAddr string
	// PeerAddr is the host:port the peer (Raft) port listens on; it must be
	// the address this node has in Peers. Ignored when PeerListener is set.
	PeerAddr string
	// ClientListener and PeerListener, when set, are used instead of
	// listening on ClientAddr/PeerAddr: cluster/local (`ticketing dev`)
	// pre-opens every node's listeners, on port 0 with --base-port 0, so
	// that all the addresses are known before the first node starts.
	ClientListener net.Listener
	PeerListener   net.Listener
	// Peers are the initial voters (exactly 3 or 5), which Bootstrap
	// writes into the first configuration and which must then include this
	// node. A running node does not need them: membership lives in the
	// log, and a node that joins later (a learner) may leave Peers empty.
	Peers []Peer
	// ClusterID names the cluster; peers and clients must present the same
	// one in their handshake. "" is allowed and matches only "".
	ClusterID string
	// ClientSecret authenticates clients; PeerSecret authenticates peers.
	// Each at least 16 bytes. They should differ.
	ClientSecret []byte
	PeerSecret   []byte
	// NextClientSecret and NextPeerSecret, when set, are accepted as well
	// during a secret rollover (each at least 16 bytes); see
	// wire.HandshakeConfig.NextSecret. nil: only the current secret.
	NextClientSecret []byte
	NextPeerSecret   []byte

	// AdminAddr, when set, is the host:port of the admin port (membership
	// changes, `ticketing members`), which needs AdminSecret; it uses
	// ClientTLS. Ignored when AdminListener is set. "": no admin port.
	AdminAddr     string
	AdminListener net.Listener
	// AdminSecret authenticates operator tools on the admin port; at
	// least 16 bytes and different from the client and peer secrets.
	AdminSecret []byte

	// ClientTLS, when set, makes the client port TLS 1.3 only (build it
	// with tlsconf.ServerConfig); the handshake then signs the TLS
	// exporter. nil: plaintext TCP, which the node logs as a warning at
	// start.
	ClientTLS *tls.Config
	// PeerTLS, when set, makes the peer port mutual TLS 1.3 in both
	// directions (build it with tlsconf.PeerConfig): a dialler verifies
	// that the certificate names the node id it dialled, an acceptor that
	// the dialler's certificate names the node id it proved. nil:
	// plaintext, logged as a warning at start.
	PeerTLS *tls.Config

	// HeartbeatTimeout is how long a follower waits without contact from the
	// leader before it starts an election (randomised up to twice this).
	// Together with ElectionTimeout it sets failover time. Zero:
	// DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration
	// ElectionTimeout is how long a candidate waits for votes (randomised up
	// to twice this). Zero: DefaultElectionTimeout.
	ElectionTimeout time.Duration
	// LeaderLeaseTimeout is how long a leader keeps leading without hearing
	// from a majority; after it, it steps down and stops granting. Zero:
	// DefaultLeaderLeaseTimeout. Must not exceed HeartbeatTimeout.
	LeaderLeaseTimeout time.Duration
	// CommitTimeout bounds how long a follower can go without learning the
	// commit index when there is no new entry. Zero: DefaultCommitTimeout.
	CommitTimeout time.Duration
	// MaxAppendEntries is the most log entries in one AppendEntries RPC.
	// Zero: DefaultMaxAppendEntries.
	MaxAppendEntries int
	// ProposeLinger is the longest the leader holds back a batch made only
	// of acquires that will join a queue (their key is held, and each may
	// wait), waiting for a command someone waits on to go in the same log
	// entry; anything else is proposed at once. Zero:
	// DefaultProposeLinger; negative: never hold back.
	ProposeLinger time.Duration
	// SnapshotThreshold is how many log entries after the last snapshot
	// trigger a new one; SnapshotInterval how often that is checked;
	// TrailingLogs how many entries a snapshot leaves in the log. Zero:
	// DefaultSnapshotThreshold, DefaultSnapshotInterval, DefaultTrailingLogs.
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
	// PeerTimeout is the I/O deadline of one Raft RPC. Zero:
	// DefaultPeerTimeout.
	PeerTimeout time.Duration

	// DisableLogVerify turns online log verification off on this node
	// (logverify.go): its log store keeps no checksums and checks
	// nothing, and as the serving leader it appends no checkpoints (it
	// still applies other leaders' checkpoints, as no-ops). false, the
	// default: verification on, as docs/operations.md ("Log
	// verification") describes.
	DisableLogVerify bool
	// LogVerifyInterval is the longest the serving leader goes between
	// two log verification checkpoints while entries are appended (an
	// idle log gets none); LogVerifyEntries the most entries it lets
	// pass between two: a checkpoint is appended at whichever comes
	// first, so each verified range is at most about LogVerifyEntries
	// entries, which every node reads back once. A range must still be
	// in a node's log when its checkpoint arrives (TrailingLogs above
	// LogVerifyEntries), or that node counts it unverified. Zero:
	// DefaultLogVerifyInterval (a duration), DefaultLogVerifyEntries
	// (entries).
	LogVerifyInterval time.Duration
	LogVerifyEntries  uint64

	// HandshakeTimeout bounds a client or peer handshake. Zero:
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxInFlightPerConn bounds, on one client connection, the acquires
	// whose own command is not applied yet, and separately (room reserved
	// for them) the releases whose own command is not applied yet; past
	// it a request gets E too_many_in_flight. A queued waiter does not
	// count (see MaxWaitersPerConn). Told to clients in the Welcome
	// (protocol version 4). Zero: DefaultMaxInFlightPerConn.
	MaxInFlightPerConn int
	// MaxClientConns bounds open client connections; past it new ones are
	// closed after a connection-level error. Zero: DefaultMaxClientConns.
	MaxClientConns int
	// IdleTimeout closes a client connection from which nothing arrived
	// for this long (after E idle_timeout). Clients keep connections alive
	// with pings (the official client pings after 30 s of quiet). A
	// connection that carries a session is closed after the session's
	// timeout instead, if shorter (its broker pings at a third of it):
	// docs/sessions.md, "Liveness". Zero: DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxReplyBacklog bounds the reply bytes queued for one client
	// connection that does not read them; past it the connection is
	// closed (its locks are then handled as for any dead connection).
	// Zero: DefaultMaxReplyBacklog.
	MaxReplyBacklog int
	// MaxKeys bounds the keys held at once (plus acquires not yet
	// committed); an acquire that could create one more gets E
	// too_many_keys. Semaphores defined and permits held count as keys
	// (a permit acquire, or a set-permits defining a new semaphore, gets
	// too_many_keys at the bound). Zero: DefaultMaxKeys.
	MaxKeys int
	// MaxWaitersPerKey bounds one key's queue (plus acquires for it not
	// yet committed); one more gets E too_many_waiters. The count errs on
	// the safe side: for the moment between a batch's apply and the leader
	// core taking its results, that batch's acquires count both as queued
	// and as not yet committed, so near the bound a burst may be refused
	// up to one batch (4096) early (the waiting-room benchmark saw 286 of
	// 20,000 refused at a bound of 21,024). Zero: DefaultMaxWaitersPerKey.
	MaxWaitersPerKey int
	// MaxWaitersPerConn bounds the waiters of one client connection: its
	// queued acquires plus its acquires with a wait not yet committed;
	// one more gets E too_many_waiters (an acquire with wait 0 never
	// counts). Told to clients in the Welcome (protocol version 4). Zero:
	// DefaultMaxWaitersPerConn.
	MaxWaitersPerConn int
	// MaxSessions bounds the brokers' live sessions in the lock table plus
	// the opens not yet committed; one more open gets E too_many_sessions
	// (the broker tries again). Zero: DefaultMaxSessions.
	MaxSessions int
	// MaxSessionOutcomes bounds one session's outcomes that its broker
	// has not acknowledged; an acquire of that session past it gets E
	// too_many_outcomes (its releases and extends never do). A broker
	// acks every 200 ms, so it never meets it. Zero:
	// DefaultMaxSessionOutcomes.
	MaxSessionOutcomes int
	// PositionInterval is how often the leader walks the lines that moved
	// and tells their waiters their places (the R frame, protocol version
	// 12): no waiter hears its place more than once per interval, a new
	// waiter hears its first within one, and the work is one walk of
	// each moved line per interval, never one per hand-off. Shorter
	// intervals cost the leader a walk of a busy line more often (a
	// 100,000-waiter line: BenchmarkPositionWalk) and every waiter a
	// frame more often. 10ms..1m; zero: DefaultPositionInterval.
	PositionInterval time.Duration
	// MaxHandshakesPerIP bounds the connections from one IP address that
	// are between accept and a finished handshake, on each port; more are
	// closed at once. Zero: DefaultMaxHandshakesPerIP.
	MaxHandshakesPerIP int
	// AuthFailureDelay is how long a connection that failed its handshake
	// is held before it is closed; it doubles with every further failure
	// from the same IP within a minute, up to AuthFailureDelayMax. Zero:
	// DefaultAuthFailureDelay, DefaultAuthFailureDelayMax (at least
	// AuthFailureDelay).
	AuthFailureDelay    time.Duration
	AuthFailureDelayMax time.Duration

	// Logger receives the node's logs (Raft's included). nil: slog.Default().
	Logger *slog.Logger
	// Now is the wall clock stamped into proposed commands; nil: time.Now.
	// Lease and wait timers run on the monotonic clock regardless, so a
	// shifted Now (the lab's clock-offset fault) is exactly how a
	// wall-clock jump reaches a node.
	Now func() time.Time
	// PeerNet is the network under the peer transport: every Raft
	// connection is dialled through it and handed to it once its
	// handshake has proved both ends (see PeerNet). Tests and the lab
	// plug their network faults in here (cluster/netfault). nil: plain
	// TCP.
	PeerNet PeerNet
	// ProtocolVersion is the newest protocol version the node speaks, on
	// its client and peer ports alike (and so the cluster version it
	// helps record): 0 = wire.ProtocolVersion (10, log verification). Lower plays
	// an older build: tests of a rolling upgrade run some nodes at 6, so
	// that the cluster version stays 6 until every member speaks 7; a
	// node below the cluster version is never made a voter or handed the
	// leadership (members.go, handover.go).
	ProtocolVersion uint16

	// storeWrap wraps the log store (tests only: export_test.go).
	storeWrap storeWrap
}

// storeWrap is where a test puts its own raft.LogStore around a node's:
// under, between the log verifier and the store (what the node reads
// back); over, between Raft (its log cache) and the verifier (what the
// node writes). nil: nothing.
type storeWrap struct {
	under, over func(raft.LogStore) raft.LogStore
}

// Defaults. The Raft timeouts are tuned so that a new leader grants within
// 2.5 s of the old leader's death (measured: median 1.8 s, worst 2.4 s over
// 11 SIGKILLs on loopback; see docs/operations.md, "Failover"). A follower notices the
// silence after 1–2 heartbeat timeouts; when the other follower has not
// noticed yet it rejects the first vote, and the candidate tries again after
// 1–2 election timeouts.
//
// The waiter limits are sized for waiting rooms (issue 20: 50,000 buyers on
// one hot key behind one sidecar, which multiplexes its whole host on one
// connection per node): MaxWaitersPerKey 100,000, MaxWaitersPerConn
// 200,000. A queued waiter costs the leader about 430 bytes of heap (all
// three in-process nodes together 560; BenchmarkLeaderMemoryPerWaiter), so
// a full connection's waiters cost about 86 MiB, a full key's 43 MiB.
// MaxInFlightPerConn (4096) bounds only work about to commit: acquires, and
// as many releases, whose own command is not applied yet.
const (
	DefaultHeartbeatTimeout   = 800 * time.Millisecond
	DefaultElectionTimeout    = 800 * time.Millisecond
	DefaultLeaderLeaseTimeout = 500 * time.Millisecond
	DefaultCommitTimeout      = 20 * time.Millisecond
	DefaultMaxAppendEntries   = 256
	// DefaultProposeLinger is ProposeLinger's default. On a hot key every
	// hand-off's commit grants the next holder and answers the last, who
	// at once asks again: that acquire (it will queue) reached the leader
	// just before the new holder's release and took a log entry of its
	// own, so the release waited a leader append behind it. Held back,
	// both go in one entry. Measured on the 2-core machine (ticketlab
	// compare, 64 clients on one key through a sidecar, alternating runs):
	// bolt 483–499 → 558–566 hand-offs/s, wal 815–847 → 875–918, FIFO
	// 100 % throughout; uncontended throughput unchanged.
	DefaultProposeLinger     = 2 * time.Millisecond
	DefaultSnapshotThreshold = 16384
	DefaultSnapshotInterval  = 30 * time.Second
	DefaultTrailingLogs      = 10240
	DefaultPeerTimeout       = 5 * time.Second
	// The log verification checkpoints: one a minute on a quiet cluster
	// (Consul's interval), and one per 4096 entries under load, a range
	// well inside DefaultTrailingLogs that every node reads back in a
	// few milliseconds (BenchmarkLogVerify).
	DefaultLogVerifyInterval  = time.Minute
	DefaultLogVerifyEntries   = 4096
	DefaultHandshakeTimeout   = 5 * time.Second
	DefaultMaxInFlightPerConn = 4096
	DefaultMaxClientConns     = 10000
	DefaultIdleTimeout        = 2 * time.Minute
	DefaultMaxReplyBacklog    = 8 << 20
	DefaultMaxKeys            = 4_000_000
	DefaultMaxWaitersPerKey   = 100_000
	DefaultMaxWaitersPerConn  = 200_000
	// The session bounds (issue 39, finding 4). Measured (locksm, one
	// process): a session costs the table about 320 bytes of heap and 42
	// bytes of snapshot, a kept outcome about 87 bytes of heap and 4 to
	// 10 bytes of snapshot. 10,000 sessions are 3 MiB: one per sidecar,
	// and room for a fleet; a loop of connect, open, close meets the
	// bound in seconds, not the heap. 262,144 outcomes (22 MiB of heap
	// and about 1 MiB of snapshot at most per session) stay above what a
	// sidecar that acks every 200 ms can have unacknowledged, even when a
	// whole connection's waiting room (MaxWaitersPerConn) times out at
	// once; a client that never acks meets it.
	DefaultMaxSessions        = 10_000
	DefaultMaxSessionOutcomes = 262_144
	DefaultMaxHandshakesPerIP = 64
	// One place a second: as often as a person watching a waiting room
	// reads it, and rare enough that a 100,000-waiter line costs the
	// leader a walk of a few milliseconds per second at most.
	DefaultPositionInterval    = time.Second
	DefaultAuthFailureDelay    = 500 * time.Millisecond
	DefaultAuthFailureDelayMax = 8 * time.Second
)

// DefaultConfig returns a Config with every tunable at its default and the
// identity fields empty. It is the one place that names the default of
// each field: withDefaults fills zero fields from it, and `ticketing node`
// takes its flag defaults from it.
func DefaultConfig() Config {
	return Config{
		HeartbeatTimeout:    DefaultHeartbeatTimeout,
		ElectionTimeout:     DefaultElectionTimeout,
		LeaderLeaseTimeout:  DefaultLeaderLeaseTimeout,
		CommitTimeout:       DefaultCommitTimeout,
		MaxAppendEntries:    DefaultMaxAppendEntries,
		ProposeLinger:       DefaultProposeLinger,
		SnapshotThreshold:   DefaultSnapshotThreshold,
		SnapshotInterval:    DefaultSnapshotInterval,
		TrailingLogs:        DefaultTrailingLogs,
		PeerTimeout:         DefaultPeerTimeout,
		LogVerifyInterval:   DefaultLogVerifyInterval,
		LogVerifyEntries:    DefaultLogVerifyEntries,
		HandshakeTimeout:    DefaultHandshakeTimeout,
		MaxInFlightPerConn:  DefaultMaxInFlightPerConn,
		MaxClientConns:      DefaultMaxClientConns,
		IdleTimeout:         DefaultIdleTimeout,
		MaxReplyBacklog:     DefaultMaxReplyBacklog,
		MaxKeys:             DefaultMaxKeys,
		MaxWaitersPerKey:    DefaultMaxWaitersPerKey,
		MaxWaitersPerConn:   DefaultMaxWaitersPerConn,
		MaxSessions:         DefaultMaxSessions,
		MaxSessionOutcomes:  DefaultMaxSessionOutcomes,
		PositionInterval:    DefaultPositionInterval,
		MaxHandshakesPerIP:  DefaultMaxHandshakesPerIP,
		AuthFailureDelay:    DefaultAuthFailureDelay,
		AuthFailureDelayMax: DefaultAuthFailureDelayMax,
		LogStore:            DefaultLogStore,
	}
}

// withDefaults fills every zero tunable from DefaultConfig, and a nil
// Logger and Now. It copies field by field with reflection, so the
// defaults are written in one place (the constants, named once in
// DefaultConfig) and a new tunable cannot be forgotten here; fields
// DefaultConfig leaves zero (the identity, the secrets, the seams) stay as
// they are.
// protocolVersion is the newest protocol version the node speaks.
func (c Config) protocolVersion() uint16 {
	if c.ProtocolVersion == 0 {
		return wire.ProtocolVersion
	}
	return c.ProtocolVersion
}

func (c Config) withDefaults() Config {
	maxUnset := c.AuthFailureDelayMax == 0
	d := reflect.ValueOf(DefaultConfig())
	v := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.CanSet() && f.IsZero() {
			f.Set(d.Field(i))
		}
	}
	if maxUnset {
		// The cap of the doubling delay is never below its start.
		c.AuthFailureDelayMax = max(c.AuthFailureDelayMax, c.AuthFailureDelay)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports the first problem with c, wrapping ErrBadConfig. The
// message says what to change.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadConfig}, args...)...)
	}
	if err := ValidateNodeID(c.NodeID); err != nil {
		return bad("node id: %v", err)
	}
	if c.DataDir == "" {
		return bad("a data dir is required")
	}
	if v := c.ProtocolVersion; v != 0 && (v < wire.MinProtocolVersion || v > wire.NewestProtocolVersion) {
		return bad("protocol version %d not in %d..%d", v, wire.MinProtocolVersion, wire.NewestProtocolVersion)
	}
	if err := c.LogStore.check(); err != nil {
		return bad("%v", err)
	}
	if c.ClientListener == nil && c.ClientAddr == "" {
		return bad("a client address is required")
	}
	if c.PeerListener == nil && c.PeerAddr == "" {
		return bad("a peer address is required")
	}
	if len(c.Peers) > 0 {
		if err := ValidateVoters(c.Peers); err != nil {
			return fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
	}
	if len(c.ClientSecret) < 16 {
		return bad("the client secret must be at least 16 bytes (got %d)", len(c.ClientSecret))
	}
	if len(c.PeerSecret) < 16 {
		return bad("the peer secret must be at least 16 bytes (got %d)", len(c.PeerSecret))
	}
	if c.AdminAddr != "" || c.AdminListener != nil {
		if len(c.AdminSecret) < 16 {
			return bad("the admin port needs an admin secret of at least 16 bytes")
		}
		if bytes.Equal(c.AdminSecret, c.ClientSecret) || bytes.Equal(c.AdminSecret, c.PeerSecret) {
			return bad("the admin secret must differ from the client and peer secrets")
		}
	}
	if bytes.Equal(c.ClientSecret, c.PeerSecret) {
		return bad("the client and peer secrets are the same: every sidecar host would hold the key to the Raft " +
			"log; generate two secrets")
	}
	if c.LeaderLeaseTimeout > c.HeartbeatTimeout {
		return bad("leader lease timeout %v exceeds heartbeat timeout %v", c.LeaderLeaseTimeout, c.HeartbeatTimeout)
	}
	if c.ElectionTimeout < c.HeartbeatTimeout {
		return bad("election timeout %v is below heartbeat timeout %v", c.ElectionTimeout, c.HeartbeatTimeout)
	}
	if c.HeartbeatTimeout < 5*time.Millisecond || c.ElectionTimeout < 5*time.Millisecond {
		return bad("heartbeat and election timeouts must be at least 5ms")
	}
	if c.LogVerifyInterval < 10*time.Millisecond {
		return bad("log verify interval %v is below 10ms", c.LogVerifyInterval)
	}
	if c.PositionInterval < 10*time.Millisecond || c.PositionInterval > time.Minute {
		return bad("position interval %v not in 10ms..1m", c.PositionInterval)
	}
	if c.MaxAppendEntries < 1 || c.MaxAppendEntries > 1024 {
		return bad("max append entries must be 1..1024")
	}
	if c.MaxInFlightPerConn < 1 || c.MaxClientConns < 1 || c.MaxReplyBacklog < 1 || c.MaxKeys < 1 ||
		c.MaxWaitersPerKey < 1 || c.MaxWaitersPerConn < 1 || c.MaxHandshakesPerIP < 1 || c.MaxSessions < 1 ||
		c.MaxSessionOutcomes < 1 {
		return bad("connection and table limits must be positive")
	}
	if c.IdleTimeout < time.Second {
		return bad("idle timeout %v is below 1s", c.IdleTimeout)
	}
	if c.AuthFailureDelay < 0 || c.AuthFailureDelayMax < c.AuthFailureDelay {
		return bad("auth failure delays %v..%v", c.AuthFailureDelay, c.AuthFailureDelayMax)
	}
	if c.NextClientSecret != nil && len(c.NextClientSecret) < 16 || c.NextPeerSecret != nil && len(c.NextPeerSecret) < 16 {
		return bad("a next secret must be at least 16 bytes")
	}
	if c.ClientTLS != nil && c.ClientTLS.MinVersion < tls.VersionTLS13 {
		return bad("the client port's TLS config must require TLS 1.3 (use tlsconf.ServerConfig)")
	}
	if c.PeerTLS != nil && (c.PeerTLS.MinVersion < tls.VersionTLS13 || c.PeerTLS.ClientAuth != tls.RequireAndVerifyClientCert) {
		return bad("the peer port's TLS config must require TLS 1.3 and client certificates (use tlsconf.PeerConfig)")
	}
	return nil
}

// ValidateVoters checks an initial voter set: 3 or 5 members with distinct,
// valid ids and distinct addresses.
func ValidateVoters(peers []Peer) error {
	if n := len(peers); n != 3 && n != 5 {
		return fmt.Errorf("%w; %d given. An even count tolerates no more failures than the odd count below it "+
			"and risks split votes; 1 has no failure tolerance; more than 5 slows every commit", ErrVoterCount, n)
	}
	ids := map[string]bool{}
	addrs := map[string]bool{}
	for _, p := range peers {
		if err := ValidateNodeID(p.ID); err != nil {
			return fmt.Errorf("voter %q: %w", p.ID, err)
		}
		if _, _, err := net.SplitHostPort(p.Addr); err != nil {
			return fmt.Errorf("voter %q: peer address %q: %w", p.ID, p.Addr, err)
		}
		if ids[p.ID] {
			return fmt.Errorf("voter id %q listed twice", p.ID)
		}
		if addrs[p.Addr] {
			return fmt.Errorf("peer address %q listed twice", p.Addr)
		}
		ids[p.ID], addrs[p.Addr] = true, true
	}
	return nil
}

// ValidateNodeID checks a node id: 1..64 characters of [A-Za-z0-9._-].
func ValidateNodeID(id string) error {
	if id == "" || len(id) > 64 {
		return errors.New("must be 1..64 characters")
	}
	for _, r := range id {
		ok := r == '.' || r == '_' || r == '-' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !ok {
			return fmt.Errorf("character %q not allowed (use A-Z a-z 0-9 . _ -)", r)
		}
	}
	return nil
}

// ParsePeers parses "ID=HOST:PORT,ID=HOST:PORT,..." (the --peers flag).
func ParsePeers(s string) ([]Peer, error) {
	var out []Peer
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, addr, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("%w: peer %q: want ID=HOST:PORT", ErrBadConfig, part)
		}
		out = append(out, Peer{ID: strings.TrimSpace(id), Addr: strings.TrimSpace(addr)})
	}
	return out, nil
}
