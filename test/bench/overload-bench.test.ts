// The overload benchmark's smoke run (bench/overload.ts): both agents (bounded and open overload
// policy) under closed-loop floods at 1× and 2×, every row with finite figures, both policies at
// every level. No figure is compared with a threshold (docs/targets.md: the full run judges).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runOverloadBench } from '../../bench/overload.js';

void test(
  'overload smoke: floods at 1× and 2× against the bounded and the open agent, per-key admitted against the bound, fail-open share, p50/p99',
  { timeout: 240_000 },
  async () => {
    const r = await runOverloadBench({ smoke: true, progress: () => undefined });
    assert.equal(r.name, 'overload');
    assert.deepEqual([...new Set(r.rows.map((row) => `${String(row['flood'])} ${String(row['policy'])}`))].sort(), [
      '1× bounded',
      '1× open',
      '2× bounded',
      '2× open',
    ]);
    for (const row of r.rows) {
      for (const col of [
        'answers/s',
        'max key admitted',
        'bound per key',
        'fail-open %',
        'p50 µs',
        'p99 µs',
        'errors',
      ]) {
        const v = row[col];
        assert.equal(
          typeof v === 'number' && Number.isFinite(v),
          true,
          `${col} is a finite number in ${JSON.stringify(row)}`,
        );
      }
      assert.ok((row['answers/s'] as number) > 0, `answers in ${JSON.stringify(row)}`);
      assert.equal(row['errors'], 0, `no failed checks: ${JSON.stringify(row)}`);
    }
    assert.ok(
      r.notes.some((n) => n.includes('Bound per key')),
      'the bound is stated',
    );
  },
);
