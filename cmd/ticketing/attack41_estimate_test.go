package main

import (
	"strings"
	"testing"
	"time"
)

// Finding (low, places in line): the estimate is the place times the mean
// interval between hand-offs, and the hand-offs of one command (a PERMITS
// raise granting several waiters, likewise a block's release) all carry
// the same stamp: two of them make the key's mean 0 ms
// (cluster/leader/positions.go handoff: iv = stamp - last = 0, and n
// reaches 2), so every waiter behind is told an estimate of 0 s ("you are
// admitted now") while n permits are held for 250 s leases; the mean then
// only recovers by 1/8 of each later interval. "-" (unknown) is what the
// leader can honestly say here.
func TestAttack41EstimateIsZeroAfterARaise(t *testing.T) {
	_, sock := a41Procs(t, "--position-interval", "100ms")
	op := a41Dial(t, sock)
	if r := a41SetPermits(t, op, "s", 1); r != "OK" {
		t.Fatal(r)
	}
	op.send("PERMIT s 250 0")
	if r := op.reply(30 * time.Second); !strings.HasPrefix(r, "OK ") {
		t.Fatal(r)
	}
	var ws []*a41Line
	for range 6 {
		w := a41Dial(t, sock)
		w.send("HELLO 7 events")
		w.read(10 * time.Second)
		w.send("PERMIT s 250 600")
		if r := w.read(10 * time.Second); !strings.HasPrefix(r, "! QUEUED") {
			t.Fatal(r)
		}
		ws = append(ws, w)
	}
	time.Sleep(500 * time.Millisecond)
	// Raise to 3: w1 and w2 get the two free permits in one command; 3
	// permits are now held for 250 s each, w3..w6 wait at places 1..4.
	if r := a41SetPermits(t, op, "s", 3); r != "OK" {
		t.Fatal(r)
	}
	time.Sleep(time.Second)
	var zero []string
	for i, w := range ws {
		for {
			l := w.read(200 * time.Millisecond)
			if l == "" {
				break
			}
			if f := strings.Fields(l); len(f) == 6 && f[1] == "POSITION" && f[4] == "0" {
				zero = append(zero, l)
				t.Logf("w%d: %s", i+1, l)
			}
		}
	}
	if len(zero) > 0 {
		t.Fatalf("%d waiters told an estimated wait of 0 s behind 3 permits held for 250 s (two simultaneous hand-offs made the mean interval 0)", len(zero))
	}
}

// Held (regression): every mismatch and hostile PERMIT/PERMITS line on the
// real sidecar gets a clear, definite error and touches nobody's holding:
// the lock, the semaphore's n, its holder and its waiter are as before.
func TestAttack41MismatchesAreClearErrors(t *testing.T) {
	_, sock := a41Procs(t)
	op := a41Dial(t, sock)
	if r := a41SetPermits(t, op, "s", 1); r != "OK" {
		t.Fatal(r)
	}
	op.send("PERMIT s 250 0")
	pr := op.reply(30 * time.Second)
	if !strings.HasPrefix(pr, "OK ") {
		t.Fatal(pr)
	}
	op.send("ACQUIRE l 250 0")
	lr := op.reply(30 * time.Second)
	if !strings.HasPrefix(lr, "OK ") {
		t.Fatal(lr)
	}
	w := a41StartWaiter(t, sock, "w", "PERMIT s 250 600", "s")
	cases := []struct{ req, want string }{
		{"ACQUIRE s 10 0", "ERR is_semaphore"},
		{"ACQUIRE s 10 5", "ERR is_semaphore"},
		{"ACQUIRE free s 10 5", "ERR is_semaphore"},
		{"PERMIT l 10 0", "ERR not_semaphore"},
		{"PERMIT nosuch 10 5", "ERR not_semaphore"},
		{"PERMITS l 3", "ERR in_use"},
		{"PERMITS s 0", "ERR in_use"},
		{"PERMITS nosuch 0", "ERR not_semaphore"},
		{"PERMITS s 100001", "ERR invalid_permits"},
		{"PERMITS s -1", "ERR invalid_permits"},
		{"PERMITS s 4294967297", "ERR invalid_permits"},
		{"PERMIT s 0 0", "ERR invalid_lease"},
		{"RELEASE s 1", "ERR token_mismatch"},
		{"RELEASE s " + strings.Fields(pr)[1] + "0", "ERR token_mismatch"},
	}
	for _, c := range cases {
		op.send(c.req)
		if r := op.reply(30 * time.Second); !strings.HasPrefix(r, c.want) {
			t.Errorf("%q: %q, want %s", c.req, r, c.want)
		}
	}
	// Nothing moved: the waiter still waits, the lock and the permit are
	// still held (their releases succeed), then the waiter is granted.
	if _, _, reply, errs := w.state(); reply != "" || len(errs) > 0 {
		t.Fatalf("waiter: %q %v", reply, errs)
	}
	w.expect(0)
	for _, rel := range []string{"RELEASE l " + strings.Fields(lr)[1], "RELEASE s " + strings.Fields(pr)[1]} {
		op.send(rel)
		if r := op.reply(30 * time.Second); r != "OK" {
			t.Fatalf("%s: %q", rel, r)
		}
	}
	if _, slot := a41Granted(t, w); slot != 0 {
		t.Fatalf("waiter granted slot %d", slot)
	}
}
