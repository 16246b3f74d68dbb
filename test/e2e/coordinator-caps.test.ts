// Issue 12, caps through the admin API only: three coordinators and one agent started with
// --coordinators and rules only (no tenants file). A domain cap and a tier cap created with the admin
// API (and `cellquota ctl`) hold two tenants of a tier together to the cap's rate·(W + u) + burst in
// every window, where each tenant alone would be admitted far more; deleted, the cap is gone and the
// tenants are admitted at their own quota again. Bad input is a 400 (a window no agent can represent
// names the limit) and changes nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { CoordinatorCluster } from '../../testkit/coordinator-cluster.js';
import { AgentProcess } from '../../testkit/agent-process.js';
import { sleep, waitFor } from '../../testkit/wait.js';
import { worstWindow, type AdmittedCheck } from '../../testkit/bound-window.js';

const IDS = ['n1', 'n2', 'n3'];
const cli = resolve(import.meta.dirname, '../../cli/main.ts');
/** Each tenant's own quota: far above what the load below offers, so only a cap can refuse. */
const TENANT_RATE = 1000;
const CAP = { rate: 20, burst: 10 };
const TENANTS = ['t1', 't2'];

function ctl(admin: string, args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, ['--import', 'tsx', cli, 'ctl', '--admin', admin, ...args], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

async function check(agent: AgentProcess, tenant: string): Promise<{ ok: boolean; degraded: boolean }> {
  const r = await fetch(`${agent.url}/v1/check`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ domain: 'api', descriptors: [{ entries: [{ key: 'tenant', value: tenant }] }] }),
    signal: AbortSignal.timeout(5000),
  });
  await r.arrayBuffer();
  return { ok: r.status === 200, degraded: r.headers.get('x-ratelimit-degraded') === 'true' };
}

/** How many of `n` checks sent at once for each tenant are admitted. */
async function burstAdmitted(agent: AgentProcess, n: number): Promise<number> {
  const all = await Promise.all(TENANTS.flatMap((t) => Array.from({ length: n }, () => check(agent, t))));
  return all.filter((r) => r.ok).length;
}

/** Both tenants, ~50 checks a second each for `ms`: every admitted check, and how many were sent. */
async function drive(agent: AgentProcess, ms: number): Promise<{ admitted: AdmittedCheck[]; sent: number }> {
  const admitted: AdmittedCheck[] = [];
  let sent = 0;
  const t0 = performance.now();
  await Promise.all(
    TENANTS.map(async (t) => {
      while (performance.now() - t0 < ms) {
        const one = (async () => {
          const sentMs = performance.now();
          sent++;
          if ((await check(agent, t)).ok) admitted.push({ sentMs, answeredMs: performance.now() });
        })();
        await Promise.all([one, sleep(20)]);
      }
    }),
  );
  return { admitted, sent };
}

/** Asserts the cap's bound over windows of 1..3 s; returns a description for the diagnostics. */
function assertCapHolds(what: string, run: { admitted: AdmittedCheck[]; sent: number }): string {
  const windows = [1, 2, 3].map((s) => worstWindow(run.admitted, s, CAP.rate, CAP.burst));
  const context = `${what}: ${run.admitted.length} admitted of ${run.sent} sent; worst windows ${windows
    .map((w) => `${w.seconds} s: ${w.admitted} against ${w.bound.toFixed(1)}`)
    .join(', ')}`;
  assert.ok(run.admitted.length > 0, `the cap admits something (${context})`);
  // Each tenant alone (quota 1000/s) would be admitted all it sent: over twice the cap's share.
  assert.ok(run.sent > 2 * (CAP.rate * 4 + CAP.burst), `the load is well above the cap (${context})`);
  for (const w of windows)
    assert.ok(
      w.admitted <= w.bound,
      `${w.admitted} admitted in the worst ${w.seconds} s window against the cap's rate·(W + u) + burst = ${w.bound.toFixed(1)} (${context})`,
    );
  return context;
}

void test('caps from the admin API alone: a domain cap and a tier cap hold two tenants together on an agent with no tenants file; deleted, they are gone; bad input changes nothing', async (t) => {
  const c = await CoordinatorCluster.create(IDS, ['--floor-cells', '1']);
  let agent: AgentProcess | null = null;
  try {
    const rules = join(c.root, 'rules.yaml');
    writeFileSync(rules, 'domain: api\ndescriptors:\n  - key: tenant\n    global: true\n');
    c.startAll();
    const leader = await c.waitForLeader(60_000);
    const admin = IDS.map((id) => c.adminUrl(id)).join(',');
    assert.equal((await c.write('PUT', '/v1/tiers/big', { rate: TENANT_RATE, burst: TENANT_RATE })).status, 200);
    for (const id of TENANTS) assert.equal((await c.write('PUT', `/v1/tenants/${id}`, { tier: 'big' })).status, 200);

    // The domain cap, created with ctl (through a follower too: its 307 is followed to the leader).
    const put = ctl(admin, ['domains', 'cap', 'put', 'api', '--rate', String(CAP.rate), '--burst', String(CAP.burst)]);
    assert.equal(put.status, 0, put.stderr);
    const listed = ctl(admin, ['--json', 'domains', 'list']);
    assert.equal(listed.status, 0, listed.stderr);
    assert.deepEqual(
      (JSON.parse(listed.stdout) as { domains: { domain: string; rate: number; burst: number }[] }).domains.map((d) => [
        d.domain,
        d.rate,
        d.burst,
      ]),
      [['api', CAP.rate, CAP.burst]],
    );
    const follower = IDS.find((id) => id !== leader) ?? 'n1';
    const redirected = await c.http(follower, 'PUT', '/v1/domains/api/cap', CAP);
    assert.equal(redirected.status, 307);
    assert.equal(redirected.headers.get('location'), `${c.adminUrl(leader)}/v1/domains/api/cap`);

    // Bad input: a clear 4xx, and nothing changes.
    const bad: [string, string, unknown, number, string, RegExp?][] = [
      ['PUT', '/v1/domains/api/cap', { rate: -1, burst: 10 }, 400, 'INVALID'],
      ['PUT', '/v1/domains/api/cap', { rate: 1, burst: 1, extra: true }, 400, 'INVALID'],
      ['PUT', '/v1/domains/api/cap', { rate: 1, burst: 1e8 }, 400, 'INVALID', /MAX_GCRA_WINDOW_S/],
      ['PUT', '/v1/domains/bad%20name/cap', { rate: 1, burst: 1 }, 400, 'INVALID'],
      ['PUT', '/v1/tiers/big/cap', { rate: 1, burst: 1e8 }, 400, 'INVALID', /MAX_GCRA_WINDOW_S/],
      ['PUT', '/v1/tiers/big/cap', { burst: 10 }, 400, 'INVALID'],
      ['PUT', '/v1/tiers/nosuch/cap', CAP, 404, 'NOT_FOUND'],
      ['DELETE', '/v1/tiers/big/cap', undefined, 404, 'NOT_FOUND'],
      ['DELETE', '/v1/domains/other/cap', undefined, 404, 'NOT_FOUND'],
      ['GET', '/v1/tiers/big/cap', undefined, 404, 'NOT_FOUND'],
    ];
    for (const [method, path, body, status, code, message] of bad) {
      const r = await c.http(leader, method, path, body);
      assert.equal(r.status, status, `${method} ${path}: ${JSON.stringify(r.body).slice(0, 300)}`);
      assert.equal(r.body['error'], code);
      if (message !== undefined) assert.match(String(r.body['message']), message);
    }
    const unchanged = await c.http(leader, 'GET', '/v1/domains/api/cap');
    assert.equal(unchanged.status, 200);
    assert.deepEqual([unchanged.body['rate'], unchanged.body['burst']], [CAP.rate, CAP.burst], 'the cap is unchanged');
    assert.equal((await c.http(leader, 'GET', '/v1/tiers/big')).body['cap'], null, 'no tier cap was made');
    const docs = (await c.http(leader, 'GET', '/docs/json')).body['paths'] as Record<string, unknown>;
    for (const p of ['/v1/tiers/{name}/cap', '/v1/domains/{name}/cap', '/v1/domains'])
      assert.ok(p in docs, `OpenAPI lists ${p}`);

    const coordinators = IDS.map((id) => `127.0.0.1:${c.replica(id).peerPort}`).join(',');
    const a = await AgentProcess.start({ cell: 'cell-a', rules, coordinators });
    agent = a;
    await a.waitHealthy(90_000);
    for (const id of TENANTS)
      await waitFor(
        `cell-a admits ${id} on a lease`,
        async () => {
          const r = await check(a, id);
          return r.ok && !r.degraded;
        },
        { timeoutMs: 60_000, everyMs: 100, context: () => a.describe() },
      );
    const domainRun = assertCapHolds('domain cap', await drive(a, 4000));
    t.diagnostic(domainRun);

    // Deleted: the agent drops the domain level; the tenants are admitted at their own quota again.
    assert.equal((await c.write('DELETE', '/v1/domains/api/cap')).status, 200);
    assert.equal((await c.http(leader, 'GET', '/v1/domains/api/cap')).status, 404);
    assert.deepEqual((await c.http(leader, 'GET', '/v1/domains')).body['domains'], []);
    await waitFor(
      'the domain cap gone on cell-a: 2 × 40 checks at once all admitted',
      async () => (await burstAdmitted(a, 40)) === 80,
      { timeoutMs: 30_000, everyMs: 200, context: () => a.describe() },
    );

    // The tier cap over both tenants of tier big, created through the API; ctl reads it back.
    const tierCap = await c.write('PUT', '/v1/tiers/big/cap', CAP, {
      'x-client-id': 'caps-test',
      'x-request-seq': '1',
    });
    assert.equal(tierCap.status, 200, JSON.stringify(tierCap.body));
    const got = ctl(admin, ['--json', 'tiers', 'cap', 'get', 'big']);
    assert.equal(got.status, 0, got.stderr);
    assert.deepEqual(JSON.parse(got.stdout), { tier: 'big', ...CAP, floorFraction: 0 });
    await waitFor(
      'the tier cap in force on cell-a: at most a cap burst of 2 × 40 checks at once',
      async () => {
        const n = await burstAdmitted(a, 40);
        return n > 0 && n <= CAP.burst + 5;
      },
      { timeoutMs: 30_000, everyMs: 200, context: () => a.describe() },
    );
    const tierRun = assertCapHolds('tier cap', await drive(a, 4000));
    t.diagnostic(tierRun);

    const del = ctl(admin, ['tiers', 'cap', 'delete', 'big']);
    assert.equal(del.status, 0, del.stderr);
    assert.equal((await c.http(leader, 'GET', '/v1/tiers/big')).body['cap'], null);
    await waitFor(
      'the tier cap gone on cell-a: 2 × 40 checks at once all admitted',
      async () => (await burstAdmitted(a, 40)) === 80,
      { timeoutMs: 30_000, everyMs: 200, context: () => a.describe() },
    );
  } finally {
    await agent?.kill();
    await c.cleanup();
  }
});
