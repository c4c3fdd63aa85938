package verify

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// A tiny history builder: times in milliseconds from 0.
const ms = int64(time.Millisecond)

type hist struct {
	ops []Op
	id  int64
}

func (h *hist) add(op Op) Op {
	h.id++
	op.ID = h.id
	op.Inv *= ms
	op.Cmp *= ms
	h.ops = append(h.ops, op)
	return op
}

func (h *hist) acquire(w int, key string, inv, cmp int64, res string, tok uint64) Op {
	return h.add(Op{Worker: w, Kind: KindAcquire, Key: key, LeaseMs: 1000, Inv: inv, Cmp: cmp, Result: res, Token: tok})
}

func (h *hist) release(a Op, inv, cmp int64, res, code string) {
	h.add(Op{Worker: a.Worker, Kind: KindRelease, Key: a.Key, Token: a.Token, Acq: a.ID, Inv: inv, Cmp: cmp, Result: res, Err: code})
}

func checks(r CheckReport) string {
	var s []string
	for _, v := range r.Violations {
		s = append(s, v.Check)
	}
	return strings.Join(s, ",")
}

func TestCheckAcceptsAGoodHistory(t *testing.T) {
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 1)
	h.acquire(1, "k", 5, 15, ResBusy, 0)
	b := h.acquire(2, "k", 20, 120, ResOK, 2) // waited for the release
	h.release(a, 100, 110, ResOK, "")
	// c expired: b's lease (1 s from 20 ms) ran out before c was granted.
	c := h.acquire(3, "k", 900, 1100, ResOK, 3)
	h.release(b, 1200, 1210, ResError, "not_held")
	h.release(c, 1300, 1310, ResOK, "")
	h.acquire(4, "k", 1400, 1500, ResIndeterminate, 0)
	h.acquire(5, "k", 1600, 1610, ResBusy, 0) // explained by the indeterminate grant
	store := []StoreRec{{Key: "k", Token: 1, Accepted: true}, {Key: "k", Token: 2, Accepted: true, HW: 1}, {Key: "k", Token: 1, HW: 2}}
	r := Check(h.ops, store, FinalState{LastToken: 4}, CheckOptions{})
	if len(r.Violations) != 0 || r.Linearizable != porcupine.Ok {
		t.Fatalf("violations %v, linearizable %s", r.Violations, r.Linearizable)
	}
	if r.StaleWrites != 1 || r.UnknownTokens != 1 {
		t.Fatalf("stale %d unknown %d", r.StaleWrites, r.UnknownTokens)
	}
}

func TestCheckFindsOverlappingHolders(t *testing.T) {
	var h hist
	h.acquire(0, "k", 0, 10, ResOK, 1)
	h.acquire(1, "k", 20, 30, ResOK, 2) // a still held it, lease 1 s
	dir := t.TempDir()
	r := Check(h.ops, nil, FinalState{}, CheckOptions{Dir: dir})
	if got := checks(r); !strings.Contains(got, "mutual-exclusion") || !strings.Contains(got, "linearizability") {
		t.Fatalf("violations %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "linearizability.html")); err != nil {
		t.Fatalf("no visualization: %v", err)
	}
}

func TestCheckFindsTokenRegression(t *testing.T) {
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 5)
	h.release(a, 20, 30, ResOK, "")
	h.acquire(1, "j", 40, 50, ResOK, 3)
	if got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{})); got != "tokens" {
		t.Fatalf("violations %q, want tokens", got)
	}
}

func TestCheckFindsBusyWhenFree(t *testing.T) {
	var h hist
	h.acquire(0, "k", 0, 10, ResBusy, 0)
	if got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{})); got != "linearizability" {
		t.Fatalf("violations %q, want linearizability", got)
	}
}

// A grant while the previous holder's lease might still run is refused by
// the model even if the mutual-exclusion intervals (which end at the
// release's invocation) do not overlap: the release never succeeded.
func TestCheckFindsGrantBeforeExpiry(t *testing.T) {
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 1)
	h.release(a, 20, 30, ResError, "token_mismatch") // "not ours any more", at 30 ms?
	h.acquire(1, "k", 40, 50, ResOK, 2)
	if got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{})); got != "linearizability" {
		t.Fatalf("violations %q, want linearizability", got)
	}
}

func TestCheckFindsFencingAndLeaks(t *testing.T) {
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 1)
	b := h.acquire(1, "k", 5, 15, ResBusy, 0)
	h.add(Op{Worker: 1, Kind: KindWrite, Key: "k", Token: 1, Acq: b.ID, Inv: 20, Cmp: 21, Result: ResOK})
	h.release(a, 30, 40, ResOK, "")
	store := []StoreRec{{Key: "k", Token: 1, Accepted: true}, {Key: "k", Token: 1, Accepted: true, HW: 1}}
	got := checks(Check(h.ops, store, FinalState{LastToken: 3}, CheckOptions{}))
	for _, want := range []string{"fencing", "no-leak"} {
		if !strings.Contains(got, want) {
			t.Fatalf("violations %q, want %s", got, want)
		}
	}
}

func TestScheduleIsReproducible(t *testing.T) {
	a, b := Schedule(7, time.Minute, false), Schedule(7, time.Minute, false)
	if len(a) == 0 || len(a) != len(b) {
		t.Fatal("schedules differ in length")
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("step %d differs: %+v %+v", i, a[i], b[i])
		}
		if a[i].Kind == FaultWipeFollower {
			t.Fatal("wipe without the flag")
		}
		if a[i].Hold > 6*time.Second {
			t.Fatalf("unbounded fault %+v", a[i])
		}
	}
	if c := Schedule(8, time.Minute, false); len(c) == len(a) && c[0] == a[0] && c[1] == a[1] {
		t.Fatal("another seed gave the same schedule")
	}
}

func TestGroupsCut(t *testing.T) {
	ids := []string{"n1", "n2", "n3", "n4", "n5"}
	cut := groupsCut(ids, []int{0, 1}, []int{2, 3}) // n5 bridges
	if len(cut) != 4 {
		t.Fatalf("cut %v", cut)
	}
	for _, l := range cut {
		if l[0] == "n5" || l[1] == "n5" {
			t.Fatalf("the bridge was cut: %v", cut)
		}
	}
}

func TestStore(t *testing.T) {
	s := NewStore()
	path := filepath.Join(t.TempDir(), "s.sock")
	if err := s.Serve(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := &storeClient{path: path}
	for _, tc := range []struct {
		tok  uint64
		want bool
	}{{3, true}, {2, false}, {3, false}, {4, true}} {
		ok, err := c.write([]string{"k"}, tc.tok, 1, 1)
		if err != nil || ok != tc.want {
			t.Fatalf("write %d: %v %v, want %v", tc.tok, ok, err, tc.want)
		}
	}
	if ok, _ := s.Write("other", 1, 2, 2); !ok {
		t.Fatal("keys are independent")
	}
	if n := len(s.Log()); n != 5 {
		t.Fatalf("log has %d writes", n)
	}
}

// block is an acquire of several keys (Keys[0] is its primary key).
func (h *hist) block(w int, keys []string, inv, cmp int64, res string, tok uint64) Op {
	return h.add(Op{Worker: w, Kind: KindAcquire, Key: keys[0], Keys: keys, LeaseMs: 1000, WaitMs: 1000, Inv: inv, Cmp: cmp, Result: res, Token: tok})
}

// releaseVia releases a's holding naming key (any key of a block).
func (h *hist) releaseVia(a Op, key string, inv, cmp int64, res, code string) {
	h.add(Op{Worker: a.Worker, Kind: KindRelease, Key: key, Keys: a.Keys, Token: a.Token, Acq: a.ID, Inv: inv, Cmp: cmp, Result: res, Err: code})
}

func (h *hist) write(a Op, inv, cmp int64, res string) Op {
	return h.add(Op{Worker: a.Worker, Kind: KindWrite, Key: a.Key, Keys: a.Keys, Token: a.Token, Acq: a.ID, Inv: inv, Cmp: cmp, Result: res})
}

func (h *hist) held(a Op, after string, inv, cmp int64, keys ...string) {
	h.add(Op{Worker: a.Worker, Kind: KindHeld, Key: a.Key, Keys: keys, Token: a.Token, Acq: a.ID, After: after, Inv: inv, Cmp: cmp, Result: ResOK})
}

// rec is the store's record of one key of write w.
func rec(w Op, key string, accepted bool, hw uint64) StoreRec {
	return StoreRec{Key: key, Token: w.Token, Worker: w.Worker, Op: w.ID, Accepted: accepted, HW: hw, Keys: w.Keys}
}

// storeLog numbers the records in order.
func storeLog(recs ...StoreRec) []StoreRec {
	for i := range recs {
		recs[i].Seq = i
	}
	return recs
}

// A clean history with blocks: a hand-off from a single holder to a
// waiting block, a BUSY on a key the waiting block reserved (it is free,
// but the block heads its queue), a release naming the block's second key,
// hand-offs from the block to single waiters, writes to every key of the
// block under its token, and an indeterminate block whose unknown grant
// explains a BUSY and a token nobody learned.
func TestCheckAcceptsAGoodBlockHistory(t *testing.T) {
	var h hist
	a := h.acquire(0, "A", 0, 10, ResOK, 1)
	wa := h.write(a, 15, 16, ResOK)
	b := h.block(1, []string{"A", "B"}, 20, 70, ResOK, 2) // waited for A
	h.acquire(2, "B", 30, 40, ResBusy, 0)                 // B free but reserved by the waiting block
	h.release(a, 50, 60, ResOK, "")
	h.held(b, "grant", 71, 72, "A", "B")
	c := h.acquire(3, "A", 75, 120, ResOK, 3) // waited for the block
	wb := h.write(b, 80, 81, ResOK)
	h.releaseVia(b, "B", 100, 110, ResOK, "") // naming B frees A too
	h.held(b, "release", 111, 112)
	wc := h.write(c, 125, 126, ResOK)
	h.release(c, 130, 135, ResOK, "")
	d := h.acquire(4, "B", 130, 140, ResOK, 4)
	h.release(d, 150, 160, ResOK, "")
	h.block(5, []string{"C", "D"}, 200, 300, ResIndeterminate, 0)
	h.acquire(6, "D", 310, 320, ResBusy, 0) // explained by the indeterminate block's grant
	e := h.block(7, []string{"D", "C"}, 330, 340, ResOK, 6)
	h.releaseVia(e, "C", 350, 360, ResOK, "")
	store := storeLog(rec(wa, "A", true, 0), rec(wb, "A", true, 1), rec(wb, "B", true, 0), rec(wc, "A", true, 2))
	r := Check(h.ops, store, FinalState{LastToken: 6}, CheckOptions{})
	if len(r.Violations) != 0 || r.Linearizable != porcupine.Ok {
		t.Fatalf("violations %v, linearizable %s", r.Violations, r.Linearizable)
	}
	if r.BlockGrants[2] != 2 || r.BlockWrites != 1 || r.HeldChecks != 2 || r.UnknownTokens != 1 {
		t.Fatalf("block grants %v, block writes %d, held checks %d, unknown tokens %d", r.BlockGrants, r.BlockWrites, r.HeldChecks, r.UnknownTokens)
	}
	// Components: {A,B} (the block joins them) and {C,D}.
	if len(r.Components) != 2 || !strings.HasPrefix(r.Components[0], "{A,B} ") || !strings.HasPrefix(r.Components[1], "{C,D} ") {
		t.Fatalf("components %v", r.Components)
	}
}

// A block granted while one of its keys — not its primary key — was still
// held by another worker: the block held only some of its keys.
func TestCheckFindsPartialBlock(t *testing.T) {
	var h hist
	h.acquire(0, "B", 0, 10, ResOK, 1)               // lease 1 s, never released
	h.block(1, []string{"A", "B"}, 20, 30, ResOK, 2) // B still held
	got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{}))
	for _, want := range []string{"mutual-exclusion", "atomicity", "linearizability"} {
		if !strings.Contains(got, want) {
			t.Fatalf("violations %q, want %s", got, want)
		}
	}

	// The session listing only some of the block's keys under its token.
	var o hist
	b := o.block(1, []string{"A", "B", "C"}, 0, 10, ResOK, 1)
	o.held(b, "grant", 11, 12, "A", "C")
	o.releaseVia(b, "C", 20, 30, ResOK, "")
	o.held(b, "release", 31, 32, "B")
	if got := checks(Check(o.ops, nil, FinalState{}, CheckOptions{})); got != "atomicity,atomicity" {
		t.Fatalf("violations %q, want atomicity twice", got)
	}
}

// A block's fenced write accepted on one key and refused on another (the
// other key's high-water mark was already past the block's token): the
// store must decide a block's write for all its keys or none. Per key,
// each decision alone is right.
func TestCheckFindsBlockWriteAcceptedOnOneKey(t *testing.T) {
	var h hist
	b := h.block(1, []string{"A", "B"}, 0, 10, ResOK, 5)
	c := h.acquire(2, "B", 1100, 1110, ResOK, 6) // the block's lease ran out
	wc := h.write(c, 1120, 1121, ResOK)
	h.release(c, 1130, 1140, ResOK, "")
	wb := h.write(b, 2000, 2001, ResRejected) // late
	h.releaseVia(b, "A", 2010, 2020, ResError, "not_held")
	store := storeLog(rec(wc, "B", true, 0), rec(wb, "A", true, 0), rec(wb, "B", false, 6))
	r := Check(h.ops, store, FinalState{}, CheckOptions{})
	if got := checks(r); !strings.Contains(got, "atomicity") || strings.Contains(got, "mutual-exclusion") || strings.Contains(got, "linearizability") {
		t.Fatalf("violations %q, want atomicity (and no mutual-exclusion or linearizability)", got)
	}
	// All or none, refused on both, is right.
	store[1].Accepted = false
	if r := Check(h.ops, store, FinalState{}, CheckOptions{}); len(r.Violations) != 0 || r.BlockStale != 1 || r.StaleWrites != 1 {
		t.Fatalf("violations %v, block stale %d, stale %d", r.Violations, r.BlockStale, r.StaleWrites)
	}

	// A write under a single key's token that the store accepted for
	// another key too: the token never covered it.
	var o hist
	a := o.acquire(1, "A", 0, 10, ResOK, 1)
	w := o.add(Op{Worker: 1, Kind: KindWrite, Key: "A", Keys: []string{"A", "B"}, Token: 1, Acq: a.ID, Inv: 20, Cmp: 21, Result: ResOK})
	o.release(a, 30, 40, ResOK, "")
	got := checks(Check(o.ops, storeLog(rec(w, "A", true, 0), rec(w, "B", true, 0)), FinalState{}, CheckOptions{}))
	if !strings.Contains(got, "atomicity") {
		t.Fatalf("violations %q, want atomicity", got)
	}
}

// project splits every block operation into one operation per key: the
// history as a per-key checker sees it.
func project(ops []Op) []Op {
	var out []Op
	for _, op := range ops {
		if !isBlock(op) {
			out = append(out, op)
			continue
		}
		for _, k := range op.Keys {
			p := op
			p.Key, p.Keys = k, nil
			out = append(out, p)
		}
	}
	return out
}

// A block that took its keys at two different times: it needed B, held
// until 1.2 s, and its token 3 is below token 4, granted on A by 1.15 s,
// so on A it came before 1.15 s. Each key's projection is linearizable
// (on A the block's lease ran out before token 4; on B it came after the
// release), and no interval overlaps (the block's reply came after its
// lease); only the component of {A,B}, where the block is one operation
// at one instant, shows that no such instant exists.
func TestCheckFindsCrossKeyLinearizabilityViolation(t *testing.T) {
	var h hist
	b0 := h.add(Op{Worker: 3, Kind: KindAcquire, Key: "B", LeaseMs: 3000, Inv: 0, Cmp: 10, Result: ResOK, Token: 2})
	h.block(1, []string{"A", "B"}, 0, 1500, ResOK, 3)
	a := h.acquire(2, "A", 1100, 1150, ResOK, 4)
	h.release(a, 1160, 1170, ResOK, "")
	h.release(b0, 1200, 1210, ResOK, "")

	// (The projection repeats the block's token on each key, which the
	// token check rightly calls a token granted twice.)
	per := Check(project(h.ops), nil, FinalState{}, CheckOptions{})
	if got := checks(per); got != "tokens" || per.Linearizable != porcupine.Ok || per.PorcupineParts != 2 {
		t.Fatalf("per key: violations %q, linearizable %s, %d partitions", got, per.Linearizable, per.PorcupineParts)
	}
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if got := checks(r); got != "linearizability" || r.PorcupineParts != 1 {
		t.Fatalf("violations %q (%d partitions), want linearizability in one component", got, r.PorcupineParts)
	}
}

// Releasing a block by any of its keys frees every key: a BUSY on its
// other key afterwards (nobody waiting) is not linearizable.
func TestCheckBlockReleaseFreesEveryKey(t *testing.T) {
	var h hist
	b := h.block(1, []string{"A", "B"}, 0, 10, ResOK, 1)
	h.releaseVia(b, "A", 20, 30, ResOK, "")
	h.acquire(2, "B", 40, 50, ResBusy, 0)
	if got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{})); got != "linearizability" {
		t.Fatalf("violations %q, want linearizability", got)
	}
}

// Tokens must grow on each key in holding order, even between grants that
// ran concurrently (so real-time order says nothing).
func TestCheckFindsKeyTokenInversion(t *testing.T) {
	var h hist
	a := h.acquire(0, "A", 0, 100, ResOK, 2)
	h.release(a, 110, 120, ResOK, "")
	b := h.block(1, []string{"B", "A"}, 50, 130, ResOK, 1)
	h.releaseVia(b, "B", 140, 150, ResOK, "")
	if got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{})); !strings.Contains(got, "tokens") {
		t.Fatalf("violations %q, want tokens", got)
	}
}

func TestStoreBlockWrites(t *testing.T) {
	s := NewStore()
	path := filepath.Join(t.TempDir(), "s.sock")
	if err := s.Serve(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := &storeClient{path: path}
	for _, tc := range []struct {
		keys []string
		tok  uint64
		want bool
	}{
		{[]string{"a", "b"}, 3, true},
		{[]string{"b"}, 5, true},
		{[]string{"a", "b", "c"}, 4, false}, // b is at 5: none of a, b, c
		{[]string{"c"}, 1, true},
		{[]string{"c", "a"}, 6, true},
	} {
		ok, err := c.write(tc.keys, tc.tok, 1, int64(tc.tok))
		if err != nil || ok != tc.want {
			t.Fatalf("write %v %d: %v %v, want %v", tc.keys, tc.tok, ok, err, tc.want)
		}
	}
	log := s.Log()
	if len(log) != 9 {
		t.Fatalf("log has %d records", len(log))
	}
	for _, r := range log[3:6] {
		if r.Accepted || len(r.Keys) != 3 {
			t.Fatalf("the refused block write: %+v", r)
		}
	}
	if r := Check(nil, log, FinalState{}, CheckOptions{}); len(r.Violations) != 0 || r.BlockWrites != 3 || r.BlockStale != 1 {
		t.Fatalf("violations %v, block writes %d, stale %d", r.Violations, r.BlockWrites, r.BlockStale)
	}
}

// A waiting block reserves a free key only while it waits for another key
// of it that is held: a BUSY on a free key while the only block waiting on
// it has every key free is not linearizable.
func TestCheckFindsBusyThatNoWaitingBlockExplains(t *testing.T) {
	var h hist
	h.block(1, []string{"A", "B"}, 0, 100, ResTimeout, 0)
	h.acquire(2, "B", 40, 50, ResBusy, 0)
	if got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{})); got != "linearizability" {
		t.Fatalf("violations %q, want linearizability", got)
	}
	// With A held meanwhile, the block may have reserved B.
	var o hist
	a := o.acquire(0, "A", 0, 10, ResOK, 1)
	o.block(1, []string{"A", "B"}, 20, 120, ResTimeout, 0)
	o.acquire(2, "B", 40, 50, ResBusy, 0)
	o.release(a, 200, 210, ResOK, "")
	if r := Check(o.ops, nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 || r.RefusalsReach != 1 {
		t.Fatalf("violations %v, %d refusals checked on the keys blocks reach", r.Violations, r.RefusalsReach)
	}
}

// Tokens grow by one per grant: an INDETERMINATE acquire explains a BUSY
// only if a token nobody learned was issued when it could have been
// granted.
func TestCheckUsesUnlearnedTokens(t *testing.T) {
	history := func(tok uint64) []Op {
		var h hist
		a := h.acquire(0, "A", 0, 10, ResOK, 1)
		h.release(a, 20, 30, ResOK, "")
		h.acquire(1, "A", 40, 50, ResIndeterminate, 0)
		h.acquire(2, "A", 60, 70, ResBusy, 0) // A free, unless w1 got it
		b := h.acquire(3, "A", 80, 90, ResOK, tok)
		h.release(b, 100, 110, ResOK, "")
		return h.ops
	}
	// Token 2 was issued between tokens 1 and 3: w1 may have held A.
	if r := Check(history(3), nil, FinalState{LastToken: 3}, CheckOptions{}); len(r.Violations) != 0 || r.MaybeGranted != 1 || r.RefusalsUnknown != 1 {
		t.Fatalf("violations %v, maybe granted %d, explained %d", r.Violations, r.MaybeGranted, r.RefusalsUnknown)
	}
	// Without a token between them, nobody held A at 60-70 ms.
	if r := Check(history(2), nil, FinalState{LastToken: 2}, CheckOptions{}); checks(r) != "linearizability" || r.MaybeGranted != 0 {
		t.Fatalf("violations %q, maybe granted %d, want linearizability", checks(r), r.MaybeGranted)
	}
	// A token issued after token 2 (so granted after 80 ms) explains
	// nothing at 60-70 ms either.
	if r := Check(history(2), nil, FinalState{LastToken: 3}, CheckOptions{}); checks(r) != "linearizability" || r.MaybeGranted != 1 {
		t.Fatalf("violations %q, maybe granted %d, want linearizability", checks(r), r.MaybeGranted)
	}
	// Without a final token count, w1 may have been granted any time.
	if r := Check(history(2), nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 {
		t.Fatalf("violations %v", r.Violations)
	}
}

// A TIMEOUT takes effect when its wait has run out: a key released long
// before that and not taken again would have gone to the waiter.
func TestCheckTimeoutAtTheEndOfItsWait(t *testing.T) {
	var h hist
	a := h.acquire(0, "A", 0, 10, ResOK, 1)
	h.add(Op{Worker: 1, Kind: KindAcquire, Key: "A", LeaseMs: 1000, WaitMs: 500, Inv: 20, Cmp: 530, Result: ResTimeout})
	h.release(a, 100, 110, ResOK, "")
	if got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{})); got != "linearizability" {
		t.Fatalf("violations %q, want linearizability", got)
	}
	// A leader handing over its leadership withdraws waiters early; the
	// nemesis does that only around a replaced node.
	h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultReplace, Inv: 600, Cmp: 700})
	if r := Check(h.ops, nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 {
		t.Fatalf("violations %v", r.Violations)
	}
}

// ---- issue 19: extended leases and the lost signal ----

func (h *hist) extend(a Op, inv, cmp int64, res, code string) Op {
	return h.add(Op{Worker: a.Worker, Conn: a.Conn, Kind: KindExtend, Key: a.Key, Token: a.Token, Acq: a.ID, LeaseMs: 1000,
		Inv: inv, Cmp: cmp, Result: res, Err: code})
}

func (h *hist) lost(a Op, reason string, at int64) Op {
	return h.add(Op{Worker: a.Worker, Conn: a.Conn, Kind: KindLost, Key: a.Key, Token: a.Token, Reason: reason, Inv: at, Cmp: at})
}

// extendedHistory: w0 holds k from 10 ms and extends twice (at 600 and
// 1400 ms, 1 s each), so its lease cannot end before 2400 ms; w1 waits
// and is handed k at 2450 ms; w0 reads `! LOST expired` at 2460 ms, then
// its RELEASE is answered not_held.
func extendedHistory() (*hist, Op, Op) {
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 1)
	h.extend(a, 600, 610, ResOK, "")
	h.extend(a, 1400, 1410, ResOK, "")
	b := h.add(Op{Worker: 1, Kind: KindAcquire, Key: "k", LeaseMs: 1000, WaitMs: 3000, Inv: 100, Cmp: 2450, Result: ResOK, Token: 2})
	h.lost(a, "expired", 2460)
	h.release(a, 2600, 2601, ResError, "not_held")
	h.release(b, 2700, 2710, ResOK, "")
	return &h, a, b
}

func TestCheckAcceptsAGoodExtendHistory(t *testing.T) {
	h, _, _ := extendedHistory()
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if len(r.Violations) != 0 || r.Linearizable != porcupine.Ok {
		t.Fatalf("violations %v, linearizable %s", r.Violations, r.Linearizable)
	}
	if r.Extends != 2 || r.LostEvents["expired"] != 1 || r.LostChecked != 1 || r.LostMaxLag != 10*time.Millisecond {
		t.Fatalf("extends %d, lost %v, checked %d, max lag %v", r.Extends, r.LostEvents, r.LostChecked, r.LostMaxLag)
	}
}

// The next holder's grant inside the extended lease (after the grant's
// own lease) is an overlap: the extension counts. Without the EXTEND the
// same grant is legal.
func TestCheckFindsOverlapInsideAnExtendedLease(t *testing.T) {
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 1)
	h.extend(a, 600, 610, ResOK, "") // the lease runs to 1600 at least
	h.add(Op{Worker: 1, Kind: KindAcquire, Key: "k", LeaseMs: 3000, WaitMs: 3000, Inv: 100, Cmp: 1200, Result: ResOK, Token: 2})
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if got := checks(r); !strings.Contains(got, "mutual-exclusion") || !strings.Contains(got, "linearizability") {
		t.Fatalf("violations %q", got)
	}
	var without []Op
	for _, op := range h.ops {
		if op.Kind != KindExtend {
			without = append(without, op)
		}
	}
	if r := Check(without, nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 {
		t.Fatalf("without the EXTEND: %v", r.Violations)
	}
	// An EXTEND that was refused renews nothing: legal again.
	h.ops[1].Result, h.ops[1].Err = ResError, "not_held"
	h.add(Op{Worker: 0, Kind: KindLost, Key: "k", Token: 1, Reason: "moved", Inv: 605, Cmp: 605})
	if r := Check(h.ops, nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 {
		t.Fatalf("with a refused EXTEND: %v", r.Violations)
	}
}

// An INDETERMINATE EXTEND may have set a shorter lease from its send:
// the earliest end is the earlier of the two bounds.
func TestLeaseEndsWithAnIndeterminateExtend(t *testing.T) {
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 1)
	h.extend(a, 600, 610, ResOK, "")
	e := h.extend(a, 700, 5700, ResIndeterminate, "")
	h.ops[len(h.ops)-1].LeaseMs = 200
	got := leaseEnds(h.ops, []Op{a})[a.ID]
	if want := e.Inv + 200*ms; got != want {
		t.Fatalf("lease end %d, want %d", got, want)
	}
}

func TestCheckFindsALateLostEvent(t *testing.T) {
	h, a, _ := extendedHistory()
	for i := range h.ops {
		if h.ops[i].Kind == KindLost {
			h.ops[i].Inv, h.ops[i].Cmp = 5000*ms, 5000*ms // 2.55 s after the next grant
		}
	}
	h.ops[len(h.ops)-2].Inv, h.ops[len(h.ops)-2].Cmp = 5100*ms, 5101*ms // the RELEASE after it
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if got := checks(r); got != "lost-signal" {
		t.Fatalf("violations %q: %v", got, r.Violations)
	}
	// The same lag while the holder's process was stopped is not checked.
	h.add(Op{Kind: KindFault, Fault: FaultPauseWorker, Worker: -1, Target: workerName(a.Worker), Inv: 2000, Cmp: 4900})
	r = Check(h.ops, nil, FinalState{}, CheckOptions{})
	if len(r.Violations) != 0 || r.LostExempt != 1 || r.LostChecked != 0 {
		t.Fatalf("violations %v, exempt %d, checked %d", r.Violations, r.LostExempt, r.LostChecked)
	}
}

// A holder that read its own grant only after its lease had run out by
// its own clock owes no lost signal ahead of the next holder: a resume
// answered the recorded grant late, after the holding had expired and
// been handed on, so X went out before the holder's sidecar could take it
// (seed 3940, 5 nodes: w1 read OK 0.8 s after the next holder's grant and
// `! LOST` 7.1 s after it). A holder that read its grant in time still
// owes it.
func TestCheckExemptsAGrantReadAfterItsOwnLease(t *testing.T) {
	var h hist
	a := h.acquire(0, "k", 0, 1500, ResOK, 1) // lease 1 s from 0: over at 1000
	b := h.add(Op{Worker: 1, Kind: KindAcquire, Key: "k", LeaseMs: 1000, WaitMs: 3000, Inv: 100, Cmp: 1200, Result: ResOK, Token: 2})
	h.lost(a, "expired", 5000)
	h.release(a, 5100, 5101, ResError, "not_held")
	h.release(b, 5200, 5210, ResError, "not_held")
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if len(r.Violations) != 0 || r.LostExempt != 1 || r.LostChecked != 0 {
		t.Fatalf("violations %v, exempt %d, checked %d", r.Violations, r.LostExempt, r.LostChecked)
	}
	h.ops[0].Cmp = 900 * ms // read in time: the lag counts again
	if got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{})); !strings.Contains(got, "lost-signal") {
		t.Fatalf("violations %q, want lost-signal", got)
	}
}

func TestCheckFindsAnEarlyLostEvent(t *testing.T) {
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 1)
	h.extend(a, 600, 610, ResOK, "")
	h.lost(a, "expired", 1200) // the extended lease runs to 1600
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if got := checks(r); got != "lost-signal" {
		t.Fatalf("violations %q: %v", got, r.Violations)
	}
}

// The session rules: no OK to an EXTEND or RELEASE of a lock after its
// `! LOST`, one event per lock, a refused EXTEND told first, `moved`
// only inside a refused EXTEND, events only for the session's own grants.
func TestCheckFindsLostSignalSessionViolations(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(h *hist, a Op)
	}{
		{"extend ok after the event", func(h *hist, a Op) {
			h.lost(a, "expired", 1000)
			h.extend(a, 1005, 1010, ResOK, "")
		}},
		{"release ok after the event", func(h *hist, a Op) {
			h.lost(a, "expired", 1000)
			h.release(a, 1005, 1010, ResOK, "")
		}},
		{"two events", func(h *hist, a Op) {
			h.lost(a, "expired", 1000)
			h.lost(a, "expired", 1001)
		}},
		{"refused extend without an event", func(h *hist, a Op) {
			h.extend(a, 1100, 1110, ResError, "not_held")
		}},
		{"moved outside a refused extend", func(h *hist, a Op) {
			h.extend(a, 1100, 1110, ResError, "token_mismatch")
			h.lost(a, "moved", 1120)
		}},
		{"an event for another session", func(h *hist, a Op) {
			ev := h.lost(a, "expired", 1000)
			h.ops[len(h.ops)-1].Conn = ev.Conn + 1
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hist
			a := h.acquire(0, "k", 0, 10, ResOK, 1)
			tc.build(&h, a)
			r := Check(h.ops, nil, FinalState{}, CheckOptions{})
			if got := checks(r); !strings.Contains(got, "lost-signal") {
				t.Fatalf("violations %q", got)
			}
		})
	}
	// And the legal forms: a refused EXTEND after the event (answered at
	// once) or with `moved` inside it.
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 1)
	h.lost(a, "expired", 1000)
	h.extend(a, 1100, 1101, ResError, "not_held")
	b := h.acquire(0, "j", 2000, 2010, ResOK, 2)
	h.extend(b, 3100, 3110, ResError, "not_held")
	h.lost(b, "moved", 3109)
	if r := Check(h.ops, nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 {
		t.Fatalf("violations %v", r.Violations)
	}
}

// longHistory is a clean history of n acquire/release cycles of one key,
// one after the other: linearizable, and long enough that porcupine needs
// far more than a microsecond for it.
func longHistory(n int) []Op {
	var h hist
	for i := 0; i < n; i++ {
		t0 := int64(i) * 10
		a := h.acquire(i%7, "k", t0, t0+2, ResOK, uint64(i+1))
		h.release(a, t0+4, t0+6, ResOK, "")
	}
	return h.ops
}

// porcupine's Unknown (its search ran out of time) proves nothing: the
// run is inconclusive, not a pass, though nothing was violated.
func TestCheckUnknownIsInconclusive(t *testing.T) {
	ops := longHistory(5000)
	r := Check(ops, nil, FinalState{}, CheckOptions{LinearizeTimeout: time.Nanosecond})
	if r.Linearizable != porcupine.Unknown {
		t.Fatalf("linearizability %s with a 1 ns budget, want Unknown", r.Linearizable)
	}
	if len(r.Violations) != 0 {
		t.Fatalf("violations %v: the history is clean", r.Violations)
	}
	if len(r.Inconclusive) != 1 || !strings.Contains(r.Inconclusive[0], "linearizability Unknown") {
		t.Fatalf("inconclusive %q, want porcupine's Unknown", r.Inconclusive)
	}
	// The same history with the budget to finish is proven.
	r = Check(ops, nil, FinalState{}, CheckOptions{})
	if r.Linearizable != porcupine.Ok || len(r.Violations) != 0 || len(r.Inconclusive) != 0 {
		t.Fatalf("with time: linearizability %s, violations %v, inconclusive %q", r.Linearizable, r.Violations, r.Inconclusive)
	}
}

// The share of indeterminate acquires is reported, and above its bound
// the history is inconclusive.
func TestCheckBoundsIndeterminateShare(t *testing.T) {
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 1)
	h.release(a, 20, 30, ResOK, "")
	h.acquire(1, "k", 40, 50, ResIndeterminate, 0)
	h.acquire(2, "k", 3000, 3010, ResTimeout, 0) // the indeterminate grant may hold k
	h.acquire(3, "k", 3020, 3030, ResIndeterminate, 0)
	h.acquire(4, "k", 3040, 3050, ResIndeterminate, 0)
	// 3 of 5 acquires indeterminate: 60 %.
	for _, tc := range []struct {
		max          float64
		inconclusive bool
	}{
		{0, true}, // the default, 20 %
		{0.5, true},
		{0.6, false},
		{-1, false}, // no bound
	} {
		r := Check(h.ops, nil, FinalState{}, CheckOptions{MaxIndeterminateShare: tc.max})
		if r.Acquires != 5 || r.Indeterminate != 3 || r.IndeterminateShare != 0.6 {
			t.Fatalf("acquires %d, indeterminate %d, share %v; want 5, 3, 0.6", r.Acquires, r.Indeterminate, r.IndeterminateShare)
		}
		if len(r.Violations) != 0 {
			t.Fatalf("violations %v", r.Violations)
		}
		if got := len(r.Inconclusive) > 0; got != tc.inconclusive {
			t.Errorf("bound %v: inconclusive %q, want inconclusive %v", tc.max, r.Inconclusive, tc.inconclusive)
		}
	}
}

// ---- issue 31: per-key FIFO across leader changes ----

// waiter adds an acquire of key by w that waited: sent at inv, its
// `! QUEUED` read at queued (0: none), answered at cmp.
func (h *hist) waiter(w int, key string, inv, queued, cmp int64, waitMs int64, res string, tok uint64) Op {
	return h.add(Op{Worker: w, Kind: KindAcquire, Key: key, LeaseMs: 1000, WaitMs: waitMs, Inv: inv, Cmp: cmp, Queued: queued * ms,
		Result: res, Token: tok})
}

// line is a holder of k and three waiters queued behind it one by one
// (each event read before the next is sent), the holder releasing at
// relAt; the waiters are granted the tokens toks, in token order at
// grantAt, +20 ms, +40 ms, each releasing at once.
func fifoHistory(relAt, grantAt int64, toks [3]uint64) *hist {
	var h hist
	a := h.acquire(0, "k", 0, 10, ResOK, 1)
	at := func(tok uint64) int64 { // the grant of the tok-th smallest token
		rank := int64(0)
		for _, t := range toks {
			if t < tok {
				rank++
			}
		}
		return grantAt + 20*rank
	}
	var ws []Op
	for i, tok := range toks {
		ws = append(ws, h.waiter(i+1, "k", 20+10*int64(i), 25+10*int64(i), at(tok), 5000, ResOK, tok))
	}
	h.release(a, relAt, relAt+5, ResOK, "")
	for _, w := range ws {
		h.release(w, at(w.Token)+5, at(w.Token)+10, ResOK, "")
	}
	return &h
}

func TestCheckFIFOAcceptsTheQueueOrder(t *testing.T) {
	h := fifoHistory(100, 110, [3]uint64{2, 3, 4})
	r := Check(h.ops, nil, FinalState{LastToken: 4}, CheckOptions{})
	if len(r.Violations) != 0 || r.Linearizable != porcupine.Ok {
		t.Fatalf("violations %v, linearizable %s", r.Violations, r.Linearizable)
	}
	// w2's grant is checked against w1, w3's against w1 and w2.
	if r.Queued != 3 || r.QueuedGranted != 3 || r.FIFOChecked != 2 || r.QueuedThroughLeaderChange != 0 {
		t.Fatalf("queued %d granted %d checked %d through a leader change %d", r.Queued, r.QueuedGranted, r.FIFOChecked, r.QueuedThroughLeaderChange)
	}
}

// w3, queued last, is granted before w2: it overtook a waiter still in
// line. Nothing else is wrong with the history: each grant followed a
// release, tokens grow, and the lock model alone accepts it.
func TestCheckFIFOFindsAnOvertake(t *testing.T) {
	h := fifoHistory(100, 110, [3]uint64{2, 4, 3})
	if got := checks(Check(h.ops, nil, FinalState{LastToken: 4}, CheckOptions{})); got != "fifo" {
		t.Fatalf("violations %q, want fifo", got)
	}
}

// The leader dies while the line waits (a fault between the QUEUED events
// and the grants): a new leader that kept the queue grants in the queue
// order, which passes; one whose grants overtake fails. A waiter the new
// leader dropped (INDETERMINATE: a leader without sessions) has left the
// line, and the ones behind it may go first.
func TestCheckFIFOAcrossALeaderChange(t *testing.T) {
	kill := Op{Worker: -1, Kind: KindFault, Fault: FaultKillLeader, Target: "n1", Inv: 60, Cmp: 1500}
	h := fifoHistory(2000, 2010, [3]uint64{2, 3, 4})
	h.add(kill)
	r := Check(h.ops, nil, FinalState{LastToken: 4}, CheckOptions{})
	if len(r.Violations) != 0 || r.QueuedThroughLeaderChange != 3 {
		t.Fatalf("violations %v, %d waiters kept their place through the leader change", r.Violations, r.QueuedThroughLeaderChange)
	}

	h = fifoHistory(2000, 2010, [3]uint64{3, 2, 4})
	h.add(kill)
	if got := checks(Check(h.ops, nil, FinalState{LastToken: 4}, CheckOptions{})); got != "fifo" {
		t.Fatalf("violations %q, want fifo", got)
	}

	var d hist
	a := d.acquire(0, "k", 0, 10, ResOK, 1)
	d.waiter(1, "k", 20, 25, 1600, 5000, ResIndeterminate, 0) // dropped by the new leader
	w2 := d.waiter(2, "k", 30, 35, 2010, 5000, ResOK, 2)
	d.add(kill)
	d.release(a, 2000, 2005, ResOK, "")
	d.release(w2, 2015, 2020, ResOK, "")
	if r := Check(d.ops, nil, FinalState{LastToken: 2}, CheckOptions{}); len(r.Violations) != 0 || r.Queued != 2 || r.FIFOChecked != 1 {
		t.Fatalf("violations %v, queued %d, checked %d", r.Violations, r.Queued, r.FIFOChecked)
	}
}

// A waiter that timed out left the line only when its wait ran out: a
// later-queued waiter granted before that overtook it. Not judged when a
// clock fault overlapped its wait (a new leader re-arms the wait from a
// stamp of the shifted clock).
func TestCheckFIFOTimeoutStillInLine(t *testing.T) {
	build := func(fault string) []Op {
		var h hist
		a := h.acquire(0, "k", 0, 10, ResOK, 1)
		h.waiter(1, "k", 20, 25, 520, 500, ResTimeout, 0)
		w2 := h.waiter(2, "k", 30, 35, 310, 2000, ResOK, 2) // granted while w1 waited
		h.release(a, 300, 305, ResOK, "")
		h.release(w2, 600, 610, ResOK, "") // (held through w1's TIMEOUT, which the lock model alone accepts)
		if fault != "" {
			h.add(Op{Worker: -1, Kind: KindFault, Fault: fault, Target: "n1", Inv: 0, Cmp: 100})
		}
		return h.ops
	}
	if got := checks(Check(build(""), nil, FinalState{LastToken: 2}, CheckOptions{})); got != "fifo" {
		t.Fatalf("violations %q, want fifo", got)
	}
	if r := Check(build(FaultClockBackward), nil, FinalState{LastToken: 2}, CheckOptions{}); strings.Contains(checks(r), "fifo") {
		t.Fatalf("violations %v with a clock fault during the wait", r.Violations)
	}
}

// ---- issue 31: a killed sidecar ----

// killedSidecar: w1 holds k through sidecar 1 (lease 1 s from 0 ms), the
// sidecar is killed at 100 ms and restarted at 1500 ms, and w1 sees its
// session end at 150 ms; w2 takes k through sidecar 2 at nextAt.
func killedSidecar(nextAt int64, withFault bool) []Op {
	var h hist
	a := h.add(Op{Worker: 1, Sidecar: 1, Kind: KindAcquire, Key: "k", LeaseMs: 1000, Inv: 0, Cmp: 10, Result: ResOK, Token: 1})
	if withFault {
		h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultKillSidecar, Target: "sidecar1", Sidecar: 1, Inv: 100, Cmp: 1500})
	}
	h.add(Op{Worker: 1, Sidecar: 1, Kind: KindRelease, Key: "k", Token: 1, Acq: a.ID, Inv: 140, Cmp: 150, Result: ResIndeterminate, Err: "closed"})
	h.add(Op{Worker: 1, Sidecar: 1, Kind: KindClose, Inv: 10, Cmp: 150})
	b := h.add(Op{Worker: 2, Sidecar: 2, Kind: KindAcquire, Key: "k", LeaseMs: 1000, WaitMs: 2000, Inv: 120, Cmp: nextAt, Result: ResOK, Token: 2})
	h.add(Op{Worker: 2, Sidecar: 2, Kind: KindRelease, Key: "k", Token: 2, Acq: b.ID, Inv: nextAt + 10, Cmp: nextAt + 20, Result: ResOK})
	return h.ops
}

// The holding of a killed sidecar's worker keeps its lease: the close the
// worker saw did not release it (the sidecar was dead), so a grant of its
// key to another sidecar's worker before the lease's end is a violation.
// The worker's release was sent at 140 ms, after the kill, into a dead
// connection (INDETERMINATE): it ends nothing earlier than its send. Its
// in-flight release is counted. Without the kill (a close the sidecar
// handled), the same history passes.
func TestCheckKilledSidecarHoldingKeepsItsLease(t *testing.T) {
	if r := Check(killedSidecar(300, false), nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 {
		t.Fatalf("a closed session's holding: violations %v", r.Violations)
	}
	// The release at 140 ms may have ended it: from then on k may go on.
	if r := Check(killedSidecar(300, true), nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 || r.SidecarKills != 1 || r.KilledHoldings != 1 {
		t.Fatalf("violations %v, kills %d, holdings %d", r.Violations, r.SidecarKills, r.KilledHoldings)
	}
	// Without that release, only the lease ends it.
	drop := func(ops []Op) []Op {
		var out []Op
		for _, op := range ops {
			if !(op.Kind == KindRelease && op.Worker == 1) {
				out = append(out, op)
			}
		}
		return out
	}
	got := checks(Check(drop(killedSidecar(300, true)), nil, FinalState{}, CheckOptions{}))
	if !strings.Contains(got, "mutual-exclusion") || !strings.Contains(got, "linearizability") {
		t.Fatalf("violations %q, want mutual-exclusion and linearizability", got)
	}
	if r := Check(drop(killedSidecar(1100, true)), nil, FinalState{}, CheckOptions{}); len(r.Violations) != 0 {
		t.Fatalf("a grant after the lease's end: violations %v", r.Violations)
	}
}

// A request in flight at a sidecar's kill is never answered, nor is one
// sent while it is down: its worker sees INDETERMINATE. A grant the
// cluster made to it is never used: a write under a token the worker was
// not granted is refused by the fencing and no-leak checks.
func TestCheckKilledSidecarAnswersNothing(t *testing.T) {
	build := func(res string, tok uint64, sentAt int64) []Op {
		var h hist
		h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultKillSidecar, Target: "sidecar1", Sidecar: 1, Inv: 100, Cmp: 1500})
		a := h.add(Op{Worker: 1, Sidecar: 1, Kind: KindAcquire, Key: "k", LeaseMs: 1000, WaitMs: 5000, Inv: sentAt, Cmp: 4000, Result: res, Token: tok})
		if res == ResOK {
			h.add(Op{Worker: 1, Sidecar: 1, Kind: KindRelease, Key: "k", Token: tok, Acq: a.ID, Inv: 4010, Cmp: 4020, Result: ResOK})
		}
		return h.ops
	}
	r := Check(build(ResIndeterminate, 0, 50), nil, FinalState{}, CheckOptions{})
	if len(r.Violations) != 0 || r.KilledInFlight != 1 {
		t.Fatalf("violations %v, in flight %d", r.Violations, r.KilledInFlight)
	}
	for _, sent := range []int64{50, 200} {
		if got := checks(Check(build(ResOK, 1, sent), nil, FinalState{}, CheckOptions{})); got != "dead-sidecar" {
			t.Fatalf("answered OK, sent at %d ms: violations %q, want dead-sidecar", sent, got)
		}
	}
	var h hist
	h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultKillSidecar, Target: "sidecar1", Sidecar: 1, Inv: 100, Cmp: 1500})
	a := h.add(Op{Worker: 1, Sidecar: 1, Kind: KindAcquire, Key: "k", LeaseMs: 1000, WaitMs: 5000, Inv: 50, Cmp: 150, Result: ResIndeterminate})
	h.add(Op{Worker: 1, Sidecar: 1, Kind: KindWrite, Key: "k", Token: 1, Acq: a.ID, Inv: 200, Cmp: 210, Result: ResOK})
	store := []StoreRec{{Key: "k", Token: 1, Accepted: true}}
	if got := checks(Check(h.ops, store, FinalState{LastToken: 1}, CheckOptions{})); !strings.Contains(got, "no-leak") {
		t.Fatalf("violations %q, want no-leak", got)
	}
}

// ---- issue 31: where the INDETERMINATE outcomes fall ----

// A leader kill opens a window per sidecar that its workers' first grant
// of an acquire sent after the kill closes; a killed sidecar's requests in
// flight are its own kind; the rest is outside.
func TestCheckSplitsIndeterminateOutcomes(t *testing.T) {
	var h hist
	h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultKillLeader, Target: "n1", Inv: 100, Cmp: 1500})
	h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultKillSidecar, Target: "sidecar2", Sidecar: 2, Inv: 5000, Cmp: 6000})
	acq := func(w, sc int, key string, inv, cmp int64, res string, tok uint64) Op {
		return h.add(Op{Worker: w, Sidecar: sc, Kind: KindAcquire, Key: key, LeaseMs: 1000, Inv: inv, Cmp: cmp, Result: res, Token: tok})
	}
	// Sidecar 1 serves again at 1800, sidecar 2 at 2200.
	g1 := acq(1, 1, "a", 200, 1800, ResOK, 1)
	g2 := acq(2, 2, "b", 300, 2200, ResOK, 2)
	h.release(g1, 1900, 1910, ResOK, "")
	h.release(g2, 2300, 2310, ResOK, "")
	acq(3, 1, "c", 50, 1200, ResIndeterminate, 0)   // sidecar 1, inside its window
	acq(4, 1, "c", 1000, 2000, ResIndeterminate, 0) // sidecar 1, after its window
	acq(5, 2, "d", 1000, 2000, ResIndeterminate, 0) // sidecar 2, inside its window
	acq(6, 2, "d", 4000, 5100, ResIndeterminate, 0) // in flight at sidecar 2's kill
	h.add(Op{Worker: 7, Sidecar: 1, Kind: KindRelease, Key: "e", Token: 9, Inv: 3000, Cmp: 3100, Result: ResIndeterminate})
	h.add(Op{Worker: -1, Kind: KindEnd, Inv: 8000, Cmp: 8000})
	acq(8, 1, "f", 7500, 8010, ResIndeterminate, 0) // its worker stopped waiting
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if len(r.Violations) != 0 {
		t.Fatalf("violations %v", r.Violations)
	}
	want := IndeterminateSplit{NoLeader: 2, DeadSidecar: 1, Stopped: 1, Outside: 1}
	if r.IndeterminateAcquires != want || r.IndeterminateOthers != (IndeterminateSplit{Outside: 1}) {
		t.Fatalf("acquires %+v (want %+v), others %+v", r.IndeterminateAcquires, want, r.IndeterminateOthers)
	}
	// The windows [100, 1800] and [100, 2200]: 2.1 s in all.
	if r.NoLeaderWindows != 1 || r.NoLeaderTime != 2100*time.Millisecond {
		t.Fatalf("%d windows, %v", r.NoLeaderWindows, r.NoLeaderTime)
	}
}

// A wiped quorum takes service away only after its partition phase, so a
// grant within the fault does not close its window: an INDETERMINATE
// acquire answered late in the fault counts as without a leader; one
// answered after the first grant sent after the fault ended is outside.
func TestCheckSplitsIndeterminateOfAPhasedFault(t *testing.T) {
	var h hist
	h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultWipeQuorum, Target: "n2", Inv: 100, Cmp: 10000})
	acq := func(w int, key string, inv, cmp int64, res string, tok uint64) Op {
		return h.add(Op{Worker: w, Sidecar: 1, Kind: KindAcquire, Key: key, LeaseMs: 1000, Inv: inv, Cmp: cmp, Result: res, Token: tok})
	}
	g1 := acq(1, "a", 200, 300, ResOK, 1) // the partition phase: the majority serves
	h.release(g1, 400, 410, ResOK, "")
	acq(2, "b", 5000, 7000, ResIndeterminate, 0) // the majority died meanwhile
	g2 := acq(3, "a", 10100, 10500, ResOK, 2)    // served again after the fault
	h.release(g2, 10600, 10610, ResOK, "")
	acq(4, "c", 10700, 11000, ResIndeterminate, 0)
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if len(r.Violations) != 0 {
		t.Fatalf("violations %v", r.Violations)
	}
	if want := (IndeterminateSplit{NoLeader: 1, Outside: 1}); r.IndeterminateAcquires != want {
		t.Fatalf("acquires %+v, want %+v", r.IndeterminateAcquires, want)
	}
}

// BUSY and TIMEOUT are judged strictly wherever no INDETERMINATE acquire
// may have held their keys: an INDETERMINATE acquire of the same key long
// before (past its window) weakens nothing, and a BUSY of a free key is a
// violation.
func TestCheckJudgesBusyStrictlyAwayFromIndeterminates(t *testing.T) {
	var h hist
	h.acquire(1, "k", 0, 10, ResIndeterminate, 0)
	a := h.acquire(2, "k", 5000, 5010, ResOK, 2)
	h.release(a, 5020, 5030, ResOK, "")
	h.acquire(3, "k", 6000, 6010, ResBusy, 0)
	r := Check(h.ops, nil, FinalState{}, CheckOptions{IndeterminateWindow: time.Second})
	if checks(r) != "linearizability" || r.RefusalsUnknown != 0 {
		t.Fatalf("violations %q, %d refusals accepted in any state", checks(r), r.RefusalsUnknown)
	}
}

// ---- issue 39: false alarms of a 3-node wal run (seed 611893) ----

// A worker paused while its block acquire waited: the block was granted
// and its lease ran out during the pause, so HELD on waking lists none of
// its keys. That is still all or none; a partial listing is not, however
// late.
func TestCheckHeldNoneAfterTheLeaseMayHaveLapsed(t *testing.T) {
	var h hist
	b := h.block(1, []string{"A", "B"}, 0, 500, ResOK, 1) // lease 1 s
	h.held(b, "grant", 600, 1700)                         // answered after the lease may have run out
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if len(r.Violations) != 0 || r.HeldLapsed != 1 {
		t.Fatalf("violations %v, %d lapsed, want none and 1", r.Violations, r.HeldLapsed)
	}
	var o hist
	c := o.block(1, []string{"A", "B"}, 0, 500, ResOK, 1)
	o.held(c, "grant", 600, 1700, "A") // partial: never
	if got := checks(Check(o.ops, nil, FinalState{}, CheckOptions{})); got != "atomicity" {
		t.Fatalf("violations %q, want atomicity", got)
	}
	var q hist
	d := q.block(1, []string{"A", "B"}, 0, 500, ResOK, 1)
	q.held(d, "grant", 501, 502) // none while the lease surely runs
	if got := checks(Check(q.ops, nil, FinalState{}, CheckOptions{})); got != "atomicity" {
		t.Fatalf("violations %q, want atomicity", got)
	}
}

// An INDETERMINATE whose connection to a killed sidecar was seen dead 1 ms
// before the kill's recorded start counts as killed, not outside.
func TestCheckSplitsIndeterminateJustBeforeASidecarKill(t *testing.T) {
	var h hist
	h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultKillSidecar, Target: "sidecar1", Sidecar: 1, Inv: 5000, Cmp: 6000})
	h.add(Op{Worker: 1, Sidecar: 1, Kind: KindAcquire, Key: "k", LeaseMs: 1000, WaitMs: 2000, Inv: 4000, Cmp: 4999, Result: ResIndeterminate})
	h.add(Op{Worker: 2, Sidecar: 1, Kind: KindAcquire, Key: "j", LeaseMs: 1000, WaitMs: 2000, Inv: 1000, Cmp: 2000, Result: ResIndeterminate})
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if len(r.Violations) != 0 {
		t.Fatalf("violations %v", r.Violations)
	}
	if want := (IndeterminateSplit{DeadSidecar: 1, Outside: 1}); r.IndeterminateAcquires != want {
		t.Fatalf("acquires %+v, want %+v", r.IndeterminateAcquires, want)
	}
}

// A stopped sidecar's requests in flight count with a killed sidecar's.
func TestCheckSplitsIndeterminateOfAStoppedSidecar(t *testing.T) {
	var h hist
	h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultStopSidecar, Target: "sidecar1", Sidecar: 1, Inv: 5000, Cmp: 6000})
	h.add(Op{Worker: 1, Sidecar: 1, Kind: KindAcquire, Key: "k", LeaseMs: 1000, WaitMs: 2000, Inv: 4000, Cmp: 5003, Result: ResIndeterminate})
	r := Check(h.ops, nil, FinalState{}, CheckOptions{})
	if want := (IndeterminateSplit{DeadSidecar: 1}); len(r.Violations) != 0 || r.IndeterminateAcquires != want || r.SidecarKills != 0 {
		t.Fatalf("violations %v, acquires %+v (want %+v), %d kills", r.Violations, r.IndeterminateAcquires, want, r.SidecarKills)
	}
}

// A holding delivered through a sidecar just before it was cut off with
// the old leader keeps its lease, whatever its worker saw: a grant of the
// key to another caller inside it is two holders.
func TestCheckPartitionedSidecarHoldingKeepsItsLease(t *testing.T) {
	var h hist
	a := h.add(Op{Worker: 1, Sidecar: 1, Kind: KindAcquire, Key: "k", LeaseMs: 3000, Inv: 0, Cmp: 10, Result: ResOK, Token: 1})
	h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultPartitionSidecar, Target: "sidecar1", Sidecar: 1, Inv: 20, Cmp: 2000})
	h.add(Op{Worker: 1, Sidecar: 1, Kind: KindClose, Inv: 10, Cmp: 1500}) // its session ended on the new leader
	h.add(Op{Worker: 2, Sidecar: 2, Kind: KindAcquire, Key: "k", LeaseMs: 1000, Inv: 1600, Cmp: 1700, Result: ResOK, Token: 2})
	got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{}))
	if !strings.Contains(got, "mutual-exclusion") {
		t.Fatalf("violations %q, want mutual-exclusion", got)
	}
	_ = a
	// Without the partition the close ends the holding: no violation.
	var o hist
	o.add(Op{Worker: 1, Sidecar: 1, Kind: KindAcquire, Key: "k", LeaseMs: 3000, Inv: 0, Cmp: 10, Result: ResOK, Token: 1})
	o.add(Op{Worker: 1, Sidecar: 1, Kind: KindClose, Inv: 10, Cmp: 1500})
	o.add(Op{Worker: 2, Sidecar: 2, Kind: KindAcquire, Key: "k", LeaseMs: 1000, Inv: 1600, Cmp: 1700, Result: ResOK, Token: 2})
	if got := checks(Check(o.ops, nil, FinalState{}, CheckOptions{})); strings.Contains(got, "mutual-exclusion") {
		t.Fatalf("violations %q without the partition", got)
	}
}

// A waiter with a short lease and a long wait, sent after a holder's grant
// was read and granted inside that holding: two holders, though the
// waiter's own conservative interval (invocation + lease) is empty.
func TestCheckFindsAWaiterGrantedInsideAHolding(t *testing.T) {
	var h hist
	a := h.add(Op{Worker: 1, Kind: KindAcquire, Key: "k", LeaseMs: 25000, Inv: 0, Cmp: 10, Result: ResOK, Token: 1})
	b := h.add(Op{Worker: 2, Kind: KindAcquire, Key: "k", LeaseMs: 1000, WaitMs: 40000, Inv: 20, Cmp: 12000, Result: ResOK, Token: 2})
	h.release(b, 12001, 12002, ResOK, "")
	h.release(a, 15000, 15010, ResError, "not_held")
	if got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{})); !strings.Contains(got, "mutual-exclusion") {
		t.Fatalf("violations %q, want mutual-exclusion", got)
	}
	// Granted after the holder's release was sent: one holder at a time.
	var o hist
	a = o.add(Op{Worker: 1, Kind: KindAcquire, Key: "k", LeaseMs: 25000, Inv: 0, Cmp: 10, Result: ResOK, Token: 1})
	b = o.add(Op{Worker: 2, Kind: KindAcquire, Key: "k", LeaseMs: 1000, WaitMs: 40000, Inv: 20, Cmp: 15020, Result: ResOK, Token: 2})
	o.release(a, 15000, 15010, ResOK, "")
	o.release(b, 15021, 15022, ResOK, "")
	if got := checks(Check(o.ops, nil, FinalState{}, CheckOptions{})); got != "" {
		t.Fatalf("violations %q, want none", got)
	}
}

// An operator's revoke (the FaultRevoke nemesis) ends a holding when it
// applies: the next holder granted after it is no second holder, for the
// mutual-exclusion check and for the linearizability model; a revoke the
// cluster refused ends nothing.
func TestCheckRevokeEndsTheHolding(t *testing.T) {
	for _, res := range []string{ResOK, ResIndeterminate, ResError} {
		var h hist
		a := h.acquire(0, "k", 0, 10, ResOK, 1)
		h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultRevoke, Key: "k", Token: 1, Acq: a.ID, Inv: 50, Cmp: 60, Result: res})
		h.acquire(1, "k", 55, 70, ResOK, 2) // granted by the revoke's commit
		got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{}))
		if res == ResError {
			if !strings.Contains(got, "mutual-exclusion") {
				t.Fatalf("a refused revoke ended the holding: violations %q", got)
			}
			continue
		}
		if got != "" {
			t.Fatalf("revoke %s: violations %q", res, got)
		}
	}
}

// A `! LOST revoked` is read only after a revoke of its token was sent.
func TestCheckLostRevokedNeedsARevoke(t *testing.T) {
	for _, withRevoke := range []bool{true, false} {
		var h hist
		a := h.acquire(0, "k", 0, 10, ResOK, 1)
		if withRevoke {
			h.add(Op{Worker: -1, Kind: KindFault, Fault: FaultRevoke, Key: "k", Token: 1, Acq: a.ID, Inv: 50, Cmp: 60, Result: ResOK})
		}
		h.lost(a, "revoked", 55)
		got := checks(Check(h.ops, nil, FinalState{}, CheckOptions{}))
		if withRevoke && got != "" || !withRevoke && !strings.Contains(got, "lost-signal") {
			t.Fatalf("revoke sent %v: violations %q", withRevoke, got)
		}
	}
}
