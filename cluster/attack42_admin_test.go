package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// a42CutReplyProxy forwards one TCP connection at a time to target; once
// the client's bytes carry a revoke request, the server's reply is
// dropped and both sides are closed: a connection reset after the request
// left (a load balancer's idle cut, a NAT, a flaky link).
func a42CutReplyProxy(t *testing.T, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			cl, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				sv, err := net.Dial("tcp", target)
				if err != nil {
					cl.Close()
					return
				}
				var mu sync.Mutex
				armed := false
				closeBoth := func() { cl.Close(); sv.Close() }
				go func() { // client → server
					var seen []byte
					buf := make([]byte, 4096)
					for {
						n, err := cl.Read(buf)
						if n > 0 {
							seen = append(seen, buf[:n]...)
							if bytes.Contains(seen, []byte(`"op":"revoke"`)) {
								mu.Lock()
								armed = true
								mu.Unlock()
							}
							if _, werr := sv.Write(buf[:n]); werr != nil {
								closeBoth()
								return
							}
						}
						if err != nil {
							closeBoth()
							return
						}
					}
				}()
				buf := make([]byte, 4096) // server → client
				for {
					n, err := sv.Read(buf)
					mu.Lock()
					a := armed
					mu.Unlock()
					if a {
						closeBoth() // the reply is lost
						return
					}
					if n > 0 {
						if _, werr := cl.Write(buf[:n]); werr != nil {
							closeBoth()
							return
						}
					}
					if err != nil {
						closeBoth()
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// Attack 42, finding 2: AdminCluster.Do (what `ticketing` tools use) walks
// on to the next admin address after any transport error, resending the
// revoke: a revoke that committed, whose reply was lost with its
// connection, is sent again, and the second one answers token_mismatch
// (or not_held) — which Node.Revoke documents as "nothing changed". The
// operator is told, definitely, that nothing was revoked, while the
// holding was revoked and the key handed to the next waiter. A written
// revoke is resent and its indeterminate outcome reported as a definite
// refusal.
//
// Sequence: alice holds "k" (token T); bob waits; AdminCluster{Addrs:
// [proxy to the leader's admin port, the leader's admin port]}.Do(revoke
// k T); the proxy drops the reply; Do resends to the leader, which
// answers token_mismatch; inspect shows last_revoke T and bob holding.
func TestAttack42_AdminClusterResendsRevoke(t *testing.T) {
	c, li := a42Start(t)
	alice := c.dial(li)
	tA := mustGrant(t, do(t, alice, acquireMsg("k", "alice", 120, 0)))
	call := queueWaiter(t, c, li, c.dial(li), "k", "bob", 60, time.Minute)

	a := c.admin()
	a.Addrs = []string{a42CutReplyProxy(t, c.AdminAddr(li)), c.AdminAddr(li)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "k", Token: tA, By: "ops", Reason: "stuck"})
	<-call.Done
	tB := mustGrant(t, call.Reply)
	kr, _ := c.Node(li).Inspect("k")
	revoked := kr.LastRevoke != nil && kr.LastRevoke.Token == tA
	t.Logf("Do: %v; last revoke %+v; bob holds %d", err, kr.LastRevoke, tB)
	if revoked && (errors.Is(err, locksm.ErrTokenMismatch) || errors.Is(err, locksm.ErrNotHeld)) {
		t.Fatalf("the revoke of %d applied (bob now holds %d), yet the operator's tool answered %v: a resent revoke reported as nothing changed", tA, tB, err)
	}
	if revoked && err != nil && !errors.Is(err, wire.ErrIndeterminate) && !errors.Is(err, io.EOF) {
		t.Fatalf("the revoke applied, the tool answered %v", err)
	}
	_ = client.ErrAdmin
}
