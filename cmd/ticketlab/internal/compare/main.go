// Package compare is `ticketlab compare`: Ticketing against the lock
// services users already run — etcd (clientv3/concurrency Mutex),
// ZooKeeper (the lock recipe) and Redis (redsync, one unreplicated node) —
// on the same machine, in the same run, writing results.md, results.json
// and plot.svg.
//
// It lives in the lab's module (cmd/ticketlab/go.mod) so that the peers'
// client libraries never enter Ticketing's go.mod. See cmd/ticketlab's
// README.md; peers.sh there installs and starts the peers.
//
//	cd cmd/ticketlab
//	./peers.sh install && ./peers.sh start /tmp/tb-peers
//	go run . compare --binary ../../bin/ticketing --out results
//	./peers.sh stop /tmp/tb-peers
package compare

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"ticketing/cmd/ticketlab/internal/floor"
	"ticketing/cmd/ticketlab/internal/labcli"
)

// AllSystems in report order.
var AllSystems = []string{"ticketing-sidecar", "ticketing-broker", "etcd", "zookeeper", "redis", "line-floor"}

// AllWorkloads in report order.
var AllWorkloads = []string{Uncontended, Contended, Mixed}

// Options are the command's flags.
type Options struct {
	Systems     []string
	Clients     []int
	Workloads   []string
	Warmup      time.Duration
	Duration    time.Duration
	Out         string
	Binary      string
	Dir         string
	TLS         bool
	PeersDir    string
	StartPeers  bool
	PeersScript string
	Etcd        []string
	ZooKeeper   []string
	Redis       string
	RedisRetry  time.Duration
	EtcdClients string
	Prewarm     time.Duration
	// LogStore is the Ticketing nodes' Raft log store, wal or bolt (passed
	// as --log-store KIND), and the floors' store.
	LogStore string
	// NodeArgs and SidecarArgs are appended to the Ticketing nodes' and
	// sidecar's command lines.
	NodeArgs, SidecarArgs []string
	// FloorDuration is how long each floor (disk, library) is measured
	// before the first system; zero skips them.
	FloorDuration time.Duration
}

// Main runs `ticketlab compare ARGS...`; it returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := labcli.NewFlagSet("ticketlab compare")
	opts := register(fs)
	if code, ok := labcli.Parse(fs, args, stdout, stderr); !ok {
		return code
	}
	o, err := opts()
	if err != nil {
		return labcli.Usage(fs, stderr, err.Error())
	}
	if has(o.Systems, "ticketing-sidecar") || has(o.Systems, "ticketing-broker") {
		if o.Binary, err = labcli.Binary(o.Binary); err != nil {
			return labcli.Usage(fs, stderr, err.Error())
		}
	}
	if err := Run(ctx, o, stdout); err != nil {
		fmt.Fprintln(stderr, "ticketlab compare:", err)
		return labcli.ExitError
	}
	return labcli.ExitOK
}

// register adds the command's flags to fs; the function it returns checks
// them once parsed.
func register(fs *flag.FlagSet) func() (Options, error) {
	var o Options
	var systems, clients, workloads, etcd, zkServers, nodeArgs, sidecarArgs string
	fs.StringVar(&systems, "systems", strings.Join(AllSystems, ","), "systems to measure, comma separated: "+strings.Join(AllSystems, ", "))
	fs.StringVar(&clients, "clients", "1,16,64,256", "client counts, comma separated")
	fs.StringVar(&workloads, "workloads", strings.Join(AllWorkloads, ","), "workloads, comma separated: "+strings.Join(AllWorkloads, ", "))
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "warm-up before each measured run")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "measured duration of each run")
	fs.DurationVar(&o.Prewarm, "prewarm", 3*time.Second, "before the first run, drive each system this long (uncontended, 16 clients, not reported): JIT, caches, connections")
	fs.StringVar(&o.Out, "out", "results", "directory for results.md, results.json and plot.svg")
	binary := labcli.BinaryFlag(fs)
	fs.StringVar(&o.Dir, "dir", "", "working directory of the Ticketing nodes and the floors' stores (default: a temporary one, removed afterwards)")
	fs.StringVar(&o.LogStore, "log-store", floor.WAL, "Raft log store of the Ticketing nodes (passed as --log-store KIND) and of the floors: wal (a node's default for a new data dir) or bolt")
	fs.StringVar(&nodeArgs, "node-args", "", "extra flags for every Ticketing node, space separated (e.g. \"--pprof-addr 127.0.0.1:0\")")
	fs.StringVar(&sidecarArgs, "sidecar-args", "", "extra flags for the Ticketing sidecar, space separated")
	fs.DurationVar(&o.FloorDuration, "floor-duration", 3*time.Second, "before the first system, measure the disk floor and the library floor this long each (0: not at all)")
	fs.BoolVar(&o.TLS, "tls", true, "run the Ticketing nodes and sidecar over TLS 1.3, as in production (the peers run plaintext)")
	fs.StringVar(&o.PeersDir, "peers-dir", "/tmp/ticketbench-peers", "the DIR of `peers.sh start DIR` (with --start-peers: started there and stopped afterwards)")
	fs.BoolVar(&o.StartPeers, "start-peers", false, "run `peers.sh start` before and `peers.sh stop` after the benchmark")
	fs.StringVar(&o.PeersScript, "peers-script", "./peers.sh", "peers.sh, for --start-peers")
	fs.StringVar(&etcd, "etcd", "127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793", "etcd client endpoints")
	fs.StringVar(&zkServers, "zookeeper", "127.0.0.1:21811,127.0.0.1:21812,127.0.0.1:21813", "ZooKeeper servers")
	fs.StringVar(&o.Redis, "redis", "127.0.0.1:26379", "Redis address")
	fs.StringVar(&o.EtcdClients, "etcd-clients", "shared", "etcd: one clientv3.Client shared by all clients (shared, etcd's usual shape) or one per client (per-client)")
	fs.DurationVar(&o.RedisRetry, "redis-retry-delay", 5*time.Millisecond, "redsync's poll interval while the lock is taken (jittered ±50%)")
	return func() (Options, error) {
		o.Binary = *binary
		o.NodeArgs, o.SidecarArgs = strings.Fields(nodeArgs), strings.Fields(sidecarArgs)
		return check(o, systems, clients, workloads, etcd, zkServers)
	}
}

func check(o Options, systems, clients, workloads, etcd, zkServers string) (Options, error) {
	var err error
	if o.Systems, err = pick(systems, AllSystems, "--systems"); err != nil {
		return o, err
	}
	if o.Workloads, err = pick(workloads, AllWorkloads, "--workloads"); err != nil {
		return o, err
	}
	for _, f := range strings.Split(clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 4096 {
			return o, fmt.Errorf("--clients %q: want counts in 1..4096", clients)
		}
		o.Clients = append(o.Clients, n)
	}
	if o.Warmup < 0 || o.Duration <= 0 {
		return o, fmt.Errorf("--warmup must be >= 0 and --duration > 0")
	}
	if o.EtcdClients != "shared" && o.EtcdClients != "per-client" {
		return o, fmt.Errorf("--etcd-clients: shared or per-client")
	}
	if o.RedisRetry <= 0 {
		return o, fmt.Errorf("--redis-retry-delay must be > 0")
	}
	if err := floor.CheckKind(o.LogStore); err != nil {
		return o, fmt.Errorf("--log-store: %w", err)
	}
	if o.FloorDuration < 0 {
		return o, fmt.Errorf("--floor-duration must be >= 0")
	}
	o.Etcd = splitList(etcd)
	o.ZooKeeper = splitList(zkServers)
	return o, nil
}

func pick(list string, all []string, flagName string) ([]string, error) {
	want := map[string]bool{}
	for _, s := range splitList(list) {
		ok := false
		for _, a := range all {
			ok = ok || a == s
		}
		if !ok {
			return nil, fmt.Errorf("%s: unknown %q (known: %s)", flagName, s, strings.Join(all, ", "))
		}
		want[s] = true
	}
	var out []string
	for _, a := range all { // report order
		if want[a] {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: empty", flagName)
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Run runs the whole benchmark and writes its output.
func Run(ctx context.Context, o Options, stdout io.Writer) error {
	began := time.Now()
	rep := &Report{Started: began.UTC().Format(time.RFC3339), Machine: machineFacts(),
		Config: ReportConfig{Systems: o.Systems, Workloads: o.Workloads, Clients: o.Clients,
			WarmupS: o.Warmup.Seconds(), DurationS: o.Duration.Seconds(), PrewarmS: o.Prewarm.Seconds(), TicketingTLS: o.TLS,
			RedisRetryDelayMs: ms(o.RedisRetry), MixedKeys: MixedKeys, MixedZipfS: MixedZipfS,
			LeaseS: Lease.Seconds(), LogStore: o.LogStore, NodeArgs: o.NodeArgs, SidecarArgs: o.SidecarArgs,
			FloorDurationS: o.FloorDuration.Seconds()}}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return err
	}
	dir := o.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "ticketbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	// The floors first, while the box is quiet: no system started yet.
	if o.FloorDuration > 0 {
		rep.Floors = measureFloors(ctx, o.LogStore, filepath.Join(dir, "floors"), o.FloorDuration, stdout, &rep.Notes)
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := rep.Write(o.Out); err != nil {
			return err
		}
	}
	usesPeers := has(o.Systems, "etcd") || has(o.Systems, "zookeeper") || has(o.Systems, "redis")
	if o.StartPeers && usesPeers {
		fmt.Fprintf(stdout, "starting peers in %s\n", o.PeersDir)
		cmd := exec.CommandContext(ctx, o.PeersScript, "start", o.PeersDir)
		cmd.Stdout, cmd.Stderr = stdout, stdout
		if err := cmd.Run(); err != nil {
			_ = exec.Command(o.PeersScript, "stop", o.PeersDir).Run() // cleanup: the start's error is the news
			return fmt.Errorf("peers.sh start: %w", err)
		}
		defer func() {
			cmd := exec.Command(o.PeersScript, "stop", o.PeersDir)
			cmd.Stdout, cmd.Stderr = stdout, stdout
			if err := cmd.Run(); err != nil {
				fmt.Fprintf(stdout, "peers.sh stop: %v\n", err)
			}
		}()
	}

	systems := map[string]System{}
	defer func() {
		for _, s := range systems {
			s.Close()
		}
	}()
	if has(o.Systems, "ticketing-sidecar") || has(o.Systems, "ticketing-broker") {
		fmt.Fprintln(stdout, "starting 3 ticketing nodes and a sidecar")
		tc, err := startTicketing(ctx, ticketingOptions{Binary: o.Binary, Dir: dir, TLS: o.TLS, LogStore: o.LogStore,
			NodeArgs: o.NodeArgs, SidecarArgs: o.SidecarArgs})
		if err != nil {
			return fmt.Errorf("ticketing: %w", err)
		}
		defer tc.Close()
		if has(o.Systems, "ticketing-sidecar") {
			systems["ticketing-sidecar"] = &ticketingSidecar{tc}
		}
		if has(o.Systems, "ticketing-broker") {
			systems["ticketing-broker"] = &ticketingBroker{tc}
		}
	}
	connect := map[string]func() (System, error){
		"etcd":      func() (System, error) { return newEtcd(ctx, o.Etcd, o.EtcdClients == "per-client", o.PeersDir) },
		"zookeeper": func() (System, error) { return newZK(ctx, o.ZooKeeper, o.PeersDir) },
		"redis":     func() (System, error) { return newRedis(ctx, o.Redis, o.RedisRetry, o.PeersDir) },
	}
	for _, name := range []string{"etcd", "zookeeper", "redis"} {
		if !has(o.Systems, name) {
			continue
		}
		s, err := connect[name]()
		if err != nil {
			msg := fmt.Sprintf("%s not measured: %v", name, err)
			fmt.Fprintln(stdout, msg)
			rep.Notes = append(rep.Notes, msg)
			continue
		}
		systems[name] = s
	}
	if has(o.Systems, "line-floor") {
		lf, err := startLineFloor(ctx)
		if err != nil {
			msg := fmt.Sprintf("line-floor not measured: %v", err)
			fmt.Fprintln(stdout, msg)
			rep.Notes = append(rep.Notes, msg)
		} else {
			systems["line-floor"] = lf
		}
	}
	for _, name := range o.Systems {
		if s, ok := systems[name]; ok {
			rep.Systems = append(rep.Systems, SystemInfo{Name: name, Version: s.Version(), Setup: s.Setup()})
		}
	}

	runID := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if o.Prewarm > 0 {
		for _, name := range o.Systems {
			if s, ok := systems[name]; ok {
				rc := RunConfig{Workload: Uncontended, Clients: 16, Duration: o.Prewarm, Prefix: fmt.Sprintf("tb/%s-prewarm", runID)}
				if _, err := run(ctx, s, rc); err != nil {
					fmt.Fprintf(stdout, "pre-warm %s: %v\n", name, err)
				}
			}
		}
	}
	total := len(o.Workloads) * len(o.Clients) * len(systems)
	k := 0
	for _, w := range o.Workloads {
		for _, n := range o.Clients {
			// Systems interleave per (workload, clients): the runs a ratio
			// compares are adjacent in time.
			for _, name := range o.Systems {
				s, ok := systems[name]
				if !ok {
					continue
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
				k++
				rc := RunConfig{Workload: w, Clients: n, Warmup: o.Warmup, Duration: o.Duration,
					Prefix: fmt.Sprintf("tb/%s-%d", runID, k)}
				t0 := time.Now()
				res, err := run(ctx, s, rc)
				if err != nil {
					res.Skipped = err.Error()
				}
				rep.Results = append(rep.Results, res)
				fmt.Fprintf(stdout, "[%d/%d %4.0fs] %s\n", k, total, time.Since(t0).Seconds(), res.Line())
				rep.ElapsedS = time.Since(began).Seconds()
				rep.Machine.LoadAvgEnd = loadAvg()
				if err := rep.Write(o.Out); err != nil {
					return err
				}
			}
		}
	}
	rep.ElapsedS = time.Since(began).Seconds()
	if err := rep.Write(o.Out); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s, %s, %s (%.0f s)\n", filepath.Join(o.Out, "results.md"),
		filepath.Join(o.Out, "results.json"), filepath.Join(o.Out, "plot.svg"), rep.ElapsedS)
	return nil
}
