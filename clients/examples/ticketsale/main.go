// Command ticketsale sells the seats of one event from several event-server
// processes, in Go and Python, that coordinate through a Ticketing sidecar
// and fence their database writes with the lock's token. A chaos mode stops
// a seller (SIGSTOP) while it holds the lock until its lease has run out,
// lets the next seller sell, then wakes it: its write must be rejected by
// the fence, and no seat may be oversold or sold twice.
//
//	go run ./clients/examples/ticketsale                      # SQLite, chaos on
//	go run ./clients/examples/ticketsale --db postgres://...  # PostgreSQL
//
// It starts `ticketing dev` ($TICKETING_BIN, else built with go build),
// prints a report and exits 1 if the inventory does not add up. See
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

func main() {
	if len(os.Args) > 1 && os.Args[1] == "seller" {
		os.Exit(sellerMain(os.Args[2:]))
	}
	os.Exit(runnerMain(os.Args[1:]))
}

func runnerMain(args []string) int {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("ticketsale", flag.ContinueOnError)
	fs.StringVar(&cfg.DB, "db", "", "database: an SQLite file (default: a new one in a temporary directory) or a postgres:// URL")
	fs.IntVar(&cfg.Seats, "seats", cfg.Seats, "seats of the event")
	fs.IntVar(&cfg.GoSellers, "go", cfg.GoSellers, "Go seller processes")
	fs.IntVar(&cfg.PySellers, "python", cfg.PySellers, "Python seller processes (need python3; with PostgreSQL also psycopg or psycopg2)")
	fs.IntVar(&cfg.LeaseSec, "lease", cfg.LeaseSec, "lease of every sale's lock, seconds")
	fs.BoolVar(&cfg.Chaos, "chaos", cfg.Chaos, "stop one Go and one Python seller (SIGSTOP) while holding the lock, past the lease")
	fs.BoolVar(&cfg.Verbose, "v", false, "log every sale")
	fs.StringVar(&cfg.Socket, "socket", "", "use this running sidecar instead of starting `ticketing dev`")
	fs.StringVar(&cfg.TicketingBin, "ticketing-bin", os.Getenv("TICKETING_BIN"), "ticketing binary (default $TICKETING_BIN, else built with go build)")
	fs.StringVar(&cfg.Python, "python-bin", cfg.Python, "Python interpreter for the Python sellers")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	rep, err := run(ctx, cfg, os.Stderr)
	if rep != nil {
		rep.print(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ticketsale:", err)
		return 1
	}
	if !rep.OK() {
		return 1
	}
	return 0
}
