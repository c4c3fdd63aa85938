package sidecar

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// The broker's block acquire against real nodes: all keys under one
// token, a Release of the Lock freeing every key, field errors before
// anything is sent, and a definite ErrNotSupported (never sent, never
// Indeterminate) on a connection that negotiated a version older than
// blocks.
func TestBrokerAcquireBlock(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys := []string{"blk/b", "blk/a", "blk/c"}
	lk, err := b.AcquireBlock(ctx, keys, "alice", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if lk.Key != "blk/b" || !slices.Equal(lk.Keys, keys) || lk.Token == 0 || lk.ValidUntil.IsZero() {
		t.Fatalf("lock %+v", lk)
	}
	keys[0] = "changed" // the Lock keeps its own copy
	if lk.Keys[0] != "blk/b" {
		t.Fatal("the Lock shares the caller's slice")
	}
	// Held as a whole: a try of any key, alone or in another block, is busy.
	if _, err := b.Acquire(ctx, "blk/c", "bob", 30*time.Second, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("try of a block's key: %v", err)
	}
	if _, err := b.AcquireBlock(ctx, []string{"blk/x", "blk/a"}, "bob", 30*time.Second, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("try of a block over a block's key: %v", err)
	}
	// A waiting block gets every key when the first is released.
	type result struct {
		lk  Lock
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := b.AcquireBlock(ctx, []string{"blk/c", "blk/d"}, "bob", 30*time.Second, 20*time.Second)
		done <- result{l, err}
	}()
	li := leaderOf(t, c)
	testkit.WaitFor(t, "bob's block to queue", 20*time.Second, func() bool {
		n := 0
		c.Node(li).ReadState(func(st *locksm.State) { n = st.QueueLen("blk/d") })
		return n == 1
	})
	if err := b.Release(ctx, lk); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.lk.Token <= lk.Token {
		t.Fatalf("bob's block: %+v %v (after token %d)", r.lk, r.err, lk.Token)
	}
	c.Node(li).ReadState(func(st *locksm.State) {
		for _, k := range []string{"blk/a", "blk/b"} {
			if _, held := st.Holder(k); held {
				t.Errorf("%s still held after the block's release", k)
			}
		}
		if h, _ := st.Holder("blk/d"); h.Token != r.lk.Token || !slices.Equal(h.Keys, []string{"blk/c", "blk/d"}) {
			t.Errorf("blk/d held by %+v", h)
		}
	})
	if err := b.Release(ctx, r.lk); err != nil {
		t.Fatal(err)
	}
	// Field errors: nothing is sent.
	for _, bad := range [][]string{nil, {"x", "x"}, {"x", "y z"}, make([]string, locksm.MaxBlockKeys+1)} {
		if _, err := b.AcquireBlock(ctx, bad, "alice", 30*time.Second, 0); !errors.Is(err, locksm.ErrInvalidBlock) && !errors.Is(err, locksm.ErrInvalidKey) {
			t.Errorf("keys %q: %v", bad, err)
		}
	}
	// One key is an ordinary acquire.
	one, err := b.AcquireBlock(ctx, []string{"blk/one"}, "alice", 30*time.Second, 0)
	if err != nil || one.Keys != nil || one.Key != "blk/one" {
		t.Fatalf("one key: %+v %v", one, err)
	}
	if err := b.Release(ctx, one); err != nil {
		t.Fatal(err)
	}

	old := newBroker(t, c, func(cfg *Config) { cfg.maxVersion = wire.VersionBlocks - 1 })
	if _, err := old.AcquireBlock(ctx, []string{"blk/e", "blk/f"}, "carol", 30*time.Second, 0); !errors.Is(err, wire.ErrNotSupported) {
		t.Fatalf("block on a version %d connection: %v", wire.VersionBlocks-1, err)
	}
	// The broker is still fine for everything else.
	l, err := old.Acquire(ctx, "blk/e", "carol", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}
