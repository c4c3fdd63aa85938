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
    LockTimeoutError,
    ProtocolError,
    ServerError,
)

#: The version of unixapi/PROTOCOL.md this client speaks (2: seat blocks, HELLO).
PROTOCOL_VERSION = 2
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
    """The HELLO request of this client's version."""
    return f"HELLO {PROTOCOL_VERSION}"


def parse_hello(reply: str) -> int:
    """``HELLO <v>`` → v; ``ERR unknown_verb`` (a version-1 sidecar) → 1;
    anything else → the matching exception."""
    if reply.startswith("HELLO "):
        text = reply[6:]
        if text.isdigit() and text.isascii() and 1 <= int(text) <= PROTOCOL_VERSION:
            return int(text)
        raise ProtocolError(f"bad HELLO reply {reply!r}")
    err = _error_from(reply)
    if isinstance(err, ServerError) and err.code == "unknown_verb":
        return 1
    raise err


def release_line(key: str, token: int) -> str:
    """Check the arguments; return the RELEASE line."""
    check_key(key)
    check_token(token)
    return f"RELEASE {key} {token}"


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
