package cli

import (
	"context"
	"flag"
	"fmt"
	"io"

	"ticketing/cluster"
)

func runNode(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ticketing node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := cluster.DefaultConfig()
	var (
		cfg                     = d
		peers                   string
		secretFile, peerSecFile string
		logs                    logFlags
	)
	fs.StringVar(&cfg.NodeID, "id", "", "this node's id (1-64 of A-Z a-z 0-9 . _ -)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for the Raft log, stable store and snapshots")
	fs.StringVar(&cfg.ClientAddr, "client-addr", "", "HOST:PORT to serve clients on")
	fs.StringVar(&cfg.AdvertiseClientAddr, "advertise-client-addr", "", "client address handed to clients in M replies (default: --client-addr)")
	fs.StringVar(&cfg.PeerAddr, "peer-addr", "", "HOST:PORT to serve Raft peers on (must match this node's entry in --peers)")
	fs.StringVar(&peers, "peers", "", "initial voters, this node included: ID=HOST:PORT,ID=HOST:PORT,ID=HOST:PORT (3 or 5)")
	fs.StringVar(&cfg.ClusterID, "cluster-id", "", "cluster id that clients and peers must present")
	fs.StringVar(&secretFile, "secret-file", "", "file holding the client secret")
	fs.StringVar(&peerSecFile, "peer-secret-file", "", "file holding the peer secret")
	fs.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", d.HeartbeatTimeout, "Raft heartbeat timeout (failover detection)")
	fs.DurationVar(&cfg.ElectionTimeout, "election-timeout", d.ElectionTimeout, "Raft election timeout")
	fs.DurationVar(&cfg.LeaderLeaseTimeout, "leader-lease-timeout", d.LeaderLeaseTimeout, "how long a leader leads without a majority before it steps down")
	fs.IntVar(&cfg.MaxInFlightPerConn, "max-inflight", d.MaxInFlightPerConn, "max requests in flight per client connection")
	fs.IntVar(&cfg.MaxClientConns, "max-conns", d.MaxClientConns, "max client connections")
	fs.StringVar(&cfg.FaultFile, "fault-file", "", "TESTS ONLY: obey fault injections (cut/frozen peer links, clock offset) from this JSON file; off by default")
	logs.register(fs, "info")
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "ticketing node: unexpected arguments %q\n", fs.Args())
		return ExitUsage
	}
	log, err := logs.logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing node:", err)
		return ExitUsage
	}
	cfg.Logger = log
	if cfg.Peers, err = cluster.ParsePeers(peers); err != nil {
		fmt.Fprintln(stderr, "ticketing node: --peers:", err)
		return ExitUsage
	}
	if secretFile == "" || peerSecFile == "" {
		fmt.Fprintln(stderr, "ticketing node: --secret-file and --peer-secret-file are required")
		return ExitUsage
	}
	if cfg.ClientSecret, err = cluster.ReadSecretFile(secretFile); err != nil {
		fmt.Fprintln(stderr, "ticketing node:", err)
		return ExitUsage
	}
	if cfg.PeerSecret, err = cluster.ReadSecretFile(peerSecFile); err != nil {
		fmt.Fprintln(stderr, "ticketing node:", err)
		return ExitUsage
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "ticketing node: refusing to start:", err)
		return ExitUsage
	}
	n, err := cluster.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing node:", err)
		return ExitError
	}
	<-ctx.Done()
	log.Info("shutting down")
	if err := n.Close(); err != nil {
		log.Warn("shutdown", "err", err)
	}
	return ExitOK
}
