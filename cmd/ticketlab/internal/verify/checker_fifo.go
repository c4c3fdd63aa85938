package verify

import (
	"sort"
	"time"
)

// Per-key FIFO across leader changes (issue 31).
//
// The cluster keeps one FIFO queue per key (locksm/MATRIX.md: a waiter
// joins at the tail, a block joins every queue of its keys in one
// command, a hand-off grants the head, a block heading a key reserves it),
// and with sidecar sessions a new leader keeps the queue. The order in
// which waiters were queued is what the workers read: the `! QUEUED` event
// of an acquire (Op.Queued) is the cluster's Q passed on, written after the
// leader applied the acquire into its keys' queues. So when a waiter A's
// event was read before another acquire B of one of A's keys was sent
// (A.Queued < B.Inv, one machine clock), A stood ahead of B in that key's
// line for as long as A waited. That is a partial order (two waiters whose
// event and send overlap are not ordered by it), exact for the line the
// kill-leader-queues fault builds one confirmed waiter at a time, and it
// holds across leader changes because the queue is replicated state.
//
// A violation is a grant to B that overtakes such an A while A still
// waited on the key:
//
//   - A was granted too, under a larger token: tokens grow with every grant
//     in log order, so B was granted first, and A, granted later, had not
//     left the line (a waiter leaves only by its grant or by a cancel, and
//     a cancelled waiter is never granted);
//   - A got TIMEOUT, but B's grant was read before A's wait could have
//     ended: the leader cancels a wait no earlier than its arrival + wait
//     (a new leader re-arms it from the replicated enqueue stamp), so A
//     was still queued when B was granted. Not judged when a hand-over may
//     have withdrawn waiters early (the nemesis's wipe and replace faults,
//     as for the model's TIMEOUTs) or when A's wait overlapped a clock
//     fault (a new leader re-arms a wait from an enqueue stamp written on
//     a shifted clock: docs/sessions.md, "Clock skew").
//
// A waiter that left the line otherwise — INDETERMINATE (its session, its
// sidecar or, without sessions, the leader that queued it died), an
// error — is taken out of the line, not a violation.

// checkFIFO checks every grant against the waiters queued on its keys
// before it was sent, and counts into r.
func checkFIFO(ops []Op, r *CheckReport, bad func(string, string, ...any)) {
	handover := false
	var clocks, leaders []Op
	for _, op := range ops {
		if op.Kind != KindFault {
			continue
		}
		switch {
		case op.Fault == FaultWipeFollower || op.Fault == FaultWipeQuorum || op.Fault == FaultReplace:
			handover = true
		case op.Fault == FaultClockForward || op.Fault == FaultClockBackward:
			clocks = append(clocks, op)
		}
		if leaderFaults[op.Fault] {
			leaders = append(leaders, op)
		}
	}
	skewed := func(a Op) bool {
		for _, f := range clocks {
			if a.Inv <= f.Cmp && a.Cmp >= f.Inv {
				return true
			}
		}
		return false
	}

	// The queued waiters of every key, by the time their event was read.
	type waiter struct {
		op Op
		// tok: its token if it was granted (0: not granted); waitEnd: for
		// a judged TIMEOUT, the earliest its cancel can have been applied
		// (0: not judged).
		tok     uint64
		waitEnd int64
	}
	lines := map[string][]waiter{}
	var grants []Op
	for _, op := range ops {
		if op.Kind != KindAcquire {
			continue
		}
		if op.Result == ResOK {
			grants = append(grants, op)
		}
		if op.Queued == 0 {
			continue
		}
		r.Queued++
		w := waiter{op: op}
		switch op.Result {
		case ResOK:
			w.tok = op.Token
			r.QueuedGranted++
			for _, f := range leaders {
				if op.Queued < f.Inv && f.Inv < op.Cmp {
					r.QueuedThroughLeaderChange++
					break
				}
			}
		case ResTimeout:
			if !handover && !skewed(op) {
				w.waitEnd = op.Inv + op.WaitMs*int64(time.Millisecond) - int64(timeoutMargin)
			}
		}
		for _, k := range opKeys(op) {
			lines[k] = append(lines[k], w)
		}
	}
	// Per key: the waiters by event time, with the running maximum of the
	// tokens granted (and of the wait ends) among the first i of them.
	type prefix struct {
		tok     uint64
		tokAt   int // the waiter of tok
		waitEnd int64
		endAt   int
	}
	prefixes := map[string][]prefix{}
	for k, line := range lines {
		sort.SliceStable(line, func(i, j int) bool { return line[i].op.Queued < line[j].op.Queued })
		ps := make([]prefix, len(line))
		var cur prefix
		for i, w := range line {
			if w.tok > cur.tok {
				cur.tok, cur.tokAt = w.tok, i
			}
			if w.waitEnd > cur.waitEnd {
				cur.waitEnd, cur.endAt = w.waitEnd, i
			}
			ps[i] = cur
		}
		prefixes[k] = ps
	}
	for _, b := range grants {
		checked := false
		for _, k := range opKeys(b) {
			line := lines[k]
			// The waiters whose event was read before b was sent.
			n := sort.Search(len(line), func(i int) bool { return line[i].op.Queued >= b.Inv })
			if n == 0 {
				continue
			}
			checked = true
			p := prefixes[k][n-1]
			if p.tok > b.Token {
				a := line[p.tokAt].op
				bad("fifo", "key %s: %s was queued (its QUEUED read at %s) before %s was sent (%s), yet was granted after it: %s overtook a waiter still in line",
					k, describe(a), ts(a.Queued), describe(b), ts(b.Inv), describe(b))
			}
			if p.waitEnd > b.Cmp {
				a := line[p.endAt].op
				bad("fifo", "key %s: w%d was queued (its QUEUED read at %s) before %s was sent (%s) and waited until at least %s (TIMEOUT, wait %dms), yet %s was granted by %s: it overtook a waiter still in line",
					k, a.Worker, ts(a.Queued), describe(b), ts(b.Inv), ts(p.waitEnd), a.WaitMs, describe(b), ts(b.Cmp))
			}
		}
		if checked {
			r.FIFOChecked++
		}
	}
}
