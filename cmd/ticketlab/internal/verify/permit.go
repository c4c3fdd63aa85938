package verify

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync/atomic"

	"ticketing/unixapi"
	"time"
)

// Semaphores (issue 41): permit workers beside the lock workers.
//
// The Go client has no permit methods yet, so the permit workers speak the
// unix protocol's lines themselves (lineConn; unixapi/PROTOCOL.md,
// "Semaphores: PERMIT and PERMITS"): `PERMITS <key> <n>` defines or resizes
// a semaphore, `PERMIT <key> <lease> <wait>` answers `OK <token> <slot>`,
// and RELEASE/EXTEND work by token as for locks. Their operations get kinds
// of their own (below), so that none of the lock checks reads them; the
// permit checks (checker_permit.go) do, and the token checks of Check read
// permit grants beside the lock grants (one cluster counter).
const (
	KindPermit        = "permit"         // a PERMIT: Key, LeaseMs, WaitMs; Token and Slot when OK
	KindPermitWrite   = "permit-write"   // a fenced write of the resource "<key> <slot>" under Token
	KindPermitRelease = "permit-release" // a RELEASE of a permit (Acq, Token)
	KindPermitExtend  = "permit-extend"  // an EXTEND of a permit (Acq, Token, LeaseMs: the new lease)
	KindPermits       = "permits"        // a PERMITS <key> <n> of the controller (N)
	KindPermitLost    = "permit-lost"    // a `! LOST` event of a permit's token read (Token, Reason; Inv = Cmp = when)
)

// PermitParams configures one permit worker.
type PermitParams struct {
	ID      int
	Seed    int64
	Socket  string
	Sidecar int
	// Keys are the semaphore keys.
	Keys []string
	// HoldMin..HoldMax is how long a holder works before its fenced write;
	// LateProb the chance it sleeps past its lease instead (the write must
	// then be fenced off if a newer holder of its slot wrote), ExtendProb
	// the chance it extends its lease once before writing.
	HoldMin, HoldMax     time.Duration
	LateProb, ExtendProb float64
}

// permitResource is the fencing domain of a permit: (key, slot), named as
// the protocol document and the clients fence it, "<key> <slot>" (a space:
// no key holds one, so no lock key names it; ticketing.PermitFenceKey).
func permitResource(key string, slot int) string { return key + " " + strconv.Itoa(slot) }

// runPermitWorker loops PERMIT → (sometimes EXTEND) → fenced write of
// "<key> <slot>" → RELEASE until ctx ends, as runWorker does for locks.
func runPermitWorker(ctx context.Context, p PermitParams, write writeFunc, emit func(Op)) {
	rng := rand.New(rand.NewSource(p.Seed))
	// The reader goroutine numbers the LOST events it records too.
	var seq atomic.Int64
	nextID := func() int64 { return int64(p.ID+1)<<32 | seq.Add(1) }
	now := func() int64 { return time.Now().UnixNano() }
	var lc *lineConn
	conn := 0
	lastCmp := now()
	closed := func() {
		emit(Op{ID: nextID(), Worker: p.ID, Kind: KindClose, Inv: lastCmp, Cmp: now(), Conn: conn})
		lc.close()
		lc = nil
	}
	defer func() {
		if lc != nil {
			closed()
		}
	}()
	for ctx.Err() == nil {
		if lc == nil {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			var err error
			// `! LOST` events are recorded (counted in the summary; the
			// holding's end is already bounded by its lease).
			// (The reader goroutine gets its own copy of the session's
			// number: conn changes under it on the next dial.)
			cn := conn + 1
			lc, err = dialLine(dctx, p.Socket, func(ev unixapi.Event, at int64) {
				op := Op{ID: nextID(), Worker: p.ID, Kind: KindPermitLost, Token: ev.Token, Reason: ev.Reason, Inv: at, Cmp: at, Conn: cn}
				if len(ev.Keys) > 0 {
					op.Key = ev.Keys[0]
				}
				emit(op)
			})
			cancel()
			if err != nil {
				lc = nil
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			// Places in line (issue 41): recorded for the checks of
			// checker_position.go.
			lc.positions(func(acq int64, ev unixapi.Event, at int64, after bool) {
				op := positionOp(acq, ev, at, after)
				op.ID, op.Worker, op.Conn = nextID(), p.ID, cn
				emit(op)
			})
			conn++
			lastCmp = now()
		}
		key := p.Keys[rng.Intn(len(p.Keys))]
		lease := minLease + time.Duration(rng.Int63n(int64((maxLease-minLease)/time.Second)+1))*time.Second
		wait := time.Duration(0)
		if rng.Intn(4) != 0 {
			wait = time.Duration(rng.Int63n(int64(maxWait/time.Millisecond)+1)) * time.Millisecond
		}
		hold := p.HoldMin + time.Duration(rng.Int63n(int64(p.HoldMax-p.HoldMin)+1))
		late := rng.Float64() < p.LateProb
		extend := !late && rng.Float64() < p.ExtendProb

		acq := Op{ID: nextID(), Worker: p.ID, Kind: KindPermit, Key: key, LeaseMs: lease.Milliseconds(), WaitMs: wait.Milliseconds(), Conn: conn, Proto: lc.agreed()}
		r, sent, got, queued, err := lc.doAcquire(ctx, fmt.Sprintf("PERMIT %s %d %s", key, int(lease.Seconds()), waitSeconds(wait)), acq.ID, nil)
		acq.Inv, acq.Cmp, acq.Queued = sent, got, queued
		classifyPermit(&acq, r, err)
		emit(acq)
		if errors.Is(err, errLineClosed) {
			closed()
			sleepCtx(ctx, 50*time.Millisecond)
			continue
		}
		lastCmp = acq.Cmp
		if acq.Result != ResOK {
			if acq.Result == ResError || acq.Result == ResIndeterminate {
				sleepCtx(ctx, 50*time.Millisecond)
			}
			continue
		}
		if late {
			hold = lease + 300*time.Millisecond + time.Duration(rng.Int63n(int64(500*time.Millisecond)))
		}
		if extend {
			// Work half the hold, renew the lease, work the other half.
			sleepCtx(ctx, hold/2)
			ext := Op{ID: nextID(), Worker: p.ID, Kind: KindPermitExtend, Key: key, Token: acq.Token, Slot: acq.Slot, Acq: acq.ID, LeaseMs: lease.Milliseconds(), Conn: conn}
			ectx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			r, sent, got, err := lc.do(ectx, fmt.Sprintf("EXTEND %s %d %d", key, acq.Token, int(lease.Seconds())))
			cancel()
			ext.Inv, ext.Cmp = sent, got
			classifyPlain(&ext, r, err)
			emit(ext)
			if errors.Is(err, errLineClosed) {
				closed()
				continue
			}
			hold -= hold / 2
		}
		sleepCtx(ctx, hold)
		if ctx.Err() == nil {
			emit(fencedWrite(write, Op{ID: nextID(), Worker: p.ID, Kind: KindPermitWrite, Key: key, Token: acq.Token, Slot: acq.Slot,
				Acq: acq.ID, Late: late, Conn: conn}, []string{permitResource(key, acq.Slot)}))
		}
		rel := Op{ID: nextID(), Worker: p.ID, Kind: KindPermitRelease, Key: key, Token: acq.Token, Slot: acq.Slot, Acq: acq.ID, Conn: conn}
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, sent, got, err = lc.do(rctx, fmt.Sprintf("RELEASE %s %d", key, acq.Token))
		cancel()
		rel.Inv, rel.Cmp = sent, got
		classifyPlain(&rel, r, err)
		emit(rel)
		if errors.Is(err, errLineClosed) {
			closed()
			continue
		}
		lastCmp = rel.Cmp
	}
}

// classifyPermit files a PERMIT's reply: OK <token> <slot>, BUSY, TIMEOUT,
// INDETERMINATE, ERR <code> (definite when noEffect says so), or no reply
// (the session broke: the outcome is unknown).
func classifyPermit(op *Op, r string, err error) {
	f := strings.Fields(r)
	switch {
	case err != nil:
		op.Result, op.Err = ResIndeterminate, err.Error()
	case len(f) == 3 && f[0] == "OK":
		tok, err1 := strconv.ParseUint(f[1], 10, 64)
		slot, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			op.Result, op.Err = ResIndeterminate, "bad reply "+r
			return
		}
		op.Result, op.Token, op.Slot = ResOK, tok, slot
	case len(f) > 0 && f[0] == "BUSY":
		op.Result = ResBusy
	case len(f) > 0 && f[0] == "TIMEOUT":
		op.Result = ResTimeout
	case len(f) > 0 && f[0] == "INDETERMINATE":
		op.Result = ResIndeterminate
	case len(f) >= 2 && f[0] == "ERR" && (noEffect[f[1]] || f[1] == "not_semaphore"):
		op.Result, op.Err = ResError, f[1]
	default:
		op.Result, op.Err = ResIndeterminate, "reply "+r
	}
}

// classifyPlain files an OK / INDETERMINATE / ERR reply (RELEASE, EXTEND,
// PERMITS).
func classifyPlain(op *Op, r string, err error) {
	f := strings.Fields(r)
	switch {
	case err != nil:
		op.Result, op.Err = ResIndeterminate, err.Error()
	case len(f) > 0 && f[0] == "OK":
		op.Result = ResOK
	case len(f) >= 2 && f[0] == "ERR":
		op.Result, op.Err = ResError, f[1]
	default:
		op.Result, op.Err = ResIndeterminate, "reply "+r
	}
}

// permitsSeq numbers the PERMITS ops of a run (their ids, under the
// controller's worker id).
var permitsSeq atomic.Int64

// setPermits sends PERMITS key n on its own session until it is answered
// definitely (PERMITS is exact and idempotent: after INDETERMINATE send it
// again), recording every attempt. It gives up when ctx ends.
func setPermits(ctx context.Context, socket string, id int, key string, n int, emit func(Op)) bool {
	for ctx.Err() == nil {
		op := Op{ID: int64(id+1)<<32 | permitsSeq.Add(1), Worker: id, Kind: KindPermits, Key: key, N: n}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lc, err := dialLine(dctx, socket, nil)
		if err == nil {
			var r string
			r, op.Inv, op.Cmp, err = lc.do(dctx, fmt.Sprintf("PERMITS %s %d", key, n))
			classifyPlain(&op, r, err)
			lc.close()
			cancel()
			emit(op)
			if op.Result == ResOK {
				return true
			}
			if op.Result == ResError && !noEffect[op.Err] {
				return false // a definite refusal: nothing changed
			}
		} else {
			cancel()
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
	return false
}

// waitSeconds writes a wait as the protocol's <wait-seconds>: whole
// seconds and milliseconds (DIGITS.DDD).
func waitSeconds(d time.Duration) string {
	ms := d.Milliseconds()
	return fmt.Sprintf("%d.%03d", ms/1000, ms%1000)
}
