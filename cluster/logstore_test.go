package cluster_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// writeStore opens a store of kind in dir and leaves state in it: a term,
// a vote and one entry, as a node that has been a member does.
func writeStore(t *testing.T, dir string, kind cluster.LogStoreKind) {
	t.Helper()
	s, err := cluster.OpenLogStore(dir, kind)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("n2/abcdefghij")); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLog(&raft.Log{Index: 1, Term: 7, Type: raft.LogCommand, Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// nodeConfig is a valid config of a node with its data dir in dir (it is
// never started far enough to listen for long).
func nodeConfig(t *testing.T, dir string, kind cluster.LogStoreKind) cluster.Config {
	cfg := cluster.DefaultConfig()
	cfg.NodeID, cfg.DataDir, cfg.LogStore = "n1", dir, kind
	cfg.ClientAddr, cfg.PeerAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.ClientSecret, cfg.PeerSecret = []byte("0123456789abcdef-client"), []byte("0123456789abcdef-peer")
	cfg.Peers = []cluster.Peer{{ID: "n1", Addr: "127.0.0.1:1"}, {ID: "n2", Addr: "127.0.0.1:2"}, {ID: "n3", Addr: "127.0.0.1:3"}}
	cfg.Logger = testLogger(t)
	return cfg
}

// A data dir written by one log store is never opened by the other, in
// either direction and by every way in (the store itself, a node,
// bootstrap): the node would start with an empty log and no term or vote
// under its old server id. The refusal names the flag and the kind that
// would open it, and the data dir is left as it was.
func TestLogStoreKindIsFixedPerDataDir(t *testing.T) {
	for _, tc := range []struct{ wrote, asked cluster.LogStoreKind }{
		{cluster.LogStoreBolt, cluster.LogStoreWAL},
		{cluster.LogStoreWAL, cluster.LogStoreBolt},
	} {
		t.Run(fmt.Sprintf("%s-then-%s", tc.wrote, tc.asked), func(t *testing.T) {
			dir := t.TempDir()
			writeStore(t, dir, tc.wrote)
			before := listDir(t, dir)
			if got, err := cluster.DetectLogStore(dir); err != nil || got != tc.wrote {
				t.Fatalf("DetectLogStore = %q, %v; want %q", got, err, tc.wrote)
			}
			wantMsg := "start it with --log-store " + string(tc.wrote)
			_, err := cluster.OpenLogStore(dir, tc.asked)
			if !errors.Is(err, cluster.ErrLogStoreMismatch) || !strings.Contains(err.Error(), wantMsg) {
				t.Fatalf("OpenLogStore(%s) of a %s data dir: %v; want ErrLogStoreMismatch saying %q", tc.asked, tc.wrote, err, wantMsg)
			}
			n, err := cluster.New(nodeConfig(t, dir, tc.asked))
			if err == nil {
				n.Close()
				t.Fatalf("a node with --log-store %s started on a %s data dir", tc.asked, tc.wrote)
			}
			if !errors.Is(err, cluster.ErrLogStoreMismatch) || !strings.Contains(err.Error(), wantMsg) {
				t.Fatalf("New: %v; want ErrLogStoreMismatch saying %q", err, wantMsg)
			}
			_, err = cluster.Bootstrap(nodeConfig(t, dir, tc.asked), cluster.BootstrapOptions{Timeout: time.Second})
			if !errors.Is(err, cluster.ErrLogStoreMismatch) {
				t.Fatalf("Bootstrap: %v; want ErrLogStoreMismatch", err)
			}
			if after := listDir(t, dir); after != before {
				t.Fatalf("the refusals changed the data dir:\n%s\nbecame\n%s", before, after)
			}
			// The right kind still opens it, with its state.
			s, err := cluster.OpenLogStore(dir, tc.wrote)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			term, err := s.GetUint64([]byte("CurrentTerm"))
			last, lerr := s.LastIndex()
			if err != nil || lerr != nil || term != 7 || last != 1 {
				t.Fatalf("reopened %s store: term %d (%v), last index %d (%v); want 7 and 1", tc.wrote, term, err, last, lerr)
			}
		})
	}
}

// A data dir holding both stores, or a server identity and no store at
// all, is refused: nothing tells which log is this node's, or its log and
// vote were lost.
func TestLogStoreAmbiguousOrLostRefused(t *testing.T) {
	dir := t.TempDir()
	writeStore(t, dir, cluster.LogStoreBolt)
	if err := os.Mkdir(filepath.Join(dir, "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []cluster.LogStoreKind{cluster.LogStoreBolt, cluster.LogStoreWAL} {
		if _, err := cluster.OpenLogStore(dir, kind); !errors.Is(err, cluster.ErrLogStoreMismatch) || !strings.Contains(err.Error(), "both") {
			t.Fatalf("OpenLogStore(%s) with both stores present: %v", kind, err)
		}
	}

	lost := t.TempDir()
	if err := os.WriteFile(filepath.Join(lost, "identity"), []byte("n1/abcdefghij\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []cluster.LogStoreKind{cluster.LogStoreBolt, cluster.LogStoreWAL} {
		n, err := cluster.New(nodeConfig(t, lost, kind))
		if err == nil {
			n.Close()
			t.Fatalf("a node started on an identity without a log (%s)", kind)
		}
		if !errors.Is(err, cluster.ErrLogStoreMissing) {
			t.Fatalf("New(%s) on an identity without a log: %v; want ErrLogStoreMissing", kind, err)
		}
	}
	if entries := listDir(t, lost); entries != "identity" {
		t.Fatalf("the refusal created files: %s", entries)
	}
}

// Only bolt and wal are log stores, and auto, the default, picks one.
func TestLogStoreKindValues(t *testing.T) {
	var k cluster.LogStoreKind
	if err := k.Set("lsm"); err == nil || !strings.Contains(err.Error(), "want auto, bolt or wal") {
		t.Fatalf("Set(lsm): %v", err)
	}
	for _, s := range []string{"auto", "bolt", "wal"} {
		if err := k.Set(s); err != nil || k.String() != s {
			t.Fatalf("Set(%s): %v, %q", s, err, k)
		}
	}
	cfg := nodeConfig(t, t.TempDir(), "lsm")
	if err := cfg.Validate(); !errors.Is(err, cluster.ErrBadConfig) || !strings.Contains(err.Error(), "want auto, bolt or wal") {
		t.Fatalf("Validate with log store lsm: %v", err)
	}
	if cluster.DefaultConfig().LogStore != cluster.LogStoreAuto || cluster.DefaultLogStore != cluster.LogStoreAuto ||
		cluster.FreshLogStore != cluster.LogStoreWAL {
		t.Fatalf("the default log store is %q (DefaultLogStore %q, FreshLogStore %q), want auto creating wal",
			cluster.DefaultConfig().LogStore, cluster.DefaultLogStore, cluster.FreshLogStore)
	}
	for _, kind := range []cluster.LogStoreKind{"", cluster.LogStoreAuto} {
		if err := nodeConfig(t, t.TempDir(), kind).Validate(); err != nil {
			t.Fatalf("Validate with log store %q: %v", kind, err)
		}
	}
	if _, err := cluster.OpenLogStore(t.TempDir(), "lsm"); !errors.Is(err, cluster.ErrBadConfig) {
		t.Fatalf("OpenLogStore(lsm): %v", err)
	}
}

// listDir is dir's entries, one level, sorted, as one string.
func listDir(t *testing.T, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}

// A cluster on the wal store grants, queues and hands off like one on
// bolt, over TCP between real in-process nodes; every node's data dir
// holds wal/ and no raft.db.
func TestWALClusterGrantsAndHandsOff(t *testing.T) {
	c := startClusterOpts(t, local.Options{LogStore: cluster.LogStoreWAL})
	li := c.leader()
	a, b := c.dial(li), c.dial(li)
	t1 := mustGrant(t, do(t, a, acquireMsg("seats/1", "alice", 30, 0)))
	mustType(t, do(t, b, acquireMsg("seats/1", "bob", 30, 0)), wire.TypeBusy)
	handOffToBob(t, c, li, a, b, t1)
	for i := 0; i < c.Size(); i++ {
		dir := filepath.Join(c.Dir, c.ID(i))
		if got, err := cluster.DetectLogStore(dir); err != nil || got != cluster.LogStoreWAL {
			t.Fatalf("node %d's data dir holds %q (%v), want wal", i, got, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "raft.db")); err == nil {
			t.Fatalf("node %d's data dir has a raft.db", i)
		}
	}
}

// A wal node restarted from its data dir keeps its log, term and vote:
// right after the restart, before it hears from anyone, its last index
// and term are at least what they were, and it rejoins. Then the whole
// cluster restarts; holders stay, tokens keep increasing. A follower that
// fell behind a snapshot is brought back by InstallSnapshot (raft-wal is a
// monotonic store: raft removes the old log instead of leaving a gap,
// which raft-wal would refuse) and keeps appending.
func TestWALRestartKeepsLogAndTerm(t *testing.T) {
	c := startClusterOpts(t, local.Options{LogStore: cluster.LogStoreWAL, Tune: func(cfg *cluster.Config) {
		cfg.TrailingLogs = 8
	}})
	lc := c.client()
	defer lc.close()
	var toks []uint64
	for i := 0; i < 10; i++ {
		toks = append(toks, mustGrant(t, lc.do(acquireMsg(fmt.Sprintf("k%d", i), "o", 120, 0))))
	}
	li := c.leader()
	fi := (li + 1) % c.Size()
	testkit.WaitFor(t, "follower applied every grant", 10*time.Second, func() bool {
		return c.Node(fi).LastToken() == toks[len(toks)-1]
	})
	lastIndex, term := c.Node(fi).Raft().LastIndex(), c.Node(fi).Raft().CurrentTerm()
	if err := c.Stop(fi); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(fi); err != nil {
		t.Fatal(err)
	}
	if got, gotTerm := c.Node(fi).Raft().LastIndex(), c.Node(fi).Raft().CurrentTerm(); got < lastIndex || gotTerm < term {
		t.Fatalf("restarted from its wal: last index %d term %d, before the restart %d and %d", got, gotTerm, lastIndex, term)
	}
	testkit.WaitFor(t, "restarted follower to apply its log", 10*time.Second, func() bool {
		return c.Node(fi).LastToken() == toks[len(toks)-1]
	})

	// Behind a snapshot: the follower stops, the others grant on and
	// compact their logs past the follower's last entry, and restart
	// (raft-wal still serves compacted entries from the segment it has
	// open until it is reopened).
	if err := c.Stop(fi); err != nil {
		t.Fatal(err)
	}
	behind := c.Node(li).Raft().LastIndex()
	for i := 10; i < 40; i++ {
		toks = append(toks, mustGrant(t, lc.do(acquireMsg(fmt.Sprintf("k%d", i), "o", 120, 0))))
	}
	lc.drop()
	for i := 0; i < c.Size(); i++ {
		if i == fi {
			continue
		}
		testkit.WaitFor(t, "every running node applied every grant", 10*time.Second, func() bool {
			return c.Node(i).LastToken() == toks[len(toks)-1]
		})
		if err := c.Node(i).Raft().Snapshot().Error(); err != nil {
			t.Fatal(err)
		}
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
		if err := c.Restart(i); err != nil {
			t.Fatal(err)
		}
		if first, err := cluster.LogFirstIndex(c.Node(i)); err != nil || first <= behind {
			t.Fatalf("node %d's first index %d (%v) after the snapshot, want above the follower's %d", i, first, err, behind)
		}
	}
	c.leader()
	if err := c.Restart(fi); err != nil {
		t.Fatal(err)
	}
	// hashicorp/raft restores the FSM from an installed snapshot before
	// it records the snapshot's index (Stats' last_snapshot_index), so
	// wait for both: the state can be seen caught up a moment before.
	testkit.WaitFor(t, "follower restored from a snapshot (caught up, with a last_snapshot_index)", 15*time.Second, func() bool {
		snap := c.Node(fi).Raft().Stats()["last_snapshot_index"]
		return c.Node(fi).LastToken() == toks[len(toks)-1] && snap != "0" && snap != ""
	})
	toks = append(toks, mustGrant(t, lc.do(acquireMsg("after-snapshot", "o", 120, 0))))
	testkit.WaitFor(t, "follower appends after the snapshot", 10*time.Second, func() bool {
		return c.Node(fi).LastToken() == toks[len(toks)-1]
	})
	lc.close()

	// Every node at once.
	last := c.Node(c.leader()).LastToken()
	for i := 0; i < c.Size(); i++ {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < c.Size(); i++ {
		if err := c.Restart(i); err != nil {
			t.Fatal(err)
		}
	}
	c.leader()
	for i := 0; i < c.Size(); i++ {
		testkit.WaitFor(t, "replay on every node", 10*time.Second, func() bool { return c.Node(i).LastToken() == last })
		for k := range toks[:len(toks)-1] {
			h, ok := c.holderOn(i, fmt.Sprintf("k%d", k))
			if !ok || h.Token != toks[k] || h.Owner != "o" {
				t.Fatalf("node %d: k%d = %+v %v after restart, want token %d", i, k, h, ok, toks[k])
			}
		}
	}
	lc = c.client()
	defer lc.close()
	if tok := mustGrant(t, lc.do(acquireMsg("new", "o", 10, 0))); tok <= last {
		t.Fatalf("token %d after restart not above %d", tok, last)
	}
}

// Each node's log store is its own: a cluster of one bolt node and two
// wal nodes grants, survives the loss of its leader and keeps its tokens
// increasing (how a cluster moves from one store to the other, one
// replaced node at a time).
func TestMixedLogStores(t *testing.T) {
	c := startClusterOpts(t, local.Options{Tune: func(cfg *cluster.Config) {
		cfg.LogStore = cluster.LogStoreWAL
		if cfg.NodeID == "n1" {
			cfg.LogStore = cluster.LogStoreBolt
		}
	}})
	for i, want := range []cluster.LogStoreKind{cluster.LogStoreBolt, cluster.LogStoreWAL, cluster.LogStoreWAL} {
		if got, err := cluster.DetectLogStore(filepath.Join(c.Dir, c.ID(i))); err != nil || got != want {
			t.Fatalf("node %d holds %q (%v), want %q", i, got, err, want)
		}
	}
	lc := c.client()
	defer lc.close()
	var last uint64
	for round := 0; round < 3; round++ {
		tok := mustGrant(t, lc.do(acquireMsg(fmt.Sprintf("k%d", round), "o", 60, 0)))
		if tok <= last {
			t.Fatalf("round %d: token %d not above %d", round, tok, last)
		}
		last = tok
		li := c.leader()
		if err := c.Stop(li); err != nil {
			t.Fatal(err)
		}
		lc.drop()
		c.leader()
		if err := c.Restart(li); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < c.Size(); i++ {
		testkit.WaitFor(t, "every node applied every grant", 10*time.Second, func() bool { return c.Node(i).LastToken() == last })
	}
}

// What raft-wal (v0.4.1) does with a damaged tail, pinned: a torn append
// (a partial record after the last commit frame, what a crash in the
// middle of an append leaves; its fsync had not returned, so it was never
// acknowledged) is dropped and everything before it kept. A last batch
// cut in the middle (fsynced and acknowledged, then lost: beyond what a
// crash can do) is dropped too, back to the commit before it, silently:
// the store opens without an error and a shorter log; so is one with a
// byte of it flipped (its commit frame's CRC fails). The term and vote
// (in wal-meta.db) are untouched either way, and appends go on.
func TestWALTornTailRecovery(t *testing.T) {
	dir := t.TempDir()
	open := func() cluster.LogStore {
		t.Helper()
		s, err := cluster.OpenLogStore(dir, cluster.LogStoreWAL)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		return s
	}
	appendBatch := func(s cluster.LogStore, from, to uint64) {
		t.Helper()
		var logs []*raft.Log
		for i := from; i <= to; i++ {
			logs = append(logs, &raft.Log{Index: i, Term: 3, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("entry %d", i))})
		}
		if err := s.StoreLogs(logs); err != nil {
			t.Fatal(err)
		}
	}
	check := func(s cluster.LogStore, last uint64) {
		t.Helper()
		got, err := s.LastIndex()
		if err != nil || got != last {
			t.Fatalf("last index %d (%v), want %d", got, err, last)
		}
		var l raft.Log
		if err := s.GetLog(last, &l); err != nil || string(l.Data) != fmt.Sprintf("entry %d", last) {
			t.Fatalf("entry %d: %q %v", last, l.Data, err)
		}
		if term, err := s.GetUint64([]byte("CurrentTerm")); err != nil || term != 3 {
			t.Fatalf("term %d (%v), want 3", term, err)
		}
	}
	s := open()
	if err := s.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	appendBatch(s, 1, 3)
	appendBatch(s, 4, 5)
	appendBatch(s, 6, 8)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	w := testkit.ReadWALTail(t, dir)
	if len(w.Commits) != 3 || w.LastBatch() != 3 {
		t.Fatalf("tail %+v: want 3 commit frames, 3 entries in the last batch", w)
	}

	w.TearNextAppend(t)
	s = open()
	check(s, 8)
	appendBatch(s, 9, 11)
	check(s, 11)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	w = testkit.ReadWALTail(t, dir)
	if len(w.Commits) != 4 || w.LastBatch() != 3 {
		t.Fatalf("tail after the append over the torn record %+v: want 4 commit frames, 3 entries in the last batch", w)
	}
	w.CutLastBatch(t)
	s = open()
	check(s, 8) // 9..11 were acknowledged, and are gone without a word
	appendBatch(s, 9, 9)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	check(s, 9)
	appendBatch(s, 10, 12)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	testkit.ReadWALTail(t, dir).GarbleLastBatch(t)
	s = open()
	defer func() { _ = s.Close() }()
	check(s, 9) // the same with a byte of 10..12 flipped
}

// A tail truncation (hashicorp/raft's "clearing log suffix": a follower
// drops entries of an old term that conflict with the new leader's) and a
// restart: raft-wal v0.4.0 marked the truncated segment sealed without
// writing its index, and on reopening it could not read it ("sealed
// segment has no index block"; hashicorp/raft panics on that at start:
// hashicorp/raft-wal#31). v0.4.1 writes the index, and the node restarts
// with its log.
func TestWALRestartAfterTailTruncation(t *testing.T) {
	dir := t.TempDir()
	s, err := cluster.OpenLogStore(dir, cluster.LogStoreWAL)
	if err != nil {
		t.Fatal(err)
	}
	store := func(term uint64, from, to uint64) {
		t.Helper()
		var logs []*raft.Log
		for i := from; i <= to; i++ {
			logs = append(logs, &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("%d/%d", term, i))})
		}
		if err := s.StoreLogs(logs); err != nil {
			t.Fatal(err)
		}
	}
	store(2, 1, 5)
	if err := s.DeleteRange(4, 5); err != nil { // entries 4 and 5 of term 2 conflict
		t.Fatal(err)
	}
	store(3, 4, 6)
	for round := 0; round < 2; round++ {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if s, err = cluster.OpenLogStore(dir, cluster.LogStoreWAL); err != nil {
			t.Fatalf("reopen %d: %v", round, err)
		}
		for i, want := range []string{"2/1", "2/2", "2/3", "3/4", "3/5", "3/6"} {
			var l raft.Log
			if err := s.GetLog(uint64(i+1), &l); err != nil || string(l.Data) != want {
				t.Fatalf("reopen %d: entry %d = %q (%v), want %q", round, i+1, l.Data, err, want)
			}
		}
		if last, err := s.LastIndex(); err != nil || last != 6 {
			t.Fatalf("reopen %d: last index %d (%v), want 6", round, last, err)
		}
		if round == 0 {
			if err := s.DeleteRange(6, 6); err != nil { // and once more, across the reopen
				t.Fatal(err)
			}
			store(3, 6, 6)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// suffixCleared is a log handler that notes which nodes' Raft cleared a
// log suffix (a tail truncation of their log store).
type suffixCleared struct {
	mu   *sync.Mutex
	seen map[string]bool
	node string
}

func (h suffixCleared) Enabled(context.Context, slog.Level) bool { return true }
func (h suffixCleared) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "clearing log suffix") {
		h.mu.Lock()
		h.seen[h.node] = true
		h.mu.Unlock()
	}
	return nil
}
func (h suffixCleared) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h suffixCleared) WithGroup(string) slog.Handler      { return h }

// An isolated wal leader appends entries that never commit; the majority
// elects a new leader, which commits others at those indexes; healed, the
// old leader's Raft clears that suffix from its log store (a tail
// truncation), and the node then restarts from its data dir and rejoins.
// On raft-wal v0.4.0 that restart panicked
// (TestWALRestartAfterTailTruncation); v0.4.1 fixed it.
func TestWALRestartAfterLogSuffixCleared(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	c := startClusterOpts(t, local.Options{LogStore: cluster.LogStoreWAL, Tune: func(cfg *cluster.Config) {
		cfg.Logger = slog.New(suffixCleared{mu: &mu, seen: seen, node: cfg.NodeID})
	}})
	li := c.leader()
	old := c.dial(li)
	t1 := mustGrant(t, do(t, old, acquireMsg("held", "a", 60, 0)))
	c.faults.Isolate(c.ID(li), c.IDs())
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _, _ = old.Do(ctx, acquireMsg(fmt.Sprintf("x%d", i), "a", 60, 0)) // appended by the isolated leader only
		}()
	}
	wg.Wait()
	var ni int
	testkit.WaitFor(t, "a new leader", 10*time.Second, func() bool {
		for i := 0; i < c.Size(); i++ {
			if i != li && c.Node(i).Serving() {
				ni = i
				return true
			}
		}
		return false
	})
	t2 := mustGrant(t, do(t, c.dial(ni), acquireMsg("fresh", "b", 60, 0)))
	c.faults.Heal()
	testkit.WaitFor(t, "the old leader to take the new leader's log", 10*time.Second, func() bool {
		return c.Node(li).LastToken() >= t2
	})
	mu.Lock()
	cleared := seen[c.ID(li)]
	mu.Unlock()
	if !cleared {
		t.Fatal("the old leader's Raft never cleared a log suffix: the test did not truncate a tail")
	}
	if err := c.Stop(li); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(li); err != nil {
		t.Fatalf("restart after the tail truncation: %v", err)
	}
	c.converged("held", locksm.Holder{Owner: "a", Token: t1}, true)
	c.converged("fresh", locksm.Holder{Owner: "b", Token: t2}, true)
	lc := c.client()
	defer lc.close()
	t3 := mustGrant(t, lc.do(acquireMsg("after", "c", 60, 0)))
	testkit.WaitFor(t, "the restarted node to apply the next grant", 10*time.Second, func() bool {
		return c.Node(li).LastToken() == t3
	})
}

// stayOnBolt is the warning a node logs when auto finds a bolt data dir.
const stayOnBolt = "this data dir holds a bolt log store (raft.db), so the node stays on bolt"

// What the default, auto, opens: a new data dir gets wal; a data dir that
// holds bolt stays on bolt, with one warning naming the way to move it
// (nothing is written beside raft.db); one that holds wal stays on wal,
// silently. An explicit kind is what it says on a new data dir, logs
// nothing, and is refused on the other kind's data dir.
func TestAutoLogStore(t *testing.T) {
	for _, tc := range []struct {
		wrote      cluster.LogStoreKind // "": a new data dir
		asked      cluster.LogStoreKind
		want       cluster.LogStoreKind // "": refused
		wantWarned bool
	}{
		{"", "", cluster.LogStoreWAL, false},
		{"", cluster.LogStoreAuto, cluster.LogStoreWAL, false},
		{"", cluster.LogStoreBolt, cluster.LogStoreBolt, false},
		{"", cluster.LogStoreWAL, cluster.LogStoreWAL, false},
		{cluster.LogStoreBolt, "", cluster.LogStoreBolt, true},
		{cluster.LogStoreBolt, cluster.LogStoreAuto, cluster.LogStoreBolt, true},
		{cluster.LogStoreBolt, cluster.LogStoreBolt, cluster.LogStoreBolt, false},
		{cluster.LogStoreBolt, cluster.LogStoreWAL, "", false},
		{cluster.LogStoreWAL, cluster.LogStoreAuto, cluster.LogStoreWAL, false},
		{cluster.LogStoreWAL, cluster.LogStoreBolt, "", false},
	} {
		t.Run(fmt.Sprintf("%s-dir-%s", cmp.Or(string(tc.wrote), "new"), cmp.Or(string(tc.asked), "zero")), func(t *testing.T) {
			dir := t.TempDir()
			if tc.wrote != "" {
				writeStore(t, dir, tc.wrote)
			}
			before := listDir(t, dir)
			got, err := cluster.ResolveLogStore(dir, tc.asked)
			if err != nil || (tc.want != "" && got != tc.want) {
				t.Fatalf("ResolveLogStore = %q, %v; want %q", got, err, tc.want)
			}
			var logs syncBuffer
			prev := slog.Default()
			slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
			s, err := cluster.OpenLogStore(dir, tc.asked)
			slog.SetDefault(prev)
			if tc.want == "" {
				if !errors.Is(err, cluster.ErrLogStoreMismatch) {
					t.Fatalf("OpenLogStore: %v; want ErrLogStoreMismatch", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if got, err := cluster.DetectLogStore(dir); err != nil || got != tc.want {
				t.Fatalf("after OpenLogStore the data dir holds %q (%v), want %q", got, err, tc.want)
			}
			if tc.wrote != "" && listDir(t, dir) != before {
				t.Fatalf("opening an existing %s store changed the data dir: %q, was %q", tc.wrote, listDir(t, dir), before)
			}
			warned := strings.Count(logs.String(), stayOnBolt)
			if tc.wantWarned && (warned != 1 || !strings.Contains(logs.String(), "level=WARN") ||
				!strings.Contains(logs.String(), "Moving a node to the other log store")) {
				t.Fatalf("want one warning that the node stays on bolt, naming the runbook; logged:\n%s", logs.String())
			}
			if !tc.wantWarned && warned != 0 {
				t.Fatalf("warned that the node stays on bolt:\n%s", logs.String())
			}
		})
	}
}

// The upgrade, in process: a cluster written on bolt (as every build
// before wal became the default wrote it, here by --log-store bolt) holds
// a lock and has handed out tokens; every node restarts with the new
// default (no log store asked for). Each stays on bolt (raft.db, no wal/),
// logs the warning once, keeps the held lock and the token counter, and
// serves: a new grant's token is above every old one. (cmd/ticketing's
// TestUpgradeFromBoltKeepsServing does the same with node processes.)
func TestUpgradeBoltDataDirStaysOnBolt(t *testing.T) {
	c := startClusterOpts(t, local.Options{LogStore: cluster.LogStoreBolt})
	lc := c.client()
	held := mustGrant(t, lc.do(acquireMsg("held", "alice", 120, 0)))
	var last uint64
	for i := 0; i < 5; i++ {
		if last = mustGrant(t, lc.do(acquireMsg(fmt.Sprintf("k%d", i), "o", 120, 0))); last <= held {
			t.Fatalf("token %d not above %d", last, held)
		}
	}
	lc.close()
	for i := 0; i < c.Size(); i++ {
		testkit.WaitFor(t, "every node applied every grant", 10*time.Second, func() bool { return c.Node(i).LastToken() == last })
	}
	boltMod := make([]time.Time, c.Size())
	for i := 0; i < c.Size(); i++ {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(c.Dir, c.ID(i), "raft.db"))
		if err != nil {
			t.Fatal(err)
		}
		boltMod[i] = fi.ModTime()
	}
	logs := make([]*syncBuffer, c.Size())
	for i := 0; i < c.Size(); i++ {
		logs[i] = &syncBuffer{}
		if err := c.RestartWith(i, func(cfg *cluster.Config) {
			cfg.LogStore = ""
			cfg.Logger = slog.New(slog.NewTextHandler(logs[i], nil))
		}); err != nil {
			t.Fatal(err)
		}
	}
	c.leader()
	for i := 0; i < c.Size(); i++ {
		dir := filepath.Join(c.Dir, c.ID(i))
		if _, err := os.Stat(filepath.Join(dir, "wal")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("node %d: a wal/ beside raft.db after the upgrade (%v)", i, err)
		}
		if got, err := cluster.DetectLogStore(dir); err != nil || got != cluster.LogStoreBolt {
			t.Fatalf("node %d holds %q (%v) after the upgrade, want bolt", i, got, err)
		}
		if n := strings.Count(logs[i].String(), stayOnBolt); n != 1 {
			t.Fatalf("node %d logged %d warnings that it stays on bolt, want 1:\n%s", i, n, logs[i].String())
		}
		if !strings.Contains(logs[i].String(), "log_store=bolt") {
			t.Fatalf("node %d: no log_store=bolt in its logs:\n%s", i, logs[i].String())
		}
		testkit.WaitFor(t, "replay on every node", 10*time.Second, func() bool { return c.Node(i).LastToken() == last })
		if h, ok := c.holderOn(i, "held"); !ok || h.Token != held || h.Owner != "alice" {
			t.Fatalf("node %d: held = %+v %v after the upgrade, want alice's token %d", i, h, ok, held)
		}
	}
	lc = c.client()
	defer lc.close()
	tok := mustGrant(t, lc.do(acquireMsg("new", "o", 10, 0)))
	if tok <= last {
		t.Fatalf("token %d after the upgrade not above %d", tok, last)
	}
	// Each raft.db is the log in use: the new grant was written to it.
	for i := 0; i < c.Size(); i++ {
		testkit.WaitFor(t, "every node applied the new grant", 10*time.Second, func() bool { return c.Node(i).LastToken() == tok })
		fi, err := os.Stat(filepath.Join(c.Dir, c.ID(i), "raft.db"))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().After(boltMod[i]) {
			t.Fatalf("node %d's raft.db not written since the upgrade (modified %v, before it %v)", i, fi.ModTime(), boltMod[i])
		}
	}
}
