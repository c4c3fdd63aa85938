package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/localproc"
	"ticketing/cluster/testkit"
	"ticketing/sidecar"
)

// Crash tests of the default log store, wal (no --log-store: a new data
// dir gets wal), and of the bolt store (--log-store bolt) on node processes,
// under acquire/release load through a broker the whole time (startLoad,
// replace_test.go): SIGKILLs during appends, a torn and a cut tail of a
// node's last segment file, and every node killed at once. Each checks
// what a client may rely on: every token unique and strictly increasing
// in real time, the locks granted before the crashes still held by their
// holders, and every node back at the same token high-water mark.

// walProcs starts 3 node processes on the default log store (wal, which
// it checks) with the fast test timeouts, and a broker on them.
func walProcs(t *testing.T) (*localproc.Procs, *sidecar.Broker, context.Context) {
	t.Helper()
	return storeProcs(t, "")
}

// storeProcs starts 3 node processes with --log-store store ("": no flag,
// the default, which must give wal) and the fast test timeouts, and a
// broker on them.
func storeProcs(t *testing.T, store cluster.LogStoreKind) (*localproc.Procs, *sidecar.Broker, context.Context) {
	t.Helper()
	args := append([]string{}, fastRaftArgs...)
	if store != "" {
		args = append(args, "--log-store", string(store))
	}
	p, err := localproc.Start(localproc.Options{Binary: binary, Dir: t.TempDir(), ExtraArgs: args})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		if t.Failed() {
			for i := 0; i < p.Size(); i++ {
				b, _ := os.ReadFile(p.LogFile(i))
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("the last lines of %s's log:\n%s", p.ID(i), strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if _, err := p.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	want := cmp.Or(store, cluster.LogStoreWAL)
	for i := 0; i < p.Size(); i++ {
		if got, err := cluster.DetectLogStore(p.DataDir(i)); err != nil || got != want {
			t.Fatalf("%s's data dir holds %q (%v), want %q", p.ID(i), got, err, want)
		}
	}
	b := procsBroker(t, p)
	return p, b, ctx
}

// retryDefinite runs op until it returns something other than a definite
// "not executed" (ErrMoved, ErrUnavailable: a leader change under way).
func retryDefinite(ctx context.Context, op func() error) error {
	for {
		err := op()
		if !errors.Is(err, sidecar.ErrMoved) && !errors.Is(err, sidecar.ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// holdLocks acquires n keys with a long lease (they must outlive the
// test's crashes) and returns them.
func holdLocks(t *testing.T, ctx context.Context, b *sidecar.Broker, n int) []sidecar.Lock {
	t.Helper()
	var held []sidecar.Lock
	for i := 0; i < n; i++ {
		var lk sidecar.Lock
		err := retryDefinite(ctx, func() (err error) {
			lk, err = b.Acquire(ctx, fmt.Sprintf("held/%d", i), fmt.Sprintf("holder%d", i), 200*time.Second, 0)
			return err
		})
		if err != nil {
			t.Fatalf("held/%d: %v", i, err)
		}
		held = append(held, lk)
	}
	return held
}

// checkHeld checks that every lock in held is still held by its holder
// with its token: another owner gets busy, and the holder's release with
// the token it was granted succeeds.
func checkHeld(t *testing.T, ctx context.Context, b *sidecar.Broker, held []sidecar.Lock) {
	t.Helper()
	for _, lk := range held {
		err := retryDefinite(ctx, func() error {
			_, err := b.Acquire(ctx, lk.Key, "intruder", 5*time.Second, 0)
			return err
		})
		if !errors.Is(err, sidecar.ErrBusy) {
			t.Fatalf("%s (granted token %d before the crashes) to another owner: %v, want busy", lk.Key, lk.Token, err)
		}
		if err := retryDefinite(ctx, func() error { return b.Release(ctx, lk) }); err != nil {
			t.Fatalf("%s: its holder's release with token %d: %v", lk.Key, lk.Token, err)
		}
	}
}

// settled waits until every node reports the same token high-water mark,
// at least min (no token the clients saw is forgotten by any node).
func settled(t *testing.T, ctx context.Context, p *localproc.Procs, min uint64) {
	t.Helper()
	var got []uint64
	ok := testkit.Eventually(30*time.Second, func() bool {
		got = got[:0]
		for i := 0; i < p.Size(); i++ {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := p.Status(sctx, i)
			cancel()
			if err != nil {
				return false
			}
			got = append(got, st.LastToken)
		}
		for _, v := range got {
			if v != got[0] || v < min {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("nodes never settled at one last token of at least %d: %v", min, got)
	}
}

// logSuffixesCleared counts the tail truncations in the nodes' logs (Raft's
// "clearing log suffix"), each of which a restart then had to read back
// (see TestWALRestartAfterTailTruncation in cluster).
func logSuffixesCleared(p *localproc.Procs) int {
	n := 0
	for i := 0; i < p.Size(); i++ {
		b, _ := os.ReadFile(p.LogFile(i))
		n += strings.Count(string(b), "clearing log suffix")
	}
	return n
}

// maxToken is the largest token the load was granted so far.
func (l *loadRun) maxToken() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m uint64
	for _, g := range l.grants {
		m = max(m, g.token)
	}
	return m
}

// SIGKILL of nodes while they append under load on the default store
// (wal), the leader and a follower in turn, each restarted from its data
// dir; then all three at once, restarted together. Every kill provably
// lands inside an append (killMidAppend: a thread of the node stopped
// inside the pwrite or the fsync of a wal segment). Nothing granted is
// lost: the held locks stay with their holders, tokens go on strictly
// increasing, and every node ends at the same last token, at least every
// token a client saw.
func TestWALSIGKILLDuringAppends(t *testing.T) {
	p, b, ctx := walProcs(t)
	sigkillDuringAppends(t, p, b, ctx, []string{"leader", "follower", "leader", "follower"})
}

// The same on the bolt store (--log-store bolt, which data dirs written
// before wal became the default keep), shorter: each kill lands inside a
// pwrite or fdatasync of raft.db.
func TestBoltSIGKILLDuringAppends(t *testing.T) {
	p, b, ctx := storeProcs(t, cluster.LogStoreBolt)
	sigkillDuringAppends(t, p, b, ctx, []string{"leader", "follower"})
}

// sigkillDuringAppends kills the nodes of p under load, one per round
// (the leader or a follower), then all at once, each kill inside an
// append, and checks what a client may rely on.
func sigkillDuringAppends(t *testing.T, p *localproc.Procs, b *sidecar.Broker, ctx context.Context, rounds []string) {
	t.Helper()
	held := holdLocks(t, ctx, b, 5)
	from := time.Now()
	load := startLoad(b, 8)
	load.waitGrants(t, 50)
	for round, role := range rounds {
		li, err := p.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		victim := li
		if role == "follower" {
			victim = (li + 1 + round%2) % p.Size()
		}
		t.Logf("round %d (%s) killed mid-append: %s", round, role, killMidAppend(t, p, victim))
		load.waitGrants(t, 30) // the other two carry on
		if err := p.Start(victim); err != nil {
			t.Fatal(err)
		}
		load.waitGrants(t, 30)
	}

	// Every node at once, while one of them is inside an append (all
	// stopped, then killed together).
	all := make([]int, p.Size())
	for i := range all {
		all[i] = i
	}
	t.Logf("all three killed mid-append: %s", killMidAppend(t, p, all...))
	seen := load.maxToken()
	for i := 0; i < p.Size(); i++ {
		if err := p.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	load.waitGrants(t, 50)
	if m := load.maxToken(); m <= seen {
		t.Fatalf("after all three restarted the largest token is %d, not above %d from before", m, seen)
	}
	gap := load.finish(t, from, time.Now())
	t.Logf("longest time without a grant: %v; log suffixes cleared: %d", gap, logSuffixesCleared(p))
	settled(t, ctx, p, load.maxToken())
	checkHeld(t, ctx, b, held)
	for i := 0; i < p.Size(); i++ {
		if p.Exited(i) {
			t.Fatalf("node %s exited on its own (log %s)", p.ID(i), p.LogFile(i))
		}
	}
}

// A node killed under load and its last wal segment damaged. The leader's
// gets a torn append after its last commit frame (what a crash in the
// middle of an append leaves): raft-wal drops that partial record, and the
// node comes back with every entry it had. A follower's last committed
// batch is cut in the middle (beyond what a crash can do: that batch was
// fsynced and acknowledged): raft-wal drops that batch too, silently, and
// the node comes back with a shorter log, as a follower, and is sent the
// entries again. Either way the cluster stays correct: held locks held,
// tokens strictly increasing, every node at the same last token.
func TestWALTornTail(t *testing.T) {
	p, b, ctx := walProcs(t)
	held := holdLocks(t, ctx, b, 3)
	from := time.Now()
	load := startLoad(b, 8)
	load.waitGrants(t, 50)
	lastIndex := func(i int) (uint64, uint64) {
		t.Helper()
		s, err := cluster.OpenLogStore(p.DataDir(i), cluster.LogStoreWAL)
		if err != nil {
			t.Fatalf("%s's wal offline: %v", p.ID(i), err)
		}
		defer func() { _ = s.Close() }() // only read
		last, err := s.LastIndex()
		if err != nil {
			t.Fatal(err)
		}
		term, err := s.GetUint64([]byte("CurrentTerm"))
		if err != nil {
			t.Fatal(err)
		}
		return last, term
	}

	// The leader, torn mid-append.
	li, err := p.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(li, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	before, term := lastIndex(li)
	testkit.ReadWALTail(t, p.DataDir(li)).TearNextAppend(t)
	if after, afterTerm := lastIndex(li); after != before || afterTerm != term {
		t.Fatalf("torn append: last index %d term %d, before it %d and %d; want nothing lost", after, afterTerm, before, term)
	}
	load.waitGrants(t, 30)
	if err := p.Start(li); err != nil {
		t.Fatal(err)
	}
	load.waitGrants(t, 30)
	settled(t, ctx, p, 0)

	// A follower, its last acknowledged batch cut.
	li, err = p.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fi := (li + 1) % p.Size()
	if err := p.Signal(fi, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	before, term = lastIndex(fi)
	tail := testkit.ReadWALTail(t, p.DataDir(fi))
	tail.CutLastBatch(t)
	after, afterTerm := lastIndex(fi)
	if n := uint64(tail.LastBatch()); after != before-n || afterTerm != term {
		t.Fatalf("cut batch of %d entries: last index %d term %d, before %d and %d; want the batch dropped, the term kept",
			n, after, afterTerm, before, term)
	}
	t.Logf("the follower's cut batch: last index %d → %d, opened without an error", before, after)
	load.waitGrants(t, 30)
	if err := p.Start(fi); err != nil {
		t.Fatal(err)
	}
	load.waitGrants(t, 30)
	if !appliedPast(ctx, p, fi, before) {
		t.Fatalf("the follower never applied past its old last index %d", before)
	}

	gap := load.finish(t, from, time.Now())
	t.Logf("longest time without a grant: %v; log suffixes cleared: %d", gap, logSuffixesCleared(p))
	settled(t, ctx, p, load.maxToken())
	checkHeld(t, ctx, b, held)
	for i := 0; i < p.Size(); i++ {
		if p.Exited(i) {
			t.Fatalf("node %s exited on its own (log %s)", p.ID(i), p.LogFile(i))
		}
	}
}

// appliedPast waits until node i has applied an entry past index (its
// status over the client port) and reports whether it did.
func appliedPast(ctx context.Context, p *localproc.Procs, i int, index uint64) bool {
	return testkit.Eventually(30*time.Second, func() bool {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := p.Status(sctx, i)
		return err == nil && st.Applied > index
	})
}
