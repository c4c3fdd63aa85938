package cluster

import (
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"strconv"

	"ticketing/cluster/leader"
	"ticketing/cluster/obs"
	"ticketing/locksm"
)

// Metrics. Every Node has its own registry (MetricsRegistry), so several
// nodes in one process (tests, `ticketing dev`) never share a metric. The
// request path only adds to counters and observes histograms (atomic
// operations, no allocation); everything that reads state (the lock table,
// Raft's indexes, connections, the refusal counters of Stats) is read when
// the registry is gathered. docs/operations.md, "Metrics and health", lists every
// metric.
//
// Reply counters count where the node decides a client's reply (the
// leader core's reply events, see record, and the definite errors of
// server.go for frames that do not decode): each request is counted once,
// with the reply it got, even when its connection went away before the
// reply could be written (a grant to a dead connection is counted as an
// abandoned grant instead, as no G is sent). A follower counts the M
// replies it sends; the leader everything else. Expiries and hand-offs are
// counted by the leader when it applies them, so the sum over the nodes is
// the cluster's total.

// replyResult is the result label of the acquire and release counters.
type replyResult = leader.Outcome

const (
	resGranted       = leader.OutcomeGranted
	resBusy          = leader.OutcomeBusy
	resTimeout       = leader.OutcomeTimeout
	resIndeterminate = leader.OutcomeIndeterminate
	resMoved         = leader.OutcomeMoved
	resError         = leader.OutcomeError
	resOK            = leader.OutcomeOK
	resNotHeld       = leader.OutcomeNotHeld
	numReplyResults  = leader.NumOutcomes
)

type nodeMetrics struct {
	reg *prometheus.Registry

	acquires, releases, extends [numReplyResults]prometheus.Counter // nil: not a result of that op
	// blockGrants counts the grants of blocks by their number of keys
	// (index 2..locksm.MaxBlockKeys).
	blockGrants [locksm.MaxBlockKeys + 1]prometheus.Counter
	// acquireLatency[0]: granted by its own command; [1]: granted from the
	// queue (the wait included).
	acquireLatency [2]prometheus.Observer
	handoffLatency prometheus.Observer
	// commitLatency: from a batch's proposal to its apply on the leader.
	commitLatency   prometheus.Observer
	expiries        prometheus.Counter
	revokes         prometheus.Counter
	lostEvents      prometheus.Counter
	positionsSent   prometheus.Counter
	handoffs        prometheus.Counter
	abandonedGrants prometheus.Counter
	// sessionRefusals counts opens and resumes refused before anything
	// was proposed (their log line is rate-limited).
	sessionRefusals prometheus.Counter
	leaderChanges   prometheus.Counter
	snapshotsTaken  prometheus.Counter
	snapshotBytes   prometheus.Counter
	restores        prometheus.Counter
	// logVerifications counts the verified log ranges by result
	// (logverify.go); logCheckpoints the checkpoints this node appended
	// as the serving leader.
	logVerifications [numVerifyResults]prometheus.Counter
	logCheckpoints   prometheus.Counter
}

func newNodeMetrics(n *Node) *nodeMetrics {
	m := &nodeMetrics{reg: prometheus.NewRegistry()}
	acq := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_node_acquires_total",
		Help: "Acquire requests answered by this node, by reply: granted (G), busy (B), timeout (T, a wait that ran out or was cancelled), indeterminate (U), moved (M, not the serving leader), error (E).",
	}, []string{"result"})
	for _, r := range []replyResult{resGranted, resBusy, resTimeout, resIndeterminate, resMoved, resError} {
		m.acquires[r] = acq.WithLabelValues(r.String())
	}
	rel := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_node_releases_total",
		Help: "Release requests answered by this node, by reply: ok (K), not_held (E not_held, token_mismatch or owner_mismatch: the holding had ended), indeterminate (U), moved (M), error (any other E).",
	}, []string{"result"})
	for _, r := range []replyResult{resOK, resNotHeld, resIndeterminate, resMoved, resError} {
		m.releases[r] = rel.WithLabelValues(r.String())
	}
	ext := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_node_extends_total",
		Help: "Extend requests answered by this node, by reply: ok (K, the lease was renewed), not_held (E not_held, token_mismatch or owner_mismatch: the holding had ended), indeterminate (U), moved (M), error (any other E).",
	}, []string{"result"})
	for _, r := range []replyResult{resOK, resNotHeld, resIndeterminate, resMoved, resError} {
		m.extends[r] = ext.WithLabelValues(r.String())
	}
	blk := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_node_block_grants_total",
		Help: "Block acquires granted by this node (also counted in ticketing_node_acquires_total), by the block's number of keys.",
	}, []string{"keys"})
	for n := locksm.MinBlockKeys; n <= locksm.MaxBlockKeys; n++ {
		m.blockGrants[n] = blk.WithLabelValues(strconv.Itoa(n))
	}
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ticketing_node_acquire_duration_seconds",
		Help:    "Leader side: from an acquire's arrival to its G reply; queued=\"true\" for grants from the wait queue (the wait included).",
		Buckets: obs.LatencyBuckets,
	}, []string{"queued"})
	m.acquireLatency[0] = lat.WithLabelValues("false")
	m.acquireLatency[1] = lat.WithLabelValues("true")
	hol := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ticketing_node_handoff_duration_seconds",
		Help:    "Leader side: from the event that freed a key (the release request's arrival, or the lease running out on the leader's timer) to the G sent to the next waiter.",
		Buckets: obs.LatencyBuckets,
	})
	m.handoffLatency = hol
	cl := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ticketing_node_commit_duration_seconds",
		Help:    "Leader side: from a batch's proposal to Raft to its apply on this node (a majority's fsync and the round trips included).",
		Buckets: obs.LatencyBuckets,
	})
	m.commitLatency = cl
	m.expiries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_expiries_total",
		Help: "Leases that ran out, counted by the leader when it applied the expiry.",
	})
	m.revokes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_revokes_total",
		Help: "Holdings ended by an operator's revoke that this node's process applied (every node counts each revoke once: take the max across nodes, not the sum; a restart replays the log since the last snapshot; each also logged, \"lock revoked\", with its log index).",
	})
	m.lostEvents = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_lost_events_total",
		Help: "Lost events (X frames) the leader sent to tell holders their lease expired: one per connection told (the grant's own connection, or every version 6 connection when that one had closed).",
	})
	m.positionsSent = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_positions_sent_total",
		Help: "Places in line (R frames, protocol version 12) the leader told waiters on connections that asked for them: at most one per waiter, key and position interval, only when the place changed.",
	})
	m.handoffs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_handoffs_total",
		Help: "Keys handed to a queued waiter (by a release or an expiry), counted by the leader when it applied them.",
	})
	m.abandonedGrants = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_abandoned_grants_total",
		Help: "Grants whose requester's connection had gone; the leader released them at once.",
	})
	m.sessionRefusals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_session_refusals_total",
		Help: "Session opens and resumes the leader refused before proposing anything: a wrong secret, an unknown (expired) session, a connection that cannot carry that session.",
	})
	m.leaderChanges = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_leader_changes_total",
		Help: "Times this node learned of a new Raft leader (after none, or another, was known).",
	})
	m.snapshotsTaken = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_snapshots_total",
		Help: "State machine snapshots this node wrote.",
	})
	m.snapshotBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_snapshot_written_bytes_total",
		Help: "Bytes of the state machine snapshots this node wrote.",
	})
	m.restores = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_snapshot_restores_total",
		Help: "Snapshots restored into the state machine (at start, or installed from the leader).",
	})
	ver := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_node_log_verifications_total",
		Help: "Log ranges (the entries between two verification checkpoints) this node checked, by result: ok, storage_corruption (read back from this node's log store, they differ from what the leader wrote), in_flight_corruption (what this node received and wrote differs from what the leader wrote), unverified (the range was no longer in this node's log, a read failed, or a range was skipped).",
	}, []string{"result"})
	for r, name := range verifyResultNames {
		m.logVerifications[r] = ver.WithLabelValues(name)
	}
	m.logCheckpoints = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_node_log_checkpoints_total",
		Help: "Log verification checkpoints this node appended as the serving leader.",
	})
	m.reg.MustRegister(acq, rel, ext, blk, lat, hol, cl, m.expiries, m.revokes, m.lostEvents, m.positionsSent, m.handoffs, m.abandonedGrants, m.sessionRefusals,
		m.leaderChanges, m.snapshotsTaken, m.snapshotBytes, m.restores, ver, m.logCheckpoints, newNodeCollector(n))
	return m
}

// reply counts one reply to a client request of op.
func (m *nodeMetrics) reply(op locksm.Op, r replyResult) {
	if m == nil {
		return
	}
	var c prometheus.Counter
	switch op {
	case locksm.OpAcquire, locksm.OpAcquireBlock, locksm.OpAcquirePermit:
		c = m.acquires[r]
	case locksm.OpRelease:
		c = m.releases[r]
	case locksm.OpExtend:
		c = m.extends[r]
	}
	if c != nil {
		c.Inc()
	}
}

// record counts one event of the leader core.
func (n *Node) record(e leader.Event) {
	m := n.metrics
	switch e.Kind {
	case leader.EventReply:
		m.reply(e.Op, e.Outcome)
		if e.Outcome == leader.OutcomeGranted {
			q := 0
			if e.Queued {
				q = 1
			}
			m.acquireLatency[q].Observe(e.Latency.Seconds())
			if e.Keys >= locksm.MinBlockKeys && e.Keys <= locksm.MaxBlockKeys {
				m.blockGrants[e.Keys].Inc()
			}
		}
	case leader.EventHandoffLatency:
		m.handoffLatency.Observe(e.Latency.Seconds())
	case leader.EventExpiry:
		m.expiries.Inc()
	case leader.EventRevoked:
		m.revokes.Inc()
		if rv := e.Revoke; rv != nil {
			// The audit record, as the log keeps it (inspect shows the
			// key's latest; this line keeps them all).
			n.log.Warn("lock revoked", "key", rv.Key, "keys", rv.Keys, "token", rv.Token, "holder", rv.Owner,
				"permit", rv.Permit, "slot", rv.Slot, "by", rv.Who, "reason", rv.Reason, "at_unix_ms", rv.At, "leader", e.Leading,
				"index", e.Index)
		}
	case leader.EventHandoff:
		m.handoffs.Inc()
	case leader.EventLostSent:
		m.lostEvents.Add(float64(e.Keys))
	case leader.EventPositionsSent:
		m.positionsSent.Add(float64(e.Keys))
	case leader.EventAbandonedGrant:
		m.abandonedGrants.Inc()
	case leader.EventSessionRefused:
		m.sessionRefusals.Inc()
	case leader.EventSuperseded:
		// Raft's own notice comes later; what was queued for proposal
		// belongs to the leadership that ended.
		n.dropQueuedProposals()
		n.log.Warn("stopped serving", "why", "an entry of a newer term was applied: another node leads", "owed_unknown", e.Keys)
	case leader.EventRefusedInFlight:
		n.stats.inFlightRefusals.Add(1)
	case leader.EventRefusedKeys:
		n.stats.keyLimitRefusals.Add(1)
	case leader.EventRefusedWaiters:
		n.stats.waiterLimitRefusals.Add(1)
	case leader.EventRefusedConnWaiters:
		n.stats.connWaiterLimitRefusals.Add(1)
	case leader.EventRefusedSessions:
		n.stats.sessionLimitRefusals.Add(1)
	case leader.EventRefusedOutcomes:
		n.stats.outcomeLimitRefusals.Add(1)
	case leader.EventUnexpectedResult:
		n.log.Error("unexpected result for a client command", "op", e.Op, "status", e.Status)
	}
}

// MetricsRegistry is this node's Prometheus registry (its own, never the
// global default one). Serve it with promhttp.HandlerFor, or register
// further collectors on it.
func (n *Node) MetricsRegistry() *prometheus.Registry { return n.metrics.reg }

// watchLeaderChanges counts the leader changes this node observes.
func (n *Node) watchLeaderChanges() {
	defer n.wg.Done()
	ch := make(chan raft.Observation, 16)
	obsv := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	n.raft.RegisterObserver(obsv)
	defer n.raft.DeregisterObserver(obsv)
	last := raft.ServerID("")
	if _, id := n.raft.LeaderWithID(); id != "" {
		// A leader already known before the observer was registered.
		n.metrics.leaderChanges.Inc()
		last = id
	}
	for {
		select {
		case o := <-ch:
			lo := o.Data.(raft.LeaderObservation)
			if lo.LeaderID != "" && lo.LeaderID != last {
				n.metrics.leaderChanges.Inc()
			}
			last = lo.LeaderID
		case <-n.closing:
			return
		}
	}
}

// nodeCollector reads the node's state when the registry is gathered.
type nodeCollector struct {
	n *Node

	keysHeld, waiters, lastToken, pending, proposalQueue, conns, serving *prometheus.Desc
	semaphores, permitsHeld                                              *prometheus.Desc
	raftState, term, commit, applied, lastIndex, leaderKnown, members    *prometheus.Desc
	snapSize, snapIndex                                                  *prometheus.Desc
	authFailures, limitRefusals, closes, info                            *prometheus.Desc
}

func newNodeCollector(n *Node) *nodeCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &nodeCollector{
		n:             n,
		keysHeld:      d("ticketing_node_keys_held", "Keys held in this node's applied lock table."),
		semaphores:    d("ticketing_node_semaphores", "Keys defined as semaphores in this node's applied lock table."),
		permitsHeld:   d("ticketing_node_permits_held", "Semaphore permits held in this node's applied lock table, over all semaphores."),
		waiters:       d("ticketing_node_waiters", "Queued waiters over all keys in this node's applied lock table (queue depth)."),
		lastToken:     d("ticketing_node_last_token", "The highest fencing token this node has applied."),
		pending:       d("ticketing_node_pending_requests", "Client requests whose reply this node owes (proposed, or queued waiters)."),
		proposalQueue: d("ticketing_node_proposal_queue", "Commands waiting for the next batch to be proposed to Raft."),
		conns:         d("ticketing_node_client_connections", "Open client-port connections."),
		serving:       d("ticketing_node_serving", "1 while this node is the leader and serves lock requests."),
		raftState:     d("ticketing_node_raft_state", "1 for this node's current Raft state, 0 for the others.", "state"),
		term:          d("ticketing_node_raft_term", "Current Raft term."),
		commit:        d("ticketing_node_raft_commit_index", "Raft commit index known to this node."),
		applied:       d("ticketing_node_raft_applied_index", "Raft index applied to this node's state machine."),
		lastIndex:     d("ticketing_node_raft_last_log_index", "Last index in this node's Raft log (or snapshot)."),
		leaderKnown:   d("ticketing_node_raft_leader_known", "1 while this node knows a Raft leader (itself included)."),
		members:       d("ticketing_node_raft_members", "Servers in the latest Raft configuration, by suffrage.", "suffrage"),
		snapSize:      d("ticketing_node_snapshot_size_bytes", "Size of the newest snapshot in this node's snapshot store (written or installed); 0 without one."),
		snapIndex:     d("ticketing_node_snapshot_index", "Raft index of the newest snapshot in this node's snapshot store; 0 without one."),
		authFailures:  d("ticketing_node_auth_failures_total", "Failed admissions (TLS, authentication handshake, handshake timeout), by port; client includes the admin port.", "port"),
		limitRefusals: d("ticketing_node_limit_refusals_total", "Connections or requests refused by a limit: handshakes_per_ip (MaxHandshakesPerIP), connections (MaxClientConns), in_flight (MaxInFlightPerConn), keys (MaxKeys), waiters_per_key (MaxWaitersPerKey), waiters_per_conn (MaxWaitersPerConn), sessions (MaxSessions), session_outcomes (MaxSessionOutcomes).", "limit"),
		closes:        d("ticketing_node_connection_closes_total", "Client connections this node cut off, by reason: idle (IdleTimeout), slow_consumer (MaxReplyBacklog), protocol_error.", "reason"),
		info:          d("ticketing_node_info", "Constant 1, labelled with this node's identity.", "node_id", "server_id", "cluster_id"),
	}
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.keysHeld, c.semaphores, c.permitsHeld, c.waiters, c.lastToken, c.pending, c.proposalQueue, c.conns, c.serving,
		c.raftState, c.term, c.commit, c.applied, c.lastIndex, c.leaderKnown, c.members, c.snapSize, c.snapIndex,
		c.authFailures, c.limitRefusals, c.closes, c.info} {
		ch <- d
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	gauge(c.info, 1, n.cfg.NodeID, n.serverID, n.cfg.ClusterID)

	var held, waiting, sems, permits int
	var last uint64
	n.fsm.read(func(st *locksm.State) {
		held, waiting, last = st.NumHeld(), st.NumWaiting(), st.LastToken()
		sems, permits = st.NumSemaphores(), st.NumPermitsHeld()
	})
	gauge(c.keysHeld, float64(held))
	gauge(c.semaphores, float64(sems))
	gauge(c.permitsHeld, float64(permits))
	gauge(c.waiters, float64(waiting))
	gauge(c.lastToken, float64(last))

	n.mu.Lock()
	pending, conns, serving := n.core.Owed(), len(n.conns), n.core.Serving()
	n.mu.Unlock()
	n.propMu.Lock()
	queued := len(n.propQ) + len(n.houseQ)
	n.propMu.Unlock()
	gauge(c.pending, float64(pending))
	gauge(c.proposalQueue, float64(queued))
	gauge(c.conns, float64(conns))
	gauge(c.serving, b(serving))

	r := n.raft
	state := r.State()
	for _, s := range []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown} {
		gauge(c.raftState, b(s == state), stateName(s))
	}
	gauge(c.term, float64(r.CurrentTerm()))
	gauge(c.commit, float64(r.CommitIndex()))
	gauge(c.applied, float64(r.AppliedIndex()))
	gauge(c.lastIndex, float64(r.LastIndex()))
	_, lid := r.LeaderWithID()
	gauge(c.leaderKnown, b(lid != ""))
	var voters, nonvoters int
	if fut := r.GetConfiguration(); fut.Error() == nil {
		for _, s := range fut.Configuration().Servers {
			if s.Suffrage == raft.Voter {
				voters++
			} else {
				nonvoters++
			}
		}
	}
	gauge(c.members, float64(voters), "voter")
	gauge(c.members, float64(nonvoters), "nonvoter")

	var size int64
	var index uint64
	if metas, err := n.snaps.List(); err == nil && len(metas) > 0 {
		size, index = metas[0].Size, metas[0].Index // newest first
	}
	gauge(c.snapSize, float64(size))
	gauge(c.snapIndex, float64(index))

	st := n.Stats()
	counter(c.authFailures, st.ClientAuthFailures, "client")
	counter(c.authFailures, st.PeerAuthFailures, "peer")
	counter(c.limitRefusals, st.GateRefusals, "handshakes_per_ip")
	counter(c.limitRefusals, st.ConnLimitRefusals, "connections")
	counter(c.limitRefusals, st.InFlightRefusals, "in_flight")
	counter(c.limitRefusals, st.KeyLimitRefusals, "keys")
	counter(c.limitRefusals, st.WaiterLimitRefusals, "waiters_per_key")
	counter(c.limitRefusals, st.ConnWaiterLimitRefusals, "waiters_per_conn")
	counter(c.limitRefusals, st.SessionLimitRefusals, "sessions")
	counter(c.limitRefusals, st.OutcomeLimitRefusals, "session_outcomes")
	counter(c.closes, st.IdleCloses, "idle")
	counter(c.closes, st.SlowConsumerCloses, "slow_consumer")
	counter(c.closes, st.ProtocolErrorCloses, "protocol_error")
}

func stateName(s raft.RaftState) string {
	switch s {
	case raft.Follower:
		return "follower"
	case raft.Candidate:
		return "candidate"
	case raft.Leader:
		return "leader"
	}
	return "shutdown"
}
