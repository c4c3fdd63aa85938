package ticketing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrLockLost: the lock is gone, or may be (its local deadline passed).
// It is what errors.Is finds in context.Cause(lock.Context()) once a Lock
// is lost, and in the error of Extend on a lost lock (nothing sent). The
// error itself is a *LostError naming the reason.
var ErrLockLost = errors.New("ticketing: lock lost")

// Reasons a Lock is lost (LostError.Reason, Lock.LostReason). The first
// four are the sidecar's (unixapi/PROTOCOL.md, "Events: the lost
// signal"); a later sidecar may name others, which are losses all the same.
const (
	// LostExpired: the lease ran out and the cluster committed the expiry.
	LostExpired = "expired"
	// LostMoved: an EXTEND found the key no longer held under the token.
	LostMoved = "moved"
	// LostCompensated: the sidecar released the lock on the connection's
	// behalf (it is shutting down, or the connection is ending).
	LostCompensated = "compensated"
	// LostRevoked: an operator revoked the lock through a node's admin
	// port and the cluster committed the revoke. Lock.Revoked and
	// LostError.By and Why tell who and why (from the sidecar's
	// "! REVOKED" line, protocol version 9; "" before that).
	LostRevoked = "revoked"
	// LostDeadline: the local validity deadline passed (send time of the
	// ACQUIRE or the last successful EXTEND + lease − Margin). The cluster
	// may still count the lock as held for a moment, but the holder must
	// stop relying on it.
	LostDeadline = "deadline"
	// LostDisconnected: the connection to the sidecar ended (Close, or it
	// broke): the sidecar releases the session's locks, or, if it died,
	// the lease runs out.
	LostDisconnected = "disconnected"
)

// LostError is the cause of a lost Lock's Context and the error of Extend
// on a lost Lock. errors.Is(err, ErrLockLost) reports it.
type LostError struct {
	Reason string   // LostExpired, LostDeadline, ... (the first reason: see Lock.LostReason)
	Token  uint64   // the lock's fencing token
	Keys   []string // the lock's keys
	// By and Why are, for LostRevoked, who revoked the lock and their
	// reason, as the sidecar's "! REVOKED" line named them (protocol
	// version 9): "" when it did not (an older sidecar), and Why "" when
	// the operator gave no reason.
	By, Why string
}

func (e *LostError) Error() string {
	why := e.Reason
	if e.By != "" {
		why += " by " + e.By
		if e.Why != "" {
			why += ": " + e.Why
		}
	}
	return fmt.Sprintf("ticketing: lock lost (%s): %s, token %d", why, strings.Join(e.Keys, " "), e.Token)
}

// Is makes errors.Is(err, ErrLockLost) true for a *LostError.
func (e *LostError) Is(target error) bool { return target == ErrLockLost }

// Margin is how much before send time + lease a Lock counts itself lost
// (LostDeadline): 250 ms + 1 % of the lease. The lease runs on the
// leader's clock from when it applies the grant (or the EXTEND), which is
// after this client sent the request; counting from the send time already
// errs on the safe side of that. The margin covers the rest: the two
// clocks' rates drifting apart (1 % is far above real drift), and the
// delay between the deadline and this process acting on it (timer and
// scheduler latency, a GC pause). See clients/README.md, "Lease extension
// and the lost signal".
func Margin(lease time.Duration) time.Duration {
	return 250*time.Millisecond + lease/100
}

// Lock is a lock (one key), a seat block (several keys, one token) or a
// permit of a semaphore key (Permit, Slot, FenceKey) held through a
// Client, that knows when it is lost. Take one with Client.Lock,
// Client.LockBlock or Client.LockPermit (AcquireBlock and AcquirePermit
// return one too).
//
// Its Context is cancelled at the first of: the sidecar's "! LOST" event
// for it (the lease expired through the log, the key moved on, or the
// sidecar released it for the session), the local validity deadline (send
// time of the ACQUIRE or of the last successful Extend + lease − Margin),
// or the end of the connection. Do the lock's work under that context (or
// check Lost before each protected write), and still fence every write
// with Token: a signal can come late (a stalled process learns of its loss
// only when it runs again).
//
// A Lock is safe for concurrent use.
type Lock struct {
	c     *Client
	cn    *conn // the connection (session) that holds it
	keys  []string
	token uint64
	label string // the owner label it was acquired with ("": none)
	// permit: a permit of a semaphore key (AcquirePermit), held in slot;
	// both are set before the Lock is registered and never change.
	permit bool
	slot   int
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time   // the local validity deadline
	timer    *time.Timer // fires at deadline (re-armed by Extend)
	// extends are the EXTENDs that bound deadline (Extend): those the
	// sidecar has not answered, and those it answered while an Extend call
	// that ran at the same time is not finished.
	extends []*extendRec
	// extendClock counts the begins and answers of EXTENDs, to tell which
	// ran at the same time; extending counts the Extend calls not finished.
	extendClock uint64
	extending   int
	// renewing: the grant's own renewal is deciding the deadline
	// (lockKeys, renewAfterWait): the timer does not fire the signal.
	renewing bool
	reason   string // why it was lost; "" while it is not
	// by and why: who revoked it and their reason, when reason is
	// LostRevoked and the sidecar said (REVOKED, version 9).
	by, why  string
	released bool // Release was called: no signal any more
}

// extendRec is one EXTEND of a Lock.
type extendRec struct {
	end      time.Time // its send time + lease − Margin: the lock's end if it applied last
	begun    uint64    // when it began, on the Lock's extendClock
	answered uint64    // when the sidecar answered it, on the same clock; 0 until then
}

// Block is the name AcquireBlock's callers know a block's Lock by.
type Block = Lock

// newLock is the Lock of a grant of keys under token and label, whose
// ACQUIRE was sent at sent for lease. The caller registers it with the
// Client.
func newLock(cn *conn, keys []string, token uint64, label string, lease time.Duration, sent time.Time) *Lock {
	return newLockRenewing(cn, keys, token, label, lease, sent, false)
}

// newLockRenewing is newLock whose timer, when renewing, leaves the signal
// to renewAfterWait (set before the timer runs: a grant that waited past
// its deadline would fire at once).
func newLockRenewing(cn *conn, keys []string, token uint64, label string, lease time.Duration, sent time.Time, renewing bool) *Lock {
	c := cn.c
	l := &Lock{c: c, cn: cn, keys: keys, token: token, label: label, deadline: sent.Add(lease - Margin(lease)), renewing: renewing}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	l.mu.Lock()
	defer l.mu.Unlock() // the timer's callback waits for l.timer to be set
	l.timer = time.AfterFunc(l.deadline.Sub(c.clock()), l.onDeadline)
	return l
}

// Token is the lock's fencing token (for a block, the one token of every
// key): fence each write with it (clients/go/fence).
func (l *Lock) Token() uint64 { return l.token }

// Keys returns the lock's keys, in the order they were asked for.
func (l *Lock) Keys() []string { return append([]string(nil), l.keys...) }

// Key is the lock's first key, the one Release and Extend name.
func (l *Lock) Key() string { return l.keys[0] }

// Label is the owner label the lock was acquired with (WithLabel), "" for
// none. It is fixed at the grant: the cluster keeps the label the ACQUIRE
// carried, and HELD and "! LOST" repeat that same label.
func (l *Lock) Label() string { return l.label }

// Domain is the fencing domain of the lock's token: INFO's domain field
// on the connection that took the lock (see Client.Domain). Fence the
// lock's writes under it (clients/go/fence's DoLock does).
func (l *Lock) Domain(ctx context.Context) (string, error) { return l.cn.fencingDomain(ctx) }

// Context is cancelled when the lock is lost (see Lock); its cause,
// context.Cause, is then a *LostError (errors.Is(cause, ErrLockLost)).
// It has no Deadline, because Extend moves the lock's deadline; see
// Remaining. It is not cancelled by Release, which is not a loss, and it
// does not derive from the context given to Lock, which only bounds the
// acquire.
func (l *Lock) Context() context.Context { return l.ctx }

// Lost is closed when the lock is lost: Context().Done().
func (l *Lock) Lost() <-chan struct{} { return l.ctx.Done() }

// LostReason is why the lock was lost ("" while it is not): the first
// reason, except that the sidecar's event (expired, moved, compensated,
// revoked) replaces LostDeadline or LostDisconnected when it arrives after
// them, being the more definite news. context.Cause keeps the first reason.
func (l *Lock) LostReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

// Revoked reports whether the lock was lost because an operator revoked
// it (LostReason is LostRevoked), and if so who revoked it and their
// reason, as the sidecar's "! REVOKED" line named them (protocol version
// 9): by is "" when the sidecar did not say (an older one sends only
// "! LOST <token> revoked ..."), why "" when the operator gave no reason.
func (l *Lock) Revoked() (by, why string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.by, l.why, l.reason == LostRevoked
}

// Remaining is the time left until the local validity deadline; 0 once
// the lock is lost or released. When it finds the deadline passed before
// the lock's timer did (a process resumed after a stall runs before its
// timers), it fires the lost signal itself (LostDeadline), so a 0 from
// Remaining means the Context is cancelled.
func (l *Lock) Remaining() time.Duration {
	l.mu.Lock()
	if l.reason != "" || l.released {
		l.mu.Unlock()
		return 0
	}
	left := l.deadline.Sub(l.c.clock())
	l.mu.Unlock()
	if left <= 0 {
		l.fire(LostDeadline, false)
		return 0
	}
	return left
}

// Extend renews the lease (whole seconds 1..250) counted from now, under
// the same token (unixapi/PROTOCOL.md, "Extending a lease"): on success the
// local deadline moves to this call's send time + lease − Margin, at most
// the send time + lease − Margin of every other EXTEND of this Lock that
// ran at the same time (sent before this one was answered, answered after
// it was sent), whatever became of it and whether or not its caller still
// waited: the sidecar runs a connection's requests concurrently, so either
// may have applied last. From
// cluster version 10 the cluster never lowers a lease (a shorter one
// renews the longer lease from now); below it a shorter lease ends the
// holding sooner.
//
// From the moment the EXTEND is sent, and after any outcome but success
// or a definite loss, the local deadline is the earlier of the previous
// deadline and this call's send time + lease − Margin: the extend may have
// applied, and on a cluster below version 10 a shorter lease then ends the
// holding (and hands the key on) before the previous deadline (issue 39). For an extend that
// lengthens the lease this is the previous deadline. Remaining and the
// lost signal follow it.
//
// A lost Lock is not extended: Extend returns its *LostError (errors.Is
// ErrLockLost) and sends nothing. If the lock is lost while the EXTEND is
// in flight (its deadline passed meanwhile), Extend returns that error too,
// even if the sidecar did extend: a fired signal is never taken back;
// Release the lock. ErrIndeterminate: the lease may or may not have been
// renewed, and the deadline stays the earlier one above. ErrNotHeld, ErrTokenMismatch
// and owner_mismatch (*Error): the lock is gone, and Lost fires (moved).
// Other *Errors (unavailable, no_quorum, not_supported, ...) and errors of
// ctx (the EXTEND may still run) leave the earlier deadline too. A
// released Lock gives ErrNotHeld without sending anything.
func (l *Lock) Extend(ctx context.Context, lease time.Duration) error {
	if err := checkLease(lease); err != nil {
		return err
	}
	sent := l.c.clock()
	end := sent.Add(lease - Margin(lease))
	ctxErr := ctx.Err() // ended already: nothing is sent, nothing capped
	l.mu.Lock()
	lost, released := l.lostErrLocked(), l.released
	var ext *extendRec
	if lost == nil && !released && ctxErr == nil {
		ext = l.beginExtendLocked(end)
		l.capLocked(end)
	}
	l.mu.Unlock()
	switch {
	case lost != nil:
		return lost
	case released:
		return &Error{Code: "not_held", Message: "the lock was released (nothing sent)"}
	case ctxErr != nil:
		return ctxErr
	}
	defer l.finishExtend()
	err := l.cn.extend(ctx, l.keys[0], l.token, lease, func() { l.settleExtend(ext) })
	var e *Error
	switch {
	case err == nil:
	case errors.As(err, &e) && (e.Code == "not_held" || e.Code == "token_mismatch" || e.Code == "owner_mismatch"):
		// The sidecar wrote "! LOST <token> moved" before this reply
		// (events on); without events this is the only news of it.
		l.fire(LostMoved, true)
		return err
	default:
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lost := l.lostErrLocked(); lost != nil {
		return lost
	}
	if !l.released {
		l.deadline = l.extendedDeadlineLocked(ext)
		l.timer.Reset(l.deadline.Sub(l.c.clock()))
	}
	return nil
}

// beginExtendLocked records an EXTEND ending at end, about to be sent.
// Requires l.mu.
func (l *Lock) beginExtendLocked(end time.Time) *extendRec {
	l.extendClock++
	ext := &extendRec{end: end, begun: l.extendClock}
	l.extends = append(l.extends, ext)
	l.extending++
	return ext
}

// settleExtend records that the sidecar answered ext. It runs on the
// connection's reader, also when Extend's caller gave up waiting (the
// EXTEND may still have applied until then); a connection that ends
// answers nothing, and loses the Lock.
func (l *Lock) settleExtend(ext *extendRec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.extendClock++
	ext.answered = l.extendClock
	l.forgetExtendsLocked()
}

// finishExtend ends an Extend call (after it set the deadline, or with its
// error).
func (l *Lock) finishExtend() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.extending--
	l.forgetExtendsLocked()
}

// forgetExtendsLocked drops the answered EXTENDs once no Extend call is
// under way: an answered one bounds only the calls under way when it was
// answered. Requires l.mu.
func (l *Lock) forgetExtendsLocked() {
	if l.extending > 0 {
		return
	}
	kept := l.extends[:0]
	for _, x := range l.extends {
		if x.answered == 0 {
			kept = append(kept, x)
		}
	}
	clear(l.extends[len(kept):])
	l.extends = kept
}

// extendedDeadlineLocked is the deadline after an OK to ext: its end, at
// most the end of every other EXTEND that ran at the same time (not
// answered yet, or answered after ext began). Requires l.mu.
func (l *Lock) extendedDeadlineLocked(ext *extendRec) time.Time {
	d := ext.end
	for _, x := range l.extends {
		if x != ext && (x.answered == 0 || x.answered > ext.begun) {
			d = minTime(d, x.end)
		}
	}
	return d
}

// capLocked moves the deadline to end if end is earlier (an EXTEND sent
// at end's send time may shorten the lease). Requires l.mu.
func (l *Lock) capLocked(end time.Time) {
	if end.Before(l.deadline) {
		l.deadline = end
		l.timer.Reset(l.deadline.Sub(l.c.clock()))
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Release releases the lock (every key of a block) in one request:
// RELEASE of its first key and its token, sent even when the lock is lost
// (one lost to the local deadline may still be held, and releasing it
// frees the key sooner). It is sent on the connection that took the lock:
// if that connection was lost meanwhile (and the lock with it), the result
// is ErrClosed, and the Client does not dial again for it (a new session
// holds nothing). Its other results are those of Client.Release. From
// this call on the lock's lost signal does not fire any more: its timer is
// stopped and events for it are ignored.
func (l *Lock) Release(ctx context.Context) error {
	l.markReleased()
	l.cn.forget(l)
	r, err := l.cn.do(ctx, releaseLine(l.keys[0], l.token))
	if err != nil {
		return err
	}
	return releaseOutcome(r)
}

// markReleased stops the lock's signal: it is being released.
func (l *Lock) markReleased() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = true
	l.timer.Stop()
}

// lostErrLocked is the lock's *LostError, nil while it is not lost.
func (l *Lock) lostErrLocked() error {
	if l.reason == "" {
		return nil
	}
	return context.Cause(l.ctx)
}

// onDeadline is the timer's callback. A timer that fires late (the
// process was stopped) or after an Extend re-armed it checks the deadline
// itself.
func (l *Lock) onDeadline() {
	l.mu.Lock()
	if l.reason != "" || l.released || l.renewing {
		l.mu.Unlock()
		return
	}
	if left := l.deadline.Sub(l.c.clock()); left > 0 {
		l.timer.Reset(left)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.fire(LostDeadline, false)
}

// fire marks the lock lost for reason, once: a first loss cancels the
// Context; a sidecar reason (fromSidecar) arriving after LostDeadline or
// LostDisconnected replaces the reported reason. A released lock is not
// lost.
func (l *Lock) fire(reason string, fromSidecar bool) { l.fireRevoked(reason, "", "", fromSidecar) }

// fireRevoked is fire that also records, for LostRevoked, who revoked
// the lock and why (by and why are "" for any other reason).
func (l *Lock) fireRevoked(reason, by, why string, fromSidecar bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.released:
	case l.reason == "":
		l.reason, l.by, l.why = reason, by, why
		l.timer.Stop()
		l.cancel(&LostError{Reason: reason, Token: l.token, Keys: l.Keys(), By: by, Why: why})
	case fromSidecar && (l.reason == LostDeadline || l.reason == LostDisconnected):
		l.reason, l.by, l.why = reason, by, why
	}
}

// Lock takes key like Acquire (same arguments, options, results and
// context rules) and returns it as a Lock, which carries the lost signal
// and can Extend. A grant that arrives with less than half its validity (lease − Margin) left is
// renewed with one EXTEND of the same lease before Lock returns (a wait
// can be an hour, a lease at most 250 s; renewAfterWait): on OK the
// Lock's deadline counts from the EXTEND's send, on not_held the Lock
// comes lost (LostMoved), on anything else the deadline stays the
// ACQUIRE's send + lease − Margin.
func (c *Client) Lock(ctx context.Context, key string, lease, wait time.Duration, opts ...AcquireOption) (*Lock, error) {
	if err := checkDurations(lease, wait); err != nil {
		return nil, err
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	cn, err := c.conn(ctx)
	if err != nil {
		return nil, err
	}
	return cn.lockKeys(ctx, []string{key}, lease, wait, acquireOptions(opts))
}

// LockBlock takes a seat block like AcquireBlock (same arguments, options,
// results and context rules) and returns it as a Lock. AcquireBlock is
// LockBlock.
func (c *Client) LockBlock(ctx context.Context, keys []string, lease, wait time.Duration, opts ...AcquireOption) (*Lock, error) {
	return c.AcquireBlock(ctx, keys, lease, wait, opts...)
}

// lockKeys sends the ACQUIRE of keys (checked, as lease and wait) and
// returns the Lock. The reader makes and registers the Lock as it reads
// the grant, before any event line that follows the grant can be
// dispatched.
func (cn *conn) lockKeys(ctx context.Context, keys []string, lease, wait time.Duration, o acquireOpts) (*Lock, error) {
	return cn.lock(ctx, keys, lease, wait, o, false)
}

// lock is lockKeys, or, when permit, the PERMIT of keys[0] (one key),
// whose grant names the permit's slot too.
func (cn *conn) lock(ctx context.Context, keys []string, lease, wait time.Duration, o acquireOpts, permit bool) (*Lock, error) {
	if err := cn.checkLabel(ctx, o.label); err != nil {
		return nil, err
	}
	if err := cn.checkWait(ctx, wait); err != nil {
		return nil, err
	}
	var l *Lock // set by the reader before the reply is delivered
	sent := cn.c.clock()
	line, verb := acquireLine(keys, lease, wait, o.label), "ACQUIRE"
	if permit {
		line, verb = permitLine(keys[0], lease, wait, o.label), "PERMIT"
	}
	onReply := func(reply string) {
		tok, ok := grantToken(reply)
		slot := 0
		if permit {
			tok, slot, ok = permitGrant(reply)
		}
		if ok {
			l = newLockRenewing(cn, keys, tok, o.label, lease, sent, true) // lockKeys decides first (renewAfterWait)
			l.permit, l.slot = permit, slot                                // before anyone else sees l
			cn.register(l)
		}
	}
	r, err := cn.roundTrip(ctx, &call{line: line, onReply: onReply, onQueued: o.queued, onPosition: o.position, keys: keys,
		onOrphan: func(reply string) {
			// Nobody waits for this grant any more: release it so the
			// keys are not held until the lease ends (RELEASE of any key
			// of a block frees all of them).
			if l != nil {
				_ = l.Release(context.Background()) // best effort: failing, the lease or the connection's end frees it
			}
		}})
	if err != nil {
		return nil, err
	}
	if l != nil {
		l.renewAfterWait(ctx, lease)
		return l, nil
	}
	if _, ok := strings.CutPrefix(r, "OK "); ok {
		return nil, unexpected(verb, r)
	}
	if permit {
		return nil, permitOutcome(verb, r)
	}
	return nil, outcome(verb, r)
}

// grantToken is the token of an "OK <token>" reply.
func grantToken(reply string) (uint64, bool) {
	s, ok := strings.CutPrefix(reply, "OK ")
	if !ok {
		return 0, false
	}
	t, err := strconv.ParseUint(s, 10, 64)
	return t, err == nil && t != 0
}

// Extend sends EXTEND: key (for a block, any of its keys) held by this
// Client under token gets a new lease (whole seconds 1..250) from now.
// nil when extended; ErrIndeterminate (count on the earlier of the
// previous deadline and this call's send time + lease − Margin: a shorter
// lease may have applied; the same while the EXTEND is in flight); an
// *Error: ErrNotHeld / ErrTokenMismatch / owner_mismatch (the lock is
// gone), release_in_progress, extend_in_progress, unavailable,
// not_supported (the cluster does not extend yet), .... Lock.Extend is
// the form that also moves a Lock's deadline.
func (c *Client) Extend(ctx context.Context, key string, token uint64, lease time.Duration) error {
	if err := checkLease(lease); err != nil {
		return err
	}
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
	return cn.extend(ctx, key, token, lease, nil)
}

// extend sends EXTEND on this connection (arguments checked).
// renewAfterWait runs once on a new grant, before the caller has the Lock.
// Its deadline counts from the ACQUIRE's send, so a grant that waited long
// comes with little of it left, or already lost: a wait can be an hour, a
// lease at most 250 s. A grant with less than half its validity (lease −
// Margin) left is
// renewed by one EXTEND of the same lease first: its OK proves, through
// the log, that the token still held the key when it applied, and the
// deadline then counts from the EXTEND's send. Any other outcome leaves
// the deadline the ACQUIRE's send gave (the signal fires now if that has
// passed), except a definite not_held, which loses the Lock (moved).
func (l *Lock) renewAfterWait(ctx context.Context, lease time.Duration) {
	validity := lease - Margin(lease)
	l.mu.Lock()
	short := l.deadline.Sub(l.c.clock()) < validity/2 && l.reason == "" && !l.released
	l.mu.Unlock()
	var err error
	sent := l.c.clock()
	if short {
		// Recorded like any extend: until the sidecar answers it, a later
		// Extend's OK stays at most its end (it may apply late).
		l.mu.Lock()
		ext := l.beginExtendLocked(sent.Add(validity))
		l.mu.Unlock()
		err = l.cn.extend(ctx, l.keys[0], l.token, lease, func() { l.settleExtend(ext) })
		l.finishExtend()
	}
	var e *Error
	if short && errors.As(err, &e) && (e.Code == "not_held" || e.Code == "token_mismatch" || e.Code == "owner_mismatch") {
		l.fire(LostMoved, true)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewing = false
	if l.reason != "" || l.released {
		return
	}
	if short && err == nil {
		l.deadline = sent.Add(validity)
	}
	l.timer.Reset(l.deadline.Sub(l.c.clock()))
}

// answered, if not nil, runs on the reader when the reply comes, even if
// ctx ended first.
func (cn *conn) extend(ctx context.Context, key string, token uint64, lease time.Duration, answered func()) error {
	cl := &call{line: fmt.Sprintf("EXTEND %s %d %d", key, token, lease/time.Second)}
	if answered != nil {
		cl.onReply = func(string) { answered() }
	}
	r, err := cn.roundTrip(ctx, cl)
	if err != nil && !cl.written && answered != nil {
		answered() // nothing was sent (ctx ended first, or the connection did)
	}
	if err != nil {
		return err
	}
	if r == "OK" {
		return nil
	}
	return outcome("EXTEND", r)
}

// register makes l findable by the events of its token; once lostAll ran
// (the connection is closed or ended), it fires l's LostDisconnected
// instead, before l is returned.
func (cn *conn) register(l *Lock) {
	cn.lmu.Lock()
	if cn.lostDone {
		cn.lmu.Unlock()
		l.fire(LostDisconnected, false)
		return
	}
	if u, ok := cn.unclaimed[l.token]; ok {
		// Its LOST came before its OK: lost already.
		delete(cn.unclaimed, l.token)
		cn.unclaimedOrder = slices.DeleteFunc(cn.unclaimedOrder, func(t uint64) bool { return t == l.token })
		cn.lmu.Unlock()
		u.fire(l)
		return
	}
	if cn.locks == nil {
		cn.locks = make(map[uint64]*Lock)
	}
	cn.locks[l.token] = l
	cn.lmu.Unlock()
}

// releasing marks the Lock of token released (Client.Release of one of
// its keys with its token) and stops routing events to it.
func (cn *conn) releasing(key string, token uint64) {
	cn.lmu.Lock()
	l := cn.locks[token]
	if l == nil || !slices.Contains(l.keys, key) {
		cn.lmu.Unlock()
		return
	}
	delete(cn.locks, token)
	cn.lmu.Unlock()
	l.markReleased()
}

// forget stops routing events to l.
func (cn *conn) forget(l *Lock) {
	cn.lmu.Lock()
	defer cn.lmu.Unlock()
	if cn.locks[l.token] == l {
		delete(cn.locks, l.token)
	}
}

// event handles one event line (it starts with "!"). Four mean something:
// "! LOST <token> <reason> <key>..." (version 3): the lock of that token
// is lost; "! QUEUED <n> <key>..." (version 4): the n-th request line
// written, an ACQUIRE of those keys, was queued; "! POSITION <n>
// <position> <estimate|-> <key>" (version 7): that ACQUIRE's place in
// key's line; "! REVOKED <token> <by>[ <why>]" (version 9): who revoked
// the lock of that token and why, noted for the "! LOST <token> revoked"
// line that comes right after it. A LOST of a token no Lock has yet is
// kept (a few) for the Lock of a reply still to come: events never wait
// for replies. Lines of other names, request numbers of no ACQUIRE
// waiting with a hook, and malformed lines are ignored: an event never
// answers a request, so ignoring one cannot shift the replies.
func (cn *conn) event(line string) {
	if n, keys, ok := parseQueued(line); ok {
		cn.queuedEvent(n, keys)
		return
	}
	if n, pos, ok := parsePosition(line); ok {
		cn.positionEvent(n, pos)
		return
	}
	if tok, by, why, ok := parseRevoked(line); ok {
		cn.lmu.Lock()
		cn.revoke = revokeNote{token: tok, by: by, why: why}
		cn.lmu.Unlock()
		return
	}
	tok, reason, ok := parseLost(line, cn.labelled.Load())
	if !ok {
		return
	}
	cn.lmu.Lock()
	l := cn.locks[tok]
	delete(cn.locks, tok) // at most one LOST per lock
	note := cn.revoke
	cn.revoke = revokeNote{}
	loss := unclaimedLoss{reason: reason}
	if reason == LostRevoked && note.token == tok {
		loss.revoked, loss.by, loss.why = true, note.by, note.why
	}
	if l == nil {
		// Perhaps the lock of a reply still to come: kept for it.
		if cn.unclaimed == nil {
			cn.unclaimed = make(map[uint64]unclaimedLoss)
		}
		if _, dup := cn.unclaimed[tok]; !dup {
			if len(cn.unclaimedOrder) >= maxUnclaimed {
				delete(cn.unclaimed, cn.unclaimedOrder[0])
				cn.unclaimedOrder = cn.unclaimedOrder[1:]
			}
			cn.unclaimedOrder = append(cn.unclaimedOrder, tok)
		}
		cn.unclaimed[tok] = loss
	}
	cn.lmu.Unlock()
	if l != nil {
		loss.fire(l)
	}
}

// unclaimedLoss is a LOST event (with its REVOKED note) of a token no
// Lock had when it was read (conn.unclaimed).
type unclaimedLoss struct {
	reason  string
	revoked bool // a REVOKED note came with it: by, why
	by, why string
}

// maxUnclaimed bounds conn.unclaimed.
const maxUnclaimed = 64

// fire ends l with the loss.
func (u unclaimedLoss) fire(l *Lock) {
	if u.revoked {
		l.fireRevoked(u.reason, u.by, u.why, true)
	} else {
		l.fire(u.reason, true)
	}
}

// revokeNote is what a "! REVOKED" line said, kept for the "! LOST" line
// of the same token that follows it.
type revokeNote struct {
	token   uint64
	by, why string
}

// parseRevoked reads "! REVOKED <token> <by>[ <why>]" (version 9): why is
// the rest of the line (it may hold spaces; never at its ends), by one
// field, both printable ASCII of at most 128 bytes.
func parseRevoked(line string) (token uint64, by, why string, ok bool) {
	rest, found := strings.CutPrefix(line, "! REVOKED ")
	if !found {
		return 0, "", "", false
	}
	f := strings.SplitN(rest, " ", 3)
	if len(f) < 2 || len(f[1]) == 0 || len(f[1]) > 128 {
		return 0, "", "", false
	}
	t, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || t == 0 {
		return 0, "", "", false
	}
	for i := 0; i < len(f[1]); i++ {
		if c := f[1][i]; c < 0x21 || c > 0x7e {
			return 0, "", "", false
		}
	}
	if len(f) == 3 {
		why = f[2]
		if why == "" || len(why) > 128 || why[0] == ' ' || why[len(why)-1] == ' ' {
			return 0, "", "", false
		}
		for i := 0; i < len(why); i++ {
			if c := why[i]; c < 0x20 || c > 0x7e {
				return 0, "", "", false
			}
		}
	}
	return t, f[1], why, true
}

// parseLost reads "! LOST <token> <reason> <key> [<key>...]", or, when
// labelled (version 5), "! LOST <token> <reason> <label> <key> [<key>...]".
func parseLost(line string, labelled bool) (token uint64, reason string, ok bool) {
	f := strings.Split(line, " ")
	if labelled {
		if len(f) < 6 || f[4] == "" {
			return 0, "", false
		}
		f = append(f[:4], f[5:]...) // the label: the Lock knows its own
	}
	if len(f) < 5 || f[0] != "!" || f[1] != "LOST" || f[3] == "" {
		return 0, "", false
	}
	for _, k := range f[4:] {
		if checkKey(k) != nil {
			return 0, "", false
		}
	}
	t, err := strconv.ParseUint(f[2], 10, 64)
	if err != nil || t == 0 {
		return 0, "", false
	}
	return t, f[3], true
}

// lostAll fires LostDisconnected on every Lock, and on every Lock
// registered later (register): the connection ended.
func (cn *conn) lostAll() {
	cn.lmu.Lock()
	locks := cn.locks
	cn.locks = nil
	cn.lostDone = true
	cn.lmu.Unlock()
	for _, l := range locks {
		l.fire(LostDisconnected, false)
	}
}

// AcquireOption is an option of one acquire: Acquire, AcquireBlock, Lock
// and LockBlock take any number of them after their fixed arguments.
type AcquireOption func(*acquireOpts)

type acquireOpts struct {
	queued   func()
	position func(Position)
	label    string
}

func acquireOptions(opts []AcquireOption) acquireOpts {
	var o acquireOpts
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

// WithQueued has fn called when the sidecar reports that the cluster
// queued this acquire: it committed the ACQUIRE into the key's FIFO queue
// (a block: into every key's queue), and an ACQUIRE of the same key that
// anyone sends after fn was called stands behind it
// (unixapi/PROTOCOL.md, "Queued: your ACQUIRE is in line"). The acquire
// goes on waiting for its turn; its result comes as it would without the
// option.
//
// fn is called at most once, before the acquire returns and never after
// (if ctx ends first, not at all), on the Client's reader goroutine: it
// must not block, nor call the Client (signal a channel, record a time).
// It is not called for wait 0, for an acquire granted without queueing,
// against a sidecar older than protocol version 4, or when a leader
// change swallowed the cluster's notice: a prompt, never a promise.
func WithQueued(fn func()) AcquireOption {
	return func(o *acquireOpts) { o.queued = fn }
}

// Position is one report of an acquire's place in the line of one of its
// keys (unixapi/PROTOCOL.md, version 7's "! POSITION" event).
type Position struct {
	// Key is the key whose line this is: a block's acquire waits in the
	// line of each of its keys and is told its place in each.
	Key string
	// Position is the place in Key's line: 1 is next in line.
	Position int
	// Estimate is the estimated wait that remains (whole seconds) when
	// EstimateKnown. Without one (the sidecar sent "-": the cluster has not
	// yet seen the key handed on often enough to tell) it is 0 and
	// EstimateKnown false.
	Estimate      time.Duration
	EstimateKnown bool
}

// WithPosition has fn called with the acquire's place in line each time
// the sidecar reports it (unixapi/PROTOCOL.md, version 7): at most about
// once a second, and only when the place changed. A block's acquire gets
// one Position per key. The reports are informational: the acquire's
// result means what it means without them.
//
// fn is called in the order the reports came, only before the acquire
// returns and never after (if ctx ends first, not from then on), on the
// Client's reader goroutine: it must not block, nor call the Client. It
// is never called for wait 0 or an acquire granted without waiting,
// against a sidecar older than protocol version 7, and a leader change
// may delay or swallow a report: a prompt, never a promise.
func WithPosition(fn func(Position)) AcquireOption {
	return func(o *acquireOpts) { o.position = fn }
}

// positionEvent runs the WithPosition hook of the ACQUIRE written n-th,
// if it is pending with one and waits for pos.Key.
func (cn *conn) positionEvent(n uint64, pos Position) {
	cn.mu.Lock()
	cl := cn.hookCalls[n]
	cn.mu.Unlock()
	if cl == nil || cl.onPosition == nil || !slices.Contains(cl.keys, pos.Key) {
		return
	}
	// Under cl.mu, as for QUEUED: a caller whose ctx ends waits for the
	// hook to return, and after that the hook is not called.
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if !cl.orphaned {
		cl.onPosition(pos)
	}
}

// maxEstimateSeconds is the longest estimate a time.Duration holds.
const maxEstimateSeconds = uint64(math.MaxInt64 / int64(time.Second))

// parsePosition reads "! POSITION <n> <position> <estimate-seconds|->
// <key>" (exactly six fields; decimals without sign, n and position at
// least 1).
func parsePosition(line string) (n uint64, pos Position, ok bool) {
	f := strings.Split(line, " ")
	if len(f) != 6 || f[0] != "!" || f[1] != "POSITION" || checkKey(f[5]) != nil {
		return 0, Position{}, false
	}
	n, err := strconv.ParseUint(f[2], 10, 64)
	if err != nil || n == 0 {
		return 0, Position{}, false
	}
	p, err := strconv.ParseUint(f[3], 10, 63) // fits an int
	if err != nil || p == 0 {
		return 0, Position{}, false
	}
	pos = Position{Key: f[5], Position: int(p)}
	if f[4] != "-" {
		e, err := strconv.ParseUint(f[4], 10, 64)
		if err != nil || e > maxEstimateSeconds {
			return 0, Position{}, false
		}
		pos.Estimate, pos.EstimateKnown = time.Duration(e)*time.Second, true
	}
	return n, pos, true
}

// WithLabel attaches an owner label to this acquire: a short name for
// people (a job's name, a request id; 1..MaxLabelLen bytes of visible
// ASCII, not "-"). The cluster keeps it with the holding: `ticketing
// inspect` shows it, and the sidecar's HELD, lost events and log name it.
// It changes nothing else. It needs a sidecar of protocol version 5 (else
// an error wrapping ErrNotSupported, nothing sent) and a cluster of
// protocol version 8 (else an *Error with code not_supported); a bad label
// is ErrInvalidArgument. "" is no label.
func WithLabel(label string) AcquireOption {
	return func(o *acquireOpts) { o.label = label }
}

// queuedEvent runs the WithQueued hook of the ACQUIRE written n-th, if it
// is pending with one and names keys.
func (cn *conn) queuedEvent(n uint64, keys []string) {
	cn.mu.Lock()
	cl := cn.hookCalls[n]
	if cl == nil || cl.onQueued == nil || cl.queuedDone || !slices.Equal(cl.keys, keys) {
		cn.mu.Unlock()
		return
	}
	cl.queuedDone = true // at most once
	cn.mu.Unlock()
	// Under cl.mu: a caller whose ctx ends waits for the hook to return
	// before it returns, and after it returned the hook is not called.
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if !cl.orphaned {
		cl.onQueued()
	}
}

// parseQueued reads "! QUEUED <n> <key> [<key>...]".
func parseQueued(line string) (n uint64, keys []string, ok bool) {
	f := strings.Split(line, " ")
	if len(f) < 4 || len(f) > 3+MaxBlockKeys || f[0] != "!" || f[1] != "QUEUED" {
		return 0, nil, false
	}
	for _, k := range f[3:] {
		if checkKey(k) != nil {
			return 0, nil, false
		}
	}
	n, err := strconv.ParseUint(f[2], 10, 64)
	if err != nil || n == 0 {
		return 0, nil, false
	}
	return n, f[3:], true
}
