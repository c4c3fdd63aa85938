package netfault

import (
	"context"
	"errors"
	"net"
	"sync"

	"ticketing/cluster/wire"
)

// ErrFrameCut is returned by reads and writes of a connection that a
// Frames rule cut.
var ErrFrameCut = errors.New("netfault: connection cut in front of a frame by fault injection")

// Dir is the direction a frame travels, seen from the dialler.
type Dir uint8

const (
	Sent     Dir = iota // dialler → server (requests)
	Received            // server → dialler (replies, events)
)

func (d Dir) String() string {
	if d == Sent {
		return "sent"
	}
	return "received"
}

// Frame is what a Frames rule is shown: one post-handshake frame on one
// connection, decoded by cluster/wire.
type Frame struct {
	Conn uint64 // the connection: 1 for the first one dialled, 2, ...
	Addr string // the address dialled
	Dir  Dir
	Msg  wire.Msg
}

// Verdict is a rule's decision on one frame.
type Verdict uint8

const (
	// Pass delivers the frame.
	Pass Verdict = iota
	// Drop loses the frame alone; the connection goes on. TCP never does
	// that, so it suits frames whose loss the protocol tolerates, or
	// tests of what a broken peer does.
	Drop
	// Cut loses the frame and everything after it in both directions, and
	// closes the connection: a network failure right after the sender
	// wrote it and before the receiver read it. Frames before it in the
	// same direction are delivered. A cut Write still reports every byte
	// written (they left the host); the next read or write fails.
	Cut
	// Hold holds the frame and everything after it in its direction back
	// until Frames.Release (then they are delivered; a frame held is not
	// shown to the rule again) or the connection closes (then they are
	// lost, as with a leader that stops while they are on their way).
	// Frames before it are delivered first.
	Hold
)

// Frames is a dialer whose connections read the frames going each way
// with cluster/wire and hand every post-handshake frame to a rule, which
// passes, drops, cuts or holds it: message-level faults ("the reply to
// this acquire is lost with its connection", "this request never reaches
// the leader", "hold every resume until the caller gave up") for tests of
// a sidecar's cluster connections (plug Dial into sidecar.Config.Dialer).
//
// Only plain TCP connections can be read: frames that do not decode as
// post-handshake messages (the handshake's) pass without the rule, and a
// stream that stops parsing as frames (TLS records, garbage) passes as it
// is from there on. Safe for concurrent use; the rule runs on the
// connections' reading and writing goroutines, concurrently for different
// connections and directions, and must not block (Hold instead).
type Frames struct {
	mu       sync.Mutex // a leaf
	rule     func(Frame) Verdict
	dials    uint64
	released chan struct{} // closed and replaced by Release
}

// NewFrames returns a Frames dialer applying rule (nil: pass everything).
func NewFrames(rule func(Frame) Verdict) *Frames {
	return &Frames{rule: rule, released: make(chan struct{})}
}

// SetRule replaces the rule for the frames read or written from now on.
func (f *Frames) SetRule(rule func(Frame) Verdict) {
	f.mu.Lock()
	f.rule = rule
	f.mu.Unlock()
}

// Release lets every held frame go (and what was held behind it).
func (f *Frames) Release() {
	f.mu.Lock()
	close(f.released)
	f.released = make(chan struct{})
	f.mu.Unlock()
}

// Dial dials like a net.Dialer and puts the connection under the rule.
func (f *Frames) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.dials++
	id := f.dials
	f.mu.Unlock()
	return &frameConn{Conn: c, f: f, id: id, addr: addr, closed: make(chan struct{})}, nil
}

// judge asks the rule about one complete frame (frames that are no
// post-handshake message pass), and returns with its verdict the channel
// the next Release closes, taken before the rule ran.
func (f *Frames) judge(c *frameConn, dir Dir, typ byte, payload []byte) (Verdict, <-chan struct{}) {
	f.mu.Lock()
	rule, released := f.rule, f.released
	f.mu.Unlock()
	if rule == nil {
		return Pass, released
	}
	var m wire.Msg
	if err := wire.DecodeMsg(typ, payload, &m); err != nil {
		return Pass, released
	}
	return rule(Frame{Conn: c.id, Addr: c.addr, Dir: dir, Msg: m}), released
}

// chunk is one read of the underlying connection.
type chunk struct {
	b   []byte
	err error
}

// frameConn is a connection under a Frames rule. Reads and writes each
// keep their own unparsed bytes; a frame is judged once it is complete.
type frameConn struct {
	net.Conn
	f    *Frames
	id   uint64
	addr string

	closeOnce sync.Once
	closed    chan struct{}
	cmu       sync.Mutex // guards cut
	cut       bool

	rmu   sync.Mutex // the read side
	rbuf  []byte     // received, not yet judged (a held frame at its head)
	rout  []byte     // judged and passed, not yet returned
	rheld int        // length of the held frame at rbuf's head; 0: none
	rrel  <-chan struct{}
	rraw  bool  // the stream stopped parsing as frames
	rerr  error // the read error, returned once rout is empty
	// pump reads the underlying connection once a received frame was
	// held, so that the connection's end is seen while the reader waits
	// for the release (the held frames are lost then).
	pump chan chunk

	wmu  sync.Mutex // the write side
	wbuf []byte     // written by the caller, an incomplete frame
	wraw bool
}

func (c *frameConn) isCut() bool {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	return c.cut
}

// cutNow closes the connection for a Cut verdict.
func (c *frameConn) cutNow() {
	c.cmu.Lock()
	c.cut = true
	c.cmu.Unlock()
	_ = c.Close() // the cut is the point: its error tells nothing
}

func (c *frameConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// startPump starts reading the underlying connection on a goroutine of its
// own (the handshake, which sets read deadlines, is over by then: only
// post-handshake frames are held). Requires rmu.
func (c *frameConn) startPump() {
	if c.pump != nil {
		return
	}
	c.pump = make(chan chunk, 16)
	go func() {
		for {
			buf := make([]byte, 4096)
			n, err := c.Conn.Read(buf)
			select {
			case c.pump <- chunk{buf[:n], err}:
			case <-c.closed:
				return
			}
			if err != nil {
				return
			}
		}
	}()
}

// received takes one read's bytes and error. Requires rmu.
func (c *frameConn) received(b []byte, err error) {
	c.rbuf = append(c.rbuf, b...)
	if err != nil && c.rheld > 0 {
		c.rerr, c.rbuf, c.rheld = err, nil, 0 // what was held is lost with the connection
		return
	}
	c.splitRead()
	if err != nil && c.rerr == nil {
		c.rerr = err
		if c.isCut() {
			c.rerr = ErrFrameCut
		}
	}
}

func (c *frameConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.rout) == 0 {
		if c.rerr != nil {
			return 0, c.rerr
		}
		if c.rheld > 0 {
			c.startPump()
			select {
			case <-c.rrel:
				c.rout = append(c.rout, c.rbuf[:c.rheld]...)
				c.rbuf, c.rheld = c.rbuf[c.rheld:], 0
				c.splitRead()
			case ch := <-c.pump:
				c.received(ch.b, ch.err)
			case <-c.closed:
				c.rerr, c.rbuf, c.rheld = net.ErrClosed, nil, 0
			}
			continue
		}
		if c.pump != nil {
			select {
			case ch := <-c.pump:
				c.received(ch.b, ch.err)
			case <-c.closed:
				c.rerr = net.ErrClosed
			}
			continue
		}
		buf := make([]byte, 4096)
		n, err := c.Conn.Read(buf)
		c.received(buf[:n], err)
	}
	n := copy(p, c.rout)
	c.rout = c.rout[n:]
	return n, nil
}

// splitRead judges the complete frames at rbuf's head, up to a held one.
// Requires rmu.
func (c *frameConn) splitRead() {
	for c.rerr == nil && c.rheld == 0 && len(c.rbuf) > 0 {
		if c.rraw {
			c.rout, c.rbuf = append(c.rout, c.rbuf...), nil
			return
		}
		typ, payload, n, err := wire.SplitFrame(c.rbuf)
		if err != nil {
			c.rraw = true
			continue
		}
		if n == 0 {
			return
		}
		v, rel := c.f.judge(c, Received, typ, payload)
		switch v {
		case Pass:
			c.rout = append(c.rout, c.rbuf[:n]...)
		case Drop:
		case Cut:
			c.rerr, c.rbuf = ErrFrameCut, nil
			c.cutNow()
			return
		case Hold:
			c.rheld, c.rrel = n, rel
			return
		}
		c.rbuf = c.rbuf[n:]
	}
}

// Write judges the frames p completes; it reports len(p) written once
// every byte is either sent, dropped, or lost to a cut.
func (c *frameConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.isCut() {
		return 0, ErrFrameCut
	}
	c.wbuf = append(c.wbuf, p...)
	var send []byte
	for len(c.wbuf) > 0 {
		if c.wraw {
			send, c.wbuf = append(send, c.wbuf...), nil
			break
		}
		typ, payload, n, err := wire.SplitFrame(c.wbuf)
		if err != nil {
			c.wraw = true
			continue
		}
		if n == 0 {
			break // an incomplete frame: the next Write completes it
		}
		frame := c.wbuf[:n]
		v, rel := c.f.judge(c, Sent, typ, payload)
		switch v {
		case Pass:
			send = append(send, frame...)
		case Drop:
		case Cut:
			if _, err := c.Conn.Write(send); err != nil {
				return 0, err
			}
			c.wbuf = nil
			c.cutNow()
			return len(p), nil
		case Hold:
			if _, err := c.Conn.Write(send); err != nil {
				return 0, err
			}
			send = nil
			select {
			case <-rel:
			case <-c.closed:
				c.wbuf = nil
				return 0, net.ErrClosed
			}
			send = append(send, frame...)
		}
		c.wbuf = c.wbuf[n:]
	}
	if len(send) > 0 {
		if _, err := c.Conn.Write(send); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}
