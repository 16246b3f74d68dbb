// End to end, all real processes: three coordinators and two cell agents (`--coordinators` listing
// every coordinator, no tenants file: the tier and tenant come from the admin API). A tenant quota of 100 req/s; load on one cell only: that cell's grant grows
// above its static share (10 req/s) and it admits more than the static share would. Then kill -9 of
// the coordinator leader: both agents keep answering checks, and then report to the new leader. Then
// every coordinator down: fail-static on the floors (degraded answers), and leased again once they
// are back.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CoordinatorCluster } from '../../../testkit/coordinator-cluster.js';
import { AgentProcess } from '../../../testkit/agent-process.js';
import { waitFor } from '../../../testkit/wait.js';

const ids = ['n1', 'n2', 'n3'];

const RULES = `domain: api
descriptors:
  - key: tenant
    global: true
`;

async function check(agent: AgentProcess): Promise<{ status: number; degraded: boolean }> {
  const r = await fetch(`${agent.url}/v1/check`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ domain: 'api', descriptors: [{ entries: [{ key: 'tenant', value: 'acme' }] }] }),
    signal: AbortSignal.timeout(2000),
  });
  await r.arrayBuffer();
  return { status: r.status, degraded: r.headers.get('x-ratelimit-degraded') === 'true' };
}

/** Sends checks at about `rps` for `ms`; returns how many were admitted and how many answered at all. */
async function load(
  agent: AgentProcess,
  rps: number,
  ms: number,
): Promise<{ admitted: number; answered: number; sent: number; degraded: number }> {
  const out = { admitted: 0, answered: 0, sent: 0, degraded: 0 };
  const until = Date.now() + ms;
  const pending: Promise<void>[] = [];
  while (Date.now() < until) {
    const batch = Math.max(1, Math.round(rps / 20));
    for (let i = 0; i < batch; i++) {
      out.sent++;
      pending.push(
        check(agent).then(
          (r) => {
            out.answered++;
            if (r.status === 200) out.admitted++;
            if (r.degraded) out.degraded++;
          },
          () => undefined,
        ),
      );
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  await Promise.all(pending);
  return out;
}

async function metric(agent: AgentProcess, name: string): Promise<number | null> {
  const text = await (await fetch(`${agent.url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m === null ? null : Number(m[1]);
}

void test('end to end: a busy cell grows above its static share; agents survive kill -9 of the leader and follow the new one; fail-static with every coordinator down, leased again after', async () => {
  const c = await CoordinatorCluster.create(ids);
  const agents: AgentProcess[] = [];
  try {
    writeFileSync(join(c.root, 'rules.yaml'), RULES);
    c.startAll();
    const leader = await c.waitForLeader();
    assert.equal((await c.write('PUT', '/v1/tiers/gold', { rate: 100, burst: 100, floorFraction: 0.3 })).status, 200);
    assert.equal((await c.write('PUT', '/v1/tenants/acme', { tier: 'gold' })).status, 200);
    const coordinators = ids.map((id) => `127.0.0.1:${c.replica(id).peerPort}`).join(',');
    agents.push(
      await AgentProcess.start({ cell: 'busy', rules: join(c.root, 'rules.yaml'), coordinators }),
      await AgentProcess.start({ cell: 'quiet', rules: join(c.root, 'rules.yaml'), coordinators }),
    );
    const [busy, quiet] = agents as [AgentProcess, AgentProcess];
    for (const a of agents) await a.waitHealthy(90_000);
    for (const a of agents)
      await waitFor(`agent ${a.cell} leased`, async () => (await metric(a, 'cellquota_agent_lease_state')) === 1, {
        timeoutMs: 30_000,
        everyMs: 200,
      });
    assert.equal(await metric(busy, 'cellquota_agent_on_floor'), 0, 'not on floors while leased');

    // Load on one cell: its grant grows above the static share of 10 req/s.
    let grantRate = 0;
    for (let i = 0; i < 10 && grantRate <= 20; i++) {
      await load(busy, 150, 1000);
      const t = await c.http(leader, 'GET', '/v1/tenants/acme');
      const slices = (t.body['slices'] ?? []) as { cellId: string; rate: number }[];
      grantRate = slices.find((s) => s.cellId === 'busy')?.rate ?? 0;
    }
    assert.ok(grantRate > 20, `the busy cell's grant grew above its static share: ${grantRate}`);
    const inForce = (await (await fetch(`${busy.url}/v1/quotas/tenant/acme`)).json()) as {
      source: string;
      rate: number;
    };
    assert.equal(inForce.source, 'leased', `the agent decides on its leased grant: ${JSON.stringify(inForce)}`);
    assert.ok(inForce.rate > 10, `the grant in force is above the static share: ${JSON.stringify(inForce)}`);
    const measured = await load(busy, 150, 2000);
    assert.ok(
      measured.admitted > 40,
      `the busy cell admits more than its static share would (≤ 10/s + 10): ${JSON.stringify(measured)}`,
    );
    assert.ok(measured.admitted <= 2 * 100 + 100, `never above the global quota's bound: ${JSON.stringify(measured)}`);
    assert.ok(measured.degraded < measured.answered, 'leased answers are not marked degraded');

    // kill -9 the leader; both agents keep answering, then report to the new leader.
    const killedAt = Date.now();
    await c.kill(leader);
    const during = await Promise.all([load(busy, 40, 2500), load(quiet, 20, 2500)]);
    for (const d of during)
      assert.equal(d.answered, d.sent, `every check answered during the failover: ${JSON.stringify(d)}`);
    const rest = ids.filter((id) => id !== leader);
    const next = await c.waitForLeader(20_000, rest);
    await waitFor(
      'both agents report to the new leader',
      async () => {
        const r = await c.http(next, 'GET', '/v1/cells');
        const cells = (r.body['cells'] ?? []) as { id: string; lastReportAt: string | null; leaseLive: boolean }[];
        return ['busy', 'quiet'].every((id) => {
          const cell = cells.find((x) => x.id === id);
          return (
            cell?.lastReportAt !== null &&
            cell?.lastReportAt !== undefined &&
            Date.parse(cell.lastReportAt) > killedAt &&
            cell.leaseLive
          );
        });
      },
      { timeoutMs: 20_000, everyMs: 200 },
    );
    for (const a of agents)
      await waitFor(
        `agent ${a.cell} leased again`,
        async () => (await metric(a, 'cellquota_agent_lease_state')) === 1,
        { timeoutMs: 20_000, everyMs: 200 },
      );
    const after = await check(busy);
    assert.ok(after.status === 200 || after.status === 429, 'the busy agent answers after the failover');

    // Every coordinator down: the agents keep answering, on their floors, marked degraded; back up:
    // leased again.
    for (const id of rest) await c.kill(id);
    for (const a of agents)
      await waitFor(`agent ${a.cell} fail-static`, async () => (await metric(a, 'cellquota_agent_lease_state')) === 2, {
        timeoutMs: 15_000,
        everyMs: 200,
      });
    assert.equal(await metric(busy, 'cellquota_agent_on_floor'), 1, 'on floors');
    const floor = (await (await fetch(`${busy.url}/v1/quotas/tenant/acme`)).json()) as { source: string; rate: number };
    assert.equal(floor.source, 'floor', `the agent decides on the grant's floor: ${JSON.stringify(floor)}`);
    const onFloor = await load(busy, 40, 1500);
    assert.equal(onFloor.answered, onFloor.sent, 'every check answered without coordinators');
    assert.equal(onFloor.degraded, onFloor.answered, 'every answer marked x-ratelimit-degraded');
    assert.ok(
      onFloor.admitted <= 10 * 1.5 + 10 + 2,
      `the busy cell is back on its floor of 10/s: ${JSON.stringify(onFloor)}`,
    );
    c.startAll();
    for (const a of agents)
      await waitFor(
        `agent ${a.cell} leased after the restart`,
        async () => (await metric(a, 'cellquota_agent_lease_state')) === 1,
        { timeoutMs: 40_000, everyMs: 200 },
      );
    assert.equal(await metric(busy, 'cellquota_agent_on_floor'), 0, 'off the floors again');
  } finally {
    for (const a of agents) a.proc.kill('SIGKILL');
    await c.cleanup();
  }
});
