package cli

import (
	"flag"
	"fmt"
	"net"
	"strings"

	"ticketing/cluster/tlsconf"
)

// tlsFlags are the TLS and plaintext flags of node and sidecar.
type tlsFlags struct {
	files       tlsconf.Files
	clientCerts bool   // node: require client certificates on the client port
	serverName  string // sidecar: name to verify instead of the dialled host
	insecure    bool   // allow plaintext beyond loopback
}

func (t *tlsFlags) register(fs *flag.FlagSet, node bool) {
	if node {
		fs.StringVar(&t.files.CertFile, "tls-cert", "", "this node's certificate (PEM; must name the node id, and the hosts clients dial)")
		fs.StringVar(&t.files.KeyFile, "tls-key", "", "its private key (PEM, mode 600)")
		fs.StringVar(&t.files.CAFile, "tls-ca", "", "CA bundle that verifies peers (and client certificates with --tls-client-certs)")
		fs.BoolVar(&t.clientCerts, "tls-client-certs", false, "require client certificates signed by --tls-ca on the client port")
	} else {
		fs.StringVar(&t.files.CAFile, "tls-ca", "", "CA bundle that verifies the nodes' certificates (turns TLS on)")
		fs.StringVar(&t.files.CertFile, "tls-cert", "", "client certificate, for nodes started with --tls-client-certs")
		fs.StringVar(&t.files.KeyFile, "tls-key", "", "its private key (PEM, mode 600)")
		fs.StringVar(&t.serverName, "tls-server-name", "", "name the nodes' certificates must carry (default: the host of each address)")
	}
	fs.BoolVar(&t.insecure, "insecure-plaintext", false, "allow plaintext TCP on addresses other than loopback (trusted networks only)")
}

// plaintextAllowed checks the plaintext rule: without TLS, every address
// must be loopback unless --insecure-plaintext says otherwise.
func (t *tlsFlags) plaintextAllowed(addrs ...string) error {
	if t.files.Enabled() || t.insecure {
		return nil
	}
	for _, a := range addrs {
		if !isLoopback(a) {
			return fmt.Errorf("no TLS configured and %q is not a loopback address: give --tls-ca (and on nodes "+
				"--tls-cert, --tls-key), or --insecure-plaintext to accept plaintext TCP on a trusted network", a)
		}
	}
	return nil
}

func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
