package leader

import (
	"fmt"
	"slices"
	"strings"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Brokers in the randomized test (cluster version 7 runs): each opens a
// session on a version 7 connection, writes lock requests whose ids are
// its seqs, acks the O watermarks it read, loses its connection now and
// then (or has it closed by a leadership that ended) and resumes on a new
// one naming its highest seq and its ack. The checks:
//
//   - a seq's final reply (G, B, T, K, E, M) comes at most once, or again
//     only identical (a resume repeats the outcomes above the ack); never
//     U; never after the resume answered it void;
//   - G for a seq carries the token the log granted to (session, seq);
//   - O names exactly the session's latest serial in the state;
//   - the core cancels a session's wait only for the broker's cancel or a
//     due wait timer (never for a dead connection, a hand-over or a
//     leader change), and expires a session only while it is not
//     attached, naming in Tokens no grant the broker was told;
//   - per key, grants of queued waiters come in the order they were
//     queued, across leader changes;
//   - drained under a fresh leader where every live broker resumed, every
//     seq of a session that did not expire has a final reply or is void.
type broker struct {
	name     string
	sid      uint64
	conns    int
	conn     string // current connection ("" none)
	attached bool
	attachID uint64 // the id of the open or resume in flight (0 none)
	resuming bool   // attachID is a resume
	high     uint64 // the resume's high
	opened   bool
	expired  bool
	next     uint64            // next seq
	ack      uint64            // latest O serial read
	ids      uint64            // ids of frames that are not seqs (open, resume, k, c)
	pending  map[uint64]string // seq → key (written, no final reply)
	finals   map[uint64]wire.Msg
	finalOn  map[uint64]string // the connection each final reply came on
	void     map[uint64]bool
	seen     map[uint64]bool // seqs answered (final or Q) by the resume in flight
	tokens   map[uint64]bool // G tokens received
	holding  []uint64        // tokens it may release
}

// frameID is an id for a frame that is not a seq, far above every seq.
func (b *broker) frameID() uint64 {
	b.ids++
	return 1<<40 + b.ids
}

type seqKey struct{ sid, seq uint64 }

// brokerStep runs one random broker action.
func (rr *randomRun) brokerStep() {
	var live []*broker
	for _, b := range rr.brokers {
		if !b.expired {
			live = append(live, b)
		}
	}
	if len(live) == 0 || (len(live) < 3 && rr.pick(8) == 0) {
		rr.sids++
		b := &broker{name: fmt.Sprintf("s%d", rr.sids), sid: uint64(100 + rr.sids), next: 1,
			pending: map[uint64]string{}, finals: map[uint64]wire.Msg{}, finalOn: map[uint64]string{}, void: map[uint64]bool{},
			tokens: map[uint64]bool{}}
		rr.brokers = append(rr.brokers, b)
		rr.brokerConnect(b)
		return
	}
	b := live[rr.pick(len(live))]
	switch {
	case b.conn == "":
		rr.brokerConnect(b)
	case !b.attached:
		if rr.pick(4) == 0 {
			rr.brokerClose(b)
		}
	default:
		switch x := rr.pick(20); {
		case x < 9:
			waits := []int{0, 100, 2000, 60000}
			rr.brokerRequest(b, fmt.Sprintf("acquire conn=%s id=%%d key=%s owner=b%d lease=%d wait=%d",
				b.conn, keys[rr.pick(len(keys))], b.sid, 1+rr.pick(3), waits[rr.pick(len(waits))]))
		case x < 12:
			if len(b.holding) == 0 {
				return
			}
			tok := b.holding[rr.pick(len(b.holding))]
			key := ""
			rr.h.st.RangeHolders(func(k string, h locksm.Holder) bool {
				if h.Token == tok {
					key = k
					return false
				}
				return true
			})
			if key == "" {
				key = keys[rr.pick(len(keys))]
			}
			rr.brokerRequest(b, fmt.Sprintf("release conn=%s id=%%d key=%s owner=b%d token=%d", b.conn, key, b.sid, tok))
		case x < 14:
			var ws []uint64
			for seq := range b.pending {
				ws = append(ws, seq)
			}
			if len(ws) == 0 {
				return
			}
			slices.Sort(ws)
			target := ws[rr.pick(len(ws))]
			if cn := rr.h.k.conns[b.conn]; cn != nil && cn.inflight[target] != nil {
				rr.brokerCancels[cn.inflight[target].ref] = true
			}
			rr.do(fmt.Sprintf("cancel conn=%s id=%d target=%d", b.conn, b.frameID(), target))
		case x < 17:
			rr.do(fmt.Sprintf("session-ack conn=%s id=%d serial=%d", b.conn, b.frameID(), b.ack))
		case x < 19:
			rr.brokerClose(b)
		default:
			if rr.pick(4) == 0 {
				// A clean stop: the session ends (its waiters are told
				// T); the broker acts on it no more.
				b.expired = true
				rr.cov.closes++
				rr.do(fmt.Sprintf("close-session conn=%s id=%d", b.conn, b.frameID()))
			}
		}
	}
}

// brokerConnect opens a new connection for b and opens or resumes its
// session on it.
func (rr *randomRun) brokerConnect(b *broker) {
	b.conns++
	b.conn = fmt.Sprintf("%s.%d", b.name, b.conns)
	rr.brokerOf[b.conn] = b
	rr.version[b.conn] = wire.VersionSessions
	rr.do(fmt.Sprintf("open conn=%s version=%d", b.conn, wire.VersionSessions))
	b.attached, b.attachID = false, b.frameID()
	if !b.opened {
		// An open whose reply was lost may have opened its session: a
		// broker opens another (the orphan expires empty).
		rr.sids++
		b.sid = uint64(100 + rr.sids)
		rr.do(fmt.Sprintf("open-session conn=%s id=%d session=%d timeout=%d", b.conn, b.attachID, b.sid, 2000+1000*rr.pick(3)))
		return
	}
	b.resuming, b.high, b.seen = true, b.next-1, map[uint64]bool{}
	rr.cov.resumes++
	rr.do(fmt.Sprintf("resume conn=%s id=%d session=%d high=%d ack=%d", b.conn, b.attachID, b.sid, b.high, b.ack))
}

// brokerClose closes b's connection (the broker lost it).
func (rr *randomRun) brokerClose(b *broker) {
	c := b.conn
	b.conn, b.attached, b.attachID = "", false, 0
	if c != "" {
		rr.dead[c] = true
		rr.do("close conn=" + c)
	}
}

// brokerRequest writes b's next seq (line has a %d for it).
func (rr *randomRun) brokerRequest(b *broker, line string) {
	seq := b.next
	b.next++
	b.pending[seq] = strings.Fields(line)[0]
	rr.do(fmt.Sprintf(line, seq))
}

// brokerSent checks a frame sent on one of b's connections.
func (rr *randomRun) brokerSent(b *broker, to string, m wire.Msg) {
	if m.Type == wire.TypeNotice {
		return
	}
	if m.Type == wire.TypeLost {
		rr.lostSent(to, m)
		return
	}
	if rr.dead[to] {
		// Only the answer to an open or resume may be addressed to a
		// connection that died: a session's replies go to its attached
		// connection, never a dead one.
		if m.ID < 1<<40 {
			rr.fail("%s sent on %s, closed", fmtMsg(m), to)
		}
		return
	}
	if to != b.conn {
		// A connection the session was taken over from (or that a
		// leadership closed): nothing of the session may go there.
		if m.Type != wire.TypeError || m.Code != wire.CodeBadSession {
			rr.fail("%s sent on %s, no longer %s's connection", fmtMsg(m), to, b.name)
		}
		return
	}
	if m.Type == wire.TypeOutcomes {
		// As of the entry it follows (a resume's O leaves out what later
		// entries of its batch recorded): never past the state's.
		info, ok := rr.h.st.Session(b.sid)
		if !ok || m.Session != b.sid || m.Serial > info.Serial || m.Serial < b.ack {
			rr.fail("O %s to %s: the state's serial is %d, the ack %d", fmtMsg(m), to, info.Serial, b.ack)
		}
		b.ack = max(b.ack, m.Serial)
		return
	}
	if m.ID == b.attachID && m.ID != 0 {
		rr.attachAnswered(b, m)
		return
	}
	if m.ID >= 1<<40 {
		return // a K to a cancel or an ack; an E for one of those
	}
	seq := m.ID
	if b.resuming && b.attachID != 0 {
		b.seen[seq] = true
	}
	if m.Type == wire.TypeQueued {
		if _, ok := b.pending[seq]; !ok {
			rr.fail("Q for %s seq %d, not pending", b.name, seq)
		}
		return
	}
	if b.void[seq] {
		rr.fail("%s for %s seq %d, answered void by a resume", fmtMsg(m), b.name, seq)
		return
	}
	if prev, ok := b.finals[seq]; ok {
		if prev.Type != m.Type || prev.Token != m.Token || prev.Code != m.Code {
			rr.fail("%s seq %d answered %s, then %s", b.name, seq, fmtMsg(prev), fmtMsg(m))
		}
		// A resume on a new connection repeats what was not acked; one
		// connection never carries two replies to one request (the
		// client drops a connection that does: issue 39, finding 2).
		if b.finalOn[seq] == to {
			rr.fail("%s seq %d answered twice on %s: %s", b.name, seq, to, fmtMsg(m))
		}
		b.finalOn[seq] = to
		return
	}
	if _, ok := b.pending[seq]; !ok {
		rr.fail("%s for %s seq %d, never written", fmtMsg(m), b.name, seq)
		return
	}
	switch m.Type {
	case wire.TypeUnknown:
		rr.fail("U for %s seq %d: a session request is never indeterminate", b.name, seq)
	case wire.TypeGranted:
		if tok, ok := rr.sessGrant[seqKey{b.sid, seq}]; !ok || tok != m.Token {
			rr.fail("G %s for %s seq %d: the log granted %d", fmtMsg(m), b.name, seq, tok)
		}
		b.tokens[m.Token] = true
		b.holding = append(b.holding, m.Token)
	}
	delete(b.pending, seq)
	b.finals[seq] = m
	b.finalOn[seq] = to
}

// attachAnswered takes the reply to b's open or resume.
func (rr *randomRun) attachAnswered(b *broker, m wire.Msg) {
	resuming := b.resuming
	b.attachID, b.resuming = 0, false
	switch m.Type {
	case wire.TypeOK:
		b.attached, b.opened = true, true
		if !resuming {
			return
		}
		rr.cov.resumed++
		// Every pending seq <= high the answer did not name is void.
		for seq := range b.pending {
			if seq <= b.high && !b.seen[seq] {
				delete(b.pending, seq)
				b.void[seq] = true
				rr.cov.voids++
			}
		}
	case wire.TypeError:
		if m.Code == wire.CodeNoSession {
			if !resuming {
				rr.fail("no_session for %s's open", b.name)
			}
			b.expired = true
			return
		}
		if m.Code == wire.CodeNotSupported {
			return // keep trying on this connection later
		}
		rr.fail("%s to %s's attach", fmtMsg(m), b.name)
	case wire.TypeMoved, wire.TypeUnknown:
		if m.Type == wire.TypeUnknown && !resuming {
			// The open may have committed: a broker opens another
			// session (the orphan expires).
			b.expired = true
		}
		// Closed after the command (never from inside its outputs).
		rr.toClose = append(rr.toClose, b.conn)
	default:
		rr.fail("%s to %s's attach", fmtMsg(m), b.name)
	}
}

// brokerProposed checks a proposal against the brokers: a session's wait
// is cancelled only for its broker's cancel or its due timer, and an
// expiry names no grant its broker was told and finds it detached.
func (rr *randomRun) brokerProposed(c locksm.Command) {
	phase, _, _ := strings.Cut(rr.phase, " ")
	switch c.Op {
	case locksm.OpCancelWait:
		// A failed hand-over proposes again the cancel of a wait that
		// ran out while Raft refused entries.
		p := rr.h.k.pend[c.Ref]
		ranOut := phase == "handover-end" && p != nil && !p.deadline.After(rr.h.now())
		if p != nil && p.session() != nil && !rr.brokerCancels[c.Ref] && phase != "advance" && !ranOut {
			rr.fail("cancel of session %d's wait (seq %d) proposed during %q", p.session().id, p.id, rr.phase)
		}
	case locksm.OpExpireSession:
		rr.cov.sessionExpiries++
		if s := rr.h.k.sessions[c.Session]; s == nil || s.conn != nil {
			rr.fail("expiry of session %d proposed while attached (or unknown)", c.Session)
		}
		for _, b := range rr.brokers {
			if b.sid != c.Session {
				continue
			}
			for _, t := range c.Tokens {
				rr.cov.untoldReleased++
				if b.tokens[t] {
					rr.fail("expiry of session %d names token %d, which its broker was told", c.Session, t)
				}
			}
		}
	}
}

// sessionsApplied records what the log did for sessions, and checks FIFO
// per key for queued waiters.
func (rr *randomRun) sessionsApplied(a Applied) {
	c := &a.Cmd
	if c.Session != 0 && !c.Op.SessionOp() && a.Res.Status == locksm.StatusGranted {
		rr.sessGrant[seqKey{c.Session, c.Seq}] = a.Res.Token
	}
	if c.Op == locksm.OpExpireSession && a.Res.Status == locksm.StatusSessionExpired {
		for _, b := range rr.brokers {
			if b.sid == c.Session {
				rr.expiredSessions[b.sid] = true
			}
		}
	}
	if a.Res.Status == locksm.StatusQueued {
		for _, k := range cmdKeys(c) {
			rr.queues[k] = append(rr.queues[k], c.Ref)
		}
	}
	for _, e := range a.Effects {
		ks := e.Keys
		if ks == nil {
			ks = []string{e.Key}
		}
		if e.Kind == locksm.EffectGranted {
			if e.Session != 0 {
				rr.sessGrant[seqKey{e.Session, e.Seq}] = e.Token
			}
			for _, k := range ks {
				if q := rr.queues[k]; len(q) == 0 || q[0] != e.Ref {
					rr.fail("FIFO: ref %d granted %s, but the queue (in enqueue order) is %v", e.Ref, k, q)
				}
			}
		}
		for _, k := range ks {
			if i := slices.Index(rr.queues[k], e.Ref); i >= 0 {
				rr.queues[k] = slices.Delete(rr.queues[k], i, i+1)
			}
		}
	}
}

func cmdKeys(c *locksm.Command) []string {
	if c.Op == locksm.OpAcquireBlock {
		return c.Keys
	}
	return []string{c.Key}
}

// brokersDrain resumes every live broker on the drained leader.
func (rr *randomRun) brokersDrain() {
	for _, b := range rr.brokers {
		if b.expired || rr.expiredSessions[b.sid] {
			continue
		}
		if b.conn != "" {
			rr.brokerClose(b)
		}
		if b.opened {
			rr.brokerConnect(b)
		}
	}
}

// brokersFinal checks that every seq of a session that lives has a final
// reply or is void.
func (rr *randomRun) brokersFinal() error {
	for _, b := range rr.brokers {
		if b.expired || rr.expiredSessions[b.sid] || !b.opened {
			continue
		}
		for seq := range b.pending {
			return fmt.Errorf("%s (session %d) seq %d has neither a final reply nor a void", b.name, b.sid, seq)
		}
	}
	return nil
}
