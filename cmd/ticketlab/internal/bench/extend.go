package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"ticketing/cluster/localproc"
	"ticketing/cluster/wire"
	"ticketing/cmd/ticketlab/internal/frametrace"
	"ticketing/cmd/ticketlab/internal/labcli"
)

// ExtendOptions configures RunExtend (`ticketlab bench extend`, issue 19).
type ExtendOptions struct {
	// Binary is the ticketing executable (bootstrap and the sidecar); Lab
	// the ticketlab executable, whose `node --frame-trace` runs the nodes
	// (the product's node command, its client connections traced:
	// internal/frametrace).
	Binary, Lab string
	// Dir holds the cluster, the traces and the sidecar's socket.
	Dir string
	// Nodes is the cluster size (3 or 5).
	Nodes int
	// Clients are the client counts of the EXTEND cost (one connection
	// and one key each).
	Clients []int
	// Warmup and Window: each phase's warm-up and measured time; Rounds
	// how many times the two phases (EXTEND, RELEASE+ACQUIRE) alternate.
	Warmup, Window time.Duration
	Rounds         int
	// Pairs is how many holder/waiter pairs measure the lost event at
	// once, for LostFor.
	Pairs   int
	LostFor time.Duration
	// Command is the command line that reproduces the run (results.md).
	Command string
	// Out hears progress.
	Out io.Writer
}

func setupExtend(fs *flag.FlagSet, e *env) func(context.Context) error {
	// Only --binary of the cluster flags: the run is plaintext (its
	// leader-side timestamps read the client stream), on its own nodes.
	binary := labcli.BinaryFlag(fs)
	o := ExtendOptions{}
	fs.IntVar(&o.Nodes, "nodes", 3, "cluster size: 3 or 5")
	clients := fs.String("clients", "1,64", "client counts of the EXTEND cost, comma separated (one connection and one held key each)")
	fs.DurationVar(&o.Window, "window", 5*time.Second, "measured time of each phase of a round")
	fs.DurationVar(&o.Warmup, "warmup", time.Second, "warm-up before each phase's window")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds, each an EXTEND phase then a RELEASE+ACQUIRE phase (alternating, so drift falls on both alike)")
	fs.IntVar(&o.Pairs, "pairs", 20, "holder/waiter pairs measuring the lost event at once (each on its own key, one expiry per pair and second)")
	fs.DurationVar(&o.LostFor, "lost-for", 20*time.Second, "how long the pairs run")
	out := fs.String("out", "results/extend", "directory for results.md (\"\": none)")
	return func(ctx context.Context) error {
		for _, f := range strings.Split(*clients, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return usageError(fmt.Sprintf("--clients %q: want counts of at least 1, comma separated", *clients))
			}
			o.Clients = append(o.Clients, n)
		}
		if o.Nodes != 3 && o.Nodes != 5 {
			return usageError(fmt.Sprintf("--nodes %d: want 3 or 5", o.Nodes))
		}
		if o.Rounds < 1 || o.Window <= 0 || o.Pairs < 1 || o.LostFor <= 0 {
			return usageError("--rounds, --pairs: want at least 1; --window, --lost-for: want more than 0")
		}
		bin, err := labcli.Binary(*binary)
		if err != nil {
			return usageError(err.Error())
		}
		lab, err := os.Executable()
		if err != nil {
			return err
		}
		cmd := []string{"ticketlab bench extend"}
		fs.Visit(func(f *flag.Flag) {
			if f.Name != "binary" && f.Name != "dir" {
				cmd = append(cmd, "--"+f.Name+" "+f.Value.String())
			}
		})
		o.Command = strings.Join(cmd, " ")
		o.Binary, o.Lab, o.Dir, o.Out = bin, lab, e.dir, e.stdout
		r, err := RunExtend(ctx, o)
		if err != nil {
			return err
		}
		md := r.Markdown()
		fmt.Fprint(e.stdout, md)
		if *out != "" {
			if err := os.MkdirAll(*out, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(*out, "results.md"), []byte(md), 0o644)
		}
		return nil
	}
}

// dist is a sorted sample of durations.
type dist []time.Duration

func (d dist) q(f float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[int(f*float64(len(d)-1)+0.5)]
}

func sorted(d []time.Duration) dist {
	out := append(dist(nil), d...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// opStats is one operation's latencies and rate over the measured windows.
type opStats struct {
	Name   string
	Lat    dist
	PerSec float64
}

// ExtendResult is the outcome of RunExtend.
type ExtendResult struct {
	Opts ExtendOptions
	// Cost, per client count: EXTEND, RELEASE+ACQUIRE (the cycle), and its
	// RELEASE and ACQUIRE alone.
	Cost map[int][]opStats
	// The lost event: Lost (the leader's write of X → `! LOST` read by the
	// holder), Handoff (the leader's write of the hand-off G → `OK` read
	// by the waiter: the floor, the same path from the same commit),
	// LeaderOrder (G written − X written, on the leader) and ClientOrder
	// (OK read − LOST read); Unmatched counts the events with no trace
	// record.
	Lost, Handoff, LeaderOrder, ClientOrder dist
	Unmatched, Expiries                     int
	When                                    time.Time
}

// RunExtend starts the cluster (`ticketlab node --frame-trace`), one
// `ticketing sidecar`, and measures the cost of an EXTEND beside
// RELEASE+ACQUIRE of the same key, then the lost event's latency.
func RunExtend(ctx context.Context, o ExtendOptions) (*ExtendResult, error) {
	dir := filepath.Join(o.Dir, "cluster")
	sockDir, err := os.MkdirTemp("", "tkx-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(sockDir)
	trace := func(name string) string { return filepath.Join(dir, name+".trace") }
	var names []string
	p, err := localproc.Start(localproc.Options{Binary: o.Binary, Dir: dir, Nodes: o.Nodes, Sidecars: 1, SocketDir: sockDir,
		ExtraArgs: quiet, SidecarArgs: []string{"--log-level", "warn"},
		Command: func(name string, args []string) (string, []string) {
			if args[0] != "node" {
				return o.Binary, args
			}
			names = append(names, name)
			return o.Lab, append([]string{"node", "--frame-trace", trace(name)}, args[1:]...)
		}})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := p.Leader(wctx); err != nil {
		return nil, err
	}
	sock := p.SidecarSocket(0)
	for {
		c, err := dialLines(wctx, sock)
		if err == nil {
			c.close()
			break
		}
		if wctx.Err() != nil {
			return nil, fmt.Errorf("sidecar: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r := &ExtendResult{Opts: o, Cost: map[int][]opStats{}, When: time.Now()}
	for _, n := range o.Clients {
		st, err := extendCost(ctx, sock, n, o)
		if err != nil {
			return nil, fmt.Errorf("%d clients: %w", n, err)
		}
		r.Cost[n] = st
		for _, s := range st {
			fmt.Fprintf(o.Out, "%3d clients  %-16s %7d  %8.0f/s  p50 %v  p99 %v\n", n, s.Name, len(s.Lat), s.PerSec, s.Lat.q(0.5).Round(time.Microsecond), s.Lat.q(0.99).Round(time.Microsecond))
		}
	}
	samples, err := lostLatency(ctx, sock, o)
	if err != nil {
		return nil, err
	}
	time.Sleep(200 * time.Millisecond) // the traces flush every 50 ms
	xs, gs := map[uint64]int64{}, map[uint64]int64{}
	for _, name := range names {
		recs, err := frametrace.Read(trace(name))
		if err != nil {
			return nil, err
		}
		for _, rec := range recs {
			switch rec.Type {
			case wire.TypeLost:
				if _, dup := xs[rec.Token]; !dup {
					xs[rec.Token] = rec.At
				}
			case wire.TypeGranted:
				gs[rec.Token] = rec.At
			}
		}
	}
	var lost, hand, lorder, corder []time.Duration
	for _, s := range samples {
		tx, okx := xs[s.lostTok]
		tg, okg := gs[s.grantTok]
		if !okx || !okg {
			r.Unmatched++
			continue
		}
		lost = append(lost, time.Duration(s.lostAt.UnixNano()-tx))
		hand = append(hand, time.Duration(s.grantAt.UnixNano()-tg))
		lorder = append(lorder, time.Duration(tg-tx))
		corder = append(corder, s.grantAt.Sub(s.lostAt))
	}
	r.Expiries = len(samples)
	r.Lost, r.Handoff, r.LeaderOrder, r.ClientOrder = sorted(lost), sorted(hand), sorted(lorder), sorted(corder)
	if len(r.Lost) == 0 {
		return nil, fmt.Errorf("no lost event matched a trace record (%d expiries; traces in %s)", len(samples), dir)
	}
	return r, nil
}

// extendCost runs n clients, each holding its own key (lease 30 s), for
// o.Rounds rounds of an EXTEND phase and a RELEASE+ACQUIRE phase.
func extendCost(ctx context.Context, sock string, n int, o ExtendOptions) ([]opStats, error) {
	type client struct {
		c   *lineClient
		key string
		tok string
	}
	cs := make([]*client, n)
	defer func() {
		for _, c := range cs {
			if c != nil {
				c.c.close()
			}
		}
	}()
	for i := range cs {
		c, err := dialLines(ctx, sock)
		if err != nil {
			return nil, err
		}
		cl := &client{c: c, key: fmt.Sprintf("extend/%d/%d", n, i)}
		cs[i] = cl
		r, _, err := c.do(ctx, "ACQUIRE "+cl.key+" 30 0")
		if err != nil || !strings.HasPrefix(r, "OK ") {
			return nil, fmt.Errorf("ACQUIRE %s: %q %v", cl.key, r, err)
		}
		cl.tok = r[3:]
	}
	var ext, cyc, rel, acq []time.Duration
	var extTime, cycTime time.Duration
	phase := func(extend bool) error {
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, n)
		var measuring, stop sync.Once
		measure, stopped := make(chan struct{}), make(chan struct{})
		for _, cl := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var e, cy, rl, aq []time.Duration
				for {
					select {
					case <-stopped:
						mu.Lock()
						ext, cyc, rel, acq = append(ext, e...), append(cyc, cy...), append(rel, rl...), append(acq, aq...)
						mu.Unlock()
						return
					default:
					}
					on := false
					select {
					case <-measure:
						on = true
					default:
					}
					t0 := time.Now()
					if extend {
						r, at, err := cl.c.do(ctx, "EXTEND "+cl.key+" "+cl.tok+" 30")
						if err != nil || r != "OK" {
							errs <- fmt.Errorf("EXTEND %s %s: %q %v", cl.key, cl.tok, r, err)
							return
						}
						if on {
							e = append(e, at.Sub(t0))
						}
						continue
					}
					r, t1, err := cl.c.do(ctx, "RELEASE "+cl.key+" "+cl.tok)
					if err != nil || r != "OK" {
						errs <- fmt.Errorf("RELEASE %s %s: %q %v", cl.key, cl.tok, r, err)
						return
					}
					r, t2, err := cl.c.do(ctx, "ACQUIRE "+cl.key+" 30 0")
					if err != nil || !strings.HasPrefix(r, "OK ") {
						errs <- fmt.Errorf("ACQUIRE %s: %q %v", cl.key, r, err)
						return
					}
					cl.tok = r[3:]
					if on {
						cy, rl, aq = append(cy, t2.Sub(t0)), append(rl, t1.Sub(t0)), append(aq, t2.Sub(t1))
					}
				}
			}()
		}
		var err error
		select {
		case <-time.After(o.Warmup):
		case err = <-errs:
		}
		start := time.Now()
		if err == nil {
			measuring.Do(func() { close(measure) })
			select {
			case <-time.After(o.Window):
			case err = <-errs:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		took := time.Since(start)
		stop.Do(func() { close(stopped) })
		wg.Wait()
		if extend {
			extTime += took
		} else {
			cycTime += took
		}
		return err
	}
	for i := 0; i < o.Rounds; i++ {
		if err := phase(true); err != nil {
			return nil, err
		}
		if err := phase(false); err != nil {
			return nil, err
		}
	}
	rate := func(k int, d time.Duration) float64 { return float64(k) / d.Seconds() }
	return []opStats{
		{"EXTEND", sorted(ext), rate(len(ext), extTime)},
		{"RELEASE+ACQUIRE", sorted(cyc), rate(len(cyc), cycTime)},
		{"RELEASE", sorted(rel), rate(len(rel), cycTime)},
		{"ACQUIRE", sorted(acq), rate(len(acq), cycTime)},
	}, nil
}

// lostSample is one expiry: the holder's token and when its `! LOST` was
// read, the waiter's token and when its `OK` was read.
type lostSample struct {
	lostTok, grantTok uint64
	lostAt, grantAt   time.Time
}

// lostLatency runs o.Pairs pairs of sessions for o.LostFor. In each pair
// one holds a key with a 1-second lease and never extends; the other waits
// for the key (ACQUIRE with a wait, queued at the leader). The leader's
// expiry of the lease tells the holder (`! LOST`) and hands the key to the
// waiter (`OK`) in one apply; then the two swap roles.
func lostLatency(ctx context.Context, sock string, o ExtendOptions) ([]lostSample, error) {
	var mu sync.Mutex
	var out []lostSample
	var wg sync.WaitGroup
	errs := make(chan error, o.Pairs)
	end := time.Now().Add(o.LostFor)
	for i := 0; i < o.Pairs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Spread the pairs' expiries over the second.
			time.Sleep(time.Duration(i) * time.Second / time.Duration(o.Pairs))
			key := fmt.Sprintf("lost/%d", i)
			var sess [2]*lineClient
			for j := range sess {
				c, err := dialLines(ctx, sock)
				if err != nil {
					errs <- err
					return
				}
				defer c.close()
				sess[j] = c
			}
			r, _, err := sess[0].do(ctx, "ACQUIRE "+key+" 1 0")
			if err != nil || !strings.HasPrefix(r, "OK ") {
				errs <- fmt.Errorf("ACQUIRE %s: %q %v", key, r, err)
				return
			}
			tok, _ := strconv.ParseUint(r[3:], 10, 64)
			holder, waiter := sess[0], sess[1]
			for time.Now().Before(end) && ctx.Err() == nil {
				type rep struct {
					line string
					at   time.Time
					err  error
				}
				got := make(chan rep, 1)
				go func() {
					l, at, err := waiter.do(ctx, "ACQUIRE "+key+" 1 5")
					got <- rep{l, at, err}
				}()
				ev, err := holder.event(ctx, 5*time.Second)
				g := <-got
				if err != nil || g.err != nil || !strings.HasPrefix(g.line, "OK ") {
					errs <- fmt.Errorf("%s: lost event %v; waiter's ACQUIRE %q %v", key, err, g.line, g.err)
					return
				}
				if ev.ev.Token != tok || ev.ev.Reason != "expired" {
					errs <- fmt.Errorf("%s: `! LOST %d %s`, want token %d expired", key, ev.ev.Token, ev.ev.Reason, tok)
					return
				}
				next, _ := strconv.ParseUint(g.line[3:], 10, 64)
				mu.Lock()
				out = append(out, lostSample{lostTok: tok, grantTok: next, lostAt: ev.at, grantAt: g.at})
				mu.Unlock()
				tok, holder, waiter = next, waiter, holder
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return out, err
	default:
	}
	return out, nil
}

// Markdown is the report (results.md).
func (r *ExtendResult) Markdown() string {
	var b strings.Builder
	o := r.Opts
	fmt.Fprintf(&b, "# EXTEND and the lost signal (issue 19)\n\n")
	fmt.Fprintf(&b, "`%s` on %s, %d CPUs, %s/%s, %s; %d node processes (`ticketlab node --frame-trace`, the product's node command) and one `ticketing sidecar` process on loopback, plaintext (the leader-side timestamps read the client stream), every client a raw unix-socket session (`HELLO 3 events`).\n\n",
		o.Command, r.When.UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), o.Nodes)
	fmt.Fprintf(&b, "Reproduce: `make bench-extend` from the repository root (`cd cmd/ticketlab && ticketlab bench extend --binary ../../bin/ticketing ...` with the flags above).\n\n")
	fmt.Fprintf(&b, "## The cost of an EXTEND\n\n")
	fmt.Fprintf(&b, "Each client holds its own key (lease 30 s) on its own connection and loops one request at a time; %d rounds of an EXTEND phase then a RELEASE+ACQUIRE phase of the same key (%v warm-up, %v measured each). EXTEND is one commit; RELEASE then ACQUIRE, the floor a holder without EXTEND pays to renew, is two.\n\n", o.Rounds, o.Warmup, o.Window)
	fmt.Fprintf(&b, "| clients | request | count | per s | p50 | p99 |\n|---:|---|---:|---:|---:|---:|\n")
	us := func(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/1e3) }
	for _, n := range o.Clients {
		for _, s := range r.Cost[n] {
			fmt.Fprintf(&b, "| %d | %s | %d | %.0f | %s | %s |\n", n, s.Name, len(s.Lat), s.PerSec, us(s.Lat.q(0.5)), us(s.Lat.q(0.99)))
		}
	}
	fmt.Fprintf(&b, "\n| clients | EXTEND ÷ RELEASE+ACQUIRE p50 | p99 | EXTENDs/s ÷ cycles/s | EXTEND ÷ ACQUIRE p50 |\n|---:|---:|---:|---:|---:|\n")
	for _, n := range o.Clients {
		s := r.Cost[n]
		e, c, a := s[0], s[1], s[3]
		fmt.Fprintf(&b, "| %d | %.2f | %.2f | %.2f | %.2f |\n", n, ratio(e.Lat.q(0.5), c.Lat.q(0.5)), ratio(e.Lat.q(0.99), c.Lat.q(0.99)), e.PerSec/c.PerSec, ratio(e.Lat.q(0.5), a.Lat.q(0.5)))
	}
	fmt.Fprintf(&b, "\n## From the expiry's commit to `! LOST` at the client\n\n")
	fmt.Fprintf(&b, "%d pairs of sessions for %v: one holds a key with a 1-second lease and never extends, the other waits for it (queued at the leader); the expiry tells the holder and hands the key to the waiter in one apply, then they swap. The commit's timestamp is the leader's: its `--frame-trace` records the wall-clock time at which the node writes each X (lost) and G (grant) frame to the sidecar's connection, which follows the apply by the connection writer's wake-up (internal/frametrace). Nodes, sidecar and clients share this machine's clock. %d expiries, %d without a trace record.\n\n",
		o.Pairs, o.LostFor, r.Expiries, r.Unmatched)
	fmt.Fprintf(&b, "| path | samples | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|---:|\n")
	row := func(name string, d dist) {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s |\n", name, len(d), us(d.q(0.5)), us(d.q(0.9)), us(d.q(0.99)), us(d.q(1)))
	}
	row("lost: leader writes X → holder reads `! LOST`", r.Lost)
	row("floor: leader writes the hand-off G → waiter reads `OK`", r.Handoff)
	row("on the leader: G written − X written", r.LeaderOrder)
	row("at the clients: `OK` read − `! LOST` read", r.ClientOrder)
	met := "met"
	if r.Lost.q(0.5) > time.Millisecond {
		met = "missed"
	}
	fmt.Fprintf(&b, "\nTarget p50 ≤ 1 ms: **%s** (p50 %s; the hand-off through the same sidecar from the same commit: %s, ratio %.2f).\n",
		met, us(r.Lost.q(0.5)), us(r.Handoff.q(0.5)), ratio(r.Lost.q(0.5), r.Handoff.q(0.5)))
	return b.String()
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
