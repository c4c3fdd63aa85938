package netfault

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// SetLinks replaces the whole cut list: links not named are healed, links
// named are cut (existing connections closed, dials refused).
func TestFaultsSetLinksReplacesAll(t *testing.T) {
	f := New()
	f.Cut("n1", "n3")
	f.SetLinks([][2]string{{"n2", "n1"}}, nil)
	if f.IsCut("n1", "n3") {
		t.Fatal("n1-n3 still cut after SetLinks without it")
	}
	if !f.IsCut("n1", "n2") || !f.IsCut("n2", "n1") {
		t.Fatal("n1-n2 not cut in both directions")
	}
	if _, err := f.Dial("n2", "n1", "127.0.0.1:1", time.Second); !errors.Is(err, ErrLinkCut) {
		t.Fatalf("dial on a cut link: %v", err)
	}
	f.Heal()
	if f.IsCut("n1", "n2") {
		t.Fatal("heal left a cut")
	}
}

// Drop closes every connection the Dropper dialled that is still open, and
// only those; the other ends see them end.
func TestDropper(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 3)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var d Dropper
	var conns []net.Conn
	for range 3 {
		c, err := d.Dial(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	conns[0].Close()
	if n := d.Open(); n != 2 {
		t.Fatalf("%d open after one close, want 2", n)
	}
	if n := d.Drop(); n != 2 {
		t.Fatalf("dropped %d, want 2", n)
	}
	if _, err := conns[1].Write([]byte("x")); err == nil {
		t.Fatal("write on a dropped connection succeeded")
	}
	for range 3 {
		srv := <-accepted
		srv.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := srv.Read(make([]byte, 1)); err == nil {
			t.Fatal("the other end read from a dropped connection")
		}
	}
	if n := d.Drop(); n != 0 {
		t.Fatalf("second drop closed %d", n)
	}
}
