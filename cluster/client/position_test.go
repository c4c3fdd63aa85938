package client

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/wire"
)

// Places in line (R, version 12): every R of a queued acquire reaches its
// Position hook, in order, and leaves the call in flight; its final reply
// completes it.
func TestPositionHookBeforeTheReply(t *testing.T) {
	ids := make(chan uint64, 1)
	s := newFakeServer(t, func(sc *srvConn, m wire.Msg) {
		switch m.Type {
		case wire.TypeAcquire:
			sc.reply(t, wire.Msg{Type: wire.TypeQueued, ID: m.ID})
			sc.reply(t, wire.Msg{Type: wire.TypePosition, ID: m.ID, Position: 3, EstimateMs: wire.EstimateUnknown, Key: m.Key})
			sc.reply(t, wire.Msg{Type: wire.TypePosition, ID: m.ID, Position: 2, EstimateMs: 4000, Key: m.Key})
			ids <- m.ID
		case wire.TypePing:
			sc.reply(t, wire.Msg{Type: wire.TypePong, ID: m.ID})
		case wire.TypeWatchPositions:
			sc.reply(t, wire.Msg{Type: wire.TypeOK, ID: m.ID})
		}
	})
	c := s.dial(t)
	if c.Peer().Version < wire.VersionPositions {
		t.Fatalf("negotiated version %d", c.Peer().Version)
	}
	if w, err := c.WatchPositions(); err != nil {
		t.Fatal(err)
	} else if <-w.Done; w.Err != nil || w.Reply.Type != wire.TypeOK {
		t.Fatalf("w: %+v %v", w.Reply, w.Err)
	}
	var mu sync.Mutex
	var got []wire.Msg
	h := newHookLog()
	hooks := h.hooks("a")
	hooks.Position = func(_ *Call, pos wire.Msg) {
		mu.Lock()
		got = append(got, pos)
		mu.Unlock()
	}
	call, err := c.StartFunc(acquire("k"), hooks)
	if err != nil {
		t.Fatal(err)
	}
	id := <-ids
	if r, _, err := c.Do(context.Background(), wire.Msg{Type: wire.TypePing}); err != nil || r.Type != wire.TypePong {
		t.Fatalf("ping: %+v %v", r, err)
	}
	mu.Lock()
	if len(got) != 2 || got[0].Position != 3 || got[0].EstimateMs != wire.EstimateUnknown || got[1].Position != 2 ||
		got[1].EstimateMs != 4000 || got[1].Key != "k" || got[1].ID != id {
		t.Fatalf("positions %+v", got)
	}
	mu.Unlock()
	if c.InFlight() != 1 {
		t.Fatalf("%d in flight after R, want the acquire still in flight", c.InFlight())
	}
	sc := <-s.conns
	s.conns <- sc
	sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: id, Token: 7})
	if done := h.wait(t); done != call || call.Reply.Type != wire.TypeGranted {
		t.Fatalf("call %+v", call)
	}
}

// A connection older than version 12 never asks: WatchPositions sends
// nothing and says not supported (an older node would close the
// connection on an unknown frame).
func TestWatchPositionsNotOnAnOlderConnection(t *testing.T) {
	s := newFakeServerV(t, wire.VersionPositions-1, func(sc *srvConn, m wire.Msg) {
		t.Errorf("the node read %s", wire.TypeName(m.Type))
	})
	c := s.dial(t)
	if _, err := c.WatchPositions(); !errors.Is(err, wire.ErrNotSupported) {
		t.Fatalf("WatchPositions on a version %d connection: %v, want ErrNotSupported", c.Peer().Version, err)
	}
	if c.InFlight() != 0 {
		t.Fatalf("%d in flight", c.InFlight())
	}
}

// R frames the protocol does not allow close the connection: on a
// version 11 connection, for a request other than an acquire, for an id
// not in flight, and after the acquire's reply.
func TestPositionProtocolViolations(t *testing.T) {
	pos := func(id uint64) wire.Msg {
		return wire.Msg{Type: wire.TypePosition, ID: id, Position: 1, EstimateMs: 10, Key: "k"}
	}
	for _, tc := range []struct {
		name    string
		version uint16
		req     wire.Msg
		reply   func(sc *srvConn, m wire.Msg)
	}{
		{"on a version 11 connection", wire.VersionPositions - 1, acquire("k"), func(sc *srvConn, m wire.Msg) {
			sc.reply(t, pos(m.ID))
		}},
		{"for a ping", 0, wire.Msg{Type: wire.TypePing}, func(sc *srvConn, m wire.Msg) {
			sc.reply(t, pos(m.ID))
		}},
		{"unknown id", 0, acquire("k"), func(sc *srvConn, m wire.Msg) {
			sc.reply(t, pos(m.ID+100))
		}},
		{"after the reply", 0, acquire("k"), func(sc *srvConn, m wire.Msg) {
			sc.reply(t, wire.Msg{Type: wire.TypeGranted, ID: m.ID, Token: 1})
			sc.reply(t, pos(m.ID))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newFakeServerV(t, tc.version, tc.reply)
			c := s.dial(t)
			h := newHookLog()
			if _, err := c.StartFunc(tc.req, h.hooks("x")); err != nil {
				t.Fatal(err)
			}
			select {
			case <-c.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("connection not closed")
			}
			if !errors.Is(c.Err(), ErrProtocol) {
				t.Fatalf("Err %v, want ErrProtocol", c.Err())
			}
			h.wait(t)
		})
	}
}
