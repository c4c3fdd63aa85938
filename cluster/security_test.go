package cluster_test

import (
	"context"
	"crypto/tls"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/tlsconf"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

func dialWith(t *testing.T, addr string, cfg client.Config) (*client.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, addr, cfg)
	if err == nil {
		t.Cleanup(func() { conn.Close() })
	}
	return conn, err
}

// With client certificates required, a client needs both a certificate
// from the cluster's CA and the client secret.
func TestClientCertificatesRequired(t *testing.T) {
	c := startClusterOpts(t, local.Options{TLS: true, Tune: func(cfg *cluster.Config) {
		cfg.ClientTLS.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.AuthFailureDelay = time.Millisecond
	}})
	li := c.leader()
	base := client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS}
	if _, err := dialWith(t, c.ClientAddr(li), base); err == nil {
		t.Fatal("a client without a certificate got in")
	}
	tlsDir := filepath.Join(c.Dir, "tls")
	ca, err := tlsconf.ReadIssued(filepath.Join(tlsDir, "ca.crt"), filepath.Join(tlsDir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	is, err := tlsconf.Issue(ca, "web1", nil, tlsconf.UsageClient, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := tlsconf.WriteFiles(t.TempDir(), "web1", is)
	if err != nil {
		t.Fatal(err)
	}
	withCert, err := tlsconf.ClientConfig(tlsconf.Files{CertFile: certFile, KeyFile: keyFile, CAFile: c.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	good := base
	good.TLS = withCert
	conn, err := dialWith(t, c.ClientAddr(li), good)
	if err != nil {
		t.Fatalf("client with a certificate: %v", err)
	}
	mustGrant(t, do(t, conn, acquireMsg("k", "o", 5, 0)))
	// The certificate alone is not enough.
	wrongSecret := good
	wrongSecret.Secret = []byte("not-the-client-secret-0123")
	if _, err := dialWith(t, c.ClientAddr(li), wrongSecret); !errors.Is(err, wire.ErrAuthFailed) {
		t.Fatalf("certificate with a wrong secret: %v, want auth_failed", err)
	}
}

// During a secret rollover a node accepts clients holding either secret,
// and peers holding either peer secret keep the cluster running.
func TestSecretRolloverOnNodes(t *testing.T) {
	next := []byte("the-next-client-secret-0123456789")
	nextPeer := []byte("the-next-peer-secret-0123456789")
	c := startClusterOpts(t, local.Options{TLS: true, Tune: func(cfg *cluster.Config) {
		cfg.NextClientSecret = next
		// Peers: every node accepts both; n1 already dials with the new
		// one (its current secret), the others with the old one.
		if cfg.NodeID == "n1" {
			cfg.PeerSecret, cfg.NextPeerSecret = nextPeer, cfg.PeerSecret
		} else {
			cfg.NextPeerSecret = nextPeer
		}
		cfg.AuthFailureDelay = time.Millisecond
	}})
	li := c.leader()
	for _, secret := range [][]byte{c.ClientSecret, next} {
		conn, err := dialWith(t, c.ClientAddr(li), client.Config{Secret: secret, ClusterID: c.ClusterID, TLS: c.ClientTLS})
		if err != nil {
			t.Fatalf("secret %q: %v", secret[:8], err)
		}
		tok := mustGrant(t, do(t, conn, acquireMsg("rollover", "o", 5, 0)))
		mustType(t, do(t, conn, releaseMsg("rollover", "o", tok)), wire.TypeOK)
	}
	if _, err := dialWith(t, c.ClientAddr(li), client.Config{Secret: []byte("neither-of-the-two-secrets"), ClusterID: c.ClusterID, TLS: c.ClientTLS}); !errors.Is(err, wire.ErrAuthFailed) {
		t.Fatalf("a third secret: %v, want auth_failed", err)
	}
	// Every node replicates, n1 with the new peer secret included.
	conn := c.dial(li)
	tok := mustGrant(t, do(t, conn, acquireMsg("replicated", "o", 30, 0)))
	c.converged("replicated", locksm.Holder{Owner: "o", Token: tok}, true)
}

func TestConfigSecurityChecks(t *testing.T) {
	base := cluster.DefaultConfig()
	base.NodeID, base.DataDir = "n1", t.TempDir()
	base.ClientAddr, base.PeerAddr = "127.0.0.1:0", "127.0.0.1:1"
	base.Peers = []cluster.Peer{{ID: "n1", Addr: "127.0.0.1:1"}, {ID: "n2", Addr: "127.0.0.1:2"}, {ID: "n3", Addr: "127.0.0.1:3"}}
	base.ClientSecret = []byte("0123456789abcdef0123")
	base.PeerSecret = []byte("fedcba9876543210fedc")
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*cluster.Config){
		"same secrets":     func(c *cluster.Config) { c.PeerSecret = c.ClientSecret },
		"short next":       func(c *cluster.Config) { c.NextClientSecret = []byte("short") },
		"TLS 1.2 clients":  func(c *cluster.Config) { c.ClientTLS = &tls.Config{MinVersion: tls.VersionTLS12} },
		"peer TLS no mTLS": func(c *cluster.Config) { c.PeerTLS = &tls.Config{MinVersion: tls.VersionTLS13} },
		"idle below 1s":    func(c *cluster.Config) { c.IdleTimeout = time.Millisecond },
		"negative keys":    func(c *cluster.Config) { c.MaxKeys = -1 },
	}
	for name, mut := range cases {
		cfg := base
		mut(&cfg)
		if err := cfg.Validate(); !errors.Is(err, cluster.ErrBadConfig) {
			t.Errorf("%s: %v, want ErrBadConfig", name, err)
		}
	}
}
