package locksm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"
	"testing/quick"
)

// sampleCommands covers every op with ordinary and extreme field values.
func sampleCommands() []Command {
	long := strings.Repeat("k", MaxKeyLen)
	longOwner := strings.Repeat("o", MaxOwnerLen)
	return []Command{
		{Op: OpAcquire, Now: 1_700_000_000_000, Key: "k", Owner: "a", Ref: 1, LeaseSec: 10, WaitMs: 0},
		{Op: OpAcquire, Now: math.MinInt64, Key: long, Owner: longOwner, Ref: math.MaxUint64, LeaseSec: math.MaxUint32, WaitMs: math.MaxUint32},
		{Op: OpAcquire, Now: -1, Key: "", Owner: "", Ref: 0, LeaseSec: 0, WaitMs: MaxWaitMs},
		{Op: OpRelease, Now: math.MaxInt64, Key: "k", Owner: "a", Token: 1},
		{Op: OpRelease, Now: 0, Key: long, Owner: longOwner, Token: math.MaxUint64},
		{Op: OpExpire, Now: 42, Key: "k", Token: 7},
		{Op: OpExpire, Now: -42, Key: "!~", Token: 0},
		{Op: OpCancelWait, Key: "k", Ref: 99},
		{Op: OpCancelWait, Key: long, Ref: math.MaxUint64},
		{Op: OpDropWaiters},
		{Op: OpAcquireBlock, Now: 5, Keys: []string{"s2", "s1"}, Owner: "a", Ref: 3, LeaseSec: 10, WaitMs: 100},
		{Op: OpAcquireBlock, Now: math.MinInt64, Keys: slices.Repeat([]string{long}, MaxBlockKeys), Owner: longOwner,
			Ref: math.MaxUint64, LeaseSec: math.MaxUint32, WaitMs: math.MaxUint32},
		{Op: OpAcquireBlock, Now: -1, Keys: []string{""}, Owner: "", LeaseSec: 0},
		{Op: OpExtend, Now: 1_700_000_000_000, Key: "k", Owner: "a", Token: 7, Ref: 3, LeaseSec: 30},
		{Op: OpExtend, Now: math.MinInt64, Key: long, Owner: longOwner, Token: math.MaxUint64, Ref: math.MaxUint64, LeaseSec: math.MaxUint32},
		{Op: OpExtend, Now: -1, Key: "", Owner: "", Token: 0, LeaseSec: 0},
		// Lock commands of a session (the session flag) and ops 8..12.
		{Op: OpAcquire, Now: 1_700_000_000_000, Key: "k", Owner: "a", Ref: 1, LeaseSec: 10, WaitMs: 2000, Session: 7, Seq: 1},
		{Op: OpRelease, Now: 3, Key: "k", Owner: "a", Token: 1, Ref: 2, Session: math.MaxUint64, Seq: math.MaxUint64, Ack: math.MaxUint64},
		{Op: OpAcquireBlock, Now: 5, Keys: []string{"s2", "s1"}, Owner: "a", Ref: 3, LeaseSec: 10, WaitMs: 100, Session: 1, Seq: 0, Ack: 9},
		{Op: OpExtend, Now: 6, Key: "k", Owner: "a", Token: 7, Ref: 3, LeaseSec: 30, Session: 1 << 63, Seq: 300, Ack: 299},
		{Op: OpOpenSession, Now: 1_700_000_000_000, Session: 0x9e3779b97f4a7c15, SecretHash: strings.Repeat("\xff", SecretHashLen), TimeoutMs: 10_000},
		{Op: OpOpenSession, Now: math.MinInt64, Session: 0, SecretHash: "", TimeoutMs: math.MaxUint32},
		{Op: OpResumeSession, Session: 7, Seq: 12, Ack: 3, Epoch: 1},
		{Op: OpResumeSession, Session: math.MaxUint64, Seq: math.MaxUint64, Ack: math.MaxUint64, Epoch: math.MaxUint64},
		{Op: OpExpireSession, Now: 9, Session: 7, Epoch: 2, Tokens: []uint64{1, math.MaxUint64, 1}},
		{Op: OpExpireSession, Now: -9, Session: 0, Epoch: 0},
		{Op: OpCloseSession, Now: 10, Session: 7},
		{Op: OpDropSessionless},
		// Semaphores (ops 14 and 15).
		{Op: OpAcquirePermit, Now: 11, Key: "s", Owner: "a", Ref: 4, LeaseSec: 10, WaitMs: MaxWaitMs},
		{Op: OpAcquirePermit, Now: 12, Key: "s", Owner: "a", Ref: 5, LeaseSec: 10, Label: "job", Session: 7, Seq: 2, Ack: 1},
		{Op: OpSetPermits, Now: 13, Key: "s", Permits: MaxPermits},
		{Op: OpSetPermits, Now: math.MinInt64, Key: long, Permits: math.MaxUint32},
		{Op: OpSetPermits, Now: 0, Key: "s", Permits: 0},
		// Revokes (op 16).
		{Op: OpRevoke, Now: 14, Key: "k", Owner: "ops", Token: 7, Ref: 6, Reason: "stuck since the deploy, OPS-123"},
		{Op: OpRevoke, Now: math.MinInt64, Key: long, Owner: longOwner, Token: math.MaxUint64, Ref: math.MaxUint64, Reason: strings.Repeat("r", MaxReasonLen)},
		{Op: OpRevoke, Now: -1, Key: "", Owner: "", Token: 0, Reason: ""},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	cmds := sampleCommands()
	b := AppendBatch([]byte("prefix"), cmds)
	if !bytes.HasPrefix(b, []byte("prefix")) {
		t.Fatal("AppendBatch clobbered dst")
	}
	b = b[len("prefix"):]
	into := []Command{{Op: OpDropWaiters}}
	got, err := DecodeBatch(b, into)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cmds)+1 || !reflect.DeepEqual(got[0], into[0]) {
		t.Fatalf("into not extended: %d commands", len(got))
	}
	for i, c := range cmds {
		if !reflect.DeepEqual(got[i+1], c) {
			t.Errorf("command %d: got %+v want %+v", i, got[i+1], c)
		}
	}
	if re := AppendBatch(nil, got[1:]); !bytes.Equal(re, b) {
		t.Fatalf("re-encoding differs")
	}
	// An empty batch is legal (and useless).
	if got, err := DecodeBatch(AppendBatch(nil, nil), nil); err != nil || len(got) != 0 {
		t.Fatalf("empty batch: %v %v", got, err)
	}
}

func TestCodecCompact(t *testing.T) {
	// A typical acquire: op, 6-byte now, 1+8 key, 1+8 owner, 3-byte ref, lease, wait.
	b := AppendBatch(nil, []Command{{Op: OpAcquire, Now: 1_700_000_000_000, Key: "event-42", Owner: "web-0001",
		Ref: 100_000, LeaseSec: 30, WaitMs: 2000}})
	if len(b) > 2+1+6+9+9+3+1+2 {
		t.Fatalf("acquire takes %d bytes", len(b))
	}
	// An extend: op, 6-byte now, 1+8 key, 1+8 owner, 3-byte token, 3-byte
	// ref (the leader's match for the reply it owes), lease; no wait.
	b = AppendBatch(nil, []Command{{Op: OpExtend, Now: 1_700_000_000_000, Key: "event-42", Owner: "web-0001",
		Token: 100_000, LeaseSec: 30, Ref: 100_000, WaitMs: 2000}})
	if len(b) != 2+1+6+9+9+3+3+1 {
		t.Fatalf("extend takes %d bytes", len(b))
	}
	if b := AppendBatch(nil, []Command{{Op: OpDropWaiters, Now: 5, Key: "ignored"}}); len(b) != 3 {
		t.Fatalf("drop-waiters takes %d bytes, want 3", len(b))
	}
	// A session costs its three fields: the flag rides in the op byte.
	acq := Command{Op: OpAcquire, Now: 1_700_000_000_000, Key: "event-42", Owner: "web-0001", Ref: 100_000, LeaseSec: 30, WaitMs: 2000}
	plain := AppendBatch(nil, []Command{acq})
	acq.Session, acq.Seq, acq.Ack = 1<<63, 100_000, 99_990
	if b := AppendBatch(nil, []Command{acq}); len(b) != len(plain)+10+3+3 {
		t.Fatalf("acquire of a session takes %d bytes, %d without", len(b), len(plain))
	}
}

// Entries without session content are byte for byte what nodes before
// sessions wrote (they must decode them, and those nodes these): the
// session fields of a command without a session are not carried, the
// batch version stays 1, and the bytes below are pinned.
func TestCodecSessionlessUnchanged(t *testing.T) {
	cmds := []Command{
		{Op: OpAcquire, Now: 1000, Key: "k", Owner: "a", Ref: 1, LeaseSec: 10, WaitMs: 5},
		{Op: OpRelease, Now: 1001, Key: "k", Owner: "a", Token: 2, Ref: 3},
		{Op: OpExtend, Now: 1002, Key: "k", Owner: "a", Token: 2, Ref: 4, LeaseSec: 20},
		{Op: OpAcquireBlock, Now: 1003, Keys: []string{"x", "y"}, Owner: "a", Ref: 5, LeaseSec: 10, WaitMs: 5},
		{Op: OpExpire, Now: 1004, Key: "k", Token: 2},
		{Op: OpCancelWait, Key: "k", Ref: 1},
		{Op: OpDropWaiters},
	}
	want := cat([]byte{1, 7},
		[]byte{1}, uv(2000), []byte{1, 'k', 1, 'a'}, uv(1), uv(10), uv(5),
		[]byte{2}, uv(2002), []byte{1, 'k', 1, 'a'}, uv(2), uv(3),
		[]byte{7}, uv(2004), []byte{1, 'k', 1, 'a'}, uv(2), uv(4), uv(20),
		[]byte{6}, uv(2006), uv(2), []byte{1, 'x', 1, 'y', 1, 'a'}, uv(5), uv(10), uv(5),
		[]byte{3}, uv(2008), []byte{1, 'k'}, uv(2),
		[]byte{4}, []byte{1, 'k'}, uv(1),
		[]byte{5})
	if got := AppendBatch(nil, cmds); !bytes.Equal(got, want) {
		t.Fatalf("encoding changed:\n%x\n%x", got, want)
	}
	// Session-only fields on a command without a session (or on an op that
	// takes none) are not carried.
	for i := range cmds {
		cmds[i].Seq, cmds[i].Ack, cmds[i].Epoch, cmds[i].TimeoutMs = 5, 6, 7, 8
		cmds[i].SecretHash, cmds[i].Tokens = "h", []uint64{1}
		if cmds[i].Op == OpExpire || cmds[i].Op == OpCancelWait || cmds[i].Op == OpDropWaiters {
			cmds[i].Session = 9
		}
	}
	if got := AppendBatch(nil, cmds); !bytes.Equal(got, want) {
		t.Fatalf("session fields carried without a session:\n%x\n%x", got, want)
	}
}

func TestCodecQuick(t *testing.T) {
	f := func(op uint8, now int64, key, owner string, token, ref uint64, lease, wait uint32) bool {
		c := Command{Op: Op(op%uint8(maxOp) + 1), Now: now, Key: key, Owner: owner, Token: token, Ref: ref, LeaseSec: lease, WaitMs: wait, Permits: wait}
		if c.Op == OpAcquireBlock {
			c.Keys = []string{key, owner, key + "x"}
		}
		if op&0x80 != 0 { // a session, on any op
			c.Session, c.Seq, c.Ack, c.Epoch, c.TimeoutMs = ref|1, token, ref>>1, token>>3, wait
			c.SecretHash, c.Tokens = owner, []uint64{token, ref}
		}
		b := AppendBatch(nil, []Command{c, c})
		got, err := DecodeBatch(b, nil)
		return err == nil && len(got) == 2 && reflect.DeepEqual(got[0], normalize(c)) && reflect.DeepEqual(got[1], got[0]) &&
			bytes.Equal(AppendBatch(nil, got), b)
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 2000}); err != nil {
		t.Fatal(err)
	}
}

// An over-long string is encoded as empty: Apply must reject the decoded
// command exactly as it would have rejected the original.
func TestAppendBatchOverlongStrings(t *testing.T) {
	s := New()
	if res, _ := s.Apply(Command{Op: OpAcquire, Key: "k", Owner: "a", LeaseSec: 1}, nil); res.Status != StatusGranted {
		t.Fatal(res)
	}
	long := strings.Repeat("x", 300)
	for _, c := range []Command{
		{Op: OpAcquire, Key: long, Owner: "a", LeaseSec: 1},
		{Op: OpAcquire, Key: "k", Owner: long, LeaseSec: 1},
		{Op: OpAcquire, Key: long, Owner: long, LeaseSec: 0},
		{Op: OpRelease, Key: "k", Owner: long, Token: 1},
		{Op: OpExpire, Key: long, Token: 1},
		{Op: OpCancelWait, Key: long, Ref: 1},
		{Op: OpAcquireBlock, Keys: []string{"k", long}, Owner: "a", LeaseSec: 1},
		{Op: OpAcquireBlock, Keys: []string{long, long}, Owner: "a", LeaseSec: 1},
		{Op: OpAcquireBlock, Keys: []string{"j", "i"}, Owner: long, LeaseSec: 1},
		{Op: OpAcquireBlock, Keys: slices.Repeat([]string{"k"}, MaxBlockKeys+1), Owner: "a", LeaseSec: 1},
		{Op: OpExtend, Key: long, Owner: "a", Token: 1, LeaseSec: 1},
		{Op: OpExtend, Key: "k", Owner: long, Token: 1, LeaseSec: 1},
		{Op: OpExtend, Key: long, Owner: long, Token: 1, LeaseSec: 0},
		{Op: OpOpenSession, Session: 7, SecretHash: strings.Repeat("h", SecretHashLen+1), TimeoutMs: MinSessionTimeoutMs},
		{Op: OpAcquire, Key: long, Owner: "a", LeaseSec: 1, Session: 99, Seq: 1},
		{Op: OpRevoke, Key: long, Owner: "ops", Token: 1, Reason: long},
		{Op: OpRevoke, Key: "k", Owner: long, Token: 1},
		{Op: OpRevoke, Key: "k", Owner: "ops", Token: 1, Reason: long},
	} {
		dec, err := DecodeBatch(AppendBatch(nil, []Command{c}), nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := s.Apply(c, nil)
		got, _ := s.Apply(dec[0], nil)
		if want.Status != StatusRejected || got != want {
			t.Errorf("%v: original %+v, decoded %+v", c.Op, want, got)
		}
	}
}

func uv(v uint64) []byte { return binary.AppendUvarint(nil, v) }

func cat(parts ...[]byte) []byte { return slices.Concat(parts...) }

func TestDecodeBatchRejects(t *testing.T) {
	valid := AppendBatch(nil, sampleCommands())
	acquireWith := func(key, owner []byte, lease []byte) []byte {
		return cat([]byte{1, 1, byte(OpAcquire)}, uv(0), uv(uint64(len(key))), key,
			uv(uint64(len(owner))), owner, uv(1), lease, uv(0))
	}
	drops := func(n int) []byte { return bytes.Repeat([]byte{byte(OpDropWaiters)}, n) }
	cases := map[string][]byte{
		"empty":             {},
		"version 0":         {0, 0},
		"version 2":         {2, 0},
		"no count":          {1},
		"count over max":    cat([]byte{1}, uv(MaxBatch+1), drops(MaxBatch+1)),
		"count over bytes":  cat([]byte{1}, uv(3), drops(2)),
		"huge count":        cat([]byte{1}, uv(math.MaxUint64), drops(4)),
		"count 2^32":        cat([]byte{1}, uv(1<<32), drops(4)),
		"count 2^32-1":      cat([]byte{1}, uv(1<<32-1), drops(4)),
		"string len 2^32":   cat([]byte{1, 1, byte(OpCancelWait)}, uv(1<<32), []byte("k")),
		"trailing byte":     cat(valid, []byte{0}),
		"op 0":              {1, 1, 0},
		"op 6 truncated":    {1, 1, 6},
		"op 7 truncated":    {1, 1, 7},
		"op 7 no lease":     cat([]byte{1, 1, byte(OpExtend)}, uv(0), []byte{1, 'k', 1, 'a'}, uv(1), uv(2)),
		"op 7 lease > 2^32": cat([]byte{1, 1, byte(OpExtend)}, uv(0), []byte{1, 'k', 1, 'a'}, uv(1), uv(2), uv(math.MaxUint32+1)),
		"op 7 wait carried": cat([]byte{1, 1, byte(OpExtend)}, uv(0), []byte{1, 'k', 1, 'a'}, uv(1), uv(2), uv(10), uv(0)),
		"op 7 owner too long": cat([]byte{1, 1, byte(OpExtend)}, uv(0), []byte{1, 'k'}, uv(MaxOwnerLen+1),
			bytes.Repeat([]byte("o"), MaxOwnerLen+1), uv(1), uv(2), uv(10)),
		"op 8 truncated":      {1, 1, 8},
		"op 12 + trailing":    {1, 1, 12, 0},
		"op 13":               {1, 1, 13},
		"op 127":              {1, 1, 127},
		"flag on op 0":        cat([]byte{1, 1, 0x80}, uv(1), uv(1), uv(0)),
		"flag on expire":      cat([]byte{1, 1, 0x80 | byte(OpExpire)}, uv(1), uv(1), uv(0), uv(0), []byte{1, 'k'}, uv(1)),
		"flag on cancel":      cat([]byte{1, 1, 0x80 | byte(OpCancelWait)}, uv(1), uv(1), uv(0), []byte{1, 'k'}, uv(1)),
		"flag on drop":        cat([]byte{1, 1, 0x80 | byte(OpDropWaiters)}, uv(1), uv(1), uv(0)),
		"flag on open":        cat([]byte{1, 1, 0x80 | byte(OpOpenSession)}, uv(1), uv(1), uv(0), uv(0), uv(1), uv(0), uv(2000)),
		"flag on op 13":       cat([]byte{1, 1, 0x80 | 13}, uv(1), uv(1), uv(0)),
		"flag, session 0":     cat([]byte{1, 1, 0x80 | byte(OpCancelWait)}, uv(0), uv(1), uv(0), []byte{1, 'k'}, uv(1)),
		"flag acquire sess 0": cat([]byte{1, 1, 0x80 | byte(OpAcquire)}, uv(0), uv(1), uv(0), uv(0), []byte{1, 'k', 1, 'a'}, uv(1), uv(10), uv(0)),
		"flag truncated":      {1, 1, 0x80 | byte(OpAcquire), 7},
		"hash of 33 bytes":    cat([]byte{1, 1, byte(OpOpenSession)}, uv(0), uv(7), uv(33), bytes.Repeat([]byte("h"), 33), uv(2000)),
		"timeout > 2^32":      cat([]byte{1, 1, byte(OpOpenSession)}, uv(0), uv(7), uv(0), uv(math.MaxUint32+1)),
		"resume truncated":    cat([]byte{1, 1, byte(OpResumeSession)}, uv(7), uv(1), uv(0)),
		"tokens over bytes":   cat([]byte{1, 1, byte(OpExpireSession)}, uv(0), uv(7), uv(0), uv(3), uv(1), uv(2)),
		"tokens 2^62":         cat([]byte{1, 1, byte(OpExpireSession)}, uv(0), uv(7), uv(0), uv(1<<62), uv(1)),
		"token truncated":     cat([]byte{1, 1, byte(OpExpireSession)}, uv(0), uv(7), uv(0), uv(2), uv(1), []byte{0x80}),
		"close trailing":      cat([]byte{1, 1, byte(OpCloseSession)}, uv(0), uv(7), uv(0)),
		"block of 17 keys":    cat([]byte{1, 1, byte(OpAcquireBlock)}, uv(0), uv(MaxBlockKeys+1), bytes.Repeat([]byte{1, 'k'}, 17), []byte{1, 'a', 1, 1, 0}),
		"block key too long":  cat([]byte{1, 1, byte(OpAcquireBlock)}, uv(0), uv(2), uv(MaxKeyLen+1), bytes.Repeat([]byte("k"), MaxKeyLen+1), []byte{1, 'k', 1, 'a', 1, 1, 0}),
		"op 255":              {1, 1, 255},
		"op 16 truncated":     cat([]byte{1, 1, byte(OpRevoke)}, uv(0), []byte{1, 'k', 1, 'o'}, uv(1), uv(2)),
		"op 16 reason 129":    cat([]byte{1, 1, byte(OpRevoke)}, uv(0), []byte{1, 'k', 1, 'o'}, uv(1), uv(2), uv(MaxReasonLen+1), bytes.Repeat([]byte("r"), MaxReasonLen+1)),
		"op 16 trailing":      cat([]byte{1, 1, byte(OpRevoke)}, uv(0), []byte{1, 'k', 1, 'o'}, uv(1), uv(2), uv(0), []byte{0}),
		"flag on op 16":       cat([]byte{1, 1, 0x80 | byte(OpRevoke)}, uv(1), uv(1), uv(0), uv(0), []byte{1, 'k', 1, 'o'}, uv(1), uv(2), uv(0)),
		"label flag on op 16": cat([]byte{1, 1, 0x40 | byte(OpRevoke)}, []byte{1, 'l'}, uv(0), []byte{1, 'k', 1, 'o'}, uv(1), uv(2), uv(0)),
		"op 17":               cat([]byte{1, 1, 17}, uv(0), []byte{1, 'k', 1, 'o'}, uv(1), uv(2), uv(0)),
		"key too long":        acquireWith(bytes.Repeat([]byte("k"), MaxKeyLen+1), []byte("a"), uv(1)),
		"owner too long":      acquireWith([]byte("k"), bytes.Repeat([]byte("o"), MaxOwnerLen+1), uv(1)),
		"lease over uint32":   acquireWith([]byte("k"), []byte("a"), uv(math.MaxUint32+1)),
		"non-minimal count":   {1, 0x81, 0x00, 5},
		"non-minimal lease":   acquireWith([]byte("k"), []byte("a"), []byte{0x81, 0x00}),
		"varint overflow":     cat([]byte{1, 1, byte(OpExpire)}, uv(0), uv(1), []byte("k"), bytes.Repeat([]byte{0xff}, 10), []byte{1}),
		"string past end":     cat([]byte{1, 1, byte(OpCancelWait)}, uv(10), []byte("k")),
		"second cmd corrupt":  cat([]byte{1, 2, byte(OpDropWaiters), 9}),
	}
	for name, b := range cases {
		into := []Command{{Op: OpExpire, Key: "keep"}}
		got, err := DecodeBatch(b, into)
		if !errors.Is(err, ErrCorruptCommand) {
			t.Errorf("%s: err %v", name, err)
		}
		if len(got) != 1 || !reflect.DeepEqual(got[0], into[0]) {
			t.Errorf("%s: into changed: %+v", name, got)
		}
	}
	// The limits themselves are fine.
	if got, err := DecodeBatch(cat([]byte{1}, uv(MaxBatch), drops(MaxBatch)), nil); err != nil || len(got) != MaxBatch {
		t.Fatalf("MaxBatch commands: %d, %v", len(got), err)
	}
	// Every strict prefix of a valid entry is truncated.
	for n := range len(valid) {
		if _, err := DecodeBatch(valid[:n], nil); !errors.Is(err, ErrCorruptCommand) {
			t.Fatalf("prefix of %d bytes: %v", n, err)
		}
	}
}

// A lying count must not buy a large allocation: the count is checked
// against the bytes present before anything is reserved.
func TestDecodeBatchAllocation(t *testing.T) {
	b := cat([]byte{1}, uv(MaxBatch), []byte{byte(OpDropWaiters)})
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := DecodeBatch(b, nil); err == nil {
			t.Fatal("accepted")
		}
	})
	if allocs > 4 { // the error value only
		t.Fatalf("%v allocations for a 4-byte entry", allocs)
	}
}

func TestValidate(t *testing.T) {
	for _, k := range []string{"k", "!", "~", strings.Repeat("a", MaxKeyLen), "a:b/c-d_e.f"} {
		if err := ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q) = %v", k, err)
		}
	}
	for _, k := range []string{"", " ", "a b", "\x7f", "\x00", "é", strings.Repeat("a", MaxKeyLen+1)} {
		if err := ValidateKey(k); err != ErrInvalidKey {
			t.Errorf("ValidateKey(%q) = %v", k, err)
		}
	}
	if err := ValidateOwner(strings.Repeat("o", MaxOwnerLen)); err != nil {
		t.Error(err)
	}
	for _, o := range []string{"", "o\n", strings.Repeat("o", MaxOwnerLen+1)} {
		if err := ValidateOwner(o); err != ErrInvalidOwner {
			t.Errorf("ValidateOwner(%q) = %v", o, err)
		}
	}
	for _, r := range []string{"", "x", "stuck since 14:02, OPS-123", "a  b", "~!\"\\", strings.Repeat("r", MaxReasonLen)} {
		if err := ValidateReason(r); err != nil {
			t.Errorf("ValidateReason(%q) = %v", r, err)
		}
	}
	for _, r := range []string{" ", " a", "a ", "a\nb", "a\rb", "a\tb", "\x1b[31m", "\x7f", "é", "\x00",
		strings.Repeat("r", MaxReasonLen+1)} {
		if err := ValidateReason(r); err != ErrInvalidReason {
			t.Errorf("ValidateReason(%q) = %v", r, err)
		}
	}
}

// An op 16 entry is pinned: it is the one a node must decode to apply a
// revoke, and the one an older node (whose ops end at 15) rejects as an
// unknown op, which is why the cluster proposes it only once every member
// knows it. Entries without op 16 are unchanged (TestCodecSessionlessUnchanged).
func TestCodecRevoke(t *testing.T) {
	c := Command{Op: OpRevoke, Now: 1000, Key: "k", Owner: "ops", Token: 7, Ref: 9, Reason: "stuck"}
	want := cat([]byte{1, 1, 16}, uv(2000), []byte{1, 'k', 3, 'o', 'p', 's'}, uv(7), uv(9), []byte{5, 's', 't', 'u', 'c', 'k'})
	if got := AppendBatch(nil, []Command{c}); !bytes.Equal(got, want) {
		t.Fatalf("encoding:\n%x\n%x", got, want)
	}
	// Fields a revoke does not use are not carried: no session, no
	// label, lease or wait. Its ref is carried: the leader matches the
	// applied revoke to the admin request that owes a reply by it, as
	// for a set-permits.
	c2 := c
	c2.Session, c2.Seq, c2.Ack, c2.Label, c2.LeaseSec, c2.WaitMs, c2.Permits = 1, 2, 3, "l", 5, 6, 7
	if got := AppendBatch(nil, []Command{c2}); !bytes.Equal(got, want) {
		t.Fatalf("unused fields carried:\n%x\n%x", got, want)
	}
	if got, err := DecodeBatch(want, nil); err != nil || len(got) != 1 || !reflect.DeepEqual(got[0], c) {
		t.Fatalf("decoded %+v, %v", got, err)
	}
}

// allocatedBy returns the bytes the heap allocated while fn ran. It reads
// runtime/metrics, which does not stop the world, so fuzz targets can
// afford it on every input. The figure is coarse: it counts whole spans as
// they are handed to a P, and it counts what other goroutines of the
// process allocate meanwhile (the fuzzing machinery does, now and then), so
// a check should only fail if fn is over its bound on several runs; see
// checkAllocBound. It never misses a large allocation by fn itself.
func allocatedBy(fn func()) uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	before := s[0].Value.Uint64()
	fn()
	metrics.Read(s)
	if after := s[0].Value.Uint64(); after > before {
		return after - before
	}
	return 0
}

// checkAllocBound fails t if fn allocates more than limit bytes on each of
// four runs (so fn must be repeatable). An allocation sized by a lying
// length field happens every time; noise from elsewhere does not.
func checkAllocBound(t testing.TB, limit uint64, what string, fn func()) {
	t.Helper()
	var n uint64
	for range 4 {
		if n = allocatedBy(fn); n <= limit {
			return
		}
	}
	t.Fatalf("%s: %d bytes allocated, bound %d", what, n, limit)
}

// FuzzDecodeBatch: seeds in testdata/fuzz/FuzzDecodeBatch (a valid batch of
// each op, the limits, lying counts and lengths, known-bad shapes) besides
// the ones added here.
func FuzzDecodeBatch(f *testing.F) {
	f.Add(AppendBatch(nil, sampleCommands()))
	f.Add(AppendBatch(nil, nil))
	for _, c := range sampleCommands() {
		f.Add(AppendBatch(nil, []Command{c}))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 2, 5, 5})
	f.Add([]byte{1, 0x81, 0x00})
	f.Add([]byte{1, 1, 4, 1, 'k', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		var cmds []Command
		var err error
		// A count or length field must not buy memory the input does
		// not back: every command takes at least one byte, every string
		// byte one byte.
		checkAllocBound(t, 64<<10+256*uint64(len(b)), fmt.Sprintf("decoding %d bytes", len(b)),
			func() { cmds, err = DecodeBatch(b, nil) })
		if err != nil {
			if !errors.Is(err, ErrCorruptCommand) {
				t.Fatalf("error does not wrap ErrCorruptCommand: %v", err)
			}
			return
		}
		// Encodings are canonical: whatever is accepted re-encodes to
		// the same bytes.
		if re := AppendBatch(nil, cmds); !bytes.Equal(re, b) {
			t.Fatalf("round trip:\n%x\n%x", b, re)
		}
		s := New()
		for _, c := range cmds {
			s.Apply(c, nil)
		}
		if err := checkInvariants(s); err != nil {
			t.Fatal(err)
		}
	})
}
