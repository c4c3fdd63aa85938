package cluster_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/wire"
)

// Attack 42, finding 5: hostile or mistyped admin revokes are refused and
// leave alice's holding untouched, but an invalid key or an invalid "by"
// is answered with code "internal" (the node's own failure), not a clear
// bad_request: the mapping to ErrBadConfig that a5a4994 meant for the
// revoke case landed in admin()'s AdminOpMembers case (after its return),
// where n.Members never returns those errors.
func TestAttack42_HostileRevokes(t *testing.T) {
	c, li := a42Start(t)
	tA := mustGrant(t, do(t, c.dial(li), acquireMsg("k", "alice", 120, 0)))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := c.admin().Config
	var internal []string
	for _, req := range []wire.AdminRequest{
		{Key: "k", Token: tA, By: "", Reason: "x"},
		{Key: "k", Token: tA, By: strings.Repeat("o", 129), Reason: "x"},
		{Key: "k", Token: tA, By: "ops", Reason: strings.Repeat("r", 129)},
		{Key: "k", Token: tA, By: "ops", Reason: " lead"},
		{Key: "k", Token: tA, By: "ops", Reason: "new\nline"},
		{Key: "k", Token: tA, By: "ops\u00e9", Reason: "x"},
		{Key: "", Token: tA, By: "ops", Reason: "x"},
		{Key: strings.Repeat("k", 300), Token: tA, By: "ops", Reason: "x"},
		{Key: "k", Token: math.MaxUint64, By: "ops", Reason: "x"},
		{Key: "k", Token: tA - 1, By: "ops", Reason: "x"},
		{Key: "k", Token: tA, By: "ops", Reason: strings.Repeat("r", 1<<20)},
	} {
		req.Op = wire.AdminOpRevoke
		rep, err := client.AdminDo(ctx, c.AdminAddr(li), cfg, req)
		if err == nil {
			t.Errorf("revoke %q by %q token %d reason %.20q: accepted %+v", req.Key, req.By, req.Token, req.Reason, rep.Revoked)
		} else {
			t.Logf("by %.10q key %.10q token %d reason %.10q: %v (code %q)", req.By, req.Key, req.Token, req.Reason, err, rep.Code)
			if rep.Code == wire.AdminInternal {
				internal = append(internal, err.Error())
			}
		}
		if kr, _ := c.Node(li).Inspect("k"); kr.Holder == nil || kr.Holder.Token != tA {
			t.Fatalf("alice's holding changed: %+v", kr.Holder)
		}
	}
	if len(internal) > 0 {
		t.Errorf("operator typos answered as the node's own failure (code internal): %q", internal)
	}
	// The admin port still serves.
	if _, err := client.AdminDo(ctx, c.AdminAddr(li), cfg, wire.AdminRequest{Op: wire.AdminOpInspect, Key: "k"}); err != nil {
		t.Fatalf("admin port after the hostile revokes: %v", err)
	}
}

// Attack 42, finding 7 (report): the revoke's reply promises next_token,
// "the waiter granted in the same commit", but Node.Revoke reads it from
// st.Holder(key), which knows no semaphore: the revoke of a permit whose
// slot went to the queue's head in the same commit reports no next token.
// (And for a lock it is read after the apply, so a later grant of the key
// can be reported as the one of the same commit.)
func TestAttack42_RevokePermitReportsNoNextToken(t *testing.T) {
	c, li := a42Start(t)
	conn := c.dial(li)
	mustType(t, do(t, conn, setPermitsMsg("seats", 1)), wire.TypeOK)
	tA := mustPermit(t, do(t, conn, permitMsg("seats", "a", 60, 0)), 0)
	call, err := c.dial(li).Start(permitMsg("seats", "b", 60, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := c.admin().Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "seats", Token: tA, By: "ops", Reason: "x"})
	if err != nil {
		t.Fatal(err)
	}
	<-call.Done
	tB := mustPermit(t, call.Reply, 0)
	if rep.Revoked.NextToken != tB {
		t.Fatalf("revoke of permit %d: reply's next_token %d, but b was granted %d in the same commit", tA, rep.Revoked.NextToken, tB)
	}
}
