// The smoke runs of the benchmarks that have no test of their own: each still runs end to end and
// reports what it measures — finite figures in every row, its targets evaluated in the notes. No
// figure is compared with a threshold (docs/targets.md: targets are judged by the full runs, side by side).
// The others' smoke runs: agent-bench, agent-2w-bench, cascade-bench, coordinator-bench,
// coordinator-memory-bench and accuracy-central-redis-bench.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runAccuracyBench } from '../../bench/accuracy.js';
import { runAgentIdleRssBench } from '../../bench/agent-idle-rss.js';
import { runAgentMemoryBench } from '../../bench/agent-memory.js';
import { runAllocatorBench } from '../../bench/allocator.js';
import type { BenchReport } from '../../bench/bench-report.js';
import { runDecisionBench } from '../../bench/decision.js';
import { runRaftCoreBench } from '../../bench/raft-core.js';

const quiet = { smoke: true, progress: (): void => undefined };

function assertReport(r: BenchReport, name: string, numericColumns: readonly string[]): void {
  assert.equal(r.name, name);
  assert.equal(r.rows.length > 0, true, `${name}: rows`);
  for (const row of r.rows) {
    for (const col of numericColumns) {
      const v = row[col];
      assert.equal(
        typeof v === 'number' && Number.isFinite(v),
        true,
        `${name}: ${col} is a finite number in ${JSON.stringify(row)}`,
      );
    }
  }
  assert.equal(r.notes.length > 0, true, `${name}: notes`);
}

void test('raft-core smoke: commits per second in memory', () => {
  const r = runRaftCoreBench(quiet);
  assertReport(r, 'raft-core', ['inFlight', 'commitsPerSec']);
});

void test('agent-memory smoke: bucket table bytes and in-process decision latency', () => {
  const r = runAgentMemoryBench(quiet);
  assertReport(r, 'agent-memory', ['buckets', 'SAB MiB', 'RSS MiB']);
});

void test('agent-idle-rss smoke: the agent command started, answering, then its RSS while idle', async () => {
  const r = await runAgentIdleRssBench(quiet);
  assertReport(r, 'agent-idle-rss', ['workers', 'RSS MiB', 'max RSS MiB', 'checks before idle']);
  assert.deepEqual(
    r.rows.map((row) => row.variant),
    ['rls'],
  );
});

void test('decision smoke: the two references, take and takeKey, the decision on both paths, a check bytes to bytes, the embedded check', async () => {
  const r = await runDecisionBench(quiet);
  assertReport(r, 'decision', ['p50 ns', 'p99 ns', 'batch of 10 mean p99 ns', 'batch mean p50 ns', 'alloc B/call']);
  assert.deepEqual(
    r.rows.map((row) => row.call),
    [
      'fixed work',
      'bare CAS',
      'take()',
      'takeKey()',
      'takeKey() head',
      'takeKey() head 256',
      'decide (fast)',
      'decide (general)',
      'decide (global)',
      'decide (leased)',
      'decide (leased, general)',
      'decide 2 (fast)',
      'decide 2 (general)',
      'check, bytes to bytes (OK)',
      'check, bytes to bytes (refused)',
      'check, bytes to bytes (refused 256)',
      'limiter.check()',
      'limiter.check() reused entry',
      'limiter.checkInPlace()',
      'decide (fast) in place',
      'limiter.check() 256',
      'limiter.check() 2',
    ],
  );
  assert.ok(r.notes.some((n) => /embedded benchmark's measurement of check\(\)/.test(n)));
});

void test("allocator smoke: round time and entry size per scale; the moved round changes ~10 % of the grants; incremental rounds send the full round's grants in a smaller entry", () => {
  const r = runAllocatorBench(quiet);
  const full = { ...r, rows: r.rows.filter((row) => row.variant === undefined) };
  const inc = r.rows.filter((row) => row.variant === 'incremental vs full');
  const policy = r.rows.filter((row) => row.variant === 'policy round on a ledger');
  const steady = r.rows.filter((row) => row.variant === 'steady policy rounds on a ledger');
  assert.equal(full.rows.length + inc.length + policy.length + steady.length, r.rows.length);
  assert.equal(policy.length, 1);
  for (const row of policy) {
    assert.ok((row['policy round ms'] as number) > 0 && (row['gather ms'] as number) > 0);
    assert.ok((row['budget grants'] as number) > 0 && (row['budget grants'] as number) <= 5_000);
    assert.ok((row['allocatorPolicy cpu ms'] as number) > 0 && (row['first (full) round cpu ms'] as number) > 0);
  }
  assert.equal(steady.length, 1);
  for (const row of steady) {
    // Steady rounds compute the moved keys and those still settling, not every tenant.
    const computed = row['quotas computed'] as number;
    assert.ok((row['keys changed / round'] as number) > 0 && computed >= (row['keys changed / round'] as number));
    assert.ok(computed < (row.tenants as number) / 2, `computed ${computed} of ${row.tenants}`);
  }
  assertReport(full, 'allocator', ['tenants', 'cells', 'round ms', 'entry bytes', 'changed %']);
  for (const row of full.rows) {
    const pct = row['changed %'] as number;
    assert.equal(pct > 3 && pct < 30, true, `changed % ${pct}`);
    assert.equal((row['entry bytes'] as number) > 0, true, 'an entry was encoded');
    assert.notEqual(row['rounds to converge'], 12, 'the world converged before the measure');
  }
  assert.equal(inc.length, 2);
  for (const row of inc) {
    assert.equal(row['same grants'], 'yes', "the incremental round sends exactly the full round's grants");
    assert.ok((row['quotas computed'] as number) < (row.tenants as number) / 5, 'only the moved quotas are computed');
    assert.ok((row['grants changed'] as number) > 0);
    assert.ok(
      (row['entry v2 bytes'] as number) * 3 < (row['entry v1 bytes'] as number),
      `compact entry ${row['entry v2 bytes']} B vs ${row['entry v1 bytes']} B`,
    );
    assert.ok((row['budget grants'] as number) <= 5_000);
  }
});

void test(
  'accuracy smoke: coordinated slices against the static shares, with real processes',
  { timeout: 180_000 },
  async () => {
    const r = await runAccuracyBench({ ...quiet, kinds: ['leased', 'static'] });
    assertReport(r, 'accuracy', ['admitted/s (skew)', 'errors']);
    assert.deepEqual(
      r.rows.map((row) => row['variant']),
      ['coordinated (leased slices)', 'static Q÷3 per cell', 'static Q per cell'],
    );
    for (const row of r.rows) assert.equal(row['errors'], 0, `no failed checks: ${JSON.stringify(row)}`);
  },
);

void test(
  'coordinator-source smoke: PUT to admitted on every agent without a tenants file, lease message bytes',
  { timeout: 240_000 },
  async () => {
    const { runCoordinatorSourceBench } = await import('../../bench/coordinator-source.js');
    const r = await runCoordinatorSourceBench(quiet);
    assert.equal(r.name, 'coordinator-source');
    for (const row of r.rows)
      assert.ok(
        Number.isFinite(row['value']) && (row['value'] as number) > 0,
        `${String(row['measure'])}: ${String(row['value'])}`,
      );
  },
);
