package locksm

// A Raft log entry carries a batch of commands (so the leader can group many
// clients' requests into one entry). The encoding is owned here.
//
// Byte layout (uvarint/varint are encoding/binary's LEB128 forms; varint is
// zig-zag; both must be minimal, so every accepted entry has exactly one
// encoding and DecodeBatch∘AppendBatch is the identity on bytes):
//
//	batch   = version:byte(0x01) count:uvarint(0..MaxBatch) command*count
//	command = op:byte fields(op)
//	string  = len:uvarint bytes*len
//
//	op  name           fields, in this order
//	1   OpAcquire      now:varint key:string owner:string ref:uvarint lease:uvarint wait:uvarint
//	2   OpRelease      now:varint key:string owner:string token:uvarint ref:uvarint
//	3   OpExpire       now:varint key:string token:uvarint
//	4   OpCancelWait   key:string ref:uvarint
//	5   OpDropWaiters  (none)
//	6   OpAcquireBlock now:varint n:uvarint(0..MaxBlockKeys) key:string*n owner:string ref:uvarint lease:uvarint wait:uvarint
//	7   OpExtend       now:varint key:string owner:string token:uvarint ref:uvarint lease:uvarint
//	8   OpOpenSession     now:varint session:uvarint hash:string(0..32) timeout:uvarint
//	9   OpResumeSession   session:uvarint seq:uvarint ack:uvarint epoch:uvarint
//	10  OpExpireSession   now:varint session:uvarint epoch:uvarint n:uvarint token:uvarint*n
//	11  OpCloseSession    now:varint session:uvarint
//	12  OpDropSessionless (none)
//	13  OpAckSession      session:uvarint ack:uvarint
//	14  OpAcquirePermit   fields of op 1
//	15  OpSetPermits      now:varint key:string permits:uvarint ref:uvarint
//	16  OpRevoke          now:varint key:string owner:string token:uvarint ref:uvarint reason:string(0..MaxReasonLen)
//
//	op|0x80 (op 1, 2, 6, 7, 14 only): a lock command of a session
//	    = session:uvarint(1..) seq:uvarint ack:uvarint fields(op)
//	op|0x40 (op 1, 6, 14 only; with or without 0x80): a labelled acquire
//	    = [session fields] label:string(1..MaxLabelLen) fields(op)
//
// Op 6 came with blocks (protocol version 5): a node older than that
// cannot decode an entry that carries it, so a leader proposes it only
// once the cluster version says every member can (cluster/wire's
// PROTOCOL.md, "Log entries"). The batch version did not change: every
// entry without op 6 is exactly what older nodes wrote and read.
//
// Op 7 came with lease extension (protocol version 6) in the same way: a
// node older than that cannot decode an entry that carries it, so a
// leader proposes it only once the cluster version is 6. Entries without
// it are unchanged, and the batch version is still 1.
//
// Ops 8..12 and the session flag 0x80 came with sessions (protocol
// version 7) in the same way again: a node older than that cannot decode
// them, so a leader proposes them only once the cluster version is 7. The
// flag is set exactly when a lock command names a session (Session != 0);
// a command without one carries no session fields, so every entry without
// session content is byte for byte what older nodes wrote and read, and the
// batch version is still 1. The flag on any other op, or with session 0,
// is corrupt (it would have another encoding). A session op's tokens are
// bounded only by the entry (each takes at least one byte).
//
// The label flag 0x40 came with owner labels (protocol version 8) in the
// same way: an older node cannot decode it, so a leader proposes a
// labelled acquire only once the cluster version is 8. The flag is set
// exactly when an acquire has a label (Label != ""): an acquire without
// one is byte for byte what older nodes wrote, and the batch version is
// still 1. The flag with an empty label, or on any other op, is corrupt.
//
// Ops 14 and 15 came with semaphores (protocol version 13) in the same
// way: a node older than that cannot decode them, so a leader proposes
// them only once the cluster version is 13; every other entry is
// unchanged and the batch version is still 1. A permit count must fit in
// uint32 (Apply rejects one above MaxPermits).
//
// Op 16 came with revokes in the same way: a node older than that cannot
// decode it (it is an unknown op there, and the whole entry is corrupt to
// it), so a leader proposes it only once the cluster version says every
// member knows it; every other entry is unchanged and the batch version is
// still 1. A reason longer than MaxReasonLen is corrupt.
//
// Only the fields an op uses are carried; the others decode as zero (Apply
// ignores them anyway). Now is carried only by ops that record it (grant or
// enqueue time). A key is at most MaxKeyLen bytes and an owner at most
// MaxOwnerLen; lease and wait must fit in uint32. Nothing else is validated
// here: an empty key or a lease of 0 decodes fine and Apply rejects it, so
// every replica reports the same error for it.
//
// DecodeBatch rejects, wrapping ErrCorruptCommand: an unknown version, a
// count above MaxBatch or above the bytes left (every command takes at
// least one byte), truncation, trailing bytes, an unknown op (0, 17..63,
// the session flag on an op other than 1, 2, 6, 7, 14 or with session 0,
// the label flag on an op other than 1, 6, 14 or with an empty label), an
// over-long string (a secret hash above SecretHashLen bytes), a non-minimal varint, a lease or wait above
// uint32, a block of more than MaxBlockKeys keys.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// MaxBatch is the most commands one entry may carry.
const MaxBatch = 4096

// sessionFlag marks a lock command of a session in its op byte.
const sessionFlag = 0x80

// labelFlag marks an acquire that carries a label in its op byte.
const labelFlag = 0x40

// badLabel is what AppendBatch writes for a label longer than
// MaxLabelLen: one byte outside the label alphabet, so Apply rejects the
// command with ErrInvalidLabel, as ValidateCommand would have.
const badLabel = " "

// badReason is what AppendBatch writes for a reason longer than
// MaxReasonLen: one byte outside the reason alphabet, so Apply rejects
// the command with ErrInvalidReason, as ValidateCommand would have.
const badReason = "\x00"

// batchVersion is the first byte of every entry. A new layout gets a new
// version; entries written in an older one stay in the Raft log, so the
// decoder must keep understanding every version it ever wrote.
const batchVersion = 1

// AppendBatch appends the encoding of cmds to dst.
//
// It cannot fail, so it never refuses a command. Callers should vet commands
// with ValidateCommand first; for those that slip through, a key or owner
// longer than its bound is encoded as the empty string. Apply rejects both
// with the same sentinel in the same order of checks, so the proposer still
// gets the right answer, and the entry stays decodable instead of taking the
// rest of the batch down with it; a block of more than MaxBlockKeys keys is
// encoded with none (Apply rejects both with ErrInvalidBlock). An unknown Op is encoded as is and makes
// DecodeBatch reject the whole entry: that is a bug in the proposer, not
// client input. Passing more than MaxBatch commands likewise produces an
// entry DecodeBatch rejects.
func AppendBatch(dst []byte, cmds []Command) []byte {
	dst = append(dst, batchVersion)
	dst = binary.AppendUvarint(dst, uint64(len(cmds)))
	for i := range cmds {
		c := &cmds[i]
		op := byte(c.Op)
		labelled := c.Label != "" && labelBearing(c.Op)
		if labelled {
			op |= labelFlag
		}
		if c.Session != 0 && sessionBearing(c.Op) {
			dst = append(dst, op|sessionFlag)
			dst = binary.AppendUvarint(dst, c.Session)
			dst = binary.AppendUvarint(dst, c.Seq)
			dst = binary.AppendUvarint(dst, c.Ack)
		} else {
			dst = append(dst, op)
		}
		if labelled {
			label := c.Label
			if len(label) > MaxLabelLen {
				label = badLabel
			}
			dst = appendString(dst, label, MaxLabelLen)
		}
		switch c.Op {
		case OpAcquire, OpAcquirePermit:
			dst = binary.AppendVarint(dst, c.Now)
			dst = appendString(dst, c.Key, MaxKeyLen)
			dst = appendString(dst, c.Owner, MaxOwnerLen)
			dst = binary.AppendUvarint(dst, c.Ref)
			dst = binary.AppendUvarint(dst, uint64(c.LeaseSec))
			dst = binary.AppendUvarint(dst, uint64(c.WaitMs))
		case OpRelease:
			dst = binary.AppendVarint(dst, c.Now)
			dst = appendString(dst, c.Key, MaxKeyLen)
			dst = appendString(dst, c.Owner, MaxOwnerLen)
			dst = binary.AppendUvarint(dst, c.Token)
			dst = binary.AppendUvarint(dst, c.Ref)
		case OpExpire:
			dst = binary.AppendVarint(dst, c.Now)
			dst = appendString(dst, c.Key, MaxKeyLen)
			dst = binary.AppendUvarint(dst, c.Token)
		case OpCancelWait:
			dst = appendString(dst, c.Key, MaxKeyLen)
			dst = binary.AppendUvarint(dst, c.Ref)
		case OpAcquireBlock:
			dst = binary.AppendVarint(dst, c.Now)
			keys := c.Keys
			if len(keys) > MaxBlockKeys {
				keys = nil
			}
			dst = binary.AppendUvarint(dst, uint64(len(keys)))
			for _, k := range keys {
				dst = appendString(dst, k, MaxKeyLen)
			}
			dst = appendString(dst, c.Owner, MaxOwnerLen)
			dst = binary.AppendUvarint(dst, c.Ref)
			dst = binary.AppendUvarint(dst, uint64(c.LeaseSec))
			dst = binary.AppendUvarint(dst, uint64(c.WaitMs))
		case OpExtend:
			dst = binary.AppendVarint(dst, c.Now)
			dst = appendString(dst, c.Key, MaxKeyLen)
			dst = appendString(dst, c.Owner, MaxOwnerLen)
			dst = binary.AppendUvarint(dst, c.Token)
			dst = binary.AppendUvarint(dst, c.Ref)
			dst = binary.AppendUvarint(dst, uint64(c.LeaseSec))
		case OpOpenSession:
			dst = binary.AppendVarint(dst, c.Now)
			dst = binary.AppendUvarint(dst, c.Session)
			dst = appendString(dst, c.SecretHash, SecretHashLen)
			dst = binary.AppendUvarint(dst, uint64(c.TimeoutMs))
		case OpResumeSession:
			dst = binary.AppendUvarint(dst, c.Session)
			dst = binary.AppendUvarint(dst, c.Seq)
			dst = binary.AppendUvarint(dst, c.Ack)
			dst = binary.AppendUvarint(dst, c.Epoch)
		case OpExpireSession:
			dst = binary.AppendVarint(dst, c.Now)
			dst = binary.AppendUvarint(dst, c.Session)
			dst = binary.AppendUvarint(dst, c.Epoch)
			dst = binary.AppendUvarint(dst, uint64(len(c.Tokens)))
			for _, t := range c.Tokens {
				dst = binary.AppendUvarint(dst, t)
			}
		case OpCloseSession:
			dst = binary.AppendVarint(dst, c.Now)
			dst = binary.AppendUvarint(dst, c.Session)
		case OpAckSession:
			dst = binary.AppendUvarint(dst, c.Session)
			dst = binary.AppendUvarint(dst, c.Ack)
		case OpSetPermits:
			dst = binary.AppendVarint(dst, c.Now)
			dst = appendString(dst, c.Key, MaxKeyLen)
			dst = binary.AppendUvarint(dst, uint64(c.Permits))
			dst = binary.AppendUvarint(dst, c.Ref)
		case OpRevoke:
			dst = binary.AppendVarint(dst, c.Now)
			dst = appendString(dst, c.Key, MaxKeyLen)
			dst = appendString(dst, c.Owner, MaxOwnerLen)
			dst = binary.AppendUvarint(dst, c.Token)
			dst = binary.AppendUvarint(dst, c.Ref)
			reason := c.Reason
			if len(reason) > MaxReasonLen {
				reason = badReason
			}
			dst = appendString(dst, reason, MaxReasonLen)
		}
	}
	return dst
}

// sessionBearing reports whether op is a lock command that may name a
// session (its Session, Seq and Ack fields).
func sessionBearing(op Op) bool {
	return op == OpAcquire || op == OpRelease || op == OpAcquireBlock || op == OpExtend || op == OpAcquirePermit
}

// labelBearing reports whether op may carry a label: the acquires.
func labelBearing(op Op) bool {
	return op == OpAcquire || op == OpAcquireBlock || op == OpAcquirePermit
}

func appendString(dst []byte, s string, limit int) []byte {
	if len(s) > limit {
		s = ""
	}
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// DecodeBatch decodes an entry produced by AppendBatch, appending the
// commands to into. Corrupt input gives an error wrapping ErrCorruptCommand
// (never a panic, never an allocation larger than the input warrants). On
// error into is returned unextended.
func DecodeBatch(b []byte, into []Command) ([]Command, error) {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != batchVersion {
		return into, fmt.Errorf("%w: unknown batch version %d", ErrCorruptCommand, v)
	}
	n := d.uvarint()
	if d.err != nil {
		return into, d.corrupt()
	}
	if n > MaxBatch {
		return into, fmt.Errorf("%w: batch of %d commands exceeds %d", ErrCorruptCommand, n, MaxBatch)
	}
	if n > uint64(len(d.b)) {
		return into, fmt.Errorf("%w: %d commands cannot fit in %d bytes", ErrCorruptCommand, n, len(d.b))
	}
	orig := len(into)
	if cap(into)-orig < int(n) {
		// Not slices.Grow: under the race detector its append of a
		// make()d slice allocates that slice too, twice the memory.
		grown := make([]Command, orig, orig+int(n))
		copy(grown, into)
		into = grown
	}
	for i := range int(n) {
		var c Command
		b := d.byte()
		c.Op = Op(b &^ (sessionFlag | labelFlag))
		if b&sessionFlag != 0 && d.err == nil {
			if !sessionBearing(c.Op) {
				d.err = fmt.Errorf("unknown op %d", b)
			}
			c.Session = d.uvarint()
			c.Seq = d.uvarint()
			c.Ack = d.uvarint()
			if c.Session == 0 && d.err == nil {
				d.err = errors.New("session flag with session 0")
			}
		}
		if b&labelFlag != 0 && d.err == nil {
			if !labelBearing(c.Op) {
				d.err = fmt.Errorf("unknown op %d", b)
			}
			if c.Label = d.string(MaxLabelLen); c.Label == "" && d.err == nil {
				d.err = errors.New("label flag with an empty label")
			}
		}
		switch c.Op {
		case OpAcquire, OpAcquirePermit:
			c.Now = d.varint()
			c.Key = d.string(MaxKeyLen)
			c.Owner = d.string(MaxOwnerLen)
			c.Ref = d.uvarint()
			c.LeaseSec = d.uint32()
			c.WaitMs = d.uint32()
		case OpRelease:
			c.Now = d.varint()
			c.Key = d.string(MaxKeyLen)
			c.Owner = d.string(MaxOwnerLen)
			c.Token = d.uvarint()
			c.Ref = d.uvarint()
		case OpExpire:
			c.Now = d.varint()
			c.Key = d.string(MaxKeyLen)
			c.Token = d.uvarint()
		case OpCancelWait:
			c.Key = d.string(MaxKeyLen)
			c.Ref = d.uvarint()
		case OpDropWaiters:
		case OpAcquireBlock:
			c.Now = d.varint()
			if n := d.uvarint(); n > MaxBlockKeys {
				if d.err == nil {
					d.err = fmt.Errorf("block of %d keys exceeds %d", n, MaxBlockKeys)
				}
			} else if n > 0 {
				c.Keys = make([]string, n)
				for j := range c.Keys {
					c.Keys[j] = d.string(MaxKeyLen)
				}
			}
			c.Owner = d.string(MaxOwnerLen)
			c.Ref = d.uvarint()
			c.LeaseSec = d.uint32()
			c.WaitMs = d.uint32()
		case OpExtend:
			c.Now = d.varint()
			c.Key = d.string(MaxKeyLen)
			c.Owner = d.string(MaxOwnerLen)
			c.Token = d.uvarint()
			c.Ref = d.uvarint()
			c.LeaseSec = d.uint32()
		case OpOpenSession:
			c.Now = d.varint()
			c.Session = d.uvarint()
			c.SecretHash = d.string(SecretHashLen)
			c.TimeoutMs = d.uint32()
		case OpResumeSession:
			c.Session = d.uvarint()
			c.Seq = d.uvarint()
			c.Ack = d.uvarint()
			c.Epoch = d.uvarint()
		case OpExpireSession:
			c.Now = d.varint()
			c.Session = d.uvarint()
			c.Epoch = d.uvarint()
			if n := d.uvarint(); n > uint64(len(d.b)) {
				if d.err == nil {
					d.err = fmt.Errorf("%d tokens cannot fit in %d bytes", n, len(d.b))
				}
			} else if n > 0 {
				c.Tokens = make([]uint64, n)
				for j := range c.Tokens {
					c.Tokens[j] = d.uvarint()
				}
			}
		case OpCloseSession:
			c.Now = d.varint()
			c.Session = d.uvarint()
		case OpAckSession:
			c.Session = d.uvarint()
			c.Ack = d.uvarint()
		case OpSetPermits:
			c.Now = d.varint()
			c.Key = d.string(MaxKeyLen)
			c.Permits = d.uint32()
			c.Ref = d.uvarint()
		case OpRevoke:
			c.Now = d.varint()
			c.Key = d.string(MaxKeyLen)
			c.Owner = d.string(MaxOwnerLen)
			c.Token = d.uvarint()
			c.Ref = d.uvarint()
			c.Reason = d.string(MaxReasonLen)
		case OpDropSessionless:
		default:
			if d.err == nil {
				d.err = fmt.Errorf("unknown op %d", c.Op)
			}
		}
		if d.err != nil {
			clear(into[orig:]) // drop string references we appended
			return into[:orig], fmt.Errorf("%w: command %d: %v", ErrCorruptCommand, i, d.err)
		}
		into = append(into, c)
	}
	if len(d.b) != 0 {
		clear(into[orig:])
		return into[:orig], fmt.Errorf("%w: %d trailing bytes", ErrCorruptCommand, len(d.b))
	}
	return into, nil
}

// decoder reads from b with a sticky error, so the per-op field lists above
// read straight through and are checked once.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) corrupt() error { return fmt.Errorf("%w: %v", ErrCorruptCommand, d.err) }

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = errTruncated
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n, err := uvarint(d.b)
	if err != nil {
		d.err = err
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	u := d.uvarint()
	// Zig-zag, as binary.AppendVarint writes it.
	return int64(u>>1) ^ -int64(u&1)
}

func (d *decoder) uint32() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 && d.err == nil {
		d.err = errUint32
	}
	return uint32(v)
}

func (d *decoder) string(limit int) string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(limit) {
		d.err = fmt.Errorf("string of %d bytes exceeds %d", n, limit)
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = errTruncated
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// Decoding errors shared by the batch and snapshot decoders; each decoder
// wraps them in its own sentinel.
var (
	errTruncated  = errors.New("truncated")
	errOverflow   = errors.New("varint overflows 64 bits")
	errNonMinimal = errors.New("non-minimal varint")
	errUint32     = errors.New("value exceeds 32 bits")
)

// uvarint is binary.Uvarint that also refuses non-minimal encodings (a
// trailing 0x00 continuation byte), which keeps every encoding canonical.
func uvarint(b []byte) (uint64, int, error) {
	v, n := binary.Uvarint(b)
	switch {
	case n == 0:
		return 0, 0, errTruncated
	case n < 0:
		return 0, 0, errOverflow
	case n > 1 && b[n-1] == 0:
		return 0, 0, errNonMinimal
	}
	return v, n, nil
}

// ValidateLabel checks an acquire's label: 0..MaxLabelLen bytes in
// 0x21..0x7E ("" is no label). It returns the bare ErrInvalidLabel.
func ValidateLabel(label string) error {
	if label != "" && !validIdent(label, MaxLabelLen) {
		return ErrInvalidLabel
	}
	return nil
}

// ValidateReason checks a revoke's reason: 0..MaxReasonLen bytes in
// 0x20..0x7E, no space first or last ("" is no reason; MaxReasonLen
// says why this alphabet). It returns the bare ErrInvalidReason.
func ValidateReason(reason string) error {
	if len(reason) > MaxReasonLen {
		return ErrInvalidReason
	}
	if reason == "" {
		return nil
	}
	if reason[0] == ' ' || reason[len(reason)-1] == ' ' {
		return ErrInvalidReason
	}
	for i := 0; i < len(reason); i++ {
		if c := reason[i]; c < 0x20 || c > 0x7e {
			return ErrInvalidReason
		}
	}
	return nil
}

// ValidateKey and ValidateOwner check the field constraints (see MaxKeyLen).
// They return the bare sentinel (ErrInvalidKey, ErrInvalidOwner) so it can
// go into Result.Err and be compared with ==.
func ValidateKey(key string) error {
	if !validIdent(key, MaxKeyLen) {
		return ErrInvalidKey
	}
	return nil
}

// ValidateOwner checks an owner id: 1..MaxOwnerLen bytes in 0x21..0x7E.
func ValidateOwner(owner string) error {
	if !validIdent(owner, MaxOwnerLen) {
		return ErrInvalidOwner
	}
	return nil
}

func validIdent(s string, limit int) bool {
	if len(s) == 0 || len(s) > limit {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}
