package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/client"
	"ticketing/cluster/localproc"
	"ticketing/cluster/wire"
)

// HandOverOptions configures RunHandOvers (`ticketlab bench handover`).
type HandOverOptions struct {
	// Binary is the ticketing executable run as every node and the
	// sidecar (another build measures that build's behaviour).
	Binary string
	// Dir holds the cluster's data, logs and the sidecar's socket.
	Dir string
	// Clients is the number of unix-socket connections to the sidecar,
	// each doing acquire → release cycles on its own goroutine.
	Clients int
	// HandOvers is how many planned hand-overs of the leader to make.
	HandOvers int
	// Mode: "term" (SIGTERM to the leader process, which is then started
	// again), "kill" (SIGKILL instead: a crash, not a hand-over; the
	// others elect a leader after the election timeout, and the longest
	// pause is the failover as the clients see it), "replace" (members replace LEADER SPARE: learner, promote,
	// remove, the leader handing over), or "remove" (a spare is added and
	// promoted first, outside the measurement; then members remove
	// LEADER). After a replace or remove the old leader is stopped, wiped
	// and started again as the next spare.
	Mode string
	// Contended puts every client on one key (its waiters queue at the
	// leader); otherwise each client has its own key.
	Contended bool
	// TLS runs nodes and sidecar over TLS with a throwaway CA.
	TLS bool
	// Out hears one line per hand-over (nil: none).
	Out io.Writer
}

// HandOverRound is what the clients saw during one planned hand-over: from
// the operation on the leader until a second after the next leader served.
type HandOverRound struct {
	N        int
	From, To string // the leader's server id before and after
	// Took is from the operation's start until another node served.
	Took time.Duration
	// OK counts completed cycles (granted, then released).
	OK int
	// Outcomes other than OK, as the unix API reports them (a cycle ends
	// at its first failure, acquire or release).
	Moved, Indeterminate, Timeout, Unavailable, Other int
	FirstOther                                        string
	// LongestPause is the longest time in which no client completed a
	// cycle.
	LongestPause time.Duration
}

func (r HandOverRound) String() string {
	s := fmt.Sprintf("handover %d: %s -> %s, next leader serving after %v: %d cycles; ERR moved %d, INDETERMINATE %d, TIMEOUT %d, ERR unavailable %d, other %d; longest pause %v",
		r.N, r.From, r.To, r.Took.Round(time.Millisecond), r.OK, r.Moved, r.Indeterminate, r.Timeout, r.Unavailable, r.Other,
		r.LongestPause.Round(time.Millisecond))
	if r.FirstOther != "" {
		s += " (first other: " + r.FirstOther + ")"
	}
	return s
}

// roundStats collects one round's outcomes from every client.
type roundStats struct {
	mu     sync.Mutex
	r      HandOverRound
	lastOK time.Time
}

func (s *roundStats) record(err error, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var e *ticketing.Error
	switch {
	case err == nil:
		s.r.OK++
		s.r.LongestPause = max(s.r.LongestPause, at.Sub(s.lastOK))
		s.lastOK = at
	case errors.Is(err, ticketing.ErrIndeterminate):
		s.r.Indeterminate++
	case errors.Is(err, ticketing.ErrTimeout):
		s.r.Timeout++
	case errors.As(err, &e) && e.Code == "moved":
		s.r.Moved++
	case errors.As(err, &e) && e.Code == "unavailable":
		s.r.Unavailable++
	default:
		s.r.Other++
		if s.r.FirstOther == "" {
			s.r.FirstOther = err.Error()
		}
	}
}

func (s *roundStats) finish(at time.Time) HandOverRound {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.r.LongestPause = max(s.r.LongestPause, at.Sub(s.lastOK))
	return s.r
}

// RunHandOvers starts node processes and a sidecar process from
// o.Binary, runs o.Clients unix-socket clients through the sidecar, and
// makes o.HandOvers planned hand-overs of the leader, reporting what the
// clients saw during each.
func RunHandOvers(ctx context.Context, o HandOverOptions) ([]HandOverRound, error) {
	nodes := 3
	switch o.Mode {
	case "term", "kill":
	case "replace", "remove":
		nodes = 4 // one spare server
	default:
		return nil, fmt.Errorf("mode %q: want term, kill, replace or remove", o.Mode)
	}
	if o.Clients < 1 || o.HandOvers < 1 {
		return nil, fmt.Errorf("want at least one client and one hand-over")
	}
	p, err := localproc.Start(localproc.Options{Binary: o.Binary, Dir: filepath.Join(o.Dir, "cluster"), Nodes: nodes, Voters: 3,
		TLS: o.TLS, Admin: true, Sidecars: 1, ExtraArgs: []string{"--log-level", "warn"}, SidecarArgs: []string{"--log-level", "warn"}})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	spare := -1
	if nodes == 4 {
		spare = 3
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := p.Leader(wctx); err != nil {
		return nil, err
	}
	if err := ticketing.WaitReady(wctx, p.SidecarSocket(0)); err != nil {
		return nil, err
	}

	var cur atomic.Pointer[roundStats] // nil between rounds
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < o.Clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			gen := 0
			keyOf := func() string {
				if o.Contended {
					return "handover/hot"
				}
				return fmt.Sprintf("handover/%d/%d", i, gen)
			}
			key := keyOf()
			var c *ticketing.Client
			defer func() {
				if c != nil {
					c.Close()
				}
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if c == nil {
					var err error
					if c, err = ticketing.Dial(ctx, p.SidecarSocket(0)); err != nil {
						time.Sleep(50 * time.Millisecond)
						continue
					}
				}
				tok, err := c.Acquire(ctx, key, 10*time.Second, 5*time.Second)
				if err == nil {
					err = c.Release(ctx, key, tok)
				}
				if rs := cur.Load(); rs != nil {
					rs.record(err, time.Now())
				}
				switch {
				case errors.Is(err, ticketing.ErrIndeterminate) && !o.Contended:
					// The lock may be held by this session still (an
					// acquire granted unseen, a release that did not
					// happen) until its lease ends: like an application
					// that cannot tell, start over on a new connection
					// (the sidecar releases what the old one held) and a
					// new key, instead of waiting on its own lock (which
					// made every later round of --mode kill look stalled).
					c.Close()
					c = nil
					gen++
					key = keyOf()
				case errors.Is(err, ticketing.ErrClosed) || errors.Is(err, ticketing.ErrProtocol):
					c.Close()
					c = nil
				}
			}
		}(i)
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(time.Second) // warm up

	admin := p.Admin()
	var rounds []HandOverRound
	for k := 1; k <= o.HandOvers; k++ {
		if err := settle(ctx, p, spare); err != nil {
			return rounds, err
		}
		li, err := p.Leader(ctx)
		if err != nil {
			return rounds, err
		}
		st, err := p.Status(ctx, li)
		if err != nil {
			return rounds, err
		}
		from := st.NodeID
		var spareID string
		if spare >= 0 {
			if spareID, err = p.ServerID(spare, 10*time.Second); err != nil {
				return rounds, err
			}
		}
		if o.Mode == "remove" { // not measured: the cluster grows to 4 voters first
			if err := adminUntil(ctx, admin, wire.AdminRequest{Op: "add-learner", ID: spareID, Addr: p.PeerAddr(spare)},
				func(ms map[string]wire.AdminMember) bool { _, ok := ms[spareID]; return ok }); err != nil {
				return rounds, err
			}
			if err := adminUntil(ctx, admin, wire.AdminRequest{Op: "promote", ID: spareID},
				func(ms map[string]wire.AdminMember) bool { return ms[spareID].Voter }); err != nil {
				return rounds, err
			}
			if err := settle(ctx, p, -1); err != nil {
				return rounds, err
			}
		}

		start := time.Now()
		rs := &roundStats{r: HandOverRound{N: k, From: from}, lastOK: start}
		cur.Store(rs)
		acted := make(chan error, 1)
		go func() {
			switch o.Mode {
			case "term":
				acted <- p.Signal(li, syscall.SIGTERM) // returns once it exited
			case "kill":
				acted <- p.Signal(li, syscall.SIGKILL)
			case "replace":
				acted <- admin.Replace(ctx, from, spareID, p.PeerAddr(spare), nil)
			case "remove":
				acted <- adminUntil(ctx, admin, wire.AdminRequest{Op: "remove", ID: from},
					func(ms map[string]wire.AdminMember) bool { _, ok := ms[from]; return !ok })
			}
		}()
		var ni int
		for {
			lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
			ni, err = p.Leader(lctx)
			lcancel()
			if err != nil {
				return rounds, err
			}
			if ni != li {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		rs.r.Took = time.Since(start)
		if err := <-acted; err != nil {
			return rounds, fmt.Errorf("hand-over %d (%s): %w", k, o.Mode, err)
		}
		if st, err := p.Status(ctx, ni); err == nil {
			rs.r.To = st.NodeID
		}
		time.Sleep(time.Second) // what the hand-over still causes lands in this round
		cur.Store(nil)
		r := rs.finish(time.Now())
		rounds = append(rounds, r)
		if o.Out != nil {
			fmt.Fprintln(o.Out, r)
		}
		switch o.Mode {
		case "term", "kill":
			if err := p.Start(li); err != nil {
				return rounds, err
			}
		default: // the removed leader becomes the next spare: a new server at its address
			if err := p.Signal(li, syscall.SIGTERM); err != nil {
				return rounds, err
			}
			if err := p.Wipe(li); err != nil {
				return rounds, err
			}
			if err := p.Start(li); err != nil {
				return rounds, err
			}
			spare = li
		}
	}
	return rounds, nil
}

// settle waits until a leader serves and every other running node but
// skip (a spare, not a member) knows a leader and has applied what the
// leader had committed when it was asked (first: under load the commit
// index moves on), then lets heartbeats settle.
func settle(ctx context.Context, p *localproc.Procs, skip int) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ok := false
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		li, err := p.Leader(lctx)
		cancel()
		if err == nil {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := p.Status(sctx, li)
			cancel()
			ok = err == nil && st.Role == wire.RoleLeader && st.Commit > 0
			for i := 0; i < p.Size() && ok; i++ {
				if i == li || i == skip || !p.Running(i) {
					continue
				}
				sctx, cancel := context.WithTimeout(ctx, time.Second)
				fs, err := p.Status(sctx, i)
				cancel()
				ok = err == nil && fs.LeaderID != "" && fs.Applied >= st.Commit
			}
		}
		if ok {
			time.Sleep(500 * time.Millisecond)
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("cluster not settled within 60s")
}

// adminUntil sends req through the admin ports until done holds for the
// leader's member list, retrying while another change, an election or a
// lagging learner is in the way (as AdminCluster.Replace does per step).
func adminUntil(ctx context.Context, a *client.AdminCluster, req wire.AdminRequest, done func(map[string]wire.AdminMember) bool) error {
	for {
		if rep, err := a.Do(ctx, wire.AdminRequest{Op: "members"}); err == nil {
			ms := map[string]wire.AdminMember{}
			for _, m := range rep.Members {
				ms[m.ServerID] = m
			}
			if done(ms) {
				return nil
			}
		}
		_, err := a.Do(ctx, req)
		switch {
		case err == nil:
			continue // confirm through members
		case errors.Is(err, wire.ErrChangeInProgress), errors.Is(err, wire.ErrNotLeader),
			errors.Is(err, wire.ErrLearnerLagging), !errors.Is(err, client.ErrAdmin):
		default:
			return fmt.Errorf("%s %s: %w", req.Op, req.ID, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// handOverSummary is the closing line: per hand-over maxima and the median
// longest pause.
func handOverSummary(o HandOverOptions, rounds []HandOverRound) string {
	var moved, indet, timeout, other, totalMoved, totalIndet int
	var pauses []time.Duration
	for _, r := range rounds {
		moved, indet, timeout, other = max(moved, r.Moved), max(indet, r.Indeterminate), max(timeout, r.Timeout), max(other, r.Other+r.Unavailable)
		totalMoved += r.Moved
		totalIndet += r.Indeterminate
		pauses = append(pauses, r.LongestPause)
	}
	sort.Slice(pauses, func(i, j int) bool { return pauses[i] < pauses[j] })
	keys := "one key each"
	if o.Contended {
		keys = "all on one key"
	}
	return fmt.Sprintf("handover over %d × %s, %d clients (%s): per hand-over at most ERR moved %d (total %d), INDETERMINATE %d (total %d), TIMEOUT %d, other %d; longest pause median %v, max %v",
		len(rounds), o.Mode, o.Clients, keys, moved, totalMoved, indet, totalIndet, timeout, other,
		pauses[len(pauses)/2].Round(time.Millisecond), pauses[len(pauses)-1].Round(time.Millisecond))
}
