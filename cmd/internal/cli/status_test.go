package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/sidecar"
)

// `ticketing status` and `ticketing inspect` against a real TLS cluster
// with a held key and two waiters.
func TestStatusAndInspect(t *testing.T) {
	c, flags := adminTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	li, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquire, Key: "seats/12A", Owner: "alice", Lease: 60})
	if err != nil || r.Type != wire.TypeGranted {
		t.Fatalf("acquire: %v %+v", err, r)
	}
	for _, owner := range []string{"bob", "carol"} {
		if _, err := conn.Start(wire.Msg{Type: wire.TypeAcquire, Key: "seats/12A", Owner: owner, Lease: 30, WaitMs: 60_000}); err != nil {
			t.Fatal(err)
		}
	}
	// The waiters are queued once the leader lists both.
	deadline := time.Now().Add(20 * time.Second)
	for {
		kr, err := c.Node(li).Inspect("seats/12A")
		if err == nil && kr.QueueLen == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiters not queued: %v %+v", err, kr)
		}
		time.Sleep(10 * time.Millisecond)
	}

	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(args, &out, &errb)
		return code, out.String(), errb.String()
	}
	leaderID := c.Node(li).ServerID()

	code, out, errs := run(append([]string{"status"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "Answered by:  "+leaderID+" (leader, serving)") ||
		!strings.Contains(out, "1 key held, 2 waiting, last token "+itoa(r.Token)) ||
		!strings.Contains(out, c.Node(li).Domain()) || strings.Count(out, " voter ")+strings.Count(out, " leader ") != 3 {
		t.Fatalf("status: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("ticketing status:\n%s", out)

	code, out, errs = run(append([]string{"status", "--json"}, flags...)...)
	var st wire.StatusReport
	if code != ExitOK || json.Unmarshal([]byte(out), &st) != nil || st.ServerID != leaderID || len(st.Members) != 3 || st.Waiters != 2 {
		t.Fatalf("status --json: exit %d\n%s%s", code, out, errs)
	}

	code, out, errs = run(append([]string{"inspect", "seats/12A"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "Holder:       alice, token "+itoa(r.Token)) ||
		!strings.Contains(out, "(leader's timer)") || !strings.Contains(out, "2 waiting") ||
		!strings.Contains(out, "bob") || strings.Index(out, "bob") > strings.Index(out, "carol") {
		t.Fatalf("inspect: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("ticketing inspect seats/12A:\n%s", out)

	// Extended: the lease counts from the extend, and inspect says when
	// it was renewed and when it ends (the leader's newest timer).
	if r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeExtend, Key: "seats/12A", Owner: "alice", Token: r.Token, Lease: 200}); err != nil || r.Type != wire.TypeOK {
		t.Fatalf("extend: %v %+v", err, r)
	}
	code, out, errs = run(append(append([]string{"inspect"}, flags...), "--json", "seats/12A")...)
	var ext wire.KeyReport
	if code != ExitOK || json.Unmarshal([]byte(out), &ext) != nil || !ext.Held || ext.Holder.RenewedAtUnixMs == 0 ||
		ext.Holder.LeaseSec != 200 || ext.Holder.LeaseRemainingMs < 150_000 || ext.Holder.LeaseFrom != wire.FromLeaderTimer ||
		ext.Holder.LeaseEndsAtUnixMs != ext.AtUnixMs+ext.Holder.LeaseRemainingMs {
		t.Fatalf("inspect --json after an extend: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = run(append([]string{"inspect", "seats/12A"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "Lease:        200s, renewed ") || !strings.Contains(out, "Lease ends:   ") {
		t.Fatalf("inspect after an extend: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("ticketing inspect seats/12A, extended:\n%s", out)

	code, out, errs = run(append(append([]string{"inspect"}, flags...), "--json", "seats/12A")...)
	var kr wire.KeyReport
	if code != ExitOK || json.Unmarshal([]byte(out), &kr) != nil || !kr.Held || kr.Holder.Owner != "alice" ||
		len(kr.Queue) != 2 || kr.Queue[0].Owner != "bob" || kr.Queue[1].Owner != "carol" {
		t.Fatalf("inspect --json: exit %d\n%s%s", code, out, errs)
	}

	code, out, errs = run(append([]string{"inspect", "seats/free"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "none (not held)") || !strings.Contains(out, "0 waiting") {
		t.Fatalf("inspect of a free key: exit %d\n%s%s", code, out, errs)
	}

	// A seat block: its holder lists every key of it; a block waiting for
	// a held key reserves its other key and shows its keys in the queue.
	rb, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquireBlock, Keys: []string{"seats/1A", "seats/1B"}, Owner: "dave", Lease: 60})
	if err != nil || rb.Type != wire.TypeGranted {
		t.Fatalf("block acquire: %v %+v", err, rb)
	}
	if _, err := conn.Start(wire.Msg{Type: wire.TypeAcquireBlock, Keys: []string{"seats/1C", "seats/1B"}, Owner: "erin", Lease: 30, WaitMs: 60_000}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if kr, err := c.Node(li).Inspect("seats/1C"); err == nil && kr.Reserved {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("erin's block never reserved seats/1C")
		}
	}
	code, out, errs = run(append([]string{"inspect", "seats/1B"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "Holder:       dave, token "+itoa(rb.Token)) ||
		!strings.Contains(out, "Block:        2 keys under this token: seats/1A seats/1B") ||
		!strings.Contains(out, "erin") || !strings.Contains(out, "seats/1C seats/1B") {
		t.Fatalf("inspect of a block's key: exit %d\n%s%s", code, out, errs)
	}
	code, out, errs = run(append([]string{"inspect", "seats/1C"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "none (reserved") || !strings.Contains(out, "1 waiting") {
		t.Fatalf("inspect of a reserved key: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("ticketing inspect seats/1C:\n%s", out)

	// One follower's address only: it answers with its own view and says so.
	fi := (li + 1) % c.Size()
	one := append([]string{"--admin", c.AdminAddr(fi)}, flags[2:]...)
	code, out, errs = run(append([]string{"status"}, one...)...)
	if code != ExitOK || !strings.Contains(errs, "no leader among the addresses answered") ||
		!strings.Contains(out, c.Node(fi).ServerID()+" (follower)") || !strings.Contains(out, "known only to the leader") {
		t.Fatalf("status from a follower: exit %d\n%s%s", code, out, errs)
	}

	// An invalid key is a usage error found before any node is asked
	// (issue 42: before, the node's refusal exited 1).
	if code, _, errs := run(append([]string{"inspect", "has space"}, flags...)...); code != ExitUsage || !strings.Contains(errs, "visible ASCII") {
		t.Fatalf("inspect of an invalid key: exit %d\n%s", code, errs)
	}
	if code, _, _ := run(append([]string{"inspect"}, flags...)...); code != ExitUsage {
		t.Fatalf("inspect without a key: exit %d", code)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// `ticketing status` lists the sidecars' sessions and `ticketing inspect`
// names the session of a holder and of a waiter, with the id the
// sidecar's INFO shows (session=), on real nodes of version 7 with a
// real broker.
func TestStatusAndInspectShowSessions(t *testing.T) {
	c, flags := adminTestClusterTuned(t, func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.ProtocolVersion = 7
	})
	bcfg := sidecar.DefaultConfig()
	bcfg.Addrs, bcfg.Secret, bcfg.ClusterID, bcfg.TLS = c.ClientAddrs(), c.ClientSecret, c.ClusterID, c.ClientTLS
	bcfg.SessionTimeout = 12 * time.Second
	b, err := sidecar.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	testkit.WaitFor(t, "the broker's session attached", 30*time.Second, func() bool {
		si := b.Info().Session
		return si != nil && si.State == "attached"
	})
	id := strconv.FormatUint(b.Info().Session.ID, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lk, err := b.Acquire(ctx, "seats/7", "alice", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan struct{})
	_, err = b.AcquireAsyncOpts([]string{"seats/7"}, "bob", 60*time.Second, 45*time.Second,
		sidecar.AcquireOptions{Queued: func() { close(queued) }}, func(sidecar.Lock, error) {})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-queued:
	case <-ctx.Done():
		t.Fatal("bob never queued")
	}
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(args, &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, errs := run(append([]string{"status"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "Sessions:     1 (1 attached)") ||
		!regexp.MustCompile(`(?m)^`+id+` +yes +12s +0 +1 +1 +\d+$`).MatchString(out) {
		t.Fatalf("status: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("ticketing status:\n%s", out)
	code, out, errs = run(append([]string{"inspect", "seats/7"}, flags...)...)
	if code != ExitOK || !strings.Contains(out, "Holder:       alice, token "+itoa(lk.Token)+", session "+id+"\n") ||
		!regexp.MustCompile(`(?m)^1 +bob +\S+ +\S+ +60s +`+id+` +-$`).MatchString(out) {
		t.Fatalf("inspect: exit %d\n%s%s", code, out, errs)
	}
	t.Logf("ticketing inspect seats/7:\n%s", out)
}
