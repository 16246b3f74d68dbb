// Smoke runs of bench/coordinator-source-real.ts (issue 12, real processes): the agent that has seen
// many distinct tenants reports its resident memory along the way; the bound benchmark reports, for
// findings 1-3, the largest 1 s window of two agents against rate·(1 s + u) + burst — and the bound,
// a correctness property rather than a performance figure, holds in every row.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runAgentTenantsBench, runCoordinatorBoundBench } from '../../bench/coordinator-source-real.js';

const quiet = { smoke: true, progress: (): void => undefined };

void test(
  'agent-tenants smoke: an agent that saw thousands of distinct tenants held by the coordinators, its RSS sampled',
  { timeout: 300_000 },
  async () => {
    const r = await runAgentTenantsBench({ ...quiet, tenants: 4_000 });
    assert.equal(r.name, 'agent-tenants');
    assert.ok(r.rows.length >= 2);
    for (const row of r.rows)
      for (const col of ['tenants seen', 'RSS MiB', 'table keys', 'lease grants held'])
        assert.ok(Number.isFinite(row[col]), `${col} in ${JSON.stringify(row)}`);
    assert.equal(r.rows[r.rows.length - 1]?.['tenants seen'], 4_000);
  },
);

void test(
  'coordinator-bound smoke: findings 1-3 within rate·(1 s + u) + burst, with real agents and coordinators',
  { timeout: 300_000 },
  async () => {
    const r = await runCoordinatorBoundBench(quiet);
    assert.equal(r.name, 'coordinator-bound');
    assert.deepEqual([...new Set(r.rows.map((row) => row['finding']))], ['1', '2', '3']);
    for (const row of r.rows) {
      assert.equal(row['errors'], 0, JSON.stringify(row));
      assert.equal(row['within'], 'yes', `over the bound: ${JSON.stringify(row)}`);
    }
  },
);
