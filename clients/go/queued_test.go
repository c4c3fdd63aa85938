package ticketing

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// counter is a WithQueued hook that counts its calls.
type counter struct{ n atomic.Int32 }

func (c *counter) hook() AcquireOption { return WithQueued(func() { c.n.Add(1) }) }
func (c *counter) get() int32          { return c.n.Load() }

// "! QUEUED <n> <keys>" reaches the hook of the ACQUIRE written n-th (the
// HELLO is line 1), once, before that acquire returns; a position of no
// pending ACQUIRE, other keys, a second QUEUED and malformed lines are
// ignored, and none of them shifts the replies.
func TestQueuedRoutedByPosition(t *testing.T) {
	c, f := pipeClient(t, "HELLO 4 events")
	var first, second counter
	var firstBeforeReturn atomic.Int32
	ctx := context.Background()
	r1 := async(func() error {
		_, err := c.Acquire(ctx, "k", 30*time.Second, 10*time.Second, first.hook())
		firstBeforeReturn.Store(first.get())
		return err
	})
	if r := f.req(); r != "ACQUIRE k 30 10.000" {
		t.Fatalf("request %q", r)
	}
	r2 := async(func() lockRes {
		l, err := c.Lock(ctx, "k", 30*time.Second, 10*time.Second, second.hook())
		return lockRes{l, err}
	})
	if r := f.req(); r != "ACQUIRE k 30 10.000" {
		t.Fatalf("request %q", r)
	}
	// Line 3 is the Lock: only its hook runs.
	f.write("! QUEUED 3 k")
	waitCount(t, &second, 1)
	// Line 4, whose hook tells that the reader got past the lines before
	// its QUEUED.
	var barrier counter
	r3 := async(func() error {
		_, err := c.Acquire(ctx, "k3", 30*time.Second, 10*time.Second, barrier.hook())
		return err
	})
	f.req()
	f.write("! QUEUED 9 k", "! QUEUED 2 other", "! QUEUED 2 k k2", "! QUEUED 0 k", "! QUEUED x k", "! QUEUED 2",
		"! QUEUED 2  k", "! QUEUED 2 k ", "!  QUEUED 2 k", "! queued 2 k", "! QUEUED 3 k", "! QUEUED 4 k3")
	waitCount(t, &barrier, 1)
	if first.get() != 0 || second.get() != 1 {
		t.Fatalf("hooks ran %d and %d times, want 0 and 1", first.get(), second.get())
	}
	f.write("! QUEUED 2 k", "! QUEUED 2 k")
	waitCount(t, &first, 1)
	f.write("OK 5", "TIMEOUT", "BUSY")
	if err := recv(t, r1); err != nil {
		t.Fatal(err)
	}
	if res := recv(t, r2); !errors.Is(res.err, ErrTimeout) {
		t.Fatalf("Lock: %v, want ErrTimeout", res.err)
	}
	if err := recv(t, r3); !errors.Is(err, ErrBusy) {
		t.Fatalf("third Acquire: %v, want ErrBusy", err)
	}
	if firstBeforeReturn.Load() != 1 || first.get() != 1 || second.get() != 1 {
		t.Fatalf("hooks ran %d (%d before Acquire returned) and %d times, want once each", first.get(),
			firstBeforeReturn.Load(), second.get())
	}
	// A QUEUED after the reply names nothing any more.
	f.write("! QUEUED 2 k")
	pong := async(func() error { return c.Ping(ctx) })
	f.req()
	f.write("PONG")
	if err := recv(t, pong); err != nil || first.get() != 1 {
		t.Fatalf("Ping %v; hook ran %d times", err, first.get())
	}
}

// A block's QUEUED names its keys in the order asked; an acquire whose ctx
// ended never has its hook called, not even by a QUEUED that arrives
// afterwards.
func TestQueuedBlockAndGivenUp(t *testing.T) {
	c, f := pipeClient(t, "HELLO 4 events")
	var blk, gone counter
	ctx := context.Background()
	rb := async(func() lockRes {
		l, err := c.LockBlock(ctx, []string{"b", "a"}, 30*time.Second, 10*time.Second, blk.hook())
		return lockRes{l, err}
	})
	if r := f.req(); r != "ACQUIRE b a 30 10.000" {
		t.Fatalf("request %q", r)
	}
	f.write("! QUEUED 2 a b") // not its order
	cctx, cancel := context.WithCancel(ctx)
	rg := async(func() error {
		_, err := c.AcquireBlock(cctx, []string{"x", "y"}, 30*time.Second, 10*time.Second, gone.hook())
		return err
	})
	if r := f.req(); r != "ACQUIRE x y 30 10.000" {
		t.Fatalf("request %q", r)
	}
	cancel()
	if err := recv(t, rg); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireBlock: %v, want context.Canceled", err)
	}
	f.write("! QUEUED 3 x y", "! QUEUED 2 b a", "OK 7")
	if res := recv(t, rb); res.err != nil || res.l.Token() != 7 {
		t.Fatalf("LockBlock: %v", res.err)
	}
	if blk.get() != 1 || gone.get() != 0 {
		t.Fatalf("hooks ran %d and %d times, want 1 and 0", blk.get(), gone.get())
	}
	// The given-up grant is released by the Client.
	f.write("OK 8")
	if r := f.req(); r != "RELEASE x 8" {
		t.Fatalf("request %q", r)
	}
	f.write("OK")
}

func waitCount(t *testing.T, c *counter, n int32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.get() < n {
		if time.Now().After(deadline) {
			t.Fatalf("hook ran %d times, want %d", c.get(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
