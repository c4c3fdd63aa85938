package ticketing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"ticketing/cluster/testkit"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/local"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// sidecarSocket returns the socket to test against: $TICKETING_SOCKET if set
// (e.g. a running `ticketing dev`), else a real 3-node cluster, a real
// Broker and a unixapi server started in this process for the test.
func sidecarSocket(t *testing.T) string {
	t.Helper()
	if s := os.Getenv("TICKETING_SOCKET"); s != "" {
		return s
	}
	c, err := local.Start(local.Options{Dir: t.TempDir(), Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// The broker learns the leader when its connections come up; start it
	// once there is one, as `ticketing dev` does.
	lctx, lcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer lcancel()
	if _, err := c.Leader(lctx); err != nil {
		t.Fatal(err)
	}
	bcfg := sidecar.DefaultConfig()
	bcfg.Addrs, bcfg.Secret, bcfg.ClusterID, bcfg.Logger = c.ClientAddrs(), c.ClientSecret, c.ClusterID, slog.New(slog.DiscardHandler)
	b, err := sidecar.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	dir, err := os.MkdirTemp("", "tkc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ucfg := unixapi.DefaultConfig()
	ucfg.Path, ucfg.Logger = filepath.Join(dir, "s"), slog.New(slog.DiscardHandler)
	srv, err := unixapi.Listen(ucfg, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		cl, err := ticketing.Dial(ctx, ucfg.Path)
		if err != nil {
			t.Fatal(err)
		}
		info, err := cl.Info(ctx)
		cl.Close()
		if err == nil && info.Leader != "" {
			return ucfg.Path
		}
		if ctx.Err() != nil {
			t.Fatalf("sidecar never knew a leader: %q %v", info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// scenario is one scenario of the suite.
type scenario struct {
	Name  string                       `json:"name"`
	Keys  map[string]map[string]any    `json:"keys"`
	Steps []map[string]json.RawMessage `json:"steps"`
}

// stalls reports whether the scenario stops this process (op stall).
func (sc scenario) stalls() bool { return sc.has("stall") }

// restarts reports whether the scenario restarts the sidecar (op
// restart_sidecar).
func (sc scenario) restarts() bool { return sc.has("restart_sidecar") }

func (sc scenario) has(op string) bool {
	for _, st := range sc.Steps {
		if str(st, "op") == op {
			return true
		}
	}
	return false
}

// loadSuite reads the shared scenarios.
func loadSuite(t *testing.T) []scenario {
	data, err := os.ReadFile("../conformance/scenarios.json")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("no clients/conformance/scenarios.json")
	}
	if err != nil {
		t.Fatal(err)
	}
	var suite struct {
		Format    int        `json:"format"`
		Scenarios []scenario `json:"scenarios"`
	}
	if err := json.Unmarshal(data, &suite); err != nil {
		t.Fatal(err)
	}
	if suite.Format != 1 {
		t.Fatalf("scenarios format %d; this runner knows 1", suite.Format)
	}
	return suite.Scenarios
}

// The shared behavioural suite of every client library, except the
// scenarios that stop this process (TestConformanceStalled runs those).
func TestConformance(t *testing.T) {
	var scs []scenario
	for _, sc := range loadSuite(t) {
		if !sc.stalls() && !sc.restarts() {
			scs = append(scs, sc)
		}
	}
	runSuite(t, sidecarSocket(t), nil, scs)
}

// The scenarios of the suite that restart the sidecar (op
// restart_sidecar): against a `ticketing dev` process of this test's own,
// which the runner stops and starts again on the same socket, whatever
// $TICKETING_SOCKET says (a sidecar the test did not start, it cannot
// restart).
func TestConformanceRestarts(t *testing.T) {
	var scs []scenario
	for _, sc := range loadSuite(t) {
		if sc.restarts() {
			scs = append(scs, sc)
		}
	}
	if len(scs) == 0 {
		t.Fatal("no scenario restarts the sidecar")
	}
	d := startDev(t)
	runSuite(t, d.sock, d.restart, scs)
}

// The scenarios of the suite that stop this process with SIGSTOP (op
// stall), as a stalled holder would be. The sidecar and the cluster must
// keep running meanwhile, so they are a `ticketing dev` process
// ($TICKETING_SOCKET if set, else devSocket), never the in-process one of
// sidecarSocket; and this test runs alone (no test of this package is
// parallel), so nothing else with timing assumptions is stopped with it.
func TestConformanceStalled(t *testing.T) {
	var scs []scenario
	for _, sc := range loadSuite(t) {
		if sc.stalls() && !sc.restarts() {
			scs = append(scs, sc)
		}
	}
	if len(scs) == 0 {
		t.Skip("no scenario stalls")
	}
	sock := os.Getenv("TICKETING_SOCKET")
	if sock == "" {
		sock = devSocket(t)
	}
	runSuite(t, sock, nil, scs)
}

// runSuite runs scenarios against the sidecar at sock, each as a subtest;
// restart restarts that sidecar (nil: the scenarios do not).
func runSuite(t *testing.T, sock string, restart func(), scs []scenario) {
	run := time.Now().UnixNano()
	for _, sc := range scs {
		t.Run(sc.Name, func(t *testing.T) {
			r := &runner{t: t, sock: sock, restart: restart, conns: map[string]*ticketing.Client{}, tokens: map[string]uint64{}, slots: map[string]int{},
				locks: map[string]*ticketing.Lock{}, since: map[*ticketing.Lock]time.Time{}, bg: map[string]chan result{}, queued: map[string]chan struct{}{},
				prefix: fmt.Sprintf("go/%d/%s/", run, sc.Name), pads: map[string]int{}}
			for name, opts := range sc.Keys {
				if p, ok := opts["pad_to"].(float64); ok {
					r.pads[name] = int(p)
				}
			}
			defer r.closeAll()
			for i, st := range sc.Steps {
				r.step(i, st)
			}
		})
	}
}

type runner struct {
	t       *testing.T
	sock    string
	restart func() // restarts the sidecar at sock
	prefix  string
	pads    map[string]int
	conns   map[string]*ticketing.Client
	tokens  map[string]uint64 // guarded by mu: background calls read it
	slots   map[string]int    // the slot of each saved permit (slot_of)
	locks   map[string]*ticketing.Lock
	// since is when the call that took or last extended each lock began:
	// its local deadline counts from a send no earlier than that.
	since map[*ticketing.Lock]time.Time
	bg    map[string]chan result
	// queued has a value once a background acquire's WithQueued hook ran.
	queued map[string]chan struct{}
	mu     sync.Mutex
}

func (r *runner) tok(name string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tokens[name]
}

// result is what one operation came to, in the suite's vocabulary.
type result struct {
	kind  string // ok, busy, timeout, indeterminate, error, arg_error, lost, pong, info, held, closed
	token uint64
	lock  *ticketing.Lock // of lock and lock_block
	info  *ticketing.Info // of info
	code  string
	raw   string
	held  map[string]uint64
	// labels is, when the held step names labels, HeldLocks' entries.
	labels []ticketing.HeldLock
	// slot is a permit's slot (acquire_permit), 0 for anything else.
	slot int
	dur  time.Duration
	err  error
}

// hangGuard bounds a wait only so that a broken library fails instead of
// hanging: no scenario relies on it for speed.
const hangGuard = 30 * time.Second

func (r *runner) closeAll() {
	for _, c := range r.conns {
		c.Close()
	}
}

// lock is the lock saved under name.
func (r *runner) lock(where, name string) *ticketing.Lock {
	l := r.locks[name]
	if l == nil {
		r.t.Fatalf("%s: no lock saved as %q", where, name)
	}
	return l
}

func (r *runner) key(name string) string {
	k := r.prefix + name
	if n := r.pads[name]; n > len(k) {
		k += strings.Repeat("x", n-len(k))
	}
	return k
}

func (r *runner) conn(name string) *ticketing.Client {
	if c := r.conns[name]; c != nil {
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ticketing.Dial(ctx, r.sock)
	if err != nil {
		r.t.Fatal(err)
	}
	r.conns[name] = c
	return c
}

func str(st map[string]json.RawMessage, f string) string {
	var s string
	field(st, f, &s)
	return s
}

// field decodes the step's field f into v; an absent field leaves v as it
// is, and a field of the wrong type is a broken scenarios.json (panics,
// which fails the test).
func field(st map[string]json.RawMessage, f string, v any) {
	if st[f] == nil {
		return
	}
	if err := json.Unmarshal(st[f], v); err != nil {
		panic(fmt.Sprintf("conformance: step field %q: %v", f, err))
	}
}

func num(st map[string]json.RawMessage, f string) (float64, bool) {
	var v float64
	err := json.Unmarshal(st[f], &v)
	return v, err == nil && st[f] != nil
}

func strs(st map[string]json.RawMessage, f string) []string {
	var one string
	if json.Unmarshal(st[f], &one) == nil {
		return []string{one}
	}
	var many []string
	field(st, f, &many)
	return many
}

// seconds converts a JSON number of seconds; a value of another type is
// an argument error that Go's types catch before any call.
func seconds(st map[string]json.RawMessage, f string) (time.Duration, bool) {
	v, ok := num(st, f)
	if !ok {
		return 0, false
	}
	return time.Duration(math.Round(v * 1e9)), true
}

func (r *runner) step(i int, st map[string]json.RawMessage) {
	t := r.t
	op := str(st, "op")
	where := fmt.Sprintf("step %d (%s %s)", i, op, str(st, "conn"))
	switch op {
	case "sleep":
		d, _ := seconds(st, "seconds")
		time.Sleep(d)
		return
	case "pending":
		select {
		case res := <-r.bg[str(st, "id")]:
			t.Fatalf("%s: %s already answered: %+v", where, str(st, "id"), res)
		default:
		}
		return
	case "await_queued":
		id := str(st, "id")
		q, ch := r.queued[id], r.bg[id]
		if q == nil {
			t.Fatalf("%s: no background acquire %q", where, id)
		}
		select {
		case <-q:
		case res := <-ch:
			// The hook runs before the call returns: a result without it
			// means no QUEUED came.
			select {
			case <-q:
				ch <- res // for its await
			default:
				t.Fatalf("%s: %s finished without a QUEUED event: %+v", where, id, res)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: %s not queued within 30s", where, id)
		}
		return
	case "await":
		start := time.Now()
		select {
		case res := <-r.bg[str(st, "id")]:
			res.dur = time.Since(start)
			r.check(where, st, res)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no answer within 20s", where)
		}
		return
	case "stall":
		d, _ := seconds(st, "seconds")
		stall(t, d)
		return
	case "expect_alive":
		l := r.lock(where, str(st, "lock"))
		select {
		case <-l.Lost():
			t.Fatalf("%s: lost (%s)", where, l.LostReason())
		default:
		}
		left := l.Remaining()
		// remaining_min counts from the call that took or last extended
		// the lock, so a slow step in between cannot fail it.
		if min, ok := seconds(st, "remaining_min"); ok && left+time.Since(r.since[l]) < min {
			t.Fatalf("%s: remaining %v %v after the lock's call began, below %v", where, left, time.Since(r.since[l]), min)
		}
		if max, ok := seconds(st, "remaining_max"); ok && left > max {
			t.Fatalf("%s: remaining %v, above %v", where, left, max)
		}
		return
	case "await_lost":
		l := r.lock(where, str(st, "lock"))
		within, ok := seconds(st, "within")
		if !ok {
			within = hangGuard
		}
		reasons := strs(st, "reason")
		start := time.Now()
		// The signal first, then the reason: a sidecar event may replace
		// the deadline's reason a moment later.
		for {
			if reason := l.LostReason(); slices.Contains(reasons, reason) {
				select {
				case <-l.Lost():
				default:
					t.Fatalf("%s: LostReason %q but Lost() is not closed", where, reason)
				}
				cause := context.Cause(l.Context())
				var le *ticketing.LostError
				if !errors.Is(cause, ticketing.ErrLockLost) || !errors.As(cause, &le) || le.Token != l.Token() {
					t.Fatalf("%s: Context's cause %v, want a *LostError of token %d", where, cause, l.Token())
				}
				break
			}
			if time.Since(start) > within {
				t.Fatalf("%s: not lost for %v within %v (LostReason %q)", where, reasons, within, l.LostReason())
			}
			time.Sleep(5 * time.Millisecond)
		}
		// The bounds count from the call that took or last extended the lock.
		r.check(where, st, result{dur: time.Since(r.since[l])})
		return
	case "restart_sidecar":
		if r.restart == nil {
			t.Fatalf("%s: this runner cannot restart the sidecar", where)
		}
		r.restart()
		return
	case "connect_default":
		start := time.Now()
		res := r.connectDefault(where, st)
		res.dur = time.Since(start)
		r.check(where, st, res)
		return
	case "close":
		c := r.conn(str(st, "conn"))
		c.Close()
		delete(r.conns, str(st, "conn"))
		return
	case "expect_closed":
		within, ok := seconds(st, "within")
		if !ok {
			within = hangGuard
		}
		c := r.conn(str(st, "conn"))
		select {
		case <-c.Done():
		case <-time.After(within):
			t.Fatalf("%s: connection still open after %v", where, within)
		}
		delete(r.conns, str(st, "conn"))
		return
	}
	c := r.conn(str(st, "conn"))
	var opts []ticketing.AcquireOption
	if _, ok := st["label"]; ok {
		opts = append(opts, ticketing.WithLabel(str(st, "label")))
	}
	do := func() result {
		start := time.Now()
		res := r.call(c, op, st, opts...)
		res.dur = time.Since(start)
		return res
	}
	if id := str(st, "background"); id != "" {
		// Every background acquire carries the queued hook (await_queued).
		q := make(chan struct{}, 1)
		r.queued[id] = q
		opts = append(opts, ticketing.WithQueued(func() { q <- struct{}{} }))
		if op == "acquire_block" || op == "acquire_permit" {
			// A block's ACQUIRE (a PERMIT) follows the Client's HELLO: agree the
			// version first, so the next line written is the ACQUIRE.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := c.Hello(ctx)
			cancel()
			if err != nil {
				t.Fatalf("%s: Hello: %v", where, err)
			}
		}
		ch := make(chan result, 1)
		r.bg[id] = ch
		written := ticketing.Written(c)
		go func() { ch <- do() }()
		// The request is written before the next step, so requests from
		// different steps reach the sidecar in step order (an argument
		// error writes nothing and finishes at once).
		testkit.WaitFor(r.t, where+": the background request written", 10*time.Second, func() bool {
			return ticketing.Written(c) > written || len(ch) > 0
		})
		return
	}
	r.check(where, st, do())
}

// call performs one client operation; opts go to an acquire.
func (r *runner) call(c *ticketing.Client, op string, st map[string]json.RawMessage, opts ...ticketing.AcquireOption) result {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := r.key(str(st, "key"))
	if _, ok := st["literal_key"]; ok {
		key = str(st, "literal_key")
	}
	var err error
	switch op {
	case "ping":
		if err = c.Ping(ctx); err == nil {
			return result{kind: "pong", raw: "PONG"}
		}
	case "info":
		var in ticketing.Info
		if in, err = c.Info(ctx); err == nil {
			// The raw line, on the same connection, for info_same_as_raw.
			raw, err := c.Do(ctx, "INFO")
			if err != nil {
				return result{kind: "failed", err: fmt.Errorf("raw INFO after Info: %w", err)}
			}
			return result{kind: "info", raw: raw, info: &in}
		}
	case "held":
		var h map[string]uint64
		if h, err = c.Held(ctx); err == nil {
			res := result{kind: "held", held: h}
			if st["labels"] != nil {
				if res.labels, err = c.HeldLocks(ctx); err != nil {
					return result{kind: "failed", err: fmt.Errorf("HeldLocks after Held: %w", err)}
				}
			}
			return res
		}
	case "acquire":
		lease, ok1 := seconds(st, "lease")
		wait, ok2 := seconds(st, "wait")
		if !ok1 || !ok2 {
			return result{kind: "arg_error"}
		}
		var tok uint64
		if tok, err = c.Acquire(ctx, key, lease, wait, opts...); err == nil {
			return result{kind: "ok", token: tok}
		}
	case "acquire_block":
		lease, ok1 := seconds(st, "lease")
		wait, ok2 := seconds(st, "wait")
		if !ok1 || !ok2 {
			return result{kind: "arg_error"}
		}
		var names []string
		field(st, "block", &names)
		keys := make([]string, len(names))
		for i, n := range names {
			keys[i] = r.key(n)
		}
		var b *ticketing.Block
		if b, err = c.AcquireBlock(ctx, keys, lease, wait, opts...); err == nil {
			if got := b.Keys(); strings.Join(got, " ") != strings.Join(keys, " ") {
				r.t.Errorf("Block.Keys() = %q, want %q", got, keys)
			}
			return result{kind: "ok", token: b.Token()}
		}
	case "lock", "lock_block":
		lease, ok1 := seconds(st, "lease")
		wait, ok2 := seconds(st, "wait")
		if !ok1 || !ok2 {
			return result{kind: "arg_error"}
		}
		var l *ticketing.Lock
		if op == "lock" {
			l, err = c.Lock(ctx, key, lease, wait, opts...)
		} else {
			var names []string
			field(st, "block", &names)
			keys := make([]string, len(names))
			for i, n := range names {
				keys[i] = r.key(n)
			}
			l, err = c.LockBlock(ctx, keys, lease, wait, opts...)
		}
		if err == nil {
			if l.Remaining() <= 0 || l.LostReason() != "" {
				r.t.Errorf("a new lock: Remaining %v, LostReason %q", l.Remaining(), l.LostReason())
			}
			return result{kind: "ok", token: l.Token(), lock: l}
		}
	case "extend":
		lease, ok := seconds(st, "lease")
		if !ok {
			return result{kind: "arg_error"}
		}
		l := r.lock("extend", str(st, "lock"))
		begun := time.Now()
		if err = l.Extend(ctx, lease); err == nil {
			r.since[l] = begun
			return result{kind: "ok"}
		}
		if errors.Is(err, ticketing.ErrLockLost) {
			return result{kind: "lost", err: err}
		}
	case "acquire_permit":
		lease, ok1 := seconds(st, "lease")
		wait, ok2 := seconds(st, "wait")
		if !ok1 || !ok2 {
			return result{kind: "arg_error"}
		}
		var l *ticketing.Lock
		if l, err = c.AcquirePermit(ctx, key, lease, wait, opts...); err == nil {
			if !l.Permit() || l.FenceKey() != ticketing.PermitFenceKey(key, l.Slot()) {
				r.t.Errorf("a permit: Permit %v, FenceKey %q", l.Permit(), l.FenceKey())
			}
			return result{kind: "ok", token: l.Token(), slot: l.Slot()}
		}
	case "set_permits":
		var n int
		field(st, "permits", &n)
		if err = c.SetPermits(ctx, key, n); err == nil {
			return result{kind: "ok"}
		}
	case "release":
		tok := r.tok(str(st, "token"))
		if _, ok := st["literal_token"]; ok {
			var perr error
			if tok, perr = strconv.ParseUint(str(st, "literal_token"), 10, 64); perr != nil {
				return result{kind: "arg_error"}
			}
		}
		if err = c.Release(ctx, key, tok); err == nil {
			return result{kind: "ok"}
		}
	case "raw":
		line := str(st, "line")
		for {
			i := strings.Index(line, "${")
			if i < 0 {
				break
			}
			j := strings.IndexByte(line[i:], '}')
			kind, name, _ := strings.Cut(line[i+2:i+j], ":")
			v := r.key(name)
			if kind == "token" {
				v = strconv.FormatUint(r.tok(name), 10)
			}
			line = line[:i] + v + line[i+j+1:]
		}
		if n, ok := num(st, "pad_to"); ok && int(n) > len(line) {
			line += strings.Repeat("x", int(n)-len(line))
		}
		var reply string
		if reply, err = c.Do(ctx, line); err == nil {
			return parseRaw(reply)
		}
	default:
		r.t.Fatalf("unknown op %q", op)
	}
	var e *ticketing.Error
	switch {
	case errors.Is(err, ticketing.ErrInvalidArgument):
		return result{kind: "arg_error", err: err}
	case errors.Is(err, ticketing.ErrBusy):
		return result{kind: "busy", err: err}
	case errors.Is(err, ticketing.ErrTimeout):
		return result{kind: "timeout", err: err}
	case errors.Is(err, ticketing.ErrIndeterminate):
		return result{kind: "indeterminate", err: err}
	case errors.As(err, &e):
		return result{kind: "error", code: e.Code, err: err}
	case errors.Is(err, ticketing.ErrClosed), errors.Is(err, ticketing.ErrNoSidecar):
		return result{kind: "connection_error", err: err}
	}
	return result{kind: "failed", err: err}
}

// connectDefault opens connection conn with the library's default socket
// path (Dial(ctx, "")), with $TICKETING_SOCKET set to the sidecar's socket
// ("sidecar"), unset ("unset") or set to a path with no socket ("missing"),
// from a working directory whose ./ticketing.sock leads to the sidecar
// (cwd_socket) or that has none; then PINGs on it. Environment and working
// directory are restored before it returns.
func (r *runner) connectDefault(where string, st map[string]json.RawMessage) result {
	t := r.t
	dir, err := os.MkdirTemp("", "tkc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	var cwdSocket bool
	field(st, "cwd_socket", &cwdSocket)
	if cwdSocket {
		if err := os.Symlink(r.sock, filepath.Join(dir, "ticketing.sock")); err != nil {
			t.Fatal(err)
		}
	}
	old, had := os.LookupEnv(ticketing.SocketEnv)
	defer func() {
		restore := os.Unsetenv(ticketing.SocketEnv)
		if had {
			restore = os.Setenv(ticketing.SocketEnv, old)
		}
		if restore != nil {
			t.Errorf("%s: restoring $%s: %v", where, ticketing.SocketEnv, restore)
		}
	}()
	var envErr error
	switch env := str(st, "env"); env {
	case "sidecar":
		envErr = os.Setenv(ticketing.SocketEnv, r.sock)
	case "unset":
		envErr = os.Unsetenv(ticketing.SocketEnv)
	case "missing":
		envErr = os.Setenv(ticketing.SocketEnv, filepath.Join(dir, "missing.sock"))
	default:
		t.Fatalf("%s: env %q", where, env)
	}
	if envErr != nil {
		t.Fatalf("%s: setting $%s: %v", where, ticketing.SocketEnv, envErr)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.Chdir(wd); err != nil {
			t.Fatal(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := ticketing.Dial(ctx, "")
	if err != nil {
		if errors.Is(err, ticketing.ErrNoSidecar) {
			return result{kind: "connection_error", err: err}
		}
		return result{kind: "failed", err: err}
	}
	if old := r.conns[str(st, "conn")]; old != nil {
		old.Close()
	}
	r.conns[str(st, "conn")] = c
	return r.call(c, "ping", st)
}

func parseRaw(reply string) result {
	res := result{raw: reply}
	switch {
	case reply == "OK":
		res.kind = "ok"
	case strings.HasPrefix(reply, "OK "):
		res.kind = "ok"
		res.token, _ = strconv.ParseUint(reply[3:], 10, 64)
	case reply == "PONG":
		res.kind = "pong"
	case reply == "BUSY", reply == "TIMEOUT", reply == "INDETERMINATE":
		res.kind = strings.ToLower(reply)
	case strings.HasPrefix(reply, "ERR "):
		res.kind = "error"
		res.code, _, _ = strings.Cut(reply[4:], " ")
	case strings.HasPrefix(reply, "INFO "):
		res.kind = "info"
	default:
		res.kind = "reply" // a raw reply of no known form (README)
	}
	return res
}

func (r *runner) check(where string, st map[string]json.RawMessage, res result) {
	t := r.t
	t.Helper()
	// expect is a kind or a list of kinds.
	wants := strs(st, "expect")
	want := ""
	if len(wants) == 1 {
		want = wants[0]
	}
	if len(wants) > 0 && !slices.Contains(wants, res.kind) {
		t.Fatalf("%s: got %s (code %q, err %v, raw %q), want %v", where, res.kind, res.code, res.err, res.raw, wants)
	}
	// code applies to an error outcome.
	if codes := strs(st, "code"); len(codes) > 0 && res.kind == "error" {
		ok := false
		for _, c := range codes {
			ok = ok || c == res.code
		}
		if !ok {
			t.Fatalf("%s: code %q, want one of %v", where, res.code, codes)
		}
	}
	if reply := str(st, "reply"); reply != "" && res.raw != reply {
		t.Fatalf("%s: reply %q, want %q", where, res.raw, reply)
	}
	if min, ok := seconds(st, "min_seconds"); ok && res.dur < min {
		t.Fatalf("%s: answered after %v, before min %v", where, res.dur, min)
	}
	if max, ok := seconds(st, "max_seconds"); ok && res.dur > max {
		t.Fatalf("%s: answered after %v, beyond max %v", where, res.dur, max)
	}
	for _, v := range strs(st, "expect_token_gt") {
		if res.token <= r.tok(v) {
			t.Fatalf("%s: token %d not above %s=%d", where, res.token, v, r.tok(v))
		}
	}
	if st["lock_label"] != nil {
		var want *string
		field(st, "lock_label", &want)
		if res.lock == nil {
			t.Fatalf("%s: lock_label on a step that made no lock", where)
		}
		if got := res.lock.Label(); got != deref(want) {
			t.Fatalf("%s: Lock.Label() = %q, want %q", where, got, deref(want))
		}
	}
	if n, ok := num(st, "slot"); ok && res.slot != int(n) {
		t.Fatalf("%s: slot %d, want %v", where, res.slot, n)
	}
	if name := str(st, "slot_of"); name != "" && res.slot != r.slots[name] {
		t.Fatalf("%s: slot %d, want %s's slot %d", where, res.slot, name, r.slots[name])
	}
	if name := str(st, "save"); name != "" {
		r.mu.Lock()
		r.tokens[name] = res.token
		r.slots[name] = res.slot
		r.mu.Unlock()
		if res.lock != nil {
			r.locks[name] = res.lock
			r.since[res.lock] = time.Now().Add(-res.dur)
		}
	}
	if want == "info" && res.kind == "info" {
		r.checkInfo(where, st, res)
	}
	if want == "held" {
		var keys []string
		field(st, "keys", &keys)
		var toks map[string]string
		field(st, "tokens", &toks)
		if len(res.held) != len(keys) {
			t.Fatalf("%s: held %v, want keys %v", where, res.held, keys)
		}
		for _, k := range keys {
			tok, ok := res.held[r.key(k)]
			if !ok {
				t.Fatalf("%s: held %v lacks %s", where, res.held, k)
			}
			if v, ok := toks[k]; ok && tok != r.tok(v) {
				t.Fatalf("%s: %s held under %d, want %s=%d", where, k, tok, v, r.tok(v))
			}
		}
		if st["labels"] != nil {
			r.checkLabels(where, st, res)
		}
	}
}

// checkLabels checks a held step's labels (key name to label, null for
// none) against HeldLocks, which must list exactly what Held did.
func (r *runner) checkLabels(where string, st map[string]json.RawMessage, res result) {
	t := r.t
	var want map[string]*string
	field(st, "labels", &want)
	got := map[string]string{}
	for _, h := range res.labels {
		if tok, ok := res.held[h.Key]; !ok || tok != h.Token {
			t.Fatalf("%s: HeldLocks %v does not match Held %v", where, res.labels, res.held)
		}
		got[h.Key] = h.Label
	}
	if len(got) != len(res.held) || len(res.labels) != len(res.held) {
		t.Fatalf("%s: HeldLocks %v does not match Held %v", where, res.labels, res.held)
	}
	for k, w := range want {
		if l, ok := got[r.key(k)]; !ok || l != deref(w) {
			t.Fatalf("%s: %s's label %q (held %v), want %q", where, k, l, ok, deref(w))
		}
	}
}

// deref is *s, "" for nil (a JSON null: no label).
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// checkInfo checks an info step: the parsed Info is plausible; each field
// of info_same_as_raw equals the same field of the raw INFO line read right
// after it on the connection ("-" being none: ""); each field of
// info_known is known (not none).
func (r *runner) checkInfo(where string, st map[string]json.RawMessage, res result) {
	t := r.t
	in := res.info
	if in == nil {
		t.Fatalf("%s: INFO %q not parsed", where, res.raw)
	}
	if in.Cluster == "" || in.Total < 1 || in.Connected < 0 || in.Connected > in.Total {
		t.Fatalf("%s: implausible INFO %+v", where, *in)
	}
	raw := map[string]string{}
	for _, w := range strings.Fields(strings.TrimPrefix(res.raw, "INFO ")) {
		k, v, _ := strings.Cut(w, "=")
		if v == "-" {
			v = ""
		}
		raw[k] = v
	}
	raw["connected"], raw["total"], _ = strings.Cut(raw["connected"], "/")
	itoa := func(n int) string {
		if n == 0 {
			return ""
		}
		return strconv.Itoa(n)
	}
	parsed := map[string]string{
		"cluster": in.Cluster, "leader": in.Leader, "connected": strconv.Itoa(in.Connected), "total": strconv.Itoa(in.Total),
		"domain": in.Domain, "protocol": itoa(in.Protocol), "sessions": in.Sessions, "session": in.Session,
		"session_state": in.SessionState,
	}
	for _, f := range strs(st, "info_same_as_raw") {
		got, ok := parsed[f]
		if !ok {
			t.Fatalf("%s: this runner knows no Info field %q", where, f)
		}
		if got != raw[f] {
			t.Fatalf("%s: Info's %s is %q, the raw INFO line's %q (%q)", where, f, got, raw[f], res.raw)
		}
	}
	for _, f := range strs(st, "info_known") {
		if got, ok := parsed[f]; !ok || got == "" {
			t.Fatalf("%s: Info's %s is not known: %+v", where, f, *in)
		}
	}
}
