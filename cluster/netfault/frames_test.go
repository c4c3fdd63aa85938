package netfault

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"ticketing/cluster/wire"
)

// framesPair dials a loopback listener through f: the Frames side and the
// server's side.
func framesPair(t *testing.T, f *Frames) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	client, err = f.Dial(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case server = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("no connection accepted")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// frames encodes msgs back to back (one Write carries them all).
func frames(t *testing.T, msgs ...wire.Msg) []byte {
	t.Helper()
	var b []byte
	for i := range msgs {
		var err error
		if b, err = wire.AppendMsg(b, &msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// readMsgs reads n messages from r (c bounds the wait).
func readMsgs(t *testing.T, c net.Conn, r *wire.Reader, n int) []wire.Msg {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var out []wire.Msg
	for range n {
		var m wire.Msg
		if err := r.ReadMsg(&m); err != nil {
			t.Fatalf("after %d messages: %v", len(out), err)
		}
		out = append(out, m)
	}
	return out
}

func wantMsgs(t *testing.T, got []wire.Msg, want ...wire.Msg) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d messages, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Type != want[i].Type || got[i].ID != want[i].ID {
			t.Fatalf("message %d: %s %d, want %s %d", i, wire.TypeName(got[i].Type), got[i].ID,
				wire.TypeName(want[i].Type), want[i].ID)
		}
	}
}

var (
	ping1 = wire.Msg{Type: wire.TypePing, ID: 1}
	acq2  = wire.Msg{Type: wire.TypeAcquire, ID: 2, Key: "k", Owner: "o", Lease: 10}
	ping3 = wire.Msg{Type: wire.TypePing, ID: 3}
	ok1   = wire.Msg{Type: wire.TypeOK, ID: 1}
	g2    = wire.Msg{Type: wire.TypeGranted, ID: 2, Token: 7}
	ok3   = wire.Msg{Type: wire.TypeOK, ID: 3}
)

// isType is a rule acting on every frame of one type going one way.
func isType(dir Dir, typ byte, v Verdict) func(Frame) Verdict {
	return func(f Frame) Verdict {
		if f.Dir == dir && f.Msg.Type == typ {
			return v
		}
		return Pass
	}
}

// Drop loses the chosen frame alone, each way; the others, and frames that
// are no post-handshake message (a handshake's Hello), pass unchanged.
func TestFramesDrop(t *testing.T) {
	seen := make(chan Frame, 16)
	f := NewFrames(func(fr Frame) Verdict {
		seen <- fr
		if fr.Msg.ID == 2 {
			return Drop
		}
		return Pass
	})
	c, s := framesPair(t, f)
	hello, err := wire.AppendFrame(nil, wire.TypeHello, []byte("not a message"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(append(hello, frames(t, ping1, acq2, ping3)...)); err != nil {
		t.Fatal(err)
	}
	sr := wire.NewReader(s)
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, payload, err := sr.ReadFrame()
	if err != nil || typ != wire.TypeHello || string(payload) != "not a message" {
		t.Fatalf("hello: %q %q %v", typ, payload, err)
	}
	wantMsgs(t, readMsgs(t, s, sr, 2), ping1, ping3)
	if _, err := s.Write(frames(t, ok1, g2, ok3)); err != nil {
		t.Fatal(err)
	}
	wantMsgs(t, readMsgs(t, c, wire.NewReader(c), 2), ok1, ok3)
	fr := <-seen
	if fr.Conn != 1 || fr.Dir != Sent || fr.Msg.Type != wire.TypePing || fr.Addr == "" {
		t.Fatalf("first frame shown: %+v", fr)
	}
}

// Cut delivers what came before the frame, then loses it and closes the
// connection: the other end sees the end, the next read or write fails.
func TestFramesCut(t *testing.T) {
	t.Run("received", func(t *testing.T) {
		f := NewFrames(isType(Received, wire.TypeGranted, Cut))
		c, s := framesPair(t, f)
		if _, err := s.Write(frames(t, ok1, g2, ok3)); err != nil {
			t.Fatal(err)
		}
		cr := wire.NewReader(c)
		wantMsgs(t, readMsgs(t, c, cr, 1), ok1)
		var m wire.Msg
		if err := cr.ReadMsg(&m); !errors.Is(err, ErrFrameCut) {
			t.Fatalf("read after the cut: %+v %v, want ErrFrameCut", m, err)
		}
		s.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := s.Read(make([]byte, 1)); err == nil {
			t.Fatal("the server read from a cut connection")
		}
	})
	t.Run("sent", func(t *testing.T) {
		f := NewFrames(isType(Sent, wire.TypeAcquire, Cut))
		c, s := framesPair(t, f)
		b := frames(t, ping1, acq2, ping3)
		if n, err := c.Write(b); n != len(b) || err != nil {
			t.Fatalf("write with a cut frame: %d %v, want every byte reported written", n, err)
		}
		sr := wire.NewReader(s)
		wantMsgs(t, readMsgs(t, s, sr, 1), ping1)
		var m wire.Msg
		if err := sr.ReadMsg(&m); err == nil {
			t.Fatalf("the server read %+v after the cut", m)
		}
		if _, err := c.Write(frames(t, ping3)); !errors.Is(err, ErrFrameCut) {
			t.Fatalf("write after the cut: %v, want ErrFrameCut", err)
		}
	})
}

// Hold keeps the frame and what follows it back until Release, delivering
// what came before; frames held when the connection ends are lost.
func TestFramesHold(t *testing.T) {
	t.Run("sent", func(t *testing.T) {
		f := NewFrames(isType(Sent, wire.TypeAcquire, Hold))
		c, s := framesPair(t, f)
		wrote := make(chan error, 1)
		go func() { _, err := c.Write(frames(t, ping1, acq2, ping3)); wrote <- err }()
		sr := wire.NewReader(s)
		wantMsgs(t, readMsgs(t, s, sr, 1), ping1)
		select {
		case err := <-wrote:
			t.Fatalf("the write of a held frame returned (%v) before the release", err)
		default:
		}
		f.Release()
		wantMsgs(t, readMsgs(t, s, sr, 2), acq2, ping3)
		if err := <-wrote; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("received", func(t *testing.T) {
		f := NewFrames(isType(Received, wire.TypeGranted, Hold))
		c, s := framesPair(t, f)
		if _, err := s.Write(frames(t, ok1, g2, ok3)); err != nil {
			t.Fatal(err)
		}
		cr := wire.NewReader(c)
		wantMsgs(t, readMsgs(t, c, cr, 1), ok1)
		got := make(chan []wire.Msg, 1)
		go func() {
			var out []wire.Msg
			for range 2 {
				var m wire.Msg
				if cr.ReadMsg(&m) != nil {
					break
				}
				out = append(out, m)
			}
			got <- out
		}()
		select {
		case m := <-got:
			t.Fatalf("read %v past a held frame before the release", m)
		default:
		}
		f.Release()
		select {
		case m := <-got:
			wantMsgs(t, m, g2, ok3)
		case <-time.After(10 * time.Second):
			t.Fatal("held frames never delivered after the release")
		}
	})
	t.Run("lost with the connection", func(t *testing.T) {
		f := NewFrames(isType(Received, wire.TypeGranted, Hold))
		c, s := framesPair(t, f)
		if _, err := s.Write(frames(t, ok1, g2)); err != nil {
			t.Fatal(err)
		}
		cr := wire.NewReader(c)
		wantMsgs(t, readMsgs(t, c, cr, 1), ok1)
		read := make(chan error, 1)
		go func() { var m wire.Msg; read <- cr.ReadMsg(&m) }()
		s.Close() // the node stops with the G on its way
		select {
		case err := <-read:
			if err == nil {
				t.Fatal("the held frame was delivered after the connection ended")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a reader waiting behind a held frame never saw the connection end")
		}
		f.Release() // nothing left to deliver
	})
}
