package main

// Attack round 41 (semaphores and places in line) on real `ticketing node`
// processes over TCP and a real `ticketing sidecar` on a unix socket.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/localproc"
)

// a41Line is one raw unix connection to the sidecar: lines written and
// read one at a time.
type a41Line struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func a41Dial(t *testing.T, sock string) *a41Line {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &a41Line{t: t, c: c, br: bufio.NewReader(c)}
}

func (l *a41Line) send(s string) {
	l.t.Helper()
	if _, err := l.c.Write([]byte(s + "\n")); err != nil {
		l.t.Fatal(err)
	}
}

// read returns the next line (events included), or "" on timeout/EOF.
func (l *a41Line) read(d time.Duration) string {
	l.c.SetReadDeadline(time.Now().Add(d))
	s, err := l.br.ReadString('\n')
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(s, "\n")
}

// reply returns the next line that is not an event.
func (l *a41Line) reply(d time.Duration) string {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		s := l.read(time.Until(end))
		if !strings.HasPrefix(s, "!") {
			return s
		}
	}
	return ""
}

// a41Procs starts three node processes with extra node flags and one
// sidecar process, and waits until the sidecar reaches a leader.
func a41Procs(t *testing.T, nodeArgs ...string) (*localproc.Procs, string) {
	t.Helper()
	sockDir := t.TempDir()
	p, err := localproc.Start(localproc.Options{Binary: binary, Dir: t.TempDir(), SocketDir: sockDir, Sidecars: 1,
		ExtraArgs: append([]string{"--log-level", "warn"}, nodeArgs...)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := ticketing.WaitReady(ctx, p.SidecarSocket(0)); err != nil {
		t.Fatal(err)
	}
	return p, p.SidecarSocket(0)
}

// a41SetPermits sends PERMITS key n until it is not "not_supported" (the
// cluster version reaches 13 a moment after the first election).
func a41SetPermits(t *testing.T, l *a41Line, key string, n int) string {
	t.Helper()
	for range 200 {
		l.send(fmt.Sprintf("PERMITS %s %d", key, n))
		r := l.reply(30 * time.Second)
		if !strings.Contains(r, "not_supported") && !strings.Contains(r, "unavailable") {
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("PERMITS never supported")
	return ""
}

// Finding: --max-keys bounds "holdings" (keys held, semaphores and permits
// held), and a permit acquire counts as a new holding at admission. But a
// permit acquire that QUEUES is not counted once it is applied (only
// held permits are), and raising n with PERMITS turns every queued permit
// waiter into a held permit in one command, with no bound at all. So any
// client of the socket can push the table past --max-keys: define a
// semaphore of 1, hold it, queue waiters one after the other (each
// admitted: 2 holdings + 1 <= 4, and once queued it no longer counts),
// raise n: every waiter is granted. With k semaphores and
// --max-waiters-per-key W that is about k*W permits where --max-keys
// promised at most max-keys holdings.
func TestAttack41RaisingPermitsOvershootsMaxKeys(t *testing.T) {
	const maxKeys = 4
	_, sock := a41Procs(t, "--max-keys", strconv.Itoa(maxKeys))
	op := a41Dial(t, sock)
	if r := a41SetPermits(t, op, "s", 1); r != "OK" {
		t.Fatalf("PERMITS s 1: %q", r)
	}
	op.send("PERMIT s 120 0")
	if r := op.reply(30 * time.Second); !strings.HasPrefix(r, "OK ") {
		t.Fatalf("first permit: %q", r)
	}
	held := 1
	n := 1
	for round := range 1 {
		const waiters = 6
		var ws []*a41Line
		for i := range waiters {
			w := a41Dial(t, sock)
			w.send("HELLO 7 events")
			if r := w.read(30 * time.Second); r != "HELLO 7 events" {
				t.Fatalf("HELLO: %q", r)
			}
			w.send("PERMIT s 120 60")
			if r := w.read(30 * time.Second); !strings.HasPrefix(r, "! QUEUED 2") {
				t.Fatalf("round %d waiter %d: %q, want ! QUEUED (admitted as a waiter)", round, i, r)
			}
			ws = append(ws, w)
		}
		n += waiters
		if r := a41SetPermits(t, op, "s", n); r != "OK" {
			t.Fatalf("PERMITS s %d: %q", n, r)
		}
		for i, w := range ws {
			r := w.reply(30 * time.Second)
			if !strings.HasPrefix(r, "OK ") {
				t.Fatalf("round %d waiter %d after the raise: %q", round, i, r)
			}
			held++
		}
		t.Logf("round %d: %d permits held + 1 semaphore = %d holdings, --max-keys %d", round, held, held+1, maxKeys)
	}
	// The table says it is full: a fresh lock is refused as too_many_keys.
	op.send("ACQUIRE lock 60 0")
	t.Logf("a fresh lock now: %q", op.reply(30*time.Second))
	if held+1 > maxKeys {
		t.Fatalf("%d permits held on one semaphore (+1 definition = %d holdings) with --max-keys %d: "+
			"raising n grants queued waiters past the bound", held, held+1, maxKeys)
	}
}
