package sidecar

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Against a node that speaks protocol version 3 (no Q: a queued waiter
// keeps its slot until its final reply), the broker's MaxInFlight cap,
// which is meant for requests about to commit, must not cap the waiting
// room: every waiter is sent and queues at the leader.
func TestBrokerWaitingRoomOnAVersion3Connection(t *testing.T) {
	c := startCluster(t)
	const inFlight, waiters = 4, 40
	b := newBroker(t, c, func(cfg *Config) { cfg.MaxInFlight, cfg.maxVersion = inFlight, 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	holder, err := b.Acquire(ctx, "v3/hot", "holder", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lk  Lock
		err error
	}
	done := make(chan result, waiters)
	for i := range waiters {
		go func() {
			lk, err := b.Acquire(ctx, "v3/hot", fmt.Sprintf("w%02d", i), 10*time.Second, 30*time.Second)
			done <- result{lk, err}
		}()
	}
	leader := leaderOf(t, c)
	testkit.WaitFor(t, fmt.Sprintf("%d waiters queued at the leader (the broker caps %d in flight)", waiters, inFlight), 30*time.Second, func() bool {
		n := 0
		c.Node(leader).ReadState(func(st *locksm.State) { n = len(st.Waiters("v3/hot")) })
		return n == waiters
	})
	// Drain: every waiter is granted in turn.
	if err := b.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	for range waiters {
		r := <-done
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		if err := b.Release(ctx, r.lk); err != nil {
			t.Fatal(err)
		}
	}
}

// A wait over 5 minutes needs the leader at protocol version 11: against
// an older connection the broker answers wire.ErrNotSupported itself,
// definite and never sent (an older leader would answer invalid_wait,
// which reads as the caller's mistake); a 5-minute wait works as before,
// and on a version 11 connection an hour-long waiter queues.
func TestBrokerLongWaitNeedsVersion11(t *testing.T) {
	c := startCluster(t)
	old := newBroker(t, c, func(cfg *Config) { cfg.maxVersion = wire.VersionLogVerify })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	holder, err := old.Acquire(ctx, "lw/k", "holder", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Acquire(ctx, "lw/k", "w", 30*time.Second, 5*time.Minute+time.Millisecond); !errors.Is(err, wire.ErrNotSupported) {
		t.Fatalf("a wait of 300.001 s on a version 10 connection: %v, want wire.ErrNotSupported", err)
	}
	leader := leaderOf(t, c)
	n := -1
	c.Node(leader).ReadState(func(st *locksm.State) { n = len(st.Waiters("lw/k")) })
	if n != 0 {
		t.Fatalf("%d waiters queued: the refused acquire was sent", n)
	}
	b := newBroker(t, c, nil)
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "lw/k", "w", 30*time.Second, time.Hour)
		done <- err
	}()
	testkit.WaitFor(t, "the hour-long waiter queued at the leader", 30*time.Second, func() bool {
		var ws []locksm.Waiter
		c.Node(leader).ReadState(func(st *locksm.State) { ws = st.Waiters("lw/k") })
		return len(ws) == 1 && ws[0].WaitMs > locksm.MaxShortWaitMs // the wait left when sent
	})
	if err := old.Release(ctx, holder); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the hour-long waiter: %v", err)
	}
}
