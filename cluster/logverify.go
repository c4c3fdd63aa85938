package cluster

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/metrics"
	"github.com/hashicorp/raft-wal/verifier"

	"ticketing/cluster/wire"
)

// Online log verification (issue 40), on by default (Config.DisableLogVerify
// turns it off on one node).
//
// Every node's Raft log store is wrapped in raft-wal's verifier
// (github.com/hashicorp/raft-wal/verifier, which works over any
// raft.LogStore, bolt included). The wrapper keeps a running checksum
// (FNV-1a over index, term, type, data and extensions) of the entries it
// stores. The serving leader appends a checkpoint entry ('C', fsm.go) every
// LogVerifyInterval or LogVerifyEntries entries, whichever comes first; when
// the leader's store stores it, the wrapper writes the checksum of the
// entries since the previous checkpoint into the entry's Raft Extensions,
// which hashicorp/raft replicates with the entry (the leader replicates
// what its store stored: the same raft.Log, from the log cache). When a
// node's store stores a checkpoint that carries a checksum, the wrapper
// compares:
//
//   - the checksum of what this node stored over the same range (written
//     sum) with the leader's: a difference means what this node received
//     differs from what the leader wrote (in-flight corruption, or the
//     leader's own memory);
//   - then, in the background, the checksum of the range read back from
//     this node's store (read sum) with the leader's: a difference means
//     the store returns something other than what was written (storage
//     corruption).
//
// logVerified gets each result: a metric (ticketing_node_log_verifications_total
// by result) and, for a mismatch, an error log with the index range. The
// checkpoint's apply is a no-op: verification never changes lock state,
// and a mismatch changes nothing either (the operator replaces the node,
// docs/operations.md, "Log verification").
//
// Mixed versions: the leader appends checkpoints only once the cluster
// version is at least wire.VersionLogVerify, so no member of an older build
// meets the 'C' kind.

// Results of one verified range: the result label of
// ticketing_node_log_verifications_total.
const (
	verifyOK = iota
	// verifyStorage: the range read back from this node's store differs
	// from what the leader wrote, though this node wrote it as received.
	verifyStorage
	// verifyInFlight: what this node wrote differs from what the leader
	// wrote.
	verifyInFlight
	// verifyUnverified: no check covered the range (it is no longer in
	// this node's log, a read failed, or the node was still busy with the
	// previous range).
	verifyUnverified
	numVerifyResults
)

var verifyResultNames = [numVerifyResults]string{"ok", "storage_corruption", "in_flight_corruption", "unverified"}

// verifiedStore is a node's log store behind raft-wal's verifier: the log
// goes through the verifier, the stable store (term, vote) straight to
// the store.
//
// When the log's tail is cut off (a new leader overwrites a follower's
// uncommitted entries, or an installed snapshot replaces the whole log of
// a raft-wal node), the verifier starts over: its running checksum had
// summed the deleted entries as well as what replaces them, so the range
// it is in would not match the leader's (a follower would report
// in-flight corruption), or, were this node to lead next, every node's
// copy would not match the checksum it appends (every node would report
// storage corruption). A fresh verifier sums from the next entry stored:
// the next range is only read back, not compared as written (its start
// differs from the leader's), and the one after is checked in full.
type verifiedStore struct {
	raft.StableStore
	base   LogStore
	under  *verifierBase
	report verifier.ReportFn

	// mu orders appends (read-locked: Raft appends from one goroutine)
	// before a restart of the verifier (locked), so that no append meets
	// a verifier being closed.
	mu sync.RWMutex
	v  atomic.Pointer[verifier.LogStore]
}

// verifierBase is the store under the verifier: it says whether it is
// monotonic (raft-wal is) and hides its Close (the verifier closes only
// its checker; verifiedStore.Close closes the store once).
type verifierBase struct {
	raft.LogStore
	mono bool
}

func (b *verifierBase) IsMonotonic() bool { return b.mono }

// newVerifiedStore wraps base; report gets every verification's result.
// wrap, when set, goes between the verifier and base (tests: a store that
// reads back something else).
func newVerifiedStore(base LogStore, report verifier.ReportFn, wrap func(raft.LogStore) raft.LogStore) *verifiedStore {
	mono := false
	if m, ok := base.(raft.MonotonicLogStore); ok {
		mono = m.IsMonotonic()
	}
	var under raft.LogStore = base
	if wrap != nil {
		under = wrap(under)
	}
	s := &verifiedStore{StableStore: base, base: base, under: &verifierBase{LogStore: under, mono: mono}, report: report}
	s.v.Store(s.newVerifier())
	return s
}

func (s *verifiedStore) newVerifier() *verifier.LogStore {
	return verifier.NewLogStore(s.under, isCheckpoint, s.report, &metrics.NoOpCollector{})
}

// FirstIndex, LastIndex and GetLog read the store.
func (s *verifiedStore) FirstIndex() (uint64, error)            { return s.under.FirstIndex() }
func (s *verifiedStore) LastIndex() (uint64, error)             { return s.under.LastIndex() }
func (s *verifiedStore) GetLog(index uint64, l *raft.Log) error { return s.under.GetLog(index, l) }

// IsMonotonic is the store's.
func (s *verifiedStore) IsMonotonic() bool { return s.under.mono }

// StoreLog and StoreLogs append through the verifier.
func (s *verifiedStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s *verifiedStore) StoreLogs(logs []*raft.Log) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.v.Load().StoreLogs(logs)
}

// DeleteRange deletes [lo, hi]; when that cuts off the log's tail (a
// deletion from the head, log compaction, leaves the last entry), the
// verifier starts over.
func (s *verifiedStore) DeleteRange(lo, hi uint64) error {
	last, err := s.under.LastIndex()
	if err != nil {
		return err
	}
	if err := s.under.DeleteRange(lo, hi); err != nil {
		return err
	}
	if hi < last {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The old verifier delivers a report it already queued, then stops.
	return s.v.Swap(s.newVerifier()).Close()
}

// Close stops the verifier, then closes the store.
func (s *verifiedStore) Close() error {
	s.mu.Lock()
	err := s.v.Load().Close()
	s.mu.Unlock()
	if cerr := s.base.Close(); err == nil {
		err = cerr
	}
	return err
}

// classifyVerification is the result of a verifier's report.
func classifyVerification(r verifier.VerificationReport) int {
	var mismatch verifier.ErrChecksumMismatch
	switch {
	case r.Err == nil:
		return verifyOK
	case errors.As(r.Err, &mismatch):
		// The verifier compares the written sum first: when it differs
		// (and is known: zero is "not written over this whole range since
		// the verifier started"), it reports that and reads nothing back.
		if r.WrittenSum != 0 && r.WrittenSum != r.ExpectedSum {
			return verifyInFlight
		}
		return verifyStorage
	}
	return verifyUnverified
}

// logVerified is the verifier's ReportFn: it counts and logs one verified
// range. It runs on the verifier's goroutine, one report at a time.
func (n *Node) logVerified(r verifier.VerificationReport) {
	select {
	case <-n.closing:
		return // the store is closing under it: nothing to tell
	default:
	}
	res := classifyVerification(r)
	n.metrics.logVerifications[res].Inc()
	// Range is [Start, End): End is the checkpoint's own index.
	attrs := []any{"first_index", r.Range.Start, "last_index", r.Range.End - 1, "checkpoint_index", r.Range.End}
	sums := []any{"leader_sum", fmt.Sprintf("%016x", r.ExpectedSum), "written_sum", fmt.Sprintf("%016x", r.WrittenSum),
		"read_sum", fmt.Sprintf("%016x", r.ReadSum)}
	switch res {
	case verifyOK:
		n.log.Debug("log range verified", append(attrs, "took", r.Elapsed)...)
	case verifyStorage:
		n.log.Error("LOG VERIFICATION FAILED: storage corruption: this node's log store reads back entries "+
			"that differ from what it wrote and the leader wrote; replace this node with a fresh data dir "+
			"(docs/operations.md, \"Log verification\")", append(append(attrs, sums...), "err", r.Err)...)
	case verifyInFlight:
		n.log.Error("LOG VERIFICATION FAILED: in-flight corruption: the entries this node received and wrote "+
			"differ from what the leader wrote; replace this node with a fresh data dir "+
			"(docs/operations.md, \"Log verification\")", append(append(attrs, sums...), "err", r.Err)...)
	default:
		if errors.Is(r.Err, verifier.ErrRangeMismatch) {
			n.log.Info("log range not verified: it is no longer (or not yet) in this node's log", attrs...)
		} else {
			n.log.Warn("log range not verified", append(attrs, "err", r.Err)...)
		}
	}
	if sk := r.SkippedRange; sk != nil {
		n.metrics.logVerifications[verifyUnverified].Inc()
		n.log.Warn("log range not verified: the node was still verifying the previous range when its checkpoint "+
			"came", "first_index", sk.Start, "last_index", sk.End-1)
	}
}

// checkpointLoop appends the log verification checkpoints while this node
// is the serving leader and the cluster version allows them: one once
// LogVerifyEntries entries or LogVerifyInterval have passed since the
// previous one (or since this node began to serve), and none while nothing
// is appended.
func (n *Node) checkpointLoop() {
	defer n.wg.Done()
	every, entries := n.cfg.LogVerifyInterval, n.cfg.LogVerifyEntries
	tick := time.NewTicker(min(every, time.Second))
	defer tick.Stop()
	var (
		leading bool      // serving at the previous tick
		last    uint64    // the index of the previous checkpoint, or where this node began to serve
		lastAt  time.Time // and when
	)
	for {
		select {
		case <-tick.C:
		case <-n.closing:
			return
		}
		if !n.Serving() || n.fsm.getClusterVersion() < wire.VersionLogVerify {
			leading = false
			continue
		}
		li := n.raft.LastIndex()
		if !leading {
			leading, last, lastAt = true, li, time.Now()
			continue
		}
		if li <= last || li-last < entries && time.Since(lastAt) < every {
			continue
		}
		f := n.raft.Apply(encodeCheckpoint(n.cfg.Now()), 10*n.cfg.HeartbeatTimeout)
		if err := n.await(f); err != nil {
			// Refused during a hand-over or after losing the lead: the
			// next leader appends the next one.
			n.log.Debug("appending a log verification checkpoint failed", "err", err)
			leading = false
			continue
		}
		last, lastAt = f.Index(), time.Now()
		n.metrics.logCheckpoints.Inc()
	}
}
