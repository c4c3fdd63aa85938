package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// The admin port (Config.AdminAddr) serves operator tools (`ticketing
// members`, `status`, `inspect`): the frames, operations and reply codes
// are cluster/wire's (admin.go there; PROTOCOL.md next to it is the
// contract), and so are the JSON request and reply (wire.AdminRequest,
// wire.AdminReply); the client is cluster/client's AdminDo and
// AdminCluster, and this file is the node's side: it answers each request
// before reading the next.

// serveAdmin answers one admin connection.
func (n *Node) serveAdmin(raw net.Conn) {
	defer n.wg.Done()
	defer raw.Close()
	done := make(chan struct{})
	defer close(done)
	go func() { // Close must not wait for an idle admin tool
		select {
		case <-n.closing:
			raw.Close()
		case <-done:
		}
	}()
	_ = raw.SetDeadline(time.Now().Add(n.cfg.HandshakeTimeout))
	c, binding, err := secureAccept(raw, n.cfg.ClientTLS)
	if err == nil {
		_, err = wire.ServerHandshake(c, wire.HandshakeConfig{Kind: wire.KindAdmin, Secret: n.cfg.AdminSecret,
			ClusterID: n.cfg.ClusterID, Domain: n.fsm.getDomain(), NodeID: n.serverID, ChannelBinding: binding})
	}
	if err != nil {
		n.stats.clientAuthFailures.Add(1)
		n.log.Warn("admin connection refused", "remote", raw.RemoteAddr().String(), "err", err)
		n.hold(n.cfg.AuthFailureDelay)
		return
	}
	r := wire.NewReader(c)
	for {
		_ = raw.SetDeadline(time.Now().Add(n.cfg.IdleTimeout))
		typ, payload, err := r.ReadFrame()
		if err != nil {
			return
		}
		var req wire.AdminRequest
		var rep wire.AdminReply
		if typ != wire.TypeAdminRequest || json.Unmarshal(payload, &req) != nil {
			rep = wire.AdminReply{Code: wire.AdminBadRequest, Error: "want a JSON admin request frame"}
		} else {
			rep = n.admin(req)
		}
		_, leader := n.raft.LeaderWithID()
		rep.Leader = string(leader)
		b := fitAdminReply(&rep)
		if err := wire.WriteFrame(c, wire.TypeAdminReply, b); err != nil {
			return
		}
		if req.Op == wire.AdminOpRevoke {
			// The request's side of the audit: who asked, from where,
			// and what came of it (the applied revoke is logged by the
			// leader that applies it, "lock revoked").
			n.log.Warn("admin revoke request", "remote", raw.RemoteAddr().String(), "key", req.Key, "token", req.Token,
				"by", req.By, "reason", req.Reason, "ok", rep.OK, "code", rep.Code, "err", rep.Error)
			continue
		}
		n.log.Info("admin request", "op", req.Op, "id", req.ID, "replaces", req.Replaces, "ok", rep.OK, "err", rep.Error)
	}
}

// admin runs one request. Changes wait up to a minute to commit.
func (n *Node) admin(req wire.AdminRequest) wire.AdminReply {
	const timeout = time.Minute
	var err error
	switch req.Op {
	case wire.AdminOpMembers:
		// Only the leader's configuration and lags are authoritative.
		if err = n.requireLeader(); err != nil {
			break
		}
		var ms []Member
		if ms, err = n.Members(); err == nil {
			hs := n.probe(ms, probeWait)
			rep := wire.AdminReply{OK: true, Commit: n.raft.CommitIndex()}
			for _, m := range ms {
				h := hs[m.ServerID]
				am := wire.AdminMember{ServerID: m.ServerID, Name: m.Name, PeerAddr: m.PeerAddr, ClientAddr: m.ClientAddr,
					Voter: m.Voter, Leader: m.Leader, Lag: -1, Answers: h.answers, FoundAtAddr: h.found}
				if h.answers {
					am.Lag = int64(rep.Commit - min(rep.Commit, h.applied))
				}
				rep.Members = append(rep.Members, am)
			}
			return rep
		}
	case wire.AdminOpStatus, wire.AdminOpInspect:
		if req.LeaderOnly {
			if err = n.requireLeader(); err != nil {
				break
			}
		}
		if req.Op == wire.AdminOpStatus {
			st := n.StatusReport()
			return wire.AdminReply{OK: true, Status: &st}
		}
		var kr wire.KeyReport
		if kr, err = n.Inspect(req.Key); err != nil {
			err = fmt.Errorf("%w: %w", ErrBadConfig, err)
			break
		}
		return wire.AdminReply{OK: true, Key: &kr}
	case wire.AdminOpAddLearner:
		if req.Answering {
			err = n.AddAnsweringLearner(req.ID, req.Addr, timeout)
		} else {
			err = n.AddLearner(req.ID, req.Addr, timeout)
		}
	case wire.AdminOpPromote:
		if req.Replaces != "" {
			err = n.PromoteReplacing(req.ID, req.Replaces, timeout)
		} else {
			err = n.Promote(req.ID, timeout)
		}
	case wire.AdminOpRemove:
		err = n.Remove(req.ID, timeout)
	case wire.AdminOpRevoke:
		if req.Token == 0 {
			err = fmt.Errorf("%w: a revoke names the token of the holding it ends (inspect the key for it)", ErrBadConfig)
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		rv, rerr := n.Revoke(ctx, req.Key, req.Token, req.By, req.Reason)
		cancel()
		if err = rerr; err == nil {
			rep := wire.AdminReply{OK: true, Revoked: &rv}
			if kr, ierr := n.Inspect(req.Key); ierr == nil {
				rep.Key = &kr
			}
			return rep
		}
		if errors.Is(err, locksm.ErrInvalidKey) || errors.Is(err, locksm.ErrInvalidOwner) {
			// A mistyped key or operator name: bad_request, not internal.
			err = fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
	default:
		err = fmt.Errorf("%w: unknown admin op %q", ErrBadConfig, req.Op)
	}
	if err != nil {
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) ||
			errors.Is(err, raft.ErrLeadershipTransferInProgress) {
			// Raft's own word for it: the change did not commit here (or
			// may yet, under the next leader); ask the leader.
			err = fmt.Errorf("%w: %w", ErrNotLeader, err)
		}
		return wire.AdminReply{Code: wire.AdminCodeOf(err), Error: err.Error()}
	}
	return wire.AdminReply{OK: true}
}

// fitAdminReply marshals rep so that it fits one frame: an inspected key's
// queue, or a status's list of sessions, is cut short (QueueTruncated,
// SessionsTruncated; QueueLen and SessionsTotal still count them all),
// and a reply that still does not fit becomes an "internal" failure.
func fitAdminReply(rep *wire.AdminReply) []byte {
	b, _ := json.Marshal(rep)
	if len(b) <= wire.MaxPayloadLen {
		return b
	}
	if k := rep.Key; k != nil && len(k.Queue) > 0 {
		if fb, ok := fitPrefix(rep, &k.Queue, &k.QueueTruncated); ok {
			return fb
		}
	}
	if k := rep.Key; k != nil && len(k.Permits) > 0 {
		// The queue is empty by now: then the permits are cut short.
		if fb, ok := fitPrefix(rep, &k.Permits, &k.PermitsTruncated); ok {
			return fb
		}
	}
	if st := rep.Status; st != nil && len(st.Sessions) > 0 {
		if fb, ok := fitPrefix(rep, &st.Sessions, &st.SessionsTruncated); ok {
			return fb
		}
	}
	b, _ = json.Marshal(rep)
	b, _ = json.Marshal(wire.AdminReply{Code: wire.AdminInternal, Leader: rep.Leader,
		Error: fmt.Sprintf("reply of %d bytes does not fit one admin frame", len(b))})
	return b
}

// fitPrefix cuts *list, a list in rep, to its longest prefix with which
// rep fits one frame (empty if need be), setting *truncated, and returns
// rep marshalled; false if it does not fit even with the list empty.
func fitPrefix[T any](rep *wire.AdminReply, list *[]T, truncated *bool) ([]byte, bool) {
	const limit = wire.MaxPayloadLen
	full := *list
	// Binary search for the longest prefix (1..len-1 entries) that fits.
	var best []byte
	bestLen := 0
	for lo, hi := 1, len(full)-1; lo <= hi; {
		mid := (lo + hi) / 2
		*list, *truncated = full[:mid], true
		if mb, _ := json.Marshal(rep); len(mb) <= limit {
			best, bestLen, lo = mb, mid, mid+1
		} else {
			hi = mid - 1
		}
	}
	if best != nil {
		*list = full[:bestLen]
		return best, true
	}
	*list, *truncated = full[:0], true
	b, _ := json.Marshal(rep)
	return b, len(b) <= limit
}
