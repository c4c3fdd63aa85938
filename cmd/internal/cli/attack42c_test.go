package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// Issue 42, third attack round: the exit-77 advice ("to try again, name
// it: ticketing revoke KEY --token T ... it never ends a newer holder,
// and answers "Already revoked" if it was") holds only while token T's
// revoke is still the key's LAST revoke. The audit keeps one record per
// key: once the next holder (handed the key by T's revoke) is revoked in
// turn, or, for a semaphore, any other permit of it is, the rerun of T's
// revoke answers exit 1 "is held under another token than T now (the
// holder changed): nothing was revoked" / "not held under token T (not
// any more)": the operator, who had an indeterminate outcome, is told
// the wrong thing about T (it WAS revoked, by the first run).
func TestAttack42c_RerunAfterALaterRevokeOfTheKey(t *testing.T) {
	c, flags := adminTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	li, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "cluster version 14", 40*time.Second, func() bool { return c.Node(li).ClusterVersion() >= wire.VersionRevoke })
	conn, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeSetPermits, Key: "pool", Permits: 2}); err != nil || r.Type != wire.TypeOK {
		t.Fatalf("set permits: %v %+v", err, r)
	}
	p1, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquirePermit, Key: "pool", Owner: "carol", Lease: 60})
	if err != nil || p1.Type != wire.TypeGranted {
		t.Fatalf("permit: %v %+v", err, p1)
	}
	p2, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquirePermit, Key: "pool", Owner: "dave", Lease: 60})
	if err != nil || p2.Type != wire.TypeGranted {
		t.Fatalf("permit: %v %+v", err, p2)
	}
	// The first run's revoke of carol's permit applied (its caller saw
	// exit 77: indeterminate); another operator revokes dave's.
	if _, err := c.Node(li).Revoke(ctx, "pool", p1.Token, "oncall", "seat stuck"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Node(li).Revoke(ctx, "pool", p2.Token, "other", "seat stuck too"); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := Main(append([]string{"revoke", "pool", "--token", itoa(p1.Token), "--reason", "seat stuck"}, flags...), &out, &errb)
	// One audit record is kept per key, so the rerun cannot prove carol's
	// permit was revoked once dave's revoke replaced it; it must not say
	// "nothing was revoked" either (it said so before the fix): it says
	// that this run revoked nothing, and that the token may have been
	// revoked before the key's last revoke.
	if code != ExitError || strings.Contains(errb.String(), "nothing was revoked") ||
		!strings.Contains(errb.String(), "this run revoked nothing") || !strings.Contains(errb.String(), "may have been revoked") {
		t.Fatalf("the rerun the exit-77 message advises, for a permit revoked by the first run: exit %d\n%s%s", code, out.String(), errb.String())
	}
}
