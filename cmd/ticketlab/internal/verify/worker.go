package verify

import (
	"context"
	"errors"
	"math/rand"
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
	// Socket is the sidecar's unix socket.
	Socket string
	// Keys is the small set of contended keys.
	Keys []string
	// HoldMin..HoldMax is how long a holder works before its fenced write.
	HoldMin, HoldMax time.Duration
	// LateProb is the chance that a holder sleeps past its lease before
	// writing (the write must then be fenced off if a newer holder wrote).
	LateProb float64
}

// Workload ranges (issue 4: random lease and wait, hot contention).
const (
	minLease = 1 * time.Second
	maxLease = 3 * time.Second
	maxWait  = 2 * time.Second
)

// writeFunc performs a fenced write: accepted, or rejected by the fencing
// check, or an error (the store was unreachable).
type writeFunc func(key string, token uint64, worker int, op int64) (bool, error)

// runWorker loops acquire → fenced write → (sometimes sleep past the lease)
// → release until ctx ends, reporting every operation to emit.
func runWorker(ctx context.Context, p WorkerParams, write writeFunc, emit func(Op)) {
	rng := rand.New(rand.NewSource(p.Seed))
	seq := int64(0)
	nextID := func() int64 { seq++; return int64(p.ID+1)<<32 | seq }
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
			cancel()
			if err != nil {
				c = nil
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
		}
		key := p.Keys[rng.Intn(len(p.Keys))]
		lease := minLease + time.Duration(rng.Int63n(int64((maxLease-minLease)/time.Second)+1))*time.Second
		wait := time.Duration(0)
		if rng.Intn(4) != 0 {
			wait = time.Duration(rng.Int63n(int64(maxWait/time.Millisecond)+1)) * time.Millisecond
		}
		hold := p.HoldMin + time.Duration(rng.Int63n(int64(p.HoldMax-p.HoldMin)+1))
		late := rng.Float64() < p.LateProb

		acq := Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindAcquire, Key: key,
			LeaseMs: lease.Milliseconds(), WaitMs: wait.Milliseconds(), Inv: now()}
		tok, err := c.Acquire(ctx, key, lease, wait)
		acq.Cmp = now()
		classifyAcquire(&acq, tok, err)
		emit(acq)
		if errors.Is(err, ticketing.ErrClosed) {
			// The session ended: the sidecar released whatever it held.
			emit(Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindClose, Inv: lastCmp, Cmp: now()})
			c = nil
			continue
		}
		lastCmp = acq.Cmp
		if acq.Result != ResOK {
			if acq.Result == ResError {
				sleepCtx(ctx, 50*time.Millisecond) // unavailable, moved, ...: do not spin
			}
			continue
		}

		// Holding: work, sometimes past the lease on purpose.
		if late {
			hold = lease + 300*time.Millisecond + time.Duration(rng.Int63n(int64(500*time.Millisecond)))
		}
		sleepCtx(ctx, hold)
		if ctx.Err() == nil {
			w := Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindWrite, Key: key, Token: tok, Acq: acq.ID,
				Late: late, Inv: now()}
			ok, werr := write(key, tok, p.ID, w.ID)
			w.Cmp = now()
			switch {
			case werr != nil:
				w.Result, w.Err = ResError, werr.Error()
			case ok:
				w.Result = ResOK
			default:
				w.Result = ResRejected
			}
			emit(w)
		}

		// Release, even after ctx ended (with its own bounded context).
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rel := Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindRelease, Key: key, Token: tok, Acq: acq.ID, Inv: now()}
		rerr := c.Release(rctx, key, tok)
		cancel()
		rel.Cmp = now()
		classifyRelease(&rel, rerr)
		emit(rel)
		if errors.Is(rerr, ticketing.ErrClosed) {
			emit(Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Kind: KindClose, Inv: lastCmp, Cmp: now()})
			c = nil
			continue
		}
		lastCmp = rel.Cmp
	}
}

func classifyAcquire(op *Op, tok uint64, err error) {
	var e *ticketing.Error
	switch {
	case err == nil:
		op.Result, op.Token = ResOK, tok
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
