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

// sellerProc is one running seller.
type sellerProc struct {
	name   string
	lang   string
	victim bool
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	sold   []int // seats it reported SOLD
	sales  int
	stale  []uint64
	paused []uint64
	exit   error
}

// event is one line from a seller.
type event struct {
	p     *sellerProc
	verb  string
	token uint64
	seats []int
}

// report is the outcome of a run.
type report struct {
	Event, DBDesc, Domain string
	Sellers               []*sellerProc
	Audit                 audit
	ReportedSold          int
	MaxToken              uint64 // the largest token any seller held
	MaxSold               uint64 // the largest token that committed a sale
	Stale                 int
	Chaos                 bool
	Problems              []string
	Elapsed               time.Duration
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
	sales := 0
	for _, p := range r.Sellers {
		sales += p.sales
	}
	fmt.Fprintf(w, "  seats sold:            %d of %d in %d sales (remaining counter %d, free seats %d)\n",
		a.SeatsSold, a.Capacity, sales, a.Remaining, a.FreeSeats)
	var st []string
	for _, p := range r.Sellers {
		for _, t := range p.stale {
			st = append(st, fmt.Sprintf("%s token %d", p.name, t))
		}
	}
	fmt.Fprintf(w, "  rejected stale writes: %d", r.Stale)
	if len(st) > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(st, ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  largest token:         %d (fence high-water %d)\n", r.MaxToken, a.HighWater)
	oversold := "no"
	if a.SalesRows > a.Capacity {
		oversold = "YES"
	}
	fmt.Fprintf(w, "  oversold: %s; double-sold seats: %d; ledger mismatches: %d\n",
		oversold, len(a.DoubleSold), len(a.Mismatched))
	if r.OK() {
		fmt.Fprintln(w, "  inventory adds up:     yes")
		return
	}
	fmt.Fprintln(w, "  inventory adds up:     NO")
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
	info, err := c.Info(ctx)
	c.Close()
	if err != nil {
		return nil, fmt.Errorf("sidecar INFO: %w", err)
	}
	domain := "dev"
	for _, f := range strings.Fields(info) {
		if v, ok := strings.CutPrefix(f, "cluster="); ok && v != "-" {
			domain = v
		}
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
	key := "event/" + eventID
	rep := &report{Event: eventID, DBDesc: desc, Domain: domain, Chaos: cfg.Chaos}

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
	common := func(name string, pauseAt int) []string {
		return []string{"--socket", socket, "--db", db, "--event", eventID, "--domain", domain,
			"--name", name, "--lease", strconv.Itoa(cfg.LeaseSec), "--max", "3", "--pause-at", strconv.Itoa(pauseAt)}
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
	// Chaos victims: the first Go seller stops at its 2nd sale, the first
	// Python seller at its 1st.
	for i := 0; i < cfg.GoSellers; i++ {
		p := &sellerProc{name: fmt.Sprintf("go-%d", i+1), lang: "go", victim: cfg.Chaos && i == 0}
		pause := 0
		if p.victim {
			pause = 2
		}
		if err := startProc(p, append(append([]string(nil), goCmd...), common(p.name, pause)...), nil); err != nil {
			return nil, err
		}
	}
	for i := 0; i < pyCount; i++ {
		p := &sellerProc{name: fmt.Sprintf("python-%d", i+1), lang: "python", victim: cfg.Chaos && i == 0}
		pause := 0
		if p.victim {
			pause = 1
		}
		argv := append([]string{cfg.Python, pyScript}, common(p.name, pause)...)
		if err := startProc(p, argv, []string{"PYTHONPATH=" + pyPath}); err != nil {
			return nil, err
		}
	}
	logf("%d sellers selling %d seats of %s (lease %ds, chaos %v)", len(procs), cfg.Seats, eventID, cfg.LeaseSec, cfg.Chaos)

	// Chaos: each PAUSE gets a goroutine that waits until the lease has run
	// out and a newer token has sold, then sends SIGCONT.
	var (
		mu       sync.Mutex
		maxSold  uint64
		maxToken uint64
		sold     = make(chan struct{}, 1) // pulses on every SOLD
	)
	lease := time.Duration(cfg.LeaseSec) * time.Second
	wake := func(p *sellerProc, token uint64) {
		paused := time.Now()
		deadline := paused.Add(lease + 60*time.Second)
		for {
			mu.Lock()
			newer := maxSold > token
			mu.Unlock()
			if newer && time.Since(paused) > lease+500*time.Millisecond {
				break
			}
			if time.Now().After(deadline) {
				logf("chaos: no newer sale after %s paused with token %d; waking it anyway", p.name, token)
				break
			}
			select {
			case <-sold:
			case <-time.After(100 * time.Millisecond):
			}
		}
		logf("chaos: waking %s (token %d) after %.1fs; a newer token has sold", p.name, token, time.Since(paused).Seconds())
		p.cmd.Process.Signal(syscall.SIGCONT)
		io.WriteString(p.stdin, "CONT\n")
	}

	running, ready := len(procs), 0
	startAll := func() {
		for _, p := range procs {
			io.WriteString(p.stdin, "GO\n") // stdin stays open for CONT
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
			return nil, ctx.Err()
		}
		maxToken = max(maxToken, ev.token)
		if cfg.Verbose && ev.verb != "EXIT" && ev.verb != "READY" {
			logf("%s: %s %d %s", ev.p.name, ev.verb, ev.token, joinInts(ev.seats))
		}
		switch ev.verb {
		case "SOLD":
			ev.p.sales++
			ev.p.sold = append(ev.p.sold, ev.seats...)
			mu.Lock()
			maxSold = max(maxSold, ev.token)
			mu.Unlock()
			select {
			case sold <- struct{}{}:
			default:
			}
		case "STALE":
			ev.p.stale = append(ev.p.stale, ev.token)
			logf("fence: %s's write with token %d (seats %s) was rejected", ev.p.name, ev.token, joinInts(ev.seats))
		case "PAUSE":
			ev.p.paused = append(ev.p.paused, ev.token)
			if err := waitStopped(ev.p.cmd.Process.Pid, 5*time.Second); err != nil {
				logf("chaos: %v", err)
			}
			logf("chaos: %s stopped holding token %d; its lease (%ds) will run out", ev.p.name, ev.token, cfg.LeaseSec)
			go wake(ev.p, ev.token)
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

	rep.Sellers = procs
	rep.MaxSold = maxSold
	rep.MaxToken = maxToken
	rep.Elapsed = time.Since(start)
	rep.Audit, err = st.audit(ctx, domain, eventID, key)
	if err != nil {
		return rep, fmt.Errorf("audit: %w", err)
	}
	rep.check()
	return rep, nil
}

// check fills Problems from the sellers' reports and the audit.
func (r *report) check() {
	a := r.Audit
	bad := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }
	for _, p := range r.Sellers {
		if p.exit != nil {
			bad("%s exited: %v", p.name, p.exit)
		}
		r.Stale += len(p.stale)
		r.ReportedSold += len(p.sold)
		if p.victim && r.Chaos {
			if len(p.paused) == 0 {
				bad("%s never paused (chaos did not happen)", p.name)
			}
			for _, t := range p.paused {
				if !containsU(p.stale, t) {
					bad("%s paused with token %d past its lease, but its write was not rejected", p.name, t)
				}
			}
		}
	}
	if a.HighWater != r.MaxSold {
		bad("fence high-water %d, largest token that sold %d", a.HighWater, r.MaxSold)
	}
	if a.SalesRows > a.Capacity {
		bad("oversold: %d sales rows for %d seats", a.SalesRows, a.Capacity)
	}
	if len(a.DoubleSold) > 0 {
		bad("double-sold seats: %v", a.DoubleSold)
	}
	if len(a.Mismatched) > 0 {
		bad("seats disagreeing with the ledger: %v", a.Mismatched)
	}
	if a.SeatsSold != a.SalesRows || a.SeatsSold != r.ReportedSold {
		bad("seats sold %d, ledger rows %d, sellers reported %d", a.SeatsSold, a.SalesRows, r.ReportedSold)
	}
	if a.Remaining != a.FreeSeats || a.Remaining < 0 {
		bad("remaining counter %d, free seats %d", a.Remaining, a.FreeSeats)
	}
	if a.FreeSeats != 0 {
		bad("%d seats left unsold", a.FreeSeats)
	}
}

func containsU(v []uint64, x uint64) bool {
	for _, y := range v {
		if y == x {
			return true
		}
	}
	return false
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
	case "SOLD", "STALE", "PAUSE":
		if len(f) < 2 {
			return ev, false
		}
		t, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return ev, false
		}
		ev.token = t
		if f[0] != "PAUSE" {
			if len(f) != 3 {
				return ev, false
			}
			for _, s := range strings.Split(f[2], ",") {
				n, err := strconv.Atoi(s)
				if err != nil {
					return ev, false
				}
				ev.seats = append(ev.seats, n)
			}
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
