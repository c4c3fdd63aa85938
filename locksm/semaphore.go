package locksm

import (
	"maps"
	"math"
	"math/bits"
	"slices"
	"sort"
)

// A semaphore key holds up to n permits at once instead of one holder
// (MATRIX.md, "Semaphores"). It is defined by OpSetPermits, never by an
// acquire: a plain acquire of it is ErrIsSemaphore and a permit acquire of
// anything else ErrNotSemaphore, so a client and the table can never
// silently disagree on what a key is. Semaphores live beside the lock
// entries (State.sems): an entry stays 64 bytes, and a table without
// semaphores pays one map length check on the paths that must tell the
// two apart.
//
// Each permit is a holding of its own: its own token from the one
// counter, its own lease, label and session, and a slot 0..n-1, the
// lowest free one when granted. (key, slot) is the fencing domain of a
// permit, as a key is a lock's. Releases, extends and expiries name the
// permit by its token, which is unique, so they match exactly as for a
// lock.

// permit is one held permit of a semaphore.
type permit struct {
	owner     string
	token     uint64
	grantedAt int64
	leaseSec  uint32
	// session and seq: the session command it was granted for (0: none).
	session, seq uint64
}

// semaphore is a key defined with n permits.
//
// Its memory follows the permits held, never the slot numbers: a permit
// left in slot 99,999 after the others ended costs one map entry, not a
// slice of 100,000 (and a crafted snapshot cannot buy megabytes with a
// few bytes). The lowest free slot is found through a bitmap of held
// slots kept as a map of 64-slot words (absent: all free) and the sorted
// list of the words that are full: O(log n) a grant.
type semaphore struct {
	// permits is n: grants wait while n or more permits are held. Lowering
	// it never ends a holding: slots at or above it stay held until they
	// end, and are not granted again while they are above it.
	permits uint32
	// gen is the State generation this semaphore was created or copied in
	// (copy-on-write with Freeze, as for entries).
	gen uint32
	// held maps the slot of every held permit to it.
	held map[uint32]permit
	// slotOf maps the token of every held permit to its slot.
	slotOf map[uint64]uint32
	// words has bit i of words[w] set iff slot 64w+i is held; a word
	// with no bit set is absent.
	words map[uint32]uint64
	// full lists, ascending, the words whose 64 slots are all held.
	full []uint32
	// queue is the key's FIFO of waiting permit acquires; nil while
	// nobody waits. Invariant: a non-empty queue means at least permits
	// permits are held (otherwise its head would have been granted).
	queue *waitQueue
}

// numHeld is the number of held permits.
func (m *semaphore) numHeld() int { return len(m.held) }

// lowestFree is the lowest slot no permit holds. The caller grants it
// only after checking numHeld() < permits, which makes it lower than
// permits (at most numHeld() slots below permits are taken).
func (m *semaphore) lowestFree() uint32 {
	// full[r] >= r for every r; the first r where full[r] != r is the
	// first word that is not full.
	w := sort.Search(len(m.full), func(r int) bool { return m.full[r] != uint32(r) })
	return uint32(w)*64 + uint32(bits.TrailingZeros64(^m.words[uint32(w)]))
}

// take marks slot held by p.
func (m *semaphore) take(slot uint32, p permit) {
	m.held[slot] = p
	m.slotOf[p.token] = slot
	w := slot / 64
	word := m.words[w] | 1<<(slot%64)
	m.words[w] = word
	if word == math.MaxUint64 {
		i, _ := slices.BinarySearch(m.full, w)
		m.full = slices.Insert(m.full, i, w)
	}
}

// release frees slot.
func (m *semaphore) release(slot uint32) {
	delete(m.slotOf, m.held[slot].token)
	delete(m.held, slot)
	w := slot / 64
	word := m.words[w]
	if word == math.MaxUint64 {
		i, _ := slices.BinarySearch(m.full, w)
		m.full = slices.Delete(m.full, i, i+1)
	}
	if word &^= 1 << (slot % 64); word == 0 {
		delete(m.words, w)
	} else {
		m.words[w] = word
	}
}

// heldSlots lists the held slots in ascending order.
func (m *semaphore) heldSlots() []uint32 {
	ws := make([]uint32, 0, len(m.words))
	for w := range m.words {
		ws = append(ws, w)
	}
	slices.Sort(ws)
	out := make([]uint32, 0, len(m.held))
	for _, w := range ws {
		for word := m.words[w]; word != 0; word &= word - 1 {
			out = append(out, w*64+uint32(bits.TrailingZeros64(word)))
		}
	}
	return out
}

// clone is a private copy of m for copy-on-write.
func (m *semaphore) clone(gen uint32) *semaphore {
	return &semaphore{permits: m.permits, gen: gen, held: maps.Clone(m.held), slotOf: maps.Clone(m.slotOf),
		words: maps.Clone(m.words), full: slices.Clone(m.full), queue: m.queue.clone()}
}

func newSemaphore(n uint32, gen uint32) *semaphore {
	return &semaphore{permits: n, gen: gen, held: make(map[uint32]permit), slotOf: make(map[uint64]uint32),
		words: make(map[uint32]uint64)}
}

// ownSem returns the semaphore of key in a form this State may write.
func (s *State) ownSem(key string, m *semaphore) *semaphore {
	if m.gen == s.gen {
		return m
	}
	c := m.clone(s.gen)
	s.sems[key] = c
	return c
}

// isSemaphore reports whether key is defined as a semaphore.
func (s *State) isSemaphore(key string) bool {
	if len(s.sems) == 0 {
		return false
	}
	_, ok := s.sems[key]
	return ok
}

// setPermits defines cmd.Key as a semaphore of cmd.Permits permits,
// changes its n, or (0) removes an idle definition. Raising n grants the
// queue's head waiters, in order, in this command.
func (s *State) setPermits(cmd *Command, effects []Effect) (result, []Effect) {
	m := s.sems[cmd.Key]
	if m == nil {
		switch {
		case cmd.Permits == 0:
			return result{Status: StatusRejected, Err: ErrNotSemaphore}, effects
		case s.keys[cmd.Key] != nil:
			// A lock is held or reserved on it: defining it now would
			// leave a lock holder and permit holders side by side.
			return result{Status: StatusRejected, Err: ErrInUse}, effects
		}
		s.sems[cmd.Key] = newSemaphore(cmd.Permits, s.gen)
		return result{Status: StatusPermitsSet}, effects
	}
	if cmd.Permits == 0 {
		if m.numHeld() > 0 || m.queue.len() > 0 {
			return result{Status: StatusRejected, Err: ErrInUse}, effects
		}
		delete(s.sems, cmd.Key)
		return result{Status: StatusPermitsSet}, effects
	}
	m = s.ownSem(cmd.Key, m)
	m.permits = cmd.Permits
	return result{Status: StatusPermitsSet}, s.grantPermits(cmd.Key, m, cmd.Now, effects)
}

// acquirePermit takes one permit of semaphore cmd.Key: granted at once
// when fewer than n are held and nobody waits (FIFO: a newcomer never
// passes a waiter), Busy with wait 0, else queued at the tail.
func (s *State) acquirePermit(cmd *Command) result {
	m := s.sems[cmd.Key]
	if m == nil {
		return result{Status: StatusRejected, Err: ErrNotSemaphore}
	}
	if m.queue.len() == 0 && m.numHeld() < int(m.permits) {
		if s.last == math.MaxUint64 {
			return result{Status: StatusRejected, Err: ErrTokensExhausted}
		}
		m = s.ownSem(cmd.Key, m)
		s.last++
		slot := m.lowestFree()
		m.take(slot, permit{owner: intern(cmd.Owner), token: s.last, grantedAt: cmd.Now, leaseSec: cmd.LeaseSec,
			session: cmd.Session, seq: cmd.Seq})
		s.permitsHeld++
		if cmd.Label != "" {
			s.labels[s.last] = cmd.Label
		}
		return result{Status: StatusGranted, Token: s.last, N: slot}
	}
	if cmd.WaitMs == 0 {
		return result{Status: StatusBusy}
	}
	if m.queue.find(cmd.Ref) >= 0 {
		return result{Status: StatusRejected, Err: ErrDuplicateRef}
	}
	m = s.ownSem(cmd.Key, m)
	if m.queue == nil {
		m.queue = s.newQueue()
	}
	m.queue.push(Waiter{
		Owner: intern(cmd.Owner), Ref: cmd.Ref, LeaseSec: cmd.LeaseSec, WaitMs: cmd.WaitMs, EnqueuedAt: cmd.Now,
		Session: cmd.Session, Seq: cmd.Seq,
	})
	if cmd.Label != "" {
		s.waiterLabels[waiterRef{cmd.Key, cmd.Ref}] = cmd.Label
	}
	s.waiting++
	return result{Status: StatusQueued}
}

// grantPermits hands free permits of semaphore key (m, owned) to its
// queue's head waiters, in order, while fewer than n are held, each with
// a fresh token and the lowest free slot.
func (s *State) grantPermits(key string, m *semaphore, now int64, effects []Effect) []Effect {
	for m.queue.len() > 0 && m.numHeld() < int(m.permits) {
		if s.last == math.MaxUint64 {
			return s.exhaustedSem(key, m, effects)
		}
		w := *m.queue.head()
		m.queue.popHead()
		s.waiting--
		s.last++
		slot := m.lowestFree()
		m.take(slot, permit{owner: w.Owner, token: s.last, grantedAt: now, leaseSec: w.LeaseSec, session: w.Session, seq: w.Seq})
		s.permitsHeld++
		s.grantLabel(key, &w, s.last)
		eff := Effect{
			Kind: EffectGranted, Key: key, Owner: w.Owner, Ref: w.Ref, Token: s.last, LeaseSec: w.LeaseSec,
			Session: w.Session, Seq: w.Seq, Slot: slot,
		}
		if w.Session != 0 {
			eff.Serial = s.waiterGranted(&w, key, s.last, slot)
		}
		effects = append(effects, eff)
	}
	s.semDequeued(m)
	return effects
}

// semDequeued recycles the emptied queue of m (owned).
func (s *State) semDequeued(m *semaphore) {
	if m.queue != nil && m.queue.len() == 0 {
		s.recycleQueue(m.queue)
		m.queue = nil
	}
}

// exhaustedSem tells every waiter of semaphore key that it will never be
// granted: no token is left to grant with (only from a crafted snapshot).
func (s *State) exhaustedSem(key string, m *semaphore, effects []Effect) []Effect {
	m.queue.each(func(w *Waiter) {
		s.takeWaiterLabel(key, w)
		eff := Effect{Kind: EffectDropped, Key: key, Owner: w.Owner, Ref: w.Ref, Session: w.Session, Seq: w.Seq}
		if w.Session != 0 {
			eff.Serial = s.waiterTimedOut(w)
		}
		effects = append(effects, eff)
	})
	s.waiting -= m.queue.len()
	s.recycleQueue(m.queue)
	m.queue = nil
	return effects
}

// matchPermit returns the semaphore and slot of the permit cmd (a release
// or an extend) names exactly: the token, the owner and, for a permit
// granted under a session, that session; else ErrNotHeld, as matchHolder.
func (s *State) matchPermit(m *semaphore, cmd *Command) (uint32, error) {
	slot, ok := m.slotOf[cmd.Token]
	if !ok {
		return 0, ErrNotHeld
	}
	if p := m.held[slot]; p.owner != cmd.Owner || (p.session != 0 && p.session != cmd.Session) {
		return 0, ErrNotHeld
	}
	return slot, nil
}

// releasePermit ends the permit cmd names (matchPermit) and hands the
// freed permit to the queue's head.
func (s *State) releasePermit(m *semaphore, cmd *Command, effects []Effect) (result, []Effect) {
	slot, err := s.matchPermit(m, cmd)
	if err != nil {
		return result{Status: StatusRejected, Err: err}, effects
	}
	return result{Status: StatusReleased}, s.endPermit(cmd.Key, m, slot, cmd.Now, effects)
}

// expirePermit ends the permit under cmd.Token, owner unchecked as for a
// lock's expiry; a token no permit holds is a Noop.
func (s *State) expirePermit(m *semaphore, cmd *Command, effects []Effect) (result, []Effect) {
	slot, ok := m.slotOf[cmd.Token]
	if !ok {
		return result{Status: StatusNoop}, effects
	}
	return result{Status: StatusExpired}, s.endPermit(cmd.Key, m, slot, cmd.Now, effects)
}

// endPermit ends the permit in slot of semaphore key and grants the queue
// head in the same command if a permit is free now.
func (s *State) endPermit(key string, m *semaphore, slot uint32, now int64, effects []Effect) []Effect {
	m = s.ownSem(key, m)
	p := m.held[slot]
	if p.session != 0 {
		s.holdingEnded(p.session, p.token)
	}
	if len(s.renewed) > 0 {
		delete(s.renewed, p.token)
	}
	if len(s.labels) > 0 {
		delete(s.labels, p.token)
	}
	m.release(slot)
	s.permitsHeld--
	return s.grantPermits(key, m, now, effects)
}

// extendPermit renews the lease of the permit cmd names, as extend does
// for a lock.
func (s *State) extendPermit(m *semaphore, cmd *Command) result {
	slot, err := s.matchPermit(m, cmd)
	if err != nil {
		return result{Status: StatusRejected, Err: err}
	}
	m = s.ownSem(cmd.Key, m)
	p := m.held[slot]
	lease := cmd.LeaseSec
	if !s.extendMayShorten {
		lease = max(lease, p.leaseSec)
	}
	p.leaseSec = lease
	m.held[slot] = p
	s.renewed[p.token] = cmd.Now
	return result{Status: StatusExtended, N: lease}
}

// cancelPermitWait removes the waiter cmd.Ref from semaphore cmd.Key's
// queue. Nobody behind it can be granted by it: a waiting queue means no
// permit is free.
func (s *State) cancelPermitWait(m *semaphore, cmd *Command, effects []Effect) (result, []Effect) {
	i := m.queue.find(cmd.Ref)
	if i < 0 {
		return result{Status: StatusNoop}, effects
	}
	w := m.queue.ws[i]
	s.takeWaiterLabel(cmd.Key, &w)
	eff := Effect{Kind: EffectTimedOut, Key: cmd.Key, Owner: w.Owner, Ref: w.Ref, Session: w.Session, Seq: w.Seq}
	if w.Session != 0 {
		eff.Serial = s.waiterTimedOut(&w)
	}
	s.waiting--
	s.removePermitWaiter(cmd.Key, w.Ref)
	return result{Status: StatusCanceled}, append(effects, eff)
}

// removePermitWaiter takes the waiter ref out of semaphore key's queue
// without counting it out of waiting.
func (s *State) removePermitWaiter(key string, ref uint64) {
	m := s.ownSem(key, s.sems[key])
	if i := m.queue.find(ref); i >= 0 {
		m.queue.removeAt(i)
		s.semDequeued(m)
	}
}

// permitHolder is the Holder view of the permit in slot of m.
func (m *semaphore) permitHolder(slot uint32) Holder {
	p := m.held[slot]
	return Holder{Owner: p.owner, Token: p.token, LeaseSec: p.leaseSec, GrantedAt: p.grantedAt,
		Session: p.session, Seq: p.seq, Slot: slot, Permit: true}
}

// Occupied reports whether an acquire of key creates no key: it is held,
// reserved for a block, or a semaphore (whose permits live in its one
// definition).
func (s *State) Occupied(key string) bool {
	if e := s.keys[key]; e != nil {
		return true // held, or reserved
	}
	return s.isSemaphore(key)
}

// HeldUnder reports whether key is held under token: by its lock holder,
// or, for a semaphore, by one of its permits.
func (s *State) HeldUnder(key string, token uint64) bool {
	if m := s.sems[key]; m != nil {
		_, ok := m.slotOf[token]
		return ok
	}
	h, ok := s.Holder(key)
	return ok && h.Token == token
}

// Semaphore describes a semaphore key (Semaphore).
type Semaphore struct {
	// Permits is n; Held the permits held now (more than n after a
	// lowering, until they end); Waiting the length of its queue.
	Permits       uint32
	Held, Waiting int
}

// Semaphore describes key if it is defined as a semaphore.
func (s *State) Semaphore(key string) (Semaphore, bool) {
	m := s.sems[key]
	if m == nil {
		return Semaphore{}, false
	}
	return Semaphore{Permits: m.permits, Held: m.numHeld(), Waiting: m.queue.len()}, true
}

// PermitHolders lists the held permits of semaphore key in slot order,
// each with its renewal time and label (nil if none or not a semaphore).
func (s *State) PermitHolders(key string) []Holder {
	m := s.sems[key]
	if m == nil || m.numHeld() == 0 {
		return nil
	}
	out := make([]Holder, 0, m.numHeld())
	for _, slot := range m.heldSlots() {
		out = append(out, s.decorate(m.permitHolder(slot)))
	}
	return out
}

// decorate adds a holding's renewal time and label.
func (s *State) decorate(h Holder) Holder {
	if len(s.renewed) > 0 {
		h.RenewedAt = s.renewed[h.Token]
	}
	if len(s.labels) > 0 {
		h.Label = s.labels[h.Token]
	}
	return h
}

// Semaphores lists the semaphore keys in ascending order.
func (s *State) Semaphores() []string {
	if len(s.sems) == 0 {
		return nil
	}
	keys := make([]string, 0, len(s.sems))
	for k := range s.sems {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// NumSemaphores is the number of semaphore keys; NumPermitsHeld the
// permits held over all of them.
func (s *State) NumSemaphores() int { return len(s.sems) }

// NumPermitsHeld is the number of permits held over all semaphores.
func (s *State) NumPermitsHeld() int { return s.permitsHeld }

// hasSlotOutcomes reports whether a session keeps the outcome of a permit
// grant in a slot other than 0: only snapshot version 6 carries slots
// (a semaphore may be removed while such an outcome waits for its ack).
// O(kept outcomes).
func (s *State) hasSlotOutcomes() bool {
	for _, ss := range s.sessions {
		for i := range ss.outcomes {
			if ss.outcomes[i].Slot != 0 {
				return true
			}
		}
	}
	return false
}
