package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/tlsconf"
)

// runMembers is `ticketing members list|add-learner|promote|remove|replace`:
// membership changes through the nodes' admin ports (cluster/admin.go).
func runMembers(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usage := func() int {
		fmt.Fprintln(stderr, `usage: ticketing members COMMAND --admin ADDR,ADDR,... --admin-secret-file F [--tls-ca CA] [--cluster-id ID]

  list                           members, their role and lag behind the leader's commit index
  add-learner SERVERID PEERADDR  add a new server (NAME/INCARNATION, from its log) as a non-voter
  promote SERVERID               make a caught-up learner a voter
  remove SERVERID                take a server out (refused if fewer than 3 voters would stay or
                                 the rest could not form a majority; the leader hands over first)
  replace OLD NEW PEERADDR       all of it: add NEW as a learner, wait until it caught up, promote
                                 it, remove OLD`)
		return ExitUsage
	}
	if len(args) == 0 {
		return usage()
	}
	cmd := args[0]
	fs := flag.NewFlagSet("ticketing members "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		addrs, secretFile, clusterID string
		timeout                      time.Duration
		tf                           tlsFlags
	)
	fs.StringVar(&addrs, "admin", "", "the nodes' admin addresses, comma separated (the leader is found among them)")
	fs.StringVar(&secretFile, "admin-secret-file", "", "file holding the admin secret")
	fs.StringVar(&clusterID, "cluster-id", "", "the nodes' --cluster-id")
	fs.DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
	tf.register(fs, false)
	if err := fs.Parse(args[1:]); err != nil {
		return ExitUsage
	}
	want := map[string]int{"list": 0, "add-learner": 2, "promote": 1, "remove": 1, "replace": 3}
	n, ok := want[cmd]
	if !ok || fs.NArg() != n {
		return usage()
	}
	a := &cluster.AdminCluster{Addrs: splitList(addrs)}
	if len(a.Addrs) == 0 || secretFile == "" {
		fmt.Fprintln(stderr, "ticketing members: --admin and --admin-secret-file are required")
		return ExitUsage
	}
	var err error
	if a.Config.Secret, err = cluster.ReadSecretFile(secretFile); err != nil {
		fmt.Fprintln(stderr, "ticketing members:", err)
		return ExitUsage
	}
	a.Config.ClusterID = clusterID
	if err := tf.plaintextAllowed(a.Addrs...); err != nil {
		fmt.Fprintln(stderr, "ticketing members:", err)
		return ExitUsage
	}
	if tf.files.Enabled() {
		if a.Config.TLS, err = tlsconf.ClientConfig(tf.files); err != nil {
			fmt.Fprintln(stderr, "ticketing members:", err)
			return ExitUsage
		}
		a.Config.TLS.ServerName = tf.serverName
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	arg := fs.Args()
	switch cmd {
	case "list":
		var rep cluster.AdminReply
		if rep, err = a.Do(ctx, cluster.AdminRequest{Op: "members"}); err == nil {
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SERVER ID\tPEER ADDRESS\tROLE\tLAG")
			for _, m := range rep.Members {
				role := "learner"
				switch {
				case m.Leader:
					role = "leader"
				case m.Voter:
					role = "voter"
				}
				lag := fmt.Sprint(m.Lag)
				if m.Lag < 0 {
					lag = "no answer"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.ServerID, m.PeerAddr, role, lag)
			}
			tw.Flush()
			fmt.Fprintf(stdout, "commit index %d\n", rep.Commit)
		}
	case "add-learner":
		_, err = a.Do(ctx, cluster.AdminRequest{Op: "add-learner", ID: arg[0], Addr: arg[1]})
	case "promote":
		_, err = a.Do(ctx, cluster.AdminRequest{Op: "promote", ID: arg[0]})
	case "remove":
		_, err = a.Do(ctx, cluster.AdminRequest{Op: "remove", ID: arg[0]})
	case "replace":
		err = a.Replace(ctx, arg[0], arg[1], arg[2], func(s string) { fmt.Fprintln(stdout, s) })
	}
	if err != nil {
		fmt.Fprintln(stderr, "ticketing members "+cmd+":", strings.TrimSpace(err.Error()))
		return ExitError
	}
	if cmd != "list" && cmd != "replace" {
		fmt.Fprintln(stdout, "ok")
	}
	return ExitOK
}
