package local

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/wire"
)

// ProcOptions configures StartProcs.
type ProcOptions struct {
	// Binary is the ticketing executable to run as `Binary node ...`.
	Binary string
	// Dir holds one data dir and one log file per node, and the secrets.
	Dir string
	// Nodes is 3 (zero) or 5.
	Nodes int
	// ExtraArgs are appended to every node's command line.
	ExtraArgs []string
}

// Procs is a cluster of `ticketing node` processes on loopback.
type Procs struct {
	opts         ProcOptions
	ClientSecret []byte
	ClusterID    string
	ids          []string
	clientAddrs  []string
	args         [][]string

	mu    sync.Mutex
	cmds  []*exec.Cmd
	exits []chan struct{}
}

// StartProcs starts every node process.
func StartProcs(opts ProcOptions) (*Procs, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	secretFile := filepath.Join(opts.Dir, "client.secret")
	peerSecretFile := filepath.Join(opts.Dir, "peer.secret")
	secret, err := ensureSecret(secretFile)
	if err != nil {
		return nil, err
	}
	if _, err := ensureSecret(peerSecretFile); err != nil {
		return nil, err
	}
	ports, err := freePorts(2 * opts.Nodes)
	if err != nil {
		return nil, err
	}
	p := &Procs{opts: opts, ClientSecret: secret, ClusterID: "bench"}
	var peers []string
	for i := 0; i < opts.Nodes; i++ {
		id := fmt.Sprintf("n%d", i+1)
		p.ids = append(p.ids, id)
		p.clientAddrs = append(p.clientAddrs, fmt.Sprintf("127.0.0.1:%d", ports[2*i]))
		peers = append(peers, fmt.Sprintf("%s=127.0.0.1:%d", id, ports[2*i+1]))
	}
	for i := 0; i < opts.Nodes; i++ {
		args := []string{"node",
			"--id", p.ids[i],
			"--data-dir", filepath.Join(opts.Dir, p.ids[i]),
			"--client-addr", p.clientAddrs[i],
			"--peer-addr", fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]),
			"--peers", strings.Join(peers, ","),
			"--cluster-id", p.ClusterID,
			"--secret-file", secretFile,
			"--peer-secret-file", peerSecretFile,
		}
		p.args = append(p.args, append(args, opts.ExtraArgs...))
	}
	p.cmds = make([]*exec.Cmd, opts.Nodes)
	p.exits = make([]chan struct{}, opts.Nodes)
	for i := range p.ids {
		if err := p.Start(i); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	var out []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// Size is the number of nodes.
func (p *Procs) Size() int { return len(p.ids) }

// ID is node i's id; ClientAddr its client address.
func (p *Procs) ID(i int) string         { return p.ids[i] }
func (p *Procs) ClientAddr(i int) string { return p.clientAddrs[i] }

// ClientAddrs returns every node's client address.
func (p *Procs) ClientAddrs() []string { return append([]string(nil), p.clientAddrs...) }

// Start starts node i's process (again), appending to its log file.
func (p *Procs) Start(i int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmds[i] != nil {
		return fmt.Errorf("local: node %s is running", p.ids[i])
	}
	logf, err := os.OpenFile(filepath.Join(p.opts.Dir, p.ids[i]+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.opts.Binary, p.args[i]...)
	cmd.Stdout, cmd.Stderr = logf, logf
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
	p.cmds[i], p.exits[i] = cmd, exit
	return nil
}

// Signal sends sig to node i and, for SIGKILL and SIGTERM, waits for it to
// exit.
func (p *Procs) Signal(i int, sig syscall.Signal) error {
	p.mu.Lock()
	cmd, exit := p.cmds[i], p.exits[i]
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		p.cmds[i] = nil
	}
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return err
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

// Running reports whether node i's process is running.
func (p *Procs) Running(i int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmds[i] != nil
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
	return client.Dial(ctx, p.clientAddrs[i], client.Config{Secret: p.ClientSecret, ClusterID: p.ClusterID})
}

// Leader polls statuses until a running node reports itself the serving
// leader.
func (p *Procs) Leader(ctx context.Context) (int, error) {
	for {
		for i := range p.ids {
			if !p.Running(i) {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := p.Status(sctx, i)
			cancel()
			if err == nil && st.Role == wire.RoleLeader && st.LeaderAddr != "" {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("local: no leader: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close kills every node.
func (p *Procs) Close() {
	for i := range p.ids {
		p.Signal(i, syscall.SIGKILL)
	}
}
