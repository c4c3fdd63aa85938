package cluster

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"ticketing/cluster/wire"
)

// The admin port (Config.AdminAddr) serves operator tools (`ticketing
// members`, `status`, `inspect`): TCP → TLS like the client port → the
// handshake of cluster/PROTOCOL.md with kind 4 (admin) and the admin
// secret, which differs from the client and peer secrets → request/reply
// frames owned by this file:
//
//	'j' admin request: JSON AdminRequest   (client → node)
//	'J' admin reply:   JSON AdminReply     (node → client), one per request, in order
//
// Frames use the framing of cluster/PROTOCOL.md (u32 length, type byte,
// payload; at most 4096 bytes). Admin traffic is rare, so JSON keeps it
// readable; the node answers each request before reading the next.
const (
	adminRequest = 'j'
	adminReply   = 'J'
)

// AdminRequest is one admin operation.
type AdminRequest struct {
	// Op is "members", "add-learner", "promote", "remove" (leader only),
	// "status" or "inspect" (any node; see LeaderOnly).
	Op string `json:"op"`
	// ID is the server id (NAME/INCARNATION) the change is about.
	ID string `json:"id,omitempty"`
	// Addr is the peer address of a new learner.
	Addr string `json:"addr,omitempty"`
	// Key is the key to inspect (op "inspect").
	Key string `json:"key,omitempty"`
	// LeaderOnly makes "status" and "inspect" answer not_leader on a node
	// that does not lead, so that AdminCluster.Do finds the leader.
	LeaderOnly bool `json:"leader_only,omitempty"`
}

// AdminReply answers an AdminRequest.
type AdminReply struct {
	OK bool `json:"ok"`
	// Code is set on failure: "not_leader", "unsafe", "lagging",
	// "in_progress", "no_such_member", "bad_request" or "internal".
	Code  string `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
	// Leader is the leader's server id as this node knows it.
	Leader string `json:"leader,omitempty"`
	// Members lists the configuration (op "members").
	Members []AdminMember `json:"members,omitempty"`
	// Commit is the answering leader's commit index (op "members").
	Commit uint64 `json:"commit,omitempty"`
	// Status is the answering node's StatusReport (op "status").
	Status *StatusReport `json:"status,omitempty"`
	// Key is the answering node's KeyReport (op "inspect"); its queue is
	// cut short (queue_truncated) to fit the reply in one frame.
	Key *KeyReport `json:"key,omitempty"`
}

// AdminMember is one member with the leader's view of its lag.
type AdminMember struct {
	Member
	// Lag is how many entries its applied index trails the leader's
	// commit index; -1 when it did not answer.
	Lag int64 `json:"lag"`
}

var adminCodes = []struct {
	err  error
	code string
}{
	{ErrNotLeader, "not_leader"},
	{ErrUnsafeChange, "unsafe"},
	{ErrLearnerLagging, "lagging"},
	{ErrChangeInProgress, "in_progress"},
	{ErrNoSuchMember, "no_such_member"},
	{ErrBadConfig, "bad_request"},
}

// ErrAdmin wraps a failure reported by a node's admin port; errors.Is also
// matches the sentinel of its code (ErrNotLeader, ErrUnsafeChange, ...).
var ErrAdmin = errors.New("cluster: admin request failed")

func adminCodeOf(err error) string {
	for _, c := range adminCodes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "internal"
}

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
	r := bufio.NewReader(c)
	for {
		_ = raw.SetDeadline(time.Now().Add(n.cfg.IdleTimeout))
		typ, payload, err := readAdminFrame(r)
		if err != nil {
			return
		}
		var req AdminRequest
		var rep AdminReply
		if typ != adminRequest || json.Unmarshal(payload, &req) != nil {
			rep = AdminReply{Code: "bad_request", Error: "want a JSON admin request frame"}
		} else {
			rep = n.admin(req)
		}
		_, leader := n.raft.LeaderWithID()
		rep.Leader = string(leader)
		b := fitAdminReply(&rep)
		if err := writeAdminFrame(c, adminReply, b); err != nil {
			return
		}
		n.log.Info("admin request", "op", req.Op, "id", req.ID, "ok", rep.OK, "err", rep.Error)
	}
}

// admin runs one request. Changes wait up to a minute to commit.
func (n *Node) admin(req AdminRequest) AdminReply {
	const timeout = time.Minute
	var err error
	switch req.Op {
	case "members":
		// Only the leader's configuration and lags are authoritative.
		if err = n.requireLeader(); err != nil {
			break
		}
		var ms []Member
		if ms, err = n.Members(); err == nil {
			rep := AdminReply{OK: true, Commit: n.raft.CommitIndex()}
			for _, m := range ms {
				am := AdminMember{Member: m, Lag: -1}
				if m.ServerID == n.serverID {
					am.Lag = int64(rep.Commit - min(rep.Commit, n.raft.AppliedIndex()))
				} else if lag, lerr := n.Lag(m.ServerID); lerr == nil {
					am.Lag = int64(lag)
				}
				rep.Members = append(rep.Members, am)
			}
			return rep
		}
	case "status", "inspect":
		if req.LeaderOnly {
			if err = n.requireLeader(); err != nil {
				break
			}
		}
		if req.Op == "status" {
			st := n.StatusReport()
			return AdminReply{OK: true, Status: &st}
		}
		var kr KeyReport
		if kr, err = n.Inspect(req.Key); err != nil {
			err = fmt.Errorf("%w: %w", ErrBadConfig, err)
			break
		}
		return AdminReply{OK: true, Key: &kr}
	case "add-learner":
		err = n.AddLearner(req.ID, req.Addr, timeout)
	case "promote":
		err = n.Promote(req.ID, timeout)
	case "remove":
		err = n.Remove(req.ID, timeout)
	default:
		err = fmt.Errorf("%w: unknown admin op %q", ErrBadConfig, req.Op)
	}
	if err != nil {
		return AdminReply{Code: adminCodeOf(err), Error: err.Error()}
	}
	return AdminReply{OK: true}
}

// fitAdminReply marshals rep so that it fits one frame: an inspected key's
// queue is cut short (QueueTruncated; QueueLen still counts every waiter),
// and a reply that still does not fit becomes an "internal" failure.
func fitAdminReply(rep *AdminReply) []byte {
	const limit = wire.MaxFrameLen - 1 // the type byte
	b, _ := json.Marshal(rep)
	if len(b) <= limit {
		return b
	}
	if k := rep.Key; k != nil && len(k.Queue) > 0 {
		full := k.Queue
		// Binary search for the longest prefix (1..len-1 waiters) that fits.
		var best []byte
		for lo, hi := 1, len(full)-1; lo <= hi; {
			mid := (lo + hi) / 2
			k.Queue, k.QueueTruncated = full[:mid], true
			if mb, _ := json.Marshal(rep); len(mb) <= limit {
				best, lo = mb, mid+1
			} else {
				hi = mid - 1
			}
		}
		if best != nil {
			return best
		}
		k.Queue, k.QueueTruncated = []WaiterReport{}, true
		if b, _ = json.Marshal(rep); len(b) <= limit {
			return b
		}
	}
	b, _ = json.Marshal(AdminReply{Code: "internal", Leader: rep.Leader,
		Error: fmt.Sprintf("reply of %d bytes does not fit one admin frame", len(b))})
	return b
}

func readAdminFrame(r io.Reader) (byte, []byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n < 1 || n > wire.MaxFrameLen {
		return 0, nil, fmt.Errorf("%w: admin frame of %d bytes", wire.ErrFrameTooLarge, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, err
	}
	return b[0], b[1:], nil
}

func writeAdminFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload)+1 > wire.MaxFrameLen {
		return fmt.Errorf("%w: admin frame of %d bytes", wire.ErrFrameTooLarge, len(payload)+1)
	}
	b := binary.BigEndian.AppendUint32(nil, uint32(len(payload)+1))
	b = append(b, typ)
	_, err := w.Write(append(b, payload...))
	return err
}

// AdminConfig configures AdminDo.
type AdminConfig struct {
	Secret    []byte      // the admin secret
	ClusterID string      // the nodes' cluster id
	TLS       *tls.Config // nil: plaintext (the node's client-port TLS applies to the admin port)
}

// AdminDo sends one request to the admin port at addr and returns the
// reply; a failure reply is returned as an error wrapping ErrAdmin and the
// code's sentinel, together with the reply (for Leader).
func AdminDo(ctx context.Context, addr string, cfg AdminConfig, req AdminRequest) (AdminReply, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return AdminReply{}, err
	}
	defer raw.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var tcfg *tls.Config
	if cfg.TLS != nil {
		tcfg = cfg.TLS.Clone()
		if tcfg.ServerName == "" {
			tcfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
	}
	c, binding, err := secureDial(raw, tcfg)
	if err != nil {
		return AdminReply{}, err
	}
	if _, err := wire.ClientHandshake(c, wire.HandshakeConfig{Kind: wire.KindAdmin, Secret: cfg.Secret,
		ClusterID: cfg.ClusterID, ChannelBinding: binding}); err != nil {
		return AdminReply{}, err
	}
	b, _ := json.Marshal(req)
	if err := writeAdminFrame(c, adminRequest, b); err != nil {
		return AdminReply{}, err
	}
	typ, payload, err := readAdminFrame(bufio.NewReader(c))
	if err != nil {
		return AdminReply{}, err
	}
	var rep AdminReply
	if typ != adminReply || json.Unmarshal(payload, &rep) != nil {
		return AdminReply{}, fmt.Errorf("%w: not an admin reply", wire.ErrMalformed)
	}
	if !rep.OK {
		for _, c := range adminCodes {
			if c.code == rep.Code {
				return rep, fmt.Errorf("%w: %w: %s", ErrAdmin, c.err, rep.Error)
			}
		}
		return rep, fmt.Errorf("%w: %s: %s", ErrAdmin, rep.Code, rep.Error)
	}
	return rep, nil
}

// AdminCluster sends admin requests to the leader among Addrs (the admin
// addresses of every node).
type AdminCluster struct {
	Addrs  []string
	Config AdminConfig
}

// Do sends req to each address in turn until a node other than a
// non-leader answers; ErrNotLeader from all of them is returned as is.
func (a *AdminCluster) Do(ctx context.Context, req AdminRequest) (AdminReply, error) {
	var lastErr error = fmt.Errorf("%w: no admin address", ErrBadConfig)
	for _, addr := range a.Addrs {
		actx, cancel := context.WithTimeout(ctx, 70*time.Second)
		rep, err := AdminDo(actx, addr, a.Config, req)
		cancel()
		if err == nil || (errors.Is(err, ErrAdmin) && !errors.Is(err, ErrNotLeader)) {
			return rep, err
		}
		lastErr = fmt.Errorf("%s: %w", addr, err)
	}
	return AdminReply{}, lastErr
}

// Replace swaps server oldID for newID (a node already running at peerAddr
// with an empty data dir): add it as a learner, wait until it has caught
// up, promote it, remove oldID (the leader hands over first if it is
// oldID). Each step is retried while another change or an election is
// under way; refusals (unsafe, no such member) end it. progress, if not
// nil, hears each step.
func (a *AdminCluster) Replace(ctx context.Context, oldID, newID, peerAddr string, progress func(string)) error {
	say := func(format string, args ...any) {
		if progress != nil {
			progress(fmt.Sprintf(format, args...))
		}
	}
	members := func() (map[string]AdminMember, error) {
		rep, err := a.Do(ctx, AdminRequest{Op: "members"})
		for err != nil && (errors.Is(err, ErrNotLeader) || !errors.Is(err, ErrAdmin)) {
			// An election is under way, or a node is unreachable.
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("%w (last: %w)", ctx.Err(), err)
			case <-time.After(300 * time.Millisecond):
			}
			rep, err = a.Do(ctx, AdminRequest{Op: "members"})
		}
		if err != nil {
			return nil, err
		}
		out := map[string]AdminMember{}
		for _, m := range rep.Members {
			out[m.ServerID] = m
		}
		return out, nil
	}
	ms, err := members()
	if err != nil {
		return err
	}
	if _, ok := ms[oldID]; !ok {
		return fmt.Errorf("%w: %s", ErrNoSuchMember, oldID)
	}
	step := func(what string, req AdminRequest, done func(map[string]AdminMember) bool) error {
		for {
			ms, err := members()
			if err == nil && done(ms) {
				return nil
			}
			_, err = a.Do(ctx, req)
			switch {
			case err == nil:
				say("%s: done", what)
				continue // confirm through members
			case errors.Is(err, ErrChangeInProgress), errors.Is(err, ErrNotLeader), !errors.Is(err, ErrAdmin):
				say("%s: %v; retrying", what, err)
			case errors.Is(err, ErrLearnerLagging):
				say("%s: %v; waiting", what, err)
			default:
				return fmt.Errorf("%s: %w", what, err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: %w", what, ctx.Err())
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	if err := step("add learner "+newID, AdminRequest{Op: "add-learner", ID: newID, Addr: peerAddr},
		func(ms map[string]AdminMember) bool { _, ok := ms[newID]; return ok }); err != nil {
		return err
	}
	if err := step("promote "+newID, AdminRequest{Op: "promote", ID: newID},
		func(ms map[string]AdminMember) bool { return ms[newID].Voter }); err != nil {
		return err
	}
	return step("remove "+oldID, AdminRequest{Op: "remove", ID: oldID},
		func(ms map[string]AdminMember) bool { _, ok := ms[oldID]; return !ok })
}
