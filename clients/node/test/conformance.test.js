'use strict';

// Every scenario of clients/conformance/scenarios.json against one real
// `ticketing dev` (which the scenarios with restart_sidecar restart: stop and
// start it again with the same socket and cluster state).

const { before, after, test } = require('node:test');
const { startDev } = require('../support/dev');
const { loadScenarios, runScenario } = require('../support/conformance');

let dev;
before(async () => { dev = await startDev(); });
after(async () => { if (dev) await dev.stop(); });

for (const [index, scenario] of loadScenarios().entries()) {
  test(`${scenario.name}: ${scenario.description ?? ''}`, () => runScenario(dev.socket, scenario, index, () => dev.restart()));
}
