// The accuracy benchmark's central-Redis variant (three RLS servers, each a process of its own, all
// counting in one redis-server), run as its smoke variant: the row has the report's columns and the
// load was answered. Structure only: no accuracy figure is asserted here (bench/accuracy.ts reports
// them). Skipped when redis-server is not installed.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runAccuracyBench } from '../../bench/accuracy.js';
import { findRedisServer } from '../../testkit/processes/redis-server.js';

const noRedis = findRedisServer() === null;

void test(
  'npm run bench -- accuracy --smoke, central Redis counter only',
  { timeout: 90_000, skip: noRedis ? 'redis-server is not installed' : false },
  async () => {
    const messages: string[] = [];
    const report = await runAccuracyBench({ smoke: true, kinds: ['central-redis'], progress: (m) => messages.push(m) });
    assert.equal(report.name, 'accuracy');
    assert.equal(report.rows.length, 1, JSON.stringify(report.rows));
    const row = report.rows[0] ?? {};
    assert.equal(row['variant'], 'central Redis counter (rlf fixed window)');
    for (const col of [
      'offered/s',
      'admitted/s (skew)',
      'global error (skew)',
      'per cell a/b/c',
      'c ≥ 90 % of entitlement after',
      'c admitted/s from 2 s after the shift',
      'global error (after shift)',
      'max in 1 s window (bound)',
      'errors',
    ]) {
      assert.equal(col in row, true, `column ${col}`);
    }
    assert.equal(Number(row['offered/s']) > 0, true, 'load was offered');
    assert.equal(Number(row['admitted/s (skew)']) > 0, true, 'something was admitted');
    assert.match(String(row['max in 1 s window (bound)']), /^\d+ \(1200; fixed window ≤ 2000\)$/);
    assert.equal(row['errors'], 0, 'every check was answered');
    assert.equal(
      report.notes.some((n) => n.startsWith('Central Redis counter:')),
      true,
    );
    assert.equal(
      report.notes.some((n) => n.startsWith('Target ±5 % under skew: coordinated not run')),
      true,
      report.notes.join('\n'),
    );
  },
);
