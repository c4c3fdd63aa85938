'use strict';

/**
 * Runner of the shared behavioural suite, clients/conformance/scenarios.json
 * (format: clients/conformance/README.md), for the Node.js Client.
 */

const { spawn } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { performance } = require('node:perf_hooks');

const ticketing = require('..');
const { parseInfo, parseHeld } = require('../lib/protocol');

const SCENARIOS_FILE = path.resolve(__dirname, '..', '..', 'conformance', 'scenarios.json');
const AWAIT_LIMIT_MS = 30_000;
// HANG_GUARD_S bounds a wait (await_lost, expect_closed) only so that a broken
// library fails instead of hanging: no scenario relies on it for speed.
const HANG_GUARD_S = 30;
/** How often await_lost looks at a lock (its reason may change after the signal). */
const POLL_MS = 10;

/** @returns {object[]} the scenarios */
function loadScenarios() {
  const doc = JSON.parse(fs.readFileSync(SCENARIOS_FILE, 'utf8'));
  if (doc.format !== 1) throw new Error(`${SCENARIOS_FILE}: unsupported format ${doc.format}`);
  return doc.scenarios;
}

class ScenarioFailure extends Error {}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A raw reply line as an outcome. */
function classifyReply(line) {
  if (line === 'PONG') return { kind: 'pong', reply: line };
  if (line === 'OK') return { kind: 'ok', reply: line };
  let m = /^OK ([0-9]+)$/.exec(line);
  if (m) return { kind: 'ok', token: BigInt(m[1]), reply: line };
  if (['BUSY', 'TIMEOUT', 'INDETERMINATE'].includes(line)) return { kind: line.toLowerCase(), reply: line };
  m = /^ERR(?: ([^ ]*))?/.exec(line);
  if (m) return { kind: 'error', code: m[1] ?? '', reply: line };
  if (line.startsWith('INFO')) return { kind: 'info', info: parseInfo(line), reply: line };
  if (line.startsWith('HELD')) return { kind: 'held', held: parseHeld(line), reply: line };
  return { kind: 'reply', reply: line };
}

/** A client error as an outcome (argument errors are TypeError/RangeError). */
function classifyError(e) {
  if (e instanceof ticketing.LockLostError) return { kind: 'lost', reason: e.reason };
  if (e instanceof ticketing.BusyError) return { kind: 'busy' };
  if (e instanceof ticketing.LockTimeoutError) return { kind: 'timeout' };
  if (e instanceof ticketing.IndeterminateError) return { kind: 'indeterminate', detail: e.message };
  if (e instanceof ticketing.ServerError) return { kind: 'error', code: e.code, detail: e.detail };
  if (e instanceof ticketing.SidecarConnectionError) return { kind: 'connection_error', detail: e.message };
  if (e instanceof ticketing.TicketingError) return { kind: 'protocol_error', detail: e.message };
  if (e instanceof TypeError || e instanceof RangeError) return { kind: 'arg_error', detail: `${e.name}: ${e.message}` };
  throw e;
}

const show = (o) => JSON.stringify(o, (_, v) => (typeof v === 'bigint' ? `${v}n` : v));

class Runner {
  /**
   * @param {string} socketPath
   * @param {object} scenario
   * @param {number} index
   */
  constructor(socketPath, scenario, index, restart = null) {
    this.socketPath = socketPath;
    /** @type {(() => Promise<void>)|null} restarts the sidecar (op restart_sidecar) */
    this.restart = restart;
    this.scenario = scenario;
    this.namespace = `conf-node-${crypto.randomBytes(4).toString('hex')}/${index}/`;
    this.keyOpts = scenario.keys ?? {};
    /** @type {Map<string, ticketing.Client>} */
    this.conns = new Map();
    /** @type {Map<string, bigint>} */
    this.tokens = new Map();
    /** The slot of each saved permit (slot_of). */
    this.slots = new Map();
    /** @type {Map<string, ticketing.Lock>} */
    this.locks = new Map();
    // When the call that took or last extended each saved lock began
    // (performance.now()): its local deadline counts from a send no earlier.
    this.since = new Map();
    /**
     * Background requests by id; `queued` is set by an acquire's onQueued
     * hook (always before `done`: the event precedes the reply).
     * @type {Map<string, {promise: Promise<any>, done: boolean, result?: any, queued: boolean, onQueued: () => void, wasQueued: Promise<void>}>}
     */
    this.background = new Map();
  }

  key(name) {
    const k = this.namespace + name;
    const pad = this.keyOpts[name]?.pad_to;
    return pad ? k + 'x'.repeat(pad - k.length) : k;
  }

  stepKey(step) {
    return 'literal_key' in step ? step.literal_key : this.key(step.key);
  }

  token(name) {
    if (!this.tokens.has(name)) throw new ScenarioFailure(`no saved token ${name}`);
    return this.tokens.get(name);
  }

  lock(name) {
    if (!this.locks.has(name)) throw new ScenarioFailure(`no saved lock ${name}`);
    return this.locks.get(name);
  }

  stepToken(step) {
    // Decimal strings go to the client as they are: release() accepts them.
    return 'literal_token' in step ? step.literal_token : this.token(step.token);
  }

  expand(line) {
    return line.replace(/\$\{(key|token):([^}]+)\}/g, (_, kind, name) => (
      kind === 'key' ? this.key(name) : String(this.token(name))));
  }

  conn(name) {
    if (!this.conns.has(name)) this.conns.set(name, new ticketing.Client({ path: this.socketPath }));
    return this.conns.get(name);
  }

  /**
   * Start the step's request (written synchronously) and return a promise
   * of its outcome and duration.
   * @param {object} step
   * @param {(() => void)|null} [onQueued] the acquire ops' onQueued hook
   */
  perform(step, onQueued = null) {
    const client = this.conn(step.conn);
    const t0 = performance.now();
    const acq = { lease: step.lease, wait: step.wait, onQueued, label: step.label ?? null };
    let promise;
    switch (step.op) {
      case 'acquire':
        promise = client.acquire(this.stepKey(step), acq).then((token) => ({ kind: 'ok', token }));
        break;
      case 'acquire_block':
        promise = client.acquireBlock(step.block.map((n) => this.key(n)), acq).then((token) => ({ kind: 'ok', token }));
        break;
      case 'acquire_permit': {
        const key = this.stepKey(step);
        promise = client.acquirePermit(key, acq).then((permit) => {
          if (permit.fenceKey !== ticketing.fenceKey(key, permit.slot)) throw new ScenarioFailure(`permit fenceKey ${permit.fenceKey}`);
          return { kind: 'ok', token: permit.token, slot: permit.slot };
        });
        break;
      }
      case 'set_permits':
        promise = client.setPermits(this.stepKey(step), step.permits).then(() => ({ kind: 'ok' }));
        break;
      case 'lock':
        promise = client.lock(this.stepKey(step), acq).then((lock) => ({ kind: 'ok', token: lock.token, lock }));
        break;
      case 'lock_block':
        promise = client.lockBlock(step.block.map((n) => this.key(n)), acq)
          .then((lock) => ({ kind: 'ok', token: lock.token, lock }));
        break;
      case 'extend':
        // The lock's own connection: a lock belongs to the session that took it.
        promise = this.lock(step.lock).extend(step.lease).then(() => {
          this.since.set(step.lock, t0);
          return { kind: 'ok' };
        });
        break;
      case 'release':
        promise = client.release(this.stepKey(step), this.stepToken(step)).then(() => ({ kind: 'ok' }));
        break;
      case 'ping':
        promise = client.ping().then(() => ({ kind: 'pong' }));
        break;
      case 'info':
        // The raw line, on the same connection, for info_same_as_raw.
        promise = client.info().then(async (info) => ({ kind: 'info', info, reply: await client.raw('INFO') }));
        break;
      case 'held':
        promise = client.held().then(async (held) => ({
          kind: 'held', held, heldLocks: step.labels === undefined ? null : await client.heldLocks(),
        }));
        break;
      case 'raw': {
        let line = this.expand(step.line);
        if (step.pad_to) line += 'x'.repeat(step.pad_to - line.length);
        promise = client.raw(line).then(classifyReply);
        break;
      }
      default:
        throw new ScenarioFailure(`unknown op ${step.op}`);
    }
    return promise.catch(classifyError).then((out) => ({ out, elapsed: (performance.now() - t0) / 1000 }));
  }

  check(step, out, elapsed) {
    // expect is a kind or a list of kinds; code applies to an error.
    const wants = step.expect === undefined ? [] : [].concat(step.expect);
    if (wants.length > 0 && !wants.includes(out.kind)) {
      throw new ScenarioFailure(`expected ${wants.join(' or ')}, got ${show(out)}`);
    }
    if (step.code !== undefined && out.kind === 'error') {
      const codes = Array.isArray(step.code) ? step.code : [step.code];
      if (!codes.includes(out.code)) throw new ScenarioFailure(`expected error code ${codes.join(' or ')}, got ${show(out)}`);
    }
    if (step.reply !== undefined && out.reply !== step.reply) {
      throw new ScenarioFailure(`expected reply ${JSON.stringify(step.reply)}, got ${JSON.stringify(out.reply)}`);
    }
    if (step.slot !== undefined && out.slot !== step.slot) {
      throw new ScenarioFailure(`expected slot ${step.slot}, got ${out.slot} (${show(out)})`);
    }
    if (step.slot_of !== undefined && out.slot !== this.slots.get(step.slot_of)) {
      throw new ScenarioFailure(`expected ${step.slot_of}'s slot ${this.slots.get(step.slot_of)}, got ${out.slot}`);
    }
    if (step.save !== undefined) {
      if (typeof out.token !== 'bigint') throw new ScenarioFailure(`no token to save in ${show(out)}`);
      this.tokens.set(step.save, out.token);
      this.slots.set(step.save, out.slot);
      if (out.lock) {
        this.locks.set(step.save, out.lock);
        this.since.set(step.save, performance.now() - elapsed * 1000);
      }
    }
    const gt = step.expect_token_gt === undefined ? [] : [].concat(step.expect_token_gt);
    for (const name of gt) {
      if (typeof out.token !== 'bigint' || !(out.token > this.token(name))) {
        throw new ScenarioFailure(`expected a token > ${name}=${this.token(name)}, got ${out.token}`);
      }
    }
    if (step.min_seconds !== undefined && elapsed < step.min_seconds) {
      throw new ScenarioFailure(`took ${elapsed.toFixed(3)} s, expected at least ${step.min_seconds} s`);
    }
    if (step.max_seconds !== undefined && elapsed > step.max_seconds) {
      throw new ScenarioFailure(`took ${elapsed.toFixed(3)} s, expected at most ${step.max_seconds} s`);
    }
    if (step.expect === 'held') {
      const want = (step.keys ?? []).map((k) => this.key(k)).sort();
      const got = out.held.map((h) => h.key).sort();
      if (JSON.stringify(want) !== JSON.stringify(got)) {
        throw new ScenarioFailure(`expected held keys ${JSON.stringify(want)}, got ${show(out.held)}`);
      }
      for (const [k, t] of Object.entries(step.tokens ?? {})) {
        if (!out.held.some((h) => h.key === this.key(k) && h.token === this.token(t))) {
          throw new ScenarioFailure(`expected ${k} held under ${t}=${this.token(t)}, got ${show(out.held)}`);
        }
      }
      if (step.labels !== undefined) this.checkLabels(step, out);
    }
    if (step.lock_label !== undefined) {
      if (!out.lock) throw new ScenarioFailure(`lock_label on a step that made no lock: ${show(out)}`);
      if (out.lock.label !== step.lock_label) {
        throw new ScenarioFailure(`expected the lock's label ${JSON.stringify(step.lock_label)}, got ${JSON.stringify(out.lock.label)}`);
      }
    }
    if (step.expect === 'info') this.checkInfo(step, out);
  }

  /**
   * heldLocks() lists what held() did, and each named key's label (null for
   * none).
   */
  checkLabels(step, out) {
    const hl = out.heldLocks ?? [];
    if (show(hl.map(({ key, token }) => ({ key, token }))) !== show(out.held)) {
      throw new ScenarioFailure(`heldLocks ${show(hl)} does not match held ${show(out.held)}`);
    }
    for (const [k, want] of Object.entries(step.labels)) {
      const h = hl.find((e) => e.key === this.key(k));
      if (!h || h.label !== want) throw new ScenarioFailure(`expected ${k}'s label ${JSON.stringify(want)}, got ${show(hl)}`);
    }
  }

  /**
   * The parsed Info is plausible; each field of info_same_as_raw equals the
   * raw INFO line's (read right after it; `-` is null); each field of
   * info_known is known (not null).
   */
  checkInfo(step, out) {
    const { info } = out;
    if (!info.cluster || info.total < 1 || info.connected < 0 || info.connected > info.total) {
      throw new ScenarioFailure(`implausible INFO ${show(info)}`);
    }
    const raw = {};
    for (const w of out.reply.split(' ').slice(1)) {
      const eq = w.indexOf('=');
      const v = w.slice(eq + 1);
      raw[w.slice(0, eq)] = v === '-' ? null : v;
    }
    if (raw.connected) [raw.connected, raw.total] = raw.connected.split('/').map(Number);
    if (raw.protocol != null) raw.protocol = Number(raw.protocol);
    // The library's names of the protocol's fields.
    const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
    for (const name of step.info_same_as_raw ?? []) {
      if (!(camel(name) in info)) throw new ScenarioFailure(`Info has no field ${camel(name)}: ${show(info)}`);
      if (info[camel(name)] !== (raw[name] ?? null)) {
        throw new ScenarioFailure(`Info.${camel(name)} is ${show(info[camel(name)])}, the raw INFO line's ${show(raw[name])}`);
      }
    }
    for (const name of step.info_known ?? []) {
      if (info[camel(name)] === null || info[camel(name)] === undefined || info[camel(name)] === '') {
        throw new ScenarioFailure(`Info.${camel(name)} is not known: ${show(info)}`);
      }
    }
  }

  /**
   * connect_default: open connection `conn` with the library's default
   * socket path (`new Client()`), with $TICKETING_SOCKET set to the
   * sidecar's socket (env `sidecar`), unset, or set to a path with no
   * socket (`missing`), from a working directory whose ./ticketing.sock
   * leads to the sidecar (`cwd_socket`) or that has none; then PING on it.
   * The environment and the working directory are restored after.
   */
  async connectDefault(step) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tkc'));
    const oldEnv = process.env.TICKETING_SOCKET;
    const oldCwd = process.cwd();
    const t0 = performance.now();
    try {
      if (step.cwd_socket) fs.symlinkSync(this.socketPath, path.join(dir, 'ticketing.sock'));
      switch (step.env) {
        case 'sidecar': process.env.TICKETING_SOCKET = this.socketPath; break;
        case 'unset': delete process.env.TICKETING_SOCKET; break;
        case 'missing': process.env.TICKETING_SOCKET = path.join(dir, 'missing.sock'); break;
        default: throw new ScenarioFailure(`unknown env ${step.env}`);
      }
      process.chdir(dir);
      const old = this.conns.get(step.conn);
      if (old) await old.close();
      const client = new ticketing.Client();
      this.conns.set(step.conn, client);
      const out = await client.ping().then(() => ({ kind: 'pong' }), classifyError);
      this.check(step, out, (performance.now() - t0) / 1000);
    } finally {
      process.chdir(oldCwd);
      if (oldEnv === undefined) delete process.env.TICKETING_SOCKET;
      else process.env.TICKETING_SOCKET = oldEnv;
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }

  /** expect_alive: the lock's signal has not fired; remaining() within bounds. */
  expectAlive(step) {
    const lock = this.lock(step.lock);
    if (lock.lost || lock.signal.aborted) throw new ScenarioFailure(`lock lost (${lock.lostReason})`);
    const left = lock.remaining();
    // remaining_min counts from the call that took or last extended the
    // lock, so a slow step in between cannot fail it.
    const since = (performance.now() - this.since.get(step.lock)) / 1000;
    if (step.remaining_min !== undefined && left + since < step.remaining_min) {
      throw new ScenarioFailure(`remaining ${left.toFixed(3)} s ${since.toFixed(3)} s after the lock's call began, `
        + `expected at least ${step.remaining_min} s`);
    }
    if (step.remaining_max !== undefined && left > step.remaining_max) {
      throw new ScenarioFailure(`remaining ${left.toFixed(3)} s, expected at most ${step.remaining_max} s`);
    }
  }

  /** await_lost: until the signal has fired with one of the reasons. */
  async awaitLost(step) {
    const lock = this.lock(step.lock);
    const reasons = [].concat(step.reason);
    const within = step.within ?? HANG_GUARD_S;
    const t0 = performance.now();
    while (!(lock.signal.aborted && reasons.includes(lock.lostReason))) {
      if (performance.now() - t0 > within * 1000) {
        throw new ScenarioFailure(`not lost with reason ${reasons.join(' or ')} within ${within} s `
          + `(aborted ${lock.signal.aborted}, reason ${lock.lostReason})`);
      }
      await sleep(POLL_MS);
    }
    if (!(lock.signal.reason instanceof ticketing.LockLostError)) {
      throw new ScenarioFailure(`signal.reason is not a LockLostError: ${lock.signal.reason}`);
    }
    // The bounds count from the call that took or last extended the lock.
    this.check({ min_seconds: step.min_seconds, max_seconds: step.max_seconds }, {},
      (performance.now() - this.since.get(step.lock)) / 1000);
  }

  /**
   * await_queued: until background request `id` has had its `! QUEUED`
   * event (the library's onQueued hook). Fails if its reply came without
   * one, or after 30 s (a hang guard, no bound on the cluster's speed).
   */
  async awaitQueued(step) {
    const bg = this.background.get(step.id);
    if (!bg) throw new ScenarioFailure(`no background request ${step.id}`);
    let timer;
    const limit = new Promise((resolve) => { timer = setTimeout(resolve, AWAIT_LIMIT_MS); });
    try {
      await Promise.race([bg.wasQueued, bg.promise, limit]);
    } finally {
      clearTimeout(timer);
    }
    // The event comes before the reply, so a finished request that was
    // queued has `queued` set by now.
    if (bg.queued) return;
    if (bg.done) throw new ScenarioFailure(`finished without a QUEUED event: ${show(bg.result.out)}`);
    throw new ScenarioFailure(`no QUEUED event within ${AWAIT_LIMIT_MS / 1000} s`);
  }

  /**
   * stall: stop this process with SIGSTOP, as a stalled holder is stopped;
   * a detached child sends SIGCONT after the given seconds.
   */
  stall(step) {
    const child = spawn('sh', ['-c', `sleep ${Number(step.seconds)}; kill -CONT ${process.pid}`], {
      detached: true, stdio: 'ignore',
    });
    if (child.pid === undefined) throw new ScenarioFailure('could not start the process that would SIGCONT us');
    child.unref();
    process.kill(process.pid, 'SIGSTOP'); // returns once continued
  }

  async runStep(step) {
    switch (step.op) {
      case 'sleep':
        await sleep(step.seconds * 1000);
        return;
      case 'expect_alive':
        this.expectAlive(step);
        return;
      case 'await_lost':
        await this.awaitLost(step);
        return;
      case 'stall':
        this.stall(step);
        return;
      case 'pending': {
        const bg = this.background.get(step.id);
        await sleep(0);
        if (bg.done) throw new ScenarioFailure(`expected still pending, but finished: ${show(bg.result.out)}`);
        return;
      }
      case 'await_queued':
        await this.awaitQueued(step);
        return;
      case 'await': {
        const bg = this.background.get(step.id);
        const t0 = performance.now();
        let timer;
        const limit = new Promise((_, reject) => {
          timer = setTimeout(() => reject(new ScenarioFailure(`still pending after ${AWAIT_LIMIT_MS / 1000} s`)), AWAIT_LIMIT_MS);
        });
        try {
          const { out } = await Promise.race([bg.promise, limit]);
          this.check(step, out, (performance.now() - t0) / 1000);
        } finally {
          clearTimeout(timer);
        }
        return;
      }
      case 'restart_sidecar':
        if (!this.restart) throw new ScenarioFailure('this runner cannot restart the sidecar');
        await this.restart();
        return;
      case 'connect_default':
        await this.connectDefault(step);
        return;
      case 'close': {
        const client = this.conns.get(step.conn);
        this.conns.delete(step.conn);
        if (client) await client.close();
        return;
      }
      case 'expect_closed': {
        const client = this.conn(step.conn);
        const within = step.within ?? HANG_GUARD_S;
        const deadline = performance.now() + within * 1000;
        while (client.connected) {
          if (performance.now() > deadline) throw new ScenarioFailure(`connection still open after ${within} s`);
          await sleep(10);
        }
        return;
      }
      default:
        break;
    }
    if (step.background !== undefined) {
      // The request is written synchronously by perform(); a block's
      // ACQUIRE is, once its connection has agreed the version with HELLO.
      if (step.op === 'acquire_block' || step.op === 'acquire_permit') await this.conn(step.conn).hello();
      const bg = { done: false, queued: false };
      bg.wasQueued = new Promise((resolve) => {
        bg.onQueued = () => { bg.queued = true; resolve(); };
      });
      const client = this.conn(step.conn);
      const sent = client.requestsSent;
      bg.promise = this.perform(step, bg.onQueued).then((r) => { bg.done = true; bg.result = r; return r; });
      this.background.set(step.background, bg);
      // A PERMIT is written after the client checked the agreed version
      // (an await): wait until it is written, so that the next step's
      // request comes after it.
      while (step.op === 'acquire_permit' && client.requestsSent === sent && !bg.done) {
        await new Promise((r) => setTimeout(r, 1));
      }
      return;
    }
    const { out, elapsed } = await this.perform(step);
    this.check(step, out, elapsed);
  }

  async run() {
    try {
      for (const [i, step] of this.scenario.steps.entries()) {
        try {
          await this.runStep(step);
        } catch (e) {
          if (!(e instanceof ScenarioFailure)) throw e;
          throw new ScenarioFailure(`${this.scenario.name} step ${i} ${JSON.stringify(step)}: ${e.message}`);
        }
      }
    } finally {
      await Promise.all([...this.conns.values()].map((c) => c.close()));
      await Promise.allSettled([...this.background.values()].map((b) => b.promise));
    }
  }
}

/**
 * Run one scenario against the sidecar at socketPath; rejects on failure.
 * @param {string} socketPath
 * @param {object} scenario
 * @param {number} index
 * @param {(() => Promise<void>)|null} [restart] restarts that sidecar (op restart_sidecar)
 */
function runScenario(socketPath, scenario, index, restart = null) {
  return new Runner(socketPath, scenario, index, restart).run();
}

module.exports = { loadScenarios, runScenario, classifyReply, ScenarioFailure };
