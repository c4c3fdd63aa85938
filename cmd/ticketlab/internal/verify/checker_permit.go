package verify

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Permit checks (issue 41). A permit's holding is judged as a lock's is
// (holdEnds): from its grant read (Cmp) to the earliest it can have ended —
// its RELEASE sent, its session's end, or its lease run out from the
// PERMIT's send (or from the last EXTEND answered OK's send). That interval
// lies inside the real one (the cluster granted no later than Cmp and
// cannot have ended it before any of those), so every overlap the checks
// count really happened.
//
//   - permits-n: at every grant, the holdings live then (itself included)
//     are at most the n in force. After n is lowered, more than n may still
//     be held until they end; a grant then is a NEW grant while n or more
//     were held, which is exactly what the count at the grant catches. The
//     n in force at a grant read at Cmp and sent at Inv is any n set by a
//     PERMITS that may have taken effect in [Inv, Cmp] (sent before Cmp,
//     not answered before Inv) or the last one answered before Inv: the
//     largest of those is allowed.
//   - permit-slot: no two holdings of one (key, slot) overlap, and every
//     slot is below the largest n ever set.
//   - permit-fencing: a write of "<key> <slot>" made while its holding was
//     live (not on purpose past the lease) must be accepted: a refusal
//     means a newer token of the same slot wrote meanwhile, a second holder
//     of the slot. And per resource the store's accepted tokens increase.
//   - permit-fifo: as checkFIFO for locks: a waiter A whose `! QUEUED` was
//     read before B's PERMIT of the same key was sent stands ahead of B; B
//     granted under a smaller token than A's overtook A.
//
// Tokens (one cluster counter across locks and permits) are checked by
// checkTokens on lock and permit grants together (Check).

// PermitReport is what checkPermits counted.
type PermitReport struct {
	// Grants are the PERMITs answered OK; HandOffs those of them that
	// waited in line (their `! QUEUED` was read); Indeterminate the
	// PERMITs whose outcome is unknown; Writes and Stale the fenced writes
	// decided and refused; Late those made past the lease on purpose.
	Grants, HandOffs, Indeterminate, Writes, Stale, Late int
	// MaxHeld is, per key, the most holdings live at one grant; MaxN the
	// largest n allowed at such a grant.
	MaxHeld, MaxN map[string]int
	// HeldAtN is, per key and per n allowed at a grant, the most holdings
	// live at such a grant: what each n (defined, raised, lowered) let in.
	HeldAtN map[string]map[int]int
	// Sets are the PERMITS answered OK ("sem/0=3"); AtSets the same with
	// how many permits of the key were surely held when the answer was
	// read ("sem/0=2: 5 held"): a lowering below that left holders above
	// the new n, whom the count at each later grant allows for.
	Sets, AtSets []string
	// FIFOChecked is the grants checked against the waiters queued before
	// they were sent.
	FIFOChecked int
	// Lost counts the `! LOST` events of permits read, by reason.
	Lost map[string]int
}

// permitGrants returns the OK PERMITs of ops.
func permitGrants(ops []Op) []Op {
	var gs []Op
	for _, op := range ops {
		if op.Kind == KindPermit && op.Result == ResOK {
			gs = append(gs, op)
		}
	}
	return gs
}

// permitEnds is holdEnds for permits: their EXTENDs, RELEASEs and session
// ends read as a lock's.
func permitEnds(ops []Op, grants []Op) map[int64]int64 {
	var mapped []Op
	for _, op := range ops {
		switch op.Kind {
		case KindPermitExtend:
			op.Kind = KindExtend
		case KindPermitRelease:
			op.Kind = KindRelease
		case KindClose, KindFault:
		default:
			continue
		}
		mapped = append(mapped, op)
	}
	return holdEnds(mapped, grants)
}

// checkPermits runs the permit checks on the history and the permit
// store's log.
func checkPermits(ops []Op, store []StoreRec, bad func(string, string, ...any)) PermitReport {
	r := PermitReport{MaxHeld: map[string]int{}, MaxN: map[string]int{}, HeldAtN: map[string]map[int]int{}, Lost: map[string]int{}}
	grants := permitGrants(ops)
	r.Grants = len(grants)
	end := permitEnds(ops, grants)
	sets := map[string][]Op{}
	maxEver := map[string]int{}
	for _, op := range ops {
		switch {
		case op.Kind == KindPermitLost:
			r.Lost[op.Reason]++
		case op.Kind == KindPermit && op.Result == ResIndeterminate:
			r.Indeterminate++
		case op.Kind == KindPermit && op.Result == ResOK && op.Queued != 0:
			r.HandOffs++
		case op.Kind == KindPermits && (op.Result == ResOK || op.Result == ResIndeterminate):
			// An INDETERMINATE PERMITS may have taken effect at any time
			// after it was sent.
			if op.Result == ResIndeterminate {
				op.Cmp = math.MaxInt64
			} else {
				r.Sets = append(r.Sets, fmt.Sprintf("%s=%d", op.Key, op.N))
			}
			sets[op.Key] = append(sets[op.Key], op)
			maxEver[op.Key] = max(maxEver[op.Key], op.N)
		}
	}
	for _, ss := range sets {
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].Cmp < ss[j].Cmp })
	}
	// nAt is the largest n that may be in force at a grant g (see above);
	// 0: none set yet.
	nAt := func(g Op) int {
		n := 0
		for _, s := range sets[g.Key] {
			switch {
			case s.Cmp < g.Inv && s.Result == ResOK:
				n = s.N // the last answered before g was sent (sorted by Cmp)
			}
		}
		for _, s := range sets[g.Key] {
			if s.Inv < g.Cmp && s.Cmp >= g.Inv {
				n = max(n, s.N)
			}
		}
		return n
	}

	byKey := map[string][]Op{}
	for _, g := range grants {
		byKey[g.Key] = append(byKey[g.Key], g)
	}
	for key, gs := range byKey {
		sort.SliceStable(gs, func(i, j int) bool { return gs[i].Cmp < gs[j].Cmp })
		// The holdings live at the grant being checked, pruned as grants
		// go by (grants in read order; a holding is live from its grant
		// read to its end), so the sweep stays linear in the grants.
		var live []Op
		for _, g := range gs {
			if g.Slot < 0 || maxEver[key] > 0 && g.Slot >= maxEver[key] {
				bad("permit-slot", "w%d token %d got slot %d of %s, whose n was never above %d", g.Worker, g.Token, g.Slot, key, maxEver[key])
			}
			kept := live[:0]
			for _, h := range live {
				if g.Cmp < end[h.ID] {
					kept = append(kept, h)
				}
			}
			live = kept
			// A grant read after its own lease ran out (counted from its
			// send: a waiter with a short lease and a long wait, or a
			// grant a resume replayed after a partition) was granted at
			// some time in [Inv, Cmp], perhaps before the others: it
			// overlaps only those that held all through that window (read
			// before it was sent), as checkMutualExclusion has it for
			// locks. Before, a replayed permit whose lease had long run
			// out was taken for a second holder of its slot (a CI run).
			dead := g.Cmp >= end[g.ID]
			held := 1 // g itself
			for _, h := range live {
				if dead && g.Inv < h.Cmp {
					continue
				}
				held++
				if h.Slot == g.Slot {
					bad("permit-slot", "%s slot %d: w%d token %d granted at %s while w%d token %d held it (until %s at the earliest)",
						key, g.Slot, g.Worker, g.Token, ts(g.Cmp), h.Worker, h.Token, ts(end[h.ID]))
				}
			}
			if g.Cmp < end[g.ID] {
				live = append(live, g)
			}
			n := nAt(g)
			r.MaxHeld[key] = max(r.MaxHeld[key], held)
			r.MaxN[key] = max(r.MaxN[key], n)
			if r.HeldAtN[key] == nil {
				r.HeldAtN[key] = map[int]int{}
			}
			r.HeldAtN[key][n] = max(r.HeldAtN[key][n], held)
			if held > n {
				bad("permits-n", "%s: w%d token %d granted at %s with %d permits held (itself included) and n at most %d then",
					key, g.Worker, g.Token, ts(g.Cmp), held, n)
			}
		}
	}

	var setKeys []string
	for k := range sets {
		setKeys = append(setKeys, k)
	}
	sort.Strings(setKeys)
	for _, k := range setKeys {
		for _, st := range sets[k] {
			if st.Result != ResOK {
				continue
			}
			held := 0
			for _, g := range byKey[st.Key] {
				if g.Cmp <= st.Cmp && st.Cmp < end[g.ID] {
					held++
				}
			}
			r.AtSets = append(r.AtSets, fmt.Sprintf("%s=%d: %d held", st.Key, st.N, held))
		}
	}

	// Fencing per (key, slot).
	acq := map[int64]Op{}
	for _, g := range grants {
		acq[g.ID] = g
	}
	for _, op := range ops {
		if op.Kind != KindPermitWrite || op.Result == ResError {
			continue
		}
		r.Writes++
		if op.Late {
			r.Late++
		}
		if op.Result != ResRejected {
			continue
		}
		r.Stale++
		if g, ok := acq[op.Acq]; ok && !op.Late && op.Cmp < end[g.ID] {
			bad("permit-fencing", "w%d's write of %s under token %d was refused at %s while its permit was live (until %s at the earliest): "+
				"a newer holder of the slot wrote", op.Worker, permitResource(op.Key, op.Slot), op.Token, ts(op.Cmp), ts(end[g.ID]))
		}
	}
	hw := map[string]uint64{}
	for _, rec := range store {
		if !rec.Accepted {
			continue
		}
		if rec.Token <= hw[rec.Key] {
			bad("permit-fencing", "%s accepted token %d after token %d", rec.Key, rec.Token, hw[rec.Key])
		}
		hw[rec.Key] = rec.Token
	}

	// FIFO among waiters of a key: every grant b against the waiters
	// queued before b was sent, by a sweep (the largest token among them
	// must be below b's), linear after the sorts.
	for _, gs := range byKey {
		var queued []Op
		for _, a := range gs {
			if a.Queued != 0 {
				queued = append(queued, a)
			}
		}
		sort.Slice(queued, func(i, j int) bool { return queued[i].Queued < queued[j].Queued })
		bs := append([]Op(nil), gs...)
		sort.Slice(bs, func(i, j int) bool { return bs[i].Inv < bs[j].Inv })
		var ahead Op // the largest-token waiter queued so far
		j := 0
		for _, b := range bs {
			for j < len(queued) && queued[j].Queued < b.Inv {
				if queued[j].Token > ahead.Token {
					ahead = queued[j]
				}
				j++
			}
			if j == 0 {
				continue
			}
			r.FIFOChecked++
			if ahead.Token > b.Token {
				bad("permit-fifo", "%s: w%d token %d was sent at %s after w%d's PERMIT was queued (at %s) and was granted before it (token %d)",
					b.Key, b.Worker, b.Token, ts(b.Inv), ahead.Worker, ts(ahead.Queued), ahead.Token)
			}
		}
	}
	return r
}

// permitSummary is the summary's permits line (issue 41): the grants and
// hand-offs, the fenced writes, and per key the most permits held at one
// grant against the largest n allowed then.
func permitSummary(keys []string, plan []int, p PermitReport) string {
	if len(keys) == 0 {
		return "permits: no permit workload (--permits-n -1, or the cluster refused PERMITS)\n"
	}
	var b strings.Builder
	lost := 0
	for _, n := range p.Lost {
		lost += n
	}
	var ns []string
	for _, n := range plan {
		ns = append(ns, strconv.Itoa(n))
	}
	fmt.Fprintf(&b, "permits: %s, n %s; %d grants (%d hand-offs after `! QUEUED`), %d indeterminate; fenced writes of \"key slot\" %d (%d refused, %d late on purpose); %d grants checked for FIFO; %d `! LOST` events (expired %d); PERMITS answered OK, with the permits held then: %s\n",
		strings.Join(keys, ","), strings.Join(ns, " → "), p.Grants, p.HandOffs, p.Indeterminate, p.Writes, p.Stale, p.Late, p.FIFOChecked, lost, p.Lost["expired"], strings.Join(p.AtSets, ", "))
	for _, k := range keys {
		var ns []int
		for n := range p.HeldAtN[k] {
			ns = append(ns, n)
		}
		sort.Ints(ns)
		var per []string
		for _, n := range ns {
			per = append(per, fmt.Sprintf("n %d: %d", n, p.HeldAtN[k][n]))
		}
		fmt.Fprintf(&b, "  %s: at most %d held at a grant (n at most %d); by the n allowed at the grant, the most held: %s\n",
			k, p.MaxHeld[k], p.MaxN[k], strings.Join(per, ", "))
	}
	return b.String()
}
