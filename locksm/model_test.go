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
// that succeeds only on the current holding and owes nothing.

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// model is the obvious implementation of the semantics in MATRIX.md.
type model struct {
	last  uint64
	clock int64
	holds []modelHold // at most one per key; a block's keys each have one
	waits []modelWait // every waiter of every key, in enqueue order; a block is one
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
	keys []string
	w    Waiter
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

func (m *model) holdIndex(key string) int {
	for i, h := range m.holds {
		if h.key == key {
			return i
		}
	}
	return -1
}

func (m *model) held(key string) bool { return m.holdIndex(key) >= 0 }

func (m *model) apply(c Command) (Result, []Effect) {
	res, eff := m.apply1(c)
	switch res.Status {
	case StatusGranted, StatusQueued, StatusReleased, StatusExpired, StatusExtended:
		m.clock = c.Now
	}
	return res, eff
}

func (m *model) apply1(c Command) (Result, []Effect) {
	reject := func(err error) (Result, []Effect) { return Result{Status: StatusRejected, Err: err}, nil }
	switch c.Op {
	case OpAcquire, OpRelease, OpExpire, OpCancelWait, OpExtend:
		if !modelValid(c.Key, 255) {
			return reject(ErrInvalidKey)
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
	case OpDropWaiters:
	default:
		return reject(ErrInvalidCommand)
	}
	if (c.Op == OpAcquire || c.Op == OpAcquireBlock || c.Op == OpRelease || c.Op == OpExtend) && !modelValid(c.Owner, 128) {
		return reject(ErrInvalidOwner)
	}
	if (c.Op == OpAcquire || c.Op == OpAcquireBlock || c.Op == OpExtend) && (c.LeaseSec < 1 || c.LeaseSec > 250) {
		return reject(ErrInvalidLease)
	}
	if c.Op == OpAcquire || c.Op == OpAcquireBlock {
		if c.WaitMs > 300000 {
			return reject(ErrInvalidWait)
		}
	}
	switch c.Op {
	case OpAcquire:
		if !m.held(c.Key) && len(m.queue(c.Key)) == 0 {
			m.last++
			m.holds = append(m.holds, modelHold{key: c.Key, h: Holder{Owner: c.Owner, Token: m.last, LeaseSec: c.LeaseSec, GrantedAt: c.Now}})
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
		m.waits = append(m.waits, modelWait{[]string{c.Key}, Waiter{Owner: c.Owner, Ref: c.Ref, LeaseSec: c.LeaseSec, WaitMs: c.WaitMs, EnqueuedAt: c.Now}})
		return Result{Status: StatusQueued}, nil
	case OpAcquireBlock:
		free := true
		for _, k := range c.Keys {
			free = free && !m.held(k) && len(m.queue(k)) == 0
		}
		if free {
			m.last++
			for _, k := range c.Keys {
				m.holds = append(m.holds, modelHold{key: k, h: Holder{Owner: c.Owner, Token: m.last, LeaseSec: c.LeaseSec, GrantedAt: c.Now, Keys: c.Keys}})
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
		m.waits = append(m.waits, modelWait{c.Keys, Waiter{Owner: c.Owner, Ref: c.Ref, LeaseSec: c.LeaseSec, WaitMs: c.WaitMs, EnqueuedAt: c.Now, Keys: c.Keys}})
		return Result{Status: StatusQueued}, nil
	case OpRelease:
		i := m.holdIndex(c.Key)
		switch {
		case i < 0:
			return reject(ErrNotHeld)
		case m.holds[i].h.Token != c.Token:
			return reject(ErrTokenMismatch)
		case m.holds[i].h.Owner != c.Owner:
			return reject(ErrOwnerMismatch)
		}
		return Result{Status: StatusReleased}, m.free(i, c.Now)
	case OpExtend:
		i := m.holdIndex(c.Key)
		switch {
		case i < 0:
			return reject(ErrNotHeld)
		case m.holds[i].h.Token != c.Token:
			return reject(ErrTokenMismatch)
		case m.holds[i].h.Owner != c.Owner:
			return reject(ErrOwnerMismatch)
		}
		// Every key held under the token: the key, or its whole block.
		for j := range m.holds {
			if h := &m.holds[j]; h.h.Token == c.Token {
				h.h.LeaseSec, h.h.RenewedAt, h.renewed = c.LeaseSec, c.Now, true
			}
		}
		return Result{Status: StatusExtended}, nil
	case OpExpire:
		i := m.holdIndex(c.Key)
		if i < 0 || m.holds[i].h.Token != c.Token {
			return Result{Status: StatusNoop}, nil
		}
		return Result{Status: StatusExpired}, m.free(i, c.Now)
	case OpCancelWait:
		for i, w := range m.waits {
			if slices.Contains(w.keys, c.Key) && w.w.Ref == c.Ref {
				m.waits = slices.Delete(m.waits, i, i+1)
				eff := []Effect{{Kind: EffectTimedOut, Key: w.keys[0], Keys: w.w.Keys, Owner: w.w.Owner, Ref: w.w.Ref}}
				// Every key the waiter left is decided again (a single-key
				// waiter's never changes: it cannot head an unheld key).
				return Result{Status: StatusCanceled}, append(eff, m.promote(w.keys, m.clock)...)
			}
		}
		return Result{Status: StatusNoop}, nil
	default: // OpDropWaiters
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
				if !slices.Contains(w.keys, k) || (w.w.Keys != nil && told[w.w.Ref]) {
					continue
				}
				if w.w.Keys != nil {
					told[w.w.Ref] = true
				}
				effects = append(effects, Effect{Kind: EffectDropped, Key: w.keys[0], Keys: w.w.Keys, Owner: w.w.Owner, Ref: w.w.Ref})
			}
		}
		m.waits = nil
		return Result{Status: StatusDropped}, effects
	}
}

// free ends the holding of m.holds[i] (the key, or its whole block) and
// decides each freed key again, in the block's order.
func (m *model) free(i int, now int64) []Effect {
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
		if m.held(k) {
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
			m.holds = append(m.holds, modelHold{key: bk, h: Holder{Owner: w.w.Owner, Token: m.last, LeaseSec: w.w.LeaseSec, GrantedAt: now, Keys: w.w.Keys}})
		}
		effects = append(effects, Effect{Kind: EffectGranted, Key: w.keys[0], Keys: w.w.Keys, Owner: w.w.Owner, Ref: w.w.Ref, Token: m.last, LeaseSec: w.w.LeaseSec})
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
	for _, h := range m.holds {
		if h.h.Keys != nil {
			blocks[h.h.Token] = true
		}
		if h.renewed {
			renewed[h.h.Token] = true
		}
	}
	if s.LastToken() != m.last || s.NumHeld() != len(m.holds) || s.NumWaiting() != len(m.waits) || s.NumBlocks() != len(blocks) ||
		s.NumRenewed() != len(renewed) {
		return fmt.Errorf("counts: state last=%d held=%d waiting=%d blocks=%d renewed=%d, model %d %d %d %d %d",
			s.LastToken(), s.NumHeld(), s.NumWaiting(), s.NumBlocks(), s.NumRenewed(),
			m.last, len(m.holds), len(m.waits), len(blocks), len(renewed))
	}
	for _, k := range keys {
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
		if r := s.Reserved(k); r != (want == nil && len(m.queue(k)) > 0) {
			return fmt.Errorf("key %q: reserved %v, model holder %+v queue %d", k, r, want, len(m.queue(k)))
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
}

type pendingRef struct {
	ref, seq uint64
	keys     []string // the keys it queued on
}

func newPropertyChecker() *propertyChecker {
	return &propertyChecker{pending: map[string][]pendingRef{}, gone: map[string]bool{},
		held: map[string]uint64{}, holding: map[uint64][]string{}}
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
	case StatusGranted:
		if err := p.take(res.Token, keys); err != nil {
			return err
		}
	case StatusQueued:
		p.seq++
		for _, k := range keys {
			p.pending[k] = append(p.pending[k], pendingRef{c.Ref, p.seq, keys})
		}
		delete(p.gone, fmt.Sprint(keys, "/", c.Ref))
	case StatusExtended:
		// Only the current holding is extended, and nothing is owed.
		if tok := p.held[c.Key]; tok != c.Token || len(effects) > 0 {
			return fmt.Errorf("extend of %q under %d, held under %d, effects %+v", c.Key, c.Token, tok, effects)
		}
	case StatusReleased, StatusExpired:
		tok := p.held[c.Key]
		if tok != c.Token {
			return fmt.Errorf("%v of %q under %d, held under %d", res.Status, c.Key, c.Token, tok)
		}
		for _, k := range p.holding[tok] {
			delete(p.held, k)
		}
		delete(p.holding, tok)
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
				if len(q) == 0 || q[0].ref != e.Ref || !slices.Equal(q[0].keys, ekeys) {
					return fmt.Errorf("key %q: granted ref %d (keys %q), FIFO head is %v", k, e.Ref, ekeys, q)
				}
				p.pending[k] = q[1:]
			}
			if err := p.take(e.Token, ekeys); err != nil {
				return err
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
		default:
			return fmt.Errorf("unknown effect %+v", e)
		}
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
}

var (
	genKeys   = []string{"a", "b", "c", "d", "e"}
	genOwners = []string{"o1", "o2", "o3"}
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
		switch g.r.IntN(9) {
		case 0:
			c.Op = Op(13 + g.r.IntN(243))
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
		cov.endedRenewed == 0 || cov.renewedSnapshots == 0 {
		t.Fatalf("extend cells not reached: %+v", cov)
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
	extendTokenMismatch int // refused: wrong token
	extendOwnerMismatch int // refused: wrong owner
	extendInvalid       int // refused: a field out of its constraints
	endedRenewed        int // a release or expiry ended an extended holding
	renewedSnapshots    int // snapshot round trips with renewals in them
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
			c.extendNotHeld++
		case ErrTokenMismatch:
			c.extendTokenMismatch++
		case ErrOwnerMismatch:
			c.extendOwnerMismatch++
		default:
			c.extendInvalid++
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
	g := &gen{r: r, m: m}
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
			if c := batch[len(batch)-1]; c.Op < OpAcquire || c.Op > OpExtend {
				break // unknown ops cannot be encoded; apply them directly
			}
		}
		decoded := batch
		if last := batch[len(batch)-1]; last.Op >= OpAcquire && last.Op <= OpExtend {
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
			var res Result
			res, effects = s.Apply(decoded[i], effects[:0])
			if res != wantRes || !slices.EqualFunc(effects, wantEff, func(a, b Effect) bool { return reflect.DeepEqual(a, b) }) {
				return fmt.Errorf("step %d %+v:\nstate %+v %+v\nmodel %+v %+v", step, batch[i], res, effects, wantRes, wantEff)
			}
			cov.observe(batch[i], res, effects, s, wasRenewed)
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
			// Continue on the restored copy: a follower that restored a
			// snapshot must behave exactly like one that replayed the log.
			s = checkSnapshotRoundTrip(t, s)
		}
	}
	return nil
}
