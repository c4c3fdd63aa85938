package cluster_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// rawConn is an authenticated client connection driven byte by byte.
func (c *testCluster) rawConn(i int) (net.Conn, *wire.Reader) {
	c.t.Helper()
	conn, err := net.DialTimeout("tcp", c.ClientAddr(i), 2*time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := wire.ClientHandshake(conn, wire.HandshakeConfig{Kind: wire.KindClient, Secret: c.ClientSecret, ClusterID: c.ClusterID}); err != nil {
		c.t.Fatal(err)
	}
	return conn, wire.NewReader(conn)
}

func frame(typ byte, payload []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(1+len(payload)))
	return append(append(b, typ), payload...)
}

func TestHostileInputOnlyHurtsTheSender(t *testing.T) {
	c := startCluster(t, 3)
	li := c.leader()
	good := c.dial(li)
	tok := mustGrant(t, do(t, good, acquireMsg("mine", "good", 60, 0)))

	// A well-framed acquire with an empty key: E under its id, and the
	// connection stays usable.
	conn, r := c.rawConn(li)
	p := binary.BigEndian.AppendUint64(nil, 7)
	p = binary.BigEndian.AppendUint16(p, 10)
	p = binary.BigEndian.AppendUint32(p, 0)
	p = append(p, 0)      // key: empty
	p = append(p, 1, 'o') // owner
	if _, err := conn.Write(frame(wire.TypeAcquire, p)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(frame(wire.TypePing, binary.BigEndian.AppendUint64(nil, 8))); err != nil {
		t.Fatal(err)
	}
	var m wire.Msg
	if err := r.ReadMsg(&m); err != nil || m.Type != wire.TypeError || m.ID != 7 || m.Code != wire.CodeInvalidKey {
		t.Fatalf("empty key: got %+v %v, want E(invalid_key) for id 7", m, err)
	}
	if err := r.ReadMsg(&m); err != nil || m.Type != wire.TypePong || m.ID != 8 {
		t.Fatalf("after a field error the connection must stay usable: %+v %v", m, err)
	}

	for name, bad := range map[string][]byte{
		"unknown type": frame('q', []byte{1, 2, 3}),
		"oversize":     binary.BigEndian.AppendUint32(nil, 1<<30),
		"zero length":  binary.BigEndian.AppendUint32(nil, 0),
		"truncated":    frame(wire.TypeAcquire, []byte{0, 0, 0, 0, 0, 0, 0, 9, 0}),
		"handshake":    frame(wire.TypeHello, []byte("TKTG")),
		"reply type":   frame(wire.TypeGranted, make([]byte, 16)),
	} {
		conn, r := c.rawConn(li)
		if _, err := conn.Write(bad); err != nil {
			t.Fatal(err)
		}
		m = wire.Msg{}
		err := r.ReadMsg(&m)
		if err != nil || m.Type != wire.TypeError || m.ID != 0 {
			t.Fatalf("%s: want a connection-level E, got %+v %v", name, m, err)
		}
		m = wire.Msg{}
		if err := r.ReadMsg(&m); !errors.Is(err, io.EOF) && !isReset(err) {
			t.Fatalf("%s: connection not closed after E: %+v %v", name, m, err)
		}
	}

	// Wrong secret: the handshake fails and nothing is served.
	raw, err := net.Dial("tcp", c.ClientAddr(li))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := wire.ClientHandshake(raw, wire.HandshakeConfig{Kind: wire.KindClient, Secret: []byte("not-the-secret-at-all"), ClusterID: c.ClusterID}); err == nil {
		t.Fatal("handshake with a wrong secret succeeded")
	}

	// The well-behaved client's lock is untouched and it is still served.
	c.converged("mine", locksm.Holder{Owner: "good", Token: tok}, true)
	mustType(t, do(t, good, releaseMsg("mine", "good", tok)), wire.TypeOK)
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}
