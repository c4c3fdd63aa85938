package locksm

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"unsafe"
)

// TestHotPathAllocations pins the promise that an uncontended acquire and
// release allocate nothing in steady state (entries are recycled, the map
// slot is reused, results carry sentinel errors).
func TestHotPathAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates (make test-norace runs this without it)")
	}
	s := New()
	keys := benchKeys(64)
	var eff []Effect
	i := 0
	cycle := func() {
		k := keys[i%len(keys)]
		i++
		var res Result
		res, eff = s.Apply(Command{Op: OpAcquire, Key: k, Owner: "owner", LeaseSec: 30, Now: int64(i)}, eff[:0])
		_, eff = s.Apply(Command{Op: OpRelease, Key: k, Owner: "owner", Token: res.Token}, eff[:0])
	}
	for range 1000 {
		cycle()
	}
	if a := testing.AllocsPerRun(1000, cycle); a != 0 {
		t.Fatalf("%v allocations per acquire+release", a)
	}
}

// An extend allocates nothing either once its renewal exists, and an
// acquire, extend and release cycle nothing in steady state (the renewal
// map reuses its slots).
func TestExtendAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates (make test-norace runs this without it)")
	}
	s := New()
	keys := benchKeys(64)
	var eff []Effect
	i := 0
	cycle := func() {
		k := keys[i%len(keys)]
		i++
		var res Result
		res, eff = s.Apply(Command{Op: OpAcquire, Key: k, Owner: "owner", LeaseSec: 30, Now: int64(i)}, eff[:0])
		_, eff = s.Apply(Command{Op: OpExtend, Key: k, Owner: "owner", Token: res.Token, LeaseSec: 60, Now: int64(i)}, eff[:0])
		_, eff = s.Apply(Command{Op: OpRelease, Key: k, Owner: "owner", Token: res.Token}, eff[:0])
	}
	for range 1000 {
		cycle()
	}
	if a := testing.AllocsPerRun(1000, cycle); a != 0 {
		t.Fatalf("%v allocations per acquire+extend+release", a)
	}
	res, _ := s.Apply(Command{Op: OpAcquire, Key: "held", Owner: "owner", LeaseSec: 30}, nil)
	extend := func() {
		s.Apply(Command{Op: OpExtend, Key: "held", Owner: "owner", Token: res.Token, LeaseSec: 60, Now: int64(i)}, nil)
	}
	extend()
	if a := testing.AllocsPerRun(1000, extend); a != 0 {
		t.Fatalf("%v allocations per extend", a)
	}
}

// A session's hand-off allocates nothing in steady state either: the
// outcome window is re-sliced and grows only now and then (amortized),
// and the session's indexes reuse their map slots.
func TestSessionHandoffAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates (make test-norace runs this without it)")
	}
	s := New()
	s.Apply(Command{Op: OpOpenSession, Session: 7, SecretHash: string(make([]byte, SecretHashLen)), TimeoutMs: 10_000}, nil)
	seq, ack := uint64(1), uint64(0)
	res, _ := s.Apply(Command{Op: OpAcquire, Key: "k", Owner: "a", LeaseSec: 30, Session: 7, Seq: seq}, nil)
	token := res.Token
	var eff []Effect
	cycle := func() {
		seq++
		_, eff = s.Apply(Command{Op: OpAcquire, Key: "k", Owner: "a", Ref: seq, LeaseSec: 30, WaitMs: 1000, Session: 7, Seq: seq, Ack: ack}, eff[:0])
		seq++
		res, eff = s.Apply(Command{Op: OpRelease, Key: "k", Owner: "a", Token: token, Session: 7, Seq: seq, Ack: ack}, eff[:0])
		token, ack = eff[0].Token, res.Serial
	}
	for range 1000 {
		cycle()
	}
	if a := testing.AllocsPerRun(1000, cycle); a > 0.1 {
		t.Fatalf("%v allocations per session hand-off", a)
	}
}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("event-%07d", i)
	}
	return keys
}

// BenchmarkApplyAcquireRelease: one op is an uncontended acquire plus its
// release, next to 100k other held keys.
func BenchmarkApplyAcquireRelease(b *testing.B) {
	s := New()
	for i, k := range benchKeys(100_000) {
		s.Apply(Command{Op: OpAcquire, Key: "held-" + k, Owner: "o", LeaseSec: 30, Now: int64(i)}, nil)
	}
	keys := benchKeys(1024)
	var eff []Effect
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := keys[i&1023]
		i++
		var res Result
		res, eff = s.Apply(Command{Op: OpAcquire, Key: k, Owner: "owner", LeaseSec: 30, Now: int64(i)}, eff[:0])
		_, eff = s.Apply(Command{Op: OpRelease, Key: k, Owner: "owner", Token: res.Token, Now: int64(i)}, eff[:0])
		if res.Status != StatusGranted {
			b.Fatal(res)
		}
	}
}

// BenchmarkApplyExtend: one op is an extend of a held key (1024 of them
// in turn, each under its own token), next to 100k other held keys; no
// other command in between. After the first round every holding has a
// renewal, so an op replaces one.
func BenchmarkApplyExtend(b *testing.B) {
	s := New()
	for i, k := range benchKeys(100_000) {
		s.Apply(Command{Op: OpAcquire, Key: "held-" + k, Owner: "o", LeaseSec: 30, Now: int64(i)}, nil)
	}
	keys := benchKeys(1024)
	tokens := make([]uint64, len(keys))
	for i, k := range keys {
		res, _ := s.Apply(Command{Op: OpAcquire, Key: k, Owner: "owner", LeaseSec: 30}, nil)
		tokens[i] = res.Token
	}
	var eff []Effect
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		j := i & 1023
		i++
		var res Result
		res, eff = s.Apply(Command{Op: OpExtend, Key: keys[j], Owner: "owner", Token: tokens[j], LeaseSec: uint32(30 + i&1), Now: int64(i)}, eff[:0])
		if res.Status != StatusExtended {
			b.Fatal(res)
		}
	}
}

// BenchmarkApplyHandoff: one op is a queued acquire plus the release that
// hands the key to the queue head, with a queue of 8 behind the holder.
func BenchmarkApplyHandoff(b *testing.B) {
	s := New()
	owners := benchKeys(16)
	res, _ := s.Apply(Command{Op: OpAcquire, Key: "k", Owner: owners[0], LeaseSec: 30}, nil)
	holder, token := owners[0], res.Token
	ref := uint64(0)
	for ; ref < 8; ref++ {
		s.Apply(Command{Op: OpAcquire, Key: "k", Owner: owners[ref%16], Ref: ref, LeaseSec: 30, WaitMs: 1000}, nil)
	}
	var eff []Effect
	b.ReportAllocs()
	for b.Loop() {
		ref++
		res, eff = s.Apply(Command{Op: OpAcquire, Key: "k", Owner: owners[ref%16], Ref: ref, LeaseSec: 30, WaitMs: 1000}, eff[:0])
		if res.Status != StatusQueued {
			b.Fatal(res)
		}
		_, eff = s.Apply(Command{Op: OpRelease, Key: "k", Owner: holder, Token: token}, eff[:0])
		if len(eff) != 1 {
			b.Fatal(eff)
		}
		holder, token = eff[0].Owner, eff[0].Token
	}
}

// BenchmarkApplyHandoffSession is BenchmarkApplyHandoff with every
// acquire and release a command of one session (a broker), acknowledging
// every outcome it has been told, so the session keeps a short window of
// outcomes: what sessions add to a hand-off.
func BenchmarkApplyHandoffSession(b *testing.B) {
	s := New()
	s.Apply(Command{Op: OpOpenSession, Session: 7, SecretHash: string(make([]byte, SecretHashLen)), TimeoutMs: 10_000}, nil)
	owners := benchKeys(16)
	seq, ack := uint64(1), uint64(0)
	res, _ := s.Apply(Command{Op: OpAcquire, Key: "k", Owner: owners[0], LeaseSec: 30, Session: 7, Seq: seq}, nil)
	holder, token := owners[0], res.Token
	ref := uint64(0)
	for ; ref < 8; ref++ {
		seq++
		s.Apply(Command{Op: OpAcquire, Key: "k", Owner: owners[ref%16], Ref: ref, LeaseSec: 30, WaitMs: 1000, Session: 7, Seq: seq}, nil)
	}
	var eff []Effect
	b.ReportAllocs()
	for b.Loop() {
		ref++
		seq++
		res, eff = s.Apply(Command{Op: OpAcquire, Key: "k", Owner: owners[ref%16], Ref: ref, LeaseSec: 30, WaitMs: 1000,
			Session: 7, Seq: seq, Ack: ack}, eff[:0])
		if res.Status != StatusQueued {
			b.Fatal(res)
		}
		seq++
		res, eff = s.Apply(Command{Op: OpRelease, Key: "k", Owner: holder, Token: token, Session: 7, Seq: seq, Ack: ack}, eff[:0])
		if len(eff) != 1 || eff[0].Serial == 0 || res.Serial == 0 {
			b.Fatal(res, eff)
		}
		holder, token, ack = eff[0].Owner, eff[0].Token, res.Serial
	}
	if si, _ := s.Session(7); si.Outcomes > 2 {
		b.Fatalf("%d outcomes kept", si.Outcomes)
	}
}

var snap1M struct {
	once sync.Once
	s    *State
	b    []byte
}

// BenchmarkSnapshot1M freezes, writes and reads a table of one million held keys
// (1% with a short queue), the size the service is meant to carry.
func BenchmarkSnapshot1M(b *testing.B) {
	snap1M.once.Do(func() {
		s := New()
		for i, k := range benchKeys(1_000_000) {
			s.Apply(Command{Op: OpAcquire, Key: k, Owner: "web-0001", LeaseSec: 30, Now: 1_700_000_000_000 + int64(i)}, nil)
			if i%100 == 0 {
				for r := range uint64(3) {
					s.Apply(Command{Op: OpAcquire, Key: k, Owner: "web-0002", Ref: r, LeaseSec: 30, WaitMs: 5000, Now: 1_700_000_000_000 + int64(i)}, nil)
				}
			}
		}
		var buf bytes.Buffer
		if err := s.WriteSnapshot(&buf); err != nil {
			b.Fatal(err)
		}
		snap1M.s, snap1M.b = s, buf.Bytes()
	})
	b.Run("write", func(b *testing.B) {
		b.SetBytes(int64(len(snap1M.b)))
		b.ReportAllocs()
		var buf bytes.Buffer
		for b.Loop() {
			buf.Reset()
			if err := snap1M.s.WriteSnapshot(&buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	// freeze is what the apply goroutine pays when Raft takes a snapshot;
	// write then runs beside the applies.
	b.Run("freeze", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			snap1M.s.Freeze()
		}
	})
	b.Run("read", func(b *testing.B) {
		b.SetBytes(int64(len(snap1M.b)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ReadSnapshot(bytes.NewReader(snap1M.b)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecodeBatch(b *testing.B) {
	cmds := make([]Command, 256)
	for i := range cmds {
		cmds[i] = Command{Op: OpAcquire, Now: 1_700_000_000_000, Key: fmt.Sprintf("event-%d", i), Owner: "web-0001", Ref: uint64(i), LeaseSec: 30, WaitMs: 2000}
	}
	enc := AppendBatch(nil, cmds)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	var into []Command
	for b.Loop() {
		var err error
		if into, err = DecodeBatch(enc, into[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGCWith1M is one full garbage collection with a table of one
// million held keys alive: what a node pays each time its heap doubles. The
// table's shape (objects and pointers per key) decides it.
func BenchmarkGCWith1M(b *testing.B) {
	s := New()
	for i, k := range benchKeys(1_000_000) {
		// Owners as the wire decoder makes them: a new string per command.
		owner := string([]byte("web-0001"))
		s.Apply(Command{Op: OpAcquire, Key: string([]byte(k)), Owner: owner, LeaseSec: 30, Now: int64(i)}, nil)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ResetTimer()
	for b.Loop() {
		runtime.GC()
	}
	b.ReportMetric(float64(ms.HeapAlloc)/1e6, "heap-MB")
	runtime.KeepAlive(s)
}

// TestEntrySize pins an entry to the allocator's 64-byte class: at a
// million held keys every 16 bytes past it cost 16 MB. It was 48 until
// sessions: a holding records the (session, seq) it was granted for
// (16 bytes), so that a session's expiry can tell its holdings and a
// resume can name the request a holding answers.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n > 64 {
		t.Fatalf("entry is %d bytes, want at most 64", n)
	}
}
