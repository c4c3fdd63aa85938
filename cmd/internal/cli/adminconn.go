package cli

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"slices"
	"strings"

	"ticketing/cluster"
)

// The operator commands (status, inspect, members) remember their
// connection: the four flags that reach the admin ports can come from the
// environment, or be derived from a node's own configuration file
// (--config /etc/ticketing/node.conf), so that one export line (which
// `ticketing dev` prints) or the node's file serves every call.
// Precedence, highest first: the command line, the environment, the file.

// adminEnv maps each flag read from the environment to its variable. The
// names are envName's, so the node's own TICKETING_ADMIN_SECRET_FILE,
// TICKETING_TLS_CA and TICKETING_CLUSTER_ID mean the same here.
var adminEnv = []struct{ flag, env string }{
	{"admin", "TICKETING_ADMIN"},
	{"admin-secret-file", "TICKETING_ADMIN_SECRET_FILE"},
	{"tls-ca", "TICKETING_TLS_CA"},
	{"cluster-id", "TICKETING_CLUSTER_ID"},
}

// errNoAdminAddr: a node configuration file without admin-addr, given to
// an operator command's --config.
var errNoAdminAddr = errors.New("cli: the node's configuration has no admin-addr")

// resolve gives every connection flag not set on the command line its
// environment variable (when set and not empty), else the value derived
// from the --config file (when given).
func (af *adminFlags) resolve(fs *flag.FlagSet, lookupEnv func(string) (string, bool)) error {
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	var derived map[string]string
	if af.config != "" {
		var err error
		if derived, err = nodeAdminSettings(af.config); err != nil {
			return err
		}
	}
	for _, e := range adminEnv {
		if explicit[e.flag] {
			continue
		}
		if v, ok := lookupEnv(e.env); ok && v != "" {
			if err := fs.Set(e.flag, v); err != nil {
				return fmt.Errorf("$%s: invalid value %q: %v", e.env, v, err)
			}
			continue
		}
		if v := derived[e.flag]; v != "" {
			if err := fs.Set(e.flag, v); err != nil {
				return fmt.Errorf("%s: invalid value %q for %s: %v", af.config, v, e.flag, err)
			}
		}
	}
	// A node allowed plaintext beyond loopback: so is its operator.
	if !explicit["insecure-plaintext"] && derived["insecure-plaintext"] == "true" {
		af.tf.insecure = true
	}
	return nil
}

// nodeAdminSettings reads a node's configuration file (the format of
// `ticketing node --config`; every setting of the node is accepted, only
// these are used) and derives the operator flags from it:
//
//   - admin: this node's admin-addr first, then the other initial voters
//     of peers at their peer host with the same admin port (the leader is
//     found among them; an address where no admin port answers is
//     skipped). An admin-addr on a wildcard host (":7600", "0.0.0.0:7600")
//     is dialled at this node's own host in peers (its certificate names
//     it), else at loopback.
//   - admin-secret-file, tls-ca, cluster-id: the node's own.
//   - insecure-plaintext: the node's own.
//
// Relative file names are taken as written, from the current directory.
func nodeAdminSettings(path string) (map[string]string, error) {
	settings, err := readSettings(path, func(name string) error {
		if cmdlineOnly[name] {
			return fmt.Errorf("%s can only be given on the command line", name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	get := func(name string) string { return settings[name].value }
	adminAddr := get("admin-addr")
	if adminAddr == "" {
		return nil, fmt.Errorf("%w: %s sets no admin-addr (the node has no admin port); give --admin or $TICKETING_ADMIN",
			errNoAdminAddr, path)
	}
	host, port, err := net.SplitHostPort(adminAddr)
	if err != nil {
		return nil, fmt.Errorf("%s:%d: admin-addr %q: %v", path, settings["admin-addr"].line, adminAddr, err)
	}
	var peers []cluster.Peer
	if p := get("peers"); p != "" {
		if peers, err = cluster.ParsePeers(p); err != nil {
			return nil, fmt.Errorf("%s:%d: peers: %v", path, settings["peers"].line, err)
		}
	}
	id := get("id")
	if wildcard(host) {
		host = "127.0.0.1"
		for _, p := range peers {
			if ph, _, err := net.SplitHostPort(p.Addr); err == nil && p.ID == id && !wildcard(ph) {
				host = ph
			}
		}
	}
	addrs := []string{net.JoinHostPort(host, port)}
	for _, p := range peers {
		ph, _, err := net.SplitHostPort(p.Addr)
		if err != nil || p.ID == id || wildcard(ph) {
			continue
		}
		if a := net.JoinHostPort(ph, port); !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return map[string]string{
		"admin":              strings.Join(addrs, ","),
		"admin-secret-file":  get("admin-secret-file"),
		"tls-ca":             get("tls-ca"),
		"cluster-id":         get("cluster-id"),
		"insecure-plaintext": get("insecure-plaintext"),
	}, nil
}

// wildcard reports whether host listens on every interface.
func wildcard(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// adminExportLine is the shell line that points the operator commands at
// a cluster through their environment.
func adminExportLine(addrs []string, secretFile, caFile, clusterID string) string {
	parts := []string{"TICKETING_ADMIN=" + shellQuote(strings.Join(addrs, ",")),
		"TICKETING_ADMIN_SECRET_FILE=" + shellQuote(secretFile)}
	if caFile != "" {
		parts = append(parts, "TICKETING_TLS_CA="+shellQuote(caFile))
	}
	parts = append(parts, "TICKETING_CLUSTER_ID="+shellQuote(clusterID))
	return "export " + strings.Join(parts, " ")
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	safe := s != ""
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-,:=+@%", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
