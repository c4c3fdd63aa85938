package ticketing

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A version-9 sidecar tells who revoked a lock and why in a "! REVOKED"
// line right before the lock's "! LOST <token> revoked" line: the Lock is
// lost with LostRevoked, Revoked and the LostError name who and why, and
// the reason (the rest of the line) keeps its spaces.
func TestLockRevoked(t *testing.T) {
	c, f := pipeClient(t, "HELLO 9 events")
	l := takeLock(t, c, f, "k", 30*time.Second, nil, "OK 5")
	other := takeLock(t, c, f, "j", 30*time.Second, nil, "OK 6")
	if _, _, ok := l.Revoked(); ok {
		t.Fatal("Revoked before any loss")
	}
	f.write("! REVOKED 5 ops@host stuck  holder, see INC-7", "! LOST 5 revoked - k")
	waitLost(t, l, LostRevoked)
	if by, why, ok := l.Revoked(); !ok || by != "ops@host" || why != "stuck  holder, see INC-7" {
		t.Fatalf("Revoked: %q %q %v", by, why, ok)
	}
	var le *LostError
	cause := context.Cause(l.Context())
	if !errors.As(cause, &le) || !errors.Is(cause, ErrLockLost) || le.Reason != LostRevoked || le.By != "ops@host" ||
		le.Why != "stuck  holder, see INC-7" || le.Token != 5 {
		t.Fatalf("cause %#v", cause)
	}
	if got, want := cause.Error(), "ticketing: lock lost (revoked by ops@host: stuck  holder, see INC-7): k, token 5"; got != want {
		t.Fatalf("error %q, want %q", got, want)
	}
	if isLost(other) {
		t.Fatal("the other lock is lost too")
	}
	// No reason: the line ends after who.
	f.write("! REVOKED 6 admin", "! LOST 6 revoked - j")
	waitLost(t, other, LostRevoked)
	if by, why, ok := other.Revoked(); !ok || by != "admin" || why != "" {
		t.Fatalf("Revoked: %q %q %v", by, why, ok)
	}
	if got := context.Cause(other.Context()).Error(); got != "ticketing: lock lost (revoked by admin): j, token 6" {
		t.Fatalf("error %q", got)
	}
}

// An older sidecar (or a connection that agreed version 8 or less) sends
// only "! LOST <token> revoked": the Lock is lost with LostRevoked, who and
// why unknown. A REVOKED line of another token, or a malformed one, lends
// nothing to the LOST that follows, and a REVOKED line without its LOST
// loses nothing.
func TestLockRevokedWithoutWho(t *testing.T) {
	c, f := pipeClient(t, "HELLO 5 events")
	a := takeLock(t, c, f, "a", 30*time.Second, nil, "OK 5")
	b := takeLock(t, c, f, "b", 30*time.Second, nil, "OK 6")
	d := takeLock(t, c, f, "d", 30*time.Second, nil, "OK 7")
	f.write("! LOST 5 revoked - a")
	waitLost(t, a, LostRevoked)
	if by, why, ok := a.Revoked(); !ok || by != "" || why != "" {
		t.Fatalf("Revoked: %q %q %v", by, why, ok)
	}
	if got := context.Cause(a.Context()).Error(); got != "ticketing: lock lost (revoked): a, token 5" {
		t.Fatalf("error %q", got)
	}
	f.write("! REVOKED 99 ops other", "! LOST 6 revoked - b")
	waitLost(t, b, LostRevoked)
	if by, _, _ := b.Revoked(); by != "" {
		t.Fatalf("b revoked by %q", by)
	}
	f.write("! REVOKED 7 ops  two spaces first", "! REVOKED 7 ops trailing ", "! REVOKED 7 op\x01s x")
	// A PING round trip: every line before its reply was read.
	ping := async(func() error { return c.Ping(context.Background()) })
	if r := f.req(); r != "PING" {
		t.Fatalf("request %q", r)
	}
	f.write("PONG")
	if err := recv(t, ping); err != nil {
		t.Fatal(err)
	}
	if isLost(d) {
		t.Fatalf("REVOKED alone lost the lock (%s)", d.LostReason())
	}
	f.write("! LOST 7 revoked - d")
	waitLost(t, d, LostRevoked)
	if by, why, _ := d.Revoked(); by != "" || why != "" {
		t.Fatalf("malformed REVOKED lines named %q %q", by, why)
	}
}

// A lock already lost to its local deadline takes the sidecar's revoke
// as the more definite news (LostReason, Revoked), while its Context's
// cause stays the first reason.
func TestRevokedAfterDeadline(t *testing.T) {
	c, f := pipeClient(t, "HELLO 9 events")
	l := takeLock(t, c, f, "k", 30*time.Second, nil, "OK 5")
	l.fire(LostDeadline, false)
	f.write("! REVOKED 5 ops late", "! LOST 5 revoked - k")
	waitLost(t, l, LostRevoked)
	if by, why, ok := l.Revoked(); !ok || by != "ops" || why != "late" {
		t.Fatalf("Revoked: %q %q %v", by, why, ok)
	}
	var le *LostError
	if !errors.As(context.Cause(l.Context()), &le) || le.Reason != LostDeadline || le.By != "" {
		t.Fatalf("cause %v", context.Cause(l.Context()))
	}
}

func TestParseRevoked(t *testing.T) {
	for _, tc := range []struct {
		line    string
		tok     uint64
		by, why string
	}{
		{"! REVOKED 7 ops", 7, "ops", ""},
		{"! REVOKED 7 ops a  b", 7, "ops", "a  b"},
		{"! REVOKED 18446744073709551615 " + strings.Repeat("b", 128) + " " + strings.Repeat("w", 128), 1<<64 - 1,
			strings.Repeat("b", 128), strings.Repeat("w", 128)},
	} {
		if tok, by, why, ok := parseRevoked(tc.line); !ok || tok != tc.tok || by != tc.by || why != tc.why {
			t.Errorf("%q: %d %q %q %v", tc.line, tok, by, why, ok)
		}
	}
	for _, line := range []string{
		"! REVOKED", "! REVOKED 7", "! REVOKED 7 ", "! REVOKED 0 ops", "! REVOKED x ops", "! REVOKED  7 ops", "! REVOKED 7  ops",
		"! REVOKED 7 ops ", "! REVOKED 7 ops  x", "! REVOKED 7 ops x ", "! REVOKED 7 ops x\x7f", "! REVOKEDX 7 ops",
		"! REVOKED 7 " + strings.Repeat("b", 129), "! REVOKED 7 ops " + strings.Repeat("w", 129), "! LOST 7 revoked k",
	} {
		if tok, by, why, ok := parseRevoked(line); ok {
			t.Errorf("%q accepted: %d %q %q", line, tok, by, why)
		}
	}
}
