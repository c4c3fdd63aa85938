// Package cli implements the ticketing subcommands behind the thin main in
// cmd/ticketing. Each subcommand parses its own flags and returns an exit
// code, so tests can run them in-process.
package cli

import (
	"context"
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
		{"lock", "run a command while holding a lock (like flock(1))", runLock},
		{"acquire", "take a lock through the sidecar and print its token", runAcquire},
		{"release", "send one RELEASE through the sidecar (debugging)", runRelease},
		{"ping", "check that the sidecar answers", runPing},
		{"info", "print the sidecar's view of the cluster", runInfo},
	}
}

// Main runs the subcommand named by args[0].
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return ExitUsage
		}
		return ExitOK
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
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'ticketing COMMAND -h' for a command's flags.")
}

// logFlags adds --log-level and --log-format to fs.
type logFlags struct{ level, format string }

func (l *logFlags) register(fs *flag.FlagSet, defLevel string) {
	fs.StringVar(&l.level, "log-level", defLevel, "log level: debug, info, warn or error")
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
}

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(l.format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: want text or json, got %q", l.format)
}
