package sidecar

import (
	"errors"
	"sync"
	"testing"
	"time"

	"ticketing/locksm"
)

// queuedRec records what an acquire's callbacks were told, in order.
type queuedRec struct {
	mu      sync.Mutex
	calls   []string // "queued", "done"
	queued  chan struct{}
	done    chan error
	lk      Lock
	onQueue func() // runs inside Queued, after it was recorded
}

func newQueuedRec() *queuedRec {
	return &queuedRec{queued: make(chan struct{}, 1), done: make(chan error, 1)}
}

func (r *queuedRec) opts() AcquireOptions {
	return AcquireOptions{Queued: func() {
		r.mu.Lock()
		r.calls = append(r.calls, "queued")
		r.mu.Unlock()
		if r.onQueue != nil {
			r.onQueue()
		}
		r.queued <- struct{}{}
	}}
}

func (r *queuedRec) doneFn(lk Lock, err error) {
	r.mu.Lock()
	r.calls = append(r.calls, "done")
	r.lk = lk
	r.mu.Unlock()
	r.done <- err
}

// order is the callbacks' calls so far.
func (r *queuedRec) order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// wait returns the outcome (a hang guard of 30 s).
func (r *queuedRec) wait(t *testing.T, what string) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no outcome within 30s", what)
		return nil
	}
}

// awaitQueued waits for the Queued callback (a hang guard of 30 s).
func (r *queuedRec) awaitQueued(t *testing.T, what string) {
	t.Helper()
	select {
	case <-r.queued:
	case err := <-r.done:
		select {
		case <-r.queued: // both were ready
			r.done <- err
		default:
			t.Fatalf("%s: finished (%v) without Queued", what, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: not queued within 30s", what)
	}
}

// AcquireOptions.Queued against real nodes: called once the cluster
// committed the waiter into the key's queue (the leader's state shows it
// there when Queued runs), before done and only once; never for wait 0,
// an acquire granted at once, or after done; a block's too. The waiters
// are ordered by Queued alone, and are granted in that order.
func TestBrokerQueuedCallback(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	ctx := ctxT(t, 60*time.Second)
	li := leaderOf(t, c)
	first, err := b.Acquire(ctx, "q/k", "alice", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}

	// Wait 0 on a held key, and a wait on a free key: no Queued.
	busy := newQueuedRec()
	if _, err := b.AcquireAsyncOpts([]string{"q/k"}, "bob", 30*time.Second, 0, busy.opts(), busy.doneFn); err != nil {
		t.Fatal(err)
	}
	if err := busy.wait(t, "wait 0"); !errors.Is(err, ErrBusy) {
		t.Fatalf("wait 0 on a held key: %v, want ErrBusy", err)
	}
	free := newQueuedRec()
	if _, err := b.AcquireAsyncOpts([]string{"q/free"}, "bob", 30*time.Second, 10*time.Second, free.opts(), free.doneFn); err != nil {
		t.Fatal(err)
	}
	if err := free.wait(t, "free key"); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, free.lk); err != nil {
		t.Fatal(err)
	}

	// Three waiters, each sent once the one before it was queued.
	recs := make([]*queuedRec, 3)
	for i := range recs {
		r := newQueuedRec()
		recs[i] = r
		if _, err := b.AcquireAsyncOpts([]string{"q/k"}, "w"+string(rune('1'+i)), 30*time.Second, 20*time.Second, r.opts(), r.doneFn); err != nil {
			t.Fatal(err)
		}
		r.awaitQueued(t, "waiter")
		var n int
		c.Node(li).ReadState(func(st *locksm.State) { n = st.QueueLen("q/k") })
		if n != i+1 {
			t.Fatalf("Queued of waiter %d ran with %d waiters in the leader's queue", i+1, n)
		}
	}
	prev := first
	for i, r := range recs {
		if err := b.Release(ctx, prev); err != nil {
			t.Fatal(err)
		}
		if err := r.wait(t, "waiter"); err != nil || r.lk.Token <= prev.Token {
			t.Fatalf("waiter %d: %+v %v (after token %d)", i+1, r.lk, err, prev.Token)
		}
		prev = r.lk
	}
	if err := b.Release(ctx, prev); err != nil {
		t.Fatal(err)
	}
	for _, r := range append(recs, busy, free) {
		if got := r.order(); len(got) > 0 && got[len(got)-1] != "done" || len(got) > 2 {
			t.Errorf("callbacks %v", got)
		}
	}
	for i, r := range recs {
		if got := r.order(); len(got) != 2 || got[0] != "queued" {
			t.Errorf("waiter %d: callbacks %v, want queued then done", i+1, got)
		}
	}
	for _, r := range []*queuedRec{busy, free} {
		if got := r.order(); len(got) != 1 {
			t.Errorf("callbacks %v, want done alone", got)
		}
	}

	// A block: queued into every key's queue.
	hold, err := b.Acquire(ctx, "q/b2", "alice", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	blk := newQueuedRec()
	if _, err := b.AcquireAsyncOpts([]string{"q/b1", "q/b2"}, "bob", 30*time.Second, 20*time.Second, blk.opts(), blk.doneFn); err != nil {
		t.Fatal(err)
	}
	blk.awaitQueued(t, "block")
	c.Node(li).ReadState(func(st *locksm.State) {
		if st.QueueLen("q/b1") != 1 || st.QueueLen("q/b2") != 1 {
			t.Errorf("block queued: queues %d and %d, want 1 and 1", st.QueueLen("q/b1"), st.QueueLen("q/b2"))
		}
	})
	if err := b.Release(ctx, hold); err != nil {
		t.Fatal(err)
	}
	if err := blk.wait(t, "block"); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, blk.lk); err != nil {
		t.Fatal(err)
	}
}

// done never runs while Queued runs, nor before it: a cancel from inside
// Queued decides the outcome at once, but done comes only after Queued
// returned.
func TestBrokerQueuedBeforeDone(t *testing.T) {
	c := startCluster(t)
	b := newBroker(t, c, nil)
	ctx := ctxT(t, 60*time.Second)
	first, err := b.Acquire(ctx, "q/c", "alice", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := newQueuedRec()
	cancels := make(chan func(error), 1)
	errCancelled := errors.New("cancelled inside Queued")
	var doneDuringQueued []string
	r.onQueue = func() {
		cancel := <-cancels
		cancel(errCancelled)
		doneDuringQueued = r.order()
	}
	cancel, err := b.AcquireAsyncOpts([]string{"q/c"}, "bob", 30*time.Second, 20*time.Second, r.opts(), r.doneFn)
	if err != nil {
		t.Fatal(err)
	}
	cancels <- cancel
	r.awaitQueued(t, "waiter")
	if err := r.wait(t, "waiter"); !errors.Is(err, errCancelled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if len(doneDuringQueued) != 1 {
		t.Fatalf("inside Queued after cancel, the callbacks so far were %v: done ran before Queued returned", doneDuringQueued)
	}
	if got := r.order(); len(got) != 2 || got[0] != "queued" || got[1] != "done" {
		t.Fatalf("callbacks %v", got)
	}
	if err := b.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
}
