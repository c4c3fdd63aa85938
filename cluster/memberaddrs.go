package cluster

import (
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Every member's client address is known to the cluster: the serving
// leader asks each member for the address it advertises (the discovery
// handshake's Identity frame carries it from protocol version 3) and
// records those that differ from what the log has in 'A' entries, so every
// node's members reply lists them and brokers can follow membership. The
// same round learns the protocol version each member speaks; when every
// member answered at a higher version than the log's cluster version, it
// records the new one in a 'V' entry (a rolling upgrade completes so). It
// does so when it starts serving, after each configuration change that
// adds or removes a server (raft's PeerObservation on the leader), and
// every memberAddrCheck.

// memberAddrCheck is the slow periodic re-check of the members' client
// addresses (a member restarted with another --advertise-client-addr).
const memberAddrCheck = 30 * time.Second

// memberAddrLoop runs the checks for the node's lifetime (only a serving
// leader acts).
func (n *Node) memberAddrLoop() {
	defer n.wg.Done()
	ch := make(chan raft.Observation, 16)
	obsv := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.PeerObservation)
		return ok
	})
	n.raft.RegisterObserver(obsv)
	defer n.raft.DeregisterObserver(obsv)
	tick := time.NewTicker(memberAddrCheck)
	defer tick.Stop()
	for {
		select {
		case <-n.addrWake:
		case <-ch:
		case <-tick.C:
		case <-n.closing:
			return
		}
		if n.Serving() {
			n.recordMemberAddrs()
		}
	}
}

// recordMemberAddrs asks every other member for its client address and
// proposes an 'A' entry for each one the log does not have yet (and for
// this node's own, should it differ), then the cluster version if every
// member answered at a higher one.
func (n *Node) recordMemberAddrs() {
	ms, err := n.Members()
	if err != nil {
		return
	}
	type found struct{ id, addr string }
	var (
		mu  sync.Mutex
		out []found
		wg  sync.WaitGroup
		// lowest is the lowest version a member answered at; answered
		// counts the members that did (this node included).
		lowest   = n.cfg.protocolVersion()
		answered = 1
	)
	for _, m := range ms {
		if m.ServerID == n.serverID {
			if m.ClientAddr != n.advertise && len(n.advertise) <= 255 {
				out = append(out, found{m.ServerID, n.advertise})
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ident, version, err := n.discoverMember(m.ServerID, m.Name, m.PeerAddr, 2*time.Second)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			answered++
			lowest = min(lowest, version)
			if ident.ClientAddr != "" && ident.ClientAddr != m.ClientAddr {
				out = append(out, found{m.ServerID, ident.ClientAddr})
			}
		}()
	}
	wg.Wait()
	timeout := 10 * n.cfg.HeartbeatTimeout
	for _, f := range out {
		// Refused during a leadership transfer or after losing the lead:
		// the next check (or the next leader) records it.
		if err := n.await(n.raft.Apply(encodeAnnounce(f.id, f.addr), timeout)); err != nil {
			n.log.Debug("recording a member's client address failed", "member", f.id, "err", err)
			return
		}
		n.log.Info("recorded a member's client address", "member", f.id, "client_addr", f.addr)
	}
	if answered == len(ms) && lowest > n.fsm.getClusterVersion() {
		if err := n.await(n.raft.Apply(encodeClusterVersion(lowest), timeout)); err != nil {
			n.log.Debug("recording the cluster version failed", "version", lowest, "err", err)
			return
		}
		n.log.Info("recorded the cluster version: every member speaks it", "version", lowest)
	}
}
