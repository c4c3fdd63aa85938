"""asyncio client of the Ticketing sidecar's unix socket.

Same semantics as :class:`ticketing.Client`, with coroutines::

    async with AsyncClient() as client:
        async with client.lock("seats/42", lease=30, wait=5) as token:
            ...

Like the blocking client, an I/O shell over :mod:`ticketing._protocol`,
which makes every decision.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from . import _protocol as p
from .client import DEFAULT_REPLY_GRACE
from .errors import (
    IndeterminateError,
    LockLostError,
    SidecarConnectionError,
    TicketingError,
    connect_error,
)

__all__ = ["AsyncClient", "AsyncLock"]

# How much the reader asks the stream for at once.
_READ_SIZE = 1 << 16


class _AsyncConnection:
    """One connection (= one sidecar session): the asyncio shell of a
    :class:`ticketing._protocol.Session`. Requests are recorded by the
    session and written synchronously, so the order of writes is the order
    of its queue; one reader task feeds the bytes it reads to the session
    and carries out its decisions (reply futures, ``on_queued`` callbacks,
    lost lock objects). The first request is ``HELLO 9 events``; lock
    deadlines are the loop's timers."""

    def __init__(self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.path = path
        self._reader = reader
        self._writer = writer
        self._session = p.Session(path)
        self._loop = asyncio.get_running_loop()
        self.hello_fut: asyncio.Future = self._loop.create_future()
        self._write(lambda now: self._session.start(now, self.hello_fut))
        self._task = self._loop.create_task(self._read_loop())

    @classmethod
    async def open(cls, path: str, connect_timeout: float) -> "_AsyncConnection":
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), connect_timeout)
        except (OSError, asyncio.TimeoutError) as e:
            raise connect_error(path, e) from e
        return cls(path, reader, writer)

    @property
    def alive(self) -> bool:
        return self._session.alive

    @property
    def version(self) -> Optional[int]:
        """The protocol version HELLO agreed (None: not known yet)."""
        return self._session.version

    @property
    def events(self) -> bool:
        """True once the sidecar agreed to send event lines."""
        return self._session.events

    def submit(
        self,
        line: str,
        budget: Optional[float],
        *,
        keys: Sequence[str] = (),
        on_queued: Optional[Callable[[], object]] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> Tuple[asyncio.Future, Optional[float], float]:
        """Write *line* (synchronously, so the order of writes is the order
        of the queue); return its reply future, the local deadline and the
        send time (the loop's clock)."""
        fut = self._loop.create_future()
        req = self._write(
            lambda now: self._session.send(
                line, budget, now, handle=fut, keys=keys, on_queued=on_queued, on_position=on_position
            )
        )
        return fut, req.deadline, req.sent

    def _write(self, record: Callable[[float], Tuple[p.Request, bytes]]) -> p.Request:
        req, data = record(self._loop.time())
        try:
            self._writer.write(data)
        except (OSError, RuntimeError) as e:
            td = self._session.send_failed(e)
            self._carry_out([td])
            raise td.error from e
        return req

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except (OSError, RuntimeError) as e:
            self._carry_out([self._session.broken(e)])

    def register(self, lock: "AsyncLock") -> None:
        """Route ``! LOST`` events of *lock*'s token to it; an event already
        read, or a connection already lost, fires its signal at once."""
        d = self._session.register(lock.held_token, lock)  # type: ignore[arg-type]
        if d is not None:
            self._carry_out([d])

    def unregister(self, lock: "AsyncLock") -> None:
        self._session.unregister(lock.held_token, lock)

    def releasing(self, key: str, token: int) -> None:
        """A lock object of *token* with *key* is released from now on."""
        lock = self._session.releasing(token, key)
        if lock is not None:
            lock._released_by_client()

    async def _read_loop(self) -> None:
        try:
            while self._session.alive:
                data = await self._reader.read(_READ_SIZE)
                self._carry_out(self._session.receive_data(data) if data else [self._session.eof()])
        except (OSError, ValueError) as e:
            self._carry_out([self._session.broken(e)])
        except asyncio.CancelledError:
            self._carry_out([self._session.fail(SidecarConnectionError("client closed"))])

    def _carry_out(self, decisions: Iterable[object]) -> None:
        for d in decisions:
            if isinstance(d, p.Reply):
                if not d.request.handle.done():
                    d.request.handle.set_result(d.line)
            elif isinstance(d, p.Queued):
                try:
                    d.request.on_queued()  # type: ignore[misc]
                except Exception as e:  # noqa: BLE001 - a caller's bug must not stop the reader
                    self._loop.call_exception_handler(
                        {"message": "ticketing: on_queued callback raised", "exception": e}
                    )
            elif isinstance(d, p.Positioned):
                try:
                    d.request.on_position(d.position)  # type: ignore[misc]
                except Exception as e:  # noqa: BLE001 - a caller's bug must not stop the reader
                    self._loop.call_exception_handler(
                        {"message": "ticketing: on_position callback raised", "exception": e}
                    )
            elif isinstance(d, p.Lost):
                d.target._lose(d.reason, d.from_sidecar, d.revoked_by, d.revoke_reason)
            elif isinstance(d, p.Teardown):
                # The locks are told first: closing the socket makes the
                # sidecar release them and hand their keys on (issue 39).
                for lock in d.locks:
                    lock._lose(p.REASON_DISCONNECTED, False)
                if d.first:
                    self._writer.close()
                for req in d.requests:
                    if not req.handle.done():
                        req.handle.set_exception(d.error)

    async def close(self) -> None:
        self._carry_out([self._session.fail(SidecarConnectionError("client closed"))])
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
        not counting the ``HELLO 9 events`` each connection starts with."""
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
        return p.reply_budget(sidecar_bound, self.reply_grace)

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
        keys: Sequence[str] = (),
        on_queued: Optional[Callable[[], object]] = None,
        on_done: Optional[Callable[[Optional[asyncio.Future]], object]] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> Tuple[str, float, _AsyncConnection]:
        """:meth:`_call` that also returns the send time and the connection.
        *on_done* runs once the sidecar answered or the connection ended,
        even when this call gave up waiting first."""
        try:
            if conn is None:
                conn = await self._connection()
            fut, deadline, sent = conn.submit(
                line, self._budget(sidecar_bound), keys=keys, on_queued=on_queued, on_position=on_position
            )
        except BaseException:
            if on_done is not None:
                on_done(None)  # nothing sent, or the connection ended: no answer will come
            raise
        if on_done is not None:
            fut.add_done_callback(on_done)
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

    async def acquire(
        self,
        key: str,
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> int:
        """Acquire *key* and return its fencing token; see
        :meth:`ticketing.Client.acquire`. If the calling task is cancelled, a
        grant that arrives later is released automatically.

        *on_queued* is called (no arguments, in the event loop, before this
        coroutine returns) when the cluster committed this acquire into the
        key's FIFO queue (``! QUEUED``); see :meth:`ticketing.Client.acquire`.
        Keep it quick; an exception it raises goes to the loop's exception
        handler. *on_position* is called (with a :class:`ticketing.Position`,
        in the event loop, in the order reported, only before this coroutine
        returns or raises) with this acquire's place in line as the sidecar
        reports it (``! POSITION``, version 7); see
        :meth:`ticketing.Client.acquire`. The same rules as *on_queued*.
        *label*: an owner label; see :meth:`ticketing.Client.acquire`."""
        return (await self._grant((key,), lease, wait, False, on_queued, label, on_position))[0]

    async def acquire_block(
        self,
        keys: Iterable[str],
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> int:
        """Acquire a seat block (1..16 distinct keys, all or none, under one
        token) and return the token; see :meth:`ticketing.Client.acquire_block`.
        If the calling task is cancelled, a block granted later is released
        automatically. *on_queued*, *on_position* (once per key): see
        :meth:`acquire`."""
        return (await self._grant(p.check_keys(keys), lease, wait, True, on_queued, label, on_position))[0]

    async def _grant(
        self,
        keys: Sequence[str],
        lease: int,
        wait: p.Number,
        block: bool,
        on_queued: Optional[Callable[[], object]],
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
        permit: bool = False,
    ) -> Tuple[int, float, _AsyncConnection, Optional[int]]:
        """ACQUIRE one key or a block, or with *permit* the PERMIT of one
        key; the token, the send time, the connection that holds it and a
        permit's slot (None for a lock)."""
        line, wait_s, keys = p.grant_line(keys, lease, wait, block, label, permit)
        p.check_on_queued(on_queued)
        p.check_on_position(on_position)
        conn = await self._connection()
        if permit:
            p.check_permits_version(await self._hello(conn), self.path)
        if len(keys) > 1:
            p.check_blocks(await self._hello(conn), self.path)
        if p.check_label(label):
            p.check_labels(await self._hello(conn), self.path)
        if wait_s > p.MAX_SHORT_WAIT:
            p.check_wait(wait_s, await self._hello(conn), self.path)
        hook = None
        if on_position is not None:
            report_to = on_position

            def hook(position: p.Position) -> None:
                if report_to is not None:
                    report_to(position)

        try:
            reply, sent, conn = await self._call_at(
                line, wait_s, self._compensator(keys[0]), conn, keys, on_queued, on_position=hook
            )
        finally:
            # Answered, given up or cancelled: no report reaches the caller
            # from now on, though the request may still wait at the sidecar.
            report_to = None
        if permit:
            token, slot = p.parse_permit(reply)
            return token, sent, conn, slot
        return p.parse_acquire(reply), sent, conn, None

    async def hello(self) -> int:
        """The protocol version both speak (the reply to the connection's
        first request, ``HELLO 9 events``); see :meth:`ticketing.Client.hello`."""
        return await self._hello(await self._connection())

    async def _hello(self, conn: _AsyncConnection) -> int:
        if conn.version is not None:
            return conn.version
        try:
            await asyncio.wait_for(asyncio.shield(conn.hello_fut), self._budget(0.0))
        except asyncio.TimeoutError:
            raise IndeterminateError("no reply from the sidecar to HELLO") from None
        version = conn._session.hello_outcome()
        if version is None:
            version = conn._session.settle_plain_hello(await self._call(p.hello_line(), 0.0, None, conn))
        return version

    async def release(self, key: str, token: int) -> None:
        """Release *key* held under *token*; see :meth:`ticketing.Client.release`."""
        line = p.release_line(key, token)
        conn = await self._connection()
        # A lock object of this connection for key and token is released
        # from now on (see ticketing.Client.release).
        conn.releasing(key, token)
        p.parse_release(await self._call(line, p.RELEASE_DEADLINE, conn=conn))

    async def ping(self) -> None:
        """Round-trip ``PING``/``PONG`` to the sidecar."""
        p.parse_ping(await self._call("PING", 0.0))

    async def info(self) -> p.Info:
        """The sidecar's view of the cluster (``INFO``)."""
        return p.parse_info(await self._call("INFO", 0.0))

    async def domain(self) -> str:
        """The cluster's fencing domain; see :meth:`ticketing.Client.domain`."""
        return p.require_domain(await self.info(), self.path)

    async def held(self) -> List[Tuple[str, int]]:
        """Locks held by this client's connection: [(key, token), ...] (``HELD``)."""
        return p.parse_held(await self._call("HELD", 0.0))

    async def held_locks(self) -> List[p.HeldLock]:
        """Locks held, with their owner labels (see
        :meth:`ticketing.Client.held_locks`)."""
        return p.parse_held_locks(await self._call("HELD", 0.0))

    async def raw(self, line: str) -> str:
        """Send one request line as is; return the reply line verbatim
        (see :meth:`ticketing.Client.raw`)."""
        return await self._call(p.check_raw(line), p.MAX_WAIT + p.RELEASE_DEADLINE)

    async def acquire_permit(
        self,
        key: str,
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> p.Permit:
        """Take one permit of the semaphore *key* (``PERMIT``, protocol
        version 8); return it as a :class:`ticketing.Permit` (``key``,
        ``token``: its own fencing token, ``slot``: 0..n-1, the lowest free
        at the grant; ``fence_key``: ``"<key> <slot>"``, the resource to fence
        its writes under). The arguments, *on_queued*, *on_position*,
        *label* and the outcomes are those of :meth:`acquire`: permits are
        FIFO with the key's other waiters. Release it with
        ``release(key, permit.token)``, extend it like a lock.

        :raises NotSemaphoreError: *key* is not a semaphore (an operator
            makes it one: :meth:`set_permits`, ``ticketing permits set``).
        :raises NotSupportedError: the sidecar is older than version 8
            (nothing sent).
        :raises BusyError, LockTimeoutError, IndeterminateError, ServerError,
            SidecarConnectionError: as for :meth:`acquire`.
        """
        token, _, _, slot = await self._grant((key,), lease, wait, False, on_queued, label, on_position, True)
        assert slot is not None
        return p.Permit(key, token, slot)

    async def set_permits(self, key: str, n: int) -> None:
        """Make *key* a semaphore of *n* permits (1..100000), change the *n*
        of one, or with 0 remove an idle one (``PERMITS``, protocol version
        8): an operator's call. Raising *n* grants waiters at once; lowering
        it takes no permit from a holder. Exact and idempotent: after
        :class:`IndeterminateError` call it again.

        :raises ValueError, TypeError: invalid argument (nothing sent).
        :raises InUseError: *key* is held as a lock, or *n* is 0 while a
            permit is held or someone waits.
        :raises NotSemaphoreError: *n* is 0 and *key* is no semaphore.
        :raises NotSupportedError: the sidecar is older than version 8
            (nothing sent).
        :raises IndeterminateError: it may or may not have applied.
        :raises ServerError: another ``ERR`` (``not_supported``: the
            cluster has no semaphores yet).
        """
        line = p.permits_line(key, n)
        conn = await self._connection()
        p.check_permits_version(await self._hello(conn), self.path)
        p.parse_permits(await self._call(line, p.RELEASE_DEADLINE, conn=conn))

    def lock_permit(
        self,
        key: str,
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> "AsyncLock":
        """A :class:`AsyncLock` holding one permit of the semaphore *key*
        (see :meth:`acquire_permit`)::

            permit = client.lock_permit("checkout", lease=30, wait=60)
            async with permit as token:
                ...  # permit.slot; fence writes under permit.fence_key ("checkout <slot>")

        As for :meth:`lock`, entering yields the token; the slot and
        ``fence_key`` are on the object. Acquired on entry, released (by its
        token) on exit, renewed on the grant and lost exactly as a lock.
        """
        return AsyncLock._of(self, p.LockState.of_permit(key, lease, wait, on_queued, label, on_position))

    def lock(
        self,
        key: str,
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> "AsyncLock":
        """An :class:`AsyncLock` on *key*::

            async with client.lock("seats/42", lease=30, wait=5) as token:
                ...

        The arguments are checked now; acquired on entry, released on exit.
        *on_queued*, *on_position* and *label*: see :meth:`acquire`.
        """
        return AsyncLock._of(self, p.LockState.of_key(key, lease, wait, on_queued, label, on_position))

    def lock_block(
        self,
        keys: Iterable[str],
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> "AsyncLock":
        """An :class:`AsyncLock` on a seat block::

            async with client.lock_block(["seat/1", "seat/2"], lease=30, wait=5) as token:
                ...

        The arguments are checked now; acquired on entry, released (every
        key) on exit. *on_queued*, *on_position* and *label*: see
        :meth:`acquire`.
        """
        return AsyncLock._of(self, p.LockState.of_block(keys, lease, wait, on_queued, label, on_position))

    def _compensator(self, key: str) -> Callable[[asyncio.Future], None]:
        def release_late_grant(fut: asyncio.Future) -> None:
            if fut.cancelled() or fut.exception() is not None:
                return
            line = p.late_grant_release(key, fut.result())
            conn = self._conn
            if line is None or conn is None or not conn.alive:
                return
            try:
                conn.submit(line, self._budget(p.RELEASE_DEADLINE))  # reply ignored
            except TicketingError:
                pass  # the session is gone (and released it)

        return release_late_grant


class AsyncLock(p.LockView):
    """asyncio version of :class:`ticketing.Lock`; see :meth:`AsyncClient.lock`
    and :meth:`AsyncClient.lock_block`.

    The lost signal is :attr:`lost`, an :class:`asyncio.Event` (``await
    lock.lost.wait()``), with the same rules as :class:`ticketing.Lock`; the
    local deadline is a timer of the event loop. The decisions are
    :class:`ticketing._protocol.LockState`'s.
    """

    def __init__(
        self,
        client: AsyncClient,
        key: str,
        lease: int,
        wait: p.Number,
        *,
        keys: Optional[Sequence[str]] = None,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> None:
        if keys is None:
            state = p.LockState.of_key(key, lease, wait, on_queued, label, on_position)
        else:
            state = p.LockState.of_block(keys, lease, wait, on_queued, label, on_position)
        self._init(client, state)

    @classmethod
    def _of(cls, client: AsyncClient, state: p.LockState) -> "AsyncLock":
        lock = cls.__new__(cls)
        lock._init(client, state)
        return lock

    def _init(self, client: AsyncClient, state: p.LockState) -> None:
        self.client = client
        #: Set, once, when the lock is lost.
        self.lost = asyncio.Event()
        self._state = state
        self._conn: Optional[_AsyncConnection] = None
        self._timer: Optional[asyncio.TimerHandle] = None

    def remaining(self) -> float:
        """Seconds of local validity left; 0 once lost (see
        :meth:`ticketing.Lock.remaining`)."""
        self._check_deadline()
        if self._state.deadline is None:
            return 0.0  # not acquired (and maybe no loop running)
        return self._state.remaining(asyncio.get_running_loop().time())

    async def acquire(self) -> int:
        """Acquire the lock; return the token."""
        st = self._state
        st.begin_acquire()
        token, sent, conn, slot = await self.client._grant(
            st.keys, st.lease, st.wait, st.block, st.on_queued, st.label, st.on_position, st.permit
        )
        st.slot = slot  # before anyone sees the lock held
        deadline = st.granted(token, sent)
        self._conn = conn
        conn.register(self)  # before the renewal (see ticketing.Lock.acquire)
        gone = False
        line = st.renewal_line(deadline, asyncio.get_running_loop().time())
        if line is not None:
            # Renewed before the caller has it (see ticketing.Lock.acquire).
            ext = st.begin_extend(st.lease, asyncio.get_running_loop().time())
            reply: Optional[str] = None
            e_sent = asyncio.get_running_loop().time()
            try:
                reply, e_sent, _ = await self.client._call_at(
                    line, p.RELEASE_DEADLINE, None, conn, on_done=lambda _: st.settle_extend(ext)
                )
            except TicketingError:
                pass  # no answer: the ACQUIRE's deadline stays
            except asyncio.CancelledError:
                # Cancelled before the caller has the lock: like a cancelled
                # acquire's late grant, it is released (else the key stays
                # held by nobody for the lease, or a renewed one).
                self._abandon(conn)
                raise
            finally:
                st.finish_extend(ext)
            deadline, gone = st.renewed(reply, e_sent, deadline)
        self._arm(deadline)
        if gone:
            self._lose(p.REASON_MOVED, True)
        return token

    def _abandon(self, conn: "_AsyncConnection") -> None:
        """Release a grant its caller will never have (acquire cancelled
        during the renewal): no signal any more, RELEASE sent, its reply
        ignored."""
        st = self._state
        st.released = True
        self._cancel_timer()
        conn.unregister(self)
        if st.token is None or not conn.alive:
            return
        try:
            conn.submit(p.release_line(st.keys[0], st.token), self.client._budget(p.RELEASE_DEADLINE))
        except TicketingError:
            pass  # the session is gone (and released it)

    async def extend(self, lease: int) -> None:
        """Renew the lease (``EXTEND``); see :meth:`ticketing.Lock.extend`."""
        self._check_deadline()
        line = self._state.extend_line(lease)
        conn = self._conn
        if conn is None:
            raise self._state.lost_error()
        # From the send on the deadline is at most this EXTEND's cap, and
        # stays so unless it succeeds (see ticketing.Lock.extend).
        ext = self._state.begin_extend(lease, asyncio.get_running_loop().time())
        try:
            self._arm(self._state.capped(ext.cap))
            self._check_deadline()
            reply, sent, _ = await self.client._call_at(
                line, p.RELEASE_DEADLINE, None, conn, on_done=lambda _: self._state.settle_extend(ext)
            )
            err, fire = self._state.extend_replied(reply)
            if fire:
                self._fire()
            if err is not None:
                raise err
            if not self._state.extended(lease):
                raise self._state.lost_error()  # lost while the EXTEND was under way
            # At most the cap of every EXTEND that ran at the same time,
            # answered or not (another task's, issue 39).
            self._arm(self._state.extended_deadline(ext, sent, lease))
        finally:
            self._state.finish_extend(ext)

    async def release(self) -> None:
        """Release the lock; sends RELEASE also after a loss (see
        :meth:`ticketing.Lock.release`)."""
        token = self._state.begin_release()
        self._check_deadline()
        self._state.released = True
        self._cancel_timer()
        if self._conn is not None:
            self._conn.unregister(self)
        await self.client.release(self.key, token)

    def _released_by_client(self) -> None:
        """``AsyncClient.release`` of this lock's key and token."""
        self._state.released = True
        self._cancel_timer()

    async def __aenter__(self) -> int:
        return await self.acquire()

    async def __aexit__(self, exc_type: object, exc: Optional[BaseException], tb: object) -> None:
        """Release; raise :class:`LockLostError` if the lock was lost while
        held, unless the body raised (its exception goes on unchanged); see
        :meth:`ticketing.Lock.__exit__`."""
        release_err: Optional[TicketingError] = None
        if self._state.token is not None:  # else released inside the block
            try:
                await self.release()
            except TicketingError as e:
                if exc_type is None and self._state.reason is None:
                    raise
                release_err = e
        else:
            self._check_deadline()
        self._state.after_exit(exc, release_err)

    # -- the lost signal --------------------------------------------------------

    def _lost_error(self) -> LockLostError:
        return self._state.lost_error()

    def _arm(self, deadline: float) -> None:
        if not self._state.arm(deadline):
            return
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_at(deadline, self._check_deadline)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_deadline(self) -> None:
        if self._state.deadline is not None and self._state.due(asyncio.get_running_loop().time()):
            self._lose(p.REASON_DEADLINE, False)

    def _lose(
        self, reason: str, from_sidecar: bool, revoked_by: Optional[str] = None, revoke_reason: Optional[str] = None
    ) -> None:
        if self._state.lose(reason, from_sidecar, revoked_by, revoke_reason):
            self._fire()

    def _fire(self) -> None:
        self._cancel_timer()
        self.lost.set()

    def __repr__(self) -> str:
        return f"<ticketing.AsyncLock {self._state.describe()}>"
