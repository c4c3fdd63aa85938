'use strict';

// The fence helpers take the fencing domain from the client that took the
// lock (INFO's `domain` field), against a real `ticketing dev`: marks land
// under the domain, never under the cluster id. The database is a small
// in-memory store with the fencing table's semantics (the SQL itself is
// tested on PostgreSQL in ../fence-test).

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { before, after, test } = require('node:test');
const { startDev } = require('../support/dev');
const ticketing = require('..');

const { Client, fence, StaleTokenError } = ticketing;

let dev;
before(async () => { dev = await startDev(); });
after(async () => { if (dev) await dev.stop(); });

/** A store of high-water marks by (domain, key), as the fencing table keeps them. */
function memoryDb() {
  const marks = new Map();
  return {
    marks,
    mark: (domain, key) => (marks.has(`${domain}\n${key}`) ? fence.decodeToken(marks.get(`${domain}\n${key}`)) : 0n),
    async query(sql, params) {
      if (!sql.startsWith('INSERT')) return { rowCount: 0 }; // BEGIN, COMMIT, ROLLBACK
      const [domain, key, enc] = params;
      const id = `${domain}\n${key}`;
      if (marks.has(id) && BigInt(marks.get(id)) > BigInt(enc)) return { rowCount: 0 };
      marks.set(id, enc);
      return { rowCount: 1 };
    },
  };
}

test('Client.domain() is INFO\'s domain, not the cluster id', async () => {
  const c = new Client({ path: dev.socket });
  try {
    const info = await c.info();
    assert.ok(info.domain);
    assert.notEqual(info.domain, info.cluster);
    assert.equal(await c.domain(), info.domain);
    assert.equal(await fence.domainOf({ client: c }), info.domain);
    assert.equal(await fence.domainOf({ client: c, domain: 'explicit' }), 'explicit');
    await assert.rejects(fence.domainOf({}), TypeError);
  } finally {
    await c.close();
  }
});

test('withFence and withFenceBlock given the client fence under its domain', async () => {
  const c = new Client({ path: dev.socket });
  const key = `fence-domain-${crypto.randomBytes(4).toString('hex')}`;
  try {
    const { domain, cluster } = await c.info();
    const db = memoryDb();
    await c.withLock(key, { lease: 30, wait: 0 }, async (token) => {
      await fence.withFence(db, { dialect: 'postgres', client: c, key, token }, async () => {});
      assert.equal(db.mark(domain, key), token);
      assert.equal(db.mark(cluster, key), 0n);
      // A newer token under the domain: the lock's write is stale.
      await fence.withFence(db, { dialect: 'postgres', domain, key, token: token + 1n }, async () => {});
      let ran = false;
      await assert.rejects(
        fence.withFence(db, { dialect: 'postgres', client: c, key, token }, async () => { ran = true; }),
        StaleTokenError,
      );
      assert.equal(ran, false);
    });
    const keys = [`${key}/a`, `${key}/b`];
    await c.withBlock(keys, { lease: 30, wait: 0 }, async (token) => {
      await fence.withFenceBlock(db, { dialect: 'postgres', client: c, keys, token }, async () => {});
      for (const k of keys) {
        assert.equal(db.mark(domain, k), token);
        assert.equal(db.mark(cluster, k), 0n);
      }
    });
  } finally {
    await c.close();
  }
});

test('withFencePermit fences each permit under \'<key> <slot>\': a stale holder of a slot is refused, the other slot is not', async () => {
  const admin = new Client({ path: dev.socket });
  const c = new Client({ path: dev.socket });
  const key = `fence-permit-${crypto.randomBytes(4).toString('hex')}`;
  try {
    const domain = await c.domain();
    await admin.setPermits(key, 2);
    const db = memoryDb();
    const first = await c.lockPermit(key, { lease: 30, wait: 0 });
    const second = await c.acquirePermit(key, { lease: 30, wait: 0 });
    await fence.withFencePermit(db, { dialect: 'postgres', client: c, permit: first }, async () => {});
    await fence.withFencePermit(db, { dialect: 'postgres', client: c, permit: second }, async () => {});
    assert.equal(db.mark(domain, first.fenceKey), first.token);
    assert.equal(db.mark(domain, second.fenceKey), second.token);
    assert.equal(db.mark(domain, key), 0n);
    // A newer token wrote the first permit's slot.
    const newer = (first.token > second.token ? first.token : second.token) + 1n;
    await fence.withFencePermit(db, { dialect: 'postgres', domain, key, slot: first.slot, token: newer }, async () => {});
    let ran = false;
    await assert.rejects(
      fence.withFencePermit(db, { dialect: 'postgres', client: c, permit: first }, async () => { ran = true; }),
      StaleTokenError,
    );
    assert.equal(ran, false);
    await fence.withFencePermit(db, { dialect: 'postgres', client: c, permit: second }, async () => {});
    await assert.rejects(fence.withFencePermit(db, { dialect: 'postgres', domain, key, slot: -1, token: 5n }, async () => {}), RangeError);
    await first.release();
    await c.release(key, second.token);
  } finally {
    await c.close();
    await admin.close();
  }
});

test('a lock named like a slot (<key>#0) and slot 0 of <key> fence apart: neither live holder is refused', async () => {
  const c = new Client({ path: dev.socket });
  const key = `fence-permit-${crypto.randomBytes(4).toString('hex')}/checkout`;
  try {
    const domain = await c.domain();
    await c.setPermits(key, 2);
    const db = memoryDb();
    const permit = await c.lockPermit(key, { lease: 30, wait: 0 });
    const lock = await c.lock(`${key}#0`, { lease: 30, wait: 0 });
    assert.equal(permit.slot, 0);
    // The newer token writes first: on one shared row (as under
    // '<key>#<slot>') the older live holder would be refused.
    const order = permit.token > lock.token ? [permit, lock] : [lock, permit];
    for (const lk of order) {
      if (lk.permit) {
        await fence.withFencePermit(db, { dialect: 'postgres', client: c, permit: lk }, async () => {});
      } else {
        await fence.withFence(db, { dialect: 'postgres', client: c, key: lk.fenceKey, token: lk.token }, async () => {});
      }
    }
    assert.equal(db.mark(domain, `${key} 0`), permit.token);
    assert.equal(db.mark(domain, `${key}#0`), lock.token);
    assert.equal(permit.fenceKey, `${key} 0`);
    assert.equal(lock.fenceKey, `${key}#0`);
    await permit.release();
    await lock.release();
  } finally {
    await c.close();
  }
});
