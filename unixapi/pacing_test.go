package unixapi_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"ticketing/unixapi"
)

// A connection that keeps asking for what the sidecar refuses on its own
// (RELEASEs of locks it does not hold, malformed lines) is read more
// slowly once its burst is spent, and every request is still answered in
// order; another connection, and its locks, are untouched meanwhile.
func TestRefusalsArePacedPerConnection(t *testing.T) {
	s := serve(t, func(c *unixapi.Config) { c.RefusalRate, c.RefusalBurst = 50, 10 })
	good := dial(t, s)
	k := key(t)
	tok := token(t, good.do("ACQUIRE "+k+" 30 0"))

	bad := dial(t, s)
	const n = 60
	lines := make([]string, 0, n+1)
	for i := range n {
		if i%2 == 0 {
			lines = append(lines, fmt.Sprintf("RELEASE %s %d", k, tok))
		} else {
			lines = append(lines, "FROB")
		}
	}
	start := time.Now()
	bad.send(append(lines, "PING")...)
	for i := range n {
		if r := bad.read(); !strings.HasPrefix(r, "ERR ") {
			t.Fatalf("request %d (%q): got %q, want ERR", i, lines[i], r)
		}
		if i == n/2 {
			// The good connection is served while the bad one is held back.
			expect(t, good.do("PING"), "PONG")
		}
	}
	expect(t, bad.read(), "PONG")
	// 60 refusals at 50 a second after a burst of 10 take at least a
	// second: the bucket holds at most 10, so whenever the reader runs
	// (a loaded machine stalls it, and the bucket refills meanwhile) the
	// refusals past the burst can go no faster than the rate. (Counting
	// the refusals that waited is not robust: a stall of 20 ms refills one,
	// and a CI run saw 36 of 60 wait.)
	if d, least := time.Since(start), time.Duration(n-10-1)*time.Second/50; d < least {
		t.Fatalf("%d refusals answered in %v, faster than a burst of 10 and 50/s allow (%v)", n, d, least)
	}
	if paced := s.Stats().PacedRefusals; paced == 0 { // a fresh server: its own count
		t.Fatalf("no refusal of %d waited for the bucket", n)
	}
	// The refusals touched nothing: the good connection still holds its
	// lock and releases it.
	expect(t, good.do("HELD"), fmt.Sprintf("HELD 1 %s:%d", k, tok))
	expect(t, good.do(fmt.Sprintf("RELEASE %s %d", k, tok)), "OK")
}

// RefusalRate < 0 turns pacing off.
func TestRefusalPacingOff(t *testing.T) {
	s := serve(t, func(c *unixapi.Config) { c.RefusalRate, c.RefusalBurst = -1, 1 })
	c := dial(t, s)
	lines := make([]string, 100)
	for i := range lines {
		lines[i] = "FROB"
	}
	c.send(lines...)
	for range lines {
		if r := c.read(); !strings.HasPrefix(r, "ERR ") {
			t.Fatalf("got %q", r)
		}
	}
	if p := s.Stats().PacedRefusals; p != 0 {
		t.Fatalf("%d refusals paced with pacing off", p)
	}
}
