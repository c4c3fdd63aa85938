package sidecar

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"ticketing/cluster/client"
	"ticketing/cluster/obs"
)

// Metrics. Every Broker has its own registry (MetricsRegistry). Outcomes
// are counted once per call, where Acquire returns and where a release
// job finishes; gauges are read when the registry is gathered. The
// docs/operations.md, "Metrics and health", lists them.

// acquireResult is the result label of ticketing_sidecar_acquires_total.
type acquireResult uint8

const (
	acqGranted acquireResult = iota
	acqBusy
	acqTimeout
	acqIndeterminate
	acqUnavailable
	acqMoved
	acqCancelled
	acqTooManyWaiters
	acqError
	numAcquireResults
)

var acquireResultNames = [numAcquireResults]string{
	acqGranted: "granted", acqBusy: "busy", acqTimeout: "timeout", acqIndeterminate: "indeterminate",
	acqUnavailable: "unavailable", acqMoved: "moved", acqCancelled: "cancelled",
	acqTooManyWaiters: "too_many_waiters", acqError: "error",
}

func classifyAcquire(err error) acquireResult {
	switch {
	case err == nil:
		return acqGranted
	case errors.Is(err, ErrBusy):
		return acqBusy
	case errors.Is(err, ErrTimeout):
		return acqTimeout
	case errors.Is(err, ErrIndeterminate):
		return acqIndeterminate
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrClosed):
		return acqUnavailable
	case errors.Is(err, ErrMoved):
		return acqMoved
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return acqCancelled
	case errors.Is(err, ErrTooManyWaiters):
		return acqTooManyWaiters
	}
	return acqError
}

// releaseResult is the result label of the release and compensation
// counters.
type releaseResult uint8

const (
	relOK releaseResult = iota
	relNotHeld
	relIndeterminate
	relError
	numReleaseResults
)

var releaseResultNames = [numReleaseResults]string{
	relOK: "ok", relNotHeld: "not_held", relIndeterminate: "indeterminate", relError: "error",
}

func classifyRelease(err error) releaseResult {
	switch {
	case err == nil:
		return relOK
	case errors.Is(err, ErrIndeterminate):
		return relIndeterminate
	case releaseGone(err):
		return relNotHeld
	}
	return relError
}

type brokerMetrics struct {
	reg      *prometheus.Registry
	acquires [numAcquireResults]prometheus.Counter
	releases [numReleaseResults]prometheus.Counter
	extends  [numReleaseResults]prometheus.Counter
	// lost counts the holdings watchers were told they lost, by reason
	// (index LostExpired, LostMoved, LostCompensated, LostRevoked); lostEvents the nodes' lost events
	// received (also those for tokens nobody here watches).
	lost           [LostRevoked + 1]prometheus.Counter
	lostEvents     prometheus.Counter
	compensations  [numReleaseResults]prometheus.Counter
	acquireLatency prometheus.Observer
	releaseLatency prometheus.Observer
	lateGrants     prometheus.Counter
	leaderChanges  prometheus.Counter
	dialFailures   prometheus.Counter
	unservedConns  prometheus.Counter
	waiterRefusals [numWaiterRefusals]prometheus.Counter
	evictions      prometheus.Counter
	// The cluster session (session.go).
	sessionResumes prometheus.Counter
	sessionAnswers *prometheus.CounterVec
	sessionsLost   prometheus.Counter
	voidResent     prometheus.Counter
}

// waiterRefusal is the reason label of ticketing_sidecar_waiter_refusals_total.
type waiterRefusal uint8

const (
	refusedSidecarFull waiterRefusal = iota
	refusedPerSession
	refusedNoRoomFreed
	numWaiterRefusals
)

var waiterRefusalNames = [numWaiterRefusals]string{
	refusedSidecarFull: "sidecar_full", refusedPerSession: "per_session", refusedNoRoomFreed: "no_room_freed",
}

func newBrokerMetrics(b *Broker) *brokerMetrics {
	m := &brokerMetrics{reg: prometheus.NewRegistry()}
	acq := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_sidecar_acquires_total",
		Help: "Acquire calls, by outcome: granted, busy, timeout, indeterminate, unavailable (no serving leader reached; nothing sent), moved, cancelled (the caller gave up), too_many_waiters (no waiter room, or evicted to make room), error (a definite error).",
	}, []string{"result"})
	for r := range numAcquireResults {
		m.acquires[r] = acq.WithLabelValues(acquireResultNames[r])
	}
	rel := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_sidecar_releases_total",
		Help: "Release calls, by final outcome (after retries): ok, not_held (the holding had ended), indeterminate, error.",
	}, []string{"result"})
	for r := range numReleaseResults {
		m.releases[r] = rel.WithLabelValues(releaseResultNames[r])
	}
	ext := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_sidecar_extends_total",
		Help: "Extend calls (lease renewals), by final outcome (after retries): ok, not_held (the holding had ended), indeterminate (no definite reply within the deadline: the holder counts on the earlier of the previous end and the extend's start + the new lease), error.",
	}, []string{"result"})
	for r := range numReleaseResults {
		m.extends[r] = ext.WithLabelValues(releaseResultNames[r])
	}
	lost := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_sidecar_locks_lost_total",
		Help: "Held locks whose watchers were told they ended without their holder's release, by reason: expired (the leader's lost event), moved (an extend was refused as not held), compensated (the broker closed while they were held, and releases them), revoked (an operator revoked them: the leader's lost event). The lost lines the unix API writes (compensated included) are counted in ticketing_sidecar_local_lost_events_total.",
	}, []string{"reason"})
	for _, r := range LostReasons {
		m.lost[r] = lost.WithLabelValues(r.String())
	}
	m.lostEvents = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_sidecar_lost_events_total",
		Help: "Lost events (a holding's expiry or an operator's revoke) received from the nodes, including those for tokens no watcher here holds.",
	})
	comp := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_sidecar_compensations_total",
		Help: "Compensating releases (locks whose user went away, grants that arrived after the caller gave up), by outcome as for releases.",
	}, []string{"result"})
	for r := range numReleaseResults {
		m.compensations[r] = comp.WithLabelValues(releaseResultNames[r])
	}
	al := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ticketing_sidecar_acquire_duration_seconds",
		Help:    "Granted acquires: from the call to the grant (finding the leader and the wait included).",
		Buckets: obs.LatencyBuckets,
	})
	rl := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ticketing_sidecar_release_duration_seconds",
		Help:    "Successful releases: from the call to the confirmation (queueing and retries included).",
		Buckets: obs.LatencyBuckets,
	})
	m.acquireLatency, m.releaseLatency = al, rl
	m.lateGrants = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_sidecar_late_grants_total",
		Help: "Grants that arrived after their caller gave up (cancelled, or no reply in time); each is released by a compensation.",
	})
	m.leaderChanges = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_sidecar_leader_changes_total",
		Help: "Times the broker learned of a new serving leader.",
	})
	m.dialFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_sidecar_connect_failures_total",
		Help: "Failed connection attempts to cluster nodes (dial, TLS, authentication, wrong fencing domain).",
	})
	m.unservedConns = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_sidecar_unserved_connections_total",
		Help: "Connections to cluster nodes that ended before the node sent anything and within 1 s of the handshake (a node that accepts and drops); the reconnect backoff grows after them as after a failed dial.",
	})
	wr := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_sidecar_waiter_refusals_total",
		Help: "Acquires with a wait refused waiter room (answered too_many_waiters, nothing sent), by reason: sidecar_full (the sidecar-wide room is full and the asking session holds the most), per_session (MaxWaitersPerSession), no_room_freed (an eviction did not free room in time).",
	}, []string{"reason"})
	for r := range numWaiterRefusals {
		m.waiterRefusals[r] = wr.WithLabelValues(waiterRefusalNames[r])
	}
	m.evictions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_sidecar_waiter_evictions_total",
		Help: "Waiters of the session holding the most waiter room evicted (cancelled, answered too_many_waiters unless granted first) to make room for a session holding less.",
	})
	m.sessionResumes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_sidecar_session_resumes_total",
		Help: "Resumes of the broker's cluster session answered by a serving leader (after a lost connection or a leader change).",
	})
	m.sessionAnswers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ticketing_sidecar_session_resumed_requests_total",
		Help: "Written requests without a reply that a resume answered, by answer: outcome (the recorded reply), queued (still in the line), void (never applied: sent again as a new request if its caller still waits).",
	}, []string{"answer"})
	m.sessionsLost = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_sidecar_sessions_lost_total",
		Help: "Cluster sessions given up (not resumed within their timeout, or refused: expired); their requests without a reply were indeterminate.",
	})
	m.voidResent = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ticketing_sidecar_void_acquires_resent_total",
		Help: "Acquires a resume reported void (never applied) and sent again as new requests because their callers still waited.",
	})
	m.reg.MustRegister(acq, rel, ext, lost, m.lostEvents, comp, al, rl, m.lateGrants, m.leaderChanges, m.dialFailures, m.unservedConns, wr, m.evictions,
		m.sessionResumes, m.sessionAnswers, m.sessionsLost, m.voidResent, &brokerCollector{b: b,
			connected: prometheus.NewDesc("ticketing_sidecar_connected_nodes",
				"Cluster nodes this broker has a live connection to.", nil, nil),
			configured: prometheus.NewDesc("ticketing_sidecar_configured_nodes",
				"Cluster node addresses this broker was given.", nil, nil),
			leaderKnown: prometheus.NewDesc("ticketing_sidecar_leader_known",
				"1 while the broker knows a serving leader and is connected to it.", nil, nil),
			releaseQueue: prometheus.NewDesc("ticketing_sidecar_release_queue",
				"Releases and compensations waiting for a release worker.", nil, nil),
			inFlight: prometheus.NewDesc("ticketing_sidecar_acquires_in_flight",
				"Acquires sent and in flight to commit (neither queued at the node nor answered): each holds a slot of the connection's in-flight budget.", nil, nil),
			unsent: prometheus.NewDesc("ticketing_sidecar_acquires_unsent",
				"Acquires waiting in the broker to be sent (no serving leader yet, or the in-flight budget is used up); nothing of them is written.", nil, nil),
			waiters: prometheus.NewDesc("ticketing_sidecar_waiters",
				"Acquires with a wait holding waiter room (queued at the node or on their way).", nil, nil),
			waitersLimit: prometheus.NewDesc("ticketing_sidecar_waiters_limit",
				"The sidecar-wide waiter room (MaxWaiters, or the node's bound).", nil, nil),
			sessions: prometheus.NewDesc("ticketing_sidecar_sessions",
				"Sessions (owners) with acquires in the broker.", nil, nil),
			clusterSession: prometheus.NewDesc("ticketing_sidecar_session_attached",
				"1 while the broker's cluster session is attached to the serving leader; 0 without one or while resuming.", nil, nil),
			sessionHeld: prometheus.NewDesc("ticketing_sidecar_session_held_requests",
				"Written requests of the cluster session waiting for a resume to answer them.", nil, nil),
		})
	return m
}

func (m *brokerMetrics) acquired(err error, start time.Time) {
	r := classifyAcquire(err)
	m.acquires[r].Inc()
	if r == acqGranted {
		m.acquireLatency.Observe(time.Since(start).Seconds())
	}
}

// extended counts an extend's final outcome.
func (m *brokerMetrics) extended(_ *releaseJob, err error) { m.extends[classifyRelease(err)].Inc() }

func (m *brokerMetrics) released(job *releaseJob, err error) {
	r := classifyRelease(err)
	if job.done == nil {
		m.compensations[r].Inc()
		return
	}
	m.releases[r].Inc()
	if r == relOK {
		m.releaseLatency.Observe(time.Since(job.start).Seconds())
	}
}

type brokerCollector struct {
	b                                                 *Broker
	connected, configured, leaderKnown, releaseQueue  *prometheus.Desc
	inFlight, unsent, waiters, waitersLimit, sessions *prometheus.Desc
	clusterSession, sessionHeld                       *prometheus.Desc
}

// sessionResumed counts one resume's answer.
func (m *brokerMetrics) sessionResumed(n client.ResumeCounts) {
	m.sessionResumes.Inc()
	m.sessionAnswers.WithLabelValues("outcome").Add(float64(n.Outcomes))
	m.sessionAnswers.WithLabelValues("queued").Add(float64(n.Queued))
	m.sessionAnswers.WithLabelValues("void").Add(float64(n.Void))
}

func (c *brokerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.connected, c.configured, c.leaderKnown, c.releaseQueue,
		c.inFlight, c.unsent, c.waiters, c.waitersLimit, c.sessions, c.clusterSession, c.sessionHeld} {
		ch <- d
	}
}

func (c *brokerCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.b
	b.mu.Lock()
	connected := map[string]bool{}
	for _, s := range b.slots {
		if s.conn != nil {
			connected[s.addr] = true
		}
	}
	known := b.leader != "" && connected[b.leader]
	attached, held := 0.0, 0
	if si := b.sessionInfoLocked(); si != nil {
		held = si.Held
		if b.sconn != nil {
			attached = 1
		}
	}
	b.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.clusterSession, prometheus.GaugeValue, attached)
	ch <- prometheus.MustNewConstMetric(c.sessionHeld, prometheus.GaugeValue, float64(held))
	leader := 0.0
	if known {
		leader = 1
	}
	ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, float64(len(connected)))
	ch <- prometheus.MustNewConstMetric(c.configured, prometheus.GaugeValue, float64(len(b.cfg.Addrs)))
	ch <- prometheus.MustNewConstMetric(c.leaderKnown, prometheus.GaugeValue, leader)
	ch <- prometheus.MustNewConstMetric(c.releaseQueue, prometheus.GaugeValue, float64(b.releaseQueueLen()))
	b.qmu.Lock()
	inFlight := 0
	for _, n := range b.inflight {
		inFlight += n
	}
	unsent, waiters, limit, sessions := b.sc.pendingN, b.sc.waiters, b.sc.maxWaiters, len(b.sc.sessions)
	b.qmu.Unlock()
	for _, v := range []struct {
		d *prometheus.Desc
		n int
	}{{c.inFlight, inFlight}, {c.unsent, unsent}, {c.waiters, waiters}, {c.waitersLimit, limit}, {c.sessions, sessions}} {
		ch <- prometheus.MustNewConstMetric(v.d, prometheus.GaugeValue, float64(v.n))
	}
}

// MetricsRegistry is this broker's Prometheus registry (its own, never the
// global default one). The sidecar command adds its unix-socket gauges.
func (b *Broker) MetricsRegistry() *prometheus.Registry { return b.metrics.reg }

// Ready says whether the broker can take requests now: nil when it knows a
// serving leader and has a connection to it, else the reason (one line).
func (b *Broker) Ready() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return ErrClosed
	case b.leader == "":
		n := 0
		for _, s := range b.slots {
			if s.conn != nil {
				n++
			}
		}
		if n == 0 {
			return errors.New("no connection to any cluster node")
		}
		return errors.New("no serving leader known")
	case !b.connectedLocked(b.leader):
		return errors.New("not connected to the leader " + b.leader)
	}
	return nil
}
