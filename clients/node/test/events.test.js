'use strict';

// Event lines between replies: a seeded property test of the line reader
// (replies matched by position, events delivered, malformed and unknown
// events ignored, whatever the chunking), and the same through a Client
// against a scripted sidecar. No real sidecar needed.
// TICKETING_SEED=<n> reruns one seed.

const assert = require('node:assert/strict');
const { test } = require('node:test');
const p = require('../lib/protocol');
const ticketing = require('..');
const { FakeSidecar } = require('../support/fakesidecar');

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
  '!! LOST 5 expired k', '! LOST 5 expired k\tj', `! LOST 5 expired ${'x'.repeat(256)}`];

/** @returns {{line: string, event: object}} a well-formed LOST event */
function lostEvent(r) {
  const token = r.pick([1n, 2n, 17n, 18446744073709551615n, BigInt(1 + r.int(1e9))]);
  const reason = r.pick(['expired', 'moved', 'compensated', 'someday_new']);
  const keys = Array.from({ length: 1 + r.int(3) }, (_, i) => `seats/${r.int(100)}:${i}`);
  return { line: `! LOST ${token} ${reason} ${keys.join(' ')}`, event: { name: 'LOST', token, reason, keys } };
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
      const ev = lostEvent(r);
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
