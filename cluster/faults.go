package cluster

import (
	"errors"
	"net"
	"sync"
)

// ErrLinkCut is returned by the peer transport for a link a Faults has cut.
var ErrLinkCut = errors.New("cluster: peer link cut by fault injection")

// Faults injects network faults into the peer transport at the connection
// level, in the style of etcd-io/raft's test network (cut, isolate, heal).
// One Faults may be shared by every node of an in-process cluster. A nil
// *Faults injects nothing. Safe for concurrent use.
//
// A cut link between a and b refuses new connections in both directions and
// closes the existing ones at once, so Raft sees exactly what a partition
// shows it: RPCs that fail or time out.
type Faults struct {
	mu    sync.Mutex
	cut   map[[2]string]bool
	conns map[*faultConn]struct{}
}

// NewFaults returns a Faults with every link up.
func NewFaults() *Faults {
	return &Faults{cut: map[[2]string]bool{}, conns: map[*faultConn]struct{}{}}
}

func linkKey(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Cut cuts the link between nodes a and b.
func (f *Faults) Cut(a, b string) {
	f.mu.Lock()
	f.cut[linkKey(a, b)] = true
	var doomed []*faultConn
	for c := range f.conns {
		if linkKey(c.a, c.b) == linkKey(a, b) {
			doomed = append(doomed, c)
		}
	}
	f.mu.Unlock()
	for _, c := range doomed {
		c.Conn.Close()
	}
}

// Isolate cuts every link between id and the others.
func (f *Faults) Isolate(id string, others []string) {
	for _, o := range others {
		if o != id {
			f.Cut(id, o)
		}
	}
}

// Heal restores every link.
func (f *Faults) Heal() {
	f.mu.Lock()
	f.cut = map[[2]string]bool{}
	f.mu.Unlock()
}

func (f *Faults) isCut(a, b string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cut[linkKey(a, b)]
}

func (f *Faults) allowDial(from, to string) error {
	if f == nil || !f.isCut(from, to) {
		return nil
	}
	return ErrLinkCut
}

// wrap registers an authenticated connection between a and b.
func (f *Faults) wrap(c net.Conn, a, b string) (net.Conn, error) {
	if f == nil {
		return c, nil
	}
	fc := &faultConn{Conn: c, f: f, a: a, b: b}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut[linkKey(a, b)] {
		c.Close()
		return nil, ErrLinkCut
	}
	f.conns[fc] = struct{}{}
	return fc, nil
}

type faultConn struct {
	net.Conn
	f    *Faults
	a, b string
}

func (c *faultConn) Read(p []byte) (int, error) {
	if c.f.isCut(c.a, c.b) {
		c.Close()
		return 0, ErrLinkCut
	}
	return c.Conn.Read(p)
}

func (c *faultConn) Write(p []byte) (int, error) {
	if c.f.isCut(c.a, c.b) {
		c.Close()
		return 0, ErrLinkCut
	}
	return c.Conn.Write(p)
}

func (c *faultConn) Close() error {
	c.f.mu.Lock()
	delete(c.f.conns, c)
	c.f.mu.Unlock()
	return c.Conn.Close()
}
