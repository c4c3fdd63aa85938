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
const errors = require('./lib/errors');
const protocol = require('./lib/protocol');
const fence = require('./lib/fence');

module.exports = {
  Client,
  Lock,
  DEFAULT_REPLY_GRACE,
  ...errors,
  StaleTokenError: fence.StaleTokenError,
  fence,
  MIN_LEASE: protocol.MIN_LEASE,
  MAX_LEASE: protocol.MAX_LEASE,
  MAX_WAIT: protocol.MAX_WAIT,
  MAX_KEY_LEN: protocol.MAX_KEY_LEN,
  MAX_TOKEN: protocol.MAX_TOKEN,
  MAX_BLOCK_KEYS: protocol.MAX_BLOCK_KEYS,
  PROTOCOL_VERSION: protocol.PROTOCOL_VERSION,
  MARGIN_BASE_MS: protocol.MARGIN_BASE_MS,
  MARGIN_LEASE_FRACTION: protocol.MARGIN_LEASE_FRACTION,
};
