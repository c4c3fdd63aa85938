package sidecar

import (
	"context"
	"errors"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Long waits through a rolling upgrade, seen from a broker of this
// release: the leader speaks 11 (so the broker sends the hour-long wait)
// while a member is still at 10 (so the cluster version is 10): the
// leader's E not_supported reaches the caller as wire.ErrNotSupported,
// definite, nothing queued on any node, and a 5-minute waiter queues as
// before. Once the last member runs 11 the same broker's hour-long waiter
// queues on every node and takes the key in its turn.
func TestBrokerLongWaitDuringRollingUpgrade(t *testing.T) {
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: testLogger(), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.ProtocolVersion = wire.VersionLogVerify
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	li := leaderOf(t, c)
	// Both followers run 11; then the old leader (still 10) stops, and one
	// of them leads a cluster whose version stays 10.
	for i := range c.Size() {
		if i == li {
			continue
		}
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
		if err := c.RestartWith(i, func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionLongWaits }); err != nil {
			t.Fatal(err)
		}
		leaderOf(t, c)
	}
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	nl := leaderOf(t, c)
	if v := c.Node(nl).ClusterVersion(); v != wire.VersionLogVerify {
		t.Fatalf("cluster version %d with a member at 10", v)
	}
	b := newBroker(t, c, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	holder, err := b.Acquire(ctx, "up/k", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "up/k", "w", 30*time.Second, time.Hour); !errors.Is(err, wire.ErrNotSupported) {
		t.Fatalf("an hour-long wait on a cluster at version 10: %v, want wire.ErrNotSupported", err)
	}
	short := make(chan error, 1)
	go func() {
		lk, err := b.Acquire(ctx, "up/k", "short", 30*time.Second, 5*time.Minute)
		if err == nil {
			err = b.Release(ctx, lk)
		}
		short <- err
	}()
	waiters := func(i int) []locksm.Waiter {
		var ws []locksm.Waiter
		c.Node(i).ReadState(func(st *locksm.State) { ws = st.Waiters("up/k") })
		return ws
	}
	testkit.WaitFor(t, "the 5-minute waiter queued, alone", 20*time.Second, func() bool {
		ws := waiters(nl)
		return len(ws) == 1 && ws[0].Owner == "short"
	})

	// The last member runs 11: the cluster version rises.
	if err := c.RestartWith(li, func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionLongWaits }); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "cluster version 11", 60*time.Second, func() bool {
		i, err := c.Leader(ctx)
		return err == nil && c.Node(i).ClusterVersion() >= wire.VersionLongWaits
	})
	long := make(chan error, 1)
	go func() {
		lk, err := b.Acquire(ctx, "up/k", "long", 30*time.Second, time.Hour)
		if err == nil {
			err = b.Release(ctx, lk)
		}
		long <- err
	}()
	for i := range c.Size() {
		testkit.WaitFor(t, "the hour-long waiter queued behind the 5-minute one on every node", 30*time.Second, func() bool {
			ws := waiters(i)
			return len(ws) == 2 && ws[0].Owner == "short" && ws[1].Owner == "long" && ws[1].WaitMs > locksm.MaxShortWaitMs
		})
	}
	if err := b.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	if err := <-short; err != nil {
		t.Fatalf("the 5-minute waiter: %v", err)
	}
	select {
	case err := <-long:
		if err != nil {
			t.Fatalf("the hour-long waiter: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the hour-long waiter was not granted after the 5-minute one's release")
	}
}
