package unixapi

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"ticketing/locksm"
)

func TestParseLineValid(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Request
	}{
		{"PING", Request{Verb: VerbPing}},
		{"PING\r", Request{Verb: VerbPing}},
		{"INFO", Request{Verb: VerbInfo}},
		{"HELD", Request{Verb: VerbHeld}},
		{"ACQUIRE seats/42 30 5", Request{Verb: VerbAcquire, Key: "seats/42", Lease: 30 * time.Second, Wait: 5 * time.Second}},
		{"ACQUIRE k 1 0", Request{Verb: VerbAcquire, Key: "k", Lease: time.Second}},
		{"ACQUIRE k 250 300", Request{Verb: VerbAcquire, Key: "k", Lease: 250 * time.Second, Wait: 300 * time.Second}},
		{"ACQUIRE k 10 2.5", Request{Verb: VerbAcquire, Key: "k", Lease: 10 * time.Second, Wait: 2500 * time.Millisecond}},
		{"ACQUIRE k 10 0.05", Request{Verb: VerbAcquire, Key: "k", Lease: 10 * time.Second, Wait: 50 * time.Millisecond}},
		{"ACQUIRE k 10 0.001", Request{Verb: VerbAcquire, Key: "k", Lease: 10 * time.Second, Wait: time.Millisecond}},
		{"ACQUIRE k 10 299.999\r", Request{Verb: VerbAcquire, Key: "k", Lease: 10 * time.Second, Wait: 299999 * time.Millisecond}},
		{"ACQUIRE a:b!~ 010 007", Request{Verb: VerbAcquire, Key: "a:b!~", Lease: 10 * time.Second, Wait: 7 * time.Second}},
		{"RELEASE k 1", Request{Verb: VerbRelease, Key: "k", Token: 1}},
		{"RELEASE k 18446744073709551615", Request{Verb: VerbRelease, Key: "k", Token: 1<<64 - 1}},
		{"ACQUIRE " + strings.Repeat("k", 255) + " 1 0", Request{Verb: VerbAcquire, Key: strings.Repeat("k", 255), Lease: time.Second}},
		// Version 2: a block of 2..16 keys, in request order.
		{"ACQUIRE seats/1 seats/2 30 5", Request{Verb: VerbAcquire, Keys: []string{"seats/1", "seats/2"}, Lease: 30 * time.Second, Wait: 5 * time.Second}},
		{"ACQUIRE b a 1 0\r", Request{Verb: VerbAcquire, Keys: []string{"b", "a"}, Lease: time.Second}},
		{"ACQUIRE k K 250 299.999", Request{Verb: VerbAcquire, Keys: []string{"k", "K"}, Lease: 250 * time.Second, Wait: 299999 * time.Millisecond}},
		{"ACQUIRE a ab abc 010 007", Request{Verb: VerbAcquire, Keys: []string{"a", "ab", "abc"}, Lease: 10 * time.Second, Wait: 7 * time.Second}},
		{"ACQUIRE " + strings.Join(blockKeys(16, 1), " ") + " 10 0.5", Request{Verb: VerbAcquire, Keys: blockKeys(16, 1), Lease: 10 * time.Second, Wait: 500 * time.Millisecond}},
		{longestShortWaitLine(), Request{Verb: VerbAcquire, Keys: blockKeys(16, 255), Lease: 250 * time.Second, Wait: MaxShortWait}},
		{"HELLO 1", Request{Verb: VerbHello, Version: 1}},
		{"HELLO 2", Request{Verb: VerbHello, Version: 2}},
		{"HELLO 3\r", Request{Verb: VerbHello, Version: 3}},
		{"HELLO 65535", Request{Verb: VerbHello, Version: 65535}},
		{"HELLO 00002", Request{Verb: VerbHello, Version: 2}},
	} {
		got, err := ParseLine([]byte(tc.in))
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseLine(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseLineErrors(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want error
		code string
	}{
		{"", ErrBadRequest, "bad_request"},
		{"\r", ErrBadRequest, "bad_request"},
		{"ping", ErrUnknownVerb, "unknown_verb"},
		{"LOCK k", ErrUnknownVerb, "unknown_verb"},
		{" PING", ErrBadRequest, "bad_request"},
		{"PING ", ErrBadRequest, "bad_request"},
		{"PING x", ErrBadRequest, "bad_request"},
		{"ACQUIRE k  1 0", ErrBadRequest, "bad_request"},
		{"ACQUIRE k 1", ErrBadRequest, "bad_request"},
		{"ACQUIRE", ErrBadRequest, "bad_request"},
		{"ACQUIRE k", ErrBadRequest, "bad_request"},
		{"ACQUIRE k 1 0 ", ErrBadRequest, "bad_request"},
		// Version 2: the field count decides, the last two fields are
		// the lease and the wait. So a field too many is no longer
		// bad_request (version 1's answer): it shifts the lease and
		// the wait, here to "0" and "x", a block of "k" and "1".
		{"ACQUIRE k 1 0 x", locksm.ErrInvalidLease, "invalid_lease"},
		{"ACQUIRE k 1 0 x y z", locksm.ErrInvalidLease, "invalid_lease"},
		{"ACQUIRE k 1 1 x", locksm.ErrInvalidWait, "invalid_wait"},
		{"ACQUIRE a b  1 0", ErrBadRequest, "bad_request"},
		{"ACQUIRE a b 1 0 ", ErrBadRequest, "bad_request"},
		{"ACQUIRE a b\t 1 0", locksm.ErrInvalidKey, "invalid_key"},
		{"ACQUIRE a \x80 1 0", locksm.ErrInvalidKey, "invalid_key"},
		{"ACQUIRE a " + strings.Repeat("k", 256) + " 1 0", locksm.ErrInvalidKey, "invalid_key"},
		{"ACQUIRE a b 0 0", locksm.ErrInvalidLease, "invalid_lease"},
		{"ACQUIRE a b 1 301", locksm.ErrInvalidWait, "invalid_wait"},
		{"ACQUIRE a a 1 0", locksm.ErrInvalidBlock, "invalid_keys"},
		{"ACQUIRE a b c b 1 0", locksm.ErrInvalidBlock, "invalid_keys"},
		{"ACQUIRE " + strings.Join(append(blockKeys(15, 255), blockKeys(1, 255)...), " ") + " 1 0", locksm.ErrInvalidBlock, "invalid_keys"},
		{"ACQUIRE " + strings.Join(blockKeys(17, 1), " ") + " 10 0", locksm.ErrInvalidBlock, "invalid_keys"},
		{"ACQUIRE " + strings.Join(blockKeys(17, 1), " ") + " 0 x", locksm.ErrInvalidBlock, "invalid_keys"},
		{"ACQUIRE \x80 " + strings.Join(blockKeys(16, 1), " ") + " 10 0", locksm.ErrInvalidBlock, "invalid_keys"},
		{"ACQUIRE " + strings.Repeat("x ", 2000) + "1 0", locksm.ErrInvalidBlock, "invalid_keys"},
		{"PING" + strings.Repeat(" x", 100), ErrBadRequest, "bad_request"},
		{"HELLO", ErrBadRequest, "bad_request"},
		{"HELLO 0", ErrBadRequest, "bad_request"},
		{"HELLO 00000", ErrBadRequest, "bad_request"},
		{"HELLO 65536", ErrBadRequest, "bad_request"},
		{"HELLO 99999", ErrBadRequest, "bad_request"},
		{"HELLO 000002", ErrBadRequest, "bad_request"},
		{"HELLO x", ErrBadRequest, "bad_request"},
		{"HELLO -1", ErrBadRequest, "bad_request"},
		{"HELLO +2", ErrBadRequest, "bad_request"},
		{"HELLO 2.0", ErrBadRequest, "bad_request"},
		{"HELLO 2 3", ErrBadRequest, "bad_request"},
		{"HELLO  2", ErrBadRequest, "bad_request"},
		{"HELLO 2 ", ErrBadRequest, "bad_request"},
		{"hello 2", ErrUnknownVerb, "unknown_verb"},
		{"ACQUIRE k\t 1 0", locksm.ErrInvalidKey, "invalid_key"},
		{"ACQUIRE \x80 1 0", locksm.ErrInvalidKey, "invalid_key"},
		{"ACQUIRE " + strings.Repeat("k", 256) + " 1 0", locksm.ErrInvalidKey, "invalid_key"},
		{"ACQUIRE k 0 0", locksm.ErrInvalidLease, "invalid_lease"},
		{"ACQUIRE k 251 0", locksm.ErrInvalidLease, "invalid_lease"},
		{"ACQUIRE k 1.5 0", locksm.ErrInvalidLease, "invalid_lease"},
		{"ACQUIRE k -1 0", locksm.ErrInvalidLease, "invalid_lease"},
		{"ACQUIRE k 99999999999999999999999 0", locksm.ErrInvalidLease, "invalid_lease"},
		{"ACQUIRE k 1 300.001", locksm.ErrInvalidWait, "invalid_wait"},
		{"ACQUIRE k 1 301", locksm.ErrInvalidWait, "invalid_wait"},
		{"ACQUIRE k 1 1.", locksm.ErrInvalidWait, "invalid_wait"},
		{"ACQUIRE k 1 .5", locksm.ErrInvalidWait, "invalid_wait"},
		{"ACQUIRE k 1 0.0001", locksm.ErrInvalidWait, "invalid_wait"},
		{"ACQUIRE k 1 -1", locksm.ErrInvalidWait, "invalid_wait"},
		{"ACQUIRE k 1 1e3", locksm.ErrInvalidWait, "invalid_wait"},
		{"ACQUIRE k 1 inf", locksm.ErrInvalidWait, "invalid_wait"},
		{"RELEASE k 0", ErrInvalidToken, "invalid_token"},
		{"RELEASE k 18446744073709551616", ErrInvalidToken, "invalid_token"},
		{"RELEASE k 99999999999999999999", ErrInvalidToken, "invalid_token"},
		{"RELEASE k 123456789012345678901", ErrInvalidToken, "invalid_token"},
		{"RELEASE k x", ErrInvalidToken, "invalid_token"},
		{"RELEASE k", ErrBadRequest, "bad_request"},
	} {
		_, err := ParseLine([]byte(tc.in))
		if !errors.Is(err, tc.want) {
			t.Errorf("ParseLine(%q) err = %v; want %v", tc.in, err, tc.want)
			continue
		}
		if got := codeOf(err); got != tc.code {
			t.Errorf("ParseLine(%q): code %q, want %q", tc.in, got, tc.code)
		}
		checkReplyLine(t, replyFor(err))
	}
}

// blockKeys returns n distinct keys of l bytes (l >= 1, n <= 52).
func blockKeys(n, l int) []string {
	const first = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	keys := make([]string, n)
	for i := range keys {
		keys[i] = first[i:i+1] + strings.Repeat("~", l-1)
	}
	return keys
}

// longestValidLine is the longest valid request without leading zeros: a
// block of 16 keys of 255 bytes, the longest lease and the longest wait
// (version 6: an hour).
func longestValidLine() string {
	return "ACQUIRE " + strings.Join(blockKeys(16, 255), " ") + " 250 3600.000"
}

// longestShortWaitLine is longestValidLine before version 6 (5 minutes).
func longestShortWaitLine() string {
	return "ACQUIRE " + strings.Join(blockKeys(16, 255), " ") + " 250 300.000"
}

func TestLongestValidLine(t *testing.T) {
	l := longestValidLine()
	if len(l) != maxValidLineLen || maxValidLineLen != 4116 || len(l)+len("\r") > DefaultMaxLineLen {
		t.Fatalf("longest valid line %d bytes, maxValidLineLen %d, limit %d", len(l), maxValidLineLen, DefaultMaxLineLen)
	}
	if r, err := ParseLineVersion([]byte(l), VersionLongWaits); err != nil || r.Wait != MaxWait {
		t.Fatalf("the longest valid line on a version %d connection: %+v, %v", VersionLongWaits, r.Wait, err)
	}
	// One key more still fits in a line (4371 bytes): it is answered
	// invalid_keys, and the connection stays usable.
	l17 := "ACQUIRE " + strings.Join(blockKeys(17, 255), " ") + " 250 300.000"
	if _, err := ParseLine([]byte(l17)); len(l17) > DefaultMaxLineLen || codeOf(err) != "invalid_keys" {
		t.Fatalf("17 keys of 255 bytes, %d bytes: %v", len(l17), err)
	}
}

// Version 6 waits up to an hour; a connection that agreed an older version
// keeps the 5-minute bound, and its error says how to get the longer one.
func TestParseWaitByVersion(t *testing.T) {
	for _, tc := range []struct {
		in      string
		version uint16
		want    time.Duration
		err     bool
	}{
		{"ACQUIRE k 10 300", VersionLabels, MaxShortWait, false},
		{"ACQUIRE k 10 300.001", VersionLabels, 0, true},
		{"ACQUIRE k 10 301", 0, 0, true},
		{"ACQUIRE k 10 3600", VersionLabels, 0, true},
		{"ACQUIRE k 10 301", VersionLongWaits, 301 * time.Second, false},
		{"ACQUIRE k 10 3600", VersionLongWaits, MaxWait, false},
		{"ACQUIRE k 10 3600.000", VersionLongWaits, MaxWait, false},
		{"ACQUIRE k 10 1800.5", VersionLongWaits, 1800500 * time.Millisecond, false},
		{"ACQUIRE a b 10 3599.999", VersionLongWaits, 3599999 * time.Millisecond, false},
		{"ACQUIRE k 10 3600.001", VersionLongWaits, 0, true},
		{"ACQUIRE k 10 3601", VersionLongWaits, 0, true},
		{"ACQUIRE k 10 10000", VersionLongWaits, 0, true},
		{"ACQUIRE k 10 99999", 65535, 0, true},
		{"ACQUIRE k 10 3600 label=x", VersionLongWaits, MaxWait, false},
		{"ACQUIRE k 10 0300", VersionLabels, MaxShortWait, false},
	} {
		r, err := ParseLineVersion([]byte(tc.in), tc.version)
		if tc.err {
			if !errors.Is(err, locksm.ErrInvalidWait) {
				t.Errorf("%q on version %d: %+v, %v; want invalid_wait", tc.in, tc.version, r, err)
			}
			continue
		}
		if err != nil || r.Wait != tc.want {
			t.Errorf("%q on version %d: wait %v, %v; want %v", tc.in, tc.version, r.Wait, err, tc.want)
		}
	}
	_, err := ParseLineVersion([]byte("ACQUIRE k 10 301"), VersionLabels)
	if err == nil || !strings.Contains(err.Error(), "up to 3600 after HELLO 6") {
		t.Errorf("a version 5 connection's long wait: %v; want the error to say how to get one", err)
	}
}

// The version-1 requests parse as version 1 parsed them: an ACQUIRE of one
// key has no Keys, so it is not a block.
func TestParseLineOneKeyIsNotABlock(t *testing.T) {
	r, err := ParseLine([]byte("ACQUIRE seats/42 30 5"))
	if err != nil || r.Block() || r.Keys != nil || r.Key != "seats/42" {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = ParseLine([]byte("ACQUIRE seats/1 seats/2 30 5"))
	if err != nil || !r.Block() || r.Key != "" {
		t.Fatalf("%+v %v", r, err)
	}
}

// checkReplyLine: a reply is one line of visible ASCII and spaces.
func checkReplyLine(t *testing.T, s string) {
	t.Helper()
	if len(s) == 0 || len(s) > 512 {
		t.Fatalf("reply %q: length %d", s, len(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7E {
			t.Fatalf("reply %q has byte 0x%02x", s, s[i])
		}
	}
}

// splitAll feeds data to a splitter in chunks cut at the given offsets and
// returns the lines and the error.
func splitAll(max int, data []byte, cuts ...int) ([]string, error) {
	s := NewLineSplitter(max)
	var lines []string
	prev := 0
	for _, c := range append(cuts, len(data)) {
		if err := s.Feed(data[prev:c], func(l []byte) bool { lines = append(lines, string(l)); return true }); err != nil {
			return lines, err
		}
		prev = c
	}
	return lines, nil
}

// Every request, split at every byte offset (and at every pair of
// offsets), comes out as the same lines and the same requests.
func TestSplitEveryOffset(t *testing.T) {
	stream := []byte("PING\nACQUIRE seats/42 30 2.5\r\nRELEASE seats/42 17\nINFO\nHELD\nACQUIRE x 0 0\n")
	want, err := splitAll(1024, stream)
	if err != nil || len(want) != 6 {
		t.Fatalf("whole: %q %v", want, err)
	}
	for i := 0; i <= len(stream); i++ {
		for j := i; j <= len(stream); j++ {
			got, err := splitAll(1024, stream, i, j)
			if err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
				t.Fatalf("cut at %d,%d: %q %v", i, j, got, err)
			}
		}
	}
	for i, l := range want {
		r, err := ParseLine([]byte(l))
		if (i == 5) != (err != nil) {
			t.Fatalf("line %q: %+v %v", l, r, err)
		}
	}
}

// A stream of version 2 requests with the longest valid line and lines at
// the limit, cut at every byte offset (and at pairs of offsets, every
// 61st), comes out as the same lines and the same requests.
func TestSplitEveryOffsetBlock(t *testing.T) {
	atLimit := "ACQUIRE " + strings.Join(blockKeys(16, 255), " ") + " 250 "
	atLimit += strings.Repeat("0", DefaultMaxLineLen-len(atLimit))
	atLimitCR := atLimit[:DefaultMaxLineLen-1] + "\r"
	stream := []byte("HELLO 2\n" + longestShortWaitLine() + "\r\nACQUIRE a b c 30 2.5\n" + atLimit + "\n" + atLimitCR + "\nPING\n")
	want, err := splitAll(DefaultMaxLineLen, stream)
	if err != nil || len(want) != 6 || len(want[3]) != DefaultMaxLineLen || len(want[4]) != DefaultMaxLineLen {
		t.Fatalf("whole: %d lines, %v", len(want), err)
	}
	same := func(got []string, err error) bool {
		return err == nil && len(got) == len(want) && strings.Join(got, "|") == strings.Join(want, "|")
	}
	for i := 0; i <= len(stream); i++ {
		if got, err := splitAll(DefaultMaxLineLen, stream, i); !same(got, err) {
			t.Fatalf("cut at %d: %d lines, %v", i, len(got), err)
		}
	}
	for i := 0; i <= len(stream); i += 61 {
		for j := i; j <= len(stream); j += 61 {
			if got, err := splitAll(DefaultMaxLineLen, stream, i, j); !same(got, err) {
				t.Fatalf("cut at %d,%d: %d lines, %v", i, j, len(got), err)
			}
		}
	}
	wantReq := []struct {
		verb Verb
		keys int
		err  error
	}{
		{VerbHello, 0, nil}, {VerbAcquire, 16, nil}, {VerbAcquire, 3, nil},
		{0, 0, locksm.ErrInvalidWait}, {0, 0, locksm.ErrInvalidWait}, {VerbPing, 0, nil},
	}
	for i, l := range want {
		r, err := ParseLine([]byte(l))
		if w := wantReq[i]; r.Verb != w.verb || len(r.Keys) != w.keys || !errors.Is(err, w.err) {
			t.Fatalf("line %d (%d bytes): %v keys %d, %v; want %v keys %d, %v", i, len(l), r.Verb, len(r.Keys), err, w.verb, w.keys, w.err)
		}
	}
}

// At the default limit: 16 keys of 255 bytes padded to 4608 bytes are a
// line (the "\r" counts), one byte more is line_too_long, whether or not
// its newline has arrived, wherever the stream is cut.
func TestSplitLineTooLongAtDefaultLimit(t *testing.T) {
	over := "ACQUIRE " + strings.Join(blockKeys(16, 255), " ") + " 250 "
	over += strings.Repeat("0", DefaultMaxLineLen+1-len(over))
	for _, stream := range []string{"PING\n" + over + "\nPING\n", "PING\n" + over, "PING\n" + over[:DefaultMaxLineLen] + "\r\n"} {
		for i := 0; i <= len(stream); i++ {
			lines, err := splitAll(DefaultMaxLineLen, []byte(stream), i)
			if !errors.Is(err, ErrLineTooLong) || len(lines) != 1 || lines[0] != "PING" {
				t.Fatalf("%d-byte stream cut at %d: %d lines, err %v", len(stream), i, len(lines), err)
			}
			checkReplyLine(t, replyFor(err))
		}
	}
}

func TestSplitLineTooLong(t *testing.T) {
	max := 300
	ok := append(bytes.Repeat([]byte("a"), max), '\n')
	long := append(bytes.Repeat([]byte("b"), max+1), '\n')
	stream := append(append([]byte("PING\n"), ok...), long...)
	for i := 0; i <= len(stream); i++ {
		lines, err := splitAll(max, stream, i)
		if !errors.Is(err, ErrLineTooLong) || len(lines) != 2 {
			t.Fatalf("cut at %d: %d lines, err %v", i, len(lines), err)
		}
		if codeOf(err) != "line_too_long" {
			t.Fatalf("code %q", codeOf(err))
		}
		checkReplyLine(t, replyFor(err))
	}
	// The limit is enforced before the newline arrives: memory stays
	// bounded however much a peer sends without one.
	s := NewLineSplitter(max)
	var err error
	for n := 0; err == nil && n < 10*max; n++ {
		err = s.Feed([]byte("x"), func([]byte) bool { return true })
		if s.Buffered() > max {
			t.Fatalf("buffered %d > %d", s.Buffered(), max)
		}
	}
	if !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("no error after 10x max without a newline: %v", err)
	}
}

// The partial-line buffer is not allocated up front, never grows past the
// limit however a line arrives, and one grown for a long line is let go
// when the line ends: an idle connection costs as much after a long line
// as before it.
func TestSplitBufferBounded(t *testing.T) {
	const max = 4608
	s := NewLineSplitter(max)
	if s.held() != 0 {
		t.Fatalf("new splitter holds a %d-byte buffer", s.held())
	}
	nop := func([]byte) bool { return true }
	for _, chunk := range []int{1, 7, 512, 4096, max} {
		line := append(bytes.Repeat([]byte("a"), max), '\n')
		for len(line) > 0 {
			n := min(chunk, len(line))
			if err := s.Feed(line[:n], nop); err != nil {
				t.Fatalf("chunks of %d: %v", chunk, err)
			}
			line = line[n:]
			if s.held() > max {
				t.Fatalf("chunks of %d: a %d-byte buffer for lines of %d", chunk, s.held(), max)
			}
		}
		if s.Buffered() != 0 || s.held() > keepPartialCap {
			t.Fatalf("chunks of %d: after the line, %d bytes buffered in a %d-byte buffer", chunk, s.Buffered(), s.held())
		}
	}
	// A short line split across reads keeps its small buffer for the next.
	for range 3 {
		if err := s.Feed([]byte("PI"), nop); err != nil {
			t.Fatal(err)
		}
		if err := s.Feed([]byte("NG\n"), nop); err != nil {
			t.Fatal(err)
		}
		if s.held() == 0 || s.held() > keepPartialCap {
			t.Fatalf("buffer of %d bytes after a short split line", s.held())
		}
	}
}

// formatRequest writes r in the protocol's canonical form (no leading zeros,
// the shortest wait), the inverse of ParseLine for valid requests.
func formatRequest(r Request) string {
	switch r.Verb {
	case VerbAcquire:
		w := strconv.FormatInt(int64(r.Wait/time.Second), 10)
		if ms := r.Wait % time.Second / time.Millisecond; ms != 0 {
			w += strings.TrimRight(fmt.Sprintf(".%03d", ms), "0")
		}
		keys := r.Key
		if r.Block() {
			keys = strings.Join(r.Keys, " ")
		}
		return fmt.Sprintf("ACQUIRE %s %d %s", keys, r.Lease/time.Second, w)
	case VerbRelease:
		return fmt.Sprintf("RELEASE %s %d", r.Key, r.Token)
	case VerbHello:
		return fmt.Sprintf("HELLO %d", r.Version)
	}
	return r.Verb.String()
}

// FuzzParseLine feeds a byte stream, cut in two at an arbitrary offset, to a
// LineSplitter with the server's line limit and parses every line. The seed
// corpus is in testdata/fuzz/FuzzParseLine: every verb, the longest valid
// lines (a block of 16 keys of 255 bytes), lines at and one byte over the
// limit, blocks of 2, 16 and 17 keys, duplicate keys, HELLO in every form,
// and known-bad shapes.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		"PING\n", "ACQUIRE seats/42 30 2.5\r\n", "RELEASE k 18446744073709551615\n", "INFO\nHELD\n",
		"ACQUIRE k 1 300.000\n", "RELEASE k 18446744073709551616\n", "ACQUIRE  k 1 0\n", "\n\n\r\n",
		"ACQUIRE k\x00 1 0\n", strings.Repeat("A", 400) + "\n", "ACQUIRE k 1 .5\nPING",
		strings.Repeat("A", DefaultMaxLineLen) + "\nPING\n", strings.Repeat("A", DefaultMaxLineLen+1) + "\nPING\n",
		"HELLO 2\nHELLO 1\nHELLO 65535\n", "HELLO 0\nHELLO 65536\nHELLO x\nHELLO 2 3\n",
		"ACQUIRE a b 30 2.5\r\n", "ACQUIRE a b a 1 0\n", "ACQUIRE " + strings.Join(blockKeys(17, 1), " ") + " 1 0\n",
		longestValidLine() + "\r\nPING\n", "ACQUIRE " + strings.Join(blockKeys(16, 1), " ") + " 1 0\n",
	} {
		f.Add([]byte(s), uint16(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		const max = DefaultMaxLineLen
		c := int(cut) % (len(data) + 1)
		s := NewLineSplitter(max)
		var lines [][]byte
		check := func(l []byte) bool {
			lines = append(lines, bytes.Clone(l))
			if len(l) > max || bytes.IndexByte(l, '\n') >= 0 {
				t.Fatalf("line of %d bytes with newline=%v", len(l), bytes.IndexByte(l, '\n') >= 0)
			}
			r, err := ParseLine(l)
			if err != nil {
				if !reflect.DeepEqual(r, Request{}) {
					t.Fatalf("error with a request: %+v", r)
				}
				checkReplyLine(t, replyFor(err))
				return true
			}
			// A valid request respects every limit of the protocol.
			if r.Lease < 0 || r.Lease > 250*time.Second || r.Wait < 0 || r.Wait > MaxWait || len(r.Key) > locksm.MaxKeyLen {
				t.Fatalf("out of range: %+v", r)
			}
			if r.Block() {
				if r.Verb != VerbAcquire || r.Key != "" || len(r.Keys) < locksm.MinBlockKeys || len(r.Keys) > locksm.MaxBlockKeys {
					t.Fatalf("bad block: %+v", r)
				}
				for i, k := range r.Keys {
					if locksm.ValidateKey(k) != nil || slices.Contains(r.Keys[:i], k) {
						t.Fatalf("invalid or duplicate key %q accepted: %+v", k, r)
					}
				}
			} else if (r.Verb == VerbAcquire || r.Verb == VerbRelease) && locksm.ValidateKey(r.Key) != nil {
				t.Fatalf("invalid key accepted: %+v", r)
			}
			if (r.Verb == VerbHello) != (r.Version != 0) {
				t.Fatalf("version %d with %v", r.Version, r.Verb)
			}
			if r.Verb == VerbRelease && r.Token == 0 {
				t.Fatalf("token 0 accepted: %+v", r)
			}
			// Round trip: the canonical form of what was parsed parses
			// to the same request and fits in a line.
			canon := formatRequest(r)
			if len(canon) > maxValidLineLen {
				t.Fatalf("canonical form of %q is %d bytes", l, len(canon))
			}
			if r2, err := ParseLine([]byte(canon)); err != nil || !reflect.DeepEqual(r2, r) {
				t.Fatalf("%q parsed as %+v; its canonical form %q parsed as %+v, %v", l, r, canon, r2, err)
			}
			return true
		}
		err := s.Feed(data[:c], check)
		if err == nil {
			if s.Buffered() > max {
				t.Fatalf("buffered %d", s.Buffered())
			}
			err = s.Feed(data[c:], check)
			if s.Buffered() > max {
				t.Fatalf("buffered %d", s.Buffered())
			}
		}
		// Differential check against bytes.Split: the splitter hands
		// over exactly the segments before the first over-long one, and
		// fails if and only if there is one (the unterminated tail
		// counts as soon as it is over the limit).
		segs := bytes.Split(data, []byte("\n"))
		tail := segs[len(segs)-1]
		segs = segs[:len(segs)-1]
		want := len(segs)
		for i, seg := range segs {
			if len(seg) > max {
				want = i
				break
			}
		}
		tooLong := want < len(segs) || len(tail) > max
		if tooLong != (err != nil) {
			t.Fatalf("over-long line: %v, error: %v", tooLong, err)
		}
		if err != nil {
			if !errors.Is(err, ErrLineTooLong) {
				t.Fatalf("splitter error %v", err)
			}
			checkReplyLine(t, replyFor(err))
		} else if s.Buffered() != len(tail) {
			t.Fatalf("buffered %d, unterminated tail %d", s.Buffered(), len(tail))
		}
		if len(lines) != want {
			t.Fatalf("%d lines, want %d", len(lines), want)
		}
		for i := range lines {
			if !bytes.Equal(lines[i], segs[i]) {
				t.Fatalf("line %d: %q, want %q", i, lines[i], segs[i])
			}
		}
	})
}

// The event lines a version-9 client reads for a revoked block (REVOKED,
// whose reason holds spaces, then LOST), between replies, split at every
// byte offset (and at every pair of offsets), come out as the same lines
// and parse as the same events.
func TestSplitEveryOffsetRevokedEvents(t *testing.T) {
	stream := []byte("OK 41\n! REVOKED 41 ops@host stuck  holder, see INC-7\n! LOST 41 revoked job-1 b a\n! REVOKED 42 ops\n! LOST 42 revoked - k\nPONG\n")
	want, err := splitAll(DefaultMaxLineLen, stream)
	if err != nil || len(want) != 6 {
		t.Fatalf("whole: %q %v", want, err)
	}
	for i := 0; i <= len(stream); i++ {
		for j := i; j <= len(stream); j++ {
			got, err := splitAll(DefaultMaxLineLen, stream, i, j)
			if err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
				t.Fatalf("cut at %d,%d: %q %v", i, j, got, err)
			}
		}
	}
	wantEv := []Event{
		{},
		{Name: EventRevoked, Token: 41, By: "ops@host", Why: "stuck  holder, see INC-7"},
		{Name: EventLost, Token: 41, Reason: "revoked", Label: "job-1", Keys: []string{"b", "a"}},
		{Name: EventRevoked, Token: 42, By: "ops"},
		{Name: EventLost, Token: 42, Reason: "revoked", Keys: []string{"k"}},
		{},
	}
	for i, l := range want {
		if !IsEvent([]byte(l)) {
			if wantEv[i].Name != "" {
				t.Fatalf("line %d %q is not an event", i, l)
			}
			continue
		}
		ev, err := ParseEventVersion([]byte(l), VersionRevoke)
		w := wantEv[i]
		if err != nil || ev.Name != w.Name || ev.Token != w.Token || ev.By != w.By || ev.Why != w.Why || ev.Reason != w.Reason ||
			ev.Label != w.Label || strings.Join(ev.Keys, " ") != strings.Join(w.Keys, " ") {
			t.Fatalf("line %d %q: %+v %v, want %+v", i, l, ev, err, w)
		}
	}
}
