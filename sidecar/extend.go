package sidecar

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// LostReason says how a holding ended without its holder's release.
type LostReason uint8

const (
	// LostExpired: its lease ran out and the cluster committed the expiry
	// (the leader's lost event).
	LostExpired LostReason = iota + 1
	// LostMoved: the cluster answered an extend of it not_held,
	// token_mismatch or owner_mismatch: the key is not held under its
	// token any more (the lease ran out, or the key moved on to another
	// holder), whether or not a lost event was seen.
	LostMoved
	// LostCompensated: the sidecar released it on its holder's behalf
	// (the unix API's session ended it, e.g. on shutdown), or the Broker
	// is closing and releases it (Close tells every WatchLost of a lock
	// still held so before it releases anything).
	LostCompensated
	// LostRevoked: an operator revoked it through a node's admin port and
	// the cluster committed the revoke (the leader's lost event with
	// wire.LostRevoked, cluster protocol version 14); Loss.By and
	// Loss.Why say who and why.
	LostRevoked
)

// LostReasons are the reasons a watcher may be told, in order.
var LostReasons = []LostReason{LostExpired, LostMoved, LostCompensated, LostRevoked}

// Loss is what a WatchLoss watcher is told: why the holding ended and,
// for LostRevoked, who revoked it (By: the operator's id as the admin
// request named it, 1..128 printable ASCII bytes without spaces) and
// their reason (Why: 0..128 printable ASCII bytes, no leading or
// trailing space; "" for none). By and Why are "" for the other reasons.
type Loss struct {
	Reason LostReason
	By     string
	Why    string
}

// String is the reason's name in the unix API's LOST event.
func (r LostReason) String() string {
	switch r {
	case LostExpired:
		return "expired"
	case LostMoved:
		return "moved"
	case LostCompensated:
		return "compensated"
	case LostRevoked:
		return "revoked"
	}
	return "unknown"
}

// earlyLoss is the loss of a holding nobody watched yet (Broker.early),
// and the key its lost event named.
type earlyLoss struct {
	loss Loss
	key  string
}

// maxEarlyLosses bounds Broker.early.
const maxEarlyLosses = 1024

// lostWatch is one WatchLost registration.
type lostWatch struct {
	lock Lock
	fn   func(Loss)
}

// Extend renews l's lease to lease (whole seconds, locksm.MinLeaseSec..
// MaxLeaseSec) from now, through the leader, in one committed command: the
// token and the key's queue stay as they are; for a block, the whole
// holding is extended. It has a release's semantics: sent to the known
// leader, retried (never on a written attempt's M alone; see release)
// until Config.ReleaseDeadline (5 s) after this call, nil only on a
// success reply. On success it returns l with Lease = lease and ValidUntil
// = the moment of this call + lease (the cluster's new lease started
// later). Otherwise a definite cluster error (locksm.ErrNotHeld,
// ErrTokenMismatch, ErrOwnerMismatch: the holding has ended, and every
// WatchLost of it is told LostMoved; locksm.ErrInvalidLease;
// wire.ErrNotSupported before every node runs protocol version 6),
// ErrIndeterminate (the deadline passed without a definite reply),
// ErrClosed, or ctx's error (the extend goes on in the background, like a
// release).
//
// The returned Lock's ValidUntil is what the holder may count on. From the
// moment Extend is called until it returns, and after any outcome but
// success or a definite loss, that is the earlier of l.ValidUntil and the
// moment of this call + lease: the extend may have applied, and on a
// cluster below version 10 (where an extend may lower a lease) a shorter
// lease then ends the holding (and hands the key on) before l.ValidUntil. For an extend that lengthens the lease it is
// l.ValidUntil. Errors returned before anything is sent (an invalid
// lease, ErrClosed from ExtendAsync) return l unchanged.
//
// The broker never extends a lease on its own: a holder that stops
// calling Extend (stalled, stopped, crashed) loses its lock when the lease
// runs out.
func (b *Broker) Extend(ctx context.Context, l Lock, lease time.Duration) (Lock, error) {
	type result struct {
		l   Lock
		err error
	}
	ch := make(chan result, 1)
	start := b.cfg.Now() // no later than ExtendAsync's
	if err := b.ExtendAsync(l, lease, func(nl Lock, err error) { ch <- result{nl, err} }); err != nil {
		return l, err
	}
	select {
	case r := <-ch:
		return r.l, r.err
	case <-ctx.Done():
		l.ValidUntil = extendCapped(l, start, lease)
		return l, fmt.Errorf("sidecar: stopped waiting for the extend (it goes on until its deadline): %w", ctx.Err())
	}
}

// extendCapped is how long l may be counted on while an extend of it to
// lease, started at start, runs or after it ended without a success or a
// definite loss: the earlier of its previous ValidUntil and start + lease.
// The extend may have applied, and its lease counts from when it did
// (after start): a shorter lease than what was left ends the holding
// before the previous ValidUntil, and the key goes to the next waiter
// then (issue 39, attack round 4). For an extend that lengthens the
// lease this is the previous ValidUntil.
func extendCapped(l Lock, start time.Time, lease time.Duration) time.Time {
	if end := start.Add(lease); end.Before(l.ValidUntil) {
		return end
	}
	return l.ValidUntil
}

// ExtendAsync starts the extend of l (as Extend) and returns at once; done
// is called once with the outcome (the extended lock on success), on a
// release worker or a connection's reader goroutine, and must not block.
// The errors returned here (done then never runs) are an invalid lease
// and ErrClosed. done's Lock follows Extend's rule: after any outcome but
// success or a definite loss, its ValidUntil is the earlier of
// l.ValidUntil and the moment of this call + lease (extendCapped).
func (b *Broker) ExtendAsync(l Lock, lease time.Duration, done func(Lock, error)) error {
	sec := lease / time.Second
	if lease%time.Second != 0 || sec < locksm.MinLeaseSec || sec > locksm.MaxLeaseSec {
		return fmt.Errorf("%w: %v (whole seconds, %d..%d)", locksm.ErrInvalidLease, lease, locksm.MinLeaseSec, locksm.MaxLeaseSec)
	}
	start := b.cfg.Now()
	b.extending(l.Token, start, lease)
	job := b.newReleaseJob(l, nil)
	job.extendSec = uint32(sec)
	job.done = func(err error) {
		nl := l
		switch {
		case err == nil:
			nl.Lease, nl.ValidUntil = lease, start.Add(lease)
			b.extended(nl)
		case releaseGone(err):
			b.fireLost(l.Token, "", Loss{Reason: LostMoved})
		default:
			nl.ValidUntil = extendCapped(l, start, lease)
		}
		done(nl, err)
	}
	if b.startRelease(job) {
		return nil
	}
	if err := b.enqueue(job); err != nil {
		b.metrics.extended(job, err)
		return err
	}
	return nil
}

// WatchLost asks to be told, once, when the holding l ends without its
// holder's release: fn(LostExpired) when the leader's lost event for its
// token arrives (fn(LostRevoked) when that event says an operator revoked
// it: WatchLoss tells who and why), fn(LostMoved) when an Extend of it is refused as not
// held, fn(LostCompensated) when Close ends it (before it is released).
// Once Close has taken the broker's held locks to report and release them,
// WatchLost calls fn(LostCompensated) at once, before it returns (the
// holding, if it was still held, is being released; a Lock delivered just
// before Close and watched just after is told so), and its stop does
// nothing. fn runs on a connection's reader goroutine, a release worker,
// the goroutine calling Close or the one calling WatchLost, and must not
// block. stop ends the watch (call it once the lock is released);
// after stop returns, fn is not called. The event is a prompt, never a
// promise: a connection that drops or a leader change can swallow it, so
// a holder still ends its critical section by l.ValidUntil.
func (b *Broker) WatchLost(l Lock, fn func(LostReason)) (stop func()) {
	return b.WatchLoss(l, func(x Loss) { fn(x.Reason) })
}

// WatchLoss is WatchLost whose fn is told the whole Loss: its reason and,
// for LostRevoked, who revoked the holding and why. Everything else is as
// for WatchLost.
func (b *Broker) WatchLoss(l Lock, fn func(Loss)) (stop func()) {
	w := &lostWatch{lock: l, fn: fn}
	b.lmu.Lock()
	if e, ok := b.early[l.Token]; ok && (e.key == "" || l.Key == e.key || slices.Contains(l.Keys, e.key)) {
		// Lost before anyone watched it (a grant a resume replayed,
		// then its revoke): told now.
		delete(b.early, l.Token)
		b.lmu.Unlock()
		b.metrics.lost[e.loss.Reason].Inc()
		fn(e.loss)
		return func() {}
	}
	// Under lmu: a watch added before Close took the holdings is fired by
	// Close's fireLost (which takes lmu after takeHeld), one after is
	// fired here.
	if b.heldTaken.Load() {
		b.lmu.Unlock()
		b.metrics.lost[LostCompensated].Inc()
		fn(Loss{Reason: LostCompensated})
		return func() {}
	}
	b.lost[l.Token] = append(b.lost[l.Token], w)
	b.lmu.Unlock()
	return func() {
		b.lmu.Lock()
		defer b.lmu.Unlock()
		ws := b.lost[l.Token]
		if i := slices.Index(ws, w); i >= 0 {
			ws = slices.Delete(ws, i, i+1)
			if len(ws) == 0 {
				delete(b.lost, l.Token)
			} else {
				b.lost[l.Token] = ws
			}
		}
	}
}

// onLost takes a node's lost event (a connection's reader goroutine):
// wire.LostRevoked is an operator's revoke (who in ev.Owner, why in
// ev.Text), any other reason an expiry.
func (b *Broker) onLost(ev wire.Msg) {
	b.metrics.lostEvents.Inc()
	loss := Loss{Reason: LostExpired}
	if ev.Reason == wire.LostRevoked {
		loss = Loss{Reason: LostRevoked, By: revokeText(ev.Owner, 0x21), Why: strings.Trim(revokeText(ev.Text, 0x20), " ")}
		if loss.By == "" {
			loss.By = "?"
		}
	}
	b.fireLost(ev.Token, ev.Key, loss)
}

// revokeText is a revoke's who or why as a node sent it, with every byte
// outside lo..0x7e replaced by '?' and cut to 128 bytes: a valid one
// (the leader checked it) is unchanged, and nothing a node sends breaks
// the line the unix API writes it on.
func revokeText(s string, lo byte) string {
	if len(s) > locksm.MaxReasonLen {
		s = s[:locksm.MaxReasonLen]
	}
	b := []byte(s)
	for i, c := range b {
		if c < lo || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b)
}

// fireLost tells, and forgets, every watch of the holding under token
// (whose keys include key, unless key is ""): a node names one key of a
// block, and a token the broker does not watch is someone else's.
func (b *Broker) fireLost(token uint64, key string, why Loss) {
	held := b.unhold(token) // the holding has ended: nothing for Close to release
	b.lmu.Lock()
	ws := b.lost[token]
	var fire []*lostWatch
	keep := ws[:0]
	for _, w := range ws {
		if key == "" || w.lock.Key == key || slices.Contains(w.lock.Keys, key) {
			fire = append(fire, w)
		} else {
			keep = append(keep, w)
		}
	}
	if len(keep) == 0 {
		delete(b.lost, token)
	} else {
		b.lost[token] = keep
	}
	if len(fire) == 0 && held {
		// Delivered to its caller, not watched yet: kept for the
		// caller's WatchLoss, which may come a moment later.
		if len(b.earlyOrder) >= maxEarlyLosses {
			delete(b.early, b.earlyOrder[0])
			b.earlyOrder = b.earlyOrder[1:]
		}
		b.early[token] = earlyLoss{loss: why, key: key}
		b.earlyOrder = append(b.earlyOrder, token)
	}
	b.lmu.Unlock()
	for _, w := range fire {
		b.metrics.lost[why.Reason].Inc()
		w.fn(why)
	}
}
