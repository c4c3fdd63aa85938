package verify

import (
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Violation is one broken guarantee.
type Violation struct {
	Check  string `json:"check"`
	Detail string `json:"detail"`
}

// FinalState is what the harness observed after the run, for the checks
// that need the cluster's view.
type FinalState struct {
	// LastToken is the last token the cluster issued (0: unknown).
	LastToken uint64
	// TokenFloor is the domain's token floor: the first token issued is
	// TokenFloor+1.
	TokenFloor uint64
	// Wiped: a node was wiped during the run (token accounting is then not
	// meaningful).
	Wiped bool
}

// CheckReport is the outcome of Check.
type CheckReport struct {
	Violations []Violation
	// Grants is the number of OK acquires; StaleWrites the writes the
	// fencing check refused; LateWrites the writes made past the lease on
	// purpose (LateAccepted of them accepted because no newer holder had
	// written yet).
	Grants, StaleWrites, LateWrites, LateAccepted int
	// UnknownTokens is how many tokens the cluster issued that no worker
	// was told (each must be explained by an indeterminate acquire).
	UnknownTokens, Indeterminate int
	// Linearizable is porcupine's verdict; Visualization the HTML file it
	// wrote when the verdict was not Ok.
	Linearizable   porcupine.CheckResult
	LinearizeTime  time.Duration
	Visualization  string
	PorcupineParts int
}

// CheckOptions tunes Check.
type CheckOptions struct {
	// Dir receives porcupine's HTML visualization when the history is not
	// linearizable ("" : none written).
	Dir string
	// LinearizeTimeout bounds porcupine (Unknown after it). Zero: 2 min.
	LinearizeTimeout time.Duration
	// IndeterminateWindow is how long after its completion an
	// INDETERMINATE operation may still take effect (see porcupineHistory).
	// Zero: unbounded, which is exact but slow on long histories.
	IndeterminateWindow time.Duration
}

// Check runs every safety check of issue 4 on a history, the protected
// resource's log and the final state.
func Check(ops []Op, store []StoreRec, final FinalState, opts CheckOptions) CheckReport {
	var r CheckReport
	bad := func(check, format string, args ...any) {
		r.Violations = append(r.Violations, Violation{Check: check, Detail: fmt.Sprintf(format, args...)})
	}
	acquires := map[int64]Op{}
	var grants []Op
	for _, op := range ops {
		if op.Kind == KindAcquire {
			acquires[op.ID] = op
			if op.Result == ResOK {
				grants = append(grants, op)
			}
			if op.Result == ResIndeterminate {
				r.Indeterminate++
			}
		}
	}
	r.Grants = len(grants)

	checkMutualExclusion(ops, grants, bad)
	checkTokens(grants, bad)
	checkFencing(ops, store, acquires, &r, bad)

	// No leak, by counting: every token issued is either known (an OK) or
	// explained by an indeterminate acquire (granted, then compensated or
	// expired). A BUSY or TIMEOUT that was granted after all would be a
	// token nobody can explain.
	if final.LastToken > 0 && !final.Wiped {
		known := map[uint64]bool{}
		for _, g := range grants {
			known[g.Token] = true
		}
		issued := final.LastToken - final.TokenFloor
		r.UnknownTokens = int(issued) - len(known)
		if r.UnknownTokens > r.Indeterminate {
			bad("no-leak", "the cluster issued %d tokens; workers learned %d and %d acquires were indeterminate: %d grants are unexplained",
				issued, len(known), r.Indeterminate, r.UnknownTokens-r.Indeterminate)
		}
		for t := range known {
			if t <= final.TokenFloor {
				bad("tokens", "token %d granted at or below the domain's floor %d", t, final.TokenFloor)
			}
			if t > final.LastToken {
				bad("tokens", "token %d granted but the cluster's last token is %d", t, final.LastToken)
			}
		}
	}

	// Linearizability against the lock model.
	parts := porcupineHistory(ops, opts.IndeterminateWindow)
	r.PorcupineParts = len(parts)
	var flat []porcupine.Operation
	model := lockModel()
	model.Partition = func(h []porcupine.Operation) [][]porcupine.Operation { return parts }
	for _, p := range parts {
		flat = append(flat, p...)
	}
	timeout := opts.LinearizeTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, flat, timeout)
	r.LinearizeTime = time.Since(start)
	r.Linearizable = res
	if res == porcupine.Illegal {
		bad("linearizability", "the lock history is not linearizable (see the visualization)")
	}
	if res != porcupine.Ok && opts.Dir != "" {
		path := filepath.Join(opts.Dir, "linearizability.html")
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			r.Visualization = path
		}
	}
	return r
}

// holdEnd is the conservative end of a grant's holding: the first of its
// release's invocation, its session's end, and invocation + lease.
func holdEnds(ops []Op, grants []Op) map[int64]int64 {
	end := map[int64]int64{}
	for _, g := range grants {
		end[g.ID] = g.Inv + g.LeaseMs*int64(time.Millisecond)
	}
	byWorker := map[int][]Op{}
	for _, g := range grants {
		byWorker[g.Worker] = append(byWorker[g.Worker], g)
	}
	for _, op := range ops {
		switch op.Kind {
		case KindRelease:
			if e, ok := end[op.Acq]; ok && op.Inv < e {
				end[op.Acq] = op.Inv
			}
		case KindClose:
			for _, g := range byWorker[op.Worker] {
				if op.Cmp >= g.Cmp && op.Inv < end[g.ID] {
					end[g.ID] = max(op.Inv, g.Cmp)
				}
			}
		}
	}
	return end
}

// checkMutualExclusion: no two OK grants on one key whose holding
// intervals [grant completed, holdEnd) overlap.
func checkMutualExclusion(ops, grants []Op, bad func(string, string, ...any)) {
	end := holdEnds(ops, grants)
	byKey := map[string][]Op{}
	for _, g := range grants {
		byKey[g.Key] = append(byKey[g.Key], g)
	}
	for key, gs := range byKey {
		sort.Slice(gs, func(i, j int) bool { return gs[i].Cmp < gs[j].Cmp })
		var prev *Op
		for i := range gs {
			g := &gs[i]
			if prev != nil && g.Cmp < end[prev.ID] && end[g.ID] > g.Cmp {
				bad("mutual-exclusion", "key %s: w%d token %d held [%s, %s) and w%d token %d from %s, both within their leases",
					key, prev.Worker, prev.Token, ts(prev.Cmp), ts(end[prev.ID]), g.Worker, g.Token, ts(g.Cmp))
			}
			if prev == nil || end[g.ID] > end[prev.ID] {
				prev = g
			}
		}
	}
}

// checkTokens: tokens are unique and respect real time: a grant that
// completed before another was invoked has the smaller token (across all
// keys, so per key in grant order too).
func checkTokens(grants []Op, bad func(string, string, ...any)) {
	seen := map[uint64]Op{}
	for _, g := range grants {
		if o, dup := seen[g.Token]; dup {
			bad("tokens", "token %d granted twice: w%d key %s and w%d key %s", g.Token, o.Worker, o.Key, g.Worker, g.Key)
		}
		seen[g.Token] = g
	}
	byCmp := append([]Op(nil), grants...)
	sort.Slice(byCmp, func(i, j int) bool { return byCmp[i].Cmp < byCmp[j].Cmp })
	byInv := append([]Op(nil), grants...)
	sort.Slice(byInv, func(i, j int) bool { return byInv[i].Inv < byInv[j].Inv })
	var maxDone Op
	j := 0
	for _, g := range byInv {
		for j < len(byCmp) && byCmp[j].Cmp < g.Inv {
			if byCmp[j].Token > maxDone.Token {
				maxDone = byCmp[j]
			}
			j++
		}
		if maxDone.Token >= g.Token {
			bad("tokens", "w%d got token %d on %s at %s after w%d's token %d on %s had completed at %s",
				g.Worker, g.Token, g.Key, ts(g.Cmp), maxDone.Worker, maxDone.Token, maxDone.Key, ts(maxDone.Cmp))
		}
	}
}

// checkFencing replays the protected resource's log: it accepted exactly
// the writes above the key's high-water mark, accepted tokens only grow,
// and every write carries a token its worker was granted for that key.
func checkFencing(ops []Op, store []StoreRec, acquires map[int64]Op, r *CheckReport, bad func(string, string, ...any)) {
	hw := map[string]uint64{}
	for _, w := range store {
		want := w.Token > hw[w.Key]
		if w.Accepted != want {
			bad("fencing", "store %s token %d (w%d): accepted=%v against high-water %d", w.Key, w.Token, w.Worker, w.Accepted, hw[w.Key])
		}
		if w.Accepted {
			if w.Token <= hw[w.Key] {
				bad("fencing", "store %s accepted token %d after token %d", w.Key, w.Token, hw[w.Key])
			}
			hw[w.Key] = w.Token
		} else {
			r.StaleWrites++
		}
	}
	for _, op := range ops {
		if op.Kind != KindWrite {
			continue
		}
		a, ok := acquires[op.Acq]
		switch {
		case !ok:
			bad("no-leak", "w%d wrote %s with token %d for an acquire not in the history", op.Worker, op.Key, op.Token)
		case a.Result != ResOK:
			bad("no-leak", "w%d wrote %s with token %d after its acquire answered %s", op.Worker, op.Key, op.Token, a.Result)
		case a.Token != op.Token || a.Key != op.Key || a.Worker != op.Worker:
			bad("fencing", "w%d wrote %s token %d but was granted %s token %d", op.Worker, op.Key, op.Token, a.Key, a.Token)
		case op.Inv < a.Cmp:
			bad("fencing", "w%d wrote %s before its grant completed", op.Worker, op.Key)
		}
		if op.Late {
			r.LateWrites++
			if op.Result == ResOK {
				r.LateAccepted++
			}
		}
	}
}

func ts(ns int64) string { return time.Unix(0, ns).Format("15:04:05.000") }
