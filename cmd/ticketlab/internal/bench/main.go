// Package bench holds the lab's measurements (`ticketlab bench MODE`):
// failover and planned hand-over times, throughput, the unix-socket path,
// sidecar memory per connection, a learner's catch-up, the cost of a large
// lock table, the disk's floor under every commit, and seat blocks
// (atomic multi-key acquires) against single-key acquires, EXTEND and
// the lost signal (issue 19), and what a leader or sidecar crash does to a
// hot key's waiting room (issue 31). The process
// benchmarks drive the ticketing binary they are given (--binary).
package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"ticketing/cluster/localproc"
	"ticketing/cmd/ticketlab/internal/floor"
	"ticketing/cmd/ticketlab/internal/labcli"
)

// env is what a benchmark's body gets: its output and working directory,
// and the flags every process benchmark shares.
type env struct {
	stdout io.Writer
	dir    string
	cl     *clusterFlags // nil for the modes that start no node processes
}

// clusterFlags are the flags of the modes that start node processes.
type clusterFlags struct {
	binary   *string
	nodes    int
	tls      bool
	nodeArgs string
}

func (c *clusterFlags) register(fs *flag.FlagSet, nodeArgs bool) {
	c.binary = labcli.BinaryFlag(fs)
	fs.BoolVar(&c.tls, "tls", true, "run nodes (and sidecars) over TLS with a throwaway CA, as in production")
	if nodeArgs {
		fs.IntVar(&c.nodes, "nodes", 3, "cluster size: 3 or 5")
		fs.StringVar(&c.nodeArgs, "node-args", "", "extra flags for every node, space separated (e.g. \"--heartbeat-timeout 800ms\")")
	}
}

// mode is one benchmark: setup registers its flags and returns its body.
type mode struct {
	name, summary string
	setup         func(fs *flag.FlagSet, e *env) func(ctx context.Context) error
}

func modes() []mode {
	return []mode{
		{"failover", "stop the leader (SIGKILL or SIGTERM) again and again; time until another node grants", setupFailover},
		{"handover", "planned hand-overs of the leader under unix-socket load; what the clients see", setupHandover},
		{"throughput", "uncontended acquire+release cycles on node processes; latency and CPU per cycle", setupThroughput},
		{"unix", "acquire+release through the in-process Broker and through the unix socket", setupUnix},
		{"unixconns", "a sidecar process's memory with many local connections open", setupUnixConns},
		{"catchup", "a learner catching up with a cluster holding many keys (in process)", setupCatchup},
		{"scale", "memory per held key and per queued waiter, and throughput with many keys held", setupScale},
		{"disk", "one durable Raft log append on this disk: the floor under every commit", setupDisk},
		{"isolation", "a well-behaved unix client before, during and after four hostile local clients (issue 20)", setupIsolation},
		{"waitroom", "a waiting room of 50,000 on one hot key through one sidecar: hand-offs, memory, FIFO (issue 20)", setupWaitRoom},
		{"extend", "the cost of an EXTEND beside RELEASE+ACQUIRE, and the latency from an expiry's commit to `! LOST` at the client (issue 19)", setupExtend},
		{"linekill", "a leader SIGKILL under a hot key's draining line of waiters through 2 sidecars, the requests in flight at it, and a SIGKILL of the sidecar whose waiter heads the line (issue 31)", setupLineKill},
		{"blocks", "seat blocks under Zipf contention: one atomic 4-key acquire against 4 single-key acquires in order, and one seat (issue 18)", setupBlocks},
	}
}

// Main runs `ticketlab bench ARGS...` and returns its exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var subs []labcli.Subcommand
	for _, m := range modes() {
		subs = append(subs, labcli.Subcommand{Name: m.name, Summary: m.summary,
			Run: func(ctx context.Context, args []string, stdout, stderr io.Writer) int {
				return run(ctx, m, args, stdout, stderr)
			}})
	}
	return labcli.Dispatch(ctx, "ticketlab bench", "benchmark", subs, args, stdout, stderr)
}

func run(ctx context.Context, m mode, args []string, stdout, stderr io.Writer) int {
	fs := labcli.NewFlagSet("ticketlab bench " + m.name)
	e := &env{stdout: stdout}
	fs.StringVar(&e.dir, "dir", "", "working directory (default: a temporary one, removed afterwards)")
	body := m.setup(fs, e)
	if code, ok := labcli.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	fail := func(code int, err error) int {
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return code
	}
	if e.cl != nil {
		bin, err := labcli.Binary(*e.cl.binary)
		if err != nil {
			return labcli.Usage(fs, stderr, err.Error())
		}
		*e.cl.binary = bin
		if e.cl.nodes != 0 && e.cl.nodes != 3 && e.cl.nodes != 5 {
			return labcli.Usage(fs, stderr, fmt.Sprintf("--nodes %d: want 3 or 5", e.cl.nodes))
		}
	}
	if e.dir == "" {
		dir, err := os.MkdirTemp("", "ticketlab-bench-")
		if err != nil {
			return fail(labcli.ExitError, err)
		}
		defer os.RemoveAll(dir)
		e.dir = dir
	}
	if err := body(ctx); err != nil {
		if ue, ok := err.(usageError); ok {
			return labcli.Usage(fs, stderr, string(ue))
		}
		return fail(labcli.ExitError, err)
	}
	return labcli.ExitOK
}

// usageError is a flag value a body refuses (exit 2).
type usageError string

func (e usageError) Error() string { return string(e) }

// startProcs starts the mode's node processes and waits for a leader.
func (e *env) startProcs(ctx context.Context, extra ...string) (*localproc.Procs, error) {
	p, err := localproc.Start(localproc.Options{Binary: *e.cl.binary, Dir: filepath.Join(e.dir, "cluster"), Nodes: e.cl.nodes,
		TLS: e.cl.tls, ExtraArgs: append(extra, strings.Fields(e.cl.nodeArgs)...)})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := p.Leader(wctx); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// quiet are the node flags of the benchmarks that read no node log.
var quiet = []string{"--log-level", "warn"}

func setupFailover(fs *flag.FlagSet, e *env) func(context.Context) error {
	e.cl = &clusterFlags{}
	e.cl.register(fs, true)
	kills := fs.Int("kills", 7, "number of times the leader is stopped")
	sigName := fs.String("signal", "kill", "kill (SIGKILL: a crash, the others elect after the election timeout) or term (SIGTERM: the leader hands leadership over first)")
	return func(ctx context.Context) error {
		sig := syscall.SIGKILL
		switch *sigName {
		case "kill":
		case "term":
			sig = syscall.SIGTERM
		default:
			return usageError(fmt.Sprintf("--signal %q: want kill or term", *sigName))
		}
		p, err := e.startProcs(ctx, quiet...)
		if err != nil {
			return err
		}
		defer p.Close()
		return benchFailover(ctx, p, *kills, sig, e.stdout)
	}
}

func setupHandover(fs *flag.FlagSet, e *env) func(context.Context) error {
	e.cl = &clusterFlags{}
	e.cl.register(fs, false)
	o := HandOverOptions{}
	fs.IntVar(&o.Clients, "clients", 16, "unix-socket clients through the sidecar")
	fs.IntVar(&o.HandOvers, "handovers", 10, "number of planned hand-overs of the leader")
	fs.StringVar(&o.Mode, "mode", "term", "term (SIGTERM to the leader), kill (SIGKILL to the leader: a crash; the longest pause is the failover the clients see), replace (members replace of the leader by a spare) or remove (members remove of the leader, after promoting a spare)")
	fs.BoolVar(&o.Contended, "contended", false, "every client on one key (its waiters queue at the leader); default one key each")
	return func(ctx context.Context) error {
		switch o.Mode {
		case "term", "kill", "replace", "remove":
		default:
			return usageError(fmt.Sprintf("--mode %q: want term, kill, replace or remove", o.Mode))
		}
		o.Binary, o.Dir, o.TLS, o.Out = *e.cl.binary, e.dir, e.cl.tls, e.stdout
		rounds, err := RunHandOvers(ctx, o)
		if len(rounds) > 0 {
			fmt.Fprintln(e.stdout, handOverSummary(o, rounds))
		}
		return err
	}
}

// loadFlags are the flags of the modes that measure for a while.
func loadFlags(fs *flag.FlagSet) (warmup, duration *time.Duration) {
	duration = fs.Duration("duration", 10*time.Second, "measured duration")
	warmup = fs.Duration("warmup", 2*time.Second, "warm-up before measuring")
	return warmup, duration
}

func setupThroughput(fs *flag.FlagSet, e *env) func(context.Context) error {
	e.cl = &clusterFlags{}
	e.cl.register(fs, true)
	clients := fs.Int("clients", 64, "concurrent clients, one connection and one key each")
	warmup, duration := loadFlags(fs)
	return func(ctx context.Context) error {
		p, err := e.startProcs(ctx, quiet...)
		if err != nil {
			return err
		}
		defer p.Close()
		_, err = benchThroughput(ctx, p, *clients, *warmup, *duration, e.stdout)
		return err
	}
}

func setupUnix(fs *flag.FlagSet, e *env) func(context.Context) error {
	e.cl = &clusterFlags{}
	e.cl.register(fs, true)
	unixN := fs.String("unix-clients", "1,64", "client counts to measure, comma separated")
	warmup, duration := loadFlags(fs)
	return func(ctx context.Context) error {
		var counts []int
		for _, f := range strings.Split(*unixN, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return usageError(fmt.Sprintf("--unix-clients %q: want counts of at least 1, comma separated", *unixN))
			}
			counts = append(counts, n)
		}
		p, err := e.startProcs(ctx, quiet...)
		if err != nil {
			return err
		}
		defer p.Close()
		return benchUnix(ctx, p, e.dir, counts, *warmup, *duration, e.stdout)
	}
}

func setupUnixConns(fs *flag.FlagSet, e *env) func(context.Context) error {
	e.cl = &clusterFlags{}
	e.cl.register(fs, true)
	conns := fs.Int("conns", 10000, "local connections to open to a sidecar process")
	return func(ctx context.Context) error {
		p, err := e.startProcs(ctx, quiet...)
		if err != nil {
			return err
		}
		defer p.Close()
		return benchUnixConns(ctx, p, e.dir, *e.cl.binary, *conns, e.stdout)
	}
}

func setupCatchup(fs *flag.FlagSet, e *env) func(context.Context) error {
	keys := fs.Int("keys", 1000000, "keys held")
	return func(ctx context.Context) error { return benchCatchup(ctx, e.dir, *keys, e.stdout) }
}

func setupScale(fs *flag.FlagSet, e *env) func(context.Context) error {
	e.cl = &clusterFlags{}
	e.cl.register(fs, true)
	keys := fs.Int("keys", 1000000, "keys held")
	waiters := fs.Int("waiters", 100000, "acquires queued behind the held keys (one per key), for the memory per waiter")
	clients := fs.Int("clients", 64, "concurrent clients of the throughput runs")
	warmup, duration := loadFlags(fs)
	return func(ctx context.Context) error {
		// The heap figures come from the profiler.
		p, err := e.startProcs(ctx, "--log-level", "info", "--pprof-addr", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer p.Close()
		return benchScale(ctx, p, *keys, *waiters, *clients, *warmup, *duration, e.stdout)
	}
}

func setupDisk(fs *flag.FlagSet, e *env) func(context.Context) error {
	stores := fs.Int("nodes", 3, "stores appending at once in the second round, as the nodes of a one-box cluster do")
	duration := fs.Duration("duration", 10*time.Second, "measured duration of each round")
	logStore := fs.String("log-store", floor.WAL, "the Raft log store appended to, as a node opens it: wal (raft-wal, a node's default for a new data dir) or bolt (raft-boltdb/v2)")
	return func(ctx context.Context) error {
		if *stores < 1 {
			return usageError(fmt.Sprintf("--nodes %d: want at least 1", *stores))
		}
		if err := floor.CheckKind(*logStore); err != nil {
			return usageError("--log-store: " + err.Error())
		}
		return benchDisk(ctx, e.dir, *logStore, *stores, *duration, e.stdout)
	}
}
