// Command waitingroom is an on-sale's waiting room on a Ticketing
// semaphore: thousands of buyers join one line for a checkout that admits
// a fixed number of them at a time (a key with n permits), each told its
// exact place in line and an estimated wait as the line moves, while the
// cluster's leader is SIGKILLed in the middle of the sale. Each admitted
// buyer checks out with a write fenced on its permit's slot
// ("<key> <slot>"): one ticket off the inventory, or "sold out".
//
//	go run ./clients/examples/waitingroom                      # 2000 buyers, 50 permits, SQLite
//	go run ./clients/examples/waitingroom --db postgres://...  # PostgreSQL
//
// It starts 3 `ticketing node` processes and a `ticketing sidecar`
// process ($TICKETING_BIN, else built with go build; not `ticketing dev`,
// whose nodes share one process), uses the Go client over the sidecar's
// unix socket, prints a report and exits 1 if the audit fails: an
// admission out of arrival order, a position that went up, an oversold
// ticket, an inventory that does not add up, a stale write applied. See
// README.md beside this file.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() { os.Exit(runMain(os.Args[1:])) }

func runMain(args []string) int {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("waitingroom", flag.ContinueOnError)
	fs.StringVar(&cfg.DB, "db", "", "database: an SQLite file (default: a new one in a temporary directory) or a postgres:// URL")
	fs.IntVar(&cfg.Buyers, "buyers", cfg.Buyers, "buyers joining the line, one goroutine and one connection each")
	fs.IntVar(&cfg.Permits, "permits", cfg.Permits, "the checkout's capacity: buyers admitted at once (the semaphore's permits)")
	fs.IntVar(&cfg.Tickets, "tickets", cfg.Tickets, "tickets for sale")
	fs.DurationVar(&cfg.Checkout, "checkout", cfg.Checkout, "how long an admitted buyer spends at checkout before its write")
	fs.DurationVar(&cfg.Lease, "lease", cfg.Lease, "lease of a buyer's permit (whole seconds, ≤ 250s)")
	fs.BoolVar(&cfg.Kill, "kill", cfg.Kill, "SIGKILL the leader mid-sale (then restart it)")
	fs.IntVar(&cfg.KillAt, "kill-at", 0, "admissions before the kill (default: half the buyers)")
	fs.BoolVar(&cfg.Stall, "stall", cfg.Stall, "one buyer (one of the first admitted) stalls past its lease and then writes with its old token: the fence must reject it")
	fs.DurationVar(&cfg.StallLease, "stall-lease", cfg.StallLease, "the stalled buyer's lease")
	fs.BoolVar(&cfg.Verbose, "v", false, "log every admission and checkout")
	fs.StringVar(&cfg.TicketingBin, "ticketing-bin", os.Getenv("TICKETING_BIN"), "ticketing binary (default $TICKETING_BIN, else built with go build)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// A closed stdout or stderr (`| head`) would kill the process by
	// SIGPIPE before its defers stop the node and sidecar processes it
	// started, leaving them running: the writes fail instead.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	rep, err := run(ctx, cfg, os.Stderr)
	if rep != nil {
		rep.print(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "waitingroom:", err)
		return 1
	}
	if !rep.OK() {
		return 1
	}
	return 0
}
