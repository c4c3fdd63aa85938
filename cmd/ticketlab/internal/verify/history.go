package verify

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"sync"
)

// Operation kinds in a history.
const (
	KindAcquire = "acquire"
	KindRelease = "release"
	KindWrite   = "write" // a fenced write to the protected resource
	KindClose   = "close" // the worker's sidecar session ended (its locks were released)
	KindHeld    = "held"  // a HELD observation of the session's locks around a block
	KindFault   = "fault" // a nemesis action
	// Issue 19: an EXTEND of a held lock (Acq, Token, LeaseMs: the new
	// lease; Inv its send, Cmp its reply), a `! LOST` event received (Token,
	// Keys, Reason; Inv = Cmp = when it was read) and a holder's stall past
	// its lease (Inv..Cmp, Acq).
	KindExtend = "extend"
	KindLost   = "lost"
	KindStall  = "stall"
	// KindEnd marks when the harness told the workload to stop (Inv): a
	// request still pending then may be cut short by its worker
	// (INDETERMINATE, not the cluster's answer).
	KindEnd = "end"
	// KindPosition is a `! POSITION` event read (issue 41): Acq is the
	// acquire (or permit) it names (0: no request of the session that
	// waits), Key its key, N the place told, EstSec the estimate in whole
	// seconds (-1: "-", unknown), Inv = Cmp = when it was read; After is
	// "reply" when it came after its request's reply (the protocol
	// forbids it). checker_position.go judges them.
	KindPosition = "position"
)

// Results of an operation.
const (
	ResOK            = "ok"
	ResBusy          = "busy"
	ResTimeout       = "timeout"
	ResIndeterminate = "indeterminate"
	ResRejected      = "rejected" // write refused by the fencing check
	ResError         = "error"    // a definite error; Err has the code
)

// Op is one line of the history file (JSON lines). Times are Unix
// nanoseconds of the machine's wall clock, which the harness and the
// worker processes share (the nemesis shifts only the nodes' stamped
// clocks, never the machine's).
type Op struct {
	ID     int64  `json:"id"`
	Worker int    `json:"worker"`
	Proc   bool   `json:"proc,omitempty"` // reported by a worker process
	Kind   string `json:"kind"`
	Key    string `json:"key,omitempty"`
	// Keys are every key of a block (2..4 distinct keys, Keys[0] == Key)
	// for its acquire, write and release (Key then names the key the
	// RELEASE named, any of the block's); nil for one key. A held
	// observation's Keys are the keys HELD listed under Token.
	Keys []string `json:"keys,omitempty"`
	// LeaseMs and WaitMs are an acquire's arguments.
	LeaseMs int64 `json:"lease_ms,omitempty"`
	WaitMs  int64 `json:"wait_ms,omitempty"`
	// Token: the token granted (acquire) or used (release, write).
	Token  uint64 `json:"token,omitempty"`
	Inv    int64  `json:"inv"`
	Cmp    int64  `json:"cmp"`
	Result string `json:"result,omitempty"`
	Err    string `json:"err,omitempty"`
	// Acq is the acquire a release or write belongs to.
	Acq int64 `json:"acq,omitempty"`
	// Late marks a write made on purpose after the lease ran out.
	Late bool `json:"late,omitempty"`
	// After says when a held observation was made: "grant" (right after
	// the block's grant) or "release" (right after its release answered).
	After string `json:"after,omitempty"`
	// Fault, Target, Detail describe a nemesis action (Kind "fault");
	// Inv..Cmp is when it was in force.
	Fault  string `json:"fault,omitempty"`
	Target string `json:"target,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Reason is a lost event's reason (expired, moved, compensated).
	Reason string `json:"reason,omitempty"`
	// Conn numbers the worker's sidecar sessions (1, 2, ... as it
	// reconnects) for the extenders, whose checks are per session.
	Conn int `json:"conn,omitempty"`
	// Queued is when the worker read the `! QUEUED` event of this acquire
	// (Unix ns; 0: none came): by then the cluster had committed it into
	// the queue of every key of it, so an acquire of one of those keys
	// sent later by anyone stands behind it (unixapi/PROTOCOL.md, "Queued:
	// your ACQUIRE is in line"). The per-key FIFO check (checker_fifo.go)
	// orders waiters by it.
	Queued int64 `json:"queued,omitempty"`
	// Sidecar is the sidecar (1-based) whose socket the worker's session
	// used, stamped by the harness; on a kill-sidecar fault, the sidecar
	// killed. 0: unknown (a history of an older lab).
	Sidecar int `json:"sidecar,omitempty"`
	// Slot is a permit's slot (issue 41: KindPermit and its write, extend
	// and release; with Key its fencing domain); N a PERMITS op's n.
	Slot int `json:"slot,omitempty"`
	N    int `json:"n,omitempty"`
	// Proto is the unix protocol version the session of an acquire or
	// permit agreed (lineConn: 7 tells places in line, issue 41; 0: a
	// session that does not record it, the Go client's).
	Proto int `json:"proto,omitempty"`
	// EstSec is a position's estimate (KindPosition; -1: unknown).
	EstSec int64 `json:"est_s,omitempty"`
}

// opKeys returns every key op is about: a block's keys, or its one key.
func opKeys(op Op) []string {
	if len(op.Keys) > 0 {
		return op.Keys
	}
	return []string{op.Key}
}

// isBlock reports whether op is about a block (2 or more keys).
func isBlock(op Op) bool { return len(op.Keys) > 1 }

// History collects operations and appends each to a JSON-lines file as it
// completes. Safe for concurrent use.
type History struct {
	mu  sync.Mutex
	ops []Op
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
}

// NewHistory creates (truncates) the history file at path.
func NewHistory(path string) (*History, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriter(f)
	return &History{f: f, w: w, enc: json.NewEncoder(w)}, nil
}

// Add records op.
func (h *History) Add(op Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
	if h.enc != nil {
		_ = h.enc.Encode(op)
	}
}

// Ops returns a copy of every operation so far, sorted by invocation.
func (h *History) Ops() []Op {
	h.mu.Lock()
	out := append([]Op(nil), h.ops...)
	h.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Inv < out[j].Inv })
	return out
}

// Close flushes and closes the file.
func (h *History) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.f == nil {
		return nil
	}
	err := h.w.Flush()
	if cerr := h.f.Close(); err == nil {
		err = cerr
	}
	h.f, h.enc = nil, nil
	return err
}

// ReadHistory reads a history file written by History (for re-checking a
// run with Check).
func ReadHistory(path string) ([]Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []Op
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var op Op
		if err := json.Unmarshal(sc.Bytes(), &op); err != nil {
			return nil, fmt.Errorf("verify: %s line %d: %w", path, n, err)
		}
		ops = append(ops, op)
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Inv < ops[j].Inv })
	return ops, sc.Err()
}

// RecentGrants returns the granted acquires among the last n operations
// added (in the order added), for the nemesis to find fresh grants without
// copying the whole history.
func (h *History) RecentGrants(n int) []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Op
	for _, op := range h.ops[max(0, len(h.ops)-n):] {
		if op.Kind == KindAcquire && op.Result == ResOK {
			out = append(out, op)
		}
	}
	return out
}
