package leader

// Places in line (issue 41, part 2; PROTOCOL.md "R position").
//
// The leader pushes each waiter it owes a reply its exact place in line,
// per key and per interval, never per hand-off: a command that moves a
// key's line (a waiter joins it, is handed the key, times out, is
// cancelled or dropped) only marks the key. The first mark arms one
// TimerPositions PositionInterval later; when it is due the core walks
// each marked key's queue once, head to tail, where a running count is
// every waiter's place (no rank tree; only the refs are copied out of the
// table, under its lock), and queues an R for each waiter owed here on a
// connection that asked for places (w, version 12) whose place differs
// from the last it was told. So the work is the length of the lines that
// moved, once per interval, and a line that stands still costs nothing; a
// waiter hears at most one R per key and interval. A line that only grew
// since the last walk is not walked at all: its newcomers stand at its
// tail, so its length tells their places (O(joins) per interval).
//
// The estimate is the key's mean interval between hand-offs times the
// place. Every node keeps that mean from the log (Applied runs on
// followers too, in log order, on the commands' Now stamps), so a new
// leader estimates as the old one did.

import (
	"maps"
	"math/bits"
	"slices"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// rateShift is the weight of the newest sample in a key's mean: 1/8, as
// TCP's smoothed RTT, so one slow holder moves the estimate by an eighth
// of the difference, and a line whose pace changes is followed within a
// dozen or so samples.
const rateShift = 3

// rateSampleMs is the shortest stretch of a key's hand-offs (by their
// stamps, ms) that makes one sample of its pace: the sample is the
// stretch's length over its hand-offs. A slow line (a hand-off a second
// or slower) samples every hand-off's interval; a fast one averages a
// second of them, so the mean follows its pace over seconds, stalls
// included. Per hand-off, a fast line's mean followed the last dozen
// intervals only: the line moves in bursts between the leader's other
// work (its walks of the lines among it), and a waiter far back was
// promised the bursts' pace, seconds too early (bench waitroom
// --positions: a first estimate off by 11 s at the median on a line of
// 100,000 that drained in 67 s).
const rateSampleMs = 1000

// rateFrac is the number of fraction bits of a key's mean interval. The
// stamps are whole milliseconds, and a hot key hands off several times in
// one: kept in whole milliseconds, the mean of intervals of 0 and 1 ms
// stayed 0 for ever (an eighth of a 1 ms step rounds to nothing), and
// every estimate of a fast line said 0 s.
const rateFrac = 16

// maxInterval caps one sample's stretch (ms) before it is scaled by
// rateFrac: a leader whose clock jumps ahead by years must not overflow
// the mean.
const maxInterval = 1 << 40

// handoffRate is what a node knows of one key's pace: its mean interval
// between hand-offs, from samples of at least rateSampleMs.
type handoffRate struct {
	seen  bool  // a hand-off was seen: start is its stamp
	start int64 // the Now (Unix ms) of the hand-off that opened the sample
	last  int64 // the Now of the latest hand-off
	count int64 // hand-offs since start
	mean  int64 // the mean interval between hand-offs, in ms << rateFrac (valid once valid)
	valid bool  // a sample was taken into mean
}

// positionsOn reports whether this core sends positions at all (a core
// configured without an interval, as the older scripts, never does).
func (k *Core[C]) positionsOn() bool { return k.cfg.PositionInterval > 0 }

// lineMark is how a key's line moved since the last walk: only by
// waiters joining its tail (joined, in order: the walk tells just them,
// from the line's length, without walking it), or otherwise (full: a
// departure changed places ahead of others, or a connection must be told
// every place again).
type lineMark struct {
	full   bool
	joined []uint64
}

// moved marks keys whose lines moved, and arms the walk if none is armed
// in this epoch. Only a leader walks.
func (k *Core[C]) moved(now time.Time, keys ...string) {
	if !k.positionsOn() || !k.leading {
		return
	}
	for _, key := range keys {
		k.posDirty[key] = lineMark{full: true}
	}
	k.armWalk(now)
}

// joined marks that waiter ref joined the tail of key's line. As long as
// nothing else moved the line before the walk, the walk tells only the
// waiters that joined: O(joins), not O(line), for a line that only grows
// (a waiting room filling up).
func (k *Core[C]) joined(now time.Time, key string, ref uint64) {
	if !k.positionsOn() || !k.leading {
		return
	}
	if m, ok := k.posDirty[key]; !ok || !m.full {
		m.joined = append(m.joined, ref)
		k.posDirty[key] = m
	}
	k.armWalk(now)
}

// armWalk arms the walk if none is armed in this epoch.
func (k *Core[C]) armWalk(now time.Time) {
	if k.posArmed != k.epoch {
		k.posArmed = k.epoch
		k.rd.Timers = append(k.rd.Timers, Timer{At: now.Add(k.cfg.PositionInterval), Kind: TimerPositions, Epoch: k.epoch})
	}
}

// movedBy marks the lines an applied command moved: its own waiter's
// (queued), and the keys of its effects (hand-offs, timeouts, drops).
func (k *Core[C]) movedBy(now time.Time, a *Applied) {
	if !k.positionsOn() || !k.leading {
		return
	}
	if a.Res.Status == locksm.StatusQueued {
		if a.Cmd.Op == locksm.OpAcquireBlock {
			for _, key := range a.Cmd.Keys {
				k.joined(now, key, a.Cmd.Ref)
			}
		} else {
			k.joined(now, a.Cmd.Key, a.Cmd.Ref)
		}
	}
	for i := range a.Effects {
		e := &a.Effects[i]
		if e.Keys != nil {
			k.moved(now, e.Keys...)
		} else {
			k.moved(now, e.Key)
		}
	}
}

// notePace folds an applied command's hand-offs into its keys' means, on
// every node, and forgets the pace of a key that is free (neither held nor
// waited for): a key stays held between the hand-offs of a busy line even
// when its line empties for a moment (one holder, one waiter, taking
// turns), and its pace must outlive that moment, for the estimates and the
// console's hand-off rate. Memory: at most one pace per held key. stamp is
// the command's Now.
func (k *Core[C]) notePace(a *Applied) {
	if !k.positionsOn() || len(k.rates) == 0 && len(a.Effects) == 0 {
		return
	}
	forget := func(key string) {
		if _, ok := k.rates[key]; ok {
			if held, _, queue := k.table.Occupancy(key); !held && queue == 0 {
				delete(k.rates, key)
			}
		}
	}
	for i := range a.Effects {
		e := &a.Effects[i]
		keys := e.Keys
		if keys == nil {
			keys = []string{e.Key}
		}
		for _, key := range keys {
			if e.Kind == locksm.EffectGranted {
				k.handoff(key, a.Cmd.Now)
			}
			forget(key)
		}
	}
	// A release or expiry with nobody waiting frees its key without an
	// effect.
	if len(k.rates) > 0 {
		if a.Cmd.Keys != nil {
			for _, key := range a.Cmd.Keys {
				forget(key)
			}
		} else if a.Cmd.Key != "" {
			forget(a.Cmd.Key)
		}
	}
	// Other keys are freed without being named (a block's other keys, a
	// session's holdings at its expiry): once the paces outnumber twice
	// the holdings, the free keys' go, so their number stays bounded by
	// the table's, at an amortized constant cost.
	if n := len(k.rates); n > minRateSweep {
		if _, total, _ := k.table.Occupancy(""); n > 2*total {
			for key := range k.rates {
				forget(key)
			}
		}
	}
}

// minRateSweep is the number of paces below which notePace does not sweep.
const minRateSweep = 1024

// handoff records a hand-off of key at stamp (Unix ms).
func (k *Core[C]) handoff(key string, stamp int64) {
	r := k.rates[key]
	if r == nil {
		r = &handoffRate{}
		k.rates[key] = r
	}
	// Stamps come from successive leaders' wall clocks: one that steps
	// back opens a new sample rather than make a negative stretch.
	if !r.seen || stamp < r.last {
		r.seen, r.start, r.last, r.count = true, stamp, stamp, 0
		return
	}
	r.last = stamp
	r.count++
	if span := stamp - r.start; span >= rateSampleMs {
		iv := (min(span, maxInterval) << rateFrac) / r.count
		if !r.valid {
			r.mean, r.valid = iv, true
		} else {
			r.mean += (iv - r.mean) >> rateShift
		}
		r.start, r.count = stamp, 0
	}
}

// restartPaceSamples opens a new sample of every key's pace at its next
// hand-off, keeping the means: a leader that starts serving must not count
// the election before it as a hand-off interval. A line of a few
// milliseconds per hand-off that stood still for a 1.6 s election otherwise
// promised its waiters eight times their wait for seconds afterwards
// (clients/examples/waitingroom, buyer #2000 told 41 s, admitted in 3).
func (k *Core[C]) restartPaceSamples() {
	for _, r := range k.rates {
		r.seen, r.count = false, 0
	}
}

// estimate is the wait of the waiter at pos on key, in ms, or
// wire.EstimateUnknown before two hand-offs of key were seen at different
// times. Until a whole sample was taken it is the open sample's pace.
func (k *Core[C]) estimate(key string, pos int) uint32 {
	r := k.rates[key]
	if r == nil {
		return wire.EstimateUnknown
	}
	mean := r.mean
	if !r.valid {
		// Hand-offs of one command (a raise of a semaphore's n grants
		// several) share its stamp: no time has passed between them, which
		// says nothing of the pace (the attack round saw 0 s promised
		// behind 250 s leases).
		if r.count == 0 || r.last == r.start {
			return wire.EstimateUnknown
		}
		mean = ((r.last - r.start) << rateFrac) / r.count
	}
	hi, lo := bits.Mul64(uint64(mean), uint64(pos))
	if hi>>rateFrac != 0 {
		return wire.MaxEstimateMs
	}
	ms := hi<<(64-rateFrac) | lo>>rateFrac
	if ms > uint64(wire.MaxEstimateMs) {
		return wire.MaxEstimateMs
	}
	return uint32(ms)
}

// walkPositions is the due TimerPositions: each marked line is walked
// once, and every waiter owed here on a connection that takes positions
// is told its place if it changed.
func (k *Core[C]) walkPositions() {
	k.posArmed = 0
	keys := slices.Sorted(maps.Keys(k.posDirty))
	marks := k.posDirty
	k.posDirty = make(map[string]lineMark, len(marks))
	longest, sent := 0, 0
	for _, key := range keys {
		refs, first := k.lineToTell(key, marks[key])
		longest = max(longest, len(refs))
		for i, ref := range refs {
			pos := first + i
			p := k.pend[ref]
			if p == nil || !p.queued {
				continue // not owed here (another leader's, or its connection's gone)
			}
			cn := k.dest(p)
			if cn == nil || cn.dead || !cn.positions {
				continue
			}
			if !k.tellPosition(p, key, pos) {
				continue
			}
			k.send(cn, wire.Msg{Type: wire.TypePosition, ID: p.id, Position: uint32(min(pos, int(^uint32(0)))),
				EstimateMs: k.estimate(key, pos), Key: key})
			sent++
		}
	}
	if sent > 0 {
		k.event(Event{Kind: EventPositionsSent, Keys: sent})
	}
	if cap(k.walkRefs) > 4*max(longest, 1024) {
		// A drained waiting room's line is not kept for the next walk;
		// a full one's is (8 bytes a waiter, beside the hundreds each
		// costs the leader), so its walks allocate nothing.
		k.walkRefs = nil
	}
}

// lineToTell is what the walk of key's line looks at: the refs of the
// waiters to tell and the place of the first. Only joins since the last
// walk: those, at the tail (the line's length says where). Else the whole
// line: the table is read under the node's fsm lock, which apply needs,
// so only the refs are copied there (a line of 100,000 in well under a
// millisecond) and the rest is done outside it.
func (k *Core[C]) lineToTell(key string, m lineMark) (refs []uint64, first int) {
	if !m.full {
		if _, _, n := k.table.Occupancy(key); n >= len(m.joined) {
			return m.joined, n - len(m.joined) + 1
		}
		// Cannot be (a departure marks the line full): walk it.
	}
	refs = k.walkRefs[:0]
	k.table.RangeWaiters(key, func(w *locksm.Waiter) bool {
		refs = append(refs, w.Ref)
		return true
	})
	k.walkRefs = refs
	return refs, 1
}

// tellPosition records that p is told pos on key, and reports whether
// that is news to it.
func (k *Core[C]) tellPosition(p *pending[C], key string, pos int) bool {
	v := uint32(min(pos, int(^uint32(0))))
	if p.keys == nil {
		if p.told == v {
			return false
		}
		p.told = v
		return true
	}
	told := k.blockTold[p.ref]
	if told == nil {
		told = make([]uint32, len(p.keys))
		k.blockTold[p.ref] = told
	}
	i := slices.Index(p.keys, key)
	if i < 0 || told[i] == v {
		return false
	}
	told[i] = v
	return true
}

// watchPositions turns places in line on for cn (its 'w'): every waiter
// owed on it is told its place at the next walk, moved or not (nothing
// was told on cn before). It looks only at cn's own waiters, or those of
// the session attached to it (owed on the session's home connection),
// once per connection: a client cannot make it scan every waiter of the
// leader.
func (k *Core[C]) watchPositions(now time.Time, cn *conn[C]) {
	if cn.positions {
		return
	}
	cn.positions = true
	owed := cn.inflight
	if s := cn.sess; s != nil {
		owed = s.home.inflight
	}
	for _, p := range sortedByRef(owed) {
		if p.queued && k.dest(p) == cn {
			k.untell(now, p)
		}
	}
}

// untell forgets what p was told (its replies go to a new connection,
// which has heard nothing), and marks its lines so the next walk tells it.
func (k *Core[C]) untell(now time.Time, p *pending[C]) {
	p.told = 0
	delete(k.blockTold, p.ref)
	k.moved(now, p.keySet()...)
}

// HandoffsPerSec is key's recent hand-off rate, from the mean interval
// its waiters' estimates use; false while unknown (fewer than two
// hand-offs seen, or its line emptied since). For the operators' console.
func (k *Core[C]) HandoffsPerSec(key string) (float64, bool) {
	ms := k.estimate(key, 1<<16) // 2^16 places: the mean in ms with 16 bits of fraction kept
	if ms == wire.EstimateUnknown {
		return 0, false
	}
	if ms == 0 {
		return 0, false
	}
	return float64(1<<16) * 1000 / float64(ms), true
}
