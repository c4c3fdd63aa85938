package verify

import (
	"strings"
	"testing"
)

// Synthetic permit histories (issue 41), times in ms as the hist builder's.

func (h *hist) permits(key string, n int, inv, cmp int64, res string) Op {
	return h.add(Op{Worker: 99, Kind: KindPermits, Key: key, N: n, Inv: inv, Cmp: cmp, Result: res})
}

func (h *hist) permit(w int, key string, inv, cmp int64, res string, tok uint64, slot int) Op {
	return h.add(Op{Worker: w, Kind: KindPermit, Key: key, LeaseMs: 1000, Inv: inv, Cmp: cmp, Result: res, Token: tok, Slot: slot})
}

func (h *hist) permitRelease(a Op, inv, cmp int64) {
	h.add(Op{Worker: a.Worker, Kind: KindPermitRelease, Key: a.Key, Token: a.Token, Slot: a.Slot, Acq: a.ID, Inv: inv, Cmp: cmp, Result: ResOK})
}

func (h *hist) permitWrite(a Op, inv, cmp int64, res string) Op {
	return h.add(Op{Worker: a.Worker, Kind: KindPermitWrite, Key: a.Key, Token: a.Token, Slot: a.Slot, Acq: a.ID, Inv: inv, Cmp: cmp, Result: res})
}

// permitRec is the permit store's record of write w.
func permitRec(w Op, accepted bool) StoreRec {
	return StoreRec{Key: permitResource(w.Key, w.Slot), Token: w.Token, Worker: w.Worker, Op: w.ID, At: w.Cmp, Accepted: accepted}
}

func permitCheck(h *hist, store []StoreRec, final FinalState) CheckReport {
	return Check(h.ops, nil, final, CheckOptions{PermitStore: store})
}

// A good history through a raise and a lowering: at most n at each grant
// (the n in force then), more than n held after the lowering without a
// new grant, lowest free slots, a lease that ran out freeing its slot.
func TestPermitCheckAcceptsAGoodHistory(t *testing.T) {
	var h hist
	h.permits("s", 2, 0, 5, ResOK)
	a := h.permit(0, "s", 10, 20, ResOK, 1, 0)
	b := h.permit(1, "s", 10, 25, ResOK, 2, 1)
	wa := h.permitWrite(a, 30, 31, ResOK)
	h.permit(2, "s", 30, 40, ResBusy, 0, 0)
	// The raise to 3, and a grant while it was in flight: n may be 3 then.
	h.permits("s", 3, 50, 70, ResOK)
	c := h.permit(2, "s", 55, 60, ResOK, 3, 2)
	// The lowering to 1 leaves 3 held: allowed, no grant meanwhile.
	h.permits("s", 1, 100, 110, ResOK)
	h.permitRelease(a, 200, 210)
	h.permitRelease(b, 220, 230)
	h.permitRelease(c, 240, 250)
	d := h.permit(3, "s", 150, 260, ResOK, 4, 0) // waited until none was held
	wd := h.permitWrite(d, 270, 271, ResOK)
	// d's lease (1 s from its send at 150) ran out: e takes its slot.
	e := h.permit(4, "s", 1200, 1210, ResOK, 5, 0)
	we := h.permitWrite(e, 1220, 1221, ResOK)
	h.add(Op{Worker: d.Worker, Kind: KindPermitLost, Key: "s", Token: d.Token, Reason: "expired", Inv: 1160, Cmp: 1160})
	late := h.add(Op{Worker: d.Worker, Kind: KindPermitWrite, Key: "s", Token: d.Token, Slot: 0, Acq: d.ID, Inv: 1300, Cmp: 1301, Result: ResRejected, Late: true})
	store := []StoreRec{permitRec(wa, true), permitRec(wd, true), permitRec(we, true), permitRec(late, false)}
	r := permitCheck(&h, store, FinalState{LastToken: 5})
	if len(r.Violations) != 0 {
		t.Fatalf("violations %v", r.Violations)
	}
	p := r.Permits
	if p.Grants != 5 || p.MaxHeld["s"] != 3 || p.MaxN["s"] != 3 || p.Writes != 4 || p.Stale != 1 || p.Late != 1 || p.Lost["expired"] != 1 {
		t.Fatalf("report %+v", p)
	}
	// What each n let in: 2 under the first n, 3 after the raise, 1 after
	// the lowering (d waited for all three to end).
	if h := p.HeldAtN["s"]; len(h) != 3 || h[2] != 2 || h[3] != 3 || h[1] != 1 {
		t.Fatalf("held at n %v", h)
	}
	// The lowering to 1 was answered with 3 held.
	if got := strings.Join(p.AtSets, ", "); got != "s=2: 0 held, s=3: 3 held, s=1: 3 held" {
		t.Fatalf("at sets %q", got)
	}
}

func TestPermitCheckFindsMoreThanN(t *testing.T) {
	var h hist
	h.permits("s", 2, 0, 5, ResOK)
	h.permit(0, "s", 10, 20, ResOK, 1, 0)
	h.permit(1, "s", 10, 25, ResOK, 2, 1)
	h.permit(2, "s", 10, 30, ResOK, 3, 2) // a third while two held, n 2
	if got := checks(permitCheck(&h, nil, FinalState{})); !strings.Contains(got, "permits-n") {
		t.Fatalf("violations %q", got)
	}
}

// After a lowering, holders above the new n keep their permits, but a new
// grant must wait until fewer than n are held.
func TestPermitCheckFindsAGrantAfterLoweringWhileHeld(t *testing.T) {
	var h hist
	h.permits("s", 3, 0, 5, ResOK)
	a := h.permit(0, "s", 10, 20, ResOK, 1, 0)
	h.permit(1, "s", 10, 25, ResOK, 2, 1)
	h.permit(2, "s", 10, 30, ResOK, 3, 2)
	h.permits("s", 2, 100, 110, ResOK)
	h.permitRelease(a, 200, 210)
	// Two still held, n 2: no new grant may come, yet one did.
	h.permit(3, "s", 150, 220, ResOK, 4, 0)
	if got := checks(permitCheck(&h, nil, FinalState{})); !strings.Contains(got, "permits-n") {
		t.Fatalf("violations %q", got)
	}
}

// A grant answered before the raise was sent had the old n.
func TestPermitCheckUsesTheNInForce(t *testing.T) {
	var h hist
	h.permits("s", 1, 0, 5, ResOK)
	h.permit(0, "s", 10, 20, ResOK, 1, 0)
	h.permit(1, "s", 10, 30, ResOK, 2, 1) // before the raise: n was 1
	h.permits("s", 2, 40, 50, ResOK)
	if got := checks(permitCheck(&h, nil, FinalState{})); !strings.Contains(got, "permits-n") {
		t.Fatalf("violations %q", got)
	}
}

func TestPermitCheckFindsASharedSlot(t *testing.T) {
	var h hist
	h.permits("s", 3, 0, 5, ResOK)
	h.permit(0, "s", 10, 20, ResOK, 1, 0)
	h.permit(1, "s", 10, 30, ResOK, 2, 0) // slot 0 again while held
	if got := checks(permitCheck(&h, nil, FinalState{})); got != "permit-slot" {
		t.Fatalf("violations %q", got)
	}
	var h2 hist
	h2.permits("s", 2, 0, 5, ResOK)
	h2.permit(0, "s", 10, 20, ResOK, 1, 2) // slot 2 of a semaphore of 2
	if got := checks(permitCheck(&h2, nil, FinalState{})); got != "permit-slot" {
		t.Fatalf("violations %q", got)
	}
}

// A grant read after its own lease ran out (sent at 10, lease 1 s, read
// at 2 s: a replay after a partition) may have been granted before
// another holder of its slot took it: no violation (CI's seed 15 run).
// Sent after that holder's grant was read, it was granted while the slot
// was held: a violation.
func TestPermitCheckDeadOnArrivalGrant(t *testing.T) {
	var h hist // times in ms
	h.permits("s", 1, 0, 5, ResOK)
	h.permit(1, "s", 1500, 1600, ResOK, 2, 0) // holds slot 0 until 2.5 s
	h.permit(0, "s", 10, 2000, ResOK, 1, 0)   // token 1, its lease over at 1.01 s
	if got := checks(permitCheck(&h, nil, FinalState{})); got != "" {
		t.Fatalf("violations %q", got)
	}
	var h2 hist
	h2.permits("s", 1, 0, 5, ResOK)
	h2.add(Op{Worker: 1, Kind: KindPermit, Key: "s", LeaseMs: 5000, Inv: 10, Cmp: 20, Result: ResOK, Token: 1, Slot: 0}) // holds slot 0 until 5 s
	h2.permit(0, "s", 30, 2000, ResOK, 2, 0)                                                                             // sent after it was read, its own lease over at 1.03 s: granted while slot 0 was held
	if got := checks(permitCheck(&h2, nil, FinalState{})); !strings.Contains(got, "permit-slot") {
		t.Fatalf("violations %q", got)
	}
}

func TestPermitCheckFindsFencingViolations(t *testing.T) {
	// A write refused while its permit was live: someone newer wrote its slot.
	var h hist
	h.permits("s", 2, 0, 5, ResOK)
	a := h.permit(0, "s", 10, 20, ResOK, 1, 0)
	w := h.permitWrite(a, 30, 31, ResRejected)
	if got := checks(permitCheck(&h, []StoreRec{permitRec(w, false)}, FinalState{})); got != "permit-fencing" {
		t.Fatalf("violations %q", got)
	}
	// The store accepted a stale token after a newer one on one slot.
	var h2 hist
	h2.permits("s", 2, 0, 5, ResOK)
	b := h2.permit(0, "s", 10, 20, ResOK, 2, 1)
	h2.permitRelease(b, 50, 60)
	c := h2.permit(1, "s", 70, 80, ResOK, 3, 1)
	wc := h2.permitWrite(c, 90, 91, ResOK)
	wb := h2.add(Op{Worker: b.Worker, Kind: KindPermitWrite, Key: "s", Token: 2, Slot: 1, Acq: b.ID, Inv: 95, Cmp: 96, Result: ResOK, Late: true})
	if got := checks(permitCheck(&h2, []StoreRec{permitRec(wc, true), permitRec(wb, true)}, FinalState{})); got != "permit-fencing" {
		t.Fatalf("violations %q", got)
	}
}

// Tokens strictly increase across locks and permits: a permit sent after a
// lock's grant was read has a larger token.
func TestPermitCheckFindsTokenRegressionAcrossLocks(t *testing.T) {
	var h hist
	h.permits("s", 2, 0, 5, ResOK)
	h.acquire(0, "k", 10, 20, ResOK, 5)
	h.permit(1, "s", 30, 40, ResOK, 4, 0)
	if got := checks(permitCheck(&h, nil, FinalState{})); !strings.Contains(got, "tokens") {
		t.Fatalf("violations %q", got)
	}
}

func TestPermitCheckFindsAFIFOOvertake(t *testing.T) {
	var h hist
	h.permits("s", 1, 0, 5, ResOK)
	a := h.permit(0, "s", 10, 20, ResOK, 1, 0)
	h.permitRelease(a, 400, 410)
	w := h.permit(1, "s", 30, 500, ResOK, 3, 0)
	w.Queued = 40 * ms // queued behind a
	h.ops[len(h.ops)-1] = w
	h.permit(2, "s", 50, 420, ResOK, 2, 0) // sent after w was queued, granted first
	if got := checks(permitCheck(&h, nil, FinalState{})); !strings.Contains(got, "permit-fifo") {
		t.Fatalf("violations %q", got)
	}
}

// The tokens permits took are known tokens for the no-leak count, and an
// indeterminate PERMIT explains one.
func TestPermitTokensCountForNoLeak(t *testing.T) {
	var h hist
	h.permits("s", 2, 0, 5, ResOK)
	h.acquire(0, "k", 10, 20, ResOK, 1)
	h.permit(1, "s", 30, 40, ResOK, 2, 0)
	h.permit(2, "s", 30, 45, ResIndeterminate, 0, 0)
	r := permitCheck(&h, nil, FinalState{LastToken: 3})
	if len(r.Violations) != 0 || r.UnknownTokens != 1 {
		t.Fatalf("violations %v unknown %d", r.Violations, r.UnknownTokens)
	}
}

// The summary names the permit workload, or its absence, and a replay
// line that reproduces a non-default one.
func TestPermitSummary(t *testing.T) {
	r := Result{Config: Config{Seed: 1, Nodes: 3, PermitsN: 2, PermitKeys: 1, PermitWorkers: 4}, PermitKeys: []string{"sem/0"}, PermitPlan: []int{2, 4, 1}}
	r.Check.Permits = PermitReport{Grants: 7, HeldAtN: map[string]map[int]int{"sem/0": {2: 2, 4: 3}}, MaxHeld: map[string]int{"sem/0": 3}, MaxN: map[string]int{"sem/0": 4}}
	s := r.Summary()
	for _, want := range []string{"permits: sem/0, n 2 → 4 → 1; 7 grants", "sem/0: at most 3 held at a grant (n at most 4); by the n allowed at the grant, the most held: n 2: 2, n 4: 3",
		"--permits-n 2 --permit-keys 1 --permit-workers 4"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	r = Result{Config: Config{Seed: 1, Nodes: 3, PermitsN: -1}}
	if s := r.Summary(); !strings.Contains(s, "permits: no permit workload") || !strings.Contains(s, "--permits-n -1") {
		t.Errorf("summary without permits:\n%s", s)
	}
}

// A killed sidecar answers no PERMIT: one answered OK while it was down is
// a dead-sidecar violation, as an ACQUIRE's would be; INDETERMINATE is
// what its worker must see.
func TestPermitCheckKilledSidecarAnswersNothing(t *testing.T) {
	build := func(res string, tok uint64) []Op {
		var h hist
		h.permits("s", 2, 0, 5, ResOK)
		h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultKillSidecar, Target: "sidecar1", Sidecar: 1, Inv: 100, Cmp: 1500})
		h.add(Op{Worker: 1, Sidecar: 1, Kind: KindPermit, Key: "s", LeaseMs: 1000, WaitMs: 5000, Inv: 50, Cmp: 4000, Result: res, Token: tok})
		return h.ops
	}
	if r := Check(build(ResIndeterminate, 0), nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 || r.KilledInFlight != 1 {
		t.Fatalf("violations %v, in flight %d", r.Violations, r.KilledInFlight)
	}
	if got := checks(Check(build(ResOK, 1), nil, FinalState{}, CheckOptions{})); got != "dead-sidecar" {
		t.Fatalf("violations %q, want dead-sidecar", got)
	}
}
