package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/localproc"
	"ticketing/cluster/wire"
	"ticketing/cmd/ticketlab/internal/compare"
	"ticketing/locksm"
	"ticketing/sidecar"
)

// Issue 18's targets for seat blocks.
const (
	blocksRateTarget = 3.0 // atomic cycles/s ÷ sequential cycles/s, at least
	blocksP50Target  = 1.3 // atomic cycle p50 ÷ single-key cycle p50, at most
)

// The workloads of `ticketlab bench blocks`, in the order each round runs
// them.
const (
	BlocksAtomic     = "atomic"
	BlocksSequential = "sequential"
	BlocksSingle     = "single"
)

var blocksWorkloads = []string{BlocksAtomic, BlocksSequential, BlocksSingle}

// blocksLease is every lock's lease; the wait is BlocksOptions.Wait.
const blocksLease = 30 * time.Second

// blocksHotSeats are the seats whose state the leader is asked for
// (admin inspect) every 500 ms of a window: the hottest under the Zipf law.
const blocksHotSeats = 8

// blocksMaxErrors ends a run early: a workload that fails this often is
// broken, not slow.
const blocksMaxErrors = 1000

// BlocksOptions configures RunBlocks (`ticketlab bench blocks`).
type BlocksOptions struct {
	// Binary is the ticketing executable the nodes run.
	Binary string
	// Dir holds the cluster.
	Dir string
	// Nodes is the cluster size (3 or 5); TLS runs nodes and broker over
	// TLS; NodeArgs are extra flags for every node.
	Nodes    int
	TLS      bool
	NodeArgs []string
	// Sellers are the concurrent clients: one goroutine and one owner
	// each, all through one in-process Broker.
	Sellers int
	// Seats is the key space; Block the keys of a block (the 4);
	// ZipfS the exponent of the Zipf law the block starts (and, for the
	// single-key workload, the seats) are drawn from.
	Seats, Block int
	ZipfS        float64
	// Duration is each workload's measured time, split evenly over
	// Rounds; each round runs every workload for Warmup, then its share
	// of Duration measured.
	Warmup, Duration time.Duration
	Rounds           int
	// Wait is the wait of every acquire.
	Wait time.Duration
	// ProfileDir, if set, receives CPU profiles of the leader and of this
	// process (the Broker and the sellers), one per workload, taken in
	// the first round's measured windows; the nodes then run with
	// --pprof-addr.
	ProfileDir string
	// Command is the command line, for the report.
	Command string
	// Out hears the progress.
	Out io.Writer
}

// BlocksConfig is the run's configuration as results.json records it.
type BlocksConfig struct {
	Nodes     int      `json:"nodes"`
	TLS       bool     `json:"tls"`
	NodeArgs  []string `json:"node_args,omitempty"`
	Sellers   int      `json:"sellers"`
	Seats     int      `json:"seats"`
	Block     int      `json:"block"`
	ZipfS     float64  `json:"zipf_s"`
	WarmupS   float64  `json:"warmup_s"`
	DurationS float64  `json:"duration_s"` // per workload, all rounds
	WindowS   float64  `json:"window_s"`   // per workload and round
	Rounds    int      `json:"rounds"`
	LeaseS    float64  `json:"lease_s"`
	WaitS     float64  `json:"wait_s"`
}

// BlocksResult is one workload, summed over the rounds.
type BlocksResult struct {
	Workload string `json:"workload"`
	What     string `json:"what"`
	// Requests is the lock requests (acquires and releases) of one cycle,
	// by construction.
	Requests int     `json:"requests_per_cycle"`
	Seconds  float64 `json:"seconds"` // measured wall time
	Cycles   int     `json:"cycles"`  // cycles completed in the windows
	PerS     float64 `json:"cycles_per_s"`
	// Cycle latency (every acquire, waits included, and every release), ms.
	P50ms  float64 `json:"p50_ms"`
	P99ms  float64 `json:"p99_ms"`
	P999ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
	// The acquire part of a cycle alone, ms.
	AcquireP50ms float64 `json:"acquire_p50_ms"`
	AcquireP99ms float64 `json:"acquire_p99_ms"`
	// The release part (every release) alone, ms.
	ReleaseP50ms float64 `json:"release_p50_ms"`
	ReleaseP99ms float64 `json:"release_p99_ms"`
	// Commits is the leader's Raft commit index (its STATUS reply) at the
	// end of each window minus at its start, summed; -1 if the leader
	// changed during a window. CommitsPerCycle is Commits ÷ Cycles: Raft
	// entries per cycle, after group commit.
	Commits         int64   `json:"commits"`
	CommitsPerCycle float64 `json:"commits_per_cycle"`
	// CPU (user+sys, /proc) per cycle: the leader, all nodes, this process
	// (the in-process Broker and the sellers), µs; Busy is the machine's
	// share used by all of them, Others the share used by every other
	// process on the machine (from /proc/stat), %.
	LeaderCPUus float64 `json:"leader_cpu_us_per_cycle"`
	NodesCPUus  float64 `json:"nodes_cpu_us_per_cycle"`
	LabCPUus    float64 `json:"lab_cpu_us_per_cycle"`
	// Waiters and KeysHeld are the leader's queued acquires and held keys
	// (its STATUS), the mean of samples every 200 ms in the windows.
	Waiters  float64 `json:"leader_waiters_mean"`
	KeysHeld float64 `json:"leader_keys_held_mean"`
	// HotHeldPct and HotReservedPct: of the leader's inspections of seats
	// 0..7 every 500 ms, the share that found the seat held, and reserved
	// (free, but kept for a queued block still waiting for its other
	// keys: idle, locksm/MATRIX.md "Blocks").
	HotHeldPct     float64 `json:"hot_seats_held_pct"`
	HotReservedPct float64 `json:"hot_seats_reserved_pct"`
	BusyPct        float64 `json:"busy_pct"`
	OthersPct      float64 `json:"others_pct"`
	// Errors of the windows and warm-ups (a failed cycle is not counted);
	// FirstError is the first one's text.
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
}

// BlocksReport is what RunBlocks measured (results.json).
type BlocksReport struct {
	Started  string          `json:"started"`
	ElapsedS float64         `json:"elapsed_s"`
	Command  string          `json:"command"`
	Version  string          `json:"version"`
	Machine  compare.Machine `json:"machine"`
	Config   BlocksConfig    `json:"config"`
	Results  []BlocksResult  `json:"results"`
	// RateRatio is atomic ÷ sequential cycles/s; P50Ratio atomic ÷ single
	// cycle p50.
	RateRatio float64  `json:"atomic_over_sequential_cycles_per_s"`
	P50Ratio  float64  `json:"atomic_over_single_p50"`
	RateMet   bool     `json:"rate_target_met"`
	P50Met    bool     `json:"p50_target_met"`
	Profiles  []string `json:"profiles,omitempty"`
}

func setupBlocks(fs *flag.FlagSet, e *env) func(context.Context) error {
	e.cl = &clusterFlags{}
	e.cl.register(fs, true)
	o := BlocksOptions{}
	fs.IntVar(&o.Sellers, "sellers", 64, "concurrent sellers: one goroutine and one owner each, all through one in-process Broker")
	fs.IntVar(&o.Seats, "seats", 10000, "seats: the key space")
	fs.IntVar(&o.Block, "block", 4, fmt.Sprintf("seats per block: adjacent seats k..k+block-1, what a family buys (%d..%d)", locksm.MinBlockKeys, locksm.MaxBlockKeys))
	fs.Float64Var(&o.ZipfS, "zipf", 1.1, "Zipf exponent s (> 1): a block starts at seat k with probability ∝ (1+k)^-s, k in 0..seats-block; the single-key workload draws its seat the same way over 0..seats-1")
	fs.DurationVar(&o.Duration, "duration", 20*time.Second, "measured time of each workload, split evenly over the rounds")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "warm-up of each workload before each of its windows")
	fs.IntVar(&o.Rounds, "rounds", 4, "rounds, each running atomic, sequential and single back to back for duration/rounds each (alternating, so drift and other load on the machine fall on all three alike)")
	fs.DurationVar(&o.Wait, "wait", 60*time.Second, "the wait of every acquire")
	fs.StringVar(&o.ProfileDir, "profile", "", "directory for CPU profiles of the leader and of the lab process, one per workload, from the first round's windows (the nodes then run with --pprof-addr)")
	out := fs.String("out", "results/blocks", "directory for results.md and results.json (\"\": none)")
	return func(ctx context.Context) error {
		if o.Sellers < 1 || o.Rounds < 1 || o.Duration <= 0 || o.Warmup < 0 {
			return usageError("--sellers, --rounds: want at least 1; --duration: want more than 0")
		}
		if o.Block < locksm.MinBlockKeys || o.Block > locksm.MaxBlockKeys {
			return usageError(fmt.Sprintf("--block %d: want %d..%d", o.Block, locksm.MinBlockKeys, locksm.MaxBlockKeys))
		}
		if o.Seats <= o.Block {
			return usageError(fmt.Sprintf("--seats %d: want more than --block %d", o.Seats, o.Block))
		}
		if !(o.ZipfS > 1) {
			return usageError(fmt.Sprintf("--zipf %v: want more than 1", o.ZipfS))
		}
		if o.Wait < 0 || o.Wait%time.Millisecond != 0 || o.Wait > locksm.MaxWaitMs*time.Millisecond {
			return usageError(fmt.Sprintf("--wait %v: want whole milliseconds up to %d ms", o.Wait, locksm.MaxWaitMs))
		}
		cmd := []string{"ticketlab bench blocks"}
		fs.Visit(func(f *flag.Flag) { cmd = append(cmd, "--"+f.Name+" "+f.Value.String()) })
		o.Command = strings.Join(cmd, " ")
		o.Binary, o.Dir, o.Nodes, o.TLS, o.NodeArgs, o.Out = *e.cl.binary, e.dir, e.cl.nodes, e.cl.tls, strings.Fields(e.cl.nodeArgs), e.stdout
		r, err := RunBlocks(ctx, o)
		if err != nil {
			return err
		}
		fmt.Fprint(e.stdout, r)
		if *out != "" {
			if err := r.Write(*out); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "wrote %s, %s\n", filepath.Join(*out, "results.md"), filepath.Join(*out, "results.json"))
		}
		return nil
	}
}

// blocksRun is one RunBlocks: the cluster, the broker, the seat keys.
type blocksRun struct {
	o     BlocksOptions
	p     *localproc.Procs
	b     *sidecar.Broker
	prof  []string // the nodes' profiler addresses, with ProfileDir
	say   func(format string, a ...any)
	seats map[string][]string // workload → seat keys
}

// blocksWindow is one workload's measured window in one round.
type blocksWindow struct {
	seconds          float64
	cycles, acquires []time.Duration
	releases         []time.Duration
	machine          time.Duration // CPU time of every process on the machine
	// Sums of the leader's waiters and held keys over samples taken
	// every 200 ms in the window.
	waiting, held, samples uint64
	// Of inspections of the hot seats: held, reserved (free but kept for
	// a queued block that waits for its other keys), all.
	hotHeld, hotReserved, hotSamples int
	commits                          int64 // -1: the leader changed
	leader, nodes, self              time.Duration
	errors                           int
	firstErr                         string
}

// RunBlocks measures issue 18's seat blocks on node processes through one
// in-process Broker: Sellers sellers, each in a loop picking a block of
// Block adjacent seats (seats k..k+Block-1, k Zipf-distributed: what a
// family buys) and either acquiring it with one AcquireBlock and freeing
// it with one Release (atomic), or acquiring its seats one by one in
// canonical (sorted) order with Acquire and then releasing them one by
// one (sequential); and, as the baseline, acquiring and releasing one
// Zipf-chosen seat (single). Every acquire waits (Wait). Each round runs
// the three back to back, each for Warmup and then Duration/Rounds
// measured.
func RunBlocks(ctx context.Context, o BlocksOptions) (*BlocksReport, error) {
	began := time.Now()
	rep := &BlocksReport{Started: began.UTC().Format(time.RFC3339), Command: o.Command, Version: compare.BinaryVersion(o.Binary),
		Machine: compare.MachineFacts(),
		Config: BlocksConfig{Nodes: max(o.Nodes, 3), TLS: o.TLS, NodeArgs: o.NodeArgs, Sellers: o.Sellers, Seats: o.Seats, Block: o.Block,
			ZipfS: o.ZipfS, WarmupS: o.Warmup.Seconds(), DurationS: o.Duration.Seconds(), WindowS: (o.Duration / time.Duration(o.Rounds)).Seconds(), Rounds: o.Rounds,
			LeaseS: blocksLease.Seconds(), WaitS: o.Wait.Seconds()}}
	br := &blocksRun{o: o, seats: map[string][]string{}, say: func(format string, a ...any) {
		if o.Out != nil {
			fmt.Fprintf(o.Out, "blocks: "+format+"\n", a...)
		}
	}}
	args := append([]string{}, quiet...)
	if o.ProfileDir != "" {
		if err := os.MkdirAll(o.ProfileDir, 0o755); err != nil {
			return nil, err
		}
		args = []string{"--log-level", "info", "--pprof-addr", "127.0.0.1:0"} // the address is read from the log
	}
	p, err := localproc.Start(localproc.Options{Binary: o.Binary, Dir: filepath.Join(o.Dir, "cluster"), Nodes: o.Nodes, TLS: o.TLS,
		Admin: true, ExtraArgs: append(args, o.NodeArgs...)})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	br.p = p
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := p.Leader(wctx); err != nil {
		return nil, err
	}
	if err := waitHealthy(ctx, p); err != nil {
		return nil, err
	}
	if o.ProfileDir != "" {
		if br.prof, err = profilerAddrs(p); err != nil {
			return nil, err
		}
	}
	bcfg := sidecar.DefaultConfig()
	bcfg.Addrs, bcfg.Secret, bcfg.ClusterID, bcfg.TLS = p.ClientAddrs(), p.ClientSecret, p.ClusterID, p.ClientTLS
	bcfg.Logger = slog.New(slog.DiscardHandler)
	if br.b, err = sidecar.New(bcfg); err != nil {
		return nil, err
	}
	defer br.b.Close()
	// Ready: the broker knows the leader and the cluster takes blocks (the
	// leader raises the cluster version once it has seen every member).
	for {
		l, err := br.b.AcquireBlock(wctx, []string{"probe/a", "probe/b"}, "probe", blocksLease, 0)
		if err == nil {
			err = br.b.Release(wctx, l)
		}
		if err == nil {
			break
		}
		if wctx.Err() != nil {
			return nil, fmt.Errorf("no block acquire through the broker within 30 s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	width := len(strconv.Itoa(o.Seats - 1))
	for _, w := range blocksWorkloads {
		keys := make([]string, o.Seats)
		for s := range keys {
			keys[s] = fmt.Sprintf("%s/seat/%0*d", w, width, s)
		}
		br.seats[w] = keys
	}

	windows := map[string][]blocksWindow{}
	for round := 0; round < o.Rounds; round++ {
		for _, w := range blocksWorkloads {
			win, err := br.window(ctx, round, w)
			if err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", round+1, w, err)
			}
			windows[w] = append(windows[w], win)
			br.say("round %d/%d, %s: %s", round+1, o.Rounds, w, summarize(w, []blocksWindow{win}, o).line())
		}
	}
	for _, w := range blocksWorkloads {
		rep.Results = append(rep.Results, summarize(w, windows[w], o))
	}
	at, seq, one := rep.Results[0], rep.Results[1], rep.Results[2]
	if seq.PerS > 0 {
		rep.RateRatio = at.PerS / seq.PerS
	}
	if one.P50ms > 0 {
		rep.P50Ratio = at.P50ms / one.P50ms
	}
	clean := at.Errors+seq.Errors+one.Errors == 0
	rep.RateMet = clean && rep.RateRatio >= blocksRateTarget
	rep.P50Met = clean && rep.P50Ratio > 0 && rep.P50Ratio <= blocksP50Target
	if o.ProfileDir != "" {
		for _, w := range blocksWorkloads {
			rep.Profiles = append(rep.Profiles, filepath.Join(o.ProfileDir, w+"-leader.pprof"), filepath.Join(o.ProfileDir, w+"-lab.pprof"))
		}
	}
	rep.Machine.LoadAvgEnd = compare.LoadAvg()
	rep.ElapsedS = time.Since(began).Seconds()
	return rep, nil
}

// cycle is one seller's acquire part and release part on one draw.
type blocksCycle struct {
	acquire func() error
	release func() error
}

// window runs workload w for one round: warm-up, the measured
// window, then the sellers finish their cycles and the cluster must be
// empty again.
func (br *blocksRun) window(ctx context.Context, round int, w string) (blocksWindow, error) {
	o, b := br.o, br.b
	keys := br.seats[w]
	var measuring, stop atomic.Bool
	var mu sync.Mutex
	var win blocksWindow
	failed := func(err error) {
		mu.Lock()
		win.errors++
		if win.firstErr == "" {
			win.firstErr = err.Error()
		}
		mu.Unlock()
	}
	lat := make([][]time.Duration, o.Sellers)
	acq := make([][]time.Duration, o.Sellers)
	rel := make([][]time.Duration, o.Sellers)
	var wg sync.WaitGroup
	for i := 0; i < o.Sellers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			owner := fmt.Sprintf("seller.%d", i)
			// The same seed in every workload of a round: atomic and
			// sequential draw the same blocks.
			rng := rand.New(rand.NewPCG(uint64(i)+1, 0x7365617473+uint64(round)))
			imax := uint64(o.Seats - o.Block)
			if w == BlocksSingle {
				imax = uint64(o.Seats - 1)
			}
			zipf := rand.NewZipf(rng, o.ZipfS, 1, imax)
			block := make([]string, o.Block)
			held := make([]sidecar.Lock, 0, o.Block)
			var one sidecar.Lock
			// release frees held (sequential), on its own deadline.
			releaseHeld := func() error {
				var first error
				for _, l := range held {
					rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					if err := b.Release(rctx, l); err != nil && first == nil {
						first = fmt.Errorf("release %s: %w", l.Key, err)
					}
					cancel()
				}
				held = held[:0]
				return first
			}
			var c blocksCycle
			switch w {
			case BlocksAtomic:
				c.acquire = func() (err error) {
					one, err = b.AcquireBlock(ctx, block, owner, blocksLease, o.Wait)
					return err
				}
				c.release = func() error { return b.Release(ctx, one) }
			case BlocksSequential:
				c.acquire = func() error {
					for _, k := range block {
						l, err := b.Acquire(ctx, k, owner, blocksLease, o.Wait)
						if err != nil {
							if rerr := releaseHeld(); rerr != nil {
								failed(rerr)
							}
							return fmt.Errorf("acquire %s: %w", k, err)
						}
						held = append(held, l)
					}
					return nil
				}
				c.release = releaseHeld
			case BlocksSingle:
				c.acquire = func() (err error) {
					one, err = b.Acquire(ctx, block[0], owner, blocksLease, o.Wait)
					return err
				}
				c.release = func() error { return b.Release(ctx, one) }
			}
			for !stop.Load() && ctx.Err() == nil {
				k := int(zipf.Uint64())
				if w == BlocksSingle {
					block = block[:1]
					block[0] = keys[k]
				} else {
					copy(block, keys[k:k+o.Block])
					slices.Sort(block) // canonical order (the padded names already sort so)
				}
				t0 := time.Now()
				err := c.acquire()
				ta := time.Now()
				if err == nil {
					err = c.release()
				}
				t1 := time.Now()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					failed(err)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if measuring.Load() {
					lat[i] = append(lat[i], t1.Sub(t0))
					acq[i] = append(acq[i], ta.Sub(t0))
					rel[i] = append(rel[i], t1.Sub(ta))
				}
			}
		}(i)
	}
	tooMany := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return win.errors >= blocksMaxErrors
	}
	sleep := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) && !tooMany() && ctx.Err() == nil {
			time.Sleep(min(50*time.Millisecond, time.Until(end)))
		}
	}
	finish := func() { stop.Store(true); wg.Wait() }

	sleep(o.Warmup)
	li, err := br.p.Leader(ctx)
	if err != nil {
		finish()
		return win, err
	}
	st0, err := br.p.Status(ctx, li)
	if err != nil {
		finish()
		return win, err
	}
	var profDone chan error
	if o.ProfileDir != "" && round == 0 {
		profDone = br.profile(ctx, w, li)
	}
	cpu0, self0, m0 := nodesCPU(br.p), selfCPU(), machineCPU()
	measuring.Store(true)
	start := time.Now()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for end := start.Add(o.Duration / time.Duration(o.Rounds)); ; {
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return
			}
			if time.Now().After(end) {
				return
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := br.p.Status(sctx, li)
			cancel()
			if err == nil {
				win.waiting, win.held, win.samples = win.waiting+st.Waiting, win.held+st.Held, win.samples+1
			}
		}
	}()
	inspected := make(chan struct{})
	go func() {
		defer close(inspected)
		cfg := br.p.Admin().Config
		for end := start.Add(o.Duration / time.Duration(o.Rounds)); ; {
			select {
			case <-time.After(500 * time.Millisecond):
			case <-ctx.Done():
				return
			}
			if time.Now().After(end) {
				return
			}
			for _, k := range keys[:min(blocksHotSeats, len(keys))] {
				sctx, cancel := context.WithTimeout(ctx, time.Second)
				rep, err := client.AdminDo(sctx, br.p.AdminAddr(li), cfg, wire.AdminRequest{Op: wire.AdminOpInspect, Key: k, LeaderOnly: true})
				cancel()
				if err != nil || rep.Key == nil {
					continue
				}
				win.hotSamples++
				if rep.Key.Held {
					win.hotHeld++
				}
				if rep.Key.Reserved {
					win.hotReserved++
				}
			}
		}
	}()
	sleep(o.Duration / time.Duration(o.Rounds))
	measuring.Store(false)
	elapsed := time.Since(start)
	cpu1, self1, m1 := nodesCPU(br.p), selfCPU(), machineCPU()
	<-sampled
	<-inspected
	st1, serr := br.p.Status(ctx, li)
	finish()
	if profDone != nil {
		if err := <-profDone; err != nil {
			return win, fmt.Errorf("profile: %w", err)
		}
	}
	if ctx.Err() != nil {
		return win, ctx.Err()
	}
	if tooMany() {
		return win, fmt.Errorf("%d errors, the first: %s", win.errors, win.firstErr)
	}
	win.seconds = elapsed.Seconds()
	win.commits = -1
	if serr == nil && st1.Role == st0.Role && st1.Term == st0.Term && st1.Commit >= st0.Commit {
		win.commits = int64(st1.Commit - st0.Commit)
	}
	if len(cpu0) == br.p.Size() && len(cpu1) == br.p.Size() {
		win.leader = cpu1[li] - cpu0[li]
		for n := range cpu1 {
			win.nodes += cpu1[n] - cpu0[n]
		}
	}
	win.self = self1 - self0
	win.machine = m1 - m0
	for i := range lat {
		win.cycles = append(win.cycles, lat[i]...)
		win.acquires = append(win.acquires, acq[i]...)
		win.releases = append(win.releases, rel[i]...)
	}
	// The next workload starts on an empty table: every cycle released.
	deadline := time.Now().Add(15 * time.Second)
	for {
		st, err := br.p.Status(ctx, li)
		if err == nil && st.Held == 0 && st.Waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			return win, fmt.Errorf("the leader still has %d keys held and %d waiters 15 s after the sellers stopped (%v)", st.Held, st.Waiting, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return win, nil
}

// profile takes CPU profiles, for the window's duration, of the leader
// (from its profiler) and of this process, into ProfileDir.
func (br *blocksRun) profile(ctx context.Context, w string, li int) chan error {
	done := make(chan error, 1)
	secs := max(1, int((br.o.Duration/time.Duration(br.o.Rounds)).Seconds())-1)
	lab, err := os.Create(filepath.Join(br.o.ProfileDir, w+"-lab.pprof"))
	if err == nil {
		err = pprof.StartCPUProfile(lab)
	}
	if err != nil {
		done <- err
		return done
	}
	go func() {
		err := func() error {
			url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", br.prof[li], secs)
			req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			defer func() { _ = resp.Body.Close() }() // read only
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", url, resp.Status)
			}
			f, err := os.Create(filepath.Join(br.o.ProfileDir, w+"-leader.pprof"))
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, resp.Body); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		}()
		pprof.StopCPUProfile()
		done <- errors.Join(err, lab.Close())
	}()
	return done
}

// summarize sums a workload's windows.
func summarize(w string, wins []blocksWindow, o BlocksOptions) BlocksResult {
	r := BlocksResult{Workload: w}
	switch w {
	case BlocksAtomic:
		r.What = fmt.Sprintf("AcquireBlock of seats k..k+%d, then one Release", o.Block-1)
		r.Requests = 2
	case BlocksSequential:
		r.What = fmt.Sprintf("%d × Acquire of seats k..k+%d in sorted order, then %d × Release", o.Block, o.Block-1, o.Block)
		r.Requests = 2 * o.Block
	case BlocksSingle:
		r.What = "Acquire of one seat, then Release"
		r.Requests = 2
	}
	var cyc, acq, rel []time.Duration
	var leader, nodes, self, machine time.Duration
	var waiting, held, samples uint64
	var hotHeld, hotReserved, hotSamples int
	for _, x := range wins {
		r.Seconds += x.seconds
		cyc = append(cyc, x.cycles...)
		acq = append(acq, x.acquires...)
		rel = append(rel, x.releases...)
		machine += x.machine
		waiting, held, samples = waiting+x.waiting, held+x.held, samples+x.samples
		hotHeld, hotReserved, hotSamples = hotHeld+x.hotHeld, hotReserved+x.hotReserved, hotSamples+x.hotSamples
		if x.commits < 0 || r.Commits < 0 {
			r.Commits = -1
		} else {
			r.Commits += x.commits
		}
		leader, nodes, self = leader+x.leader, nodes+x.nodes, self+x.self
		r.Errors += x.errors
		if r.FirstError == "" {
			r.FirstError = x.firstErr
		}
	}
	if samples > 0 {
		r.Waiters, r.KeysHeld = float64(waiting)/float64(samples), float64(held)/float64(samples)
	}
	if hotSamples > 0 {
		r.HotHeldPct, r.HotReservedPct = 100*float64(hotHeld)/float64(hotSamples), 100*float64(hotReserved)/float64(hotSamples)
	}
	r.Cycles = len(cyc)
	if r.Cycles == 0 || r.Seconds == 0 {
		return r
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(r.Cycles) }
	q := func(s []time.Duration, f float64) time.Duration { return s[int(f*float64(len(s)-1))] }
	sort.Slice(cyc, func(i, j int) bool { return cyc[i] < cyc[j] })
	sort.Slice(acq, func(i, j int) bool { return acq[i] < acq[j] })
	sort.Slice(rel, func(i, j int) bool { return rel[i] < rel[j] })
	r.PerS = float64(r.Cycles) / r.Seconds
	r.P50ms, r.P99ms, r.P999ms, r.MaxMs = ms(q(cyc, 0.5)), ms(q(cyc, 0.99)), ms(q(cyc, 0.999)), ms(cyc[len(cyc)-1])
	r.AcquireP50ms, r.AcquireP99ms = ms(q(acq, 0.5)), ms(q(acq, 0.99))
	r.ReleaseP50ms, r.ReleaseP99ms = ms(q(rel, 0.5)), ms(q(rel, 0.99))
	if r.Commits >= 0 {
		r.CommitsPerCycle = float64(r.Commits) / float64(r.Cycles)
	}
	r.LeaderCPUus, r.NodesCPUus, r.LabCPUus = us(leader), us(nodes), us(self)
	share := func(d time.Duration) float64 { return 100 * d.Seconds() / r.Seconds / float64(runtime.NumCPU()) }
	r.BusyPct = share(nodes + self)
	if machine > 0 {
		r.OthersPct = max(0, share(machine-nodes-self))
	}
	return r
}

func (r BlocksResult) line() string {
	return fmt.Sprintf("%d cycles, %.0f/s, p50 %.2f ms, p99 %.2f ms, %s commits per cycle, %d errors",
		r.Cycles, r.PerS, r.P50ms, r.P99ms, r.commitsCell(), r.Errors)
}

func (r BlocksResult) commitsCell() string {
	if r.Commits < 0 || r.Cycles == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", r.CommitsPerCycle)
}

// table is the workloads and the ratios against the targets, in Markdown.
func (r *BlocksReport) table() string {
	var b strings.Builder
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	b.WriteString("| workload | cycle | cycles | cycles/s | p50 ms | p99 ms | acquire p50 / p99 ms | release p50 / p99 ms | Raft commits per cycle | requests per cycle | at the leader: waiters / keys held (mean) | seats 0–7 held / reserved % | CPU µs per cycle: leader / nodes / lab | machine busy %: this run / others | errors |\n")
	b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range r.Results {
		fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %.2f | %.2f | %.2f / %.2f | %.2f / %.2f | %s | %d | %.1f / %.1f | %.0f / %.0f | %.0f / %.0f / %.0f | %.0f / %.0f | %d |\n",
			x.Workload, x.What, x.Cycles, x.PerS, x.P50ms, x.P99ms, x.AcquireP50ms, x.AcquireP99ms, x.ReleaseP50ms, x.ReleaseP99ms,
			x.commitsCell(), x.Requests, x.Waiters, x.KeysHeld, x.HotHeldPct, x.HotReservedPct, x.LeaderCPUus, x.NodesCPUus, x.LabCPUus, x.BusyPct, x.OthersPct, x.Errors)
	}
	b.WriteString("\n| ratio | figure | target (issue 18) | |\n| --- | ---: | --- | --- |\n")
	fmt.Fprintf(&b, "| atomic ÷ sequential cycles/s | %.2f× | ≥ %.1f× | %s |\n", r.RateRatio, blocksRateTarget, met(r.RateMet))
	fmt.Fprintf(&b, "| atomic p50 ÷ single-key p50 | %.2f× | ≤ %.1f× | %s |\n", r.P50Ratio, blocksP50Target, met(r.P50Met))
	for _, x := range r.Results {
		if x.FirstError != "" {
			fmt.Fprintf(&b, "\n%s: %d errors, the first: %s\n", x.Workload, x.Errors, x.FirstError)
		}
	}
	return b.String()
}

func (r *BlocksReport) setup() string {
	c := r.Config
	t := "TLS 1.3"
	if !c.TLS {
		t = "plaintext"
	}
	s := fmt.Sprintf("%d `ticketing node` processes on loopback (%s), every Raft entry fsynced; one in-process Broker (sidecar.New) for %d sellers, each seller its own owner; "+
		"%d seats, blocks of %d adjacent seats k..k+%d with k drawn from Zipf(s=%.2f) (P(k) ∝ (1+k)^-s, math/rand/v2), the single seat likewise over all seats; lease %.0f s, wait %.0f s",
		c.Nodes, t, c.Sellers, c.Seats, c.Block, c.Block-1, c.ZipfS, c.LeaseS, c.WaitS)
	if len(c.NodeArgs) > 0 {
		s += "; node flags `" + strings.Join(c.NodeArgs, " ") + "`"
	}
	return s
}

// String is the report printed at the end of a run.
func (r *BlocksReport) String() string {
	c := r.Config
	return fmt.Sprintf("\nblocks: %s; %d round(s), each workload %s s warm-up + %s s measured per round (%s s in all)\n%s",
		r.setup(), c.Rounds, secs(c.WarmupS), secs(c.WindowS), secs(c.DurationS), r.table())
}

// Markdown renders the report as results.md.
func (r *BlocksReport) Markdown() string {
	var b strings.Builder
	c, m := r.Config, r.Machine
	b.WriteString("# Seat blocks (issue 18): one atomic block acquire against single-key acquires\n\n")
	fmt.Fprintf(&b, "Run %s, %.0f s in all, by `%s`, on ticketing %s. %d round(s); in each, the three workloads ran back to back on the same cluster and broker, each %s s warm-up then %s s measured (%s s measured per workload in all).\n\n",
		r.Started, r.ElapsedS, r.Command, r.Version, c.Rounds, secs(c.WarmupS), secs(c.WindowS), secs(c.DurationS))
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %d MiB, %s, kernel %s, %s; load average at start %s, at end %s.\n\n",
		m.CPUs, m.CPUModel, m.MemoryMiB, m.OS, m.Kernel, m.GoVersion, m.LoadAvg, m.LoadAvgEnd)
	fmt.Fprintf(&b, "Setup: %s.\n\n", r.setup())
	b.WriteString(r.table())
	b.WriteString("\nA cycle is timed from its first acquire sent to its last release answered; only cycles completed inside the windows count. " +
		"Raft commits per cycle: the leader's commit index (its STATUS reply) at the end of each window minus at its start, ÷ the cycles; " +
		"group commit puts many sellers' requests in one entry, so it is below the requests per cycle. " +
		"At the leader: its STATUS every 200 ms (waiters queued, a queued block counting once; keys held) and an admin inspect of seats 0–7 every 500 ms " +
		"(held; reserved: free, but kept for a queued block that still waits for its other keys, so idle). " +
		"CPU: user+sys from /proc of the three nodes and of the lab process (the broker and the sellers); " +
		"machine busy % of all CPUs during the windows, by this run and by every other process (from /proc/stat: load this run did not make).\n")
	return b.String()
}

func secs(s float64) string { return strconv.FormatFloat(s, 'g', -1, 64) }

// Write writes results.json and results.md into dir.
func (r *BlocksReport) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	for name, b := range map[string][]byte{"results.json": append(j, '\n'), "results.md": []byte(r.Markdown())} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p+".tmp", b, 0o644); err != nil {
			return err
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return err
		}
	}
	return nil
}

// machineCPU is the CPU time every process on the machine has used so far
// (/proc/stat: user, nice, system, irq, softirq and steal; 100 Hz ticks).
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
