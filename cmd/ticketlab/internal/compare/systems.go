package compare

import (
	"bufio"
	"context"
	"debug/buildinfo"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/localproc"
	"ticketing/cmd/ticketlab/internal/floor"
	"ticketing/sidecar"
)

// A System is one lock service under test. The runner asks it for the
// clients of one run, prepares the run's keys, and closes the clients at
// the end of the run.
type System interface {
	Name() string
	// Setup describes how the system runs and how durable it is.
	Setup() string
	// Version names the server's version ("" if unknown).
	Version() string
	// Clients creates n clients for one run; done releases what they
	// share. Creating them is not measured.
	Clients(ctx context.Context, n int) (clients []Client, done func(), err error)
	// Prepare is called before a run with every key the run may use.
	Prepare(ctx context.Context, keys []string) error
	// Processes lists the server processes whose CPU time a run counts,
	// with their roles now; it is called before each run's clients start.
	Processes(ctx context.Context) ([]Process, error)
	Close()
}

// A Client is one lock user: a connection or session of its own where the
// system has them.
type Client interface {
	// Acquire waits for key (the lease, TTL or expiry is 30 s everywhere)
	// and returns what Release needs. When ctx ends it gives up.
	Acquire(ctx context.Context, key string) (Held, error)
	Close()
}

// Held is a granted lock.
type Held interface {
	Release(ctx context.Context) error
}

// Lease is the lock's lease (Ticketing, Redis expiry) or session TTL (etcd,
// ZooKeeper) in every system.
const Lease = 30 * time.Second

// TicketingWait is the wait sent with every Ticketing acquire (the protocol
// has no infinite wait; 60 s is far above any wait in these runs).
const TicketingWait = 60 * time.Second

// ---------------------------------------------------------------------------
// Ticketing: three `ticketing node` processes and one `ticketing sidecar`
// process, shared by the two Ticketing systems.

type ticketingCluster struct {
	procs  *localproc.Procs
	dir    string
	sock   string
	broker *sidecar.Broker
	opts   ticketingOptions
	ver    string
}

// ticketingOptions are how the Ticketing processes run.
type ticketingOptions struct {
	// Binary is the ticketing executable.
	Binary string
	// Dir holds the nodes' data dirs and logs.
	Dir string
	// TLS runs nodes and sidecar over TLS 1.3.
	TLS bool
	// LogStore is the nodes' Raft log store, "wal" or "bolt", passed as
	// --log-store KIND either way: a node's default (auto: wal for a new
	// data dir) was bolt before, so nothing would mean bolt to an older
	// binary and wal to a newer one. "" passes nothing.
	LogStore string
	// NodeArgs and SidecarArgs are appended to every node's and to the
	// sidecar's command line.
	NodeArgs, SidecarArgs []string
}

// nodeArgs is the nodes' command line after localproc's own flags.
func (o ticketingOptions) nodeArgs() []string {
	args := []string{"--log-level", "warn"}
	if o.LogStore != "" {
		args = append(args, "--log-store", o.LogStore)
	}
	return append(args, o.NodeArgs...)
}

// sidecarArgs is the sidecar's command line after localproc's own flags.
func (o ticketingOptions) sidecarArgs() []string {
	return append([]string{"--log-level", "warn"}, o.SidecarArgs...)
}

// startTicketing starts three durable node processes (TLS on unless
// o.TLS is false, as `ticketlab bench` does) and one sidecar process.
func startTicketing(ctx context.Context, o ticketingOptions) (*ticketingCluster, error) {
	sockDir, err := os.MkdirTemp("", "tb-sock-") // a unix socket path must stay short
	if err != nil {
		return nil, err
	}
	p, err := localproc.Start(localproc.Options{Binary: o.Binary, Dir: filepath.Join(o.Dir, "cluster"), Nodes: 3, TLS: o.TLS,
		ClusterID: "ticketbench", Sidecars: 1, SocketDir: sockDir,
		ExtraArgs: o.nodeArgs(), SidecarArgs: o.sidecarArgs()})
	if err != nil {
		os.RemoveAll(sockDir)
		return nil, err
	}
	tc := &ticketingCluster{procs: p, dir: sockDir, sock: p.SidecarSocket(0), opts: o}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := p.Leader(wctx); err != nil {
		tc.Close()
		return nil, err
	}
	if err := ticketing.WaitReady(wctx, tc.sock); err != nil {
		tc.Close()
		return nil, err
	}
	bcfg := sidecar.DefaultConfig()
	bcfg.Addrs, bcfg.Secret, bcfg.ClusterID, bcfg.TLS = p.ClientAddrs(), p.ClientSecret, p.ClusterID, p.ClientTLS
	bcfg.Logger = slog.New(slog.DiscardHandler)
	if tc.broker, err = sidecar.New(bcfg); err != nil {
		tc.Close()
		return nil, err
	}
	for tc.broker.Info().Leader == "" {
		if wctx.Err() != nil {
			tc.Close()
			return nil, fmt.Errorf("in-process broker found no leader: %w", wctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
	tc.ver = binaryVersion(o.Binary)
	return tc, nil
}

func (tc *ticketingCluster) Close() {
	if tc.broker != nil {
		tc.broker.Close()
	}
	tc.procs.Close()
	os.RemoveAll(tc.dir)
}

func (tc *ticketingCluster) setup(via string) string {
	t := "TLS 1.3"
	if !tc.opts.TLS {
		t = "plaintext"
	}
	store := "raft-wal"
	if tc.opts.LogStore == floor.Bolt {
		store = "bolt"
	}
	s := fmt.Sprintf("3 `ticketing node` processes on loopback (%s), every Raft entry fsynced (%s, group commit); %s; lease 30 s, wait 60 s", t, store, via)
	if len(tc.opts.NodeArgs) > 0 {
		s += "; node flags `" + strings.Join(tc.opts.NodeArgs, " ") + "`"
	}
	if len(tc.opts.SidecarArgs) > 0 {
		s += "; sidecar flags `" + strings.Join(tc.opts.SidecarArgs, " ") + "`"
	}
	return s
}

// processes lists the three nodes (the leader found by asking them) and,
// with sidecar, the sidecar process.
func (tc *ticketingCluster) processes(ctx context.Context, sidecar bool) ([]Process, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	leader, err := tc.procs.Leader(lctx)
	if err != nil {
		return nil, err
	}
	var out []Process
	for i := 0; i < tc.procs.Size(); i++ {
		role := "follower"
		if i == leader {
			role = "leader"
		}
		out = append(out, Process{Name: tc.procs.ID(i), Role: role, Pid: tc.procs.Pid(i)})
	}
	if sidecar {
		out = append(out, Process{Name: "sidecar1", Role: "sidecar", Pid: tc.procs.SidecarPid(0)})
	}
	for _, p := range out {
		if p.Pid == 0 {
			return nil, fmt.Errorf("%s is not running", p.Name)
		}
	}
	return out, nil
}

// ticketingSidecar: each client is one unix connection to the sidecar
// process, speaking the line protocol.
type ticketingSidecar struct{ tc *ticketingCluster }

func (s *ticketingSidecar) Name() string { return "ticketing-sidecar" }
func (s *ticketingSidecar) Setup() string {
	return s.tc.setup("one `ticketing sidecar` process; each client its own unix-socket connection (ACQUIRE/RELEASE lines)")
}
func (s *ticketingSidecar) Version() string                         { return s.tc.ver }
func (s *ticketingSidecar) Prepare(context.Context, []string) error { return nil }
func (s *ticketingSidecar) Close()                                  {}

// Processes: the nodes and the sidecar.
func (s *ticketingSidecar) Processes(ctx context.Context) ([]Process, error) {
	return s.tc.processes(ctx, true)
}

func (s *ticketingSidecar) Clients(ctx context.Context, n int) ([]Client, func(), error) {
	var out []Client
	for i := 0; i < n; i++ {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", s.tc.sock)
		if err != nil {
			closeAll(out)
			return nil, nil, err
		}
		out = append(out, &lineClient{conn: c, r: bufio.NewReader(c)})
	}
	return out, func() {}, nil
}

// lineClient is one synchronous unix-socket session.
type lineClient struct {
	conn net.Conn
	r    *bufio.Reader
}

func (c *lineClient) do(ctx context.Context, line string) (string, error) {
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.conn.Write([]byte(line)); err != nil {
		return "", err
	}
	reply, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(reply, "\n"), nil
}

func (c *lineClient) Acquire(ctx context.Context, key string) (Held, error) {
	r, err := c.do(ctx, fmt.Sprintf("ACQUIRE %s %d %d\n", key, int(Lease/time.Second), int(TicketingWait/time.Second)))
	if err != nil {
		return nil, err
	}
	tok, ok := strings.CutPrefix(r, "OK ")
	if !ok {
		return nil, fmt.Errorf("ACQUIRE: %s", r)
	}
	if _, err := strconv.ParseUint(tok, 10, 64); err != nil {
		return nil, fmt.Errorf("ACQUIRE: %s", r)
	}
	return lineHeld{c, key, tok}, nil
}

type lineHeld struct {
	c        *lineClient
	key, tok string
}

func (h lineHeld) Release(ctx context.Context) error {
	r, err := h.c.do(ctx, "RELEASE "+h.key+" "+h.tok+"\n")
	if err != nil {
		return err
	}
	if r != "OK" {
		return fmt.Errorf("RELEASE: %s", r)
	}
	return nil
}

func (c *lineClient) Close() { c.conn.Close() }

// ticketingBroker: the in-process Broker (sidecar.New), shared by every
// client of the run; each client is its own owner.
type ticketingBroker struct{ tc *ticketingCluster }

func (s *ticketingBroker) Name() string { return "ticketing-broker" }
func (s *ticketingBroker) Setup() string {
	return s.tc.setup("one in-process Broker (sidecar.New) shared by all clients, each client its own owner")
}
func (s *ticketingBroker) Version() string                         { return s.tc.ver }
func (s *ticketingBroker) Prepare(context.Context, []string) error { return nil }
func (s *ticketingBroker) Close()                                  {}

// Processes: the nodes only; the Broker runs in the harness, whose CPU is
// counted beside them.
func (s *ticketingBroker) Processes(ctx context.Context) ([]Process, error) {
	return s.tc.processes(ctx, false)
}

func (s *ticketingBroker) Clients(ctx context.Context, n int) ([]Client, func(), error) {
	var out []Client
	for i := 0; i < n; i++ {
		out = append(out, &brokerClient{b: s.tc.broker, owner: fmt.Sprintf("tb.%d", i)})
	}
	return out, func() {}, nil
}

type brokerClient struct {
	b     *sidecar.Broker
	owner string
}

func (c *brokerClient) Acquire(ctx context.Context, key string) (Held, error) {
	l, err := c.b.Acquire(ctx, key, c.owner, Lease, TicketingWait)
	if err != nil {
		return nil, err
	}
	return brokerHeld{c.b, l}, nil
}

type brokerHeld struct {
	b *sidecar.Broker
	l sidecar.Lock
}

func (h brokerHeld) Release(ctx context.Context) error { return h.b.Release(ctx, h.l) }
func (c *brokerClient) Close()                         {}

func closeAll(cs []Client) {
	for _, c := range cs {
		c.Close()
	}
}

// binaryVersion names the ticketing binary's VCS revision, from its build
// information, or else from the repository the binary was built from
// (read-only git commands).
func binaryVersion(bin string) string {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return ""
	}
	var rev, mod string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				mod = "+modified"
			}
		}
	}
	if rev == "" {
		if root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "ticketing").Output(); err == nil {
			dir := strings.TrimSpace(string(root))
			if out, err := exec.Command("git", "-C", dir, "rev-parse", "HEAD").Output(); err == nil {
				rev = strings.TrimSpace(string(out))
				if exec.Command("git", "-C", dir, "diff", "--quiet", "HEAD").Run() != nil {
					mod = "+modified"
				}
			}
		}
	}
	if rev == "" {
		return bi.GoVersion
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	return rev + mod + " (" + bi.GoVersion + ")"
}

// BinaryVersion names the ticketing binary's VCS revision (as the systems
// table of results.md does), for the other benchmarks' results files.
func BinaryVersion(bin string) string { return binaryVersion(bin) }
