package main

import (
	"bufio"
	"context"
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

// errSeatTaken: a seat of the block was sold meanwhile, between the
// unlocked inventory read and the lock, by an earlier (legitimate) holder.
// The sale is rolled back, the block released, and another one picked.
var errSeatTaken = errors.New("seat taken meanwhile")

// sellerMain is one event server: it sells blocks of adjacent seats of one
// event through the local sidecar until the event is sold out. It reports
// on stdout, one line per sale attempt (the runner reads them):
//
//	SOLD <token> <sale> <seat,seat,...>    committed
//	STALE <token> <sale> <seat,...>        rejected by the fence (lease ran out; chaos with --ignore-lost)
//	ABORTED <token> <sale> <seat,...>      not written: the lock's lost signal came first
//	TAKEN <token> <sale> <seat,...>        a seat was sold meanwhile: picking again
//	PAUSE <token> <sale> <seat,...>        chaos: about to stop itself with SIGSTOP
//	SOLDOUT                                nothing left; exiting
//
// <sale> is the sale id, <name>#<attempt>, that the ledger rows and the
// seats of a committed sale carry. It starts selling when a line ("GO")
// arrives on stdin, after printing READY; after a PAUSE it goes on when
// the next line ("CONT") arrives.
func sellerMain(args []string) int {
	fs := flag.NewFlagSet("ticketsale seller", flag.ContinueOnError)
	var (
		socket  = fs.String("socket", os.Getenv("TICKETING_SOCKET"), "sidecar socket")
		db      = fs.String("db", "", "SQLite file or postgres:// URL")
		event   = fs.String("event", "", "event id")
		domain  = fs.String("domain", "", "fencing domain: the sidecar's INFO domain= (not its cluster id, which is \"dev\" for every dev cluster)")
		name    = fs.String("name", "go", "seller name")
		lease   = fs.Int("lease", 3, "lease seconds")
		maxPer  = fs.Int("max", 4, "at most this many adjacent seats per sale (a block)")
		pauseAt = fs.Int("pause-at", 0, "chaos: stop itself (SIGSTOP) before the write of this sale attempt (1-based) or the first later one whose seats are still free; 0 never")
		ignore  = fs.Bool("ignore-lost", false, "chaos: after the pause, write without checking the lock's lost signal (as a seller stalled just after that check would), so that the fence has to reject the write")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	s := &seller{name: *name, event: *event, domain: *domain,
		lease: time.Duration(*lease) * time.Second, maxPer: *maxPer, pauseAt: *pauseAt, ignoreLost: *ignore}
	if err := s.run(*socket, *db); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", *name, err)
		return 1
	}
	return 0
}

type seller struct {
	name, event, domain string
	lease               time.Duration
	maxPer, pauseAt     int
	ignoreLost          bool // chaos: the paused attempt skips the lost-signal check
	db                  *store
	stdin               *bufio.Reader
	attempts            int
	paused              bool
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
		// The unlocked read of the inventory: a block of adjacent seats
		// that looks free. Another seller may sell one of them before we
		// hold the lock; the write finds that out (TAKEN).
		free, err := s.db.freeSeats(ctx, s.event)
		if err != nil {
			return err
		}
		if len(free) == 0 {
			fmt.Println("SOLDOUT")
			return nil
		}
		seats := pickBlock(free, 1+rand.IntN(s.maxPer), rand.IntN)
		blk, err := c.AcquireBlock(ctx, seatKeys(s.event, seats), s.lease, 30*time.Second)
		switch {
		case retryable(err):
			// Not (known to be) acquired: never enter the critical section.
			if !errors.Is(err, ticketing.ErrTimeout) {
				fmt.Fprintf(os.Stderr, "%s: acquire: %v; trying again\n", s.name, err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		case err != nil:
			return fmt.Errorf("acquire: %w", err)
		}
		err = s.sellOnce(ctx, blk, seats)
		// Release even after a stale write: the sidecar answers not_held or
		// token_mismatch then, which is expected.
		if rerr := blk.Release(ctx); rerr != nil && !errors.Is(rerr, ticketing.ErrNotHeld) &&
			!errors.Is(rerr, ticketing.ErrTokenMismatch) {
			fmt.Fprintf(os.Stderr, "%s: release %d: %v\n", s.name, blk.Token(), rerr)
		}
		if err != nil {
			return err
		}
	}
}

// pickBlock picks a run of want adjacent seats among free (ascending), or
// of fewer when there is no run that long; the run is chosen at random
// (intn) among all that fit, so that sellers contend for seats.
func pickBlock(free []int, want int, intn func(int) int) []int {
	for k := min(want, len(free)); k > 1; k-- {
		var starts []int
		for i := 0; i+k <= len(free); i++ {
			if free[i+k-1]-free[i] == k-1 {
				starts = append(starts, i)
			}
		}
		if len(starts) > 0 {
			i := starts[intn(len(starts))]
			return append([]int(nil), free[i:i+k]...)
		}
	}
	return []int{free[intn(len(free))]}
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

// sellOnce is one sale attempt under the block lock blk: the fenced write
// of seats (store.sell), and its line on stdout. A lock already lost (its
// Context cancelled: the sidecar's lost event, or its local deadline) is
// not used for the write at all: the fence would reject it, but the
// signal saves the attempt and says why at once.
func (s *seller) sellOnce(ctx context.Context, blk *ticketing.Lock, seats []int) error {
	token := blk.Token()
	s.attempts++
	sale := fmt.Sprintf("%s#%d", s.name, s.attempts)
	list := joinInts(seats)
	pausedNow := false
	if s.pauseAt > 0 && !s.paused && s.attempts >= s.pauseAt {
		// Chaos: stall holding the block, past the lease. Only with seats
		// still free (checked under the lock), so that every seat of the
		// block can go to a newer holder only: the runner takes them over
		// as soon as the lease has run out, then sends SIGCONT.
		free, err := s.db.allFree(ctx, s.event, seats)
		if err != nil {
			return err
		}
		if free {
			s.paused, pausedNow = true, true
			fmt.Printf("PAUSE %d %s %s\n", token, sale, list)
			if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
				return fmt.Errorf("pausing: %w", err)
			}
			// kill returns before the whole process has stopped (another
			// thread may take the stop); wait for the runner's CONT so that
			// nothing, above all no transaction, starts before the stop.
			if _, err := s.stdin.ReadString('\n'); err != nil {
				return fmt.Errorf("waiting for CONT on stdin: %w", err)
			}
		}
	}
	// Remaining fires the lost signal itself when the deadline passed but
	// the lock's timer has not run yet (just after a SIGCONT). A chaos
	// seller told to ignore the signal skips the check after its pause, on
	// purpose: it stands for a seller that stalls right after the check,
	// which only the fence can stop.
	ignore := pausedNow && s.ignoreLost
	if !ignore && (blk.Remaining() == 0 || blk.Context().Err() != nil) {
		fmt.Printf("ABORTED %d %s %s\n", token, sale, list)
		return nil
	}
	// The fence stays the guarantee: the lock may be lost between this
	// check and the write (a stall right here), and then the write is
	// rejected as stale.
	err := s.db.sell(ctx, s.domain, s.event, sale, s.name, seats, token)
	switch {
	case errors.Is(err, fence.ErrStale):
		fmt.Printf("STALE %d %s %s\n", token, sale, list)
	case errors.Is(err, errSeatTaken):
		fmt.Printf("TAKEN %d %s %s\n", token, sale, list)
	case err != nil:
		return err
	default:
		fmt.Printf("SOLD %d %s %s\n", token, sale, list)
	}
	return nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
