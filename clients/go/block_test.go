package ticketing_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/testkit"
)

func dialT(t *testing.T, sock string) *ticketing.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ticketing.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A block through the Go API against a real sidecar: one token, Keys in
// the order given (and a copy), HELD listing every key, Release freeing all.
func TestAcquireBlock(t *testing.T) {
	sock := sidecarSocket(t)
	ctx := context.Background()
	a, b := dialT(t, sock), dialT(t, sock)
	pre := fmt.Sprintf("goblock/%d/", time.Now().UnixNano())
	keys := []string{pre + "seat/3", pre + "seat/1", pre + "seat/2"}
	if v, err := a.Hello(ctx); err != nil || v != bothSpeak {
		t.Fatalf("Hello: %d, %v", v, err)
	}
	blk, err := a.AcquireBlock(ctx, keys, 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	keys[0] = "changed by the caller"
	if got := blk.Keys(); got[0] != pre+"seat/3" || len(got) != 3 || blk.Key() != pre+"seat/3" {
		t.Fatalf("Keys() %q, Key() %q", got, blk.Key())
	}
	blk.Keys()[1] = "changed through Keys"
	if blk.Keys()[1] != pre+"seat/1" {
		t.Fatal("Keys() does not return a copy")
	}
	held, err := a.Held(ctx)
	if err != nil || len(held) != 3 {
		t.Fatalf("Held: %v, %v", held, err)
	}
	for _, k := range blk.Keys() {
		if held[k] != blk.Token() {
			t.Fatalf("Held %v: %s not under the block's token %d", held, k, blk.Token())
		}
		if _, err := b.Acquire(ctx, k, 30*time.Second, 0); !errors.Is(err, ticketing.ErrBusy) {
			t.Fatalf("%s while the block holds it: %v, want ErrBusy", k, err)
		}
	}
	if err := blk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b2, err := b.AcquireBlock(ctx, blk.Keys(), 30*time.Second, time.Second)
	if err != nil || b2.Token() <= blk.Token() {
		t.Fatalf("the keys after Release: %v, %v", b2, err)
	}
	if err := b.Release(ctx, pre+"seat/2", b2.Token()); err != nil { // any key releases the block
		t.Fatal(err)
	}
	if h, err := b.Held(ctx); err != nil || len(h) != 0 {
		t.Fatalf("Held after Release by the last key: %v, %v", h, err)
	}
	// Invalid key sets are refused before anything is sent.
	before := ticketing.Written(a)
	for _, ks := range [][]string{nil, {"a", "b", "a"}, make([]string, 17), {"ok", "with space"}} {
		if len(ks) == 17 {
			for i := range ks {
				ks[i] = fmt.Sprintf("k%d", i)
			}
		}
		if _, err := a.AcquireBlock(ctx, ks, 30*time.Second, 0); !errors.Is(err, ticketing.ErrInvalidArgument) {
			t.Errorf("AcquireBlock(%q): %v, want ErrInvalidArgument", ks, err)
		}
	}
	if _, err := a.AcquireBlock(ctx, []string{"a", "b"}, 1500*time.Millisecond, 0); !errors.Is(err, ticketing.ErrInvalidArgument) {
		t.Errorf("lease 1.5s: %v", err)
	}
	if n := ticketing.Written(a); n != before {
		t.Fatalf("%d lines written for invalid arguments", n-before)
	}
	// The sidecar's own check, over Do.
	r, err := a.Do(ctx, "ACQUIRE "+pre+"x "+pre+"x 30 0")
	if err != nil || !strings.HasPrefix(r, "ERR invalid_keys ") {
		t.Fatalf("duplicate key: %q, %v", r, err)
	}
}

// A cancelled context ends a waiting AcquireBlock at once, as for Acquire;
// the block granted later anyway is released by the Client, so the keys
// do not stay held until the lease ends.
func TestAcquireBlockContextCancelled(t *testing.T) {
	sock := sidecarSocket(t)
	ctx := context.Background()
	holder, waiter, next := dialT(t, sock), dialT(t, sock), dialT(t, sock)
	pre := fmt.Sprintf("goblockctx/%d/", time.Now().UnixNano())
	keys := []string{pre + "a", pre + "b"}
	tok, err := holder.Acquire(ctx, keys[1], 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = waiter.AcquireBlock(cctx, keys, 60*time.Second, 20*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("AcquireBlock with an ended context: %v after %v", err, time.Since(start))
	}
	// The block is still queued at the sidecar: release the blocker, the
	// block is granted to nobody waiting and released by the Client.
	if err := holder.Release(ctx, keys[1], tok); err != nil {
		t.Fatal(err)
	}
	// FIFO: the orphaned block stood first, so next gets the keys only once
	// the Client released that grant.
	if _, err := next.AcquireBlock(ctx, keys, 30*time.Second, 10*time.Second); err != nil {
		t.Fatalf("the keys after the late grant: %v", err)
	}
	testkit.WaitFor(t, "the late grant released", 5*time.Second, func() bool {
		h, err := waiter.Held(ctx)
		return err == nil && len(h) == 0
	})
}

// fakeSidecar serves one reply per request line from answer, and records
// the lines it was sent.
func fakeSidecar(t *testing.T, answer func(line string) string) (string, func() []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var lines []string
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				sc := bufio.NewScanner(conn)
				for sc.Scan() {
					mu.Lock()
					lines = append(lines, sc.Text())
					mu.Unlock()
					_, _ = fmt.Fprintf(conn, "%s\n", answer(sc.Text()))
				}
			}()
		}
	}()
	return path, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
}

// Against a version-1 sidecar (HELLO is an unknown verb there) a block is
// refused with ErrNotSupported and its ACQUIRE never sent; a one-key
// AcquireBlock is the version-1 ACQUIRE and works there.
func TestAcquireBlockVersion1Sidecar(t *testing.T) {
	path, sent := fakeSidecar(t, func(line string) string {
		switch {
		case strings.HasPrefix(line, "HELLO"):
			return `ERR unknown_verb unixapi: unknown verb: "HELLO" (verbs are PING, ACQUIRE, RELEASE, INFO, HELD; upper case)`
		case strings.HasPrefix(line, "ACQUIRE "):
			if len(strings.Fields(line)) != 4 {
				return "ERR bad_request wrong number of fields"
			}
			return "OK 7"
		}
		return "OK"
	})
	ctx := context.Background()
	c := dialT(t, path)
	blk, err := c.AcquireBlock(ctx, []string{"only"}, 30*time.Second, 0)
	if err != nil || blk.Token() != 7 || len(blk.Keys()) != 1 {
		t.Fatalf("one-key block on a version-1 sidecar: %v, %v", blk, err)
	}
	for range 2 { // HELLO is asked once per Client
		_, err = c.AcquireBlock(ctx, []string{"a", "b"}, 30*time.Second, 0)
		if !errors.Is(err, ticketing.ErrNotSupported) || !strings.Contains(err.Error(), "version 1") {
			t.Fatalf("block on a version-1 sidecar: %v, want ErrNotSupported naming version 1", err)
		}
	}
	if v, err := c.Hello(ctx); v != 1 || err != nil {
		t.Fatalf("Hello: %d, %v", v, err)
	}
	// Dial's HELLO (with the events option) is the only one; the block's
	// ACQUIRE is never sent.
	want := []string{"HELLO 9 events", "ACQUIRE only 30 0.000"}
	if got := sent(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("sent %q, want %q", got, want)
	}
}
