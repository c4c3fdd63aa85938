package verify

import (
	"sort"
	"strconv"
	"time"
)

// The checks of issue 19: extended leases and the lost signal.
//
// Extended leases never let two holders overlap. A holding's lease is
// counted by the leader from when it applies the grant, or the last
// EXTEND it applied, so it cannot run out before that request's send time +
// its lease (the nodes, the sidecars and the workers share this machine's
// clock; the nemesis shifts only the time the nodes stamp into commands,
// and the leader times leases on its monotonic clock). leaseEnds is that
// earliest end for every grant: send time + lease of the ACQUIRE or of the
// last EXTEND answered OK. It is the full lease, not the holder's claimed
// window (send + lease − 250 ms − 1 %, extendMargin, the rule the holders
// and the official clients act on): the claimed window lies inside it, so
// checking the full lease is the stronger check — a leader that ended an
// extended lease early, or ignored an EXTEND, hands the key over inside it.
// The conservative holding ends (holdEnds) and the model's earliest unseen
// ends (earliestEnds) start from it, so mutual exclusion, the per-key token
// order and linearizability all see the extended holdings.
//
// An INDETERMINATE EXTEND may or may not have been applied, at any time
// after its send: a lease it renewed runs at least to its send + its lease
// if it was sent after the last OK, else to the last OK's send + its
// lease. leaseEnds takes the earlier of that and the OK's bound, so a
// shorter lease asked in an INDETERMINATE EXTEND is allowed to end the
// holding sooner.
//
// The lost signal (checkLostSignal). What the leader guarantees: when it
// applies an expiry of token t on key k it sends the lost event X(t) in
// the same apply, before the hand-off G of k to the next waiter (or before
// any later grant of k, which needs the expiry applied first). So for the
// next holder's grant G' on k (the next in token order: fencing order, the
// smallest token above t granted on k), send(X) ≤ send(G'). What the
// history shows is the other end of each path: recv(X), when the old
// holder's session read `! LOST t expired`, and recv(G'), when the new
// holder read its `OK`. With d(X) the delivery time of X (leader →
// sidecar → session), recv(X) = send(X) + d(X) ≤ send(G') + d(X) ≤ recv(G')
// + d(X). Delivery is the only slack, so the rule is
//
//	recv(X) ≤ recv(G') + LostDeliveryTolerance,
//
// checked for every `expired` event of a key that had a next holder,
// except while a process on X's path was stopped: the old holder's worker
// process (pause-worker: it reads the event when it resumes) or a node
// (pause-leader, pause-follower: the leader may stop between writing G'
// and writing X to another sidecar). The tolerance bounds scheduling on a
// loaded machine, not the protocol; the summary prints the largest lag
// seen. The converse is exact: an expiry is never sent before the lease
// ran out, so recv(X) ≥ leaseEnds(t) (less timeoutMargin for the clocks).
//
// On one session the lines are ordered, and the history keeps that order
// (the reader stamps replies and events as it reads them), so the session
// rules of PROTOCOL.md are checked exactly: at most one `! LOST` per lock;
// an EXTEND refused not_held, token_mismatch or owner_mismatch has a
// `! LOST` of the token before its reply (`moved` first when the cluster
// refused it; at once when the session had already forgotten it); a
// `moved` event comes only inside such a refused EXTEND; and once a session
// read `! LOST t`, no EXTEND or RELEASE of t is answered OK after it.

// LostDeliveryTolerance bounds how long a lost event may take from the
// leader to a running holder's session beyond the next holder's grant
// (see above).
const LostDeliveryTolerance = 2 * time.Second

// leaseEnds is, for every grant, the earliest time its lease can run out:
// the send time + lease of the grant or of its last EXTEND answered OK,
// or earlier what an INDETERMINATE EXTEND may have set.
func leaseEnds(ops []Op, grants []Op) map[int64]int64 {
	type base struct{ from, lease int64 }
	last := map[int64]base{}
	for _, g := range grants {
		last[g.ID] = base{g.Inv, g.LeaseMs * int64(time.Millisecond)}
	}
	exts := extendsOf(ops)
	end := map[int64]int64{}
	for id, b := range last {
		for _, e := range exts[id] {
			if e.Result == ResOK && e.Inv >= b.from {
				b = base{e.Inv, e.LeaseMs * int64(time.Millisecond)}
			}
		}
		at := b.from + b.lease
		for _, e := range exts[id] {
			if e.Result == ResIndeterminate {
				at = min(at, max(b.from, e.Inv)+e.LeaseMs*int64(time.Millisecond))
			}
		}
		end[id] = at
	}
	return end
}

// extendsOf files the EXTENDs of the history under their grants, each
// grant's sorted by send time.
func extendsOf(ops []Op) map[int64][]Op {
	out := map[int64][]Op{}
	for _, op := range ops {
		if op.Kind == KindExtend {
			out[op.Acq] = append(out[op.Acq], op)
		}
	}
	for _, es := range out {
		sort.SliceStable(es, func(i, j int) bool { return es[i].Inv < es[j].Inv })
	}
	return out
}

// stallKinds are the faults that stop a process on a lost event's path,
// or cut it (partition-sidecar: a sidecar cut off from the new leader
// cannot hear its events until the heal).
var stallKinds = map[string]bool{FaultPauseLeader: true, FaultPauseFollower: true, FaultPartitionSidecar: true}

// checkLostSignal checks the extenders' EXTENDs and lost events (see the
// comment at the top of this file) and counts them into r.
func checkLostSignal(ops []Op, grants []Op, r *CheckReport, bad func(string, string, ...any)) {
	byToken := map[uint64]Op{}
	for _, g := range grants {
		byToken[g.Token] = g
	}
	lends := leaseEnds(ops, grants)
	exts := extendsOf(ops)
	lostOf := map[uint64][]Op{}
	var faults []Op
	releases := map[int64][]Op{}
	for _, op := range ops {
		switch op.Kind {
		case KindLost:
			lostOf[op.Token] = append(lostOf[op.Token], op)
		case KindFault:
			faults = append(faults, op)
		case KindRelease:
			releases[op.Acq] = append(releases[op.Acq], op)
		case KindExtend:
			switch {
			case op.Result == ResOK:
				r.Extends++
			case op.Result == ResIndeterminate:
				r.ExtendsIndeterminate++
			case definiteReleaseError(op.Err):
				r.ExtendsRefused++
			default:
				r.ExtendsFailed++
			}
		}
	}
	// The next holder of each key in token order.
	byKey := map[string][]Op{}
	for _, g := range grants {
		for _, k := range opKeys(g) {
			byKey[k] = append(byKey[k], g)
		}
	}
	for _, gs := range byKey {
		sort.Slice(gs, func(i, j int) bool { return gs[i].Token < gs[j].Token })
	}
	next := func(key string, tok uint64) (Op, bool) {
		gs := byKey[key]
		i := sort.Search(len(gs), func(i int) bool { return gs[i].Token > tok })
		if i == len(gs) {
			return Op{}, false
		}
		return gs[i], true
	}
	stopped := func(worker int, from, to int64) bool {
		for _, f := range faults {
			if f.Cmp < from || f.Inv > to {
				continue
			}
			if stallKinds[f.Fault] || (f.Fault == FaultPauseWorker || f.Fault == FaultHostile) && f.Target == workerName(worker) {
				return true
			}
		}
		return false
	}

	tokens := make([]uint64, 0, len(lostOf))
	for t := range lostOf {
		tokens = append(tokens, t)
	}
	sort.Slice(tokens, func(i, j int) bool { return tokens[i] < tokens[j] })
	for _, t := range tokens {
		evs := lostOf[t]
		if r.LostEvents == nil {
			r.LostEvents = map[string]int{}
		}
		for _, ev := range evs {
			r.LostEvents[ev.Reason]++
		}
		g, ok := byToken[t]
		if !ok || g.Worker != evs[0].Worker || g.Conn != evs[0].Conn {
			bad("lost-signal", "w%d read `! LOST %d %s` on session %d, but that session was never granted token %d", evs[0].Worker, t, evs[0].Reason, evs[0].Conn, t)
			continue
		}
		if len(evs) > 1 {
			bad("lost-signal", "%s: %d `! LOST` events (%s at %s, %s at %s): at most one per lock", describe(g), len(evs), evs[0].Reason, ts(evs[0].Inv), evs[1].Reason, ts(evs[1].Inv))
		}
		ev := evs[0]
		// After the event the session has forgotten the lock.
		for _, e := range exts[g.ID] {
			if e.Result == ResOK && e.Cmp > ev.Inv {
				bad("lost-signal", "%s: an EXTEND answered OK at %s after the session read `! LOST %s` at %s", describe(g), ts(e.Cmp), ev.Reason, ts(ev.Inv))
			}
		}
		for _, rel := range releases[g.ID] {
			if rel.Result == ResOK && rel.Cmp > ev.Inv {
				bad("lost-signal", "%s: a RELEASE answered OK at %s after the session read `! LOST %s` at %s", describe(g), ts(rel.Cmp), ev.Reason, ts(ev.Inv))
			}
		}
		switch ev.Reason {
		case "expired":
			if ev.Inv < lends[g.ID]-int64(timeoutMargin) {
				bad("lost-signal", "%s: `! LOST expired` read at %s, before its lease could run out (%s: sent at the grant or the last OK EXTEND + lease)",
					describe(g), ts(ev.Inv), ts(lends[g.ID]))
			}
			for _, k := range opKeys(g) {
				n, ok := next(k, t)
				if !ok {
					continue
				}
				if stopped(g.Worker, n.Cmp-int64(LostDeliveryTolerance), ev.Inv) {
					r.LostExempt++
					continue
				}
				if g.Cmp >= lends[g.ID] {
					// The holder read its grant only after its lease
					// had run out by its own clock (no EXTEND of it
					// answered OK renewed it since; a resume answered
					// the recorded grant after the holding had expired
					// and been handed on; seed 3940, 5 nodes): it knows
					// the lock is over, and the leader's order of X
					// before the next G says nothing of a G it told late.
					r.LostExempt++
					continue
				}
				r.LostChecked++
				lag := time.Duration(ev.Inv - n.Cmp)
				r.LostMaxLag = max(r.LostMaxLag, lag)
				if lag > LostDeliveryTolerance {
					bad("lost-signal", "key %s: %s read `! LOST expired` at %s, %v after the next holder %s read its grant (%s); the leader sends the event first (tolerance %v)",
						k, describe(g), ts(ev.Inv), lag.Round(time.Millisecond), describe(n), ts(n.Cmp), LostDeliveryTolerance)
				}
			}
		case "revoked":
			// An operator's revoke of this token was sent before the
			// event was read (FaultRevoke; issue 42).
			sent := false
			for _, f := range faults {
				if f.Fault == FaultRevoke && f.Token == t && f.Inv <= ev.Inv {
					sent = true
				}
			}
			if !sent {
				bad("lost-signal", "%s: `! LOST revoked` read at %s, but no revoke of its token was sent before", describe(g), ts(ev.Inv))
			}
		case "moved":
			in := false
			for _, e := range exts[g.ID] {
				if e.Result == ResError && definiteReleaseError(e.Err) && e.Inv <= ev.Inv && ev.Inv <= e.Cmp {
					in = true
				}
			}
			if !in {
				bad("lost-signal", "%s: `! LOST moved` read at %s outside any EXTEND of it that the cluster refused", describe(g), ts(ev.Inv))
			}
		}
	}
	// Every refused EXTEND was told by a loss event first.
	for id, es := range exts {
		for _, e := range es {
			if e.Result != ResError || !definiteReleaseError(e.Err) {
				continue
			}
			g := byToken[e.Token]
			told := false
			for _, ev := range lostOf[e.Token] {
				if g.ID == id && ev.Inv <= e.Cmp {
					told = true
				}
			}
			if !told {
				bad("lost-signal", "w%d's EXTEND of %s token %d was answered %s at %s with no `! LOST` of the token before it", e.Worker, e.Key, e.Token, e.Err, ts(e.Cmp))
			}
		}
	}
	// Stalls past the lease, and how the holder learned of the loss.
	for _, op := range ops {
		if op.Kind != KindStall {
			continue
		}
		r.Stalls++
		noticed := false
		for _, ev := range lostOf[op.Token] {
			if ev.Inv <= op.Cmp {
				r.StallsTold++
				noticed = true
			}
		}
		if noticed {
			continue
		}
		for _, e := range exts[op.Acq] {
			if e.Inv < op.Cmp {
				continue
			}
			switch {
			case e.Result == ResOK:
				r.StallsStillHeld++
			case e.Result == ResError && definiteReleaseError(e.Err):
				r.StallsRefused++
			}
			break // the first EXTEND after the stall tells
		}
	}
}

// workerName is how a fault's Target names a worker process.
func workerName(worker int) string { return "w" + strconv.Itoa(worker) }
