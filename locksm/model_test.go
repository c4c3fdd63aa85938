package locksm

// A property test in the style of etcd-io/raft's quorum/quick_test.go: random
// command sequences run against the real State and against a deliberately
// naive model (flat lists, linear scans, no indexes, no recycling), and the
// two must agree after every step. On top of agreement, the test checks the
// safety properties directly, from the stream of results and effects alone,
// so a bug shared by State and model still has to get past them: one holder
// per key, a block granted all at once under one token (never a part of
// it), tokens strictly increasing, FIFO on every key, every queue in
// arrival order, which is what rules out a cycle of waiters, and an extend
// that succeeds only on the current holding and owes nothing. For
// sessions: serials 1, 2, 3, … per session with nothing skipped, no void
// seq ever applied, no waiter of an ended session ever granted, and a new
// leader's drop-sessionless keeping every session waiter in its place (FIFO
// across leader changes). For revokes: only the holding under the named
// token ends, its holder is told first, and whoever is granted after it
// holds a larger token.

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// model is the obvious implementation of the semantics in MATRIX.md.
type model struct {
	last  uint64
	clock int64
	holds []modelHold // at most one per key; a block's keys each have one
	waits []modelWait // every waiter of every key, in enqueue order; a block is one
	// sessions are the live sessions, in open order; waiters and holdings
	// carry their (session, seq) in w and h.
	sessions []*modelSession
	// sems maps every semaphore key to its n; its permits are holds with
	// h.Permit set (any number per key), its waiters waits like a lock's.
	sems map[string]uint32
	// revokes are the audit records, oldest first; a key's newer revoke
	// removes its older record.
	revokes []Revoke
	// sessRevoked are the notes of revokes of sessions' holdings, oldest
	// first.
	sessRevoked []SessionRevoke
}

// modelSession keeps every outcome above its ack, in the order recorded.
type modelSession struct {
	id, floor, serial, ack, epoch uint64
	hash                          string
	timeout                       uint32
	openedAt                      int64
	outcomes                      []Outcome
}

func (m *model) session(id uint64) *modelSession {
	for _, ms := range m.sessions {
		if ms.id == id {
			return ms
		}
	}
	return nil
}

func (ms *modelSession) record(o Outcome) uint64 {
	ms.serial++
	o.Serial = ms.serial
	ms.outcomes = append(ms.outcomes, o)
	return ms.serial
}

func (ms *modelSession) trim(ack uint64) {
	if ack > ms.serial {
		ack = ms.serial
	}
	if ack > ms.ack {
		ms.ack = ack
	}
	ms.outcomes = slices.DeleteFunc(ms.outcomes, func(o Outcome) bool { return o.Serial <= ms.ack })
}

// used reports whether seq has a kept outcome or a queued waiter.
func (m *model) used(ms *modelSession, seq uint64) bool {
	for _, o := range ms.outcomes {
		if o.Seq == seq {
			return true
		}
	}
	for _, w := range m.waits {
		if w.w.Session == ms.id && w.w.Seq == seq {
			return true
		}
	}
	return false
}

// recordWaiter records an outcome for session waiter w (0 if none).
func (m *model) recordWaiter(w Waiter, status Status, token uint64) uint64 {
	return m.recordWaiterSlot(w, status, token, 0)
}

// recordWaiterSlot is recordWaiter for a permit's grant in slot.
func (m *model) recordWaiterSlot(w Waiter, status Status, token uint64, slot uint32) uint64 {
	if w.Session == 0 {
		return 0
	}
	return m.session(w.Session).record(Outcome{Seq: w.Seq, Status: status, Token: token, Slot: slot})
}

type modelHold struct {
	key string
	h   Holder // h.Keys: the block's keys; h.RenewedAt: its latest extend
	// renewed: the holding was extended (RenewedAt may be 0 all the same).
	renewed bool
}

// modelWait is a waiter: keys is the one key of a single-key waiter, or a
// block's keys (then w.Keys is the same list).
type modelWait struct {
	keys  []string
	w     Waiter
	label string
}

func modelValid(s string, limit int) bool {
	if s == "" || len(s) > limit {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// modelReason: at most 128 bytes of 0x20..0x7E, no space at either end.
func modelReason(r string) bool {
	if len(r) > 128 || strings.HasPrefix(r, " ") || strings.HasSuffix(r, " ") {
		return false
	}
	for _, c := range []byte(r) {
		if c < ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

func (m *model) holdIndex(key string) int {
	for i, h := range m.holds {
		if h.key == key && !h.h.Permit {
			return i
		}
	}
	return -1
}

// permitIndex is the index of the permit of semaphore key under token
// (-1: none).
func (m *model) permitIndex(key string, token uint64) int {
	for i, h := range m.holds {
		if h.key == key && h.h.Permit && h.h.Token == token {
			return i
		}
	}
	return -1
}

// permits lists the permits of semaphore key, in slot order.
func (m *model) permits(key string) []Holder {
	var out []Holder
	for _, h := range m.holds {
		if h.key == key && h.h.Permit {
			out = append(out, h.h)
		}
	}
	slices.SortFunc(out, func(a, b Holder) int { return cmp.Compare(a.Slot, b.Slot) })
	return out
}

func (m *model) isSem(key string) bool { _, ok := m.sems[key]; return ok }

// semGrant hands free permits of semaphore key to its first waiters, in
// order, while fewer than n are held, each in the lowest slot nobody
// holds.
func (m *model) semGrant(key string, now int64) []Effect {
	var effects []Effect
	for {
		held := m.permits(key)
		head := -1
		for i, w := range m.waits {
			if w.keys[0] == key {
				head = i
				break
			}
		}
		if head < 0 || len(held) >= int(m.sems[key]) {
			return effects
		}
		w := m.waits[head]
		m.waits = slices.Delete(m.waits, head, head+1)
		m.last++
		slot := m.lowestFreeSlot(key)
		m.holds = append(m.holds, modelHold{key: key, h: Holder{Owner: w.w.Owner, Token: m.last, LeaseSec: w.w.LeaseSec, GrantedAt: now,
			Session: w.w.Session, Seq: w.w.Seq, Label: w.label, Permit: true, Slot: slot}})
		effects = append(effects, Effect{Kind: EffectGranted, Key: key, Owner: w.w.Owner, Ref: w.w.Ref, Token: m.last, LeaseSec: w.w.LeaseSec,
			Session: w.w.Session, Seq: w.w.Seq, Serial: m.recordWaiterSlot(w.w, StatusGranted, m.last, slot), Slot: slot})
	}
}

// lowestFreeSlot is the lowest slot no permit of key holds.
func (m *model) lowestFreeSlot(key string) uint32 {
	for slot := uint32(0); ; slot++ {
		if !slices.ContainsFunc(m.permits(key), func(h Holder) bool { return h.Slot == slot }) {
			return slot
		}
	}
}

func (m *model) held(key string) bool { return m.holdIndex(key) >= 0 }

// matches reports whether release or extend c names holding i (-1: none)
// exactly: its token, its owner and, if it was granted under a session
// that still lives, that session. Anything else is one answer, not held.
func (m *model) matches(i int, c Command) bool {
	if i < 0 {
		return false
	}
	h := m.holds[i].h
	return h.Token == c.Token && h.Owner == c.Owner && (h.Session == 0 || h.Session == c.Session)
}

func (m *model) apply(c Command) (Result, []Effect) {
	res, eff := m.apply1(c)
	switch res.Status {
	case StatusGranted, StatusQueued, StatusReleased, StatusExpired, StatusExtended, StatusSessionExpired, StatusSessionClosed,
		StatusPermitsSet, StatusRevoked:
		m.clock = c.Now
	}
	return res, eff
}

func isLockOp(op Op) bool {
	return op == OpAcquire || op == OpAcquireBlock || op == OpRelease || op == OpExtend || op == OpAcquirePermit
}

func (m *model) apply1(c Command) (Result, []Effect) {
	reject := func(err error) (Result, []Effect) { return Result{Status: StatusRejected, Err: err}, nil }
	switch c.Op {
	case OpAcquire, OpRelease, OpExpire, OpCancelWait, OpExtend, OpAcquirePermit:
		if !modelValid(c.Key, 255) {
			return reject(ErrInvalidKey)
		}
	case OpSetPermits:
		if !modelValid(c.Key, 255) {
			return reject(ErrInvalidKey)
		}
		if c.Permits > 100000 {
			return reject(ErrInvalidPermits)
		}
	case OpAcquireBlock:
		if len(c.Keys) < 2 || len(c.Keys) > 16 {
			return reject(ErrInvalidBlock)
		}
		for _, k := range c.Keys {
			if !modelValid(k, 255) {
				return reject(ErrInvalidKey)
			}
		}
		for i, k := range c.Keys {
			for _, o := range c.Keys[:i] {
				if o == k {
					return reject(ErrInvalidBlock)
				}
			}
		}
	case OpDropWaiters, OpDropSessionless:
	case OpRevoke:
		if !modelValid(c.Key, 255) {
			return reject(ErrInvalidKey)
		}
		if !modelValid(c.Owner, 128) {
			return reject(ErrInvalidOwner)
		}
		if !modelReason(c.Reason) {
			return reject(ErrInvalidReason)
		}
	case OpOpenSession:
		if c.Session == 0 || len(c.SecretHash) != 32 || c.TimeoutMs < 2000 || c.TimeoutMs > 300000 {
			return reject(ErrInvalidSession)
		}
	case OpResumeSession, OpExpireSession, OpCloseSession, OpAckSession:
		if c.Session == 0 {
			return reject(ErrInvalidSession)
		}
	default:
		return reject(ErrInvalidCommand)
	}
	acquire := c.Op == OpAcquire || c.Op == OpAcquireBlock || c.Op == OpAcquirePermit
	if (acquire || c.Op == OpRelease || c.Op == OpExtend) && !modelValid(c.Owner, 128) {
		return reject(ErrInvalidOwner)
	}
	if acquire && c.Label != "" && !modelValid(c.Label, 64) {
		return reject(ErrInvalidLabel)
	}
	if (acquire || c.Op == OpExtend) && (c.LeaseSec < 1 || c.LeaseSec > 250) {
		return reject(ErrInvalidLease)
	}
	if acquire {
		if c.WaitMs > 3600000 { // one hour (protocol version 11)
			return reject(ErrInvalidWait)
		}
	}
	if c.Session != 0 && isLockOp(c.Op) {
		ms := m.session(c.Session)
		switch {
		case ms == nil:
			return reject(ErrNoSession)
		case c.Seq <= ms.floor:
			return reject(ErrVoided)
		case m.used(ms, c.Seq):
			return reject(ErrDuplicateSeq)
		}
		ms.trim(c.Ack)
		res, eff := m.lock(c)
		if res.Status != StatusQueued {
			res.Serial = ms.record(Outcome{Seq: c.Seq, Status: res.Status, Token: res.Token, Err: res.Err, Slot: res.Slot})
		}
		return res, eff
	}
	return m.lock(c)
}

// lock applies a valid command, of a session or not (its own outcome is
// recorded by the caller).
func (m *model) lock(c Command) (Result, []Effect) {
	reject := func(err error) (Result, []Effect) { return Result{Status: StatusRejected, Err: err}, nil }
	switch c.Op {
	case OpSetPermits:
		n, defined := m.sems[c.Key]
		switch {
		case !defined && c.Permits == 0:
			return reject(ErrNotSemaphore)
		case !defined && (m.held(c.Key) || len(m.queue(c.Key)) > 0):
			return reject(ErrInUse)
		case c.Permits == 0 && (len(m.permits(c.Key)) > 0 || len(m.queue(c.Key)) > 0):
			return reject(ErrInUse)
		case c.Permits == 0:
			delete(m.sems, c.Key)
			return Result{Status: StatusPermitsSet}, nil
		}
		_ = n
		if m.sems == nil {
			m.sems = map[string]uint32{}
		}
		m.sems[c.Key] = c.Permits
		return Result{Status: StatusPermitsSet}, m.semGrant(c.Key, c.Now)
	case OpAcquirePermit:
		n, ok := m.sems[c.Key]
		if !ok {
			return reject(ErrNotSemaphore)
		}
		if len(m.queue(c.Key)) == 0 && len(m.permits(c.Key)) < int(n) {
			m.last++
			slot := m.lowestFreeSlot(c.Key)
			m.holds = append(m.holds, modelHold{key: c.Key, h: Holder{Owner: c.Owner, Token: m.last, LeaseSec: c.LeaseSec, GrantedAt: c.Now,
				Session: c.Session, Seq: c.Seq, Label: c.Label, Permit: true, Slot: slot}})
			return Result{Status: StatusGranted, Token: m.last, Slot: slot}, nil
		}
		if c.WaitMs == 0 {
			return Result{Status: StatusBusy}, nil
		}
		for _, w := range m.queue(c.Key) {
			if w.Ref == c.Ref {
				return reject(ErrDuplicateRef)
			}
		}
		m.waits = append(m.waits, modelWait{[]string{c.Key}, Waiter{Owner: c.Owner, Ref: c.Ref, LeaseSec: c.LeaseSec, WaitMs: c.WaitMs, EnqueuedAt: c.Now,
			Session: c.Session, Seq: c.Seq}, c.Label})
		return Result{Status: StatusQueued}, nil
	case OpAcquire:
		if m.isSem(c.Key) {
			return reject(ErrIsSemaphore)
		}
		if !m.held(c.Key) && len(m.queue(c.Key)) == 0 {
			m.last++
			m.holds = append(m.holds, modelHold{key: c.Key, h: Holder{Owner: c.Owner, Token: m.last, LeaseSec: c.LeaseSec, GrantedAt: c.Now,
				Session: c.Session, Seq: c.Seq, Label: c.Label}})
			return Result{Status: StatusGranted, Token: m.last}, nil
		}
		if c.WaitMs == 0 {
			return Result{Status: StatusBusy}, nil
		}
		for _, w := range m.queue(c.Key) {
			if w.Ref == c.Ref {
				return reject(ErrDuplicateRef)
			}
		}
		m.waits = append(m.waits, modelWait{[]string{c.Key}, Waiter{Owner: c.Owner, Ref: c.Ref, LeaseSec: c.LeaseSec, WaitMs: c.WaitMs, EnqueuedAt: c.Now,
			Session: c.Session, Seq: c.Seq}, c.Label})
		return Result{Status: StatusQueued}, nil
	case OpAcquireBlock:
		if slices.ContainsFunc(c.Keys, m.isSem) {
			return reject(ErrIsSemaphore)
		}
		free := true
		for _, k := range c.Keys {
			free = free && !m.held(k) && len(m.queue(k)) == 0
		}
		if free {
			m.last++
			for _, k := range c.Keys {
				m.holds = append(m.holds, modelHold{key: k, h: Holder{Owner: c.Owner, Token: m.last, LeaseSec: c.LeaseSec, GrantedAt: c.Now, Keys: c.Keys,
					Session: c.Session, Seq: c.Seq, Label: c.Label}})
			}
			return Result{Status: StatusGranted, Token: m.last}, nil
		}
		if c.WaitMs == 0 {
			return Result{Status: StatusBusy}, nil
		}
		for _, w := range m.waits {
			if w.w.Ref == c.Ref && (w.w.Keys != nil || slices.Contains(c.Keys, w.keys[0])) {
				return reject(ErrDuplicateRef)
			}
		}
		m.waits = append(m.waits, modelWait{c.Keys, Waiter{Owner: c.Owner, Ref: c.Ref, LeaseSec: c.LeaseSec, WaitMs: c.WaitMs, EnqueuedAt: c.Now, Keys: c.Keys,
			Session: c.Session, Seq: c.Seq}, c.Label})
		return Result{Status: StatusQueued}, nil
	case OpRelease:
		i := m.holdIndex(c.Key)
		if m.isSem(c.Key) {
			i = m.permitIndex(c.Key, c.Token)
		}
		if !m.matches(i, c) {
			return reject(ErrNotHeld)
		}
		return Result{Status: StatusReleased}, m.free(i, c.Now)
	case OpExtend:
		i := m.holdIndex(c.Key)
		if m.isSem(c.Key) {
			i = m.permitIndex(c.Key, c.Token)
		}
		if !m.matches(i, c) {
			return reject(ErrNotHeld)
		}
		// From protocol version 10 an extend never lowers a holding's
		// lease: it renews the longer of the two from its now.
		lease := max(c.LeaseSec, m.holds[i].h.LeaseSec)
		// Every key held under the token: the key, or its whole block.
		for j := range m.holds {
			if h := &m.holds[j]; h.h.Token == c.Token {
				h.h.LeaseSec, h.h.RenewedAt, h.renewed = lease, c.Now, true
			}
		}
		return Result{Status: StatusExtended, LeaseSec: lease}, nil
	case OpExpire:
		i := m.holdIndex(c.Key)
		if m.isSem(c.Key) {
			i = m.permitIndex(c.Key, c.Token)
		}
		if i < 0 || m.holds[i].h.Token != c.Token {
			return Result{Status: StatusNoop}, nil
		}
		return Result{Status: StatusExpired}, m.free(i, c.Now)
	case OpRevoke:
		i := m.holdIndex(c.Key)
		if m.isSem(c.Key) {
			i = m.permitIndex(c.Key, c.Token)
			if i < 0 && len(m.permits(c.Key)) > 0 {
				return reject(ErrTokenMismatch)
			}
		}
		switch {
		case i < 0:
			return reject(ErrNotHeld)
		case m.holds[i].h.Token != c.Token:
			return reject(ErrTokenMismatch)
		}
		h := m.holds[i].h
		if ms := m.session(h.Session); h.Session != 0 && ms != nil {
			pending := 0
			for _, r := range m.sessRevoked {
				if r.Session == ms.id && r.AfterSerial >= ms.ack {
					pending++
				}
			}
			if pending >= MaxSessionRevokes {
				return reject(ErrRevokesPending)
			}
		}
		keys := []string{c.Key}
		if h.Keys != nil {
			keys = h.Keys
		}
		m.revokes = slices.DeleteFunc(m.revokes, func(r Revoke) bool { return slices.Contains(keys, r.Key) })
		for _, k := range keys {
			m.revokes = append(m.revokes, Revoke{Key: k, Keys: h.Keys, Token: h.Token, Who: c.Owner, Reason: c.Reason, At: c.Now,
				Owner: h.Owner, Label: h.Label, Permit: h.Permit, Slot: h.Slot, Session: h.Session})
		}
		if n := len(m.revokes) - MaxRevokeRecords; n > 0 {
			m.revokes = m.revokes[n:]
		}
		if ms := m.session(h.Session); h.Session != 0 && ms != nil {
			// Kept until the broker acks past it (filtered in check) or
			// the session ends.
			m.sessRevoked = append(m.sessRevoked, SessionRevoke{Session: h.Session, Token: h.Token, Key: keys[0], Who: c.Owner,
				Reason: c.Reason, AfterSerial: ms.serial})
		}
		eff := []Effect{{Kind: EffectRevoked, Key: keys[0], Keys: h.Keys, Owner: h.Owner, Token: h.Token, Slot: h.Slot,
			Session: h.Session, Seq: h.Seq}}
		return Result{Status: StatusRevoked, Token: h.Token, Slot: h.Slot}, append(eff, m.free(i, c.Now)...)
	case OpCancelWait:
		for i, w := range m.waits {
			if slices.Contains(w.keys, c.Key) && w.w.Ref == c.Ref {
				m.waits = slices.Delete(m.waits, i, i+1)
				eff := []Effect{{Kind: EffectTimedOut, Key: w.keys[0], Keys: w.w.Keys, Owner: w.w.Owner, Ref: w.w.Ref,
					Session: w.w.Session, Seq: w.w.Seq, Serial: m.recordWaiter(w.w, StatusTimedOut, 0)}}
				// Every key the waiter left is decided again (a single-key
				// waiter's never changes: it cannot head an unheld key).
				return Result{Status: StatusCanceled}, append(eff, m.promote(w.keys, m.clock)...)
			}
		}
		return Result{Status: StatusNoop}, nil
	case OpOpenSession:
		if m.session(c.Session) != nil {
			return reject(ErrSessionExists)
		}
		m.sessions = append(m.sessions, &modelSession{id: c.Session, hash: c.SecretHash, timeout: c.TimeoutMs, openedAt: c.Now})
		return Result{Status: StatusOpened}, nil
	case OpResumeSession:
		ms := m.session(c.Session)
		switch {
		case ms == nil:
			return reject(ErrNoSession)
		case c.Epoch != ms.epoch:
			return reject(ErrStaleEpoch)
		}
		ms.epoch++
		ms.floor = max(ms.floor, c.Seq)
		ms.trim(c.Ack)
		return Result{Status: StatusResumed}, nil
	case OpAckSession:
		ms := m.session(c.Session)
		if ms == nil {
			return Result{Status: StatusNoop}, nil
		}
		ms.trim(c.Ack)
		return Result{Status: StatusAcked}, nil
	case OpExpireSession, OpCloseSession:
		ms := m.session(c.Session)
		if ms == nil || (c.Op == OpExpireSession && c.Epoch != ms.epoch) {
			return Result{Status: StatusNoop}, nil
		}
		var mine []modelWait
		for _, w := range m.waits {
			if w.w.Session == ms.id {
				mine = append(mine, w)
			}
		}
		slices.SortFunc(mine, func(a, b modelWait) int { return cmp.Compare(a.w.Seq, b.w.Seq) })
		var eff []Effect
		var decide []string
		for _, w := range mine {
			eff = append(eff, Effect{Kind: EffectTimedOut, Key: w.keys[0], Keys: w.w.Keys, Owner: w.w.Owner, Ref: w.w.Ref, Session: ms.id, Seq: w.w.Seq})
			if w.w.Keys != nil {
				decide = append(decide, w.keys...)
			}
		}
		m.waits = slices.DeleteFunc(m.waits, func(w modelWait) bool { return w.w.Session == ms.id })
		eff = append(eff, m.promote(decide, c.Now)...)
		tokens := c.Tokens
		if c.Op == OpCloseSession {
			// A clean stop releases every holding of the session.
			tokens = nil
			for _, h := range m.holds {
				if h.h.Session == ms.id {
					tokens = append(tokens, h.h.Token)
				}
			}
			slices.Sort(tokens)
			tokens = slices.Compact(tokens) // a block is held once per key
		}
		for _, t := range tokens {
			for i, h := range m.holds {
				if h.h.Token == t && h.h.Session == ms.id {
					eff = append(eff, m.free(i, c.Now)...)
					break
				}
			}
		}
		for i := range m.holds {
			if h := &m.holds[i].h; h.Session == ms.id {
				h.Session, h.Seq = 0, 0
			}
		}
		m.sessions = slices.DeleteFunc(m.sessions, func(o *modelSession) bool { return o == ms })
		m.sessRevoked = slices.DeleteFunc(m.sessRevoked, func(r SessionRevoke) bool { return r.Session == ms.id })
		if c.Op == OpCloseSession {
			return Result{Status: StatusSessionClosed}, eff
		}
		return Result{Status: StatusSessionExpired}, eff
	default: // OpDropWaiters, OpDropSessionless
		keep := c.Op == OpDropSessionless // session waiters stay
		var keys []string
		for _, w := range m.waits {
			for _, k := range w.keys {
				if !slices.Contains(keys, k) {
					keys = append(keys, k)
				}
			}
		}
		slices.Sort(keys)
		var effects []Effect
		told := map[uint64]bool{}
		for _, k := range keys {
			for _, w := range m.waits {
				if !slices.Contains(w.keys, k) || (w.w.Keys != nil && told[w.w.Ref]) || (keep && w.w.Session != 0) {
					continue
				}
				if w.w.Keys != nil {
					told[w.w.Ref] = true
				}
				effects = append(effects, Effect{Kind: EffectDropped, Key: w.keys[0], Keys: w.w.Keys, Owner: w.w.Owner, Ref: w.w.Ref,
					Session: w.w.Session, Seq: w.w.Seq, Serial: m.recordWaiter(w.w, StatusTimedOut, 0)})
			}
		}
		if !keep {
			m.waits = nil
			return Result{Status: StatusDropped}, effects
		}
		m.waits = slices.DeleteFunc(m.waits, func(w modelWait) bool { return w.w.Session == 0 })
		return Result{Status: StatusDropped}, append(effects, m.promote(keys, m.clock)...)
	}
}

// free ends the holding of m.holds[i] (the key, or its whole block) and
// decides each freed key again, in the block's order.
func (m *model) free(i int, now int64) []Effect {
	if h := m.holds[i]; h.h.Permit {
		m.holds = slices.Delete(m.holds, i, i+1)
		return m.semGrant(h.key, now)
	}
	keys := []string{m.holds[i].key}
	if ks := m.holds[i].h.Keys; ks != nil {
		keys = ks
	}
	m.holds = slices.DeleteFunc(m.holds, func(h modelHold) bool { return slices.Contains(keys, h.key) })
	return m.promote(keys, now)
}

// promote looks at each of keys in turn: an unheld key with waiters goes to
// its first waiter if that one is a single-key waiter, or a block that is
// first in the queue of every one of its keys, none of them held.
func (m *model) promote(keys []string, now int64) []Effect {
	var effects []Effect
	for _, k := range keys {
		if m.held(k) || m.isSem(k) { // a permit waiter leaving frees no permit
			continue
		}
		head := -1
		for i, w := range m.waits {
			if slices.Contains(w.keys, k) {
				head = i
				break
			}
		}
		if head < 0 {
			continue
		}
		w := m.waits[head]
		for _, bk := range w.keys {
			if m.held(bk) || m.queue(bk)[0].Ref != w.w.Ref {
				w.keys = nil
				break
			}
		}
		if w.keys == nil {
			continue // a block that still waits: k stays reserved
		}
		m.waits = slices.Delete(m.waits, head, head+1)
		m.last++
		for _, bk := range w.keys {
			m.holds = append(m.holds, modelHold{key: bk, h: Holder{Owner: w.w.Owner, Token: m.last, LeaseSec: w.w.LeaseSec, GrantedAt: now, Keys: w.w.Keys,
				Session: w.w.Session, Seq: w.w.Seq, Label: w.label}})
		}
		effects = append(effects, Effect{Kind: EffectGranted, Key: w.keys[0], Keys: w.w.Keys, Owner: w.w.Owner, Ref: w.w.Ref, Token: m.last, LeaseSec: w.w.LeaseSec,
			Session: w.w.Session, Seq: w.w.Seq, Serial: m.recordWaiter(w.w, StatusGranted, m.last)})
	}
	return effects
}

func (m *model) queue(key string) []Waiter {
	var q []Waiter
	for _, w := range m.waits {
		if slices.Contains(w.keys, key) {
			q = append(q, w.w)
		}
	}
	return q
}

// compare checks that s answers every query as m does.
func (m *model) compare(s *State, keys []string) error {
	blocks, renewed := map[uint64]bool{}, map[uint64]bool{}
	locks, permits := 0, 0
	for _, h := range m.holds {
		if h.h.Permit {
			permits++
		} else {
			locks++
		}
		if h.h.Keys != nil {
			blocks[h.h.Token] = true
		}
		if h.renewed {
			renewed[h.h.Token] = true
		}
	}
	if s.LastToken() != m.last || s.NumHeld() != locks || s.NumWaiting() != len(m.waits) || s.NumBlocks() != len(blocks) ||
		s.NumRenewed() != len(renewed) || s.NumPermitsHeld() != permits || s.NumSemaphores() != len(m.sems) {
		return fmt.Errorf("counts: state last=%d held=%d waiting=%d blocks=%d renewed=%d permits=%d sems=%d, model %d %d %d %d %d %d %d",
			s.LastToken(), s.NumHeld(), s.NumWaiting(), s.NumBlocks(), s.NumRenewed(), s.NumPermitsHeld(), s.NumSemaphores(),
			m.last, locks, len(m.waits), len(blocks), len(renewed), permits, len(m.sems))
	}
	for _, k := range slices.Sorted(maps.Keys(m.sems)) {
		want := Semaphore{Permits: m.sems[k], Held: len(m.permits(k)), Waiting: len(m.queue(k))}
		if got, ok := s.Semaphore(k); !ok || got != want {
			return fmt.Errorf("semaphore %q: %+v %v, model %+v", k, got, ok, want)
		}
		if got, want := s.PermitHolders(k), m.permits(k); !reflect.DeepEqual(got, want) {
			return fmt.Errorf("semaphore %q: permits %+v, model %+v", k, got, want)
		}
		if g, w := s.Waiters(k), m.queue(k); !reflect.DeepEqual(g, w) {
			return fmt.Errorf("semaphore %q: waiters %+v, model %+v", k, g, w)
		}
		for i, w := range m.queue(k) {
			if pos, ok := s.Position(k, w.Ref); !ok || pos != i+1 {
				return fmt.Errorf("semaphore %q: waiter %d at %d %v, model %d", k, w.Ref, pos, ok, i+1)
			}
		}
	}
	if got := s.Revokes(); !reflect.DeepEqual(got, m.revokes) || s.NumRevokes() != len(m.revokes) {
		return fmt.Errorf("revokes %+v, model %+v", got, m.revokes)
	}
	wantN := 0
	for _, ms := range m.sessions {
		var want []SessionRevoke
		for _, r := range m.sessRevoked {
			if r.Session == ms.id && r.AfterSerial >= ms.ack {
				want = append(want, r)
			}
		}
		if got := s.SessionRevokes(ms.id); !reflect.DeepEqual(got, want) {
			return fmt.Errorf("session %d's revoke notes %+v, model %+v", ms.id, got, want)
		}
		wantN += len(want)
	}
	if s.NumSessionRevokes() != wantN {
		return fmt.Errorf("%d session revoke notes, model %d", s.NumSessionRevokes(), wantN)
	}
	for _, k := range append(slices.Clone(keys), genSems...) {
		want, wok := Revoke{}, false
		for _, r := range m.revokes {
			if r.Key == k {
				want, wok = r, true
			}
		}
		if got, ok := s.LastRevoke(k); ok != wok || !reflect.DeepEqual(got, want) {
			return fmt.Errorf("last revoke of %q: %+v %v, model %+v", k, got, ok, want)
		}
	}
	if got := s.Semaphores(); !slices.Equal(got, slices.Sorted(maps.Keys(m.sems))) {
		return fmt.Errorf("semaphores %q, model %v", got, m.sems)
	}
	for _, k := range keys {
		if m.isSem(k) {
			if _, ok := s.Holder(k); ok {
				return fmt.Errorf("semaphore %q has a lock holder", k)
			}
			continue
		}
		var want *Holder
		if i := m.holdIndex(k); i >= 0 {
			want = &m.holds[i].h
		}
		got, ok := s.Holder(k)
		if ok != (want != nil) || (ok && !reflect.DeepEqual(got, *want)) {
			return fmt.Errorf("key %q: holder %v %+v, model %+v", k, ok, got, want)
		}
		if g, w := s.Waiters(k), m.queue(k); !reflect.DeepEqual(g, w) {
			return fmt.Errorf("key %q: waiters %+v, model %+v", k, g, w)
		}
		for _, w := range m.waits {
			if slices.Contains(w.keys, k) {
				if l := s.WaiterLabel(k, w.w); l != w.label {
					return fmt.Errorf("key %q: waiter %d label %q, model %q", k, w.w.Ref, l, w.label)
				}
			}
		}
		if r := s.Reserved(k); r != (want == nil && len(m.queue(k)) > 0) {
			return fmt.Errorf("key %q: reserved %v, model holder %+v queue %d", k, r, want, len(m.queue(k)))
		}
	}
	return m.compareSessions(s)
}

// compareSessions checks that s answers every session query as m does.
func (m *model) compareSessions(s *State) error {
	var ids []uint64
	for _, ms := range m.sessions {
		ids = append(ids, ms.id)
	}
	slices.Sort(ids)
	if got := s.Sessions(); !slices.Equal(got, ids) || s.NumSessions() != len(ids) {
		return fmt.Errorf("sessions %v, model %v", got, ids)
	}
	for _, ms := range m.sessions {
		want := SessionInfo{ID: ms.id, SecretHash: ms.hash, TimeoutMs: ms.timeout, Floor: ms.floor, Serial: ms.serial, Ack: ms.ack,
			Epoch: ms.epoch, OpenedAt: ms.openedAt, Outcomes: len(ms.outcomes)}
		tokens := map[uint64]bool{}
		for _, h := range m.holds {
			if h.h.Session == ms.id {
				tokens[h.h.Token] = true
			}
		}
		want.Holdings = len(tokens)
		for _, w := range m.waits {
			if w.w.Session == ms.id {
				want.Waiters++
				sw, ok := s.SessionWaiter(ms.id, w.w.Seq)
				if !ok || !reflect.DeepEqual(sw, SessionWaiter{Key: w.keys[0], Keys: w.w.Keys, Ref: w.w.Ref}) {
					return fmt.Errorf("session %d waiter seq %d: %+v %v, model %+v", ms.id, w.w.Seq, sw, ok, w)
				}
			}
		}
		var queued []SessionQueued
		for _, w := range m.waits {
			if w.w.Session == ms.id {
				queued = append(queued, SessionQueued{Key: w.keys[0], Waiter: w.w, Label: w.label, Permit: m.isSem(w.keys[0])})
			}
		}
		slices.SortFunc(queued, func(a, b SessionQueued) int { return cmp.Compare(a.Waiter.Seq, b.Waiter.Seq) })
		if got := s.SessionWaiters(ms.id); !reflect.DeepEqual(got, queued) {
			return fmt.Errorf("session %d waiters %+v, model %+v", ms.id, got, queued)
		}
		if got, ok := s.Session(ms.id); !ok || got != want {
			return fmt.Errorf("session %d: %+v, model %+v", ms.id, got, want)
		}
		if got := s.SessionOutcomes(ms.id); !slices.Equal(got, ms.outcomes) {
			return fmt.Errorf("session %d outcomes %+v, model %+v", ms.id, got, ms.outcomes)
		}
		for _, o := range ms.outcomes {
			if got, ok := s.SessionOutcome(ms.id, o.Seq); !ok || got != o {
				return fmt.Errorf("session %d outcome of seq %d: %+v %v, model %+v", ms.id, o.Seq, got, ok, o)
			}
		}
		// A seq neither kept nor queued has no outcome and no waiter.
		for _, seq := range []uint64{0, ms.floor, ms.floor + 1, ms.serial + 1000} {
			if m.used(ms, seq) {
				continue
			}
			if _, ok := s.SessionOutcome(ms.id, seq); ok {
				return fmt.Errorf("session %d: outcome for unused seq %d", ms.id, seq)
			}
			if _, ok := s.SessionWaiter(ms.id, seq); ok {
				return fmt.Errorf("session %d: waiter for unused seq %d", ms.id, seq)
			}
		}
	}
	return nil
}

// propertyChecker verifies the safety properties from results and effects
// alone: one holder per key, grants all-or-nothing under one token, tokens
// strictly increasing, FIFO per key, nobody granted after leaving, and
// every queue in arrival order (so waiters cannot wait for each other in a
// cycle).
type propertyChecker struct {
	lastToken uint64
	seq       uint64
	pending   map[string][]pendingRef // key -> waiters queued there, in enqueue order
	gone      map[string]bool         // "keys/ref" removed by timeout or drop
	held      map[string]uint64       // key -> token holding it
	holding   map[uint64][]string     // token -> keys it holds
	// Sessions, from the commands and results alone: which are live, the
	// last serial each has given, and its floor.
	live    map[uint64]bool
	serials map[uint64]uint64
	floors  map[uint64]uint64
	// tokenSession maps the token of every holding granted for a session
	// to that session, while both last.
	tokenSession map[uint64]uint64
	// Semaphores, from the commands and results alone: each one's n, and
	// its live permits (token -> slot); permitKey maps a live permit's
	// token to its key.
	sems      map[string]uint32
	permits   map[string]map[uint64]uint32
	permitKey map[uint64]string
}

type pendingRef struct {
	ref, seq uint64
	keys     []string // the keys it queued on
	session  uint64
}

func newPropertyChecker() *propertyChecker {
	return &propertyChecker{pending: map[string][]pendingRef{}, gone: map[string]bool{},
		held: map[string]uint64{}, holding: map[uint64][]string{},
		live: map[uint64]bool{}, serials: map[uint64]uint64{}, floors: map[uint64]uint64{}, tokenSession: map[uint64]uint64{},
		sems: map[string]uint32{}, permits: map[string]map[uint64]uint32{}, permitKey: map[uint64]string{}}
}

// takePermit checks a permit's grant: the next token, at most n permits
// of the key held with it, and a slot below n that no live permit of the
// key holds (one holder per (key, slot): the fencing domain).
func (p *propertyChecker) takePermit(tok uint64, key string, slot uint32) error {
	if tok != p.lastToken+1 {
		return fmt.Errorf("token %d after %d", tok, p.lastToken)
	}
	p.lastToken = tok
	n, ok := p.sems[key]
	if !ok {
		return fmt.Errorf("permit of %q, which is not a semaphore", key)
	}
	held := p.permits[key]
	if held == nil {
		held = map[uint64]uint32{}
		p.permits[key] = held
	}
	if len(held) >= int(n) || slot >= n {
		return fmt.Errorf("semaphore %q (n %d): permit %d granted in slot %d with %d held", key, n, tok, slot, len(held))
	}
	for t, s := range held {
		if s == slot {
			return fmt.Errorf("semaphore %q: slot %d granted under %d while held under %d", key, slot, tok, t)
		}
	}
	held[tok] = slot
	p.permitKey[tok] = key
	return nil
}

// endPermit ends the live permit tok.
func (p *propertyChecker) endPermit(tok uint64) {
	if k, ok := p.permitKey[tok]; ok {
		delete(p.permits[k], tok)
		delete(p.permitKey, tok)
		delete(p.tokenSession, tok)
	}
}

// serial checks that session id gives serial next, after the last one.
func (p *propertyChecker) serial(id, serial uint64, what string) error {
	if !p.live[id] || serial != p.serials[id]+1 {
		return fmt.Errorf("session %d (live %v): %s has serial %d after %d", id, p.live[id], what, serial, p.serials[id])
	}
	p.serials[id] = serial
	return nil
}

// observeSession checks what a command did to sessions: a void only at
// or below the floor, nothing applied for an unknown session or at or
// below the floor, serials in order (effects first, then the command's
// own), timeouts without a serial only from the session's own end, and
// drop-sessionless never dropping a session's waiter.
func (p *propertyChecker) observeSession(c Command, res Result, effects []Effect) error {
	switch {
	case c.Op == OpOpenSession && res.Status == StatusOpened:
		if p.live[c.Session] {
			return fmt.Errorf("session %d opened twice", c.Session)
		}
		p.live[c.Session], p.serials[c.Session], p.floors[c.Session] = true, 0, 0
	case c.Op == OpResumeSession && res.Status == StatusResumed:
		p.floors[c.Session] = max(p.floors[c.Session], c.Seq)
	}
	session := c.Session != 0 && isLockOp(c.Op)
	applied := res.Status != StatusRejected || res.Serial != 0
	if session {
		switch {
		case res.Err == ErrVoided && (!p.live[c.Session] || c.Seq > p.floors[c.Session]):
			return fmt.Errorf("seq %d of session %d voided, floor %d", c.Seq, c.Session, p.floors[c.Session])
		case res.Err == ErrNoSession && p.live[c.Session]:
			return fmt.Errorf("session %d live, yet ErrNoSession", c.Session)
		case applied && (!p.live[c.Session] || c.Seq <= p.floors[c.Session]):
			return fmt.Errorf("seq %d of session %d (live %v, floor %d) applied", c.Seq, c.Session, p.live[c.Session], p.floors[c.Session])
		case applied && (res.Status == StatusQueued) != (res.Serial == 0):
			return fmt.Errorf("%v with serial %d", res.Status, res.Serial)
		}
	} else if res.Serial != 0 {
		return fmt.Errorf("serial %d without a session", res.Serial)
	}
	ending := (c.Op == OpExpireSession || c.Op == OpCloseSession) && res.Status != StatusNoop && res.Status != StatusRejected
	for _, e := range effects {
		switch {
		case e.Session == 0:
			if e.Serial != 0 || e.Seq != 0 {
				return fmt.Errorf("effect %+v: a seq or serial without a session", e)
			}
		case e.Kind == EffectRevoked:
			// A revoked holding of a session records nothing, as an
			// expiry of it records nothing.
			if e.Serial != 0 {
				return fmt.Errorf("effect %+v: revoked with a serial", e)
			}
		case e.Serial != 0:
			if c.Op == OpDropSessionless && e.Kind != EffectGranted {
				return fmt.Errorf("drop-sessionless removed session waiter %+v", e)
			}
			if err := p.serial(e.Session, e.Serial, fmt.Sprintf("effect %+v", e)); err != nil {
				return err
			}
		case !ending || e.Session != c.Session || e.Kind != EffectTimedOut:
			return fmt.Errorf("effect %+v of a session without a serial", e)
		}
	}
	if session && res.Serial != 0 {
		if err := p.serial(c.Session, res.Serial, fmt.Sprintf("%+v", c)); err != nil {
			return err
		}
	}
	if ending {
		for k, q := range p.pending {
			for _, r := range q {
				if r.session == c.Session {
					return fmt.Errorf("key %q: waiter %d of ended session %d still pending", k, r.ref, c.Session)
				}
			}
		}
		p.live[c.Session] = false
	}
	if c.Op == OpDropSessionless {
		for k, q := range p.pending {
			for _, r := range q {
				if r.session == 0 {
					return fmt.Errorf("key %q: waiter %d without a session left after drop-sessionless", k, r.ref)
				}
			}
		}
	}
	return nil
}

func (p *propertyChecker) take(tok uint64, keys []string) error {
	if tok != p.lastToken+1 {
		return fmt.Errorf("token %d after %d", tok, p.lastToken)
	}
	p.lastToken = tok
	for _, k := range keys {
		if t, ok := p.held[k]; ok {
			return fmt.Errorf("key %q granted under %d while held under %d", k, tok, t)
		}
		p.held[k] = tok
	}
	p.holding[tok] = keys
	return nil
}

func (p *propertyChecker) observe(c Command, res Result, effects []Effect) error {
	keys := []string{c.Key}
	if c.Op == OpAcquireBlock {
		keys = c.Keys
	}
	switch res.Status {
	case StatusPermitsSet:
		if c.Permits == 0 {
			if len(p.permits[c.Key]) > 0 {
				return fmt.Errorf("semaphore %q removed with permits held", c.Key)
			}
			delete(p.sems, c.Key)
		} else {
			if _, lock := p.held[c.Key]; lock {
				return fmt.Errorf("semaphore %q defined while held as a lock", c.Key)
			}
			p.sems[c.Key] = c.Permits
		}
	case StatusGranted:
		if c.Op == OpAcquirePermit {
			if err := p.takePermit(res.Token, c.Key, res.Slot); err != nil {
				return err
			}
			if c.Session != 0 {
				p.tokenSession[res.Token] = c.Session
			}
			break
		}
		if _, sem := p.sems[c.Key]; sem && c.Op == OpAcquire {
			return fmt.Errorf("lock acquire of semaphore %q granted", c.Key)
		}
		if err := p.take(res.Token, keys); err != nil {
			return err
		}
		if c.Session != 0 {
			p.tokenSession[res.Token] = c.Session
		}
	case StatusSessionExpired:
		// The named holdings of the session end (before the hand-offs
		// among the effects); every other one keeps its lease and forgets
		// the session.
		for _, t := range c.Tokens {
			if p.tokenSession[t] == c.Session {
				p.endPermit(t)
			}
			if p.tokenSession[t] == c.Session && p.holding[t] != nil {
				for _, k := range p.holding[t] {
					delete(p.held, k)
				}
				delete(p.holding, t)
				delete(p.tokenSession, t)
			}
		}
		for t, id := range p.tokenSession {
			if id == c.Session {
				delete(p.tokenSession, t)
			}
		}
	case StatusSessionClosed:
		// A close (the rule of version 9) ends every holding of the
		// session, before the hand-offs among the effects.
		for t, id := range p.tokenSession {
			if id == c.Session {
				p.endPermit(t)
				for _, k := range p.holding[t] {
					delete(p.held, k)
				}
				delete(p.holding, t)
				delete(p.tokenSession, t)
			}
		}
	case StatusQueued:
		p.seq++
		for _, k := range keys {
			p.pending[k] = append(p.pending[k], pendingRef{c.Ref, p.seq, keys, c.Session})
		}
		delete(p.gone, fmt.Sprint(keys, "/", c.Ref))
	case StatusExtended:
		// Only the current holding is extended, and nothing is owed.
		if _, sem := p.sems[c.Key]; sem {
			if _, live := p.permits[c.Key][c.Token]; !live || len(effects) > 0 {
				return fmt.Errorf("extend of permit %d of %q: not live, or effects %+v", c.Token, c.Key, effects)
			}
			break
		}
		if tok := p.held[c.Key]; tok != c.Token || len(effects) > 0 {
			return fmt.Errorf("extend of %q under %d, held under %d, effects %+v", c.Key, c.Token, tok, effects)
		}
	case StatusRejected:
		if c.Op != OpRevoke {
			break
		}
		// A refused revoke changes nothing; its error says whether the
		// key is held (a semaphore: some permit of it) at all.
		_, lock := p.held[c.Key]
		held := lock || len(p.permits[c.Key]) > 0
		_, live := p.permits[c.Key][c.Token]
		matchErr := res.Err == ErrNotHeld || res.Err == ErrTokenMismatch
		if len(effects) > 0 || matchErr && ((lock && p.held[c.Key] == c.Token) || live || (res.Err == ErrTokenMismatch) != held) {
			return fmt.Errorf("revoke of %q under %d refused with %v (held %v), effects %+v", c.Key, c.Token, res.Err, held, effects)
		}
	case StatusRevoked:
		// Only the holding under the named token ends, its holder is
		// owed the first effect, and every grant after it is under a
		// larger token (fencing refuses the revoked holder's writes).
		if res.Token != c.Token || len(effects) == 0 || effects[0].Kind != EffectRevoked || effects[0].Token != c.Token {
			return fmt.Errorf("revoke of %q under %d: %+v %+v", c.Key, c.Token, res, effects)
		}
		for _, e := range effects[1:] {
			if e.Kind != EffectGranted || e.Token <= c.Token {
				return fmt.Errorf("revoke of %q under %d: then %+v", c.Key, c.Token, e)
			}
		}
		fallthrough
	case StatusReleased, StatusExpired:
		if _, sem := p.sems[c.Key]; sem {
			if _, live := p.permits[c.Key][c.Token]; !live {
				return fmt.Errorf("%v of permit %d of %q, which is not live", res.Status, c.Token, c.Key)
			}
			p.endPermit(c.Token)
			break
		}
		tok := p.held[c.Key]
		if tok != c.Token {
			return fmt.Errorf("%v of %q under %d, held under %d", res.Status, c.Key, c.Token, tok)
		}
		for _, k := range p.holding[tok] {
			delete(p.held, k)
		}
		delete(p.holding, tok)
		delete(p.tokenSession, tok)
	}
	for _, e := range effects {
		ekeys := []string{e.Key}
		if e.Keys != nil {
			ekeys = e.Keys
			if e.Key != e.Keys[0] {
				return fmt.Errorf("effect %+v: key is not the block's primary", e)
			}
		}
		switch e.Kind {
		case EffectGranted:
			if p.gone[fmt.Sprint(ekeys, "/", e.Ref)] {
				return fmt.Errorf("waiter %d granted after timeout/drop", e.Ref)
			}
			for _, k := range ekeys {
				q := p.pending[k]
				if len(q) == 0 || q[0].ref != e.Ref || !slices.Equal(q[0].keys, ekeys) || q[0].session != e.Session {
					return fmt.Errorf("key %q: granted ref %d (keys %q), FIFO head is %v", k, e.Ref, ekeys, q)
				}
				p.pending[k] = q[1:]
			}
			if _, sem := p.sems[e.Key]; sem {
				if err := p.takePermit(e.Token, e.Key, e.Slot); err != nil {
					return err
				}
			} else if err := p.take(e.Token, ekeys); err != nil {
				return err
			}
			if e.Session != 0 {
				p.tokenSession[e.Token] = e.Session
			}
		case EffectTimedOut, EffectDropped:
			for _, k := range ekeys {
				q := p.pending[k]
				i := slices.IndexFunc(q, func(r pendingRef) bool { return r.ref == e.Ref })
				if i < 0 {
					return fmt.Errorf("key %q: removed ref %d not pending %v", k, e.Ref, q)
				}
				p.pending[k] = slices.Delete(slices.Clone(q), i, i+1)
			}
			p.gone[fmt.Sprint(ekeys, "/", e.Ref)] = true
		case EffectRevoked:
			// Checked with the result: the holding it names ended.
			if c.Op != OpRevoke || e.Ref != 0 || e.Serial != 0 {
				return fmt.Errorf("effect %+v of %+v", e, c)
			}
		default:
			return fmt.Errorf("unknown effect %+v", e)
		}
	}
	if err := p.observeSession(c, res, effects); err != nil {
		return err
	}
	if c.Op == OpDropWaiters {
		for k, q := range p.pending {
			if len(q) > 0 {
				return fmt.Errorf("key %q: waiters %v left after drop-waiters", k, q)
			}
		}
	}
	for k, q := range p.pending {
		for i := 1; i < len(q); i++ {
			if q[i].seq < q[i-1].seq {
				return fmt.Errorf("key %q: queue out of arrival order %v (a wait cycle)", k, q)
			}
		}
	}
	return nil
}

// gen produces commands that hit every row of the matrix often: it peeks at
// the model to make right tokens, queued refs and duplicates likely.
type gen struct {
	r       *rand.Rand
	m       *model
	now     int64
	nextRef uint64
	// seqs is the highest seq written per session id, like a broker's.
	seqs map[uint64]uint64
}

var (
	genKeys   = []string{"a", "b", "c", "d", "e"}
	genOwners = []string{"o1", "o2", "o3"}
	// genLabels: mostly none, as most acquires carry none.
	genLabels = []string{"", "", "", "job-a", "req/42", "0123456789012345678901234567890123456789012345678901234567890123"}
)

func (g *gen) pick(xs []string) string { return xs[g.r.IntN(len(xs))] }

// blockKeys picks 2..4 distinct keys in random order.
func (g *gen) blockKeys() []string {
	ks := slices.Clone(genKeys)
	g.r.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
	return ks[:2+g.r.IntN(3)]
}

func (g *gen) command() Command {
	g.now += g.r.Int64N(2000) - 200 // leaders' clocks may step back
	if g.r.IntN(100) < 6 {
		return g.revokeCommand()
	}
	if g.r.IntN(100) < 14 {
		return g.sessionCommand()
	}
	c := g.lockCommand()
	if g.r.IntN(100) < 18 {
		c = g.semCommand()
	}
	if isLockOp(c.Op) && g.r.IntN(5) < 2 {
		g.attachSession(&c)
	}
	return c
}

// genSession picks a session id: mostly a live one, sometimes 1..4
// whether live or not.
func (g *gen) genSession() uint64 {
	if n := len(g.m.sessions); n > 0 && g.r.IntN(10) < 8 {
		return g.m.sessions[g.r.IntN(n)].id
	}
	return 1 + g.r.Uint64N(4)
}

// attachSession makes c a lock command of a session: mostly the next seq,
// sometimes a void one (at or below the floor), one with a kept outcome or
// queued, or any earlier one; the ack anywhere up to just past the last
// serial.
func (g *gen) attachSession(c *Command) {
	id := g.genSession()
	g.seqs[id]++
	c.Session, c.Seq = id, g.seqs[id]
	ms := g.m.session(id)
	if ms == nil {
		return
	}
	c.Ack = g.r.Uint64N(ms.serial + 2)
	switch g.r.IntN(20) {
	case 0:
		c.Seq = g.r.Uint64N(ms.floor + 1)
	case 1:
		if len(ms.outcomes) > 0 {
			c.Seq = ms.outcomes[g.r.IntN(len(ms.outcomes))].Seq
		}
	case 2:
		for _, w := range g.m.waits {
			if w.w.Session == id {
				c.Seq = w.w.Seq
				break
			}
		}
	case 3:
		c.Seq = 1 + g.r.Uint64N(g.seqs[id])
	}
}

// sessionCommand opens, resumes, expires or closes a session (mostly with
// the epoch the model has, sometimes a stale one; mostly valid fields), or
// is a new leader's drop-sessionless.
func (g *gen) sessionCommand() Command {
	id := g.genSession()
	if g.r.IntN(40) == 0 {
		id = 0
	}
	c := Command{Now: g.now, Session: id}
	ms := g.m.session(id)
	var epoch, serial uint64
	if ms != nil {
		epoch, serial = ms.epoch, ms.serial
	}
	if g.r.IntN(6) == 0 {
		epoch += 1 - 2*g.r.Uint64N(2) // stale: one above or below
	}
	switch x := g.r.IntN(100); {
	case x < 22:
		c.Op, c.SecretHash = OpOpenSession, string(rune('a'+g.r.IntN(26)))+"0123456789abcdef0123456789abcde"
		c.TimeoutMs = MinSessionTimeoutMs + uint32(g.r.IntN(MaxSessionTimeoutMs-MinSessionTimeoutMs+1))
		switch g.r.IntN(15) {
		case 0:
			c.SecretHash = c.SecretHash[1:]
		case 1:
			c.TimeoutMs = [...]uint32{0, MinSessionTimeoutMs - 1, MaxSessionTimeoutMs + 1}[g.r.IntN(3)]
		}
	case x < 50:
		// The broker names its highest written seq; up to two more were
		// in flight and are void from now on.
		c.Op, c.Epoch, c.Ack = OpResumeSession, epoch, g.r.Uint64N(serial+2)
		g.seqs[id] += g.r.Uint64N(3)
		c.Seq = g.seqs[id]
	case x < 66:
		c.Op, c.Epoch = OpExpireSession, epoch
		for _, h := range g.m.holds {
			if h.h.Session == id && g.r.IntN(2) == 0 {
				c.Tokens = append(c.Tokens, h.h.Token)
			}
		}
		if g.r.IntN(3) == 0 {
			c.Tokens = append(c.Tokens, g.r.Uint64N(g.m.last+2))
		}
	case x < 74:
		c.Op = OpCloseSession
	case x < 86:
		c.Op, c.Ack = OpAckSession, g.r.Uint64N(serial+2)
	default:
		c.Op = OpDropSessionless
	}
	return c
}

// genSems are the keys semCommand mostly names.
var genSems = []string{"s", "t"}

// genReasons: none, prose with spaces, the longest.
var genReasons = []string{"", "stuck", "stuck since the 14:02 deploy, OPS-123", strings.Repeat("r", MaxReasonLen)}

// revokeCommand revokes a lock's holding, a block's (by any of its keys)
// or a semaphore's permit: mostly under the token that holds it, else
// under another (one issued before, 0, never issued, a waiter's ref) or
// on a free or reserved key; now and then with a field the rules refuse.
func (g *gen) revokeCommand() Command {
	g.nextRef++
	c := Command{Op: OpRevoke, Now: g.now, Key: g.pick(genKeys), Owner: g.pick([]string{"ops", "alice@ops"}), Reason: g.pick(genReasons),
		Ref: g.nextRef}
	if g.r.IntN(3) == 0 {
		c.Key = g.pick(genSems)
	}
	var tokens []uint64
	if g.m.isSem(c.Key) {
		for _, h := range g.m.permits(c.Key) {
			tokens = append(tokens, h.Token)
		}
	} else if i := g.m.holdIndex(c.Key); i >= 0 {
		tokens = append(tokens, g.m.holds[i].h.Token)
	}
	switch x := g.r.IntN(10); {
	case x < 6 && len(tokens) > 0:
		c.Token = tokens[g.r.IntN(len(tokens))]
	case x < 8:
		c.Token = g.r.Uint64N(g.m.last + 2)
	default:
		if q := g.m.queue(c.Key); len(q) > 0 {
			c.Token = q[g.r.IntN(len(q))].Ref
		}
	}
	switch g.r.IntN(30) {
	case 0:
		c.Reason = [...]string{" x", "x ", "a\nb", "\x7f", "é", strings.Repeat("r", MaxReasonLen+1)}[g.r.IntN(6)]
	case 1:
		c.Owner = [...]string{"", "o p"}[g.r.IntN(2)]
	case 2:
		c.Key = "a b"
	}
	return c
}

// semCommand defines, resizes or removes a semaphore, takes, releases,
// extends or expires a permit, or cancels a permit waiter; mostly on
// genSems with small n (so that permits run out and waiters queue),
// sometimes on a lock key or with a field that the rules refuse.
func (g *gen) semCommand() Command {
	c := Command{Now: g.now, Key: g.pick(genSems), Owner: g.pick(genOwners)}
	if g.r.IntN(12) == 0 {
		c.Key = g.pick(genKeys) // refused as a lock's, or made a semaphore
	}
	held := g.m.permits(c.Key)
	var h Holder
	if len(held) > 0 {
		h = held[g.r.IntN(len(held))]
	}
	q := g.m.queue(c.Key)
	switch x := g.r.IntN(100); {
	case x < 12:
		c.Op, c.Permits = OpSetPermits, uint32(g.r.IntN(4))
		if g.r.IntN(30) == 0 {
			c.Permits = MaxPermits + 1
		}
	case x < 52:
		c.Op = OpAcquirePermit
		if g.r.IntN(15) == 0 {
			c.Op = OpAcquire // a lock acquire of a semaphore
		}
		c.LeaseSec = uint32(1 + g.r.IntN(250))
		if g.r.IntN(4) > 0 {
			c.WaitMs = uint32(1 + g.r.IntN(MaxWaitMs))
		}
		c.Label = g.pick(genLabels)
		g.nextRef++
		c.Ref = g.nextRef
		if len(q) > 0 && g.r.IntN(10) == 0 {
			c.Ref = q[g.r.IntN(len(q))].Ref // duplicate
		}
	case x < 68:
		c.Op, c.Token = OpRelease, h.Token
		switch y := g.r.IntN(10); {
		case y < 7 && len(held) > 0:
			c.Owner = h.Owner
		case y < 9:
			c.Token = g.r.Uint64N(g.m.last + 2)
		}
	case x < 78:
		c.Op, c.Token, c.LeaseSec = OpExtend, h.Token, uint32(1+g.r.IntN(250))
		if len(held) > 0 && g.r.IntN(4) > 0 {
			c.Owner = h.Owner
		}
	case x < 90:
		c.Op, c.Token = OpExpire, h.Token
		if len(held) == 0 || g.r.IntN(4) == 0 {
			c.Token = g.r.Uint64N(g.m.last + 2)
		}
	default:
		c.Op, c.Ref = OpCancelWait, g.r.Uint64N(g.nextRef+2)
		if len(q) > 0 && g.r.IntN(4) > 0 {
			c.Ref = q[g.r.IntN(len(q))].Ref
		}
	}
	return c
}

func (g *gen) lockCommand() Command {
	c := Command{Now: g.now, Key: g.pick(genKeys), Owner: g.pick(genOwners)}
	i := g.m.holdIndex(c.Key)
	var h Holder
	if i >= 0 {
		h = g.m.holds[i].h
	}
	q := g.m.queue(c.Key)
	switch x := g.r.IntN(100); {
	case x < 36:
		c.Op = OpAcquire
		if g.r.IntN(2) == 0 {
			c.Op, c.Key, c.Keys = OpAcquireBlock, "", g.blockKeys()
		}
		c.LeaseSec = uint32(1 + g.r.IntN(250))
		if g.r.IntN(3) > 0 {
			c.WaitMs = uint32(1 + g.r.IntN(MaxWaitMs))
		}
		c.Label = g.pick(genLabels)
		g.nextRef++
		c.Ref = g.nextRef
		if len(q) > 0 && g.r.IntN(10) == 0 {
			c.Ref = q[g.r.IntN(len(q))].Ref // duplicate
			if c.Op == OpAcquireBlock {
				c.Keys[0] = q[0].primary(c.Key)
				c.Keys = slices.Compact(c.Keys) // may now be too short or name a key twice
			}
		}
	case x < 56:
		c.Op = OpRelease
		c.Token = h.Token
		switch y := g.r.IntN(10); {
		case y < 6 && i >= 0:
			c.Owner = h.Owner
		case y < 8:
			c.Token = g.r.Uint64N(g.m.last + 2)
		}
	case x < 68:
		// Extends: mostly right (token and owner of the holder), else a
		// wrong owner, a wrong or stale token, or a free or reserved key;
		// a block named by any of its keys.
		c.Op = OpExtend
		c.LeaseSec = uint32(1 + g.r.IntN(250))
		c.Token = h.Token
		if h.Keys != nil {
			c.Key = h.Keys[g.r.IntN(len(h.Keys))]
		}
		switch y := g.r.IntN(10); {
		case y < 7 && i >= 0:
			c.Owner = h.Owner
		case y < 9:
			c.Token = g.r.Uint64N(g.m.last + 2)
		}
	case x < 80:
		c.Op = OpExpire
		c.Token = h.Token
		if i < 0 || g.r.IntN(3) == 0 {
			c.Token = g.r.Uint64N(g.m.last + 2)
		}
	case x < 92:
		c.Op = OpCancelWait
		c.Ref = g.r.Uint64N(g.nextRef + 2)
		if len(q) > 0 && g.r.IntN(3) > 0 {
			c.Ref = q[g.r.IntN(len(q))].Ref
		}
	case x < 94:
		c.Op = OpDropWaiters
	default:
		// Invalid commands of every kind.
		c.Op = [...]Op{OpAcquire, OpRelease, OpExpire, OpCancelWait, OpExtend}[g.r.IntN(5)]
		c.LeaseSec, c.WaitMs = uint32(1+g.r.IntN(250)), uint32(g.r.IntN(100))
		switch g.r.IntN(10) {
		case 9:
			// A bad label: too long, or outside the alphabet.
			c.Op = [...]Op{OpAcquire, OpAcquireBlock}[g.r.IntN(2)]
			if c.Op == OpAcquireBlock {
				c.Key, c.Keys = "", g.blockKeys()
			}
			c.Label = [...]string{"a b", "\x7f", "é", strings.Repeat("l", 65)}[g.r.IntN(4)]
		case 0:
			c.Op = Op(int(maxOp) + 1 + g.r.IntN(255-int(maxOp)))
		case 1:
			c.Key = [...]string{"", "a b", "\x00", string(make([]byte, 256))}[g.r.IntN(4)]
		case 2:
			c.Owner = [...]string{"", "o 1", "\xff"}[g.r.IntN(3)]
		case 3:
			c.Op, c.LeaseSec = OpAcquire, [...]uint32{0, 251, 1 << 31}[g.r.IntN(3)]
			if g.r.IntN(2) == 0 {
				// An extend's lease is checked whoever holds the key.
				c.Op, c.Token = OpExtend, h.Token
				if i >= 0 {
					c.Owner = h.Owner
				}
			}
		case 4:
			c.Op, c.WaitMs = OpAcquire, MaxWaitMs+1+uint32(g.r.IntN(10))
		case 5:
			c.Op, c.Key = OpAcquireBlock, ""
			c.Keys = [...][]string{nil, {"a"}, {"a", "a"}, {"a", "b", "a"}, {"a", ""}, {"a", "b c"},
				slices.Repeat([]string{"k"}, 17)}[g.r.IntN(7)]
			if g.r.IntN(2) == 0 && len(c.Keys) == 17 {
				c.Keys = make([]string, 17)
				for j := range c.Keys {
					c.Keys[j] = fmt.Sprint("k", j)
				}
			}
		case 6:
			c.Op, c.Key, c.Keys = OpAcquireBlock, "", g.blockKeys()
			c.Owner = "o 1"
		case 7:
			c.Op, c.Key, c.Keys = OpAcquireBlock, "", g.blockKeys()
			c.LeaseSec = 0
		case 8:
			// An extend of the holder with a bad key or owner; wait,
			// which it does not use, out of range.
			c.Op, c.Token, c.WaitMs = OpExtend, h.Token, MaxWaitMs+1
			if i >= 0 {
				c.Owner = h.Owner
			}
			if g.r.IntN(2) == 0 {
				c.Key = [...]string{"", "a b", string(make([]byte, 256))}[g.r.IntN(3)]
			} else {
				c.Owner = [...]string{"", "o 1", "\xff"}[g.r.IntN(3)]
			}
		}
	}
	return c
}

func TestModel(t *testing.T) {
	seeds, steps := 300, 400
	if testing.Short() {
		seeds = 30
	}
	var cov modelCoverage
	for seed := range uint64(seeds) {
		if err := runModel(t, seed, steps, &cov); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	// The generator must keep reaching the block cells of the matrix, or
	// agreement proves little about them.
	t.Logf("coverage %+v", cov)
	if cov.blockGrants == 0 || cov.blockHandoffs == 0 || cov.cancelGrants == 0 || cov.reserved == 0 || cov.multiGrantRelease == 0 {
		t.Fatalf("block cells not reached: %+v", cov)
	}
	// Likewise the extend cells: extends of one key (with and without
	// waiters) and of blocks (by a key other than the first), each
	// refusal, and holdings that end after an extend.
	if cov.extendSingle == 0 || cov.extendSingleQueued == 0 || cov.extendBlock == 0 || cov.extendBlockOther == 0 ||
		cov.extendNotHeld == 0 || cov.extendTokenMismatch == 0 || cov.extendOwnerMismatch == 0 || cov.extendInvalid == 0 ||
		cov.extendWrongSession == 0 || cov.releaseWrongSession == 0 ||
		cov.endedRenewed == 0 || cov.renewedSnapshots == 0 {
		t.Fatalf("extend cells not reached: %+v", cov)
	}
	// And every cell of "Sessions".
	if missing := cov.sessions.missing(); missing != nil {
		t.Fatalf("session cells not reached: %v\n%+v", missing, cov.sessions)
	}
	// And of "Semaphores".
	if missing := cov.sems.missing(); missing != nil {
		t.Fatalf("semaphore cells not reached: %v\n%+v", missing, cov.sems)
	}
	// And of "Revoke".
	if missing := cov.revokes.missing(); missing != nil {
		t.Fatalf("revoke cells not reached: %v\n%+v", missing, cov.revokes)
	}
}

// modelCoverage counts how often TestModel reached the cells that only
// blocks have.
type modelCoverage struct {
	blockGrants       int // a block granted at once
	blockHandoffs     int // a queued block granted by a release, expiry or cancel
	cancelGrants      int // a cancel that granted keys to others
	reserved          int // steps that left some key reserved
	multiGrantRelease int // one release or expiry that made two grants or more

	extendSingle        int // a single-key holding extended
	extendSingleQueued  int // ... while it had waiters
	extendBlock         int // a block holding extended
	extendBlockOther    int // ... naming a key other than its first
	extendNotHeld       int // refused: free or reserved key
	extendTokenMismatch int // refused (not held): wrong token
	extendOwnerMismatch int // refused (not held): right token, wrong owner
	// releaseWrongSession and extendWrongSession: refused (not held)
	// with the right token and owner, because the holding is another
	// session's (the command has none or another).
	releaseWrongSession, extendWrongSession int
	extendInvalid                           int // refused: a field out of its constraints
	endedRenewed                            int // a release or expiry ended an extended holding
	renewedSnapshots                        int // snapshot round trips with renewals in them

	sessions sessionCoverage
	sems     semCoverage
	revokes  revokeCoverage
}

// revokeCoverage counts the cells of MATRIX.md "Revoke" TestModel
// reached.
type revokeCoverage struct {
	lock, lockHandoff     int // a lock's holding revoked; ... handed on to its head
	block, blockOther     int // a block revoked; ... naming a key other than its first
	permit, permitHandoff int // a permit revoked; ... its slot handed on
	session, renewed      int // the revoked holding was a session's; was extended
	replaced              int // a key's older record replaced
	notHeldFree           int // refused: free or unknown key
	notHeldReserved       int // refused: reserved key
	notHeldSem            int // refused: semaphore without a permit held
	mismatch, mismatchSem int // refused: held under another token
	mismatchRef           int // ... the token named being a waiter's ref
	invalid               int // refused: a field out of its constraints
}

// revokePre is what the revoke coverage needs to know of the state before
// a command.
type revokePre struct {
	reserved, recorded, renewed bool
	sem                         bool // the key is a semaphore
	semHeld                     int
	waiterRef                   bool // the token is the ref of a waiter of the key
}

func preRevoke(s *State, c Command) revokePre {
	var p revokePre
	if c.Op != OpRevoke {
		return p
	}
	p.reserved = s.Reserved(c.Key)
	_, p.recorded = s.LastRevoke(c.Key)
	_, p.renewed = s.renewed[c.Token]
	if m, ok := s.Semaphore(c.Key); ok {
		p.sem, p.semHeld = true, m.Held
	}
	for _, w := range s.Waiters(c.Key) {
		p.waiterRef = p.waiterRef || w.Ref == c.Token
	}
	return p
}

func (c *revokeCoverage) observe(cmd Command, res Result, effects []Effect, pre revokePre) {
	if cmd.Op != OpRevoke {
		return
	}
	switch res.Err {
	case nil:
	case ErrNotHeld:
		switch {
		case pre.reserved:
			c.notHeldReserved++
		case pre.sem && pre.semHeld == 0:
			c.notHeldSem++
		default:
			c.notHeldFree++
		}
		return
	case ErrTokenMismatch:
		c.mismatch++
		if pre.sem {
			c.mismatchSem++
		}
		if pre.waiterRef {
			c.mismatchRef++
		}
		return
	default:
		c.invalid++
		return
	}
	e := effects[0]
	switch {
	case e.Keys != nil:
		c.block++
		if cmd.Key != e.Keys[0] {
			c.blockOther++
		}
	case pre.sem:
		c.permit++
	default:
		c.lock++
	}
	if len(effects) > 1 {
		if pre.sem {
			c.permitHandoff++
		} else {
			c.lockHandoff++
		}
	}
	if e.Session != 0 {
		c.session++
	}
	if pre.renewed {
		c.renewed++
	}
	if pre.recorded {
		c.replaced++
	}
}

// missing names the counters still at 0 (nil if none).
func (c revokeCoverage) missing() []string {
	var out []string
	v := reflect.ValueOf(c)
	for i := range v.NumField() {
		if v.Field(i).Int() == 0 {
			out = append(out, v.Type().Field(i).Name)
		}
	}
	return out
}

// semCoverage counts the cells of MATRIX.md "Semaphores" TestModel
// reached.
type semCoverage struct {
	defined, removed, resized, raiseGrants int
	permitGrants, permitQueued, permitBusy int
	permitHandoffs, heldAboveN             int // hand-offs by release/expiry; a permit ended while more than n were held
	isSemaphore, notSemaphore, inUse       int
	permitExtends, sessionPermitEnds       int
}

func (c *semCoverage) missing() []string {
	var out []string
	for name, n := range map[string]int{"defined": c.defined, "removed": c.removed, "resized": c.resized,
		"raiseGrants": c.raiseGrants, "permitGrants": c.permitGrants, "permitQueued": c.permitQueued,
		"permitBusy": c.permitBusy, "permitHandoffs": c.permitHandoffs, "heldAboveN": c.heldAboveN,
		"isSemaphore": c.isSemaphore, "notSemaphore": c.notSemaphore, "inUse": c.inUse,
		"permitExtends": c.permitExtends, "sessionPermitEnds": c.sessionPermitEnds} {
		if n == 0 {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// observe counts what cmd did; pre is the semaphore of its key before it.
func (c *semCoverage) observe(cmd Command, res Result, effects []Effect, s *State, pre Semaphore, wasSem bool) {
	switch res.Err {
	case ErrIsSemaphore:
		c.isSemaphore++
	case ErrNotSemaphore:
		c.notSemaphore++
	case ErrInUse:
		c.inUse++
	}
	grants := 0
	for _, e := range effects {
		if e.Kind == EffectGranted && s.isSemaphore(e.Key) {
			grants++
		}
	}
	switch {
	case res.Status == StatusPermitsSet && !wasSem:
		c.defined++
	case res.Status == StatusPermitsSet && cmd.Permits == 0:
		c.removed++
	case res.Status == StatusPermitsSet:
		c.resized++
		c.raiseGrants += grants
	case cmd.Op == OpAcquirePermit && res.Status == StatusGranted:
		c.permitGrants++
	case cmd.Op == OpAcquirePermit && res.Status == StatusQueued:
		c.permitQueued++
	case cmd.Op == OpAcquirePermit && res.Status == StatusBusy:
		c.permitBusy++
	case wasSem && cmd.Op == OpExtend && res.Status == StatusExtended:
		c.permitExtends++
	case wasSem && (res.Status == StatusReleased || res.Status == StatusExpired):
		c.permitHandoffs += grants
		if pre.Held > int(pre.Permits) {
			c.heldAboveN++
		}
	case res.Status == StatusSessionExpired || res.Status == StatusSessionClosed:
		c.sessionPermitEnds += grants
	}
}

// sessionCoverage counts the cells of MATRIX.md "Sessions" TestModel
// reached.
type sessionCoverage struct {
	opened, openExists, openInvalid         int
	resumed, resumeStale, resumeUnknown     int
	expiredWaiters                          int // an expiry that timed out waiters of the session
	expiredReleased                         int // ... that released a named holding
	expiredKept                             int // ... or close that left a holding of the session to its lease
	expireStale, expireUnknown, closed      int
	noSession, voided, dupSeq, oldSeq       int // lock commands of a session refused; an earlier seq applied (forgotten since its ack, or never written)
	recGranted, recBusy, recReleased        int // outcomes recorded for the command itself
	recExtended, recRejected, queued        int
	handoffRecorded                         int // a hand-off to a session waiter, recorded
	cancelRecorded                          int // a cancel of a session waiter, recorded
	dropKept, dropGranted, dropWaitersTimed int // drop-sessionless kept / granted session waiters; drop-waiters recorded
	ackTrimmed, ackClamped                  int
	sessionSnapshots                        int
}

// sessionPre is what the coverage needs to know of the state before a
// command.
type sessionPre struct {
	live                bool
	ack, serial         uint64
	namedHeld, holdings int // tokens of the command held by its session; the session's holdings
	sessionWaiters      int // waiters of any session
	used                bool
}

func preSession(s *State, c Command) sessionPre {
	var p sessionPre
	ss := s.sessions[c.Session]
	if ss != nil {
		p.live, p.ack, p.serial, p.holdings = true, ss.ack, ss.serial, len(ss.holdings)
		for _, t := range c.Tokens {
			if _, ok := ss.holdings[t]; ok {
				p.namedHeld++
			}
		}
		p.used = ss.has(c.Seq)
	}
	for _, o := range s.sessions {
		p.sessionWaiters += len(o.waiters)
	}
	return p
}

func (c *sessionCoverage) observe(cmd Command, res Result, effects []Effect, s *State, pre sessionPre, maxSeq uint64) {
	count := func(kind EffectKind, recorded bool) int {
		n := 0
		for _, e := range effects {
			if e.Kind == kind && e.Session != 0 && (e.Serial != 0) == recorded {
				n++
			}
		}
		return n
	}
	c.handoffRecorded += count(EffectGranted, true)
	switch cmd.Op {
	case OpOpenSession:
		switch res.Err {
		case nil:
			c.opened++
		case ErrSessionExists:
			c.openExists++
		default:
			c.openInvalid++
		}
	case OpResumeSession:
		switch res.Err {
		case nil:
			c.resumed++
		case ErrStaleEpoch:
			c.resumeStale++
		case ErrNoSession:
			c.resumeUnknown++
		}
	case OpExpireSession, OpCloseSession:
		switch {
		case res.Status == StatusNoop && pre.live:
			c.expireStale++
		case res.Status == StatusNoop:
			c.expireUnknown++
		case res.Status == StatusRejected:
		default:
			if count(EffectTimedOut, false) > 0 {
				c.expiredWaiters++
			}
			if cmd.Op == OpExpireSession && pre.namedHeld > 0 {
				c.expiredReleased++
			}
			if cmd.Op == OpCloseSession {
				c.closed++
				pre.namedHeld = pre.holdings // all released
			}
			if pre.holdings > pre.namedHeld {
				c.expiredKept++
			}
		}
	case OpCancelWait:
		c.cancelRecorded += count(EffectTimedOut, true)
	case OpDropSessionless:
		if pre.sessionWaiters > 0 {
			c.dropKept++
		}
		c.dropGranted += count(EffectGranted, true)
	case OpDropWaiters:
		c.dropWaitersTimed += count(EffectDropped, true)
	}
	if cmd.Session == 0 || !isLockOp(cmd.Op) {
		return
	}
	switch res.Err {
	case ErrNoSession:
		c.noSession++
	case ErrVoided:
		c.voided++
	case ErrDuplicateSeq:
		c.dupSeq++
	}
	if res.Status == StatusQueued {
		c.queued++
	}
	if res.Serial == 0 && res.Status != StatusQueued {
		return
	}
	if cmd.Seq < maxSeq && !pre.used && cmd.Seq <= pre.serial {
		c.oldSeq++
	}
	si, _ := s.Session(cmd.Session)
	if si.Ack > pre.ack {
		c.ackTrimmed++
	}
	if cmd.Ack > pre.serial {
		c.ackClamped++
	}
	switch res.Status {
	case StatusGranted:
		c.recGranted++
	case StatusBusy:
		c.recBusy++
	case StatusReleased:
		c.recReleased++
	case StatusExtended:
		c.recExtended++
	case StatusRejected:
		c.recRejected++
	}
}

// missing names the counters still at 0 (nil if none).
func (c sessionCoverage) missing() []string {
	var out []string
	v := reflect.ValueOf(c)
	for i := range v.NumField() {
		if v.Field(i).Int() == 0 {
			out = append(out, v.Type().Field(i).Name)
		}
	}
	return out
}

// observe counts what cmd did to s; wasRenewed: the holding cmd.Key had
// before it was extended.
func (c *modelCoverage) observe(cmd Command, res Result, effects []Effect, s *State, wasRenewed bool) {
	if (res.Status == StatusReleased || res.Status == StatusExpired) && wasRenewed {
		c.endedRenewed++
	}
	if cmd.Op == OpExtend {
		switch res.Err {
		case nil:
			h, _ := s.Holder(cmd.Key)
			switch {
			case h.Keys == nil:
				c.extendSingle++
				if s.QueueLen(cmd.Key) > 0 {
					c.extendSingleQueued++
				}
			default:
				c.extendBlock++
				if cmd.Key != h.Keys[0] {
					c.extendBlockOther++
				}
			}
		case ErrNotHeld:
			// One error for every mismatch: the holder, untouched by
			// the refusal, tells which part was wrong.
			switch h, held := s.Holder(cmd.Key); {
			case !held:
				c.extendNotHeld++
			case h.Token != cmd.Token:
				c.extendTokenMismatch++
			case h.Owner != cmd.Owner:
				c.extendOwnerMismatch++
			default:
				c.extendWrongSession++
			}
		default:
			c.extendInvalid++
		}
	}
	if cmd.Op == OpRelease && res.Err == ErrNotHeld {
		if h, held := s.Holder(cmd.Key); held && h.Token == cmd.Token && h.Owner == cmd.Owner {
			c.releaseWrongSession++
		}
	}
	grants := 0
	for _, e := range effects {
		if e.Kind == EffectGranted {
			grants++
			if e.Keys != nil {
				c.blockHandoffs++
			}
		}
	}
	switch {
	case cmd.Op == OpAcquireBlock && res.Status == StatusGranted:
		c.blockGrants++
	case cmd.Op == OpCancelWait && grants > 0:
		c.cancelGrants++
	case grants > 1:
		c.multiGrantRelease++
	}
	if s.NumReserved() > 0 {
		c.reserved++
	}
}

func runModel(t *testing.T, seed uint64, steps int, cov *modelCoverage) (err error) {
	r := rand.New(rand.NewPCG(seed, 0x7469636b6574))
	m := &model{}
	g := &gen{r: r, m: m, seqs: map[uint64]uint64{}}
	s := New()
	p := newPropertyChecker()
	var effects []Effect
	// Frozen views taken along the way, each with the bytes the State
	// wrote at that moment: later applies (copy-on-write) must leave every
	// view exactly as it was.
	type frozenAt struct {
		step int
		f    *Frozen
		want []byte
	}
	var frozen []frozenAt
	checkFrozen := func() error {
		for _, fa := range frozen {
			var buf bytes.Buffer
			if err := fa.f.WriteSnapshot(&buf); err != nil {
				return err
			}
			if !bytes.Equal(buf.Bytes(), fa.want) {
				return fmt.Errorf("view frozen at step %d changed after later applies", fa.step)
			}
		}
		return nil
	}
	defer func() {
		if err == nil {
			err = checkFrozen()
		}
	}()
	for step := 0; step < steps; {
		if r.IntN(8) == 0 {
			var buf bytes.Buffer
			if err := s.WriteSnapshot(&buf); err != nil {
				return err
			}
			frozen = append(frozen, frozenAt{step, s.Freeze(), buf.Bytes()})
		}
		// A batch of commands travels through the codec like a log entry;
		// the state applies what was decoded, the model what was generated,
		// so the codec has to preserve meaning, not just bytes.
		var batch []Command
		for n := 1 + r.IntN(8); n > 0; n-- {
			batch = append(batch, g.command())
			if c := batch[len(batch)-1]; c.Op < OpAcquire || c.Op > maxOp {
				break // unknown ops cannot be encoded; apply them directly
			}
		}
		decoded := batch
		if last := batch[len(batch)-1]; last.Op >= OpAcquire && last.Op <= maxOp {
			var err error
			decoded, err = DecodeBatch(AppendBatch(nil, batch), nil)
			if err != nil {
				return fmt.Errorf("decode: %v", err)
			}
			for i := range batch {
				if !reflect.DeepEqual(decoded[i], normalize(batch[i])) {
					return fmt.Errorf("codec: %+v became %+v", batch[i], decoded[i])
				}
			}
		}
		for i := range batch {
			// The generator looks at the model, so it must not run ahead:
			// commands of a batch were generated before any was applied,
			// just as a leader batches before the entry commits.
			wantRes, wantEff := m.apply(batch[i])
			wasRenewed := false
			if h, ok := s.Holder(decoded[i].Key); ok {
				_, wasRenewed = s.renewed[h.Token]
			}
			pre := preSession(s, decoded[i])
			preSem, wasSem := s.Semaphore(decoded[i].Key)
			preRev := preRevoke(s, decoded[i])
			var res Result
			res, effects = s.Apply(decoded[i], effects[:0])
			if res != wantRes || !slices.EqualFunc(effects, wantEff, func(a, b Effect) bool { return reflect.DeepEqual(a, b) }) {
				return fmt.Errorf("step %d %+v:\nstate %+v %+v\nmodel %+v %+v", step, batch[i], res, effects, wantRes, wantEff)
			}
			cov.observe(batch[i], res, effects, s, wasRenewed)
			cov.sessions.observe(batch[i], res, effects, s, pre, g.seqs[batch[i].Session])
			cov.sems.observe(batch[i], res, effects, s, preSem, wasSem)
			cov.revokes.observe(batch[i], res, effects, preRev)
			if err := p.observe(batch[i], res, effects); err != nil {
				return fmt.Errorf("step %d %+v: %v", step, batch[i], err)
			}
			if err := m.compare(s, genKeys); err != nil {
				return fmt.Errorf("step %d %+v: %v", step, batch[i], err)
			}
			if err := checkInvariants(s); err != nil {
				return fmt.Errorf("step %d: %v", step, err)
			}

			if s.LastToken() != p.lastToken {
				return fmt.Errorf("step %d: last token %d, grants seen up to %d", step, s.LastToken(), p.lastToken)
			}
			step++
		}
		if r.IntN(20) == 0 {
			if s.NumRenewed() > 0 {
				cov.renewedSnapshots++
			}
			if s.NumSessions() > 0 {
				cov.sessions.sessionSnapshots++
			}
			// Continue on the restored copy: a follower that restored a
			// snapshot must behave exactly like one that replayed the log.
			s = checkSnapshotRoundTrip(t, s)
		}
	}
	return nil
}
