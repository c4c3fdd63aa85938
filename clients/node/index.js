'use strict';

/**
 * Node.js client of the Ticketing sidecar (no dependencies, Node.js 20+).
 *
 * @example
 * const { Client } = require('ticketing-client');
 * const client = new Client(); // $TICKETING_SOCKET or ./ticketing.sock
 * await client.withLock('seats/42', { lease: 30, wait: 5 }, async (token, lock) => {
 *   // critical section; pass `token` (a BigInt) to your fenced write, and
 *   // `lock.signal` (aborted when the lock is lost) to what can be aborted
 * });
 * await client.close();
 * @module ticketing-client
 */

const { Client, Lock, DEFAULT_REPLY_GRACE } = require('./lib/client');
const protocol = require('./lib/protocol');
const fence = require('./lib/fence');

const { StaleTokenError, RowCountError } = fence;
const {
  MIN_LEASE, MAX_LEASE, MAX_WAIT, MAX_SHORT_WAIT, MAX_KEY_LEN, MAX_TOKEN, MAX_BLOCK_KEYS, PROTOCOL_VERSION,
  MARGIN_BASE_MS, MARGIN_LEASE_FRACTION, MAX_PERMITS, fenceKey,
} = protocol;

// Only names and a spread of require() itself: the forms Node.js's static
// analysis of a CommonJS module recognises, so that an ES module's
// `import { BusyError } from 'ticketing-client'` finds every export (it
// stops at the first `name: a.b` and cannot see into a spread variable).
module.exports = {
  Client,
  Lock,
  DEFAULT_REPLY_GRACE,
  ...require('./lib/errors'),
  StaleTokenError,
  RowCountError,
  fence,
  MIN_LEASE,
  MAX_LEASE,
  MAX_WAIT,
  MAX_SHORT_WAIT,
  MAX_KEY_LEN,
  MAX_TOKEN,
  MAX_BLOCK_KEYS,
  PROTOCOL_VERSION,
  MARGIN_BASE_MS,
  MARGIN_LEASE_FRACTION,
  MAX_PERMITS,
  fenceKey,
};
