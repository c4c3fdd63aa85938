package unixapi_test

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"ticketing/unixapi"
)

// Many connections pipeline mixed verbs (lazy PING/INFO/HELD, ACQUIRE with
// and without a wait, RELEASE and EXTEND refused by name, unknown verbs
// that name themselves) with events on, write them in random pieces, and
// stop reading for a while now and then so that replies pile up against a
// full socket (direct writes cut short, the rest carried to the writer).
// Every request gets exactly one reply, in request order, whole; event
// lines sit between whole lines, and a QUEUED comes before its ACQUIRE's
// reply.
func TestPipelinedMixedVerbsUnderStalledReads(t *testing.T) {
	s := serve(t, func(cfg *unixapi.Config) { cfg.RefusalRate = -1 })
	shared := key(t)
	const conns, reqs = 6, 500
	var wg sync.WaitGroup
	for ci := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipelineOne(t, s, ci, shared, reqs)
		}()
	}
	wg.Wait()
}

type expectFn func(line string) bool

func pipelineOne(t *testing.T, s *unixapi.Server, ci int, shared string, reqs int) {
	rng := rand.New(rand.NewPCG(uint64(ci), uint64(time.Now().UnixNano())))
	c, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Error(err)
		return
	}
	defer c.Close()
	own := fmt.Sprintf("%s/c%d", shared, ci)
	lines := []string{"HELLO 4 events"}
	want := []expectFn{func(l string) bool { return l == "HELLO 4 events" }}
	isAcq := []bool{false}
	for i := range reqs {
		switch rng.IntN(9) {
		case 0:
			lines = append(lines, "PING")
			want = append(want, func(l string) bool { return l == "PONG" })
		case 1:
			lines = append(lines, "INFO")
			want = append(want, func(l string) bool { return strings.HasPrefix(l, "INFO cluster=") })
		case 2:
			lines = append(lines, "HELD")
			want = append(want, func(l string) bool { return strings.HasPrefix(l, "HELD ") })
		case 3:
			v := fmt.Sprintf("FROB%dx%d", ci, i)
			lines = append(lines, v)
			want = append(want, func(l string) bool {
				return strings.HasPrefix(l, "ERR unknown_verb ") && strings.Contains(l, `"`+v+`"`)
			})
		case 4:
			k := fmt.Sprintf("%s/r%d", own, i)
			tok := fmt.Sprintf(" token %d", 100000+i)
			lines = append(lines, fmt.Sprintf("RELEASE %s %d", k, 100000+i))
			want = append(want, func(l string) bool { return strings.HasPrefix(l, "ERR not_held ") && strings.HasSuffix(l, tok) })
		case 5:
			k := fmt.Sprintf("%s/e%d", own, i)
			tok := fmt.Sprintf(" token %d", 100000+i)
			lines = append(lines, fmt.Sprintf("EXTEND %s %d 5", k, 100000+i))
			want = append(want, func(l string) bool { return strings.HasPrefix(l, "ERR not_held ") && strings.HasSuffix(l, tok) })
		case 6, 7:
			lines = append(lines, fmt.Sprintf("ACQUIRE %s/a%d 3 0", own, i))
			want = append(want, func(l string) bool { return strings.HasPrefix(l, "OK ") || strings.HasPrefix(l, "ERR ") })
		case 8:
			lines = append(lines, "ACQUIRE "+shared+" 1 1")
			want = append(want, func(l string) bool {
				return strings.HasPrefix(l, "OK ") || l == "TIMEOUT" || l == "BUSY" || strings.HasPrefix(l, "ERR ")
			})
		}
		isAcq = append(isAcq, strings.HasPrefix(lines[len(lines)-1], "ACQUIRE"))
	}
	runScript(t, c, ci, rng, lines, want, isAcq, 0)
}

// runScript writes lines in random pieces while it reads the replies (not
// before initialStall has passed) and checks them against want.
func runScript(t *testing.T, c net.Conn, ci int, rng *rand.Rand, lines []string, want []expectFn, isAcq []bool, initialStall time.Duration) {
	runScriptPaced(t, c, ci, rng, lines, want, isAcq, initialStall, 0)
}

// runScriptPaced is runScript, except that with burst > 0 the first burst
// lines go at once and each later one alone, 2 ms after the one before, a
// second after the burst.
func runScriptPaced(t *testing.T, c net.Conn, ci int, rng *rand.Rand, lines []string, want []expectFn, isAcq []bool, initialStall time.Duration, burst int) {
	var pieces [][]byte
	if burst > 0 {
		pieces = append(pieces, []byte(strings.Join(lines[:burst], "\n")+"\n"))
		for _, l := range lines[burst:] {
			pieces = append(pieces, []byte(l+"\n"))
		}
	} else {
		data := []byte(strings.Join(lines, "\n") + "\n")
		for len(data) > 0 {
			n := min(len(data), 1+rng.IntN(700))
			pieces = append(pieces, data[:n])
			data = data[n:]
		}
	}
	werr := make(chan error, 1)
	wrng := rand.New(rand.NewPCG(uint64(ci)+1000, uint64(time.Now().UnixNano())))
	go func() {
		rng := wrng
		for i, p := range pieces {
			c.SetWriteDeadline(time.Now().Add(60 * time.Second))
			if _, err := c.Write(p); err != nil {
				werr <- err
				return
			}
			switch {
			case burst > 0 && i == 0:
				time.Sleep(time.Second)
			case burst > 0:
				time.Sleep(2 * time.Millisecond)
			case rng.IntN(10) == 0:
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			}
		}
		werr <- nil
	}()
	time.Sleep(initialStall)
	br := bufio.NewReaderSize(c, 64)
	queued := map[int]bool{}
	got := 0
	for got < len(want) {
		if rng.IntN(200) == 0 {
			time.Sleep(300 * time.Millisecond) // stop reading: the socket fills
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		l, err := br.ReadString('\n')
		if err != nil {
			t.Errorf("conn %d: after %d of %d replies: %v (partial %q)", ci, got, len(want), err, l)
			return
		}
		l = strings.TrimSuffix(l, "\n")
		if strings.HasPrefix(l, "! ") {
			f := strings.Fields(l)
			if len(f) >= 3 && f[1] == "QUEUED" {
				n, err := strconv.Atoi(f[2])
				if err != nil || n < 1 || n > len(want) || !isAcq[n-1] {
					t.Errorf("conn %d: bad QUEUED line %q", ci, l)
					return
				}
				if n <= got {
					t.Errorf("conn %d: %q after the reply to request %d (%q)", ci, l, n, lines[n-1])
					return
				}
				queued[n] = true
			} else if len(f) < 2 || f[1] != "LOST" {
				t.Errorf("conn %d: unknown event line %q", ci, l)
				return
			}
			continue
		}
		if !want[got](l) {
			t.Errorf("conn %d: reply %d to %q: got %q", ci, got+1, lines[got], l)
			return
		}
		got++
	}
	if err := <-werr; err != nil {
		t.Errorf("conn %d: write: %v", ci, err)
	}
	// Nothing more: a spare reply would be a duplicate.
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if l, err := br.ReadString('\n'); err == nil && !strings.HasPrefix(l, "! ") {
		t.Errorf("conn %d: a reply beyond the %d requests: %q", ci, len(want), l)
	}
}

// A client that does not read while a burst of long lazy replies (INFO)
// fills its socket, with ACQUIREs (answered directly when the writer is
// idle, so cut short by the full socket and carried) and waiting ACQUIREs
// (QUEUED events, then TIMEOUT) among them, then reads everything: every
// reply, whole and in order, and every QUEUED before its reply.
func TestFullSocketCarriesDirectRepliesInOrder(t *testing.T) {
	s := serve(t, func(cfg *unixapi.Config) { cfg.RefusalRate = -1 })
	shared := key(t)
	holder := dial(t, s)
	token(t, holder.do("ACQUIRE "+shared+" 60 0"))
	for ci := range 2 {
		c, err := net.Dial("unix", s.Path())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		lines := []string{"HELLO 4 events"}
		want := []expectFn{func(l string) bool { return l == "HELLO 4 events" }}
		isAcq := []bool{false}
		for g := range 40 {
			for range 25 {
				lines = append(lines, "INFO")
				want = append(want, func(l string) bool { return strings.HasPrefix(l, "INFO cluster=") })
				isAcq = append(isAcq, false)
			}
			lines = append(lines, fmt.Sprintf("ACQUIRE %s/c%d/%d 5 0", shared, ci, g), "ACQUIRE "+shared+" 5 1", "PING")
			want = append(want, func(l string) bool { return strings.HasPrefix(l, "OK ") },
				func(l string) bool { return l == "TIMEOUT" }, func(l string) bool { return l == "PONG" })
			isAcq = append(isAcq, true, true, false)
		}
		rng := rand.New(rand.NewPCG(uint64(ci), uint64(time.Now().UnixNano())))
		runScript(t, c, ci, rng, lines, want, isAcq, 3*time.Second)
	}
}

// Connections that close while their ACQUIREs' replies are being written
// (directly, by the goroutines that answer them) end only their own
// sessions: a pipelining neighbour is answered whole and in order, every
// closed session ends, and the locks the closed ones were granted are
// released.
func TestPeersClosingDuringDirectWritesEndOnlyThemselves(t *testing.T) {
	s := serve(t, func(cfg *unixapi.Config) { cfg.RefusalRate = -1 })
	base := key(t)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pipelineOne(t, s, 0, base+"/good", 400)
	}()
	var keys []string
	for ci := range 12 {
		c, err := net.Dial("unix", s.Path())
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for i := range 40 {
			k := fmt.Sprintf("%s/x%d/%d", base, ci, i)
			keys = append(keys, k)
			fmt.Fprintf(&b, "ACQUIRE %s 60 0\nPING\n", k)
		}
		if _, err := c.Write([]byte(b.String())); err != nil {
			t.Fatal(err)
		}
		// Read a few replies, then close in the middle of the stream.
		br := bufio.NewReader(c)
		for range ci * 3 {
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
	wg.Wait()
	waitSessionsEndedKeysFree(t, s, keys)
}

// Server Close while a pipelining client's ACQUIREs are being answered (and
// written directly) and two of its ACQUIREs wait in the key's queue: every
// request still gets exactly one reply, in order, the waiters
// ERR shutting_down (or TIMEOUT/INDETERMINATE never: the wait is 30 s),
// and then the connection ends.
func TestServerCloseDuringDirectWritesAnswersAll(t *testing.T) {
	holderSrv := serve(t, nil)
	shared := key(t)
	a := dial(t, holderSrv)
	token(t, a.do("ACQUIRE "+shared+" 60 0"))
	s := serve(t, nil)
	c := dial(t, s)
	c.send("HELLO 4 events", "ACQUIRE "+shared+" 60 30", "ACQUIRE "+shared+" 60 30")
	expect(t, c.read(), "HELLO 4 events")
	expectPrefix(t, c.read(), "! QUEUED 2 ")
	expectPrefix(t, c.read(), "! QUEUED 3 ")
	var lines []string
	for i := range 60 {
		lines = append(lines, fmt.Sprintf("ACQUIRE %s/o%d 60 0", shared, i), "PING", "HELD")
	}
	c.send(lines...)
	time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	go s.Close()
	for i := range 2 {
		if got := readReply(c); !strings.HasPrefix(got, "ERR shutting_down ") {
			t.Fatalf("waiting ACQUIRE %d at Close: %q, want ERR shutting_down", i, got)
		}
	}
	for i, l := range lines {
		got := readReply(c)
		switch {
		case strings.HasPrefix(l, "ACQUIRE"):
			if !strings.HasPrefix(got, "OK ") && !strings.HasPrefix(got, "ERR shutting_down ") {
				t.Fatalf("reply %d to %q: %q", i, l, got)
			}
		case l == "PING":
			expect(t, got, "PONG")
		default:
			expectPrefix(t, got, "HELD ")
		}
	}
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		l, err := c.br.ReadString('\n')
		if err != nil {
			break
		}
		if !strings.HasPrefix(l, "! ") {
			t.Fatalf("a reply after every reply: %q", l)
		}
	}
}

// readReply reads the next reply line, skipping event lines.
func readReply(c *conn) string {
	c.t.Helper()
	for {
		l := c.read()
		if !strings.HasPrefix(l, "! ") {
			return l
		}
	}
}

// A slow reader behind a socket kept full: ACQUIREs answered while the
// writer is idle meet the full socket (direct writes cut short, the rest
// carried), among lazy INFO/HELD replies and QUEUED events. Every reply
// comes whole and in order.
func TestSlowReaderFullSocketDirectCarry(t *testing.T) {
	s := serve(t, func(cfg *unixapi.Config) { cfg.RefusalRate = -1 })
	shared := key(t)
	holder := dial(t, s)
	token(t, holder.do("ACQUIRE "+shared+" 60 0"))
	c, err := net.Dial("unix", s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lines := []string{"HELLO 4 events"}
	want := []expectFn{func(l string) bool { return l == "HELLO 4 events" }}
	isAcq := []bool{false}
	for range 340 {
		lines = append(lines, "INFO")
		want = append(want, func(l string) bool { return strings.HasPrefix(l, "INFO cluster=") })
		isAcq = append(isAcq, false)
	}
	for i := range 300 {
		lines = append(lines, fmt.Sprintf("ACQUIRE %s/s%d 5 0", shared, i))
		want = append(want, func(l string) bool { return strings.HasPrefix(l, "OK ") })
		isAcq = append(isAcq, true)
		if i%100 == 99 {
			lines = append(lines, "ACQUIRE "+shared+" 5 1", "HELD")
			want = append(want, func(l string) bool { return l == "TIMEOUT" }, func(l string) bool { return strings.HasPrefix(l, "HELD ") })
			isAcq = append(isAcq, true, false)
		}
	}
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	runScriptPaced(t, slowConn{c}, 0, rng, lines, want, isAcq, 3*time.Second, 341)
}

// slowConn reads at most 97 bytes at a time, a millisecond apart.
type slowConn struct{ net.Conn }

func (s slowConn) Read(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	return s.Conn.Read(p[:min(len(p), 97)])
}

// Sessions that end (their clients close) while their pipelined ACQUIREs
// are being granted: the grant's callback files the holding, then sets up
// its lost watch, and the session's end must stop that watch without a
// data race (the race detector fails the test) and release every lock.
func TestSessionEndRacesGrants(t *testing.T) {
	s := serve(t, nil)
	base := key(t)
	var keys []string
	var wg sync.WaitGroup
	for ci := range 60 {
		var b strings.Builder
		for i := range 30 {
			k := fmt.Sprintf("%s/g%d/%d", base, ci, i)
			keys = append(keys, k)
			fmt.Fprintf(&b, "ACQUIRE %s 60 0\n", k)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("unix", s.Path())
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			if _, err := c.Write([]byte(b.String())); err != nil {
				t.Error(err)
				return
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			_, _ = br.ReadString('\n') // the first grant, then close amid the rest
		}()
	}
	wg.Wait()
	waitSessionsEndedKeysFree(t, s, keys)
}

// waitSessionsEndedKeysFree waits (15 s at most) until s has no session
// left and none of keys is held: clients that closed took their sessions
// and locks with them. A session's end releases its locks through the
// broker (Compensate), so they are free a commit after it ended, not at
// once.
func waitSessionsEndedKeysFree(t *testing.T, s *unixapi.Server, keys []string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for s.Conns() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := s.Conns(); n != 0 {
		t.Fatalf("%d sessions still open 15 s after their clients closed", n)
	}
	for _, k := range keys {
		for {
			h, held := holderOf(t, k)
			if !held {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still held (%+v) 15 s after its connection closed (its session ended)", k, h)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
