package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/clients/go/fence"
	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

var revokeAdminSecret = []byte("fence-revoke-admin-secret-0123456789")

// revokeRig is a real 3-node cluster with admin ports, and two hosts'
// sidecars on it (a Broker and a unixapi server each, owners "alice.…"
// and "bob.…"), with a Go client of each.
type revokeRig struct {
	c          *local.Cluster
	admin      *client.AdminCluster
	alice, bob *ticketing.Client
}

func startRevokeRig(t *testing.T) *revokeRig {
	t.Helper()
	c, err := local.Start(local.Options{Dir: t.TempDir(), Tune: local.FastRaft, AdminSecret: revokeAdminSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	// The leader proposes a revoke only once every member speaks version
	// 14, which the cluster records shortly after its first election.
	testkit.WaitFor(t, "cluster version 14", 40*time.Second, func() bool {
		li, err := c.Leader(ctx)
		return err == nil && c.Node(li).ClusterVersion() >= wire.VersionRevoke
	})
	r := &revokeRig{c: c, admin: &client.AdminCluster{
		Config: client.AdminConfig{Secret: revokeAdminSecret, ClusterID: c.ClusterID, TLS: c.ClientTLS}}}
	for i := 0; i < c.Size(); i++ {
		r.admin.Addrs = append(r.admin.Addrs, c.AdminAddr(i))
	}
	r.alice = hostSidecar(t, c, "alice")
	r.bob = hostSidecar(t, c, "bob")
	return r
}

// hostSidecar starts one host's sidecar on c (its own Broker and unixapi
// server, whose owners start with owner) and returns a Client of it.
func hostSidecar(t *testing.T, c *local.Cluster, owner string) *ticketing.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bcfg := sidecar.DefaultConfig()
	bcfg.Addrs, bcfg.Secret, bcfg.ClusterID, bcfg.TLS, bcfg.Logger = c.ClientAddrs(), c.ClientSecret, c.ClusterID, c.ClientTLS, slog.New(slog.DiscardHandler)
	b, err := sidecar.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	dir, err := os.MkdirTemp("", "tkr") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ucfg := unixapi.DefaultConfig()
	ucfg.Path, ucfg.OwnerPrefix, ucfg.Logger = filepath.Join(dir, "s"), owner, slog.New(slog.DiscardHandler)
	srv, err := unixapi.Listen(ucfg, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if err := ticketing.WaitReady(ctx, ucfg.Path); err != nil {
		t.Fatal(err)
	}
	cl, err := ticketing.Dial(ctx, ucfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// inspect is the leader's view of key.
func (r *revokeRig) inspect(t *testing.T, key string) wire.KeyReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	li, err := r.c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kr, err := r.c.Node(li).Inspect(key)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// An operator's revoke, end to end on real parts: a real cluster (admin
// port), real grants through two hosts' sidecars and the Go client, and
// the fencing helpers on SQLite and PostgreSQL. Alice holds the key under
// t1 and writes; bob waits; the operator revokes alice's t1 and bob is
// granted t2 > t1 in that commit and writes. Alice, stalled and still
// believing she holds the key, writes late with t1: the fence refuses it
// in the fencing table (DoLock) and on the row's own token column
// (Update), and the data keeps bob's write. A revoke naming t1 again is
// token_mismatch and changes nothing (bob still holds t2 on every node
// and writes again); a revoke of a made-up token on a free key is
// not_held.
func TestRevokedHoldersWriteIsFenced(t *testing.T) {
	r := startRevokeRig(t)
	forEachDB(t, func(t *testing.T, d db) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		key := "revoke-fence/" + t.Name()
		if _, err := d.ExecContext(ctx, d.q(`INSERT INTO accounts (id, balance) VALUES ($1, 0)`), key); err != nil {
			t.Fatal(err)
		}
		// write does one fenced write of lk's in each form: the fencing
		// table (DoLock: the ledger row's note) and the row's own token
		// column (Update: the account's balance).
		write := func(lk *ticketing.Lock, balance int, note string) (doErr, updErr error) {
			doErr = d.f.DoLock(ctx, d.DB, nil, lk, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, d.q(`INSERT INTO ledger (id, note) VALUES ($1, $2)
					ON CONFLICT (id) DO UPDATE SET note = excluded.note`), key, note)
				return err
			})
			_, updErr = fence.Update{Dialect: d.d, Table: "accounts", Set: d.q("balance = $1"), Where: d.q("id = $2"),
				Args: []any{balance, key}}.Exec(ctx, d.DB, lk.Token())
			return doErr, updErr
		}
		// rows checks what the data says: the ledger's note, the balance
		// and its token, and the fencing table's mark.
		rows := func(what, note string, balance int, token uint64) {
			t.Helper()
			var gotNote string
			if err := d.QueryRowContext(ctx, d.q(`SELECT note FROM ledger WHERE id = $1`), key).Scan(&gotNote); err != nil {
				t.Fatalf("%s: the ledger row: %v", what, err)
			}
			var gotBalance int
			var gotTok int64
			if err := d.QueryRowContext(ctx, d.q(`SELECT balance, fence_token FROM accounts WHERE id = $1`), key).Scan(&gotBalance, &gotTok); err != nil {
				t.Fatalf("%s: the account row: %v", what, err)
			}
			domain, err := fence.Domain(ctx, r.alice)
			if err != nil {
				t.Fatal(err)
			}
			hw, err := d.f.HighWater(ctx, d.DB, domain, key)
			if err != nil {
				t.Fatal(err)
			}
			if gotNote != note || gotBalance != balance || fence.Decode(gotTok) != token || hw != token {
				t.Fatalf("%s: ledger note %q, balance %d under token %d, fence mark %d; want %q, %d under %d, mark %d",
					what, gotNote, gotBalance, fence.Decode(gotTok), hw, note, balance, token, token)
			}
		}

		// 1. Alice takes the key (t1) and writes; bob waits for it.
		a1, err := r.alice.Lock(ctx, key, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		t1 := a1.Token()
		if doErr, updErr := write(a1, 100, "alice t1"); doErr != nil || updErr != nil {
			t.Fatalf("alice's write under t1 %d: DoLock %v, Update %v", t1, doErr, updErr)
		}
		rows("after alice's write", "alice t1", 100, t1)
		type grant struct {
			lk  *ticketing.Lock
			err error
		}
		bobs := make(chan grant, 1)
		go func() {
			lk, err := r.bob.Lock(ctx, key, time.Minute, time.Minute)
			bobs <- grant{lk, err}
		}()
		testkit.WaitFor(t, "bob waiting behind alice", 20*time.Second, func() bool {
			kr := r.inspect(t, key)
			return kr.Held && kr.Holder.Token == t1 && kr.QueueLen == 1
		})
		if kr := r.inspect(t, key); !strings.HasPrefix(kr.Holder.Owner, "alice.") || !strings.HasPrefix(kr.Queue[0].Owner, "bob.") {
			t.Fatalf("the key is held by %q with %q waiting; want alice's sidecar holding and bob's waiting", kr.Holder.Owner, kr.Queue[0].Owner)
		}
		select {
		case g := <-bobs:
			t.Fatalf("bob's acquire ended while alice held the key: %v, %v", g.lk, g.err)
		default:
		}

		// 2. The operator revokes alice's t1: bob is granted t2 > t1 in
		// the same commit, and writes.
		rep, err := r.admin.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: key, Token: t1, By: "ops@test", Reason: "alice stalled"})
		if err != nil {
			t.Fatalf("revoke of %s/%d: %v", key, t1, err)
		}
		rv := rep.Revoked
		if rv == nil || rv.Token != t1 || !strings.HasPrefix(rv.Owner, "alice.") || rv.By != "ops@test" || rv.Reason != "alice stalled" {
			t.Fatalf("revoke reply: %+v", rv)
		}
		var b2 *ticketing.Lock
		select {
		case g := <-bobs:
			if g.err != nil {
				t.Fatalf("bob's acquire after the revoke: %v", g.err)
			}
			b2 = g.lk
		case <-time.After(20 * time.Second):
			t.Fatal("bob was not granted the key within 20 s of the revoke")
		}
		defer func() { _ = b2.Release(context.Background()) }()
		t2 := b2.Token()
		if t2 <= t1 || rv.NextToken != t2 {
			t.Fatalf("bob granted %d after the revoke of %d; the revoke's reply says the key went to %d", t2, t1, rv.NextToken)
		}
		if rep.Key == nil || !rep.Key.Held || rep.Key.Holder.Token != t2 || !strings.HasPrefix(rep.Key.Holder.Owner, "bob.") {
			t.Fatalf("the revoke's reply shows the key as %+v, want bob holding it under %d", rep.Key, t2)
		}
		if doErr, updErr := write(b2, 200, "bob t2"); doErr != nil || updErr != nil {
			t.Fatalf("bob's write under t2 %d: DoLock %v, Update %v", t2, doErr, updErr)
		}
		rows("after bob's write", "bob t2", 200, t2)

		// 3. Alice's late write under t1 (she has not noticed the revoke
		// yet): refused in both forms, and the data keeps bob's write.
		doErr, updErr := write(a1, 999, "alice late")
		if !errors.Is(doErr, fence.ErrStale) || !errors.Is(updErr, fence.ErrStale) {
			t.Fatalf("alice's late write under the revoked t1 %d: DoLock %v, Update %v; want ErrStale from both", t1, doErr, updErr)
		}
		rows("after alice's late write", "bob t2", 200, t2)
		// Her client hears of it too (the cluster's lost event, through
		// her sidecar).
		select {
		case <-a1.Lost():
			t.Logf("alice's client: lock lost (%s)", a1.LostReason())
		case <-time.After(10 * time.Second):
			t.Fatalf("alice's lock of %s/%d is not lost 10 s after its revoke", key, t1)
		}

		// 4. A revoke naming the old t1 again changes nothing: bob keeps
		// t2 on every node, and his next write goes through.
		if _, err := r.admin.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: key, Token: t1, By: "ops@test", Reason: "again"}); !errors.Is(err, locksm.ErrTokenMismatch) {
			t.Fatalf("a second revoke of the revoked t1: %v, want token_mismatch", err)
		}
		for i := 0; i < r.c.Size(); i++ {
			testkit.WaitFor(t, "every node applied the revoke", 10*time.Second, func() bool {
				kr, err := r.c.Node(i).Inspect(key)
				return err == nil && kr.Held && kr.Holder.Token == t2 && kr.LastRevoke != nil
			})
			kr, _ := r.c.Node(i).Inspect(key)
			if !strings.HasPrefix(kr.Holder.Owner, "bob.") || kr.QueueLen != 0 || kr.LastRevoke.Token != t1 || kr.LastRevoke.Reason != "alice stalled" {
				t.Fatalf("node %d after the refused revoke: holder %+v, %d waiting, last revoke %+v; want bob under %d and the first revoke's record",
					i, kr.Holder, kr.QueueLen, kr.LastRevoke, t2)
			}
		}
		if doErr, updErr := write(b2, 300, "bob t2 again"); doErr != nil || updErr != nil {
			t.Fatalf("bob's next write under t2 %d: DoLock %v, Update %v", t2, doErr, updErr)
		}
		rows("after bob's next write", "bob t2 again", 300, t2)
		select {
		case <-b2.Lost():
			t.Fatalf("bob's lock is lost (%s) after a refused revoke", b2.LostReason())
		default:
		}

		// A made-up token on a key nobody holds.
		free := key + "/free"
		if _, err := r.admin.Do(ctx, wire.AdminRequest{Op: wire.AdminOpRevoke, Key: free, Token: t2 + 1000, By: "ops@test", Reason: "made up"}); !errors.Is(err, locksm.ErrNotHeld) {
			t.Fatalf("revoke of the free key %s: %v, want not_held", free, err)
		}
		if kr := r.inspect(t, free); kr.Held || kr.LastRevoke != nil {
			t.Fatalf("the free key after a refused revoke: %+v", kr)
		}
	})
}
