package verify

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"ticketing/unixapi"
)

// lineConn is a raw unix-socket session with the sidecar that speaks
// version 3 of the local API with events on (`HELLO 3 events`): one
// request at a time, every reply matched by position after the `! ` event
// lines are set aside (unixapi/PROTOCOL.md, "Events"). It is the lab's
// own, so that the verification of EXTEND and of the lost signal depends on
// the protocol document alone, not on a client library.
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
}

// lineReply is one reply line and when it was read (Unix ns).
type lineReply struct {
	line string
	at   int64
}

// errLineClosed: the session ended (the sidecar closed it, or it broke);
// the sidecar then releases what it held.
var errLineClosed = errors.New("verify: sidecar session closed")

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
	r, _, _, err := lc.do(ctx, "HELLO 3 "+unixapi.HelloEvents)
	if err == nil && r != "HELLO 3 "+unixapi.HelloEvents {
		err = fmt.Errorf("verify: HELLO 3 events answered %q", r)
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
			ev, err := unixapi.ParseEvent([]byte(line))
			if err != nil {
				lc.err = fmt.Errorf("verify: bad event line %q: %w", line, err)
				lc.c.Close()
				return
			}
			if ev.Name == unixapi.EventLost && lc.onEvent != nil {
				lc.onEvent(ev, at)
			}
			continue
		}
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

// do sends one request line and returns its reply, when the request was
// sent (just before the write) and when the reply was read (Unix ns). If
// ctx ends first the session is closed (the reply could no longer be
// matched): errLineClosed wraps the outcome, which is unknown.
func (lc *lineConn) do(ctx context.Context, req string) (reply string, sent, got int64, err error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
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
