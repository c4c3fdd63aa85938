package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	ticketing "ticketing/clients/go"
	"ticketing/clients/go/fence"
)

// errSeatTaken: a seat the seller allocated was sold meanwhile. With the
// fence in place only an interleaving of two stale holders can cause it;
// the sale is rolled back and tried again.
var errSeatTaken = errors.New("seat taken meanwhile")

// sellerMain is one event server: it sells seats of one event through the
// local sidecar until the event is sold out. It reports on stdout, one line
// per sale (the runner reads them):
//
//	SOLD <token> <seat,seat,...>   committed
//	STALE <token> <seat,...>       rejected by the fence (lease ran out)
//	PAUSE <token>                  chaos: about to stop itself with SIGSTOP
//	SOLDOUT                        nothing left; exiting
//
// It starts selling when a line ("GO") arrives on stdin, after printing
// READY; after a PAUSE it goes on when the next line ("CONT") arrives.
func sellerMain(args []string) int {
	fs := flag.NewFlagSet("ticketsale seller", flag.ContinueOnError)
	var (
		socket  = fs.String("socket", os.Getenv("TICKETING_SOCKET"), "sidecar socket")
		db      = fs.String("db", "", "SQLite file or postgres:// URL")
		event   = fs.String("event", "", "event id")
		domain  = fs.String("domain", "", "fencing domain (the cluster id)")
		name    = fs.String("name", "go", "seller name")
		lease   = fs.Int("lease", 3, "lease seconds")
		maxPer  = fs.Int("max", 3, "at most this many seats per sale")
		pauseAt = fs.Int("pause-at", 0, "chaos: stop itself (SIGSTOP) before the write of this sale (1-based); 0 never")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	s := &seller{name: *name, event: *event, domain: *domain, key: "event/" + *event,
		lease: time.Duration(*lease) * time.Second, maxPer: *maxPer, pauseAt: *pauseAt}
	if err := s.run(*socket, *db); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", *name, err)
		return 1
	}
	return 0
}

type seller struct {
	name, event, domain, key string
	lease                    time.Duration
	maxPer, pauseAt          int
	db                       *store
	stdin                    *bufio.Reader
	sales                    int
}

func (s *seller) run(socket, db string) error {
	ctx := context.Background()
	st, err := openStore(db)
	if err != nil {
		return err
	}
	defer st.Close()
	s.db = st
	c, err := ticketing.Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Ping(ctx); err != nil {
		return err
	}
	// Start together: READY, then wait for the runner's GO on stdin.
	fmt.Println("READY")
	s.stdin = bufio.NewReader(os.Stdin)
	if _, err := s.stdin.ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for GO on stdin: %w", err)
	}
	for {
		token, err := c.Acquire(ctx, s.key, s.lease, 30*time.Second)
		switch {
		case retryable(err):
			// Not (known to be) acquired: never enter the critical section.
			fmt.Fprintf(os.Stderr, "%s: acquire: %v; trying again\n", s.name, err)
			time.Sleep(100 * time.Millisecond)
			continue
		case err != nil:
			return fmt.Errorf("acquire: %w", err)
		}
		done, err := s.sellOnce(ctx, token)
		// Release even after a stale write: the sidecar answers not_held or
		// token_mismatch then, which is expected.
		if rerr := c.Release(ctx, s.key, token); rerr != nil && !errors.Is(rerr, ticketing.ErrNotHeld) &&
			!errors.Is(rerr, ticketing.ErrTokenMismatch) {
			fmt.Fprintf(os.Stderr, "%s: release %d: %v\n", s.name, token, rerr)
		}
		if err != nil {
			return err
		}
		if done {
			fmt.Println("SOLDOUT")
			return nil
		}
	}
}

// retryable tells the outcomes of an acquire that did not take the lock
// (or may not have: Indeterminate, whose lease ends any holding) and may
// be tried again: during a leader change the sidecar answers moved,
// unavailable or no_quorum for a request it did not execute.
func retryable(err error) bool {
	for _, e := range []error{ticketing.ErrTimeout, ticketing.ErrBusy, ticketing.ErrIndeterminate,
		ticketing.ErrUnavailable, &ticketing.Error{Code: "moved"}, &ticketing.Error{Code: "no_quorum"}} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// sellOnce is one sale under the lock with token: read the inventory,
// allocate seats, then the fenced write. It reports true when sold out.
func (s *seller) sellOnce(ctx context.Context, token uint64) (soldOut bool, err error) {
	st := s.db
	// Read the inventory and allocate: the seats the buyer gets.
	want := 1 + rand.IntN(s.maxPer)
	rows, err := st.QueryContext(ctx, st.q(`SELECT seat FROM ticketsale_seats
		WHERE event = ? AND buyer IS NULL ORDER BY seat LIMIT ?`), s.event, want)
	if err != nil {
		return false, err
	}
	seats, err := scanInts(rows)
	if err != nil {
		return false, err
	}
	if len(seats) == 0 {
		return true, nil
	}
	s.sales++
	if s.sales == s.pauseAt {
		// Chaos: stall while holding the lock, past the lease (the runner
		// sends SIGCONT once a newer holder has sold).
		fmt.Printf("PAUSE %d\n", token)
		syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		// kill returns before the whole process has stopped (another
		// thread may take the stop); wait for the runner's CONT so that
		// nothing, above all no transaction, starts before the stop.
		if _, err := s.stdin.ReadString('\n'); err != nil {
			return false, fmt.Errorf("waiting for CONT on stdin: %w", err)
		}
	}
	buyer := fmt.Sprintf("%s#%d", s.name, s.sales)
	// The fenced write: the fence and the seats in one transaction.
	err = st.fence.Do(ctx, st.DB, nil, s.domain, s.key, token, func(tx *sql.Tx) error {
		for _, seat := range seats {
			res, err := tx.ExecContext(ctx, st.q(`UPDATE ticketsale_seats SET buyer = ?, token = ?
				WHERE event = ? AND seat = ? AND buyer IS NULL`), buyer, fence.Encode(token), s.event, seat)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return fmt.Errorf("%w: seat %d (%v)", errSeatTaken, seat, err)
			}
			if _, err := tx.ExecContext(ctx, st.q(`INSERT INTO ticketsale_sales (event, seat, buyer, seller, token)
				VALUES (?, ?, ?, ?, ?)`), s.event, seat, buyer, s.name, fence.Encode(token)); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, st.q(`UPDATE ticketsale_events SET remaining = remaining - ? WHERE event = ?`),
			len(seats), s.event)
		return err
	})
	list := joinInts(seats)
	switch {
	case errors.Is(err, fence.ErrStale):
		fmt.Printf("STALE %d %s\n", token, list)
		return false, nil
	case errors.Is(err, errSeatTaken):
		fmt.Fprintf(os.Stderr, "%s: token %d: %v; selling again\n", s.name, token, err)
		return false, nil
	case err != nil:
		return false, err
	}
	fmt.Printf("SOLD %d %s\n", token, list)
	return false, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
