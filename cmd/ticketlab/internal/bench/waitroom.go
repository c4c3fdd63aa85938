package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/localproc"
	"ticketing/unixapi"
)

// WaitRoomOptions configures RunWaitRoom (`ticketlab bench waitroom`).
type WaitRoomOptions struct {
	// Binary is the ticketing executable (nodes and the sidecar).
	Binary string
	// Dir holds the cluster, the sidecar's log and its socket.
	Dir string
	// Nodes is the cluster size (3 or 5); TLS runs nodes and sidecar over
	// TLS; NodeArgs are extra flags for every node.
	Nodes    int
	TLS      bool
	NodeArgs []string
	// Waiters is the size of the room: acquires queued on one hot key.
	Waiters int
	// PerConn is how many of them one unix connection pipelines (at most
	// the sidecar's per-connection limit; today MaxInFlight, 256).
	PerConn int
	// BaselineWaiters is the small room of the baseline: that many
	// connections cycling acquire → release on another hot key.
	BaselineWaiters int
	// Warmup, then Duration: the baseline's measured window, and the
	// window with the room full before it drains.
	Warmup, Duration time.Duration
	// Stall ends the drain when no waiter was granted for this long.
	Stall time.Duration
	// MaxWaitersPerKey is passed to the nodes (--max-waiters-per-key).
	MaxWaitersPerKey int
	// Kills is how many times the serving leader is SIGKILLed while the
	// room drains (and started again at once from its data directory):
	// the k-th kill once k/(Kills+1) of the room has a final reply. Zero:
	// none (issue 20's room); issue 31's target is 3.
	Kills int
	// Positions makes every room connection agree `HELLO 7 events`, so
	// the sidecar pushes each waiter's `! POSITION` (issue 41); the report
	// then gives the events' rate, whether each waiter's place only went
	// down, and the estimates' error against the actual grants.
	Positions bool
	// Out hears the progress and the report.
	Out io.Writer
}

// Issue 20's targets for the waiting room.
const (
	roomSecondP50Target = 2.0  // second client's p50 with the room ÷ without
	roomSidecarTarget   = 2048 // bytes per waiter on the sidecar
	roomLeaderTarget    = 1024 // bytes per waiter on the leader
	roomRateTarget      = 0.90 // hot key's hand-offs/s with the room ÷ without
)

func setupWaitRoom(fs *flag.FlagSet, e *env) func(context.Context) error {
	e.cl = &clusterFlags{}
	e.cl.register(fs, true)
	o := WaitRoomOptions{}
	fs.IntVar(&o.Waiters, "waiters", 50000, "waiters in the room: acquires queued on one hot key")
	fs.IntVar(&o.PerConn, "per-conn", 256, "waiters per unix connection (at most the sidecar's per-connection limit: MaxInFlight, 256, before issue 20)")
	fs.IntVar(&o.BaselineWaiters, "baseline-waiters", 64, "the baseline's small room: connections cycling acquire → release on a hot key")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "measured window of the baseline, and of the full room before it drains")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Second, "warm-up of the baseline before its window")
	fs.DurationVar(&o.Stall, "stall", 60*time.Second, "give up the drain when no waiter was granted for this long")
	fs.IntVar(&o.Kills, "kills", 0, "SIGKILLs of the serving leader while the room drains, evenly spread over it (each restarted at once); 0: none")
	fs.BoolVar(&o.Positions, "positions", false, "every room connection asks for its waiters' places in line (HELLO 7 events): report the ! POSITION events' rate, their monotony and the estimates' error")
	fs.IntVar(&o.MaxWaitersPerKey, "max-waiters-per-key", 0, "the nodes' --max-waiters-per-key (default: the room plus 2 batches of 4,096 and 1,024: near its bound a node may refuse up to one batch early)")
	return func(ctx context.Context) error {
		if o.Waiters < 1 || o.PerConn < 1 || o.BaselineWaiters < 1 || o.Duration <= 0 || o.Kills < 0 {
			return usageError("--waiters, --per-conn, --baseline-waiters: want at least 1; --duration: want more than 0; --kills: want 0 or more")
		}
		if o.MaxWaitersPerKey == 0 {
			o.MaxWaitersPerKey = o.Waiters + 2*4096 + 1024
		}
		o.Binary, o.Dir, o.Nodes, o.TLS, o.NodeArgs, o.Out = *e.cl.binary, e.dir, e.cl.nodes, e.cl.tls, strings.Fields(e.cl.nodeArgs), e.stdout
		r, err := RunWaitRoom(ctx, o)
		if r != nil {
			fmt.Fprintln(e.stdout, r)
		}
		return err
	}
}

// WaitRoomReport is what RunWaitRoom measured.
type WaitRoomReport struct {
	Waiters, PerConn, Conns, BaselineWaiters int
	// Baseline: hand-offs/s of the small room, the second client's
	// cycles meanwhile.
	BaseRate   float64
	BaseSecond latencies
	// Queued is the leader's count of waiters with the room full; Fill
	// how long the room took to fill.
	Queued uint64
	Fill   time.Duration
	// VmRSS in KiB of the sidecar and the leader, before the room and
	// with it full.
	SidecarRSS0, SidecarRSS1, LeaderRSS0, LeaderRSS1 int
	// The second client with the room full, and while it drained.
	FullSecond, DrainSecond latencies
	// Cycles of the second client that failed in each window, and its
	// first failure.
	BaseFailed, FullFailed, DrainFailed int
	SecondErr                           string
	// GateRefused counts refusals of the gate's RELEASE (GateErr the
	// last); the room does not drain if the gate never got it through.
	GateRefused int
	GateErr     string
	// The drain: grants of room waiters, the time from the gate's
	// release to the last grant, and the other final replies.
	Granted   int
	Drain     time.Duration
	Other     map[string]int    // final replies other than OK, by kind
	Sample    map[string]string // the first reply of each kind of Other
	Stalled   int               // waiters without a final reply when the drain stalled
	StallNote string            // what the leader held and queued then
	// FIFO: violations of strict FIFO order (empty: none).
	FIFO []string
	// Kills are the leader SIGKILLs during the drain, in order.
	Kills []RoomKill
	// LeaderCPU is the leader process's CPU time (user + system) while
	// the room filled and stood full, and while it drained (0: unknown,
	// e.g. after a kill).
	LeaderCPUFill, LeaderCPUDrain time.Duration
	// Pos is what the `! POSITION` events showed (--positions), nil
	// without them.
	Pos *PositionStats
}

// PositionStats sums up the `! POSITION` events of a room.
type PositionStats struct {
	// Events is how many were read, FillEvents of them before the gate's
	// release, DrainEvents from it until the last grant.
	Events, FillEvents, DrainEvents int
	// PeakPerSec is the most read in one wall-clock second.
	PeakPerSec int
	// Told is how many waiters heard at least one; Untold the granted
	// ones that never did.
	Told, Untold int
	// Rises counts events whose place was above the waiter's previous
	// one (the place only goes down); Zero those with a place below 1;
	// FirstRise describes the first of either.
	Rises, Zero int
	FirstRise   string
	// TooLow counts events whose place was below what the grants allow:
	// a waiter told place p at read time r has exactly p−1 waiters ahead
	// at the moment the leader counted (some τ ≤ r), so its grant index
	// in the room is the grants committed by τ plus p−1. A grant j cannot
	// commit before grant j−1 was read (its holder's RELEASE is sent only
	// then), so at most readBy(r)+1 grants committed by τ, and p must be at
	// least g−readBy(r), with g its 0-based grant index. (The place's
	// upper bound needs τ's lower bound, which a pipelined room cannot
	// tell; ticketlab verify checks both on lines of known order.)
	TooLow   int
	FirstLow string
	// Err are the estimates' errors: the actual grant read time minus
	// (event read time + estimate), one per event with an estimate;
	// FirstErr the same for each waiter's first such event. Estimates are
	// whole seconds, rounded up.
	Err, FirstErr []time.Duration
	// NoEstimate counts events with `-`.
	NoEstimate int
}

// RoomKill is one leader SIGKILL during the drain.
type RoomKill struct {
	Leader string // the killed node
	// Finals and Granted are the room's final replies and grants read
	// before the kill.
	Finals, Granted int
	// Pause is the longest time between two grants read by the room
	// from the SIGKILL on (a gap ending after it, and before the next
	// kill, that starts within 5 s of it): the failover as the line sees it. Replies
	// already on their way when the leader died may still be read just
	// after the SIGKILL, so the gap from the kill itself would mislead.
	// 0: no grant after the kill.
	Pause time.Duration
	at    time.Time
}

// FIFOOK reports strict FIFO: no violation seen and the room drained.
func (r *WaitRoomReport) FIFOOK() bool { return len(r.FIFO) == 0 && r.Stalled == 0 }

// DrainRate is the hot key's hand-offs/s while the room drained.
func (r *WaitRoomReport) DrainRate() float64 {
	if r.Drain <= 0 {
		return 0
	}
	return float64(r.Granted) / r.Drain.Seconds()
}

func (r *WaitRoomReport) perWaiter(kib0, kib1 int) float64 {
	if r.Queued == 0 {
		return 0
	}
	return float64(kib1-kib0) * 1024 / float64(r.Queued)
}

func (r *WaitRoomReport) String() string {
	var b strings.Builder
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
	withP50 := max(r.FullSecond.p50, r.DrainSecond.p50)
	ratio := 0.0
	if r.BaseSecond.p50 > 0 {
		ratio = float64(withP50) / float64(r.BaseSecond.p50)
	}
	rate := 0.0
	if r.BaseRate > 0 {
		rate = r.DrainRate() / r.BaseRate
	}
	// The sidecar holds every waiter sent (a refused one's reply waits
	// behind the queued ones on its connection); the leader those queued.
	sc := float64(r.SidecarRSS1-r.SidecarRSS0) * 1024 / float64(r.Waiters)
	ld := r.perWaiter(r.LeaderRSS0, r.LeaderRSS1)
	fmt.Fprintf(&b, "\nwaitroom: %d waiters on one key through one sidecar, %d per connection on %d connections; baseline: %d waiters cycling\n",
		r.Waiters, r.PerConn, r.Conns, r.BaselineWaiters)
	fmt.Fprintf(&b, "| what | without the room (baseline) | with the room | target | |\n| --- | ---: | ---: | --- | --- |\n")
	fmt.Fprintf(&b, "| waiters queued at the leader | | %d of %d (filled in %v) | all | %s |\n", r.Queued, r.Waiters, r.Fill.Round(time.Millisecond), met(r.Queued >= uint64(r.Waiters)))
	fmt.Fprintf(&b, "| hot key hand-offs/s | %.0f | %.0f (%d grants while draining) | ≥ %.0f %% | %s |\n", r.BaseRate, r.DrainRate(), r.Granted, roomRateTarget*100, met(rate >= roomRateTarget && r.Granted > 0))
	secondOK := r.BaseFailed+r.FullFailed+r.DrainFailed == 0 && r.FullSecond.n > 0 && r.DrainSecond.n > 0
	fmt.Fprintf(&b, "| second client p50 (room full / draining) | %s | %s / %s (%.2f×) | ≤ %.0f× | %s |\n", ms(r.BaseSecond.p50), ms(r.FullSecond.p50), ms(r.DrainSecond.p50), ratio, roomSecondP50Target,
		met(secondOK && ratio <= roomSecondP50Target))
	fmt.Fprintf(&b, "| second client cycles ok / failed (room full / draining) | %d / %d | %d / %d, %d / %d | none failed | %s |\n",
		r.BaseSecond.n, r.BaseFailed, r.FullSecond.n, r.FullFailed, r.DrainSecond.n, r.DrainFailed, met(secondOK))
	fmt.Fprintf(&b, "| second client p99 (room full / draining) | %s | %s / %s | | |\n", ms(r.BaseSecond.p99), ms(r.FullSecond.p99), ms(r.DrainSecond.p99))
	fmt.Fprintf(&b, "| sidecar VmRSS per waiter sent | | %.0f bytes (%d → %d KiB) | ≤ %d | %s |\n", sc, r.SidecarRSS0, r.SidecarRSS1, roomSidecarTarget, met(r.Queued >= uint64(r.Waiters) && sc <= roomSidecarTarget))
	fmt.Fprintf(&b, "| leader VmRSS per waiter queued | | %.0f bytes (%d → %d KiB) | ≤ %d | %s |\n", ld, r.LeaderRSS0, r.LeaderRSS1, roomLeaderTarget, met(r.Queued > 0 && ld <= roomLeaderTarget))
	fmt.Fprintf(&b, "| time to drain the room | | %v | | |\n", r.Drain.Round(time.Millisecond))
	fifo := "yes: per connection in line order with increasing tokens, across the room tokens increasing in the order observed, never two holders"
	if r.Stalled > 0 && len(r.FIFO) == 0 {
		fifo = fmt.Sprintf("**no**: the drain stalled with %d waiters left (below)", r.Stalled)
	}
	if len(r.FIFO) > 0 {
		fifo = fmt.Sprintf("**no**: %d violations, the first: %s", len(r.FIFO), r.FIFO[0])
	}
	fmt.Fprintf(&b, "| strict FIFO | | %s | yes | %s |\n", fifo, met(r.FIFOOK()))
	if len(r.Kills) > 0 {
		granted := r.Granted == r.Waiters
		fmt.Fprintf(&b, "| leader SIGKILLs while draining | | %d; every waiter granted: %d of %d | all granted, in FIFO | %s |\n",
			len(r.Kills), r.Granted, r.Waiters, met(granted && r.FIFOOK()))
		for i, k := range r.Kills {
			next := "no grant after it"
			if k.Pause > 0 {
				next = fmt.Sprintf("the line's longest pause between grants from it on %v", k.Pause.Round(time.Millisecond))
			}
			fmt.Fprintf(&b, "kill %d: leader %s SIGKILLed with %d of the room answered (%d granted); %s\n", i+1, k.Leader, k.Finals, k.Granted, next)
		}
	}
	if r.LeaderCPUFill > 0 || r.LeaderCPUDrain > 0 {
		perGrant := 0.0
		if r.Granted > 0 {
			perGrant = float64(r.LeaderCPUDrain.Microseconds()) / float64(r.Granted)
		}
		fmt.Fprintf(&b, "| leader CPU (user+system) | | filling and full: %v; draining: %v, %.0f µs per grant | | |\n",
			r.LeaderCPUFill.Round(10*time.Millisecond), r.LeaderCPUDrain.Round(10*time.Millisecond), perGrant)
	}
	if ps := r.Pos; ps != nil {
		drainRate := 0.0
		if r.Drain > 0 {
			drainRate = float64(ps.DrainEvents) / r.Drain.Seconds()
		}
		fmt.Fprintf(&b, "| `! POSITION` events read | | %d (%d while filling and full, %d while draining: %.0f/s; peak %d in one second) | | |\n",
			ps.Events, ps.FillEvents, ps.DrainEvents, drainRate, ps.PeakPerSec)
		fmt.Fprintf(&b, "| waiters told their place | | %d of %d; granted without a place told: %d | | |\n", ps.Told, r.Waiters, ps.Untold)
		mono := "yes"
		if ps.Rises+ps.Zero > 0 {
			mono = fmt.Sprintf("**no**: %d rises, %d below 1; the first: %s", ps.Rises, ps.Zero, ps.FirstRise)
		}
		fmt.Fprintf(&b, "| every place ≥ 1 and only going down | | %s | yes | %s |\n", mono, met(ps.Rises+ps.Zero == 0))
		low := "none"
		if ps.TooLow > 0 {
			low = fmt.Sprintf("**%d**; the first: %s", ps.TooLow, ps.FirstLow)
		}
		fmt.Fprintf(&b, "| places below the waiters certainly ahead | | %s | none | %s |\n", low, met(ps.TooLow == 0))
		fmt.Fprintf(&b, "| estimate error, every event (grant − (read + estimate)) | | %s; %d events said `-` | | |\n", errSummary(ps.Err), ps.NoEstimate)
		fmt.Fprintf(&b, "| estimate error, each waiter's first estimate | | %s | | |\n", errSummary(ps.FirstErr))
	}
	if r.GateRefused > 0 {
		fmt.Fprintf(&b, "the gate's RELEASE of room/hot was refused %d times, the last: %s\n", r.GateRefused, r.GateErr)
	}
	if r.SecondErr != "" {
		fmt.Fprintf(&b, "the second client's first failure: %s\n", r.SecondErr)
	}
	var other []string
	for k, n := range r.Other {
		if smp := r.Sample[k]; smp != "" && smp != k {
			k += fmt.Sprintf(" (the first: %q)", smp)
		}
		other = append(other, fmt.Sprintf("%d × %s", n, k))
	}
	sort.Strings(other)
	if len(other) > 0 || r.Stalled > 0 {
		b.WriteString("room waiters not granted: " + strings.Join(other, ", "))
		if r.Stalled > 0 {
			if len(other) > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "%d still waiting when the drain stalled (no grant for the --stall time): %s", r.Stalled, r.StallNote)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// RunWaitRoom measures a waiting room on node processes and one `ticketing
// sidecar` process: first a baseline (a small room cycling on one hot key
// while a second client cycles on other keys), then a room of o.Waiters
// queued behind a gate holder on another hot key, its memory, the second
// client with the room full, and the room draining in FIFO once the gate
// releases (every waiter releases at once on its grant, on its own
// connection).
func RunWaitRoom(ctx context.Context, o WaitRoomOptions) (*WaitRoomReport, error) {
	conns := (o.Waiters + o.PerConn - 1) / o.PerConn
	r := &WaitRoomReport{Waiters: o.Waiters, PerConn: o.PerConn, Conns: conns, BaselineWaiters: o.BaselineWaiters, Other: map[string]int{}}
	p, err := localproc.Start(localproc.Options{Binary: o.Binary, Dir: filepath.Join(o.Dir, "cluster"), Nodes: o.Nodes, TLS: o.TLS,
		ExtraArgs: append(append(append([]string{}, quiet...), "--max-waiters-per-key", strconv.Itoa(o.MaxWaitersPerKey)), o.NodeArgs...)})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	li, err := p.Leader(wctx)
	cancel()
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(o.Dir, "room.sock")
	sidecarPid, stopSidecar, err := startSidecarProc(ctx, p, o.Dir, o.Binary, sock, conns+o.BaselineWaiters+64)
	if err != nil {
		return nil, err
	}
	defer stopSidecar()
	say := func(format string, a ...any) {
		if o.Out != nil {
			fmt.Fprintf(o.Out, "waitroom: "+format+"\n", a...)
		}
	}

	second, err := startSecond(ctx, sock)
	if err != nil {
		return nil, err
	}
	defer second.stop()

	// Baseline: a small room cycling.
	say("baseline: %d waiters cycling on base/hot, a second client cycling on its own keys", o.BaselineWaiters)
	base, err := startCycling(ctx, sock, "base/hot", o.BaselineWaiters)
	if err != nil {
		return nil, err
	}
	time.Sleep(o.Warmup)
	g0, t0 := base.grants.Load(), time.Now()
	time.Sleep(o.Duration)
	g1, t1 := base.grants.Load(), time.Now()
	base.stop()
	if err := base.err(); err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	r.BaseRate = float64(g1-g0) / t1.Sub(t0).Seconds()
	r.BaseSecond = second.window(t0, t1)
	r.BaseFailed, _ = second.failures(t0, t1)
	say("baseline: %.0f hand-offs/s; second client %v", r.BaseRate, r.BaseSecond)

	// The gate holds room/hot, so the room fills without hand-offs.
	gate, err := ticketing.Dial(ctx, sock)
	if err != nil {
		return nil, err
	}
	defer gate.Close()
	gateTok, err := gate.Acquire(ctx, "room/hot", 250*time.Second, 0)
	if err != nil {
		return nil, fmt.Errorf("gate: %w", err)
	}
	time.Sleep(time.Second) // let both heaps settle before the first reading
	if r.SidecarRSS0, err = vmRSS(sidecarPid); err == nil {
		r.LeaderRSS0, err = vmRSS(p.Pid(li))
	}
	if err != nil {
		return nil, err
	}

	say("filling the room: %d waiters on %d connections", o.Waiters, conns)
	room := &room{}
	fillStart := time.Now()
	cpu0, _ := cpuTime(p.Pid(li))
	if err := room.start(sock, o.Waiters, o.PerConn, o.Positions); err != nil {
		room.close()
		return nil, err
	}
	defer room.close()
	// Full: the leader's queue stops growing (the refused acquires'
	// replies wait behind the queued ones on their connections, so the
	// room cannot count them itself).
	var last uint64
	lastChange := time.Now()
	for {
		st, err := p.Status(ctx, li)
		if err != nil {
			return nil, err
		}
		if st.Waiting != last {
			last, lastChange = st.Waiting, time.Now()
		}
		if st.Waiting >= uint64(o.Waiters) || time.Since(lastChange) > 3*time.Second {
			r.Queued = st.Waiting
			r.Fill = lastChange.Sub(fillStart)
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	if r.SidecarRSS1, err = vmRSS(sidecarPid); err == nil {
		r.LeaderRSS1, err = vmRSS(p.Pid(li))
	}
	if err != nil {
		return nil, err
	}
	say("room full: %d waiters queued at the leader in %v; VmRSS sidecar %d → %d KiB, leader %d → %d KiB",
		r.Queued, r.Fill.Round(time.Millisecond), r.SidecarRSS0, r.SidecarRSS1, r.LeaderRSS0, r.LeaderRSS1)
	f0 := time.Now()
	time.Sleep(o.Duration)
	f1 := time.Now()
	r.FullSecond = second.window(f0, f1)
	r.FullFailed, _ = second.failures(f0, f1)
	say("room full: second client %v", r.FullSecond)
	cpu1, err1 := cpuTime(p.Pid(li))
	if cpu0 > 0 && err1 == nil {
		r.LeaderCPUFill = cpu1 - cpu0
	}

	// Drain: the gate releases, every waiter releases at once on its grant.
	d0 := time.Now()
	for {
		err := gate.Release(ctx, "room/hot", gateTok)
		if err == nil {
			break
		}
		// A refusal for capacity (ERR unavailable, nothing sent) may be
		// retried; the protocol keeps the lock held meanwhile.
		var e *ticketing.Error
		if !errors.As(err, &e) || e.Code != "unavailable" || time.Since(d0) > o.Stall {
			r.GateRefused++
			r.GateErr = err.Error()
			finals, _ := room.progress()
			r.Stalled = o.Waiters - finals
			r.StallNote = "the gate's RELEASE never got through, so the room never drained"
			room.report(r)
			_, first := second.failures(d0, d0)
			r.SecondErr = errString(first)
			return r, nil
		}
		r.GateRefused++
		r.GateErr = err.Error()
		time.Sleep(100 * time.Millisecond)
	}
	lastGrant := d0
	for {
		done, at := room.progress()
		if at.After(lastGrant) {
			lastGrant = at
		}
		if done == o.Waiters {
			break
		}
		if k := len(r.Kills); k < o.Kills && done >= (k+1)*o.Waiters/(o.Kills+1) {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			li, err = p.Leader(lctx)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("kill %d: %w", k+1, err)
			}
			granted := len(room.grants())
			say("kill %d: SIGKILL of leader %s with %d of %d answered (%d granted)", k+1, p.ID(li), done, o.Waiters, granted)
			killedAt := time.Now()
			if err := p.Signal(li, syscall.SIGKILL); err != nil {
				return nil, fmt.Errorf("kill %d: %w", k+1, err)
			}
			r.Kills = append(r.Kills, RoomKill{Leader: p.ID(li), Finals: done, Granted: granted, at: killedAt})
			// Started again at once: a cluster of 3 with a node down has no
			// margin left for the next kill.
			if err := p.Start(li); err != nil {
				return nil, fmt.Errorf("kill %d: restarting %s: %w", k+1, p.ID(li), err)
			}
			// The room's progress is judged from the kill on: the election
			// is not a stall.
			lastGrant = killedAt
			continue
		}
		if time.Since(lastGrant) > o.Stall {
			r.Stalled = o.Waiters - done
			if o.Kills > 0 {
				lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if l, err := p.Leader(lctx); err == nil {
					li = l
				}
				cancel()
			}
			if st, err := p.Status(ctx, li); err == nil {
				r.StallNote = fmt.Sprintf("the leader then had %d keys held and %d waiters queued: "+
					"if room/hot is among the held, it was granted to a line whose reply waits behind an earlier, ungranted line of its connection (grants out of line order), "+
					"so its holder cannot see it and the lease (250 s) must end it", st.Held, st.Waiting)
			}
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Drain = lastGrant.Sub(d0)
	if cpu2, err := cpuTime(p.Pid(li)); err == nil && len(r.Kills) == 0 && cpu1 > 0 {
		r.LeaderCPUDrain = cpu2 - cpu1
	}
	if o.Positions {
		r.Pos = room.positionStats(d0, lastGrant)
	}
	r.DrainSecond = second.window(d0, lastGrant)
	var first error
	r.DrainFailed, first = second.failures(d0, lastGrant)
	r.SecondErr = errString(first)
	room.report(r)
	say("drained: %d grants in %v", r.Granted, r.Drain.Round(time.Millisecond))
	return r, nil
}

// errSummary gives the median and p90 of the errors' absolute values, and
// the signed median (late > 0: the grant came after the estimate).
func errSummary(errs []time.Duration) string {
	if len(errs) == 0 {
		return "no estimates"
	}
	abs := make([]time.Duration, len(errs))
	signed := append([]time.Duration(nil), errs...)
	for i, e := range errs {
		abs[i] = max(e, -e)
	}
	sort.Slice(abs, func(i, j int) bool { return abs[i] < abs[j] })
	sort.Slice(signed, func(i, j int) bool { return signed[i] < signed[j] })
	q := func(d []time.Duration, f float64) time.Duration {
		return d[int(f*float64(len(d)-1))].Round(time.Millisecond)
	}
	return fmt.Sprintf("|error| median %v, p90 %v (signed median %v; %d estimates)", q(abs, 0.5), q(abs, 0.9), q(signed, 0.5), len(errs))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// startSidecarProc runs `ticketing sidecar` on p's nodes as its own
// process (its pid is for VmRSS) and returns a function that stops it.
func startSidecarProc(ctx context.Context, p *localproc.Procs, dir, bin, sock string, maxConns int) (int, func(), error) {
	args := []string{"sidecar", "--cluster", strings.Join(p.ClientAddrs(), ","),
		"--secret-file", p.SecretFile, "--cluster-id", p.ClusterID,
		"--socket", sock, "--max-conns", strconv.Itoa(maxConns), "--log-level", "warn"}
	if p.CAFile != "" {
		args = append(args, "--tls-ca", p.CAFile)
	}
	logf, err := os.Create(filepath.Join(dir, "sidecar.log"))
	if err != nil {
		return 0, nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return 0, nil, err
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt) // fails only if it has exited; Wait reaps it either way
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = ticketing.WaitReady(wctx, sock)
	cancel()
	if err != nil {
		stop()
		return 0, nil, fmt.Errorf("sidecar (log %s): %w", logf.Name(), err)
	}
	return cmd.Process.Pid, stop, nil
}

// secondClient cycles acquire → release on its own keys and remembers
// when each cycle started and how long it took.
type secondClient struct {
	c    *ticketing.Client
	done chan struct{}
	mu   sync.Mutex
	at   []time.Time
	took []time.Duration
	// failed are the start times of cycles that failed; firstErr the first.
	failed   []time.Time
	firstErr error
	stopc    chan struct{}
}

func startSecond(ctx context.Context, sock string) (*secondClient, error) {
	c, err := ticketing.Dial(ctx, sock)
	if err != nil {
		return nil, err
	}
	s := &secondClient{c: c, done: make(chan struct{}), stopc: make(chan struct{})}
	go func() {
		defer close(s.done)
		for i := 0; ; i++ {
			select {
			case <-s.stopc:
				return
			default:
			}
			key := fmt.Sprintf("second/%d", i%16)
			t0 := time.Now()
			tok, err := c.Acquire(ctx, key, 10*time.Second, 5*time.Second)
			if err == nil {
				err = c.Release(ctx, key, tok)
			}
			s.mu.Lock()
			if err != nil {
				s.failed = append(s.failed, t0)
				if s.firstErr == nil {
					s.firstErr = fmt.Errorf("%s: %w", key, err)
				}
			} else {
				s.at, s.took = append(s.at, t0), append(s.took, time.Since(t0))
			}
			s.mu.Unlock()
			if errors.Is(err, ticketing.ErrClosed) || ctx.Err() != nil {
				return
			}
			if err != nil {
				time.Sleep(10 * time.Millisecond) // a refusal comes at once: do not spin
			}
		}
	}()
	return s, nil
}

// window is the latencies of the cycles that started in [from, to).
func (s *secondClient) window(from, to time.Time) latencies {
	s.mu.Lock()
	var d []time.Duration
	for i, at := range s.at {
		if !at.Before(from) && at.Before(to) {
			d = append(d, s.took[i])
		}
	}
	s.mu.Unlock()
	if len(d) == 0 {
		return latencies{}
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	q := func(f float64) time.Duration { return d[int(f*float64(len(d)-1))] }
	return latencies{n: len(d), perSec: float64(len(d)) / to.Sub(from).Seconds(), p50: q(0.5), p99: q(0.99), max: d[len(d)-1]}
}

// failures is how many cycles started in [from, to) failed, and the
// first failure of the run.
func (s *secondClient) failures(from, to time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, at := range s.failed {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n, s.firstErr
}

func (s *secondClient) stop() {
	close(s.stopc)
	s.c.Close()
	<-s.done
}

// cycling is the baseline's small room: n connections, each looping
// ACQUIRE key 250 300 → on OK, RELEASE and ACQUIRE again.
type cycling struct {
	conns  []net.Conn
	grants atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	e      error
	closed atomic.Bool
}

func startCycling(ctx context.Context, sock, key string, n int) (*cycling, error) {
	cy := &cycling{}
	for i := 0; i < n; i++ {
		c, err := net.Dial("unix", sock)
		if err != nil {
			cy.stop()
			return nil, err
		}
		cy.conns = append(cy.conns, c)
		cy.wg.Add(1)
		go func() {
			defer cy.wg.Done()
			acq := "ACQUIRE " + key + " 250 300\n"
			if _, err := io.WriteString(c, acq); err != nil {
				cy.fail(err)
				return
			}
			br := bufio.NewReader(c)
			releases := 0 // replies to RELEASEs still ahead of the next ACQUIRE's
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					cy.fail(err)
					return
				}
				line = strings.TrimSuffix(line, "\n")
				if releases > 0 {
					releases--
					if line != "OK" {
						cy.fail(fmt.Errorf("RELEASE %s -> %s", key, line))
						return
					}
					continue
				}
				tok, ok := strings.CutPrefix(line, "OK ")
				if !ok {
					cy.fail(fmt.Errorf("ACQUIRE %s -> %s", key, line))
					return
				}
				cy.grants.Add(1)
				releases++
				if _, err := io.WriteString(c, "RELEASE "+key+" "+tok+"\n"+acq); err != nil {
					cy.fail(err)
					return
				}
			}
		}()
	}
	return cy, nil
}

func (cy *cycling) fail(err error) {
	if cy.closed.Load() {
		return
	}
	cy.mu.Lock()
	if cy.e == nil {
		cy.e = err
	}
	cy.mu.Unlock()
}

func (cy *cycling) err() error {
	cy.mu.Lock()
	defer cy.mu.Unlock()
	return cy.e
}

func (cy *cycling) stop() {
	cy.closed.Store(true)
	for _, c := range cy.conns {
		c.Close()
	}
	cy.wg.Wait()
}

// room is the waiting room: connections each pipelining their share of
// ACQUIRE room/hot 250 300 once; a grant is released at once on its
// connection. The reply stream of a connection is its acquires' replies
// in line order, then its releases'.
type room struct {
	conns []net.Conn
	wg    sync.WaitGroup

	mu        sync.Mutex
	finals    int         // acquires with a final reply
	lastGrant time.Time   // when the last grant was read
	tokens    []uint64    // grants in the order they were read
	grantAt   []time.Time // when each of tokens was read
	holding   bool        // a grant read whose RELEASE is not sent yet
	other     map[string]int
	sample    map[string]string // the first whole reply of each kind in other
	fifo      []string
	closed    bool

	// With positions (HELLO 7 events): every `! POSITION` read, and each
	// waiter's grant (its index in tokens, -1 until granted). A waiter is
	// numbered connection × perConn + its line on the connection.
	positions bool
	perConn   int
	events    []posEvent
	grantOf   []int32
	badEvents []string // event lines that did not parse
}

// posEvent is one `! POSITION` read by the room.
type posEvent struct {
	at     int64 // read time, UnixNano
	waiter int32
	pos    int32
	estMs  int32 // the estimate in ms; -1: "-"
}

func (rm *room) start(sock string, waiters, perConn int, positions bool) error {
	rm.other = map[string]int{}
	rm.sample = map[string]string{}
	rm.positions, rm.perConn = positions, perConn
	if positions {
		rm.grantOf = make([]int32, waiters)
		for i := range rm.grantOf {
			rm.grantOf[i] = -1
		}
	}
	for i := 0; waiters > 0; i++ {
		n := min(perConn, waiters)
		waiters -= n
		c, err := net.Dial("unix", sock)
		if err != nil {
			return fmt.Errorf("room connection %d: %w", i+1, err)
		}
		rm.conns = append(rm.conns, c)
		hello := ""
		if positions {
			hello = "HELLO 7 " + unixapi.HelloEvents + "\n"
		}
		if _, err := io.WriteString(c, hello+strings.Repeat("ACQUIRE room/hot 250 300\n", n)); err != nil {
			return fmt.Errorf("room connection %d: %w", i+1, err)
		}
		rm.wg.Add(1)
		go rm.read(i, c, n)
	}
	return nil
}

func (rm *room) read(i int, c net.Conn, n int) {
	defer rm.wg.Done()
	br := bufio.NewReader(c)
	var prev uint64
	if rm.positions {
		// HELLO's reply comes first (no event can precede it: nothing is
		// pending yet).
		s, err := br.ReadString('\n')
		if err == nil && s != "HELLO 7 "+unixapi.HelloEvents+"\n" {
			err = fmt.Errorf("HELLO 7 %s answered %q", unixapi.HelloEvents, strings.TrimSpace(s))
		}
		if err != nil {
			rm.mu.Lock()
			if !rm.closed {
				rm.other["HELLO: "+err.Error()] += n
				rm.finals += n
			}
			rm.mu.Unlock()
			return
		}
	}
	for line := 0; line < n; line++ {
		s, err := rm.readReply(br, i)
		if err != nil {
			rm.mu.Lock()
			if !rm.closed {
				rm.other["connection lost: "+err.Error()] += n - line
				rm.finals += n - line
			}
			rm.mu.Unlock()
			return
		}
		s = strings.TrimSuffix(s, "\n")
		tok, ok := strings.CutPrefix(s, "OK ")
		t, perr := strconv.ParseUint(tok, 10, 64)
		rm.mu.Lock()
		rm.finals++
		if !ok || perr != nil {
			k := s
			if f := strings.Fields(s); len(f) >= 2 && f[0] == "ERR" {
				k = "ERR " + f[1]
			}
			if _, seen := rm.sample[k]; !seen {
				rm.sample[k] = s
			}
			rm.other[k]++
			rm.mu.Unlock()
			continue
		}
		if t <= prev {
			rm.fifo = append(rm.fifo, fmt.Sprintf("connection %d line %d granted token %d after its earlier line's %d", i+1, line+1, t, prev))
		}
		if k := len(rm.tokens); k > 0 && t <= rm.tokens[k-1] {
			rm.fifo = append(rm.fifo, fmt.Sprintf("grant %d of the room has token %d, not above the previous grant's %d", k+1, t, rm.tokens[k-1]))
		}
		if rm.holding {
			rm.fifo = append(rm.fifo, fmt.Sprintf("connection %d line %d granted token %d while another waiter held the key", i+1, line+1, t))
		}
		prev = t
		rm.tokens = append(rm.tokens, t)
		rm.lastGrant = time.Now()
		rm.grantAt = append(rm.grantAt, rm.lastGrant)
		if rm.positions {
			rm.grantOf[i*rm.perConn+line] = int32(len(rm.tokens) - 1)
		}
		rm.holding = true
		rm.mu.Unlock()
		// The next grant can only come after this RELEASE is sent: one read
		// before it is a second holder.
		rm.mu.Lock()
		rm.holding = false
		rm.mu.Unlock()
		if _, err := io.WriteString(c, "RELEASE room/hot "+tok+"\n"); err != nil {
			return
		}
	}
	// The releases' replies follow; the connection stays open until the
	// room is closed (closing it would only release what is released).
	for line := 0; ; line++ {
		s, err := rm.readReply(br, i)
		if err != nil {
			return
		}
		if s != "OK\n" {
			rm.mu.Lock()
			rm.other["RELEASE -> "+strings.TrimSpace(s)]++
			rm.mu.Unlock()
		}
	}
}

// readReply reads connection i's next reply line, recording the event
// lines before it (`! POSITION`; the others, `! QUEUED` among them, are
// skipped).
func (rm *room) readReply(br *bufio.Reader, i int) (string, error) {
	for {
		s, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(s, "! ") {
			return s, err
		}
		if !strings.HasPrefix(s, "! POSITION ") {
			continue
		}
		at := time.Now().UnixNano()
		// ! POSITION <n> <position> <estimate-seconds|-> <key>; n counts the
		// connection's request lines from 1, HELLO's included, so its k-th
		// ACQUIRE (from 0) is line k+2: all were written before any RELEASE.
		f := strings.Fields(s)
		var ev posEvent
		ok := len(f) == 6
		if ok {
			n, err1 := strconv.Atoi(f[2])
			pos, err2 := strconv.Atoi(f[3])
			est := -1
			var err3 error
			if f[4] != "-" {
				est, err3 = strconv.Atoi(f[4])
				est *= 1000
			}
			ok = err1 == nil && err2 == nil && err3 == nil && n >= 2 && n-2 < rm.perConn
			ev = posEvent{at: at, waiter: int32(i*rm.perConn + n - 2), pos: int32(pos), estMs: int32(est)}
		}
		rm.mu.Lock()
		if ok && int(ev.waiter) < len(rm.grantOf) {
			rm.events = append(rm.events, ev)
		} else if len(rm.badEvents) < 10 {
			rm.badEvents = append(rm.badEvents, strings.TrimSpace(s))
		}
		rm.mu.Unlock()
	}
}

// progress is how many acquires have a final reply, and when the last
// grant was read.
func (rm *room) progress() (finals int, last time.Time) {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	return rm.finals, rm.lastGrant
}

// grants is the tokens granted so far, in the order they were read.
func (rm *room) grants() []uint64 {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	return append([]uint64(nil), rm.tokens...)
}

func (rm *room) report(r *WaitRoomReport) {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	for i := range r.Kills {
		k := &r.Kills[i]
		// A gap that ends after the next kill is that kill's.
		var next time.Time
		if i+1 < len(r.Kills) {
			next = r.Kills[i+1].at
		}
		for j := 1; j < len(rm.grantAt); j++ {
			from, to := rm.grantAt[j-1], rm.grantAt[j]
			if to.After(k.at) && (next.IsZero() || !to.After(next)) && from.Before(k.at.Add(5*time.Second)) && to.Sub(from) > k.Pause {
				k.Pause = to.Sub(from)
			}
		}
	}
	r.Granted = len(rm.tokens)
	for k, n := range rm.other {
		r.Other[k] += n
		if r.Sample == nil {
			r.Sample = map[string]string{}
		}
		if _, seen := r.Sample[k]; !seen && rm.sample[k] != "" {
			r.Sample[k] = rm.sample[k]
		}
	}
	r.FIFO = append(r.FIFO, rm.fifo...)
}

// positionStats sums up the `! POSITION` events read (see
// PositionStats); drainFrom is the gate's release, drainTo the last grant.
func (rm *room) positionStats(drainFrom, drainTo time.Time) *PositionStats {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	ps := &PositionStats{Events: len(rm.events)}
	last := make([]int32, len(rm.grantOf)) // each waiter's latest place told; 0: none
	firstEst := make([]bool, len(rm.grantOf))
	perSec := map[int64]int{}
	readBy := func(at int64) int { // grants read by at
		return sort.Search(len(rm.grantAt), func(j int) bool { return rm.grantAt[j].UnixNano() > at })
	}
	for _, ev := range rm.events {
		switch {
		case ev.at < drainFrom.UnixNano():
			ps.FillEvents++
		case ev.at <= drainTo.UnixNano():
			ps.DrainEvents++
		}
		perSec[ev.at/int64(time.Second)]++
		w := ev.waiter
		if ev.pos < 1 || (last[w] != 0 && ev.pos > last[w]) {
			if ev.pos < 1 {
				ps.Zero++
			} else {
				ps.Rises++
			}
			if ps.FirstRise == "" {
				ps.FirstRise = fmt.Sprintf("waiter %d told place %d after %d", w, ev.pos, last[w])
			}
		}
		if last[w] == 0 {
			ps.Told++
		}
		last[w] = ev.pos
		g := rm.grantOf[w]
		if g < 0 {
			continue
		}
		if lo := int(g) - readBy(ev.at); int(ev.pos) < lo {
			ps.TooLow++
			if ps.FirstLow == "" {
				ps.FirstLow = fmt.Sprintf("waiter %d told place %d while %d grants ahead of it were not read yet (it was grant %d of the room)", w, ev.pos, lo, g+1)
			}
		}
		if ev.estMs < 0 {
			ps.NoEstimate++
			continue
		}
		e := rm.grantAt[g].Sub(time.Unix(0, ev.at+int64(ev.estMs)*int64(time.Millisecond)))
		ps.Err = append(ps.Err, e)
		if !firstEst[w] {
			firstEst[w] = true
			ps.FirstErr = append(ps.FirstErr, e)
		}
	}
	for _, n := range perSec {
		ps.PeakPerSec = max(ps.PeakPerSec, n)
	}
	for w, g := range rm.grantOf {
		if g >= 0 && last[w] == 0 {
			ps.Untold++
		}
	}
	return ps
}

func (rm *room) close() {
	rm.mu.Lock()
	rm.closed = true
	rm.mu.Unlock()
	for _, c := range rm.conns {
		c.Close()
	}
	rm.wg.Wait()
}
