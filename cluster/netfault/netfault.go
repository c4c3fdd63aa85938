// Package netfault injects network faults at the connection level, for
// tests and the lab (cmd/ticketlab): cut and frozen links between named
// nodes (Network, which plugs into cluster.Config.PeerNet), dropped
// client connections (Dropper, which plugs into sidecar.Config.Dialer), and
// message-level faults on client connections (Frames, a dialer too: a
// chosen frame dropped, held back, or lost with its connection).
//
// It does not import cluster (only cluster/wire, to read frames), so the
// cluster package's own tests can use it; the product binary never links
// it (a test in cmd/ticketing pins that).
package netfault

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// ErrLinkCut is returned for I/O and dials on a link a Network has cut.
var ErrLinkCut = errors.New("netfault: link cut by fault injection")

// Network injects faults into the links between named nodes, in the style
// of etcd-io/raft's test network (cut, isolate, heal). It implements
// cluster.PeerNet, and one Network may be shared by every node of an
// in-process cluster; a lab node process has its own, driven by its fault
// file. Safe for concurrent use.
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
type Network struct {
	mu      sync.Mutex // a leaf: nothing is taken while it is held
	cut     map[[2]string]bool
	frozen  map[[2]string]bool
	conns   map[*faultConn]struct{}
	changed chan struct{} // closed and replaced on every change
}

// New returns a Network with every link up.
func New() *Network {
	return &Network{
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
func (f *Network) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// Cut cuts the link between nodes a and b.
func (f *Network) Cut(a, b string) {
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
func (f *Network) Freeze(a, b string) {
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
func (f *Network) SetLinks(cut, frozen [][2]string) {
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
func (f *Network) doomedLocked() []*faultConn {
	var doomed []*faultConn
	for c := range f.conns {
		if f.cut[c.link] {
			doomed = append(doomed, c)
		}
	}
	return doomed
}

// Isolate cuts every link between id and the others.
func (f *Network) Isolate(id string, others []string) {
	for _, o := range others {
		if o != id {
			f.Cut(id, o)
		}
	}
}

// Heal restores every link, cut or frozen.
func (f *Network) Heal() { f.SetLinks(nil, nil) }

// IsCut reports whether the link between a and b is cut.
func (f *Network) IsCut(a, b string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cut[linkKey(a, b)]
}

// IsFrozen reports whether the link between a and b is frozen.
func (f *Network) IsFrozen(a, b string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frozen[linkKey(a, b)]
}

// Dial implements cluster.PeerNet: TCP to addr, refused with ErrLinkCut
// while the link between from and to is cut.
func (f *Network) Dial(from, to, addr string, timeout time.Duration) (net.Conn, error) {
	if f.IsCut(from, to) {
		return nil, ErrLinkCut
	}
	return net.DialTimeout("tcp", addr, timeout)
}

// Wrap implements cluster.PeerNet: it puts the authenticated connection
// between local and remote under the link's faults, or refuses it with
// ErrLinkCut while the link is cut (the caller closes it then).
func (f *Network) Wrap(c net.Conn, local, remote string) (net.Conn, error) {
	fc := &faultConn{Conn: c, f: f, link: linkKey(local, remote)}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut[fc.link] {
		return nil, ErrLinkCut
	}
	f.conns[fc] = struct{}{}
	return fc, nil
}

// faultConn is a connection under fault injection. frozen and closed are
// guarded by Network.mu.
type faultConn struct {
	net.Conn
	f      *Network
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

// Dropper is a dialer that can drop every connection it dialled, as a
// network failure would (a sidecar's cluster connections: plug Dial into
// sidecar.Config.Dialer). Safe for concurrent use.
type Dropper struct {
	mu    sync.Mutex // a leaf
	conns map[*dropConn]struct{}
}

// Dial dials like a net.Dialer and remembers the connection until it is
// closed.
func (d *Dropper) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	dc := &dropConn{Conn: c, d: d}
	d.mu.Lock()
	if d.conns == nil {
		d.conns = map[*dropConn]struct{}{}
	}
	d.conns[dc] = struct{}{}
	d.mu.Unlock()
	return dc, nil
}

// Drop closes every open connection it dialled and returns how many: the
// owner's reads and writes on them fail as on a broken connection.
func (d *Dropper) Drop() int {
	d.mu.Lock()
	conns := make([]*dropConn, 0, len(d.conns))
	for c := range d.conns {
		conns = append(conns, c)
	}
	d.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return len(conns)
}

// Open is the number of connections it dialled that are still open.
func (d *Dropper) Open() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.conns)
}

type dropConn struct {
	net.Conn
	d *Dropper
}

func (c *dropConn) Close() error {
	c.d.mu.Lock()
	delete(c.d.conns, c)
	c.d.mu.Unlock()
	return c.Conn.Close()
}
