package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"ticketing/locksm"
)

// sampleMsgs has one or more messages of every type, with fields at their
// edges (max lengths, zero values where allowed).
func sampleMsgs() []Msg {
	return []Msg{
		{Type: TypeAcquire, ID: 1, Lease: 30, WaitMs: 5000, Key: "event:42", Owner: "srv-a"},
		{Type: TypeAcquire, ID: ^uint64(0), Lease: 0xFFFF, WaitMs: 0xFFFFFFFF, Key: strings.Repeat("k", locksm.MaxKeyLen), Owner: strings.Repeat("o", locksm.MaxOwnerLen)},
		{Type: TypeAcquire, ID: 7, Key: "k", Owner: "o"},
		{Type: TypeRelease, ID: 2, Token: 99, Key: "event:42", Owner: "srv-a"},
		{Type: TypeRelease, ID: 3, Token: 0, Key: "x", Owner: "y"},
		{Type: TypeCancel, ID: 4, Target: 1},
		{Type: TypePing, ID: 5},
		{Type: TypeStatus, ID: 6},
		{Type: TypeGranted, ID: 1, Token: 1},
		{Type: TypeBusy, ID: 1},
		{Type: TypeTimeout, ID: 1},
		{Type: TypeMoved, ID: 1, LeaderAddr: "10.0.0.2:7001", LeaderID: "n2"},
		{Type: TypeMoved, ID: 1},
		{Type: TypeOK, ID: 2},
		{Type: TypeUnknown, ID: 3, Text: "leadership lost before commit"},
		{Type: TypeUnknown, ID: 3},
		{Type: TypeError, ID: 4, Code: CodeInvalidLease, Text: "lease 0"},
		{Type: TypeError, ID: 0, Code: CodeShuttingDown, Text: strings.Repeat("t", MaxTextLen)},
		{Type: TypePong, ID: 5},
		{Type: TypeStatusR, ID: 6, NodeID: "n1", Role: RoleLeader, Term: 3, LeaderID: "n1", LeaderAddr: "10.0.0.1:7001",
			Commit: 100, Applied: 99, LastToken: 12, Held: 4, Waiting: 9},
		{Type: TypeStatusR, ID: 6, Role: RoleUnknown},
		{Type: TypeMembers, ID: 7},
		{Type: TypeMembersR, ID: 7, Members: []Member{{ServerID: "n1/aaaaaaaaaa", ClientAddr: "10.0.0.1:7001"},
			{ServerID: "n4/bbbbbbbbbb", Suffrage: SuffrageLearner}}},
		{Type: TypeMembersR, ID: 7},
		{Type: TypeNoticeAck, ID: 8},
		{Type: TypeNotice, Event: NoticeHandOver, LeaderID: "n2/bbbbbbbbbb", LeaderAddr: "10.0.0.2:7001"},
		{Type: TypeNotice, Event: NoticeServing, LeaderID: "n1/aaaaaaaaaa"},
		{Type: TypeQueued, ID: 1},
		{Type: TypeQueued, ID: ^uint64(0)},
		{Type: TypeAcquireBlock, ID: 9, Lease: 30, WaitMs: 5000, Owner: "srv-a", Keys: []string{"event:42/seat:1", "event:42/seat:2"}},
		{Type: TypeAcquireBlock, ID: 10, Owner: "o", Keys: []string{"k", "j"}},
		// The largest frame of all: 16 keys of 255 bytes and a 128-byte
		// owner, 4241 bytes (over MaxFrameLenV4, within MaxFrameLen).
		{Type: TypeAcquireBlock, ID: ^uint64(0), Lease: 0xFFFF, WaitMs: 0xFFFFFFFF, Owner: strings.Repeat("o", locksm.MaxOwnerLen), Keys: maxBlockKeys()},
		{Type: TypeExtend, ID: 11, Token: 42, Lease: 30, Key: "event:42", Owner: "srv-a"},
		{Type: TypeExtend, ID: ^uint64(0), Token: ^uint64(0), Lease: 0xFFFF, Key: strings.Repeat("k", locksm.MaxKeyLen), Owner: strings.Repeat("o", locksm.MaxOwnerLen)},
		{Type: TypeLost, Token: 42, Reason: LostExpired, Key: "event:42"},
		{Type: TypeLost, Token: ^uint64(0), Reason: LostExpired, Key: strings.Repeat("k", locksm.MaxKeyLen)},
		{Type: TypeOpenSession, ID: 12, Session: 0x1234567890abcdef, TimeoutMs: 10_000, Secret: [SecretLen]byte{1, 2, 3, 15: 0xff}},
		{Type: TypeOpenSession, ID: ^uint64(0), Session: ^uint64(0), TimeoutMs: ^uint32(0)},
		{Type: TypeResume, ID: 13, Session: 7, Secret: [SecretLen]byte{9, 15: 1}, High: 1000, Serial: 998},
		{Type: TypeResume, ID: 1, Session: 1},
		{Type: TypeSessionAck, ID: 14, Serial: 77},
		{Type: TypeSessionAck, ID: 1},
		{Type: TypeCloseSession, ID: 15},
		{Type: TypeOutcomes, Session: 7, Serial: 1001},
		{Type: TypeOutcomes, Session: ^uint64(0), Serial: ^uint64(0)},
		{Type: TypePosition, ID: 16, Position: 1, EstimateMs: 2500, Key: "event:42"},
		{Type: TypeWatchPositions, ID: 17},
		{Type: TypePosition, ID: ^uint64(0), Position: ^uint32(0), EstimateMs: EstimateUnknown, Key: strings.Repeat("k", locksm.MaxKeyLen)},
	}
}

// maxBlockKeys is a block of locksm.MaxBlockKeys distinct keys of
// locksm.MaxKeyLen bytes each.
func maxBlockKeys() []string {
	keys := make([]string, locksm.MaxBlockKeys)
	for i := range keys {
		keys[i] = strings.Repeat(string(rune('A'+i)), locksm.MaxKeyLen)
	}
	return keys
}

func TestRoundTrip(t *testing.T) {
	for _, m := range sampleMsgs() {
		t.Run(TypeName(m.Type), func(t *testing.T) {
			b, err := AppendMsg([]byte("prefix"), &m)
			if err != nil {
				t.Fatalf("AppendMsg(%+v): %v", m, err)
			}
			if !bytes.HasPrefix(b, []byte("prefix")) {
				t.Fatal("AppendMsg lost dst")
			}
			b = b[len("prefix"):]
			typ, payload, n, err := SplitFrame(b)
			if err != nil || n != len(b) || typ != m.Type {
				t.Fatalf("SplitFrame: typ %q n %d/%d err %v", typ, n, len(b), err)
			}
			var got Msg
			if err := DecodeMsg(typ, payload, &got); err != nil {
				t.Fatalf("DecodeMsg: %v", err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
			}
		})
	}
}

// TestAppendIgnoresUnusedFields: only the fields of the type are encoded.
func TestAppendIgnoresUnusedFields(t *testing.T) {
	m := Msg{Type: TypePing, ID: 9, Key: "ignored", Token: 5, Text: "x"}
	b, err := AppendMsg(nil, &m)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0, 0, 0, 9, 'p', 0, 0, 0, 0, 0, 0, 0, 9}
	if !bytes.Equal(b, want) {
		t.Fatalf("got % x want % x", b, want)
	}
}

// TestSplitEveryOffset feeds a stream of all sample frames to SplitFrame in
// two pieces cut at every offset, and one byte at a time, and checks the
// same messages come out (the nats-server parser test pattern).
func TestSplitEveryOffset(t *testing.T) {
	var stream []byte
	msgs := sampleMsgs()
	for i := range msgs {
		var err error
		if stream, err = AppendMsg(stream, &msgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	parse := func(chunks [][]byte) []Msg {
		var out []Msg
		var pending []byte
		for _, c := range chunks {
			pending = append(pending, c...)
			for {
				typ, payload, n, err := SplitFrame(pending)
				if err != nil {
					t.Fatalf("SplitFrame: %v", err)
				}
				if n == 0 {
					break
				}
				var m Msg
				if err := DecodeMsg(typ, payload, &m); err != nil {
					t.Fatalf("DecodeMsg: %v", err)
				}
				out = append(out, m)
				pending = pending[n:]
			}
		}
		if len(pending) != 0 {
			t.Fatalf("%d bytes left over", len(pending))
		}
		return out
	}
	for cut := 0; cut <= len(stream); cut++ {
		got := parse([][]byte{stream[:cut], stream[cut:]})
		if !reflect.DeepEqual(got, msgs) {
			t.Fatalf("cut at %d: messages differ", cut)
		}
	}
	var bytewise [][]byte
	for i := range stream {
		bytewise = append(bytewise, stream[i:i+1])
	}
	if got := parse(bytewise); !reflect.DeepEqual(got, msgs) {
		t.Fatal("byte by byte: messages differ")
	}
	// Every strict prefix of one frame is "need more".
	one, _ := AppendMsg(nil, &msgs[1])
	for i := 0; i < len(one); i++ {
		if _, _, n, err := SplitFrame(one[:i]); n != 0 || err != nil {
			t.Fatalf("prefix %d: n %d err %v", i, n, err)
		}
	}
}

func TestSplitFrameRejectsEarly(t *testing.T) {
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"zero length", []byte{0, 0, 0, 0}, ErrMalformed},
		{"zero length with more", []byte{0, 0, 0, 0, 'p', 1, 2}, ErrMalformed},
		{"one over max", binary.BigEndian.AppendUint32(nil, MaxFrameLen+1), ErrFrameTooLarge},
		{"http probe", []byte("GET / HTTP/1.1\r\n"), ErrFrameTooLarge},
		{"huge", []byte{0xff, 0xff, 0xff, 0xff}, ErrFrameTooLarge},
	}
	for _, c := range cases {
		_, _, n, err := SplitFrame(c.in)
		if n != 0 || !errors.Is(err, c.want) {
			t.Errorf("%s: n %d err %v, want %v", c.name, n, err, c.want)
		}
	}
	_, _, _, err := SplitFrame([]byte("GET / HTTP/1.1\r\n"))
	if !strings.Contains(err.Error(), `"GET / HTTP/1.1.."`) || !strings.Contains(err.Error(), "47 45 54") {
		t.Errorf("error does not quote the bytes: %v", err)
	}
	// Exactly MaxFrameLen is legal.
	b := binary.BigEndian.AppendUint32(nil, MaxFrameLen)
	if _, _, n, err := SplitFrame(b); n != 0 || err != nil {
		t.Errorf("max length header: n %d err %v", n, err)
	}
	b = append(b, make([]byte, MaxFrameLen)...)
	if _, p, n, err := SplitFrame(b); n != MaxFrameBytes || err != nil || len(p) != MaxFrameLen-1 {
		t.Errorf("max frame: n %d err %v", n, err)
	}
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func u16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func s8(s string) []byte  { return append([]byte{byte(len(s))}, s...) }

// TestBlockAcquireFrame: the block acquire's bytes are PROTOCOL.md's
// layout (id u64 | lease_sec u16 | wait_ms u32 | owner str8 | n u8 |
// n × key str8); 2..16 keys encode and decode, 0, 1, 17 and more do not; the
// largest block is 4241 bytes, the one frame over MaxFrameLenV4; the
// decoder leaves distinctness and the key alphabet to locksm.
func TestBlockAcquireFrame(t *testing.T) {
	m := Msg{Type: TypeAcquireBlock, ID: 3, Lease: 30, WaitMs: 500, Owner: "ow", Keys: []string{"k1", "k22"}}
	b, err := AppendMsg(nil, &m)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Join([][]byte{u32(1 + 8 + 2 + 4 + 3 + 1 + 3 + 4), {'b'}, u64(3), u16(30), u32(500), s8("ow"), {2}, s8("k1"), s8("k22")}, nil)
	if !bytes.Equal(b, want) {
		t.Fatalf("block frame\n got % x\nwant % x", b, want)
	}

	block := func(n int, keyLen int) Msg {
		m := Msg{Type: TypeAcquireBlock, ID: 1, Lease: 30, Owner: strings.Repeat("o", locksm.MaxOwnerLen)}
		for i := range n {
			m.Keys = append(m.Keys, fmt.Sprintf("%0*d", keyLen, i))
		}
		return m
	}
	for n := 0; n <= 20; n++ {
		m := block(n, locksm.MaxKeyLen)
		b, err := AppendMsg(nil, &m)
		ok := n >= locksm.MinBlockKeys && n <= locksm.MaxBlockKeys
		if ok != (err == nil) || (!ok && !errors.Is(err, ErrMalformed)) {
			t.Fatalf("AppendMsg of %d keys: %v", n, err)
		}
		// The decoder refuses the same counts, as malformed frames (not
		// field errors: the frame's shape is wrong).
		payload := bytes.Join([][]byte{u64(1), u16(30), u32(0), s8(m.Owner), {byte(n)}}, nil)
		for _, k := range m.Keys {
			payload = append(payload, s8(k)...)
		}
		var got Msg
		err = DecodeMsg(TypeAcquireBlock, payload, &got)
		if ok != (err == nil) || (!ok && (!errors.Is(err, ErrMalformed) || IsFieldError(err) || CodeOf(err) != CodeBadRequest || got.ID != 1)) {
			t.Fatalf("DecodeMsg of %d keys: %v (id %d)", n, err, got.ID)
		}
		if ok && (!reflect.DeepEqual(got, m) || len(b) != 4+1+8+2+4+1+locksm.MaxOwnerLen+1+n*(1+locksm.MaxKeyLen)) {
			t.Fatalf("%d keys: %d bytes, decoded %+v", n, len(b), got)
		}
	}
	maxM := block(locksm.MaxBlockKeys, locksm.MaxKeyLen)
	b, _ = AppendMsg(nil, &maxM)
	if len(b)-4 != 4241 || len(b)-4 <= MaxFrameLenV4 || len(b)-4 > MaxFrameLen {
		t.Fatalf("largest block frame %d bytes (type and payload)", len(b)-4)
	}
	if m := block(255, 1); !errors.Is(func() error { _, err := AppendMsg(nil, &m); return err }(), ErrMalformed) {
		t.Fatal("255 keys encoded")
	}
	if m := block(256, 1); !errors.Is(func() error { _, err := AppendMsg(nil, &m); return err }(), ErrMalformed) {
		t.Fatal("256 keys encoded (the count is a u8)")
	}

	// Not the decoder's checks: a key named twice (invalid_keys) and a
	// key outside 0x21..0x7E (invalid_key) decode; locksm refuses them.
	for _, keys := range [][]string{{"k", "k"}, {"a b", "k"}, {"k", "\x00"}} {
		m := Msg{Type: TypeAcquireBlock, ID: 5, Lease: 1, Owner: "o", Keys: keys}
		b, err := AppendMsg(nil, &m)
		if err != nil {
			t.Fatalf("keys %q: %v", keys, err)
		}
		var got Msg
		if err := DecodeMsg(b[4], b[5:], &got); err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("keys %q: %+v %v", keys, got, err)
		}
	}
	// A key or owner of the wrong length is a field error, answered
	// under the id, as for an acquire.
	for _, c := range []struct {
		name    string
		payload []byte
		want    error
	}{
		{"empty first key", bytes.Join([][]byte{u64(8), u16(1), u32(0), s8("o"), {2}, s8(""), s8("k")}, nil), locksm.ErrInvalidKey},
		{"empty last key", bytes.Join([][]byte{u64(8), u16(1), u32(0), s8("o"), {2}, s8("k"), s8("")}, nil), locksm.ErrInvalidKey},
		{"empty owner", bytes.Join([][]byte{u64(8), u16(1), u32(0), s8(""), {2}, s8("k"), s8("j")}, nil), locksm.ErrInvalidOwner},
		{"owner too long", bytes.Join([][]byte{u64(8), u16(1), u32(0), s8(strings.Repeat("o", locksm.MaxOwnerLen+1)), {2}, s8("k"), s8("j")}, nil), locksm.ErrInvalidOwner},
	} {
		var got Msg
		err := DecodeMsg(TypeAcquireBlock, c.payload, &got)
		if !errors.Is(err, c.want) || !errors.Is(err, ErrMalformed) || !IsFieldError(err) || got.ID != 8 || got.Type != TypeAcquireBlock {
			t.Errorf("%s: %v (id %d)", c.name, err, got.ID)
		}
	}
}

// TestFrameBoundPerType: only the block acquire may be longer than
// MaxFrameLenV4, so every other frame a version 5 speaker writes fits an
// older peer; the decoder holds received frames to the same bounds (the
// encoding stays canonical: whatever decodes re-encodes).
func TestFrameBoundPerType(t *testing.T) {
	maxU := MaxFrameLenV4 - 1 - 8 - 2
	if _, err := AppendMsg(nil, &Msg{Type: TypeUnknown, ID: 1, Text: strings.Repeat("u", maxU)}); err != nil {
		t.Fatalf("U of %d bytes of text: %v", maxU, err)
	}
	if _, err := AppendMsg(nil, &Msg{Type: TypeUnknown, ID: 1, Text: strings.Repeat("u", maxU+1)}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("U over MaxFrameLenV4: %v", err)
	}
	for _, text := range []int{maxU + 1, MaxFrameLen - 1 - 8 - 2} {
		var m Msg
		err := DecodeMsg(TypeUnknown, bytes.Join([][]byte{u64(1), u16(uint16(text)), []byte(strings.Repeat("u", text))}, nil), &m)
		if !errors.Is(err, ErrMalformed) || CodeOf(err) != CodeBadRequest {
			t.Errorf("U of %d bytes of text decoded: %v", text, err)
		}
	}
	// A ping padded to MaxFrameLen is malformed, not a framing error.
	var m Msg
	if err := DecodeMsg(TypePing, make([]byte, MaxFrameLen-1), &m); !errors.Is(err, ErrMalformed) {
		t.Errorf("long ping: %v", err)
	}
	if MaxTextLen != 4083 || MaxFrameBytes != 4+8192 {
		t.Errorf("MaxTextLen %d MaxFrameBytes %d", MaxTextLen, MaxFrameBytes)
	}
}

func TestDecodeMalformed(t *testing.T) {
	long := strings.Repeat("o", locksm.MaxOwnerLen+1)
	cases := []struct {
		name    string
		typ     byte
		payload []byte
		want    []error
	}{
		{"empty ping", 'p', nil, []error{ErrMalformed}},
		{"short id", 'p', []byte{0, 0, 0, 1}, []error{ErrMalformed}},
		{"ping trailing", 'p', append(u64(1), 0), []error{ErrMalformed}},
		{"ping id 0", 'p', u64(0), []error{ErrMalformed}},
		{"status id 0", 's', u64(0), []error{ErrMalformed}},
		{"acquire truncated", 'a', bytes.Join([][]byte{u64(1), u16(1), u32(0)}, nil), []error{ErrMalformed}},
		{"acquire key beyond payload", 'a', bytes.Join([][]byte{u64(1), u16(1), u32(0), {5}, []byte("ab")}, nil), []error{ErrMalformed}},
		{"acquire trailing", 'a', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("k"), s8("o"), {0}}, nil), []error{ErrMalformed}},
		{"acquire empty key", 'a', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8(""), s8("o")}, nil), []error{ErrMalformed, locksm.ErrInvalidKey}},
		{"acquire empty owner", 'a', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("k"), s8("")}, nil), []error{ErrMalformed, locksm.ErrInvalidOwner}},
		{"acquire owner too long", 'a', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("k"), s8(long)}, nil), []error{ErrMalformed, locksm.ErrInvalidOwner}},
		{"acquire id 0", 'a', bytes.Join([][]byte{u64(0), u16(1), u32(0), s8("k"), s8("o")}, nil), []error{ErrMalformed}},
		{"release owner too long", 'r', bytes.Join([][]byte{u64(1), u64(1), s8("k"), s8(long)}, nil), []error{ErrMalformed, locksm.ErrInvalidOwner}},
		{"release short", 'r', bytes.Join([][]byte{u64(1), u64(1), s8("k")}, nil), []error{ErrMalformed}},
		{"cancel target 0", 'c', bytes.Join([][]byte{u64(1), u64(0)}, nil), []error{ErrMalformed}},
		{"cancel short", 'c', u64(1), []error{ErrMalformed}},
		{"granted id 0", 'G', bytes.Join([][]byte{u64(0), u64(1)}, nil), []error{ErrMalformed}},
		{"busy id 0", 'B', u64(0), []error{ErrMalformed}},
		{"moved truncated", 'M', bytes.Join([][]byte{u64(1), s8("a")}, nil), []error{ErrMalformed}},
		{"unknown text beyond", 'U', bytes.Join([][]byte{u64(1), u16(10), []byte("abc")}, nil), []error{ErrMalformed}},
		{"error code 0", 'E', bytes.Join([][]byte{u64(0), u16(0), u16(0)}, nil), []error{ErrMalformed}},
		{"error trailing", 'E', bytes.Join([][]byte{u64(0), u16(1), u16(0), {1}}, nil), []error{ErrMalformed}},
		{"status bad role", 'S', bytes.Join([][]byte{u64(1), s8(""), {9}, u64(0), s8(""), s8(""), u64(0), u64(0), u64(0), u64(0), u64(0)}, nil), []error{ErrMalformed}},
		{"status short", 'S', bytes.Join([][]byte{u64(1), s8(""), {1}, u64(0), s8(""), s8(""), u64(0), u64(0), u64(0), u64(0)}, nil), []error{ErrMalformed}},
		{"members count beyond payload", 'L', bytes.Join([][]byte{u64(1), {255}, s8("n1"), {0}, s8("")}, nil), []error{ErrMalformed}},
		{"members entry truncated", 'L', bytes.Join([][]byte{u64(1), {2}, s8("n1"), {0}, s8(""), s8("n2")}, nil), []error{ErrMalformed}},
		{"members bad suffrage", 'L', bytes.Join([][]byte{u64(1), {1}, s8("n1"), {2}, s8("")}, nil), []error{ErrMalformed}},
		{"members empty id", 'L', bytes.Join([][]byte{u64(1), {1}, s8(""), {0}, s8("")}, nil), []error{ErrMalformed}},
		{"members trailing", 'L', bytes.Join([][]byte{u64(1), {0}, {0}}, nil), []error{ErrMalformed}},
		{"block no keys", 'b', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("o"), {0}}, nil), []error{ErrMalformed}},
		{"block one key", 'b', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("o"), {1}, s8("k")}, nil), []error{ErrMalformed}},
		{"block 17 keys", 'b', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("o"), {17}, bytes.Repeat(s8("k"), 17)}, nil), []error{ErrMalformed}},
		{"block 255 keys", 'b', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("o"), {255}}, nil), []error{ErrMalformed}},
		{"block count missing", 'b', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("o")}, nil), []error{ErrMalformed}},
		{"block keys short of the count", 'b', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("o"), {3}, s8("k"), s8("j")}, nil), []error{ErrMalformed}},
		{"block key beyond payload", 'b', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("o"), {2}, s8("k"), {9}, []byte("j")}, nil), []error{ErrMalformed}},
		{"block trailing", 'b', bytes.Join([][]byte{u64(1), u16(1), u32(0), s8("o"), {2}, s8("k"), s8("j"), {0}}, nil), []error{ErrMalformed}},
		{"block id 0", 'b', bytes.Join([][]byte{u64(0), u16(1), u32(0), s8("o"), {2}, s8("k"), s8("j")}, nil), []error{ErrMalformed}},
		{"block without lease and wait", 'b', bytes.Join([][]byte{u64(1), s8("o"), {2}, s8("k"), s8("j")}, nil), []error{ErrMalformed}},
		{"open session 0", 'o', bytes.Join([][]byte{u64(1), u64(0), u32(10000), make([]byte, SecretLen)}, nil), []error{ErrMalformed}},
		{"open short secret", 'o', bytes.Join([][]byte{u64(1), u64(5), u32(10000), make([]byte, SecretLen-1)}, nil), []error{ErrMalformed}},
		{"open trailing", 'o', bytes.Join([][]byte{u64(1), u64(5), u32(10000), make([]byte, SecretLen+1)}, nil), []error{ErrMalformed}},
		{"open id 0", 'o', bytes.Join([][]byte{u64(0), u64(5), u32(10000), make([]byte, SecretLen)}, nil), []error{ErrMalformed}},
		{"resume session 0", 'y', bytes.Join([][]byte{u64(1), u64(0), make([]byte, SecretLen), u64(1), u64(0)}, nil), []error{ErrMalformed}},
		{"resume without ack", 'y', bytes.Join([][]byte{u64(1), u64(5), make([]byte, SecretLen), u64(1)}, nil), []error{ErrMalformed}},
		{"ack short", 'k', bytes.Join([][]byte{u64(1), u32(1)}, nil), []error{ErrMalformed}},
		{"ack id 0", 'k', bytes.Join([][]byte{u64(0), u64(1)}, nil), []error{ErrMalformed}},
		{"outcomes with an id", 'O', bytes.Join([][]byte{u64(1), u64(5), u64(1)}, nil), []error{ErrMalformed}},
		{"outcomes session 0", 'O', bytes.Join([][]byte{u64(0), u64(0), u64(1)}, nil), []error{ErrMalformed}},
		{"outcomes short", 'O', bytes.Join([][]byte{u64(0), u64(5)}, nil), []error{ErrMalformed}},
		{"unknown type", 'q', u64(1), []error{ErrUnknownType}},
		{"zero type", 0, nil, []error{ErrUnknownType}},
		{"hello after handshake", TypeHello, nil, []error{ErrUnexpectedFrame}},
		{"welcome after handshake", TypeWelcome, nil, []error{ErrUnexpectedFrame}},
		{"position id 0", TypePosition, bytes.Join([][]byte{u64(0), u32(1), u32(5), s8("k")}, nil), []error{ErrMalformed}},
		{"position 0", TypePosition, bytes.Join([][]byte{u64(1), u32(0), u32(5), s8("k")}, nil), []error{ErrMalformed}},
		{"position empty key", TypePosition, bytes.Join([][]byte{u64(1), u32(1), u32(5), s8("")}, nil), []error{ErrMalformed}},
		{"position no key", TypePosition, bytes.Join([][]byte{u64(1), u32(1), u32(5)}, nil), []error{ErrMalformed}},
		{"position trailing", TypePosition, bytes.Join([][]byte{u64(1), u32(1), u32(5), s8("k"), {0}}, nil), []error{ErrMalformed}},
	}
	for _, c := range cases {
		var m Msg
		err := DecodeMsg(c.typ, c.payload, &m)
		for _, want := range c.want {
			if !errors.Is(err, want) {
				t.Errorf("%s: err %v, want %v", c.name, err, want)
			}
		}
	}
	// The id survives a payload error so the server can answer under it.
	var m Msg
	err := DecodeMsg('a', bytes.Join([][]byte{u64(77), u16(1), u32(0), s8(""), s8("o")}, nil), &m)
	if m.ID != 77 || m.Type != 'a' || CodeOf(err) != CodeInvalidKey || !IsFieldError(err) {
		t.Errorf("id %d type %q code %v (%v)", m.ID, m.Type, CodeOf(err), err)
	}
	if err := DecodeMsg('p', u64(0), &m); CodeOf(err) != CodeBadRequest || IsFieldError(err) {
		t.Error("malformed ping is not bad_request")
	}
}

func TestAppendRefuses(t *testing.T) {
	cases := []struct {
		name string
		m    Msg
		want error
	}{
		{"unknown type", Msg{Type: 'q', ID: 1}, ErrUnknownType},
		{"handshake type", Msg{Type: TypeHello, ID: 1}, ErrUnknownType},
		{"request id 0", Msg{Type: TypePing}, ErrMalformed},
		{"reply id 0", Msg{Type: TypeOK}, ErrMalformed},
		{"key too long", Msg{Type: TypeAcquire, ID: 1, Key: strings.Repeat("k", 256), Owner: "o"}, ErrMalformed},
		{"owner too long", Msg{Type: TypeRelease, ID: 1, Key: "k", Owner: strings.Repeat("o", 129)}, locksm.ErrInvalidOwner},
		{"empty key", Msg{Type: TypeAcquire, ID: 1, Owner: "o"}, locksm.ErrInvalidKey},
		{"text too long", Msg{Type: TypeError, Code: 1, Text: strings.Repeat("t", MaxTextLen+1)}, ErrFrameTooLarge},
		{"text beyond str16", Msg{Type: TypeUnknown, ID: 1, Text: strings.Repeat("t", 70000)}, ErrMalformed},
		{"moved addr too long", Msg{Type: TypeMoved, ID: 1, LeaderAddr: strings.Repeat("a", 256)}, ErrMalformed},
		{"code 0", Msg{Type: TypeError, ID: 1}, ErrMalformed},
		{"cancel target 0", Msg{Type: TypeCancel, ID: 1}, ErrMalformed},
		{"bad role", Msg{Type: TypeStatusR, ID: 1, Role: 200}, ErrMalformed},
		{"bad suffrage", Msg{Type: TypeMembersR, ID: 1, Members: []Member{{ServerID: "n1", Suffrage: 7}}}, ErrMalformed},
		{"member id too long", Msg{Type: TypeMembersR, ID: 1, Members: []Member{{ServerID: strings.Repeat("n", 256)}}}, ErrMalformed},
		{"members beyond a frame", Msg{Type: TypeMembersR, ID: 1, Members: manyMembers(20)}, ErrFrameTooLarge},
		{"notice with an id", Msg{Type: TypeNotice, ID: 1, Event: NoticeServing}, ErrMalformed},
		{"notice event 0", Msg{Type: TypeNotice}, ErrMalformed},
		{"notice event 3", Msg{Type: TypeNotice, Event: 3}, ErrMalformed},
		{"notice ack id 0", Msg{Type: TypeNoticeAck}, ErrMalformed},
		{"queued id 0", Msg{Type: TypeQueued}, ErrMalformed},
		{"block no keys", Msg{Type: TypeAcquireBlock, ID: 1, Owner: "o"}, ErrMalformed},
		{"block one key", Msg{Type: TypeAcquireBlock, ID: 1, Owner: "o", Keys: []string{"k"}}, ErrMalformed},
		{"block 17 keys", Msg{Type: TypeAcquireBlock, ID: 1, Owner: "o", Keys: strings.Split("abcdefghijklmnopq", "")}, ErrMalformed},
		{"block empty key", Msg{Type: TypeAcquireBlock, ID: 1, Owner: "o", Keys: []string{"k", ""}}, locksm.ErrInvalidKey},
		{"block key too long", Msg{Type: TypeAcquireBlock, ID: 1, Owner: "o", Keys: []string{"k", strings.Repeat("k", 256)}}, ErrMalformed},
		{"block empty owner", Msg{Type: TypeAcquireBlock, ID: 1, Keys: []string{"k", "j"}}, locksm.ErrInvalidOwner},
		{"block owner too long", Msg{Type: TypeAcquireBlock, ID: 1, Owner: strings.Repeat("o", 129), Keys: []string{"k", "j"}}, locksm.ErrInvalidOwner},
		{"block id 0", Msg{Type: TypeAcquireBlock, Owner: "o", Keys: []string{"k", "j"}}, ErrMalformed},
		{"unknown text over MaxFrameLenV4", Msg{Type: TypeUnknown, ID: 1, Text: strings.Repeat("t", MaxTextLen+3)}, ErrFrameTooLarge},
	}
	for _, c := range cases {
		dst := []byte("keep")
		out, err := AppendMsg(dst, &c.m)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
		if string(out) != "keep" {
			t.Errorf("%s: dst changed to %q", c.name, out)
		}
	}
}

func TestAppendMsgNoAlloc(t *testing.T) {
	m := Msg{Type: TypeAcquire, ID: 1, Lease: 30, WaitMs: 1000, Key: "event:42", Owner: "srv-a"}
	buf := make([]byte, 0, 256)
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		if buf, err = AppendMsg(buf[:0], &m); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("AppendMsg allocates %v times", allocs)
	}
}

func TestValidKeyOwner(t *testing.T) {
	for _, k := range []string{"a", "event:42/seat#7", strings.Repeat("~", 255)} {
		if ValidKey(k) != nil {
			t.Errorf("ValidKey(%q) failed", k)
		}
	}
	for _, k := range []string{"", "a b", "tab\t", "é", strings.Repeat("k", 256), "\x7f"} {
		if !errors.Is(ValidKey(k), locksm.ErrInvalidKey) {
			t.Errorf("ValidKey(%q) passed", k)
		}
	}
	if ValidOwner(strings.Repeat("o", 128)) != nil || !errors.Is(ValidOwner(strings.Repeat("o", 129)), locksm.ErrInvalidOwner) {
		t.Error("ValidOwner length bound wrong")
	}
}

func TestReplyAllowed(t *testing.T) {
	if !ReplyAllowed(TypeAcquire, TypeGranted) || !ReplyAllowed(TypePing, TypeError) ||
		ReplyAllowed(TypePing, TypeGranted) || ReplyAllowed(TypeRelease, TypeGranted) ||
		ReplyAllowed(TypeGranted, TypeError) || !ReplyAllowed(TypeCancel, TypeOK) ||
		!ReplyAllowed(TypeNoticeAck, TypeOK) || ReplyAllowed(TypeNoticeAck, TypeMoved) ||
		ReplyAllowed(TypeAcquire, TypeNotice) || ReplyAllowed(TypeNotice, TypeOK) ||
		!ReplyAllowed(TypeWatchPositions, TypeOK) || !ReplyAllowed(TypeWatchPositions, TypeError) ||
		ReplyAllowed(TypeWatchPositions, TypeMoved) || ReplyAllowed(TypeAcquire, TypePosition) {
		t.Error("ReplyAllowed table wrong")
	}
	// A block acquire's replies are exactly an acquire's.
	for reply := byte(0); reply < 0x80; reply++ {
		if ReplyAllowed(TypeAcquireBlock, reply) != ReplyAllowed(TypeAcquire, reply) {
			t.Errorf("ReplyAllowed(b, %s) = %v, a: %v", TypeName(reply), ReplyAllowed(TypeAcquireBlock, reply), ReplyAllowed(TypeAcquire, reply))
		}
	}
	if !IsRequest(TypeAcquireBlock) || IsReply(TypeAcquireBlock) || IsNotice(TypeAcquireBlock) || IsProgress(TypeAcquireBlock) {
		t.Error("b's class wrong")
	}
	// Q is a progress frame, never a reply: a client that took it for
	// one would end the call before its outcome is known.
	for _, req := range []byte{TypeAcquire, TypeAcquireBlock, TypeRelease, TypeCancel, TypePing, TypeStatus, TypeMembers, TypeNoticeAck} {
		if ReplyAllowed(req, TypeQueued) {
			t.Errorf("ReplyAllowed(%s, Q)", TypeName(req))
		}
	}
	if IsReply(TypeQueued) || IsRequest(TypeQueued) || IsNotice(TypeQueued) || !IsProgress(TypeQueued) || IsProgress(TypeGranted) {
		t.Error("Q's class wrong")
	}
	// Sessions: open and resume are answered like a release (K, or M/U
	// when not proposed/unknown); an ack only K; O is an event, never a
	// reply.
	for _, req := range []byte{TypeOpenSession, TypeResume, TypeCloseSession} {
		for reply := byte(0); reply < 0x80; reply++ {
			if ReplyAllowed(req, reply) != ReplyAllowed(TypeRelease, reply) {
				t.Errorf("ReplyAllowed(%s, %s) = %v, r: %v", TypeName(req), TypeName(reply), ReplyAllowed(req, reply), ReplyAllowed(TypeRelease, reply))
			}
		}
	}
	if !ReplyAllowed(TypeSessionAck, TypeOK) || !ReplyAllowed(TypeSessionAck, TypeError) || ReplyAllowed(TypeSessionAck, TypeMoved) ||
		ReplyAllowed(TypeSessionAck, TypeUnknown) || ReplyAllowed(TypeAcquire, TypeOutcomes) {
		t.Error("session replies wrong")
	}
	if !IsEvent(TypeOutcomes) || IsReply(TypeOutcomes) || IsRequest(TypeOutcomes) || IsProgress(TypeOutcomes) || IsNotice(TypeOutcomes) {
		t.Error("O's class wrong")
	}
	for _, req := range []byte{TypeOpenSession, TypeResume, TypeSessionAck, TypeCloseSession} {
		if !IsRequest(req) || IsReply(req) || IsEvent(req) {
			t.Errorf("%s's class wrong", TypeName(req))
		}
	}
}

// TestProgressAllowed: Q only for an acquire, only on a version 4
// connection; no other frame is progress.
func TestProgressAllowed(t *testing.T) {
	for _, tc := range []struct {
		req, typ byte
		version  uint16
		want     bool
	}{
		{TypeAcquire, TypeQueued, VersionQueued, true},
		{TypeAcquire, TypeQueued, VersionQueued + 1, true},
		{TypeAcquire, TypeQueued, VersionQueued - 1, false},
		{TypeAcquire, TypeQueued, 2, false},
		{TypeRelease, TypeQueued, VersionQueued, false},
		{TypeCancel, TypeQueued, VersionQueued, false},
		{TypePing, TypeQueued, VersionQueued, false},
		{TypeNoticeAck, TypeQueued, VersionQueued, false},
		{TypeAcquire, TypeGranted, VersionQueued, false},
		{TypeAcquire, TypeNotice, VersionQueued, false},
		{TypeAcquireBlock, TypeQueued, VersionBlocks, true},
		{TypeAcquireBlock, TypeQueued, VersionBlocks + 1, true},
		{TypeAcquireBlock, TypeQueued, VersionQueued, false}, // never sent on a version 4 connection
		{TypeAcquireBlock, TypeGranted, VersionBlocks, false},
		{TypeAcquire, TypePosition, VersionPositions, true},
		{TypeAcquireBlock, TypePosition, VersionPositions, true},
		{TypeAcquire, TypePosition, VersionPositions - 1, false},
		{TypeAcquireBlock, TypePosition, VersionPositions - 1, false},
		{TypeRelease, TypePosition, VersionPositions, false},
		{TypePing, TypePosition, VersionPositions, false},
	} {
		if got := ProgressAllowed(tc.req, tc.typ, tc.version); got != tc.want {
			t.Errorf("ProgressAllowed(%s, %s, %d) = %v", TypeName(tc.req), TypeName(tc.typ), tc.version, got)
		}
	}
}

// TestRequestAllowed: 'n' from version 3, 'b' from version 5, 'e' from 6, the other
// requests in every version, and never a reply type.
func TestRequestAllowed(t *testing.T) {
	for v := uint16(MinProtocolVersion); v <= ProtocolVersion; v++ {
		for _, req := range []byte{TypeAcquire, TypeRelease, TypeCancel, TypePing, TypeStatus, TypeMembers} {
			if !RequestAllowed(req, v) {
				t.Errorf("RequestAllowed(%s, %d)", TypeName(req), v)
			}
		}
		if RequestAllowed(TypeNoticeAck, v) != (v >= VersionNotices) || RequestAllowed(TypeAcquireBlock, v) != (v >= VersionBlocks) ||
			RequestAllowed(TypeExtend, v) != (v >= VersionExtend) || RequestAllowed(TypeWatchPositions, v) != (v >= VersionPositions) {
			t.Errorf("version %d: n %v, b %v, e %v", v, RequestAllowed(TypeNoticeAck, v), RequestAllowed(TypeAcquireBlock, v), RequestAllowed(TypeExtend, v))
		}
		if RequestAllowed(TypeGranted, v) || RequestAllowed(TypeQueued, v) || RequestAllowed(TypeHello, v) || RequestAllowed(TypeLost, v) ||
			RequestAllowed(TypeOutcomes, v) {
			t.Errorf("version %d: a non-request allowed", v)
		}
	}
	// Sessions come with version 7, which is not negotiated yet.
	for v := uint16(MinProtocolVersion); v <= VersionSessions; v++ {
		for _, req := range []byte{TypeOpenSession, TypeResume, TypeSessionAck, TypeCloseSession} {
			if RequestAllowed(req, v) != (v >= VersionSessions) {
				t.Errorf("RequestAllowed(%s, %d) = %v", TypeName(req), v, RequestAllowed(req, v))
			}
		}
	}
	if VersionSessions != VersionExtend+1 {
		t.Errorf("VersionSessions %d", VersionSessions)
	}
	for v := uint16(MinProtocolVersion); v <= ProtocolVersion; v++ {
		for _, req := range []byte{TypeAcquirePermit, TypeSetPermits} {
			if RequestAllowed(req, v) != (v >= VersionSemaphores) {
				t.Errorf("RequestAllowed(%s, %d) = %v", TypeName(req), v, RequestAllowed(req, v))
			}
		}
		if ProgressAllowed(TypeAcquirePermit, TypeQueued, v) != (v >= VersionSemaphores) {
			t.Errorf("ProgressAllowed(g, Q, %d)", v)
		}
	}
	if VersionRevoke != ProtocolVersion || VersionSemaphores != VersionRevoke-1 || VersionPositions != VersionSemaphores-1 || VersionLongWaits != VersionPositions-1 || VersionLogVerify != VersionLongWaits-1 || VersionStrictMatch != VersionLogVerify-1 || VersionLabels != VersionStrictMatch-1 || VersionSessions != VersionLabels-1 || VersionExtend <= VersionBlocks || VersionBlocks <= VersionQueued {
		t.Errorf("VersionSemaphores %d, VersionPositions %d, VersionLongWaits %d, VersionLogVerify %d, VersionStrictMatch %d, VersionLabels %d, VersionSessions %d, VersionExtend %d, VersionBlocks %d, ProtocolVersion %d",
			VersionSemaphores, VersionPositions, VersionLongWaits, VersionLogVerify, VersionStrictMatch, VersionLabels, VersionSessions, VersionExtend, VersionBlocks, ProtocolVersion)
	}
}

func TestCodeTable(t *testing.T) {
	for c := Code(1); c <= CodeUnexpectedFrame; c++ {
		if CodeOf(ErrOf(c)) != c {
			t.Errorf("code %d (%s) does not round trip", c, c)
		}
		if c.String() == "unknown" {
			t.Errorf("code %d has no name", c)
		}
	}
	// The codes after it, appended since.
	for c := CodeDuplicateRef; c <= CodeBadSession; c++ {
		if CodeOf(ErrOf(c)) != c || c.String() == "unknown" {
			t.Errorf("code %d (%s) does not round trip", c, c)
		}
	}
	if CodeOf(locksm.ErrInvalidBlock) != CodeInvalidKeys || CodeInvalidKeys.String() != "invalid_keys" ||
		CodeOf(fmt.Errorf("block: %w", ErrNotSupported)) != CodeNotSupported || CodeNotSupported.String() != "not_supported" {
		t.Error("invalid_keys / not_supported mapping wrong")
	}
	for err, c := range map[error]Code{locksm.ErrNoSession: CodeNoSession, locksm.ErrVoided: CodeVoided,
		locksm.ErrDuplicateSeq: CodeDuplicateSeq, locksm.ErrSessionExists: CodeSessionExists,
		locksm.ErrInvalidSession: CodeInvalidSession, locksm.ErrStaleEpoch: CodeStaleEpoch,
		fmt.Errorf("resume: %w", ErrBadSession): CodeBadSession} {
		if CodeOf(err) != c {
			t.Errorf("CodeOf(%v) = %s, want %s", err, CodeOf(err), c)
		}
	}
	if ErrOf(999) != ErrRemote || CodeOf(io.EOF) != CodeInternal {
		t.Error("fallbacks wrong")
	}
}

func TestReader(t *testing.T) {
	var stream []byte
	msgs := sampleMsgs()
	for range 50 { // more than one buffer's worth, so compaction runs
		for i := range msgs {
			stream, _ = AppendMsg(stream, &msgs[i])
		}
	}
	for _, name := range []string{"whole", "onebyte", "half"} {
		var src io.Reader = bytes.NewReader(stream)
		switch name {
		case "onebyte":
			src = iotest.OneByteReader(src)
		case "half":
			src = iotest.HalfReader(iotest.DataErrReader(src))
		}
		r := NewReader(src)
		for i := 0; i < 50*len(msgs); i++ {
			var m Msg
			if err := r.ReadMsg(&m); err != nil {
				t.Fatalf("%s: msg %d: %v", name, i, err)
			}
			if !reflect.DeepEqual(m, msgs[i%len(msgs)]) {
				t.Fatalf("%s: msg %d differs", name, i)
			}
		}
		if _, _, err := r.ReadFrame(); err != io.EOF {
			t.Fatalf("%s: end: %v", name, err)
		}
	}
	// EOF inside a frame.
	b, _ := AppendMsg(nil, &msgs[0])
	r := NewReader(bytes.NewReader(b[:len(b)-1]))
	if _, _, err := r.ReadFrame(); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated: %v", err)
	}
	// Framing errors are sticky; decode errors are not.
	r = NewReader(bytes.NewReader(append([]byte{0, 0, 0, 9, 'p', 0, 0, 0, 0, 0, 0, 0, 0}, b...)))
	var m Msg
	if err := r.ReadMsg(&m); !errors.Is(err, ErrMalformed) {
		t.Fatalf("id 0: %v", err)
	}
	if err := r.ReadMsg(&m); err != nil || m.Type != TypeAcquire {
		t.Fatalf("after decode error: %v", err)
	}
	r = NewReader(bytes.NewReader([]byte{0xff, 0, 0, 0, 1}))
	for range 2 {
		if _, _, err := r.ReadFrame(); !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("oversize: %v", err)
		}
	}
}

func BenchmarkAppendMsg(b *testing.B) {
	m := Msg{Type: TypeAcquire, ID: 1, Lease: 30, WaitMs: 1000, Key: "event:42:seat-block-7", Owner: "event-server-17"}
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		m.ID = uint64(i + 1)
		var err error
		if buf, err = AppendMsg(buf[:0], &m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSplitDecode(b *testing.B) {
	var stream []byte
	msgs := []Msg{
		{Type: TypeAcquire, ID: 1, Lease: 30, WaitMs: 1000, Key: "event:42:seat-block-7", Owner: "event-server-17"},
		{Type: TypeRelease, ID: 2, Token: 12345, Key: "event:42:seat-block-7", Owner: "event-server-17"},
		{Type: TypeGranted, ID: 1, Token: 12345},
		{Type: TypeOK, ID: 2},
	}
	for i := range msgs {
		stream, _ = AppendMsg(stream, &msgs[i])
	}
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	var m Msg
	for i := 0; i < b.N; i++ {
		rest := stream
		for len(rest) > 0 {
			typ, payload, n, err := SplitFrame(rest)
			if err != nil || n == 0 {
				b.Fatal(err)
			}
			if err := DecodeMsg(typ, payload, &m); err != nil {
				b.Fatal(err)
			}
			rest = rest[n:]
		}
	}
}

func manyMembers(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ServerID: strings.Repeat("n", 200), ClientAddr: strings.Repeat("a", 200)}
	}
	return ms
}
