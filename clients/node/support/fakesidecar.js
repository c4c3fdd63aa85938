'use strict';

/**
 * A scripted stand-in for the sidecar's unix socket, for tests that need
 * replies and event lines the real sidecar cannot be made to send on cue
 * (an event in the same chunk as a grant, malformed events, a refused
 * HELLO option). It answers every request line in order; the answer comes
 * from `respond(line, peer)` when that returns a string (or null: no
 * answer, the test writes it later), else from a default table: HELLO →
 * `HELLO 4 events`, ACQUIRE → `OK <next token>`, RELEASE/EXTEND → `OK`,
 * PING → `PONG`, HELD → `HELD 0`.
 */

const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');

class FakeSidecar {
  /**
   * @param {(line: string, peer: net.Socket) => string|null|undefined} [respond]
   */
  constructor(respond = () => undefined) {
    this.respond = respond;
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tk-fake-'));
    this.path = path.join(this.dir, 's.sock');
    /** @type {string[]} every request line received, in order */
    this.lines = [];
    /** @type {net.Socket[]} */
    this.peers = [];
    this.nextToken = 100n;
    this.server = net.createServer((peer) => this.#serve(peer));
  }

  /** @returns {Promise<this>} */
  async start() {
    await new Promise((resolve) => this.server.listen(this.path, resolve));
    return this;
  }

  /** The most recent connection. */
  get peer() {
    return this.peers[this.peers.length - 1];
  }

  /** Write raw text to the most recent connection. */
  send(text) {
    this.peer.write(text);
  }

  /** Resolves once `n` request lines have arrived in all. */
  async waitLines(n) {
    while (this.lines.length < n) await new Promise((r) => setTimeout(r, 5));
  }

  #serve(peer) {
    this.peers.push(peer);
    peer.setEncoding('utf8');
    peer.on('error', () => {});
    let buf = '';
    peer.on('data', (d) => {
      buf += d;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        this.lines.push(line);
        let reply = this.respond(line, peer);
        if (reply === undefined) reply = this.#default(line);
        if (reply !== null) peer.write(`${reply}\n`);
      }
    });
  }

  #default(line) {
    const verb = line.split(' ')[0];
    switch (verb) {
      case 'HELLO': return 'HELLO 4 events';
      case 'ACQUIRE': return `OK ${this.nextToken++}`;
      case 'RELEASE': case 'EXTEND': return 'OK';
      case 'PING': return 'PONG';
      case 'HELD': return 'HELD 0';
      default: return 'ERR unknown_verb fake';
    }
  }

  async stop() {
    for (const p of this.peers) p.destroy();
    await new Promise((r) => this.server.close(r));
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * The setup of a test file whose tests each start fake sidecars with
 * clients of them: returns `setup(respond)`, which starts a FakeSidecar
 * answering with `respond` and a Client of it, both stopped after the test
 * (registered with the `afterEach` given, node:test's).
 * @param {(fn: () => Promise<void>) => void} afterEach
 */
function fakeSidecarSetup(afterEach) {
  // Required here, not at the top: the client requires nothing of this file.
  const { Client } = require('..');
  let cleanup = [];
  afterEach(async () => {
    for (const f of cleanup.reverse()) await f();
    cleanup = [];
  });
  return async function setup(respond) {
    const fake = await new FakeSidecar(respond).start();
    const client = new Client({ path: fake.path });
    cleanup.push(() => fake.stop(), () => client.close());
    return { fake, client };
  };
}

module.exports = { FakeSidecar, fakeSidecarSetup };
