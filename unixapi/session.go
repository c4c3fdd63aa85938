package unixapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"ticketing/locksm"
	"ticketing/sidecar"
)

// A session is one connection: a reader that parses and dispatches requests,
// a writer that answers them in request order, and the locks the connection
// holds.
type session struct {
	srv   *Server
	id    uint64
	owner string
	conn  *net.UnixConn
	log   *slog.Logger

	// ctx is cancelled when the session ends; pending ACQUIREs run under it.
	// Its cause is ErrServerClosed when the server ends the session (Close),
	// so those ACQUIREs are answered shutting_down, as the protocol says.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// replies holds one entry per request, in request order. Only the reader
	// sends on it and closes it; the writer drains it. Its capacity,
	// MaxInFlight+replySlack, is the most replies queued per connection:
	// room for every request that may run at once (so a waiting ACQUIRE at
	// the head of the order never keeps the reader from starting up to
	// MaxInFlight requests, or from answering too_many_in_flight) plus some
	// answered at once. When it is full the reader stops reading: that is
	// the back-pressure on a client that does not read its replies.
	replies    chan *reply
	writerDone chan struct{}

	// mu guards held, inflight and ended. A leaf: never held together with
	// Server.mu, nor while calling the Broker, queueing a reply (push may
	// wait for the writer) or doing socket I/O.
	mu       sync.Mutex
	held     map[heldKey]*holding
	inflight int  // ACQUIRE and RELEASE requests running
	ended    bool // end ran: held locks were handed to Compensate
	work     sync.WaitGroup
}

type heldKey struct {
	key   string
	token uint64
}

type holding struct {
	lock      sidecar.Lock
	releasing bool // a RELEASE for it is running
}

// reply is the answer to one request; done is closed once line is set.
// A lazy reply (INFO, HELD) is computed when its turn to be written comes,
// so it reflects every earlier request on the connection.
type reply struct {
	line string
	lazy func() string
	done chan struct{}
}

func (r *reply) finish(line string) {
	r.line = line
	close(r.done)
}

// replySlack is how many replies beyond MaxInFlight a connection may have
// queued (see session.replies).
const replySlack = 64

// closedCh is the done channel of replies known at once.
var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func newSession(srv *Server, c *net.UnixConn, id uint64, log *slog.Logger) *session {
	ss := &session{
		srv: srv, id: id, conn: c, log: log,
		owner:      srv.cfg.OwnerPrefix + "." + strconv.FormatUint(id, 10),
		replies:    make(chan *reply, srv.cfg.MaxInFlight+replySlack),
		writerDone: make(chan struct{}),
		held:       map[heldKey]*holding{},
	}
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
	close(ss.replies)
	// The writer still answers what was asked before the end (a client may
	// half-close after its last request and wait for the replies).
	<-ss.writerDone
	ss.work.Wait()
	ss.conn.Close()
	ss.log.Debug("connection closed", "why", why)
}

// readLoop reads and dispatches requests until EOF, an error or an
// over-long line, and says why it stopped and whether it was a clean EOF.
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
				ss.push(&reply{line: replyFor(ferr), done: closedCh})
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

// push queues r for the writer; false if the session ended meanwhile.
func (ss *session) push(r *reply) bool {
	select {
	case ss.replies <- r:
		return true
	case <-ss.writerDone:
		return false
	case <-ss.ctx.Done():
		// Still try to queue (the writer drains until replies is closed),
		// but do not block on a writer that stopped writing.
		select {
		case ss.replies <- r:
			return true
		case <-ss.writerDone:
			return false
		}
	}
}

// dispatch handles one request line; false stops reading.
func (ss *session) dispatch(line []byte) bool {
	req, err := ParseLine(line)
	if err != nil {
		return ss.push(&reply{line: replyFor(err), done: closedCh})
	}
	switch req.Verb {
	case VerbPing:
		return ss.push(&reply{line: "PONG", done: closedCh})
	case VerbInfo:
		return ss.push(&reply{lazy: ss.infoLine, done: closedCh})
	case VerbHeld:
		return ss.push(&reply{lazy: ss.heldLine, done: closedCh})
	case VerbAcquire:
		return ss.startAcquire(req)
	case VerbRelease:
		return ss.startRelease(req)
	}
	return ss.push(&reply{line: replyFor(fmt.Errorf("%w: verb %d", ErrUnknownVerb, req.Verb)), done: closedCh})
}

func (ss *session) startAcquire(req Request) bool {
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return false
	}
	if ss.inflight >= ss.srv.cfg.MaxInFlight {
		ss.mu.Unlock()
		return ss.push(&reply{line: replyFor(fmt.Errorf("%w: at most %d ACQUIRE/RELEASE at once per connection", ErrTooManyInFlight, ss.srv.cfg.MaxInFlight)), done: closedCh})
	}
	ss.inflight++
	ss.work.Add(1)
	ss.mu.Unlock()
	r := &reply{done: make(chan struct{})}
	go ss.acquire(req, r)
	return ss.push(r)
}

func (ss *session) acquire(req Request, r *reply) {
	defer ss.work.Done()
	// The broker compensates a grant that arrives after ctx is cancelled.
	l, err := ss.srv.broker.Acquire(ss.ctx, req.Key, ss.owner, req.Lease, req.Wait)
	ss.mu.Lock()
	ss.inflight--
	ended := ss.ended
	if err == nil && !ended {
		ss.held[heldKey{l.Key, l.Token}] = &holding{lock: l}
	}
	ss.mu.Unlock()
	switch {
	case err == nil && ended:
		// Granted just as the connection went away: nobody can use it.
		ss.log.Debug("grant after the connection ended; compensating", "key", l.Key, "token", l.Token)
		ss.srv.broker.Compensate(l)
		r.finish(replyFor(ss.endedErr()))
	case err == nil:
		r.finish("OK " + strconv.FormatUint(l.Token, 10))
	case errors.Is(err, context.Canceled) && errors.Is(context.Cause(ss.ctx), ErrServerClosed):
		r.finish(replyFor(ss.endedErr()))
	default:
		if code := codeOf(err); code == "internal" {
			ss.log.Warn("acquire failed", "key", req.Key, "err", err)
		}
		r.finish(replyFor(err))
	}
}

func (ss *session) startRelease(req Request) bool {
	k := heldKey{req.Key, req.Token}
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return false
	}
	h := ss.held[k]
	var err error
	switch {
	case h == nil && ss.holdsKeyLocked(req.Key):
		// The same answer the cluster would give, without the round trip.
		err = fmt.Errorf("%w: this connection holds %s under another token, not %d", locksm.ErrTokenMismatch, snippet([]byte(req.Key)), req.Token)
	case h == nil:
		err = fmt.Errorf("%w: this connection holds no lock on %s with token %d", ErrNotHeld, snippet([]byte(req.Key)), req.Token)
	case h.releasing:
		err = fmt.Errorf("%w: %s token %d", ErrReleaseInProgress, snippet([]byte(req.Key)), req.Token)
	case ss.inflight >= ss.srv.cfg.MaxInFlight:
		err = fmt.Errorf("%w: at most %d ACQUIRE/RELEASE at once per connection", ErrTooManyInFlight, ss.srv.cfg.MaxInFlight)
	}
	if err != nil {
		ss.mu.Unlock()
		return ss.push(&reply{line: replyFor(err), done: closedCh})
	}
	h.releasing = true
	ss.inflight++
	ss.work.Add(1)
	ss.mu.Unlock()
	r := &reply{done: make(chan struct{})}
	go ss.release(k, h, r)
	return ss.push(r)
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

func (ss *session) release(k heldKey, h *holding, r *reply) {
	defer ss.work.Done()
	// Not ss.ctx: a release already asked for is finished even if the
	// client disconnects; the broker bounds it at 5 s.
	err := ss.srv.broker.Release(ss.srv.hardCtx, h.lock)
	definite := err == nil || gone(err)
	ss.mu.Lock()
	ss.inflight--
	if definite {
		delete(ss.held, k)
	} else {
		// Still ours as far as we know: the client may RELEASE again, and
		// the end of the session compensates it.
		h.releasing = false
	}
	ended := ss.ended
	ss.mu.Unlock()
	if ended && !definite {
		ss.srv.broker.Compensate(h.lock)
	}
	if err == nil {
		r.finish("OK")
		return
	}
	ss.log.Info("release failed", "key", k.key, "token", k.token, "err", err)
	r.finish(replyFor(err))
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

// end finishes the session: pending acquires are cancelled and every held
// lock not being released is compensated. Idempotent.
func (ss *session) end(why string) { ss.endCause(why, nil) }

// endCause is end with the cause its pending acquires are cancelled with
// (nil: context.Canceled).
func (ss *session) endCause(why string, cause error) {
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return
	}
	ss.ended = true
	var locks []sidecar.Lock
	for _, h := range ss.held {
		if !h.releasing {
			locks = append(locks, h.lock)
		}
	}
	ss.mu.Unlock()
	ss.cancel(cause)
	if len(locks) > 0 {
		ss.log.Info("connection ended holding locks; releasing them", "why", why, "locks", len(locks))
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
	var buf []byte
	failed := false
	flush := func() {
		if len(buf) > 0 && !failed {
			if _, err := ss.conn.Write(buf); err != nil {
				// The peer is gone: end the session now rather than when
				// the reader notices, and keep draining so nothing blocks.
				failed = true
				ss.log.Debug("write failed", "err", err)
				ss.end("write: " + err.Error())
			}
		}
		buf = buf[:0]
	}
	for r := range ss.replies {
		select {
		case <-r.done:
		default:
			flush()
			<-r.done
		}
		if r.lazy != nil {
			r.line = r.lazy()
		}
		buf = append(buf, r.line...)
		buf = append(buf, '\n')
		if len(ss.replies) == 0 || len(buf) >= 4096 {
			flush()
		}
	}
	flush()
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
	return fmt.Sprintf("INFO cluster=%s leader=%s connected=%d/%d domain=%s members=%s", clean(id), clean(leader),
		len(in.Connected), len(in.Addrs), clean(domain), members)
}

func (ss *session) heldLine() string {
	ss.mu.Lock()
	keys := make([]heldKey, 0, len(ss.held))
	for k := range ss.held {
		keys = append(keys, k)
	}
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
