package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"ticketing/cluster/localproc"
	"ticketing/sidecar"
)

// Replacement on node processes, under acquire/release load through a
// broker the whole time. Raft runs with the fast test timeouts
// (local.FastRaft's values, as flags), so each test stays well under a
// minute and a half. The figures (replacement times, longest grant gap) are
// logged: `go test ./cmd/ticketing -run TestReplace -v`.

// fastRaftArgs are local.FastRaft's timeouts as `ticketing node` flags.
var fastRaftArgs = []string{"--heartbeat-timeout", "600ms", "--election-timeout", "600ms",
	"--leader-lease-timeout", "500ms", "--log-level", "warn"}

// maxGrantGap bounds the time between consecutive grants under load while
// nodes die and are replaced (item 1 of issue 15).
const maxGrantGap = 5 * time.Second

// grantRec is one grant as a worker saw it.
type grantRec struct {
	worker    int
	sent, got time.Time
	token     uint64
}

// loadRun is workers acquiring (a fresh key each time, lease 10 s, no
// wait) and releasing through one broker until stopped.
type loadRun struct {
	mu     sync.Mutex
	grants []grantRec
	fails  map[string]int
	stop   chan struct{}
	wg     sync.WaitGroup
}

func startLoad(b *sidecar.Broker, workers int) *loadRun {
	l := &loadRun{fails: map[string]int{}, stop: make(chan struct{})}
	for w := 0; w < workers; w++ {
		l.wg.Add(1)
		go func(w int) {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				sent := time.Now()
				lk, err := b.Acquire(ctx, fmt.Sprintf("load/w%d/%d", w, i), fmt.Sprintf("w%d", w), 10*time.Second, 0)
				got := time.Now()
				if err == nil {
					l.mu.Lock()
					l.grants = append(l.grants, grantRec{worker: w, sent: sent, got: got, token: lk.Token})
					l.mu.Unlock()
					if rerr := b.Release(ctx, lk); rerr != nil {
						l.fail("release", rerr)
					}
				} else {
					l.fail("acquire", err)
				}
				cancel()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}(w)
	}
	return l
}

func (l *loadRun) fail(op string, err error) {
	kind := "other"
	for _, k := range []struct {
		err  error
		name string
	}{{sidecar.ErrMoved, "moved"}, {sidecar.ErrUnavailable, "unavailable"}, {sidecar.ErrIndeterminate, "indeterminate"}} {
		if errors.Is(err, k.err) {
			kind = k.name
		}
	}
	l.mu.Lock()
	l.fails[op+" "+kind]++
	l.mu.Unlock()
}

// count is the number of grants so far.
func (l *loadRun) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.grants)
}

// waitGrants waits until n more grants than now were made.
func (l *loadRun) waitGrants(t *testing.T, n int) {
	t.Helper()
	want := l.count() + n
	deadline := time.Now().Add(90 * time.Second) // a hang guard
	for l.count() < want {
		if time.Now().After(deadline) {
			t.Fatalf("load made %d grants in 90 s, want %d more", l.count(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// finish stops the load and checks it: tokens strictly increase in real
// time (a grant received before another was asked for has the smaller
// token; every token is unique), and it returns the longest time without a
// grant in [from, to].
func (l *loadRun) finish(t *testing.T, from, to time.Time) time.Duration {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	gs := slices.Clone(l.grants)
	bySent := slices.Clone(gs)
	sort.Slice(bySent, func(i, j int) bool { return bySent[i].sent.Before(bySent[j].sent) })
	sort.Slice(gs, func(i, j int) bool { return gs[i].got.Before(gs[j].got) })
	seen := map[uint64]bool{}
	var maxBefore uint64 // the largest token received before the current request was sent
	k := 0
	for _, g := range bySent {
		for ; k < len(gs) && gs[k].got.Before(g.sent); k++ {
			maxBefore = max(maxBefore, gs[k].token)
		}
		if g.token <= maxBefore {
			t.Fatalf("worker %d got token %d after a grant of %d had been received", g.worker, g.token, maxBefore)
		}
		if seen[g.token] {
			t.Fatalf("token %d granted twice", g.token)
		}
		seen[g.token] = true
	}
	var gap time.Duration
	last := from
	for _, g := range gs {
		if g.got.Before(from) || g.got.After(to) {
			continue
		}
		gap = max(gap, g.got.Sub(last))
		last = g.got
	}
	gap = max(gap, to.Sub(last))
	t.Logf("load: %d grants, failures %v", len(gs), l.fails)
	return gap
}

// replaceEnv is a process cluster with admin ports and a broker under load.
type replaceEnv struct {
	t    *testing.T
	p    *localproc.Procs
	b    *sidecar.Broker
	load *loadRun
	ctx  context.Context
}

func startReplaceEnv(t *testing.T, nodes, voters int) *replaceEnv {
	t.Helper()
	p, err := localproc.Start(localproc.Options{Binary: binary, Dir: t.TempDir(), Nodes: nodes, Voters: voters,
		Admin: true, ExtraArgs: fastRaftArgs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	// A hang guard for the whole test, not a speed bound: under two
	// concurrent -race suites on 2 cores (CI) one replacement took past 80 s.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	if _, err := p.Leader(ctx); err != nil {
		t.Fatal(err)
	}
	b := procsBroker(t, p)
	e := &replaceEnv{t: t, p: p, b: b, ctx: ctx, load: startLoad(b, 4)}
	e.load.waitGrants(t, 20)
	return e
}

// adminFlags are the flags that reach the nodes' admin ports.
func (e *replaceEnv) adminFlags() []string {
	return []string{"--admin", strings.Join(e.p.AdminAddrs(), ","), "--admin-secret-file", e.p.AdminSecretFile,
		"--cluster-id", e.p.ClusterID, "--timeout", "60s"}
}

// members runs `ticketing members ARGS... FLAGS` and returns its output.
func (e *replaceEnv) members(args ...string) (string, error) {
	e.t.Helper()
	out, err := exec.CommandContext(e.ctx, binary, append(append([]string{"members"}, args...), e.adminFlags()...)...).CombinedOutput()
	return string(out), err
}

// replace runs `ticketing members replace OLD NEW ADDR` and returns how
// long it took (to OLD gone and NEW a voter) and its output.
func (e *replaceEnv) replace(oldID, newID, addr string) (time.Duration, string) {
	e.t.Helper()
	start := time.Now()
	out, err := e.members("replace", oldID, newID, addr)
	d := time.Since(start)
	if err != nil {
		e.t.Fatalf("members replace %s %s %s: %v\n%s", oldID, newID, addr, err, out)
	}
	e.t.Logf("replace %s by %s: %v\n%s", oldID, newID, d.Round(time.Millisecond), out)
	return d, out
}

// wipe SIGKILLs node i, deletes its data dir and starts it again empty at
// its old addresses; it returns its new server id.
func (e *replaceEnv) wipe(i int) string {
	e.t.Helper()
	if err := e.p.Signal(i, syscall.SIGKILL); err != nil {
		e.t.Fatal(err)
	}
	if err := e.p.Wipe(i); err != nil {
		e.t.Fatal(err)
	}
	if err := e.p.Start(i); err != nil {
		e.t.Fatal(err)
	}
	id, err := e.p.ServerID(i, 10*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

func (e *replaceEnv) serverID(i int) string {
	e.t.Helper()
	id, err := e.p.ServerID(i, time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

// wantMembers checks that the leader lists exactly ids, all voters that
// answer.
func (e *replaceEnv) wantMembers(ids []string) {
	e.t.Helper()
	rep, err := e.p.Admin().Members(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var got []string
	for _, m := range rep.Members {
		if !m.Voter || !m.Answers {
			e.t.Fatalf("member %+v is not an answering voter", m)
		}
		got = append(got, m.ServerID)
	}
	slices.Sort(got)
	ids = slices.Sorted(slices.Values(ids))
	if !slices.Equal(got, ids) {
		e.t.Fatalf("members %v, want %v", got, ids)
	}
}

// waitList polls `members list` until its output has every one of lines
// (a repair command is printed indented on a line of its own).
func (e *replaceEnv) waitList(lines ...string) {
	e.t.Helper()
	var out string
	var err error
	for deadline := time.Now().Add(90 * time.Second); ; { // a hang guard
		out, err = e.members("list")
		if err == nil && !slices.ContainsFunc(lines, func(l string) bool {
			return !strings.Contains(out, l) || (strings.HasPrefix(l, "ticketing ") && !strings.Contains(out, "\n  "+l+"\n"))
		}) {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("members list never showed %q: %v\n%s", lines, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.t.Logf("members list:\n%s", out)
}

// One voter of three (the leader) is SIGKILLed, its data dir wiped, and it
// is started again empty at its old address, as a new incarnation.
// `members list` names the new incarnation and prints the command that
// repairs it; that command, run as printed, removes the dead id first and
// promotes the new one; the cluster keeps granting throughout.
func TestReplaceDeadVoterOfThreeProcs(t *testing.T) {
	e := startReplaceEnv(t, 3, 3)
	li, err := e.p.Leader(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, e.serverID(i))
	}
	from := time.Now()
	oldID := ids[li]
	newID := e.wipe(li)
	// The new leader lists it as the new incarnation, with the repair.
	repair := fmt.Sprintf("ticketing members replace %s %s %s", oldID, newID, e.p.PeerAddr(li))
	e.waitList(repair, "2 of 3 votes answer")
	f := strings.Fields(repair) // ticketing members replace OLD NEW ADDR
	d, out := e.replace(f[3], f[4], f[5])
	if first := strings.SplitN(strings.TrimSpace(out), "\n", 2)[0]; !strings.Contains(first, "remove "+oldID+" first") {
		t.Fatalf("first step %q, want the removal of the dead %s", first, oldID)
	}
	ids[li] = newID
	e.wantMembers(ids)
	e.load.waitGrants(t, 20)
	gap := e.load.finish(t, from, time.Now())
	t.Logf("3 nodes, dead leader replaced in %v; longest grant gap %v", d.Round(time.Millisecond), gap.Round(time.Millisecond))
	if gap > maxGrantGap {
		t.Fatalf("no grant for %v (at most %v)", gap, maxGrantGap)
	}
}

// Two voters of five (the leader and a follower) lose their disks: killed,
// wiped, restarted empty. Both are replaced, one after the other, while
// the cluster survives no further failure; afterwards 5 voters answer, no
// two consecutive grants were more than 5 s apart, and tokens strictly
// increased.
func TestReplaceTwoWipedVotersOfFiveProcs(t *testing.T) {
	e := startReplaceEnv(t, 5, 5)
	li, err := e.p.Leader(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 5; i++ {
		ids = append(ids, e.serverID(i))
	}
	victims := []int{li, (li + 2) % 5}
	from := time.Now()
	newIDs := map[int]string{}
	for _, v := range victims {
		newIDs[v] = e.wipe(v)
	}
	// Degraded: the cluster survives no further failure, and list shows
	// both new incarnations with their repairs.
	e.waitList("3 of 5 votes answer (3 needed): the cluster survives 0 more failures",
		fmt.Sprintf("ticketing members replace %s %s %s", ids[victims[0]], newIDs[victims[0]], e.p.PeerAddr(victims[0])),
		fmt.Sprintf("ticketing members replace %s %s %s", ids[victims[1]], newIDs[victims[1]], e.p.PeerAddr(victims[1])))
	replStart := time.Now()
	var times []time.Duration
	for _, v := range victims {
		d, _ := e.replace(ids[v], newIDs[v], e.p.PeerAddr(v))
		times = append(times, d)
		ids[v] = newIDs[v]
	}
	replEnd := time.Now()
	e.wantMembers(ids)
	e.load.waitGrants(t, 20)
	e.load.mu.Lock()
	var during []grantRec
	for _, g := range e.load.grants {
		if !g.got.Before(replStart) && !g.got.After(replEnd) {
			during = append(during, g)
		}
	}
	e.load.mu.Unlock()
	gap := e.load.finish(t, from, time.Now())
	var gapDuring time.Duration
	last := replStart
	sort.Slice(during, func(i, j int) bool { return during[i].got.Before(during[j].got) })
	for _, g := range during {
		gapDuring = max(gapDuring, g.got.Sub(last))
		last = g.got
	}
	gapDuring = max(gapDuring, replEnd.Sub(last))
	t.Logf("5 nodes, 2 wiped (leader %s and %s): replaced in %v and %v; longest grant gap %v overall (kill of the leader "+
		"included), %v during the replacements (%d grants)", e.p.ID(victims[0]), e.p.ID(victims[1]),
		times[0].Round(time.Millisecond), times[1].Round(time.Millisecond), gap.Round(time.Millisecond),
		gapDuring.Round(time.Millisecond), len(during))
	if gap > maxGrantGap {
		t.Fatalf("no grant for %v (at most %v)", gap, maxGrantGap)
	}
}

// A healthy cluster of five has every voter replaced, one at a time, the
// leader first, onto a spare node: each replacement promotes first (the
// 6th voter exists only inside the leader's promote-and-remove step); the
// replaced node is then wiped and restarted empty, as the spare for the
// next one. Afterwards none of the first five server ids is a member, 5
// voters answer, and grants never paused more than 5 s.
func TestReplaceRollingFiveProcs(t *testing.T) {
	e := startReplaceEnv(t, 6, 5)
	member := map[int]string{} // node index → its server id while a member
	for i := 0; i < 5; i++ {
		member[i] = e.serverID(i)
	}
	original := slices.Collect(func(yield func(string) bool) {
		for _, id := range member {
			if !yield(id) {
				return
			}
		}
	})
	spare := 5
	from := time.Now()
	var times []time.Duration
	for round := 0; round < 5; round++ {
		li, err := e.p.Leader(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		old := -1
		if slices.Contains(original, member[li]) {
			old = li // the leader first, and whenever it is still an original
		} else {
			for i, id := range member {
				if slices.Contains(original, id) && (old < 0 || i < old) {
					old = i
				}
			}
		}
		newID := e.serverID(spare)
		d, out := e.replace(member[old], newID, e.p.PeerAddr(spare))
		if !strings.Contains(out, "in one step") {
			t.Fatalf("replacing the healthy %s did not promote first:\n%s", member[old], out)
		}
		times = append(times, d)
		delete(member, old)
		member[spare] = newID
		e.wipe(old) // gone from the configuration: the next spare
		spare = old
	}
	var ids []string
	for _, id := range member {
		ids = append(ids, id)
	}
	e.wantMembers(ids)
	e.load.waitGrants(t, 20)
	gap := e.load.finish(t, from, time.Now())
	t.Logf("rolling replacement of 5 healthy voters, leader first: %v; longest grant gap %v", times, gap.Round(time.Millisecond))
	if gap > maxGrantGap {
		t.Fatalf("no grant for %v (at most %v)", gap, maxGrantGap)
	}
}
