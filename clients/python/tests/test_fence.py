"""ticketing.fence against real databases: sqlite3 always; PostgreSQL through
psycopg (3) or psycopg2 when one is importable and $TICKETING_TEST_PG_DSN is
set (`make test` starts a server and runs this file with a Python that has
Debian's python3-psycopg when it is installed; the same SQL is also covered on
PostgreSQL by the Go and Node.js fence tests)."""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
import unittest
import uuid

import ticketing
from ticketing import fence

MAX = 2**64 - 1
PG_DSN = os.environ.get("TICKETING_TEST_PG_DSN", "")

try:  # pragma: no cover - depends on the machine
    import psycopg as _pg  # type: ignore

    _PG_DRIVER = "psycopg"
except ImportError:  # pragma: no cover
    try:
        import psycopg2 as _pg  # type: ignore

        _PG_DRIVER = "psycopg2"
    except ImportError:
        _pg = None
        _PG_DRIVER = ""

SQLITE_SCHEMA = os.path.join(os.path.dirname(__file__), "..", "..", "schema", "fence.sqlite.sql")
PG_SCHEMA = os.path.join(os.path.dirname(__file__), "..", "..", "schema", "fence.postgres.sql")


class _Countless:
    """A connection whose cursors report ``rowcount`` -1, as DB-API allows a
    driver that cannot tell the rows a statement changed."""

    def __init__(self, conn):
        self._conn = conn

    def cursor(self):
        return _CountlessCursor(self._conn.cursor())

    def __getattr__(self, name):
        return getattr(self._conn, name)


class _CountlessCursor:
    rowcount = -1

    def __init__(self, cur):
        self._cur = cur

    def __getattr__(self, name):
        return getattr(self._cur, name)


class Base:
    """Tests shared by both databases. Subclasses provide connect() and q()."""

    #: How fenced() must open a transaction on a wrapped connection, whose
    #: driver it cannot recognise.
    begin = None

    def connect(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def q(self, sql: str) -> str:
        return sql

    def write(self, conn, key: str, token: int, note: str) -> bool:
        """Fenced transaction that inserts a ledger row; True if it committed."""
        try:
            with fence.fenced(conn, "test", key, token) as cur:
                cur.execute(self.q("INSERT INTO ledger (id, note) VALUES (?, ?)"), (note, key))
            return True
        except fence.StaleTokenError:
            return False

    def ledger_has(self, conn, note: str) -> bool:
        cur = conn.cursor()
        cur.execute(self.q("SELECT count(*) FROM ledger WHERE id = ?"), (note,))
        n = cur.fetchone()[0]
        self.end_read(conn)
        return n == 1

    def end_read(self, conn) -> None:
        """Ends the transaction a driver opened implicitly for a read."""

    def test_advance_sequence(self):
        conn = self.connect()
        steps = [
            (5, True), (7, True), (7, True), (6, False), (1, False),
            (2**63 - 1, True), (2**63, True), (2**63 - 1, False),
            (MAX - 1, True), (MAX, True), (MAX - 1, False), (2**63, False),
        ]
        for i, (token, ok) in enumerate(steps):
            note = f"n{i}"
            self.assertEqual(self.write(conn, "seats/42", token, note), ok, f"step {i} token {token}")
            self.assertEqual(self.ledger_has(conn, note), ok, f"step {i}: ledger")
        cur = conn.cursor()
        self.assertEqual(fence.Fence.for_connection(conn).high_water(cur, "test", "seats/42"), MAX)
        self.assertEqual(fence.Fence.for_connection(conn).high_water(cur, "test", "nothing"), 0)
        self.end_read(conn)
        # Other keys and domains are independent.
        self.assertTrue(self.write(conn, "seats/43", 1, "other"))

    def test_permits_one_domain_per_slot(self):
        # Slot 0 held by token 10, slot 1 by 11; 12 takes slot 0 and writes:
        # the stale holder of slot 0 is refused, the holder of slot 1
        # (11 < 12) is not, since each slot is its own fencing domain.
        conn = self.connect()

        def write(permit, note, **kw) -> bool:
            try:
                with fence.fenced_permit(conn, "test", permit, **kw) as cur:
                    cur.execute(self.q("INSERT INTO ledger (id, note) VALUES (?, ?)"), (note, "p"))
                return True
            except fence.StaleTokenError:
                return False

        self.assertTrue(write(ticketing.Permit("checkout", 10, 0), "p0"))
        self.assertTrue(write(ticketing.Permit("checkout", 11, 1), "p1"))
        self.assertTrue(write("checkout", "p2", token=12, slot=0))
        self.assertFalse(write(ticketing.Permit("checkout", 10, 0), "p3"))
        self.assertFalse(self.ledger_has(conn, "p3"))
        self.assertTrue(write(ticketing.Permit("checkout", 11, 1), "p4"))
        cur = conn.cursor()
        f = fence.Fence.for_connection(conn)
        self.assertEqual(f.high_water(cur, "test", "checkout 0"), 12)
        self.assertEqual(f.high_water(cur, "test", "checkout 1"), 11)
        self.assertEqual(f.high_water(cur, "test", "checkout"), 0)
        self.end_read(conn)
        with self.assertRaises(TypeError):
            fence.fenced_permit(conn, "test", "checkout", token=1)
        with self.assertRaises(ValueError):
            fence.fenced_permit(conn, "test", "checkout", token=1, slot=-1)

    def test_permit_and_lock_named_like_its_slot(self):
        # The lock key "checkout#0" and slot 0 of the semaphore "checkout"
        # are independent holdings, each with its own tokens: the lock's
        # newer token writing first must not refuse the live holder of the
        # slot (under "<key>#<slot>" they shared one fence row).
        conn = self.connect()
        self.assertTrue(self.write(conn, "checkout#0", 20, "lock"))
        with fence.fenced_permit(conn, "test", ticketing.Permit("checkout", 19, 0)) as cur:
            cur.execute(self.q("INSERT INTO ledger (id, note) VALUES (?, ?)"), ("slot0", "p"))
        self.assertTrue(self.ledger_has(conn, "slot0"))
        cur = conn.cursor()
        f = fence.Fence.for_connection(conn)
        self.assertEqual(f.high_water(cur, "test", "checkout#0"), 20)
        self.assertEqual(f.high_water(cur, "test", "checkout 0"), 19)
        self.end_read(conn)
        self.assertEqual(ticketing.fence_key("checkout", 0), "checkout 0")

    def test_exception_rolls_back_fence(self):
        conn = self.connect()
        with self.assertRaises(KeyError):
            with fence.fenced(conn, "test", "k", 9) as cur:
                cur.execute(self.q("INSERT INTO ledger (id, note) VALUES (?, ?)"), ("x", "k"))
                raise KeyError("boom")
        self.assertFalse(self.ledger_has(conn, "x"))
        cur = conn.cursor()
        self.assertEqual(fence.Fence.for_connection(conn).high_water(cur, "test", "k"), 0)
        self.end_read(conn)

    def test_stale_error_type(self):
        conn = self.connect()
        self.assertTrue(self.write(conn, "k", 10, "a"))
        with self.assertRaises(ticketing.StaleTokenError) as cm:
            with fence.fenced(conn, "test", "k", 9):
                self.fail("the block must not run for a stale token")
        self.assertIsInstance(cm.exception, ticketing.TicketingError)
        self.assertEqual(cm.exception.code, "stale_token")

    def test_concurrent_stale_waits_and_loses(self):
        newer_conn, stale_conn = self.connect(), self.connect()
        self.assertTrue(self.write(newer_conn, "k", 10, "first"))
        result = {}
        with fence.fenced(newer_conn, "test", "k", 12) as cur:

            def stale():
                result["ok"] = self.write(stale_conn, "k", 11, "stale")

            t = threading.Thread(target=stale)
            t.start()
            time.sleep(0.3)
            self.assertTrue(t.is_alive(), "the stale transaction must wait for the open newer one")
            cur.execute(self.q("INSERT INTO ledger (id, note) VALUES (?, ?)"), ("newer", "k"))
        t.join(15)
        self.assertFalse(result["ok"])
        self.assertTrue(self.ledger_has(newer_conn, "newer"))
        self.assertFalse(self.ledger_has(newer_conn, "stale"))

    def write_block(self, conn, keys, token: int, note: str) -> bool:
        """Fenced block transaction that inserts a ledger row; True if it committed."""
        try:
            with fence.fenced_block(conn, "test", keys, token) as cur:
                cur.execute(self.q("INSERT INTO ledger (id, note) VALUES (?, ?)"), (note, "block"))
            return True
        except fence.StaleTokenError:
            return False

    def marks(self, conn, *keys: str) -> list:
        cur = conn.cursor()
        f = fence.Fence.for_connection(conn)
        out = [f.high_water(cur, "test", k) for k in keys]
        self.end_read(conn)
        return out

    def test_block_all_or_nothing(self):
        conn = self.connect()
        self.assertTrue(self.write(conn, "seat/b", 10, "single"))
        seats = ["seat/c", "seat/a", "seat/b"]
        # Stale on the middle key (sorted): nothing advanced, nothing written.
        self.assertFalse(self.write_block(conn, seats, 9, "stale1"))
        self.assertFalse(self.ledger_has(conn, "stale1"))
        self.assertEqual(self.marks(conn, "seat/a", "seat/b", "seat/c"), [0, 10, 0])
        # Equal on one key, new on the others: all raised to the one token.
        self.assertTrue(self.write_block(conn, seats, 10, "ok1"))
        self.assertTrue(self.ledger_has(conn, "ok1"))
        self.assertEqual(self.marks(conn, "seat/a", "seat/b", "seat/c"), [10, 10, 10])
        # Repeats and order do not matter; across the sign boundary.
        self.assertTrue(self.write_block(conn, ("seat/c", "seat/a", "seat/c"), 2**63, "ok2"))
        # Stale on the first key only: seat/b stays at 10.
        self.assertFalse(self.write_block(conn, ["seat/b", "seat/a"], 2**63 - 1, "stale2"))
        self.assertEqual(self.marks(conn, "seat/a", "seat/b", "seat/c"), [2**63, 10, 2**63])
        # Single-key fencing beside blocks.
        self.assertTrue(self.write(conn, "seat/b", 11, "single2"))
        self.assertFalse(self.write(conn, "seat/a", 11, "single3"))
        with self.assertRaises(ticketing.StaleTokenError) as cm:
            with fence.fenced_block(conn, "test", ["seat/z", "seat/a"], 5):
                self.fail("the block must not run for a stale token")
        self.assertIn("seat/a", str(cm.exception))
        self.assertEqual(self.marks(conn, "seat/z"), [0])
        for keys, token, exc in (([], 5, ValueError), (["k"], 0, ValueError), ("seat/a", 5, TypeError)):
            with self.subTest(keys=keys, token=token), self.assertRaises(exc):
                with fence.fenced_block(conn, "test", keys, token):
                    self.fail("ran")

    def test_concurrent_stale_block_waits_and_loses(self):
        newer_conn, stale_conn = self.connect(), self.connect()
        self.assertTrue(self.write_block(newer_conn, ["x", "y"], 10, "first"))
        result = {}
        with fence.fenced_block(newer_conn, "test", ["x", "y"], 12) as cur:

            def stale():
                result["ok"] = self.write_block(stale_conn, ["y", "x"], 11, "stale")

            t = threading.Thread(target=stale)
            t.start()
            time.sleep(0.3)
            self.assertTrue(t.is_alive(), "the stale transaction must wait for the open newer one")
            cur.execute(self.q("INSERT INTO ledger (id, note) VALUES (?, ?)"), ("newer", "xy"))
        t.join(15)
        self.assertFalse(result["ok"])
        self.assertTrue(self.ledger_has(newer_conn, "newer"))
        self.assertFalse(self.ledger_has(newer_conn, "stale"))
        self.assertEqual(self.marks(newer_conn, "x", "y"), [12, 12])

    def test_no_rowcount_refused(self):
        # rowcount -1 read as "not 0" let a stale token's write commit.
        conn = self.connect()
        self.assertTrue(self.write(conn, "k-rc", 10, "rc-first"))
        f = fence.Fence.for_connection(conn)
        blind = _Countless(conn)
        with self.assertRaises(fence.RowCountError) as cm:
            with fence.fenced(blind, "test", "k-rc", 9, paramstyle=f.paramstyle, begin=self.begin) as cur:
                cur.execute(self.q("INSERT INTO ledger (id, note) VALUES (?, ?)"), ("rc-stale", "k-rc"))
        self.assertEqual(cm.exception.code, "row_count")
        self.assertFalse(self.ledger_has(conn, "rc-stale"), "the stale write committed")
        with self.assertRaises(fence.RowCountError):
            with fence.fenced_block(blind, "test", ["k-rc", "k-rc2"], 9, paramstyle=f.paramstyle, begin=self.begin) as cur:
                cur.execute(self.q("INSERT INTO ledger (id, note) VALUES (?, ?)"), ("rc-bstale", "k-rc"))
        self.assertFalse(self.ledger_has(conn, "rc-bstale"), "the stale block write committed")
        self.assertEqual(self.marks(conn, "k-rc", "k-rc2"), [10, 0])
        cur = conn.cursor()
        cur.execute(self.q("INSERT INTO accounts (id, balance, fence_token) VALUES (?, 100, ?)"), ("rc", fence.encode_token(10)))
        conn.commit()
        p = "?" if f.paramstyle == "qmark" else "%s"
        with self.assertRaises(fence.RowCountError):
            f.update(blind.cursor(), "accounts", f"balance = {p}", f"id = {p}", (1, "rc"), 9)
        conn.rollback()

    def test_update_single_statement(self):
        conn = self.connect()
        cur = conn.cursor()
        cur.execute(self.q("INSERT INTO accounts (id, balance) VALUES (?, 100)"), ("alice",))
        conn.commit()
        f = fence.Fence.for_connection(conn)
        p = "?" if f.paramstyle == "qmark" else "%s"

        def set_balance(balance: int, token: int) -> bool:
            try:
                f.update(cur, "accounts", f"balance = {p}", f"id = {p}", (balance, "alice"), token)
                conn.commit()
                return True
            except fence.StaleTokenError:
                conn.rollback()
                return False

        def balance() -> int:
            cur.execute(self.q("SELECT balance FROM accounts WHERE id = ?"), ("alice",))
            b = cur.fetchone()[0]
            self.end_read(conn)
            return b

        for value, token, ok in [
            (90, 3, True), (80, 3, True), (70, 2, False),
            (60, 2**63, True), (50, 2**63 - 1, False),
            (40, MAX, True), (30, MAX - 1, False),
        ]:
            before = balance()
            self.assertEqual(set_balance(value, token), ok, f"token {token}")
            self.assertEqual(balance(), value if ok else before)
        with self.assertRaises(fence.StaleTokenError):
            f.update(cur, "accounts", f"balance = {p}", f"id = {p}", (1, "bob"), 5)
        conn.rollback()


    def test_update_want_zero_means_one(self):
        # want=0 was "no stale check"; it is the one-row case, as Want 0 in
        # Go and want: 0 in Node.js.
        conn = self.connect()
        cur = conn.cursor()
        for id_, tok in (("w1", 10), ("w2", 1), ("w3", 1)):
            cur.execute(
                self.q("INSERT INTO accounts (id, balance, fence_token) VALUES (?, 100, ?)"),
                (id_, fence.encode_token(tok)),
            )
        conn.commit()
        f = fence.Fence.for_connection(conn)
        p = "?" if f.paramstyle == "qmark" else "%s"

        def balances():
            cur.execute(self.q("SELECT id, balance FROM accounts WHERE id LIKE 'w%' ORDER BY id"))
            out = [b for _, b in cur.fetchall()]
            self.end_read(conn)
            return out

        with self.assertRaises(fence.StaleTokenError):
            f.update(cur, "accounts", f"balance = {p}", f"id = {p}", (1, "w1"), 9, want=0)
        conn.rollback()
        self.assertEqual(balances(), [100, 100, 100])
        # Two rows where one is expected: not a success (in a transaction,
        # rolled back).
        if self.begin:
            cur.execute(self.begin)
        with self.assertRaises(ticketing.TicketingError):
            f.update(cur, "accounts", f"balance = {p}", f"id IN ({p}, {p})", (2, "w2", "w3"), 5, want=0)
        conn.rollback()
        self.assertEqual(balances(), [100, 100, 100])
        with self.assertRaises(ValueError):
            f.update(cur, "accounts", f"balance = {p}", f"id = {p}", (3, "w2"), 5, want=-1)
        self.assertEqual(f.update(cur, "accounts", f"balance = {p}", f"id = {p}", (4, "w2"), 5, want=0), 1)
        conn.commit()
        self.assertEqual(balances(), [100, 4, 100])


    def autocommit(self, conn):
        """conn with every statement in a transaction of its own."""
        return conn

    def accounts(self, conn) -> str:
        cur = conn.cursor()
        cur.execute("SELECT id, balance, fence_token FROM accounts ORDER BY id")
        out = " ".join(f"{i}={b}@{fence.decode_token(t)}" for i, b, t in cur.fetchall())
        self.end_read(conn)
        return out

    def test_update_several_rows_all_or_nothing(self):
        # Outside a transaction, a newer token on one of the rows: the form
        # changed (and committed) the others, then raised; now it changes none.
        conn = self.autocommit(self.connect())
        cur = conn.cursor()
        for id_, tok in (("a", 12), ("b", 10), ("c", 10)):
            cur.execute(
                self.q("INSERT INTO accounts (id, balance, fence_token) VALUES (?, 100, ?)"),
                (id_, fence.encode_token(tok)),
            )
        f = fence.Fence.for_connection(conn)
        p = "?" if f.paramstyle == "qmark" else "%s"
        start = "a=100@12 b=100@10 c=100@10"
        for name, params, want in (
            ("a newer token on one row", (5, "a", "b"), 2),
            ("the WHERE matches more rows than want", (5, "b", "c"), 1),
            ("the WHERE matches fewer rows than want", (5, "b", "zz"), 2),
        ):
            with self.subTest(name):
                with self.assertRaises(fence.StaleTokenError):
                    f.update(cur, "accounts", f"balance = balance - {p}", f"id IN ({p}, {p})", params, 11, want=want)
                self.assertEqual(self.accounts(conn), start)
        self.assertEqual(f.update(cur, "accounts", f"balance = balance - {p}", f"id IN ({p}, {p})", (5, "b", "c"), 11, want=2), 2)
        self.assertEqual(self.accounts(conn), "a=100@12 b=95@11 c=95@11")
        if f.paramstyle == "qmark":
            # A ? in a string or comment is no placeholder; numbered ones are refused.
            with self.assertRaises(fence.StaleTokenError):
                f.update(cur, "accounts", "balance = balance - ? /* ? */, id = id || '?'''", "id = ? -- ?\n", (1, "zz"), 11)
            with self.assertRaises(ValueError):
                f.update(cur, "accounts", "balance = ?1", "id = ?2", (1, "b"), 11)
        else:
            with self.assertRaises(fence.StaleTokenError):
                f.update(cur, "accounts", "balance = balance - %s, id = id || '%%'", "id = %s", (1, "zz"), 11)
            with self.assertRaises(ValueError):
                f.update(cur, "accounts", "balance = %(b)s", "id = %s", (1, "b"), 11)
        with self.assertRaises(ValueError):
            f.update(cur, "accounts", f"balance = {p}", f"id = {p}", (1,), 11)

    def test_update_waits_for_newer_holder(self):
        # A newer holder wrote one of the rows in an open transaction: the
        # stale update of both waits, then changes neither.
        newer, stale = self.connect(), self.autocommit(self.connect())
        cur = newer.cursor()
        for id_ in ("a", "b"):
            cur.execute(
                self.q("INSERT INTO accounts (id, balance, fence_token) VALUES (?, 100, ?)"),
                (id_, fence.encode_token(10)),
            )
        newer.commit()
        f = fence.Fence.for_connection(newer)
        p = "?" if f.paramstyle == "qmark" else "%s"
        if self.begin:
            cur.execute(self.begin)
        f.update(cur, "accounts", f"balance = {p}", f"id = {p}", (50, "a"), 12)
        result = {}

        def run():
            try:
                f.update(stale.cursor(), "accounts", f"balance = {p}", f"id IN ({p}, {p})", (0, "a", "b"), 11, want=2)
                result["err"] = None
            except Exception as e:  # reported below
                result["err"] = e

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        self.assertTrue(t.is_alive(), "the stale update must wait for the open newer transaction")
        if self.begin:
            cur.execute("COMMIT")
        else:
            newer.commit()
        t.join(15)
        self.assertIsInstance(result["err"], fence.StaleTokenError)
        self.assertEqual(self.accounts(newer), "a=50@12 b=100@10")


class SQLiteFenceTest(Base, unittest.TestCase):
    begin = "BEGIN IMMEDIATE"
    journal_mode = "WAL"

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.path = os.path.join(self.dir.name, "fence.db")
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute(f"PRAGMA journal_mode={self.journal_mode}")
        with open(SQLITE_SCHEMA) as fh:
            conn.executescript(fh.read())
        conn.execute(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, "
            "fence_token INTEGER NOT NULL DEFAULT -9223372036854775808)"
        )
        conn.execute("CREATE TABLE ledger (id TEXT PRIMARY KEY, note TEXT)")
        conn.close()

    def connect(self):
        # Autocommit mode: fenced() opens the transaction with BEGIN IMMEDIATE.
        conn = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
        self.addCleanup(conn.close)
        return conn

    def test_legacy_transaction_mode(self):
        # The default isolation_level ("") opens a transaction implicitly at
        # the upsert; fenced() commits or rolls back through the connection.
        conn = sqlite3.connect(self.path, timeout=10)
        self.addCleanup(conn.close)
        self.assertTrue(self.write(conn, "legacy", 5, "l1"))
        self.assertFalse(self.write(conn, "legacy", 4, "l2"))
        self.assertTrue(self.ledger_has(conn, "l1"))
        self.assertFalse(self.ledger_has(conn, "l2"))

    def test_encoding(self):
        vals = [0, 1, 2**53 + 1, 2**63 - 1, 2**63, 2**63 + 1, MAX - 1, MAX]
        enc = [fence.encode_token(v) for v in vals]
        self.assertEqual(enc, sorted(enc))
        self.assertEqual([fence.decode_token(e) for e in enc], vals)
        self.assertEqual(fence.encode_token(0), fence.ZERO)
        self.assertTrue(all(-(2**63) <= e < 2**63 for e in enc))
        for bad in (-1, MAX + 1):
            with self.assertRaises(ValueError):
                fence.encode_token(bad)
        with self.assertRaises(TypeError):
            fence.encode_token("5")  # type: ignore[arg-type]


class SQLiteRollbackJournalFenceTest(SQLiteFenceTest):
    """The same tests with SQLite's rollback journal instead of WAL."""

    journal_mode = "DELETE"


@unittest.skipUnless(PG_DSN, "TICKETING_TEST_PG_DSN is not set (make test starts PostgreSQL with .ci/postgres.sh)")
@unittest.skipUnless(
    _pg is not None,
    "no PostgreSQL driver (psycopg/psycopg2) importable by this Python; the same SQL is tested "
    "on PostgreSQL by the Go (clients/go/fence) and Node.js (clients/node/fence-test) suites",
)
class PostgresFenceTest(Base, unittest.TestCase):  # pragma: no cover - depends on the machine
    def setUp(self):
        self.schema = "fence_py_" + uuid.uuid4().hex[:12]
        admin = _pg.connect(PG_DSN)
        admin.autocommit = True
        cur = admin.cursor()
        cur.execute(f"CREATE SCHEMA {self.schema}")
        cur.execute(f"SET search_path TO {self.schema}")
        with open(PG_SCHEMA) as fh:
            cur.execute(fh.read())
        cur.execute(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, "
            "fence_token BIGINT NOT NULL DEFAULT -9223372036854775808)"
        )
        cur.execute("CREATE TABLE ledger (id TEXT PRIMARY KEY, note TEXT)")
        self.admin = admin
        self.addCleanup(self._drop)

    def _drop(self):
        self.admin.cursor().execute(f"DROP SCHEMA {self.schema} CASCADE")
        self.admin.close()

    def connect(self):
        conn = _pg.connect(PG_DSN, options=f"-c search_path={self.schema}")
        self.addCleanup(conn.close)
        return conn

    def q(self, sql: str) -> str:
        return sql.replace("?", "%s")

    def end_read(self, conn) -> None:
        conn.rollback()

    def autocommit(self, conn):
        conn.autocommit = True
        return conn

    def test_retry_serialization_failure(self):
        # At SERIALIZABLE, writers that wait on the fence row while another
        # transaction writes it get 40001 when it commits, the legitimate
        # newer holder included; with retries it writes on a retry with the
        # same token, and the stale one still gets StaleTokenError.
        def race(key, retries, tokens):
            setup = self.connect()
            self.assertTrue(self.write(setup, key, 10, f"{key}-first"))
            setup.isolation_level = _pg.IsolationLevel.SERIALIZABLE
            hold = setup.cursor()
            fence.Fence.for_connection(setup).advance(hold, "test", key, 11)
            hold.execute("SELECT pg_backend_pid()")
            hold_pid = hold.fetchone()[0]
            watch = self.autocommit(self.connect())
            out = [None] * len(tokens)

            def run(i, token):
                conn = self.connect()
                conn.isolation_level = _pg.IsolationLevel.SERIALIZABLE

                def insert(cur):
                    cur.execute("INSERT INTO ledger (id, note) VALUES (%s, %s)", (f"{key}-{token}", key))

                try:
                    fence.run_fenced(conn, "test", key, token, insert, retries=retries)
                    out[i] = None
                except Exception as e:  # reported below
                    out[i] = e

            threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(tokens)]
            for t in threads:
                t.start()
            # The 40001 needs each writer's snapshot taken before setup
            # commits: wait until all of them wait on its row lock.
            deadline = time.monotonic() + 20
            while True:
                cur = watch.cursor()
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (hold_pid,))
                waiting = cur.fetchone()[0]
                if waiting == len(tokens):
                    break
                self.assertLess(time.monotonic(), deadline, f"{waiting} of {len(tokens)} writers wait on the fence row")
                time.sleep(0.01)
            setup.commit()
            for t in threads:
                t.join(15)
            return [(out[i], self.ledger_has(setup, f"{key}-{t}")) for i, t in enumerate(tokens)]

        ((err, wrote),) = race("ser0", 0, [12])
        self.assertTrue(fence.is_retryable(err), f"no retry: {err!r}, want a serialization failure")
        self.assertFalse(wrote)
        (newer_err, newer_wrote), (stale_err, stale_wrote) = race("ser1", 3, [12, 10])
        self.assertIsNone(newer_err)
        self.assertTrue(newer_wrote)
        self.assertIsInstance(stale_err, fence.StaleTokenError)
        self.assertFalse(stale_wrote)
        self.assertEqual(self.marks(self.connect(), "ser1"), [12])
        self.assertFalse(fence.is_retryable(fence.StaleTokenError("x")))


if __name__ == "__main__":
    unittest.main()
