package fence_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	ticketing "ticketing/clients/go"
	"ticketing/clients/go/fence"
)

// db is one database under test with the fencing schema and a business
// table "accounts" (id, balance, fence_token) created.
type db struct {
	*sql.DB
	f fence.Fence
	// q rewrites a query written with $n placeholders for the dialect.
	d fence.Dialect
}

func (d db) q(s string) string {
	if d.d == fence.Postgres {
		return s
	}
	// $1, $2, ... → ? (tests use each placeholder once and in order).
	out := []byte{}
	for i := 0; i < len(s); i++ {
		if s[i] == '$' {
			out = append(out, '?')
			for i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
				i++
			}
			continue
		}
		out = append(out, s[i])
	}
	return string(out)
}

// SQLiteDSN is how the tests (and the ticket-sale example) open SQLite: WAL,
// a busy timeout, and BEGIN IMMEDIATE so a transaction takes the write lock
// up front.
func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
}

func openSQLite(t *testing.T) db {
	t.Helper()
	return openSQLiteDSN(t, sqliteDSN(filepath.Join(t.TempDir(), "fence.db")))
}

// openSQLiteJournal is openSQLite with the rollback journal instead of WAL:
// the other way SQLite runs, in which readers and the writer share locks
// differently.
func openSQLiteJournal(t *testing.T) db {
	t.Helper()
	return openSQLiteDSN(t, "file:"+filepath.Join(t.TempDir(), "fence.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(DELETE)&_txlock=immediate")
}

func openSQLiteDSN(t *testing.T, dsn string) db {
	t.Helper()
	sdb, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdb.Close() })
	return setup(t, sdb, fence.SQLite)
}

// openPostgres connects to $TICKETING_TEST_PG_DSN (set by .ci/postgres.sh,
// which `make test` runs) and gives the test a schema of its own.
func openPostgres(t *testing.T) db {
	t.Helper()
	dsn := os.Getenv("TICKETING_TEST_PG_DSN")
	if dsn == "" {
		t.Skip("TICKETING_TEST_PG_DSN is not set: no PostgreSQL server for this test (`make test` starts one with .ci/postgres.sh)")
	}
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	schema := "fence_test_" + time.Now().Format("150405_000000000")
	if _, err := admin.Exec("CREATE SCHEMA " + schema); err != nil {
		t.Fatal(err)
	}
	pdb, err := sql.Open("pgx", dsn+"&search_path="+schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pdb.Close()
		if a, err := sql.Open("pgx", dsn); err == nil {
			_, _ = a.Exec("DROP SCHEMA " + schema + " CASCADE")
			a.Close()
		}
	})
	return setup(t, pdb, fence.Postgres)
}

func setup(t *testing.T, sdb *sql.DB, d fence.Dialect) db {
	t.Helper()
	if _, err := sdb.Exec(fence.Schema(d)); err != nil {
		t.Fatalf("schema: %v", err)
	}
	tokType := "INTEGER"
	if d == fence.Postgres {
		tokType = "BIGINT"
	}
	if _, err := sdb.Exec(`CREATE TABLE accounts (
		id TEXT PRIMARY KEY, balance INTEGER NOT NULL,
		fence_token ` + tokType + ` NOT NULL DEFAULT -9223372036854775808)`); err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.Exec(`CREATE TABLE ledger (id TEXT PRIMARY KEY, note TEXT)`); err != nil {
		t.Fatal(err)
	}
	return db{DB: sdb, f: fence.New(d), d: d}
}

// forEachDB runs body against SQLite (WAL and rollback journal) and, when
// one is available, PostgreSQL.
func forEachDB(t *testing.T, body func(t *testing.T, d db)) {
	t.Run("sqlite", func(t *testing.T) { body(t, openSQLite(t)) })
	t.Run("sqlite-journal", func(t *testing.T) { body(t, openSQLiteJournal(t)) })
	t.Run("postgres", func(t *testing.T) { body(t, openPostgres(t)) })
}

func TestEncodePreservesOrder(t *testing.T) {
	vals := []uint64{0, 1, 2, 1<<53 + 1, 1<<63 - 1, 1 << 63, 1<<63 + 1, math.MaxUint64 - 1, math.MaxUint64}
	for i, v := range vals {
		if fence.Decode(fence.Encode(v)) != v {
			t.Fatalf("Decode(Encode(%d)) = %d", v, fence.Decode(fence.Encode(v)))
		}
		if i > 0 && !(fence.Encode(vals[i-1]) < fence.Encode(v)) {
			t.Fatalf("Encode(%d)=%d is not below Encode(%d)=%d", vals[i-1], fence.Encode(vals[i-1]), v, fence.Encode(v))
		}
	}
	if fence.Encode(0) != fence.Zero || fence.Encode(1<<63) != 0 || fence.Encode(math.MaxUint64) != math.MaxInt64 {
		t.Fatal("encoding constants")
	}
}

func TestSchemaFilesMatch(t *testing.T) {
	for _, d := range []fence.Dialect{fence.SQLite, fence.Postgres} {
		b, err := os.ReadFile(filepath.Join("..", "..", "schema", "fence."+d.String()+".sql"))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != fence.Schema(d) {
			t.Errorf("clients/schema/fence.%s.sql differs from fence.Schema(%v)", d, d)
		}
	}
}

// advance runs Advance in a transaction of its own that also writes a ledger
// row, and reports whether the ledger row exists afterwards.
func advance(t *testing.T, d db, key string, token uint64, note string) (error, bool) {
	t.Helper()
	ctx := context.Background()
	err := d.f.Do(ctx, d.DB, nil, "test", key, token, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, d.q(`INSERT INTO ledger (id, note) VALUES ($1, $2)`), note, key)
		return err
	})
	var n int
	if qerr := d.QueryRow(d.q(`SELECT count(*) FROM ledger WHERE id = $1`), note).Scan(&n); qerr != nil {
		t.Fatal(qerr)
	}
	return err, n == 1
}

func TestAdvance(t *testing.T) {
	forEachDB(t, func(t *testing.T, d db) {
		steps := []struct {
			token uint64
			stale bool
		}{
			{5, false},         // first write for the key: inserted
			{7, false},         // newer
			{7, false},         // equal: the same grant writing again
			{6, true},          // older
			{1, true},          // much older
			{1<<63 - 1, false}, // just below 2^63
			{1 << 63, false},   // 2^63: stored as 0
			{1<<63 - 1, true},  // order holds across the sign boundary
			{math.MaxUint64 - 1, false},
			{math.MaxUint64, false}, // the largest token
			{math.MaxUint64 - 1, true},
			{1 << 63, true},
		}
		for i, s := range steps {
			note := "n" + string(rune('a'+i))
			err, wrote := advance(t, d, "seats/42", s.token, note)
			if s.stale {
				if !errors.Is(err, fence.ErrStale) {
					t.Fatalf("step %d token %d: err %v, want ErrStale", i, s.token, err)
				}
				if wrote {
					t.Fatalf("step %d token %d: business write committed despite ErrStale", i, s.token)
				}
				continue
			}
			if err != nil || !wrote {
				t.Fatalf("step %d token %d: err %v wrote %v", i, s.token, err, wrote)
			}
		}
		hw, err := d.f.HighWater(context.Background(), d.DB, "test", "seats/42")
		if err != nil || hw != math.MaxUint64 {
			t.Fatalf("high-water %d, %v", hw, err)
		}
		// Keys and domains are independent.
		if err, _ := advance(t, d, "seats/43", 2, "other-key"); err != nil {
			t.Fatal(err)
		}
		if err := d.f.Do(context.Background(), d.DB, nil, "other-cluster", "seats/42", 1, func(*sql.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := d.f.Do(context.Background(), d.DB, nil, "test", "k", 0, func(*sql.Tx) error { return nil }); err == nil || errors.Is(err, fence.ErrStale) {
			t.Fatalf("token 0: %v", err)
		}
	})
}

// TestBusinessErrorRollsBackFence: when the business write fails, the fence
// does not move either (it is the same transaction).
func TestBusinessErrorRollsBackFence(t *testing.T) {
	forEachDB(t, func(t *testing.T, d db) {
		ctx := context.Background()
		boom := errors.New("boom")
		err := d.f.Do(ctx, d.DB, nil, "test", "k", 9, func(tx *sql.Tx) error { return boom })
		if !errors.Is(err, boom) {
			t.Fatal(err)
		}
		if hw, err := d.f.HighWater(ctx, d.DB, "test", "k"); err != nil || hw != 0 {
			t.Fatalf("high-water %d after rollback, %v", hw, err)
		}
	})
}

// TestConcurrentStaleWaitsAndLoses: a newer holder has advanced the fence in
// an open transaction; the stale holder's Advance waits for it (row lock in
// PostgreSQL, write lock in SQLite) and, once it commits, is rejected.
func TestConcurrentStaleWaitsAndLoses(t *testing.T) {
	forEachDB(t, func(t *testing.T, d db) {
		ctx := context.Background()
		if err, _ := advance(t, d, "k", 10, "first"); err != nil {
			t.Fatal(err)
		}
		newer, err := d.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.f.Advance(ctx, newer, "test", "k", 12); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			err, wrote := advance(t, d, "k", 11, "stale")
			if wrote {
				err = errors.New("stale write committed")
			}
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("stale transaction finished while the newer one was open: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		if _, err := newer.ExecContext(ctx, d.q(`INSERT INTO ledger (id, note) VALUES ($1, $2)`), "newer", "k"); err != nil {
			t.Fatal(err)
		}
		if err := newer.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale holder: %v, want ErrStale", err)
		}
	})
}

// TestUpdate is the single-statement form: the row carries its own token.
func TestUpdate(t *testing.T) {
	forEachDB(t, func(t *testing.T, d db) {
		ctx := context.Background()
		if _, err := d.Exec(d.q(`INSERT INTO accounts (id, balance) VALUES ($1, 100)`), "alice"); err != nil {
			t.Fatal(err)
		}
		set := func(balance int, token uint64) error {
			u := fence.Update{
				Dialect: d.d, Table: "accounts",
				Set: d.q("balance = $1"), Where: d.q("id = $2"),
				Args: []any{balance, "alice"},
			}
			_, err := u.Exec(ctx, d.DB, token)
			return err
		}
		balance := func() int {
			var b int
			if err := d.QueryRow(d.q(`SELECT balance FROM accounts WHERE id = $1`), "alice").Scan(&b); err != nil {
				t.Fatal(err)
			}
			return b
		}
		for _, s := range []struct {
			balance int
			token   uint64
			stale   bool
		}{
			{90, 3, false}, {80, 3, false}, {70, 2, true},
			{60, 1 << 63, false}, {50, 1<<63 - 1, true},
			{40, math.MaxUint64, false}, {30, math.MaxUint64 - 1, true},
		} {
			before := balance()
			err := set(s.balance, s.token)
			if s.stale {
				if !errors.Is(err, fence.ErrStale) || balance() != before {
					t.Fatalf("token %d: err %v, balance %d (was %d)", s.token, err, balance(), before)
				}
				continue
			}
			if err != nil || balance() != s.balance {
				t.Fatalf("token %d: err %v, balance %d", s.token, err, balance())
			}
		}
		u := fence.Update{Dialect: d.d, Table: "accounts", Set: d.q("balance = $1"), Where: d.q("id = $2"), Args: []any{1, "bob"}}
		if _, err := u.Exec(ctx, d.DB, 5); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("missing row: %v", err)
		}
	})
}

// blockWrite runs DoBlock over keys with a ledger write, and reports
// whether the ledger row exists afterwards.
func blockWrite(t *testing.T, d db, keys []string, token uint64, note string) (error, bool) {
	t.Helper()
	ctx := context.Background()
	err := d.f.DoBlock(ctx, d.DB, nil, "test", keys, token, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, d.q(`INSERT INTO ledger (id, note) VALUES ($1, $2)`), note, "block")
		return err
	})
	var n int
	if qerr := d.QueryRow(d.q(`SELECT count(*) FROM ledger WHERE id = $1`), note).Scan(&n); qerr != nil {
		t.Fatal(qerr)
	}
	return err, n == 1
}

// marks returns the high-water mark of each key.
func marks(t *testing.T, d db, keys ...string) []uint64 {
	t.Helper()
	out := make([]uint64, len(keys))
	for i, k := range keys {
		hw, err := d.f.HighWater(context.Background(), d.DB, "test", k)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = hw
	}
	return out
}

// TestAdvanceBlock: a block's one token is checked against every key's
// mark and raises all of them, or — stale on any key — none, and the
// business write does not commit. Single-key fencing keeps working beside it.
func TestAdvanceBlock(t *testing.T) {
	forEachDB(t, func(t *testing.T, d db) {
		ctx := context.Background()
		if err, _ := advance(t, d, "seat/b", 10, "single"); err != nil {
			t.Fatal(err)
		}
		all := []string{"seat/c", "seat/a", "seat/b"}
		// Stale on the middle key (in sorted order): nothing advanced.
		if err, wrote := blockWrite(t, d, all, 9, "stale1"); !errors.Is(err, fence.ErrStale) || wrote {
			t.Fatalf("token 9 below seat/b's 10: err %v, wrote %v", err, wrote)
		}
		if got := marks(t, d, "seat/a", "seat/b", "seat/c"); !slices.Equal(got, []uint64{0, 10, 0}) {
			t.Fatalf("marks after a stale block: %v, want [0 10 0]", got)
		}
		// Equal on one key, new on the others: all raised to the one token.
		if err, wrote := blockWrite(t, d, all, 10, "ok1"); err != nil || !wrote {
			t.Fatalf("token 10: %v, wrote %v", err, wrote)
		}
		if got := marks(t, d, "seat/a", "seat/b", "seat/c"); !slices.Equal(got, []uint64{10, 10, 10}) {
			t.Fatalf("marks: %v", got)
		}
		// Repeats and order do not matter; across the sign boundary.
		if err, _ := blockWrite(t, d, []string{"seat/c", "seat/a", "seat/c"}, 1<<63, "ok2"); err != nil {
			t.Fatal(err)
		}
		// Stale on the first key only (seat/a at 2^63): seat/b stays at 10.
		if err, wrote := blockWrite(t, d, []string{"seat/b", "seat/a"}, 1<<63-1, "stale2"); !errors.Is(err, fence.ErrStale) || wrote {
			t.Fatalf("stale on seat/a: %v, wrote %v", err, wrote)
		}
		if got := marks(t, d, "seat/a", "seat/b", "seat/c"); !slices.Equal(got, []uint64{1 << 63, 10, 1 << 63}) {
			t.Fatalf("marks after the second stale block: %v", got)
		}
		// Single-key fencing beside blocks.
		if err, _ := advance(t, d, "seat/b", 11, "single2"); err != nil {
			t.Fatal(err)
		}
		if err, _ := advance(t, d, "seat/a", 11, "single3"); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("single key below a block's mark: %v", err)
		}
		// AdvanceBlock in the caller's transaction, rolled back by the caller.
		tx, err := d.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.f.AdvanceBlock(ctx, tx, "test", []string{"seat/z", "seat/a"}, 5); !errors.Is(err, fence.ErrStale) || !strings.Contains(err.Error(), "seat/a") {
			t.Fatalf("AdvanceBlock: %v, want ErrStale naming seat/a", err)
		}
		tx.Rollback()
		if got := marks(t, d, "seat/z"); got[0] != 0 {
			t.Fatalf("seat/z advanced to %d by a rolled-back stale block", got[0])
		}
		for _, bad := range []struct {
			keys  []string
			token uint64
		}{{nil, 5}, {[]string{"k"}, 0}} {
			if err := d.f.DoBlock(ctx, d.DB, nil, "test", bad.keys, bad.token, func(*sql.Tx) error { return nil }); err == nil || errors.Is(err, fence.ErrStale) {
				t.Fatalf("DoBlock(%q, %d): %v", bad.keys, bad.token, err)
			}
		}
	})
}

// TestConcurrentStaleBlockWaitsAndLoses: a newer block holder has advanced
// its keys in an open transaction; a stale block over the same keys, named
// in another order, waits for it (no deadlock: both lock in key order) and
// is rejected once it commits.
func TestConcurrentStaleBlockWaitsAndLoses(t *testing.T) {
	forEachDB(t, func(t *testing.T, d db) {
		ctx := context.Background()
		if err, _ := blockWrite(t, d, []string{"x", "y"}, 10, "first"); err != nil {
			t.Fatal(err)
		}
		newer, err := d.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.f.AdvanceBlock(ctx, newer, "test", []string{"x", "y"}, 12); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			err, wrote := blockWrite(t, d, []string{"y", "x"}, 11, "stale")
			if wrote {
				err = errors.New("stale write committed")
			}
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("stale transaction finished while the newer one was open: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := newer.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale block: %v, want ErrStale", err)
		}
		if got := marks(t, d, "x", "y"); !slices.Equal(got, []uint64{12, 12}) {
			t.Fatalf("marks %v", got)
		}
	})
}

// TestUpdateWantZeroMeansOne: Want 0 is the one-row case, as want=0 in the
// Python and Node.js helpers: never "no check", never "at least one".
func TestUpdateWantZeroMeansOne(t *testing.T) {
	forEachDB(t, func(t *testing.T, d db) {
		ctx := context.Background()
		for id, tok := range map[string]uint64{"w1": 10, "w2": 1, "w3": 1} {
			if _, err := d.Exec(d.q(`INSERT INTO accounts (id, balance, fence_token) VALUES ($1, 100, $2)`), id, fence.Encode(tok)); err != nil {
				t.Fatal(err)
			}
		}
		upd := func(ex fence.Execer, where string, args []any, want int64, token uint64) error {
			u := fence.Update{Dialect: d.d, Table: "accounts", Set: d.q("balance = $1"), Where: d.q(where), Args: args, Want: want}
			_, err := u.Exec(ctx, ex, token)
			return err
		}
		balances := func() []int {
			var out []int
			for _, id := range []string{"w1", "w2", "w3"} {
				var b int
				if err := d.QueryRow(d.q(`SELECT balance FROM accounts WHERE id = $1`), id).Scan(&b); err != nil {
					t.Fatal(err)
				}
				out = append(out, b)
			}
			return out
		}
		// A stale token on the one row: stale, not "no check".
		if err := upd(d.DB, "id = $2", []any{1, "w1"}, 0, 9); !errors.Is(err, fence.ErrStale) {
			t.Fatalf("Want 0, stale row: %v, want ErrStale", err)
		}
		// Two rows where one is expected: not a success (in the caller's
		// transaction, which rolls back).
		tx, err := d.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = upd(tx, "id IN ($2, $3)", []any{2, "w2", "w3"}, 0, 5)
		tx.Rollback()
		if err == nil {
			t.Fatal("Want 0 and two rows changed: success, want an error (0 means 1)")
		}
		if got := balances(); !slices.Equal(got, []int{100, 100, 100}) {
			t.Fatalf("balances %v", got)
		}
		if err := upd(d.DB, "id = $2", []any{3, "w2"}, -1, 5); err == nil || errors.Is(err, fence.ErrStale) {
			t.Fatalf("Want -1: %v", err)
		}
		if err := upd(d.DB, "id = $2", []any{4, "w2"}, 0, 5); err != nil {
			t.Fatalf("Want 0, one fresh row: %v", err)
		}
		if got := balances(); !slices.Equal(got, []int{100, 4, 100}) {
			t.Fatalf("balances %v", got)
		}
	})
}

// TestUpdateSeveralRowsAllOrNothing: the single-statement form over several
// rows, outside a transaction, where a newer token holds one of them. It
// changed the others, committed them, and then reported ErrStale; now it
// changes none. Likewise when Where does not match exactly Want rows.
func TestUpdateSeveralRowsAllOrNothing(t *testing.T) {
	forEachDB(t, func(t *testing.T, d db) {
		ctx := context.Background()
		for id, tok := range map[string]uint64{"a": 12, "b": 10, "c": 10} {
			if _, err := d.Exec(d.q(`INSERT INTO accounts (id, balance, fence_token) VALUES ($1, 100, $2)`), id, fence.Encode(tok)); err != nil {
				t.Fatal(err)
			}
		}
		state := func() string {
			rows, err := d.Query(`SELECT id, balance, fence_token FROM accounts ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var b strings.Builder
			for rows.Next() {
				var id string
				var bal int
				var tok int64
				if err := rows.Scan(&id, &bal, &tok); err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&b, "%s=%d@%d ", id, bal, fence.Decode(tok))
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			return b.String()
		}
		upd := func(ex fence.Execer, where string, args []any, want int64, token uint64) error {
			u := fence.Update{Dialect: d.d, Table: "accounts", Set: d.q("balance = balance - $1"), Where: d.q(where), Args: args, Want: want}
			_, err := u.Exec(ctx, ex, token)
			return err
		}
		const start = "a=100@12 b=100@10 c=100@10 "
		for _, c := range []struct {
			name  string
			where string
			args  []any
			want  int64
		}{
			{"a newer token on one row", "id IN ($2, $3)", []any{5, "a", "b"}, 2},
			{"Where matches more rows than Want", "id IN ($2, $3)", []any{5, "b", "c"}, 1},
			{"Where matches fewer rows than Want", "id IN ($2, $3)", []any{5, "b", "zz"}, 2},
		} {
			if err := upd(d.DB, c.where, c.args, c.want, 11); !errors.Is(err, fence.ErrStale) {
				t.Fatalf("%s: %v, want ErrStale", c.name, err)
			}
			if got := state(); got != start {
				t.Fatalf("%s: rows %q after ErrStale, want %q (unchanged)", c.name, got, start)
			}
		}
		if err := upd(d.DB, "id IN ($2, $3)", []any{5, "b", "c"}, 2, 11); err != nil {
			t.Fatal(err)
		}
		if got, want := state(), "a=100@12 b=95@11 c=95@11 "; got != want {
			t.Fatalf("rows %q, want %q", got, want)
		}
		// Placeholders SQLite counts to pass Where's arguments twice: a ? in
		// a string or comment is none, a numbered one is refused.
		if d.d == fence.SQLite {
			u := fence.Update{Dialect: d.d, Table: "accounts", Set: "balance = balance - ? /* ? */, id = id || '?'''", Where: "id = ? -- ?\n", Args: []any{1, "zz"}}
			if _, err := u.Exec(ctx, d.DB, 11); !errors.Is(err, fence.ErrStale) {
				t.Fatalf("quoted ?: %v, want ErrStale (no row zz)", err)
			}
			u = fence.Update{Dialect: d.d, Table: "accounts", Set: "balance = ?1", Where: "id = ?2", Args: []any{1, "b"}}
			if _, err := u.Exec(ctx, d.DB, 11); err == nil || errors.Is(err, fence.ErrStale) {
				t.Fatalf("numbered placeholders: %v, want a refusal", err)
			}
		}
	})
}

// TestUpdateWaitsForNewerHolder: a newer holder has written one of the rows
// in an open transaction; the stale holder's update of both rows waits for
// it and, once it commits, changes neither (in PostgreSQL, FOR UPDATE reads
// the committed token; a plain check would have read the old one and
// changed the other row).
func TestUpdateWaitsForNewerHolder(t *testing.T) {
	forEachDB(t, func(t *testing.T, d db) {
		ctx := context.Background()
		for _, id := range []string{"a", "b"} {
			if _, err := d.Exec(d.q(`INSERT INTO accounts (id, balance, fence_token) VALUES ($1, 100, $2)`), id, fence.Encode(10)); err != nil {
				t.Fatal(err)
			}
		}
		newer, err := d.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer newer.Rollback()
		u := fence.Update{Dialect: d.d, Table: "accounts", Set: d.q("balance = $1"), Where: d.q("id = $2"), Args: []any{50, "a"}}
		if _, err := u.Exec(ctx, newer, 12); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			u := fence.Update{Dialect: d.d, Table: "accounts", Set: d.q("balance = $1"), Where: d.q("id IN ($2, $3)"), Args: []any{0, "a", "b"}, Want: 2}
			_, err := u.Exec(ctx, d.DB, 11)
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("the stale update finished while the newer transaction was open: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := newer.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, fence.ErrStale) {
			t.Fatalf("stale update: %v, want ErrStale", err)
		}
		var b int
		if err := d.QueryRow(d.q(`SELECT balance FROM accounts WHERE id = $1`), "b").Scan(&b); err != nil || b != 100 {
			t.Fatalf("row b: balance %d (%v), want 100: the stale holder wrote it", b, err)
		}
	})
}

// TestUpdateRepeatableRead: at REPEATABLE READ, the single-statement form
// that meets a row a newer holder committed after its snapshot fails with
// 40001 (FENCING.md), having written nothing.
func TestUpdateRepeatableRead(t *testing.T) {
	d := openPostgres(t)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if _, err := d.Exec(`INSERT INTO accounts (id, balance, fence_token) VALUES ($1, 100, $2)`, id, fence.Encode(10)); err != nil {
			t.Fatal(err)
		}
	}
	newer, err := d.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Rollback()
	u := fence.Update{Dialect: fence.Postgres, Table: "accounts", Set: "balance = $1", Where: "id = $2", Args: []any{50, "a"}}
	if _, err := u.Exec(ctx, newer, 12); err != nil {
		t.Fatal(err)
	}
	stale, err := d.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Rollback()
	if _, err := stale.ExecContext(ctx, `SELECT 1`); err != nil { // the snapshot
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		u := fence.Update{Dialect: fence.Postgres, Table: "accounts", Set: "balance = $1", Where: "id IN ($2, $3)", Args: []any{0, "a", "b"}, Want: 2}
		_, err := u.Exec(ctx, stale, 11)
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if err := newer.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !fence.Retryable(err) {
		t.Fatalf("stale update at REPEATABLE READ: %v, want SQLSTATE 40001", err)
	}
	stale.Rollback()
	var b int
	if err := d.QueryRow(`SELECT balance FROM accounts WHERE id = 'b'`).Scan(&b); err != nil || b != 100 {
		t.Fatalf("row b: balance %d (%v), want 100", b, err)
	}
}

// TestRetrySerializationFailure: at SERIALIZABLE, holders that wait on the
// fence row while another transaction writes it get SQLSTATE 40001 when it
// commits, the legitimate newer holder included. With Retries the helpers
// run the transaction again with the same token: the newer holder writes,
// the stale one still gets ErrStale.
func TestRetrySerializationFailure(t *testing.T) {
	d := openPostgres(t)
	ctx := context.Background()
	ser := &sql.TxOptions{Isolation: sql.LevelSerializable}
	// run writes a ledger row under token in a Do at SERIALIZABLE, while a
	// transaction under token 11 holds the fence row until release.
	type result struct {
		err   error
		wrote bool
	}
	race := func(key string, retries int, tokens ...uint64) []result {
		t.Helper()
		if err, _ := advance(t, d, key, 10, key+"-first"); err != nil {
			t.Fatal(err)
		}
		hold, err := d.BeginTx(ctx, ser)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.f.Advance(ctx, hold, "test", key, 11); err != nil {
			t.Fatal(err)
		}
		var holdPID int
		if err := hold.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&holdPID); err != nil {
			t.Fatal(err)
		}
		f := d.f
		f.Retries = retries
		out := make([]result, len(tokens))
		done := make(chan struct{})
		for i, tok := range tokens {
			go func() {
				defer func() { done <- struct{}{} }()
				note := fmt.Sprintf("%s-%d", key, tok)
				out[i].err = f.Do(ctx, d.DB, ser, "test", key, tok, func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO ledger (id, note) VALUES ($1, $2)`, note, key)
					return err
				})
				var n int
				if err := d.QueryRow(`SELECT count(*) FROM ledger WHERE id = $1`, note).Scan(&n); err != nil {
					out[i].err = err
				}
				out[i].wrote = n == 1
			}()
		}
		// The 40001 needs each writer's snapshot taken before hold commits:
		// wait until all of them wait on hold's row lock.
		for deadline := time.Now().Add(20 * time.Second); ; {
			var waiting int
			if err := d.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, holdPID).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if waiting == len(tokens) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d writers wait on the fence row", waiting, len(tokens))
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := hold.Commit(); err != nil {
			t.Fatal(err)
		}
		for range tokens {
			<-done
		}
		return out
	}
	// Without retries the newer holder (12) fails with 40001, as documented.
	if r := race("k0", 0, 12); !fence.Retryable(r[0].err) || errors.Is(r[0].err, fence.ErrStale) || r[0].wrote {
		t.Fatalf("no retry: %v (wrote %v), want a serialization failure", r[0].err, r[0].wrote)
	}
	// With retries: two concurrent writers, the newer one writes, the
	// stale one (10, below the holder's 11) is rejected.
	r := race("k1", 3, 12, 10)
	if r[0].err != nil || !r[0].wrote {
		t.Fatalf("newer holder with retries: %v (wrote %v)", r[0].err, r[0].wrote)
	}
	if !errors.Is(r[1].err, fence.ErrStale) || r[1].wrote {
		t.Fatalf("stale holder with retries: %v (wrote %v), want ErrStale", r[1].err, r[1].wrote)
	}
	if hw, err := d.f.HighWater(ctx, d.DB, "test", "k1"); err != nil || hw != 12 {
		t.Fatalf("high-water %d, %v", hw, err)
	}
	if fence.Retryable(errors.New("40001")) || fence.Retryable(fence.ErrStale) {
		t.Fatal("Retryable of errors without a SQLSTATE")
	}
}

// TestTimeoutsFreeTheNextHolder pins FENCING.md's timeout settings, in the
// pgx DSN form it shows: a stale holder that stalls inside its transaction
// holds the fence row; idle_in_transaction_session_timeout ends its session
// so that the next holder goes on, and lock_timeout bounds the next
// holder's wait (SQLSTATE 55P03) when nothing ends it.
func TestTimeoutsFreeTheNextHolder(t *testing.T) {
	d := openPostgres(t)
	ctx := context.Background()
	var schema string
	if err := d.QueryRow(`SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	open := func(params string) *sql.DB {
		t.Helper()
		db, err := sql.Open("pgx", os.Getenv("TICKETING_TEST_PG_DSN")+"&search_path="+schema+params)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	stall := func(db *sql.DB, key string) *sql.Tx {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.f.Advance(ctx, tx, "test", key, 10); err != nil {
			t.Fatal(err)
		}
		return tx // and then nothing: the holder stalled
	}
	next := func(db *sql.DB, key string) error {
		return d.f.Do(ctx, db, nil, "test", key, 11, func(*sql.Tx) error { return nil })
	}

	stalled := stall(open("&idle_in_transaction_session_timeout=500ms"), "idle")
	start := time.Now()
	if err := next(d.DB, "idle"); err != nil {
		t.Fatalf("next holder after the stalled session ended: %v", err)
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("the next holder did not wait for the stalled one (%v)", el)
	}
	if err := stalled.Commit(); err == nil {
		t.Fatal("the stalled holder committed after its session was ended")
	}
	if hw, err := d.f.HighWater(ctx, d.DB, "test", "idle"); err != nil || hw != 11 {
		t.Fatalf("high-water %d, %v", hw, err)
	}

	stalled = stall(d.DB, "lock")
	defer stalled.Rollback()
	err := next(open("&lock_timeout=300ms"), "lock")
	var pe interface{ SQLState() string }
	if !errors.As(err, &pe) || pe.SQLState() != "55P03" || fence.Retryable(err) {
		t.Fatalf("next holder behind a stalled one with lock_timeout: %v, want SQLSTATE 55P03", err)
	}
}

// countless is a database/sql connector whose results report -1 rows
// affected, as a driver may that does not know the count.
type countless struct {
	drv driver.Driver
	dsn string
}

func (c countless) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return countlessConn{conn}, nil
}

func (c countless) Driver() driver.Driver { return c.drv }

type countlessConn struct{ driver.Conn }

func (c countlessConn) Prepare(q string) (driver.Stmt, error) {
	s, err := c.Conn.Prepare(q)
	if err != nil {
		return nil, err
	}
	return countlessStmt{s}, nil
}

type countlessStmt struct{ driver.Stmt }

func (s countlessStmt) Exec(args []driver.Value) (driver.Result, error) {
	//lint:ignore SA1019 the wrapper hides the context forms, so database/sql calls this one
	r, err := s.Stmt.Exec(args)
	if err != nil {
		return nil, err
	}
	return countlessResult{r}, nil
}

type countlessResult struct{ driver.Result }

func (countlessResult) RowsAffected() (int64, error) { return -1, nil }

// TestNoRowCount: a driver that reports no row count (-1) cannot tell a
// stale token from a write; the helpers stop with ErrRowCount and Do
// rolls back, as Python (rowcount -1) and Node.js (no rowCount) do.
func TestNoRowCount(t *testing.T) {
	d := openSQLite(t)
	ctx := context.Background()
	if err, _ := advance(t, d, "k", 10, "first"); err != nil {
		t.Fatal(err)
	}
	var file string
	if err := d.QueryRow(`SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file); err != nil {
		t.Fatal(err)
	}
	blind := sql.OpenDB(countless{drv: d.Driver(), dsn: sqliteDSN(file)})
	defer blind.Close()
	err := d.f.Do(ctx, blind, nil, "test", "k", 9, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO ledger (id, note) VALUES (?, ?)`, "stale", "k")
		return err
	})
	var n int
	if qerr := d.QueryRow(`SELECT count(*) FROM ledger WHERE id = 'stale'`).Scan(&n); qerr != nil {
		t.Fatal(qerr)
	}
	if n != 0 {
		t.Fatalf("a stale token's write committed through a driver without row counts (err %v)", err)
	}
	if !errors.Is(err, fence.ErrRowCount) {
		t.Fatalf("Do: %v, want ErrRowCount", err)
	}
	if _, err := d.Exec(`INSERT INTO accounts (id, balance, fence_token) VALUES ('rc', 100, ?)`, fence.Encode(10)); err != nil {
		t.Fatal(err)
	}
	u := fence.Update{Dialect: fence.SQLite, Table: "accounts", Set: "balance = ?", Where: "id = ?", Args: []any{1, "rc"}}
	if _, err := u.Exec(ctx, blind, 9); !errors.Is(err, fence.ErrRowCount) {
		t.Fatalf("Update: %v, want ErrRowCount", err)
	}
}

// Permits: one fencing domain per slot. A stale holder of slot 0 is
// refused once a newer token wrote slot 0, while the holder of slot 1,
// whose token is older than that newer one, is not affected: tokens of a
// semaphore increase per slot, so slots fenced under the bare key would
// refuse it wrongly.
func TestDoPermitOneDomainPerSlot(t *testing.T) {
	forEachDB(t, func(t *testing.T, d db) {
		ctx := context.Background()
		const key = "checkout"
		ok := func(slot int, token uint64) error {
			return d.f.DoPermit(ctx, d.DB, nil, "test", key, slot, token, func(*sql.Tx) error { return nil })
		}
		// Slot 0 held by token 10, slot 1 by token 11.
		if err := ok(0, 10); err != nil {
			t.Fatal(err)
		}
		if err := ok(1, 11); err != nil {
			t.Fatal(err)
		}
		// Token 10 lost slot 0 (its lease ran out); token 12 took slot 0 and wrote.
		if err := ok(0, 12); err != nil {
			t.Fatal(err)
		}
		// The stale holder of slot 0 is refused, with nothing written.
		ran := false
		err := d.f.DoPermit(ctx, d.DB, nil, "test", key, 0, 10, func(*sql.Tx) error { ran = true; return nil })
		if !errors.Is(err, fence.ErrStale) || ran {
			t.Fatalf("stale holder of slot 0: %v (fn ran %v), want ErrStale", err, ran)
		}
		// The holder of slot 1 (token 11 < 12) still writes.
		if err := ok(1, 11); err != nil {
			t.Fatalf("holder of slot 1 after slot 0 moved on: %v", err)
		}
		for slot, want := range []uint64{12, 11} {
			hw, err := d.f.HighWater(ctx, d.DB, "test", ticketing.PermitFenceKey(key, slot))
			if err != nil || hw != want {
				t.Fatalf("high-water of %q: %d, %v; want %d", ticketing.PermitFenceKey(key, slot), hw, err, want)
			}
		}
		if hw, err := d.f.HighWater(ctx, d.DB, "test", key); err != nil || hw != 0 {
			t.Fatalf("high-water of the bare key: %d, %v; want none", hw, err)
		}
		if err := ok(-1, 13); err == nil {
			t.Fatal("slot -1 accepted")
		}
	})
}
