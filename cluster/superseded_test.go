package cluster_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/netfault"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// dirNet is a netfault.Network plus one-way dial blocks: a blocked
// from->to pair cannot open (or keep) a connection that from dialled to
// to, while to's own connections to from still work. Raft's transport
// sends a node's RPCs on the connections it dialled, so this stops one
// node's RPCs (votes, heartbeats, appends) reaching another while the
// other's RPCs (and their responses) still get through.
type dirNet struct {
	*netfault.Network
	mu    sync.Mutex
	block map[[2]string]bool
	conns map[*dirConn]struct{}
	// dropAppends / dropBeats: nodes whose Raft AppendEntries carrying
	// an Entries list (replication) / without one (heartbeats) are lost
	// with their connection: the shape of hashicorp/raft #611/#612 (a
	// stalled replication stream while heartbeats continue), and its
	// mirror image.
	dropAppends, dropBeats map[string]bool
}

type dirConn struct {
	net.Conn
	d        *dirNet
	from, to string
}

func newDirNet() *dirNet {
	return &dirNet{Network: netfault.New(), block: map[[2]string]bool{}, conns: map[*dirConn]struct{}{},
		dropAppends: map[string]bool{}, dropBeats: map[string]bool{}}
}

var (
	beatMark   = []byte("\xa7Entries\xc0") // msgpack: Entries: nil (a heartbeat)
	appendMark = []byte("\xa7Entries")
)

func (c *dirConn) Write(p []byte) (int, error) {
	c.d.mu.Lock()
	drop := false
	switch {
	case bytes.Contains(p, beatMark):
		drop = c.d.dropBeats[c.from]
	case bytes.Contains(p, appendMark):
		drop = c.d.dropAppends[c.from]
	}
	c.d.mu.Unlock()
	if drop {
		c.Conn.Close()
		return 0, errDirBlocked
	}
	return c.Conn.Write(p)
}

func (d *dirNet) setDrops(appendsFrom, beatsFrom []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.dropAppends)
	clear(d.dropBeats)
	for _, n := range appendsFrom {
		d.dropAppends[n] = true
	}
	for _, n := range beatsFrom {
		d.dropBeats[n] = true
	}
}

var errDirBlocked = errors.New("attack: one-way block")

func (d *dirNet) Dial(from, to, addr string, timeout time.Duration) (net.Conn, error) {
	d.mu.Lock()
	blocked := d.block[[2]string{from, to}]
	d.mu.Unlock()
	if blocked {
		return nil, errDirBlocked
	}
	c, err := d.Network.Dial(from, to, addr, timeout)
	if err != nil {
		return nil, err
	}
	dc := &dirConn{Conn: c, d: d, from: from, to: to}
	d.mu.Lock()
	d.conns[dc] = struct{}{}
	d.mu.Unlock()
	return dc, nil
}

// Block stops from's RPCs to to (closing what from dialled to to).
func (d *dirNet) Block(from, to string) {
	d.mu.Lock()
	d.block[[2]string{from, to}] = true
	var doomed []*dirConn
	for c := range d.conns {
		if c.from == from && c.to == to {
			doomed = append(doomed, c)
			delete(d.conns, c)
		}
	}
	d.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

func (d *dirNet) Unblock() {
	d.mu.Lock()
	clear(d.block)
	d.mu.Unlock()
}

// startDirCluster is startClusterOpts with a dirNet under the peers.
func startDirCluster(t *testing.T, tune func(*cluster.Config)) (*testCluster, *dirNet) {
	t.Helper()
	dn := newDirNet()
	c := startClusterOpts(t, local.Options{PeerNet: dn, Tune: tune})
	c.faults = dn.Network
	return c, dn
}

// A grant told by a deposed leader that has not yet noticed its
// deposition (issue 39, found by an attack on real nodes; the leader core
// now loses leadership when it applies an entry of a newer term than its
// own, leader.Core.GainLeadership, testdata/sessions_superseded.txt).
//
// The untold rule (docs/sessions.md, "Untold grants") assumes that a
// grant the serving leader applied after its own barrier, to a session
// not attached to it, was told by nobody. But an old leader L1 whose
// planned hand-over "failed" from its own point of view (the target's
// vote request never reached it) is still Raft leader in the old term,
// its core still leading, with the sidecar's session attached. When the
// new leader's first AppendEntries reaches it, hashicorp/raft steps it
// down and hands the committed entries to the FSM in the same RPC, before
// LeaderCh is notified: the FSM goroutine applies the new leader's
// hand-off to the session's waiter while the core still leads, and it
// tells G on the session's connection. The new leader counted that grant
// untold, so when the cut-off sidecar's session expires it releases the
// key by token: the holder that was told G with a 60 s lease loses it
// seconds later, and anybody else can take it.
//
// Before the fix the first attempt showed two holders in 5 runs of 5; a
// variant at stock Raft timings (its replication stream lost while its
// heartbeats pass) on attempt 6 of 6. Each attempt now ends with the old
// leader telling nothing: it lost leadership first.
//
// Real nodes over TCP; only the network is faulted (one-way: the other
// nodes cannot dial the old leader for a while). CommitTimeout is long,
// as in TestDeliveredGrantKeepsLeaseAcrossLeaderAndSidecarCutOff, so that
// the old leader's own periodic appends do not teach it the new term
// first (heartbeats, which hashicorp/raft sends without checking the
// reply's term, keep its lease).
func TestSupersededLeaderTellsNoGrantOfANewerTerm(t *testing.T) {
	const attempts = 3
	for a := 1; a <= attempts; a++ {
		var outcome string
		t.Run(fmt.Sprintf("attempt%d", a), func(t *testing.T) {
			outcome = staleLeaderAttempt(t)
		})
		t.Logf("attempt %d: %s", a, outcome)
		if outcome == "violation" || t.Failed() {
			return
		}
	}
}

func staleLeaderAttempt(t *testing.T) string { return staleLeaderAttemptMode(t, false) }

func staleLeaderAttemptMode(t *testing.T, stock bool) string {
	tune := func(cfg *cluster.Config) { cfg.CommitTimeout = 5 * time.Second }
	if stock {
		tune = nil
	}
	c, dn := startDirCluster(t, tune)
	li := c.leader()
	testkit.WaitFor(t, "cluster version 9", 15*time.Second, func() bool {
		return c.Node(li).ClusterVersion() >= wire.VersionStrictMatch
	})

	// A session-less holder H of "hot" on the old leader.
	h := c.dial(li)
	hTok := mustGrant(t, do(t, h, acquireMsg("hot", "holder", 120, 0)))

	// The sidecar's session, attached to the old leader, queues W on hot
	// (lease 60 s).
	var secret [wire.SecretLen]byte
	_, _ = rand.Read(secret[:])
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	sid := binary.BigEndian.Uint64(idb[:])>>1 | 1
	const attach = 1 << 40
	sc := c.sessionConn(li)
	sc.conn.SetDeadline(time.Now().Add(2 * time.Minute))
	sc.send(wire.Msg{Type: wire.TypeOpenSession, ID: attach, Session: sid, TimeoutMs: 6000, Secret: secret})
	if m := sc.next(); m.Type != wire.TypeOK {
		t.Fatalf("open: %s", describe(m))
	}
	w := acquireMsg("hot", "sidecar.w", 60, 60*time.Second)
	w.ID = 1
	sentW := time.Now()
	sc.send(w)
	if m := sc.next(); m.Type != wire.TypeQueued || m.ID != 1 {
		t.Fatalf("W: %s, want Q", describe(m))
	}
	// Everything the old leader writes on the session's connection from
	// now on.
	msgs := make(chan wire.Msg, 64)
	go func() {
		defer close(msgs)
		for {
			var m wire.Msg
			if err := sc.r.ReadMsg(&m); err != nil {
				return
			}
			msgs <- m
		}
	}()

	// The other nodes cannot dial the old leader from now on: its RPCs
	// reach them, theirs do not reach it.
	l1 := c.ID(li)
	var others []string
	for i := range c.Size() {
		if i != li {
			dn.Block(c.ID(i), l1)
			others = append(others, c.ID(i))
		}
	}
	if stock {
		dn.setDrops([]string{l1}, nil)
	}
	// A planned hand-over (ticketing members hand-over).
	hoDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.Node(li).HandOver(ctx, "")
		hoDone <- err
	}()
	ni := -1
	testkit.WaitFor(t, "a new leader serving", 20*time.Second, func() bool {
		for i := range c.Size() {
			if i != li && c.Node(i).Serving() {
				ni = i
				return true
			}
		}
		return false
	})
	st := c.Node(li).Raft().State().String()
	t.Logf("new leader %s serving; old leader %s raft state %s", c.ID(ni), l1, st)

	// H releases on the new leader: hot goes to W, applied by the new
	// leader after its barrier while the session is not attached to it.
	h2 := c.dial(ni)
	mustType(t, do(t, h2, releaseMsg("hot", "holder", hTok)), wire.TypeOK)
	var g locksm.Holder
	c.Node(ni).ReadState(func(st *locksm.State) { g, _ = st.Holder("hot") })
	if g.Token == 0 || g.Session != sid {
		t.Fatalf("new leader's hot holder %+v, want W of session %x", g, sid)
	}
	t.Logf("new leader applied the hand-off of hot to W: token %d", g.Token)

	// Let the others reach the old leader again, and give the new leader
	// something to append. First wait until the new leader's heartbeats to
	// the old one back off (hashicorp/raft caps the backoff at half the
	// heartbeat timeout), so that its next append, not a heartbeat, is
	// likely the first thing of the new term the old leader reads.
	healWait := 1500 * time.Millisecond
	if stock {
		// The new leader's heartbeats are lost instead; wait only until
		// its replication attempts that captured an older last index are
		// done (each failed on the blocked dial).
		healWait = 300 * time.Millisecond
		dn.setDrops([]string{l1}, others)
	}
	time.Sleep(healWait)
	t.Logf("old leader %s raft state before the heal: %s", l1, c.Node(li).Raft().State())
	dn.Unblock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Only something for the new leader to append: its outcome
		// does not matter.
		_, _, _ = h2.Do(ctx, acquireMsg("poke", "holder", 10, 0))
	}()

	// Did the old leader tell W its grant?
	told := false
	toldAt := time.Time{}
	deadline := time.After(5 * time.Second)
read:
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				break read
			}
			switch m.Type {
			case wire.TypeNotice, wire.TypeOutcomes:
				continue
			case wire.TypeGranted:
				if m.ID == 1 && m.Token == g.Token {
					told, toldAt = true, time.Now()
					t.Logf("the OLD leader %s told the sidecar G id 1 token %d (%v after W was sent)", l1, m.Token, toldAt.Sub(sentW).Round(time.Millisecond))
				}
			default:
				t.Logf("old leader sent %s", describe(m))
			}
		case <-deadline:
			break read
		}
	}
	if err := <-hoDone; err != nil {
		t.Logf("the hand-over (whose target's vote never reached the old leader): %v", err)
	}
	if !told {
		return "race lost: the old leader stepped down before applying (no G told)"
	}

	// The sidecar stays cut off from the new leader (it never resumes
	// there). Its session expires on the new leader.
	testkit.WaitFor(t, "the session's expiry on the new leader", 30*time.Second, func() bool {
		live := true
		c.Node(ni).ReadState(func(st *locksm.State) { _, live = st.Session(sid) })
		return !live
	})
	var after locksm.Holder
	held := false
	c.Node(ni).ReadState(func(st *locksm.State) { after, held = st.Holder("hot") })
	leaseEnd := sentW.Add(60 * time.Second)
	if held && after.Token == g.Token {
		return "no violation: the told grant kept its lease"
	}
	// Someone else takes the key inside the told holder's lease.
	x := c.dial(ni)
	r := do(t, x, acquireMsg("hot", "intruder", 60, 0))
	t.Errorf("INVARIANT 1 VIOLATED: W was told G token %d for hot (lease 60 s, until %s), yet %v later the new leader's expiry of its session released it (holder now %v %+v); an intruder's acquire of hot got %s with %v of W's lease left",
		g.Token, leaseEnd.Format(time.TimeOnly), time.Since(toldAt).Round(time.Millisecond), held, after, describe(r), time.Until(leaseEnd).Round(time.Second))
	return "violation"
}
