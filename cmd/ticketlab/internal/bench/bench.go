package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/localproc"
	"ticketing/cluster/wire"
)

// benchFailover stops the leader with sig kills times and measures, each
// time, how long from the signal until some other node grants a lock.
func benchFailover(ctx context.Context, p *localproc.Procs, kills int, sig syscall.Signal, out io.Writer) error {
	var times []time.Duration
	for k := 0; k < kills; k++ {
		if err := waitHealthy(ctx, p); err != nil {
			return err
		}
		li, err := p.Leader(ctx)
		if err != nil {
			return err
		}
		start := time.Now()
		// Signal returns once the process has exited; a SIGTERMed leader
		// hands over first, so the grant may come before that.
		stopped := make(chan error, 1)
		go func() { stopped <- p.Signal(li, sig) }()
		d, err := firstGrant(ctx, p, li, start, fmt.Sprintf("failover/%d", k))
		if serr := <-stopped; serr != nil {
			return serr
		}
		if err != nil {
			return err
		}
		times = append(times, d)
		fmt.Fprintf(out, "stop %d: leader %s sent %v, next grant after %v\n", k+1, p.ID(li), sig, d.Round(time.Millisecond))
		if err := p.Start(li); err != nil {
			return err
		}
	}
	sorted := append([]time.Duration(nil), times...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	fmt.Fprintf(out, "failover over %d × %v: median %v, min %v, max %v\n", len(sorted), sig,
		sorted[len(sorted)/2].Round(time.Millisecond), sorted[0].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
	return nil
}

// waitHealthy waits until every node runs, a leader serves and every node
// has applied what the leader committed, then lets heartbeats settle.
func waitHealthy(ctx context.Context, p *localproc.Procs) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ok := true
		var commit uint64
		var applied []uint64
		for i := 0; i < p.Size(); i++ {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := p.Status(sctx, i)
			cancel()
			if err != nil || st.LeaderID == "" {
				ok = false
				break
			}
			if st.Role == wire.RoleLeader {
				commit = st.Commit
			}
			applied = append(applied, st.Applied)
		}
		if ok && commit > 0 {
			for _, a := range applied {
				if a < commit {
					ok = false
				}
			}
			if ok {
				time.Sleep(500 * time.Millisecond)
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("cluster not healthy within 60s")
}

// firstGrant probes every node but dead until one grants key; it returns the
// time since start.
func firstGrant(ctx context.Context, p *localproc.Procs, dead int, start time.Time, key string) (time.Duration, error) {
	conns := map[int]*client.Conn{}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for attempt := 0; time.Since(start) < 60*time.Second; attempt++ {
		for i := 0; i < p.Size(); i++ {
			if i == dead {
				continue
			}
			c := conns[i]
			if c == nil {
				dctx, cancel := context.WithTimeout(ctx, time.Second)
				var err error
				c, err = p.Dial(dctx, i)
				cancel()
				if err != nil {
					continue
				}
				conns[i] = c
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			r, _, err := c.Do(rctx, wire.Msg{Type: wire.TypeAcquire, Key: fmt.Sprintf("%s/%d", key, attempt), Owner: "bench", Lease: 5})
			cancel()
			if err != nil {
				c.Close()
				delete(conns, i)
				continue
			}
			if r.Type == wire.TypeGranted {
				return time.Since(start), nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, fmt.Errorf("no grant within 60s of the kill")
}

// benchThroughput runs uncontended acquire+release cycles, each client on its
// own connection to the leader and its own key.
func benchThroughput(ctx context.Context, p *localproc.Procs, clients int, warmup, duration time.Duration, out io.Writer) (float64, error) {
	li, err := p.Leader(ctx)
	if err != nil {
		return 0, err
	}
	var measuring atomic.Bool
	stop := make(chan struct{})
	lat := make([][]time.Duration, clients)
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := p.Dial(dctx, li)
		cancel()
		if err != nil {
			close(stop)
			wg.Wait()
			return 0, err
		}
		wg.Add(1)
		go func(c int, conn *client.Conn) {
			defer wg.Done()
			defer conn.Close()
			key := fmt.Sprintf("bench/%d", c)
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				r, _, err := conn.Do(ctx, wire.Msg{Type: wire.TypeAcquire, Key: key, Owner: "bench", Lease: 30})
				if err == nil && r.Type != wire.TypeGranted {
					err = fmt.Errorf("acquire: got %c", r.Type)
				}
				if err == nil {
					r, _, err = conn.Do(ctx, wire.Msg{Type: wire.TypeRelease, Key: key, Owner: "bench", Token: r.Token})
					if err == nil && r.Type != wire.TypeOK {
						err = fmt.Errorf("release: got %c %s", r.Type, r.Text)
					}
				}
				if err != nil {
					errs <- err
					return
				}
				if measuring.Load() {
					lat[c] = append(lat[c], time.Since(t0))
				}
			}
		}(c, conn)
	}
	time.Sleep(warmup)
	cpu0 := nodesCPU(p)
	self0 := selfCPU()
	measuring.Store(true)
	start := time.Now()
	select {
	case <-time.After(duration):
	case err = <-errs:
	}
	measuring.Store(false)
	elapsed := time.Since(start)
	cpu1 := nodesCPU(p)
	self1 := selfCPU()
	close(stop)
	wg.Wait()
	if err != nil {
		return 0, err
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	if len(all) == 0 {
		return 0, fmt.Errorf("no cycle completed")
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	q := func(f float64) time.Duration { return all[int(f*float64(len(all)-1))] }
	perSec := float64(len(all)) / elapsed.Seconds()
	fmt.Fprintf(out, "throughput: %d clients, %d nodes, %v: %d acquire+release cycles, %.0f cycles/s; cycle latency p50 %v p99 %v p99.9 %v\n",
		clients, p.Size(), elapsed.Round(time.Millisecond), len(all), perSec,
		q(0.5).Round(time.Microsecond), q(0.99).Round(time.Microsecond), q(0.999).Round(time.Microsecond))
	var nodes time.Duration
	for i := range cpu1 {
		nodes += cpu1[i] - cpu0[i]
	}
	if n := time.Duration(len(all)); n > 0 && len(cpu0) == len(cpu1) {
		fmt.Fprintf(out, "throughput: CPU (user+sys) per cycle: %v in the %d nodes (leader %v), %v in the clients; machine busy %.0f%% of %d cores\n",
			(nodes / n).Round(time.Microsecond), p.Size(), ((cpu1[li] - cpu0[li]) / n).Round(time.Microsecond),
			((self1 - self0) / n).Round(time.Microsecond), 100*(nodes+self1-self0).Seconds()/elapsed.Seconds()/float64(runtime.NumCPU()), runtime.NumCPU())
	}
	return perSec, nil
}

// nodesCPU is each node process's CPU time so far (user+sys, from /proc).
func nodesCPU(p *localproc.Procs) []time.Duration {
	var out []time.Duration
	for i := 0; i < p.Size(); i++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid(i)))
		if err != nil {
			return nil
		}
		// Fields after the ")" that ends the command name: state is the
		// 1st, utime the 12th and stime the 13th (clock ticks, 100 Hz).
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			return nil
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		out = append(out, time.Duration(ut+st)*10*time.Millisecond)
	}
	return out
}

// selfCPU is this process's CPU time so far (the benchmark's clients).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
