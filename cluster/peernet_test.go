package cluster

import (
	"errors"
	"net"
	"os"
	"path/filepath"
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

// The fault file drives the links and the stamped clock; a missing file is
// no fault, and a file that does not parse is refused at start.
func TestFaultFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "faults.json")
	base := time.Unix(1_700_000_000, 0)
	cfg := Config{FaultFile: path, Now: func() time.Time { return base }}
	ff, err := setupFaultFile(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.PeerNet == nil || cfg.Now().UnixMilli() != base.UnixMilli() {
		t.Fatal("missing file: want faults installed and no offset")
	}
	if err := WriteFaultFile(path, FaultSpec{Cut: [][2]string{{"n1", "n2"}}, Freeze: [][2]string{{"n1", "n3"}}, ClockOffsetMs: -30000}); err != nil {
		t.Fatal(err)
	}
	spec, err := ff.poll()
	if err != nil || spec == nil {
		t.Fatalf("poll: %v %v", spec, err)
	}
	if got := cfg.Now().Sub(base); got != -30*time.Second {
		t.Fatalf("clock offset %v, want -30s", got)
	}
	nf := cfg.PeerNet.(*netfault.Network)
	if !nf.IsCut("n2", "n1") || !nf.IsFrozen("n3", "n1") {
		t.Fatal("links not applied")
	}
	if spec, err := ff.poll(); spec != nil || err != nil {
		t.Fatalf("unchanged file applied again: %v %v", spec, err)
	}
	if err := os.WriteFile(path, []byte(`{"cut": 7}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ff.poll(); !errors.Is(err, ErrBadFaultFile) {
		t.Fatalf("bad file: %v", err)
	}
	if !nf.IsCut("n1", "n2") {
		t.Fatal("a bad file must keep the previous faults")
	}
	if err := os.WriteFile(path, []byte(`{"bogus": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg2 := Config{FaultFile: path}
	if _, err := setupFaultFile(&cfg2); !errors.Is(err, ErrBadFaultFile) {
		t.Fatalf("unknown field at start: %v", err)
	}
}

// Without a fault file the node installs nothing (the hot path is the
// plain connection).
func TestNoFaultFileNoFaults(t *testing.T) {
	cfg := Config{}
	ff, err := setupFaultFile(&cfg)
	if ff != nil || err != nil || cfg.PeerNet != nil || cfg.Now != nil {
		t.Fatal("fault injection installed without a fault file")
	}
}
