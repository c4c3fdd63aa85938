// Command ticketlab is Ticketing's lab: every benchmark (`ticketlab bench
// MODE`), the Jepsen-style verification (`ticketlab verify`), the
// comparison with etcd, ZooKeeper and Redis (`ticketlab compare`), and the
// fault-injecting node and sidecar the verification runs (`ticketlab node`
// and `ticketlab sidecar`: the product's commands with the lab's fault file
// plugged into their seams).
//
// It is its own module (cmd/ticketlab/go.mod), so that porcupine and the
// peers' clients never enter Ticketing's go.mod, and it drives the
// ticketing binary it is given (--binary), as a user would. The product
// binary carries none of this: no benchmark, no verification, no fault
// file.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"ticketing/cmd/ticketlab/internal/bench"
	"ticketing/cmd/ticketlab/internal/compare"
	"ticketing/cmd/ticketlab/internal/labcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"bench", "measure failover, hand-overs, throughput, the unix socket, memory, catch-up and the disk", bench.Main},
		{"verify", "Jepsen-style test: workload + faults on real processes, then safety checks", runVerify},
		{"compare", "Ticketing against etcd, ZooKeeper and Redis in one run (make bench-compare)", compare.Main},
		{"node", "`ticketing node` that obeys a fault file (--fault-file): cut and frozen peer links, clock offset", runNode},
		{"sidecar", "`ticketing sidecar` that obeys a fault file (--fault-file): dropped cluster connections", runSidecar},
	}
}

// Main runs the subcommand named by args[0] and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "ticketlab: name a command")
		usage(stderr)
		return labcli.ExitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return labcli.ExitOK
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "ticketlab: unknown command %q\n", args[0])
	usage(stderr)
	return labcli.ExitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: ticketlab COMMAND [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'ticketlab COMMAND -h' for a command's flags.")
}
