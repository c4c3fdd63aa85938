"""Fencing tokens in a SQL database (DB-API 2.0: sqlite3, psycopg, ...).

A lock orders the work; it cannot stop a holder that stalled past its lease
(GC pause, SIGSTOP, overload) from writing afterwards. Only the store can:
every write carries the token of its grant, and the store refuses a token
lower than the highest it already accepted for the key, *in the same
transaction* as the write::

    import sqlite3, ticketing
    from ticketing import fence

    conn = sqlite3.connect("shop.db", timeout=10, isolation_level=None)
    client = ticketing.Client()
    with client.lock("event/42", lease=30, wait=5) as token:
        try:
            with fence.fenced(conn, client, "event/42", token) as cur:
                # the fence row is now ours: read and write what the token protects
                cur.execute("UPDATE seats SET buyer = ? WHERE seat = ?", ("bob", 7))
        except fence.StaleTokenError:
            ...  # the lease ran out and a newer holder wrote: nothing was written

:func:`fenced` opens a transaction, raises the per-key high-water mark in the
fencing table (``clients/schema/fence.*.sql``) to ``token`` as its first
statement, yields a cursor, and commits when the block ends; a stale token
raises :class:`StaleTokenError` before the block runs, and any exception
rolls everything back. Updating the fence row in a transaction of its own
and writing afterwards is NOT safe (``clients/FENCING.md``).

A seat block (``client.lock_block(keys, ...)``) holds several keys under one
token; :func:`fenced_block` checks and raises the mark of *every* key in the
one transaction, so a stale token on any key rejects the whole write and no
mark moves::

    with client.lock_block(["seat/7", "seat/8"], lease=30, wait=5) as token:
        with fence.fenced_block(conn, client, ["seat/7", "seat/8"], token) as cur:
            cur.execute("UPDATE seats SET buyer = ? WHERE seat IN (7, 8)", ("bob",))

The ``domain`` argument names the token sequence: the cluster's **fencing
domain**, INFO's ``domain`` field (``client.domain()``), never the cluster
id, which a rebuilt cluster keeps while its tokens start a new sequence
(clients/FENCING.md, "Fencing domains"). Pass the :class:`ticketing.Client`
that took the lock and the helpers ask it; a string is used as given (an
explicit domain, e.g. read once at start-up).

Tokens are u64; the table stores ``token - 2**63`` (= token XOR 2**63) in a
signed 64-bit column (SQLite INTEGER, PostgreSQL BIGINT), which keeps their
order over the whole range. A token *equal* to the stored one is accepted:
it is the same grant writing again; only a lower token is stale.

The SQL is the same for SQLite (3.24+) and PostgreSQL (9.5+); only the
placeholders differ and follow the driver's ``paramstyle`` (``qmark`` for
sqlite3, ``%s`` for psycopg / psycopg2).
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, TypeVar, Union

from ._protocol import MAX_TOKEN, fence_key
from .errors import TicketingError

__all__ = [
    "StaleTokenError",
    "RowCountError",
    "Fence",
    "fenced",
    "domain_of",
    "fenced_block",
    "fenced_permit",
    "permit_fence_key",
    "run_fenced",
    "run_fenced_block",
    "is_retryable",
    "encode_token",
    "decode_token",
    "DEFAULT_TABLE",
    "ZERO",
]

DEFAULT_TABLE = "ticketing_fence"
_OFFSET = 1 << 63
#: The stored value below every real token (token 0 is never granted): the
#: default of a row's own token column before any holder wrote it.
ZERO = -_OFFSET


class StaleTokenError(TicketingError):
    """The token is lower than the high-water mark the store already has.

    The lock was lost (its lease ran out) and a newer holder has written;
    the transaction was rolled back. Not retryable with this token.
    """

    code = "stale_token"


class RowCountError(TicketingError):
    """The driver reported no row count for a fenced statement (DB-API's
    ``rowcount == -1``), or one the fence did not expect.

    Without the count the helpers cannot tell a stale token from a write,
    so they stop instead of guessing; :func:`fenced` rolls back. Not a
    :class:`StaleTokenError`: the driver or the statement is wrong.
    """

    code = "row_count"


def _rowcount(cursor: Any, what: str) -> int:
    """The rows the cursor's last statement changed. DB-API allows -1 ("not
    known"); read as "not 0" it let a stale token's write commit."""
    n = getattr(cursor, "rowcount", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise RowCountError(f"{what}: the driver reported no row count (rowcount {n!r})")
    return n


def encode_token(token: int) -> int:
    """The signed 64-bit value stored for a u64 token (order-preserving)."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be an int, not {type(token).__name__}")
    if not 0 <= token <= MAX_TOKEN:
        raise ValueError(f"token {token} outside 0..2**64-1")
    return token - _OFFSET


def decode_token(value: int) -> int:
    """The u64 token of a stored value (reverses :func:`encode_token`)."""
    return int(value) + _OFFSET


def _placeholders(paramstyle: str, n: int) -> list:
    if paramstyle == "qmark":
        return ["?"] * n
    if paramstyle in ("format", "pyformat"):
        return ["%s"] * n
    if paramstyle == "numeric":
        return [f":{i}" for i in range(1, n + 1)]
    raise ValueError(f"unsupported paramstyle {paramstyle!r} (qmark, format, pyformat, numeric)")


def _paramstyle_of(conn: Any) -> str:
    top = type(conn).__module__.split(".")[0]
    return getattr(sys.modules.get(top), "paramstyle", "qmark")


def _autocommit(conn: Any) -> bool:
    """True if the connection does not open transactions by itself."""
    if getattr(conn, "autocommit", None) is True:  # psycopg, sqlite3 (3.12+)
        return True
    # sqlite3 with isolation_level=None runs every statement on its own.
    return hasattr(conn, "isolation_level") and conn.isolation_level is None and type(
        conn
    ).__module__.startswith("sqlite3")


class Fence:
    """The fencing table of one database.

    :param paramstyle: the driver's placeholder style (``qmark``,
        ``format``/``pyformat`` = ``%s``, ``numeric``).
    :param table: the fencing table (a trusted identifier, put in the SQL
        as written).
    """

    def __init__(self, paramstyle: str = "qmark", table: str = DEFAULT_TABLE) -> None:
        _placeholders(paramstyle, 0)  # validate
        self.paramstyle = paramstyle
        self.table = table

    @classmethod
    def for_connection(cls, conn: Any, table: str = DEFAULT_TABLE) -> "Fence":
        """A Fence using the paramstyle of ``conn``'s driver module."""
        return cls(_paramstyle_of(conn), table)

    def advance_sql(self) -> str:
        """The conditional high-water upsert, with three placeholders."""
        a, b, c = _placeholders(self.paramstyle, 3)
        return (
            f"INSERT INTO {self.table} AS f (domain, key, token) VALUES ({a}, {b}, {c}) "
            "ON CONFLICT (domain, key) DO UPDATE SET token = excluded.token "
            "WHERE f.token <= excluded.token"
        )

    def advance(self, cursor: Any, domain: str, key: str, token: int) -> None:
        """Raise (domain, key)'s high-water mark to ``token`` in the cursor's
        open transaction, or raise :class:`StaleTokenError` (the caller must
        then roll back). Run it before the reads and writes it protects.
        :class:`RowCountError` if the driver does not report the rows the
        upsert changed (``rowcount`` -1): roll back as well."""
        if token == 0:
            raise ValueError("token 0 (tokens start at 1)")
        cursor.execute(self.advance_sql(), (domain, key, encode_token(token)))
        n = _rowcount(cursor, f"fence {domain}/{key}")
        if n == 0:
            raise StaleTokenError(
                f"{domain}/{key}: token {token} is older than the stored high-water mark"
            )
        if n != 1:
            raise RowCountError(f"fence {domain}/{key}: the upsert changed {n} rows, not 1")

    def advance_block(self, cursor: Any, domain: str, keys: Iterable[str], token: int) -> None:
        """:meth:`advance` for a seat block, whose keys share one token:
        raise the mark of every key of *keys* to ``token`` in the cursor's
        open transaction, or raise :class:`StaleTokenError` (naming the key)
        when any key already has a higher one. The caller must then roll
        back, which undoes the keys already raised: all or nothing.

        *keys* is a set (order and repeats do not matter, at least one key).
        The marks are raised in sorted key order, so that transactions over
        overlapping key sets lock the fence rows in one order and cannot
        deadlock (PostgreSQL).
        """
        ks = _key_set(keys, token)
        for k in ks:
            try:
                self.advance(cursor, domain, k, token)
            except StaleTokenError as e:
                raise StaleTokenError(f"{e} (a block of {len(ks)} keys: nothing of it may be written)") from None

    def high_water(self, cursor: Any, domain: str, key: str) -> int:
        """The highest token recorded for (domain, key), 0 if none."""
        a, b = _placeholders(self.paramstyle, 2)
        cursor.execute(f"SELECT token FROM {self.table} WHERE domain = {a} AND key = {b}", (domain, key))
        row = cursor.fetchone()
        return 0 if row is None else decode_token(row[0])

    @contextlib.contextmanager
    def transaction(
        self, conn: Any, domain: Union[str, Any], key: str, token: int, begin: Optional[str] = None
    ) -> Iterator[Any]:
        """Context manager: a transaction that starts with :meth:`advance`.

        ``domain``: the :class:`ticketing.Client` that took the lock (its
        fencing domain is asked) or the domain as a string (:func:`domain_of`).

        Yields a cursor; commits when the block ends, rolls back on any
        exception (:class:`StaleTokenError` included, raised before the block
        runs). ``begin`` is the statement that opens the transaction; by
        default none for drivers that open one implicitly, ``BEGIN IMMEDIATE``
        for sqlite3 in autocommit mode (``isolation_level=None``, recommended:
        the write lock is taken up front, so concurrent writers wait for the
        busy timeout instead of failing on a lock upgrade), ``BEGIN`` for
        other autocommit connections.
        """
        d = domain_of(domain)
        with self._transaction(conn, begin, lambda cur: self.advance(cur, d, key, token)) as cur:
            yield cur

    @contextlib.contextmanager
    def block_transaction(
        self, conn: Any, domain: Union[str, Any], keys: Iterable[str], token: int, begin: Optional[str] = None
    ) -> Iterator[Any]:
        """:meth:`transaction` for a seat block: the transaction starts with
        :meth:`advance_block` of every key to the block's one token. A stale
        token on any key raises :class:`StaleTokenError` before the block
        runs and rolls back: no mark raised, nothing written."""
        ks = _key_set(keys, token)
        d = domain_of(domain)
        with self._transaction(conn, begin, lambda cur: self.advance_block(cur, d, ks, token)) as cur:
            yield cur

    @contextlib.contextmanager
    def _transaction(self, conn: Any, begin: Optional[str], fence_first: Callable[[Any], None]) -> Iterator[Any]:
        cur = conn.cursor()
        try:
            if begin is None and _autocommit(conn):
                begin = "BEGIN IMMEDIATE" if type(conn).__module__.startswith("sqlite3") else "BEGIN"
            if begin:
                cur.execute(begin)
            try:
                fence_first(cur)
                yield cur
            except BaseException:
                if begin:
                    cur.execute("ROLLBACK")
                else:
                    conn.rollback()
                raise
            if begin:
                cur.execute("COMMIT")
            else:
                conn.commit()
        finally:
            cur.close()

    def update(
        self,
        cursor: Any,
        table: str,
        set_sql: str,
        where_sql: str,
        params: Sequence[Any],
        token: int,
        column: str = "fence_token",
        want: int = 1,
    ) -> int:
        """Single-statement form for rows that carry their own token column
        (``BIGINT NOT NULL DEFAULT -9223372036854775808``, i.e. :data:`ZERO`):
        one statement that writes every row ``where_sql`` matches, or none::

            UPDATE table SET column = <token>, set_sql
             WHERE (where_sql) AND column <= <token>
               AND (SELECT count(*) = <want> AND max(column) <= <token>
                      FROM (SELECT column FROM table WHERE (where_sql) FOR UPDATE) AS ticketing_fence_rows)

        (SQLite, paramstyle ``qmark``: without ``FOR UPDATE``; a statement
        there runs alone. ``format``/``pyformat`` is taken for PostgreSQL.
        The statement starts with ``UPDATE``: Python 3.11's sqlite3 reports
        ``rowcount`` -1 for one that starts with ``WITH``.)
        It writes only when ``where_sql`` matches exactly ``want`` rows and
        none has a newer token, so a stale token changes no row, outside a
        transaction too. In PostgreSQL ``FOR UPDATE`` waits for a newer
        holder's open transaction on those rows and reads what it committed.

        ``set_sql`` and ``where_sql`` use the paramstyle's placeholders for
        ``params``, in order (``?`` or ``%s``; no numbered or named ones):
        ``where_sql`` appears twice, so its parameters, found by counting the
        placeholders of ``set_sql``, are passed twice.

        Raises :class:`StaleTokenError` when it changed no row (a row's token
        is newer, or ``where_sql`` does not match ``want`` rows): nothing was
        written. ``want`` 0 means 1, never "no check" (as ``Want`` 0 in Go
        and ``want: 0`` in Node.js). :class:`RowCountError` for any other
        count, which the statement should not give (roll back a transaction
        it ran in). Returns the count; commit as usual for the driver.
        """
        if token == 0:
            raise ValueError("token 0 (tokens start at 1)")
        want = _want(want)
        if self.paramstyle == "numeric":
            raise ValueError("update() supports positional paramstyles only (qmark, format, pyformat)")
        params = tuple(params)
        n_set, n_where = _count_placeholders(set_sql, self.paramstyle), _count_placeholders(where_sql, self.paramstyle)
        if n_set + n_where != len(params):
            raise ValueError(f"set_sql and where_sql have {n_set + n_where} placeholders, params {len(params)} values")
        (p,) = _placeholders(self.paramstyle, 1)
        lock = "" if self.paramstyle == "qmark" else " FOR UPDATE"
        enc = encode_token(token)
        cursor.execute(
            f"UPDATE {table} SET {column} = {p}, {set_sql} WHERE ({where_sql}) AND {column} <= {p} "
            f"AND (SELECT count(*) = {p} AND max({column}) <= {p} "
            f"FROM (SELECT {column} FROM {table} WHERE ({where_sql}){lock}) AS {_ROWS_CTE})",
            (enc, *params, enc, want, enc, *params[n_set:]),
        )
        n = _rowcount(cursor, f"update {table}")
        if n == want:
            return n
        if n == 0:
            raise StaleTokenError(
                f"update {table} with token {token} changed no row "
                f"(a newer token holds one of the rows, or the WHERE does not match {want} rows)"
            )
        raise RowCountError(f"update {table} with token {token} changed {n} rows, not {want} or none")


#: Names the rows update() checks (a derived table); unusual enough not to
#: clash with a caller's name.
_ROWS_CTE = "ticketing_fence_rows"


def _count_placeholders(sql: str, paramstyle: str) -> int:
    """The positional placeholders of an SQL fragment. They split update()'s
    params between set_sql and where_sql, so a numbered or named one, which
    would make the split wrong, is refused. sqlite3 parses the SQL: a ? in
    a quoted string, identifier or comment is none. psycopg does not: every
    %s (%b, %t) is one, %% is a literal %."""
    n, i = 0, 0
    while i < len(sql):
        c = sql[i]
        nxt = sql[i + 1] if i + 1 < len(sql) else ""
        if paramstyle != "qmark":
            if c == "%":
                if nxt in ("s", "b", "t"):
                    n += 1
                elif nxt != "%":
                    raise ValueError(f"placeholder %{nxt} in {sql!r}: use %s only (and %% for %)")
                i += 2
                continue
        elif c in "'\"`[":
            j = sql.find("]" if c == "[" else c, i + 1)
            if j < 0:
                raise ValueError(f"unterminated {c} in {sql!r}")
            i = j  # a doubled quote is two quoted runs in a row
        elif c == "-" and nxt == "-":
            j = sql.find("\n", i)
            i = len(sql) if j < 0 else j
        elif c == "/" and nxt == "*":
            j = sql.find("*/", i + 2)
            if j < 0:
                raise ValueError(f"unterminated comment in {sql!r}")
            i = j + 1
        elif c == "?":
            if nxt.isdigit():
                raise ValueError(f"numbered parameter in {sql!r}: use ? only")
            n += 1
        elif c in ":@$" and (nxt.isalpha() or nxt == "_"):
            raise ValueError(f"named parameter in {sql!r}: use ? only")
        i += 1
    return n


def _want(want: Any) -> int:
    """The rows an update must change: ``want``, 0 meaning 1."""
    if isinstance(want, bool) or not isinstance(want, int):
        raise TypeError(f"want must be an int, not {type(want).__name__}")
    if want < 0:
        raise ValueError(f"want {want} (rows must be 1 or more; 0 means 1)")
    return want or 1


def domain_of(domain: Any) -> str:
    """The fencing domain a helper was given: a string as it is, or the
    domain of a :class:`ticketing.Client` (``client.domain()``: INFO's
    ``domain`` field; :class:`ticketing.NoDomainError` while it names none).
    An :class:`ticketing.AsyncClient` cannot be asked from this synchronous
    code: ``await client.domain()`` and pass the string."""
    if isinstance(domain, str):
        if not domain:
            raise ValueError("an empty fencing domain")
        return domain
    ask = getattr(domain, "domain", None)
    if ask is None or not callable(ask):
        raise TypeError(f"domain must be a str or a ticketing.Client, not {type(domain).__name__}")
    import inspect

    if inspect.iscoroutinefunction(ask):
        raise TypeError("an AsyncClient's domain must be awaited: pass `await client.domain()`")
    return ask()


def fenced(
    conn: Any,
    domain: Union[str, Any],
    key: str,
    token: int,
    *,
    table: str = DEFAULT_TABLE,
    paramstyle: Optional[str] = None,
    begin: Optional[str] = None,
):
    """``with fenced(conn, client, key, token) as cur:`` — a transaction on
    ``conn`` that starts with the fencing check; see :meth:`Fence.transaction`.

    ``domain`` names the token sequence: the :class:`ticketing.Client` that
    took the lock (its fencing domain, INFO's ``domain`` field, is asked),
    or that domain as a string; ``key`` is the lock key.
    """
    f = Fence(paramstyle or _paramstyle_of(conn), table)
    return f.transaction(conn, domain_of(domain), key, token, begin=begin)


def fenced_block(
    conn: Any,
    domain: Union[str, Any],
    keys: Iterable[str],
    token: int,
    *,
    table: str = DEFAULT_TABLE,
    paramstyle: Optional[str] = None,
    begin: Optional[str] = None,
):
    """``with fenced_block(conn, client, keys, token) as cur:`` — a
    transaction that starts with the fencing check of every key of a seat
    block against its one token, all or nothing; see
    :meth:`Fence.block_transaction`. ``domain`` as for :func:`fenced`."""
    f = Fence(paramstyle or _paramstyle_of(conn), table)
    return f.block_transaction(conn, domain_of(domain), keys, token, begin=begin)


def permit_fence_key(permit: Any, token: Optional[int] = None, slot: Optional[int] = None) -> "tuple[str, int]":
    """The fenced resource and token of a permit: ``("<key> <slot>",
    token)``. *permit* is a :class:`ticketing.Permit` (``acquire_permit``)
    or a permit's lock object (``lock_permit``, held), which carry both;
    or the semaphore key, with *token* and *slot* given."""
    if isinstance(permit, str):
        if token is None or slot is None:
            raise TypeError("a permit given by its key needs token= and slot=")
        if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
            raise ValueError(f"permit slot {slot!r}: want an int, 0 or more")
        return fence_key(permit, slot), token
    p_slot, p_token = getattr(permit, "slot", None), getattr(permit, "token", None)
    if p_slot is None or p_token is None:
        raise TypeError(f"not a held permit: {permit!r} (want a ticketing.Permit, a held lock_permit, or key, token=, slot=)")
    return fence_key(permit.key, p_slot), p_token


def fenced_permit(
    conn: Any,
    domain: Union[str, Any],
    permit: Any,
    token: Optional[int] = None,
    slot: Optional[int] = None,
    *,
    table: str = DEFAULT_TABLE,
    paramstyle: Optional[str] = None,
    begin: Optional[str] = None,
):
    """``with fenced_permit(conn, client, permit) as cur:`` — :func:`fenced`
    for a permit of a semaphore key: the fenced resource is
    ``"<key> <slot>"``, one fencing domain per slot (tokens of a semaphore
    increase per slot, not across its slots). A stale holder of slot *s* is
    refused once a newer token wrote slot *s*; holders of other slots are
    not affected. *permit* as for :func:`permit_fence_key`."""
    key, tok = permit_fence_key(permit, token, slot)
    return fenced(conn, domain, key, tok, table=table, paramstyle=paramstyle, begin=begin)


T = TypeVar("T")


def is_retryable(exc: BaseException) -> bool:
    """Whether ``exc`` is a PostgreSQL serialization failure (SQLSTATE 40001)
    or deadlock (40P01), as psycopg (``sqlstate``) or psycopg2 (``pgcode``)
    reports it: the transaction was rolled back and may be run again from
    the start, with the same token."""
    code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return code in ("40001", "40P01")


def run_fenced(
    conn: Any,
    domain: Union[str, Any],
    key: str,
    token: int,
    fn: Callable[[Any], T],
    *,
    retries: int = 0,
    table: str = DEFAULT_TABLE,
    paramstyle: Optional[str] = None,
    begin: Optional[str] = None,
) -> T:
    """``fn(cur)`` in :func:`fenced`'s transaction; returns its result.

    A ``with`` block cannot be run again; a function can. ``retries``
    (default 0) is how many more times the whole transaction (begin,
    advance, ``fn``, commit) runs, with the same token, after PostgreSQL
    aborted it with a serialization failure or deadlock (40001, 40P01;
    :func:`is_retryable`): at REPEATABLE READ and SERIALIZABLE the
    legitimate holder gets 40001 when another transaction changed the fence
    row after its snapshot began. A retry runs ``fn`` again, so it must have
    no effect outside the transaction. A stale token stays stale: its retry
    raises :class:`StaleTokenError`. Other arguments as for :func:`fenced`.
    """
    d = domain_of(domain)

    def once() -> T:
        with fenced(conn, d, key, token, table=table, paramstyle=paramstyle, begin=begin) as cur:
            return fn(cur)

    return _retry(once, retries)


def run_fenced_block(
    conn: Any,
    domain: Union[str, Any],
    keys: Iterable[str],
    token: int,
    fn: Callable[[Any], T],
    *,
    retries: int = 0,
    table: str = DEFAULT_TABLE,
    paramstyle: Optional[str] = None,
    begin: Optional[str] = None,
) -> T:
    """:func:`run_fenced` for a seat block: ``fn(cur)`` in
    :func:`fenced_block`'s transaction, ``retries`` as for :func:`run_fenced`."""
    d = domain_of(domain)
    ks = _key_set(keys, token)

    def once() -> T:
        with fenced_block(conn, d, ks, token, table=table, paramstyle=paramstyle, begin=begin) as cur:
            return fn(cur)

    return _retry(once, retries)


def _retry(once: Callable[[], T], retries: int) -> T:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, not {retries!r}")
    attempt = 0
    while True:
        try:
            return once()
        except Exception as e:
            if attempt >= retries or not is_retryable(e):
                raise
        # A short random pause lets the transaction it conflicted with finish.
        time.sleep(random.uniform(0, 0.005 * 2 ** min(attempt, 6)))
        attempt += 1


def _key_set(keys: Iterable[str], token: int) -> List[str]:
    """The keys of a block sorted and without repeats, or why they cannot be
    fenced."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"keys must be a list of str, not a single {type(keys).__name__} {keys!r}")
    if token == 0:
        raise ValueError("token 0 (tokens start at 1)")
    ks = sorted(set(keys))
    if not ks:
        raise ValueError("a block with no keys")
    return ks
