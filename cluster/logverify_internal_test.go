package cluster

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/metrics"
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

func (r reports) fn(v verifier.VerificationReport, _ uint64) { r <- v }

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
				if classifyVerification(r, 0) != verifyOK {
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
				if got := classifyVerification(r, 0); got != want {
					t.Errorf("follower (altered %v): %s, want %s: %+v", alter, verifyResultNames[got], verifyResultNames[want], r)
				}
			}
		})
	}
}

// A tail that a new leader overwrote is not in-flight corruption.
func TestClassifyOverwrittenTail(t *testing.T) {
	r := verifier.VerificationReport{Range: verifier.LogRange{Start: 10, End: 20}, ExpectedSum: 1, WrittenSum: 2,
		Err: verifier.ErrChecksumMismatch("in-flight corruption")}
	if got := classifyVerification(r, 0); got != verifyInFlight {
		t.Errorf("no cut: %s", verifyResultNames[got])
	}
	if got := classifyVerification(r, 15); got != verifyUnverified {
		t.Errorf("cut at 15: %s", verifyResultNames[got])
	}
	if got := classifyVerification(r, 25); got != verifyInFlight {
		t.Errorf("cut at 25: %s", verifyResultNames[got])
	}
	r.WrittenSum = 1
	if got := classifyVerification(r, 15); got != verifyStorage {
		t.Errorf("read mismatch: %s", verifyResultNames[got])
	}
	r.Err = verifier.ErrRangeMismatch
	if got := classifyVerification(r, 0); got != verifyUnverified {
		t.Errorf("range mismatch: %s", verifyResultNames[got])
	}
}

// nullStore stores nothing: the appends cost only what wraps it.
type nullStore struct{ raft.LogStore }

func (nullStore) StoreLogs([]*raft.Log) error { return nil }

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
	b.Run("append/plain", func(b *testing.B) { appendAll(b, nullStore{}) })
	b.Run("append/verified", func(b *testing.B) {
		s := verifier.NewLogStore(nullStore{}, isCheckpoint, nil, &metrics.NoOpCollector{})
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
				if classifyVerification(v, 0) != verifyOK {
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
