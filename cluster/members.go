package cluster

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/hashicorp/raft"
)

// Membership changes, one at a time, on the leader.
//
// A node is replaced by a new server (a new NAME/INCARNATION), never
// revived under an old id: add it as a learner (non-voter), let it catch
// up from a snapshot and the log, promote it once its applied index is
// within MaxPromoteLag of the leader's commit index, then remove the old
// server. hashicorp/raft applies each of these as one single-server
// configuration change, committed by a majority of the old configuration
// before the next may start, so any two consecutive configurations share a
// majority; that is what keeps a change safe. The voter count is 3 or 5
// outside one transition step: a replacement passes through 4 voters
// (promote, then remove), growing 3 → 5 through 4 as well. Removing the
// leader first hands leadership to another voter (LeadershipTransfer), and
// the new leader removes it.

// Member is one server of the current configuration.
type Member struct {
	ServerID string // NAME/INCARNATION
	Name     string
	PeerAddr string // host:port of its peer port
	// ClientAddr is the client address it announced through the log; ""
	// until it has led once (only leaders announce theirs).
	ClientAddr string
	Voter      bool
	Leader     bool
}

// Sentinel errors of membership changes.
var (
	// ErrNotLeader: the change must be asked of the leader.
	ErrNotLeader = errors.New("cluster: not the leader")
	// ErrChangeInProgress: another membership change has not finished.
	ErrChangeInProgress = errors.New("cluster: a membership change is in progress")
	// ErrUnsafeChange: the change would break a rule (voter count, a
	// majority of the remaining voters reachable, a lagging learner).
	ErrUnsafeChange = errors.New("cluster: unsafe membership change")
	// ErrLearnerLagging: the learner trails the commit index by more than
	// MaxPromoteLag (or did not answer); try again once it caught up.
	ErrLearnerLagging = errors.New("cluster: the learner has not caught up")
	// ErrNoSuchMember: the server id is not in the configuration.
	ErrNoSuchMember = errors.New("cluster: no such member")
)

// MaxPromoteLag is how many entries a learner's applied index may trail
// the leader's commit index and still be promoted.
const MaxPromoteLag = 64

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

// Members lists the current configuration, sorted by server id.
func (n *Node) Members() ([]Member, error) {
	fut := n.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return nil, err
	}
	_, leader := n.raft.LeaderWithID()
	var out []Member
	for _, s := range fut.Configuration().Servers {
		name, _ := SplitServerID(string(s.ID))
		_, hostport, _ := splitRaftAddr(s.Address)
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
	for _, m := range ms {
		if m.ServerID == id {
			return m, ms, nil
		}
	}
	return Member{}, ms, fmt.Errorf("%w: %s", ErrNoSuchMember, id)
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

// Lag asks server id (over the peer port) for its applied index and
// returns how far it trails this node's commit index.
func (n *Node) Lag(id string) (lag uint64, err error) {
	m, _, err := n.member(id)
	if err != nil {
		return 0, err
	}
	commit := n.raft.CommitIndex()
	_, ident, err := n.peers.discoverID(m.ServerID, m.Name, m.PeerAddr, 2*time.Second)
	if err != nil {
		return 0, fmt.Errorf("cluster: asking %s for its applied index: %w", id, err)
	}
	if ident.Applied >= commit {
		return 0, nil
	}
	return commit - ident.Applied, nil
}

// AddLearner adds serverID (NAME/INCARNATION) at peerAddr as a non-voter;
// only the leader can. It returns once the change is committed.
func (n *Node) AddLearner(serverID, peerAddr string, timeout time.Duration) error {
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
	return n.raft.AddNonvoter(raft.ServerID(serverID), raftAddr(serverID, peerAddr), 0, timeout).Error()
}

// Promote makes learner id a voter, if it is caught up (lag at most
// MaxPromoteLag) and the cluster would have at most 5 voters.
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
		return fmt.Errorf("%w: the cluster has %d voters; at most 5", ErrUnsafeChange, voters(ms))
	}
	lag, err := n.Lag(id)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrLearnerLagging, err)
	}
	if lag > MaxPromoteLag {
		return fmt.Errorf("%w: %s trails the commit index by %d entries (at most %d); wait for it to catch up",
			ErrLearnerLagging, id, lag, MaxPromoteLag)
	}
	return n.raft.AddVoter(raft.ServerID(m.ServerID), raftAddr(m.ServerID, m.PeerAddr), 0, timeout).Error()
}

// Remove takes server id out of the configuration. A voter may go only if
// at least 3 voters stay and a majority of the remaining voters answer
// now; the leader itself first hands leadership over and returns
// ErrNotLeader (ask the new leader).
func (n *Node) Remove(id string, timeout time.Duration) error {
	m, ms, unlock, err := n.beginChangeOn(id)
	if err != nil {
		return err
	}
	defer unlock()
	if m.Voter {
		if voters(ms)-1 < 3 {
			return fmt.Errorf("%w: removing %s would leave %d voters; add and promote its replacement first",
				ErrUnsafeChange, id, voters(ms)-1)
		}
		up, rest := 0, 0
		for _, o := range ms {
			if !o.Voter || o.ServerID == id {
				continue
			}
			rest++
			if o.ServerID == n.serverID {
				up++
				continue
			}
			if _, _, err := n.peers.discoverID(o.ServerID, o.Name, o.PeerAddr, time.Second); err == nil {
				up++
			}
		}
		if up <= rest/2 {
			return fmt.Errorf("%w: only %d of the %d remaining voters answer; removing %s would leave no majority",
				ErrUnsafeChange, up, rest, id)
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
