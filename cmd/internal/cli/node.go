package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/tlsconf"
	"ticketing/cmd/internal/gctune"
)

func runNode(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return RunNode(ctx, args, stdout, stderr, NodeOptions{})
}

// NodeOptions are what a caller of RunNode plugs into the node command;
// the zero value is `ticketing node`. The lab's `ticketlab node` is this
// command with its fault injection plugged into the seams of
// cluster.Config (PeerNet, Now); the product itself sets none.
type NodeOptions struct {
	// Name is the command's name in its usage and messages; "": "ticketing
	// node".
	Name string
	// Flags, when set, adds the caller's flags to the command's.
	Flags func(fs *flag.FlagSet)
	// Setup, when set, is called with the parsed and validated config
	// before the node starts, and may set its seams. ctx ends when the
	// command is told to stop. An error refuses to start (exit 2).
	Setup func(ctx context.Context, cfg *cluster.Config, log *slog.Logger) error
}

// RunNode runs the node command with o's additions until ctx ends, and
// returns its exit code.
func RunNode(ctx context.Context, args []string, stdout, stderr io.Writer, o NodeOptions) int {
	name := o.Name
	if name == "" {
		name = "ticketing node"
	}
	var (
		prof    pprofFlag
		metrics metricsFlag
		con     consoleFlag
	)
	cfg, log, code := nodeConfig(name, args, stdout, stderr, func(fs *flag.FlagSet) {
		prof.register(fs)
		metrics.register(fs)
		con.register(fs)
		if o.Flags != nil {
			o.Flags(fs)
		}
	})
	if cfg == nil {
		return code
	}
	if err := con.check(cfg); err != nil {
		fmt.Fprintln(stderr, name+": refusing to start:", err)
		return ExitUsage
	}
	if o.Setup != nil {
		if err := o.Setup(ctx, cfg, log); err != nil {
			fmt.Fprintln(stderr, name+":", err)
			return ExitUsage
		}
	}
	stopProf, err := prof.start(log)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return ExitUsage
	}
	defer stopProf()
	gctune.Start(ctx, gctune.DefaultConfig())
	n, err := cluster.New(*cfg)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return ExitError
	}
	msrv, err := metrics.start(n.MetricsRegistry(), n.Ready, log)
	if err != nil {
		fmt.Fprintln(stderr, name+": --metrics-addr:", err)
		n.Close()
		return ExitUsage
	}
	if msrv != nil {
		// The status and inspection reports as JSON, beside the metrics.
		msrv.Handle("/v1/", n.ReportHandler())
		// Closed after the node: /readyz says 503 while it shuts down.
		defer msrv.Close()
	}
	stopConsole, err := con.start(ctx, n, cfg, log)
	if err != nil {
		fmt.Fprintln(stderr, name+": --console-addr:", err)
		n.Close()
		return ExitUsage
	}
	if stopConsole != nil {
		defer stopConsole()
	}
	sd := startSystemd(log, func() (bool, string) { return nodeStatus(n) }, func() error { return nodeAlive(n) })
	defer sd.close()
	<-ctx.Done()
	sd.stopping("shutting down")
	log.Info("shutting down")
	// A leader hands its leadership over first (bounded), so a rolling
	// restart costs clients one hand-over instead of an election timeout.
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTransferTimeout)
	defer cancel()
	if _, err := n.Shutdown(sctx); err != nil {
		log.Warn("shutdown", "err", err)
	}
	return ExitOK
}

// shutdownTransferTimeout bounds the leadership hand-over at SIGTERM.
const shutdownTransferTimeout = 5 * time.Second

// runBootstrap creates a new cluster and fencing domain: the operator's
// explicit act (cluster.Bootstrap). It takes the node's own flags, on the
// node's data dir, with the node stopped and the other initial voters up.
func runBootstrap(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var (
		newDomain bool
		floor     uint64
		timeout   time.Duration
	)
	// Accepted so the node's command line works as is; unused.
	var (
		prof    pprofFlag
		metrics metricsFlag
		con     consoleFlag
	)
	cfg, _, code := nodeConfig("ticketing bootstrap", args, stdout, stderr, func(fs *flag.FlagSet) {
		prof.register(fs)
		metrics.register(fs)
		con.register(fs)
		fs.BoolVar(&newDomain, "new-domain", false, "required: yes, create a new cluster and fencing domain")
		fs.Uint64Var(&floor, "token-floor", 0, "the new domain's tokens start above this (default: the clock in µs; "+
			"give the old domain's highest token when replacing a lost cluster)")
		fs.DurationVar(&timeout, "wait", cluster.DefaultBootstrapTimeout, "how long to wait for the other initial voters to answer")
	})
	if cfg == nil {
		return code
	}
	if !newDomain {
		fmt.Fprintln(stderr, "ticketing bootstrap: creating a cluster starts a new fencing domain whose tokens are not "+
			"comparable with any other; say so with --new-domain")
		return ExitUsage
	}
	res, err := cluster.Bootstrap(*cfg, cluster.BootstrapOptions{TokenFloor: floor, Timeout: timeout})
	if err != nil {
		fmt.Fprintln(stderr, "ticketing bootstrap:", err)
		return ExitError
	}
	fmt.Fprintf(stdout, "bootstrapped a new cluster in %s\n  domain: %s\n  tokens start above: %d\n  voters: %s\n"+
		"now start this node with the same flags as 'ticketing node'\n", cfg.DataDir, res.Domain, res.TokenFloor,
		strings.Join(res.Servers, ", "))
	return ExitOK
}

// nodeSynopsis and nodeAbout are the usage of node and bootstrap.
var (
	nodeSynopsis = map[string]string{
		"ticketing node": "ticketing node --id ID --data-dir DIR --client-addr HOST:PORT --peer-addr HOST:PORT\n" +
			"         --peers ID=HOST:PORT,... --secret-file F --peer-secret-file F [flags]\n" +
			"       ticketing node --config FILE [flags]",
		"ticketing bootstrap": "ticketing bootstrap --new-domain <the flags of ticketing node>\n" +
			"       ticketing bootstrap --new-domain --config FILE",
	}
	nodeAbout = map[string]string{
		"ticketing node": "Runs one cluster node. Every flag can also be set in the --config file (name = value,\n" +
			"the long flag name without dashes) or as $TICKETING_<NAME>.",
		"ticketing bootstrap": "Creates a new cluster and fencing domain on this node's data dir, once, with the\n" +
			"node stopped and the other initial voters running; then start the node with the\n" +
			"same flags.",
	}
)

// nodeConfig parses the node flags (plus extra ones) into a validated
// Config; a nil Config means the command returns code.
func nodeConfig(name string, args []string, stdout, stderr io.Writer, extra func(*flag.FlagSet)) (*cluster.Config, *slog.Logger, int) {
	fl := newCmdFlags(name, nodeSynopsis[name], nodeAbout[name], stdout, stderr)
	fs := fl.FlagSet
	d := cluster.DefaultConfig()
	var (
		cfg                     = d
		peers                   peersValue
		secretFile, peerSecFile string
		nextSecret, nextPeerSec string
		adminSecret             string
		tf                      tlsFlags
		logs                    logFlags
		logVerify               bool
	)
	fs.StringVar(&cfg.NodeID, "id", "", "this node's id (1-64 of A-Z a-z 0-9 . _ -)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for the Raft log, stable store and snapshots")
	fs.Var(&cfg.LogStore, "log-store", "Raft log store `KIND`: auto (the store the data dir holds; wal in a new one), wal (raft-wal, "+
		"segment files, one fsync per append) or bolt (raft-boltdb, one file raft.db, two fsyncs per append); fixed per data dir, "+
		"a node refuses a data dir the other wrote (to move a node, replace it with a fresh data dir: docs/operations.md)")
	fs.BoolVar(&logVerify, "log-verify", true, "online log verification: the leader appends checksum checkpoints and this node checks its stored log "+
		"against them (mismatches: ticketing_node_log_verifications_total and an error log; docs/operations.md, \"Log verification\")")
	fs.DurationVar(&cfg.LogVerifyInterval, "log-verify-interval", d.LogVerifyInterval, "longest time between two log verification checkpoints "+
		"while entries are appended (one also comes every 4096 entries)")
	fs.DurationVar(&cfg.PositionInterval, "position-interval", d.PositionInterval, "how often the leader tells waiters their "+
		"places in line (at most one position per waiter and interval; 10ms..1m)")
	fs.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", d.SnapshotThreshold, "log entries after the last snapshot that trigger a new one "+
		"(checked every --snapshot-interval; lower: smaller logs and more snapshots)")
	fs.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", d.SnapshotInterval, "how often the node checks whether --snapshot-threshold "+
		"entries came since its last snapshot (at a random time between one and two intervals)")
	fs.StringVar(&cfg.ClientAddr, "client-addr", "", "HOST:PORT to serve clients on")
	fs.StringVar(&cfg.AdvertiseClientAddr, "advertise-client-addr", "", "client address handed to clients in M replies (default: --client-addr)")
	fs.StringVar(&cfg.PeerAddr, "peer-addr", "", "HOST:PORT to serve Raft peers on (must match this node's entry in --peers; the node refuses to start otherwise)")
	fs.Var(&peers, "peers", "initial voters, this node included: ID=HOST:PORT,ID=HOST:PORT,ID=HOST:PORT (3 or 5)")
	fs.StringVar(&cfg.ClusterID, "cluster-id", "", "cluster id that clients and peers must present")
	fs.StringVar(&secretFile, "secret-file", "", "file holding the client secret")
	fs.StringVar(&peerSecFile, "peer-secret-file", "", "file holding the peer secret")
	fs.StringVar(&nextSecret, "next-secret-file", "", "rollover: a second client secret accepted as well")
	fs.StringVar(&nextPeerSec, "next-peer-secret-file", "", "rollover: a second peer secret accepted as well")
	fs.StringVar(&cfg.AdminAddr, "admin-addr", "", "HOST:PORT of the admin port for ticketing members (needs --admin-secret-file; default: none)")
	fs.StringVar(&adminSecret, "admin-secret-file", "", "file holding the admin secret (differs from the client and peer secrets)")
	tf.register(fs, true)
	fs.DurationVar(&cfg.HandshakeTimeout, "handshake-timeout", d.HandshakeTimeout, "time a new connection has to finish TLS and the handshake")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", d.IdleTimeout, "close a client connection that sent nothing for this long")
	fs.IntVar(&cfg.MaxKeys, "max-keys", d.MaxKeys, "max keys held at once")
	fs.IntVar(&cfg.MaxWaitersPerKey, "max-waiters-per-key", d.MaxWaitersPerKey, "max queued waiters on one key")
	fs.IntVar(&cfg.MaxWaitersPerConn, "max-waiters-per-conn", d.MaxWaitersPerConn, "max waiting acquires (queued, or with a wait and not committed yet) per client connection")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", d.MaxSessions, "max live sidecar sessions in the cluster (plus opens not committed yet)")
	fs.IntVar(&cfg.MaxSessionOutcomes, "max-session-outcomes", d.MaxSessionOutcomes, "max outcomes of one sidecar session not acknowledged by its sidecar; its acquires past it are refused")
	fs.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", d.HeartbeatTimeout, "Raft heartbeat timeout (failover detection)")
	fs.DurationVar(&cfg.ElectionTimeout, "election-timeout", d.ElectionTimeout, "Raft election timeout")
	fs.DurationVar(&cfg.LeaderLeaseTimeout, "leader-lease-timeout", d.LeaderLeaseTimeout, "how long a leader leads without a majority before it steps down")
	fs.IntVar(&cfg.MaxInFlightPerConn, "max-inflight", d.MaxInFlightPerConn, "max acquires not committed yet per client connection, and as many releases (queued waiters do not count)")
	fs.IntVar(&cfg.MaxClientConns, "max-conns", d.MaxClientConns, "max client connections")
	logs.register(fs, "info")
	if extra != nil {
		extra(fs)
	}
	if code, ok := fl.parseConfigured(args); !ok {
		return nil, nil, code
	}
	if fs.NArg() != 0 {
		return nil, nil, fl.bad("unexpected arguments %q", fs.Args())
	}
	log, _ := logs.logger(stderr)
	cfg.Logger = log
	cfg.DisableLogVerify = !logVerify
	cfg.Peers = peers.peers
	if secretFile == "" || peerSecFile == "" {
		return nil, nil, fl.bad("--secret-file and --peer-secret-file are required")
	}
	var err error
	if cfg.ClientSecret, err = cluster.ReadSecretFile(secretFile); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return nil, nil, ExitUsage
	}
	if cfg.PeerSecret, err = cluster.ReadSecretFile(peerSecFile); err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return nil, nil, ExitUsage
	}
	for _, f := range []struct {
		path string
		dst  *[]byte
	}{{nextSecret, &cfg.NextClientSecret}, {nextPeerSec, &cfg.NextPeerSecret}, {adminSecret, &cfg.AdminSecret}} {
		if f.path == "" {
			continue
		}
		if *f.dst, err = cluster.ReadSecretFile(f.path); err != nil {
			fmt.Fprintln(stderr, name+":", err)
			return nil, nil, ExitUsage
		}
	}
	if err := checkPeerAddr(cfg.NodeID, cfg.PeerAddr, cfg.Peers); err != nil {
		fmt.Fprintln(stderr, name+": refusing to start:", err)
		return nil, nil, ExitUsage
	}
	addrs := []string{cfg.ClientAddr, cfg.PeerAddr}
	if cfg.AdminAddr != "" {
		addrs = append(addrs, cfg.AdminAddr)
	}
	for _, p := range cfg.Peers {
		addrs = append(addrs, p.Addr)
	}
	if err := tf.plaintextAllowed(addrs...); err != nil {
		fmt.Fprintln(stderr, name+": refusing to start:", err)
		return nil, nil, ExitUsage
	}
	if tf.files.Enabled() {
		if cfg.ClientTLS, err = tlsconf.ServerConfig(tf.files, tf.clientCerts); err == nil {
			cfg.PeerTLS, err = tlsconf.PeerConfig(tf.files)
		}
		if err != nil {
			fmt.Fprintln(stderr, name+":", err)
			return nil, nil, ExitUsage
		}
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, name+": refusing to start:", err)
		return nil, nil, ExitUsage
	}
	return &cfg, log, ExitOK
}

// errPeerAddrMismatch: this node's entry in --peers names another address
// than --peer-addr.
var errPeerAddrMismatch = errors.New("cli: --peers names this node at another address than --peer-addr")

// checkPeerAddr refuses a node whose own entry in --peers differs from
// --peer-addr. The node listens on --peer-addr but tells its peers (and
// bootstrap writes into the configuration) the address of its --peers
// entry, so a mismatch leaves a node that listens on one port while the
// cluster dials another: a replacement started with the old voters' list
// once listened on 17504 and advertised 17502. The two match when their
// ports are equal and their hosts are the same, or --peer-addr listens on
// every interface (0.0.0.0, [::], no host), or a host name resolves to
// the other's address (a name that does not resolve now is not held
// against it).
func checkPeerAddr(id, peerAddr string, peers []cluster.Peer) error {
	var entry string
	for _, p := range peers {
		if p.ID == id {
			entry = p.Addr
		}
	}
	if entry == "" || peerAddr == "" || entry == peerAddr {
		return nil
	}
	mismatch := func() error {
		return fmt.Errorf("%w: --peer-addr is %s, but --peers lists %s=%s, the address this node would give its peers. "+
			"Fix --peers: a replacement node, or one that joins as a learner, needs no --peers at all (leave it out: "+
			"--peers only names the initial voters, for bootstrap); otherwise make the %s= entry %s. "+
			"If the entry is right, fix --peer-addr to %s instead",
			errPeerAddrMismatch, peerAddr, id, entry, id, peerAddr, entry)
	}
	lh, lp, err1 := net.SplitHostPort(peerAddr)
	eh, ep, err2 := net.SplitHostPort(entry)
	if err1 != nil || err2 != nil {
		return nil // each is checked on its own (Validate, ValidateVoters)
	}
	if lp != ep {
		return mismatch()
	}
	if wildcard(lh) || strings.EqualFold(lh, eh) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	la, lerr := net.DefaultResolver.LookupHost(ctx, lh)
	ea, eerr := net.DefaultResolver.LookupHost(ctx, eh)
	if lerr != nil || eerr != nil {
		return nil
	}
	for _, a := range la {
		if slices.Contains(ea, a) {
			return nil
		}
	}
	return mismatch()
}

// peersValue is --peers, checked when set (so a bad value in the --config
// file is reported with its line).
type peersValue struct {
	text  string
	peers []cluster.Peer
}

func (p *peersValue) String() string { return p.text }

func (p *peersValue) Set(s string) error {
	peers, err := cluster.ParsePeers(s)
	if err == nil && len(peers) > 0 {
		err = cluster.ValidateVoters(peers)
	}
	if err != nil {
		return err
	}
	p.text, p.peers = s, peers
	return nil
}
