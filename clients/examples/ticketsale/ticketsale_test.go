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
// those seats meanwhile. The one that heeds the lost signal must abort its
// sale, the one that ignores it on purpose must have its write rejected by
// the fence; nothing of them applied, no block split, and the inventory
// must add up.
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
		"rejected stale writes: ", "(ignores the lost signal)", "(heeds the lost signal)",
		fmt.Sprintf("the selling token on %d of %d seat keys", cfg.Seats, cfg.Seats)} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the report lacks %q", line)
		}
	}
	if len(rep.Split) != 0 || len(rep.DoubleSold) != 0 || len(rep.Applied) != 0 || len(rep.HighWaterBad) != 0 {
		t.Errorf("split %v, double-sold %v, applied %v, high-water %v", rep.Split, rep.DoubleSold, rep.Applied, rep.HighWaterBad)
	}
	// The fencing domain is the cluster's (INFO's domain=), not the
	// cluster id, which every dev cluster shares.
	if rep.Domain == "" || rep.Domain == "-" || rep.Domain == rep.Cluster || rep.Cluster != "dev" {
		t.Errorf("fencing domain %q, cluster id %q: want INFO's domain=, not cluster=", rep.Domain, rep.Cluster)
	}
	victims, ignoring := 0, 0
	for _, p := range rep.Sellers {
		if !p.victim {
			continue
		}
		victims++
		if len(p.paused) != 1 {
			t.Errorf("%s: paused %v, want once", p.name, p.paused)
			continue
		}
		ps := p.paused[0]
		stale, aborted := slices.ContainsFunc(p.stale, ps.same), slices.ContainsFunc(p.aborted, ps.same)
		if p.ignoresLost {
			// Wrote without checking the signal: the fence rejected it.
			ignoring++
			if !stale || aborted {
				t.Errorf("%s ignores the lost signal: paused %v, stale %v, aborted %v; want the paused sale rejected by the fence", p.name, ps, p.stale, p.aborted)
			}
		} else if !aborted || stale {
			// Aborted on its lock's lost signal, before the fence would
			// have to reject the write.
			t.Errorf("%s: paused %v, aborted %v, stale %v; want the paused sale aborted by the lost signal, not left to the fence",
				p.name, ps, p.aborted, p.stale)
		}
	}
	if victims != 2 || ignoring != 1 || rep.Stale < 1 || rep.Aborted < 1 || len(rep.Takeovers) != victims {
		t.Fatalf("%d chaos victims (want 2), %d ignoring the lost signal (want 1), %d stale writes rejected, %d sales aborted by the lost signal (want both > 0), %d takeovers",
			victims, ignoring, rep.Stale, rep.Aborted, len(rep.Takeovers))
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

// TestChaosRoles: every chaos run has one victim that heeds the lost
// signal and one that ignores it, whichever sellers there are.
func TestChaosRoles(t *testing.T) {
	for _, c := range []struct {
		goN, pyN     int
		heed, ignore string
	}{
		{2, 2, "go-1", "python-1"},
		{1, 1, "go-1", "python-1"},
		{2, 0, "go-1", "go-2"},
		{0, 3, "python-1", "python-2"},
	} {
		role, err := chaosRoles(true, c.goN, c.pyN)
		if err != nil {
			t.Fatalf("%d Go, %d Python: %v", c.goN, c.pyN, err)
		}
		var heed, ignore []string
		for _, l := range []struct {
			lang string
			n    int
		}{{"go", c.goN}, {"python", c.pyN}} {
			for i := 0; i < l.n; i++ {
				name := fmt.Sprintf("%s-%d", l.lang, i+1)
				switch v, ig := role(l.lang, i); {
				case v && ig:
					ignore = append(ignore, name)
				case v:
					heed = append(heed, name)
				case ig:
					t.Errorf("%s ignores the signal but is no victim", name)
				}
			}
		}
		if !slices.Equal(heed, []string{c.heed}) || !slices.Equal(ignore, []string{c.ignore}) {
			t.Errorf("%d Go, %d Python: heed %v, ignore %v; want %s, %s", c.goN, c.pyN, heed, ignore, c.heed, c.ignore)
		}
	}
	for _, n := range [][2]int{{1, 0}, {0, 1}, {0, 0}} {
		if _, err := chaosRoles(true, n[0], n[1]); err == nil {
			t.Errorf("%d Go, %d Python sellers: chaos accepted, want an error (it needs two victims)", n[0], n[1])
		}
	}
	if role, err := chaosRoles(false, 1, 0); err != nil {
		t.Fatal(err)
	} else if v, ig := role("go", 0); v || ig {
		t.Error("without chaos go-1 is a victim")
	}
}

// TestAuditWantsBothDefences: a chaos run passes the audit only when the
// victim that heeds the lost signal aborted its paused sale and the one
// that ignores it had its write rejected by the fence; a run in which
// both aborted (no stale write rejected) fails, as does one in which
// both were left to the fence.
func TestAuditWantsBothDefences(t *testing.T) {
	ctx := context.Background()
	const dom = "test"
	pausedA := sale{Seller: "go-1", ID: "go-1#1", Token: 5, Seats: []int{1, 2}}
	pausedB := sale{Seller: "python-1", ID: "python-1#1", Token: 6, Seats: []int{3}}
	for _, c := range []struct {
		name           string
		aAbort, bAbort bool // else rejected by the fence
		problems       []string
	}{
		{"heed aborts, ignore rejected", true, false, nil},
		{"both abort", true, true, []string{"python-1 ignores the lost signal on purpose, but aborted", "no stale write rejected by the fence"}},
		{"both rejected", false, false, []string{"go-1 paused holding", "no sale aborted on the lost signal"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, err := openStore(filepath.Join(t.TempDir(), "chaos.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ev := "chaos-1"
			if err := st.setup(ctx, ev, 3); err != nil {
				t.Fatal(err)
			}
			// The runner sold the paused sellers' seats with newer tokens.
			runner := []*takeover{
				{Victim: "go-1", Paused: pausedA, Sold: &sale{Seller: "runner", ID: "runner#1", Token: 7, Seats: []int{1, 2}}},
				{Victim: "python-1", Paused: pausedB, Sold: &sale{Seller: "runner", ID: "runner#2", Token: 8, Seats: []int{3}}},
			}
			for _, tk := range runner {
				if err := st.sell(ctx, dom, ev, tk.Sold.ID, "runner", tk.Sold.Seats, tk.Sold.Token); err != nil {
					t.Fatal(err)
				}
			}
			a := &sellerProc{name: "go-1", lang: "go", victim: true, paused: []sale{pausedA}}
			b := &sellerProc{name: "python-1", lang: "python", victim: true, ignoresLost: true, paused: []sale{pausedB}}
			for _, x := range []struct {
				p     *sellerProc
				s     sale
				abort bool
			}{{a, pausedA, c.aAbort}, {b, pausedB, c.bAbort}} {
				if x.abort {
					x.p.aborted = append(x.p.aborted, x.s)
				} else {
					x.p.stale = append(x.p.stale, x.s)
				}
			}
			rep := &report{Chaos: true, Sellers: []*sellerProc{a, b}, Takeovers: runner}
			if rep.Audit, err = st.audit(ctx, dom, ev); err != nil {
				t.Fatal(err)
			}
			rep.check()
			var out strings.Builder
			rep.print(&out)
			t.Logf("report:\n%s", out.String())
			if len(c.problems) == 0 {
				if !rep.OK() {
					t.Fatalf("problems %q, want none", rep.Problems)
				}
				return
			}
			if rep.OK() || len(rep.Problems) != len(c.problems) {
				t.Fatalf("problems %q, want %d: %q", rep.Problems, len(c.problems), c.problems)
			}
			for i, want := range c.problems {
				if !strings.HasPrefix(rep.Problems[i], want) {
					t.Errorf("problem %d: %q, want it to start with %q", i, rep.Problems[i], want)
				}
			}
		})
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
