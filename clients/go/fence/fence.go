// Package fence stores Ticketing fencing tokens next to the data they
// protect, with database/sql, for SQLite and PostgreSQL.
//
// A lock orders the work; it cannot stop a holder that stalled (GC pause,
// SIGSTOP, overload) past its lease from writing afterwards. Only the store
// can: every write carries the token of the grant it was made under, and the
// store refuses a token lower than the highest it has already accepted for
// that key, atomically with the write. This package does that check:
//
//   - [Fence.Advance], inside the caller's *sql.Tx, raises the per-key
//     high-water mark in a fencing table to the token, or returns an error
//     wrapping [ErrStale] when a newer token got there first. Run it as the
//     first statement of the transaction, do the reads and writes the sale
//     depends on after it, and commit: the business write commits only
//     together with the fence, and a stale writer's transaction rolls back
//     whole. [Fence.Do] is the begin/advance/commit wrapper.
//   - [Fence.AdvanceBlock] and [Fence.DoBlock] do the same for a seat block
//     (a set of keys granted together under one token): every key's mark
//     is checked and raised in the one transaction, so a stale token on any
//     key rejects the whole write and no mark moves.
//   - [Fence.DoLock] and [Fence.AdvanceLock] take everything from a
//     [ticketing.Lock]: its keys, its token, and its fencing domain (INFO's
//     domain field on the lock's connection), so that a caller cannot
//     fence under the wrong domain. [Domain] is the domain of a Client,
//     for the forms that take it as an argument.
//   - [Update] is the single-statement form for rows that carry their own
//     token column: one UPDATE that writes every row its WHERE clause
//     matches, exactly Want of them, only if none has a newer token, and
//     otherwise writes none, inside a transaction or alone.
//   - [Fence.Retries] runs Do, DoBlock and DoLock again, with the same
//     token, after a PostgreSQL serialization failure or deadlock
//     ([Retryable]), which REPEATABLE READ and SERIALIZABLE give even the
//     legitimate holder.
//
// Updating the fencing row in its own transaction and writing the data
// afterwards is NOT safe: a holder can stall between the two (see
// clients/FENCING.md for the timeline).
//
// # Token encoding
//
// Tokens are u64 (1..2^64-1). Neither PostgreSQL (BIGINT) nor SQLite
// (INTEGER) has an unsigned 64-bit type, so both columns store
// [Encode](token) = token XOR 2^63 as a signed 64-bit integer, which is
// token - 2^63: token 1 is stored as -9223372036854775807, token 2^63 as 0,
// token 2^64-1 as 9223372036854775807. The mapping is a bijection that
// preserves order, so "<" in SQL compares tokens correctly across the whole
// u64 range. [Decode] reverses it; in PostgreSQL
// "token::numeric + 9223372036854775808" shows the real token (the schema
// files define a view that does).
//
// # Equal tokens
//
// A token equal to the high-water mark is accepted: a token belongs to
// exactly one grant, so an equal token is the current holder writing again
// (several transactions in one critical section, or a retry of one whose
// commit outcome was lost). Only a strictly lower token is stale.
package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	ticketing "ticketing/clients/go"
)

// ErrStale means the token is older than the high-water mark the store
// already holds for the key: the lock was lost (its lease ran out) and a
// newer holder has written. The transaction must not commit: Advance's
// caller rolls it back, Do rolls back itself; Update wrote nothing (its one
// statement changes all its rows or none), but a transaction it ran in
// must not commit either, since the writes made under the token before it
// are as stale.
var ErrStale = errors.New("fence: stale fencing token")

// ErrRowCount means a fenced statement did not report the number of rows
// it changed (a driver whose RowsAffected is negative), or reported one the
// fence did not expect. Without the count a stale token cannot be told
// from a write, so the helpers stop instead of guessing: Do rolls back;
// Advance's and Update's callers inside a transaction must roll it back.
var ErrRowCount = errors.New("fence: unexpected row count")

// Dialect selects the SQL placeholders of a database.
type Dialect int

const (
	// SQLite uses ? placeholders (modernc.org/sqlite, mattn/go-sqlite3).
	SQLite Dialect = iota
	// Postgres uses $1, $2, ... placeholders (pgx's stdlib, lib/pq).
	Postgres
)

func (d Dialect) String() string {
	switch d {
	case SQLite:
		return "sqlite"
	case Postgres:
		return "postgres"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// placeholder returns the n-th (1-based) placeholder.
func (d Dialect) placeholder(n int) string {
	if d == Postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// DefaultTable is the fencing table of the schema files
// (clients/schema/fence.{sqlite,postgres}.sql).
const DefaultTable = "ticketing_fence"

// Zero is the encoded value below every real token (token 0, which is never
// granted): the default of a token column on rows no holder has written yet.
const Zero int64 = -1 << 63

// Encode maps a u64 token to the signed 64-bit value stored in the database,
// preserving order: Encode(a) < Encode(b) exactly when a < b.
func Encode(token uint64) int64 { return int64(token ^ 1<<63) }

// Decode reverses Encode.
func Decode(v int64) uint64 { return uint64(v) ^ 1<<63 }

// Fence is the fencing table of one database. The zero value is not usable:
// set Dialect (SQLite is 0) and, if it is not DefaultTable, Table.
type Fence struct {
	Dialect Dialect
	// Table is the fencing table, with columns (domain, key, token) and
	// PRIMARY KEY (domain, key). Empty means DefaultTable. It is put into the
	// SQL as written: a trusted identifier, never user input.
	Table string
	// Retries is how many more times Do, DoBlock and DoLock run the whole
	// transaction (begin, advance, fn, commit), with the same token, after
	// PostgreSQL aborted it with a serialization failure or a deadlock
	// (SQLSTATE 40001 or 40P01, see Retryable): at REPEATABLE READ and
	// SERIALIZABLE the legitimate holder gets 40001 when another
	// transaction changed the fence row after its snapshot began. 0 means
	// no retry. A retry runs fn again, so fn must have no effect outside
	// the transaction. A stale token stays stale: its retry ends in
	// ErrStale.
	Retries int
}

// New returns the Fence of a database of dialect d using DefaultTable.
func New(d Dialect) Fence { return Fence{Dialect: d} }

func (f Fence) table() string {
	if f.Table == "" {
		return DefaultTable
	}
	return f.Table
}

// advanceSQL is the conditional high-water upsert. The row is inserted for a
// new key; otherwise it is updated only when the stored token is not newer,
// and then the statement reports one row affected, else none. In PostgreSQL
// the update locks the fence row until the transaction ends, so concurrent
// holders of the same key serialise on it and a lower token that arrives
// second sees the committed higher one (READ COMMITTED re-checks the WHERE
// against the latest version). In SQLite the write lock serialises them.
func (f Fence) advanceSQL() string {
	t := f.table()
	return "INSERT INTO " + t + " AS f (domain, key, token) VALUES (" +
		f.Dialect.placeholder(1) + ", " + f.Dialect.placeholder(2) + ", " + f.Dialect.placeholder(3) + ")" +
		" ON CONFLICT (domain, key) DO UPDATE SET token = excluded.token WHERE f.token <= excluded.token"
}

func checkToken(token uint64) error {
	if token == 0 {
		return errors.New("fence: token 0 (tokens start at 1)")
	}
	return nil
}

// Domain is the fencing domain of c's sidecar: INFO's domain field
// (ticketing.Client.Domain), the domain argument of every helper here.
// Not the cluster id (INFO's cluster, "dev" for every dev cluster): a
// rebuilt cluster keeps its id but starts a new domain.
func Domain(ctx context.Context, c *ticketing.Client) (string, error) {
	d, err := c.Domain(ctx)
	if err != nil {
		return "", fmt.Errorf("fence: the fencing domain: %w", err)
	}
	return d, nil
}

// Advance raises the high-water mark of (domain, key) to token inside tx, or
// returns an error wrapping ErrStale if a higher token was already recorded.
// The caller must then roll tx back. Call it before the reads and writes
// that the token protects, in the same transaction, and commit after them.
//
// domain names the token sequence: the cluster's fencing domain, INFO's
// domain field (Domain, ticketing.Client.Domain; unixapi/PROTOCOL.md),
// since tokens of different domains are not comparable. key is the lock
// key. AdvanceLock takes all three from a Lock.
func (f Fence) Advance(ctx context.Context, tx *sql.Tx, domain, key string, token uint64) error {
	if err := checkToken(token); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, f.advanceSQL(), domain, key, Encode(token))
	if err != nil {
		return fmt.Errorf("fence: advance %s/%s to %d: %w", domain, key, token, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("fence: advance %s/%s: rows affected: %w", domain, key, err)
	}
	switch n {
	case 1:
		return nil
	case 0:
		return fmt.Errorf("%w: %s/%s token %d is older than the stored high-water mark", ErrStale, domain, key, token)
	}
	return fmt.Errorf("%w: advance %s/%s: the upsert changed %d rows, not 1", ErrRowCount, domain, key, n)
}

// AdvanceBlock is Advance for a seat block, whose keys share one token: it
// raises the high-water mark of every key of keys to token inside tx, or
// returns an error wrapping ErrStale, naming the key, when any key already
// has a higher mark. The caller must then roll tx back, which undoes the
// keys already raised: all or nothing, as for the block itself. keys is a
// set (order and repeats do not matter, at least one key); the marks are
// raised in sorted key order, so that transactions over overlapping key
// sets lock the fence rows in one order and cannot deadlock (PostgreSQL).
// Call it first in the transaction, as Advance.
func (f Fence) AdvanceBlock(ctx context.Context, tx *sql.Tx, domain string, keys []string, token uint64) error {
	sorted, err := keySet(keys, token)
	if err != nil {
		return err
	}
	for _, k := range sorted {
		if err := f.Advance(ctx, tx, domain, k, token); err != nil {
			if errors.Is(err, ErrStale) {
				return fmt.Errorf("%w (a block of %d keys: nothing of it may be written)", err, len(sorted))
			}
			return err
		}
	}
	return nil
}

// keySet returns keys sorted, without repeats, or why they cannot be fenced.
func keySet(keys []string, token uint64) ([]string, error) {
	if err := checkToken(token); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, errors.New("fence: a block with no keys")
	}
	return slices.Compact(slices.Sorted(slices.Values(keys))), nil
}

// HighWater returns the highest token recorded for (domain, key), 0 if none.
// q is a *sql.DB, *sql.Conn or *sql.Tx.
func (f Fence) HighWater(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, domain, key string) (uint64, error) {
	var v int64
	err := q.QueryRowContext(ctx, "SELECT token FROM "+f.table()+" WHERE domain = "+
		f.Dialect.placeholder(1)+" AND key = "+f.Dialect.placeholder(2), domain, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("fence: high-water %s/%s: %w", domain, key, err)
	}
	return Decode(v), nil
}

// Do runs fn in a new transaction of db that starts with Advance, and
// commits it if fn returns nil; on any error (ErrStale included) it rolls
// back and returns the error. opts may be nil. With f.Retries it runs it
// all again after a serialization failure or deadlock (Fence.Retries).
//
// For SQLite, open the database so that transactions take the write lock
// at BEGIN (modernc.org/sqlite: "_txlock=immediate"), and set a busy
// timeout; otherwise two writers can deadlock on the lock upgrade and one
// gets SQLITE_BUSY.
func (f Fence) Do(ctx context.Context, db *sql.DB, opts *sql.TxOptions, domain, key string, token uint64, fn func(tx *sql.Tx) error) error {
	return f.inTx(ctx, db, opts, func(tx *sql.Tx) error { return f.Advance(ctx, tx, domain, key, token) }, fn)
}

// Retryable reports whether err (or an error it wraps) is a PostgreSQL
// serialization failure (SQLSTATE 40001) or deadlock (40P01): the
// transaction was rolled back and may be run again from the start, with
// the same token. The driver's error must have a SQLState() string method
// (pgx's *pgconn.PgError, lib/pq's *pq.Error).
func Retryable(err error) bool {
	var pe interface{ SQLState() string }
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.SQLState() {
	case "40001", "40P01":
		return true
	}
	return false
}

// inTx is inTx again after a Retryable error, up to f.Retries times, after
// a short random pause that lets the transaction it conflicted with finish.
func (f Fence) inTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, advance, fn func(tx *sql.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := inTx(ctx, db, opts, advance, fn)
		if err == nil || attempt >= f.Retries || !Retryable(err) {
			return err
		}
		pause := time.Duration(rand.Int64N(int64(5*time.Millisecond) << min(attempt, 6)))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
	}
}

// inTx runs advance and then fn in a new transaction of db, committing if
// both return nil and rolling back otherwise.
func inTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, advance, fn func(tx *sql.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("fence: begin: %w", err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	if err = advance(tx); err != nil {
		return err
	}
	if err = fn(tx); err != nil {
		return err
	}
	if err = tx.Commit(); err != nil {
		return fmt.Errorf("fence: commit: %w", err)
	}
	return nil
}

// DoBlock is Do for a seat block: fn runs in a new transaction of db that
// starts with AdvanceBlock of every key of keys to the block's token, and
// commits if fn returns nil. A stale token on any key rolls the whole
// transaction back before fn runs (an error wrapping ErrStale): no mark is
// raised and nothing is written.
func (f Fence) DoBlock(ctx context.Context, db *sql.DB, opts *sql.TxOptions, domain string, keys []string, token uint64, fn func(tx *sql.Tx) error) error {
	if _, err := keySet(keys, token); err != nil {
		return err
	}
	return f.inTx(ctx, db, opts, func(tx *sql.Tx) error { return f.AdvanceBlock(ctx, tx, domain, keys, token) }, fn)
}

// AdvanceLock is AdvanceBlock for the keys and the token of lk, under its
// fencing domain (lk.Domain: INFO's domain field on the connection that
// took it), inside tx: for one key as for a seat block. For a permit
// (lk.Permit) the fenced resource is lk.FenceKey, "<key> <slot>": each
// slot of a semaphore is its own fencing domain (AdvancePermit).
func (f Fence) AdvanceLock(ctx context.Context, tx *sql.Tx, lk *ticketing.Lock) error {
	domain, err := lockDomain(ctx, lk)
	if err != nil {
		return err
	}
	return f.AdvanceBlock(ctx, tx, domain, lockFenceKeys(lk), lk.Token())
}

// lockFenceKeys are the fenced resources of lk: its keys, or for a permit
// its "<key> <slot>".
func lockFenceKeys(lk *ticketing.Lock) []string {
	if lk.Permit() {
		return []string{lk.FenceKey()}
	}
	return lk.Keys()
}

// AdvancePermit is Advance for a permit of a semaphore key: the fenced
// resource is "<key> <slot>" (ticketing.PermitFenceKey), since the cluster
// hands each slot on with tokens that increase per slot, not across the
// slots (unixapi/PROTOCOL.md, "Semaphores"). A stale holder of slot s is
// refused once a newer token wrote slot s; holders of other slots are not
// affected.
func (f Fence) AdvancePermit(ctx context.Context, tx *sql.Tx, domain, key string, slot int, token uint64) error {
	if slot < 0 {
		return fmt.Errorf("fence: permit slot %d of %s: want 0 or more", slot, key)
	}
	return f.Advance(ctx, tx, domain, ticketing.PermitFenceKey(key, slot), token)
}

// DoPermit is Do for a permit: fn runs in a new transaction of db that
// starts with AdvancePermit. DoLock does the same given the permit's Lock.
func (f Fence) DoPermit(ctx context.Context, db *sql.DB, opts *sql.TxOptions, domain, key string, slot int, token uint64, fn func(tx *sql.Tx) error) error {
	if slot < 0 {
		return fmt.Errorf("fence: permit slot %d of %s: want 0 or more", slot, key)
	}
	return f.Do(ctx, db, opts, domain, ticketing.PermitFenceKey(key, slot), token, fn)
}

// DoLock is DoBlock for the keys and the token of lk (a permit's
// "<key> <slot>", see AdvanceLock), under its fencing domain (lk.Domain): fn runs in a new transaction of db that starts with
// AdvanceLock, and commits if fn returns nil. A stale token (a newer
// holder wrote) is an error wrapping ErrStale, with nothing written. The
// domain is asked before the transaction begins (once per connection).
func (f Fence) DoLock(ctx context.Context, db *sql.DB, opts *sql.TxOptions, lk *ticketing.Lock, fn func(tx *sql.Tx) error) error {
	domain, err := lockDomain(ctx, lk)
	if err != nil {
		return err
	}
	return f.DoBlock(ctx, db, opts, domain, lockFenceKeys(lk), lk.Token(), fn)
}

func lockDomain(ctx context.Context, lk *ticketing.Lock) (string, error) {
	d, err := lk.Domain(ctx)
	if err != nil {
		return "", fmt.Errorf("fence: the fencing domain of %s (token %d): %w", lk.Key(), lk.Token(), err)
	}
	return d, nil
}

// Execer is what Update runs on: *sql.DB, *sql.Conn, *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Update is the single-statement form of a fenced write, for rows that
// keep their own token column (declared "BIGINT NOT NULL DEFAULT
// -9223372036854775808", i.e. Zero, for rows not yet written under a lock).
// It runs one statement that writes all the rows Where matches, or none:
//
//	UPDATE <Table> SET <Column> = <token>, <Set>
//	 WHERE (<Where>) AND <Column> <= <token>
//	   AND (SELECT count(*) = <Want> AND max(<Column>) <= <token>
//	          FROM (SELECT <Column> FROM <Table> WHERE (<Where>) FOR UPDATE) AS ticketing_fence_rows)
//
// (SQLite: without FOR UPDATE; a statement there runs alone. The
// statement starts with UPDATE, for drivers that count rows only then.)
// The last condition holds only when Where matches exactly Want rows and
// none has a newer token, so a stale token changes no row even when Where
// matches several and only some are newer: outside a transaction too,
// nothing of a stale holder's write commits. In PostgreSQL, FOR UPDATE
// waits for a newer holder's open transaction on those rows and then reads
// what it committed (READ COMMITTED), so the check sees the latest tokens;
// at REPEATABLE READ and SERIALIZABLE it fails instead with SQLSTATE
// 40001, having written nothing (Retryable; Exec does not retry).
//
// Set and Where use the dialect's placeholders for Args ($1..$n in
// PostgreSQL, ? in SQLite); the token's and Want's placeholders are added
// (see SQL). Where appears twice: in PostgreSQL it reuses its $n; in
// SQLite its arguments are passed twice, found by counting the ?s of Set
// (outside quotes and comments; numbered or named parameters are refused).
//
// Exec returns an error wrapping ErrStale when no row changed: a row's
// token is newer, or Where does not match exactly Want rows.
type Update struct {
	Dialect Dialect
	Table   string // trusted identifier
	Set     string // e.g. "balance = $1"
	Where   string // e.g. "id = $2"
	Args    []any  // arguments of Set and Where, in placeholder order
	// Column is the row's token column; empty means "fence_token".
	Column string
	// Want is the number of rows Where must match and the update change; 0
	// means 1 (the zero value is the common case, one row; never "no
	// check"), as want=0 in the Python and Node.js helpers. Negative is an
	// error.
	Want int64
}

// rowsCTE names the rows the fence checks (a derived table); unusual
// enough not to clash with a caller's name.
const rowsCTE = "ticketing_fence_rows"

// SQL returns the statement and its arguments for token. In PostgreSQL the
// token is $n+1 and Want $n+2 (n = len(Args)), and Where is repeated as
// written. In SQLite, whose ? placeholders are positional, the arguments
// are token, Set's, Where's, token, Want, token, Where's.
func (u Update) SQL(token uint64) (string, []any, error) {
	col := u.Column
	if col == "" {
		col = "fence_token"
	}
	want, err := u.want()
	if err != nil {
		return "", nil, err
	}
	tok := Encode(token)
	if u.Dialect == Postgres {
		p, w := u.Dialect.placeholder(len(u.Args)+1), u.Dialect.placeholder(len(u.Args)+2)
		return "UPDATE " + u.Table + " SET " + col + " = " + p + ", " + u.Set +
				" WHERE (" + u.Where + ") AND " + col + " <= " + p +
				" AND (SELECT count(*) = " + w + " AND max(" + col + ") <= " + p +
				" FROM (SELECT " + col + " FROM " + u.Table + " WHERE (" + u.Where + ") FOR UPDATE) AS " + rowsCTE + ")",
			append(append([]any(nil), u.Args...), tok, want), nil
	}
	nSet, err := qmarks(u.Set)
	if err != nil {
		return "", nil, fmt.Errorf("fence: update %s: Set: %w", u.Table, err)
	}
	nWhere, err := qmarks(u.Where)
	if err != nil {
		return "", nil, fmt.Errorf("fence: update %s: Where: %w", u.Table, err)
	}
	if nSet+nWhere != len(u.Args) {
		return "", nil, fmt.Errorf("fence: update %s: Set and Where have %d placeholders, Args %d values", u.Table, nSet+nWhere, len(u.Args))
	}
	args := make([]any, 0, len(u.Args)+nWhere+4)
	args = append(args, tok)
	args = append(args, u.Args...)
	args = append(args, tok, want, tok)
	args = append(args, u.Args[nSet:]...)
	return "UPDATE " + u.Table + " SET " + col + " = ?, " + u.Set +
		" WHERE (" + u.Where + ") AND " + col + " <= ?" +
		" AND (SELECT count(*) = ? AND max(" + col + ") <= ?" +
		" FROM (SELECT " + col + " FROM " + u.Table + " WHERE (" + u.Where + ")) AS " + rowsCTE + ")", args, nil
}

// qmarks counts the ? placeholders of an SQLite expression, outside
// quoted strings and identifiers and comments. The count splits Args
// between Set and Where; a numbered (?1) or named (:a, @a, $a) parameter
// would make that split wrong, so it is refused.
func qmarks(s string) (int, error) {
	n := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'', '"', '`', '[':
			end := c
			if c == '[' {
				end = ']'
			}
			j := strings.IndexByte(s[i+1:], end)
			if j < 0 {
				return 0, fmt.Errorf("unterminated %c in %q", c, s)
			}
			i += j + 1 // a doubled quote is two quoted runs in a row
		case '-':
			if i+1 < len(s) && s[i+1] == '-' {
				j := strings.IndexByte(s[i:], '\n')
				if j < 0 {
					return n, nil
				}
				i += j
			}
		case '/':
			if i+1 < len(s) && s[i+1] == '*' {
				j := strings.Index(s[i+2:], "*/")
				if j < 0 {
					return 0, fmt.Errorf("unterminated comment in %q", s)
				}
				i += j + 3
			}
		case '?':
			if i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
				return 0, fmt.Errorf("numbered parameter in %q: use ? only", s)
			}
			n++
		case ':', '@', '$':
			if i+1 < len(s) && (s[i+1] == '_' || s[i+1] >= 'a' && s[i+1] <= 'z' || s[i+1] >= 'A' && s[i+1] <= 'Z') {
				return 0, fmt.Errorf("named parameter in %q: use ? only", s)
			}
		}
	}
	return n, nil
}

// Exec runs the update for token on ex, inside a transaction or alone: it
// is one statement that writes Want rows or none. On ErrStale nothing was
// written; on ErrRowCount (a count other than 0 or Want, which the
// statement should not give) roll back the transaction if there is one.
func (u Update) Exec(ctx context.Context, ex Execer, token uint64) (sql.Result, error) {
	if err := checkToken(token); err != nil {
		return nil, err
	}
	want, err := u.want()
	if err != nil {
		return nil, err
	}
	q, args, err := u.SQL(token)
	if err != nil {
		return nil, err
	}
	res, err := ex.ExecContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("fence: update %s: %w", u.Table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, fmt.Errorf("fence: update %s: rows affected: %w", u.Table, err)
	}
	switch n {
	case want:
		return res, nil
	case 0:
		return res, fmt.Errorf("%w: update %s with token %d changed no row (a newer token holds one of the rows, or Where does not match %d rows)", ErrStale, u.Table, token, want)
	}
	return res, fmt.Errorf("%w: update %s with token %d changed %d rows, not %d or none", ErrRowCount, u.Table, token, n, want)
}

// want is the number of rows the update must change: Want, 0 meaning 1.
func (u Update) want() (int64, error) {
	switch {
	case u.Want < 0:
		return 0, fmt.Errorf("fence: update %s: Want %d (rows must be 1 or more; 0 means 1)", u.Table, u.Want)
	case u.Want == 0:
		return 1, nil
	}
	return u.Want, nil
}
