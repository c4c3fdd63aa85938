package compare

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Workloads.
const (
	Uncontended = "uncontended"
	Contended   = "contended"
	Mixed       = "mixed"
)

// MixedKeys is the key space of the mixed workload; MixedZipfS its Zipf
// exponent.
const (
	MixedKeys  = 10000
	MixedZipfS = 1.1
)

// Result is one run: one system, one workload, one client count.
type Result struct {
	System   string  `json:"system"`
	Workload string  `json:"workload"`
	Clients  int     `json:"clients"`
	Seconds  float64 `json:"seconds"` // measured wall time
	Cycles   int     `json:"cycles"`  // acquire+release cycles completed in the window
	OpsPerS  float64 `json:"ops_per_s"`
	// Cycle latency (acquire, including any wait, + release), ms.
	P50ms  float64 `json:"p50_ms"`
	P99ms  float64 `json:"p99_ms"`
	P999ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
	// Acquire latency alone (including the wait), ms.
	AcquireP50ms float64 `json:"acquire_p50_ms"`
	AcquireP99ms float64 `json:"acquire_p99_ms"`
	// Errors during warm-up and measurement (not counting the cut at the
	// run's end); FirstError is the first one's text.
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// Contended only. Hand-offs: grant k+1 returned minus holder k's
	// release returned (negative differences, the next holder told before
	// the releaser heard back, count as 0 and are counted in
	// HandoffEarly).
	Handoffs      int     `json:"handoffs,omitempty"`
	HandoffP50ms  float64 `json:"handoff_p50_ms,omitempty"`
	HandoffP99ms  float64 `json:"handoff_p99_ms,omitempty"`
	HandoffP999ms float64 `json:"handoff_p999_ms,omitempty"`
	HandoffEarly  int     `json:"handoff_early,omitempty"`
	// Grant k+1 returned minus holder k's release sent: the whole
	// hand-off, the release's own commit included.
	HandoffSentP50ms float64 `json:"handoff_from_send_p50_ms,omitempty"`
	HandoffSentP99ms float64 `json:"handoff_from_send_p99_ms,omitempty"`
	FIFOFraction     float64 `json:"fifo_fraction,omitempty"`   // grants that went to the earliest waiting arrival
	MeanOvertakes    float64 `json:"mean_overtakes,omitempty"`  // per grant: earlier arrivals still waiting
	MaxOvertakes     int     `json:"max_overtakes,omitempty"`   // worst grant
	MaxWaitFactor    float64 `json:"max_wait_factor,omitempty"` // longest acquire ÷ (clients × mean hand-off)
	ExclusionFails   int     `json:"exclusion_fails,omitempty"` // grants while another client held the key (contended, mixed)
	Skipped          string  `json:"skipped,omitempty"`
	// CPU over the measured window (user+sys from /proc/PID/stat, every
	// thread; not the warm-up): Procs per server process; ServerCPUms
	// their sum and ServerCPUus that per cycle (per grant when
	// contended); HarnessCPUms and HarnessCPUus the same for this process
	// (the clients and, for ticketing-broker, the in-process Broker).
	// CPUNote says why they are missing.
	Procs        []ProcCPU `json:"procs,omitempty"`
	ServerCPUms  float64   `json:"server_cpu_ms,omitempty"`
	ServerCPUus  float64   `json:"server_cpu_us_per_cycle,omitempty"`
	HarnessCPUms float64   `json:"harness_cpu_ms,omitempty"`
	HarnessCPUus float64   `json:"harness_cpu_us_per_cycle,omitempty"`
	CPUNote      string    `json:"cpu_note,omitempty"`
	// Load1 is the machine's 1-minute load average at the run's end
	// (other work on the machine shows here).
	Load1 float64 `json:"load1"`
}

// RunConfig is one run's shape.
type RunConfig struct {
	Workload string
	Clients  int
	Warmup   time.Duration
	Duration time.Duration
	Prefix   string // key prefix unique to the run
}

// keysFor lists every key a run may use.
func keysFor(rc RunConfig) []string {
	switch rc.Workload {
	case Uncontended:
		out := make([]string, rc.Clients)
		for i := range out {
			out[i] = fmt.Sprintf("%s/u/%d", rc.Prefix, i)
		}
		return out
	case Contended:
		return []string{rc.Prefix + "/c"}
	default:
		out := make([]string, MixedKeys)
		for i := range out {
			out[i] = fmt.Sprintf("%s/m/%d", rc.Prefix, i)
		}
		return out
	}
}

// recorder keeps the shared, in-process bookkeeping of a run: grant order,
// arrivals, hand-off times and holders. One mutex; the lock services under
// test are milliseconds away, so it costs nothing measurable.
type recorder struct {
	mu        sync.Mutex
	measuring bool
	start     time.Time // monotonic clock (time.Now carries it)

	// contended
	arrivals   uint64
	waiting    map[int]arrival // client → its current arrival
	tries      map[int]int     // client → acquires called so far
	grants     []time.Time     // by grant sequence
	released   []time.Time     // by grant sequence; zero until released
	sent       []time.Time     // by grant sequence: release sent
	measured   []bool          // by grant sequence: granted inside the window
	fifo       int
	overtakes  int
	maxOver    int
	fairGrants int

	// contended and mixed
	holders   map[string]int
	exclusion int

	errors   int
	firstErr string
}

// arrival is one call to acquire: its place in the arrival order, and
// whether it is its client's first.
type arrival struct {
	seq   uint64
	first bool
}

func newRecorder() *recorder {
	return &recorder{waiting: map[int]arrival{}, tries: map[int]int{}, holders: map[string]int{}}
}

func (r *recorder) arrive(client int) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.arrivals++
	r.tries[client]++
	r.waiting[client] = arrival{seq: r.arrivals, first: r.tries[client] == 1}
	return r.arrivals
}

func (r *recorder) gaveUp(client int) {
	r.mu.Lock()
	delete(r.waiting, client)
	r.mu.Unlock()
}

// granted records a grant of key to client at t; it returns the grant's
// sequence number (contended).
func (r *recorder) granted(contended bool, client int, key string, t time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holders[key]++
	if r.holders[key] > 1 {
		r.exclusion++
	}
	if !contended {
		return -1
	}
	seq := len(r.grants)
	r.grants = append(r.grants, t)
	r.released = append(r.released, time.Time{})
	r.sent = append(r.sent, time.Time{})
	r.measured = append(r.measured, r.measuring)
	mine, ok := r.waiting[client]
	delete(r.waiting, client)
	// Every client's first acquire is left out of the fairness figures:
	// all clients start at once, so those requests reach the server in an
	// arbitrary order, and a queue whose first round outlasts the warm-up
	// would show that order as overtakes.
	if ok && !mine.first && r.measuring {
		over := 0
		for _, a := range r.waiting {
			if !a.first && a.seq < mine.seq {
				over++
			}
		}
		r.fairGrants++
		if over == 0 {
			r.fifo++
		}
		r.overtakes += over
		r.maxOver = max(r.maxOver, over)
	}
	return seq
}

// releasing is called just before a release is sent.
func (r *recorder) releasing(key string, seq int, t time.Time) {
	r.mu.Lock()
	r.holders[key]--
	if seq >= 0 {
		r.sent[seq] = t
	}
	r.mu.Unlock()
}

func (r *recorder) releasedAt(seq int, t time.Time) {
	if seq < 0 {
		return
	}
	r.mu.Lock()
	r.released[seq] = t
	r.mu.Unlock()
}

func (r *recorder) fail(err error) {
	r.mu.Lock()
	r.errors++
	if r.firstErr == "" {
		r.firstErr = err.Error()
	}
	r.mu.Unlock()
}

// maxErrors ends a run early: a system that fails this often is reported
// with its errors rather than measured.
const maxErrors = 1000

// run runs one workload on one system.
func run(ctx context.Context, sys System, rc RunConfig) (Result, error) {
	res := Result{System: sys.Name(), Workload: rc.Workload, Clients: rc.Clients}
	if err := sys.Prepare(ctx, keysFor(rc)); err != nil {
		return res, fmt.Errorf("prepare: %w", err)
	}
	clients, done, err := sys.Clients(ctx, rc.Clients)
	if err != nil {
		return res, fmt.Errorf("clients: %w", err)
	}
	defer done()
	defer closeAll(clients)
	// The server processes, and who leads, before the clients start.
	procs, cpuErr := sys.Processes(ctx)

	rec := newRecorder()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stop atomic.Bool
	contended := rc.Workload == Contended
	lat := make([][]time.Duration, rc.Clients)
	acq := make([][]time.Duration, rc.Clients)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func(i int, c Client) {
			defer wg.Done()
			var zipf *rand.Zipf
			if rc.Workload == Mixed {
				zipf = rand.NewZipf(rand.New(rand.NewPCG(uint64(i)+1, 0x7469636b6574)), MixedZipfS, 1, MixedKeys-1)
			}
			key := fmt.Sprintf("%s/u/%d", rc.Prefix, i)
			if contended {
				key = rc.Prefix + "/c"
			}
			for !stop.Load() {
				if zipf != nil {
					key = fmt.Sprintf("%s/m/%d", rc.Prefix, zipf.Uint64())
				}
				if contended {
					rec.arrive(i)
				}
				t0 := time.Now()
				h, err := c.Acquire(runCtx, key)
				tg := time.Now()
				if err != nil {
					if contended {
						rec.gaveUp(i)
					}
					if stop.Load() || runCtx.Err() != nil {
						return
					}
					rec.fail(fmt.Errorf("acquire: %w", err))
					time.Sleep(10 * time.Millisecond)
					continue
				}
				seq := rec.granted(contended, i, key, tg)
				rec.releasing(key, seq, time.Now())
				rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
				err = h.Release(rctx)
				rcancel()
				tr := time.Now()
				if err != nil {
					if stop.Load() {
						return
					}
					rec.fail(fmt.Errorf("release: %w", err))
					time.Sleep(10 * time.Millisecond)
					continue
				}
				rec.releasedAt(seq, tr)
				rec.mu.Lock()
				m := rec.measuring
				rec.mu.Unlock()
				if m {
					lat[i] = append(lat[i], tr.Sub(t0))
					acq[i] = append(acq[i], tg.Sub(t0))
				}
			}
		}(i, c)
	}

	failed := func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.errors >= maxErrors
	}
	sleep := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) && !failed() && ctx.Err() == nil {
			time.Sleep(min(50*time.Millisecond, time.Until(end)))
		}
	}
	sleep(rc.Warmup)
	var cpu0, cpu1 cpuSample
	if cpuErr == nil {
		cpu0, cpuErr = sampleCPU(procs)
	}
	rec.mu.Lock()
	rec.start = time.Now()
	rec.measuring = true
	rec.mu.Unlock()
	sleep(rc.Duration)
	rec.mu.Lock()
	rec.measuring = false
	end := time.Now()
	rec.mu.Unlock()
	if cpuErr == nil {
		cpu1, cpuErr = sampleCPU(procs)
	}
	stop.Store(true)
	cancel()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(60 * time.Second):
		return res, fmt.Errorf("clients did not stop within 60 s of the run's end")
	}

	elapsed := end.Sub(rec.start)
	res.Load1 = load1()
	res.Seconds = elapsed.Seconds()
	res.Errors, res.FirstError = rec.errors, rec.firstErr
	res.ExclusionFails = rec.exclusion
	var all, acqAll []time.Duration
	for i := range lat {
		all = append(all, lat[i]...)
		acqAll = append(acqAll, acq[i]...)
	}
	res.Cycles = len(all)
	ops := len(all) // what ops/s counts: cycles, or grants when contended
	if elapsed > 0 {
		res.OpsPerS = float64(len(all)) / elapsed.Seconds()
	}
	if len(all) > 0 {
		sortDur(all)
		sortDur(acqAll)
		res.P50ms, res.P99ms, res.P999ms = ms(q(all, 0.5)), ms(q(all, 0.99)), ms(q(all, 0.999))
		res.MaxMs = ms(all[len(all)-1])
		res.AcquireP50ms, res.AcquireP99ms = ms(q(acqAll, 0.5)), ms(q(acqAll, 0.99))
	}
	if contended {
		// Hand-offs and hand-offs/s: grants inside the window.
		var hs, hsent []time.Duration
		grants := 0
		for k := range rec.grants {
			if !rec.measured[k] {
				continue
			}
			grants++
			if k > 0 && !rec.sent[k-1].IsZero() {
				hsent = append(hsent, max(rec.grants[k].Sub(rec.sent[k-1]), 0))
			}
			if k == 0 || rec.released[k-1].IsZero() {
				continue
			}
			d := rec.grants[k].Sub(rec.released[k-1])
			if d < 0 {
				res.HandoffEarly++
				d = 0
			}
			hs = append(hs, d)
		}
		res.OpsPerS = float64(grants) / elapsed.Seconds()
		ops = grants
		res.Handoffs = len(hs)
		if len(hsent) > 0 {
			sortDur(hsent)
			res.HandoffSentP50ms, res.HandoffSentP99ms = ms(q(hsent, 0.5)), ms(q(hsent, 0.99))
		}
		if len(hs) > 0 {
			sortDur(hs)
			res.HandoffP50ms, res.HandoffP99ms, res.HandoffP999ms = ms(q(hs, 0.5)), ms(q(hs, 0.99)), ms(q(hs, 0.999))
			if len(acqAll) > 0 && grants > 0 {
				mean := elapsed.Seconds() / float64(grants)
				res.MaxWaitFactor = acqAll[len(acqAll)-1].Seconds() / (float64(rc.Clients) * mean)
			}
		}
		if rec.fairGrants > 0 {
			res.FIFOFraction = float64(rec.fifo) / float64(rec.fairGrants)
			res.MeanOvertakes = float64(rec.overtakes) / float64(rec.fairGrants)
			res.MaxOvertakes = rec.maxOver
		}
	}
	if cpuErr != nil {
		res.CPUNote = "CPU not measured: " + cpuErr.Error()
	} else {
		setCPU(&res, procs, cpu0, cpu1, ops)
	}
	if rec.errors >= maxErrors {
		return res, fmt.Errorf("%d errors, first: %s", rec.errors, rec.firstErr)
	}
	return res, nil
}

func sortDur(d []time.Duration) { sort.Slice(d, func(i, j int) bool { return d[i] < d[j] }) }

func q(d []time.Duration, f float64) time.Duration { return d[int(f*float64(len(d)-1))] }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var v float64
	if _, err := fmt.Sscan(string(b), &v); err != nil {
		return 0
	}
	return v
}
