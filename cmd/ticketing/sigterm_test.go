package main

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"ticketing/sidecar"
)

// SIGTERM on the leader process: it hands leadership over before it exits
// (its log says to whom), the locks it granted stay held with their
// tokens, and the broker keeps granting through the new leader with
// larger tokens. (How fast is measured by `ticketlab bench failover
// --signal term`, not asserted: median 33 ms here.)
func TestLeaderSIGTERMHandsLeadershipOver(t *testing.T) {
	p, b, ctx := procsAndBroker(t, "info")
	acquire := func(key string) sidecar.Lock {
		t.Helper()
		for {
			lk, err := b.Acquire(ctx, key, "o", 60*time.Second, 0)
			if errors.Is(err, sidecar.ErrMoved) || errors.Is(err, sidecar.ErrUnavailable) {
				continue // definite: not executed
			}
			if err != nil {
				t.Fatalf("acquire %s: %v", key, err)
			}
			return lk
		}
	}
	held := acquire("before")
	li, err := p.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.Signal(li, syscall.SIGTERM); err != nil { // returns once it exited
		t.Fatal(err)
	}
	log, err := os.ReadFile(p.LogFile(li))
	if err != nil {
		t.Fatal(err)
	}
	line := ""
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "leadership handed over before shutdown") {
			line = l
		}
	}
	if line == "" || strings.Contains(line, `to=""`) {
		t.Fatalf("the leader did not hand its leadership over before exiting; its log:\n%s", log)
	}
	next := acquire("after")
	t.Logf("SIGTERM of leader %s: %s; next grant %v after the signal", p.ID(li), line[strings.Index(line, "msg="):], time.Since(start).Round(time.Millisecond))
	if next.Token <= held.Token {
		t.Fatalf("token %d after %d", next.Token, held.Token)
	}
	if err := b.Release(ctx, held); err != nil {
		t.Fatalf("the lock granted before the hand-over: %v", err)
	}
}
