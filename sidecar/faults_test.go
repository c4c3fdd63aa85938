package sidecar

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"ticketing/cluster/local"
	"ticketing/locksm"
)

// DropConnections closes every cluster connection: a written acquire
// waiting on one is Indeterminate (never resent), the broker reconnects by
// itself, and the held lock survives (it lives in the cluster, not in the
// connection).
func TestBrokerDropConnections(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	ctx := ctxT(t, 30*time.Second)
	held, err := b.Acquire(ctx, "k", "holder", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "k", "waiter", 30*time.Second, 20*time.Second)
		errc <- err
	}()
	li := leaderOf(t, c)
	waitFor(t, "the waiter queued", 5*time.Second, func() bool {
		return waiting(c, li) == 1
	})
	if n := b.DropConnections(); n != len(c.ClientAddrs()) {
		t.Fatalf("dropped %d connections, want %d", n, len(c.ClientAddrs()))
	}
	if err := <-errc; !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("acquire in flight on a dropped connection: %v, want ErrIndeterminate", err)
	}
	waitFor(t, "the broker to reconnect", 5*time.Second, func() bool { return len(b.Info().Connected) == len(c.ClientAddrs()) })
	if err := b.Release(ctx, held); err != nil {
		t.Fatalf("release after the drop: %v", err)
	}
	waitFor(t, "the node to drop the dead connection's waiter", 5*time.Second, func() bool { return waiting(c, li) == 0 })
	if _, ok := holder(c, li, "k"); ok {
		t.Fatal("key still held: the waiter of a dead connection must not be granted")
	}
}

// The fault file's counter drops connections each time it grows, not at
// start.
func TestWatchFaultFile(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	path := filepath.Join(t.TempDir(), "faults.json")
	if err := WriteFaultFile(path, FaultSpec{DropConnections: 5}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { WatchFaultFile(ctx, path, 5*time.Millisecond, b, testLogger()); close(done) }()
	defer func() { cancel(); <-done }()
	first := b.Info().Connected
	time.Sleep(100 * time.Millisecond)
	if got := b.Info().Connected; len(got) != len(first) {
		t.Fatalf("a counter already present at start dropped connections: %v -> %v", first, got)
	}
	conns := map[any]bool{}
	b.mu.Lock()
	for _, s := range b.slots {
		conns[s.conn] = true
	}
	b.mu.Unlock()
	if err := WriteFaultFile(path, FaultSpec{DropConnections: 6}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every connection replaced", 5*time.Second, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, s := range b.slots {
			if s.conn == nil || conns[s.conn] {
				return false
			}
		}
		return true
	})
}

func waiting(c *local.Cluster, i int) int {
	n := 0
	c.Node(i).ReadState(func(st *locksm.State) { n = st.NumWaiting() })
	return n
}

// Regression (found by `ticketing verify`): a release whose first attempt
// reached the leader and was applied, but whose reply was lost with its
// connection, is retried and then answered not_held. That answer must not
// be reported as a definite "your lease ran out": the release may have been
// what freed the key. The broker reports it as Indeterminate.
func TestBrokerReleaseRetriedAfterLostReplyIsIndeterminate(t *testing.T) {
	c := startCluster(t)
	li := leaderOf(t, c)
	d := &stallDialer{}
	b := newBroker(t, c, func(cfg *Config) { seedOnly(cfg, c.ClientAddr(li)); cfg.Dialer = d.dial })
	ctx := ctxT(t, 30*time.Second)
	waitFor(t, "two connections", 5*time.Second, func() bool { return len(b.Info().Connected) == 1 && len(d.all()) == 2 })
	lk, err := b.Acquire(ctx, "k", "a", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range d.all() {
		sc.set(false, true) // replies are held back
	}
	errc := make(chan error, 1)
	go func() { errc <- b.Release(ctx, lk) }()
	waitFor(t, "the release applied on the leader", 5*time.Second, func() bool {
		_, held := holder(c, li, "k")
		return !held
	})
	b.DropConnections() // the K is lost with the connection
	err = <-errc
	if !errors.Is(err, ErrIndeterminate) || errors.Is(err, locksm.ErrNotHeld) {
		t.Fatalf("release applied but its reply lost, then retried: %v, want ErrIndeterminate (not a definite not_held)", err)
	}
	// A release that is simply late (the lease ran out) is still definite.
	lk2, err := b.Acquire(ctx, "k2", "a", 1*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lease to run out", 5*time.Second, func() bool {
		_, held := holder(c, li, "k2")
		return !held
	})
	if err := b.Release(ctx, lk2); !errors.Is(err, locksm.ErrNotHeld) {
		t.Fatalf("release after the lease ran out: %v, want not_held", err)
	}
}
