package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestBenchDisk runs the disk benchmark briefly on real bolt and wal
// stores and checks it reports both rounds of each and the bounds that
// follow from them.
func TestBenchDisk(t *testing.T) {
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"disk", "--dir", t.TempDir(), "--duration", "300ms"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, kind := range []string{"bolt", "wal"} {
		for _, want := range []string{"1 store(s) appending at once", "3 store(s) appending at once",
			"a commit is at least", "so, at best: contended hand-offs on one key ≤"} {
			if want = "disk (" + kind + "): " + want; !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q:\n%s", want, out.String())
			}
		}
	}
	if n := strings.Count(out.String(), "cycles/s (two commits per cycle)"); n != 2 {
		t.Errorf("%d cycle bounds, want one per store:\n%s", n, out.String())
	}
	code = Main(context.Background(), []string{"disk", "--dir", t.TempDir(), "--log-store", "lsm"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "want bolt, wal or both") {
		t.Errorf("--log-store lsm: exit %d, stderr %q", code, errb.String())
	}
}
