package unixapi_test

import (
	"errors"
	"strings"
	"testing"

	"ticketing/unixapi"
)

// REVOKED (version 9): a token, who revoked (one field), and the
// operator's reason as the rest of the line (spaces inside kept, none
// at its ends; omitted with its space when empty). It parses at every
// version, like POSITION; its errors wrap ErrBadRequest and quote the
// field.
func TestParseRevokedEvent(t *testing.T) {
	why128 := "w" + strings.Repeat(" x", 63) + "z" // 128 bytes, spaces inside
	by128 := strings.Repeat("b", 128)
	for _, tc := range []struct {
		line        string
		tok         uint64
		by, why     string
		wantVersion uint16
	}{
		{"! REVOKED 7 ops@host", 7, "ops@host", "", unixapi.VersionRevoke},
		{"! REVOKED 7 ops@host stuck holder", 7, "ops@host", "stuck holder", unixapi.VersionRevoke},
		{"! REVOKED 7 ops@host a  b   c", 7, "ops@host", "a  b   c", unixapi.VersionRevoke},
		{"! REVOKED 18446744073709551615 " + by128 + " " + why128, 1<<64 - 1, by128, why128, unixapi.VersionRevoke},
		{"! REVOKED 3 x ~!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", 3, "x", "~!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", unixapi.VersionRevoke},
		{"! REVOKED 5 o -", 5, "o", "-", unixapi.VersionQueued},
		{"! REVOKED 5 o why", 5, "o", "why", unixapi.VersionLabels},
	} {
		ev, err := unixapi.ParseEventVersion([]byte(tc.line), tc.wantVersion)
		if err != nil || ev.Name != unixapi.EventRevoked || ev.Token != tc.tok || ev.By != tc.by || ev.Why != tc.why ||
			ev.Reason != "" || len(ev.Keys) != 0 {
			t.Errorf("%q: %+v %v", tc.line, ev, err)
		}
		if got := unixapi.FormatRevoked(tc.tok, tc.by, tc.why); got != tc.line {
			t.Errorf("FormatRevoked(%d, %q, %q) = %q, want %q", tc.tok, tc.by, tc.why, got, tc.line)
		}
	}
	for _, tc := range []struct{ line, quote string }{
		{"! REVOKED", "! REVOKED"},
		{"! REVOKED ", "! REVOKED "},
		{"! REVOKED 7", "! REVOKED 7"},
		{"! REVOKED 7 ", `""`},
		{"! REVOKED 0 ops", `"0"`},
		{"! REVOKED x ops", `"x"`},
		{"! REVOKED -1 ops", `"-1"`},
		{"! REVOKED 18446744073709551616 ops", "18446744073709551616"},
		{"! REVOKED  7 ops", `""`},
		{"! REVOKED 7  ops", `""`},
		{"! REVOKED 7 ops ", `""`},
		{"! REVOKED 7 ops  why", `" why"`},
		{"! REVOKED 7 ops why ", `"why "`},
		{"! REVOKED 7 op\x01s why", `op\x01s`},
		{"! REVOKED 7 ops wh\x7fy", `wh\x7fy`},
		{"! REVOKED 7 ops wh\ty", `wh\ty`},
		{"! REVOKED 7 ops why\r", `why\r`},
		{"! REVOKED 7 " + strings.Repeat("b", 129), "bbbb"},
		{"! REVOKED 7 ops " + strings.Repeat("w", 129), "wwww"},
	} {
		ev, err := unixapi.ParseEventVersion([]byte(tc.line), unixapi.VersionRevoke)
		if !errors.Is(err, unixapi.ErrBadRequest) || !strings.Contains(err.Error(), "REVOKED") || !strings.Contains(err.Error(), tc.quote) {
			t.Errorf("%q: %+v %v, want ErrBadRequest naming REVOKED and quoting %s", tc.line, ev, err, tc.quote)
		}
	}
	// Another name that merely starts with REVOKED is an unknown event.
	if ev, err := unixapi.ParseEventVersion([]byte("! REVOKEDX 7 ops"), unixapi.VersionRevoke); err != nil || ev.Name != "REVOKEDX" || ev.Token != 0 {
		t.Errorf("REVOKEDX: %+v %v", ev, err)
	}
	// LOST's reason revoked parses at every version (labelled from 5).
	if ev, err := unixapi.ParseEventVersion([]byte("! LOST 7 revoked k"), unixapi.VersionEvents); err != nil || ev.Reason != "revoked" {
		t.Errorf("LOST revoked (version 3): %+v %v", ev, err)
	}
	if ev, err := unixapi.ParseEventVersion([]byte("! LOST 7 revoked job-1 a b"), unixapi.VersionRevoke); err != nil ||
		ev.Reason != "revoked" || ev.Label != "job-1" || strings.Join(ev.Keys, " ") != "a b" {
		t.Errorf("LOST revoked (version 9): %+v %v", ev, err)
	}
}
