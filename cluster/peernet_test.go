package cluster

import (
	"net"
	"testing"
	"time"

	"ticketing/cluster/netfault"
)

// acceptInto forwards every connection n accepts to a channel.
func acceptInto(l *peerLayer) chan net.Conn {
	ch := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	return ch
}

// A frozen link blocks I/O on its existing connections until the thaw,
// holds back nothing and loses nothing; new dials work meanwhile.
func TestFaultsFreezeAndThaw(t *testing.T) {
	f := netfault.New()
	secret := []byte("peer-secret-0123456789")
	n1 := testPeerLayer(t, "n1", "c", secret, f)
	n2 := testPeerLayer(t, "n2", "c", secret, f)
	accepted := acceptInto(n1)
	c, err := n2.Dial(raftAddr("n1", hostport(n1)), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	srv := <-accepted
	f.Freeze("n2", "n1")

	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 5)
		n, _ := srv.Read(buf)
		got <- string(buf[:n])
	}()
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte("hello"))
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("write on a frozen link returned: %v", err)
	case s := <-got:
		t.Fatalf("read on a frozen link returned %q", s)
	case <-time.After(200 * time.Millisecond):
	}

	// A fresh connection on the frozen link works.
	c2, err := n2.Dial(raftAddr("n1", hostport(n1)), time.Second)
	if err != nil {
		t.Fatalf("dial on a frozen link: %v", err)
	}
	srv2 := <-accepted
	if _, err := c2.Write([]byte("x")); err != nil {
		t.Fatalf("write on a new connection: %v", err)
	}
	buf := make([]byte, 1)
	if _, err := srv2.Read(buf); err != nil || buf[0] != 'x' {
		t.Fatalf("read on a new connection: %v %q", err, buf)
	}

	f.SetLinks(nil, nil) // thaw
	if err := <-wrote; err != nil {
		t.Fatalf("write after the thaw: %v", err)
	}
	if s := <-got; s != "hello" {
		t.Fatalf("read after the thaw: %q", s)
	}
}

// Closing a connection blocked on a frozen link unblocks it.
func TestFaultsFrozenConnCloses(t *testing.T) {
	f := netfault.New()
	secret := []byte("peer-secret-0123456789")
	n1 := testPeerLayer(t, "n1", "c", secret, f)
	n2 := testPeerLayer(t, "n2", "c", secret, f)
	accepted := acceptInto(n1)
	c, err := n2.Dial(raftAddr("n1", hostport(n1)), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	<-accepted
	f.Freeze("n1", "n2")
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	c.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("read on a closed frozen connection succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close did not unblock a frozen read")
	}
}
