'use strict';

// Owner labels (protocol version 5): the `label` option of acquire,
// acquireBlock, lock and lockBlock against a real `ticketing dev` and a
// fake version-4 sidecar, and HELD and LOST lines that carry labels.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { before, after, test } = require('node:test');
const { startDev } = require('../support/dev');
const { FakeSidecar } = require('../support/fakesidecar');
const ticketing = require('..');
const p = require('../lib/protocol');

let dev;
before(async () => { dev = await startDev(); });
after(async () => { if (dev) await dev.stop(); });

test('label fields, HELD and LOST with labels', () => {
  assert.equal(p.labelField('job-1'), ' label=job-1');
  assert.equal(p.labelField(null), '');
  assert.equal(p.labelField(''), '');
  for (const bad of ['a b', '-', 'l'.repeat(65), 'é']) assert.throws(() => p.labelField(bad), RangeError);
  assert.throws(() => p.labelField(7), TypeError);
  assert.deepEqual(p.parseHeld('HELD 2 a:7 job b:c:9 -'), [{ key: 'a', token: 7n }, { key: 'b:c', token: 9n }]);
  assert.deepEqual(p.parseHeld('HELD 2 a:7 b:9'), [{ key: 'a', token: 7n }, { key: 'b', token: 9n }]);
  assert.deepEqual(p.parseHeldLocks('HELD 2 a:7 job b:c:9 -'),
    [{ key: 'a', token: 7n, label: 'job' }, { key: 'b:c', token: 9n, label: null }]);
  assert.deepEqual(p.parseHeldLocks('HELD 1 a:7'), [{ key: 'a', token: 7n, label: null }]);
  assert.deepEqual(p.parseHeldLocks('HELD 0'), []);
  for (const bad of ['HELD 2 a:7 job', 'HELD 1 :7 x', 'HELD 1 a:7 -x y']) {
    assert.throws(() => p.parseHeldLocks(bad), ticketing.ProtocolError);
  }
  assert.deepEqual(p.parseEvent('! LOST 7 expired job-1 a b', true), { name: 'LOST', token: 7n, reason: 'expired', keys: ['a', 'b'] });
  assert.equal(p.parseEvent('! LOST 7 expired job-1', true), null);
  assert.deepEqual(p.parseEvent('! LOST 7 expired a'), { name: 'LOST', token: 7n, reason: 'expired', keys: ['a'] });
});

test('a version-4 sidecar is never sent a label', async () => {
  const fake = await new FakeSidecar(() => undefined).start();
  const c = new ticketing.Client({ path: fake.path });
  try {
    await assert.rejects(c.acquire('k', { lease: 30, wait: 0, label: 'job' }), ticketing.NotSupportedError);
    await assert.rejects(c.lock('k', { lease: 30, wait: 0, label: 'job' }), ticketing.NotSupportedError);
    assert.equal(await c.acquire('k', { lease: 30, wait: 0 }), 100n);
    assert.deepEqual(fake.lines, ['HELLO 9 events', 'ACQUIRE k 30 0']);
  } finally {
    await c.close();
    await fake.stop();
  }
});

test('labels through a real sidecar: HELD lists them', async () => {
  const prefix = `nodel-${crypto.randomBytes(4).toString('hex')}/`;
  const c = new ticketing.Client({ path: dev.socket });
  try {
    const t1 = await c.acquire(`${prefix}a`, { lease: 30, wait: 0, label: 'job-1' });
    const t2 = await c.acquireBlock([`${prefix}b1`, `${prefix}b2`], { lease: 30, wait: 0, label: 'seats' });
    const lk = await c.lock(`${prefix}c`, { lease: 30, wait: 0, label: 'req/42' });
    assert.equal(await c.raw('HELD'),
      `HELD 4 ${prefix}a:${t1} job-1 ${prefix}b1:${t2} seats ${prefix}b2:${t2} seats ${prefix}c:${lk.token} req/42`);
    assert.equal((await c.held()).length, 4);
    assert.deepEqual((await c.held())[0], { key: `${prefix}a`, token: t1 }); // held keeps its shape
    assert.equal(lk.label, 'req/42');
    const blk = await c.lockBlock([`${prefix}d2`, `${prefix}d1`], { lease: 30, wait: 0, label: 'blk' });
    const plain = await c.lock(`${prefix}e`, { lease: 30, wait: 0 });
    assert.equal(blk.label, 'blk');
    assert.equal(plain.label, null);
    assert.deepEqual(await c.heldLocks(), [
      { key: `${prefix}a`, token: t1, label: 'job-1' },
      { key: `${prefix}b1`, token: t2, label: 'seats' },
      { key: `${prefix}b2`, token: t2, label: 'seats' },
      { key: `${prefix}c`, token: lk.token, label: 'req/42' },
      { key: `${prefix}d1`, token: blk.token, label: 'blk' },
      { key: `${prefix}d2`, token: blk.token, label: 'blk' },
      { key: `${prefix}e`, token: plain.token, label: null },
    ]);
    await c.withLock(`${prefix}f`, { lease: 30, wait: 0, label: 'with-1' }, async (token) => {
      assert.ok((await c.heldLocks()).some((h) => h.key === `${prefix}f` && h.token === token && h.label === 'with-1'));
    });
    await assert.rejects(c.acquire(`${prefix}x`, { lease: 30, wait: 0, label: 'a b' }), RangeError);
    await assert.rejects(c.lock(`${prefix}x`, { lease: 30, wait: 0, label: '-' }), RangeError);
    await assert.rejects(c.lockBlock([`${prefix}x`, `${prefix}y`], { lease: 30, wait: 0, label: 'l'.repeat(65) }), RangeError);
    await blk.release();
    await plain.release();
    await lk.release();
  } finally {
    await c.close();
  }
});
