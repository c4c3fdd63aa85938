package ticketing_test

import (
	"context"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// Attack round 2 on issue 42 (revoke). One Client, two Locks pipelined on
// its one connection: Lock(A) waits in line behind another holder, then
// Lock(B) is granted at once, but its "OK <T>" reply must wait behind A's
// (replies come in request order). An operator revokes B's token T
// meanwhile. The sidecar writes "! REVOKED T ..." and "! LOST T revoked B"
// at once (events never wait for replies), i.e. BEFORE "OK T". The Go
// client's reader finds no Lock of T yet and drops the event (Python and
// Node keep such "unclaimed" events for the Lock that registers next);
// then "OK T" makes a Lock that is never lost: the revoked holder is not
// told, though the sidecar told it, and it keeps working under a token
// the cluster revoked until its local deadline or next EXTEND.
func TestAttack42b_GoClientDropsLostBeforeItsOK(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, b, sock, admin := revokeRig(t, ctx)

	// Someone else holds A.
	other, err := b.Acquire(ctx, "go42b/a", "other-holder", 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}

	cl, err := ticketing.Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	if v, err := cl.Hello(ctx); err != nil || v < 9 {
		t.Fatalf("Hello: %d %v", v, err)
	}
	queued := make(chan struct{})
	type res struct {
		l   *ticketing.Lock
		err error
	}
	aDone := make(chan res, 1)
	go func() {
		l, err := cl.Lock(ctx, "go42b/a", 60*time.Second, 30*time.Second, ticketing.WithQueued(func() { close(queued) }))
		aDone <- res{l, err}
	}()
	select {
	case <-queued:
	case <-time.After(20 * time.Second):
		t.Fatal("Lock(A) was not queued")
	}
	bDone := make(chan res, 1)
	go func() {
		l, err := cl.Lock(ctx, "go42b/b", 200*time.Second, 0)
		bDone <- res{l, err}
	}()
	// B is granted in the cluster; its OK waits behind A's reply.
	var tokB uint64
	testkit.WaitFor(t, "B held", 20*time.Second, func() bool {
		rep, err := admin.Do(ctx, wire.AdminRequest{Op: wire.AdminOpInspect, Key: "go42b/b", LeaderOnly: true})
		if err != nil || rep.Key == nil || !rep.Key.Held || rep.Key.Holder == nil {
			return false
		}
		tokB = rep.Key.Holder.Token
		return true
	})
	rep, err := admin.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "go42b/b", Token: tokB, By: "ops@host", Reason: "stuck"})
	if err != nil || rep.Revoked == nil || rep.Revoked.Token != tokB {
		t.Fatalf("revoke: %+v %v", rep, err)
	}
	time.Sleep(time.Second) // the sidecar writes ! REVOKED / ! LOST now
	// A's holder lets go: A's reply, then B's OK come.
	if err := b.Release(ctx, other); err != nil {
		t.Fatal(err)
	}
	ra := <-aDone
	if ra.err != nil {
		t.Fatalf("Lock(A): %v", ra.err)
	}
	defer func() { _ = ra.l.Release(context.Background()) }()
	rb := <-bDone
	if rb.err != nil {
		// Also acceptable: the client refuses to hand out a Lock it was
		// told is gone.
		t.Logf("Lock(B): %v", rb.err)
		return
	}
	if rb.l.Token() != tokB {
		t.Fatalf("Lock(B) token %d, revoked %d", rb.l.Token(), tokB)
	}
	select {
	case <-rb.l.Lost():
		if r := rb.l.LostReason(); r != ticketing.LostRevoked {
			t.Fatalf("lost as %q, want revoked", r)
		}
	case <-time.After(3 * time.Second):
		held, _ := cl.Held(ctx)
		t.Fatalf("the Lock of token %d, which an operator revoked (and the sidecar forgot: HELD %v), is not lost: LostReason %q, its Context err %v",
			tokB, held, rb.l.LostReason(), rb.l.Context().Err())
	}
}
