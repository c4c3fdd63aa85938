package sidecar

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Acquires are asynchronous inside the broker: an acquire is an acqOp that
// moves through the scheduler (sched.go) and the connection's hooks, with
// one timer for its current deadline and no goroutine of its own, so a
// waiting room of thousands costs memory, not goroutines. One dispatcher
// goroutine sends; the connection's reader goroutine delivers Q and the
// final reply; the op's timer goroutine (only when it fires) handles a
// deadline.

// opState is where an acquire is.
type opState uint8

const (
	stAdmitting opState = iota // waiting for waiter room (sched.admitQ)
	stPending                  // admitted, not sent: a session's pending FIFO
	stSent                     // given to a connection; holds an in-flight slot
	stQueued                   // the node queued it (Q): waits for its turn, no slot
	stDone                     // over: answered, and nothing of it is left at the node
)

// acqOp is one acquire. Its fields are guarded by Broker.qmu, except
// those set at creation.
type acqOp struct {
	b                   *Broker
	sess                *sess
	key, owner          string
	keys                []string // a block's keys (key is keys[0]); nil for one key
	label               string   // AcquireOptions.Label
	permit              bool     // AcquireOptions.Permit
	lease, wait         time.Duration
	waiter              bool      // wait > 0: needs waiter room
	begun               time.Time // wall clock at the call (latency metric)
	waitEnd, connectEnd time.Time // Config.Now based
	done                func(Lock, error)
	// queued is AcquireOptions.Queued, nil once called or answered.
	// While it runs (queuing), the outcome waits in held, so that done
	// never runs before queued has returned.
	queued  func()
	queuing bool
	held    func()
	// position is AcquireOptions.Position (set at creation).
	position func(Place)

	st          opState
	answered    bool  // done was called; the call may still be live at the node
	cancelCause error // the caller's cancel, if any
	admitting   bool  // in sched.admitQ
	hasRoom     bool  // holds a unit of the waiter room
	evicting    bool  // chosen to make room: its Cancel was sent
	closing     bool  // cancelled by Close: its Cancel was sent
	slot        bool  // holds an in-flight slot on conn
	conn        *client.Conn
	call        *client.Call
	lk          Lock
	timer       *time.Timer
	gen         uint32 // counts arm calls: a stale timer firing is ignored

	qprev, qnext, wprev, wnext *acqOp
}

// effects are what a critical section decided to do once qmu is released:
// callers' callbacks, metrics, logging, compensation, leader hints.
type effects []func()

func (fx *effects) add(f func()) { *fx = append(*fx, f) }

func (fx effects) run() {
	for _, f := range fx {
		f()
	}
}

// checkAcquire validates an acquire's fields.
func checkAcquire(key, owner string, lease, wait time.Duration) error {
	if lease%time.Second != 0 || lease < locksm.MinLeaseSec*time.Second || lease > locksm.MaxLeaseSec*time.Second {
		return fmt.Errorf("%w: lease %v is not whole seconds in 1..250", locksm.ErrInvalidLease, lease)
	}
	if wait < 0 || wait%time.Millisecond != 0 || wait > locksm.MaxWaitMs*time.Millisecond {
		return fmt.Errorf("%w: wait %v is not whole milliseconds in 0..%v", locksm.ErrInvalidWait, wait, locksm.MaxWaitMs*time.Millisecond)
	}
	if err := locksm.ValidateKey(key); err != nil {
		return err
	}
	return locksm.ValidateOwner(owner)
}

// checkBlock validates a block acquire's fields: 2..16 distinct keys
// (locksm.ErrInvalidBlock), each a valid key, and the fields as for one key.
func checkBlock(keys []string, owner string, lease, wait time.Duration) error {
	if err := locksm.ValidateCommand(locksm.Command{Op: locksm.OpAcquireBlock, Keys: keys, Owner: owner,
		LeaseSec: locksm.MinLeaseSec}); err != nil {
		return fmt.Errorf("%w: %d keys %q", err, len(keys), keys)
	}
	return checkAcquire(keys[0], owner, lease, wait)
}

// AcquireBlock asks for every key of keys at once (2..16 distinct keys), on
// behalf of owner: all are granted together under one token, or none. The
// block joins every key's queue in one command; it is granted when it
// stands first on each and none is held (locksm/MATRIX.md, "Blocks").
// Fields, errors and the retry rules are Acquire's; a node older than
// protocol version 5, or a cluster that is not upgraded everywhere, gives
// wire.ErrNotSupported (definite: nothing was executed). The Lock's Key is
// keys[0] and its Keys all of them; Release frees the whole block. One
// key is Acquire.
func (b *Broker) AcquireBlock(ctx context.Context, keys []string, owner string, lease, wait time.Duration) (Lock, error) {
	return b.acquireWait(ctx, keys, owner, lease, wait)
}

// AcquireBlockAsync is AcquireAsync for a block (see AcquireBlock).
func (b *Broker) AcquireBlockAsync(keys []string, owner string, lease, wait time.Duration, done func(Lock, error)) (cancel func(cause error), err error) {
	return b.AcquireAsyncOpts(keys, owner, lease, wait, AcquireOptions{}, done)
}

// AcquireOptions are the optional parts of an asynchronous acquire
// (AcquireAsyncOpts).
type AcquireOptions struct {
	// Queued, if not nil, is called when the cluster reports that it
	// committed the acquire into the key's FIFO queue (a block: into every
	// key's queue): the cluster protocol's Q frame (version 4). An acquire
	// of the same key that anyone sends after Queued was called stands
	// behind this one. It is called at most once, before done and never
	// after done was called, on a broker goroutine with none of the
	// broker's locks held; like done, it must not block, and done waits
	// for it to return. It is a prompt, not a promise: an acquire granted
	// or refused without queueing (wait 0 among them) never gets it, a
	// node older than protocol version 4 never sends it, and a leader
	// change can swallow it.
	Queued func()
	// Position, if not nil, is called with each place in line the
	// cluster's leader tells the queued acquire (the cluster protocol's R
	// frame, version 12): at most once per key and the leader's position
	// interval, only when the place changed, a block once per key. It runs
	// on the cluster connection's reader goroutine with none of the
	// broker's locks held and must not block. The final reply comes on
	// that goroutine after every R, so done follows the last Position;
	// but an acquire answered elsewhere (its cancel, its deadline, the
	// cluster connection ending) may see one Position run while or just
	// after done runs: a caller ignores a Position that reaches it after
	// its outcome (unixapi does: no line after the reply). A prompt, not a
	// promise: a leader older than version 12 never sends one (the broker
	// asks for places, with w, only on connections that negotiated 12),
	// and a leader change can delay one by an interval.
	Position func(Place)
	// Label is the caller's owner label ("" = none): 1..locksm.MaxLabelLen
	// bytes of the key alphabet (else locksm.ErrInvalidLabel, not sent).
	// It is sent with the acquire and kept by the cluster with the
	// holding (inspect shows it), and the Lock carries it. A labelled
	// acquire needs the serving leader's connection at cluster protocol
	// version 8 (else wire.ErrNotSupported, definite, nothing sent) and
	// the cluster version 8 (else the leader answers not_supported): it is
	// never sent without its label.
	Label string
	// Permit takes one permit of the semaphore key (one key, never a
	// block; locksm/MATRIX.md, "Semaphores") instead of the key's lock:
	// the Lock carries its Slot, and the key and the slot are its fencing
	// domain. A key that is not a semaphore is locksm.ErrNotSemaphore;
	// a lock acquire of a semaphore key locksm.ErrIsSemaphore. It needs
	// the serving leader's connection at cluster protocol version 13
	// (else wire.ErrNotSupported, definite, nothing sent).
	Permit bool
}

// Place is a queued acquire's place in one key's line at the leader's
// latest walk of it (AcquireOptions.Position).
type Place struct {
	Key      string
	Position uint32 // 1 = next
	// Estimate is the leader's estimate of the wait: Position times the
	// key's mean interval between hand-offs. Unknown (false) until the
	// leader saw two hand-offs of the key.
	Estimate      time.Duration
	EstimateKnown bool
}

// AcquireAsyncOpts is AcquireAsync (one key) or AcquireBlockAsync (2..16
// keys) with options: keys, owner, lease, wait, done, cancel and the
// errors are theirs.
func (b *Broker) AcquireAsyncOpts(keys []string, owner string, lease, wait time.Duration, opts AcquireOptions,
	done func(Lock, error)) (cancel func(cause error), err error) {
	begun := time.Now()
	if err := locksm.ValidateLabel(opts.Label); err != nil {
		err = fmt.Errorf("%w: %q (1..%d bytes of 0x21..0x7E)", err, opts.Label, locksm.MaxLabelLen)
		b.metrics.acquired(err, begun)
		return nil, err
	}
	if opts.Permit && len(keys) != 1 {
		err := fmt.Errorf("%w: a permit is of one semaphore key, not a block of %d", locksm.ErrIsSemaphore, len(keys))
		b.metrics.acquired(err, begun)
		return nil, err
	}
	if len(keys) == 1 {
		if err := checkAcquire(keys[0], owner, lease, wait); err != nil {
			b.metrics.acquired(err, begun)
			return nil, err
		}
		return b.startAcquire(keys[0], nil, owner, lease, wait, begun, opts, done)
	}
	if err := checkBlock(keys, owner, lease, wait); err != nil {
		b.metrics.acquired(err, begun)
		return nil, err
	}
	keys = slices.Clone(keys) // the Lock and the node keep them
	return b.startAcquire(keys[0], keys, owner, lease, wait, begun, opts, done)
}

// Acquire asks for key on behalf of owner. lease must be whole seconds in
// 1..250 s; wait is the bound on waiting for the turn (0 = one try) and must
// be a whole number of milliseconds up to an hour (locksm.MaxWaitMs; over 5
// minutes only once the cluster runs protocol version 11, else
// wire.ErrNotSupported). It returns the Lock, or
// ErrBusy, ErrTimeout, ErrIndeterminate, ErrMoved, ErrUnavailable,
// ErrTooManyWaiters, a field error (locksm.ErrInvalidKey, ...) or an error
// wrapping ctx.Err() (not acquired; a grant that arrives later is released
// by the broker).
//
// owner is also the session the request is scheduled for (see
// AcquireAsync). The request is retried on another connection only if not
// one byte of it was written; a written request with no definite reply is
// Indeterminate. A wait is counted from the call: while no leader serves
// (or the in-flight budget is full) the request waits unsent, and is sent
// with what is left of its wait; a wait above 0 that ran out first is
// ErrTimeout, answered without sending (Config.LeaderWait). Acquire is
// AcquireAsync and a wait.
func (b *Broker) Acquire(ctx context.Context, key, owner string, lease, wait time.Duration) (Lock, error) {
	return b.acquireWait(ctx, []string{key}, owner, lease, wait)
}

// acquireWait is Acquire (one key) or AcquireBlock, waiting for the outcome.
func (b *Broker) acquireWait(ctx context.Context, keys []string, owner string, lease, wait time.Duration) (Lock, error) {
	if err := ctx.Err(); err != nil {
		err = fmt.Errorf("sidecar: acquire not sent: %w", err)
		b.metrics.acquired(err, time.Now())
		return Lock{}, err
	}
	type result struct {
		lk  Lock
		err error
	}
	ch := make(chan result, 1)
	cancel, err := b.AcquireBlockAsync(keys, owner, lease, wait, func(lk Lock, err error) { ch <- result{lk, err} })
	if err != nil {
		return Lock{}, err
	}
	select {
	case r := <-ch:
		return r.lk, r.err
	case <-ctx.Done():
		cancel(ctx.Err())
		r := <-ch // cancel makes the answer come at once
		return r.lk, r.err
	}
}

// AcquireAsync starts an acquire (fields as for Acquire) and returns at
// once. done is called exactly once with the outcome, on one of the
// broker's goroutines (a connection's reader, a timer, the dispatcher) or
// on the goroutine calling cancel or AcquireAsync for another request:
// it must not block, and it must not call the broker's synchronous methods
// (AcquireAsync, ReleaseAsync, Compensate and cancel are fine). An error
// returned here (invalid fields, ErrClosed, ErrTooManyWaiters) is the
// outcome instead, and done is never called.
//
// cancel(cause) gives up: an acquire not yet written is dropped (done gets
// an error wrapping cause, "not sent"); a written one is cancelled at the
// node and reported abandoned (wrapping cause), and a grant that still
// arrives is released by the broker. Calling cancel after done ran does
// nothing; done may still report a grant that won the race.
//
// owner is the session: acquires of one owner are sent in the order asked,
// sessions take turns to send (round-robin), and an acquire with a wait
// takes waiter room (Config.MaxWaiters, MaxWaitersPerSession) from now
// until its final reply. When the sidecar-wide room is full, the session
// that holds the most is refused (ErrTooManyWaiters); an asker holding
// less gets room by evicting that session's newest waiter, which is
// answered ErrTooManyWaiters ("evicted"), unless a grant reaches it first.
//
// AcquireAsyncOpts also tells when the cluster queued the acquire
// (AcquireOptions.Queued).
func (b *Broker) AcquireAsync(key, owner string, lease, wait time.Duration, done func(Lock, error)) (cancel func(cause error), err error) {
	return b.AcquireAsyncOpts([]string{key}, owner, lease, wait, AcquireOptions{}, done)
}

// startAcquire starts a checked acquire of key, or of the block keys.
func (b *Broker) startAcquire(key string, keys []string, owner string, lease, wait time.Duration, begun time.Time,
	opts AcquireOptions, done func(Lock, error)) (cancel func(cause error), err error) {
	now := b.cfg.Now()
	o := &acqOp{b: b, key: key, keys: keys, owner: owner, lease: lease, wait: wait, waiter: wait > 0, begun: begun,
		waitEnd: now.Add(wait), connectEnd: now.Add(max(wait, b.cfg.LeaderWait)), done: done, queued: opts.Queued,
		label: opts.Label, permit: opts.Permit, position: opts.Position}
	var fx effects
	b.qmu.Lock()
	if b.qclosed {
		b.qmu.Unlock()
		b.metrics.acquired(ErrClosed, begun)
		return nil, ErrClosed
	}
	o.sess = b.sc.session(owner)
	v, victim := b.sc.admit(o)
	switch v {
	case refusedSession, refusedFull:
		if v == refusedSession {
			err = fmt.Errorf("%w: this session has %d waiting acquires already (at most %d per session)",
				ErrTooManyWaiters, o.sess.count(), b.sc.maxPerSession)
			b.metrics.waiterRefusals[refusedPerSession].Inc()
		} else {
			err = fmt.Errorf("%w: the sidecar's waiter room (%d) is full and this session holds the most of it (%d)",
				ErrTooManyWaiters, b.sc.maxWaiters, o.sess.count())
			b.metrics.waiterRefusals[refusedSidecarFull].Inc()
		}
		b.sc.drop(o.sess)
		b.qmu.Unlock()
		b.metrics.acquired(err, begun)
		return nil, err
	case mustWait:
		o.st = stAdmitting
		if victim != nil {
			b.evictLocked(victim, &fx)
		}
	case admitted:
		o.st = stPending
		b.sc.enqueue(o)
		b.kickLocked()
	}
	if o.st != stDone {
		o.armLocked(o.connectEnd)
	}
	b.qmu.Unlock()
	fx.run()
	return o.cancel, nil
}

// kickLocked wakes the dispatcher. Requires qmu (or not: it never blocks).
func (b *Broker) kickLocked() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// armLocked sets o's one timer to fire at at (Config.Now's clock).
func (o *acqOp) armLocked(at time.Time) {
	d := max(at.Sub(o.b.cfg.Now()), 0)
	if o.timer != nil {
		if o.timer.Reset(d) {
			// It had not fired: its func now runs at the new time, once,
			// and the generation it carries stays the current one.
			return
		}
		// It fired, or was stopped: Reset scheduled its func again, for
		// a generation that is over.
		o.timer.Stop()
	}
	o.gen++
	gen := o.gen
	o.timer = time.AfterFunc(d, func() { o.onTimer(gen) })
}

// answerLocked records the outcome; done runs once qmu is released, or,
// while the Queued callback runs, once it returned.
func (o *acqOp) answerLocked(lk Lock, err error, fx *effects) {
	if o.answered {
		return
	}
	o.answered = true
	done, b, begun := o.done, o.b, o.begun
	o.done, o.queued = nil, nil
	if err == nil {
		if b.qclosed {
			// A grant that arrives while the broker closes: Close has
			// taken the holdings to report and release already, so this
			// caller is told it does not hold the key, and it is released.
			late := lk
			lk, err = Lock{}, fmt.Errorf("%w: granted (token %d) while the broker closed: not acquired, and the grant is released", ErrClosed, late.Token)
			fx.add(func() {
				b.log.Info("releasing a grant that arrived while the broker closed", "key", late.Key, "token", late.Token)
				b.Compensate(late)
			})
		} else {
			b.holdLocked(lk)
		}
	}
	f := func() {
		if err == nil && b.heldTaken.Load() {
			// Close took the holdings (this one among them: it registered
			// before qclosed) and reports and releases them: delivered now,
			// the caller would count on a key being released.
			err = fmt.Errorf("%w: granted (token %d) but the broker closed before it was delivered: not acquired, and the grant is released", ErrClosed, lk.Token)
			lk = Lock{}
		}
		b.metrics.acquired(err, begun)
		done(lk, err)
	}
	if o.queuing {
		o.held = f
		return
	}
	fx.add(f)
}

// endLocked retires o: answered, and nothing of it left at the node. Its
// waiter room goes to whoever waits for room.
func (b *Broker) endLocked(o *acqOp, fx *effects) {
	o.st = stDone
	if o.timer != nil {
		o.timer.Stop()
	}
	o.conn, o.call = nil, nil
	delete(b.sessOps, o)
	b.unsentLocked(o)
	b.freeLocked(o)
	b.sc.drop(o.sess)
}

// freeLocked gives back o's waiter room; acquires admitted with it are
// queued for sending.
func (b *Broker) freeLocked(o *acqOp) {
	for _, a := range b.sc.free(o) {
		a.st = stPending
		b.sc.enqueue(a)
		b.kickLocked()
	}
}

// errEvicted is the outcome of a waiter evicted to make room.
func errEvicted(o *acqOp) error {
	return fmt.Errorf("%w: evicted to make room: this session held the most of the sidecar's waiter room, and a session holding less asked for some",
		ErrTooManyWaiters)
}

// evictLocked makes room by ending victim (sched.admit chose it).
func (b *Broker) evictLocked(v *acqOp, fx *effects) {
	b.metrics.evictions.Inc()
	switch v.st {
	case stAdmitting:
		// Only a promise: sched.admit took it out of admitQ already.
		v.answerLocked(Lock{}, errEvicted(v), fx)
		b.endLocked(v, fx)
	case stPending:
		b.sc.unqueue(v)
		v.answerLocked(Lock{}, errEvicted(v), fx)
		b.endLocked(v, fx)
	case stSent, stQueued:
		// Cancel it at the node; its final reply frees the room (T: it
		// was evicted; G: the grant won the race and stands).
		if _, err := v.conn.StartFunc(wire.Msg{Type: wire.TypeCancel, Target: v.call.ID}, client.Hooks{}); err != nil {
			// Without a session the connection's end frees the room; with
			// one, the session keeps the waiter and resumedOps sends
			// the cancel again after the resume.
			b.log.Debug("cannot send the eviction's cancel now", "key", v.key, "err", err)
		}
	}
}

// giveUpLocked stops waiting for o's written acquire: the node is asked to
// cancel it; a grant that still arrives is released (onDone).
func (b *Broker) giveUpLocked(o *acqOp) {
	if o.conn == nil || o.call == nil {
		return
	}
	if _, err := o.conn.StartFunc(wire.Msg{Type: wire.TypeCancel, Target: o.call.ID}, client.Hooks{}); err != nil {
		b.log.Debug("cannot send a cancel", "key", o.key, "err", err)
	}
}

// cancel is the caller's cancel func.
func (o *acqOp) cancel(cause error) {
	b := o.b
	var fx effects
	b.qmu.Lock()
	if o.answered || o.st == stDone {
		b.qmu.Unlock()
		return
	}
	o.cancelCause = cause
	switch o.st {
	case stAdmitting:
		b.sc.unwait(o)
		o.answerLocked(Lock{}, fmt.Errorf("sidecar: acquire not sent: %w", cause), &fx)
		b.endLocked(o, &fx)
	case stPending:
		b.sc.unqueue(o)
		o.answerLocked(Lock{}, fmt.Errorf("sidecar: acquire not sent: %w", cause), &fx)
		b.endLocked(o, &fx)
	case stSent, stQueued:
		conn, call := o.conn, o.call
		b.qmu.Unlock()
		// Withdrawn before a byte left: onDone (run by Abandon, on this
		// goroutine) answers it as not sent.
		if !conn.Written(call) && !conn.Abandon(call) {
			return
		}
		b.qmu.Lock()
		if !o.answered && o.st != stDone && o.call == call {
			o.answerLocked(Lock{}, fmt.Errorf("sidecar: acquire abandoned, not acquired (a late grant is released): %w", cause), &fx)
			b.giveUpLocked(o)
		}
	}
	b.qmu.Unlock()
	fx.run()
}

// onTimer handles o's deadline: not sent in time, no room in time, or no
// reply in time.
func (o *acqOp) onTimer(gen uint32) {
	b := o.b
	var fx effects
	b.qmu.Lock()
	if o.gen != gen || o.st == stDone {
		b.qmu.Unlock()
		return
	}
	switch o.st {
	case stAdmitting:
		b.sc.unwait(o)
		b.metrics.waiterRefusals[refusedNoRoomFreed].Inc()
		o.answerLocked(Lock{}, fmt.Errorf("%w: no waiter room freed within %v", ErrTooManyWaiters, max(o.wait, b.cfg.LeaderWait)), &fx)
		b.endLocked(o, &fx)
	case stPending:
		b.sc.unqueue(o)
		o.answerLocked(Lock{}, b.unavailableWhy(fmt.Errorf("%w: not sent within %v (no serving leader known and connected, or the in-flight budget to it stayed full); nothing written",
			ErrUnavailable, max(o.wait, b.cfg.LeaderWait))), &fx)
		b.endLocked(o, &fx)
	case stSent, stQueued:
		if !o.answered {
			o.answerLocked(Lock{}, fmt.Errorf("%w: no reply within %v of the wait", ErrIndeterminate, b.cfg.ReplyGrace), &fx)
			b.giveUpLocked(o)
		}
	}
	b.qmu.Unlock()
	fx.run()
}

// onQueued is the Q hook: the node queued the acquire, which frees its
// in-flight slot, and the caller's Queued callback is due.
func (o *acqOp) onQueued(call *client.Call) {
	b := o.b
	var fx effects
	b.qmu.Lock()
	if o.call == call && o.st == stSent {
		o.st = stQueued
		b.dropSlotLocked(o)
	}
	if q := o.queued; q != nil && o.call == call && !o.answered {
		// The client's Q hook may race with the connection's end (Done);
		// answered decides which came first.
		o.queued, o.queuing = nil, true
		fx.add(func() { o.runQueued(q) })
	}
	b.qmu.Unlock()
	fx.run()
}

// onPosition passes a place in line (R) on to the caller, unless the
// acquire was answered already or moved on from that call.
func (o *acqOp) onPosition(call *client.Call, m wire.Msg) {
	b := o.b
	b.qmu.Lock()
	live := o.call == call && !o.answered && o.st != stDone
	b.qmu.Unlock()
	if !live {
		return
	}
	p := Place{Key: m.Key, Position: m.Position}
	if m.EstimateMs != wire.EstimateUnknown {
		p.Estimate, p.EstimateKnown = time.Duration(m.EstimateMs)*time.Millisecond, true
	}
	o.position(p)
}

// runQueued calls the caller's Queued callback, then the outcome if it was
// decided meanwhile (answerLocked held it back), so that done never runs
// before Queued returned.
func (o *acqOp) runQueued(q func()) {
	q()
	b := o.b
	b.qmu.Lock()
	o.queuing = false
	held := o.held
	o.held = nil
	b.qmu.Unlock()
	if held != nil {
		held()
	}
}

// dropSlotLocked gives back o's in-flight slot.
func (b *Broker) dropSlotLocked(o *acqOp) {
	if !o.slot {
		return
	}
	o.slot = false
	if n := b.inflight[o.conn] - 1; n > 0 {
		b.inflight[o.conn] = n
	} else {
		delete(b.inflight, o.conn)
	}
	b.kickLocked()
}

// onDone is the completion hook: the final reply, or the connection's end.
func (o *acqOp) onDone(call *client.Call) {
	b := o.b
	var fx effects
	b.qmu.Lock()
	if o.call != call || o.st == stDone {
		b.qmu.Unlock()
		return
	}
	b.dropSlotLocked(o)
	if call.Err != nil {
		void := errors.Is(call.Err, client.ErrVoid)
		switch {
		case !call.Written && !o.answered && o.cancelCause == nil && !b.qclosed && b.cfg.Now().Before(o.connectEnd):
			// Not one byte was written: send it again, first of its
			// session, on whichever connection serves next.
			o.st, o.conn, o.call = stPending, nil, nil
			b.unsentLocked(o)
			b.sc.requeue(o)
			b.kickLocked()
			b.qmu.Unlock()
			return
		case void && !o.answered && o.cancelCause == nil && !b.qclosed && b.cfg.Now().Before(o.waitEnd.Add(b.cfg.ReplyGrace)):
			// Void: the cluster session's resume said it was never
			// applied and never will be. Its caller still waits, so it
			// is sent again as a new request (a new seq), first of its
			// owner: not a resend of a written request
			// (docs/sessions.md, "The broker").
			b.metrics.voidResent.Inc()
			o.st, o.conn, o.call = stPending, nil, nil
			delete(b.sessOps, o)
			b.unsentLocked(o)
			b.sc.requeue(o)
			o.armLocked(o.waitEnd.Add(b.cfg.ReplyGrace))
			b.kickLocked()
			b.qmu.Unlock()
			return
		case o.answered:
		case void && o.waiter && !b.qclosed:
			o.answerLocked(Lock{}, fmt.Errorf("%w: the acquire was void (never applied) and its wait ran out", ErrTimeout), &fx)
		case void && !b.qclosed:
			o.answerLocked(Lock{}, fmt.Errorf("%w: the acquire was void (never applied) and its time ran out", ErrUnavailable), &fx)
		case !call.Written && o.cancelCause != nil:
			o.answerLocked(Lock{}, fmt.Errorf("sidecar: acquire not sent: %w", o.cancelCause), &fx)
		case !call.Written && b.qclosed:
			o.answerLocked(Lock{}, ErrClosed, &fx)
		case !call.Written:
			o.answerLocked(Lock{}, fmt.Errorf("%w: no connection took the request within %v", ErrUnavailable, max(o.wait, b.cfg.LeaderWait)), &fx)
		default:
			o.answerLocked(Lock{}, fmt.Errorf("%w: connection lost after the acquire was sent: %w", ErrIndeterminate, call.Err), &fx)
		}
	} else if o.answered {
		if r := call.Reply; r.Type == wire.TypeGranted {
			lk := o.lk
			lk.Token = r.Token
			fx.add(func() {
				b.metrics.lateGrants.Inc()
				b.log.Info("releasing a grant that arrived after its caller gave up", "key", lk.Key, "token", lk.Token)
				b.Compensate(lk)
			})
		}
	} else {
		lk, err := b.acquireReply(o.lk, call.Reply, &fx)
		if o.evicting && call.Reply.Type == wire.TypeTimeout {
			err = errEvicted(o)
		}
		if o.closing && call.Reply.Type == wire.TypeTimeout {
			err = fmt.Errorf("%w: the acquire was cancelled as the broker closed; not acquired", ErrClosed)
		}
		o.answerLocked(lk, err, &fx)
	}
	b.endLocked(o, &fx)
	b.qmu.Unlock()
	fx.run()
}

// acquireReply turns a final reply into the outcome; leader hints are
// taken as effects.
func (b *Broker) acquireReply(lk Lock, r wire.Msg, fx *effects) (Lock, error) {
	switch r.Type {
	case wire.TypeGranted:
		lk.Token = r.Token
		lk.Slot = r.Slot // a permit's; absent (0) from a resume for slot 0
		return lk, nil
	case wire.TypeBusy:
		return Lock{}, ErrBusy
	case wire.TypeTimeout:
		return Lock{}, ErrTimeout
	case wire.TypeMoved:
		fx.add(func() { b.moved(r.LeaderAddr) })
		if r.LeaderAddr == "" {
			return Lock{}, errNoLeaderHint(r)
		}
		return Lock{}, fmt.Errorf("%w: leader is %q at %q; not executed", ErrMoved, r.LeaderID, r.LeaderAddr)
	case wire.TypeUnknown:
		fx.add(b.forgetLeader)
		return Lock{}, fmt.Errorf("%w: %s", ErrIndeterminate, r.Text)
	case wire.TypeError:
		return Lock{}, wire.RemoteErr(r.Code, r.Text)
	}
	return Lock{}, fmt.Errorf("%w: unexpected reply %s", ErrIndeterminate, wire.TypeName(r.Type))
}

// errNoLeaderHint is the outcome of a request answered M without a
// leader's address: the node asked no longer leads and names nobody to
// go to (it lost its quorum, or an election is under way). Not executed,
// so definite; and with nowhere to go it is ErrUnavailable, not ErrMoved
// (which names a leader to retry at). The M is still only a hint: the
// written request is not resent.
func errNoLeaderHint(r wire.Msg) error {
	if r.LeaderID != "" {
		return fmt.Errorf("%w: the node asked does not lead; it names leader %q without a client address; not executed", ErrUnavailable, r.LeaderID)
	}
	return fmt.Errorf("%w: the node asked does not lead and knows no leader (no quorum, or an election under way); not executed", ErrUnavailable)
}

// DefaultNodeMaxInFlight is the in-flight budget per connection assumed
// for a node that does not tell its own (protocol version 3 and older):
// the node's default MaxInFlightPerConn.
const DefaultNodeMaxInFlight = 4096

// inFlightCap is how many acquires may be in flight to commit on conn.
func (b *Broker) inFlightCap(conn *client.Conn) int {
	n := conn.Peer().MaxInFlight
	if n <= 0 {
		// An older node: it sends no Q, so a queued waiter keeps its slot
		// until its final reply, and a cap meant for requests about to
		// commit would cap the waiting room. Its own bound it is.
		return DefaultNodeMaxInFlight
	}
	if b.cfg.MaxInFlight > 0 {
		n = min(n, b.cfg.MaxInFlight)
	}
	return n
}

// sendResult is what one round of sending ended on.
type sendResult uint8

const (
	sendIdle   sendResult = iota // nothing left to send
	sendFull                     // the connection's in-flight budget is used up
	sendFailed                   // the connection refused (closed, handing over)
)

// sendSome sends pending acquires on conn, round-robin across sessions,
// until nothing is pending or conn's budget is used up.
func (b *Broker) sendSome(conn *client.Conn) sendResult {
	var fx effects
	defer func() { fx.run() }() // after qmu is released (defers run last first)
	b.qmu.Lock()
	defer b.qmu.Unlock()
	if b.cfg.MaxWaiters == 0 {
		if n := conn.Peer().MaxWaiters; n > 0 {
			b.sc.maxWaiters = n // the node's own bound: never ask for more
		}
	}
	limit := b.inFlightCap(conn)
	for {
		if b.inflight[conn] >= limit {
			return sendFull
		}
		o := b.sc.next()
		if o == nil {
			return sendIdle
		}
		now := b.cfg.Now()
		remaining := max(o.waitEnd.Sub(now), 0)
		if o.waiter && remaining == 0 {
			// Its wait ran out before a byte of it was written: it was
			// held while no leader served, or queued behind the in-flight
			// budget. Sent now it would carry wait 0, a one-try acquire
			// the cluster answers BUSY for a held key, which the caller
			// reads as "wait 0". Never sent, it is definitely not
			// granted: TIMEOUT, answered here.
			o.answerLocked(Lock{}, fmt.Errorf("%w: the wait of %v ran out before the acquire could be sent (no serving leader, or the in-flight budget to it full); not sent",
				ErrTimeout, o.wait), &fx)
			b.endLocked(o, &fx)
			continue
		}
		m := wire.Msg{Type: wire.TypeAcquire, Key: o.key, Owner: o.owner, Label: o.label,
			Lease: uint16(o.lease / time.Second), WaitMs: wireWaitMs(remaining, o.wait)}
		if v := conn.Peer().Version; o.label != "" && v < wire.VersionLabels {
			// Definite, as for a block below: never sent without its
			// label, which the caller asked inspect and the logs to show.
			o.answerLocked(Lock{}, fmt.Errorf("%w: the leader speaks protocol version %d; labels need %d",
				wire.ErrNotSupported, v, wire.VersionLabels), &fx)
			b.endLocked(o, &fx)
			continue
		}
		if v := conn.Peer().Version; m.WaitMs > locksm.MaxShortWaitMs && v < wire.VersionLongWaits {
			// Definite: an older leader would answer invalid_wait, which
			// reads as the caller's mistake rather than the cluster's age.
			o.answerLocked(Lock{}, fmt.Errorf("%w: the leader speaks protocol version %d; waits over %d s need %d",
				wire.ErrNotSupported, v, locksm.MaxShortWaitMs/1000, wire.VersionLongWaits), &fx)
			b.endLocked(o, &fx)
			continue
		}
		if o.permit {
			if v := conn.Peer().Version; v < wire.VersionSemaphores {
				o.answerLocked(Lock{}, permitsNotSupported(v), &fx)
				b.endLocked(o, &fx)
				continue
			}
			m.Type = wire.TypeAcquirePermit
		}
		if o.keys != nil {
			if v := conn.Peer().Version; v < wire.VersionBlocks {
				// A definite no: the node cannot take it, and no leader of
				// this cluster speaks a newer version than its members.
				o.answerLocked(Lock{}, fmt.Errorf("%w: the leader speaks protocol version %d; block acquires need %d",
					wire.ErrNotSupported, v, wire.VersionBlocks), &fx)
				b.endLocked(o, &fx)
				continue
			}
			m.Type, m.Key, m.Keys = wire.TypeAcquireBlock, "", o.keys
		}
		hooks := client.Hooks{Queued: o.onQueued, Done: o.onDone}
		if o.position != nil {
			hooks.Position = o.onPosition
		}
		call, err := conn.StartFunc(m, hooks)
		if err != nil {
			b.sc.requeue(o) // nothing written
			return sendFailed
		}
		o.st, o.conn, o.call, o.slot = stSent, conn, call, true
		b.sent[o] = struct{}{}
		b.inflight[conn]++
		if b.sessionsFor(conn) {
			b.sessOps[o] = struct{}{}
		}
		o.lk = Lock{Key: o.key, Keys: o.keys, Owner: o.owner, Label: o.label, Lease: o.lease, ValidUntil: now.Add(o.lease), Permit: o.permit}
		o.armLocked(now.Add(remaining + b.cfg.ReplyGrace))
	}
}

// wireWaitMs is the wait an acquire sent with remaining of its wait left
// carries on the wire, in whole milliseconds, rounded up: a waiter's
// last microseconds must not become wait 0 (one try, answered BUSY for a
// held key). It never exceeds the wait asked for (wait, whole
// milliseconds), whatever the clock did.
func wireWaitMs(remaining, wait time.Duration) uint32 {
	ms := (remaining + time.Millisecond - 1) / time.Millisecond
	return uint32(min(ms, wait/time.Millisecond))
}

// dispatch is the one goroutine that sends acquires: whenever some are
// pending, it finds the serving leader's connection and sends what its
// budget allows; it sleeps until an acquire is asked for, a slot frees or
// the connections change.
func (b *Broker) dispatch() {
	defer b.workerWG.Done()
	skip := map[*client.Conn]bool{}
	for {
		b.qmu.Lock()
		n, closed := b.sc.pendingN, b.qclosed
		b.qmu.Unlock()
		if closed {
			return
		}
		if n == 0 {
			select {
			case <-b.kick:
				clear(skip)
			case <-b.qstop:
				return
			}
			continue
		}
		conn, changed := b.leastLoaded(b.leaderConns(skip))
		if conn == nil {
			b.mu.Lock()
			known := b.leaderConnectedLocked()
			b.mu.Unlock()
			if !known {
				// Ask the nodes (a status request, safe to repeat); the
				// pending acquires' own deadlines end those that wait
				// too long. A hinted leader not connected is asked
				// about too: it may never be reached.
				b.findLeader(b.qctx, b.cfg.Now().Add(leaderProbeInterval))
				continue
			}
			select {
			case <-changed:
			case <-b.kick:
			case <-b.qstop:
				return
			case <-b.cfg.After(leaderProbeInterval):
			}
			clear(skip)
			continue
		}
		if r := b.sendSome(conn); r != sendIdle {
			skip[conn] = true // full or refusing: another connection to the leader, or wait
		}
	}
}

// leaderConns returns the live connections to the serving leader not in
// skip, starting round-robin, and the channel closed at the next change of
// connections or leader.
func (b *Broker) leaderConns(skip map[*client.Conn]bool) ([]*client.Conn, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.leader == "" {
		return nil, b.changed
	}
	var conns []*client.Conn
	n := len(b.slots)
	for i := 0; i < n; i++ {
		s := b.slots[(b.rr+i)%n]
		if s.addr == b.leader && s.conn != nil && !skip[s.conn] && !s.conn.HandingOver() && b.usableLocked(s.conn) {
			if len(conns) == 0 {
				b.rr = (b.rr + i + 1) % n
			}
			conns = append(conns, s.conn)
		}
	}
	return conns, b.changed
}

// leastLoaded picks the connection with the fewest acquires in flight (the
// first of conns on a tie), so that a connection stalled in a write does
// not get every new acquire.
func (b *Broker) leastLoaded(conns []*client.Conn, changed <-chan struct{}) (*client.Conn, <-chan struct{}) {
	if len(conns) == 0 {
		return nil, changed
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	best := conns[0]
	for _, c := range conns[1:] {
		if b.inflight[c] < b.inflight[best] {
			best = c
		}
	}
	return best, changed
}

// failQueuedLocked answers every acquire not sent yet with err (the broker
// closes).
func (b *Broker) failQueuedLocked(err error, fx *effects) {
	for b.sc.admitQ.n > 0 {
		o := b.sc.admitQ.head
		b.sc.unwait(o)
		o.answerLocked(Lock{}, err, fx)
		b.endLocked(o, fx)
	}
	for {
		o := b.sc.next()
		if o == nil {
			return
		}
		o.answerLocked(Lock{}, err, fx)
		b.endLocked(o, fx)
	}
}
