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
	"strconv"
	"syscall"
	"time"

	ticketing "ticketing/clients/go"
)

// Exit codes of the client commands (lock, acquire, release, ping, info).
// They sit in the 75..79 range, away from the small codes commands usually
// return and from 126..165 (shell: not executable, not found, signals), so
// a script can tell them from the locked command's own code. They are
// documented in unixapi/PROTOCOL.md.
const (
	ExitBusy          = 75 // key held and --wait 0: not acquired
	ExitTimeout       = 76 // the wait ran out: not acquired
	ExitIndeterminate = 77 // outcome unknown: not acquired as far as the caller may assume
	ExitLockError     = 78 // any other failure: bad arguments, sidecar unreachable, ERR reply, command not startable
	ExitUnconfirmed   = 79 // the command ran, but the release was not confirmed (or the lock was lost meanwhile)
)

const exitCodesHelp = `
exit codes: the command's own code when the lock was taken and released;
  75 busy (--wait 0 and the key is held), 76 timeout, 77 indeterminate
  (do not assume the lock was taken), 78 error (arguments, sidecar
  unreachable, ERR reply, command could not start), 79 the command ran but
  its release was not confirmed or the lock was lost while it ran.
`

// clientFlags are the flags shared by the client commands.
type clientFlags struct {
	socket string
	lease  int
	wait   float64
}

func (c *clientFlags) register(fs *flag.FlagSet, withLock bool) {
	fs.StringVar(&c.socket, "socket", defaultSocket(), "the sidecar's unix socket (default $TICKETING_SOCKET, else ./ticketing.sock)")
	if withLock {
		fs.IntVar(&c.lease, "lease", 60, "lease in whole seconds (1..250): the server takes the lock back after it")
		fs.Float64Var(&c.wait, "wait", 30, "seconds to wait for the turn, millisecond precision (0 = one immediate try, at most 300)")
	}
}

func (c *clientFlags) durations() (lease, wait time.Duration) {
	return time.Duration(c.lease) * time.Second, time.Duration(math.Round(c.wait*1000)) * time.Millisecond
}

// acquireExit maps an Acquire error to an exit code.
func acquireExit(err error) int {
	switch {
	case errors.Is(err, ticketing.ErrBusy):
		return ExitBusy
	case errors.Is(err, ticketing.ErrTimeout):
		return ExitTimeout
	case errors.Is(err, ticketing.ErrIndeterminate):
		return ExitIndeterminate
	}
	return ExitLockError
}

func newClientFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ticketing "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: ticketing %s %s\n\nflags:\n", name, usage)
		fs.PrintDefaults()
		fmt.Fprint(stderr, exitCodesHelp)
	}
	return fs
}

func parseClientFlags(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK, false
		}
		return ExitLockError, false
	}
	return 0, true
}

// runLock is flock(1) for Ticketing: acquire, run the command, release.
func runLock(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var cf clientFlags
	fs := newClientFlagSet("lock", "[--socket PATH] [--lease S] [--wait S] KEY -- COMMAND [ARG...]", stderr)
	cf.register(fs, true)
	if code, ok := parseClientFlags(fs, args); !ok {
		return code
	}
	rest := fs.Args()
	if len(rest) >= 2 && rest[1] == "--" {
		rest = append(rest[:1], rest[2:]...)
	}
	if len(rest) < 2 {
		fs.Usage()
		return ExitLockError
	}
	key, argv := rest[0], rest[1:]
	c, err := ticketing.Dial(ctx, cf.socket)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing lock:", err)
		return ExitLockError
	}
	defer c.Close()
	lease, wait := cf.durations()
	tok, err := c.Acquire(ctx, key, lease, wait)
	if err != nil {
		fmt.Fprintf(stderr, "ticketing lock: %s: %v\n", key, err)
		return acquireExit(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(), "TICKETING_KEY="+key, "TICKETING_TOKEN="+strconv.FormatUint(tok, 10))
	// Signals to us are passed on to the command, which decides when to
	// stop; we release only after it has exited.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "ticketing lock:", err)
		releaseOrReport(c, key, tok, stderr)
		return ExitLockError
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	lost := false
	for running := true; running; {
		select {
		case <-exited:
			running = false
		case s := <-sigs:
			cmd.Process.Signal(s)
		case <-c.Done():
			if !lost {
				lost = true
				fmt.Fprintf(stderr, "ticketing lock: connection to the sidecar lost: lock %s (token %d) released while the command runs\n", key, tok)
			}
		}
	}
	code := cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal()) // as shells report it
	}
	if lost || !releaseOrReport(c, key, tok, stderr) {
		fmt.Fprintf(stderr, "ticketing lock: the command exited with %d\n", code)
		return ExitUnconfirmed
	}
	return code
}

// releaseOrReport releases with its own deadline (the caller's context may
// be cancelled by the signal that stopped the command) and reports failure.
func releaseOrReport(c *ticketing.Client, key string, tok uint64, stderr io.Writer) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Release(ctx, key, tok); err != nil {
		fmt.Fprintf(stderr, "ticketing lock: release of %s (token %d) not confirmed: %v; the lease ends it at the latest\n", key, tok, err)
		return false
	}
	return true
}

// runAcquire takes a lock and prints its token. The lock belongs to this
// command's connection, so it ends with the command: without --hold it is
// released before exiting; with --hold it is kept until SIGINT/SIGTERM.
func runAcquire(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var cf clientFlags
	var hold bool
	fs := newClientFlagSet("acquire", "[--socket PATH] [--lease S] [--wait S] [--hold] KEY\n\n"+
		"Prints the token. A lock belongs to the connection that took it: without\n"+
		"--hold it is released again before the command exits (a probe); with --hold\n"+
		"the command keeps it until SIGINT or SIGTERM, then releases it.", stderr)
	cf.register(fs, true)
	fs.BoolVar(&hold, "hold", false, "keep the lock until SIGINT/SIGTERM (or the lease ends), then release it")
	if code, ok := parseClientFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return ExitLockError
	}
	key := fs.Arg(0)
	c, err := ticketing.Dial(ctx, cf.socket)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing acquire:", err)
		return ExitLockError
	}
	defer c.Close()
	lease, wait := cf.durations()
	tok, err := c.Acquire(ctx, key, lease, wait)
	if err != nil {
		fmt.Fprintf(stderr, "ticketing acquire: %s: %v\n", key, err)
		return acquireExit(err)
	}
	fmt.Fprintln(stdout, tok)
	if f, ok := stdout.(*os.File); ok {
		f.Sync() // a script reading our stdout sees the token now
	}
	if hold {
		select {
		case <-ctx.Done():
		case <-c.Done():
			fmt.Fprintf(stderr, "ticketing acquire: connection to the sidecar lost; %s released\n", key)
			return ExitUnconfirmed
		}
	}
	if !releaseOrReport(c, key, tok, stderr) {
		return ExitUnconfirmed
	}
	return ExitOK
}

// runRelease sends one RELEASE. Only the connection that acquired a lock
// may release it, so from a fresh connection this answers not_held; it is
// here for scripts that check the protocol and for debugging.
func runRelease(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var cf clientFlags
	fs := newClientFlagSet("release", "[--socket PATH] KEY TOKEN\n\n"+
		"Only the connection that took a lock can release it, so a one-shot release\n"+
		"answers not_held (exit 78) for locks of other connections. To release a\n"+
		"lock held by 'ticketing acquire --hold', send that process SIGINT.", stderr)
	cf.register(fs, false)
	if code, ok := parseClientFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() != 2 {
		fs.Usage()
		return ExitLockError
	}
	tok, err := strconv.ParseUint(fs.Arg(1), 10, 64)
	if err != nil {
		fmt.Fprintf(stderr, "ticketing release: token %q: %v\n", fs.Arg(1), err)
		return ExitLockError
	}
	c, err := ticketing.Dial(ctx, cf.socket)
	if err != nil {
		fmt.Fprintln(stderr, "ticketing release:", err)
		return ExitLockError
	}
	defer c.Close()
	if err := c.Release(ctx, fs.Arg(0), tok); err != nil {
		fmt.Fprintln(stderr, "ticketing release:", err)
		if errors.Is(err, ticketing.ErrIndeterminate) {
			return ExitUnconfirmed
		}
		return ExitLockError
	}
	fmt.Fprintln(stdout, "OK")
	return ExitOK
}

func runPing(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return oneShot(ctx, "ping", args, stdout, stderr, func(ctx context.Context, c *ticketing.Client) (string, error) {
		start := time.Now()
		if err := c.Ping(ctx); err != nil {
			return "", err
		}
		return fmt.Sprintf("PONG %v", time.Since(start).Round(time.Microsecond)), nil
	})
}

func runInfo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return oneShot(ctx, "info", args, stdout, stderr, func(ctx context.Context, c *ticketing.Client) (string, error) {
		s, err := c.Info(ctx)
		return "INFO " + s, err
	})
}

func oneShot(ctx context.Context, name string, args []string, stdout, stderr io.Writer,
	fn func(context.Context, *ticketing.Client) (string, error)) int {
	var cf clientFlags
	fs := newClientFlagSet(name, "[--socket PATH]", stderr)
	cf.register(fs, false)
	if code, ok := parseClientFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return ExitLockError
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := ticketing.Dial(ctx, cf.socket)
	if err != nil {
		fmt.Fprintf(stderr, "ticketing %s: %v\n", name, err)
		return ExitLockError
	}
	defer c.Close()
	out, err := fn(ctx, c)
	if err != nil {
		fmt.Fprintf(stderr, "ticketing %s: %v\n", name, err)
		return ExitLockError
	}
	fmt.Fprintln(stdout, out)
	return ExitOK
}
