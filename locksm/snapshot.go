package locksm

// Snapshot byte layout (uvarint/varint as in codec.go, minimal encodings
// only, so a snapshot has exactly one encoding per state and
// write∘read is the identity on bytes).
//
// Versions. The lowest version that can hold the state is written, so a
// cluster that never used a feature can still install its snapshots on
// nodes older than it during a rolling upgrade; every version is read,
// and a snapshot in a higher version than its content needs is corrupt
// (it has another, canonical, encoding).
//
//   - 1: holders and single-key queues (the first layout).
//   - 2: blocks (protocol version 5): written when a block is held or
//     queued; version 1's body with holders made optional (reserved
//     keys), waiters carrying their block's keys, the clock, and the
//     held blocks.
//   - 3: lease extension (protocol version 6): written whenever a
//     holding was extended (OpExtend), blocks or not; version 2's body
//     followed by the renewals.
//   - 4: sessions (protocol version 7): written whenever a session
//     exists; version 3's body (renewals may be none) with the (session,
//     seq) of every holder and waiter, followed by the sessions.
//   - 5: owner labels (protocol version 8): written whenever a holder or
//     a queued waiter has a label; version 4's body (sessions may be
//     none) with the label of every holder and waiter after its sref.
//   - 6: semaphores (protocol version 13): written whenever a key is
//     defined as a semaphore; version 5's body with the semaphores
//     between the keys and the blocks.
//   - 7: revokes: written whenever an audit record of a revoke is kept;
//     version 6's body (semaphores may be none) followed by the records.
//     A table without records is written exactly as before, so a
//     cluster that never revoked still installs its snapshots on older
//     nodes.
//
//	snapshot = magic:"TKSM" version:byte(0x01..0x07) body crc:uint32-le EOF
//	body v1  = lastToken:uvarint nkeys:uvarint key1*nkeys
//	key1     = name:string owner:string token:uvarint lease:uvarint
//	           grantedAt:varint nwait:uvarint waiter1*nwait
//	waiter1  = owner:string ref:uvarint lease:uvarint wait:uvarint
//	           enqueuedAt:varint
//	body v2  = lastToken:uvarint clock:varint nkeys:uvarint key2*nkeys
//	           nblocks:uvarint block*nblocks
//	key2     = name:string token:uvarint
//	           [token != 0: owner:string lease:uvarint grantedAt:varint]
//	           nwait:uvarint waiter2*nwait
//	waiter2  = waiter1 nbk:uvarint name:string*nbk
//	block    = token:uvarint nbk:uvarint name:string*nbk
//	body v3  = body v2 nrenew:uvarint(1..) renewal*nrenew
//	renewal  = token:uvarint renewedAt:varint
//	body v4  = lastToken:uvarint clock:varint nkeys:uvarint key4*nkeys
//	           nblocks:uvarint block*nblocks nrenew:uvarint renewal*nrenew
//	           nsess:uvarint(1..) session*nsess
//	key4     = name:string token:uvarint
//	           [token != 0: owner:string lease:uvarint grantedAt:varint sref]
//	           nwait:uvarint waiter4*nwait
//	waiter4  = waiter2 sref
//	sref     = session:uvarint [session != 0: seq:uvarint(1..)]
//	session  = id:uvarint(1..) hash:byte*32 timeout:uvarint floor:uvarint
//	           serial:uvarint ack:uvarint epoch:uvarint openedAt:varint
//	           nout:uvarint(= serial-ack) outcome*nout
//	outcome  = seq:uvarint(1..) status:byte [status 1 (granted): token:uvarint]
//	           [version 6, status 1: slot:uvarint(0..99999)]
//	           [status 0 (rejected): err:byte]
//	body v5  = body v4 with key5 for key4, waiter5 for waiter4, and
//	           nsess:uvarint(0..)
//	key5     = name:string token:uvarint
//	           [token != 0: owner:string lease:uvarint grantedAt:varint sref
//	           label:string(0..64)]
//	           nwait:uvarint waiter5*nwait
//	waiter5  = waiter4 label:string(0..64)
//	body v6  = (outcomes of grants carry their slot, below)
//	           lastToken:uvarint clock:varint nkeys:uvarint key5*nkeys
//	           nsem:uvarint(0..) sem*nsem
//	           nblocks:uvarint block*nblocks nrenew:uvarint renewal*nrenew
//	           nsess:uvarint(0..) session*nsess
//	sem      = name:string permits:uvarint(1..100000)
//	           nheld:uvarint permit*nheld nwait:uvarint waiter5*nwait
//	permit   = slot:uvarint owner:string token:uvarint(1..) lease:uvarint
//	           grantedAt:varint sref label:string(0..64)
//	body v7  = body v6 nrev:uvarint(0..1024) revoke*nrev
//	           nsrev:uvarint srev*nsrev   (nrev + nsrev >= 1)
//	revoke   = key:string token:uvarint(1..) who:string reason:string(0..128)
//	           at:varint owner:string label:string(0..64) session:uvarint
//	           permit:byte(0|1) [permit 1: slot:uvarint(0..99999)]
//	           nbk:uvarint name:string*nbk
//	srev     = session:uvarint(1..) afterSerial:uvarint token:uvarint(1..)
//	           key:string who:string reason:string(0..128)
//	           (by session ascending, then in the order kept; at most
//	           1024 per session; afterSerial in ack..serial of a live
//	           session, ascending within it)
//
// Revoke records are in the state's order (oldest revoke first), each key
// once; nbk is 0 but for a block's record (2..16 keys, its key among
// them; a permit's never), and a permit's slot is below MaxPermits.
//
// Every key listed is held or reserved (token 0: not held, its queue head a
// block that cannot be granted yet); the state keeps no entry for a free
// key. Keys are in strictly ascending byte order and waiters in queue
// order, head first. A queued block appears in the queue of each of its
// keys with its keys listed (nbk 2..16; nbk 0 is a single-key waiter); a
// held block is listed once in the blocks section, tokens ascending, with
// its keys in the requester's order. clock is State.clock. A renewal is
// the token of a holding that was extended (a block's once) and the Now of
// its latest extension (Holder.RenewedAt), tokens strictly ascending; the
// holders' lease fields already carry the extended lease. Sessions are in
// ascending id order with their kept outcomes in serial order (serials
// ack+1..serial, implicit); an outcome's status is a Status value (0
// rejected, 1 granted, 3 busy, 4 released, 9 extended, 10 timed out) and a
// rejection's err is 1 ErrNotHeld, 2 ErrTokenMismatch, 3 ErrOwnerMismatch,
// 4 ErrDuplicateRef, 5 ErrTokensExhausted. crc is CRC-32C
// (Castagnoli) of every byte before it. Nothing may follow it: the
// snapshot is the whole stream.
//
// ReadSnapshot checks, besides the framing, every invariant Apply relies on,
// because a state it accepts will be mutated by Apply on every replica:
// field constraints of keys, owners, leases and waits (a queued waiter has
// wait >= 1), keys ascending and unique, holder tokens in 1..lastToken and
// pairwise distinct except that exactly the keys of one block share its
// token, refs unique within a queue, a queued block in exactly the queues
// of its keys with the same fields in each and its ref unique among queued
// blocks, a reserved key's head a block that cannot be granted, and each
// renewal naming the token of a held key, once; and of sessions: ids
// ascending and nonzero, timeouts in bounds, ack <= serial <= 2^62,
// outcome seqs nonzero and unique in their session with a known status (a
// granted token in 1..lastToken, a known err), every holder's and
// waiter's session live with a nonzero seq, a block's keys (held or
// queued) all naming the same (session, seq), and a session's waiter seqs
// unique and distinct from its outcomes' seqs; and of labels: each within
// the label constraints, a held block's keys all carrying the same label;
// and of semaphores: names ascending, none also a lock key, n in
// 1..MaxPermits, permits in strictly ascending slot order below
// MaxPermits, their tokens distinct from every other holding's, queued
// waiters single-key with unique refs, and a queue only while at least n
// permits are held (else its head would have been granted).
// Version 2 must have block content, version 3 a renewal, version 4 a
// session, version 5 a label, version 6 a semaphore or the outcome
// of a grant in a slot other than 0, and version 7 a revoke record.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"slices"
	"strings"
)

const (
	snapMagic = "TKSM"
	// snapV1 is the layout without blocks, snapV2 the one with them,
	// snapV3 version 2 plus the renewals of extended holdings.
	snapV1 = 1
	snapV2 = 2
	snapV3 = 3
	snapV4 = 4
	snapV5 = 5
	snapV6 = 6
	snapV7 = 7
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
// order, blocks, renewals) to w in a versioned, deterministic binary form:
// the same state always gives the same bytes, whatever its map layout.
func (s *State) WriteSnapshot(w io.Writer) error {
	keys := s.sortedKeys()
	return writeSnapshot(w, s.snapHeader(), len(keys), func(i int) (string, *entry) { return keys[i], s.keys[keys[i]] })
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
	return writeSnapshot(w, f.head, len(keys), func(i int) (string, *entry) { return keys[i].key, keys[i].e })
}

// snapHeader is what a snapshot carries besides the keys.
type snapHeader struct {
	last    uint64
	clock   int64
	blocks  map[uint64][]string
	renewed map[uint64]int64
	labels  map[uint64]string
	// waiterLabels: the labels of queued waiters (State.waiterLabels).
	waiterLabels map[waiterRef]string
	sessions     []snapSession
	// sems are the semaphores in ascending key order (their structs are
	// copied on write after a Freeze, so a view may keep the pointers).
	sems []frozenSem
	// revokes, sessRevoked: State's, never written in place, so shared.
	revokes     []Revoke
	sessRevoked map[uint64][]SessionRevoke // a copy of the map in a Frozen view
	version     byte                       // snapV1..snapV7 (State.snapVersion)
}

type frozenSem struct {
	key string
	m   *semaphore
}

// sortedSems lists the semaphores in ascending key order.
func (s *State) sortedSems() []frozenSem {
	if len(s.sems) == 0 {
		return nil
	}
	out := make([]frozenSem, 0, len(s.sems))
	for _, k := range s.Semaphores() {
		out = append(out, frozenSem{k, s.sems[k]})
	}
	return out
}

// snapHeader is the State's snapshot besides its keys, sharing its maps.
func (s *State) snapHeader() snapHeader {
	return snapHeader{last: s.last, clock: s.clock, blocks: s.blocks, renewed: s.renewed,
		labels: s.labels, waiterLabels: s.waiterLabels, sessions: s.snapSessions(), sems: s.sortedSems(),
		revokes: s.revokes, sessRevoked: s.sessRevoked, version: s.snapVersion()}
}

// writeSnapshot writes n keys, in ascending order, key(i) giving the i-th.
func writeSnapshot(w io.Writer, hd snapHeader, n int, key func(i int) (string, *entry)) error {
	sw := snapWriter{w: w, buf: make([]byte, 0, snapBufSize)}
	v2 := hd.version >= snapV2 // the layout of version 2, which 3 and 4 extend
	v4 := hd.version >= snapV4
	v5 := hd.version >= snapV5
	sw.buf = append(sw.buf, snapMagic...)
	sw.buf = append(sw.buf, hd.version)
	sw.buf = binary.AppendUvarint(sw.buf, hd.last)
	if v2 {
		sw.buf = binary.AppendVarint(sw.buf, hd.clock)
	}
	sw.buf = binary.AppendUvarint(sw.buf, uint64(n))
	for i := range n {
		k, e := key(i)
		h := e.holder()
		sw.string(k)
		if !v2 {
			sw.string(h.Owner)
			sw.buf = binary.AppendUvarint(sw.buf, h.Token)
			sw.buf = binary.AppendUvarint(sw.buf, uint64(h.LeaseSec))
			sw.buf = binary.AppendVarint(sw.buf, h.GrantedAt)
		} else {
			sw.buf = binary.AppendUvarint(sw.buf, h.Token)
			if h.Token != 0 {
				sw.string(h.Owner)
				sw.buf = binary.AppendUvarint(sw.buf, uint64(h.LeaseSec))
				sw.buf = binary.AppendVarint(sw.buf, h.GrantedAt)
				if v4 {
					sw.sref(h.Session, h.Seq)
				}
				if v5 {
					sw.string(hd.labels[h.Token])
				}
			}
		}
		sw.waiters(&hd, k, e.queue, v2, v4, v5)
		sw.maybeFlush()
	}
	if hd.version >= snapV6 {
		sw.buf = binary.AppendUvarint(sw.buf, uint64(len(hd.sems)))
		for _, fs := range hd.sems {
			m := fs.m
			sw.string(fs.key)
			sw.buf = binary.AppendUvarint(sw.buf, uint64(m.permits))
			sw.buf = binary.AppendUvarint(sw.buf, uint64(m.numHeld()))
			for _, slot := range m.heldSlots() {
				p := m.held[slot]
				sw.buf = binary.AppendUvarint(sw.buf, uint64(slot))
				sw.string(p.owner)
				sw.buf = binary.AppendUvarint(sw.buf, p.token)
				sw.buf = binary.AppendUvarint(sw.buf, uint64(p.leaseSec))
				sw.buf = binary.AppendVarint(sw.buf, p.grantedAt)
				sw.sref(p.session, p.seq)
				sw.string(hd.labels[p.token])
				sw.maybeFlush()
			}
			sw.waiters(&hd, fs.key, m.queue, true, true, true)
			sw.maybeFlush()
		}
	}
	if v2 {
		tokens := slices.Sorted(maps.Keys(hd.blocks))
		sw.buf = binary.AppendUvarint(sw.buf, uint64(len(tokens)))
		for _, t := range tokens {
			sw.buf = binary.AppendUvarint(sw.buf, t)
			sw.keys(hd.blocks[t])
			sw.maybeFlush()
		}
	}
	if hd.version >= snapV3 {
		tokens := slices.Sorted(maps.Keys(hd.renewed))
		sw.buf = binary.AppendUvarint(sw.buf, uint64(len(tokens)))
		for _, t := range tokens {
			sw.buf = binary.AppendUvarint(sw.buf, t)
			sw.buf = binary.AppendVarint(sw.buf, hd.renewed[t])
			sw.maybeFlush()
		}
	}
	if v4 {
		sw.buf = binary.AppendUvarint(sw.buf, uint64(len(hd.sessions)))
		for i := range hd.sessions {
			ss := &hd.sessions[i]
			sw.buf = binary.AppendUvarint(sw.buf, ss.id)
			sw.buf = append(sw.buf, ss.hash...)
			sw.buf = binary.AppendUvarint(sw.buf, uint64(ss.timeoutMs))
			sw.buf = binary.AppendUvarint(sw.buf, ss.floor)
			sw.buf = binary.AppendUvarint(sw.buf, ss.serial)
			sw.buf = binary.AppendUvarint(sw.buf, ss.ack)
			sw.buf = binary.AppendUvarint(sw.buf, ss.epoch)
			sw.buf = binary.AppendVarint(sw.buf, ss.openedAt)
			sw.buf = binary.AppendUvarint(sw.buf, uint64(len(ss.outcomes)))
			sw.maybeFlush()
			for _, o := range ss.outcomes {
				sw.buf = binary.AppendUvarint(sw.buf, o.Seq)
				sw.buf = append(sw.buf, byte(o.Status))
				switch o.Status {
				case StatusGranted:
					sw.buf = binary.AppendUvarint(sw.buf, o.Token)
					if hd.version >= snapV6 {
						sw.buf = binary.AppendUvarint(sw.buf, uint64(o.Slot))
					}
				case StatusRejected:
					sw.buf = append(sw.buf, outcomeErrCode(o.Err))
				}
				sw.maybeFlush()
			}
		}
	}
	if hd.version >= snapV7 {
		sw.buf = binary.AppendUvarint(sw.buf, uint64(len(hd.revokes)))
		for i := range hd.revokes {
			r := &hd.revokes[i]
			sw.string(r.Key)
			sw.buf = binary.AppendUvarint(sw.buf, r.Token)
			sw.string(r.Who)
			sw.string(r.Reason)
			sw.buf = binary.AppendVarint(sw.buf, r.At)
			sw.string(r.Owner)
			sw.string(r.Label)
			sw.buf = binary.AppendUvarint(sw.buf, r.Session)
			if r.Permit {
				sw.buf = append(sw.buf, 1)
				sw.buf = binary.AppendUvarint(sw.buf, uint64(r.Slot))
			} else {
				sw.buf = append(sw.buf, 0)
			}
			sw.keys(r.Keys)
			sw.maybeFlush()
		}
		ids := slices.Sorted(maps.Keys(hd.sessRevoked))
		n := 0
		for _, id := range ids {
			n += len(hd.sessRevoked[id])
		}
		sw.buf = binary.AppendUvarint(sw.buf, uint64(n))
		for _, id := range ids {
			for _, r := range hd.sessRevoked[id] {
				sw.buf = binary.AppendUvarint(sw.buf, r.Session)
				sw.buf = binary.AppendUvarint(sw.buf, r.AfterSerial)
				sw.buf = binary.AppendUvarint(sw.buf, r.Token)
				sw.string(r.Key)
				sw.string(r.Who)
				sw.string(r.Reason)
				sw.maybeFlush()
			}
		}
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

// waiters writes the queue q of key k: its length, then each waiter in
// the layout of the snapshot's version.
func (sw *snapWriter) waiters(hd *snapHeader, k string, q *waitQueue, v2, v4, v5 bool) {
	sw.buf = binary.AppendUvarint(sw.buf, uint64(q.len()))
	q.each(func(q *Waiter) {
		sw.string(q.Owner)
		sw.buf = binary.AppendUvarint(sw.buf, q.Ref)
		sw.buf = binary.AppendUvarint(sw.buf, uint64(q.LeaseSec))
		sw.buf = binary.AppendUvarint(sw.buf, uint64(q.WaitMs))
		sw.buf = binary.AppendVarint(sw.buf, q.EnqueuedAt)
		if v2 {
			sw.keys(q.Keys)
		}
		if v4 {
			sw.sref(q.Session, q.Seq)
		}
		if v5 {
			sw.string(hd.waiterLabels[waiterRef{q.primary(k), q.Ref}])
		}
		sw.maybeFlush()
	})
}

func (sw *snapWriter) string(s string) {
	sw.buf = binary.AppendUvarint(sw.buf, uint64(len(s)))
	sw.buf = append(sw.buf, s...)
}

// sref writes a holder's or waiter's (session, seq).
func (sw *snapWriter) sref(session, seq uint64) {
	sw.buf = binary.AppendUvarint(sw.buf, session)
	if session != 0 {
		sw.buf = binary.AppendUvarint(sw.buf, seq)
	}
}

func (sw *snapWriter) keys(keys []string) {
	sw.buf = binary.AppendUvarint(sw.buf, uint64(len(keys)))
	for _, k := range keys {
		sw.string(k)
	}
}

func (sw *snapWriter) maybeFlush() {
	// One waiter, key or block record is at most MaxBlockKeys keys plus a
	// few fields (under 5 KiB), so flushing with 8 KiB of headroom keeps
	// buf from ever growing.
	if len(sw.buf) >= snapBufSize-8<<10 {
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
	version := d.byte()
	if d.err == nil && (version < snapV1 || version > snapV7) {
		return nil, fmt.Errorf("unknown version %d", version)
	}
	v2 := version >= snapV2 // the layout of version 2, which 3 and 4 extend
	v4 := version >= snapV4
	v5 := version >= snapV5
	last := d.uvarint()
	var clock int64
	if v2 {
		clock = d.varint()
	}
	nkeys := d.uvarint()
	if d.err != nil {
		return nil, d.err
	}
	// Version 1: each held key owns a distinct token in 1..last.
	if !v2 && nkeys > last {
		return nil, fmt.Errorf("%d keys but only %d tokens ever issued", nkeys, last)
	}
	s := &State{
		keys:         make(map[string]*entry, min(nkeys, snapPrealloc)),
		queued:       make(map[string]*entry),
		blocks:       make(map[uint64][]string),
		blockWaiters: make(map[uint64][]string),
		renewed:      make(map[uint64]int64),
		labels:       make(map[uint64]string),
		waiterLabels: make(map[waiterRef]string),
		sessions:     make(map[uint64]*session),
		sems:         make(map[string]*semaphore),
		last:         last,
		clock:        clock,
	}
	tokens := make([]uint64, 0, min(nkeys, snapPrealloc))
	var refs []uint64
	// Every queued block as first read, and how many queues it was met in.
	type seenBlock struct {
		w     Waiter
		n     int
		label string
	}
	queuedBlocks := map[uint64]*seenBlock{}
	// What names a session, checked once the sessions are read: holders
	// (a block's keys each) and waiters (a block once).
	var srefs []snapRef
	var reservedKeys []string
	// How many keys carry each holding label (a block's keys each).
	labelled := map[uint64]int{}
	prev := ""
	for i := range nkeys {
		key := d.string(MaxKeyLen)
		e := &entry{}
		var h Holder
		if !v2 {
			h.Owner = intern(d.string(MaxOwnerLen))
			h.Token = d.uvarint()
		} else if h.Token = d.uvarint(); h.Token != 0 {
			h.Owner = intern(d.string(MaxOwnerLen))
		}
		if h.Token != 0 {
			h.LeaseSec = d.uint32()
			h.GrantedAt = d.varint()
			if v4 {
				h.Session, h.Seq = d.sref()
			}
			if v5 {
				h.Label = d.string(MaxLabelLen)
			}
		}
		nq := d.uvarint()
		if d.err != nil {
			return nil, fmt.Errorf("key #%d: %w", i, d.err)
		}
		switch {
		case ValidateKey(key) != nil:
			return nil, fmt.Errorf("key #%d: invalid key %q", i, key)
		case i > 0 && key <= prev:
			return nil, fmt.Errorf("key #%d: %q not after %q", i, key, prev)
		case h.Token == 0 && (!v2 || nq == 0):
			return nil, fmt.Errorf("key %q: holder token 0", key)
		case h.Token == 0:
			// Reserved; its head is checked once every queue is read.
		case ValidateOwner(h.Owner) != nil:
			return nil, fmt.Errorf("key %q: invalid holder owner %q", key, h.Owner)
		case h.Token > last:
			return nil, fmt.Errorf("key %q: holder token %d outside 1..%d", key, h.Token, last)
		case h.LeaseSec < MinLeaseSec || h.LeaseSec > MaxLeaseSec:
			return nil, fmt.Errorf("key %q: holder lease %d", key, h.LeaseSec)
		case ValidateLabel(h.Label) != nil:
			return nil, fmt.Errorf("key %q: invalid holder label %q", key, h.Label)
		}
		if h.Label != "" {
			if l, ok := s.labels[h.Token]; ok && l != h.Label {
				return nil, fmt.Errorf("key %q: label %q, another key of token %d has %q", key, h.Label, h.Token, l)
			}
			s.labels[h.Token] = h.Label
			labelled[h.Token]++
		}
		prev = key
		e.setHolder(h)
		if h.Token != 0 {
			tokens = append(tokens, h.Token)
			if h.Session != 0 {
				srefs = append(srefs, snapRef{key: key, session: h.Session, seq: h.Seq, token: h.Token})
			}
		} else {
			reservedKeys = append(reservedKeys, key)
			s.reserved++
		}
		if nq > 0 {
			e.queue = &waitQueue{ws: make([]Waiter, 0, min(nq, 64))}
			refs = refs[:0]
		}
		for j := range nq {
			var w Waiter
			w.Owner = intern(d.string(MaxOwnerLen))
			w.Ref = d.uvarint()
			w.LeaseSec = d.uint32()
			w.WaitMs = d.uint32()
			w.EnqueuedAt = d.varint()
			if v2 {
				w.Keys = d.keys()
			}
			if v4 {
				w.Session, w.Seq = d.sref()
			}
			var label string
			if v5 {
				label = d.string(MaxLabelLen)
			}
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
			case ValidateLabel(label) != nil:
				return nil, fmt.Errorf("key %q waiter #%d: invalid label %q", key, j, label)
			}
			if w.Keys != nil {
				if err := validateBlockKeys(w.Keys); err != nil || !slices.Contains(w.Keys, key) {
					return nil, fmt.Errorf("key %q waiter #%d: block keys %q", key, j, w.Keys)
				}
				if sb := queuedBlocks[w.Ref]; sb == nil {
					queuedBlocks[w.Ref] = &seenBlock{w: w, n: 1, label: label}
					s.waiting++
					if w.Session != 0 {
						srefs = append(srefs, snapRef{key: w.Keys[0], session: w.Session, seq: w.Seq, ref: w.Ref, waiter: true})
					}
				} else if !sameWaiter(sb.w, w) || sb.label != label {
					return nil, fmt.Errorf("key %q waiter #%d: block ref %d differs from its other queues", key, j, w.Ref)
				} else {
					sb.n++
					w.Keys = sb.w.Keys // one shared slice, as Apply keeps it
				}
			} else {
				s.waiting++
				if w.Session != 0 {
					srefs = append(srefs, snapRef{key: key, session: w.Session, seq: w.Seq, ref: w.Ref, waiter: true})
				}
			}
			if label != "" {
				// Beside the queue, as Apply keeps it (a block's once:
				// its queues agree, checked above).
				s.waiterLabels[waiterRef{w.primary(key), w.Ref}] = label
			}
			e.queue.push(w)
			refs = append(refs, w.Ref)
		}
		if e.queue.len() > 0 {
			slices.Sort(refs)
			for j := 1; j < len(refs); j++ {
				if refs[j] == refs[j-1] {
					return nil, fmt.Errorf("key %q: ref %d queued twice", key, refs[j])
				}
			}
			s.queued[key] = e
		}
		s.keys[key] = e
	}
	if version >= snapV6 {
		semTokens, semRefs, err := d.readSemaphores(s, labelled)
		if err != nil {
			return nil, err
		}
		tokens = append(tokens, semTokens...)
		srefs = append(srefs, semRefs...)
	}
	if v2 {
		if err := d.readBlocks(s); err != nil {
			return nil, err
		}
	}
	if err := checkSnapshotTokens(s, tokens); err != nil {
		return nil, err
	}
	for t, n := range labelled {
		// A block's label on some of its keys only: Holder would
		// show a label the others do not carry.
		if want := max(len(s.blocks[t]), 1); n != want {
			return nil, fmt.Errorf("token %d: label on %d of its %d keys", t, n, want)
		}
	}
	if version >= snapV3 {
		// tokens is sorted now.
		if err := d.readRenewals(s, tokens, version == snapV3); err != nil {
			return nil, err
		}
	}
	if v4 {
		if err := d.readSessions(s, version == snapV4, version); err != nil {
			return nil, err
		}
		if err := indexSessionRefs(s, srefs); err != nil {
			return nil, err
		}
	}
	if version >= snapV7 {
		if err := d.readRevokes(s); err != nil {
			return nil, err
		}
	}
	for ref, sb := range queuedBlocks {
		if sb.n != len(sb.w.Keys) {
			return nil, fmt.Errorf("block ref %d queued on %d of its %d keys", ref, sb.n, len(sb.w.Keys))
		}
		s.blockWaiters[ref] = sb.w.Keys
	}
	for _, k := range reservedKeys {
		head := *s.keys[k].queue.head()
		if head.Keys == nil || s.grantable(head) {
			return nil, fmt.Errorf("key %q: reserved, but its head is not a block that must wait", k)
		}
	}
	if !v2 && len(s.blocks)+len(s.blockWaiters) > 0 {
		return nil, errors.New("version 1 with blocks") // unreachable: v1 reads no block keys
	}
	// Only the lowest version that holds the content is ever written:
	// anything else would re-encode differently.
	if got := s.snapVersion(); got != version {
		return nil, fmt.Errorf("version %d for content of version %d", version, got)
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

// readSemaphores reads the semaphores section (version 6): names
// ascending and no lock's (none at all only when a kept outcome names a
// slot: the version check at the end sees to it). It returns the tokens of the held
// permits and the session refs of permits and waiters, for the checks
// every holding gets; labels of permits go to s.labels and count in
// labelled.
func (d *snapReader) readSemaphores(s *State, labelled map[uint64]int) ([]uint64, []snapRef, error) {
	n := d.uvarint()
	if d.err != nil {
		return nil, nil, d.err
	}
	var tokens []uint64
	var srefs []snapRef
	prev := ""
	for i := range n {
		key := d.string(MaxKeyLen)
		permits := d.uvarint()
		nheld := d.uvarint()
		switch {
		case d.err != nil:
			return nil, nil, fmt.Errorf("semaphore #%d: %w", i, d.err)
		case ValidateKey(key) != nil:
			return nil, nil, fmt.Errorf("semaphore #%d: invalid key %q", i, key)
		case i > 0 && key <= prev:
			return nil, nil, fmt.Errorf("semaphore #%d: %q not after %q", i, key, prev)
		case s.keys[key] != nil:
			return nil, nil, fmt.Errorf("semaphore %q: also a lock key", key)
		case permits < 1 || permits > MaxPermits:
			return nil, nil, fmt.Errorf("semaphore %q: %d permits", key, permits)
		case nheld > MaxPermits:
			return nil, nil, fmt.Errorf("semaphore %q: %d permits held", key, nheld)
		}
		prev = key
		m := newSemaphore(uint32(permits), 0)
		next := uint64(0) // the lowest slot the next permit may name
		for range nheld {
			slot := d.uvarint()
			var p permit
			p.owner = intern(d.string(MaxOwnerLen))
			p.token = d.uvarint()
			p.leaseSec = d.uint32()
			p.grantedAt = d.varint()
			p.session, p.seq = d.sref()
			label := d.string(MaxLabelLen)
			switch {
			case d.err != nil:
				return nil, nil, fmt.Errorf("semaphore %q: %w", key, d.err)
			case slot < next || slot >= MaxPermits:
				return nil, nil, fmt.Errorf("semaphore %q: slot %d out of order or range", key, slot)
			case ValidateOwner(p.owner) != nil:
				return nil, nil, fmt.Errorf("semaphore %q slot %d: invalid owner %q", key, slot, p.owner)
			case p.token == 0 || p.token > s.last:
				return nil, nil, fmt.Errorf("semaphore %q slot %d: token %d outside 1..%d", key, slot, p.token, s.last)
			case p.leaseSec < MinLeaseSec || p.leaseSec > MaxLeaseSec:
				return nil, nil, fmt.Errorf("semaphore %q slot %d: lease %d", key, slot, p.leaseSec)
			case ValidateLabel(label) != nil:
				return nil, nil, fmt.Errorf("semaphore %q slot %d: invalid label %q", key, slot, label)
			}
			if _, dup := m.slotOf[p.token]; dup {
				return nil, nil, fmt.Errorf("semaphore %q: token %d held twice", key, p.token)
			}
			m.take(uint32(slot), p)
			s.permitsHeld++
			next = slot + 1
			tokens = append(tokens, p.token)
			if label != "" {
				s.labels[p.token] = label
				labelled[p.token]++
			}
			if p.session != 0 {
				srefs = append(srefs, snapRef{key: key, session: p.session, seq: p.seq, token: p.token})
			}
		}
		nq := d.uvarint()
		if d.err != nil {
			return nil, nil, fmt.Errorf("semaphore %q: %w", key, d.err)
		}
		if nq > 0 && m.numHeld() < int(m.permits) {
			return nil, nil, fmt.Errorf("semaphore %q: %d waiters with %d of %d permits held", key, nq, m.numHeld(), m.permits)
		}
		if nq > 0 {
			m.queue = &waitQueue{ws: make([]Waiter, 0, min(nq, 64))}
		}
		refs := map[uint64]bool{}
		for j := range nq {
			var w Waiter
			w.Owner = intern(d.string(MaxOwnerLen))
			w.Ref = d.uvarint()
			w.LeaseSec = d.uint32()
			w.WaitMs = d.uint32()
			w.EnqueuedAt = d.varint()
			nbk := d.uvarint()
			w.Session, w.Seq = d.sref()
			label := d.string(MaxLabelLen)
			switch {
			case d.err != nil:
				return nil, nil, fmt.Errorf("semaphore %q waiter #%d: %w", key, j, d.err)
			case nbk != 0:
				return nil, nil, fmt.Errorf("semaphore %q waiter #%d: a block", key, j)
			case ValidateOwner(w.Owner) != nil:
				return nil, nil, fmt.Errorf("semaphore %q waiter #%d: invalid owner %q", key, j, w.Owner)
			case w.LeaseSec < MinLeaseSec || w.LeaseSec > MaxLeaseSec:
				return nil, nil, fmt.Errorf("semaphore %q waiter #%d: lease %d", key, j, w.LeaseSec)
			case w.WaitMs == 0 || w.WaitMs > MaxWaitMs:
				return nil, nil, fmt.Errorf("semaphore %q waiter #%d: wait %d", key, j, w.WaitMs)
			case ValidateLabel(label) != nil:
				return nil, nil, fmt.Errorf("semaphore %q waiter #%d: invalid label %q", key, j, label)
			case refs[w.Ref]:
				return nil, nil, fmt.Errorf("semaphore %q: ref %d queued twice", key, w.Ref)
			}
			refs[w.Ref] = true
			if label != "" {
				s.waiterLabels[waiterRef{key, w.Ref}] = label
			}
			if w.Session != 0 {
				srefs = append(srefs, snapRef{key: key, session: w.Session, seq: w.Seq, ref: w.Ref, waiter: true})
			}
			m.queue.push(w)
			s.waiting++
		}
		s.sems[key] = m
	}
	return tokens, srefs, nil
}

// readRevokes reads the revoke records (version 7): 1..MaxRevokeRecords,
// each within the field constraints of its revoke and its holding, a
// token in 1..lastToken, each key once; a block's keys a valid block with
// its key among them, and shared by the records of the same revoke that
// follow one another, as Apply keeps them.
func (d *snapReader) readRevokes(s *State) error {
	n := d.uvarint()
	switch {
	case d.err != nil:
		return fmt.Errorf("revokes: %w", d.err)
	case n > MaxRevokeRecords:
		return fmt.Errorf("%d revoke records", n)
	}
	seen := make(map[string]bool, n)
	s.revokes = make([]Revoke, 0, n)
	for i := range n {
		var r Revoke
		r.Key = d.string(MaxKeyLen)
		r.Token = d.uvarint()
		r.Who = intern(d.string(MaxOwnerLen))
		r.Reason = d.string(MaxReasonLen)
		r.At = d.varint()
		r.Owner = intern(d.string(MaxOwnerLen))
		r.Label = d.string(MaxLabelLen)
		r.Session = d.uvarint()
		permit := d.byte()
		var slot uint64
		if permit == 1 {
			slot = d.uvarint()
		}
		r.Keys = d.keys()
		switch {
		case d.err != nil:
			return fmt.Errorf("revoke #%d: %w", i, d.err)
		case ValidateKey(r.Key) != nil:
			return fmt.Errorf("revoke #%d: invalid key %q", i, r.Key)
		case seen[r.Key]:
			return fmt.Errorf("revoke #%d: key %q recorded twice", i, r.Key)
		case r.Token == 0 || r.Token > s.last:
			return fmt.Errorf("revoke %q: token %d outside 1..%d", r.Key, r.Token, s.last)
		case ValidateOwner(r.Who) != nil || ValidateReason(r.Reason) != nil:
			return fmt.Errorf("revoke %q: invalid who %q or reason %q", r.Key, r.Who, r.Reason)
		case ValidateOwner(r.Owner) != nil || ValidateLabel(r.Label) != nil:
			return fmt.Errorf("revoke %q: invalid holder %q or label %q", r.Key, r.Owner, r.Label)
		case permit > 1 || slot >= MaxPermits:
			return fmt.Errorf("revoke %q: permit %d slot %d", r.Key, permit, slot)
		case r.Keys != nil && (permit == 1 || validateBlockKeys(r.Keys) != nil || !slices.Contains(r.Keys, r.Key)):
			return fmt.Errorf("revoke %q: block keys %q", r.Key, r.Keys)
		}
		seen[r.Key] = true
		r.Permit, r.Slot = permit == 1, uint32(slot)
		if j := len(s.revokes) - 1; r.Keys != nil && j >= 0 && s.revokes[j].Token == r.Token &&
			slices.Equal(s.revokes[j].Keys, r.Keys) {
			r.Keys = s.revokes[j].Keys // one slice per revoke, as Apply keeps it
		}
		s.revokes = append(s.revokes, r)
	}
	if len(s.revokes) == 0 {
		s.revokes = nil
	}
	return d.readSessionRevokes(s, n)
}

// readSessionRevokes reads the revokes kept for sessions' brokers
// (version 7, after the nrev audit records): at least one if nrev is 0
// (else the snapshot would be version 6), each of a live session, by
// session ascending, at most MaxSessionRevokes per session, AfterSerial
// ascending within it and in ack..serial (an ack above drops it), a
// token in 1..lastToken, within its revoke's field constraints.
func (d *snapReader) readSessionRevokes(s *State, nrev uint64) error {
	n := d.uvarint()
	switch {
	case d.err != nil:
		return fmt.Errorf("session revokes: %w", d.err)
	case n+nrev == 0 || n > uint64(len(s.sessions))*MaxSessionRevokes:
		return fmt.Errorf("%d session revokes beside %d revoke records and %d sessions", n, nrev, len(s.sessions))
	}
	var prev SessionRevoke
	for i := range n {
		var r SessionRevoke
		r.Session = d.uvarint()
		r.AfterSerial = d.uvarint()
		r.Token = d.uvarint()
		r.Key = d.string(MaxKeyLen)
		r.Who = intern(d.string(MaxOwnerLen))
		r.Reason = d.string(MaxReasonLen)
		ss := s.sessions[r.Session]
		switch {
		case d.err != nil:
			return fmt.Errorf("session revoke #%d: %w", i, d.err)
		case ss == nil:
			return fmt.Errorf("session revoke #%d: no session %d", i, r.Session)
		case i > 0 && (r.Session < prev.Session || r.Session == prev.Session && r.AfterSerial < prev.AfterSerial):
			return fmt.Errorf("session revoke #%d: session %d serial %d out of order", i, r.Session, r.AfterSerial)
		case r.AfterSerial < ss.ack || r.AfterSerial > ss.serial:
			return fmt.Errorf("session revoke #%d: serial %d outside %d..%d", i, r.AfterSerial, ss.ack, ss.serial)
		case len(s.sessRevoked[r.Session]) >= MaxSessionRevokes:
			return fmt.Errorf("session revoke #%d: session %d has over %d", i, r.Session, MaxSessionRevokes)
		case r.Token == 0 || r.Token > s.last:
			return fmt.Errorf("session revoke #%d: token %d outside 1..%d", i, r.Token, s.last)
		case ValidateKey(r.Key) != nil || ValidateOwner(r.Who) != nil || ValidateReason(r.Reason) != nil:
			return fmt.Errorf("session revoke #%d: invalid key %q, who %q or reason %q", i, r.Key, r.Who, r.Reason)
		}
		if s.sessRevoked == nil {
			s.sessRevoked = make(map[uint64][]SessionRevoke)
		}
		s.sessRevoked[r.Session] = append(s.sessRevoked[r.Session], r)
		prev = r
	}
	return nil
}

// readBlocks reads the blocks section: every block's keys must be held
// under its token.
func (d *snapReader) readBlocks(s *State) error {
	n := d.uvarint()
	var prev uint64
	for i := uint64(0); i < n && d.err == nil; i++ {
		token := d.uvarint()
		keys := d.keys()
		if d.err != nil {
			break
		}
		if i > 0 && token <= prev {
			return fmt.Errorf("block #%d: token %d not after %d", i, token, prev)
		}
		prev = token
		if err := validateBlockKeys(keys); err != nil {
			return fmt.Errorf("block %d: keys %q", token, keys)
		}
		for _, k := range keys {
			if e := s.keys[k]; e == nil || e.token != token {
				return fmt.Errorf("block %d: key %q not held under it", token, k)
			}
		}
		s.blocks[token] = keys
	}
	if d.err != nil {
		return fmt.Errorf("blocks: %w", d.err)
	}
	return nil
}

// readRenewals reads the renewals section: at least one, tokens strictly
// ascending, each the token of a held key (heldTokens, sorted: one per
// held key).
func (d *snapReader) readRenewals(s *State, heldTokens []uint64, atLeastOne bool) error {
	n := d.uvarint()
	if d.err == nil && n == 0 && atLeastOne {
		return errors.New("version 3 without renewals")
	}
	var prev uint64
	for i := uint64(0); i < n && d.err == nil; i++ {
		token := d.uvarint()
		at := d.varint()
		if d.err != nil {
			break
		}
		if i > 0 && token <= prev {
			return fmt.Errorf("renewal #%d: token %d not after %d", i, token, prev)
		}
		prev = token
		if _, held := slices.BinarySearch(heldTokens, token); !held {
			return fmt.Errorf("renewal #%d: token %d holds no key", i, token)
		}
		s.renewed[token] = at
	}
	if d.err != nil {
		return fmt.Errorf("renewals: %w", d.err)
	}
	return nil
}

// snapRef is a holder or waiter of a snapshot that names a session.
type snapRef struct {
	key          string // the holder's key, or a waiter's (primary) key
	session, seq uint64
	token        uint64 // holder
	ref          uint64 // waiter
	waiter       bool
}

// readSessions reads the sessions section: at least one session if
// atLeastOne (version 4), ids ascending, each with its kept outcomes.
func (d *snapReader) readSessions(s *State, atLeastOne bool, version byte) error {
	n := d.uvarint()
	if d.err == nil && n == 0 && atLeastOne {
		return errors.New("version 4 without sessions")
	}
	var prev uint64
	for i := uint64(0); i < n && d.err == nil; i++ {
		id := d.uvarint()
		hash := string(d.bytes(SecretHashLen))
		timeout := d.uint32()
		floor, serial, ack, epoch := d.uvarint(), d.uvarint(), d.uvarint(), d.uvarint()
		openedAt := d.varint()
		nout := d.uvarint()
		if d.err != nil {
			break
		}
		switch {
		case id == 0 || (i > 0 && id <= prev):
			return fmt.Errorf("session #%d: id %d not after %d", i, id, prev)
		case timeout < MinSessionTimeoutMs || timeout > MaxSessionTimeoutMs:
			return fmt.Errorf("session %d: timeout %d", id, timeout)
		case serial > maxSerial || ack > serial:
			return fmt.Errorf("session %d: ack %d, serial %d", id, ack, serial)
		case nout != serial-ack:
			return fmt.Errorf("session %d: %d outcomes for serials %d..%d", id, nout, ack+1, serial)
		}
		prev = id
		ss := newSession(hash, timeout, openedAt)
		ss.floor, ss.serial, ss.ack, ss.epoch = floor, serial, ack, epoch
		ss.outcomes = make([]Outcome, 0, max(8, min(nout, snapPrealloc)))
		for j := uint64(0); j < nout && d.err == nil; j++ {
			o := Outcome{Seq: d.uvarint(), Serial: ack + 1 + j, Status: Status(d.byte())}
			switch o.Status {
			case StatusGranted:
				o.Token = d.uvarint()
				if version >= snapV6 {
					if slot := d.uvarint(); slot >= MaxPermits && d.err == nil {
						return fmt.Errorf("session %d outcome #%d: slot %d", id, j, slot)
					} else {
						o.Slot = uint32(slot)
					}
				}
			case StatusRejected:
				if c := d.byte(); c >= 1 && int(c) <= len(outcomeErrs) {
					o.Err = outcomeErrs[c-1]
				} else if d.err == nil {
					return fmt.Errorf("session %d outcome #%d: err %d", id, j, c)
				}
			case StatusBusy, StatusReleased, StatusExtended, StatusTimedOut:
			default:
				if d.err == nil {
					return fmt.Errorf("session %d outcome #%d: status %d", id, j, o.Status)
				}
			}
			if d.err != nil {
				break
			}
			switch _, dup := ss.bySeq[o.Seq]; {
			case o.Seq == 0 || dup:
				return fmt.Errorf("session %d outcome #%d: seq %d", id, j, o.Seq)
			case o.Status == StatusGranted && (o.Token == 0 || o.Token > s.last):
				return fmt.Errorf("session %d outcome #%d: token %d outside 1..%d", id, j, o.Token, s.last)
			}
			ss.outcomes = append(ss.outcomes, o)
			ss.bySeq[o.Seq] = o.Serial
		}
		s.sessions[id] = ss
	}
	if d.err != nil {
		return fmt.Errorf("sessions: %w", d.err)
	}
	return nil
}

// indexSessionRefs checks that every holder and waiter naming a session
// names a live one, and builds the sessions' indexes of them: a block's
// keys must agree on (session, seq), and a session's waiter seqs be
// unique and distinct from its outcomes'.
func indexSessionRefs(s *State, refs []snapRef) error {
	for _, r := range refs {
		ss := s.sessions[r.session]
		if ss == nil {
			return fmt.Errorf("key %q: session %d does not exist", r.key, r.session)
		}
		if r.waiter {
			if ss.has(r.seq) {
				return fmt.Errorf("key %q: session %d seq %d queued twice or with an outcome", r.key, r.session, r.seq)
			}
			ss.waiters[r.seq] = sessionWaiter{key: r.key, ref: r.ref}
			continue
		}
		key := r.key
		if b, ok := s.blocks[r.token]; ok {
			key = b[0]
			for _, k := range b {
				if e := s.keys[k]; e.session != r.session || e.seq != r.seq {
					return fmt.Errorf("block %d: key %q has session %d seq %d, key %q %d %d", r.token, k, e.session, e.seq, r.key, r.session, r.seq)
				}
			}
		}
		ss.holdings[r.token] = key
	}
	return nil
}

// checkSnapshotTokens checks that tokens (one per held key) are pairwise
// distinct except that the keys of a block share its token, and only they.
func checkSnapshotTokens(s *State, tokens []uint64) error {
	slices.Sort(tokens)
	for j := 0; j < len(tokens); {
		t, n := tokens[j], 1
		for j+n < len(tokens) && tokens[j+n] == t {
			n++
		}
		keys, block := s.blocks[t]
		switch {
		case block && len(keys) != n:
			return fmt.Errorf("token %d: held by %d keys, its block has %d", t, n, len(keys))
		case !block && n > 1:
			return fmt.Errorf("token %d held by two keys", t)
		}
		j += n
	}
	return nil
}

// sameWaiter reports whether two occurrences of a queued block agree.
func sameWaiter(a, b Waiter) bool {
	return a.Owner == b.Owner && a.Ref == b.Ref && a.LeaseSec == b.LeaseSec && a.WaitMs == b.WaitMs &&
		a.EnqueuedAt == b.EnqueuedAt && slices.Equal(a.Keys, b.Keys) && a.Session == b.Session && a.Seq == b.Seq
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

// keys reads a key list: nil for a count of 0, else the count's keys (up
// to MaxBlockKeys; a larger count is corruption).
// sref reads a holder's or waiter's (session, seq): a seq follows only a
// session, and is then nonzero.
func (d *snapReader) sref() (session, seq uint64) {
	if session = d.uvarint(); session != 0 {
		if seq = d.uvarint(); seq == 0 && d.err == nil {
			d.err = errors.New("session without seq")
		}
	}
	return session, seq
}

func (d *snapReader) keys() []string {
	n := d.uvarint()
	if d.err != nil || n == 0 {
		return nil
	}
	if n > MaxBlockKeys {
		d.err = fmt.Errorf("%d block keys exceed %d", n, MaxBlockKeys)
		return nil
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = d.string(MaxKeyLen)
	}
	return keys
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
