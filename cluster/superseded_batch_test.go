package cluster

import (
	"log/slog"
	"testing"
	"time"

	"ticketing/cluster/leader"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// A core superseded in the middle of an Applied batch proposes nothing of
// the leadership that ended (found by the third attack round): what it
// proposed earlier in that batch (here the extend it held back for its
// token's expiry, released when that expiry applied) stayed in its Ready,
// and the node, which drops its queues on EventSuperseded before it
// queues the Ready's proposals, queued it after the drop, for raft.Apply
// in whatever term the node leads next. LoseLeadership now drops them.
func TestSupersededBatchLeavesNoProposalQueued(t *testing.T) {
	n := &Node{propWake: make(chan struct{}, 1), log: slog.New(slog.DiscardHandler)}
	n.cfg.MaxReplyBacklog = 1 << 20
	n.fsm = newFSM(nil, n.log)
	n.fsm.clusterVersion = wire.ProtocolVersion
	n.metrics = newNodeMetrics(n)
	n.core = leader.New[*clientConn](leader.Config{ServerID: "n1", MaxInFlightPerConn: 8, MaxKeys: 8, MaxWaitersPerKey: 8,
		MaxWaitersPerConn: 8}, n.fsm, nodeDirectory{n})
	acq := locksm.Command{Op: locksm.OpAcquire, Key: "k", Owner: "a", LeaseSec: 2}
	res, _ := n.fsm.state.Apply(acq, nil)
	if res.Status != locksm.StatusGranted {
		t.Fatalf("acquire: %+v", res)
	}
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	epoch := n.core.GainLeadership(5)
	n.core.BarrierApplied(epoch)
	if _, ok := n.core.Serve(now, now.UnixMilli(), epoch); !ok {
		t.Fatal("serve")
	}
	n.performLocked()
	cc := &clientConn{n: n, wake: make(chan struct{}, 1), writing: true}
	n.core.Open(cc, wire.ProtocolVersion)
	n.core.TimerDue(leader.Timer{Kind: leader.TimerExpire, Key: "k", Token: res.Token, At: now, Epoch: epoch})
	n.performLocked()
	n.core.Request(now, cc, &wire.Msg{Type: wire.TypeExtend, ID: 2, Key: "k", Owner: "a", Token: res.Token, Lease: 30})
	n.performLocked()
	// The proposer took the expiry into a batch; nothing is queued.
	n.propMu.Lock()
	exp := append([]locksm.Command(nil), n.houseQ...)
	q := len(n.propQ)
	n.propMu.Unlock()
	n.dropQueuedProposals()
	if len(exp) != 1 || exp[0].Op != locksm.OpExpire || q != 0 {
		t.Fatalf("queued: house %v, %d requests", exp, q)
	}
	// One applied batch: our expiry (term 5), then an entry of term 6.
	eres, _ := n.fsm.state.Apply(exp[0], nil)
	other := locksm.Command{Op: locksm.OpExpire, Key: "x", Token: 99}
	ores, _ := n.fsm.state.Apply(other, nil)
	n.core.Applied(now, []leader.Applied{{Cmd: exp[0], Res: eres, Term: 5}, {Cmd: other, Res: ores, Term: 6}})
	n.performLocked()
	if was, _ := n.core.Leading(); was {
		t.Fatal("still leading after an entry of term 6")
	}
	n.propMu.Lock()
	defer n.propMu.Unlock()
	if len(n.propQ)+len(n.houseQ) != 0 {
		t.Fatalf("superseded (EventSuperseded dropped the queues), yet the ended leadership's proposals are queued: requests %v housekeeping %v",
			n.propQ, n.houseQ)
	}
}
