package unixapi_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

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
	} {
		ev, err := unixapi.ParseEvent([]byte(tc.line))
		if err != nil || ev.Name != tc.want.Name || ev.Token != tc.want.Token || ev.Reason != tc.want.Reason ||
			strings.Join(ev.Keys, " ") != strings.Join(tc.want.Keys, " ") {
			t.Errorf("%q: %+v %v, want %+v", tc.line, ev, err, tc.want)
		}
	}
	for _, line := range []string{
		"", "!", "! ", "!LOST 1 expired k", "LOST 1 expired k", "! LOST", "! LOST 1 expired", "! LOST 0 expired k",
		"! LOST x expired k", "! LOST 1 Expired k", "! LOST 1 expired  k", "! LOST 1 expired k ", "! LOST 1 expired k\x01",
		"! LOST 18446744073709551616 expired k", "! LOST 1 expired " + strings.Repeat("k", 256),
		"! LOST 1 expired" + strings.Repeat(" k", 17), "OK 5", "ERR not_held nope",
	} {
		if ev, err := unixapi.ParseEvent([]byte(line)); !errors.Is(err, unixapi.ErrBadRequest) {
			t.Errorf("%q: %+v %v, want ErrBadRequest", line, ev, err)
		}
	}
	if got := unixapi.FormatLost(9, "compensated", []string{"s/2", "s/1"}); got != "! LOST 9 compensated s/2 s/1" {
		t.Errorf("FormatLost: %q", got)
	}
}

// FuzzParseEvent: any line parses or fails with ErrBadRequest, never
// panics; what FormatLost writes for a LOST that parses parses back to
// the same event; and a line that is not an event is never parsed as one.
func FuzzParseEvent(f *testing.F) {
	for _, s := range []string{"! LOST 7 expired k", "! LOST 1 moved a b", "! X", "OK 7", "! LOST 1 expired k k", ""} {
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
	})
}
