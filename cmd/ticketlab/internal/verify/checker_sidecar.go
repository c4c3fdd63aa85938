package verify

import (
	"sort"
	"time"
)

// A killed sidecar (issue 31). The nemesis SIGKILLs a sidecar process
// (FaultKillSidecar; Op.Sidecar names it, Inv..Cmp from the kill to its
// restart) and every operation records the sidecar its worker's session
// used. What the cluster promises then:
//
//   - Nothing that sidecar was sent and did not answer before it died is
//     answered: its workers see their sessions end, so an operation in
//     flight at the kill, or sent on its dead session before the restart,
//     is INDETERMINATE (the workers classify it so). The fault's Inv is
//     taken just before the SIGKILL and its Cmp just before the restart, so
//     a definite answer to a request sent before Cmp that was read more than
//     LostDeliveryTolerance after Inv is a violation (one read sooner may
//     have been written before the process died). A grant the cluster made
//     to the dead sidecar (its in-flight acquire, or its queued waiter
//     reaching the head) is therefore never used: no worker learns its
//     token, and the fencing and no-leak checks refuse any write under a
//     token its worker was not granted or after an acquire that was not
//     OK. With sessions the leader releases such grants when the session
//     expires; they explain BUSY and TIMEOUT like any INDETERMINATE
//     acquire's possible grant (model.go).
//   - Its delivered holdings keep their leases: the sidecar died without
//     releasing them, and the leader releases only what it knows nobody
//     was told (a holder behind a dead or partitioned sidecar may be
//     alive and writing; CURATOR-206). So such a holding ends at its lease
//     or an earlier release of its worker (an INDETERMINATE one counts from
//     its invocation), not at the close the worker saw: holdEnds and
//     earliestEnds leave it whole (outlivedSidecar), which makes mutual
//     exclusion and the lock model refuse a grant of its keys to anyone
//     else before that end.

// sidecarKills returns the kill-sidecar faults of a history by sidecar
// number, each sorted by time.
func sidecarKills(ops []Op) map[int][]Op {
	out := map[int][]Op{}
	for _, op := range ops {
		if op.Kind == KindFault && op.Fault == FaultKillSidecar && op.Sidecar > 0 {
			out[op.Sidecar] = append(out[op.Sidecar], op)
		}
	}
	for _, fs := range out {
		sort.Slice(fs, func(i, j int) bool { return fs[i].Inv < fs[j].Inv })
	}
	return out
}

// sidecarLosses returns, by sidecar number, the faults after which a
// delivered holding of that sidecar keeps its whole lease whatever its
// worker saw: a kill, and a partition that cut the sidecar off with the
// old leader (partition-sidecar: its session may expire on the new
// leader, and its worker see its session end, while the holder is alive
// and writing).
func sidecarLosses(ops []Op) map[int][]Op {
	out := sidecarKills(ops)
	for _, op := range ops {
		if op.Kind == KindFault && op.Fault == FaultPartitionSidecar && op.Sidecar > 0 {
			out[op.Sidecar] = append(out[op.Sidecar], op)
		}
	}
	for _, fs := range out {
		sort.Slice(fs, func(i, j int) bool { return fs[i].Inv < fs[j].Inv })
	}
	return out
}

// outlivedSidecar reports whether the grant g was delivered before its
// sidecar was killed at or before at (the completion of a close its
// worker saw): that close, and any later one, did not release it.
func outlivedSidecar(kills map[int][]Op, g Op, at int64) bool {
	for _, f := range kills[g.Sidecar] {
		if f.Fault == FaultPartitionSidecar && at > f.Cmp+int64(2*sidecarSessionTimeout) {
			continue // a close long after the heal is its worker's own
		}
		if g.Cmp < f.Inv && f.Inv <= at {
			return true
		}
	}
	return false
}

// checkKilledSidecars checks that nothing sent to a killed sidecar before
// its restart was answered (see above), and counts the operations in
// flight at a kill and the delivered holdings that outlived their sidecar
// (whose leases mutual exclusion and the model then check whole).
func checkKilledSidecars(ops []Op, grants []Op, r *CheckReport, bad func(string, string, ...any)) {
	kills := sidecarKills(ops)
	for _, fs := range kills {
		r.SidecarKills += len(fs)
	}
	if len(kills) == 0 {
		return
	}
	ended := map[int64]int64{} // grant id → invocation of its first release
	for _, op := range ops {
		if op.Kind == KindRelease {
			if at, ok := ended[op.Acq]; !ok || op.Inv < at {
				ended[op.Acq] = op.Inv
			}
		}
	}
	for _, g := range grants {
		for _, f := range kills[g.Sidecar] {
			at, released := ended[g.ID]
			if g.Cmp < f.Inv && (!released || at >= f.Inv) && g.Inv+g.LeaseMs*int64(time.Millisecond) > f.Inv {
				r.KilledHoldings++
				break
			}
		}
	}
	for _, op := range ops {
		switch op.Kind {
		case KindAcquire, KindRelease, KindExtend:
		case KindPermit, KindPermitRelease, KindPermitExtend:
			// A dead sidecar answers no permit request either (issue 41).
		default:
			continue
		}
		for _, f := range kills[op.Sidecar] {
			if op.Cmp < f.Inv || op.Inv >= f.Cmp {
				continue // answered before the kill, or sent to the restarted sidecar
			}
			if op.Inv < f.Inv {
				r.KilledInFlight++
			}
			if op.Result != ResIndeterminate && op.Cmp > f.Inv+int64(LostDeliveryTolerance) {
				bad("dead-sidecar", "w%d's %s of %s sent at %s was answered %s at %s, but sidecar%d was killed at %s and restarted only at %s: nobody could answer it",
					op.Worker, op.Kind, orNone(opKeys(op)), ts(op.Inv), op.Result, ts(op.Cmp), f.Sidecar, ts(f.Inv), ts(f.Cmp))
			}
			break
		}
	}
}
