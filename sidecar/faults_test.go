package sidecar

import (
	"errors"
	"testing"
	"time"

	"ticketing/cluster/local"
	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/locksm"
)

// Every cluster connection dropped at once (as the lab's sidecar does
// through its dialer): a written acquire waiting on one is Indeterminate
// (never resent), the broker reconnects by itself, and the held lock
// survives (it lives in the cluster, not in the connection).
func TestBrokerDropConnections(t *testing.T) {
	c := startCluster(t)
	d := &netfault.Dropper{}
	// Session-less semantics (a cluster of version 6, or Sessions off):
	// with a session the outcome is definite (session_e2e_test.go).
	b := newBroker(t, c, func(cfg *Config) { cfg.Dialer = d.Dial; sessionsOff(cfg) })
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
	testkit.WaitFor(t, "the waiter queued", 5*time.Second, func() bool {
		return waiting(c, li) == 1
	})
	if n := d.Drop(); n != len(c.ClientAddrs()) {
		t.Fatalf("dropped %d connections, want %d", n, len(c.ClientAddrs()))
	}
	if err := <-errc; !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("acquire in flight on a dropped connection: %v, want ErrIndeterminate", err)
	}
	testkit.WaitFor(t, "the broker to reconnect", 5*time.Second, func() bool { return len(b.Info().Connected) == len(c.ClientAddrs()) })
	if err := b.Release(ctx, held); err != nil {
		t.Fatalf("release after the drop: %v", err)
	}
	testkit.WaitFor(t, "the node to drop the dead connection's waiter", 5*time.Second, func() bool { return waiting(c, li) == 0 })
	if _, ok := holder(c, li, "k"); ok {
		t.Fatal("key still held: the waiter of a dead connection must not be granted")
	}
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
	// Session-less semantics: with a session the resume tells that the
	// release applied (session_e2e_test.go).
	b := newBroker(t, c, func(cfg *Config) { seedOnly(cfg, c.ClientAddr(li)); cfg.Dialer = d.dial; sessionsOff(cfg) })
	ctx := ctxT(t, 30*time.Second)
	testkit.WaitFor(t, "two connections", 5*time.Second, func() bool { return len(b.Info().Connected) == 1 && len(d.all()) == 2 })
	lk, err := b.Acquire(ctx, "k", "a", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range d.all() {
		sc.set(false, true) // replies are held back
	}
	errc := make(chan error, 1)
	go func() { errc <- b.Release(ctx, lk) }()
	testkit.WaitFor(t, "the release applied on the leader", 5*time.Second, func() bool {
		_, held := holder(c, li, "k")
		return !held
	})
	for _, sc := range d.all() { // the K is lost with the connection
		_ = sc.Close()
	}
	err = <-errc
	if !errors.Is(err, ErrIndeterminate) || errors.Is(err, locksm.ErrNotHeld) {
		t.Fatalf("release applied but its reply lost, then retried: %v, want ErrIndeterminate (not a definite not_held)", err)
	}
	// A release that is simply late (the lease ran out) is still definite.
	lk2, err := b.Acquire(ctx, "k2", "a", 1*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the lease to run out", 5*time.Second, func() bool {
		_, held := holder(c, li, "k2")
		return !held
	})
	if err := b.Release(ctx, lk2); !errors.Is(err, locksm.ErrNotHeld) {
		t.Fatalf("release after the lease ran out: %v, want not_held", err)
	}
}
