package cluster

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/verifier"

	"ticketing/locksm"
)

// lockBatchEntry is the data of an 'L' entry of n acquires, as a leader
// under load proposes them.
func lockBatchEntry(n int) []byte {
	cmds := make([]locksm.Command, n)
	for i := range cmds {
		cmds[i] = locksm.Command{Op: locksm.OpAcquire, Key: fmt.Sprintf("bench/key/%06d", i), Owner: "sidecar-7f3a9c/worker-12",
			Ref: uint64(1000 + i), LeaseSec: 30, Now: time.Now().UnixNano()}
	}
	return locksm.AppendBatch([]byte{entryLockBatch}, cmds)
}

// reports collects a verified store's reports.
type reports chan verifier.VerificationReport

func (r reports) fn(v verifier.VerificationReport) { r <- v }

func (r reports) next(t testing.TB) verifier.VerificationReport {
	t.Helper()
	select {
	case v := <-r:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("no verification report")
		return verifier.VerificationReport{}
	}
}

// appendEntries stores n lock-batch entries and then a checkpoint, in
// batches of 64 as Raft would, from index next; it returns the next free
// index.
func appendEntries(t testing.TB, s raft.LogStore, next uint64, n int, data []byte) uint64 {
	t.Helper()
	var batch []*raft.Log
	for i := 0; i <= n; i++ {
		l := &raft.Log{Index: next, Term: 1, Type: raft.LogCommand, Data: data}
		if i == n {
			l.Data = encodeCheckpoint(time.Now())
		}
		batch = append(batch, l)
		next++
		if len(batch) == 64 || i == n {
			if err := s.StoreLogs(batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	return next
}

// The verified store over each kind: a leader's range verifies, and the
// checkpoint leaves with its checksum in Extensions; a follower fed the
// same entries verifies them too, and one fed a different entry reports
// in-flight corruption. The store stays monotonic where raft-wal is, and
// the stable store passes through.
func TestVerifiedStoreKinds(t *testing.T) {
	data := lockBatchEntry(8)
	for _, kind := range []LogStoreKind{LogStoreWAL, LogStoreBolt} {
		t.Run(string(kind), func(t *testing.T) {
			open := func() (*verifiedStore, reports) {
				base, err := OpenLogStore(t.TempDir(), kind)
				if err != nil {
					t.Fatal(err)
				}
				r := make(reports, 4)
				s := newVerifiedStore(base, r.fn, nil)
				t.Cleanup(func() {
					if err := s.Close(); err != nil {
						t.Error(err)
					}
				})
				return s, r
			}
			leader, lr := open()
			if got := leader.IsMonotonic(); got != (kind == LogStoreWAL) {
				t.Errorf("IsMonotonic %v", got)
			}
			if err := leader.SetUint64([]byte("CurrentTerm"), 3); err != nil {
				t.Fatal(err)
			}
			if v, err := leader.GetUint64([]byte("CurrentTerm")); err != nil || v != 3 {
				t.Fatalf("stable store: %d %v", v, err)
			}
			// Two ranges: the second is [first checkpoint, second).
			next := appendEntries(t, leader, 1, 100, data)
			next = appendEntries(t, leader, next, 100, data)
			var r verifier.VerificationReport
			for range 2 {
				r = lr.next(t)
				if classifyVerification(r) != verifyOK {
					t.Fatalf("leader: %+v", r)
				}
			}
			if r.Range != (verifier.LogRange{Start: 101, End: 202}) {
				t.Errorf("leader's second range %v", r.Range)
			}

			// Followers get the leader's entries, checkpoints with their
			// Extensions; one gets entry 150 altered on the way.
			for _, alter := range []bool{false, true} {
				f, fr := open()
				for i := uint64(1); i < next; i++ {
					var l raft.Log
					if err := leader.GetLog(i, &l); err != nil {
						t.Fatal(err)
					}
					if alter && i == 150 {
						l.Data = append([]byte(nil), l.Data...)
						l.Data[5] ^= 0x20
					}
					if err := f.StoreLogs([]*raft.Log{&l}); err != nil {
						t.Fatal(err)
					}
				}
				fr.next(t) // the first range: the follower's sum started with it
				r := fr.next(t)
				want := verifyOK
				if alter {
					want = verifyInFlight
				}
				if got := classifyVerification(r); got != want {
					t.Errorf("follower (altered %v): %s, want %s: %+v", alter, verifyResultNames[got], verifyResultNames[want], r)
				}
			}
		})
	}
}

// A log whose tail was cut off (a new leader overwrote a follower's
// uncommitted entries) verifies without a false alarm, as a follower and
// when that node leads next: its verifier starts over at the cut.
func TestVerifiedStoreTailCut(t *testing.T) {
	data, bogus := lockBatchEntry(4), lockBatchEntry(5)
	open := func() (*verifiedStore, reports) {
		base, err := openLogStoreQuiet(t.TempDir(), LogStoreWAL)
		if err != nil {
			t.Fatal(err)
		}
		r := make(reports, 8)
		s := newVerifiedStore(base, r.fn, nil)
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		})
		return s, r
	}
	copyLogs := func(from, to *verifiedStore, lo, hi uint64) {
		t.Helper()
		for i := lo; i <= hi; i++ {
			var l raft.Log
			if err := from.GetLog(i, &l); err != nil {
				t.Fatal(err)
			}
			if err := to.StoreLogs([]*raft.Log{&l}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// overwritten stores entries of an old leader at lo.. that the new
	// one then cuts off.
	overwritten := func(s *verifiedStore, lo uint64) {
		t.Helper()
		for i := lo; i < lo+4; i++ {
			if err := s.StoreLogs([]*raft.Log{{Index: i, Term: 1, Type: raft.LogCommand, Data: bogus}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.DeleteRange(lo, lo+3); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(who string, r reports, want int) {
		t.Helper()
		v := r.next(t)
		if got := classifyVerification(v); got != want {
			t.Errorf("%s: %s, want %s: %+v", who, verifyResultNames[got], verifyResultNames[want], v)
		}
	}

	// The leader appends 1..10 and checkpoint 11; f follows.
	leader, lr := open()
	f, fr := open()
	next := appendEntries(t, leader, 1, 10, data)
	copyLogs(leader, f, 1, next-1)
	expect("leader", lr, verifyOK)
	expect("follower", fr, verifyOK)
	// f had taken 12..15 from an old leader; the leader overwrites them.
	overwritten(f, next)
	end := appendEntries(t, leader, next, 10, data)
	copyLogs(leader, f, next, end-1)
	expect("leader", lr, verifyOK)
	expect("follower after the cut", fr, verifyOK)

	// f leads next: its first checkpoint, and g's copy of it, verify.
	g, gr := open()
	copyLogs(f, g, 1, end-1)
	expect("g", gr, verifyOK)
	expect("g", gr, verifyOK)
	overwritten(f, end)
	end2 := appendEntries(t, f, end, 10, data)
	expect("f leading after its cut", fr, verifyOK)
	copyLogs(f, g, end, end2-1)
	expect("g following f", gr, verifyOK)
}

// nullStore stores nothing: the appends cost only what wraps it.
type nullStore struct{ *raft.InmemStore }

func (nullStore) StoreLogs([]*raft.Log) error { return nil }
func (nullStore) Close() error                { return nil }

// BenchmarkLogVerify is log verification's CPU per entry, for a 64-acquire
// lock batch (about 3 KiB): "append" is what the verifier adds to every
// append (the checkpoint test and the running checksum), against the same
// append without it, over a store that costs nothing; "readback" is a
// range's verification on a real store, reading back and summing every
// entry once (verify-ns/entry, from the verifier's own timing; the
// appends, fsyncs included, are not counted).
func BenchmarkLogVerify(b *testing.B) {
	data := lockBatchEntry(64)
	b.Logf("entry: %d bytes", len(data))
	logs := make([]*raft.Log, 64)
	for i := range logs {
		logs[i] = &raft.Log{Term: 1, Type: raft.LogCommand, Data: data}
	}
	appendAll := func(b *testing.B, s raft.LogStore) {
		b.ReportAllocs()
		var idx uint64
		for b.Loop() {
			for _, l := range logs {
				idx++
				l.Index = idx
			}
			if err := s.StoreLogs(logs); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(logs)), "ns/entry")
	}
	b.Run("append/plain", func(b *testing.B) { appendAll(b, nullStore{raft.NewInmemStore()}) })
	b.Run("append/verified", func(b *testing.B) {
		s := newVerifiedStore(nullStore{raft.NewInmemStore()}, func(verifier.VerificationReport) {}, nil)
		defer func() {
			if err := s.Close(); err != nil {
				b.Error(err)
			}
		}()
		appendAll(b, s)
	})
	for _, kind := range []LogStoreKind{LogStoreWAL, LogStoreBolt} {
		b.Run("readback/"+string(kind), func(b *testing.B) {
			base, err := openLogStoreQuiet(b.TempDir(), kind)
			if err != nil {
				b.Fatal(err)
			}
			r := make(reports, 4)
			s := newVerifiedStore(base, r.fn, nil)
			defer func() {
				if err := s.Close(); err != nil {
					b.Error(err)
				}
			}()
			const rangeLen = DefaultLogVerifyEntries
			var took time.Duration
			var entries int
			next := appendEntries(b, s, 1, rangeLen, data)
			r.next(b) // the first range, from index 1
			for b.Loop() {
				next = appendEntries(b, s, next, rangeLen, data)
				v := r.next(b)
				if classifyVerification(v) != verifyOK {
					b.Fatalf("%+v", v)
				}
				took += v.Elapsed
				entries += rangeLen + 1
			}
			b.ReportMetric(float64(took.Nanoseconds())/float64(entries), "verify-ns/entry")
		})
	}
}

// openLogStoreQuiet opens a store without the log lines.
func openLogStoreQuiet(dir string, kind LogStoreKind) (LogStore, error) {
	s, _, err := openLogStore(dir, kind, slog.New(slog.DiscardHandler))
	return s, err
}
