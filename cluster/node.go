// Package cluster is a Ticketing cluster node: hashicorp/raft with
// hashicorp/raft-wal (or raft-boltdb/v2, Config.LogStore) and a file
// snapshot store around the locksm state machine,
// the authenticated peer transport, and the client port that serves the
// protocol of cluster/wire/PROTOCOL.md. Only the leader serves lock requests; it
// stamps time into commands, runs the lease and wait timers, and replies to
// clients only after their command has committed. Those rules live in the
// pure leader core of cluster/leader; Node feeds it and performs what it
// asks for (sockets, Raft, timers, metrics).
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"ticketing/cluster/leader"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Node is one running cluster member. Create it with New; stop it with
// Close. See LOCKS.md in this directory for the lock-ordering rules.
type Node struct {
	cfg Config
	log *slog.Logger
	// serverID is NAME/INCARNATION, the Raft server id (see identity.go).
	serverID string

	raft      *raft.Raft
	fsm       *fsm
	transport *raft.NetworkTransport
	peers     *peerLayer
	store     LogStore
	storeKind LogStoreKind // the kind store is (Config.LogStore, auto resolved)
	snaps     raft.SnapshotStore
	clientLn  net.Listener
	adminLn   net.Listener // nil: no admin port
	advertise string       // client address handed out in M replies

	// Proposals wait in unbounded queues so that the FSM goroutine, which
	// proposes compensations, never blocks on Raft (which may be waiting for
	// the FSM). Admission is bounded per connection instead. propQ holds
	// clients' requests (acquires and releases someone waits for), houseQ
	// the leader's own housekeeping (cancelled waits, expiries,
	// compensating releases); see nextBatchLocked for how a batch is
	// filled from the two.
	propMu sync.Mutex
	propQ  []locksm.Command
	houseQ []locksm.Command
	// propUrgent counts the commands in propQ that someone waits on now
	// (all but acquires that will join a queue, see deferrable), while
	// propQ has not been emptied; propSince is when propQ last went from
	// empty to not. A queue of deferrable commands only lingers (see
	// proposeLoop).
	propUrgent int
	propSince  time.Time
	// propEpoch is the core's leadership epoch (leader.Ready.Epoch) whose
	// commands the queues hold; 0 once leadership is lost. A batch carries
	// it to its future, so a failure is reported to the core with the
	// epoch that proposed it, and a batch taken in an epoch that ended
	// before it reached Raft is dropped, not appended in a later term.
	propEpoch uint64
	propWake  chan struct{}
	futures   chan batchFuture
	// addrWake asks the member-address check to run now (memberaddrs.go).
	addrWake chan struct{}
	// versions maps a server id to the protocol version it last answered
	// a discovery handshake from this node at (uint16): a named hand-over
	// target that does not answer right now is handed the leadership only
	// if it is known to speak the cluster version (handover.go).
	versions sync.Map
	// slots bounds the batches proposed but not yet applied. While they
	// are in flight, new commands queue up and go out together in the next
	// batch (group commit): one entry, one fsync, one replication round for
	// many clients.
	slots  chan struct{}
	timers *timerQueue

	// mu guards the leader core and everything below. The core's inputs
	// are fed and its outputs performed under it (performLocked), so it is
	// held while taking clientConn.mu (replies), fsm.mu (the core reads
	// the lock table), timerQueue.mu and Node.propMu; see LOCKS.md.
	mu sync.Mutex
	// core is the leader's request handling (cluster/leader): who is owed
	// which reply, admission, dead-connection compensation, the lease and
	// wait timers, leadership and the core's part of a hand-over.
	core *leader.Core[*clientConn]
	// refusalLog bounds the "session request refused" lines (every
	// refusal is counted in ticketing_node_session_refusals_total).
	refusalLog logLimiter
	conns      map[*clientConn]struct{} // every accepted client connection
	closed     bool

	stats   nodeStats
	metrics *nodeMetrics
	// commits are the latest batches' commit latencies (the console's).
	commits    commitWindow
	clientGate *gate
	// memberMu serializes membership changes (a leaf: held across Raft
	// configuration calls, never while taking another lock).
	memberMu sync.Mutex
	// raftStarted is n.raft once started, for goroutines that may run
	// before (the peer layer answering discovery).
	raftStarted atomic.Pointer[raft.Raft]
	// hasState: this node has Raft state (bootstrapped, or received a
	// log or snapshot); told to discovering peers.
	hasState atomic.Bool

	closing chan struct{}
	wg      sync.WaitGroup
}

type batchFuture struct {
	f     raft.ApplyFuture
	cmds  []locksm.Command
	epoch uint64    // the core's leadership epoch that proposed cmds
	at    time.Time // when it was proposed
}

// New starts a node: opens (or bootstraps) its data dir, starts Raft and
// the listeners. It returns once both ports listen; leadership comes later.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	n := &Node{
		cfg:      cfg,
		log:      cfg.Logger.With("node", cfg.NodeID),
		propWake: make(chan struct{}, 1),
		addrWake: make(chan struct{}, 1),
		slots:    make(chan struct{}, batchesInFlight),
		futures:  make(chan batchFuture, 1024),
		conns:    map[*clientConn]struct{}{},
		// 5 lines a second: enough to see who, never a flood.
		refusalLog: logLimiter{burst: 5, every: time.Second},
		closing:    make(chan struct{}),

		clientGate: newGate(cfg.MaxHandshakesPerIP, cfg.AuthFailureDelay, cfg.AuthFailureDelayMax),
	}
	n.metrics = newNodeMetrics(n)
	if err := n.start(); err != nil {
		n.cleanup()
		return nil, err
	}
	return n, nil
}

func (n *Node) start() error {
	cfg := n.cfg
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("cluster: data dir: %w", err)
	}
	hlog := newHCLogger(n.log)
	store, kind, err := openLogStore(cfg.DataDir, cfg.LogStore, n.log)
	if err != nil {
		if errors.Is(err, ErrLogStoreMismatch) || errors.Is(err, ErrLogStoreMissing) || errors.Is(err, ErrBadConfig) {
			return err
		}
		return fmt.Errorf("cluster: open the %s log store in %s (is another node using this data dir?): %w",
			kind, cfg.DataDir, err)
	}
	if !cfg.DisableLogVerify {
		store = newVerifiedStore(store, n.logVerified, cfg.storeWrap.under)
	}
	n.store, n.storeKind = store, kind
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.DataDir, "snapshots"), 2, hlog)
	if err != nil {
		return fmt.Errorf("cluster: snapshot store: %w", err)
	}
	n.snaps = snaps

	has, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		return fmt.Errorf("cluster: read state: %w", err)
	}
	if n.serverID, _, err = loadIdentity(cfg.DataDir, cfg.NodeID, has); err != nil {
		return err
	}
	n.log = n.log.With("server", n.serverID)
	n.hasState.Store(has)

	n.fsm = newFSM(n, n.log) // before the peer layer, which reads the domain
	n.fsm.metrics = n.metrics
	// The client port and its advertised address come before the peer
	// layer: a discovering peer may ask for the address at once.
	n.clientLn = cfg.ClientListener
	if n.clientLn == nil {
		if n.clientLn, err = net.Listen("tcp", cfg.ClientAddr); err != nil {
			return fmt.Errorf("cluster: client port: %w", err)
		}
	}
	n.advertise = cfg.AdvertiseClientAddr
	if n.advertise == "" {
		n.advertise = n.clientLn.Addr().String()
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	n.core = leader.New[*clientConn](leader.Config{
		ServerID: n.serverID, Advertise: n.advertise,
		MaxInFlightPerConn: cfg.MaxInFlightPerConn, MaxKeys: cfg.MaxKeys, MaxWaitersPerKey: cfg.MaxWaitersPerKey,
		MaxWaitersPerConn: cfg.MaxWaitersPerConn, MaxSessions: cfg.MaxSessions, MaxSessionOutcomes: cfg.MaxSessionOutcomes,
		// Refs only need to be unique among one leader's in-flight
		// requests; a random start keeps them apart from refs of earlier
		// leaders too.
		FirstRef:         binary.BigEndian.Uint64(seed[:]) >> 1,
		PositionInterval: cfg.PositionInterval,
	}, n.fsm, nodeDirectory{n})
	peerLn := cfg.PeerListener
	if peerLn == nil {
		if peerLn, err = net.Listen("tcp", cfg.PeerAddr); err != nil {
			return fmt.Errorf("cluster: peer port: %w", err)
		}
	}
	n.peers = newPeerLayer(peerLn, cfg, n.serverID, n.log, &n.stats.peerAuthFailures, n.identity, n.fsm.getDomain)
	n.transport = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  n.peers,
		MaxPool: 3,
		// One AppendEntries in flight per follower: no pipelined
		// replication. hashicorp/raft's pipeline can wedge (a follower's
		// failed append ends its decoder while a send waits to hand over
		// the next: that follower is never replicated to again, and
		// Shutdown waits forever; a CI run of the sidecar tests hung in
		// netPipeline.AppendEntries). Each append still carries every
		// entry the follower lacks (up to MaxAppendEntries), so group
		// commit keeps its batches (see maxRPCsInFlight for the cost).
		MaxRPCsInFlight: maxRPCsInFlight,
		Timeout:         cfg.PeerTimeout,
		Logger:          hlog,
	})

	n.adminLn = cfg.AdminListener
	if n.adminLn == nil && cfg.AdminAddr != "" {
		if n.adminLn, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
			return fmt.Errorf("cluster: admin port: %w", err)
		}
	}

	rc := RaftConfig(cfg, n.serverID)
	rc.Logger = hlog

	if !has {
		n.log.Warn("empty data dir: this server waits until a configuration names it (ticketing bootstrap " +
			"on a new cluster, or ticketing members add-learner on an existing one)")
	}
	// Replication reads back what the leader just appended; from the cache
	// rather than from bolt (a read transaction and a msgpack decode per
	// entry and follower: 8.5 % of the leader's CPU at 256 clients).
	var raftLog raft.LogStore = store
	if cfg.storeWrap.over != nil {
		raftLog = cfg.storeWrap.over(raftLog)
	}
	logs, err := raft.NewLogCache(logCacheEntries, raftLog)
	if err != nil {
		return fmt.Errorf("cluster: log cache: %w", err)
	}
	// Before Raft starts: its FSM goroutine applies committed entries at
	// once (a restart replays them), and each apply runs performLocked,
	// which reads n.timers (the race detector caught the assignment after
	// NewRaft racing a restarted node's first applies).
	n.timers = newTimerQueue(n.timerDue)
	r, err := raft.NewRaft(rc, n.fsm, logs, store, snaps, n.transport)
	if err != nil {
		return fmt.Errorf("cluster: start raft: %w", err)
	}
	n.raft = r
	n.raftStarted.Store(r)

	if cfg.ClientTLS == nil {
		n.log.Warn("PLAINTEXT CLIENT PORT: lock traffic (keys, owners, tokens) travels unencrypted and unauthenticated "+
			"beyond the handshake; use TLS (--tls-cert, --tls-key, --tls-ca) anywhere but loopback", "client", n.advertise)
	}
	if cfg.PeerTLS == nil {
		n.log.Warn("PLAINTEXT PEER PORT: Raft traffic travels unencrypted; use TLS anywhere but loopback",
			"peer", string(n.peers.advertise))
	}
	n.wg.Add(6)
	go n.memberAddrLoop()
	go n.watchLeadership()
	go n.watchLeaderChanges()
	go n.proposeLoop()
	go n.futureLoop()
	go n.acceptClients()
	if !cfg.DisableLogVerify {
		n.wg.Add(1)
		go n.checkpointLoop()
	}
	if n.adminLn != nil {
		n.wg.Add(1)
		go n.acceptAdmin()
	}
	n.log.Info("node started", "client", n.advertise, "peer", string(n.peers.advertise), "cluster", cfg.ClusterID,
		"log_store", string(n.storeKind))
	return nil
}

// AdminAddr is the admin port's address ("" without one).
func (n *Node) AdminAddr() string {
	if n.adminLn == nil {
		return ""
	}
	return n.adminLn.Addr().String()
}

// acceptAdmin serves the admin port, one connection at a time per
// goroutine; admin tools are few.
func (n *Node) acceptAdmin() {
	defer n.wg.Done()
	for {
		c, err := n.adminLn.Accept()
		if err != nil {
			select {
			case <-n.closing:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		n.wg.Add(1)
		go n.serveAdmin(c)
	}
}

// ClientAddr is the address clients reach this node at.
func (n *Node) ClientAddr() string { return n.advertise }

// ID is the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

// Domain is the cluster's fencing domain ("" until the first leader has
// committed it): tokens are comparable only within one domain.
func (n *Node) Domain() string { return n.fsm.getDomain() }

// ClusterVersion is the protocol version every member is known to speak,
// as this node's applied log records it (0 before the first 'V' entry).
func (n *Node) ClusterVersion() uint16 { return n.fsm.getClusterVersion() }

// newDomainID is a new fencing domain id: 16 random bytes, hex.
func newDomainID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// raftIfStarted returns the Raft instance, or nil before it started.
func (n *Node) raftIfStarted() *raft.Raft { return n.raftStarted.Load() }

// ServerID is the node's Raft server id, NAME/INCARNATION.
func (n *Node) ServerID() string { return n.serverID }

// Raft exposes the underlying Raft instance (tests and status).
func (n *Node) Raft() *raft.Raft { return n.raft }

// Serving reports whether this node is the leader and ready for requests.
func (n *Node) Serving() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.core.Serving()
}

// LastToken is the highest token this node's state machine has applied.
func (n *Node) LastToken() uint64 {
	var t uint64
	n.fsm.read(func(st *locksm.State) { t = st.LastToken() })
	return t
}

// ReadState runs fn with this node's applied lock table (read only).
func (n *Node) ReadState(fn func(st *locksm.State)) { n.fsm.read(fn) }

// Shutdown stops the node gracefully: a leader first hands its leadership
// over quietly (HandOver: its clients are told, in-flight requests are
// answered, queued waiters withdrawn, then a hashicorp/raft transfer to the
// most up-to-date voter), so clients wait for one round of messages rather
// than an election timeout, then the node closes. The hand-over is bounded
// by ctx; if it fails or ctx ends, the node closes anyway (the others then
// elect a leader as after a crash). handedTo is the server id of the
// leader heard from after the hand-over ("" if none: nothing was handed
// over, which the log says with the reason).
func (n *Node) Shutdown(ctx context.Context) (handedTo string, err error) {
	if n.raft != nil && n.raft.State() == raft.Leader && n.otherVoters() > 0 {
		start := time.Now()
		// HandOver returns once the new leader was heard from, so that
		// closing does not race its first heartbeat.
		to, err := n.HandOver(ctx, "")
		if err != nil {
			// No follower answered at the cluster version (ErrNoTarget),
			// the transfer failed, or the followers went away meanwhile
			// (stopped together with this node, so that nobody took
			// over): nothing was handed over, and the log must not say
			// it was.
			n.log.Warn("leadership not handed over before shutdown", "err", err)
			return "", n.Close()
		}
		handedTo = to
		n.log.Info("leadership handed over before shutdown", "to", handedTo, "took", time.Since(start).Round(time.Millisecond))
	}
	return handedTo, n.Close()
}

// otherVoters counts the voters other than this node.
func (n *Node) otherVoters() int {
	ms, err := n.Members()
	if err != nil {
		return 0
	}
	c := 0
	for _, m := range ms {
		if m.Voter && m.ServerID != n.serverID {
			c++
		}
	}
	return c
}

// Close stops the node: the client port first (pending requests get U),
// then Raft, the transport and the store. It does not hand leadership over.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.core.Close()
	n.mu.Unlock()
	close(n.closing)
	n.clientLn.Close()
	if n.adminLn != nil {
		n.adminLn.Close()
	}
	n.mu.Lock()
	conns := make([]*clientConn, 0, len(n.conns))
	for c := range n.conns {
		conns = append(conns, c)
	}
	n.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	var err error
	if n.raft != nil {
		err = n.raft.Shutdown().Error()
	}
	n.loseLeadership("node shutting down")
	n.wg.Wait()
	n.cleanup()
	return err
}

func (n *Node) cleanup() {
	if n.timers != nil {
		n.timers.close()
	}
	if n.transport != nil {
		n.transport.Close()
	}
	if n.peers != nil {
		n.peers.Close()
		n.peers.wait()
	}
	if n.clientLn != nil {
		n.clientLn.Close()
	}
	if n.adminLn != nil {
		n.adminLn.Close()
	}
	if n.store != nil {
		if err := n.store.Close(); err != nil {
			n.log.Warn("closing the log store", "err", err)
		}
	}
}

// ---- leadership ----

func (n *Node) watchLeadership() {
	defer n.wg.Done()
	ch := n.raft.LeaderCh()
	for {
		select {
		case <-ch:
		case <-n.closing:
			return
		}
		// LeaderCh may coalesce signals; act on the current state.
		isLeader := n.raft.State() == raft.Leader
		n.mu.Lock()
		was, _ := n.core.Leading()
		n.mu.Unlock()
		switch {
		case isLeader && !was:
			n.gainLeadership()
		case !isLeader && was:
			n.loseLeadership("leadership lost")
		case isLeader && was:
			// Lost and regained between two looks: start over.
			n.loseLeadership("leadership lost")
			n.gainLeadership()
		}
	}
}

// gainLeadership makes this node serve once it is safe: every earlier entry
// applied (Barrier), its client address announced, and every queued waiter
// dropped (their connections died with the old leader, and nobody could
// learn the token of a key handed to one of them). Then the core serves
// (leader.Core.Serve: a full lease re-armed for every holder).
func (n *Node) gainLeadership() {
	n.mu.Lock()
	// The term Raft won: an entry of a newer one applied while the core
	// still leads means Raft's news of the loss is on its way (the core
	// loses leadership first: leader.Core.GainLeadership).
	epoch := n.core.GainLeadership(n.raft.CurrentTerm())
	n.mu.Unlock()
	n.log.Info("became leader; preparing to serve")
	start := time.Now()
	go func() {
		timeout := 10 * n.cfg.HeartbeatTimeout
		if err := n.raft.Barrier(timeout).Error(); err != nil {
			n.log.Warn("barrier after election failed", "err", err)
			return
		}
		// Every entry of earlier terms is applied: from here on a grant
		// this leader does not tell was told by nobody (and one applied
		// before may have been told by the old leader).
		n.mu.Lock()
		current := n.core.BarrierApplied(epoch)
		n.mu.Unlock()
		if !current {
			// This leadership ended while the barrier ran (a later one
			// prepares on its own): its announcement and drop of waiters,
			// appended in a term this node won back, would drop the
			// session-less waiters that leadership had admitted.
			return
		}
		if n.fsm.getDomain() == "" {
			// A cluster without a fencing domain (bootstrapped before
			// domains, its snapshot's domain ""): its first leader creates
			// one, as bootstrap does, so clients can fence (and connect:
			// a node answers a client once it knows its domain). Only the
			// first 'D' of a log counts, so two leaders racing here agree.
			domain, floor := newDomainID(), uint64(n.cfg.Now().UnixMicro())
			if err := n.raft.Apply(encodeDomain(domain, floor), timeout).Error(); err != nil {
				n.log.Warn("creating the cluster's fencing domain failed", "err", err)
				return
			}
			n.log.Warn("this cluster had no fencing domain: created one", "domain", n.fsm.getDomain())
		}
		f1 := n.raft.Apply(encodeAnnounce(n.serverID, n.advertise), timeout)
		// Once every member knows sessions, only the waiters of
		// session-less connections died with the old leader: a session's
		// stay in line, and its broker resumes them here.
		dropOp := locksm.OpDropWaiters
		if n.fsm.getClusterVersion() >= wire.VersionSessions {
			dropOp = locksm.OpDropSessionless
		}
		drop := locksm.AppendBatch([]byte{entryLockBatch}, []locksm.Command{{Op: dropOp, Now: n.cfg.Now().UnixMilli()}})
		f2 := n.raft.Apply(drop, timeout)
		if err := f1.Error(); err != nil {
			n.log.Warn("leader announcement failed", "err", err)
			return
		}
		if err := f2.Error(); err != nil {
			n.log.Warn("dropping orphaned waiters failed", "err", err)
			return
		}
		n.mu.Lock()
		// The wall clock the proposer stamps commands with re-arms the
		// waits of the sessions' queued requests (EnqueuedAt + WaitMs).
		holders, ok := n.core.Serve(time.Now(), n.cfg.Now().UnixMilli(), epoch)
		n.performLocked()
		n.mu.Unlock()
		if !ok {
			return
		}
		select { // record the members' client addresses (memberaddrs.go)
		case n.addrWake <- struct{}{}:
		default:
		}
		n.log.Info("leader serving", "ready_after", time.Since(start).Round(time.Millisecond), "holders", holders)
	}()
}

// loseLeadership stops serving and answers every owed reply with U: each of
// those commands may or may not commit under the next leader.
func (n *Node) loseLeadership(why string) {
	n.mu.Lock()
	wasLeading, owed := n.core.LoseLeadership(why)
	n.dropQueuedProposals()
	n.performLocked()
	n.mu.Unlock()
	if wasLeading {
		n.log.Warn("stopped serving", "why", why, "owed_unknown", owed)
	}
}

// nodeDirectory tells the core who leads: what Raft knows, and the client
// addresses the log recorded.
type nodeDirectory struct{ n *Node }

func (d nodeDirectory) Leader() string {
	r := d.n.raftIfStarted()
	if r == nil {
		return ""
	}
	_, id := r.LeaderWithID()
	return string(id)
}

func (d nodeDirectory) ClientAddr(id string) string { return d.n.fsm.clientAddr(id) }

// performLocked carries out what the core's last inputs produced: metrics
// are recorded, replies and notices are appended to their connections'
// buffers (in the core's order), commands join the proposal queue, timers
// are armed. Nothing blocks. Requires n.mu.
func (n *Node) performLocked() {
	rd := n.core.Ready()
	// Metrics first: whoever reads a reply and then the metrics sees the
	// reply counted (a CI run read a follower's M before its count).
	for _, e := range rd.Events {
		n.record(e)
	}
	for i := range rd.Sends {
		rd.Sends[i].To.send(&rd.Sends[i].Msg)
	}
	for _, r := range rd.Refusals {
		if ok, suppressed := n.refusalLog.allow(time.Now()); ok {
			n.log.Warn("session request refused", "remote", r.Conn.remote, "session", r.Session, "err", r.Err,
				"not_logged_before", suppressed)
		}
	}
	for _, sl := range rd.Silences {
		// A session connection silent for the session's timeout is
		// taken for dead (its broker pings at a third of it).
		if sl.Conn != nil {
			sl.Conn.bound(sl.Max)
		}
	}
	for _, c := range rd.Closes {
		// Its broker resumes its session where a leader serves.
		c.flushAndClose()
	}
	if len(rd.Proposals) > 0 {
		n.propose(rd.Epoch, rd.Proposals...)
	}
	if n.timers != nil {
		if rd.ClearTimers {
			n.timers.clear()
		}
		for _, t := range rd.Timers {
			n.timers.add(t)
		}
	}
	n.core.Advance()
}

// ---- proposing ----

// propose queues commands the core's leadership epoch proposed for the
// next batch. Never blocks. Requires n.mu (it reads the lock table,
// fsm.mu, after it).
func (n *Node) propose(epoch uint64, cs ...locksm.Command) {
	urgent := 0
	for _, c := range cs {
		if !leader.Housekeeping(c) && !n.deferrable(c) {
			urgent++
		}
	}
	n.propMu.Lock()
	if epoch != n.propEpoch {
		// Leadership changed since the queues were last filled; the
		// loss emptied them (dropQueuedProposals).
		n.propEpoch = epoch
	}
	for _, c := range cs {
		if leader.Housekeeping(c) {
			n.houseQ = append(n.houseQ, c)
			continue
		}
		if len(n.propQ) == 0 {
			n.propSince = time.Now()
		}
		n.propQ = append(n.propQ, c)
	}
	n.propUrgent += urgent
	n.propMu.Unlock()
	select {
	case n.propWake <- struct{}{}:
	default:
	}
}

// dropQueuedProposals forgets every command still queued when leadership
// is lost: each was decided by the leadership that ended (whose core
// answered its requests U, or left a session's to the state). Proposed
// later, after this node won leadership back, a stale one could land after
// entries of the terms between: an expiry decided before a holder's extend
// that another leader applied and told OK would end the lease the holder
// was just told it has (issue 39, finding 7). Requires n.mu.
func (n *Node) dropQueuedProposals() {
	n.propMu.Lock()
	clear(n.propQ)
	clear(n.houseQ)
	n.propQ, n.houseQ = n.propQ[:0], n.houseQ[:0]
	n.propUrgent = 0
	n.propEpoch = 0
	n.propMu.Unlock()
}

// deferrable reports whether c is an acquire that will join its key's
// queue (it may wait, and the key is held now): its only answer before its
// turn is the Q frame, so nothing is lost if it waits for the next
// command someone does wait on. Requires n.mu.
func (n *Node) deferrable(c locksm.Command) bool {
	if c.Op != locksm.OpAcquire || c.WaitMs == 0 {
		return false
	}
	held, _, _ := n.fsm.Occupancy(c.Key)
	return held
}

// proposeLoop proposes one batch per free slot (group commit: one entry,
// one fsync, one replication round for many clients), filled by
// nextBatchLocked, until the node closes. A queue holding only
// deferrable acquires lingers up to Config.ProposeLinger first.
func (n *Node) proposeLoop() {
	defer n.wg.Done()
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for {
		n.propMu.Lock()
		idle := len(n.propQ) == 0 && len(n.houseQ) == 0
		var wait time.Duration
		if !idle && len(n.houseQ) == 0 && n.propUrgent == 0 && len(n.propQ) < locksm.MaxBatch {
			wait = n.cfg.ProposeLinger - time.Since(n.propSince)
		}
		n.propMu.Unlock()
		if idle {
			select {
			case <-n.propWake:
			case <-n.closing:
				return
			}
			continue
		}
		if wait > 0 {
			linger.Reset(wait)
			select {
			case <-n.propWake:
			case <-linger.C:
			case <-n.closing:
				return
			}
			linger.Stop()
			continue
		}
		select {
		case n.slots <- struct{}{}:
		case <-n.closing:
			return
		}
		n.propMu.Lock()
		batch, epoch := n.nextBatchLocked(), n.propEpoch
		n.propMu.Unlock()
		now := n.cfg.Now().UnixMilli()
		for i := range batch {
			batch[i].Now = now
		}
		entry := locksm.AppendBatch([]byte{entryLockBatch}, batch)
		n.propMu.Lock()
		stale := n.propEpoch != epoch
		n.propMu.Unlock()
		if stale {
			// The leadership that decided it ended while it was being
			// taken: its core answered what it owed, and appended in a
			// term this node won back it could land after entries of
			// the terms between (see dropQueuedProposals).
			<-n.slots
			continue
		}
		at := time.Now()
		f := n.raft.Apply(entry, 0)
		select {
		case n.futures <- batchFuture{f: f, cmds: batch, epoch: epoch, at: at}:
		case <-n.closing:
			return
		}
	}
}

// housekeepingShare is the part of a full batch kept for housekeeping
// while both queues are longer than a batch. A burst of housekeeping (the
// 60,000 waits of a waiting room whose connections all closed at once)
// then takes a few batches' tail ends, instead of every request that comes
// after it waiting behind all of it (the isolation test saw a wait-0
// acquire go Indeterminate past the broker's 5 s reply grace); and a flood
// of requests cannot hold back expiries and cancels either.
const housekeepingShare = locksm.MaxBatch / 4

// nextBatchLocked takes the next batch off the queues: housekeeping first
// (it concerns only what is applied already, so it may go ahead of
// requests, and a cancelled wait then leaves the queue before a release
// could hand the key to it), then requests in arrival order, each queue
// yielding to the other what the other cannot fill. Requires propMu.
func (n *Node) nextBatchLocked() []locksm.Command {
	house := min(len(n.houseQ), max(housekeepingShare, locksm.MaxBatch-len(n.propQ)))
	reqs := min(len(n.propQ), locksm.MaxBatch-house)
	batch := make([]locksm.Command, 0, house+reqs)
	batch = append(batch, n.houseQ[:house]...)
	batch = append(batch, n.propQ[:reqs]...)
	n.houseQ = dropFront(n.houseQ, house)
	n.propQ = dropFront(n.propQ, reqs)
	if len(n.propQ) == 0 {
		n.propUrgent = 0
	}
	return batch
}

// dropFront removes q's first k commands, keeping no strings alive.
func dropFront(q []locksm.Command, k int) []locksm.Command {
	clear(q[:k])
	if k == len(q) {
		return q[:0]
	}
	return q[k:]
}

// futureLoop answers the requests of batches Raft could not commit. Futures
// complete in log order, so one goroutine suffices. The blocking wait on
// each future runs on futureWaiter, which Close does not wait for: with
// BatchApplyCh a future still in Raft's apply buffer when Raft shuts down
// is never answered (hashicorp/raft, Config.BatchApplyCh), and a Close
// waiting for it would hang.
func (n *Node) futureLoop() {
	defer n.wg.Done()
	failed := make(chan failedBatch, 64)
	go n.futureWaiter(failed)
	for {
		select {
		case fb := <-failed:
			n.proposalFailed(fb.epoch, fb.cmds, fb.err)
		case <-n.closing:
			return
		}
	}
}

type failedBatch struct {
	cmds  []locksm.Command
	err   error
	epoch uint64 // the core's leadership epoch that proposed cmds
}

// futureWaiter waits for each batch's future in log order, frees its slot
// and hands failures to futureLoop. It holds no lock while it waits, so
// one left waiting on a future Raft never answers harms nothing.
func (n *Node) futureWaiter(failed chan<- failedBatch) {
	for {
		var bf batchFuture
		select {
		case bf = <-n.futures:
		case <-n.closing:
			return
		}
		err := bf.f.Error()
		<-n.slots
		if err == nil {
			if !bf.at.IsZero() {
				done := time.Now()
				n.commits.add(done, done.Sub(bf.at))
				n.metrics.commitLatency.Observe(done.Sub(bf.at).Seconds())
			}
			continue
		}
		select {
		case failed <- failedBatch{bf.cmds, err, bf.epoch}:
		case <-n.closing:
			return
		}
	}
}

// await returns f's error, or ErrClosing if the node closes first (a
// future still in Raft's apply buffer at shutdown is never answered; see
// futureLoop). Goroutines that Close waits for use it for every Apply and
// Barrier future.
func (n *Node) await(f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-n.closing:
		return ErrClosing
	}
}

func (n *Node) proposalFailed(epoch uint64, cmds []locksm.Command, err error) {
	// ErrNotLeader means the entry was never appended: definitely not
	// executed, so M is honest. Anything else (leadership lost, shutdown)
	// leaves the entry possibly committed: U.
	// A proposal refused during a leadership transfer was not appended
	// either (hashicorp/raft answers it before dispatching).
	notAppended := errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress)
	n.mu.Lock()
	n.core.ProposalFailed(epoch, cmds, notAppended, err)
	n.performLocked()
	n.mu.Unlock()
}

// ---- applying ----

// applyBatch implements applySink: the batch is applied to the table and
// the core answers what its commands owe and times new grants, in one
// critical section of n.mu, so admission never reads a table ahead of the
// core. Runs on the FSM goroutine in log order, so a grant is never told
// before the command that queued it.
func (n *Node) applyBatch(apply func() []applied) {
	n.mu.Lock()
	defer n.mu.Unlock()
	batch := apply()
	if len(batch) == 0 {
		return
	}
	n.core.Applied(time.Now(), batch)
	n.performLocked()
}

func (n *Node) onAnnounce(id, addr string) {
	n.log.Debug("client address recorded", "member", id, "client_addr", addr)
}

// timerDue hands a due lease or wait timer to the core, which proposes
// what it asks for if it still applies.
func (n *Node) timerDue(t leader.Timer) {
	n.mu.Lock()
	n.core.TimerDue(t)
	n.performLocked()
	n.mu.Unlock()
}

// ---- hashicorp logging into slog ----

type hcWriter struct{ log *slog.Logger }

func (w hcWriter) Write(b []byte) (int, error) {
	line := strings.TrimSpace(string(b))
	level := slog.LevelInfo
	switch {
	case strings.Contains(line, "[ERROR]"):
		level = slog.LevelError
	case strings.Contains(line, "[WARN]"):
		level = slog.LevelWarn
	case strings.Contains(line, "[DEBUG]"), strings.Contains(line, "[TRACE]"):
		level = slog.LevelDebug
	}
	for _, tag := range []string{"[ERROR] ", "[WARN]  ", "[INFO]  ", "[DEBUG] ", "[TRACE] "} {
		if i := strings.Index(line, tag); i >= 0 {
			line = line[i+len(tag):]
			break
		}
	}
	w.log.Log(context.Background(), level, line, "component", "raft")
	return len(b), nil
}

// RaftConfig is the hashicorp/raft configuration of a node configured by
// cfg (its zero tunables take their defaults) under Raft server id
// serverID, logging to cfg.Logger. It is built here and nowhere else: the
// node, Bootstrap and the lab's library floor (cmd/ticketlab/internal/floor,
// hashicorp/raft measured alone) all use it, so the floor the lab compares
// a node with cannot drift from what a node runs.
func RaftConfig(cfg Config, serverID string) *raft.Config {
	cfg = cfg.withDefaults()
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(serverID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.MaxAppendEntries = cfg.MaxAppendEntries
	// Group commit: the leader's loop takes every Apply waiting at once.
	rc.BatchApplyCh = true
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	rc.Logger = newHCLogger(cfg.Logger)
	rc.NoLegacyTelemetry = true
	return rc
}

func newHCLogger(log *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       hclog.Info,
		Output:      hcWriter{log},
		DisableTime: true,
	})
}

// logCacheEntries is how many of the newest log entries the leader keeps in
// memory for replication (raft.LogCache). Steady-state pipelined
// replication only reads the last few; a follower further behind reads from
// the log store. An entry carries at most locksm.MaxBatch commands, so the worst
// case is 128 full batches (tens of MiB); the usual entry is a few KiB.
const logCacheEntries = 128

// maxRPCsInFlight is raft.NetworkTransportConfig.MaxRPCsInFlight: 1 turns
// pipelined replication off (see its use in New). It costs nothing
// measurable (ticketlab bench throughput, 64 clients, 3 TLS nodes,
// alternating runs: 2,507 / 2,804 / 2,343 cycles/s without the pipeline,
// 2,722 / 2,459 / 2,377 with it), since a batch already carries many
// commands and each append every entry a follower lacks.
const maxRPCsInFlight = 1

// batchesInFlight is how many batches may be proposed and not yet applied.
// Two keep the pipeline busy (one being replicated while the next fills);
// more only shrink the batches (measured: 2 → 285 µs per acquire+release
// cycle at 64 clients in process, 4 → 650 µs, unbounded → 600 µs with 1.2
// commands per entry).
const batchesInFlight = 2
