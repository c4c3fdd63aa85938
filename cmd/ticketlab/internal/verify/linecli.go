package verify

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"ticketing/unixapi"
)

// lineConn is a raw unix-socket session with the sidecar that speaks
// version 7 of the local API with events on (`HELLO 7 events`; an older
// sidecar answers the highest version it speaks: `HELLO 4 events` gives no
// `! POSITION`, `HELLO 3 events` no `! QUEUED` either, and the version
// agreed is recorded with every acquire, Op.Proto): one request at a
// time, every reply matched by position after the `! ` event lines are set
// aside (unixapi/PROTOCOL.md, "Events"). It is the lab's
// own, so that the verification of EXTEND, of the lost signal and of the
// queue order depends on the protocol document alone, not on a client
// library.
//
// Every line is stamped with the machine's wall clock by the one goroutine
// that reads the connection, the moment it is read: a reply's and an
// event's times are therefore in the connection's line order, which the
// checker relies on (an event before a reply on the wire is earlier in the
// history too).
type lineConn struct {
	c       net.Conn
	onEvent func(ev unixapi.Event, at int64)

	mu      sync.Mutex // serializes requests
	replies chan lineReply
	done    chan struct{} // closed when the reader stops
	err     error         // why the reader stopped (valid after done)
	// version is what HELLO agreed: 7 (POSITION events), 4..6 (QUEUED
	// events) or 3.
	version int

	// The request being answered, for its `! QUEUED <n>` event: lines
	// counts the request lines written (HELLO is 1; every line gets one
	// reply, so a QUEUED event names its ACQUIRE by that count).
	qmu      sync.Mutex
	lines    uint64
	pendingN uint64
	queuedAt int64
	onQueued func(at int64)
	// Issue 41: every `! POSITION <n> ...` read goes to onPosition with
	// the op id the caller gave the n-th request (ids; 0: no acquire of
	// this connection is that request) and whether that request was
	// already answered (after: the event came after its reply, which the
	// protocol forbids). Set with positions, before the first acquire.
	ids        map[uint64]int64
	pendingID  int64
	onPosition func(acq int64, ev unixapi.Event, at int64, after bool)
}

// lineReply is one reply line and when it was read (Unix ns).
type lineReply struct {
	line string
	at   int64
}

// errLineClosed: the session ended (the sidecar closed it, or it broke);
// the sidecar then releases what it held.
var errLineClosed = errors.New("verify: sidecar session closed")

// lineVersion is the version lineConn asks for: 7, the `! POSITION` event
// (issue 41). Nothing it sends reads differently in versions 5 to 7 (it
// sends no labels; its waits are far below 300 s), and it parses LOST
// with the label version 5 put before the keys.
const lineVersion = 7

// lineVersionPositions is the first version with `! POSITION`.
const lineVersionPositions = 7

// dialLine opens a session on the sidecar socket path and turns events
// on. onEvent is called from the reader goroutine for every LOST event, in
// line order with the replies.
func dialLine(ctx context.Context, path string, onEvent func(ev unixapi.Event, at int64)) (*lineConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	lc := &lineConn{c: c, onEvent: onEvent, replies: make(chan lineReply, 4), done: make(chan struct{})}
	go lc.read()
	r, _, _, err := lc.do(ctx, fmt.Sprintf("HELLO %d %s", lineVersion, unixapi.HelloEvents))
	f := strings.Fields(r)
	v := 0
	if len(f) == 3 && f[0] == "HELLO" && f[2] == unixapi.HelloEvents {
		v, _ = strconv.Atoi(f[1])
	}
	switch {
	case err != nil:
	case v >= 3 && v <= lineVersion:
		// An older sidecar agrees the highest version it speaks: 4..6
		// give QUEUED but no POSITION, 3 neither (LOST events only).
		lc.qmu.Lock()
		lc.version = v
		lc.qmu.Unlock()
	default:
		err = fmt.Errorf("verify: HELLO %d events answered %q", lineVersion, r)
	}
	if err != nil {
		lc.close()
		return nil, err
	}
	return lc, nil
}

func (lc *lineConn) read() {
	defer close(lc.done)
	br := bufio.NewReaderSize(lc.c, 8192)
	for {
		line, err := br.ReadString('\n')
		at := time.Now().UnixNano()
		if err != nil {
			lc.err = err
			return
		}
		line = strings.TrimSuffix(line, "\n")
		if unixapi.IsEvent([]byte(line)) {
			lc.qmu.Lock()
			v := lc.version
			lc.qmu.Unlock()
			ev, err := unixapi.ParseEventVersion([]byte(line), uint16(max(v, 3)))
			if err != nil {
				lc.err = fmt.Errorf("verify: bad event line %q: %w", line, err)
				lc.c.Close()
				return
			}
			switch {
			case ev.Name == unixapi.EventLost && lc.onEvent != nil:
				lc.onEvent(ev, at)
			case ev.Name == unixapi.EventQueued:
				lc.queued(ev.N, at)
			case ev.Name == unixapi.EventPosition:
				lc.position(ev, at)
			}
			continue
		}
		// The reply answers the one request pending: an event about it
		// read from now on came after its reply (lineConn.position).
		lc.qmu.Lock()
		lc.pendingN, lc.pendingID = 0, 0
		lc.qmu.Unlock()
		select {
		case lc.replies <- lineReply{line, at}:
		default:
			// More replies than requests: the sidecar broke the protocol.
			lc.err = fmt.Errorf("verify: unsolicited reply line %q", line)
			lc.c.Close()
			return
		}
	}
}

// queued records the `! QUEUED n` event read at at, if it names the
// request being answered (at most once: the sidecar writes one).
func (lc *lineConn) queued(n uint64, at int64) {
	lc.qmu.Lock()
	defer lc.qmu.Unlock()
	if n != lc.pendingN || lc.queuedAt != 0 {
		return
	}
	lc.queuedAt = at
	if lc.onQueued != nil {
		lc.onQueued(at)
	}
}

// positions turns the recording of `! POSITION` events on: fn gets each
// (see lineConn.onPosition), from the reader goroutine.
func (lc *lineConn) positions(fn func(acq int64, ev unixapi.Event, at int64, after bool)) {
	lc.qmu.Lock()
	defer lc.qmu.Unlock()
	lc.onPosition = fn
}

// agreed is the version HELLO agreed.
func (lc *lineConn) agreed() int {
	lc.qmu.Lock()
	defer lc.qmu.Unlock()
	return lc.version
}

// position hands the `! POSITION` event read at at to onPosition, with the
// op id of the request it names.
func (lc *lineConn) position(ev unixapi.Event, at int64) {
	lc.qmu.Lock()
	defer lc.qmu.Unlock()
	if lc.onPosition == nil {
		return
	}
	id, after := lc.ids[ev.N], ev.N != lc.pendingN
	if !after {
		id = lc.pendingID
	}
	lc.onPosition(id, ev, at, after)
}

// do sends one request line and returns its reply, when the request was
// sent (just before the write) and when the reply was read (Unix ns). If
// ctx ends first the session is closed (the reply could no longer be
// matched): errLineClosed wraps the outcome, which is unknown.
func (lc *lineConn) do(ctx context.Context, req string) (reply string, sent, got int64, err error) {
	reply, sent, got, _, err = lc.doAcquire(ctx, req, 0, nil)
	return reply, sent, got, err
}

// doAcquire is do for an ACQUIRE (or PERMIT) whose op has id id (0: its
// `! POSITION` events are not recorded): it also returns when the
// request's `! QUEUED` event was read (0: none came before the reply), and
// calls onQueued (if not nil) from the reader as it is read, before the
// reply.
func (lc *lineConn) doAcquire(ctx context.Context, req string, id int64, onQueued func(at int64)) (reply string, sent, got, queued int64, err error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.qmu.Lock()
	lc.lines++
	lc.pendingN, lc.pendingID, lc.queuedAt, lc.onQueued = lc.lines, id, 0, onQueued
	if id != 0 && lc.onPosition != nil {
		if lc.ids == nil {
			lc.ids = map[uint64]int64{}
		}
		lc.ids[lc.lines] = id // for an event that comes after the reply
	}
	lc.qmu.Unlock()
	defer func() {
		// The event comes before the reply on the wire, and the one reader
		// handles lines in order: once the reply is here, so is the event.
		lc.qmu.Lock()
		queued = lc.queuedAt
		lc.pendingN, lc.pendingID, lc.onQueued = 0, 0, nil
		lc.qmu.Unlock()
	}()
	reply, sent, got, err = lc.roundTrip(ctx, req)
	return reply, sent, got, 0, err
}

// roundTrip writes req and waits for its reply (lc.mu held).
func (lc *lineConn) roundTrip(ctx context.Context, req string) (reply string, sent, got int64, err error) {
	sent = time.Now().UnixNano()
	if _, err := lc.c.Write([]byte(req + "\n")); err != nil {
		lc.c.Close()
		return "", sent, time.Now().UnixNano(), fmt.Errorf("%w: %v", errLineClosed, err)
	}
	select {
	case r := <-lc.replies:
		return r.line, sent, r.at, nil
	case <-lc.done:
		// A reply read just before the end still counts.
		select {
		case r := <-lc.replies:
			return r.line, sent, r.at, nil
		default:
		}
		return "", sent, time.Now().UnixNano(), fmt.Errorf("%w: %v", errLineClosed, lc.err)
	case <-ctx.Done():
		lc.c.Close()
		return "", sent, time.Now().UnixNano(), fmt.Errorf("%w: %v", errLineClosed, ctx.Err())
	}
}

// close ends the session (the sidecar releases what it still holds) and
// waits for the reader.
func (lc *lineConn) close() {
	lc.c.Close()
	<-lc.done
}

// positionOp records the `! POSITION` event ev read at at for the request
// whose op id is acq (after: read after that request's reply); the caller
// sets its id, worker and session.
func positionOp(acq int64, ev unixapi.Event, at int64, after bool) Op {
	op := Op{Kind: KindPosition, Acq: acq, N: int(min(ev.Position, 1<<31)), EstSec: ev.EstimateSec, Inv: at, Cmp: at}
	if len(ev.Keys) > 0 {
		op.Key = ev.Keys[0]
	}
	if after {
		op.After = "reply"
	}
	return op
}
