'use strict';

// Semaphores (protocol version 8): acquirePermit, lockPermit, withPermit
// and setPermits on a scripted fake sidecar (lines, grants, error classes,
// an older sidecar) and against a real `ticketing dev` (distinct slots,
// FIFO hand-off of a freed slot, a raised n granting a waiter, withPermit
// releasing on exit).

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { before, after, afterEach, test } = require('node:test');
const { startDev } = require('../support/dev');
const { fakeSidecarSetup } = require('../support/fakesidecar');
const ticketing = require('..');
const p = require('../lib/protocol');

let dev;
before(async () => { dev = await startDev(); });
after(async () => { if (dev) await dev.stop(); });
const setup = fakeSidecarSetup(afterEach);

/** A version-`v` sidecar: PERMIT grants slot 3 with increasing tokens. */
function permitSidecar(v = 8, overrides = {}) {
  let next = 100n;
  return (line) => {
    const verb = line.split(' ')[0];
    if (verb in overrides) return overrides[verb];
    if (verb === 'HELLO') return `HELLO ${v} events`;
    if (verb === 'PERMIT' && v >= 8) return `OK ${++next} 3`;
    if (verb === 'PERMITS' && v >= 8) return 'OK';
    return undefined;
  };
}

test('PERMIT and PERMITS lines and replies', () => {
  assert.equal(p.helloEventsLine(), 'HELLO 9 events');
  assert.deepEqual(p.permitLine('k', 30, 1.5), { line: 'PERMIT k 30 1.5', waitSeconds: 1.5 });
  assert.deepEqual(p.parsePermit('OK 12 0'), { token: 12n, slot: 0 });
  for (const bad of ['OK 12', 'OK 12 x', 'OK 0 1', 'OK 12 100000', 'OK 12 1 2']) {
    assert.throws(() => p.parsePermit(bad), ticketing.ProtocolError, bad);
  }
  assert.equal(p.permitsLine('k', 0), 'PERMITS k 0');
  assert.throws(() => p.permitsLine('k', -1), RangeError);
  assert.throws(() => p.permitsLine('k', 100001), RangeError);
  assert.throws(() => p.permitsLine('k', 1.5), TypeError);
  for (const [reply, cls] of [['ERR is_semaphore x', ticketing.IsSemaphoreError], ['ERR not_semaphore x', ticketing.NotSemaphoreError],
    ['ERR invalid_permits x', ticketing.InvalidPermitsError], ['ERR in_use x', ticketing.InUseError],
    ['ERR unknown_verb x', ticketing.NotSupportedError]]) {
    assert.throws(() => p.parsePermits(reply), cls, reply);
  }
  // The new codes stay ServerErrors with their code.
  const e = p.errorFrom('ERR is_semaphore k is a semaphore');
  assert.ok(e instanceof ticketing.ServerError && e instanceof ticketing.IsSemaphoreError);
  assert.equal(e.code, 'is_semaphore');
  assert.equal(ticketing.fenceKey('k', 3), 'k 3');
  // A space joins them, a byte no key holds: no lock key is a slot's fence
  // key (the lock `checkout#0` was slot 0 of `checkout`'s under '#').
  for (const key of ['checkout', 'checkout#0', '#', 'a'.repeat(255)]) {
    for (const slot of [0, 1, 10, ticketing.MAX_PERMITS - 1]) {
      const fk = ticketing.fenceKey(key, slot);
      assert.notEqual(fk, 'checkout#0');
      assert.throws(() => p.checkKey(fk), RangeError, fk);
    }
  }
});

test('fake: acquirePermit, lockPermit, withPermit, setPermits', async () => {
  const { fake, client } = await setup(permitSidecar());
  await client.setPermits('room', 2);
  assert.deepEqual(await client.acquirePermit('room', { lease: 30, wait: 0, label: 'job' }),
    { key: 'room', token: 101n, slot: 3, fenceKey: 'room 3' });
  const lk = await client.lockPermit('room', { lease: 30, wait: 0 });
  assert.equal(lk.permit, true);
  assert.equal(lk.slot, 3);
  assert.equal(lk.fenceKey, 'room 3');
  assert.equal(lk.token, 102n);
  await lk.release();
  const got = await client.withPermit('room', { lease: 30, wait: 0 }, (token, l) => [token, l.slot, l.fenceKey]);
  assert.deepEqual(got, [103n, 3, 'room 3']);
  assert.deepEqual(fake.lines.slice(1), ['PERMITS room 2', 'PERMIT room 30 0 label=job', 'PERMIT room 30 0',
    'RELEASE room 102', 'PERMIT room 30 0', 'RELEASE room 103']);
  // A lock is no permit.
  const plain = await client.lock('plain', { lease: 30, wait: 0 });
  assert.equal(plain.permit, false);
  assert.equal(plain.slot, null);
  assert.equal(plain.fenceKey, 'plain');
  await plain.release();
});

test('fake: errors map to their classes', async () => {
  const { client } = await setup(permitSidecar(8, { PERMIT: 'ERR not_semaphore room is none', PERMITS: 'ERR in_use room is held' }));
  await assert.rejects(client.acquirePermit('room', { wait: 0 }), ticketing.NotSemaphoreError);
  await assert.rejects(client.lockPermit('room', { wait: 0 }), ticketing.NotSemaphoreError);
  await assert.rejects(client.withPermit('room', { wait: 0 }, () => assert.fail('ran')), ticketing.NotSemaphoreError);
  await assert.rejects(client.setPermits('room', 2), ticketing.InUseError);
  const { client: c2 } = await setup(permitSidecar(8, { PERMIT: 'OK 5', PERMITS: 'INDETERMINATE' }));
  await assert.rejects(c2.acquirePermit('room', { wait: 0 }), ticketing.ProtocolError);
  await assert.rejects(c2.setPermits('room', 2), ticketing.IndeterminateError);
});

test('fake: a version-7 sidecar is sent no PERMIT or PERMITS', async () => {
  const { fake, client } = await setup(permitSidecar(7));
  await assert.rejects(client.acquirePermit('room', { wait: 0 }), ticketing.NotSupportedError);
  await assert.rejects(client.lockPermit('room', { wait: 0 }), ticketing.NotSupportedError);
  await assert.rejects(client.setPermits('room', 1), ticketing.NotSupportedError);
  assert.deepEqual(fake.lines, ['HELLO 9 events']);
});

test('real sidecar: slots, FIFO hand-off, raising n, mismatches', async () => {
  const k = `nodep-${crypto.randomBytes(4).toString('hex')}/room`;
  const clients = [];
  const client = () => { const c = new ticketing.Client({ path: dev.socket }); clients.push(c); return c; };
  try {
    const admin = client();
    await admin.setPermits(k, 2);
    await admin.setPermits(k, 2); // idempotent
    const a = await client().acquirePermit(k, { lease: 30, wait: 0 });
    const holderB = client();
    const b = await holderB.lockPermit(k, { lease: 30, wait: 0 });
    assert.deepEqual(new Set([a.slot, b.slot]), new Set([0, 1]));
    assert.notEqual(a.token, b.token);
    await assert.rejects(client().acquirePermit(k, { wait: 0 }), ticketing.BusyError);

    // The third waits; once queued, a's release hands it a's slot.
    let queued;
    const isQueued = new Promise((r) => { queued = r; });
    const third = client().lockPermit(k, { lease: 30, wait: 20, onQueued: () => queued() });
    await isQueued;
    await clients[1].release(k, a.token);
    const c = await third;
    assert.equal(c.slot, a.slot);
    assert.ok(c.token > b.token);

    // A fourth waits until n is raised to 3: slot 2.
    let queued4;
    const isQueued4 = new Promise((r) => { queued4 = r; });
    const fourth = client().lockPermit(k, { lease: 30, wait: 20, onQueued: () => queued4() });
    await isQueued4;
    await admin.setPermits(k, 3);
    const d = await fourth;
    assert.equal(d.slot, 2);
    await d.extend(40); // by its token, like a lock

    await assert.rejects(admin.acquire(k, { lease: 30, wait: 0 }), ticketing.IsSemaphoreError);
    const plain = `${k}-plain`;
    await assert.rejects(admin.acquirePermit(plain, { wait: 0 }), ticketing.NotSemaphoreError);
    await admin.acquire(plain, { lease: 30, wait: 0 });
    await assert.rejects(admin.setPermits(plain, 2), ticketing.InUseError);
    await assert.rejects(admin.setPermits(k, 0), ticketing.InUseError);
    for (const l of [b, c, d]) await l.release();
    await admin.setPermits(k, 0);
    await assert.rejects(admin.acquirePermit(k, { wait: 0 }), ticketing.NotSemaphoreError);
  } finally {
    for (const c of clients) await c.close();
  }
});

test('real sidecar: withPermit releases on exit, also when fn throws', async () => {
  const k = `nodep-${crypto.randomBytes(4).toString('hex')}/one`;
  const admin = new ticketing.Client({ path: dev.socket });
  const c = new ticketing.Client({ path: dev.socket });
  try {
    await admin.setPermits(k, 1);
    const slot = await c.withPermit(k, { lease: 30, wait: 0 }, async (token, lock) => {
      await assert.rejects(admin.acquirePermit(k, { wait: 0 }), ticketing.BusyError);
      return lock.slot;
    });
    assert.equal(slot, 0);
    await assert.rejects(c.withPermit(k, { lease: 30, wait: 0 }, () => { throw new Error('boom'); }), /boom/);
    const again = await admin.acquirePermit(k, { wait: 0 });
    assert.equal(again.slot, 0);
  } finally {
    await c.close();
    await admin.close();
  }
});

test('fake: a waiting permit gets onQueued and onPosition, as an acquire', async () => {
  const positions = [];
  let queued = 0;
  const { client } = await setup((line) => {
    if (line.startsWith('HELLO')) return 'HELLO 8 events';
    if (line.startsWith('PERMIT ')) return '! QUEUED 2 room\n! POSITION 2 3 - room\n! POSITION 2 1 4 room\nOK 9 1';
    return undefined;
  });
  const lk = await client.lockPermit('room', { lease: 30, wait: 5, onQueued: () => { queued++; }, onPosition: (p) => positions.push(p) });
  assert.equal(lk.slot, 1);
  assert.equal(queued, 1);
  assert.deepEqual(positions, [{ key: 'room', position: 3, estimate: null }, { key: 'room', position: 1, estimate: 4 }]);
});
