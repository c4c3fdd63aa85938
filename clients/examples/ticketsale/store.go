package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"

	"ticketing/clients/go/fence"
)

// store is the event's database: SQLite (a file shared by every seller
// process, in WAL mode) or PostgreSQL.
type store struct {
	*sql.DB
	dialect fence.Dialect
	fence   fence.Fence
}

// isPostgres tells a PostgreSQL URL from an SQLite path.
func isPostgres(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// openStore opens db: a postgres:// URL, or an SQLite file path (an optional
// "sqlite:" prefix is dropped). SQLite transactions start with BEGIN
// IMMEDIATE (the write lock up front) and wait up to 10 s for it.
func openStore(db string) (*store, error) {
	var (
		s   = &store{}
		err error
	)
	if isPostgres(db) {
		s.dialect = fence.Postgres
		s.DB, err = sql.Open("pgx", db)
	} else {
		s.dialect = fence.SQLite
		s.DB, err = sql.Open("sqlite", "file:"+strings.TrimPrefix(db, "sqlite:")+
			"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	}
	if err != nil {
		return nil, err
	}
	s.fence = fence.New(s.dialect)
	return s, nil
}

// q rewrites ? placeholders as $1, $2, ... for PostgreSQL.
func (s *store) q(query string) string {
	if s.dialect != fence.Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// The example's tables. A seat holds the sale that bought it (its id, in
// buyer) and that sale's token; the ledger has one row per seat sold, with
// the sale id, the block size the seller wrote and the token, deliberately
// without a unique constraint so that a double sale or a split block would
// show; events.remaining is the counter the sellers decrement.
const exampleSchema = `
CREATE TABLE IF NOT EXISTS ticketsale_events (
    event     TEXT PRIMARY KEY,
    capacity  INTEGER NOT NULL,
    remaining INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS ticketsale_seats (
    event TEXT    NOT NULL,
    seat  INTEGER NOT NULL,
    buyer TEXT,
    token BIGINT,
    PRIMARY KEY (event, seat)
);
CREATE TABLE IF NOT EXISTS ticketsale_ledger (
    event  TEXT    NOT NULL,
    sale   TEXT    NOT NULL,
    seat   INTEGER NOT NULL,
    size   INTEGER NOT NULL,
    seller TEXT    NOT NULL,
    token  BIGINT  NOT NULL
);
`

// seatKey is the lock key (and fence key) of one seat.
func seatKey(event string, seat int) string { return fmt.Sprintf("seat/%s/%d", event, seat) }

func seatKeys(event string, seats []int) []string {
	keys := make([]string, len(seats))
	for i, s := range seats {
		keys[i] = seatKey(event, s)
	}
	return keys
}

// setup creates the tables (if missing) and an event with seats 1..capacity.
func (s *store) setup(ctx context.Context, event string, capacity int) error {
	// Both drivers run a multi-statement script in one Exec without arguments.
	for _, ddl := range []string{fence.Schema(s.dialect), exampleSchema} {
		if _, err := s.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("schema: %w", err)
		}
	}
	tx, err := s.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO ticketsale_events (event, capacity, remaining) VALUES (?, ?, ?)`),
		event, capacity, capacity); err != nil {
		return fmt.Errorf("create event: %w", err)
	}
	for seat := 1; seat <= capacity; seat++ {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO ticketsale_seats (event, seat) VALUES (?, ?)`), event, seat); err != nil {
			return fmt.Errorf("create seats: %w", err)
		}
	}
	return tx.Commit()
}

// freeSeats is the unlocked read of the inventory: the free seats, in order.
func (s *store) freeSeats(ctx context.Context, event string) ([]int, error) {
	rows, err := s.QueryContext(ctx, s.q(`SELECT seat FROM ticketsale_seats
		WHERE event = ? AND buyer IS NULL ORDER BY seat`), event)
	if err != nil {
		return nil, err
	}
	return scanInts(rows)
}

// allFree tells whether every seat of seats is still free.
func (s *store) allFree(ctx context.Context, event string, seats []int) (bool, error) {
	for _, seat := range seats {
		var n int
		if err := s.QueryRowContext(ctx, s.q(`SELECT count(*) FROM ticketsale_seats
			WHERE event = ? AND seat = ? AND buyer IS NULL`), event, seat).Scan(&n); err != nil {
			return false, err
		}
		if n != 1 {
			return false, nil
		}
	}
	return true, nil
}

// sell is the fenced write of one sale, in one transaction: every seat
// key of the block raised to token (fence.DoBlock, all or nothing), each
// seat marked sold to the sale if still free, one ledger row per seat
// under the one sale id, remaining decremented by the block size. It
// returns an error wrapping fence.ErrStale when a newer token has written
// any of the seats, errSeatTaken when a seat was sold meanwhile (by an
// earlier holder: the inventory read is not under the lock); nothing is
// written then.
func (s *store) sell(ctx context.Context, domain, event, sale, seller string, seats []int, token uint64) error {
	enc := fence.Encode(token)
	return s.fence.DoBlock(ctx, s.DB, nil, domain, seatKeys(event, seats), token, func(tx *sql.Tx) error {
		for _, seat := range seats {
			res, err := tx.ExecContext(ctx, s.q(`UPDATE ticketsale_seats SET buyer = ?, token = ?
				WHERE event = ? AND seat = ? AND buyer IS NULL`), sale, enc, event, seat)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n != 1 {
				return &seatTakenError{seat}
			}
			if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO ticketsale_ledger (event, sale, seat, size, seller, token)
				VALUES (?, ?, ?, ?, ?, ?)`), event, sale, seat, len(seats), seller, enc); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, s.q(`UPDATE ticketsale_events SET remaining = remaining - ? WHERE event = ?`),
			len(seats), event)
		return err
	})
}

// seatTakenError is errSeatTaken naming the seat.
type seatTakenError struct{ seat int }

func (e *seatTakenError) Error() string { return fmt.Sprintf("seat %d taken meanwhile", e.seat) }
func (e *seatTakenError) Unwrap() error { return errSeatTaken }

// seatRow is one seat as the database has it after the sale.
type seatRow struct {
	Seat      int
	Buyer     string // the sale id; "" = free
	Token     uint64 // the sale's token; 0 = free
	HighWater uint64 // the fence's high-water mark of the seat's key
}

// ledgerRow is one row of the ledger.
type ledgerRow struct {
	Sale, Seller string
	Seat, Size   int
	Token        uint64
}

// audit is what the database says after the sale.
type audit struct {
	Capacity, Remaining int
	Seats               []seatRow // every seat of the event, in order
	Ledger              []ledgerRow
}

func (s *store) audit(ctx context.Context, domain, event string) (audit, error) {
	var a audit
	err := s.QueryRowContext(ctx, s.q(`SELECT capacity, remaining FROM ticketsale_events WHERE event = ?`), event).
		Scan(&a.Capacity, &a.Remaining)
	if err != nil {
		return a, err
	}
	rows, err := s.QueryContext(ctx, s.q(`SELECT seat, buyer, token FROM ticketsale_seats WHERE event = ? ORDER BY seat`), event)
	if err != nil {
		return a, err
	}
	for rows.Next() {
		var (
			r     seatRow
			buyer sql.NullString
			tok   sql.NullInt64
		)
		if err := rows.Scan(&r.Seat, &buyer, &tok); err != nil {
			rows.Close()
			return a, err
		}
		r.Buyer = buyer.String
		if tok.Valid {
			r.Token = fence.Decode(tok.Int64)
		}
		a.Seats = append(a.Seats, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return a, err
	}
	for i := range a.Seats {
		if a.Seats[i].HighWater, err = s.fence.HighWater(ctx, s.DB, domain, seatKey(event, a.Seats[i].Seat)); err != nil {
			return a, err
		}
	}
	rows, err = s.QueryContext(ctx, s.q(`SELECT sale, seller, seat, size, token FROM ticketsale_ledger
		WHERE event = ? ORDER BY sale, seat`), event)
	if err != nil {
		return a, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			r   ledgerRow
			tok int64
		)
		if err := rows.Scan(&r.Sale, &r.Seller, &r.Seat, &r.Size, &tok); err != nil {
			return a, err
		}
		r.Token = fence.Decode(tok)
		a.Ledger = append(a.Ledger, r)
	}
	return a, rows.Err()
}

func scanInts(rows *sql.Rows) ([]int, error) {
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
