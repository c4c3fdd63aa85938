package locksm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"
	"unsafe"
)

// The label alphabet is the key alphabet; empty is no label; 64 bytes at
// most.
func TestValidateLabel(t *testing.T) {
	for _, l := range []string{"", "a", "job-1", "req/7f3a:x", strings.Repeat("l", MaxLabelLen), "!~"} {
		if err := ValidateLabel(l); err != nil {
			t.Errorf("ValidateLabel(%q) = %v", l, err)
		}
	}
	for _, l := range []string{" ", "a b", "a\tb", "\x00", "\x7f", "é", strings.Repeat("l", MaxLabelLen+1)} {
		if err := ValidateLabel(l); err != ErrInvalidLabel {
			t.Errorf("ValidateLabel(%q) = %v, want ErrInvalidLabel", l, err)
		}
		for _, c := range []Command{
			{Op: OpAcquire, Key: "k", Owner: "o", LeaseSec: 1, Label: l},
			{Op: OpAcquireBlock, Keys: []string{"a", "b"}, Owner: "o", LeaseSec: 1, Label: l},
		} {
			if err := ValidateCommand(c); !errors.Is(err, ErrInvalidLabel) {
				t.Errorf("ValidateCommand(%v, label %q) = %v", c.Op, l, err)
			}
			// Whatever slips past ValidateCommand is rejected by
			// Apply after the codec, on every replica alike.
			dec, err := DecodeBatch(AppendBatch(nil, []Command{c}), nil)
			if err != nil {
				t.Fatalf("label %q: %v", l, err)
			}
			if res, _ := New().Apply(dec[0], nil); res.Err != ErrInvalidLabel {
				t.Errorf("label %q after the codec: %+v", l, res)
			}
		}
	}
}

// An acquire without a label is byte for byte what a node before labels
// wrote (no flag, no field), so older nodes keep reading every entry that
// carries none; a labelled one sets the flag and carries the label after
// the session fields.
func TestCodecLabels(t *testing.T) {
	plain := Command{Op: OpAcquire, Now: 5, Key: "k", Owner: "o", Ref: 3, LeaseSec: 10, WaitMs: 7}
	want := []byte{1, 1, byte(OpAcquire), 10, 1, 'k', 1, 'o', 3, 10, 7}
	if got := AppendBatch(nil, []Command{plain}); !bytes.Equal(got, want) {
		t.Fatalf("unlabelled acquire: % x, want % x", got, want)
	}
	labelled := plain
	labelled.Label = "job"
	want = []byte{1, 1, byte(OpAcquire) | labelFlag, 3, 'j', 'o', 'b', 10, 1, 'k', 1, 'o', 3, 10, 7}
	if got := AppendBatch(nil, []Command{labelled}); !bytes.Equal(got, want) {
		t.Fatalf("labelled acquire: % x, want % x", got, want)
	}
	sess := labelled
	sess.Session, sess.Seq, sess.Ack = 9, 2, 1
	want = []byte{1, 1, byte(OpAcquire) | labelFlag | sessionFlag, 9, 2, 1, 3, 'j', 'o', 'b', 10, 1, 'k', 1, 'o', 3, 10, 7}
	if got := AppendBatch(nil, []Command{sess}); !bytes.Equal(got, want) {
		t.Fatalf("labelled session acquire: % x, want % x", got, want)
	}
	block := Command{Op: OpAcquireBlock, Keys: []string{"a", "b"}, Owner: "o", LeaseSec: 1, Label: "seats"}
	for _, c := range []Command{labelled, sess, block} {
		dec, err := DecodeBatch(AppendBatch(nil, []Command{c}), nil)
		if err != nil || len(dec) != 1 || dec[0].Label != c.Label || dec[0].Session != c.Session {
			t.Errorf("%+v: decoded %+v, %v", c, dec, err)
		}
	}
	// Corrupt: the flag on an op that carries no label, or with an empty
	// label (an unlabelled acquire has exactly one encoding: no flag).
	for name, b := range map[string][]byte{
		"release":     {1, 1, byte(OpRelease) | labelFlag, 1, 'x', 0, 1, 'k', 1, 'o', 1, 0},
		"extend":      {1, 1, byte(OpExtend) | labelFlag, 1, 'x', 0, 1, 'k', 1, 'o', 1, 0, 1},
		"empty label": {1, 1, byte(OpAcquire) | labelFlag, 0, 10, 1, 'k', 1, 'o', 3, 10, 7},
		"long label":  append(append([]byte{1, 1, byte(OpAcquire) | labelFlag, MaxLabelLen + 1}, bytes.Repeat([]byte{'l'}, MaxLabelLen+1)...), 10, 1, 'k', 1, 'o', 3, 10, 7),
	} {
		if _, err := DecodeBatch(b, nil); !errors.Is(err, ErrCorruptCommand) {
			t.Errorf("%s: %v, want ErrCorruptCommand", name, err)
		}
	}
}

// Snapshots: version 5 exactly while a holder or a waiter has a label;
// back to the lower version once the last label is gone; labels survive
// the round trip (checkSnapshotRoundTrip compares the tables).
func TestSnapshotVersionFollowsLabels(t *testing.T) {
	s := New()
	version := func() byte { return snapshotBytes(t, s)[len(snapMagic)] }
	apply := func(c Command) {
		t.Helper()
		if res, _ := s.Apply(c, nil); res.Status == StatusRejected {
			t.Fatalf("%+v: %v", c, res.Err)
		}
	}
	apply(Command{Op: OpAcquire, Key: "k", Owner: "a", LeaseSec: 1})
	if v := version(); v != snapV1 {
		t.Fatalf("no label: version %d", v)
	}
	apply(Command{Op: OpAcquire, Key: "k", Owner: "b", LeaseSec: 1, WaitMs: 100, Ref: 1, Label: "waiter"})
	if v := version(); v != snapV5 {
		t.Fatalf("a labelled waiter: version %d", v)
	}
	r := checkSnapshotRoundTrip(t, s)
	if w := r.Waiters("k"); len(w) != 1 || r.WaiterLabel("k", w[0]) != "waiter" {
		t.Fatalf("waiters after the round trip: %+v", w)
	}
	f := s.Freeze()
	apply(Command{Op: OpRelease, Key: "k", Owner: "a", Token: 1})
	if h, _ := s.Holder("k"); h.Label != "waiter" {
		t.Fatalf("hand-off: holder %+v", h)
	}
	var fb bytes.Buffer
	if err := f.WriteSnapshot(&fb); err != nil {
		t.Fatal(err)
	}
	fs, err := ReadSnapshot(&fb)
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := fs.Holder("k"); h.Label != "" || fs.WaiterLabel("k", fs.Waiters("k")[0]) != "waiter" {
		t.Fatalf("frozen view changed: %+v %+v", h, fs.Waiters("k"))
	}
	apply(Command{Op: OpAcquireBlock, Keys: []string{"b1", "b2"}, Owner: "a", LeaseSec: 1, Label: "seats"})
	r = checkSnapshotRoundTrip(t, s)
	if h, _ := r.Holder("b2"); h.Label != "seats" {
		t.Fatalf("block after the round trip: %+v", h)
	}
	apply(Command{Op: OpRelease, Key: "k", Owner: "b", Token: 2})
	apply(Command{Op: OpRelease, Key: "b1", Owner: "a", Token: 3})
	if v := version(); v != snapV2 && v != snapV1 {
		t.Fatalf("labels gone: version %d", v)
	}
	if s.NumLabelled() != 0 {
		t.Fatalf("labels left: %d", s.NumLabelled())
	}
}

// A label costs nothing to a waiter or holding without one: Waiter, which
// the queues hold, has no label field (it would be a string header for
// every waiter), and entry keeps its 64 bytes (TestEntrySize).
func TestWaiterSize(t *testing.T) {
	if n := unsafe.Sizeof(Waiter{}); n > 80 {
		t.Fatalf("Waiter is %d bytes, want at most 80 (the size before labels)", n)
	}
}

// ReadSnapshot refuses a label it could not have written: outside the
// constraints, or on some keys of a block only.
func TestReadSnapshotV5Invariants(t *testing.T) {
	s := New()
	s.Apply(Command{Op: OpAcquireBlock, Keys: []string{"a", "b"}, Owner: "o", LeaseSec: 1, Label: "LLLL"}, nil)
	good := snapshotBytes(t, s)
	if _, err := ReadSnapshot(bytes.NewReader(good)); err != nil {
		t.Fatal(err)
	}
	mutate := func(old, new string, n int) []byte {
		b := bytes.Replace(good[:len(good)-4], []byte(old), []byte(new), n)
		return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	}
	for name, b := range map[string][]byte{
		"space in label":   mutate("LLLL", "L LL", -1),
		"label on one key": mutate("\x04LLLL", "\x00", 1),
		"labels differ":    mutate("LLLL", "LLLM", 1),
	} {
		if _, err := ReadSnapshot(bytes.NewReader(b)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v, want ErrCorruptSnapshot", name, err)
		}
	}

	// A queued block carries its label in each of its queues: they must
	// agree, and a label on a waiter must be a label.
	q := New()
	q.Apply(Command{Op: OpAcquire, Key: "a", Owner: "o", LeaseSec: 1}, nil)
	q.Apply(Command{Op: OpAcquireBlock, Keys: []string{"a", "b"}, Owner: "p", LeaseSec: 1, WaitMs: 9, Ref: 3, Label: "WWWW"}, nil)
	good = snapshotBytes(t, q)
	r, err := ReadSnapshot(bytes.NewReader(good))
	if err != nil || r.WaiterLabel("b", r.Waiters("b")[0]) != "WWWW" {
		t.Fatalf("good block waiter snapshot: %v", err)
	}
	for name, b := range map[string][]byte{
		"queues differ":   mutate("WWWW", "WWWX", 1),
		"unlabelled once": mutate("\x04WWWW", "\x00", 1),
		"space in label":  mutate("WWWW", "W WW", -1),
	} {
		if _, err := ReadSnapshot(bytes.NewReader(b)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("block waiter, %s: %v, want ErrCorruptSnapshot", name, err)
		}
	}
}
