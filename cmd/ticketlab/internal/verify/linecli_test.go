package verify

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"ticketing/unixapi"
)

// fakeSidecar serves one unix session: it answers HELLO with hello, and
// every other request line with the lines script gives for it (by its
// request number n, HELLO being 1).
func fakeSidecar(t *testing.T, hello string, script func(n int, req string) []string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for n := 1; ; n++ {
			req, err := br.ReadString('\n')
			if err != nil {
				return
			}
			out := []string{hello}
			if n > 1 {
				out = script(n, strings.TrimSpace(req))
			}
			for _, line := range out {
				if _, err := c.Write([]byte(line + "\n")); err != nil {
					return
				}
			}
		}
	}()
	return path
}

type posRec struct {
	acq   int64
	place uint64
	key   string
	after bool
}

// lineConn asks for version 7, records each `! POSITION` for the request
// it names, and marks one read after that request's reply.
func TestLineConnRecordsPositions(t *testing.T) {
	path := fakeSidecar(t, "HELLO 7 events", func(n int, req string) []string {
		switch n {
		case 2: // ACQUIRE k: queued, told 2 then 1, granted; then a late place
			return []string{"! QUEUED 2 k", "! POSITION 2 2 - k", "! POSITION 2 1 3 k", "OK 9", "! POSITION 2 1 3 k"}
		default: // PING
			return []string{"PONG"}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lc, err := dialLine(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.close()
	if lc.agreed() != 7 {
		t.Fatalf("agreed %d, want 7", lc.agreed())
	}
	var mu sync.Mutex
	var got []posRec
	lc.positions(func(acq int64, ev unixapi.Event, at int64, after bool) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, posRec{acq, ev.Position, ev.Keys[0], after})
	})
	r, _, _, queued, err := lc.doAcquire(ctx, "ACQUIRE k 5 1.000", 42, nil)
	if err != nil || r != "OK 9" || queued == 0 {
		t.Fatalf("reply %q, queued %d, err %v", r, queued, err)
	}
	if r, _, _, err := lc.do(ctx, "PING"); err != nil || r != "PONG" {
		t.Fatalf("PING: %q %v", r, err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []posRec{{42, 2, "k", false}, {42, 1, "k", false}, {42, 1, "k", true}}
	if len(got) != len(want) {
		t.Fatalf("positions %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("positions %+v, want %+v", got, want)
		}
	}
}

// An older sidecar answers the highest version it speaks: the session
// works at it (and records it), and no place comes.
func TestLineConnFallsBackToAnOlderSidecar(t *testing.T) {
	for _, v := range []string{"4", "3"} {
		path := fakeSidecar(t, "HELLO "+v+" events", func(n int, req string) []string { return []string{"OK 1"} })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		lc, err := dialLine(ctx, path, nil)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if got := lc.agreed(); string(rune('0'+got)) != v {
			t.Fatalf("agreed %d, want %s", got, v)
		}
		lc.close()
		cancel()
	}
	path := fakeSidecar(t, "ERR bad_request", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := dialLine(ctx, path, nil); err == nil {
		t.Fatal("a HELLO answered ERR was taken")
	}
}

// The nodes get --position-interval only from builds that know it.
func TestPositionFlagOnlyForBuildsThatKnowIt(t *testing.T) {
	dir := t.TempDir()
	script := func(name, help string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\necho '"+help+"'\nexit 2\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	knows := script("new", "  -position-interval duration")
	old := script("old", "  -log-store kind")
	ctx := context.Background()
	cfg := Config{Binary: knows, Lab: knows, PositionInterval: 250 * time.Millisecond}
	if f := positionFlag(ctx, cfg); f != "--position-interval 250ms" {
		t.Fatalf("flag %q", f)
	}
	for _, c := range []Config{
		{Binary: old, Lab: knows, PositionInterval: time.Second},
		{Binary: knows, Lab: knows, NodeLab: old, PositionInterval: time.Second},
		{Binary: knows, Lab: knows, PositionInterval: -1},
		{Binary: knows, Lab: knows, PositionInterval: time.Second, NodeArgs: []string{"--position-interval=2s"}},
	} {
		if f := positionFlag(ctx, c); f != "" {
			t.Fatalf("%+v: flag %q, want none", c, f)
		}
	}
}
