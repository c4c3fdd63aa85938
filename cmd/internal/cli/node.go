package cli

import (
	"context"
	"flag"
	"fmt"
	"io"

	"ticketing/cluster"
	"ticketing/cluster/tlsconf"
)

func runNode(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ticketing node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := cluster.DefaultConfig()
	var (
		cfg                     = d
		peers                   string
		secretFile, peerSecFile string
		nextSecret, nextPeerSec string
		tf                      tlsFlags
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
	fs.StringVar(&nextSecret, "next-secret-file", "", "rollover: a second client secret accepted as well")
	fs.StringVar(&nextPeerSec, "next-peer-secret-file", "", "rollover: a second peer secret accepted as well")
	tf.register(fs, true)
	fs.DurationVar(&cfg.HandshakeTimeout, "handshake-timeout", d.HandshakeTimeout, "time a new connection has to finish TLS and the handshake")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", d.IdleTimeout, "close a client connection that sent nothing for this long")
	fs.IntVar(&cfg.MaxKeys, "max-keys", d.MaxKeys, "max keys held at once")
	fs.IntVar(&cfg.MaxWaitersPerKey, "max-waiters-per-key", d.MaxWaitersPerKey, "max queued waiters on one key")
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
	for _, f := range []struct {
		path string
		dst  *[]byte
	}{{nextSecret, &cfg.NextClientSecret}, {nextPeerSec, &cfg.NextPeerSecret}} {
		if f.path == "" {
			continue
		}
		if *f.dst, err = cluster.ReadSecretFile(f.path); err != nil {
			fmt.Fprintln(stderr, "ticketing node:", err)
			return ExitUsage
		}
	}
	addrs := []string{cfg.ClientAddr, cfg.PeerAddr}
	for _, p := range cfg.Peers {
		addrs = append(addrs, p.Addr)
	}
	if err := tf.plaintextAllowed(addrs...); err != nil {
		fmt.Fprintln(stderr, "ticketing node: refusing to start:", err)
		return ExitUsage
	}
	if tf.files.Enabled() {
		if cfg.ClientTLS, err = tlsconf.ServerConfig(tf.files, tf.clientCerts); err == nil {
			cfg.PeerTLS, err = tlsconf.PeerConfig(tf.files)
		}
		if err != nil {
			fmt.Fprintln(stderr, "ticketing node:", err)
			return ExitUsage
		}
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
