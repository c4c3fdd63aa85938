"""Blocking, thread-safe client of the Ticketing sidecar's unix socket."""

from __future__ import annotations

import heapq
import itertools
import logging
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as _FutureTimeout
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from . import _protocol as p
from .errors import (
    IndeterminateError,
    LockLostError,
    SidecarConnectionError,
    TicketingError,
    connect_error,
)

__all__ = ["Client", "Lock"]

# How much longer than the sidecar's own bound a reply may take before the
# client stops waiting and reports IndeterminateError.
DEFAULT_REPLY_GRACE = 10.0

# How much the reader asks the socket for at once.
_READ_SIZE = 1 << 16

_log = logging.getLogger("ticketing")


class _Timers:
    """The validity deadlines of one connection's lock objects, run by one
    thread (started with the first lock, ended with the connection) instead
    of a thread per lock. After a stall (SIGSTOP) the thread runs late and
    fires everything that came due meanwhile."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        # [when, seq, callback or None (cancelled)]
        self._heap: List[list] = []
        self._seq = itertools.count()
        self._cancelled = 0
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def call_at(self, when: float, fn: Callable[[], None]) -> Optional[list]:
        """Run *fn* on the timer thread at monotonic time *when*; return a
        handle for :meth:`cancel` (None once closed)."""
        with self._cond:
            if self._closed:
                return None
            entry = [when, next(self._seq), fn]
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
            return entry

    def cancel(self, entry: Optional[list]) -> None:
        with self._cond:
            if entry is None or entry[2] is None:
                return
            entry[2] = None
            self._cancelled += 1
            # Released locks must not pile up for their whole lease: compact
            # once most entries are dead.
            if self._cancelled > 64 and self._cancelled * 2 > len(self._heap):
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if not self._heap:
                        self._cond.wait()
                        continue
                    delay = self._heap[0][0] - time.monotonic()
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
                now = time.monotonic()
                due = []
                while self._heap and self._heap[0][0] <= now:
                    entry = heapq.heappop(self._heap)
                    if entry[2] is None:
                        self._cancelled -= 1
                    else:
                        due.append(entry[2])
                        entry[2] = None
            for fn in due:
                fn()  # Lock._check_deadline: sets an Event, never raises


class _HookGate:
    """An ``on_position`` callback that is called only until :meth:`close`:
    the acquire it belongs to has returned or raised, and its caller gets no
    report after that. Its mutex makes :meth:`close` wait for a call under
    way on the reader thread."""

    def __init__(self, fn: Callable[[p.Position], object]) -> None:
        self._fn = fn
        self._mu = threading.Lock()
        self._open = True

    def __call__(self, position: p.Position) -> None:
        with self._mu:
            if self._open:
                self._fn(position)

    def close(self) -> None:
        with self._mu:
            self._open = False


class _Connection:
    """One unix-socket connection (= one sidecar session): the I/O shell of
    a :class:`ticketing._protocol.Session`, which makes every decision.

    Requests are recorded by the session and written under ``_lock``, so the
    order of writes is the order of its queue. One reader thread feeds the
    bytes it reads to the session and carries out its decisions outside the
    lock: it settles reply futures, calls ``on_queued`` and ``on_position``
    callbacks, loses lock objects. The first request is ``HELLO 9 events``.

    Lock order: ``_lock`` before a Lock's ``_mu`` before the timers'.
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
        self._session = p.Session(path)
        self.timers = _Timers(f"ticketing-timers {path}")
        self._reader: Optional[threading.Thread] = None
        # Pipelined before anything else, written before the reader starts
        # so that a refusal sent on connect is read as HELLO's reply.
        self.hello_fut: Future = Future()
        self._write(lambda now: self._session.start(now, self.hello_fut))
        self._reader = threading.Thread(target=self._read_loop, name=f"ticketing-reader {path}", daemon=True)
        self._reader.start()

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

    def on_reader_thread(self) -> bool:
        return threading.current_thread() is self._reader

    def submit(
        self,
        line: str,
        budget: Optional[float],
        *,
        keys: Sequence[str] = (),
        on_queued: Optional[Callable[[], object]] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> Tuple[Future, Optional[float], float]:
        """Write *line*; return its reply future, the local deadline and the
        send time (monotonic); see :meth:`ticketing._protocol.Session.send`."""
        fut: Future = Future()
        req = self._write(
            lambda now: self._session.send(
                line, budget, now, handle=fut, keys=keys, on_queued=on_queued, on_position=on_position
            )
        )
        return fut, req.deadline, req.sent

    def _write(self, record: Callable[[float], Tuple[p.Request, bytes]]) -> p.Request:
        with self._lock:
            req, data = record(time.monotonic())
            try:
                self._sock.sendall(data)
            except OSError as e:
                td = self._session.send_failed(e)
                self._end_locked(td)
                cause: Optional[OSError] = e
            else:
                return req
        self._carry_out([td])
        raise td.error from cause

    def register(self, lock: "Lock") -> None:
        """Route ``! LOST`` events of *lock*'s token to it from now on; an
        event for it already read, or a connection already lost, fires its
        signal at once."""
        with self._lock:
            d = self._session.register(lock.held_token, lock)  # type: ignore[arg-type]
        if d is not None:
            self._carry_out([d])

    def unregister(self, lock: "Lock") -> None:
        with self._lock:
            self._session.unregister(lock.held_token, lock)

    def releasing(self, key: str, token: int) -> None:
        """A lock object of *token* with *key* is released from now on
        (``Client.release`` of its key and token)."""
        with self._lock:
            lock = self._session.releasing(token, key)
        if lock is not None:
            lock._released_by_client()

    def _read_loop(self) -> None:
        while True:
            try:
                data = self._sock.recv(_READ_SIZE)
            except OSError as e:
                with self._lock:
                    td = self._session.broken(e)
                    self._end_locked(td)
                self._carry_out([td])
                return
            with self._lock:
                decisions = self._session.receive_data(data) if data else [self._session.eof()]
                for d in decisions:
                    if isinstance(d, p.Teardown):
                        self._end_locked(d)
            self._carry_out(decisions)
            if not self._session.alive:
                return

    def _end_locked(self, td: p.Teardown) -> None:
        # The lock objects are lost before the end is seen (under _lock): a
        # request refused from here on (the session raises its error) finds
        # its lock lost. Lock order: _lock before a Lock's _mu.
        for lock in td.locks:
            lock._lose(p.REASON_DISCONNECTED, False)
        if td.first:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
            self.timers.close()

    def _carry_out(self, decisions: Iterable[object]) -> None:
        """Carry out the session's decisions, outside ``_lock`` (a future's
        callbacks may write, a lock object takes its own mutex)."""
        for d in decisions:
            if isinstance(d, p.Reply):
                if not d.request.handle.done():
                    d.request.handle.set_result(d.line)
            elif isinstance(d, p.Queued):
                try:
                    d.request.on_queued()  # type: ignore[misc]
                except Exception:  # noqa: BLE001 - a caller's bug must not stop the reader
                    _log.exception("ticketing: on_queued callback raised")
            elif isinstance(d, p.Positioned):
                try:
                    d.request.on_position(d.position)  # type: ignore[misc]
                except Exception:  # noqa: BLE001 - a caller's bug must not stop the reader
                    _log.exception("ticketing: on_position callback raised")
            elif isinstance(d, p.Lost):
                d.target._lose(d.reason, d.from_sidecar, d.revoked_by, d.revoke_reason)
            elif isinstance(d, p.Teardown):
                # The locks are told first: a caller woken by its request's
                # failure must find them lost (the session is gone, and the
                # sidecar releases its locks and hands their keys on).
                for lock in d.locks:
                    lock._lose(p.REASON_DISCONNECTED, False)
                for req in d.requests:
                    if not req.handle.done():
                        req.handle.set_exception(d.error)

    def close(self) -> None:
        with self._lock:
            td = self._session.fail(SidecarConnectionError("client closed"))
        # Its locks are told first: closing the socket makes the sidecar
        # release them and hand their keys on (issue 39).
        for lock in td.locks:
            lock._lose(p.REASON_DISCONNECTED, False)
        with self._lock:
            self._end_locked(td)
        self._carry_out([td])
        if self._reader is not None and not self.on_reader_thread():
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
        """How many requests this client has written so far (all connections),
        not counting the ``HELLO 9 events`` each connection starts with."""
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
        return p.reply_budget(sidecar_bound, self.reply_grace)

    def _call(
        self,
        line: str,
        sidecar_bound: float,
        on_late: Optional[Callable[[Future], None]] = None,
        conn: Optional[_Connection] = None,
    ) -> str:
        return self._call_at(line, sidecar_bound, on_late, conn)[0]

    def _call_at(
        self,
        line: str,
        sidecar_bound: float,
        on_late: Optional[Callable[[Future], None]] = None,
        conn: Optional[_Connection] = None,
        keys: Sequence[str] = (),
        on_queued: Optional[Callable[[], object]] = None,
        on_done: Optional[Callable[[Optional[Future]], object]] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> Tuple[str, float, _Connection]:
        """:meth:`_call` that also returns the send time and the connection
        (a lock's validity counts from the send time). *on_done* runs once
        the sidecar answered or the connection ended, even when this call
        gave up waiting first (on the reader thread, or here)."""
        if conn is None:
            conn = self._connection()
        try:
            if conn.on_reader_thread():
                # An on_queued or on_position callback runs on the reader
                # thread, which would have to read the very reply it waits for.
                raise RuntimeError("an on_queued or on_position callback must not wait for a reply of the same client")
            fut, deadline, sent = conn.submit(
                line, self._budget(sidecar_bound), keys=keys, on_queued=on_queued, on_position=on_position
            )
        except BaseException:
            if on_done is not None:
                on_done(None)  # nothing sent, or the connection ended: no answer will come
            raise
        if on_done is not None:
            fut.add_done_callback(on_done)  # at once if already answered
        with self._lock:
            self._sent += 1
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return fut.result(timeout), sent, conn
        except _FutureTimeout:
            if on_late is not None:
                fut.add_done_callback(on_late)
            raise IndeterminateError(f"no reply from the sidecar within {timeout:.1f} s") from None

    def _grant(
        self,
        keys: Sequence[str],
        lease: int,
        wait: p.Number,
        block: bool,
        on_queued: Optional[Callable[[], object]],
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
        permit: bool = False,
    ) -> Tuple[int, float, _Connection, Optional[int]]:
        """ACQUIRE one key or a block, or with *permit* the PERMIT of one
        key; the token, the send time, the connection that holds it and a
        permit's slot (None for a lock)."""
        line, wait_s, keys = p.grant_line(keys, lease, wait, block, label, permit)
        p.check_on_queued(on_queued)
        p.check_on_position(on_position)
        conn = self._connection()
        if permit:
            p.check_permits_version(self._hello(conn), self.path)
        if len(keys) > 1:
            p.check_blocks(self._hello(conn), self.path)
        if p.check_label(label):
            p.check_labels(self._hello(conn), self.path)
        if wait_s > p.MAX_SHORT_WAIT:
            p.check_wait(wait_s, self._hello(conn), self.path)
        gate = None if on_position is None else _HookGate(on_position)
        try:
            reply, sent, conn = self._call_at(
                line, wait_s, self._compensator(keys[0]), conn, keys, on_queued, on_position=gate
            )
        finally:
            if gate is not None:
                # Given up (a timeout, an exception) or answered: no report
                # reaches the caller from now on, though the request may
                # still wait at the sidecar.
                gate.close()
        if permit:
            token, slot = p.parse_permit(reply)
            return token, sent, conn, slot
        return p.parse_acquire(reply), sent, conn, None

    def acquire(
        self,
        key: str,
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> int:
        """Acquire *key*; return its fencing token (an int that strictly
        increases with every grant, cluster-wide).

        :param lease: whole seconds, 1..250: the sidecar-side safety net
            after which the lock is taken back if not released.
        :param wait: seconds to wait for the turn, 0..3600 (over 300 needs a
            sidecar of protocol version 6) with millisecond
            precision; 0 means one immediate try.
        :param on_queued: called with no arguments when the sidecar reports
            (``! QUEUED``) that the cluster committed this acquire into the
            key's FIFO queue: an acquire of the key sent by anyone after
            that stands behind this one. At most once, before this call
            returns or raises; never for ``wait=0``, an acquire granted
            without queueing, or one refused before it was queued; maybe
            never (a sidecar before version 4, a leader change), so use it
            for progress and tests, not for correctness. It runs on the
            connection's reader thread: keep it quick, and do not wait for
            a reply of this client in it (``RuntimeError``); an exception
            it raises is logged (logger ``ticketing``) and dropped.
        :param on_position: called with a :class:`ticketing.Position`
            (``key``, ``position``: 1 = next in line, ``estimate``: whole
            seconds of estimated wait left, or None when the cluster has
            none yet) each time the sidecar reports this acquire's place in
            line (``! POSITION``, protocol version 7): at most about once a
            second, only when the place changed, a block once per key. In
            the order reported, only before this call returns or raises,
            never after; never for ``wait=0`` or an acquire granted at once,
            nor from a sidecar before version 7; a leader change may delay
            a report. Informational: the outcome means the same without it.
            It runs on the reader thread like *on_queued*, under the same
            rules (quick; no reply of this client awaited in it; an
            exception is logged and dropped).
        :param label: an owner label (version 5): a short name for people
            (a job, a request id; 1..64 bytes of visible ASCII, not ``-``)
            that the cluster keeps with the holding; ``ticketing inspect``
            and the sidecar's ``HELD``, lost events and log show it. It
            needs a sidecar of version 5 (else ``NotSupportedError``,
            nothing sent) and a cluster of protocol version 8 (else
            ``ServerError`` ``not_supported``).
        :raises ValueError, TypeError: invalid argument (nothing sent).
        :raises BusyError: held and *wait* was 0.
        :raises LockTimeoutError: the turn did not come within *wait*.
        :raises IndeterminateError: unknown outcome; do not enter the
            critical section.
        :raises ServerError: ``ERR`` from the sidecar (``.code``).
        :raises SidecarConnectionError: sidecar unreachable / connection lost.
        """
        return self._grant((key,), lease, wait, False, on_queued, label, on_position)[0]

    def acquire_block(
        self,
        keys: Iterable[str],
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> int:
        """Acquire a seat block: every key of *keys* (1..16 distinct keys)
        at once or none, under one fencing token, which is returned.

        The block joins every key's FIFO queue and is granted when it is at
        the head of each and every key is free; with ``wait=0`` it is granted
        only if every key is free with nobody queued on it. When the wait
        runs out no key is acquired. ``release(key, token)`` naming *any* of
        its keys releases the whole block; closing the client releases it
        too. One key is :meth:`acquire`. *on_queued* is called once the
        block is in every key's queue (see :meth:`acquire`); *on_position*
        with the block's place in each key's line (see :meth:`acquire`);
        *label* is the block's owner label (see :meth:`acquire`).

        A block needs protocol version 2: the first one on a connection
        sends ``HELLO`` (see :meth:`hello`).

        :raises ValueError, TypeError: invalid argument, e.g. a key named
            twice or more than 16 keys (nothing sent).
        :raises NotSupportedError: the sidecar speaks protocol version 1
            (nothing acquired).
        :raises BusyError, LockTimeoutError, IndeterminateError, ServerError,
            SidecarConnectionError: as for :meth:`acquire`.
        """
        return self._grant(p.check_keys(keys), lease, wait, True, on_queued, label, on_position)[0]

    def hello(self) -> int:
        """The protocol version this client and the sidecar both speak: the
        reply to the ``HELLO 9 events`` every connection starts with (a
        version-2 sidecar, which refuses the events option, is asked again
        with a plain ``HELLO``); 1 for a version-1 sidecar, which does not
        know ``HELLO``."""
        return self._hello(self._connection())

    def _hello(self, conn: _Connection) -> int:
        if conn.version is not None:
            return conn.version
        try:
            conn.hello_fut.result(self._budget(0.0))
        except _FutureTimeout:
            raise IndeterminateError("no reply from the sidecar to HELLO") from None
        version = conn._session.hello_outcome()
        if version is None:
            version = conn._session.settle_plain_hello(self._call(p.hello_line(), 0.0, None, conn))
        return version

    def release(self, key: str, token: int) -> None:
        """Release *key* held under *token* by this client's connection.

        Returns only on a success reply.

        :raises ServerError: e.g. ``not_held`` (not held by this connection,
            or already expired) or ``token_mismatch``.
        :raises IndeterminateError: no definite reply within the sidecar's
            5-second release deadline; the lease remains the safety net.
        """
        line = p.release_line(key, token)
        conn = self._connection()
        # A lock object of this connection for key and token is released
        # from now on, as by Lock.release: the key may be handed on at once,
        # and the sidecar sends no lost event for a release.
        conn.releasing(key, token)
        p.parse_release(self._call(line, p.RELEASE_DEADLINE, conn=conn))

    def ping(self) -> None:
        """Round-trip ``PING``/``PONG`` to the sidecar."""
        p.parse_ping(self._call("PING", 0.0))

    def info(self) -> p.Info:
        """The sidecar's view of the cluster (``INFO``)."""
        return p.parse_info(self._call("INFO", 0.0))

    def domain(self) -> str:
        """The fencing domain of the cluster behind the sidecar: INFO's
        ``domain`` field, the name of the sequence this client's tokens
        belong to. Fence high-water marks are keyed by it (the fence
        helpers take it from here when given the client). Raises
        :class:`NoDomainError` while no node has named it."""
        return p.require_domain(self.info(), self.path)

    def held(self) -> List[Tuple[str, int]]:
        """Locks held by this client's connection: [(key, token), ...] (``HELD``).
        :meth:`held_locks` also gives their owner labels."""
        return p.parse_held(self._call("HELD", 0.0))

    def held_locks(self) -> List[p.HeldLock]:
        """Locks held by this client's connection, with their owner labels:
        [:class:`HeldLock` (key, token, label), ...] in ``HELD``'s order
        (sorted by key; a block has one entry per key). ``label`` is None
        for none, and from a sidecar before version 5."""
        return p.parse_held_locks(self._call("HELD", 0.0))

    def raw(self, line: str) -> str:
        """Send one request *line* as is and return the reply line verbatim.

        A low-level escape hatch for debugging and tests: no argument checks
        beyond "one non-empty line", no reply mapping. A lock acquired this
        way still belongs to this connection.
        """
        return self._call(p.check_raw(line), p.MAX_WAIT + p.RELEASE_DEADLINE)

    def acquire_permit(
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
        token, _, _, slot = self._grant((key,), lease, wait, False, on_queued, label, on_position, True)
        assert slot is not None
        return p.Permit(key, token, slot)

    def set_permits(self, key: str, n: int) -> None:
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
        conn = self._connection()
        p.check_permits_version(self._hello(conn), self.path)
        p.parse_permits(self._call(line, p.RELEASE_DEADLINE, conn=conn))

    def lock_permit(
        self,
        key: str,
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> "Lock":
        """A :class:`Lock` holding one permit of the semaphore *key*
        (see :meth:`acquire_permit`)::

            permit = client.lock_permit("checkout", lease=30, wait=60)
            with permit as token:
                ...  # permit.slot; fence writes under permit.fence_key ("checkout <slot>")

        As for :meth:`lock`, entering yields the token; the slot and
        ``fence_key`` are on the object. Acquired on entry, released (by its
        token) on exit, renewed on the grant and lost exactly as a lock.
        """
        return Lock._of(self, p.LockState.of_permit(key, lease, wait, on_queued, label, on_position))

    def lock(
        self,
        key: str,
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> "Lock":
        """A :class:`Lock` on *key*, to use as a context manager::

            with client.lock("seats/42", lease=30, wait=5) as token:
                ...  # critical section; use token for fencing writes

        The arguments are checked now; the lock is acquired on entry and
        released on exit, also when the block raises. *on_queued*,
        *on_position* and *label* (the lock's :attr:`Lock.label`): see
        :meth:`acquire`.
        """
        return Lock._of(self, p.LockState.of_key(key, lease, wait, on_queued, label, on_position))

    def lock_block(
        self,
        keys: Iterable[str],
        lease: int = 30,
        wait: p.Number = 5,
        *,
        on_queued: Optional[Callable[[], object]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[[p.Position], object]] = None,
    ) -> "Lock":
        """A :class:`Lock` on a seat block (see :meth:`acquire_block`), to
        use as a context manager::

            with client.lock_block(["seat/1", "seat/2"], lease=30, wait=5) as token:
                ...  # every key is held under token; fence each key's writes with it

        The arguments are checked now; the block is acquired on entry and
        released (every key) on exit, also when the body raises.
        *on_queued*, *on_position* and *label*: see :meth:`acquire`.
        """
        return Lock._of(self, p.LockState.of_block(keys, lease, wait, on_queued, label, on_position))

    def _compensator(self, key: str) -> Callable[[Future], None]:
        """Callback for an acquire the caller gave up on: release a late grant."""

        def release_late_grant(fut: Future) -> None:
            if fut.cancelled() or fut.exception() is not None:
                return
            line = p.late_grant_release(key, fut.result())
            conn = self._conn
            if line is None or conn is None or not conn.alive:
                return
            try:
                conn.submit(line, self._budget(p.RELEASE_DEADLINE))  # reply ignored
            except TicketingError:
                pass  # connection gone: the sidecar released it with the session

        return release_late_grant


class Lock(p.LockView):
    """A lock on one key, on a seat block, or one permit of a semaphore key
    (``slot``, ``fence_key``), through a :class:`Client`; see
    :meth:`Client.lock`, :meth:`Client.lock_block` and
    :meth:`Client.lock_permit`.

    Use once: ``with lock as token:``, or :meth:`acquire` then
    :meth:`release`. ``keys`` lists every key (one for :meth:`Client.lock`);
    ``key`` is the first.

    While held, the lock knows when it stops being safe to use: :attr:`lost`
    (a :class:`threading.Event`) is set, once, at the first of

    * the sidecar's ``! LOST`` event for its token (:attr:`lost_reason`
      ``"expired"``, ``"moved"``, ``"compensated"`` or ``"revoked"``: an
      operator revoked it, and from a version-9 sidecar
      :attr:`revoked_by` and :attr:`revoke_reason` say who and why);
    * the local validity deadline: the send time of the ``ACQUIRE`` (or of
      the last successful :meth:`extend`) + lease − margin, margin = 250 ms
      + 1 % of the lease (``"deadline"``); it holds even when no event can
      arrive (a dropped notice, a sidecar without events);
    * the loss of the connection to the sidecar (``"disconnected"``).

    A sidecar event after ``deadline`` or ``disconnected`` replaces the
    reason (it is the more definite news). A released lock never fires.

    The decisions are :class:`ticketing._protocol.LockState`'s; this class
    adds the mutex, the Event and the timer.
    """

    def __init__(
        self,
        client: Client,
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
    def _of(cls, client: Client, state: p.LockState) -> "Lock":
        lock = cls.__new__(cls)
        lock._init(client, state)
        return lock

    def _init(self, client: Client, state: p.LockState) -> None:
        self.client = client
        #: Set, once, when the lock is lost (see the class docs).
        self.lost = threading.Event()
        self._state = state
        self._mu = threading.Lock()
        self._conn: Optional[_Connection] = None
        self._timer: Optional[list] = None

    def remaining(self) -> float:
        """Seconds of local validity left: the deadline (send time + lease −
        margin) minus now; 0 once lost, or before the lock is acquired.

        Exact even when the timer thread has not run yet (after a stall):
        a deadline found passed here fires :attr:`lost` at once."""
        self._check_deadline()
        with self._mu:
            return self._state.remaining(time.monotonic())

    def acquire(self) -> int:
        """Acquire the lock (see :meth:`Client.acquire`); return the token."""
        st = self._state
        st.begin_acquire()
        token, sent, conn, slot = self.client._grant(
            st.keys, st.lease, st.wait, st.block, st.on_queued, st.label, st.on_position, st.permit
        )
        st.slot = slot  # before anyone sees the lock held
        with self._mu:
            deadline = st.granted(token, sent)
            self._conn = conn
        # Registered before the renewal: a ``! LOST`` event, the
        # connection's end or a Client.release of this token while the
        # EXTEND is under way reaches the lock (_arm then arms nothing).
        conn.register(self)
        gone = False
        with self._mu:
            line = st.renewal_line(deadline, time.monotonic())
        if line is not None:
            # Recorded like any extend: until the sidecar answers it, a
            # later extend's OK stays at most its end (it may apply late).
            with self._mu:
                ext = st.begin_extend(st.lease, time.monotonic())
            reply: Optional[str] = None
            e_sent = time.monotonic()
            try:
                reply, e_sent, _ = self.client._call_at(
                    line, p.RELEASE_DEADLINE, None, conn, on_done=lambda _: self._extend_answered(ext)
                )
            except TicketingError:
                pass  # no answer: the ACQUIRE's deadline stays
            finally:
                with self._mu:
                    st.finish_extend(ext)
            deadline, gone = st.renewed(reply, e_sent, deadline)
        self._arm(deadline)
        if gone:
            self._lose(p.REASON_MOVED, True)
        return token

    def extend(self, lease: int) -> None:
        """Renew the lease: *lease* whole seconds (1..250) from now, same
        token, the keys' queues untouched (``EXTEND``). On success the local
        deadline moves to this call's send time + *lease* − margin, at most
        the send time + lease − margin of every other EXTEND of this lock
        that ran at the same time, whatever became of it: the sidecar runs
        them concurrently, so either may have applied last.

        From the send on, and after any outcome but success or a definite
        loss (an error, a timeout, an exception), the local deadline is the
        earlier of the previous one and this call's send time + *lease* −
        margin: the extend may have applied, and on a cluster below
        version 10 a lease shorter than what was left ends the lock (and
        hands the keys on) before the previous deadline. For an extend that lengthens the lease that is the
        previous deadline.

        :raises ValueError, TypeError: invalid *lease* (nothing sent).
        :raises LockLostError: the lock is already lost (nothing sent), or
            it was lost while the EXTEND was under way.
        :raises ServerError: ``ERR`` from the sidecar; ``not_held``,
            ``token_mismatch`` and ``owner_mismatch`` mean the lock is gone
            (its :attr:`lost` is set, reason ``"moved"``).
        :raises IndeterminateError: no definite reply; count on the earlier
            deadline above (the previous one for a longer lease).
        :raises RuntimeError: the lock is not held (not acquired, or released).
        """
        self._check_deadline()
        with self._mu:
            line = self._state.extend_line(lease)
            conn = self._conn
        if conn is None:
            raise self._state.lost_error()
        if conn.on_reader_thread():
            # From an on_queued or on_position callback: the reader would
            # have to read the very reply this waits for. Refused before the
            # EXTEND's cap lowers the deadline, since nothing is sent.
            raise RuntimeError("an on_queued or on_position callback must not wait for a reply of the same client")
        with self._mu:
            ext = self._state.begin_extend(lease, time.monotonic())
        try:
            self._arm_capped(ext.cap)
            reply, sent, _ = self.client._call_at(
                line, p.RELEASE_DEADLINE, None, conn, on_done=lambda _: self._extend_answered(ext)
            )
            with self._mu:
                err, fire = self._state.extend_replied(reply)
                ok = err is None and self._state.extended(lease)
            if fire:
                self._fire()
            if err is not None:
                raise err
            if not ok:
                raise self._state.lost_error()
            # The deadline is computed where it is armed, under the one
            # mutex hold: computed before and armed after, it would lift the
            # cap of another thread's EXTEND begun in between (issue 39,
            # attack round 5). An EXTEND answered meanwhile still caps it
            # until this call is finished (LockState.settle_extend).
            self._arm_with(lambda: self._state.extended_deadline(ext, sent, lease))
        finally:
            with self._mu:
                self._state.finish_extend(ext)

    def _extend_answered(self, ext: p.Extend) -> None:
        with self._mu:
            self._state.settle_extend(ext)

    def release(self) -> None:
        """Release the lock, every key of a block (see :meth:`Client.release`).

        Sends ``RELEASE`` also after the lock was lost (one lost only to the
        local deadline may still be held, and releasing it frees the keys
        sooner) and reports the reply as it is (``not_held`` after a loss).
        From here on the lost signal does not fire."""
        with self._mu:
            token = self._state.begin_release()
        self._check_deadline()
        with self._mu:
            self._state.released = True
            conn, timer, self._timer = self._conn, self._timer, None
        if conn is not None:
            conn.timers.cancel(timer)
            conn.unregister(self)
        self.client.release(self.key, token)

    def _released_by_client(self) -> None:
        """``Client.release`` of this lock's key and token: released, its
        signal stops."""
        with self._mu:
            self._state.released = True
            conn, timer, self._timer = self._conn, self._timer, None
        if conn is not None:
            conn.timers.cancel(timer)

    def __enter__(self) -> int:
        return self.acquire()

    def __exit__(self, exc_type: object, exc: Optional[BaseException], tb: object) -> None:
        """Release the lock; then, if it was lost while held, raise
        :class:`LockLostError` (chained to the release's error, if any).

        When the body raised, its exception goes on unchanged: a loss is not
        allowed to mask it (it is often its consequence, e.g. a stale fenced
        write). The loss is still on :attr:`lost` / :attr:`lost_reason`, and
        on Python 3.11+ a note on the exception tells of it. Release errors
        are dropped in that case, as before.
        """
        release_err: Optional[TicketingError] = None
        if self._state.token is not None:  # else released inside the block
            try:
                self.release()
            except TicketingError as e:
                # A failed release after a clean body is raised: the lock
                # may have been lost during the section.
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
        """Move the local deadline to *deadline* and (re)start its timer."""
        self._arm_with(lambda: deadline)

    def _arm_capped(self, cap: float) -> None:
        """Lower the local deadline to *cap* if that is earlier (an EXTEND
        in flight)."""
        self._arm_with(lambda: self._state.capped(cap))
        self._check_deadline()  # a cap already passed fires now

    def _arm_with(self, deadline_of: Callable[[], float]) -> None:
        with self._mu:
            conn, old = self._conn, self._timer
            deadline = deadline_of()
            if conn is None or not self._state.arm(deadline):
                return
            conn.timers.cancel(old)
            self._timer = conn.timers.call_at(deadline, self._check_deadline)

    def _check_deadline(self) -> None:
        with self._mu:
            due = self._state.due(time.monotonic())
        if due:
            self._lose(p.REASON_DEADLINE, False)

    def _lose(
        self, reason: str, from_sidecar: bool, revoked_by: Optional[str] = None, revoke_reason: Optional[str] = None
    ) -> None:
        with self._mu:
            fire = self._state.lose(reason, from_sidecar, revoked_by, revoke_reason)
        if fire:
            self._fire()

    def _fire(self) -> None:
        with self._mu:
            conn, timer, self._timer = self._conn, self._timer, None
        if conn is not None:
            conn.timers.cancel(timer)
        self.lost.set()

    def __repr__(self) -> str:
        return f"<ticketing.Lock {self._state.describe()}>"
