package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
)

// failingWriter fails every write, like a stdout on a full disk.
type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

// A token that cannot be written to stdout is a lock nobody can use (the
// caller needs the token to fence, and does not know it holds anything):
// acquire releases it at once, --hold or not, and exits 78.
func TestAcquireReleasesWhenTheTokenCannotBeWritten(t *testing.T) {
	sock := devSidecar(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := ticketing.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, hold := range []bool{false, true} {
		key := fmt.Sprintf("acqfull/%v/%d", hold, time.Now().UnixNano())
		args := []string{"--socket", sock, "--lease", "60", "--wait", "0", key}
		if hold {
			args = append([]string{"--hold"}, args...)
		}
		var errb syncBuffer
		done := make(chan int, 1)
		go func() { done <- runAcquire(ctx, args, failingWriter{syscall.ENOSPC}, &errb) }()
		var code int
		select {
		case code = <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("hold %v: acquire with an unwritable stdout did not return (held the lock?)", hold)
		}
		if code != ExitLockError || !strings.Contains(errb.String(), "the token could not be written") {
			t.Fatalf("hold %v: exit %d, stderr %q; want %d and the reason", hold, code, errb.String(), ExitLockError)
		}
		// Released: another connection gets the key at once.
		tok, err := c.Acquire(ctx, key, 5*time.Second, 0)
		if err != nil {
			if errors.Is(err, ticketing.ErrBusy) {
				t.Fatalf("hold %v: %s still held after acquire failed to print its token", hold, key)
			}
			t.Fatal(err)
		}
		if err := c.Release(ctx, key, tok); err != nil {
			t.Fatal(err)
		}
	}
}

// acquire --hold renews the lease as lock does: a 3-second lock is still
// held more than two leases later, and released at SIGINT (the context's
// end). (A 1-second lease left each renewal about 0.4 s, which a CI run
// under -race on busy cores did not always have: lost (deadline).)
// Before issue 42 it kept running silently past the lease's end.
func TestAcquireHoldRenewsItsLease(t *testing.T) {
	sock := devSidecar(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := ticketing.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	key := fmt.Sprintf("acqhold/%d", time.Now().UnixNano())
	hctx, stop := context.WithCancel(ctx)
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- runAcquire(hctx, []string{"--socket", sock, "--lease", "3", "--wait", "0", "--hold", key}, &out, &errb)
	}()
	for out.String() == "" {
		select {
		case code := <-done:
			t.Fatalf("acquire --hold exited %d before printing a token: %q", code, errb.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	time.Sleep(7 * time.Second)
	if _, err := c.Acquire(ctx, key, time.Second, 0); !errors.Is(err, ticketing.ErrBusy) {
		t.Fatalf("7 s into a 3 s lease held by acquire --hold: another acquire got %v, want busy (renewed); stderr %q", err, errb.String())
	}
	stop()
	if code := <-done; code != ExitOK {
		t.Fatalf("acquire --hold exited %d at SIGINT, want 0; stderr %q", code, errb.String())
	}
	tok, err := c.Acquire(ctx, key, time.Second, 0)
	if err != nil {
		t.Fatalf("after acquire --hold exited, the key: %v, want it released", err)
	}
	_ = c.Release(ctx, key, tok)
}

// acquire --hold --no-extend keeps one lease: when it ends, the command
// says the lock is lost, in its own name, and exits 80. Before issue 42 it
// ran on and exited 79 with a message of lock's.
func TestAcquireHoldNoExtendSaysTheLockIsLost(t *testing.T) {
	sock := devSidecar(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	key := fmt.Sprintf("acqlost/%d", time.Now().UnixNano())
	var out, errb syncBuffer
	start := time.Now()
	code := runAcquire(ctx, []string{"--socket", sock, "--lease", "1", "--wait", "0", "--hold", "--no-extend", key}, &out, &errb)
	if code != ExitLost || !strings.HasPrefix(errb.String(), "ticketing acquire: lock "+key) || !strings.Contains(errb.String(), "lost") {
		t.Fatalf("acquire --hold --no-extend: exit %d after %v, stderr %q; want 80 and acquire's own loss message", code, time.Since(start), errb.String())
	}
	if got := runAcquire(ctx, []string{"--socket", sock, "--no-extend", key}, &out, &errb); got != ExitLockUsage {
		t.Errorf("--no-extend without --hold: exit %d, want 64", got)
	}
}
