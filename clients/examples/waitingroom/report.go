package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// report is the outcome of a run and the checks over it (check).
type report struct {
	Sale, Key, DBDesc, Domain string
	Cfg                       config
	Buyers                    []*buyer
	Join                      time.Duration // the line forming, one buyer at a time
	Opened                    time.Time
	SaleTime                  time.Duration // from the opening until the last buyer left
	Elapsed                   time.Duration
	Kill                      *killRecord
	Audit                     audit

	// Admission order against arrival order.
	Admitted    int
	Pairs       int64 // pairs of admitted buyers
	Inversions  int64 // pairs admitted (by token) against their arrival order
	NotAdmitted []string

	// Positions.
	Events, Told       int // position events, buyers that got one
	Monotone, WentUp   int // buyers whose positions never / at some point went up
	AboveRank          int // events placing a buyer further back than buyers arrived before it, +1
	WithEstimate       int
	ErrAbs, ErrSigned  []time.Duration // per event with an estimate: |actual − predicted|, actual − predicted
	FirstAbs, FirstSig []time.Duration // the same, each buyer's first event with an estimate only
	// CalmAbs: |error| of the events whose wait did not span the leader
	// kill (received and admitted on the same side of it): the
	// estimator's own error, without the election's pause it cannot know.
	CalmAbs []time.Duration
	// ZeroEst counts the events whose estimate was 0 s although more
	// buyers stood ahead than the checkout admits at once: a wait of at
	// least one checkout, estimated as none.
	ZeroEst int

	// Sales and the fence.
	Sold, SoldOut, Stale, NotWritten int // buyers' outcomes
	OtherOutcome                     []string
	ReleaseErrs                      []string
	LedgerSold, LedgerSoldOut        int // checkout rows
	WantSold                         int // min(tickets, buyers that checked out)
	SlotsOK, Slots                   int // slots whose high-water is the newest token written on it
	Stalled                          *buyer

	Problems []string
}

func (r *report) OK() bool { return len(r.Problems) == 0 }

// check fills the findings and Problems from the buyers' records and the
// audit of the database.
func (r *report) check() {
	bad := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }

	// FIFO: every pair of admitted buyers was admitted (fresh token from
	// the one cluster counter, in commit order) in arrival order.
	var tokens []uint64 // in arrival order
	for _, b := range r.Buyers {
		if b.Admitted.IsZero() {
			r.NotAdmitted = append(r.NotAdmitted, fmt.Sprintf("buyer %d: %v", b.N, b.Err))
			continue
		}
		tokens = append(tokens, b.Token)
	}
	r.Admitted = len(tokens)
	r.Pairs = int64(len(tokens)) * int64(len(tokens)-1) / 2
	r.Inversions = inversions(tokens)
	if r.Inversions > 0 {
		bad("FIFO: %d of %d pairs of buyers admitted against their arrival order", r.Inversions, r.Pairs)
	}
	for _, x := range r.NotAdmitted {
		bad("not admitted: %s", x)
	}

	// Positions: only ever down, never behind more buyers than arrived
	// first; and the estimate against the actual admission.
	for _, b := range r.Buyers {
		ev := b.events()
		if len(ev) > 0 {
			r.Told++
		}
		r.Events += len(ev)
		up := false
		for i, e := range ev {
			if i > 0 && e.Position > ev[i-1].Position {
				up = true
			}
			if e.Position > b.N {
				r.AboveRank++
			}
		}
		if up {
			r.WentUp++
			bad("buyer %d: its position went up: %s", b.N, positions(ev))
		} else {
			r.Monotone++
		}
		if b.Admitted.IsZero() {
			continue
		}
		first := true
		for _, e := range ev {
			if !e.Known {
				continue
			}
			r.WithEstimate++
			if e.Estimate == 0 && e.Position > r.Cfg.Permits {
				r.ZeroEst++
			}
			d := b.Admitted.Sub(e.At.Add(e.Estimate)) // > 0: later than predicted
			r.ErrSigned = append(r.ErrSigned, d)
			r.ErrAbs = append(r.ErrAbs, d.Abs())
			if r.Kill == nil || r.Kill.At.IsZero() || e.At.After(r.Kill.At) == b.Admitted.After(r.Kill.At) {
				r.CalmAbs = append(r.CalmAbs, d.Abs())
			}
			if first {
				r.FirstSig = append(r.FirstSig, d)
				r.FirstAbs = append(r.FirstAbs, d.Abs())
				first = false
			}
		}
	}
	if r.AboveRank > 0 {
		bad("%d position events put a buyer behind more buyers than arrived before it", r.AboveRank)
	}

	// Outcomes as the buyers saw them.
	tokenOf := map[int]*buyer{}
	checkedOut := 0
	for _, b := range r.Buyers {
		tokenOf[b.N] = b
		if b.stall {
			r.Stalled = b
		}
		switch {
		case b.Admitted.IsZero():
		case b.Outcome == "bought":
			r.Sold++
		case b.Outcome == "sold out":
			r.SoldOut++
		case b.Outcome == "stale":
			r.Stale++
		case b.Outcome == "not written":
			r.NotWritten++
		default:
			r.OtherOutcome = append(r.OtherOutcome, fmt.Sprintf("buyer %d: %s", b.N, b.Outcome))
		}
		if !b.Admitted.IsZero() && !b.stall {
			checkedOut++
		}
		if b.Release != nil && !b.stall {
			r.ReleaseErrs = append(r.ReleaseErrs, fmt.Sprintf("buyer %d: %v", b.N, b.Release))
		}
	}
	for _, x := range r.OtherOutcome {
		bad("checkout failed: %s", x)
	}
	r.WantSold = min(r.Audit.Capacity, checkedOut)

	// The database: no oversell, the counter adds up, one ledger row per
	// ticket sold, each row the buyer's own token and slot.
	a := r.Audit
	rowsOf := map[int]int{}
	lastOfSlot := map[int]uint64{}
	for _, row := range a.Rows {
		rowsOf[row.Buyer]++
		switch row.Outcome {
		case "sold":
			r.LedgerSold += row.Tickets
		case "soldout":
			r.LedgerSoldOut++
		}
		b := tokenOf[row.Buyer]
		switch {
		case b == nil:
			bad("checkout row of unknown buyer %d", row.Buyer)
		case b.stall:
			bad("the stalled buyer's write landed: token %d on slot %d (%s)", row.Token, row.Slot, row.Outcome)
		case row.Token != b.Token || row.Slot != b.Slot:
			bad("buyer %d's row has token %d slot %d, its permit token %d slot %d", row.Buyer, row.Token, row.Slot, b.Token, b.Slot)
		}
		// The fence: on each slot, every write's token above the one
		// before it (a smaller one would be a stale write applied).
		if prev, ok := lastOfSlot[row.Slot]; ok && row.Token <= prev {
			bad("slot %d: token %d written after token %d (a stale write applied)", row.Slot, row.Token, prev)
		}
		lastOfSlot[row.Slot] = row.Token
	}
	for n, k := range rowsOf {
		if k > 1 {
			bad("buyer %d checked out %d times", n, k)
		}
	}
	if r.LedgerSold > a.Capacity {
		bad("oversold: %d tickets sold of %d", r.LedgerSold, a.Capacity)
	}
	if a.Remaining != a.Capacity-r.LedgerSold || a.Remaining < 0 {
		bad("inventory: remaining %d, capacity %d − sold %d = %d", a.Remaining, a.Capacity, r.LedgerSold, a.Capacity-r.LedgerSold)
	}
	if r.LedgerSold != r.Sold || r.LedgerSoldOut != r.SoldOut {
		bad("the ledger has %d sold and %d sold-out rows, the buyers were told %d and %d", r.LedgerSold, r.LedgerSoldOut, r.Sold, r.SoldOut)
	}
	if r.LedgerSold != r.WantSold {
		bad("%d tickets sold, want min(capacity %d, buyers checked out %d) = %d", r.LedgerSold, a.Capacity, checkedOut, r.WantSold)
	}
	r.Slots = len(a.HighWater)
	for slot, hw := range a.HighWater {
		if hw == lastOfSlot[slot] {
			r.SlotsOK++
		} else {
			bad("fence: slot %d's high-water %d, the newest token written on it %d", slot, hw, lastOfSlot[slot])
		}
	}
	for slot := range lastOfSlot {
		if _, ok := a.HighWater[slot]; !ok {
			bad("fence: slot %d was written but has no high-water mark", slot)
		}
	}
	if r.Stalled != nil && r.Stalled.Outcome != "stale" {
		bad("the stalled buyer %d: %q, want its stale write rejected by the fence", r.Stalled.N, r.Stalled.Outcome)
	}
	if r.Kill != nil && r.Kill.Err != "" {
		bad("leader kill: %s", r.Kill.Err)
	}
	if r.Kill != nil && r.Kill.Node == "" && r.Kill.Err == "" {
		bad("leader kill: never happened")
	}
}

func (r *report) print(w io.Writer) {
	c := r.Cfg
	a := r.Audit
	fmt.Fprintf(w, "waiting room %s: %d buyers, %d permits (%s), %d tickets, checkout %v, %s, 3 node processes + 1 sidecar, %.1fs\n",
		r.Sale, c.Buyers, c.Permits, r.Key, a.Capacity, c.Checkout, r.DBDesc, r.Elapsed.Seconds())
	fmt.Fprintf(w, "  line:               %d buyers joined one at a time, each confirmed queued before the next, in %.1fs; the sale opened then and took %.1fs\n",
		len(r.Buyers), r.Join.Seconds(), r.SaleTime.Seconds())
	fifo := 100.0
	if r.Pairs > 0 {
		fifo = 100 * float64(r.Pairs-r.Inversions) / float64(r.Pairs)
	}
	fmt.Fprintf(w, "  admission order:    %d of %d admitted; FIFO %.2f %% (%d inversions in %d pairs of admitted buyers)\n",
		r.Admitted, len(r.Buyers), fifo, r.Inversions, r.Pairs)
	if len(r.NotAdmitted) > 0 {
		fmt.Fprintf(w, "  not admitted:       %s\n", strings.Join(r.NotAdmitted, "; "))
	}
	fmt.Fprintf(w, "  positions:          %d events to %d buyers; only ever down for %d of %d buyers (%d went up); behind more than arrived first: %d\n",
		r.Events, r.Told, r.Monotone, len(r.Buyers), r.WentUp, r.AboveRank)
	if len(r.ErrAbs) > 0 {
		fmt.Fprintf(w, "  estimate error:     %d events with an estimate: |admitted − (received + estimate)| median %s, p90 %s; signed median %s (+ = later than predicted)\n",
			r.WithEstimate, secs(quantile(r.ErrAbs, 0.5)), secs(quantile(r.ErrAbs, 0.9)), signed(quantile(r.ErrSigned, 0.5)))
		fmt.Fprintf(w, "                      each buyer's first estimate (%d): median %s, p90 %s; signed median %s\n",
			len(r.FirstAbs), secs(quantile(r.FirstAbs, 0.5)), secs(quantile(r.FirstAbs, 0.9)), signed(quantile(r.FirstSig, 0.5)))
		fmt.Fprintf(w, "                      estimates of 0s with more than %d (the permits) ahead: %d events\n", c.Permits, r.ZeroEst)
		if r.Kill != nil && len(r.CalmAbs) > 0 {
			fmt.Fprintf(w, "                      waits that did not span the leader kill (%d events): median %s, p90 %s\n",
				len(r.CalmAbs), secs(quantile(r.CalmAbs, 0.5)), secs(quantile(r.CalmAbs, 0.9)))
		}
	} else {
		fmt.Fprintf(w, "  estimate error:     no event carried an estimate\n")
	}
	for _, n := range sampleBuyers(len(r.Buyers)) {
		fmt.Fprintf(w, "  buyer #%-5d told:   %s\n", n, r.timeline(r.Buyers[n-1]))
	}
	if k := r.Kill; k != nil {
		fmt.Fprintf(w, "  leader kill:        %s SIGKILLed %.1fs into the sale, after %d of %d admissions", orDash(k.Node), k.At.Sub(r.Opened).Seconds(), k.Admitted, len(r.Buyers))
		if k.NewLeader != "" {
			fmt.Fprintf(w, "; %s leads", k.NewLeader)
		}
		if k.Pause > 0 {
			fmt.Fprintf(w, "; the line stood still %.2fs (longest gap between admissions), moving again %.2fs after the kill", k.Pause.Seconds(), k.Resumed.Seconds())
		}
		if k.Restarted {
			fmt.Fprintf(w, "; %s restarted from its data dir", k.Node)
		}
		if k.Err != "" {
			fmt.Fprintf(w, "; ERROR %s", k.Err)
		}
		fmt.Fprintln(w)
	}
	if s := r.Stalled; s != nil {
		fmt.Fprintf(w, "  stalled buyer:      #%d (token %d, slot %d, lease %v) stalled past its lease without writing; once a newer holder of slot %d wrote, it wrote with its old token: %s\n",
			s.N, s.Token, s.Slot, c.StallLease, s.Slot, describeStall(s.Outcome))
	}
	fmt.Fprintf(w, "  sales:              %d tickets sold of %d (remaining %d), %d buyers told sold out; want min(tickets, buyers checked out) = %d\n",
		r.LedgerSold, a.Capacity, a.Remaining, r.SoldOut, r.WantSold)
	adds := "yes"
	if a.Remaining != a.Capacity-r.LedgerSold || r.LedgerSold > a.Capacity {
		adds = "NO"
	}
	fmt.Fprintf(w, "  fence audit:        oversold: %s; inventory adds up: %s (remaining %d = %d − %d); ledger rows %d sold + %d sold out = %d checkouts, one per buyer, each under its permit's token and slot\n",
		yesNo(r.LedgerSold > a.Capacity), adds, a.Remaining, a.Capacity, r.LedgerSold, r.LedgerSold, r.LedgerSoldOut, len(a.Rows))
	fmt.Fprintf(w, "                      %d of %d slots' fence high-water (\"%s <slot>\") is the newest token written on the slot; tokens only rose on every slot\n",
		r.SlotsOK, r.Slots, r.Key)
	if len(r.ReleaseErrs) > 0 {
		fmt.Fprintf(w, "  release errors:     %d (%s)\n", len(r.ReleaseErrs), strings.Join(first(r.ReleaseErrs, 5), "; "))
	}
	if r.OK() {
		fmt.Fprintln(w, "  audit:              passed")
		return
	}
	fmt.Fprintf(w, "  audit:              FAILED (%d problems)\n", len(r.Problems))
	for _, p := range first(r.Problems, 20) {
		fmt.Fprintln(w, "    -", p)
	}
}

func describeStall(outcome string) string {
	switch outcome {
	case "stale":
		return "rejected by the fence (stale), nothing written"
	case "not written":
		return "nobody else wrote its slot before the line ran out, so it did not write"
	}
	return "NOT rejected: " + outcome
}

// inversions counts the pairs i < j with v[i] > v[j] (merge sort).
func inversions(v []uint64) int64 {
	a := append([]uint64(nil), v...)
	tmp := make([]uint64, len(a))
	var count func(lo, hi int) int64
	count = func(lo, hi int) int64 {
		if hi-lo < 2 {
			return 0
		}
		mid := (lo + hi) / 2
		n := count(lo, mid) + count(mid, hi)
		i, j, k := lo, mid, lo
		for i < mid && j < hi {
			if a[i] <= a[j] {
				tmp[k] = a[i]
				i++
			} else {
				tmp[k] = a[j]
				n += int64(mid - i)
				j++
			}
			k++
		}
		k += copy(tmp[k:], a[i:mid])
		copy(tmp[k:], a[j:hi])
		copy(a[lo:hi], tmp[lo:hi])
		return n
	}
	return count(0, len(a))
}

// quantile is the q-quantile (nearest rank) of d.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := sortDurations(append([]time.Duration(nil), d...))
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func positions(ev []posEvent) string {
	var s []string
	for _, e := range ev {
		s = append(s, fmt.Sprint(e.Position))
	}
	return strings.Join(s, " ")
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

func signed(d time.Duration) string { return fmt.Sprintf("%+.2fs", d.Seconds()) }

func yesNo(b bool) string {
	if b {
		return "YES"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func first(v []string, n int) []string {
	if len(v) > n {
		return append(v[:n:n], fmt.Sprintf("… %d more", len(v)-n))
	}
	return v
}

// sampleBuyers are the arrival ranks whose timelines the report shows:
// the middle of the line and its end.
func sampleBuyers(n int) []int {
	if n < 2 {
		return nil
	}
	return []int{n / 2, n}
}

// timeline is what buyer b was told, as "+t position (estimate)" from
// the opening (negative: while the line formed), and its admission, at
// most 8 events (the first ones and the last).
func (r *report) timeline(b *buyer) string {
	ev := b.events()
	var parts []string
	for i, e := range ev {
		if len(ev) > 8 && i >= 6 && i < len(ev)-2 {
			if i == 6 {
				parts = append(parts, "…")
			}
			continue
		}
		est := "-"
		if e.Known {
			est = fmt.Sprintf("%ds", int(e.Estimate.Seconds()))
		}
		parts = append(parts, fmt.Sprintf("%+.1fs #%d (%s)", e.At.Sub(r.Opened).Seconds(), e.Position, est))
	}
	end := "not admitted"
	if !b.Admitted.IsZero() {
		end = fmt.Sprintf("admitted %+.1fs, %s", b.Admitted.Sub(r.Opened).Seconds(), orDash(b.Outcome))
	}
	if len(parts) == 0 {
		return "no position; " + end
	}
	return strings.Join(parts, ", ") + "; " + end
}
