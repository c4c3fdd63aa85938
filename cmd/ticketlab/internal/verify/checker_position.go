package verify

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Places in line (issue 41, part 2). A session that agreed `HELLO 7
// events` is told `! POSITION <n> <place> <estimate> <key>` for a waiting
// ACQUIRE or PERMIT: its place in the key's line, 1 = next, "exact as the
// cluster's leader counted the line (the waiters still queued ahead of it,
// plus one)", sent when it changed, before the reply and never after it
// (unixapi/PROTOCOL.md, "Position: your place in line"). lineConn records
// every such event (KindPosition, with the request it names and when it
// was read), and checkPositions judges them:
//
//   - well-formed: a place is at least 1, names a key of its request,
//     and names a request of the session that could wait: never one sent
//     with wait 0 or answered BUSY or a definite error (none of them ever
//     stood in a line), never an unknown request line;
//   - before the reply: none is read after its request's reply (lineConn
//     knows: the one reader stamps every line in wire order). A request
//     whose session ended without a reply is exempt (lines buffered before
//     the close may be read after the harness gave up on it);
//   - monotone: per request and key, the places told never go up (nobody
//     joins a line ahead of a waiter). A repeat of the same place is legal:
//     the leader tells a waiter only a changed place, but "told" is per
//     connection and leader, and a new leader's adoption at Serve, a
//     session's resume, and a new broker connection's `w` all retell every
//     place, changed or not (cluster/leader/testdata/positions.txt, the
//     last case). The lab cannot see every broker reconnection (a dropped
//     cluster connection is the sidecar's affair), so repeats are counted
//     (Retold), never judged;
//   - exact: see exactPlaces below;
//   - kept across leader faults: counted (AfterLeader, AfterKill): the
//     waiters queued before a leader fault began that were told a place
//     after a new leader served (after the first grant of an acquire sent
//     after the fault began: the window of checker_indeterminate.go). Their
//     places are judged by the same exact check as every other, and a
//     waiter still in line a while after a new leader served must have
//     been told its place again (retoldAfterKills: positions-kept).

// PositionReport is what checkPositions counted.
type PositionReport struct {
	// Sessions7 and SessionsOlder count the acquires and permits sent on
	// lineConn sessions that agreed version 7 (told places) and an older
	// version (a sidecar without places).
	Sessions7, SessionsOlder int
	// Events is the number of `! POSITION` events read, PermitEvents of
	// them to permit waiters; Waiters the (request, key) pairs told at
	// least one; Retold the events that repeated the place told before.
	Events, PermitEvents, Waiters, Retold int
	// Exact is the number of events judged by the exact check (their key's
	// every request is in the history), Pinned of them those whose bounds
	// met (the place was known to the unit), ExactKeys the keys judged.
	Exact, Pinned, ExactKeys int
	// AfterLeader counts the waiters queued before a leader fault began
	// and told a place after a new leader served (AfterLeaderEvents: those
	// events); AfterKill the same for the faults that killed the leader
	// (kill-leader, kill-leader-queues).
	AfterLeader, AfterLeaderEvents, AfterKill int
	// KeptRetold is the number of waiters queued before a leader kill and
	// still waiting when their sidecar saw a new leader serve that were
	// told their places again within keptBound (retoldAfterKills);
	// KeptLeft those answered sooner without, or under another fault
	// (nothing owed); KeptUnchanged those whose place may not have
	// changed since they were last told it (the sidecar passes on only a
	// changed place: nothing owed). A waiter still waiting past the bound
	// untold, whose place surely changed, is a violation.
	KeptRetold, KeptLeft, KeptUnchanged int
}

// positionWaiter is one (request, key) told places.
type positionWaiter struct {
	req    Op
	key    string
	events []Op // by read time
}

// checkPositions judges every `! POSITION` event of ops (see above).
// holdEnd is holdEnds of the lock grants.
func checkPositions(ops []Op, holdEnd map[int64]int64, interval time.Duration, r *PositionReport, bad func(string, string, ...any)) {
	reqs := map[int64]Op{}
	var events []Op
	for _, op := range ops {
		switch op.Kind {
		case KindAcquire, KindPermit:
			reqs[op.ID] = op
			switch {
			case op.Proto >= lineVersionPositions:
				r.Sessions7++
			case op.Proto > 0:
				r.SessionsOlder++
			}
		case KindPosition:
			events = append(events, op)
		}
	}
	sort.SliceStable(events, func(i, j int) bool { return events[i].Inv < events[j].Inv })
	waiters := map[[2]string]*positionWaiter{}
	var order []*positionWaiter
	for _, ev := range events {
		r.Events++
		req, ok := reqs[ev.Acq]
		if !ok || ev.Acq == 0 {
			bad("positions", "w%d was told place %d on %s at %s for no request of its session that waits (a request line that is no ACQUIRE or PERMIT, or unknown)",
				ev.Worker, ev.N, ev.Key, ts(ev.Inv))
			continue
		}
		if req.Kind == KindPermit {
			r.PermitEvents++
		}
		who := fmt.Sprintf("w%d's %s of %s (sent %s, answered %s at %s)", req.Worker, req.Kind, strings.Join(opKeys(req), "+"), ts(req.Inv), orResult(req.Result), ts(req.Cmp))
		if ev.N < 1 {
			bad("positions", "%s was told place %d at %s: places count from 1", who, ev.N, ts(ev.Inv))
		}
		if !containsKey(opKeys(req), ev.Key) {
			bad("positions", "%s was told place %d on %s at %s, a key it did not ask for", who, ev.N, ev.Key, ts(ev.Inv))
			continue
		}
		if req.WaitMs == 0 || req.Result == ResBusy || req.Result == ResError {
			bad("positions", "%s was told place %d at %s, but it never stood in a line (wait %dms, answered %s)", who, ev.N, ts(ev.Inv), req.WaitMs, orResult(req.Result))
		}
		if replied(req) && (ev.After == "reply" || ev.Inv > req.Cmp) {
			bad("positions", "%s was told place %d on %s at %s, after its reply", who, ev.N, ev.Key, ts(ev.Inv))
		}
		k := [2]string{fmt.Sprint(req.ID), ev.Key}
		w := waiters[k]
		if w == nil {
			w = &positionWaiter{req: req, key: ev.Key}
			waiters[k] = w
			order = append(order, w)
		}
		w.events = append(w.events, ev)
	}
	r.Waiters = len(order)

	// Monotone.
	for _, w := range order {
		for i := 1; i < len(w.events); i++ {
			prev, cur := w.events[i-1], w.events[i]
			switch {
			case cur.N > prev.N:
				bad("positions", "w%d's %s of %s (sent %s) was told place %d at %s after place %d at %s: a place went up",
					w.req.Worker, w.req.Kind, w.key, ts(w.req.Inv), cur.N, ts(cur.Inv), prev.N, ts(prev.Inv))
			case cur.N == prev.N:
				r.Retold++
			}
		}
	}

	aheadOf := exactPlaces(ops, order, holdEnd, r, bad)
	keptAcrossLeaders(ops, order, firstTold(order), r)
	if interval > 0 {
		retoldAfterKills(ops, reqs, events, firstTold(order), aheadOf, interval, r, bad)
	}
}

// retoldAfterKills: a waiter still in line a while after a new leader
// served has been told its place again (the resume of its session, or the
// adoption of its waiters at Serve, makes the new leader tell every place
// at its next walk, changed or not: cluster/leader/testdata/positions.txt).
// Judged for the faults that kill the leader (kill-leader,
// kill-leader-queues), on each request of a version-7 session confirmed
// queued (QUEUED or a place read) before the kill that was still waiting,
// and later answered by its sidecar, keptBound(interval) after the first
// grant its sidecar's workers read of a request sent after the kill (its
// sidecar had found the new leader by then), when no other fault began
// meanwhile: by then it must have been told a place (of any of its keys)
// read more than lineStaleFrames after the kill. A liveness bound, as the
// recovery bound is one; keptBound is many walks. (The kill-leader-queues
// fault keeps every other key's line waiting until its waiters were told
// again, up to lineRetellWait after the restart: a new leader that does
// not retell leaves them waiting past the bound.)
func retoldAfterKills(ops []Op, reqs map[int64]Op, events []Op, first map[int64]int64, aheadOf map[waiterKey][]leaveSpan,
	interval time.Duration, r *PositionReport, bad func(string, string, ...any)) {
	bound := keptBound(interval)
	told := map[int64][]int64{} // request → read times of its places
	lastOn := map[waiterKey]int64{}
	for _, ev := range events {
		told[ev.Acq] = append(told[ev.Acq], ev.Inv)
		wk := waiterKey{ev.Acq, ev.Key}
		lastOn[wk] = max(lastOn[wk], ev.Inv)
	}
	// changed reports whether w's place on one of its keys surely changed
	// since it was last told it there, by the time t: a waiter surely
	// ahead of it and surely still in line when that place was counted
	// (its earliest leave after the place's read) surely left by t (its
	// latest leave). The sidecar passes on a place only when it changed
	// (a new leader's retelling of an unchanged place is not written), so
	// only such a waiter is owed a new one.
	changed := func(w Op, t int64) bool {
		for _, k := range opKeys(w) {
			wk := waiterKey{w.ID, k}
			last, ok := lastOn[wk]
			if !ok {
				continue
			}
			for _, x := range aheadOf[wk] {
				if x.earliest > last && x.latest <= t {
					return true
				}
			}
		}
		return false
	}
	type grant struct{ inv, cmp int64 }
	grants := map[int][]grant{}
	var faults []Op
	for _, op := range ops {
		switch {
		case (op.Kind == KindAcquire || op.Kind == KindPermit) && op.Result == ResOK:
			grants[op.Sidecar] = append(grants[op.Sidecar], grant{op.Inv, op.Cmp})
		case op.Kind == KindFault:
			faults = append(faults, op)
		}
	}
	for _, g := range grants {
		sort.Slice(g, func(i, j int) bool { return g[i].inv < g[j].inv })
		for i := len(g) - 2; i >= 0; i-- {
			g[i].cmp = min(g[i].cmp, g[i+1].cmp)
		}
	}
	ids := make([]int64, 0, len(reqs))
	for id := range reqs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, f := range faults {
		if f.Fault != FaultKillLeader && f.Fault != FaultKillLeaderQueues {
			continue
		}
		for _, id := range ids {
			w := reqs[id]
			if w.Proto < lineVersionPositions || w.WaitMs == 0 || !replied(w) || w.Result == ResIndeterminate {
				continue
			}
			qw := w.Queued
			if t, ok := first[w.ID]; ok && (qw == 0 || t < qw) {
				qw = t
			}
			if qw == 0 || qw >= f.Inv {
				continue
			}
			g := grants[w.Sidecar]
			i := sort.Search(len(g), func(i int) bool { return g[i].inv >= f.Inv })
			if i == len(g) {
				continue
			}
			served := g[i].cmp
			due := served + int64(bound)
			if w.Cmp <= served {
				continue // answered before its sidecar saw the new leader serve
			}
			ok := false
			for _, t := range told[w.ID] {
				if t > f.Inv+int64(lineStaleFrames) && t <= min(w.Cmp, due) {
					ok = true
				}
			}
			other := false
			for _, o := range faults {
				if o.Inv != f.Inv && o.Inv < due && o.Cmp > f.Inv {
					other = true // another fault may have kept the places from it
				}
			}
			switch {
			case ok:
				r.KeptRetold++
			case w.Cmp <= due || other:
				r.KeptLeft++ // left the line before the bound, or another fault began: nothing owed
			case !changed(w, due-int64(2*interval)-int64(time.Second)):
				r.KeptUnchanged++ // its place may not have changed: nothing to tell
			default:
				bad("positions-kept", "w%d's %s of %s (sent %s, queued by %s) still waited at %s, %v after its sidecar's first grant once the leader was killed at %s (%s %s), yet was told no place since the kill",
					w.Worker, w.Kind, strings.Join(opKeys(w), "+"), ts(w.Inv), ts(qw), ts(due), bound, ts(f.Inv), f.Fault, f.Target)
			}
		}
	}
}

// keptBound is how soon after a new leader served a waiter that still
// waits must have been told its place again: a dozen walks and a second.
func keptBound(interval time.Duration) time.Duration { return 12*interval + time.Second }

// replied reports whether req's reply was read (and not the session's end
// first: then no reply came, and events buffered before the close may be
// read after it).
func replied(req Op) bool {
	return req.Result != "" && !strings.HasPrefix(req.Err, errLineClosed.Error())
}

func containsKey(keys []string, k string) bool {
	for _, x := range keys {
		if x == k {
			return true
		}
	}
	return false
}

func orResult(res string) string {
	if res == "" {
		return "nothing"
	}
	return res
}

// firstTold is when each request's first place was read (any key).
func firstTold(ws []*positionWaiter) map[int64]int64 {
	out := map[int64]int64{}
	for _, w := range ws {
		if t, ok := out[w.req.ID]; !ok || w.events[0].Inv < t {
			out[w.req.ID] = w.events[0].Inv
		}
	}
	return out
}

const never64 = int64(math.MaxInt64)

// exactPlaces: every place told is exact, judged by intervals on the keys
// whose every request is in the history (the lines of the
// kill-leader-queues fault and of the issue-39 faults, whose keys only
// the nemesis's recorded sessions use, and the semaphores, which only the
// permit workers use; a seat key is also taken by the Go client's
// workers, whose places are not recorded, and is not judged).
//
// Soundness. Think of the cluster's state as its committed log prefix:
// line(t) is the line of key k after the entries committed by real time
// t. A request X enters the line by the commit of its enqueue, at
// enq(X), and leaves it by the commit of its grant or cancel, at
// leave(X); nobody ever joins a line ahead of a waiter (a FIFO queue: a
// newcomer joins at the tail; a void acquire the sidecar sends again is a
// newcomer). The leader's walk counts line(τ) for a prefix it applied,
// committed by some τ no later than the walk, so no later than the read r
// of the event; the prefix holds W's enqueue, so τ ≥ enq(W) > W.Inv. The
// place p is exact iff p − 1 = #{X ahead of W: enq(X) ≤ τ < leave(X)}.
// The checker knows, per request X:
//
//   - q(X), an upper bound of enq(X): its `! QUEUED` read, or its first
//     place read (the cluster passes both on only after the commit);
//   - earliest(X) ≤ leave(X): its send; for a grant of a lock key also
//     the holding ends (holdEnds: a release's send, the session's close,
//     the lease from the acquire's send) of every grant of the key with a
//     smaller token — tokens grow in log order, so those held the key
//     before X, and X was granted only once the key was free (mutual
//     exclusion, which its own check proves on the same bounds); for a
//     TIMEOUT, send + wait − timeoutMargin, as the FIFO check has it (the
//     leader cancels no earlier; not used under a hand-over or a clock
//     fault);
//   - latest(X) ≥ leave(X): its reply's read time when a reply told its
//     outcome (OK, TIMEOUT, BUSY, a definite error: it had left the line
//     by then), unbounded for INDETERMINATE or no reply (it may stay
//     queued).
//
// X with q(X) < W.Inv was committed before W: it is ahead of W (the set
// A). X with X.Inv ≥ q(W) is behind W. The others (U) may be either.
// Then for an event of W read at r with place p:
//
//	lo = #{X ∈ A: earliest(X) > r} ≤ p − 1 ≤ #{X ∈ A ∪ U: latest(X) > τlo} = hi
//
// since every X counted in lo was in line(τ) ahead of W (enq(X) ≤ q(X) <
// W.Inv < τ ≤ r < earliest(X) ≤ leave(X)), and every X in line(τ) ahead of
// W is in A ∪ U (enq(X) < enq(W) ≤ q(W), so X.Inv < q(W)) with latest(X) ≥
// leave(X) > τ ≥ τlo, with τlo = W.Inv.
//
// τlo is no later: the walk may read a prefix long committed (a leader cut
// off from its peers walks its last state until it steps down), and an
// earlier place of W bounds τ only by what the later, smaller place
// already allows. So the check pins a place to the unit only while the
// line stands still around it — as the lines of kill-leader-queues do from
// their build to their holder's release, across the kill and the new
// leader's retelling (Pinned counts those) — and elsewhere it refutes a
// place too low (waiters the leader forgot: one sure to be in line is not
// counted) or too high (more than could be in line since W was sent).
func exactPlaces(ops []Op, ws []*positionWaiter, holdEnd map[int64]int64, r *PositionReport, bad func(string, string, ...any)) map[waiterKey][]leaveSpan {
	aheadOf := map[waiterKey][]leaveSpan{}
	// The keys whose every request is recorded: a key some Go-client
	// worker asked for is not judged.
	judged := map[string]bool{}
	mixed := map[string]bool{}
	byKey := map[string][]Op{}
	handover := false
	var clocks []Op
	for _, op := range ops {
		switch op.Kind {
		case KindAcquire, KindPermit:
			for _, k := range opKeys(op) {
				byKey[k] = append(byKey[k], op)
				if op.Kind == KindAcquire && op.Worker < LineWorkerBase {
					mixed[k] = true
				}
			}
		case KindFault:
			switch op.Fault {
			case FaultWipeFollower, FaultWipeQuorum, FaultReplace:
				handover = true
			case FaultClockForward, FaultClockBackward:
				clocks = append(clocks, op)
			}
		}
	}
	first := firstTold(ws)
	q := func(x Op) int64 {
		t := never64
		if x.Queued != 0 {
			t = x.Queued
		}
		if f, ok := first[x.ID]; ok {
			t = min(t, f)
		}
		return t
	}
	// earliest(X) on key k for lock grants: the largest holding end among
	// the key's grants with smaller tokens (prefix maxima by token).
	type tokEnd struct {
		tok uint64
		end int64
	}
	grantEnds := map[string][]tokEnd{}
	for k, xs := range byKey {
		var te []tokEnd
		for _, x := range xs {
			if x.Kind == KindAcquire && x.Result == ResOK {
				if e, ok := holdEnd[x.ID]; ok {
					te = append(te, tokEnd{x.Token, e})
				}
			}
		}
		sort.Slice(te, func(i, j int) bool { return te[i].tok < te[j].tok })
		for i := 1; i < len(te); i++ {
			te[i].end = max(te[i].end, te[i-1].end)
		}
		grantEnds[k] = te
	}
	earliest := func(x Op, k string) int64 {
		e := x.Inv
		switch {
		case x.Kind == KindAcquire && x.Result == ResOK:
			te := grantEnds[k]
			i := sort.Search(len(te), func(i int) bool { return te[i].tok >= x.Token })
			if i > 0 {
				e = max(e, te[i-1].end)
			}
		case x.Result == ResTimeout && !handover:
			skewed := false
			for _, f := range clocks {
				if x.Inv <= f.Cmp && x.Cmp >= f.Inv {
					skewed = true
				}
			}
			if !skewed {
				e = max(e, x.Inv+x.WaitMs*int64(time.Millisecond)-int64(timeoutMargin))
			}
		}
		return e
	}
	latest := func(x Op) int64 {
		if x.Result == "" || x.Result == ResIndeterminate || !replied(x) {
			return never64
		}
		return x.Cmp
	}
	for _, w := range ws {
		k := w.key
		if mixed[k] {
			continue
		}
		if !judged[k] {
			judged[k] = true
			r.ExactKeys++
		}
		qw := q(w.req)
		var ahead []int64 // earliest(X) of A, sorted
		var maybe []int64 // latest(X) of A ∪ U
		for _, x := range byKey[k] {
			if x.ID == w.req.ID || x.Kind != w.req.Kind {
				continue
			}
			switch {
			case q(x) < w.req.Inv:
				ahead = append(ahead, earliest(x, k))
				maybe = append(maybe, latest(x))
				wk := waiterKey{w.req.ID, k}
				aheadOf[wk] = append(aheadOf[wk], leaveSpan{earliest(x, k), latest(x)})
			case x.Inv < qw:
				maybe = append(maybe, latest(x))
			}
		}
		sort.Slice(ahead, func(i, j int) bool { return ahead[i] < ahead[j] })
		for _, ev := range w.events {
			tlo := w.req.Inv
			lo, hi := 0, 0
			for _, e := range ahead {
				if e > ev.Inv {
					lo++
				}
			}
			for _, l := range maybe {
				if l > tlo {
					hi++
				}
			}
			r.Exact++
			if lo == hi {
				r.Pinned++
			}
			if ev.N-1 < lo || ev.N-1 > hi {
				bad("positions", "w%d's %s of %s (sent %s, answered %s at %s) was told place %d at %s, but between %s and then %d to %d waiters stood ahead of it "+
					"(%d known ahead, %d more of unknown order): the place is not exact",
					w.req.Worker, w.req.Kind, k, ts(w.req.Inv), orResult(w.req.Result), ts(w.req.Cmp), ev.N, ts(ev.Inv), ts(tlo), lo, hi, len(ahead), len(maybe)-len(ahead))
			}
		}
	}
	return aheadOf
}

// waiterKey names one request's line on one key.
type waiterKey struct {
	req int64
	key string
}

// leaveSpan bounds when a waiter ahead left the line: no earlier than
// earliest, no later than latest (see exactPlaces).
type leaveSpan struct{ earliest, latest int64 }

// keptAcrossLeaders counts the waiters queued before a leader fault began
// that were told a place after a new leader served: after the first grant
// (of any worker) of an acquire or permit sent after the fault began
// (ended, for a phased fault).
func keptAcrossLeaders(ops []Op, ws []*positionWaiter, first map[int64]int64, r *PositionReport) {
	type grant struct{ inv, cmp int64 }
	var grants []grant
	var faults []Op
	for _, op := range ops {
		switch {
		case (op.Kind == KindAcquire || op.Kind == KindPermit) && op.Result == ResOK:
			grants = append(grants, grant{op.Inv, op.Cmp})
		case op.Kind == KindFault && leaderFaults[op.Fault]:
			faults = append(faults, op)
		}
	}
	sort.Slice(grants, func(i, j int) bool { return grants[i].inv < grants[j].inv })
	for i := len(grants) - 2; i >= 0; i-- {
		grants[i].cmp = min(grants[i].cmp, grants[i+1].cmp)
	}
	serves := make([]int64, len(faults))
	for i, f := range faults {
		from := f.Inv
		if phasedFaults[f.Fault] {
			from = f.Cmp
		}
		serves[i] = never64
		if j := sort.Search(len(grants), func(j int) bool { return grants[j].inv >= from }); j < len(grants) {
			serves[i] = grants[j].cmp
		}
	}
	for _, w := range ws {
		qw := w.req.Queued
		if qw == 0 {
			qw = first[w.req.ID]
		}
		counted, killed := false, false
		for _, ev := range w.events {
			after := false
			for i, f := range faults {
				if qw < f.Inv && ev.Inv > serves[i] {
					after = true
					killed = killed || f.Fault == FaultKillLeader || f.Fault == FaultKillLeaderQueues
				}
			}
			if after {
				r.AfterLeaderEvents++
				counted = true
			}
		}
		if counted {
			r.AfterLeader++
		}
		if killed {
			r.AfterKill++
		}
	}
}

// positionSummary is the summary's line about places in line.
func positionSummary(p PositionReport) string {
	if p.Sessions7+p.SessionsOlder == 0 && p.Events == 0 {
		return ""
	}
	return fmt.Sprintf("positions: %d `! POSITION` events to %d waiters (%d of them to permit waiters; requests on sessions that agreed version 7: %d, older: %d); "+
		"checked: each at least 1, before its reply, never up (%d retold the same place); exact: %d events judged on %d keys whose every request is recorded (%d pinned to the unit); "+
		"after a leader fault: %d waiters queued before it were told places once a new leader served (%d events; %d across a killed leader); "+
		"told after a kill: %d waiters still in line when the new leader served were told a place in time (%d left the line sooner, or another fault began; %d kept a place that may not have changed)\n",
		p.Events, p.Waiters, p.PermitEvents, p.Sessions7, p.SessionsOlder, p.Retold, p.Exact, p.ExactKeys, p.Pinned, p.AfterLeader, p.AfterLeaderEvents, p.AfterKill, p.KeptRetold, p.KeptLeft, p.KeptUnchanged)
}
