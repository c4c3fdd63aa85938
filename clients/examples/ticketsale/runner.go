package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ticketing "ticketing/clients/go"
)

// config of one run.
type config struct {
	DB                   string // SQLite path or postgres:// URL; "" = temporary SQLite file
	Seats                int
	GoSellers, PySellers int
	LeaseSec             int
	Chaos                bool
	Verbose              bool   // log every seller event
	Socket               string // existing sidecar; "" = start `ticketing dev`
	TicketingBin         string
	Python               string
	// GoSeller is the command that runs a Go seller; the arguments follow.
	// Default: this executable with "seller".
	GoSeller []string
}

func defaultConfig() config {
	return config{Seats: 60, GoSellers: 2, PySellers: 2, LeaseSec: 3, Chaos: true, Python: "python3"}
}

// maxBlock is the largest block a seller asks for: 1..4 adjacent seats.
const maxBlock = 4

// sale is one sale attempt as a seller (or the runner) reported it.
type sale struct {
	Seller string
	ID     string // <seller>#<attempt>: the buyer of its seats, the sale of its ledger rows
	Token  uint64
	Seats  []int
}

// same tells whether o is the same sale attempt as s.
func (s sale) same(o sale) bool { return s.ID == o.ID && s.Token == o.Token }

func (s sale) String() string {
	return fmt.Sprintf("%s token %d seats %s", s.ID, s.Token, joinInts(s.Seats))
}

// sellerProc is one running seller.
type sellerProc struct {
	name   string
	lang   string
	victim bool // chaos: stops itself holding its block past the lease
	// ignoresLost: a chaos victim that writes after its pause without
	// checking the lost signal, on purpose, so that the fence must reject
	// the write; the other victim aborts on the signal.
	ignoresLost bool
	cmd         *exec.Cmd
	stdin       io.WriteCloser
	sold        []sale // SOLD
	stale       []sale // STALE: rejected by the fence
	// aborted: ABORTED, not written because the lock's lost signal had
	// fired.
	aborted []sale
	taken   []sale // TAKEN: a seat was sold meanwhile; rolled back
	paused  []sale // PAUSE: chaos
	exit    error
}

// takeover is the chaos step for one paused seller: once its lease has
// run out, the runner acquires the paused seller's exact seats as a block
// and sells them with its newer token, then wakes the seller.
type takeover struct {
	Victim string
	Role   string // what the victim does when woken: heeds or ignores the lost signal
	Paused sale
	Sold   *sale  // the runner's sale of the seats; nil if it did not sell
	Note   string // why not
	After  time.Duration
}

// event is one line from a seller.
type event struct {
	p    *sellerProc
	verb string
	sale sale
}

// report is the outcome of a run: what the sellers reported, the audit of
// the database, and the checks (check) over both.
type report struct {
	Event, DBDesc string
	// Domain is the fencing domain (INFO's domain=), Cluster the cluster
	// id (INFO's cluster=, "dev" for every dev cluster: not a domain).
	Domain, Cluster string
	Sellers         []*sellerProc
	Takeovers       []*takeover
	Audit           audit
	Chaos           bool
	Elapsed         time.Duration

	Sales          []sale            // every committed sale reported (sellers' SOLD lines and the runner's)
	Sizes          [maxBlock + 1]int // Sizes[k]: sales of k seats
	Stale, Taken   int
	Aborted        int // sales aborted by the lost signal before the write
	SeatsSold      int
	FreeSeats      int
	DoubleSold     []int    // seats with more than one ledger row
	Split          []string // sales whose block is not whole: not adjacent, several tokens, size or seats differ
	SoldMismatch   []string // SOLD lines the database disagrees with, ledger sales never reported
	LedgerMismatch []int    // seats whose row disagrees with the ledger
	Applied        []string // rejected or rolled-back writes of which something is in the database
	HighWaterOK    int      // seat keys whose fence high-water mark is the token that sold the seat
	HighWaterBad   []string
	Problems       []string
}

func (r *report) OK() bool { return len(r.Problems) == 0 }

func (r *report) print(w io.Writer) {
	langs := map[string]int{}
	for _, p := range r.Sellers {
		langs[p.lang]++
	}
	var ls []string
	for l, n := range langs {
		ls = append(ls, fmt.Sprintf("%s x%d", l, n))
	}
	sort.Strings(ls)
	a := r.Audit
	fmt.Fprintf(w, "ticket sale %s: %d seats, sellers %s, %s, %.1fs\n", r.Event, a.Capacity, strings.Join(ls, ", "), r.DBDesc, r.Elapsed.Seconds())
	fmt.Fprintf(w, "  fencing domain:        %s (the sidecar's INFO domain=; cluster id %s)\n", r.Domain, r.Cluster)
	fmt.Fprintf(w, "  seats sold:            %d of %d in %d sales (remaining counter %d, free seats %d)\n",
		r.SeatsSold, a.Capacity, len(r.Sales), a.Remaining, r.FreeSeats)
	var hist []string
	for k := 1; k <= maxBlock; k++ {
		hist = append(hist, fmt.Sprintf("%d-seat x%d", k, r.Sizes[k]))
	}
	fmt.Fprintf(w, "  block sizes:           %s\n", strings.Join(hist, ", "))
	fmt.Fprintf(w, "  picked again:          %d (a seat of the block sold meanwhile, before the lock)\n", r.Taken)
	for _, t := range r.Takeovers {
		fmt.Fprintf(w, "  chaos:                 %s (%s) stopped holding %s; ", t.Victim, t.Role, t.Paused)
		if t.Sold != nil {
			fmt.Fprintf(w, "after %.1fs the runner sold them as %s token %d\n", t.After.Seconds(), t.Sold.ID, t.Sold.Token)
		} else {
			fmt.Fprintf(w, "after %.1fs the runner did not sell them: %s\n", t.After.Seconds(), t.Note)
		}
	}
	var st []string
	for _, p := range r.Sellers {
		for _, s := range p.stale {
			st = append(st, s.String())
		}
	}
	fmt.Fprintf(w, "  rejected stale writes: %d", r.Stale)
	if len(st) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(st, "; "))
	}
	fmt.Fprintf(w, "; applied of them or of rolled-back writes: %d\n", len(r.Applied))
	var ab []string
	for _, p := range r.Sellers {
		for _, s := range p.aborted {
			ab = append(ab, s.String())
		}
	}
	fmt.Fprintf(w, "  aborted by the lost signal before the write: %d", r.Aborted)
	if len(ab) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(ab, "; "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  fence high-water:      the selling token on %d of %d seat keys\n", r.HighWaterOK, len(a.Seats))
	fmt.Fprintf(w, "  double-sold seats: %d; blocks split: %d; SOLD lines not matching the DB: %d; ledger mismatches: %d\n",
		len(r.DoubleSold), len(r.Split), len(r.SoldMismatch), len(r.LedgerMismatch))
	adds := "yes"
	if a.Remaining != r.FreeSeats || r.SeatsSold+r.FreeSeats != a.Capacity {
		adds = "NO"
	}
	fmt.Fprintf(w, "  inventory adds up:     %s (remaining %d = free %d; sold %d + free %d = %d seats)\n",
		adds, a.Remaining, r.FreeSeats, r.SeatsSold, r.FreeSeats, a.Capacity)
	if r.OK() {
		fmt.Fprintln(w, "  audit:                 passed")
		return
	}
	fmt.Fprintf(w, "  audit:                 FAILED (%d problems)\n", len(r.Problems))
	for _, p := range r.Problems {
		fmt.Fprintln(w, "    -", p)
	}
}

// run starts the sidecar (unless cfg.Socket), sets up the event, runs the
// sellers with chaos, and audits the database. Progress goes to logw.
func run(ctx context.Context, cfg config, logw io.Writer) (*report, error) {
	start := time.Now()
	tmp, err := os.MkdirTemp("", "ticketsale-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	logf := func(format string, args ...any) { fmt.Fprintf(logw, "ticketsale: "+format+"\n", args...) }

	socket := cfg.Socket
	if socket == "" {
		dev, err := startDev(ctx, cfg.TicketingBin, tmp, logf)
		if err != nil {
			return nil, err
		}
		defer dev.stop()
		socket = dev.socket
	}
	c, err := ticketing.Dial(ctx, socket)
	if err != nil {
		return nil, err
	}
	domain, cluster, err := sidecarDomain(ctx, c)
	c.Close()
	if err != nil {
		return nil, err
	}

	db := cfg.DB
	desc := "PostgreSQL"
	if db == "" {
		db = filepath.Join(tmp, "ticketsale.db")
	}
	if !isPostgres(db) {
		desc = "SQLite " + strings.TrimPrefix(db, "sqlite:")
	}
	st, err := openStore(db)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	eventID := fmt.Sprintf("concert-%d", time.Now().UnixNano())
	if err := st.setup(ctx, eventID, cfg.Seats); err != nil {
		return nil, err
	}
	rep := &report{Event: eventID, DBDesc: desc, Domain: domain, Cluster: cluster, Chaos: cfg.Chaos}

	pyCount := cfg.PySellers
	if pyCount > 0 && isPostgres(db) {
		if err := exec.Command(cfg.Python, "-c", "import importlib.util as u, sys; sys.exit(not (u.find_spec('psycopg') or u.find_spec('psycopg2')))").Run(); err != nil {
			logf("%s has no psycopg/psycopg2: the Python sellers need a driver for PostgreSQL; running Go sellers only", cfg.Python)
			pyCount = 0
		}
	}
	goCmd := cfg.GoSeller
	if goCmd == nil {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		goCmd = []string{self, "seller"}
	}
	pyScript, pyPath, err := pythonPaths()
	if pyCount > 0 && err != nil {
		return nil, err
	}

	events := make(chan event, 256)
	var procs []*sellerProc
	var wg sync.WaitGroup
	common := func(p *sellerProc) []string {
		pause := 0
		if p.victim {
			pause = 1
		}
		args := []string{"--socket", socket, "--db", db, "--event", eventID, "--domain", domain,
			"--name", p.name, "--lease", strconv.Itoa(cfg.LeaseSec), "--max", strconv.Itoa(maxBlock), "--pause-at", strconv.Itoa(pause)}
		if p.ignoresLost {
			args = append(args, "--ignore-lost")
		}
		return args
	}
	role, err := chaosRoles(cfg.Chaos, cfg.GoSellers, pyCount)
	if err != nil {
		return nil, err
	}
	startProc := func(p *sellerProc, argv []string, env []string) error {
		p.cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
		p.cmd.Env = append(os.Environ(), env...)
		p.cmd.Stderr = prefixWriter(logw, p.name+": ")
		out, err := p.cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			return err
		}
		if err := p.cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", p.name, err)
		}
		procs = append(procs, p)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if ev, ok := parseEvent(p, sc.Text()); ok {
					events <- ev
				} else {
					logf("%s: unexpected line %q", p.name, sc.Text())
				}
			}
			p.exit = p.cmd.Wait()
			events <- event{p: p, verb: "EXIT"}
		}()
		return nil
	}
	// Chaos victims (chaosRoles) stop at their 1st attempt whose seats are
	// all free under the lock. Early, while most seats are free: a victim
	// that starts later can find every block it picks sold meanwhile until
	// the sale ends (CI once saw go-1, set to pause from its 2nd attempt,
	// lose attempts 3 to 5 that way and never pause), and then the chaos
	// did not happen.
	for i := 0; i < cfg.GoSellers; i++ {
		p := &sellerProc{name: fmt.Sprintf("go-%d", i+1), lang: "go"}
		p.victim, p.ignoresLost = role("go", i)
		if err := startProc(p, append(append([]string(nil), goCmd...), common(p)...), nil); err != nil {
			return nil, err
		}
	}
	for i := 0; i < pyCount; i++ {
		p := &sellerProc{name: fmt.Sprintf("python-%d", i+1), lang: "python"}
		p.victim, p.ignoresLost = role("python", i)
		argv := append([]string{cfg.Python, pyScript}, common(p)...)
		if err := startProc(p, argv, []string{"PYTHONPATH=" + pyPath}); err != nil {
			return nil, err
		}
	}
	logf("%d sellers selling %d seats of %s (lease %ds, chaos %v)", len(procs), cfg.Seats, eventID, cfg.LeaseSec, cfg.Chaos)

	// Chaos: each PAUSE gets a goroutine that takes the paused seller's
	// seats over once its lease has run out, then wakes it.
	var (
		mu        sync.Mutex
		takeovers sync.WaitGroup
	)
	lease := time.Duration(cfg.LeaseSec) * time.Second
	takeOver := func(p *sellerProc, paused sale, n int) {
		defer takeovers.Done()
		t := &takeover{Victim: p.name, Role: "heeds the lost signal", Paused: paused}
		if p.ignoresLost {
			t.Role = "ignores the lost signal"
		}
		start := time.Now()
		t.Sold, t.Note = runnerSale(ctx, socket, st, domain, eventID, fmt.Sprintf("runner#%d", n), paused.Seats, paused.Token, lease)
		t.After = time.Since(start)
		mu.Lock()
		rep.Takeovers = append(rep.Takeovers, t)
		mu.Unlock()
		if t.Sold != nil {
			logf("chaos: %.1fs after %s stopped, its lease ran out and the runner sold its seats %s as %s token %d; waking it",
				t.After.Seconds(), p.name, joinInts(paused.Seats), t.Sold.ID, t.Sold.Token)
		} else {
			logf("chaos: the runner did not sell %s's seats %s (%s); waking it", p.name, joinInts(paused.Seats), t.Note)
		}
		if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			logf("chaos: waking %s: %v", p.name, err)
		}
		if _, err := io.WriteString(p.stdin, "CONT\n"); err != nil {
			logf("chaos: waking %s: %v", p.name, err)
		}
	}

	running, ready, pauses := len(procs), 0, 0
	startAll := func() {
		for _, p := range procs {
			if _, err := io.WriteString(p.stdin, "GO\n"); err != nil { // stdin stays open for CONT
				logf("starting %s: %v", p.name, err)
			}
		}
	}
	for running > 0 {
		var ev event
		select {
		case ev = <-events:
		case <-ctx.Done():
			for _, p := range procs {
				p.cmd.Process.Kill()
			}
			wg.Wait()
			takeovers.Wait()
			return nil, ctx.Err()
		}
		if cfg.Verbose && ev.verb != "EXIT" && ev.verb != "READY" && ev.verb != "SOLDOUT" {
			logf("%s: %s %d %s %s", ev.p.name, ev.verb, ev.sale.Token, ev.sale.ID, joinInts(ev.sale.Seats))
		}
		switch ev.verb {
		case "SOLD":
			ev.p.sold = append(ev.p.sold, ev.sale)
		case "TAKEN":
			ev.p.taken = append(ev.p.taken, ev.sale)
		case "STALE":
			ev.p.stale = append(ev.p.stale, ev.sale)
			logf("fence: %s's write of %s was rejected", ev.p.name, ev.sale)
		case "ABORTED":
			ev.p.aborted = append(ev.p.aborted, ev.sale)
			logf("lost signal: %s aborted %s before writing", ev.p.name, ev.sale)
		case "PAUSE":
			ev.p.paused = append(ev.p.paused, ev.sale)
			if err := waitStopped(ev.p.cmd.Process.Pid, 5*time.Second); err != nil {
				logf("chaos: %v", err)
			}
			logf("chaos: %s stopped holding %s; its lease (%ds) will run out", ev.p.name, ev.sale, cfg.LeaseSec)
			pauses++
			takeovers.Add(1)
			go takeOver(ev.p, ev.sale, pauses)
		case "READY":
			// Everyone connected: start the sale at once.
			if ready++; ready == len(procs) {
				startAll()
			}
		case "EXIT":
			running--
			if ready < len(procs) {
				// Died before the start: let the others go without it.
				if ready++; ready == len(procs) {
					startAll()
				}
			}
		}
	}
	wg.Wait()
	takeovers.Wait()

	rep.Sellers = procs
	rep.Elapsed = time.Since(start)
	rep.Audit, err = st.audit(ctx, domain, eventID)
	if err != nil {
		return rep, fmt.Errorf("audit: %w", err)
	}
	rep.check()
	return rep, nil
}

// chaosRoles picks the two chaos victims: the first Go seller heeds the
// lost signal, the first Python seller ignores it (with sellers of one
// language only, its first heeds and its second ignores), so that every
// run shows both defences: the signal aborting a stale sale, and the
// fence rejecting a stale write. It returns whether seller i of a
// language is a victim and whether it ignores the signal.
func chaosRoles(chaos bool, goSellers, pySellers int) (func(lang string, i int) (victim, ignores bool), error) {
	type pick struct {
		lang string
		i    int
	}
	var heed, ignore pick
	switch {
	case !chaos:
		return func(string, int) (bool, bool) { return false, false }, nil
	case goSellers > 0 && pySellers > 0:
		heed, ignore = pick{"go", 0}, pick{"python", 0}
	case goSellers > 1:
		heed, ignore = pick{"go", 0}, pick{"go", 1}
	case pySellers > 1:
		heed, ignore = pick{"python", 0}, pick{"python", 1}
	default:
		return nil, fmt.Errorf("chaos needs two sellers (one heeds the lost signal, one ignores it so that the fence must stop its write); have %d Go and %d Python", goSellers, pySellers)
	}
	return func(lang string, i int) (bool, bool) {
		p := pick{lang, i}
		return p == heed || p == ignore, p == ignore
	}, nil
}

// sidecarDomain reads the fencing domain from the sidecar's INFO: its
// domain= field (PROTOCOL.md, INFO), not cluster=, the cluster id, which
// is "dev" for every dev cluster and so would mix the tokens of unrelated
// clusters under one high-water mark. A sidecar that has not reached a
// node yet says domain=-; it is asked again for up to 30 s.
func sidecarDomain(ctx context.Context, c *ticketing.Client) (domain, cluster string, err error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := c.Info(ctx)
		if err != nil {
			return "", "", fmt.Errorf("sidecar INFO: %w", err)
		}
		if info.Domain != "" {
			return info.Domain, info.Cluster, nil
		}
		if time.Now().After(deadline) {
			return "", "", fmt.Errorf("%w: %q", errNoDomain, info.Raw)
		}
		select {
		case <-ctx.Done():
			return "", "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// errNoDomain: the sidecar's INFO names no fencing domain.
var errNoDomain = errors.New("ticketsale: the sidecar's INFO names no fencing domain (domain=-)")

// runnerSale is the chaos takeover: it acquires seats as a block through
// the sidecar — granted only once the paused holder's lease has run out —
// and sells them under the newer token (store.sell), as the seller "runner".
// Every seat key's fence then stands above the paused holder's token. It
// returns the sale, or nil and why not: a seat sold meanwhile by another
// newer holder (queued on it before the runner), whose fence is ahead as
// well. The paused holder checked under its lock that its seats were free,
// so nobody older can have sold one.
func runnerSale(ctx context.Context, socket string, st *store, domain, event, id string, seats []int, paused uint64, lease time.Duration) (*sale, string) {
	c, err := ticketing.Dial(ctx, socket)
	if err != nil {
		return nil, err.Error()
	}
	defer c.Close()
	deadline := time.Now().Add(lease + 2*time.Minute)
	var blk *ticketing.Block
	for {
		blk, err = c.AcquireBlock(ctx, seatKeys(event, seats), lease, min(lease+60*time.Second, ticketing.MaxWait))
		if err == nil {
			break
		}
		if !retryable(err) || time.Now().After(deadline) {
			return nil, "acquire: " + err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer func() {
		if err := blk.Release(ctx); err != nil && !errors.Is(err, ticketing.ErrNotHeld) {
			fmt.Fprintf(os.Stderr, "ticketsale: runner: release %d: %v\n", blk.Token(), err)
		}
	}()
	switch err := st.sell(ctx, domain, event, id, "runner", seats, blk.Token()); {
	case err == nil:
		return &sale{Seller: "runner", ID: id, Token: blk.Token(), Seats: seats}, ""
	case errors.Is(err, errSeatTaken):
		var te *seatTakenError
		errors.As(err, &te)
		hw, _ := st.fence.HighWater(ctx, st.DB, domain, seatKey(event, te.seat))
		return nil, fmt.Sprintf("seat %d was sold meanwhile by a newer holder (its fence at token %d, above the paused %d)", te.seat, hw, paused)
	default:
		return nil, fmt.Sprintf("token %d: %v", blk.Token(), err)
	}
}

// check fills the report's findings and Problems from the sellers' lines
// and the audit of the database.
func (r *report) check() {
	a := r.Audit
	bad := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }

	// What the sellers (and the runner) reported.
	var rolledBack []sale // writes that must have left nothing behind
	for _, p := range r.Sellers {
		if p.exit != nil {
			bad("%s exited: %v", p.name, p.exit)
		}
		r.Sales = append(r.Sales, p.sold...)
		r.Stale += len(p.stale)
		r.Aborted += len(p.aborted)
		r.Taken += len(p.taken)
		rolledBack = append(append(append(rolledBack, p.stale...), p.taken...), p.aborted...)
	}
	for _, t := range r.Takeovers {
		if t.Sold != nil {
			r.Sales = append(r.Sales, *t.Sold)
		}
	}
	sort.Slice(r.Sales, func(i, j int) bool { return r.Sales[i].Token < r.Sales[j].Token })
	reported := map[string]sale{}
	reportedSeats := 0
	for _, s := range r.Sales {
		if _, dup := reported[s.ID]; dup {
			bad("sale %s reported twice", s.ID)
		}
		reported[s.ID] = s
		reportedSeats += len(s.Seats)
		if k := len(s.Seats); k >= 1 && k <= maxBlock {
			r.Sizes[k]++
		} else {
			bad("sale %s has %d seats (1..%d)", s, k, maxBlock)
		}
	}

	// The database: seats, and the ledger by seat and by sale.
	seats := map[int]seatRow{}
	for _, s := range a.Seats {
		seats[s.Seat] = s
		if s.Buyer != "" {
			r.SeatsSold++
		} else {
			r.FreeSeats++
		}
	}
	perSeat := map[int][]ledgerRow{}
	bySale := map[string][]ledgerRow{}
	for _, l := range a.Ledger {
		perSeat[l.Seat] = append(perSeat[l.Seat], l)
		bySale[l.Sale] = append(bySale[l.Sale], l)
	}

	// No seat sold twice; every seat agrees with its ledger row.
	for seat, ls := range perSeat {
		if len(ls) > 1 {
			r.DoubleSold = append(r.DoubleSold, seat)
		}
		if _, ok := seats[seat]; !ok {
			r.LedgerMismatch = append(r.LedgerMismatch, seat)
		}
	}
	sort.Ints(r.DoubleSold)
	for _, s := range a.Seats {
		ls := perSeat[s.Seat]
		if (s.Buyer == "") != (len(ls) == 0) || len(ls) > 0 && (ls[0].Sale != s.Buyer || ls[0].Token != s.Token) {
			r.LedgerMismatch = append(r.LedgerMismatch, s.Seat)
		}
	}
	sort.Ints(r.LedgerMismatch)

	// No block split: every sale of the ledger is whole adjacent seats under
	// one token, as many as the block size written and as the seller
	// reported, the very seats it reported.
	for id, ls := range bySale {
		sort.Slice(ls, func(i, j int) bool { return ls[i].Seat < ls[j].Seat })
		got := make([]int, len(ls))
		var why []string
		for i, l := range ls {
			got[i] = l.Seat
			if l.Seat != ls[0].Seat+i {
				why = appendOnce(why, "seats not adjacent")
			}
			if l.Token != ls[0].Token {
				why = appendOnce(why, "several tokens")
			}
			if l.Size != len(ls) {
				why = appendOnce(why, fmt.Sprintf("%d ledger rows of a %d-seat block", len(ls), l.Size))
			}
		}
		if rs, ok := reported[id]; !ok {
			r.SoldMismatch = append(r.SoldMismatch, fmt.Sprintf("%s (seats %s) is in the ledger, never reported SOLD", id, joinInts(got)))
		} else if joinInts(sortedInts(rs.Seats)) != joinInts(got) {
			why = append(why, fmt.Sprintf("reported seats %s, ledger seats %s", joinInts(rs.Seats), joinInts(got)))
		}
		if len(why) > 0 {
			r.Split = append(r.Split, fmt.Sprintf("%s: %s", id, strings.Join(why, ", ")))
		}
	}
	// Every SOLD line's seats are sold in the database to that sale, with
	// its token, and all of them are in the ledger.
	for _, s := range r.Sales {
		ls, ok := bySale[s.ID]
		if !ok {
			r.Split = append(r.Split, fmt.Sprintf("%s: reported SOLD, no ledger rows", s))
			continue
		}
		if ls[0].Token != s.Token {
			r.SoldMismatch = append(r.SoldMismatch, fmt.Sprintf("%s: the ledger has token %d", s, ls[0].Token))
		}
		for _, seat := range s.Seats {
			if row := seats[seat]; row.Buyer != s.ID || row.Token != s.Token {
				r.SoldMismatch = append(r.SoldMismatch, fmt.Sprintf("%s: seat %d has buyer %q token %d", s, seat, row.Buyer, row.Token))
			}
		}
	}
	sort.Strings(r.Split)
	sort.Strings(r.SoldMismatch)

	// Nothing of a rejected (STALE) or rolled-back (TAKEN) write applied.
	for _, s := range rolledBack {
		n := len(bySale[s.ID])
		for _, row := range a.Seats {
			if row.Buyer == s.ID || row.Token == s.Token {
				n++
			}
		}
		if n > 0 {
			r.Applied = append(r.Applied, fmt.Sprintf("%s: %d rows of it in the database", s, n))
		}
	}
	// The fence: every seat key's high-water mark is the token that sold
	// the seat (a stale or rolled-back write raised nothing).
	for _, row := range a.Seats {
		if row.HighWater == row.Token {
			r.HighWaterOK++
		} else {
			r.HighWaterBad = append(r.HighWaterBad, fmt.Sprintf("seat %d: high-water %d, sold with token %d", row.Seat, row.HighWater, row.Token))
		}
	}

	// Chaos: both defences happened. The victim that heeds the lost signal
	// noticed its lock was lost and did not write (a rejection by the
	// fence would be safe too, but means the signal did not do its job);
	// the one that ignores it on purpose wrote, and the fence rejected
	// the write.
	if r.Chaos {
		victims := 0
		for _, p := range r.Sellers {
			if !p.victim {
				continue
			}
			victims++
			if len(p.paused) == 0 {
				bad("%s never paused (chaos did not happen)", p.name)
			}
			for _, ps := range p.paused {
				rejected := slices.ContainsFunc(p.stale, ps.same)
				aborted := slices.ContainsFunc(p.aborted, ps.same)
				switch {
				case p.ignoresLost && aborted:
					bad("%s ignores the lost signal on purpose, but aborted %s: the fence was not tried", p.name, ps)
				case p.ignoresLost && !rejected:
					bad("%s paused holding %s past its lease and wrote without checking the lost signal, but the fence did not reject the write", p.name, ps)
				case !p.ignoresLost && rejected:
					bad("%s paused holding %s past its lease and wrote: the fence rejected it, the lost signal did not stop it", p.name, ps)
				case !p.ignoresLost && !aborted:
					bad("%s paused holding %s past its lease, but did not abort the sale on the lost signal", p.name, ps)
				}
			}
		}
		if victims != 2 {
			bad("%d chaos victims, want 2 (one heeds the lost signal, one ignores it)", victims)
		}
		if r.Stale == 0 {
			bad("no stale write rejected by the fence: the chaos did not exercise the fence")
		}
		if r.Aborted == 0 {
			bad("no sale aborted on the lost signal: the chaos did not exercise the signal")
		}
	}

	if len(r.DoubleSold) > 0 {
		bad("seats sold twice: %v", r.DoubleSold)
	}
	if len(a.Ledger) > a.Capacity {
		bad("oversold: %d ledger rows for %d seats", len(a.Ledger), a.Capacity)
	}
	for _, x := range r.Split {
		bad("block split: %s", x)
	}
	for _, x := range r.SoldMismatch {
		bad("SOLD line and database disagree: %s", x)
	}
	if len(r.LedgerMismatch) > 0 {
		bad("seats disagreeing with the ledger: %v", r.LedgerMismatch)
	}
	for _, x := range r.Applied {
		bad("a rejected or rolled-back write was applied: %s", x)
	}
	for _, x := range r.HighWaterBad {
		bad("fence: %s", x)
	}
	if len(a.Seats) != a.Capacity || r.SeatsSold+r.FreeSeats != a.Capacity {
		bad("%d seats rows, sold %d + free %d, capacity %d", len(a.Seats), r.SeatsSold, r.FreeSeats, a.Capacity)
	}
	if r.SeatsSold != len(a.Ledger) || r.SeatsSold != reportedSeats {
		bad("seats sold %d, ledger rows %d, sellers reported %d", r.SeatsSold, len(a.Ledger), reportedSeats)
	}
	if a.Remaining != r.FreeSeats || a.Remaining < 0 {
		bad("remaining counter %d, free seats %d", a.Remaining, r.FreeSeats)
	}
	if r.FreeSeats != 0 {
		bad("%d seats left unsold", r.FreeSeats)
	}
}

func appendOnce(v []string, s string) []string {
	for _, x := range v {
		if x == s {
			return v
		}
	}
	return append(v, s)
}

func sortedInts(v []int) []int {
	v = append([]int(nil), v...)
	sort.Ints(v)
	return v
}

func parseEvent(p *sellerProc, line string) (event, bool) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return event{}, false
	}
	ev := event{p: p, verb: f[0]}
	switch f[0] {
	case "SOLDOUT", "READY":
		return ev, len(f) == 1
	case "SOLD", "STALE", "TAKEN", "PAUSE", "ABORTED":
		// <verb> <token> <sale> <seat,seat,...>
		if len(f) != 4 {
			return ev, false
		}
		t, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return ev, false
		}
		ev.sale = sale{Seller: p.name, ID: f[2], Token: t}
		for _, s := range strings.Split(f[3], ",") {
			n, err := strconv.Atoi(s)
			if err != nil {
				return ev, false
			}
			ev.sale.Seats = append(ev.sale.Seats, n)
		}
		return ev, true
	}
	return ev, false
}

// waitStopped waits until the process is in the stopped state.
func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil // no procfs: trust the SIGSTOP
		}
		// pid (comm) state ...; comm may contain spaces, so cut at the last ')'.
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && len(b) > i+2 && (b[i+2] == 'T' || b[i+2] == 't') {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("process %d did not stop within %v", pid, timeout)
}

// pythonPaths finds seller.py and the Python client beside this source
// file, or from the working directory (the repository or this directory).
func pythonPaths() (script, pythonpath string, err error) {
	var dirs []string
	if _, file, _, ok := runtime.Caller(0); ok {
		dirs = append(dirs, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		dirs = append(dirs, wd, filepath.Join(wd, "clients", "examples", "ticketsale"))
	}
	for _, d := range dirs {
		script := filepath.Join(d, "seller.py")
		py := filepath.Join(d, "..", "..", "python")
		if _, err := os.Stat(script); err == nil {
			if _, err := os.Stat(filepath.Join(py, "ticketing", "fence.py")); err == nil {
				return script, filepath.Clean(py), nil
			}
		}
	}
	return "", "", errors.New("cannot find clients/examples/ticketsale/seller.py and clients/python: run from the repository")
}

// prefixWriter writes each line to w with a prefix.
func prefixWriter(w io.Writer, prefix string) io.Writer {
	pr, pw := io.Pipe()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			fmt.Fprintln(w, prefix+sc.Text())
		}
	}()
	return pw
}
