package ticketing

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MaxPermits is the most permits SetPermits may give a key.
const MaxPermits = 100000

// permitVersion is the protocol version of PERMIT and PERMITS.
const permitVersion = 8

// Permit reports whether the Lock is a permit of a semaphore key
// (AcquirePermit, LockPermit) rather than a lock or a block.
func (l *Lock) Permit() bool { return l.permit }

// Slot is a permit's slot, 0..n−1 of the semaphore's n permits: the
// lowest one free at the grant. (key, slot) is the permit's fencing
// domain; see FenceKey. 0 for a lock or a block.
func (l *Lock) Slot() int { return l.slot }

// FenceKey is the name of the resource the Lock's writes are fenced
// under: "<key> <slot>" for a permit (one fencing domain per slot,
// unixapi/PROTOCOL.md "Semaphores"), the key for a lock (a block's first
// key; fence each of a block's keys under its own name).
func (l *Lock) FenceKey() string {
	if l.permit {
		return PermitFenceKey(l.keys[0], l.slot)
	}
	return l.keys[0]
}

// PermitFenceKey is the fenced resource of slot of the semaphore key:
// "<key> <slot>", the key and the slot joined by a space (e.g.
// "checkout 0"). A key is 1..255 bytes of 0x21..0x7E, so it never holds a
// space: no lock key can name a slot's fencing domain, and no two (key,
// slot) pairs share one. (With any byte a key may hold, "#" say, the lock
// "checkout#0" and slot 0 of the semaphore "checkout" would share one
// high-water mark, and one would refuse the other's live holder.)
func PermitFenceKey(key string, slot int) string {
	return key + " " + strconv.Itoa(slot)
}

// AcquirePermit takes one permit of the semaphore key (PERMIT, protocol
// version 8) for lease, waiting at most wait for one to be free, and
// returns it as a Lock whose Slot is the permit's slot and whose Token is
// its own fencing token. Everything else is Lock's: the same arguments,
// options (WithQueued, WithPosition, WithLabel), results (ErrBusy,
// ErrTimeout, ErrIndeterminate, *Error) and context rules; the permit is
// FIFO with the key's other waiters, its Release and Extend name its
// token, its lost signal works as a lock's, and a grant with less than
// half its validity left is renewed before it is returned. Fence its
// writes under FenceKey ("<key> <slot>").
//
// A key that is not a semaphore is ErrNotSemaphore (an operator makes it
// one: SetPermits, `ticketing permits set`); Acquire of a semaphore key is
// ErrIsSemaphore. Against a sidecar older than protocol version 8 it is an
// error wrapping ErrNotSupported, nothing sent; a cluster that does not
// have semaphores yet answers an *Error with code not_supported.
func (c *Client) AcquirePermit(ctx context.Context, key string, lease, wait time.Duration, opts ...AcquireOption) (*Lock, error) {
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
	if err := cn.checkPermits(ctx); err != nil {
		return nil, err
	}
	return cn.lock(ctx, []string{key}, lease, wait, acquireOptions(opts), true)
}

// LockPermit is AcquirePermit (as LockBlock is AcquireBlock): the name to
// use beside Lock and LockBlock.
func (c *Client) LockPermit(ctx context.Context, key string, lease, wait time.Duration, opts ...AcquireOption) (*Lock, error) {
	return c.AcquirePermit(ctx, key, lease, wait, opts...)
}

// SetPermits makes key a semaphore of n permits (1..MaxPermits), changes
// the n of one, or with n 0 removes an idle one (PERMITS, protocol
// version 8): an operator's call. Raising n grants waiters at once;
// lowering it takes no permit from a holder. nil when the cluster applied
// it. ErrIndeterminate: it may or may not have applied; the call is exact
// and idempotent, so call it again. *Errors: ErrInUse (the key is held as
// a lock; n 0 while a permit is held or someone waits), ErrNotSemaphore
// (n 0 of a key that is no semaphore), ErrInvalidPermits, not_supported
// (the cluster has no semaphores yet), .... n outside 0..MaxPermits is
// ErrInvalidArgument and a sidecar older than version 8 an error wrapping
// ErrNotSupported, nothing sent.
func (c *Client) SetPermits(ctx context.Context, key string, n int) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if n < 0 || n > MaxPermits {
		return fmt.Errorf("%w: %d permits (0..%d)", ErrInvalidArgument, n, MaxPermits)
	}
	cn, err := c.conn(ctx)
	if err != nil {
		return err
	}
	if err := cn.checkPermits(ctx); err != nil {
		return err
	}
	r, err := cn.do(ctx, "PERMITS "+key+" "+strconv.Itoa(n))
	if err != nil {
		return err
	}
	if r == "OK" {
		return nil
	}
	return permitOutcome("PERMITS", r)
}

// checkPermits checks that the sidecar speaks semaphores (version 8): an
// older one would answer unknown_verb.
func (cn *conn) checkPermits(ctx context.Context) error {
	v, err := cn.hello(ctx)
	if err != nil {
		return err
	}
	if v < permitVersion {
		return fmt.Errorf("%w: semaphores need protocol version %d, and the sidecar speaks version %d: upgrade the sidecar", ErrNotSupported, permitVersion, v)
	}
	return nil
}

// permitOutcome is outcome, with unknown_verb (a sidecar that does not
// know the verb after all) as ErrNotSupported.
func permitOutcome(verb, r string) error {
	err := outcome(verb, r)
	var e *Error
	if errors.As(err, &e) && e.Code == "unknown_verb" {
		return fmt.Errorf("%w: %s: %s", ErrNotSupported, verb, e.Message)
	}
	return err
}

// permitLine is the PERMIT request of key, with its label field when it
// has one.
func permitLine(key string, lease, wait time.Duration, label string) string {
	return "PERMIT" + strings.TrimPrefix(acquireLine([]string{key}, lease, wait, label), "ACQUIRE")
}

// permitGrant reads "OK <token> <slot>".
func permitGrant(reply string) (token uint64, slot int, ok bool) {
	s, ok := strings.CutPrefix(reply, "OK ")
	if !ok {
		return 0, 0, false
	}
	ts, ss, ok := strings.Cut(s, " ")
	if !ok {
		return 0, 0, false
	}
	t, err := strconv.ParseUint(ts, 10, 64)
	if err != nil || t == 0 {
		return 0, 0, false
	}
	n, err := strconv.ParseUint(ss, 10, 31)
	if err != nil || n >= MaxPermits {
		return 0, 0, false
	}
	return t, int(n), true
}
