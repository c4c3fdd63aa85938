package cluster

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster/netfault"
	"ticketing/cluster/tlsconf"
	"ticketing/cluster/wire"
)

func testPeerLayer(t *testing.T, id, cluster string, secret []byte, faults PeerNet) *peerLayer {
	return testPeerLayerTLS(t, id, cluster, secret, faults, nil)
}

func testPeerLayerTLS(t *testing.T, id, cluster string, secret []byte, faults PeerNet, peerTLS *tls.Config) *peerLayer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeID: id, ClusterID: cluster, PeerSecret: secret, HandshakeTimeout: 2 * time.Second, PeerNet: faults,
		AuthFailureDelay: time.Millisecond, PeerTLS: peerTLS}
	l := newPeerLayer(ln, cfg.withDefaults(), id, slog.New(slog.DiscardHandler), new(atomic.Uint64), func() (wire.Identity, error) { return wire.Identity{}, nil }, nil)
	t.Cleanup(func() { l.Close(); l.wait() })
	return l
}

func hostport(l *peerLayer) string {
	_, hp, _ := splitRaftAddr(l.advertise)
	return hp
}

// The answering node must prove the id the dialler expects: hashicorp/raft
// counts a vote under the dialled id, so a node answering as another one
// could make a committed entry vanish.
func TestPeerDialProvesNodeID(t *testing.T) {
	secret := []byte("peer-secret-0123456789")
	n1 := testPeerLayer(t, "n1", "c", secret, nil)
	n2 := testPeerLayer(t, "n2", "c", secret, nil)

	go func() {
		for {
			c, err := n1.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	c, err := n2.Dial(raftAddr("n1", hostport(n1)), time.Second)
	if err != nil {
		t.Fatalf("dial the right node: %v", err)
	}
	c.Close()

	_, err = n2.Dial(raftAddr("n3", hostport(n1)), time.Second)
	if !errors.Is(err, wire.ErrWrongNode) {
		t.Fatalf("n1 answering for n3: got %v, want ErrWrongNode", err)
	}
}

func TestPeerDialRefusesWrongSecretAndCluster(t *testing.T) {
	n1 := testPeerLayer(t, "n1", "c", []byte("peer-secret-0123456789"), nil)
	bad := testPeerLayer(t, "n2", "c", []byte("another-secret-9876543"), nil)
	if _, err := bad.Dial(raftAddr("n1", hostport(n1)), time.Second); !errors.Is(err, wire.ErrAuthFailed) {
		t.Fatalf("wrong secret: got %v, want ErrAuthFailed", err)
	}
	other := testPeerLayer(t, "n2", "other", []byte("peer-secret-0123456789"), nil)
	if _, err := other.Dial(raftAddr("n1", hostport(n1)), time.Second); !errors.Is(err, wire.ErrWrongCluster) {
		t.Fatalf("wrong cluster: got %v, want ErrWrongCluster", err)
	}
}

func TestFaultsCutAndHeal(t *testing.T) {
	f := netfault.New()
	secret := []byte("peer-secret-0123456789")
	n1 := testPeerLayer(t, "n1", "c", secret, f)
	n2 := testPeerLayer(t, "n2", "c", secret, f)
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := n1.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	c, err := n2.Dial(raftAddr("n1", hostport(n1)), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	srv := <-accepted
	f.Cut("n1", "n2")
	if _, err := c.Write([]byte("x")); !errors.Is(err, netfault.ErrLinkCut) {
		t.Fatalf("write on a cut link: %v", err)
	}
	buf := make([]byte, 1)
	if _, err := srv.Read(buf); err == nil {
		t.Fatal("read on a cut link succeeded")
	}
	if _, err := n2.Dial(raftAddr("n1", hostport(n1)), time.Second); !errors.Is(err, netfault.ErrLinkCut) {
		t.Fatalf("dial on a cut link: %v", err)
	}
	f.Heal()
	c2, err := n2.Dial(raftAddr("n1", hostport(n1)), time.Second)
	if err != nil {
		t.Fatalf("dial after heal: %v", err)
	}
	c2.Close()
}

// devPeerTLS issues a throwaway CA and peer TLS configs for ids.
func devPeerTLS(t *testing.T, ids ...string) map[string]*tls.Config {
	t.Helper()
	_, files, err := tlsconf.DevSet(t.TempDir(), ids, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*tls.Config{}
	for id, f := range files {
		if out[id], err = tlsconf.PeerConfig(f); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// Over mutual TLS the certificate must name the node id on both sides: the
// dialler checks the id it dials, the acceptor the id the dialler proved.
func TestPeerTLSIdentity(t *testing.T) {
	secret := []byte("peer-secret-0123456789")
	tl := devPeerTLS(t, "n1", "n2", "n3")
	n1 := testPeerLayerTLS(t, "n1", "c", secret, nil, tl["n1"])
	n2 := testPeerLayerTLS(t, "n2", "c", secret, nil, tl["n2"])
	go func() {
		for {
			c, err := n1.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	c, err := n2.Dial(raftAddr("n1", hostport(n1)), time.Second)
	if err != nil {
		t.Fatalf("dial n1 over TLS: %v", err)
	}
	c.Close()

	// n1's certificate does not name n3: refused before any proof.
	if _, err := n2.Dial(raftAddr("n3", hostport(n1)), time.Second); err == nil {
		t.Fatal("n1 answered for n3 over TLS")
	}

	// A dialler that knows the peer secret but holds n3's certificate
	// while claiming to be n2 is refused by the acceptor.
	liar := testPeerLayerTLS(t, "n2", "c", secret, nil, tl["n3"])
	if c, err := liar.Dial(raftAddr("n1", hostport(n1)), time.Second); err == nil {
		// The acceptor refuses after the dialler's handshake finished:
		// the refused connection is closed without carrying traffic.
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, rerr := c.Read(make([]byte, 1)); rerr == nil {
			t.Fatal("acceptor kept a connection whose certificate names another node")
		}
		c.Close()
	}
	deadline := time.Now().Add(2 * time.Second)
	for n1.failures.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n1.failures.Load() == 0 {
		t.Fatal("n1 did not count the liar as a failed admission")
	}

	// A plaintext dialler is refused by the TLS peer port.
	plain := testPeerLayer(t, "n2", "c", secret, nil)
	if _, err := plain.Dial(raftAddr("n1", hostport(n1)), time.Second); !errors.Is(err, wire.ErrTLSRequired) {
		t.Fatalf("plaintext dial of a TLS peer port: %v, want tls_required", err)
	}
}

// A node that cannot read its Raft state answers a discovering peer
// nothing rather than "no state" (Bootstrap would take it for empty): the
// discoverer sees the connection close. With the state readable, the
// same discovery gets the answer.
func TestDiscoveryNotAnsweredWithoutState(t *testing.T) {
	secret := []byte("peer-secret-0123456789")
	errDisk := errors.New("injected: the snapshot store cannot be listed")
	var failing atomic.Bool
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeID: "n1", ClusterID: "c", PeerSecret: secret, HandshakeTimeout: 2 * time.Second, AuthFailureDelay: time.Millisecond}
	n1 := newPeerLayer(ln, cfg.withDefaults(), "n1/abcdefghij", slog.New(slog.DiscardHandler), new(atomic.Uint64),
		func() (wire.Identity, error) {
			if failing.Load() {
				return wire.Identity{}, errDisk
			}
			return wire.Identity{HasState: true}, nil
		}, nil)
	t.Cleanup(func() { n1.Close(); n1.wait() })
	d := newPeerDialer(Config{NodeID: "n2", ClusterID: "c", PeerSecret: secret, HandshakeTimeout: 2 * time.Second}.withDefaults(), "n2/abcdefghij", slog.New(slog.DiscardHandler))
	_, hp, err := splitRaftAddr(n1.advertise)
	if err != nil {
		t.Fatal(err)
	}
	if _, id, _, err := d.discover("n1", hp, time.Second); err != nil || !id.HasState {
		t.Fatalf("discovery of a node with state: %+v, %v", id, err)
	}
	failing.Store(true)
	if _, id, _, err := d.discover("n1", hp, time.Second); err == nil {
		t.Fatalf("discovery of a node that cannot read its state answered %+v, want no answer", id)
	}
}

// answerDiscovery reports a failed write of the identity (the peer hung
// up) instead of dropping it.
func TestAnswerDiscoveryReportsAFailedWrite(t *testing.T) {
	l := &peerLayer{identity: func() (wire.Identity, error) { return wire.Identity{}, nil }}
	a, b := net.Pipe()
	b.Close()
	defer a.Close()
	if err := l.answerDiscovery(a, wire.ProtocolVersion); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("answer to a peer that hung up: %v, want io.ErrClosedPipe", err)
	}
}
