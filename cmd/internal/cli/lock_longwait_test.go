package cli

import (
	"context"
	"fmt"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
)

// Long waits (issue 41, part 3): `ticketing lock --wait` takes up to 3600
// s while a lease is at most 250 s, and lock promises to renew a grant that
// waited once, "so COMMAND has a whole lease from its start". A lock
// whose turn came after more than its lease less the margin must still run
// COMMAND: the holding is the grant's own (its token still holds the key,
// which an EXTEND proves through the log), and nothing was done under it
// yet. Here the wait (about 3 s) outlasts the lease (2 s), as a waiting
// room's 30-minute wait outlasts a 250 s lease.
func TestLockWaitLongerThanLeaseRunsCommand(t *testing.T) {
	sock := devSidecar(t)
	key := fmt.Sprintf("lockwait/%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := ticketing.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tok, err := c.Acquire(ctx, key, 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan [3]any, 1)
	go func() {
		code, out, errs := runLockT("--socket", sock, "--lease", "2", "--wait", "3600", key, "--", "sh", "-c", "echo ran")
		res <- [3]any{code, out, errs}
	}()
	time.Sleep(3 * time.Second) // queued behind the holder for longer than its lease
	if err := c.Release(ctx, key, tok); err != nil {
		t.Fatal(err)
	}
	var r [3]any
	select {
	case r = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("lock did not return")
	}
	if code, out, errs := r[0].(int), r[1].(string), r[2].(string); code != 0 || out != "ran\n" {
		t.Fatalf("a lock whose wait outlasted its lease: exit %d (want 0, COMMAND run), stdout %q, stderr %q", code, out, errs)
	}
}
