package verify

import (
	"strings"
	"testing"
	"time"
)

// Synthetic histories pinning the checks of places in line
// (checker_position.go).

func (h *hist) position(a Op, place int, at int64) Op {
	return h.add(Op{Worker: a.Worker, Kind: KindPosition, Acq: a.ID, Key: a.Key, N: place, EstSec: -1, Inv: at, Cmp: at})
}

// positionLine is a line of the kill-leader-queues fault on a fresh key:
// a holder (token 1), then three waiters queued one by one behind it,
// each told its place at 300 ms; the leader is killed at 500 and a new
// leader serves (a grant on another key at 1650), retells every place at
// 1700, the holder releases at 2000, and the waiters are granted at 2010,
// 2030, 2050, each releasing at once. mutate may change the history
// before the last ops are added (it gets the waiters).
func positionLine(mutate func(h *hist, ws []Op)) *hist {
	var h hist
	b := LineWorkerBase
	holder := h.add(Op{Worker: b, Kind: KindAcquire, Key: "line/0/0", LeaseMs: 10000, Inv: 0, Cmp: 10, Result: ResOK, Token: 1, Proto: 7})
	var ws []Op
	for i := 0; i < 3; i++ {
		inv := 20 + 10*int64(i)
		ws = append(ws, h.add(Op{Worker: b + 1 + i, Kind: KindAcquire, Key: "line/0/0", LeaseMs: 10000, WaitMs: 20000, Inv: inv, Queued: (inv + 5) * ms,
			Cmp: 2010 + 20*int64(i), Result: ResOK, Token: uint64(2 + i), Proto: 7}))
	}
	for i, w := range ws {
		h.position(w, i+1, 300)
	}
	h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultKillLeaderQueues, Target: "n1", Inv: 500, Cmp: 1500})
	other := h.add(Op{Worker: 1, Kind: KindAcquire, Key: "seat/0", LeaseMs: 10000, Inv: 1600, Cmp: 1650, Result: ResOK, Token: 5})
	h.release(other, 1660, 1670, ResOK, "")
	for i, w := range ws {
		h.position(w, i+1, 1700) // the new leader retells every place
	}
	if mutate != nil {
		mutate(&h, ws)
	}
	h.release(holder, 2000, 2005, ResOK, "")
	for _, w := range ws {
		h.release(w, w.Cmp/ms+5, w.Cmp/ms+8, ResOK, "")
	}
	return &h
}

func positionChecks(t *testing.T, h *hist) CheckReport {
	t.Helper()
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	for _, v := range r.Violations {
		if v.Check != "positions" {
			t.Fatalf("a check other than positions failed: %v", r.Violations)
		}
	}
	return r
}

func TestPositionsAcceptTheLine(t *testing.T) {
	r := positionChecks(t, positionLine(func(h *hist, ws []Op) {
		// While the line drains: w3 is told 2 after w1's grant (w2 may
		// still be ahead), then 1.
		h.position(ws[2], 2, 2020)
		h.position(ws[2], 1, 2040)
	}))
	if len(r.Violations) != 0 {
		t.Fatalf("violations %v", r.Violations)
	}
	p := r.Positions
	if p.Events != 8 || p.Waiters != 3 || p.Retold != 3 || p.Exact != 8 || p.ExactKeys != 1 || p.Sessions7 != 4 {
		t.Fatalf("report %+v", p)
	}
	// Every place told before the holder's release is pinned to the unit
	// (the line stood still), across the kill; the two while it drained
	// are judged by intervals.
	if p.Pinned != 6 {
		t.Fatalf("pinned %d of %d, want 6", p.Pinned, p.Exact)
	}
	// The three waiters were queued before the kill and told their places
	// after the new leader served.
	if p.AfterLeader != 3 || p.AfterKill != 3 || p.AfterLeaderEvents != 5 {
		t.Fatalf("after the leader change: %d waiters (%d across a kill), %d events", p.AfterLeader, p.AfterKill, p.AfterLeaderEvents)
	}
	if s := positionSummary(p); !strings.Contains(s, "8 `! POSITION` events to 3 waiters") || !strings.Contains(s, "3 waiters queued before it") {
		t.Fatalf("summary %q", s)
	}
}

// Each mutation of a correct history is refuted.
func TestPositionsFindWrongPlaces(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(h *hist, ws []Op)
		want   string
	}{
		// w2 stands behind w1 only: told 3 after the kill, one too many.
		{"too high after the kill", func(h *hist, ws []Op) { h.position(ws[1], 3, 1800) }, "not exact"},
		// w3 told 1 while w1 and w2 are sure to be ahead (the holder has
		// not released yet): too low.
		{"too low", func(h *hist, ws []Op) { h.position(ws[2], 1, 1800) }, "not exact"},
		// Too low while the line drains: w1 cannot have left before the
		// holder's release was sent, nor w2 before w1's.
		{"too low while draining", func(h *hist, ws []Op) { h.position(ws[2], 1, 2012) }, "not exact"},
		{"went up", func(h *hist, ws []Op) { h.position(ws[2], 2, 1800); h.position(ws[2], 3, 1900) }, "went up"},
		{"after the reply", func(h *hist, ws []Op) { h.position(ws[0], 1, 2012) }, "after its reply"},
		{"after the reply by the event's order", func(h *hist, ws []Op) {
			op := h.position(ws[0], 1, 1800)
			h.ops[len(h.ops)-1].After = "reply"
			_ = op
		}, "after its reply"},
		{"zero", func(h *hist, ws []Op) { h.position(ws[0], 0, 1800) }, "count from 1"},
		{"never waited", func(h *hist, ws []Op) { h.position(h.ops[0], 1, 300) }, "never stood in a line"},
		{"another key", func(h *hist, ws []Op) { op := ws[0]; op.Key = "line/0/1"; h.position(op, 1, 1800) }, "did not ask for"},
		{"no request", func(h *hist, ws []Op) { op := ws[0]; op.ID = 0; h.position(op, 1, 1800) }, "no request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := positionChecks(t, positionLine(tc.mutate))
			var got []string
			for _, v := range r.Violations {
				got = append(got, v.Detail)
			}
			if len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), tc.want) {
				t.Fatalf("violations %q, want one with %q", got, tc.want)
			}
		})
	}
}

// A key some Go-client worker also asked for (its places are not
// recorded) is judged only for monotony; a waiter whose order against W
// is unknown counts only towards the upper bound; an INDETERMINATE waiter
// ahead may stay in line as long as it likes.
func TestPositionsJudgeOnlyWhatIsKnown(t *testing.T) {
	// Mixed key: a place 5 on a line of one is not judged.
	var h hist
	a := h.add(Op{Worker: 0, Kind: KindAcquire, Key: "seat/0", LeaseMs: 1000, Inv: 0, Cmp: 10, Result: ResOK, Token: 1})
	w := h.add(Op{Worker: 1, Kind: KindAcquire, Key: "seat/0", LeaseMs: 1000, WaitMs: 5000, Inv: 20, Queued: 25 * ms, Cmp: 110, Result: ResOK, Token: 2})
	h.position(w, 5, 50)
	h.release(a, 100, 105, ResOK, "")
	h.release(w, 120, 125, ResOK, "")
	r := Check(h.ops, nil, FinalState{LastToken: 2}, CheckOptions{})
	if len(r.Violations) != 0 || r.Positions.Exact != 0 || r.Positions.Events != 1 {
		t.Fatalf("violations %v, report %+v", r.Violations, r.Positions)
	}

	// Unknown order: x was sent before w's QUEUED was read, and its own
	// came after w was sent. w may be told 1 or 2.
	for _, place := range []int{1, 2} {
		var h hist
		b := LineWorkerBase
		hold := h.add(Op{Worker: b, Kind: KindAcquire, Key: "line/1/0", LeaseMs: 10000, Inv: 0, Cmp: 10, Result: ResOK, Token: 1})
		x := h.add(Op{Worker: b + 1, Kind: KindAcquire, Key: "line/1/0", LeaseMs: 10000, WaitMs: 20000, Inv: 20, Queued: 40 * ms, Cmp: 1010, Result: ResOK, Token: 2})
		w := h.add(Op{Worker: b + 2, Kind: KindAcquire, Key: "line/1/0", LeaseMs: 10000, WaitMs: 20000, Inv: 30, Queued: 35 * ms, Cmp: 1030, Result: ResOK, Token: 3})
		h.position(w, place, 300)
		h.release(hold, 1000, 1005, ResOK, "")
		h.release(x, 1015, 1020, ResOK, "")
		h.release(w, 1035, 1040, ResOK, "")
		if r := positionChecks(t, &h); len(r.Violations) != 0 || r.Positions.Pinned != 0 {
			t.Fatalf("place %d: violations %v, pinned %d", place, r.Violations, r.Positions.Pinned)
		}
	}

	// An INDETERMINATE waiter ahead (its session broke) may still stand
	// in line after its answer; one answered TIMEOUT left by its reply,
	// here read before w was sent: w's place 2 counts it, one too many.
	for _, tc := range []struct {
		res  string
		fail bool
	}{{ResIndeterminate, false}, {ResTimeout, true}} {
		var h hist
		b := LineWorkerBase
		hold := h.add(Op{Worker: b, Kind: KindAcquire, Key: "line/2/0", LeaseMs: 10000, Inv: 0, Cmp: 10, Result: ResOK, Token: 1})
		x := Op{Worker: b + 1, Kind: KindAcquire, Key: "line/2/0", LeaseMs: 10000, WaitMs: 3, Inv: 20, Queued: 25 * ms, Cmp: 28, Result: tc.res}
		if tc.res == ResIndeterminate {
			x.Err = errLineClosed.Error() + ": EOF"
		}
		h.add(x)
		w := h.add(Op{Worker: b + 2, Kind: KindAcquire, Key: "line/2/0", LeaseMs: 10000, WaitMs: 20000, Inv: 30, Queued: 35 * ms, Cmp: 1010, Result: ResOK, Token: 2})
		h.position(w, 2, 300) // x counted ahead
		h.release(hold, 1000, 1005, ResOK, "")
		h.release(w, 1015, 1020, ResOK, "")
		r := positionChecks(t, &h)
		if (len(r.Violations) > 0) != tc.fail {
			t.Fatalf("x answered %s: violations %v", tc.res, r.Violations)
		}
	}
}

// Places of permit waiters are judged like a lock's: monotone, and exact
// by intervals (the semaphores' every request is recorded).
func TestPositionsOfPermits(t *testing.T) {
	var h hist
	h.permits("sem/0", 1, 0, 5, ResOK)
	a := h.permit(0, "sem/0", 10, 20, ResOK, 1, 0)
	w := h.add(Op{Worker: 1, Kind: KindPermit, Key: "sem/0", LeaseMs: 1000, WaitMs: 5000, Inv: 30, Queued: 35 * ms, Cmp: 210, Result: ResOK, Token: 2, Proto: 7})
	h.position(w, 1, 100)
	h.position(w, 2, 150) // up
	h.permitRelease(a, 200, 205)
	h.permitRelease(w, 220, 225)
	r := Check(h.ops, nil, FinalState{LastToken: 2}, CheckOptions{})
	var details []string
	for _, v := range r.Violations {
		details = append(details, v.Detail)
	}
	all := strings.Join(details, "\n")
	if !strings.Contains(all, "went up") || !strings.Contains(all, "not exact") || r.Positions.PermitEvents != 2 {
		t.Fatalf("violations %q, report %+v", details, r.Positions)
	}
}

// A waiter queued before a leader kill that still waits well after the new
// leader served (here: 1650 + keptBound) must have been told a place after
// the kill if its place surely changed meanwhile: x, ahead of it and still
// in line when its place 2 was told, timed out by 1700. The line below
// drains only at 4000. The sidecar passes on only a changed place, so a
// waiter whose place may not have changed is owed nothing.
func TestPositionsRetoldAfterAKill(t *testing.T) {
	build := func(retell, xLeaves bool) *hist {
		var h hist
		b := LineWorkerBase
		holder := h.add(Op{Worker: b, Kind: KindAcquire, Key: "line/0/1", LeaseMs: 10000, Inv: 0, Cmp: 10, Result: ResOK, Token: 1, Proto: 7})
		x := Op{Worker: b + 3, Kind: KindAcquire, Key: "line/0/1", LeaseMs: 10000, WaitMs: 20000, Inv: 15, Queued: 18 * ms,
			Cmp: 4012, Result: ResIndeterminate, Err: errLineClosed.Error() + ": EOF", Proto: 7}
		if xLeaves {
			x.WaitMs, x.Cmp, x.Result, x.Err = 1600, 1700, ResTimeout, ""
		}
		h.add(x)
		w := h.add(Op{Worker: b + 1, Kind: KindAcquire, Key: "line/0/1", LeaseMs: 10000, WaitMs: 20000, Inv: 20, Queued: 25 * ms,
			Cmp: 4010, Result: ResOK, Token: 3, Proto: 7})
		h.position(w, 2, 300)
		h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultKillLeaderQueues, Target: "n1", Inv: 500, Cmp: 1500})
		other := h.add(Op{Worker: 1, Kind: KindAcquire, Key: "seat/0", LeaseMs: 10000, Inv: 1600, Cmp: 1650, Result: ResOK, Token: 2})
		h.release(other, 1660, 1670, ResOK, "")
		if retell {
			h.position(w, 1, 1900)
		}
		h.release(holder, 4000, 4005, ResOK, "")
		h.release(w, 4015, 4020, ResOK, "")
		return &h
	}
	opts := CheckOptions{PositionInterval: 100 * time.Millisecond} // bound 2.2 s: due at 3850
	if r := Check(build(true, true).ops, nil, FinalState{}, opts); len(r.Violations) != 0 || r.Positions.KeptRetold != 1 {
		t.Fatalf("violations %v, report %+v", r.Violations, r.Positions)
	}
	if got := checks(Check(build(false, true).ops, nil, FinalState{}, opts)); got != "positions-kept" {
		t.Fatalf("violations %q, want positions-kept", got)
	}
	// x never surely left: w's place may be unchanged, and nothing is owed.
	if r := Check(build(false, false).ops, nil, FinalState{}, opts); len(r.Violations) != 0 || r.Positions.KeptUnchanged != 1 {
		t.Fatalf("an unchanged place: violations %v, report %+v", r.Violations, r.Positions)
	}
	// Without the interval (nodes that may not tell places) not judged.
	if r := Check(build(false, true).ops, nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 || r.Positions.KeptRetold+r.Positions.KeptLeft != 0 {
		t.Fatalf("violations %v, report %+v", r.Violations, r.Positions)
	}
}
