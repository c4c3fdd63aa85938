"""Python client of the Ticketing sidecar (standard library only, 3.9+).

The sidecar runs next to your service and serves distributed locks over a
unix socket; this package speaks its line protocol::

    import ticketing

    client = ticketing.Client()          # $TICKETING_SOCKET or ./ticketing.sock
    with client.lock("seats/42", lease=30, wait=5) as token:
        ...  # critical section; pass `token` to your fenced database write

``client.lock_block(["seat/1", "seat/2"], ...)`` takes a seat block: up to
16 keys at once or none, under one token.

A lock object knows when it is lost: ``lock.lost`` (an Event) is set when
the sidecar reports the loss, at the local validity deadline, or when the
connection is lost; ``lock.remaining()`` and ``lock.extend(lease)``; leaving
the ``with`` block of a lost lock raises :class:`LockLostError`.

A connection is a session that owns its locks: closing the client (or the
process dying) releases them. :class:`AsyncClient` is the asyncio variant.
"""

from ._protocol import (
    MAX_BLOCK_KEYS,
    MAX_KEY_LEN,
    MAX_LEASE,
    MAX_PERMITS,
    MAX_SHORT_WAIT,
    MAX_TOKEN,
    MAX_WAIT,
    MIN_LEASE,
    PROTOCOL_VERSION,
    Info,
    HeldLock,
    Member,
    Permit,
    Position,
    fence_key,
)
from .aio import AsyncClient, AsyncLock
from .client import Client, Lock
from .errors import (
    BusyError,
    InUseError,
    IndeterminateError,
    InvalidPermitsError,
    IsSemaphoreError,
    LockLostError,
    LockTimeout,
    LockTimeoutError,
    NoDomainError,
    NotSemaphoreError,
    NotSupportedError,
    ProtocolError,
    ServerError,
    SidecarConnectionError,
    TicketingError,
)
from . import fence
from .fence import RowCountError, StaleTokenError, fenced, fenced_block

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Lock",
    "AsyncClient",
    "AsyncLock",
    "Info",
    "Member",
    "HeldLock",
    "Position",
    "TicketingError",
    "BusyError",
    "LockTimeoutError",
    "LockTimeout",
    "IndeterminateError",
    "ServerError",
    "ProtocolError",
    "SidecarConnectionError",
    "NotSupportedError",
    "NoDomainError",
    "IsSemaphoreError",
    "NotSemaphoreError",
    "InvalidPermitsError",
    "InUseError",
    "LockLostError",
    "Permit",
    "fence_key",
    "MAX_PERMITS",
    "StaleTokenError",
    "RowCountError",
    "fence",
    "fenced",
    "fenced_block",
    "MIN_LEASE",
    "MAX_LEASE",
    "MAX_WAIT",
    "MAX_SHORT_WAIT",
    "MAX_KEY_LEN",
    "MAX_TOKEN",
    "MAX_BLOCK_KEYS",
    "PROTOCOL_VERSION",
]
