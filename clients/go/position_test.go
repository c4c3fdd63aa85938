package ticketing

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// posLog is a WithPosition hook that records what it is called with.
type posLog struct {
	mu  sync.Mutex
	got []Position
}

func (p *posLog) hook() AcquireOption {
	return WithPosition(func(x Position) {
		p.mu.Lock()
		p.got = append(p.got, x)
		p.mu.Unlock()
	})
}

func (p *posLog) get() []Position {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

func pos(key string, place int, estimate int) Position {
	if estimate < 0 {
		return Position{Key: key, Position: place}
	}
	return Position{Key: key, Position: place, Estimate: time.Duration(estimate) * time.Second, EstimateKnown: true}
}

func waitPositions(t *testing.T, p *posLog, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(p.get()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("hook got %v, want %d calls", p.get(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// "! POSITION <n> <position> <estimate|-> <key>" reaches the WithPosition
// hook of the ACQUIRE written n-th (the HELLO is line 1): every line, in
// the order sent, a "-" estimate as unknown, and only before that acquire
// returns. Lines naming another request, another key, and malformed lines
// are ignored without shifting the replies.
func TestPositionRoutedByRequestNumber(t *testing.T) {
	c, f := pipeClient(t, "HELLO 7 events")
	ctx := context.Background()
	var first, second posLog
	r1 := async(func() error {
		_, err := c.Acquire(ctx, "k", 30*time.Second, 60*time.Second, first.hook())
		return err
	})
	if r := f.req(); r != "ACQUIRE k 30 60.000" {
		t.Fatalf("request %q", r)
	}
	r2 := async(func() lockRes {
		l, err := c.Lock(ctx, "k", 30*time.Second, 60*time.Second, second.hook())
		return lockRes{l, err}
	})
	if r := f.req(); r != "ACQUIRE k 30 60.000" {
		t.Fatalf("request %q", r)
	}
	f.write("! QUEUED 2 k", "! POSITION 2 12 34 k", "! POSITION 3 13 - k",
		// Malformed or not ours: ignored, and never taken for a reply.
		"! POSITION 2 0 5 k", "! POSITION 0 1 5 k", "! POSITION 2 1 5", "! POSITION 2 1 5 k extra",
		"! POSITION 2 x 5 k", "! POSITION 2 1 -5 k", "! POSITION 2 +1 5 k", "! POSITION 2 1 5.5 k",
		"! POSITION 2 1 99999999999999999999 k", "! POSITION 2 1  k", "!  POSITION 2 1 5 k", "! position 2 1 5 k",
		"! POSITION 2 1 5 k ", "! POSITION 2 1 5 other", "! POSITION 9 1 5 k", "! POSITION 2 1 5 k\tk",
		"! POSITION 2 3 - k", "! POSITION 2 1 0 k", "! POSITION 3 2 7 k")
	waitPositions(t, &second, 2)
	waitPositions(t, &first, 3)
	want1 := []Position{pos("k", 12, 34), pos("k", 3, -1), pos("k", 1, 0)}
	if got := first.get(); !slices.Equal(got, want1) {
		t.Fatalf("first hook got %v, want %v", got, want1)
	}
	f.write("OK 5")
	if err := recv(t, r1); err != nil {
		t.Fatal(err)
	}
	// After its reply nothing reaches the hook, though the second, still
	// waiting, still gets its own.
	f.write("! POSITION 2 1 0 k", "! POSITION 3 1 3 k", "TIMEOUT")
	if res := recv(t, r2); !errors.Is(res.err, ErrTimeout) {
		t.Fatalf("Lock: %v, want ErrTimeout", res.err)
	}
	f.write("! POSITION 3 1 1 k")
	pong := async(func() error { return c.Ping(ctx) })
	f.req()
	f.write("PONG")
	if err := recv(t, pong); err != nil {
		t.Fatal(err)
	}
	want2 := []Position{pos("k", 13, -1), pos("k", 2, 7), pos("k", 1, 3)}
	if got := first.get(); !slices.Equal(got, want1) {
		t.Fatalf("first hook got %v after its reply, want %v", got, want1)
	}
	if got := second.get(); !slices.Equal(got, want2) {
		t.Fatalf("second hook got %v, want %v", got, want2)
	}
}

// A block waits in each key's line and is told its place in each: one
// Position per key, named by its Key; a key not of the block is ignored.
// WithQueued and WithPosition on one acquire each get their own events.
func TestPositionBlockPerKey(t *testing.T) {
	c, f := pipeClient(t, "HELLO 7 events")
	var p posLog
	var q counter
	rb := async(func() lockRes {
		l, err := c.LockBlock(context.Background(), []string{"b", "a"}, 30*time.Second, 10*time.Second, p.hook(), q.hook())
		return lockRes{l, err}
	})
	if r := f.req(); r != "ACQUIRE b a 30 10.000" {
		t.Fatalf("request %q", r)
	}
	f.write("! QUEUED 2 b a", "! POSITION 2 4 - b", "! POSITION 2 2 - a", "! POSITION 2 1 5 c",
		"! QUEUED 2 b a", "! POSITION 2 1 2 a", "OK 9")
	res := recv(t, rb)
	if res.err != nil || res.l.Token() != 9 {
		t.Fatalf("LockBlock: %v", res.err)
	}
	want := []Position{pos("b", 4, -1), pos("a", 2, -1), pos("a", 1, 2)}
	if got := p.get(); !slices.Equal(got, want) || q.get() != 1 {
		t.Fatalf("positions %v (want %v), queued hook ran %d times (want 1)", got, want, q.get())
	}
}

// An acquire whose ctx ended gets no Position from then on, though its
// request is still pending at the sidecar.
func TestPositionGivenUp(t *testing.T) {
	c, f := pipeClient(t, "HELLO 7 events")
	var p posLog
	ctx, cancel := context.WithCancel(context.Background())
	r := async(func() error {
		_, err := c.Acquire(ctx, "k", 30*time.Second, 10*time.Second, p.hook())
		return err
	})
	f.req()
	f.write("! POSITION 2 2 - k")
	waitPositions(t, &p, 1)
	cancel()
	if err := recv(t, r); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire: %v, want context.Canceled", err)
	}
	f.write("! POSITION 2 1 1 k", "TIMEOUT")
	pong := async(func() error { return c.Ping(context.Background()) })
	f.req()
	f.write("PONG")
	if err := recv(t, pong); err != nil {
		t.Fatal(err)
	}
	if got := p.get(); !slices.Equal(got, []Position{pos("k", 2, -1)}) {
		t.Fatalf("hook got %v", got)
	}
}

// The Client asks for version 9 (pipeClient checks "HELLO 9 events"); a
// version-6 sidecar's answer is taken as it was before: version 6, events
// on, QUEUED still reported, and an acquire with WithPosition works (it
// simply gets no positions).
func TestPositionVersion6Sidecar(t *testing.T) {
	c, f := pipeClient(t, "HELLO 6 events")
	ctx := context.Background()
	if v, err := c.Hello(ctx); v != 6 || err != nil {
		t.Fatalf("Hello: %d, %v", v, err)
	}
	var p posLog
	var q counter
	r := async(func() error {
		_, err := c.Acquire(ctx, "k", 30*time.Second, 10*time.Second, p.hook(), q.hook())
		return err
	})
	f.req()
	f.write("! QUEUED 2 k", "OK 3")
	if err := recv(t, r); err != nil || q.get() != 1 || len(p.get()) != 0 {
		t.Fatalf("Acquire: %v, queued %d, positions %v", err, q.get(), p.get())
	}
}

func TestParsePosition(t *testing.T) {
	for _, tc := range []struct {
		line string
		n    uint64
		want Position
		ok   bool
	}{
		{"! POSITION 2 12 34 k", 2, pos("k", 12, 34), true},
		{"! POSITION 18446744073709551615 1 - a:b/c", 18446744073709551615, pos("a:b/c", 1, -1), true},
		{"! POSITION 7 9223372036854775807 9223372036 k", 7, pos("k", 9223372036854775807, 9223372036), true},
		{"! POSITION 7 9223372036854775808 1 k", 0, Position{}, false},
		{"! POSITION 7 1 9223372037 k", 0, Position{}, false}, // beyond a time.Duration
		{"! POSITION 7 1 - ", 0, Position{}, false},
		{"! POSITION 7 1 k", 0, Position{}, false},
		{"! POSITION 7 1 -- k", 0, Position{}, false},
		{"! QUEUED 7 k", 0, Position{}, false},
	} {
		n, got, ok := parsePosition(tc.line)
		if ok != tc.ok || n != tc.n || got != tc.want {
			t.Errorf("parsePosition(%q) = %d, %v, %v; want %d, %v, %v", tc.line, n, got, ok, tc.n, tc.want, tc.ok)
		}
	}
}
