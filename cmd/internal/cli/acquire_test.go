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
