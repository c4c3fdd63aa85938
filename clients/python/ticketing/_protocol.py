"""The sans-IO core of both clients: every decision of the sidecar's line
protocol, and no I/O.

In the style of h11 and wsproto: no sockets, no threads, no asyncio. The
shells, :mod:`ticketing.client` (a socket and a reader thread) and
:mod:`ticketing.aio` (an asyncio stream and a reader task), write the bytes
this module formats, feed it the bytes they read, and carry out what it
decides: which future a reply line answers, which ``on_queued`` callback a
``! QUEUED`` event calls and which ``on_position`` callback a ``! POSITION``
event calls, which lock object a ``! LOST`` event reaches, what a lost
connection fails. So a fix of the protocol lands here, once.

- Argument checks and request lines: :func:`acquire_line`,
  :func:`release_line`, ... (raise ``ValueError`` / ``TypeError`` before
  anything is sent).
- Reply classification: :func:`parse_acquire`, :func:`parse_release`, ...
  (map a reply line to a value or to the exception it stands for).
- One connection: :class:`Session` (request positions, pending requests
  and their deadlines, reply matching, event routing, the HELLO decision,
  teardown).
- One lock object: :class:`LockState` (token, local deadline, lost
  decision, extend outcome).

See unixapi/PROTOCOL.md in the Ticketing repository for the contract.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from decimal import Decimal
from numbers import Real
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from .errors import (
    BusyError,
    IndeterminateError,
    LockLostError,
    LockTimeoutError,
    NoDomainError,
    NotSupportedError,
    ProtocolError,
    SERVER_ERRORS,
    ServerError,
    SidecarConnectionError,
    TicketingError,
    describe_loss,
)

#: The version of unixapi/PROTOCOL.md this client speaks (2: seat blocks,
#: HELLO; 3: EXTEND and the ``! LOST`` event lines; 4: the ``! QUEUED``
#: event line; 5: owner labels; 6: waits up to an hour; 7: the
#: ``! POSITION`` event line; 8: semaphores, ``PERMIT`` and ``PERMITS``;
#: 9: the ``! REVOKED`` event line, who revoked a lock and why).
PROTOCOL_VERSION = 9
#: The protocol version of ``PERMIT`` and ``PERMITS`` (semaphores).
PERMIT_VERSION = 8
#: The most permits of one semaphore key (``set_permits``).
MAX_PERMITS = 100000
#: The longest owner label (``label=``) in bytes (version 5).
MAX_LABEL_LEN = 64
#: The most keys of one block acquire (distinct keys).
MAX_BLOCK_KEYS = 16

#: Lease bounds, whole seconds.
MIN_LEASE, MAX_LEASE = 1, 250
#: Longest wait, seconds (millisecond precision): an hour, from a sidecar
#: of protocol version 6 (:data:`MAX_SHORT_WAIT` before).
MAX_WAIT = 3600
#: Longest wait a sidecar older than protocol version 6 takes, seconds.
MAX_SHORT_WAIT = 300
#: Longest key, bytes (each 0x21..0x7E).
MAX_KEY_LEN = 255
#: Largest fencing token (u64).
MAX_TOKEN = 2**64 - 1
#: The sidecar rejects (and closes on) request lines longer than this
#: (protocol version 2; version 1: 1024).
MAX_LINE = 4608
#: The sidecar gives up on a release 5 s after it was asked.
RELEASE_DEADLINE = 5.0
#: Environment variable naming the socket, and the fallback path.
SOCKET_ENV = "TICKETING_SOCKET"
DEFAULT_SOCKET = "./ticketing.sock"

Number = Union[int, float, Decimal]


def _decimal(text: str, max_digits: int = 20) -> Optional[int]:
    """*text* as a non-negative int if it is 1..max_digits ASCII digits, else
    None (``int()`` alone takes signs, spaces, underscores and non-ASCII
    digits, and raises ValueError on thousands of digits)."""
    if 1 <= len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def default_path(path: Optional[str]) -> str:
    """Return *path*, else ``$TICKETING_SOCKET``, else ``./ticketing.sock``."""
    if path:
        return os.fspath(path)
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def check_key(key: str) -> str:
    """Validate a lock key: 1..255 bytes, each 0x21..0x7E (no spaces)."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    if not 1 <= len(key) <= MAX_KEY_LEN:
        raise ValueError(f"key must be 1..{MAX_KEY_LEN} characters long, got {len(key)}")
    for i, ch in enumerate(key):
        if not "\x21" <= ch <= "\x7e":
            raise ValueError(
                f"key may contain only printable ASCII without spaces (0x21..0x7E); "
                f"character {i} is {ch!r}"
            )
    return key


def check_lease(lease: int) -> int:
    """Validate a lease: whole seconds, 1..250."""
    if isinstance(lease, bool) or not isinstance(lease, int):
        raise TypeError(f"lease must be an int number of seconds, not {type(lease).__name__} {lease!r}")
    if not MIN_LEASE <= lease <= MAX_LEASE:
        raise ValueError(f"lease must be {MIN_LEASE}..{MAX_LEASE} seconds, got {lease}")
    return lease


def wait_millis(wait: Number) -> int:
    """Validate a wait (seconds, 0..3600, at most millisecond precision) and
    return it in whole milliseconds."""
    if isinstance(wait, bool) or not isinstance(wait, (Real, Decimal)):
        raise TypeError(f"wait must be a number of seconds, not {type(wait).__name__} {wait!r}")
    if isinstance(wait, Decimal):
        if not wait.is_finite():
            raise ValueError(f"wait must be finite, got {wait}")
        exact = wait * 1000
        ms = int(exact)
        if exact != ms:
            raise ValueError(f"wait has at most millisecond precision, got {wait}")
    elif isinstance(wait, int):
        ms = wait * 1000
    else:
        f = float(wait)
        if not math.isfinite(f):
            raise ValueError(f"wait must be finite, got {wait!r}")
        ms = round(f * 1000)
        if abs(f * 1000 - ms) > 1e-6:
            raise ValueError(f"wait has at most millisecond precision, got {wait!r}")
    if not 0 <= ms <= MAX_WAIT * 1000:
        raise ValueError(f"wait must be 0..{MAX_WAIT} seconds, got {wait!r}")
    return ms


def format_wait(ms: int) -> str:
    """Render milliseconds as the protocol's seconds: ``5``, ``0.25``, ``1.005``."""
    whole, frac = divmod(ms, 1000)
    return str(whole) if frac == 0 else f"{whole}.{frac:03d}".rstrip("0")


def check_token(token: int) -> int:
    """Validate a fencing token: an int in 1..2**64-1."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be an int, not {type(token).__name__} {token!r}")
    if not 1 <= token <= MAX_TOKEN:
        raise ValueError(f"token must be 1..2**64-1, got {token}")
    return token


def check_raw(line: str) -> str:
    """Validate a raw request line (see ``Client.raw``)."""
    if not isinstance(line, str):
        raise TypeError(f"line must be a str, not {type(line).__name__}")
    if not line or "\n" in line:
        raise ValueError("a raw line must be non-empty and must not contain a newline")
    return line


def acquire_line(key: str, lease: int, wait: Number) -> "tuple[str, float]":
    """Check the arguments; return the ACQUIRE line and the wait in seconds."""
    check_key(key)
    check_lease(lease)
    ms = wait_millis(wait)
    return f"ACQUIRE {key} {lease} {format_wait(ms)}", ms / 1000.0


def check_keys(keys: Iterable[str]) -> List[str]:
    """Validate the keys of a block: 1..16 distinct keys, each a valid key;
    return them as a list."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"keys must be a list of str, not a single {type(keys).__name__} {keys!r}")
    try:
        out = list(keys)
    except TypeError:
        raise TypeError(f"keys must be a list of str, not {type(keys).__name__}") from None
    if not 1 <= len(out) <= MAX_BLOCK_KEYS:
        raise ValueError(f"a block has 1..{MAX_BLOCK_KEYS} keys, got {len(out)}")
    seen = set()
    for k in out:
        check_key(k)
        if k in seen:
            raise ValueError(f"key {k!r} named twice (the keys of a block are distinct)")
        seen.add(k)
    return out


def acquire_block_line(keys: List[str], lease: int, wait: Number) -> "tuple[str, float]":
    """Check the arguments; return the ACQUIRE line of a block and the wait
    in seconds. One key is the plain ACQUIRE."""
    keys = check_keys(keys)
    check_lease(lease)
    ms = wait_millis(wait)
    return f"ACQUIRE {' '.join(keys)} {lease} {format_wait(ms)}", ms / 1000.0


def hello_line() -> str:
    """The plain HELLO of this client's version. The clients send it only to
    learn the version of a sidecar that refused :data:`HELLO_EVENTS_LINE`
    (a version-2 sidecar): on a version-3 sidecar a plain HELLO would turn
    the connection's events off (the latest HELLO decides)."""
    return f"HELLO {PROTOCOL_VERSION}"


#: The first request of every connection: agree the version and turn the
#: event lines on (``! LOST`` from version 3, ``! QUEUED`` from version 4,
#: ``! POSITION`` from version 7, ``! REVOKED`` from version 9).
HELLO_EVENTS_LINE = f"HELLO {PROTOCOL_VERSION} events"


def parse_hello_reply(reply: str) -> Tuple[int, bool]:
    """``HELLO <v>`` → (v, False); ``HELLO <v> events`` → (v, True);
    ``ERR unknown_verb`` (a version-1 sidecar) → (1, False); anything else →
    the matching exception."""
    if reply.startswith("HELLO "):
        text, sep, opt = reply[6:].partition(" ")
        events = sep != ""
        if events and opt != "events":
            raise ProtocolError(f"bad HELLO reply {reply!r}")
        v = _decimal(text, 5)
        if v is not None and 1 <= v <= PROTOCOL_VERSION:
            if events and v < 3:
                raise ProtocolError(f"bad HELLO reply {reply!r} (no events before version 3)")
            return v, events
        raise ProtocolError(f"bad HELLO reply {reply!r}")
    err = _error_from(reply)
    if isinstance(err, ServerError) and err.code == "unknown_verb":
        return 1, False
    raise err


def parse_hello(reply: str) -> int:
    """``HELLO <v>`` (or ``HELLO <v> events``) → v; ``ERR unknown_verb`` (a
    version-1 sidecar) → 1; anything else → the matching exception."""
    return parse_hello_reply(reply)[0]


def release_line(key: str, token: int) -> str:
    """Check the arguments; return the RELEASE line."""
    check_key(key)
    check_token(token)
    return f"RELEASE {key} {token}"


def extend_line(key: str, token: int, lease: int) -> str:
    """Check the arguments; return the EXTEND line."""
    check_key(key)
    check_token(token)
    check_lease(lease)
    return f"EXTEND {key} {token} {lease}"


#: EXTEND's definite refusals that mean the lock is gone (the sidecar writes
#: ``! LOST <token> moved`` before such a reply when events are on).
EXTEND_LOST_CODES = frozenset({"not_held", "token_mismatch", "owner_mismatch"})


def lease_margin(lease: float) -> float:
    """The safety margin of the local validity deadline, seconds: 250 ms +
    1 % of the lease (clock drift between this host and the cluster, and the
    time from the leader's commit to the reply)."""
    return 0.25 + 0.01 * lease


def validity(lease: float) -> float:
    """How long after sending the ACQUIRE (or EXTEND) a lock counts as
    valid locally: the lease minus :func:`lease_margin`."""
    return lease - lease_margin(lease)


# Reasons a lock's lost signal reports. The first four come from the
# sidecar's event; the last two are the client's own.
REASON_EXPIRED = "expired"
REASON_MOVED = "moved"
REASON_COMPENSATED = "compensated"
#: An operator revoked the lock (``ticketing`` admin ``revoke``). From a
#: version-9 sidecar the ``! REVOKED`` line before the ``! LOST`` says who
#: and why (:attr:`LockView.revoked_by`, :attr:`LockView.revoke_reason`).
REASON_REVOKED = "revoked"
REASON_DEADLINE = "deadline"
REASON_DISCONNECTED = "disconnected"
#: Reasons the client decides on its own; a sidecar event after one of
#: these replaces it (it is the more definite news).
LOCAL_REASONS = frozenset({REASON_DEADLINE, REASON_DISCONNECTED})


class Extend:
    """One EXTEND of a lock (:meth:`LockState.begin_extend`)."""

    __slots__ = ("cap", "begun", "answered")

    def __init__(self, cap: float, begun: int) -> None:
        #: Its send time + lease − margin: the end of the lock if it
        #: applied last.
        self.cap = cap
        #: When it began, on the lock's extend clock.
        self.begun = begun
        #: When the sidecar answered it (or its connection ended), on the
        #: same clock; None until then.
        self.answered: Optional[int] = None


class LockState:
    """The sans-IO state of one lock object (``Lock``, ``AsyncLock``); the
    shells add the locking, the Event, the timer and the requests.

    The lost signal fires once, at the first loss; a sidecar event after a
    local reason (``deadline``, ``disconnected``) replaces the reported
    reason, being the more definite news; a released lock never fires. The
    local deadline is the send time of the ACQUIRE (or of the last
    successful EXTEND) + lease − :func:`lease_margin`, never later than
    the send time + lease − margin of an EXTEND in flight, of one whose
    outcome is not a success, or of one that ran at the same time as the
    EXTEND whose success set it (:meth:`begin_extend`). Times are the
    shell's clock (``time.monotonic()``, the loop's ``time()``).
    """

    __slots__ = ("keys", "block", "permit", "slot", "lease", "wait", "on_queued", "on_position", "label", "token", "held_token",
                 "used", "reason", "revoked_by", "revoke_reason", "released", "deadline", "extends", "_extend_clock", "_extending")

    def __init__(
        self,
        keys: Sequence[str],
        lease: int,
        wait: Number,
        block: bool,
        on_queued: Optional[Callable[[], Any]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[["Position"], Any]] = None,
        permit: bool = False,
    ) -> None:
        #: Every key of the lock (a block's keys, in the order given).
        self.keys: Tuple[str, ...] = tuple(keys)
        self.block = block
        #: A permit of a semaphore key (PERMIT), not a lock.
        self.permit = permit
        #: A permit's slot once granted (kept after release), else None.
        self.slot: Optional[int] = None
        #: The owner label the ACQUIRE carries (version 5), else None.
        self.label: Optional[str] = label or None
        #: The lease of the acquire, then of the last successful extend.
        self.lease = lease
        self.wait = wait
        self.on_queued = on_queued
        self.on_position = on_position
        #: The fencing token while held, else None.
        self.token: Optional[int] = None
        #: The token granted, kept after release (for LockLostError).
        self.held_token: Optional[int] = None
        self.used = False
        self.reason: Optional[str] = None
        #: Who revoked the lock and why (``! REVOKED``, version 9), with
        #: :attr:`reason` ``"revoked"``; else None.
        self.revoked_by: Optional[str] = None
        self.revoke_reason: Optional[str] = None
        self.released = False
        self.deadline: Optional[float] = None
        #: The EXTENDs that bound the deadline (:meth:`begin_extend`): those
        #: the sidecar has not answered, and those it answered while a call
        #: that ran at the same time is not finished.
        self.extends: List[Extend] = []
        #: Counts begins and answers of EXTENDs, to tell which ran at the
        #: same time.
        self._extend_clock = 0
        #: extend calls not finished (:meth:`finish_extend`).
        self._extending = 0

    @classmethod
    def of_key(
        cls,
        key: str,
        lease: int,
        wait: Number,
        on_queued: Optional[Callable[[], Any]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[["Position"], Any]] = None,
    ) -> "LockState":
        """The state of ``client.lock(key, ...)``; arguments checked now."""
        acquire_line(key, lease, wait)
        return cls((key,), lease, wait, False, check_on_queued(on_queued), check_label(label),
                   check_on_position(on_position))

    @classmethod
    def of_permit(
        cls,
        key: str,
        lease: int,
        wait: Number,
        on_queued: Optional[Callable[[], Any]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[["Position"], Any]] = None,
    ) -> "LockState":
        """The state of ``client.lock_permit(key, ...)``; arguments checked now."""
        permit_line(key, lease, wait, label)
        return cls((key,), lease, wait, False, check_on_queued(on_queued), check_label(label),
                   check_on_position(on_position), permit=True)

    @classmethod
    def of_block(
        cls,
        keys: Iterable[str],
        lease: int,
        wait: Number,
        on_queued: Optional[Callable[[], Any]] = None,
        label: Optional[str] = None,
        on_position: Optional[Callable[["Position"], Any]] = None,
    ) -> "LockState":
        """The state of ``client.lock_block(keys, ...)``; arguments checked now."""
        keys = check_keys(keys)
        acquire_block_line(keys, lease, wait)
        return cls(keys, lease, wait, True, check_on_queued(on_queued), check_label(label),
                   check_on_position(on_position))

    def begin_acquire(self) -> None:
        """A lock object is used once."""
        if self.used:
            raise RuntimeError("a lock object is used once; call client.lock() again")
        self.used = True

    def granted(self, token: int, sent: float) -> float:
        """Record the grant of an ACQUIRE sent at *sent*; its local deadline."""
        self.token = self.held_token = token
        return sent + validity(self.lease)

    def renewal_line(self, deadline: float, now: float) -> Optional[str]:
        """The EXTEND that renews a new grant before its caller has it, or
        None. The deadline counts from the ACQUIRE's send, so a grant that
        waited long comes with little of it left, or already lost (a wait
        can be an hour, a lease at most 250 s): a grant with less than half
        its validity (lease − margin) left is renewed once with its own
        lease first."""
        if deadline - now >= validity(self.lease) / 2 or self.token is None:
            return None
        if self.reason is not None or self.released:
            return None  # lost or released meanwhile (registered before the renewal)
        return extend_line(self.keys[0], self.token, self.lease)

    def renewed(self, reply: Optional[str], sent: float, deadline: float) -> Tuple[float, bool]:
        """The outcome of the grant's renewal sent at *sent* (*reply* None:
        no reply, an error): (the deadline, whether the lock is gone).
        ``OK`` proves through the log that the token still held the key
        when it applied, so the deadline counts from its send; a definite
        ``not_held`` (or a mismatch) means the lock is gone (``moved``);
        anything else leaves *deadline*, the ACQUIRE's."""
        if reply == "OK":
            return sent + validity(self.lease), False
        if reply is not None:
            try:
                parse_extend(reply)
            except ServerError as e:
                return deadline, e.code in EXTEND_LOST_CODES
            except TicketingError:
                pass
        return deadline, False

    def arm(self, deadline: float) -> bool:
        """Move the local deadline to *deadline*; False (nothing moved) once
        lost or released: the shell then starts no timer."""
        if self.reason is not None or self.released:
            return False
        self.deadline = deadline
        return True

    def due(self, now: float) -> bool:
        """True once the local deadline has passed (the shell then loses the
        lock with ``deadline``; a timer only prompts this check, so a late or
        stale timer never fires a renewed lock)."""
        return self.deadline is not None and now >= self.deadline

    def remaining(self, now: float) -> float:
        """Seconds of local validity left: 0 once lost, released, or before
        the grant."""
        if self.reason is not None or self.deadline is None or self.released:
            return 0.0
        return max(0.0, self.deadline - now)

    def lose(
        self,
        reason: str,
        from_sidecar: bool,
        revoked_by: Optional[str] = None,
        revoke_reason: Optional[str] = None,
    ) -> bool:
        """Record a loss; True when the signal must fire now (the first).
        *revoked_by* and *revoke_reason*: who revoked it and why (a
        ``revoked`` loss after a ``! REVOKED`` line), kept with the reason."""
        if self.released:
            return False
        if self.reason is None:
            self.reason, self.revoked_by, self.revoke_reason = reason, revoked_by, revoke_reason
            return True
        if from_sidecar and self.reason in LOCAL_REASONS:
            self.reason, self.revoked_by, self.revoke_reason = reason, revoked_by, revoke_reason
        return False

    def lost_error(self) -> LockLostError:
        """The error of a lost lock (``disconnected`` if no reason yet)."""
        return LockLostError(self.reason or REASON_DISCONNECTED, self.held_token, self.keys,
                             revoked_by=self.revoked_by, revoke_reason=self.revoke_reason)

    def lost_text(self) -> str:
        """The reason of the loss, for a note: ``revoked by alice: why`` when
        the sidecar said who revoked it."""
        return describe_loss(self.reason or REASON_DISCONNECTED, self.revoked_by, self.revoke_reason)

    def extend_line(self, lease: int) -> str:
        """Check an extend (arguments first; then the lock must be held, and
        not lost: the shell checks the deadline just before); its line."""
        check_lease(lease)
        if self.token is None:
            raise RuntimeError("the lock is not held")
        line = extend_line(self.keys[0], self.token, lease)
        if self.reason is not None:
            raise self.lost_error()
        return line

    def begin_extend(self, lease: int, now: float) -> "Extend":
        """Start an EXTEND of *lease* about to be sent at or after *now*:
        record it with its cap, ``now + validity(lease)``, and return it.
        Until the EXTEND is answered, and after any outcome but ``OK`` or a
        definite loss, the local deadline is at most the cap (the shell
        arms :meth:`capped`): the extend may have applied, and a lease
        shorter than what was left ends the lock before the previous
        deadline (issue 39). The shell calls :meth:`settle_extend` when the
        sidecar answers it (or its connection ends), even after the caller
        gave up waiting, and :meth:`finish_extend` when the call is over."""
        self._extend_clock += 1
        ext = Extend(now + validity(lease), self._extend_clock)
        self.extends.append(ext)
        self._extending += 1
        return ext

    def settle_extend(self, ext: "Extend") -> None:
        """The sidecar answered *ext*, or its connection ended (idempotent).
        Its cap still bounds the deadline an ``OK`` of an EXTEND that ran at
        the same time sets: the sidecar runs a connection's requests
        concurrently, so either may have applied last."""
        if ext.answered is None:
            self._extend_clock += 1
            ext.answered = self._extend_clock
            self._forget_extends()

    def finish_extend(self, ext: "Extend") -> None:
        """The extend call of *ext* is over: its deadline armed, or its
        error raised (the sidecar may not have answered yet)."""
        self._extending -= 1
        self._forget_extends()

    def _forget_extends(self) -> None:
        # An answered EXTEND bounds only calls under way when it was
        # answered; once none is, only the unanswered ones count.
        if self._extending == 0:
            self.extends = [e for e in self.extends if e.answered is None]

    def capped(self, deadline: float) -> float:
        """*deadline* lowered to every cap of an EXTEND that bounds the
        deadline, and to the current deadline if earlier: what the lock may
        count on now."""
        if self.deadline is not None:
            deadline = min(deadline, self.deadline)
        return min([deadline, *(e.cap for e in self.extends)])

    def extended_deadline(self, ext: "Extend", sent: float, lease: int) -> float:
        """The deadline after an ``OK`` to *ext*, an EXTEND of *lease* sent
        at *sent*: send time + validity, at most the cap of every other
        EXTEND that ran at the same time, whatever its outcome (one not
        answered yet, or answered after *ext* began)."""
        return min([sent + validity(lease),
                    *(e.cap for e in self.extends
                      if e is not ext and (e.answered is None or e.answered > ext.begun))])

    def extend_replied(self, reply: str) -> Tuple[Optional[Exception], bool]:
        """The outcome of an EXTEND's reply: (the error to raise or None,
        whether the lost signal must fire now). ``not_held``,
        ``token_mismatch`` and ``owner_mismatch`` mean the lock is gone
        (``moved``; the sidecar's event came first when events are on)."""
        try:
            parse_extend(reply)
        except TicketingError as e:
            fire = isinstance(e, ServerError) and e.code in EXTEND_LOST_CODES and self.lose(REASON_MOVED, True)
            return e, fire
        return None, False

    def extended(self, lease: int) -> bool:
        """Record a successful EXTEND of *lease*; False if the lock was lost
        (its deadline, the connection) or released while it was under way:
        the signal has fired and stays fired."""
        if self.reason is not None or self.released:
            return False
        self.lease = lease
        return True

    def begin_release(self) -> int:
        """Start a release: the token to release; from here on the lost
        signal does not fire."""
        if self.token is None:
            raise RuntimeError("the lock is not held")
        token, self.token = self.token, None
        return token

    def after_exit(self, exc: Optional[BaseException], release_err: Optional[BaseException]) -> None:
        """The end of leaving a lock's ``with`` block, once released:
        nothing if the lock was not lost; if the body raised, its exception
        goes on unchanged (with a note of the loss on Python 3.11+); else
        raise :class:`LockLostError`, from the release's error if any."""
        if self.reason is None:
            return
        if exc is not None:
            add_note = getattr(exc, "add_note", None)
            if add_note is not None:
                add_note(f"ticketing: the lock {' '.join(self.keys)} (token {self.held_token}) was lost: {self.lost_text()}")
            return
        raise self.lost_error() from release_err

    def describe(self) -> str:
        """The keys and state, for a lock object's repr."""
        if self.token is None:
            state = "not held"
        else:
            state = f"token={self.token}"
            if self.reason is not None:
                state += f" lost={self.reason}"
        return " ".join(repr(k) for k in self.keys) + " " + state


def check_on_queued(on_queued: Optional[Callable[[], Any]]) -> Optional[Callable[[], Any]]:
    """Validate an ``on_queued`` argument: None or a callable."""
    if on_queued is not None and not callable(on_queued):
        raise TypeError(f"on_queued must be a callable or None, not {type(on_queued).__name__}")
    return on_queued


def check_on_position(
    on_position: Optional[Callable[["Position"], Any]],
) -> Optional[Callable[["Position"], Any]]:
    """Validate an ``on_position`` argument: None or a callable."""
    if on_position is not None and not callable(on_position):
        raise TypeError(f"on_position must be a callable or None, not {type(on_position).__name__}")
    return on_position


def check_label(label: Optional[str]) -> Optional[str]:
    """Validate an owner label: None or "" (none), else 1..64 bytes of
    visible ASCII (0x21..0x7E), not ``-``."""
    if label is None or label == "":
        return None
    if not isinstance(label, str):
        raise TypeError(f"label must be a str or None, not {type(label).__name__}")
    if len(label) > MAX_LABEL_LEN or label == "-" or any(not 0x21 <= ord(ch) <= 0x7E for ch in label):
        raise ValueError(f"label {label!r}: 1..{MAX_LABEL_LEN} bytes of visible ASCII (0x21..0x7E), not '-'")
    return label


def check_labels(version: int, path: str) -> None:
    """An owner label needs protocol version 5 (never sent without it)."""
    if version < 5:
        raise NotSupportedError(
            f"an owner label needs protocol version 5; the sidecar at {path} speaks version {version}: "
            "upgrade the sidecar"
        )


def grant_line(
    keys: Sequence[str], lease: int, wait: Number, block: bool, label: Optional[str] = None, permit: bool = False
) -> Tuple[str, float, List[str]]:
    """Check an acquire of one key (*block* False: ``keys[0]``) or of a
    block, or with *permit* the PERMIT of ``keys[0]``, with its owner
    *label* (version 5) if any; return its line, its wait in seconds and
    its keys."""
    if permit:
        line, wait_s = permit_line(keys[0], lease, wait, label)
        return line, wait_s, [keys[0]]
    label = check_label(label)
    suffix = f" label={label}" if label else ""
    if block:
        ks = check_keys(keys)
        line, wait_s = acquire_block_line(ks, lease, wait)
        return line + suffix, wait_s, ks
    line, wait_s = acquire_line(keys[0], lease, wait)
    return line + suffix, wait_s, [keys[0]]


def reply_budget(sidecar_bound: float, grace: Optional[float]) -> Optional[float]:
    """How long a reply may take: the sidecar's own bound plus the client's
    grace; None (unbounded) without a grace."""
    return None if grace is None else sidecar_bound + grace


def late_grant_release(key: str, reply: str) -> Optional[str]:
    """For an acquire the caller gave up on (timed out, cancelled): the
    RELEASE line that frees a grant which came anyway, or None if the reply
    granted nothing."""
    try:
        # A permit's grant names its slot too: "OK <token> <slot>".
        token = parse_permit(reply)[0] if reply.count(" ") == 2 else parse_acquire(reply)
    except TicketingError:
        return None
    return release_line(key, token)


def check_wait(wait_s: float, version: int, path: str) -> None:
    """A wait over :data:`MAX_SHORT_WAIT` needs protocol version 6: an older
    sidecar would answer ``invalid_wait``, which reads as the caller's
    mistake (nothing is sent)."""
    if wait_s > MAX_SHORT_WAIT and version < 6:
        raise NotSupportedError(
            f"a wait over {MAX_SHORT_WAIT} s needs protocol version 6; the sidecar at {path} speaks version {version}: "
            "upgrade the sidecar"
        )


def check_blocks(version: int, path: str) -> None:
    """A block of 2+ keys needs protocol version 2."""
    if version < 2:
        raise NotSupportedError(
            f"a seat block needs protocol version 2; the sidecar at {path} speaks version {version}: "
            "upgrade the sidecar"
        )


def is_event(line: str) -> bool:
    """True for an event line: it starts with ``!``. No reply ever does, so
    such a line is never matched with a request, well-formed or not."""
    return line.startswith("!")


@dataclass(frozen=True)
class LostEvent:
    """A parsed ``! LOST <token> <reason> <key> [<key> ...]`` line."""

    token: int
    reason: str
    keys: Tuple[str, ...]


#: The longest ``<by>`` and ``<why>`` of a ``! REVOKED`` line, bytes.
MAX_REVOKED_BY = 128
MAX_REVOKE_REASON = 128


@dataclass(frozen=True)
class RevokedEvent:
    """A parsed ``! REVOKED <token> <by>[ <why>]`` line (version 9): an
    operator revoked the lock of *token*; *by* says who, *why* why (None
    when the operator gave no reason). It comes right before that lock's
    ``! LOST <token> revoked ...`` line, which is the loss itself: the
    client keeps *by* and *why* for it."""

    token: int
    by: str
    why: Optional[str]


def _parse_revoked(line: str) -> Optional[RevokedEvent]:
    # ``! REVOKED <token> <by>[ <why>]``: *why* is the rest of the line and
    # may hold spaces (never at its start or end, never empty).
    token_text, sep, rest = line[len("! REVOKED "):].partition(" ")
    token = _decimal(token_text)
    if not sep or token is None or not 1 <= token <= MAX_TOKEN:
        return None
    by, sep, why = rest.partition(" ")
    if not 1 <= len(by) <= MAX_REVOKED_BY or not all("\x21" <= ch <= "\x7e" for ch in by):
        return None
    if sep and (not 1 <= len(why) <= MAX_REVOKE_REASON or why[0] == " " or why[-1] == " "
                or not all("\x20" <= ch <= "\x7e" for ch in why)):
        return None
    return RevokedEvent(token, by, why if sep else None)


@dataclass(frozen=True)
class QueuedEvent:
    """A parsed ``! QUEUED <n> <key> [<key> ...]`` line (version 4): the
    cluster committed the ACQUIRE that was request line *position* of the
    connection (1-based, every line counts) into the FIFO queue of each of
    its *keys*. It always comes before that ACQUIRE's reply; it may never
    come (a leader change can swallow it), so nothing may depend on it for
    correctness."""

    position: int
    keys: Tuple[str, ...]


@dataclass(frozen=True)
class Position:
    """An acquire's place in the line of one of its keys, as the sidecar
    reports it (``! POSITION``, version 7); what ``on_position`` is called
    with."""

    #: The key whose line this is (a block waits in each of its keys' lines
    #: and is told its place in each).
    key: str
    #: The place in the line: 1 is next.
    position: int
    #: The estimated wait left, whole seconds; None while the cluster has
    #: no estimate (the sidecar sent ``-``). A guess, not a promise.
    estimate: Optional[int]


@dataclass(frozen=True)
class PositionEvent:
    """A parsed ``! POSITION <n> <position> <estimate|-> <key>`` line
    (version 7): the ACQUIRE written as request line *n* of the connection
    (counted as for ``! QUEUED``) stands at *report*'s place in the line of
    *report.key*. Sent only while it waits, before its reply; informational."""

    n: int
    report: Position


def _parse_position(words: List[str]) -> Optional[PositionEvent]:
    if len(words) != 6:
        return None
    n, place = _decimal(words[2]), _decimal(words[3])
    estimate = None if words[4] == "-" else _decimal(words[4])
    key = words[5]
    if n is None or n < 1 or place is None or place < 1 or (estimate is None and words[4] != "-"):
        return None
    if not 1 <= len(key) <= MAX_KEY_LEN or not all("\x21" <= ch <= "\x7e" for ch in key):
        return None
    return PositionEvent(n, Position(key, place, estimate))


def parse_event(
    line: str, labelled: bool = False
) -> Optional[Union[LostEvent, QueuedEvent, PositionEvent, RevokedEvent]]:
    """Parse an event line; None for an event this client does not know
    (another name, a later version's) or a malformed one: both are ignored,
    and neither may disturb the matching of replies.

    An unknown LOST *reason* is kept as it is: it is a loss all the same.
    *labelled* (the connection agreed version 5): LOST carries the lock's
    label (``-``: none) before its keys.
    """
    if line.startswith("! REVOKED "):
        return _parse_revoked(line)
    words = line.split(" ")
    if labelled and len(words) >= 2 and words[1] == "LOST":
        if len(words) < 6 or not words[4]:
            return None
        del words[4]  # the label: the lock knows its own
    if len(words) < 4 or words[0] != "!":
        return None
    if words[1] == "POSITION":
        return _parse_position(words)
    if words[1] == "QUEUED":
        position, keys = _decimal(words[2]), words[3:]
        if position is None or position < 1 or not all(keys):
            return None
        return QueuedEvent(position, tuple(keys))
    if len(words) < 5 or words[1] != "LOST":
        return None
    token, reason, keys = _decimal(words[2]), words[3], words[4:]
    if token is None or not 1 <= token <= MAX_TOKEN or not reason or not all(keys):
        return None
    return LostEvent(token, reason, tuple(keys))


def _error_from(reply: str) -> Exception:
    """Map a non-success reply line to the exception it stands for."""
    if reply == "BUSY":
        return BusyError("the key is held by someone else (wait was 0)")
    if reply == "TIMEOUT":
        return LockTimeoutError("the wait ran out before the turn came")
    if reply == "INDETERMINATE":
        return IndeterminateError("no definite reply from the cluster; do not assume the outcome")
    if reply.startswith("ERR ") or reply == "ERR":
        parts = reply.split(" ", 2)
        code = parts[1] if len(parts) > 1 and parts[1] else "unknown"
        return SERVER_ERRORS.get(code, ServerError)(code, parts[2] if len(parts) > 2 else "")
    return ProtocolError(f"unexpected reply {reply!r}")


def parse_acquire(reply: str) -> int:
    """``OK <token>`` → token; anything else → the matching exception."""
    if reply.startswith("OK "):
        token = _decimal(reply[3:])
        if token is not None and 1 <= token <= MAX_TOKEN:
            return token
        raise ProtocolError(f"bad token in reply {reply!r}")
    raise _error_from(reply)


def fence_key(key: str, slot: int) -> str:
    """The fenced resource of a permit: ``"<key> <slot>"``, the key and the
    slot joined by a space (``"checkout 0"``; one fencing domain per slot,
    unixapi/PROTOCOL.md "Semaphores"). A key is 1..255 bytes of 0x21..0x7E
    and never holds a space, so no lock key names a slot's fencing domain
    (with ``#``, the lock ``checkout#0`` and slot 0 of the semaphore
    ``checkout`` shared one high-water mark)."""
    return f"{key} {slot}"


@dataclass(frozen=True)
class Permit:
    """One permit of a semaphore key (``acquire_permit``): its *token* (its
    own fencing token; release and extend it by ``(key, token)`` like a
    lock) and its *slot*, 0..n-1. Fence its writes under
    :attr:`fence_key`."""

    key: str
    token: int
    slot: int

    @property
    def fence_key(self) -> str:
        """``"<key> <slot>"``: the resource the permit's writes are fenced under."""
        return fence_key(self.key, self.slot)


def permit_line(key: str, lease: int, wait: Number, label: Optional[str] = None) -> "tuple[str, float]":
    """Check the arguments; return the PERMIT line and the wait in seconds."""
    line, wait_s = acquire_line(key, lease, wait)
    label = check_label(label)
    return "PERMIT" + line[len("ACQUIRE"):] + (f" label={label}" if label else ""), wait_s


def check_permits_version(version: int, path: str) -> None:
    """Semaphores need protocol version 8 (nothing is sent before)."""
    if version < PERMIT_VERSION:
        raise NotSupportedError(
            f"semaphores need protocol version {PERMIT_VERSION}; the sidecar at {path} speaks version {version}: "
            "upgrade the sidecar"
        )


def _permit_error(reply: str) -> Exception:
    """A PERMIT or PERMITS refusal; ``unknown_verb`` (a sidecar that does
    not know the verb after all) is NotSupportedError."""
    err = _error_from(reply)
    if isinstance(err, ServerError) and err.code == "unknown_verb":
        return NotSupportedError(f"the sidecar does not know semaphores: {err.message}")
    return err


def parse_permit(reply: str) -> Tuple[int, int]:
    """``OK <token> <slot>`` → (token, slot); anything else → the matching
    exception."""
    if reply.startswith("OK "):
        parts = reply[3:].split(" ")
        token = _decimal(parts[0]) if len(parts) == 2 else None
        slot = _decimal(parts[1], 6) if len(parts) == 2 else None
        if token is not None and 1 <= token <= MAX_TOKEN and slot is not None and slot < MAX_PERMITS:
            return token, slot
        raise ProtocolError(f"bad permit grant {reply!r}")
    raise _permit_error(reply)


def permits_line(key: str, n: int) -> str:
    """Check the arguments; return the PERMITS line."""
    check_key(key)
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"permits must be an int, not {type(n).__name__}")
    if not 0 <= n <= MAX_PERMITS:
        raise ValueError(f"permits {n}: 0..{MAX_PERMITS}")
    return f"PERMITS {key} {n}"


def parse_permits(reply: str) -> None:
    """``OK`` → None; anything else → the matching exception."""
    if reply != "OK":
        raise _permit_error(reply)


def parse_release(reply: str) -> None:
    """``OK`` → None; anything else → the matching exception."""
    if reply != "OK":
        raise _error_from(reply)


def parse_extend(reply: str) -> None:
    """``OK`` → None; anything else → the matching exception."""
    if reply != "OK":
        raise _error_from(reply)


def parse_ping(reply: str) -> None:
    """``PONG`` → None."""
    if reply != "PONG":
        raise _error_from(reply)


@dataclass(frozen=True)
class Member:
    """One entry of INFO's ``members`` field.

    :ivar id: the server id, ``NAME/INCARNATION``.
    :ivar role: ``voter`` or ``learner``.
    :ivar addr: its client address, or None while the leader has not
        recorded it.
    """

    id: str
    role: str
    addr: Optional[str]


@dataclass(frozen=True)
class Info:
    """The sidecar's view of the cluster (reply to ``INFO``; unixapi/PROTOCOL.md).

    A field an older sidecar does not send is None; ``-`` (none known) is
    None too.

    :ivar cluster: the cluster id.
    :ivar leader: address of the known leader, or None.
    :ivar connected: number of cluster addresses with a live connection.
    :ivar total: number of configured cluster addresses.
    :ivar fields: every ``name=value`` field of the reply, including ones
        this client does not know.
    :ivar domain: the cluster's fencing domain, the name of the token
        sequence: key fence high-water marks by it (``ticketing.fence``
        does, from :meth:`Client.domain`); None until a node has named it.
    :ivar members: the Raft configuration as the leader last reported it
        (a list of :class:`Member`), None until known.
    :ivar protocol: the protocol version the sidecar speaks.
    :ivar sessions: the sidecar's ``--sessions`` setting (auto, off).
    :ivar session: the id (hex) of its cluster session, or None.
    :ivar session_state: the cluster session's state, or None.
    :ivar session_timeout_ms, session_resumes, session_opens, session_held:
        the cluster session's timeout, resumes and opens so far, and the
        locks it holds.
    :ivar session_last_resume: what the last resume found, as sent.
    """

    cluster: str
    leader: Optional[str]
    connected: int
    total: int
    fields: Dict[str, str] = field(default_factory=dict, repr=False)
    domain: Optional[str] = None
    members: Optional[List[Member]] = None
    protocol: Optional[int] = None
    sessions: Optional[str] = None
    session: Optional[str] = None
    session_state: Optional[str] = None
    session_timeout_ms: Optional[int] = None
    session_resumes: Optional[int] = None
    session_opens: Optional[int] = None
    session_held: Optional[int] = None
    session_last_resume: Optional[str] = None


def _dash(value: Optional[str]) -> Optional[str]:
    return None if value in (None, "", "-") else value


def _members(value: Optional[str]) -> Optional[List[Member]]:
    """``<id>:<role>@<addr>,...``: split each entry at the first ``@``, then
    at the last ``:`` before it."""
    if _dash(value) is None:
        return None
    out = []
    for entry in value.split(","):  # type: ignore[union-attr]
        left, at, addr = entry.partition("@")
        sid, colon, role = left.rpartition(":")
        if not at or not colon or not sid:
            raise ValueError(entry)
        out.append(Member(sid, role, _dash(addr)))
    return out


def parse_info(reply: str) -> Info:
    """``INFO cluster=<id> leader=<addr|-> connected=<n>/<total> domain=... ...`` → Info."""
    words = reply.split(" ")
    if words[0] != "INFO":
        raise _error_from(reply)
    fields: Dict[str, str] = {}
    for w in words[1:]:
        if not w:
            continue
        name, sep, value = w.partition("=")
        if not sep:
            raise ProtocolError(f"bad field {w!r} in reply {reply!r}")
        fields[name] = value

    def count(name: str) -> Optional[int]:
        v = fields.get(name)
        if v is None:
            return None
        n = int(v)
        if n < 0:
            raise ValueError(v)
        return n

    try:
        n, total = fields.get("connected", "0/0").split("/", 1)
        return Info(
            cluster=fields.get("cluster", ""),
            leader=_dash(fields.get("leader", "-")),
            connected=int(n),
            total=int(total),
            fields=fields,
            domain=_dash(fields.get("domain")),
            members=_members(fields.get("members")),
            protocol=count("protocol"),
            sessions=fields.get("sessions"),
            session=_dash(fields.get("session")),
            session_state=_dash(fields.get("session_state")),
            session_timeout_ms=count("session_timeout_ms"),
            session_resumes=count("session_resumes"),
            session_opens=count("session_opens"),
            session_held=count("session_held"),
            session_last_resume=fields.get("session_last_resume"),
        )
    except ValueError:
        raise ProtocolError(f"bad INFO reply {reply!r}") from None


def require_domain(info: Info, path: str) -> str:
    """*info*'s fencing domain, or :class:`NoDomainError` if it names none."""
    if info.domain is None:
        raise NoDomainError(
            f"the sidecar at {path} reports domain=- (it has not reached a node of its cluster yet)"
        )
    return info.domain


@dataclass(frozen=True)
class HeldLock:
    """One entry of ``HELD`` (:meth:`ticketing.Client.held_locks`).

    :ivar key: a key this connection holds (each key of a block has its
        own entry, with the block's token and label).
    :ivar token: its fencing token.
    :ivar label: its owner label; None for none, and always None from a
        sidecar before version 5 (which lists no labels).
    """

    key: str
    token: int
    label: Optional[str] = None


def parse_held_locks(reply: str) -> List[HeldLock]:
    """``HELD <n> key:token ...`` (or, version 5, ``HELD <n> key:token
    label ...``, ``-`` for no label) → [HeldLock, ...] in reply order.

    Keys may contain ``:`` (the token is after the last one). A key can
    appear twice if the connection re-acquired it after a lease ran out and
    has not released the stale holding. The two forms cannot be confused:
    a version-4 reply lists exactly *n* words after the count, a
    version-5 one 2 *n*.
    """
    words = reply.split(" ")
    if words[0] != "HELD":
        raise _error_from(reply)
    try:
        n = int(words[1])
        held: List[HeldLock] = []
        entries = words[2:]
        labels: List[Optional[str]] = []
        if n > 0 and len(entries) == 2 * n:
            # Version 5: each lock is key:token and its label ("-": none).
            labels = [None if w == "-" else w for w in entries[1::2]]
            if any(lb == "" for lb in labels):
                raise ValueError(reply)
            entries = entries[0::2]
        for i, w in enumerate(w for w in entries if w):
            key, sep, token = w.rpartition(":")
            if not sep or not key:
                raise ValueError(w)
            held.append(HeldLock(key, int(token), labels[i] if labels else None))
    except (IndexError, ValueError):
        raise ProtocolError(f"bad HELD reply {reply!r}") from None
    if n != len(held):
        raise ProtocolError(f"HELD reply counts {n} locks but lists {len(held)}: {reply!r}")
    return held


def parse_held(reply: str) -> List[Tuple[str, int]]:
    """``HELD`` → [(key, token), ...] in reply order: :func:`parse_held_locks`
    without the labels (the shape ``held()`` always had)."""
    return [(h.key, h.token) for h in parse_held_locks(reply)]


# -- one connection -------------------------------------------------------------

#: How many ``! LOST`` events naming a token no lock object is registered
#: for are remembered: a grant's lock object registers after its reply has
#: been read, so the reader may see the lock's event first (a very short
#: lease). As many ``! REVOKED`` lines whose ``! LOST`` has not come are
#: remembered too (the oldest forgotten first).
UNCLAIMED_EVENTS = 1024


@dataclass(eq=False)
class Request:
    """A request line written on a connection, waiting for its reply."""

    #: Its position among the request lines written on the connection
    #: (1-based, every line counts, the first HELLO too): what the
    #: sidecar's ``! QUEUED <n>`` names.
    position: int
    #: When it was sent (the shell's clock).
    sent: float
    #: The local deadline of its reply (the shell's clock), or None.
    deadline: Optional[float]
    #: An ACQUIRE's keys (what its ``! QUEUED`` names); () for other requests.
    keys: Tuple[str, ...] = ()
    #: Called (by the shell) when the ACQUIRE's ``! QUEUED`` arrives.
    on_queued: Optional[Callable[[], Any]] = None
    #: The shell's handle (a future) that the reply settles.
    handle: Any = None
    #: True once its ``! QUEUED`` arrived.
    queued: bool = False
    #: Called (by the shell) with a :class:`Position` for each of the
    #: ACQUIRE's ``! POSITION`` lines.
    on_position: Optional[Callable[[Position], Any]] = None


@dataclass(frozen=True)
class Reply:
    """Decision: *line* is the reply to *request* (settle its handle)."""

    request: Request
    line: str


@dataclass(frozen=True)
class Queued:
    """Decision: call ``request.on_queued()`` (its ACQUIRE joined the queue)."""

    request: Request


@dataclass(frozen=True)
class Positioned:
    """Decision: call ``request.on_position(position)`` (its place in a line)."""

    request: Request
    position: Position


@dataclass(frozen=True)
class Lost:
    """Decision: lose the lock object *target* (``target._lose(reason,
    from_sidecar, revoked_by, revoke_reason)``); *revoked_by* and
    *revoke_reason* are a revoke's ``! REVOKED`` by and why, else None."""

    target: Any
    reason: str
    from_sidecar: bool
    revoked_by: Optional[str] = None
    revoke_reason: Optional[str] = None


@dataclass(frozen=True)
class Teardown:
    """Decision: the connection is over. Fail each of *requests* with
    *error*, lose each of *locks* (``disconnected``), and, when *first*,
    close the socket."""

    error: SidecarConnectionError
    requests: List[Request]
    locks: List[Any]
    first: bool


class Session:
    """The sans-IO state of one connection (= one sidecar session).

    The shell writes the bytes :meth:`send` returns, in the order it got
    them, and feeds every byte it reads to :meth:`receive_data` (end of
    stream: :meth:`eof`); it carries out the decisions these return:
    :class:`Reply`, :class:`Queued`, :class:`Positioned`, :class:`Lost`,
    :class:`Teardown`. The
    first request is :data:`HELLO_EVENTS_LINE` (:meth:`start`). Not
    thread-safe: the blocking shell calls it under its lock.

    - Replies come in request order: each non-event line answers the
      oldest pending request.
    - Lines starting with ``!`` are events, never replies. ``! LOST``
      reaches the lock object registered under its token (or waits for it,
      :data:`UNCLAIMED_EVENTS`); a ``! REVOKED <token>`` line's who and why
      are kept for that token's ``! LOST <token> revoked`` (version 9; one
      whose LOST never comes, a token of no lock of ours, changes nothing);
      ``! QUEUED <n>`` and ``! POSITION <n>`` reach the pending ACQUIRE
      written as line *n* (every line written counts); the rest is ignored.
    - A reply with no request pending ends the connection.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        #: How many request lines have been written (the position of the last).
        self.written = 0
        #: The protocol version HELLO agreed (None: not known yet).
        self.version: Optional[int] = None
        #: True once the sidecar agreed to send event lines.
        self.events = False
        #: The error line a sidecar answered the first HELLO with when it
        #: refuses the connection (``ERR forbidden``, ``too_many_connections``).
        self.refused: Optional[str] = None
        #: Why the connection is over (None while it is open).
        self.error: Optional[SidecarConnectionError] = None
        #: The first request (HELLO_EVENTS_LINE; set by :meth:`start`).
        self.hello: Optional[Request] = None
        self._buf = bytearray()
        self._pending: Deque[Request] = deque()
        self._acquires: Dict[int, Request] = {}
        self._tail_deadline: Optional[float] = None
        self._locks: Dict[int, Any] = {}
        #: LOST events of tokens no lock registered yet: (reason, by, why).
        self._unclaimed: "OrderedDict[int, Tuple[str, Optional[str], Optional[str]]]" = OrderedDict()
        #: REVOKED lines waiting for their token's LOST: (by, why).
        self._revoked: "OrderedDict[int, Tuple[str, Optional[str]]]" = OrderedDict()

    # -- writing ---------------------------------------------------------------

    def start(self, now: float, handle: Any = None) -> Tuple[Request, bytes]:
        """The connection's first request, pipelined before anything else:
        agree the version and turn the event lines on."""
        req, data = self.send(HELLO_EVENTS_LINE, None, now, handle=handle)
        self.hello = req
        return req, data

    def send(
        self,
        line: str,
        budget: Optional[float],
        now: float,
        *,
        handle: Any = None,
        keys: Sequence[str] = (),
        on_queued: Optional[Callable[[], Any]] = None,
        on_position: Optional[Callable[[Position], Any]] = None,
    ) -> Tuple[Request, bytes]:
        """Record a request sent at *now*; return it and the bytes to write
        (the shell writes them before anything it sends later).

        *budget* is how long the sidecar may take for this request alone
        (None: unbounded). Replies come in order, so its deadline is never
        earlier than that of the request ahead of it. *keys*: an ACQUIRE's
        keys, to match its ``! QUEUED`` and ``! POSITION``; *on_queued* and
        *on_position* are then called for them.

        :raises SidecarConnectionError: the connection is over.
        """
        if self.error is not None:
            raise self.error
        deadline = None
        if budget is not None:
            deadline = now + budget
            if self._tail_deadline is not None:
                deadline = max(deadline, self._tail_deadline)
        self._tail_deadline = deadline
        self.written += 1
        req = Request(self.written, now, deadline, tuple(keys), on_queued, handle, on_position=on_position)
        self._pending.append(req)
        if keys:
            self._acquires[req.position] = req
        return req, (line + "\n").encode("utf-8")

    # -- reading ---------------------------------------------------------------

    def receive_data(self, data: bytes) -> List[Any]:
        """Feed bytes read from the socket; the decisions for every line
        they complete (a partial line waits for the rest)."""
        if self.error is not None:
            return []
        self._buf += data
        out: List[Any] = []
        start = 0
        while self.error is None:
            end = self._buf.find(b"\n", start)
            if end < 0:
                break
            raw = bytes(self._buf[start:end]).rstrip(b"\r")
            start = end + 1
            out.extend(self.receive_line(raw.decode("utf-8", "replace")))
        del self._buf[:start]
        return out

    def receive_line(self, line: str) -> List[Any]:
        """The decisions for one whole line (without its newline)."""
        if self.error is not None:
            return []
        if is_event(line):
            ev = parse_event(line, self.version is not None and self.version >= 5)
            if isinstance(ev, LostEvent):
                return self._route_lost(ev)
            if isinstance(ev, QueuedEvent):
                return self._route_queued(ev)
            if isinstance(ev, PositionEvent):
                return self._route_position(ev)
            if isinstance(ev, RevokedEvent):
                self._note_revoked(ev)
                return []
            return []  # an event of a later version, or malformed: ignored
        if not self._pending:
            return [self.fail(SidecarConnectionError(
                f"the sidecar sent {line!r} with no request pending "
                "(e.g. ERR forbidden or too_many_connections on connect); connection closed"
            ))]
        req = self._pending.popleft()
        if not self._pending:
            self._tail_deadline = None
        if req.keys:
            del self._acquires[req.position]
        if req is self.hello:
            self._settle_hello(line)
        return [Reply(req, line)]

    def eof(self) -> Teardown:
        """The sidecar closed the connection (a partial last line is dropped)."""
        if self.refused is not None:
            err = SidecarConnectionError(f"the sidecar at {self.path} refused the connection: {self.refused}")
        else:
            err = SidecarConnectionError(
                f"the sidecar at {self.path} closed the connection; locks held through it are released"
            )
        return self.fail(err)

    def broken(self, e: BaseException) -> Teardown:
        """Reading (or flushing the writes) failed with *e*."""
        return self.fail(SidecarConnectionError(f"connection to the sidecar at {self.path} lost: {e}"))

    def send_failed(self, e: BaseException) -> Teardown:
        """Writing failed with *e* (the shell raises ``teardown.error``)."""
        return self.fail(SidecarConnectionError(f"connection to the sidecar at {self.path} lost while sending: {e}"))

    def fail(self, err: SidecarConnectionError) -> Teardown:
        """End the connection (the first error sticks): every pending
        request fails, and every registered lock is lost, ``disconnected``
        (the session is gone: the sidecar releases its locks, or, if the
        sidecar died, their leases run out)."""
        first = self.error is None
        if first:
            self.error = err
        requests = list(self._pending)
        self._pending.clear()
        self._acquires.clear()
        self._tail_deadline = None
        locks = list(self._locks.values())
        self._locks.clear()
        return Teardown(self.error or err, requests, locks, first)

    @property
    def alive(self) -> bool:
        return self.error is None

    # -- events ------------------------------------------------------------------

    def _note_revoked(self, ev: RevokedEvent) -> None:
        # Kept for the LOST line of its token that follows; a token of no
        # lock of ours gets no LOST, and its entry is forgotten in time.
        self._revoked.pop(ev.token, None)
        self._revoked[ev.token] = (ev.by, ev.why)
        while len(self._revoked) > UNCLAIMED_EVENTS:
            self._revoked.popitem(last=False)

    def _route_lost(self, ev: LostEvent) -> List[Any]:
        by: Optional[str] = None
        why: Optional[str] = None
        revoked = self._revoked.pop(ev.token, None)
        if revoked is not None and ev.reason == REASON_REVOKED:
            by, why = revoked
        lock = self._locks.pop(ev.token, None)
        if lock is None:
            self._unclaimed[ev.token] = (ev.reason, by, why)
            while len(self._unclaimed) > UNCLAIMED_EVENTS:
                self._unclaimed.popitem(last=False)
            return []
        return [Lost(lock, ev.reason, True, by, why)]

    def _route_queued(self, ev: QueuedEvent) -> List[Any]:
        # Only a pending ACQUIRE of exactly these keys, once: anything else
        # (its reply came, another request, a repeat) is a prompt to drop.
        req = self._acquires.get(ev.position)
        if req is None or req.queued or req.keys != ev.keys:
            return []
        req.queued = True
        return [Queued(req)] if req.on_queued is not None else []

    def _route_position(self, ev: PositionEvent) -> List[Any]:
        # Only a pending ACQUIRE that waits for that key: its reply removes
        # it from _acquires, so nothing is called after the reply.
        req = self._acquires.get(ev.n)
        if req is None or req.on_position is None or ev.report.key not in req.keys:
            return []
        return [Positioned(req, ev.report)]

    def register(self, token: int, lock: Any) -> Optional[Lost]:
        """Route ``! LOST`` events of *token* to *lock* from now on. An event
        for it already read, or a connection already over, is returned as
        the decision to carry out at once."""
        if self.error is not None:
            return Lost(lock, REASON_DISCONNECTED, False)
        unclaimed = self._unclaimed.pop(token, None)
        if unclaimed is not None:
            reason, by, why = unclaimed
            return Lost(lock, reason, True, by, why)
        self._locks[token] = lock
        return None

    def releasing(self, token: int, key: str) -> Any:
        """A release of *key* under *token* (``client.release``): the lock
        object registered under it with that key, no longer routed to (the
        shell marks it released), or None."""
        lock = self._locks.get(token)
        if lock is None or key not in lock.keys:
            return None
        del self._locks[token]
        return lock

    def unregister(self, token: Optional[int], lock: Any) -> None:
        """Stop routing events of *token* to *lock* (it is released)."""
        if token is not None and self._locks.get(token) is lock:
            del self._locks[token]

    # -- HELLO -------------------------------------------------------------------

    def _settle_hello(self, reply: str) -> None:
        try:
            version, events = parse_hello_reply(reply)
        except ServerError as e:
            # bad_request: a version-2 sidecar, which knows no events (the
            # version is asked with a plain HELLO when a block needs it).
            if e.code != "bad_request":
                self.refused = reply
            return
        except ProtocolError:
            return
        self.version, self.events = version, events

    def hello_outcome(self) -> Optional[int]:
        """Once the first HELLO was answered: the version, or None when it
        must be asked with a plain :func:`hello_line` (a version-2 sidecar,
        which refused the events option); raises the refusal of a sidecar
        that refused the connection."""
        if self.version is None and self.refused is not None:
            parse_hello(self.refused)  # raises the refusal's ServerError
        return self.version

    def settle_plain_hello(self, reply: str) -> int:
        """Record the reply to a plain :func:`hello_line`; the version."""
        self.version = parse_hello(reply)
        return self.version


class LockView:
    """The read-only attributes of a lock object, the same for
    :class:`ticketing.Lock` and :class:`ticketing.aio.AsyncLock`: both keep
    their decisions in a :class:`LockState` as ``self._state``."""

    _state: "LockState"

    @property
    def key(self) -> str:
        """The first key."""
        return self._state.keys[0]

    @property
    def keys(self) -> Tuple[str, ...]:
        """Every key of the lock (a block's keys, in the order given)."""
        return self._state.keys

    @property
    def lease(self) -> int:
        """The lease of the acquire, then of the last successful extend."""
        return self._state.lease

    @property
    def wait(self) -> Number:
        return self._state.wait

    @property
    def label(self) -> Optional[str]:
        """The owner label the lock is acquired with (``label=``), else
        None. The cluster keeps the label the ACQUIRE carried, so ``HELD``
        and the ``! LOST`` event repeat this same label."""
        return self._state.label

    @property
    def token(self) -> Optional[int]:
        """The fencing token while held, else None."""
        return self._state.token

    @property
    def permit(self) -> bool:
        """True for a permit of a semaphore key (``lock_permit``)."""
        return self._state.permit

    @property
    def slot(self) -> Optional[int]:
        """A permit's slot (0..n-1) once granted, kept after release; None
        for a lock or before the grant."""
        return self._state.slot

    @property
    def fence_key(self) -> str:
        """The resource the lock's writes are fenced under: ``"<key> <slot>"``
        for a granted permit, else the (first) key."""
        st = self._state
        return fence_key(st.keys[0], st.slot) if st.permit and st.slot is not None else st.keys[0]

    @property
    def held_token(self) -> Optional[int]:
        """The token granted, kept after release (for LockLostError)."""
        return self._state.held_token

    @property
    def lost_reason(self) -> Optional[str]:
        """None while not lost; else why: ``"expired"``, ``"moved"``,
        ``"compensated"``, ``"revoked"`` (the sidecar's event),
        ``"deadline"`` (the local deadline passed) or ``"disconnected"``
        (see :class:`ticketing.Lock`)."""
        return self._state.reason

    @property
    def revoked_by(self) -> Optional[str]:
        """Who revoked the lock (the operator's name, 1..128 visible ASCII
        characters), when :attr:`lost_reason` is ``"revoked"`` and the
        sidecar said so (its ``! REVOKED`` line, protocol version 9); None
        otherwise, and for a revoke told by an older sidecar."""
        return self._state.revoked_by

    @property
    def revoke_reason(self) -> Optional[str]:
        """Why the operator revoked the lock (free text, up to 128
        characters), as :attr:`revoked_by`; None when no reason was given
        or the sidecar did not say."""
        return self._state.revoke_reason
