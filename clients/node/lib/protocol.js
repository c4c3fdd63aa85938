'use strict';

/**
 * The sidecar's line protocol: argument checks, request lines and reply
 * parsing. No I/O. See unixapi/PROTOCOL.md in the Ticketing repository.
 * @module
 */

const {
  BusyError, LockTimeoutError, IndeterminateError, ServerError, ProtocolError, NotSupportedError, SERVER_ERRORS,
} = require('./errors');

const MIN_LEASE = 1;
const MAX_LEASE = 250;
/** The longest wait in seconds: an hour, from a sidecar of protocol version 6. */
const MAX_WAIT = 3600;
/** The longest wait a sidecar older than protocol version 6 takes, seconds. */
const MAX_SHORT_WAIT = 300;
const MAX_KEY_LEN = 255;
const MAX_TOKEN = (1n << 64n) - 1n;
const RELEASE_DEADLINE = 5;
/**
 * The version of unixapi/PROTOCOL.md this client speaks (2: seat blocks,
 * HELLO; 3: EXTEND and the `! LOST` event lines; 4: the `! QUEUED` event
 * lines; 5: owner labels; 6: waits up to an hour; 7: the `! POSITION` event
 * lines; 8: semaphores, `PERMIT` and `PERMITS`; 9: the `! REVOKED` event
 * line, who revoked a lock and why).
 */
const PROTOCOL_VERSION = 9;
/** The protocol version of `PERMIT` and `PERMITS` (semaphores). */
const PERMIT_VERSION = 8;
/** The most permits of one semaphore key (`setPermits`). */
const MAX_PERMITS = 100000;
/** The longest owner label (`label=`, version 5) in bytes. */
const MAX_LABEL_LEN = 64;
/** The longest `<by>` and `<why>` of a `! REVOKED` line (version 9), bytes. */
const MAX_REVOKED_BY = 128;
const MAX_REVOKE_REASON = 128;
/**
 * The margin by which a lock's local validity deadline precedes the end of
 * its lease (clients/README.md): 250 ms + 1 % of the lease, for the drift
 * between this host's clock and the leader's over the lease, and for the
 * time between the leader's commit of the expiry and the sidecar's notice.
 */
const MARGIN_BASE_MS = 250;
const MARGIN_LEASE_FRACTION = 0.01;
/** The most keys of one block acquire (distinct keys). */
const MAX_BLOCK_KEYS = 16;
const SOCKET_ENV = 'TICKETING_SOCKET';
const DEFAULT_SOCKET = './ticketing.sock';

/**
 * @param {string} [path]
 * @returns {string} path, else $TICKETING_SOCKET, else ./ticketing.sock
 */
function defaultPath(path) {
  return path || process.env[SOCKET_ENV] || DEFAULT_SOCKET;
}

/** @param {unknown} key @returns {string} */
function checkKey(key) {
  if (typeof key !== 'string') throw new TypeError(`key must be a string, not ${typeof key}`);
  if (key.length < 1 || key.length > MAX_KEY_LEN) {
    throw new RangeError(`key must be 1..${MAX_KEY_LEN} characters long, got ${key.length}`);
  }
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) {
      throw new RangeError(`key may contain only printable ASCII without spaces (0x21..0x7E); character ${i} is ${JSON.stringify(key[i])}`);
    }
  }
  return key;
}

/** @param {unknown} lease whole seconds 1..250 @returns {number} */
function checkLease(lease) {
  if (typeof lease !== 'number') throw new TypeError(`lease must be a number of seconds, not ${typeof lease}`);
  if (!Number.isInteger(lease)) throw new RangeError(`lease must be whole seconds, got ${lease}`);
  if (lease < MIN_LEASE || lease > MAX_LEASE) {
    throw new RangeError(`lease must be ${MIN_LEASE}..${MAX_LEASE} seconds, got ${lease}`);
  }
  return lease;
}

/**
 * @param {unknown} wait seconds 0..3600, at most millisecond precision
 * @returns {number} the wait in whole milliseconds
 */
function waitMillis(wait) {
  if (typeof wait !== 'number') throw new TypeError(`wait must be a number of seconds, not ${typeof wait}`);
  if (!Number.isFinite(wait)) throw new RangeError(`wait must be finite, got ${wait}`);
  const ms = Math.round(wait * 1000);
  if (Math.abs(wait * 1000 - ms) > 1e-6) {
    throw new RangeError(`wait has at most millisecond precision, got ${wait}`);
  }
  if (ms < 0 || ms > MAX_WAIT * 1000) throw new RangeError(`wait must be 0..${MAX_WAIT} seconds, got ${wait}`);
  return ms;
}

/** Render milliseconds as the protocol's seconds: `5`, `0.25`, `1.005`. */
function formatWait(ms) {
  const whole = Math.floor(ms / 1000);
  const frac = ms % 1000;
  return frac === 0 ? String(whole) : `${whole}.${String(frac).padStart(3, '0').replace(/0+$/, '')}`;
}

/**
 * A fencing token as a BigInt. Accepts a bigint, a decimal string, or a
 * safe-integer number.
 * @param {unknown} token
 * @returns {bigint}
 */
function toToken(token) {
  let t;
  if (typeof token === 'bigint') {
    t = token;
  } else if (typeof token === 'string') {
    if (!/^[0-9]{1,20}$/.test(token)) throw new RangeError(`token must be a decimal number, got ${JSON.stringify(token)}`);
    t = BigInt(token);
  } else if (typeof token === 'number') {
    if (!Number.isSafeInteger(token)) {
      throw new RangeError(`token ${token} is not a safe integer; pass tokens as BigInt or string`);
    }
    t = BigInt(token);
  } else {
    throw new TypeError(`token must be a bigint, a decimal string or a number, not ${typeof token}`);
  }
  if (t < 1n || t > MAX_TOKEN) throw new RangeError(`token must be 1..2^64-1, got ${t}`);
  return t;
}

/**
 * @param {unknown} hook an acquire's `onQueued` option
 * @returns {Function|null} the function, or null for none
 */
function checkOnQueued(hook) {
  if (hook === undefined || hook === null) return null;
  if (typeof hook !== 'function') throw new TypeError(`onQueued must be a function, not ${typeof hook}`);
  return hook;
}

/**
 * @param {unknown} hook an acquire's `onPosition` option
 * @returns {Function|null} the function, or null for none
 */
function checkOnPosition(hook) {
  if (hook === undefined || hook === null) return null;
  if (typeof hook !== 'function') throw new TypeError(`onPosition must be a function, not ${typeof hook}`);
  return hook;
}

/** @param {unknown} line @returns {string} */
function checkRaw(line) {
  if (typeof line !== 'string') throw new TypeError(`line must be a string, not ${typeof line}`);
  if (line === '' || line.includes('\n')) throw new RangeError('a raw line must be non-empty and must not contain a newline');
  return line;
}

/**
 * Check an owner label: null/undefined/'' (none), else 1..64 characters of
 * visible ASCII (0x21..0x7E), not `-`.
 * @param {unknown} label
 * @returns {string} '' for none
 */
function checkLabel(label) {
  if (label === null || label === undefined || label === '') return '';
  if (typeof label !== 'string') throw new TypeError(`label must be a string, not ${typeof label}`);
  if (label.length > MAX_LABEL_LEN || label === '-' || !/^[\x21-\x7e]+$/.test(label)) {
    throw new RangeError(`label ${JSON.stringify(label)}: 1..${MAX_LABEL_LEN} characters of visible ASCII (0x21..0x7E), not "-"`);
  }
  return label;
}

/** The ` label=<label>` field of an ACQUIRE ('' for none). */
function labelField(label) {
  const l = checkLabel(label);
  return l === '' ? '' : ` label=${l}`;
}

/**
 * @returns {{line: string, waitSeconds: number}}
 */
function acquireLine(key, lease, wait) {
  checkKey(key);
  checkLease(lease);
  const ms = waitMillis(wait);
  return { line: `ACQUIRE ${key} ${lease} ${formatWait(ms)}`, waitSeconds: ms / 1000 };
}

/**
 * Check the keys of a block: an array of 1..16 distinct valid keys.
 * @param {unknown} keys
 * @returns {string[]} a copy
 */
function checkKeys(keys) {
  if (!Array.isArray(keys)) throw new TypeError(`keys must be an array of strings, not ${typeof keys}`);
  if (keys.length < 1 || keys.length > MAX_BLOCK_KEYS) {
    throw new RangeError(`a block has 1..${MAX_BLOCK_KEYS} keys, got ${keys.length}`);
  }
  const seen = new Set();
  for (const k of keys) {
    checkKey(k);
    if (seen.has(k)) throw new RangeError(`key ${JSON.stringify(k)} named twice (the keys of a block are distinct)`);
    seen.add(k);
  }
  return [...keys];
}

/**
 * The ACQUIRE line of a block (one key: the plain ACQUIRE).
 * @returns {{line: string, waitSeconds: number, keys: string[]}}
 */
function acquireBlockLine(keys, lease, wait) {
  const ks = checkKeys(keys);
  checkLease(lease);
  const ms = waitMillis(wait);
  return { line: `ACQUIRE ${ks.join(' ')} ${lease} ${formatWait(ms)}`, waitSeconds: ms / 1000, keys: ks };
}

/** The HELLO request of this client's version, without options. */
function helloLine() {
  return `HELLO ${PROTOCOL_VERSION}`;
}

/** The HELLO every connection sends first: this version, events on. */
function helloEventsLine() {
  return `HELLO ${PROTOCOL_VERSION} events`;
}

/**
 * The reply to `HELLO 9 events`: `HELLO <v> events` → events on;
 * `HELLO <v>` → the version both speak has no events; `ERR bad_request` →
 * a version-2 sidecar (it knows HELLO but not the option); `ERR
 * unknown_verb` → version 1. Anything else throws its error.
 * @returns {{version: number, events: boolean}}
 */
function parseHelloEvents(reply) {
  const m = /^HELLO ([0-9]{1,5})( events)?$/.exec(reply);
  if (m) {
    const v = Number(m[1]);
    if (v >= 1 && v <= PROTOCOL_VERSION && (!m[2] || v >= 3)) return { version: v, events: Boolean(m[2]) };
    throw new ProtocolError(`bad HELLO reply ${JSON.stringify(reply)}`);
  }
  const err = errorFrom(reply);
  if (err instanceof ServerError && err.code === 'unknown_verb') return { version: 1, events: false };
  if (err instanceof ServerError && err.code === 'bad_request') return { version: 2, events: false };
  throw err;
}

/**
 * `HELLO <v>` → v; `ERR unknown_verb` (a version-1 sidecar) → 1; otherwise
 * throws the matching error.
 * @returns {number}
 */
function parseHello(reply) {
  if (reply.startsWith('HELLO ')) {
    const text = reply.slice(6);
    if (/^[0-9]{1,5}$/.test(text) && Number(text) >= 1 && Number(text) <= PROTOCOL_VERSION) return Number(text);
    throw new ProtocolError(`bad HELLO reply ${JSON.stringify(reply)}`);
  }
  const err = errorFrom(reply);
  if (err instanceof ServerError && err.code === 'unknown_verb') return 1;
  throw err;
}

function releaseLine(key, token) {
  checkKey(key);
  return `RELEASE ${key} ${toToken(token)}`;
}

/** `EXTEND <key> <token> <lease>` (version 3), arguments checked. */
function extendLine(key, token, lease) {
  checkKey(key);
  const t = toToken(token);
  checkLease(lease);
  return `EXTEND ${key} ${t} ${lease}`;
}

/**
 * The margin of a lease in milliseconds: 250 ms + 1 % of the lease.
 * @param {number} lease seconds
 */
function marginMillis(lease) {
  return MARGIN_BASE_MS + lease * 1000 * MARGIN_LEASE_FRACTION;
}

/**
 * Whether a line the sidecar sent is an event line rather than a reply.
 * Event lines start with `! `; no reply ever starts with `!`, so a line
 * starting with `!` that is not a well-formed event is a malformed event,
 * ignored, and never counted as a reply.
 * @param {string} line
 */
function isEventLine(line) {
  return line.charCodeAt(0) === 0x21; // '!'
}

/**
 * @typedef {object} LostEvent
 * @property {'LOST'} name
 * @property {bigint} token
 * @property {string} reason `expired`, `moved`, `compensated`, `revoked` or
 *   one a newer sidecar added (still a loss)
 * @property {string[]} keys
 */

/**
 * `! REVOKED <token> <by>[ <why>]` (version 9): an operator revoked the lock
 * of `token`; the `! LOST <token> revoked ...` line that follows is the loss
 * itself, and takes `by` and `why` along.
 * @typedef {object} RevokedEvent
 * @property {'REVOKED'} name
 * @property {bigint} token
 * @property {string} by who revoked it (1..128 visible ASCII characters)
 * @property {string|null} why why (1..128 printable ASCII characters, spaces
 *   inside), null when no reason was given
 */

/**
 * @typedef {object} QueuedEvent
 * @property {'QUEUED'} name
 * @property {number} n the position of the ACQUIRE among all request lines
 *   written on the connection (1-based, HELLO included): the position its
 *   reply is matched by
 * @property {string[]} keys the ACQUIRE's keys in the order asked
 */

/**
 * @typedef {object} PositionEvent
 * @property {'POSITION'} name
 * @property {number} n the ACQUIRE's request line number, as for QUEUED
 * @property {{key: string, position: number, estimate: number|null}} report
 *   its place in key's line (1 = next) and the estimated wait left in whole
 *   seconds (null: the sidecar sent `-`, no estimate yet)
 */

/** @param {string[]} keys @returns {boolean} every one a well-formed key */
function wellFormedKeys(keys) {
  return keys.every((k) => k.length >= 1 && k.length <= MAX_KEY_LEN && /^[\x21-\x7e]+$/.test(k));
}

/**
 * `! REVOKED <token> <by>[ <why>]`: `why` is the rest of the line and may
 * hold spaces (never at its start or end; omitted with its space when
 * empty). Null when malformed.
 * @param {string} line
 * @returns {RevokedEvent|null}
 */
function parseRevoked(line) {
  const m = /^! REVOKED ([0-9]{1,20}) ([\x21-\x7e]+)(?: ([\x20-\x7e]+))?$/.exec(line);
  if (!m) return null;
  const token = BigInt(m[1]);
  if (token < 1n || token > MAX_TOKEN) return null;
  const [, , by, why = null] = m;
  if (by.length > MAX_REVOKED_BY) return null;
  if (why !== null && (why.length > MAX_REVOKE_REASON || why.startsWith(' ') || why.endsWith(' '))) return null;
  return { name: 'REVOKED', token, by, why };
}

/**
 * Parse an event line. Returns null for an event this client does not know
 * (later versions may add some) and for a malformed line: both are ignored.
 * @param {string} line
 * @returns {LostEvent|QueuedEvent|PositionEvent|RevokedEvent|null}
 */
function parseEvent(line, labelled = false) {
  if (!line.startsWith('! ')) return null;
  if (line.startsWith('! REVOKED ')) return parseRevoked(line);
  const words = line.slice(2).split(' ');
  if (labelled && words[0] === 'LOST') {
    // Version 5: the lock's label ('-': none) before its keys.
    if (words.length < 5 || words[3] === '') return null;
    words.splice(3, 1);
  }
  switch (words[0]) {
    case 'LOST': {
      if (words.length < 4) return null;
      const [, tokenText, reason, ...keys] = words;
      if (!/^[0-9]{1,20}$/.test(tokenText)) return null;
      const token = BigInt(tokenText);
      if (token < 1n || token > MAX_TOKEN) return null;
      if (!/^[\x21-\x7e]+$/.test(reason)) return null;
      if (!wellFormedKeys(keys)) return null;
      return { name: 'LOST', token, reason, keys };
    }
    case 'QUEUED': {
      if (words.length < 3) return null;
      const [, nText, ...keys] = words;
      // Decimal digits only; a position beyond 2^53 is no request of ours.
      if (!/^[0-9]{1,16}$/.test(nText)) return null;
      const n = Number(nText);
      if (n < 1 || !Number.isSafeInteger(n)) return null;
      if (!wellFormedKeys(keys)) return null;
      return { name: 'QUEUED', n, keys };
    }
    case 'POSITION': {
      // ! POSITION <n> <position> <estimate-seconds|-> <key>
      if (words.length !== 5) return null;
      const [, nText, posText, estText, key] = words;
      // Decimal digits only, within what a number holds exactly.
      const dec = (t) => (/^[0-9]{1,16}$/.test(t) && Number.isSafeInteger(Number(t)) ? Number(t) : null);
      const n = dec(nText);
      const position = dec(posText);
      const estimate = estText === '-' ? null : dec(estText);
      if (n === null || n < 1 || position === null || position < 1) return null;
      if (estimate === null && estText !== '-') return null;
      if (!wellFormedKeys([key])) return null;
      return { name: 'POSITION', n, report: { key, position, estimate } };
    }
    default:
      return null;
  }
}

/**
 * Splits what the sidecar sends into lines and routes them: event lines to
 * `onEvent`, every other line to `onReply` (replies, matched to requests by
 * position). A `\r` before the `\n` is dropped; bytes after the last `\n`
 * wait for the rest of their line.
 */
class LineReader {
  /**
   * @param {(line: string) => boolean|void} onReply return false to stop
   *   reading (the connection is being torn down)
   * @param {(line: string) => void} onEvent
   */
  constructor(onReply, onEvent) {
    this.onReply = onReply;
    this.onEvent = onEvent;
    this.partial = '';
  }

  /** @param {string} chunk */
  push(chunk) {
    let data = this.partial + chunk;
    let nl;
    let start = 0;
    while ((nl = data.indexOf('\n', start)) >= 0) {
      let line = data.slice(start, nl);
      start = nl + 1;
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (isEventLine(line)) {
        this.onEvent(line);
      } else if (this.onReply(line) === false) {
        this.partial = '';
        return;
      }
    }
    data = data.slice(start);
    this.partial = data;
  }
}

/** The error a non-success reply line stands for. */
function errorFrom(reply) {
  if (reply === 'BUSY') return new BusyError();
  if (reply === 'TIMEOUT') return new LockTimeoutError();
  if (reply === 'INDETERMINATE') return new IndeterminateError();
  if (reply === 'ERR' || reply.startsWith('ERR ')) {
    const sp = reply.indexOf(' ', 4);
    const code = sp < 0 ? reply.slice(4) : reply.slice(4, sp);
    const Err = SERVER_ERRORS[code] || ServerError;
    return new Err(code || 'unknown', sp < 0 ? '' : reply.slice(sp + 1));
  }
  return new ProtocolError(`unexpected reply ${JSON.stringify(reply)}`);
}

/** `OK <token>` → bigint token; otherwise throws the matching error. */
function parseAcquire(reply) {
  if (reply.startsWith('OK ')) {
    const text = reply.slice(3);
    if (/^[0-9]{1,20}$/.test(text)) {
      const t = BigInt(text);
      if (t >= 1n && t <= MAX_TOKEN) return t;
    }
    throw new ProtocolError(`bad token in reply ${JSON.stringify(reply)}`);
  }
  throw errorFrom(reply);
}

/**
 * The fenced resource of a permit: `'<key> <slot>'`, the key and the slot
 * joined by a space (`'checkout 0'`; one fencing domain per slot). A key
 * is 1..255 bytes of 0x21..0x7E and never holds a space, so no lock key
 * names a slot's fencing domain (with `#`, the lock `checkout#0` and slot
 * 0 of the semaphore `checkout` shared one high-water mark).
 */
function fenceKey(key, slot) {
  return `${key} ${slot}`;
}

/** Check the arguments; the PERMIT line (without a label) and the wait in seconds. */
function permitLine(key, lease, wait) {
  const { line, waitSeconds } = acquireLine(key, lease, wait);
  return { line: 'PERMIT' + line.slice('ACQUIRE'.length), waitSeconds };
}

/**
 * A PERMIT or PERMITS refusal; `unknown_verb` (a sidecar that does not know
 * the verb after all) is NotSupportedError.
 */
function permitError(reply) {
  const err = errorFrom(reply);
  if (err instanceof ServerError && err.code === 'unknown_verb') {
    return new NotSupportedError(`the sidecar does not know semaphores: ${err.message}`);
  }
  return err;
}

/** `OK <token> <slot>` → {token (bigint), slot (number)}; otherwise throws the matching error. */
function parsePermit(reply) {
  if (reply.startsWith('OK ')) {
    const m = /^OK ([0-9]{1,20}) ([0-9]{1,6})$/.exec(reply);
    if (m) {
      const token = BigInt(m[1]);
      const slot = Number(m[2]);
      if (token >= 1n && token <= MAX_TOKEN && slot < MAX_PERMITS) return { token, slot };
    }
    throw new ProtocolError(`bad permit grant ${JSON.stringify(reply)}`);
  }
  throw permitError(reply);
}

/** Check the arguments; the PERMITS line. */
function permitsLine(key, n) {
  checkKey(key);
  if (typeof n !== 'number' || !Number.isInteger(n)) throw new TypeError(`permits must be an integer, not ${typeof n === 'number' ? n : typeof n}`);
  if (n < 0 || n > MAX_PERMITS) throw new RangeError(`permits ${n}: 0..${MAX_PERMITS}`);
  return `PERMITS ${key} ${n}`;
}

function parsePermits(reply) {
  if (reply !== 'OK') throw permitError(reply);
}

function parseRelease(reply) {
  if (reply !== 'OK') throw errorFrom(reply);
}

function parsePing(reply) {
  if (reply !== 'PONG') throw errorFrom(reply);
}

/**
 * One entry of INFO's `members` field.
 * @typedef {object} Member
 * @property {string} id server id, NAME/INCARNATION
 * @property {string} role voter or learner
 * @property {string|null} addr its client address, null while the leader has not recorded it
 */

/**
 * The sidecar's view of the cluster (unixapi/PROTOCOL.md, INFO). A field an
 * older sidecar does not send is null; `-` (none known) is null too.
 * @typedef {object} Info
 * @property {string} cluster cluster id
 * @property {string|null} leader address of the known leader, or null
 * @property {number} connected cluster addresses with a live connection
 * @property {number} total configured cluster addresses
 * @property {string|null} domain the cluster's fencing domain, the name of
 *   the token sequence (fence high-water marks are keyed by it); null until
 *   a node has named it
 * @property {Member[]|null} members the Raft configuration as the leader last reported it
 * @property {number|null} protocol the protocol version the sidecar speaks
 * @property {string|null} sessions the sidecar's --sessions setting
 * @property {string|null} session the cluster session's id (hex)
 * @property {string|null} sessionState the cluster session's state
 * @property {number|null} sessionTimeoutMs
 * @property {number|null} sessionResumes
 * @property {number|null} sessionOpens
 * @property {number|null} sessionHeld
 * @property {string|null} sessionLastResume as sent (`outcomes:<n>,queued:<n>,...`)
 * @property {Record<string,string>} fields every `name=value` field of the reply
 */

const dash = (v) => (v === undefined || v === '' || v === '-' ? null : v);

/** @returns {Info} */
function parseInfo(reply) {
  const words = reply.split(' ');
  if (words[0] !== 'INFO') throw errorFrom(reply);
  /** @type {Record<string,string>} */
  const fields = {};
  for (const w of words.slice(1)) {
    if (!w) continue;
    const eq = w.indexOf('=');
    if (eq < 0) throw new ProtocolError(`bad field ${JSON.stringify(w)} in reply ${JSON.stringify(reply)}`);
    fields[w.slice(0, eq)] = w.slice(eq + 1);
  }
  const bad = () => new ProtocolError(`bad INFO reply ${JSON.stringify(reply)}`);
  const m = /^([0-9]+)\/([0-9]+)$/.exec(fields.connected ?? '0/0');
  if (!m) throw bad();
  const count = (name) => {
    const v = fields[name];
    if (v === undefined) return null;
    if (!/^[0-9]+$/.test(v)) throw bad();
    return Number(v);
  };
  /** @type {Member[]|null} */
  let members = null;
  if (dash(fields.members) !== null) {
    members = fields.members.split(',').map((entry) => {
      // <id>:<role>@<addr>: split at the first '@', then at the last ':' before it.
      const at = entry.indexOf('@');
      const left = at < 0 ? '' : entry.slice(0, at);
      const colon = left.lastIndexOf(':');
      if (at < 0 || colon < 1) throw bad();
      return { id: left.slice(0, colon), role: left.slice(colon + 1), addr: dash(entry.slice(at + 1)) };
    });
  }
  return {
    cluster: fields.cluster ?? '',
    leader: dash(fields.leader),
    connected: Number(m[1]),
    total: Number(m[2]),
    domain: dash(fields.domain),
    members,
    protocol: count('protocol'),
    sessions: fields.sessions ?? null,
    session: dash(fields.session),
    sessionState: dash(fields.session_state),
    sessionTimeoutMs: count('session_timeout_ms'),
    sessionResumes: count('session_resumes'),
    sessionOpens: count('session_opens'),
    sessionHeld: count('session_held'),
    sessionLastResume: fields.session_last_resume ?? null,
    fields,
  };
}

/**
 * `HELD <n> key:token ...` → [{key, token}] in reply order. Keys may contain
 * `:` (the token follows the last one); a key may appear twice if the
 * connection re-acquired it after a lease ran out.
 * @returns {{key: string, token: bigint}[]}
 */
function parseHeld(reply) {
  return parseHeldLocks(reply).map(({ key, token }) => ({ key, token }));
}

/**
 * `HELD <n> key:token ...`, or (version 5) `HELD <n> key:token label ...`
 * with `-` for no label, as `{key, token, label}` in reply order (label
 * null for none, and always null before version 5). The two forms cannot
 * be confused: version 4 lists n words after the count, version 5 2n.
 * @returns {{key: string, token: bigint, label: string|null}[]}
 */
function parseHeldLocks(reply) {
  const words = reply.split(' ');
  if (words[0] !== 'HELD') throw errorFrom(reply);
  const bad = () => new ProtocolError(`bad HELD reply ${JSON.stringify(reply)}`);
  if (!/^[0-9]+$/.test(words[1] ?? '')) throw bad();
  const held = [];
  let entries = words.slice(2);
  let labels = null;
  const n = Number(words[1]);
  // Version 5: each lock is key:token and then its label ('-': none).
  if (n > 0 && entries.length === 2 * n) {
    labels = entries.filter((_, i) => i % 2 === 1).map((l) => (l === '-' ? null : l));
    if (labels.includes('')) throw bad();
    entries = entries.filter((_, i) => i % 2 === 0);
  }
  for (const w of entries) {
    if (!w) continue;
    const colon = w.lastIndexOf(':');
    const token = w.slice(colon + 1);
    if (colon < 1 || !/^[0-9]+$/.test(token)) throw bad();
    held.push({ key: w.slice(0, colon), token: BigInt(token), label: labels ? labels[held.length] : null });
  }
  if (held.length !== n) throw bad();
  return held;
}

module.exports = {
  MIN_LEASE, MAX_LEASE, MAX_WAIT, MAX_SHORT_WAIT, MAX_KEY_LEN, MAX_TOKEN, RELEASE_DEADLINE, SOCKET_ENV, DEFAULT_SOCKET,
  PROTOCOL_VERSION, MAX_BLOCK_KEYS, MARGIN_BASE_MS, MARGIN_LEASE_FRACTION, PERMIT_VERSION, MAX_PERMITS,
  fenceKey, permitLine, parsePermit, permitsLine, parsePermits,
  defaultPath, checkKey, checkKeys, checkLease, waitMillis, formatWait, toToken, checkRaw, checkOnQueued, checkOnPosition,
  MAX_LABEL_LEN, checkLabel, labelField, MAX_REVOKED_BY, MAX_REVOKE_REASON,
  acquireLine, acquireBlockLine, helloLine, helloEventsLine, parseHello, parseHelloEvents, releaseLine,
  extendLine, marginMillis, isEventLine, parseEvent, LineReader,
  errorFrom, parseAcquire, parseRelease, parsePing, parseInfo, parseHeld, parseHeldLocks,
};
