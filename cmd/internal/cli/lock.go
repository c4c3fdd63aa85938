package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	ticketing "ticketing/clients/go"
)

// Exit codes of the client commands (lock, acquire, release, ping, info).
// A script must tell "fix your command" from "retry later" from "the lock
// was not taken", and `lock` passes on its COMMAND's own code, so lock's
// own codes sit away from the small codes commands usually return and
// from 126..165 (shell: not executable, not found, signals): 64 and 69 as
// sysexits(3) defines them (EX_USAGE, EX_UNAVAILABLE), and 75..80. They
// are documented in unixapi/PROTOCOL.md. Until issue 32 (December 2026),
// 78 covered the usage errors and the unavailable cluster too.
const (
	ExitLockUsage     = 64 // EX_USAGE: bad flags or arguments (also a key or value the sidecar refuses as invalid): fix the command
	ExitUnavailable   = 69 // EX_UNAVAILABLE: no sidecar at the socket, or the cluster cannot serve now (unavailable, moved, no_quorum, shutting_down, too_many_connections, the connection to the sidecar lost): retry later
	ExitBusy          = 75 // key held and --wait 0: not acquired
	ExitTimeout       = 76 // the wait ran out: not acquired
	ExitIndeterminate = 77 // outcome unknown: not acquired as far as the caller may assume
	ExitLockError     = 78 // any other failure: another ERR reply (not_held, forbidden, too_many_waiters, ...), COMMAND not startable, the token not writable
	ExitUnconfirmed   = 79 // the command ran, but the release was not confirmed (acquire --hold: the connection was lost)
	// ExitLost: lock only. The lock was lost while the command ran (the
	// sidecar's lost event, the local deadline — lease − margin, counted
	// from the ACQUIRE or the last EXTEND —, an extend refused, or the
	// connection to the sidecar lost): the command was sent SIGTERM, and
	// SIGKILL after --kill-grace.
	ExitLost = 80
)

// defaultKillGrace is how long lock waits after SIGTERM before SIGKILL
// when the lock is lost (--kill-grace).
const defaultKillGrace = 5 * time.Second

// exitHelp is the "exit codes" part of a client command's -h: each
// command lists only the codes it can return.
func exitHelp(name string) string {
	const usage = "64 usage (bad flags or arguments: fix the command)"
	const unavailable = "69 unavailable (no sidecar at the socket, or the cluster cannot serve now:\n" +
		"  unavailable, moved, no_quorum, shutting_down, too_many_connections, the\n" +
		"  sidecar connection lost; retry later)"
	const notTaken = "75 busy (--wait 0 and the key is held), 76 timeout,\n" +
		"  77 indeterminate (do not assume the lock was taken)"
	switch name {
	case "lock":
		return "exit codes: COMMAND's own code when the lock was taken, COMMAND ran and the\n" +
			"  release was confirmed; " + usage + ",\n  " + unavailable + ",\n  " + notTaken + ",\n" +
			"  78 any other error (another ERR reply such as forbidden; COMMAND could not\n" +
			"  start), 79 COMMAND ran but its release was not confirmed,\n" +
			"  80 the lock was lost while COMMAND ran, which was sent SIGTERM, then SIGKILL\n" +
			"  after --kill-grace."
	case "acquire":
		return "exit codes: 0 the token was printed (and, without --hold, the lock released);\n  " +
			usage + ",\n  " + unavailable + ",\n  " + notTaken + ",\n" +
			"  78 any other error (another ERR reply such as forbidden; the token could not\n" +
			"  be written, and the lock was released), 79 the release was not confirmed, or\n" +
			"  (--hold) the connection to the sidecar was lost while holding, 80 (--hold)\n" +
			"  the lock was lost while holding (its lease ran out: --no-extend, or the\n" +
			"  renewals failed)."
	case "permits":
		return "exit codes: 0 set; " + usage + ",\n  " + unavailable + ",\n" +
			"  77 indeterminate (it may or may not have applied: check the key with\n" +
			"  ticketing inspect before setting it again),\n" +
			"  78 any other error (in_use: held as a lock, or permits held or awaited;\n" +
			"  not_semaphore: 0 of a key that is no semaphore; not_supported)."
	case "release":
		return "exit codes: 0 released; " + usage + ",\n  " + unavailable + ",\n" +
			"  78 any other error (not_held: not this connection's lock; token_mismatch),\n" +
			"  79 the outcome is unknown (INDETERMINATE)."
	}
	return "exit codes: 0 the sidecar answered;\n  " + usage + ",\n  " + unavailable + ",\n" +
		"  78 any other error."
}

// clientFlags are the flags shared by the client commands.
type clientFlags struct {
	socket string
	lease  int
	wait   float64
	label  string // --label: the acquire's owner label ("" = none)
}

func (c *clientFlags) register(fs *flag.FlagSet, withLock bool) {
	fs.StringVar(&c.socket, "socket", defaultSocket(), "the sidecar's unix socket: $TICKETING_SOCKET when set, else ./ticketing.sock")
	if withLock {
		fs.IntVar(&c.lease, "lease", 60, "lease in whole seconds (1..250): the server takes the lock back after it")
		fs.Float64Var(&c.wait, "wait", 30, "seconds to wait for the turn, millisecond precision (0 = one immediate try, at most 3600; over 300 needs a sidecar and cluster of this release)")
		fs.StringVar(&c.label, "label", "", "an owner `label` for the lock (a job name, a request id: 1..64 bytes of visible ASCII, no spaces), shown by `ticketing inspect`, the sidecar's HELD and log; needs every node at cluster protocol version 8 (ticketing status --json: cluster_version)")
	}
}

// acquireOpts are the acquire options the flags ask for (the label).
func (c *clientFlags) acquireOpts() []ticketing.AcquireOption {
	if c.label == "" {
		return nil
	}
	return []ticketing.AcquireOption{ticketing.WithLabel(c.label)}
}

// check says what is wrong with --lease and --wait, in the units the user
// typed them in ("" when both are fine).
func (c *clientFlags) check() string {
	if c.lease < 1 || c.lease > 250 {
		return fmt.Sprintf("--lease %d: want whole seconds 1..250", c.lease)
	}
	ms := c.wait * 1000
	if c.wait < 0 || c.wait > 3600 || math.IsNaN(c.wait) || math.Abs(ms-math.Round(ms)) > 1e-6 {
		return fmt.Sprintf("--wait %s: want seconds 0..3600 with at most 3 decimals",
			strconv.FormatFloat(c.wait, 'f', -1, 64))
	}
	return labelProblem(c.label)
}

// labelProblem says what is wrong with --label l ("" when it is fine or
// not given), naming the rule it breaks: a message listing every rule
// ("..., not \"-\"") read as if the label given had been "-".
func labelProblem(l string) string {
	switch {
	case l == "":
		return ""
	case l == "-":
		return `--label "-": "-" alone stands for "no label" in HELD and the logs; choose another label`
	case len(l) > ticketing.MaxLabelLen:
		return fmt.Sprintf("--label %q: %d bytes; want at most %d", l, len(l), ticketing.MaxLabelLen)
	case strings.IndexFunc(l, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0:
		return fmt.Sprintf("--label %q: want visible ASCII only (0x21..0x7E: no spaces, no other characters)", l)
	}
	return ""
}

func (c *clientFlags) durations() (lease, wait time.Duration) {
	return time.Duration(c.lease) * time.Second, time.Duration(math.Round(c.wait*1000)) * time.Millisecond
}

// Error codes of the sidecar that say the request was not executed and
// the same command may succeed later (ExitUnavailable), and those that say
// the request itself was wrong (ExitLockUsage).
var (
	transientErrs = []error{ticketing.ErrNoSidecar, ticketing.ErrClosed, ticketing.ErrUnavailable,
		&ticketing.Error{Code: "moved"}, &ticketing.Error{Code: "no_quorum"},
		&ticketing.Error{Code: "shutting_down"}, &ticketing.Error{Code: "too_many_connections"}}
	usageErrs = []error{ticketing.ErrInvalidArgument, ticketing.ErrInvalidKey, ticketing.ErrInvalidKeys,
		ticketing.ErrInvalidLease, ticketing.ErrInvalidWait, ticketing.ErrInvalidPermits}
)

// clientExit maps a client error to an exit code.
func clientExit(err error) int {
	is := func(targets []error) bool {
		for _, t := range targets {
			if errors.Is(err, t) {
				return true
			}
		}
		return false
	}
	switch {
	case errors.Is(err, ticketing.ErrBusy):
		return ExitBusy
	case errors.Is(err, ticketing.ErrTimeout):
		return ExitTimeout
	case errors.Is(err, ticketing.ErrIndeterminate):
		return ExitIndeterminate
	case is(usageErrs):
		return ExitLockUsage
	case is(transientErrs):
		return ExitUnavailable
	}
	return ExitLockError
}

// newClientFlags is the flag set of a client command. A bad invocation
// exits with ExitLockUsage (EX_USAGE), not 2: `lock` passes on its
// COMMAND's own exit code, so its own failures keep to 64, 69 and 75..80,
// away from the small codes (2 among them) that the COMMAND may return.
func newClientFlags(name, synopsis, about string, stdout, stderr io.Writer) *cmdFlags {
	c := newCmdFlags("ticketing "+name, "ticketing "+name+" "+synopsis, about, stdout, stderr)
	c.after = exitHelp(name)
	c.badCode = ExitLockUsage
	return c
}

// dial connects to the sidecar; on failure it says so, naming the socket
// and what to start (the client's ErrNoSidecar message), and returns nil
// and the exit code.
func dial(ctx context.Context, name, socket string, stderr io.Writer) (*ticketing.Client, int) {
	c, err := ticketing.Dial(ctx, socket)
	if err != nil {
		fmt.Fprintf(stderr, "ticketing %s: %v\n", name, err)
		return nil, clientExit(err)
	}
	return c, ExitOK
}

// extendEvery is lock's --extend-every: how often the lease is renewed
// while COMMAND runs. The zero value is the default, "auto": a third of
// the lease (autoExtendFraction); 0 turns renewal off.
type extendEvery struct {
	d   time.Duration
	set bool // a duration was given (0 included); false: auto
}

func (e *extendEvery) String() string {
	if e == nil || !e.set {
		return "auto"
	}
	return e.d.String()
}

func (e *extendEvery) Set(s string) error {
	if s == "auto" {
		*e = extendEvery{}
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as 10s, 0 (off) or auto (a third of --lease)")
	}
	*e = extendEvery{d: d, set: true}
	return nil
}

// autoExtendFraction: by default lock renews the lease every lease/3, as
// etcd's keep-alive does with a lease's TTL. The lock's local deadline is
// lease − margin (250 ms + 1 %) after the last renewal's send, so two
// renewals fall inside every lease: one may fail (unavailable during an
// election, INDETERMINATE, a slow reply) and the next, a third of a lease
// later, still lands before the deadline. Each renewal is one Raft commit,
// so a 60 s lease costs one commit every 20 s.
const autoExtendFraction = 3

// maxExtendEvery is the longest renewal period for a lease: half of what
// the lock's local deadline leaves (lease − margin), so that two renewals
// fall inside every lease and one may fail (unavailable during an
// election, INDETERMINATE, a slow reply) while the next still lands before
// the deadline. A period just under the deadline left no room for either.
func maxExtendEvery(lease time.Duration) time.Duration {
	return ((lease - ticketing.Margin(lease)) / 2).Truncate(time.Millisecond)
}

// interval is the renewal period for a lease: 0 means never.
func (e extendEvery) interval(lease time.Duration, off bool) time.Duration {
	switch {
	case off:
		return 0
	case e.set:
		return e.d
	}
	return lease / autoExtendFraction
}

// runLock is flock(1) for Ticketing: acquire, run the command, release.
// With several keys it takes them as one seat block (all or none, one
// token) and the keys end at the "--". While the command runs the lease is
// renewed (every lease/3 unless --extend-every says otherwise), like
// etcdctl lock and consul lock keep their sessions alive; when the lock is
// lost all the same (the key moved on, the renewals failed until the
// deadline, the sidecar went away), the command is stopped (SIGTERM, then
// SIGKILL) and lock exits ExitLost.
func runLock(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var cf clientFlags
	var every extendEvery
	var noExtend bool
	var grace time.Duration
	var verbose, permit bool
	fs := newClientFlags("lock", "[--socket PATH] [--lease S] [--wait S] [--label L] [--permit] [--extend-every D|--no-extend] [--kill-grace D] [--verbose] KEY [KEY...] -- COMMAND [ARG...]",
		"Takes the lock KEY through the sidecar, runs COMMAND with TICKETING_KEY,\n"+
			"TICKETING_KEYS and TICKETING_TOKEN in its environment, and releases the lock\n"+
			"when COMMAND exits (like flock(1)). Signals are passed on to COMMAND.\n\n"+
			"With several KEYs (at most 16, distinct; the -- after them is required) it\n"+
			"takes them as one seat block: all at once or none, under one token, released\n"+
			"together. TICKETING_KEY is the first KEY, TICKETING_KEYS all of them separated\n"+
			"by spaces.\n\n"+
			"With --permit, KEY (one) is a semaphore (`ticketing permits set KEY N`) and\n"+
			"lock holds one of its N permits while COMMAND runs: TICKETING_TOKEN is the\n"+
			"permit's own token, TICKETING_SLOT its slot (0..N-1) and TICKETING_FENCE_KEY\n"+
			"\"KEY SLOT\" (a space between: no key holds one, so it names no lock key), the\n"+
			"resource to fence COMMAND's writes under (one fencing domain per slot; quote\n"+
			"it in the shell). It is renewed, lost and released as a lock is.\n\n"+
			"While COMMAND runs, lock renews the lease (by --lease) every third of it\n"+
			"(--extend-every auto, the default), so COMMAND may run as long as it needs:\n"+
			"one renewal may fail and the next still comes before the lease ends.\n"+
			"--extend-every D renews every D instead; --no-extend (or --extend-every 0)\n"+
			"never renews, so COMMAND has one lease.\n\n"+
			"If the lock is lost while COMMAND runs (its lease ran out: the sidecar's lost\n"+
			"event or the local deadline, lease minus 250 ms + 1 % after the last renewal;\n"+
			"an extend refused; the sidecar connection lost), COMMAND gets SIGTERM, then\n"+
			"SIGKILL after --kill-grace, and lock exits 80.\n\n"+
			"With --verbose, lock says on stderr when it waits in line: once the cluster has\n"+
			"queued its request behind a holder, it prints\n"+
			"  ticketing lock: queued on KEY (waiting up to Ns)\n"+
			"and then, each time its place in line or the estimate changes (from a sidecar\n"+
			"of protocol version 7, at most about once a second; a block: per KEY),\n"+
			"  ticketing lock: position P in line for KEY (about Ss)\n"+
			"or, while the cluster has no estimate yet,\n"+
			"  ticketing lock: position P in line for KEY (no estimate yet)\n"+
			"P is 1 when it is next; S is the estimated wait left, in whole seconds.", stdout, stderr)
	cf.register(fs.FlagSet, true)
	fs.Var(&every, "extend-every", "renew the lease (by --lease) this often while COMMAND runs: auto (a third of the lease), "+
		"a duration of at most half the lease less its margin such as 10s, or 0 (never, as --no-extend)")
	fs.BoolVar(&noExtend, "no-extend", false, "never renew the lease: COMMAND has one lease (as --extend-every 0)")
	fs.DurationVar(&grace, "kill-grace", defaultKillGrace, "when the lock is lost: how long COMMAND has between SIGTERM and SIGKILL")
	fs.BoolVar(&permit, "permit", false, "take one permit of the semaphore KEY (one KEY) instead of a lock; "+
		"TICKETING_SLOT and TICKETING_FENCE_KEY (\"KEY SLOT\") join the environment")
	fs.BoolVar(&verbose, "verbose", false, "say on stderr when the request is queued behind a holder (it waits for its turn), "+
		"then its place in line and the estimated wait as they change")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if flagsEndedAtDashes(fs.FlagSet, args) && !slices.Contains(fs.Args(), "--") {
		// "lock [flags] -- sleep 20": the "--" was meant to end the keys,
		// and without this the command's name would be taken for the KEY.
		return fs.bad("no KEY before %q: want KEY [KEY...] -- COMMAND (for a KEY that starts with \"-\": -- KEY -- COMMAND)", "--")
	}
	keys, argv := lockArgs(fs.Args())
	switch {
	case len(keys) == 0:
		return fs.bad("want KEY and a COMMAND to run")
	case len(argv) == 0 && len(keys) == 1:
		return fs.bad("want a COMMAND to run after KEY %q", keys[0])
	case len(argv) == 0:
		return fs.bad("want a COMMAND to run after the KEYs %q", keys)
	case len(keys) > ticketing.MaxBlockKeys:
		return fs.bad("%d KEYs: a block has at most %d", len(keys), ticketing.MaxBlockKeys)
	case permit && len(keys) > 1:
		return fs.bad("--permit takes one KEY (a semaphore), got %d: %q", len(keys), keys)
	}
	if k := repeated(keys); k != "" {
		return fs.bad("KEY %q named twice: the keys of a block are distinct", k)
	}
	if why := badKey(keys...); why != "" {
		return fs.bad("%s", why)
	}
	if why := cf.check(); why != "" {
		return fs.bad("%s", why)
	}
	lease, wait := cf.durations()
	if noExtend && every.set && every.d != 0 {
		return fs.bad("--no-extend and --extend-every %v: give one of them", every.d)
	}
	if most := maxExtendEvery(lease); every.set && (every.d < 0 || every.d > most) {
		return fs.bad("--extend-every %v: want auto, 0 (off) or at most half the lease less its margin (%v for --lease %d), "+
			"so that a renewal may fail and the next still lands in time", every.d, most, cf.lease)
	}
	period := every.interval(lease, noExtend)
	if grace < 0 {
		return fs.bad("--kill-grace %v: want a duration of 0 or more", grace)
	}
	what := keys[0]
	if len(keys) > 1 {
		what = "block " + strings.Join(keys, " ")
	}
	c, code := dial(ctx, "lock", cf.socket, stderr)
	if c == nil {
		return code
	}
	defer c.Close()
	opts := cf.acquireOpts()
	if verbose {
		// The hook runs on the client's reader, before the grant comes:
		// one short write.
		opts = append(opts, ticketing.WithQueued(func() {
			fmt.Fprintf(stderr, "ticketing lock: queued on %s (waiting up to %ss)\n", what, strconv.FormatFloat(cf.wait, 'f', -1, 64))
		}), ticketing.WithPosition(positionPrinter(stderr)))
	}
	var lk *ticketing.Lock
	var err error
	if permit {
		what = "permit of " + keys[0]
		lk, err = c.LockPermit(ctx, keys[0], lease, wait, opts...)
	} else {
		lk, err = lockKeys(ctx, c, keys, lease, wait, opts...)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ticketing lock: %s: %v\n", strings.Join(keys, " "), err)
		return clientExit(err)
	}
	tok := lk.Token()
	if permit {
		what = fmt.Sprintf("permit %s slot %d", keys[0], lk.Slot())
	}
	// The lock's deadline counts from the ACQUIRE's send, so a grant that
	// waited has less than a lease left: renew it once, so COMMAND has a
	// whole lease from its start (or, while renewing, until the first
	// renewal). The client has already renewed a grant that waited more
	// than half its lease (which may have come lost otherwise); this
	// renews a shorter wait. A failure here is no loss: the deadline stays.
	if lk.Remaining() < lease-ticketing.Margin(lease)-time.Second {
		if err := extendOnce(lk, lease); err != nil && !errors.Is(err, ticketing.ErrLockLost) {
			fmt.Fprintf(stderr, "ticketing lock: extend of %s (token %d) after the wait: %v; the lock is valid for %v\n",
				what, tok, err, lk.Remaining().Round(time.Millisecond))
		}
	}
	select {
	case <-lk.Lost():
		fmt.Fprintf(stderr, "ticketing lock: lock %s (token %d) lost before COMMAND started (%s)\n", what, tok, lostWhy(lk))
		releaseOrReport("lock", lk, what, stderr)
		return ExitLost
	default:
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(), "TICKETING_KEY="+keys[0], "TICKETING_KEYS="+strings.Join(keys, " "),
		"TICKETING_TOKEN="+strconv.FormatUint(tok, 10))
	if permit {
		cmd.Env = append(cmd.Env, "TICKETING_SLOT="+strconv.Itoa(lk.Slot()), "TICKETING_FENCE_KEY="+lk.FenceKey())
	}
	// Signals to us are passed on to the command, which decides when to
	// stop; we release only after it has exited.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "ticketing lock:", err)
		releaseOrReport("lock", lk, what, stderr)
		return ExitLockError
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	var tick <-chan time.Time
	if period > 0 {
		t := time.NewTicker(period)
		defer t.Stop()
		tick = t.C
	}
	// One EXTEND at a time (the sidecar refuses a second one with
	// extend_in_progress); a tick while one runs is skipped.
	extended := make(chan error, 1)
	extending := false
	lost := lk.Lost()
	var kill <-chan time.Time
	wasLost := false
	for running := true; running; {
		select {
		case <-exited:
			running = false
		case s := <-sigs:
			_ = cmd.Process.Signal(s) // fails only once the command has exited, which exited reports
		case <-tick:
			if !extending {
				extending = true
				go func() { extended <- extendOnce(lk, lease) }()
			}
		case err := <-extended:
			extending = false
			if err != nil && !errors.Is(err, ticketing.ErrLockLost) {
				// Not a loss by itself (indeterminate, unavailable, ...):
				// the next tick tries again before the deadline.
				fmt.Fprintf(stderr, "ticketing lock: extend of %s (token %d): %v; valid for %v more unless a later extend succeeds\n",
					what, tok, err, lk.Remaining().Round(time.Millisecond))
			}
		case <-lost:
			lost, tick, wasLost = nil, nil, true
			fmt.Fprintf(stderr, "ticketing lock: lock %s (token %d) lost (%s) while the command runs: sending it SIGTERM, SIGKILL in %v\n",
				what, tok, lostWhy(lk), grace)
			_ = cmd.Process.Signal(syscall.SIGTERM) // fails only once the command has exited
			kill = time.After(grace)
		case <-kill:
			kill = nil
			fmt.Fprintf(stderr, "ticketing lock: the command is still running %v after SIGTERM: SIGKILL\n", grace)
			cmd.Process.Kill()
		}
	}
	code = cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal()) // as shells report it
	}
	if wasLost {
		// A lock lost only to the local deadline may still be held:
		// releasing frees it sooner. Its failure is expected, not news.
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = lk.Release(rctx)
		cancel()
		fmt.Fprintf(stderr, "ticketing lock: the command exited with %d after the lock was lost\n", code)
		return ExitLost
	}
	if !releaseOrReport("lock", lk, what, stderr) {
		fmt.Fprintf(stderr, "ticketing lock: the command exited with %d\n", code)
		return ExitUnconfirmed
	}
	return code
}

// extendOnce renews lk's lease, with its own deadline (the sidecar answers
// an EXTEND within 5 s).
func extendOnce(lk *ticketing.Lock, lease time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return lk.Extend(ctx, lease)
}

// flagsEndedAtDashes reports whether parsing args with fs stopped at a
// "--" that ended the flags (not one that was a flag's value).
func flagsEndedAtDashes(fs *flag.FlagSet, args []string) bool {
	i := len(args) - len(fs.Args()) - 1 // the last argument the flags took
	if i < 0 || args[i] != "--" {
		return false
	}
	if i == 0 {
		return true
	}
	name, hasValue := strings.TrimLeft(args[i-1], "-"), strings.Contains(args[i-1], "=")
	f := fs.Lookup(name)
	if !strings.HasPrefix(args[i-1], "-") || hasValue || f == nil {
		return true
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag() // else "--" was the value of the flag before it
}

// lockArgs splits lock's arguments into its keys and the command. "K --
// CMD..." and, without a "--", "K CMD..." are one key, as they always
// were; otherwise the keys are everything before the first "--".
func lockArgs(rest []string) (keys, argv []string) {
	switch {
	case len(rest) == 0:
		return nil, nil
	case len(rest) >= 2 && rest[1] == "--":
		return rest[:1], rest[2:]
	}
	if i := slices.Index(rest, "--"); i > 0 {
		return rest[:i], rest[i+1:]
	}
	return rest[:1], rest[1:]
}

// repeated returns a key named twice in keys, or "".
func repeated(keys []string) string {
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if seen[k] {
			return k
		}
		seen[k] = true
	}
	return ""
}

// releaseOrReport releases lk (a block: all of its keys) with its own
// deadline (the caller's context may be cancelled by the signal that
// stopped the command) and reports failure, naming the lock as what.
func releaseOrReport(name string, lk *ticketing.Lock, what string, stderr io.Writer) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lk.Release(ctx); err != nil {
		fmt.Fprintf(stderr, "ticketing %s: release of %s (token %d) not confirmed: %v; the lease ends it at the latest\n", name, what, lk.Token(), err)
		return false
	}
	return true
}

// runAcquire takes a lock (or, given several keys, a seat block) and prints
// its token. The lock belongs to this command's connection, so it ends with
// the command: without --hold it is released before exiting; with --hold it
// is kept until SIGINT/SIGTERM.
func runAcquire(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var cf clientFlags
	var hold, noExtend bool
	fs := newClientFlags("acquire", "[--socket PATH] [--lease S] [--wait S] [--label L] [--hold [--no-extend]] KEY [KEY...]",
		"Prints the token. A lock belongs to the connection that took it: without\n"+
			"--hold it is released again before the command exits (a probe); with --hold\n"+
			"the command keeps it until SIGINT or SIGTERM, renewing its lease every third\n"+
			"of it (as lock does; --no-extend: never), then releases it. If the lock is\n"+
			"lost meanwhile (its lease ran out, the renewals failed) it says so and exits\n"+
			"80. Several KEYs (at most 16, distinct) are one seat block: all or none,\n"+
			"under one token.", stdout, stderr)
	cf.register(fs.FlagSet, true)
	fs.BoolVar(&hold, "hold", false, "keep the lock until SIGINT/SIGTERM, renewing its lease every third of it as lock does, then release it")
	fs.BoolVar(&noExtend, "no-extend", false, "with --hold: never renew the lease, so the lock ends with it (the command then exits 80)")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if noExtend && !hold {
		return fs.bad("--no-extend is for --hold: without it the lock is released at once")
	}
	keys := fs.Args()
	switch {
	case len(keys) == 0:
		return fs.bad("want one KEY (or up to %d, a block), got no arguments", ticketing.MaxBlockKeys)
	case len(keys) > ticketing.MaxBlockKeys:
		return fs.bad("want one KEY (or up to %d, a block), got %d arguments", ticketing.MaxBlockKeys, len(keys))
	}
	if k := repeated(keys); k != "" {
		return fs.bad("KEY %q named twice: the keys of a block are distinct", k)
	}
	if why := badKey(keys...); why != "" {
		return fs.bad("%s", why)
	}
	if why := cf.check(); why != "" {
		return fs.bad("%s", why)
	}
	what := strings.Join(keys, " ")
	c, code := dial(ctx, "acquire", cf.socket, stderr)
	if c == nil {
		return code
	}
	defer c.Close()
	lease, wait := cf.durations()
	lk, err := lockKeys(ctx, c, keys, lease, wait, cf.acquireOpts()...)
	if err != nil {
		fmt.Fprintf(stderr, "ticketing acquire: %s: %v\n", what, err)
		return clientExit(err)
	}
	// The caller learns of the lock only from this line: without the token
	// it can neither fence a write nor know that it holds anything. A token
	// that could not be written (stdout a full disk, a closed descriptor)
	// is a lock nobody can use: release it at once, --hold or not, and
	// fail (78; 79 if that release is not confirmed either). (A closed
	// stdout pipe does not get here: Go's default SIGPIPE ends the
	// process, whose connection closes, and the sidecar releases the lock.)
	// os.File is unbuffered: once Fprintln returns, a script reading the
	// pipe can read the token.
	if _, err := fmt.Fprintln(stdout, lk.Token()); err != nil {
		fmt.Fprintf(stderr, "ticketing acquire: %s: the token could not be written to stdout (%v); releasing the lock\n", what, err)
		if !releaseOrReport("acquire", lk, what, stderr) {
			return ExitUnconfirmed
		}
		return ExitLockError
	}
	if hold {
		if code, kept := holdLock(ctx, c, lk, what, lease, noExtend, stderr); !kept {
			return code
		}
	}
	if !releaseOrReport("acquire", lk, what, stderr) {
		return ExitUnconfirmed
	}
	return ExitOK
}

// holdLock is acquire --hold: it keeps lk until ctx ends (SIGINT or
// SIGTERM), renewing the lease every lease/3 unless noExtend. kept is
// false when the lock or the connection was lost meanwhile; code is then
// the command's exit code (80 lost, 79 connection lost).
func holdLock(ctx context.Context, c *ticketing.Client, lk *ticketing.Lock, what string, lease time.Duration,
	noExtend bool, stderr io.Writer) (code int, kept bool) {
	var tick <-chan time.Time
	if !noExtend {
		t := time.NewTicker(lease / autoExtendFraction)
		defer t.Stop()
		tick = t.C
	}
	// One EXTEND at a time; a tick while one runs is skipped.
	extended := make(chan error, 1)
	extending := false
	for {
		select {
		case <-ctx.Done():
			return ExitOK, true
		case <-c.Done():
			fmt.Fprintf(stderr, "ticketing acquire: connection to the sidecar lost; the sidecar releases %s (token %d)\n", what, lk.Token())
			return ExitUnconfirmed, false
		case <-tick:
			if !extending {
				extending = true
				go func() { extended <- extendOnce(lk, lease) }()
			}
		case err := <-extended:
			extending = false
			if err != nil && !errors.Is(err, ticketing.ErrLockLost) {
				fmt.Fprintf(stderr, "ticketing acquire: extend of %s (token %d): %v; valid for %v more unless a later extend succeeds\n",
					what, lk.Token(), err, lk.Remaining().Round(time.Millisecond))
			}
		case <-lk.Lost():
			fmt.Fprintf(stderr, "ticketing acquire: lock %s (token %d) lost (%s): no longer held\n", what, lk.Token(), lostWhy(lk))
			// Lost to the local deadline only, it may still be held:
			// releasing frees it sooner; its failure is expected.
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = lk.Release(rctx)
			cancel()
			return ExitLost, false
		}
	}
}

// runRelease sends one RELEASE. Only the connection that acquired a lock
// may release it, so from a fresh connection this answers not_held; it is
// here for scripts that check the protocol and for debugging.
func runRelease(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var cf clientFlags
	fs := newClientFlags("release", "[--socket PATH] KEY TOKEN",
		"Only the connection that took a lock can release it, so a one-shot release\n"+
			"answers not_held (exit 78) for locks of other connections. To release a\n"+
			"lock held by 'ticketing acquire --hold', send that process SIGINT.", stdout, stderr)
	cf.register(fs.FlagSet, false)
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() != 2 {
		return fs.bad("want KEY and TOKEN, got %d arguments %q", fs.NArg(), fs.Args())
	}
	if why := badKey(fs.Arg(0)); why != "" {
		return fs.bad("%s", why)
	}
	tok, err := strconv.ParseUint(fs.Arg(1), 10, 64)
	if err != nil || tok == 0 {
		return fs.bad("token %q: want the decimal token that acquire printed (1..18446744073709551615)", fs.Arg(1))
	}
	c, code := dial(ctx, "release", cf.socket, stderr)
	if c == nil {
		return code
	}
	defer c.Close()
	if err := c.Release(ctx, fs.Arg(0), tok); err != nil {
		fmt.Fprintln(stderr, "ticketing release:", err)
		if errors.Is(err, ticketing.ErrIndeterminate) {
			return ExitUnconfirmed
		}
		return clientExit(err)
	}
	fmt.Fprintln(stdout, "OK")
	return ExitOK
}

func runPing(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return oneShot(ctx, "ping", "Checks that the sidecar answers, and prints PONG and the round trip.", args, stdout, stderr, func(ctx context.Context, c *ticketing.Client) (string, error) {
		start := time.Now()
		if err := c.Ping(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf("PONG %v", time.Since(start).Round(time.Microsecond)), nil
	})
}

func runInfo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return oneShot(ctx, "info", "Prints the sidecar's INFO line: cluster id, leader, connections, fencing\ndomain and members.", args, stdout, stderr, func(ctx context.Context, c *ticketing.Client) (string, error) {
		s, err := c.Info(ctx)
		return "INFO " + s.Raw, err
	})
}

func oneShot(ctx context.Context, name, about string, args []string, stdout, stderr io.Writer,
	fn func(context.Context, *ticketing.Client) (string, error)) int {
	var cf clientFlags
	fs := newClientFlags(name, "[--socket PATH]", about, stdout, stderr)
	cf.register(fs.FlagSet, false)
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		return fs.bad("want no arguments, got %q", fs.Args())
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, code := dial(ctx, name, cf.socket, stderr)
	if c == nil {
		return code
	}
	defer c.Close()
	out, err := fn(ctx, c)
	if err != nil {
		fmt.Fprintf(stderr, "ticketing %s: %v\n", name, err)
		return clientExit(err)
	}
	fmt.Fprintln(stdout, out)
	return ExitOK
}

// positionPrinter is lock --verbose's WithPosition hook: one line per
// report whose place or estimate differs from the last one printed for
// its key (a leader change may repeat a report; a repeat says nothing
// new). The format is documented in lock's --help and clients/README.md, for
// people and for scripts that read it: keep it stable.
func positionPrinter(w io.Writer) func(ticketing.Position) {
	last := make(map[string]ticketing.Position) // only the reader goroutine calls the hook
	return func(p ticketing.Position) {
		if prev, ok := last[p.Key]; ok && prev == p {
			return
		}
		last[p.Key] = p
		est := "no estimate yet"
		if p.EstimateKnown {
			est = fmt.Sprintf("about %ds", p.Estimate/time.Second)
		}
		fmt.Fprintf(w, "ticketing lock: position %d in line for %s (%s)\n", p.Position, p.Key, est)
	}
}

// lockKeys takes one key, or several as one seat block, as a Lock.
// badKey says why the first of keys that breaks the protocol's key rule
// is refused ("" when none does): checked before the sidecar is dialled,
// so a typo is a usage error (64, with the usage line) whether or not a
// sidecar runs.
func badKey(keys ...string) string {
	for _, k := range keys {
		if err := ticketing.CheckKey(k); err != nil {
			return fmt.Sprintf("KEY %q: want 1 to 255 bytes of visible ASCII (no spaces or control characters)", k)
		}
	}
	return ""
}

func lockKeys(ctx context.Context, c *ticketing.Client, keys []string, lease, wait time.Duration,
	opts ...ticketing.AcquireOption) (*ticketing.Lock, error) {
	if len(keys) == 1 {
		return c.Lock(ctx, keys[0], lease, wait, opts...)
	}
	return c.LockBlock(ctx, keys, lease, wait, opts...)
}

// runPermits is `ticketing permits set KEY N`: an operator defines a
// semaphore key of N permits (PERMITS through the sidecar), changes its N,
// or with 0 removes an idle one.
func runPermits(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var cf clientFlags
	fs := newClientFlags("permits", "set [--socket PATH] KEY N",
		"Makes KEY a semaphore of N permits (1..100000), changes the N of one, or with\n"+
			"N 0 removes an idle one. Raising N grants waiters at once; lowering it takes\n"+
			"no permit from a holder (new grants wait until fewer than N are held). A key\n"+
			"held as a lock cannot be made one, and 0 is refused while a permit is held or\n"+
			"someone waits (in_use). Take a permit with `ticketing lock --permit KEY --\n"+
			"COMMAND`. After an indeterminate outcome (exit 77) it may or may not have\n"+
			"applied: check the key (`ticketing inspect`) before setting it again, since a\n"+
			"repeat meets the state the first one left. Needs a sidecar of protocol version 8 and every node\n"+
			"at cluster protocol version 13.", stdout, stderr)
	cf.register(fs.FlagSet, false)
	set := len(args) > 0 && args[0] == "set"
	if set {
		args = args[1:]
	}
	// Parsed also without "set", so that -h and a bad flag are answered
	// as on every command.
	if code, ok := fs.parse(args); !ok {
		return code
	}
	if !set {
		return fs.bad("want the subcommand set: ticketing permits set KEY N")
	}
	if fs.NArg() != 2 {
		return fs.bad("want KEY and N, got %d arguments %q", fs.NArg(), fs.Args())
	}
	key := fs.Arg(0)
	if why := badKey(key); why != "" {
		return fs.bad("%s", why)
	}
	n, err := strconv.Atoi(fs.Arg(1))
	if err != nil || n < 0 || n > ticketing.MaxPermits {
		return fs.bad("N %q: want the number of permits, 0..%d (0 removes an idle semaphore)", fs.Arg(1), ticketing.MaxPermits)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c, code := dial(ctx, "permits", cf.socket, stderr)
	if c == nil {
		return code
	}
	defer c.Close()
	if err := c.SetPermits(ctx, key, n); err != nil {
		fmt.Fprintf(stderr, "ticketing permits: %s %d: %v\n", key, n, err)
		return clientExit(err)
	}
	fmt.Fprintln(stdout, "OK")
	return ExitOK
}

// lostWhy is why lk was lost, as its messages say it: its reason, and for
// a revoke who revoked it and why when the sidecar said ("revoked by
// ops@host: stuck holder").
func lostWhy(lk *ticketing.Lock) string {
	why := lk.LostReason()
	if by, reason, ok := lk.Revoked(); ok && by != "" {
		why += " by " + by
		if reason != "" {
			why += ": " + reason
		}
	}
	return why
}
