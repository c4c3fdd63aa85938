package locksm

// Snapshot byte layout (uvarint/varint as in codec.go, minimal encodings
// only, so a snapshot has exactly one encoding per state and
// write∘read is the identity on bytes):
//
//	snapshot = magic:"TKSM" version:byte(0x01)
//	           lastToken:uvarint nkeys:uvarint key*nkeys
//	           crc:uint32-le EOF
//	key      = name:string owner:string token:uvarint lease:uvarint
//	           grantedAt:varint nwait:uvarint waiter*nwait
//	waiter   = owner:string ref:uvarint lease:uvarint wait:uvarint
//	           enqueuedAt:varint
//
// Every key listed is held (the state keeps no entry for a free key), keys
// are in strictly ascending byte order and waiters in queue order, head
// first. crc is CRC-32C (Castagnoli) of every byte before it. Nothing may
// follow it: the snapshot is the whole stream.
//
// ReadSnapshot checks, besides the framing, every invariant Apply relies on,
// because a state it accepts will be mutated by Apply on every replica:
// field constraints of keys, owners, leases and waits (a queued waiter has
// wait >= 1), keys ascending and unique, holder tokens in 1..lastToken and
// pairwise distinct (so nkeys <= lastToken), refs unique within a queue.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strings"
)

const (
	snapMagic   = "TKSM"
	snapVersion = 1
	// snapBufSize is the I/O chunk of both directions: large enough that a
	// 1M-key snapshot is a few thousand writes, small enough not to matter.
	snapBufSize = 64 << 10
	// snapPrealloc caps how far a count read from the stream is trusted for
	// preallocation; beyond it, containers grow as real data arrives, so a
	// lying count costs nothing.
	snapPrealloc = 1 << 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// WriteSnapshot writes the whole state (token counter, holders, queues in
// order) to w in a versioned, deterministic binary form: the same state
// always gives the same bytes, whatever its map layout.
func (s *State) WriteSnapshot(w io.Writer) error {
	keys := s.sortedKeys()
	return writeSnapshot(w, len(keys), func(i int) (string, *entry) { return keys[i], s.keys[keys[i]] }, s.last)
}

// WriteSnapshot writes the view exactly as State.WriteSnapshot would have
// written the State at the moment of Freeze. It may run concurrently with
// Applies to the State.
func (f *Frozen) WriteSnapshot(w io.Writer) error {
	// Sorted once, in place: later or concurrent writers wait for it and
	// then only read.
	f.sorted.Do(func() {
		slices.SortFunc(f.keys, func(a, b frozenKey) int { return strings.Compare(a.key, b.key) })
	})
	keys := f.keys
	return writeSnapshot(w, len(keys), func(i int) (string, *entry) { return keys[i].key, keys[i].e }, f.last)
}

// writeSnapshot writes n keys, in ascending order, key(i) giving the i-th.
func writeSnapshot(w io.Writer, n int, key func(i int) (string, *entry), last uint64) error {
	sw := snapWriter{w: w, buf: make([]byte, 0, snapBufSize)}
	sw.buf = append(sw.buf, snapMagic...)
	sw.buf = append(sw.buf, snapVersion)
	sw.buf = binary.AppendUvarint(sw.buf, last)
	sw.buf = binary.AppendUvarint(sw.buf, uint64(n))
	for i := range n {
		k, e := key(i)
		h := e.holder()
		sw.string(k)
		sw.string(h.Owner)
		sw.buf = binary.AppendUvarint(sw.buf, h.Token)
		sw.buf = binary.AppendUvarint(sw.buf, uint64(h.LeaseSec))
		sw.buf = binary.AppendVarint(sw.buf, h.GrantedAt)
		sw.buf = binary.AppendUvarint(sw.buf, uint64(len(e.queue)))
		for i := range e.queue {
			q := &e.queue[i]
			sw.string(q.Owner)
			sw.buf = binary.AppendUvarint(sw.buf, q.Ref)
			sw.buf = binary.AppendUvarint(sw.buf, uint64(q.LeaseSec))
			sw.buf = binary.AppendUvarint(sw.buf, uint64(q.WaitMs))
			sw.buf = binary.AppendVarint(sw.buf, q.EnqueuedAt)
			sw.maybeFlush()
		}
		sw.maybeFlush()
	}
	sw.flush()
	sw.buf = binary.LittleEndian.AppendUint32(sw.buf, sw.crc)
	sw.write()
	return sw.err
}

// snapWriter batches writes and checksums each chunk as it leaves.
type snapWriter struct {
	w   io.Writer
	buf []byte
	crc uint32
	err error
}

func (sw *snapWriter) string(s string) {
	sw.buf = binary.AppendUvarint(sw.buf, uint64(len(s)))
	sw.buf = append(sw.buf, s...)
}

func (sw *snapWriter) maybeFlush() {
	// One waiter or key record is well under 1 KiB, so flushing with that
	// much headroom keeps buf from ever growing.
	if len(sw.buf) >= snapBufSize-1024 {
		sw.flush()
	}
}

func (sw *snapWriter) flush() {
	sw.crc = crc32.Update(sw.crc, castagnoli, sw.buf)
	sw.write()
	sw.buf = sw.buf[:0]
}

func (sw *snapWriter) write() {
	if sw.err != nil {
		return
	}
	n, err := sw.w.Write(sw.buf)
	if err == nil && n < len(sw.buf) {
		err = io.ErrShortWrite
	}
	sw.err = err
}

// ReadSnapshot reads a state written by WriteSnapshot. Corrupt input gives
// an error wrapping ErrCorruptSnapshot, never a panic or an unbounded
// allocation. An error of r itself is returned wrapped as is (not as
// ErrCorruptSnapshot). ReadSnapshot reads r to its end: trailing bytes are
// corruption.
func ReadSnapshot(r io.Reader) (*State, error) {
	d := snapReader{r: r, buf: make([]byte, 0, snapBufSize)}
	s, err := d.read()
	if err != nil {
		if d.ioErr != nil {
			return nil, fmt.Errorf("locksm: reading snapshot: %w", d.ioErr)
		}
		return nil, fmt.Errorf("%w: %v", ErrCorruptSnapshot, err)
	}
	return s, nil
}

func (d *snapReader) read() (*State, error) {
	if m := d.bytes(len(snapMagic)); d.err != nil || string(m) != snapMagic {
		return nil, d.fail(errors.New("bad magic"))
	}
	if v := d.byte(); d.err == nil && v != snapVersion {
		return nil, fmt.Errorf("unknown version %d", v)
	}
	last := d.uvarint()
	nkeys := d.uvarint()
	if d.err != nil {
		return nil, d.err
	}
	// Each held key owns a distinct token in 1..last.
	if nkeys > last {
		return nil, fmt.Errorf("%d keys but only %d tokens ever issued", nkeys, last)
	}
	s := &State{
		keys:   make(map[string]*entry, min(nkeys, snapPrealloc)),
		queued: make(map[string]*entry),
		last:   last,
	}
	tokens := make([]uint64, 0, min(nkeys, snapPrealloc))
	var refs []uint64
	prev := ""
	for i := range nkeys {
		key := d.string(MaxKeyLen)
		e := &entry{}
		var h Holder
		h.Owner = intern(d.string(MaxOwnerLen))
		h.Token = d.uvarint()
		h.LeaseSec = d.uint32()
		h.GrantedAt = d.varint()
		nq := d.uvarint()
		if d.err != nil {
			return nil, fmt.Errorf("key #%d: %w", i, d.err)
		}
		switch {
		case ValidateKey(key) != nil:
			return nil, fmt.Errorf("key #%d: invalid key %q", i, key)
		case i > 0 && key <= prev:
			return nil, fmt.Errorf("key #%d: %q not after %q", i, key, prev)
		case ValidateOwner(h.Owner) != nil:
			return nil, fmt.Errorf("key %q: invalid holder owner %q", key, h.Owner)
		case h.Token == 0 || h.Token > last:
			return nil, fmt.Errorf("key %q: holder token %d outside 1..%d", key, h.Token, last)
		case h.LeaseSec < MinLeaseSec || h.LeaseSec > MaxLeaseSec:
			return nil, fmt.Errorf("key %q: holder lease %d", key, h.LeaseSec)
		}
		prev = key
		e.setHolder(h)
		tokens = append(tokens, h.Token)
		if nq > 0 {
			e.queue = make([]Waiter, 0, min(nq, 64))
			refs = refs[:0]
		}
		for j := range nq {
			var w Waiter
			w.Owner = intern(d.string(MaxOwnerLen))
			w.Ref = d.uvarint()
			w.LeaseSec = d.uint32()
			w.WaitMs = d.uint32()
			w.EnqueuedAt = d.varint()
			switch {
			case d.err != nil:
				return nil, fmt.Errorf("key %q waiter #%d: %w", key, j, d.err)
			case ValidateOwner(w.Owner) != nil:
				return nil, fmt.Errorf("key %q waiter #%d: invalid owner %q", key, j, w.Owner)
			case w.LeaseSec < MinLeaseSec || w.LeaseSec > MaxLeaseSec:
				return nil, fmt.Errorf("key %q waiter #%d: lease %d", key, j, w.LeaseSec)
			case w.WaitMs == 0 || w.WaitMs > MaxWaitMs:
				// wait 0 never queues, so a queued waiter has wait >= 1.
				return nil, fmt.Errorf("key %q waiter #%d: wait %d", key, j, w.WaitMs)
			}
			e.queue = append(e.queue, w)
			refs = append(refs, w.Ref)
		}
		if len(e.queue) > 0 {
			slices.Sort(refs)
			for j := 1; j < len(refs); j++ {
				if refs[j] == refs[j-1] {
					return nil, fmt.Errorf("key %q: ref %d queued twice", key, refs[j])
				}
			}
			s.queued[key] = e
			s.waiting += len(e.queue)
		}
		s.keys[key] = e
	}
	slices.Sort(tokens)
	for j := 1; j < len(tokens); j++ {
		if tokens[j] == tokens[j-1] {
			return nil, fmt.Errorf("token %d held by two keys", tokens[j])
		}
	}
	sum := d.sum()
	crc := d.bytes(4)
	if d.err != nil {
		return nil, d.err
	}
	if got := binary.LittleEndian.Uint32(crc); got != sum {
		return nil, fmt.Errorf("checksum %#08x, want %#08x", got, sum)
	}
	if d.ensure(1) {
		return nil, errors.New("trailing bytes after checksum")
	}
	if d.ioErr != nil {
		return nil, d.ioErr
	}
	return s, nil
}

// snapReader is a small buffered reader with a sticky error that checksums
// exactly the bytes consumed (a bufio.Reader would read ahead into the
// trailer, so the checksum could not be taken at the stream level).
type snapReader struct {
	r      io.Reader
	buf    []byte // buf[pos:] is unread
	pos    int
	hashed int // buf[:hashed] is already in crc
	crc    uint32
	eof    bool
	err    error // first decoding error (sticky)
	ioErr  error // error of r other than io.EOF
}

func (d *snapReader) fail(err error) error {
	if d.err != nil {
		return d.err
	}
	return err
}

// ensure tries to make n bytes available (n <= snapBufSize) and reports
// whether it did; short of that, the stream ended or failed.
func (d *snapReader) ensure(n int) bool {
	for stalls := 0; len(d.buf)-d.pos < n; {
		if d.eof || d.ioErr != nil {
			return false
		}
		d.crc = crc32.Update(d.crc, castagnoli, d.buf[d.hashed:d.pos])
		m := copy(d.buf[:cap(d.buf)], d.buf[d.pos:])
		k, err := d.r.Read(d.buf[m:cap(d.buf)])
		d.buf, d.pos, d.hashed = d.buf[:m+k], 0, 0
		switch {
		case err == io.EOF:
			d.eof = true
		case err != nil:
			d.ioErr = err
		case k == 0:
			if stalls++; stalls > 100 {
				d.ioErr = io.ErrNoProgress
			}
		}
	}
	return true
}

// sum returns the checksum of everything consumed so far.
func (d *snapReader) sum() uint32 {
	d.crc = crc32.Update(d.crc, castagnoli, d.buf[d.hashed:d.pos])
	d.hashed = d.pos
	return d.crc
}

func (d *snapReader) short() {
	if d.err == nil {
		d.err = errTruncated
		if d.ioErr != nil {
			d.err = d.ioErr
		}
	}
}

// bytes returns the next n bytes, valid until the next read.
func (d *snapReader) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if !d.ensure(n) {
		d.short()
		return nil
	}
	b := d.buf[d.pos : d.pos+n]
	d.pos += n
	return b
}

func (d *snapReader) byte() byte {
	if b := d.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *snapReader) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	d.ensure(binary.MaxVarintLen64) // may get fewer near the end; fine
	v, n, err := uvarint(d.buf[d.pos:])
	if err != nil {
		if err == errTruncated {
			d.short()
		} else {
			d.err = err
		}
		return 0
	}
	d.pos += n
	return v
}

func (d *snapReader) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (d *snapReader) uint32() uint32 {
	v := d.uvarint()
	if v > 1<<32-1 && d.err == nil {
		d.err = errUint32
	}
	return uint32(v)
}

func (d *snapReader) string(limit int) string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(limit) {
		d.err = fmt.Errorf("string of %d bytes exceeds %d", n, limit)
		return ""
	}
	return string(d.bytes(int(n)))
}
