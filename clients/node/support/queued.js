'use strict';

/**
 * Test helper: start an acquire-like call with an `onQueued` hook and learn
 * when the sidecar reported it queued, so tests order waiters by the
 * cluster's queue rather than by sleeping.
 */

/**
 * @template T
 * @param {(onQueued: () => void) => Promise<T>} start starts the call,
 *   passing `onQueued` as the option of that name
 * @returns {{call: Promise<T>, queued: Promise<void>}} `call` is the call;
 *   `queued` resolves once the ACQUIRE is in its keys' queues and rejects
 *   if the call settled without that (granted at once, refused, or its wait
 *   ran out: the wait is the hang guard)
 */
function startQueued(start) {
  let onQueued;
  const hooked = new Promise((resolve) => { onQueued = resolve; });
  const call = start(() => onQueued(true));
  // The hook runs before the reply settles the call, so the race is decided
  // by the order of the lines, not by timing.
  const queued = Promise.race([hooked, call.then(() => false, () => false)]).then((wasQueued) => {
    if (!wasQueued) throw new Error('the request finished without being queued (no ! QUEUED before its reply)');
  });
  return { call, queued };
}

module.exports = { startQueued };
