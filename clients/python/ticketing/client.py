"""Blocking, thread-safe client of the Ticketing sidecar's unix socket."""

from __future__ import annotations

import collections
import heapq
import itertools
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as _FutureTimeout
from typing import Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

from . import _protocol as p
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

__all__ = ["Client", "Lock"]

# How much longer than the sidecar's own bound a reply may take before the
# client stops waiting and reports IndeterminateError.
DEFAULT_REPLY_GRACE = 10.0

# How many `! LOST` events naming a token no lock object is registered for
# are remembered: a grant's lock object registers after its reply has been
# read, so the reader may see the lock's event first (a very short lease).
_UNCLAIMED_EVENTS = 1024


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


class _Connection:
    """One unix-socket connection (= one sidecar session).

    Requests are written under ``_lock`` and their futures queued in the
    same order; one reader thread pairs each reply line with the oldest
    pending future (the sidecar answers in request order). The first
    request is ``HELLO 3 events``; lines starting with ``!`` are events, never
    replies: the reader hands ``! LOST`` to the lock object registered under
    its token and ignores every other event line.

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
        # (future, local deadline or None)
        self._pending: Deque[Tuple[Future, Optional[float]]] = collections.deque()
        self._tail_deadline: Optional[float] = None
        self._error: Optional[SidecarConnectionError] = None
        #: The protocol version HELLO agreed on this connection (None: not
        #: known yet).
        self.version: Optional[int] = None
        #: True once the sidecar agreed to send event lines.
        self.events = False
        #: The error line a sidecar answered the first HELLO with when it
        #: refuses the connection (``ERR forbidden``, ``too_many_connections``).
        self.refused: Optional[str] = None
        self._locks: Dict[int, "Lock"] = {}
        self._unclaimed: "collections.OrderedDict[int, str]" = collections.OrderedDict()
        self.timers = _Timers(f"ticketing-timers {path}")
        # Pipelined before anything else, written before the reader starts
        # so that a refusal sent on connect is read as HELLO's reply.
        self.hello_fut, _, _ = self.submit(p.HELLO_EVENTS_LINE, None)
        self.hello_fut.add_done_callback(self.settle_hello)
        self._reader = threading.Thread(target=self._read_loop, name=f"ticketing-reader {path}", daemon=True)
        self._reader.start()

    def settle_hello(self, fut: Future) -> None:
        """Take the version and the events option from the first HELLO's
        reply (idempotent; the reader thread runs it as the reply arrives)."""
        if fut.cancelled() or fut.exception() is not None:
            return
        reply = fut.result()
        try:
            version, events = p.parse_hello_reply(reply)
        except ServerError as e:
            # bad_request: a version-2 sidecar, which knows no events (the
            # version is asked with a plain HELLO when a block needs it).
            if e.code != "bad_request":
                self.refused = reply
            return
        except ProtocolError:
            return
        self.version, self.events = version, events

    @property
    def alive(self) -> bool:
        return self._error is None

    def submit(self, line: str, budget: Optional[float]) -> Tuple[Future, Optional[float], float]:
        """Write *line*; return its reply future, the local deadline and the
        send time (monotonic).

        *budget* is how long the sidecar may take for this request alone
        (None: unbounded). Replies come in order, so the deadline is never
        earlier than that of the request ahead of it.
        """
        data = (line + "\n").encode("utf-8")
        fut: Future = Future()
        with self._lock:
            if self._error is not None:
                raise self._error
            sent = time.monotonic()
            deadline = None
            if budget is not None:
                deadline = sent + budget
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
        return fut, deadline, sent

    def register(self, lock: "Lock") -> None:
        """Route ``! LOST`` events of *lock*'s token to it from now on; an
        event for it already read, or a connection already lost, fires its
        signal at once."""
        token = lock.held_token
        assert token is not None
        with self._lock:
            if self._error is None:
                reason = self._unclaimed.pop(token, None)
                if reason is None:
                    self._locks[token] = lock
                    return
                sidecar = True
            else:
                reason, sidecar = p.REASON_DISCONNECTED, False
        lock._lose(reason, sidecar)

    def unregister(self, lock: "Lock") -> None:
        with self._lock:
            if self._locks.get(lock.held_token) is lock:  # type: ignore[arg-type]
                del self._locks[lock.held_token]  # type: ignore[arg-type]

    def _on_event(self, line: str) -> None:
        ev = p.parse_event(line)
        if ev is None:
            return  # an event of a later version, or malformed: ignored
        with self._lock:
            lock = self._locks.pop(ev.token, None)
            if lock is None:
                self._unclaimed[ev.token] = ev.reason
                while len(self._unclaimed) > _UNCLAIMED_EVENTS:
                    self._unclaimed.popitem(last=False)
                return
        lock._lose(ev.reason, True)

    def _read_loop(self) -> None:
        f = self._sock.makefile("rb")
        err: Optional[SidecarConnectionError] = None
        try:
            while True:
                raw = f.readline()
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
            self.timers.close()
        while self._pending:
            fut, _ = self._pending.popleft()
            if not fut.done():
                fut.set_exception(err)
        # The session is gone: the sidecar releases its locks (or, if the
        # sidecar died, their leases run out). Either way they are lost.
        locks = list(self._locks.values())
        self._locks.clear()
        for lock in locks:
            lock._lose(p.REASON_DISCONNECTED, False)

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
        """How many requests this client has written so far (all connections),
        not counting the ``HELLO 3 events`` each connection starts with."""
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
        return self._call_at(line, sidecar_bound, on_late, conn)[0]

    def _call_at(
        self,
        line: str,
        sidecar_bound: float,
        on_late: Optional[Callable[[Future], None]] = None,
        conn: Optional[_Connection] = None,
    ) -> Tuple[str, float, _Connection]:
        """:meth:`_call` that also returns the send time and the connection
        (a lock's validity counts from the send time)."""
        if conn is None:
            conn = self._connection()
        fut, deadline, sent = conn.submit(line, self._budget(sidecar_bound))
        with self._lock:
            self._sent += 1
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return fut.result(timeout), sent, conn
        except _FutureTimeout:
            if on_late is not None:
                fut.add_done_callback(on_late)
            raise IndeterminateError(f"no reply from the sidecar within {timeout:.1f} s") from None

    def _grant(self, keys: Sequence[str], lease: int, wait: p.Number, block: bool) -> Tuple[int, float, _Connection]:
        """ACQUIRE one key or a block; the token, the send time and the
        connection that holds it."""
        if block:
            keys = p.check_keys(keys)
            line, wait_s = p.acquire_block_line(keys, lease, wait)
        else:
            line, wait_s = p.acquire_line(keys[0], lease, wait)
        conn = self._connection()
        if block and len(keys) > 1:
            self._require_blocks(conn)
        reply, sent, conn = self._call_at(line, wait_s, self._compensator(keys[0]), conn)
        return p.parse_acquire(reply), sent, conn

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
        return self._grant((key,), lease, wait, False)[0]

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
        return self._grant(p.check_keys(keys), lease, wait, True)[0]

    def hello(self) -> int:
        """The protocol version this client and the sidecar both speak: the
        reply to the ``HELLO 3 events`` every connection starts with (a
        version-2 sidecar, which refuses the events option, is asked again
        with a plain ``HELLO``); 1 for a version-1 sidecar, which does not
        know ``HELLO``."""
        return self._hello(self._connection())

    def _hello(self, conn: _Connection) -> int:
        if conn.version is None:
            try:
                conn.hello_fut.result(self._budget(0.0))
            except _FutureTimeout:
                raise IndeterminateError("no reply from the sidecar to HELLO") from None
            conn.settle_hello(conn.hello_fut)
        if conn.version is None:
            if conn.refused is not None:
                p.parse_hello(conn.refused)  # raises the refusal's ServerError
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

    While held, the lock knows when it stops being safe to use: :attr:`lost`
    (a :class:`threading.Event`) is set, once, at the first of

    * the sidecar's ``! LOST`` event for its token (:attr:`lost_reason`
      ``"expired"``, ``"moved"`` or ``"compensated"``);
    * the local validity deadline: the send time of the ``ACQUIRE`` (or of
      the last successful :meth:`extend`) + lease − margin, margin = 250 ms
      + 1 % of the lease (``"deadline"``); it holds even when no event can
      arrive (a dropped notice, a sidecar without events);
    * the loss of the connection to the sidecar (``"disconnected"``).

    A sidecar event after ``deadline`` or ``disconnected`` replaces the
    reason (it is the more definite news). A released lock never fires.
    """

    def __init__(
        self, client: Client, key: str, lease: int, wait: p.Number, *, keys: Optional[Sequence[str]] = None
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
        #: Set, once, when the lock is lost (see the class docs).
        self.lost = threading.Event()
        #: The token granted, kept after release (for LockLostError).
        self.held_token: Optional[int] = None
        self._used = False
        self._mu = threading.Lock()
        self._state = p.LostState()
        self._conn: Optional[_Connection] = None
        self._deadline: Optional[float] = None  # monotonic
        self._timer: Optional[list] = None

    @property
    def lost_reason(self) -> Optional[str]:
        """None while not lost; else why (see the class docs)."""
        return self._state.reason

    def remaining(self) -> float:
        """Seconds of local validity left: the deadline (send time + lease −
        margin) minus now; 0 once lost, or before the lock is acquired.

        Exact even when the timer thread has not run yet (after a stall):
        a deadline found passed here fires :attr:`lost` at once."""
        self._check_deadline()
        with self._mu:
            if self._state.reason is not None or self._deadline is None or self._state.released:
                return 0.0
            return max(0.0, self._deadline - time.monotonic())

    def acquire(self) -> int:
        """Acquire the lock (see :meth:`Client.acquire`); return the token."""
        if self._used:
            raise RuntimeError("a Lock is used once; call client.lock() again")
        self._used = True
        token, sent, conn = self.client._grant(self.keys, self.lease, self.wait, self._block)
        self.token = self.held_token = token
        with self._mu:
            self._conn = conn
        self._arm(sent + p.validity(self.lease))
        conn.register(self)
        return token

    def extend(self, lease: int) -> None:
        """Renew the lease: *lease* whole seconds (1..250) from now, same
        token, the keys' queues untouched (``EXTEND``). On success the local
        deadline moves to this call's send time + *lease* − margin.

        :raises ValueError, TypeError: invalid *lease* (nothing sent).
        :raises LockLostError: the lock is already lost (nothing sent), or
            it was lost while the EXTEND was under way.
        :raises ServerError: ``ERR`` from the sidecar; ``not_held``,
            ``token_mismatch`` and ``owner_mismatch`` mean the lock is gone
            (its :attr:`lost` is set, reason ``"moved"``).
        :raises IndeterminateError: no definite reply; count on the previous
            deadline, which stays.
        :raises RuntimeError: the lock is not held (not acquired, or released).
        """
        p.check_lease(lease)
        token = self.token
        if token is None:
            raise RuntimeError("the lock is not held")
        line = p.extend_line(self.key, token, lease)
        self._check_deadline()
        conn = self._conn
        if self._state.reason is not None or conn is None:
            raise self._lost_error()
        reply, sent, _ = self.client._call_at(line, p.RELEASE_DEADLINE, None, conn)
        try:
            p.parse_extend(reply)
        except ServerError as e:
            if e.code in p.EXTEND_LOST_CODES:
                self._lose(p.REASON_MOVED, True)  # the sidecar's event came first, if events are on
            raise
        with self._mu:
            ok = self._state.reason is None and not self._state.released
            if ok:
                self.lease = lease
        if not ok:
            # Lost (its deadline, or the connection) while the EXTEND was
            # under way: the signal has fired and stays fired.
            raise self._lost_error()
        self._arm(sent + p.validity(lease))

    def release(self) -> None:
        """Release the lock, every key of a block (see :meth:`Client.release`).

        Sends ``RELEASE`` also after the lock was lost (one lost only to the
        local deadline may still be held, and releasing it frees the keys
        sooner) and reports the reply as it is (``not_held`` after a loss).
        From here on the lost signal does not fire."""
        if self.token is None:
            raise RuntimeError("the lock is not held")
        token, self.token = self.token, None
        self._check_deadline()
        with self._mu:
            self._state.released = True
            conn, timer, self._timer = self._conn, self._timer, None
        if conn is not None:
            conn.timers.cancel(timer)
            conn.unregister(self)
        self.client.release(self.key, token)

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
        if self.token is not None:  # else released inside the block
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
        self._state.after_exit(exc, self.held_token, self.keys, release_err)

    # -- the lost signal --------------------------------------------------------

    def _lost_error(self) -> LockLostError:
        return self._state.lost_error(self.held_token, self.keys)

    def _arm(self, deadline: float) -> None:
        """Move the local deadline to *deadline* and (re)start its timer."""
        with self._mu:
            if self._state.reason is not None or self._state.released or self._conn is None:
                return
            conn, old = self._conn, self._timer
            self._deadline = deadline
            conn.timers.cancel(old)
            # The timer only prompts a check against the current deadline,
            # so a late or stale one can never fire a renewed lock.
            self._timer = conn.timers.call_at(deadline, self._check_deadline)

    def _check_deadline(self) -> None:
        with self._mu:
            due = self._deadline is not None and time.monotonic() >= self._deadline
        if due:
            self._lose(p.REASON_DEADLINE, False)

    def _lose(self, reason: str, from_sidecar: bool) -> None:
        with self._mu:
            fire = self._state.lose(reason, from_sidecar)
            conn, timer = self._conn, self._timer
            if fire:
                self._timer = None
        if fire:
            if conn is not None:
                conn.timers.cancel(timer)
            self.lost.set()

    def __repr__(self) -> str:
        if self.token is None:
            state = "not held"
        else:
            state = f"token={self.token}"
            if self._state.reason is not None:
                state += f" lost={self._state.reason}"
        keys = " ".join(repr(k) for k in self.keys)
        return f"<ticketing.Lock {keys} {state}>"
