package ticketing

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Issue 39 (attack round 5): Client.Close fires the lost signal of the
// Locks registered when it runs (lostAll), then closes the socket; but the
// reader goes on with the grant lines already read (its bufio buffer)
// after lostAll: each makes a new Lock, registers it in a fresh map and
// hands it to its caller, not lost, while the sidecar has already seen the
// close (and releases that session's locks, handing the keys on). Their
// lost signal fires only when the reader reaches the end of the stream
// (its own lostAll), after the sidecar saw the close: a holder told it
// holds a key, told of its loss only after the sidecar released it.
// Fixed: once lostAll ran, a grant read makes a Lock lost at once
// (LostDisconnected), before it is returned.
func TestGrantReadDuringCloseIsToldLost(t *testing.T) {
	for round := 0; round < 20; round++ {
		if bad := closeRace(t, 200); bad != "" {
			t.Fatalf("round %d: %s", round, bad)
		}
	}
}

func closeRace(t *testing.T, n int) string {
	cc, sc := net.Pipe()
	defer sc.Close()
	var eof atomic.Bool
	acq := make(chan string, n+1)
	go func() {
		br := bufio.NewReader(sc)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				eof.Store(true) // the sidecar's view: closed; it releases the session's locks now
				return
			}
			acq <- strings.TrimSuffix(line, "\n")
		}
	}()
	c, err := newClient(cc)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-acq; got != "HELLO 9 events" {
		t.Fatalf("first line %q", got)
	}
	go pipeWrite(sc, "HELLO 5 events\n")
	var returned atomic.Int32
	var mu sync.Mutex
	var bad string
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Lock(context.Background(), fmt.Sprintf("k%d", i), 30*time.Second, 0)
			if err != nil {
				return
			}
			returned.Add(1)
			if eof.Load() && !isLost(l) {
				mu.Lock()
				if bad == "" {
					bad = fmt.Sprintf("Lock %v (token %d) returned held, lost signal not fired, after the sidecar saw the connection close (and releases it)", l.Keys(), l.Token())
				}
				mu.Unlock()
			}
		}()
	}
	for range n {
		<-acq
	}
	var out strings.Builder
	for i := range n {
		fmt.Fprintf(&out, "OK %d\n", 1000+i)
	}
	go pipeWrite(sc, out.String())
	for returned.Load() < int32(n/4) {
		time.Sleep(10 * time.Microsecond)
	}
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	wg.Wait()
	return bad
}

// pipeWrite writes s to the fake sidecar's end; an error (the client closed
// the pipe first) is no matter: the test reads what the client saw.
func pipeWrite(c net.Conn, s string) {
	_, _ = c.Write([]byte(s))
}
