package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/cluster/localproc"
	"ticketing/unixapi"
)

// `ticketlab bench linekill` measures what a crash does to a hot key's
// waiting room (issue 31's targets): the leader SIGKILLed while a line of
// waiters drains through two sidecars, the requests in flight at the kill,
// and a sidecar SIGKILLed while its waiter heads the line. It only
// measures and prints: bad figures are figures, and only a harness failure
// (the cluster does not start or settle, a waiter is never confirmed
// queued) ends it with an error.

// LineKillOptions configures RunLineKill.
type LineKillOptions struct {
	// Binary is the ticketing executable (nodes and both sidecars).
	Binary string
	// Dir holds the cluster, the sidecars' logs and their sockets.
	Dir string
	// Nodes is the cluster size (3 or 5); TLS runs nodes and sidecars
	// over TLS; NodeArgs are extra flags for every node.
	Nodes    int
	TLS      bool
	NodeArgs []string
	// Waiters is the line queued on the hot key behind its holder, one
	// unix connection each, alternating between the two sidecars.
	Waiters int
	// Kills is how many times the leader is SIGKILLed (a fresh line and
	// hot key each time; the killed node is started again and caught up
	// before the next).
	Kills int
	// KillAfter is how many waiters are granted before the kill: the
	// holder releases, the line drains, and the leader is killed once
	// that many were granted. Zero: the holder keeps the key through the
	// kill and releases it once a new leader serves.
	KillAfter int
	// Clients cycle ACQUIRE → RELEASE on their own keys the whole time
	// (the requests in flight at a kill).
	Clients int
	// Lease is the lease of the waiters and the cycling clients: what a
	// grant nobody knows about blocks its key for.
	Lease time.Duration
	// SidecarKills is how many times the sidecar whose waiter heads a
	// hot key is SIGKILLed (after the leader kills); SidecarWaiters is
	// that line's length (its head and every other waiter through the
	// sidecar killed, the rest through the other).
	SidecarKills, SidecarWaiters int
	// Stall ends a round when no waiter got a final reply for this long.
	Stall time.Duration
	// Out hears the progress and one report per round (nil: none).
	Out io.Writer
}

// The waiters' wait and the holder's lease and wait, in seconds: the
// longest the unix API takes, so that neither runs out in a round.
const (
	lineWaitSec   = 300
	lineHolderSec = 250
	cycleWaitSec  = 5
	// inFlightMargin: a request written this long before the kill was
	// surely on its way to the leader (issue 31's target counts
	// INDETERMINATE answers only for those).
	inFlightMargin = 100 * time.Millisecond
)

func setupLineKill(fs *flag.FlagSet, e *env) func(context.Context) error {
	e.cl = &clusterFlags{}
	e.cl.register(fs, true)
	o := LineKillOptions{}
	fs.IntVar(&o.Waiters, "waiters", 1000, "waiters queued on the hot key behind its holder, each on its own unix connection, alternating between the 2 sidecars, each confirmed by `! QUEUED` before the next")
	fs.IntVar(&o.Kills, "kills", 10, "leader SIGKILLs, each under a fresh line (the killed node is restarted and caught up before the next)")
	fs.IntVar(&o.KillAfter, "kill-after", 100, "waiters granted before the leader is killed (the line is draining at the kill); 0: the holder keeps the key through the kill and releases it once a new leader serves")
	fs.IntVar(&o.Clients, "clients", 16, "clients cycling acquire → release on their own keys through the sidecars during the kills")
	fs.DurationVar(&o.Lease, "lease", 10*time.Second, "lease of the waiters and the cycling clients (whole seconds)")
	fs.IntVar(&o.SidecarKills, "sidecar-kills", 3, "SIGKILLs of the sidecar whose waiter heads a hot key (after the leader kills; 0: none)")
	fs.IntVar(&o.SidecarWaiters, "sidecar-waiters", 20, "the line of each sidecar kill: its head and every other waiter through the sidecar killed, the rest through the other")
	fs.DurationVar(&o.Stall, "stall", 30*time.Second, "end a round when no waiter got a final reply for this long")
	return func(ctx context.Context) error {
		if o.Waiters < 1 || o.Kills < 0 || o.KillAfter < 0 || o.KillAfter >= o.Waiters || o.Clients < 0 ||
			o.SidecarKills < 0 || o.SidecarWaiters < 2 || o.Lease < time.Second || o.Lease%time.Second != 0 || o.Stall <= 0 {
			return usageError("want --waiters ≥ 1, 0 ≤ --kill-after < --waiters, --kills, --clients, --sidecar-kills ≥ 0, --sidecar-waiters ≥ 2, --lease whole seconds ≥ 1s, --stall > 0")
		}
		o.Binary, o.Dir, o.Nodes, o.TLS, o.NodeArgs, o.Out = *e.cl.binary, e.dir, e.cl.nodes, e.cl.tls, strings.Fields(e.cl.nodeArgs), e.stdout
		r, err := RunLineKill(ctx, o)
		if r != nil {
			fmt.Fprint(e.stdout, r.Summary())
		}
		return err
	}
}

// KillRound is what one leader SIGKILL did.
type KillRound struct {
	N                 int
	Leader, NewLeader string // server ids of the killed and the next leader
	// Serving is from the SIGKILL until another node granted a probe
	// ACQUIRE (the failover bench's measure).
	Serving time.Duration
	// The line: its length, grants read before and after the kill,
	// whether every grant came in queue order (by token) and the first
	// that did not, and the other final replies.
	Waiters                     int
	GrantedBefore, GrantedAfter int
	Disorder                    []string
	Indeterminate, Timeout      int
	EarlyIndetWaiters           int            // INDETERMINATE waiters written > inFlightMargin before the kill
	Other                       map[string]int // other final replies, by kind
	NoReply                     int            // no final reply when the round stalled
	// HolderRelease is the holder's RELEASE reply after the kill
	// (KillAfter 0) when it was not OK.
	HolderRelease string
	// The cycling clients: INDETERMINATE answers of the round, by
	// request (acquire, release) and by when it was written (more than
	// inFlightMargin before the kill: the target's count; within it;
	// after the kill), and the answers that are not OK, BUSY, TIMEOUT or
	// INDETERMINATE.
	Indet      [2][3]int
	CycleOther map[string]int
	// OldestIndet is how long before the kill the oldest request
	// answered INDETERMINATE was written (0: none before the kill).
	OldestIndet time.Duration
	// Unavailable is the longest time from the new leader serving until
	// a client was granted its key again (UnavailableKey); Unrecovered
	// counts clients never granted within the round's guard.
	Unavailable    time.Duration
	UnavailableKey string
	Unrecovered    int
}

// Granted is every grant of the round's line.
func (r KillRound) Granted() int { return r.GrantedBefore + r.GrantedAfter }

// InOrder: every grant of the line came in the order the waiters were
// queued.
func (r KillRound) InOrder() bool { return len(r.Disorder) == 0 }

func (r KillRound) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kill %d: leader %s SIGKILLed with %d of %d waiters granted; a new leader (%s) served after %v\n",
		r.N, r.Leader, r.GrantedBefore, r.Waiters, r.NewLeader, r.Serving.Round(time.Millisecond))
	fmt.Fprintf(&b, "  line: %d of %d granted (%d of the %d waiting at the kill), in queue order: %s; INDETERMINATE %d (%d written > %v before the kill), TIMEOUT %d, other %s, no reply %d\n",
		r.Granted(), r.Waiters, r.GrantedAfter, r.Waiters-r.GrantedBefore, inOrder(r.Disorder, r.Granted()), r.Indeterminate, r.EarlyIndetWaiters, inFlightMargin, r.Timeout, kinds(r.Other), r.NoReply)
	if r.HolderRelease != "" {
		fmt.Fprintf(&b, "  the holder's RELEASE after the kill: %s\n", r.HolderRelease)
	}
	unavail := fmt.Sprintf("%v (%s)", r.Unavailable.Round(10*time.Millisecond), r.UnavailableKey)
	if r.Unrecovered > 0 {
		unavail = fmt.Sprintf("more than %v: %d clients never granted again within the round", r.Unavailable.Round(10*time.Millisecond), r.Unrecovered)
	}
	fmt.Fprintf(&b, "  in flight: INDETERMINATE to requests written > %v before the kill: %s; %s; the oldest written %v before the kill; other answers %s; longest a key was unavailable after the new leader served: %s\n",
		inFlightMargin, indetAt(r.Indet, 0), indetLater(r.Indet), r.OldestIndet.Round(time.Millisecond), kinds(r.CycleOther), unavail)
	return b.String()
}

// SidecarRound is what one sidecar SIGKILL did.
type SidecarRound struct {
	N int
	// Dead and Live are the waiters queued through the sidecar killed
	// (its first heads the line) and through the other.
	Dead, Live int
	// MovedOn is from the SIGKILL until the first grant to the other
	// sidecar's waiters was read (0 and Moved false: none).
	MovedOn time.Duration
	Moved   bool
	// ReleaseErr is the holder's RELEASE reply when it was not OK.
	ReleaseErr string
	// The other sidecar's waiters: granted, in queue order, other
	// final replies, none when the round stalled.
	Granted  int
	Disorder []string
	Other    map[string]int
	NoReply  int
}

func (r SidecarRound) String() string {
	moved := "never (within the round)"
	if r.Moved {
		moved = fmt.Sprintf("%v after the SIGKILL", r.MovedOn.Round(time.Millisecond))
	}
	s := fmt.Sprintf("sidecar kill %d: sidecar1 SIGKILLed with its waiter at the head of the line (%d of its waiters queued, %d of sidecar2's); the key moved on to sidecar2's waiters %s; sidecar2's waiters: %d of %d granted, in queue order: %s; other %s, no reply %d",
		r.N, r.Dead, r.Live, moved, r.Granted, r.Live, inOrder(r.Disorder, r.Granted), kinds(r.Other), r.NoReply)
	if r.ReleaseErr != "" {
		s += "; the holder's RELEASE: " + r.ReleaseErr
	}
	return s + "\n"
}

// LineKillReport is what RunLineKill measured.
type LineKillReport struct {
	Waiters, KillAfter, Clients int
	Lease                       time.Duration
	Rounds                      []KillRound
	Sidecar                     []SidecarRound
}

// Summary is the closing lines: the leader kills in total, then the
// sidecar kills.
func (r *LineKillReport) Summary() string {
	var b strings.Builder
	if n := len(r.Rounds); n > 0 {
		var t KillRound
		t.Other, t.CycleOther = map[string]int{}, map[string]int{}
		var serving, unavail []time.Duration
		for _, k := range r.Rounds {
			t.Waiters += k.Waiters
			t.GrantedBefore += k.GrantedBefore
			t.GrantedAfter += k.GrantedAfter
			t.Disorder = append(t.Disorder, k.Disorder...)
			t.Indeterminate += k.Indeterminate
			t.EarlyIndetWaiters += k.EarlyIndetWaiters
			t.OldestIndet = max(t.OldestIndet, k.OldestIndet)
			t.Timeout += k.Timeout
			t.NoReply += k.NoReply
			for v := range k.Indet {
				for w := range k.Indet[v] {
					t.Indet[v][w] += k.Indet[v][w]
				}
			}
			t.Unrecovered += k.Unrecovered
			for kk, v := range k.Other {
				t.Other[kk] += v
			}
			for kk, v := range k.CycleOther {
				t.CycleOther[kk] += v
			}
			serving = append(serving, k.Serving)
			unavail = append(unavail, k.Unavailable)
		}
		sortDurations(serving)
		sortDurations(unavail)
		pct := 100 * float64(t.Granted()) / float64(t.Waiters)
		when := fmt.Sprintf("killed once %d were granted", r.KillAfter)
		if r.KillAfter == 0 {
			when = "the holder keeping the key through the kill"
		}
		fmt.Fprintf(&b, "\nlinekill: %d leader SIGKILLs, each under a line of %d waiters on one hot key through 2 sidecars (%s), %d clients cycling on their own keys, lease %v\n",
			n, r.Waiters, when, r.Clients, r.Lease)
		fmt.Fprintf(&b, "| what | measured |\n| --- | --- |\n")
		fmt.Fprintf(&b, "| waiters granted | %d of %d (%.1f %%); of those still waiting at a kill: %d of %d |\n",
			t.Granted(), t.Waiters, pct, t.GrantedAfter, t.Waiters-t.GrantedBefore)
		order := inOrder(t.Disorder, t.Granted())
		if len(t.Disorder) > 0 {
			order = fmt.Sprintf("**no**: %d out of order, the first: %s", len(t.Disorder), t.Disorder[0])
		}
		fmt.Fprintf(&b, "| grants in the order queued | %s |\n", order)
		fmt.Fprintf(&b, "| the line's other answers | INDETERMINATE %d, TIMEOUT %d, other %s, no reply %d |\n", t.Indeterminate, t.Timeout, kinds(t.Other), t.NoReply)
		fmt.Fprintf(&b, "| kill → a new leader serving | median %v, min %v, max %v |\n",
			serving[n/2].Round(time.Millisecond), serving[0].Round(time.Millisecond), serving[n-1].Round(time.Millisecond))
		fmt.Fprintf(&b, "| INDETERMINATE to requests written > %v before the kill | %d waiters; of the cycling clients %s |\n",
			inFlightMargin, t.EarlyIndetWaiters, indetAt(t.Indet, 0))
		fmt.Fprintf(&b, "| the cycling clients' other INDETERMINATEs | %s; the oldest written %v before the kill; other answers %s |\n",
			indetLater(t.Indet), t.OldestIndet.Round(time.Millisecond), kinds(t.CycleOther))
		never := ""
		if t.Unrecovered > 0 {
			never = fmt.Sprintf("; %d clients never granted again within their round", t.Unrecovered)
		}
		fmt.Fprintf(&b, "| longest a key was unavailable after the new leader served | median %v, max %v%s |\n",
			unavail[n/2].Round(10*time.Millisecond), unavail[n-1].Round(10*time.Millisecond), never)
	}
	if n := len(r.Sidecar); n > 0 {
		var moved []time.Duration
		var disorder []string
		granted, live, never := 0, 0, 0
		for _, s := range r.Sidecar {
			if s.Moved {
				moved = append(moved, s.MovedOn)
			} else {
				never++
			}
			granted += s.Granted
			live += s.Live
			disorder = append(disorder, s.Disorder...)
		}
		sortDurations(moved)
		fmt.Fprintf(&b, "\nlinekill: %d SIGKILLs of the sidecar whose waiter heads the hot key (lines of %d)\n", n, r.Sidecar[0].Dead+r.Sidecar[0].Live)
		if len(moved) > 0 {
			fmt.Fprintf(&b, "| SIGKILL → the key moved on to the other sidecar's waiters | median %v, min %v, max %v", moved[len(moved)/2].Round(time.Millisecond),
				moved[0].Round(time.Millisecond), moved[len(moved)-1].Round(time.Millisecond))
			if never > 0 {
				fmt.Fprintf(&b, "; never in %d of %d", never, n)
			}
			b.WriteString(" |\n")
		} else {
			fmt.Fprintf(&b, "| SIGKILL → the key moved on to the other sidecar's waiters | never in %d of %d |\n", never, n)
		}
		fmt.Fprintf(&b, "| the other sidecar's waiters | %d of %d granted, in queue order: %s |\n", granted, live, inOrder(disorder, granted))
	}
	return b.String()
}

// indetAt is the INDETERMINATE count of one column of KillRound.Indet.
func indetAt(n [2][3]int, when int) string {
	return fmt.Sprintf("%d ACQUIRE, %d RELEASE", n[0][when], n[1][when])
}

func indetLater(n [2][3]int) string {
	return fmt.Sprintf("written within %v of the kill: %s; after it: %s", inFlightMargin, indetAt(n, 1), indetAt(n, 2))
}

// inOrder says whether granted grants came in queue order.
func inOrder(disorder []string, granted int) string {
	switch {
	case len(disorder) > 0:
		return "**no**: " + disorder[0]
	case granted < 2:
		return fmt.Sprintf("- (%d granted)", granted)
	}
	return "yes"
}

func kinds(m map[string]int) string {
	var s []string
	for k, n := range m {
		s = append(s, fmt.Sprintf("%d × %s", n, k))
	}
	if len(s) == 0 {
		return "0"
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}

func sortDurations(d []time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
}

// RunLineKill starts node processes and two sidecar processes from
// o.Binary and measures o.Kills leader SIGKILLs under a draining line,
// with o.Clients clients cycling on their own keys, then o.SidecarKills
// SIGKILLs of the sidecar whose waiter heads a line. The report holds the
// rounds completed, also when it returns an error.
func RunLineKill(ctx context.Context, o LineKillOptions) (*LineKillReport, error) {
	rep := &LineKillReport{Waiters: o.Waiters, KillAfter: o.KillAfter, Clients: o.Clients, Lease: o.Lease}
	p, err := localproc.Start(localproc.Options{Binary: o.Binary, Dir: filepath.Join(o.Dir, "cluster"), Nodes: o.Nodes, TLS: o.TLS,
		Sidecars: 2, ExtraArgs: append(append([]string{}, quiet...), o.NodeArgs...), SidecarArgs: quiet})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := p.Leader(wctx); err != nil {
		return nil, err
	}
	for j := 0; j < 2; j++ {
		if err := ticketing.WaitReady(wctx, p.SidecarSocket(j)); err != nil {
			return nil, fmt.Errorf("sidecar%d: %w", j+1, err)
		}
	}
	say := func(format string, a ...any) {
		if o.Out != nil {
			fmt.Fprintf(o.Out, "linekill: "+format+"\n", a...)
		}
	}

	cyc := startCyclers(p, o.Clients, o.Lease)
	defer cyc.stop()
	time.Sleep(time.Second) // warm up
	roundStart := time.Now()
	for k := 1; k <= o.Kills; k++ {
		r, err := leaderKillRound(ctx, p, o, k, cyc, roundStart, say)
		if err != nil {
			return rep, fmt.Errorf("kill %d: %w", k, err)
		}
		rep.Rounds = append(rep.Rounds, r)
		if o.Out != nil {
			fmt.Fprint(o.Out, r)
		}
		roundStart = time.Now()
	}
	cyc.stop() // their connections would break with the sidecar below

	for k := 1; k <= o.SidecarKills; k++ {
		r, err := sidecarKillRound(ctx, p, o, k, say)
		if err != nil {
			return rep, fmt.Errorf("sidecar kill %d: %w", k, err)
		}
		rep.Sidecar = append(rep.Sidecar, r)
		if o.Out != nil {
			fmt.Fprint(o.Out, r)
		}
	}
	return rep, nil
}

// leaderKillRound queues a fresh line on linekill/hot/k behind a holder,
// lets it drain (or not: KillAfter 0), SIGKILLs the leader and follows
// the line and the cycling clients until every waiter has a final reply
// and every client has its key again, then restarts the killed node.
func leaderKillRound(ctx context.Context, p *localproc.Procs, o LineKillOptions, k int, cyc *cyclers, roundStart time.Time, say func(string, ...any)) (KillRound, error) {
	r := KillRound{N: k, Waiters: o.Waiters, Other: map[string]int{}}
	if err := settle(ctx, p, -1); err != nil {
		return r, err
	}
	key := fmt.Sprintf("linekill/hot/%d", k)
	holder, tok, err := holdKey(ctx, p.SidecarSocket(0), key)
	if err != nil {
		return r, err
	}
	defer holder.close()
	say("kill %d: queueing %d waiters on %s", k, o.Waiters, key)
	ln := &line{}
	defer ln.close()
	t0 := time.Now()
	for i := 0; i < o.Waiters; i++ {
		if err := ln.queue(ctx, p.SidecarSocket(i%2), i%2, key, o.Lease); err != nil {
			return r, fmt.Errorf("waiter %d of %d: %w", i+1, o.Waiters, err)
		}
	}
	say("kill %d: %d waiters queued in %v", k, o.Waiters, time.Since(t0).Round(time.Millisecond))

	li, err := p.Leader(ctx)
	if err != nil {
		return r, err
	}
	if st, err := p.Status(ctx, li); err == nil {
		r.Leader = st.NodeID
	}
	if o.KillAfter > 0 {
		ln.touch()
		if reply, err := holder.do(ctx, fmt.Sprintf("RELEASE %s %d", key, tok)); err != nil || reply != "OK" {
			return r, fmt.Errorf("the holder's RELEASE before the kill: %q, %v", reply, err)
		}
		for ln.granted() < o.KillAfter {
			if err := ln.stalled(o.Stall); err != nil {
				return r, fmt.Errorf("draining to %d grants before the kill: %w", o.KillAfter, err)
			}
			time.Sleep(time.Millisecond)
		}
	}
	kill := time.Now()
	killed := make(chan error, 1)
	go func() { killed <- p.Signal(li, syscall.SIGKILL) }()
	d, err := firstGrant(ctx, p, li, kill, fmt.Sprintf("linekill/probe/%d", k))
	if kerr := <-killed; kerr != nil {
		return r, kerr
	}
	if err != nil {
		return r, err
	}
	r.Serving = d
	serving := kill.Add(d)
	if ni, err := p.Leader(ctx); err == nil {
		if st, err := p.Status(ctx, ni); err == nil {
			r.NewLeader = st.NodeID
		}
	}
	if o.KillAfter == 0 {
		reply, err := holder.do(ctx, fmt.Sprintf("RELEASE %s %d", key, tok))
		if err != nil {
			return r, fmt.Errorf("the holder's RELEASE after the kill: %w", err)
		}
		if reply != "OK" {
			r.HolderRelease = reply
		}
	}
	// The line ends when every waiter has a final reply, or stalls.
	ln.touch()
	for !ln.done() {
		if ln.stalled(o.Stall) != nil {
			break
		}
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		time.Sleep(20 * time.Millisecond)
	}
	ln.report(&r, kill)
	// Every cycling client has its key again, or the guard ends the wait:
	// a grant nobody knows of ends with its lease, a client's retry waits
	// for it.
	guard := serving.Add(2*o.Lease + 30*time.Second)
	for !cyc.recovered(serving) && time.Now().Before(guard) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	cyc.report(&r, roundStart, kill, serving)
	if err := p.Start(li); err != nil {
		return r, err
	}
	return r, nil
}

// sidecarKillRound queues a line on linekill/sidecar/k behind a holder on
// sidecar2: its head and every other waiter through sidecar1, the others
// through sidecar2. It SIGKILLs sidecar1, then the holder releases, and it
// measures how long until the key reaches sidecar2's waiters, and in which
// order. Sidecar1 is started again afterwards.
func sidecarKillRound(ctx context.Context, p *localproc.Procs, o LineKillOptions, k int, say func(string, ...any)) (SidecarRound, error) {
	r := SidecarRound{N: k, Other: map[string]int{}}
	if err := settle(ctx, p, -1); err != nil {
		return r, err
	}
	key := fmt.Sprintf("linekill/sidecar/%d", k)
	holder, tok, err := holdKey(ctx, p.SidecarSocket(1), key)
	if err != nil {
		return r, err
	}
	defer holder.close()
	ln := &line{}
	defer ln.close()
	for i := 0; i < o.SidecarWaiters; i++ {
		sc := i % 2 // the head (waiter 0) through sidecar1 (index 0), the one killed
		if err := ln.queue(ctx, p.SidecarSocket(sc), sc, key, o.Lease); err != nil {
			return r, fmt.Errorf("waiter %d of %d: %w", i+1, o.SidecarWaiters, err)
		}
		if sc == 0 {
			r.Dead++
		} else {
			r.Live++
		}
	}
	say("sidecar kill %d: %d waiters queued on %s; SIGKILL sidecar1", k, o.SidecarWaiters, key)
	kill := time.Now()
	if err := p.SignalSidecar(0, syscall.SIGKILL); err != nil {
		return r, err
	}
	reply, err := holder.do(ctx, fmt.Sprintf("RELEASE %s %d", key, tok))
	if err != nil {
		return r, fmt.Errorf("the holder's RELEASE: %w", err)
	}
	if reply != "OK" {
		r.ReleaseErr = reply
	}
	ln.touch()
	for !ln.doneOf(1) {
		if ln.stalled(o.Stall) != nil {
			break
		}
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		time.Sleep(20 * time.Millisecond)
	}
	ln.reportOf(&r, 1, kill)
	ln.close()
	if err := p.StartSidecar(0); err != nil {
		return r, err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := ticketing.WaitReady(wctx, p.SidecarSocket(0)); err != nil {
		return r, fmt.Errorf("sidecar1 after its restart: %w", err)
	}
	return r, nil
}

// rawConn is a unix connection to a sidecar that agreed `HELLO 4 events`:
// event lines go to onEvent, replies to the channel.
type rawConn struct {
	c       net.Conn
	br      *bufio.Reader
	replies chan stamped
	queued  chan struct{} // closed on the first `! QUEUED`
	done    chan struct{} // closed when reading stops
	once    sync.Once
}

// errNoQueuedEvent: the sidecar agreed no version with `! QUEUED`.
var errNoQueuedEvent = errors.New("bench: the sidecar does not send `! QUEUED` (HELLO 4 events not agreed)")

// dialRaw connects and agrees version 4 with events; the replies that
// follow are read by a goroutine into the replies channel (closed when
// the connection ends).
func dialRaw(ctx context.Context, sock string) (*rawConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	rc := &rawConn{c: c, br: bufio.NewReader(c), replies: make(chan stamped, 4), queued: make(chan struct{}), done: make(chan struct{})}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "HELLO 4 events\n"); err != nil {
		c.Close()
		return nil, err
	}
	l, err := rc.br.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, err
	}
	if l != "HELLO 4 events\n" {
		c.Close()
		return nil, fmt.Errorf("%w: answered %q", errNoQueuedEvent, strings.TrimSpace(l))
	}
	c.SetDeadline(time.Time{})
	go rc.read()
	return rc, nil
}

func (rc *rawConn) read() {
	defer close(rc.done)
	defer close(rc.replies)
	for {
		l, err := rc.br.ReadString('\n')
		at := time.Now()
		if err != nil {
			return
		}
		l = strings.TrimSuffix(l, "\n")
		if unixapi.IsEvent([]byte(l)) {
			if ev, err := unixapi.ParseEvent([]byte(l)); err == nil && ev.Name == unixapi.EventQueued {
				rc.once.Do(func() { close(rc.queued) })
			}
			continue
		}
		rc.replies <- stamped{l, at}
	}
}

// send writes one request line and returns when it was written.
func (rc *rawConn) send(req string) (time.Time, error) {
	at := time.Now()
	_, err := io.WriteString(rc.c, req+"\n")
	return at, err
}

// next is the next reply; ok false when the connection ended.
func (rc *rawConn) next(ctx context.Context) (stamped, bool) {
	select {
	case s, ok := <-rc.replies:
		return s, ok
	case <-ctx.Done():
		return stamped{}, false
	}
}

// do sends req and waits for its reply (no other request outstanding).
func (rc *rawConn) do(ctx context.Context, req string) (string, error) {
	if _, err := rc.send(req); err != nil {
		return "", err
	}
	s, ok := rc.next(ctx)
	if !ok {
		return "", fmt.Errorf("bench: connection ended before the reply to %q", req)
	}
	return s.line, nil
}

func (rc *rawConn) close() {
	rc.c.Close()
	<-rc.done
}

// holdKey acquires key on its own connection with the longest lease.
func holdKey(ctx context.Context, sock, key string) (*rawConn, uint64, error) {
	h, err := dialRaw(ctx, sock)
	if err != nil {
		return nil, 0, err
	}
	reply, err := h.do(ctx, fmt.Sprintf("ACQUIRE %s %d 30", key, lineHolderSec))
	tok, perr := strconv.ParseUint(strings.TrimPrefix(reply, "OK "), 10, 64)
	if err != nil || !strings.HasPrefix(reply, "OK ") || perr != nil {
		h.close()
		return nil, 0, fmt.Errorf("holder of %s: ACQUIRE answered %q, %v", key, reply, err)
	}
	return h, tok, nil
}

// lineWaiter is one waiter of a line: its place (idx), the sidecar it
// came through, and its final reply.
type lineWaiter struct {
	idx, sidecar int
	rc           *rawConn
	written      time.Time // when its ACQUIRE was written
	final        string    // "" while waiting
	at           time.Time
	token        uint64
}

// line is a hot key's waiters in the order they were confirmed queued;
// every grant is released at once on its connection.
type line struct {
	mu        sync.Mutex
	ws        []*lineWaiter
	finals    int
	grants    int
	lastFinal time.Time
	wg        sync.WaitGroup
}

// queue adds one waiter: it connects to sock, sends the ACQUIRE and
// returns once `! QUEUED` confirmed it in line (a harness failure if it
// does not come: the order would be unknown).
func (ln *line) queue(ctx context.Context, sock string, sidecar int, key string, lease time.Duration) error {
	rc, err := dialRaw(ctx, sock)
	if err != nil {
		return err
	}
	ln.mu.Lock()
	w := &lineWaiter{idx: len(ln.ws), sidecar: sidecar, rc: rc}
	ln.ws = append(ln.ws, w)
	if ln.lastFinal.IsZero() {
		ln.lastFinal = time.Now()
	}
	ln.mu.Unlock()
	written, err := rc.send(fmt.Sprintf("ACQUIRE %s %d %d", key, int(lease/time.Second), lineWaitSec))
	if err != nil {
		return err
	}
	ln.mu.Lock()
	w.written = written
	ln.mu.Unlock()
	ln.wg.Add(1)
	go ln.follow(w, key)
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-rc.queued:
		return nil
	case <-rc.done:
		ln.mu.Lock()
		final := w.final
		ln.mu.Unlock()
		return fmt.Errorf("answered %q before `! QUEUED`", final)
	case <-t.C:
		return fmt.Errorf("no `! QUEUED` within 30s")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// follow reads the waiter's final reply and releases a grant at once.
func (ln *line) follow(w *lineWaiter, key string) {
	defer ln.wg.Done()
	s, ok := w.rc.next(context.Background())
	final := s.line
	if !ok {
		final, s.at = "connection lost", time.Now()
	}
	tok, isOK := strings.CutPrefix(final, "OK ")
	t, perr := strconv.ParseUint(tok, 10, 64)
	if isOK && perr == nil {
		// A failed write means the connection is gone: the sidecar then
		// releases the grant itself, and the RELEASE's reply is not read.
		_, _ = w.rc.send("RELEASE " + key + " " + tok)
	}
	ln.mu.Lock()
	w.final, w.at = final, s.at
	if isOK && perr == nil {
		w.token = t
		ln.grants++
	}
	ln.finals++
	ln.lastFinal = s.at
	ln.mu.Unlock()
}

// touch restarts the stall clock (a phase begins in which replies are due).
func (ln *line) touch() {
	ln.mu.Lock()
	ln.lastFinal = time.Now()
	ln.mu.Unlock()
}

func (ln *line) granted() int {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	return ln.grants
}

func (ln *line) done() bool {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	return ln.finals == len(ln.ws)
}

// doneOf: every waiter through sidecar sc has a final reply.
func (ln *line) doneOf(sc int) bool {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	for _, w := range ln.ws {
		if w.sidecar == sc && w.final == "" {
			return false
		}
	}
	return true
}

// stalled is an error when no final reply came for d.
func (ln *line) stalled(d time.Duration) error {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if since := time.Since(ln.lastFinal); since > d {
		return fmt.Errorf("no waiter answered for %v (%d of %d answered, %d granted)", since.Round(time.Second), ln.finals, len(ln.ws), ln.grants)
	}
	return nil
}

// kind is a final reply's class for the counts ("ERR code", or the reply).
func kind(reply string) string {
	if f := strings.Fields(reply); len(f) >= 2 && f[0] == "ERR" {
		return "ERR " + f[1]
	}
	return reply
}

// disorder compares the grants of ws, by token (the key's grant order), with
// the order they were queued in.
func disorder(ws []*lineWaiter) []string {
	var g []*lineWaiter
	for _, w := range ws {
		if w.token != 0 {
			g = append(g, w)
		}
	}
	sort.Slice(g, func(i, j int) bool { return g[i].token < g[j].token })
	var out []string
	for i := 1; i < len(g); i++ {
		if g[i].idx < g[i-1].idx {
			out = append(out, fmt.Sprintf("waiter %d (queued %d.) was granted token %d after waiter %d (queued %d.) got token %d",
				g[i].idx+1, g[i].idx+1, g[i].token, g[i-1].idx+1, g[i-1].idx+1, g[i-1].token))
		}
	}
	return out
}

func (ln *line) report(r *KillRound, kill time.Time) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	for _, w := range ln.ws {
		switch {
		case w.final == "":
			r.NoReply++
		case w.token != 0 && w.at.Before(kill):
			r.GrantedBefore++
		case w.token != 0:
			r.GrantedAfter++
		case w.final == "INDETERMINATE":
			r.Indeterminate++
			if w.written.Before(kill.Add(-inFlightMargin)) {
				r.EarlyIndetWaiters++
			}
		case w.final == "TIMEOUT":
			r.Timeout++
		default:
			r.Other[kind(w.final)]++
		}
	}
	r.Disorder = disorder(ln.ws)
}

func (ln *line) reportOf(r *SidecarRound, sc int, kill time.Time) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	var live []*lineWaiter
	for _, w := range ln.ws {
		if w.sidecar != sc {
			continue
		}
		live = append(live, w)
		switch {
		case w.final == "":
			r.NoReply++
		case w.token != 0:
			r.Granted++
			if d := w.at.Sub(kill); !r.Moved || d < r.MovedOn {
				r.MovedOn, r.Moved = d, true
			}
		default:
			r.Other[kind(w.final)]++
		}
	}
	r.Disorder = disorder(live)
}

func (ln *line) close() {
	ln.mu.Lock()
	ws := ln.ws
	ln.mu.Unlock()
	for _, w := range ws {
		w.rc.close()
	}
	ln.wg.Wait()
}

// cycleOp is one request of a cycling client: what, when it was written,
// its reply and when that was read.
type cycleOp struct {
	verb        byte // 'A' ACQUIRE, 'R' RELEASE
	written, at time.Time
	reply       string
}

// cyclers are clients cycling ACQUIRE → RELEASE on their own keys, one
// unix connection each, alternating between the sidecars. A client whose
// ACQUIRE or RELEASE went INDETERMINATE keeps its key and tries it again
// until granted: an application that needs that key.
type cyclers struct {
	mu    sync.Mutex
	ops   [][]cycleOp
	keys  []string
	stopc chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
}

func startCyclers(p *localproc.Procs, n int, lease time.Duration) *cyclers {
	cy := &cyclers{ops: make([][]cycleOp, n), stopc: make(chan struct{})}
	for i := 0; i < n; i++ {
		cy.keys = append(cy.keys, fmt.Sprintf("linekill/cycle/%d", i))
	}
	for i := 0; i < n; i++ {
		cy.wg.Add(1)
		go cy.run(i, p.SidecarSocket(i%2), lease)
	}
	return cy
}

func (cy *cyclers) run(i int, sock string, lease time.Duration) {
	defer cy.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-cy.stopc:
			cancel()
		case <-ctx.Done():
		}
	}()
	key := cy.keys[i]
	acq := fmt.Sprintf("ACQUIRE %s %d %d", key, int(lease/time.Second), cycleWaitSec)
	var rc *rawConn
	defer func() {
		if rc != nil {
			rc.close()
		}
	}()
	record := func(op cycleOp) {
		cy.mu.Lock()
		cy.ops[i] = append(cy.ops[i], op)
		cy.mu.Unlock()
	}
	// do writes req and reads its reply; a lost connection is recorded as
	// its reply and the next request dials again.
	do := func(verb byte, req string) (string, bool) {
		if rc == nil {
			var err error
			if rc, err = dialRaw(ctx, sock); err != nil {
				rc = nil
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				return "", false
			}
		}
		w, err := rc.send(req)
		var s stamped
		ok := err == nil
		if ok {
			s, ok = rc.next(ctx)
		}
		if !ok {
			if ctx.Err() != nil {
				return "", false
			}
			rc.close()
			rc = nil
			s = stamped{"connection lost", time.Now()}
		}
		record(cycleOp{verb: verb, written: w, at: s.at, reply: s.line})
		return s.line, ok
	}
	for ctx.Err() == nil {
		reply, ok := do('A', acq)
		tok, granted := strings.CutPrefix(reply, "OK ")
		if !ok || !granted {
			if reply != "TIMEOUT" && reply != "INDETERMINATE" && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond) // a refusal comes at once: do not spin
			}
			continue
		}
		do('R', "RELEASE "+key+" "+tok)
	}
}

// recovered: every client was granted its key after t.
func (cy *cyclers) recovered(t time.Time) bool {
	cy.mu.Lock()
	defer cy.mu.Unlock()
	for _, ops := range cy.ops {
		ok := false
		for j := len(ops) - 1; j >= 0 && !ops[j].at.Before(t); j-- {
			if ops[j].verb == 'A' && strings.HasPrefix(ops[j].reply, "OK ") {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// report counts the round's answers (requests written since from) and the
// longest time from serving until a client was granted its key again.
func (cy *cyclers) report(r *KillRound, from, kill, serving time.Time) {
	cy.mu.Lock()
	defer cy.mu.Unlock()
	r.CycleOther = map[string]int{}
	now := time.Now()
	for i, ops := range cy.ops {
		var first time.Time
		for _, op := range ops {
			if op.written.Before(from) {
				continue
			}
			switch op.reply {
			case "INDETERMINATE":
				v, w := 0, 0
				if op.verb == 'R' {
					v = 1
				}
				switch {
				case op.written.Before(kill.Add(-inFlightMargin)):
				case op.written.Before(kill):
					w = 1
				default:
					w = 2
				}
				r.Indet[v][w]++
				r.OldestIndet = max(r.OldestIndet, kill.Sub(op.written))
			case "OK", "TIMEOUT", "BUSY":
			default:
				if !strings.HasPrefix(op.reply, "OK ") {
					verb := "ACQUIRE"
					if op.verb == 'R' {
						verb = "RELEASE"
					}
					r.CycleOther[verb+" -> "+kind(op.reply)]++
				}
			}
			if first.IsZero() && op.verb == 'A' && strings.HasPrefix(op.reply, "OK ") && !op.at.Before(serving) {
				first = op.at
			}
		}
		gap := first.Sub(serving)
		if first.IsZero() {
			r.Unrecovered++
			gap = now.Sub(serving)
		}
		if gap > r.Unavailable {
			r.Unavailable, r.UnavailableKey = gap, cy.keys[i]
		}
	}
}

func (cy *cyclers) stop() {
	cy.once.Do(func() { close(cy.stopc) })
	cy.wg.Wait()
}
