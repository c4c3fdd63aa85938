'use strict';

// Lock objects against a scripted sidecar (support/fakesidecar.js): the lost
// signal and its reasons, the local deadline, extend and release. The real
// sidecar's side is the conformance suite's (conformance.test.js).

const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const path = require('node:path');
const { afterEach, test } = require('node:test');
const { performance } = require('node:perf_hooks');
const ticketing = require('..');
const p = require('../lib/protocol');
const { FakeSidecar } = require('../support/fakesidecar');

const { Client, LockLostError } = ticketing;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const aborted = (signal) => new Promise((resolve) => {
  if (signal.aborted) resolve();
  else signal.addEventListener('abort', () => resolve(), { once: true });
});

let cleanup = [];
afterEach(async () => {
  for (const f of cleanup.reverse()) await f();
  cleanup = [];
});

/** A started fake sidecar and a client of it, both stopped after the test. */
async function setup(respond) {
  const fake = await new FakeSidecar(respond).start();
  const client = new Client({ path: fake.path });
  cleanup.push(() => fake.stop(), () => client.close());
  return { fake, client };
}

test('every connection starts with HELLO 9 events; the reply says whether events come', async () => {
  const { fake, client } = await setup();
  await client.ping();
  assert.deepEqual(fake.lines, ['HELLO 9 events', 'PING']);
  assert.equal(await client.hello(), 4);
  assert.equal(await client.eventsEnabled(), true);

  // A version-3 sidecar agrees version 3 with events (LOST, never QUEUED).
  const { client: v3 } = await setup((line) => (line.startsWith('HELLO') ? 'HELLO 3 events' : undefined));
  assert.equal(await v3.hello(), 3);
  assert.equal(await v3.eventsEnabled(), true);

  // A version-2 sidecar refuses the option (bad_request): version 2, no events.
  const { client: old } = await setup((line) => (line.startsWith('HELLO') ? 'ERR bad_request unknown option' : undefined));
  assert.equal(await old.hello(), 2);
  assert.equal(await old.eventsEnabled(), false);
  assert.deepEqual(p.parseHelloEvents('HELLO 2'), { version: 2, events: false });
  assert.throws(() => p.parseHelloEvents('HELLO 2 events'), ticketing.ProtocolError);
});

test('a sidecar that refuses the connection in reply to HELLO: the requests behind it say why', async () => {
  const { client } = await setup((line, peer) => {
    if (line.startsWith('HELLO')) peer.end('ERR forbidden uid 1234 is not allowed\n');
    return null;
  });
  await assert.rejects(client.ping(), (e) => e instanceof ticketing.SidecarConnectionError && /forbidden/.test(e.message));
  await assert.rejects(client.hello(), ticketing.TicketingError);
});

test('lock: token, keys, the margin, remaining() decreasing', async () => {
  const { client } = await setup();
  const lock = await client.lock('k', { lease: 30, wait: 0 });
  assert.ok(lock instanceof ticketing.Lock);
  assert.equal(typeof lock.token, 'bigint');
  assert.deepEqual(lock.keys, ['k']);
  assert.equal(lock.signal.aborted, false);
  assert.equal(lock.lostReason, null);
  const r1 = lock.remaining();
  // margin = 250 ms + 1 % of 30 s = 550 ms
  assert.ok(r1 > 0 && r1 <= 30 - 0.55, `remaining ${r1}`);
  await sleep(20);
  const r2 = lock.remaining();
  assert.ok(r2 < r1, `remaining ${r2} after ${r1}`);
  assert.equal(p.marginMillis(1), 260);
  assert.equal(p.marginMillis(250), 2750);
  await lock.release();
  assert.equal(lock.remaining(), 0);
  assert.equal(lock.released, true);
});

test('a LOST event aborts the signal with a LockLostError; extend is then refused without sending', async () => {
  const { fake, client } = await setup();
  const lock = await client.lock('k', { lease: 30, wait: 0 });
  const other = await client.lockBlock(['a', 'b'], { lease: 30, wait: 0 });
  fake.send(`! LOST ${lock.token} expired k\n`);
  await aborted(lock.signal);
  assert.ok(lock.signal.reason instanceof LockLostError);
  assert.ok(lock.signal.reason instanceof ticketing.TicketingError);
  assert.equal(lock.signal.reason.reason, 'expired');
  assert.equal(lock.signal.reason.code, 'lost');
  assert.equal(lock.lostReason, 'expired');
  assert.equal(lock.lost, true);
  assert.equal(lock.remaining(), 0);
  assert.equal(other.signal.aborted, false);

  const sent = client.requestsSent;
  const lines = fake.lines.length;
  await assert.rejects(lock.extend(30), (e) => e instanceof LockLostError && e.reason === 'expired');
  assert.equal(client.requestsSent, sent);
  assert.equal(fake.lines.length, lines);
  // Argument errors come first, and send nothing either.
  await assert.rejects(lock.extend(0), RangeError);
  assert.equal(client.requestsSent, sent);

  // release still sends, and reports the reply as it is.
  fake.respond = (line) => (line.startsWith('RELEASE') ? 'ERR not_held not held by this connection' : undefined);
  await assert.rejects(lock.release(), (e) => e instanceof ticketing.ServerError && e.code === 'not_held');
  assert.equal(fake.lines.at(-1), `RELEASE k ${lock.token}`);
});

test('an unknown reason is a loss; unknown events and tokens change nothing', async () => {
  const { fake, client } = await setup();
  const lock = await client.lock('k', { lease: 30, wait: 0 });
  fake.send(`! NEWS ${lock.token} k\n! LOST ${lock.token + 1n} expired k\n! LOST ${lock.token}\n`);
  await client.ping();
  assert.equal(lock.signal.aborted, false);
  fake.send(`! LOST ${lock.token} eaten_by_grue k\n`);
  await client.ping();
  assert.equal(lock.lostReason, 'eaten_by_grue');
});

test('an event read in the same chunk as the grant is not missed', async () => {
  const { fake, client } = await setup((line) => {
    if (!line.startsWith('ACQUIRE')) return undefined;
    return `OK 77\n! LOST 77 expired ${line.split(' ')[1]}`;
  });
  const lock = await client.lock('k', { lease: 30, wait: 0 });
  assert.equal(lock.lostReason, 'expired');
  assert.equal(lock.signal.aborted, true);
  assert.ok(fake.lines.length >= 2);
});

test('the local deadline: signal at send + lease - margin, then the sidecar event replaces the reason', async () => {
  const { fake, client } = await setup();
  const lock = await client.lock('k', { lease: 1, wait: 0 });
  await aborted(lock.signal);
  assert.equal(lock.signal.reason.reason, 'deadline');
  assert.equal(lock.lostReason, 'deadline');
  await assert.rejects(lock.extend(10), (e) => e instanceof LockLostError && e.reason === 'deadline');
  fake.send(`! LOST ${lock.token} expired k\n`);
  await client.ping();
  assert.equal(lock.lostReason, 'expired'); // the more definite news
  assert.equal(lock.signal.reason.reason, 'deadline'); // the signal fired once
});

test('extend: OK re-arms the deadline from its send time; INDETERMINATE keeps the earlier of the old one and send time + lease; not_held loses the lock', async () => {
  let extendReply = 'OK';
  const { fake, client } = await setup((line) => (line.startsWith('EXTEND') ? extendReply : undefined));
  // Lease 2: the deadline (1.73 s) leaves a loaded machine time for the
  // round trips before the EXTEND is sent.
  const lock = await client.lock('k', { lease: 2, wait: 0 });
  for (const bad of [0, 251, 1.5, -1, NaN]) await assert.rejects(lock.extend(bad), RangeError, String(bad));
  for (const bad of ['30', 30n, null, undefined]) await assert.rejects(lock.extend(bad), TypeError, String(bad));
  assert.ok(!fake.lines.some((l) => l.startsWith('EXTEND')), 'nothing sent for bad leases');

  await lock.extend(60);
  assert.equal(fake.lines.at(-1), `EXTEND k ${lock.token} 60`);
  const left = lock.remaining();
  assert.ok(left > 1 && left <= 60 - 0.85, `remaining ${left}`);
  await sleep(2000); // past the first deadline (1.73 s)
  assert.equal(lock.signal.aborted, false);

  extendReply = 'INDETERMINATE';
  const before = lock.remaining();
  await assert.rejects(lock.extend(100), ticketing.IndeterminateError);
  assert.ok(lock.remaining() <= before && lock.remaining() > 5, 'a longer extend: the old deadline stays');
  // A shorter one may have applied (issue 39): send time + lease − margin.
  await assert.rejects(lock.extend(5), ticketing.IndeterminateError);
  assert.ok(lock.remaining() <= 5 - 0.3 && lock.remaining() > 3, `a shorter extend: the earlier end (remaining ${lock.remaining()})`);
  assert.equal(lock.signal.aborted, false);

  extendReply = 'ERR not_held not held';
  await assert.rejects(lock.extend(5), (e) => e instanceof ticketing.ServerError && e.code === 'not_held');
  assert.equal(lock.lostReason, 'moved');
  assert.equal(lock.signal.aborted, true);
});

test('a shorter extend caps the deadline from its send on and fires at it after INDETERMINATE (issue 39)', async () => {
  let extendPeer = null;
  const { client } = await setup((line, peer) => {
    if (!line.startsWith('EXTEND')) return undefined;
    extendPeer = peer;
    return null; // answered below
  });
  const lock = await client.lock('k', { lease: 60, wait: 0 });
  const pending = lock.extend(1); // 1 s − 260 ms
  assert.ok(lock.remaining() <= 0.74, `in flight: remaining ${lock.remaining()}, want at most 0.74`);
  while (extendPeer === null) await sleep(5);
  extendPeer.write('INDETERMINATE\n');
  await assert.rejects(pending, ticketing.IndeterminateError);
  assert.ok(lock.remaining() <= 0.74);
  await aborted(lock.signal);
  assert.equal(lock.lostReason, 'deadline');
});

// Two extends of one lock under way at once may apply in either order (the
// sidecar runs a connection's requests concurrently), so after an OK the
// deadline is at most the end of the other one, whatever its outcome and
// whichever reply comes first: replies come in order, so the first call
// returns before the second's OK is handled (it used to drop its cap then).
test('of two extends under way at once, an OK stays at most the other one\'s end, whatever its outcome and the order (issue 39)', async () => {
  for (const shortFirst of [true, false]) {
    for (const other of ['OK', 'INDETERMINATE', 'ERR unavailable no leader']) {
      const peers = [];
      const { client } = await setup((line, peer) => {
        if (!line.startsWith('EXTEND')) return undefined;
        peers.push(peer);
        return null; // answered below, both in one write
      });
      const lock = await client.lock('k', { lease: 60, wait: 0 });
      const [first, second] = shortFirst ? [5, 100] : [100, 5];
      const one = lock.extend(first).catch((e) => e);
      const two = lock.extend(second).catch((e) => e);
      while (peers.length < 2) await sleep(5);
      // The long one is answered OK, the short one `other`.
      peers[0].write(shortFirst ? `${other}\nOK\n` : `OK\n${other}\n`);
      const [shortErr, longErr] = shortFirst ? [await one, await two] : [await two, await one];
      const what = `short extend ${shortFirst ? 'first' : 'second'}, answered ${other}`;
      assert.equal(longErr, undefined, what);
      assert.equal(other === 'OK', shortErr === undefined, `${what}: ${shortErr}`);
      assert.ok(lock.remaining() <= 5 - 0.3, `${what}: remaining ${lock.remaining()} after the long extend's OK, want at most 4.7`);
    }
  }
});

// An extend whose caller gave up (local reply timeout) is still in flight;
// a later extend's OK must stay at most its end.
test('an extend that timed out locally still caps the OK of an extend sent while it was in flight (issue 39)', async () => {
  const peers = [];
  const fake = await new FakeSidecar((line, peer) => {
    if (!line.startsWith('EXTEND')) return undefined;
    peers.push(peer);
    return null; // answered below
  }).start();
  const client = new Client({ path: fake.path, replyGrace: 0.05 });
  cleanup.push(() => fake.stop(), () => client.close());
  const lock = await client.lock('k', { lease: 60, wait: 0 });
  // Its reply never comes in time (5 s + 0.05 s): IndeterminateError, the
  // EXTEND still with the sidecar, which may apply it after the next one.
  await assert.rejects(lock.extend(30), ticketing.IndeterminateError);
  const two = lock.extend(200);
  while (peers.length < 2) await sleep(5);
  peers[0].write('OK\nOK\n'); // the first (late), then the second
  await two;
  assert.ok(lock.remaining() <= 30 - 0.55 - 5, `remaining ${lock.remaining()} after the second extend's OK, want at most the first's end (~24.4)`);
  // Both answered and no call under way: nothing caps a later extend.
  const three = lock.extend(100);
  while (peers.length < 3) await sleep(5);
  peers[0].write('OK\n');
  await three;
  assert.ok(lock.remaining() > 90, `remaining ${lock.remaining()} after a lone extend's OK, want ~98.7`);
});

// Random interleavings of extends of one lock against in-order replies of
// random outcomes; the deadline stays at most the end of every EXTEND that
// may have applied last (one not followed by an OK EXTEND sent after it
// was answered). It catches the bug of the two tests above.
test('random concurrent extends keep the deadline at most the end of every EXTEND that may have applied last', async () => {
  const validity = (lease) => lease * 1000 - p.marginMillis(lease);
  for (let seed = 1; seed <= 60; seed++) {
    let st = seed;
    const rnd = () => { st = (st * 1103515245 + 12345) % 2147483648; return st / 2147483648; };
    let peer = null;
    const { fake, client } = await setup((line, pr) => {
      if (!line.startsWith('EXTEND')) return undefined;
      peer = pr;
      return null;
    });
    const lock = await client.lock('k', { lease: 200, wait: 0 });
    const queue = [];
    const recs = [];
    const calls = [];
    const n = 2 + Math.floor(rnd() * 5);
    while (calls.length < n || queue.length > 0) {
      if (calls.length < n && (rnd() < 0.5 || queue.length === 0)) {
        const rec = { lease: 1 + Math.floor(rnd() * 199) };
        calls.push(lock.extend(rec.lease).catch(() => {}));
        rec.sentAt = performance.now(); // the write happened in the call
        queue.push(rec);
      } else {
        while (fake.lines.filter((l) => l.startsWith('EXTEND')).length < calls.length) await sleep(1);
        const rec = queue.shift();
        const o = rnd();
        rec.outcome = o < 0.6 ? 'OK' : o < 0.8 ? 'INDETERMINATE' : 'ERR unavailable no leader';
        rec.answerAt = performance.now();
        recs.push(rec);
        peer.write(`${rec.outcome}\n`);
      }
      if (rnd() < 0.5) await sleep(rnd() < 0.5 ? 0 : 2);
    }
    await Promise.all(calls);
    const now = performance.now();
    const deadline = now + lock.remaining() * 1000;
    let bound = Infinity;
    for (const e of recs) {
      if (!recs.some((f) => f !== e && f.outcome === 'OK' && f.sentAt > e.answerAt)) {
        bound = Math.min(bound, e.sentAt + validity(e.lease));
      }
    }
    assert.ok(deadline <= bound + 1, `seed ${seed}: remaining ${lock.remaining()} s, want at most ${(bound - now) / 1000} s; `
      + JSON.stringify(recs.map((r) => [r.lease, r.outcome])));
  }
});

test('a block lock extends by its first key and is lost as one', async () => {
  const { fake, client } = await setup();
  const lock = await client.lockBlock(['s/2', 's/1'], { lease: 10, wait: 0 });
  assert.deepEqual(lock.keys, ['s/2', 's/1']);
  await lock.extend(20);
  assert.equal(fake.lines.at(-1), `EXTEND s/2 ${lock.token} 20`);
  fake.send(`! LOST ${lock.token} expired s/2 s/1\n`);
  await aborted(lock.signal);
  assert.equal(lock.lostReason, 'expired');
});

test('a released lock never fires; client.release of its key and token releases it too', async () => {
  const { client } = await setup();
  const a = await client.lock('a', { lease: 2, wait: 0 });
  const b = await client.lock('b', { lease: 2, wait: 0 });
  await a.release();
  await client.release('b', String(b.token));
  assert.equal(b.released, true);
  await sleep(2000); // past both deadlines (1.73 s)
  assert.equal(a.signal.aborted, false);
  assert.equal(b.signal.aborted, false);
  await assert.rejects(a.extend(10), (e) => e instanceof LockLostError && e.reason === 'released');
});

test('a lost connection fires disconnected', async () => {
  const { fake, client } = await setup();
  const lock = await client.lock('k', { lease: 30, wait: 0 });
  fake.peer.destroy();
  await aborted(lock.signal);
  assert.equal(lock.lostReason, 'disconnected');
  await assert.rejects(lock.extend(10), (e) => e instanceof LockLostError && e.reason === 'disconnected');
  await assert.rejects(lock.release(), ticketing.SidecarConnectionError);
});

test('withLock passes the Lock after the token', async () => {
  const { fake, client } = await setup();
  const got = await client.withLock('k', { lease: 30, wait: 0 }, (token, lock) => {
    assert.equal(lock.token, token);
    assert.equal(lock.signal.aborted, false);
    return 'done';
  });
  assert.equal(got, 'done');
  assert.match(fake.lines.at(-1), /^RELEASE k [0-9]+$/);
  await client.withBlock(['x', 'y'], { lease: 30, wait: 0 }, (token, lock) => {
    assert.deepEqual(lock.keys, ['x', 'y']);
  });
});

/**
 * Run `script` in a child node process; resolve with its exit code, signal
 * and stdout. A child still running after 60 s is killed (a hang guard: the
 * scripts end within their lock's few seconds of lease, or at once).
 */
async function runChild(script) {
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d) => { out += d; });
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
  const [code, signal] = await new Promise((resolve) => child.once('exit', (c, s) => resolve([c, s])));
  clearTimeout(timer);
  return { code, signal, out };
}

const CLIENT_PATH = JSON.stringify(path.resolve(__dirname, '..'));

test('a script that only awaits lock.signal runs until the lock is lost, then exits', async () => {
  const fake = await new FakeSidecar().start();
  cleanup.push(() => fake.stop());
  // Nothing but the held lock is pending: without it keeping the process
  // alive, the child would exit 0 right after "locked", the lock silently
  // released with the session.
  const script = `const { Client } = require(${CLIENT_PATH});
    (async () => {
      const lock = await new Client({ path: ${JSON.stringify(fake.path)} }).lock('k', { lease: 2, wait: 0 });
      console.log('locked', String(lock.token));
      await new Promise((resolve) => lock.signal.addEventListener('abort', resolve));
      console.log('lost', lock.lostReason);
    })();`;
  const { code, signal, out } = await runChild(script);
  assert.equal(signal, null, 'the child had to be killed: it did not exit once its lock was lost');
  assert.equal(code, 0);
  assert.match(out, /^locked [0-9]+\nlost deadline\n$/);
});

test('once its lock is released (or never taken) an idle client lets the process exit', async () => {
  const fake = await new FakeSidecar().start();
  cleanup.push(() => fake.stop());
  // The lease is 250 s: exiting at all shows neither the released lock nor
  // its timers keep the process alive.
  const script = `const { Client } = require(${CLIENT_PATH});
    (async () => {
      const c = new Client({ path: ${JSON.stringify(fake.path)} });
      const lock = await c.lock('k', { lease: 250, wait: 0 });
      await lock.release();
      await c.ping();
      console.log('released', String(lock.token));
    })();`;
  const { code, signal, out } = await runChild(script);
  assert.equal(signal, null, 'the child had to be killed: something kept it alive');
  assert.equal(code, 0);
  assert.match(out, /^released [0-9]+/);
});

test('a wait over 300 s needs a sidecar of version 6: NotSupportedError from an older one, nothing sent; over an hour is a RangeError (issue 41)', async () => {
  // The fake sidecar answers HELLO 4 events (a version-4 sidecar).
  const { fake, client } = await setup();
  await assert.rejects(client.acquire('k', { lease: 30, wait: 300.001 }), ticketing.NotSupportedError);
  await assert.rejects(client.lock('k', { lease: 30, wait: 3600 }), ticketing.NotSupportedError);
  await assert.rejects(client.acquireBlock(['a', 'b'], { lease: 30, wait: 301 }), ticketing.NotSupportedError);
  await assert.rejects(client.lockBlock(['a', 'b'], { lease: 30, wait: 301 }), ticketing.NotSupportedError);
  await assert.rejects(client.acquire('k', { lease: 30, wait: 3600.001 }), RangeError);
  assert.deepEqual(fake.lines.filter((l) => l.startsWith('ACQUIRE')), []);
  await client.acquire('k', { lease: 30, wait: 300 });
  assert.deepEqual(fake.lines.filter((l) => l.startsWith('ACQUIRE')), ['ACQUIRE k 30 300']);

  const { fake: v6, client: c6 } = await setup((line) => (line.startsWith('HELLO') ? 'HELLO 6 events' : undefined));
  await c6.acquire('k', { lease: 30, wait: 3600 });
  assert.deepEqual(v6.lines.filter((l) => l.startsWith('ACQUIRE')), ['ACQUIRE k 30 3600']);
});

test('a grant whose wait took more than half its lease is renewed once before lock() resolves (issue 41: waits of an hour, leases of at most 250 s)', async () => {
  let extendReply = 'OK';
  let token = 100;
  const { fake, client } = await setup((line, peer) => {
    if (line.startsWith('ACQUIRE')) {
      const t = token++;
      setTimeout(() => peer.write(`OK ${t}\n`), 600); // of a 1 s lease: 0.74 s of validity, half is 0.37
      return null;
    }
    return line.startsWith('EXTEND') ? extendReply : undefined;
  });
  const lock = await client.lock('k', { lease: 1, wait: 300 });
  assert.deepEqual(fake.lines.filter((l) => l.startsWith('EXTEND')), [`EXTEND k ${lock.token} 1`]);
  assert.ok(lock.remaining() > 0.5, `remaining ${lock.remaining()}: the renewal's OK did not move the deadline`);
  await lock.release();
  extendReply = 'ERR not_held the lease ran out';
  const gone = await client.lock('k2', { lease: 1, wait: 300 });
  await aborted(gone.signal);
  assert.equal(gone.lostReason, 'moved');
});
