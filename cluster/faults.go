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
// One Faults may be shared by every node of an in-process cluster; a node
// process started with Config.FaultFile gets its own, driven by that file.
// A nil *Faults injects nothing. Safe for concurrent use.
//
// A link is named by its two node ids, in either order; a fault on it
// applies to both directions.
//
// A cut link refuses new connections in both directions and closes the
// existing ones at once, so Raft sees exactly what a partition shows it:
// RPCs that fail or time out.
//
// A frozen link keeps its existing connections open but blocks all their
// I/O (reads and writes, deadlines ignored) until the link is thawed or the
// connection closed; bytes already received are held back, not lost.
// Connections dialled after the freeze work normally. This approximates a
// stalled replication stream whose fresh connections still get through —
// the shape of hashicorp/raft issues #611/#612, where replication to one
// follower stops while heartbeats continue.
type Faults struct {
	mu      sync.Mutex
	cut     map[[2]string]bool
	frozen  map[[2]string]bool
	conns   map[*faultConn]struct{}
	changed chan struct{} // closed and replaced on every change
}

// NewFaults returns a Faults with every link up.
func NewFaults() *Faults {
	return &Faults{
		cut: map[[2]string]bool{}, frozen: map[[2]string]bool{},
		conns: map[*faultConn]struct{}{}, changed: make(chan struct{}),
	}
}

func linkKey(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// notifyLocked wakes every connection blocked on a frozen link. Requires mu.
func (f *Faults) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// Cut cuts the link between nodes a and b.
func (f *Faults) Cut(a, b string) {
	f.mu.Lock()
	f.cut[linkKey(a, b)] = true
	doomed := f.doomedLocked()
	f.notifyLocked()
	f.mu.Unlock()
	for _, c := range doomed {
		c.Conn.Close()
	}
}

// Freeze freezes the link between nodes a and b: its current connections
// block all I/O until the link is thawed (SetLinks without it, or Heal).
func (f *Faults) Freeze(a, b string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := linkKey(a, b)
	f.frozen[k] = true
	for c := range f.conns {
		if c.link == k {
			c.frozen = true
		}
	}
	f.notifyLocked()
}

// SetLinks replaces the whole fault set at once: afterwards exactly the
// links in cut are cut and exactly those in frozen are frozen (a link in
// both is cut). A link that stays frozen keeps its frozen connections; a
// link newly frozen freezes the connections it has now.
func (f *Faults) SetLinks(cut, frozen [][2]string) {
	f.mu.Lock()
	f.cut = map[[2]string]bool{}
	for _, l := range cut {
		f.cut[linkKey(l[0], l[1])] = true
	}
	old := f.frozen
	f.frozen = map[[2]string]bool{}
	for _, l := range frozen {
		f.frozen[linkKey(l[0], l[1])] = true
	}
	for c := range f.conns {
		switch {
		case !f.frozen[c.link]:
			c.frozen = false
		case !old[c.link]:
			c.frozen = true
		}
	}
	doomed := f.doomedLocked()
	f.notifyLocked()
	f.mu.Unlock()
	for _, c := range doomed {
		c.Conn.Close()
	}
}

// doomedLocked lists the connections on cut links. Requires mu.
func (f *Faults) doomedLocked() []*faultConn {
	var doomed []*faultConn
	for c := range f.conns {
		if f.cut[c.link] {
			doomed = append(doomed, c)
		}
	}
	return doomed
}

// Isolate cuts every link between id and the others.
func (f *Faults) Isolate(id string, others []string) {
	for _, o := range others {
		if o != id {
			f.Cut(id, o)
		}
	}
}

// Heal restores every link, cut or frozen.
func (f *Faults) Heal() { f.SetLinks(nil, nil) }

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
	fc := &faultConn{Conn: c, f: f, link: linkKey(a, b)}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut[fc.link] {
		c.Close()
		return nil, ErrLinkCut
	}
	f.conns[fc] = struct{}{}
	return fc, nil
}

// faultConn is a peer connection under fault injection. frozen and closed
// are guarded by Faults.mu.
type faultConn struct {
	net.Conn
	f      *Faults
	link   [2]string
	frozen bool
	closed bool
}

// gate returns once c may do I/O: at once on a healthy link, after the thaw
// on a frozen one, and ErrLinkCut (closing c) on a cut one.
func (c *faultConn) gate() error {
	for {
		c.f.mu.Lock()
		if c.f.cut[c.link] {
			c.f.mu.Unlock()
			c.Close()
			return ErrLinkCut
		}
		if !c.frozen || c.closed {
			c.f.mu.Unlock()
			return nil
		}
		ch := c.f.changed
		c.f.mu.Unlock()
		<-ch
	}
}

func (c *faultConn) Read(p []byte) (int, error) {
	if err := c.gate(); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(p)
	// Bytes that arrived while the link froze are held until the thaw.
	if gerr := c.gate(); gerr != nil {
		return 0, gerr
	}
	return n, err
}

func (c *faultConn) Write(p []byte) (int, error) {
	if err := c.gate(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *faultConn) Close() error {
	c.f.mu.Lock()
	delete(c.f.conns, c)
	if !c.closed {
		c.closed = true
		c.f.notifyLocked()
	}
	c.f.mu.Unlock()
	return c.Conn.Close()
}
