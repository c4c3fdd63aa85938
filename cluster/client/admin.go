package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"

	"ticketing/cluster/tlsconf"
	"ticketing/cluster/wire"
)

// The admin client: requests to a node's admin port (the protocol, its
// JSON request and reply and the sentinels of its failure codes are
// cluster/wire's, admin.go and admin_json.go there; the node's side is
// package cluster's admin.go), for `ticketing members`, `status` and
// `inspect`. It does not import package cluster: a tool that talks to
// nodes links no Raft (layering_test.go).

// AdminConfig configures AdminDo.
type AdminConfig struct {
	Secret    []byte      // the admin secret
	ClusterID string      // the nodes' cluster id
	TLS       *tls.Config // nil: plaintext (the node's client-port TLS applies to the admin port)
}

// AdminDo sends one request to the admin port at addr and returns the
// reply; a failure reply is returned as an error wrapping ErrAdmin and the
// code's sentinel (wire.AdminErrOf: wire.ErrNotLeader, ..., which package
// cluster's sentinels of the same names are), together with the reply
// (for Leader).
func AdminDo(ctx context.Context, addr string, cfg AdminConfig, req wire.AdminRequest) (wire.AdminReply, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return wire.AdminReply{}, err
	}
	defer raw.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c, binding := net.Conn(raw), []byte(nil)
	if cfg.TLS != nil {
		tcfg := cfg.TLS.Clone()
		if tcfg.ServerName == "" {
			tcfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(raw, tcfg)
		if err := tc.Handshake(); err != nil {
			return wire.AdminReply{}, fmt.Errorf("client: TLS handshake: %w", err)
		}
		if binding, err = tlsconf.Binding(tc); err != nil {
			return wire.AdminReply{}, err
		}
		c = tc
	}
	if _, err := wire.ClientHandshake(c, wire.HandshakeConfig{Kind: wire.KindAdmin, Secret: cfg.Secret,
		ClusterID: cfg.ClusterID, ChannelBinding: binding}); err != nil {
		return wire.AdminReply{}, err
	}
	b, _ := json.Marshal(req)
	if err := wire.WriteFrame(c, wire.TypeAdminRequest, b); err != nil {
		return wire.AdminReply{}, fmt.Errorf("%w: %w", ErrAdminUnanswered, err)
	}
	typ, payload, err := wire.NewReader(c).ReadFrame()
	if err != nil {
		return wire.AdminReply{}, fmt.Errorf("%w: %w", ErrAdminUnanswered, err)
	}
	var rep wire.AdminReply
	if typ != wire.TypeAdminReply || json.Unmarshal(payload, &rep) != nil {
		return wire.AdminReply{}, fmt.Errorf("%w: not an admin reply", wire.ErrMalformed)
	}
	if !rep.OK {
		if sentinel := wire.AdminErrOf(rep.Code); sentinel != nil {
			return rep, fmt.Errorf("%w: %w: %s", ErrAdmin, sentinel, rep.Error)
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
	// NoLeaderWait is how long Members (and so Replace) waits for a node
	// that leads (one election normally takes a second or two) before it
	// gives up with wire.ErrNoVoterMajority. Zero: DefaultNoLeaderWait.
	NoLeaderWait time.Duration
	// NewNodeWait is how long Replace waits for the new server to answer
	// the leader over its peer port (it may be started after Replace)
	// before it gives up with wire.ErrLearnerLagging naming it. Until it
	// answers, its protocol version cannot be checked, so Replace does not
	// add it. Zero: DefaultNewNodeWait.
	NewNodeWait time.Duration
}

// DefaultNoLeaderWait is AdminCluster.NoLeaderWait's default.
const DefaultNoLeaderWait = 30 * time.Second

// DefaultNewNodeWait is AdminCluster.NewNodeWait's default: time to start
// the new machine's node.
const DefaultNewNodeWait = 2 * time.Minute

// Per-address bounds of Do: a change may wait up to a minute to commit
// (the node's admin handler); the read-only ops answer within a few
// seconds (the leader asks every member for its health, for up to 3 s).
const (
	adminChangeWait = 70 * time.Second
	adminReadWait   = 10 * time.Second
)

// Do sends req to each address in turn until a node other than a
// non-leader answers; wire.ErrNotLeader from all of them is returned as
// is.
func (a *AdminCluster) Do(ctx context.Context, req wire.AdminRequest) (wire.AdminReply, error) {
	wait := adminChangeWait
	switch req.Op {
	case wire.AdminOpMembers, wire.AdminOpStatus, wire.AdminOpInspect:
		wait = adminReadWait
	}
	var lastErr error = fmt.Errorf("%w: no admin address", wire.ErrBadRequest)
	for _, addr := range a.Addrs {
		actx, cancel := context.WithTimeout(ctx, wait)
		rep, err := AdminDo(actx, addr, a.Config, req)
		cancel()
		if err == nil || (errors.Is(err, ErrAdmin) && !errors.Is(err, wire.ErrNotLeader)) {
			return rep, err
		}
		if req.Op == wire.AdminOpRevoke && errors.Is(err, ErrAdminUnanswered) {
			// The node may have proposed it: never sent twice (found
			// by issue 42's attack round).
			return wire.AdminReply{}, fmt.Errorf("%w: %s: the revoke was sent and no reply came: %w (inspect the key: its last revoke says whether it applied)",
				wire.ErrIndeterminate, addr, err)
		}
		lastErr = fmt.Errorf("%s: %w", addr, err)
		if ctx.Err() != nil {
			break
		}
	}
	return wire.AdminReply{}, lastErr
}
