package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/localproc"
	"ticketing/cluster/wire"
)

// realCluster is 3 `ticketing node` processes and one `ticketing sidecar`
// process (cluster/localproc). Real processes, not `ticketing dev`, whose
// nodes share one process: the leader must be SIGKILLed alone, mid-sale.
type realCluster struct {
	p      *localproc.Procs
	socket string
}

// startCluster builds the binary if bin is "" (go build, the working
// directory inside the module), starts the nodes and the sidecar in dir,
// and waits for a leader and the sidecar's socket.
func startCluster(ctx context.Context, bin, dir string, logf func(string, ...any)) (*realCluster, error) {
	if bin == "" {
		bin = filepath.Join(dir, "ticketing")
		logf("building ticketing (set TICKETING_BIN or --ticketing-bin to skip)")
		b := exec.CommandContext(ctx, "go", "build", "-o", bin, "ticketing/cmd/ticketing")
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			return nil, fmt.Errorf("go build ticketing/cmd/ticketing: %w", err)
		}
	}
	quiet := []string{"--log-level", "warn"}
	p, err := localproc.Start(localproc.Options{Binary: bin, Dir: filepath.Join(dir, "cluster"), ClusterID: "waitingroom",
		Sidecars: 1, ExtraArgs: quiet, SidecarArgs: quiet})
	if err != nil {
		return nil, err
	}
	c := &realCluster{p: p, socket: p.SidecarSocket(0)}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	li, err := p.Leader(wctx)
	if err != nil {
		p.Close()
		return nil, err
	}
	// The sidecar came up with the nodes, and may have shaken hands with
	// them before the leader applied the cluster's fencing domain: it then
	// keeps saying domain=- on those connections. Started again once the
	// leader knows the domain, it learns it at its handshake.
	for {
		conn, err := p.Dial(wctx, li)
		if err == nil {
			d := conn.Peer().Domain
			conn.Close()
			if d != "" {
				break
			}
		}
		if wctx.Err() != nil {
			p.Close()
			return nil, fmt.Errorf("the leader names no fencing domain: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := p.SignalSidecar(0, syscall.SIGTERM); err != nil {
		p.Close()
		return nil, err
	}
	if err := p.StartSidecar(0); err != nil {
		p.Close()
		return nil, err
	}
	if err := ticketing.WaitReady(wctx, c.socket); err != nil {
		p.Close()
		return nil, fmt.Errorf("sidecar: %w", err)
	}
	logf("3 node processes and a sidecar are up; sidecar socket %s", c.socket)
	return c, nil
}

// leader is the index and id of the node serving as leader now.
func (c *realCluster) leader(ctx context.Context) (int, string, error) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	i, err := c.p.Leader(lctx)
	if err != nil {
		return -1, "", err
	}
	id := c.p.ID(i)
	if st, err := c.p.Status(lctx, i); err == nil && st.Role == wire.RoleLeader {
		id = st.NodeID
	}
	return i, id, nil
}

// kill SIGKILLs node i (waits for it to exit).
func (c *realCluster) kill(i int) error { return c.p.Signal(i, syscall.SIGKILL) }

// restart starts node i again from its data dir.
func (c *realCluster) restart(i int) error { return c.p.Start(i) }

func (c *realCluster) close() { c.p.Close() }
