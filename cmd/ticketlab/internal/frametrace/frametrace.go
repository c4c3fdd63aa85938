// Package frametrace timestamps, on a node, the moment it writes grants
// and lost events to its clients: the lab's window on the leader's apply
// of an expiry (issue 19's benchmark, `ticketlab bench extend`), without a
// hook in the shipped binary.
//
// `ticketlab node --frame-trace FILE` opens the node's client listener
// itself and hands the node a listener whose connections look at every
// Write the node makes: each G (grant) and X (lost) frame in it is recorded
// with the wall-clock time of the Write, and the records are appended to
// FILE as text lines. The leader produces the X of an expiry and the G of
// the hand-off that follows it in one apply (cluster/leader, Core.Applied:
// tellLost, then the grant of the next waiter), appends both to their
// connections' buffers under the node's lock and wakes each connection's
// writer goroutine, which writes them; so the Write's time is the apply's
// plus the writer's wake-up and the frame's encoding (microseconds), the
// closest a seam outside the cluster package gets to the apply. The
// stream must be plaintext (no --tls-cert): under TLS the listener would
// see ciphertext.
package frametrace

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/wire"
)

// Rec is one traced frame: its type (wire.TypeGranted or wire.TypeLost),
// the token it carries, and when the node wrote it (Unix ns).
type Rec struct {
	Type  byte
	Token uint64
	At    int64
}

// ErrTLS: the client port is TLS, whose stream the trace cannot read.
var ErrTLS = errors.New("frametrace: the client port uses TLS; the frame trace needs a plaintext client port")

// Setup makes cfg's node trace its client connections into path (created
// or truncated). The trace is flushed every 50 ms and when ctx ends.
func Setup(ctx context.Context, cfg *cluster.Config, path string, log *slog.Logger) error {
	if cfg.ClientTLS != nil {
		return ErrTLS
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	ln := cfg.ClientListener
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.ClientAddr); err != nil {
			f.Close()
			return err
		}
	}
	t := &tracer{w: bufio.NewWriter(f), log: log}
	cfg.ClientListener = &listener{Listener: ln, t: t}
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				t.flush()
			case <-ctx.Done():
				t.flush()
				f.Close()
				return
			}
		}
	}()
	log.Warn("frame trace on: every grant and lost event written to a client is timestamped into a file (lab only)", "file", path)
	return nil
}

type tracer struct {
	mu  sync.Mutex
	buf []Rec
	w   *bufio.Writer
	log *slog.Logger
}

func (t *tracer) add(recs []Rec) {
	t.mu.Lock()
	t.buf = append(t.buf, recs...)
	t.mu.Unlock()
}

func (t *tracer) flush() {
	t.mu.Lock()
	recs := t.buf
	t.buf = nil
	t.mu.Unlock()
	for _, r := range recs {
		_, _ = fmt.Fprintf(t.w, "%c %d %d\n", r.Type, r.Token, r.At) // bufio.Writer keeps its first error for Flush
	}
	if err := t.w.Flush(); err != nil {
		t.log.Warn("frame trace: write failed; the trace is incomplete", "err", err)
	}
}

type listener struct {
	net.Listener
	t *tracer
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, t: l.t}, nil
}

// conn parses the frames the node writes (they are whole frames, the
// handshake's included, in the wire's length-prefixed framing) and
// records the G and X among them. It never changes what is written.
type conn struct {
	net.Conn
	t       *tracer
	mu      sync.Mutex // the handshake and the writer goroutine write in turn
	pending []byte     // the start of a frame split across Writes
	broken  bool       // not the wire's framing: stop looking
	recs    []Rec
}

func (c *conn) Write(b []byte) (int, error) {
	at := time.Now().UnixNano()
	c.mu.Lock()
	if !c.broken {
		c.scan(b, at)
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *conn) scan(b []byte, at int64) {
	data := b
	if len(c.pending) > 0 {
		c.pending = append(c.pending, b...)
		data = c.pending
	}
	c.recs = c.recs[:0]
	for {
		typ, payload, n, err := wire.SplitFrame(data)
		if err != nil {
			c.broken = true
			return
		}
		if n == 0 {
			break
		}
		if (typ == wire.TypeGranted || typ == wire.TypeLost) && len(payload) >= 16 {
			// G: id u64 | token u64; X: id u64 (0) | token u64 | ...
			c.recs = append(c.recs, Rec{Type: typ, Token: binary.BigEndian.Uint64(payload[8:16]), At: at})
		}
		data = data[n:]
	}
	c.pending = append(c.pending[:0], data...)
	if len(c.recs) > 0 {
		c.t.add(c.recs)
	}
}

// Read reads a trace file.
func Read(path string) ([]Rec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Rec
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 || len(fs[0]) != 1 {
			return nil, fmt.Errorf("frametrace: %s: bad line %q", path, sc.Text())
		}
		tok, err1 := strconv.ParseUint(fs[1], 10, 64)
		at, err2 := strconv.ParseInt(fs[2], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("frametrace: %s: bad line %q", path, sc.Text())
		}
		out = append(out, Rec{Type: fs[0][0], Token: tok, At: at})
	}
	return out, sc.Err()
}
