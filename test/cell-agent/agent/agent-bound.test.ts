// The global bound on a running agent, over its gRPC socket: one bucket per quota key whatever
// domain, rule path or descriptor reaches it (tenant quotas and tier caps); rule sets that one
// bucket per quota key cannot enforce are refused at load, naming the file and the rule.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseAgentConfig } from '../../../cell-agent/agent-config.js';
import { startAgent } from '../../../cell-agent/agent-main.js';
import type { AgentHandle } from '../../../cell-agent/agent-main.js';
import { RULES_ERROR_CODES, RulesError } from '../../../cell-agent/rules/rules-errors.js';
import { RlsClient, captureLogger, d, tempDir, unixTarget } from './agent-helpers.js';
import type { RequestIn, TempDir } from './agent-helpers.js';

// One tenant reachable through two domains and two rule paths.
const API = `
domain: api
descriptors:
  - key: tenant
    global: true
  - key: route
    value: upload
    descriptors:
      - key: tenant
        global: true
`;
const WEB = `
domain: web
descriptors:
  - key: customer
    global: true
`;
// acme's quota: 20/s, burst 10. Tier "capped": every tenant 1000/s, all of them together 20/s burst 10.
const TENANTS = `
tiers:
  gold: {rate: 20, burst: 10}
  capped: {rate: 1000, burst: 1000, cap: {rate: 20, burst: 10}}
tenants:
  acme: gold
  initech: capped
  globex: capped
`;
const RATE = 20;
const BURST = 10;

let dir: TempDir;
let agent: AgentHandle;
let client: RlsClient;

before(async () => {
  dir = tempDir();
  const rules = join(dir.path, 'rules');
  mkdirSync(rules);
  writeFileSync(join(rules, 'api.yaml'), API);
  writeFileSync(join(rules, 'web.yaml'), WEB);
  agent = await startAgent(parseAgentConfig({
    cell: 'bound', rules, tenants: dir.file('tenants.yaml', TENANTS), staticShare: 1,
    rlsSocket: join(dir.path, 'rls.sock'), tableCapacity: 1000, lagThresholdMs: 0,
  }), captureLogger().logger);
  client = new RlsClient(unixTarget(agent.endpoints.rlsUnix[0] ?? ''));
  await client.check({ domain: 'none', descriptors: [d(['k', 'v'])] }); // connected before any window opens
});

after(async () => {
  client.close();
  await agent.stop();
  dir.remove();
});

/** Sends every shape in turn for `ms`; returns how many were admitted and the bound rate·W + burst over that time. */
async function drive(shapes: readonly RequestIn[], ms: number): Promise<{ admitted: number; bound: number; sent: number }> {
  const startMs = Date.now();
  const until = startMs + ms;
  let admitted = 0;
  let sent = 0;
  // At least 200 checks whatever the machine's load: enough to saturate a 20/s quota in any case.
  while (Date.now() < until || sent < 200) {
    const answers = await Promise.all(shapes.map((s) => client.check(s)));
    sent += answers.length;
    admitted += answers.filter((a) => a.overall_code === 'OK').length;
  }
  // A bucket holds at most the burst when the window opens and refills at the rate within it.
  return { admitted, sent, bound: Math.floor((RATE * (Date.now() - startMs)) / 1000) + BURST };
}

void test('one bucket per tenant quota: two domains, two rule paths and two descriptor shapes share it', async () => {
  const shapes: RequestIn[] = [
    { domain: 'api', descriptors: [d(['tenant', 'acme'])] },
    { domain: 'api', descriptors: [d(['route', 'upload'], ['tenant', 'acme'])] },
    { domain: 'web', descriptors: [d(['customer', 'acme'])] },
    { domain: 'api', descriptors: [d(['tenant', 'acme']), d(['route', 'upload'], ['tenant', 'acme'])] },
  ];
  const { admitted, bound } = await drive(shapes, 1200);
  assert.ok(admitted <= bound, `admitted ${admitted} for tenant/acme against a bound of ${bound} (rate·W + burst)`);
  assert.ok(admitted >= BURST, `the quota is used (${admitted} admitted)`);
  // Velocity is kept per quota key, never per rule path or domain.
  const keys = agent.velocity().map((v) => v.key);
  assert.ok(keys.includes('tenant/acme'), `velocity keys ${JSON.stringify(keys)}`);
  assert.ok(keys.every((k) => /^(tenant|tier|domain)\//.test(k)), `velocity keys ${JSON.stringify(keys)}`);
});

void test('one bucket per tier cap: tenants of one tier through two domains share the cap', async () => {
  const shapes: RequestIn[] = [
    { domain: 'api', descriptors: [d(['tenant', 'initech'])] },
    { domain: 'web', descriptors: [d(['customer', 'globex'])] },
    { domain: 'api', descriptors: [d(['route', 'upload'], ['tenant', 'globex'])] },
  ];
  const { admitted, bound } = await drive(shapes, 800);
  assert.ok(admitted <= bound, `admitted ${admitted} under the tier cap against a bound of ${bound}`);
  assert.ok(admitted >= BURST, `the cap is used (${admitted} admitted)`);
});

void test('a rule set one bucket per quota key cannot enforce is refused at start, naming the file and the rule', async () => {
  const bad = join(dir.path, 'bad');
  mkdirSync(bad);
  writeFileSync(join(bad, 'api.yaml'), API);
  writeFileSync(join(bad, 'web.yaml'), WEB.replace('global: true', 'global: true\n    shadow_mode: true'));
  const started = startAgent(parseAgentConfig({ cell: 'bad', rules: bad, rlsSocket: join(dir.path, 'bad.sock'), tableCapacity: 100, lagThresholdMs: 0 }), captureLogger().logger);
  await assert.rejects(
    started.then(async (a) => {
      await a.stop();
      throw new Error('the agent started with rules it cannot enforce');
    }),
    (error: unknown) => {
      assert.ok(error instanceof RulesError, String(error));
      assert.equal(error.code, RULES_ERROR_CODES.GLOBAL_SHADOW_MIXED);
      assert.equal(error.file, join(bad, 'web.yaml'));
      assert.match(error.message, /rule 'web\.customer' has global: true with shadow_mode true, but the global rule 'api\.tenant'/);
      return true;
    },
  );
});
