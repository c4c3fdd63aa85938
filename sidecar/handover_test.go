package sidecar

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/local"
	"ticketing/cluster/netfault"
	"ticketing/cluster/obs"
	"ticketing/cluster/testkit"
	"ticketing/locksm"
)

// startClusterWith starts an in-process cluster with opts (Dir, Tune and
// Logger filled in) and waits for a leader.
func startClusterWith(t *testing.T, opts local.Options) *local.Cluster {
	t.Helper()
	opts.Dir, opts.Tune, opts.Logger = t.TempDir(), local.FastRaft, testLogger()
	c, err := local.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	leaderOf(t, c)
	return c
}

// movedReplies sums the M replies the running nodes have sent.
func movedReplies(t *testing.T, c *local.Cluster) float64 {
	t.Helper()
	var sum float64
	for i := 0; i < c.Size(); i++ {
		n := c.Node(i)
		if n == nil {
			continue
		}
		for _, name := range []string{"ticketing_node_acquires_total", "ticketing_node_releases_total"} {
			v, ok, err := obs.Value(n.MetricsRegistry(), name, "result", "moved")
			if err != nil || !ok {
				t.Fatalf("no %s{result=moved} on node %d: %v", name, i, err)
			}
			sum += v
			if v > 0 {
				t.Logf("node %d (%s, serving %v): %s{result=moved} = %v", i, n.ServerID(), n.Serving(), name, v)
			}
		}
	}
	return sum
}

// waitAddrs waits until the leader lists every running member's client
// address.
func waitAddrs(t *testing.T, c *local.Cluster) {
	t.Helper()
	testkit.WaitFor(t, "every member's client address", 15*time.Second, func() bool {
		ms, err := c.Node(leaderOf(t, c)).Members()
		if err != nil {
			return false
		}
		for _, m := range ms {
			if m.ClientAddr == "" {
				return false
			}
		}
		return true
	})
}

// A leader that starts handing over tells the broker, which then holds new
// requests (writes nothing) until a leader serves: here the transfer fails
// (the target is cut off), the old leader serves again, and the held
// acquire is granted there. No node ever answered M, and the acquire that
// waited in the leader's queue got a definite timeout (withdrawn through
// the log), not Indeterminate.
func TestBrokerHoldsRequestsDuringAHandOver(t *testing.T) {
	faults := netfault.New()
	c := startClusterWith(t, local.Options{PeerNet: faults})
	b := newBroker(t, c, nil)
	ctx := ctxT(t, 60*time.Second)
	waitAddrs(t, c)
	li := leaderOf(t, c)
	ti := (li + 1) % 3
	leader, target := c.Node(li), c.Node(ti).ServerID()

	held, err := b.Acquire(ctx, "k", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "k", "waiter", 60*time.Second, 20*time.Second)
		waiter <- err
	}()
	testkit.WaitFor(t, "the waiter to queue", 10*time.Second, func() bool {
		var q int
		leader.ReadState(func(st *locksm.State) { q = len(st.Waiters("k")) })
		return q == 1
	})

	faults.Cut(c.ID(li), c.ID(ti))
	defer faults.Heal()
	handed := make(chan error, 1)
	go func() {
		hctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := leader.HandOver(hctx, target)
		handed <- err
	}()
	testkit.WaitFor(t, "the broker to hear of the hand-over", 10*time.Second, func() bool { return b.Info().Leader == "" })
	heldReq := make(chan error, 1)
	go func() {
		lk, err := b.Acquire(ctx, "during", "o", 30*time.Second, 0)
		if err == nil {
			err = b.Release(ctx, lk)
		}
		heldReq <- err
	}()
	if err := <-waiter; !errors.Is(err, ErrTimeout) {
		t.Fatalf("the queued acquire at a hand-over: %v, want ErrTimeout (withdrawn, never granted)", err)
	}
	if err := <-handed; err == nil {
		t.Fatal("the hand-over to a cut-off target succeeded")
	}
	if err := <-heldReq; err != nil {
		t.Fatalf("the acquire held during the hand-over: %v", err)
	}
	if m := movedReplies(t, c); m != 0 {
		t.Fatalf("nodes answered %v requests with M: the broker wrote during the hand-over", m)
	}
	if err := b.Release(ctx, held); err != nil {
		t.Fatalf("the holding from before the hand-over: %v", err)
	}
}

// Under load from many callers (distinct keys, and a contended one), the
// leadership is handed over three times (Node.HandOver, what Shutdown and
// the removal of the leader run first): no
// caller sees Indeterminate or ErrMoved, no node answers M, and tokens
// keep increasing. Queued acquires on the contended key may end with a
// definite ErrTimeout (withdrawn at the hand-over).
func TestBrokerHandOverUnderLoad(t *testing.T) {
	c := startClusterWith(t, local.Options{})
	b := newBroker(t, c, nil)
	ctx := ctxT(t, 120*time.Second)
	waitAddrs(t, c)

	var mu sync.Mutex
	var bad []error
	start := time.Now()
	var timeline []string // when each call failed and each hand-over ran (diagnostics)
	mark := func(format string, args ...any) {
		mu.Lock()
		timeline = append(timeline, fmt.Sprintf("%6.3fs ", time.Since(start).Seconds())+fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	counts := map[string]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	worker := func(key string, wait time.Duration) {
		defer wg.Done()
		var last uint64
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			lk, err := b.Acquire(ctx, key, fmt.Sprintf("%s.%d", key, i), 10*time.Second, wait)
			if err == nil {
				if lk.Token <= last {
					err = fmt.Errorf("token %d after %d", lk.Token, last)
				}
				last = lk.Token
				if err == nil {
					err = b.Release(ctx, lk)
				}
			}
			mu.Lock()
			switch {
			case err == nil:
				counts["ok"]++
			case errors.Is(err, ErrTimeout) && wait > 0:
				counts["timeout"]++
			default:
				bad = append(bad, fmt.Errorf("%s: %w", key, err))
				timeline = append(timeline, fmt.Sprintf("%6.3fs %s failed: %v", time.Since(start).Seconds(), key, err))
			}
			mu.Unlock()
		}
	}
	for w := 0; w < 12; w++ {
		wg.Add(1)
		go worker(fmt.Sprintf("own/%d", w), 0)
	}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go worker("hot", 5*time.Second)
	}
	progress := func() {
		mu.Lock()
		n := counts["ok"]
		mu.Unlock()
		testkit.WaitFor(t, "cycles to go on", 20*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return counts["ok"] >= n+50
		})
	}
	progress()
	term0 := c.Node(leaderOf(t, c)).Raft().CurrentTerm()
	for round := 0; round < 3; round++ {
		li := leaderOf(t, c)
		mark("hand-over %d from node %d starts", round, li)
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		to, err := c.Node(li).HandOver(hctx, "")
		cancel()
		mark("hand-over %d to %v returned (err %v); broker: %+v", round, to, err, b.Info())
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		progress()
		mark("hand-over %d: 50 more cycles done", round)
	}
	close(stop)
	wg.Wait()
	// Each hand-over is one election at the next term; more means an
	// election nobody planned (a leader losing its lease on a loaded
	// machine), whose clients may see M or Indeterminate as at a crash.
	if term := c.Node(leaderOf(t, c)).Raft().CurrentTerm(); term != term0+3 {
		t.Logf("term %d after 3 hand-overs from term %d: an unplanned election happened too", term, term0)
	}
	if len(bad) > 0 {
		// CI saw 9 releases fail with "cluster unavailable" for 5 s once
		// (not reproduced in 21 loaded runs); the timeline says when.
		t.Fatalf("%d calls failed around planned hand-overs, first: %v\ntimeline:\n  %s", len(bad), bad[0], strings.Join(timeline, "\n  "))
	}
	if m := movedReplies(t, c); m != 0 {
		t.Fatalf("nodes answered %v requests with M", m)
	}
	t.Logf("%d cycles, %d withdrawn waits (timeout)", counts["ok"], counts["timeout"])
}

// The broker follows membership: started with the three original
// addresses only, it keeps serving while all three nodes are replaced by
// servers at other addresses (learner, promote, remove, as `members
// replace` does; the leader's removal hands its leadership over) and each
// old node is stopped after its replacement, with no restart. It learns
// the new members' client addresses from the leader, dials them, and stops
// keeping the removed members' (the seeds stay).
func TestBrokerFollowsMembership(t *testing.T) {
	adminSecret := []byte("the-admin-secret-0123456789abcdef")
	c := startClusterWith(t, local.Options{Nodes: 6, Voters: 3, AdminSecret: adminSecret})
	seeds := c.ClientAddrs()[:3]
	b := newBroker(t, c, func(cfg *Config) { cfg.Addrs = seeds; cfg.MembersRefresh = 200 * time.Millisecond })
	ctx := ctxT(t, 180*time.Second)
	var admins []string
	for i := 0; i < c.Size(); i++ {
		admins = append(admins, c.AdminAddr(i))
	}
	admin := &client.AdminCluster{Addrs: admins, Config: client.AdminConfig{Secret: adminSecret, ClusterID: c.ClusterID}}

	var mu sync.Mutex
	var ok int
	var fails []error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				lk, err := b.Acquire(ctx, fmt.Sprintf("k%d", w), "o", 10*time.Second, 0)
				if err == nil {
					err = b.Release(ctx, lk)
				}
				mu.Lock()
				if err == nil {
					ok++
				} else {
					fails = append(fails, err)
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}(w)
	}
	okNow := func() int { mu.Lock(); defer mu.Unlock(); return ok }
	for i := 0; i < 3; i++ {
		oldID, newID := c.Node(i).ServerID(), c.Node(3+i).ServerID()
		if err := admin.Replace(ctx, oldID, newID, c.PeerAddr(3+i), func(s string) { t.Log(s) }); err != nil {
			t.Fatal(err)
		}
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
		t.Logf("replaced %s by %s at %s and stopped it", oldID, newID, c.ClientAddr(3+i))
	}
	// Every original address is gone now.
	n := okNow()
	testkit.WaitFor(t, "calls to succeed through the new members", 30*time.Second, func() bool { return okNow() >= n+100 })
	close(stop)
	wg.Wait()

	testkit.WaitFor(t, "the broker to follow the new membership", 10*time.Second, func() bool {
		in := b.Info()
		if len(in.Members) != 3 || len(in.Connected) != 3 {
			return false
		}
		connected := map[string]bool{}
		for _, a := range in.Connected {
			connected[a] = true
		}
		for j, m := range in.Members { // sorted by server id: n4, n5, n6
			if m.ServerID != c.Node(3+j).ServerID() || m.ClientAddr != c.ClientAddr(3+j) || !connected[c.ClientAddr(3+j)] {
				return false
			}
		}
		return len(in.Addrs) == 6 // the three seeds stay, dead as they are
	})
	in := b.Info()
	t.Logf("INFO: leader %s, connected %v of %v; %d calls succeeded, %d failed", in.Leader, in.Connected, in.Addrs, okNow(), len(fails))
	for _, err := range fails {
		if errors.Is(err, ErrIndeterminate) {
			t.Errorf("a call was indeterminate during the replacement: %v", err)
		}
	}
}
