package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"ticketing/cmd/ticketlab/internal/labcli"
	"ticketing/cmd/ticketlab/internal/verify"
)

// runVerify runs the Jepsen-style verification harness (internal/verify):
// nodes and sidecars are this binary's fault-injecting `ticketlab node`
// and `ticketlab sidecar`, the cluster is bootstrapped with the ticketing
// binary under test (--binary).
func runVerify(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "worker" {
		return runVerifyWorker(ctx, args[1:], stdout, stderr)
	}
	fs := labcli.NewFlagSet("ticketlab verify")
	var (
		cfg    verify.Config
		out    string
		level  string
		format string
	)
	binary := labcli.BinaryFlag(fs)
	fs.DurationVar(&cfg.Duration, "duration", 30*time.Second, "how long the nemesis injects faults")
	fs.IntVar(&cfg.Nodes, "nodes", 3, "cluster size: 3 or 5")
	fs.Int64Var(&cfg.Seed, "seed", 0, "seed of the fault schedule and the workload (0: from the clock; printed for replay)")
	fs.IntVar(&cfg.Workers, "workers", 16, "in-harness workers, each with its own sidecar session")
	fs.IntVar(&cfg.ProcWorkers, "worker-procs", 3, "worker processes (the pause-a-lock-holder fault needs them)")
	fs.IntVar(&cfg.Extenders, "extenders", verify.DefaultExtenders, "how many of the in-harness workers extend their leases (and sometimes stall past them); 0: none")
	fs.IntVar(&cfg.ProcExtenders, "extender-procs", 1, "how many of the worker processes extend their leases (the nemesis stops them too); 0: none")
	fs.IntVar(&cfg.Sidecars, "sidecars", 2, "sidecar processes")
	fs.IntVar(&cfg.Keys, "keys", 4, "contended keys")
	fs.Float64Var(&cfg.BlockShare, "block-share", verify.DefaultBlockShare, "share of acquires that are blocks of 2-4 keys under one token (0: none)")
	fs.IntVar(&cfg.PermitsN, "permits-n", verify.DefaultPermitsN, "semaphores: the n each permit key is defined with (raised by 2 a third into the nemesis, lowered to n-1 at two thirds); -1: no permit workload")
	fs.IntVar(&cfg.PermitKeys, "permit-keys", verify.DefaultPermitKeys, "semaphores: how many keys sem/0.. the permit workers take permits of")
	fs.IntVar(&cfg.PermitWorkers, "permit-workers", verify.DefaultPermitWorkers, "semaphores: in-harness workers that take permits (PERMIT, fenced write of \"key slot\", RELEASE)")
	fs.IntVar(&cfg.LineKeys, "line-keys", verify.DefaultLineKeys, "kill-leader-queues: fresh keys that get a long queue before the leader is killed")
	fs.IntVar(&cfg.LineWaiters, "line-waiters", verify.DefaultLineWaiters, "kill-leader-queues: waiters queued on each of those keys, one at a time")
	fs.DurationVar(&cfg.PositionInterval, "position-interval", verify.DefaultPositionInterval, "the nodes' --position-interval: how often the leader tells waiters their places in line (issue 41; 0: not passed, the nodes' default 1s; not passed to a build that lacks the flag)")
	fs.StringVar(&out, "out", "", "output directory: history, summary, logs, data dirs (default: a new temporary directory)")
	fs.BoolVar(&cfg.Wipe, "wipe", false, "also wipe nodes' data dirs and restart them at their old addresses (they come back as new servers that cannot vote under the old ids; a wiped majority stops the cluster)")
	var partitionSidecar, stopSidecar, handOverCut, hostile, revoke bool
	fs.BoolVar(&partitionSidecar, "partition-sidecar", false, "also cut a sidecar off together with the leader right after a grant through it, sometimes past its session timeout (issue 39, finding 1)")
	fs.BoolVar(&stopSidecar, "stop-sidecar", false, "also SIGTERM a sidecar while a hot key has a holder and queued waiters through it, then restart it; the key must come free (issue 39, finding 6)")
	fs.BoolVar(&handOverCut, "handover-cut", false, "also have the leader hand over (5 nodes: admin remove of itself; 3: SIGTERM) with its target cut off, under waiters with short waits (issue 39, finding 11)")
	fs.BoolVar(&hostile, "hostile", false, "also pause a lock holder and flood the cluster client port with EXTENDs and RELEASEs of its and others' tokens under guessed owners (issue 39, findings 7 and 8)")
	fs.BoolVar(&revoke, "revoke", false, "also revoke a worker's lock through the admin port by its token (issue 42): its holding ends then, the next waiter takes the key, the worker reads `! LOST revoked`")
	fs.BoolVar(&cfg.OnlyFaults, "only-new-faults", false, "the schedule chooses only among the faults enabled by --partition-sidecar, --stop-sidecar, --handover-cut, --hostile and --revoke")
	fs.StringVar(&cfg.NodeLab, "node-lab", "", "run the nodes with this ticketlab executable instead of this one (an older build's lab runs its own node code: how the new faults are shown to find old bugs)")
	fs.BoolVar(&cfg.ReplaceAll, "replace-all", false, "instead of random faults, replace every node in turn (disk lost, new server swapped in through the admin port)")
	fs.Func("node-args", "extra flags for every node and the bootstrap, space separated (e.g. \"--log-store bolt\")", func(v string) error {
		cfg.NodeArgs = strings.Fields(v)
		return nil
	})
	fs.Float64Var(&cfg.MaxIndeterminateShare, "max-indeterminate-share", verify.DefaultMaxIndeterminateShare,
		"largest share of acquires (0..1) that may end INDETERMINATE; above it the run is inconclusive, a failure (0: no bound)")
	fs.DurationVar(&cfg.RecoveryBound, "recovery-bound", 5*time.Second, "grants must resume within this after the final heal")
	fs.StringVar(&level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&format, "log-format", "text", "log format: text or json")
	if code, ok := labcli.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return labcli.Usage(fs, stderr, "--log-level: "+err.Error())
	}
	var log *slog.Logger
	switch format {
	case "text":
		log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	case "json":
		log = slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lv}))
	default:
		return labcli.Usage(fs, stderr, fmt.Sprintf("--log-format %q: want text or json", format))
	}
	var err error
	if cfg.Binary, err = labcli.Binary(*binary); err != nil {
		return labcli.Usage(fs, stderr, err.Error())
	}
	for _, f := range []struct {
		on   bool
		kind string
	}{{partitionSidecar, verify.FaultPartitionSidecar}, {stopSidecar, verify.FaultStopSidecar}, {handOverCut, verify.FaultHandOverCut}, {hostile, verify.FaultHostile}, {revoke, verify.FaultRevoke}} {
		if f.on {
			cfg.Faults = append(cfg.Faults, f.kind)
		}
	}
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano() % 1_000_000
	}
	if cfg.BlockShare <= 0 {
		cfg.BlockShare = -1 // no blocks (Config's zero means the default)
	}
	if cfg.Extenders <= 0 {
		cfg.Extenders = -1 // none (likewise)
	}
	if cfg.ProcExtenders <= 0 {
		cfg.ProcExtenders = -1
	}
	if cfg.MaxIndeterminateShare <= 0 {
		cfg.MaxIndeterminateShare = -1 // no bound (likewise)
	}
	if cfg.PositionInterval <= 0 {
		cfg.PositionInterval = -1 // not passed (likewise)
	}
	if out == "" {
		if out, err = os.MkdirTemp("", "ticketlab-verify-"); err != nil {
			fmt.Fprintln(stderr, "ticketlab verify:", err)
			return labcli.ExitError
		}
	}
	if cfg.Lab, err = os.Executable(); err != nil {
		fmt.Fprintln(stderr, "ticketlab verify: cannot find my own binary:", err)
		return labcli.ExitError
	}
	cfg.Dir, _ = filepath.Abs(out)
	cfg.Logger = log
	fmt.Fprintf(stdout, "ticketlab verify: seed %d, ticketing binary %s, output in %s\n", cfg.Seed, cfg.Binary, cfg.Dir)
	res, err := verify.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "ticketlab verify:", err)
		return labcli.ExitError
	}
	fmt.Fprint(stdout, res.Summary())
	if !res.Passed() {
		// A violation, or an inconclusive history (porcupine's Unknown, too
		// many indeterminate acquires): either way nothing was proven.
		return labcli.ExitError
	}
	return labcli.ExitOK
}

// runVerifyWorker is a worker process of the harness (`ticketlab verify
// worker`, started by the harness).
func runVerifyWorker(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := labcli.NewFlagSet("ticketlab verify worker")
	var (
		p         verify.WorkerParams
		store     string
		keys      string
		holdRange [2]time.Duration
	)
	fs.IntVar(&p.ID, "id", 0, "worker number")
	fs.Int64Var(&p.Seed, "seed", 0, "seed of the worker's choices")
	fs.StringVar(&p.Socket, "socket", "", "sidecar socket")
	fs.StringVar(&store, "store", "", "the protected resource's socket")
	fs.StringVar(&keys, "keys", "", "comma-separated keys")
	fs.DurationVar(&holdRange[0], "hold-min", 0, "shortest hold before the fenced write")
	fs.DurationVar(&holdRange[1], "hold-max", time.Second, "longest hold before the fenced write")
	fs.Float64Var(&p.LateProb, "late", 0.1, "chance of sleeping past the lease before writing")
	fs.Float64Var(&p.BlockShare, "block-share", 0, "share of acquires that are blocks of 2-4 keys")
	fs.BoolVar(&p.Extend, "extend", false, "an extender: hold across several leases with EXTEND (issue 19)")
	fs.Float64Var(&p.StallProb, "stall", 0, "an extender's chance of stalling past its lease instead of extending")
	if code, ok := labcli.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	p.Proc = true
	p.Keys = strings.Split(keys, ",")
	p.HoldMin, p.HoldMax = holdRange[0], holdRange[1]
	if p.Socket == "" || store == "" || keys == "" || p.HoldMax < p.HoldMin {
		return labcli.Usage(fs, stderr, "--socket, --store and --keys are required, and --hold-max at least --hold-min")
	}
	if err := verify.RunWorkerProcess(ctx, p, store, stdout); err != nil {
		fmt.Fprintln(stderr, "ticketlab verify worker:", err)
		return labcli.ExitError
	}
	return labcli.ExitOK
}
