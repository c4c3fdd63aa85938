package cluster

import (
	"context"
	"time"

	"ticketing/cluster/console"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// ConsoleSource is this node as the operators' console shows it
// (cluster/console).
func (n *Node) ConsoleSource() console.Source { return nodeConsole{n} }

type nodeConsole struct{ n *Node }

func (c nodeConsole) Key(key string) (wire.KeyReport, error) { return c.n.Inspect(key) }

// Revoke is Node.Revoke: on a follower it answers ErrNotLeader (the
// console names the leader; its own console takes the revoke).
func (c nodeConsole) Revoke(ctx context.Context, key string, token uint64, by, reason string) (wire.RevokeReport, error) {
	return c.n.Revoke(ctx, key, token, by, reason)
}

// consoleWindow is the span of the commit latencies a sample sums up: the
// console's default interval.
const consoleWindow = console.DefaultInterval

func (c nodeConsole) Sample(lines int) console.Sample {
	n := c.n
	_, leader := n.raft.LeaderWithID()
	s := console.Sample{
		ServerID:       n.serverID,
		Role:           n.role(),
		Serving:        n.Serving(),
		Term:           n.raft.CurrentTerm(),
		Leader:         string(leader),
		ClusterID:      n.cfg.ClusterID,
		Domain:         n.fsm.getDomain(),
		ClusterVersion: n.fsm.getClusterVersion(),
		CommitIndex:    n.raft.CommitIndex(),
		AppliedIndex:   n.raft.AppliedIndex(),
		Lines:          []console.Line{},
		Sessions:       []console.Session{},
		Members:        []console.Member{},
	}
	if ms, err := n.Members(); err == nil {
		for _, m := range ms {
			s.Members = append(s.Members, console.Member{ID: m.ServerID, PeerAddr: m.PeerAddr, Voter: m.Voter, Leader: m.Leader})
		}
	}
	p50, p99, k := n.commits.since(time.Now().Add(-consoleWindow))
	s.Commit = console.Latency{N: k, P50Ms: ms(p50), P99Ms: ms(p99)}
	var ids []uint64 // of s.Sessions
	n.mu.Lock()
	n.fsm.read(func(st *locksm.State) {
		s.KeysHeld, s.Waiters, s.Permits, s.LastToken = st.NumHeld(), st.NumWaiting(), st.NumPermitsHeld(), st.LastToken()
		for _, l := range st.TopLines(lines) {
			cl := console.Line{Key: l.Key, Waiters: l.Waiters, Semaphore: l.Semaphore}
			if sem, ok := st.Semaphore(l.Key); ok {
				cl.Permits, cl.Held = sem.Permits, sem.Held
			} else if h, ok := st.Holder(l.Key); ok {
				cl.Holder, cl.Label, cl.Token = h.Owner, h.Label, h.Token
				cl.HeldMs = max(0, n.cfg.Now().UnixMilli()-h.GrantedAt)
			}
			s.Lines = append(s.Lines, cl)
		}
		s.SessionsTotal = st.NumSessions()
		all := st.Sessions()
		if len(all) > console.MaxSessions {
			all = all[:console.MaxSessions]
		}
		for _, id := range all {
			if si, ok := st.Session(id); ok {
				ids = append(ids, id)
				s.Sessions = append(s.Sessions, console.Session{ID: sessionHex(id), Waiters: si.Waiters, Holdings: si.Holdings, Resumes: si.Epoch})
			}
		}
	})
	if leading, _ := n.core.Leading(); leading {
		for i := range s.Lines {
			s.Lines[i].HandoffsPerSec, _ = n.core.HandoffsPerSec(s.Lines[i].Key)
		}
		if n.core.Serving() {
			for i := range s.Sessions {
				if lv, ok := n.core.SessionLiveness(ids[i]); ok {
					attached := lv.Attached
					s.Sessions[i].Attached = &attached
				}
			}
		}
	}
	n.mu.Unlock()
	s.AtUnixMs = n.cfg.Now().UnixMilli()
	return s
}

// ms is d in milliseconds, with microseconds kept.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
