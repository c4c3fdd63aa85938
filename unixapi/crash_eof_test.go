package unixapi_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/testkit"
)

// A client that writes its requests and shuts down its sending side at once
// (`printf 'ACQUIRE k 30 0\n' | socat - UNIX:...`: the request and the FIN
// reach the socket before the session's first read) is answered and then
// its session ends and releases its locks, as PROTOCOL.md says for a
// half-close after the last request. The reader must still see the EOF
// that came with the last short read.
func TestHalfCloseWithRequestEndsSession(t *testing.T) {
	s := serve(t, nil)
	const n = 5
	var keys [n]string
	var cs [n]net.Conn
	// All of them write and shut down before the server accepts the first.
	for i := range n {
		keys[i] = key(t)
		c, err := net.Dial("unix", s.Path())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("ACQUIRE " + keys[i] + " 30 0\n")); err != nil {
			t.Fatal(err)
		}
		if err := c.(*net.UnixConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		cs[i] = c
	}
	for i, c := range cs {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var got strings.Builder
		buf := make([]byte, 256)
		var rerr error
		for rerr == nil {
			var m int
			m, rerr = c.Read(buf)
			got.Write(buf[:m])
		}
		if !strings.HasPrefix(got.String(), "OK ") || strings.Count(got.String(), "\n") != 1 {
			t.Fatalf("connection %d: got %q (%v), want one OK <token> line", i, got.String(), rerr)
		}
		if ne, ok := rerr.(net.Error); ok && ne.Timeout() {
			t.Fatalf("connection %d: the session did not end within 5 s after answering its half-closed request (got %q; %d connections open)",
				i, got.String(), s.Conns())
		}
		// The session ended and released the key: b gets it within its
		// 5 s wait, where the 30 s lease would have kept it.
		b := dial(t, s)
		token(t, b.do("ACQUIRE "+keys[i]+" 30 5"))
		b.close()
	}
}

// A client that writes a waiting ACQUIRE and closes at once (a crash right
// after the write) ends its session promptly: its waiter leaves the key's
// queue and the connection is no longer counted, without waiting for the
// grant or the wait to end.
func TestCrashAfterWaitingAcquireEndsSession(t *testing.T) {
	s := serve(t, nil)
	k := key(t)
	a := dial(t, s)
	token(t, a.do("ACQUIRE "+k+" 60 0"))
	for range 5 {
		c, err := net.Dial("unix", s.Path())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("ACQUIRE " + k + " 60 50\n")); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	time.Sleep(500 * time.Millisecond) // every connection accepted
	testkit.WaitFor(t, "the crashed connections' sessions to end", 5*time.Second, func() bool { return s.Conns() == 1 })
	testkit.WaitFor(t, "the crashed connections' waiters to leave the queue", 5*time.Second, func() bool { return queueLen(t, k) == 0 })
}

// A client that holds a lock and crashes in the middle of writing its next
// request (a partial line, then the close) ends its session, which
// releases the lock: another connection gets the key within its wait,
// long before the 60 s lease. The close arrives right behind the partial
// line, so the reader's short read of it is followed by nothing but EOF.
func TestCrashMidLineWhileHoldingReleases(t *testing.T) {
	s := serve(t, nil)
	const n = 5
	var keys [n]string
	var cs [n]*conn
	for i := range n {
		keys[i] = key(t)
		cs[i] = dial(t, s)
		token(t, cs[i].do("ACQUIRE "+keys[i]+" 60 0"))
	}
	for _, c := range cs {
		if _, err := c.c.Write([]byte("RELEASE " + keys[0])); err != nil { // no newline: cut off by the crash
			t.Fatal(err)
		}
		c.close()
	}
	for i := range n {
		b := dial(t, s)
		if r := b.do("ACQUIRE " + keys[i] + " 60 5"); !strings.HasPrefix(r, "OK ") {
			t.Fatalf("key %d: got %q, want OK <token>: the crashed connection's session still holds it (%d connections open)", i, r, s.Conns())
		}
		b.close()
	}
}
