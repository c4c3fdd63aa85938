package sidecar

import (
	"sync"
	"testing"
	"time"

	"ticketing/cluster/netfault"
)

// Issue 39: the reconnect backoff started again at BackoffMin after every
// successful handshake, so a node that accepts connections and drops them
// at once was redialled every 0.1 s forever. The backoff starts again only
// once a connection proved useful by staying up for BackoffMax; until
// then it keeps doubling. Here every connection to the node is cut at its
// first request (the status the broker asks right after the handshake).
// The pauses are recorded through Config.After, which does not sleep.
func TestBrokerBackoffNotResetByAConnectionThatDrops(t *testing.T) {
	c := startCluster(t)
	addr := c.ClientAddr(0)
	d := newReachDialer(t, func(netfault.Frame) netfault.Verdict { return netfault.Cut })
	var mu sync.Mutex
	var pauses []time.Duration
	b := newBrokerAddrs(t, c, []string{addr}, sessionsOff, func(cfg *Config) {
		cfg.AllowAddr = func(string) error { return nil }
		cfg.MembersRefresh = -1
		cfg.Dialer = d.dial
		cfg.After = func(p time.Duration) <-chan time.Time {
			mu.Lock()
			pauses = append(pauses, p)
			mu.Unlock()
			ch := make(chan time.Time, 1)
			ch <- time.Now()
			return ch
		}
	})
	d.endAtCleanup(t)
	deadline := time.Now().Add(30 * time.Second)
	for d.dialsTo(addr) < 24 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d dials", d.dialsTo(addr))
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Close()
	mu.Lock()
	defer mu.Unlock()
	// Two slots for the one address, each 100, 200, ... 3200 ms; the
	// 250 ms are the connections' leader probes.
	seen := map[time.Duration]int{}
	for _, p := range pauses {
		seen[p]++
	}
	if seen[DefaultBackoffMax] == 0 {
		t.Fatalf("after %d connections that each dropped at once, the backoff never reached %v: %v", d.dialsTo(addr), DefaultBackoffMax, seen)
	}
	if seen[DefaultBackoffMin] > 4 {
		t.Fatalf("%d pauses of %v between connections that each dropped at once: %v", seen[DefaultBackoffMin], DefaultBackoffMin, seen)
	}
}
