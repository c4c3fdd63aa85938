package leader

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Several leaders taking turns over one log (issue 39, part 2), in the
// manner of FoundationDB's simulation: a rule that spans a leader change
// cannot be checked with one core, because only another leader can have
// told a grant this one applies late. Here three cores, each with its own
// replica of the lock table, share one replicated log:
//
//   - the leader Raft names appends its core's proposals, commits a prefix
//     of the log at random points, and applies up to the commit;
//   - followers learn the commit late: each applies up to a random point
//     at or below it, whenever the simulation says so (hashicorp/raft
//     followers learn the commit index only from the next AppendEntries);
//   - leadership moves at arbitrary points: the old core loses it, the
//     entries after the commit survive into the new leader's log or are
//     cut, and the new leader applies what it had not (its barrier), says
//     so (BarrierApplied), appends its drop-sessionless, and serves;
//   - the old leader's uncommitted proposals fail (hashicorp/raft fails
//     every in-flight future of a leadership that ends, whether the entry
//     later commits or not), and each failure reaches its core at a random
//     later point, perhaps after it lost and won leadership again;
//   - brokers with sessions connect to any node, write lock requests,
//     lose their connections (a frame in flight is lost with them), are cut
//     off for a while (together with the old leader, or alone), and resume
//     wherever a leader serves; time moves, and every node's timers fire;
//   - an operator revokes (issue 42) what some replica, perhaps a stale
//     one, shows held, or a token nobody holds, through whichever node
//     it reaches.
//
// The oracle is the client's: a holder that was told G (its lease counted
// from when it wrote the acquire, renewed from when it wrote each extend
// told K) keeps the key until its lease ends or its own release applies.
// An expiry, a session's expiry or close, or the leader's release of an
// abandoned grant may end only holdings nobody was told, or whose lease
// has run out; an operator's revoke only the holding its token names; and
// no two brokers are told the same key with both leases running (a
// revoked holding's lease ends at the revoke's commit: its holder's
// fenced writes fail from then on).
//
// LEADER_MULTI_SEEDS=N runs N seeds in each mode (the long soak, `make
// soak-leaders`); LEADER_MULTI_SEED=S runs seed S alone;
// LEADER_MULTI_STEPS=N makes each run N steps (400).
func TestMultiLeaderSessions(t *testing.T) {
	first, seeds := 0, 1500
	if testing.Short() {
		seeds = 300
	}
	if v := os.Getenv("LEADER_MULTI_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("LEADER_MULTI_SEEDS=%q: %v", v, err)
		}
		seeds = n
	}
	if v := os.Getenv("LEADER_MULTI_SEED"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("LEADER_MULTI_SEED=%q: %v", v, err)
		}
		first, seeds = n, 1
	}
	steps := 400
	if v := os.Getenv("LEADER_MULTI_STEPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("LEADER_MULTI_STEPS=%q: %v", v, err)
		}
		steps = n
	}
	// Each seed runs twice: proposals appended as they come, and through
	// the node's two queues with planned hand-overs, cancels and blocks
	// (the reorder mode of the fourth attack round on issue 39).
	for _, reorder := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "queues"}[reorder], func(t *testing.T) {
			var cov mlCoverage
			for seed := first; seed < first+seeds; seed++ {
				s := newMLSim(uint64(seed), &cov)
				s.reorder = reorder
				if err := s.run(steps); err != nil {
					t.Fatalf("seed %d: %v\n(rerun alone with LEADER_MULTI_SEED=%d)\nlast steps:\n%s", seed, err, seed, s.tail())
				}
			}
			// The runs must reach what the oracle is about.
			want := map[string]int{"leader changes": cov.elections, "grants told": cov.told,
				"grants applied late by a new leader": cov.lateGrants, "session expiries": cov.sessionExpiries,
				"untold grants released": cov.untoldReleased, "leases expired": cov.expired, "resumes": cov.resumes,
				"extends told": cov.extends, "permits told": cov.permitsTold, "permits told together": cov.permitsTogether,
				"told holdings revoked": cov.revoked, "revokes refused": cov.revokesRefused,
				"revoked grants replayed by a resume": cov.revokedReplayed}
			if reorder {
				want["hand-overs"], want["failed hand-overs"], want["cancels"], want["blocks told"] =
					cov.handovers, cov.handoverFails, cov.cancels, cov.blocksTold
			}
			for name, n := range want {
				if n == 0 && seeds >= 100 {
					t.Errorf("no %s in %d runs", name, seeds)
				}
			}
			t.Logf("coverage: %+v", cov)
		})
	}
}

type mlCoverage struct {
	elections, told, lateGrants, sessionExpiries, untoldReleased, expired, resumes, extends int
	// permits told, and told while the other permit was held
	permitsTold, permitsTogether int
	// attack round 4 (reorder): hand-overs begun, failed; cancels sent
	handovers, handoverFails, cancels, blocksTold int
	// issue 42: told holdings an operator's revoke ended; revokes that
	// changed nothing (another token, or none held)
	revoked, revokesRefused int
	// revoked grants a resume replayed (each followed by its lost event)
	revokedReplayed int
}

// mlEntry is one log entry: a command of a leader's term.
type mlEntry struct {
	term int
	cmd  locksm.Command
	// from: the node whose core proposed it (-1: the node's own, like
	// the drop-sessionless), in its leadership epoch.
	from  int
	epoch uint64
}

// mlFailure is a failed proposal on its way to the core that proposed it.
type mlFailure struct {
	node  int
	epoch uint64
	cmd   locksm.Command
}

type mlNode struct {
	id      string
	k       *Core[string]
	st      *locksm.State
	dir     *directory
	applied int // entries of the log applied to st
	timers  []Timer
	epoch   uint64 // the epoch GainLeadership returned (while leading)
}

// mlConn is one broker connection, to one node.
type mlConn struct {
	node   int
	broker *mlBroker
	dead   bool
}

type mlReq struct {
	op     byte // wire type
	key    string
	keys   []string // a block acquire's keys (attack round 4); nil: one key
	token  uint64   // release, extend
	lease  int      // acquire, extend: seconds
	sentAt time.Duration
}

type mlBroker struct {
	name      string
	sid       uint64
	secret    [wire.SecretLen]byte
	conn      string
	attached  bool
	attachID  uint64
	resuming  bool
	high      uint64
	opened    bool
	expired   bool
	next, ack uint64
	ids       uint64
	conns     int
	pending   map[uint64]mlReq
	// never: seqs answered B or T (never granted, forever; attack round 4).
	never    map[uint64]byte
	seen     map[uint64]bool // seqs the resume in flight answered
	held     map[uint64]string
	cutUntil time.Duration // cannot reach any node before this
}

// told is a holding a broker was told, with its lease by its clock.
type told struct {
	broker      string
	key         string
	keys        []string // a block's keys (nil: key alone)
	leaseEnd    time.Duration
	renewedSent time.Duration // when the extend that set leaseEnd was written
	// permit: a permit of the semaphore mlSemKey, in slot.
	permit bool
	slot   uint32
	// revokedTold: a G of a holding revoked already; its lost event
	// must end it within the same outputs.
	revokedTold bool
}

// mlSemKey is a semaphore of mlPermits permits in every replica's table
// from the start (as if restored from a snapshot): brokers take permits
// of it beside their locks (issue 41).
const (
	mlSemKey  = "s"
	mlPermits = 2
)

type mlSim struct {
	r     *rand.Rand
	cov   *mlCoverage
	nodes []*mlNode
	log   []mlEntry
	// commit: entries committed; firstApplied: entries applied by some
	// node (the oracle looks at each entry once, at its first apply).
	commit, firstApplied int
	term                 int
	leader               int // the node Raft names leader (-1 none)
	// stale: nodes whose leadership Raft ended without telling them yet
	// (their cores still lead, and apply the newer leader's entries).
	stale     []int
	preparing bool // the leader has not served yet
	clock     time.Duration
	conns     map[string]*mlConn
	brokers   []*mlBroker
	told      map[uint64]told // token → told holding
	// revokedToks: tokens whose holding a revoke ended (at its first
	// apply); a G of one (a session's outcome replayed by a resume) must
	// be followed by its lost event.
	revokedToks map[uint64]bool
	steps       []string
	err         error
	// toClose: connections a broker closes in answer to a frame, closed
	// after the outputs being performed (never from inside them).
	toClose []string
	// failures: proposals of ended leaderships whose failure their core
	// has not heard yet, oldest first.
	failures []mlFailure
	// reorder (attack round 4): proposals wait in each node's two queues
	// (housekeeping, requests) as on a real node (cluster/node.go
	// nextBatchLocked) and go to the log in batches at random points.
	reorder bool
	qs      [3]mlQueue
	// ho: a planned hand-over of the leader's (attack round 4): stopped
	// serving, then (transferring) Raft refuses new entries, then it
	// succeeds (the target is elected) or fails (the leader serves again).
	ho           *HandOver
	hoFrom, hoTo int
	transferring bool
}

// mlQueue is a node's proposal queues (attack round 4).
type mlQueue struct {
	house, prop []locksm.Command
	epoch       uint64
}

var mlKeys = []string{"a", "b"}

func newMLSim(seed uint64, cov *mlCoverage) *mlSim {
	s := &mlSim{r: rand.New(rand.NewPCG(seed, 0x6d6c)), cov: cov, leader: -1, conns: map[string]*mlConn{}, told: map[uint64]told{},
		revokedToks: map[uint64]bool{}}
	v := uint16(wire.ProtocolVersion)
	for i := range 3 {
		id := fmt.Sprintf("n%d", i+1)
		n := &mlNode{id: id, st: locksm.New(), dir: &directory{addrs: map[string]string{}}}
		if res, _ := n.st.Apply(locksm.Command{Op: locksm.OpSetPermits, Key: mlSemKey, Permits: mlPermits}, nil); res.Status != locksm.StatusPermitsSet {
			panic(fmt.Sprintf("define %s: %+v", mlSemKey, res))
		}
		n.k = New[string](Config{ServerID: id, Advertise: id + ":7000", MaxInFlightPerConn: 16, MaxKeys: 100,
			MaxWaitersPerKey: 16, MaxWaitersPerConn: 32, FirstRef: uint64(i+1) << 40}, stateTable{n.st, &v}, n.dir)
		n.k.Open("op", 0) // the operator's (operatorRevoke)
		s.nodes = append(s.nodes, n)
	}
	for i := range 3 {
		b := &mlBroker{name: fmt.Sprintf("b%d", i+1), sid: uint64(100 + i), next: 1,
			pending: map[uint64]mlReq{}, held: map[uint64]string{}}
		copy(b.secret[:], b.name)
		s.brokers = append(s.brokers, b)
	}
	return s
}

func (s *mlSim) pick(n int) int { return s.r.IntN(n) }

func (s *mlSim) now() time.Time { return scriptBase.Add(s.clock) }

func (s *mlSim) note(format string, args ...any) {
	s.steps = append(s.steps, fmt.Sprintf("%6dms ", s.clock.Milliseconds())+fmt.Sprintf(format, args...))
}

func (s *mlSim) fail(format string, args ...any) {
	if s.err == nil {
		s.err = fmt.Errorf("at %dms: %s", s.clock.Milliseconds(), fmt.Sprintf(format, args...))
	}
}

func (s *mlSim) tail() string {
	return strings.Join(s.steps[max(0, len(s.steps)-60):], "\n")
}

func (s *mlSim) run(steps int) error {
	s.elect(s.pick(3))
	for range steps {
		s.step()
		if s.err != nil {
			return s.err
		}
	}
	return s.err
}

func (s *mlSim) step() {
	defer func() {
		for len(s.toClose) > 0 {
			c := s.toClose[0]
			s.toClose = s.toClose[1:]
			s.closeConn(c)
		}
	}()
	if s.reorder && s.pick(3) == 0 {
		s.flush(s.pick(3))
		return
	}
	if s.reorder && s.handOverStep() {
		return
	}
	switch x := s.pick(100); {
	case x < 2:
		s.elect(s.pick(3))
	case x < 4:
		s.partition()
	case x < 12 && s.preparing:
		s.prepare()
	case x < 7 && len(s.stale) > 0:
		s.notice(s.stale[0])
	case x < 9 && len(s.failures) > 0:
		s.reportFailure()
	case x < 30:
		s.leaderCommit()
	case x < 40:
		s.followerApply(s.pick(3))
	case x < 41:
		s.operatorRevoke()
	case x < 55:
		s.advance(time.Duration(1+s.pick(1500)) * time.Millisecond)
	default:
		s.brokerStep(s.brokers[s.pick(len(s.brokers))])
	}
}

// ---- the log and leadership ----

// elect makes node n leader in a new term (Raft's election, or a
// hand-over to it): the old leader's core loses leadership, the
// uncommitted tail of the log survives in part, and n starts preparing.
func (s *mlSim) elect(n int) {
	s.cov.elections++
	if h := s.ho; h != nil {
		s.ho, s.transferring = nil, false
		defer func() {
			s.nodes[s.hoFrom].k.EndHandOver(s.now(), h, false)
			s.drain(s.hoFrom)
		}()
	}
	if old := s.leader; old >= 0 {
		if s.pick(2) == 0 {
			s.notice(old)
		} else {
			// Raft's notice comes later: the core still leads, and may
			// apply the newer leader's entries meanwhile.
			s.stale = append(s.stale, old)
		}
	}
	if slices.Contains(s.stale, n) {
		s.notice(n) // lost and won again: the node starts over
	}
	// Every uncommitted proposal of the old leadership fails, kept or cut.
	for _, e := range s.log[s.commit:] {
		if e.from >= 0 && e.from == s.leader && e.term == s.term {
			s.failures = append(s.failures, mlFailure{node: e.from, epoch: e.epoch, cmd: e.cmd})
		}
	}
	// The new leader's log holds a prefix of the uncommitted tail (what
	// reached it); the rest is cut. Nobody applied any of it.
	keep := s.commit + s.pick(len(s.log)-s.commit+1)
	s.log = s.log[:keep]
	s.term++
	s.leader, s.preparing = n, true
	for _, nd := range s.nodes {
		nd.dir.leader = s.nodes[n].id
	}
	s.note("elect %s term %d (log %d, commit %d, kept %d)", s.nodes[n].id, s.term, len(s.log), s.commit, keep)
	s.nodes[n].epoch = s.nodes[n].k.GainLeadership(uint64(s.term))
	s.drain(n)
}

// partition cuts the leader off together with the brokers connected to
// it (the CURATOR-206 case): another node is elected, and those brokers
// reach no node for a while, at times past their sessions' timeout.
func (s *mlSim) partition() {
	old := s.leader
	if old < 0 {
		return
	}
	until := s.clock + time.Duration(s.pick(8000))*time.Millisecond
	// The brokers' connections to the old leader may stay up (they are on
	// its side of the cut): they then hear whatever it still says.
	keep := s.pick(2) == 0
	for _, name := range slices.Sorted(maps.Keys(s.conns)) {
		if c := s.conns[name]; !c.dead && c.node == old && c.broker.conn == name {
			c.broker.cutUntil = until
			if !keep {
				s.toClose = append(s.toClose, name)
			}
		}
	}
	s.note("partition: %s cut off with its brokers until %dms", s.nodes[old].id, until.Milliseconds())
	s.elect((old + 1 + s.pick(2)) % 3)
}

// reportFailure hands the oldest failed proposal to its core (a node's
// futures complete in log order), however long after its leadership
// ended: the core must not let it settle anything a later leadership of
// its own has in flight.
func (s *mlSim) reportFailure() {
	f := s.failures[0]
	s.failures = s.failures[1:]
	s.note("%s hears proposal %s of epoch %d failed", s.nodes[f.node].id, fmtCmd(f.cmd), f.epoch)
	s.nodes[f.node].k.ProposalFailed(f.epoch, []locksm.Command{f.cmd}, false, fmt.Errorf("leadership lost"))
	s.drain(f.node)
}

// notice tells node n's core that Raft ended its leadership.
func (s *mlSim) notice(n int) {
	s.stale = slices.DeleteFunc(s.stale, func(x int) bool { return x == n })
	s.nodes[n].k.LoseLeadership("leadership lost")
	s.nodes[n].epoch = 0
	s.qs[n] = mlQueue{}
	s.drain(n)
}

// prepare is the new leader's barrier, its drop of session-less waiters,
// and Serve.
func (s *mlSim) prepare() {
	n := s.leader
	nd := s.nodes[n]
	s.commit = len(s.log) // the barrier commits every entry before it
	before := nd.applied
	s.applyTo(n, s.commit)
	if nd.applied > before {
		for _, e := range s.log[before:nd.applied] {
			if e.term < s.term && e.cmd.Session != 0 {
				s.cov.lateGrants++ // (an upper bound: a session command of an earlier term)
				break
			}
		}
	}
	nd.k.BarrierApplied(nd.epoch)
	s.drain(n)
	s.log = append(s.log, mlEntry{term: s.term, cmd: locksm.Command{Op: locksm.OpDropSessionless}, from: -1})
	s.commit = len(s.log)
	s.applyTo(n, s.commit)
	if _, ok := nd.k.Serve(s.now(), s.now().UnixMilli(), nd.epoch); !ok {
		s.fail("Serve refused epoch %d", nd.epoch)
	}
	s.preparing = false
	s.note("%s serves", nd.id)
	s.drain(n)
}

// leaderCommit commits a random prefix of the log and applies it on the
// leader.
func (s *mlSim) leaderCommit() {
	if s.leader < 0 || s.preparing {
		return
	}
	s.commit += s.pick(len(s.log) - s.commit + 1)
	s.applyTo(s.leader, s.commit)
}

// followerApply lets node n (not the leader) apply up to a random point
// of what is committed.
func (s *mlSim) followerApply(n int) {
	if n == s.leader {
		return
	}
	nd := s.nodes[n]
	if nd.applied >= s.commit {
		return
	}
	s.applyTo(n, nd.applied+1+s.pick(s.commit-nd.applied))
}

// applyTo applies node n's log up to index upTo in one batch.
func (s *mlSim) applyTo(n, upTo int) {
	nd := s.nodes[n]
	if upTo <= nd.applied {
		return
	}
	batch := make([]Applied, 0, upTo-nd.applied)
	for i := nd.applied; i < upTo; i++ {
		c := s.log[i].cmd
		c.Now = s.now().UnixMilli()
		live := s.liveTold(nd.st)
		res, eff := nd.st.Apply(c, nil)
		batch = append(batch, Applied{Cmd: c, Res: res, Effects: eff, Term: uint64(s.log[i].term)})
		if i >= s.firstApplied {
			s.note("%s applies #%d %s: %s", nd.id, i, fmtCmd(c), fmtResult(res, eff))
		}
		if i >= s.firstApplied {
			s.firstApplied = i + 1
			s.oracle(nd.st, c, res, live)
		}
	}
	nd.applied = upTo
	s.note("%s applies to %d", nd.id, upTo)
	nd.k.Applied(s.now(), batch)
	s.drain(n)
}

// liveTold lists the told holdings st still holds.
func (s *mlSim) liveTold(st *locksm.State) []uint64 {
	var live []uint64
	for tok, h := range s.told {
		if st.HeldUnder(h.key, tok) {
			live = append(live, tok)
		}
	}
	slices.Sort(live)
	return live
}

// oracle checks what an entry (applied for the first time) ended: a
// holding a broker was told may end only by its own release or once its
// lease has run out by the holder's clock.
func (s *mlSim) oracle(st *locksm.State, c locksm.Command, res locksm.Result, live []uint64) {
	switch {
	case c.Op == locksm.OpExpireSession && res.Status == locksm.StatusSessionExpired:
		s.cov.sessionExpiries++
		s.cov.untoldReleased += len(c.Tokens)
	case c.Op == locksm.OpExpire && res.Status == locksm.StatusExpired:
		s.cov.expired++
	case c.Op == locksm.OpRevoke && res.Status == locksm.StatusRevoked && res.Token != c.Token:
		s.fail("%s ended token %d", fmtCmd(c), res.Token)
	case c.Op == locksm.OpRevoke && res.Status != locksm.StatusRevoked:
		s.cov.revokesRefused++
	}
	if c.Op == locksm.OpRevoke && res.Status == locksm.StatusRevoked {
		s.revokedToks[res.Token] = true
	}
	for _, tok := range live {
		h := s.told[tok]
		if st.HeldUnder(h.key, tok) {
			continue
		}
		delete(s.told, tok)
		own := c.Op == locksm.OpRelease && c.Ref != 0 && c.Token == tok
		revoked := c.Op == locksm.OpRevoke && c.Token == tok && res.Status == locksm.StatusRevoked
		if revoked {
			s.cov.revoked++
		}
		if !own && !revoked && s.clock < h.leaseEnd {
			s.fail("%s was told %s under token %d with its lease until %dms; %s ended it at %dms",
				h.broker, h.key, tok, h.leaseEnd.Milliseconds(), fmtCmd(c), s.clock.Milliseconds())
		}
	}
}

// drain performs node n's outputs.
func (s *mlSim) drain(n int) {
	nd := s.nodes[n]
	for {
		rd := nd.k.Ready()
		sends := slices.Clone(rd.Sends)
		props, epoch := slices.Clone(rd.Proposals), rd.Epoch
		closes := slices.Clone(rd.Closes)
		events := slices.Clone(rd.Events)
		if rd.ClearTimers {
			nd.timers = nil
		}
		nd.timers = append(nd.timers, rd.Timers...)
		nd.k.Advance()
		for _, e := range events {
			if e.Kind == EventSuperseded && s.reorder {
				s.qs[n] = mlQueue{}
			}
		}
		if len(props) > 0 && s.reorder {
			q := &s.qs[n]
			q.epoch = epoch
			for _, c := range props {
				if Housekeeping(c) {
					q.house = append(q.house, c)
				} else {
					q.prop = append(q.prop, c)
				}
			}
		} else if len(props) > 0 {
			if n == s.leader {
				for _, c := range props {
					s.log = append(s.log, mlEntry{term: s.term, cmd: c, from: n, epoch: epoch})
				}
			} else {
				// Raft refuses them: not the leader.
				nd.k.ProposalFailed(epoch, props, true, fmt.Errorf("not the leader"))
			}
		}
		for _, snd := range sends {
			s.deliver(snd.To, snd.Msg)
		}
		for tok, h := range s.told {
			if h.revokedTold && s.clock < h.leaseEnd {
				s.fail("%s was told G %s token %d after its revoke, and no lost event followed", h.broker, h.key, tok)
			}
		}
		s.toClose = append(s.toClose, closes...)
		if len(nd.k.Ready().Sends)+len(nd.k.Ready().Proposals)+len(nd.k.Ready().Closes)+len(nd.k.Ready().Timers) == 0 &&
			!nd.k.Ready().ClearTimers {
			return
		}
	}
}

// advance moves the clock, firing every node's due timers in order.
func (s *mlSim) advance(d time.Duration) {
	s.clock += d
	for {
		bn, bi := -1, -1
		for n, nd := range s.nodes {
			for i, t := range nd.timers {
				if t.At.After(s.now()) {
					continue
				}
				if bn < 0 || t.At.Before(s.nodes[bn].timers[bi].At) {
					bn, bi = n, i
				}
			}
		}
		if bn < 0 {
			return
		}
		nd := s.nodes[bn]
		t := nd.timers[bi]
		nd.timers = slices.Delete(nd.timers, bi, bi+1)
		if t.Kind == TimerExpire {
			s.note("%s timer expire %s token %d at %dms epoch %d", nd.id, t.Key, t.Token, t.At.Sub(scriptBase).Milliseconds(), t.Epoch)
		}
		nd.k.TimerDue(t)
		s.drain(bn)
	}
}

// ---- brokers ----

func (s *mlSim) closeConn(name string) {
	c := s.conns[name]
	if c == nil || c.dead {
		return
	}
	c.dead = true
	if b := c.broker; b.conn == name {
		b.conn, b.attached, b.attachID = "", false, 0
	}
	s.nodes[c.node].k.Closed(s.now(), name)
	s.drain(c.node)
}

func (s *mlSim) request(b *mlBroker, m wire.Msg) {
	c := s.conns[b.conn]
	if !s.nodes[c.node].k.Request(s.now(), b.conn, &m) {
		s.closeConn(b.conn)
		return
	}
	s.drain(c.node)
}

func (s *mlSim) brokerStep(b *mlBroker) {
	if b.expired {
		// A new session for a broker whose session ended.
		b.expired, b.opened, b.sid = false, false, b.sid+10
		b.next, b.ack, b.pending, b.held = 1, 0, map[uint64]mlReq{}, map[uint64]string{}
		b.never = nil
		return
	}
	switch {
	case b.conn == "":
		if s.clock < b.cutUntil {
			return
		}
		n := s.pick(3)
		if s.leader >= 0 && s.pick(4) > 0 {
			n = s.leader
		}
		b.conns++
		b.conn = fmt.Sprintf("%s.%d", b.name, b.conns)
		s.conns[b.conn] = &mlConn{node: n, broker: b}
		s.nodes[n].k.Open(b.conn, wire.ProtocolVersion)
		b.ids++
		b.attachID = 1<<40 + b.ids
		if !b.opened {
			s.note("%s opens session %d on %s", b.conn, b.sid, s.nodes[n].id)
			b.resuming = false
			s.request(b, wire.Msg{Type: wire.TypeOpenSession, ID: b.attachID, Session: b.sid, TimeoutMs: 2000, Secret: b.secret})
			return
		}
		b.resuming, b.high, b.seen = true, b.next-1, map[uint64]bool{}
		s.note("%s resumes session %d on %s high=%d ack=%d", b.conn, b.sid, s.nodes[n].id, b.high, b.ack)
		s.request(b, wire.Msg{Type: wire.TypeResume, ID: b.attachID, Session: b.sid, High: b.high, Serial: b.ack, Secret: b.secret})
	case !b.attached:
		if s.pick(3) == 0 {
			s.closeConn(b.conn)
		}
	default:
		switch x := s.pick(20); {
		case x < 8:
			key := mlKeys[s.pick(len(mlKeys))]
			lease := []int{1, 2, 4, 30}[s.pick(4)]
			waits := []uint32{0, 300, 3000, 10000}
			if s.pick(3) == 0 {
				s.write(b, mlReq{op: wire.TypeAcquirePermit, key: mlSemKey, lease: lease},
					wire.Msg{Type: wire.TypeAcquirePermit, Key: mlSemKey, Owner: b.name, Lease: uint16(lease), WaitMs: waits[s.pick(len(waits))]})
				break
			}
			if s.reorder && s.pick(3) == 0 {
				// A block of both keys (attack round 4).
				keys := []string{"a", "b"}
				if s.pick(2) == 0 {
					keys = []string{"b", "a"}
				}
				s.write(b, mlReq{op: wire.TypeAcquireBlock, key: keys[0], keys: keys, lease: lease},
					wire.Msg{Type: wire.TypeAcquireBlock, Keys: keys, Owner: b.name, Lease: uint16(lease), WaitMs: waits[s.pick(len(waits))]})
				break
			}
			s.write(b, mlReq{op: wire.TypeAcquire, key: key, lease: lease},
				wire.Msg{Type: wire.TypeAcquire, Key: key, Owner: b.name, Lease: uint16(lease), WaitMs: waits[s.pick(len(waits))]})
		case x < 11 && len(b.held) > 0:
			tok := s.anyHeld(b)
			s.write(b, mlReq{op: wire.TypeRelease, key: b.held[tok], token: tok},
				wire.Msg{Type: wire.TypeRelease, Key: b.held[tok], Owner: b.name, Token: tok})
		case x < 14 && len(b.held) > 0:
			tok := s.anyHeld(b)
			lease := 1 + s.pick(4)
			s.write(b, mlReq{op: wire.TypeExtend, key: b.held[tok], token: tok, lease: lease},
				wire.Msg{Type: wire.TypeExtend, Key: b.held[tok], Owner: b.name, Token: tok, Lease: uint16(lease)})
		case x < 16 && s.reorder && s.pick(2) == 0:
			// Cancel a waiting acquire (attack round 4): its T must mean
			// never granted.
			for _, seq := range slices.Sorted(maps.Keys(b.pending)) {
				if op := b.pending[seq].op; op == wire.TypeAcquire || op == wire.TypeAcquireBlock || op == wire.TypeAcquirePermit {
					b.ids++
					s.note("%s cancels seq %d", b.conn, seq)
					s.cov.cancels++
					s.request(b, wire.Msg{Type: wire.TypeCancel, ID: 1<<40 + b.ids, Target: seq})
					break
				}
			}
		case x < 16:
			b.ids++
			s.request(b, wire.Msg{Type: wire.TypeSessionAck, ID: 1<<40 + b.ids, Serial: b.ack})
		case x < 18:
			s.note("%s lost", b.conn)
			s.closeConn(b.conn)
		default:
			// Cut off for a while (with the node it is on, as far as it
			// is concerned): long enough, at times, for its session to
			// expire.
			b.cutUntil = s.clock + time.Duration(s.pick(6000))*time.Millisecond
			s.note("%s cut off until %dms", b.conn, b.cutUntil.Milliseconds())
			s.closeConn(b.conn)
		}
	}
}

// operatorRevoke is an operator's revoke: of a token some replica (perhaps
// stale) shows held, or now and then of one nobody holds, sent to the
// node Raft names leader, or to any node (a follower answers M). The
// operator's connection ("op" on each node, version 0) takes no events,
// and its replies are not delivered: what the revoke did is the log's.
func (s *mlSim) operatorRevoke() {
	st := s.nodes[s.pick(3)].st
	var key string
	var token uint64
	switch s.pick(4) {
	case 0:
		key, token = mlKeys[s.pick(len(mlKeys))], uint64(1+s.pick(50))
	case 1:
		if ps := st.PermitHolders(mlSemKey); len(ps) > 0 {
			key, token = mlSemKey, ps[s.pick(len(ps))].Token
		}
	default:
		key = mlKeys[s.pick(len(mlKeys))]
		if h, ok := st.Holder(key); ok {
			token = h.Token
		}
	}
	if token == 0 {
		return
	}
	n := s.pick(3)
	if s.leader >= 0 && s.pick(3) > 0 {
		n = s.leader
	}
	s.note("operator revokes %s token %d on %s", key, token, s.nodes[n].id)
	s.nodes[n].k.Revoke(s.now(), "op", 1, key, token, "ops", "sim")
	s.drain(n)
}

func (s *mlSim) anyHeld(b *mlBroker) uint64 {
	toks := make([]uint64, 0, len(b.held))
	for t := range b.held {
		toks = append(toks, t)
	}
	slices.Sort(toks)
	return toks[s.pick(len(toks))]
}

func (s *mlSim) write(b *mlBroker, r mlReq, m wire.Msg) {
	seq := b.next
	b.next++
	r.sentAt = s.clock
	b.pending[seq] = r
	m.ID = seq
	if h, ok := s.told[r.token]; ok && r.op == wire.TypeExtend {
		// Until it learns the outcome, a holder can count only on the
		// shorter of its lease and the one it asked for.
		h.leaseEnd = min(h.leaseEnd, s.clock+time.Duration(r.lease)*time.Second)
		s.told[r.token] = h
	}
	s.note("%s writes seq %d %c %s token=%d lease=%d", b.conn, seq, r.op, r.key, r.token, r.lease)
	s.request(b, m)
}

// deliver hands a frame a node sent to its connection's broker (lost if
// the connection is closed).
func (s *mlSim) deliver(to string, m wire.Msg) {
	c := s.conns[to]
	if c == nil || c.dead {
		return
	}
	b := c.broker
	switch {
	case m.Type == wire.TypeLost && m.Reason == wire.LostRevoked:
		// The holding ended at the revoke's commit: its holder stops
		// counting on it.
		if _, ok := b.held[m.Token]; ok {
			delete(b.held, m.Token)
			s.note("%s told X revoked token %d", b.name, m.Token)
		}
		if h, ok := s.told[m.Token]; ok && h.broker == b.name {
			h.leaseEnd = min(h.leaseEnd, s.clock)
			s.told[m.Token] = h
		}
		return
	case m.Type == wire.TypeNotice || m.Type == wire.TypeLost:
		return
	case m.Type == wire.TypeOutcomes:
		b.ack = max(b.ack, m.Serial)
		return
	case m.ID == b.attachID && b.attachID != 0:
		s.attachAnswered(b, m)
		return
	case m.ID >= 1<<40:
		return // K to an ack
	}
	seq := m.ID
	if b.resuming && b.attachID != 0 {
		b.seen[seq] = true
	}
	if b.never == nil {
		b.never = map[uint64]byte{}
	}
	if t, ok := b.never[seq]; ok && m.Type == wire.TypeGranted {
		s.fail("%s seq %d granted token %d after it was answered %c (never granted)", b.name, seq, m.Token, t)
	}
	r, ok := b.pending[seq]
	if m.Type == wire.TypeQueued || !ok {
		return
	}
	if m.Type == wire.TypeBusy || m.Type == wire.TypeTimeout {
		b.never[seq] = m.Type
	}
	delete(b.pending, seq)
	if m.Type != wire.TypeGranted {
		s.note("%s seq %d answered %s", b.name, seq, fmtMsg(m))
	}
	switch m.Type {
	case wire.TypeGranted:
		s.cov.told++
		end := r.sentAt + time.Duration(r.lease)*time.Second
		if s.revokedToks[m.Token] {
			// Revoked before this broker heard of the grant (a resume
			// replays its outcome): the lost event follows at once, and
			// it holds nothing. Checked in drain, after the sends.
			s.note("%s told G %s token %d, revoked already", b.name, r.key, m.Token)
			s.cov.revokedReplayed++
			b.held[m.Token] = r.key
			s.told[m.Token] = told{broker: b.name, key: r.key, keys: r.keys, leaseEnd: end, revokedTold: true}
			break
		}
		if r.op == wire.TypeAcquirePermit {
			s.permitTold(b, m, end)
			break
		}
		for tok, h := range s.told {
			if h.permit {
				continue
			}
			// (A G that arrives after its own lease ran out, by a
			// resume, tells its holder nothing it may act on.)
			if tok != m.Token && mlOverlap(h.key, h.keys, r.key, r.keys) && s.clock < h.leaseEnd && s.clock < end {
				s.fail("%s told %s under token %d while %s holds it under token %d until %dms",
					b.name, r.key, m.Token, h.broker, tok, h.leaseEnd.Milliseconds())
			}
		}
		s.told[m.Token] = told{broker: b.name, key: r.key, keys: r.keys, leaseEnd: end}
		if r.keys != nil {
			s.cov.blocksTold++
		}
		b.held[m.Token] = r.key
		s.note("%s told G %s token %d lease until %dms", b.name, r.key, m.Token, end.Milliseconds())
	case wire.TypeOK:
		switch r.op {
		case wire.TypeRelease:
			delete(b.held, r.token)
		case wire.TypeExtend:
			s.cov.extends++
			// An extend replaces the lease (a shorter one too), from
			// when it was written.
			if h, ok := s.told[r.token]; ok && r.sentAt >= h.renewedSent {
				h.leaseEnd, h.renewedSent = r.sentAt+time.Duration(r.lease)*time.Second, r.sentAt
				for _, p := range b.pending { // still in flight: may shorten it
					if p.op == wire.TypeExtend && p.token == r.token {
						h.leaseEnd = min(h.leaseEnd, p.sentAt+time.Duration(p.lease)*time.Second)
					}
				}
				s.told[r.token] = h
			}
		}
	case wire.TypeError:
		if r.op != wire.TypeAcquire && r.op != wire.TypeAcquireBlock && r.op != wire.TypeAcquirePermit {
			delete(b.held, r.token) // not held (any more)
		}
	case wire.TypeUnknown:
		s.fail("U to %s seq %d: a session request is never indeterminate", b.name, seq)
	}
}

// permitTold checks a permit's G told to b (its lease, counted from when
// it was written, until end): a slot below n, never one another broker
// was told and still holds by its lease, and never more than n permits
// told with their leases running at once.
func (s *mlSim) permitTold(b *mlBroker, m wire.Msg, end time.Duration) {
	s.cov.permitsTold++
	if m.Slot >= mlPermits {
		s.fail("%s told a permit of %s in slot %d (n %d)", b.name, mlSemKey, m.Slot, mlPermits)
	}
	live := 0
	for tok, h := range s.told {
		if !h.permit || tok == m.Token || s.clock >= h.leaseEnd || s.clock >= end {
			continue
		}
		live++
		if h.slot == m.Slot {
			s.fail("%s told slot %d of %s under token %d while %s holds it under token %d until %dms",
				b.name, m.Slot, mlSemKey, m.Token, h.broker, tok, h.leaseEnd.Milliseconds())
		}
	}
	if live > 0 {
		s.cov.permitsTogether++
	}
	if live+1 > mlPermits {
		s.fail("%s told a permit of %s under token %d while %d others are held with their leases running (n %d)",
			b.name, mlSemKey, m.Token, live, mlPermits)
	}
	s.told[m.Token] = told{broker: b.name, key: mlSemKey, leaseEnd: end, permit: true, slot: m.Slot}
	b.held[m.Token] = mlSemKey
	s.note("%s told G permit %s slot %d token %d lease until %dms", b.name, mlSemKey, m.Slot, m.Token, end.Milliseconds())
}

func (s *mlSim) attachAnswered(b *mlBroker, m wire.Msg) {
	b.attachID = 0
	switch m.Type {
	case wire.TypeOK:
		b.attached, b.opened = true, true
		if b.resuming {
			s.cov.resumes++
			for seq := range b.pending {
				if seq <= b.high && !b.seen[seq] {
					delete(b.pending, seq) // void: never applied
					if s.reorder {
						if b.never == nil {
							b.never = map[uint64]byte{}
						}
						b.never[seq] = 'V'
					}
				}
			}
		}
	case wire.TypeError:
		if m.Code == wire.CodeNoSession {
			s.note("%s: session %d expired", b.name, b.sid)
			b.expired = true
		}
		s.toClose = append(s.toClose, b.conn)
	default: // M, U: try elsewhere
		if m.Type == wire.TypeUnknown && !b.resuming {
			b.expired = true // the open may have committed: open another
		}
		s.toClose = append(s.toClose, b.conn)
	}
}

// flush takes node n's next batch as cluster/node.go nextBatchLocked does
// (housekeeping first, a share of it at least), with small batches so
// that a backlog spans several (attack round 4).
func (s *mlSim) flush(n int) {
	const maxBatch, share = 3, 1
	q := &s.qs[n]
	house := min(len(q.house), max(share, maxBatch-len(q.prop)))
	reqs := min(len(q.prop), maxBatch-house)
	if house+reqs == 0 {
		return
	}
	batch := slices.Concat(q.house[:house], q.prop[:reqs])
	q.house, q.prop = slices.Clone(q.house[house:]), slices.Clone(q.prop[reqs:])
	if n == s.leader && s.transferring {
		s.nodes[n].k.ProposalFailed(q.epoch, batch, true, fmt.Errorf("leadership transfer in progress"))
		s.drain(n)
		return
	}
	if n == s.leader {
		for _, c := range batch {
			s.log = append(s.log, mlEntry{term: s.term, cmd: c, from: n, epoch: q.epoch})
		}
		s.note("%s proposes a batch of %d", s.nodes[n].id, len(batch))
		return
	}
	s.nodes[n].k.ProposalFailed(q.epoch, batch, true, fmt.Errorf("not the leader"))
	s.drain(n)
}

// handOverStep begins, moves on or ends a planned hand-over (attack round
// 4); false if it did nothing.
func (s *mlSim) handOverStep() bool {
	if s.ho == nil {
		if s.leader < 0 || s.preparing || s.pick(40) != 0 {
			return false
		}
		from := s.leader
		to := (from + 1 + s.pick(2)) % 3
		k := s.nodes[from].k
		h, _, err := k.BeginHandOver(s.nodes[to].id, s.nodes[to].id+":7000")
		s.drain(from)
		if err != nil {
			return true
		}
		s.ho, s.hoFrom, s.hoTo = h, from, to
		s.cov.handovers++
		s.note("%s hands over to %s", s.nodes[from].id, s.nodes[to].id)
		if s.pick(2) == 0 {
			if err := k.StopServing(h); err == nil {
				s.note("%s stops serving", s.nodes[from].id)
			}
			s.drain(from)
		}
		return true
	}
	if s.pick(6) != 0 {
		return false
	}
	k := s.nodes[s.hoFrom].k
	switch {
	case !k.HandOverStopped(s.ho):
		_ = k.StopServing(s.ho)
		s.note("%s stops serving", s.nodes[s.hoFrom].id)
		s.drain(s.hoFrom)
	case !s.transferring:
		s.transferring = true
		s.note("%s transfers to %s", s.nodes[s.hoFrom].id, s.nodes[s.hoTo].id)
	case s.pick(2) == 0:
		s.note("transfer to %s succeeds", s.nodes[s.hoTo].id)
		s.elect(s.hoTo)
	default:
		h := s.ho
		s.ho, s.transferring = nil, false
		s.note("transfer to %s fails; %s serves again", s.nodes[s.hoTo].id, s.nodes[s.hoFrom].id)
		s.cov.handoverFails++
		k.EndHandOver(s.now(), h, true)
		s.drain(s.hoFrom)
	}
	return true
}

// mlOverlap reports whether two holdings (a key, or a block's keys)
// share a key (attack round 4).
func mlOverlap(k1 string, ks1 []string, k2 string, ks2 []string) bool {
	if ks1 == nil {
		ks1 = []string{k1}
	}
	if ks2 == nil {
		ks2 = []string{k2}
	}
	for _, a := range ks1 {
		if slices.Contains(ks2, a) {
			return true
		}
	}
	return false
}
