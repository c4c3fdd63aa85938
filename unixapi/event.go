package unixapi

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"ticketing/locksm"
)

// Events are the lines the sidecar writes on its own, answering no
// request (PROTOCOL.md, "Events"). Every event line starts with EventPrefix,
// "! ", which no reply ever starts with, so a client that matches replies
// by position sets event lines aside before counting: it must never count
// one as a reply. They are written only on a connection whose HELLO named
// the events option, always as whole lines between reply lines.
//
//	! LOST <token> <reason> <key> [<key> ...]
//
// A held lock ended without this connection's RELEASE: reason is
// "expired" (its lease ran out and the cluster committed the expiry),
// "moved" (an EXTEND of it was answered not_held, token_mismatch or
// owner_mismatch by the cluster: the key is not held under the token any
// more), "compensated" (the sidecar released it itself: it is shutting
// down, or the connection is ending), or "revoked" (an operator revoked
// it through a node's admin port and the cluster committed the revoke). The keys are every key of the lock
// (a block's, in the order asked). After it the connection no longer holds
// the lock: HELD omits it, RELEASE and EXTEND of it answer not_held.
//
// From version 5 (owner labels) the lock's label comes before its keys,
// NoLabel ("-") for none, so the keys stay the last fields:
//
//	! LOST <token> <reason> <label> <key> [<key> ...]
//
//	! QUEUED <n> <key> [<key> ...]
//
// (version 4) The cluster committed the connection's n-th request line, an
// ACQUIRE of those keys, into the keys' FIFO queues; its reply still
// follows, after this line. Written only when the latest HELLO agreed
// version 4 or later with events.
//
//	! POSITION <n> <position> <estimate-seconds|-> <key>
//
// (version 7) The connection's n-th request line, a waiting ACQUIRE,
// stands at position (1 = next) in key's line, as the cluster's leader
// counted it; it expects to wait about estimate-seconds (whole seconds,
// rounded up), "-" when the leader cannot tell yet. A block gets one
// line per key. Written only before the ACQUIRE's reply, when the latest
// HELLO agreed version 7 or later with events.
//
//	! REVOKED <token> <by>[ <why>]
//
// (version 9) The lock of token was revoked by an operator: by is who (an
// owner id: 1..128 bytes 0x21..0x7e), why their reason, the rest of the
// line (1..128 bytes 0x20..0x7e, never starting or ending with a space;
// omitted with its space when the operator gave none). It comes right
// before that lock's LOST line (reason "revoked"), exactly once, when the
// latest HELLO agreed version 9 or later with events.
const (
	// EventPrefix begins every event line and no reply line.
	EventPrefix = "! "
	// HelloEvents is HELLO's option that turns event lines on.
	HelloEvents = "events"
	// EventLost is the one event of version 3.
	EventLost = "LOST"
	// EventQueued is the event version 4 added.
	EventQueued = "QUEUED"
	// EventPosition is the event version 7 added.
	EventPosition = "POSITION"
	// EventRevoked is the event version 9 added.
	EventRevoked = "REVOKED"
	// NoEstimate stands for an unknown estimate in a POSITION line.
	NoEstimate = "-"
)

// LostReasons are the reasons a LOST event may name (version 3). A client
// treats an unknown reason as a loss all the same.
// "revoked" came with cluster revokes; every events version writes it
// (version 9 adds the REVOKED line before it).
var LostReasons = []string{"expired", "moved", "compensated", "revoked"}

// Event is one parsed event line.
type Event struct {
	Name   string // EventLost, EventQueued, EventPosition, EventRevoked
	Token  uint64 // LOST, REVOKED
	Reason string // LOST
	// By is REVOKED's operator id (who revoked the lock), Why their
	// reason ("" for none).
	By, Why string
	// N is QUEUED's and POSITION's request position: the ACQUIRE was
	// the N-th request line read on the connection (1-based, every line
	// counts).
	N uint64
	// Position is POSITION's place in line (1 = next), EstimateSec its
	// estimate in whole seconds (-1: unknown, "-"); Keys holds its one
	// key.
	Position    uint64
	EstimateSec int64
	Keys        []string // LOST, QUEUED
	// Label is a LOST lock's label (version 5; "" for none, and always
	// "" before version 5).
	Label string
}

// FormatLost is the LOST event line for a lock (without "\n").
func FormatLost(token uint64, reason string, keys []string) string {
	return formatLost(token, reason, "", false, keys)
}

// FormatLostLabel is the LOST event line of version 5: with the lock's
// label ("" = none, written NoLabel) before its keys.
func FormatLostLabel(token uint64, reason, label string, keys []string) string {
	if label == "" {
		label = NoLabel
	}
	return formatLost(token, reason, label, true, keys)
}

func formatLost(token uint64, reason, label string, withLabel bool, keys []string) string {
	var b strings.Builder
	b.WriteString(EventPrefix + EventLost + " ")
	b.WriteString(strconv.FormatUint(token, 10))
	b.WriteByte(' ')
	b.WriteString(reason)
	if withLabel {
		b.WriteByte(' ')
		b.WriteString(label)
	}
	for _, k := range keys {
		b.WriteByte(' ')
		b.WriteString(k)
	}
	return b.String()
}

// FormatRevoked is the REVOKED event line (version 9) of the lock of
// token, revoked by by for why ("": none, written without its space);
// without "\n". by and why must be valid (locksm.ValidateOwner,
// locksm.ValidateReason): the sidecar's Loss promises them.
func FormatRevoked(token uint64, by, why string) string {
	line := EventPrefix + EventRevoked + " " + strconv.FormatUint(token, 10) + " " + by
	if why != "" {
		line += " " + why
	}
	return line
}

// FormatQueued is the QUEUED event line for the n-th request of a
// connection, an ACQUIRE of keys (without "\n").
func FormatQueued(n uint64, keys []string) string {
	var b strings.Builder
	b.WriteString(EventPrefix + EventQueued + " ")
	b.WriteString(strconv.FormatUint(n, 10))
	for _, k := range keys {
		b.WriteByte(' ')
		b.WriteString(k)
	}
	return b.String()
}

// FormatPosition is the POSITION event line for the n-th request of a
// connection, waiting at position in key's line with an estimate (known:
// false writes NoEstimate), in whole seconds rounded up (without "\n").
func FormatPosition(n uint64, position uint32, estimate time.Duration, known bool, key string) string {
	est := NoEstimate
	if known {
		est = strconv.FormatInt(int64((max(estimate, 0)+time.Second-1)/time.Second), 10)
	}
	return EventPrefix + EventPosition + " " + strconv.FormatUint(n, 10) + " " + strconv.FormatUint(uint64(position), 10) +
		" " + est + " " + key
}

// IsEvent reports whether line (without its "\n") is an event line.
func IsEvent(line []byte) bool { return bytes.HasPrefix(line, []byte(EventPrefix)) }

// ParseEvent parses one event line (without its "\n") as versions 3 and 4
// write it. Errors wrap ErrBadRequest and quote a snippet; an event of a
// later version (another name) parses with only Name set, so a client can
// skip it.
func ParseEvent(line []byte) (Event, error) { return ParseEventVersion(line, VersionQueued) }

// ParseEventVersion is ParseEvent on a connection that agreed version:
// from VersionLabels on, LOST carries the lock's label before its keys.
// REVOKED (version 9), whose reason is the rest of the line, parses at
// every version.
func ParseEventVersion(line []byte, version uint16) (Event, error) {
	if !IsEvent(line) {
		return Event{}, fmt.Errorf("%w: not an event line: %s", ErrBadRequest, snippet(line))
	}
	if rest, ok := bytes.CutPrefix(line[len(EventPrefix):], []byte(EventRevoked)); ok && (len(rest) == 0 || rest[0] == ' ') {
		return parseRevoked(line, rest)
	}
	f := bytes.Split(line[len(EventPrefix):], []byte(" "))
	for _, x := range f {
		if len(x) == 0 {
			return Event{}, fmt.Errorf("%w: event fields must be separated by exactly one space: %s", ErrBadRequest, snippet(line))
		}
	}
	ev := Event{Name: string(f[0])}
	switch ev.Name {
	case EventLost:
	case EventQueued:
		return parseQueued(line, f)
	case EventPosition:
		return parsePosition(line, f)
	default:
		return ev, nil
	}
	labelled := version >= VersionLabels
	if labelled {
		if len(f) < 5 || len(f) > 4+locksm.MaxBlockKeys {
			return Event{}, fmt.Errorf("%w: LOST takes a token, a reason, a label and 1..%d keys: %s", ErrBadRequest, locksm.MaxBlockKeys, snippet(line))
		}
		if string(f[3]) != NoLabel {
			l, err := parseLabel(f[3])
			if err != nil {
				return Event{}, fmt.Errorf("%w: LOST label: %w", ErrBadRequest, err)
			}
			ev.Label = l
		}
		f = slices.Delete(f, 3, 4)
	}
	if len(f) < 4 || len(f) > 3+locksm.MaxBlockKeys {
		return Event{}, fmt.Errorf("%w: LOST takes a token, a reason and 1..%d keys: %s", ErrBadRequest, locksm.MaxBlockKeys, snippet(line))
	}
	var err error
	if ev.Token, err = parseToken(f[1]); err != nil {
		return Event{}, fmt.Errorf("%w: LOST token: %w", ErrBadRequest, err)
	}
	ev.Reason = string(f[2])
	for _, r := range f[2] {
		if r < 'a' || r > 'z' {
			return Event{}, fmt.Errorf("%w: LOST reason %s", ErrBadRequest, snippet(f[2]))
		}
	}
	for _, k := range f[3:] {
		key, err := parseKey(k)
		if err != nil {
			return Event{}, fmt.Errorf("%w: LOST key: %w", ErrBadRequest, err)
		}
		ev.Keys = append(ev.Keys, key)
	}
	return ev, nil
}

// parsePosition parses the fields f of the POSITION event line.
func parsePosition(line []byte, f [][]byte) (Event, error) {
	if len(f) != 5 {
		return Event{}, fmt.Errorf("%w: POSITION takes a request position, a place, an estimate and a key: %s", ErrBadRequest, snippet(line))
	}
	n, err := parseToken(f[1])
	if err != nil {
		return Event{}, fmt.Errorf("%w: POSITION request position: %w", ErrBadRequest, err)
	}
	pos, err := parseToken(f[2])
	if err != nil {
		return Event{}, fmt.Errorf("%w: POSITION place: %w", ErrBadRequest, err)
	}
	ev := Event{Name: EventPosition, N: n, Position: pos, EstimateSec: -1}
	if string(f[3]) != NoEstimate {
		sec, err := strconv.ParseUint(string(f[3]), 10, 32)
		if err != nil {
			return Event{}, fmt.Errorf("%w: POSITION estimate %s", ErrBadRequest, snippet(f[3]))
		}
		ev.EstimateSec = int64(sec)
	}
	key, err := parseKey(f[4])
	if err != nil {
		return Event{}, fmt.Errorf("%w: POSITION key: %w", ErrBadRequest, err)
	}
	ev.Keys = []string{key}
	return ev, nil
}

// parseQueued parses the fields f of the QUEUED event line.
func parseQueued(line []byte, f [][]byte) (Event, error) {
	if len(f) < 3 || len(f) > 2+locksm.MaxBlockKeys {
		return Event{}, fmt.Errorf("%w: QUEUED takes a request position and 1..%d keys: %s", ErrBadRequest, locksm.MaxBlockKeys, snippet(line))
	}
	n, err := parseToken(f[1])
	if err != nil {
		return Event{}, fmt.Errorf("%w: QUEUED request position: %w", ErrBadRequest, err)
	}
	ev := Event{Name: EventQueued, N: n}
	for _, k := range f[2:] {
		key, err := parseKey(k)
		if err != nil {
			return Event{}, fmt.Errorf("%w: QUEUED key: %w", ErrBadRequest, err)
		}
		ev.Keys = append(ev.Keys, key)
	}
	return ev, nil
}

// parseRevoked parses the REVOKED event line; rest is what follows its
// name: " <token> <by>[ <why>]". why is the rest of the line, so it may
// hold spaces (never two in a row at its ends: it neither starts nor
// ends with one).
func parseRevoked(line, rest []byte) (Event, error) {
	f := bytes.SplitN(rest, []byte(" "), 4) // "", token, by[, why]
	if len(f) < 3 {
		return Event{}, fmt.Errorf("%w: REVOKED takes a token, who revoked and an optional reason: %s", ErrBadRequest, snippet(line))
	}
	tok, err := parseToken(f[1])
	if err != nil {
		return Event{}, fmt.Errorf("%w: REVOKED token: %w", ErrBadRequest, err)
	}
	if locksm.ValidateOwner(string(f[2])) != nil {
		return Event{}, fmt.Errorf("%w: REVOKED by %s (1..%d bytes 0x21..0x7e)", ErrBadRequest, snippet(f[2]), locksm.MaxOwnerLen)
	}
	ev := Event{Name: EventRevoked, Token: tok, By: string(f[2])}
	if len(f) == 4 {
		if len(f[3]) == 0 || locksm.ValidateReason(string(f[3])) != nil {
			return Event{}, fmt.Errorf("%w: REVOKED reason %s (1..%d bytes 0x20..0x7e, no space first or last)", ErrBadRequest,
				snippet(f[3]), locksm.MaxReasonLen)
		}
		ev.Why = string(f[3])
	}
	return ev, nil
}
