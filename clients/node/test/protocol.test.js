'use strict';

// Argument checks and reply parsing, without a sidecar.

const assert = require('node:assert/strict');
const { test } = require('node:test');
const p = require('../lib/protocol');
const ticketing = require('..');

test('acquire lines', () => {
  assert.deepEqual(p.acquireLine('seats/42', 30, 5), { line: 'ACQUIRE seats/42 30 5', waitSeconds: 5 });
  assert.equal(p.acquireLine('k', 1, 0).line, 'ACQUIRE k 1 0');
  assert.equal(p.acquireLine('k', 250, 0.25).line, 'ACQUIRE k 250 0.25');
  assert.equal(p.acquireLine('k', 10, 1.005).line, 'ACQUIRE k 10 1.005');
  assert.equal(p.acquireLine('k', 10, 0.1).line, 'ACQUIRE k 10 0.1');
  assert.equal(p.acquireLine('k', 10, 300).line, 'ACQUIRE k 10 300');
  assert.equal(p.acquireLine('~'.repeat(255), 10, 0).line, `ACQUIRE ${'~'.repeat(255)} 10 0`);
});

test('bad arguments', () => {
  for (const lease of [0, 251, -1, 1.5]) assert.throws(() => p.checkLease(lease), RangeError, `lease ${lease}`);
  for (const lease of ['30', 30n, null, undefined]) assert.throws(() => p.checkLease(lease), TypeError);
  for (const wait of [-1, -0.001, 3600.001, 3601, 0.0005, Infinity, NaN]) assert.throws(() => p.waitMillis(wait), RangeError, `wait ${wait}`);
  for (const wait of ['1', null, true]) assert.throws(() => p.waitMillis(wait), TypeError);
  for (const key of ['', 'a b', 'tab\t', 'nl\n', 'del\x7f', 'métro', 'x'.repeat(256)]) {
    assert.throws(() => p.checkKey(key), RangeError, `key ${JSON.stringify(key)}`);
  }
  assert.throws(() => p.checkKey(Buffer.from('k')), TypeError);
});

test('tokens keep u64 precision', () => {
  assert.equal(p.releaseLine('k', 18446744073709551615n), 'RELEASE k 18446744073709551615');
  assert.equal(p.releaseLine('k', '18446744073709551615'), 'RELEASE k 18446744073709551615');
  assert.equal(p.releaseLine('k', 7), 'RELEASE k 7');
  for (const t of [0n, -1n, 1n << 64n, '0', '-1', 'abc', '18446744073709551616', 2 ** 53, 1.5]) {
    assert.throws(() => p.toToken(t), RangeError, `token ${t}`);
  }
  for (const t of [null, {}, true]) assert.throws(() => p.toToken(t), TypeError);
});

test('reply parsing', () => {
  assert.equal(p.parseAcquire('OK 18446744073709551615'), 18446744073709551615n);
  assert.throws(() => p.parseAcquire('BUSY'), ticketing.BusyError);
  assert.throws(() => p.parseAcquire('TIMEOUT'), ticketing.TimeoutError);
  assert.throws(() => p.parseAcquire('INDETERMINATE'), ticketing.IndeterminateError);
  for (const bad of ['OK', 'OK 0', 'OK -3', 'OK 18446744073709551616', 'WHAT']) {
    assert.throws(() => p.parseAcquire(bad), ticketing.ProtocolError, bad);
  }
  assert.throws(() => p.parseAcquire('ERR invalid_lease lease must be 1..250 seconds'), (e) => {
    assert.ok(e instanceof ticketing.ServerError && e instanceof ticketing.TicketingError);
    assert.equal(e.code, 'invalid_lease');
    assert.equal(e.detail, 'lease must be 1..250 seconds');
    return true;
  });
  assert.throws(() => p.parseRelease('ERR not_held'), (e) => e.code === 'not_held' && e.detail === '');
  // A field an older sidecar does not send is null.
  assert.deepEqual(p.parseInfo('INFO cluster=dev leader=- connected=2/3 x=y'), {
    cluster: 'dev', leader: null, connected: 2, total: 3, domain: null, members: null, protocol: null, sessions: null,
    session: null, sessionState: null, sessionTimeoutMs: null, sessionResumes: null, sessionOpens: null,
    sessionHeld: null, sessionLastResume: null, fields: { cluster: 'dev', leader: '-', connected: '2/3', x: 'y' },
  });
  // The sidecar's cluster session (unixapi/PROTOCOL.md, INFO): fields this
  // client does not type, kept in fields.
  const info = p.parseInfo('INFO cluster=dev leader=127.0.0.1:7401 connected=3/3 domain=d members=- protocol=4 ' +
    'sessions=auto session=5c1e0f7a92b3d4e8 session_state=attached session_timeout_ms=10000 session_resumes=1 ' +
    'session_opens=1 session_held=0 session_last_resume=outcomes:2,queued:12,void:0,repeated:0');
  assert.equal(info.leader, '127.0.0.1:7401');
  assert.equal(info.fields.session, '5c1e0f7a92b3d4e8');
  assert.equal(info.fields.session_state, 'attached');
  assert.equal(Number(info.fields.session_timeout_ms), 10000);
  assert.equal(info.fields.session_last_resume, 'outcomes:2,queued:12,void:0,repeated:0');
  // ... and typed: every field of the protocol is a property.
  assert.equal(info.domain, 'd');
  assert.equal(info.members, null);
  assert.equal(info.protocol, 4);
  assert.deepEqual([info.sessions, info.session, info.sessionState], ['auto', '5c1e0f7a92b3d4e8', 'attached']);
  assert.deepEqual([info.sessionTimeoutMs, info.sessionResumes, info.sessionOpens, info.sessionHeld], [10000, 1, 1, 0]);
  assert.deepEqual(p.parseInfo('INFO cluster=dev connected=3/3 members=n1/mr6:voter@127.0.0.1:7401,n2/k3c:learner@-').members, [
    { id: 'n1/mr6', role: 'voter', addr: '127.0.0.1:7401' }, { id: 'n2/k3c', role: 'learner', addr: null }]);
  assert.throws(() => p.parseInfo('INFO connected=1/3 protocol=four'), ticketing.ProtocolError);
  assert.throws(() => p.parseInfo('INFO connected=1/3 members=nocolon'), ticketing.ProtocolError);
  assert.deepEqual(p.parseHeld('HELD 0'), []);
  assert.deepEqual(p.parseHeld('HELD 3 a:b:7 c:9 c:12'), [
    { key: 'a:b', token: 7n }, { key: 'c', token: 9n }, { key: 'c', token: 12n }]);
  assert.throws(() => p.parseHeld('HELD 2 a:1'), ticketing.ProtocolError);
});

test('HELLO replies to HELLO 9 events', () => {
  assert.equal(p.helloEventsLine(), 'HELLO 9 events');
  assert.deepEqual(p.parseHelloEvents('HELLO 9 events'), { version: 9, events: true });
  assert.deepEqual(p.parseHelloEvents('HELLO 8 events'), { version: 8, events: true });
  assert.deepEqual(p.parseHelloEvents('HELLO 7 events'), { version: 7, events: true });
  assert.deepEqual(p.parseHelloEvents('HELLO 6 events'), { version: 6, events: true });
  assert.deepEqual(p.parseHelloEvents('HELLO 4 events'), { version: 4, events: true });
  assert.deepEqual(p.parseHelloEvents('HELLO 3 events'), { version: 3, events: true });
  assert.deepEqual(p.parseHelloEvents('HELLO 4'), { version: 4, events: false });
  assert.deepEqual(p.parseHelloEvents('ERR bad_request x'), { version: 2, events: false });
  assert.deepEqual(p.parseHelloEvents('ERR unknown_verb x'), { version: 1, events: false });
  for (const bad of ['HELLO 10 events', 'HELLO 0 events', 'HELLO 4 events x', 'HELLO']) {
    assert.throws(() => p.parseHelloEvents(bad), ticketing.ProtocolError, bad);
  }
});
