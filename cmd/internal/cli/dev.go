package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	ticketing "ticketing/clients/go"
	"time"

	"ticketing/cluster/local"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newCmdFlags("ticketing dev", "ticketing dev [--dir DIR] [--socket PATH] [--base-port N] [--nodes 3|5] [--plaintext]",
		"Runs a real cluster of 3 (or 5) nodes on loopback in this process, with a sidecar\n"+
			"serving the unix socket, prints their addresses, the client secret file, the CA\n"+
			"and a ready line, and runs until Ctrl-C (SIGINT) or SIGTERM.", stdout, stderr)
	var (
		dir      string
		socket   string
		basePort int
		nodes    int
		plain    bool
		logs     logFlags
	)
	fs.StringVar(&dir, "dir", "", "directory for the nodes' data and secrets (default: a new temporary directory, removed on exit)")
	fs.StringVar(&socket, "socket", "./ticketing.sock", "unix socket of the sidecar that dev runs in process, connected to its nodes")
	fs.IntVar(&basePort, "base-port", 7400, "node i listens for clients on 127.0.0.1:BASE+i and for peers on BASE+100+i; 0 picks free ports (fresh --dir only)")
	fs.IntVar(&nodes, "nodes", 3, "number of nodes: 3 or 5")
	fs.BoolVar(&plain, "plaintext", false, "run the ports without TLS (default: TLS with a throwaway CA in DIR/tls)")
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
	if basePort < 0 || basePort > 65535-200 {
		return fs.bad("--base-port %d: want 0 (free ports) or 1..65335", basePort)
	}
	log, _ := logs.logger(stderr)
	var err error
	temp := dir == ""
	if temp {
		if dir, err = os.MkdirTemp("", "ticketing-dev-"); err != nil {
			fmt.Fprintln(stderr, "ticketing dev:", err)
			return ExitError
		}
		defer os.RemoveAll(dir)
	}
	start := time.Now()
	c, err := local.Start(local.Options{Dir: dir, Nodes: nodes, BasePort: basePort, Logger: log, TLS: !plain})
	if err != nil {
		fmt.Fprintln(stderr, "ticketing dev:", err)
		if basePort != 0 {
			fmt.Fprintln(stderr, "ticketing dev: (another dev cluster running? try --base-port with other ports)")
		}
		return ExitError
	}
	defer c.Close()
	fmt.Fprintf(stdout, "ticketing dev: %d-node cluster %q in %s\n", c.Size(), c.ClusterID, dir)
	for i := 0; i < c.Size(); i++ {
		fmt.Fprintf(stdout, "  node %s  client %s\n", c.ID(i), c.ClientAddr(i))
	}
	fmt.Fprintf(stdout, "  client secret file: %s\n", c.SecretFile)
	if c.CAFile != "" {
		fmt.Fprintf(stdout, "  tls ca file: %s\n", c.CAFile)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	li, err := c.Leader(wctx)
	cancel()
	if err != nil {
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
		fmt.Fprintln(stderr, "ticketing dev: sidecar:", err)
		return ExitError
	}
	defer stopSidecar(b, srv, log)
	fmt.Fprintf(stdout, "  sidecar socket: %s\n", shown)
	wctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	err = ticketing.WaitReady(wctx, ucfg.Path)
	cancel()
	if err != nil {
		fmt.Fprintln(stderr, "ticketing dev:", err)
		return ExitError
	}
	fmt.Fprintf(stdout, "ticketing dev: ready in %v: leader %s at %s (Ctrl-C stops)\n",
		time.Since(start).Round(time.Millisecond), c.ID(li), c.ClientAddr(li))
	<-ctx.Done()
	fmt.Fprintln(stdout, "ticketing dev: stopping")
	return ExitOK
}
