package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"ticketing/cluster/verify"
)

// runVerify runs the Jepsen-style verification harness (cluster/verify)
// against real node and sidecar processes started from this binary.
func runVerify(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "worker" {
		return runVerifyWorker(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("ticketing verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg  verify.Config
		out  string
		logs logFlags
	)
	fs.DurationVar(&cfg.Duration, "duration", 30*time.Second, "how long the nemesis injects faults")
	fs.IntVar(&cfg.Nodes, "nodes", 3, "cluster size: 3 or 5")
	fs.Int64Var(&cfg.Seed, "seed", 0, "seed of the fault schedule and the workload (0: from the clock; printed for replay)")
	fs.IntVar(&cfg.Workers, "workers", 16, "in-harness workers, each with its own sidecar session")
	fs.IntVar(&cfg.ProcWorkers, "worker-procs", 3, "worker processes (the pause-a-lock-holder fault needs them)")
	fs.IntVar(&cfg.Sidecars, "sidecars", 2, "sidecar processes")
	fs.IntVar(&cfg.Keys, "keys", 4, "contended keys")
	fs.StringVar(&out, "out", "", "output directory: history, summary, logs, data dirs (default: a new temporary directory)")
	fs.BoolVar(&cfg.Wipe, "wipe", false, "also wipe nodes' data dirs and restart them at their old addresses (they come back as new servers that cannot vote under the old ids; a wiped majority stops the cluster)")
	fs.BoolVar(&cfg.ReplaceAll, "replace-all", false, "instead of random faults, replace every node in turn (disk lost, new server swapped in through the admin port)")
	fs.DurationVar(&cfg.RecoveryBound, "recovery-bound", 5*time.Second, "grants must resume within this after the final heal")
	logs.register(fs, "info")
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "ticketing verify: unexpected arguments %q\n", fs.Args())
		return ExitUsage
	}
	log, err := logs.logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing verify:", err)
		return ExitUsage
	}
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano() % 1_000_000
	}
	if out == "" {
		if out, err = os.MkdirTemp("", "ticketing-verify-"); err != nil {
			fmt.Fprintln(stderr, "ticketing verify:", err)
			return ExitError
		}
	}
	if cfg.Binary, err = os.Executable(); err != nil {
		fmt.Fprintln(stderr, "ticketing verify: cannot find my own binary:", err)
		return ExitError
	}
	cfg.Dir, _ = filepath.Abs(out)
	cfg.Logger = log
	fmt.Fprintf(stdout, "ticketing verify: seed %d, output in %s\n", cfg.Seed, cfg.Dir)
	res, err := verify.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing verify:", err)
		return ExitError
	}
	fmt.Fprint(stdout, res.Summary())
	if len(res.Violations) > 0 {
		return ExitError
	}
	return ExitOK
}

// runVerifyWorker is a worker process of the harness (hidden subcommand).
func runVerifyWorker(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ticketing verify worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
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
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	p.Proc = true
	p.Keys = strings.Split(keys, ",")
	p.HoldMin, p.HoldMax = holdRange[0], holdRange[1]
	if p.Socket == "" || store == "" || keys == "" || p.HoldMax < p.HoldMin {
		fmt.Fprintln(stderr, "ticketing verify worker: --socket, --store and --keys are required")
		return ExitUsage
	}
	if err := verify.RunWorkerProcess(ctx, p, store, stdout); err != nil {
		fmt.Fprintln(stderr, "ticketing verify worker:", err)
		return ExitError
	}
	return ExitOK
}
