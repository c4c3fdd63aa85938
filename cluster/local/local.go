// Package local runs a whole Ticketing cluster inside one process on
// loopback: real cluster.Nodes with real Raft, real TCP and real log files.
// It backs `ticketing dev` and the tests that need a cluster. (A cluster of
// node processes is cluster/localproc, which the binary does not link.)
package local

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/tlsconf"
)

// Options configures Start.
type Options struct {
	// Dir holds one data dir per node and the secret files. Required.
	Dir string
	// Nodes is the number of voters: 3 (zero) or 5.
	Nodes int
	// Voters is how many of the nodes are initial voters: 3 or 5, at most
	// Nodes; zero means all. The others start empty, as spare servers to
	// add with the membership API.
	Voters int
	// BasePort, when nonzero, puts node i's client port at BasePort+i and its
	// peer port at BasePort+100+i on 127.0.0.1. Zero picks free ports.
	BasePort int
	// ClusterID is the cluster id; "" means "dev".
	ClusterID string
	// Logger receives every node's logs; nil discards them.
	Logger *slog.Logger
	// PeerNet is shared by every node's peer transport (tests plug a
	// netfault.Network in here); nil: plain TCP.
	PeerNet cluster.PeerNet
	// LogStore is every node's Raft log store (cluster.Config.LogStore);
	// "": the default, auto (each node keeps the store its data dir
	// holds, wal in a new one). A bolt or wal for a Dir that holds a
	// cluster must be the kind it was created with (the nodes refuse
	// another).
	LogStore cluster.LogStoreKind
	// Tune, when set, adjusts each node's config before it starts.
	Tune func(*cluster.Config)
	// AdminSecret, when set, gives every node an admin port (at
	// BasePort+200+i with BasePort) with this secret.
	AdminSecret []byte
	// TokenFloor is passed to cluster.Bootstrap for a new cluster.
	TokenFloor uint64
	// TLS, when set, issues a throwaway CA and node certificates into
	// Dir/tls (reused when present) and runs both ports over TLS; clients
	// dial with Cluster.ClientTLS.
	TLS bool
}

// Cluster is a running local cluster.
type Cluster struct {
	Dir            string
	SecretFile     string // client secret file
	PeerSecretFile string
	ClientSecret   []byte
	ClusterID      string
	// CAFile is the CA that signed the nodes' certificates and ClientTLS
	// the configuration to dial them with; "" and nil without TLS.
	CAFile    string
	ClientTLS *tls.Config
	// Domain is the fencing domain created by Start ("" when Dir held an
	// existing cluster).
	Domain string

	mu    sync.Mutex
	cfgs  []cluster.Config
	nodes []*cluster.Node // nil while stopped
}

// Start starts every node and returns without waiting for a leader.
func Start(opts Options) (*Cluster, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Voters == 0 {
		opts.Voters = opts.Nodes
	}
	if opts.ClusterID == "" {
		opts.ClusterID = "dev"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	c := &Cluster{
		Dir:            opts.Dir,
		SecretFile:     filepath.Join(opts.Dir, "client.secret"),
		PeerSecretFile: filepath.Join(opts.Dir, "peer.secret"),
		ClusterID:      opts.ClusterID,
	}
	var err error
	if c.ClientSecret, err = EnsureSecret(c.SecretFile); err != nil {
		return nil, err
	}
	peerSecret, err := EnsureSecret(c.PeerSecretFile)
	if err != nil {
		return nil, err
	}

	// Pre-open every listener so ports are known before any node starts.
	clientLns := make([]net.Listener, opts.Nodes)
	peerLns := make([]net.Listener, opts.Nodes)
	adminLns := make([]net.Listener, opts.Nodes)
	closeAll := func() {
		for _, lns := range [][]net.Listener{clientLns, peerLns, adminLns} {
			for _, ln := range lns {
				if ln != nil {
					ln.Close()
				}
			}
		}
	}
	// The addresses: a Dir that holds a cluster keeps the ones it was
	// created with (its Raft configuration names the peer addresses), so
	// free ports picked for it are saved and reused.
	want := make([]nodeAddrs, opts.Nodes)
	for i := range want {
		want[i] = nodeAddrs{client: "127.0.0.1:0", peer: "127.0.0.1:0"}
		if opts.AdminSecret != nil {
			want[i].admin = "127.0.0.1:0"
		}
		if opts.BasePort != 0 {
			want[i].client = fmt.Sprintf("127.0.0.1:%d", opts.BasePort+i)
			want[i].peer = fmt.Sprintf("127.0.0.1:%d", opts.BasePort+100+i)
			if opts.AdminSecret != nil {
				want[i].admin = fmt.Sprintf("127.0.0.1:%d", opts.BasePort+200+i)
			}
		}
	}
	saved, err := readAddrs(opts.Dir)
	if err != nil {
		return nil, err
	}
	switch _, serr := os.Stat(filepath.Join(opts.Dir, "n1", "identity")); {
	case saved != nil:
		if len(saved) != opts.Nodes {
			return nil, fmt.Errorf("%w: %s holds a cluster of %d nodes, not %d", ErrAddrsChanged, opts.Dir, len(saved), opts.Nodes)
		}
		for i := range want {
			if opts.BasePort != 0 && (want[i].client != saved[i].client || want[i].peer != saved[i].peer) {
				return nil, fmt.Errorf("%w: %s was created with client addresses %s and peer addresses %s, which "+
					"its Raft configuration names; start it on those (with base port 0 they are reused)",
					ErrAddrsChanged, opts.Dir, joinAddrs(saved, false), joinAddrs(saved, true))
			}
			if want[i].admin != "" && saved[i].admin != "" {
				want[i].admin = saved[i].admin
			}
			want[i].client, want[i].peer = saved[i].client, saved[i].peer
		}
	case serr == nil && opts.BasePort == 0:
		return nil, fmt.Errorf("%w: %s holds a cluster whose addresses were not saved (made by an older version); "+
			"start it on the base port it was created with", ErrAddrsChanged, opts.Dir)
	}
	listen := func(addr string) (net.Listener, error) {
		if addr == "127.0.0.1:0" {
			return ListenLoopback()
		}
		return net.Listen("tcp", addr)
	}
	for i := 0; i < opts.Nodes; i++ {
		if clientLns[i], err = listen(want[i].client); err != nil {
			closeAll()
			return nil, err
		}
		if peerLns[i], err = listen(want[i].peer); err != nil {
			closeAll()
			return nil, err
		}
		if opts.AdminSecret != nil {
			if adminLns[i], err = listen(want[i].admin); err != nil {
				closeAll()
				return nil, err
			}
		}
	}
	var peers []cluster.Peer
	var ids []string
	for i := 0; i < opts.Nodes; i++ {
		peers = append(peers, cluster.Peer{ID: fmt.Sprintf("n%d", i+1), Addr: peerLns[i].Addr().String()})
		ids = append(ids, peers[i].ID)
	}
	var nodeTLS map[string]tlsconf.Files
	if opts.TLS {
		if c.CAFile, nodeTLS, err = DevTLS(filepath.Join(opts.Dir, "tls"), ids); err == nil {
			c.ClientTLS, err = tlsconf.ClientConfig(tlsconf.Files{CAFile: c.CAFile})
		}
		if err != nil {
			closeAll()
			return nil, err
		}
	}
	for i := 0; i < opts.Nodes; i++ {
		cfg := cluster.DefaultConfig()
		cfg.NodeID = peers[i].ID
		cfg.DataDir = filepath.Join(opts.Dir, peers[i].ID)
		cfg.ClientAddr = clientLns[i].Addr().String()
		if adminLns[i] != nil {
			cfg.AdminAddr, cfg.AdminSecret = adminLns[i].Addr().String(), opts.AdminSecret
		}
		cfg.PeerAddr = peers[i].Addr
		cfg.Peers = peers[:opts.Voters]
		cfg.ClusterID = opts.ClusterID
		cfg.ClientSecret = c.ClientSecret
		cfg.PeerSecret = peerSecret
		cfg.Logger = opts.Logger
		cfg.PeerNet = opts.PeerNet
		if opts.LogStore != "" {
			cfg.LogStore = opts.LogStore
		}
		if f, ok := nodeTLS[cfg.NodeID]; ok {
			if cfg.ClientTLS, err = tlsconf.ServerConfig(f, false); err == nil {
				cfg.PeerTLS, err = tlsconf.PeerConfig(f)
			}
			if err != nil {
				closeAll()
				return nil, err
			}
		}
		if opts.Tune != nil {
			opts.Tune(&cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	// Nodes 2..N start first (empty, they wait); then node 1's data dir is
	// bootstrapped, which asks them for their server ids, and node 1
	// starts and becomes the first leader (see cluster/bootstrap.go). A
	// Dir that already holds the cluster just restarts.
	c.nodes = make([]*cluster.Node, opts.Nodes)
	start := func(i int) error {
		cfg := c.cfgs[i]
		cfg.ClientListener, cfg.PeerListener = clientLns[i], peerLns[i]
		if adminLns[i] != nil {
			cfg.AdminListener = adminLns[i]
		}
		n, err := cluster.New(cfg)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.nodes[i] = n
		c.mu.Unlock()
		return nil
	}
	fail := func(err error) (*Cluster, error) {
		closeAll()
		c.Close()
		return nil, err
	}
	for i := 1; i < opts.Nodes; i++ {
		if err := start(i); err != nil {
			return fail(err)
		}
	}
	if _, err := os.Stat(filepath.Join(c.cfgs[0].DataDir, "identity")); errors.Is(err, os.ErrNotExist) {
		bcfg := c.cfgs[0]
		bcfg.ClientListener, bcfg.PeerListener = clientLns[0], peerLns[0]
		res, err := cluster.Bootstrap(bcfg, cluster.BootstrapOptions{TokenFloor: opts.TokenFloor})
		if err != nil {
			return fail(err)
		}
		c.Domain = res.Domain
	}
	// Saved once the Raft configuration names the addresses.
	if saved == nil {
		got := make([]nodeAddrs, opts.Nodes)
		for i := range got {
			got[i] = nodeAddrs{client: clientLns[i].Addr().String(), peer: peerLns[i].Addr().String()}
			if adminLns[i] != nil {
				got[i].admin = adminLns[i].Addr().String()
			}
		}
		if err := writeAddrs(opts.Dir, got); err != nil {
			return fail(err)
		}
	}
	if err := start(0); err != nil {
		return fail(err)
	}
	return c, nil
}

// ErrAddrsChanged is returned by Start for a Dir that holds a cluster
// created on other addresses or with another number of nodes.
var ErrAddrsChanged = errors.New("local: the cluster in this directory has other addresses")

// addrsFile, in Dir, records each node's addresses when the cluster is
// created: one line per node, "n1 client=HOST:PORT peer=HOST:PORT
// [admin=HOST:PORT]".
const addrsFile = "addrs"

type nodeAddrs struct{ client, peer, admin string }

// HasCluster reports whether dir holds a cluster that Start created, with
// its addresses saved: Start with BasePort 0 then reuses them.
func HasCluster(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, addrsFile))
	return err == nil
}

func readAddrs(dir string) ([]nodeAddrs, error) {
	b, err := os.ReadFile(filepath.Join(dir, addrsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []nodeAddrs
	for n, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		var a nodeAddrs
		for _, kv := range f[min(1, len(f)):] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "client":
				a.client = v
			case "peer":
				a.peer = v
			case "admin":
				a.admin = v
			}
		}
		if len(f) == 0 || f[0] != fmt.Sprintf("n%d", n+1) || a.client == "" || a.peer == "" {
			return nil, fmt.Errorf("local: %s line %d: want \"n%d client=HOST:PORT peer=HOST:PORT\", got %q",
				filepath.Join(dir, addrsFile), n+1, n+1, line)
		}
		out = append(out, a)
	}
	return out, nil
}

func writeAddrs(dir string, addrs []nodeAddrs) error {
	var b strings.Builder
	for i, a := range addrs {
		fmt.Fprintf(&b, "n%d client=%s peer=%s", i+1, a.client, a.peer)
		if a.admin != "" {
			fmt.Fprintf(&b, " admin=%s", a.admin)
		}
		b.WriteString("\n")
	}
	return os.WriteFile(filepath.Join(dir, addrsFile), []byte(b.String()), 0o600)
}

func joinAddrs(addrs []nodeAddrs, peer bool) string {
	var s []string
	for _, a := range addrs {
		if peer {
			s = append(s, a.peer)
		} else {
			s = append(s, a.client)
		}
	}
	return strings.Join(s, ",")
}

// DevTLS returns the throwaway CA and node certificates in dir, issuing
// them (tlsconf.DevSet) unless dir already holds them.
func DevTLS(dir string, ids []string) (caFile string, nodes map[string]tlsconf.Files, err error) {
	caFile = filepath.Join(dir, "ca.crt")
	if _, err := os.Stat(caFile); err == nil {
		nodes = map[string]tlsconf.Files{}
		for _, id := range ids {
			f := tlsconf.Files{CertFile: filepath.Join(dir, id+".crt"), KeyFile: filepath.Join(dir, id+".key"), CAFile: caFile}
			if _, err := os.Stat(f.CertFile); err != nil {
				return "", nil, fmt.Errorf("local: %s has a CA but no certificate for %s: %w", dir, id, err)
			}
			nodes[id] = f
		}
		return caFile, nodes, nil
	}
	return tlsconf.DevSet(dir, ids, time.Now())
}

// EnsureSecret reads the secret file at path, or writes a new random one
// (32 bytes, hex, mode 0600) when there is none.
func EnsureSecret(path string) ([]byte, error) {
	if b, err := cluster.ReadSecretFile(path); err == nil {
		return b, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	s := hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(s+"\n"), 0o600); err != nil {
		return nil, err
	}
	return []byte(s), nil
}

// LogStoreOf reports which log store the cluster in dir was created with
// (its first node's, cluster.DetectLogStore); "" when dir holds none.
func LogStoreOf(dir string) (cluster.LogStoreKind, error) {
	return cluster.DetectLogStore(filepath.Join(dir, "n1"))
}

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.cfgs) }

// Node returns node i, or nil while it is stopped.
func (c *Cluster) Node(i int) *cluster.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// ID returns node i's id.
func (c *Cluster) ID(i int) string { return c.cfgs[i].NodeID }

// IDs returns every node id.
func (c *Cluster) IDs() []string {
	out := make([]string, len(c.cfgs))
	for i := range c.cfgs {
		out[i] = c.cfgs[i].NodeID
	}
	return out
}

// ClientAddr returns node i's client address (stable across restarts).
func (c *Cluster) ClientAddr(i int) string { return c.cfgs[i].ClientAddr }

// AdminAddr returns node i's admin address ("" without one).
func (c *Cluster) AdminAddr(i int) string { return c.cfgs[i].AdminAddr }

// PeerAddr returns node i's peer (Raft) address.
func (c *Cluster) PeerAddr(i int) string { return c.cfgs[i].PeerAddr }

// ClientAddrs returns every node's client address.
func (c *Cluster) ClientAddrs() []string {
	out := make([]string, len(c.cfgs))
	for i := range c.cfgs {
		out[i] = c.cfgs[i].ClientAddr
	}
	return out
}

// Stop stops node i (its data dir stays).
func (c *Cluster) Stop(i int) error {
	c.mu.Lock()
	n := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if n == nil {
		return nil
	}
	return n.Close()
}

// Shutdown stops node i gracefully (cluster.Node.Shutdown: a leader hands
// its leadership over first) and returns who took the lead ("" if nobody).
func (c *Cluster) Shutdown(ctx context.Context, i int) (string, error) {
	c.mu.Lock()
	n := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if n == nil {
		return "", nil
	}
	return n.Shutdown(ctx)
}

// Wipe stops node i and deletes its data dir, as a lost disk would; a
// Restart then starts it empty, with a new incarnation.
func (c *Cluster) Wipe(i int) error {
	if err := c.Stop(i); err != nil {
		return err
	}
	return os.RemoveAll(c.cfgs[i].DataDir)
}

// Bootstrap runs cluster.Bootstrap on node i's data dir (node i stopped):
// the operator's explicit creation of a new cluster and fencing domain.
func (c *Cluster) Bootstrap(i int, opts cluster.BootstrapOptions) (cluster.BootstrapResult, error) {
	c.mu.Lock()
	running := c.nodes[i] != nil
	c.mu.Unlock()
	if running {
		return cluster.BootstrapResult{}, fmt.Errorf("local: node %s is running", c.cfgs[i].NodeID)
	}
	return cluster.Bootstrap(c.cfgs[i], opts)
}

// PeerAddrOf is node i's peer address (for adding it as a learner).
func (c *Cluster) PeerAddrOf(i int) string { return c.cfgs[i].PeerAddr }

// Restart starts node i again from its data dir on the same addresses.
func (c *Cluster) Restart(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes[i] != nil {
		return fmt.Errorf("local: node %s is running", c.cfgs[i].NodeID)
	}
	var n *cluster.Node
	var err error
	// The old listeners' ports may take a moment to be free again.
	for try := 0; try < 50; try++ {
		if n, err = cluster.New(c.cfgs[i]); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	c.nodes[i] = n
	return nil
}

// RestartWith is Restart with node i's config first adjusted by tune (kept
// for its later restarts): a rolling upgrade's tests restart a node as
// another build (cluster.Config.ProtocolVersion) on the same data dir.
func (c *Cluster) RestartWith(i int, tune func(*cluster.Config)) error {
	c.mu.Lock()
	if c.nodes[i] != nil {
		c.mu.Unlock()
		return fmt.Errorf("local: node %s is running", c.cfgs[i].NodeID)
	}
	tune(&c.cfgs[i])
	c.mu.Unlock()
	return c.Restart(i)
}

// Leader waits for a node that is leader and serving, and returns its index.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		c.mu.Lock()
		for i, n := range c.nodes {
			if n != nil && n.Serving() {
				c.mu.Unlock()
				return i, nil
			}
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("local: no serving leader: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Close stops every node.
func (c *Cluster) Close() error {
	var errs []error
	for i := range c.cfgs {
		if err := c.Stop(i); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// FastRaft tunes Raft for tests: a short commit timeout, and heartbeat and
// election timeouts a little under the production defaults (elections well
// within a second or two) but with margin enough that a leader keeps its
// lease (the production one, cluster.DefaultLeaderLeaseTimeout) on a loaded
// 2-core machine under the race detector. Shorter values (400/200 ms) made
// leaders step down spuriously there. Use it as Options.Tune.
func FastRaft(cfg *cluster.Config) {
	cfg.HeartbeatTimeout = 600 * time.Millisecond
	cfg.ElectionTimeout = 600 * time.Millisecond
	cfg.LeaderLeaseTimeout = cluster.DefaultLeaderLeaseTimeout
	cfg.CommitTimeout = 10 * time.Millisecond
}
