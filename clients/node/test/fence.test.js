'use strict';

// Database-free checks of the fence helpers; the database tests are in
// ../fence-test (PostgreSQL through `pg`).

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { fence, StaleTokenError, TicketingError } = require('..');

const MAX = (1n << 64n) - 1n;

test('encodeToken preserves order over the whole u64 range', () => {
  const vals = [0n, 1n, (1n << 53n) + 1n, (1n << 63n) - 1n, 1n << 63n, (1n << 63n) + 1n, MAX - 1n, MAX];
  const enc = vals.map((v) => BigInt(fence.encodeToken(v)));
  for (let i = 1; i < enc.length; i++) assert.ok(enc[i - 1] < enc[i]);
  assert.deepEqual(enc.map((e) => fence.decodeToken(e)), vals);
  assert.equal(fence.encodeToken(0n), fence.ZERO);
  assert.equal(fence.encodeToken(1n << 63n), '0');
  assert.equal(fence.encodeToken(MAX), '9223372036854775807');
  assert.equal(fence.encodeToken('17'), fence.encodeToken(17));
  assert.throws(() => fence.encodeToken(-1n), RangeError);
  assert.throws(() => fence.encodeToken(MAX + 1n), RangeError);
  assert.throws(() => fence.encodeToken(1.5), TypeError);
});

test('advance maps rowCount 0 to StaleTokenError, with an adapter', async () => {
  const calls = [];
  const db = { query: async (sql, params) => { calls.push([sql, params]); return { rowCount: params[2] === fence.encodeToken(5n) ? 0 : 1 }; } };
  await fence.advance(db, { dialect: 'sqlite', domain: 'd', key: 'k', token: 6n });
  assert.match(calls[0][0], /VALUES \(\?, \?, \?\)/);
  await assert.rejects(fence.advance(db, { dialect: 'postgres', domain: 'd', key: 'k', token: 5n }), (e) =>
    e instanceof StaleTokenError && e instanceof TicketingError && e.code === 'stale_token');
  assert.match(calls[1][0], /VALUES \(\$1, \$2, \$3\)/);
  await assert.rejects(fence.advance(db, { dialect: 'mysql', domain: 'd', key: 'k', token: 5n }), RangeError);
  await assert.rejects(fence.advance(db, { dialect: 'sqlite', domain: 'd', key: 'k', token: 0n }), RangeError);
});

test('advanceBlock advances every key in sorted order; stale on any key rejects', async () => {
  const calls = [];
  const marks = new Map([['b', 10n]]);
  const db = {
    query: async (sql, params) => {
      calls.push(params[1]);
      const t = fence.decodeToken(params[2]);
      if ((marks.get(params[1]) ?? 0n) > t) return { rowCount: 0 };
      return { rowCount: 1 };
    },
  };
  await fence.advanceBlock(db, { dialect: 'sqlite', domain: 'd', keys: ['c', 'a', 'b', 'a'], token: 10n });
  assert.deepEqual(calls, ['a', 'b', 'c']);
  calls.length = 0;
  await assert.rejects(fence.advanceBlock(db, { dialect: 'postgres', domain: 'd', keys: ['c', 'b', 'a'], token: 9n }),
    (e) => e instanceof StaleTokenError && /d\/b/.test(e.message));
  assert.deepEqual(calls, ['a', 'b']); // stops at the stale key; the caller rolls back
  for (const keys of [[], 'a', undefined, ['a', 5]]) {
    await assert.rejects(fence.advanceBlock(db, { dialect: 'sqlite', domain: 'd', keys, token: 9n }), (e) => e instanceof TypeError || e instanceof RangeError);
  }
  await assert.rejects(fence.advanceBlock(db, { dialect: 'sqlite', domain: 'd', keys: ['a'], token: 0n }), RangeError);
});

test('withFenceBlock rolls back on a stale key before the callback', async () => {
  const stmts = [];
  const db = {
    query: async (sql, params) => {
      stmts.push(sql.split(' ')[0]);
      return { rowCount: params.length && params[1] === 'b' ? 0 : 1 };
    },
  };
  let ran = false;
  await assert.rejects(fence.withFenceBlock(db, { dialect: 'sqlite', domain: 'd', keys: ['b', 'a'], token: 3n, begin: 'BEGIN IMMEDIATE' },
    async () => { ran = true; }), StaleTokenError);
  assert.equal(ran, false);
  assert.deepEqual(stmts, ['BEGIN', 'INSERT', 'INSERT', 'ROLLBACK']);
  stmts.length = 0;
  assert.equal(await fence.withFenceBlock(db, { dialect: 'sqlite', domain: 'd', keys: ['a', 'c'], token: 3n }, async () => 'done'), 'done');
  assert.deepEqual(stmts, ['BEGIN', 'INSERT', 'INSERT', 'COMMIT']);
  await assert.rejects(fence.withFenceBlock(db, { dialect: 'sqlite', domain: 'd', keys: [], token: 3n }, async () => {}), RangeError);
});

test('conditionalUpdate (SQLite): one statement; where\'s params passed twice, counted past quotes and comments', async () => {
  // The same statement as Go's fence.Update and Python's Fence.update, which
  // run it on a real SQLite (clients/go/fence, clients/python/tests/test_fence.py).
  const calls = [];
  const db = { query: async (sql, params) => { calls.push([sql, params]); return { rowCount: 2 }; } };
  const enc = fence.encodeToken(11n);
  assert.equal(await fence.conditionalUpdate(db, {
    dialect: 'sqlite', table: 'accounts', set: "balance = balance - ? /* ? */, note = '?'''", where: 'id IN (?, ?) -- ?\n',
    params: [5, 'b', 'c'], token: 11n, want: 2,
  }), 2);
  assert.equal(calls[0][0], "UPDATE accounts SET fence_token = ?, balance = balance - ? /* ? */, note = '?''' " +
    'WHERE (id IN (?, ?) -- ?\n) AND fence_token <= ? AND (SELECT count(*) = ? AND max(fence_token) <= ? ' +
    'FROM (SELECT fence_token FROM accounts WHERE (id IN (?, ?) -- ?\n)) AS ticketing_fence_rows)');
  assert.deepEqual(calls[0][1], [enc, 5, 'b', 'c', enc, 2, enc, 'b', 'c']);
  for (const [set, where, params] of [['balance = ?1', 'id = ?2', [1, 'b']], ['balance = :b', 'id = ?', [1, 'b']], ['balance = ?', 'id = ?', [1]]]) {
    await assert.rejects(fence.conditionalUpdate(db, { dialect: 'sqlite', table: 'accounts', set, where, params, token: 11n }), RangeError);
  }
  // 0 rows: stale (nothing written); another count than want or 0: RowCountError.
  db.query = async () => ({ rowCount: 0 });
  await assert.rejects(fence.conditionalUpdate(db, { dialect: 'sqlite', table: 'a', set: 'x = ?', where: 'id = ?', params: [1, 2], token: 3n }), StaleTokenError);
  db.query = async () => ({ rowCount: 2 });
  await assert.rejects(fence.conditionalUpdate(db, { dialect: 'sqlite', table: 'a', set: 'x = ?', where: 'id = ?', params: [1, 2], token: 3n }), fence.RowCountError);
});
