package sidecar

import (
	"context"
	"fmt"
	"testing"
	"time"

	"ticketing/cluster/testkit"
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
