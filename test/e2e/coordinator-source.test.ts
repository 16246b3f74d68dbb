// Issue 12 through real processes: three coordinators and two agents started with --coordinators
// and rules only (no tenants file). A tenant created through the admin API is admitted on every
// agent, decided on a leased grant; a quota no agent can represent is refused with a 400 naming the
// limit; deleting the tenant winds its slices down (every agent refuses it again, the ledger drops
// the tenant and its slices) and re-creating it works on every agent (epochs continue above the old
// ones); under the unknown-tenant policy tier:NAME an unknown tenant is admitted on every agent on
// tier NAME's lease.
import { test } from 'node:test';
import assert, { AssertionError } from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CoordinatorCluster } from '../../testkit/coordinator-cluster.js';
import { AgentProcess } from '../../testkit/agent-process.js';
import { waitFor } from '../../testkit/wait.js';

const ids = ['n1', 'n2', 'n3'];

async function check(agent: AgentProcess, tenant: string): Promise<{ status: number; degraded: boolean }> {
  const r = await fetch(`${agent.url}/v1/check`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ domain: 'api', descriptors: [{ entries: [{ key: 'tenant', value: tenant }] }] }),
    signal: AbortSignal.timeout(2000),
  });
  await r.arrayBuffer();
  return { status: r.status, degraded: r.headers.get('x-ratelimit-degraded') === 'true' };
}

void test('no tenants file: a tenant from the admin API is enforced on every agent on a lease; deleted, it is refused; re-created, admitted again', async () => {
  // At most one implicit tenant (unknown-tenant policy tier:NAME), wound down after 3 s without demand; leases of
  // 10 s, so a cell stopped for a few seconds still holds its lease when an idle tenant is wound down.
  const c = await CoordinatorCluster.create(ids, [
    '--floor-cells',
    '2',
    '--lease-ttl-ms',
    '10000',
    '--max-implicit-tenants',
    '1',
    '--implicit-tenant-idle-ms',
    '3000',
  ]);
  const agents: AgentProcess[] = [];
  try {
    writeFileSync(join(c.root, 'rules.yaml'), 'domain: api\ndescriptors:\n  - key: tenant\n    global: true\n');
    c.startAll();
    const leader = await c.waitForLeader(60_000);
    // Finding 4: a window no agent can hold is refused with a 400 that names the limit.
    const huge = await c.write('PUT', '/v1/tiers/huge', { rate: 1, burst: 1e8 });
    assert.equal(huge.status, 400, JSON.stringify(huge.body));
    assert.match(String(huge.body['message']), /MAX_GCRA_WINDOW_S/);
    assert.equal((await c.write('PUT', '/v1/tiers/gold', { rate: 200, burst: 200, floorFraction: 0.5 })).status, 200);
    assert.equal((await c.write('PUT', '/v1/tenants/acme', { tier: 'gold' })).status, 200);
    const coordinators = ids.map((id) => `127.0.0.1:${c.replica(id).peerPort}`).join(',');
    agents.push(
      await AgentProcess.start({ cell: 'cell-a', rules: join(c.root, 'rules.yaml'), coordinators }),
      await AgentProcess.start({ cell: 'cell-b', rules: join(c.root, 'rules.yaml'), coordinators }),
    );

    for (const a of agents) await a.waitHealthy(90_000);
    // Every agent admits acme, decided on a leased grant (not degraded), with no file naming it.
    for (const a of agents) {
      await waitFor(
        `${a.cell} admits acme on a lease`,
        async () => {
          const r = await check(a, 'acme');
          return r.status === 200 && !r.degraded;
        },
        { timeoutMs: 60_000, everyMs: 100, context: () => a.output },
      );
    }
    // A tenant the coordinators do not hold is refused (the default unknown-tenant policy, deny).
    for (const a of agents) assert.equal((await check(a, 'nobody')).status, 429);
    const epochs = new Map<string, number>();
    const t = await c.http(leader, 'GET', '/v1/tenants/acme');
    for (const s of (t.body['slices'] ?? []) as { cellId: string; epoch: number }[]) epochs.set(s.cellId, s.epoch);
    assert.ok(
      ['cell-a', 'cell-b'].every((id) => (epochs.get(id) ?? 0) > 0),
      `both cells hold slices: ${JSON.stringify(t.body['slices'])}`,
    );

    // Finding 7: deleted, the tenant's grants are wound down on every agent while their leases live.
    assert.equal((await c.write('DELETE', '/v1/tenants/acme')).status, 200);
    for (const a of agents) {
      await waitFor(
        `${a.cell} refuses the deleted tenant`,
        async () => {
          const r = await check(a, 'acme');
          return r.status === 429;
        },
        { timeoutMs: 10_000, everyMs: 100, context: () => a.output },
      );
    }
    // Wound down, the tenant is gone from the ledger: no record, and its slices dropped once every
    // cell acknowledged its zero grant (the leader's count of tenant keys holding slices without a
    // record, cellquota_ledger_implicit_tenants, back to 0).
    assert.equal((await c.http(leader, 'GET', '/v1/tenants/acme')).status, 404);
    await waitFor(
      "the deleted tenant's slices dropped from the leader's ledger",
      async () => {
        const text = await (await fetch(`${c.adminUrl(await c.waitForLeader())}/metrics`)).text();
        return /^cellquota_ledger_implicit_tenants 0$/m.test(text);
      },
      { timeoutMs: 30_000, everyMs: 200 },
    );
    // Finding 6: re-created, every agent admits it again (its new grants' epochs are above the old).
    assert.equal((await c.write('PUT', '/v1/tenants/acme', { tier: 'gold' })).status, 200);
    for (const a of agents) {
      await waitFor(
        `${a.cell} admits the re-created tenant on a lease`,
        async () => {
          const r = await check(a, 'acme');
          return r.status === 200 && !r.degraded;
        },
        { timeoutMs: 30_000, everyMs: 100, context: () => a.output },
      );
    }
    const again = await c.http(leader, 'GET', '/v1/tenants/acme');
    for (const s of (again.body['slices'] ?? []) as { cellId: string; epoch: number }[]) {
      if (s.epoch > 0)
        assert.ok(
          s.epoch > (epochs.get(s.cellId) ?? 0),
          `cell ${s.cellId}: epoch ${s.epoch} above the old ${epochs.get(s.cellId)}`,
        );
    }

    // The unknown-tenant policy tier:NAME: the tier must exist; unknown tenants then get its quota on
    // every agent, on a lease; the tier cannot be deleted while the policy names it.
    const missing = await c.write('PUT', '/v1/settings', { unknownTenant: 'tier:guest' });
    assert.equal(missing.status, 404, JSON.stringify(missing.body));
    assert.equal((await c.write('PUT', '/v1/tiers/guest', { rate: 50, burst: 50, floorFraction: 0.5 })).status, 200);
    const set = await c.write('PUT', '/v1/settings', { unknownTenant: 'tier:guest' });
    assert.equal(set.status, 200, JSON.stringify(set.body));
    assert.equal(set.body['unknownTenant'], 'tier:guest');
    for (const a of agents) {
      await waitFor(
        `${a.cell} admits an unknown tenant on tier guest's lease`,
        async () => {
          const r = await check(a, 'stranger');
          return r.status === 200 && !r.degraded;
        },
        { timeoutMs: 30_000, everyMs: 100, context: () => a.output },
      );
    }
    // The bound on implicit tenants (--max-implicit-tenants 1): a second unknown tenant is refused as
    // under deny (counted) while the first is held; once the first has had no demand for 3 s it is
    // wound down (zero grants acknowledged, dropped), and the second is granted.
    const coordinatorMetric = async (name: string): Promise<number> => {
      let most = 0;
      for (const id of ids) {
        const text = await (await fetch(`${c.adminUrl(id)}/metrics`)).text().catch(() => '');
        const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
        if (m !== null) most = Math.max(most, Number(m[1]));
      }
      return most;
    };
    const [first] = agents as [AgentProcess];
    await waitFor(
      'the leader refuses a second implicit tenant',
      async () => {
        assert.equal((await check(first, 'second')).status, 429, 'refused while the first is held');
        return (await coordinatorMetric('cellquota_lease_implicit_tenants_refused_total')) > 0;
      },
      { timeoutMs: 15_000, everyMs: 100, context: () => first.output, fatal: (e) => e instanceof AssertionError },
    );
    await waitFor(
      'the second implicit tenant admitted once the idle first is wound down',
      async () => {
        assert.ok((await coordinatorMetric('cellquota_ledger_implicit_tenants')) <= 1, 'the bound holds throughout');
        const r = await check(first, 'second');
        return r.status === 200 && !r.degraded;
      },
      { timeoutMs: 30_000, everyMs: 100, context: () => first.output, fatal: (e) => e instanceof AssertionError },
    );
    // A wind-down that cannot finish (a cell holding the tenant's floor is cut off before acknowledging its zero
    // grant) no longer refuses the tenant everywhere: asked for again on a healthy cell, it is taken back and admitted.
    const other = agents[1] as AgentProcess;
    await waitFor(
      `${other.cell} admits the second implicit tenant on a lease`,
      async () => {
        const r = await check(other, 'second');
        return r.status === 200 && !r.degraded;
      },
      { timeoutMs: 30_000, everyMs: 100, context: () => other.output },
    );
    // cell-b goes quiet, and is stopped once the leader has its zero demand (two of its reports committed after its
    // velocity window emptied), so the tenant goes idle everywhere while cell-b's 10 s lease is still live.
    await waitFor(
      `${other.cell} has no demand left`,
      async () => {
        const text = await (await fetch(`${other.url}/metrics`)).text();
        return /^cellquota_agent_global_velocity_quotas 0$/m.test(text);
      },
      { timeoutMs: 10_000, everyMs: 100, context: () => other.output },
    );
    const reportedAt = async (): Promise<unknown> => {
      const cells = (await c.http(leader, 'GET', '/v1/cells')).body['cells'] as { id: string; lastReportAt: unknown }[];
      return cells.find((x) => x.id === other.cell)?.lastReportAt;
    };
    for (let i = 0; i < 2; i++) {
      const at = await reportedAt();
      await waitFor(`a report of ${other.cell} committed`, async () => (await reportedAt()) !== at, {
        timeoutMs: 10_000,
        everyMs: 50,
      });
    }
    const retiredBefore = await coordinatorMetric('cellquota_lease_implicit_tenants_retired_total');
    other.proc.kill('SIGSTOP');
    try {
      await waitFor(
        'the idle implicit tenant is wound down while cell-b is stopped (its lease still live)',
        async () => (await coordinatorMetric('cellquota_lease_implicit_tenants_retired_total')) > retiredBefore,
        { timeoutMs: 20_000, everyMs: 200 },
      );
      await waitFor(
        'cell-a asks for it again: taken back, and admitted on a lease while cell-b is stopped',
        async () => {
          const r = await check(first, 'second');
          const revived = await coordinatorMetric('cellquota_lease_implicit_tenants_revived_total');
          return r.status === 200 && !r.degraded && revived >= 1;
        },
        { timeoutMs: 15_000, everyMs: 100, context: () => first.output },
      );
      assert.ok((await coordinatorMetric('cellquota_ledger_implicit_tenants')) <= 1, 'the bound holds');
    } finally {
      other.proc.kill('SIGCONT');
    }
    const del = await c.write('DELETE', '/v1/tiers/guest');
    assert.equal(del.status, 409, JSON.stringify(del.body));
    assert.match(String(del.body['message']), /unknown-tenant policy/);
    assert.equal((await c.write('PUT', '/v1/settings', { unknownTenant: 'deny' })).status, 200);
    for (const a of agents) {
      await waitFor(
        `${a.cell} refuses the unknown tenant again under deny`,
        async () => (await check(a, 'stranger')).status === 429,
        { timeoutMs: 15_000, everyMs: 100, context: () => a.output },
      );
    }
  } finally {
    for (const a of agents) a.proc.kill('SIGKILL');
    await c.cleanup();
  }
});
