package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// auditLog keeps the records logged at warn level and above, their
// attributes as text.
type auditLog struct {
	mu   sync.Mutex
	recs []map[string]string
}

func (a *auditLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (a *auditLog) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	r.Attrs(func(at slog.Attr) bool {
		m[at.Key] = at.Value.String()
		return true
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recs = append(a.recs, m)
	return nil
}

func (a *auditLog) WithAttrs([]slog.Attr) slog.Handler { return a }
func (a *auditLog) WithGroup(string) slog.Handler      { return a }

// find is the first record with message msg and the attribute values
// kv (key, value, ...); nil if none.
func (a *auditLog) find(msg string, kv ...string) map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
next:
	for _, r := range a.recs {
		if r["msg"] != msg {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if r[kv[i]] != kv[i+1] {
				continue next
			}
		}
		return r
	}
	return nil
}

// lostEvents collects the lost events a connection hears.
type lostEvents struct {
	mu  sync.Mutex
	evs []wire.Msg
}

func (l *lostEvents) add(_ *client.Conn, m wire.Msg) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, m)
}

func (l *lostEvents) list() []wire.Msg {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]wire.Msg(nil), l.evs...)
}

// An operator's revoke over the admin port, on real nodes: a revoke that
// names another token changes nothing; the right one commits, hands the
// key to the waiter with a larger token in the same commit, tells the
// holder's connection why (the lost event, reason revoked, who and why),
// leaves the audit record that inspect shows, and the revoked holder's
// release is refused. A second revoke of the same (old) token changes
// nothing, nor does one of a key nobody holds.
func TestRevoke(t *testing.T) {
	audit := &auditLog{}
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret, Logger: slog.New(audit)})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 14", 40*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionRevoke
	})
	var lost lostEvents
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice, err := client.Dial(ctx, c.ClientAddr(li), client.Config{Secret: c.ClientSecret, ClusterID: c.ClusterID,
		TLS: c.ClientTLS, OnLost: lost.add})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	t1 := mustGrant(t, do(t, alice, acquireMsg("stuck", "alice", 200, 0)))
	bob := c.dial(li)
	call := queueWaiter(t, c, li, bob, "stuck", "bob", 60, time.Minute)
	a := c.admin()

	// Another token: the operator's look at the key is out of date.
	_, err = a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "stuck", Token: t1 + 7, By: "ops@host", Reason: "stale"})
	if !errors.Is(err, locksm.ErrTokenMismatch) {
		t.Fatalf("revoke naming another token: %v, want token_mismatch", err)
	}
	if kr, _ := c.Node(li).Inspect("stuck"); !kr.Held || kr.Holder.Token != t1 || kr.LastRevoke != nil {
		t.Fatalf("after a refused revoke: %+v (holder %+v), want alice's holding untouched and no record", kr, kr.Holder)
	}

	rep, err := a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "stuck", Token: t1, By: "ops@host", Reason: "app crashed, lock stuck"})
	if err != nil {
		t.Fatal(err)
	}
	rv := rep.Revoked
	if rv == nil || rv.Token != t1 || rv.Owner != "alice" || rv.By != "ops@host" || rv.Reason != "app crashed, lock stuck" || rv.AtUnixMs == 0 {
		t.Fatalf("revoke reply: %+v", rv)
	}
	<-call.Done
	t2 := mustGrant(t, call.Reply)
	if t2 <= t1 || rv.NextToken != t2 {
		t.Fatalf("bob granted %d after the revoke of %d; the reply says it went to %d", t2, t1, rv.NextToken)
	}
	if rep.Key == nil || !rep.Key.Held || rep.Key.Holder.Owner != "bob" {
		t.Fatalf("the revoke's reply shows the key as %+v, want bob holding it", rep.Key)
	}
	testkit.WaitFor(t, "alice told of the revoke", 10*time.Second, func() bool { return len(lost.list()) > 0 })
	ev := lost.list()[0]
	if ev.Reason != wire.LostRevoked || ev.Token != t1 || ev.Key != "stuck" || ev.Owner != "ops@host" || ev.Text != "app crashed, lock stuck" {
		t.Fatalf("alice's lost event: %+v", ev)
	}
	if r := do(t, alice, releaseMsg("stuck", "alice", t1)); r.Type != wire.TypeError || (r.Code != wire.CodeTokenMismatch && r.Code != wire.CodeNotHeld) {
		t.Fatalf("the revoked holder's release: %s, want refused", describe(r))
	}

	// The old token again: nothing changes, bob keeps the key.
	_, err = a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "stuck", Token: t1, By: "ops@host", Reason: "again"})
	if !errors.Is(err, locksm.ErrTokenMismatch) {
		t.Fatalf("a second revoke of the revoked token: %v, want token_mismatch", err)
	}
	for i := 0; i < c.Size(); i++ {
		testkit.WaitFor(t, "every node applied the revoke", 10*time.Second, func() bool {
			kr, _ := c.Node(i).Inspect("stuck")
			return kr.Held && kr.Holder.Token == t2 && kr.LastRevoke != nil
		})
		kr, _ := c.Node(i).Inspect("stuck")
		if lr := kr.LastRevoke; lr.Token != t1 || lr.By != "ops@host" || lr.Reason != "app crashed, lock stuck" || lr.Owner != "alice" {
			t.Fatalf("node %d's last revoke of the key: %+v", i, lr)
		}
	}
	// The audit: the leader's log line with who, which key and token, why
	// and when; its counter; the request's own line with the remote.
	li = c.leader()
	if got := metric(t, c.Node(li).MetricsRegistry(), "ticketing_node_revokes_total"); got != 1 {
		t.Fatalf("ticketing_node_revokes_total on the leader = %v, want 1", got)
	}
	if rec := audit.find("lock revoked"); rec == nil || rec["key"] != "stuck" || rec["token"] != fmt.Sprint(t1) || rec["holder"] != "alice" ||
		rec["by"] != "ops@host" || rec["reason"] != "app crashed, lock stuck" || rec["at_unix_ms"] == "" {
		t.Fatalf("the leader's audit line: %v", rec)
	}
	if rec := audit.find("admin revoke request", "ok", "true"); rec == nil || rec["remote"] == "" || rec["token"] != fmt.Sprint(t1) || rec["by"] != "ops@host" {
		t.Fatalf("the admin request's line: %v", rec)
	}
	if _, err := a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "free", Token: 5, By: "ops", Reason: "x"}); !errors.Is(err, locksm.ErrNotHeld) {
		t.Fatalf("revoke of a key nobody holds: %v, want not_held", err)
	}
	if _, err := a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "stuck", Token: t2, By: "ops", Reason: "bad\x01reason"}); !errors.Is(err, locksm.ErrInvalidReason) {
		t.Fatalf("revoke with a control byte in its reason: %v, want invalid_reason", err)
	}
	if _, err := a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "stuck", By: "ops", Reason: "no token"}); !errors.Is(err, wire.ErrBadRequest) {
		t.Fatalf("revoke without a token: %v, want bad_request", err)
	}
	if kr, _ := c.Node(li).Inspect("stuck"); kr.Holder == nil || kr.Holder.Token != t2 {
		t.Fatalf("after the refused revokes bob's holding is %+v", kr.Holder)
	}
	// Over the admin port of a follower: not_leader (the tool walks on).
	fi := follower(c, li)
	a1 := c.admin()
	if _, err := client.AdminDo(ctx, c.AdminAddr(fi), a1.Config, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "stuck", Token: t2, By: "ops", Reason: "x"}); !errors.Is(err, cluster.ErrNotLeader) {
		t.Fatalf("revoke asked of a follower: %v, want not_leader", err)
	}
}

// A revoke of a permit ends that permit only, and a revoke of a block
// (named by any of its keys) ends the whole block.
func TestRevokePermitAndBlock(t *testing.T) {
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret})
	li := c.leader()
	testkit.WaitFor(t, "cluster version 14", 40*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionRevoke
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := c.dial(li)
	mustType(t, do(t, conn, setPermitsMsg("seats", 2)), wire.TypeOK)
	p0 := do(t, conn, permitMsg("seats", "a", 60, 0))
	p1 := do(t, conn, permitMsg("seats", "b", 60, 0))
	mustPermit(t, p0, 0)
	mustPermit(t, p1, 1)
	a := c.admin()
	rep, err := a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "seats", Token: p1.Token, By: "ops", Reason: "seat stuck"})
	if err != nil || rep.Revoked == nil || !rep.Revoked.Permit || rep.Revoked.Slot != 1 || rep.Revoked.Owner != "b" {
		t.Fatalf("revoke of a permit: %v %+v", err, rep.Revoked)
	}
	if kr, _ := c.Node(li).Inspect("seats"); kr.Semaphore == nil || kr.Semaphore.Held != 1 || len(kr.Permits) != 1 || kr.Permits[0].Token != p0.Token {
		t.Fatalf("after revoking one permit: %+v", kr)
	}

	tb := mustGrant(t, do(t, conn, wire.Msg{Type: wire.TypeAcquireBlock, Keys: []string{"row-1", "row-2"}, Owner: "c", Lease: 60}))
	if _, err := a.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "row-2", Token: tb, By: "ops", Reason: "block stuck"}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"row-1", "row-2"} {
		if kr, _ := c.Node(li).Inspect(k); kr.Held {
			t.Fatalf("%s still held after its block's revoke: %+v", k, kr.Holder)
		}
	}
}

// The leader proposes op 16 only once every member speaks version 14: an
// older member could not decode it, and its table would diverge.
func TestRevokeNeedsVersion14(t *testing.T) {
	c := startClusterOpts(t, local.Options{AdminSecret: adminSecret,
		Tune: func(cfg *cluster.Config) { cfg.ProtocolVersion = wire.VersionSemaphores }})
	li := c.leader()
	t1 := mustGrant(t, do(t, c.dial(li), acquireMsg("k", "a", 60, 0)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.admin().Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: "k", Token: t1, By: "ops", Reason: "x"}); !errors.Is(err, wire.ErrNotSupported) {
		t.Fatalf("revoke on a version 13 cluster: %v, want not_supported", err)
	}
	if kr, _ := c.Node(li).Inspect("k"); kr.Holder == nil || kr.Holder.Token != t1 {
		t.Fatalf("after a refused revoke: %+v", kr.Holder)
	}
}
