"""asyncio client of the Ticketing sidecar's unix socket.

Same semantics as :class:`ticketing.Client`, with coroutines::

    async with AsyncClient() as client:
        async with client.lock("seats/42", lease=30, wait=5) as token:
            ...
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

from . import _protocol as p
from .client import _UNCLAIMED_EVENTS, DEFAULT_REPLY_GRACE
from .errors import (
    IndeterminateError,
    LockLostError,
    NotSupportedError,
    ProtocolError,
    ServerError,
    SidecarConnectionError,
    TicketingError,
    connect_error,
)

__all__ = ["AsyncClient", "AsyncLock"]

# Reply lines are short; HELD lists every lock of the session.
_READ_LIMIT = 1 << 20


class _AsyncConnection:
    """One connection (= one sidecar session); one reader task pairs reply
    lines with pending futures in request order. As in the blocking client,
    the first request is ``HELLO 3 events`` and lines starting with ``!``
    are events, never replies; lock deadlines are the loop's timers."""

    def __init__(self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.path = path
        self._reader = reader
        self._writer = writer
        self._pending: Deque[Tuple[asyncio.Future, Optional[float]]] = collections.deque()
        self._tail_deadline: Optional[float] = None
        self._error: Optional[SidecarConnectionError] = None
        #: The protocol version HELLO agreed on this connection (None: not
        #: known yet).
        self.version: Optional[int] = None
        #: True once the sidecar agreed to send event lines.
        self.events = False
        #: The error line a sidecar answered the first HELLO with when it
        #: refuses the connection.
        self.refused: Optional[str] = None
        self._locks: Dict[int, "AsyncLock"] = {}
        self._unclaimed: "collections.OrderedDict[int, str]" = collections.OrderedDict()
        self.hello_fut, _, _ = self.submit(p.HELLO_EVENTS_LINE, None)
        self.hello_fut.add_done_callback(self.settle_hello)
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    def settle_hello(self, fut: "asyncio.Future[str]") -> None:
        """Take the version and the events option from the first HELLO's
        reply (idempotent); see ``_Connection.settle_hello``."""
        if fut.cancelled() or fut.exception() is not None:
            return
        reply = fut.result()
        try:
            version, events = p.parse_hello_reply(reply)
        except ServerError as e:
            if e.code != "bad_request":
                self.refused = reply
            return
        except ProtocolError:
            return
        self.version, self.events = version, events

    def register(self, lock: "AsyncLock") -> None:
        """Route ``! LOST`` events of *lock*'s token to it; see
        ``_Connection.register``."""
        token = lock.held_token
        assert token is not None
        if self._error is not None:
            lock._lose(p.REASON_DISCONNECTED, False)
            return
        reason = self._unclaimed.pop(token, None)
        if reason is not None:
            lock._lose(reason, True)
        else:
            self._locks[token] = lock

    def unregister(self, lock: "AsyncLock") -> None:
        if self._locks.get(lock.held_token) is lock:  # type: ignore[arg-type]
            del self._locks[lock.held_token]  # type: ignore[arg-type]

    def _on_event(self, line: str) -> None:
        ev = p.parse_event(line)
        if ev is None:
            return  # an event of a later version, or malformed: ignored
        lock = self._locks.pop(ev.token, None)
        if lock is None:
            self._unclaimed[ev.token] = ev.reason
            while len(self._unclaimed) > _UNCLAIMED_EVENTS:
                self._unclaimed.popitem(last=False)
            return
        lock._lose(ev.reason, True)

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

    def submit(self, line: str, budget: Optional[float]) -> Tuple[asyncio.Future, Optional[float], float]:
        """Queue a future and write *line* (synchronously, so the order of
        writes is the order of the queue); return the future, the local
        deadline and the send time (the loop's clock); see
        ``_Connection.submit``."""
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        sent = loop.time()
        deadline = None
        if budget is not None:
            deadline = sent + budget
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
        return fut, deadline, sent

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
                    if self.refused is not None:
                        err = SidecarConnectionError(f"the sidecar at {self.path} refused the connection: {self.refused}")
                    else:
                        err = SidecarConnectionError(
                            f"the sidecar at {self.path} closed the connection; locks held through it are released"
                        )
                    break
                line = raw[:-1].rstrip(b"\r").decode("utf-8", "replace")
                if p.is_event(line):
                    self._on_event(line)
                    continue
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
        # The session is gone, and with it its locks.
        locks = list(self._locks.values())
        self._locks.clear()
        for lock in locks:
            lock._lose(p.REASON_DISCONNECTED, False)

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
        """How many requests this client has written so far (all connections),
        not counting the ``HELLO 3 events`` each connection starts with."""
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
        return (await self._call_at(line, sidecar_bound, on_late, conn))[0]

    async def _call_at(
        self,
        line: str,
        sidecar_bound: float,
        on_late: Optional[Callable[[asyncio.Future], None]] = None,
        conn: Optional[_AsyncConnection] = None,
    ) -> Tuple[str, float, _AsyncConnection]:
        """:meth:`_call` that also returns the send time and the connection."""
        if conn is None:
            conn = await self._connection()
        fut, deadline, sent = conn.submit(line, self._budget(sidecar_bound))
        self._sent += 1
        await conn.drain()
        timeout = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            # shield: a timeout or a cancelled caller must not cancel the
            # future, whose place in the queue pairs the reply.
            return await asyncio.wait_for(asyncio.shield(fut), timeout), sent, conn
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
        return (await self._grant((key,), lease, wait, False))[0]

    async def acquire_block(self, keys: Iterable[str], lease: int = 30, wait: p.Number = 5) -> int:
        """Acquire a seat block (1..16 distinct keys, all or none, under one
        token) and return the token; see :meth:`ticketing.Client.acquire_block`.
        If the calling task is cancelled, a block granted later is released
        automatically."""
        return (await self._grant(p.check_keys(keys), lease, wait, True))[0]

    async def _grant(
        self, keys: Sequence[str], lease: int, wait: p.Number, block: bool
    ) -> Tuple[int, float, _AsyncConnection]:
        """ACQUIRE one key or a block; the token, the send time and the
        connection that holds it."""
        if block:
            keys = p.check_keys(keys)
            line, wait_s = p.acquire_block_line(keys, lease, wait)
        else:
            line, wait_s = p.acquire_line(keys[0], lease, wait)
        conn = await self._connection()
        if block and len(keys) > 1:
            await self._require_blocks(conn)
        reply, sent, conn = await self._call_at(line, wait_s, self._compensator(keys[0]), conn)
        return p.parse_acquire(reply), sent, conn

    async def hello(self) -> int:
        """The protocol version both speak (the reply to the connection's
        first request, ``HELLO 3 events``); see :meth:`ticketing.Client.hello`."""
        return await self._hello(await self._connection())

    async def _hello(self, conn: _AsyncConnection) -> int:
        if conn.version is None:
            try:
                await asyncio.wait_for(asyncio.shield(conn.hello_fut), self._budget(0.0))
            except asyncio.TimeoutError:
                raise IndeterminateError("no reply from the sidecar to HELLO") from None
            conn.settle_hello(conn.hello_fut)
        if conn.version is None:
            if conn.refused is not None:
                p.parse_hello(conn.refused)  # raises the refusal's ServerError
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
    and :meth:`AsyncClient.lock_block`.

    The lost signal is :attr:`lost`, an :class:`asyncio.Event` (``await
    lock.lost.wait()``), with the same rules as :class:`ticketing.Lock`; the
    local deadline is a timer of the event loop.
    """

    def __init__(
        self, client: AsyncClient, key: str, lease: int, wait: p.Number, *, keys: Optional[Sequence[str]] = None
    ) -> None:
        self.client = client
        self.key = key
        #: Every key of the lock (a block's keys, in the order given).
        self.keys: Tuple[str, ...] = tuple(keys) if keys is not None else (key,)
        self._block = keys is not None
        #: The lease of the acquire, then of the last successful extend.
        self.lease = lease
        self.wait = wait
        #: The fencing token while held, else None.
        self.token: Optional[int] = None
        #: Set, once, when the lock is lost.
        self.lost = asyncio.Event()
        #: The token granted, kept after release (for LockLostError).
        self.held_token: Optional[int] = None
        self._used = False
        self._state = p.LostState()
        self._conn: Optional[_AsyncConnection] = None
        self._deadline: Optional[float] = None  # the loop's clock
        self._timer: Optional[asyncio.TimerHandle] = None

    @property
    def lost_reason(self) -> Optional[str]:
        """None while not lost; else why (see :class:`ticketing.Lock`)."""
        return self._state.reason

    def remaining(self) -> float:
        """Seconds of local validity left; 0 once lost (see
        :meth:`ticketing.Lock.remaining`)."""
        self._check_deadline()
        if self._state.reason is not None or self._deadline is None or self._state.released:
            return 0.0
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    async def acquire(self) -> int:
        """Acquire the lock; return the token."""
        if self._used:
            raise RuntimeError("a lock is used once; call client.lock() again")
        self._used = True
        token, sent, conn = await self.client._grant(self.keys, self.lease, self.wait, self._block)
        self.token = self.held_token = token
        self._conn = conn
        self._arm(sent + p.validity(self.lease))
        conn.register(self)
        return token

    async def extend(self, lease: int) -> None:
        """Renew the lease (``EXTEND``); see :meth:`ticketing.Lock.extend`."""
        p.check_lease(lease)
        token = self.token
        if token is None:
            raise RuntimeError("the lock is not held")
        line = p.extend_line(self.key, token, lease)
        self._check_deadline()
        conn = self._conn
        if self._state.reason is not None or conn is None:
            raise self._lost_error()
        reply, sent, _ = await self.client._call_at(line, p.RELEASE_DEADLINE, None, conn)
        try:
            p.parse_extend(reply)
        except ServerError as e:
            if e.code in p.EXTEND_LOST_CODES:
                self._lose(p.REASON_MOVED, True)
            raise
        if self._state.reason is not None or self._state.released:
            raise self._lost_error()  # lost while the EXTEND was under way
        self.lease = lease
        self._arm(sent + p.validity(lease))

    async def release(self) -> None:
        """Release the lock; sends RELEASE also after a loss (see
        :meth:`ticketing.Lock.release`)."""
        if self.token is None:
            raise RuntimeError("the lock is not held")
        token, self.token = self.token, None
        self._check_deadline()
        self._state.released = True
        self._cancel_timer()
        if self._conn is not None:
            self._conn.unregister(self)
        await self.client.release(self.key, token)

    async def __aenter__(self) -> int:
        return await self.acquire()

    async def __aexit__(self, exc_type: object, exc: Optional[BaseException], tb: object) -> None:
        """Release; raise :class:`LockLostError` if the lock was lost while
        held, unless the body raised (its exception goes on unchanged); see
        :meth:`ticketing.Lock.__exit__`."""
        release_err: Optional[TicketingError] = None
        if self.token is not None:  # else released inside the block
            try:
                await self.release()
            except TicketingError as e:
                if exc_type is None and self._state.reason is None:
                    raise
                release_err = e
        else:
            self._check_deadline()
        self._state.after_exit(exc, self.held_token, self.keys, release_err)

    # -- the lost signal --------------------------------------------------------

    def _lost_error(self) -> LockLostError:
        return self._state.lost_error(self.held_token, self.keys)

    def _arm(self, deadline: float) -> None:
        if self._state.reason is not None or self._state.released:
            return
        self._deadline = deadline
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_at(deadline, self._check_deadline)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_deadline(self) -> None:
        if self._deadline is not None and asyncio.get_running_loop().time() >= self._deadline:
            self._lose(p.REASON_DEADLINE, False)

    def _lose(self, reason: str, from_sidecar: bool) -> None:
        if self._state.lose(reason, from_sidecar):
            self._cancel_timer()
            self.lost.set()

    def __repr__(self) -> str:
        if self.token is None:
            state = "not held"
        else:
            state = f"token={self.token}"
            if self._state.reason is not None:
                state += f" lost={self._state.reason}"
        keys = " ".join(repr(k) for k in self.keys)
        return f"<ticketing.AsyncLock {keys} {state}>"
