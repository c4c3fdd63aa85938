package unixapi

import (
	"bytes"
	"fmt"
	"strconv"
	"time"

	"ticketing/locksm"
)

// This file is the protocol's parser, kept free of sockets, locks and
// goroutines so it can be tested byte by byte and fuzzed: LineSplitter turns
// a byte stream into lines with a bounded buffer, ParseLine turns one line
// into a Request.

// Protocol limits.
const (
	// ProtocolVersion is the version of the protocol this package speaks
	// (PROTOCOL.md): version 2 added the multi-key ACQUIRE (a seat block),
	// HELLO and the longer line limit; version 3 EXTEND, HELLO's events
	// option and the LOST event lines it turns on; version 4 the QUEUED
	// event; version 5 owner labels (ACQUIRE's label= field, HELD and LOST
	// with labels); version 6 waits up to an hour; version 7 the POSITION
	// event; version 8 semaphores (the PERMIT and PERMITS verbs, OK
	// <token> <slot>); version 9 the REVOKED event (who revoked a lock
	// and why, before its LOST line). HELLO answers the lower of it and
	// the client's version; INFO reports it as protocol=.
	ProtocolVersion = 9
	// VersionEvents is the first version with EXTEND and events.
	VersionEvents = 3
	// VersionQueued is the first version with the QUEUED event.
	VersionQueued = 4
	// VersionLabels is the first version with owner labels: ACQUIRE may
	// end with a label= field, and HELD and LOST show each lock's label.
	// Only a connection whose latest HELLO agreed it speaks it.
	VersionLabels = 5
	// VersionLongWaits is the first version whose ACQUIRE may wait longer
	// than MaxShortWait, up to MaxWait. A connection whose latest HELLO
	// agreed an older version gets invalid_wait above MaxShortWait, as
	// before.
	VersionLongWaits = 6
	// VersionPositions is the first version with the POSITION event: a
	// waiting ACQUIRE's place in line, written only when the latest HELLO
	// agreed it with events.
	VersionPositions = 7
	// VersionSemaphores is the first version with the PERMIT and
	// PERMITS verbs. The verbs are the opt-in: a client that sends
	// neither sees nothing new, so they are taken on any connection.
	VersionSemaphores = 8
	// VersionRevoke is the first version with the REVOKED event: on a
	// connection whose latest HELLO agreed it with events, the LOST line
	// of a lock an operator revoked (reason "revoked", which every
	// version's LOST line names) is preceded by one REVOKED line that
	// says who revoked it and why.
	VersionRevoke = 9
	// LabelField begins ACQUIRE's label field (version 5).
	LabelField = "label="
	// NoLabel stands for "no label" where a label has a place (HELD and
	// LOST of version 5); it is not a label an ACQUIRE may carry.
	NoLabel = "-"
	// DefaultMaxLineLen is the longest request line in bytes, the "\n"
	// excluded (a "\r" before it counts). The longest valid request of
	// version 2, an ACQUIRE of a block of locksm.MaxBlockKeys keys of 255
	// bytes with the lease "250" and the wait "300.000", is
	// 8+16*255+15+12 = 4115 bytes, so 4608 leaves room for future optional
	// fields (version 5's label field adds at most 1+6+64 = 71, version
	// 6's wait "3600.000" one byte). (Version 1's limit was 1024: its longest request, a RELEASE
	// with a 255-byte key and a 20-digit token, is 284 bytes.) A
	// LineSplitter does not allocate the limit up front.
	DefaultMaxLineLen = 4608
	// MaxWait is the longest wait an ACQUIRE may ask for (version 6: an
	// hour).
	MaxWait = locksm.MaxWaitMs * time.Millisecond
	// MaxShortWait is the longest wait before version 6 (5 minutes).
	MaxShortWait = locksm.MaxShortWaitMs * time.Millisecond
	// snippetLen bounds how much of the offending input an error quotes.
	snippetLen = 32
	// maxFields is the most fields a valid request has: ACQUIRE, its
	// keys, the lease, the wait and (version 5) the label.
	maxFields = 1 + locksm.MaxBlockKeys + 2 + 1
	// maxValidLineLen is the length of the longest valid request line
	// without leading zeros and "\r": "ACQUIRE " + 16 keys of 255 bytes
	// and the 15 spaces between them + " 250 3600.000".
	maxValidLineLen = len("ACQUIRE ") + locksm.MaxBlockKeys*locksm.MaxKeyLen + locksm.MaxBlockKeys - 1 + len(" 250 3600.000")
)

// Verb is a request verb.
type Verb uint8

// The verbs of the protocol.
const (
	VerbPing Verb = iota + 1
	VerbAcquire
	VerbRelease
	VerbInfo
	VerbHeld
	VerbHello  // version 2
	VerbExtend // version 3
	// VerbPermit takes one permit of a semaphore key; VerbPermits sets a
	// key's number of permits (version 8).
	VerbPermit
	VerbPermits
)

var verbNames = map[string]Verb{
	"PING": VerbPing, "ACQUIRE": VerbAcquire, "RELEASE": VerbRelease, "INFO": VerbInfo, "HELD": VerbHeld, "HELLO": VerbHello,
	"EXTEND": VerbExtend, "PERMIT": VerbPermit, "PERMITS": VerbPermits,
}

// String returns the verb as it appears on the wire.
func (v Verb) String() string {
	for name, x := range verbNames {
		if x == v {
			return name
		}
	}
	return "?"
}

// Request is one parsed request line.
type Request struct {
	Verb Verb
	// Key is the key of a RELEASE and of an ACQUIRE of one key. It is ""
	// for an ACQUIRE of a block (Keys), so code that knows only one key
	// cannot take a block for its first key.
	Key string
	// Keys are the keys of an ACQUIRE of a block (a seat block, granted
	// all or none under one token): locksm.MinBlockKeys..MaxBlockKeys
	// distinct keys, in request order. nil for every other request, an
	// ACQUIRE of one key included (its Request is what version 1 parsed).
	Keys    []string
	Lease   time.Duration // ACQUIRE, EXTEND: whole seconds, 1..250 s
	Wait    time.Duration // ACQUIRE: milliseconds, 0..MaxWait
	Token   uint64        // RELEASE, EXTEND
	Version uint16        // HELLO: the client's version, 1..65535
	// Events: HELLO named the events option (version 3: LOST lines on).
	Events bool
	// Label is an ACQUIRE's or PERMIT's owner label (version 5; "" =
	// none).
	Label string
	// Permits is a PERMITS's n: 0..locksm.MaxPermits (0 removes an idle
	// semaphore).
	Permits uint32
}

// Block reports whether r is an ACQUIRE of a block (more than one key).
func (r Request) Block() bool { return len(r.Keys) > 0 }

// ParseLine parses one request line, without its "\n" (a trailing "\r" is
// tolerated), as versions 1–4 read it (no labels). Errors wrap one of the
// sentinels above or a locksm field sentinel, and quote at most a short
// snippet of the input.
func ParseLine(line []byte) (Request, error) { return ParseLineVersion(line, VersionQueued) }

// ParseLineVersion is ParseLine for a connection that agreed version: from
// VersionLabels on, an ACQUIRE whose last field starts with LabelField
// carries that label; from VersionLongWaits on, its wait may be up to
// MaxWait (before, MaxShortWait). The label comes after the wait, the one place no key
// can be (the wait is digits), so no key is ever taken for a label, and a
// line that older versions read (they answer it invalid_wait) keeps its
// meaning for them.
func ParseLineVersion(line []byte, version uint16) (Request, error) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) == 0 {
		return Request{}, fmt.Errorf("%w: empty line", ErrBadRequest)
	}
	// f holds the first maxFields fields; n counts them all, so a line
	// with more (which no request has) is still told apart by its count.
	var f [maxFields][]byte
	n := 0
	for rest := line; ; {
		i := bytes.IndexByte(rest, ' ')
		field := rest
		if i >= 0 {
			field = rest[:i]
		}
		if len(field) == 0 {
			return Request{}, fmt.Errorf("%w: fields must be separated by exactly one space: %s", ErrBadRequest, snippet(line))
		}
		if n < len(f) {
			f[n] = field
		}
		n++
		if i < 0 {
			break
		}
		rest = rest[i+1:]
	}
	verb, ok := verbNames[string(f[0])]
	if !ok {
		return Request{}, fmt.Errorf("%w: %s (verbs are PING, ACQUIRE, RELEASE, EXTEND, INFO, HELD, HELLO, PERMIT, PERMITS; upper case)", ErrUnknownVerb, snippet(f[0]))
	}
	r := Request{Verb: verb}
	var err error
	switch verb {
	case VerbAcquire:
		var label string
		if version >= VersionLabels && n <= len(f) && bytes.HasPrefix(f[n-1], []byte(LabelField)) && n > 1 {
			if label, err = parseLabel(f[n-1][len(LabelField):]); err != nil {
				return Request{}, err
			}
			n--
		}
		r, err := parseAcquire(line, f[:min(n, len(f))], n, version)
		r.Label = label
		return r, err
	case VerbPermit:
		// PERMIT <key> <lease> <wait> [label=<label>]: one key, never a
		// block (a semaphore's permit is one of n, not a set of seats).
		var label string
		if n <= len(f) && n > 1 && bytes.HasPrefix(f[n-1], []byte(LabelField)) {
			if label, err = parseLabel(f[n-1][len(LabelField):]); err != nil {
				return Request{}, err
			}
			n--
		}
		if n != 4 {
			return Request{}, fmt.Errorf("%w: PERMIT takes a key, a lease, a wait and optionally a label, got %d arguments", ErrBadRequest, n-1)
		}
		r, err := parseAcquire(line, f[:n], n, max(version, VersionLongWaits))
		r.Verb, r.Label = VerbPermit, label
		return r, err
	case VerbPermits:
		if n != 3 {
			return Request{}, arity(verb, 2, n)
		}
		if r.Key, err = parseKey(f[1]); err != nil {
			return Request{}, err
		}
		v, ok := digits(f[2], 6)
		if !ok || v > locksm.MaxPermits {
			return Request{}, fmt.Errorf("%w: %s (a decimal number 0..%d)", locksm.ErrInvalidPermits, snippet(f[2]), locksm.MaxPermits)
		}
		r.Permits = uint32(v)
	case VerbRelease:
		if n != 3 {
			return Request{}, arity(verb, 2, n)
		}
		if r.Key, err = parseKey(f[1]); err != nil {
			return Request{}, err
		}
		if r.Token, err = parseToken(f[2]); err != nil {
			return Request{}, err
		}
	case VerbExtend:
		if n != 4 {
			return Request{}, arity(verb, 3, n)
		}
		if r.Key, err = parseKey(f[1]); err != nil {
			return Request{}, err
		}
		if r.Token, err = parseToken(f[2]); err != nil {
			return Request{}, err
		}
		if r.Lease, err = parseLease(f[3]); err != nil {
			return Request{}, err
		}
	case VerbHello:
		if n != 2 && n != 3 {
			return Request{}, fmt.Errorf("%w: HELLO takes a version and optionally \"events\", got %d arguments", ErrBadRequest, n-1)
		}
		v, ok := digits(f[1], 5)
		if !ok || v < 1 || v > 65535 {
			return Request{}, fmt.Errorf("%w: HELLO version %s (a decimal number 1..65535)", ErrBadRequest, snippet(f[1]))
		}
		r.Version = uint16(v)
		if n == 3 {
			if string(f[2]) != HelloEvents {
				return Request{}, fmt.Errorf("%w: HELLO option %s (the one option is %q)", ErrBadRequest, snippet(f[2]), HelloEvents)
			}
			r.Events = true
		}
	default: // PING, INFO, HELD
		if n != 1 {
			return Request{}, arity(verb, 0, n)
		}
	}
	return r, nil
}

func arity(verb Verb, want, n int) error {
	return fmt.Errorf("%w: %s takes %d arguments, got %d", ErrBadRequest, verb, want, n-1)
}

// parseAcquire parses "ACQUIRE <key> [<key> ...] <lease> <wait>": the
// field count decides, the last two fields are the lease and the wait and
// every field before them a key. f holds the first fields of the line (all
// of them when n <= maxFields), n is how many the line has; version, the
// connection's, bounds the wait.
func parseAcquire(line []byte, f [][]byte, n int, version uint16) (Request, error) {
	nkeys := n - 3
	switch {
	case nkeys < 1:
		return Request{}, fmt.Errorf("%w: ACQUIRE takes 1..%d keys, a lease and a wait, got %d arguments", ErrBadRequest, locksm.MaxBlockKeys, n-1)
	case nkeys > locksm.MaxBlockKeys:
		return Request{}, fmt.Errorf("%w: %d keys, at most %d in one ACQUIRE: %s", locksm.ErrInvalidBlock, nkeys, locksm.MaxBlockKeys, snippet(line))
	}
	r := Request{Verb: VerbAcquire}
	keys := f[1 : 1+nkeys]
	for i, k := range keys {
		if err := checkKey(k); err != nil {
			return Request{}, err
		}
		for _, prev := range keys[:i] {
			if bytes.Equal(prev, k) {
				return Request{}, fmt.Errorf("%w: key %s named twice (a block's keys are distinct)", locksm.ErrInvalidBlock, snippet(k))
			}
		}
	}
	var err error
	if r.Lease, err = parseLease(f[n-2]); err != nil {
		return Request{}, err
	}
	maxWait := MaxShortWait
	if version >= VersionLongWaits {
		maxWait = MaxWait
	}
	if r.Wait, err = parseWait(f[n-1], maxWait); err != nil {
		return Request{}, err
	}
	if nkeys == 1 {
		r.Key = string(keys[0])
		return r, nil
	}
	r.Keys = make([]string, nkeys)
	for i, k := range keys {
		r.Keys[i] = string(k)
	}
	return r, nil
}

// parseLabel checks an ACQUIRE's label: locksm's constraints
// (1..MaxLabelLen bytes of 0x21..0x7E; the field is omitted for none), and
// not NoLabel, which stands for none where HELD and LOST show labels.
func parseLabel(b []byte) (string, error) {
	switch {
	case len(b) == 0:
		return "", fmt.Errorf("%w: empty label (omit the field for none)", locksm.ErrInvalidLabel)
	case string(b) == NoLabel:
		return "", fmt.Errorf("%w: %q stands for no label (omit the field for none)", locksm.ErrInvalidLabel, NoLabel)
	case len(b) > locksm.MaxLabelLen:
		return "", fmt.Errorf("%w: %d bytes, at most %d", locksm.ErrInvalidLabel, len(b), locksm.MaxLabelLen)
	}
	for _, c := range b {
		if c < 0x21 || c > 0x7E {
			return "", fmt.Errorf("%w: byte 0x%02x in %s (labels are visible ASCII 0x21..0x7E)", locksm.ErrInvalidLabel, c, snippet(b))
		}
	}
	return string(b), nil
}

// parseKey checks the key constraints of locksm (1..255 bytes of 0x21..0x7E)
// here, so a bad key never costs a round trip to the cluster.
func parseKey(b []byte) (string, error) {
	if err := checkKey(b); err != nil {
		return "", err
	}
	return string(b), nil
}

// checkKey is parseKey without the copy. The caller has made sure b is not
// empty (ParseLine refuses empty fields).
func checkKey(b []byte) error {
	if len(b) > locksm.MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, at most %d", locksm.ErrInvalidKey, len(b), locksm.MaxKeyLen)
	}
	for _, c := range b {
		if c < 0x21 || c > 0x7E {
			return fmt.Errorf("%w: byte 0x%02x in %s (keys are visible ASCII 0x21..0x7E)", locksm.ErrInvalidKey, c, snippet(b))
		}
	}
	return nil
}

func parseLease(b []byte) (time.Duration, error) {
	v, ok := digits(b, 3)
	if !ok || v < locksm.MinLeaseSec || v > locksm.MaxLeaseSec {
		return 0, fmt.Errorf("%w: %s (whole seconds %d..%d)", locksm.ErrInvalidLease, snippet(b), locksm.MinLeaseSec, locksm.MaxLeaseSec)
	}
	return time.Duration(v) * time.Second, nil
}

// parseWait accepts DIGITS or DIGITS "." 1*3DIGIT: seconds down to
// milliseconds, without signs, exponents or rounding, so two clients that
// send the same text always mean the same wait. maxWait is the version's
// bound (MaxShortWait, or MaxWait from version 6).
func parseWait(b []byte, maxWait time.Duration) (time.Duration, error) {
	bad := func() (time.Duration, error) {
		if maxWait < MaxWait {
			return 0, fmt.Errorf("%w: %s (seconds 0..%d, up to 3 decimals, e.g. 2.5; up to %d after HELLO %d)", locksm.ErrInvalidWait,
				snippet(b), int(maxWait/time.Second), int(MaxWait/time.Second), VersionLongWaits)
		}
		return 0, fmt.Errorf("%w: %s (seconds 0..%d, up to 3 decimals, e.g. 2.5)", locksm.ErrInvalidWait, snippet(b), int(maxWait/time.Second))
	}
	whole, frac, dot := bytes.Cut(b, []byte("."))
	sec, ok := digits(whole, 4)
	if !ok {
		return bad()
	}
	var ms uint64
	if dot {
		if len(frac) == 0 || len(frac) > 3 {
			return bad()
		}
		f, ok := digits(frac, 3)
		if !ok {
			return bad()
		}
		for i := len(frac); i < 3; i++ {
			f *= 10
		}
		ms = f
	}
	d := time.Duration(sec)*time.Second + time.Duration(ms)*time.Millisecond
	if d > maxWait {
		return bad()
	}
	return d, nil
}

func parseToken(b []byte) (uint64, error) {
	v, ok := digits(b, 20)
	if ok && len(b) == 20 {
		// 20 digits may overflow u64; let strconv decide.
		var err error
		v, err = strconv.ParseUint(string(b), 10, 64)
		ok = err == nil
	}
	if !ok || v == 0 {
		return 0, fmt.Errorf("%w: %s (a decimal number 1..18446744073709551615)", ErrInvalidToken, snippet(b))
	}
	return v, nil
}

// digits parses 1..max ASCII digits. For max < 20 the value cannot
// overflow; for max == 20 the caller re-checks 20-digit values.
func digits(b []byte, max int) (uint64, bool) {
	if len(b) == 0 || len(b) > max {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, true
}

// snippet quotes at most snippetLen bytes of b for an error message, with
// every byte outside visible ASCII escaped, so a reply line can never carry
// a newline or a control byte from the input.
func snippet(b []byte) string {
	cut := len(b) > snippetLen
	if cut {
		b = b[:snippetLen]
	}
	s := strconv.QuoteToASCII(string(b))
	if cut {
		s += "..."
	}
	return s
}

// LineSplitter cuts a byte stream into lines of at most max bytes (the "\n"
// excluded). It buffers at most one partial line, so its memory is bounded
// by max whatever the peer sends. Its buffer is not allocated up front: it
// grows with the partial line it holds, never past max bytes, and one grown
// past keepPartialCap is let go when its line ends, so an idle connection
// costs the same after a long line as before it. The zero value is not
// usable; use NewLineSplitter.
type LineSplitter struct {
	max     int
	partial []byte // bytes of the current line not yet terminated
}

// keepPartialCap is the largest partial-line buffer a LineSplitter keeps
// between lines (version 1's whole line limit); a bigger one, grown for a
// long line, is dropped once that line is handed over.
const keepPartialCap = 1024

// NewLineSplitter returns a splitter for lines of at most max bytes.
func NewLineSplitter(max int) *LineSplitter {
	return &LineSplitter{max: max}
}

// Feed consumes p and calls fn with every line it completes, in order. The
// slice passed to fn is only valid during the call. If a line exceeds the
// limit, Feed stops and returns an error wrapping ErrLineTooLong; the
// splitter must not be fed again (the stream cannot be resynchronised). If
// fn returns false, Feed stops and returns nil; the rest of p is dropped.
func (s *LineSplitter) Feed(p []byte, fn func(line []byte) bool) error {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(s.partial)+len(p) > s.max {
				return s.tooLong(p)
			}
			s.hold(p)
			return nil
		}
		if len(s.partial)+i > s.max {
			return s.tooLong(p[:i])
		}
		line := p[:i]
		if len(s.partial) > 0 {
			s.hold(line)
			line = s.partial
		}
		p = p[i+1:]
		ok := fn(line)
		if cap(s.partial) > keepPartialCap {
			s.partial = nil
		} else {
			s.partial = s.partial[:0]
		}
		if !ok {
			return nil
		}
	}
	return nil
}

// hold appends p to the partial line; the caller checked that the result
// is at most max bytes. The buffer at least doubles when it grows (so a
// line dribbled byte by byte costs O(n) copies) but is capped at max.
func (s *LineSplitter) hold(p []byte) {
	need := len(s.partial) + len(p)
	if need > cap(s.partial) {
		buf := make([]byte, len(s.partial), min(max(need, 2*cap(s.partial)), s.max))
		copy(buf, s.partial)
		s.partial = buf
	}
	s.partial = append(s.partial, p...)
}

// Buffered reports how many bytes of an unterminated line are held.
func (s *LineSplitter) Buffered() int { return len(s.partial) }

// held reports the capacity of the partial-line buffer (tests).
func (s *LineSplitter) held() int { return cap(s.partial) }

func (s *LineSplitter) tooLong(p []byte) error {
	head := s.partial
	if len(head) < snippetLen {
		head = append(head[:len(head):len(head)], p[:min(len(p), snippetLen)]...)
	}
	return fmt.Errorf("%w: a line longer than %d bytes, starting %s", ErrLineTooLong, s.max, snippet(head))
}
