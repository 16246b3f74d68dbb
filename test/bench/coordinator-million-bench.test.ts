// `npm run bench -- coordinator-million` on a small scale (5,000 tenants in batches of 250, a
// snapshot every 10 entries): three real coordinators, a follower stopped during the bulk load and
// started again under write load, caught up through a snapshot from the leader, then restarted on
// its own snapshot. Structure only: no memory or time figure is asserted.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runCoordinatorMillionDetailed } from '../../bench/coordinator-memory.js';

void test(
  'coordinator-million: bulk load, memory per phase, catch-up from a snapshot under load, restore at start',
  { timeout: 180_000 },
  async () => {
    const r = await runCoordinatorMillionDetailed({
      smoke: true,
      tenants: 5_000,
      batch: 250,
      snapshotEvery: 10,
      progress: () => undefined,
    });
    assert.deepEqual(
      r.samples.map((s) => s.phase),
      ['idle', 'loaded', 'caught up'],
    );
    assert.deepEqual(
      r.samples.map((s) => s.replicas.length),
      [3, 2, 3],
    );
    const caught = r.samples[2]?.replicas ?? [];
    for (const x of caught) {
      assert.equal(x.tenants, 5_000, `${x.replica} holds every tenant`);
      assert.ok(x.rssBytes > 0 && x.heapUsedBytes > 0, `${x.replica}: memory read from /metrics`);
    }
    assert.ok(
      r.installed !== null && r.installed.bytes > 0,
      'the stopped follower caught up through a snapshot from the leader',
    );
    assert.ok(r.restartRestore !== null && r.restartRestore.bytes > 0, 'and restored its own snapshot when restarted');
    assert.ok(r.writesDuringCatchUp > 0, 'writes went on while it caught up');
    assert.ok(r.loadPerSec > 0 && r.catchUpMs > 0);
    const p = r.catchUpPhases;
    assert.ok(
      p.installedMs !== null && p.receivedMs !== null && p.firstChunkMs !== null,
      `catch-up phases from the replica's log: ${JSON.stringify(p)}`,
    );
    assert.ok(p.firstChunkMs <= p.receivedMs && p.receivedMs <= p.installedMs, JSON.stringify(p));
    assert.ok(p.transfersStarted >= 1, JSON.stringify(p));
    assert.ok(
      r.report.rows.some((row) => row['phase'] === 'catch-up under load' && row['caught up ms'] === r.catchUpMs),
    );
    const stalls = r.report.rows.filter((row) => row['phase'] === 'snapshot stall');
    assert.ok(stalls.length > 0, 'snapshot stalls reported');
    for (const row of stalls) {
      const enc = row['encode ms'] as number;
      assert.ok(enc >= 0 && (row['longest loop stall ms'] as number) >= enc, JSON.stringify(row));
    }
    assert.equal(r.report.name, 'coordinator-million');
    for (const row of r.report.rows)
      for (const v of Object.values(row)) assert.equal(typeof v === 'number' || typeof v === 'string', true);
  },
);
