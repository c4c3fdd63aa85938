package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestBenchDisk runs the disk benchmark briefly on real stores of each
// kind and checks it reports both rounds and the bounds that follow from
// them.
func TestBenchDisk(t *testing.T) {
	for _, kind := range []string{"bolt", "wal"} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), []string{"disk", "--dir", t.TempDir(), "--duration", "200ms", "--log-store", kind}, &out, &errb)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", kind, code, errb.String())
		}
		for _, want := range []string{"disk: 1 " + kind + " store(s) appending at once", "disk: 3 " + kind + " store(s) appending at once",
			"a commit is at least", "hand-offs on one key ≤", "cycles/s (two commits per cycle)"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out.String())
			}
		}
	}
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"disk", "--log-store", "lsm"}, &out, &errb); code != 2 {
		t.Errorf("--log-store lsm: exit %d, want 2", code)
	}
}
