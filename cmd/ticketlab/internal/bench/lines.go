package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"ticketing/unixapi"
)

// lineClient is a raw unix-socket session with a sidecar speaking version
// 3 of the local API with events on (`HELLO 3 events`): one request at a
// time, replies matched by position after the `! ` event lines are set
// aside (unixapi/PROTOCOL.md, "Events"), each line stamped with the wall
// clock the moment it is read. The lab's own, so that the extend benchmark
// depends on the protocol document, not on a client library.
type lineClient struct {
	c       net.Conn
	replies chan stamped
	events  chan stampedEvent
	done    chan struct{}
}

type stamped struct {
	line string
	at   time.Time
}

type stampedEvent struct {
	ev unixapi.Event
	at time.Time
}

// errSessionEnded: the sidecar closed the session, or it broke.
var errSessionEnded = errors.New("bench: sidecar session ended")

func dialLines(ctx context.Context, path string) (*lineClient, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	lc := &lineClient{c: c, replies: make(chan stamped, 1), events: make(chan stampedEvent, 64), done: make(chan struct{})}
	go lc.read()
	if r, _, err := lc.do(ctx, "HELLO 3 events"); err != nil || r != "HELLO 3 events" {
		lc.close()
		return nil, fmt.Errorf("bench: HELLO 3 events answered %q (%v): the sidecar does not speak version 3", r, err)
	}
	return lc, nil
}

func (lc *lineClient) read() {
	defer close(lc.done)
	br := bufio.NewReader(lc.c)
	for {
		line, err := br.ReadString('\n')
		at := time.Now()
		if err != nil {
			return
		}
		line = strings.TrimSuffix(line, "\n")
		if unixapi.IsEvent([]byte(line)) {
			if ev, err := unixapi.ParseEvent([]byte(line)); err == nil && ev.Name == unixapi.EventLost {
				select {
				case lc.events <- stampedEvent{ev, at}:
				default: // nobody is looking: drop it
				}
			}
			continue
		}
		select {
		case lc.replies <- stamped{line, at}:
		case <-time.After(10 * time.Second):
			lc.c.Close() // a reply nobody asked for
			return
		}
	}
}

// do sends req and returns its reply and when it was read.
func (lc *lineClient) do(ctx context.Context, req string) (string, time.Time, error) {
	if _, err := lc.c.Write([]byte(req + "\n")); err != nil {
		return "", time.Time{}, fmt.Errorf("%w: %v", errSessionEnded, err)
	}
	select {
	case r := <-lc.replies:
		return r.line, r.at, nil
	case <-lc.done:
		return "", time.Time{}, errSessionEnded
	case <-ctx.Done():
		lc.c.Close()
		return "", time.Time{}, ctx.Err()
	}
}

// event waits for the next LOST event.
func (lc *lineClient) event(ctx context.Context, d time.Duration) (stampedEvent, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case ev := <-lc.events:
		return ev, nil
	case <-lc.done:
		return stampedEvent{}, errSessionEnded
	case <-t.C:
		return stampedEvent{}, fmt.Errorf("bench: no `! LOST` event within %v", d)
	case <-ctx.Done():
		return stampedEvent{}, ctx.Err()
	}
}

func (lc *lineClient) close() {
	lc.c.Close()
	<-lc.done
}
