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
	"io"
	"os"
	"os/signal"
	"syscall"

	"ticketing/cmd/ticketlab/internal/bench"
	"ticketing/cmd/ticketlab/internal/compare"
	"ticketing/cmd/ticketlab/internal/labcli"
)

func main() {
	compare.ServeLineFloorIfAsked()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func commands() []labcli.Subcommand {
	return []labcli.Subcommand{
		{Name: "bench", Summary: "measure failover, hand-overs, throughput, the unix socket, memory, catch-up and the disk", Run: bench.Main},
		{Name: "verify", Summary: "Jepsen-style test: workload + faults on real processes, then safety checks", Run: runVerify},
		{Name: "compare", Summary: "Ticketing against etcd, ZooKeeper and Redis in one run (make bench-compare)", Run: compare.Main},
		{Name: "node", Summary: "`ticketing node` that obeys a fault file (--fault-file): cut and frozen peer links, clock offset", Run: runNode},
		{Name: "sidecar", Summary: "`ticketing sidecar` that obeys a fault file (--fault-file): dropped cluster connections", Run: runSidecar},
	}
}

// Main runs the subcommand named by args[0] and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return labcli.Dispatch(ctx, "ticketlab", "command", commands(), args, stdout, stderr)
}
