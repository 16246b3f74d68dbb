// The allocator benchmark's smoke variant: the report has the shape bench/run.ts prints and writes,
// the moved round changes about 10% of the slices, and its entry encodes. No timing is asserted
// (docs/targets.md: targets are for benchmarks, not unit tests).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runAllocatorBench } from '../../../bench/allocator.js';

void test('runAllocatorBench (smoke): one row per size, ~10% of grants changed, entry sizes reported', () => {
  const msgs: string[] = [];
  const report = runAllocatorBench({ smoke: true, progress: (m) => msgs.push(m) });
  assert.equal(report.name, 'allocator');
  assert.equal(report.rows.length, 2);
  assert.equal(msgs.length, 2);
  for (const row of report.rows) {
    const pct = row['changed %'];
    assert.equal(typeof pct === 'number' && pct > 3 && pct < 30, true, `changed % ${String(pct)}`);
    assert.equal(typeof row['entry bytes'] === 'number' && row['entry bytes'] > 0, true, 'entry bytes');
    assert.equal(typeof row['round ms'], 'number');
    assert.equal(row['rounds to converge'] !== 12, true, 'the world converged before the measure');
  }
});
