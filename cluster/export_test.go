package cluster

import (
	"sort"

	"github.com/hashicorp/raft"
)

// ConfigEntry is one configuration in a node's Raft log (tests only).
type ConfigEntry struct {
	Index            uint64
	Voters, Learners []string
}

// ConfigHistory returns every configuration in node n's log, oldest
// first, so a test can see each step a membership change went through
// (polling the members would miss a configuration that lasted a moment).
func ConfigHistory(n *Node) ([]ConfigEntry, error) {
	first, err := n.store.FirstIndex()
	if err != nil {
		return nil, err
	}
	last, err := n.store.LastIndex()
	if err != nil {
		return nil, err
	}
	var out []ConfigEntry
	for i := max(first, 1); i <= last; i++ {
		var l raft.Log
		if err := n.store.GetLog(i, &l); err != nil {
			return nil, err
		}
		if l.Type != raft.LogConfiguration {
			continue
		}
		e := ConfigEntry{Index: i}
		for _, s := range raft.DecodeConfiguration(l.Data).Servers {
			if s.Suffrage == raft.Voter {
				e.Voters = append(e.Voters, string(s.ID))
			} else {
				e.Learners = append(e.Learners, string(s.ID))
			}
		}
		sort.Strings(e.Voters)
		sort.Strings(e.Learners)
		out = append(out, e)
	}
	return out, nil
}

// LogFirstIndex is the first index in node n's log store (tests only).
func LogFirstIndex(n *Node) (uint64, error) { return n.store.FirstIndex() }

// LockBatchEntries counts the lock-command entries (batches) in node n's
// log after index from (tests only).
func LockBatchEntries(n *Node, from uint64) (int, error) {
	last, err := n.store.LastIndex()
	if err != nil {
		return 0, err
	}
	count := 0
	for i := from + 1; i <= last; i++ {
		var l raft.Log
		if err := n.store.GetLog(i, &l); err != nil {
			return 0, err
		}
		if l.Type == raft.LogCommand && len(l.Data) > 0 && l.Data[0] == entryLockBatch {
			count++
		}
	}
	return count, nil
}

// PipelinedReplication reports whether node n's transport would replicate
// through an AppendEntries pipeline (tests only).
func PipelinedReplication(n *Node) bool {
	p, err := n.transport.AppendEntriesPipeline(raft.ServerID("x"), raft.ServerAddress("127.0.0.1:1"))
	if p != nil {
		_ = p.Close()
	}
	return err != raft.ErrPipelineReplicationNotSupported
}

// ClientConns is the number of client connections node n serves (a
// closed one leaves once the node has seen it close).
func ClientConns(n *Node) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.conns)
}

// WrapLogStore puts test stores around node cfg's log store (tests only):
// under sits between the log verifier and the store (what the node reads
// back), over between Raft's log cache and the verifier (what the node
// writes). Either may be nil.
func WrapLogStore(cfg *Config, under, over func(raft.LogStore) raft.LogStore) {
	cfg.storeWrap = storeWrap{under: under, over: over}
}

// CheckpointKind is the kind byte of a log verification checkpoint
// (tests only).
const CheckpointKind = entryCheckpoint

// EntriesOfKind counts the command entries of node n's log whose data
// starts with kind (tests only).
func EntriesOfKind(n *Node, kind byte) (int, error) {
	first, err := n.store.FirstIndex()
	if err != nil {
		return 0, err
	}
	last, err := n.store.LastIndex()
	if err != nil {
		return 0, err
	}
	count := 0
	for i := max(first, 1); i <= last; i++ {
		var l raft.Log
		if err := n.store.GetLog(i, &l); err != nil {
			return 0, err
		}
		if l.Type == raft.LogCommand && len(l.Data) > 0 && l.Data[0] == kind {
			count++
		}
	}
	return count, nil
}
