package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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

// shortSale is the example's short form: 400 buyers in one line for 20
// permits, 300 tickets, the leader SIGKILLed after 200 admissions, one
// buyer stalled past its lease. The audit must pass: every buyer
// admitted, in arrival order; no position went up; 300 tickets sold, no
// more; the stalled buyer's write refused by the fence.
func shortSale(t *testing.T, db string) {
	cfg := defaultConfig()
	cfg.DB, cfg.Buyers, cfg.Permits, cfg.Tickets, cfg.Checkout = db, 400, 20, 300, 200*time.Millisecond
	cfg.TicketingBin, cfg.Verbose = ticketingBin(t), testing.Verbose()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := run(ctx, cfg, &logWriter{t: t})
	if rep != nil {
		var out strings.Builder
		rep.print(&out)
		t.Logf("report:\n%s", out.String())
	}
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if !rep.OK() {
		t.Fatalf("the audit failed: %q", rep.Problems)
	}
	if rep.Admitted != cfg.Buyers || rep.Inversions != 0 || len(rep.NotAdmitted) != 0 {
		t.Errorf("admitted %d of %d, %d inversions, not admitted %v", rep.Admitted, cfg.Buyers, rep.Inversions, rep.NotAdmitted)
	}
	// Positions were told, and with estimates: the line moved for seconds.
	if rep.WentUp != 0 || rep.Told == 0 || rep.WithEstimate == 0 {
		t.Errorf("positions: %d buyers told, %d went up, %d events with an estimate", rep.Told, rep.WentUp, rep.WithEstimate)
	}
	if k := rep.Kill; k == nil || k.Node == "" || k.Pause <= 0 || k.Resumed <= 0 || !k.Restarted || k.Admitted < cfg.Buyers/2 || k.Admitted >= cfg.Buyers {
		t.Errorf("leader kill: %+v; want it mid-sale, sales going on after it, the node restarted", k)
	}
	if s := rep.Stalled; s == nil || s.Outcome != "stale" {
		t.Errorf("stalled buyer: %+v; want its write rejected by the fence", s)
	}
	if rep.LedgerSold != cfg.Tickets || rep.Audit.Remaining != 0 || rep.SoldOut != cfg.Buyers-1-cfg.Tickets {
		t.Errorf("sold %d (remaining %d), sold out %d", rep.LedgerSold, rep.Audit.Remaining, rep.SoldOut)
	}
	if rep.Slots != cfg.Permits || rep.SlotsOK != rep.Slots {
		t.Errorf("fence high-water right on %d of %d slots, want %d", rep.SlotsOK, rep.Slots, cfg.Permits)
	}
}

func TestShortSaleSQLite(t *testing.T) {
	shortSale(t, filepath.Join(t.TempDir(), "waitingroom.db"))
}

// TestShortSalePostgres needs a PostgreSQL server: `make test` starts one
// with .ci/postgres.sh and sets TICKETING_TEST_PG_DSN.
func TestShortSalePostgres(t *testing.T) {
	dsn := os.Getenv("TICKETING_TEST_PG_DSN")
	if dsn == "" {
		t.Skip("TICKETING_TEST_PG_DSN is not set: no PostgreSQL server for this test (`make test` starts one with .ci/postgres.sh)")
	}
	shortSale(t, dsn)
}

// TestAuditCatches: the checks fail a run whose admissions are out of
// arrival order, whose position went up, that oversold, whose counter
// does not add up, or where a stale token wrote a slot after a newer one.
func TestAuditCatches(t *testing.T) {
	at := time.Unix(1000, 0)
	good := func() *report {
		bs := []*buyer{
			{N: 1, Admitted: at, Token: 10, Slot: 0, Outcome: "bought"},
			{N: 2, Admitted: at.Add(time.Second), Token: 11, Slot: 1, Outcome: "bought",
				Events: []posEvent{{At: at, Position: 1, Estimate: time.Second, Known: true}}},
			{N: 3, Admitted: at.Add(2 * time.Second), Token: 12, Slot: 0, Outcome: "sold out",
				Events: []posEvent{{At: at, Position: 2}, {At: at.Add(time.Second), Position: 1}}},
		}
		return &report{Buyers: bs, Audit: audit{Capacity: 2, Remaining: 0,
			Rows: []checkoutRow{
				{Seq: 1, Buyer: 1, Slot: 0, Token: 10, Tickets: 1, Outcome: "sold"},
				{Seq: 2, Buyer: 2, Slot: 1, Token: 11, Tickets: 1, Outcome: "sold"},
				{Seq: 3, Buyer: 3, Slot: 0, Token: 12, Outcome: "soldout"},
			},
			HighWater: map[int]uint64{0: 12, 1: 11}}}
	}
	r := good()
	r.check()
	if !r.OK() || r.WithEstimate != 1 || r.ErrAbs[0] != 0 {
		t.Fatalf("a good run: problems %q, estimates %d %v", r.Problems, r.WithEstimate, r.ErrAbs)
	}
	for _, c := range []struct {
		name, want string
		spoil      func(r *report)
	}{
		{"out of order", "FIFO: 1 of 3 pairs", func(r *report) {
			r.Buyers[0].Token, r.Buyers[1].Token = 11, 10
			r.Audit.Rows[0].Token, r.Audit.Rows[1].Token = 11, 10
			r.Audit.HighWater[1] = 10
		}},
		{"position up", "buyer 3: its position went up", func(r *report) { r.Buyers[2].Events[1].Position = 3 }},
		{"oversold", "oversold", func(r *report) {
			r.Buyers[2].Outcome = "bought"
			r.Audit.Rows[2].Outcome, r.Audit.Rows[2].Tickets, r.Audit.Remaining = "sold", 1, -1
		}},
		{"counter", "inventory: remaining 1", func(r *report) { r.Audit.Remaining = 1 }},
		{"stale write applied", "slot 0: token 10 written after token 12", func(r *report) {
			r.Audit.Rows[0].Seq, r.Audit.Rows[2].Seq = 3, 1
			r.Audit.Rows[0], r.Audit.Rows[2] = r.Audit.Rows[2], r.Audit.Rows[0]
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := good()
			c.spoil(r)
			r.check()
			if r.OK() || !strings.Contains(strings.Join(r.Problems, "\n"), c.want) {
				t.Fatalf("problems %q, want one containing %q", r.Problems, c.want)
			}
		})
	}
}

func TestInversions(t *testing.T) {
	for _, c := range []struct {
		v    []uint64
		want int64
	}{
		{nil, 0}, {[]uint64{1}, 0}, {[]uint64{1, 2, 3}, 0}, {[]uint64{3, 2, 1}, 3}, {[]uint64{2, 1, 4, 3, 5}, 2}, {[]uint64{5, 1, 2, 3, 4}, 4},
	} {
		if got := inversions(c.v); got != c.want {
			t.Errorf("inversions(%v) = %d, want %d", c.v, got, c.want)
		}
	}
}

// logWriter sends the runner's progress to t.Log, line by line.
type logWriter struct{ t *testing.T }

func (w *logWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(l)
	}
	return len(p), nil
}
