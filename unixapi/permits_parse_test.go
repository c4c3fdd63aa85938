package unixapi

import (
	"strings"
	"testing"
)

// PERMIT and PERMITS lines that the parser refuses, with their codes.
func TestPermitsParse(t *testing.T) {
	for line, want := range map[string]string{
		"PERMITS k 100001":            "invalid_permits",
		"PERMITS k -1":                "invalid_permits",
		"PERMITS k":                   "bad_request",
		"PERMITS k 1 2":               "bad_request",
		"PERMIT k1 k2 30 0":           "bad_request",
		"PERMIT k 30":                 "bad_request",
		"PERMIT k 0 0":                "invalid_lease",
		"PERMIT k 30 3601":            "invalid_wait",
		"PERMIT k 30 0 label=a\x01b":  "invalid_label",
		"PERMIT k 30 0 label=-":       "invalid_label",
		"PERMIT k 30 0 label=x extra": "bad_request",
	} {
		_, err := ParseLineVersion([]byte(line), ProtocolVersion)
		if err == nil || !strings.Contains(replyFor(err), " "+want+" ") {
			t.Errorf("%q: %v (reply %q), want %s", line, err, replyFor(err), want)
		}
	}
	r, err := ParseLineVersion([]byte("PERMIT k 30 3600 label=job"), VersionLongWaits)
	if err != nil || r.Verb != VerbPermit || r.Key != "k" || r.Label != "job" || r.Keys != nil {
		t.Fatalf("PERMIT: %+v %v", r, err)
	}
	r, err = ParseLineVersion([]byte("PERMITS k 100000"), 1)
	if err != nil || r.Verb != VerbPermits || r.Key != "k" || r.Permits != 100000 {
		t.Fatalf("PERMITS: %+v %v", r, err)
	}
}
