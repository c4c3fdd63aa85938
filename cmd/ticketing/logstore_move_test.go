package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/localproc"
)

// The log store on node processes: a bolt data dir upgraded to a build
// whose default is wal, and the runbook that moves a node to the other
// store (docs/operations.md, "Moving a node to the other log store").

// stayOnBoltLine is the start of the warning of a node that the default,
// auto, keeps on its bolt data dir.
const stayOnBoltLine = "this data dir holds a bolt log store (raft.db), so the node stays on bolt"

// withoutFlag is args without flag and the value after it.
func withoutFlag(args []string, flag string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == flag {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// boltProcs starts 3 node processes on the bolt store (--log-store bolt,
// what every data dir written before wal became the default holds), with
// the fast test timeouts (and admin ports with admin), and checks that
// their data dirs hold raft.db.
func boltProcs(t *testing.T, admin bool) (*localproc.Procs, context.Context) {
	t.Helper()
	p, err := localproc.Start(localproc.Options{Binary: binary, Dir: t.TempDir(), Admin: admin,
		ExtraArgs: append(append([]string{}, fastRaftArgs...), "--log-store", "bolt")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute) // a hang guard
	t.Cleanup(cancel)
	if _, err := p.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < p.Size(); i++ {
		if got, err := cluster.DetectLogStore(p.DataDir(i)); err != nil || got != cluster.LogStoreBolt {
			t.Fatalf("%s's data dir holds %q (%v), want bolt", p.ID(i), got, err)
		}
	}
	return p, ctx
}

// The upgrade: a cluster whose data dirs hold bolt, holding locks and
// having granted under load, is stopped and every node started again
// without --log-store (the new default, auto). Each stays on bolt
// (raft.db, no wal/) and logs the warning once; the held locks stay with
// their holders, tokens go on strictly increasing above every old one,
// and the cluster serves.
func TestUpgradeFromBoltKeepsServing(t *testing.T) {
	p, ctx := boltProcs(t, false)
	b := procsBroker(t, p)
	held := holdLocks(t, ctx, b, 3)
	from := time.Now()
	load := startLoad(b, 4)
	load.waitGrants(t, 50)
	for i := 0; i < p.Size(); i++ {
		if err := p.Signal(i, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	seen := load.maxToken()
	for i := 0; i < p.Size(); i++ {
		if b, err := os.ReadFile(p.LogFile(i)); err != nil || strings.Contains(string(b), stayOnBoltLine) {
			t.Fatalf("%s warned that it stays on bolt while started with --log-store bolt (%v)", p.ID(i), err)
		}
		if err := p.SetArgs(i, withoutFlag(p.Args(i), "--log-store")); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	load.waitGrants(t, 50)
	if m := load.maxToken(); m <= seen {
		t.Fatalf("after the upgrade the largest token is %d, not above %d from before", m, seen)
	}
	gap := load.finish(t, from, time.Now())
	t.Logf("longest time without a grant across the upgrade: %v", gap)
	settled(t, ctx, p, load.maxToken())
	checkHeld(t, ctx, b, held)
	for i := 0; i < p.Size(); i++ {
		if slices.Contains(p.Args(i), "--log-store") {
			t.Fatalf("%s restarted with %q", p.ID(i), p.Args(i))
		}
		if got, err := cluster.DetectLogStore(p.DataDir(i)); err != nil || got != cluster.LogStoreBolt {
			t.Fatalf("%s's data dir holds %q (%v) after the upgrade, want bolt", p.ID(i), got, err)
		}
		if _, err := os.Stat(filepath.Join(p.DataDir(i), "wal")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: a wal/ beside raft.db after the upgrade (%v)", p.ID(i), err)
		}
		b, err := os.ReadFile(p.LogFile(i))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), stayOnBoltLine); n != 1 || !strings.Contains(string(b), "level=WARN") {
			t.Fatalf("%s logged %d warnings that it stays on bolt, want 1:\n%s", p.ID(i), n, b)
		}
	}
}

// The runbook of docs/operations.md ("Moving a node to the other log
// store"), step by step, on a 3-node bolt cluster under load, holding
// locks: one node at a time, (1) note its server id (members list), (2)
// stop it, (3) move its data dir aside, (4) start it with an empty data
// dir and without --log-store bolt (the default gives wal), (5) run the
// repair that members list prints, `members replace OLD NEW ADDR`. The
// first node moved is a follower, the second the leader. The cluster
// keeps its locks, its tokens increase, every member is an answering
// voter, and the moved nodes hold wal/ and no raft.db.
func TestMoveNodesToWALByReplace(t *testing.T) {
	p, ctx := boltProcs(t, true)
	b := procsBroker(t, p)
	e := &replaceEnv{t: t, p: p, b: b, ctx: ctx, load: startLoad(b, 4)}
	held := holdLocks(t, ctx, b, 3)
	from := time.Now()
	e.load.waitGrants(t, 20)
	var ids []string
	for i := 0; i < p.Size(); i++ {
		ids = append(ids, e.serverID(i))
	}
	li, err := p.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{(li + 1) % p.Size(), li} {
		seen := e.load.maxToken()
		// (1) Its server id, as members list shows it.
		oldID := ids[i]
		if out, err := e.members("list"); err != nil || !strings.Contains(out, oldID) {
			t.Fatalf("members list does not name %s: %v\n%s", oldID, err, out)
		}
		// (2) Stop it; (3) move its data dir aside (kept until the move is
		// done, never used again by this server).
		if err := p.Signal(i, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p.DataDir(i), p.DataDir(i)+".bolt-old"); err != nil {
			t.Fatal(err)
		}
		// (4) Start it with an empty data dir, the same addresses, and
		// without --log-store bolt.
		if err := p.SetArgs(i, withoutFlag(p.Args(i), "--log-store")); err != nil {
			t.Fatal(err)
		}
		if err := p.Start(i); err != nil {
			t.Fatal(err)
		}
		newID, err := p.ServerID(i, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		// (5) members list names the new incarnation and prints the
		// repair; run it as printed.
		repair := fmt.Sprintf("ticketing members replace %s %s %s", oldID, newID, p.PeerAddr(i))
		e.waitList(repair)
		f := strings.Fields(repair)
		e.replace(f[3], f[4], f[5])
		ids[i] = newID
		e.wantMembers(ids)
		e.load.waitGrants(t, 20)
		if m := e.load.maxToken(); m <= seen {
			t.Fatalf("after moving %s the largest token is %d, not above %d from before", p.ID(i), m, seen)
		}
		if got, err := cluster.DetectLogStore(p.DataDir(i)); err != nil || got != cluster.LogStoreWAL {
			t.Fatalf("%s's data dir holds %q (%v) after the move, want wal", p.ID(i), got, err)
		}
		if _, err := os.Stat(filepath.Join(p.DataDir(i), "raft.db")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: a raft.db after the move (%v)", p.ID(i), err)
		}
		// Done: the old data dir can go.
		if err := os.RemoveAll(p.DataDir(i) + ".bolt-old"); err != nil {
			t.Fatal(err)
		}
	}
	gap := e.load.finish(t, from, time.Now())
	t.Logf("longest time without a grant while two nodes moved: %v", gap)
	if gap > maxGrantGap {
		t.Fatalf("no grant for %v (at most %v)", gap, maxGrantGap)
	}
	settled(t, ctx, p, e.load.maxToken())
	checkHeld(t, ctx, b, held)
}
