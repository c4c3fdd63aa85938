package locksm

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// applyOK applies c to s and fails the test unless its status is want.
func applyOK(t testing.TB, s *State, c Command, want Status) (Result, []Effect) {
	t.Helper()
	res, eff := s.Apply(c, nil)
	if res.Status != want {
		t.Fatalf("%+v: %+v, want status %d", c, res, want)
	}
	return res, eff
}

// TestRevokeRecordsBound fills the audit records past MaxRevokeRecords:
// the records of the keys revoked longest ago go first (a FIFO by the log
// order of each key's latest revoke), a key revoked again moves to the
// end, a block's revoke may evict several at once, and the table at the
// bound survives a snapshot round trip and a Frozen view unchanged.
func TestRevokeRecordsBound(t *testing.T) {
	s := New()
	now := int64(1000)
	revoke := func(key string) {
		t.Helper()
		now++
		res, _ := applyOK(t, s, Command{Op: OpAcquire, Key: key, Owner: "o", LeaseSec: 10, Now: now}, StatusGranted)
		applyOK(t, s, Command{Op: OpRevoke, Key: key, Owner: "ops", Token: res.Token, Reason: "r " + key, Now: now}, StatusRevoked)
	}
	key := func(i int) string { return fmt.Sprintf("k%05d", i) }
	for i := range MaxRevokeRecords {
		revoke(key(i))
	}
	if n := s.NumRevokes(); n != MaxRevokeRecords {
		t.Fatalf("%d records", n)
	}
	// k00000 revoked again: its record moves to the end, k00001 is now
	// the oldest.
	revoke(key(0))
	if s.NumRevokes() != MaxRevokeRecords || s.Revokes()[MaxRevokeRecords-1].Key != key(0) {
		t.Fatalf("re-revoke: %d records, last %q", s.NumRevokes(), s.Revokes()[MaxRevokeRecords-1].Key)
	}
	f := s.Freeze()
	frozen := snapshotBytes(t, s)
	// Three more keys evict the three oldest: k00001..k00003.
	for i := MaxRevokeRecords; i < MaxRevokeRecords+3; i++ {
		revoke(key(i))
	}
	for i := 1; i <= 3; i++ {
		if r, ok := s.LastRevoke(key(i)); ok {
			t.Fatalf("%s kept past the bound: %+v", key(i), r)
		}
	}
	if r, ok := s.LastRevoke(key(4)); !ok || r.Reason != "r "+key(4) {
		t.Fatalf("%s: %+v %v", key(4), r, ok)
	}
	if r, ok := s.LastRevoke(key(0)); !ok || r.At != 1000+MaxRevokeRecords+1 {
		t.Fatalf("%s: %+v %v", key(0), r, ok)
	}
	// A block of 4 keys: 4 records, the 4 oldest go (k00004..k00007).
	now++
	res, _ := applyOK(t, s, Command{Op: OpAcquireBlock, Keys: []string{"b1", "b2", "b3", "b4"}, Owner: "o", LeaseSec: 10, Now: now}, StatusGranted)
	applyOK(t, s, Command{Op: OpRevoke, Key: "b3", Owner: "ops", Token: res.Token, Now: now}, StatusRevoked)
	got := s.Revokes()
	if len(got) != MaxRevokeRecords || got[0].Key != key(8) {
		t.Fatalf("after a block: %d records, oldest %q", len(got), got[0].Key)
	}
	for i, k := range []string{"b1", "b2", "b3", "b4"} {
		r := got[MaxRevokeRecords-4+i]
		if r.Key != k || r.Token != res.Token || !slices.Equal(r.Keys, []string{"b1", "b2", "b3", "b4"}) {
			t.Fatalf("block record %d: %+v", i, r)
		}
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
	r := checkSnapshotRoundTrip(t, s)
	if !slices.EqualFunc(r.Revokes(), got, func(a, b Revoke) bool { return fmt.Sprint(a) == fmt.Sprint(b) }) {
		t.Fatal("records differ after a round trip")
	}
	// The restored block records share one slice, as Apply keeps them.
	rs := r.Revokes()
	if &rs[MaxRevokeRecords-4].Keys[0] != &rs[MaxRevokeRecords-1].Keys[0] {
		t.Fatal("restored block records do not share their keys")
	}
	var buf bytes.Buffer
	if err := f.WriteSnapshot(&buf); err != nil || !bytes.Equal(buf.Bytes(), frozen) {
		t.Fatalf("frozen view changed by later revokes: %v", err)
	}
}

// TestSnapshotVersionFollowsRevokes: a table without revoke records is
// written exactly as before (version 6 here, for its semaphore); with
// one, version 7 is version 6's body followed by the records.
func TestSnapshotVersionFollowsRevokes(t *testing.T) {
	s := New()
	applyOK(t, s, Command{Op: OpSetPermits, Key: "s", Permits: 2, Now: 1}, StatusPermitsSet)
	p, _ := applyOK(t, s, Command{Op: OpAcquirePermit, Key: "s", Owner: "o", LeaseSec: 10, Now: 2}, StatusGranted)
	applyOK(t, s, Command{Op: OpAcquire, Key: "k", Owner: "o", LeaseSec: 10, Now: 3}, StatusGranted)
	before := snapshotBytes(t, s)
	if before[len(snapMagic)] != snapV6 {
		t.Fatalf("version %d", before[len(snapMagic)])
	}
	// A rejected revoke records nothing: same bytes.
	applyOK(t, s, Command{Op: OpRevoke, Key: "s", Owner: "ops", Token: 99, Now: 4}, StatusRejected)
	if !bytes.Equal(snapshotBytes(t, s), before) {
		t.Fatal("a rejected revoke changed the snapshot")
	}
	applyOK(t, s, Command{Op: OpRevoke, Key: "s", Owner: "ops", Token: p.Token, Reason: "why", Now: 5}, StatusRevoked)
	v7 := snapshotBytes(t, s)
	if v7[len(snapMagic)] != snapV7 {
		t.Fatalf("with a record: version %d", v7[len(snapMagic)])
	}
	// The same table without its records: version 6, and its body is
	// the start of version 7's.
	r := checkSnapshotRoundTrip(t, s)
	r.revokes = nil
	v6 := snapshotBytes(t, r)
	if v6[len(snapMagic)] != snapV6 || !bytes.HasPrefix(v7[len(snapMagic)+1:], v6[len(snapMagic)+1:len(v6)-4]) {
		t.Fatalf("version 7 is not version 6's body and the records:\n%x\n%x", v6, v7)
	}
	// Without a semaphore and a record, the lowest version as before.
	s2 := New()
	applyOK(t, s2, Command{Op: OpAcquire, Key: "k", Owner: "o", LeaseSec: 10, Now: 1}, StatusGranted)
	applyOK(t, s2, Command{Op: OpRevoke, Key: "k", Owner: "ops", Token: 1, Now: 2}, StatusRevoked)
	if v := snapshotBytes(t, s2)[len(snapMagic)]; v != snapV7 {
		t.Fatalf("record only: version %d", v)
	}
}

// sampleSnapV7 is a version 7 snapshot of an empty table (last token 5)
// with the records recs appended (see rec).
func sampleSnapV7(recs ...func(*snapBuilder)) *snapBuilder {
	sb := &snapBuilder{b: []byte(snapMagic + "\x07")}
	sb.u(5).i(100).u(0) // last, clock, no keys
	sb.u(0).u(0).u(0)   // no semaphores, blocks, renewals
	sb.u(0)             // no sessions
	sb.u(uint64(len(recs)))
	for _, r := range recs {
		r(sb)
	}
	sb.u(0) // no session revokes
	return sb
}

// sampleSnapV7Records is a valid version 7 snapshot with a lock's, a
// permit's and a block's records.
func sampleSnapV7Records() *snapBuilder {
	return sampleSnapV7(recSession(9, "k", 1, "ops", "a reason", "o", "l", 0, 0),
		rec("s", 2, "ops", "", "o", "", 1, 99_999),
		rec("b1", 5, "ops", "", "o", "", 0, 0, "b1", "b2"), rec("b2", 5, "ops", "", "o", "", 0, 0, "b1", "b2"))
}

// rec is one revoke record: permit 0 or 1 (then slot), keys of a block;
// no session.
func rec(key string, token uint64, who, reason, owner, label string, permit byte, slot uint64, keys ...string) func(*snapBuilder) {
	return recSession(0, key, token, who, reason, owner, label, permit, slot, keys...)
}

// recSession is rec of a session's holding.
func recSession(session uint64, key string, token uint64, who, reason, owner, label string, permit byte, slot uint64, keys ...string) func(*snapBuilder) {
	return func(sb *snapBuilder) {
		sb.s(key).u(token).s(who).s(reason).i(77).s(owner).s(label).u(session)
		sb.b = append(sb.b, permit)
		if permit == 1 {
			sb.u(slot)
		}
		sb.u(uint64(len(keys)))
		for _, k := range keys {
			sb.s(k)
		}
	}
}

func TestReadSnapshotV7Invariants(t *testing.T) {
	good := sampleSnapV7Records()
	s, err := ReadSnapshot(bytes.NewReader(good.done()))
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := s.LastRevoke("s"); !ok || !r.Permit || r.Slot != 99_999 || r.At != 77 {
		t.Fatalf("%+v %v", r, ok)
	}
	if r, ok := s.LastRevoke("k"); !ok || r.Session != 9 {
		t.Fatalf("a session's record: %+v %v", r, ok)
	}
	if !bytes.Equal(snapshotBytes(t, s), good.done()) {
		t.Fatal("round trip")
	}
	many := make([]func(*snapBuilder), MaxRevokeRecords+1)
	for i := range many {
		many[i] = rec(fmt.Sprintf("k%d", i), 1, "ops", "", "o", "", 0, 0)
	}
	bad := map[string]*snapBuilder{
		"no records":       sampleSnapV7(),
		"over the bound":   sampleSnapV7(many...),
		"key twice":        sampleSnapV7(rec("k", 1, "ops", "", "o", "", 0, 0), rec("k", 2, "ops", "", "o", "", 0, 0)),
		"invalid key":      sampleSnapV7(rec("a b", 1, "ops", "", "o", "", 0, 0)),
		"token 0":          sampleSnapV7(rec("k", 0, "ops", "", "o", "", 0, 0)),
		"token above last": sampleSnapV7(rec("k", 6, "ops", "", "o", "", 0, 0)),
		"empty who":        sampleSnapV7(rec("k", 1, "", "", "o", "", 0, 0)),
		"reason newline":   sampleSnapV7(rec("k", 1, "ops", "a\nb", "o", "", 0, 0)),
		"reason space end": sampleSnapV7(rec("k", 1, "ops", "a ", "o", "", 0, 0)),
		"reason too long":  sampleSnapV7(rec("k", 1, "ops", strings.Repeat("r", MaxReasonLen+1), "o", "", 0, 0)),
		"empty owner":      sampleSnapV7(rec("k", 1, "ops", "", "", "", 0, 0)),
		"label with space": sampleSnapV7(rec("k", 1, "ops", "", "o", "a b", 0, 0)),
		"permit byte 2":    sampleSnapV7(rec("k", 1, "ops", "", "o", "", 2, 0)),
		"slot too high":    sampleSnapV7(rec("k", 1, "ops", "", "o", "", 1, MaxPermits)),
		"permit of block":  sampleSnapV7(rec("k", 1, "ops", "", "o", "", 1, 0, "k", "j")),
		"block without it": sampleSnapV7(rec("k", 1, "ops", "", "o", "", 0, 0, "i", "j")),
		"block of one":     sampleSnapV7(rec("k", 1, "ops", "", "o", "", 0, 0, "k")),
		"block twice":      sampleSnapV7(rec("k", 1, "ops", "", "o", "", 0, 0, "k", "k")),
	}
	for name, sb := range bad {
		if _, err := ReadSnapshot(bytes.NewReader(sb.done())); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A version 6 snapshot cannot carry records, and a version 7 one
	// must: the lowest version is the only encoding.
	sb := &snapBuilder{b: bytes.Clone(good.b)}
	sb.b[len(snapMagic)] = snapV6
	if _, err := ReadSnapshot(bytes.NewReader(sb.done())); !errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("version 6 with records: %v", err)
	}
	checkTruncatedAndFlipped(t, good.done())
}

// With no token left, a revoked holding cannot be handed on: as for a
// release, its waiters are dropped and the key is freed; the holder is
// still told first, and the record kept.
func TestRevokeTokensExhausted(t *testing.T) {
	b := newSnap(math.MaxUint64, 1).key("k", "o", math.MaxUint64, 10, 1).waiter("w", 1, 10, 10).done()
	s, err := ReadSnapshot(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	res, eff := s.Apply(Command{Op: OpRevoke, Key: "k", Owner: "ops", Token: math.MaxUint64, Now: 5}, nil)
	got := formatResult(res, eff)
	want := fmt.Sprintf("revoked token=%d\neffect revoked key=k owner=o ref=0 token=%d\neffect dropped key=k owner=w ref=1",
		uint64(math.MaxUint64), uint64(math.MaxUint64))
	if got != want {
		t.Fatalf("revoke:\n%s\nwant\n%s", got, want)
	}
	if err := checkInvariants(s); err != nil {
		t.Fatal(err)
	}
	if r, ok := s.LastRevoke("k"); !ok || r.Token != math.MaxUint64 || s.NumHeld() != 0 || s.NumWaiting() != 0 {
		t.Fatal(formatState(s))
	}
	checkSnapshotRoundTrip(t, s)
}

// The revokes of a session's holdings are kept for its broker (whatever
// later revokes of the same keys do to the audit records, and whatever
// time it is) until the broker acks an outcome recorded after them, or the
// session ends; snapshots carry them.
func TestSessionRevokesKeptForTheBroker(t *testing.T) {
	s := New()
	open := func(id uint64) {
		applyOK(t, s, Command{Op: OpOpenSession, Session: id, SecretHash: string(make([]byte, SecretHashLen)), TimeoutMs: 10_000, Now: 1}, StatusOpened)
	}
	open(7)
	open(8)
	applyOK(t, s, Command{Op: OpAcquire, Key: "k", Owner: "b", LeaseSec: 30, Session: 7, Seq: 1, Now: 1000}, StatusGranted) // token 1, serial 1
	applyOK(t, s, Command{Op: OpRevoke, Key: "k", Owner: "ops", Token: 1, Reason: "one", Now: 2000}, StatusRevoked)
	applyOK(t, s, Command{Op: OpAcquire, Key: "k", Owner: "c", LeaseSec: 10, Now: 3000}, StatusGranted) // token 2, no session
	applyOK(t, s, Command{Op: OpRevoke, Key: "k", Owner: "ops", Token: 2, Reason: "two", Now: 4000}, StatusRevoked)
	if r, _ := s.LastRevoke("k"); r.Token != 2 {
		t.Fatalf("the key's last revoke %+v", r)
	}
	want := SessionRevoke{Session: 7, Token: 1, Key: "k", Who: "ops", Reason: "one", AfterSerial: 1}
	if got := s.SessionRevokes(7); len(got) != 1 || got[0] != want {
		t.Fatalf("session 7's revokes after a later revoke of its key: %+v", got)
	}
	applyOK(t, s, Command{Op: OpAcquire, Key: "j", Owner: "d", LeaseSec: 5, Session: 8, Seq: 1, Now: 5000}, StatusGranted) // token 3
	applyOK(t, s, Command{Op: OpRevoke, Key: "j", Owner: "ops", Token: 3, Now: 6000}, StatusRevoked)
	r := checkSnapshotRoundTrip(t, s)
	if !reflect.DeepEqual(r.SessionRevokes(7), s.SessionRevokes(7)) || len(r.SessionRevokes(8)) != 1 {
		t.Fatalf("restored: %+v %+v", r.SessionRevokes(7), r.SessionRevokes(8))
	}
	// Time does not drop a note: an hour later it is still kept.
	applyOK(t, s, Command{Op: OpAcquire, Key: "m", Owner: "e", LeaseSec: 5, Session: 7, Seq: 2, Now: 3_600_000}, StatusGranted) // token 4, serial 2
	applyOK(t, s, Command{Op: OpRevoke, Key: "m", Owner: "ops", Token: 4, Now: 3_600_001}, StatusRevoked)
	if n := len(s.SessionRevokes(7)); n != 2 {
		t.Fatalf("session 7 keeps %d notes an hour on, want 2", n)
	}
	// An ack of serial 1 (the grant it was told before the first
	// revoke) drops nothing; an ack of serial 2, recorded after the
	// first revoke, drops that one.
	applyOK(t, s, Command{Op: OpAckSession, Session: 7, Ack: 1, Now: 3_600_002}, StatusAcked)
	if n := len(s.SessionRevokes(7)); n != 2 {
		t.Fatalf("after ack 1: %d notes, want 2", n)
	}
	applyOK(t, s, Command{Op: OpAckSession, Session: 7, Ack: 2, Now: 3_600_003}, StatusAcked)
	if got := s.SessionRevokes(7); len(got) != 1 || got[0].Token != 4 {
		t.Fatalf("after ack 2: %+v, want token 4's note only", got)
	}
	applyOK(t, s, Command{Op: OpCloseSession, Session: 7, Now: 3_600_004}, StatusSessionClosed)
	if n := len(s.SessionRevokes(7)); n != 0 || s.NumSessionRevokes() != 1 {
		t.Fatalf("after session 7 closed: %d notes of it, %d in all", n, s.NumSessionRevokes())
	}
}
