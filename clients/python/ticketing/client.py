"""Blocking, thread-safe client of the Ticketing sidecar's unix socket."""

from __future__ import annotations

import collections
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as _FutureTimeout
from typing import Callable, Deque, Iterable, List, Optional, Sequence, Tuple

from . import _protocol as p
from .errors import (
    IndeterminateError,
    NotSupportedError,
    SidecarConnectionError,
    TicketingError,
    connect_error,
)

__all__ = ["Client", "Lock"]

# How much longer than the sidecar's own bound a reply may take before the
# client stops waiting and reports IndeterminateError.
DEFAULT_REPLY_GRACE = 10.0


class _Connection:
    """One unix-socket connection (= one sidecar session).

    Requests are written under ``_lock`` and their futures queued in the
    same order; one reader thread pairs each reply line with the oldest
    pending future (the sidecar answers in request order).
    """

    def __init__(self, path: str, connect_timeout: float) -> None:
        self.path = path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(connect_timeout)
            sock.connect(path)
            sock.settimeout(None)
        except OSError as e:
            sock.close()
            raise connect_error(path, e) from e
        self._sock = sock
        self._lock = threading.Lock()
        # (future, local deadline or None)
        self._pending: Deque[Tuple[Future, Optional[float]]] = collections.deque()
        self._tail_deadline: Optional[float] = None
        self._error: Optional[SidecarConnectionError] = None
        #: The protocol version HELLO agreed on this connection (None: not asked).
        self.version: Optional[int] = None
        self._reader = threading.Thread(target=self._read_loop, name=f"ticketing-reader {path}", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._error is None

    def submit(self, line: str, budget: Optional[float]) -> Tuple[Future, Optional[float]]:
        """Write *line*; return its reply future and the local deadline.

        *budget* is how long the sidecar may take for this request alone
        (None: unbounded). Replies come in order, so the deadline is never
        earlier than that of the request ahead of it.
        """
        data = (line + "\n").encode("utf-8")
        fut: Future = Future()
        with self._lock:
            if self._error is not None:
                raise self._error
            deadline = None
            if budget is not None:
                deadline = time.monotonic() + budget
                if self._tail_deadline is not None:
                    deadline = max(deadline, self._tail_deadline)
            self._tail_deadline = deadline
            self._pending.append((fut, deadline))
            try:
                self._sock.sendall(data)
            except OSError as e:
                err = SidecarConnectionError(f"connection to the sidecar at {self.path} lost while sending: {e}")
                self._fail_locked(err)
                raise err from e
        return fut, deadline

    def _read_loop(self) -> None:
        f = self._sock.makefile("rb")
        err: Optional[SidecarConnectionError] = None
        try:
            while True:
                raw = f.readline()
                if not raw.endswith(b"\n"):
                    err = SidecarConnectionError(
                        f"the sidecar at {self.path} closed the connection; locks held through it are released"
                    )
                    break
                line = raw[:-1].rstrip(b"\r").decode("utf-8", "replace")
                with self._lock:
                    entry = self._pending.popleft() if self._pending else None
                    if not self._pending:
                        self._tail_deadline = None
                if entry is None:
                    err = SidecarConnectionError(
                        f"the sidecar sent {line!r} with no request pending "
                        "(e.g. ERR forbidden or too_many_connections on connect); connection closed"
                    )
                    break
                entry[0].set_result(line)
        except (OSError, ValueError) as e:
            err = SidecarConnectionError(f"connection to the sidecar at {self.path} lost: {e}")
        finally:
            with self._lock:
                self._fail_locked(err or SidecarConnectionError("connection closed"))
            try:
                f.close()
            except OSError:
                pass

    def _fail_locked(self, err: SidecarConnectionError) -> None:
        if self._error is None:
            self._error = err
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        while self._pending:
            fut, _ = self._pending.popleft()
            if not fut.done():
                fut.set_exception(err)

    def close(self) -> None:
        with self._lock:
            self._fail_locked(SidecarConnectionError("client closed"))
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=5)


class Client:
    """A connection to the local Ticketing sidecar.

    ``Client(path)`` connects to the unix socket *path* (default:
    ``$TICKETING_SOCKET``, else ``./ticketing.sock``) on first use. The
    connection is a session: locks acquired through it belong to it, and
    the sidecar releases them all when it closes (``close()``, process exit
    or crash). If the connection is lost, pending requests fail with
    :class:`SidecarConnectionError` and the next request opens a new
    connection (a new session, holding nothing).

    Thread-safe: several threads may share a client; their requests are
    pipelined on the one connection. Replies come in request order, so a
    request queued behind an acquire that waits is answered after it; use a
    separate client per thread when that matters.

    :param reply_grace: seconds a reply may take beyond the sidecar's own
        bound (the wait for an acquire, 5 s for a release) before the client
        gives up with :class:`IndeterminateError`; None waits forever. A grant
        that arrives after the client gave up is released automatically.
    :param connect_timeout: seconds for connecting to the socket.
    """

    def __init__(
        self,
        path: Optional[str] = None,
        *,
        reply_grace: Optional[float] = DEFAULT_REPLY_GRACE,
        connect_timeout: float = 5.0,
    ) -> None:
        self.path = p.default_path(path)
        self.reply_grace = reply_grace
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._conn: Optional[_Connection] = None
        self._closed = False
        self._sent = 0

    # -- lifecycle ---------------------------------------------------------

    def connect(self) -> "Client":
        """Open the connection now (otherwise the first request does)."""
        self._connection()
        return self

    @property
    def connected(self) -> bool:
        """True while a connection (session) is open."""
        conn = self._conn
        return conn is not None and conn.alive

    @property
    def requests_sent(self) -> int:
        """How many requests this client has written so far (all connections)."""
        return self._sent

    def close(self) -> None:
        """Close the connection; the sidecar releases every lock it holds."""
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self) -> _Connection:
        with self._lock:
            if self._closed:
                raise SidecarConnectionError("client is closed")
            if self._conn is None or not self._conn.alive:
                self._conn = _Connection(self.path, self.connect_timeout)
            return self._conn

    # -- requests ----------------------------------------------------------

    def _budget(self, sidecar_bound: float) -> Optional[float]:
        return None if self.reply_grace is None else sidecar_bound + self.reply_grace

    def _call(
        self,
        line: str,
        sidecar_bound: float,
        on_late: Optional[Callable[[Future], None]] = None,
        conn: Optional[_Connection] = None,
    ) -> str:
        if conn is None:
            conn = self._connection()
        fut, deadline = conn.submit(line, self._budget(sidecar_bound))
        with self._lock:
            self._sent += 1
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return fut.result(timeout)
        except _FutureTimeout:
            if on_late is not None:
                fut.add_done_callback(on_late)
            raise IndeterminateError(f"no reply from the sidecar within {timeout:.1f} s") from None

    def acquire(self, key: str, lease: int = 30, wait: p.Number = 5) -> int:
        """Acquire *key*; return its fencing token (an int that strictly
        increases with every grant, cluster-wide).

        :param lease: whole seconds, 1..250: the sidecar-side safety net
            after which the lock is taken back if not released.
        :param wait: seconds to wait for the turn, 0..300 with millisecond
            precision; 0 means one immediate try.
        :raises ValueError, TypeError: invalid argument (nothing sent).
        :raises BusyError: held and *wait* was 0.
        :raises LockTimeoutError: the turn did not come within *wait*.
        :raises IndeterminateError: unknown outcome; do not enter the
            critical section.
        :raises ServerError: ``ERR`` from the sidecar (``.code``).
        :raises SidecarConnectionError: sidecar unreachable / connection lost.
        """
        line, wait_s = p.acquire_line(key, lease, wait)
        return p.parse_acquire(self._call(line, wait_s, self._compensator(key)))

    def acquire_block(self, keys: Iterable[str], lease: int = 30, wait: p.Number = 5) -> int:
        """Acquire a seat block: every key of *keys* (1..16 distinct keys)
        at once or none, under one fencing token, which is returned.

        The block joins every key's FIFO queue and is granted when it is at
        the head of each and every key is free; with ``wait=0`` it is granted
        only if every key is free with nobody queued on it. When the wait
        runs out no key is acquired. ``release(key, token)`` naming *any* of
        its keys releases the whole block; closing the client releases it
        too. One key is :meth:`acquire`.

        A block needs protocol version 2: the first one on a connection
        sends ``HELLO`` (see :meth:`hello`).

        :raises ValueError, TypeError: invalid argument, e.g. a key named
            twice or more than 16 keys (nothing sent).
        :raises NotSupportedError: the sidecar speaks protocol version 1
            (nothing acquired).
        :raises BusyError, LockTimeoutError, IndeterminateError, ServerError,
            SidecarConnectionError: as for :meth:`acquire`.
        """
        keys = p.check_keys(keys)
        line, wait_s = p.acquire_block_line(keys, lease, wait)
        conn = self._connection()
        if len(keys) > 1:
            self._require_blocks(conn)
        return p.parse_acquire(self._call(line, wait_s, self._compensator(keys[0]), conn))

    def hello(self) -> int:
        """The protocol version this client and the sidecar both speak
        (``HELLO``, asked once per connection); 1 for a version-1 sidecar,
        which does not know ``HELLO``."""
        return self._hello(self._connection())

    def _hello(self, conn: _Connection) -> int:
        if conn.version is None:
            conn.version = p.parse_hello(self._call(p.hello_line(), 0.0, None, conn))
        return conn.version

    def _require_blocks(self, conn: _Connection) -> None:
        v = self._hello(conn)
        if v < 2:
            raise NotSupportedError(
                f"a seat block needs protocol version 2; the sidecar at {self.path} speaks version {v}: "
                "upgrade the sidecar"
            )

    def release(self, key: str, token: int) -> None:
        """Release *key* held under *token* by this client's connection.

        Returns only on a success reply.

        :raises ServerError: e.g. ``not_held`` (not held by this connection,
            or already expired) or ``token_mismatch``.
        :raises IndeterminateError: no definite reply within the sidecar's
            5-second release deadline; the lease remains the safety net.
        """
        line = p.release_line(key, token)
        p.parse_release(self._call(line, p.RELEASE_DEADLINE))

    def ping(self) -> None:
        """Round-trip ``PING``/``PONG`` to the sidecar."""
        p.parse_ping(self._call("PING", 0.0))

    def info(self) -> p.Info:
        """The sidecar's view of the cluster (``INFO``)."""
        return p.parse_info(self._call("INFO", 0.0))

    def held(self) -> List[Tuple[str, int]]:
        """Locks held by this client's connection: [(key, token), ...] (``HELD``)."""
        return p.parse_held(self._call("HELD", 0.0))

    def raw(self, line: str) -> str:
        """Send one request *line* as is and return the reply line verbatim.

        A low-level escape hatch for debugging and tests: no argument checks
        beyond "one non-empty line", no reply mapping. A lock acquired this
        way still belongs to this connection.
        """
        return self._call(p.check_raw(line), p.MAX_WAIT + p.RELEASE_DEADLINE)

    def lock(self, key: str, lease: int = 30, wait: p.Number = 5) -> "Lock":
        """A :class:`Lock` on *key*, to use as a context manager::

            with client.lock("seats/42", lease=30, wait=5) as token:
                ...  # critical section; use token for fencing writes

        The arguments are checked now; the lock is acquired on entry and
        released on exit, also when the block raises.
        """
        p.acquire_line(key, lease, wait)
        return Lock(self, key, lease, wait)

    def lock_block(self, keys: Iterable[str], lease: int = 30, wait: p.Number = 5) -> "Lock":
        """A :class:`Lock` on a seat block (see :meth:`acquire_block`), to
        use as a context manager::

            with client.lock_block(["seat/1", "seat/2"], lease=30, wait=5) as token:
                ...  # every key is held under token; fence each key's writes with it

        The arguments are checked now; the block is acquired on entry and
        released (every key) on exit, also when the body raises.
        """
        keys = p.check_keys(keys)
        p.acquire_block_line(keys, lease, wait)
        return Lock(self, keys[0], lease, wait, keys=keys)

    def _compensator(self, key: str) -> Callable[[Future], None]:
        """Callback for an acquire the caller gave up on: release a late grant."""

        def release_late_grant(fut: Future) -> None:
            if fut.cancelled() or fut.exception() is not None:
                return
            try:
                token = p.parse_acquire(fut.result())
            except TicketingError:
                return
            try:
                conn = self._conn
                if conn is not None and conn.alive:
                    conn.submit(p.release_line(key, token), self._budget(p.RELEASE_DEADLINE))  # reply ignored
            except TicketingError:
                pass  # connection gone: the sidecar released it with the session

        return release_late_grant


class Lock:
    """A lock on one key, or on a seat block, through a :class:`Client`;
    see :meth:`Client.lock` and :meth:`Client.lock_block`.

    Use once: ``with lock as token:``, or :meth:`acquire` then
    :meth:`release`. ``keys`` lists every key (one for :meth:`Client.lock`);
    ``key`` is the first.
    """

    def __init__(
        self, client: Client, key: str, lease: int, wait: p.Number, *, keys: Optional[Sequence[str]] = None
    ) -> None:
        self.client = client
        self.key = key
        #: Every key of the lock (a block's keys, in the order given).
        self.keys: Tuple[str, ...] = tuple(keys) if keys is not None else (key,)
        self._block = keys is not None
        self.lease = lease
        self.wait = wait
        #: The fencing token while held, else None.
        self.token: Optional[int] = None
        self._used = False

    def acquire(self) -> int:
        """Acquire the lock (see :meth:`Client.acquire`); return the token."""
        if self._used:
            raise RuntimeError("a Lock is used once; call client.lock() again")
        self._used = True
        if self._block:
            self.token = self.client.acquire_block(self.keys, self.lease, self.wait)
        else:
            self.token = self.client.acquire(self.key, self.lease, self.wait)
        return self.token

    def release(self) -> None:
        """Release the lock, every key of a block (see :meth:`Client.release`)."""
        if self.token is None:
            raise RuntimeError("the lock is not held")
        token, self.token = self.token, None
        self.client.release(self.key, token)

    def __enter__(self) -> int:
        return self.acquire()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # A failed release after a successful block is raised: it means the
        # lock may have been lost (e.g. lease expired) during the section.
        # After a failing block the block's exception wins. Nothing to do if
        # the block released the lock itself (lock.release()).
        if self.token is None:
            return
        try:
            self.release()
        except TicketingError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        state = f"token={self.token}" if self.token is not None else "not held"
        keys = " ".join(repr(k) for k in self.keys)
        return f"<ticketing.Lock {keys} {state}>"
