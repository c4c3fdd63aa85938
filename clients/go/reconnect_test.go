package ticketing

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listenEnds listens on a unix socket at path and hands each accepted
// connection to the test as a fakeEnd (the sidecar's side, played by the
// test), so that a test can drop a connection as a restarting sidecar
// does and see the Client dial again.
func listenEnds(t *testing.T, path string) <-chan *fakeEnd {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ends := make(chan *fakeEnd, 8)
	go func() {
		for {
			sc, err := ln.Accept()
			if err != nil {
				return
			}
			f := &fakeEnd{t: t, conn: sc, reqs: make(chan string, 64)}
			t.Cleanup(func() { sc.Close() })
			go func() {
				defer close(f.reqs)
				br := bufio.NewReader(sc)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					f.reqs <- strings.TrimSuffix(line, "\n")
				}
			}()
			ends <- f
		}
	}()
	return ends
}

func nextEnd(t *testing.T, ends <-chan *fakeEnd) *fakeEnd {
	t.Helper()
	select {
	case f := <-ends:
		if got := f.req(); got != helloLine {
			t.Fatalf("first line %q, want %q", got, helloLine)
		}
		f.write("HELLO 4 events")
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not connect within 10s")
		return nil
	}
}

// shortDir is a directory whose socket paths fit the 107 bytes of a unix
// socket address (t.TempDir's may not).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tkr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// The contract of clients/README.md: when the connection is lost, the
// requests pending on it fail with ErrClosed and its locks are lost
// (disconnected); the next call dials again, as a new session (a new
// HELLO first); a Lock of the lost session is not released on the new
// one; Close ends the Client for good (no dialing again).
func TestReconnectOnNextCall(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(shortDir(t), "s")
	ends := listenEnds(t, path)
	c, err := Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f1 := nextEnd(t, ends)

	lock := async(func() lockRes {
		l, err := c.Lock(ctx, "k", 30*time.Second, 0)
		return lockRes{l, err}
	})
	if got := f1.req(); got != "ACQUIRE k 30 0.000" {
		t.Fatalf("got %q", got)
	}
	f1.write("OK 7")
	lr := recv(t, lock)
	if lr.err != nil {
		t.Fatal(lr.err)
	}
	pending := async(func() error { _, err := c.Held(ctx); return err })
	f1.req()
	done := c.Done()
	f1.conn.Close() // the sidecar goes away
	if err := recv(t, pending); !errors.Is(err, ErrClosed) {
		t.Fatalf("the pending HELD: %v, want ErrClosed", err)
	}
	<-done
	<-lr.l.Lost()
	if r := lr.l.LostReason(); r != LostDisconnected {
		t.Fatalf("lost reason %q", r)
	}

	// The next call dials again and is answered on the new connection.
	ping := async(func() error { return c.Ping(ctx) })
	f2 := nextEnd(t, ends)
	if got := f2.req(); got != "PING" {
		t.Fatalf("got %q on the new connection, want PING", got)
	}
	f2.write("PONG")
	if err := recv(t, ping); err != nil {
		t.Fatalf("Ping after the sidecar went away: %v", err)
	}
	select {
	case <-c.Done():
		t.Fatal("Done is closed for the new connection")
	default:
	}
	// The lost lock belongs to the old session: its Release does not go to
	// the new one (which would answer not_held for a lock it never had).
	if err := lr.l.Release(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Release of a lock of the lost connection: %v, want ErrClosed", err)
	}
	f2.noReq()

	c.Close()
	if err := c.Ping(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ping after Close: %v, want ErrClosed", err)
	}
	select {
	case f := <-ends:
		t.Fatalf("the closed Client dialed again: %v", f.conn.LocalAddr())
	case <-time.After(50 * time.Millisecond):
	}
}

// A Client whose sidecar is gone and not back says so on each call (the
// dial's error, ErrNoSidecar, wrapped in ErrClosed), and dials again on
// the call after: once the sidecar is back, calls work.
func TestReconnectWhileSidecarAway(t *testing.T) {
	ctx := context.Background()
	dir := shortDir(t)
	path := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		if sc, err := ln.Accept(); err == nil {
			accepted <- sc
		}
	}()
	c, err := Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc := recv(t, accepted)
	ln.Close() // removes the socket file
	sc.Close()
	<-c.Done()
	err = c.Ping(ctx)
	if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrNoSidecar) {
		t.Fatalf("Ping with no sidecar: %v, want ErrClosed and ErrNoSidecar", err)
	}
	ends := listenEnds(t, path)
	ping := async(func() error { return c.Ping(ctx) })
	f := nextEnd(t, ends)
	f.req()
	f.write("PONG")
	if err := recv(t, ping); err != nil {
		t.Fatalf("Ping once the sidecar is back: %v", err)
	}
}

// Dial(ctx, "") connects to $TICKETING_SOCKET, else ./ticketing.sock.
func TestDialDefaultPath(t *testing.T) {
	ctx := context.Background()
	envPath := filepath.Join(shortDir(t), "env.sock")
	envEnds := listenEnds(t, envPath)
	cwd := shortDir(t)
	cwdEnds := listenEnds(t, filepath.Join(cwd, "ticketing.sock"))
	t.Chdir(cwd)

	t.Setenv(SocketEnv, envPath)
	c, err := Dial(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	nextEnd(t, envEnds)
	c.Close()

	t.Setenv(SocketEnv, "")
	c, err = Dial(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	nextEnd(t, cwdEnds)
	c.Close()

	// The environment comes first: pointing it at nothing fails, though
	// ./ticketing.sock is there.
	missing := filepath.Join(shortDir(t), "missing.sock")
	t.Setenv(SocketEnv, missing)
	if c, err := Dial(ctx, ""); !errors.Is(err, ErrNoSidecar) || !strings.Contains(err.Error(), missing) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Dial with $%s=%s: %v, want ErrNoSidecar naming it", SocketEnv, missing, err)
	}
	for _, tc := range []struct{ arg, env, want string }{
		{"/x.sock", "/y.sock", "/x.sock"}, {"", "/y.sock", "/y.sock"}, {"", "", "./ticketing.sock"},
	} {
		t.Setenv(SocketEnv, tc.env)
		if got := SocketPath(tc.arg); got != tc.want {
			t.Errorf("SocketPath(%q) with $%s=%q: %q, want %q", tc.arg, SocketEnv, tc.env, got, tc.want)
		}
	}
}

// Info parses every field of a real sidecar's INFO line, and keeps fields
// it does not know.
func TestParseInfo(t *testing.T) {
	line := "INFO cluster=dev leader=127.0.0.1:22312 connected=3/3 domain=fc59c92b65abefc097983fabc80c488a " +
		"members=n1/mr6c6vth3r:voter@127.0.0.1:22312,n2/k3c2buu3ti:learner@- protocol=4 sessions=auto " +
		"session=68f691bb60dc85e1 session_state=attached session_timeout_ms=10000 session_resumes=2 session_opens=1 " +
		"session_held=5 session_last_resume=outcomes:0,queued:0,void:0,repeated:0 future=x"
	in, err := ParseInfo(line)
	if err != nil {
		t.Fatal(err)
	}
	want := Info{Cluster: "dev", Leader: "127.0.0.1:22312", Connected: 3, Total: 3, Domain: "fc59c92b65abefc097983fabc80c488a",
		Members:  []Member{{"n1/mr6c6vth3r", "voter", "127.0.0.1:22312"}, {"n2/k3c2buu3ti", "learner", ""}},
		Protocol: 4, Sessions: "auto", Session: "68f691bb60dc85e1", SessionState: "attached", SessionTimeout: 10 * time.Second,
		SessionResumes: 2, SessionOpens: 1, SessionHeld: 5, SessionLastResume: "outcomes:0,queued:0,void:0,repeated:0"}
	got := in
	got.Fields, got.Raw = nil, ""
	if !equalInfo(got, want) {
		t.Fatalf("ParseInfo:\n got %+v\nwant %+v", got, want)
	}
	if in.Fields["future"] != "x" || in.Raw != strings.TrimPrefix(line, "INFO ") || in.String() != in.Raw {
		t.Fatalf("Fields %v, Raw %q", in.Fields, in.Raw)
	}
	// "-" is none; an older sidecar's line lacks fields.
	in, err = ParseInfo("INFO cluster=dev leader=- connected=0/3 domain=- members=-")
	if err != nil || in.Leader != "" || in.Domain != "" || in.Members != nil || in.Protocol != 0 || in.Total != 3 {
		t.Fatalf("ParseInfo of dashes: %+v, %v", in, err)
	}
	for _, bad := range []string{"INFO connected=x", "INFO cluster", "INFO protocol=four", "INFO members=nocolon"} {
		if _, err := ParseInfo(bad); !errors.Is(err, ErrProtocol) {
			t.Errorf("ParseInfo(%q): %v, want ErrProtocol", bad, err)
		}
	}
	if _, err := ParseInfo("ERR unavailable no leader"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("ParseInfo of an ERR: %v", err)
	}
}

func equalInfo(a, b Info) bool {
	if len(a.Members) != len(b.Members) {
		return false
	}
	for i := range a.Members {
		if a.Members[i] != b.Members[i] {
			return false
		}
	}
	a.Members, b.Members = nil, nil
	return a.Cluster == b.Cluster && a.Leader == b.Leader && a.Connected == b.Connected && a.Total == b.Total &&
		a.Domain == b.Domain && a.Protocol == b.Protocol && a.Sessions == b.Sessions && a.Session == b.Session &&
		a.SessionState == b.SessionState && a.SessionTimeout == b.SessionTimeout && a.SessionResumes == b.SessionResumes &&
		a.SessionOpens == b.SessionOpens && a.SessionHeld == b.SessionHeld && a.SessionLastResume == b.SessionLastResume
}

// Domain is INFO's domain field, ErrNoDomain while it is "-", and asked
// once per connection (a sidecar holds to the first domain it sees).
func TestDomain(t *testing.T) {
	ctx := context.Background()
	c, f := pipeClient(t, "HELLO 4 events")
	got := async(func() error { _, err := c.Domain(ctx); return err })
	f.req()
	f.write("INFO cluster=dev leader=- connected=0/3 domain=-")
	if err := recv(t, got); !errors.Is(err, ErrNoDomain) {
		t.Fatalf("Domain with domain=-: %v, want ErrNoDomain", err)
	}
	dom := async(func() string { d, _ := c.Domain(ctx); return d })
	f.req()
	f.write("INFO cluster=dev leader=127.0.0.1:1 connected=3/3 domain=fc59")
	if d := recv(t, dom); d != "fc59" {
		t.Fatalf("Domain: %q, want the domain, not the cluster id", d)
	}
	if d, err := c.Domain(ctx); err != nil || d != "fc59" {
		t.Fatalf("Domain again: %q, %v", d, err)
	}
	f.noReq()
}
