package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"ticketing/cmd/ticketlab/internal/verify"
)

// The short form of the verification suite (issue 4): real node, sidecar
// and worker processes, a seeded nemesis, and every safety check. It runs
// in `make test-verify` (part of `make test`), without the race detector,
// which would only slow the harness; under -race it is skipped. Each case
// is a fixed seed, so a failure names a schedule to replay with
// `ticketlab verify --seed S --nodes N --duration D`. The nodes and
// sidecars are this module's `ticketlab node|sidecar`, the cluster is
// bootstrapped by the ticketing binary under test ($TICKETING_BIN, which
// make sets to the freshly built bin/ticketing). $TICKETING_VERIFY_NODE_ARGS
// adds flags to every node (`make test-verify VERIFY_NODE_ARGS="--log-store
// bolt"` runs it on the bolt log store; the default is wal).
func TestVerifyShort(t *testing.T) {
	if raceEnabled && os.Getenv("TICKETING_VERIFY_RACE") == "" {
		t.Skip("the short verification runs in `make test-verify`, without -race (set TICKETING_VERIFY_RACE=1 to run it here)")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	// Enough must happen for the run to prove anything: the workload goes
	// on after the heal until this many grants (verify.Config.MinGrants),
	// so a loaded machine lengthens the run instead of failing it.
	const minGrants = 100
	// The faults of issue 31 on their own, twice each: the leader killed
	// under long queues (every waiter confirmed queued before the kill)
	// and a sidecar killed. No speed is asserted, only that the checks
	// pass and judged what these faults produce.
	lineAndSidecarKills := []verify.Step{
		{Kind: verify.FaultKillLeaderQueues, Hold: 2 * time.Second, Gap: time.Second, R: 1},
		{Kind: verify.FaultKillSidecar, Hold: 2 * time.Second, Gap: time.Second, R: 2},
		{Kind: verify.FaultKillLeaderQueues, Hold: 1500 * time.Millisecond, Gap: time.Second, R: 3},
		{Kind: verify.FaultKillSidecar, Hold: 1500 * time.Millisecond, Gap: time.Second, R: 4},
	}
	// The faults of issue 39 once each (nemesis_i39.go): a sidecar cut
	// off with the leader right after a grant, a sidecar SIGTERMed under a
	// holder and queued waiters, a hand-over (SIGTERM of the leader, 3
	// nodes) whose target is cut off under waiters with short waits, and a
	// hostile client flooding EXTENDs and RELEASEs of a paused holder's
	// and others' tokens, and an operator's revoke of a worker's lock
	// (issue 42). Each checks its own bound (a key free after the
	// stop, every wait kept, no hostile request answered OK, the paused
	// holder's lease ending on time) besides every check of the run.
	i39 := []verify.Step{
		{Kind: verify.FaultPartitionSidecar, Hold: 2 * time.Second, Gap: time.Second, R: 1},
		{Kind: verify.FaultStopSidecar, Hold: 1500 * time.Millisecond, Gap: time.Second, R: 2},
		{Kind: verify.FaultHandOverCut, Hold: 1500 * time.Millisecond, Gap: time.Second, R: 3},
		{Kind: verify.FaultHostile, Hold: time.Second, Gap: time.Second, R: 4},
		{Kind: verify.FaultRevoke, Hold: time.Second, Gap: time.Second, R: 5},
	}
	for _, tc := range []struct {
		nodes int
		seed  int64
		dur   time.Duration
		wipe  bool
		steps []verify.Step
	}{
		{3, 11, 40 * time.Second, false, nil},
		{5, 12, 40 * time.Second, false, nil},
		{3, 13, 30 * time.Second, false, nil},
		// Two wiped followers and a wiped quorum member of five, each
		// replaced while the cluster runs degraded: before issue 15 the
		// replacement was refused (a 6th voter), never retried, and the
		// run ended with no leader.
		{5, 10, 30 * time.Second, true, nil},
		{3, 14, 30 * time.Second, false, lineAndSidecarKills},
		{3, 15, 30 * time.Second, false, i39},
	} {
		// Killed sidecars make every request they had in flight
		// INDETERMINATE by nature, and without cluster sessions so does a
		// leader kill for every waiter of its lines: the case of those
		// faults alone bounds the share of such acquires at 40 %, not 20 %
		// (18 % on a loaded 2-core machine without sessions).
		maxShare := 0.0
		if tc.steps != nil {
			maxShare = 0.4
		}
		binary, lab := binaries(t)
		name := fmt.Sprintf("nodes=%d/seed=%d", tc.nodes, tc.seed)
		if tc.wipe {
			name += "/wipe"
		}
		isI39 := len(tc.steps) > 0 && tc.steps[0].Kind == verify.FaultPartitionSidecar
		switch {
		case isI39:
			name += "/issue-39-faults"
		case tc.steps != nil:
			name += "/line-and-sidecar-kills"
		}
		t.Run(name, func(t *testing.T) {
			// Kept when the case fails (to replay and to read the history).
			dir, err := os.MkdirTemp(os.Getenv("TICKETING_VERIFY_OUT"), fmt.Sprintf("ticketing-verify-n%d-s%d-", tc.nodes, tc.seed))
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if !t.Failed() {
					os.RemoveAll(dir)
				}
			}()
			var log *slog.Logger
			if testing.Verbose() {
				log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			res, err := verify.Run(ctx, verify.Config{
				Binary: binary, Lab: lab, Dir: dir, Nodes: tc.nodes, Seed: tc.seed, Duration: tc.dur, Wipe: tc.wipe, Steps: tc.steps, MaxIndeterminateShare: maxShare, Logger: log,
				MinGrants: minGrants,
				NodeArgs:  strings.Fields(os.Getenv("TICKETING_VERIFY_NODE_ARGS")),
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("\n%s", res.Summary())
			if len(res.Violations) > 0 {
				t.Fatalf("%d violations (history, logs and data dirs kept in %s)", len(res.Violations), dir)
			}
			// Nothing short of a proof passes: porcupine's verdict must be
			// Ok (Unknown is inconclusive), and the share of indeterminate
			// acquires within its bound.
			if res.Check.Linearizable != porcupine.Ok || len(res.Inconclusive) > 0 {
				t.Fatalf("linearizability %s, inconclusive: %q (history, logs and data dirs kept in %s)", res.Check.Linearizable, res.Inconclusive, dir)
			}
			t.Logf("indeterminate share %.2f %% (%d of %d acquires)", 100*res.Check.IndeterminateShare, res.Check.Indeterminate, res.Check.Acquires)
			if isI39 {
				// Every step ran (none found nothing to do) and reported
				// what it saw; a fault's own finding is a violation above.
				for _, f := range res.Faults {
					t.Logf("fault %s %s: %s", f.Fault, f.Target, f.Detail)
				}
				if len(res.Faults) != len(tc.steps) {
					t.Fatalf("%d faults of %d ran", len(res.Faults), len(tc.steps))
				}
				return
			}
			if tc.steps != nil {
				// Every step ran; each line was confirmed queued (the
				// sidecar speaks version 4) and its grants, if any, were
				// judged against the queue order; each kill-sidecar killed.
				for _, f := range res.Faults {
					t.Logf("fault %s %s: %s", f.Fault, f.Target, f.Detail)
				}
				lines := 2 * verify.DefaultLineKeys * verify.DefaultLineWaiters
				if len(res.Faults) != len(tc.steps) || res.Check.SidecarKills != 2 || res.Check.Queued < lines {
					t.Fatalf("%d faults of %d, %d sidecar kills of 2, %d acquires confirmed queued (the lines alone: %d)",
						len(res.Faults), len(tc.steps), res.Check.SidecarKills, res.Check.Queued, lines)
				}
				if res.Check.QueuedThroughLeaderChange > 0 && res.Check.FIFOChecked == 0 {
					t.Fatalf("%d waiters kept their place through a leader kill, but no grant was checked against the queue order", res.Check.QueuedThroughLeaderChange)
				}
				// With cluster sessions the line survives the leader (its
				// waiters are granted after the kill): then none of its
				// confirmed waiters may end INDETERMINATE, since a new leader
				// serves long before their 20 s wait ends.
				ops, err := verify.ReadHistory(res.History)
				if err != nil {
					t.Fatal(err)
				}
				byResult := map[string]int{}
				for _, op := range ops {
					if op.Kind == verify.KindAcquire && op.Worker >= verify.LineWorkerBase && op.WaitMs > 0 && op.Queued > 0 {
						byResult[op.Result]++
					}
				}
				t.Logf("the lines' confirmed waiters: %v; %d acquires kept their place through a leader fault", byResult, res.Check.QueuedThroughLeaderChange)
				// Places in line (issue 41): with sessions that agreed
				// version 7 and nodes that tell places, the lines' waiters
				// were told theirs, and again by the new leader after each
				// kill (checker_position.go judges every place told).
				if pos := res.Check.Positions; pos.Sessions7 > 0 && res.PositionFlag != "" {
					t.Logf("positions: %d events, %d judged exactly (%d pinned), %d waiters told after a leader kill", pos.Events, pos.Exact, pos.Pinned, pos.AfterKill)
					if pos.Events == 0 || pos.Exact == 0 || pos.AfterKill == 0 {
						t.Fatalf("the leader was killed under lines on version-7 sessions, yet %d places were told, %d judged exactly, %d waiters told theirs after a kill",
							pos.Events, pos.Exact, pos.AfterKill)
					}
				}
				if res.Check.QueuedThroughLeaderChange > 0 && byResult[verify.ResIndeterminate] > 0 {
					t.Fatalf("the cluster kept its queues through the leader kills, yet %d of the lines' confirmed waiters ended INDETERMINATE", byResult[verify.ResIndeterminate])
				}
				return
			}
			if len(res.Faults) < 5 || res.Check.Grants < minGrants {
				t.Fatalf("too little happened: %d faults, %d grants", len(res.Faults), res.Check.Grants)
			}
			if tc.wipe && (len(res.Lost) > 0 || res.ExpectedStop != "") {
				t.Fatalf("wiped servers not replaced: %v (%s)", res.Lost, res.ExpectedStop)
			}
		})
	}
}
