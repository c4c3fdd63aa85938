package sidecar

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/wire"
)

// The reconnect backoff against a node that accepts, completes the
// handshake and drops (issue 39). Before, every handshake started the
// backoff again at BackoffMin, so such a node was redialled every 0.1 s
// forever; a connection now counts like a failed dial unless it was
// useful: the node sent something on it (here: the reply to the status
// the broker asks of every new connection) or it stayed up
// usefulConnAfter. These tests run one keeper against a real TCP listener
// that speaks the real handshake, with a clock that moves only when a
// test moves it (no connection lives any time unless the test says so)
// and the keeper's pauses recorded through Config.After, which does not
// sleep: nothing depends on how fast the machine is.

const ms = time.Millisecond

// Issue 39: connections that the node drops right after the handshake,
// without sending anything, grow the backoff as failed dials do.
func TestBrokerBackoffGrowsAfterConnectionsThatServedNothing(t *testing.T) {
	node := newBackoffNode(t, func(int, net.Conn, *stepClock) {})
	bt := startBackoffBroker(t, node, 8)
	want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 3200 * ms, 3200 * ms}
	if got := bt.pauses(); !slices.Equal(got, want) {
		t.Fatalf("pauses after 8 connections dropped right after the handshake: %v, want %v", got, want)
	}
	bt.wantUnserved(8)
}

// A connection on which the node answered (the status the broker asks at
// once) starts the backoff again at BackoffMin, however soon it ended:
// the next redial comes BackoffMin after it dropped, as after every
// connection before issue 39. That is what keeps a failover fast: a
// node restarted and killed again between back-to-back failovers
// answered its status, so it is redialled at once (a rule asking for a
// connection that stayed up BackoffMax, 7e1581f, kept that redial at a
// high backoff and the lab saw a failover round without a cycle).
func TestBrokerBackoffStartsOverAfterAConnectionThatServed(t *testing.T) {
	node := newBackoffNode(t, func(i int, nc net.Conn, _ *stepClock) {
		if i == 4 {
			if m, ok := readStatus(nc); ok {
				writeMsg(nc, wire.Msg{Type: wire.TypeStatusR, ID: m.ID, NodeID: "fake/1", Role: wire.RoleFollower})
			}
		}
	})
	bt := startBackoffBroker(t, node, 8)
	// Four drops: 100..800 ms. The fifth connection served: 100 ms, and
	// the backoff grows from there again (the first pause after a served
	// connection does not double it, as before issue 39).
	want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 100 * ms, 100 * ms, 200 * ms, 400 * ms}
	if got := bt.pauses(); !slices.Equal(got, want) {
		t.Fatalf("pauses (the fifth connection answered a status): %v, want %v", got, want)
	}
	bt.wantUnserved(7)
}

// A connection that stayed up usefulConnAfter starts the backoff again at
// BackoffMin even if the node never sent anything on it.
func TestBrokerBackoffStartsOverAfterAConnectionThatLived(t *testing.T) {
	node := newBackoffNode(t, func(i int, nc net.Conn, clock *stepClock) {
		if i == 4 {
			// The status request comes after the keeper noted when the
			// connection came up; it is never answered.
			if _, ok := readStatus(nc); ok {
				clock.advance(usefulConnAfter)
			}
		}
	})
	bt := startBackoffBroker(t, node, 8)
	want := []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 100 * ms, 100 * ms, 200 * ms, 400 * ms}
	if got := bt.pauses(); !slices.Equal(got, want) {
		t.Fatalf("pauses (the fifth connection stayed up %v without a reply): %v, want %v", usefulConnAfter, got, want)
	}
	bt.wantUnserved(7)
}

// stepClock is a clock that moves only when advanced.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// backoffNode is a client port that runs the real handshake on every
// connection, then calls serve with the connection's number (from 0) and
// drops it: it stops writing (the broker reads EOF) and reads until the
// broker closes its end, so that nothing the broker wrote is left unread
// (closing with unread bytes sends a reset, which may destroy the
// handshake's last frame before the broker reads it).
type backoffNode struct {
	ln    net.Listener
	clock *stepClock

	mu    sync.Mutex
	n     int
	conns []net.Conn
}

func newBackoffNode(t *testing.T, serve func(i int, nc net.Conn, clock *stepClock)) *backoffNode {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	node := &backoffNode{ln: ln, clock: &stepClock{now: time.Unix(1_000_000, 0)}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			node.mu.Lock()
			i := node.n
			node.n++
			node.conns = append(node.conns, nc)
			node.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				if _, err := wire.ServerHandshake(nc, wire.HandshakeConfig{Kind: wire.KindClient, Secret: fakeSecret, NodeID: "fake/1"}); err != nil {
					return
				}
				serve(i, nc, node.clock)
				if tc, ok := nc.(*net.TCPConn); ok {
					if err := tc.CloseWrite(); err != nil {
						return
					}
				}
				_, _ = io.Copy(io.Discard, nc) // until the broker closes its end (or the cleanup does)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		node.mu.Lock()
		for _, nc := range node.conns {
			nc.Close()
		}
		node.mu.Unlock()
		wg.Wait()
	})
	return node
}

// readStatus reads the broker's requests until its status request.
func readStatus(nc net.Conn) (wire.Msg, bool) {
	r := wire.NewReader(nc)
	var m wire.Msg
	for r.ReadMsg(&m) == nil {
		if m.Type == wire.TypeStatus {
			return m, true
		}
	}
	return wire.Msg{}, false
}

func writeMsg(nc net.Conn, m wire.Msg) {
	b, err := wire.AppendMsg(nil, &m)
	if err != nil {
		panic(err)
	}
	_, _ = nc.Write(b) // a failed write shows as the broker's unexpected pauses
}

// backoffTest is a broker whose one keeper that counts dials the node's
// address (the other keeper's dial blocks until the end), with the
// keeper's pauses recorded.
type backoffTest struct {
	t *testing.T
	b *Broker

	mu      sync.Mutex
	paused  []time.Duration
	want    int
	enough  chan struct{}
	release chan struct{} // ends the other keeper's dial
}

// isBackoff reports whether d may be a reconnect pause (BackoffMin
// doubled, up to BackoffMax): the other pauses taken through
// Config.After (the leader probe's 250 ms, the session's) are not.
func isBackoff(d time.Duration) bool {
	for p := DefaultBackoffMin; p <= DefaultBackoffMax; p *= 2 {
		if d == p {
			return true
		}
	}
	return false
}

// startBackoffBroker starts a broker on node with one keeper dialling it
// and waits until that keeper paused n times, the nth pause lasting until
// the broker closes: n connections in all.
func startBackoffBroker(t *testing.T, node *backoffNode, n int) *backoffTest {
	t.Helper()
	bt := &backoffTest{t: t, want: n, enough: make(chan struct{}), release: make(chan struct{})}
	// A broker given one address keeps two connections to it; given two,
	// one each. The second is an address whose dial does not end until
	// the test ends, so the node's connections are one keeper's, in
	// order.
	const silent = "127.0.0.1:1"
	cfg := DefaultConfig()
	cfg.Addrs, cfg.Secret, cfg.Logger = []string{node.ln.Addr().String(), silent}, fakeSecret, testLogger()
	cfg.Sessions, cfg.MembersRefresh = SessionsOff, -1
	cfg.DialTimeout = time.Minute
	cfg.Now = node.clock.Now
	cfg.After = bt.after
	cfg.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == silent {
			select {
			case <-bt.release:
				return nil, errors.New("the test is over")
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	bt.b = b
	t.Cleanup(func() {
		close(bt.release)
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	select {
	case <-bt.enough:
	case <-time.After(2 * time.Minute): // a bound for a hung broker, not a speed
		t.Fatalf("the keeper paused only %d times: %v", len(bt.pauses()), bt.pauses())
	}
	return bt
}

// after is Config.After: a reconnect pause is recorded and ends at once,
// except the nth, which lasts until the broker closes; other pauses are
// real.
func (bt *backoffTest) after(d time.Duration) <-chan time.Time {
	if !isBackoff(d) {
		return time.After(d)
	}
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if len(bt.paused) == bt.want {
		return nil // after the nth pause (the other keeper at the end)
	}
	bt.paused = append(bt.paused, d)
	if len(bt.paused) == bt.want {
		close(bt.enough)
		return nil
	}
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

func (bt *backoffTest) pauses() []time.Duration {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	return slices.Clone(bt.paused)
}

// wantUnserved checks that every pause followed a connection that came
// up (none a failed dial: the other keeper's dial has not ended) and how
// many of them served nothing.
func (bt *backoffTest) wantUnserved(unserved int) {
	t := bt.t
	t.Helper()
	reg := bt.b.MetricsRegistry()
	wantValue(t, reg, 0, "ticketing_sidecar_connect_failures_total")
	wantValue(t, reg, float64(unserved), "ticketing_sidecar_unserved_connections_total")
}
