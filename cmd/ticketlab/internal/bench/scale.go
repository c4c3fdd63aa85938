package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"ticketing/cluster/client"
	"ticketing/cluster/localproc"
	"ticketing/cluster/wire"
)

// benchScale measures, on node processes, what a large lock table costs:
// resident memory per held key and per queued waiter, and uncontended
// throughput with 1,000 keys held against throughput with keys held.
// Leases are 250 s (the maximum), so everything runs within that.
func benchScale(ctx context.Context, p *localproc.Procs, keys, waiters, clients int, warmup, duration time.Duration, out io.Writer) error {
	li, err := p.Leader(ctx)
	if err != nil {
		return err
	}
	// Each node's Go heap after a forced GC, read from its profiler (the
	// bench starts the nodes with --pprof-addr): resident memory would
	// also count garbage not yet collected and pages not yet returned.
	profAddrs, err := profilerAddrs(p)
	if err != nil {
		return err
	}
	heap := func() ([]int64, error) {
		var r []int64
		for _, a := range profAddrs {
			h, err := heapAfterGC(ctx, a)
			if err != nil {
				return nil, err
			}
			r = append(r, h)
		}
		return r, nil
	}
	rss := func() []int {
		var r []int
		for i := 0; i < p.Size(); i++ {
			kib, _ := vmRSS(p.Pid(i))
			r = append(r, kib)
		}
		return r
	}
	if err := holdKeys(ctx, p, li, "base/%09d", 1000, 0); err != nil {
		return err
	}
	base, err := benchThroughput(ctx, p, clients, warmup, duration, out)
	if err != nil {
		return err
	}
	h0, err := heap()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := holdKeys(ctx, p, li, "seat/%09d", keys, 0); err != nil {
		return err
	}
	fill := time.Since(start)
	if l, err := p.Leader(ctx); err == nil {
		li = l // the fill may have seen a leader change
	}
	h1, err := heap()
	if err != nil {
		return err
	}
	r1 := rss()
	st, err := p.Status(ctx, li)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "scale: %d keys held (filled in %v, %.0f acquires/s)\n", st.Held, fill.Round(time.Millisecond), float64(keys)/fill.Seconds())
	for i := range h1 {
		role := "follower"
		if i == li {
			role = "leader"
		}
		fmt.Fprintf(out, "scale: node %s (%s): Go heap %d MiB with 1,000 keys, %d MiB with %d: %.0f bytes per held key; VmRSS %d MiB\n",
			p.ID(i), role, h0[i]>>20, h1[i]>>20, st.Held, float64(h1[i]-h0[i])/float64(st.Held-1000), r1[i]>>10)
	}
	big, err := benchThroughput(ctx, p, clients, warmup, duration, out)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "scale: throughput with %d keys held is %.2f× the throughput with 1,000 (%.0f vs %.0f cycles/s)\n",
		st.Held, big/base, big, base)

	if waiters > 0 {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- holdKeys(wctx, p, li, "seat/%09d", waiters, 120*time.Second) }()
		// Until all are queued, or the count has stopped growing for 2 s.
		deadline := time.Now().Add(2 * time.Minute)
		var last uint64
		lastChange := time.Now()
		for {
			st, err = p.Status(ctx, li)
			if err != nil {
				return err
			}
			if st.Waiting != last {
				last, lastChange = st.Waiting, time.Now()
			}
			if st.Waiting >= uint64(waiters) || time.Since(lastChange) > 2*time.Second || time.Now().After(deadline) {
				break
			}
			select {
			case err := <-errc:
				return fmt.Errorf("queueing waiters: %v (%d queued)", err, st.Waiting)
			case <-time.After(100 * time.Millisecond):
			}
		}
		h2, err := heap()
		if err != nil {
			return err
		}
		r2 := rss()
		for i := range h2 {
			fmt.Fprintf(out, "scale: node %s: Go heap %d MiB with %d waiters queued: %.0f bytes per waiter; VmRSS %d MiB\n",
				p.ID(i), h2[i]>>20, st.Waiting, float64(h2[i]-h1[i])/float64(st.Waiting), r2[i]>>10)
		}
		cancel()
		// The waiters' loop, ended by cancel above: its error is that.
		//lint:ignore S1005 the blank assignment makes the dropped error explicit for errcheck
		_ = <-errc
	}
	return nil
}

// holdKeys sends an acquire for each of n keys (format with an index) from
// 4 connections to node li with up to 1024 in flight each, and waits for
// every reply (wait 0: try once; otherwise the acquires queue behind the
// holders and the function returns when ctx ends). Refusals are not
// retried: a figure over fewer keys shows in the counts printed.
func holdKeys(ctx context.Context, p *localproc.Procs, li int, format string, n int, wait time.Duration) error {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	// Up to five passes over the keys not granted (a connection cut off
	// under the burst, or a leader change: each pass goes to the leader of
	// the moment); waiting acquires go out once.
	for pass := 0; pass < 5 && len(idx) > 0; pass++ {
		if pass > 0 {
			if l, err := p.Leader(ctx); err == nil {
				li = l
			}
		}
		missing, err := sendAcquires(ctx, p, li, format, idx, wait, pass > 0)
		if err != nil || wait > 0 {
			return err
		}
		idx = missing
	}
	if len(idx) > 0 {
		return fmt.Errorf("%d of %d keys not granted after five passes", len(idx), n)
	}
	return nil
}

// sendAcquires acquires the keys at idx and returns those not granted. On a
// retry, busy counts as granted: nobody else takes these keys, so the key
// was granted to an earlier acquire whose reply was lost (indeterminate).
func sendAcquires(ctx context.Context, p *localproc.Procs, li int, format string, idx []int, wait time.Duration, retry bool) ([]int, error) {
	n := len(idx)
	var mu sync.Mutex
	var missing []int
	var next atomic.Int64
	var wg sync.WaitGroup
	conns := 4
	if wait > 0 {
		conns = max(4, (n+3999)/4000) // MaxInFlightPerConn is 4096
	}
	perConn, owner := 1024, "holder"
	if wait > 0 {
		perConn, owner = 4000, "waiter" // locks are not reentrant: waiters are another owner
	}
	for w := 0; w < conns; w++ {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := p.Dial(dctx, li)
		cancel()
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		sem := make(chan struct{}, perConn)
		wg.Add(1)
		go func(conn *client.Conn) {
			defer wg.Done()
			var inner sync.WaitGroup
			defer inner.Wait()
			for ctx.Err() == nil {
				j := next.Add(1) - 1
				if j >= int64(n) {
					return
				}
				i := idx[j]
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				call, err := conn.Start(wire.Msg{Type: wire.TypeAcquire, Key: fmt.Sprintf(format, i), Owner: owner,
					Lease: 250, WaitMs: uint32(wait / time.Millisecond)})
				if err != nil {
					<-sem
					mu.Lock()
					missing = append(missing, i)
					mu.Unlock()
					return
				}
				inner.Add(1)
				go func() {
					defer inner.Done()
					select {
					case <-call.Done:
						held := call.Reply.Type == wire.TypeGranted || retry && call.Reply.Type == wire.TypeBusy
						if call.Err != nil || !held {
							if os.Getenv("TICKETING_BENCH_DEBUG") != "" {
								fmt.Fprintln(os.Stderr, "acquire", i, "->", call.Err, wire.TypeName(call.Reply.Type), call.Reply.Text)
							}
							mu.Lock()
							missing = append(missing, i)
							mu.Unlock()
						}
					case <-ctx.Done():
					}
					<-sem
				}()
			}
		}(conn)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		<-done
	}
	// Indices never sent (a worker stopped early) count as missing too.
	for j := next.Load(); j < int64(n); j++ {
		missing = append(missing, idx[j])
	}
	return missing, nil
}

// profilerAddrs reads each node's profiler address from its log.
func profilerAddrs(p *localproc.Procs) ([]string, error) {
	var out []string
	for i := 0; i < p.Size(); i++ {
		b, err := os.ReadFile(p.LogFile(i))
		if err != nil {
			return nil, err
		}
		m := regexp.MustCompile(`msg="profiler listening" addr=(\S+)`).FindAllSubmatch(b, -1)
		if len(m) == 0 {
			return nil, fmt.Errorf("node %s logged no profiler address", p.ID(i))
		}
		out = append(out, string(m[len(m)-1][1]))
	}
	return out, nil
}

// heapAfterGC asks a node's profiler for a heap profile after a GC and
// returns its HeapAlloc in bytes.
func heapAfterGC(ctx context.Context, addr string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/debug/pprof/heap?gc=1&debug=1", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }() // read only
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`# HeapAlloc = (\d+)`).FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("no HeapAlloc in the heap profile of %s", addr)
	}
	return strconv.ParseInt(string(m[1]), 10, 64)
}
