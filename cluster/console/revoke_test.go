package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/console"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// fakeSource answers revokes with errs[key] and records them.
type fakeSource struct {
	mu    sync.Mutex
	calls []string
	errs  map[string]error
}

func (f *fakeSource) Sample(int) console.Sample {
	return console.Sample{ServerID: "n2", Role: "follower", Leader: "n1"}
}

func (f *fakeSource) Key(key string) (wire.KeyReport, error) { return wire.KeyReport{Key: key}, nil }

func (f *fakeSource) Revoke(_ context.Context, key string, token uint64, by, reason string) (wire.RevokeReport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("%s %d %s %s", key, token, by, reason))
	if err := f.errs[key]; err != nil {
		return wire.RevokeReport{}, err
	}
	return wire.RevokeReport{Key: key, Token: token, By: by, Reason: reason, Owner: "alice", NextToken: token + 1}, nil
}

func (f *fakeSource) revokes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

var testSecret = []byte("the-console-secret-of-this-test-0123")

// fakeConsole serves a console of src with the admin secret; every call
// of its clock is a second later (so two logins get two sessions).
func fakeConsole(t *testing.T, src console.Source) *httptest.Server {
	t.Helper()
	cfg := console.DefaultConfig(src)
	cfg.Interval, cfg.Secret = 50*time.Millisecond, testSecret
	var mu sync.Mutex
	now := time.Now()
	cfg.Now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Second)
		return now
	}
	con, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go con.Run(ctx)
	srv := httptest.NewServer(con.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// login opens a session in b.
func login(t *testing.T, b *http.Client, base string, secret []byte) {
	t.Helper()
	r, err := b.PostForm(base+"/login", url.Values{"secret": {string(secret)}})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Body.Close()
	if r.Request.URL.Path != "/" {
		t.Fatalf("the login ended at %s", r.Request.URL)
	}
}

// csrfOf reads the session's CSRF token as the page does.
func csrfOf(t *testing.T, b *http.Client, base string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/api/csrf", nil)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	r, err := b.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Body.Close() }()
	var v struct{ Token string }
	if err := json.NewDecoder(r.Body).Decode(&v); err != nil || r.StatusCode != http.StatusOK || v.Token == "" {
		t.Fatalf("GET /api/csrf: %s %v %+v", r.Status, err, v)
	}
	return v.Token
}

// post sends a revoke as the page does (same-origin, JSON), with the
// CSRF token csrf ("": none) and the headers in hdr (replacing the page's).
func post(t *testing.T, b *http.Client, base, csrf string, body any, hdr map[string]string) (int, console.RevokeReply) {
	t.Helper()
	bs, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", base+"/api/revoke", bytes.NewReader(bs))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", base)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if csrf != "" {
		req.Header.Set(console.CSRFHeader, csrf)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	r, err := b.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Body.Close() }()
	var rep console.RevokeReply
	_ = json.NewDecoder(r.Body).Decode(&rep)
	return r.StatusCode, rep
}

// The revoke is the console's one change, and only its own page may ask
// for it: no session → 401; GET → 405; no or a wrong CSRF token, another
// session's token, a cross-site request or one that is no JSON → refused
// before the node hears of it; no reason → 400. The page's request
// revokes, by "console:" and the remote host.
func TestConsoleRevokeGuards(t *testing.T) {
	src := &fakeSource{}
	srv := fakeConsole(t, src)
	ok := map[string]any{"key": "seats/1", "token": "42", "reason": "stuck holder"}

	anon := browser(t)
	if code, _ := post(t, anon, srv.URL, "", ok, nil); code != http.StatusUnauthorized {
		t.Fatalf("a revoke without a session: %d, want 401", code)
	}
	if r, err := anon.Get(srv.URL + "/api/csrf"); err != nil || r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /api/csrf without a session: %v %v, want 401", err, r)
	} else {
		_ = r.Body.Close()
	}

	b := browser(t)
	login(t, b, srv.URL, testSecret)
	csrf := csrfOf(t, b, srv.URL)
	other := browser(t)
	login(t, other, srv.URL, testSecret)
	otherCSRF := csrfOf(t, other, srv.URL)
	if otherCSRF == csrf {
		t.Fatal("two sessions have one CSRF token")
	}

	r, err := b.Get(srv.URL + "/api/revoke?key=seats/1&token=42&reason=x")
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Body.Close()
	if r.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET /api/revoke: %s, want 405", r.Status)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/api/csrf", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if r, err := b.Do(req); err != nil || r.StatusCode != http.StatusForbidden {
		t.Fatalf("a cross-site GET /api/csrf: %v %v, want 403", err, r)
	} else {
		_ = r.Body.Close()
	}

	for _, c := range []struct {
		name string
		csrf string
		hdr  map[string]string
		body any
		want int
	}{
		{"no CSRF token", "", nil, ok, http.StatusForbidden},
		{"a wrong CSRF token", strings.Repeat("0", len(csrf)), nil, ok, http.StatusForbidden},
		{"another session's CSRF token", otherCSRF, nil, ok, http.StatusForbidden},
		{"cross-site (Sec-Fetch-Site)", csrf, map[string]string{"Sec-Fetch-Site": "cross-site"}, ok, http.StatusForbidden},
		{"same-site, not same-origin", csrf, map[string]string{"Sec-Fetch-Site": "same-site"}, ok, http.StatusForbidden},
		{"another Origin", csrf, map[string]string{"Origin": "https://evil.example"}, ok, http.StatusForbidden},
		{"a form, not JSON", csrf, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, ok, http.StatusUnsupportedMediaType},
		{"no reason", csrf, nil, map[string]any{"key": "seats/1", "token": 42, "reason": "  "}, http.StatusBadRequest},
		{"no token", csrf, nil, map[string]any{"key": "seats/1", "reason": "x"}, http.StatusBadRequest},
		{"an unknown field", csrf, nil, map[string]any{"key": "seats/1", "token": 42, "reason": "x", "by": "me"}, http.StatusBadRequest},
	} {
		if code, rep := post(t, b, srv.URL, c.csrf, c.body, c.hdr); code != c.want {
			t.Errorf("%s: %d %+v, want %d", c.name, code, rep, c.want)
		}
	}
	if calls := src.revokes(); len(calls) != 0 {
		t.Fatalf("refused requests reached the node: %q", calls)
	}

	code, rep := post(t, b, srv.URL, csrf, ok, nil)
	if code != http.StatusOK || rep.Revoked == nil || rep.Revoked.Token != 42 || rep.Revoked.NextToken != 43 {
		t.Fatalf("the page's revoke: %d %+v", code, rep)
	}
	// A client without the browser's headers (curl with the cookie and
	// the token) is no cross-site page: it may revoke too.
	code, _ = post(t, b, srv.URL, csrf, map[string]any{"key": "seats/2", "token": 7, "reason": "x"},
		map[string]string{"Origin": "", "Sec-Fetch-Site": ""})
	if code != http.StatusOK {
		t.Fatalf("a revoke without Origin and Sec-Fetch-Site: %d", code)
	}
	if calls := src.revokes(); len(calls) != 2 || calls[0] != "seats/1 42 console:127.0.0.1 stuck holder" || calls[1] != "seats/2 7 console:127.0.0.1 x" {
		t.Fatalf("the node heard %q", calls)
	}
}

// The node's errors reach the page with their codes and statuses; a node
// that does not lead names the leader.
func TestConsoleRevokeErrors(t *testing.T) {
	src := &fakeSource{errs: map[string]error{
		"mismatch":      fmt.Errorf("%w: held under 9", locksm.ErrTokenMismatch),
		"free":          locksm.ErrNotHeld,
		"follower":      fmt.Errorf("%w: ask %q", cluster.ErrNotLeader, "n1"),
		"badreason":     locksm.ErrInvalidReason,
		"old":           wire.ErrNotSupported,
		"indeterminate": fmt.Errorf("%w: proposed", wire.ErrIndeterminate),
		"broken":        fmt.Errorf("disk on fire"),
	}}
	srv := fakeConsole(t, src)
	b := browser(t)
	login(t, b, srv.URL, testSecret)
	csrf := csrfOf(t, b, srv.URL)
	time.Sleep(200 * time.Millisecond) // a sample names the leader
	for key, want := range map[string]struct {
		status int
		code   string
	}{
		"mismatch":      {http.StatusConflict, "token_mismatch"},
		"free":          {http.StatusConflict, "not_held"},
		"follower":      {http.StatusMisdirectedRequest, "not_leader"},
		"badreason":     {http.StatusBadRequest, "invalid_reason"},
		"old":           {http.StatusNotImplemented, "not_supported"},
		"indeterminate": {http.StatusGatewayTimeout, "indeterminate"},
		"broken":        {http.StatusInternalServerError, "internal"},
	} {
		code, rep := post(t, b, srv.URL, csrf, map[string]any{"key": key, "token": 5, "reason": "r"}, nil)
		if code != want.status || rep.Code != want.code || rep.Error == "" || rep.Revoked != nil {
			t.Errorf("%s: %d %+v, want %d %s", key, code, rep, want.status, want.code)
		}
		if key == "follower" && rep.Leader != "n1" {
			t.Errorf("not the leader: the reply names leader %q, want n1", rep.Leader)
		}
	}
}

// ByOf keeps "by" in the owners' alphabet.
func TestConsoleRevokeBy(t *testing.T) {
	for remote, want := range map[string]string{
		"127.0.0.1:5555":    "console:127.0.0.1",
		"[::1]:80":          "console:::1",
		"[fe80::1%eth 0]:1": "console:fe80::1%eth_0",
		"":                  "console:unknown",
	} {
		if got := console.ByOf(remote); got != want {
			t.Errorf("ByOf(%q) = %q, want %q", remote, got, want)
		}
	}
	if got := console.ByOf(strings.Repeat("x", 300)); len(got) != locksm.MaxOwnerLen {
		t.Errorf("a long host: %d bytes", len(got))
	}
}

// On a real cluster: the leader's console revokes alice's holding and bob,
// waiting, gets the key with a larger token in the same commit; the key's
// report shows the revoke (by, reason); a stale token is a mismatch; a
// follower's console refuses, naming the leader.
func TestConsoleRevokesOnTheLeader(t *testing.T) {
	c, li, srv, secret := liveConsole(t)
	b := browser(t)
	login(t, b, srv.URL, secret)
	csrf := csrfOf(t, b, srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	g, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquire, Key: "seats/9", Owner: "alice", Lease: 60})
	if err != nil || g.Type != wire.TypeGranted {
		t.Fatalf("acquire: %v %+v", err, g)
	}
	bob, err := conn.Start(wire.Msg{Type: wire.TypeAcquire, Key: "seats/9", Owner: "bob", Lease: 30, WaitMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	for until := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if kr, err := c.Node(li).Inspect("seats/9"); err == nil && kr.QueueLen == 1 {
			break
		}
		if time.Now().After(until) {
			t.Fatal("bob never queued")
		}
	}

	// A follower's console: not the leader, naming it.
	fi := (li + 1) % 3
	fcfg := console.DefaultConfig(c.Node(fi).ConsoleSource())
	fcfg.Interval, fcfg.Secret = 50*time.Millisecond, secret
	fcon, err := console.New(fcfg)
	if err != nil {
		t.Fatal(err)
	}
	fctx, fstop := context.WithCancel(context.Background())
	defer fstop()
	go fcon.Run(fctx)
	fsrv := httptest.NewServer(fcon.Handler())
	defer fsrv.Close()
	fb := browser(t)
	login(t, fb, fsrv.URL, secret)
	time.Sleep(200 * time.Millisecond) // a sample names the leader
	code, rep := post(t, fb, fsrv.URL, csrfOf(t, fb, fsrv.URL), map[string]any{"key": "seats/9", "token": g.Token, "reason": "from a follower"}, nil)
	lr, _ := c.Node(li).Inspect("seats/9")
	if code != http.StatusMisdirectedRequest || rep.Code != "not_leader" || rep.Leader != lr.ServerID {
		t.Fatalf("a follower's revoke: %d %+v, want 421 not_leader naming %s", code, rep, lr.ServerID)
	}

	code, rep = post(t, b, srv.URL, csrf, map[string]any{"key": "seats/9", "token": g.Token + 1000, "reason": "a stale page"}, nil)
	if code != http.StatusConflict || rep.Code != "token_mismatch" {
		t.Fatalf("a revoke with another token: %d %+v, want 409 token_mismatch", code, rep)
	}
	code, rep = post(t, b, srv.URL, csrf, map[string]any{"key": "seats/9", "token": g.Token, "reason": "stuck since 10:02"}, nil)
	if code != http.StatusOK || rep.Revoked == nil || rep.Revoked.Token != g.Token || rep.Revoked.Owner != "alice" ||
		rep.Revoked.By != "console:127.0.0.1" || rep.Revoked.NextToken <= g.Token {
		t.Fatalf("the revoke: %d %+v", code, rep)
	}
	select {
	case <-bob.Done:
		if m := bob.Reply; bob.Err != nil || m.Type != wire.TypeGranted || m.Token != rep.Revoked.NextToken {
			t.Fatalf("bob: %v %+v, want granted token %d", bob.Err, m, rep.Revoked.NextToken)
		}
	case <-ctx.Done():
		t.Fatal("bob was never granted")
	}
	kr, err := b.Get(srv.URL + "/api/keys/seats/9")
	if err != nil {
		t.Fatal(err)
	}
	var key wire.KeyReport
	_ = json.NewDecoder(kr.Body).Decode(&key)
	_ = kr.Body.Close()
	if lr := key.LastRevoke; lr == nil || lr.Token != g.Token || lr.By != "console:127.0.0.1" || lr.Reason != "stuck since 10:02" ||
		!key.Held || key.Holder.Owner != "bob" {
		t.Fatalf("the key after the revoke: %+v (last revoke %+v)", key, key.LastRevoke)
	}
}

// A semaphore's permit is revoked as a lock's holding is (the page has a
// Revoke button per permit): the waiter gets the revoked permit's slot
// with a larger token, and the record says it was a permit.
func TestConsoleRevokesAPermit(t *testing.T) {
	c, li, srv, secret := liveConsole(t)
	b := browser(t)
	login(t, b, srv.URL, secret)
	csrf := csrfOf(t, b, srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeSetPermits, Key: "room", Permits: 2}); err != nil || r.Type != wire.TypeOK {
		t.Fatalf("set-permits: %v %+v", err, r)
	}
	var toks []uint64
	for _, who := range []string{"alice", "bob"} {
		g, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquirePermit, Key: "room", Owner: who, Lease: 60})
		if err != nil || g.Type != wire.TypeGranted || !g.Permit {
			t.Fatalf("%s's permit: %v %+v", who, err, g)
		}
		toks = append(toks, g.Token)
	}
	carol, err := conn.Start(wire.Msg{Type: wire.TypeAcquirePermit, Key: "room", Owner: "carol", Lease: 30, WaitMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	for until := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if kr, err := c.Node(li).Inspect("room"); err == nil && kr.QueueLen == 1 {
			break
		}
		if time.Now().After(until) {
			t.Fatal("carol never queued")
		}
	}
	code, rep := post(t, b, srv.URL, csrf, map[string]any{"key": "room", "token": toks[0], "reason": "alice is gone"}, nil)
	if code != http.StatusOK || rep.Revoked == nil || !rep.Revoked.Permit || rep.Revoked.Owner != "alice" || rep.Revoked.NextToken <= toks[1] {
		t.Fatalf("the permit's revoke: %d %+v (tokens %v)", code, rep.Revoked, toks)
	}
	select {
	case <-carol.Done:
		if m := carol.Reply; carol.Err != nil || m.Type != wire.TypeGranted || !m.Permit || m.Token != rep.Revoked.NextToken || m.Slot != rep.Revoked.Slot {
			t.Fatalf("carol: %v %+v, want the permit of slot %d, token %d", carol.Err, m, rep.Revoked.Slot, rep.Revoked.NextToken)
		}
	case <-ctx.Done():
		t.Fatal("carol was never granted")
	}
}
