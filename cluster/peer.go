package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster/tlsconf"
	"ticketing/cluster/wire"
)

// Peer addresses inside Raft carry the node id they must reach:
// "ID@HOST:PORT". hashicorp/raft hands the transport only the address, and
// counts a vote under the id it dialled; putting the id in the address lets
// the dialler demand proof of exactly that id in the handshake, so a node
// answering under another identity is refused by construction.

// raftAddr formats the Raft server address of (id, hostport).
func raftAddr(id, hostport string) raft.ServerAddress {
	return raft.ServerAddress(id + "@" + hostport)
}

// ErrBadPeerAddr: a Raft server address is not ID@HOST:PORT (raftAddr
// writes every address of a configuration, so one that does not parse was
// damaged).
var ErrBadPeerAddr = errors.New("cluster: peer address is not ID@HOST:PORT")

// splitRaftAddr splits "ID@HOST:PORT".
func splitRaftAddr(a raft.ServerAddress) (id, hostport string, err error) {
	id, hostport, ok := strings.Cut(string(a), "@")
	if !ok || id == "" || hostport == "" {
		return "", "", fmt.Errorf("%w: %q", ErrBadPeerAddr, a)
	}
	return id, hostport, nil
}

// PeerNet is the network under the peer transport (Config.PeerNet), the
// seam for network faults: cluster's own tests and the lab plug
// netfault.Network in here. Nodes are named by their node ids
// (Config.NodeID, the NAME of a server id). The transport calls it with no
// lock of this package held.
type PeerNet interface {
	// Dial opens the TCP connection from node from to node to, which
	// listens at addr (HOST:PORT), within timeout. TLS and the handshake
	// run on the returned conn.
	Dial(from, to, addr string, timeout time.Duration) (net.Conn, error)
	// Wrap is handed every peer connection, dialled or accepted, once its
	// handshake has proved both ends (local is this node, remote the
	// other); Raft talks on the conn it returns. An error refuses the link:
	// the transport closes c.
	Wrap(c net.Conn, local, remote string) (net.Conn, error)
}

// tcpNet is the PeerNet of a node without one: plain TCP.
type tcpNet struct{}

func (tcpNet) Dial(_, _, addr string, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", addr, timeout)
}

func (tcpNet) Wrap(c net.Conn, _, _ string) (net.Conn, error) { return c, nil }

func peerNetOf(cfg Config) PeerNet {
	if cfg.PeerNet == nil {
		return tcpNet{}
	}
	return cfg.PeerNet
}

// peerNetAddr is the net.Addr of the peer listener as Raft sees it.
type peerNetAddr struct{ s string }

func (a peerNetAddr) Network() string { return "tcp" }
func (a peerNetAddr) String() string  { return a.s }

// peerLayer is the raft.StreamLayer: TCP plus the peer handshake (with the
// peer secret, proving both node ids and the cluster id) in both directions.
// With PeerTLS, mutual TLS 1.3 wraps the TCP conn first, the handshake
// signs its exporter, and each side checks that the other's certificate
// names the node id it proved.
type peerLayer struct {
	ln   net.Listener
	self string // this node's server id, NAME/INCARNATION
	name string // this node's name
	// identity is what this node answers a discovering peer (Node.identity).
	identity func() (wire.Identity, error)
	// domain returns this node's fencing domain for each handshake ("" in
	// Bootstrap's dialer and before the domain is known).
	domain    func() string
	advertise raft.ServerAddress
	hs        wire.HandshakeConfig
	timeout   time.Duration
	net       PeerNet
	log       *slog.Logger
	tls       *tls.Config // nil: plaintext
	gate      *gate
	failures  *atomic.Uint64

	accepted chan net.Conn
	closing  chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
}

func newPeerLayer(ln net.Listener, cfg Config, serverID string, log *slog.Logger, failures *atomic.Uint64,
	identity func() (wire.Identity, error), domain func() string) *peerLayer {
	hostport := ln.Addr().String()
	if cfg.PeerAddr != "" && cfg.PeerListener == nil {
		hostport = cfg.PeerAddr
	}
	for _, p := range cfg.Peers {
		if p.ID == cfg.NodeID {
			hostport = p.Addr
		}
	}
	l := &peerLayer{
		ln:        ln,
		self:      serverID,
		name:      cfg.NodeID,
		advertise: raftAddr(serverID, hostport),
		identity:  identity,
		domain:    domain,
		hs: wire.HandshakeConfig{
			Kind:       wire.KindPeer,
			Secret:     cfg.PeerSecret,
			NextSecret: cfg.NextPeerSecret,
			ClusterID:  cfg.ClusterID,
			NodeID:     serverID,
			NodeName:   cfg.NodeID,
			MaxVersion: cfg.ProtocolVersion,
		},
		tls:      cfg.PeerTLS,
		gate:     newGate(cfg.MaxHandshakesPerIP, cfg.AuthFailureDelay, cfg.AuthFailureDelayMax),
		failures: failures,
		timeout:  cfg.HandshakeTimeout,
		net:      peerNetOf(cfg),
		log:      log,
		accepted: make(chan net.Conn),
		closing:  make(chan struct{}),
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *peerLayer) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.closing:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			l.log.Error("peer listener failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		l.wg.Add(1)
		go l.serverHandshake(c)
	}
}

func (l *peerLayer) serverHandshake(raw net.Conn) {
	defer l.wg.Done()
	ip := ipOf(raw.RemoteAddr().String())
	if !l.gate.enter(ip) {
		raw.Close()
		return
	}
	_ = raw.SetDeadline(time.Now().Add(l.timeout))
	c, binding, err := secureAccept(raw, l.tls)
	var peer wire.Peer
	if err == nil {
		hs := l.hs
		hs.ChannelBinding = binding
		hs.Domain = l.currentDomain()
		peer, err = wire.ServerHandshake(c, hs)
	}
	peerName, _ := SplitServerID(peer.NodeID)
	if err == nil && l.tls != nil && !slices.Contains(tlsconf.PeerNames(c), peerName) {
		err = fmt.Errorf("%w: %q proved its id with the peer secret, but its certificate names %v",
			wire.ErrWrongNode, peer.NodeID, tlsconf.PeerNames(c))
	}
	delay, failures := l.gate.leave(ip, err != nil)
	if err != nil {
		l.failures.Add(1)
		if logFailure(failures) {
			l.log.Warn("peer admission refused", "remote", raw.RemoteAddr().String(), "recent_failures_from_ip", failures, "err", err)
		}
		holdFor(delay, l.closing)
		raw.Close()
		return
	}
	if peer.Kind == wire.KindDiscover {
		// A node at its first start asks who we are: the Challenge proved
		// our server id; tell it whether we have state, then hang up.
		if err := l.answerDiscovery(c, peer.Version); err != nil {
			l.log.Error("discovering peer not answered", "remote", raw.RemoteAddr().String(), "peer", peer.NodeID, "err", err)
		}
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	fc, err := l.net.Wrap(c, l.name, peerName)
	if err != nil {
		c.Close()
		return
	}
	select {
	case l.accepted <- fc:
	case <-l.closing:
		fc.Close()
	}
}

// answerDiscovery writes this node's identity to a discovering peer on c,
// in the layout of version. When the node cannot tell whether it has Raft
// state it answers nothing (the error says why): the discoverer then sees
// the connection close, and Bootstrap, which needs every initial voter's
// answer, refuses rather than take the node for empty.
func (l *peerLayer) answerDiscovery(c net.Conn, version uint16) error {
	id, err := l.identity()
	if err != nil {
		return err
	}
	if err := wire.WriteIdentity(c, id, version); err != nil {
		return fmt.Errorf("cluster: sending the identity: %w", err)
	}
	return nil
}

// Accept implements net.Listener: it returns authenticated connections.
func (l *peerLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.accepted:
		return c, nil
	case <-l.closing:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *peerLayer) Close() error {
	var err error
	l.once.Do(func() {
		close(l.closing)
		err = l.ln.Close()
	})
	return err
}

// wait waits for the accept loop and handshakes to end (after Close).
func (l *peerLayer) wait() { l.wg.Wait() }

// Addr implements net.Listener; its String is this node's Raft address.
func (l *peerLayer) Addr() net.Addr { return peerNetAddr{string(l.advertise)} }

// Dial implements raft.StreamLayer: TCP, then the handshake demanding that
// the answering node proves the id named in address.
func (l *peerLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	id, hostport, err := splitRaftAddr(address)
	if err != nil {
		return nil, err
	}
	name, _ := SplitServerID(id)
	raw, c, peer, err := l.dialPeer(wire.KindPeer, id, name, hostport, timeout)
	if err != nil {
		l.log.Warn("peer dial failed", "peer", id, "addr", hostport, "err", err)
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	if peer.NodeID != id {
		raw.Close()
		return nil, fmt.Errorf("cluster: %s answered as %q: %w", hostport, peer.NodeID, wire.ErrWrongNode)
	}
	fc, err := l.net.Wrap(c, l.name, name)
	if err != nil {
		raw.Close()
		return nil, err
	}
	return fc, nil
}

// dialPeer dials hostport and runs TLS (whose certificate must name name,
// whatever address it answers at) and a handshake of kind expecting
// expect. On success it returns the TCP conn (to close) and the conn to
// talk on.
func (l *peerLayer) dialPeer(kind wire.ConnKind, expect, name, hostport string, timeout time.Duration) (raw, c net.Conn, peer wire.Peer, err error) {
	raw, err = l.net.Dial(l.name, name, hostport, timeout)
	if err != nil {
		return nil, nil, wire.Peer{}, err
	}
	_ = raw.SetDeadline(time.Now().Add(l.timeout))
	var tcfg *tls.Config
	if l.tls != nil {
		tcfg = l.tls.Clone()
		tcfg.ServerName = name
	}
	c, binding, err := secureDial(raw, tcfg)
	if err != nil {
		raw.Close()
		return nil, nil, wire.Peer{}, fmt.Errorf("cluster: TLS with %s at %s: %w", expect, hostport, err)
	}
	hs := l.hs
	hs.Kind, hs.ExpectNodeID, hs.ChannelBinding = kind, expect, binding
	hs.Domain = l.currentDomain()
	if peer, err = wire.ClientHandshake(c, hs); err != nil {
		raw.Close()
		return nil, nil, wire.Peer{}, fmt.Errorf("cluster: handshake with %s at %s: %w", expect, hostport, err)
	}
	return raw, c, peer, nil
}

func (l *peerLayer) currentDomain() string {
	if l.domain == nil {
		return ""
	}
	return l.domain()
}

// newPeerDialer is a peerLayer that only dials (Bootstrap's discovery).
func newPeerDialer(cfg Config, serverID string, log *slog.Logger) *peerLayer {
	return &peerLayer{
		self: serverID, name: cfg.NodeID, tls: cfg.PeerTLS, timeout: cfg.HandshakeTimeout, net: peerNetOf(cfg), log: log,
		hs: wire.HandshakeConfig{Kind: wire.KindPeer, Secret: cfg.PeerSecret, NextSecret: cfg.NextPeerSecret,
			ClusterID: cfg.ClusterID, NodeID: serverID, NodeName: cfg.NodeID, MaxVersion: cfg.ProtocolVersion},
	}
}

// discoverID is discover for a known server id: the node must prove
// exactly id. version is the protocol version negotiated with it (the
// lower of the two nodes').
func (l *peerLayer) discoverID(id, name, hostport string, timeout time.Duration) (ident wire.Identity, version uint16, err error) {
	raw, c, peer, err := l.dialPeer(wire.KindDiscover, id, name, hostport, timeout)
	if err != nil {
		return wire.Identity{}, 0, err
	}
	defer raw.Close()
	ident, err = wire.ReadIdentity(c, peer.Version)
	return ident, peer.Version, err
}

// discover asks the node named name at hostport (a peer port) for its
// server id and whether it has Raft state, with a KindDiscover handshake;
// version as for discoverID.
func (l *peerLayer) discover(name, hostport string, timeout time.Duration) (serverID string, id wire.Identity, version uint16, err error) {
	raw, c, peer, err := l.dialPeer(wire.KindDiscover, name, name, hostport, timeout)
	if err != nil {
		return "", wire.Identity{}, 0, err
	}
	defer raw.Close()
	if n, inc := SplitServerID(peer.NodeID); n != name || inc == "" {
		return "", wire.Identity{}, 0, fmt.Errorf("cluster: %s answered discovery as %q: %w", hostport, peer.NodeID, wire.ErrWrongNode)
	}
	id, err = wire.ReadIdentity(c, peer.Version)
	return peer.NodeID, id, peer.Version, err
}
