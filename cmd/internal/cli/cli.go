// Package cli implements the ticketing subcommands behind the thin main in
// cmd/ticketing. Each subcommand parses its own flags and returns an exit
// code, so tests can run them in-process.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes shared by every subcommand.
const (
	ExitOK    = 0
	ExitError = 1 // runtime failure
	ExitUsage = 2 // bad flags or arguments
)

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"node", "run one cluster node", runNode},
		{"bootstrap", "create a new cluster and fencing domain on one stopped node's data dir", runBootstrap},
		{"dev", "run a 3-node cluster on loopback in this process", runDev},
		{"sidecar", "serve the unix-socket API, connected to a cluster", runSidecar},
		{"certs", "make a private CA and node/client certificates for TLS", runCerts},
		{"members", "list, add, promote, remove and replace cluster members", runMembers},
		{"status", "the cluster as the leader sees it: members, lag, domain, locks, tokens", runStatus},
		{"inspect", "one key: its holder, lease, and queue of waiters", runInspect},
		{"revoke", "end a stuck holding on an operator's word (audited; the next waiter gets the key)", runRevoke},
		{"lock", "run a command while holding a lock (like flock(1))", runLock},
		{"acquire", "take a lock through the sidecar and print its token", runAcquire},
		{"permits", "set a semaphore key's number of permits (permits set KEY N)", runPermits},
		{"release", "send one RELEASE through the sidecar (debugging)", runRelease},
		{"ping", "check that the sidecar answers", runPing},
		{"info", "print the sidecar's view of the cluster", runInfo},
	}
}

// Main runs the subcommand named by args[0].
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "ticketing: no command given")
		usage(stderr)
		return ExitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return ExitOK
	case "-version", "--version", "version":
		fmt.Fprintln(stdout, versionLine())
		return ExitOK
	case "completion":
		return runCompletion(args[1:], stdout, stderr)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "ticketing: unknown command %q\n", args[0])
	usage(stderr)
	return ExitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: ticketing COMMAND [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-10s %s\n", "completion", "print a bash completion script: source <(ticketing completion bash)")
	fmt.Fprintln(w, "\nRun 'ticketing COMMAND -h' for a command's flags, 'ticketing --version' for the build.")
}

// errWriter keeps the first write error, so that a report printed in many
// writes (tables through text/tabwriter) is checked once, at its end.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// cmdFlags is a command's flag set with the conventions every command
// keeps: -h and --help print the whole usage on stdout and exit 0; a bad
// invocation (an unknown flag, a bad value, wrong arguments) prints one line
// saying why and then the synopsis on stderr, and exits with badCode
// (ExitUsage; the client commands use their documented ExitLockError).
type cmdFlags struct {
	*flag.FlagSet
	name     string // "ticketing lock"
	synopsis string // the usage line(s), without "usage: "
	about    string // printed between the synopsis and the flags by -h
	after    string // printed after the flags by -h
	badCode  int
	stdout   io.Writer
	stderr   io.Writer
}

func newCmdFlags(name, synopsis, about string, stdout, stderr io.Writer) *cmdFlags {
	c := &cmdFlags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), name: name, synopsis: synopsis,
		about: about, badCode: ExitUsage, stdout: stdout, stderr: stderr}
	// The flag package prints its errors and the usage to Output while it
	// parses; parse prints them itself, each to its stream.
	c.SetOutput(io.Discard)
	c.Usage = func() {}
	return c
}

// help prints the whole usage to w.
func (c *cmdFlags) help(w io.Writer) {
	fmt.Fprintf(w, "usage: %s\n", c.synopsis)
	if c.about != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimRight(c.about, "\n"))
	}
	n := 0
	c.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(w, "\nflags:")
		c.SetOutput(w)
		c.PrintDefaults()
		c.SetOutput(io.Discard)
	}
	if c.after != "" {
		fmt.Fprintf(w, "\n%s\n", strings.Trim(c.after, "\n"))
	}
}

// bad reports a bad invocation: the reason on one line, then the synopsis.
// It returns the exit code for it.
func (c *cmdFlags) bad(format string, a ...any) int {
	reason := strings.ReplaceAll(fmt.Sprintf(format, a...), "\n", " ")
	fmt.Fprintf(c.stderr, "%s: %s\nusage: %s\nRun '%s -h' for the flags.\n", c.name, reason, c.synopsis, c.name)
	return c.badCode
}

// parsed handles the error of a parse: ok is true when there was none;
// otherwise code is what the command returns.
func (c *cmdFlags) parsed(err error) (code int, ok bool) {
	switch {
	case err == nil:
		return ExitOK, true
	case errors.Is(err, flag.ErrHelp):
		c.help(c.stdout)
		return ExitOK, false
	}
	return c.bad("%v", err), false
}

// parse parses args (flags, then positional arguments).
func (c *cmdFlags) parse(args []string) (code int, ok bool) {
	return c.parsed(c.Parse(args))
}

// parseConfigured parses args, then the environment and the --config file
// (config.go).
func (c *cmdFlags) parseConfigured(args []string) (code int, ok bool) {
	return c.parsed(parseConfigured(c.FlagSet, args))
}

// logFlags adds --log-level and --log-format to fs. Both are checked when
// set, so a bad value is reported where it was given: the flag, the
// environment variable, or the configuration file's line.
type logFlags struct {
	level  logLevel
	format logFormat
}

func (l *logFlags) register(fs *flag.FlagSet, defLevel string) {
	if err := l.level.Set(defLevel); err != nil {
		panic(err)
	}
	l.format = "text"
	fs.Var(&l.level, "log-level", "log level: debug, info, warn or error")
	fs.Var(&l.format, "log-format", "log format: text or json")
}

// logger returns the logger the flags ask for. The values were checked
// when set, so the error is always nil (kept for the callers that check).
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: slog.Level(l.level)}
	if l.format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// logLevel is a flag.Value: debug, info, warn or error.
type logLevel slog.Level

func (l *logLevel) String() string { return strings.ToLower(slog.Level(*l).String()) }

func (l *logLevel) Set(s string) error {
	var v slog.Level
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		if err := v.UnmarshalText([]byte(s)); err != nil {
			return err
		}
	default:
		return fmt.Errorf("want debug, info, warn or error, got %q", s)
	}
	*l = logLevel(v)
	return nil
}

// logFormat is a flag.Value: text or json.
type logFormat string

func (f *logFormat) String() string { return string(*f) }

func (f *logFormat) Set(s string) error {
	switch v := strings.ToLower(s); v {
	case "text", "json":
		*f = logFormat(v)
		return nil
	}
	return fmt.Errorf("want text or json, got %q", s)
}
