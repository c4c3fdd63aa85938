"""The sidecar's line protocol: argument checks, request lines, reply parsing.

Shared by :mod:`ticketing.client` and :mod:`ticketing.aio`; no I/O here.
See unixapi/PROTOCOL.md in the Ticketing repository for the contract.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from decimal import Decimal
from numbers import Real
from typing import Dict, Iterable, List, Optional, Tuple, Union

from .errors import (
    BusyError,
    IndeterminateError,
    LockLostError,
    LockTimeoutError,
    ProtocolError,
    ServerError,
)

#: The version of unixapi/PROTOCOL.md this client speaks (2: seat blocks,
#: HELLO; 3: EXTEND and the ``! LOST`` event lines).
PROTOCOL_VERSION = 3
#: The most keys of one block acquire (distinct keys).
MAX_BLOCK_KEYS = 16

#: Lease bounds, whole seconds.
MIN_LEASE, MAX_LEASE = 1, 250
#: Longest wait, seconds (millisecond precision).
MAX_WAIT = 300
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
    """Validate a wait (seconds, 0..300, at most millisecond precision) and
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
#: ``! LOST`` event lines on.
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
        if text.isdigit() and text.isascii() and 1 <= int(text) <= PROTOCOL_VERSION:
            v = int(text)
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


# Reasons a lock's lost signal reports. The first three come from the
# sidecar's event; the last two are the client's own.
REASON_EXPIRED = "expired"
REASON_MOVED = "moved"
REASON_COMPENSATED = "compensated"
REASON_DEADLINE = "deadline"
REASON_DISCONNECTED = "disconnected"
#: Reasons the client decides on its own; a sidecar event after one of
#: these replaces it (it is the more definite news).
LOCAL_REASONS = frozenset({REASON_DEADLINE, REASON_DISCONNECTED})


class LostState:
    """The decision behind a lock object's lost signal, shared by both
    clients (which add the locking and the Event): the signal fires once, at
    the first loss; a sidecar event after a local reason (``deadline``,
    ``disconnected``) replaces the reported reason, being the more definite
    news; a released lock never fires."""

    __slots__ = ("reason", "released")

    def __init__(self) -> None:
        self.reason: Optional[str] = None
        self.released = False

    def lose(self, reason: str, from_sidecar: bool) -> bool:
        """Record a loss; True when the signal must fire now (the first)."""
        if self.released:
            return False
        if self.reason is None:
            self.reason = reason
            return True
        if from_sidecar and self.reason in LOCAL_REASONS:
            self.reason = reason
        return False

    def lost_error(self, token: Optional[int], keys: Tuple[str, ...]) -> LockLostError:
        """The error of a lost lock (``disconnected`` if no reason yet)."""
        return LockLostError(self.reason or REASON_DISCONNECTED, token, keys)

    def after_exit(
        self,
        exc: Optional[BaseException],
        token: Optional[int],
        keys: Tuple[str, ...],
        release_err: Optional[BaseException],
    ) -> None:
        """The end of leaving a lock's ``with`` block, once released:
        nothing if the lock was not lost; if the body raised, its exception
        goes on unchanged (with a note of the loss on Python 3.11+); else
        raise :class:`LockLostError`, from the release's error if any."""
        if self.reason is None:
            return
        if exc is not None:
            add_note = getattr(exc, "add_note", None)
            if add_note is not None:
                add_note(f"ticketing: the lock {' '.join(keys)} (token {token}) was lost: {self.reason}")
            return
        raise self.lost_error(token, keys) from release_err


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


def parse_event(line: str) -> Optional[LostEvent]:
    """Parse an event line; None for an event this client does not know
    (another name, a later version's) or a malformed one: both are ignored,
    and neither may disturb the matching of replies.

    An unknown *reason* is kept as it is: it is a loss all the same.
    """
    words = line.split(" ")
    if len(words) < 5 or words[0] != "!" or words[1] != "LOST":
        return None
    token_text, reason, keys = words[2], words[3], words[4:]
    if not (token_text.isdigit() and token_text.isascii()) or not reason or not all(keys):
        return None
    token = int(token_text)
    if not 1 <= token <= MAX_TOKEN:
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
        return ServerError(code, parts[2] if len(parts) > 2 else "")
    return ProtocolError(f"unexpected reply {reply!r}")


def parse_acquire(reply: str) -> int:
    """``OK <token>`` → token; anything else → the matching exception."""
    if reply.startswith("OK "):
        text = reply[3:]
        if text.isdigit() and text.isascii():
            token = int(text)
            if 1 <= token <= MAX_TOKEN:
                return token
        raise ProtocolError(f"bad token in reply {reply!r}")
    raise _error_from(reply)


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
class Info:
    """The sidecar's view of the cluster (reply to ``INFO``).

    :ivar cluster: the cluster id.
    :ivar leader: address of the known leader, or None.
    :ivar connected: number of cluster addresses with a live connection.
    :ivar total: number of configured cluster addresses.
    :ivar fields: every ``name=value`` field of the reply, including ones
        this client does not know.
    """

    cluster: str
    leader: Optional[str]
    connected: int
    total: int
    fields: Dict[str, str] = field(default_factory=dict)


def parse_info(reply: str) -> Info:
    """``INFO cluster=<id> leader=<addr|-> connected=<n>/<total> ...`` → Info."""
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
    try:
        n, total = fields.get("connected", "0/0").split("/", 1)
        leader = fields.get("leader", "-")
        return Info(
            cluster=fields.get("cluster", ""),
            leader=None if leader in ("", "-") else leader,
            connected=int(n),
            total=int(total),
            fields=fields,
        )
    except ValueError:
        raise ProtocolError(f"bad INFO reply {reply!r}") from None


def parse_held(reply: str) -> List[Tuple[str, int]]:
    """``HELD <n> key:token ...`` → [(key, token), ...] in reply order.

    Keys may contain ``:`` (the token is after the last one). A key can
    appear twice if the connection re-acquired it after a lease ran out and
    has not released the stale holding.
    """
    words = reply.split(" ")
    if words[0] != "HELD":
        raise _error_from(reply)
    try:
        n = int(words[1])
        held: List[Tuple[str, int]] = []
        for w in words[2:]:
            if not w:
                continue
            key, sep, token = w.rpartition(":")
            if not sep or not key:
                raise ValueError(w)
            held.append((key, int(token)))
    except (IndexError, ValueError):
        raise ProtocolError(f"bad HELD reply {reply!r}") from None
    if n != len(held):
        raise ProtocolError(f"HELD reply counts {n} locks but lists {len(held)}: {reply!r}")
    return held
