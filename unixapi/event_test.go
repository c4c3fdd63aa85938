package unixapi_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"ticketing/unixapi"
)

func TestParseEvent(t *testing.T) {
	for _, tc := range []struct {
		line string
		want unixapi.Event
	}{
		{"! LOST 7 expired k", unixapi.Event{Name: "LOST", Token: 7, Reason: "expired", Keys: []string{"k"}}},
		{"! LOST 18446744073709551615 moved b a c", unixapi.Event{Name: "LOST", Token: 1<<64 - 1, Reason: "moved", Keys: []string{"b", "a", "c"}}},
		{"! LOST 3 somedaynew k", unixapi.Event{Name: "LOST", Token: 3, Reason: "somedaynew", Keys: []string{"k"}}},
		{"! LATER whatever it says", unixapi.Event{Name: "LATER"}},
		{"! QUEUED 2 k", unixapi.Event{Name: "QUEUED", N: 2, Keys: []string{"k"}}},
		{"! QUEUED 18446744073709551615 s/2 s/1", unixapi.Event{Name: "QUEUED", N: 1<<64 - 1, Keys: []string{"s/2", "s/1"}}},
		{"! POSITION 4 12 30 k", unixapi.Event{Name: "POSITION", N: 4, Position: 12, EstimateSec: 30, Keys: []string{"k"}}},
		{"! POSITION 4 1 - s/2", unixapi.Event{Name: "POSITION", N: 4, Position: 1, EstimateSec: -1, Keys: []string{"s/2"}}},
		{"! POSITION 4 1 0 k", unixapi.Event{Name: "POSITION", N: 4, Position: 1, EstimateSec: 0, Keys: []string{"k"}}},
	} {
		ev, err := unixapi.ParseEvent([]byte(tc.line))
		if err != nil || ev.Name != tc.want.Name || ev.Token != tc.want.Token || ev.Reason != tc.want.Reason || ev.N != tc.want.N ||
			ev.Position != tc.want.Position || ev.EstimateSec != tc.want.EstimateSec ||
			strings.Join(ev.Keys, " ") != strings.Join(tc.want.Keys, " ") {
			t.Errorf("%q: %+v %v, want %+v", tc.line, ev, err, tc.want)
		}
	}
	for _, line := range []string{
		"", "!", "! ", "!LOST 1 expired k", "LOST 1 expired k", "! LOST", "! LOST 1 expired", "! LOST 0 expired k",
		"! LOST x expired k", "! LOST 1 Expired k", "! LOST 1 expired  k", "! LOST 1 expired k ", "! LOST 1 expired k\x01",
		"! LOST 18446744073709551616 expired k", "! LOST 1 expired " + strings.Repeat("k", 256),
		"! LOST 1 expired" + strings.Repeat(" k", 17), "OK 5", "ERR not_held nope",
		"! QUEUED", "! QUEUED 2", "! QUEUED 0 k", "! QUEUED x k", "! QUEUED -1 k", "! QUEUED 2  k", "! QUEUED 2 k ",
		"! QUEUED 2 k\x01", "! QUEUED 18446744073709551616 k", "! QUEUED 2 " + strings.Repeat("k", 256),
		"! QUEUED 2" + strings.Repeat(" k", 17),
		"! POSITION", "! POSITION 4 1 - ", "! POSITION 4 1 -", "! POSITION 0 1 - k", "! POSITION 4 0 - k", "! POSITION 4 1 x k",
		"! POSITION 4 1 -1 k", "! POSITION 4 1 - k k", "! POSITION 4 1  - k", "! POSITION 4 1 - k\x01",
		"! POSITION 4 1 4294967296 k", "! POSITION 4 1 - " + strings.Repeat("k", 256),
	} {
		if ev, err := unixapi.ParseEvent([]byte(line)); !errors.Is(err, unixapi.ErrBadRequest) {
			t.Errorf("%q: %+v %v, want ErrBadRequest", line, ev, err)
		}
	}
	if got := unixapi.FormatLost(9, "compensated", []string{"s/2", "s/1"}); got != "! LOST 9 compensated s/2 s/1" {
		t.Errorf("FormatLost: %q", got)
	}
	if got := unixapi.FormatQueued(3, []string{"s/2", "s/1"}); got != "! QUEUED 3 s/2 s/1" {
		t.Errorf("FormatQueued: %q", got)
	}
	// Whole seconds, rounded up: 1 ms is 1 s, 2000 ms 2 s, 2001 ms 3 s.
	for _, tc := range []struct {
		est   time.Duration
		known bool
		want  string
	}{
		{0, true, "! POSITION 5 3 0 k"}, {time.Millisecond, true, "! POSITION 5 3 1 k"}, {2 * time.Second, true, "! POSITION 5 3 2 k"},
		{2001 * time.Millisecond, true, "! POSITION 5 3 3 k"}, {time.Hour, false, "! POSITION 5 3 - k"},
	} {
		if got := unixapi.FormatPosition(5, 3, tc.est, tc.known, "k"); got != tc.want {
			t.Errorf("FormatPosition(%v, %v): %q, want %q", tc.est, tc.known, got, tc.want)
		}
	}
}

// FuzzParseEvent: any line parses or fails with ErrBadRequest, never
// panics; what FormatLost writes for a LOST that parses parses back to
// the same event, and so does what FormatQueued writes for a QUEUED and
// FormatRevoked for a REVOKED; and a
// line that is not an event is never parsed as one.
func FuzzParseEvent(f *testing.F) {
	for _, s := range []string{"! LOST 7 expired k", "! LOST 1 moved a b", "! X", "OK 7", "! LOST 1 expired k k", "",
		"! QUEUED 3 k", "! QUEUED 12 a b c", "! QUEUED 0 k", "! QUEUED 007 k", "! POSITION 3 1 - k", "! POSITION 3 9 27 k",
		"! POSITION 3 9 027 k", "! REVOKED 7 ops@host", "! REVOKED 7 ops@host stuck holder", "! REVOKED 7 ops  why",
		"! REVOKED 7 ops why ", "! LOST 7 revoked k"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, err := unixapi.ParseEvent(line)
		if err != nil {
			if !errors.Is(err, unixapi.ErrBadRequest) {
				t.Fatalf("%q: error %v does not wrap ErrBadRequest", line, err)
			}
			return
		}
		if !unixapi.IsEvent(line) {
			t.Fatalf("%q parsed as an event but IsEvent says no", line)
		}
		if ev.Name == unixapi.EventLost {
			// What the sidecar would write for it parses back the same.
			out := unixapi.FormatLost(ev.Token, ev.Reason, ev.Keys)
			again, err := unixapi.ParseEvent([]byte(out))
			if err != nil || again.Token != ev.Token || again.Reason != ev.Reason || !slices.Equal(again.Keys, ev.Keys) {
				t.Fatalf("%q parsed as %+v, formats as %q, which parses as %+v %v", line, ev, out, again, err)
			}
		}
		if ev.Name == unixapi.EventPosition && ev.Position <= math.MaxUint32 {
			out := unixapi.FormatPosition(ev.N, uint32(ev.Position), time.Duration(ev.EstimateSec)*time.Second, ev.EstimateSec >= 0, ev.Keys[0])
			again, err := unixapi.ParseEvent([]byte(out))
			if err != nil || again.N != ev.N || again.Position != ev.Position || again.EstimateSec != ev.EstimateSec || !slices.Equal(again.Keys, ev.Keys) {
				t.Fatalf("%q parsed as %+v, formats as %q, which parses as %+v %v", line, ev, out, again, err)
			}
		}
		if ev.Name == unixapi.EventRevoked {
			// What the sidecar writes for it parses back the same, and
			// ends as the line does (the reason is the rest of it).
			out := unixapi.FormatRevoked(ev.Token, ev.By, ev.Why)
			again, err := unixapi.ParseEvent([]byte(out))
			if err != nil || again.Name != ev.Name || again.Token != ev.Token || again.By != ev.By || again.Why != ev.Why ||
				!strings.HasSuffix(out, " "+ev.By+strings.TrimSuffix(" "+ev.Why, " ")) ||
				!strings.HasSuffix(string(line), " "+ev.By+strings.TrimSuffix(" "+ev.Why, " ")) {
				t.Fatalf("%q parsed as %+v, formats as %q, which parses as %+v %v", line, ev, out, again, err)
			}
		}
		if ev.Name == unixapi.EventQueued {
			out := unixapi.FormatQueued(ev.N, ev.Keys)
			again, err := unixapi.ParseEvent([]byte(out))
			if err != nil || again.Name != unixapi.EventQueued || again.N != ev.N || ev.N == 0 || !slices.Equal(again.Keys, ev.Keys) {
				t.Fatalf("%q parsed as %+v, formats as %q, which parses as %+v %v", line, ev, out, again, err)
			}
		}
	})
}
