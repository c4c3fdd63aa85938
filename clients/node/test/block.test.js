'use strict';

// Seat blocks (acquireBlock, withBlock) against a real `ticketing dev`, and
// against a fake version-1 sidecar.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { before, after, beforeEach, afterEach, test } = require('node:test');
const { startDev } = require('../support/dev');
const { startQueued } = require('../support/queued');
const ticketing = require('..');
const p = require('../lib/protocol');

const { Client } = ticketing;

let dev;
before(async () => { dev = await startDev(); });
after(async () => { if (dev) await dev.stop(); });

let prefix;
let clients;
const keys = (...names) => names.map((n) => prefix + n);
const client = (socket = dev.socket) => {
  const c = new Client({ path: socket });
  clients.push(c);
  return c;
};
beforeEach(() => {
  prefix = `nodeb-${crypto.randomBytes(4).toString('hex')}/`;
  clients = [];
});
afterEach(() => Promise.all(clients.map((c) => c.close())));

test('block lines and argument checks', async () => {
  assert.deepEqual(p.acquireBlockLine(['s/1', 's/2'], 30, 5), { line: 'ACQUIRE s/1 s/2 30 5', waitSeconds: 5, keys: ['s/1', 's/2'] });
  assert.equal(p.acquireBlockLine(['k'], 10, 0.25).line, 'ACQUIRE k 10 0.25');
  for (const bad of [[], ['a', 'a'], ['a', 'b', 'a'], Array.from({ length: 17 }, (_, i) => `k${i}`), ['ok', 'with space']]) {
    assert.throws(() => p.checkKeys(bad), RangeError, JSON.stringify(bad));
  }
  for (const bad of ['seat/1', null, 5, ['ok', 5]]) assert.throws(() => p.checkKeys(bad), TypeError);
  assert.equal(p.parseHello('HELLO 2'), 2);
  assert.equal(p.parseHello('HELLO 3'), 3);
  assert.equal(p.parseHello('HELLO 4'), 4);
  assert.equal(p.parseHello('HELLO 5'), 5);
  assert.equal(p.parseHello('ERR unknown_verb unixapi: unknown verb: "HELLO"'), 1);
  assert.equal(p.parseHello('HELLO 7'), 7);
  assert.equal(p.parseHello('HELLO 8'), 8);
  assert.equal(p.parseHello('HELLO 9'), 9);
  assert.throws(() => p.parseHello('HELLO 10'), ticketing.ProtocolError);
  assert.throws(() => p.parseHello('ERR bad_request x'), ticketing.ServerError);
  const c = new Client({ path: '/nonexistent/ticketing.sock' });
  await assert.rejects(c.acquireBlock(['a', 'a']), RangeError);
  await assert.rejects(c.acquireBlock(['a', 'b'], { lease: 0 }), RangeError);
  await assert.rejects(c.withBlock(['a', 'a'], () => {}), RangeError);
  assert.equal(c.requestsSent, 0);
});

test('acquireBlock: one token, HELD lists every key, any key releases', async () => {
  const a = client();
  const b = client();
  const seats = keys('seat/2', 'seat/1', 'seat/3');
  // The version both speak with the sidecar of this tree (the client may be
  // a version ahead while the sidecar's side of it is built).
  assert.equal(await a.hello(), Math.min(p.PROTOCOL_VERSION, (await a.info()).protocol));
  const t1 = await a.acquireBlock(seats, { lease: 30, wait: 0 });
  assert.equal(typeof t1, 'bigint');
  const held = (await a.held()).sort((x, y) => (x.key < y.key ? -1 : 1));
  assert.deepEqual(held, [...seats].sort().map((k) => ({ key: k, token: t1 })));
  for (const k of seats) await assert.rejects(b.acquire(k, { lease: 10, wait: 0 }), ticketing.BusyError);
  await assert.rejects(b.acquireBlock(seats.slice(1), { lease: 10, wait: 0 }), ticketing.BusyError);
  await a.release(seats[2], t1);
  assert.deepEqual(await a.held(), []);
  const t2 = await b.acquireBlock(seats, { lease: 10, wait: 0 });
  assert.ok(t2 > t1);
});

test('withBlock releases on success and on throw', async () => {
  const a = client();
  const b = client();
  const seats = keys('a', 'b');
  const got = await a.withBlock(seats, { lease: 30, wait: 5 }, async (token) => {
    assert.equal((await a.held()).length, 2);
    return token;
  });
  assert.equal(typeof got, 'bigint');
  await assert.rejects(a.withBlock(seats, { lease: 30, wait: 5 }, () => { throw new Error('boom'); }), /boom/);
  assert.deepEqual(await a.held(), []);
  assert.ok(await b.acquireBlock(seats, { lease: 10, wait: 0 }) > got);
});

test('a waiting block: timeout leaves nothing, reserved keys, granted on the last release', async () => {
  const a = client();
  const b = client();
  const c = client();
  const [k1, k2, k3] = keys('k1', 'k2', 'k3');
  const t1 = await b.acquire(k2, { lease: 30, wait: 0 });
  const t0 = performance.now();
  await assert.rejects(a.acquireBlock([k1, k2, k3], { lease: 30, wait: 0.3 }), ticketing.LockTimeoutError);
  assert.ok(performance.now() - t0 >= 250);
  assert.deepEqual(await a.held(), []);
  const { call: waiting, queued } = startQueued((onQueued) => a.acquireBlock([k1, k2, k3], { lease: 30, wait: 30, onQueued }));
  await queued;
  await assert.rejects(c.acquire(k1, { lease: 10, wait: 0 }), ticketing.BusyError); // reserved
  await b.release(k2, t1);
  assert.ok(await waiting > t1);
});

test('closing a client releases its block', async () => {
  const a = client();
  const b = client();
  const seats = keys('x', 'y');
  const t1 = await a.acquireBlock(seats, { lease: 60, wait: 0 });
  // Queued before the close, and the wait ends long before a's lease
  // would: only the close can grant it.
  const { call: waiter, queued } = startQueued((onQueued) => b.acquireBlock(seats, { lease: 10, wait: 30, onQueued }));
  await queued;
  await a.close();
  assert.ok(await waiter > t1);
});

test('a version-1 sidecar: a block is NotSupportedError, nothing but HELLO sent', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tk-fake-'));
  const sock = path.join(dir, 's.sock');
  const lines = [];
  const server = net.createServer((conn) => {
    let buf = '';
    conn.on('data', (d) => {
      buf += d;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        lines.push(line);
        if (line.startsWith('HELLO')) conn.write('ERR unknown_verb unixapi: unknown verb: "HELLO" (verbs are PING, ACQUIRE, RELEASE, INFO, HELD; upper case)\n');
        else if (line.startsWith('ACQUIRE ')) conn.write(line.split(' ').length === 4 ? 'OK 7\n' : 'ERR bad_request fields\n');
        else conn.write('OK\n');
      }
    });
  });
  await new Promise((r) => server.listen(sock, r));
  try {
    const c = client(sock);
    assert.equal(await c.acquireBlock(['only'], { lease: 30, wait: 0 }), 7n);
    for (let i = 0; i < 2; i++) {
      await assert.rejects(c.acquireBlock(['a', 'b'], { lease: 30, wait: 0 }),
        (e) => e instanceof ticketing.NotSupportedError && /version 1/.test(e.message) && e.code === 'not_supported');
    }
    await assert.rejects(c.withBlock(['a', 'b'], () => assert.fail('entered')), ticketing.NotSupportedError);
    assert.equal(await c.hello(), 1);
    assert.deepEqual(lines, ['HELLO 9 events', 'ACQUIRE only 30 0']);
    await c.close();
  } finally {
    await new Promise((r) => server.close(r));
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
