'use strict';

// A revoked lock (protocol version 9) against a scripted sidecar
// (support/fakesidecar.js; the real sidecar's side of version 9 is built
// apart): the `! REVOKED <token> <by>[ <why>]` line before `! LOST <token>
// revoked` gives the loss its who and why (`revokedBy`, `revokeReason`, on
// the Lock and on its LockLostError); a `LOST revoked` without it (an older
// sidecar) is `revoked` with both null; a REVOKED for a token the
// connection does not hold is ignored; REVOKED is never a reply.

const assert = require('node:assert/strict');
const { afterEach, test } = require('node:test');
const ticketing = require('..');
const p = require('../lib/protocol');
const { fakeSidecarSetup } = require('../support/fakesidecar');

const { LockLostError } = ticketing;
const setup = fakeSidecarSetup(afterEach);
const aborted = (signal) => new Promise((resolve) => {
  if (signal.aborted) resolve();
  else signal.addEventListener('abort', () => resolve(), { once: true });
});
/** A fake sidecar that agrees `version` (default 9) with events. */
const sidecar = (version = 9, respond = () => undefined) => setup((line, peer) => {
  if (line.startsWith('HELLO')) return `HELLO ${version} events`;
  return respond(line, peer);
});

// Not a REVOKED this client takes: ignored, never a reply.
const MALFORMED_REVOKED = [
  '! REVOKED', '! REVOKED ', '! REVOKED 5', '! REVOKED 5 ', '! REVOKED x alice', '! REVOKED 0 alice',
  '! REVOKED -5 alice', `! REVOKED ${(1n << 64n)} alice`, '! REVOKED 5  alice', '! REVOKED 5 alice ',
  '! REVOKED 5 alice  maintenance', '! REVOKED 5 alice maintenance ', `! REVOKED 5 ${'a'.repeat(129)}`,
  `! REVOKED 5 alice ${'w'.repeat(129)}`, '! REVOKED 5 al\tice', '! REVOKED 5 alice main\ttenance',
  '! REVOKED 5 \u00e9lise', '! REVOKED 5 alice d\u00e9j\u00e0', '!REVOKED 5 alice', '! revoked 5 alice',
];

test('the client speaks version 9 and sends HELLO 9 events first', async () => {
  assert.equal(p.PROTOCOL_VERSION, 9);
  assert.equal(ticketing.PROTOCOL_VERSION, 9);
  const { fake, client } = await sidecar();
  await client.ping();
  assert.deepEqual(fake.lines, ['HELLO 9 events', 'PING']);
  assert.equal(await client.hello(), 9);
  assert.equal(await client.eventsEnabled(), true);
});

test('parseEvent: REVOKED fields; malformed lines null', () => {
  assert.deepEqual(p.parseEvent('! REVOKED 7 alice'), { name: 'REVOKED', token: 7n, by: 'alice', why: null });
  assert.deepEqual(p.parseEvent('! REVOKED 7 alice disk full, moving k', true),
    { name: 'REVOKED', token: 7n, by: 'alice', why: 'disk full, moving k' });
  const by = 'b'.repeat(128);
  const why = `${'w '.repeat(63)}ww`;
  assert.deepEqual(p.parseEvent(`! REVOKED 18446744073709551615 ${by} ${why}`),
    { name: 'REVOKED', token: 18446744073709551615n, by, why });
  assert.deepEqual(p.parseEvent('! REVOKED 3 a ~!'), { name: 'REVOKED', token: 3n, by: 'a', why: '~!' });
  assert.deepEqual(p.parseEvent('! LOST 7 revoked job-1 a b', true), { name: 'LOST', token: 7n, reason: 'revoked', keys: ['a', 'b'] });
  for (const line of MALFORMED_REVOKED) {
    assert.equal(p.isEventLine(line), true, line);
    assert.equal(p.parseEvent(line, true), null, line);
  }
});

test('LockLostError: revokedBy, revokeReason and the message', () => {
  let e = new LockLostError('revoked', undefined, { revokedBy: 'alice', revokeReason: 'maintenance' });
  assert.equal(e.message, 'lock lost: revoked by alice: maintenance');
  assert.deepEqual([e.reason, e.revokedBy, e.revokeReason, e.code], ['revoked', 'alice', 'maintenance', 'lost']);
  e = new LockLostError('revoked', undefined, { revokedBy: 'alice' });
  assert.equal(e.message, 'lock lost: revoked by alice');
  e = new LockLostError('revoked');
  assert.deepEqual([e.revokedBy, e.revokeReason, e.message], [null, null, 'lock lost: revoked by an operator']);
  assert.equal(new LockLostError('expired').revokedBy, null);
});

test('REVOKED then LOST revoked: the lock and its error say who and why', async () => {
  const { fake, client } = await sidecar();
  const lock = await client.lockBlock(['a', 'b'], { lease: 30, wait: 0, label: 'job-1' });
  // Between the events, a request: REVOKED is never taken for its reply.
  const ping = client.ping();
  fake.send(`! REVOKED ${lock.token} alice moving the seats to db-2\n`);
  await ping;
  fake.send(`! LOST ${lock.token} revoked job-1 a b\n`);
  await aborted(lock.signal);
  assert.equal(lock.lostReason, 'revoked');
  assert.equal(lock.revokedBy, 'alice');
  assert.equal(lock.revokeReason, 'moving the seats to db-2');
  const e = lock.signal.reason;
  assert.ok(e instanceof LockLostError);
  assert.deepEqual([e.reason, e.revokedBy, e.revokeReason], ['revoked', 'alice', 'moving the seats to db-2']);
  assert.match(e.message, /revoked by alice: moving the seats to db-2/);
  await assert.rejects(lock.extend(30), (err) => err instanceof LockLostError && err.reason === 'revoked'
    && err.revokedBy === 'alice' && err.revokeReason === 'moving the seats to db-2');
  assert.equal(fake.lines.filter((l) => l.startsWith('EXTEND')).length, 0);
});

test('REVOKED without a why: revokeReason null', async () => {
  const { fake, client } = await sidecar();
  const lock = await client.lock('k', { lease: 30, wait: 0 });
  fake.send(`! REVOKED ${lock.token} bob\r\n! LOST ${lock.token} revoked - k\n`);
  await aborted(lock.signal);
  assert.deepEqual([lock.lostReason, lock.revokedBy, lock.revokeReason], ['revoked', 'bob', null]);
  assert.equal(lock.signal.reason.message, 'lock lost: revoked by bob');
});

test('LOST revoked without REVOKED (a sidecar of version 5..8, or 3..4 without labels): revoked, who and why null', async () => {
  for (const [version, label] of [[8, ' -'], [5, ' -'], [4, '']]) {
    const { fake, client } = await sidecar(version);
    const lock = await client.lock('k', { lease: 30, wait: 0 });
    assert.equal(await client.hello(), version);
    fake.send(`! LOST ${lock.token} revoked${label} k\n`);
    await aborted(lock.signal);
    assert.deepEqual([lock.lostReason, lock.revokedBy, lock.revokeReason], ['revoked', null, null], `version ${version}`);
    assert.deepEqual([lock.signal.reason.revokedBy, lock.signal.reason.revokeReason], [null, null]);
  }
});

test('a REVOKED for a token of no lock of ours is ignored', async () => {
  const { fake, client } = await sidecar();
  const lock = await client.lock('k', { lease: 30, wait: 0 });
  const ping = client.ping();
  fake.send(`! REVOKED ${lock.token + 1000n} mallory not yours\n`);
  await ping;
  assert.deepEqual(await client.held(), []); // the fake's HELD 0: replies still matched
  assert.equal(lock.lost, false);
  assert.equal(lock.revokedBy, null);
  // The lock's own revoke, without its REVOKED line: the other token's is not taken for it.
  fake.send(`! LOST ${lock.token} revoked - k\n`);
  await aborted(lock.signal);
  assert.deepEqual([lock.lostReason, lock.revokedBy, lock.revokeReason], ['revoked', null, null]);
});

test('a REVOKED gives who and why to a revoked loss only', async () => {
  const { fake, client } = await sidecar();
  const lock = await client.lock('k', { lease: 30, wait: 0 });
  fake.send(`! REVOKED ${lock.token} alice\n! LOST ${lock.token} expired - k\n`);
  await aborted(lock.signal);
  assert.deepEqual([lock.lostReason, lock.revokedBy, lock.revokeReason], ['expired', null, null]);
});

test('REVOKED and LOST in the same chunk as the grant, before the Lock exists', async () => {
  const { client } = await sidecar(9, (line) => {
    if (line.startsWith('ACQUIRE')) return 'OK 77\n! REVOKED 77 alice right away\n! LOST 77 revoked - k';
    return undefined;
  });
  const lock = await client.lock('k', { lease: 30, wait: 0 });
  await aborted(lock.signal);
  assert.deepEqual([lock.lostReason, lock.revokedBy, lock.revokeReason], ['revoked', 'alice', 'right away']);
});

test('the local deadline, then a revoke: the reason and who replace it', async () => {
  const { fake, client } = await sidecar();
  const lock = await client.lock('k', { lease: 1, wait: 0 });
  await aborted(lock.signal);
  assert.equal(lock.lostReason, 'deadline');
  fake.send(`! REVOKED ${lock.token} alice late news\n! LOST ${lock.token} revoked - k\n`);
  await client.ping();
  assert.deepEqual([lock.lostReason, lock.revokedBy, lock.revokeReason], ['revoked', 'alice', 'late news']);
  assert.equal(lock.signal.reason.reason, 'deadline'); // the signal keeps its first reason
});

test('everything a version-9 sidecar writes before an ACQUIRE reply is an event, never the reply', async () => {
  const positions = [];
  let queued = 0;
  const { fake, client } = await sidecar(9, (line) => {
    if (line === 'ACQUIRE w 30 5') {
      return '! QUEUED 3 w\n! POSITION 3 2 - w\n! REVOKED 100 ops\n! LOST 100 revoked - h\n'
        + '! NEWS 1 2 3\n! POSITION 3 1 4 w\nOK 200';
    }
    return undefined;
  });
  const held = await client.lock('h', { lease: 30, wait: 0 }); // token 100
  assert.equal(held.token, 100n);
  const lock = await client.lock('w', {
    lease: 30, wait: 5, onQueued: () => { queued++; }, onPosition: (r) => positions.push(r),
  });
  assert.equal(lock.token, 200n);
  assert.equal(queued, 1);
  assert.deepEqual(positions, [{ key: 'w', position: 2, estimate: null }, { key: 'w', position: 1, estimate: 4 }]);
  assert.deepEqual([held.lostReason, held.revokedBy, held.revokeReason], ['revoked', 'ops', null]);
  assert.equal(lock.lost, false);
  assert.deepEqual(fake.lines, ['HELLO 9 events', 'ACQUIRE h 30 0', 'ACQUIRE w 30 5']);
});
