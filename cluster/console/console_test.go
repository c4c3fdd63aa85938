package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/console"
	"ticketing/cluster/local"
	"ticketing/cluster/wire"
)

// liveConsole serves the console of the leader of a real 3-node cluster,
// with the admin secret, sampling every 100 ms.
func liveConsole(t *testing.T) (*local.Cluster, int, *httptest.Server, []byte) {
	t.Helper()
	secret := []byte("the-console-secret-of-this-test-0123")
	c, err := local.Start(local.Options{Dir: filepath.Join(t.TempDir(), "c"), AdminSecret: secret, Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	li, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := console.DefaultConfig(c.Node(li).ConsoleSource())
	cfg.Interval, cfg.Secret = 100*time.Millisecond, secret
	con, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go con.Run(rctx)
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	return c, li, srv, secret
}

// A browser's session: a cookie jar, no redirects followed for the checks.
func browser(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 10 * time.Second}
}

// Without the secret nothing but the login form is served; a wrong secret
// gets no session; the right one does, and the stream and a key follow.
func TestConsoleNeedsTheAdminSecret(t *testing.T) {
	_, _, srv, secret := liveConsole(t)
	b := browser(t)
	for _, path := range []string{"/api/events", "/api/keys/k"} {
		r, err := b.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = r.Body.Close()
		if r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("GET %s without logging in: %s, want 401", path, r.Status)
		}
	}
	r, err := b.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if !strings.Contains(string(page), `name="secret"`) {
		t.Fatalf("GET / without logging in did not lead to the login form:\n%s", page)
	}
	r, err = b.PostForm(srv.URL+"/login", url.Values{"secret": {"not-the-secret-at-all-000"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Body.Close()
	if r2, _ := b.Get(srv.URL + "/api/keys/k"); r2 == nil || r2.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong secret opened a session")
	}
	r, err = b.PostForm(srv.URL+"/login", url.Values{"secret": {string(secret)}})
	if err != nil {
		t.Fatal(err)
	}
	page, _ = io.ReadAll(r.Body)
	_ = r.Body.Close()
	if !strings.Contains(string(page), `id="lines"`) {
		t.Fatalf("after logging in, / is not the console:\n%s", page)
	}
	for _, ck := range b.Jar.Cookies(mustURL(srv.URL)) {
		if strings.Contains(ck.Value, string(secret)) {
			t.Fatalf("the session cookie holds the secret: %q", ck.Value)
		}
	}
	r, err = b.Get(srv.URL + "/api/keys/k")
	if err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/keys/k after logging in: %v %v", err, r)
	}
	_ = r.Body.Close()
	if r.Header.Get("Content-Security-Policy") == "" {
		t.Error("no Content-Security-Policy")
	}
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

// The stream shows a real line: a holder and two waiters on one key of a
// real cluster appear as the hottest line, with the holder; the key's
// report lists the waiters in order; the commit latency is measured.
func TestConsoleStreamShowsALine(t *testing.T) {
	c, li, srv, secret := liveConsole(t)
	b := browser(t)
	if r, err := b.PostForm(srv.URL+"/login", url.Values{"secret": {string(secret)}}); err != nil {
		t.Fatal(err)
	} else {
		_ = r.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	g, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquire, Key: "seats/7", Owner: "alice", Lease: 60})
	if err != nil || g.Type != wire.TypeGranted {
		t.Fatalf("acquire: %v %+v", err, g)
	}
	tok := g.Token
	for _, who := range []string{"bob", "carol"} {
		if _, err := conn.Start(wire.Msg{Type: wire.TypeAcquire, Key: "seats/7", Owner: who, Lease: 30, WaitMs: 60_000}); err != nil {
			t.Fatal(err)
		}
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/events", nil)
	r, err := b.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Body.Close() }()
	if ct := r.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("events: Content-Type %q", ct)
	}
	sc := bufio.NewScanner(r.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var s console.Sample
	found := false
	for !found && sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if err := json.Unmarshal([]byte(data), &s); err != nil {
			t.Fatalf("a sample that is no JSON: %v\n%s", err, data)
		}
		found = len(s.Lines) > 0 && s.Lines[0].Key == "seats/7" && s.Lines[0].Waiters == 2 && s.Commit.N > 0
	}
	if !found {
		t.Fatalf("the stream never showed seats/7's line of 2 with a commit latency: %v; last %+v", sc.Err(), s)
	}
	l := s.Lines[0]
	if l.Holder != "alice" || l.Token != tok || s.Role != "leader" || !s.Serving || len(s.Members) != 3 || s.LastToken < tok {
		t.Fatalf("the sample: %+v", s)
	}
	kr, err := b.Get(srv.URL + "/api/keys/seats/7")
	if err != nil {
		t.Fatal(err)
	}
	var rep wire.KeyReport
	_ = json.NewDecoder(kr.Body).Decode(&rep)
	_ = kr.Body.Close()
	if !rep.Held || rep.Holder.Owner != "alice" || rep.QueueLen != 2 || rep.Queue[0].Owner != "bob" || rep.Queue[1].Position != 2 {
		t.Fatalf("the key's report: %+v", rep)
	}
	if bad, _ := b.Get(srv.URL + "/api/keys/" + url.PathEscape("has space")); bad == nil || bad.StatusCode != http.StatusBadRequest {
		t.Fatalf("an invalid key: %v, want 400", bad)
	}
}
