package ticketing

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"
)

// PERMIT on the fake sidecar: the line sent, the grant's token and slot,
// FenceKey, QUEUED reaching the permit's hook, Release by token, the new
// codes as their sentinels, a malformed grant as ErrProtocol and nothing
// kept.
func TestPermitFake(t *testing.T) {
	c, f := pipeClient(t, "HELLO 8 events")
	ctx := context.Background()
	queued := make(chan struct{}, 1)
	ch := async(func() lockRes {
		l, err := c.AcquirePermit(ctx, "room", 30*time.Second, 5*time.Second, WithLabel("job-1"), WithQueued(func() { queued <- struct{}{} }))
		return lockRes{l, err}
	})
	if r := f.req(); r != "PERMIT room 30 5.000 label=job-1" {
		t.Fatalf("request %q", r)
	}
	f.write("! QUEUED 2 room", "OK 41 3")
	res := recv(t, ch)
	if res.err != nil {
		t.Fatal(res.err)
	}
	<-queued
	l := res.l
	if !l.Permit() || l.Slot() != 3 || l.Token() != 41 || l.Key() != "room" || l.FenceKey() != "room 3" || l.Label() != "job-1" {
		t.Fatalf("permit %v %d %d %q %q", l.Permit(), l.Slot(), l.Token(), l.Key(), l.FenceKey())
	}
	// The lost event of its token reaches it, as for a lock.
	f.write("! LOST 41 expired job-1 room")
	waitLost(t, l, LostExpired)

	rel := async(func() error { return l.Release(ctx) })
	if r := f.req(); r != "RELEASE room 41" {
		t.Fatalf("request %q", r)
	}
	f.write("OK")
	if err := recv(t, rel); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		reply string
		want  error
	}{
		{"ERR not_semaphore room is not a semaphore", ErrNotSemaphore},
		{"BUSY", ErrBusy},
		{"TIMEOUT", ErrTimeout},
		{"ERR unknown_verb unixapi: unknown verb", ErrNotSupported},
		{"OK 42", ErrProtocol}, // a lock's grant: no slot
		{"OK 42 x", ErrProtocol},
	} {
		ch := async(func() lockRes {
			l, err := c.LockPermit(ctx, "room", 30*time.Second, 0)
			return lockRes{l, err}
		})
		if r := f.req(); r != "PERMIT room 30 0.000" {
			t.Fatalf("request %q", r)
		}
		f.write(tc.reply)
		if res := recv(t, ch); !errors.Is(res.err, tc.want) || res.l != nil {
			t.Fatalf("%q: %v, want %v", tc.reply, res.err, tc.want)
		}
	}

	// Acquire of a semaphore key.
	acq := async(func() error { _, err := c.Acquire(ctx, "room", 30*time.Second, 0); return err })
	f.req()
	f.write("ERR is_semaphore room is a semaphore: take a permit")
	if err := recv(t, acq); !errors.Is(err, ErrIsSemaphore) {
		t.Fatalf("Acquire: %v", err)
	}
}

// PERMITS on the fake sidecar: the line, OK, INDETERMINATE, the codes;
// n outside 0..MaxPermits is refused before sending.
func TestSetPermitsFake(t *testing.T) {
	c, f := pipeClient(t, "HELLO 8 events")
	ctx := context.Background()
	for _, n := range []int{-1, MaxPermits + 1} {
		if err := c.SetPermits(ctx, "room", n); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("SetPermits %d: %v", n, err)
		}
	}
	for _, tc := range []struct {
		n     int
		reply string
		want  error
	}{
		{3, "OK", nil},
		{0, "OK", nil},
		{4, "INDETERMINATE", ErrIndeterminate},
		{2, "ERR in_use room is held as a lock", ErrInUse},
		{0, "ERR not_semaphore room is not a semaphore", ErrNotSemaphore},
		{5, "ERR invalid_permits bad", ErrInvalidPermits},
	} {
		ch := async(func() error { return c.SetPermits(ctx, "room", tc.n) })
		if r, want := f.req(), "PERMITS room "+strconv.Itoa(tc.n); r != want {
			t.Fatalf("request %q, want %q", r, want)
		}
		f.write(tc.reply)
		if err := recv(t, ch); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
			t.Fatalf("%q: %v, want %v", tc.reply, err, tc.want)
		}
	}
}

// A version-7 sidecar does not know PERMIT or PERMITS: both are
// ErrNotSupported and nothing is sent.
func TestPermitVersion7Sidecar(t *testing.T) {
	c, f := pipeClient(t, "HELLO 7 events")
	ctx := context.Background()
	if _, err := c.AcquirePermit(ctx, "room", 30*time.Second, 0); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("AcquirePermit: %v", err)
	}
	if err := c.SetPermits(ctx, "room", 2); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("SetPermits: %v", err)
	}
	f.noReq()
}

// A waiting permit's place in line reaches its WithPosition hook, as an
// acquire's: the PERMIT is the second line written (after the HELLO).
func TestPermitPosition(t *testing.T) {
	c, f := pipeClient(t, "HELLO 8 events")
	var got []Position
	ch := async(func() lockRes {
		l, err := c.LockPermit(context.Background(), "room", 30*time.Second, 5*time.Second, WithPosition(func(p Position) { got = append(got, p) }))
		return lockRes{l, err}
	})
	if r := f.req(); r != "PERMIT room 30 5.000" {
		t.Fatalf("request %q", r)
	}
	f.write("! QUEUED 2 room", "! POSITION 2 3 - room", "! POSITION 2 1 4 room", "OK 9 1")
	res := recv(t, ch)
	if res.err != nil || res.l.Slot() != 1 {
		t.Fatalf("LockPermit: %v", res.err)
	}
	want := []Position{{Key: "room", Position: 3}, {Key: "room", Position: 1, Estimate: 4 * time.Second, EstimateKnown: true}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("positions %+v, want %+v", got, want)
	}
}

// PermitFenceKey joins the key and the slot with a space, a byte no key
// holds: the fencing domain of a slot is never the name of a lock key (the
// lock "checkout#0" and slot 0 of the semaphore "checkout" were one fence
// row under "<key>#<slot>", and each refused the other's live holder).
func TestPermitFenceKeyIsNoKey(t *testing.T) {
	if got := PermitFenceKey("checkout", 0); got != "checkout 0" {
		t.Fatalf("PermitFenceKey(checkout, 0) = %q, want %q", got, "checkout 0")
	}
	long := make([]byte, 255)
	for i := range long {
		long[i] = '#'
	}
	for _, key := range []string{"checkout", "checkout#0", "a", "#", "k-1/x:y", string(long)} {
		if err := checkKey(key); err != nil {
			t.Fatalf("test key %q: %v", key, err)
		}
		for _, slot := range []int{0, 1, 9, 10, MaxPermits - 1} {
			fk := PermitFenceKey(key, slot)
			if err := checkKey(fk); err == nil {
				t.Fatalf("PermitFenceKey(%q, %d) = %q is also a lock key", key, slot, fk)
			}
		}
	}
}
