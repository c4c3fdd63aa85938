package faults

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/netfault"
	"ticketing/sidecar"
)

// Node plugs the fault file at path into a node's config: a
// netfault.Network as its PeerNet, driven by the file's cut and frozen
// links, and the file's clock offset in front of its Now (which moves only
// the wall time stamped into commands: lease and wait timers run on the
// monotonic clock, so that is exactly how a wall-clock jump reaches a
// node). The file is applied before Node returns and then followed until
// ctx ends (Watch). It returns the Network.
func Node(ctx context.Context, cfg *cluster.Config, path string, log *slog.Logger) (*netfault.Network, error) {
	log = log.With("part", "faults", "node", cfg.NodeID)
	nf := netfault.New()
	var offset atomic.Int64 // ms added to the stamped wall clock
	base := cfg.Now
	if base == nil {
		base = time.Now
	}
	first := true
	err := Watch(ctx, path, PollInterval, log, func(s Spec) {
		nf.SetLinks(s.Cut, s.Freeze)
		offset.Store(s.ClockOffsetMs)
		if !first {
			log.Warn("FAULT INJECTION: applying fault file", "cut", s.Cut, "freeze", s.Freeze, "clock_offset_ms", s.ClockOffsetMs)
		}
		first = false
	})
	if err != nil {
		return nil, err
	}
	log.Warn("FAULT INJECTION ENABLED: this node obeys a fault file; never use this in production", "fault_file", path)
	cfg.PeerNet = nf
	cfg.Now = func() time.Time { return base().Add(time.Duration(offset.Load()) * time.Millisecond) }
	return nf, nil
}

// Sidecar plugs the fault file at path into a sidecar's broker config: a
// netfault.Dropper as its Dialer, which drops every cluster connection
// each time the file's drop_connections counter grows. The counter seen at
// the first read is the baseline: a sidecar restarted next to an old file
// does not drop at once. The file is read before Sidecar returns and then
// followed until ctx ends (Watch). It returns the Dropper.
func Sidecar(ctx context.Context, cfg *sidecar.Config, path string, log *slog.Logger) (*netfault.Dropper, error) {
	log = log.With("part", "faults")
	d := &netfault.Dropper{}
	ac := &addrCutter{dial: d.Dial, cut: map[string]bool{}, conns: map[*cutConn]struct{}{}}
	var seen uint64
	first := true
	err := Watch(ctx, path, PollInterval, log, func(s Spec) {
		if n, changed := ac.set(s.CutAddrs); changed {
			log.Warn("FAULT INJECTION: cluster addresses cut", "cut_addrs", s.CutAddrs, "closed", n)
		}
		if !first && s.DropConnections > seen {
			n := d.Drop()
			log.Warn("FAULT INJECTION: dropped every cluster connection", "connections", n, "counter", s.DropConnections)
		}
		if first || s.DropConnections > seen {
			seen = s.DropConnections
		}
		first = false
	})
	if err != nil {
		return nil, err
	}
	log.Warn("FAULT INJECTION ENABLED: this sidecar obeys a fault file; never use this in production", "fault_file", path)
	cfg.Dialer = ac.Dial
	return d, nil
}

// addrCutter is a sidecar's dialer that refuses the cut addresses and
// closes its connections to them when they are cut (Spec.CutAddrs).
type addrCutter struct {
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	mu    sync.Mutex // a leaf
	cut   map[string]bool
	conns map[*cutConn]struct{}
}

type cutConn struct {
	net.Conn
	a    *addrCutter
	addr string
}

func (c *cutConn) Close() error {
	c.a.mu.Lock()
	delete(c.a.conns, c)
	c.a.mu.Unlock()
	return c.Conn.Close()
}

// Dial dials addr unless it is cut.
func (a *addrCutter) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	a.mu.Lock()
	cut := a.cut[addr]
	a.mu.Unlock()
	if cut {
		return nil, netfault.ErrLinkCut
	}
	c, err := a.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	cc := &cutConn{Conn: c, a: a, addr: addr}
	a.mu.Lock()
	if a.cut[addr] {
		a.mu.Unlock()
		c.Close()
		return nil, netfault.ErrLinkCut
	}
	a.conns[cc] = struct{}{}
	a.mu.Unlock()
	return cc, nil
}

// set makes addrs the cut addresses and closes the connections to them;
// it returns how many it closed and whether the set changed.
func (a *addrCutter) set(addrs []string) (int, bool) {
	next := map[string]bool{}
	for _, ad := range addrs {
		next[ad] = true
	}
	a.mu.Lock()
	changed := len(next) != len(a.cut)
	for ad := range next {
		if !a.cut[ad] {
			changed = true
		}
	}
	a.cut = next
	var doomed []*cutConn
	for c := range a.conns {
		if next[c.addr] {
			doomed = append(doomed, c)
		}
	}
	a.mu.Unlock()
	for _, c := range doomed {
		_ = c.Close() // its owner sees the broken connection
	}
	return len(doomed), changed
}
