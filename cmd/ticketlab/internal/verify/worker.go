package verify

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	ticketing "ticketing/clients/go"
)

// WorkerParams configures one worker's loop.
type WorkerParams struct {
	// ID is the worker's number in the run (unique, also porcupine's client
	// id); Proc says it runs as a worker process.
	ID   int
	Proc bool
	// Seed makes the worker's choices (keys, leases, waits, holds)
	// reproducible.
	Seed int64
	// Socket is the sidecar's unix socket; Sidecar its number (1-based),
	// which the harness stamps on the worker's operations (Op.Sidecar; a
	// worker process is not told).
	Socket  string
	Sidecar int
	// Keys is the small set of contended keys.
	Keys []string
	// HoldMin..HoldMax is how long a holder works before its fenced write.
	HoldMin, HoldMax time.Duration
	// LateProb is the chance that a holder sleeps past its lease before
	// writing (the write must then be fenced off if a newer holder wrote).
	LateProb float64
	// BlockShare is the share of acquires that are blocks (2..MaxBlockKeys
	// distinct keys of Keys at once, one token); the rest take one key.
	BlockShare float64
	// Extend makes the worker an extender (extender.go): it holds across
	// several leases with EXTEND, and with probability StallProb a holding
	// stalls past its lease instead and must notice the loss on waking.
	Extend    bool
	StallProb float64
}

// MaxBlockKeys is the largest block the workload asks for (the product
// allows 16; the key pool is small).
const MaxBlockKeys = 4

// Workload ranges (issue 4: random lease and wait, hot contention).
const (
	minLease = 1 * time.Second
	maxLease = 3 * time.Second
	maxWait  = 2 * time.Second
)

// writeFunc performs a fenced write of every key of keys under token (one
// key, or a block's keys, atomically): accepted, or rejected by the fencing
// check, or an error (the store was unreachable).
type writeFunc func(keys []string, token uint64, worker int, op int64) (bool, error)

// fencedWrite performs w (a KindWrite op: its Token, over keys) and
// returns it with its times and outcome.
func fencedWrite(write writeFunc, w Op, keys []string) Op {
	w.Inv = time.Now().UnixNano()
	ok, err := write(keys, w.Token, w.Worker, w.ID)
	w.Cmp = time.Now().UnixNano()
	switch {
	case err != nil:
		w.Result, w.Err = ResError, err.Error()
	case ok:
		w.Result = ResOK
	default:
		w.Result = ResRejected
	}
	return w
}

// runWorker loops acquire → fenced write → (sometimes sleep past the lease)
// → release until ctx ends, reporting every operation to emit. An acquire
// is a block of 2..MaxBlockKeys keys with probability p.BlockShare; its
// write covers every key of the block and its release names one of them
// (any: that frees the whole block), and a HELD right after the grant and
// right after the release records what the session lists under the
// block's token.
func runWorker(ctx context.Context, p WorkerParams, write writeFunc, emit func(Op)) {
	if p.Extend {
		runExtender(ctx, p, write, emit)
		return
	}
	rng := rand.New(rand.NewSource(p.Seed))
	// The client's reader numbers the places it reports too.
	var seq atomic.Int64
	nextID := func() int64 { return int64(p.ID+1)<<32 | seq.Add(1) }
	now := func() int64 { return time.Now().UnixNano() }
	var c *ticketing.Client
	lastCmp := now()
	defer func() {
		if c != nil {
			c.Close()
			emit(Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindClose, Inv: now(), Cmp: now()})
		}
	}()
	for ctx.Err() == nil {
		if c == nil {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			var err error
			c, err = ticketing.Dial(dctx, p.Socket)
			if err == nil && p.BlockShare > 0 {
				// Blocks need version 2 of the local API (PROTOCOL.md,
				// "Versions"): a sidecar that does not speak it is not used.
				// (The client's own HELLO asks for 4 with events, so that
				// `! QUEUED` tells when an acquire joined its queue.)
				var v int
				if v, err = c.Hello(dctx); err == nil && v < 2 {
					err = fmt.Errorf("verify: the sidecar speaks version %d of the local API, blocks need 2", v)
				}
				if err != nil {
					c.Close()
				}
			}
			cancel()
			if err != nil {
				c = nil
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
		}
		keys := []string{p.Keys[rng.Intn(len(p.Keys))]}
		if n := min(MaxBlockKeys, len(p.Keys)); n >= 2 && rng.Float64() < p.BlockShare {
			n = 2 + rng.Intn(n-1)
			keys = keys[:0]
			for _, i := range rng.Perm(len(p.Keys))[:n] {
				keys = append(keys, p.Keys[i])
			}
		}
		key := keys[0]
		relKey := keys[rng.Intn(len(keys))] // the key the release names
		var block []string
		if len(keys) > 1 {
			block = keys
		}
		lease := minLease + time.Duration(rng.Int63n(int64((maxLease-minLease)/time.Second)+1))*time.Second
		wait := time.Duration(0)
		if rng.Intn(4) != 0 {
			wait = time.Duration(rng.Int63n(int64(maxWait/time.Millisecond)+1)) * time.Millisecond
		}
		hold := p.HoldMin + time.Duration(rng.Int63n(int64(p.HoldMax-p.HoldMin)+1))
		late := rng.Float64() < p.LateProb

		acq := Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindAcquire, Key: key, Keys: block,
			LeaseMs: lease.Milliseconds(), WaitMs: wait.Milliseconds(), Inv: now()}
		var tok uint64
		var err error
		var queuedAt atomic.Int64 // set by the client's reader, before Acquire returns
		onQueued := ticketing.WithQueued(func() { queuedAt.Store(now()) })
		// Places in line (issue 41): the client calls the hook on its
		// reader, only before Acquire returns; each is recorded with the
		// time it ran (no earlier than the event's read), for the checks
		// of checker_position.go.
		acqID := acq.ID
		onPosition := ticketing.WithPosition(func(pos ticketing.Position) {
			est := int64(-1)
			if pos.EstimateKnown {
				est = int64(pos.Estimate / time.Second)
			}
			at := now()
			emit(Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindPosition, Acq: acqID, Key: pos.Key, N: pos.Position, EstSec: est, Inv: at, Cmp: at})
		})
		if block != nil {
			tok, err = acquireBlock(ctx, c, block, lease, wait, onQueued, onPosition)
		} else {
			tok, err = c.Acquire(ctx, key, lease, wait, onQueued, onPosition)
		}
		acq.Cmp = now()
		acq.Queued = queuedAt.Load()
		classifyAcquire(&acq, tok, err)
		emit(acq)
		if errors.Is(err, ticketing.ErrClosed) {
			// The session ended: the sidecar released whatever it held.
			// Dial again after a pause: a stopped sidecar would otherwise
			// be asked again at once, over and over (the client dials
			// lazily, so the next acquire is where its absence shows).
			emit(Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindClose, Inv: lastCmp, Cmp: now()})
			c = nil
			sleepCtx(ctx, 50*time.Millisecond)
			continue
		}
		lastCmp = acq.Cmp
		if acq.Result != ResOK {
			if acq.Result == ResError || acq.Result == ResIndeterminate {
				// unavailable, moved, a sidecar shutting down ...: do not spin
				sleepCtx(ctx, 50*time.Millisecond)
			}
			continue
		}

		// The connection the grant came on: the Client dials again, on
		// the next call, once it is lost, so a sidecar that stopped and
		// started again meanwhile (releasing this session's locks) shows
		// only here.
		granted := c.Done()
		if block != nil {
			emit(observeHeld(c, p, nextID(), acq, "grant"))
		}

		// Holding: work, sometimes past the lease on purpose.
		if late {
			hold = lease + 300*time.Millisecond + time.Duration(rng.Int63n(int64(500*time.Millisecond)))
		}
		sleepCtx(ctx, hold)
		select {
		case <-granted:
			// The session ended while holding: the sidecar released what it
			// held (at any time since the grant, as far as we know).
			emit(Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindClose, Inv: lastCmp, Cmp: now()})
		default:
		}
		if ctx.Err() == nil {
			emit(fencedWrite(write, Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindWrite, Key: key, Keys: block,
				Token: tok, Acq: acq.ID, Late: late}, keys))
		}

		// Release, even after ctx ended (with its own bounded context).
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rel := Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindRelease, Key: relKey, Keys: block, Token: tok, Acq: acq.ID, Inv: now()}
		rerr := c.Release(rctx, relKey, tok)
		cancel()
		rel.Cmp = now()
		classifyRelease(&rel, rerr)
		emit(rel)
		if block != nil && (rel.Result == ResOK || rel.Result == ResError && definiteReleaseError(rel.Err)) {
			// The session forgot the whole block (PROTOCOL.md, "Errors").
			emit(observeHeld(c, p, nextID(), acq, "release"))
		}
		if errors.Is(rerr, ticketing.ErrClosed) {
			emit(Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindClose, Inv: lastCmp, Cmp: now()})
			c = nil
			continue
		}
		lastCmp = rel.Cmp
	}
}

// acquireBlock acquires every key of keys as one block (a version-2
// ACQUIRE of several keys) with the outcomes of Client.Acquire: the token,
// or ErrBusy, ErrTimeout, ErrIndeterminate, an *Error, or the error of the
// connection or of ctx. (If ctx ends while the request is with the
// sidecar, the client releases a late grant.) The worker releases it by
// any of its keys and token (Client.Release), not through the Lock.
func acquireBlock(ctx context.Context, c *ticketing.Client, keys []string, lease, wait time.Duration, opts ...ticketing.AcquireOption) (uint64, error) {
	l, err := c.AcquireBlock(ctx, keys, lease, wait, opts...)
	if err != nil {
		return 0, err
	}
	return l.Token(), nil
}

// observeHeld asks the session what it holds (HELD, answered by the
// sidecar itself) and records the keys it lists under the block acq's
// token: every key of the block right after the grant, none right after
// the release.
func observeHeld(c *ticketing.Client, p WorkerParams, id int64, acq Op, after string) Op {
	op := Op{ID: id, Worker: p.ID, Proc: p.Proc, Kind: KindHeld, Key: acq.Key, Token: acq.Token, Acq: acq.ID, After: after,
		Inv: time.Now().UnixNano()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.Do(ctx, "HELD")
	op.Cmp = time.Now().UnixNano()
	f := strings.Fields(r)
	switch {
	case err != nil:
		op.Result, op.Err = ResError, err.Error()
	case len(f) < 2 || f[0] != "HELD":
		op.Result, op.Err = ResError, fmt.Sprintf("unexpected reply %q", r)
	default:
		op.Result = ResOK
		for _, kt := range f[2:] {
			// Keys may contain ':'; the token follows the last one.
			i := strings.LastIndexByte(kt, ':')
			if i > 0 && kt[i+1:] == strconv.FormatUint(acq.Token, 10) {
				op.Keys = append(op.Keys, kt[:i])
			}
		}
	}
	return op
}

func classifyAcquire(op *Op, tok uint64, err error) {
	var e *ticketing.Error
	switch {
	case err == nil:
		op.Result, op.Token = ResOK, tok
	case errors.Is(err, ticketing.ErrNoSidecar):
		// Nothing was sent: no sidecar answered at the socket (a stopped
		// one, before its restart).
		op.Result, op.Err = ResError, "no_sidecar"
	case errors.Is(err, ticketing.ErrBusy):
		op.Result = ResBusy
	case errors.Is(err, ticketing.ErrTimeout):
		op.Result = ResTimeout
	case errors.Is(err, ticketing.ErrIndeterminate):
		op.Result = ResIndeterminate
	case errors.As(err, &e) && noEffect[e.Code]:
		op.Result, op.Err = ResError, e.Code
	default:
		// The session broke, the context ended, or something unexpected:
		// the acquire may or may not have been granted.
		op.Result, op.Err = ResIndeterminate, err.Error()
	}
}

func classifyRelease(op *Op, err error) {
	var e *ticketing.Error
	switch {
	case err == nil:
		op.Result = ResOK
	case errors.Is(err, ticketing.ErrIndeterminate):
		op.Result = ResIndeterminate
	case errors.As(err, &e) && (noEffect[e.Code] || definiteReleaseError(e.Code)):
		op.Result, op.Err = ResError, e.Code
	default:
		op.Result, op.Err = ResIndeterminate, err.Error()
	}
}

// noEffect lists the sidecar's error codes that say the request was not
// executed at all (unixapi/PROTOCOL.md, "Errors").
var noEffect = map[string]bool{
	"unavailable": true, "moved": true, "no_quorum": true, "too_many_in_flight": true,
	"release_queue_full": true, "release_in_progress": true, "invalid_key": true,
	"invalid_lease": true, "invalid_wait": true, "tokens_exhausted": true, "bad_request": true,
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
