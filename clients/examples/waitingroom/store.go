package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"

	ticketing "ticketing/clients/go"
	"ticketing/clients/go/fence"
)

// store is the sale's database: SQLite (WAL) or PostgreSQL.
type store struct {
	*sql.DB
	dialect fence.Dialect
	fence   fence.Fence
}

func isPostgres(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// openStore opens a postgres:// URL or an SQLite file ("sqlite:" prefix
// optional). SQLite transactions take the write lock at BEGIN (IMMEDIATE)
// and wait up to 10 s for it: fifty buyers check out at once.
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
	if s.dialect == fence.Postgres {
		// Each checkout holds a connection for one short transaction;
		// more than the permits would only queue in the server.
		s.SetMaxOpenConns(32)
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

// The example's tables: the inventory counter of each sale, and one
// checkout row per admitted buyer that checked out (outcome "sold" is the
// ledger of tickets, "soldout" a buyer told it was sold out). seq is the
// commit order within a slot (every checkout of one slot raised the same
// fence row first, which serialises them), so the audit can see that a
// slot's tokens only went up. No unique constraint on buyer or token, so
// that a double sale would show instead of failing.
func exampleSchema(d fence.Dialect) string {
	seq := "seq INTEGER PRIMARY KEY AUTOINCREMENT"
	if d == fence.Postgres {
		seq = "seq BIGSERIAL PRIMARY KEY"
	}
	return `
CREATE TABLE IF NOT EXISTS waitingroom_sales (
    sale      TEXT PRIMARY KEY,
    capacity  INTEGER NOT NULL,
    remaining INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS waitingroom_checkouts (
    ` + seq + `,
    sale    TEXT    NOT NULL,
    buyer   INTEGER NOT NULL,
    slot    INTEGER NOT NULL,
    token   BIGINT  NOT NULL,
    tickets INTEGER NOT NULL,
    outcome TEXT    NOT NULL
);
`
}

// setup creates the tables (if missing) and the sale with capacity tickets.
func (s *store) setup(ctx context.Context, sale string, capacity int) error {
	for _, ddl := range []string{fence.Schema(s.dialect), exampleSchema(s.dialect)} {
		if _, err := s.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("schema: %w", err)
		}
	}
	_, err := s.ExecContext(ctx, s.q(`INSERT INTO waitingroom_sales (sale, capacity, remaining) VALUES (?, ?, ?)`),
		sale, capacity, capacity)
	return err
}

// errSoldOut: no ticket left; the checkout recorded the buyer as told so.
var errSoldOut = errors.New("sold out")

// checkout is one admitted buyer's fenced write, in one transaction:
// raise the fence of the permit's fencing key ("<key> <slot>") to token
// (fence.Do; ErrStale and nothing written if a newer holder of that slot
// wrote), then take one ticket off the counter if one is left and write
// the buyer's ledger row, or, sold out, a row saying so (the fence is
// raised all the same: the holder of the slot has written). errSoldOut
// after a committed sold-out row.
func (s *store) checkout(ctx context.Context, domain, fenceKey, sale string, buyer, slot int, token uint64) error {
	soldOut := false
	err := s.fence.Do(ctx, s.DB, nil, domain, fenceKey, token, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, s.q(`UPDATE waitingroom_sales SET remaining = remaining - 1
			WHERE sale = ? AND remaining >= 1`), sale)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		outcome, tickets := "sold", 1
		if n != 1 {
			soldOut, outcome, tickets = true, "soldout", 0
		}
		_, err = tx.ExecContext(ctx, s.q(`INSERT INTO waitingroom_checkouts (sale, buyer, slot, token, tickets, outcome)
			VALUES (?, ?, ?, ?, ?, ?)`), sale, buyer, slot, fence.Encode(token), tickets, outcome)
		return err
	})
	if err == nil && soldOut {
		return errSoldOut
	}
	return err
}

// checkoutRow is one row of waitingroom_checkouts.
type checkoutRow struct {
	Seq         int64
	Buyer, Slot int
	Token       uint64
	Tickets     int
	Outcome     string
}

// audit is what the database says after the sale.
type audit struct {
	Capacity, Remaining int
	Rows                []checkoutRow // in seq order
	// HighWater is the fence's high-water mark of each slot that has one
	// (fence key "<key> <slot>").
	HighWater map[int]uint64
}

func (s *store) audit(ctx context.Context, domain, key, sale string, permits int) (audit, error) {
	a := audit{HighWater: map[int]uint64{}}
	if err := s.QueryRowContext(ctx, s.q(`SELECT capacity, remaining FROM waitingroom_sales WHERE sale = ?`), sale).
		Scan(&a.Capacity, &a.Remaining); err != nil {
		return a, err
	}
	rows, err := s.QueryContext(ctx, s.q(`SELECT seq, buyer, slot, token, tickets, outcome FROM waitingroom_checkouts
		WHERE sale = ? ORDER BY seq`), sale)
	if err != nil {
		return a, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			r   checkoutRow
			tok int64
		)
		if err := rows.Scan(&r.Seq, &r.Buyer, &r.Slot, &tok, &r.Tickets, &r.Outcome); err != nil {
			return a, err
		}
		r.Token = fence.Decode(tok)
		a.Rows = append(a.Rows, r)
	}
	if err := rows.Err(); err != nil {
		return a, err
	}
	for slot := 0; slot < permits; slot++ {
		hw, err := s.fence.HighWater(ctx, s.DB, domain, ticketing.PermitFenceKey(key, slot))
		if err != nil {
			return a, err
		}
		if hw != 0 {
			a.HighWater[slot] = hw
		}
	}
	return a, nil
}
