package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
)

// `ticketing revoke` against a real TLS cluster: without --token it
// revokes exactly the holder it read, hands the key to the waiter and
// prints both; inspect shows the last revoke; naming the old token again
// changes nothing (exit 1); a semaphore wants --token; the flags are
// checked before anything is sent.
func TestRevokeCommand(t *testing.T) {
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
	r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquire, Key: "gate/7", Owner: "alice", Lease: 200})
	if err != nil || r.Type != wire.TypeGranted {
		t.Fatalf("acquire: %v %+v", err, r)
	}
	t1 := r.Token
	bob, err := conn.Start(wire.Msg{Type: wire.TypeAcquire, Key: "gate/7", Owner: "bob", Lease: 30, WaitMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "bob queued", 20*time.Second, func() bool {
		kr, err := c.Node(li).Inspect("gate/7")
		return err == nil && kr.QueueLen == 1
	})
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(args, &out, &errb)
		return code, out.String(), errb.String()
	}

	// Checked before dialling: no reason, a bad reason, a bad key.
	for _, args := range [][]string{
		{"revoke", "gate/7"},
		{"revoke", "gate/7", "--reason", "tab\there"},
		{"revoke", "bad key", "--reason", "x"},
		{"revoke", "--reason", "x"},
	} {
		if code, _, errs := run(append(args, flags...)...); code != ExitUsage {
			t.Fatalf("%q: exit %d, want %d\n%s", args, code, ExitUsage, errs)
		}
	}

	code, out, errs := run(append([]string{"revoke", "gate/7", "--reason", "app hung, lock stuck", "--by", "oncall@ops"}, flags...)...)
	<-bob.Done
	if bob.Reply.Type != wire.TypeGranted || bob.Reply.Token <= t1 {
		t.Fatalf("bob after the revoke: %+v", bob.Reply)
	}
	t2 := bob.Reply.Token
	if code != ExitOK || !strings.Contains(errs, "revoking gate/7 held by alice, token "+itoa(t1)) ||
		!strings.Contains(out, "Revoked gate/7: token "+itoa(t1)+" of alice by oncall@ops at ") ||
		!strings.Contains(out, ": app hung, lock stuck") || !strings.Contains(out, "Handed to bob, token "+itoa(t2)) {
		t.Fatalf("revoke: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("ticketing revoke gate/7:\n%s%s", errs, out)

	code, out, errs = run(append([]string{"inspect", "gate/7"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "Holder:       bob, token "+itoa(t2)) ||
		!strings.Contains(out, "Last revoke:  token "+itoa(t1)+" of alice by oncall@ops at ") {
		t.Fatalf("inspect after the revoke: exit %d\n%s%s", code, out, errs)
	}

	// The old token again (a rerun after exit 77): revoked already, as
	// the key's last revoke says; nothing changes.
	code, out, errs = run(append([]string{"revoke", "gate/7", "--token", itoa(t1), "--reason", "again"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "Already revoked gate/7: token "+itoa(t1)+" of alice by oncall@ops") {
		t.Fatalf("revoke of the revoked token again: exit %d\n%s%s", code, out, errs)
	}
	// A made-up token: refused, nothing changes.
	code, out, errs = run(append([]string{"revoke", "gate/7", "--token", itoa(t1 - 1), "--reason", "again"}, flags...)...)
	if code != ExitError || !strings.Contains(errs, "held under another token than "+itoa(t1-1)) || !strings.Contains(errs, "this run revoked nothing") {
		t.Fatalf("revoke of another token: exit %d\n%s%s", code, out, errs)
	}
	if kr, _ := c.Node(li).Inspect("gate/7"); kr.Holder == nil || kr.Holder.Token != t2 {
		t.Fatalf("bob's holding after a refused revoke: %+v", kr.Holder)
	}

	// --json: the record.
	code, out, errs = run(append([]string{"revoke", "gate/7", "--token", itoa(t2), "--reason", "drill", "--json"}, flags...)...)
	var rv wire.RevokeReport
	if code != ExitOK || json.Unmarshal([]byte(out), &rv) != nil || rv.Token != t2 || rv.Owner != "bob" || rv.Reason != "drill" || rv.By == "" {
		t.Fatalf("revoke --json: exit %d\n%s%s", code, out, errs)
	}
	code, _, errs = run(append([]string{"revoke", "gate/7", "--reason", "nobody"}, flags...)...)
	if code != ExitError || !strings.Contains(errs, "gate/7 is not held: nothing to revoke") {
		t.Fatalf("revoke of a free key: exit %d\n%s", code, errs)
	}

	// A semaphore: the permit is named by its token.
	if r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeSetPermits, Key: "pool", Permits: 2}); err != nil || r.Type != wire.TypeOK {
		t.Fatalf("set permits: %v %+v", err, r)
	}
	p, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquirePermit, Key: "pool", Owner: "carol", Lease: 60})
	if err != nil || p.Type != wire.TypeGranted {
		t.Fatalf("permit: %v %+v", err, p)
	}
	if code, _, errs := run(append([]string{"revoke", "pool", "--reason", "x"}, flags...)...); code != ExitUsage || !strings.Contains(errs, "name the permit with --token") {
		t.Fatalf("revoke of a semaphore without --token: exit %d\n%s", code, errs)
	}
	code, out, errs = run(append([]string{"revoke", "pool", "--token", itoa(p.Token), "--reason", "seat stuck"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "permit 0 (token "+itoa(p.Token)+") of carol") || !strings.Contains(out, "slot is free again") {
		t.Fatalf("revoke of a permit: exit %d\n%s%s", code, out, errs)
	}
}
