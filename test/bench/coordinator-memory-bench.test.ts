// `npm run bench -- coordinator-memory` on a small scale (300 tenants, a snapshot every 100
// entries): three real coordinators, the three phases sampled on every replica, the metric names
// the coordinator exports found, snapshots seen. Structure only: no memory figure is asserted.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runCoordinatorMemoryBenchDetailed } from '../../bench/coordinator-memory.js';

void test('coordinator-memory: idle, written and snapshot samples of each replica', { timeout: 90_000 }, async () => {
  const messages: string[] = [];
  const r = await runCoordinatorMemoryBenchDetailed({
    smoke: true,
    tenants: 300,
    snapshotEvery: 100,
    clients: 8,
    progress: (m) => messages.push(m),
  });
  assert.deepEqual(
    r.samples.map((s) => s.phase),
    ['idle', 'written', 'snapshot'],
  );
  for (const s of r.samples) {
    assert.deepEqual(
      s.replicas.map((x) => x.replica),
      ['n1', 'n2', 'n3'],
    );
    assert.equal(s.replicas.filter((x) => x.leader).length, 1, `${s.phase}: one leader`);
    for (const x of s.replicas) {
      assert.equal(
        x.rssBytes > 0 && x.heapUsedBytes > 0 && x.heapTotalBytes >= x.heapUsedBytes,
        true,
        `${s.phase} ${x.replica}: memory read from /metrics`,
      );
      assert.equal(x.tenants, s.phase === 'idle' ? 0 : 300, `${s.phase} ${x.replica}: tenants`);
      if (s.phase !== 'idle') assert.equal(x.diskBytes > 0, true, `${s.phase} ${x.replica}: data dir size`);
    }
  }
  assert.equal(r.writes.ok >= 300, true, 'every tenant written');
  for (const suffix of [
    'process_resident_memory_bytes',
    'nodejs_heap_size_used_bytes',
    'nodejs_heap_size_total_bytes',
  ]) {
    assert.equal(
      r.metricNames.some((n) => n.endsWith(suffix)),
      true,
      `metric *${suffix} found: ${r.metricNames.join(', ')}`,
    );
  }
  const lastWritten = Math.max(...(r.samples[1]?.replicas.map((x) => x.appliedIndex) ?? [0]));
  for (const id of ['n1', 'n2', 'n3']) {
    assert.equal(
      r.snapshots.some((e) => e.replica === id && e.index >= lastWritten && e.bytes > 0),
      true,
      `${id} took a snapshot past the writes`,
    );
  }
  assert.equal(r.report.name, 'coordinator-memory');
  assert.equal(r.report.rows.length, 9);
  for (const row of r.report.rows)
    for (const v of Object.values(row)) assert.equal(typeof v === 'number' || typeof v === 'string', true);
});
