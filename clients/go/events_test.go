package ticketing

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEnd is the sidecar's end of a net.Pipe: the test reads the Client's
// request lines from reqs and writes whatever lines it likes.
type fakeEnd struct {
	t    *testing.T
	conn net.Conn
	reqs chan string
}

// pipeClient is a Client over a net.Pipe whose other end the test plays.
// hello is the answer to Dial's HELLO ("" = leave it to the test).
func pipeClient(t *testing.T, hello string) (*Client, *fakeEnd) {
	t.Helper()
	cc, sc := net.Pipe()
	f := &fakeEnd{t: t, conn: sc, reqs: make(chan string, 64)}
	go func() {
		defer close(f.reqs)
		br := bufio.NewReader(sc)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			f.reqs <- strings.TrimSuffix(line, "\n")
		}
	}()
	c, err := newClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); sc.Close() })
	if got := f.req(); got != "HELLO 9 events" {
		t.Fatalf("first line %q, want HELLO 9 events", got)
	}
	if hello != "" {
		f.write(hello)
	}
	return c, f
}

// req is the next request line.
func (f *fakeEnd) req() string {
	f.t.Helper()
	select {
	case r, ok := <-f.reqs:
		if !ok {
			f.t.Fatal("the client closed the connection")
		}
		return r
	case <-time.After(10 * time.Second):
		f.t.Fatal("no request within 10s")
		return ""
	}
}

// noReq fails if a request line was written.
func (f *fakeEnd) noReq() {
	f.t.Helper()
	select {
	case r := <-f.reqs:
		f.t.Fatalf("unexpected request %q", r)
	case <-time.After(20 * time.Millisecond):
	}
}

func (f *fakeEnd) write(lines ...string) {
	f.t.Helper()
	if _, err := f.conn.Write([]byte(strings.Join(lines, "\n") + "\n")); err != nil {
		f.t.Fatal(err)
	}
}

// async runs fn in a goroutine; its result is on the channel.
func async[T any](fn func() T) <-chan T {
	ch := make(chan T, 1)
	go func() { ch <- fn() }()
	return ch
}

func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("no result within 10s")
		var zero T
		return zero
	}
}

type lockRes struct {
	l   *Lock
	err error
}

// takeLock has the Client Lock key, answered with grant (e.g. "OK 5")
// preceded by the lines before.
func takeLock(t *testing.T, c *Client, f *fakeEnd, key string, lease time.Duration, before []string, grant string) *Lock {
	t.Helper()
	ch := async(func() lockRes {
		l, err := c.Lock(context.Background(), key, lease, 0)
		return lockRes{l, err}
	})
	if r := f.req(); r != "ACQUIRE "+key+fmt.Sprintf(" %d 0.000", lease/time.Second) {
		t.Fatalf("request %q", r)
	}
	f.write(append(before, grant)...)
	res := recv(t, ch)
	if res.err != nil {
		t.Fatalf("Lock: %v", res.err)
	}
	return res.l
}

func isLost(l *Lock) bool {
	select {
	case <-l.Lost():
		return true
	default:
		return false
	}
}

func waitLost(t *testing.T, l *Lock, reason string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.LostReason() != reason {
		if time.Now().After(deadline) {
			t.Fatalf("LostReason %q, want %q", l.LostReason(), reason)
		}
		time.Sleep(time.Millisecond)
	}
	if !isLost(l) {
		t.Fatalf("LostReason %q but Lost() is open", reason)
	}
}

// Event lines before, between and after replies are never replies: each
// call gets its own reply, the LOST of the lock's token fires it with the
// sidecar's reason, and unknown events and tokens are ignored. (A LOST of
// the lock's own token before its OK fires it too, once it is
// registered: TestLostBeforeItsOK.)
func TestEventsBetweenReplies(t *testing.T) {
	c, f := pipeClient(t, "! LOST 99 expired nobody\nHELLO 3 events")
	if ev, err := c.Events(context.Background()); err != nil || !ev {
		t.Fatalf("Events: %v, %v", ev, err)
	}
	l := takeLock(t, c, f, "k", 30*time.Second, []string{"! LOST 7 expired k", "! HELLO 3 events"}, "OK 5")
	if l.Token() != 5 || l.Key() != "k" || isLost(l) {
		t.Fatalf("lock %d %q lost=%v: an event of another token before the grant fired it", l.Token(), l.Key(), isLost(l))
	}
	// Two requests in flight; the goroutines may send them in either
	// order, and each reply goes where its request's position says.
	ping := async(func() error { return c.Ping(context.Background()) })
	held := async(func() error { _, err := c.Held(context.Background()); return err })
	replies := map[string]string{"PING": "PONG", "HELD": "HELD 0"}
	first, second := replies[f.req()], replies[f.req()]
	f.write("! FUTURE 5 something", "! LOST 6 expired other", "! LOST 5 expired k", first, "! LOST 5 moved k", second)
	if err := recv(t, ping); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if err := recv(t, held); err != nil {
		t.Fatalf("Held: %v", err)
	}
	waitLost(t, l, LostExpired)
	cause := context.Cause(l.Context())
	var le *LostError
	if !errors.Is(cause, ErrLockLost) || !errors.As(cause, &le) || le.Reason != LostExpired || le.Token != 5 || le.Keys[0] != "k" {
		t.Fatalf("cause %v", cause)
	}
	if l.Remaining() != 0 {
		t.Fatalf("Remaining %v after the loss", l.Remaining())
	}
	// An unknown reason is a loss all the same.
	l2 := takeLock(t, c, f, "k2", 30*time.Second, nil, "OK 8")
	f.write("! LOST 8 eaten-by-grue k2")
	waitLost(t, l2, "eaten-by-grue")
}

// Malformed event lines are ignored and do not shift the replies.
func TestMalformedEventLines(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	l := takeLock(t, c, f, "k", 30*time.Second, nil, "OK 5")
	bad := []string{"!", "! ", "!LOST 5 expired k", "! LOST", "! LOST 5", "! LOST 5 expired", "! LOST abc expired k",
		"! LOST 0 expired k", "! LOST -5 expired k", "! LOST 5  k", "! LOST 5 expired  k", "! LOST 5 expired k ",
		"!  LOST 5 expired k", "! lost 5 expired k", "! LOST 18446744073709551621 expired k", "! LOST 5 expired k\x7f"}
	for _, ev := range bad {
		ping := async(func() error { return c.Ping(context.Background()) })
		f.req()
		f.write(ev, "PONG")
		if err := recv(t, ping); err != nil {
			t.Fatalf("Ping after %q: %v", ev, err)
		}
		if isLost(l) {
			t.Fatalf("%q fired the lock", ev)
		}
	}
	f.write("! LOST 5 compensated k\r") // a CR before the LF is tolerated
	waitLost(t, l, LostCompensated)
}

// An event for a released lock is ignored: the signal of a released lock
// never fires, not even at its deadline or when the connection ends.
func TestEventForReleasedLock(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	l := takeLock(t, c, f, "k", 1*time.Second, nil, "OK 5")
	rel := async(func() error { return l.Release(context.Background()) })
	if r := f.req(); r != "RELEASE k 5" {
		t.Fatalf("request %q", r)
	}
	f.write("OK")
	if err := recv(t, rel); err != nil {
		t.Fatal(err)
	}
	f.write("! LOST 5 expired k")
	time.Sleep(time.Second) // past the 740 ms deadline of a 1 s lease
	c.Close()
	if isLost(l) || l.LostReason() != "" || l.Remaining() != 0 {
		t.Fatalf("released lock: lost=%v reason %q remaining %v", isLost(l), l.LostReason(), l.Remaining())
	}
	if err := l.Extend(context.Background(), 10*time.Second); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Extend of a released lock: %v, want ErrNotHeld", err)
	}
}

// The local deadline fires first (send + lease − margin); the sidecar's
// event then replaces the reason, the cause keeps the first. Extend then
// refuses without sending; Release still sends.
func TestDeadlineThenEvent(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	l := takeLock(t, c, f, "k", time.Second, nil, "OK 5")
	waitLost(t, l, LostDeadline)
	f.write("! LOST 5 expired k")
	waitLost(t, l, LostExpired)
	var le *LostError
	if !errors.As(context.Cause(l.Context()), &le) || le.Reason != LostDeadline {
		t.Fatalf("cause %v, want the first reason", context.Cause(l.Context()))
	}
	before := Written(c)
	if err := l.Extend(context.Background(), 10*time.Second); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Extend of a lost lock: %v", err)
	}
	if Written(c) != before {
		t.Fatal("Extend of a lost lock sent something")
	}
	rel := async(func() error { return l.Release(context.Background()) })
	if r := f.req(); r != "RELEASE k 5" {
		t.Fatalf("request %q", r)
	}
	f.write("ERR not_held gone")
	if err := recv(t, rel); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Release: %v", err)
	}
}

// fakeClock is a settable clock for Remaining and the deadline.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (k *fakeClock) now() time.Time { k.mu.Lock(); defer k.mu.Unlock(); return k.t }
func (k *fakeClock) add(d time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.t = k.t.Add(d)
}

// Extend's outcomes: the deadline moves to the EXTEND's send time + lease −
// margin on OK, stays on INDETERMINATE and other errors of a longer
// extend (TestLockExtendShorterIndeterminate: a shorter one), and a definite
// not_held fires the signal (moved). Argument errors send nothing.
func TestLockExtend(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c.now = clk.now
	l := takeLock(t, c, f, "k", 30*time.Second, nil, "OK 5")
	if got, want := l.Remaining(), 30*time.Second-550*time.Millisecond; got != want {
		t.Fatalf("Remaining %v, want %v", got, want)
	}
	clk.add(10 * time.Second)
	extend := func(lease time.Duration, reply string) error {
		t.Helper()
		ch := async(func() error { return l.Extend(context.Background(), lease) })
		if r, want := f.req(), fmt.Sprintf("EXTEND k 5 %d", lease/time.Second); r != want {
			t.Fatalf("request %q, want %q", r, want)
		}
		clk.add(time.Second) // the reply comes later: the send time counts
		f.write(reply)
		return recv(t, ch)
	}
	if err := extend(20*time.Second, "OK"); err != nil {
		t.Fatal(err)
	}
	if got, want := l.Remaining(), 20*time.Second-450*time.Millisecond-time.Second; got != want {
		t.Fatalf("Remaining after Extend %v, want %v", got, want)
	}
	if err := extend(250*time.Second, "INDETERMINATE"); !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("Extend: %v", err)
	}
	if err := extend(250*time.Second, "ERR unavailable no leader"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Extend: %v", err)
	}
	if got, want := l.Remaining(), 20*time.Second-450*time.Millisecond-3*time.Second; got != want || isLost(l) {
		t.Fatalf("Remaining %v (want %v), lost %v: a failed Extend moved the deadline", got, want, isLost(l))
	}
	for _, lease := range []time.Duration{0, -time.Second, 251 * time.Second, 1500 * time.Millisecond} {
		if err := l.Extend(context.Background(), lease); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("Extend(%v): %v", lease, err)
		}
	}
	f.noReq()
	if err := extend(10*time.Second, "ERR not_held gone"); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Extend: %v", err)
	}
	waitLost(t, l, LostMoved)
}

// An EXTEND to a shorter lease may apply even when its outcome is unknown,
// and its lease counts from when it did: from its send on, and after
// INDETERMINATE, the deadline is the earlier of the previous one and the
// send time + lease − margin (issue 39: the previous deadline alone made
// two holders). OK then sets the new deadline; a longer extend leaves the
// previous one.
func TestLockExtendShorterIndeterminate(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c.now = clk.now
	l := takeLock(t, c, f, "k", 60*time.Second, nil, "OK 5")
	clk.add(10 * time.Second) // 60 s − 850 ms − 10 s left
	ch := async(func() error { return l.Extend(context.Background(), 5*time.Second) })
	if r := f.req(); r != "EXTEND k 5 5" {
		t.Fatalf("request %q", r)
	}
	short := 5*time.Second - Margin(5*time.Second) // from the send time
	if got := l.Remaining(); got != short {
		t.Fatalf("Remaining while a 5 s extend is in flight: %v, want %v", got, short)
	}
	clk.add(time.Second)
	f.write("INDETERMINATE")
	if err := recv(t, ch); !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("Extend: %v", err)
	}
	if got, want := l.Remaining(), short-time.Second; got != want || isLost(l) {
		t.Fatalf("Remaining after an indeterminate 5 s extend: %v (want %v), lost %v", got, want, isLost(l))
	}
	// A longer extend in flight or indeterminate leaves that deadline.
	ch = async(func() error { return l.Extend(context.Background(), 30*time.Second) })
	if r := f.req(); r != "EXTEND k 5 30" {
		t.Fatalf("request %q", r)
	}
	if got, want := l.Remaining(), short-time.Second; got != want {
		t.Fatalf("Remaining while a 30 s extend is in flight: %v, want %v", got, want)
	}
	f.write("INDETERMINATE")
	if err := recv(t, ch); !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("Extend: %v", err)
	}
	if got, want := l.Remaining(), short-time.Second; got != want {
		t.Fatalf("Remaining after an indeterminate 30 s extend: %v, want %v", got, want)
	}
	// ctx's end with the EXTEND written: it may still run.
	ctx, cancel := context.WithCancel(context.Background())
	ch = async(func() error { return l.Extend(ctx, 2*time.Second) })
	if r := f.req(); r != "EXTEND k 5 2" {
		t.Fatalf("request %q", r)
	}
	cancel()
	if err := recv(t, ch); !errors.Is(err, context.Canceled) {
		t.Fatalf("Extend: %v", err)
	}
	if got, want := l.Remaining(), 2*time.Second-Margin(2*time.Second); got != want {
		t.Fatalf("Remaining after an abandoned 2 s extend: %v, want %v", got, want)
	}
	f.write("OK") // the abandoned EXTEND's reply
	// OK sets the deadline from the send time.
	ch = async(func() error { return l.Extend(context.Background(), 30*time.Second) })
	if r := f.req(); r != "EXTEND k 5 30" {
		t.Fatalf("request %q", r)
	}
	f.write("OK")
	if err := recv(t, ch); err != nil {
		t.Fatal(err)
	}
	if got, want := l.Remaining(), 30*time.Second-Margin(30*time.Second); got != want {
		t.Fatalf("Remaining after OK: %v, want %v", got, want)
	}
}

// Two EXTENDs of one Lock under way at once may apply in either order (the
// sidecar runs a connection's requests concurrently). The first one's OK
// must stay at most the second's end also when the second's caller gave up
// before its answer: dropping the second's cap when its Extend returned
// let the OK lift the deadline 95 s past the lease the cluster may hold.
func TestLockExtendOKKeepsTheCapOfAnAbandonedExtend(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c.now = clk.now
	l := takeLock(t, c, f, "k", 60*time.Second, nil, "OK 5")
	first := async(func() error { return l.Extend(context.Background(), 100*time.Second) })
	if r := f.req(); r != "EXTEND k 5 100" {
		t.Fatalf("request %q", r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	second := async(func() error { return l.Extend(ctx, 5*time.Second) })
	if r := f.req(); r != "EXTEND k 5 5" {
		t.Fatalf("request %q", r)
	}
	cancel()
	if err := recv(t, second); !errors.Is(err, context.Canceled) {
		t.Fatalf("second Extend: %v", err)
	}
	f.write("OK")
	if err := recv(t, first); err != nil {
		t.Fatalf("first Extend: %v", err)
	}
	short := 5*time.Second - Margin(5*time.Second)
	if got := l.Remaining(); got > short {
		t.Fatalf("Remaining %v after the first EXTEND's OK, want at most %v: the abandoned 5 s EXTEND may still apply after it", got, short)
	}
	// Its answer comes: from then on a new EXTEND is free of its cap.
	f.write("OK")
	ping := async(func() error { return c.Ping(context.Background()) })
	if r := f.req(); r != "PING" {
		t.Fatalf("request %q", r)
	}
	f.write("PONG")
	if err := recv(t, ping); err != nil {
		t.Fatal(err)
	}
	third := async(func() error { return l.Extend(context.Background(), 30*time.Second) })
	if r := f.req(); r != "EXTEND k 5 30" {
		t.Fatalf("request %q", r)
	}
	f.write("OK")
	if err := recv(t, third); err != nil {
		t.Fatal(err)
	}
	if got, want := l.Remaining(), 30*time.Second-Margin(30*time.Second); got != want {
		t.Fatalf("Remaining after a later EXTEND's OK: %v, want %v", got, want)
	}
	// An Extend whose ctx ended before anything was sent bounds nothing.
	done, stop := context.WithCancel(context.Background())
	stop()
	if err := l.Extend(done, 2*time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("Extend with an ended ctx: %v", err)
	}
	fourth := async(func() error { return l.Extend(context.Background(), 40*time.Second) })
	if r := f.req(); r != "EXTEND k 5 40" {
		t.Fatalf("request %q (the Extend with an ended ctx sent something?)", r)
	}
	f.write("OK")
	if err := recv(t, fourth); err != nil {
		t.Fatal(err)
	}
	if got, want := l.Remaining(), 40*time.Second-Margin(40*time.Second); got != want {
		t.Fatalf("Remaining after an EXTEND's OK: %v, want %v (an unsent EXTEND still capped it)", got, want)
	}
}

// Of two EXTENDs answered OK in turn, whichever Extend call takes its OK
// last, the deadline is at most the shorter one's end: either may have
// applied last.
func TestLockConcurrentExtendOKs(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c.now = clk.now
	l := takeLock(t, c, f, "k", 60*time.Second, nil, "OK 5")
	short := 5*time.Second - Margin(5*time.Second)
	for i := range 50 {
		first := async(func() error { return l.Extend(context.Background(), 100*time.Second) })
		if r := f.req(); r != "EXTEND k 5 100" {
			t.Fatalf("request %q", r)
		}
		second := async(func() error { return l.Extend(context.Background(), 5*time.Second) })
		if r := f.req(); r != "EXTEND k 5 5" {
			t.Fatalf("request %q", r)
		}
		f.write("OK", "OK")
		if err := recv(t, first); err != nil {
			t.Fatal(err)
		}
		if err := recv(t, second); err != nil {
			t.Fatal(err)
		}
		if got := l.Remaining(); got > short {
			t.Fatalf("round %d: Remaining %v after both OKs, want at most %v", i, got, short)
		}
	}
}

// Client.Close fires every held Lock's lost signal before the sidecar
// sees the connection close (and releases the lock, handing its key on):
// a holder is never told after the key may be someone else's (issue 39).
func TestCloseFiresLostBeforeTheSidecarReleases(t *testing.T) {
	cc, sc := net.Pipe()
	f := &fakeEnd{t: t, conn: sc, reqs: make(chan string, 64)}
	var held atomic.Pointer[Lock]
	lostAtEOF := make(chan bool, 1)
	go func() {
		defer close(f.reqs)
		br := bufio.NewReader(sc)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				// The sidecar's view: the connection closed, and it would
				// release every lock of it now.
				if l := held.Load(); l != nil {
					lostAtEOF <- isLost(l)
				}
				return
			}
			f.reqs <- strings.TrimSuffix(line, "\n")
		}
	}()
	c, err := newClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	if got := f.req(); got != "HELLO 9 events" {
		t.Fatalf("first line %q", got)
	}
	f.write("HELLO 6 events")
	l := takeLock(t, c, f, "k", 30*time.Second, nil, "OK 5")
	held.Store(l)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case lost := <-lostAtEOF:
		if !lost {
			t.Fatal("the sidecar saw the connection close before the lock's lost signal fired")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the fake sidecar never saw the close")
	}
	if got := l.LostReason(); got != LostDisconnected {
		t.Fatalf("lost reason %q, want %q", got, LostDisconnected)
	}
}

// The connection's end fires every lock with "disconnected".
func TestLockDisconnected(t *testing.T) {
	c, f := pipeClient(t, "HELLO 3 events")
	l := takeLock(t, c, f, "k", 30*time.Second, nil, "OK 5")
	blk := async(func() lockRes {
		l, err := c.LockBlock(context.Background(), []string{"a", "b"}, 30*time.Second, 0)
		return lockRes{l, err}
	})
	if r := f.req(); r != "ACQUIRE a b 30 0.000" {
		t.Fatalf("request %q", r)
	}
	f.write("OK 6")
	b := recv(t, blk)
	if b.err != nil || b.l.Token() != 6 || strings.Join(b.l.Keys(), " ") != "a b" {
		t.Fatalf("LockBlock: %v %v", b.l, b.err)
	}
	f.conn.Close()
	waitLost(t, l, LostDisconnected)
	waitLost(t, b.l, LostDisconnected)
}

// A version-2 sidecar refuses HELLO's events option: Hello asks again
// without it, and the Client works without events.
func TestHelloVersion2Sidecar(t *testing.T) {
	c, f := pipeClient(t, "ERR bad_request unknown HELLO option")
	ch := async(func() error { _, err := c.Events(context.Background()); return err })
	if r := f.req(); r != "HELLO 9" {
		t.Fatalf("request %q", r)
	}
	f.write("HELLO 2")
	if err := recv(t, ch); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Hello(context.Background()); v != 2 {
		t.Fatalf("version %d", v)
	}
	if ev, _ := c.Events(context.Background()); ev {
		t.Fatal("events on with a version-2 sidecar")
	}
}

// A refused connection's ERR, taken for the reply to Dial's HELLO, is why
// the connection ended.
func TestRefusalAnswersHello(t *testing.T) {
	c, f := pipeClient(t, "ERR too_many_connections the sidecar is full")
	f.conn.Close()
	<-c.Done()
	err := c.Ping(context.Background())
	if !errors.Is(err, ErrClosed) || !errors.Is(err, &Error{Code: "too_many_connections"}) {
		t.Fatalf("Ping on a refused connection: %v", err)
	}
}

// FuzzReadLoop feeds arbitrary lines, event lines ("!...") among them,
// into the Client's reader after n pipelined requests: the i-th non-event
// line must be the reply of the i-th request, whatever the events are,
// and a lock fires only on a LOST line naming it.
func FuzzReadLoop(f *testing.F) {
	f.Add("OK 1\n! LOST 7 expired k\nPONG")
	f.Add("! LOST 7 expired k\n!\nERR x y\r\n! LOST 7 moved k\nHELD 0")
	f.Add("!!\n! LOST 7\n\n! LOST 7 expired k k2\nOK")
	f.Add("BUSY\n!LOST 7 expired k\nTIMEOUT\n! FUTURE\n")
	f.Add("! POSITION 2 3 - k\nOK 1\n! POSITION 2 x 1 k\n! POSITION 3 1 0 k\nPONG")
	f.Add("OK 1\n! REVOKED 7 ops stuck  holder\n! LOST 7 revoked k\nPONG")
	f.Add("! REVOKED 7 ops\nOK\n! REVOKED 7\n! REVOKED 7 ops x \nHELD 0")
	f.Fuzz(func(t *testing.T, data string) {
		lines := strings.Split(data, "\n")
		if len(lines) > 200 {
			lines = lines[:200]
		}
		var replies []string
		lostLine := false
		for _, ln := range lines {
			if strings.HasPrefix(ln, "!") {
				lostLine = lostLine || strings.HasPrefix(ln, "! LOST ")
				continue
			}
			replies = append(replies, strings.TrimSuffix(ln, "\r"))
		}
		c, fe := pipeClient(t, "")
		l := newLock(c.cur, []string{"k"}, 7, "", 250*time.Second, time.Now())
		c.cur.register(l)
		calls := make([]*call, len(replies))
		for i := range calls {
			cl, err := c.cur.send(fmt.Sprintf("PING %d", i))
			if err != nil {
				t.Fatal(err)
			}
			fe.req()
			calls[i] = cl
		}
		// The reply to the HELLO first, then the fuzzed lines.
		fe.write(append([]string{"HELLO 3 events"}, lines...)...)
		for i, cl := range calls {
			select {
			case r := <-cl.ch:
				if r != replies[i] {
					t.Fatalf("request %d got %q, want %q", i, r, replies[i])
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("request %d: no reply", i)
			}
		}
		// A PING after them all flushes the reader past every line.
		ping := async(func() error { return c.Ping(context.Background()) })
		fe.req()
		fe.write("PONG")
		if err := recv(t, ping); err != nil {
			t.Fatalf("final Ping: %v", err)
		}
		if isLost(l) && !lostLine {
			t.Fatalf("the lock fired with no LOST line (reason %q)", l.LostReason())
		}
		if slices.Contains(lines, "! LOST 7 expired k") && !isLost(l) {
			t.Fatal("a LOST line for the lock did not fire it")
		}
		if by, _, ok := l.Revoked(); by != "" && !ok {
			t.Fatalf("revoked by %q but not lost as revoked (%q)", by, l.LostReason())
		}
		// Stop its timer; with an ended context nothing is sent.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = l.Release(ctx)
	})
}

// A wait over 5 minutes (up to an hour) needs a sidecar of protocol
// version 6: an older one is refused here, nothing sent (it would answer
// invalid_wait, which reads as the caller's mistake); over an hour is an
// argument error.
func TestLongWaitNeedsVersion6(t *testing.T) {
	c, f := pipeClient(t, "HELLO 5 events")
	if _, err := c.Lock(context.Background(), "k", 30*time.Second, MaxShortWait+time.Millisecond); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("a 300.001 s wait from a version 5 sidecar: %v, want ErrNotSupported", err)
	}
	if _, err := c.AcquireBlock(context.Background(), []string{"a", "b"}, 30*time.Second, time.Hour); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("an hour-long block wait from a version 5 sidecar: %v, want ErrNotSupported", err)
	}
	if _, err := c.Lock(context.Background(), "k", 30*time.Second, MaxWait+time.Millisecond); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a wait over an hour: %v, want ErrInvalidArgument", err)
	}
	f.noReq()
	l := takeLock(t, c, f, "k", 30*time.Second, nil, "OK 5") // 5 minutes and less as before
	_ = l

	c6, f6 := pipeClient(t, "HELLO 6 events")
	ch := async(func() error { _, err := c6.Lock(context.Background(), "k", 30*time.Second, time.Hour); return err })
	if r := f6.req(); r != "ACQUIRE k 30 3600.000" {
		t.Fatalf("request %q", r)
	}
	f6.write("OK 7")
	if err := recv(t, ch); err != nil {
		t.Fatal(err)
	}
}

// A grant that arrives with less than half its validity left is renewed by one
// EXTEND of the same lease before Lock returns (a wait may be an hour, a
// lease at most 250 s): on OK the deadline counts from the EXTEND's send;
// on not_held the Lock comes lost (moved); on any other outcome the
// deadline stays the ACQUIRE's send + lease − margin (here passed: lost,
// deadline). A grant with more than half its validity left is not renewed.
func TestLockRenewsAGrantThatWaitedLong(t *testing.T) {
	c, f := pipeClient(t, "HELLO 6 events")
	clk := &fakeClock{t: time.Unix(1000, 0)}
	c.now = clk.now
	lease := 10 * time.Second
	validity := lease - Margin(lease)
	for _, tc := range []struct {
		reply  string
		lost   string
		remain time.Duration
	}{{"OK", "", validity}, {"ERR not_held not held", LostMoved, 0}, {"INDETERMINATE", LostDeadline, 0}} {
		ch := async(func() lockRes {
			l, err := c.Lock(context.Background(), "k", lease, time.Hour)
			return lockRes{l, err}
		})
		if r := f.req(); r != "ACQUIRE k 10 3600.000" {
			t.Fatalf("request %q", r)
		}
		clk.add(30 * time.Second) // the turn comes after three leases
		f.write("OK 7")
		if r := f.req(); r != "EXTEND k 7 10" {
			t.Fatalf("%s: request %q, want the grant's renewal", tc.reply, r)
		}
		f.write(tc.reply)
		res := recv(t, ch)
		if res.err != nil {
			t.Fatalf("%s: Lock: %v", tc.reply, res.err)
		}
		if tc.lost == "" {
			if got := res.l.Remaining(); got != tc.remain || isLost(res.l) {
				t.Fatalf("renewed: Remaining %v (want %v), lost %v", got, tc.remain, isLost(res.l))
			}
		} else {
			waitLost(t, res.l, tc.lost)
		}
	}
	// Granted with more than half its validity left: no renewal.
	ch := async(func() lockRes {
		l, err := c.Lock(context.Background(), "k", lease, time.Hour)
		return lockRes{l, err}
	})
	if r := f.req(); r != "ACQUIRE k 10 3600.000" {
		t.Fatalf("request %q", r)
	}
	clk.add(4 * time.Second)
	f.write("OK 8")
	res := recv(t, ch)
	if res.err != nil || res.l.Remaining() != validity-4*time.Second {
		t.Fatalf("Lock: %v, Remaining %v", res.err, res.l.Remaining())
	}
	f.noReq()
}

// Events never wait for replies: a lock's LOST can come before its OK
// (an ACQUIRE answered behind another's reply, its lock revoked
// meanwhile; issue 42's second attack round). Tokens never repeat, so it
// is this lock's: the lock is lost as soon as it is returned, with the
// REVOKED note's who and why. A LOST of a token no reply ever names is
// kept (a few) and harms nobody.
func TestLostBeforeItsOK(t *testing.T) {
	c, f := pipeClient(t, "HELLO 9 events")
	if ev, err := c.Events(context.Background()); err != nil || !ev {
		t.Fatalf("Events: %v, %v", ev, err)
	}
	l := takeLock(t, c, f, "k", 30*time.Second, []string{"! LOST 8 expired z", "! REVOKED 5 ops@h app hung", "! LOST 5 revoked - k"}, "OK 5")
	waitLost(t, l, LostRevoked)
	if by, why, ok := l.Revoked(); !ok || by != "ops@h" || why != "app hung" {
		t.Fatalf("Revoked() = %q, %q, %v", by, why, ok)
	}
}
