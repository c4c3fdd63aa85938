'use strict';

// Attack round on the renewal of a grant that waited (commit 9a76315):
// interleavings while the renewal's EXTEND is in flight, before lock()
// resolves.

const assert = require('node:assert/strict');
const { afterEach, test } = require('node:test');
const ticketing = require('..');
const { fakeSidecarSetup } = require('../support/fakesidecar');


const setup = fakeSidecarSetup(afterEach);

test('a ! LOST event during the renewal, then INDETERMINATE: the lock comes lost (expired)', async () => {
  const { fake, client } = await setup((line, peer) => {
    if (line.startsWith('ACQUIRE')) {
      setTimeout(() => peer.write('OK 100\n'), 500); // of a 1 s lease: 0.24 s of the ACQUIRE's validity left
      return null;
    }
    if (line.startsWith('EXTEND')) {
      peer.write('! LOST 100 expired k\n');
      return 'INDETERMINATE';
    }
    return undefined;
  });
  const lock = await client.lock('k', { lease: 1, wait: 300 });
  assert.equal(fake.lines.filter((l) => l.startsWith('EXTEND')).length, 1);
  assert.equal(lock.lostReason, 'expired');
  assert.equal(lock.remaining(), 0);
  assert.ok(lock.signal.aborted);
});

test('client.release of the token during the renewal: the lock comes released, no validity', async () => {
  let client;
  let released;
  const { client: c } = await setup((line, peer) => {
    if (line.startsWith('ACQUIRE')) {
      setTimeout(() => peer.write('OK 100\n'), 500);
      return null;
    }
    if (line.startsWith('EXTEND')) {
      released = client.release('k', 100n);
      setTimeout(() => peer.write('OK\n'), 100); // the EXTEND's OK, then the RELEASE's (default)
      return null;
    }
    return undefined;
  });
  client = c;
  const lock = await client.lock('k', { lease: 1, wait: 300 });
  await released;
  assert.equal(lock.released, true);
  assert.equal(lock.remaining(), 0);
});

test('a grant with more than half its lease left is not renewed (lock and withLock)', async () => {
  const { fake, client } = await setup((line, peer) => {
    if (line.startsWith('ACQUIRE')) {
      setTimeout(() => peer.write(`OK ${100 + fake.lines.length}\n`), 200); // of a 2 s lease: 1.53 s of 1.73 s left
      return null;
    }
    return undefined;
  });
  const lock = await client.lock('k', { lease: 2, wait: 300 });
  assert.ok(lock.remaining() > 1.4 && lock.remaining() < 1.55, `remaining ${lock.remaining()}`);
  await lock.release();
  await client.withLock('k', { lease: 2, wait: 300 }, async () => {});
  assert.deepEqual(fake.lines.filter((l) => l.startsWith('EXTEND')), []);
});
