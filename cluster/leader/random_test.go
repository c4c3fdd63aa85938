package leader

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// TestRandomized drives the core through the script harness with random
// inputs (requests, commits, failed proposals, time, dying connections,
// leadership changes, hand-overs) and checks what it says against what the
// log did:
//
//   - every request gets exactly one reply, or, for an acquire granted
//     after its connection died, no reply and the grant's release proposed;
//   - G only for a grant the log applied for that request, with its token;
//     B, K (release), T only after the log said so for that request;
//   - U only when leadership is lost, a proposal may have been appended,
//     or a new leader dropped the waiter;
//   - M only for a request never proposed or whose proposal was refused
//     before being appended, and such a command is never applied;
//   - while leadership never changed, admission held: keys held never
//     above MaxKeys, no queue longer than MaxWaitersPerKey; per connection
//     (the bookkeeping check): acquires and releases not applied yet each
//     within MaxInFlightPerConn, waiters within MaxWaitersPerConn;
//   - a refusal names a full room: too_many_in_flight only when the
//     connection has MaxInFlightPerConn requests of that op in flight (a
//     release is never refused for acquires, nor the other way round),
//     too_many_waiters per connection only when its waiters fill
//     MaxWaitersPerConn, and never for an acquire with wait 0;
//   - Q exactly once for each acquire of a version 4 connection whose own
//     command the log applied as queued while it was owed, before its
//     reply; never on an older connection, never for anything else;
//   - a queued waiter owed a reply whose connection died, or that was
//     cancelled, has its cancel proposed; any other has its wait timer
//     armed at its deadline (or fired, and the cancel proposed);
//   - K to an extend only after the log extended that holding for that
//     request; an expiry is never proposed while an extend of its token
//     is owed (the lease timer waits for the extend to settle);
//   - X (lost) only while the log applies that token's expiry, on live
//     connections of version 6 only, at most once per connection and
//     token, and only on the connection the grant was told on while that
//     one is open;
//   - drained under a fresh leader, every lease runs out through the log
//     and the table ends empty.
func TestRandomized(t *testing.T) {
	seeds := 400
	if testing.Short() {
		seeds = 50
	}
	var cov coverage
	for seed := 0; seed < seeds; seed++ {
		if err := runRandom(uint64(seed), 300, &cov); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	// The runs must have reached the cases the checks are about.
	for name, n := range map[string]int{"extends applied": cov.extended, "extend refusals": cov.extendRefused,
		"lost events": cov.lost, "lost events broadcast": cov.lostBroadcast, "expiries deferred": cov.deferred,
		"resumes answered": cov.resumed, "seqs voided": cov.voids, "session expiries": cov.sessionExpiries,
		"untold grants released": cov.untoldReleased, "sessions closed": cov.closes,
		"positions told": cov.positions, "positions that went down": cov.positionsMoved} {
		if n == 0 {
			t.Errorf("no %s in %d runs", name, seeds)
		}
	}
	t.Logf("coverage: %+v", cov)
}

// coverage counts what the randomized runs reached.
type coverage struct {
	extended, extendRefused, lost, lostBroadcast, deferred           int
	resumes, resumed, voids, sessionExpiries, untoldReleased, closes int
	positions, positionsMoved                                        int
}

type reqKey struct {
	conn string
	id   uint64
}

type reqInfo struct {
	op      byte // wire type
	ref     uint64
	wait    bool // an acquire with a wait
	replies []wire.Msg
	moved   bool // answered M
	queuedQ int  // Q frames received
	wantQ   bool // applied as queued while owed, on a version 4 connection
	// places: the latest place told per key (R frames, version 12).
	places map[string]uint32
}

type randomRun struct {
	r     *rand.Rand
	h     *harness
	phase string // the harness command being run

	reqs   map[reqKey]*reqInfo
	byRef  map[uint64]*reqInfo
	nextID map[string]uint64
	open   []string
	dead   map[string]bool
	// version: each connection's protocol version.
	version map[string]uint16
	// watching: the connections that asked for places in line (w).
	watching map[string]bool
	conns    int

	// What the log did, by ref.
	granted  map[uint64]uint64 // ref → token
	busy     map[uint64]bool
	released map[uint64]bool
	extended map[uint64]bool // refs applied as extended
	timedOut map[uint64]bool
	dropped  map[uint64]bool
	applied  map[uint64]bool
	// Tokens whose release was proposed by the core (compensations).
	compensated map[uint64]bool
	cancelled   map[uint64]bool // refs whose cancel was proposed
	tokens      []uint64        // granted tokens, for releases
	// toldOn: the connection each token's grant was told on (G sent).
	toldOn map[uint64]string
	// expiring: the tokens whose expiry the log is applying right now
	// (in the commit being run); lostTo: the connections told each
	// token's loss.
	expiring map[uint64]bool
	lostTo   map[uint64]map[string]bool

	leaderChanged bool
	err           error
	cov           *coverage

	// Sessions (odd seeds: cluster version 7; see random_sessions_test.go).
	sessions        bool
	brokers         []*broker
	sids            int
	brokerOf        map[string]*broker
	sessGrant       map[seqKey]uint64 // the token the log granted (session, seq)
	expiredSessions map[uint64]bool
	queues          map[string][]uint64 // per key, queued refs in enqueue order
	toClose         []string            // connections the core closed (Ready.Closes)
	brokerCancels   map[uint64]bool     // refs of session waits their broker cancelled
}

func runRandom(seed uint64, steps int, cov *coverage) error {
	rr := &randomRun{
		cov:    cov,
		r:      rand.New(rand.NewPCG(seed, 7)),
		reqs:   map[reqKey]*reqInfo{},
		byRef:  map[uint64]*reqInfo{},
		nextID: map[string]uint64{}, dead: map[string]bool{}, version: map[string]uint16{}, watching: map[string]bool{},
		granted: map[uint64]uint64{}, busy: map[uint64]bool{}, released: map[uint64]bool{},
		timedOut: map[uint64]bool{}, dropped: map[uint64]bool{}, applied: map[uint64]bool{},
		compensated: map[uint64]bool{}, cancelled: map[uint64]bool{},
		extended: map[uint64]bool{}, toldOn: map[uint64]string{}, expiring: map[uint64]bool{},
		lostTo:   map[uint64]map[string]bool{},
		sessions: seed%2 == 1, brokerOf: map[string]*broker{}, sessGrant: map[seqKey]uint64{},
		expiredSessions: map[uint64]bool{}, queues: map[string][]uint64{}, brokerCancels: map[uint64]bool{},
	}
	rr.h = newHarness(Config{MaxKeys: 3, MaxWaitersPerKey: 2, MaxInFlightPerConn: 4, MaxWaitersPerConn: 3,
		PositionInterval: 300 * time.Millisecond})
	if rr.sessions {
		*rr.h.version = wire.VersionSessions
	}
	rr.h.onSend = rr.sent
	rr.h.onApplied = func(a Applied) {
		rr.logApplied(a)
		rr.sessionsApplied(a)
	}
	rr.h.onClose = func(c string) { rr.toClose = append(rr.toClose, c) }
	rr.h.onPropose = func(c locksm.Command) {
		rr.brokerProposed(c)
		if c.Op == locksm.OpRelease && c.Ref == 0 {
			rr.compensated[c.Token] = true
		}
		if c.Op == locksm.OpCancelWait {
			rr.cancelled[c.Ref] = true
		}
		if c.Op == locksm.OpExpire {
			for _, p := range rr.h.k.pend {
				if p.op == locksm.OpExtend && p.token == c.Token {
					rr.fail("expiry of token %d proposed while extend ref %d is owed", c.Token, p.ref)
				}
			}
		}
	}
	rr.do("leader id=n1")
	rr.do("address id=n2 addr=n2:7000")
	rr.do("gain")
	rr.do(rr.drop())
	rr.do("serve")
	for i := 0; i < steps && rr.err == nil; i++ {
		rr.step()
	}
	// Drain under a fresh leader: everything in the log commits and every
	// timer fires. Then every lease has run out through the log and every
	// wait has ended, and once leadership is lost nothing may stay owed.
	if h := rr.h; h.ho != nil && h.ho.active {
		rr.do("lose")
		rr.do("handover-end failed=false")
	}
	rr.do("lose")
	rr.do("leader id=n1")
	rr.do("gain")
	rr.do(rr.drop())
	rr.do("commit")
	rr.do("serve")
	rr.brokersDrain()
	for i := 0; i < 50 && rr.err == nil && (len(rr.h.log) > 0 || len(rr.h.timers) > 0); i++ {
		rr.do("commit")
		rr.do("advance ms=400000")
	}
	if rr.err == nil && (rr.h.st.NumHeld() > 0 || rr.h.st.NumWaiting() > 0) {
		return fmt.Errorf("after draining, %d keys still held and %d waiting:\n%s", rr.h.st.NumHeld(), rr.h.st.NumWaiting(), formatState(rr.h.st))
	}
	rr.do("lose")
	if rr.err != nil {
		return rr.err
	}
	if err := rr.brokersFinal(); err != nil {
		return err
	}
	return rr.final()
}

// drop is the new leader's drop command: drop-sessionless once the
// cluster version is 7 (the node decides so).
func (rr *randomRun) drop() string {
	if rr.sessions {
		return "append op=drop-sessionless"
	}
	return "append op=drop-waiters"
}

func (rr *randomRun) fail(format string, args ...any) {
	if rr.err == nil {
		rr.err = fmt.Errorf("after %s: %s", rr.phase, fmt.Sprintf(format, args...))
	}
}

func (rr *randomRun) do(line string) {
	if rr.err != nil {
		return
	}
	rr.phase = line
	clear(rr.expiring)
	if strings.HasPrefix(line, "lose") {
		clear(rr.toldOn) // a new leadership knows no grant's connection
	}
	deferred := len(rr.h.k.deferred)
	defer func() {
		if len(rr.h.k.deferred) > deferred {
			rr.cov.deferred++
		}
	}()
	if _, err := rr.h.run(line); err != nil {
		rr.fail("harness: %v", err)
		return
	}
	// The node closes what the core asked it to: its reader stops.
	for len(rr.toClose) > 0 && rr.err == nil {
		c := rr.toClose[0]
		rr.toClose = rr.toClose[1:]
		if b := rr.brokerOf[c]; b != nil && b.conn == c {
			b.conn, b.attached, b.attachID = "", false, 0
		}
		rr.dead[c] = true
		if _, err := rr.h.run("close conn=" + c); err != nil {
			rr.fail("harness: %v", err)
			return
		}
	}
	if err := rr.h.k.check(); err != nil {
		rr.fail("bookkeeping: %v", err)
		return
	}
	// A waiter owed a reply whose connection died or that was cancelled
	// has its cancel proposed (it must not hold up the queue, nor be
	// granted to nobody).
	for _, p := range rr.h.k.pend {
		if p.queued && ((p.conn.dead && p.session() == nil) || p.cancel) && !rr.cancelled[p.ref] {
			rr.fail("ref %d queued for a dead or cancelling connection, no cancel proposed", p.ref)
		}
		// Every other waiter's wait is timed: armed, or fired and its
		// cancel proposed.
		if p.queued && !rr.cancelled[p.ref] && !slices.ContainsFunc(rr.h.timers, func(a armed) bool {
			return a.t.Kind == TimerWait && a.t.Ref == p.ref && a.t.At.Equal(p.deadline)
		}) {
			rr.fail("ref %d queued without a wait timer", p.ref)
		}
	}
	if !rr.leaderChanged {
		if n := rr.h.st.NumHeld(); n > rr.h.cfg.MaxKeys {
			rr.fail("%d keys held, MaxKeys %d", n, rr.h.cfg.MaxKeys)
		}
		for _, key := range keys {
			if q := rr.h.st.QueueLen(key); q > rr.h.cfg.MaxWaitersPerKey {
				rr.fail("queue of %s is %d long", key, q)
			}
		}
	}
}

var keys = []string{"a", "b", "c", "d"}

func (rr *randomRun) pick(n int) int { return rr.r.IntN(n) }

func (rr *randomRun) step() {
	h := rr.h
	if rr.sessions && rr.pick(10) < 3 {
		rr.brokerStep()
		return
	}
	switch x := rr.pick(100); {
	case x < 6 || len(rr.open) == 0:
		rr.conns++
		name := fmt.Sprintf("c%d", rr.conns)
		version := []uint16{2, wire.VersionNotices, wire.VersionQueued, wire.VersionBlocks, wire.VersionBlocks, wire.VersionExtend, wire.VersionExtend,
			wire.VersionPositions, wire.VersionPositions}[rr.pick(9)]
		rr.version[name] = version
		rr.open = append(rr.open, name)
		rr.do(fmt.Sprintf("open conn=%s version=%d", name, version))
		if version >= wire.VersionPositions && rr.pick(3) != 0 {
			rr.watch(name)
		}
	case x < 9:
		i := rr.pick(len(rr.open))
		name := rr.open[i]
		rr.open = append(rr.open[:i], rr.open[i+1:]...)
		rr.dead[name] = true
		rr.do("close conn=" + name)
	case x < 35:
		c := rr.open[rr.pick(len(rr.open))]
		waits := []int{0, 0, 100, 2000, 60000}
		if rr.version[c] >= wire.VersionBlocks && rr.pick(2) == 0 {
			// A block of 2 or 3 distinct keys, in random order.
			ks := slices.Clone(keys)
			rr.r.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
			rr.request(c, wire.TypeAcquireBlock, fmt.Sprintf("acquire-block conn=%s id=%%d keys=%s owner=o%d lease=%d wait=%d",
				c, strings.Join(ks[:2+rr.pick(2)], ","), rr.pick(3), 1+rr.pick(3), waits[rr.pick(len(waits))]))
			break
		}
		rr.request(c, wire.TypeAcquire, fmt.Sprintf("acquire conn=%s id=%%d key=%s owner=o%d lease=%d wait=%d",
			c, keys[rr.pick(len(keys))], rr.pick(3), 1+rr.pick(3), waits[rr.pick(len(waits))]))
	case x < 47:
		c := rr.open[rr.pick(len(rr.open))]
		tok := uint64(rr.pick(3))
		if len(rr.tokens) > 0 && rr.pick(4) > 0 {
			tok = rr.tokens[rr.pick(len(rr.tokens))]
		}
		if rr.version[c] >= wire.VersionExtend && rr.pick(3) == 0 {
			key, owner := keys[rr.pick(len(keys))], fmt.Sprintf("o%d", rr.pick(3))
			if rr.pick(2) == 0 {
				// Mostly a holding the table has, so that extends succeed.
				h.st.RangeHolders(func(k string, hd locksm.Holder) bool {
					key, owner, tok = k, hd.Owner, hd.Token
					return rr.pick(2) == 0
				})
			}
			rr.request(c, wire.TypeExtend, fmt.Sprintf("extend conn=%s id=%%d key=%s owner=%s token=%d lease=%d",
				c, key, owner, tok, 1+rr.pick(3)))
			break
		}
		rr.request(c, wire.TypeRelease, fmt.Sprintf("release conn=%s id=%%d key=%s owner=o%d token=%d",
			c, keys[rr.pick(len(keys))], rr.pick(3), tok))
	case x < 52:
		c := rr.open[rr.pick(len(rr.open))]
		target := uint64(0)
		if n := rr.nextID[c]; n > 0 {
			target = 1 + uint64(rr.pick(int(n)))
		}
		rr.request(c, wire.TypeCancel, fmt.Sprintf("cancel conn=%s id=%%d target=%d", c, target))
	case x < 70:
		if len(h.log) > 0 {
			rr.do(fmt.Sprintf("commit n=%d", 1+rr.pick(len(h.log))))
		}
	case x < 73:
		if len(h.log) > 0 {
			ap := []string{"no", "maybe"}[rr.pick(2)]
			rr.do(fmt.Sprintf("fail n=%d appended=%s", 1+rr.pick(len(h.log)), ap))
		}
	case x < 84:
		rr.do(fmt.Sprintf("advance ms=%d", rr.pick(1500)))
	case x < 85:
		rr.leaderChanged = true
		rr.do("lose")
		if rr.pick(2) == 0 {
			rr.do("leader id=n2")
		} else {
			rr.do("leader id=")
		}
	case x < 90:
		if leading, _ := h.k.Leading(); !leading {
			rr.leaderChanged = true
			rr.do("leader id=n1")
			rr.do("gain")
			rr.do(rr.drop())
			if rr.pick(3) > 0 {
				rr.do("commit")
				rr.do("serve")
			}
		} else if !h.k.ready {
			rr.do("serve")
		}
	case x < 91:
		rr.do("handover to=n2 addr=n2:7000")
	case x < 95:
		if h.ho != nil {
			rr.do("handover-stop")
		}
	case x < 98:
		if h.ho != nil && h.ho.active {
			if rr.pick(2) == 0 {
				rr.do("handover-end failed=true")
			} else {
				rr.leaderChanged = true
				rr.do("lose")
				rr.do("handover-end failed=false")
			}
		}
	default:
		c := rr.open[rr.pick(len(rr.open))]
		if rr.version[c] >= wire.VersionPositions && rr.pick(2) == 0 {
			rr.watch(c)
			return
		}
		rr.request(c, wire.TypeNoticeAck, fmt.Sprintf("ack conn=%s id=%%d", c))
	}
}

// watch asks for places in line on c (w): answered K at once, and from
// then on c may get R.
func (rr *randomRun) watch(c string) {
	rr.request(c, wire.TypeWatchPositions, fmt.Sprintf("watch conn=%s id=%%d", c))
	if info := rr.reqs[reqKey{c, rr.nextID[c]}]; len(info.replies) != 1 || info.replies[0].Type != wire.TypeOK {
		rr.fail("w on %s answered %v, want K", c, info.replies)
	}
	rr.watching[c] = true
}

// request sends one request with the connection's next id (line has a %d
// for it) and records it.
func (rr *randomRun) request(c string, typ byte, line string) {
	rr.nextID[c]++
	id := rr.nextID[c]
	info := &reqInfo{op: typ, wait: isAcquire(typ) && !strings.HasSuffix(line, " wait=0")}
	rr.reqs[reqKey{c, id}] = info
	// The room the request finds, for judging a refusal.
	var acquiring, releasing, waiters int
	if cn := rr.h.k.conns[c]; cn != nil {
		acquiring, releasing, waiters = cn.acquiring, cn.releasing, cn.waiters
	}
	rr.do(fmt.Sprintf(line, id))
	if len(info.replies) == 1 && info.replies[0].Type == wire.TypeError {
		m, cfg := info.replies[0], rr.h.cfg
		switch {
		case m.Code == wire.CodeTooManyInFlight && (typ == wire.TypeRelease || typ == wire.TypeExtend) && releasing < cfg.MaxInFlightPerConn,
			m.Code == wire.CodeTooManyInFlight && isAcquire(typ) && acquiring < cfg.MaxInFlightPerConn:
			rr.fail("%s/%d refused too_many_in_flight with %d acquires and %d releases in flight", c, id, acquiring, releasing)
		case m.Code == wire.CodeTooManyWaiters && !info.wait:
			rr.fail("%s/%d with wait 0 refused too_many_waiters", c, id)
		case m.Code == wire.CodeTooManyWaiters && strings.Contains(m.Text, "per connection") && waiters < cfg.MaxWaitersPerConn:
			rr.fail("%s/%d refused too_many_waiters per connection with %d waiters", c, id, waiters)
		}
	}
	if cn := rr.h.k.conns[c]; cn != nil {
		if p := cn.inflight[id]; p != nil {
			info.ref = p.ref
			rr.byRef[p.ref] = info
		}
	}
}

func (rr *randomRun) logApplied(a Applied) {
	c := a.Cmd
	if p := rr.h.k.pend[c.Ref]; c.Ref != 0 && a.Res.Status == locksm.StatusQueued && p != nil && p.acquire() &&
		!p.queued && !p.conn.dead && p.conn.version >= wire.VersionQueued {
		if info := rr.byRef[c.Ref]; info != nil {
			info.wantQ = true
		}
	}
	if c.Ref != 0 {
		rr.applied[c.Ref] = true
		if info := rr.byRef[c.Ref]; info != nil && info.moved && (c.Op == locksm.OpAcquire || c.Op == locksm.OpAcquireBlock || c.Op == locksm.OpRelease || c.Op == locksm.OpExtend) {
			rr.fail("ref %d applied after its request was answered M", c.Ref)
		}
	}
	switch a.Res.Status {
	case locksm.StatusGranted:
		rr.granted[c.Ref] = a.Res.Token
		rr.tokens = append(rr.tokens, a.Res.Token)
	case locksm.StatusBusy:
		rr.busy[c.Ref] = true
	case locksm.StatusReleased:
		rr.released[c.Ref] = true
	case locksm.StatusExtended:
		rr.extended[c.Ref] = true
		rr.cov.extended++
	case locksm.StatusRejected:
		if c.Op == locksm.OpExtend {
			rr.cov.extendRefused++
		}
	case locksm.StatusExpired:
		rr.expiring[c.Token] = true
	}
	for _, e := range a.Effects {
		switch e.Kind {
		case locksm.EffectGranted:
			rr.granted[e.Ref] = e.Token
			rr.tokens = append(rr.tokens, e.Token)
		case locksm.EffectTimedOut:
			rr.timedOut[e.Ref] = true
		case locksm.EffectDropped:
			rr.dropped[e.Ref] = true
		}
	}
}

// positionSent checks an R: for an acquire owed on a version 12
// connection, before its reply, only from a walk (a due timer), exact
// (its place in the line the log built, in enqueue order), and lower than
// the place it was told before on that key.
func (rr *randomRun) positionSent(to string, info *reqInfo, m wire.Msg) {
	phase, _, _ := strings.Cut(rr.phase, " ")
	place := slices.Index(rr.queues[m.Key], info.ref) + 1
	switch {
	case !wire.ProgressAllowed(info.op, m.Type, rr.version[to]):
		rr.fail("R to %s/%d: request %c on a version %d connection", to, m.ID, info.op, rr.version[to])
	case !rr.watching[to]:
		rr.fail("R to %s/%d: the connection did not ask for places", to, m.ID)
	case rr.dead[to]:
		rr.fail("R to %s/%d: the connection is closed", to, m.ID)
	case len(info.replies) > 0:
		rr.fail("R to %s/%d after its reply %s", to, m.ID, fmtMsg(info.replies[0]))
	case phase != "advance":
		rr.fail("R to %s/%d during %q, not at a walk", to, m.ID, rr.phase)
	case place == 0 || uint32(place) != m.Position:
		rr.fail("R %s to %s: ref %d stands at %d in %s's line %v", fmtMsg(m), to, info.ref, place, m.Key, rr.queues[m.Key])
	case info.places[m.Key] != 0 && m.Position >= info.places[m.Key]:
		rr.fail("R %s to %s: told %d before (no news, or up)", fmtMsg(m), to, info.places[m.Key])
	}
	if info.places == nil {
		info.places = map[string]uint32{}
	}
	rr.cov.positions++
	if info.places[m.Key] != 0 {
		rr.cov.positionsMoved++
	}
	info.places[m.Key] = m.Position
}

func (rr *randomRun) sent(s Send[string]) {
	m := s.Msg
	if b := rr.brokerOf[s.To]; b != nil {
		rr.brokerSent(b, s.To, m)
		return
	}
	if m.Type == wire.TypeNotice {
		return
	}
	if m.Type == wire.TypeLost {
		rr.lostSent(s.To, m)
		return
	}
	info := rr.reqs[reqKey{s.To, m.ID}]
	if info == nil {
		rr.fail("reply %s to %s answers no request", fmtMsg(m), s.To)
		return
	}
	if m.Type == wire.TypePosition {
		rr.positionSent(s.To, info, m)
		return
	}
	if m.Type == wire.TypeQueued {
		info.queuedQ++
		phase, _, _ := strings.Cut(rr.phase, " ")
		switch {
		case !wire.ProgressAllowed(info.op, m.Type, rr.version[s.To]):
			rr.fail("Q to %s/%d: request %c on a version %d connection", s.To, m.ID, info.op, rr.version[s.To])
		case info.queuedQ > 1:
			rr.fail("Q to %s/%d twice", s.To, m.ID)
		case len(info.replies) > 0:
			rr.fail("Q to %s/%d after its reply %s", s.To, m.ID, fmtMsg(info.replies[0]))
		case !info.wantQ || phase != "commit":
			rr.fail("Q to %s/%d during %q, not applied as queued while owed", s.To, m.ID, rr.phase)
		}
		return
	}
	info.replies = append(info.replies, m)
	if len(info.replies) > 1 {
		rr.fail("request %s/%d answered twice: %s, %s", s.To, m.ID, fmtMsg(info.replies[0]), fmtMsg(m))
		return
	}
	phase, _, _ := strings.Cut(rr.phase, " ")
	switch m.Type {
	case wire.TypeGranted:
		if rr.dead[s.To] {
			rr.fail("G told to dead %s/%d: its grant is never released", s.To, m.ID)
		}
		if !isAcquire(info.op) || info.ref == 0 || rr.granted[info.ref] != m.Token || phase != "commit" {
			rr.fail("G %s to %s/%d: no applied grant for ref %d (log granted %d)", fmtMsg(m), s.To, m.ID, info.ref, rr.granted[info.ref])
		}
		rr.toldOn[m.Token] = s.To
	case wire.TypeBusy:
		if !rr.busy[info.ref] {
			rr.fail("B to %s/%d without the log saying busy", s.To, m.ID)
		}
	case wire.TypeTimeout:
		if !rr.timedOut[info.ref] {
			rr.fail("T to %s/%d without the wait cancelled in the log", s.To, m.ID)
		}
	case wire.TypeOK:
		if info.op == wire.TypeRelease && !rr.released[info.ref] {
			rr.fail("K to release %s/%d without the log releasing", s.To, m.ID)
		}
		if info.op == wire.TypeExtend && !rr.extended[info.ref] {
			rr.fail("K to extend %s/%d without the log extending", s.To, m.ID)
		}
	case wire.TypeUnknown:
		switch {
		case phase == "lose":
		case phase == "fail" && strings.Contains(rr.phase, "appended=maybe"):
		case phase == "commit" && rr.dropped[info.ref]:
		default:
			rr.fail("U to %s/%d during %q", s.To, m.ID, rr.phase)
		}
	case wire.TypeMoved:
		info.moved = true
		switch {
		case phase != "fail" && info.ref == 0:
		case phase == "fail" && strings.Contains(rr.phase, "appended=no"):
			if rr.applied[info.ref] {
				rr.fail("M to %s/%d whose command was applied", s.To, m.ID)
			}
		default:
			rr.fail("M to %s/%d during %q (ref %d)", s.To, m.ID, rr.phase, info.ref)
		}
	case wire.TypeError:
		switch phase {
		case "acquire", "acquire-block", "release", "extend", "cancel":
		case "commit":
			if !rr.applied[info.ref] {
				rr.fail("E to %s/%d before its command was applied", s.To, m.ID)
			}
		default:
			rr.fail("E to %s/%d during %q", s.To, m.ID, rr.phase)
		}
	}
}

// lostSent checks a lost event: sent while the log applies the expiry of
// its token, to a live version 6 connection, once, and to the connection
// the grant was told on when that one is open.
func (rr *randomRun) lostSent(to string, m wire.Msg) {
	switch phase, _, _ := strings.Cut(rr.phase, " "); {
	case phase != "commit" || !rr.expiring[m.Token]:
		rr.fail("X for token %d to %s during %q, not while its expiry is applied", m.Token, to, rr.phase)
	case rr.dead[to] || rr.version[to] < wire.VersionExtend:
		rr.fail("X for token %d to %s (dead %v, version %d)", m.Token, to, rr.dead[to], rr.version[to])
	case rr.lostTo[m.Token][to]:
		rr.fail("X for token %d to %s twice", m.Token, to)
	}
	if on, ok := rr.toldOn[m.Token]; ok && !rr.dead[on] && on != to {
		rr.fail("X for token %d to %s, but its grant was told on %s, still open", m.Token, to, on)
	}
	if rr.lostTo[m.Token] == nil {
		rr.lostTo[m.Token] = map[string]bool{}
	}
	rr.lostTo[m.Token][to] = true
	rr.cov.lost++
	if _, ok := rr.toldOn[m.Token]; !ok || rr.dead[rr.toldOn[m.Token]] {
		rr.cov.lostBroadcast++
	}
}

// final checks that every request was answered exactly once, or was a
// grant to a dead connection that was released.
func (rr *randomRun) final() error {
	if n := rr.h.k.Owed(); n != 0 {
		return fmt.Errorf("%d replies still owed after leadership was lost", n)
	}
	for rk, info := range rr.reqs {
		if info.wantQ && info.queuedQ != 1 {
			return fmt.Errorf("request %s/%d (ref %d) queued on a version %d connection, told Q %d times",
				rk.conn, rk.id, info.ref, rr.version[rk.conn], info.queuedQ)
		}
		if len(info.replies) == 1 {
			continue
		}
		if isAcquire(info.op) && rr.dead[rk.conn] && info.ref != 0 {
			if tok, ok := rr.granted[info.ref]; ok {
				if !rr.compensated[tok] {
					return fmt.Errorf("grant %d to dead %s/%d never released", tok, rk.conn, rk.id)
				}
				continue
			}
		}
		return fmt.Errorf("request %s/%d (%c, ref %d) answered %d times", rk.conn, rk.id, info.op, info.ref, len(info.replies))
	}
	return nil
}

// isAcquire reports whether typ is an acquire frame, of one key or a block.
func isAcquire(typ byte) bool { return typ == wire.TypeAcquire || typ == wire.TypeAcquireBlock }
