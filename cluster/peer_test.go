package cluster

import (
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"ticketing/cluster/wire"
)

func testPeerLayer(t *testing.T, id, cluster string, secret []byte, faults *Faults) *peerLayer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeID: id, ClusterID: cluster, PeerSecret: secret, HandshakeTimeout: 2 * time.Second, Faults: faults}
	l := newPeerLayer(ln, cfg, slog.New(slog.DiscardHandler))
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
	f := NewFaults()
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
	if _, err := c.Write([]byte("x")); !errors.Is(err, ErrLinkCut) {
		t.Fatalf("write on a cut link: %v", err)
	}
	buf := make([]byte, 1)
	if _, err := srv.Read(buf); err == nil {
		t.Fatal("read on a cut link succeeded")
	}
	if _, err := n2.Dial(raftAddr("n1", hostport(n1)), time.Second); !errors.Is(err, ErrLinkCut) {
		t.Fatalf("dial on a cut link: %v", err)
	}
	f.Heal()
	c2, err := n2.Dial(raftAddr("n1", hostport(n1)), time.Second)
	if err != nil {
		t.Fatalf("dial after heal: %v", err)
	}
	c2.Close()
}
