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

// The example's tables. Seats hold the buyer and the token of the sale;
// sales is the ledger, one row per seat sold, deliberately without a unique
// constraint so that a double sale would show; events.remaining is the
// counter the sellers decrement.
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
CREATE TABLE IF NOT EXISTS ticketsale_sales (
    event  TEXT    NOT NULL,
    seat   INTEGER NOT NULL,
    buyer  TEXT    NOT NULL,
    seller TEXT    NOT NULL,
    token  BIGINT  NOT NULL
);
`

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

// audit is what the database says after the sale.
type audit struct {
	Capacity, Remaining  int
	SeatsSold, FreeSeats int
	SalesRows            int
	DoubleSold           []int // seats with more than one sales row
	Mismatched           []int // seats whose row disagrees with the ledger
	HighWater            uint64
}

func (s *store) audit(ctx context.Context, domain, event, key string) (audit, error) {
	var a audit
	err := s.QueryRowContext(ctx, s.q(`SELECT capacity, remaining FROM ticketsale_events WHERE event = ?`), event).
		Scan(&a.Capacity, &a.Remaining)
	if err != nil {
		return a, err
	}
	if err := s.QueryRowContext(ctx, s.q(`SELECT
		COALESCE(SUM(CASE WHEN buyer IS NOT NULL THEN 1 ELSE 0 END), 0),
		COALESCE(SUM(CASE WHEN buyer IS NULL THEN 1 ELSE 0 END), 0)
		FROM ticketsale_seats WHERE event = ?`), event).Scan(&a.SeatsSold, &a.FreeSeats); err != nil {
		return a, err
	}
	if err := s.QueryRowContext(ctx, s.q(`SELECT count(*) FROM ticketsale_sales WHERE event = ?`), event).Scan(&a.SalesRows); err != nil {
		return a, err
	}
	rows, err := s.QueryContext(ctx, s.q(`SELECT seat FROM ticketsale_sales WHERE event = ? GROUP BY seat HAVING count(*) > 1 ORDER BY seat`), event)
	if err != nil {
		return a, err
	}
	if a.DoubleSold, err = scanInts(rows); err != nil {
		return a, err
	}
	// Every sold seat has exactly the ledger's buyer and token, and every
	// ledger row's seat is sold to that buyer.
	rows, err = s.QueryContext(ctx, s.q(`SELECT s.seat FROM ticketsale_seats s
		LEFT JOIN ticketsale_sales l ON l.event = s.event AND l.seat = s.seat
		WHERE s.event = ? AND ((s.buyer IS NULL) <> (l.seat IS NULL)
		      OR s.buyer <> l.buyer OR s.token <> l.token)
		ORDER BY s.seat`), event)
	if err != nil {
		return a, err
	}
	if a.Mismatched, err = scanInts(rows); err != nil {
		return a, err
	}
	a.HighWater, err = s.fence.HighWater(ctx, s.DB, domain, key)
	return a, err
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
