"""Exceptions raised by the Ticketing clients.

Every failure reported by the sidecar or the connection to it is a
:class:`TicketingError`. Invalid arguments are reported *before* anything is
sent, with the built-in :class:`ValueError` / :class:`TypeError` (never a
:class:`TicketingError`).

Which outcome means what for an acquire:

=========================  =========================================  ==========
exception                  meaning                                    held?
=========================  =========================================  ==========
:class:`BusyError`         key held and ``wait`` was 0                no
:class:`LockTimeoutError`  the turn did not come within ``wait``      no
:class:`IndeterminateError`  no definite reply; do NOT enter the      unknown
                           critical section (the lease ends it)
:class:`ServerError`       definite ``ERR <code> <message>``          no
:class:`SidecarConnectionError`  cannot reach the sidecar / lost it   no [1]_
:class:`NotSupportedError`  a block, and the sidecar is too old       no
=========================  =========================================  ==========

The codes of semaphores are :class:`ServerError` subclasses:
:class:`IsSemaphoreError`, :class:`NotSemaphoreError`,
:class:`InvalidPermitsError` and :class:`InUseError`.

A lock object whose lost signal fired raises :class:`LockLostError` from
``extend`` and on leaving its ``with`` block.

.. [1] The connection is the session that owns the locks: when it is lost
   the sidecar releases every lock it held and cancels its pending acquires.
"""

from __future__ import annotations

import builtins
from typing import Optional, Tuple

__all__ = [
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
]


class TicketingError(Exception):
    """Base class of every error reported by the sidecar or its connection.

    :ivar code: a lowercase word naming the error (for :class:`ServerError`
        the code sent by the sidecar, e.g. ``"not_held"``).
    :ivar message: human-readable detail.
    """

    code: str = "error"

    def __init__(self, message: str = "", code: Optional[str] = None) -> None:
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(message or self.code)


class BusyError(TicketingError):
    """``BUSY``: the key is held and the wait was 0. Definite: not acquired."""

    code = "busy"


class LockTimeoutError(TicketingError, builtins.TimeoutError):
    """``TIMEOUT``: the turn did not come within the wait. Definite: not
    acquired, and never will be by this request.

    Also an instance of the built-in :class:`TimeoutError`.
    """

    code = "timeout"


#: Short alias of :class:`LockTimeoutError`.
LockTimeout = LockTimeoutError


class IndeterminateError(TicketingError):
    """``INDETERMINATE`` (or no reply in time): the outcome is unknown.

    For an acquire the caller must not enter the critical section; any
    holding that may exist ends with its lease (and the client releases a
    grant that arrives late). For a release the lock may still be held until
    its lease ends.
    """

    code = "indeterminate"


class ServerError(TicketingError):
    """``ERR <code> <message>``: a definite failure reported by the sidecar.

    Common codes: ``bad_request``, ``invalid_key``, ``invalid_lease``,
    ``invalid_wait``, ``not_held``, ``token_mismatch``, ``moved``,
    ``unavailable``. Unknown codes are possible (newer sidecars) and are just
    as definite.
    """

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(message, code)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code


class IsSemaphoreError(ServerError):
    """``ERR is_semaphore``: an acquire (``acquire``, ``lock``, a block)
    named a semaphore key; take a permit of it (``acquire_permit``,
    ``lock_permit``). Definite: nothing acquired."""

    def __init__(self, code: str = "is_semaphore", message: str = "") -> None:
        super().__init__(code, message)


class NotSemaphoreError(ServerError):
    """``ERR not_semaphore``: a permit of a key that is not a semaphore (an
    operator makes it one: ``set_permits``, ``ticketing permits set``), or
    ``set_permits(key, 0)`` of such a key. Definite: nothing changed."""

    def __init__(self, code: str = "not_semaphore", message: str = "") -> None:
        super().__init__(code, message)


class InvalidPermitsError(ServerError):
    """``ERR invalid_permits``: a number of permits outside 0..100000 (the
    sidecar's own check; ``set_permits`` checks before sending)."""

    def __init__(self, code: str = "invalid_permits", message: str = "") -> None:
        super().__init__(code, message)


class InUseError(ServerError):
    """``ERR in_use``: ``set_permits`` of a key held as a lock, or
    ``set_permits(key, 0)`` while a permit is held or someone waits.
    Definite: nothing changed."""

    def __init__(self, code: str = "in_use", message: str = "") -> None:
        super().__init__(code, message)


#: The ServerError subclass of each code that has one.
SERVER_ERRORS = {
    "is_semaphore": IsSemaphoreError,
    "not_semaphore": NotSemaphoreError,
    "invalid_permits": InvalidPermitsError,
    "in_use": InUseError,
}


class ProtocolError(TicketingError):
    """The sidecar sent a reply this client does not understand."""

    code = "protocol_error"


class SidecarConnectionError(TicketingError, builtins.ConnectionError):
    """The sidecar socket could not be reached, or the connection was lost.

    A connection is the session owning its locks: when it is lost, the
    sidecar releases every lock acquired through it and cancels its pending
    acquires, so a request that failed this way holds nothing. The next
    request opens a new connection (a new session).

    Also an instance of the built-in :class:`ConnectionError`.
    """

    code = "connection"


class NotSupportedError(TicketingError):
    """The sidecar speaks an older protocol version than the call needs: a
    seat block (``acquire_block``) against a version-1 sidecar. Definite:
    nothing was acquired (only ``HELLO`` was sent). Upgrade the sidecar.
    """

    code = "not_supported"


class NoDomainError(TicketingError):
    """INFO names no fencing domain yet (``domain=-``: the sidecar has not
    reached a node of its cluster), so no token can be fenced under it yet.
    Raised by ``Client.domain()`` and the fence helpers that take a client.
    """

    code = "no_domain"


class LockLostError(TicketingError):
    """A lock object's lost signal has fired: the lock can no longer be
    trusted to be held (``Lock.lost`` is set).

    Raised by ``Lock.extend`` without sending anything once the lock is lost,
    and by leaving a ``with lock:`` block whose lock was lost during it (when
    the block itself raised nothing; otherwise the block's exception goes on
    unchanged, see ``Lock.__exit__``).

    :ivar reason: why: ``"expired"``, ``"moved"``, ``"compensated"``,
        ``"revoked"`` (an operator revoked it) (the sidecar's ``! LOST``
        event), ``"deadline"`` (the local validity deadline passed: send
        time + lease − margin), ``"disconnected"`` (the connection to the
        sidecar was lost), or a newer sidecar's reason.
    :ivar token: the lock's fencing token.
    :ivar keys: every key of the lock (a tuple).
    :ivar revoked_by: with reason ``"revoked"``, who revoked the lock, as
        the sidecar's ``! REVOKED`` line said (protocol version 9); None
        otherwise, and for a revoke an older sidecar told.
    :ivar revoke_reason: with :attr:`revoked_by`, why (None: no reason
        given).

    The message names them: ``lock k (token 7) lost: revoked by alice:
    maintenance``.
    """

    code = "lost"

    def __init__(
        self,
        reason: str,
        token: Optional[int],
        keys: Tuple[str, ...],
        message: str = "",
        *,
        revoked_by: Optional[str] = None,
        revoke_reason: Optional[str] = None,
    ) -> None:
        self.reason = reason
        self.token = token
        self.keys = tuple(keys)
        self.revoked_by = revoked_by
        self.revoke_reason = revoke_reason
        super().__init__(
            message
            or f"lock {' '.join(self.keys)} (token {token}) lost: {describe_loss(reason, revoked_by, revoke_reason)}"
        )


def describe_loss(reason: str, revoked_by: Optional[str] = None, revoke_reason: Optional[str] = None) -> str:
    """*reason*, with who revoked the lock and why when known: ``revoked by
    alice: maintenance``, ``revoked by alice``, ``revoked``."""
    if revoked_by is None:
        return reason
    text = f"{reason} by {revoked_by}"
    return f"{text}: {revoke_reason}" if revoke_reason else text


_NO_SIDECAR_HINT = (
    "start one with `ticketing dev` (a local cluster and its sidecar) or "
    "`ticketing sidecar` (beside a cluster), or give the path of a running sidecar's socket"
)


def connect_error(path: str, e: BaseException) -> SidecarConnectionError:
    """The error for a failed connect to *path*: a missing or stale socket
    says so, with what to start."""
    if isinstance(e, FileNotFoundError):
        why = f"no sidecar at {path}: no socket file there; {_NO_SIDECAR_HINT}"
    elif isinstance(e, ConnectionRefusedError):
        why = (f"no sidecar at {path}: nothing serves that socket file (left by a sidecar that stopped?); "
               f"{_NO_SIDECAR_HINT}")
    else:
        why = f"cannot connect to the sidecar at {path}"
    return SidecarConnectionError(f"{why}: {e}")
