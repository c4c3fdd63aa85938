// Package localproc runs a Ticketing cluster as processes on loopback:
// `ticketing node` processes (bootstrapped with `ticketing bootstrap`) and
// optional `ticketing sidecar` processes, each stopped, paused, killed and
// restarted at will. The product's process tests (cmd/ticketing) and the
// lab (cmd/ticketlab) use it; the ticketing binary does not link it.
package localproc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/tlsconf"
	"ticketing/cluster/wire"
)

// Options configures Start.
type Options struct {
	// Binary is the ticketing executable to run as `Binary node ...` (and
	// `Binary sidecar ...`).
	Binary string
	// Dir holds one data dir and one log file per node, and the secrets.
	Dir string
	// Nodes is the number of node processes: 3 (zero) or 5, or more with
	// Voters.
	Nodes int
	// Voters is how many of the nodes are initial voters: 3 or 5, at most
	// Nodes; zero means all. The others are spares: they start with empty
	// data dirs and no --peers, and wait until added as learners (`ticketing
	// members add-learner` or `replace`).
	Voters int
	// ClusterID is the cluster id; "" means "bench".
	ClusterID string
	// ExtraArgs are appended to every node's command line.
	ExtraArgs []string
	// Command, when set, gives the command line of each node and sidecar
	// process instead of `Binary ARGS...`: it is called with the process's
	// name (the node id, or sidecarJ) and ARGS (starting with "node" or
	// "sidecar") and returns the executable and its arguments. The lab runs
	// its fault-injecting `ticketlab node` and `ticketlab sidecar` this
	// way. `ticketing bootstrap` always runs Binary.
	Command func(name string, args []string) (bin string, argv []string)
	// Sidecars is how many `ticketing sidecar` processes to start, each on
	// its own socket in Dir and connected to every node. Zero: none.
	Sidecars int
	// SidecarArgs are appended to every sidecar's command line.
	SidecarArgs []string
	// SocketDir holds the sidecars' unix sockets; "" means Dir. (A socket
	// path must stay under ~107 bytes.)
	SocketDir string
	// TLS, when set, issues a throwaway CA and node certificates into
	// Dir/tls and starts nodes with --tls-cert/--tls-key/--tls-ca and
	// sidecars with --tls-ca.
	TLS bool
	// Admin gives every node an admin port (Dir/admin.secret) for
	// membership changes; see Procs.Admin.
	Admin bool
}

// proc is one child process that can be stopped and started again.
type proc struct {
	name string
	bin  string   // executable
	args []string // its arguments
	// bootArgs are the product's node arguments, for `ticketing bootstrap`.
	bootArgs []string
	log      string // log file (stdout and stderr, appended)
	// reserved holds a node's ports from the moment they are picked
	// until its first start. A port picked and let go at once stays free
	// for as long as node 1 waits for the other nodes and the bootstrap,
	// and another test process picking ports meanwhile (local.Cluster
	// does, from the same range) could take it: node 1 then never binds
	// and the cluster never elects.
	reserved []net.Listener

	cmd  *exec.Cmd // nil while not running
	exit chan struct{}
}

// Procs is a cluster of `ticketing node` processes on loopback, with
// optional sidecar processes.
type Procs struct {
	opts           Options
	ClientSecret   []byte
	ClusterID      string
	SecretFile     string // client secret file
	PeerSecretFile string
	// AdminSecretFile holds the admin secret ("" without Options.Admin).
	AdminSecretFile string
	// TokenFloor is the domain's token floor (from ticketing bootstrap).
	TokenFloor uint64
	// CAFile and ClientTLS: see local.Cluster; "" and nil without TLS.
	CAFile      string
	ClientTLS   *tls.Config
	ids         []string
	clientAddrs []string
	peerAddrs   []string
	adminAddrs  []string // with Options.Admin
	adminSecret []byte

	mu       sync.Mutex
	nodes    []*proc
	sidecars []*proc
}

// Start starts every node process, then every sidecar process (it does
// not wait for a leader or for the sidecars' sockets).
func Start(opts Options) (*Procs, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Voters == 0 {
		opts.Voters = opts.Nodes
	}
	if opts.ClusterID == "" {
		opts.ClusterID = "bench"
	}
	if opts.Voters > opts.Nodes {
		return nil, fmt.Errorf("localproc: %d voters of %d nodes", opts.Voters, opts.Nodes)
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	secretFile := filepath.Join(opts.Dir, "client.secret")
	peerSecretFile := filepath.Join(opts.Dir, "peer.secret")
	secret, err := local.EnsureSecret(secretFile)
	if err != nil {
		return nil, err
	}
	if _, err := local.EnsureSecret(peerSecretFile); err != nil {
		return nil, err
	}
	adminSecretFile := filepath.Join(opts.Dir, "admin.secret")
	var adminSecret []byte
	if opts.Admin {
		if adminSecret, err = local.EnsureSecret(adminSecretFile); err != nil {
			return nil, err
		}
	} else {
		adminSecretFile = ""
	}
	lns, err := reservePorts(3 * opts.Nodes)
	if err != nil {
		return nil, err
	}
	defer func() { closeListeners(lns) }() // those not handed to a node (on an error)
	ports := make([]int, len(lns))
	for i, l := range lns {
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	p := &Procs{opts: opts, ClientSecret: secret, ClusterID: opts.ClusterID,
		SecretFile: secretFile, PeerSecretFile: peerSecretFile, AdminSecretFile: adminSecretFile, adminSecret: adminSecret}
	var peers []string
	for i := 0; i < opts.Nodes; i++ {
		id := fmt.Sprintf("n%d", i+1)
		p.ids = append(p.ids, id)
		p.clientAddrs = append(p.clientAddrs, fmt.Sprintf("127.0.0.1:%d", ports[3*i]))
		p.peerAddrs = append(p.peerAddrs, fmt.Sprintf("127.0.0.1:%d", ports[3*i+1]))
		if i < opts.Voters {
			peers = append(peers, fmt.Sprintf("%s=127.0.0.1:%d", id, ports[3*i+1]))
		}
	}
	var nodeTLS map[string]tlsconf.Files
	if opts.TLS {
		if p.CAFile, nodeTLS, err = local.DevTLS(filepath.Join(opts.Dir, "tls"), p.ids); err == nil {
			p.ClientTLS, err = tlsconf.ClientConfig(tlsconf.Files{CAFile: p.CAFile})
		}
		if err != nil {
			return nil, err
		}
	}
	for i := 0; i < opts.Nodes; i++ {
		args := []string{"node",
			"--id", p.ids[i],
			"--data-dir", p.DataDir(i),
			"--client-addr", p.clientAddrs[i],
			"--peer-addr", fmt.Sprintf("127.0.0.1:%d", ports[3*i+1]),
			"--cluster-id", p.ClusterID,
			"--secret-file", secretFile,
			"--peer-secret-file", peerSecretFile,
		}
		if i < opts.Voters {
			args = append(args, "--peers", strings.Join(peers, ","))
		}
		if f, ok := nodeTLS[p.ids[i]]; ok {
			args = append(args, "--tls-cert", f.CertFile, "--tls-key", f.KeyFile, "--tls-ca", f.CAFile)
		}
		if opts.Admin {
			p.adminAddrs = append(p.adminAddrs, fmt.Sprintf("127.0.0.1:%d", ports[3*i+2]))
			args = append(args, "--admin-addr", p.adminAddrs[i], "--admin-secret-file", adminSecretFile)
		}
		pr := p.newProc(p.ids[i], append(args, opts.ExtraArgs...))
		pr.reserved = append([]net.Listener(nil), lns[3*i:3*i+3]...)
		clear(lns[3*i : 3*i+3])
		p.nodes = append(p.nodes, pr)
	}
	for j := 0; j < opts.Sidecars; j++ {
		name := fmt.Sprintf("sidecar%d", j+1)
		args := []string{"sidecar",
			"--cluster", strings.Join(p.clientAddrs, ","),
			"--cluster-id", p.ClusterID,
			"--secret-file", secretFile,
			"--socket", p.SidecarSocket(j),
			"--socket-mode", "0600",
			"--owner-prefix", name,
		}
		if p.CAFile != "" {
			args = append(args, "--tls-ca", p.CAFile)
		}
		p.sidecars = append(p.sidecars, p.newProc(name, append(args, opts.SidecarArgs...)))
	}
	// Nodes 2..N start empty and wait; `ticketing bootstrap --new-domain`
	// then creates the cluster in node 1's data dir (asking them for their
	// server ids), and node 1 starts (see cluster/bootstrap.go).
	for i := 1; i < len(p.nodes); i++ {
		if err := p.Start(i); err != nil {
			p.Close()
			return nil, err
		}
	}
	if _, err := os.Stat(filepath.Join(p.DataDir(0), "identity")); errors.Is(err, os.ErrNotExist) {
		args := append([]string{"bootstrap", "--new-domain"}, p.nodes[0].bootArgs...)
		out, err := exec.Command(opts.Binary, args...).CombinedOutput()
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("localproc: bootstrap %s: %w\n%s", p.ids[0], err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "tokens start above: "); ok {
				p.TokenFloor, _ = strconv.ParseUint(v, 10, 64)
			}
		}
	}
	if err := p.Start(0); err != nil {
		p.Close()
		return nil, err
	}
	for j := range p.sidecars {
		if err := p.StartSidecar(j); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// newProc is the process name running args (Options.Command applied).
func (p *Procs) newProc(name string, args []string) *proc {
	pr := &proc{name: name, bin: p.opts.Binary, args: args, log: filepath.Join(p.opts.Dir, name+".log")}
	if args[0] == "node" {
		pr.bootArgs = args[1:]
	}
	if p.opts.Command != nil {
		pr.bin, pr.args = p.opts.Command(name, append([]string(nil), args...))
	}
	return pr
}

// reservePorts listens on n loopback ports below the ephemeral range (so
// that a restarted node gets its ports back), for the caller to close
// just before the process that will bind them starts.
func reservePorts(n int) ([]net.Listener, error) {
	var lns []net.Listener
	for i := 0; i < n; i++ {
		l, err := local.ListenLoopback()
		if err != nil {
			closeListeners(lns)
			return nil, err
		}
		lns = append(lns, l)
	}
	return lns, nil
}

func closeListeners(lns []net.Listener) {
	for _, l := range lns {
		if l != nil {
			l.Close()
		}
	}
}

// Size is the number of nodes.
func (p *Procs) Size() int { return len(p.ids) }

// AdminAddr is node i's admin address (with Options.Admin).
func (p *Procs) AdminAddr(i int) string { return p.adminAddrs[i] }

// ID is node i's id; ClientAddr its client address.
func (p *Procs) ID(i int) string         { return p.ids[i] }
func (p *Procs) ClientAddr(i int) string { return p.clientAddrs[i] }

// IDs returns every node's id.
func (p *Procs) IDs() []string { return append([]string(nil), p.ids...) }

// ClientAddrs returns every node's client address.
func (p *Procs) ClientAddrs() []string { return append([]string(nil), p.clientAddrs...) }

// DataDir is node i's data directory.
func (p *Procs) DataDir(i int) string { return filepath.Join(p.opts.Dir, p.ids[i]) }

// Sidecars is the number of sidecar processes.
func (p *Procs) Sidecars() int { return len(p.sidecars) }

// SidecarSocket is sidecar j's unix socket.
func (p *Procs) SidecarSocket(j int) string {
	dir := p.opts.SocketDir
	if dir == "" {
		dir = p.opts.Dir
	}
	return filepath.Join(dir, fmt.Sprintf("sidecar%d.sock", j+1))
}

// ErrRunning is returned when starting a process that is running.
var ErrRunning = errors.New("localproc: process is running")

func (p *Procs) start(pr *proc) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr.cmd != nil {
		return fmt.Errorf("%w: %s", ErrRunning, pr.name)
	}
	logf, err := os.OpenFile(pr.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(pr.bin, pr.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	closeListeners(pr.reserved)
	pr.reserved = nil
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exit := make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(exit)
	}()
	pr.cmd, pr.exit = cmd, exit
	return nil
}

// signal sends sig to pr and, for SIGKILL and SIGTERM, waits for it to
// exit. SIGSTOP and SIGCONT just pause and resume it.
func (p *Procs) signal(pr *proc, sig syscall.Signal) error {
	p.mu.Lock()
	cmd, exit := pr.cmd, pr.exit
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		pr.cmd = nil
	}
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return err
	}
	if sig == syscall.SIGTERM {
		// A paused process would never handle SIGTERM.
		_ = cmd.Process.Signal(syscall.SIGCONT) // fails only if it has exited; the signal below then fails too
	}
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		select {
		case <-exit:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exit
		}
	}
	return nil
}

// Start starts node i's process (again), appending to its log file.
func (p *Procs) Start(i int) error { return p.start(p.nodes[i]) }

// Args is node i's command line after the binary, as Start runs it.
func (p *Procs) Args(i int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.nodes[i].args...)
}

// SetArgs replaces node i's command line after the binary (Options.Command
// is not applied again) for its next Start; node i must be stopped. A test
// starts a node again with other flags: a wiped node on another log store,
// an upgraded node without a flag it was created with.
func (p *Procs) SetArgs(i int, args []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr := p.nodes[i]
	if pr.cmd != nil {
		return fmt.Errorf("%w: %s (stop it before changing its flags)", ErrRunning, pr.name)
	}
	pr.args = append([]string(nil), args...)
	return nil
}

// Signal sends sig to node i: SIGKILL and SIGTERM wait for it to exit (then
// Start runs it again from its data dir); SIGSTOP and SIGCONT pause and
// resume it.
func (p *Procs) Signal(i int, sig syscall.Signal) error { return p.signal(p.nodes[i], sig) }

// LogFile is the file node i's output is appended to.
func (p *Procs) LogFile(i int) string { return p.nodes[i].log }

// Pid is node i's process id, 0 while it is not running.
func (p *Procs) Pid(i int) int { return p.pid(p.nodes[i]) }

// SidecarPid is sidecar j's process id, 0 while it is not running.
func (p *Procs) SidecarPid(j int) int { return p.pid(p.sidecars[j]) }

func (p *Procs) pid(pr *proc) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := pr.cmd; c != nil && c.Process != nil {
		return c.Process.Pid
	}
	return 0
}

// Running reports whether node i's process is running (a paused one is).
func (p *Procs) Running(i int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nodes[i].cmd != nil
}

// Exited reports whether node i's process ended by itself (it was started
// and not killed through Signal, but is gone).
func (p *Procs) Exited(i int) bool {
	p.mu.Lock()
	pr := p.nodes[i]
	cmd, exit := pr.cmd, pr.exit
	p.mu.Unlock()
	if cmd == nil {
		return false
	}
	select {
	case <-exit:
		return true
	default:
		return false
	}
}

// logTail is the last n lines of the log file at path, indented.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "    (" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// PeerAddr is node i's peer address.
func (p *Procs) PeerAddr(i int) string { return p.peerAddrs[i] }

// ServerID reads node i's server id (NAME/INCARNATION) from its data dir,
// waiting up to timeout for a freshly started node to create it.
func (p *Procs) ServerID(i int, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(filepath.Join(p.DataDir(i), "identity"))
		if err == nil {
			return strings.TrimSpace(string(b)), nil
		}
		if time.Now().After(deadline) {
			return "", err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// AdminAddrs returns every node's admin address (Options.Admin).
func (p *Procs) AdminAddrs() []string { return append([]string(nil), p.adminAddrs...) }

// Admin returns a client of the nodes' admin ports (Options.Admin).
func (p *Procs) Admin() *client.AdminCluster {
	return &client.AdminCluster{Addrs: p.adminAddrs,
		Config: client.AdminConfig{Secret: p.adminSecret, ClusterID: p.ClusterID, TLS: p.ClientTLS}}
}

// Wipe removes node i's data directory; the node must be stopped. Started
// again at its old address it has a new incarnation (a new server id): it
// does not bootstrap, cannot vote under its old id, and stays a stranger
// until added as a learner (see cluster/bootstrap.go).
func (p *Procs) Wipe(i int) error {
	if p.Running(i) {
		return fmt.Errorf("%w: %s (stop it before wiping)", ErrRunning, p.ids[i])
	}
	return os.RemoveAll(p.DataDir(i))
}

// StartSidecar starts sidecar j's process (again).
func (p *Procs) StartSidecar(j int) error {
	os.Remove(p.SidecarSocket(j)) // a killed sidecar leaves its socket
	return p.start(p.sidecars[j])
}

// SignalSidecar sends sig to sidecar j, like Signal.
func (p *Procs) SignalSidecar(j int, sig syscall.Signal) error {
	return p.signal(p.sidecars[j], sig)
}

// Status asks node i for its status.
func (p *Procs) Status(ctx context.Context, i int) (wire.Msg, error) {
	conn, err := p.Dial(ctx, i)
	if err != nil {
		return wire.Msg{}, err
	}
	defer conn.Close()
	r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeStatus})
	return r, err
}

// Dial connects to node i's client port.
func (p *Procs) Dial(ctx context.Context, i int) (*client.Conn, error) {
	return client.Dial(ctx, p.clientAddrs[i], client.Config{Secret: p.ClientSecret, ClusterID: p.ClusterID, TLS: p.ClientTLS})
}

// Leader polls statuses until a running node reports itself the serving
// leader.
func (p *Procs) Leader(ctx context.Context) (int, error) {
	// last is what each node said last, for the error: a cluster that
	// never elects must say whether a node exited (and why, from its
	// log), refused the status, or knew no leader.
	last := make([]string, len(p.ids))
	for {
		for i := range p.ids {
			if !p.Running(i) {
				last[i] = "not running"
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := p.Status(sctx, i)
			cancel()
			if err == nil && st.Role == wire.RoleLeader && st.LeaderAddr != "" {
				return i, nil
			}
			if err != nil {
				last[i] = "status: " + err.Error()
			} else {
				last[i] = fmt.Sprintf("role %d, leader %q", st.Role, st.LeaderAddr)
			}
		}
		select {
		case <-ctx.Done():
			var b strings.Builder
			for i, id := range p.ids {
				state := "its log ends"
				if p.Exited(i) {
					state = "exited, its log ends"
				}
				fmt.Fprintf(&b, "\n  %s: %s; %s:\n%s", id, last[i], state, logTail(p.LogFile(i), 8))
			}
			return -1, fmt.Errorf("localproc: no leader: %w%s", ctx.Err(), b.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close kills every sidecar and node.
func (p *Procs) Close() {
	for j := range p.sidecars {
		_ = p.SignalSidecar(j, syscall.SIGKILL) // fails only for one that has exited
	}
	for i := range p.ids {
		_ = p.Signal(i, syscall.SIGKILL) // fails only for one that has exited
	}
	p.mu.Lock()
	for _, pr := range p.nodes {
		closeListeners(pr.reserved) // a node never started
		pr.reserved = nil
	}
	p.mu.Unlock()
}
