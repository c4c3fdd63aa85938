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
// When the connection is lost (the sidecar restarted, or closed it), the
// requests pending on it fail with ErrClosed and every Lock taken through
// it is lost (LostDisconnected); the next call dials again and goes on as
// a new session that holds nothing, as the Python and Node.js libraries do
// (clients/README.md). Only Close ends a Client for good.
//
// Dial's path defaults to $TICKETING_SOCKET, else ./ticketing.sock.
//
// Acquire takes one key; AcquireBlock takes a seat block, 2..16 keys all at
// once or none, under one fencing token (protocol version 2).
//
// Lock and LockBlock return a Lock object that knows when it is lost
// (protocol version 3): its Context is cancelled on the sidecar's lost
// event, at the local validity deadline, or when the connection ends, and
// Extend renews its lease. Every Client asks for event lines when it
// connects (HELLO 9 events); against an older sidecar it works without
// them, and a Lock then relies on its local deadline. A Lock an operator
// revoked is lost with LostRevoked, and (protocol version 9's
// "! REVOKED" event) Lock.Revoked says who revoked it and why.
//
// WithQueued, an option of every acquire, tells the caller when the
// cluster queued its acquire (protocol version 4's "! QUEUED" event);
// WithPosition, its place in line and the estimated wait as they change
// (protocol version 7's "! POSITION" event).
//
// AcquirePermit (LockPermit) takes one permit of a semaphore key and
// returns it as a Lock with its Slot (protocol version 8); SetPermits,
// an operator's call, defines a key's number of permits.
//
// Info returns the sidecar's INFO parsed; Domain the cluster's fencing
// domain, by which fence high-water marks are keyed (clients/go/fence).
//
// # Importing it from another module
//
// This package is ticketing/clients/go in the repository's module
// "ticketing", a module path that cannot be fetched (it has no dot).
// Require it and replace it with a checkout of the repository:
//
//	go mod edit -require=ticketing@v0.0.0 -replace=ticketing=../ticketing
//	go mod tidy
//
// and import "ticketing/clients/go" (package ticketing) and, for the
// fencing helpers, "ticketing/clients/go/fence".
package ticketing

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
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
	// ErrIsSemaphore: an acquire (Acquire, Lock, a block) named a key that
	// is a semaphore; take a permit of it (AcquirePermit). Nothing acquired.
	ErrIsSemaphore = &Error{Code: "is_semaphore"}
	// ErrNotSemaphore: AcquirePermit of a key that is not a semaphore
	// (SetPermits makes it one), or SetPermits 0 of such a key.
	ErrNotSemaphore = &Error{Code: "not_semaphore"}
	// ErrInvalidPermits: SetPermits' n outside 0..MaxPermits (the
	// sidecar's own check; SetPermits checks before sending).
	ErrInvalidPermits = &Error{Code: "invalid_permits"}
	// ErrInUse: SetPermits of a key held as a lock, or SetPermits 0 of a
	// semaphore with a permit held or someone waiting. Nothing changed.
	ErrInUse = &Error{Code: "in_use"}
)

// Limits of the protocol, checked before sending.
const (
	MaxLease = 250 * time.Second
	// MaxWait is the longest wait: an hour, from a sidecar of protocol
	// version 6 on a cluster of protocol version 11.
	MaxWait = time.Hour
	// MaxShortWait is the longest wait a sidecar older than protocol
	// version 6 takes (a longer one is ErrNotSupported, nothing sent).
	MaxShortWait = 300 * time.Second
	// MaxBlockKeys is the most keys one AcquireBlock may name.
	MaxBlockKeys = 16
)

// ProtocolVersion is the version of unixapi/PROTOCOL.md this client
// speaks: 9, which added the REVOKED event (who revoked a lock and why:
// Lock.Revoked), version 8 semaphores (PERMIT and PERMITS: AcquirePermit,
// LockPermit, SetPermits), version 7 the POSITION event (version 6 waits up to an
// hour, version 5 owner labels, version 4 the QUEUED event, version 3
// EXTEND and the lost events, version 2 seat blocks and HELLO).
const ProtocolVersion = 9

// MaxLabelLen is the longest owner label (WithLabel) in bytes.
const MaxLabelLen = 64

// Client is a connection to the sidecar that dials again, on the next
// call, once the connection it had is lost.
type Client struct {
	// path is the socket the Client dials, "" for a Client made on a given
	// connection (tests), which never dials again.
	path string

	mu     sync.Mutex // guards cur and closed; held while dialing again
	cur    *conn      // the connection of the next call; never nil
	closed bool       // Close was called: no dialing again

	// sent counts the request lines written over every connection, so a
	// test can tell that a request left before it takes its next step.
	sent atomic.Uint64

	now func() time.Time // the clock of lock deadlines; nil = time.Now (tests set it)
}

// conn is one connection to the sidecar, which is one session: the locks
// acquired on it belong to it.
type conn struct {
	c  *Client
	nc net.Conn

	mu      sync.Mutex // serialises writes and the order of pending
	pending []*call    // requests written, oldest first
	err     error      // set once the connection broke or was closed
	done    chan struct{}
	// written counts the request lines written on this connection (guarded
	// by mu), so that a QUEUED or POSITION event, which names its ACQUIRE
	// by this count, finds it.
	written uint64
	// hookCalls are the pending ACQUIREs with a WithQueued or WithPosition
	// hook, by their position among the lines written (guarded by mu).
	// A call leaves it when its reply is read, so no hook runs after it.
	hookCalls map[uint64]*call

	helloMu sync.Mutex // one HELLO at a time
	version int        // guarded by helloMu: the version HELLO agreed, 0 = not known yet
	events  bool       // guarded by helloMu: the sidecar sends event lines
	// helloDone is closed once the HELLO pipelined first is answered (or
	// the connection ended first); version and events are set then.
	helloDone chan struct{}
	helloOnce sync.Once
	// labelled: the agreed version has labels (5): HELD and LOST lines
	// carry them. Atomic: the reader reads it without helloMu, which
	// Hello holds across a round trip.
	labelled atomic.Bool

	lmu   sync.Mutex       // guards locks, lostDone, revoke and unclaimed
	locks map[uint64]*Lock // the Locks that events may name, by token
	// unclaimed: LOST events of tokens no Lock has yet, for the Lock
	// registered next under that token: events never wait for replies,
	// so a lock's LOST can come before its OK (an ACQUIRE answered
	// behind another's reply, revoked meanwhile: issue 42's second attack
	// round). At most maxUnclaimed, the oldest forgotten first.
	unclaimed      map[uint64]unclaimedLoss
	unclaimedOrder []uint64
	// revoke is the last "! REVOKED" line read (version 9), for the
	// "! LOST <token> revoked" line right after it.
	revoke revokeNote
	// lostDone: lostAll ran (Close, or the connection ended). A grant the
	// reader reads after it (already buffered) makes a Lock lost at once,
	// LostDisconnected, before it is returned: the sidecar sees (or soon
	// sees) the close and releases it (issue 39, attack round 5).
	lostDone bool

	// domain is the fencing domain INFO named on this connection (guarded
	// by mu), "" until one did: a sidecar holds to the first domain it
	// sees, so it does not change while the connection lives.
	domain string
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
	// queuedDone: onQueued ran or was skipped for a QUEUED already
	// (guarded by the conn's mu): a repeated QUEUED is not news.
	queuedDone bool
	// onPosition, if set, runs for each POSITION event that names this
	// call and one of its keys, unless the caller stopped waiting.
	onPosition func(Position)
	keys       []string
	n          uint64 // the call's position among the lines written
	written    bool   // enqueue wrote the line (set by the caller's goroutine)
	mu         sync.Mutex
	orphaned   bool
	hello      bool // the HELLO sent by Dial: an ERR to it may be a refusal
}

// SocketEnv is the environment variable that names the sidecar's socket
// when Dial is given no path; DefaultSocket is the path when it is unset
// too.
const (
	SocketEnv     = "TICKETING_SOCKET"
	DefaultSocket = "./ticketing.sock"
)

// SocketPath is the socket Dial(ctx, path) connects to: path, else
// $TICKETING_SOCKET, else ./ticketing.sock.
func SocketPath(path string) string {
	if path != "" {
		return path
	}
	if env := os.Getenv(SocketEnv); env != "" {
		return env
	}
	return DefaultSocket
}

// Dial connects to the sidecar's socket at path ("" = $TICKETING_SOCKET,
// else ./ticketing.sock; see SocketPath). The Client keeps that path and
// dials it again on the first call after its connection was lost.
func Dial(ctx context.Context, path string) (*Client, error) {
	c := &Client{path: SocketPath(path)}
	cn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.cur = cn
	return c, nil
}

// dial opens a new connection to c.path.
func (c *Client) dial(ctx context.Context) (*conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.path)
	switch {
	case errors.Is(err, syscall.ENOENT):
		return nil, fmt.Errorf("%w at %s: no socket file there; %s: %w", ErrNoSidecar, c.path, noSidecarHint, err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return nil, fmt.Errorf("%w at %s: nothing serves that socket file (left by a sidecar that stopped?); %s: %w",
			ErrNoSidecar, c.path, noSidecarHint, err)
	case err != nil:
		return nil, fmt.Errorf("ticketing: dial %s: %w", c.path, err)
	}
	return newConn(c, nc)
}

// newClient is a Client of the connection nc, which it never replaces
// (tests give it one end of a pipe).
func newClient(nc net.Conn) (*Client, error) {
	c := &Client{}
	cn, err := newConn(c, nc)
	if err != nil {
		return nil, err
	}
	c.cur = cn
	return c, nil
}

// newConn runs the connection nc of c: its reader, and the HELLO that asks
// for the version and event lines, pipelined before the first request.
func newConn(c *Client, nc net.Conn) (*conn, error) {
	cn := &conn{c: c, nc: nc, done: make(chan struct{}), helloDone: make(chan struct{})}
	go cn.readLoop()
	cl := &call{line: helloLine, ch: make(chan string, 1), hello: true, onReply: cn.helloReply}
	if err := cn.enqueue(cl); err != nil {
		nc.Close()
		<-cn.done
		return nil, err
	}
	return cn, nil
}

// conn returns the connection of the next call: the current one while it
// lives, else a new one (a new session, holding nothing). A Client that
// was closed, or that cannot dial (made on a given connection), returns
// the current one, whose calls then fail with ErrClosed.
func (c *Client) conn(ctx context.Context) (*conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.path == "" || c.cur.alive() {
		return c.cur, nil
	}
	cn, err := c.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrClosed, err)
	}
	c.cur = cn
	return cn, nil
}

// alive reports whether the connection has not ended.
func (cn *conn) alive() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err == nil
}

// helloLine is the first line of every connection.
var helloLine = "HELLO " + strconv.Itoa(ProtocolVersion) + " events"

// helloReply takes in the reply to the connection's first HELLO. "HELLO
// <v> events": version v, events on; "HELLO <v>": no events; unknown_verb:
// a version-1 sidecar. A version-2 sidecar refuses the events option
// (bad_request): hello then asks again without it.
func (cn *conn) helloReply(r string) {
	cn.helloMu.Lock()
	defer cn.helloMu.Unlock()
	defer cn.helloOnce.Do(func() { close(cn.helloDone) })
	if s, ok := strings.CutPrefix(r, "HELLO "); ok {
		v, opt, _ := strings.Cut(s, " ")
		if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= ProtocolVersion {
			cn.version, cn.events = n, opt == "events" && n >= 3
			cn.labelled.Store(n >= 5)
		}
		return
	}
	var e *Error
	if errors.As(outcome("HELLO", r), &e) && e.Code == "unknown_verb" {
		cn.version = 1
	}
}

// clock is the time of lock deadlines.
func (c *Client) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// Done is closed when the Client's current connection is gone; every lock
// acquired through it has then been handed back to the sidecar for
// release. The next call dials a new connection (unless the Client was
// closed), and Done then reports on that one.
func (c *Client) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur.done
}

// Close closes the connection, for good: later calls fail with ErrClosed.
// The sidecar releases every lock this Client still holds and cancels its
// pending acquires. Every Lock still held is lost (LostDisconnected: its
// Context is cancelled, Lost closed) before the connection closes, so
// before the sidecar can release it and hand its key on; so is a Lock
// whose grant was on its way (read after Close began): an Acquire
// returning during or after Close returns a Lock already lost.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	cn := c.cur
	c.mu.Unlock()
	return cn.close()
}

// close closes the connection and waits for its reader to end. Its locks
// are told lost first: closing the socket makes the sidecar release them.
func (cn *conn) close() error {
	cn.mu.Lock()
	if cn.err == nil {
		cn.err = ErrClosed
	}
	cn.mu.Unlock()
	cn.lostAll()
	err := cn.nc.Close()
	<-cn.done
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Ping checks that the sidecar answers.
func (c *Client) Ping(ctx context.Context) error {
	r, err := c.do(ctx, "PING")
	if err != nil {
		return err
	}
	if r != "PONG" {
		return outcome("PING", r)
	}
	return nil
}

// Info returns the sidecar's INFO reply, parsed (see Info).
func (c *Client) Info(ctx context.Context) (Info, error) {
	cn, err := c.conn(ctx)
	if err != nil {
		return Info{}, err
	}
	return cn.info(ctx)
}

// info sends INFO on this connection, and remembers the domain it names.
func (cn *conn) info(ctx context.Context) (Info, error) {
	r, err := cn.do(ctx, "INFO")
	if err != nil {
		return Info{}, err
	}
	in, err := ParseInfo(r)
	if err == nil && in.Domain != "" {
		cn.mu.Lock()
		if cn.domain == "" {
			cn.domain = in.Domain
		}
		cn.mu.Unlock()
	}
	return in, err
}

// Domain returns the fencing domain of the cluster behind the sidecar:
// INFO's domain field, the name of the sequence the tokens of this Client
// belong to (unixapi/PROTOCOL.md, INFO; clients/FENCING.md, "Fencing
// domains"). Key fence high-water marks by it: clients/go/fence's
// DoLock and AdvanceLock take it from the Lock, fence.Domain from a
// Client. ErrNoDomain while no node has named it yet (INFO says
// "domain=-"). Asked once per connection: a sidecar holds to the first
// domain it sees.
func (c *Client) Domain(ctx context.Context) (string, error) {
	cn, err := c.conn(ctx)
	if err != nil {
		return "", err
	}
	return cn.fencingDomain(ctx)
}

// fencingDomain is the domain of this connection's sidecar.
func (cn *conn) fencingDomain(ctx context.Context) (string, error) {
	cn.mu.Lock()
	d := cn.domain
	cn.mu.Unlock()
	if d != "" {
		return d, nil
	}
	in, err := cn.info(ctx)
	if err != nil {
		return "", err
	}
	if in.Domain == "" {
		return "", fmt.Errorf("%w: the sidecar at %s reports domain=- (it has not reached a node of its cluster yet)", ErrNoDomain, cn.c.path)
	}
	return in.Domain, nil
}

// Acquire takes key for lease (whole seconds, 1..250 s), waiting at most
// wait (milliseconds, 0 = one immediate try, at most an hour: MaxWait; over
// MaxShortWait the sidecar must speak protocol version 6, else
// ErrNotSupported, nothing sent) for its turn.
// It returns the fencing token, or ErrBusy, ErrTimeout, ErrIndeterminate,
// an *Error, or an error wrapping ctx.Err() or ErrClosed (not acquired).
//
// If ctx ends while the request is with the sidecar, Acquire returns at
// once; should the lock be granted anyway, the Client releases it in the
// background. Give ctx a deadline above wait, or leave it to wait alone.
//
// A key that is a semaphore is ErrIsSemaphore: take a permit of it
// (AcquirePermit).
//
// Options: WithQueued, WithPosition, WithLabel.
func (c *Client) Acquire(ctx context.Context, key string, lease, wait time.Duration, opts ...AcquireOption) (uint64, error) {
	if err := checkDurations(lease, wait); err != nil {
		return 0, err
	}
	if err := checkKey(key); err != nil {
		return 0, err
	}
	cn, err := c.conn(ctx)
	if err != nil {
		return 0, err
	}
	return cn.acquire(ctx, []string{key}, lease, wait, acquireOptions(opts))
}

// checkLabel checks a WithLabel label (1..MaxLabelLen bytes of 0x21..0x7E,
// not "-") and that the sidecar speaks labels (version 5): nothing is sent
// without the label the caller asked for.
func (cn *conn) checkLabel(ctx context.Context, label string) error {
	if label == "" {
		return nil
	}
	if len(label) > MaxLabelLen || label == "-" || strings.IndexFunc(label, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
		return fmt.Errorf("%w: label %q: 1..%d bytes of visible ASCII (0x21..0x7E), not \"-\"", ErrInvalidArgument, label, MaxLabelLen)
	}
	v, err := cn.hello(ctx)
	if err != nil {
		return err
	}
	if v < 5 {
		return fmt.Errorf("%w: a label needs protocol version 5, and the sidecar speaks version %d: upgrade the sidecar", ErrNotSupported, v)
	}
	return nil
}

// checkWait checks that the sidecar takes a wait over MaxShortWait
// (version 6): an older one would answer invalid_wait, which reads as the
// caller's mistake.
func (cn *conn) checkWait(ctx context.Context, wait time.Duration) error {
	if wait <= MaxShortWait {
		return nil
	}
	v, err := cn.hello(ctx)
	if err != nil {
		return err
	}
	if v < 6 {
		return fmt.Errorf("%w: a wait over %v needs protocol version 6, and the sidecar speaks version %d: upgrade the sidecar", ErrNotSupported, MaxShortWait, v)
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
// signal and can Extend (LockBlock is the same call). Options: WithQueued,
// WithPosition (one Position per key of the block), WithLabel.
func (c *Client) AcquireBlock(ctx context.Context, keys []string, lease, wait time.Duration, opts ...AcquireOption) (*Block, error) {
	if err := checkDurations(lease, wait); err != nil {
		return nil, err
	}
	if err := checkKeys(keys); err != nil {
		return nil, err
	}
	cn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	if len(keys) > 1 {
		v, err := cn.hello(ctx)
		if err != nil {
			return nil, err
		}
		if v < 2 {
			return nil, fmt.Errorf("%w: a seat block (AcquireBlock of %d keys) needs protocol version 2, "+
				"and the sidecar speaks version %d: upgrade the sidecar", ErrNotSupported, len(keys), v)
		}
	}
	return cn.lockKeys(ctx, append([]string(nil), keys...), lease, wait, acquireOptions(opts))
}

// Hello returns the protocol version this client and the sidecar both
// speak (unixapi/PROTOCOL.md, "Versions"): the answer to the HELLO that
// every connection sends first (once per connection; a version-2 sidecar,
// which refuses its events option, is asked once more without it). A
// version-1 sidecar, which does not know HELLO, is version 1.
func (c *Client) Hello(ctx context.Context) (int, error) {
	cn, err := c.conn(ctx)
	if err != nil {
		return 0, err
	}
	return cn.hello(ctx)
}

// hello is Hello on this connection.
func (cn *conn) hello(ctx context.Context) (int, error) {
	select {
	case <-cn.helloDone:
	case <-ctx.Done():
		return 0, fmt.Errorf("ticketing: HELLO: %w", ctx.Err())
	}
	cn.helloMu.Lock()
	defer cn.helloMu.Unlock()
	if cn.version != 0 {
		return cn.version, nil
	}
	r, err := cn.do(ctx, "HELLO "+strconv.Itoa(ProtocolVersion))
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
	cn.version = v
	cn.labelled.Store(v >= 5)
	return v, nil
}

// Events reports whether the sidecar sends this Client event lines (it
// agreed to HELLO's events option): without them a Lock learns of its loss
// only from its local deadline, an Extend refused, or the connection's end.
func (c *Client) Events(ctx context.Context) (bool, error) {
	cn, err := c.conn(ctx)
	if err != nil {
		return false, err
	}
	if _, err := cn.hello(ctx); err != nil {
		return false, err
	}
	cn.helloMu.Lock()
	defer cn.helloMu.Unlock()
	return cn.events, nil
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
		return fmt.Errorf("%w: wait %v: whole milliseconds 0..%v", ErrInvalidArgument, wait, MaxWait)
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
func (cn *conn) acquire(ctx context.Context, keys []string, lease, wait time.Duration, o acquireOpts) (uint64, error) {
	if err := cn.checkLabel(ctx, o.label); err != nil {
		return 0, err
	}
	if err := cn.checkWait(ctx, wait); err != nil {
		return 0, err
	}
	cl := &call{line: acquireLine(keys, lease, wait, o.label), onQueued: o.queued, onPosition: o.position, keys: keys, onOrphan: func(reply string) {
		// Nobody waits for this grant any more: release it so the keys
		// are not held until the lease ends (RELEASE of any key of a
		// block frees all of them).
		if tok, ok := strings.CutPrefix(reply, "OK "); ok {
			_, _ = cn.send("RELEASE " + keys[0] + " " + tok) // failing, the connection is gone, and its locks with it
		}
	}}
	r, err := cn.roundTrip(ctx, cl)
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
	cn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	// A Lock of this connection with that token and key is released from
	// now on, as by Lock.Release: the key may be handed on at once, and
	// the sidecar sends no lost event for a release.
	cn.releasing(key, token)
	r, err := cn.do(ctx, releaseLine(key, token))
	if err != nil {
		return err
	}
	return releaseOutcome(r)
}

func releaseLine(key string, token uint64) string {
	return "RELEASE " + key + " " + strconv.FormatUint(token, 10)
}

func releaseOutcome(r string) error {
	if r == "OK" {
		return nil
	}
	return outcome("RELEASE", r)
}

// Held returns the locks this connection holds, key to token (each key of
// a block maps to the block's token). A semaphore key of which it holds
// several permits maps to the newest permit's token: HeldLocks lists each
// permit, and gives the labels.
func (c *Client) Held(ctx context.Context) (map[string]uint64, error) {
	hl, err := c.HeldLocks(ctx)
	if err != nil {
		return nil, err
	}
	return heldByKey(hl), nil
}

// heldByKey maps HELD's entries key to token, the newest token of a key
// listed more than once (permits of one semaphore).
func heldByKey(hl []HeldLock) map[string]uint64 {
	out := make(map[string]uint64, len(hl))
	for _, h := range hl {
		out[h.Key] = max(out[h.Key], h.Token)
	}
	return out
}

// HeldLock is one entry of HELD: a key this connection holds, its token,
// and its owner label ("" for none, or when the sidecar speaks a version
// before 5, which has no labels).
type HeldLock struct {
	Key   string
	Token uint64
	Label string
}

// HeldLocks returns the locks this connection holds as HELD lists them:
// sorted by key, one entry per key (a block's keys share its token and
// label) and per permit (a semaphore key of which it holds several permits
// is listed once for each, with its token), each with its label on a
// version-5 connection.
func (c *Client) HeldLocks(ctx context.Context) ([]HeldLock, error) {
	cn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	r, err := cn.do(ctx, "HELD")
	if err != nil {
		return nil, err
	}
	return parseHeld(r, cn.labelled.Load())
}

// parseHeld reads "HELD <n> [<key>:<token> ...]", or, when labelled
// (version 5), "HELD <n> [<key>:<token> <label or -> ...]".
func parseHeld(r string, labelled bool) ([]HeldLock, error) {
	f := strings.Fields(r)
	if len(f) < 2 || f[0] != "HELD" {
		return nil, outcome("HELD", r)
	}
	per := 1
	if labelled {
		per = 2 // version 5: each lock is key:token and its label ("-": none)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil || n < 0 || n*per != len(f)-2 {
		return nil, unexpected("HELD", r)
	}
	out := make([]HeldLock, 0, n)
	for j := 2; j < len(f); j += per {
		kt := f[j]
		// Keys may contain ':'; the token follows the last one.
		i := strings.LastIndexByte(kt, ':')
		if i <= 0 {
			return nil, unexpected("HELD", r)
		}
		t, err := strconv.ParseUint(kt[i+1:], 10, 64)
		if err != nil {
			return nil, unexpected("HELD", r)
		}
		h := HeldLock{Key: kt[:i], Token: t}
		if labelled && f[j+1] != "-" {
			h.Label = f[j+1]
		}
		out = append(out, h)
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
	return c.do(ctx, line)
}

// CheckKey reports whether key is a valid lock key: 1..255 bytes of
// visible ASCII (0x21..0x7E), the protocol's rule. The error wraps
// ErrInvalidArgument and says what is wrong. Every method checks its keys
// before sending; this lets a program (a CLI) check them before it dials.
func CheckKey(key string) error { return checkKey(key) }

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

// do sends line on the connection of the next call (dialing again if the
// last one was lost) and waits for its reply or ctx.
func (c *Client) do(ctx context.Context, line string) (string, error) {
	cn, err := c.conn(ctx)
	if err != nil {
		return "", err
	}
	return cn.do(ctx, line)
}

// do sends line on this connection and waits for its reply or ctx.
func (cn *conn) do(ctx context.Context, line string) (string, error) {
	return cn.roundTrip(ctx, &call{line: line})
}

// roundTrip sends cl's line and waits for its reply or ctx.
func (cn *conn) roundTrip(ctx context.Context, cl *call) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	line := cl.line
	cl.ch = make(chan string, 1)
	if err := cn.enqueue(cl); err != nil {
		return "", err
	}
	select {
	case r, ok := <-cl.ch:
		if !ok {
			return "", cn.closedErr()
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
func (cn *conn) send(line string) (*call, error) {
	cl := &call{line: line, ch: make(chan string, 1)}
	return cl, cn.enqueue(cl)
}

// enqueue writes cl's line and queues cl.
func (cn *conn) enqueue(cl *call) error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.err != nil {
		return fmt.Errorf("%w: %w", ErrClosed, cn.err)
	}
	// Queue before writing: the reply may arrive before Write returns.
	cn.pending = append(cn.pending, cl)
	cl.n = cn.written + 1
	if cl.onQueued != nil || cl.onPosition != nil {
		if cn.hookCalls == nil {
			cn.hookCalls = make(map[uint64]*call)
		}
		cn.hookCalls[cl.n] = cl
	}
	if _, err := cn.nc.Write([]byte(cl.line + "\n")); err != nil {
		cn.pending = cn.pending[:len(cn.pending)-1]
		delete(cn.hookCalls, cl.n)
		// The Locks are lost before anyone can see the connection's end
		// (cn.err, under cn.mu): a caller failing with ErrClosed finds its
		// Lock lost. Lock order: cn.mu before cn.lmu before a Lock's mu.
		cn.lostAll()
		cn.err = err
		cn.nc.Close()
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	cn.written++
	cn.c.sent.Add(1)
	cl.written = true
	return nil
}

func (cn *conn) closedErr() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if errors.Is(cn.err, ErrClosed) {
		return cn.err
	}
	return fmt.Errorf("%w: %w", ErrClosed, cn.err)
}

func (cn *conn) readLoop() {
	defer close(cn.done)
	br := bufio.NewReaderSize(cn.nc, 4096)
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
			cn.event(line)
			continue
		}
		cn.mu.Lock()
		if len(cn.pending) == 0 {
			cn.mu.Unlock()
			// A reply nobody asked for: the sidecar refused the connection
			// (ERR forbidden, too_many_connections) or a bug. Record it as
			// the reason the connection ends.
			if refusal == nil {
				refusal = outcome("", line)
			}
			continue
		}
		cl := cn.pending[0]
		cn.pending[0] = nil
		cn.pending = cn.pending[1:]
		if cl.onQueued != nil || cl.onPosition != nil {
			delete(cn.hookCalls, cl.n) // QUEUED and POSITION come before the reply or not at all
		}
		cn.mu.Unlock()
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
	// The Locks are lost before the connection's end is published
	// (cn.err): a call that fails with ErrClosed from then on finds its
	// Lock lost (the session is gone: the sidecar releases its locks).
	cn.lostAll()
	cn.mu.Lock()
	if cn.err == nil {
		cn.err = err
	}
	pending := cn.pending
	cn.pending, cn.hookCalls = nil, nil
	cn.mu.Unlock()
	cn.nc.Close()
	cn.helloOnce.Do(func() { close(cn.helloDone) })
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
			var in Info
			in, err = c.Info(ctx)
			c.Close()
			last = in.Raw
			if err == nil && in.Leader != "" {
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
