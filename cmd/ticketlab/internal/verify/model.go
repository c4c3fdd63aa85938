package verify

import (
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The lock model for porcupine, one partition per connected component of
// keys.
//
// A block acquire takes several keys in one operation, so a key's history
// alone cannot tell whether a block held all its keys at one instant: each
// key's projection can be linearizable while the block took one key before
// another was free (TestCheckFindsCrossKeyLinearizabilityViolation). The
// keys are therefore grouped: two keys are in one component if some block
// operation (its acquire or release) names both, transitively (union-find
// over the keys of every block). Each component is one porcupine partition
// whose state maps every key of the component to its holding, and a block
// is one operation on all its keys. Components share no operation, so the
// history is linearizable iff every component is (P-compositionality).
//
// A lease makes a holding end by itself, invisibly: the model treats that
// as an expiry event that may happen at any time τ ≥ the holding's
// earliest possible end (exp: invocation + lease). It is taken lazily, only
// when a later operation's result needs the key free, and then τ must also
// fit before that operation's return. A block's holding ends as one: its
// release (naming any of its keys) or its expiry frees every key of it.
// Each key carries the latest linearization time assumed on it so far
// (floor), and every later operation on it must return after it
// (linearization points are non-decreasing); an operation on several keys
// raises the floor of each to the largest of theirs. (One floor for the
// whole component would be sound too, and stronger; per key keeps unrelated
// keys from constraining each other's search.)
//
// Operations whose outcome is unknown are not given to porcupine as open
// operations: on a small key pool every key is in one component, and after
// a leader's death a dozen INDETERMINATE acquires, each open for the 30 s
// window, made the search exponential in their number. Each is replaced by
// the only thing it can explain, which makes the model deterministic:
//
//   - An INDETERMINATE acquire may have been granted, under a token nobody
//     learns, at any time from its invocation to its completion + window
//     (and, when the cluster's last token is known, only when a token
//     nobody learned was issued: between the grants of the learned tokens
//     around it, tokenGaps), and held until the sidecar or the node
//     compensates it, its lease ends it, or, at the latest, a known grant
//     takes one of its keys. Nothing a worker does needs that holding
//     (nobody releases its token, and it may end whenever a key is
//     wanted), but it can explain a BUSY or TIMEOUT on one of its keys:
//     such a BUSY or TIMEOUT whose interval overlaps that span is accepted
//     in any state (explain).
//   - An INDETERMINATE release, or a session's close (the sidecar then
//     releases the session's locks), may end the holding at any time after
//     its invocation: the holding's exp becomes that invocation (for a
//     close, of every grant of the worker's session), since a holding may
//     end at any time ≥ exp.
//
// Both allow at least every behaviour the cluster could have had (an
// unknown grant also needs its keys free; a release lands within the
// window), so no history that is linearizable is refused.
//
// A block waiting for its turn reserves the keys it heads the queue of
// (locksm/MATRIX.md, "Blocks"): a single-key acquire of such a key gets
// BUSY or TIMEOUT although nobody holds it. The model has no queues; a
// reservation lasts only while the block waits for another of its keys,
// held or reserved in turn, and such a chain ends at a held key, so a BUSY
// or TIMEOUT whose interval overlaps block acquires with a wait needs a key
// held among its keys and those the waiting blocks connect them to
// (refusal.reach). Otherwise BUSY and TIMEOUT need one of their own keys
// held. A TIMEOUT takes effect no earlier than invocation + wait (the
// leader times the wait from the request's arrival), unless a leader
// hands its leadership over, which the nemesis makes happen only around a
// replaced node; its operation starts there. (BUSY and TIMEOUT change no
// state, but every one of them that overlaps many others multiplies the
// orders porcupine tries; with full-length TIMEOUTs a 3-minute history took
// 12 s, with TIMEOUTs from the end of their wait 0.2 s.)

// slot is the model's state of one key of a component.
type slot struct {
	hold  uint64 // the holding's token; 0: free
	owner int    // holder's worker + 1 (0: none or unknown)
	exp   int64  // earliest time the holding may have ended unseen
	last  uint64 // highest token known granted on this key
	floor int64  // latest linearization time assumed on this key
}

// compState is the state of one component: a slot per key, indexed as
// the component's keys. Slots past the end are free (the initial state
// has none: Init cannot know the partition).
type compState struct {
	slots []slot
	comp  *component // for descriptions only; never compared
}

// never is the return time of an operation whose outcome is unknown.
const never = math.MaxInt64

// component is a connected set of keys, sorted.
type component struct {
	keys []string
	ops  int
}

type lockInput struct {
	kind    string // acquire, release
	worker  int
	token   uint64 // release
	leaseNs int64  // acquire
	exp     int64  // acquire: the earliest time its holding may end
	// keys: an acquire's keys, a release's named key, as slots of comp.
	keys []int
	// reach: a BUSY's or TIMEOUT's keys and those waiting blocks connect
	// them to (refusal.reach), as slots; nil: its keys.
	reach []int
	comp  *component
}

type lockOutput struct {
	result string // ok, busy, timeout, error (definite)
	token  uint64 // acquire ok
	ret    int64  // return time
}

// sized returns s with at least n slots (s itself if it has them; else a
// copy: s is never modified).
func (s compState) sized(n int, c *component) compState {
	if len(s.slots) >= n {
		return s
	}
	out := compState{slots: make([]slot, n), comp: c}
	copy(out.slots, s.slots)
	return out
}

func (s compState) clone() compState {
	return compState{slots: append([]slot(nil), s.slots...), comp: s.comp}
}

// floorOf is the largest floor of the keys ks.
func (s compState) floorOf(ks []int) int64 {
	f := int64(math.MinInt64)
	for _, k := range ks {
		f = max(f, s.slots[k].floor)
	}
	return f
}

// holdingKeys is every key held by holding h.
func (s compState) holdingKeys(h uint64) []int {
	var out []int
	for k, sl := range s.slots {
		if sl.hold == h {
			out = append(out, k)
		}
	}
	return out
}

// free ends every holding on the keys ks (each holding whole) and returns
// the keys touched (ks and the other keys of those holdings) and the
// latest earliest-end of the holdings ended. s is modified: pass a clone.
func (s compState) free(ks []int) (touched []int, latestExp int64) {
	latestExp = math.MinInt64
	seen := make([]bool, len(s.slots))
	for _, k := range ks {
		if !seen[k] {
			seen[k] = true
			touched = append(touched, k)
		}
		h := s.slots[k].hold
		if h == 0 {
			continue
		}
		latestExp = max(latestExp, s.slots[k].exp)
		for _, o := range s.holdingKeys(h) {
			if !seen[o] {
				seen[o] = true
				touched = append(touched, o)
			}
			s.slots[o] = slot{last: s.slots[o].last, floor: s.slots[o].floor}
		}
	}
	return touched, latestExp
}

// setFloor raises the floor of every key of ks to f.
func (s compState) setFloor(ks []int, f int64) {
	for _, k := range ks {
		s.slots[k].floor = max(s.slots[k].floor, f)
	}
}

func lockStep(st, in, out interface{}) (bool, interface{}) {
	i := in.(lockInput)
	o := out.(lockOutput)
	s := st.(compState).sized(len(i.comp.keys), i.comp)
	switch i.kind {
	case KindAcquire:
		if o.ret < s.floorOf(i.keys) {
			return false, nil
		}
		switch o.result {
		case ResOK:
			for _, k := range i.keys {
				if o.token <= s.slots[k].last {
					return false, nil
				}
			}
			n := s.clone()
			touched, exp := n.free(i.keys)
			f := max(n.floorOf(touched), exp)
			if f > o.ret {
				return false, nil
			}
			n.setFloor(touched, f)
			for _, k := range i.keys {
				n.slots[k] = slot{hold: o.token, owner: i.worker + 1, exp: i.exp, last: o.token, floor: n.slots[k].floor}
			}
			return true, n
		case ResBusy, ResTimeout:
			reach := i.keys
			if i.reach != nil {
				reach = i.reach
			}
			for _, k := range reach {
				if s.slots[k].hold != 0 {
					return true, s
				}
			}
			return false, nil
		}
	case KindRelease:
		k := i.keys[0]
		if o.ret < s.slots[k].floor {
			return false, nil
		}
		mine := s.slots[k].hold == i.token
		switch o.result {
		case ResOK:
			if !mine {
				return false, nil
			}
			n := s.clone()
			touched, _ := n.free(i.keys)
			f := n.floorOf(touched)
			if f > o.ret {
				return false, nil
			}
			n.setFloor(touched, f)
			return true, n
		case ResError: // not_held, token_mismatch, owner_mismatch: not ours (any more)
			if !mine {
				return true, s
			}
			n := s.clone()
			touched, exp := n.free(i.keys)
			f := max(n.floorOf(touched), exp)
			if f > o.ret {
				return false, nil
			}
			n.setFloor(touched, f)
			return true, n
		}
	}
	return false, nil
}

func stateEqual(a, b interface{}) bool {
	x, y := a.(compState), b.(compState)
	n := max(len(x.slots), len(y.slots))
	for k := 0; k < n; k++ {
		var p, q slot
		if k < len(x.slots) {
			p = x.slots[k]
		}
		if k < len(y.slots) {
			q = y.slots[k]
		}
		if p != q {
			return false
		}
	}
	return true
}

func stateHash(a interface{}) uint64 {
	x := a.(compState)
	n := len(x.slots)
	for n > 0 && x.slots[n-1] == (slot{}) {
		n-- // trailing free slots hash like missing ones (stateEqual)
	}
	h := fnv.New64a()
	var b [8]byte
	put := func(v uint64) {
		for j := range b {
			b[j] = byte(v >> (8 * j))
		}
		h.Write(b[:])
	}
	for _, sl := range x.slots[:n] {
		put(sl.hold)
		put(uint64(sl.owner))
		put(uint64(sl.exp))
		put(sl.last)
		put(uint64(sl.floor))
	}
	return h.Sum64()
}

func lockModel() porcupine.Model {
	return porcupine.Model{
		Init:  func() interface{} { return compState{} },
		Step:  lockStep,
		Equal: stateEqual,
		Hash:  stateHash,
		DescribeOperation: func(in, out interface{}) string {
			i, o := in.(lockInput), out.(lockOutput)
			var names []string
			for _, k := range i.keys {
				names = append(names, i.comp.keys[k])
			}
			ks := strings.Join(names, "+")
			switch i.kind {
			case KindAcquire:
				if o.result == ResOK {
					return fmt.Sprintf("w%d acquire %s lease %ds -> ok %d", i.worker, ks, i.leaseNs/1e9, o.token)
				}
				return fmt.Sprintf("w%d acquire %s -> %s", i.worker, ks, o.result)
			}
			return fmt.Sprintf("w%d release %s %d -> %s", i.worker, ks, i.token, o.result)
		},
		DescribeState: func(st interface{}) string {
			s := st.(compState)
			var parts []string
			for k, sl := range s.slots {
				name := fmt.Sprintf("#%d", k)
				if s.comp != nil && k < len(s.comp.keys) {
					name = s.comp.keys[k]
				}
				switch {
				case sl.hold == 0:
					parts = append(parts, fmt.Sprintf("%s free (last %d)", name, sl.last))
				default:
					parts = append(parts, fmt.Sprintf("%s held by w%d token %d", name, sl.owner-1, sl.hold))
				}
			}
			if len(parts) == 0 {
				return "all free"
			}
			return strings.Join(parts, "; ")
		},
	}
}

// components groups the keys of a history: keys named together by a
// block operation are in one component (union-find), every other key is
// alone. The result is sorted by first key, each component's keys sorted.
func components(ops []Op) []*component {
	parent := map[string]string{}
	var find func(string) string
	find = func(k string) string {
		p, ok := parent[k]
		if !ok {
			parent[k] = k
			return k
		}
		if p == k {
			return k
		}
		r := find(p)
		parent[k] = r
		return r
	}
	for _, op := range ops {
		if op.Kind != KindAcquire && op.Kind != KindRelease {
			continue
		}
		ks := opKeys(op)
		r := find(ks[0])
		for _, k := range ks[1:] {
			if o := find(k); o != r {
				parent[o] = r
			}
		}
	}
	byRoot := map[string]*component{}
	var out []*component
	var all []string
	for k := range parent {
		all = append(all, k)
	}
	sort.Strings(all)
	for _, k := range all {
		r := find(k)
		c := byRoot[r]
		if c == nil {
			c = &component{}
			byRoot[r] = c
			out = append(out, c)
		}
		c.keys = append(c.keys, k)
	}
	return out
}

// refusal is what may explain a BUSY or TIMEOUT besides a holder of one of
// its keys (explain).
type refusal struct {
	// unknown: an INDETERMINATE acquire of one of the keys it reaches may
	// have held it meanwhile: legal in any state.
	unknown bool
	// reach: its keys and those of the other block acquires with a wait
	// that were in the system meanwhile and are connected to them through
	// shared keys (nil if none): a waiting block can reserve a free key,
	// but only while it waits for another key of it, held or reserved in
	// turn, and that chain ends at a held key (waiters stand in log order
	// on every key, and the oldest waits for holders only; MATRIX.md, "Why
	// blocks wait like this"). So one of these keys must be held.
	reach []string
}

// tokenGaps says when the tokens nobody learned can have been granted.
// Tokens grow by one with every grant (a block's too), in log order, so a
// token u between the learned tokens l < u < h was committed after l and
// before h: within [l's invocation, h's completion]. Without a final
// token count (or after a wipe) every INDETERMINATE acquire may have been
// granted (known false).
type tokenGaps struct {
	known   bool
	windows [][2]int64
}

// unlearnedTokens finds the windows of the tokens the cluster issued (up to
// final.LastToken) that no worker learned.
func unlearnedTokens(grants []Op, final FinalState) tokenGaps {
	if final.LastToken == 0 || final.Wiped {
		return tokenGaps{}
	}
	byTok := append([]Op(nil), grants...)
	sort.Slice(byTok, func(i, j int) bool { return byTok[i].Token < byTok[j].Token })
	g := tokenGaps{known: true}
	prev, prevInv := final.TokenFloor, int64(math.MinInt64)
	for _, o := range byTok {
		if o.Token <= prev || o.Token > final.LastToken {
			return tokenGaps{} // twice, or outside the range: the token checks say so
		}
		if o.Token > prev+1 {
			g.windows = append(g.windows, [2]int64{prevInv, o.Cmp})
		}
		prev, prevInv = o.Token, o.Inv
	}
	if final.LastToken > prev {
		g.windows = append(g.windows, [2]int64{prevInv, never})
	}
	return g
}

// explain finds, for every BUSY and TIMEOUT acquire, the operations the
// model does not see that may explain it, among those whose interval
// overlaps its own: other block acquires with a wait, which may have stood
// in a key's queue (until their completion; if INDETERMINATE, until their
// completion + window + wait), and INDETERMINATE acquires that may have
// been granted (by their completion + window, and when a token nobody
// learned was issued: gaps), whose holding then lasts until a known grant
// takes one of their keys.
func explain(ops []Op, window time.Duration, gaps tokenGaps, from func(Op) int64) (out map[int64]refusal, maybeGranted int) {
	type span struct {
		inv, ret, id int64
		keys         []string
	}
	unknown, waiting := map[string][]span{}, map[string][]span{}
	longest := map[string]int64{}
	add := func(m map[string][]span, op Op, inv, ret int64) {
		for _, k := range opKeys(op) {
			m[k] = append(m[k], span{inv, ret, op.ID, opKeys(op)})
			if ret == never {
				longest[k] = never
			} else if longest[k] != never {
				longest[k] = max(longest[k], ret-inv)
			}
		}
	}
	// Known grants per key by invocation, with the earliest completion
	// among those invoked at or after each (suffix minimum).
	type grant struct{ inv, cmp int64 }
	grants := map[string][]grant{}
	for _, op := range ops {
		if op.Kind == KindAcquire && op.Result == ResOK {
			for _, k := range opKeys(op) {
				grants[k] = append(grants[k], grant{op.Inv, op.Cmp})
			}
		}
	}
	for _, g := range grants {
		sort.Slice(g, func(i, j int) bool { return g[i].inv < g[j].inv })
		for i := len(g) - 2; i >= 0; i-- {
			g[i].cmp = min(g[i].cmp, g[i+1].cmp)
		}
	}
	for _, op := range ops {
		switch {
		case op.Kind != KindAcquire:
		case op.Result == ResIndeterminate:
			w := int64(never)
			if window > 0 {
				w = op.Cmp + int64(window)
			}
			// Granted, if at all, at some g in [lo, hi].
			lo, hi := op.Inv, w
			if gaps.known {
				lo, hi = never, math.MinInt64
				for _, gw := range gaps.windows {
					if a, b := max(op.Inv, gw[0]), min(w, gw[1]); a <= b {
						lo, hi = min(lo, a), max(hi, b)
					}
				}
			}
			if lo <= hi {
				maybeGranted++
				// Held until a known grant takes one of its keys: at the
				// latest the completion of the first grant of one of them
				// invoked after hi.
				end := int64(never)
				if hi != never {
					for _, k := range opKeys(op) {
						g := grants[k]
						if i := sort.Search(len(g), func(i int) bool { return g[i].inv >= hi }); i < len(g) {
							end = min(end, g[i].cmp)
						}
					}
				}
				add(unknown, op, lo, max(hi, end))
			}
			if isBlock(op) && op.WaitMs > 0 {
				// Queued, if at all, by w, for at most its wait.
				ret := int64(never)
				if w != never {
					ret = w + op.WaitMs*int64(time.Millisecond)
				}
				add(waiting, op, op.Inv, ret)
			}
		case isBlock(op) && op.WaitMs > 0 && op.Result != ResError:
			add(waiting, op, op.Inv, op.Cmp)
		}
	}
	for _, m := range []map[string][]span{unknown, waiting} {
		for _, b := range m {
			sort.Slice(b, func(i, j int) bool { return b[i].inv < b[j].inv })
		}
	}
	// overlapping calls f with every span of m on key k that overlaps
	// [from(op), op's completion], other than op's own, until f returns
	// false.
	overlapping := func(m map[string][]span, k string, op Op, f func(span) bool) {
		b := m[k]
		start := from(op)
		// The spans begun by op's completion, latest first, back to those
		// that cannot reach its start.
		for j := sort.Search(len(b), func(j int) bool { return b[j].inv > op.Cmp }) - 1; j >= 0; j-- {
			if longest[k] != never && b[j].inv < start-longest[k] {
				return
			}
			if b[j].ret >= start && b[j].id != op.ID && !f(b[j]) {
				return
			}
		}
	}
	out = map[int64]refusal{}
	for _, op := range ops {
		if op.Kind != KindAcquire || (op.Result != ResBusy && op.Result != ResTimeout) {
			continue
		}
		var r refusal
		in := map[string]bool{}
		reach := append([]string(nil), opKeys(op)...)
		for _, k := range reach {
			in[k] = true
		}
		for i := 0; i < len(reach); i++ {
			overlapping(waiting, reach[i], op, func(s span) bool {
				for _, k := range s.keys {
					if !in[k] {
						in[k] = true
						reach = append(reach, k)
					}
				}
				return true
			})
		}
		if len(reach) > len(opKeys(op)) {
			r.reach = reach
		}
		// A chain of waiting blocks may also end at an unknown holding.
		for _, k := range reach {
			overlapping(unknown, k, op, func(span) bool { r.unknown = true; return false })
		}
		if r.unknown || r.reach != nil {
			out[op.ID] = r
		}
	}
	return out, maybeGranted
}

// earliestEnds is, for every grant, the earliest time its holding may have
// ended unseen: invocation + lease (or the last EXTEND answered OK's
// invocation + its lease: leaseEnds), or earlier the invocation of an
// INDETERMINATE release of it, or the invocation of its session's close
// (the sidecar releases the session's locks then; a grant of that session
// is one invoked before the close completed); never if its release was
// answered OK.
//
// A holding delivered before its sidecar was killed keeps its lease: the
// close its worker then saw does not end it (outlivedSidecar).
func earliestEnds(ops []Op) map[int64]int64 {
	kills := sidecarLosses(ops)
	byWorker := map[int][]Op{}
	var grants []Op
	for _, op := range ops {
		if op.Kind == KindAcquire && op.Result == ResOK {
			grants = append(grants, op)
			byWorker[op.Worker] = append(byWorker[op.Worker], op)
		}
	}
	exp := leaseEnds(ops, grants)
	released := map[int64]bool{}
	for _, op := range ops {
		switch op.Kind {
		case KindRelease:
			if e, ok := exp[op.Acq]; ok && op.Result == ResIndeterminate {
				exp[op.Acq] = min(e, op.Inv)
			}
			if op.Result == ResOK {
				released[op.Acq] = true
			}
		case KindClose:
			for _, g := range byWorker[op.Worker] {
				if g.Inv < op.Cmp && !outlivedSidecar(kills, g, op.Cmp) {
					exp[g.ID] = min(exp[g.ID], max(op.Inv, g.Inv))
				}
			}
		case KindFault:
			// An operator's revoke (FaultRevoke) ends the holding when it
			// applies, after it was sent, as an INDETERMINATE release
			// may; a refused one changed nothing.
			if e, ok := exp[op.Acq]; ok && op.Fault == FaultRevoke && op.Acq != 0 && op.Result != ResError {
				exp[op.Acq] = min(e, op.Inv)
			}
		}
	}
	// A holding whose release was answered OK was still there when the
	// release took effect, which then ended it: it never ended unseen.
	// (Exact, and it keeps the search from trying a waiter's grant before
	// the release that handed it the key.)
	for id := range released {
		if _, ok := exp[id]; ok {
			exp[id] = never
		}
	}
	return exp
}

// porcupineHistory turns the lock operations of a history into porcupine
// operations, one partition per component of keys (components): every
// acquire with a definite outcome and every release the cluster answered
// (OK, or not held under this token any more). Definite errors that
// executed nothing (unavailable, moved, no_quorum, ...) are left out: they
// are legal in any state and change none. INDETERMINATE operations and
// closes are left out too, replaced by what they can explain (explained,
// earliestEnds): an INDETERMINATE one is given until window after its
// completion to take effect (forever if window is 0). The harness keeps
// every fault bounded (a few seconds, one at a time), so a request still
// somewhere in the system — in a paused node's socket buffer, or in a log
// entry a new leader commits in its barrier — lands well within that.
//
// gaps says when the tokens nobody learned were issued (unlearnedTokens).
func porcupineHistory(ops []Op, window time.Duration, gaps tokenGaps) (parts [][]porcupine.Operation, comps []*component, st linStats) {
	comps = components(ops)
	slotOf := map[string]int{}
	compOf := map[string]int{}
	for ci, c := range comps {
		for si, k := range c.keys {
			slotOf[k], compOf[k] = si, ci
		}
	}
	// A TIMEOUT comes from the cancel the leader proposes when the wait,
	// timed from the request's arrival, has run out (cluster/leader): it
	// takes effect no earlier than invocation + wait (less a margin for
	// the clocks). Only a leader handing its leadership over withdraws
	// waiters earlier (SIGTERM, members remove or replace of the leader),
	// which the nemesis does only when it replaces a wiped node.
	handover := false
	for _, op := range ops {
		if op.Kind == KindFault && (op.Fault == FaultWipeFollower || op.Fault == FaultWipeQuorum || op.Fault == FaultReplace) {
			handover = true
		}
	}
	from := func(op Op) int64 {
		if at := op.Inv + op.WaitMs*int64(time.Millisecond) - int64(timeoutMargin); op.Result == ResTimeout && !handover && at > op.Inv && at <= op.Cmp {
			return at
		}
		return op.Inv
	}
	expl, maybe := explain(ops, window, gaps, from)
	st.MaybeGranted = maybe
	exp := earliestEnds(ops)
	parts = make([][]porcupine.Operation, len(comps))
	for _, op := range ops {
		switch op.Kind {
		case KindAcquire:
			ex := expl[op.ID]
			if op.Result == ResBusy || op.Result == ResTimeout {
				st.Refusals++
				switch {
				case ex.unknown:
					st.RefusalsUnknown++
				case ex.reach != nil:
					st.RefusalsReach++
				}
			}
			if op.Result == ResError || op.Result == ResIndeterminate || ex.unknown {
				continue // (a BUSY or TIMEOUT an unknown grant explains is legal in any state and changes none)
			}
			ks := opKeys(op)
			ci := compOf[ks[0]]
			var slots, reach []int
			for _, k := range ks {
				slots = append(slots, slotOf[k])
			}
			for _, k := range ex.reach {
				reach = append(reach, slotOf[k])
			}
			parts[ci] = append(parts[ci], porcupine.Operation{ClientId: op.Worker,
				Input: lockInput{kind: KindAcquire, worker: op.Worker, leaseNs: op.LeaseMs * 1e6, exp: exp[op.ID],
					keys: slots, reach: reach, comp: comps[ci]},
				Output: lockOutput{result: op.Result, token: op.Token, ret: op.Cmp}, Call: from(op), Return: op.Cmp})
		case KindRelease:
			if op.Result == ResIndeterminate || op.Result == ResError && !definiteReleaseError(op.Err) {
				continue
			}
			ci := compOf[op.Key]
			parts[ci] = append(parts[ci], porcupine.Operation{ClientId: op.Worker,
				Input: lockInput{kind: KindRelease, worker: op.Worker, token: op.Token,
					keys: []int{slotOf[op.Key]}, comp: comps[ci]},
				Output: lockOutput{result: op.Result, ret: op.Cmp}, Call: op.Inv, Return: op.Cmp})
		}
	}
	// A key whose every operation was left out has nothing to check.
	var outParts [][]porcupine.Operation
	var outComps []*component
	for ci, part := range parts {
		if len(part) > 0 {
			comps[ci].ops = len(part)
			outParts, outComps = append(outParts, part), append(outComps, comps[ci])
		}
	}
	return outParts, outComps, st
}

// timeoutMargin is how much earlier than invocation + wait a TIMEOUT may
// take effect (the harness's clock against the leader's).
const timeoutMargin = 5 * time.Millisecond

// linStats counts how porcupineHistory treated the BUSY and TIMEOUT
// acquires (Refusals): RefusalsUnknown accepted in any state (an unknown
// grant may have held one of the keys they reach), RefusalsReach checked
// against the keys waiting blocks connect them to, the rest against their
// own keys; MaybeGranted is the number of INDETERMINATE acquires that may
// have been granted.
type linStats struct {
	Refusals, RefusalsUnknown, RefusalsReach, MaybeGranted int
}

// definiteReleaseError: the release was evaluated and found the key not
// held under this token and owner.
func definiteReleaseError(code string) bool {
	return code == "not_held" || code == "token_mismatch" || code == "owner_mismatch"
}
