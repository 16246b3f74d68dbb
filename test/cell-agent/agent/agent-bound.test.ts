// The global bound on a running agent, over its gRPC socket: one bucket per quota key whatever
// domain, rule path or descriptor reaches it (tenant quotas, tier caps and domain caps); rule sets that one
// bucket per quota key cannot enforce are refused at load, naming the file and the rule; global
// buckets start empty when created (a new key long after start, a key re-created after eviction);
// hits saturate (a refusal, never an exception and a fail-open answer); the request bounds hold on
// gRPC and HTTP even with the overload guard on; a limit override in a domain without rules is "no
// limit" (envoyproxy/ratelimit).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import { join } from 'node:path';
import { parseAgentConfig } from '../../../cell-agent/agent-config.js';
import { startAgent } from '../../../cell-agent/agent-main.js';
import type { AgentHandle } from '../../../cell-agent/agent-main.js';
import { RULES_ERROR_CODES, RulesError } from '../../../cell-agent/rules/rules-errors.js';
import { RlsClient, d, grpcError, unixTarget } from '../../../testkit/rls-client.js';
import type { RequestIn } from '../../../testkit/rls-client.js';
import { captureLogger } from '../../../testkit/logs.js';
import { waitFor } from '../../../testkit/wait.js';
import { type TempDir, tempDir } from '../../../testkit/temp-dir.js';

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
  - key: plan
    rate_limit: {unit: hour, requests_per_unit: 1}
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
  fast: {rate: 100, burst: 50}
tenants:
  acme: gold
  newcomer: fast
  a1: fast
  a2: fast
  initech: capped
  globex: capped
`;
const RATE = 20;
const BURST = 10;

let dir: TempDir;
let agent: AgentHandle;
let client: RlsClient;
let startedAtMs: number;

before(async () => {
  dir = tempDir();
  const rules = join(dir.path, 'rules');
  mkdirSync(rules);
  writeFileSync(join(rules, 'api.yaml'), API);
  writeFileSync(join(rules, 'web.yaml'), WEB);
  startedAtMs = Date.now();
  agent = await startAgent(
    parseAgentConfig({
      cell: 'bound',
      rules,
      tenants: dir.file('tenants.yaml', TENANTS),
      staticShare: 1,
      rlsSocket: join(dir.path, 'rls.sock'),
      tableCapacity: 1000,
      lagThresholdMs: 0,
    }),
    captureLogger().logger,
  );
  client = new RlsClient(unixTarget(agent.endpoints.rlsUnix[0] ?? ''));
  await client.check({ domain: 'none', descriptors: [d(['k', 'v'])] }); // connected before any window opens
});

after(async () => {
  client.close();
  await agent.stop();
  dir.remove();
});

/** Sends every shape in turn for `ms`; returns how many were admitted and the bound rate·W + burst over that time. */
async function drive(
  shapes: readonly RequestIn[],
  ms: number,
): Promise<{ admitted: number; bound: number; sent: number }> {
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
  const { admitted, bound, sent } = await drive(shapes, 1200);
  assert.ok(
    admitted <= bound,
    `admitted ${admitted} for tenant/acme against a bound of ${bound} (rate·W + burst), ${sent} sent`,
  );
  assert.ok(admitted >= BURST, `the quota is used (${admitted} admitted)`);
  // Velocity is kept per quota key, never per rule path or domain.
  const keys = agent.velocity().map((v) => v.key);
  assert.ok(keys.includes('tenant/acme'), `velocity keys ${JSON.stringify(keys)}`);
  assert.ok(
    keys.every((k) => /^(tenant|tier|domain)\//.test(k)),
    `velocity keys ${JSON.stringify(keys)}`,
  );
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

void test('one bucket per domain cap: tenants, rule paths and descriptor shapes of one domain share it', async () => {
  // Tenants far below their own quotas; the domain cap (20/s, burst 10) is the level that binds.
  const capped = await startAgent(
    parseAgentConfig({
      cell: 'domain-cap',
      rules: join(dir.path, 'rules'),
      tenants: dir.file(
        'domain-cap.yaml',
        'domainCap: {rate: 20, burst: 10}\ntiers:\n  big: {rate: 1000, burst: 1000}\ntenants:\n  d1: big\n  d2: big\n',
      ),
      staticShare: 1,
      rlsSocket: join(dir.path, 'domain-cap.sock'),
      tableCapacity: 1000,
      lagThresholdMs: 0,
    }),
    captureLogger().logger,
  );
  const c = new RlsClient(unixTarget(capped.endpoints.rlsUnix[0] ?? ''));
  try {
    await c.check({ domain: 'none', descriptors: [d(['k', 'v'])] }); // connected before the window opens
    const shapes: RequestIn[] = [
      { domain: 'api', descriptors: [d(['tenant', 'd1'])] },
      { domain: 'api', descriptors: [d(['route', 'upload'], ['tenant', 'd2'])] },
      { domain: 'api', descriptors: [d(['tenant', 'd2']), d(['route', 'upload'], ['tenant', 'd1'])] },
    ];
    const startMs = Date.now();
    let admitted = 0;
    let sent = 0;
    while (Date.now() < startMs + 1200 || sent < 200) {
      const answers = await Promise.all(shapes.map((s) => c.check(s)));
      sent += answers.length;
      admitted += answers.filter((a) => a.overall_code === 'OK').length;
    }
    const bound = Math.floor((RATE * (Date.now() - startMs)) / 1000) + BURST;
    assert.ok(admitted <= bound, `admitted ${admitted} under the domain cap against a bound of ${bound}, ${sent} sent`);
    assert.ok(admitted >= BURST, `the cap is used (${admitted} admitted)`);
    const keys = capped.velocity().map((v) => v.key);
    assert.ok(keys.includes('domain/api'), `velocity keys ${JSON.stringify(keys)}`);
  } finally {
    c.close();
    await capped.stop();
  }
});

void test('a rule set one bucket per quota key cannot enforce is refused at start, naming the file and the rule', async () => {
  const bad = join(dir.path, 'bad');
  mkdirSync(bad);
  writeFileSync(join(bad, 'api.yaml'), API);
  writeFileSync(join(bad, 'web.yaml'), WEB.replace('global: true', 'global: true\n    shadow_mode: true'));
  const started = startAgent(
    parseAgentConfig({
      cell: 'bad',
      rules: bad,
      rlsSocket: join(dir.path, 'bad.sock'),
      tableCapacity: 100,
      lagThresholdMs: 0,
    }),
    captureLogger().logger,
  );
  await assert.rejects(
    started.then(async (a) => {
      await a.stop();
      throw new Error('the agent started with rules it cannot enforce');
    }),
    (error: unknown) => {
      assert.ok(error instanceof RulesError, String(error));
      assert.equal(error.code, RULES_ERROR_CODES.GLOBAL_SHADOW_MIXED);
      assert.equal(error.file, join(bad, 'web.yaml'));
      assert.match(
        error.message,
        /rule 'web\.customer' has global: true with shadow_mode true, but the global rule 'api\.tenant'/,
      );
      return true;
    },
  );
});

const remaining = (r: { statuses: { limit_remaining: number }[] }): number | undefined =>
  r.statuses[0]?.limit_remaining;

void test('a global bucket first created long after the agent started starts empty, not with a burst it never refilled', async () => {
  // tier fast: 100/s, burst 50 — a bucket refills completely in 0.5 s. Once the agent has run longer
  // than that, a key seen for the first time (a new tenant, or a grant that moved in) must not hold 50.
  await waitFor('the agent to have run 700 ms', () => (Date.now() - startedAtMs > 700 ? true : undefined));
  const first = await client.check({
    domain: 'api',
    descriptors: [{ ...d(['tenant', 'newcomer']), hits_addend: { value: 50 } }],
  });
  assert.equal(first.overall_code, 'OVER_LIMIT', 'a fresh global bucket is empty');
  // It refills at the slice's rate from its creation on.
  await waitFor('the new bucket to refill to 50', async () => {
    const r = await client.check({
      domain: 'api',
      descriptors: [{ ...d(['tenant', 'newcomer']), hits_addend: { value: 0 } }],
    });
    return remaining(r) === 50 ? true : undefined;
  });
});

void test('a global bucket evicted and re-created starts empty again', async () => {
  const small = await startAgent(
    parseAgentConfig({
      cell: 'evict',
      rules: join(dir.path, 'rules'),
      tenants: join(dir.path, 'tenants.yaml'),
      staticShare: 1,
      rlsSocket: join(dir.path, 'evict.sock'),
      tableCapacity: 1,
      lagThresholdMs: 0,
    }),
    captureLogger().logger,
  );
  const c = new RlsClient(unixTarget(small.endpoints.rlsUnix[0] ?? ''));
  try {
    const probe = async (tenant: string): Promise<number | undefined> =>
      remaining(
        await c.check({ domain: 'api', descriptors: [{ ...d(['tenant', tenant]), hits_addend: { value: 0 } }] }),
      );
    // a1's bucket fills up (50 tokens) and goes idle; a2 takes the table's only slot, evicting it.
    await waitFor('a1 to hold 50', async () => ((await probe('a1')) === 50 ? true : undefined));
    await waitFor('a2 to hold 50', async () => ((await probe('a2')) === 50 ? true : undefined));
    assert.match(await small.metricsText(), /cellquota_agent_bucket_evictions_total [1-9]/);
    // a1 comes back: a re-created global bucket holds nothing yet.
    const back = await c.check({
      domain: 'api',
      descriptors: [{ ...d(['tenant', 'a1']), hits_addend: { value: 50 } }],
    });
    assert.equal(back.overall_code, 'OVER_LIMIT');
  } finally {
    c.close();
    await small.stop();
  }
});

void test('hits saturate: summed hits_addend beyond 2^53 is a refusal, never an exception answered fail-open', async () => {
  const max = { value: Number.MAX_SAFE_INTEGER };
  const local = await client.check({
    domain: 'api',
    descriptors: [
      { ...d(['plan', 'p1']), hits_addend: max },
      { ...d(['plan', 'p1']), hits_addend: max },
    ],
  });
  assert.equal(local.overall_code, 'OVER_LIMIT', 'two descriptors of 2^53 − 1 against a 1/hour rule');
  const global = await client.check({
    domain: 'api',
    descriptors: [
      { ...d(['tenant', 'acme']), hits_addend: max },
      { ...d(['tenant', 'acme']), hits_addend: max },
    ],
  });
  assert.equal(global.overall_code, 'OVER_LIMIT', 'the same for a global quota');
  const uint64 = await client.check({
    domain: 'api',
    descriptors: [{ ...d(['plan', 'p2']), hits_addend: { value: '18446744073709551615' as unknown as number } }],
  });
  assert.equal(uint64.overall_code, 'OVER_LIMIT', 'hits_addend 2^64 − 1');
  assert.ok(!/x-ratelimit-fail-open/.test(JSON.stringify([local, global, uint64])), 'decided, not given fail-open');
  assert.equal(
    (await client.check({ domain: 'api', descriptors: [d(['plan', 'p1'])] })).overall_code,
    'OK',
    'nothing was consumed',
  );
  assert.doesNotMatch(await agent.metricsText(), /cellquota_agent_fail_open_total\{reason="error"\} [1-9]/);
});

void test('request bounds hold on gRPC and HTTP with the overload guard on (the default 10 ms)', async () => {
  const guarded = await startAgent(
    parseAgentConfig({
      cell: 'guarded',
      rules: join(dir.path, 'rules'),
      rlsSocket: join(dir.path, 'guarded.sock'),
      http: '127.0.0.1:0',
      tableCapacity: 100,
    }),
    captureLogger().logger,
  );
  const c = new RlsClient(unixTarget(guarded.endpoints.rlsUnix[0] ?? ''));
  try {
    const many = await grpcError(
      c.check({ domain: 'api', descriptors: Array.from({ length: 20_000 }, (_, i) => d(['plan', `p${i}`])) }),
    );
    assert.equal(many.code, grpc.status.INVALID_ARGUMENT);
    assert.equal(many.details, 'request has 20000 descriptors, more than the maximum of 64');
    const long = await grpcError(c.check({ domain: 'api', descriptors: [d(['plan', 'x'.repeat(200_000)])] }));
    assert.equal(long.code, grpc.status.INVALID_ARGUMENT);
    assert.equal(long.details, 'descriptor 0 entry 0: value is 200000 characters long, more than the maximum of 4096');
    const post = (body: unknown): Promise<Response> =>
      fetch(`${guarded.endpoints.http ?? ''}/v1/check`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
    const httpMany = await post({
      domain: 'api',
      descriptors: Array.from({ length: 65 }, () => ({ entries: [{ key: 'plan', value: 'p' }] })),
    });
    assert.equal(httpMany.status, 400);
    assert.match(await httpMany.text(), /request has 65 descriptors, more than the maximum of 64/);
    const httpLong = await post({
      domain: 'api',
      descriptors: [{ entries: [{ key: 'plan', value: 'x'.repeat(4097) }] }],
    });
    assert.equal(httpLong.status, 400);
    assert.match(await httpLong.text(), /value is 4097 characters long, more than the maximum of 4096/);
  } finally {
    c.close();
    await guarded.stop();
  }
});

void test('a limit override in a domain without rules answers no limit, as envoyproxy/ratelimit does', async () => {
  const override = { entries: [{ key: 'k', value: 'v' }], limit: { requests_per_unit: 1, unit: 'HOUR' } };
  for (let i = 0; i < 3; i++) {
    const r = await client.check({ domain: 'no-such-domain', descriptors: [override] });
    assert.equal(r.overall_code, 'OK');
    assert.equal(r.statuses[0]?.current_limit, null);
  }
  // In a domain with rules the override applies.
  const ruled = { ...override, entries: [{ key: 'unmatched', value: 'v' }] };
  const codes = [];
  for (let i = 0; i < 2; i++) codes.push((await client.check({ domain: 'api', descriptors: [ruled] })).overall_code);
  assert.deepEqual(codes, ['OK', 'OVER_LIMIT']);
});
