'use strict';

const net = require('node:net');
const p = require('./protocol');
const {
  IndeterminateError, NotSupportedError, SidecarConnectionError, TicketingError,
} = require('./errors');

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

/** Seconds a reply may take beyond the sidecar's own bound. */
const DEFAULT_REPLY_GRACE = 10;

/**
 * One unix-socket connection (= one sidecar session). Requests are written
 * in call order and their pending entries queued in the same order; replies
 * (one line each, in request order) settle the oldest entry.
 * @private
 */
class Connection {
  /**
   * @param {string} path
   * @param {number} connectTimeoutMs
   */
  constructor(path, connectTimeoutMs) {
    this.path = path;
    /** @type {{resolve: (line: string) => void, reject: (e: Error) => void, deadline: number|null}[]} */
    this.pending = [];
    this.head = 0;
    this.tailDeadline = null;
    /** @type {SidecarConnectionError|null} */
    this.error = null;
    /** @type {number|null} the protocol version HELLO agreed (null: not asked) */
    this.version = null;
    this.partial = '';
    this.closed = new Promise((resolve) => { this.onClosed = resolve; });
    const socket = net.createConnection({ path });
    this.socket = socket;
    socket.setEncoding('utf8');
    socket.unref(); // ref'd only while requests are pending
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
   * Write `line` now and return a promise of its reply line.
   * @param {string} line
   * @param {number|null} budget seconds the sidecar may take for this
   *   request alone (null: unbounded)
   * @returns {{reply: Promise<string>, deadline: number|null}}
   */
  submit(line, budget) {
    if (this.error) throw this.error;
    let deadline = null;
    if (budget !== null) {
      deadline = performance.now() + budget * 1000;
      // Replies come in order: never earlier than the request ahead.
      if (this.tailDeadline !== null) deadline = Math.max(deadline, this.tailDeadline);
    }
    this.tailDeadline = deadline;
    let entry;
    const reply = new Promise((resolve, reject) => { entry = { resolve, reject, deadline }; });
    this.pending.push(entry);
    if (this.size === 1) this.socket.ref();
    this.socket.write(`${line}\n`, 'utf8');
    return { reply, deadline };
  }

  /** @param {string} chunk */
  onData(chunk) {
    let data = this.partial + chunk;
    let nl;
    while ((nl = data.indexOf('\n')) >= 0) {
      let line = data.slice(0, nl);
      data = data.slice(nl + 1);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (this.size === 0) {
        this.socket.destroy();
        this.fail(new SidecarConnectionError(`the sidecar sent ${JSON.stringify(line)} with no request pending `
          + '(e.g. ERR forbidden or too_many_connections on connect); connection closed'));
        return;
      }
      const entry = this.pending[this.head];
      this.pending[this.head++] = undefined;
      if (this.head > 64 && this.head * 2 > this.pending.length) {
        this.pending = this.pending.slice(this.head);
        this.head = 0;
      }
      if (this.size === 0) {
        this.tailDeadline = null;
        this.socket.unref();
      }
      entry.resolve(line);
    }
    this.partial = data;
  }

  /** @param {SidecarConnectionError} err */
  fail(err) {
    if (!this.error) {
      this.error = err;
      this.socket.destroy();
    }
    const entries = this.pending.slice(this.head);
    this.pending = [];
    this.head = 0;
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
 * An idle client does not keep the Node.js process alive.
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
    if (!this.#conn || !this.#conn.alive) this.#conn = new Connection(this.path, this.connectTimeout * 1000);
    return this.#conn;
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
   * @returns {Promise<string>}
   */
  #call(line, bound, onLate = null, conn = null) {
    let submitted;
    try {
      submitted = (conn ?? this.#connection()).submit(line, this.#budget(bound));
    } catch (e) {
      return Promise.reject(e);
    }
    this.#sent++;
    const { reply, deadline } = submitted;
    if (deadline === null) return reply;
    const ms = Math.max(0, deadline - performance.now());
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
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
   * @param {number} [options.wait=5] seconds 0..300, millisecond precision;
   *   0 = one immediate try
   * @returns {Promise<bigint>}
   */
  async acquire(key, { lease = 30, wait = 5 } = {}) {
    const { line, waitSeconds } = p.acquireLine(key, lease, wait);
    return p.parseAcquire(await this.#call(line, waitSeconds, (reply) => this.#releaseLateGrant(key, reply)));
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
   * A block needs protocol version 2: the first one on a connection sends
   * `HELLO` (see `hello`), and against a version-1 sidecar it rejects with
   * NotSupportedError, nothing acquired. Invalid arguments (a key named
   * twice, more than 16 keys, ...) reject with TypeError/RangeError before
   * anything is sent; the other rejections are `acquire`'s.
   *
   * @param {string[]} keys
   * @param {{lease?: number, wait?: number}} [options]
   * @returns {Promise<bigint>}
   */
  async acquireBlock(keys, { lease = 30, wait = 5 } = {}) {
    const { line, waitSeconds, keys: ks } = p.acquireBlockLine(keys, lease, wait);
    const conn = this.#connection();
    if (ks.length > 1) {
      const v = await this.#hello(conn);
      if (v < 2) {
        throw new NotSupportedError(`a seat block needs protocol version 2; the sidecar at ${this.path} `
          + `speaks version ${v}: upgrade the sidecar`);
      }
    }
    return p.parseAcquire(await this.#call(line, waitSeconds, (reply) => this.#releaseLateGrant(ks[0], reply), conn));
  }

  /**
   * The protocol version this client and the sidecar both speak (`HELLO`,
   * asked once per connection); 1 for a version-1 sidecar, which does not
   * know `HELLO`.
   * @returns {Promise<number>}
   */
  async hello() {
    return this.#hello(this.#connection());
  }

  /** @param {Connection} conn */
  async #hello(conn) {
    if (conn.version === null) conn.version = p.parseHello(await this.#call(p.helloLine(), 0, null, conn));
    return conn.version;
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
    p.parseRelease(await this.#call(line, p.RELEASE_DEADLINE));
  }

  /** Round-trip `PING`/`PONG`. @returns {Promise<void>} */
  async ping() {
    p.parsePing(await this.#call('PING', 0));
  }

  /** The sidecar's view of the cluster. @returns {Promise<import('./protocol').Info>} */
  async info() {
    return p.parseInfo(await this.#call('INFO', 0));
  }

  /** Locks held by this connection. @returns {Promise<{key: string, token: bigint}[]>} */
  async held() {
    return p.parseHeld(await this.#call('HELD', 0));
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
   * Acquire `key`, run `fn(token)`, release, and return what `fn` returned.
   * The lock is released even if `fn` throws (then `fn`'s error wins over a
   * failed release). A failed release after a successful `fn` rejects: the
   * lock may have been lost (e.g. lease expired) during the section.
   *
   * @template T
   * @param {string} key
   * @param {{lease?: number, wait?: number}} options
   * @param {(token: bigint) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  async withLock(key, options, fn) {
    if (typeof options === 'function') [options, fn] = [{}, options];
    if (typeof fn !== 'function') throw new TypeError('withLock needs a function');
    const token = await this.acquire(key, options);
    let result;
    try {
      result = await fn(token);
    } catch (e) {
      await this.release(key, token).catch(() => {});
      throw e;
    }
    await this.release(key, token);
    return result;
  }

  /**
   * Acquire the seat block `keys` (see `acquireBlock`), run `fn(token)`,
   * release every key, and return what `fn` returned; released even if
   * `fn` throws, as `withLock`.
   *
   * @template T
   * @param {string[]} keys
   * @param {{lease?: number, wait?: number}} options
   * @param {(token: bigint) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  async withBlock(keys, options, fn) {
    if (typeof options === 'function') [options, fn] = [{}, options];
    if (typeof fn !== 'function') throw new TypeError('withBlock needs a function');
    const ks = p.checkKeys(keys);
    const token = await this.acquireBlock(ks, options);
    let result;
    try {
      result = await fn(token);
    } catch (e) {
      await this.release(ks[0], token).catch(() => {});
      throw e;
    }
    await this.release(ks[0], token);
    return result;
  }

  #releaseLateGrant(key, reply) {
    let token;
    try {
      token = p.parseAcquire(reply);
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

module.exports = { Client, DEFAULT_REPLY_GRACE };
