package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"ticketing/cluster/leader"
	"ticketing/cluster/wire"
)

// Quiet planned hand-overs (SIGTERM → Shutdown, remove/replace of the
// leader itself). A leader that hands its leadership over:
//
//  1. chooses the target: the voter that answers a discovery handshake
//     and has applied the most (or the one named), never one older than
//     the cluster version (chooseTarget);
//  2. tells every connection of protocol version 3 or later with a
//     NoticeHandOver naming the target's id and client address, and keeps
//     serving until each has acknowledged it (TypeNoticeAck: a client
//     writes it right after it stopped sending lock requests, so nothing it
//     wrote before is refused) or handOverAckWait has passed;
//  3. stops taking lock requests (M naming the target: not executed) and
//     withdraws every queued waiter through the log (a committed
//     cancel-wait: the waiter gets T and is never granted);
//  4. lets what is in flight commit and be answered (bounded by
//     handOverDrainWait);
//  5. transfers leadership to the target (raft LeadershipTransferToServer).
//
// If the transfer fails the leader serves again and says so with a
// NoticeServing; a new leader sends NoticeServing once it serves.
//
// Steps 2 and 3, the acknowledgements and serving again are the leader
// core's (cluster/leader, handover.go there); this file chooses the
// target, waits, and runs the transfer.

// handOverAckWait bounds how long a hand-over waits for the clients'
// acknowledgements while it still serves. A client that does not answer
// in time may see M for a request it wrote after that.
const handOverAckWait = time.Second

// handOverDrainWait bounds how long a hand-over waits for the requests in
// flight to commit and be answered. What is still owed after that becomes
// U when leadership moves (as at any leader change).
const handOverDrainWait = 2 * time.Second

// HandOver hands this node's leadership to another voter quietly (see the
// steps above): to names the target's server id, or "" for the voter that
// answers and has applied the most. It returns the new leader's server id
// (the target's, normally) once Raft has stepped this node down and the
// new leader has been heard from, or an error (ErrNotLeader, also when
// this node stepped down and no leader was heard from: no follower left
// to take over; ErrHandOverInProgress; ErrNoTarget, also when the only
// voters are older than the cluster version; a failed transfer:
// this node then serves again). ctx bounds the whole hand-over.
func (n *Node) HandOver(ctx context.Context, to string) (string, error) {
	if err := n.requireLeader(); err != nil {
		return "", err
	}
	n.mu.Lock()
	busy := n.core.HandOverActive()
	n.mu.Unlock()
	if busy {
		return "", ErrHandOverInProgress
	}
	id, peerAddr, addr, err := n.chooseTarget(to)
	if err != nil {
		return "", err
	}
	start := time.Now()
	if len(addr) > 255 { // does not fit a notice or an M
		addr = ""
	}

	// Step 2: every client that speaks notices is told (a core that no
	// longer leads, or whose node is closing, refuses).
	n.mu.Lock()
	h, notified, err := n.core.BeginHandOver(id, addr)
	n.performLocked()
	n.mu.Unlock()
	switch {
	case errors.Is(err, leader.ErrNotLeading):
		return "", fmt.Errorf("%w: leadership lost before the hand-over started", ErrNotLeader)
	case errors.Is(err, leader.ErrHandOverActive):
		return "", ErrHandOverInProgress
	case err != nil:
		return "", err
	}
	n.log.Info("handing leadership over", "to", id, "client_addr", addr, "clients_told", notified)

	// The acknowledgements (the last one stops serving at once, under
	// Node.mu, so a request behind it on that connection gets M), then
	// step 3 if they did not all come.
	acked := n.waitHandOver(ctx, handOverAckWait, func() bool { return n.core.HandOverStopped(h) })
	n.mu.Lock()
	err = n.core.StopServing(h)
	n.performLocked()
	n.mu.Unlock()
	if err != nil {
		return "", fmt.Errorf("%w: leadership lost during the hand-over", ErrNotLeader)
	}
	if !acked {
		n.log.Warn("hand-over: not every client acknowledged the notice in time", "wait", handOverAckWait)
	}

	// Step 4: what is in flight commits and is answered.
	if !n.waitHandOver(ctx, handOverDrainWait, n.quiescent) {
		n.mu.Lock()
		owed := n.core.Owed()
		n.mu.Unlock()
		n.log.Warn("hand-over: requests still in flight; they get U if leadership moves", "owed", owed)
	}

	// Step 5.
	fut := n.raft.LeadershipTransferToServer(raft.ServerID(id), raftAddr(id, peerAddr))
	done := make(chan error, 1)
	go func() { done <- fut.Error() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		// hashicorp/raft gives up after one election timeout even when
		// its TimeoutNow got through and the target is still campaigning
		// (slow on a loaded machine): serving again at once could take
		// requests that the target's win then leaves unknown. Wait one
		// more election timeout for a late win before serving again.
		n.waitHandOver(ctx, n.cfg.ElectionTimeout, func() bool { return n.raft.State() != raft.Leader })
	}
	// Raft also reports the transfer done when this node stepped down
	// for want of a quorum (its followers went away meanwhile: stopped
	// together with it), with nobody taking over. Only a leader heard
	// from makes it a hand-over: wait for one, as long as an election
	// can take (up to twice the election timeout).
	var newLeader string
	if err == nil || n.raft.State() != raft.Leader {
		n.waitHandOver(ctx, 2*n.cfg.ElectionTimeout, func() bool {
			_, lid := n.raft.LeaderWithID()
			if lid != "" && string(lid) != n.serverID {
				newLeader = string(lid)
			}
			return newLeader != ""
		})
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	// No leader heard from: the core serves again if this node still
	// leads (a failed transfer; with a fresh lease timer for every holder:
	// expiries proposed during the transfer were refused) and tells its
	// clients; one that no longer leads does not, and forgets the target.
	n.core.EndHandOver(time.Now(), h, newLeader == "")
	n.performLocked()
	switch {
	case newLeader != "":
		// The target, normally (a failed transfer's late win too); or
		// another voter that won the election the transfer started.
		n.log.Info("leadership transferred", "to", newLeader, "target", id, "took", time.Since(start).Round(time.Millisecond))
		return newLeader, nil
	case n.raft.State() != raft.Leader:
		n.log.Warn("leadership lost during the hand-over, not handed over: no new leader heard from", "target", id, "transfer_err", err)
		return "", fmt.Errorf("%w: leadership lost during the hand-over to %s, and no new leader was heard from within %v (the followers are gone, or cannot elect one)",
			ErrNotLeader, id, 2*n.cfg.ElectionTimeout)
	}
	if err == nil {
		// Raft stepped this node down, and it leads again (it won the
		// next election itself): nothing was handed over.
		err = errors.New("this node was elected again")
	}
	n.log.Warn("leadership transfer failed; serving again", "to", id, "err", err)
	return "", fmt.Errorf("cluster: handing leadership to %s: %w", id, err)
}

// handOverWithin is HandOver to the best target, bounded by timeout.
func (n *Node) handOverWithin(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := n.HandOver(ctx, "")
	return err
}

// chooseTarget picks the voter to hand over to: to if named (it must be a
// voter; its client address from discovery, else from the log), else the
// voter that answers a discovery handshake and has applied the most. A
// voter older than the cluster version is never chosen (elected, it would
// serve clients at its older version, where sidecars cannot resume their
// sessions, and it could not apply the log), nor one whose version is
// unknown: a voter that does not answer now qualifies only if named and
// known (from an earlier answer to this node) to speak the cluster
// version, so that a target behind a brief network fault is still tried.
func (n *Node) chooseTarget(to string) (id, peerAddr, addr string, err error) {
	ms, err := n.Members()
	if err != nil {
		return "", "", "", err
	}
	var cands []Member
	for _, m := range ms {
		if m.Voter && m.ServerID != n.serverID && (to == "" || m.ServerID == to) {
			cands = append(cands, m)
		}
	}
	if to != "" && len(cands) == 0 {
		return "", "", "", fmt.Errorf("%w: %s is not another voter", ErrNoSuchMember, to)
	}
	type answer struct {
		m       Member
		ident   wire.Identity
		version uint16
		err     error
	}
	answers := make([]answer, len(cands))
	var wg sync.WaitGroup
	for i, m := range cands {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ident, version, err := n.discoverMember(m.ServerID, m.Name, m.PeerAddr, time.Second)
			answers[i] = answer{m, ident, version, err}
		}()
	}
	wg.Wait()
	cv := n.fsm.getClusterVersion()
	var ok []answer
	var why []string
	for _, a := range answers {
		switch v, known := n.knownVersion(a.m.ServerID); {
		case a.err == nil && a.version < cv:
			why = append(why, fmt.Sprintf("%s speaks protocol version %d, older than the cluster version %d (upgrade it)", a.m.ServerID, a.version, cv))
		case a.err == nil:
			ok = append(ok, a)
		case to == "":
			why = append(why, fmt.Sprintf("%s does not answer over the peer port", a.m.ServerID))
		case !known:
			why = append(why, fmt.Sprintf("%s does not answer over the peer port, and its protocol version is unknown", a.m.ServerID))
		case v < cv:
			why = append(why, fmt.Sprintf("%s does not answer over the peer port, and last answered at protocol version %d, "+
				"older than the cluster version %d (upgrade it)", a.m.ServerID, v, cv))
		default:
			ok = append(ok, a)
		}
	}
	if len(ok) == 0 {
		if len(why) == 0 {
			return "", "", "", ErrNoTarget
		}
		return "", "", "", fmt.Errorf("%w: %s", ErrNoTarget, strings.Join(why, "; "))
	}
	sort.SliceStable(ok, func(i, j int) bool {
		if (ok[i].err == nil) != (ok[j].err == nil) {
			return ok[i].err == nil
		}
		return ok[i].ident.Applied > ok[j].ident.Applied
	})
	best := ok[0]
	addr = best.ident.ClientAddr
	if addr == "" {
		addr = best.m.ClientAddr // from the log (an older node, or it did not answer)
	}
	return best.m.ServerID, best.m.PeerAddr, addr, nil
}

// waitHandOver polls cond until it holds (true), d has passed or ctx ended.
func (n *Node) waitHandOver(ctx context.Context, d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		n.mu.Lock()
		ok := cond()
		n.mu.Unlock()
		if ok {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
		case <-n.closing:
			return false
		}
	}
}

// quiescent reports whether nothing is owed or being proposed: no request
// waits for its reply, no command waits to be proposed or applied.
// Requires n.mu.
func (n *Node) quiescent() bool {
	if n.core.Owed() > 0 || len(n.slots) > 0 {
		return false
	}
	n.propMu.Lock()
	defer n.propMu.Unlock()
	return len(n.propQ) == 0 && len(n.houseQ) == 0
}
