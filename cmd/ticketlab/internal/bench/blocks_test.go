package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ticketing/cmd/ticketlab/internal/labtest"
)

// `ticketlab bench blocks` in small (4 sellers on 40 seats, half-second
// windows), on real processes: every workload completes cycles without an
// error, the commit counts are read, and results.md and results.json are
// written. Figures are printed, not asserted.
func TestBlocksSmoke(t *testing.T) {
	binary, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out strings.Builder
	r, err := RunBlocks(ctx, BlocksOptions{Binary: binary, Dir: t.TempDir(), Nodes: 3, TLS: true,
		Sellers: 4, Seats: 40, Block: 4, ZipfS: 1.1, Warmup: 200 * time.Millisecond, Duration: 500 * time.Millisecond,
		Rounds: 1, Wait: 10 * time.Second, Command: "test", Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if len(r.Results) != 3 {
		t.Fatalf("%d results", len(r.Results))
	}
	for _, x := range r.Results {
		if x.Cycles == 0 || x.Errors != 0 || x.Commits <= 0 {
			t.Errorf("%s: %d cycles, %d commits, %d errors (%s)", x.Workload, x.Cycles, x.Commits, x.Errors, x.FirstError)
		}
	}
	dir := t.TempDir()
	if err := r.Write(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| atomic |", "| sequential |", "| single |", "| atomic ÷ sequential cycles/s |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "results.json")); err != nil {
		t.Error(err)
	}
}
