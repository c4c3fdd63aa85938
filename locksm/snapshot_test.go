package locksm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

// sampleState has free keys that were once held, plain holders, queues of
// several lengths and extreme field values.
func sampleState(t testing.TB) *State {
	t.Helper()
	s := New()
	apply := func(c Command) Result {
		res, _ := s.Apply(c, nil)
		if res.Status == StatusRejected {
			t.Fatalf("%+v: %v", c, res.Err)
		}
		return res
	}
	apply(Command{Op: OpAcquire, Key: "gone", Owner: "a", LeaseSec: 1, Now: 1})
	apply(Command{Op: OpRelease, Key: "gone", Owner: "a", Token: 1})
	apply(Command{Op: OpAcquire, Key: "z", Owner: "a", LeaseSec: 250, Now: math.MinInt64})
	apply(Command{Op: OpAcquire, Key: strings.Repeat("~", MaxKeyLen), Owner: strings.Repeat("!", MaxOwnerLen), LeaseSec: 3, Now: math.MaxInt64})
	apply(Command{Op: OpAcquire, Key: "q", Owner: "h", LeaseSec: 5, Now: 10})
	for i := range uint64(5) {
		apply(Command{Op: OpAcquire, Key: "q", Owner: "w", Ref: math.MaxUint64 - i, LeaseSec: uint32(1 + i), WaitMs: MaxWaitMs - uint32(i), Now: -int64(i)})
	}
	apply(Command{Op: OpCancelWait, Key: "q", Ref: math.MaxUint64 - 2})
	apply(Command{Op: OpRelease, Key: "q", Owner: "h", Token: 4, Now: 20})
	apply(Command{Op: OpAcquire, Key: "r", Owner: "h", LeaseSec: 5})
	apply(Command{Op: OpAcquire, Key: "r", Owner: "w", Ref: 0, LeaseSec: 1, WaitMs: 1})
	return s
}

func TestSnapshotRoundTrip(t *testing.T) {
	checkSnapshotRoundTrip(t, New())
	s := sampleState(t)
	r := checkSnapshotRoundTrip(t, s)
	if r.LastToken() != s.LastToken() || r.NumHeld() != 4 || r.NumWaiting() != 4 {
		t.Fatalf("restored %s", formatState(r))
	}
	// The counter survives even when nothing is held.
	s = New()
	for range 3 {
		res, _ := s.Apply(Command{Op: OpAcquire, Key: "k", Owner: "a", LeaseSec: 1}, nil)
		s.Apply(Command{Op: OpExpire, Key: "k", Token: res.Token}, nil)
	}
	r = checkSnapshotRoundTrip(t, s)
	if res, _ := r.Apply(Command{Op: OpAcquire, Key: "k", Owner: "a", LeaseSec: 1}, nil); res.Token != 4 {
		t.Fatalf("token after restore: %d, want 4", res.Token)
	}
}

// Restoring through readers that return little at a time, or data with
// io.EOF, exercises the buffer refill and checksum bookkeeping.
func TestReadSnapshotReaders(t *testing.T) {
	want := snapshotBytes(t, sampleState(t))
	big := New()
	for i := range 1500 {
		big.Apply(Command{Op: OpAcquire, Key: strings.Repeat("k", 200) + strconv.Itoa(i), Owner: "o", LeaseSec: 1}, nil)
	}
	wantBig := snapshotBytes(t, big)
	if len(wantBig) < 3*snapBufSize {
		t.Fatalf("snapshot of %d bytes does not span buffers", len(wantBig))
	}
	for _, b := range [][]byte{want, wantBig} {
		for name, r := range map[string]io.Reader{
			"one byte": iotest.OneByteReader(bytes.NewReader(b)),
			"half":     iotest.HalfReader(bytes.NewReader(b)),
			"data+EOF": iotest.DataErrReader(bytes.NewReader(b)),
		} {
			s, err := ReadSnapshot(r)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got := snapshotBytes(t, s); !bytes.Equal(got, b) {
				t.Fatalf("%s: round trip differs", name)
			}
		}
	}
}

func TestReadSnapshotTruncatedAndFlipped(t *testing.T) {
	for _, b := range [][]byte{snapshotBytes(t, sampleState(t)), sampleSnapV3().done()} {
		checkTruncatedAndFlipped(t, b)
	}
}

func checkTruncatedAndFlipped(t *testing.T, b []byte) {
	for n := range len(b) {
		if _, err := ReadSnapshot(bytes.NewReader(b[:n])); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("prefix of %d bytes: %v", n, err)
		}
	}
	for i := range b {
		for _, mask := range []byte{0x01, 0x80} {
			c := bytes.Clone(b)
			c[i] ^= mask
			if _, err := ReadSnapshot(bytes.NewReader(c)); !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("byte %d ^ %#x accepted: %v", i, mask, err)
			}
		}
	}
	if _, err := ReadSnapshot(bytes.NewReader(append(bytes.Clone(b), 0))); !errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("trailing byte: %v", err)
	}
}

// snapBuilder writes raw snapshot fields, so tests can state things
// WriteSnapshot never would, with a valid checksum unless told otherwise.
type snapBuilder struct{ b []byte }

func newSnap(last, nkeys uint64) *snapBuilder {
	sb := &snapBuilder{b: []byte(snapMagic + "\x01")}
	return sb.u(last).u(nkeys)
}

func (sb *snapBuilder) u(v uint64) *snapBuilder { sb.b = binary.AppendUvarint(sb.b, v); return sb }
func (sb *snapBuilder) i(v int64) *snapBuilder  { sb.b = binary.AppendVarint(sb.b, v); return sb }
func (sb *snapBuilder) s(v string) *snapBuilder { return sb.u(uint64(len(v))).raw(v) }
func (sb *snapBuilder) raw(v string) *snapBuilder {
	sb.b = append(sb.b, v...)
	return sb
}

// key appends a key record: holder and the number of waiters that follow.
func (sb *snapBuilder) key(name, owner string, token, lease uint64, nwait uint64) *snapBuilder {
	return sb.s(name).s(owner).u(token).u(lease).i(0).u(nwait)
}

func (sb *snapBuilder) waiter(owner string, ref, lease, wait uint64) *snapBuilder {
	return sb.s(owner).u(ref).u(lease).u(wait).i(0)
}

// newSnap2 starts a version 2 snapshot.
func newSnap2(last uint64, clock int64, nkeys uint64) *snapBuilder {
	sb := &snapBuilder{b: []byte(snapMagic + "\x02")}
	return sb.u(last).i(clock).u(nkeys)
}

// key2 appends a version 2 key record held under token (0: reserved).
func (sb *snapBuilder) key2(name, owner string, token, lease uint64, nwait uint64) *snapBuilder {
	sb.s(name).u(token)
	if token != 0 {
		sb.s(owner).u(lease).i(0)
	}
	return sb.u(nwait)
}

// waiter2 appends a version 2 waiter; keys: its block's keys, none for a
// single-key waiter.
func (sb *snapBuilder) waiter2(owner string, ref, lease, wait uint64, keys ...string) *snapBuilder {
	sb.waiter(owner, ref, lease, wait).u(uint64(len(keys)))
	for _, k := range keys {
		sb.s(k)
	}
	return sb
}

// blocks appends the blocks section: pairs of a token and its keys.
func (sb *snapBuilder) blocks(bs ...any) *snapBuilder {
	sb.u(uint64(len(bs) / 2))
	for i := 0; i < len(bs); i += 2 {
		keys := bs[i+1].([]string)
		sb.u(bs[i].(uint64)).u(uint64(len(keys)))
		for _, k := range keys {
			sb.s(k)
		}
	}
	return sb
}

// newSnap3 starts a version 3 snapshot: version 2's body, then renewals.
func newSnap3(last uint64, clock int64, nkeys uint64) *snapBuilder {
	sb := &snapBuilder{b: []byte(snapMagic + "\x03")}
	return sb.u(last).i(clock).u(nkeys)
}

// renewals appends the renewals section: pairs of a token and its
// renewedAt.
func (sb *snapBuilder) renewals(rs ...int64) *snapBuilder {
	sb.u(uint64(len(rs) / 2))
	for i := 0; i < len(rs); i += 2 {
		sb.u(uint64(rs[i])).i(rs[i+1])
	}
	return sb
}

func (sb *snapBuilder) done() []byte {
	return binary.LittleEndian.AppendUint32(bytes.Clone(sb.b), crc32.Checksum(sb.b, castagnoli))
}

func TestReadSnapshotInvariants(t *testing.T) {
	good := newSnap(5, 2).key("a", "o", 1, 10, 1).waiter("w", 7, 10, 1).key("b", "o", 5, 250, 0).done()
	s, err := ReadSnapshot(bytes.NewReader(good))
	if err != nil {
		t.Fatalf("builder's valid snapshot rejected: %v", err)
	}
	if !bytes.Equal(snapshotBytes(t, s), good) {
		t.Fatal("builder's snapshot does not round trip")
	}
	bad := map[string][]byte{
		"empty":                  {},
		"bad magic":              append([]byte("TKSX"), good[4:]...),
		"version 3 of a v1 body": append([]byte("TKSM\x03"), good[5:]...),
		"version 4":              append([]byte("TKSM\x04"), good[5:]...),
		"bad checksum":           append(bytes.Clone(good[:len(good)-1]), good[len(good)-1]^1),
		"more keys than tokens":  newSnap(1, 2).key("a", "o", 1, 10, 0).key("b", "o", 1, 10, 0).done(),
		"fewer keys than said":   newSnap(5, 3).key("a", "o", 1, 10, 0).key("b", "o", 2, 10, 0).done(),
		"empty key":              newSnap(5, 1).key("", "o", 1, 10, 0).done(),
		"key with space":         newSnap(5, 1).key("a b", "o", 1, 10, 0).done(),
		"key too long":           newSnap(5, 1).key(strings.Repeat("k", MaxKeyLen+1), "o", 1, 10, 0).done(),
		"keys descending":        newSnap(5, 2).key("b", "o", 1, 10, 0).key("a", "o", 2, 10, 0).done(),
		"duplicate key":          newSnap(5, 2).key("a", "o", 1, 10, 0).key("a", "o", 2, 10, 0).done(),
		"empty owner":            newSnap(5, 1).key("a", "", 1, 10, 0).done(),
		"owner too long":         newSnap(5, 1).key("a", strings.Repeat("o", MaxOwnerLen+1), 1, 10, 0).done(),
		"token 0":                newSnap(5, 1).key("a", "o", 0, 10, 0).done(),
		"token above counter":    newSnap(5, 1).key("a", "o", 6, 10, 0).done(),
		"token held twice":       newSnap(5, 2).key("a", "o", 3, 10, 0).key("b", "o", 3, 10, 0).done(),
		"lease 0":                newSnap(5, 1).key("a", "o", 1, 0, 0).done(),
		"lease 251":              newSnap(5, 1).key("a", "o", 1, 251, 0).done(),
		"lease over uint32":      newSnap(5, 1).key("a", "o", 1, 1<<32, 0).done(),
		"waiter wait 0":          newSnap(5, 1).key("a", "o", 1, 10, 1).waiter("w", 1, 10, 0).done(),
		"waiter wait too long":   newSnap(5, 1).key("a", "o", 1, 10, 1).waiter("w", 1, 10, MaxWaitMs+1).done(),
		"waiter lease 0":         newSnap(5, 1).key("a", "o", 1, 10, 1).waiter("w", 1, 0, 10).done(),
		"waiter bad owner":       newSnap(5, 1).key("a", "o", 1, 10, 1).waiter("w\n", 1, 10, 10).done(),
		"waiter ref twice":       newSnap(5, 1).key("a", "o", 1, 10, 2).waiter("w", 1, 10, 10).waiter("x", 1, 10, 10).done(),
		"missing waiter":         newSnap(5, 1).key("a", "o", 1, 10, 2).waiter("w", 1, 10, 10).done(),
		"non-minimal varint":     newSnap(5, 1).s("a").s("o").raw("\x81\x00").u(10).i(0).u(0).done(),
		"varint overflow":        newSnap(5, 1).s("a").s("o").raw(strings.Repeat("\xff", 10) + "\x01").u(10).i(0).u(0).done(),
		"trailing bytes":         append(bytes.Clone(good), 0),
		"two snapshots":          append(bytes.Clone(good), good...),
	}
	for name, b := range bad {
		if _, err := ReadSnapshot(bytes.NewReader(b)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Version 2 carries blocks; the reader checks what only blocks can break.
func TestReadSnapshotV2Invariants(t *testing.T) {
	ab := []string{"a", "b"}
	// a and b held by block 3; c reserved for the block (c,a) of ref 9,
	// which also waits on a; d held alone with a single waiter.
	good := newSnap2(5, 77, 4).
		key2("a", "o", 3, 10, 1).waiter2("w", 9, 10, 5, "c", "a").
		key2("b", "o", 3, 10, 0).
		key2("c", "", 0, 0, 1).waiter2("w", 9, 10, 5, "c", "a").
		key2("d", "p", 4, 10, 1).waiter2("x", 1, 10, 5).
		blocks(uint64(3), ab).done()
	s, err := ReadSnapshot(bytes.NewReader(good))
	if err != nil {
		t.Fatalf("builder's valid snapshot rejected: %v", err)
	}
	if !bytes.Equal(snapshotBytes(t, s), good) {
		t.Fatal("builder's snapshot does not round trip")
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
	if s.NumHeld() != 3 || s.NumReserved() != 1 || s.NumWaiting() != 2 || s.NumBlocks() != 1 || s.clock != 77 {
		t.Fatal(formatState(s))
	}
	if h, _ := s.Holder("b"); !slices.Equal(h.Keys, ab) {
		t.Fatalf("holder of b: %+v", h)
	}
	bad := map[string][]byte{
		"block key not held under its token": newSnap2(5, 0, 2).key2("a", "o", 3, 10, 0).key2("b", "o", 4, 10, 0).
			blocks(uint64(3), ab).done(),
		"shared token without a block": newSnap2(5, 0, 2).key2("a", "o", 3, 10, 0).key2("b", "o", 3, 10, 0).blocks().done(),
		"block smaller than its holders": newSnap2(5, 0, 3).key2("a", "o", 3, 10, 0).key2("b", "o", 3, 10, 0).
			key2("c", "o", 3, 10, 0).blocks(uint64(3), ab).done(),
		"block of one key":         newSnap2(5, 0, 1).key2("a", "o", 3, 10, 0).blocks(uint64(3), []string{"a"}).done(),
		"block naming a key twice": newSnap2(5, 0, 1).key2("a", "o", 3, 10, 0).blocks(uint64(3), []string{"a", "a"}).done(),
		"blocks out of order": newSnap2(5, 0, 4).key2("a", "o", 3, 10, 0).key2("b", "o", 3, 10, 0).
			key2("c", "o", 2, 10, 0).key2("d", "o", 2, 10, 0).blocks(uint64(3), ab, uint64(2), []string{"c", "d"}).done(),
		"reserved key without waiters":     newSnap2(5, 0, 1).key2("a", "", 0, 0, 0).blocks().done(),
		"reserved for a single-key waiter": newSnap2(5, 0, 1).key2("a", "", 0, 0, 1).waiter2("w", 1, 10, 5).blocks().done(),
		"reserved for a block that could be granted": newSnap2(5, 0, 2).
			key2("a", "", 0, 0, 1).waiter2("w", 9, 10, 5, "a", "b").
			key2("b", "", 0, 0, 1).waiter2("w", 9, 10, 5, "a", "b").blocks().done(),
		"queued block missing from one of its keys": newSnap2(5, 0, 1).
			key2("a", "o", 1, 10, 1).waiter2("w", 9, 10, 5, "a", "b").blocks().done(),
		"queued block on a key it does not name": newSnap2(5, 0, 1).
			key2("c", "o", 1, 10, 1).waiter2("w", 9, 10, 5, "a", "b").blocks().done(),
		"queued block differs between its queues": newSnap2(5, 0, 2).
			key2("a", "o", 1, 10, 1).waiter2("w", 9, 10, 5, "a", "b").
			key2("b", "o", 2, 10, 1).waiter2("w", 9, 11, 5, "a", "b").blocks().done(),
		"two queued blocks with one ref": newSnap2(5, 0, 4).
			key2("a", "o", 1, 10, 1).waiter2("w", 9, 10, 5, "a", "b").
			key2("b", "o", 2, 10, 1).waiter2("w", 9, 10, 5, "a", "b").
			key2("c", "o", 3, 10, 1).waiter2("w", 9, 10, 5, "c", "d").
			key2("d", "o", 4, 10, 1).waiter2("w", 9, 10, 5, "c", "d").blocks().done(),
		"queued block of 17 keys": newSnap2(5, 0, 1).
			key2("a", "o", 1, 10, 1).waiter2("w", 9, 10, 5, slices.Repeat([]string{"a"}, 17)...).blocks().done(),
		"version 1 reserved key": newSnap(5, 1).s("a").s("").u(0).done(),
	}
	for name, b := range bad {
		if _, err := ReadSnapshot(bytes.NewReader(b)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A state without blocks is written in version 1, which nodes older than
// blocks can read; one with blocks held or queued in version 2; and once
// they are gone, in version 1 again. (Renewals: TestSnapshotVersionFollowsRenewals.)
func TestSnapshotVersionFollowsBlocks(t *testing.T) {
	s := New()
	version := func() byte { return snapshotBytes(t, s)[len(snapMagic)] }
	apply := func(c Command) {
		if res, _ := s.Apply(c, nil); res.Status == StatusRejected {
			t.Fatalf("%+v: %v", c, res.Err)
		}
	}
	apply(Command{Op: OpAcquire, Key: "a", Owner: "o", LeaseSec: 10, Now: 1})
	if v := version(); v != snapV1 {
		t.Fatalf("no blocks: version %d", v)
	}
	apply(Command{Op: OpAcquireBlock, Keys: []string{"a", "b"}, Owner: "o", LeaseSec: 10, WaitMs: 10, Ref: 5, Now: 2})
	if v := version(); v != snapV2 {
		t.Fatalf("queued block: version %d", v)
	}
	f := s.Freeze()
	apply(Command{Op: OpCancelWait, Key: "b", Ref: 5})
	if v := version(); v != snapV1 {
		t.Fatalf("block gone: version %d", v)
	}
	var buf bytes.Buffer
	if err := f.WriteSnapshot(&buf); err != nil || buf.Bytes()[len(snapMagic)] != snapV2 {
		t.Fatalf("frozen view with a queued block: %v version %d", err, buf.Bytes()[len(snapMagic)])
	}
	apply(Command{Op: OpAcquireBlock, Keys: []string{"c", "b"}, Owner: "o", LeaseSec: 10, Now: 3})
	if v := version(); v != snapV2 {
		t.Fatalf("held block: version %d", v)
	}
	apply(Command{Op: OpExpire, Key: "b", Token: 2})
	if v := version(); v != snapV1 {
		t.Fatalf("block expired: version %d", v)
	}
}

// Counts in a snapshot are not trusted: a tiny input claiming 2^62 keys or
// waiters must fail on truncation without reserving memory for them.
func TestReadSnapshotLyingCounts(t *testing.T) {
	for name, b := range map[string][]byte{
		"keys":         newSnap(math.MaxUint64, 1<<62).key("a", "o", 1, 10, 0).done(),
		"waiters":      newSnap(5, 1).key("a", "o", 1, 10, 1<<62).waiter("w", 1, 10, 10).done(),
		"keys 2^32":    newSnap(math.MaxUint64, 1<<32).key("a", "o", 1, 10, 0).done(),
		"waiters 2^32": newSnap(5, 1).key("a", "o", 1, 10, 1<<32).waiter("w", 1, 10, 10).done(),
		"no keys 2^32": newSnap(1<<32, 1<<32).done(),
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, err := ReadSnapshot(bytes.NewReader(b))
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("%s: %v", name, err)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
			t.Fatalf("%s: %d bytes allocated for a %d-byte input", name, n, len(b))
		}
	}
}

type failingIO struct{ n int }

var errDisk = errors.New("disk on fire")

func (f *failingIO) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errDisk
	}
	n := min(len(p), f.n)
	f.n -= n
	return n, nil
}

func (f *failingIO) Write(p []byte) (int, error) {
	if len(p) > f.n {
		n := f.n
		f.n = 0
		return n, errDisk
	}
	f.n -= len(p)
	return len(p), nil
}

func TestSnapshotIOErrors(t *testing.T) {
	b := snapshotBytes(t, sampleState(t))
	r := io.MultiReader(bytes.NewReader(b[:len(b)/2]), &failingIO{})
	if _, err := ReadSnapshot(r); !errors.Is(err, errDisk) || errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("read error reported as %v", err)
	}
	for _, n := range []int{0, 10, len(b) - 1} {
		if err := sampleState(t).WriteSnapshot(&failingIO{n: n}); !errors.Is(err, errDisk) {
			t.Fatalf("write error after %d bytes reported as %v", n, err)
		}
	}
}

// A counter at 2^64-1 (only from a crafted snapshot) must not wrap around
// to reuse tokens: grants are refused and waiters are told they lost.
func TestTokensExhausted(t *testing.T) {
	b := newSnap(math.MaxUint64, 1).key("k", "o", math.MaxUint64, 10, 2).
		waiter("w", 1, 10, 10).waiter("x", 2, 10, 10).done()
	s, err := ReadSnapshot(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if res, _ := s.Apply(Command{Op: OpAcquire, Key: "j", Owner: "a", LeaseSec: 1}, nil); res.Err != ErrTokensExhausted {
		t.Fatalf("acquire: %+v", res)
	}
	res, eff := s.Apply(Command{Op: OpRelease, Key: "k", Owner: "o", Token: math.MaxUint64}, nil)
	got := formatResult(res, eff)
	want := "released\neffect dropped key=k owner=w ref=1\neffect dropped key=k owner=x ref=2"
	if got != want {
		t.Fatalf("release:\n%s\nwant\n%s", got, want)
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
	if s.NumHeld() != 0 || s.NumWaiting() != 0 || s.LastToken() != math.MaxUint64 {
		t.Fatal(formatState(s))
	}
}

// With no token left, a released block's keys cannot be handed on: every
// waiter of each is dropped, a queued block leaves all its queues, and a
// key reserved for it is decided again (and dropped in turn).
func TestTokensExhaustedWithBlocks(t *testing.T) {
	max := uint64(math.MaxUint64)
	b := newSnap2(max, 0, 3).
		key2("a", "o", max, 10, 1).waiter2("w", 1, 10, 10, "a", "c").
		key2("b", "o", max, 10, 1).waiter2("x", 2, 10, 10).
		key2("c", "", 0, 0, 2).waiter2("w", 1, 10, 10, "a", "c").waiter2("y", 3, 10, 10).
		blocks(max, []string{"a", "b"}).done()
	s, err := ReadSnapshot(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	res, eff := s.Apply(Command{Op: OpRelease, Key: "b", Owner: "o", Token: max}, nil)
	got := formatResult(res, eff)
	want := "released\neffect dropped key=a keys=a,c owner=w ref=1\neffect dropped key=c owner=y ref=3\neffect dropped key=b owner=x ref=2"
	if got != want {
		t.Fatalf("release:\n%s\nwant\n%s", got, want)
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
	if s.NumHeld() != 0 || s.NumWaiting() != 0 || s.NumReserved() != 0 || s.NumBlocks() != 0 {
		t.Fatal(formatState(s))
	}
}

func TestReadMethods(t *testing.T) {
	s := sampleState(t)
	w := s.Waiters("q")
	if len(w) != 3 {
		t.Fatalf("waiters: %+v", w)
	}
	w[0].Owner = "changed"
	if s.Waiters("q")[0].Owner == "changed" {
		t.Fatal("Waiters returned the state's own slice")
	}
	if s.Waiters("nope") != nil || s.Waiters("z") != nil {
		t.Fatal("waiters of a key without a queue")
	}
	if _, ok := s.Holder("gone"); ok {
		t.Fatal("released key still held")
	}
	var keys []string
	s.RangeHolders(func(k string, h Holder) bool {
		keys = append(keys, k)
		return len(keys) < 2
	})
	if len(keys) != 2 || keys[0] != "q" || keys[1] != "r" {
		t.Fatalf("RangeHolders visited %q", keys)
	}
	// fn may change the state: released keys are skipped.
	keys = keys[:0]
	s.RangeHolders(func(k string, h Holder) bool {
		keys = append(keys, k)
		if k == "q" {
			z, _ := s.Holder("z")
			s.Apply(Command{Op: OpRelease, Key: "z", Owner: z.Owner, Token: z.Token}, nil)
		}
		return true
	})
	if strings.Join(keys, ",") != "q,r,"+strings.Repeat("~", MaxKeyLen) {
		t.Fatalf("RangeHolders visited %q", keys)
	}
}

// FuzzReadSnapshot: seeds in testdata/fuzz/FuzzReadSnapshot (valid
// snapshots with keys and waiters, as whole files and as bodies, lying
// counts, every invariant ReadSnapshot checks broken once, version 3's
// renewals valid and broken, version 4's sessions valid and broken)
// besides the ones added here.
func FuzzReadSnapshot(f *testing.F) {
	f.Add(snapshotBytes(f, New()), false)
	f.Add(snapshotBytes(f, sampleState(f)), false)
	good := newSnap(5, 2).key("a", "o", 1, 10, 1).waiter("w", 7, 10, 1).key("b", "o", 5, 250, 0)
	f.Add(bytes.Clone(good.b), true)
	f.Add(newSnap(1, 2).key("a", "o", 1, 10, 0).key("b", "o", 1, 10, 0).b, true)
	f.Add([]byte("TKSM\x01\x00\x00"), true)
	good2 := newSnap2(5, 77, 3).
		key2("a", "o", 3, 10, 1).waiter2("w", 9, 10, 5, "c", "a").
		key2("b", "o", 3, 10, 0).
		key2("c", "", 0, 0, 1).waiter2("w", 9, 10, 5, "c", "a").
		blocks(uint64(3), []string{"a", "b"})
	f.Add(bytes.Clone(good2.b), true)
	f.Add(bytes.Clone(sampleSnapV3().b), true)
	f.Add(sampleSnapV3().done(), false)
	f.Add(bytes.Clone(sampleSnapV4().b), true)
	f.Add(sampleSnapV4().done(), false)
	f.Add(bytes.Clone(sampleSnapV6().b), true)
	f.Add(sampleSnapV6().done(), false)
	f.Add(bytes.Clone(sampleSnapV7Records().b), true)
	f.Add(sampleSnapV7Records().done(), false)
	f.Add([]byte{}, false)
	f.Fuzz(func(t *testing.T, b []byte, fixChecksum bool) {
		// With fixChecksum the input is a snapshot body and the fuzzer
		// can reach the accepting path; without it, the checksum guards
		// it and the fuzzer exercises the rejections.
		if fixChecksum {
			b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
		}
		var s *State
		var err error
		// Counts are trusted for preallocation only up to snapPrealloc
		// (a few MB at most, besides the 64 KiB read buffer); beyond
		// that memory grows with the bytes actually read.
		checkAllocBound(t, 8<<20+256*uint64(len(b)), fmt.Sprintf("reading %d bytes", len(b)),
			func() { s, err = ReadSnapshot(bytes.NewReader(b)) })
		if err != nil {
			if !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("error does not wrap ErrCorruptSnapshot: %v", err)
			}
			return
		}
		if err := checkInvariants(s); err != nil {
			t.Fatal(err)
		}
		if re := snapshotBytes(t, s); !bytes.Equal(re, b) {
			t.Fatalf("round trip:\n%x\n%x", b, re)
		}
		// A restored state must be fully usable.
		var eff []Effect
		s.RangeHolders(func(k string, h Holder) bool {
			_, eff = s.Apply(Command{Op: OpAcquire, Key: k, Owner: "f", Ref: 1, LeaseSec: 1, WaitMs: 1}, eff)
			// A session's holding is extended only by its session, with a
			// seq above its floor that it has not used.
			ext := Command{Op: OpExtend, Key: k, Owner: h.Owner, Token: h.Token, LeaseSec: 2, Now: 1, Session: h.Session}
			var res Result
			if si, ok := s.Session(h.Session); ok {
				ext.Seq = si.Floor + 1
			}
			for {
				if res, _ = s.Apply(ext, nil); !errors.Is(res.Err, ErrDuplicateSeq) {
					break
				}
				ext.Seq++
			}
			if res.Status != StatusExtended {
				t.Fatalf("extend of restored holder %q %+v: %+v", k, h, res)
			}
			_, eff = s.Apply(Command{Op: OpExpire, Key: k, Token: h.Token}, eff)
			return true
		})
		// And its sessions: each resumed, used and expired.
		for _, id := range s.Sessions() {
			si, _ := s.Session(id)
			s.Apply(Command{Op: OpResumeSession, Session: id, Seq: si.Floor + 1, Ack: si.Serial, Epoch: si.Epoch}, nil)
			s.Apply(Command{Op: OpAcquire, Key: "fuzz", Owner: "f", Ref: 2, LeaseSec: 1, WaitMs: 1, Session: id, Seq: si.Floor + 2}, nil)
			tokens := []uint64{s.LastToken()}
			for _, k := range s.sortedKeys() {
				if h, ok := s.Holder(k); ok && h.Session == id {
					tokens = append(tokens, h.Token)
				}
			}
			s.Apply(Command{Op: OpExpireSession, Session: id, Epoch: si.Epoch + 1, Tokens: tokens}, nil)
		}
		s.Apply(Command{Op: OpDropSessionless}, nil)
		s.Apply(Command{Op: OpDropWaiters}, eff)
		if err := checkInvariants(s); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFrozenWhileApplying writes a Frozen view on another goroutine while
// the State goes on applying every kind of change to the same keys. Under
// the race detector (make test) a write to anything the view shares fails
// the test; without it, the bytes must still equal those of the moment of
// the freeze.
func TestFrozenWhileApplying(t *testing.T) {
	s := New()
	keys := benchKeys(2000)
	for i, k := range keys {
		s.Apply(Command{Op: OpAcquire, Key: k, Owner: "holder", LeaseSec: 30, Now: int64(i)}, nil)
		for r := range uint64(i % 3) {
			s.Apply(Command{Op: OpAcquire, Key: k, Owner: "waiter", Ref: uint64(i)*10 + r, LeaseSec: 30, WaitMs: 5000, Now: int64(i)}, nil)
		}
		if i%4 == 0 {
			s.Apply(Command{Op: OpExtend, Key: k, Owner: "holder", Token: uint64(i + 1), LeaseSec: 60, Now: int64(i) + 1}, nil)
		}
	}
	if s.NumRenewed() != len(keys)/4 {
		t.Fatalf("%d renewals before the freeze", s.NumRenewed())
	}
	for i := range 10 { // revoke records the view shares
		k := fmt.Sprintf("pre-%d", i)
		s.Apply(Command{Op: OpAcquire, Key: k, Owner: "holder", LeaseSec: 30, Now: 1}, nil)
		if res, _ := s.Apply(Command{Op: OpRevoke, Key: k, Owner: "ops", Token: s.LastToken(), Reason: "r", Now: 2}, nil); res.Status != StatusRevoked {
			t.Fatal(res)
		}
	}
	var want bytes.Buffer
	if err := s.WriteSnapshot(&want); err != nil {
		t.Fatal(err)
	}
	f := s.Freeze()
	done := make(chan []byte)
	go func() {
		var got bytes.Buffer
		for range 3 {
			got.Reset()
			if err := f.WriteSnapshot(&got); err != nil {
				t.Error(err)
			}
		}
		done <- got.Bytes()
	}()
	for i, k := range keys {
		switch i % 5 {
		case 0: // hand-off or delete
			h, _ := s.Holder(k)
			s.Apply(Command{Op: OpRelease, Key: k, Owner: h.Owner, Token: h.Token, Now: 1e6}, nil)
		case 1: // expiry
			h, _ := s.Holder(k)
			s.Apply(Command{Op: OpExpire, Key: k, Token: h.Token, Now: 1e6}, nil)
		case 2: // a waiter gives up
			s.Apply(Command{Op: OpCancelWait, Key: k, Ref: uint64(i) * 10, Now: 1e6}, nil)
		case 3: // one more waiter
			s.Apply(Command{Op: OpAcquire, Key: k, Owner: "late", Ref: 1 << 40, LeaseSec: 30, WaitMs: 100, Now: 1e6}, nil)
		case 4: // an extend (a renewal replaced or added)
			h, _ := s.Holder(k)
			if res, _ := s.Apply(Command{Op: OpExtend, Key: k, Owner: h.Owner, Token: h.Token, LeaseSec: 5, Now: 1e6}, nil); res.Status != StatusExtended {
				t.Fatal(res)
			}
		}
		if i == len(keys)/2 {
			s.Apply(Command{Op: OpDropWaiters, Now: 1e6}, nil)
		}
		s.Apply(Command{Op: OpAcquire, Key: fmt.Sprintf("new-%d", i), Owner: "new", LeaseSec: 30, Now: 1e6}, nil)
		if i%7 == 0 { // a revoke record added, or one replaced
			k := fmt.Sprintf("new-%d", i)
			if i%14 == 0 {
				k = fmt.Sprintf("pre-%d", i/14%10)
				s.Apply(Command{Op: OpAcquire, Key: k, Owner: "holder", LeaseSec: 30, Now: 1e6}, nil)
			}
			s.Apply(Command{Op: OpRevoke, Key: k, Owner: "ops", Token: s.LastToken(), Now: 1e6}, nil)
		}
	}
	if got := <-done; !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("frozen view wrote %d bytes that differ from the %d of the moment of the freeze", len(got), want.Len())
	}
	if f.NumHeld() != len(keys) {
		t.Fatalf("view holds %d keys, want %d", f.NumHeld(), len(keys))
	}
}

// sampleSnapV3 is a version 3 snapshot (without its checksum): a and b
// held by block 3, renewed at 500; c held alone under 4 and renewed at -7
// (a leader's clock may be anywhere); d held under 5, never renewed, with
// a waiter.
func sampleSnapV3() *snapBuilder {
	return newSnap3(5, 77, 4).
		key2("a", "o", 3, 20, 0).
		key2("b", "o", 3, 20, 0).
		key2("c", "p", 4, 1, 0).
		key2("d", "p", 5, 10, 1).waiter2("x", 1, 10, 5).
		blocks(uint64(3), []string{"a", "b"}).renewals(3, 500, 4, -7)
}

// Version 3 is version 2 plus the renewals of extended holdings; the
// reader checks that each names a held token, once, in ascending order.
func TestReadSnapshotV3Invariants(t *testing.T) {
	ab := []string{"a", "b"}
	good := sampleSnapV3().done()
	s, err := ReadSnapshot(bytes.NewReader(good))
	if err != nil {
		t.Fatalf("builder's valid snapshot rejected: %v", err)
	}
	if !bytes.Equal(snapshotBytes(t, s), good) {
		t.Fatal("builder's snapshot does not round trip")
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
	if s.NumRenewed() != 2 || s.NumBlocks() != 1 || s.clock != 77 {
		t.Fatal(formatState(s))
	}
	for k, want := range map[string]int64{"a": 500, "b": 500, "c": -7, "d": 0} {
		if h, _ := s.Holder(k); h.RenewedAt != want {
			t.Errorf("holder of %s: %+v, want RenewedAt %d", k, h, want)
		}
	}
	var seen []int64
	s.RangeHolders(func(k string, h Holder) bool { seen = append(seen, h.RenewedAt); return true })
	if !slices.Equal(seen, []int64{500, 500, -7, 0}) {
		t.Fatalf("RangeHolders RenewedAt %v", seen)
	}
	// Without blocks, version 3 still has version 2's layout.
	noBlocks := newSnap3(2, 0, 1).key2("c", "p", 2, 1, 0).blocks().renewals(2, 9).done()
	if s, err := ReadSnapshot(bytes.NewReader(noBlocks)); err != nil || !bytes.Equal(snapshotBytes(t, s), noBlocks) {
		t.Fatalf("version 3 without blocks: %v", err)
	}
	bad := map[string][]byte{
		"renewal of a token never issued": newSnap3(5, 0, 1).key2("c", "p", 4, 1, 0).blocks().renewals(6, 1).done(),
		"renewal of a token not held":     newSnap3(5, 0, 1).key2("c", "p", 4, 1, 0).blocks().renewals(2, 1).done(),
		"renewal of token 0 (reserved)": newSnap3(5, 0, 2).
			key2("a", "o", 1, 10, 1).waiter2("w", 9, 10, 5, "a", "b").
			key2("b", "", 0, 0, 1).waiter2("w", 9, 10, 5, "a", "b").blocks().renewals(0, 1).done(),
		"renewals unsorted": newSnap3(5, 0, 2).key2("c", "p", 4, 1, 0).key2("d", "p", 5, 1, 0).
			blocks().renewals(5, 1, 4, 1).done(),
		"renewal twice": newSnap3(5, 0, 1).key2("c", "p", 4, 1, 0).blocks().renewals(4, 1, 4, 1).done(),
		"block renewed twice": newSnap3(5, 0, 2).key2("a", "o", 3, 20, 0).key2("b", "o", 3, 20, 0).
			blocks(uint64(3), ab).renewals(3, 1, 3, 2).done(),
		"version 3 without renewals": newSnap3(5, 0, 1).key2("c", "p", 4, 1, 0).blocks().renewals().done(),
		"version 3 with blocks but no renewals": newSnap3(5, 0, 2).key2("a", "o", 3, 20, 0).key2("b", "o", 3, 20, 0).
			blocks(uint64(3), ab).renewals().done(),
		"renewals missing":            newSnap3(5, 0, 1).key2("c", "p", 4, 1, 0).blocks().done(),
		"renewal truncated":           newSnap3(5, 0, 1).key2("c", "p", 4, 1, 0).blocks().u(1).u(4).done(),
		"renewals fewer than said":    newSnap3(5, 0, 1).key2("c", "p", 4, 1, 0).blocks().u(2).u(4).i(1).done(),
		"renewals count 2^62":         newSnap3(5, 0, 1).key2("c", "p", 4, 1, 0).blocks().u(1 << 62).u(4).i(1).done(),
		"renewed-at non-minimal":      newSnap3(5, 0, 1).key2("c", "p", 4, 1, 0).blocks().u(1).u(4).raw("\x82\x00").done(),
		"version 2 without blocks":    newSnap2(5, 0, 1).key2("c", "p", 4, 1, 0).blocks().done(),
		"version 2, empty":            newSnap2(5, 7, 0).blocks().done(),
		"version 1 body as version 3": append([]byte("TKSM\x03"), newSnap(5, 0).done()[5:]...),
	}
	for name, b := range bad {
		if _, err := ReadSnapshot(bytes.NewReader(b)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Every way a holding ends drops its renewal, so the snapshot falls back
// to the lowest version that holds what is left.
func TestRenewalEndsWithHolding(t *testing.T) {
	restore := func(b []byte) *State {
		t.Helper()
		s, err := ReadSnapshot(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	version := func(s *State) byte { return snapshotBytes(t, s)[len(snapMagic)] }
	// a, b: block 3; c: 4 with a waiter; d: 5. All three renewed.
	b := newSnap3(6, 0, 4).
		key2("a", "o", 3, 20, 0).
		key2("b", "o", 3, 20, 0).
		key2("c", "p", 4, 1, 1).waiter2("w", 1, 10, 5).
		key2("d", "p", 5, 10, 0).
		blocks(uint64(3), []string{"a", "b"}).renewals(3, 500, 4, 600, 5, 700).done()
	s := restore(b)
	f := s.Freeze()
	step := func(c Command, renewed int, v byte) {
		t.Helper()
		if res, _ := s.Apply(c, nil); res.Status == StatusRejected {
			t.Fatalf("%+v: %v", c, res.Err)
		}
		if err := checkInvariants(s); err != nil {
			t.Fatal(err)
		}
		if s.NumRenewed() != renewed || version(s) != v {
			t.Fatalf("after %+v: %d renewals, version %d; want %d, %d", c, s.NumRenewed(), version(s), renewed, v)
		}
		checkSnapshotRoundTrip(t, s)
	}
	// A hand-off: the new holder (token 7) was never extended.
	step(Command{Op: OpRelease, Key: "c", Owner: "p", Token: 4, Now: 1}, 2, snapV3)
	if h, _ := s.Holder("c"); h.Token != 7 || h.RenewedAt != 0 {
		t.Fatalf("handed-off holder %+v", h)
	}
	// A block released by its second key.
	step(Command{Op: OpRelease, Key: "b", Owner: "o", Token: 3, Now: 2}, 1, snapV3)
	// An expiry; nothing renewed is left, and no block: version 1.
	step(Command{Op: OpExpire, Key: "d", Token: 5, Now: 3}, 0, snapV1)
	// The view frozen before all that still writes what was read.
	var buf bytes.Buffer
	if err := f.WriteSnapshot(&buf); err != nil || !bytes.Equal(buf.Bytes(), b) {
		t.Fatalf("frozen view changed: %v", err)
	}
	// A renewed block expired by its first key, leaving a renewed single
	// holding and a queued block behind: version 3, then 2.
	s = restore(newSnap3(6, 0, 3).
		key2("a", "o", 3, 20, 1).waiter2("w", 9, 10, 5, "a", "c").
		key2("b", "o", 3, 20, 0).
		key2("c", "p", 4, 1, 1).waiter2("w", 9, 10, 5, "a", "c").
		blocks(uint64(3), []string{"a", "b"}).renewals(3, 500, 4, 600).done())
	step(Command{Op: OpExpire, Key: "a", Token: 3, Now: 4}, 1, snapV3)
	step(Command{Op: OpExpire, Key: "c", Token: 4, Now: 5}, 0, snapV2) // grants the block (token 7)
	if h, _ := s.Holder("c"); h.Token != 7 || h.RenewedAt != 0 || len(h.Keys) != 2 {
		t.Fatalf("block granted after the expiry: %+v", h)
	}
}

// With no token left (a crafted snapshot), releasing a renewed holding
// drops its waiters and still drops the renewal.
func TestTokensExhaustedWithRenewal(t *testing.T) {
	max := uint64(math.MaxUint64)
	s, err := ReadSnapshot(bytes.NewReader(newSnap3(max, 0, 1).
		key2("k", "o", max, 10, 1).waiter2("w", 1, 10, 10).blocks().u(1).u(max).i(5).done()))
	if err != nil {
		t.Fatal(err)
	}
	res, eff := s.Apply(Command{Op: OpRelease, Key: "k", Owner: "o", Token: max}, nil)
	if got := formatResult(res, eff); got != "released\neffect dropped key=k owner=w ref=1" {
		t.Fatal(got)
	}
	if err := checkInvariants(s); err != nil || s.NumRenewed() != 0 || s.NumHeld() != 0 {
		t.Fatalf("%v %s", err, formatState(s))
	}
}

// The lowest version that holds the state is written: 1 with neither
// blocks nor renewals, 2 with blocks and no renewal, 3 while any holding
// is extended (blocks or not). A Frozen view keeps the version of its
// moment.
func TestSnapshotVersionFollowsRenewals(t *testing.T) {
	s := New()
	version := func() byte { return snapshotBytes(t, s)[len(snapMagic)] }
	apply := func(c Command, want byte) {
		t.Helper()
		if res, _ := s.Apply(c, nil); res.Status == StatusRejected || res.Status == StatusNoop {
			t.Fatalf("%+v: %+v", c, res)
		}
		if v := version(); v != want {
			t.Fatalf("after %+v: version %d, want %d", c, v, want)
		}
		checkSnapshotRoundTrip(t, s)
	}
	apply(Command{Op: OpAcquire, Key: "a", Owner: "o", LeaseSec: 10, Now: 1}, snapV1)
	apply(Command{Op: OpExtend, Key: "a", Owner: "o", Token: 1, LeaseSec: 20, Now: 2}, snapV3)
	f := s.Freeze()
	apply(Command{Op: OpAcquireBlock, Keys: []string{"b", "c"}, Owner: "p", LeaseSec: 10, Now: 3}, snapV3)
	apply(Command{Op: OpRelease, Key: "a", Owner: "o", Token: 1, Now: 4}, snapV2)
	apply(Command{Op: OpExtend, Key: "c", Owner: "p", Token: 2, LeaseSec: 30, Now: 5}, snapV3)
	if h, _ := s.Holder("b"); h.RenewedAt != 5 || h.LeaseSec != 30 || h.LeaseEnd() != 5+30_000 {
		t.Fatalf("block holder after the extend: %+v", h)
	}
	apply(Command{Op: OpAcquire, Key: "d", Owner: "q", LeaseSec: 10, Now: 6}, snapV3)
	apply(Command{Op: OpExpire, Key: "b", Token: 2, Now: 7}, snapV1)
	var buf bytes.Buffer
	if err := f.WriteSnapshot(&buf); err != nil || buf.Bytes()[len(snapMagic)] != snapV3 {
		t.Fatalf("frozen view of an extended holding: %v", err)
	}
}

// A snapshot of extended holdings restores them exactly: lease, renewal
// time, block membership; the copy goes on like the original.
func TestSnapshotRoundTripRenewals(t *testing.T) {
	s := sampleState(t)
	block, _ := s.Apply(Command{Op: OpAcquireBlock, Keys: []string{"s3", "s1", "s2"}, Owner: "b", LeaseSec: 10, Now: 100}, nil)
	extend := func(key string, lease uint32, now int64) {
		t.Helper()
		h, _ := s.Holder(key)
		if res, _ := s.Apply(Command{Op: OpExtend, Key: key, Owner: h.Owner, Token: h.Token, LeaseSec: lease, Now: now}, nil); res.Status != StatusExtended {
			t.Fatalf("extend %s: %+v", key, res)
		}
	}
	extend("s2", 250, math.MaxInt64)
	extend("z", 1, math.MinInt64)
	extend("r", 7, 0)
	b := snapshotBytes(t, s)
	if b[len(snapMagic)] != snapV3 || s.NumRenewed() != 3 {
		t.Fatalf("version %d, %d renewals", b[len(snapMagic)], s.NumRenewed())
	}
	r := checkSnapshotRoundTrip(t, s)
	for _, k := range []string{"s1", "s2", "s3", "z", "r", "q"} {
		want, _ := s.Holder(k)
		got, ok := r.Holder(k)
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("restored holder of %s: %+v, want %+v", k, got, want)
		}
	}
	if h, _ := r.Holder("s1"); h.RenewedAt != math.MaxInt64 || h.LeaseSec != 250 {
		t.Fatalf("restored block holder %+v", h)
	}
	// A renewal at Now 0 is still a renewal: it survives the round trip.
	if r.NumRenewed() != 3 {
		t.Fatalf("restored %d renewals", r.NumRenewed())
	}
	checkTruncatedAndFlipped(t, b)
	// Both go on alike: the release by a block key ends its renewal.
	for _, st := range []*State{s, r} {
		st.Apply(Command{Op: OpRelease, Key: "s3", Owner: "b", Token: block.Token}, nil)
	}
	if !bytes.Equal(snapshotBytes(t, s), snapshotBytes(t, r)) || r.NumRenewed() != 2 {
		t.Fatal("original and restored copy diverged")
	}
}

// An extend after a Freeze changes the State, never the view: each entry
// it writes is copied first (single keys and every key of a block), and
// the view keeps the renewals of its moment.
func TestFrozenIsolatedFromExtend(t *testing.T) {
	s := New()
	apply := func(c Command) {
		t.Helper()
		if res, _ := s.Apply(c, nil); res.Status == StatusRejected {
			t.Fatalf("%+v: %v", c, res.Err)
		}
	}
	apply(Command{Op: OpAcquire, Key: "a", Owner: "o", LeaseSec: 10, Now: 1})
	apply(Command{Op: OpAcquireBlock, Keys: []string{"b", "c"}, Owner: "p", LeaseSec: 10, Now: 2})
	apply(Command{Op: OpAcquire, Key: "b", Owner: "w", Ref: 1, LeaseSec: 10, WaitMs: 10, Now: 3})
	apply(Command{Op: OpExtend, Key: "a", Owner: "o", Token: 1, LeaseSec: 20, Now: 4})
	for round := range 2 {
		want := snapshotBytes(t, s)
		v := s.Freeze()
		for i := range 3 {
			now := int64(10*round + i + 5)
			apply(Command{Op: OpExtend, Key: "a", Owner: "o", Token: 1, LeaseSec: uint32(30 + i), Now: now})
			apply(Command{Op: OpExtend, Key: "c", Owner: "p", Token: 2, LeaseSec: uint32(40 + i), Now: now})
		}
		var buf bytes.Buffer
		if err := v.WriteSnapshot(&buf); err != nil || !bytes.Equal(buf.Bytes(), want) {
			t.Fatalf("round %d: the view changed after extends (%v)", round, err)
		}
		if bytes.Equal(snapshotBytes(t, s), want) {
			t.Fatalf("round %d: the extends changed nothing", round)
		}
	}
}

// newSnap4 starts a version 4 snapshot: version 3's layout with the
// (session, seq) of holders and waiters, then the sessions.
func newSnap4(last uint64, clock int64, nkeys uint64) *snapBuilder {
	sb := &snapBuilder{b: []byte(snapMagic + "\x04")}
	return sb.u(last).i(clock).u(nkeys)
}

// sref appends a (session, seq): seq only after a session.
func (sb *snapBuilder) sref(session, seq uint64) *snapBuilder {
	if sb.u(session); session != 0 {
		sb.u(seq)
	}
	return sb
}

// key4 appends a version 4 key record held under token (0: reserved) for
// (session, seq).
func (sb *snapBuilder) key4(name, owner string, token, lease, session, seq, nwait uint64) *snapBuilder {
	sb.s(name).u(token)
	if token != 0 {
		sb.s(owner).u(lease).i(0).sref(session, seq)
	}
	return sb.u(nwait)
}

// waiter4 appends a version 4 waiter of (session, seq); keys as waiter2.
func (sb *snapBuilder) waiter4(owner string, ref, lease, wait, session, seq uint64, keys ...string) *snapBuilder {
	return sb.waiter2(owner, ref, lease, wait, keys...).sref(session, seq)
}

// session appends a session record (hash "h"*32, timeout 10 s, opened at
// 1000) followed by the count of outcomes; outcomes are appended with
// outcome.
func (sb *snapBuilder) session(id, floor, serial, ack, epoch, nout uint64) *snapBuilder {
	return sb.u(id).raw(strings.Repeat("h", SecretHashLen)).u(10_000).u(floor).u(serial).u(ack).u(epoch).i(1000).u(nout)
}

// outcome appends an outcome: status 1 takes a token, 0 an error code.
func (sb *snapBuilder) outcome(seq uint64, status Status, arg uint64) *snapBuilder {
	sb.u(seq).raw(string([]byte{byte(status)}))
	switch status {
	case StatusGranted:
		sb.u(arg)
	case StatusRejected:
		sb.raw(string([]byte{byte(arg)}))
	}
	return sb
}

// sampleSnapV4 has sessions 7 and 9: 7 holds the block a,b (seq 2) and
// waits on d (seq 4) with outcomes for seqs 2 (granted 3) and 3 (rejected
// ErrTokenMismatch) kept (ack 1, serial 3); 9 holds c (seq 1), has acked
// everything and no outcome; d is held without a session, its second
// waiter has none. A renewal of c.
func sampleSnapV4() *snapBuilder {
	return newSnap4(5, 77, 4).
		key4("a", "o", 3, 20, 7, 2, 0).
		key4("b", "o", 3, 20, 7, 2, 0).
		key4("c", "p", 4, 1, 9, 1, 0).
		key4("d", "p", 5, 10, 0, 0, 2).waiter4("x", 1, 10, 5, 7, 4).waiter4("y", 2, 10, 5, 0, 0).
		blocks(uint64(3), []string{"a", "b"}).renewals(4, -7).
		u(2).
		session(7, 3, 3, 1, 2, 2).outcome(2, StatusGranted, 3).outcome(3, StatusRejected, 2).
		session(9, 0, 1, 1, 0, 0)
}

// Version 4 carries the sessions; the reader checks every field and that
// holders and waiters name live sessions consistently.
func TestReadSnapshotV4Invariants(t *testing.T) {
	good := sampleSnapV4().done()
	s, err := ReadSnapshot(bytes.NewReader(good))
	if err != nil {
		t.Fatalf("builder's valid snapshot rejected: %v", err)
	}
	if !bytes.Equal(snapshotBytes(t, s), good) {
		t.Fatal("builder's snapshot does not round trip")
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
	si, ok := s.Session(7)
	want := SessionInfo{ID: 7, SecretHash: strings.Repeat("h", SecretHashLen), TimeoutMs: 10_000, Floor: 3, Serial: 3, Ack: 1,
		Epoch: 2, OpenedAt: 1000, Outcomes: 2, Waiters: 1, Holdings: 1}
	if !ok || si != want {
		t.Fatalf("session 7: %+v", si)
	}
	if o, ok := s.SessionOutcome(7, 3); !ok || o != (Outcome{Seq: 3, Serial: 3, Status: StatusRejected, Err: ErrTokenMismatch}) {
		t.Fatalf("outcome of 7/3: %+v %v", o, ok)
	}
	if w, ok := s.SessionWaiter(7, 4); !ok || w.Key != "d" || w.Ref != 1 || w.Keys != nil {
		t.Fatalf("waiter 7/4: %+v %v", w, ok)
	}
	if h, _ := s.Holder("b"); h.Session != 7 || h.Seq != 2 {
		t.Fatalf("holder of b: %+v", h)
	}
	if !slices.Equal(s.Sessions(), []uint64{7, 9}) || s.NumSessions() != 2 {
		t.Fatalf("sessions %v", s.Sessions())
	}
	// Expiring 7 releases its block (named) and times out its waiter.
	res, eff := s.Apply(Command{Op: OpExpireSession, Session: 7, Epoch: 2, Tokens: []uint64{3}, Now: 5}, nil)
	if res.Status != StatusSessionExpired || len(eff) != 1 || eff[0].Kind != EffectTimedOut || s.NumHeld() != 2 {
		t.Fatalf("expiry after restore: %+v %+v\n%s", res, eff, formatState(s))
	}
	ab := []string{"a", "b"}
	h32 := strings.Repeat("h", SecretHashLen)
	body := func(sb *snapBuilder) *snapBuilder { return sb.blocks().renewals() }
	one := func(id uint64) *snapBuilder { return newSnap4(5, 0, 1).key4("c", "p", 4, 1, id, 1, 0) }
	bad := map[string][]byte{
		"version 4 without sessions":        body(newSnap4(5, 0, 1).key4("c", "p", 4, 1, 0, 0, 0)).u(0).done(),
		"sessions missing":                  body(newSnap4(5, 0, 1).key4("c", "p", 4, 1, 0, 0, 0)).done(),
		"version 3 body as version 4":       append([]byte("TKSM\x04"), sampleSnapV3().done()[5:]...),
		"session id 0":                      body(one(0)).u(1).session(0, 0, 0, 0, 0, 0).done(),
		"sessions unsorted":                 body(one(7)).u(2).session(9, 0, 0, 0, 0, 0).session(7, 0, 0, 0, 0, 0).done(),
		"session twice":                     body(one(7)).u(2).session(7, 0, 0, 0, 0, 0).session(7, 0, 0, 0, 0, 0).done(),
		"timeout below bounds":              body(one(7)).u(1).u(7).raw(h32).u(1999).u(0).u(0).u(0).u(0).i(0).u(0).done(),
		"timeout above bounds":              body(one(7)).u(1).u(7).raw(h32).u(300_001).u(0).u(0).u(0).u(0).i(0).u(0).done(),
		"hash truncated":                    body(one(7)).u(1).u(7).raw("h").done(),
		"ack above serial":                  body(one(7)).u(1).session(7, 0, 1, 2, 0, 0).done(),
		"serial above 2^62":                 body(one(7)).u(1).session(7, 0, 1<<62+1, 1<<62+1, 0, 0).done(),
		"fewer outcomes than serials":       body(one(7)).u(1).session(7, 0, 2, 0, 0, 1).outcome(1, StatusBusy, 0).done(),
		"more outcomes than serials":        body(one(7)).u(1).session(7, 0, 0, 0, 0, 1).outcome(1, StatusBusy, 0).done(),
		"outcomes count 2^62":               body(one(7)).u(1).session(7, 0, 1<<62, 0, 0, 1<<62).outcome(1, StatusBusy, 0).done(),
		"outcome seq 0":                     body(one(7)).u(1).session(7, 0, 1, 0, 0, 1).outcome(0, StatusBusy, 0).done(),
		"outcome seq twice":                 body(one(7)).u(1).session(7, 0, 2, 0, 0, 2).outcome(2, StatusBusy, 0).outcome(2, StatusBusy, 0).done(),
		"outcome queued":                    body(one(7)).u(1).session(7, 0, 1, 0, 0, 1).outcome(2, StatusQueued, 0).done(),
		"outcome status 255":                body(one(7)).u(1).session(7, 0, 1, 0, 0, 1).outcome(2, Status(255), 0).done(),
		"outcome granted token 0":           body(one(7)).u(1).session(7, 0, 1, 0, 0, 1).outcome(2, StatusGranted, 0).done(),
		"outcome granted token never given": body(one(7)).u(1).session(7, 0, 1, 0, 0, 1).outcome(2, StatusGranted, 6).done(),
		"outcome err 0":                     body(one(7)).u(1).session(7, 0, 1, 0, 0, 1).outcome(2, StatusRejected, 0).done(),
		"outcome err unknown":               body(one(7)).u(1).session(7, 0, 1, 0, 0, 1).outcome(2, StatusRejected, uint64(len(outcomeErrs)+1)).done(),
		"holder of an unknown session":      body(one(8)).u(1).session(7, 0, 0, 0, 0, 0).done(),
		"holder session without seq": body(newSnap4(5, 0, 1).s("c").u(4).s("p").u(1).i(0).u(7).u(0).u(0)).
			u(1).session(7, 0, 0, 0, 0, 0).done(),
		"waiter of an unknown session": body(newSnap4(5, 0, 1).key4("c", "p", 4, 1, 0, 0, 1).waiter4("w", 1, 1, 1, 8, 1)).
			u(1).session(7, 0, 0, 0, 0, 0).done(),
		"waiter seq twice": body(newSnap4(5, 0, 2).key4("c", "p", 4, 1, 0, 0, 1).waiter4("w", 1, 1, 1, 7, 1).
			key4("d", "p", 5, 1, 0, 0, 1).waiter4("w", 1, 1, 1, 7, 1)).u(1).session(7, 0, 0, 0, 0, 0).done(),
		"waiter seq with an outcome": body(newSnap4(5, 0, 1).key4("c", "p", 4, 1, 0, 0, 1).waiter4("w", 1, 1, 1, 7, 1)).
			u(1).session(7, 0, 1, 0, 0, 1).outcome(1, StatusBusy, 0).done(),
		"block keys of two sessions": newSnap4(5, 0, 2).key4("a", "o", 3, 20, 7, 2, 0).key4("b", "o", 3, 20, 9, 2, 0).
			blocks(uint64(3), ab).renewals().u(2).session(7, 0, 0, 0, 0, 0).session(9, 0, 0, 0, 0, 0).done(),
		"block keys of two seqs": newSnap4(5, 0, 2).key4("a", "o", 3, 20, 7, 2, 0).key4("b", "o", 3, 20, 7, 3, 0).
			blocks(uint64(3), ab).renewals().u(1).session(7, 0, 0, 0, 0, 0).done(),
		"block key without session": newSnap4(5, 0, 2).key4("a", "o", 3, 20, 7, 2, 0).key4("b", "o", 3, 20, 0, 0, 0).
			blocks(uint64(3), ab).renewals().u(1).session(7, 0, 0, 0, 0, 0).done(),
		"queued block of two sessions": newSnap4(5, 0, 2).
			key4("a", "o", 1, 10, 0, 0, 1).waiter4("w", 9, 10, 5, 7, 1, "a", "b").
			key4("b", "", 0, 0, 0, 0, 1).waiter4("w", 9, 10, 5, 9, 1, "a", "b").
			blocks().renewals().u(2).session(7, 0, 0, 0, 0, 0).session(9, 0, 0, 0, 0, 0).done(),
		"sessions count 2^62": body(one(7)).u(1<<62).session(7, 0, 0, 0, 0, 0).done(),
	}
	for name, b := range bad {
		if _, err := ReadSnapshot(bytes.NewReader(b)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
	checkTruncatedAndFlipped(t, good)
}

// A snapshot is version 4 exactly while a session lives, whatever else the
// table holds; the last session's end falls back to what is left.
func TestSnapshotVersionFollowsSessions(t *testing.T) {
	s := New()
	version := func() byte { return snapshotBytes(t, s)[len(snapMagic)] }
	apply := func(c Command) {
		t.Helper()
		if res, _ := s.Apply(c, nil); res.Status == StatusRejected {
			t.Fatalf("%+v: %v", c, res.Err)
		}
	}
	h := strings.Repeat("h", SecretHashLen)
	apply(Command{Op: OpOpenSession, Session: 7, SecretHash: h, TimeoutMs: MinSessionTimeoutMs})
	if v := version(); v != snapV4 {
		t.Fatalf("empty session: version %d", v)
	}
	apply(Command{Op: OpAcquire, Key: "k", Owner: "a", LeaseSec: 1, Session: 7, Seq: 1})
	apply(Command{Op: OpExtend, Key: "k", Owner: "a", Token: 1, LeaseSec: 2, Session: 7, Seq: 2})
	checkSnapshotRoundTrip(t, s)
	// An expiry naming no token leaves the holding (a close, from
	// protocol version 9 on, would release it).
	apply(Command{Op: OpExpireSession, Session: 7, Epoch: 0})
	if v := version(); v != snapV3 {
		t.Fatalf("after the session's end with an extended holding left: version %d", v)
	}
	apply(Command{Op: OpRelease, Key: "k", Owner: "a", Token: 1})
	if v := version(); v != snapV1 {
		t.Fatalf("empty again: version %d", v)
	}
}

// A Frozen view with sessions stays as it was while the session records,
// trims, expires and is opened again (the outcomes' backing array is
// shared with the view).
func TestFrozenIsolatedFromSessions(t *testing.T) {
	s := New()
	h := strings.Repeat("h", SecretHashLen)
	s.Apply(Command{Op: OpOpenSession, Session: 7, SecretHash: h, TimeoutMs: MinSessionTimeoutMs}, nil)
	for i := range uint64(20) {
		s.Apply(Command{Op: OpAcquire, Key: fmt.Sprint("k", i%5), Owner: "a", Ref: i, LeaseSec: 1, WaitMs: 5, Session: 7, Seq: i + 1}, nil)
	}
	want := snapshotBytes(t, s)
	f := s.Freeze()
	done := make(chan []byte)
	go func() {
		var buf bytes.Buffer
		for range 20 {
			buf.Reset()
			if err := f.WriteSnapshot(&buf); err != nil {
				panic(err)
			}
		}
		done <- buf.Bytes()
	}()
	for i := uint64(20); i < 60; i++ {
		s.Apply(Command{Op: OpAcquire, Key: fmt.Sprint("j", i), Owner: "a", LeaseSec: 1, Session: 7, Seq: i + 1, Ack: i / 2}, nil)
	}
	s.Apply(Command{Op: OpResumeSession, Session: 7, Seq: 80, Ack: 50}, nil)
	s.Apply(Command{Op: OpExpireSession, Session: 7, Epoch: 1, Tokens: []uint64{1, 2}}, nil)
	s.Apply(Command{Op: OpOpenSession, Session: 7, SecretHash: strings.Repeat("g", SecretHashLen), TimeoutMs: MaxSessionTimeoutMs}, nil)
	s.Apply(Command{Op: OpAcquire, Key: "x", Owner: "a", LeaseSec: 1, Session: 7, Seq: 1}, nil)
	if got := <-done; !bytes.Equal(got, want) {
		t.Fatal("frozen view changed")
	}
	checkSnapshotRoundTrip(t, s)
}
