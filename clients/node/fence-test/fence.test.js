'use strict';

// ticketing-client's fence helpers against a real PostgreSQL through `pg`.
// `make test` starts a server (.ci/postgres.sh) and sets TICKETING_TEST_PG_DSN.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { Client: PgClient } = require('pg');
const { fence, StaleTokenError, TicketingError } = require('..');

const DSN = process.env.TICKETING_TEST_PG_DSN;
const skip = DSN ? false : 'TICKETING_TEST_PG_DSN is not set (make test starts PostgreSQL with .ci/postgres.sh)';
const MAX = (1n << 64n) - 1n;
const schema = `fence_node_${process.pid}_${Date.now()}`;
const opened = [];

async function connect() {
  const c = new PgClient({ connectionString: DSN, options: `-c search_path=${schema}` });
  await c.connect();
  opened.push(c);
  return c;
}

before(async () => {
  if (skip) return;
  const c = await connect();
  await c.query(`CREATE SCHEMA ${schema}`);
  await c.query(`SET search_path TO ${schema}`);
  await c.query(fs.readFileSync(path.join(__dirname, '..', '..', 'schema', 'fence.postgres.sql'), 'utf8'));
  await c.query(`CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL,
    fence_token BIGINT NOT NULL DEFAULT ${fence.ZERO})`);
  await c.query('CREATE TABLE ledger (id TEXT PRIMARY KEY, note TEXT)');
});

after(async () => {
  if (skip) return;
  await opened[0].query(`DROP SCHEMA ${schema} CASCADE`);
  await Promise.all(opened.map((c) => c.end()));
});

const opts = (key, token) => ({ dialect: 'postgres', domain: 'test', key, token });

async function write(db, key, token, note) {
  try {
    await fence.withFence(db, opts(key, token), (tx) =>
      tx.query('INSERT INTO ledger (id, note) VALUES ($1, $2)', [note, key]));
    return true;
  } catch (e) {
    if (e instanceof StaleTokenError) return false;
    throw e;
  }
}

async function ledgerHas(db, note) {
  const r = await db.query('SELECT count(*)::int AS n FROM ledger WHERE id = $1', [note]);
  return r.rows[0].n === 1;
}

test('advance: newer and equal pass, older is stale, over the whole u64 range', { skip }, async () => {
  const db = await connect();
  const steps = [
    [5n, true], [7n, true], [7n, true], [6n, false], [1n, false],
    [(1n << 63n) - 1n, true], [1n << 63n, true], [(1n << 63n) - 1n, false],
    [MAX - 1n, true], [MAX, true], [MAX - 1n, false], [1n << 63n, false],
  ];
  for (const [i, [token, ok]] of steps.entries()) {
    assert.equal(await write(db, 'seats/42', token, `n${i}`), ok, `step ${i} token ${token}`);
    assert.equal(await ledgerHas(db, `n${i}`), ok, `step ${i}: ledger`);
  }
  assert.equal(await fence.highWater(db, opts('seats/42')), MAX);
  assert.equal(await fence.highWater(db, opts('nothing')), 0n);
  const view = await db.query("SELECT token::text FROM ticketing_fence_tokens WHERE key = 'seats/42'");
  assert.equal(view.rows[0].token, String(MAX));
  assert.equal(await write(db, 'seats/43', '1', 'other-key'), true); // decimal string token
});

test('stale error type; the callback does not run', { skip }, async () => {
  const db = await connect();
  assert.equal(await write(db, 'k1', 10n, 'a'), true);
  let ran = false;
  await assert.rejects(fence.withFence(db, opts('k1', 9n), async () => { ran = true; }), (e) => {
    assert.ok(e instanceof StaleTokenError && e instanceof TicketingError);
    assert.equal(e.code, 'stale_token');
    return true;
  });
  assert.equal(ran, false);
});

test('an error in the callback rolls back the fence too', { skip }, async () => {
  const db = await connect();
  await assert.rejects(fence.withFence(db, opts('k2', 9n), async (tx) => {
    await tx.query('INSERT INTO ledger (id, note) VALUES ($1, $2)', ['x', 'k2']);
    throw new Error('boom');
  }), /boom/);
  assert.equal(await ledgerHas(db, 'x'), false);
  assert.equal(await fence.highWater(db, opts('k2')), 0n);
});

test('a stale holder waits for the open newer transaction, then loses', { skip }, async () => {
  const newer = await connect();
  const stale = await connect();
  assert.equal(await write(newer, 'k3', 10n, 'first'), true);
  await newer.query('BEGIN');
  await fence.advance(newer, opts('k3', 12n));
  let settled = false;
  const pending = write(stale, 'k3', 11n, 'stale').finally(() => { settled = true; });
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(settled, false, 'the stale transaction must wait on the fence row');
  await newer.query('INSERT INTO ledger (id, note) VALUES ($1, $2)', ['newer', 'k3']);
  await newer.query('COMMIT');
  assert.equal(await pending, false);
  assert.equal(await ledgerHas(newer, 'stale'), false);
});

const blockOpts = (keys, token) => ({ dialect: 'postgres', domain: 'test', keys, token });

async function writeBlock(db, keys, token, note) {
  try {
    await fence.withFenceBlock(db, blockOpts(keys, token), (tx) =>
      tx.query('INSERT INTO ledger (id, note) VALUES ($1, $2)', [note, 'block']));
    return true;
  } catch (e) {
    if (e instanceof StaleTokenError) return false;
    throw e;
  }
}

const marks = (db, ...keys) => Promise.all(keys.map((k) => fence.highWater(db, opts(k))));

test('withFenceBlock: every key raised to the one token, or none', { skip }, async () => {
  const db = await connect();
  assert.equal(await write(db, 'seat/b', 10n, 'single'), true);
  const seats = ['seat/c', 'seat/a', 'seat/b'];
  assert.equal(await writeBlock(db, seats, 9n, 'bstale1'), false); // stale on seat/b
  assert.equal(await ledgerHas(db, 'bstale1'), false);
  assert.deepEqual(await marks(db, 'seat/a', 'seat/b', 'seat/c'), [0n, 10n, 0n]);
  assert.equal(await writeBlock(db, seats, 10n, 'bok1'), true); // equal on seat/b
  assert.deepEqual(await marks(db, 'seat/a', 'seat/b', 'seat/c'), [10n, 10n, 10n]);
  assert.equal(await writeBlock(db, ['seat/c', 'seat/a', 'seat/c'], 1n << 63n, 'bok2'), true);
  assert.equal(await writeBlock(db, ['seat/b', 'seat/a'], (1n << 63n) - 1n, 'bstale2'), false); // stale on seat/a
  assert.deepEqual(await marks(db, 'seat/a', 'seat/b', 'seat/c'), [1n << 63n, 10n, 1n << 63n]);
  assert.equal(await write(db, 'seat/b', 11n, 'single2'), true);
  assert.equal(await write(db, 'seat/a', 11n, 'single3'), false);
});

test('a stale block waits for the open newer block transaction, then loses', { skip }, async () => {
  const newer = await connect();
  const stale = await connect();
  assert.equal(await writeBlock(newer, ['x', 'y'], 10n, 'bfirst'), true);
  await newer.query('BEGIN');
  await fence.advanceBlock(newer, blockOpts(['x', 'y'], 12n));
  let finished = false;
  const staleWrite = writeBlock(stale, ['y', 'x'], 11n, 'bstale').then((ok) => { finished = true; return ok; });
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(finished, false, 'the stale transaction must wait for the open newer one');
  await newer.query('COMMIT');
  assert.equal(await staleWrite, false);
  assert.deepEqual(await marks(newer, 'x', 'y'), [12n, 12n]);
});

test('conditionalUpdate: the single-statement form', { skip }, async () => {
  const db = await connect();
  await db.query("INSERT INTO accounts (id, balance) VALUES ('alice', 100)");
  const set = async (balance, token) => {
    try {
      await fence.conditionalUpdate(db, {
        dialect: 'postgres', table: 'accounts', set: 'balance = $1', where: 'id = $2', params: [balance, 'alice'], token,
      });
      return true;
    } catch (e) {
      if (e instanceof StaleTokenError) return false;
      throw e;
    }
  };
  const balance = async () => (await db.query("SELECT balance FROM accounts WHERE id = 'alice'")).rows[0].balance;
  for (const [value, token, ok] of [
    [90, 3n, true], [80, 3n, true], [70, 2n, false],
    [60, 1n << 63n, true], [50, (1n << 63n) - 1n, false],
    [40, MAX, true], [30, MAX - 1n, false],
  ]) {
    const before = await balance();
    assert.equal(await set(value, token), ok, `token ${token}`);
    assert.equal(await balance(), ok ? value : before);
  }
  await assert.rejects(fence.conditionalUpdate(db, {
    dialect: 'postgres', table: 'accounts', set: 'balance = $1', where: 'id = $2', params: [1, 'bob'], token: 5n,
  }), StaleTokenError);
});

// A pg Client behind an adapter that reports `rowCount` as a driver may that
// does not know it (absent, null, -1): the fence cannot tell a stale token
// from a write, so it must refuse, not read "not 0" as success.
const countless = (db, rowCount) => ({
  query: async (sql, params) => {
    const r = await db.query(sql, params);
    return rowCount === 'absent' ? { rows: r.rows } : { rows: r.rows, rowCount };
  },
});

test('no row count from the adapter: a stale token is refused and writes nothing', { skip }, async () => {
  const db = await connect();
  assert.equal(await write(db, 'k-rc', 10n, 'rc-first'), true);
  await db.query('INSERT INTO accounts (id, balance, fence_token) VALUES ($1, 100, $2)', ['rc', fence.encodeToken(10n)]);
  for (const [i, rc] of ['absent', null, -1, 1.5].entries()) {
    await assert.rejects(fence.withFence(countless(db, rc), opts('k-rc', 9n), (tx) =>
      tx.query('INSERT INTO ledger (id, note) VALUES ($1, $2)', [`rc-stale${i}`, 'k-rc'])),
    (e) => e instanceof fence.RowCountError && e.code === 'row_count', `rowCount ${rc}`);
    assert.equal(await ledgerHas(db, `rc-stale${i}`), false, `rowCount ${rc}: the stale write committed`);
    await assert.rejects(fence.withFenceBlock(countless(db, rc), blockOpts(['k-rc', 'k-rc2'], 9n), (tx) =>
      tx.query('INSERT INTO ledger (id, note) VALUES ($1, $2)', [`rc-bstale${i}`, 'k-rc'])), fence.RowCountError);
    assert.equal(await ledgerHas(db, `rc-bstale${i}`), false, `rowCount ${rc}: the stale block write committed`);
    await assert.rejects(fence.conditionalUpdate(countless(db, rc), {
      dialect: 'postgres', table: 'accounts', set: 'balance = $1', where: 'id = $2', params: [1, 'rc'], token: 9n,
    }), fence.RowCountError, `rowCount ${rc}: a stale update reported success`);
  }
  assert.equal(await fence.highWater(db, opts('k-rc')), 10n);
  assert.equal(await fence.highWater(db, opts('k-rc2')), 0n);
});

test('conditionalUpdate: want 0 means one row, never "no check"', { skip }, async () => {
  const db = await connect();
  for (const [id, tok] of [['w1', 10n], ['w2', 1n], ['w3', 1n]]) {
    await db.query('INSERT INTO accounts (id, balance, fence_token) VALUES ($1, 100, $2)', [id, fence.encodeToken(tok)]);
  }
  const upd = (where, params, want, token) => fence.conditionalUpdate(db, {
    dialect: 'postgres', table: 'accounts', set: 'balance = $1', where, params, token, want,
  });
  const balances = async () => (await db.query("SELECT balance FROM accounts WHERE id LIKE 'w%' ORDER BY id")).rows.map((r) => r.balance);
  await assert.rejects(upd('id = $2', [1, 'w1'], 0, 9n), StaleTokenError, 'want 0 and a stale row');
  assert.deepEqual(await balances(), [100, 100, 100]);
  // Two rows where one is expected: not a success (in a transaction, rolled back).
  await db.query('BEGIN');
  await assert.rejects(upd('id IN ($2, $3)', [2, 'w2', 'w3'], 0, 5n), TicketingError, 'want 0 and two rows');
  await db.query('ROLLBACK');
  assert.deepEqual(await balances(), [100, 100, 100]);
  await assert.rejects(upd('id = $2', [3, 'w2'], -1, 5n), RangeError);
  assert.equal(await upd('id = $2', [4, 'w2'], 0, 5n), 1);
  assert.deepEqual(await balances(), [100, 4, 100]);
});

const accounts = async (db, ids) => (await db.query('SELECT id, balance, fence_token FROM accounts WHERE id = ANY($1) ORDER BY id', [ids]))
  .rows.map((r) => `${r.id}=${r.balance}@${fence.decodeToken(r.fence_token)}`).join(' ');

test('conditionalUpdate over several rows writes all or none, outside a transaction', { skip }, async () => {
  // A newer token on one of the rows: the form changed (and committed) the
  // others, then rejected; now it changes none.
  const db = await connect();
  for (const [id, tok] of [['ma', 12n], ['mb', 10n], ['mc', 10n]]) {
    await db.query('INSERT INTO accounts (id, balance, fence_token) VALUES ($1, 100, $2)', [id, fence.encodeToken(tok)]);
  }
  const ids = ['ma', 'mb', 'mc'];
  const upd = (params, want) => fence.conditionalUpdate(db, {
    dialect: 'postgres', table: 'accounts', set: 'balance = balance - $1', where: 'id IN ($2, $3)', params, token: 11n, want,
  });
  const start = 'ma=100@12 mb=100@10 mc=100@10';
  for (const [name, params, want] of [
    ['a newer token on one row', [5, 'ma', 'mb'], 2],
    ['where matches more rows than want', [5, 'mb', 'mc'], 1],
    ['where matches fewer rows than want', [5, 'mb', 'zz'], 2],
  ]) {
    await assert.rejects(upd(params, want), StaleTokenError, name);
    assert.equal(await accounts(db, ids), start, `${name}: the stale holder wrote`);
  }
  assert.equal(await upd([5, 'mb', 'mc'], 2), 2);
  assert.equal(await accounts(db, ids), 'ma=100@12 mb=95@11 mc=95@11');
});

test('conditionalUpdate waits for a newer holder of one of its rows, then writes none', { skip }, async () => {
  const newer = await connect();
  const stale = await connect();
  for (const id of ['na', 'nb']) {
    await newer.query('INSERT INTO accounts (id, balance, fence_token) VALUES ($1, 100, $2)', [id, fence.encodeToken(10n)]);
  }
  const upd = (db, where, params, want, token) => fence.conditionalUpdate(db, {
    dialect: 'postgres', table: 'accounts', set: 'balance = $1', where, params, token, want,
  });
  await newer.query('BEGIN');
  await upd(newer, 'id = $2', [50, 'na'], 1, 12n);
  let settled = false;
  const pending = upd(stale, 'id IN ($2, $3)', [0, 'na', 'nb'], 2, 11n).finally(() => { settled = true; });
  pending.catch(() => {});
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(settled, false, 'the stale update must wait for the open newer transaction');
  await newer.query('COMMIT');
  await assert.rejects(pending, StaleTokenError);
  assert.equal(await accounts(newer, ['na', 'nb']), 'na=50@12 nb=100@10');
});

test('withFence retries: at SERIALIZABLE the newer holder gets 40001, and writes on a retry with the same token', { skip }, async () => {
  // Writers wait on the fence row while a transaction under token 11 holds
  // it; when it commits, each gets a serialization failure (40001).
  const race = async (key, retries, tokens) => {
    const setup = await connect();
    assert.equal(await write(setup, key, 10n, `${key}-first`), true);
    await setup.query('BEGIN ISOLATION LEVEL SERIALIZABLE');
    await fence.advance(setup, opts(key, 11n));
    const holdPid = (await setup.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
    const watch = await connect();
    const writers = await Promise.all(tokens.map(() => connect()));
    const runs = tokens.map((token, i) => fence.withFence(writers[i],
      { ...opts(key, token), begin: 'BEGIN ISOLATION LEVEL SERIALIZABLE', retries },
      (tx) => tx.query('INSERT INTO ledger (id, note) VALUES ($1, $2)', [`${key}-${token}`, key]))
      .then(() => null, (e) => e));
    // The 40001 needs each writer's snapshot taken before setup commits:
    // wait until all of them wait on its row lock.
    for (const deadline = Date.now() + 20000; ;) {
      const r = await watch.query('SELECT count(*)::int AS n FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))', [holdPid]);
      if (r.rows[0].n === tokens.length) break;
      assert.ok(Date.now() < deadline, `${r.rows[0].n} of ${tokens.length} writers wait on the fence row`);
      await new Promise((res) => setTimeout(res, 10));
    }
    await setup.query('COMMIT');
    const errs = await Promise.all(runs);
    const wrote = await Promise.all(tokens.map((token) => ledgerHas(setup, `${key}-${token}`)));
    return tokens.map((_, i) => ({ err: errs[i], wrote: wrote[i] }));
  };
  const [alone] = await race('ser0', 0, [12n]);
  assert.ok(fence.isRetryable(alone.err), `no retry: ${alone.err}, want a serialization failure`);
  assert.equal(alone.err.code, '40001');
  assert.equal(alone.wrote, false);
  const [newer, stale] = await race('ser1', 3, [12n, 10n]);
  assert.equal(newer.err, null, `newer holder with retries: ${newer.err}`);
  assert.equal(newer.wrote, true);
  assert.ok(stale.err instanceof StaleTokenError, `stale holder with retries: ${stale.err}`);
  assert.equal(stale.wrote, false);
  assert.equal(await fence.highWater(await connect(), opts('ser1')), 12n);
  assert.equal(fence.isRetryable(new StaleTokenError()), false);
});

test('withFencePermit: one fencing domain per slot', { skip }, async () => {
  // Slot 0 held by token 10, slot 1 by 11; 12 takes slot 0 and writes: the
  // stale holder of slot 0 is refused, the holder of slot 1 (11 < 12) is not.
  const db = await connect();
  const p = (slot, token) => ({ dialect: 'postgres', domain: 'test', key: 'checkout', slot, token });
  await fence.withFencePermit(db, p(0, 10n), async () => {});
  await fence.withFencePermit(db, { dialect: 'postgres', domain: 'test', permit: { key: 'checkout', token: 11n, slot: 1 } }, async () => {});
  await fence.withFencePermit(db, p(0, 12n), async () => {});
  let ran = false;
  await assert.rejects(fence.withFencePermit(db, p(0, 10n), async () => { ran = true; }), StaleTokenError);
  assert.equal(ran, false);
  await fence.withFencePermit(db, p(1, 11n), async () => {});
  assert.equal(await fence.highWater(db, { dialect: 'postgres', domain: 'test', key: 'checkout 0' }), 12n);
  assert.equal(await fence.highWater(db, { dialect: 'postgres', domain: 'test', key: 'checkout 1' }), 11n);
  assert.equal(await fence.highWater(db, { dialect: 'postgres', domain: 'test', key: 'checkout' }), 0n);
});
