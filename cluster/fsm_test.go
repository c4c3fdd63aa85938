package cluster

import (
	"bytes"
	"io"
	"log/slog"
	"testing"

	"github.com/hashicorp/raft"

	"ticketing/cluster/wire"
	"ticketing/locksm"
)

type discardSink struct{}

func (discardSink) applyBatch(apply func() []applied) { apply() }
func (discardSink) onAnnounce(_, _ string)            {}

// memSink is a raft.SnapshotSink in memory.
type memSink struct {
	bytes.Buffer
	closed, canceled bool
}

func (m *memSink) ID() string    { return "mem" }
func (m *memSink) Close() error  { m.closed = true; return nil }
func (m *memSink) Cancel() error { m.canceled = true; return nil }

func lockEntry(cmds ...locksm.Command) *raft.Log {
	return &raft.Log{Type: raft.LogCommand, Data: append([]byte{entryLockBatch}, locksm.AppendBatch(nil, cmds)...)}
}

// TestSnapshotIsTheMomentOfSnapshot pins the split Raft relies on: Snapshot
// (on the apply goroutine) fixes the state, Persist (concurrently with later
// applies) writes it. Entries applied between the two, lock changes and a
// leader announcement alike, must not reach the snapshot; a restore gives
// the state of the moment of Snapshot.
func TestSnapshotIsTheMomentOfSnapshot(t *testing.T) {
	f := newFSM(discardSink{}, slog.New(slog.DiscardHandler))
	f.ApplyBatch([]*raft.Log{
		{Type: raft.LogCommand, Data: encodeDomain("dom", 100)},
		{Type: raft.LogCommand, Data: encodeAnnounce("n1", "127.0.0.1:7400")},
		lockEntry(
			locksm.Command{Op: locksm.OpAcquire, Key: "a", Owner: "o1", LeaseSec: 30, Now: 1},
			locksm.Command{Op: locksm.OpAcquire, Key: "a", Owner: "o2", Ref: 7, LeaseSec: 30, WaitMs: 1000, Now: 2},
			locksm.Command{Op: locksm.OpAcquire, Key: "b", Owner: "o3", LeaseSec: 30, Now: 3},
		),
	})
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	// After the Snapshot call: a hand-off on a, b released, c new, another
	// node announced.
	f.ApplyBatch([]*raft.Log{
		lockEntry(
			locksm.Command{Op: locksm.OpRelease, Key: "a", Owner: "o1", Token: 101, Now: 4},
			locksm.Command{Op: locksm.OpRelease, Key: "b", Owner: "o3", Token: 102, Now: 5},
			locksm.Command{Op: locksm.OpAcquire, Key: "c", Owner: "o4", LeaseSec: 30, Now: 6},
		),
		{Type: raft.LogCommand, Data: encodeAnnounce("n2", "127.0.0.1:7401")},
	})
	var sink memSink
	if err := snap.Persist(&sink); err != nil || !sink.closed || sink.canceled {
		t.Fatalf("Persist: %v (closed %v, canceled %v)", err, sink.closed, sink.canceled)
	}
	snap.Release()

	g := newFSM(discardSink{}, slog.New(slog.DiscardHandler))
	if err := g.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	g.read(func(st *locksm.State) {
		if h, _ := st.Holder("a"); h.Owner != "o1" || h.Token != 101 {
			t.Errorf("a held by %+v, want o1 with token 101 (the hand-off came after Snapshot)", h)
		}
		if w := st.Waiters("a"); len(w) != 1 || w[0].Owner != "o2" {
			t.Errorf("a's queue %+v, want o2", w)
		}
		if h, ok := st.Holder("b"); !ok || h.Token != 102 {
			t.Errorf("b: %+v %v, want held with token 102", h, ok)
		}
		if _, ok := st.Holder("c"); ok {
			t.Error("c is held in the snapshot; it was acquired after Snapshot")
		}
		if st.LastToken() != 102 {
			t.Errorf("last token %d, want 102", st.LastToken())
		}
	})
	if g.getDomain() != "dom" || g.clientAddr("n1") != "127.0.0.1:7400" || g.clientAddr("n2") != "" {
		t.Errorf("restored domain %q, n1 %q, n2 %q", g.getDomain(), g.clientAddr("n1"), g.clientAddr("n2"))
	}
	// The live state went on: a handed to o2 with a new token.
	f.read(func(st *locksm.State) {
		if h, _ := st.Holder("a"); h.Owner != "o2" || h.Token != 103 {
			t.Errorf("live a held by %+v, want o2 with token 103", h)
		}
	})
}

// The cluster version ('V') only rises, and the snapshot carries it from
// wire.VersionBlocks on; below that the snapshot keeps the layout older
// nodes read (version 2), and so does the lock table's own (no blocks).
func TestClusterVersionEntriesAndSnapshots(t *testing.T) {
	f := newFSM(discardSink{}, slog.New(slog.DiscardHandler))
	persist := func(f *fsm) []byte {
		t.Helper()
		snap, err := f.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		var sink memSink
		if err := snap.Persist(&sink); err != nil {
			t.Fatal(err)
		}
		return sink.Bytes()
	}
	restore := func(b []byte) *fsm {
		t.Helper()
		g := newFSM(discardSink{}, slog.New(slog.DiscardHandler))
		if err := g.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
			t.Fatal(err)
		}
		return g
	}
	f.ApplyBatch([]*raft.Log{
		{Type: raft.LogCommand, Data: encodeDomain("dom", 100)},
		{Type: raft.LogCommand, Data: encodeClusterVersion(4)},
		lockEntry(locksm.Command{Op: locksm.OpAcquire, Key: "a", Owner: "o1", LeaseSec: 30, Now: 1}),
	})
	if v := f.ClusterVersion(); v != 4 {
		t.Fatalf("cluster version %d, want 4", v)
	}
	b := persist(f)
	if b[4] != snapshotVersionNoClusterVersion {
		t.Fatalf("snapshot version %d below the block version, want %d", b[4], snapshotVersionNoClusterVersion)
	}
	if g := restore(b); g.ClusterVersion() != 0 || g.getDomain() != "dom" {
		t.Fatalf("restored from version 2: cluster version %d domain %q", g.ClusterVersion(), g.getDomain())
	}
	f.ApplyBatch([]*raft.Log{
		{Type: raft.LogCommand, Data: encodeClusterVersion(wire.VersionBlocks)},
		{Type: raft.LogCommand, Data: encodeClusterVersion(3)}, // never lowers it
		{Type: raft.LogCommand, Data: []byte{entryVersion, 9}}, // malformed: skipped
		lockEntry(locksm.Command{Op: locksm.OpAcquireBlock, Keys: []string{"b", "c"}, Owner: "o2", LeaseSec: 30, Now: 2}),
	})
	if v := f.ClusterVersion(); v != wire.VersionBlocks {
		t.Fatalf("cluster version %d, want %d", v, wire.VersionBlocks)
	}
	b = persist(f)
	if b[4] != snapshotVersion {
		t.Fatalf("snapshot version %d with the block version, want %d", b[4], snapshotVersion)
	}
	g := restore(b)
	if g.ClusterVersion() != wire.VersionBlocks || g.getDomain() != "dom" {
		t.Fatalf("restored: cluster version %d domain %q", g.ClusterVersion(), g.getDomain())
	}
	g.read(func(st *locksm.State) {
		if h, ok := st.Holder("c"); !ok || h.Owner != "o2" || len(h.Keys) != 2 {
			t.Errorf("restored block: c held by %+v", h)
		}
	})
}
