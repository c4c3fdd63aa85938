package ticketing_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/unixapi"
)

// bothSpeak is the version HELLO agrees with the sidecar of this tree: the
// lower of the client's and the sidecar's (the client may run a version
// ahead while the sidecar's side of it is built).
const bothSpeak = min(ticketing.ProtocolVersion, unixapi.ProtocolVersion)

// WithQueued against a real sidecar and cluster: the Client agrees the
// newest version; each waiter is sent once the one before it was queued (no sleep),
// and the key goes to them in that order; the hooks of Acquire, Lock,
// AcquireBlock and LockBlock each run once, before their call returns;
// none for wait 0 or a free key.
func TestWithQueuedRealSidecar(t *testing.T) {
	sock := sidecarSocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dial := func() *ticketing.Client {
		c, err := ticketing.Dial(ctx, sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	prefix := fmt.Sprintf("go/queued/%d/", time.Now().UnixNano())
	k, k2 := prefix+"k", prefix+"k2"
	a := dial()
	if v, err := a.Hello(ctx); err != nil || v != bothSpeak {
		t.Fatalf("Hello: %d %v, want %d", v, err, bothSpeak)
	}
	tok, err := a.Acquire(ctx, k, 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	tok2, err := a.Acquire(ctx, k2, 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}

	// Wait 0 and a free key: no hook.
	var never atomic.Int32
	hook := ticketing.WithQueued(func() { never.Add(1) })
	if _, err := dial().Acquire(ctx, k, 30*time.Second, 0, hook); !errors.Is(err, ticketing.ErrBusy) {
		t.Fatalf("wait 0: %v", err)
	}
	free, err := dial().Lock(ctx, prefix+"free", 30*time.Second, 5*time.Second, hook)
	if err != nil {
		t.Fatal(err)
	}
	if err := free.Release(ctx); err != nil {
		t.Fatal(err)
	}

	type outcome struct {
		tok     uint64
		release func() error
		err     error
		queued  int32 // the hook's calls when the call returned
	}
	type waiter struct {
		queued chan struct{}
		calls  atomic.Int32
		res    chan outcome
	}
	start := func(name string, call func(ticketing.AcquireOption) outcome) *waiter {
		w := &waiter{queued: make(chan struct{}, 1), res: make(chan outcome, 1)}
		opt := ticketing.WithQueued(func() {
			w.calls.Add(1)
			w.queued <- struct{}{}
		})
		go func() {
			o := call(opt)
			o.queued = w.calls.Load()
			w.res <- o
		}()
		select {
		case <-w.queued:
		case o := <-w.res:
			t.Fatalf("%s finished (%+v) without being queued", name, o)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not queued within 30s", name)
		}
		return w
	}
	lockOutcome := func(l *ticketing.Lock, err error) outcome {
		if err != nil {
			return outcome{err: err}
		}
		return outcome{tok: l.Token(), release: func() error { return l.Release(ctx) }}
	}
	b, c, d, e := dial(), dial(), dial(), dial()
	waiters := []*waiter{
		start("Acquire", func(o ticketing.AcquireOption) outcome {
			tk, err := b.Acquire(ctx, k, 30*time.Second, 30*time.Second, o)
			return outcome{tok: tk, err: err, release: func() error { return b.Release(ctx, k, tk) }}
		}),
		start("Lock", func(o ticketing.AcquireOption) outcome {
			return lockOutcome(c.Lock(ctx, k, 30*time.Second, 30*time.Second, o))
		}),
		start("AcquireBlock", func(o ticketing.AcquireOption) outcome {
			return lockOutcome(d.AcquireBlock(ctx, []string{k2, k}, 30*time.Second, 30*time.Second, o))
		}),
		start("LockBlock", func(o ticketing.AcquireOption) outcome {
			return lockOutcome(e.LockBlock(ctx, []string{k, k2}, 30*time.Second, 30*time.Second, o))
		}),
	}
	if err := a.Release(ctx, k2, tok2); err != nil { // the blocks still wait for k
		t.Fatal(err)
	}
	release := func() error { return a.Release(ctx, k, tok) }
	prev := tok
	for i, w := range waiters {
		if err := release(); err != nil {
			t.Fatalf("release before waiter %d: %v", i+1, err)
		}
		var o outcome
		select {
		case o = <-w.res:
		case <-time.After(30 * time.Second):
			t.Fatalf("waiter %d: no grant within 30s", i+1)
		}
		if o.err != nil || o.tok <= prev || o.queued != 1 {
			t.Fatalf("waiter %d: token %d (after %d), %v, hook ran %d times before it returned", i+1, o.tok, prev, o.err, o.queued)
		}
		prev, release = o.tok, o.release
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	for i, w := range waiters {
		if n := w.calls.Load(); n != 1 {
			t.Errorf("waiter %d: hook ran %d times", i+1, n)
		}
	}
	if n := never.Load(); n != 0 {
		t.Fatalf("the hook of wait 0 / a free key ran %d times", n)
	}
}
