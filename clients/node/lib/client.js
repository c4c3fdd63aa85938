'use strict';

const net = require('node:net');
const { performance } = require('node:perf_hooks');
const p = require('./protocol');
const {
  IndeterminateError, NoDomainError, NotSupportedError, ServerError, SidecarConnectionError, TicketingError,
} = require('./errors');
const { Lock, kLose, kReleasing, kRenewAfterWait } = require('./lock');

const NO_SIDECAR_HINT = 'start one with `ticketing dev` (a local cluster and its sidecar) or '
  + '`ticketing sidecar` (beside a cluster), or give the path of a running sidecar\'s socket';

/**
 * The message for a failed connect: a missing or stale socket says so, and
 * what to start.
 * @param {string} path
 * @param {Error & {code?: string}} err
 */
function connectErrorMessage(path, err) {
  switch (err.code) {
    case 'ENOENT':
      return `no sidecar at ${path}: no socket file there; ${NO_SIDECAR_HINT}: ${err.message}`;
    case 'ECONNREFUSED':
      return `no sidecar at ${path}: nothing serves that socket file (left by a sidecar that stopped?); `
        + `${NO_SIDECAR_HINT}: ${err.message}`;
    default:
      return `cannot connect to the sidecar at ${path}: ${err.message}`;
  }
}

/**
 * What an ACQUIRE's `onQueued` option is called with when the sidecar says
 * the cluster committed the ACQUIRE into its keys' FIFO queues.
 * @callback QueuedHook
 * @param {{keys: string[]}} queued the ACQUIRE's keys, in the order asked
 * @returns {void}
 */

/**
 * What an ACQUIRE's `onPosition` option is called with each time the
 * sidecar reports its place in the line of one of its keys (version 7's
 * `! POSITION`).
 * @callback PositionHook
 * @param {{key: string, position: number, estimate: number|null}} report
 *   the key whose line it is (a block: one report per key), the place in
 *   it (1 = next), and the estimated wait left in whole seconds (null: the
 *   cluster has no estimate yet)
 * @returns {void}
 */

/**
 * An ACQUIRE's event hooks, by its request line number on the connection.
 * @typedef {{keys: string[], hook: QueuedHook|null, onPosition: PositionHook|null, queuedDone?: boolean}} AcquireHooks
 */

/** Seconds a reply may take beyond the sidecar's own bound. */
const DEFAULT_REPLY_GRACE = 10;

/**
 * How many `! LOST` events for tokens without a Lock a connection keeps: an
 * event may be read in the same chunk as the grant it follows, before the
 * awaiting `lock()` has made the Lock for that token.
 */
const ORPHAN_LOSSES = 64;

/**
 * How many `! REVOKED` lines whose `! LOST` has not come a connection keeps
 * (the oldest forgotten first): the LOST of a revoke follows its REVOKED,
 * and a REVOKED for a token of no lock of ours is never used.
 */
const PENDING_REVOKES = 64;

/**
 * Call an acquire's event hook. The caller's bug must not stop the reading
 * of replies (the next line may be this very ACQUIRE's grant): a throw is
 * reported as an EventTarget reports a throwing listener, as an uncaught
 * exception.
 * @param {Function} hook
 * @param {object} arg
 */
function callHook(hook, arg) {
  try {
    hook(arg);
  } catch (e) {
    process.nextTick(() => { throw e; });
  }
}

/**
 * One unix-socket connection (= one sidecar session). Requests are written
 * in call order and their pending entries queued in the same order; replies
 * (one line each, in request order) settle the oldest entry. Event lines
 * (`! ...`) are set aside and never counted as replies: `! LOST` fires the
 * lost signal of this connection's Lock objects with that token (a
 * `! REVOKED` line of that token before it gives a `revoked` loss its who
 * and why; one for a token of no lock of ours changes nothing); `! QUEUED
 * <n> ...` and `! POSITION <n> ...` call the onQueued and onPosition hooks
 * of the pending ACQUIRE that was the connection's n-th request line.
 * @private
 */
class Connection {
  /**
   * @param {string} path
   * @param {number} connectTimeoutMs
   */
  constructor(path, connectTimeoutMs) {
    this.path = path;
    /** @type {{resolve: (line: string) => void, reject: (e: Error) => void, deadline: number|null, n: number}[]} entries, n = the line number */
    this.pending = [];
    /**
     * How many request lines were written on this connection: the sidecar
     * numbers them the same way (every line gets one reply), and names an
     * ACQUIRE in its `! QUEUED` and `! POSITION` events by that number.
     */
    this.written = 0;
    /**
     * Pending ACQUIREs with a hook, by number; an entry leaves when its
     * reply comes (or the caller gives up), so no hook runs after it.
     * @type {Map<number, AcquireHooks>}
     */
    this.queuedHooks = new Map();
    this.head = 0;
    this.tailDeadline = null;
    /** @type {SidecarConnectionError|null} */
    this.error = null;
    /** @type {number|null} the protocol version HELLO agreed (null: not asked) */
    this.version = null;
    /** @type {boolean} whether the sidecar agreed to send events */
    this.events = false;
    /** @type {Promise<{version: number, events: boolean}>|null} the first HELLO's outcome */
    this.hello = null;
    /** @type {Map<bigint, Set<Lock>>} live Lock objects by token */
    this.locks = new Map();
    /**
     * How many Lock objects of this connection are held (neither lost nor
     * released): while one is, the socket keeps the process alive.
     */
    this.holding = 0;
    /**
     * LOST events for tokens with no Lock (yet): their reason, and who
     * revoked it and why (a `revoked` loss after a `! REVOKED` line).
     * @type {Map<bigint, {reason: string, revoke: {by: string, why: string|null}|null}>}
     */
    this.orphanLosses = new Map();
    /**
     * `! REVOKED` lines waiting for the LOST of their token.
     * @type {Map<bigint, {by: string, why: string|null}>}
     */
    this.revokes = new Map();
    this.reader = new p.LineReader((line) => this.onReply(line), (line) => this.onEvent(line));
    this.closed = new Promise((resolve) => { this.onClosed = resolve; });
    const socket = net.createConnection({ path });
    this.socket = socket;
    socket.setEncoding('utf8');
    socket.unref(); // ref'd only while requests are pending or a Lock is held (updateRef)
    const timer = setTimeout(() => {
      socket.destroy(new Error(`connect timed out after ${connectTimeoutMs} ms`));
    }, connectTimeoutMs);
    timer.unref();
    // Whether the connection was ever made: socket.connecting is already
    // false when a failed connect's 'error' arrives, and a connection never
    // made was not "lost".
    this.established = false;
    socket.once('connect', () => {
      this.established = true;
      clearTimeout(timer);
    });
    socket.on('data', (chunk) => this.onData(chunk));
    socket.on('error', (err) => {
      clearTimeout(timer);
      const msg = this.established
        ? `connection to the sidecar at ${path} lost: ${err.message}`
        : connectErrorMessage(path, err);
      this.fail(new SidecarConnectionError(msg, { cause: err }));
    });
    socket.on('close', () => {
      clearTimeout(timer);
      this.fail(new SidecarConnectionError(
        `the sidecar at ${path} closed the connection; locks held through it are released`));
      this.onClosed();
    });
  }

  get alive() {
    return this.error === null;
  }

  get size() {
    return this.pending.length - this.head;
  }

  /**
   * The socket keeps the process alive while a request is pending or a Lock
   * is held, so that a script awaiting only `lock.signal` does not end
   * (exit 0, the lock silently released) while it holds the lock; an idle
   * client without held locks does not.
   */
  updateRef() {
    if (this.error) return;
    if (this.size > 0 || this.holding > 0) this.socket.ref();
    else this.socket.unref();
  }

  /** A Lock of this connection is held from now on (see updateRef). */
  holdStarted() {
    this.holding++;
    this.updateRef();
  }

  /** A held Lock of this connection was lost or released. */
  holdEnded() {
    this.holding--;
    this.updateRef();
  }

  /**
   * Write `line` now and return a promise of its reply line.
   * @param {string} line
   * @param {number|null} budget seconds the sidecar may take for this
   *   request alone (null: unbounded)
   * @param {AcquireHooks|null} [queued] for an ACQUIRE: its keys, and what
   *   to call on its `! QUEUED` and `! POSITION` events
   * @returns {{reply: Promise<string>, deadline: number|null, forgetQueued: () => void}}
   */
  submit(line, budget, queued = null) {
    if (this.error) throw this.error;
    const n = ++this.written;
    let deadline = null;
    if (budget !== null) {
      deadline = performance.now() + budget * 1000;
      // Replies come in order: never earlier than the request ahead.
      if (this.tailDeadline !== null) deadline = Math.max(deadline, this.tailDeadline);
    }
    this.tailDeadline = deadline;
    let entry;
    const reply = new Promise((resolve, reject) => { entry = { resolve, reject, deadline, n }; });
    this.pending.push(entry);
    if (queued) this.queuedHooks.set(n, queued);
    if (this.size === 1) this.updateRef();
    this.socket.write(`${line}\n`, 'utf8');
    return { reply, deadline, forgetQueued: () => this.queuedHooks.delete(n) };
  }

  /** @param {string} chunk */
  onData(chunk) {
    if (this.error) return; // torn down: what follows answers nothing of ours
    this.reader.push(chunk);
  }

  /**
   * A reply line: settles the oldest pending request.
   * @param {string} line
   * @returns {boolean} false when the connection was torn down
   */
  onReply(line) {
    if (this.error) return false;
    if (this.size === 0) {
      this.socket.destroy();
      this.fail(new SidecarConnectionError(`the sidecar sent ${JSON.stringify(line)} with no request pending `
        + '(e.g. ERR forbidden or too_many_connections on connect); connection closed'));
      return false;
    }
    const entry = this.pending[this.head];
    this.pending[this.head++] = undefined;
    this.queuedHooks.delete(entry.n);
    if (this.head > 64 && this.head * 2 > this.pending.length) {
      this.pending = this.pending.slice(this.head);
      this.head = 0;
    }
    if (this.size === 0) {
      this.tailDeadline = null;
      this.updateRef();
    }
    entry.resolve(line);
    return true;
  }

  /**
   * An event line. Unknown events, malformed lines and unknown tokens are
   * ignored (an unknown token is remembered for a moment, see ORPHAN_LOSSES).
   * @param {string} line
   */
  onEvent(line) {
    const ev = p.parseEvent(line, this.version !== null && this.version >= 5);
    if (ev === null) return;
    if (ev.name === 'QUEUED') {
      this.onQueued(ev);
      return;
    }
    if (ev.name === 'POSITION') {
      this.onPosition(ev);
      return;
    }
    if (ev.name === 'REVOKED') {
      // Kept for the LOST of its token, which follows it.
      this.revokes.delete(ev.token);
      this.revokes.set(ev.token, { by: ev.by, why: ev.why });
      if (this.revokes.size > PENDING_REVOKES) this.revokes.delete(this.revokes.keys().next().value);
      return;
    }
    const pending = this.revokes.get(ev.token);
    this.revokes.delete(ev.token);
    const revoke = pending !== undefined && ev.reason === 'revoked' ? pending : null;
    const locks = this.locks.get(ev.token);
    if (!locks) {
      this.orphanLosses.delete(ev.token);
      this.orphanLosses.set(ev.token, { reason: ev.reason, revoke });
      if (this.orphanLosses.size > ORPHAN_LOSSES) this.orphanLosses.delete(this.orphanLosses.keys().next().value);
      return;
    }
    for (const lock of [...locks]) lock[kLose](ev.reason, true, revoke);
  }

  /**
   * `! QUEUED <n> <keys>`: the hook of the pending ACQUIRE written as the
   * n-th line, called at most once and before its reply settles it. An
   * event naming no pending ACQUIRE with a hook, or other keys than it
   * asked for, is not about a request of ours: ignored.
   * @param {import('./protocol').QueuedEvent} ev
   */
  onQueued(ev) {
    const q = this.queuedHooks.get(ev.n);
    if (!q || !q.hook || q.queuedDone) return;
    if (q.keys.length !== ev.keys.length || !q.keys.every((k, i) => k === ev.keys[i])) return;
    q.queuedDone = true; // at most once
    callHook(q.hook, { keys: [...q.keys] });
  }

  /**
   * `! POSITION <n> <position> <estimate|-> <key>`: the onPosition hook of
   * the pending ACQUIRE written as the n-th line, if it waits for that key;
   * every report, in the order read, and none after its reply settles it.
   * @param {import('./protocol').PositionEvent} ev
   */
  onPosition(ev) {
    const q = this.queuedHooks.get(ev.n);
    if (!q || !q.onPosition || !q.keys.includes(ev.report.key)) return;
    callHook(q.onPosition, { ...ev.report });
  }

  /**
   * Track a new Lock: it is lost at once if the connection already ended or
   * its LOST event came first.
   * @param {Lock} lock
   */
  register(lock) {
    if (this.error) {
      lock[kLose]('disconnected', false);
      return;
    }
    let set = this.locks.get(lock.token);
    if (!set) this.locks.set(lock.token, (set = new Set()));
    set.add(lock);
    const orphan = this.orphanLosses.get(lock.token);
    if (orphan !== undefined) {
      this.orphanLosses.delete(lock.token);
      lock[kLose](orphan.reason, true, orphan.revoke);
    }
  }

  /** @param {Lock} lock */
  unregister(lock) {
    const set = this.locks.get(lock.token);
    if (!set) return;
    set.delete(lock);
    if (set.size === 0) this.locks.delete(lock.token);
  }

  /**
   * A RELEASE of key+token is being sent on this connection: the Lock
   * objects it releases are released (their signals will not fire).
   * @param {string} key
   * @param {bigint} token
   */
  releasing(key, token) {
    for (const lock of [...(this.locks.get(token) ?? [])]) {
      if (lock.keys.includes(key)) lock[kReleasing]();
    }
  }

  /** @param {SidecarConnectionError} err */
  fail(err) {
    const first = !this.error;
    if (first) this.error = err;
    // The session is over: the sidecar releases its locks (or, if it died,
    // their leases run out). They are told first: on close, destroying
    // the socket makes the sidecar release them and hand their keys on
    // (issue 39).
    const locks = [...this.locks.values()].flatMap((set) => [...set]);
    this.locks.clear();
    for (const lock of locks) lock[kLose]('disconnected', false);
    if (first) this.socket.destroy();
    const entries = this.pending.slice(this.head);
    this.pending = [];
    this.head = 0;
    this.queuedHooks.clear();
    for (const e of entries) e.reject(err);
  }

  async close() {
    this.fail(new SidecarConnectionError('client closed'));
    await this.closed;
  }
}

/**
 * A connection to the local Ticketing sidecar.
 *
 * The connection (opened on first use) is a session: locks acquired through
 * it belong to it, and the sidecar releases them all when it closes
 * (`close()`, process exit or crash). If it is lost, pending requests reject
 * with {@link SidecarConnectionError} and the next request opens a new
 * connection (a new session, holding nothing).
 *
 * Requests may be issued concurrently; they are pipelined on the one
 * connection and the sidecar answers in request order, so a request behind
 * an acquire that waits is answered after it. Use one Client per concurrent
 * waiter when that matters.
 *
 * Tokens are BigInt: fencing tokens are u64 and would lose precision as
 * numbers. `release` also accepts decimal strings. Compare tokens with `<`,
 * `>`; store them as strings (`String(token)`) or u64 columns.
 *
 * Every connection starts with `HELLO 9 events` (pipelined before the first
 * request), so the sidecar tells it when a lock it holds is lost; `lock` and
 * `lockBlock` return {@link Lock} objects whose `signal` reports it. Against
 * an older sidecar (no events) locks still fire at their local deadline.
 * A version-4 sidecar also says when a waiting ACQUIRE joined its keys'
 * queues: the `onQueued` option of the acquire methods; a version-7 one
 * reports its place in line as it changes: the `onPosition` option.
 *
 * An idle client does not keep the Node.js process alive; one with a
 * pending request or a held {@link Lock} (taken with `lock`/`lockBlock`,
 * neither lost nor released) does, so that a script awaiting only
 * `lock.signal` runs until the lock is lost (or released) instead of
 * exiting at once, which would end the session and release the lock.
 */
class Client {
  /** @type {Connection|null} */
  #conn = null;
  #closed = false;
  #sent = 0;

  /**
   * @param {object} [options]
   * @param {string} [options.path] socket path; default $TICKETING_SOCKET,
   *   else ./ticketing.sock
   * @param {number|null} [options.replyGrace=10] seconds a reply may take
   *   beyond the sidecar's own bound (the wait for an acquire, 5 s for a
   *   release) before the call rejects with IndeterminateError; null waits
   *   forever. A grant arriving after that is released automatically.
   * @param {number} [options.connectTimeout=5] seconds
   */
  constructor({ path, replyGrace = DEFAULT_REPLY_GRACE, connectTimeout = 5 } = {}) {
    /** @type {string} */
    this.path = p.defaultPath(path);
    this.replyGrace = replyGrace;
    this.connectTimeout = connectTimeout;
  }

  /** True while a connection (session) is open. */
  get connected() {
    return this.#conn !== null && this.#conn.alive;
  }

  /** How many requests this client has written so far (all connections). */
  get requestsSent() {
    return this.#sent;
  }

  /**
   * Close the connection; the sidecar releases every lock it holds. Pending
   * requests reject with SidecarConnectionError.
   * @returns {Promise<void>}
   */
  async close() {
    this.#closed = true;
    const conn = this.#conn;
    this.#conn = null;
    if (conn) await conn.close();
  }

  #connection() {
    if (this.#closed) throw new SidecarConnectionError('client is closed');
    if (!this.#conn || !this.#conn.alive) {
      const conn = new Connection(this.path, this.connectTimeout * 1000);
      this.#conn = conn;
      this.#sendHello(conn);
    }
    return this.#conn;
  }

  /**
   * Send `HELLO 9 events` on `conn` (its first request, or again after a
   * HELLO that got no usable reply) and record what the sidecar agreed.
   * @param {Connection} conn
   */
  #sendHello(conn) {
    conn.hello = this.#call(p.helloEventsLine(), 0, null, conn).then(p.parseHelloEvents);
    conn.hello.then((h) => {
      conn.version = h.version;
      conn.events = h.events;
    }, (e) => {
      // Every sidecar answers this HELLO with HELLO, bad_request or
      // unknown_verb; any other ERR is its refusal of the connection
      // (forbidden, too_many_connections), which it closes: say so to the
      // requests pipelined behind, rather than only "closed".
      if (e instanceof ServerError) {
        conn.fail(new SidecarConnectionError(`the sidecar at ${this.path} refused the connection: ${e.message}`, { cause: e }));
      }
    });
  }

  #budget(bound) {
    return this.replyGrace === null ? null : bound + this.replyGrace;
  }

  /**
   * Send `line` synchronously, then wait for its reply.
   * @param {string} line
   * @param {number} bound
   * @param {((reply: string) => void)|null} [onLate] called with the reply
   *   if the caller gave up waiting for it
   * @param {Connection|null} [conn] the connection to send on (default:
   *   the current one, opened if need be)
   * @param {AcquireHooks|null} [queued] an ACQUIRE's keys and its onQueued
   *   and onPosition hooks (called until the caller gives up waiting)
   * @param {(() => void)|null} [onAnswer] called once the sidecar answered
   *   the line or the connection ended (or at once when nothing was sent),
   *   whether or not the caller still waits; before the returned promise
   *   settles when it does
   * @returns {Promise<string>}
   */
  #call(line, bound, onLate = null, conn = null, queued = null, onAnswer = null) {
    let submitted;
    try {
      submitted = (conn ?? this.#connection()).submit(line, this.#budget(bound), queued);
    } catch (e) {
      if (onAnswer) onAnswer(); // nothing sent: no answer will come
      return Promise.reject(e);
    }
    this.#sent++;
    const { reply, deadline, forgetQueued } = submitted;
    // Registered first, so it runs before the caller's continuation.
    if (onAnswer) reply.then(() => onAnswer(), () => onAnswer());
    if (deadline === null) return reply;
    const ms = Math.max(0, deadline - performance.now());
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        // The call has rejected: news of its request is no longer the caller's.
        forgetQueued();
        if (onLate) reply.then(onLate, () => {});
        reject(new IndeterminateError(`no reply from the sidecar within ${(ms / 1000).toFixed(1)} s`));
      }, ms);
      reply.then(
        (r) => { clearTimeout(timer); resolve(r); },
        (e) => { clearTimeout(timer); reject(e); },
      );
    });
  }

  /**
   * Acquire `key` and resolve with its fencing token (a BigInt that strictly
   * increases with every grant, cluster-wide).
   *
   * Rejects with BusyError (held, wait 0), LockTimeoutError (the turn did not
   * come within wait), IndeterminateError (unknown: do not enter the
   * critical section), ServerError (`.code`), SidecarConnectionError.
   * Rejects with TypeError/RangeError for invalid arguments, before anything
   * is sent.
   *
   * @param {string} key 1..255 characters in 0x21..0x7E
   * @param {object} [options]
   * @param {number} [options.lease=30] whole seconds 1..250
   * @param {number} [options.wait=5] seconds 0..3600 (over 300 needs a sidecar
   *   of protocol version 6, else NotSupportedError, nothing sent), millisecond precision;
   *   0 = one immediate try
   * @param {QueuedHook|null} [options.onQueued] called (at most once, before
   *   the promise settles) when the sidecar reports that the cluster
   *   committed this ACQUIRE into the key's FIFO queue: an ACQUIRE of the key
   *   sent by anyone after the call stands behind it. Never called for a
   *   grant without waiting, for `wait: 0`, or by a sidecar older than
   *   protocol version 4; a leader change may swallow it. A prompt for tests
   *   and progress display, not a condition for correctness.
   * @param {PositionHook|null} [options.onPosition] called with `{key,
   *   position, estimate}` each time the sidecar (protocol version 7) reports
   *   this ACQUIRE's place in a key's line (1 = next; `estimate`: whole
   *   seconds of estimated wait left, or null while there is none): at most
   *   about once a second, only when the place changed, a block once per
   *   key; in the order reported, only before the promise settles and not
   *   once the call gave up waiting. Never for `wait: 0` or a grant without
   *   waiting, nor from an older sidecar; a leader change may delay a
   *   report. Informational: the outcome means the same without it. A
   *   throwing hook is reported as an uncaught exception, as for onQueued.
   * @param {string|null} [options.label] an owner label (version 5): a short
   *   name for people (a job, a request id; 1..64 characters of visible
   *   ASCII, not `-`) that the cluster keeps with the holding: `ticketing
   *   inspect` and the sidecar's HELD, lost events and log show it. Needs a
   *   sidecar of version 5 (else NotSupportedError, nothing sent) and a
   *   cluster of protocol version 8 (else ServerError `not_supported`).
   * @returns {Promise<bigint>}
   */
  async acquire(key, { lease = 30, wait = 5, onQueued = null, onPosition = null, label = null } = {}) {
    const { line, waitSeconds } = p.acquireLine(key, lease, wait);
    const field = p.labelField(label);
    const queued = this.#queued([key], onQueued, onPosition);
    const conn = this.#connection();
    if (field) await this.#needLabels(conn);
    if (waitSeconds > p.MAX_SHORT_WAIT) await this.#needLongWaits(conn);
    return p.parseAcquire(await this.#call(line + field, waitSeconds, (reply) => this.#releaseLateGrant(key, reply), conn, queued));
  }

  /**
   * @param {string[]} keys
   * @param {unknown} onQueued
   * @param {unknown} onPosition
   * @returns {AcquireHooks|null}
   */
  #queued(keys, onQueued, onPosition) {
    const hook = p.checkOnQueued(onQueued);
    const pos = p.checkOnPosition(onPosition);
    return hook === null && pos === null ? null : { keys, hook, onPosition: pos };
  }

  /**
   * Acquire `key` and resolve with a {@link Lock}: its `token`, `keys`,
   * `label` (the `label` option, or null), a `signal` (AbortSignal) aborted when the lock is lost, `lostReason`
   * (with `revokedBy` and `revokeReason` for a revoked lock),
   * `remaining()` (seconds), `extend(lease)` and `release()`.
   *
   * The lock is valid until the ACQUIRE's send time + lease − margin
   * (250 ms + 1 % of the lease), moved by each successful `extend`; its
   * signal fires at that deadline, at the sidecar's `! LOST` event, or when
   * the connection ends, whichever is first. Rejects as `acquire` does.
   *
   * @param {string} key 1..255 characters in 0x21..0x7E
   * @param {{lease?: number, wait?: number, onQueued?: QueuedHook|null, onPosition?: PositionHook|null, label?: string|null}} [options] as for `acquire`
   * @returns {Promise<Lock>}
   */
  async lock(key, { lease = 30, wait = 5, onQueued = null, onPosition = null, label = null } = {}) {
    const { line, waitSeconds } = p.acquireLine(key, lease, wait);
    const field = p.labelField(label);
    const queued = this.#queued([key], onQueued, onPosition);
    const conn = this.#connection();
    if (field) await this.#needLabels(conn);
    if (waitSeconds > p.MAX_SHORT_WAIT) await this.#needLongWaits(conn);
    return this.#lock(conn, line + field, waitSeconds, [key], lease, queued, p.checkLabel(label));
  }

  /**
   * Acquire the seat block `keys` (see `acquireBlock`) and resolve with one
   * {@link Lock} for all of them: it extends, is lost and is released as
   * one. Rejects as `acquireBlock` does.
   *
   * @param {string[]} keys 1..16 distinct keys
   * @param {{lease?: number, wait?: number, onQueued?: QueuedHook|null, onPosition?: PositionHook|null, label?: string|null}} [options] as for `acquire`
   * @returns {Promise<Lock>}
   */
  async lockBlock(keys, { lease = 30, wait = 5, onQueued = null, onPosition = null, label = null } = {}) {
    const { line, waitSeconds, keys: ks } = p.acquireBlockLine(keys, lease, wait);
    const field = p.labelField(label);
    const queued = this.#queued(ks, onQueued, onPosition);
    const conn = this.#connection();
    if (ks.length > 1) await this.#needBlocks(conn);
    if (field) await this.#needLabels(conn);
    if (waitSeconds > p.MAX_SHORT_WAIT) await this.#needLongWaits(conn);
    return this.#lock(conn, line + field, waitSeconds, ks, lease, queued, p.checkLabel(label));
  }

  /**
   * Send an ACQUIRE on `conn` and make the Lock of its grant.
   * @param {Connection} conn
   * @param {string} line
   * @param {number} waitSeconds
   * @param {string[]} keys
   * @param {number} lease
   * @param {AcquireHooks|null} queued
   * @param {string} label the owner label ('' for none)
   */
  async #lock(conn, line, waitSeconds, keys, lease, queued, label, permit = false) {
    // The lease counts from the grant, which comes after this: the send time
    // is the conservative start.
    const sentAt = performance.now();
    const reply = await this.#call(line, waitSeconds, (r) => this.#releaseLateGrant(keys[0], r), conn, queued);
    const { token, slot } = permit ? p.parsePermit(reply) : { token: p.parseAcquire(reply), slot: null };
    const lock = new Lock({
      call: (l, bound, onAnswer = null) => this.#call(l, bound, null, conn, null, onAnswer), conn, keys, token, lease, sentAt, label, renew: true, slot,
    });
    await lock[kRenewAfterWait](lease);
    return lock;
  }

  /**
   * Take one permit of the semaphore `key` (`PERMIT`, protocol version 8)
   * and resolve with `{key, token, slot, fenceKey}`: its own fencing token
   * (a BigInt; release and extend it by `(key, token)` like a lock), its
   * slot 0..n-1 (the lowest free at the grant) and `fenceKey`,
   * `'<key> <slot>'`, the resource to fence its writes under. Options and
   * rejections are `acquire`'s (permits are FIFO with the key's other
   * waiters), plus NotSemaphoreError (the key is no semaphore: an operator
   * makes it one, `setPermits`, `ticketing permits set`) and
   * NotSupportedError (a sidecar before version 8, nothing sent).
   *
   * @param {string} key
   * @param {{lease?: number, wait?: number, onQueued?: QueuedHook|null, onPosition?: PositionHook|null, label?: string|null}} [options] as for `acquire`
   * @returns {Promise<{key: string, token: bigint, slot: number, fenceKey: string}>}
   */
  async acquirePermit(key, { lease = 30, wait = 5, onQueued = null, onPosition = null, label = null } = {}) {
    const { line, waitSeconds } = p.permitLine(key, lease, wait);
    const field = p.labelField(label);
    const queued = this.#queued([key], onQueued, onPosition);
    const conn = this.#connection();
    await this.#needPermits(conn);
    const { token, slot } = p.parsePermit(await this.#call(line + field, waitSeconds, (reply) => this.#releaseLateGrant(key, reply), conn, queued));
    return { key, token, slot, fenceKey: p.fenceKey(key, slot) };
  }

  /**
   * Take one permit of the semaphore `key` (see `acquirePermit`) and resolve
   * with a {@link Lock} whose `slot` is the permit's and `fenceKey`
   * `'<key> <slot>'`: it is renewed on the grant, extended, lost and
   * released (by its token) exactly as `lock`'s.
   *
   * @param {string} key
   * @param {{lease?: number, wait?: number, onQueued?: QueuedHook|null, onPosition?: PositionHook|null, label?: string|null}} [options] as for `acquire`
   * @returns {Promise<Lock>}
   */
  async lockPermit(key, { lease = 30, wait = 5, onQueued = null, onPosition = null, label = null } = {}) {
    const { line, waitSeconds } = p.permitLine(key, lease, wait);
    const field = p.labelField(label);
    const queued = this.#queued([key], onQueued, onPosition);
    const conn = this.#connection();
    await this.#needPermits(conn);
    return this.#lock(conn, line + field, waitSeconds, [key], lease, queued, p.checkLabel(label), true);
  }

  /**
   * Take one permit of `key` (see `lockPermit`), run `fn(token, lock)`,
   * release it, and return what `fn` returned; released even if `fn`
   * throws, as `withLock`. `lock.slot` and `lock.fenceKey` name its
   * fencing domain.
   *
   * @template T
   * @param {string} key
   * @param {{lease?: number, wait?: number, onQueued?: QueuedHook|null, onPosition?: PositionHook|null, label?: string|null}} options as for `acquire`
   * @param {(token: bigint, lock: Lock) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  async withPermit(key, options, fn) {
    if (typeof options === 'function') [options, fn] = [{}, options];
    if (typeof fn !== 'function') throw new TypeError('withPermit needs a function');
    return this.#withLock(await this.lockPermit(key, options), fn);
  }

  /**
   * Make `key` a semaphore of `n` permits (1..100000), change the n of one,
   * or with 0 remove an idle one (`PERMITS`, protocol version 8): an
   * operator's call. Raising n grants waiters at once; lowering it takes no
   * permit from a holder. Exact and idempotent: after IndeterminateError
   * call it again. Rejects with InUseError (the key is held as a lock; 0
   * while a permit is held or someone waits), NotSemaphoreError (0 of a
   * key that is none), NotSupportedError (a sidecar before version 8,
   * nothing sent), IndeterminateError, ServerError; TypeError/RangeError
   * for bad arguments (nothing sent).
   *
   * @param {string} key
   * @param {number} n 0..100000
   * @returns {Promise<void>}
   */
  async setPermits(key, n) {
    const line = p.permitsLine(key, n);
    const conn = this.#connection();
    await this.#needPermits(conn);
    p.parsePermits(await this.#call(line, p.RELEASE_DEADLINE, null, conn));
  }

  /**
   * Semaphores need protocol version 8: an older sidecar would answer
   * unknown_verb.
   * @param {Connection} conn
   */
  async #needPermits(conn) {
    const v = await this.#hello(conn);
    if (v < p.PERMIT_VERSION) {
      throw new NotSupportedError(`semaphores need protocol version ${p.PERMIT_VERSION}; the sidecar at ${this.path} `
        + `speaks version ${v}: upgrade the sidecar`);
    }
  }

  /**
   * An owner label needs protocol version 5: never sent without it.
   * @param {Connection} conn
   */
  async #needLabels(conn) {
    const v = await this.#hello(conn);
    if (v < 5) {
      throw new NotSupportedError(`an owner label needs protocol version 5; the sidecar at ${this.path} `
        + `speaks version ${v}: upgrade the sidecar`);
    }
  }

  /**
   * A wait over 300 s needs protocol version 6: an older sidecar would
   * answer invalid_wait, which reads as the caller's mistake.
   * @param {Connection} conn
   */
  async #needLongWaits(conn) {
    const v = await this.#hello(conn);
    if (v < 6) {
      throw new NotSupportedError(`a wait over ${p.MAX_SHORT_WAIT} s needs protocol version 6; the sidecar at ${this.path} `
        + `speaks version ${v}: upgrade the sidecar`);
    }
  }

  /** @param {Connection} conn */
  async #needBlocks(conn) {
    const v = await this.#hello(conn);
    if (v < 2) {
      throw new NotSupportedError(`a seat block needs protocol version 2; the sidecar at ${this.path} `
        + `speaks version ${v}: upgrade the sidecar`);
    }
  }

  /**
   * Acquire a seat block: every key of `keys` (1..16 distinct keys) at once
   * or none, under one fencing token, which it resolves with (a BigInt).
   *
   * The block joins every key's FIFO queue and is granted when it is at the
   * head of each and every key is free; with `wait: 0` only if every key is
   * free with nobody queued on it (else BusyError). When the wait runs out
   * no key is acquired (LockTimeoutError). `release(key, token)` naming any
   * of its keys releases the whole block; closing the client releases it
   * too. One key is `acquire`.
   *
   * A block needs protocol version 2: the first one on a connection waits
   * for the reply to the connection's `HELLO` (see `hello`), and against a
   * version-1 sidecar it rejects with NotSupportedError, nothing acquired. Invalid arguments (a key named
   * twice, more than 16 keys, ...) reject with TypeError/RangeError before
   * anything is sent; the other rejections are `acquire`'s.
   *
   * @param {string[]} keys
   * @param {{lease?: number, wait?: number, onQueued?: QueuedHook|null, onPosition?: PositionHook|null}} [options]
   *   as for `acquire`; `onQueued` once the block is in every key's queue,
   *   `onPosition` with its place in each key's line
   * @returns {Promise<bigint>}
   */
  async acquireBlock(keys, { lease = 30, wait = 5, onQueued = null, onPosition = null, label = null } = {}) {
    const { line, waitSeconds, keys: ks } = p.acquireBlockLine(keys, lease, wait);
    const field = p.labelField(label);
    const queued = this.#queued(ks, onQueued, onPosition);
    const conn = this.#connection();
    if (ks.length > 1) await this.#needBlocks(conn);
    if (field) await this.#needLabels(conn);
    if (waitSeconds > p.MAX_SHORT_WAIT) await this.#needLongWaits(conn);
    return p.parseAcquire(await this.#call(line + field, waitSeconds, (reply) => this.#releaseLateGrant(ks[0], reply), conn, queued));
  }

  /**
   * The protocol version this client and the sidecar both speak: the reply
   * to the `HELLO 9 events` every connection sends first (1 for a version-1
   * sidecar, which does not know `HELLO`; 2 for a version-2 sidecar, which
   * refuses the `events` option; 3 for a sidecar that sends `! LOST` but not
   * `! QUEUED`).
   * @returns {Promise<number>}
   */
  async hello() {
    return this.#hello(this.#connection());
  }

  /**
   * Whether the sidecar sends this connection event lines (`! LOST`, and
   * from version 4 `! QUEUED`): false for a sidecar older than version 3
   * (locks then learn of a loss only from their local deadline).
   * @returns {Promise<boolean>}
   */
  async eventsEnabled() {
    const conn = this.#connection();
    await this.#hello(conn);
    return conn.events;
  }

  /** @param {Connection} conn */
  async #hello(conn) {
    try {
      return (await conn.hello).version;
    } catch (e) {
      // No usable reply (e.g. none in time): ask again while the connection lives.
      if (!conn.alive || !(e instanceof TicketingError)) throw e;
      this.#sendHello(conn);
      return (await conn.hello).version;
    }
  }

  /**
   * Release `key` held under `token` by this client's connection. Resolves
   * only on a success reply; rejects with ServerError (`not_held`,
   * `token_mismatch`, ...) or IndeterminateError (no definite reply within
   * the sidecar's 5-second release deadline).
   * @param {string} key
   * @param {bigint|string|number} token
   * @returns {Promise<void>}
   */
  async release(key, token) {
    const line = p.releaseLine(key, token);
    const conn = this.#connection();
    // A Lock of this connection for key+token is released from now on.
    conn.releasing(key, p.toToken(token));
    p.parseRelease(await this.#call(line, p.RELEASE_DEADLINE, null, conn));
  }

  /** Round-trip `PING`/`PONG`. @returns {Promise<void>} */
  async ping() {
    p.parsePing(await this.#call('PING', 0));
  }

  /** The sidecar's view of the cluster. @returns {Promise<import('./protocol').Info>} */
  async info() {
    return p.parseInfo(await this.#call('INFO', 0));
  }

  /**
   * The fencing domain of the cluster behind the sidecar: INFO's `domain`
   * field, the name of the sequence this client's tokens belong to. Fence
   * high-water marks are keyed by it (the fence helpers take it from here
   * when given `client`). Rejects with NoDomainError while no node has
   * named it.
   * @returns {Promise<string>}
   */
  async domain() {
    const { domain } = await this.info();
    if (domain === null) {
      throw new NoDomainError(`the sidecar at ${this.path} reports domain=- (it has not reached a node of its cluster yet)`);
    }
    return domain;
  }

  /**
   * Locks held by this connection, sorted by key (a block has one entry per
   * key). `heldLocks` also gives their owner labels.
   * @returns {Promise<{key: string, token: bigint}[]>}
   */
  async held() {
    return p.parseHeld(await this.#call('HELD', 0));
  }

  /**
   * Locks held by this connection with their owner labels, as `held` lists
   * them: `label` is null for none, and from a sidecar before version 5.
   * @returns {Promise<{key: string, token: bigint, label: string|null}[]>}
   */
  async heldLocks() {
    return p.parseHeldLocks(await this.#call('HELD', 0));
  }

  /**
   * Send one request line as is and resolve with the reply line verbatim.
   * A low-level escape hatch for debugging and tests.
   * @param {string} line
   * @returns {Promise<string>}
   */
  async raw(line) {
    return this.#call(p.checkRaw(line), p.MAX_WAIT + p.RELEASE_DEADLINE);
  }

  /**
   * Acquire `key`, run `fn(token, lock)`, release, and return what `fn`
   * returned. The lock is released even if `fn` throws (then `fn`'s error
   * wins over a failed release). A failed release after a successful `fn`
   * rejects: the lock may have been lost (e.g. lease expired) during the
   * section. `lock` is the {@link Lock}: watch `lock.signal` (pass it to
   * fetch, streams, timers) to stop when the lock is lost, and call
   * `lock.extend(lease)` for a long section.
   *
   * @template T
   * @param {string} key
   * @param {{lease?: number, wait?: number, onQueued?: QueuedHook|null, onPosition?: PositionHook|null}} options as for `acquire`
   * @param {(token: bigint, lock: Lock) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  async withLock(key, options, fn) {
    if (typeof options === 'function') [options, fn] = [{}, options];
    if (typeof fn !== 'function') throw new TypeError('withLock needs a function');
    return this.#withLock(await this.lock(key, options), fn);
  }

  /**
   * @template T
   * @param {Lock} lock
   * @param {(token: bigint, lock: Lock) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  async #withLock(lock, fn) {
    let result;
    try {
      result = await fn(lock.token, lock);
    } catch (e) {
      await lock.release().catch(() => {});
      throw e;
    }
    await lock.release();
    return result;
  }

  /**
   * Acquire the seat block `keys` (see `acquireBlock`), run
   * `fn(token, lock)`, release every key, and return what `fn` returned;
   * released even if `fn` throws, as `withLock`.
   *
   * @template T
   * @param {string[]} keys
   * @param {{lease?: number, wait?: number, onQueued?: QueuedHook|null, onPosition?: PositionHook|null}} options as for `acquire`
   * @param {(token: bigint, lock: Lock) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  async withBlock(keys, options, fn) {
    if (typeof options === 'function') [options, fn] = [{}, options];
    if (typeof fn !== 'function') throw new TypeError('withBlock needs a function');
    return this.#withLock(await this.lockBlock(p.checkKeys(keys), options), fn);
  }

  #releaseLateGrant(key, reply) {
    let token;
    try {
      // A permit's grant names its slot too: `OK <token> <slot>`.
      token = reply.split(' ').length === 3 ? p.parsePermit(reply).token : p.parseAcquire(reply);
    } catch {
      return; // not granted
    }
    try {
      if (this.#conn && this.#conn.alive) {
        this.#conn.submit(p.releaseLine(key, token), this.#budget(p.RELEASE_DEADLINE)).reply.catch(() => {});
      }
    } catch (e) {
      if (!(e instanceof TicketingError)) throw e;
    }
  }
}

module.exports = { Client, Connection, Lock, DEFAULT_REPLY_GRACE };
