package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster/wire"
)

// Creating a cluster is an explicit act, never a side effect of starting.
//
// A node whose data dir is empty starts Raft empty and waits: it bootstraps
// nothing by itself, because it cannot tell a first start from a disk that
// was lost (if every node's disk was lost, restarting them must not
// silently create a new cluster whose tokens start over). It becomes a
// member only when a configuration names its server id: the initial one
// written by Bootstrap, or a later one that adds it as a learner.
//
// Bootstrap (`ticketing bootstrap --new-domain`) runs once, on one node's
// data dir while that node is stopped and the other initial voters run with
// empty data dirs. It asks each of them over the peer port who it is (its
// full server id, NAME/INCARNATION) and whether it has Raft state; if any
// has state it refuses (the cluster exists). Otherwise it writes into the
// data dir the initial configuration (every initial voter under its full
// server id) and, right after it in the log, the creation of a new fencing
// domain: a random domain id and the token floor. When that node starts,
// it is the only one with a log, wins the first election, and replicates
// both entries; the others, empty, accept it.

// BootstrapOptions are the choices of the operator creating a domain.
type BootstrapOptions struct {
	// TokenFloor is the lowest value the new domain's first token may
	// have. The floor used is the higher of it and the wall clock in
	// microseconds since 1970, so a cluster rebuilt after losing its
	// majority issues tokens above the old one's as long as the old one
	// issued fewer tokens than microseconds passed since its own creation
	// (under a million grants per second on average) and the clocks were
	// roughly right. Set it above the old domain's highest token (a fence
	// table's high-water mark) to rely on neither. Zero: the clock alone.
	TokenFloor uint64
	// Timeout bounds the wait for every other initial voter to answer.
	// Zero: DefaultBootstrapTimeout.
	Timeout time.Duration
	// Now is the wall clock; nil: time.Now.
	Now func() time.Time
}

// DefaultBootstrapTimeout is BootstrapOptions.Timeout's default.
const DefaultBootstrapTimeout = time.Minute

// BootstrapResult says what Bootstrap created.
type BootstrapResult struct {
	Domain     string
	TokenFloor uint64
	Servers    []string // full server ids of the initial voters
	// ClusterVersion is the protocol version recorded for the cluster: the
	// lowest one an initial voter speaks.
	ClusterVersion uint16
}

// Bootstrap creates a new cluster and fencing domain in cfg.DataDir (see
// above). cfg is the node's own configuration; the node must not be
// running. It needs NodeID, DataDir, Peers, the peer secret(s), ClusterID
// and PeerTLS (if the cluster uses TLS).
func Bootstrap(cfg Config, opts BootstrapOptions) (BootstrapResult, error) {
	if err := cfg.Validate(); err != nil {
		return BootstrapResult{}, err
	}
	if err := ValidateVoters(cfg.Peers); err != nil {
		return BootstrapResult{}, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	if !slices.ContainsFunc(cfg.Peers, func(p Peer) bool { return p.ID == cfg.NodeID }) {
		return BootstrapResult{}, fmt.Errorf("%w: the initial voters must include this node (%q)", ErrBadConfig, cfg.NodeID)
	}
	cfg = cfg.withDefaults()
	if opts.Timeout == 0 {
		opts.Timeout = DefaultBootstrapTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return BootstrapResult{}, fmt.Errorf("cluster: data dir: %w", err)
	}
	store, kind, err := openLogStore(cfg.DataDir, cfg.LogStore, cfg.Logger)
	if err != nil {
		if errors.Is(err, ErrLogStoreMismatch) || errors.Is(err, ErrLogStoreMissing) || errors.Is(err, ErrBadConfig) {
			return BootstrapResult{}, err
		}
		return BootstrapResult{}, fmt.Errorf("cluster: open the %s log store in %s (is the node running? stop it first): %w",
			kind, cfg.DataDir, err)
	}
	defer func() { _ = store.Close() }() // only read: a failed close loses nothing
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.DataDir, "snapshots"), 2, newHCLogger(cfg.Logger))
	if err != nil {
		return BootstrapResult{}, fmt.Errorf("cluster: snapshot store: %w", err)
	}
	has, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		return BootstrapResult{}, err
	}
	if has {
		return BootstrapResult{}, fmt.Errorf("%w: %s has Raft state", ErrClusterExists, cfg.DataDir)
	}
	serverID, _, err := loadIdentity(cfg.DataDir, cfg.NodeID, false)
	if err != nil {
		return BootstrapResult{}, err
	}
	dialer := newPeerDialer(cfg, serverID, cfg.Logger)
	ids := map[string]string{cfg.NodeID: serverID}
	// clusterVersion: the lowest protocol version an initial voter speaks.
	clusterVersion := cfg.protocolVersion()
	deadline := time.Now().Add(opts.Timeout)
	for {
		var missing []string
		for _, p := range cfg.Peers {
			if _, known := ids[p.ID]; known {
				continue
			}
			sid, id, version, err := dialer.discover(p.ID, p.Addr, time.Second)
			if err != nil {
				missing = append(missing, fmt.Sprintf("%s at %s (%v)", p.ID, p.Addr, err))
				continue
			}
			if id.HasState {
				return BootstrapResult{}, fmt.Errorf("%w: %s has Raft state; a node with an empty data dir joins an "+
					"existing cluster as a learner (ticketing members), never by a new bootstrap", ErrClusterExists, sid)
			}
			ids[p.ID] = sid
			clusterVersion = min(clusterVersion, version)
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return BootstrapResult{}, fmt.Errorf("cluster: bootstrap: no answer within %v from %v; start every "+
				"other initial voter (with an empty data dir) first", opts.Timeout, missing)
		}
		time.Sleep(200 * time.Millisecond)
	}

	var conf raft.Configuration
	var res BootstrapResult
	for _, p := range cfg.Peers {
		conf.Servers = append(conf.Servers, raft.Server{
			Suffrage: raft.Voter, ID: raft.ServerID(ids[p.ID]), Address: raftAddr(ids[p.ID], p.Addr),
		})
	}
	sort.Slice(conf.Servers, func(i, j int) bool { return conf.Servers[i].ID < conf.Servers[j].ID })
	for _, s := range conf.Servers {
		res.Servers = append(res.Servers, string(s.ID))
	}
	rc := RaftConfig(cfg, serverID)
	_, trans := raft.NewInmemTransport("")
	if err := raft.BootstrapCluster(rc, store, store, snaps, trans, conf); err != nil {
		return BootstrapResult{}, fmt.Errorf("cluster: bootstrap: %w", err)
	}
	// The domain entry follows the configuration in the same term, so it
	// is the first command every member applies.
	res.Domain = newDomainID()
	res.TokenFloor = max(opts.TokenFloor, uint64(opts.Now().UnixMicro()))
	last, err := store.LastIndex()
	if err != nil {
		return BootstrapResult{}, err
	}
	entry := &raft.Log{Index: last + 1, Term: 1, Type: raft.LogCommand, Data: encodeDomain(res.Domain, res.TokenFloor), AppendedAt: opts.Now()}
	if err := store.StoreLog(entry); err != nil {
		return BootstrapResult{}, fmt.Errorf("cluster: bootstrap: writing the domain entry: %w", err)
	}
	// Then the cluster version: what every initial voter speaks.
	entry = &raft.Log{Index: last + 2, Term: 1, Type: raft.LogCommand, Data: encodeClusterVersion(clusterVersion), AppendedAt: opts.Now()}
	if err := store.StoreLog(entry); err != nil {
		return BootstrapResult{}, fmt.Errorf("cluster: bootstrap: writing the cluster version entry: %w", err)
	}
	res.ClusterVersion = clusterVersion
	return res, nil
}

// identity is what this node tells a discovering peer. An error reading
// the Raft state is returned, never taken for "no state": Bootstrap
// creates a cluster only when every initial voter says it has none, so a
// disk error read as "empty" could let a second cluster be bootstrapped
// over this node's data.
func (n *Node) identity() (wire.Identity, error) {
	has := n.hasState.Load()
	if !has {
		// Started empty, it may have received a log or a snapshot since.
		var err error
		if has, err = raft.HasExistingState(n.store, n.store, n.snaps); err != nil {
			return wire.Identity{}, fmt.Errorf("cluster: reading the Raft state: %w", err)
		}
		if has {
			n.hasState.Store(true)
		}
	}
	id := wire.Identity{HasState: has, Domain: n.fsm.getDomain(), ClientAddr: n.advertise}
	if len(id.ClientAddr) > 255 { // does not fit the frame; clients cannot be told it
		id.ClientAddr = ""
	}
	if r := n.raftIfStarted(); r != nil {
		id.Applied = r.AppliedIndex()
	}
	return id, nil
}
