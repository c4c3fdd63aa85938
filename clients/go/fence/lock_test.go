package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/clients/go/fence"
	"ticketing/cluster/local"
	"ticketing/sidecar"
	"ticketing/unixapi"
)

// sidecarClient is a Client of a real sidecar: a 3-node cluster, a Broker
// and a unixapi server in this process.
func sidecarClient(t *testing.T) *ticketing.Client {
	t.Helper()
	c, err := local.Start(local.Options{Dir: t.TempDir(), Tune: local.FastRaft})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	bcfg := sidecar.DefaultConfig()
	bcfg.Addrs, bcfg.Secret, bcfg.ClusterID, bcfg.Logger = c.ClientAddrs(), c.ClientSecret, c.ClusterID, slog.New(slog.DiscardHandler)
	b, err := sidecar.New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	dir, err := os.MkdirTemp("", "tkf") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ucfg := unixapi.DefaultConfig()
	ucfg.Path, ucfg.Logger = filepath.Join(dir, "s"), slog.New(slog.DiscardHandler)
	srv, err := unixapi.Listen(ucfg, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if err := ticketing.WaitReady(ctx, ucfg.Path); err != nil {
		t.Fatal(err)
	}
	cl, err := ticketing.Dial(ctx, ucfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// DoLock fences a Lock's writes under INFO's domain (never the cluster
// id), with the lock's keys and token: the high-water marks land under the
// domain, and a newer token recorded under the domain rejects the lock's
// write (ErrStale) with nothing written.
func TestDoLockUsesTheSidecarsDomain(t *testing.T) {
	ctx := context.Background()
	c := sidecarClient(t)
	d := openSQLite(t)
	in, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Domain == "" || in.Domain == in.Cluster {
		t.Fatalf("INFO domain %q, cluster %q: the test needs a named domain apart from the cluster id", in.Domain, in.Cluster)
	}
	if got, err := fence.Domain(ctx, c); err != nil || got != in.Domain {
		t.Fatalf("fence.Domain: %q, %v; INFO's domain is %q", got, err, in.Domain)
	}

	key := "fence-lock/" + t.Name()
	lk, err := c.Lock(ctx, key, 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lk.Release(context.Background()) }() // its lease ends anyway; the test is about the marks
	if err := d.f.DoLock(ctx, d.DB, nil, lk, func(tx *sql.Tx) error { return nil }); err != nil {
		t.Fatalf("DoLock: %v", err)
	}
	if hw, err := d.f.HighWater(ctx, d.DB, in.Domain, key); err != nil || hw != lk.Token() {
		t.Fatalf("high-water under the domain: %d, %v; want the lock's token %d", hw, err, lk.Token())
	}
	if hw, err := d.f.HighWater(ctx, d.DB, in.Cluster, key); err != nil || hw != 0 {
		t.Fatalf("high-water under the cluster id %q: %d, %v; want none", in.Cluster, hw, err)
	}

	// A newer holder wrote under the domain: the lock's write is stale.
	if err := d.f.Do(ctx, d.DB, nil, in.Domain, key, lk.Token()+1, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	ran := false
	err = d.f.DoLock(ctx, d.DB, nil, lk, func(*sql.Tx) error { ran = true; return nil })
	if !errors.Is(err, fence.ErrStale) || ran {
		t.Fatalf("DoLock after a newer token: %v (fn ran: %v), want ErrStale before fn", err, ran)
	}

	// A block: every key's mark, under the domain, in one transaction.
	keys := []string{key + "/a", key + "/b"}
	blk, err := c.LockBlock(ctx, keys, 30*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blk.Release(context.Background()) }() // its lease ends anyway; the test is about the marks
	tx, err := d.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.f.AdvanceLock(ctx, tx, blk); err != nil {
		tx.Rollback()
		t.Fatalf("AdvanceLock: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if hw, err := d.f.HighWater(ctx, d.DB, in.Domain, k); err != nil || hw != blk.Token() {
			t.Fatalf("%s under the domain: %d, %v; want %d", k, hw, err, blk.Token())
		}
	}
}

// DoLock of a permit's Lock fences "<key> <slot>" under the domain: each
// permit marks its own slot, never the bare key; after a newer token wrote
// slot s the holder of slot s is stale, the holder of the other slot not.
func TestDoLockOfAPermitFencesItsSlot(t *testing.T) {
	ctx := context.Background()
	c := sidecarClient(t)
	d := openSQLite(t)
	domain, err := fence.Domain(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	key := "fence-permit/" + t.Name()
	if err := c.SetPermits(ctx, key, 2); err != nil {
		t.Fatal(err)
	}
	var lks []*ticketing.Lock
	for range 2 {
		lk, err := c.LockPermit(ctx, key, 30*time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = lk.Release(context.Background()) }() // its lease ends anyway
		lks = append(lks, lk)
	}
	for _, lk := range lks {
		if err := d.f.DoLock(ctx, d.DB, nil, lk, func(*sql.Tx) error { return nil }); err != nil {
			t.Fatalf("DoLock of slot %d: %v", lk.Slot(), err)
		}
		if hw, err := d.f.HighWater(ctx, d.DB, domain, lk.FenceKey()); err != nil || hw != lk.Token() {
			t.Fatalf("%s: %d, %v; want %d", lk.FenceKey(), hw, err, lk.Token())
		}
	}
	if hw, err := d.f.HighWater(ctx, d.DB, domain, key); err != nil || hw != 0 {
		t.Fatalf("the bare key: %d, %v; want no mark", hw, err)
	}
	// A newer holder wrote the first permit's slot.
	first, second := lks[0], lks[1]
	newer := max(first.Token(), second.Token()) + 1
	if err := d.f.DoPermit(ctx, d.DB, nil, domain, key, first.Slot(), newer, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := d.f.DoLock(ctx, d.DB, nil, first, func(*sql.Tx) error { return nil }); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale holder of slot %d: %v, want ErrStale", first.Slot(), err)
	}
	if err := d.f.DoLock(ctx, d.DB, nil, second, func(*sql.Tx) error { return nil }); err != nil {
		t.Fatalf("holder of slot %d: %v", second.Slot(), err)
	}
}

// A lock whose key reads like a slot's name ("checkout#0") and slot 0 of
// the semaphore "checkout" are independent holdings in the cluster, each
// with its own tokens: their fenced writes are two rows, and neither live
// holder is refused (under "<key>#<slot>" they shared one row, and the
// older token of the two was refused once the newer wrote).
func TestDoLockOfAPermitAndOfALockNamedLikeItsSlot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := sidecarClient(t)
	d := openSQLite(t)
	domain, err := fence.Domain(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetPermits(ctx, "checkout", 2); err != nil {
		t.Fatal(err)
	}
	permit, err := c.LockPermit(ctx, "checkout", time.Minute, 0)
	if err != nil || permit.Slot() != 0 {
		t.Fatalf("permit: %v, %v", permit, err)
	}
	defer func() { _ = permit.Release(context.Background()) }()
	lock, err := c.Lock(ctx, "checkout#0", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Release(context.Background()) }()
	// The newer token writes first, the older second: on one shared row
	// the older live holder would be refused.
	order := []*ticketing.Lock{permit, lock}
	if permit.Token() < lock.Token() {
		order = []*ticketing.Lock{lock, permit}
	}
	for _, lk := range order {
		if err := d.f.DoLock(ctx, d.DB, nil, lk, func(*sql.Tx) error { return nil }); err != nil {
			t.Fatalf("the live holder of %q (token %d, permit %v) is refused: %v", lk.FenceKey(), lk.Token(), lk.Permit(), err)
		}
	}
	for _, lk := range order {
		if hw, err := d.f.HighWater(ctx, d.DB, domain, lk.FenceKey()); err != nil || hw != lk.Token() {
			t.Fatalf("%q: %d, %v; want %d", lk.FenceKey(), hw, err, lk.Token())
		}
	}
	if permit.FenceKey() != "checkout 0" {
		t.Fatalf("the permit's fence key %q, want %q", permit.FenceKey(), "checkout 0")
	}
}
