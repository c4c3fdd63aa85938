package sidecar

// The broker's scheduler: which acquire is sent next, and who gets waiter
// room. It is pure bookkeeping (no I/O, no clock, no goroutine), guarded by
// Broker.qmu, so its rules are unit-tested directly (sched_test.go).
//
// Sessions. A session is one owner (unixapi: one local connection). Each
// has a FIFO of acquires not yet sent; sending takes them round-robin
// across the sessions that have any (every acquire costs one in-flight
// slot, so deficit round-robin with equal costs is plain round-robin), so a
// session's acquires are sent in the order it asked for them, and one
// session's flood never delays another's next acquire by more than one
// turn per other session.
//
// Waiter room. An acquire with a wait is a waiter from the moment it is
// asked for until its final reply (the node counts it the same way: a wait
// > 0 acquire not applied yet, then its place in the key's queue). Waiters
// are bounded per session (maxPerSession) and sidecar-wide (maxWaiters).
// When the sidecar-wide room is full, the refusal goes to the session that
// holds the most: an asker holding less than the largest session has that
// session's newest waiter evicted, and takes its room when it frees. So no
// session below the largest one's count is ever refused for sidecar-wide
// room, and the counts converge to equal shares.

// sess is one owner's scheduling state.
type sess struct {
	owner   string
	pending opList // acquires not yet sent, in the order asked
	waiting opList // waiter room held, in the order admitted (newest last)
	// held counts waiting minus those being evicted; admitting counts this
	// session's acquires in sched.admitQ.
	held, admitting int
	ops             int // live acquires of this session in any state
	// ring links the sessions that have pending acquires.
	inRing       bool
	rprev, rnext *sess
}

// count is what the session holds or has been promised of the waiter room.
func (s *sess) count() int { return s.held + s.admitting }

// opList is an intrusive FIFO of acquires. An op is in at most one queue
// list (a session's pending, or admitQ: the q links) and at most one
// waiting list (the w links).
type opList struct {
	head, tail *acqOp
	n          int
	w          bool // uses the w links
}

func (l *opList) links(o *acqOp) (prev, next **acqOp) {
	if l.w {
		return &o.wprev, &o.wnext
	}
	return &o.qprev, &o.qnext
}

func (l *opList) pushBack(o *acqOp) {
	p, n := l.links(o)
	*p, *n = l.tail, nil
	if l.tail != nil {
		_, tn := l.links(l.tail)
		*tn = o
	} else {
		l.head = o
	}
	l.tail = o
	l.n++
}

func (l *opList) pushFront(o *acqOp) {
	p, n := l.links(o)
	*p, *n = nil, l.head
	if l.head != nil {
		hp, _ := l.links(l.head)
		*hp = o
	} else {
		l.tail = o
	}
	l.head = o
	l.n++
}

func (l *opList) remove(o *acqOp) {
	p, n := l.links(o)
	if *p != nil {
		_, pn := l.links(*p)
		*pn = *n
	} else {
		l.head = *n
	}
	if *n != nil {
		np, _ := l.links(*n)
		*np = *p
	} else {
		l.tail = *p
	}
	*p, *n = nil, nil
	l.n--
}

// sched is the scheduler's state.
type sched struct {
	maxWaiters, maxPerSession int

	sessions map[string]*sess
	ring     *sess // the next session to send from; nil: nothing pending
	pendingN int   // acquires in the sessions' pending lists

	waiters  int    // waiter room held (evicting ones included)
	evicting int    // waiters whose eviction is under way
	admitQ   opList // acquires promised the room an eviction frees
}

func newSched(maxWaiters, maxPerSession int) *sched {
	return &sched{maxWaiters: maxWaiters, maxPerSession: maxPerSession, sessions: map[string]*sess{}}
}

// session returns owner's session, creating it, and counts one more op.
func (sc *sched) session(owner string) *sess {
	s := sc.sessions[owner]
	if s == nil {
		s = &sess{owner: owner, waiting: opList{w: true}}
		sc.sessions[owner] = s
	}
	s.ops++
	return s
}

// drop forgets one op of s, and s once it has none.
func (sc *sched) drop(s *sess) {
	if s.ops--; s.ops == 0 {
		delete(sc.sessions, s.owner)
	}
}

// verdict is admit's answer.
type verdict uint8

const (
	admitted       verdict = iota // go ahead (room taken if it needs any)
	mustWait                      // in admitQ: it gets the room an eviction frees
	refusedSession                // the session has maxPerSession waiters
	refusedFull                   // the room is full and this session holds the most
)

// admit decides whether o (of session o.sess) may go on. A wait-0 acquire
// needs no room. When the asker's session holds less than the largest
// one, that session's newest waiter is returned as the victim to evict
// (the caller cancels it) and o waits in admitQ for the room.
func (sc *sched) admit(o *acqOp) (v verdict, victim *acqOp) {
	s := o.sess
	if !o.waiter {
		return admitted, nil
	}
	if s.count() >= sc.maxPerSession {
		return refusedSession, nil
	}
	if sc.waiters < sc.maxWaiters && sc.admitQ.n == 0 {
		sc.take(o)
		return admitted, nil
	}
	if sc.evicting > sc.admitQ.n {
		// An eviction under way frees room nobody has claimed yet.
		sc.wait(o)
		return mustWait, nil
	}
	var big *sess
	for _, t := range sc.sessions {
		if big == nil || t.count() > big.count() {
			big = t
		}
	}
	if big == nil || s.count() >= big.count() {
		return refusedFull, nil
	}
	victim = big.waiting.tail
	for victim != nil && victim.evicting {
		victim = victim.wprev
	}
	if victim != nil {
		victim.evicting = true
		big.held--
		sc.evicting++
	} else {
		// All it has is promises: withdraw its newest one instead; o
		// takes its place in the line.
		for victim = sc.admitQ.tail; victim != nil && victim.sess != big; victim = victim.qprev {
		}
		if victim == nil {
			return refusedFull, nil // cannot happen: big.count() > 0 is room or promises
		}
		sc.unwait(victim)
	}
	sc.wait(o)
	return mustWait, victim
}

// take gives o one unit of the room.
func (sc *sched) take(o *acqOp) {
	sc.waiters++
	o.sess.held++
	o.sess.waiting.pushBack(o)
	o.hasRoom = true
}

func (sc *sched) wait(o *acqOp) {
	sc.admitQ.pushBack(o)
	o.sess.admitting++
	o.admitting = true
}

// unwait takes o out of admitQ (it gave up, or was evicted there).
func (sc *sched) unwait(o *acqOp) {
	sc.admitQ.remove(o)
	o.sess.admitting--
	o.admitting = false
}

// free gives back o's room (its acquire ended) and returns the acquires
// admitted with it, in admitQ order.
func (sc *sched) free(o *acqOp) (in []*acqOp) {
	if !o.hasRoom {
		return nil
	}
	o.hasRoom = false
	o.sess.waiting.remove(o)
	if o.evicting {
		sc.evicting--
	} else {
		o.sess.held--
	}
	sc.waiters--
	for sc.admitQ.n > 0 && sc.waiters < sc.maxWaiters {
		a := sc.admitQ.head
		sc.unwait(a)
		sc.take(a)
		in = append(in, a)
	}
	return in
}

// enqueue appends o to its session's pending acquires.
func (sc *sched) enqueue(o *acqOp) {
	o.sess.pending.pushBack(o)
	sc.pendingN++
	sc.ringAdd(o.sess)
}

// requeue puts o back at the head of its session's pending acquires (it
// was taken by next but could not be sent: nothing was written).
func (sc *sched) requeue(o *acqOp) {
	o.sess.pending.pushFront(o)
	sc.pendingN++
	sc.ringAdd(o.sess)
}

// unqueue takes o out of its session's pending acquires.
func (sc *sched) unqueue(o *acqOp) {
	s := o.sess
	s.pending.remove(o)
	sc.pendingN--
	if s.pending.n == 0 {
		sc.ringRemove(s)
	}
}

// next takes the acquire to send next: the head of the next session's
// pending FIFO, round-robin. nil when nothing is pending.
func (sc *sched) next() *acqOp {
	s := sc.ring
	if s == nil {
		return nil
	}
	o := s.pending.head
	s.pending.remove(o)
	sc.pendingN--
	if s.pending.n == 0 {
		sc.ringRemove(s)
	} else {
		sc.ring = s.rnext
	}
	return o
}

// ringAdd puts s last in the round (just before the session to send next).
func (sc *sched) ringAdd(s *sess) {
	if s.inRing {
		return
	}
	s.inRing = true
	if sc.ring == nil {
		s.rprev, s.rnext = s, s
		sc.ring = s
		return
	}
	last := sc.ring.rprev
	s.rprev, s.rnext = last, sc.ring
	last.rnext = s
	sc.ring.rprev = s
}

func (sc *sched) ringRemove(s *sess) {
	if !s.inRing {
		return
	}
	s.inRing = false
	if s.rnext == s {
		sc.ring = nil
	} else {
		s.rprev.rnext = s.rnext
		s.rnext.rprev = s.rprev
		if sc.ring == s {
			sc.ring = s.rnext
		}
	}
	s.rprev, s.rnext = nil, nil
}
