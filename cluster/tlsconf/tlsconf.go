// Package tlsconf builds the TLS configurations of a node's client and peer
// ports and of the clients that dial them, derives the channel binding that
// the authentication handshake signs (cluster/wire/PROTOCOL.md, "TLS"), and
// issues the certificates of a small private CA (ticketing certs, ticketing
// dev). Every configuration is TLS 1.3 only.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"ticketing/cluster/wire"
)

// ErrConfig wraps every error building a configuration (unreadable or
// invalid files, a CA file without certificates, a missing key).
var ErrConfig = errors.New("tlsconf: bad TLS configuration")

// Files names the PEM files of one side.
type Files struct {
	// CertFile is this side's certificate chain (leaf first). Required on a
	// server; on a client only when the server demands client certificates.
	CertFile string
	// KeyFile is the private key of CertFile's leaf. Must not be readable
	// by group or others (the same rule as secret files).
	KeyFile string
	// CAFile is the bundle of CA certificates that verify the other side.
	// Required: Ticketing never falls back to the system roots, because its
	// certificates come from the deployment's own CA.
	CAFile string
}

// Enabled reports whether any file is named.
func (f Files) Enabled() bool { return f.CertFile != "" || f.KeyFile != "" || f.CAFile != "" }

// ServerConfig is the configuration of a listening port. When
// requireClientCert is set (always on the peer port), the other side must
// present a certificate that CAFile verifies.
func ServerConfig(f Files, requireClientCert bool) (*tls.Config, error) {
	if f.CertFile == "" || f.KeyFile == "" || f.CAFile == "" {
		return nil, fmt.Errorf("%w: a TLS port needs a certificate, its key and a CA file", ErrConfig)
	}
	kp, err := newKeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, err
	}
	pool, err := LoadCA(f.CAFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.get() },
		ClientCAs:      pool,
		ClientAuth:     tls.NoClientCert,
	}
	if requireClientCert {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientConfig is the configuration of a dialler. The server's certificate
// must be signed by CAFile and name the host it was dialled at (or the
// ServerName set on a clone, as peers do with the node id). A certificate
// and key are sent when the server asks for one.
func ClientConfig(f Files) (*tls.Config, error) {
	if f.CAFile == "" {
		return nil, fmt.Errorf("%w: a TLS client needs a CA file to verify the cluster", ErrConfig)
	}
	pool, err := LoadCA(f.CAFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool}
	if f.CertFile != "" || f.KeyFile != "" {
		if f.CertFile == "" || f.KeyFile == "" {
			return nil, fmt.Errorf("%w: a client certificate needs both --tls-cert and --tls-key", ErrConfig)
		}
		kp, err := newKeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kp.get() }
	}
	return cfg, nil
}

// PeerConfig is the configuration of the peer port, used in both
// directions: as a server it demands a client certificate, and as a client
// it presents its own. Peers verify each other against the node id (a DNS
// name in the certificate), not the address.
func PeerConfig(f Files) (*tls.Config, error) {
	cfg, err := ServerConfig(f, true)
	if err != nil {
		return nil, err
	}
	cfg.RootCAs = cfg.ClientCAs
	get := cfg.GetCertificate
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return get(nil) }
	return cfg, nil
}

// LoadCA reads a PEM bundle of CA certificates.
func LoadCA(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: CA file: %w", ErrConfig, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%w: CA file %s holds no PEM certificate", ErrConfig, path)
	}
	return pool, nil
}

// Binding returns the channel binding of c: the TLS exporter value
// (wire.ExporterLabel, 32 bytes) when c is a *tls.Conn whose handshake is
// done, nil for a plain connection.
func Binding(c net.Conn) ([]byte, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil
	}
	cs := tc.ConnectionState()
	b, err := cs.ExportKeyingMaterial(wire.ExporterLabel, nil, wire.ChannelBindingLen)
	if err != nil {
		return nil, fmt.Errorf("tlsconf: channel binding: %w", err)
	}
	return b, nil
}

// PeerNames returns the DNS names of the verified certificate the other
// side of c presented (nil for a plain connection or none presented).
func PeerNames(c net.Conn) []string {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil
	}
	cs := tc.ConnectionState()
	if len(cs.PeerCertificates) == 0 {
		return nil
	}
	return cs.PeerCertificates[0].DNSNames
}

// keyPair reloads a certificate and key when either file changes, so
// certificates can be renewed without a restart. Files are checked at most
// once per reloadCheck; a failed reload keeps the old pair and is retried.
type keyPair struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	modCert time.Time
	modKey  time.Time
	checked time.Time
}

const reloadCheck = 10 * time.Second

func newKeyPair(certFile, keyFile string) (*keyPair, error) {
	kp := &keyPair{certFile: certFile, keyFile: keyFile}
	if err := kp.load(); err != nil {
		return nil, err
	}
	return kp, nil
}

func (kp *keyPair) load() error {
	if err := checkKeyFileMode(kp.keyFile); err != nil {
		return err
	}
	ci, err := os.Stat(kp.certFile)
	if err != nil {
		return fmt.Errorf("%w: certificate: %w", ErrConfig, err)
	}
	ki, err := os.Stat(kp.keyFile)
	if err != nil {
		return fmt.Errorf("%w: key: %w", ErrConfig, err)
	}
	cert, err := tls.LoadX509KeyPair(kp.certFile, kp.keyFile)
	if err != nil {
		return fmt.Errorf("%w: %s / %s: %w", ErrConfig, kp.certFile, kp.keyFile, err)
	}
	kp.cert, kp.modCert, kp.modKey, kp.checked = &cert, ci.ModTime(), ki.ModTime(), time.Now()
	return nil
}

func (kp *keyPair) get() (*tls.Certificate, error) {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if time.Since(kp.checked) < reloadCheck {
		return kp.cert, nil
	}
	kp.checked = time.Now()
	ci, err1 := os.Stat(kp.certFile)
	ki, err2 := os.Stat(kp.keyFile)
	if err1 == nil && err2 == nil && (!ci.ModTime().Equal(kp.modCert) || !ki.ModTime().Equal(kp.modKey)) {
		old := kp.cert
		if err := kp.load(); err != nil {
			kp.cert = old // keep serving with the pair that worked
		}
	}
	return kp.cert, nil
}

// checkKeyFileMode refuses a private key that group or others can read.
func checkKeyFileMode(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: key: %w", ErrConfig, err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%w: key file %s has mode %04o; it must not be accessible to group or others (chmod 600)", ErrConfig, path, fi.Mode().Perm())
	}
	return nil
}
