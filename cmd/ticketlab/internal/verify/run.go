// Package verify is Ticketing's Jepsen-style verification harness (issue
// 4). It runs a real cluster of node processes with sidecar processes on
// loopback, drives a contended lock workload through them (worker
// goroutines with their own unix-socket sessions, and worker processes
// that the nemesis can pause while they hold a lock; single keys mixed
// with blocks of 2..4 keys under one token, issue 18), injects
// faults from a seeded schedule (process kills and pauses, partitions,
// clock jumps, sidecar connection drops, a frozen replication link, a
// killed sidecar, the leader killed under long queues (linequeue.go), and
// optionally a wiped node), heals, and then checks the recorded history:
// mutual exclusion, token order, fencing, block atomicity, no leaked
// grants, linearizability against a lock model (porcupine, one partition
// per connected component of keys), per-key FIFO across leader changes
// (checker_fifo.go), nothing answered by a dead sidecar and its delivered
// holdings kept to their leases (checker_sidecar.go), liveness after the
// heal, and that nothing stays held past its lease; it counts where the
// INDETERMINATE outcomes fell (checker_indeterminate.go). Some workers are extenders (issue 19,
// extender.go): they hold across several leases with EXTEND, or stall past
// their lease (a worker process is also stopped by the nemesis) and must
// notice the loss; the checker proves that an extended lease never lets two
// holders overlap and that every `! LOST` event comes no later than the
// next holder's grant allows (checker_extend.go).
//
// The nodes and sidecars are the lab's own `ticketlab node` and `ticketlab
// sidecar` (the product's commands with the lab's fault file plugged into
// their seams, internal/faults), bootstrapped with the `ticketing` binary
// under test. `ticketlab verify` is the command-line front end; the short
// form runs in `make test` (cmd/ticketlab/verify_test.go).
package verify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/localproc"
	"ticketing/cluster/wire"
)

// Config configures one verification run. Zero fields take the defaults.
type Config struct {
	// Binary is the ticketing executable under test (`ticketing
	// bootstrap` creates the cluster with it). Required.
	Binary string
	// Lab is the ticketlab executable: every node and sidecar runs as
	// `Lab node|sidecar --fault-file F ...` and every worker process as
	// `Lab verify worker ...`. Required.
	Lab string
	// NodeLab, if set, is the ticketlab executable that runs the nodes
	// (`NodeLab node --fault-file F ...`) instead of Lab: an older lab
	// binary runs the node code it was built with, so that the new faults
	// can be shown to find an old build's bugs (sidecars and workers stay
	// Lab's).
	NodeLab string
	// Faults adds fault kinds to the ones the seeded schedule chooses from
	// (the issue-39 faults: I39Faults).
	Faults []string
	// OnlyFaults: the schedule chooses among Faults only.
	OnlyFaults bool
	// Dir receives everything: the cluster's data dirs and logs,
	// history.jsonl, summary.txt and, on a failed check, porcupine's HTML
	// visualization. Required.
	Dir string
	// Nodes is 3 (default) or 5.
	Nodes int
	// Seed picks the nemesis schedule and the workers' choices.
	Seed int64
	// Duration is how long the nemesis runs. Default 30 s.
	Duration time.Duration
	// Workers is the number of in-harness workers (goroutines, each with
	// its own sidecar session). Default 16.
	Workers int
	// ProcWorkers is the number of worker processes (the "pause a
	// lock-holding worker" nemesis needs them). Default 3.
	ProcWorkers int
	// Extenders is how many of the in-harness workers are extenders
	// (issue 19, extender.go: they hold across several leases with EXTEND,
	// and a quarter of their holdings stall past the lease instead).
	// Zero: DefaultExtenders; negative: none.
	Extenders int
	// ProcExtenders is how many of the worker processes are extenders
	// (the pause-worker fault then stops a process that extends, past its
	// lease). Zero: 1; negative: none.
	ProcExtenders int
	// Sidecars is the number of sidecar processes. Default 2.
	Sidecars int
	// Keys is the number of contended keys. Default 4.
	Keys int
	// BlockShare is the share of acquires that are blocks of 2..4 of the
	// keys (one token for all of them). Zero: DefaultBlockShare; negative:
	// no blocks (every acquire takes one key, the workload before issue 18).
	BlockShare float64
	// ReplaceAll replaces the schedule by a rolling replacement of every
	// node (FaultReplace, one after the other, the leader included).
	ReplaceAll bool
	// Steps, if set, is the schedule (instead of the one Seed derives):
	// a test runs chosen faults this way.
	Steps []Step
	// LineKeys and LineWaiters shape the queues the kill-leader-queues
	// fault builds before it kills the leader: fresh keys, and waiters
	// per key. Zero: DefaultLineKeys, DefaultLineWaiters.
	LineKeys, LineWaiters int
	// Wipe adds the wiped-node faults (a data dir removed, the node
	// restarted at its old address). The node comes back as a new server
	// (a new incarnation) that cannot vote under its old id and that no
	// configuration names; once a majority of the original voters is
	// wiped the cluster stops serving (see docs/verification.md).
	Wipe bool
	// RecoveryBound is how soon after the final heal grants must resume.
	// Default 5 s.
	RecoveryBound time.Duration
	// Quiet is how long the workload runs after the final heal. Default 8 s.
	Quiet time.Duration
	// MinGrants: after Quiet the workload goes on until the history holds
	// at least this many granted acquires, for at most MinGrantsWait more
	// (a cluster that stalls is then judged as it is). Zero: no minimum.
	// A fixed duration on a loaded machine completes fewer cycles; what a
	// short run must show is that enough happened, not how fast (a CI run
	// beside another once had 99 grants in a 30 s run that wanted 100).
	MinGrants int
	// MinGrantsWait bounds the wait for MinGrants. Default 2 min.
	MinGrantsWait time.Duration
	// LinearizeTimeout bounds porcupine. Default 2 min.
	LinearizeTimeout time.Duration
	// MaxIndeterminateShare bounds the share of indeterminate acquires
	// (CheckReport.IndeterminateShare); above it the run is inconclusive.
	// Zero: DefaultMaxIndeterminateShare; negative: no bound.
	MaxIndeterminateShare float64
	// NodeArgs are extra flags for every node (and for the `ticketing
	// bootstrap` that creates the cluster), e.g. --log-store bolt.
	NodeArgs []string
	// Logger receives progress lines; nil discards them.
	Logger *slog.Logger
	// Issue 41: semaphores. PermitsN is the n each of PermitKeys
	// semaphore keys is defined with at the start (zero: DefaultPermitsN;
	// negative: no permit workers); PermitWorkers in-harness workers take
	// their permits (permit.go). A third into the nemesis n is raised by 2
	// (waiters granted at once), two thirds in lowered to max(1, n-1)
	// (holders keep their permits; new grants wait). Zero: the defaults.
	PermitsN, PermitKeys, PermitWorkers int
	// PositionInterval is the nodes' --position-interval (issue 41): how
	// often the leader tells waiters their places in line, shorter than
	// the product's 1 s so that a short run sees many places. Zero:
	// DefaultPositionInterval; negative: not passed (the nodes' default).
	// It is passed only when the binary's bootstrap and the node
	// executable both know the flag (an older build runs without it:
	// Result.PositionFlag says which).
	PositionInterval time.Duration
}

// DefaultPositionInterval is verify's --position-interval for its nodes.
const DefaultPositionInterval = 250 * time.Millisecond

// Defaults of the permit workload (issue 41): small, so that permits are
// contended and the n change matters.
const (
	DefaultPermitsN      = 3
	DefaultPermitKeys    = 2
	DefaultPermitWorkers = 6
)

func (c Config) withDefaults() Config {
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.Duration == 0 {
		c.Duration = 30 * time.Second
	}
	if c.Workers == 0 {
		c.Workers = 16
	}
	if c.ProcWorkers == 0 {
		c.ProcWorkers = 3
	}
	if c.Sidecars == 0 {
		c.Sidecars = 2
	}
	if c.Extenders == 0 {
		c.Extenders = DefaultExtenders
	}
	if c.ProcExtenders == 0 {
		c.ProcExtenders = 1
	}
	if c.Keys == 0 {
		c.Keys = 4
	}
	if c.BlockShare == 0 {
		c.BlockShare = DefaultBlockShare
	}
	if c.RecoveryBound == 0 {
		c.RecoveryBound = 5 * time.Second
	}
	if c.MinGrantsWait == 0 {
		c.MinGrantsWait = 2 * time.Minute
	}
	if c.Quiet == 0 {
		c.Quiet = 8 * time.Second
	}
	if c.LinearizeTimeout == 0 {
		c.LinearizeTimeout = 2 * time.Minute
	}
	if c.MaxIndeterminateShare == 0 {
		c.MaxIndeterminateShare = DefaultMaxIndeterminateShare
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.LineKeys == 0 {
		c.LineKeys = DefaultLineKeys
	}
	if c.LineWaiters == 0 {
		c.LineWaiters = DefaultLineWaiters
	}
	if c.PermitsN == 0 {
		c.PermitsN = DefaultPermitsN
	}
	if c.PermitKeys == 0 {
		c.PermitKeys = DefaultPermitKeys
	}
	if c.PermitWorkers == 0 {
		c.PermitWorkers = DefaultPermitWorkers
	}
	if c.PositionInterval == 0 {
		c.PositionInterval = DefaultPositionInterval
	}
	return c
}

// DefaultExtenders is how many in-harness workers extend by default.
const DefaultExtenders = 4

// Stall chances of the extenders' holdings: an in-harness extender's
// holder goroutine stalls itself; a worker process also has the nemesis
// stop it (pause-worker).
const (
	extenderStallProb     = 0.25
	procExtenderStallProb = 0.1
)

// DefaultBlockShare is the share of block acquires in a run: a quarter, so
// that most acquires still take one key and every key sees both.
const DefaultBlockShare = 0.25

// ErrBadConfig wraps configuration errors.
var ErrBadConfig = errors.New("verify: bad config")

// Result is the outcome of a run.
type Result struct {
	Config  Config
	Elapsed time.Duration
	// Ops counts operations by kind and result ("acquire ok", ...).
	Ops map[string]int
	// BlockOps counts the block acquires by result ("ok", ...).
	BlockOps map[string]int
	// Faults lists the nemesis actions in order.
	Faults []Op
	// PausedBlocks counts the pause-worker faults that caught a worker
	// holding a block, and what became of the fenced write (of every key
	// of the block) it made on waking: accepted, refused, or none (it
	// was not writing any more, or the run ended).
	PausedBlocks, PausedBlockAccepted, PausedBlockRefused int
	// Recovery is the time from the final heal to the first grant after
	// it (NoGrant: none); FaultRecoveries the same after each fault's heal.
	Recovery        time.Duration
	FaultRecoveries []time.Duration
	// Lost lists the servers whose state was wiped and that were never
	// replaced; MaxLost the largest set of such servers at one time.
	Lost, MaxLost []string
	// ExpectedStop, when set, says why the cluster was expected to stop
	// serving (a majority of voters lost their state at once); liveness
	// and the final state are then not checked, safety still is.
	ExpectedStop string
	Check        CheckReport
	// Violations are every broken guarantee (Check's and the run's own:
	// liveness, final state, crashed nodes).
	Violations []Violation
	// Inconclusive lists why the run proved less than a pass claims
	// (CheckReport.Inconclusive): not a broken guarantee, but a failed run.
	Inconclusive []string
	// History is the history file.
	History string
	// PermitKeys are the semaphores the permit workers used (none: no
	// permit workload), PermitPlan their n in order (issue 41).
	PermitKeys []string
	PermitPlan []int
	// PositionFlag is the --position-interval flag passed to the nodes
	// ("": none, see Config.PositionInterval).
	PositionFlag string
}

// Passed reports whether the run proved what it checks: no violation and
// nothing inconclusive.
func (r *Result) Passed() bool { return len(r.Violations) == 0 && len(r.Inconclusive) == 0 }

// Run performs one verification run. A returned error means the harness
// could not run (the cluster never came up, ...); broken guarantees are
// reported in Result.Violations, a history that proves too little in
// Result.Inconclusive.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg = cfg.withDefaults()
	if cfg.Binary == "" || cfg.Lab == "" || cfg.Dir == "" {
		return nil, fmt.Errorf("%w: Binary, Lab and Dir are required", ErrBadConfig)
	}
	if cfg.Nodes != 3 && cfg.Nodes != 5 {
		return nil, fmt.Errorf("%w: nodes must be 3 or 5", ErrBadConfig)
	}
	if cfg.BlockShare > 1 {
		return nil, fmt.Errorf("%w: the block share is at most 1", ErrBadConfig)
	}
	if cfg.Workers+cfg.ProcWorkers < 16 {
		return nil, fmt.Errorf("%w: at least 16 workers in all", ErrBadConfig)
	}
	log := cfg.Logger
	logf := func(format string, args ...any) { log.Info(fmt.Sprintf(format, args...)) }
	start := time.Now()
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	// Unix socket paths are limited to ~107 bytes: keep them short.
	sockDir, err := os.MkdirTemp("", "tkv-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(sockDir)

	res := &Result{Config: cfg, History: filepath.Join(cfg.Dir, "history.jsonl"), Recovery: -1}
	h, err := NewHistory(res.History)
	if err != nil {
		return nil, err
	}
	defer func() { _ = h.Close() }() // for the error paths; the success path closes it checked, below

	clusterDir := filepath.Join(cfg.Dir, "cluster")
	os.RemoveAll(clusterDir)
	nodeArgs := cfg.NodeArgs
	if f := positionFlag(ctx, cfg); f != "" {
		res.PositionFlag = f
		nodeArgs = append(append([]string(nil), nodeArgs...), strings.Fields(f)...)
		logf("nodes: %s", f)
	}
	p, err := localproc.Start(localproc.Options{
		Binary: cfg.Binary, Dir: clusterDir, Nodes: cfg.Nodes, ClusterID: "verify",
		Sidecars: cfg.Sidecars, SocketDir: sockDir, ExtraArgs: nodeArgs,
		Command: func(name string, args []string) (string, []string) {
			if cfg.NodeLab != "" && args[0] == "node" {
				return cfg.NodeLab, append([]string{args[0], "--fault-file", faultFile(clusterDir, name)}, args[1:]...)
			}
			return cfg.Lab, append([]string{args[0], "--fault-file", faultFile(clusterDir, name)}, args[1:]...)
		},
		// The production configuration: every node and sidecar link over TLS.
		TLS: true, Admin: true,
	})
	if err != nil {
		return nil, fmt.Errorf("verify: start cluster: %w", err)
	}
	defer p.Close()
	upCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := p.Leader(upCtx); err != nil {
		return nil, fmt.Errorf("verify: cluster did not elect a leader (logs in %s): %w", clusterDir, err)
	}
	for j := 0; j < p.Sidecars(); j++ {
		if err := ticketing.WaitReady(upCtx, p.SidecarSocket(j)); err != nil {
			return nil, fmt.Errorf("verify: sidecar %d (logs in %s): %w", j+1, clusterDir, err)
		}
	}
	logf("cluster up: %d nodes, %d sidecars (%v)", cfg.Nodes, cfg.Sidecars, time.Since(start).Round(time.Millisecond))

	store := NewStore()
	storeSock := filepath.Join(sockDir, "store.sock")
	if err := store.Serve(storeSock); err != nil {
		return nil, err
	}
	defer store.Close()

	keys := make([]string, cfg.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("seat/%d", i)
	}
	params := func(id int, proc bool) WorkerParams {
		wp := WorkerParams{ID: id, Proc: proc, Seed: cfg.Seed*1000 + int64(id), Socket: p.SidecarSocket(id % p.Sidecars()), Sidecar: id%p.Sidecars() + 1,
			Keys: keys, HoldMin: 0, HoldMax: 200 * time.Millisecond, LateProb: 0.05, BlockShare: max(cfg.BlockShare, 0)}
		if proc {
			// Long enough holds that the nemesis can catch them holding,
			// and twice the blocks, so that it catches blocks too.
			wp.HoldMin, wp.HoldMax, wp.LateProb = 300*time.Millisecond, 1500*time.Millisecond, 0.1
			wp.BlockShare = min(2*wp.BlockShare, 1)
			if id >= cfg.Workers+cfg.ProcWorkers-max(cfg.ProcExtenders, 0) {
				wp.Extend, wp.StallProb = true, procExtenderStallProb
			}
		} else if id < max(cfg.Extenders, 0) {
			wp.Extend, wp.StallProb = true, extenderStallProb
		}
		return wp
	}

	// The workload.
	wctx, stopWorkers := context.WithCancel(context.Background())
	defer stopWorkers()
	var wg sync.WaitGroup
	for i := 0; i < cfg.Workers; i++ {
		wp := params(i, false)
		wg.Add(1)
		go func() {
			defer wg.Done()
			runWorker(wctx, wp, func(keys []string, token uint64, worker int, op int64) (bool, error) {
				ok, _ := store.WriteBlock(keys, token, worker, op)
				return ok, nil
			}, func(op Op) { op.Sidecar = wp.Sidecar; h.Add(op) })
		}()
	}
	// The permit workload (issue 41): the semaphores are defined first, on
	// the first sidecar; a cluster that does not speak them yet (ERR
	// not_supported: an older --node-lab) runs without it, as the summary
	// says.
	permitStore := NewStore()
	var permitKeys []string
	var permitPlan []int // the n in order: defined, raised, lowered
	if cfg.PermitsN > 0 {
		pid := cfg.Workers + cfg.ProcWorkers + cfg.PermitWorkers // the controller's worker id
		emit := func(op Op) { op.Sidecar = 1; h.Add(op) }
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		for i := 0; i < cfg.PermitKeys; i++ {
			k := fmt.Sprintf("sem/%d", i)
			if !setPermits(sctx, p.SidecarSocket(0), pid, k, cfg.PermitsN, emit) {
				break
			}
			permitKeys = append(permitKeys, k)
		}
		cancel()
		if len(permitKeys) < cfg.PermitKeys {
			logf("permits: PERMITS refused or unanswered (see the history): no permit workload")
			permitKeys = nil
		}
	}
	if len(permitKeys) > 0 {
		permitPlan = []int{cfg.PermitsN, cfg.PermitsN + 2, max(1, cfg.PermitsN-1)}
		for i := 0; i < cfg.PermitWorkers; i++ {
			id := cfg.Workers + cfg.ProcWorkers + i
			pp := PermitParams{ID: id, Seed: cfg.Seed*1000 + int64(id), Socket: p.SidecarSocket(id % p.Sidecars()), Sidecar: id%p.Sidecars() + 1,
				Keys: permitKeys, HoldMin: 0, HoldMax: 400 * time.Millisecond, LateProb: 0.05, ExtendProb: 0.2}
			wg.Add(1)
			go func() {
				defer wg.Done()
				runPermitWorker(wctx, pp, func(keys []string, token uint64, worker int, op int64) (bool, error) {
					ok, _ := permitStore.WriteBlock(keys, token, worker, op)
					return ok, nil
				}, func(op Op) { op.Sidecar = pp.Sidecar; h.Add(op) })
			}()
		}
		// The n change, under the nemesis: after the warm-up and a third of
		// it, raise; after two thirds, lower.
		wg.Add(1)
		go func() {
			defer wg.Done()
			pid := cfg.Workers + cfg.ProcWorkers + cfg.PermitWorkers
			sock := p.SidecarSocket(1 % p.Sidecars())
			emit := func(op Op) { op.Sidecar = 1%p.Sidecars() + 1; h.Add(op) }
			for _, n := range permitPlan[1:] {
				sleepCtx(wctx, cfg.Duration/3)
				if wctx.Err() != nil {
					return
				}
				for _, k := range permitKeys {
					setPermits(wctx, sock, pid, k, n, emit)
				}
				logf("permits: n of %s set to %d", strings.Join(permitKeys, ","), n)
			}
		}()
	}
	werr, err := os.Create(filepath.Join(cfg.Dir, "workers.log"))
	if err != nil {
		return nil, err
	}
	defer werr.Close()
	var procs []*workerProc
	for i := 0; i < cfg.ProcWorkers; i++ {
		w, err := startWorkerProc(cfg.Lab, params(cfg.Workers+i, true), storeSock, h, werr)
		if err != nil {
			stopWorkers()
			wg.Wait()
			return nil, fmt.Errorf("verify: worker process: %w", err)
		}
		procs = append(procs, w)
	}
	stopAll := func() {
		stopWorkers()
		for _, w := range procs {
			w.stop(20 * time.Second)
		}
		wg.Wait()
	}

	// Warm up, then the nemesis.
	sleepCtx(ctx, 2*time.Second)
	steps := Schedule(cfg.Seed, cfg.Duration, cfg.Wipe, cfg.Faults...)
	if cfg.OnlyFaults && len(cfg.Faults) > 0 {
		steps = ScheduleOnly(cfg.Seed, cfg.Duration, cfg.Faults)
	}
	if cfg.ReplaceAll {
		steps = ReplaceAllSchedule(cfg.Nodes)
	}
	if cfg.Steps != nil {
		steps = cfg.Steps
	}
	nem := newNemesis(p, clusterDir, procs, h, logf)
	nem.lineKeys, nem.lineWaiters = cfg.LineKeys, cfg.LineWaiters
	if res.PositionFlag != "" {
		// The lines' waiters hold two walks each, so the places of those
		// behind change at a pace the leader's walks tell.
		nem.lineHold = 2 * cfg.PositionInterval
	}
	nctx, stopNemesis := context.WithTimeout(ctx, cfg.Duration+10*time.Second)
	nem.run(nctx, steps)
	stopNemesis()
	nem.healAll()
	// An operator's heal also finishes a replacement that was still
	// refused when the nemesis stopped (bounded: a majority that lost its
	// state can never be replaced).
	rctx, stopReplacing := context.WithTimeout(ctx, 2*time.Minute)
	nem.finishReplacements(rctx)
	stopReplacing()
	healAt := time.Now()
	logf("nemesis done: %d faults; healed", len(nem.heals))

	// Quiet period: the workload goes on on a healed cluster.
	sleepCtx(ctx, cfg.Quiet)
	if n := grantsIn(h.Ops()); n < cfg.MinGrants {
		logf("%d grants so far: the workload goes on until %d (at most %v)", n, cfg.MinGrants, cfg.MinGrantsWait)
		for until := time.Now().Add(cfg.MinGrantsWait); time.Now().Before(until) && ctx.Err() == nil && grantsIn(h.Ops()) < cfg.MinGrants; {
			sleepCtx(ctx, 500*time.Millisecond)
		}
	}
	stopAt := time.Now().UnixNano()
	h.Add(Op{Kind: KindEnd, Worker: -1, Inv: stopAt, Cmp: stopAt})
	stopAll()
	logf("workload stopped")

	var viol []Violation
	bad := func(check, format string, args ...any) {
		viol = append(viol, Violation{Check: check, Detail: fmt.Sprintf(format, args...)})
	}

	// Nothing lost: with every session closed, the locks they held are
	// released (or expire within their lease), and every node converges.
	final := FinalState{Wiped: nem.wiped, TokenFloor: p.TokenFloor}
	res.Lost, res.MaxLost = nem.Lost(), nem.MaxLost()
	res.ExpectedStop = expectedStop(res.MaxLost, cfg.Nodes)
	fctx, cancelF := context.WithTimeout(context.Background(), maxLease+15*time.Second)
	defer cancelF()
	st, err := settle(fctx, p, nem.wiped)
	switch {
	case err == nil:
		final.LastToken = st.LastToken
	case res.ExpectedStop != "":
		// Not a violation: nothing can commit without that majority, which
		// is what keeps a token from being issued twice.
	case len(res.Lost) > 0:
		bad("final-state", "%v (servers still lost, not replaced: %s)", err, strings.Join(res.Lost, ", "))
	default:
		bad("final-state", "%v", err)
	}
	viol = append(viol, nem.Findings()...)
	for i := 0; i < p.Size(); i++ {
		if p.Exited(i) {
			bad("crash", "node %s exited by itself (see %s)", p.ID(i), filepath.Join(clusterDir, p.ID(i)+".log"))
		}
	}

	ops := h.Ops()
	if err := h.Close(); err != nil { // the history file is what `ticketlab check` reads again
		return nil, fmt.Errorf("verify: history %s: %w", res.History, err)
	}
	res.Ops, res.BlockOps = map[string]int{}, map[string]int{}
	var grantsAfter []int64
	writeOf := map[int64]Op{}
	for _, op := range ops {
		switch op.Kind {
		case KindFault:
			res.Faults = append(res.Faults, op)
		case KindClose, KindEnd, KindPosition:
		default:
			res.Ops[op.Kind+" "+op.Result]++
			if op.Kind == KindAcquire && op.Result == ResOK {
				grantsAfter = append(grantsAfter, op.Cmp)
			}
			if op.Kind == KindAcquire && isBlock(op) {
				res.BlockOps[op.Result]++
			}
			if op.Kind == KindWrite {
				writeOf[op.Acq] = op
			}
		}
	}
	for _, f := range res.Faults {
		if f.Fault == FaultPauseWorker && len(f.Keys) > 1 {
			res.PausedBlocks++
			switch writeOf[f.Acq].Result {
			case ResOK:
				res.PausedBlockAccepted++
			case ResRejected:
				res.PausedBlockRefused++
			}
		}
	}
	sort.Slice(grantsAfter, func(i, j int) bool { return grantsAfter[i] < grantsAfter[j] })
	firstGrantAfter := func(t int64) time.Duration {
		i := sort.Search(len(grantsAfter), func(i int) bool { return grantsAfter[i] > t })
		if i == len(grantsAfter) {
			return NoGrant
		}
		return time.Duration(grantsAfter[i] - t)
	}
	res.Recovery = firstGrantAfter(healAt.UnixNano())
	switch {
	case res.ExpectedStop != "":
	case res.Recovery == NoGrant:
		bad("liveness", "no grant at all in the %v after the final heal (bound %v)", cfg.Quiet, cfg.RecoveryBound)
	case res.Recovery > cfg.RecoveryBound:
		bad("liveness", "after the final heal the first grant came after %v (bound %v)", res.Recovery.Round(time.Millisecond), cfg.RecoveryBound)
	}
	for _, hAt := range nem.heals {
		res.FaultRecoveries = append(res.FaultRecoveries, firstGrantAfter(hAt))
	}

	res.Check = Check(ops, store.Log(), final, CheckOptions{Dir: cfg.Dir, LinearizeTimeout: cfg.LinearizeTimeout,
		IndeterminateWindow: IndeterminateWindow, MaxIndeterminateShare: cfg.MaxIndeterminateShare, PermitStore: permitStore.Log(),
		PositionInterval: positionIntervalJudged(res.PositionFlag, cfg.PositionInterval)})
	res.PermitKeys, res.PermitPlan = permitKeys, permitPlan
	res.Violations = append(res.Check.Violations, viol...)
	res.Inconclusive = res.Check.Inconclusive
	res.Elapsed = time.Since(start)
	var all strings.Builder
	for _, v := range res.Violations {
		fmt.Fprintf(&all, "%s: %s\n", v.Check, v.Detail)
	}
	if err := os.WriteFile(filepath.Join(cfg.Dir, "violations.txt"), []byte(all.String()), 0o644); err != nil {
		return res, err
	}
	if err := os.WriteFile(filepath.Join(cfg.Dir, "summary.txt"), []byte(res.Summary()), 0o644); err != nil {
		return res, err
	}
	return res, nil
}

// positionFlag is the --position-interval flag for the nodes (and the
// bootstrap, which reads the node flags): "" when Config.PositionInterval
// says not to, when NodeArgs already set it, or when the binary's
// bootstrap or the node executable does not know it (an older build).
func positionFlag(ctx context.Context, cfg Config) string {
	if cfg.PositionInterval < 0 {
		return ""
	}
	for _, a := range cfg.NodeArgs {
		if strings.HasPrefix(strings.TrimLeft(a, "-"), "position-interval") {
			return ""
		}
	}
	nodeBin := cfg.Lab
	if cfg.NodeLab != "" {
		nodeBin = cfg.NodeLab
	}
	if !knowsFlag(ctx, cfg.Binary, "bootstrap", "position-interval") || !knowsFlag(ctx, nodeBin, "node", "position-interval") {
		return ""
	}
	return "--position-interval " + cfg.PositionInterval.String()
}

// positionIntervalJudged is the interval the checker holds the retelling
// after a leader kill to: only when the nodes were given it (nodes that
// know the flag tell places).
func positionIntervalJudged(flag string, d time.Duration) time.Duration {
	if flag == "" {
		return 0
	}
	return d
}

// knowsFlag reports whether `bin cmd -h` lists the flag.
func knowsFlag(ctx context.Context, bin, cmd, flag string) bool {
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(hctx, bin, cmd, "-h").CombinedOutput()
	return strings.Contains(string(out), "-"+flag+" ")
}

// NoGrant is a recovery time that never came: no grant followed.
const NoGrant time.Duration = -1

// expectedStop says why a cluster of voters voters whose servers lost
// (wiped at one time, never replaced) is expected to stop serving, or ""
// if it is not: once a majority of the voters has lost its state nothing
// can be committed again, and no command may make it (docs/operations.md, Runbook).
func expectedStop(lost []string, voters int) string {
	if voters <= 0 || len(lost) < voters/2+1 {
		return ""
	}
	return fmt.Sprintf("%d of %d voters lost their state at once (%s): a majority is gone for good, so the cluster is expected to stop serving",
		len(lost), voters, strings.Join(lost, ", "))
}

// settle waits until the serving leader holds nothing and queues nothing
// and every node has applied the same last token, and returns the
// leader's status. With strangers set (a run that wiped nodes), nodes that
// never received any state are skipped: a wiped node comes back as a new
// server that no configuration names (cluster/bootstrap.go), not a member
// that diverged.
func settle(ctx context.Context, p *localproc.Procs, strangers bool) (wire.Msg, error) {
	var last wire.Msg
	var lastErr error
	for {
		li, err := p.Leader(ctx)
		if err == nil {
			st, err := p.Status(ctx, li)
			if err == nil {
				last = st
				same := st.Held == 0 && st.Waiting == 0
				for i := 0; i < p.Size() && same; i++ {
					o, err := p.Status(ctx, i)
					if strangers && err == nil && o.Commit == 0 && o.LastToken == 0 {
						continue
					}
					same = err == nil && o.LastToken == st.LastToken && o.Applied >= st.Commit-2
				}
				if same {
					return st, nil
				}
			}
			lastErr = err
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("cluster did not settle after the workload stopped (held %d, waiting %d, last token %d; %v): a lock outlived its lease or the nodes diverged",
				last.Held, last.Waiting, last.LastToken, lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Summary is the one-screen report of a run.
func (r *Result) Summary() string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "ticketlab verify: seed %d, %d nodes, %d sidecars, %d workers + %d worker processes, %d keys, block share %v, nemesis %v (run %v)\n",
		c.Seed, c.Nodes, c.Sidecars, c.Workers, c.ProcWorkers, c.Keys, max(c.BlockShare, 0), c.Duration, r.Elapsed.Round(time.Second))
	if len(c.NodeArgs) > 0 || r.PositionFlag != "" {
		fmt.Fprintf(&b, "node flags: %s\n", strings.TrimSpace(strings.Join(c.NodeArgs, " ")+" "+r.PositionFlag))
	}
	total := 0
	var kinds []string
	for k, n := range r.Ops {
		total += n
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	fmt.Fprintf(&b, "operations: %d\n", total)
	for _, kind := range []string{KindAcquire, KindWrite, KindRelease, KindHeld} {
		var parts []string
		for _, k := range kinds {
			if strings.HasPrefix(k, kind+" ") {
				parts = append(parts, fmt.Sprintf("%s %d", strings.TrimPrefix(k, kind+" "), r.Ops[k]))
			}
		}
		if len(parts) > 0 || kind != KindHeld {
			fmt.Fprintf(&b, "  %-8s %s\n", kind, strings.Join(parts, ", "))
		}
	}
	var bparts []string
	for _, res := range []string{ResOK, ResBusy, ResTimeout, ResIndeterminate, ResError} {
		if n := r.BlockOps[res]; n > 0 {
			part := fmt.Sprintf("%s %d", res, n)
			if res == ResOK {
				var sizes []string
				for k := 2; k <= MaxBlockKeys; k++ {
					sizes = append(sizes, fmt.Sprintf("%d keys %d", k, r.Check.BlockGrants[k]))
				}
				part += " (" + strings.Join(sizes, ", ") + ")"
			}
			bparts = append(bparts, part)
		}
	}
	if len(bparts) == 0 {
		bparts = []string{"none"}
	}
	fmt.Fprintf(&b, "  %-8s %s (of the acquires above)\n", "blocks", strings.Join(bparts, ", "))
	fc := map[string]int{}
	var fk []string
	for _, f := range r.Faults {
		if fc[f.Fault] == 0 {
			fk = append(fk, f.Fault)
		}
		fc[f.Fault]++
	}
	sort.Strings(fk)
	var fparts []string
	for _, k := range fk {
		fparts = append(fparts, fmt.Sprintf("%s %d", k, fc[k]))
	}
	fmt.Fprintf(&b, "faults: %d (%s)\n", len(r.Faults), strings.Join(fparts, ", "))
	if fc[FaultPauseWorker] > 0 {
		fmt.Fprintf(&b, "  pause-worker: %d of %d caught a block holder (its fenced write of every key on waking: %d accepted, %d refused, %d none)\n",
			r.PausedBlocks, fc[FaultPauseWorker], r.PausedBlockAccepted, r.PausedBlockRefused, r.PausedBlocks-r.PausedBlockAccepted-r.PausedBlockRefused)
	}
	var recs []time.Duration
	none := 0
	for _, d := range r.FaultRecoveries {
		if d == NoGrant {
			none++
			continue
		}
		recs = append(recs, d)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i] < recs[j] })
	final := "no grant after the final heal"
	if r.Recovery != NoGrant {
		final = fmt.Sprintf("after the final heal %v", r.Recovery.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "recovery: %s (bound %v)", final, c.RecoveryBound)
	if len(recs) > 0 {
		fmt.Fprintf(&b, "; after each fault median %v, max %v", recs[len(recs)/2].Round(time.Millisecond), recs[len(recs)-1].Round(time.Millisecond))
	}
	if none > 0 {
		fmt.Fprintf(&b, "; %d faults with no grant after them", none)
	}
	fmt.Fprintln(&b)
	if r.ExpectedStop != "" {
		fmt.Fprintf(&b, "expected stop: %s (liveness and final state not checked; safety is)\n", r.ExpectedStop)
	} else if len(r.Lost) > 0 {
		fmt.Fprintf(&b, "lost servers never replaced: %s\n", strings.Join(r.Lost, ", "))
	}
	ck := r.Check
	fmt.Fprintf(&b, "fencing: %d stale writes rejected; %d writes past the lease (%d accepted: no newer holder had written); %d block writes (%d refused on all their keys)\n",
		ck.StaleWrites, ck.LateWrites, ck.LateAccepted, ck.BlockWrites, ck.BlockStale)
	fmt.Fprintf(&b, "tokens: %d grants, %d indeterminate acquires, %d tokens issued that no worker learned\n",
		ck.Grants, ck.Indeterminate, ck.UnknownTokens)
	fmt.Fprintf(&b, "indeterminate share: %.1f %% (%d of %d acquires; bound %s)\n",
		100*ck.IndeterminateShare, ck.Indeterminate, ck.Acquires, shareBound(c.MaxIndeterminateShare))
	per10 := func(n int) string {
		if c.Duration <= 0 {
			return "?"
		}
		return fmt.Sprintf("%.0f", float64(n)*float64(10*time.Minute)/float64(c.Duration))
	}
	ia, io := ck.IndeterminateAcquires, ck.IndeterminateOthers
	fmt.Fprintf(&b, "indeterminate outcomes: %d acquires (%s per 10 min of faults), %d releases and extends (%s per 10 min)\n",
		ia.Total(), per10(ia.Total()), io.Total(), per10(io.Total()))
	fmt.Fprintf(&b, "  where: acquires %d outside a window without a serving leader (%s per 10 min), %d inside one, %d sent to a killed sidecar, %d cut short by the workload's end; releases and extends %d outside, %d inside, %d to a killed sidecar, %d cut short (%d windows, %v in all: from each leader fault's start to the first grant its sidecar's workers read of an acquire sent after it)\n",
		ia.Outside, per10(ia.Outside), ia.NoLeader, ia.DeadSidecar, ia.Stopped, io.Outside, io.NoLeader, io.DeadSidecar, io.Stopped, ck.NoLeaderWindows, ck.NoLeaderTime.Round(time.Millisecond))
	fmt.Fprintf(&b, "atomicity: %d HELD observations of blocks checked (%d right after a grant listed none, its lease possibly run out)\n", ck.HeldChecks, ck.HeldLapsed)
	fmt.Fprintf(&b, "fifo: %d acquires confirmed queued (`! QUEUED`), %d of them granted (%d kept their place through a leader fault); %d grants checked against the waiters queued before them\n",
		ck.Queued, ck.QueuedGranted, ck.QueuedThroughLeaderChange, ck.FIFOChecked)
	if ck.Extends+ck.ExtendsIndeterminate+ck.ExtendsRefused+ck.ExtendsFailed+ck.Stalls > 0 || len(ck.LostEvents) > 0 {
		lag := "none checked"
		if ck.LostChecked > 0 {
			lag = fmt.Sprintf("largest lag %v", ck.LostMaxLag.Round(10*time.Microsecond))
		}
		fmt.Fprintf(&b, "extend: %d ok, %d indeterminate, %d refused (the lock was gone), %d failed; stalls past the lease %d (told by `! LOST` %d, by a refused EXTEND %d, still held %d)\n",
			ck.Extends, ck.ExtendsIndeterminate, ck.ExtendsRefused, ck.ExtendsFailed, ck.Stalls, ck.StallsTold, ck.StallsRefused, ck.StallsStillHeld)
		fmt.Fprintf(&b, "lost signal: events expired %d, moved %d, compensated %d, revoked %d; before the next holder's grant: %d checked, %s (tolerance %v), %d exempt (a process on the path was stopped)\n",
			ck.LostEvents["expired"], ck.LostEvents["moved"], ck.LostEvents["compensated"], ck.LostEvents["revoked"], ck.LostChecked, lag, LostDeliveryTolerance, ck.LostExempt)
	}
	b.WriteString(permitSummary(r.PermitKeys, r.PermitPlan, ck.Permits))
	b.WriteString(positionSummary(ck.Positions))
	if ck.SidecarKills > 0 {
		fmt.Fprintf(&b, "killed sidecars: %d kills; %d operations in flight at a kill (answered by nobody: INDETERMINATE); %d holdings delivered before a kill checked to keep their leases\n",
			ck.SidecarKills, ck.KilledInFlight, ck.KilledHoldings)
	}
	comps := "components"
	if ck.PorcupineParts == 1 {
		comps = "component"
	}
	fmt.Fprintf(&b, "linearizability: %s (%d %s: %s; %v)\n", ck.Linearizable, ck.PorcupineParts, comps, strings.Join(ck.Components, "; "), ck.LinearizeTime.Round(time.Millisecond))
	fmt.Fprintf(&b, "  busy/timeout: %d: %d need one of their keys held, %d a key held among those waiting blocks connect them to, %d accepted (one of %d indeterminate acquires that may have been granted may have held the key)\n",
		ck.Refusals, ck.Refusals-ck.RefusalsReach-ck.RefusalsUnknown, ck.RefusalsReach, ck.RefusalsUnknown, ck.MaybeGranted)
	if ck.Visualization != "" {
		fmt.Fprintf(&b, "  visualization: %s\n", ck.Visualization)
	}
	byCheck := map[string]int{}
	var checks []string
	for _, v := range r.Violations {
		if byCheck[v.Check] == 0 {
			checks = append(checks, v.Check)
		}
		byCheck[v.Check]++
	}
	var vparts []string
	for _, ch := range checks {
		vparts = append(vparts, fmt.Sprintf("%s %d", ch, byCheck[ch]))
	}
	fmt.Fprintf(&b, "violations: %d", len(r.Violations))
	if len(vparts) > 0 {
		fmt.Fprintf(&b, " (%s; all in %s)", strings.Join(vparts, ", "), filepath.Join(c.Dir, "violations.txt"))
	}
	fmt.Fprintln(&b)
	for i, v := range r.Violations {
		if i == 8 {
			fmt.Fprintf(&b, "  ...\n")
			break
		}
		fmt.Fprintf(&b, "  %s: %s\n", v.Check, v.Detail)
	}
	if len(r.Inconclusive) > 0 {
		fmt.Fprintf(&b, "inconclusive: %d\n", len(r.Inconclusive))
		for _, why := range r.Inconclusive {
			fmt.Fprintf(&b, "  %s\n", why)
		}
	}
	verdict := "pass"
	switch {
	case len(r.Violations) > 0:
		verdict = "FAIL (violations)"
	case len(r.Inconclusive) > 0:
		verdict = "FAIL (inconclusive: nothing violated, but the history proves too little)"
	}
	fmt.Fprintf(&b, "verdict: %s\n", verdict)
	fmt.Fprintf(&b, "history: %s\n", r.History)
	wipe := ""
	if c.Wipe {
		wipe = " --wipe"
	}
	if c.ReplaceAll {
		wipe += " --replace-all"
	}
	if len(c.NodeArgs) > 0 {
		wipe += fmt.Sprintf(" --node-args %q", strings.Join(c.NodeArgs, " "))
	}
	if c.Extenders != DefaultExtenders || c.ProcExtenders != 1 {
		wipe += fmt.Sprintf(" --extenders %d --extender-procs %d", max(c.Extenders, 0), max(c.ProcExtenders, 0))
	}
	if c.BlockShare != DefaultBlockShare {
		wipe += fmt.Sprintf(" --block-share %v", max(c.BlockShare, 0))
	}
	if c.LineKeys != DefaultLineKeys || c.LineWaiters != DefaultLineWaiters {
		wipe += fmt.Sprintf(" --line-keys %d --line-waiters %d", c.LineKeys, c.LineWaiters)
	}
	if c.MaxIndeterminateShare != DefaultMaxIndeterminateShare {
		wipe += fmt.Sprintf(" --max-indeterminate-share %v", max(c.MaxIndeterminateShare, 0))
	}
	// The permit workload's shape, when not the default (issue 41): the
	// seeds of its workers and the n change depend on it.
	if c.PermitsN < 0 {
		wipe += " --permits-n -1"
	} else if c.PermitsN > 0 && (c.PermitsN != DefaultPermitsN || c.PermitKeys != DefaultPermitKeys || c.PermitWorkers != DefaultPermitWorkers) {
		wipe += fmt.Sprintf(" --permits-n %d --permit-keys %d --permit-workers %d", c.PermitsN, c.PermitKeys, c.PermitWorkers)
	}
	if c.PositionInterval != DefaultPositionInterval {
		wipe += fmt.Sprintf(" --position-interval %v", max(c.PositionInterval, 0))
	}
	fmt.Fprintf(&b, "replay: ticketlab verify --seed %d --nodes %d --duration %v --workers %d%s\n", c.Seed, c.Nodes, c.Duration, c.Workers, wipe)
	return b.String()
}

// shareBound describes the bound on the indeterminate share that max
// (Config.MaxIndeterminateShare) sets.
func shareBound(max float64) string {
	switch {
	case max < 0:
		return "none"
	case max == 0:
		max = DefaultMaxIndeterminateShare
	}
	return fmt.Sprintf("%.1f %%", 100*max)
}

// IndeterminateWindow is how long after its completion the checker lets an
// INDETERMINATE operation (or a session's close) take effect. Every fault
// of the nemesis lasts at most about 6 s and they never overlap, so a
// request still somewhere in the system — a paused node's socket buffer, a
// log entry a new leader commits in its barrier, a release the sidecar
// retries for up to 5 s — lands well within 30 s. Without a bound, every
// such operation stays open to the end of the history and porcupine's
// search grows too large for a 15-minute run.
const IndeterminateWindow = 30 * time.Second

// grantsIn counts the granted acquires of ops (as CheckReport.Grants does).
func grantsIn(ops []Op) int {
	n := 0
	for _, op := range ops {
		if op.Kind == KindAcquire && op.Result == ResOK {
			n++
		}
	}
	return n
}
