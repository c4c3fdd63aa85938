package cluster

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"ticketing/cluster/tlsconf"
	"ticketing/cluster/wire"
)

// Admission: what happens to an accepted connection before it may send a
// request (client port) or carry Raft traffic (peer port).
//
//  1. The per-address gate: at most MaxHandshakesPerIP connections from one
//     IP may be between accept and a finished handshake.
//  2. The first byte tells TLS (0x16, a handshake record) from plaintext; a
//     TLS port answers plaintext with E tls_required, a plaintext port logs
//     a TLS ClientHello and closes.
//  3. TLS 1.3 handshake (TLS ports), then the authentication handshake
//     with the TLS exporter as channel binding.
//  4. On any failure the connection is held for a delay that doubles with
//     every recent failure from the same IP (AuthFailureDelay up to
//     AuthFailureDelayMax), then closed: together with the gate this bounds
//     how fast one address can guess.

// tlsRecordHandshake is the first byte of every TLS ClientHello.
const tlsRecordHandshake = 0x16

// prefixConn replays bytes already read before reading from the conn.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// secureAccept runs steps 2 and 3's TLS part on c (its deadline already
// set): it returns the connection to run the authentication handshake on
// and the channel binding to sign.
func secureAccept(c net.Conn, cfg *tls.Config) (net.Conn, []byte, error) {
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return nil, nil, err
	}
	pc := &prefixConn{Conn: c, pre: first[:]}
	if cfg == nil {
		if first[0] == tlsRecordHandshake {
			// A TLS client cannot read a plaintext error frame; it reports
			// a non-TLS reply. The log on this side says what happened.
			return nil, nil, errTLSOnPlainPort
		}
		return pc, nil, nil
	}
	if first[0] != tlsRecordHandshake {
		err := fmt.Errorf("%w: plaintext on a TLS port (first byte 0x%02x)", wire.ErrTLSRequired, first[0])
		writeConnError(c, err)
		return nil, nil, err
	}
	tc := tls.Server(pc, cfg)
	if err := tc.Handshake(); err != nil {
		return nil, nil, fmt.Errorf("cluster: TLS handshake: %w", err)
	}
	binding, err := tlsconf.Binding(tc)
	if err != nil {
		return nil, nil, err
	}
	return tc, binding, nil
}

// secureDial is the dialler's side of secureAccept: nothing for a
// plaintext port, else a TLS 1.3 handshake with cfg (whose ServerName the
// caller has set) and the binding to sign.
func secureDial(c net.Conn, cfg *tls.Config) (net.Conn, []byte, error) {
	if cfg == nil {
		return c, nil, nil
	}
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return nil, nil, fmt.Errorf("cluster: TLS handshake: %w", err)
	}
	binding, err := tlsconf.Binding(tc)
	if err != nil {
		return nil, nil, err
	}
	return tc, binding, nil
}

// writeConnError writes a connection-level E frame (id 0) with a short
// deadline, ignoring failures: the connection is being closed anyway.
func writeConnError(c net.Conn, err error) {
	b, e := wire.AppendMsg(nil, &wire.Msg{Type: wire.TypeError, Code: wire.CodeOf(err), Text: truncate(err.Error(), 200)})
	if e != nil {
		return
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(b)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// isTimeout reports a deadline that ran out (the handshake timeout).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// gate is the per-IP admission state shared by one port's handshakes.
type gate struct {
	maxPending int
	base, max  time.Duration
	now        func() time.Time

	mu sync.Mutex // a leaf, taken with no other lock held (LOCKS.md)
	m  map[string]*gateEntry
}

type gateEntry struct {
	pending  int       // connections in admission
	failures int       // recent failures (forgotten after failureMemory)
	last     time.Time // last failure
}

// failureMemory is how long a failure counts toward the next delay.
const failureMemory = time.Minute

func newGate(maxPending int, base, max time.Duration) *gate {
	return &gate{maxPending: maxPending, base: base, max: max, now: time.Now, m: map[string]*gateEntry{}}
}

// enter admits one more connection from ip, or refuses it when ip already
// has maxPending in admission.
func (g *gate) enter(ip string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.m[ip]
	if e == nil {
		if len(g.m) >= 4096 {
			g.pruneLocked()
		}
		e = &gateEntry{}
		g.m[ip] = e
	}
	if e.pending >= g.maxPending {
		return false
	}
	e.pending++
	return true
}

// leave ends one admission from ip. On failure it returns how long to hold
// the connection before closing it and the count of recent failures.
func (g *gate) leave(ip string, failed bool) (delay time.Duration, failures int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.m[ip]
	if e == nil {
		return 0, 0
	}
	e.pending--
	now := g.now()
	if !failed {
		e.failures = 0
		if e.pending == 0 {
			delete(g.m, ip)
		}
		return 0, 0
	}
	if now.Sub(e.last) > failureMemory {
		e.failures = 0
	}
	e.failures++
	e.last = now
	delay = g.base
	for i := 1; i < e.failures && delay < g.max; i++ {
		delay *= 2
	}
	return min(delay, g.max), e.failures
}

// pruneLocked forgets addresses with nothing in admission and no recent
// failure, so the map stays bounded by active attackers.
func (g *gate) pruneLocked() {
	now := g.now()
	for ip, e := range g.m {
		if e.pending == 0 && now.Sub(e.last) > failureMemory {
			delete(g.m, ip)
		}
	}
}

// ipOf is the IP part of a remote address (the whole string if it has no
// port).
func ipOf(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	return host
}

// logFailure says whether the count-th recent failure from one address is
// logged: the first, then at powers of two, so an attack cannot flood the
// log but its growth stays visible.
func logFailure(count int) bool { return count&(count-1) == 0 }
