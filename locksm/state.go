package locksm

import "io"

// State is the whole replicated lock table. The zero value is not usable;
// call New. A State is not safe for concurrent use: the caller (the Raft FSM
// in cluster/) serialises Apply and the read methods.
type State struct {
	// TODO(helper): implement.
}

// New returns an empty table whose token counter has issued nothing yet
// (the first grant gets token 1).
func New() *State { panic("TODO") }

// Apply applies one command, appending any effects it owes to effects, and
// returns the command's own result and the extended effects slice. Effects
// come in a deterministic order. Apply never panics on a bad command: it
// returns StatusRejected with a sentinel error and leaves the state as it was.
func (s *State) Apply(cmd Command, effects []Effect) (Result, []Effect) { panic("TODO") }

// LastToken is the highest token ever issued (0 before the first grant).
func (s *State) LastToken() uint64 { panic("TODO") }

// Holder returns the holder of key, if any.
func (s *State) Holder(key string) (Holder, bool) { panic("TODO") }

// Waiters returns a copy of key's queue, head first.
func (s *State) Waiters(key string) []Waiter { panic("TODO") }

// NumHeld is the number of held keys; NumWaiting the number of queued waiters.
func (s *State) NumHeld() int    { panic("TODO") }
func (s *State) NumWaiting() int { panic("TODO") }

// RangeHolders calls fn for every held key in ascending key order until fn
// returns false.
func (s *State) RangeHolders(fn func(key string, h Holder) bool) { panic("TODO") }

// WriteSnapshot writes the whole state (token counter, holders, queues in
// order) to w in a versioned, deterministic binary form.
func (s *State) WriteSnapshot(w io.Writer) error { panic("TODO") }

// ReadSnapshot reads a state written by WriteSnapshot. Corrupt input gives
// an error wrapping ErrCorruptSnapshot, never a panic or an unbounded
// allocation.
func ReadSnapshot(r io.Reader) (*State, error) { panic("TODO") }
