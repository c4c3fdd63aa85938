'use strict';

/**
 * Fencing tokens in a SQL database, through a minimal adapter.
 *
 * A lock orders the work; it cannot stop a holder that stalled past its lease
 * (GC pause, SIGSTOP, overload) from writing afterwards. Only the store can:
 * every write carries the token of its grant, and the store refuses a token
 * lower than the highest it already accepted for the key, in the same
 * transaction as the write.
 *
 * The adapter is anything with `query(sql, params) → Promise<{ rowCount }>`
 * (or a plain `{ rowCount }`), where `rowCount` is the number of rows the
 * statement changed, an integer: without one the helpers cannot tell a stale
 * token from a write, and reject with RowCountError (rolling back the
 * transactions they opened). A `pg` Client (or a client checked out of a
 * Pool — a transaction needs one connection) fits as is; for better-sqlite3:
 *
 *   const adapter = { query: (sql, params) => {
 *     const st = db.prepare(sql);
 *     return st.reader ? { rows: st.all(...params), rowCount: 0 } : { rowCount: st.run(...params).changes };
 *   } };
 *
 * @example
 * const { Client, fence } = require('ticketing-client');
 * await client.withLock('event/42', { lease: 30, wait: 5 }, async (token) => {
 *   await fence.withFence(pgClient, { dialect: 'postgres', client, key: 'event/42', token }, async (db) => {
 *     await db.query('UPDATE seats SET buyer = $1 WHERE seat = $2', ['bob', 7]);
 *   }); // rejects with StaleTokenError (nothing written) if a newer token wrote first
 * });
 *
 * `client` is the Client that took the lock: the helpers ask it for the
 * cluster's **fencing domain** (`client.domain()`, INFO's `domain` field),
 * the name of the token sequence, never the cluster id (which a rebuilt
 * cluster keeps while its tokens start a new sequence; clients/FENCING.md,
 * "Fencing domains"). `domain: '<id>'` instead gives it explicitly.
 *
 * A seat block (`client.acquireBlock(keys, ...)`) holds several keys under
 * one token: `withFenceBlock(db, {dialect, client, keys, token}, fn)` checks
 * and raises the mark of every key in the one transaction, so a stale token
 * on any key rejects the whole write and no mark moves.
 *
 * Tokens are u64 (BigInt); the table stores `token - 2^63` (= token XOR 2^63)
 * in a signed 64-bit column (PostgreSQL BIGINT, SQLite INTEGER), which keeps
 * their order. Parameters are passed as decimal strings. A token equal to the
 * stored one is accepted (the same grant writing again); only a lower token
 * is stale. Schema: clients/schema/fence.{postgres,sqlite}.sql.
 * @module
 */

const { TicketingError } = require('./errors');
const { MAX_TOKEN, fenceKey } = require('./protocol');

const DEFAULT_TABLE = 'ticketing_fence';
const OFFSET = 1n << 63n;
/** The stored value below every real token (token 0 is never granted). */
const ZERO = String(-OFFSET);

/** The token is older than the high-water mark: the lock was lost and a newer holder wrote. */
class StaleTokenError extends TicketingError {
  constructor(message = 'stale fencing token') {
    super(message, 'stale_token');
  }
}

/**
 * The adapter reported no row count for a fenced statement, or one the fence
 * did not expect: the helpers cannot tell a stale token from a write, so
 * they stop (and roll back the transactions they opened) instead of
 * guessing. Not StaleTokenError: the adapter or the statement is wrong.
 */
class RowCountError extends TicketingError {
  constructor(message = 'no usable row count') {
    super(message, 'row_count');
  }
}

/**
 * The number of rows a statement changed, as the adapter reported it. A
 * missing count (undefined, null, NaN, -1) must not read as "not 0": that
 * let a stale token's write commit.
 * @param {unknown} res
 * @param {string} what
 * @returns {number}
 */
function rowCount(res, what) {
  let n = res ? res.rowCount : undefined;
  if (typeof n === 'bigint') n = Number(n);
  if (!Number.isSafeInteger(n) || n < 0) {
    throw new RowCountError(`${what}: the adapter reported no row count (rowCount ${n}); ` +
      'the fence needs { rowCount: <rows changed> } from query()');
  }
  return n;
}

/** @param {bigint|string|number} token */
function toBigInt(token) {
  let t;
  if (typeof token === 'bigint') t = token;
  else if (typeof token === 'number' && Number.isSafeInteger(token)) t = BigInt(token);
  else if (typeof token === 'string' && /^[0-9]{1,20}$/.test(token)) t = BigInt(token);
  else throw new TypeError(`token must be a BigInt, a decimal string or a safe integer, not ${typeof token}`);
  if (t < 0n || t > MAX_TOKEN) throw new RangeError(`token ${t} outside 0..2^64-1`);
  return t;
}

/**
 * The stored (signed 64-bit, decimal string) value of a u64 token; order-preserving.
 * @param {bigint|string|number} token
 * @returns {string}
 */
function encodeToken(token) {
  return String(toBigInt(token) - OFFSET);
}

/**
 * The u64 token of a stored value (reverses encodeToken).
 * @param {bigint|string|number} value
 * @returns {bigint}
 */
function decodeToken(value) {
  return BigInt(value) + OFFSET;
}

function placeholders(dialect, n) {
  if (dialect === 'postgres') return Array.from({ length: n }, (_, i) => `$${i + 1}`);
  if (dialect === 'sqlite') return Array(n).fill('?');
  throw new RangeError(`dialect must be 'postgres' or 'sqlite', not ${dialect}`);
}

function nonZero(token) {
  const t = toBigInt(token);
  if (t === 0n) throw new RangeError('token 0 (tokens start at 1)');
  return t;
}

/**
 * The conditional high-water upsert for a dialect and table.
 * @param {'postgres'|'sqlite'} dialect
 * @param {string} [table]
 */
function advanceSql(dialect, table = DEFAULT_TABLE) {
  const [a, b, c] = placeholders(dialect, 3);
  return `INSERT INTO ${table} AS f (domain, key, token) VALUES (${a}, ${b}, ${c}) ` +
    'ON CONFLICT (domain, key) DO UPDATE SET token = excluded.token WHERE f.token <= excluded.token';
}

/**
 * The fencing domain of a helper's options: `domain` if given, else the
 * domain of `client` (`await client.domain()`: INFO's `domain` field;
 * NoDomainError while it names none).
 * @param {{domain?: string, client?: {domain: () => Promise<string>}}} opts
 * @returns {Promise<string>}
 */
async function domainOf({ domain, client }) {
  if (domain !== undefined && domain !== null) {
    if (typeof domain !== 'string' || domain === '') throw new TypeError('domain must be a non-empty string');
    return domain;
  }
  if (!client || typeof client.domain !== 'function') {
    throw new TypeError('pass `client` (the Client that took the lock: its fencing domain is asked) or `domain`');
  }
  return client.domain();
}

/**
 * Raise (domain, key)'s high-water mark to token inside the adapter's open
 * transaction, or reject with StaleTokenError (then roll back). Run it as
 * the first statement of the transaction, before the reads and writes it
 * protects.
 * `domain` is the fencing domain; given `client` instead, it is asked
 * (`domainOf`).
 * @param {{query: Function}} db
 * @param {{dialect: 'postgres'|'sqlite', domain?: string, client?: object, key: string, token: bigint|string|number, table?: string}} opts
 */
async function advance(db, { dialect, domain, client, key, token, table = DEFAULT_TABLE }) {
  const t = nonZero(token);
  domain = await domainOf({ domain, client });
  const res = await db.query(advanceSql(dialect, table), [domain, key, encodeToken(t)]);
  const n = rowCount(res, `fence ${domain}/${key}`);
  if (n === 0) {
    throw new StaleTokenError(`${domain}/${key}: token ${t} is older than the stored high-water mark`);
  }
  if (n !== 1) throw new RowCountError(`fence ${domain}/${key}: the upsert changed ${n} rows, not 1`);
}

/**
 * The keys of a block, sorted and without repeats.
 * @param {unknown} keys
 * @returns {string[]}
 */
function keySet(keys) {
  if (!Array.isArray(keys)) throw new TypeError(`keys must be an array of strings, not ${typeof keys}`);
  if (keys.length === 0) throw new RangeError('a block with no keys');
  for (const k of keys) if (typeof k !== 'string') throw new TypeError(`a key must be a string, not ${typeof k}`);
  // Sorted by UTF-16 code units; keys are ASCII, so this is the byte order.
  return [...new Set(keys)].sort();
}

/**
 * `advance` for a seat block, whose keys share one token: raise the mark of
 * every key of `keys` to `token` inside the adapter's open transaction, or
 * reject with StaleTokenError (naming the key) when any key already has a
 * higher one; then roll back, which undoes the keys already raised: all or
 * nothing. `keys` is a set (order and repeats do not matter, at least one
 * key); the marks are raised in sorted key order, so that transactions over
 * overlapping key sets lock the fence rows in one order and cannot
 * deadlock (PostgreSQL).
 * @param {{query: Function}} db
 * @param {{dialect: 'postgres'|'sqlite', domain?: string, client?: object, keys: string[], token: bigint|string|number, table?: string}} opts
 */
async function advanceBlock(db, { dialect, domain, client, keys, token, table = DEFAULT_TABLE }) {
  const t = nonZero(token);
  const ks = keySet(keys);
  domain = await domainOf({ domain, client });
  for (const key of ks) {
    try {
      await advance(db, { dialect, domain, key, token: t, table });
    } catch (e) {
      if (e instanceof StaleTokenError) {
        throw new StaleTokenError(`${e.message} (a block of ${ks.length} keys: nothing of it may be written)`);
      }
      throw e;
    }
  }
}

/**
 * The highest token recorded for (domain, key), 0n if none. The adapter's
 * query must return `rows` (arrays or objects with a `token` field).
 */
async function highWater(db, { dialect, domain, key, table = DEFAULT_TABLE }) {
  const [a, b] = placeholders(dialect, 2);
  const res = await db.query(`SELECT token FROM ${table} WHERE domain = ${a} AND key = ${b}`, [domain, key]);
  const row = res.rows && res.rows[0];
  if (!row) return 0n;
  return decodeToken(Array.isArray(row) ? row[0] : row.token);
}

/**
 * Run fn(db) in a transaction that starts with the fencing check: BEGIN
 * (`opts.begin`, default 'BEGIN'; use 'BEGIN IMMEDIATE' for SQLite),
 * advance, fn, COMMIT. Any rejection (StaleTokenError included, raised
 * before fn runs) rolls back and is rethrown. Resolves to fn's result.
 * `opts.client` (the Client that took the lock) gives the fencing domain,
 * asked before BEGIN; `opts.domain` gives it explicitly.
 *
 * `opts.retries` (default 0) is how many more times the whole transaction
 * (BEGIN, advance, fn, COMMIT) runs, with the same token, after PostgreSQL
 * aborted it with a serialization failure or a deadlock (SQLSTATE 40001 or
 * 40P01, `isRetryable`): at REPEATABLE READ and SERIALIZABLE (`begin:
 * 'BEGIN ISOLATION LEVEL SERIALIZABLE'`) the legitimate holder gets 40001
 * when another transaction changed the fence row after its snapshot began.
 * A retry runs fn again, so fn must have no effect outside the transaction.
 * A stale token stays stale: its retry rejects with StaleTokenError.
 * @template T
 * @param {{query: Function}} db one connection
 * @param {{dialect: 'postgres'|'sqlite', client?: object, domain?: string, key: string, token: bigint|string|number, table?: string, begin?: string, retries?: number}} opts
 * @param {(db: {query: Function}) => Promise<T>} fn
 * @returns {Promise<T>}
 */
async function withFence(db, opts, fn) {
  nonZero(opts.token);
  const domain = await domainOf(opts);
  return inTransaction(db, opts, () => advance(db, { ...opts, domain }), fn);
}

/**
 * `withFence` for a seat block: fn(db) runs in a transaction that starts
 * with `advanceBlock` of every key of `opts.keys` to the block's one token.
 * A stale token on any key rejects with StaleTokenError before fn runs and
 * rolls back: no mark raised, nothing written. `client` / `domain` and
 * `retries` as for `withFence`.
 * @template T
 * @param {{query: Function}} db one connection
 * @param {{dialect: 'postgres'|'sqlite', client?: object, domain?: string, keys: string[], token: bigint|string|number, table?: string, begin?: string, retries?: number}} opts
 * @param {(db: {query: Function}) => Promise<T>} fn
 * @returns {Promise<T>}
 */
async function withFenceBlock(db, opts, fn) {
  nonZero(opts.token);
  keySet(opts.keys);
  const domain = await domainOf(opts);
  return inTransaction(db, opts, () => advanceBlock(db, { ...opts, domain }), fn);
}

/**
 * The fenced resource and token of a permit: `{key: '<key> <slot>', token}`.
 * `opts.permit` is what `acquirePermit` resolves with or a `lockPermit`
 * Lock (both carry key, token and slot); without it, `opts.key`,
 * `opts.slot` and `opts.token` name the permit.
 * @param {{permit?: {key?: string, keys?: readonly string[], token: bigint, slot: number|null}, key?: string, slot?: number, token?: bigint|string|number}} opts
 * @returns {{key: string, token: bigint|string|number}}
 */
function permitFenceKey(opts) {
  const { permit } = opts;
  if (permit !== undefined && permit !== null) {
    const key = permit.key ?? (permit.keys && permit.keys[0]);
    if (typeof key !== 'string' || !Number.isInteger(permit.slot)) {
      throw new TypeError('permit must be what acquirePermit resolves with or a lockPermit Lock (key, token and slot)');
    }
    return { key: fenceKey(key, permit.slot), token: permit.token };
  }
  if (typeof opts.key !== 'string') throw new TypeError('pass `permit`, or `key`, `slot` and `token`');
  if (!Number.isInteger(opts.slot) || opts.slot < 0) throw new RangeError(`permit slot ${opts.slot}: want an integer, 0 or more`);
  return { key: fenceKey(opts.key, opts.slot), token: opts.token };
}

/**
 * `withFence` for a permit of a semaphore key: the fenced resource is
 * `'<key> <slot>'`, one fencing domain per slot (tokens of a semaphore
 * increase per slot, not across its slots). A stale holder of slot s is
 * refused once a newer token wrote slot s; holders of other slots are not
 * affected. `opts.permit` (or `key`, `slot`, `token`) as for
 * `permitFenceKey`; the other options as for `withFence`.
 * @template T
 * @param {{query: Function}} db one connection
 * @param {object} opts
 * @param {(db: {query: Function}) => Promise<T>} fn
 * @returns {Promise<T>}
 */
async function withFencePermit(db, opts, fn) {
  const { key, token } = permitFenceKey(opts);
  const { permit: _p, slot: _s, ...rest } = opts;
  return withFence(db, { ...rest, key, token }, fn);
}

/**
 * Whether `e` is a PostgreSQL serialization failure (SQLSTATE 40001) or
 * deadlock (40P01), as `pg` reports them in `e.code`: the transaction was
 * rolled back and may be run again from the start, with the same token.
 * @param {unknown} e
 * @returns {boolean}
 */
function isRetryable(e) {
  return e instanceof Error && !(e instanceof TicketingError) &&
    (/** @type {any} */ (e).code === '40001' || /** @type {any} */ (e).code === '40P01');
}

/** inTransactionOnce again after an isRetryable error, up to opts.retries times. */
async function inTransaction(db, opts, fenceFirst, fn) {
  const retries = opts.retries ?? 0;
  if (!Number.isSafeInteger(retries) || retries < 0) throw new RangeError(`retries must be an integer >= 0, not ${retries}`);
  for (let attempt = 0; ; attempt++) {
    try {
      return await inTransactionOnce(db, opts.begin, fenceFirst, fn);
    } catch (e) {
      if (attempt >= retries || !isRetryable(e)) throw e;
      // A short random pause lets the transaction it conflicted with finish.
      await new Promise((resolve) => setTimeout(resolve, Math.random() * (5 << Math.min(attempt, 6))));
    }
  }
}

async function inTransactionOnce(db, begin, fenceFirst, fn) {
  await db.query(begin || 'BEGIN', []);
  let result;
  try {
    await fenceFirst();
    result = await fn(db);
  } catch (e) {
    try { await db.query('ROLLBACK', []); } catch { /* the original error matters */ }
    throw e;
  }
  await db.query('COMMIT', []);
  return result;
}

/**
 * Single-statement form for rows that carry their own token column
 * (`BIGINT NOT NULL DEFAULT -9223372036854775808`, i.e. ZERO): one statement
 * that writes every row `where` matches, or none:
 *
 *   UPDATE table SET column = <token>, set
 *    WHERE (where) AND column <= <token>
 *      AND (SELECT count(*) = <want> AND max(column) <= <token>
 *             FROM (SELECT column FROM table WHERE (where) FOR UPDATE) AS ticketing_fence_rows)
 *
 * (SQLite: without FOR UPDATE; a statement there runs alone.) It writes only
 * when `where` matches exactly `want` rows and none has a newer token, so a
 * stale token changes no row, outside a transaction too. In PostgreSQL
 * FOR UPDATE waits for a newer holder's open transaction on those rows and
 * reads what it committed.
 *
 * `set`/`where` use the dialect's placeholders for `params` ($1..$n, or ? in
 * order). `where` appears twice: in PostgreSQL it reuses its $n; in SQLite
 * its params, found by counting the ?s of `set` (outside quotes and
 * comments; numbered or named parameters are refused), are passed twice.
 *
 * Rejects with StaleTokenError when it changed no row (a row's token is
 * newer, or `where` does not match `want` rows): nothing was written.
 * `want` 0 means 1, never "no check" (as `Want` 0 in Go and `want=0` in
 * Python). RowCountError for any other count, which the statement should
 * not give (roll back a transaction it ran in). Resolves to the count.
 */
async function conditionalUpdate(db, { dialect, table, set, where, params = [], token, column = 'fence_token', want = 1 }) {
  const t = nonZero(token);
  want = wantRows(want);
  const enc = encodeToken(t);
  let sql;
  let args;
  if (dialect === 'postgres') {
    const p = `$${params.length + 1}`;
    const w = `$${params.length + 2}`;
    sql = `UPDATE ${table} SET ${column} = ${p}, ${set} WHERE (${where}) AND ${column} <= ${p} ` +
      `AND (SELECT count(*) = ${w} AND max(${column}) <= ${p} ` +
      `FROM (SELECT ${column} FROM ${table} WHERE (${where}) FOR UPDATE) AS ${ROWS})`;
    args = [...params, enc, want];
  } else {
    placeholders(dialect, 0);
    const nSet = qmarks(set);
    const nWhere = qmarks(where);
    if (nSet + nWhere !== params.length) {
      throw new RangeError(`set and where have ${nSet + nWhere} placeholders, params ${params.length} values`);
    }
    sql = `UPDATE ${table} SET ${column} = ?, ${set} WHERE (${where}) AND ${column} <= ? ` +
      `AND (SELECT count(*) = ? AND max(${column}) <= ? FROM (SELECT ${column} FROM ${table} WHERE (${where})) AS ${ROWS})`;
    args = [enc, ...params, enc, want, enc, ...params.slice(nSet)];
  }
  const res = await db.query(sql, args);
  const n = rowCount(res, `update ${table}`);
  if (n === want) return n;
  if (n === 0) {
    throw new StaleTokenError(`update ${table} with token ${t} changed no row ` +
      `(a newer token holds one of the rows, or where does not match ${want} rows)`);
  }
  throw new RowCountError(`update ${table} with token ${t} changed ${n} rows, not ${want} or none`);
}

/** Names the rows conditionalUpdate checks (a derived table); unusual enough not to clash. */
const ROWS = 'ticketing_fence_rows';

/**
 * The ? placeholders of an SQLite fragment, outside quoted strings and
 * identifiers and comments. The count splits params between set and where;
 * a numbered (?1) or named (:a, @a, $a) parameter would make that split
 * wrong, so it is refused.
 * @param {string} s
 * @returns {number}
 */
function qmarks(s) {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    const next = s[i + 1] || '';
    if (c === "'" || c === '"' || c === '`' || c === '[') {
      const j = s.indexOf(c === '[' ? ']' : c, i + 1);
      if (j < 0) throw new RangeError(`unterminated ${c} in ${JSON.stringify(s)}`);
      i = j; // a doubled quote is two quoted runs in a row
    } else if (c === '-' && next === '-') {
      const j = s.indexOf('\n', i);
      i = j < 0 ? s.length : j;
    } else if (c === '/' && next === '*') {
      const j = s.indexOf('*/', i + 2);
      if (j < 0) throw new RangeError(`unterminated comment in ${JSON.stringify(s)}`);
      i = j + 1;
    } else if (c === '?') {
      if (/[0-9]/.test(next)) throw new RangeError(`numbered parameter in ${JSON.stringify(s)}: use ? only`);
      n++;
    } else if ((c === ':' || c === '@' || c === '$') && /[A-Za-z_]/.test(next)) {
      throw new RangeError(`named parameter in ${JSON.stringify(s)}: use ? only`);
    }
  }
  return n;
}

/** The rows an update must change: `want`, 0 meaning 1. */
function wantRows(want) {
  if (!Number.isSafeInteger(want)) throw new TypeError(`want must be an integer, not ${typeof want}`);
  if (want < 0) throw new RangeError(`want ${want} (rows must be 1 or more; 0 means 1)`);
  return want || 1;
}

module.exports = {
  StaleTokenError,
  RowCountError,
  domainOf,
  advance,
  advanceBlock,
  advanceSql,
  highWater,
  withFence,
  withFenceBlock,
  withFencePermit,
  permitFenceKey,
  isRetryable,
  conditionalUpdate,
  encodeToken,
  decodeToken,
  DEFAULT_TABLE,
  ZERO,
};
