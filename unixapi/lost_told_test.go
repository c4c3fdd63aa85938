package unixapi_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/sidecar"
	"ticketing/unixapi"
)

// Issue 39 (attack round 5): as a session ends (here: the sidecar shuts
// down), its `! LOST <token> compensated` lines were only queued for the
// writer before the locks were released; a client whose socket is backed
// up (it does not read for a while) learned of the loss after the key had
// moved on. The release now waits (bounded) for the lines to be written;
// not written in time, the locks are left to their leases (the client's
// own clock counts them).
func TestUntoldCompensatedLockIsLeftToItsLease(t *testing.T) {
	s := serve(t, func(cfg *unixapi.Config) { cfg.CloseTimeout = 500 * time.Millisecond })
	k := key(t)
	a := dial(t, s)
	expect(t, a.do("HELLO 3 events"), "HELLO 3 events")
	tok := token(t, a.do("ACQUIRE "+k+" 30 0"))

	// a stops reading and floods requests: their replies fill its socket,
	// the sidecar's writer blocks, then its reader, then a's writes.
	var sent atomic.Int64
	go func() {
		flood := []byte(strings.Repeat("HELD\n", 512))
		for {
			if err := a.c.SetWriteDeadline(time.Now().Add(20 * time.Second)); err != nil {
				return
			}
			n, err := a.c.Write(flood)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	for last := int64(-1); ; {
		time.Sleep(200 * time.Millisecond)
		n := sent.Load()
		if n == last {
			break // backed up
		}
		last = n
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		l, err := testBroker.Acquire(ctx, k, "other", 10*time.Second, 0)
		if err == nil {
			if rerr := testBroker.Release(ctx, l); rerr != nil {
				t.Log(rerr)
			}
			t.Fatalf("two holders: %s (token %d) released to another owner (token %d) while its holder, not reading, was not yet told `! LOST %d compensated`",
				k, tok, l.Token, tok)
		}
		if !errors.Is(err, sidecar.ErrBusy) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}
