// End-to-end tests of the broker's cluster session against real nodes that
// speak version 7 (the default; upgrade_test.go has a cluster that gets
// there from 6).
package sidecar

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"ticketing/cluster/local"
	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/locksm"
)

// startSessionCluster starts three real nodes (version 7) and a
// broker that holds its session on the leader.
func startSessionCluster(t *testing.T, tune ...func(*Config)) (*local.Cluster, *Broker) {
	t.Helper()
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: testLogger(), Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b := newBroker(t, c, func(cfg *Config) {
		for _, f := range tune {
			f(cfg)
		}
	})
	testkit.WaitFor(t, "the cluster session attached", 20*time.Second, func() bool {
		si := b.Info().Session
		return si != nil && si.State == "attached"
	})
	return c, b
}

func waitResumed(t *testing.T, b *Broker) {
	t.Helper()
	testkit.WaitFor(t, "the cluster session resumed", 30*time.Second, func() bool {
		si := b.Info().Session
		return si != nil && si.State == "attached" && si.Resumes >= 1
	})
}

// The line survives the leader: waiters queued before the leader's kill
// are granted after it, in their order.
func TestE2ESessionLeaderKillKeepsLine(t *testing.T) {
	c, b := startSessionCluster(t)
	ctx := ctxT(t, 60*time.Second)
	held, err := b.Acquire(ctx, "k", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	li := leaderOf(t, c)
	const n = 5
	type res struct {
		i   int
		lk  Lock
		err error
	}
	out := make(chan res, n)
	for i := range n {
		go func() {
			lk, err := b.Acquire(ctx, "k", fmt.Sprintf("w%d", i), 60*time.Second, 40*time.Second)
			out <- res{i, lk, err}
		}()
		testkit.WaitFor(t, "waiter queued", 10*time.Second, func() bool {
			var q int
			c.Node(li).ReadState(func(st *locksm.State) { q = len(st.Waiters("k")) })
			return q == i+1
		})
	}
	c.Stop(li)
	waitResumed(t, b)
	if si := b.Info().Session; si.LastResume.Queued != n {
		t.Errorf("resume answered %+v, want %d still queued", si.LastResume, n)
	}
	if err := b.Release(ctx, held); err != nil {
		t.Fatalf("release on the new leader: %v", err)
	}
	for k := range n {
		r := <-out
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.i, r.err)
		}
		if r.i != k {
			t.Errorf("waiter %d granted %d-th", r.i, k)
		}
		if err := b.Release(ctx, r.lk); err != nil {
			t.Fatalf("release %d: %v", r.i, err)
		}
	}
}

// The session counterpart of TestBrokerLeaderKillDuringPendingAcquire: a
// waiter whose wait runs out after the kill gets a definite T, not
// Indeterminate.
func TestE2ESessionPendingAcquireAtKilledLeaderIsDefinite(t *testing.T) {
	c, b := startSessionCluster(t)
	ctx := ctxT(t, 60*time.Second)
	if _, err := b.Acquire(ctx, "k", "holder", 60*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	li := leaderOf(t, c)
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "k", "waiter", 60*time.Second, 5*time.Second)
		errc <- err
	}()
	testkit.WaitFor(t, "waiter queued", 10*time.Second, func() bool {
		var q int
		c.Node(li).ReadState(func(st *locksm.State) { q = len(st.Waiters("k")) })
		return q == 1
	})
	c.Stop(li)
	if err := <-errc; !errors.Is(err, ErrTimeout) {
		t.Fatalf("pending acquire at a killed leader: %v, want ErrTimeout (definite)", err)
	}
}

// The session counterpart of TestBrokerDropConnections: a queued acquire
// whose connections all drop keeps its place, and is granted when the
// holder releases.
func TestE2ESessionDropConnectionsKeepsWaiter(t *testing.T) {
	d := &netfault.Dropper{}
	c, b := startSessionCluster(t, func(cfg *Config) { cfg.Dialer = d.Dial })
	ctx := ctxT(t, 30*time.Second)
	held, err := b.Acquire(ctx, "k", "holder", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan acqResult, 1)
	go func() {
		lk, err := b.Acquire(ctx, "k", "waiter", 30*time.Second, 20*time.Second)
		got <- acqResult{lk, err}
	}()
	li := leaderOf(t, c)
	testkit.WaitFor(t, "the waiter queued", 5*time.Second, func() bool { return waiting(c, li) == 1 })
	d.Drop()
	waitResumed(t, b)
	if err := b.Release(ctx, held); err != nil {
		t.Fatalf("release after the drop: %v", err)
	}
	r := <-got
	if r.err != nil || r.lk.Token <= held.Token {
		t.Fatalf("waiter after the drop: %+v %v", r.lk, r.err)
	}
}

// The session counterpart of
// TestBrokerReleaseRetriedAfterLostReplyIsIndeterminate: a release applied
// whose reply was lost with its connection is answered by the resume:
// definite success.
func TestE2ESessionReleaseWithLostReplyIsDefinite(t *testing.T) {
	d := &stallDialer{}
	var leaderAddr string
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: testLogger(), Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	li := leaderOf(t, c)
	leaderAddr = c.ClientAddr(li)
	b := newBroker(t, c, func(cfg *Config) { seedOnly(cfg, leaderAddr); cfg.Dialer = d.dial })
	testkit.WaitFor(t, "the cluster session attached", 20*time.Second, func() bool {
		si := b.Info().Session
		return si != nil && si.State == "attached"
	})
	ctx := ctxT(t, 30*time.Second)
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
	if err := <-errc; err != nil {
		t.Fatalf("release applied, its reply lost: %v, want nil (the resume tells)", err)
	}
}
