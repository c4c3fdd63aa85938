package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/clients/go/fence"
)

// config of one run.
type config struct {
	DB       string // SQLite path or postgres:// URL; "" = a new SQLite file in a temporary directory
	Buyers   int
	Permits  int // the semaphore's n: buyers at checkout at once
	Tickets  int // the inventory
	Checkout time.Duration
	Lease    time.Duration
	// Kill: SIGKILL the leader once KillAt buyers were admitted (0: half).
	Kill   bool
	KillAt int
	// Stall: one buyer stalls past its lease, holding its permit, and
	// writes afterwards with its old token; the fence must refuse it.
	Stall        bool
	StallLease   time.Duration
	Verbose      bool
	TicketingBin string
}

func defaultConfig() config {
	return config{Buyers: 2000, Permits: 50, Tickets: 1500, Checkout: 200 * time.Millisecond, Lease: 60 * time.Second,
		Kill: true, Stall: true, StallLease: time.Second}
}

// posEvent is one "! POSITION" a buyer received.
type posEvent struct {
	At       time.Time
	Position int
	Estimate time.Duration // valid when Known
	Known    bool
}

// buyer is one goroutine in the line, with its own connection (session).
type buyer struct {
	N      int // arrival rank, 1 = first in line
	Joined time.Time
	stall  bool // the stalled buyer (Config.Stall)

	mu     sync.Mutex // the position hook runs on the client's reader
	Events []posEvent

	Admitted time.Time // zero: never admitted
	Token    uint64
	Slot     int
	Err      error  // the PERMIT's error: not admitted
	Outcome  string // "bought", "sold out", "stale" (rejected by the fence), "not written", "error: ..."
	Release  error  // the RELEASE's error, if any
}

func (b *buyer) events() []posEvent {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]posEvent(nil), b.Events...)
}

// killRecord is what the leader SIGKILL did.
type killRecord struct {
	Node, NewLeader string
	At              time.Time
	Admitted        int // admissions before the kill
	// Pause is the longest gap between two consecutive admissions that
	// ends after the SIGKILL, and Resumed when it ended, from the SIGKILL:
	// the line standing still for the election. (The first admission after
	// the SIGKILL says little: a grant the old leader committed can reach
	// its buyer just after.) 0 when no admission came after the kill.
	Pause, Resumed time.Duration
	Restarted      bool
	Err            string
}

// run starts the cluster, runs the sale and audits the database. Progress
// goes to logw.
func run(ctx context.Context, cfg config, logw io.Writer) (*report, error) {
	if cfg.Buyers < 1 || cfg.Permits < 1 || cfg.Permits > ticketing.MaxPermits || cfg.Tickets < 0 {
		return nil, fmt.Errorf("want buyers ≥ 1, 1 ≤ permits ≤ %d, tickets ≥ 0", ticketing.MaxPermits)
	}
	start := time.Now()
	logf := func(format string, args ...any) { fmt.Fprintf(logw, "waitingroom: "+format+"\n", args...) }
	tmp, err := os.MkdirTemp("", "waitingroom-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	cl, err := startCluster(ctx, cfg.TicketingBin, tmp, logf)
	if err != nil {
		return nil, err
	}
	defer cl.close()

	// The runner's own connection: the operator's PERMITS and the doors.
	op, err := ticketing.Dial(ctx, cl.socket)
	if err != nil {
		return nil, err
	}
	defer op.Close()
	domain, err := sidecarDomain(ctx, op)
	if err != nil {
		return nil, err
	}
	db, desc := cfg.DB, "PostgreSQL"
	if db == "" {
		db = filepath.Join(tmp, "waitingroom.db")
	}
	if !isPostgres(db) {
		desc = "SQLite " + strings.TrimPrefix(db, "sqlite:")
	}
	st, err := openStore(db)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	sale := fmt.Sprintf("onsale-%d", time.Now().UnixNano())
	if err := st.setup(ctx, sale, cfg.Tickets); err != nil {
		return nil, err
	}
	key := "checkout/" + sale
	if err := setPermits(ctx, op, key, cfg.Permits); err != nil {
		return nil, err
	}
	rep := &report{Sale: sale, Key: key, DBDesc: desc, Domain: domain, Cfg: cfg}

	// The doors are shut while the line forms: the runner holds every
	// permit, so that each buyer queues (its "! QUEUED" confirms its place
	// before the next joins: the arrival order is known exactly) and the
	// line is long when the sale opens, as in an on-sale whose waiting
	// room fills before the hour. Opening is releasing them: the first n
	// buyers are admitted at once, then one per permit freed.
	doors := make([]*ticketing.Lock, 0, cfg.Permits)
	for i := 0; i < cfg.Permits; i++ {
		lk, err := op.AcquirePermit(ctx, key, ticketing.MaxLease, 30*time.Second, ticketing.WithLabel("doors"))
		if err != nil {
			return nil, fmt.Errorf("the doors' permit %d: %w", i+1, err)
		}
		doors = append(doors, lk)
	}
	stopExtend := keepExtended(ctx, doors, logf)
	defer stopExtend() // on an early return; the opening stops it first

	buyers := make([]*buyer, cfg.Buyers)
	// The stalled buyer is one of the first admitted at the opening, so
	// that its lease runs out while the line is still long and a buyer
	// behind it gets its slot and writes.
	stallN := 0
	if cfg.Stall && cfg.Buyers > cfg.Permits {
		stallN = max(1, cfg.Permits/2)
	}
	killAt := cfg.KillAt
	if killAt <= 0 {
		killAt = cfg.Buyers / 2
	}
	var (
		admitted atomic.Int64
		left     atomic.Int64 // buyers not finished
		killNow  = make(chan struct{})
		// stallSettled is closed once the stalled buyer's slot has a newer
		// writer (or it gave up): the kill waits for it, since a new
		// leader gives every holder a fresh lease, which could hold the
		// stalled buyer's slot until the line has run out.
		stallSettled = make(chan struct{})
		wg           sync.WaitGroup
		logMu        sync.Mutex
	)
	verbose := func(format string, args ...any) {
		if cfg.Verbose {
			logMu.Lock()
			logf(format, args...)
			logMu.Unlock()
		}
	}
	onAdmit := func() {
		if admitted.Add(1) == int64(killAt) {
			close(killNow)
		}
	}
	left.Store(int64(cfg.Buyers))
	saleCtx, cancelSale := context.WithCancel(ctx)
	defer cancelSale()

	// The line: one buyer at a time, each on its own connection. One
	// connection per buyer, as one per browser session in a real waiting
	// room: the connection is the session that holds the permit, and
	// replies come in request order on a connection, so a RELEASE behind
	// other buyers' waiting PERMITs on a shared one would not be answered
	// until they are (unixapi/PROTOCOL.md, "Pipelining and ordering").
	logf("%d buyers join the line of %s (%d permits) one at a time", cfg.Buyers, key, cfg.Permits)
	joinStart := time.Now()
	for i := range buyers {
		b := &buyer{N: i + 1, stall: i+1 == stallN}
		buyers[i] = b
		c, err := ticketing.Dial(saleCtx, cl.socket)
		if err != nil {
			cancelSale()
			wg.Wait()
			return nil, fmt.Errorf("buyer %d: %w", b.N, err)
		}
		queued := make(chan struct{})
		ended := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			defer close(ended)
			defer left.Add(-1)
			b.run(saleCtx, c, st, cfg, domain, key, sale, queued, onAdmit, &left, stallSettled, verbose)
		}()
		select {
		case <-queued:
			b.Joined = time.Now()
		case <-ended:
			// Refused or granted without queueing: not expected with the
			// doors shut; the report shows its outcome.
			b.Joined = time.Now()
		case <-time.After(30 * time.Second):
			cancelSale()
			wg.Wait()
			return nil, fmt.Errorf("buyer %d: not queued within 30 s", b.N)
		case <-ctx.Done():
			cancelSale()
			wg.Wait()
			return nil, ctx.Err()
		}
	}
	rep.Join = time.Since(joinStart)
	logf("%d buyers in line after %.1fs; the sale opens", cfg.Buyers, rep.Join.Seconds())

	// Kill the leader mid-sale.
	var kill killRecord
	killDone := make(chan struct{})
	go func() {
		defer close(killDone)
		if !cfg.Kill {
			return
		}
		select {
		case <-killNow:
		case <-saleCtx.Done():
			return
		}
		if stallN > 0 {
			select {
			case <-stallSettled:
			case <-saleCtx.Done():
				return
			}
		}
		li, id, err := cl.leader(saleCtx)
		if err != nil {
			kill.Err = "finding the leader: " + err.Error()
			return
		}
		kill.Node, kill.Admitted, kill.At = id, int(admitted.Load()), time.Now()
		if err := cl.kill(li); err != nil {
			kill.Err = "SIGKILL: " + err.Error()
			return
		}
		logf("leader %s SIGKILLed after %d admissions", id, kill.Admitted)
		if _, nl, err := cl.leader(saleCtx); err == nil {
			kill.NewLeader = nl
			logf("new leader %s", nl)
		}
		if err := cl.restart(li); err != nil {
			kill.Err = "restart: " + err.Error()
			return
		}
		kill.Restarted = true
	}()

	rep.Opened = time.Now()
	stopExtend()
	for _, lk := range doors {
		if err := lk.Release(ctx); err != nil {
			logf("opening: release of the doors' permit slot %d: %v", lk.Slot(), err)
		}
	}
	wg.Wait()
	rep.SaleTime = time.Since(rep.Opened)
	cancelSale()
	<-killDone
	if cfg.Kill {
		rep.Kill = &kill
		kill.measurePause(buyers)
	}
	rep.Buyers = buyers
	rep.Elapsed = time.Since(start)
	if rep.Audit, err = st.audit(ctx, domain, key, sale, cfg.Permits); err != nil {
		return rep, fmt.Errorf("audit: %w", err)
	}
	rep.check()
	return rep, nil
}

// run is one buyer: take a permit of key (wait up to an hour, recording
// every position), check out (a fenced write), release.
func (b *buyer) run(ctx context.Context, c *ticketing.Client, st *store, cfg config, domain, key, sale string,
	queued chan struct{}, onAdmit func(), left *atomic.Int64, stallSettled chan struct{}, verbose func(string, ...any)) {
	lease := cfg.Lease
	if b.stall {
		lease = cfg.StallLease
	}
	var once sync.Once
	lk, err := c.AcquirePermit(ctx, key, lease, ticketing.MaxWait,
		ticketing.WithLabel(fmt.Sprintf("buyer-%d", b.N)),
		// Both hooks run on the client's reader goroutine: record, never block.
		ticketing.WithQueued(func() { once.Do(func() { close(queued) }) }),
		ticketing.WithPosition(func(p ticketing.Position) {
			b.mu.Lock()
			b.Events = append(b.Events, posEvent{At: time.Now(), Position: p.Position, Estimate: p.Estimate, Known: p.EstimateKnown})
			b.mu.Unlock()
		}))
	if err != nil {
		b.Err = err
		verbose("buyer %d: not admitted: %v", b.N, err)
		if b.stall {
			close(stallSettled)
		}
		return
	}
	b.Admitted, b.Token, b.Slot = time.Now(), lk.Token(), lk.Slot()
	onAdmit()
	verbose("buyer %d admitted: token %d slot %d", b.N, b.Token, b.Slot)

	if b.stall {
		b.stallAndWrite(ctx, st, domain, sale, lk, left, stallSettled)
		return
	}
	// The buyer's time at checkout (choosing, paying), then the write.
	select {
	case <-time.After(cfg.Checkout):
	case <-ctx.Done():
	}
	switch err := st.checkout(ctx, domain, lk.FenceKey(), sale, b.N, b.Slot, b.Token); {
	case err == nil:
		b.Outcome = "bought"
	case errors.Is(err, errSoldOut):
		b.Outcome = "sold out"
	case errors.Is(err, fence.ErrStale):
		b.Outcome = "stale"
	default:
		b.Outcome = "error: " + err.Error()
	}
	verbose("buyer %d: %s", b.N, b.Outcome)
	if err := lk.Release(context.WithoutCancel(ctx)); err != nil {
		b.Release = err
	}
}

// stallAndWrite is the stalled buyer: it holds its permit past the lease
// without writing (a GC pause, a stopped VM), so the cluster hands its
// slot on; once the slot's next holder has written, it wakes and writes
// with its old token, ignoring its permit's lost signal on purpose. The
// fence on "<key> <slot>" must refuse the write. If nobody else wrote the
// slot before every other buyer left (or within a minute), it does not
// write at all: the fence could not tell it from the slot's holder, so
// the demonstration would be an unfenced stale write.
func (b *buyer) stallAndWrite(ctx context.Context, st *store, domain, sale string, lk *ticketing.Lock, left *atomic.Int64, settled chan struct{}) {
	defer func() {
		select {
		case <-settled:
		default:
			close(settled)
		}
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		hw, err := st.fence.HighWater(ctx, st.DB, domain, lk.FenceKey())
		if err == nil && hw > b.Token {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil || left.Load() <= 1 {
			b.Outcome = "not written"
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(settled)
	switch err := st.checkout(ctx, domain, lk.FenceKey(), sale, b.N, b.Slot, b.Token); {
	case errors.Is(err, fence.ErrStale):
		b.Outcome = "stale"
	case err == nil:
		b.Outcome = "bought" // the audit fails: a stale write landed
	case errors.Is(err, errSoldOut):
		b.Outcome = "sold out" // the same: a stale write landed
	default:
		b.Outcome = "error: " + err.Error()
	}
	// Long lost: not_held is expected; the lease ran out.
	b.Release = lk.Release(context.WithoutCancel(ctx))
}

// keepExtended renews the doors' permits until the returned stop is
// called (once or more), so that a line that takes longer to form than a
// lease does not open the doors early.
func keepExtended(ctx context.Context, locks []*ticketing.Lock, logf func(string, ...any)) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(finished)
		t := time.NewTicker(ticketing.MaxLease / 4)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				for _, lk := range locks {
					if err := lk.Extend(ctx, ticketing.MaxLease); err != nil {
						logf("extending the doors' permit slot %d: %v", lk.Slot(), err)
					}
				}
			}
		}
	}()
	return func() { once.Do(func() { close(done) }); <-finished }
}

// setPermits defines key with n permits. An INDETERMINATE (a leader
// change) is asked again: PERMITS with the same n is idempotent here,
// where no other operator changes the key.
func setPermits(ctx context.Context, c *ticketing.Client, key string, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.SetPermits(ctx, key, n)
		if err == nil || time.Now().After(deadline) ||
			!(errors.Is(err, ticketing.ErrIndeterminate) || errors.Is(err, ticketing.ErrUnavailable)) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sidecarDomain is the fencing domain, INFO's domain= (not cluster=, the
// cluster id): a sidecar that has not reached a node yet says domain=-,
// so it is asked again for up to 30 s.
func sidecarDomain(ctx context.Context, c *ticketing.Client) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := c.Info(ctx)
		if err != nil {
			return "", fmt.Errorf("sidecar INFO: %w", err)
		}
		if info.Domain != "" {
			return info.Domain, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the sidecar's INFO names no fencing domain: %q", info.Raw)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// sortDurations sorts d in place and returns it.
func sortDurations(d []time.Duration) []time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d
}

// measurePause fills Pause and Resumed from the buyers' admission times.
func (k *killRecord) measurePause(buyers []*buyer) {
	if k.At.IsZero() {
		return
	}
	var at []time.Time
	for _, b := range buyers {
		if !b.Admitted.IsZero() {
			at = append(at, b.Admitted)
		}
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	for i := 1; i < len(at); i++ {
		if at[i].After(k.At) && at[i].Sub(at[i-1]) > k.Pause {
			k.Pause, k.Resumed = at[i].Sub(at[i-1]), at[i].Sub(k.At)
		}
	}
}
