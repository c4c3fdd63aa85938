'use strict';

// The onPosition option against a scripted sidecar (the real sidecar's side
// of version 7 is built apart): `! POSITION <n> <position> <estimate|->
// <key>` reaches the pending ACQUIRE written as line n, every report in the
// order sent, only before its promise settles; malformed lines are ignored
// as every bad event line; a version-6 sidecar's answer works as before.

const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const { afterEach, test } = require('node:test');
const p = require('../lib/protocol');
const ticketing = require('..');
const { FakeSidecar, fakeSidecarSetup } = require('../support/fakesidecar');

const setup = fakeSidecarSetup(afterEach);

/** A sidecar of `hello` that leaves every ACQUIRE for the test to answer. */
const manual = (hello = 'HELLO 7 events') => setup((line) => {
  if (line.startsWith('HELLO')) return hello;
  return line.startsWith('ACQUIRE ') ? null : undefined;
});

/** Lines that are not a position this client may take: all ignored. */
const MALFORMED = ['! POSITION {n} 0 5 k', '! POSITION 0 1 5 k', '! POSITION {n} 1 5', '! POSITION {n} 1 5 k extra',
  '! POSITION {n} x 5 k', '! POSITION {n} 1 -5 k', '! POSITION {n} +1 5 k', '! POSITION {n} 1 5.5 k',
  '! POSITION {n} 1  k', '!  POSITION {n} 1 5 k', '! position {n} 1 5 k', '! POSITION {n} 1 5 k ',
  '! POSITION {n} 1 5 k\tk', '! POSITION {n} 1 99999999999999999 k', '! POSITION {n} 9007199254740993 1 k',
  '! POSITION {n} 1 5 mé', `! POSITION {n} 1 5 ${'x'.repeat(256)}`, '! POSITION', '!POSITION {n} 1 5 k'];

const fill = (n) => MALFORMED.map((m) => m.replaceAll('{n}', String(n)));

test('parseEvent: POSITION fields', () => {
  assert.deepEqual(p.parseEvent('! POSITION 3 12 34 seats/42'),
    { name: 'POSITION', n: 3, report: { key: 'seats/42', position: 12, estimate: 34 } });
  assert.deepEqual(p.parseEvent('! POSITION 9007199254740991 1 - a:b'),
    { name: 'POSITION', n: 9007199254740991, report: { key: 'a:b', position: 1, estimate: null } });
  assert.equal(p.parseEvent('! POSITION 3 1 0 k').report.estimate, 0);
  for (const line of fill(3)) assert.equal(p.parseEvent(line), null, line);
});

test('onPosition: every report of its own request, in order, before the reply and none after', async () => {
  const { fake, client } = await manual();
  const log = [];
  const hook = (name) => (r) => log.push([name, r]);
  assert.equal(await client.hello(), 7); // line 1
  await client.ping(); // line 2
  const a = client.acquire('k', { wait: 5, onPosition: hook('a') }).then((t) => { log.push('settled a'); return t; }); // line 3
  const b = client.lock('k', { wait: 5, onPosition: hook('b') }).then((l) => { log.push('settled b'); return l; }); // line 4
  await fake.waitLines(4);
  fake.send([
    '! QUEUED 3 k', '! POSITION 3 12 34 k', '! POSITION 4 13 - k', ...fill(3),
    '! POSITION 3 2 2 other', '! POSITION 9 1 1 k', '! POSITION 3 3 - k', '! POSITION 3 1 0 k',
    'OK 5', '',
  ].join('\n'));
  assert.equal(await a, 5n);
  fake.send('! POSITION 3 1 0 k\n! POSITION 4 1 3 k\nTIMEOUT\n! POSITION 4 1 1 k\n');
  await assert.rejects(b, ticketing.LockTimeoutError);
  await client.ping(); // its reply follows every line above
  assert.deepEqual(log, [
    ['a', { key: 'k', position: 12, estimate: 34 }],
    ['b', { key: 'k', position: 13, estimate: null }],
    ['a', { key: 'k', position: 3, estimate: null }],
    ['a', { key: 'k', position: 1, estimate: 0 }],
    'settled a',
    ['b', { key: 'k', position: 1, estimate: 3 }],
  ]);
});

test('onPosition: a block gets a report per key; withLock and withBlock pass it on; onQueued still its own', async () => {
  const { fake, client } = await manual();
  const seen = [];
  let queued = 0;
  const blk = client.acquireBlock(['b', 'a'], { wait: 5, onPosition: (r) => seen.push(r), onQueued: () => { queued++; } });
  await fake.waitLines(2);
  fake.send('! QUEUED 2 b a\n! POSITION 2 4 - b\n! POSITION 2 2 - a\n! POSITION 2 1 5 c\n! QUEUED 2 b a\n! POSITION 2 1 2 a\nOK 9\n');
  assert.equal(await blk, 9n);
  assert.equal(queued, 1);
  assert.deepEqual(seen, [{ key: 'b', position: 4, estimate: null }, { key: 'a', position: 2, estimate: null },
    { key: 'a', position: 1, estimate: 2 }]);

  seen.length = 0;
  const lb = client.lockBlock(['x', 'y'], { wait: 5, onPosition: (r) => seen.push(r) }); // line 3
  await fake.waitLines(3);
  fake.send('! POSITION 3 2 7 y\nOK 10\n');
  await (await lb).release();
  const wl = client.withLock('k', { wait: 5, onPosition: (r) => seen.push(r) }, (token) => token); // line 5
  await fake.waitLines(5);
  fake.send('! POSITION 5 1 - k\nOK 11\n');
  assert.equal(await wl, 11n);
  const wb = client.withBlock(['s/1', 's/2'], { wait: 5, onPosition: (r) => seen.push(r) }, (token) => token); // line 7
  await fake.waitLines(7);
  fake.send('! POSITION 7 3 9 s/2\nOK 12\n');
  assert.equal(await wb, 12n);
  assert.deepEqual(seen, [{ key: 'y', position: 2, estimate: 7 }, { key: 'k', position: 1, estimate: null },
    { key: 's/2', position: 3, estimate: 9 }]);
});

test('onPosition: not called once the call gave up waiting for the reply', async () => {
  const fake = await new FakeSidecar((line) => (line.startsWith('ACQUIRE ') ? null : undefined)).start();
  const client = new ticketing.Client({ path: fake.path, replyGrace: 0.05 });
  try {
    const seen = [];
    const got = client.acquire('k', { wait: 0.2, onPosition: (r) => seen.push(r) });
    await fake.waitLines(2);
    fake.send('! POSITION 2 2 - k\n');
    await assert.rejects(got, ticketing.IndeterminateError);
    fake.send('! POSITION 2 1 - k\nTIMEOUT\n');
    await client.ping(); // its reply follows the lines above
    assert.deepEqual(seen, [{ key: 'k', position: 2, estimate: null }]);
  } finally {
    await client.close();
    await fake.stop();
  }
});

test('onPosition: a version-6 sidecar is spoken to as before (HELLO 9 sent, version 6 agreed, QUEUED still reported)', async () => {
  const { fake, client } = await manual('HELLO 6 events');
  const seen = [];
  let queued = 0;
  const got = client.acquire('k', { wait: 5, onPosition: (r) => seen.push(r), onQueued: () => { queued++; } });
  await fake.waitLines(2);
  assert.deepEqual(fake.lines, ['HELLO 9 events', 'ACQUIRE k 30 5']);
  fake.send('! QUEUED 2 k\nOK 3\n');
  assert.equal(await got, 3n);
  assert.equal(await client.hello(), 6);
  assert.equal(await client.eventsEnabled(), true);
  assert.deepEqual([seen, queued], [[], 1]);
});

test('onPosition: a function or nothing, checked before anything is sent', async () => {
  const c = new ticketing.Client({ path: '/nonexistent/ticketing.sock' });
  for (const bad of [1, 'f', {}, true]) {
    await assert.rejects(c.acquire('k', { onPosition: bad }), TypeError);
    await assert.rejects(c.acquireBlock(['a', 'b'], { onPosition: bad }), TypeError);
    await assert.rejects(c.lock('k', { onPosition: bad }), TypeError);
    await assert.rejects(c.lockBlock(['a', 'b'], { onPosition: bad }), TypeError);
    await assert.rejects(c.withLock('k', { onPosition: bad }, () => {}), TypeError);
    await assert.rejects(c.withBlock(['a', 'b'], { onPosition: bad }, () => {}), TypeError);
  }
  assert.equal(c.requestsSent, 0);
  assert.equal(p.checkOnPosition(undefined), null);
  assert.equal(p.checkOnPosition(null), null);
});

test('onPosition: a hook that throws is an uncaught exception, and the reply is still matched', async () => {
  // In a child process: node:test fails the test that has an uncaught exception.
  const script = `
    const { FakeSidecar } = require(${JSON.stringify(path.join(__dirname, '..', 'support', 'fakesidecar'))});
    const { Client } = require(${JSON.stringify(path.join(__dirname, '..'))});
    const uncaught = [];
    process.on('uncaughtException', (e) => uncaught.push(e.message));
    (async () => {
      const fake = await new FakeSidecar((line) => (line.startsWith('ACQUIRE ') ? null : undefined)).start();
      const client = new Client({ path: fake.path });
      const got = client.acquire('k', { wait: 5, onPosition: (r) => { throw new Error('hook bug ' + r.position); } });
      await fake.waitLines(2);
      fake.send('! POSITION 2 2 - k\\n! POSITION 2 1 - k\\nOK 42\\n');
      const token = await got;
      await client.ping();
      await new Promise((r) => setImmediate(r));
      console.log(JSON.stringify({ token: String(token), uncaught }));
      await client.close();
      await fake.stop();
    })();`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d) => { out += d; });
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000); // hang guard
  const code = await new Promise((resolve) => child.once('exit', resolve));
  clearTimeout(timer);
  assert.equal(code, 0);
  assert.deepEqual(JSON.parse(out), { token: '42', uncaught: ['hook bug 2', 'hook bug 1'] });
});
