package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestBenchDisk runs the disk benchmark briefly on real bolt stores and
// checks it reports both rounds and the bounds that follow from them.
func TestBenchDisk(t *testing.T) {
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"disk", "--dir", t.TempDir(), "--duration", "300ms"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"disk: 1 store(s) appending at once", "disk: 3 store(s) appending at once",
		"a commit is at least", "hand-offs on one key ≤", "cycles/s (two commits per cycle)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
