package verify

import (
	"context"
	"fmt"
	"math/rand"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/localproc"
	"ticketing/cmd/ticketlab/internal/faults"
)

// Fault kinds of the nemesis.
const (
	FaultKillLeader     = "kill-leader"     // SIGKILL the leader, restart it from its data dir
	FaultKillFollower   = "kill-follower"   // the same for a follower
	FaultPauseLeader    = "pause-leader"    // SIGSTOP/SIGCONT the leader
	FaultPauseFollower  = "pause-follower"  // SIGSTOP/SIGCONT a follower
	FaultPauseWorker    = "pause-worker"    // SIGSTOP a lock-holding worker process past its lease
	FaultIsolateLeader  = "isolate-leader"  // cut every link of the leader
	FaultSplit          = "split"           // a random minority apart from the majority
	FaultBridge         = "bridge"          // two sides that only one node sees both of
	FaultClockForward   = "clock-forward"   // the leader's stamped clock jumps ahead
	FaultClockBackward  = "clock-backward"  // ... or back
	FaultSidecarDrop    = "sidecar-drop"    // a sidecar drops its cluster connections
	FaultFreezeFollower = "freeze-follower" // the leader's links to one follower stall (hashicorp/raft #611/#612)
	FaultWipeFollower   = "wipe-follower"   // a follower loses its data dir and returns at its old address (--wipe)
	// FaultWipeQuorum (--wipe) aims at the hazard: a minority falls behind
	// (partitioned), the up-to-date majority dies, one of it comes back
	// wiped at its old address, and with the stale minority it forms a
	// quorum that has forgotten committed grants.
	FaultWipeQuorum = "wipe-quorum"
	// FaultReplace (--replace-all): a node (Step.Node) loses its disk for
	// good and is replaced through the admin port by a new server at the
	// same address (members replace: the old id, which no longer answers,
	// is removed first, then the new server joins as a learner, catches
	// up and is promoted).
	FaultReplace = "replace"
	// FaultKillLeaderQueues builds long queues first (holders on a few
	// fresh keys, and waiters that queue behind them one by one through
	// every sidecar, each confirmed by its `! QUEUED` before the next is
	// sent, so their queue order is known), then SIGKILLs the leader and
	// restarts it; the holders release once a leader serves, and each
	// granted waiter releases at once (linequeue.go).
	FaultKillLeaderQueues = "kill-leader-queues"
	// FaultKillSidecar SIGKILLs a sidecar process (its workers lose their
	// sessions; with cluster sessions its own expires) and starts it
	// again at the same socket.
	FaultKillSidecar = "kill-sidecar"
)

// leaderFaults are the faults that can leave the cluster without a
// serving leader for a while: a leader killed, paused or cut off, or a
// partition or a loss of state that may take its majority.
var leaderFaults = map[string]bool{
	FaultKillLeader: true, FaultKillLeaderQueues: true, FaultPauseLeader: true, FaultIsolateLeader: true,
	FaultSplit: true, FaultBridge: true, FaultWipeQuorum: true, FaultReplace: true,
	FaultPartitionSidecar: true, FaultHandOverCut: true,
}

// Step is one fault of a schedule: what, for how long, the pause after it,
// and a random number that picks targets and magnitudes.
type Step struct {
	Kind string
	Hold time.Duration
	Gap  time.Duration
	R    int64
	Node int // FaultReplace: the node index
}

// ReplaceAllSchedule replaces every node of a cluster of size nodes, one
// after the other (the leader is whichever node serves when its turn
// comes), with a pause between replacements.
func ReplaceAllSchedule(nodes int) []Step {
	var out []Step
	for i := 0; i < nodes; i++ {
		out = append(out, Step{Kind: FaultReplace, Hold: time.Second, Gap: 3 * time.Second, Node: i})
	}
	return out
}

// Schedule derives a nemesis schedule from seed: faults one at a time,
// each bounded in time, until d is filled. The same seed gives the same
// schedule; which node is "the leader" is resolved when a step runs.
// The extra kinds (issue 39, nemesis_i39.go: FaultPartitionSidecar,
// FaultStopSidecar, FaultHandOverCut, FaultHostile) join the kinds it
// chooses from; without them a seed gives the schedule it always gave.
func Schedule(seed int64, d time.Duration, wipe bool, extra ...string) []Step {
	rng := rand.New(rand.NewSource(seed))
	kinds := []string{
		FaultKillLeader, FaultKillFollower, FaultPauseLeader, FaultPauseFollower, FaultPauseWorker,
		FaultIsolateLeader, FaultSplit, FaultBridge, FaultClockForward, FaultClockBackward,
		FaultSidecarDrop, FaultFreezeFollower, FaultKillSidecar, FaultKillLeaderQueues,
	}
	if wipe {
		kinds = append(kinds, FaultWipeFollower, FaultWipeQuorum)
	}
	kinds = append(kinds, extra...)
	return scheduleOf(rng, d, kinds)
}

// ScheduleOnly is Schedule choosing among kinds only (`ticketlab verify
// --only-new-faults`: the issue-39 faults on their own).
func ScheduleOnly(seed int64, d time.Duration, kinds []string) []Step {
	return scheduleOf(rand.New(rand.NewSource(seed)), d, kinds)
}

func scheduleOf(rng *rand.Rand, d time.Duration, kinds []string) []Step {
	var out []Step
	for total := time.Duration(0); total < d; {
		k := kinds[rng.Intn(len(kinds))]
		hold := time.Duration(1000+rng.Intn(3000)) * time.Millisecond
		if k == FaultPauseWorker {
			hold = maxLease + time.Duration(500+rng.Intn(2000))*time.Millisecond
		}
		gap := time.Duration(500+rng.Intn(1500)) * time.Millisecond
		out = append(out, Step{Kind: k, Hold: hold, Gap: gap, R: rng.Int63()})
		total += hold + gap
	}
	return out
}

// nemesis applies a schedule to a process cluster.
type nemesis struct {
	p       *localproc.Procs
	dir     string   // the cluster's dir, where the fault files are
	drops   []uint64 // each sidecar's drop_connections counter
	workers []*workerProc
	h       *History
	log     func(format string, args ...any)

	mu         sync.Mutex
	sidecarCut [][]string // per sidecar: the client addresses it cannot reach
	// findings are what the issue-39 faults saw go wrong by themselves
	// (nemesis_i39.go): a key held by nobody, a wait bound not kept, a
	// hostile request answered OK, a lease not expiring on time.
	findings []Violation
	cut      [][2]string
	freeze   [][2]string
	offsets  []int64
	wiped    bool
	heals    []int64 // Unix ns at which each fault was healed
	// lost: server ids whose state was wiped and that are not replaced
	// yet; maxLost: the largest set of them at one time.
	lost    map[string]replacement
	maxLost []string

	// The kill-leader-queues fault's lines (linequeue.go): keys and
	// waiters per key of each, rounds built, sessions opened.
	lineKeys, lineWaiters   int
	lineRounds, lineClients int
	// lineHold is how long a granted line waiter holds before it
	// releases (0: at once). With places told, two walks: a line that
	// drained between two walks would tell its waiters nothing after the
	// kill (the sidecar writes a place only when it changed, and a new
	// leader's retelling of the unchanged ones is not passed on).
	lineHold time.Duration
}

// replacement is a wiped server's pending replacement: node index and the
// new server id at its address (node -1: not known yet).
type replacement struct {
	node  int
	newID string
}

func newNemesis(p *localproc.Procs, dir string, workers []*workerProc, h *History, logf func(string, ...any)) *nemesis {
	return &nemesis{p: p, dir: dir, drops: make([]uint64, p.Sidecars()), sidecarCut: make([][]string, p.Sidecars()), workers: workers, h: h, log: logf,
		offsets: make([]int64, p.Size()), lost: map[string]replacement{}, lineKeys: DefaultLineKeys, lineWaiters: DefaultLineWaiters}
}

// faultFile is the fault file of the process named name (a node id or
// sidecarJ) in the cluster's dir.
func faultFile(dir, name string) string { return filepath.Join(dir, name+".faults.json") }

// dropSidecarConnections makes sidecar j drop every cluster connection it
// has, through its fault file's counter.
func (n *nemesis) dropSidecarConnections(j int) error {
	n.mu.Lock()
	n.drops[j]++
	n.mu.Unlock()
	return n.writeSidecarFaults(j)
}

// writeSidecarFaults writes sidecar j's fault file from the current state:
// its drop counter and the cluster addresses it is cut from.
func (n *nemesis) writeSidecarFaults(j int) error {
	n.mu.Lock()
	spec := faults.Spec{DropConnections: n.drops[j], CutAddrs: n.sidecarCut[j]}
	n.mu.Unlock()
	return faults.Write(faultFile(n.dir, fmt.Sprintf("sidecar%d", j+1)), spec)
}

// writeFaults writes every node's fault file from the current state.
func (n *nemesis) writeFaults() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := 0; i < n.p.Size(); i++ {
		spec := faults.Spec{Cut: n.cut, Freeze: n.freeze, ClockOffsetMs: n.offsets[i]}
		if err := faults.Write(faultFile(n.dir, n.p.ID(i)), spec); err != nil {
			return err
		}
	}
	return nil
}

// leader finds the serving leader, or -1.
func (n *nemesis) leader(ctx context.Context) int {
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	i, err := n.p.Leader(lctx)
	if err != nil {
		return -1
	}
	return i
}

// replace swaps node i's old server id for the new server now running at
// its address, through the admin port, and says how it went (for the
// fault's record). Like an operator it does not give up on a refusal: it
// asks again until the replacement is done or ctx ends (the run is over),
// so one refused attempt cannot leave a lost voter in the configuration
// while the next fault wipes another. Until then oldID counts as lost.
func (n *nemesis) replace(ctx context.Context, i int, oldID string) string {
	newID, err := n.p.ServerID(i, 10*time.Second)
	if err != nil || oldID == "" || newID == oldID {
		return fmt.Sprintf("; not replaced (old %q, new %q, %v)", oldID, newID, err)
	}
	n.mu.Lock()
	n.lost[oldID] = replacement{node: i, newID: newID}
	n.mu.Unlock()
	start := time.Now()
	for attempt := 1; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		err := n.p.Admin().Replace(rctx, oldID, newID, n.p.PeerAddr(i), func(step string) {
			n.log("nemesis: replace %s by %s: %s", oldID, newID, step)
		})
		cancel()
		if err == nil {
			n.mu.Lock()
			delete(n.lost, oldID)
			n.mu.Unlock()
			took := time.Since(start).Round(time.Millisecond)
			n.log("nemesis: replaced %s by %s in %v (%d attempts)", oldID, newID, took, attempt)
			return fmt.Sprintf("; replaced by %s in %v (%d attempts)", newID, took, attempt)
		}
		n.log("nemesis: replacing %s by %s: attempt %d failed: %v", oldID, newID, attempt, err)
		if ctx.Err() != nil {
			return fmt.Sprintf("; replacing %s by %s not done when the run ended (%d attempts; last: %v)", oldID, newID, attempt, err)
		}
		sleepCtx(ctx, time.Second)
	}
}

// finishReplacements retries, within ctx, every replacement the nemesis
// could not finish before its run ended: part of the final heal.
func (n *nemesis) finishReplacements(ctx context.Context) {
	n.mu.Lock()
	pending := make(map[string]replacement, len(n.lost))
	for old, r := range n.lost {
		pending[old] = r
	}
	n.mu.Unlock()
	for old, r := range pending {
		n.log("nemesis: final heal: finishing the replacement of %s%s", old, n.replace(ctx, r.node, old))
	}
}

// MaxLost returns the largest set of server ids that had lost their state
// at one time during the run, sorted.
func (n *nemesis) MaxLost() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.maxLost...)
}

// Lost returns the server ids that lost their state (wiped) and were not
// replaced, sorted.
func (n *nemesis) Lost() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.lost))
	for id := range n.lost {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// noteLost records that server ids lost their state at once (one fault);
// maxLost keeps the largest such set of the run.
func (n *nemesis) noteLost(ids ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, id := range ids {
		if id == "" {
			continue
		}
		if _, ok := n.lost[id]; !ok {
			n.lost[id] = replacement{node: -1}
		}
	}
	if len(n.lost) > len(n.maxLost) {
		n.maxLost = n.maxLost[:0]
		for id := range n.lost {
			n.maxLost = append(n.maxLost, id)
		}
		sort.Strings(n.maxLost)
	}
}

// pick returns the leader (or a random node if none serves) and a follower
// distinct from it.
func (n *nemesis) pick(ctx context.Context, rng *rand.Rand) (leader, follower int) {
	size := n.p.Size()
	leader = n.leader(ctx)
	if leader < 0 {
		leader = rng.Intn(size)
	}
	follower = (leader + 1 + rng.Intn(size-1)) % size
	return leader, follower
}

// groups turns a partition into the cut links: every pair in different
// groups, except that a bridge node (not in any group) keeps its links.
func groupsCut(ids []string, groups ...[]int) [][2]string {
	side := map[int]int{}
	for g, members := range groups {
		for _, m := range members {
			side[m] = g + 1
		}
	}
	var cut [][2]string
	for a := range ids {
		for b := a + 1; b < len(ids); b++ {
			if side[a] != 0 && side[b] != 0 && side[a] != side[b] {
				cut = append(cut, [2]string{ids[a], ids[b]})
			}
		}
	}
	return cut
}

func (n *nemesis) run(ctx context.Context, steps []Step) {
	for _, st := range steps {
		if ctx.Err() != nil {
			return
		}
		n.apply(ctx, st)
		sleepCtx(ctx, st.Gap)
	}
}

// apply runs one step: inject, hold, heal, and record it.
func (n *nemesis) apply(ctx context.Context, st Step) {
	rng := rand.New(rand.NewSource(st.R))
	ids := n.p.IDs()
	size := len(ids)
	rec := Op{Kind: KindFault, Fault: st.Kind, Worker: -1}
	hold := func() { sleepCtx(ctx, st.Hold) }
	begin := func(target, detail string) {
		rec.Target, rec.Detail, rec.Inv = target, detail, time.Now().UnixNano()
		n.log("nemesis: %s %s %s", st.Kind, target, detail)
	}
	switch st.Kind {
	case FaultKillLeader, FaultKillFollower, FaultWipeFollower, FaultReplace:
		l, f := n.pick(ctx, rng)
		i := l
		if st.Kind != FaultKillLeader {
			i = f
		}
		if st.Kind == FaultReplace {
			i = st.Node
		}
		oldID, _ := n.p.ServerID(i, 0)
		begin(ids[i], fmt.Sprintf("down %v", st.Hold))
		_ = n.p.Signal(i, syscall.SIGKILL)
		wipe := st.Kind == FaultWipeFollower || st.Kind == FaultReplace
		if wipe {
			if err := n.p.Wipe(i); err != nil {
				rec.Detail += " (wipe failed: " + err.Error() + ")"
			}
			n.noteLost(oldID)
			n.mu.Lock()
			n.wiped = true
			n.mu.Unlock()
			rec.Detail += ", data dir wiped"
		}
		hold()
		if err := n.p.Start(i); err != nil {
			rec.Detail += " (restart failed: " + err.Error() + ")"
		}
		if wipe {
			// Heal: the new server takes the old one's place.
			rec.Detail += n.replace(ctx, i, oldID)
		}
	case FaultKillLeaderQueues:
		if n.p.Sidecars() == 0 {
			return
		}
		ln, err := n.buildLines(ctx, n.lineKeys, n.lineWaiters)
		l, _ := n.pick(ctx, rng) // whoever serves the line now
		begin(ids[l], fmt.Sprintf("down %v under queues: %s", st.Hold, ln.describe()))
		if err != nil {
			rec.Detail += " (line incomplete: " + err.Error() + ")"
		}
		killAt := time.Now().UnixNano()
		_ = n.p.Signal(l, syscall.SIGKILL)
		hold()
		if err := n.p.Start(l); err != nil {
			rec.Detail += " (restart failed: " + err.Error() + ")"
		}
		rec.Cmp = time.Now().UnixNano() // the heal; the line drains after it
		ln.drain(killAt)
		rec.Detail += "; after the kill: " + ln.describe()
		n.log("nemesis: %s %s: line drained: %s", st.Kind, ids[l], ln.describe())
	case FaultWipeQuorum:
		l, f := n.pick(ctx, rng)
		oldF, _ := n.p.ServerID(f, 0)
		var lagging, current []int
		for _, i := range rng.Perm(size) {
			if i != l && i != f && len(lagging) < size/2 {
				lagging = append(lagging, i)
			} else {
				current = append(current, i)
			}
		}
		sort.Ints(lagging)
		begin(ids[f], fmt.Sprintf("%s fall behind; %s die; %s returns wiped", names(ids, lagging), names(ids, current), ids[f]))
		n.mu.Lock()
		n.cut = groupsCut(ids, lagging, current)
		n.wiped = true
		n.mu.Unlock()
		_ = n.writeFaults()
		sleepCtx(ctx, st.Hold/2) // grants commit without the lagging side
		for _, i := range current {
			_ = n.p.Signal(i, syscall.SIGKILL)
		}
		_ = n.p.Wipe(f)
		n.noteLost(oldF)
		n.mu.Lock()
		n.cut = nil
		n.mu.Unlock()
		_ = n.writeFaults()
		_ = n.p.Start(f)
		hold()
		for _, i := range current {
			if i != f {
				_ = n.p.Start(i)
			}
		}
		rec.Detail += n.replace(ctx, f, oldF)
	case FaultPauseLeader, FaultPauseFollower:
		l, f := n.pick(ctx, rng)
		i := l
		if st.Kind == FaultPauseFollower {
			i = f
		}
		begin(ids[i], fmt.Sprintf("paused %v", st.Hold))
		_ = n.p.Signal(i, syscall.SIGSTOP)
		hold()
		_ = n.p.Signal(i, syscall.SIGCONT)
	case FaultPauseWorker:
		if len(n.workers) == 0 {
			return
		}
		// Wait (a little) for a worker process that holds a lock, a block
		// for the first 3 s: paused past its lease, it wakes to a fenced
		// write of every key of the block under a token that may have been
		// overtaken on some of them.
		var w *workerProc
		var held Op
		start := time.Now()
		deadline := start.Add(5 * time.Second)
		for w == nil && time.Now().Before(deadline) && ctx.Err() == nil {
			block := time.Since(start) < 3*time.Second
			for _, k := range rng.Perm(len(n.workers)) {
				if op, ok := n.workers[k].holds(block); ok {
					w, held = n.workers[k], op
					break
				}
			}
			if w == nil {
				sleepCtx(ctx, 5*time.Millisecond)
			}
		}
		switch {
		case w == nil:
			w = n.workers[rng.Intn(len(n.workers))]
			begin(fmt.Sprintf("w%d", w.id), fmt.Sprintf("paused %v (holding nothing)", st.Hold))
		case isBlock(held):
			begin(fmt.Sprintf("w%d", w.id), fmt.Sprintf("paused %v holding block %s token %d (lease %dms)", st.Hold, strings.Join(held.Keys, ","), held.Token, held.LeaseMs))
		default:
			begin(fmt.Sprintf("w%d", w.id), fmt.Sprintf("paused %v holding %s token %d (lease %dms)", st.Hold, held.Key, held.Token, held.LeaseMs))
		}
		rec.Token, rec.Keys, rec.Acq = held.Token, held.Keys, held.ID
		w.signal(syscall.SIGSTOP)
		hold()
		w.signal(syscall.SIGCONT)
	case FaultIsolateLeader, FaultSplit, FaultBridge:
		l, _ := n.pick(ctx, rng)
		var cut [][2]string
		var detail string
		switch st.Kind {
		case FaultIsolateLeader:
			var rest []int
			for i := range ids {
				if i != l {
					rest = append(rest, i)
				}
			}
			cut = groupsCut(ids, []int{l}, rest)
			detail = "alone"
		case FaultSplit:
			perm := rng.Perm(size)
			minority, majority := perm[:size/2], perm[size/2:]
			sort.Ints(minority)
			sort.Ints(majority)
			cut = groupsCut(ids, minority, majority)
			detail = fmt.Sprintf("%s | %s", names(ids, minority), names(ids, majority))
		case FaultBridge:
			perm := rng.Perm(size)
			bridge := perm[0]
			a, b := perm[1:1+(size-1)/2], perm[1+(size-1)/2:]
			cut = groupsCut(ids, a, b)
			detail = fmt.Sprintf("%s | %s, bridged by %s", names(ids, a), names(ids, b), ids[bridge])
		}
		begin(ids[l], detail)
		n.mu.Lock()
		n.cut = cut
		n.mu.Unlock()
		_ = n.writeFaults()
		hold()
		n.mu.Lock()
		n.cut = nil
		n.mu.Unlock()
		_ = n.writeFaults()
	case FaultClockForward, FaultClockBackward:
		l, _ := n.pick(ctx, rng)
		off := int64(10_000 + rng.Intn(110_000))
		if st.Kind == FaultClockBackward {
			off = -off
		}
		begin(ids[l], fmt.Sprintf("offset %+dms for %v", off, st.Hold))
		n.mu.Lock()
		n.offsets[l] = off
		n.mu.Unlock()
		_ = n.writeFaults()
		hold()
		n.mu.Lock()
		n.offsets[l] = 0
		n.mu.Unlock()
		_ = n.writeFaults()
	case FaultSidecarDrop:
		if n.p.Sidecars() == 0 {
			return
		}
		j := rng.Intn(n.p.Sidecars())
		times := 1 + rng.Intn(3)
		begin(fmt.Sprintf("sidecar%d", j+1), fmt.Sprintf("%d drops over %v", times, st.Hold))
		for k := 0; k < times && ctx.Err() == nil; k++ {
			_ = n.dropSidecarConnections(j)
			sleepCtx(ctx, st.Hold/time.Duration(times))
		}
	case FaultKillSidecar:
		if n.p.Sidecars() == 0 {
			return
		}
		j := rng.Intn(n.p.Sidecars())
		begin(fmt.Sprintf("sidecar%d", j+1), fmt.Sprintf("down %v", st.Hold))
		rec.Sidecar = j + 1
		// Inv (begin) is just before the kill, Cmp just before the restart:
		// nothing sent before Cmp can be answered later than a moment after
		// Inv (checkKilledSidecars).
		_ = n.p.SignalSidecar(j, syscall.SIGKILL) // returns once it exited
		hold()
		rec.Cmp = time.Now().UnixNano()
		if err := n.p.StartSidecar(j); err != nil {
			rec.Detail += " (restart failed: " + err.Error() + ")"
			break
		}
		// Its workers dial again as soon as the socket answers.
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := ticketing.WaitReady(rctx, n.p.SidecarSocket(j))
		cancel()
		if err != nil {
			rec.Detail += " (not ready after its restart: " + err.Error() + ")"
		}
	case FaultPartitionSidecar, FaultStopSidecar, FaultHandOverCut, FaultHostile, FaultRevoke:
		if !n.applyI39(ctx, st, rng, &rec, begin) {
			return
		}
	case FaultFreezeFollower:
		l, f := n.pick(ctx, rng)
		begin(ids[f], fmt.Sprintf("links to leader %s frozen %v", ids[l], st.Hold))
		n.mu.Lock()
		n.freeze = [][2]string{{ids[l], ids[f]}}
		n.mu.Unlock()
		_ = n.writeFaults()
		hold()
		n.mu.Lock()
		n.freeze = nil
		n.mu.Unlock()
		_ = n.writeFaults()
	default:
		return
	}
	if rec.Cmp == 0 {
		rec.Cmp = time.Now().UnixNano()
	}
	n.mu.Lock()
	n.heals = append(n.heals, rec.Cmp)
	n.mu.Unlock()
	n.h.Add(rec)
}

// healAll ends every fault: links and clocks restored, paused processes
// resumed, stopped nodes started.
func (n *nemesis) healAll() {
	n.mu.Lock()
	n.cut, n.freeze = nil, nil
	clear(n.offsets)
	clear(n.sidecarCut)
	n.mu.Unlock()
	_ = n.writeFaults()
	for j := 0; j < n.p.Sidecars(); j++ {
		_ = n.writeSidecarFaults(j)
	}
	for i := 0; i < n.p.Size(); i++ {
		if n.p.Running(i) {
			_ = n.p.Signal(i, syscall.SIGCONT)
		} else {
			_ = n.p.Start(i)
		}
	}
	for _, w := range n.workers {
		w.signal(syscall.SIGCONT)
	}
}

func names(ids []string, idx []int) string {
	var s []string
	for _, i := range idx {
		s = append(s, ids[i])
	}
	return strings.Join(s, ",")
}
