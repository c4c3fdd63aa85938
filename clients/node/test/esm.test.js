'use strict';

// The package from an ES module: `import { Client, BusyError } from
// 'ticketing-client'` finds every name that require() gives (Node.js
// detects a CommonJS module's names statically; the errors were once
// spread from a variable, which it cannot see, and a named import of
// BusyError failed with a SyntaxError).

const assert = require('node:assert/strict');
const { test } = require('node:test');
const path = require('node:path');
const { pathToFileURL } = require('node:url');
const ticketing = require('..');

test('an ES module imports every export by name', async () => {
  const esm = await import(pathToFileURL(path.join(__dirname, '..', 'index.js')).href);
  for (const name of Object.keys(ticketing)) {
    assert.ok(name in esm, `import { ${name} } from 'ticketing-client' finds nothing`);
    assert.equal(esm[name], ticketing[name], name);
  }
  for (const name of ['Client', 'BusyError', 'TimeoutError', 'LockTimeoutError', 'IndeterminateError', 'ServerError', 'LockLostError', 'fence']) {
    assert.ok(name in esm, name);
  }
});
