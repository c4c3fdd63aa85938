package tlsconf

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Issued is a certificate and its private key, PEM encoded.
type Issued struct {
	CertPEM []byte
	KeyPEM  []byte
}

// Usage says what a leaf certificate may be used for.
type Usage int

const (
	// UsageNode: a cluster node, server and client of the peer port and
	// server of the client port (both extended key usages).
	UsageNode Usage = iota
	// UsageClient: a sidecar or tool presenting a client certificate.
	UsageClient
)

// NewCA creates a self-signed ECDSA P-256 CA valid for validity.
func NewCA(name string, validity time.Duration, now time.Time) (Issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Ticketing"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return Issued{}, err
	}
	return encode(der, key)
}

// Issue signs a leaf certificate with the CA. name is the common name and
// the first DNS name (for a node: its node id, which peers verify); hosts
// are further DNS names or IP addresses (what clients dial).
func Issue(ca Issued, name string, hosts []string, usage Usage, validity time.Duration, now time.Time) (Issued, error) {
	caCert, caKey, err := parse(ca)
	if err != nil {
		return Issued{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"Ticketing"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     []string{name},
	}
	switch usage {
	case UsageNode:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	case UsageClient:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" && h != name {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if caCert.NotAfter.Before(tmpl.NotAfter) {
		tmpl.NotAfter = caCert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return Issued{}, err
	}
	return encode(der, key)
}

// WriteFiles writes is to dir/base.crt (0644) and dir/base.key (0600),
// refusing to overwrite either.
func WriteFiles(dir, base string, is Issued) (certPath, keyPath string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	certPath, keyPath = filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	if err := writeNew(keyPath, is.KeyPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := writeNew(certPath, is.CertPEM, 0o644); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

// ReadIssued reads a certificate and key written by WriteFiles.
func ReadIssued(certPath, keyPath string) (Issued, error) {
	c, err := os.ReadFile(certPath)
	if err != nil {
		return Issued{}, err
	}
	k, err := os.ReadFile(keyPath)
	if err != nil {
		return Issued{}, err
	}
	is := Issued{CertPEM: c, KeyPEM: k}
	if _, _, err := parse(is); err != nil {
		return Issued{}, err
	}
	return is, nil
}

func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func encode(der []byte, key *ecdsa.PrivateKey) (Issued, error) {
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Issued{}, err
	}
	return Issued{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}),
	}, nil
}

func parse(is Issued) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, _ := pem.Decode(is.CertPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("%w: no PEM certificate", ErrConfig)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	kb, _ := pem.Decode(is.KeyPEM)
	if kb == nil {
		return nil, nil, fmt.Errorf("%w: no PEM key", ErrConfig)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("%w: the CA key is not ECDSA", ErrConfig)
	}
	return cert, key, nil
}

// DevSet writes a throwaway CA and one certificate per node id (valid for
// the ids, localhost and 127.0.0.1/::1) into dir, for ticketing dev and
// tests. It returns the file set of each node and the CA path.
func DevSet(dir string, ids []string, now time.Time) (caFile string, nodes map[string]Files, err error) {
	ca, err := NewCA("ticketing dev CA", 30*24*time.Hour, now)
	if err != nil {
		return "", nil, err
	}
	caFile, _, err = WriteFiles(dir, "ca", ca)
	if err != nil {
		return "", nil, err
	}
	nodes = map[string]Files{}
	for _, id := range ids {
		is, err := Issue(ca, id, []string{"localhost", "127.0.0.1", "::1"}, UsageNode, 30*24*time.Hour, now)
		if err != nil {
			return "", nil, err
		}
		c, k, err := WriteFiles(dir, id, is)
		if err != nil {
			return "", nil, err
		}
		nodes[id] = Files{CertFile: c, KeyFile: k, CAFile: caFile}
	}
	return caFile, nodes, nil
}
