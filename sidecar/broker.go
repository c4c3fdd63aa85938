package sidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Broker is the official client. Safe for concurrent use.
//
// Lock order (cluster/LOCKS.md, "Above the cluster"): Broker.qmu (the
// acquires) is taken first; under it the broker may send with
// client.Conn.StartFunc, but never waits, never calls Conn.Abandon and
// never runs a caller's callback. Broker.mu, Broker.rmu and Broker.hmu
// (taken under qmu by answerLocked) are leaves;
// nothing blocks while they are held, and no client.Conn method that
// takes a lock is called under Broker.mu (HandingOver is an atomic read).
// A connection's notice callback (onNotice) and an acquire's hooks run on
// that connection's reader goroutine, which holds none of the
// connection's locks then, and take only Broker.mu or Broker.qmu. The
// unix API calls the Broker holding none of its own locks.
type Broker struct {
	cfg     Config
	log     *slog.Logger
	metrics *brokerMetrics

	// qmu guards the acquires: the scheduler (sessions, pending acquires,
	// waiter room), every acqOp, the in-flight counts and qclosed. It is
	// taken before Broker.mu and a client.Conn's locks (it is held while
	// sending with StartFunc); a connection's hooks take it with none of
	// the connection's locks held (cluster/LOCKS.md).
	qmu      sync.Mutex
	sc       *sched
	inflight map[*client.Conn]int // acquires holding an in-flight slot, per connection
	qclosed  bool
	kick     chan struct{} // wakes the dispatcher; capacity 1
	qstop    chan struct{} // closed when the broker stops taking acquires
	qctx     context.Context
	qcancel  context.CancelFunc

	// rmu guards the release queue (a leaf). The queue is a list, not a
	// bounded channel: a release is never refused for room. What bounds
	// it is what can be released: the locks held through this broker. A
	// bound would turn a burst of releases (a crashed client's, a
	// closing sidecar's) into locks held until their leases end, which is
	// what releasing exists to avoid (unixapi/PROTOCOL.md says so too).
	rmu     sync.Mutex
	rcond   *sync.Cond // signalled when a job is queued, the queue closes or rasync drops to 0
	rjobs   []*releaseJob
	rclosed bool
	// rasync counts releases whose first attempt is in flight without a
	// worker (startRelease): each ends settled or queued for a worker, so
	// the workers stay until it is 0 once the queue is closed.
	rasync int

	// dmu guards the first attempts' deadline list and its timer (a
	// leaf; deadlines.go); darmed says dtimer is set.
	dmu    sync.Mutex
	dlist  deadlineList
	dtimer *time.Timer
	darmed bool

	// lmu guards lost (a leaf): the holdings whose lost events someone
	// watches, by token (WatchLost).
	lmu  sync.Mutex
	lost map[uint64][]*lostWatch
	// early: losses of holdings delivered to their callers that nobody
	// watched yet (a lost event can come right behind its grant: a
	// resume replays a grant revoked while the broker was away, then its
	// lost event), told to the first WatchLoss of the token; at most
	// maxEarlyLosses, the oldest forgotten first (earlyOrder).
	early      map[uint64]earlyLoss
	earlyOrder []uint64

	// hmu guards held (a leaf, taken under qmu): the locks granted to
	// this broker's callers and not released, lost or given up, by token
	// (held.go). Close reports them lost, then releases them.
	hmu       sync.Mutex
	held      map[uint64]*heldLock
	heldSweep int // len(held) at which registering sweeps out ended holdings
	// heldTaken is set (under hmu) once Close took held to report and
	// release: from then on no holding of the broker may be counted on,
	// so a grant not delivered yet is answered ErrClosed, and a WatchLost
	// is told LostCompensated at once (issue 39, attack round 5).
	heldTaken atomic.Bool
	// sent are the acquires written and not over (under qmu), so that
	// Close can cancel them and wait for their grants, if any, to be
	// released; sentIdle, made by Close, is closed once none is left.
	sent     map[*acqOp]struct{}
	sentIdle chan struct{}

	mu sync.Mutex
	// slots are the addresses kept: one per seed (two for a single seed),
	// then one per member's client address learned from the leader.
	slots  []*slot
	domain string // the pinned fencing domain ("" until a node names one)
	leader string // client address of the known serving leader
	// awaiting is the client address a hand-over notice named as the next
	// leader, until a node says it serves: meanwhile an M naming a leader
	// is not taken as one (the target does not serve yet).
	awaiting string
	// members is the leader's view of the Raft configuration, refreshed on
	// every leader change and every membersRefresh; nil until first asked.
	members   []wire.Member
	membersAt time.Time
	rr        int           // round-robin position
	changed   chan struct{} // closed (and replaced) when a slot or the leader changes
	closed    bool

	// The cluster session (session.go), under mu: sess is nil until one is
	// opened; sconn is the connection it is attached to (nil while it is
	// not); sessOpens counts the sessions opened; lostSession describes
	// the last one lost, for Info, until another is opened; losing is the
	// one being lost (its Fail completing its requests), which Info
	// describes meanwhile, so that a caller told "session lost" never
	// finds no session in Info.
	sess        *client.Session
	sconn       *client.Conn
	sessOpens   uint64
	lostSession client.SessionStats
	losing      *client.Session
	// plain holds the version 7 connections whose session open the
	// leader refused not_supported (the cluster version is below 7: some
	// member still runs an older build): they carry requests without a
	// session, as version 6 ones. probeAt (under mu) is when to try a
	// fresh connection again (attachFresh).
	plain   sync.Map // *client.Conn → retiring (bool)
	probeAt time.Time
	// sessOps are the acquires sent on a session connection and not over
	// (under qmu): after a resume, the queued ones are re-pointed to the
	// new connection (resumedOps).
	sessOps map[*acqOp]struct{}

	// refusal is the last dial a node refused for this sidecar's settings
	// (refused), nil since a dial succeeded: an acquire given up as
	// unavailable names it, so that the caller learns why no leader
	// serves without reading the sidecar's log. Atomic: written by the
	// slots' keepers, read under qmu, which must not take mu.
	refusal atomic.Pointer[refusalNote]

	closing  chan struct{}
	slotWG   sync.WaitGroup
	workerWG sync.WaitGroup
}

// slot is one persistent connection to one address.
type slot struct {
	addr string
	seed bool          // a configured address: kept for the broker's lifetime
	conn *client.Conn  // guarded by Broker.mu; nil while down
	stop chan struct{} // closed (under Broker.mu) when the address is no longer kept
	// failing is set (under Broker.mu) while the last dial of the slot
	// failed and none has succeeded since: an M hint naming its address
	// is not taken as the leader (setLeader).
	failing bool
	// swapped is closed (and replaced, under Broker.mu) when conn is
	// replaced by a fresh connection that carries the cluster session
	// (attachFresh): the slot's keeper then watches the new one and
	// retires the old one.
	swapped chan struct{}
}

// A releaseJob is a release or, with extendSec set, an extend: both are
// exact (key, owner, token), so both may be resent within the deadline
// (see release), and both have the release's budget at the node.
type releaseJob struct {
	lock      Lock
	extendSec uint32 // an extend to this lease (seconds); 0: a release
	// setPermits: not a release but an operator's set-permits of
	// lock.Key to permits (SetPermits): sent the same way, and resent
	// only while no attempt may have run (setPermitsNoResend: it is not
	// exact, so a resend could answer or apply wrongly).
	setPermits bool
	permits    uint32
	start      time.Time // when it was asked for (latency metric)
	deadline   time.Time
	done       func(error) // nil for a compensation nobody waits for

	// The retry state, carried from the first attempt (sent by
	// startRelease, without a worker) to the worker that retries.
	last       error         // the last attempt's failure
	mayHaveRun bool          // an attempt was sent and got no definite reply
	pause      time.Duration // the next pause between attempts
	hopped     bool          // the last attempt followed an M at once (pauseNext)
	pending    *client.Call  // the first attempt's call, for the worker to judge

	// amu guards the first attempt's end: its reply (a Done hook) and its
	// deadline timer race for it, and the one that sets over settles it.
	amu  sync.Mutex
	over bool
	// dprev, dnext: its place in the first attempts' deadline list while
	// dlisted (Broker.dmu; deadlines.go).
	dprev, dnext *releaseJob
	dlisted      bool
}

// New starts a broker; its connections come up in the background.
func New(cfg Config) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	b := &Broker{
		domain:   cfg.Domain,
		cfg:      cfg,
		log:      cfg.Logger.With("component", "broker"),
		changed:  make(chan struct{}),
		closing:  make(chan struct{}),
		sc:       newSched(cfg.MaxWaiters, cfg.MaxWaitersPerSession),
		inflight: map[*client.Conn]int{},
		kick:     make(chan struct{}, 1),
		qstop:    make(chan struct{}),
		lost:     map[uint64][]*lostWatch{},
		early:    map[uint64]earlyLoss{},
		sessOps:  map[*acqOp]struct{}{},
		held:     map[uint64]*heldLock{},
		sent:     map[*acqOp]struct{}{},
	}
	if cfg.MaxWaiters == 0 {
		b.sc.maxWaiters = DefaultMaxWaiters // until a node tells its own
	}
	b.rcond = sync.NewCond(&b.rmu)
	b.qctx, b.qcancel = context.WithCancel(context.Background())
	b.metrics = newBrokerMetrics(b)
	// One connection per address; a single address gets two, so one socket
	// dropping does not interrupt service.
	b.mu.Lock()
	for _, a := range cfg.Addrs {
		b.addSlotLocked(a, true)
	}
	if len(cfg.Addrs) == 1 {
		b.addSlotLocked(cfg.Addrs[0], true)
	}
	b.mu.Unlock()
	for i := 0; i < cfg.ReleaseWorkers; i++ {
		b.workerWG.Add(1)
		go b.releaseWorker()
	}
	b.workerWG.Add(2)
	go b.dispatch()
	go b.keepSession()
	return b, nil
}

// notifyLocked wakes everyone waiting for a connection or leader change.
func (b *Broker) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// addSlotLocked starts keeping addr. Requires b.mu.
func (b *Broker) addSlotLocked(addr string, seed bool) {
	s := &slot{addr: addr, seed: seed, stop: make(chan struct{}), swapped: make(chan struct{})}
	b.slots = append(b.slots, s)
	b.slotWG.Add(1)
	go b.keep(s)
}

// keptLocked reports whether a slot keeps addr. Requires b.mu.
func (b *Broker) keptLocked(addr string) bool {
	for _, s := range b.slots {
		if s.addr == addr {
			return true
		}
	}
	return false
}

// learn starts keeping addr, a member's client address the cluster named,
// unless it is kept already or AllowAddr refuses it.
func (b *Broker) learn(addr string) {
	if addr == "" {
		return
	}
	b.mu.Lock()
	known := b.keptLocked(addr) || b.closed
	b.mu.Unlock()
	if known {
		return
	}
	if err := b.allowAddr(addr); err != nil {
		b.log.Warn("not dialling a member's address", "addr", addr, "err", err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.keptLocked(addr) && !b.closed {
		b.addSlotLocked(addr, false)
		b.notifyLocked()
		b.log.Info("following membership: dialling a member's address", "addr", addr)
	}
}

func (b *Broker) allowAddr(addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return err
	}
	if b.cfg.AllowAddr != nil {
		return b.cfg.AllowAddr(addr)
	}
	return nil
}

// syncMembers follows the membership the leader reported: it keeps every
// member's client address and stops keeping learned addresses that are
// neither members nor the leader (or a hand-over's target) any more.
// Seeds are always kept.
func (b *Broker) syncMembers(ms []wire.Member) {
	want := map[string]bool{}
	for _, m := range ms {
		if m.ClientAddr != "" {
			want[m.ClientAddr] = true
			b.learn(m.ClientAddr)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	kept := b.slots[:0]
	for _, s := range b.slots {
		if s.seed || want[s.addr] || s.addr == b.leader || s.addr == b.awaiting {
			kept = append(kept, s)
			continue
		}
		close(s.stop)
		b.log.Info("following membership: no longer keeping an address that is not a member", "addr", s.addr)
	}
	clear(b.slots[len(kept):])
	b.slots = kept
	b.rr = 0
}

// usefulConnAfter is how long a connection must stay up to count as
// useful for the reconnect backoff when its node sent nothing on it
// (keep). The broker asks every new connection's node for its status at
// once, so a live node answers within milliseconds and this rarely
// decides; it bounds what a node that accepts and holds a connection
// silently costs (about one dial per second plus the backoff) without
// taking a slow but live node for a dropping one. It is well below
// BackoffMax (3.2 s), the lifetime 7e1581f asked for, which the
// connections to a node restarted between back-to-back failovers did not
// reach.
const usefulConnAfter = time.Second

// keep maintains one slot's connection until the broker closes or stops
// keeping the address.
//
// The backoff doubles (from BackoffMin up to BackoffMax) after every
// failed dial and after every connection that was not useful; it starts
// again at BackoffMin after a useful one, so the first redial after a
// useful connection drops comes BackoffMin later. A connection is useful
// when its node sent anything on it (a reply, a Q, a notice or an event:
// client.Conn.Served; the status asked at once of every new connection
// is answered by any live node) or it stayed up usefulConnAfter (1 s). A
// handshake alone proves little: a node that accepts and drops at once
// (a proxy without a backend, a node refusing this client after the
// handshake, a cut link) was redialled every BackoffMin forever when any
// handshake reset the backoff (issue 39). Asking for a longer life alone
// (7e1581f: BackoffMax) kept the redial of a node restarted between
// back-to-back failovers at a high backoff, and the lab saw a failover
// round without a cycle: a restarted node answers the status at once, so
// it is useful however soon it is killed again.
func (b *Broker) keep(s *slot) {
	defer b.slotWG.Done()
	backoff := b.cfg.BackoffMin
	warned := false // a refusal was logged at warn level since the last connection
	for {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.DialTimeout)
		conn, err := b.dial(ctx, s)
		cancel()
		useful := false
		if err == nil {
			warned = false
			upAt := b.cfg.Now()
			b.refusal.Store(nil)
			b.mu.Lock()
			s.failing = false
			b.mu.Unlock()
			served := false
			if b.up(s, conn) {
				for {
					b.watch(s, conn)
					next := b.replacement(s, conn)
					if next == nil {
						break
					}
					served = served || conn.Served()
					b.slotWG.Add(1)
					go b.retire(conn)
					conn = next
				}
			}
			conn.Close()
			b.down(s, conn)
			select {
			case <-b.closing:
				return // closed by the broker: not the node's doing
			case <-s.stop:
				return
			default:
			}
			lived := b.cfg.Now().Sub(upAt)
			useful = served || conn.Served() || lived >= usefulConnAfter
			if useful {
				backoff = b.cfg.BackoffMin
			} else {
				b.metrics.unservedConns.Inc()
				b.log.Debug("connection dropped before the node answered anything; backing off as after a failed dial",
					"addr", s.addr, "lived", lived, "err", conn.Err(), "retry_in", backoff)
			}
		} else {
			b.metrics.dialFailures.Inc()
			b.unreachable(s, err)
			if refused(err) {
				b.refusal.Store(&refusalNote{addr: s.addr, err: err})
			}
			if refused(err) && !warned {
				// Retrying will not help until someone fixes a setting,
				// and the sidecar serves its socket all the same (INFO
				// leader=-): say so once, not at every retry.
				warned = true
				b.log.Warn("a node refused the connection: check --cluster-id, the secret and --tls-ca against the nodes' (retrying; further failures at debug level)",
					"addr", s.addr, "err", err)
			} else {
				b.log.Debug("connect failed", "addr", s.addr, "err", err, "retry_in", backoff)
			}
		}
		select {
		case <-b.closing:
			return
		case <-s.stop:
			return
		case <-b.cfg.After(backoff):
		}
		if !useful {
			backoff = min(2*backoff, b.cfg.BackoffMax)
		}
	}
}

// unreachable records a failed dial of s. If an M named s's address as
// the leader and no connection to it is up, that hint is dropped: only a
// dropped connection cleared it before, so a hint the sidecar never
// connected to stayed the leader, and every acquire waited for it until
// it was answered unavailable while a connected node served (issue 39).
// With no leader known, the dispatcher and the releases ask the live
// nodes (findLeader).
func (b *Broker) unreachable(s *slot, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s.failing = true
	if b.leader == s.addr && !b.connectedLocked(s.addr) {
		b.leader = ""
		b.notifyLocked()
		b.log.Info("the leader an M named cannot be reached; asking the connected nodes", "addr", s.addr, "err", err)
	}
}

// refusalNote is a node's refusal of this sidecar's settings.
type refusalNote struct {
	addr string
	err  error
}

// unavailableWhy adds to err (an acquire given up as unavailable) the
// last refusal since a dial succeeded, wrapped as ErrRefused.
func (b *Broker) unavailableWhy(err error) error {
	if r := b.refusal.Load(); r != nil {
		return fmt.Errorf("%w; %w (%s: %v): check --cluster-id, the secret and --tls-ca against the nodes'", err, ErrRefused, r.addr, r.err)
	}
	return err
}

// refused reports whether a failed dial was the node (or its TLS
// certificate) refusing this sidecar's settings: another cluster id, a
// wrong secret, no common version, an unexpected node, TLS required or a
// certificate the CA does not verify. Unlike a node that is down, these
// do not pass by themselves.
func refused(err error) bool {
	var cert *tls.CertificateVerificationError
	return errors.Is(err, wire.ErrWrongCluster) || errors.Is(err, wire.ErrAuthFailed) ||
		errors.Is(err, wire.ErrVersion) || errors.Is(err, wire.ErrWrongNode) ||
		errors.Is(err, wire.ErrTLSRequired) || errors.As(err, &cert)
}

// dial connects to s's address (its notices and lost events come to the
// broker) and checks the node's fencing domain.
func (b *Broker) dial(ctx context.Context, s *slot) (*client.Conn, error) {
	b.mu.Lock()
	domain := b.domain
	b.mu.Unlock()
	conn, err := client.Dial(ctx, s.addr, client.Config{
		Secret: b.cfg.Secret, NextSecret: b.cfg.NextSecret, TLS: b.cfg.TLS,
		ClusterID: b.cfg.ClusterID, Domain: domain, HandshakeTimeout: b.cfg.DialTimeout, Dialer: b.cfg.Dialer, MaxVersion: b.offerVersion(),
		OnNotice: func(c *client.Conn, n wire.Msg) { b.onNotice(s, c, n) },
		OnLost:   func(_ *client.Conn, ev wire.Msg) { b.onLost(ev) },
	})
	if err != nil {
		return nil, err
	}
	if err := b.pinDomain(s.addr, conn.Peer().Domain); err != nil {
		conn.Close()
		b.log.Error("refusing a node of another fencing domain", "addr", s.addr, "err", err)
		return nil, err
	}
	if conn.Peer().Version >= wire.VersionPositions {
		// Places in line for the acquires this connection will carry
		// (AcquireOptions.Position), asked before any of them. Never on
		// an older node: it would close the connection on the unknown
		// frame. Its K is waited for (one round trip, like the
		// handshake's): a session attaches only to a connection with
		// nothing in flight (client.ErrConnBusy), and a fresh
		// connection is dialled to attach one.
		call, err := conn.WatchPositions()
		if err == nil {
			select {
			case <-call.Done:
				err = call.Err
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		if err != nil {
			b.log.Debug("asking for places in line", "addr", s.addr, "err", err)
		}
	}
	return conn, nil
}

// replacement returns the connection that replaced conn in s (attachFresh),
// or nil.
func (b *Broker) replacement(s *slot, conn *client.Conn) *client.Conn {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.conn != nil && s.conn != conn {
		return s.conn
	}
	return nil
}

// retire closes a connection replaced in its slot, or one without the
// session once the session is attached (retirePlain), once nothing is in
// flight on it (no new request goes there; its queued acquires keep their
// replies and cancels), or at the broker's close.
func (b *Broker) retire(conn *client.Conn) {
	defer b.slotWG.Done()
	defer b.plain.Delete(conn)
	for conn.InFlight() > 0 {
		select {
		case <-conn.Done():
			return
		case <-b.closing:
			conn.Close()
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	conn.Close()
	b.log.Debug("retired a connection replaced by the session's", "addr", conn.RemoteAddr())
}

// pinDomain checks a node's domain against the pinned one, pinning it if
// none is yet. A node that names no domain (it has not joined a cluster)
// is accepted: it never serves.
func (b *Broker) pinDomain(addr, domain string) error {
	if domain == "" {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.domain == "":
		b.domain = domain
		b.log.Info("fencing domain", "domain", domain, "from", addr)
	case b.domain != domain:
		return fmt.Errorf("%w: %s is in domain %s, this sidecar serves domain %s", ErrWrongDomain, addr, domain, b.domain)
	}
	return nil
}

// watch waits for conn to die, the broker to close or the address to be
// dropped. While no leader is known it asks conn's node now and then, so
// the broker learns of a new leader before a request needs one (an
// election may still have been under way when the connection came up); on
// the leader's connection it asks for the members every MembersRefresh.
func (b *Broker) watch(s *slot, conn *client.Conn) {
	addr := s.addr
	b.mu.Lock()
	swapped, current := s.swapped, s.conn == conn
	b.mu.Unlock()
	if !current {
		return // replaced already
	}
	for {
		select {
		case <-swapped:
			return
		case <-conn.Done():
			return
		case <-b.closing:
			return
		case <-s.stop:
			// No longer kept (and no longer chosen for new requests): let
			// what is in flight on it end before closing, so that nothing
			// written there becomes Indeterminate by our own hand.
			for end := time.Now().Add(b.cfg.DialTimeout + b.cfg.ReplyGrace); conn.InFlight() > 0 && time.Now().Before(end); {
				select {
				case <-conn.Done():
					return
				case <-b.closing:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
			return
		case <-b.cfg.After(leaderProbeInterval):
		}
		b.mu.Lock()
		known := b.leader != ""
		stale := b.leader == addr && b.cfg.MembersRefresh > 0 && b.cfg.Now().Sub(b.membersAt) >= b.cfg.MembersRefresh
		b.mu.Unlock()
		switch {
		case !known:
			b.probe(addr, conn)
		case stale:
			b.fetchMembers(addr, conn)
		}
	}
}

// leaderProbeInterval is how often an idle connection asks for the leader
// while none is known.
const leaderProbeInterval = 250 * time.Millisecond

// up installs a new connection; false if the address is no longer kept.
func (b *Broker) up(s *slot, conn *client.Conn) bool {
	b.mu.Lock()
	select {
	case <-s.stop:
		b.mu.Unlock()
		return false
	default:
	}
	s.conn = conn
	b.notifyLocked()
	b.mu.Unlock()
	b.log.Debug("connected", "addr", s.addr)
	// Learn who leads, so the first requests go straight there.
	go b.probe(s.addr, conn)
	return true
}

func (b *Broker) down(s *slot, conn *client.Conn) {
	b.mu.Lock()
	if s.conn == conn {
		s.conn = nil
	}
	b.plain.Delete(conn)
	if b.leader == s.addr && !b.connectedLocked(s.addr) {
		b.leader = ""
	}
	b.notifyLocked()
	b.mu.Unlock()
	b.log.Debug("disconnected", "addr", s.addr, "err", conn.Err())
}

func (b *Broker) connectedLocked(addr string) bool {
	for _, s := range b.slots {
		if s.addr == addr && s.conn != nil {
			return true
		}
	}
	return false
}

// probe asks one connection's node whether it is the serving leader. Only
// a node's word about itself counts: a follower may still name a leader
// that has since been deposed, and sending there would earn an M (which,
// for a written acquire, is a definite failure the caller sees). addr is
// the configured address the connection was dialled at, so the leader is
// recognised even when it advertises another name for itself.
func (b *Broker) probe(addr string, conn *client.Conn) {
	if conn.HandingOver() {
		return // it said it hands over: it will not serve
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.DialTimeout)
	defer cancel()
	st, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeStatus})
	if err == nil && st.Type == wire.TypeStatusR && st.Role == wire.RoleLeader && st.LeaderAddr != "" &&
		st.LeaderID == st.NodeID && !conn.HandingOver() {
		b.serving(addr)
		b.fetchMembers(addr, conn)
	}
}

// onNotice handles a node's notice (a connection's reader goroutine calls
// it, before the connection acts on it).
func (b *Broker) onNotice(s *slot, conn *client.Conn, n wire.Msg) {
	switch n.Event {
	case wire.NoticeHandOver:
		// Stop sending there (the connection refuses acquires and
		// releases from now on) and hold new requests, writing nothing,
		// until a leader serves: findLeader waits while none is known.
		b.mu.Lock()
		if b.leader == s.addr || b.leader == "" {
			b.leader = ""
			b.awaiting = n.LeaderAddr
		}
		b.notifyLocked()
		b.mu.Unlock()
		b.log.Info("leader hands over", "from", s.addr, "to", n.LeaderID, "to_addr", n.LeaderAddr)
		b.learn(n.LeaderAddr)
	case wire.NoticeServing:
		b.serving(s.addr)
		go b.fetchMembers(s.addr, conn)
	}
}

// serving records the node at addr (a kept address) as the serving
// leader, on its own word (a status or a serving notice).
func (b *Broker) serving(addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.awaiting = ""
	b.setLeaderLocked(addr)
}

// fetchMembers asks the leader's node for the configuration (a read, safe
// to repeat).
func (b *Broker) fetchMembers(addr string, conn *client.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.DialTimeout)
	defer cancel()
	r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeMembers})
	if err != nil || r.Type != wire.TypeMembersR {
		b.log.Debug("members request failed", "addr", addr, "err", err, "reply", wire.TypeName(r.Type))
		return
	}
	b.mu.Lock()
	b.members, b.membersAt = r.Members, b.cfg.Now()
	b.mu.Unlock()
	b.syncMembers(r.Members)
}

// setLeader records a leader hint from an M if it names one of our
// addresses, unless a hand-over is under way (its target names the old
// leader until it serves itself). A hint naming an address whose last
// dial failed, with no connection up, is not taken: the leader is
// forgotten instead (the node that said M does not lead either), so that
// the live nodes are asked (findLeader).
func (b *Broker) setLeader(addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.awaiting != "" {
		return
	}
	if b.failingLocked(addr) {
		if b.leader != "" {
			b.leader = ""
			b.notifyLocked()
		}
		return
	}
	b.setLeaderLocked(addr)
}

// failingLocked reports whether addr is kept, not connected, and its last
// dial failed. Requires b.mu.
func (b *Broker) failingLocked(addr string) bool {
	failing := false
	for _, s := range b.slots {
		if s.addr == addr {
			if s.conn != nil || !s.failing {
				return false
			}
			failing = true
		}
	}
	return failing
}

// leaderConnectedLocked reports whether a leader is known and some
// connection to it is up. A leader known but not connected is a hint (an
// M named it) the sidecar may never reach. Requires b.mu.
func (b *Broker) leaderConnectedLocked() bool {
	return b.leader != "" && b.connectedLocked(b.leader)
}

func (b *Broker) setLeaderLocked(addr string) {
	if b.leader == addr {
		return
	}
	for _, s := range b.slots {
		if s.addr == addr {
			b.leader = addr
			b.metrics.leaderChanges.Inc()
			b.notifyLocked()
			return
		}
	}
}

// target returns the connection to send to: the known leader's, else
// round-robin over live ones, skipping those in skip. It also returns the
// channel closed at the next change, to wait on when there is none.
func (b *Broker) target(skip map[*client.Conn]bool) (*client.Conn, bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.slots)
	if b.leader != "" {
		for i := 0; i < n; i++ {
			s := b.slots[(b.rr+i)%n]
			if s.addr == b.leader && s.conn != nil && !skip[s.conn] && !s.conn.HandingOver() && b.usableLocked(s.conn) {
				b.rr = (b.rr + i + 1) % n
				return s.conn, true, b.changed
			}
		}
	}
	for i := 0; i < n; i++ {
		s := b.slots[(b.rr+i)%n]
		if s.conn != nil && !skip[s.conn] && !s.conn.HandingOver() && b.usableLocked(s.conn) {
			b.rr = (b.rr + i + 1) % n
			return s.conn, false, b.changed
		}
	}
	return nil, false, b.changed
}

// findLeader makes sure a serving leader is known and connected, asking
// the live connections when it is not: a node that says it serves itself
// replaces a hint (an M named a leader) that is not connected, which may
// be an address the sidecar never reaches. Status requests are not lock
// requests, so asking again is always safe. It returns false once until
// passes.
func (b *Broker) findLeader(ctx context.Context, until time.Time) bool {
	for {
		b.mu.Lock()
		known, hinted, changed := b.leaderConnectedLocked(), b.leader != "", b.changed
		type live struct {
			addr string
			conn *client.Conn
		}
		var conns []live
		for _, s := range b.slots {
			if s.conn != nil && !s.conn.HandingOver() {
				conns = append(conns, live{s.addr, s.conn})
			}
		}
		b.mu.Unlock()
		if known {
			return true
		}
		left := until.Sub(b.cfg.Now())
		if left <= 0 {
			return false
		}
		if len(conns) > 0 {
			var wg sync.WaitGroup
			for _, c := range conns {
				wg.Add(1)
				go func() { defer wg.Done(); b.probe(c.addr, c.conn) }()
			}
			wg.Wait()
			b.mu.Lock()
			known = b.leaderConnectedLocked()
			b.mu.Unlock()
			if known {
				return true
			}
		}
		// An election is under way (or nothing is connected): look again
		// shortly, or as soon as a connection comes up. While a hinted
		// leader is being dialled, its connection coming up ends the wait
		// (changed); the live nodes are asked again less often.
		pause := min(left, 50*time.Millisecond)
		if hinted {
			pause = min(left, leaderProbeInterval)
		}
		if len(conns) == 0 {
			pause = left
		}
		select {
		case <-changed:
		case <-b.cfg.After(pause):
		case <-ctx.Done():
			return false
		case <-b.closing:
			return false
		}
	}
}

// moved takes the leader hint of an M reply: the named leader (dialled
// if its address is not kept yet), or none.
func (b *Broker) moved(addr string) {
	if addr == "" {
		b.forgetLeader()
		return
	}
	b.learn(addr)
	b.setLeader(addr)
}

func (b *Broker) forgetLeader() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.leader != "" {
		b.leader = ""
		b.notifyLocked()
	}
}

// Release releases l through the release queue, retrying until
// ReleaseDeadline after this call; nil only on a success reply. Otherwise a
// definite server error (locksm.ErrNotHeld, ErrTokenMismatch, ...: the lease
// ended the holding), ErrIndeterminate (deadline passed without a definite
// reply, or a retry found the key gone after an attempt whose reply was
// lost) or ErrClosed. A release is never refused for capacity: it does not
// wait behind acquires (the node keeps releases a budget of their own too),
// and the queue is bounded only by the locks there are to release. If ctx
// ends first, the release goes on in the background and the error wraps
// ctx.Err().
func (b *Broker) Release(ctx context.Context, l Lock) error {
	ch := make(chan error, 1)
	if err := b.ReleaseAsync(l, func(err error) { ch <- err }); err != nil {
		return err
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("sidecar: stopped waiting for the release (it goes on until its deadline): %w", ctx.Err())
	}
}

// ReleaseAsync starts the release of l (as Release) and returns at once;
// done is called once with the outcome, on a release worker or a
// connection's reader goroutine, and must not block. The only error returned here (done then never runs) is
// ErrClosed.
func (b *Broker) ReleaseAsync(l Lock, done func(error)) error {
	b.unhold(l.Token)
	job := b.newReleaseJob(l, done)
	if b.startRelease(job) {
		return nil
	}
	if err := b.enqueue(job); err != nil {
		b.metrics.released(job, err)
		return err
	}
	return nil
}

// Compensate queues the release of l without waiting for the outcome (for
// locks whose user went away). The outcome is logged.
func (b *Broker) Compensate(l Lock) {
	b.unhold(l.Token)
	job := b.newReleaseJob(l, nil)
	if b.startRelease(job) {
		return
	}
	if err := b.enqueue(job); err != nil {
		b.metrics.released(job, err)
		b.log.Error("cannot release; the lease will end it", "key", l.Key, "token", l.Token, "err", err)
	}
}

// msg is the request one attempt of job sends.
func (job *releaseJob) msg() wire.Msg {
	l := job.lock
	if job.setPermits {
		return wire.Msg{Type: wire.TypeSetPermits, Key: l.Key, Permits: job.permits}
	}
	if job.extendSec > 0 {
		return wire.Msg{Type: wire.TypeExtend, Key: l.Key, Owner: l.Owner, Token: l.Token, Lease: uint16(job.extendSec)}
	}
	return wire.Msg{Type: wire.TypeRelease, Key: l.Key, Owner: l.Owner, Token: l.Token}
}

// what names job for errors and logs ("release of k token 7").
func (job *releaseJob) what() string {
	if job.setPermits {
		return fmt.Sprintf("set-permits of %s to %d", job.lock.Key, job.permits)
	}
	op := "release"
	if job.extendSec > 0 {
		op = "extend"
	}
	return fmt.Sprintf("%s of %s token %d", op, job.lock.Key, job.lock.Token)
}

func (b *Broker) newReleaseJob(l Lock, done func(error)) *releaseJob {
	return &releaseJob{lock: l, start: time.Now(), deadline: b.cfg.Now().Add(b.cfg.ReleaseDeadline), done: done,
		pause: 20 * time.Millisecond}
}

// startRelease sends job's first attempt to the known leader without a
// worker: its reply is judged on the connection's reader goroutine (a
// Done hook) and a timer stands for its deadline. Only a success or a
// definite error settles it there; anything else (no reply, M, an
// unexpected reply) goes to a worker, which judges it and retries as
// release does. False when nothing was sent (the broker is closing,
// ReleasesInFlight first attempts are out, or no leader is known or
// connected): the caller queues job for a worker.
//
// Measured: a release through the worker pool cost two goroutine
// wake-ups, a context and a timer per attempt, and 64 workers capped the
// releases in flight (at 256 clients the pool was 10.6 % of the sidecar's
// CPU, and releases queued for a worker).
func (b *Broker) startRelease(job *releaseJob) bool {
	b.rmu.Lock()
	if b.rclosed || b.rasync >= b.cfg.ReleasesInFlight {
		b.rmu.Unlock()
		return false
	}
	b.rasync++
	b.rmu.Unlock()
	conn, isLeader, _ := b.target(nil)
	if conn == nil || !isLeader {
		b.asyncEnded()
		return false
	}
	_, err := conn.StartFunc(job.msg(), client.Hooks{Done: func(call *client.Call) { b.releaseReplied(job, call) }})
	if err != nil {
		job.last = err
		b.asyncEnded()
		return false
	}
	job.amu.Lock()
	if !job.over {
		b.watchDeadline(job)
	}
	job.amu.Unlock()
	return true
}

// endAttempt claims the end of job's first attempt for the caller: false
// if its reply or its deadline already did.
func (b *Broker) endAttempt(job *releaseJob) bool {
	job.amu.Lock()
	defer job.amu.Unlock()
	if job.over {
		return false
	}
	job.over = true
	b.unwatchDeadline(job)
	return true
}

// releaseReplied is the first attempt's Done hook.
func (b *Broker) releaseReplied(job *releaseJob, call *client.Call) {
	if !b.endAttempt(job) {
		return // its deadline passed first: reported Indeterminate
	}
	if call.Err == nil {
		switch r := call.Reply; r.Type {
		case wire.TypeOK:
			b.settleAsync(job, nil)
			return
		case wire.TypeError:
			// The first attempt: nothing earlier may have run, so a
			// definite error is what it says.
			b.settleAsync(job, wire.RemoteErr(r.Code, r.Text))
			return
		}
	}
	job.pending = call
	b.requeue(job)
}

// releaseTimedOut is the first attempt's deadline.
func (b *Broker) releaseTimedOut(job *releaseJob) {
	if !b.endAttempt(job) {
		return
	}
	b.settleAsync(job, fmt.Errorf("%w: %s got no reply within %v", ErrIndeterminate, job.what(), b.cfg.ReleaseDeadline))
}

// settleAsync reports the outcome of a release settled by its first
// attempt.
func (b *Broker) settleAsync(job *releaseJob, err error) {
	b.finishRelease(job, err)
	b.asyncEnded()
}

// finishRelease reports a release's outcome: metrics, then the caller
// (or, for a compensation, the log).
func (b *Broker) finishRelease(job *releaseJob, err error) {
	if job.setPermits {
		job.done(err)
		return
	}
	if job.extendSec > 0 {
		b.metrics.extended(job, err)
		job.done(err)
		return
	}
	b.metrics.released(job, err)
	if job.done != nil {
		job.done(err)
	} else if err != nil {
		b.log.Warn("compensating release failed; the lease will end the holding",
			"key", job.lock.Key, "token", job.lock.Token, "err", err)
	}
}

// requeue hands a release whose first attempt did not settle it to a
// worker; the queue takes it even while closing (the workers wait for
// every first attempt to end).
func (b *Broker) requeue(job *releaseJob) {
	b.rmu.Lock()
	b.rjobs = append(b.rjobs, job)
	b.rasync--
	b.rcond.Signal()
	b.rmu.Unlock()
}

// asyncEnded counts a first attempt as ended (settled, or never sent).
func (b *Broker) asyncEnded() {
	b.rmu.Lock()
	if b.rasync--; b.rasync == 0 && b.rclosed {
		b.rcond.Broadcast()
	}
	b.rmu.Unlock()
}

func (b *Broker) enqueue(job *releaseJob) error {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	if b.rclosed {
		return ErrClosed
	}
	b.rjobs = append(b.rjobs, job)
	b.rcond.Signal()
	return nil
}

// nextRelease waits for a queued release; nil once the queue is closed and
// empty.
func (b *Broker) nextRelease() *releaseJob {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	for len(b.rjobs) == 0 && !(b.rclosed && b.rasync == 0) {
		b.rcond.Wait()
	}
	if len(b.rjobs) == 0 {
		return nil
	}
	job := b.rjobs[0]
	b.rjobs[0] = nil
	b.rjobs = b.rjobs[1:]
	if len(b.rjobs) == 0 {
		b.rjobs = nil // let a burst's array go
	}
	return job
}

// releaseQueueLen is how many releases wait for a worker.
func (b *Broker) releaseQueueLen() int {
	b.rmu.Lock()
	defer b.rmu.Unlock()
	return len(b.rjobs)
}

func (b *Broker) releaseWorker() {
	defer b.workerWG.Done()
	for job := b.nextRelease(); job != nil; job = b.nextRelease() {
		b.finishRelease(job, b.release(job))
	}
}

// release sends one release, retrying after a pause (20 ms doubling to
// 500 ms; an M naming a connected leader goes there at once, once between
// pauses: pauseNext) until it gets a definite reply or its deadline passes.
// Unlike an acquire, a release may be resent: its effect is exact (key,
// owner, token), and resending an executed one only earns not_held or
// token_mismatch, never a wrong release. But that answer is then
// ambiguous: the key is not held under this token any more, either because
// an earlier attempt released it or because the lease ran out first. It is
// reported as ErrIndeterminate, never as the definite error, which would
// tell the caller its lease ran out when its release may have worked (the
// verification suite caught this: a release whose connection dropped after
// the leader applied it came back not_held).
func (b *Broker) release(job *releaseJob) error {
	pauseFirst := false
	if call := job.pending; call != nil {
		// The first attempt's reply (or its connection's death), which
		// did not settle the release.
		job.pending = nil
		if err, settled := b.releaseOutcome(job, call); settled {
			return err
		}
		pauseFirst = b.pauseNext(job)
	}
	for {
		if pauseFirst {
			select {
			case <-b.cfg.After(min(job.pause, max(job.deadline.Sub(b.cfg.Now()), 0))):
			case <-b.closing:
			}
			job.pause = min(2*job.pause, 500*time.Millisecond)
		}
		pauseFirst = true
		left := job.deadline.Sub(b.cfg.Now())
		if left <= 0 {
			return fmt.Errorf("%w: %s not confirmed within %v (last: %v)",
				ErrIndeterminate, job.what(), b.cfg.ReleaseDeadline, job.last)
		}
		ctx, cancel := context.WithTimeout(context.Background(), left)
		b.findLeader(ctx, job.deadline)
		cancel()
		conn, _, changed := b.target(nil)
		if conn == nil {
			job.last = ErrUnavailable
			select {
			case <-changed:
			case <-b.cfg.After(max(job.deadline.Sub(b.cfg.Now()), 0)):
			case <-b.closing:
				return ErrClosed
			}
			pauseFirst = false
			continue
		}
		call, err := conn.Start(job.msg())
		if errors.Is(err, wire.ErrNotSupported) {
			// An extend to a node older than version 6: nothing written,
			// and no node of the cluster takes it before all do.
			return err
		}
		if err != nil {
			job.last = err
			pauseFirst = false
			continue
		}
		timer := time.NewTimer(max(job.deadline.Sub(b.cfg.Now()), 0))
		select {
		case <-call.Done:
			timer.Stop()
		case <-timer.C:
			return fmt.Errorf("%w: %s got no reply within %v", ErrIndeterminate, job.what(), b.cfg.ReleaseDeadline)
		}
		if err, settled := b.releaseOutcome(job, call); settled {
			return err
		}
		pauseFirst = b.pauseNext(job)
	}
}

// pauseNext reports whether the attempt just judged calls for a pause
// before the next. An M names where to go, and the next attempt goes
// there at once, but only when the named leader is connected, and only
// once between pauses: else the attempt would go back to a node that
// said M (target picks any live connection while the leader's is down),
// or two stale nodes would send it back and forth, with nothing to
// slow it (issue 39: 193,821 attempts within one deadline).
func (b *Broker) pauseNext(job *releaseJob) bool {
	if errors.Is(job.last, ErrMoved) && !job.hopped {
		b.mu.Lock()
		connected := b.leaderConnLocked() != nil
		b.mu.Unlock()
		if connected {
			job.hopped = true
			return false
		}
	}
	job.hopped = false
	return true
}

// releaseOutcome judges one attempt's completed call: settled with the
// release's outcome, or not (job.last and job.mayHaveRun updated, and
// the leader hint taken) and to be tried again.
//
// An extend is judged the same way but for one case: a definite not held
// after an attempt whose reply was lost is reported as it is, since for an
// extend both readings (the lost attempt extended the lease and it has run
// out since, or it never ran) leave the holding ended.
func (b *Broker) releaseOutcome(job *releaseJob, call *client.Call) (err error, settled bool) {
	if call.Err != nil {
		job.last = call.Err
		if call.Written && !errors.Is(call.Err, client.ErrVoid) {
			// A void attempt never ran (its session's resume said so):
			// sending it again is a new request, not a resend.
			job.mayHaveRun = true
		}
		return b.setPermitsNoResend(job)
	}
	switch r := call.Reply; r.Type {
	case wire.TypeOK:
		return nil, true
	case wire.TypeError:
		err := wire.RemoteErr(r.Code, r.Text)
		if job.mayHaveRun && releaseGone(err) && job.extendSec == 0 && !job.setPermits {
			return fmt.Errorf("%w: %s: an earlier attempt may have released it (its reply was lost), and now the cluster answers: %v",
				ErrIndeterminate, job.what(), err), true
		}
		return err, true
	case wire.TypeMoved:
		b.moved(r.LeaderAddr)
		if r.LeaderAddr == "" {
			// Not executed, and no leader to go to: look for one after a
			// pause, as when none is known.
			job.last = errNoLeaderHint(r)
			return nil, false
		}
		job.last = ErrMoved
		return nil, false // not executed: go to the leader (at once if connected: pauseNext)
	default:
		b.forgetLeader()
		job.last = fmt.Errorf("reply %s: %s", wire.TypeName(r.Type), r.Text)
		job.mayHaveRun = job.mayHaveRun || r.Type == wire.TypeUnknown
		return b.setPermitsNoResend(job)
	}
}

// setPermitsNoResend settles a set-permits whose attempt may have run
// (written, no definite reply) as ErrIndeterminate instead of resending
// it. Unlike a release it is not exact: a resend meets whatever the first
// attempt and any later set-permits left, so its answer says nothing of
// the first (a removal's resend answers not_semaphore, "never was one"),
// and applied after another operator's set-permits it would put a stale n
// back (raising it grants waiters). Any other job goes on being retried.
func (b *Broker) setPermitsNoResend(job *releaseJob) (error, bool) {
	if !job.setPermits || !job.mayHaveRun {
		return nil, false
	}
	return fmt.Errorf("%w: %s: it was sent and no definite reply came (%v); it may have applied, and is not sent again",
		ErrIndeterminate, job.what(), job.last), true
}

// releaseGone reports whether a release's definite error says the holding
// no longer exists (not held, held under another token or owner).
func releaseGone(err error) bool {
	return errors.Is(err, locksm.ErrNotHeld) || errors.Is(err, locksm.ErrTokenMismatch) || errors.Is(err, locksm.ErrOwnerMismatch)
}

// Info reports the broker's view of the cluster.
func (b *Broker) Info() Info {
	b.mu.Lock()
	defer b.mu.Unlock()
	in := Info{ClusterID: b.cfg.ClusterID, Domain: b.domain, Leader: b.leader, Seeds: append([]string(nil), b.cfg.Addrs...),
		Members: append([]wire.Member(nil), b.members...), Session: b.sessionInfoLocked(),
		Sessions: b.cfg.Sessions, SessionTimeout: b.cfg.SessionTimeout}
	kept, seen := map[string]bool{}, map[string]bool{}
	for _, s := range b.slots {
		if !kept[s.addr] {
			kept[s.addr] = true
			in.Addrs = append(in.Addrs, s.addr)
		}
		if s.conn != nil && !seen[s.addr] {
			seen[s.addr] = true
			in.Connected = append(in.Connected, s.addr)
		}
	}
	return in
}

// Close ends every lock held through the broker, the way closing an etcd
// session revokes its lease, with or without a cluster session:
//
//   - It stops taking requests: acquires not sent yet are answered
//     ErrClosed; those sent are cancelled at the node, and a grant that
//     arrives from now on is answered ErrClosed (not acquired) and
//     released.
//   - Every lock granted through the broker and not released (Release,
//     ReleaseAsync, Compensate), lost (a lost event, an Extend refused as
//     not held) or past its lease is reported lost first: each WatchLost
//     of it is told LostCompensated, before anything is released. A
//     holder that does not watch learns it from Close itself: once Close
//     is called, no lock of the broker may be counted on (ValidUntil
//     notwithstanding). A grant registered before Close but not yet
//     delivered to its caller when Close takes the held locks is
//     answered ErrClosed (and released with them); a Lock whose
//     WatchLost is called only after that (its Acquire returned just
//     before) is told LostCompensated at once, inside WatchLost.
//   - Then each is released (an exact-match release, as Compensate,
//     within Config.ReleaseDeadline), queued releases finish (each within
//     its own deadline), and with a cluster session its close (`d`)
//     releases whatever the session still holds (a grant that raced the
//     stop; from cluster version 9). Without a session (Config.Sessions
//     off, or a cluster below version 7), the releases alone end the
//     holdings; a release that fails leaves its key to its lease, the
//     holder having been told it is lost.
//   - Then it closes the connections.
//
// Before issue 39 (attack round 4) Close said nothing of held locks:
// without a session they kept their leases, and with one the session's
// close released them silently, so a caller still inside ValidUntil lost
// its key to another broker unawares.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.notifyLocked()
	b.mu.Unlock()
	// Acquires not sent yet end now; those sent are cancelled at the
	// node, and a grant of one is answered ErrClosed and released
	// (answerLocked); they end with their replies or their connections.
	var fx effects
	b.qmu.Lock()
	b.qclosed = true
	b.failQueuedLocked(ErrClosed, &fx)
	close(b.qstop)
	b.cancelSentLocked()
	b.qmu.Unlock()
	b.qcancel()
	fx.run()
	// No grant registers any more (qclosed): report every held lock lost,
	// then release them.
	held := b.takeHeld()
	for _, l := range held {
		b.fireLost(l.Token, "", Loss{Reason: LostCompensated})
	}
	for _, l := range held {
		b.log.Info("releasing a lock still held as the broker closes", "key", l.Key, "token", l.Token)
		b.Compensate(l)
	}
	// Cancelled acquires end (a grant among them is released through the
	// queue, still open) within a release's deadline.
	b.waitSent(b.cfg.ReleaseDeadline)
	b.rmu.Lock()
	b.rclosed = true
	b.rcond.Broadcast()
	b.rmu.Unlock()
	b.workerWG.Wait()
	b.closeSession()
	close(b.closing)
	b.slotWG.Wait()
	return nil
}
