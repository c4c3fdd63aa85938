'use strict';

/**
 * Start and stop a real `ticketing dev` (3 nodes + sidecar) for tests. The
 * binary is $TICKETING_BIN; if unset it is built once per process with
 * `go build -o <tmp>/ticketing ./cmd/ticketing` from the repository root.
 */

const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const readline = require('node:readline');

const REPO_ROOT = path.resolve(__dirname, '..', '..', '..');
const READY_TIMEOUT_MS = 60_000;
const SIDECAR_TIMEOUT_MS = 15_000;

let built = null;

/** @returns {string} the ticketing binary */
function ticketingBinary() {
  if (process.env.TICKETING_BIN) return process.env.TICKETING_BIN;
  if (!built) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tk-bin-'));
    built = path.join(dir, 'ticketing');
    execFileSync('go', ['build', '-o', built, './cmd/ticketing'], { cwd: REPO_ROOT, stdio: 'inherit' });
    process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  }
  return built;
}

/** One INFO over a fresh connection; resolves true once it names a leader. */
function readyOnce(socketPath) {
  return new Promise((resolve) => {
    const s = net.createConnection({ path: socketPath });
    let buf = '';
    const done = (ok) => { s.destroy(); resolve(ok); };
    s.setTimeout(2000, () => done(false));
    s.on('connect', () => s.write('INFO\n'));
    s.on('data', (d) => {
      buf += d;
      if (buf.includes('\n')) done(buf.startsWith('INFO ') && !buf.includes(' leader=- '));
    });
    s.on('error', () => done(false));
  });
}

/**
 * A running `ticketing dev`; `socket` is the sidecar's path.
 */
class DevCluster {
  constructor() {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tk-node-'));
    this.socket = path.join(this.dir, 's.sock');
    this.output = [];
    this.spawn();
  }

  spawn() {
    this.proc = spawn(ticketingBinary(), [
      'dev', '--base-port', '0', '--dir', path.join(this.dir, 'data'), '--socket', this.socket,
    ], { stdio: ['ignore', 'pipe', 'pipe'] });
    this.exited = new Promise((resolve) => this.proc.once('exit', resolve));
    this.proc.stderr.on('data', (d) => this.remember(String(d)));
  }

  remember(text) {
    this.output.push(text);
    if (this.output.length > 200) this.output.shift();
  }

  log() {
    return this.output.join('\n');
  }

  /** Wait for `ready` and for the sidecar to answer INFO with a leader. */
  async start() {
    const lines = readline.createInterface({ input: this.proc.stdout });
    const ready = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`ticketing dev not ready:\n${this.log()}`)), READY_TIMEOUT_MS);
      lines.on('line', (line) => {
        this.remember(line);
        const m = /^\s*sidecar socket:\s*(.+)$/.exec(line);
        if (m) this.socket = m[1].trim();
        if (line.includes('ready')) { clearTimeout(timer); resolve(); }
      });
      this.proc.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`ticketing dev exited (${code}):\n${this.log()}`));
      });
    });
    try {
      await ready;
      const deadline = Date.now() + SIDECAR_TIMEOUT_MS;
      while (!(await readyOnce(this.socket))) {
        if (Date.now() > deadline) {
          throw new Error(`no sidecar answered INFO with a leader on ${this.socket}; does this ticketing build run the sidecar in \`dev --socket\`?\n${this.log()}`);
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    } catch (e) {
      await this.stop();
      throw e;
    }
    return this;
  }

  /**
   * Stop the process as Ctrl-C does and start it again on the same socket
   * with the same cluster state (--dir), as an operator restarting the
   * sidecar would; resolves once it is ready again.
   */
  async restart() {
    await this.halt();
    this.spawn();
    await this.start();
  }

  /** SIGINT, as Ctrl-C would; SIGKILL if it does not stop in time. */
  async halt() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill('SIGINT');
      const timer = setTimeout(() => this.proc.kill('SIGKILL'), 20_000);
      await this.exited;
      clearTimeout(timer);
    }
  }

  async stop() {
    await this.halt();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

/** @returns {Promise<DevCluster>} */
async function startDev() {
  return new DevCluster().start();
}

module.exports = { startDev, ticketingBinary, REPO_ROOT };
