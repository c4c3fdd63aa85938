package unixapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"ticketing/locksm"
	"ticketing/sidecar"
)

// A session is one connection: a reader that parses and dispatches requests,
// a writer that answers them in request order, and the locks the connection
// holds. Requests wait without a goroutine: an ACQUIRE is the broker's
// asynchronous acquire (sidecar.Broker.AcquireAsync) and a RELEASE its
// asynchronous release, whose callbacks finish the reply.
type session struct {
	srv   *Server
	id    uint64
	owner string
	conn  *net.UnixConn
	log   *slog.Logger

	// ctx is cancelled when the session ends. Its cause is ErrServerClosed
	// when the server ends the session (Close), so pending ACQUIREs are
	// answered shutting_down, as the protocol says.
	ctx    context.Context
	cancel context.CancelCauseFunc

	writerDone chan struct{}
	wake       chan struct{} // wakes the writer; capacity 1

	// nreq counts the request lines read (every line gets one reply):
	// an ACQUIRE's position, which its QUEUED event names. The reader's
	// alone: no lock.
	nreq uint64

	// refusals is the RefusalRate bucket (refusals left, negative when in
	// debt) as of refusalAt. The reader's alone: no lock.
	refusals  float64
	refusalAt time.Time

	// mu guards everything below. A leaf: never held together with
	// Server.mu, nor while calling the Broker or doing socket I/O. The
	// reader waits on space (a sync.Cond on mu) for room in the reply
	// queue.
	mu sync.Mutex
	// held files every lock under each of its keys: a block's one
	// holding under every key of it (HELD lists them all; a RELEASE of
	// any of them releases the block).
	held map[heldKey]*holding
	// acquiring counts wait-0 ACQUIREs running (bounded by MaxInFlight),
	// waiting those with a wait (bounded by MaxWaiting), releasing the
	// RELEASEs running (bounded by the locks held).
	acquiring, waiting, releasing int
	// events: the latest HELLO turned event lines on (version 3); queued:
	// it agreed version 4 or later too, so QUEUED lines are written. evq
	// holds the event lines not yet written (the writer writes them
	// before the next reply line, never inside one).
	events bool
	queued bool
	// positions: it agreed version 7 or later with events, so POSITION
	// lines are written; revokes: version 9 or later with events, so a
	// revoked lock's LOST line follows a REVOKED line.
	positions, revokes bool
	// version is the version the latest HELLO agreed (0 before any): from
	// VersionLabels on, ACQUIRE takes a label and HELD and LOST show
	// labels. Written by the reader under mu; the reader reads it alone.
	version uint16
	evq     []string
	// evGen counts the times the writer took evq: an index into evq
	// remembered under an older generation points at nothing.
	evGen uint64
	pend  map[*acq]struct{} // ACQUIREs running, to cancel at the end
	ended bool              // end ran: held locks were handed to Compensate
	work  sync.WaitGroup

	// evQueued counts the event lines ever queued (evq), evWritten those
	// the writer has written (a Write that returned without error);
	// flushed is closed, and replaced, whenever evWritten grows, and when
	// a write fails (writeFailed: the peer is gone). endCause waits on
	// them (bounded) before it releases the locks it tells lost.
	evQueued, evWritten uint64
	flushed             chan struct{}
	writeFailed         bool

	// replies holds one entry per request, in request order, from
	// replies[rhead] on (a queue that grows as needed and is never
	// preallocated). An entry is running until its request ends; the
	// others are answered and wait for the writer. When answered entries
	// reach MaxInFlight+replySlack, the reader stops reading until the
	// writer catches up: the back-pressure on a client that does not read.
	replies []*reply
	rhead   int
	running int
	rclosed bool // the reader is done: no more entries
	space   *sync.Cond

	// writerIdle: the writer waits for a wake-up with nothing of its own
	// to write. direct: a goroutine that answered a request is writing
	// the replies it took from the head of replies itself (finish), so
	// the writer must not write until it is done. carry holds what a
	// direct write could not write at once, for the writer to write
	// first. writerGone: the writer returned.
	writerIdle bool
	direct     bool
	carry      []byte
	writerGone bool
}

type heldKey struct {
	key   string
	token uint64
}

type holding struct {
	lock      sidecar.Lock
	releasing bool // a RELEASE for it is running
	extending bool // an EXTEND of it is running
	// stopWatch ends the broker's lost watch of the lock (WatchLost);
	// called once the connection no longer holds it. unwatched: the
	// connection let go of it (session.unwatch) before acq.done had set
	// stopWatch, which then stops the watch itself. Both under
	// session.mu.
	stopWatch func()
	unwatched bool
}

// reply is the answer to one request; done once line is set (under
// session.mu). A lazy reply (INFO, HELD) is computed when its turn to be
// written comes, so it reflects every earlier request on the connection.
type reply struct {
	line   string
	lazy   func() string
	done   bool
	queued bool // in session.replies, counted running until done
}

// acq is one running ACQUIRE.
type acq struct {
	ss       *session
	r        *reply
	n        uint64   // its position among the connection's request lines
	keys     []string // its keys, for its QUEUED event
	waiter   bool
	cancel   func(error) // the broker's; nil until AcquireAsync returned
	finished bool
	// places are its POSITION lines per key (one, or a block's keys):
	// the last place queued, and where its line waits in evq while it is
	// not written yet. Guarded by the session's mu.
	places []placeTold
}

// placeTold is what a connection was told, or is about to be told, of one
// ACQUIRE's place in one key's line. A new place for the same key
// replaces a line the writer has not written yet, and a place equal to
// the last one queued is not queued again (a new cluster leader tells
// every waiter its place once more): so a connection that stops reading
// holds at most one POSITION line per pending ACQUIRE and key, however
// long it stalls, and is told a place only when it changed.
type placeTold struct {
	key   string
	place int64  // -1: none queued yet
	gen   uint64 // the evq generation of idx; stale once the writer took evq
	idx   int    // its line's index in evq
}

// replySlack is how many answered replies beyond MaxInFlight a connection
// may have waiting for the writer (see session.replies).
const replySlack = 64

func newSession(srv *Server, c *net.UnixConn, id uint64, log *slog.Logger) *session {
	ss := &session{
		srv: srv, id: id, conn: c, log: log,
		owner:      srv.ownerBase + strconv.FormatUint(id, 10),
		writerDone: make(chan struct{}),
		wake:       make(chan struct{}, 1),
		held:       map[heldKey]*holding{},
		pend:       map[*acq]struct{}{},
		flushed:    make(chan struct{}),
	}
	ss.space = sync.NewCond(&ss.mu)
	ss.ctx, ss.cancel = context.WithCancelCause(context.Background())
	return ss
}

// run serves the connection until it closes, then cleans up.
func (ss *session) run() {
	ss.log.Debug("connection opened", "owner", ss.owner)
	go ss.writeLoop()
	why, eof := ss.readLoop()
	if eof && !ss.peerHungUp() {
		// The client only shut down its sending side (`printf ... | socat`
		// does): it still reads, so let what it asked for finish and be
		// answered before the session ends and releases its locks. A
		// client that closed or crashed is hung up and ends at once.
		ss.work.Wait()
	}
	ss.end(why)
	ss.mu.Lock()
	ss.rclosed = true
	ss.mu.Unlock()
	ss.kickWriter()
	// The writer still answers what was asked before the end (a client may
	// half-close after its last request and wait for the replies).
	<-ss.writerDone
	ss.waitWork()
	ss.conn.Close()
	ss.log.Debug("connection closed", "why", why)
}

// waitWork waits for the session's requests to end, or for the server to
// stop waiting for them (Close's grace period is over): a RELEASE goes on
// in the broker until its deadline either way.
func (ss *session) waitWork() {
	if ss.srv.hardCtx.Err() != nil {
		return
	}
	done := make(chan struct{})
	go func() { ss.work.Wait(); close(done) }()
	select {
	case <-done:
	case <-ss.srv.hardCtx.Done():
	}
}

// readLoop reads and dispatches requests until EOF, an error or an
// over-long line, and says why it stopped and whether it was a clean EOF.
//
// It reads again after a read that returned less than its buffer, though
// that read usually finds the socket empty (a system call per request): a
// peer's close that arrives with its last bytes raises no edge of its own
// for the poller once that read took the bytes, so a reader that waited
// for the poller instead would never see the EOF (a crashed client's
// session, its queued ACQUIREs and its locks, would stay;
// TestCrashAfterWaitingAcquireEndsSession).
func (ss *session) readLoop() (why string, eof bool) {
	buf := make([]byte, 512)
	split := NewLineSplitter(ss.srv.cfg.MaxLineLen)
	stopped := false
	for {
		n, err := ss.conn.Read(buf)
		if n > 0 {
			ferr := split.Feed(buf[:n], func(line []byte) bool {
				if !ss.dispatch(line) {
					stopped = true
					return false
				}
				return true
			})
			if stopped {
				return "session ended", false
			}
			if ferr != nil {
				ss.log.Info("line too long; closing", "err", ferr)
				ss.push(&reply{line: replyFor(ferr), done: true})
				return "line too long", false
			}
		}
		if err != nil {
			if split.Buffered() > 0 {
				ss.log.Debug("connection ended inside a line; partial line ignored", "bytes", split.Buffered())
			}
			return "read: " + err.Error(), errors.Is(err, io.EOF)
		}
	}
}

// peerHungUp reports whether the peer closed its end entirely (POLLHUP), as
// opposed to shutting down only its sending side (then it can still read
// replies). A crashed process's socket is closed by the kernel: hung up.
func (ss *session) peerHungUp() bool {
	raw, err := ss.conn.SyscallConn()
	if err != nil {
		return true
	}
	hup := true
	_ = raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		if n, err := unix.Poll(fds, 0); err == nil && n == 1 {
			hup = fds[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
		} else if err == nil {
			hup = false // not even writable yet: the peer is still there
		}
	})
	return hup
}

// queueEventsLocked queues event lines for the writer. Requires mu.
func (ss *session) queueEventsLocked(lines ...string) {
	ss.evq = append(ss.evq, lines...)
	ss.evQueued += uint64(len(lines))
}

// flushedLocked records n more event lines written, or a failed write,
// and wakes whoever waits for them (endCause). Requires mu.
func (ss *session) flushedLocked(n uint64, failed bool) {
	ss.evWritten += n
	ss.writeFailed = ss.writeFailed || failed
	close(ss.flushed)
	ss.flushed = make(chan struct{})
}

// lostTellWait bounds how long a session's end waits for its
// `! LOST compensated` lines to be written before it releases those locks
// (endCause).
const lostTellWait = time.Second

// waitTold waits, at most d, for the writer to have written the first
// target event lines; true if it did, or if a write failed (the peer is
// gone: nobody left to tell).
func (ss *session) waitTold(target uint64, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for ss.evWritten < target && !ss.writeFailed {
		ch := ss.flushed
		ss.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			ss.mu.Lock()
			return ss.evWritten >= target || ss.writeFailed
		}
		ss.mu.Lock()
	}
	return true
}

func (ss *session) kickWriter() {
	select {
	case ss.wake <- struct{}{}:
	default:
	}
}

// push queues r for the writer, first waiting while the answered replies
// waiting to be written are at their bound (back-pressure); false if the
// session ended meanwhile and the writer is gone.
func (ss *session) push(r *reply) bool {
	ss.mu.Lock()
	limit := ss.srv.cfg.MaxInFlight + replySlack
	for !ss.ended && len(ss.replies)-ss.rhead-ss.running >= limit {
		ss.space.Wait()
	}
	select {
	case <-ss.writerDone:
		ss.mu.Unlock()
		return false
	default:
	}
	ss.replies = append(ss.replies, r)
	if !r.done {
		// Nothing for the writer yet: whoever answers it kicks (finish).
		r.queued = true
		ss.running++
		ss.mu.Unlock()
		return true
	}
	ss.mu.Unlock()
	ss.kickWriter()
	return true
}

// finish answers r (a running entry) with line. When the writer is idle
// and r's reply is next to go, the caller writes it itself, without
// blocking (writeDirect): a wake-up of the writer per reply is most of
// what a reply costs.
func (ss *session) finish(r *reply, line string) {
	ss.mu.Lock()
	r.line, r.done = line, true
	if r.queued {
		ss.running--
	}
	if out := ss.takeDirectLocked(); out != nil {
		ss.mu.Unlock()
		ss.writeDirect(out)
		return
	}
	ss.mu.Unlock()
	ss.kickWriter()
}

// takeDirectLocked takes the answered replies at the head of the queue
// for a direct write, if the writer is idle and nobody else writes:
// nil if not (then the writer is kicked). Event lines and lazy replies
// stay the writer's. Requires mu.
func (ss *session) takeDirectLocked() []byte {
	if !ss.writerIdle || ss.direct || ss.writerGone || ss.writeFailed || len(ss.evq) > 0 || ss.carry != nil {
		return nil
	}
	var out []byte
	for ss.rhead < len(ss.replies) {
		r := ss.replies[ss.rhead]
		if !r.done || r.lazy != nil {
			break
		}
		out = append(out, r.line...)
		out = append(out, '\n')
		ss.popLocked()
	}
	if out != nil {
		ss.direct = true
	}
	return out
}

// writeDirect writes out without blocking; what the socket does not take
// at once (or a failed write's bytes) goes to the writer, which writes it
// before anything else and handles the failure.
func (ss *session) writeDirect(out []byte) {
	n := 0
	var werr error
	if raw, err := ss.conn.SyscallConn(); err != nil {
		werr = err
	} else if err := raw.Write(func(fd uintptr) bool {
		for n < len(out) {
			k, err := unix.Write(int(fd), out[n:])
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				if err != unix.EAGAIN {
					werr = err
				}
				return true
			}
			n += k
		}
		return true
	}); err != nil {
		werr = err
	}
	ss.mu.Lock()
	ss.direct = false
	kick := false
	if n < len(out) {
		ss.carry = out[n:]
		kick = true
	} else {
		kick = len(ss.evq) > 0 || (ss.rhead < len(ss.replies) && ss.replies[ss.rhead].done) || ss.rclosed
	}
	ss.mu.Unlock()
	if werr != nil {
		ss.log.Debug("direct write failed; the writer retries and ends the session", "err", werr)
	}
	if kick {
		ss.kickWriter()
	}
}

// popLocked removes the head of replies. Requires mu.
func (ss *session) popLocked() {
	ss.replies[ss.rhead] = nil
	if ss.rhead++; ss.rhead == len(ss.replies) {
		// Empty: start over, and let a burst's array go.
		if cap(ss.replies) > 1024 {
			ss.replies = nil
		} else {
			ss.replies = ss.replies[:0]
		}
		ss.rhead = 0
	} else if ss.rhead >= 1024 && ss.rhead*2 >= len(ss.replies) {
		n := copy(ss.replies, ss.replies[ss.rhead:])
		clear(ss.replies[n:])
		ss.replies, ss.rhead = ss.replies[:n], 0
	}
	ss.space.Broadcast()
}

// refuse answers the request being dispatched with err, an ERR the
// sidecar gives on its own, and then holds the reader back while the
// connection refuses faster than RefusalRate: false if the session ended
// meanwhile. Only the reader calls it.
func (ss *session) refuse(err error) bool {
	if !ss.push(&reply{line: replyFor(err), done: true}) {
		return false
	}
	rate := ss.srv.cfg.RefusalRate
	if rate < 0 {
		return true
	}
	now := time.Now()
	burst := float64(ss.srv.cfg.RefusalBurst)
	if ss.refusalAt.IsZero() {
		ss.refusals = burst
	} else {
		ss.refusals = min(burst, ss.refusals+now.Sub(ss.refusalAt).Seconds()*float64(rate))
	}
	ss.refusalAt = now
	if ss.refusals -= 1; ss.refusals >= 0 {
		return true
	}
	// In debt: read on once the bucket is back to zero.
	ss.srv.paced.Add(1)
	wait := time.Duration(-ss.refusals / float64(rate) * float64(time.Second))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ss.ctx.Done():
		return false
	}
}

// dispatch handles one request line; false stops reading.
func (ss *session) dispatch(line []byte) bool {
	ss.nreq++
	req, err := ParseLineVersion(line, ss.version)
	if err != nil {
		return ss.refuse(err)
	}
	switch req.Verb {
	case VerbPing:
		return ss.push(&reply{line: "PONG", done: true})
	case VerbInfo:
		return ss.push(&reply{lazy: ss.infoLine, done: true})
	case VerbHeld:
		return ss.push(&reply{lazy: ss.heldLine, done: true})
	case VerbHello:
		// The version both speak; from version 3 it also decides whether
		// event lines are written (the latest HELLO counts).
		v := min(int(req.Version), ProtocolVersion)
		line := "HELLO " + strconv.Itoa(v)
		on := req.Events && v >= VersionEvents
		if on {
			line += " " + HelloEvents
		}
		ss.mu.Lock()
		ss.events, ss.queued, ss.positions = on, on && v >= VersionQueued, on && v >= VersionPositions
		ss.revokes = on && v >= VersionRevoke
		ss.version = uint16(v)
		ss.mu.Unlock()
		return ss.push(&reply{line: line, done: true})
	case VerbExtend:
		return ss.startExtend(req)
	case VerbAcquire, VerbPermit:
		return ss.startAcquire(req)
	case VerbPermits:
		return ss.startPermits(req)
	case VerbRelease:
		return ss.startRelease(req)
	}
	return ss.refuse(fmt.Errorf("%w: verb %d", ErrUnknownVerb, req.Verb))
}

// startAcquire starts an ACQUIRE: one with a wait counts against
// MaxWaiting (it may queue at the node), one without against MaxInFlight.
func (ss *session) startAcquire(req Request) bool {
	a := &acq{ss: ss, r: &reply{}, n: ss.nreq, waiter: req.Wait > 0}
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return false
	}
	switch {
	case a.waiter && ss.waiting >= ss.srv.cfg.MaxWaiting:
		ss.mu.Unlock()
		return ss.refuse(fmt.Errorf("%w: at most %d ACQUIREs with a wait running at once per connection", ErrTooManyWaiters, ss.srv.cfg.MaxWaiting))
	case !a.waiter && ss.acquiring >= ss.srv.cfg.MaxInFlight:
		ss.mu.Unlock()
		return ss.refuse(fmt.Errorf("%w: at most %d ACQUIREs with wait 0 running at once per connection", ErrTooManyInFlight, ss.srv.cfg.MaxInFlight))
	case a.waiter:
		ss.waiting++
	default:
		ss.acquiring++
	}
	ss.work.Add(1)
	ss.mu.Unlock()
	if !ss.push(a.r) {
		ss.mu.Lock()
		if a.waiter {
			ss.waiting--
		} else {
			ss.acquiring--
		}
		ss.mu.Unlock()
		ss.work.Done()
		return false
	}
	var (
		cancel func(error)
		err    error
	)
	a.keys = req.Keys
	if !req.Block() {
		a.keys = []string{req.Key}
	}
	opts := sidecar.AcquireOptions{Label: req.Label, Permit: req.Verb == VerbPermit}
	if a.waiter {
		// Only a waiter can be queued (wait 0 is granted or BUSY).
		opts.Queued = a.queued
		opts.Position = a.position
	}
	cancel, err = ss.srv.broker.AcquireAsyncOpts(a.keys, ss.owner, req.Lease, req.Wait, opts, a.done)
	if err != nil {
		a.done(sidecar.Lock{}, err)
		return true
	}
	ss.mu.Lock()
	if a.finished {
		ss.mu.Unlock()
		return true
	}
	a.cancel = cancel
	ss.pend[a] = struct{}{}
	ended := ss.ended
	ss.mu.Unlock()
	if ended {
		cancel(ss.endCauseErr())
	}
	return true
}

// queued is the broker's word that the cluster queued the ACQUIRE: with
// version 4 events on, the connection is told (QUEUED), before the reply,
// which done queues after it. It runs on a broker goroutine, never after
// done, and must not block.
func (a *acq) queued() {
	ss := a.ss
	ss.mu.Lock()
	tell := ss.queued && !a.finished && !ss.ended
	if tell {
		ss.queueEventsLocked(FormatQueued(a.n, a.keys))
	}
	ss.mu.Unlock()
	if tell {
		ss.srv.queuedEvent()
		ss.kickWriter()
	}
}

// position is the broker's word of the ACQUIRE's place in one key's line:
// with version 7 events on, the connection is told (POSITION) unless the
// ACQUIRE is answered already (finished is set under mu before its reply
// is queued, so no POSITION line ever follows the reply). The sidecar adds
// no rate limit of its own: the leader's interval bounds it. It runs on a
// broker goroutine and must not block.
func (a *acq) position(p sidecar.Place) {
	ss := a.ss
	ss.mu.Lock()
	tell := ss.positions && !a.finished && !ss.ended
	if tell {
		tell = a.queuePlaceLocked(p)
	}
	ss.mu.Unlock()
	if tell {
		ss.srv.positionEvent()
		ss.kickWriter()
	}
}

// queuePlaceLocked queues p's POSITION line (see placeTold), replacing
// the key's line not written yet; false when p is the place last queued.
// Requires the session's mu.
func (a *acq) queuePlaceLocked(p sidecar.Place) bool {
	ss := a.ss
	line := FormatPosition(a.n, p.Position, p.Estimate, p.EstimateKnown, p.Key)
	i := slices.IndexFunc(a.places, func(t placeTold) bool { return t.key == p.Key })
	if i < 0 {
		a.places = append(a.places, placeTold{key: p.Key, place: -1})
		i = len(a.places) - 1
	}
	t := &a.places[i]
	switch {
	case t.place == int64(p.Position):
		return false
	case t.gen == ss.evGen && t.idx < len(ss.evq) && t.place >= 0:
		ss.evq[t.idx] = line // not written yet: the newer place replaces it
	default:
		t.gen, t.idx = ss.evGen, len(ss.evq)
		ss.queueEventsLocked(line)
	}
	t.place = int64(p.Position)
	return true
}

// done is the broker's callback for the ACQUIRE (or its immediate
// outcome). It runs on a broker goroutine and must not block.
func (a *acq) done(l sidecar.Lock, err error) {
	ss := a.ss
	ss.mu.Lock()
	if a.finished {
		ss.mu.Unlock()
		return
	}
	a.finished = true
	delete(ss.pend, a)
	if a.waiter {
		ss.waiting--
	} else {
		ss.acquiring--
	}
	ended := ss.ended
	var h *holding
	if err == nil && !ended {
		h = &holding{lock: l}
		for _, k := range lockKeys(l) {
			ss.held[heldKey{k, l.Token}] = h
		}
	}
	ss.mu.Unlock()
	if h != nil {
		stop := ss.srv.broker.WatchLoss(l, func(why sidecar.Loss) { ss.lost(h, why) })
		ss.mu.Lock()
		// Released, lost or let go by the session's end meanwhile: the
		// watch is over before it was recorded.
		gone := ss.held[heldKey{l.Key, l.Token}] != h || h.unwatched
		if !gone {
			h.stopWatch = stop
		}
		ss.mu.Unlock()
		if gone {
			stop()
		}
	}
	var line string
	switch {
	case err == nil && ended:
		// Granted just as the connection went away: nobody can use it.
		ss.log.Debug("grant after the connection ended; compensating", "key", l.Key, "token", l.Token)
		ss.srv.broker.Compensate(l)
		line = replyFor(ss.endedErr())
	case err == nil:
		if ss.log.Enabled(context.Background(), slog.LevelDebug) {
			ss.log.Debug("lock granted", lockAttrs(l)...)
		}
		line = "OK " + strconv.FormatUint(l.Token, 10)
		if l.Permit {
			line += " " + strconv.FormatUint(uint64(l.Slot), 10)
		}
	case ended && (errors.Is(err, context.Canceled) || errors.Is(err, ErrServerClosed)):
		line = replyFor(ss.endedErr())
	default:
		if code := codeOf(err); code == "internal" {
			ss.log.Warn("acquire failed", "err", err)
		}
		line = replyFor(err)
	}
	ss.finish(a.r, line)
	ss.work.Done()
}

// heldLocked finds the lock a RELEASE or EXTEND of k names among this
// connection's, or the refusal it gets without the cluster: the same
// answer the cluster would give for a key held under another token, not
// held for one this connection does not hold, release_in_progress for a
// lock being released. Requires ss.mu.
func (ss *session) heldLocked(k heldKey) (*holding, error) {
	h := ss.held[k]
	switch {
	case h == nil && ss.holdsKeyLocked(k.key):
		return nil, fmt.Errorf("%w: this connection holds %s under another token, not %d", locksm.ErrTokenMismatch, snippet([]byte(k.key)), k.token)
	case h == nil:
		return nil, fmt.Errorf("%w: this connection holds no lock on %s with token %d", ErrNotHeld, snippet([]byte(k.key)), k.token)
	case h.releasing:
		return nil, fmt.Errorf("%w: %s token %d", ErrReleaseInProgress, snippet([]byte(k.key)), k.token)
	}
	return h, nil
}

func (ss *session) startRelease(req Request) bool {
	k := heldKey{req.Key, req.Token}
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return false
	}
	h, err := ss.heldLocked(k)
	if err != nil {
		ss.mu.Unlock()
		return ss.refuse(err)
	}
	// No in-flight bound: a RELEASE needs a lock this connection holds
	// and is not releasing, so the locks held bound them.
	h.releasing = true
	ss.releasing++
	ss.work.Add(1)
	ss.mu.Unlock()
	r := &reply{}
	ok := ss.push(r)
	// Even if the session ended meanwhile: a release asked for is
	// finished (the broker bounds it at 5 s).
	if err := ss.srv.broker.ReleaseAsync(h.lock, func(err error) { ss.released(k, h, r, err) }); err != nil {
		ss.released(k, h, r, err)
	}
	return ok
}

// lockKeys is every key of l: a block's, or its one key.
func lockKeys(l sidecar.Lock) []string {
	if l.Keys != nil {
		return l.Keys
	}
	return []string{l.Key}
}

func (ss *session) holdsKeyLocked(key string) bool {
	for k := range ss.held {
		if k.key == key {
			return true
		}
	}
	return false
}

// gone reports whether a release error says the holding no longer exists,
// so there is nothing left to release.
func gone(err error) bool {
	return errors.Is(err, locksm.ErrNotHeld) || errors.Is(err, locksm.ErrTokenMismatch) || errors.Is(err, locksm.ErrOwnerMismatch)
}

// released is the broker's callback for a RELEASE.
func (ss *session) released(k heldKey, h *holding, r *reply, err error) {
	definite := err == nil || gone(err)
	ss.mu.Lock()
	ss.releasing--
	if definite {
		ss.forgetLocked(h)
	} else {
		// Still ours as far as we know: the client may RELEASE again, and
		// the end of the session compensates it.
		h.releasing = false
	}
	ended := ss.ended
	ss.mu.Unlock()
	if definite {
		ss.unwatch(h)
	}
	if ended && !definite {
		ss.srv.broker.Compensate(h.lock)
	}
	line := "OK"
	if err != nil {
		ss.log.Info("release failed", "key", k.key, "token", k.token, "err", err)
		line = replyFor(err)
	}
	ss.finish(r, line)
	ss.work.Done()
}

// endedErr is the error for an ACQUIRE cut short by the end of the
// session: ErrServerClosed when the server is shutting down, else
// context.Canceled (the connection closed).
func (ss *session) endedErr() error {
	if cause := context.Cause(ss.ctx); errors.Is(cause, ErrServerClosed) {
		return fmt.Errorf("%w: the sidecar is shutting down; not acquired", ErrServerClosed)
	}
	return fmt.Errorf("%w: connection closed", context.Canceled)
}

// endCauseErr is what pending ACQUIREs are cancelled with.
func (ss *session) endCauseErr() error {
	if cause := context.Cause(ss.ctx); cause != nil {
		return cause
	}
	return context.Canceled
}

// lostLineLocked is h's LOST event in the version this connection agreed
// (with the label from version 5). ss.mu is held.
func (ss *session) lostLineLocked(h *holding, reason string) string {
	if ss.version >= VersionLabels {
		return FormatLostLabel(h.lock.Token, reason, h.lock.Label, lockKeys(h.lock))
	}
	return FormatLost(h.lock.Token, reason, lockKeys(h.lock))
}

// end finishes the session: pending acquires are cancelled and every held
// lock not being released is compensated. Idempotent.
func (ss *session) end(why string) { ss.endCause(why, nil) }

// endCause is end with the cause its pending acquires are cancelled with
// (nil: context.Canceled). With events on, it releases the held locks
// only once their `! LOST compensated` lines are written, waiting at most
// lostTellWait; not written by then, it leaves them to their leases (a
// failed write releases them: the peer is gone). It may block that long:
// never call it on the writer's goroutine but after a failed write.
func (ss *session) endCause(why string, cause error) {
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return
	}
	ss.ended = true
	ss.space.Broadcast() // a reader waiting for room stops waiting
	var locks []sidecar.Lock
	var watched []*holding
	tell := false               // the LOST lines must reach the peer before the release
	seen := map[*holding]bool{} // a block is filed under each of its keys
	for _, h := range ss.held {
		if seen[h] {
			continue
		}
		seen[h] = true
		if !h.releasing {
			locks = append(locks, h.lock)
			watched = append(watched, h)
		}
	}
	if ss.events && len(watched) > 0 {
		// The connection may still read (a half-close, or the sidecar
		// shutting down): tell it why it no longer holds them.
		evs := make([]string, 0, len(watched))
		for _, h := range watched {
			evs = append(evs, ss.lostLineLocked(h, sidecar.LostCompensated.String()))
		}
		sortEvents(evs)
		ss.queueEventsLocked(evs...)
		for range evs {
			ss.srv.lostEvent(sidecar.LostCompensated, true)
		}
		tell = !ss.writeFailed
	}
	told := ss.evQueued
	var cancels []func(error)
	for a := range ss.pend {
		if a.cancel != nil {
			cancels = append(cancels, a.cancel)
		}
	}
	ss.mu.Unlock()
	ss.cancel(cause)
	ccause := ss.endCauseErr()
	for _, c := range cancels {
		c(ccause) // the callbacks answer them (and compensate a grant that won)
	}
	if len(locks) > 0 {
		ss.log.Info("connection ended holding locks; releasing them", "why", why, "locks", len(locks))
	}
	for _, h := range watched {
		ss.unwatch(h) // its end is ours now
	}
	ss.kickWriter()
	// A peer that still reads learns of the loss before the key moves on:
	// the release waits (bounded) for the LOST lines to be written. Not
	// written in time (the peer does not read), the locks are left to
	// their leases, which the peer's own clock counts too.
	if tell && !ss.waitTold(told, lostTellWait) {
		ss.log.Warn("connection ended holding locks it could not be told lost in time; leaving them to their leases",
			"why", why, "locks", len(locks), "waited", lostTellWait)
		locks = nil
	}
	for _, l := range locks {
		ss.srv.broker.Compensate(l)
	}
	// Unblock the reader if the server ends us (Close).
	ss.conn.CloseRead()
}

// writeLoop writes replies in request order. It batches replies that are
// ready into one write, and flushes before waiting for one that is not.
func (ss *session) writeLoop() {
	defer close(ss.writerDone)
	defer func() {
		ss.mu.Lock()
		ss.writerGone, ss.writerIdle = true, false
		ss.mu.Unlock()
	}()
	var buf []byte
	var nev uint64 // event lines in buf
	failed := false
	flush := func() {
		if len(buf) > 0 && !failed {
			_, err := ss.conn.Write(buf)
			ss.mu.Lock()
			if err != nil {
				nev = 0 // not written
			}
			ss.flushedLocked(nev, err != nil)
			ss.mu.Unlock()
			if err != nil {
				// The peer is gone: end the session now rather than when
				// the reader notices, and keep draining so nothing blocks.
				failed = true
				ss.log.Debug("write failed", "err", err)
				ss.end("write: " + err.Error())
			}
		}
		buf, nev = buf[:0], 0
	}
	for {
		ss.mu.Lock()
		for {
			if ss.direct {
				// Someone writes replies it took from the head; it kicks
				// when done if there is more.
			} else {
				if ss.carry != nil {
					// What a direct write left: it goes first.
					buf = append(buf, ss.carry...)
					ss.carry = nil
				}
				// Events first: they answer nothing, so they never wait
				// for a reply, and they go between whole reply lines.
				for _, ev := range ss.evq {
					buf = append(buf, ev...)
					buf = append(buf, '\n')
				}
				nev += uint64(len(ss.evq))
				clear(ss.evq)
				ss.evq = ss.evq[:0]
				ss.evGen++
				if ss.rhead < len(ss.replies) && ss.replies[ss.rhead].done {
					break
				}
				if ss.rclosed && ss.rhead == len(ss.replies) {
					ss.mu.Unlock()
					flush()
					return
				}
			}
			if len(buf) > 0 {
				ss.mu.Unlock()
				flush()
				ss.mu.Lock()
				continue
			}
			ss.writerIdle = true
			ss.mu.Unlock()
			select {
			case <-ss.wake:
			case <-ss.srv.hardCtx.Done():
				return // Close's grace period is over: stop answering
			}
			ss.mu.Lock()
			ss.writerIdle = false
		}
		r := ss.replies[ss.rhead]
		ss.popLocked()
		more := ss.rhead < len(ss.replies) && ss.replies[ss.rhead].done
		ss.mu.Unlock()
		line := r.line
		if r.lazy != nil {
			line = r.lazy()
		}
		buf = append(buf, line...)
		buf = append(buf, '\n')
		if !more || len(buf) >= 4096 {
			flush()
		}
	}
}

func (ss *session) infoLine() string {
	in := ss.srv.broker.Info()
	id, leader := in.ClusterID, in.Leader
	if id == "" {
		id = "-"
	}
	if leader == "" {
		leader = "-"
	}
	domain := in.Domain
	if domain == "" {
		domain = "-"
	}
	members := "-"
	if len(in.Members) > 0 {
		parts := make([]string, len(in.Members))
		for i, m := range in.Members {
			addr := m.ClientAddr
			if addr == "" {
				addr = "-"
			}
			parts[i] = clean(m.ServerID) + ":" + m.Suffrage.String() + "@" + clean(addr)
		}
		members = strings.Join(parts, ",")
	}
	return fmt.Sprintf("INFO cluster=%s leader=%s connected=%d/%d domain=%s members=%s protocol=%d %s", clean(id), clean(leader),
		len(in.Connected), len(in.Addrs), clean(domain), members, ProtocolVersion, sessionFields(in))
}

// sessionFields are INFO's fields about the broker's cluster session
// (PROTOCOL.md, INFO): always all of them, in this order, so that a
// reader never has to guess whether a field is missing or zero. The id is
// hex, as the sidecar's log writes it.
func sessionFields(in sidecar.Info) string {
	id, state := "-", "-"
	var st sidecar.SessionInfo
	if in.Session != nil {
		st = *in.Session
		id, state = strconv.FormatUint(st.ID, 16), clean(st.State)
	}
	r := st.LastResume
	return fmt.Sprintf("sessions=%s session=%s session_state=%s session_timeout_ms=%d session_resumes=%d session_opens=%d session_held=%d session_last_resume=outcomes:%d,queued:%d,void:%d,repeated:%d",
		in.Sessions, id, state, in.SessionTimeout.Milliseconds(), st.Resumes, st.Opens, st.Held, r.Outcomes, r.Queued, r.Void, r.Repeated)
}

func (ss *session) heldLine() string {
	ss.mu.Lock()
	keys := make([]heldKey, 0, len(ss.held))
	var labels map[heldKey]string
	for k, h := range ss.held {
		keys = append(keys, k)
		if h.lock.Label != "" {
			if labels == nil {
				labels = map[heldKey]string{}
			}
			labels[k] = h.lock.Label
		}
	}
	labelled := ss.version >= VersionLabels
	ss.mu.Unlock()
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].key != keys[j].key {
			return keys[i].key < keys[j].key
		}
		return keys[i].token < keys[j].token
	})
	var b strings.Builder
	b.WriteString("HELD ")
	b.WriteString(strconv.Itoa(len(keys)))
	for _, k := range keys {
		b.WriteByte(' ')
		b.WriteString(k.key)
		b.WriteByte(':')
		b.WriteString(strconv.FormatUint(k.token, 10))
		if labelled {
			// Version 5: every lock is two fields, the label (or
			// NoLabel) after its key:token.
			b.WriteByte(' ')
			if l := labels[k]; l != "" {
				b.WriteString(l)
			} else {
				b.WriteString(NoLabel)
			}
		}
	}
	return b.String()
}

// clean keeps a field of an INFO line one visible-ASCII word.
func clean(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x21 || c > 0x7E {
			b[i] = '_'
		}
	}
	return string(b)
}

// forgetLocked drops h from the locks the connection holds (every key of
// a block). Requires ss.mu.
func (ss *session) forgetLocked(h *holding) {
	for _, key := range lockKeys(h.lock) {
		if ss.held[heldKey{key, h.lock.Token}] == h {
			delete(ss.held, heldKey{key, h.lock.Token})
		}
	}
}

// lockAttrs are the log attributes naming l: key, token and, when it has
// one, its owner label.
func lockAttrs(l sidecar.Lock) []any {
	if l.Label == "" {
		return []any{"key", l.Key, "token", l.Token}
	}
	return []any{"key", l.Key, "token", l.Token, "label", l.Label}
}

// unwatch ends the broker's lost watch of h: now if acq.done has set it
// up, else acq.done stops it as soon as it has (unwatched).
func (ss *session) unwatch(h *holding) {
	ss.mu.Lock()
	stop := h.stopWatch
	h.stopWatch, h.unwatched = nil, true
	ss.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// lost is the broker's word that h ended without this connection's
// RELEASE (it runs on a broker goroutine and must not block): the
// connection forgets the lock and, with events on, is told (a revoke,
// from version 9, with its REVOKED line right before the LOST line). A
// lock whose RELEASE is running is left to that RELEASE's reply.
func (ss *session) lost(h *holding, loss sidecar.Loss) {
	why := loss.Reason
	ss.mu.Lock()
	if ss.ended || h.releasing || ss.held[heldKey{h.lock.Key, h.lock.Token}] != h {
		ss.mu.Unlock()
		return
	}
	ss.forgetLocked(h)
	tell := ss.events
	if tell {
		lost := ss.lostLineLocked(h, why.String())
		if why == sidecar.LostRevoked && ss.revokes {
			ss.queueEventsLocked(FormatRevoked(h.lock.Token, loss.By, loss.Why), lost)
		} else {
			ss.queueEventsLocked(lost)
		}
	}
	ss.mu.Unlock()
	ss.srv.lostEvent(why, tell)
	attrs := append(lockAttrs(h.lock), "why", why)
	if why == sidecar.LostRevoked {
		attrs = append(attrs, "by", loss.By, "reason", loss.Why)
	}
	ss.log.Info("lock lost", attrs...)
	if tell {
		ss.kickWriter()
	}
}

// startExtend starts an EXTEND: like a RELEASE, only of a lock this
// connection holds (else answered at once), and one at a time per lock.
// startPermits starts a PERMITS (an operator's set-permits): it counts
// against MaxInFlight with the ACQUIREs of wait 0, so a flood of them is
// bounded like theirs.
func (ss *session) startPermits(req Request) bool {
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return false
	}
	if ss.acquiring >= ss.srv.cfg.MaxInFlight {
		ss.mu.Unlock()
		return ss.refuse(fmt.Errorf("%w: at most %d ACQUIREs with wait 0 and PERMITS running at once per connection", ErrTooManyInFlight, ss.srv.cfg.MaxInFlight))
	}
	ss.acquiring++
	ss.work.Add(1)
	ss.mu.Unlock()
	r := &reply{}
	ok := ss.push(r)
	done := func(err error) {
		ss.mu.Lock()
		ss.acquiring--
		ss.mu.Unlock()
		line := "OK"
		if err != nil {
			line = replyFor(err)
		} else {
			ss.log.Info("permits set", "key", req.Key, "permits", req.Permits)
		}
		ss.finish(r, line)
		ss.work.Done()
	}
	if err := ss.srv.broker.SetPermitsAsync(req.Key, req.Permits, done); err != nil {
		done(err)
	}
	return ok
}

func (ss *session) startExtend(req Request) bool {
	k := heldKey{req.Key, req.Token}
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return false
	}
	h, err := ss.heldLocked(k)
	if err == nil && h.extending {
		err = fmt.Errorf("%w: %s token %d", ErrExtendInProgress, snippet([]byte(req.Key)), req.Token)
	}
	if err != nil {
		ss.mu.Unlock()
		return ss.refuse(err)
	}
	// At most one per lock: the locks held bound them, as RELEASEs.
	h.extending = true
	ss.work.Add(1)
	l := h.lock
	ss.mu.Unlock()
	r := &reply{}
	ok := ss.push(r)
	if err := ss.srv.broker.ExtendAsync(l, req.Lease, func(nl sidecar.Lock, err error) { ss.extended(h, nl, r, err) }); err != nil {
		ss.extended(h, l, r, err)
	}
	return ok
}

// extended is the broker's callback for an EXTEND. A refusal as not held
// reached lost first (the broker tells its watches before this).
func (ss *session) extended(h *holding, nl sidecar.Lock, r *reply, err error) {
	ss.mu.Lock()
	h.extending = false
	// On success the new lease; otherwise the broker's capped validity
	// (the earlier of the previous end and the extend's start + its
	// lease: a shorter extend may have applied), which a compensation
	// or a later EXTEND's cap starts from.
	h.lock.Lease, h.lock.ValidUntil = nl.Lease, nl.ValidUntil
	ss.mu.Unlock()
	line := "OK"
	if err != nil {
		ss.log.Info("extend failed", "key", h.lock.Key, "token", h.lock.Token, "err", err)
		line = replyFor(err)
	}
	ss.finish(r, line)
	ss.work.Done()
}

// sortEvents orders event lines so that what a connection is told does
// not depend on map order.
func sortEvents(evs []string) { sort.Strings(evs) }
