package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/tlsconf"
)

// runCerts makes a private CA and the certificates a deployment needs:
//
//	ticketing certs ca     --dir DIR                      -> DIR/ca.crt, DIR/ca.key
//	ticketing certs node   --dir DIR --id n1 --host ...   -> DIR/n1.crt, DIR/n1.key
//	ticketing certs client --dir DIR --name web1          -> DIR/web1.crt, DIR/web1.key
func runCerts(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	top := newCmdFlags("ticketing certs", "ticketing certs ca|node|client --dir DIR [flags]",
		"  ca      a new CA (keep ca.key offline; give ca.crt to every node and sidecar)\n"+
			"  node    a node certificate: names the node id (peers check it) and every host clients dial\n"+
			"  client  a client certificate, for nodes run with --tls-client-certs\n\n"+
			"Run 'ticketing certs ca|node|client -h' for their flags.", stdout, stderr)
	if len(args) == 0 || (args[0] != "ca" && args[0] != "node" && args[0] != "client") {
		if code, ok := top.parse(args); !ok {
			return code // -h, or a flag before the kind
		}
		if len(args) == 0 {
			return top.bad("want the kind of certificate: ca, node or client")
		}
		return top.bad("unknown kind %q: want ca, node or client", args[0])
	}
	kind := args[0]
	fs := newCmdFlags("ticketing certs "+kind, "ticketing certs "+kind+" --dir DIR [flags]", map[string]string{
		"ca":     "Makes a new CA in DIR (ca.crt, ca.key; keep ca.key offline).",
		"node":   "Makes DIR/ID.crt and DIR/ID.key, signed by the CA in DIR, naming the node id and every host\nclients and peers dial.",
		"client": "Makes DIR/NAME.crt and DIR/NAME.key, signed by the CA in DIR, for nodes run with\n--tls-client-certs.",
	}[kind], stdout, stderr)
	var (
		dir, id, hosts, name string
		days                 int
	)
	fs.StringVar(&dir, "dir", "", "directory holding ca.crt/ca.key and receiving the new files (required)")
	switch kind {
	case "ca":
		fs.StringVar(&name, "name", "Ticketing CA", "the CA's common name")
		fs.IntVar(&days, "days", 3650, "validity in days")
	case "node":
		fs.StringVar(&id, "id", "", "the node id (its --id); the certificate's first DNS name (required)")
		fs.StringVar(&hosts, "host", "", "comma-separated DNS names and IP addresses clients and peers dial this node at")
		fs.IntVar(&days, "days", 398, "validity in days (renew before; nodes reload renewed files)")
	case "client":
		fs.StringVar(&name, "name", "", "the client's name, e.g. the event server's host (required)")
		fs.IntVar(&days, "days", 398, "validity in days")
	}
	if code, ok := fs.parse(args[1:]); !ok {
		return code
	}
	if fs.NArg() != 0 {
		return fs.bad("unexpected arguments %q", fs.Args())
	}
	if dir == "" {
		return fs.bad("--dir is required")
	}
	now := time.Now()
	validity := time.Duration(days) * 24 * time.Hour
	if days < 1 {
		return fs.bad("--days %d: want at least 1", days)
	}
	var (
		is   tlsconf.Issued
		base string
		err  error
	)
	switch kind {
	case "ca":
		base = "ca"
		is, err = tlsconf.NewCA(name, validity, now)
	default:
		ca, rerr := tlsconf.ReadIssued(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
		if rerr != nil {
			fmt.Fprintf(stderr, "ticketing certs: reading the CA in %s (make one with 'ticketing certs ca'): %v\n", dir, rerr)
			return ExitError
		}
		if kind == "node" {
			if verr := cluster.ValidateNodeID(id); verr != nil {
				return fs.bad("--id %q: %v", id, verr)
			}
			base = id
			is, err = tlsconf.Issue(ca, id, splitList(hosts), tlsconf.UsageNode, validity, now)
		} else {
			if name == "" || strings.ContainsAny(name, "/\\ ") {
				return fs.bad("--name %q: required, without spaces or slashes", name)
			}
			base = name
			is, err = tlsconf.Issue(ca, name, nil, tlsconf.UsageClient, validity, now)
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "ticketing certs:", err)
		return ExitError
	}
	certPath, keyPath, err := tlsconf.WriteFiles(dir, base, is)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing certs:", err)
		return ExitError
	}
	fmt.Fprintf(stdout, "wrote %s and %s (mode 600)\n", certPath, keyPath)
	return ExitOK
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
