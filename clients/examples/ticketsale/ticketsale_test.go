package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary be a Go seller too: the runner starts
// os.Executable() with "seller" as its first argument.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "seller" {
		os.Exit(sellerMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// ticketingBin returns $TICKETING_BIN or builds the binary once for the test.
func ticketingBin(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("TICKETING_BIN"); b != "" {
		return b
	}
	bin := filepath.Join(t.TempDir(), "ticketing")
	out, err := exec.Command("go", "build", "-o", bin, "ticketing/cmd/ticketing").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ticketing/cmd/ticketing: %v\n%s", err, out)
	}
	return bin
}

// chaosRun is the example's short chaos run: 2 Go and 2 Python sellers sell
// 40 seats in blocks of 1-4 adjacent seats; one of each is stopped
// (SIGSTOP) holding its block past its 2-second lease, and the runner sells
// those seats meanwhile. Both stale writes must be rejected by the fence,
// nothing of them applied, no block split, and the inventory must add up.
func chaosRun(t *testing.T, db string, python int, pythonBin string) {
	if _, err := exec.LookPath(pythonBin); err != nil && python > 0 {
		t.Fatal("python3 is needed for the Python sellers of the ticket-sale example")
	}
	cfg := defaultConfig()
	cfg.DB, cfg.Seats, cfg.LeaseSec, cfg.PySellers, cfg.Verbose = db, 40, 2, python, testing.Verbose()
	cfg.TicketingBin, cfg.Python = ticketingBin(t), pythonBin
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := run(ctx, cfg, &logWriter{t: t})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	var out strings.Builder
	rep.print(&out)
	t.Logf("report:\n%s", out.String())
	if !rep.OK() {
		t.Fatalf("the audit failed:\n%s", out.String())
	}
	for _, line := range []string{"blocks split: 0;", "double-sold seats: 0;", "SOLD lines not matching the DB: 0;",
		"inventory adds up:     yes", "audit:                 passed", "aborted by the lost signal before the write: ",
		fmt.Sprintf("the selling token on %d of %d seat keys", cfg.Seats, cfg.Seats)} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the report lacks %q", line)
		}
	}
	if len(rep.Split) != 0 || len(rep.DoubleSold) != 0 || len(rep.Applied) != 0 || len(rep.HighWaterBad) != 0 {
		t.Errorf("split %v, double-sold %v, applied %v, high-water %v", rep.Split, rep.DoubleSold, rep.Applied, rep.HighWaterBad)
	}
	victims := 0
	for _, p := range rep.Sellers {
		if p.victim {
			victims++
			if len(p.paused) != 1 || len(p.stale)+len(p.aborted) == 0 {
				t.Errorf("%s: paused %v, stale %v, aborted %v", p.name, p.paused, p.stale, p.aborted)
			}
			// The Go seller aborts on its lock's lost signal, before the
			// fence would have to reject the write.
			if p.lang == "go" && (len(p.paused) != 1 || !slices.ContainsFunc(p.aborted, func(s sale) bool { return s.ID == p.paused[0].ID }) ||
				slices.ContainsFunc(p.stale, func(s sale) bool { return s.ID == p.paused[0].ID })) {
				t.Errorf("%s: paused %v, aborted %v, stale %v; want the paused sale aborted by the lost signal, not left to the fence",
					p.name, p.paused, p.aborted, p.stale)
			}
		}
	}
	if want := 1 + min(python, 1); victims != want || rep.Stale+rep.Aborted < victims || rep.Aborted < 1 || len(rep.Takeovers) != victims {
		t.Fatalf("%d chaos victims (want %d), %d stale writes rejected, %d sales aborted by the lost signal, %d takeovers",
			victims, want, rep.Stale, rep.Aborted, len(rep.Takeovers))
	}
	if rep.SeatsSold != cfg.Seats || len(rep.Sales) == 0 {
		t.Fatalf("sold %d of %d seats in %d sales", rep.SeatsSold, cfg.Seats, len(rep.Sales))
	}
	// Blocks, not single seats: with k uniform in 1..4, 40 seats go in
	// about 16 sales; some of them must be multi-seat blocks.
	multi, seats := 0, 0
	for k := 1; k <= maxBlock; k++ {
		seats += k * rep.Sizes[k]
		if k > 1 {
			multi += rep.Sizes[k]
		}
	}
	if multi == 0 || seats != cfg.Seats {
		t.Fatalf("block sizes %v: %d multi-seat blocks, %d seats", rep.Sizes, multi, seats)
	}
}

func TestChaosSQLite(t *testing.T) {
	chaosRun(t, filepath.Join(t.TempDir(), "sale.db"), 2, "python3")
}

// TestChaosPostgres needs a PostgreSQL server: `make test` starts one with
// .ci/postgres.sh and sets TICKETING_TEST_PG_DSN. The Python sellers take
// part when python3 or the system Python (/usr/bin/python3, where Debian's
// python3-psycopg installs) can import psycopg or psycopg2.
func TestChaosPostgres(t *testing.T) {
	dsn := os.Getenv("TICKETING_TEST_PG_DSN")
	if dsn == "" {
		t.Skip("TICKETING_TEST_PG_DSN is not set: no PostgreSQL server for this test (`make test` starts one with .ci/postgres.sh)")
	}
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import importlib.util as u, sys; sys.exit(not (u.find_spec('psycopg') or u.find_spec('psycopg2')))").Run() == nil {
			chaosRun(t, dsn, 2, py)
			return
		}
	}
	t.Log("no Python with psycopg/psycopg2: Go sellers only against PostgreSQL")
	chaosRun(t, dsn, 0, "python3")
}

// TestAuditCatchesSplitBlocks runs the audit on a database with a whole
// block, a split one (seats not adjacent), one whose seats carry two
// tokens, and one that lost a seat against what its seller reported: each
// bad one must count as a split block and fail the report.
func TestAuditCatchesSplitBlocks(t *testing.T) {
	ctx := context.Background()
	st, err := openStore(filepath.Join(t.TempDir(), "split.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const ev, dom = "split-1", "test"
	if err := st.setup(ctx, ev, 12); err != nil {
		t.Fatal(err)
	}
	sales := []sale{
		{ID: "a#1", Token: 10, Seats: []int{1, 2, 3}}, // whole
		{ID: "b#1", Token: 11, Seats: []int{5, 7}},    // not adjacent
		{ID: "c#1", Token: 12, Seats: []int{9, 10}},   // two tokens, below
		{ID: "d#1", Token: 13, Seats: []int{11, 12}},  // seat 12 lost, below
	}
	for _, s := range sales {
		if err := st.sell(ctx, dom, ev, s.ID, "test", s.Seats, s.Token); err != nil {
			t.Fatalf("sell %v: %v", s, err)
		}
	}
	for _, q := range []string{
		`UPDATE ticketsale_ledger SET token = ? WHERE event = 'split-1' AND seat = 10`,
		`DELETE FROM ticketsale_ledger WHERE event = 'split-1' AND seat = 12 AND token <> ?`,
	} {
		if _, err := st.ExecContext(ctx, q, int64(-1)); err != nil {
			t.Fatal(err)
		}
	}
	rep := &report{Sellers: []*sellerProc{{name: "test", sold: sales}}}
	if rep.Audit, err = st.audit(ctx, dom, ev); err != nil {
		t.Fatal(err)
	}
	rep.check()
	var out strings.Builder
	rep.print(&out)
	t.Logf("report:\n%s", out.String())
	if rep.OK() || len(rep.Split) != 3 || !strings.Contains(out.String(), "blocks split: 3;") {
		t.Fatalf("split blocks %q, problems %q", rep.Split, rep.Problems)
	}
	for i, id := range []string{"b#1", "c#1", "d#1"} {
		if !strings.HasPrefix(rep.Split[i], id+":") {
			t.Errorf("split[%d] = %q, want %s", i, rep.Split[i], id)
		}
	}
	if rep.Sizes[2] != 3 || rep.Sizes[3] != 1 {
		t.Errorf("block sizes %v", rep.Sizes)
	}
}

// logWriter sends the runner's progress to t.Log, line by line (t.Log is
// safe for concurrent use).
type logWriter struct{ t *testing.T }

func (w *logWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(l)
	}
	return len(p), nil
}
