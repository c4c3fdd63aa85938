// Package isolation drives the hostile local clients of issue 20 against a
// sidecar's unix socket while a well-behaved client is measured before,
// during and after each of them. The process tests of cmd/ticketing
// (isolation_test.go) and `ticketlab bench isolation` run the same cases
// through it. It speaks the line protocol of unixapi/PROTOCOL.md over plain
// sockets, as any local program would, and links no product code; the
// ticketing binary does not link it (cmd/ticketing's TestBinaryCarriesNoLab).
//
// The cases:
//   - Flood: FloodConns connections each pipeline FloodDepth
//     `ACQUIRE hot/1 250 300` and never read.
//   - SlowRead: the same, each flood connection reading SlowBytes every
//     SlowEvery.
//   - Releases: FloodConns connections each pipeline FloodDepth RELEASEs
//     of keys and tokens they do not hold (the good client's keys among
//     them), read the replies and send the next FloodDepth, until the
//     phase ends.
//   - Idle: IdleConns connections that connect and never send.
//
// The well-behaved client, on its own connection, does in every phase:
// `ACQUIRE mine/1 60 0` (a free key), Cycles × (`ACQUIRE good/N 10 5`, then
// `RELEASE good/N TOKEN`) on fresh keys, then `HELD` (it must list mine/1
// under its token, and nothing else) and `RELEASE mine/1 TOKEN`. Every
// reply other than the expected one is a Problem.
package isolation

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Case names one hostile client.
type Case string

// The cases, in the order Cases lists them.
const (
	Flood    Case = "flood"
	SlowRead Case = "slowread"
	Releases Case = "releases"
	Idle     Case = "idle"
)

// Cases are every case, in issue 20's order.
var Cases = []Case{Flood, SlowRead, Releases, Idle}

// Describe says what c does with o's sizes.
func (c Case) Describe(o Options) string {
	switch c {
	case Flood:
		return fmt.Sprintf("%d connections each pipelining %d `ACQUIRE hot/1 250 300`, never reading", o.FloodConns, o.FloodDepth)
	case SlowRead:
		return fmt.Sprintf("%d connections each pipelining %d `ACQUIRE hot/1 250 300`, reading %d bytes every %v",
			o.FloodConns, o.FloodDepth, o.SlowBytes, o.SlowEvery)
	case Releases:
		return fmt.Sprintf("%d connections each pipelining %d RELEASEs of locks they do not hold, again and again", o.FloodConns, o.FloodDepth)
	case Idle:
		return fmt.Sprintf("%d connections that connect and never send", o.IdleConns)
	}
	return string(c)
}

// Options sizes a run. The zero value of a field means its default
// (DefaultOptions).
type Options struct {
	// Socket is the sidecar's unix socket. Required.
	Socket string
	// Cycles is how many acquire+release cycles the well-behaved client
	// makes in each phase. Default 30.
	Cycles int
	// FloodConns is the number of flood connections (Flood, SlowRead,
	// Releases). Default 300.
	FloodConns int
	// FloodDepth is how many requests each flood connection pipelines.
	// Default 200.
	FloodDepth int
	// IdleConns is the number of idle connections (Idle). Default 10,000.
	IdleConns int
	// SlowBytes and SlowEvery: a SlowRead connection reads at most
	// SlowBytes bytes every SlowEvery. Defaults 16 bytes, 100 ms.
	SlowBytes int
	SlowEvery time.Duration
	// ReplyTimeout bounds the wait for one reply of the well-behaved
	// client (its ACQUIREs wait at most 5 s at the cluster); a reply later
	// than that ends the run with an error. Default 60 s.
	ReplyTimeout time.Duration
	// Probe, if set, is called at the end of the during phase, while the
	// hostile client is still there; its text goes to Result.Probe (for
	// instance the leader's count of queued waiters).
	Probe func() string
}

// DefaultOptions are issue 20's sizes.
func DefaultOptions(socket string) Options {
	return Options{Socket: socket, Cycles: 30, FloodConns: 300, FloodDepth: 200, IdleConns: 10000,
		SlowBytes: 16, SlowEvery: 100 * time.Millisecond, ReplyTimeout: 60 * time.Second}
}

func (o Options) withDefaults() Options {
	d := DefaultOptions(o.Socket)
	if o.Cycles == 0 {
		o.Cycles = d.Cycles
	}
	if o.FloodConns == 0 {
		o.FloodConns = d.FloodConns
	}
	if o.FloodDepth == 0 {
		o.FloodDepth = d.FloodDepth
	}
	if o.IdleConns == 0 {
		o.IdleConns = d.IdleConns
	}
	if o.SlowBytes == 0 {
		o.SlowBytes = d.SlowBytes
	}
	if o.SlowEvery == 0 {
		o.SlowEvery = d.SlowEvery
	}
	if o.ReplyTimeout == 0 {
		o.ReplyTimeout = d.ReplyTimeout
	}
	return o
}

// Phase is what the well-behaved client saw in one phase.
type Phase struct {
	Name string // before, during, after
	// Cycles are the latencies of the completed cycles (ACQUIRE sent →
	// RELEASE answered OK), in the order they ran.
	Cycles []time.Duration
	// Requests is how many requests the client sent in the phase.
	Requests int
	// Problems are the replies that were not the expected ones, each as
	// "REQUEST -> REPLY (want ...)".
	Problems []string
}

// Quantile is the q-quantile (0..1) of the phase's cycle latencies, 0
// without any.
func (p Phase) Quantile(q float64) time.Duration {
	if len(p.Cycles) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), p.Cycles...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1)+0.5)]
}

func (p Phase) String() string {
	return fmt.Sprintf("%-6s %3d cycles, p50 %v p99 %v, %d of %d requests not answered as expected",
		p.Name, len(p.Cycles), p.Quantile(0.5).Round(10*time.Microsecond), p.Quantile(0.99).Round(10*time.Microsecond),
		len(p.Problems), p.Requests)
}

// Result is one case's run.
type Result struct {
	Case   Case
	Phases []Phase // before, during, after
	// Flood counts the complete reply lines the hostile connections read,
	// by Kind; FloodExample holds the first line of each kind.
	Flood        map[string]int
	FloodExample map[string]string
	// Probe is Options.Probe's text.
	Probe string
}

// Problems lists every unexpected reply of the well-behaved client,
// prefixed with its phase.
func (r Result) Problems() []string {
	var out []string
	for _, p := range r.Phases {
		for _, s := range p.Problems {
			out = append(out, p.Name+": "+s)
		}
	}
	return out
}

// Phase returns the phase named name (zero Phase if none).
func (r Result) Phase(name string) Phase {
	for _, p := range r.Phases {
		if p.Name == name {
			return p
		}
	}
	return Phase{}
}

// Kind classifies a reply line: "OK", "BUSY", "TIMEOUT", "INDETERMINATE",
// "PONG", "HELD", "INFO", "ERR <code>", or "? <line>" for a line the
// protocol does not have.
func Kind(line string) string {
	f := strings.Fields(line)
	switch {
	case len(f) == 0:
		return "? " + line
	case f[0] == "ERR" && len(f) >= 2:
		return "ERR " + f[1]
	case f[0] == "OK" && (len(f) == 1 || len(f) == 2 && isDecimal(f[1])):
		return "OK"
	case len(f) == 1 && (f[0] == "BUSY" || f[0] == "TIMEOUT" || f[0] == "INDETERMINATE" || f[0] == "PONG"):
		return f[0]
	case f[0] == "HELD" || f[0] == "INFO":
		return f[0]
	}
	return "? " + line
}

func isDecimal(s string) bool {
	_, err := strconv.ParseUint(s, 10, 64)
	return err == nil
}

// ErrFileLimit is returned when the process may not open the connections
// a case needs.
var ErrFileLimit = errors.New("isolation: open-file limit too low")

// NeedFiles is how many file descriptors case c needs in this process
// (the sidecar's process needs as many); CheckFileLimit compares it with
// RLIMIT_NOFILE.
func NeedFiles(c Case, o Options) int {
	o = o.withDefaults()
	switch c {
	case Idle:
		return o.IdleConns + 256
	default:
		return o.FloodConns + 256
	}
}

// CheckFileLimit returns ErrFileLimit, with the numbers, when this
// process's open-file limit (RLIMIT_NOFILE, soft: Go raises it to the
// hard limit at start) is below what c needs.
func CheckFileLimit(c Case, o Options) error {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return err
	}
	if need := NeedFiles(c, o); rl.Cur < uint64(need) {
		return fmt.Errorf("%w: case %s opens %d connections and needs about %d file descriptors in this process and in the sidecar's, "+
			"RLIMIT_NOFILE is %d (hard %d): raise it (ulimit -n 20000)", ErrFileLimit, c, need-256, need, rl.Cur, rl.Max)
	}
	return nil
}

// Run runs case c: the well-behaved client's before phase, then the
// hostile client and the during phase, then the hostile client goes away
// (its connections are closed) and the after phase. An error means the run
// could not be made (a connection refused, the good client's connection
// lost or a reply later than ReplyTimeout); unexpected replies are in the
// Result's phases.
func Run(ctx context.Context, c Case, o Options) (Result, error) {
	o = o.withDefaults()
	res := Result{Case: c, Flood: map[string]int{}, FloodExample: map[string]string{}}
	if err := CheckFileLimit(c, o); err != nil {
		return res, err
	}
	good, err := dialGood(o)
	if err != nil {
		return res, err
	}
	defer good.c.Close()
	next := 0
	phase := func(name string) error {
		p, err := good.phase(ctx, name, &next, o.Cycles)
		res.Phases = append(res.Phases, p)
		return err
	}
	if err := phase("before"); err != nil {
		return res, err
	}
	h, err := startHostile(ctx, c, o)
	if err != nil {
		if h != nil {
			h.stop(&res)
		}
		return res, err
	}
	err = phase("during")
	if o.Probe != nil {
		res.Probe = o.Probe()
	}
	h.stop(&res)
	if err != nil {
		return res, err
	}
	return res, phase("after")
}

// goodClient is the well-behaved client: one connection, one request at a
// time.
type goodClient struct {
	c       net.Conn
	r       *bufio.Reader
	timeout time.Duration
}

func dialGood(o Options) (*goodClient, error) {
	c, err := dialRetry(o.Socket)
	if err != nil {
		return nil, fmt.Errorf("isolation: the well-behaved client's connection: %w", err)
	}
	return &goodClient{c: c, r: bufio.NewReader(c), timeout: o.ReplyTimeout}, nil
}

// do sends one request and reads its reply.
func (g *goodClient) do(req string) (string, error) {
	g.c.SetDeadline(time.Now().Add(g.timeout))
	if _, err := io.WriteString(g.c, req+"\n"); err != nil {
		return "", fmt.Errorf("isolation: well-behaved client: sending %q: %w", req, err)
	}
	line, err := g.r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("isolation: well-behaved client: reply to %q: %w", req, err)
	}
	return strings.TrimSuffix(line, "\n"), nil
}

func (g *goodClient) phase(ctx context.Context, name string, next *int, cycles int) (Phase, error) {
	p := Phase{Name: name}
	do := func(req string) (string, error) {
		p.Requests++
		return g.do(req)
	}
	problem := func(req, got, want string) {
		p.Problems = append(p.Problems, fmt.Sprintf("%s -> %s (want %s)", req, got, want))
	}
	token := func(reply string) (uint64, bool) {
		s, ok := strings.CutPrefix(reply, "OK ")
		if !ok {
			return 0, false
		}
		t, err := strconv.ParseUint(s, 10, 64)
		return t, err == nil
	}
	req := "ACQUIRE mine/1 60 0"
	r, err := do(req)
	if err != nil {
		return p, err
	}
	mine, haveMine := token(r)
	mineAt := time.Now()
	if !haveMine {
		problem(req, r, "OK <token>: mine/1 is free")
	}
	for i := 0; i < cycles && ctx.Err() == nil; i++ {
		key := fmt.Sprintf("good/%d", *next)
		*next++
		t0 := time.Now()
		req := "ACQUIRE " + key + " 10 5"
		r, err := do(req)
		if err != nil {
			return p, err
		}
		tok, ok := token(r)
		if !ok {
			problem(req, r, "OK <token>: "+key+" is free")
			continue
		}
		req = fmt.Sprintf("RELEASE %s %d", key, tok)
		if r, err = do(req); err != nil {
			return p, err
		}
		if r != "OK" {
			problem(req, r, "OK")
			continue
		}
		p.Cycles = append(p.Cycles, time.Since(t0))
	}
	if haveMine {
		want := fmt.Sprintf("HELD 1 mine/1:%d", mine)
		if r, err := do("HELD"); err != nil {
			return p, err
		} else if r != want {
			problem("HELD", r, want+": mine/1 still held under its token, nothing else")
		}
		req := fmt.Sprintf("RELEASE mine/1 %d", mine)
		if r, err := do(req); err != nil {
			return p, err
		} else if r != "OK" {
			want := "OK: the lock was untouched"
			if held := time.Since(mineAt); held > 60*time.Second {
				want += fmt.Sprintf("; the phase took %v, longer than mine/1's 60 s lease: starved rather than touched", held.Round(time.Second))
			}
			problem(req, r, want)
		}
	}
	return p, ctx.Err()
}

// dialRetry dials the socket, retrying while its accept backlog is full
// (EAGAIN on a unix socket) for up to 10 s.
func dialRetry(path string) (net.Conn, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("unix", path)
		if err == nil || !errors.Is(err, syscall.EAGAIN) || time.Now().After(deadline) {
			return c, err
		}
		time.Sleep(time.Millisecond)
	}
}

// hostile is a running hostile client.
type hostile struct {
	conns []net.Conn
	stopc chan struct{}
	wg    sync.WaitGroup
	// reads collects what each flood connection read; never-reading ones
	// read what is there when the phase ends.
	mu     sync.Mutex
	kinds  map[string]int
	first  map[string]string
	drain  bool // read what is available at stop (Flood)
	errMu  sync.Mutex
	errors []error
}

func (h *hostile) record(line string) {
	k := Kind(line)
	h.mu.Lock()
	h.kinds[k]++
	if _, ok := h.first[k]; !ok {
		h.first[k] = line
	}
	h.mu.Unlock()
}

// dialMany opens n connections, 16 dials at a time.
func dialMany(path string, n int) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	errc := make(chan error, 16)
	var next sync.Mutex
	i := 0
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				j := i
				i++
				next.Unlock()
				if j >= n {
					return
				}
				c, err := dialRetry(path)
				if err != nil {
					errc <- fmt.Errorf("isolation: hostile connection %d of %d: %w", j+1, n, err)
					return
				}
				conns[j] = c
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		return nil, err
	}
	return conns, nil
}

func startHostile(ctx context.Context, c Case, o Options) (*hostile, error) {
	h := &hostile{stopc: make(chan struct{}), kinds: map[string]int{}, first: map[string]string{}}
	n := o.FloodConns
	if c == Idle {
		n = o.IdleConns
	}
	conns, err := dialMany(o.Socket, n)
	if err != nil {
		return nil, err
	}
	h.conns = conns
	switch c {
	case Flood, SlowRead:
		payload := []byte(strings.Repeat("ACQUIRE hot/1 250 300\n", o.FloodDepth))
		for i, fc := range conns {
			fc.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := fc.Write(payload); err != nil {
				return h, fmt.Errorf("isolation: flood connection %d: writing its %d ACQUIREs: %w", i+1, o.FloodDepth, err)
			}
		}
		if c == Flood {
			h.drain = true
			break
		}
		for _, fc := range conns {
			h.wg.Add(1)
			go h.slowRead(fc, o)
		}
	case Releases:
		for i, fc := range conns {
			h.wg.Add(1)
			go h.releases(ctx, i, fc, o)
		}
	case Idle:
	default:
		return h, fmt.Errorf("isolation: unknown case %q", c)
	}
	return h, nil
}

// slowRead reads at most SlowBytes every SlowEvery until stop.
func (h *hostile) slowRead(c net.Conn, o Options) {
	defer h.wg.Done()
	buf := make([]byte, o.SlowBytes)
	var line []byte
	t := time.NewTicker(o.SlowEvery)
	defer t.Stop()
	for {
		select {
		case <-h.stopc:
			return
		case <-t.C:
		}
		c.SetReadDeadline(time.Now().Add(o.SlowEvery / 2))
		n, err := c.Read(buf)
		line = h.lines(append(line, buf[:n]...))
		if err != nil && !isTimeout(err) {
			return
		}
	}
}

// lines records the complete lines in b and returns the rest.
func (h *hostile) lines(b []byte) []byte {
	for {
		i := strings.IndexByte(string(b), '\n')
		if i < 0 {
			return b
		}
		h.record(string(b[:i]))
		b = b[i+1:]
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// releases pipelines FloodDepth RELEASEs of locks this connection does not
// hold, reads their replies, and again, until stop.
func (h *hostile) releases(ctx context.Context, i int, c net.Conn, o Options) {
	defer h.wg.Done()
	r := bufio.NewReader(c)
	var b strings.Builder
	for round := 0; ; round++ {
		select {
		case <-h.stopc:
			return
		default:
		}
		b.Reset()
		for j := 0; j < o.FloodDepth; j++ {
			key := [...]string{"hot/1", "mine/1", "good/" + strconv.Itoa(j)}[j%3]
			fmt.Fprintf(&b, "RELEASE %s %d\n", key, 1+(i*7919+round*104729+j*31)%1000000)
		}
		c.SetDeadline(time.Now().Add(o.ReplyTimeout))
		if _, err := io.WriteString(c, b.String()); err != nil {
			h.fail(fmt.Errorf("isolation: release flood connection %d: %w", i+1, err))
			return
		}
		for j := 0; j < o.FloodDepth; j++ {
			line, err := r.ReadString('\n')
			if err != nil {
				h.fail(fmt.Errorf("isolation: release flood connection %d: reply %d: %w", i+1, j+1, err))
				return
			}
			h.record(strings.TrimSuffix(line, "\n"))
		}
	}
}

func (h *hostile) fail(err error) {
	select {
	case <-h.stopc:
		return // closed by stop
	default:
	}
	h.errMu.Lock()
	h.errors = append(h.errors, err)
	h.errMu.Unlock()
}

// stop ends the hostile client: never-reading flood connections first
// read what has arrived for them (until 200 ms pass without a byte), then
// every connection is closed. Its counts go to res; a connection the
// sidecar closed on a hostile client is recorded as the kind "closed".
func (h *hostile) stop(res *Result) {
	close(h.stopc)
	if h.drain {
		var wg sync.WaitGroup
		for _, c := range h.conns {
			wg.Add(1)
			go func(c net.Conn) {
				defer wg.Done()
				buf := make([]byte, 4096)
				var rest []byte
				for {
					c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
					n, err := c.Read(buf)
					rest = h.lines(append(rest, buf[:n]...))
					if err != nil {
						return
					}
				}
			}(c)
		}
		wg.Wait()
	}
	for _, c := range h.conns {
		c.Close()
	}
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, n := range h.kinds {
		res.Flood[k] += n
	}
	for k, l := range h.first {
		if _, ok := res.FloodExample[k]; !ok {
			res.FloodExample[k] = l
		}
	}
	for _, err := range h.errors {
		res.Flood["? "+err.Error()]++
	}
}
