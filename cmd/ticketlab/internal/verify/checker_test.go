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
		ok, err := c.write("k", tc.tok, 1, 1)
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
