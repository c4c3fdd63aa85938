'use strict';

/**
 * Errors of the Ticketing client.
 *
 * Every failure reported by the sidecar or by the connection to it is a
 * {@link TicketingError}. Invalid arguments are reported before anything is
 * sent, with the built-in `TypeError` / `RangeError` (never a TicketingError).
 *
 * | class                    | meaning                                          | held?   |
 * |--------------------------|--------------------------------------------------|---------|
 * | BusyError                | key held and `wait` was 0                        | no      |
 * | LockTimeoutError         | the turn did not come within `wait`              | no      |
 * | IndeterminateError       | no definite reply: do NOT enter the critical     | unknown |
 * |                          | section (the lease ends any holding)             |         |
 * | ServerError              | definite `ERR <code> <message>`                  | no      |
 * | SidecarConnectionError   | sidecar unreachable or connection lost (the      | no      |
 * |                          | sidecar releases the session's locks)            |         |
 * | NotSupportedError        | a block, and the sidecar speaks version 1        | no      |
 * | LockLostError            | a Lock's lost signal fired (`.reason`), or an    | no*     |
 * |                          | `extend` refused locally because of it           |         |
 *
 * (*) a lock lost to the local deadline (`deadline`) may in fact still be
 * held by the sidecar for a moment; stop using it all the same.
 * @module
 */

/** Base class; `code` is a lowercase word naming the error. */
class TicketingError extends Error {
  /**
   * @param {string} message
   * @param {string} code
   * @param {ErrorOptions} [options]
   */
  constructor(message, code, options) {
    super(message || code, options);
    this.name = new.target.name;
    /** @type {string} */
    this.code = code;
  }
}

/** `BUSY`: the key is held and the wait was 0. Definite: not acquired. */
class BusyError extends TicketingError {
  constructor(message = 'the key is held by someone else (wait was 0)') {
    super(message, 'busy');
  }
}

/** `TIMEOUT`: the turn did not come within the wait. Definite: not acquired. */
class LockTimeoutError extends TicketingError {
  constructor(message = 'the wait ran out before the turn came') {
    super(message, 'timeout');
  }
}

/**
 * `INDETERMINATE`, or no reply in time: the outcome is unknown. After an
 * acquire the caller must not enter the critical section (a grant that
 * arrives late is released by the client; the lease ends any other). After a
 * release the lock may still be held until its lease ends.
 */
class IndeterminateError extends TicketingError {
  constructor(message = 'no definite reply from the cluster; do not assume the outcome') {
    super(message, 'indeterminate');
  }
}

/**
 * `ERR <code> <message>`: a definite failure reported by the sidecar, e.g.
 * `not_held`, `token_mismatch`, `invalid_key`, `unavailable`. Unknown codes
 * (newer sidecars) are just as definite.
 */
class ServerError extends TicketingError {
  /**
   * @param {string} code
   * @param {string} message
   */
  constructor(code, message) {
    super(message ? `${code}: ${message}` : code, code);
    /** The sidecar's message text, without the code. */
    this.detail = message;
  }
}

/** The sidecar sent a reply this client does not understand. */
class ProtocolError extends TicketingError {
  constructor(message) {
    super(message, 'protocol_error');
  }
}

/**
 * The socket could not be reached, or the connection was lost. The
 * connection is the session that owns its locks: when it is lost the sidecar
 * releases them and cancels pending acquires. The next request opens a new
 * connection (a new session, holding nothing).
 */
class SidecarConnectionError extends TicketingError {
  constructor(message, options) {
    super(message, 'connection', options);
  }
}

/**
 * The sidecar speaks an older protocol version than the call needs: a seat
 * block (`acquireBlock`) against a version-1 sidecar. Definite: nothing was
 * acquired (only `HELLO` was sent). Upgrade the sidecar.
 */
class NotSupportedError extends TicketingError {
  constructor(message) {
    super(message, 'not_supported');
  }
}

/**
 * INFO names no fencing domain yet (`domain=-`: the sidecar has not reached
 * a node of its cluster), so no token can be fenced under it yet. Rejected
 * by `Client.domain()` and the fence helpers given a client.
 */
class NoDomainError extends TicketingError {
  constructor(message) {
    super(message, 'no_domain');
  }
}

/**
 * Why a {@link LockLostError} was raised. `expired`, `moved`,
 * `compensated` and `revoked` (an operator revoked the lock) come from the
 * sidecar's `! LOST` event; `deadline` is the
 * lock's local validity deadline (send time + lease − margin);
 * `disconnected` the connection to the sidecar ended; `released`: the
 * lock was released (only an `extend` after `release` reports it; the lost
 * signal never fires for a released lock). A newer sidecar may send other
 * reasons: they are losses all the same.
 * @typedef {'expired'|'moved'|'compensated'|'revoked'|'deadline'|'disconnected'|'released'|string} LostReason
 */

/**
 * The lock is lost: its `signal.reason`, and what `Lock.extend` rejects with
 * after the loss (nothing is sent then). `reason` says why; for `revoked`,
 * `revokedBy` and `revokeReason` say who revoked it and why when the
 * sidecar told (its `! REVOKED` line, protocol version 9), and the message
 * names them (`lock lost: revoked by alice: maintenance`).
 */
class LockLostError extends TicketingError {
  /**
   * @param {LostReason} reason
   * @param {string} [message]
   * @param {{revokedBy?: string|null, revokeReason?: string|null}} [revoke]
   *   who revoked the lock and why
   */
  constructor(reason, message, { revokedBy = null, revokeReason = null } = {}) {
    super(message || LockLostError.describe(reason, revokedBy, revokeReason), 'lost');
    /** @type {LostReason} */
    this.reason = reason;
    /**
     * Who revoked the lock (reason `revoked`, from a version-9 sidecar), else null.
     * @type {string|null}
     */
    this.revokedBy = revokedBy;
    /**
     * Why it was revoked (null: no reason given, or not known).
     * @type {string|null}
     */
    this.revokeReason = revokeReason;
  }

  /**
   * @param {LostReason} reason
   * @param {string|null} [revokedBy]
   * @param {string|null} [revokeReason]
   */
  static describe(reason, revokedBy = null, revokeReason = null) {
    switch (reason) {
      case 'expired': return 'lock lost: its lease ran out (the cluster committed the expiry)';
      case 'moved': return 'lock lost: the key is no longer held under this token (an EXTEND found it moved on)';
      case 'compensated': return 'lock lost: the sidecar released it on the connection\'s behalf';
      case 'revoked': {
        if (revokedBy === null) return 'lock lost: revoked by an operator';
        return `lock lost: revoked by ${revokedBy}${revokeReason ? `: ${revokeReason}` : ''}`;
      }
      case 'deadline': return 'lock lost: its local validity deadline (send time + lease - margin) passed';
      case 'disconnected': return 'lock lost: the connection to the sidecar ended';
      case 'released': return 'the lock was released';
      default: return `lock lost (${reason})`;
    }
  }
}

/**
 * `ERR is_semaphore`: an acquire (`acquire`, `lock`, a block) named a
 * semaphore key; take a permit of it (`acquirePermit`, `lockPermit`).
 * Definite: nothing acquired.
 */
class IsSemaphoreError extends ServerError {}

/**
 * `ERR not_semaphore`: a permit of a key that is not a semaphore (an
 * operator makes it one: `setPermits`, `ticketing permits set`), or
 * `setPermits(key, 0)` of such a key. Definite: nothing changed.
 */
class NotSemaphoreError extends ServerError {}

/**
 * `ERR invalid_permits`: a number of permits outside 0..100000 (the
 * sidecar's own check; `setPermits` checks before sending).
 */
class InvalidPermitsError extends ServerError {}

/**
 * `ERR in_use`: `setPermits` of a key held as a lock, or `setPermits(key, 0)`
 * while a permit is held or someone waits. Definite: nothing changed.
 */
class InUseError extends ServerError {}

/** The ServerError subclass of each code that has one. */
const SERVER_ERRORS = Object.freeze({
  is_semaphore: IsSemaphoreError,
  not_semaphore: NotSemaphoreError,
  invalid_permits: InvalidPermitsError,
  in_use: InUseError,
});

module.exports = {
  TicketingError,
  IsSemaphoreError,
  NotSemaphoreError,
  InvalidPermitsError,
  InUseError,
  NoDomainError,
  BusyError,
  LockTimeoutError,
  TimeoutError: LockTimeoutError,
  IndeterminateError,
  ServerError,
  ProtocolError,
  SidecarConnectionError,
  NotSupportedError,
  LockLostError,
  SERVER_ERRORS,
};
