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

	"github.com/hashicorp/raft"

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
	// Replaces (op "promote") is the voter that the promoted learner
	// replaces in the same step (Node.PromoteReplacing); "" promotes only.
	Replaces string `json:"replaces,omitempty"`
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
	// Code is set on failure: "not_leader", "no_quorum", "unsafe",
	// "lagging", "in_progress", "no_such_member", "bad_request" or
	// "internal".
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

// AdminMember is one member with the leader's view of its health.
type AdminMember struct {
	Member
	// Lag is how many entries its applied index trails the leader's
	// commit index; -1 when it did not answer.
	Lag int64 `json:"lag"`
	// Answers: it proved exactly its server id over its peer port within
	// 2 s (the leader always does).
	Answers bool `json:"answers"`
	// FoundAtAddr, when it does not answer, is the server id that answered
	// at its peer address instead under the same node name: a wiped node's
	// new incarnation ("" if none did). `ticketing members replace
	// ServerID FoundAtAddr PeerAddr` repairs it.
	FoundAtAddr string `json:"found_at_addr,omitempty"`
}

var adminCodes = []struct {
	err  error
	code string
}{
	{ErrNotLeader, "not_leader"},
	{ErrNoQuorum, "no_quorum"}, // before unsafe: it wraps both
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
		n.log.Info("admin request", "op", req.Op, "id", req.ID, "replaces", req.Replaces, "ok", rep.OK, "err", rep.Error)
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
			hs := n.probe(ms, probeWait)
			rep := AdminReply{OK: true, Commit: n.raft.CommitIndex()}
			for _, m := range ms {
				h := hs[m.ServerID]
				am := AdminMember{Member: m, Lag: -1, Answers: h.answers, FoundAtAddr: h.found}
				if h.answers {
					am.Lag = int64(rep.Commit - min(rep.Commit, h.applied))
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
		if req.Replaces != "" {
			err = n.PromoteReplacing(req.ID, req.Replaces, timeout)
		} else {
			err = n.Promote(req.ID, timeout)
		}
	case "remove":
		err = n.Remove(req.ID, timeout)
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
	// NoLeaderWait is how long Replace waits for a node that leads (one
	// election normally takes a second or two) before it gives up with
	// ErrNoQuorum. Zero: DefaultNoLeaderWait.
	NoLeaderWait time.Duration
}

// DefaultNoLeaderWait is AdminCluster.NoLeaderWait's default.
const DefaultNoLeaderWait = 30 * time.Second

// Per-address bounds of Do: a change may wait up to a minute to commit
// (Node.admin); the read-only ops answer within a few seconds (the
// leader asks every member for its health, for up to 3 s).
const (
	adminChangeWait = 70 * time.Second
	adminReadWait   = 10 * time.Second
)

// Do sends req to each address in turn until a node other than a
// non-leader answers; ErrNotLeader from all of them is returned as is.
func (a *AdminCluster) Do(ctx context.Context, req AdminRequest) (AdminReply, error) {
	wait := adminChangeWait
	switch req.Op {
	case "members", "status", "inspect":
		wait = adminReadWait
	}
	var lastErr error = fmt.Errorf("%w: no admin address", ErrBadConfig)
	for _, addr := range a.Addrs {
		actx, cancel := context.WithTimeout(ctx, wait)
		rep, err := AdminDo(actx, addr, a.Config, req)
		cancel()
		if err == nil || (errors.Is(err, ErrAdmin) && !errors.Is(err, ErrNotLeader)) {
			return rep, err
		}
		lastErr = fmt.Errorf("%s: %w", addr, err)
		if ctx.Err() != nil {
			break
		}
	}
	return AdminReply{}, lastErr
}
