package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster"
	"ticketing/cluster/console"
	"ticketing/cluster/local"
	"ticketing/cluster/wire"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	fs := newCmdFlags("ticketing dev", "ticketing dev [--dir DIR] [--socket PATH] [--base-port N] [--nodes 3|5] [--plaintext] [--log-store auto|bolt|wal]",
		"Runs a real cluster of 3 (or 5) nodes on loopback in this process, with a sidecar\n"+
			"serving the unix socket, prints their addresses, the client secret file, the CA,\n"+
			"the nodes' admin ports with the export line after which ticketing status,\n"+
			"members list and inspect KEY need no flags, and a ready line, and runs until\n"+
			"Ctrl-C (SIGINT) or SIGTERM.", stdout, stderr)
	var (
		dir      string
		socket   string
		basePort int
		nodes    int
		plain    bool
		store    = cluster.DefaultLogStore
		logs     logFlags
		conAddr  string
	)
	fs.StringVar(&dir, "dir", "", "directory for the nodes' data and secrets (default: a new temporary directory, removed on exit)")
	fs.StringVar(&socket, "socket", "./ticketing.sock", "unix socket of the sidecar that dev runs in process, connected to its nodes")
	fs.IntVar(&basePort, "base-port", 7400, "node i listens for clients on 127.0.0.1:BASE+i, for peers on BASE+100+i and for admin requests on BASE+200+i, and the console on BASE+300; 0 picks free ports. "+
		"A --dir that holds a cluster keeps the ports it was created with (saved in DIR/addrs); another --base-port is refused")
	fs.IntVar(&nodes, "nodes", 3, "number of nodes: 3 or 5")
	fs.BoolVar(&plain, "plaintext", false, "run the ports without TLS (default: TLS with a throwaway CA in DIR/tls)")
	fs.Var(&store, "log-store", "the nodes' Raft log store `KIND` (ticketing node's --log-store): auto (wal for a new --dir, "+
		"a --dir that holds a cluster keeps the store it was created with), bolt or wal (another store than the --dir's is refused)")
	fs.StringVar(&conAddr, "console-addr", "", "loopback HOST:PORT of the web console, which shows whichever node leads "+
		"(default: 127.0.0.1:BASE+300, a free port with --base-port 0; off: none)")
	logs.register(fs.FlagSet, "warn")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		return fs.bad("unexpected arguments %q", fs.Args())
	}
	if nodes != 3 && nodes != 5 {
		return fs.bad("--nodes %d: want 3 or 5", nodes)
	}
	if basePort < 0 || basePort > 65535-300 {
		return fs.bad("--base-port %d: want 0 (free ports) or 1..65235", basePort)
	}
	if conAddr != "" && conAddr != "off" && !isLoopback(conAddr) {
		return fs.bad("--console-addr %s: dev serves its console on loopback only", conAddr)
	}
	log, _ := logs.logger(stderr)
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if dir != "" && local.HasCluster(dir) {
		if !given["base-port"] {
			basePort = 0 // the ports the cluster in dir was created with
		}
		// The nodes' own warning is quieted while they start (devLogs):
		// say it once for the cluster.
		if k, err := local.LogStoreOf(dir); err == nil && k == cluster.LogStoreBolt && store == cluster.LogStoreAuto {
			log.Warn("this --dir holds a cluster on the bolt log store (raft.db): its nodes stay on bolt, and a new --dir "+
				"gets wal; --log-store bolt keeps bolt without this line", "dir", dir)
		}
	}
	var err error
	if dir == "" {
		if dir, err = os.MkdirTemp("", "ticketing-dev-"); err != nil {
			fmt.Fprintln(stderr, "ticketing dev:", err)
			return ExitError
		}
		defer os.RemoveAll(dir)
	}
	start := time.Now()
	// The nodes log through devLogs, which keeps the expected warnings of
	// starting and stopping them quiet.
	nodeLogs := newDevLogs(log.Handler())
	// An admin port on every node, so that status, members and inspect
	// work against dev as against a real cluster (its own third secret).
	adminSecretFile := filepath.Join(dir, "admin.secret")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		fmt.Fprintln(stderr, "ticketing dev:", err)
		return ExitError
	}
	adminSecret, err := local.EnsureSecret(adminSecretFile)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing dev:", err)
		return ExitError
	}
	c, err := local.Start(local.Options{Dir: dir, Nodes: nodes, BasePort: basePort, Logger: slog.New(nodeLogs), TLS: !plain,
		LogStore: store, AdminSecret: adminSecret})
	if err != nil {
		nodeLogs.failed()
		fmt.Fprintln(stderr, "ticketing dev:", err)
		switch {
		case errors.Is(err, local.ErrAddrsChanged):
			fmt.Fprintln(stderr, "ticketing dev: start it without --base-port (its saved ports are reused), or use a fresh --dir")
		case basePort != 0:
			fmt.Fprintln(stderr, "ticketing dev: (another dev cluster running? try --base-port with other ports)")
		}
		return ExitError
	}
	defer func() {
		// Its nodes' logs are quiet while they stop (devLogs); this says
		// whether they stopped cleanly.
		if err := c.Close(); err != nil {
			fmt.Fprintln(stderr, "ticketing dev: stopping the nodes:", err)
			if code == ExitOK {
				code = ExitError
			}
		}
	}()
	fmt.Fprintf(stdout, "ticketing dev: %d-node cluster %q in %s\n", c.Size(), c.ClusterID, dir)
	for i := 0; i < c.Size(); i++ {
		fmt.Fprintf(stdout, "  node %s  client %s\n", c.ID(i), c.ClientAddr(i))
	}
	fmt.Fprintf(stdout, "  client secret file: %s\n", c.SecretFile)
	if c.CAFile != "" {
		fmt.Fprintf(stdout, "  tls ca file: %s\n", c.CAFile)
	}
	var admins []string
	for i := 0; i < c.Size(); i++ {
		admins = append(admins, c.AdminAddr(i))
	}
	// Absolute paths, so that the line works from any directory.
	secretAbs, caAbs := absOr(adminSecretFile), c.CAFile
	if caAbs != "" {
		caAbs = absOr(caAbs)
	}
	fmt.Fprintf(stdout, "  admin ports: %s; for ticketing status, members list and inspect KEY run:\n", strings.Join(admins, ","))
	fmt.Fprintf(stdout, "  %s\n", adminExportLine(admins, secretAbs, caAbs, c.ClusterID))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	li, err := c.Leader(wctx)
	cancel()
	if err != nil {
		nodeLogs.failed()
		fmt.Fprintln(stderr, "ticketing dev:", err)
		return ExitError
	}
	// The sidecar, in process, like `ticketing sidecar` would run it.
	bcfg := sidecar.DefaultConfig()
	bcfg.Addrs, bcfg.Secret, bcfg.ClusterID, bcfg.TLS = c.ClientAddrs(), c.ClientSecret, c.ClusterID, c.ClientTLS
	ucfg := unixapi.DefaultConfig()
	ucfg.Path = socket
	shown, err := filepath.Abs(socket) // for display: the listener keeps the path as given (sun_path is short)
	if err != nil {
		shown = socket
	}
	b, srv, err := startSidecar(bcfg, ucfg, log)
	if err != nil {
		nodeLogs.failed()
		fmt.Fprintln(stderr, "ticketing dev: sidecar:", err)
		return ExitError
	}
	defer stopSidecar(b, srv, log)
	fmt.Fprintf(stdout, "  sidecar socket: %s\n", shown)
	if conAddr != "off" {
		if conAddr == "" {
			conAddr = "127.0.0.1:0"
			if basePort != 0 {
				conAddr = fmt.Sprintf("127.0.0.1:%d", basePort+300)
			}
		}
		url, stop, err := serveConsole(ctx, conAddr, leaderSource{c}, adminSecret, nil, log)
		if err != nil {
			nodeLogs.failed()
			fmt.Fprintln(stderr, "ticketing dev: --console-addr:", err)
			return ExitError
		}
		defer stop()
		fmt.Fprintf(stdout, "  console: %s (log in with the admin secret, %s)\n", url, secretAbs)
	}
	wctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	err = ticketing.WaitReady(wctx, ucfg.Path)
	cancel()
	if err != nil {
		nodeLogs.failed()
		fmt.Fprintln(stderr, "ticketing dev:", err)
		return ExitError
	}
	// The followers' first contact with the leader (raft warns of their
	// empty logs) is over once each has applied what the leader had
	// committed when it began to serve.
	caughtUp(ctx, c, li, 5*time.Second)
	nodeLogs.serving()
	fmt.Fprintf(stdout, "ticketing dev: ready in %v: leader %s at %s (Ctrl-C stops)\n",
		time.Since(start).Round(time.Millisecond), c.ID(li), c.ClientAddr(li))
	<-ctx.Done()
	nodeLogs.stopping()
	fmt.Fprintln(stdout, "ticketing dev: stopping")
	return ExitOK
}

// leaderSource is dev's console: whichever node leads (its cluster runs in
// this process), else the first node that runs.
type leaderSource struct{ c *local.Cluster }

func (l leaderSource) node() *cluster.Node {
	var first *cluster.Node
	for i := 0; i < l.c.Size(); i++ {
		n := l.c.Node(i)
		if n == nil {
			continue
		}
		if n.Serving() {
			return n
		}
		if first == nil {
			first = n
		}
	}
	return first
}

func (l leaderSource) Sample(lines int) console.Sample {
	if n := l.node(); n != nil {
		return n.ConsoleSource().Sample(lines)
	}
	return console.Sample{Role: "shutdown"}
}

func (l leaderSource) Key(key string) (wire.KeyReport, error) {
	if n := l.node(); n != nil {
		return n.Inspect(key)
	}
	return wire.KeyReport{}, cluster.ErrClosing
}

// Revoke goes to the node that leads (the revoke needs the leader).
func (l leaderSource) Revoke(ctx context.Context, key string, token uint64, by, reason string) (wire.RevokeReport, error) {
	if n := l.node(); n != nil {
		return n.Revoke(ctx, key, token, by, reason)
	}
	return wire.RevokeReport{}, cluster.ErrClosing
}

// absOr returns path made absolute, or as it is if that fails.
func absOr(path string) string {
	if a, err := filepath.Abs(path); err == nil {
		return a
	}
	return path
}

// caughtUp waits, at most max, until every node has applied the leader's
// commit index.
func caughtUp(ctx context.Context, c *local.Cluster, leader int, max time.Duration) {
	ln := c.Node(leader)
	if ln == nil {
		return
	}
	target := ln.Raft().CommitIndex()
	for until := time.Now().Add(max); time.Now().Before(until) && ctx.Err() == nil; time.Sleep(10 * time.Millisecond) {
		done := true
		for i := 0; i < c.Size(); i++ {
			if n := c.Node(i); n != nil && n.Raft().AppliedIndex() < target {
				done = false
			}
		}
		if done {
			return
		}
	}
}

// devLogs is the handler of dev's nodes' logs. dev starts a cluster's
// nodes and stops them all at once, and the nodes warn of what that looks
// like from inside: a fresh node's empty data dir, raft's first election
// and its followers' empty logs, a leader that stops serving because it
// shuts down. Those warnings are expected, so while dev starts the nodes
// and while it stops them, devLogs logs warnings at info (shown with
// --log-level info). If the start fails it prints the warnings it quieted,
// at their own level, since they then tell why. While it stops them it
// quiets errors too: with every node going at once, a follower closing
// under the leader's replication makes raft log errors on both sides
// ("failed to decode incoming command: transport shutdown", "failed to
// appendEntries to ... EOF"). Whether each node closed cleanly is what
// Cluster.Close returns, which dev prints. Between the two, and for errors
// while starting, records pass unchanged.
type devLogs struct {
	inner slog.Handler
	st    *devLogState
}

type devLogState struct {
	mu    sync.Mutex
	quiet bool
	// stopping quiets errors too: see devLogs.
	stopping bool
	keep     bool         // keeping the quieted records (while starting)
	held     []heldRecord // the start's quieted warnings, the most recent maxHeld
}

type heldRecord struct {
	h slog.Handler
	r slog.Record
}

const maxHeld = 200

func newDevLogs(inner slog.Handler) *devLogs {
	return &devLogs{inner: inner, st: &devLogState{quiet: true, keep: true}}
}

func (d *devLogs) Enabled(ctx context.Context, l slog.Level) bool { return d.inner.Enabled(ctx, l) }

func (d *devLogs) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		d.st.mu.Lock()
		quiet := d.st.quiet && (r.Level < slog.LevelError || d.st.stopping)
		if quiet {
			if d.st.keep {
				if len(d.st.held) == maxHeld {
					d.st.held = d.st.held[1:]
				}
				d.st.held = append(d.st.held, heldRecord{d.inner, r.Clone()})
			}
			r.Level = slog.LevelInfo
		}
		d.st.mu.Unlock()
		if !d.inner.Enabled(ctx, r.Level) {
			return nil
		}
	}
	return d.inner.Handle(ctx, r)
}

func (d *devLogs) WithAttrs(a []slog.Attr) slog.Handler {
	return &devLogs{inner: d.inner.WithAttrs(a), st: d.st}
}

func (d *devLogs) WithGroup(name string) slog.Handler {
	return &devLogs{inner: d.inner.WithGroup(name), st: d.st}
}

// serving: the cluster is up; warnings from now on are news.
func (d *devLogs) serving() {
	d.st.mu.Lock()
	defer d.st.mu.Unlock()
	d.st.quiet, d.st.keep, d.st.held = false, false, nil
}

// stopping: dev is shutting the nodes down.
func (d *devLogs) stopping() {
	d.st.mu.Lock()
	defer d.st.mu.Unlock()
	d.st.quiet, d.st.stopping, d.st.keep = true, true, false
}

// failed: the start failed; print what was quieted, at its own level.
func (d *devLogs) failed() {
	d.st.mu.Lock()
	held := d.st.held
	d.st.quiet, d.st.keep, d.st.held = false, false, nil
	d.st.mu.Unlock()
	for _, h := range held {
		if h.h.Enabled(context.Background(), h.r.Level) {
			_ = h.h.Handle(context.Background(), h.r) // a log line that cannot be written has nowhere else to go
		}
	}
}
