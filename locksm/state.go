package locksm

import (
	"math"
	"slices"
	"sync"
	"unique"
)

// State is the whole replicated lock table. The zero value is not usable;
// call New. A State is not safe for concurrent use: the caller (the Raft FSM
// in cluster/) serialises Apply and the read methods.
type State struct {
	// keys holds an entry for every held key and only for those: a key whose
	// holder goes away with an empty queue is deleted, so memory follows the
	// number of held keys, not the number of keys ever seen.
	keys map[string]*entry
	// queued is the subset of keys whose queue is non-empty, so that
	// OpDropWaiters costs O(waiters) rather than O(held keys) when a new
	// leader proposes it with a million held keys.
	queued map[string]*entry
	// last is the highest token ever issued. It only grows; snapshots carry
	// it, so a restored replica continues above every token it ever issued.
	last    uint64
	waiting int
	// spare recycles entries of released keys: an uncontended
	// acquire/release cycle then allocates nothing in steady state.
	spare []*entry
	// gen is the current generation: Freeze increments it. An entry whose
	// gen is older may be shared with a Frozen view and is never written
	// again; own replaces it with a private copy first (copy-on-write).
	// It wraps after 2^32 freezes, by when no view of that age exists.
	gen uint32
}

// entry is one held key. Invariant: an entry exists iff the key is held, so
// a non-empty queue always has a holder in front of it and a free key can
// never be taken by someone who arrived after a waiter.
//
// The holder's fields are inline rather than a Holder, so that gen fits in
// what would be Holder's padding: 64 bytes, the allocator's 64-byte class,
// instead of 72 in the 80-byte class (16 MB more at a million keys).
type entry struct {
	owner     string
	token     uint64
	grantedAt int64
	leaseSec  uint32
	// gen is the State generation this entry was created or copied in.
	gen uint32
	// queue is FIFO, head first. The head is popped by re-slicing (q[1:]);
	// append reallocates once capacity runs out and then copies only live
	// waiters, so the popped prefix is reclaimed without an O(n) shift per
	// hand-off.
	queue []Waiter
}

func (e *entry) holder() Holder {
	return Holder{Owner: e.owner, Token: e.token, LeaseSec: e.leaseSec, GrantedAt: e.grantedAt}
}

func (e *entry) setHolder(h Holder) {
	e.owner, e.token, e.leaseSec, e.grantedAt = h.Owner, h.Token, h.LeaseSec, h.GrantedAt
}

// intern returns the one shared copy of owner. An owner (a sidecar
// connection) typically holds many keys; without interning every holding
// keeps its own copy of the string: 8 MB more at a million keys held by a
// few owners (BenchmarkGCWith1M's heap).
func intern(owner string) string { return unique.Make(owner).Value() }

// maxSpare bounds the recycled entries kept after a burst of releases; more
// would just pin memory the GC could reclaim.
const maxSpare = 1024

// New returns an empty table whose token counter has issued nothing yet
// (the first grant gets token 1).
func New() *State {
	return &State{
		keys:   make(map[string]*entry),
		queued: make(map[string]*entry),
	}
}

// ValidateCommand reports the first stateless reason Apply would reject cmd
// for (nil if none), so a leader can refuse a bad request without proposing
// it. Only the fields cmd.Op uses are checked; the others are ignored by
// Apply and not carried by the batch encoding. Tokens are not checked: 0 is
// never issued, so a release or expiry naming it simply matches nothing.
func ValidateCommand(cmd Command) error {
	switch cmd.Op {
	case OpAcquire:
		if err := ValidateKey(cmd.Key); err != nil {
			return err
		}
		if err := ValidateOwner(cmd.Owner); err != nil {
			return err
		}
		if cmd.LeaseSec < MinLeaseSec || cmd.LeaseSec > MaxLeaseSec {
			return ErrInvalidLease
		}
		if cmd.WaitMs > MaxWaitMs {
			return ErrInvalidWait
		}
		return nil
	case OpRelease:
		if err := ValidateKey(cmd.Key); err != nil {
			return err
		}
		return ValidateOwner(cmd.Owner)
	case OpExpire, OpCancelWait:
		return ValidateKey(cmd.Key)
	case OpDropWaiters:
		return nil
	default:
		return ErrInvalidCommand
	}
}

// Apply applies one command, appending any effects it owes to effects, and
// returns the command's own result and the extended effects slice. Effects
// come in a deterministic order. Apply never panics on a bad command: it
// returns StatusRejected with a sentinel error and leaves the state as it was.
//
// Apply never looks at a clock and never decides that a lease ran out: cmd.Now
// is only recorded (GrantedAt, EnqueuedAt). See the package documentation.
func (s *State) Apply(cmd Command, effects []Effect) (Result, []Effect) {
	if err := ValidateCommand(cmd); err != nil {
		return Result{Status: StatusRejected, Err: err}, effects
	}
	switch cmd.Op {
	case OpAcquire:
		return s.acquire(cmd), effects
	case OpRelease:
		return s.release(cmd, effects)
	case OpExpire:
		return s.expire(cmd, effects)
	case OpCancelWait:
		return s.cancelWait(cmd, effects)
	default: // OpDropWaiters; ValidateCommand rejected everything else
		return s.dropWaiters(effects)
	}
}

func (s *State) acquire(cmd Command) Result {
	e := s.keys[cmd.Key]
	if e == nil {
		if s.last == math.MaxUint64 {
			return Result{Status: StatusRejected, Err: ErrTokensExhausted}
		}
		s.last++
		e = s.newEntry()
		e.setHolder(Holder{Owner: intern(cmd.Owner), Token: s.last, LeaseSec: cmd.LeaseSec, GrantedAt: cmd.Now})
		s.keys[cmd.Key] = e
		return Result{Status: StatusGranted, Token: s.last}
	}
	// Held, possibly by cmd.Owner itself: not reentrant, so no owner check.
	if cmd.WaitMs == 0 {
		return Result{Status: StatusBusy}
	}
	// Linear scan: queues are per key and short in practice, and a slice
	// keeps FIFO order and snapshots trivial. Revisit if one key ever has
	// thousands of waiters.
	for i := range e.queue {
		if e.queue[i].Ref == cmd.Ref {
			return Result{Status: StatusRejected, Err: ErrDuplicateRef}
		}
	}
	e = s.own(cmd.Key, e)
	if len(e.queue) == 0 {
		s.queued[cmd.Key] = e
	}
	e.queue = append(e.queue, Waiter{
		Owner: intern(cmd.Owner), Ref: cmd.Ref, LeaseSec: cmd.LeaseSec, WaitMs: cmd.WaitMs, EnqueuedAt: cmd.Now,
	})
	s.waiting++
	return Result{Status: StatusQueued}
}

func (s *State) release(cmd Command, effects []Effect) (Result, []Effect) {
	e := s.keys[cmd.Key]
	switch {
	case e == nil:
		return Result{Status: StatusRejected, Err: ErrNotHeld}, effects
	case e.token != cmd.Token:
		return Result{Status: StatusRejected, Err: ErrTokenMismatch}, effects
	case e.owner != cmd.Owner:
		return Result{Status: StatusRejected, Err: ErrOwnerMismatch}, effects
	}
	return Result{Status: StatusReleased}, s.handOff(cmd.Key, e, cmd.Now, effects)
}

// expire deliberately ignores the owner: the leader's lease timer knows only
// (key, token), and the token alone identifies one holding.
func (s *State) expire(cmd Command, effects []Effect) (Result, []Effect) {
	e := s.keys[cmd.Key]
	if e == nil || e.token != cmd.Token {
		// Stale: released, expired or handed off before this committed.
		return Result{Status: StatusNoop}, effects
	}
	return Result{Status: StatusExpired}, s.handOff(cmd.Key, e, cmd.Now, effects)
}

// handOff ends the current holding of key. The queue head, if any, becomes
// holder in the same command so the key is never observably free while
// someone waits (nobody can cut the line); otherwise the entry is deleted.
func (s *State) handOff(key string, e *entry, now int64, effects []Effect) []Effect {
	if len(e.queue) == 0 {
		delete(s.keys, key)
		s.recycle(e)
		return effects
	}
	if s.last == math.MaxUint64 {
		// No token left to hand over (only reachable from a crafted
		// snapshot). Granting with a reused token would break fencing, so
		// free the key and tell every waiter it will never be granted.
		for _, w := range e.queue {
			effects = append(effects, Effect{Kind: EffectDropped, Key: key, Owner: w.Owner, Ref: w.Ref})
		}
		s.waiting -= len(e.queue)
		delete(s.queued, key)
		delete(s.keys, key)
		s.recycle(e)
		return effects
	}
	e = s.own(key, e)
	w := e.queue[0]
	e.queue[0] = Waiter{} // let the GC have the owner string
	e.queue = e.queue[1:]
	s.waiting--
	if len(e.queue) == 0 {
		e.queue = nil
		delete(s.queued, key)
	}
	s.last++
	e.setHolder(Holder{Owner: w.Owner, Token: s.last, LeaseSec: w.LeaseSec, GrantedAt: now})
	return append(effects, Effect{
		Kind: EffectGranted, Key: key, Owner: w.Owner, Ref: w.Ref, Token: s.last, LeaseSec: w.LeaseSec,
	})
}

func (s *State) cancelWait(cmd Command, effects []Effect) (Result, []Effect) {
	e := s.keys[cmd.Key]
	if e == nil {
		return Result{Status: StatusNoop}, effects
	}
	i := slices.IndexFunc(e.queue, func(w Waiter) bool { return w.Ref == cmd.Ref })
	if i < 0 {
		// Already granted (hand-off won the race) or already gone.
		return Result{Status: StatusNoop}, effects
	}
	e = s.own(cmd.Key, e)
	w := e.queue[i]
	e.queue = slices.Delete(e.queue, i, i+1) // keeps FIFO order, zeroes the tail
	s.waiting--
	if len(e.queue) == 0 {
		e.queue = nil
		delete(s.queued, cmd.Key)
	}
	return Result{Status: StatusCanceled}, append(effects, Effect{
		Kind: EffectTimedOut, Key: cmd.Key, Owner: w.Owner, Ref: w.Ref,
	})
}

func (s *State) dropWaiters(effects []Effect) (Result, []Effect) {
	keys := make([]string, 0, len(s.queued))
	for k := range s.queued {
		keys = append(keys, k)
	}
	slices.Sort(keys) // map order must not leak into the effects
	effects = slices.Grow(effects, s.waiting)
	for _, k := range keys {
		e := s.queued[k]
		for _, w := range e.queue {
			effects = append(effects, Effect{Kind: EffectDropped, Key: k, Owner: w.Owner, Ref: w.Ref})
		}
		s.own(k, e).queue = nil
	}
	clear(s.queued)
	s.waiting = 0
	return Result{Status: StatusDropped}, effects
}

func (s *State) newEntry() *entry {
	if n := len(s.spare); n > 0 {
		e := s.spare[n-1]
		s.spare[n-1] = nil
		s.spare = s.spare[:n-1]
		e.gen = s.gen
		return e
	}
	return &entry{gen: s.gen}
}

// recycle keeps e for reuse unless a Frozen view may still read it.
func (s *State) recycle(e *entry) {
	if e.gen != s.gen {
		return
	}
	*e = entry{}
	if len(s.spare) < maxSpare {
		s.spare = append(s.spare, e)
	}
}

// own returns key's entry e in a form this State may write: e itself if it
// was created or copied since the last Freeze, otherwise a private copy
// (queue included) that replaces e in the table, leaving e as the frozen
// views see it.
func (s *State) own(key string, e *entry) *entry {
	if e.gen == s.gen {
		return e
	}
	c := new(entry)
	*c = *e
	c.queue, c.gen = slices.Clone(e.queue), s.gen
	s.keys[key] = c
	if len(e.queue) > 0 {
		s.queued[key] = c
	}
	return c
}

// Frozen is the table as it was when Freeze was called. Later Applies to
// the State do not change it, so it may be read (WriteSnapshot) from
// another goroutine while the State goes on applying: the Raft FSM freezes
// in Snapshot, on the apply goroutine, and writes the bytes in Persist,
// concurrently with new applies.
type Frozen struct {
	sorted sync.Once   // the first WriteSnapshot sorts keys in place
	keys   []frozenKey // map order until sorted
	last   uint64
}

type frozenKey struct {
	key string
	e   *entry
}

// Freeze returns a Frozen view of the current table. It lists the held
// keys with their entries (O(held keys), a key and a pointer each: about
// 30 ms for a million here); every entry then becomes read-only for the State,
// which copies an entry the first time it changes it afterwards.
func (s *State) Freeze() *Frozen {
	s.gen++
	keys := make([]frozenKey, 0, len(s.keys))
	for k, e := range s.keys {
		keys = append(keys, frozenKey{k, e})
	}
	return &Frozen{keys: keys, last: s.last}
}

// NumHeld is the number of held keys in the view.
func (f *Frozen) NumHeld() int { return len(f.keys) }

// LastToken is the highest token ever issued (0 before the first grant).
func (s *State) LastToken() uint64 { return s.last }

// Holder returns the holder of key, if any.
func (s *State) Holder(key string) (Holder, bool) {
	if e := s.keys[key]; e != nil {
		return e.holder(), true
	}
	return Holder{}, false
}

// Waiters returns a copy of key's queue, head first (nil if none).
func (s *State) Waiters(key string) []Waiter {
	if e := s.keys[key]; e != nil && len(e.queue) > 0 {
		return slices.Clone(e.queue)
	}
	return nil
}

// RaiseTokenFloor makes the next token issued greater than floor (it never
// lowers the counter). A cluster calls it once, through a committed log
// entry, when its fencing domain is created, so that a new domain's tokens
// start above an old one's.
func (s *State) RaiseTokenFloor(floor uint64) {
	if floor > s.last {
		s.last = floor
	}
}

// QueueLen is the length of key's queue (0 if the key is free).
func (s *State) QueueLen(key string) int {
	if e := s.keys[key]; e != nil {
		return len(e.queue)
	}
	return 0
}

// NumHeld is the number of held keys; NumWaiting the number of queued waiters.
func (s *State) NumHeld() int { return len(s.keys) }

// NumWaiting is the number of queued waiters over all keys.
func (s *State) NumWaiting() int { return s.waiting }

// RangeHolders calls fn for every held key in ascending key order until fn
// returns false. The keys are sorted on each call (O(n log n)); it is meant
// for inspection and for the leader rebuilding its lease timers, not for a
// hot path. fn may apply commands: the keys to visit are fixed when the call
// starts and each is looked up when its turn comes, so fn sees current
// holders and a key freed meanwhile is skipped.
func (s *State) RangeHolders(fn func(key string, h Holder) bool) {
	for _, k := range s.sortedKeys() {
		e := s.keys[k]
		if e == nil {
			continue
		}
		if !fn(k, e.holder()) {
			return
		}
	}
}

func (s *State) sortedKeys() []string {
	keys := make([]string, 0, len(s.keys))
	for k := range s.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
