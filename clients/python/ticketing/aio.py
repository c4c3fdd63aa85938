"""asyncio client of the Ticketing sidecar's unix socket.

Same semantics as :class:`ticketing.Client`, with coroutines::

    async with AsyncClient() as client:
        async with client.lock("seats/42", lease=30, wait=5) as token:
            ...
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable, Deque, Iterable, List, Optional, Sequence, Tuple

from . import _protocol as p
from .client import DEFAULT_REPLY_GRACE
from .errors import (
    IndeterminateError,
    NotSupportedError,
    SidecarConnectionError,
    TicketingError,
    connect_error,
)

__all__ = ["AsyncClient", "AsyncLock"]

# Reply lines are short; HELD lists every lock of the session.
_READ_LIMIT = 1 << 20


class _AsyncConnection:
    """One connection (= one sidecar session); one reader task pairs reply
    lines with pending futures in request order."""

    def __init__(self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.path = path
        self._reader = reader
        self._writer = writer
        self._pending: Deque[Tuple[asyncio.Future, Optional[float]]] = collections.deque()
        self._tail_deadline: Optional[float] = None
        self._error: Optional[SidecarConnectionError] = None
        #: The protocol version HELLO agreed on this connection (None: not asked).
        self.version: Optional[int] = None
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, path: str, connect_timeout: float) -> "_AsyncConnection":
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(path, limit=_READ_LIMIT), connect_timeout
            )
        except (OSError, asyncio.TimeoutError) as e:
            raise connect_error(path, e) from e
        return cls(path, reader, writer)

    @property
    def alive(self) -> bool:
        return self._error is None

    def submit(self, line: str, budget: Optional[float]) -> Tuple[asyncio.Future, Optional[float]]:
        """Queue a future and write *line* (synchronously, so the order of
        writes is the order of the queue); see ``_Connection.submit``."""
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        deadline = None
        if budget is not None:
            deadline = loop.time() + budget
            if self._tail_deadline is not None:
                deadline = max(deadline, self._tail_deadline)
        self._tail_deadline = deadline
        self._pending.append((fut, deadline))
        try:
            self._writer.write((line + "\n").encode("utf-8"))
        except (OSError, RuntimeError) as e:
            err = SidecarConnectionError(f"connection to the sidecar at {self.path} lost while sending: {e}")
            self._fail(err)
            raise err from e
        return fut, deadline

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except (OSError, RuntimeError) as e:
            self._fail(SidecarConnectionError(f"connection to the sidecar at {self.path} lost: {e}"))

    async def _read_loop(self) -> None:
        err: Optional[SidecarConnectionError] = None
        try:
            while True:
                raw = await self._reader.readline()
                if not raw.endswith(b"\n"):
                    err = SidecarConnectionError(
                        f"the sidecar at {self.path} closed the connection; locks held through it are released"
                    )
                    break
                line = raw[:-1].rstrip(b"\r").decode("utf-8", "replace")
                if not self._pending:
                    err = SidecarConnectionError(
                        f"the sidecar sent {line!r} with no request pending "
                        "(e.g. ERR forbidden or too_many_connections on connect); connection closed"
                    )
                    break
                fut, _ = self._pending.popleft()
                if not self._pending:
                    self._tail_deadline = None
                if not fut.done():
                    fut.set_result(line)
        except (OSError, ValueError) as e:
            err = SidecarConnectionError(f"connection to the sidecar at {self.path} lost: {e}")
        except asyncio.CancelledError:
            err = SidecarConnectionError("client closed")
        finally:
            self._fail(err or SidecarConnectionError("connection closed"))

    def _fail(self, err: SidecarConnectionError) -> None:
        if self._error is None:
            self._error = err
            self._writer.close()
        while self._pending:
            fut, _ = self._pending.popleft()
            if not fut.done():
                fut.set_exception(err)

    async def close(self) -> None:
        self._fail(SidecarConnectionError("client closed"))
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        try:
            await self._writer.wait_closed()
        except (OSError, RuntimeError):
            pass


class AsyncClient:
    """asyncio version of :class:`ticketing.Client` (same arguments, same
    semantics: one connection = one session owning its locks, opened on
    first use, reopened after a loss; pipelined; replies in request order).

    Use it from one event loop.
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
        self._conn: Optional[_AsyncConnection] = None
        self._connecting: Optional[asyncio.Lock] = None
        self._closed = False
        self._sent = 0

    async def connect(self) -> "AsyncClient":
        """Open the connection now (otherwise the first request does)."""
        await self._connection()
        return self

    @property
    def connected(self) -> bool:
        """True while a connection (session) is open."""
        return self._conn is not None and self._conn.alive

    @property
    def requests_sent(self) -> int:
        """How many requests this client has written so far (all connections)."""
        return self._sent

    async def close(self) -> None:
        """Close the connection; the sidecar releases every lock it holds."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _connection(self) -> _AsyncConnection:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._closed:
                raise SidecarConnectionError("client is closed")
            if self._conn is None or not self._conn.alive:
                self._conn = await _AsyncConnection.open(self.path, self.connect_timeout)
            return self._conn

    def _budget(self, sidecar_bound: float) -> Optional[float]:
        return None if self.reply_grace is None else sidecar_bound + self.reply_grace

    async def _call(
        self,
        line: str,
        sidecar_bound: float,
        on_late: Optional[Callable[[asyncio.Future], None]] = None,
        conn: Optional[_AsyncConnection] = None,
    ) -> str:
        if conn is None:
            conn = await self._connection()
        fut, deadline = conn.submit(line, self._budget(sidecar_bound))
        self._sent += 1
        await conn.drain()
        timeout = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            # shield: a timeout or a cancelled caller must not cancel the
            # future, whose place in the queue pairs the reply.
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            if on_late is not None:
                fut.add_done_callback(on_late)
            raise IndeterminateError(f"no reply from the sidecar within {timeout:.1f} s") from None
        except asyncio.CancelledError:
            if on_late is not None:
                fut.add_done_callback(on_late)
            raise

    async def acquire(self, key: str, lease: int = 30, wait: p.Number = 5) -> int:
        """Acquire *key* and return its fencing token; see
        :meth:`ticketing.Client.acquire`. If the calling task is cancelled, a
        grant that arrives later is released automatically."""
        line, wait_s = p.acquire_line(key, lease, wait)
        return p.parse_acquire(await self._call(line, wait_s, self._compensator(key)))

    async def acquire_block(self, keys: Iterable[str], lease: int = 30, wait: p.Number = 5) -> int:
        """Acquire a seat block (1..16 distinct keys, all or none, under one
        token) and return the token; see :meth:`ticketing.Client.acquire_block`.
        If the calling task is cancelled, a block granted later is released
        automatically."""
        keys = p.check_keys(keys)
        line, wait_s = p.acquire_block_line(keys, lease, wait)
        conn = await self._connection()
        if len(keys) > 1:
            await self._require_blocks(conn)
        return p.parse_acquire(await self._call(line, wait_s, self._compensator(keys[0]), conn))

    async def hello(self) -> int:
        """The protocol version both speak (``HELLO``, once per connection);
        see :meth:`ticketing.Client.hello`."""
        return await self._hello(await self._connection())

    async def _hello(self, conn: _AsyncConnection) -> int:
        if conn.version is None:
            conn.version = p.parse_hello(await self._call(p.hello_line(), 0.0, None, conn))
        return conn.version

    async def _require_blocks(self, conn: _AsyncConnection) -> None:
        v = await self._hello(conn)
        if v < 2:
            raise NotSupportedError(
                f"a seat block needs protocol version 2; the sidecar at {self.path} speaks version {v}: "
                "upgrade the sidecar"
            )

    async def release(self, key: str, token: int) -> None:
        """Release *key* held under *token*; see :meth:`ticketing.Client.release`."""
        line = p.release_line(key, token)
        p.parse_release(await self._call(line, p.RELEASE_DEADLINE))

    async def ping(self) -> None:
        """Round-trip ``PING``/``PONG`` to the sidecar."""
        p.parse_ping(await self._call("PING", 0.0))

    async def info(self) -> p.Info:
        """The sidecar's view of the cluster (``INFO``)."""
        return p.parse_info(await self._call("INFO", 0.0))

    async def held(self) -> List[Tuple[str, int]]:
        """Locks held by this client's connection: [(key, token), ...] (``HELD``)."""
        return p.parse_held(await self._call("HELD", 0.0))

    async def raw(self, line: str) -> str:
        """Send one request line as is; return the reply line verbatim
        (see :meth:`ticketing.Client.raw`)."""
        return await self._call(p.check_raw(line), p.MAX_WAIT + p.RELEASE_DEADLINE)

    def lock(self, key: str, lease: int = 30, wait: p.Number = 5) -> "AsyncLock":
        """An :class:`AsyncLock` on *key*::

            async with client.lock("seats/42", lease=30, wait=5) as token:
                ...

        The arguments are checked now; acquired on entry, released on exit.
        """
        p.acquire_line(key, lease, wait)
        return AsyncLock(self, key, lease, wait)

    def lock_block(self, keys: Iterable[str], lease: int = 30, wait: p.Number = 5) -> "AsyncLock":
        """An :class:`AsyncLock` on a seat block::

            async with client.lock_block(["seat/1", "seat/2"], lease=30, wait=5) as token:
                ...

        The arguments are checked now; acquired on entry, released (every
        key) on exit.
        """
        keys = p.check_keys(keys)
        p.acquire_block_line(keys, lease, wait)
        return AsyncLock(self, keys[0], lease, wait, keys=keys)

    def _compensator(self, key: str) -> Callable[[asyncio.Future], None]:
        def release_late_grant(fut: asyncio.Future) -> None:
            if fut.cancelled() or fut.exception() is not None:
                return
            try:
                token = p.parse_acquire(fut.result())
                conn = self._conn
                if conn is not None and conn.alive:
                    conn.submit(p.release_line(key, token), self._budget(p.RELEASE_DEADLINE))
            except TicketingError:
                pass  # not granted, or the session is gone (and released it)

        return release_late_grant


class AsyncLock:
    """asyncio version of :class:`ticketing.Lock`; see :meth:`AsyncClient.lock`
    and :meth:`AsyncClient.lock_block`."""

    def __init__(
        self, client: AsyncClient, key: str, lease: int, wait: p.Number, *, keys: Optional[Sequence[str]] = None
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

    async def acquire(self) -> int:
        """Acquire the lock; return the token."""
        if self._used:
            raise RuntimeError("a lock is used once; call client.lock() again")
        self._used = True
        if self._block:
            self.token = await self.client.acquire_block(self.keys, self.lease, self.wait)
        else:
            self.token = await self.client.acquire(self.key, self.lease, self.wait)
        return self.token

    async def release(self) -> None:
        """Release the lock."""
        if self.token is None:
            raise RuntimeError("the lock is not held")
        token, self.token = self.token, None
        await self.client.release(self.key, token)

    async def __aenter__(self) -> int:
        return await self.acquire()

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.token is None:  # released inside the block
            return
        try:
            await self.release()
        except TicketingError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        state = f"token={self.token}" if self.token is not None else "not held"
        keys = " ".join(repr(k) for k in self.keys)
        return f"<ticketing.AsyncLock {keys} {state}>"
