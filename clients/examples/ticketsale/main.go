// Command ticketsale sells the seats of one event, in blocks of 1-4
// adjacent seats, from several event-server processes, in Go and Python,
// that coordinate through a Ticketing sidecar: each sale locks its seats as
// one seat block (one key per seat, one fencing token) and fences its
// database write on every seat key. A chaos mode stops two sellers
// (SIGSTOP) while they hold their blocks until their leases have run out,
// sells those seats from the runner meanwhile, then wakes them: the one
// that heeds its lock's lost signal must abort its sale, the one that
// ignores the signal on purpose must have its write rejected by the fence,
// and no seat may be sold twice nor any block split.
//
//	go run ./clients/examples/ticketsale                      # SQLite, chaos on
//	go run ./clients/examples/ticketsale --db postgres://...  # PostgreSQL
//
// It starts `ticketing dev` ($TICKETING_BIN, else built with go build),
// prints a report and exits 1 if the audit of the database fails. See
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
	fs.IntVar(&cfg.LeaseSec, "lease", cfg.LeaseSec, "lease of every sale's seat block, seconds")
	fs.BoolVar(&cfg.Chaos, "chaos", cfg.Chaos, "stop two sellers (SIGSTOP; the first Go and the first Python one, else the first two) while holding their seat blocks, past the lease; the runner sells those seats meanwhile; on waking, one heeds the lost signal and aborts, the other ignores it on purpose and the fence rejects its write")
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
