package ticketing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
)

// WithLabel against a real sidecar and cluster (version 5): Acquire, Lock
// and LockBlock send the label, HELD shows it (read by Do and HeldLocks;
// Held still maps keys to tokens), the Lock knows its label, and a bad
// label is refused before anything is sent.
func TestWithLabelRealSidecar(t *testing.T) {
	sock := sidecarSocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := ticketing.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := fmt.Sprintf("go/label/%d", time.Now().UnixNano())
	tok, err := c.Acquire(ctx, k, 30*time.Second, 0, ticketing.WithLabel("job-1"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Lock(ctx, k+"/2", 30*time.Second, 0, ticketing.WithLabel("req/42"))
	if err != nil {
		t.Fatal(err)
	}
	held, err := c.Do(ctx, "HELD")
	want := fmt.Sprintf("HELD 2 %s:%d job-1 %s/2:%d req/42", k, tok, k, l.Token())
	if err != nil || held != want {
		t.Fatalf("HELD %q %v, want %q", held, err, want)
	}
	m, err := c.Held(ctx)
	if err != nil || len(m) != 2 || m[k] != tok || m[k+"/2"] != l.Token() {
		t.Fatalf("Held %v %v", m, err)
	}
	if l.Label() != "req/42" {
		t.Fatalf("Lock.Label %q", l.Label())
	}
	b, err := c.LockBlock(ctx, []string{k + "/b2", k + "/b1"}, 30*time.Second, 0, ticketing.WithLabel("order-7"))
	if err != nil {
		t.Fatal(err)
	}
	u, err := c.Lock(ctx, k+"/c", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.Label() != "order-7" || u.Label() != "" {
		t.Fatalf("labels %q %q", b.Label(), u.Label())
	}
	hl, err := c.HeldLocks(ctx)
	wantHL := []ticketing.HeldLock{
		{Key: k, Token: tok, Label: "job-1"},
		{Key: k + "/2", Token: l.Token(), Label: "req/42"},
		{Key: k + "/b1", Token: b.Token(), Label: "order-7"},
		{Key: k + "/b2", Token: b.Token(), Label: "order-7"},
		{Key: k + "/c", Token: u.Token(), Label: ""},
	}
	if err != nil || fmt.Sprint(hl) != fmt.Sprint(wantHL) {
		t.Fatalf("HeldLocks %v %v, want %v", hl, err, wantHL)
	}
	for _, bad := range []string{"a b", "-", strings.Repeat("l", ticketing.MaxLabelLen+1)} {
		if _, err := c.Acquire(ctx, k+"/x", 30*time.Second, 0, ticketing.WithLabel(bad)); !errors.Is(err, ticketing.ErrInvalidArgument) {
			t.Fatalf("label %q: %v", bad, err)
		}
	}
}
