package cluster

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster/leader"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// Log entry layout (the Data of a raft.LogCommand entry). The first byte says
// what follows:
//
//	'L' locksm batch: the rest is locksm.AppendBatch's encoding
//	'A' client address: node_id str8 | client_addr str8
//	    (a new leader records its own client address in the log, so every
//	    follower can send clients there in an M reply, and the serving
//	    leader records every other member's, learned over discovery, so
//	    that members replies list them; see memberaddrs.go)
//	'D' domain creation: domain str8 | token_floor u64
//	    (the first leader of a new cluster names its fencing domain and
//	    raises the token counter to the floor; only the first 'D' of a log
//	    counts, later ones are ignored)
//	'V' cluster version: version u16
//	    (the protocol version every member is known to speak: written by
//	    bootstrap after 'D', and by the serving leader when discovery finds
//	    every member at a higher one than the log says; it only rises. A
//	    leader proposes what older nodes cannot apply — block acquires,
//	    from wire.VersionBlocks — only once it says so. A node older than
//	    'V' logs it as an unknown kind and skips it, which is harmless: it
//	    is written only when no such node is a member)
//	'C' log verification checkpoint: leader_time u64 (Unix ms)
//	    (the serving leader appends one every so often, from cluster
//	    version wire.VersionLogVerify; the log store's verifier writes
//	    the checksum of the entries since the previous one into its Raft
//	    Extensions and every node checks its stored copy against it, see
//	    logverify.go. Applying it changes nothing, and the payload is
//	    not read: a node applies any 'C' alike)
//
// An entry that does not decode is skipped on every replica alike (the same
// bytes fail the same way everywhere) and logged.
const (
	entryLockBatch  byte = 'L'
	entryAnnounce   byte = 'A'
	entryDomain     byte = 'D'
	entryVersion    byte = 'V'
	entryCheckpoint byte = 'C'
)

// applied is one applied command and what it did, handed to the node after
// the state lock is released, in log order.
type applied = leader.Applied

// applySink receives what each committed entry did. It is called from the
// FSM goroutine only, in log order, without the FSM lock held.
//
// applyBatch runs apply, which changes the table under the FSM lock and
// returns what the lock commands did, and hands the result to whoever
// answers it, all under the sink's own lock (Node.mu): nothing that reads
// the table under that lock may see a change before the leader core has
// learned of it (admission would count an applied acquire twice, queued
// and still in flight, and refuse others with a count that was never
// true). The batch slice is reused afterwards: a sink must not keep it.
type applySink interface {
	applyBatch(apply func() []applied)
	onAnnounce(nodeID, clientAddr string)
}

// fsm is the raft.FSM wrapping the lock table. Raft calls Apply/ApplyBatch,
// Snapshot and Restore from one goroutine; the node reads state through the
// accessors under mu.
type fsm struct {
	sink    applySink
	log     *slog.Logger
	metrics *nodeMetrics // nil: not counted

	mu          sync.Mutex
	state       *locksm.State
	clientAddrs map[string]string // server id → advertised client address
	domain      string            // the fencing domain; "" until the first 'D'
	// domainKnown is closed once domain is set (by a 'D' or a snapshot):
	// client handshakes wait for it (server.go).
	domainKnown chan struct{}
	// clusterVersion is the highest 'V' applied: the protocol version
	// every member speaks (0: none recorded).
	clusterVersion uint16

	// Scratch reused across ApplyBatch calls (FSM goroutine only). out is
	// handed to the sink, which must not keep it.
	cmds []locksm.Command
	out  []applied
}

func newFSM(sink applySink, log *slog.Logger) *fsm {
	return &fsm{sink: sink, log: log, state: locksm.New(), clientAddrs: map[string]string{}, domainKnown: make(chan struct{})}
}

// Apply implements raft.FSM.
func (f *fsm) Apply(l *raft.Log) interface{} {
	f.ApplyBatch([]*raft.Log{l})
	return nil
}

// ApplyBatch implements raft.BatchingFSM.
func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	type announce struct{ id, addr string }
	var announces []announce
	f.sink.applyBatch(func() []applied {
		f.out = f.applyLocked(logs, func(id, addr string) { announces = append(announces, announce{id, addr}) })
		return f.out
	})
	clear(f.out) // keep no keys, owners or effects alive until the next batch
	f.out = f.out[:0]
	for _, a := range announces {
		f.sink.onAnnounce(a.id, a.addr)
	}
	return make([]interface{}, len(logs))
}

// applyLocked applies logs to the table under f.mu and returns what their
// lock commands did; announced is told each client address recorded.
func (f *fsm) applyLocked(logs []*raft.Log, announced func(id, addr string)) []applied {
	out := f.out[:0]
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range logs {
		if l.Type != raft.LogCommand || len(l.Data) == 0 {
			continue
		}
		switch l.Data[0] {
		case entryLockBatch:
			cmds, err := locksm.DecodeBatch(l.Data[1:], f.cmds[:0])
			f.cmds = cmds[:0]
			if err != nil {
				f.log.Error("skipping undecodable log entry", "index", l.Index, "err", err)
				continue
			}
			// How releases and extends are matched is replicated
			// semantics: every replica switches at the same index, the
			// 'V' entry that raises the cluster version to 9, so a mixed
			// cluster never applies one entry two ways (locksm.MATRIX.md,
			// "Matching before protocol version 9").
			f.state.SetLegacyMatching(f.clusterVersion < wire.VersionStrictMatch)
			// From version 10 an extend never shortens a lease (same switch).
			f.state.SetExtendMayShorten(f.clusterVersion < wire.VersionExtendNeverShortens)
			// From version 11 a wait may be an hour (same switch).
			f.state.SetShortWaits(f.clusterVersion < wire.VersionLongWaits)
			for _, c := range cmds {
				res, eff := f.state.Apply(c, nil)
				out = append(out, applied{Cmd: c, Res: res, Effects: eff, Term: l.Term, Index: l.Index})
			}
		case entryAnnounce:
			id, addr, err := decodeAnnounce(l.Data[1:])
			if err != nil {
				f.log.Error("skipping undecodable announcement", "index", l.Index, "err", err)
				continue
			}
			f.clientAddrs[id] = addr
			announced(id, addr)
		case entryDomain:
			domain, floor, err := decodeDomain(l.Data[1:])
			if err != nil {
				f.log.Error("skipping undecodable domain entry", "index", l.Index, "err", err)
				continue
			}
			if f.domain == "" {
				f.domain = domain
				f.state.RaiseTokenFloor(floor)
				f.noteDomainLocked()
			}
		case entryVersion:
			if len(l.Data) != 3 {
				f.log.Error("skipping undecodable cluster version entry", "index", l.Index)
				continue
			}
			if v := binary.BigEndian.Uint16(l.Data[1:]); v > f.clusterVersion {
				f.clusterVersion = v
			}
		case entryCheckpoint:
			// Log verification only (the log store's verifier checked
			// it when it was stored): nothing to apply.
		default:
			f.log.Error("skipping log entry of unknown kind", "index", l.Index, "kind", l.Data[0])
		}
	}
	return out
}

func encodeAnnounce(id, addr string) []byte {
	b := []byte{entryAnnounce, byte(len(id))}
	b = append(b, id...)
	b = append(b, byte(len(addr)))
	return append(b, addr...)
}

func encodeDomain(domain string, floor uint64) []byte {
	b := []byte{entryDomain, byte(len(domain))}
	b = append(b, domain...)
	return binary.BigEndian.AppendUint64(b, floor)
}

// encodeCheckpoint is a log verification checkpoint stamped with the
// leader's wall clock.
func encodeCheckpoint(now time.Time) []byte {
	return binary.BigEndian.AppendUint64([]byte{entryCheckpoint}, uint64(now.UnixMilli()))
}

// isCheckpoint recognizes a checkpoint entry (verifier.IsCheckpointFn): it
// runs on every entry the log store stores, so it only looks at the kind.
func isCheckpoint(l *raft.Log) (bool, error) {
	return l.Type == raft.LogCommand && len(l.Data) > 0 && l.Data[0] == entryCheckpoint, nil
}

func encodeClusterVersion(v uint16) []byte {
	return binary.BigEndian.AppendUint16([]byte{entryVersion}, v)
}

func decodeDomain(b []byte) (domain string, floor uint64, err error) {
	if len(b) < 1 || len(b) != 1+int(b[0])+8 || b[0] == 0 {
		return "", 0, errCorruptEntry
	}
	return string(b[1 : 1+int(b[0])]), binary.BigEndian.Uint64(b[1+int(b[0]):]), nil
}

func decodeAnnounce(b []byte) (id, addr string, err error) {
	str := func() (string, bool) {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return "", false
		}
		s := string(b[1 : 1+int(b[0])])
		b = b[1+int(b[0]):]
		return s, true
	}
	var ok1, ok2 bool
	id, ok1 = str()
	addr, ok2 = str()
	if !ok1 || !ok2 || len(b) != 0 {
		return "", "", errCorruptEntry
	}
	return id, addr, nil
}

// Snapshot layout: magic "TKSN" | version u8 (2 or 3) | domain str8 |
// [version 3: cluster_version u16] | n u32 | n × (node_id str8 |
// client_addr str8) | the locksm snapshot. Version 1 had no domain field.
// Version 3 is written only once the cluster version reaches
// wire.VersionBlocks (every member reads it then); below that the cluster
// version means nothing yet and version 2 leaves it out, so nodes older
// than it can still install the snapshot.
const (
	snapshotVersion                 = 3
	snapshotVersionNoClusterVersion = 2
)

var snapshotMagic = []byte("TKSN")

// Snapshot implements raft.FSM. Raft calls it on the apply goroutine, so it
// must be quick: it only freezes the table (a copy of the key map; entries
// are copied on write afterwards) and encodes the small header. Persist,
// which Raft runs concurrently with later applies, sorts and encodes the
// frozen table: with a million held keys that is about a second that
// applies no longer wait for.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	head := append([]byte(nil), snapshotMagic...)
	v3 := f.clusterVersion >= wire.VersionBlocks
	if v3 {
		head = append(head, snapshotVersion)
	} else {
		head = append(head, snapshotVersionNoClusterVersion)
	}
	head = append(head, byte(len(f.domain)))
	head = append(head, f.domain...)
	if v3 {
		head = binary.BigEndian.AppendUint16(head, f.clusterVersion)
	}
	ids := make([]string, 0, len(f.clientAddrs))
	for id := range f.clientAddrs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	head = binary.BigEndian.AppendUint32(head, uint32(len(ids)))
	for _, id := range ids {
		head = append(head, byte(len(id)))
		head = append(head, id...)
		head = append(head, byte(len(f.clientAddrs[id])))
		head = append(head, f.clientAddrs[id]...)
	}
	return &fsmSnapshot{head: head, table: f.state.Freeze(), metrics: f.metrics}, nil
}

// Restore implements raft.FSM.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer func() { _ = rc.Close() }() // read only
	r := bufio.NewReader(rc)
	head := make([]byte, 5)
	if _, err := io.ReadFull(r, head); err != nil {
		return fmt.Errorf("cluster: snapshot header: %w", err)
	}
	if !bytes.Equal(head[:4], snapshotMagic) || head[4] < 1 || head[4] > snapshotVersion {
		return fmt.Errorf("cluster: not a version 1..%d snapshot", snapshotVersion)
	}
	readStr := func() (string, error) {
		l, err := r.ReadByte()
		if err != nil {
			return "", err
		}
		b := make([]byte, l)
		_, err = io.ReadFull(r, b)
		return string(b), err
	}
	var domain string
	if head[4] >= 2 {
		var err error
		if domain, err = readStr(); err != nil {
			return fmt.Errorf("cluster: snapshot domain: %w", err)
		}
	}
	var clusterVersion uint16
	if head[4] >= 3 {
		var vb [2]byte
		if _, err := io.ReadFull(r, vb[:]); err != nil {
			return fmt.Errorf("cluster: snapshot cluster version: %w", err)
		}
		clusterVersion = binary.BigEndian.Uint16(vb[:])
	}
	var nb [4]byte
	if _, err := io.ReadFull(r, nb[:]); err != nil {
		return fmt.Errorf("cluster: snapshot header: %w", err)
	}
	n := binary.BigEndian.Uint32(nb[:])
	if n > 1024 {
		return fmt.Errorf("cluster: snapshot lists %d nodes", n)
	}
	addrs := map[string]string{}
	for i := uint32(0); i < n; i++ {
		id, err := readStr()
		if err != nil {
			return fmt.Errorf("cluster: snapshot node list: %w", err)
		}
		addr, err := readStr()
		if err != nil {
			return fmt.Errorf("cluster: snapshot node list: %w", err)
		}
		addrs[id] = addr
	}
	st, err := locksm.ReadSnapshot(r)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.state, f.clientAddrs, f.domain, f.clusterVersion = st, addrs, domain, clusterVersion
	f.noteDomainLocked()
	f.mu.Unlock()
	if f.metrics != nil {
		f.metrics.restores.Inc()
	}
	return nil
}

type fsmSnapshot struct {
	head    []byte         // everything before the locksm snapshot
	table   *locksm.Frozen // the lock table at the moment of Snapshot
	metrics *nodeMetrics   // nil: not counted
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	w := &countingWriter{w: sink}
	_, err := w.Write(s.head)
	if err == nil {
		err = s.table.WriteSnapshot(w)
	}
	if err != nil {
		sink.Cancel()
		return err
	}
	if err := sink.Close(); err != nil {
		return err
	}
	if s.metrics != nil {
		s.metrics.snapshotsTaken.Inc()
		s.metrics.snapshotBytes.Add(float64(w.n))
	}
	return nil
}

// Release drops the frozen table, so entries replaced since can be freed.
func (s *fsmSnapshot) Release() { s.table = nil }

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// read runs fn with the state locked.
func (f *fsm) read(fn func(st *locksm.State)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.state)
}

// getClusterVersion returns the protocol version every member is known to
// speak (0 before the first 'V' entry).
func (f *fsm) getClusterVersion() uint16 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clusterVersion
}

// getDomain returns the fencing domain ("" before the first 'D' entry).
// noteDomainLocked closes domainKnown once the domain is set. Requires mu.
func (f *fsm) noteDomainLocked() {
	if f.domain == "" {
		return
	}
	select {
	case <-f.domainKnown:
	default:
		close(f.domainKnown)
	}
}

// domainSet is closed once this node knows its cluster's fencing domain.
func (f *fsm) domainSet() <-chan struct{} { return f.domainKnown }

func (f *fsm) getDomain() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.domain
}

// Occupancy, HeldUnder and RangeHolders are the lock table as the leader
// core reads it (leader.Table), each under mu.

// Occupancy implements leader.Table.
func (f *fsm) Occupancy(key string) (held bool, keys, queue int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// A reserved key (unheld, its head a block waiting for its other
	// keys) has an entry like a held one, and a semaphore its
	// definition: an acquire of either joins the queue or takes a
	// permit, and creates no key.
	// Semaphores and their permits are holdings as keys are: MaxKeys,
	// which bounds the table's memory, counts them (else a client could
	// take 100,000 permits of each of any number of semaphores past it).
	n := f.state.NumHeld() + f.state.NumReserved() + f.state.NumSemaphores() + f.state.NumPermitsHeld()
	return f.state.Occupied(key), n, f.state.QueueLen(key)
}

// Semaphore implements leader.Table.
func (f *fsm) Semaphore(key string) (locksm.Semaphore, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.Semaphore(key)
}

// ClusterVersion implements leader.Table.
func (f *fsm) ClusterVersion() uint16 { return f.getClusterVersion() }

// HeldUnder implements leader.Table.
func (f *fsm) HeldUnder(key string, token uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.HeldUnder(key, token)
}

// MatchesHolding implements leader.Table.
func (f *fsm) MatchesHolding(key, owner string, token, session uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.MatchesHolding(key, owner, token, session)
}

// RangeHolders implements leader.Table; fn runs under mu and must take no
// lock.
func (f *fsm) RangeHolders(fn func(key string, h locksm.Holder) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state.RangeHolders(fn)
}

// Sessions, Session, SessionOutcomes and SessionWaiters implement
// leader.Table's session reads, each under mu.

// Sessions implements leader.Table.
// NumSessions implements leader.Table.
func (f *fsm) NumSessions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.NumSessions()
}

func (f *fsm) Sessions() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.Sessions()
}

// Session implements leader.Table.
func (f *fsm) Session(id uint64) (locksm.SessionInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.Session(id)
}

// SessionOutcomes implements leader.Table.
func (f *fsm) SessionOutcomes(id uint64) []locksm.Outcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.SessionOutcomes(id)
}

// SessionWaiters implements leader.Table.
func (f *fsm) SessionWaiters(id uint64) []locksm.SessionQueued {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.SessionWaiters(id)
}

// RangeWaiters implements leader.Table: the walk of one line for
// positions, under mu (a pure read of the state, so it never races the
// caches Apply keeps); fn runs under mu and must take no lock.
func (f *fsm) RangeWaiters(key string, fn func(w *locksm.Waiter) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state.RangeWaiters(key, fn)
}

// SessionHolds implements leader.Table.
func (f *fsm) SessionHolds(id, token uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.SessionHolds(id, token)
}

// SessionRevokes implements leader.Table.
func (f *fsm) SessionRevokes(id uint64) []locksm.SessionRevoke {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.SessionRevokes(id)
}

func (f *fsm) clientAddr(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clientAddrs[id]
}
