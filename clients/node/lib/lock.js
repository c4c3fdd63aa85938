'use strict';

/**
 * Lock objects: a granted ACQUIRE (one key or a block) with its lost signal,
 * its local validity deadline, extend and release. Created by
 * `Client.lock` / `Client.lockBlock`; see clients/conformance/README.md,
 * "Lock objects and the lost signal", for the contract every library keeps.
 * @module
 */

const { performance } = require('node:perf_hooks');
const p = require('./protocol');
const { LockLostError, ServerError } = require('./errors');

/**
 * Codes of a definite EXTEND refusal that mean the lock is gone (the
 * sidecar writes `! LOST <token> moved` before such a reply anyway; this
 * covers a connection whose events were turned off).
 */
const GONE_CODES = new Set(['not_held', 'token_mismatch', 'owner_mismatch']);

/** Reasons a sidecar event replaces: the local ones are only guesses. */
const LOCAL_REASONS = new Set(['deadline', 'disconnected']);

/** Internal entry points for the connection, kept off the public surface. */
const kLose = Symbol('lose');
const kReleasing = Symbol('releasing');
const kRenewAfterWait = Symbol('renewAfterWait');

/**
 * A held lock: one key, or every key of a block, under one fencing token.
 *
 * `signal` is an AbortSignal aborted once, when the lock is lost: at the
 * sidecar's `! LOST` event (reason `expired`, `moved`, `compensated`,
 * `revoked`: an operator revoked it, and from a version-9 sidecar
 * `revokedBy` and `revokeReason` say who and why), at
 * the local validity deadline (`deadline`: the ACQUIRE's send time, or the
 * last successful EXTEND's, + lease − margin, margin = 250 ms + 1 % of the
 * lease), or when the connection to the sidecar ends (`disconnected`),
 * whichever comes first. `signal.reason` is a {@link LockLostError} with
 * that first reason; `lostReason` is the same, except that a sidecar event
 * arriving after `deadline` or `disconnected` replaces it (the more
 * definite news). Pass `signal` to anything that takes one (fetch, timers,
 * streams) to stop work the moment the lock is gone.
 *
 * Its timers never keep the process alive, but the lock does while it is
 * held: its connection's socket stays ref'd until the lock is lost or
 * released, so a script that only awaits `signal` runs until then.
 *
 * A permit of a semaphore key (`lockPermit`, `withPermit`) is a Lock too,
 * with its `slot` and `fenceKey` (`'<key> <slot>'`); it is renewed, extended,
 * lost and released by its token exactly as a lock.
 */
class Lock {
  /** @type {(line: string, bound: number) => Promise<string>} */
  #call;
  #conn;
  /** @type {readonly string[]} */
  #keys;
  /** @type {bigint} */
  #token;
  #controller = new AbortController();
  /** performance.now() time after which the lock must not be used */
  #deadline;
  /**
   * The EXTENDs that bound the deadline (see extend): those the sidecar has
   * not answered, and those it answered while an extend call that ran at
   * the same time is not finished. cap: send time + lease − margin; begun,
   * answered: when, on #extendClock (answered 0 until then).
   * @type {{cap: number, begun: number, answered: number}[]}
   */
  #extends = [];
  /** Counts the begins and answers of EXTENDs, to tell which overlapped. */
  #extendClock = 0;
  /** extend calls not finished */
  #extending = 0;
  /** @type {NodeJS.Timeout|null} */
  #timer = null;
  /** @type {string|null} */
  #lostReason = null;
  /**
   * Who revoked the lock and why (`! REVOKED`, version 9), with the reason
   * `revoked`; null otherwise.
   * @type {{by: string, why: string|null}|null}
   */
  #revoke = null;
  #released = false;
  /** @type {string|null} */
  #label = null;
  /** A permit's slot (`lockPermit`), null for a lock. @type {number|null} */
  #slot = null;
  /** Counted in the connection's `holding` (keeps the process alive). */
  #holding = false;

  /**
   * @param {object} o
   * @param {(line: string, bound: number) => Promise<string>} o.call sends
   *   a line on the lock's connection and resolves with its reply
   * @param {import('./client').Connection} o.conn
   * @param {string[]} o.keys
   * @param {bigint} o.token
   * @param {number} o.lease seconds
   * @param {number} o.sentAt performance.now() when the ACQUIRE was written
   * @param {string} [o.label] the owner label of the ACQUIRE ('' or absent: none)
   * @param {number|null} [o.slot] a permit's slot (PERMIT), null for a lock
   * @private
   */
  constructor({ call, conn, keys, token, lease, sentAt, label = '', renew = false, slot = null }) {
    this.#call = call;
    this.#conn = conn;
    this.#keys = Object.freeze([...keys]);
    this.#token = token;
    this.#label = label || null;
    this.#slot = slot;
    this.#deadline = validUntil(sentAt, lease);
    this.#holding = true;
    conn.holdStarted();
    // A grant to be renewed (kRenewAfterWait) arms its timer only after:
    // its deadline may have passed while it waited.
    if (!renew) this.#arm();
    conn.register(this); // may lose it at once (a connection already gone)
  }

  /**
   * Renew a new grant, before its caller has it, with one EXTEND of its
   * own lease, when less than half its validity (lease − margin) is left: its deadline
   * counts from the ACQUIRE's send, and a wait can be an hour while a
   * lease is at most 250 s. OK proves through the log that the token still
   * held the key when it applied: the deadline then counts from the
   * EXTEND's send. A definite not_held loses the lock (moved); anything
   * else leaves the ACQUIRE's deadline. The EXTEND is recorded like any
   * extend's, so a later extend's OK stays at most its end until the
   * sidecar answers it.
   * @param {number} lease seconds
   * @private
   */
  async [kRenewAfterWait](lease) {
    const validity = lease * 1000 - p.marginMillis(lease);
    if (this.#deadline - performance.now() >= validity / 2) {
      this.#arm();
      this.#checkDeadline();
      return;
    }
    const sentAt = performance.now();
    const mine = { cap: validUntil(sentAt, lease), begun: ++this.#extendClock, answered: 0 };
    this.#extends.push(mine);
    this.#extending++;
    let reply = null;
    try {
      reply = await this.#call(p.extendLine(this.#keys[0], this.#token, lease), p.RELEASE_DEADLINE, () => this.#settleExtend(mine));
    } catch {
      // no answer: the ACQUIRE's deadline stays
    } finally {
      this.#finishExtend();
    }
    if (reply === 'OK') {
      this.#deadline = mine.cap; // no other extend ran: the caller does not have the lock yet
    } else if (reply !== null) {
      const err = p.errorFrom(reply);
      if (err instanceof ServerError && GONE_CODES.has(err.code)) this.#lose('moved', true);
    }
    this.#arm();
    this.#checkDeadline();
  }

  /** The fencing token (a BigInt), as `acquire` resolves with. */
  get token() {
    return this.#token;
  }

  /** True for a permit of a semaphore key (`lockPermit`). */
  get permit() {
    return this.#slot !== null;
  }

  /**
   * A permit's slot, 0..n-1 (the lowest free at the grant), or null for a
   * lock. (key, slot) is the permit's fencing domain: see `fenceKey`.
   * @returns {number|null}
   */
  get slot() {
    return this.#slot;
  }

  /**
   * The resource the lock's writes are fenced under: `'<key> <slot>'` for a
   * permit, else the (first) key.
   * @returns {string}
   */
  get fenceKey() {
    return this.#slot === null ? this.#keys[0] : p.fenceKey(this.#keys[0], this.#slot);
  }

  /** The keys of the lock (one key, or a block's keys in the order asked for). */
  get keys() {
    return this.#keys;
  }

  /**
   * The owner label the lock was acquired with (`label` option), or null.
   * The cluster keeps the label the ACQUIRE carried, so `HELD` and the
   * `! LOST` event repeat this same label.
   * @returns {string|null}
   */
  get label() {
    return this.#label;
  }

  /**
   * Aborted when the lock is lost; `signal.reason` is a LockLostError. Never
   * aborted for a lock released through `release()`.
   * @returns {AbortSignal}
   */
  get signal() {
    return this.#controller.signal;
  }

  /**
   * Why the lock was lost (`expired`, `moved`, `compensated`, `revoked`,
   * `deadline`, `disconnected`, or a reason a newer sidecar sends), or null
   * while it is not. A sidecar event after `deadline`/`disconnected`
   * replaces those.
   * @returns {string|null}
   */
  get lostReason() {
    this.#checkDeadline();
    return this.#lostReason;
  }

  /**
   * Who revoked the lock (the operator's name, 1..128 visible ASCII
   * characters) when `lostReason` is `revoked` and the sidecar said so (its
   * `! REVOKED` line, protocol version 9); null otherwise, and for a revoke
   * an older sidecar told.
   * @returns {string|null}
   */
  get revokedBy() {
    return this.#revoke === null ? null : this.#revoke.by;
  }

  /**
   * Why the operator revoked the lock (free text, up to 128 characters), as
   * `revokedBy`; null when no reason was given or the sidecar did not say.
   * @returns {string|null}
   */
  get revokeReason() {
    return this.#revoke === null ? null : this.#revoke.why;
  }

  /** The LockLostError of the loss so far, with who revoked it and why. */
  #lostError(message) {
    return new LockLostError(this.#lostReason, message, {
      revokedBy: this.revokedBy, revokeReason: this.revokeReason,
    });
  }

  /** True once the lost signal has fired (checks the deadline first). */
  get lost() {
    this.#checkDeadline();
    return this.#lostReason !== null;
  }

  /** True once `release()` (or the client's release of it) was called. */
  get released() {
    return this.#released;
  }

  /**
   * The lock's remaining validity in **seconds** (a fraction, like `lease`
   * and `wait`): the local deadline minus now; 0 once lost or released.
   * @returns {number}
   */
  remaining() {
    this.#checkDeadline();
    if (this.#lostReason !== null || this.#released) return 0;
    return Math.max(0, (this.#deadline - performance.now()) / 1000);
  }

  /**
   * Renew the lease: `EXTEND <first key> <token> <lease>`; the lease counts
   * from the moment this call writes it. On `OK` the local deadline moves to
   * that send time + lease − margin (a shorter lease moves it earlier).
   *
   * From the send on, and after any outcome but `OK` or a definite loss
   * (IndeterminateError, another ServerError, a connection error), the
   * local deadline is the **earlier** of the previous one and the send
   * time + lease − margin: the extend may have applied, and a shorter
   * lease then ends the lock (and hands the key on) before the previous
   * deadline. For an extend that lengthens the lease that is the previous
   * deadline.
   *
   * Rejects with TypeError/RangeError for a lease that is not an integer
   * 1..250, and with LockLostError when the lock is already lost (or was
   * released: reason `released`), both before anything is sent; with
   * ServerError (`.code`) for an `ERR` — `not_held`, `token_mismatch`,
   * `owner_mismatch` mean the lock is gone and its signal fires (`moved`) —
   * with IndeterminateError when the outcome is unknown (count on the
   * earlier deadline above), and with LockLostError if the lock was lost
   * while the EXTEND was in flight (the sidecar may then hold it for the new
   * lease: release it).
   * @param {number} lease whole seconds 1..250
   * @returns {Promise<void>}
   */
  async extend(lease) {
    const line = p.extendLine(this.#keys[0], this.#token, lease);
    if (this.#released) throw new LockLostError('released');
    this.#checkDeadline();
    if (this.#lostReason !== null) throw this.#lostError();
    const sentAt = performance.now();
    const mine = { cap: validUntil(sentAt, lease), begun: ++this.#extendClock, answered: 0 };
    this.#extends.push(mine);
    this.#extending++;
    if (mine.cap < this.#deadline) {
      this.#deadline = mine.cap;
      this.#arm();
    }
    let reply;
    try {
      // The record stays until the sidecar answers (even after this call
      // gave up waiting: the EXTEND may still apply) and while a call that
      // ran at the same time is under way.
      reply = await this.#call(line, p.RELEASE_DEADLINE, () => this.#settleExtend(mine));
      if (reply === 'OK') {
        if (this.#released) return;
        if (this.#lostReason !== null) {
          throw this.#lostError(`${LockLostError.describe(this.#lostReason, this.revokedBy, this.revokeReason)}, `
            + 'while its EXTEND was in flight (the EXTEND succeeded: release the lock)');
        }
        // At most the cap of every other EXTEND that ran at the same time
        // (not answered yet, or answered after this one was sent), whatever
        // its outcome: the sidecar may have applied it last (issue 39).
        let deadline = mine.cap;
        for (const other of this.#extends) {
          if (other !== mine && (other.answered === 0 || other.answered > mine.begun)) {
            deadline = Math.min(deadline, other.cap);
          }
        }
        this.#deadline = deadline;
        this.#arm();
        return;
      }
    } finally {
      this.#finishExtend();
    }
    const err = p.errorFrom(reply);
    if (err instanceof ServerError && GONE_CODES.has(err.code)) this.#lose('moved', true);
    throw err;
  }

  /** The sidecar answered `ext` (or the connection ended, or nothing was sent). */
  #settleExtend(ext) {
    if (ext.answered !== 0) return;
    ext.answered = ++this.#extendClock;
    this.#forgetExtends();
  }

  /** An extend call is over (its deadline set, or its error thrown). */
  #finishExtend() {
    this.#extending--;
    this.#forgetExtends();
  }

  /**
   * An answered EXTEND bounds only the calls under way when it was
   * answered; once none is, only the unanswered ones count.
   */
  #forgetExtends() {
    if (this.#extending === 0) this.#extends = this.#extends.filter((x) => x.answered === 0);
  }

  /**
   * Release the lock (`RELEASE <first key> <token>`, a block as a whole)
   * through the connection that acquired it. Always sends, even after a
   * loss (a lock lost only to the local deadline may still be held), and
   * reports the reply as `Client.release` does: resolves on `OK`, rejects
   * with ServerError (`not_held` after a real loss, ...), IndeterminateError
   * or SidecarConnectionError. From the call on, the lock's timers are
   * stopped and its signal no longer fires.
   * @returns {Promise<void>}
   */
  async release() {
    const line = p.releaseLine(this.#keys[0], this.#token);
    this[kReleasing]();
    p.parseRelease(await this.#call(line, p.RELEASE_DEADLINE));
  }

  /**
   * Fire the lost signal with `reason` (first reason wins; a sidecar event
   * replaces a local reason). Called by the connection.
   * @param {string} reason
   * @param {boolean} fromSidecar
   * @param {{by: string, why: string|null}|null} [revoke] who revoked it
   *   and why (a `revoked` loss after a `! REVOKED` line)
   */
  [kLose](reason, fromSidecar, revoke = null) {
    this.#lose(reason, fromSidecar, revoke);
  }

  /** Marks the lock released: no more timers, no lost signal. */
  [kReleasing]() {
    if (this.#released) return;
    this.#released = true;
    this.#disarm();
    this.#endHold();
    this.#conn.unregister(this);
  }

  /** The lock is no longer held: it no longer keeps the process alive. */
  #endHold() {
    if (!this.#holding) return;
    this.#holding = false;
    this.#conn.holdEnded();
  }

  #lose(reason, fromSidecar, revoke = null) {
    if (this.#released) return;
    if (fromSidecar) this.#conn.unregister(this); // at most one event per lock
    if (this.#lostReason === null) {
      this.#lostReason = reason;
      this.#revoke = revoke;
      this.#disarm();
      this.#endHold();
      this.#controller.abort(this.#lostError());
    } else if (fromSidecar && LOCAL_REASONS.has(this.#lostReason)) {
      this.#lostReason = reason;
      this.#revoke = revoke;
    }
  }

  /**
   * A timer fires late after the process was stopped or starved, and
   * `extend`/`remaining` may run before it: they check the clock themselves.
   */
  #checkDeadline() {
    if (this.#lostReason === null && !this.#released && performance.now() >= this.#deadline) {
      this.#lose('deadline', false);
    }
  }

  #arm() {
    this.#disarm();
    if (this.#lostReason !== null || this.#released) return;
    const ms = Math.max(0, this.#deadline - performance.now());
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#checkDeadline();
      // Timers may fire a fraction of a millisecond early.
      if (this.#lostReason === null && !this.#released) this.#arm();
    }, Math.ceil(ms));
    this.#timer.unref();
  }

  #disarm() {
    if (this.#timer !== null) {
      clearTimeout(this.#timer);
      this.#timer = null;
    }
  }
}

/**
 * The performance.now() time until which a lock written at `sentAt` with
 * `lease` seconds is valid: sentAt + lease − margin.
 */
function validUntil(sentAt, lease) {
  return sentAt + lease * 1000 - p.marginMillis(lease);
}

module.exports = { Lock, kLose, kReleasing, kRenewAfterWait, validUntil };
