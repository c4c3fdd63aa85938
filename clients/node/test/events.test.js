'use strict';

// Event lines between replies: a seeded property test of the line reader
// (replies matched by position, events delivered, malformed and unknown
// events ignored, whatever the chunking), the same through a Client
// against a scripted sidecar, and `! QUEUED` matched to its ACQUIRE by the
// request's number. No real sidecar needed (the real sidecar's QUEUED is
// client.test.js's, block.test.js's and the conformance suite's).
// TICKETING_SEED=<n> reruns one seed.

const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const { afterEach, test } = require('node:test');
const p = require('../lib/protocol');
const ticketing = require('..');
const { FakeSidecar } = require('../support/fakesidecar');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A small seeded PRNG (mulberry32): the same seed, the same case. */
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (n) => Math.floor(next() * n);
  return { next, int, pick: (xs) => xs[int(xs.length)] };
}

const SEEDS = process.env.TICKETING_SEED ? [Number(process.env.TICKETING_SEED)]
  : Array.from({ length: 300 }, (_, i) => 1000 + i);

const REPLIES = ['PONG', 'OK', 'OK 17', 'OK 18446744073709551615', 'BUSY', 'TIMEOUT', 'INDETERMINATE',
  'ERR not_held not held by this connection', 'ERR token_mismatch', 'HELLO 3 events', 'HELD 0',
  'HELD 2 a:b:7 c:9', 'INFO cluster=dev leader=- connected=1/3', 'OK 1', 'ERR line_too_long x'];

/** Lines starting with `!` that are no valid LOST event: all ignored. */
const IGNORED_EVENTS = ['!', '! ', '!LOST 5 expired k', '! LOST', '! LOST 5', '! LOST 5 expired',
  '! LOST 0 expired k', '! LOST 18446744073709551616 expired k', '! LOST -1 expired k', '! LOST x expired k',
  '! LOST 5  k', '! LOST 5 expired k  j', '! lost 5 expired k', '! GAINED 5 k', '! NEWS something happened',
  '!! LOST 5 expired k', '! LOST 5 expired k\tj', `! LOST 5 expired ${'x'.repeat(256)}`,
  '! QUEUED', '! QUEUED 3', '! QUEUED 0 k', '! QUEUED -1 k', '! QUEUED x k', '! QUEUED 3.0 k', '! QUEUED +3 k',
  '! QUEUED 12345678901234567 k', '! QUEUED 9007199254740993 k', '! QUEUED 3  k', '! QUEUED 3 k ', '! queued 3 k',
  '!QUEUED 3 k', '! QUEUED 3 k\tj', `! QUEUED 3 ${'x'.repeat(256)}`, '! QUEUED 3 mé',
  '! POSITION', '! POSITION 3 1 -', '! POSITION 3 0 - k', '! POSITION 0 1 - k', '! POSITION 3 1 x k',
  '! POSITION 3 1 5 k j', '! POSITION 3 +1 5 k', '! POSITION 3 1 5.0 k', '! POSITION 3 1  k', '! position 3 1 5 k',
  '! POSITION 3 1 12345678901234567 k', `! POSITION 3 1 - ${'x'.repeat(256)}`, '! POSITION 3 1 - mé'];

/** @returns {{line: string, event: object}} a well-formed LOST event */
function lostEvent(r) {
  const token = r.pick([1n, 2n, 17n, 18446744073709551615n, BigInt(1 + r.int(1e9))]);
  const reason = r.pick(['expired', 'moved', 'compensated', 'someday_new']);
  const keys = Array.from({ length: 1 + r.int(3) }, (_, i) => `seats/${r.int(100)}:${i}`);
  return { line: `! LOST ${token} ${reason} ${keys.join(' ')}`, event: { name: 'LOST', token, reason, keys } };
}

/** @returns {{line: string, event: object}} a well-formed QUEUED event */
function queuedEvent(r) {
  const n = r.pick([1, 2, 3, 9007199254740991, 1 + r.int(1e6)]);
  const keys = Array.from({ length: 1 + r.int(16) }, (_, i) => `seats/${r.int(100)}:${i}`);
  return { line: `! QUEUED ${n} ${keys.join(' ')}`, event: { name: 'QUEUED', n, keys } };
}

/** @returns {{line: string, event: object}} a well-formed POSITION event */
function positionEvent(r) {
  const n = r.pick([1, 2, 3, 9007199254740991, 1 + r.int(1e6)]);
  const position = r.pick([1, 2, 1 + r.int(1e5)]);
  const estimate = r.pick([null, 0, 1 + r.int(3600)]);
  const key = `seats/${r.int(100)}`;
  return {
    line: `! POSITION ${n} ${position} ${estimate === null ? '-' : estimate} ${key}`,
    event: { name: 'POSITION', n, report: { key, position, estimate } },
  };
}

/** A random stream of replies and events, and what a reader must make of it. */
function randomStream(r) {
  const replies = [];
  const events = [];
  let text = '';
  const n = r.int(40);
  for (let i = 0; i < n; i++) {
    const eol = r.next() < 0.2 ? '\r\n' : '\n';
    const roll = r.next();
    if (roll < 0.45) {
      const reply = r.pick(REPLIES);
      replies.push(reply);
      text += reply + eol;
    } else if (roll < 0.75) {
      const ev = r.pick([lostEvent, queuedEvent, positionEvent])(r);
      events.push(ev.event);
      text += ev.line + eol;
    } else {
      text += r.pick(IGNORED_EVENTS) + eol;
    }
  }
  // An unterminated tail is no line yet: neither a reply nor an event.
  const tail = r.next() < 0.3 ? r.pick(['OK 5', '! LOST 5 expired k', 'PON']) : '';
  return { replies, events, text: text + tail, tail };
}

/** Split text into 1..8 random chunks (also inside `\r\n` and words). */
function chunks(r, text) {
  const cuts = Array.from({ length: r.int(8) }, () => r.int(text.length + 1)).sort((a, b) => a - b);
  const out = [];
  let at = 0;
  for (const c of [...cuts, text.length]) {
    out.push(text.slice(at, c));
    at = c;
  }
  return out;
}

test('the line reader: replies by position, events apart, malformed and unknown events ignored', () => {
  for (const seed of SEEDS) {
    const r = rng(seed);
    const { replies, events, text, tail } = randomStream(r);
    const gotReplies = [];
    const gotEvents = [];
    const reader = new p.LineReader((line) => { gotReplies.push(line); }, (line) => {
      assert.ok(line.startsWith('!'), `seed ${seed}: ${JSON.stringify(line)} taken for an event`);
      const ev = p.parseEvent(line);
      if (ev) gotEvents.push(ev);
    });
    for (const c of chunks(r, text)) reader.push(c);
    assert.deepEqual(gotReplies, replies, `seed ${seed}: replies`);
    assert.deepEqual(gotEvents, events, `seed ${seed}: events`);
    assert.equal(reader.partial, tail, `seed ${seed}: the unterminated tail waits`);
  }
});

test('parseEvent: QUEUED fields', () => {
  assert.deepEqual(p.parseEvent('! QUEUED 2 k'), { name: 'QUEUED', n: 2, keys: ['k'] });
  assert.deepEqual(p.parseEvent('! QUEUED 9007199254740991 s/2 s/1 a:b'),
    { name: 'QUEUED', n: 9007199254740991, keys: ['s/2', 's/1', 'a:b'] });
  assert.deepEqual(p.parseEvent(`! QUEUED 17 ${'~'.repeat(255)}`), { name: 'QUEUED', n: 17, keys: ['~'.repeat(255)] });
});

test('parseEvent: LOST fields, unknown reasons kept, everything else null', () => {
  assert.deepEqual(p.parseEvent('! LOST 7 expired k'), { name: 'LOST', token: 7n, reason: 'expired', keys: ['k'] });
  assert.deepEqual(p.parseEvent('! LOST 18446744073709551615 moved a b:c'),
    { name: 'LOST', token: 18446744073709551615n, reason: 'moved', keys: ['a', 'b:c'] });
  assert.equal(p.parseEvent('! LOST 7 weird k').reason, 'weird'); // still a loss
  for (const line of IGNORED_EVENTS) assert.equal(p.parseEvent(line), null, line);
  for (const line of ['OK 7', 'LOST 7 expired k', '']) {
    assert.equal(p.parseEvent(line), null, line);
    assert.equal(p.isEventLine(line), false, line);
  }
  for (const line of IGNORED_EVENTS) assert.equal(p.isEventLine(line), true, line);
});

test('a Client against a sidecar that interleaves events: every request its own reply, every LOST its lock', async () => {
  // Fewer seeds: each one is a connection and a few dozen round trips.
  for (const seed of SEEDS.slice(0, 40)) {
    const r = rng(seed);
    let pendingWrites = [];
    const fake = await new FakeSidecar((line) => {
      if (line.startsWith('HELLO')) return undefined;
      // Replies echo the request, so a mismatch shows; events go before it
      // at random, and what is written is flushed in random chunks later.
      let reply;
      if (line.startsWith('ACQUIRE ')) reply = `OK ${fake.nextToken++}`;
      else if (line.startsWith('RELEASE ')) reply = 'OK';
      else reply = `ERR echo ${line.replace(/ /g, '_')}`;
      let text = '';
      while (r.next() < 0.4) text += `${r.next() < 0.5 ? lostEvent(r).line : r.pick(IGNORED_EVENTS)}\n`;
      pendingWrites.push(text + reply + '\n');
      return null;
    }).start();
    fake.nextToken = 5_000_000_000_000n; // above every token the random events name
    const flusher = setInterval(() => {
      if (pendingWrites.length === 0 || fake.peers.length === 0) return;
      const all = pendingWrites.join('');
      pendingWrites = [];
      for (const c of chunks(r, all)) if (c) fake.send(c);
    }, 1);
    const client = new ticketing.Client({ path: fake.path });
    try {
      const lock = await client.lock(`k${seed}`, { lease: 250, wait: 0 });
      const other = await client.lock(`j${seed}`, { lease: 250, wait: 0 });
      const calls = Array.from({ length: 1 + r.int(20) }, (_, i) => client.raw(`X${i}`));
      const answers = await Promise.all(calls);
      answers.forEach((a, i) => assert.equal(a, `ERR echo X${i}`, `seed ${seed}: reply ${i}`));
      assert.equal(lock.signal.aborted, false, `seed ${seed}`);
      // The sidecar's LOST for one lock fires it, and only it.
      fake.send(`! LOST ${lock.token} moved k${seed}\n`);
      await client.raw('sync');
      assert.equal(lock.signal.aborted, true, `seed ${seed}`);
      assert.equal(lock.lostReason, 'moved');
      assert.equal(other.signal.aborted, false, `seed ${seed}: the other lock`);
      await other.release();
    } finally {
      clearInterval(flusher);
      await client.close();
      await fake.stop();
    }
  }
});

let cleanup = [];
afterEach(async () => {
  for (const f of cleanup.reverse()) await f();
  cleanup = [];
});

/**
 * A fake sidecar that answers HELLO and PING itself and leaves every
 * ACQUIRE unanswered (the test writes its events and replies), and a
 * client of it.
 */
async function manualAcquires(clientOptions = {}) {
  const fake = await new FakeSidecar((line) => (line.startsWith('ACQUIRE ') ? null : undefined)).start();
  const client = new ticketing.Client({ path: fake.path, ...clientOptions });
  cleanup.push(() => fake.stop(), () => client.close());
  return { fake, client };
}

test('onQueued: matched by request number (HELLO counted), once, before the reply, only its own request', async () => {
  const { fake, client } = await manualAcquires();
  const log = [];
  const hook = (name) => (q) => log.push(`queued ${name} ${q.keys.join(',')}`);
  const settled = (name, promise) => promise.then(
    (v) => { log.push(`settled ${name}`); return v; },
    (e) => { log.push(`settled ${name}`); throw e; },
  );
  assert.equal(await client.hello(), 4); // line 1
  await client.ping(); // line 2
  // Two waiting ACQUIREs of the same key on one connection: only the
  // number tells their events apart.
  const a = settled('a', client.acquire('k', { wait: 5, onQueued: hook('a') })); // line 3
  const b = settled('b', client.acquire('k', { wait: 5, onQueued: hook('b') })); // line 4
  const c = settled('c', client.acquireBlock(['x', 'y'], { wait: 5, onQueued: hook('c') })); // line 5
  await fake.waitLines(5); // a block is written once HELLO's reply is in: a tick later
  const d = settled('d', client.acquire('z', { wait: 5 })); // line 6: no hook
  await fake.waitLines(6);
  assert.deepEqual(fake.lines.slice(2), ['ACQUIRE k 30 5', 'ACQUIRE k 30 5', 'ACQUIRE x y 30 5', 'ACQUIRE z 30 5']);

  fake.send('! QUEUED 4 k\n'
    + '! QUEUED 3 j\n' // other keys: not about a request of ours
    + '! QUEUED 6 z\n! QUEUED 2 k\n! QUEUED 99 k\n! QUEUED 1 k\n' // no ACQUIRE with a hook there
    + '! QUEUED 5 y x\n' // a block's keys in another order: not ours
    + '! SOMEDAY 3 k\n! QUEUED 3 k\n! QUEUED 3 k\nOK 7\n');
  assert.equal(await a, 7n);
  assert.deepEqual(log, ['queued b k', 'queued a k', 'settled a']);

  fake.send('! QUEUED 3 k\n! QUEUED 5 x y\nTIMEOUT\n'); // a's reply came: its number is no longer pending
  await assert.rejects(b, ticketing.LockTimeoutError);
  fake.send('! QUEUED 4 k\nOK 8\nOK 9\n');
  assert.equal(await c, 8n);
  assert.equal(await d, 9n);
  assert.deepEqual(log, ['queued b k', 'queued a k', 'settled a', 'queued c x,y', 'settled b', 'settled c', 'settled d']);

  // lock and lockBlock take the hook too (lines 7 and 8).
  log.length = 0;
  const l1 = settled('l1', client.lock('k', { wait: 1, onQueued: hook('l1') }));
  const l2 = settled('l2', client.lockBlock(['s/2', 's/1'], { wait: 1, onQueued: hook('l2') }));
  await fake.waitLines(8);
  fake.send('! QUEUED 8 s/2 s/1\nOK 10\n! QUEUED 7 k\nOK 11\n');
  assert.equal((await l1).token, 10n);
  assert.equal((await l2).token, 11n);
  assert.deepEqual(log, ['queued l2 s/2,s/1', 'settled l1', 'settled l2']);
});

test('onQueued: withLock and withBlock pass it on; a new connection counts from 1 again', async () => {
  const { fake, client } = await manualAcquires();
  const seen = [];
  const section = client.withLock('k', { wait: 5, onQueued: (q) => seen.push(q.keys) }, (token) => token);
  await fake.waitLines(2); // HELLO, ACQUIRE
  fake.send('! QUEUED 2 k\nOK 5\n');
  assert.equal(await section, 5n);
  assert.deepEqual(seen, [['k']]);
  assert.deepEqual(fake.lines, ['HELLO 9 events', 'ACQUIRE k 30 5', 'RELEASE k 5']);

  fake.peer.destroy(); // the sidecar ends the session
  for (let i = 0; i < 2000 && client.connected; i++) await sleep(5);
  assert.equal(client.connected, false);
  const block = client.withBlock(['a', 'b'], { wait: 5, onQueued: (q) => seen.push(q.keys) }, (token) => token);
  await fake.waitLines(5); // HELLO, ACQUIRE on the new connection
  assert.deepEqual(fake.lines.slice(3), ['HELLO 9 events', 'ACQUIRE a b 30 5']);
  fake.send('! QUEUED 2 a b\nOK 6\n');
  assert.equal(await block, 6n);
  assert.deepEqual(seen, [['k'], ['a', 'b']]);
});

test('onQueued: not called once the call gave up waiting for the reply', async () => {
  const { fake, client } = await manualAcquires({ replyGrace: 0.05 });
  let called = 0;
  await assert.rejects(client.acquire('k', { wait: 0.001, onQueued: () => { called++; } }), ticketing.IndeterminateError);
  fake.send('! QUEUED 2 k\nTIMEOUT\n');
  await client.ping(); // its reply follows the event
  assert.equal(called, 0);
});

test('onQueued: a function or nothing, checked before anything is sent', async () => {
  const c = new ticketing.Client({ path: '/nonexistent/ticketing.sock' });
  for (const bad of [1, 'f', {}, true]) {
    await assert.rejects(c.acquire('k', { onQueued: bad }), TypeError);
    await assert.rejects(c.acquireBlock(['a', 'b'], { onQueued: bad }), TypeError);
    await assert.rejects(c.lock('k', { onQueued: bad }), TypeError);
    await assert.rejects(c.lockBlock(['a', 'b'], { onQueued: bad }), TypeError);
    await assert.rejects(c.withLock('k', { onQueued: bad }, () => {}), TypeError);
  }
  assert.equal(c.requestsSent, 0);
  assert.equal(p.checkOnQueued(undefined), null);
  assert.equal(p.checkOnQueued(null), null);
});

test('onQueued: a hook that throws is an uncaught exception, and the reply is still matched', async () => {
  // In a child process: node:test fails the test that has an uncaught exception.
  const script = `
    const { FakeSidecar } = require(${JSON.stringify(path.join(__dirname, '..', 'support', 'fakesidecar'))});
    const { Client } = require(${JSON.stringify(path.join(__dirname, '..'))});
    const uncaught = [];
    process.on('uncaughtException', (e) => uncaught.push(e.message));
    (async () => {
      const fake = await new FakeSidecar((line) => (line.startsWith('ACQUIRE ') ? null : undefined)).start();
      const client = new Client({ path: fake.path });
      const got = client.acquire('k', { wait: 5, onQueued: () => { throw new Error('hook bug'); } });
      await fake.waitLines(2);
      fake.send('! QUEUED 2 k\\nOK 42\\n');
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
  assert.deepEqual(JSON.parse(out), { token: '42', uncaught: ['hook bug'] });
});
