package ticketing_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
)

// Semaphores against a real sidecar and cluster: two permits of a key of
// two go to two clients in distinct slots with distinct tokens; a third
// waits (QUEUED) and gets the slot the first frees; a fourth waits until
// SetPermits raises n; Acquire of the key is ErrIsSemaphore, a permit of
// a plain key ErrNotSemaphore, SetPermits of a held lock ErrInUse, and
// SetPermits 0 removes the semaphore once idle.
func TestPermitsRealSidecar(t *testing.T) {
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
	prefix := fmt.Sprintf("go/permits/%d/", time.Now().UnixNano())
	k, plain := prefix+"room", prefix+"plain"
	admin := dial()
	if err := admin.SetPermits(ctx, k, 2); err != nil {
		t.Fatal(err)
	}
	if err := admin.SetPermits(ctx, k, 2); err != nil { // idempotent
		t.Fatal(err)
	}
	a, err := dial().AcquirePermit(ctx, k, 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := dial().LockPermit(ctx, k, 30*time.Second, 0, ticketing.WithLabel("b"))
	if err != nil {
		t.Fatal(err)
	}
	if !a.Permit() || !b.Permit() || a.Slot() == b.Slot() || a.Token() == b.Token() || a.Slot()+b.Slot() != 1 {
		t.Fatalf("grants: slot %d token %d, slot %d token %d", a.Slot(), a.Token(), b.Slot(), b.Token())
	}
	if a.FenceKey() != fmt.Sprintf("%s %d", k, a.Slot()) {
		t.Fatalf("FenceKey %q", a.FenceKey())
	}
	if _, err := dial().AcquirePermit(ctx, k, 30*time.Second, 0); !errors.Is(err, ticketing.ErrBusy) {
		t.Fatalf("third, wait 0: %v", err)
	}

	// The third waits; once it is queued, a's release hands it a's slot.
	queued := make(chan struct{}, 1)
	third := make(chan *ticketing.Lock, 1)
	go func() {
		l, err := dial().LockPermit(ctx, k, 30*time.Second, 20*time.Second, ticketing.WithQueued(func() { queued <- struct{}{} }))
		if err != nil {
			t.Error(err)
		}
		third <- l
	}()
	select {
	case <-queued:
	case <-ctx.Done():
		t.Fatal("third never queued")
	}
	freed := a.Slot()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c := <-third
	if c == nil {
		t.FailNow()
	}
	if c.Slot() != freed || c.Token() <= b.Token() {
		t.Fatalf("third: slot %d token %d, want slot %d", c.Slot(), c.Token(), freed)
	}

	// A fourth waits until the operator raises n to 3: slot 2.
	queued4 := make(chan struct{}, 1)
	fourth := make(chan *ticketing.Lock, 1)
	go func() {
		l, err := dial().AcquirePermit(ctx, k, 30*time.Second, 20*time.Second, ticketing.WithQueued(func() { queued4 <- struct{}{} }))
		if err != nil {
			t.Error(err)
		}
		fourth <- l
	}()
	<-queued4
	if err := admin.SetPermits(ctx, k, 3); err != nil {
		t.Fatal(err)
	}
	d := <-fourth
	if d == nil {
		t.FailNow()
	}
	if d.Slot() != 2 {
		t.Fatalf("fourth: slot %d, want 2", d.Slot())
	}
	// Extend works on a permit by its token.
	if err := d.Extend(ctx, 40*time.Second); err != nil {
		t.Fatal(err)
	}

	// Mismatches.
	if _, err := admin.Acquire(ctx, k, 30*time.Second, 0); !errors.Is(err, ticketing.ErrIsSemaphore) {
		t.Fatalf("Acquire of a semaphore: %v", err)
	}
	if _, err := admin.AcquirePermit(ctx, plain, 30*time.Second, 0); !errors.Is(err, ticketing.ErrNotSemaphore) {
		t.Fatalf("permit of a plain key: %v", err)
	}
	if err := admin.SetPermits(ctx, plain, 0); !errors.Is(err, ticketing.ErrNotSemaphore) {
		t.Fatalf("SetPermits 0 of a plain key: %v", err)
	}
	if _, err := admin.Acquire(ctx, plain, 30*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	if err := admin.SetPermits(ctx, plain, 2); !errors.Is(err, ticketing.ErrInUse) {
		t.Fatalf("SetPermits of a held lock: %v", err)
	}
	if err := admin.SetPermits(ctx, k, 0); !errors.Is(err, ticketing.ErrInUse) {
		t.Fatalf("SetPermits 0 while in use: %v", err)
	}
	for _, l := range []*ticketing.Lock{b, c, d} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.SetPermits(ctx, k, 0); err != nil {
		t.Fatalf("SetPermits 0 when idle: %v", err)
	}
	if _, err := admin.AcquirePermit(ctx, k, 30*time.Second, 0); !errors.Is(err, ticketing.ErrNotSemaphore) {
		t.Fatalf("permit after removal: %v", err)
	}
}
