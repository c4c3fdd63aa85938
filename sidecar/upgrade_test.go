package sidecar

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"ticketing/cluster"
	"ticketing/cluster/local"
	"ticketing/cluster/testkit"
	"ticketing/cluster/wire"
	"ticketing/locksm"
)

// upgradeLoad is the load of the rolling-upgrade test: through each
// broker, clients cycling acquire and release on keys of their own and
// clients queueing on one hot key. It checks, as grants arrive, that a
// key has one holder at a time (a grant while the previous holder of the
// key has not started its release and its lease still runs is a second
// holder) and that the tokens of a key strictly increase, and it counts
// every call's outcome: each must be a reply or one of the broker's
// documented errors, within a hang guard.
type upgradeLoad struct {
	t        *testing.T
	stop     chan struct{}
	finished sync.Once
	wg       sync.WaitGroup

	mu         sync.Mutex
	holding    map[string]Lock   // key → the grant whose release has not started
	last       map[string]uint64 // key → the latest token granted
	violations []string
	phase      string         // "6" until the new broker holds a session, then "7"
	outcomes   map[string]int // "phase/broker/op/outcome" → count
	cycles     map[string]*atomic.Int64
}

func newUpgradeLoad(t *testing.T) *upgradeLoad {
	return &upgradeLoad{t: t, stop: make(chan struct{}), phase: "6", holding: map[string]Lock{}, last: map[string]uint64{},
		outcomes: map[string]int{}, cycles: map[string]*atomic.Int64{}}
}

func (l *upgradeLoad) violate(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.violations = append(l.violations, fmt.Sprintf(time.Now().Format("15:04:05.000 ")+format, args...))
}

func (l *upgradeLoad) granted(lk Lock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if h, ok := l.holding[lk.Key]; ok && now.Before(h.ValidUntil) {
		l.violations = append(l.violations, fmt.Sprintf("%s: two holders: %s (token %d, valid until %s) and %s (token %d)",
			lk.Key, h.Owner, h.Token, h.ValidUntil.Format("15:04:05.000"), lk.Owner, lk.Token))
	}
	if lk.Token <= l.last[lk.Key] {
		l.violations = append(l.violations, fmt.Sprintf("%s: token %d granted after %d", lk.Key, lk.Token, l.last[lk.Key]))
	}
	l.last[lk.Key] = lk.Token
	l.holding[lk.Key] = lk
}

func (l *upgradeLoad) releasing(lk Lock) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.holding[lk.Key]; ok && h.Token == lk.Token {
		delete(l.holding, lk.Key)
	}
}

// outcome names err for the counts; a call whose error is none of the
// broker's documented ones, or that got no answer within its hang guard,
// is a violation (a request lost silently).
func (l *upgradeLoad) outcome(who, op string, err error) {
	name := "ok"
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		l.violate("%s %s: no answer within the hang guard: %v", who, op, err)
		name = "no answer"
	case errors.Is(err, ErrIndeterminate):
		name = "indeterminate"
	case errors.Is(err, ErrTimeout):
		name = "timeout"
	case errors.Is(err, ErrBusy):
		name = "busy"
	case errors.Is(err, ErrUnavailable):
		name = "unavailable"
	case errors.Is(err, ErrMoved):
		name = "moved"
	case errors.Is(err, ErrSessionLost):
		name = "session lost"
	case op == "release" && (errors.Is(err, locksm.ErrNotHeld) || errors.Is(err, locksm.ErrTokenMismatch)):
		name = "not held"
	default:
		l.violate("%s %s: undocumented error %v", who, op, err)
		name = "other"
	}
	l.mu.Lock()
	l.outcomes[l.phase+"/"+who+"/"+op+"/"+name]++
	l.mu.Unlock()
}

func (l *upgradeLoad) counter(who string) *atomic.Int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cycles[who] == nil {
		l.cycles[who] = &atomic.Int64{}
	}
	return l.cycles[who]
}

// run starts the load through b: cyclers on keys of their own, and
// waiters queueing on the hot key shared by both brokers.
func (l *upgradeLoad) run(who string, b *Broker, cyclers, hot int) {
	done := l.counter(who)
	cycle := func(key, owner string, lease, wait, hold time.Duration) {
		defer l.wg.Done()
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			lk, err := b.Acquire(ctx, key, owner, lease, wait)
			l.outcome(who, "acquire", err)
			if err == nil {
				l.granted(lk)
				time.Sleep(hold)
				l.releasing(lk)
				err = b.Release(ctx, lk)
				l.outcome(who, "release", err)
				if err == nil {
					done.Add(1)
				}
			} else {
				time.Sleep(50 * time.Millisecond)
			}
			cancel()
		}
	}
	for i := range cyclers {
		l.wg.Add(1)
		go cycle(fmt.Sprintf("%s/k%d", who, i), fmt.Sprintf("%s-c%d", who, i), 5*time.Second, 3*time.Second, 5*time.Millisecond)
	}
	for i := range hot {
		l.wg.Add(1)
		go cycle("hot", fmt.Sprintf("%s-h%d", who, i), 5*time.Second, 10*time.Second, 20*time.Millisecond)
	}
}

// progress waits until every broker's clients completed n more cycles.
func (l *upgradeLoad) progress(t *testing.T, what string, n int64) {
	t.Helper()
	l.mu.Lock()
	from := map[string]int64{}
	for who, c := range l.cycles {
		from[who] = c.Load()
	}
	l.mu.Unlock()
	testkit.WaitFor(t, fmt.Sprintf("%d more cycles through each broker (%s)", n, what), 60*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for who, c := range l.cycles {
			if c.Load() < from[who]+n {
				return false
			}
		}
		return true
	})
}

func (l *upgradeLoad) finish(t *testing.T) {
	t.Helper()
	ran := false
	l.finished.Do(func() { ran = true })
	if !ran {
		return
	}
	close(l.stop)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	names := make([]string, 0, len(l.outcomes))
	for k := range l.outcomes {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		fmt.Fprintf(&b, " %s=%d", k, l.outcomes[k])
	}
	t.Logf("outcomes:%s", b.String())
	for _, v := range l.violations {
		t.Error(v)
	}
}

// plainLeaderConn reports whether b serves the leader through a
// connection that the leader refused the session on (not_supported).
func plainLeaderConn(b *Broker) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.slots {
		if s.addr == b.leader && s.conn != nil && b.isPlain(s.conn) {
			return true
		}
	}
	return false
}

// A rolling upgrade from version 6 to 7 under load (issue 31), on three
// real nodes over TCP, in-process: a node of "the old build" is one with
// cluster.Config.ProtocolVersion 6, and each node is restarted on its own
// data dir at 7, one at a time, the leader included. Two brokers carry the
// load throughout: an old one (sessions off: it offers version 6) and a
// new one (sessions auto). Throughout: one holder per key, tokens strictly
// increase, every call ends with a reply or a documented error. While any
// member is at 6 the cluster version stays 6 and no session is opened
// (with a version 7 leader and version 6 followers too: the leader
// refuses the new broker's open not_supported and the broker serves
// without a session); a roll back of one node to 6 meanwhile is harmless.
// Once every member is at 7 the cluster version becomes 7, the new broker
// holds a session and its waiters survive a leader kill in order, while
// the old broker's waiters are dropped at the leader change
// (Indeterminate, as today).
func TestRollingUpgradeUnderLoad(t *testing.T) {
	at := func(v uint16) func(*cluster.Config) {
		return func(cfg *cluster.Config) { cfg.ProtocolVersion = v }
	}
	c, err := local.Start(local.Options{Dir: t.TempDir(), Logger: testLogger(), Tune: func(cfg *cluster.Config) {
		local.FastRaft(cfg)
		cfg.ProtocolVersion = wire.VersionSessions - 1
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	li := leaderOf(t, c)
	running := map[int]bool{0: true, 1: true, 2: true}
	version := map[int]uint16{0: 6, 1: 6, 2: 6}
	clusterVersion := func(want uint16) {
		t.Helper()
		for i := range c.Size() {
			if !running[i] {
				continue
			}
			testkit.WaitFor(t, fmt.Sprintf("node %d at cluster version %d", i, want), 60*time.Second, func() bool {
				return c.Node(i).ClusterVersion() == want
			})
		}
	}
	noSessions := func(when string) {
		t.Helper()
		floor := c.Node(leaderOf(t, c)).LastToken()
		for i := range c.Size() {
			if !running[i] {
				continue
			}
			// A node restarted a moment ago may not have applied its log
			// yet (cluster version 0).
			testkit.WaitFor(t, fmt.Sprintf("node %d applied the log up to token %d", i, floor), 30*time.Second, func() bool {
				return c.Node(i).ClusterVersion() != 0 && c.Node(i).LastToken() >= floor
			})
			c.Node(i).ReadState(func(st *locksm.State) {
				if n := st.NumSessions(); n != 0 {
					t.Fatalf("%s: node %d has %d sessions in its state while the cluster version is 6", when, i, n)
				}
			})
			if v := c.Node(i).ClusterVersion(); v != wire.VersionSessions-1 {
				t.Fatalf("%s: node %d at cluster version %d, want 6", when, i, v)
			}
		}
	}
	clusterVersion(6)

	old := newBroker(t, c, sessionsOff)
	nb := newBroker(t, c, nil)
	load := newUpgradeLoad(t)
	load.run("old", old, 4, 2)
	load.run("new", nb, 4, 2)
	defer load.finish(t) // a test that stopped early stops its load too
	load.progress(t, "all at version 6", 5)
	noSessions("all at version 6")
	if si := nb.Info().Session; si != nil {
		t.Fatalf("new broker against version 6 nodes: session %+v", si)
	}

	stop := func(i int) {
		t.Helper()
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
		running[i] = false
	}
	restart := func(i int, v uint16) {
		t.Helper()
		stop(i)
		if err := c.RestartWith(i, at(v)); err != nil {
			t.Fatal(err)
		}
		running[i], version[i] = true, v
		leaderOf(t, c)
	}
	follower := func(skip int) int {
		for i := range c.Size() {
			if i != li && i != skip && running[i] {
				return i
			}
		}
		t.Fatal("no follower")
		return -1
	}

	// 1. A follower runs the new build.
	a := follower(-1)
	restart(a, wire.VersionSessions)
	load.progress(t, "one follower at 7", 5)
	noSessions("one follower at 7")

	// 2. It takes the lead (a planned hand-over): a version 7 leader with
	// version 6 followers proposes no session command. The new broker's
	// open is refused not_supported, and it serves without a session.
	ctx := ctxT(t, 120*time.Second)
	if _, err := c.Node(li).HandOver(ctx, c.Node(a).ServerID()); err != nil {
		t.Fatalf("hand-over to the version 7 node: %v", err)
	}
	testkit.WaitFor(t, "the version 7 node serving", 30*time.Second, func() bool { return leaderOf(t, c) == a })
	prev := li
	li = a
	testkit.WaitFor(t, "the new broker refused a session by the version 7 leader", 30*time.Second, func() bool {
		return plainLeaderConn(nb)
	})
	load.progress(t, "a version 7 leader, version 6 followers", 5)
	noSessions("a version 7 leader, version 6 followers")
	if si := nb.Info().Session; si != nil {
		t.Fatalf("new broker while the cluster version is 6: session %+v", si)
	}

	// 3. The old leader (now a follower) runs the new build; then it is
	// rolled back to the old one, and forward again: while the cluster
	// version is 6, a roll back is harmless.
	restart(prev, wire.VersionSessions)
	load.progress(t, "two members at 7", 5)
	restart(prev, wire.VersionSessions-1)
	load.progress(t, "rolled back to 6", 5)
	noSessions("one member rolled back to 6")
	restart(prev, wire.VersionSessions)
	load.progress(t, "rolled forward to 7", 5)
	noSessions("two members at 7, one at 6")

	// 4. The leader is killed and comes back on the same data dir (the
	// version 7 build again); the last version 6 member may lead
	// meanwhile (the new broker then talks version 6 to it).
	// A waiter of the new broker at the kill is dropped with the leader
	// (no session: Indeterminate, as today).
	killed := leaderOf(t, c)
	hold6, err := nb.Acquire(ctx, "line6", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	load.granted(hold6)
	waiter6 := make(chan error, 1)
	go func() {
		_, err := nb.Acquire(ctx, "line6", "waiter", 30*time.Second, 60*time.Second)
		waiter6 <- err
	}()
	testkit.WaitFor(t, "the new broker's waiter queued", 20*time.Second, func() bool {
		var q int
		c.Node(killed).ReadState(func(st *locksm.State) { q = len(st.Waiters("line6")) })
		return q == 1
	})
	stop(killed)
	li = leaderOf(t, c)
	if err := <-waiter6; !errors.Is(err, ErrIndeterminate) {
		t.Fatalf("the new broker's waiter at a leader kill with cluster version 6: %v, want ErrIndeterminate (no session)", err)
	}
	load.releasing(hold6)
	if err := nb.Release(ctx, hold6); err != nil {
		t.Fatalf("release on the new leader: %v", err)
	}
	load.progress(t, "the leader killed", 3)
	restart(killed, wire.VersionSessions)
	li = leaderOf(t, c)
	load.progress(t, "the killed leader back", 3)
	noSessions("one member still at 6")

	// 5. The last member runs the new build (a leader restart if it
	// leads). Once the serving leader's discovery finds every member at
	// 7 (at the latest its next periodic round), the cluster version is 7
	// and the new broker opens its session on a fresh connection.
	last := -1
	for i, v := range version {
		if v < wire.VersionSessions {
			last = i
		}
	}
	restart(last, wire.VersionSessions)
	li = leaderOf(t, c)
	clusterVersion(wire.VersionSessions)
	testkit.WaitFor(t, "the new broker's session attached", 30*time.Second, func() bool {
		si := nb.Info().Session
		return si != nil && si.State == "attached"
	})
	if si := old.Info().Session; si != nil {
		t.Fatalf("old broker (sessions off) at cluster version 7: session %+v", si)
	}
	load.mu.Lock()
	load.phase = "7"
	load.mu.Unlock()
	load.progress(t, "every member at 7, a session", 5)

	// 6. A line on one key, with waiters of both brokers, and the leader
	// killed: the new broker's waiters keep their places and are granted
	// in order; the old broker's, session-less, are dropped with the old
	// leader (Indeterminate, as today).
	hold, err := nb.Acquire(ctx, "line", "holder", 60*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	load.granted(hold)
	type res struct {
		who string
		lk  Lock
		err error
	}
	out := make(chan res, 8)
	queued := 0
	for i := range 8 {
		b, who := nb, fmt.Sprintf("new%d", i)
		if i%3 == 1 {
			b, who = old, fmt.Sprintf("old%d", i)
		}
		go func() {
			lk, err := b.Acquire(ctx, "line", who, 30*time.Second, 60*time.Second)
			out <- res{who, lk, err}
		}()
		queued++
		testkit.WaitFor(t, "waiter queued", 20*time.Second, func() bool {
			var q int
			c.Node(li).ReadState(func(st *locksm.State) { q = len(st.Waiters("line")) })
			return q == queued
		})
	}
	resumes := nb.Info().Session.Resumes
	killed = li
	stop(killed)
	li = leaderOf(t, c)
	testkit.WaitFor(t, "the session resumed on the new leader", 30*time.Second, func() bool {
		si := nb.Info().Session
		return si != nil && si.State == "attached" && si.Resumes > resumes
	})
	// The old broker's waiters end first (at the leader change).
	var order []string
	for range 3 {
		r := <-out
		if !strings.HasPrefix(r.who, "old") || !errors.Is(r.err, ErrIndeterminate) {
			t.Fatalf("%s: %v (lock %+v); want the old broker's waiters Indeterminate at the leader change", r.who, r.err, r.lk)
		}
	}
	load.releasing(hold)
	if err := nb.Release(ctx, hold); err != nil {
		t.Fatalf("release on the new leader: %v", err)
	}
	for range 5 {
		r := <-out
		if r.err != nil {
			t.Fatalf("%s after the leader kill: %v", r.who, r.err)
		}
		load.granted(r.lk)
		order = append(order, r.who)
		load.releasing(r.lk)
		if err := nb.Release(ctx, r.lk); err != nil {
			t.Fatalf("release %s: %v", r.who, err)
		}
	}
	if want := "new0 new2 new3 new5 new6"; strings.Join(order, " ") != want {
		t.Errorf("grant order after the leader kill: %v, want %s", order, want)
	}
	restart(killed, wire.VersionSessions)
	load.progress(t, "after the leader kill at version 7", 5)
	load.finish(t)
	t.Logf("new broker's session: %+v", nb.Info().Session)
}
