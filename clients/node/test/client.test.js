'use strict';

// The Client against a real `ticketing dev` (one per file).

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { before, after, beforeEach, afterEach, test } = require('node:test');
const { startDev } = require('../support/dev');
const { startQueued } = require('../support/queued');
const ticketing = require('..');

const { Client } = ticketing;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let dev;
before(async () => { dev = await startDev(); });
after(async () => { if (dev) await dev.stop(); });

let prefix;
let clients;
const key = (name) => prefix + name;
const client = () => {
  const c = new Client({ path: dev.socket });
  clients.push(c);
  return c;
};
beforeEach(() => {
  prefix = `node-${crypto.randomBytes(4).toString('hex')}/`;
  clients = [];
});
afterEach(() => Promise.all(clients.map((c) => c.close())));

test('acquire, busy, timeout, release', async () => {
  const a = client();
  const b = client();
  await a.ping();
  const t1 = await a.acquire(key('seats/42'), { lease: 30, wait: 0 });
  assert.equal(typeof t1, 'bigint');
  assert.deepEqual(await a.held(), [{ key: key('seats/42'), token: t1 }]);
  await assert.rejects(b.acquire(key('seats/42'), { lease: 10, wait: 0 }), ticketing.BusyError);
  const t0 = performance.now();
  await assert.rejects(b.acquire(key('seats/42'), { lease: 10, wait: 0.2 }), ticketing.TimeoutError);
  assert.ok(performance.now() - t0 >= 150);
  await a.release(key('seats/42'), t1);
  await assert.rejects(a.release(key('seats/42'), t1), (e) => e instanceof ticketing.ServerError && e.code === 'not_held');
  const t2 = await b.acquire(key('seats/42'), { lease: 10, wait: 0 });
  assert.ok(t2 > t1);
  await b.release(key('seats/42'), String(t2)); // tokens as decimal strings work too
});

test('withLock releases on success and on throw', async () => {
  const a = client();
  const b = client();
  const result = await a.withLock(key('k'), { lease: 30, wait: 1 }, async (token) => {
    assert.equal(typeof token, 'bigint');
    await assert.rejects(b.acquire(key('k'), { wait: 0 }), ticketing.BusyError);
    return 'done';
  });
  assert.equal(result, 'done');
  await assert.rejects(a.withLock(key('k'), { wait: 1 }, () => { throw new Error('boom'); }), /boom/);
  assert.deepEqual(await a.held(), []);
  const t = await b.acquire(key('k'), { wait: 0 });
  await b.release(key('k'), t);
});

test('withLock rejects when the release fails', async () => {
  const a = client();
  await assert.rejects(
    a.withLock(key('k'), { wait: 0 }, (token) => a.release(key('k'), token)),
    (e) => e instanceof ticketing.ServerError && e.code === 'not_held',
  );
});

test('FIFO hand-off between clients, increasing tokens', async () => {
  const holder = client();
  const t0 = await holder.acquire(key('k'), { lease: 30, wait: 0 });
  const order = [];
  const waiters = [];
  for (let i = 0; i < 3; i++) {
    const c = client();
    // The next waiter starts once this one is in the key's queue.
    const { call, queued } = startQueued((onQueued) => c.withLock(key('k'), { lease: 30, wait: 30, onQueued },
      (token) => { order.push([i, token]); }));
    waiters.push(call);
    await queued;
  }
  await holder.release(key('k'), t0);
  await Promise.all(waiters);
  assert.deepEqual(order.map(([i]) => i), [0, 1, 2]);
  assert.ok(order[0][1] > t0 && order[1][1] > order[0][1] && order[2][1] > order[1][1]);
});

test('pipelined requests on one connection', async () => {
  const c = client();
  const tokens = await Promise.all(Array.from({ length: 50 }, (_, i) => c.acquire(key(`k${i}`), { lease: 10, wait: 0 })));
  assert.equal(new Set(tokens.map(String)).size, 50);
  assert.equal((await c.held()).length, 50);
  await Promise.all(tokens.map((t, i) => c.release(key(`k${i}`), t)));
  assert.deepEqual(await c.held(), []);
  const info = await c.info();
  assert.ok(info.cluster);
  assert.ok(info.total >= 3 && info.connected <= info.total);
});

test('closing a client releases its locks', async () => {
  const a = client();
  const b = client();
  const t1 = await a.acquire(key('k'), { lease: 60, wait: 0 });
  // The waiter is in the queue before the close (not arriving after it),
  // and its wait ends long before a's lease would: a grant can only come
  // from the close.
  const { call: waiting, queued } = startQueued((onQueued) => b.acquire(key('k'), { lease: 10, wait: 30, onQueued }));
  await queued;
  await a.close();
  assert.ok(await waiting > t1);
  await assert.rejects(a.ping(), ticketing.SidecarConnectionError);
});

test('reconnects after the sidecar closed the connection', async () => {
  const c = client();
  await c.acquire(key('k'), { lease: 60, wait: 0 });
  const reply = await c.raw(`PING ${'x'.repeat(5000)}`);
  assert.match(reply, /^ERR /);
  for (let i = 0; i < 3000 && c.connected; i++) await sleep(10); // hang guard 30 s
  assert.equal(c.connected, false);
  await c.ping(); // new connection, new session: the old lock is gone
  assert.deepEqual(await c.held(), []);
  await client().acquire(key('k'), { wait: 1 });
});

test('argument errors reject before sending', async () => {
  const c = client();
  await assert.rejects(c.acquire(key('k'), { lease: 0 }), RangeError);
  await assert.rejects(c.acquire('bad key'), RangeError);
  await assert.rejects(c.release(key('k'), 'x'), RangeError);
  assert.equal(c.requestsSent, 0);
});

test('default path and unreachable socket', async () => {
  const saved = process.env.TICKETING_SOCKET;
  try {
    process.env.TICKETING_SOCKET = dev.socket;
    const c = new Client();
    clients.push(c);
    assert.equal(c.path, dev.socket);
    await c.ping();
    delete process.env.TICKETING_SOCKET;
    assert.equal(new Client().path, './ticketing.sock');
  } finally {
    if (saved === undefined) delete process.env.TICKETING_SOCKET;
    else process.env.TICKETING_SOCKET = saved;
  }
  const bad = new Client({ path: '/nonexistent/ticketing.sock' });
  await assert.rejects(bad.ping(), (e) => e instanceof ticketing.SidecarConnectionError && /nonexistent/.test(e.message));
});

test('a missing or stale socket names the path and what to start, and is not "lost"', async () => {
  const fs = require('node:fs');
  const os = require('node:os');
  const path = require('node:path');
  const { spawnSync } = require('node:child_process');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tk-nosc-'));
  try {
    // A socket file that nothing serves, as a killed sidecar leaves it: a
    // child binds it and is SIGKILLed (a server closed normally unlinks it).
    const stale = path.join(dir, 'stale.sock');
    spawnSync(process.execPath, ['-e',
      `require('net').createServer().listen(${JSON.stringify(stale)}, () => process.kill(process.pid, 'SIGKILL'))`]);
    assert.ok(fs.existsSync(stale), 'the stale socket file stays');
    for (const [p, why] of [[path.join(dir, 'missing.sock'), 'no socket file there'],
      [stale, 'nothing serves that socket file']]) {
      const c = new Client({ path: p });
      clients.push(c);
      await assert.rejects(c.ping(), (e) => {
        assert.ok(e instanceof ticketing.SidecarConnectionError, String(e));
        for (const want of [p, why, 'ticketing dev', 'ticketing sidecar']) {
          assert.ok(e.message.includes(want), `${e.message} lacks ${want}`);
        }
        assert.ok(!/lost/.test(e.message), `${e.message} says lost`);
        return true;
      });
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a child process that only awaits lock.signal keeps its lock until it is lost', async () => {
  const { spawn } = require('node:child_process');
  const path = require('node:path');
  const k = key('keepalive');
  const script = `const { Client } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
    (async () => {
      const lock = await new Client({ path: ${JSON.stringify(dev.socket)} }).lock(${JSON.stringify(k)}, { lease: 4, wait: 0 });
      console.log('locked');
      await new Promise((resolve) => lock.signal.addEventListener('abort', resolve));
      console.log('lost', lock.lostReason);
    })();`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  const locked = new Promise((resolve) => child.stdout.on('data', (d) => { out += d; if (out.includes('locked')) resolve(); }));
  const exited = new Promise((resolve) => child.once('exit', (c, s) => resolve([c, s])));
  const guard = setTimeout(() => child.kill('SIGKILL'), 60_000); // hang guard only
  await Promise.race([locked, exited]);
  // While the child waits on the signal, its session holds the key (unless
  // the lock was lost already, on a machine slow enough to take its lease).
  const other = await client().acquire(k, { lease: 10, wait: 0 }).then(() => 'ok', (e) => e);
  if (!out.includes('lost')) assert.ok(other instanceof ticketing.BusyError, `acquire by another session: ${other}`);
  const [code, signal] = await exited;
  clearTimeout(guard);
  assert.equal(signal, null, 'the child had to be killed: it did not exit once its lock was lost');
  assert.equal(code, 0);
  assert.match(out, /^locked\nlost (deadline|expired)\n$/);
});
