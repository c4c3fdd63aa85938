package verify

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"ticketing/unixapi"
)

// Extending holders (issue 19). An extender is a worker that holds across
// several leases: after its grant it EXTENDs, each time before the local
// validity deadline of the lease it counts on (send time of the ACQUIRE or
// of the last successful EXTEND + lease − margin, the official clients'
// rule), then writes under its token and releases. Some holdings stall
// instead: the holder goroutine stops past its lease without extending (in
// a worker process the nemesis also stops the whole process, SIGSTOP past
// the lease, then SIGCONT); when it resumes it must notice the loss — the
// `! LOST <token> expired` event, or an EXTEND refused by the cluster
// (`! LOST <token> moved` before the refusal) — and then writes (late, on
// purpose: the fence must refuse it if a newer holder wrote) and releases.
//
// The extender speaks the local API itself (lineConn: `HELLO 7 events`,
// `ACQUIRE`, `EXTEND`, `RELEASE`) and records, besides what every worker
// records, each EXTEND (send, reply, lease, outcome), each loss event
// received (reason, receive time) and each stall.

// extendMargin is how much before send time + lease a holder stops
// counting on its lock: 250 ms + 1 % of the lease, as the official
// clients (clients/README.md).
func extendMargin(lease time.Duration) time.Duration {
	return 250*time.Millisecond + lease/100
}

// runExtender is runWorker for an extender (p.Extend).
func runExtender(ctx context.Context, p WorkerParams, write writeFunc, emitOp func(Op)) {
	var emu sync.Mutex // the reader goroutine emits events too
	emit := func(op Op) {
		emu.Lock()
		emitOp(op)
		emu.Unlock()
	}
	rng := rand.New(rand.NewSource(p.Seed))
	var seq atomic.Int64
	nextID := func() int64 { return int64(p.ID+1)<<32 | seq.Add(1) }
	now := func() int64 { return time.Now().UnixNano() }

	var lostMu sync.Mutex
	lost := map[uint64]string{} // tokens this session was told it lost, with the reason
	isLost := func(tok uint64) bool {
		lostMu.Lock()
		defer lostMu.Unlock()
		_, ok := lost[tok]
		return ok
	}
	var lc *lineConn
	conn := 0
	lastCmp := now()
	closeSession := func(inv int64) {
		lc.close()
		lc = nil
		emit(Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Conn: conn, Kind: KindClose, Inv: inv, Cmp: now()})
	}
	defer func() {
		if lc != nil {
			closeSession(now())
		}
	}()
	for ctx.Err() == nil {
		if lc == nil {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			cn := conn + 1
			c, err := dialLine(dctx, p.Socket, func(ev unixapi.Event, at int64) {
				lostMu.Lock()
				lost[ev.Token] = ev.Reason
				lostMu.Unlock()
				op := Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Conn: cn, Kind: KindLost, Key: ev.Keys[0], Token: ev.Token,
					Reason: ev.Reason, Inv: at, Cmp: at}
				if len(ev.Keys) > 1 {
					op.Keys = ev.Keys
				}
				emit(op)
			})
			cancel()
			if err != nil {
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			// Places in line (issue 41): recorded for the checks of
			// checker_position.go.
			c.positions(func(acq int64, ev unixapi.Event, at int64, after bool) {
				op := positionOp(acq, ev, at, after)
				op.ID, op.Worker, op.Proc, op.Conn = nextID(), p.ID, p.Proc, cn
				emit(op)
			})
			lc, conn = c, conn+1
		}
		keys := []string{p.Keys[rng.Intn(len(p.Keys))]}
		if n := min(MaxBlockKeys, len(p.Keys)); n >= 2 && rng.Float64() < p.BlockShare {
			n = 2 + rng.Intn(n-1)
			keys = keys[:0]
			for _, i := range rng.Perm(len(p.Keys))[:n] {
				keys = append(keys, p.Keys[i])
			}
		}
		var block []string
		if len(keys) > 1 {
			block = keys
		}
		relKey := keys[rng.Intn(len(keys))] // the key EXTEND and RELEASE name
		lease := minLease + time.Duration(rng.Int63n(int64((maxLease-minLease)/time.Second)+1))*time.Second
		wait := time.Duration(0)
		if rng.Intn(4) != 0 {
			wait = time.Duration(rng.Int63n(int64(maxWait/time.Millisecond)+1)) * time.Millisecond
		}
		rounds := 1 + rng.Intn(3) // EXTENDs of a holding that does not stall
		stall := rng.Float64() < p.StallProb
		if stall {
			rounds = rng.Intn(2) // a stalled holder may have extended before it stalls
		}

		ms := wait.Milliseconds()
		acq := Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Conn: conn, Kind: KindAcquire, Key: keys[0], Keys: block,
			LeaseMs: lease.Milliseconds(), WaitMs: ms, Proto: lc.agreed()}
		r, sent, got, queued, err := lc.doAcquire(ctx, fmt.Sprintf("ACQUIRE %s %d %d.%03d", strings.Join(keys, " "), lease/time.Second, ms/1000, ms%1000), acq.ID, nil)
		acq.Inv, acq.Cmp, acq.Queued = sent, got, queued
		classifyAcquireLine(&acq, r, err)
		emit(acq)
		if errors.Is(err, errLineClosed) {
			closeSession(lastCmp)
			continue
		}
		lastCmp = acq.Cmp
		if acq.Result != ResOK {
			if acq.Result == ResError || acq.Result == ResIndeterminate {
				sleepCtx(ctx, 50*time.Millisecond)
			}
			continue
		}
		tok := acq.Token
		// The local validity deadline counts from the send; the leader's
		// lease from its apply, which the reply follows (leaseFrom: when the
		// lease surely started, for a stall that must outlast it).
		deadline := acq.Inv + int64(lease-extendMargin(lease))
		leaseFrom := acq.Cmp
		gone := false // the holder knows it lost the lock

		extend := func() {
			e := Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Conn: conn, Kind: KindExtend, Key: relKey, Keys: block, Token: tok,
				Acq: acq.ID, LeaseMs: lease.Milliseconds()}
			// Bounded on its own: the sidecar answers within its 5-second
			// deadline; the run's end must not leave it unanswered.
			ectx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			r, sent, got, err := lc.do(ectx, fmt.Sprintf("EXTEND %s %d %d", relKey, tok, lease/time.Second))
			cancel()
			e.Inv, e.Cmp = sent, got
			classifyExtendLine(&e, r, err)
			emit(e)
			switch {
			case e.Result == ResOK:
				deadline, leaseFrom = e.Inv+int64(lease-extendMargin(lease)), e.Cmp
			case e.Result == ResIndeterminate:
				leaseFrom = e.Cmp // it may have renewed the lease
			case e.Result == ResError && definiteReleaseError(e.Err):
				gone = true
			}
		}
		for i := 0; i < rounds && !gone && lc != nil; i++ {
			// EXTEND at a random point of what is left of the validity:
			// well before the deadline, but late enough that a holding
			// spans several leases. (A grant after a long wait may come
			// with its validity, counted from the send, nearly gone: then
			// at once.)
			if left := time.Duration(deadline - now()); left > 50*time.Millisecond {
				sleepCtx(ctx, time.Duration(float64(left)*(0.3+0.5*rng.Float64())))
			}
			if ctx.Err() != nil {
				break
			}
			if isLost(tok) {
				gone = true
				break
			}
			extend()
			if isClosed(lc) {
				break
			}
		}
		late := false
		if stall && !gone {
			// Stall past the whole lease (from the reply that renewed it
			// last, which follows the leader's apply), then resume and find
			// out.
			st := Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Conn: conn, Kind: KindStall, Key: keys[0], Keys: block, Token: tok, Acq: acq.ID, Inv: now()}
			until := leaseFrom + int64(lease) + int64(300*time.Millisecond) + rng.Int63n(int64(900*time.Millisecond))
			sleepCtx(ctx, time.Duration(until-now()))
			st.Cmp = now()
			emit(st)
			late = true
			if !isLost(tok) && ctx.Err() == nil {
				extend() // refused (the lease ran out), or OK if a new leader re-armed it
			}
			gone = gone || isLost(tok)
		} else if !gone {
			hold := time.Duration(rng.Int63n(int64(150 * time.Millisecond)))
			if left := time.Duration(deadline - now()); hold > left {
				hold = max(left, 0)
			}
			sleepCtx(ctx, hold)
		}
		late = late || now() > deadline || gone || isLost(tok)
		if ctx.Err() == nil && isOpen(lc) {
			emit(fencedWrite(write, Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Conn: conn, Kind: KindWrite, Key: keys[0], Keys: block,
				Token: tok, Acq: acq.ID, Late: late}, keys))
		}
		// Release, even after ctx ended (bounded by its own context). A
		// lock the session was told it lost answers not_held at once.
		rel := Op{ID: nextID(), Worker: p.ID, Proc: p.Proc, Conn: conn, Kind: KindRelease, Key: relKey, Keys: block, Token: tok, Acq: acq.ID}
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, sent, got, err = lc.do(rctx, fmt.Sprintf("RELEASE %s %d", relKey, tok))
		cancel()
		rel.Inv, rel.Cmp = sent, got
		classifyReleaseLine(&rel, r, err)
		emit(rel)
		if errors.Is(err, errLineClosed) {
			closeSession(lastCmp)
			continue
		}
		lastCmp = rel.Cmp
	}
}

// isClosed reports whether the session's reader has stopped.
func isClosed(lc *lineConn) bool {
	select {
	case <-lc.done:
		return true
	default:
		return false
	}
}

func isOpen(lc *lineConn) bool { return lc != nil && !isClosed(lc) }

// classifyAcquireLine sets an acquire's outcome from its reply line (or
// the session's end).
func classifyAcquireLine(op *Op, r string, err error) {
	switch {
	case err != nil:
		op.Result, op.Err = ResIndeterminate, err.Error()
	case r == "BUSY":
		op.Result = ResBusy
	case r == "TIMEOUT":
		op.Result = ResTimeout
	case r == "INDETERMINATE":
		op.Result = ResIndeterminate
	case strings.HasPrefix(r, "OK "):
		t, perr := strconv.ParseUint(r[3:], 10, 64)
		if perr != nil || t == 0 {
			op.Result, op.Err = ResIndeterminate, "unexpected reply "+strconv.Quote(r)
			return
		}
		op.Result, op.Token = ResOK, t
	default:
		if code, ok := errCode(r); ok && noEffect[code] {
			op.Result, op.Err = ResError, code
			return
		}
		op.Result, op.Err = ResIndeterminate, "unexpected reply "+strconv.Quote(r)
	}
}

// classifyReleaseLine sets a release's outcome from its reply line.
func classifyReleaseLine(op *Op, r string, err error) {
	classifyOKLine(op, r, err, func(code string) bool { return noEffect[code] || definiteReleaseError(code) })
}

// classifyExtendLine sets an extend's outcome from its reply line: OK,
// INDETERMINATE (the lease may or may not have been renewed), a definite
// refusal (the lock is gone: not_held, token_mismatch, owner_mismatch) or
// a definite error that renewed nothing.
func classifyExtendLine(op *Op, r string, err error) {
	classifyOKLine(op, r, err, func(code string) bool {
		return noEffect[code] || definiteReleaseError(code) || code == "extend_in_progress" || code == "not_supported"
	})
}

// classifyOKLine sets the outcome of a request answered OK on success:
// OK, INDETERMINATE, an ERR whose code definite says is definite, or
// (anything else, or the session's end) indeterminate.
func classifyOKLine(op *Op, r string, err error, definite func(code string) bool) {
	switch {
	case err != nil:
		op.Result, op.Err = ResIndeterminate, err.Error()
	case r == "OK":
		op.Result = ResOK
	case r == "INDETERMINATE":
		op.Result = ResIndeterminate
	default:
		if code, ok := errCode(r); ok && definite(code) {
			op.Result, op.Err = ResError, code
			return
		}
		op.Result, op.Err = ResIndeterminate, "unexpected reply "+strconv.Quote(r)
	}
}

// errCode is the code of an `ERR <code> <message>` reply.
func errCode(r string) (string, bool) {
	rest, ok := strings.CutPrefix(r, "ERR ")
	if !ok {
		return "", false
	}
	code, _, _ := strings.Cut(rest, " ")
	return code, code != ""
}
