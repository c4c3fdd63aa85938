package cluster

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster/wire"
)

// Membership changes, one at a time, on the leader.
//
// A node is replaced by a new server (a new NAME/INCARNATION), never
// revived under an old id. hashicorp/raft applies each change as one
// single-server configuration change, committed before the next may
// start, so any two consecutive configurations share a majority; that is
// what keeps each change safe. What the order of the changes decides is
// how many failures the cluster survives on the way.
//
// The replacement rule. With v voters of which h answer, the cluster
// survives h − (⌊v/2⌋+1) more voter failures (tolerance; negative: no
// majority answers and nothing can commit). A replacement of OLD by NEW
// takes the order that never lowers it below its value now:
//
//   - OLD does not answer (dead, or a wiped node stands at its address
//     under a new incarnation): remove OLD first. With v odd, v−1 voters of
//     which h answer survive exactly as many failures as before (3 voters
//     with one dead and 2 voters both survive 0; 5 with two dead and 4 with
//     one dead both survive 0). Then NEW joins as a learner, catches up
//     from a snapshot and the log, and is promoted: one more answering
//     voter, one more failure survived.
//   - OLD answers: NEW joins as a learner and catches up; then one leader
//     operation (PromoteReplacing) promotes NEW and removes OLD at once.
//     v+1 voters of which h+1 answer survive as many failures as v of h,
//     and so do v of h again after OLD leaves; removing a healthy OLD
//     first would cost one. The transient 4th or 6th voter exists only
//     inside that step. If OLD leads, it first hands its leadership over
//     and the new leader runs the step.
//
// client.AdminCluster.Replace (cluster/client/replace.go) reads the
// members with their health before each step and takes the next one of
// these, so it resumes after a leader change or a half-done earlier
// attempt. The plain operations keep their rules, relaxed only where the
// tolerance says it is safe: Remove leaves at least 3 voters, or at least
// 2 when the tolerance does not drop (the voter removed does not answer);
// Promote never makes a 6th voter (PromoteReplacing may, inside its step).
// No node older than the cluster version becomes a voter or is handed the
// leadership: a promotion asks the learner for its version and refuses
// one that is older or does not answer, and a hand-over chooses only
// voters known to speak the cluster version (issue 39).
// Growing 3 → 5 is learner + promote twice (passing 4 voters); shrinking is
// remove twice. Removing the leader first hands leadership over (a quiet
// hand-over, handover.go) and the new leader removes it.

// Member is one server of the current configuration.
type Member struct {
	ServerID string // NAME/INCARNATION
	Name     string
	PeerAddr string // host:port of its peer port
	// ClientAddr is its client address as recorded in the log (the
	// serving leader records every member's, memberaddrs.go); "" until
	// then, or for a member that never answered.
	ClientAddr string
	Voter      bool
	Leader     bool
}

// MaxPromoteLag is how many entries a learner's applied index may trail
// the leader's commit index and still be promoted: wire.MaxPromoteLag (a
// fact of the admin contract, which the admin client plans by).
const MaxPromoteLag = wire.MaxPromoteLag

// probeWait bounds the leader's wait for the members' answers before a
// change and in a members reply (all are asked at once, over the peer
// port).
const probeWait = 2 * time.Second

// Tolerance is how many more voter failures a cluster of voters voters,
// of which answering answer, survives and still commits:
// wire.Tolerance, the formula the admin client plans by too.
func Tolerance(voters, answering int) int { return wire.Tolerance(voters, answering) }

// beginChange checks that this node leads and takes Node.memberMu without
// waiting: one change at a time.
func (n *Node) beginChange() (unlock func(), err error) {
	if err := n.requireLeader(); err != nil {
		return nil, err
	}
	if !n.memberMu.TryLock() {
		return nil, ErrChangeInProgress
	}
	return n.memberMu.Unlock, nil
}

// beginChangeOn is beginChange for a change about member id, which it
// looks up with the whole configuration.
func (n *Node) beginChangeOn(id string) (m Member, ms []Member, unlock func(), err error) {
	if unlock, err = n.beginChange(); err != nil {
		return Member{}, nil, nil, err
	}
	if m, ms, err = n.member(id); err != nil {
		unlock()
		return Member{}, nil, nil, err
	}
	return m, ms, unlock, nil
}

// Members lists the current configuration, sorted by server id. A
// server whose address does not parse fails it (ErrBadPeerAddr): its
// peer address would be empty, and a promotion re-adds a server at the
// address Members gives.
func (n *Node) Members() ([]Member, error) {
	fut := n.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return nil, err
	}
	_, leader := n.raft.LeaderWithID()
	var out []Member
	for _, s := range fut.Configuration().Servers {
		name, _ := SplitServerID(string(s.ID))
		_, hostport, err := splitRaftAddr(s.Address)
		if err != nil {
			return nil, fmt.Errorf("cluster: the configuration's server %s: %w", s.ID, err)
		}
		out = append(out, Member{ServerID: string(s.ID), Name: name, PeerAddr: hostport,
			ClientAddr: n.fsm.clientAddr(string(s.ID)), Voter: s.Suffrage == raft.Voter, Leader: s.ID == leader})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ServerID < out[j].ServerID })
	return out, nil
}

func (n *Node) member(id string) (Member, []Member, error) {
	ms, err := n.Members()
	if err != nil {
		return Member{}, nil, err
	}
	if m, ok := findMember(ms, id); ok {
		return m, ms, nil
	}
	return Member{}, ms, fmt.Errorf("%w: %s", ErrNoSuchMember, id)
}

func findMember(ms []Member, id string) (Member, bool) {
	for _, m := range ms {
		if m.ServerID == id {
			return m, true
		}
	}
	return Member{}, false
}

func voters(ms []Member) int {
	v := 0
	for _, m := range ms {
		if m.Voter {
			v++
		}
	}
	return v
}

func (n *Node) requireLeader() error {
	if n.raft.State() != raft.Leader {
		_, id := n.raft.LeaderWithID()
		return fmt.Errorf("%w: ask %q", ErrNotLeader, id)
	}
	return nil
}

// health is what the leader learned about one member over the peer port.
type health struct {
	// answers: it proved exactly its server id (this node always does).
	answers bool
	// applied is its last applied index (when it answers).
	applied uint64
	// version is the protocol version it answered at (when it answers):
	// the handshake's, the lower of its newest and this node's.
	version uint16
	// found is the server id that answered at its peer address instead,
	// under the same node name (a wiped node's new incarnation); "" if
	// none did.
	found string
}

// probe asks every member other than this node, all at once, for its
// identity and applied index (a discovery handshake on its peer port), and
// waits at most wait; a member that did not answer by then does not
// answer. A member that does not prove its id is asked who stands at its
// address, by name. (No lock: answers come back over a channel with room
// for all, so late ones are dropped with it.)
func (n *Node) probe(ms []Member, wait time.Duration) map[string]health {
	type answer struct {
		id string
		h  health
	}
	out := make(map[string]health, len(ms))
	answers := make(chan answer, len(ms))
	asked := 0
	for _, m := range ms {
		if m.ServerID == n.serverID {
			out[m.ServerID] = health{answers: true, applied: n.raft.AppliedIndex(), version: n.cfg.protocolVersion()}
			continue
		}
		asked++
		go func(m Member) {
			var h health
			if ident, version, err := n.discoverMember(m.ServerID, m.Name, m.PeerAddr, wait); err == nil {
				h = health{answers: true, applied: ident.Applied, version: version}
			} else if sid, _, _, err := n.peers.discover(m.Name, m.PeerAddr, wait); err == nil && sid != m.ServerID {
				h.found = sid
			}
			answers <- answer{m.ServerID, h}
		}(m)
	}
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	for ; asked > 0; asked-- {
		select {
		case a := <-answers:
			out[a.id] = a.h
		case <-timeout.C:
			return out
		}
	}
	return out
}

// tally counts the voters of ms and how many of them answer in hs.
func tally(ms []Member, hs map[string]health) (v, h int) {
	for _, m := range ms {
		if m.Voter {
			v++
			if hs[m.ServerID].answers {
				h++
			}
		}
	}
	return v, h
}

// noQuorum describes a configuration in which fewer than a majority of the
// voters answer.
func noQuorum(ms []Member, hs map[string]health) error {
	v, h := tally(ms, hs)
	var silent []string
	for _, m := range ms {
		if m.Voter && !hs[m.ServerID].answers {
			silent = append(silent, m.ServerID)
		}
	}
	return fmt.Errorf("%w: %w: only %d of the %d voters answer (not answering: %s); nothing can be committed, "+
		"so no change can help: bring back the voters that still have their data dirs; if a majority lost them "+
		"for good, build a new cluster (docs/operations.md, Runbook: \"The majority is lost for good\")",
		ErrUnsafeChange, ErrNoQuorum, h, v, strings.Join(silent, ", "))
}

// Lag asks server id (over the peer port) for its applied index and
// returns how far it trails this node's commit index.
func (n *Node) Lag(id string) (lag uint64, err error) {
	m, _, err := n.member(id)
	if err != nil {
		return 0, err
	}
	commit := n.raft.CommitIndex()
	ident, _, err := n.discoverMember(m.ServerID, m.Name, m.PeerAddr, probeWait)
	if err != nil {
		return 0, fmt.Errorf("cluster: asking %s for its applied index: %w", id, err)
	}
	return commit - min(commit, ident.Applied), nil
}

// promotable checks that learner m answered (in hs) at a protocol version
// no older than the cluster version, within MaxPromoteLag of the commit
// index. A voter older than the cluster version could not apply the log
// (a real older build skips the entries it cannot decode, and its state
// parts from the others'), and once elected it would serve clients at its
// own version (sidecars could not resume their sessions on it). Its
// version is learned from its answer, so one that does not answer is not
// promoted: add-learner checks only a node that answers, and the node may
// have been down then.
func (n *Node) promotable(m Member, hs map[string]health) error {
	h := hs[m.ServerID]
	if !h.answers {
		return fmt.Errorf("%w: %s did not answer over the peer port (is it running at %s?): its lag and protocol version "+
			"cannot be checked, so it is not promoted", ErrLearnerLagging, m.ServerID, m.PeerAddr)
	}
	if err := n.notOlder(m.ServerID, h.version, "promote it"); err != nil {
		return err
	}
	commit := n.raft.CommitIndex()
	if lag := commit - min(commit, h.applied); lag > MaxPromoteLag {
		return fmt.Errorf("%w: %s trails the commit index by %d entries (at most %d); wait for it to catch up",
			ErrLearnerLagging, m.ServerID, lag, MaxPromoteLag)
	}
	return nil
}

// notOlder refuses server id, which answered at protocol version, if that
// is older than the cluster version; then says what to do before
// retrying (to "promote it", "add it").
func (n *Node) notOlder(id string, version uint16, then string) error {
	if cv := n.fsm.getClusterVersion(); version < cv {
		return fmt.Errorf("%w: %s speaks protocol version %d, older than the cluster version %d (recorded once every member spoke it): "+
			"it could not apply the log, and elected it would serve clients at version %d; upgrade it to a build that speaks "+
			"version %d or later, restart it on its data dir, then %s",
			ErrUnsafeChange, id, version, cv, version, cv, then)
	}
	return nil
}

// discoverMember asks member id for its identity over the peer port (a
// discovery handshake); version is the one it answered at, which
// knownVersion remembers.
func (n *Node) discoverMember(id, name, peerAddr string, wait time.Duration) (wire.Identity, uint16, error) {
	ident, version, err := n.peers.discoverID(id, name, peerAddr, wait)
	if err == nil {
		n.versions.Store(id, version)
	}
	return ident, version, err
}

// knownVersion is the protocol version server id last answered this node
// at, if it ever did.
func (n *Node) knownVersion(id string) (uint16, bool) {
	v, ok := n.versions.Load(id)
	if !ok {
		return 0, false
	}
	return v.(uint16), true
}

// AddLearner adds serverID (NAME/INCARNATION) at peerAddr as a non-voter;
// only the leader can. It returns once the change is committed. A node
// that answers at a protocol version older than the cluster version is
// refused; one that does not answer is added unchecked (promoting it
// checks it).
func (n *Node) AddLearner(serverID, peerAddr string, timeout time.Duration) error {
	return n.addLearner(serverID, peerAddr, false, timeout)
}

// AddAnsweringLearner is AddLearner for a node that must answer now: one
// that does not is refused (ErrLearnerLagging) instead of added unchecked.
func (n *Node) AddAnsweringLearner(serverID, peerAddr string, timeout time.Duration) error {
	return n.addLearner(serverID, peerAddr, true, timeout)
}

func (n *Node) addLearner(serverID, peerAddr string, answering bool, timeout time.Duration) error {
	if name, inc := SplitServerID(serverID); ValidateNodeID(name) != nil || len(inc) != incarnationLen {
		return fmt.Errorf("%w: %q is not NAME/INCARNATION", ErrBadConfig, serverID)
	}
	unlock, err := n.beginChange()
	if err != nil {
		return err
	}
	defer unlock()
	if _, _, err := n.member(serverID); err == nil {
		return fmt.Errorf("%w: %s is already a member", ErrUnsafeChange, serverID)
	}
	// A node older than the cluster version could not apply the log (it
	// would skip entries it cannot decode, block acquires among them, and
	// diverge). A node that does not answer yet is added unchecked unless
	// it must answer (a learner neither votes nor leads; promoting it
	// checks it again and refuses one it cannot reach).
	if cv := n.fsm.getClusterVersion(); cv > 0 || answering {
		name, _ := SplitServerID(serverID)
		_, version, err := n.discoverMember(serverID, name, peerAddr, probeWait)
		switch {
		case err == nil:
			if err := n.notOlder(serverID, version, "add it"); err != nil {
				return err
			}
		case answering:
			return fmt.Errorf("%w: %s does not answer at %s (is it running there, with an empty data dir and without "+
				"--peers?): its protocol version cannot be checked, so it is not added yet (%v)", ErrLearnerLagging, serverID, peerAddr, err)
		}
	}
	return n.raft.AddNonvoter(raft.ServerID(serverID), raftAddr(serverID, peerAddr), 0, timeout).Error()
}

// Promote makes learner id a voter, if it answers at a protocol version
// no older than the cluster version, is caught up (lag at most
// MaxPromoteLag) and the cluster would have at most 5 voters. To swap a
// voter for the learner, PromoteReplacing does both in one step.
func (n *Node) Promote(id string, timeout time.Duration) error {
	m, ms, unlock, err := n.beginChangeOn(id)
	if err != nil {
		return err
	}
	defer unlock()
	if m.Voter {
		return fmt.Errorf("%w: %s is already a voter", ErrUnsafeChange, id)
	}
	if voters(ms) >= 5 {
		return fmt.Errorf("%w: the cluster has %d voters; at most 5 (to swap a voter OLD for %s, use "+
			"`ticketing members replace OLD %s %s`: it promotes %s and removes OLD in one step)",
			ErrUnsafeChange, voters(ms), id, id, m.PeerAddr, id)
	}
	hs := n.probe(ms, probeWait)
	if err := n.promotable(m, hs); err != nil {
		return err
	}
	// A caught-up learner answers: one more voter and one more answering
	// never lowers the tolerance.
	if v, h := tally(ms, hs); Tolerance(v, h) < 0 {
		return noQuorum(ms, hs)
	}
	return n.raft.AddVoter(raft.ServerID(m.ServerID), raftAddr(m.ServerID, m.PeerAddr), 0, timeout).Error()
}

// PromoteReplacing swaps voter old for learner id in one step: it checks
// id as Promote does (version and lag) and that old answers, then promotes id and removes
// old at once, so the extra voter (a 4th or 6th) exists only inside this
// call (see the replacement rule at the top of this file). A voter old
// that does not answer must be removed first instead (Remove), which keeps
// the tolerance; this call refuses it. If old is this node, it hands its
// leadership over first and returns ErrNotLeader: ask the new leader.
func (n *Node) PromoteReplacing(id, old string, timeout time.Duration) error {
	m, ms, unlock, err := n.beginChangeOn(id)
	if err != nil {
		return err
	}
	defer unlock()
	o, ok := findMember(ms, old)
	switch {
	case !ok:
		return fmt.Errorf("%w: %s (the voter %s was to replace)", ErrNoSuchMember, old, id)
	case !o.Voter:
		return fmt.Errorf("%w: %s is a learner, not a voter: remove it and add %s as a learner instead", ErrUnsafeChange, old, id)
	case m.Voter:
		return fmt.Errorf("%w: %s is already a voter; remove %s to finish the replacement", ErrUnsafeChange, id, old)
	case voters(ms) > 5:
		return fmt.Errorf("%w: the cluster has %d voters; remove one before replacing another", ErrUnsafeChange, voters(ms))
	}
	hs := n.probe(ms, probeWait)
	if err := n.promotable(m, hs); err != nil {
		return err
	}
	if !hs[old].answers {
		return fmt.Errorf("%w: %s does not answer: remove it first (that keeps the failures the cluster survives), "+
			"then promote %s; `ticketing members replace` does that", ErrUnsafeChange, old, id)
	}
	if v, h := tally(ms, hs); Tolerance(v, h) < 0 {
		return noQuorum(ms, hs)
	}
	if old == n.serverID {
		if err := n.handOverWithin(timeout); err != nil {
			return fmt.Errorf("cluster: handing leadership over before replacing this node: %w", err)
		}
		return fmt.Errorf("%w: leadership handed over; ask the new leader to promote %s replacing %s", ErrNotLeader, id, old)
	}
	if err := n.raft.AddVoter(raft.ServerID(m.ServerID), raftAddr(m.ServerID, m.PeerAddr), 0, timeout).Error(); err != nil {
		return err
	}
	if err := n.raft.RemoveServer(raft.ServerID(o.ServerID), 0, timeout).Error(); err != nil {
		n.log.Warn("promoted a replacement but could not remove the voter it replaces", "new", id, "old", old, "err", err)
		return fmt.Errorf("cluster: %s is a voter, but removing %s failed (ask again: `members replace` finishes it): %w", id, old, err)
	}
	return nil
}

// Remove takes server id out of the configuration. A voter may go only if
// a majority of the remaining voters answer now, and at least 3 voters
// stay, or at least 2 when the cluster then survives as many failures as
// now (the voter removed does not answer: the dead voter of three). The
// leader itself first hands leadership over and returns ErrNotLeader (ask
// the new leader).
func (n *Node) Remove(id string, timeout time.Duration) error {
	m, ms, unlock, err := n.beginChangeOn(id)
	if err != nil {
		return err
	}
	defer unlock()
	if m.Voter {
		hs := n.probe(ms, probeWait)
		v, h := tally(ms, hs)
		hAfter := h
		if hs[id].answers {
			hAfter--
		}
		before, after := Tolerance(v, h), Tolerance(v-1, hAfter)
		switch {
		case Tolerance(v, h) < 0:
			return noQuorum(ms, hs)
		case after < 0:
			return fmt.Errorf("%w: only %d of the %d remaining voters answer; removing %s would leave no majority",
				ErrUnsafeChange, hAfter, v-1, id)
		case v-1 >= 3:
		case v-1 >= 2 && after >= before:
		default:
			what := "answers"
			if !hs[id].answers {
				what = "does not answer"
			}
			return fmt.Errorf("%w: the cluster has %d voters (%d answer; %s %s); removing it would leave %d and lower the "+
				"voter failures the cluster survives from %d to %d: add and promote its replacement first "+
				"(`ticketing members replace` does it in a safe order)", ErrUnsafeChange, v, h, id, what, v-1, before, after)
		}
	}
	if m.ServerID == n.serverID {
		if err := n.handOverWithin(timeout); err != nil {
			return fmt.Errorf("cluster: handing leadership over before removing this node: %w", err)
		}
		return fmt.Errorf("%w: leadership handed over; ask the new leader to remove %s", ErrNotLeader, id)
	}
	return n.raft.RemoveServer(raft.ServerID(m.ServerID), 0, timeout).Error()
}
