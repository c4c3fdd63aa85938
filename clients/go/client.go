// Package ticketing is a small, dependency-free Go client of the Ticketing
// sidecar's unix-socket API (unixapi/PROTOCOL.md). Programs that prefer an
// in-process client can use ticketing/sidecar's Broker instead.
//
// A Client is one connection, and the connection is the session that owns
// the locks acquired through it: only it can release them, and when it
// closes (Close, process exit, crash) the sidecar releases all of them at
// once. Keep the Client open for as long as you hold locks.
//
// A Client is safe for concurrent use; requests are pipelined and replies
// are matched by order, as the protocol defines.
//
// Acquire takes one key; AcquireBlock takes a seat block, 2..16 keys all at
// once or none, under one fencing token (protocol version 2).
//
// Lock and LockBlock return a Lock object that knows when it is lost
// (protocol version 3): its Context is cancelled on the sidecar's lost
// event, at the local validity deadline, or when the connection ends, and
// Extend renews its lease. Every Client asks for event lines when it
// connects (HELLO 4 events); against an older sidecar it works without
// them, and a Lock then relies on its local deadline.
//
// WithQueued, an option of every acquire, tells the caller when the
// cluster queued its acquire (protocol version 4's "! QUEUED" event).
package ticketing

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// noSidecarHint is what to do when nothing serves the socket.
const noSidecarHint = "start one with `ticketing dev` (a local cluster and its sidecar) or " +
	"`ticketing sidecar` (beside a cluster), or give the path of a running sidecar's socket"

// Error is an "ERR <code> <message>" reply. errors.Is matches an *Error by
// Code alone, so errors.Is(err, ticketing.ErrNotHeld) works whatever the
// message.
type Error struct {
	Code    string // lowercase word, e.g. "not_held"; the stable part
	Message string // for humans and logs
}

func (e *Error) Error() string { return "ticketing: " + e.Code + ": " + e.Message }

// Is reports whether target is an *Error with the same Code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Error codes worth testing for with errors.Is (see PROTOCOL.md for all).
var (
	ErrNotHeld       = &Error{Code: "not_held"}
	ErrTokenMismatch = &Error{Code: "token_mismatch"}
	ErrInvalidKey    = &Error{Code: "invalid_key"}
	// ErrInvalidKeys: a block naming a key twice, or more than 16 keys
	// (the sidecar's own check; AcquireBlock checks before sending).
	ErrInvalidKeys  = &Error{Code: "invalid_keys"}
	ErrInvalidLease = &Error{Code: "invalid_lease"}
	ErrInvalidWait  = &Error{Code: "invalid_wait"}
	ErrUnavailable  = &Error{Code: "unavailable"}
	ErrForbidden    = &Error{Code: "forbidden"}
	ErrLineTooLong  = &Error{Code: "line_too_long"}
	// ErrTooManyWaiters: no room for one more waiting ACQUIRE (the key's
	// queue, this connection's or the sidecar's waiter room; the sidecar
	// refuses the connection holding the most, or evicts its newest).
	ErrTooManyWaiters = &Error{Code: "too_many_waiters"}
	// ErrTooManyInFlight: too many ACQUIREs with wait 0 running on this
	// connection at once.
	ErrTooManyInFlight = &Error{Code: "too_many_in_flight"}
	// Deprecated: the sidecar no longer refuses a RELEASE for capacity
	// (its release queue has no size bound), so no reply carries this
	// code; kept so that code testing for it still compiles.
	ErrReleaseQueueFull = &Error{Code: "release_queue_full"}
)

// Limits of the protocol, checked before sending.
const (
	MaxLease = 250 * time.Second
	MaxWait  = 300 * time.Second
	// MaxBlockKeys is the most keys one AcquireBlock may name.
	MaxBlockKeys = 16
)

// ProtocolVersion is the version of unixapi/PROTOCOL.md this client
// speaks: 5, which added owner labels (version 4 the QUEUED event,
// version 3 EXTEND and the lost events, version 2 seat blocks and HELLO).
const ProtocolVersion = 5

// MaxLabelLen is the longest owner label (WithLabel) in bytes.
const MaxLabelLen = 64

// Client is one connection to the sidecar.
type Client struct {
	conn net.Conn

	mu      sync.Mutex // serialises writes and the order of pending
	pending []*call    // requests written, oldest first
	err     error      // set once the connection broke or was closed
	done    chan struct{}
	// written counts the request lines written (guarded by mu), so a test
	// can tell that a request left before it takes its next step, and so
	// that a QUEUED event, which names its ACQUIRE by this count, finds
	// it.
	written uint64
	// queuedCalls are the pending ACQUIREs with a WithQueued hook, by
	// their position among the lines written (guarded by mu).
	queuedCalls map[uint64]*call

	helloMu sync.Mutex // one HELLO at a time
	version int        // guarded by helloMu: the version HELLO agreed, 0 = not known yet
	events  bool       // guarded by helloMu: the sidecar sends event lines
	// helloDone is closed once the HELLO that Dial pipelines is answered
	// (or the connection ended first); version and events are set then.
	helloDone chan struct{}
	helloOnce sync.Once
	// labelled: the agreed version has labels (5): HELD and LOST lines
	// carry them. Atomic: the reader reads it without helloMu, which
	// Hello holds across a round trip.
	labelled atomic.Bool

	lmu   sync.Mutex       // guards locks
	locks map[uint64]*Lock // the Locks that events may name, by token

	now func() time.Time // the clock of lock deadlines; nil = time.Now (tests set it)
}

// call is one request awaiting its reply line.
type call struct {
	line string
	ch   chan string // buffered; gets the reply line
	// onOrphan runs with the reply when the caller stopped waiting (its
	// context ended): an ACQUIRE uses it to release a late grant.
	onOrphan func(reply string)
	// onReply, if set, runs in the reader with the reply before it is
	// delivered or orphaned, so that what it sets up (a Lock) exists
	// before the reader handles the next line (an event for that Lock).
	onReply func(reply string)
	// onQueued, if set, runs when a QUEUED event names this call (an
	// ACQUIRE of keys), at most once, unless the caller stopped waiting.
	onQueued func()
	keys     []string
	n        uint64 // the call's position among the lines written
	mu       sync.Mutex
	orphaned bool
	hello    bool // the HELLO sent by Dial: an ERR to it may be a refusal
}

// Dial connects to the sidecar's socket at path.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	switch {
	case errors.Is(err, syscall.ENOENT):
		return nil, fmt.Errorf("%w at %s: no socket file there; %s: %w", ErrNoSidecar, path, noSidecarHint, err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, fmt.Errorf("%w at %s: nothing serves that socket file (left by a sidecar that stopped?); %s: %w",
			ErrNoSidecar, path, noSidecarHint, err)
	case err != nil:
		return nil, fmt.Errorf("ticketing: dial %s: %w", path, err)
	}
	return newClient(conn)
}

// newClient runs the Client of conn: its reader, and the HELLO that asks
// for the version and event lines, pipelined before the first request.
func newClient(conn net.Conn) (*Client, error) {
	c := &Client{conn: conn, done: make(chan struct{}), helloDone: make(chan struct{})}
	go c.readLoop()
	cl := &call{line: helloLine, ch: make(chan string, 1), hello: true, onReply: c.helloReply}
	if err := c.enqueue(cl); err != nil {
		conn.Close()
		<-c.done
		return nil, err
	}
	return c, nil
}

// helloLine is the first line of every connection.
var helloLine = "HELLO " + strconv.Itoa(ProtocolVersion) + " events"

// helloReply takes in the reply to Dial's HELLO. "HELLO <v> events":
// version v, events on; "HELLO <v>": no events; unknown_verb: a version-1
// sidecar. A version-2 sidecar refuses the events option (bad_request):
// Hello then asks again without it.
func (c *Client) helloReply(r string) {
	c.helloMu.Lock()
	defer c.helloMu.Unlock()
	defer c.helloOnce.Do(func() { close(c.helloDone) })
	if s, ok := strings.CutPrefix(r, "HELLO "); ok {
		v, opt, _ := strings.Cut(s, " ")
		if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= ProtocolVersion {
			c.version, c.events = n, opt == "events" && n >= 3
			c.labelled.Store(n >= 5)
		}
		return
	}
	var e *Error
	if errors.As(outcome("HELLO", r), &e) && e.Code == "unknown_verb" {
		c.version = 1
	}
}

// clock is the time of lock deadlines.
func (c *Client) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// Done is closed when the connection is gone; every lock acquired through
// this Client has then been handed back to the sidecar for release.
func (c *Client) Done() <-chan struct{} { return c.done }

// Close closes the connection. The sidecar releases every lock this
// Client still holds and cancels its pending acquires.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.err == nil {
		c.err = ErrClosed
	}
	c.mu.Unlock()
	err := c.conn.Close()
	<-c.done
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Ping checks that the sidecar answers.
func (c *Client) Ping(ctx context.Context) error {
	r, err := c.do(ctx, "PING", nil)
	if err != nil {
		return err
	}
	if r != "PONG" {
		return outcome("PING", r)
	}
	return nil
}

// Info returns the sidecar's INFO line without the "INFO " prefix, e.g.
// "cluster=dev leader=127.0.0.1:7400 connected=3/3".
func (c *Client) Info(ctx context.Context) (string, error) {
	r, err := c.do(ctx, "INFO", nil)
	if err != nil {
		return "", err
	}
	if s, ok := strings.CutPrefix(r, "INFO "); ok {
		return s, nil
	}
	return "", outcome("INFO", r)
}

// Acquire takes key for lease (whole seconds, 1..250 s), waiting at most
// wait (milliseconds, 0 = one immediate try, at most 300 s) for its turn.
// It returns the fencing token, or ErrBusy, ErrTimeout, ErrIndeterminate,
// an *Error, or an error wrapping ctx.Err() or ErrClosed (not acquired).
//
// If ctx ends while the request is with the sidecar, Acquire returns at
// once; should the lock be granted anyway, the Client releases it in the
// background. Give ctx a deadline above wait, or leave it to wait alone.
//
// Options: WithQueued.
func (c *Client) Acquire(ctx context.Context, key string, lease, wait time.Duration, opts ...AcquireOption) (uint64, error) {
	if err := checkDurations(lease, wait); err != nil {
		return 0, err
	}
	if err := checkKey(key); err != nil {
		return 0, err
	}
	return c.acquire(ctx, []string{key}, lease, wait, acquireOptions(opts))
}

// checkLabel checks a WithLabel label (1..MaxLabelLen bytes of 0x21..0x7E,
// not "-") and that the sidecar speaks labels (version 5): nothing is sent
// without the label the caller asked for.
func (c *Client) checkLabel(ctx context.Context, label string) error {
	if label == "" {
		return nil
	}
	if len(label) > MaxLabelLen || label == "-" || strings.IndexFunc(label, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
		return fmt.Errorf("%w: label %q: 1..%d bytes of visible ASCII (0x21..0x7E), not \"-\"", ErrInvalidArgument, label, MaxLabelLen)
	}
	v, err := c.Hello(ctx)
	if err != nil {
		return err
	}
	if v < 5 {
		return fmt.Errorf("%w: a label needs protocol version 5, and the sidecar speaks version %d: upgrade the sidecar", ErrNotSupported, v)
	}
	return nil
}

// AcquireBlock takes a seat block: every key of keys (1..16 distinct keys)
// all at once or none, under one fencing token, for lease, waiting at most
// wait for its turn on every key (unixapi/PROTOCOL.md, "Blocks"). The
// block joins each key's FIFO queue at once and is granted when it is at
// the head of every queue and every key is free; with wait 0 it is granted
// only if every key is free with nobody queued on it, else ErrBusy. When
// the wait runs out it is ErrTimeout with no key acquired. Its results,
// and what ctx does, are Acquire's; the Block's Release (or Release of any
// of its keys with its token) frees every key, and closing the Client
// releases it like any lock.
//
// keys with one key is Acquire. Keys named twice, or more than 16, are an
// ErrInvalidArgument (nothing sent). A block needs protocol version 2
// (Hello tells; it waits for the answer to the HELLO that Dial sent), and
// against an older sidecar it fails with an error wrapping ErrNotSupported, nothing
// acquired.
//
// The Block is a Lock (Block is its older name): it also carries the lost
// signal and can Extend (LockBlock is the same call). Options: WithQueued.
func (c *Client) AcquireBlock(ctx context.Context, keys []string, lease, wait time.Duration, opts ...AcquireOption) (*Block, error) {
	if err := checkDurations(lease, wait); err != nil {
		return nil, err
	}
	if err := checkKeys(keys); err != nil {
		return nil, err
	}
	if len(keys) > 1 {
		v, err := c.Hello(ctx)
		if err != nil {
			return nil, err
		}
		if v < 2 {
			return nil, fmt.Errorf("%w: a seat block (AcquireBlock of %d keys) needs protocol version 2, "+
				"and the sidecar speaks version %d: upgrade the sidecar", ErrNotSupported, len(keys), v)
		}
	}
	return c.lockKeys(ctx, append([]string(nil), keys...), lease, wait, acquireOptions(opts))
}

// Hello returns the protocol version this client and the sidecar both
// speak (unixapi/PROTOCOL.md, "Versions"): the answer to the HELLO that
// Dial sends (once per Client; a version-2 sidecar, which refuses its
// events option, is asked once more without it). A version-1 sidecar,
// which does not know HELLO, is version 1.
func (c *Client) Hello(ctx context.Context) (int, error) {
	select {
	case <-c.helloDone:
	case <-ctx.Done():
		return 0, fmt.Errorf("ticketing: HELLO: %w", ctx.Err())
	}
	c.helloMu.Lock()
	defer c.helloMu.Unlock()
	if c.version != 0 {
		return c.version, nil
	}
	r, err := c.do(ctx, "HELLO "+strconv.Itoa(ProtocolVersion), nil)
	if err != nil {
		return 0, err
	}
	v := 0
	if s, ok := strings.CutPrefix(r, "HELLO "); ok {
		n, perr := strconv.Atoi(s)
		if perr != nil || n < 1 || n > ProtocolVersion {
			return 0, unexpected("HELLO", r)
		}
		v = n
	} else {
		var e *Error
		if err := outcome("HELLO", r); !errors.As(err, &e) || e.Code != "unknown_verb" {
			return 0, err
		}
		v = 1 // a version-1 sidecar: ERR unknown_verb
	}
	c.version = v
	c.labelled.Store(v >= 5)
	return v, nil
}

// Events reports whether the sidecar sends this Client event lines (it
// agreed to HELLO's events option): without them a Lock learns of its loss
// only from its local deadline, an Extend refused, or the connection's end.
func (c *Client) Events(ctx context.Context) (bool, error) {
	if _, err := c.Hello(ctx); err != nil {
		return false, err
	}
	c.helloMu.Lock()
	defer c.helloMu.Unlock()
	return c.events, nil
}

func checkLease(lease time.Duration) error {
	if lease%time.Second != 0 || lease < time.Second || lease > MaxLease {
		return fmt.Errorf("%w: lease %v: whole seconds 1..250", ErrInvalidArgument, lease)
	}
	return nil
}

func checkDurations(lease, wait time.Duration) error {
	if err := checkLease(lease); err != nil {
		return err
	}
	if wait%time.Millisecond != 0 || wait < 0 || wait > MaxWait {
		return fmt.Errorf("%w: wait %v: whole milliseconds 0..300s", ErrInvalidArgument, wait)
	}
	return nil
}

// checkKeys applies the rules of a block's keys: 1..16 distinct keys, each
// a valid key.
func checkKeys(keys []string) error {
	if len(keys) == 0 || len(keys) > MaxBlockKeys {
		return fmt.Errorf("%w: %d keys (a block has 1..%d)", ErrInvalidArgument, len(keys), MaxBlockKeys)
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return err
		}
		if seen[k] {
			return fmt.Errorf("%w: key %q named twice (a block's keys are distinct)", ErrInvalidArgument, k)
		}
		seen[k] = true
	}
	return nil
}

// acquire sends the ACQUIRE of keys (checked, as lease and wait) and
// returns the token.
func (c *Client) acquire(ctx context.Context, keys []string, lease, wait time.Duration, o acquireOpts) (uint64, error) {
	if err := c.checkLabel(ctx, o.label); err != nil {
		return 0, err
	}
	cl := &call{line: acquireLine(keys, lease, wait, o.label), onQueued: o.queued, keys: keys, onOrphan: func(reply string) {
		// Nobody waits for this grant any more: release it so the keys
		// are not held until the lease ends (RELEASE of any key of a
		// block frees all of them).
		if tok, ok := strings.CutPrefix(reply, "OK "); ok {
			_, _ = c.send("RELEASE "+keys[0]+" "+tok, nil) // failing, the connection is gone, and its locks with it
		}
	}}
	r, err := c.roundTrip(ctx, cl)
	if err != nil {
		return 0, err
	}
	if tok, ok := strings.CutPrefix(r, "OK "); ok {
		t, err := strconv.ParseUint(tok, 10, 64)
		if err != nil || t == 0 {
			return 0, unexpected("ACQUIRE", r)
		}
		return t, nil
	}
	return 0, outcome("ACQUIRE", r)
}

// acquireLine is the ACQUIRE request of keys, with its label field when
// it has one (version 5).
func acquireLine(keys []string, lease, wait time.Duration, label string) string {
	ms := wait.Milliseconds()
	line := fmt.Sprintf("ACQUIRE %s %d %d.%03d", strings.Join(keys, " "), lease/time.Second, ms/1000, ms%1000)
	if label != "" {
		line += " label=" + label
	}
	return line
}

// Release releases key held under token by this Client. nil only when the
// cluster confirmed; otherwise ErrIndeterminate (the 5 s release deadline
// passed) or an *Error (ErrNotHeld: this connection holds no such lock, or
// its lease ran out; ErrTokenMismatch; ...).
func (c *Client) Release(ctx context.Context, key string, token uint64) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if token == 0 {
		return fmt.Errorf("%w: token 0 (tokens start at 1)", ErrInvalidArgument)
	}
	r, err := c.do(ctx, "RELEASE "+key+" "+strconv.FormatUint(token, 10), nil)
	if err != nil {
		return err
	}
	if r == "OK" {
		return nil
	}
	return outcome("RELEASE", r)
}

// Held returns the locks this connection holds, key to token.
func (c *Client) Held(ctx context.Context) (map[string]uint64, error) {
	r, err := c.do(ctx, "HELD", nil)
	if err != nil {
		return nil, err
	}
	f := strings.Fields(r)
	if len(f) < 2 || f[0] != "HELD" {
		return nil, outcome("HELD", r)
	}
	per := 1
	if c.labelled.Load() {
		per = 2 // version 5: each lock is key:token and its label ("-": none)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil || n*per != len(f)-2 {
		return nil, unexpected("HELD", r)
	}
	out := make(map[string]uint64, n)
	for j := 2; j < len(f); j += per {
		kt := f[j]
		// Keys may contain ':'; the token follows the last one.
		i := strings.LastIndexByte(kt, ':')
		t, err := strconv.ParseUint(kt[i+1:], 10, 64)
		if i <= 0 || err != nil {
			return nil, unexpected("HELD", r)
		}
		out[kt[:i]] = t
	}
	return out, nil
}

// Do sends one raw request line (without "\n") and returns the raw reply
// line, for tools and tests. A lock acquired this way is still owned by
// the connection and released when it closes.
func (c *Client) Do(ctx context.Context, line string) (string, error) {
	if strings.ContainsAny(line, "\r\n") {
		return "", fmt.Errorf("%w: a request line cannot contain CR or LF", ErrInvalidArgument)
	}
	return c.do(ctx, line, nil)
}

// checkKey applies the protocol's key rule: 1..255 bytes of 0x21..0x7E.
func checkKey(key string) error {
	if len(key) == 0 || len(key) > 255 {
		return fmt.Errorf("%w: key of %d bytes (1..255)", ErrInvalidArgument, len(key))
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7E {
			return fmt.Errorf("%w: key %q: byte 0x%02x outside visible ASCII", ErrInvalidArgument, key, key[i])
		}
	}
	return nil
}

// outcome maps a reply that is not a success to an error.
func outcome(verb, r string) error {
	switch r {
	case "BUSY":
		return ErrBusy
	case "TIMEOUT":
		return ErrTimeout
	case "INDETERMINATE":
		return ErrIndeterminate
	}
	if rest, ok := strings.CutPrefix(r, "ERR "); ok {
		code, msg, _ := strings.Cut(rest, " ")
		return &Error{Code: code, Message: msg}
	}
	return unexpected(verb, r)
}

func unexpected(verb, r string) error {
	if len(r) > 80 {
		r = r[:80] + "..."
	}
	return fmt.Errorf("%w: unexpected reply to %s: %q", ErrProtocol, verb, r)
}

// do sends line and waits for its reply or ctx.
func (c *Client) do(ctx context.Context, line string, onOrphan func(string)) (string, error) {
	return c.doHook(ctx, line, nil, onOrphan)
}

// doHook is do with the call's onReply hook.
func (c *Client) doHook(ctx context.Context, line string, onReply, onOrphan func(string)) (string, error) {
	return c.roundTrip(ctx, &call{line: line, onOrphan: onOrphan, onReply: onReply})
}

// roundTrip sends cl's line and waits for its reply or ctx.
func (c *Client) roundTrip(ctx context.Context, cl *call) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	line := cl.line
	cl.ch = make(chan string, 1)
	if err := c.enqueue(cl); err != nil {
		return "", err
	}
	select {
	case r, ok := <-cl.ch:
		if !ok {
			return "", c.closedErr()
		}
		return r, nil
	case <-ctx.Done():
		// Under cl.mu so the reader either sees orphaned or has already
		// delivered the reply, which is then handled as an orphan here.
		cl.mu.Lock()
		cl.orphaned = true
		select {
		case r, ok := <-cl.ch:
			if ok && cl.onOrphan != nil {
				go cl.onOrphan(r)
			}
		default:
		}
		cl.mu.Unlock()
		return "", fmt.Errorf("ticketing: %s: %w", strings.SplitN(line, " ", 2)[0], ctx.Err())
	}
}

// send writes line and queues its call; order of the queue is the order of
// the writes, which is the order of the replies.
func (c *Client) send(line string, onOrphan func(string)) (*call, error) {
	cl := &call{line: line, ch: make(chan string, 1), onOrphan: onOrphan}
	return cl, c.enqueue(cl)
}

// enqueue writes cl's line and queues cl.
func (c *Client) enqueue(cl *call) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return fmt.Errorf("%w: %w", ErrClosed, c.err)
	}
	// Queue before writing: the reply may arrive before Write returns.
	c.pending = append(c.pending, cl)
	cl.n = c.written + 1
	if cl.onQueued != nil {
		if c.queuedCalls == nil {
			c.queuedCalls = make(map[uint64]*call)
		}
		c.queuedCalls[cl.n] = cl
	}
	if _, err := c.conn.Write([]byte(cl.line + "\n")); err != nil {
		c.pending = c.pending[:len(c.pending)-1]
		delete(c.queuedCalls, cl.n)
		c.err = err
		c.conn.Close()
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	c.written++
	return nil
}

func (c *Client) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(c.err, ErrClosed) {
		return c.err
	}
	return fmt.Errorf("%w: %w", ErrClosed, c.err)
}

func (c *Client) readLoop() {
	defer close(c.done)
	br := bufio.NewReaderSize(c.conn, 4096)
	var err, refusal error
	for {
		var line string
		line, err = br.ReadString('\n')
		if err != nil {
			break
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if strings.HasPrefix(line, "!") {
			// An event line (no reply starts with "!"): never a reply,
			// whatever it says.
			c.event(line)
			continue
		}
		c.mu.Lock()
		if len(c.pending) == 0 {
			c.mu.Unlock()
			// A reply nobody asked for: the sidecar refused the connection
			// (ERR forbidden, too_many_connections) or a bug. Record it as
			// the reason the connection ends.
			if refusal == nil {
				refusal = outcome("", line)
			}
			continue
		}
		cl := c.pending[0]
		c.pending[0] = nil
		c.pending = c.pending[1:]
		if cl.onQueued != nil {
			delete(c.queuedCalls, cl.n) // a QUEUED comes before the reply or not at all
		}
		c.mu.Unlock()
		if cl.hello && refusal == nil {
			// A refused connection (ERR forbidden, too_many_connections)
			// has its refusal taken for the reply to the HELLO.
			var e *Error
			if errors.As(outcome("HELLO", line), &e) && e.Code != "unknown_verb" && e.Code != "bad_request" {
				refusal = e
			}
		}
		if cl.onReply != nil {
			cl.onReply(line)
		}
		cl.mu.Lock()
		if !cl.orphaned {
			cl.ch <- line // buffered: never blocks
		} else if cl.onOrphan != nil {
			go cl.onOrphan(line)
		}
		cl.mu.Unlock()
	}
	if refusal != nil {
		err = refusal
	}
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	pending := c.pending
	c.pending, c.queuedCalls = nil, nil
	c.mu.Unlock()
	c.conn.Close()
	c.helloOnce.Do(func() { close(c.helloDone) })
	c.lostAll()
	for _, cl := range pending {
		close(cl.ch)
	}
}

// WaitReady polls the sidecar at path until its INFO names a leader (the
// sidecar is up and reaches a serving cluster) or ctx ends.
func WaitReady(ctx context.Context, path string) error {
	var last string
	for {
		c, err := Dial(ctx, path)
		if err == nil {
			last, err = c.Info(ctx)
			c.Close()
			if err == nil && !strings.Contains(last, "leader=-") {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sidecar on %s not ready (last INFO %q, err %v): %w", path, last, err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
