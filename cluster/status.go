package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Status and reports: everything a node tells about itself, read-only and
// in this file (the reports' types are the admin protocol's JSON,
// wire.StatusReport and wire.KeyReport, in cluster/wire/admin_json.go). For
// clients, the status and members replies of the client port ('s', 'm';
// status, membersReply). For operators, StatusReport and Inspect (the
// admin ops "status" and "inspect", `ticketing status` and
// `inspect`, and the HTTP endpoint ReportHandler), Ready (/readyz) and the
// refusal counters (Stats). Every node can answer from its own applied
// state; only the leader knows its followers' lag and the lease and wait
// timers it runs, so those parts are exact only on the leader.
//
// Times. The state machine records, per holder, the leader's wall clock
// (Unix ms) stamped into the command that granted it (GrantedAt), and per
// waiter the stamp of its acquire (EnqueuedAt). It does not record any
// deadline: the leader runs lease and wait timers on its monotonic clock.
// So a remaining time is reported with its source:
//
//   - "leader_timer" (wire.FromLeaderTimer): this node leads and read the
//     deadline it will act on (the armed lease timer of the holding; the
//     wait deadline of the request, which runs from when the leader read
//     it). Exact up to the commit of the expiry or cancel it will then
//     propose.
//   - "clock_estimate" (wire.FromClockEstimate): stamp + lease (or +
//     wait) minus this node's wall clock. An estimate: the stamp comes
//     from the leader's clock, and after a leader change the new leader
//     gives every holder a full lease from the moment it serves, so the
//     real deadline is later than this estimate for holdings granted under
//     an earlier leader. Waiters without a session do not survive a leader
//     change (the new leader drops them); a session's waiter does, and a
//     new leader re-arms its wait from its replicated stamp, so the
//     estimate holds for it too (up to the leaders' clock skew).
//
// Held and waited times (HeldMs, WaitedMs) are this node's wall clock minus
// the leader's stamp, on every node.

// MaxInspectQueue bounds the waiters one wire.KeyReport lists (QueueLen counts
// them all).
const MaxInspectQueue = 1000

// MaxReportSessions bounds the sessions one wire.StatusReport lists
// (SessionsTotal counts them all).
const MaxReportSessions = 1000

// sessionHex writes a session id as the sidecar does (INFO's session=,
// its logs): lower-case hex; "" for no session.
func sessionHex(id uint64) string {
	if id == 0 {
		return ""
	}
	return strconv.FormatUint(id, 16)
}

// reportLagWait bounds the wait for the members' lag and health in a
// StatusReport (each member is asked concurrently, over the peer port).
const reportLagWait = 3 * time.Second

// role names this node's Raft role for reports.
func (n *Node) role() string {
	switch n.raft.State() {
	case raft.Leader:
		return "leader"
	case raft.Candidate:
		return "candidate"
	case raft.Shutdown:
		return "shutdown"
	}
	return "follower"
}

// StatusReport describes this node, from its local state. Members' lag and
// health are filled only when this node leads (each asked concurrently over
// the peer port, within reportLagWait); it is read-only and safe on any
// node.
func (n *Node) StatusReport() wire.StatusReport {
	_, leader := n.raft.LeaderWithID()
	r := wire.StatusReport{
		ServerID:       n.serverID,
		Role:           n.role(),
		Serving:        n.Serving(),
		Term:           n.raft.CurrentTerm(),
		Leader:         string(leader),
		Domain:         n.fsm.getDomain(),
		ClusterVersion: n.fsm.getClusterVersion(),
		ClusterID:      n.cfg.ClusterID,
		CommitIndex:    n.raft.CommitIndex(),
		AppliedIndex:   n.raft.AppliedIndex(),
	}
	if leader != "" {
		r.LeaderClientAddr = n.fsm.clientAddr(string(leader))
	}
	var ids []uint64 // of r.Sessions
	n.mu.Lock()
	n.fsm.read(func(st *locksm.State) {
		r.KeysHeld, r.Waiters, r.LastToken = st.NumHeld(), st.NumWaiting(), st.LastToken()
		r.SessionsTotal = st.NumSessions()
		all := st.Sessions()
		if len(all) > MaxReportSessions {
			all, r.SessionsTruncated = all[:MaxReportSessions], true
		}
		for _, id := range all {
			if si, ok := st.Session(id); ok {
				ids = append(ids, id)
				r.Sessions = append(r.Sessions, wire.SessionReport{ID: sessionHex(id), TimeoutMs: si.TimeoutMs,
					OpenedAtUnixMs: si.OpenedAt, Resumes: si.Epoch, Waiters: si.Waiters, Holdings: si.Holdings, Outcomes: si.Outcomes})
			}
		}
	})
	if leading, _ := n.core.Leading(); leading && n.core.Serving() {
		mono := time.Now()
		for i := range r.Sessions {
			sr := &r.Sessions[i]
			lv, ok := n.core.SessionLiveness(ids[i])
			if !ok {
				continue // opened after the read above, or being adopted
			}
			attached := lv.Attached
			sr.Attached, sr.Expiring = &attached, lv.Expiring
			if !lv.Attached && !lv.ExpiresAt.IsZero() {
				left := max(0, lv.ExpiresAt.Sub(mono).Milliseconds())
				sr.ExpiresInMs = &left
			}
		}
	}
	n.mu.Unlock()
	ms, err := n.Members()
	if err != nil {
		r.MembersError = err.Error()
	}
	r.Members = make([]wire.MemberReport, 0, len(ms))
	var hs map[string]health
	commit := r.CommitIndex
	if r.Role == "leader" {
		hs = n.probe(ms, reportLagWait)
		commit = n.raft.CommitIndex()
	}
	for _, m := range ms {
		mr := wire.MemberReport{ServerID: m.ServerID, Voter: m.Voter, Leader: m.Leader,
			PeerAddr: m.PeerAddr, ClientAddr: m.ClientAddr}
		if hs != nil {
			h := hs[m.ServerID]
			answers := h.answers
			mr.Answers, mr.FoundAtAddr = &answers, h.found
			if h.answers {
				lag := commit - min(commit, h.applied)
				mr.Lag = &lag
			}
		}
		r.Members = append(r.Members, mr)
		if m.ServerID == n.serverID && !m.Voter && r.Role == "follower" {
			r.Role = "learner"
		}
	}
	r.AtUnixMs = n.cfg.Now().UnixMilli()
	return r
}

// primaryKey is the key a block's timers and pending request are filed
// under (its first), or key itself for a single key (blockKeys nil).
func primaryKey(key string, blockKeys []string) string {
	if len(blockKeys) > 0 {
		return blockKeys[0]
	}
	return key
}

// Inspect describes key from this node's applied state: its holder and its
// queue, head first (at most MaxInspectQueue waiters listed). On the
// leader, remaining lease and wait times come from its own timers; on other
// nodes they are estimates from the leader's stamps and this node's clock
// (see the top of this file). A key that is not held is reported with Held
// false. An invalid key is an error wrapping locksm.ErrInvalidKey.
func (n *Node) Inspect(key string) (wire.KeyReport, error) {
	if err := locksm.ValidateKey(key); err != nil {
		return wire.KeyReport{}, fmt.Errorf("%w: %q", err, key)
	}
	_, leader := n.raft.LeaderWithID()
	r := wire.KeyReport{Key: key, ServerID: n.serverID, Role: n.role(), Leader: string(leader), Queue: []wire.WaiterReport{}}
	var (
		h        locksm.Holder
		permits  []locksm.Holder // a semaphore's, slot order
		permExt  []time.Time     // the leader's deadlines of extended permits (zero: none)
		ws       []locksm.Waiter
		wlabels  []string    // the labels of ws ("" for none)
		waitDL   []time.Time // the leader's wait deadlines, per listed waiter (zero: unknown)
		leading  bool
		epoch    uint64
		extUntil time.Time // the leader's deadline of an extended holding
		extended bool
	)
	n.mu.Lock()
	n.fsm.read(func(st *locksm.State) {
		h, r.Held = st.Holder(key)
		if sem, ok := st.Semaphore(key); ok {
			r.Semaphore = &wire.SemaphoreReport{Permits: sem.Permits, Held: sem.Held}
			permits = st.PermitHolders(key)
			if len(permits) > MaxInspectQueue {
				permits, r.PermitsTruncated = permits[:MaxInspectQueue], true
			}
		}
		r.Reserved = st.Reserved(key)
		if rv, ok := st.LastRevoke(key); ok {
			r.LastRevoke = revokeReport(rv)
		}
		r.QueueLen = st.QueueLen(key)
		if r.QueueLen > 0 {
			ws = st.Waiters(key)
			if len(ws) > MaxInspectQueue {
				ws, r.QueueTruncated = ws[:MaxInspectQueue], true
			}
			wlabels = make([]string, len(ws))
			for i, w := range ws {
				wlabels[i] = st.WaiterLabel(key, w)
			}
		}
	})
	leading, epoch = n.core.Leading()
	if r.Held && leading {
		extUntil, extended = n.core.ExtendedUntil(h.Token)
	}
	if leading && len(permits) > 0 {
		permExt = make([]time.Time, len(permits))
		for i, p := range permits {
			permExt[i], _ = n.core.ExtendedUntil(p.Token)
		}
	}
	if leading {
		// Every queued waiter is a request in this leader's pending
		// table: queued by it, or a session's waiter adopted when it
		// started serving (a new leader drops the others).
		waitDL = make([]time.Time, len(ws))
		for i, w := range ws {
			if dl, ok := n.core.WaitDeadline(w.Ref, primaryKey(key, w.Keys)); ok {
				waitDL[i] = dl
			}
		}
	}
	n.mu.Unlock()
	mono := time.Now()
	nowMs := n.cfg.Now().UnixMilli()
	r.AtUnixMs = nowMs
	holderReport := func(h locksm.Holder, extUntil time.Time, extended bool) *wire.HolderReport {
		hr := &wire.HolderReport{Owner: h.Owner, Token: h.Token, LeaseSec: h.LeaseSec, GrantedAtUnixMs: h.GrantedAt,
			RenewedAtUnixMs: h.RenewedAt, HeldMs: max(0, nowMs-h.GrantedAt)}
		hr.LeaseRemainingMs = max(0, h.LeaseEnd()-nowMs)
		hr.LeaseFrom = wire.FromClockEstimate
		switch {
		case extended:
			// The newest extend's timer decides; older ones are superseded.
			hr.LeaseRemainingMs = max(0, extUntil.Sub(mono).Milliseconds())
			hr.LeaseFrom = wire.FromLeaderTimer
		case leading && n.timers != nil:
			// Not found: the timer fired and the expiry is on its way, or
			// the grant is applied but its timer not armed yet; the
			// estimate covers both.
			if at, ok := n.timers.expiryOf(primaryKey(key, h.Keys), h.Token, epoch); ok {
				hr.LeaseRemainingMs = max(0, at.Sub(mono).Milliseconds())
				hr.LeaseFrom = wire.FromLeaderTimer
			}
		}
		hr.LeaseEndsAtUnixMs = nowMs + hr.LeaseRemainingMs
		hr.BlockKeys, hr.Session, hr.Label = h.Keys, sessionHex(h.Session), h.Label
		if h.Permit {
			slot := h.Slot
			hr.Slot = &slot
		}
		return hr
	}
	if r.Held {
		r.Holder = holderReport(h, extUntil, extended)
	}
	for i, p := range permits {
		var until time.Time
		if permExt != nil {
			until = permExt[i]
		}
		r.Permits = append(r.Permits, *holderReport(p, until, !until.IsZero()))
	}
	for i, w := range ws {
		wr := wire.WaiterReport{Position: i + 1, Owner: w.Owner, Ref: w.Ref, LeaseSec: w.LeaseSec, WaitMs: w.WaitMs,
			EnqueuedAtUnixMs: w.EnqueuedAt, WaitedMs: max(0, nowMs-w.EnqueuedAt),
			WaitRemainingMs: max(0, w.EnqueuedAt+int64(w.WaitMs)-nowMs), WaitFrom: wire.FromClockEstimate, BlockKeys: w.Keys,
			Session: sessionHex(w.Session), Label: wlabels[i]}
		if waitDL != nil && !waitDL[i].IsZero() {
			wr.WaitRemainingMs = max(0, waitDL[i].Sub(mono).Milliseconds())
			wr.WaitFrom = wire.FromLeaderTimer
		}
		r.Queue = append(r.Queue, wr)
	}
	return r, nil
}

// ReportHandler serves StatusReport and Inspect as read-only JSON, for the
// node's --metrics-addr listener: GET /v1/status and GET /v1/keys/KEY (a
// free key is a report with held false; an invalid key is 400).
func (n *Node) ReportHandler() http.Handler {
	mux := http.NewServeMux()
	writeJSON := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
	}
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, n.StatusReport())
	})
	mux.HandleFunc("GET /v1/keys/{key...}", func(w http.ResponseWriter, r *http.Request) {
		rep, err := n.Inspect(r.PathValue("key"))
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, locksm.ErrInvalidKey) {
				code = http.StatusBadRequest
			}
			writeJSON(w, code, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, rep)
	})
	return mux
}

// status builds a status reply (without its id).
func (n *Node) status() wire.Msg {
	st := wire.Msg{Type: wire.TypeStatusR, NodeID: n.serverID}
	switch n.raft.State() {
	case raft.Leader:
		st.Role = wire.RoleLeader
	case raft.Follower:
		st.Role = wire.RoleFollower
	case raft.Candidate:
		st.Role = wire.RoleCandidate
	case raft.Shutdown:
		st.Role = wire.RoleShutdown
	}
	st.Term = n.raft.CurrentTerm()
	st.Commit = n.raft.CommitIndex()
	st.Applied = n.raft.AppliedIndex()
	// leader_addr is where requests are served right now: a leader that is
	// still preparing (barrier, dropping orphaned waiters) or handing its
	// leadership over leaves it empty. (Unlike M, status names Raft's
	// leader, never a hand-over's target: an older client takes a status
	// naming the node itself with an address for "serving".)
	var addr, id string
	if _, lid := n.raft.LeaderWithID(); lid != "" {
		id = string(lid)
		switch {
		case id != n.serverID:
			addr = n.fsm.clientAddr(id)
		case n.Serving():
			addr = n.advertise
		}
	}
	st.LeaderAddr, st.LeaderID = addr, id
	n.fsm.read(func(s *locksm.State) {
		st.LastToken = s.LastToken()
		st.Held = uint64(s.NumHeld())
		st.Waiting = uint64(s.NumWaiting())
	})
	return st
}

// membersReply builds a members reply (without its id): this node's view
// of the configuration, as many members as fit in one frame (a cluster has
// at most 5 voters and a learner or two, far below that).
func (n *Node) membersReply() wire.Msg {
	r := wire.Msg{Type: wire.TypeMembersR}
	ms, err := n.Members()
	if err != nil {
		return r
	}
	size := 1 + 8 + 1
	for _, m := range ms {
		mb := wire.Member{ServerID: m.ServerID, ClientAddr: m.ClientAddr, Suffrage: wire.SuffrageLearner}
		if m.Voter {
			mb.Suffrage = wire.SuffrageVoter
		}
		if len(mb.ClientAddr) > 255 {
			mb.ClientAddr = ""
		}
		if size += 1 + len(mb.ServerID) + 1 + 1 + len(mb.ClientAddr); size > wire.MaxFrameLenV4 {
			break
		}
		r.Members = append(r.Members, mb)
	}
	return r
}

// Ready says whether this node should receive client traffic: nil when it
// is the serving leader, or a member (voter or learner) of a configuration
// with a known leader (it then sends clients there with M); otherwise the
// reason, one line. Load balancers and orchestrators poll it (/readyz).
func (n *Node) Ready() error {
	n.mu.Lock()
	closed, serving := n.closed, n.core.Serving()
	n.mu.Unlock()
	switch {
	case closed:
		return errors.New("node closed")
	case serving:
		return nil
	}
	switch n.raft.State() {
	case raft.Leader:
		return errors.New("leader, not serving yet (applying earlier entries)")
	case raft.Candidate:
		return errors.New("candidate: an election is in progress")
	case raft.Shutdown:
		return errors.New("raft shut down")
	}
	fut := n.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return errors.New("no configuration: " + err.Error())
	}
	servers := fut.Configuration().Servers
	if len(servers) == 0 {
		return errors.New("not part of a cluster yet (bootstrap it, or add it as a learner)")
	}
	member := false
	for _, s := range servers {
		if string(s.ID) == n.serverID {
			member = true
			break
		}
	}
	if !member {
		return errors.New("not a member of the current configuration")
	}
	if _, id := n.raft.LeaderWithID(); id == "" {
		return errors.New("no known leader")
	}
	return nil
}

// Stats counts what a node refused or cut off. All counters only grow.
type Stats struct {
	ClientAuthFailures  uint64 // failed client-port admissions (TLS, handshake, timeout)
	PeerAuthFailures    uint64 // failed peer-port admissions
	GateRefusals        uint64 // connections refused: too many in admission from one IP
	ConnLimitRefusals   uint64 // client connections refused: MaxClientConns
	InFlightRefusals    uint64 // requests refused: MaxInFlightPerConn
	KeyLimitRefusals    uint64 // acquires refused: MaxKeys
	WaiterLimitRefusals uint64 // acquires refused: MaxWaitersPerKey
	// ConnWaiterLimitRefusals: acquires refused: MaxWaitersPerConn.
	ConnWaiterLimitRefusals uint64
	// SessionLimitRefusals: session opens refused: MaxSessions.
	SessionLimitRefusals uint64
	// OutcomeLimitRefusals: acquires refused: MaxSessionOutcomes.
	OutcomeLimitRefusals uint64
	IdleCloses           uint64 // connections closed after IdleTimeout
	SlowConsumerCloses   uint64 // connections closed: reply backlog above MaxReplyBacklog
	ProtocolErrorCloses  uint64 // connections closed after a protocol error
}

// nodeStats are the counters behind Stats, counted where each refusal
// happens.
type nodeStats struct {
	clientAuthFailures, peerAuthFailures, gateRefusals, connLimitRefusals atomic.Uint64
	inFlightRefusals, keyLimitRefusals, waiterLimitRefusals               atomic.Uint64
	connWaiterLimitRefusals, sessionLimitRefusals, outcomeLimitRefusals   atomic.Uint64
	idleCloses, slowConsumerCloses, protocolErrorCloses                   atomic.Uint64
}

// Stats returns the node's refusal counters.
func (n *Node) Stats() Stats {
	s := &n.stats
	return Stats{
		ClientAuthFailures: s.clientAuthFailures.Load(), PeerAuthFailures: s.peerAuthFailures.Load(),
		GateRefusals: s.gateRefusals.Load(), ConnLimitRefusals: s.connLimitRefusals.Load(),
		InFlightRefusals: s.inFlightRefusals.Load(), KeyLimitRefusals: s.keyLimitRefusals.Load(),
		WaiterLimitRefusals: s.waiterLimitRefusals.Load(), ConnWaiterLimitRefusals: s.connWaiterLimitRefusals.Load(),
		SessionLimitRefusals: s.sessionLimitRefusals.Load(), OutcomeLimitRefusals: s.outcomeLimitRefusals.Load(),
		IdleCloses:         s.idleCloses.Load(),
		SlowConsumerCloses: s.slowConsumerCloses.Load(), ProtocolErrorCloses: s.protocolErrorCloses.Load(),
	}
}

// revokeReport is rv as the admin port and the console show it.
func revokeReport(rv locksm.Revoke) *wire.RevokeReport {
	return &wire.RevokeReport{Key: rv.Key, Keys: slices.Clone(rv.Keys), Token: rv.Token, By: rv.Who, Reason: rv.Reason,
		AtUnixMs: rv.At, Owner: rv.Owner, Label: rv.Label, Permit: rv.Permit, Slot: rv.Slot}
}
