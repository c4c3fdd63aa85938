package locksm

// A property test in the style of etcd-io/raft's quorum/quick_test.go: random
// command sequences run against the real State and against a deliberately
// naive model (flat lists, linear scans, no indexes, no recycling), and the
// two must agree after every step. On top of agreement, the test checks the
// safety properties directly, from the stream of results and effects alone,
// so a bug shared by State and model still has to get past them.

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
	holds []modelHold // at most one per key
	waits []modelWait // every waiter of every key, in enqueue order
}

type modelHold struct {
	key string
	h   Holder
}

type modelWait struct {
	key string
	w   Waiter
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

func (m *model) apply(c Command) (Result, []Effect) {
	reject := func(err error) (Result, []Effect) { return Result{Status: StatusRejected, Err: err}, nil }
	switch c.Op {
	case OpAcquire, OpRelease, OpExpire, OpCancelWait:
		if !modelValid(c.Key, 255) {
			return reject(ErrInvalidKey)
		}
	case OpDropWaiters:
	default:
		return reject(ErrInvalidCommand)
	}
	if (c.Op == OpAcquire || c.Op == OpRelease) && !modelValid(c.Owner, 128) {
		return reject(ErrInvalidOwner)
	}
	switch c.Op {
	case OpAcquire:
		if c.LeaseSec < 1 || c.LeaseSec > 250 {
			return reject(ErrInvalidLease)
		}
		if c.WaitMs > 300000 {
			return reject(ErrInvalidWait)
		}
		if m.holdIndex(c.Key) < 0 {
			m.last++
			m.holds = append(m.holds, modelHold{key: c.Key, h: Holder{c.Owner, m.last, c.LeaseSec, c.Now}})
			return Result{Status: StatusGranted, Token: m.last}, nil
		}
		if c.WaitMs == 0 {
			return Result{Status: StatusBusy}, nil
		}
		for _, w := range m.waits {
			if w.key == c.Key && w.w.Ref == c.Ref {
				return reject(ErrDuplicateRef)
			}
		}
		m.waits = append(m.waits, modelWait{c.Key, Waiter{c.Owner, c.Ref, c.LeaseSec, c.WaitMs, c.Now}})
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
		m.holds = slices.Delete(m.holds, i, i+1)
		return Result{Status: StatusReleased}, m.promote(c.Key, c.Now)
	case OpExpire:
		i := m.holdIndex(c.Key)
		if i < 0 || m.holds[i].h.Token != c.Token {
			return Result{Status: StatusNoop}, nil
		}
		m.holds = slices.Delete(m.holds, i, i+1)
		return Result{Status: StatusExpired}, m.promote(c.Key, c.Now)
	case OpCancelWait:
		for i, w := range m.waits {
			if w.key == c.Key && w.w.Ref == c.Ref {
				m.waits = slices.Delete(m.waits, i, i+1)
				return Result{Status: StatusCanceled},
					[]Effect{{Kind: EffectTimedOut, Key: c.Key, Owner: w.w.Owner, Ref: w.w.Ref}}
			}
		}
		return Result{Status: StatusNoop}, nil
	default: // OpDropWaiters
		var keys []string
		for _, w := range m.waits {
			if !slices.Contains(keys, w.key) {
				keys = append(keys, w.key)
			}
		}
		slices.Sort(keys)
		var effects []Effect
		for _, k := range keys {
			for _, w := range m.waits {
				if w.key == k {
					effects = append(effects, Effect{Kind: EffectDropped, Key: k, Owner: w.w.Owner, Ref: w.w.Ref})
				}
			}
		}
		m.waits = nil
		return Result{Status: StatusDropped}, effects
	}
}

// promote gives a just-freed key to its first waiter, if any.
func (m *model) promote(key string, now int64) []Effect {
	for i, w := range m.waits {
		if w.key == key {
			m.waits = slices.Delete(m.waits, i, i+1)
			m.last++
			m.holds = append(m.holds, modelHold{key: key, h: Holder{w.w.Owner, m.last, w.w.LeaseSec, now}})
			return []Effect{{Kind: EffectGranted, Key: key, Owner: w.w.Owner, Ref: w.w.Ref, Token: m.last, LeaseSec: w.w.LeaseSec}}
		}
	}
	return nil
}

func (m *model) queue(key string) []Waiter {
	var q []Waiter
	for _, w := range m.waits {
		if w.key == key {
			q = append(q, w.w)
		}
	}
	return q
}

// compare checks that s answers every query as m does.
func (m *model) compare(s *State, keys []string) error {
	if s.LastToken() != m.last || s.NumHeld() != len(m.holds) || s.NumWaiting() != len(m.waits) {
		return fmt.Errorf("counts: state last=%d held=%d waiting=%d, model %d %d %d",
			s.LastToken(), s.NumHeld(), s.NumWaiting(), m.last, len(m.holds), len(m.waits))
	}
	for _, k := range keys {
		var want *Holder
		if i := m.holdIndex(k); i >= 0 {
			want = &m.holds[i].h
		}
		got, ok := s.Holder(k)
		if ok != (want != nil) || (ok && got != *want) {
			return fmt.Errorf("key %q: holder %v %+v, model %+v", k, ok, got, want)
		}
		if g, w := s.Waiters(k), m.queue(k); !reflect.DeepEqual(g, w) {
			return fmt.Errorf("key %q: waiters %+v, model %+v", k, g, w)
		}
	}
	return nil
}

// propertyChecker verifies the safety properties from results and effects.
type propertyChecker struct {
	lastToken uint64
	pending   map[string][]uint64 // key -> refs queued, in enqueue order
	gone      map[string]bool     // "key/ref" removed by timeout or drop
}

func (p *propertyChecker) observe(c Command, res Result, effects []Effect) error {
	grant := func(tok uint64) error {
		if tok != p.lastToken+1 {
			return fmt.Errorf("token %d after %d", tok, p.lastToken)
		}
		p.lastToken = tok
		return nil
	}
	switch res.Status {
	case StatusGranted:
		if err := grant(res.Token); err != nil {
			return err
		}
	case StatusQueued:
		p.pending[c.Key] = append(p.pending[c.Key], c.Ref)
		delete(p.gone, fmt.Sprint(c.Key, "/", c.Ref))
	}
	for _, e := range effects {
		id := fmt.Sprint(e.Key, "/", e.Ref)
		q := p.pending[e.Key]
		switch e.Kind {
		case EffectGranted:
			if err := grant(e.Token); err != nil {
				return err
			}
			if p.gone[id] {
				return fmt.Errorf("waiter %s granted after timeout/drop", id)
			}
			if len(q) == 0 || q[0] != e.Ref {
				return fmt.Errorf("key %q: granted ref %d, FIFO head is %v", e.Key, e.Ref, q)
			}
			p.pending[e.Key] = q[1:]
		case EffectTimedOut, EffectDropped:
			i := slices.Index(q, e.Ref)
			if i < 0 {
				return fmt.Errorf("key %q: removed ref %d not pending %v", e.Key, e.Ref, q)
			}
			p.pending[e.Key] = slices.Delete(slices.Clone(q), i, i+1)
			p.gone[id] = true
		default:
			return fmt.Errorf("unknown effect %+v", e)
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
	genKeys   = []string{"a", "b", "c", "d"}
	genOwners = []string{"o1", "o2", "o3"}
)

func (g *gen) pick(xs []string) string { return xs[g.r.IntN(len(xs))] }

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
	case x < 40:
		c.Op = OpAcquire
		c.LeaseSec = uint32(1 + g.r.IntN(250))
		if g.r.IntN(3) > 0 {
			c.WaitMs = uint32(1 + g.r.IntN(MaxWaitMs))
		}
		g.nextRef++
		c.Ref = g.nextRef
		if len(q) > 0 && g.r.IntN(10) == 0 {
			c.Ref = q[g.r.IntN(len(q))].Ref // duplicate
		}
	case x < 62:
		c.Op = OpRelease
		c.Token = h.Token
		switch y := g.r.IntN(10); {
		case y < 6 && i >= 0:
			c.Owner = h.Owner
		case y < 8:
			c.Token = g.r.Uint64N(g.m.last + 2)
		}
	case x < 78:
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
	case x < 95:
		c.Op = OpDropWaiters
	default:
		// Invalid commands of every kind.
		c.Op = Op(1 + g.r.IntN(4))
		c.LeaseSec, c.WaitMs = uint32(1+g.r.IntN(250)), uint32(g.r.IntN(100))
		switch g.r.IntN(6) {
		case 0:
			c.Op = Op(6 + g.r.IntN(250))
		case 1:
			c.Key = [...]string{"", "a b", "\x00", string(make([]byte, 256))}[g.r.IntN(4)]
		case 2:
			c.Owner = [...]string{"", "o 1", "\xff"}[g.r.IntN(3)]
		case 3:
			c.Op, c.LeaseSec = OpAcquire, [...]uint32{0, 251, 1 << 31}[g.r.IntN(3)]
		case 4:
			c.Op, c.WaitMs = OpAcquire, MaxWaitMs+1+uint32(g.r.IntN(10))
		}
	}
	return c
}

func TestModel(t *testing.T) {
	seeds, steps := 300, 400
	if testing.Short() {
		seeds = 30
	}
	for seed := range uint64(seeds) {
		if err := runModel(t, seed, steps); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

func runModel(t *testing.T, seed uint64, steps int) (err error) {
	r := rand.New(rand.NewPCG(seed, 0x7469636b6574))
	m := &model{}
	g := &gen{r: r, m: m}
	s := New()
	p := &propertyChecker{pending: map[string][]uint64{}, gone: map[string]bool{}}
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
			if c := batch[len(batch)-1]; c.Op < OpAcquire || c.Op > OpDropWaiters {
				break // unknown ops cannot be encoded; apply them directly
			}
		}
		decoded := batch
		if last := batch[len(batch)-1]; last.Op >= OpAcquire && last.Op <= OpDropWaiters {
			var err error
			decoded, err = DecodeBatch(AppendBatch(nil, batch), nil)
			if err != nil {
				return fmt.Errorf("decode: %v", err)
			}
			for i := range batch {
				if decoded[i] != normalize(batch[i]) {
					return fmt.Errorf("codec: %+v became %+v", batch[i], decoded[i])
				}
			}
		}
		for i := range batch {
			// The generator looks at the model, so it must not run ahead:
			// commands of a batch were generated before any was applied,
			// just as a leader batches before the entry commits.
			wantRes, wantEff := m.apply(batch[i])
			var res Result
			res, effects = s.Apply(decoded[i], effects[:0])
			if res != wantRes || !slices.Equal(effects, wantEff) {
				return fmt.Errorf("step %d %+v:\nstate %+v %+v\nmodel %+v %+v", step, batch[i], res, effects, wantRes, wantEff)
			}
			if err := p.observe(batch[i], res, effects); err != nil {
				return fmt.Errorf("step %d %+v: %v", step, batch[i], err)
			}
			if err := m.compare(s, genKeys); err != nil {
				return fmt.Errorf("step %d %+v: %v", step, batch[i], err)
			}
			if err := checkInvariants(s); err != nil {
				return fmt.Errorf("step %d: %v", step, err)
			}
			for _, k := range genKeys {
				if _, held := s.Holder(k); !held && len(s.Waiters(k)) > 0 {
					return fmt.Errorf("step %d: key %q has waiters but no holder", step, k)
				}
			}
			if s.LastToken() != p.lastToken {
				return fmt.Errorf("step %d: last token %d, grants seen up to %d", step, s.LastToken(), p.lastToken)
			}
			step++
		}
		if r.IntN(20) == 0 {
			// Continue on the restored copy: a follower that restored a
			// snapshot must behave exactly like one that replayed the log.
			s = checkSnapshotRoundTrip(t, s)
		}
	}
	return nil
}
