package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"ticketing/cmd/internal/isolation"
	"ticketing/cmd/ticketlab/internal/labtest"
)

// `ticketlab bench isolation` in small (10 flood connections, 200 idle
// ones, 10 cycles a phase): every case runs on its own processes and the
// table has a row per case. The full sizes are cmd/ticketing's
// TestIsolationUnderHostileLocalClients.
func TestIsolationBenchSmoke(t *testing.T) {
	binary, cleanup, err := labtest.Ticketing()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out strings.Builder
	tls := true
	e := &env{stdout: &out, dir: t.TempDir(), cl: &clusterFlags{binary: &binary, nodes: 3, tls: tls}}
	o := isolation.DefaultOptions("")
	o.Cycles, o.FloodConns, o.IdleConns = 10, 10, 200
	rows, err := benchIsolation(ctx, e, isolation.Cases, o)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(isolation.Cases) {
		t.Fatalf("%d rows for %d cases", len(rows), len(isolation.Cases))
	}
	for _, r := range rows {
		if r.problems != 0 {
			t.Errorf("%s at small sizes: %d requests of the good client not as expected: %q", r.res.Case, r.problems, r.res.Problems())
		}
		if !strings.Contains(out.String(), "| "+string(r.res.Case)+" |") {
			t.Errorf("no table row for %s", r.res.Case)
		}
	}
}
