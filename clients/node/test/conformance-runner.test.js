'use strict';

// The conformance runner's own ops that a real sidecar cannot be made to
// fail on cue: await_queued passes on the library's onQueued hook and fails
// when the reply came without a `! QUEUED` event. Against the scripted
// sidecar; the scenarios themselves run against a real one
// (conformance.test.js).

const assert = require('node:assert/strict');
const { test } = require('node:test');
const { FakeSidecar } = require('../support/fakesidecar');
const { runScenario, ScenarioFailure } = require('../support/conformance');

/**
 * A sidecar that numbers each connection's request lines as the real one
 * does and answers an ACQUIRE of a key ending in `q` with `! QUEUED` before
 * its grant, any other ACQUIRE with the grant alone.
 */
async function queueingFake() {
  const counts = new Map();
  const fake = await new FakeSidecar((line, peer) => {
    const n = (counts.get(peer) ?? 0) + 1;
    counts.set(peer, n);
    if (!line.startsWith('ACQUIRE ')) return undefined;
    const keys = line.split(' ').slice(1, -2);
    const event = keys[0].endsWith('q') ? `! QUEUED ${n} ${keys.join(' ')}\n` : '';
    return `${event}OK ${fake.nextToken++}`;
  }).start();
  return fake;
}

const scenario = (steps) => ({ name: 'runner_self_test', steps });

test('await_queued passes once the background acquire was queued, for a key and a block', async () => {
  const fake = await queueingFake();
  try {
    await runScenario(fake.path, scenario([
      { conn: 'a', op: 'ping', expect: 'pong' },
      { conn: 'a', op: 'acquire', key: 'q', lease: 10, wait: 5, background: 'w1' },
      { op: 'await_queued', id: 'w1' },
      { conn: 'b', op: 'acquire_block', block: ['xq', 'y'], lease: 10, wait: 5, background: 'w2' },
      { op: 'await_queued', id: 'w2' },
      { op: 'await', id: 'w1', expect: 'ok' },
      { op: 'await', id: 'w2', expect: 'ok' },
    ]), 0);
  } finally {
    await fake.stop();
  }
});

test('await_queued fails when the reply came without a QUEUED event', async () => {
  const fake = await queueingFake();
  try {
    await assert.rejects(runScenario(fake.path, scenario([
      { conn: 'a', op: 'acquire', key: 'k', lease: 10, wait: 5, background: 'w1' },
      { op: 'await_queued', id: 'w1' },
    ]), 0), (e) => e instanceof ScenarioFailure && /finished without a QUEUED event/.test(e.message));
    await assert.rejects(runScenario(fake.path, scenario([{ op: 'await_queued', id: 'nothing' }]), 0),
      (e) => e instanceof ScenarioFailure && /no background request/.test(e.message));
  } finally {
    await fake.stop();
  }
});
