package tlsconf

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestKeyFileModeRefused(t *testing.T) {
	dir := t.TempDir()
	_, files, err := DevSet(dir, []string{"n1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f := files["n1"]
	if _, err := ServerConfig(f, false); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f.KeyFile, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := ServerConfig(f, false); !errors.Is(err, ErrConfig) {
		t.Fatalf("group-readable key accepted: %v", err)
	}
}

func TestCAFileRequired(t *testing.T) {
	if _, err := ClientConfig(Files{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("client without CA: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(bad, []byte("not pem"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ClientConfig(Files{CAFile: bad}); !errors.Is(err, ErrConfig) {
		t.Fatalf("CA without certificates: %v", err)
	}
}

// handshake runs a TLS 1.3 handshake between a server and a client config
// over a real loopback connection and returns both sides' errors.
func handshake(t *testing.T, srv, cli *tls.Config) (binds [2][]byte, serr, cerr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			serr = err
			return
		}
		defer c.Close()
		tc := tls.Server(c, srv)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if serr = tc.Handshake(); serr == nil {
			binds[0], serr = Binding(tc)
			_, _ = tc.Read(make([]byte, 1)) // until the client closes
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, cli)
	if cerr = tc.Handshake(); cerr == nil {
		binds[1], cerr = Binding(tc)
	}
	c.Close()
	<-done
	return binds, serr, cerr
}

func TestPeerCertificatesNameTheNode(t *testing.T) {
	_, files, err := DevSet(t.TempDir(), []string{"n1", "n2"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	p1, _ := PeerConfig(files["n1"])
	p2, _ := PeerConfig(files["n2"])
	dial := p2.Clone()
	dial.ServerName = "n1"
	binds, serr, cerr := handshake(t, p1, dial)
	if serr != nil || cerr != nil {
		t.Fatalf("mutual TLS n2 -> n1: server %v, client %v", serr, cerr)
	}
	if len(binds[0]) != 32 || string(binds[0]) != string(binds[1]) {
		t.Fatalf("exporter values differ or are short: %x %x", binds[0], binds[1])
	}
	// Dialling n1's port expecting n2: n1's certificate does not name n2.
	dial.ServerName = "n2"
	if _, _, cerr := handshake(t, p1, dial); cerr == nil {
		t.Fatal("a certificate for n1 was accepted as n2")
	}
	// A peer dialler without a certificate is refused.
	noCert, _ := ClientConfig(Files{CAFile: files["n1"].CAFile})
	noCert.ServerName = "n1"
	if _, serr, _ := handshake(t, p1, noCert); serr == nil {
		t.Fatal("the peer port accepted a dialler without a certificate")
	}
	// A certificate from another CA is refused.
	_, other, _ := DevSet(t.TempDir(), []string{"n2"}, time.Now())
	stranger, _ := PeerConfig(other["n2"])
	stranger = stranger.Clone()
	stranger.ServerName = "n1"
	if _, serr, cerr := handshake(t, p1, stranger); serr == nil && cerr == nil {
		t.Fatal("a certificate from another CA was accepted")
	}
}

func TestCertificateReload(t *testing.T) {
	dir := t.TempDir()
	_, files, err := DevSet(dir, []string{"n1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f := files["n1"]
	kp, err := newKeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := kp.get()
	// Renew: a new certificate and key from the same CA in place.
	ca, err := ReadIssued(f.CAFile, filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	is, err := Issue(ca, "n1", nil, UsageNode, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.CertFile, is.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.KeyFile, is.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(f.CertFile, later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(f.KeyFile, later, later); err != nil {
		t.Fatal(err)
	}
	kp.checked = time.Time{} // as if reloadCheck had passed
	second, _ := kp.get()
	if string(first.Certificate[0]) == string(second.Certificate[0]) {
		t.Fatal("renewed certificate not picked up")
	}
	// A broken renewal keeps the working pair.
	if err := os.WriteFile(f.CertFile, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	evenLater := later.Add(time.Minute)
	if err := os.Chtimes(f.CertFile, evenLater, evenLater); err != nil {
		t.Fatal(err)
	}
	kp.checked = time.Time{}
	third, _ := kp.get()
	if third != second {
		t.Fatal("a broken certificate file replaced the working pair")
	}
}
