package verify

import (
	"sort"
	"time"
)

// Where the INDETERMINATE outcomes fall (issue 31). With sidecar sessions
// an outcome stays unknown only when the session cannot be resumed within
// the request's deadline: no leader serves in time, or the session (its
// sidecar) is gone. The checker therefore sorts every INDETERMINATE
// acquire, release and extend:
//
//   - killed sidecar: sent to a sidecar before a kill-sidecar (or
//     stop-sidecar) fault's restart and answered after its kill (in flight
//     at the kill, or on its dead session): nobody could answer it;
//   - no leader: answered inside a window without a serving leader, as the
//     workers of its sidecar saw it. A window opens when a fault that can
//     leave the cluster without a serving leader begins (leaderFaults: the
//     leader killed, paused or cut off, a partition, a wiped quorum, a
//     replacement) and closes when a worker of that sidecar reads the
//     first grant of an acquire it sent after the fault began (after it
//     ended, for the faults in phasedFaults). That grant
//     needs a serving leader and the sidecar's connection to it (with
//     sessions, its resume), so the window covers the election, the new
//     leader's barrier and the sidecar finding it. It is an upper bound of
//     the time without service, by the first grant's own latency; a fault
//     that did not take service away (a partition that left the leader its
//     majority) closes its window with the next grant, a few milliseconds
//     later. An answer that comes a moment after that first grant (a
//     waiter the new leader dropped, answered in the same instant) counts
//     as outside: the split errs towards "outside";
//   - cut short: answered after the harness told the workload to stop
//     (KindEnd): its worker gave up waiting, the cluster did not answer;
//   - outside: everything else: a request the cluster could have answered
//     definitely (today: a sidecar's dropped connection without sessions,
//     a waiter a new leader dropped, a lost reply). The sessions' target is
//     none.

// phasedFaults take service away at some point within the fault, not at
// its start: a wiped quorum first partitions a minority while the majority
// still serves, and only then kills the majority; a replacement may move
// the leadership at its end. Their window closes with the first grant of
// an acquire sent after the fault ended (a grant within the fault may come
// before the outage: in a 3-node run on 2026-12-04, 18 INDETERMINATE
// acquires whose deadlines passed while a wiped quorum had no leader were
// counted outside, because grants in its partition phase had closed the
// window).
var phasedFaults = map[string]bool{FaultWipeQuorum: true, FaultReplace: true}

// killStampSlack: an INDETERMINATE answered this little before a
// kill-sidecar fault's recorded start still counts as killed by it. The
// nemesis stamps the fault before it sends the signal, but the stamp and
// the worker's are read on different threads (or processes): in a 3-node
// wal run (seed 611893) a connection of the killed sidecar was seen dead
// 1 ms before the fault's stamp, and counted outside every window. Only
// this split uses it, never a violation.
const killStampSlack = 20 * time.Millisecond

// indeterminateSplit sorts the INDETERMINATE acquires, releases and
// extends of ops (see above) into r.
func indeterminateSplit(ops []Op, r *CheckReport) {
	// A sidecar stopped (stop-sidecar: SIGTERM, then started again) ends
	// its sessions' requests like a killed one.
	kills := sidecarKills(ops)
	for _, op := range ops {
		if op.Kind == KindFault && op.Fault == FaultStopSidecar && op.Sidecar > 0 {
			kills[op.Sidecar] = append(kills[op.Sidecar], op)
		}
	}
	// Grants by the sidecar their worker used, by invocation.
	type grant struct{ inv, cmp int64 }
	grants := map[int][]grant{}
	var faults []Op
	stop := int64(never)
	for _, op := range ops {
		switch {
		case op.Kind == KindEnd:
			stop = min(stop, op.Inv)
		case op.Kind == KindAcquire && op.Result == ResOK:
			grants[op.Sidecar] = append(grants[op.Sidecar], grant{op.Inv, op.Cmp})
		case op.Kind == KindFault && leaderFaults[op.Fault]:
			faults = append(faults, op)
		}
	}
	// The earliest completion among the grants invoked at or after each
	// (suffix minimum), per sidecar.
	for _, g := range grants {
		sort.Slice(g, func(i, j int) bool { return g[i].inv < g[j].inv })
		for i := len(g) - 2; i >= 0; i-- {
			g[i].cmp = min(g[i].cmp, g[i+1].cmp)
		}
	}
	// The windows of each sidecar.
	windows := map[int][][2]int64{}
	window := func(j int, f Op) [2]int64 {
		g := grants[j]
		end := int64(never)
		from := f.Inv
		if phasedFaults[f.Fault] {
			from = f.Cmp
		}
		if i := sort.Search(len(g), func(i int) bool { return g[i].inv >= from }); i < len(g) {
			end = g[i].cmp
		}
		return [2]int64{f.Inv, end}
	}
	total := map[[2]int64]bool{}
	for j := range grants {
		for _, f := range faults {
			w := window(j, f)
			windows[j] = append(windows[j], w)
			total[w] = true
		}
	}
	r.NoLeaderWindows = len(faults)
	// Their length: the union over every sidecar's windows (ending at the
	// last completion of the history when no grant closed one).
	last := int64(0)
	for _, op := range ops {
		last = max(last, op.Cmp)
	}
	var spans [][2]int64
	for w := range total {
		spans = append(spans, [2]int64{w[0], min(w[1], last)})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i][0] < spans[j][0] })
	cur := [2]int64{0, -1}
	for _, s := range spans {
		if s[0] > cur[1] {
			if cur[1] > cur[0] {
				r.NoLeaderTime += time.Duration(cur[1] - cur[0])
			}
			cur = s
		} else {
			cur[1] = max(cur[1], s[1])
		}
	}
	if cur[1] > cur[0] {
		r.NoLeaderTime += time.Duration(cur[1] - cur[0])
	}

	inWindow := func(op Op) bool {
		ws := windows[op.Sidecar]
		if _, known := grants[op.Sidecar]; !known {
			// A sidecar with no grant at all: every fault's window stays
			// open to the end.
			for _, f := range faults {
				if op.Cmp >= f.Inv {
					return true
				}
			}
			return false
		}
		for _, w := range ws {
			if op.Cmp >= w[0] && op.Cmp <= w[1] {
				return true
			}
		}
		return false
	}
	deadSidecar := func(op Op) bool {
		for _, f := range kills[op.Sidecar] {
			if op.Inv < f.Cmp && op.Cmp >= f.Inv-int64(killStampSlack) {
				return true
			}
		}
		return false
	}
	for _, op := range ops {
		if op.Result != ResIndeterminate {
			continue
		}
		var split *IndeterminateSplit
		switch op.Kind {
		case KindAcquire:
			split = &r.IndeterminateAcquires
		case KindRelease, KindExtend:
			split = &r.IndeterminateOthers
		default:
			continue
		}
		switch {
		case op.Cmp >= stop:
			split.Stopped++
		case deadSidecar(op):
			split.DeadSidecar++
		case inWindow(op):
			split.NoLeader++
		default:
			split.Outside++
		}
	}
}

// IndeterminateSplit counts INDETERMINATE outcomes by where they fell
// (checker_indeterminate.go).
type IndeterminateSplit struct {
	// NoLeader: answered inside a window without a serving leader;
	// DeadSidecar: sent to a sidecar that was killed before it answered;
	// Stopped: cut short by its worker when the workload stopped;
	// Outside: the rest.
	NoLeader, DeadSidecar, Stopped, Outside int
}

// Total is the number of INDETERMINATE outcomes counted.
func (s IndeterminateSplit) Total() int { return s.NoLeader + s.DeadSidecar + s.Stopped + s.Outside }
