package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"ticketing/cmd/ticketlab/internal/labtest"
)

// `ticketlab bench extend` in small, on real processes (traced lab nodes,
// a ticketing sidecar): every phase completes requests without an error,
// every expiry's `! LOST` is matched with the leader's trace, and the
// report has its tables. Figures are printed, not asserted.
func TestExtendSmoke(t *testing.T) {
	binary, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	lab, cleanupLab, err := labtest.Lab()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanupLab()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out strings.Builder
	r, err := RunExtend(ctx, ExtendOptions{Binary: binary, Lab: lab, Dir: t.TempDir(), Nodes: 3, Clients: []int{2},
		Warmup: 100 * time.Millisecond, Window: 400 * time.Millisecond, Rounds: 1, Pairs: 3, LostFor: 2500 * time.Millisecond,
		Command: "test", Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	md := r.Markdown()
	t.Log(md)
	for _, s := range r.Cost[2] {
		if len(s.Lat) == 0 {
			t.Errorf("%s: no request measured", s.Name)
		}
	}
	if len(r.Lost) == 0 || r.Unmatched != 0 || len(r.Lost) != r.Expiries {
		t.Errorf("%d lost events matched of %d expiries, %d unmatched", len(r.Lost), r.Expiries, r.Unmatched)
	}
	for _, want := range []string{"| 2 | EXTEND |", "| 2 | RELEASE+ACQUIRE |", "EXTEND ÷ RELEASE+ACQUIRE", "holder reads `! LOST`", "Target p50 ≤ 1 ms"} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q", want)
		}
	}
}
