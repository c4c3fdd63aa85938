package verify

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The lock model for porcupine, one partition per key.
//
// A lease makes a holding end by itself, invisibly: the model treats that
// (and every release nobody saw, such as the sidecar releasing a closed
// session's locks or compensating an abandoned grant) as an expiry event
// that may happen at any time τ ≥ the holding's earliest possible end. It is
// taken lazily, only when a later operation's result needs the key free, and
// then τ must also fit before that operation's return: the state carries the
// latest such τ so far (floor), and every later operation must return after
// it (linearization points are non-decreasing).
//
// An INDETERMINATE acquire may or may not have been granted (the
// nondeterministic model keeps both); if granted, its token is unknown and,
// since the sidecar or the node compensates such grants, the holding may
// end at any time. Its return time is "never", so it may take effect at any
// point after its invocation.

// lockState is the model's state for one key.
type lockState struct {
	tok    uint64 // holder's token; 0: free; unknownTok: an unknown holder
	worker int    // holder's worker (-1 for none or unknown)
	exp    int64  // earliest time the holding may have ended unseen
	last   uint64 // highest token known granted on this key
	floor  int64  // latest expiry time assumed so far
}

const unknownTok = math.MaxUint64

// never is the return time of an operation whose outcome is unknown.
const never = math.MaxInt64

type lockInput struct {
	kind    string // acquire, release, close
	worker  int
	token   uint64 // release
	leaseNs int64  // acquire
	call    int64
}

type lockOutput struct {
	result string // ok, busy, timeout, indeterminate, error (definite)
	token  uint64 // acquire ok
	ret    int64  // return time; never for indeterminate
}

func (s lockState) held() bool { return s.tok != 0 }

// expire ends the holding at some τ ≥ max(floor, exp) no later than ret.
func (s lockState) expire(ret int64) (lockState, bool) {
	if !s.held() {
		return s, true
	}
	tau := max(s.floor, s.exp)
	if tau > ret {
		return s, false
	}
	return lockState{worker: -1, last: s.last, floor: tau}, true
}

func lockStep(st, in, out interface{}) []interface{} {
	s := st.(lockState)
	i := in.(lockInput)
	o := out.(lockOutput)
	if o.ret < s.floor {
		return nil
	}
	switch i.kind {
	case KindAcquire:
		switch o.result {
		case ResOK:
			free, ok := s.expire(o.ret)
			if !ok || o.token <= free.last {
				return nil
			}
			return []interface{}{lockState{tok: o.token, worker: i.worker, exp: i.call + i.leaseNs, last: o.token, floor: free.floor}}
		case ResBusy, ResTimeout:
			if !s.held() {
				return nil
			}
			return []interface{}{s}
		case ResIndeterminate:
			free, _ := s.expire(never)
			return []interface{}{s, lockState{tok: unknownTok, worker: -1, exp: i.call, last: s.last, floor: free.floor}}
		}
	case KindRelease:
		mine := s.tok == i.token
		switch o.result {
		case ResOK:
			if !mine {
				return nil
			}
			return []interface{}{lockState{worker: -1, last: s.last, floor: s.floor}}
		case ResError: // not_held, token_mismatch, owner_mismatch: not ours (any more)
			if !mine {
				return []interface{}{s}
			}
			free, ok := s.expire(o.ret)
			if !ok {
				return nil
			}
			return []interface{}{free}
		case ResIndeterminate:
			if !mine {
				return []interface{}{s}
			}
			return []interface{}{s, lockState{worker: -1, last: s.last, floor: s.floor}}
		}
	case KindClose:
		// The sidecar releases the session's locks at some point after this.
		if s.held() && s.worker == i.worker {
			return []interface{}{s, lockState{worker: -1, last: s.last, floor: s.floor}}
		}
		return []interface{}{s}
	}
	return nil
}

func lockModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{lockState{worker: -1}} },
		Step: lockStep,
		DescribeOperation: func(in, out interface{}) string {
			i, o := in.(lockInput), out.(lockOutput)
			switch i.kind {
			case KindAcquire:
				if o.result == ResOK {
					return fmt.Sprintf("w%d acquire lease %ds -> ok %d", i.worker, i.leaseNs/1e9, o.token)
				}
				return fmt.Sprintf("w%d acquire -> %s", i.worker, o.result)
			case KindRelease:
				return fmt.Sprintf("w%d release %d -> %s", i.worker, i.token, o.result)
			}
			return fmt.Sprintf("w%d session closed", i.worker)
		},
		DescribeState: func(st interface{}) string {
			s := st.(lockState)
			switch {
			case s.tok == 0:
				return fmt.Sprintf("free (last %d)", s.last)
			case s.tok == unknownTok:
				return fmt.Sprintf("maybe held by an unknown grant (last %d)", s.last)
			}
			return fmt.Sprintf("held by w%d token %d (last %d)", s.worker, s.tok, s.last)
		},
	}
	return nm.ToModel()
}

// porcupineHistory turns the lock operations of a history into porcupine
// operations, partitioned by key. Definite errors that executed nothing
// (unavailable, moved, no_quorum, ...) are left out: they are legal in any
// state and change none.
//
// An INDETERMINATE operation is given until window after its completion to
// take effect (never, if window is 0). The harness keeps every fault
// bounded (a few seconds, one at a time), so a request still somewhere in
// the system — in a paused node's socket buffer, or in a log entry a new
// leader commits in its barrier — lands well within that window.
func porcupineHistory(ops []Op, window time.Duration) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	add := func(key string, op porcupine.Operation) {
		if _, ok := byKey[key]; !ok {
			keys = append(keys, key)
		}
		byKey[key] = append(byKey[key], op)
	}
	var closes []Op
	for _, op := range ops {
		ret := op.Cmp
		if op.Result == ResIndeterminate {
			ret = never
			if window > 0 {
				ret = op.Cmp + int64(window)
			}
		}
		switch op.Kind {
		case KindAcquire:
			if op.Result == ResError {
				continue
			}
			add(op.Key, porcupine.Operation{ClientId: op.Worker,
				Input:  lockInput{kind: KindAcquire, worker: op.Worker, leaseNs: op.LeaseMs * 1e6, call: op.Inv},
				Output: lockOutput{result: op.Result, token: op.Token, ret: ret}, Call: op.Inv, Return: ret})
		case KindRelease:
			if op.Result == ResError && !definiteReleaseError(op.Err) {
				continue
			}
			add(op.Key, porcupine.Operation{ClientId: op.Worker,
				Input:  lockInput{kind: KindRelease, worker: op.Worker, token: op.Token, call: op.Inv},
				Output: lockOutput{result: op.Result, ret: ret}, Call: op.Inv, Return: ret})
		case KindClose:
			closes = append(closes, op)
		}
	}
	sort.Strings(keys)
	var out [][]porcupine.Operation
	for _, k := range keys {
		part := byKey[k]
		for _, c := range closes {
			// The sidecar releases the session's locks within its release
			// deadline (or the lease ends them, which the model allows
			// anyway), so the effect lands within the window too.
			ret := int64(never)
			if window > 0 {
				ret = c.Cmp + int64(window)
			}
			part = append(part, porcupine.Operation{ClientId: c.Worker,
				Input: lockInput{kind: KindClose, worker: c.Worker, call: c.Inv}, Output: lockOutput{result: ResIndeterminate, ret: ret},
				Call: c.Inv, Return: ret})
		}
		// "never" as a return time: one past the end keeps the
		// visualization readable and means the same to the checker.
		end := int64(0)
		for _, op := range part {
			if op.Return != never {
				end = max(end, op.Return)
			}
			end = max(end, op.Call)
		}
		for i := range part {
			if part[i].Return == never {
				part[i].Return = end + 1
			}
		}
		out = append(out, part)
	}
	return out
}

// definiteReleaseError: the release was evaluated and found the key not
// held under this token and owner.
func definiteReleaseError(code string) bool {
	return code == "not_held" || code == "token_mismatch" || code == "owner_mismatch"
}
