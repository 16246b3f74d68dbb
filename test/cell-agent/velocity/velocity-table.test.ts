// The 500 ms velocity window in shared memory: bucket rotation, exact counts under concurrent
// writers (worker threads), key learning through onNewKey, idle-slot reuse and dropped samples.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Worker } from 'node:worker_threads';
import { VelocityKeys, VelocityTable } from '../../../cell-agent/velocity/velocity-table.js';

const MS = 1_000_000n;

function table(capacity: number): { t: VelocityTable; keys: VelocityKeys } {
  const t = VelocityTable.create({ capacity, startNs: 0n, seed: 7 });
  const keys = new VelocityKeys(t);
  t.onNewKey = (slot, gen, key) => keys.learn(slot, gen, key);
  return { t, keys };
}

void test('five 100 ms buckets: a sample counts for 500 ms, then leaves the window', () => {
  const { t, keys } = table(64);
  t.record('a', 3, 1, 1000n * MS);
  t.record('a', 2, 0, 1150n * MS);
  t.record('b', 0, 4, 1420n * MS);
  assert.deepEqual(keys.snapshot(1450n * MS), [
    { key: 'a', allowed: 5, refused: 1 },
    { key: 'b', allowed: 0, refused: 4 },
  ]);
  assert.deepEqual(
    keys.snapshot(1499n * MS),
    [
      { key: 'a', allowed: 5, refused: 1 },
      { key: 'b', allowed: 0, refused: 4 },
    ],
    'tick 10 is still in the window at tick 14',
  );
  assert.deepEqual(
    keys.snapshot(1500n * MS),
    [
      { key: 'a', allowed: 2, refused: 0 },
      { key: 'b', allowed: 0, refused: 4 },
    ],
    'tick 10 left at tick 15',
  );
  // The same ring slot one window later starts from zero, not from the stale count.
  t.record('a', 7, 0, 1510n * MS);
  assert.deepEqual(
    keys.snapshot(1520n * MS).find((s) => s.key === 'a'),
    { key: 'a', allowed: 9, refused: 0 },
  );
  assert.deepEqual(keys.snapshot(3000n * MS), [], 'idle keys are not reported');
});

void test('idle slots are reused for new keys; with no idle slot the sample is dropped and counted', () => {
  const { t, keys } = table(4);
  for (const k of ['k1', 'k2', 'k3', 'k4']) assert.equal(t.record(k, 1, 0, 100n * MS), true);
  assert.equal(t.record('k5', 1, 0, 200n * MS), false, 'all four are busy');
  assert.equal(t.dropped, 1);
  assert.equal(t.record('k5', 1, 0, 800n * MS), true, 'a slot idle for a whole window is taken over');
  assert.deepEqual(keys.snapshot(800n * MS), [{ key: 'k5', allowed: 1, refused: 0 }]);
  assert.equal(keys.size <= 4, true, 'the reader forgets reused slots');
});

void test('concurrent writers in worker threads: no sample is lost', async () => {
  const { t, keys } = table(1024);
  const go = new SharedArrayBuffer(4);
  const keyNames = ['tenant-a', 'tenant-b', 'tenant-c'];
  const ops = 30_000;
  const api = import.meta.resolve('tsx/esm/api');
  const entry = new URL('./velocity-worker.ts', import.meta.url).href;
  const boot = `import(${JSON.stringify(api)}).then((m) => { m.register(); return import(${JSON.stringify(entry)}); });`;
  const nowNs = 5000n * MS;
  const workers = [0, 1].map(
    () => new Worker(boot, { eval: true, workerData: { shared: t.shared, keys: keyNames, ops, nowNs, go } }),
  );
  const ready = workers.map(
    (w) =>
      new Promise<void>((resolve) => {
        w.on('message', (m: { kind: string }) => {
          if (m.kind === 'ready') resolve();
        });
      }),
  );
  const done = workers.map(
    (w) =>
      new Promise<number>((resolve, reject) => {
        w.on('message', (m: { kind: string; slot?: number; gen?: number; key?: string; dropped?: number }) => {
          if (m.kind === 'vkey') keys.learn(m.slot ?? -1, m.gen ?? 0, m.key ?? '');
          if (m.kind === 'done') resolve(m.dropped ?? -1);
        });
        w.on('error', reject);
      }),
  );
  await Promise.all(ready);
  Atomics.store(new Int32Array(go), 0, 1);
  Atomics.notify(new Int32Array(go), 0);
  const dropped = await Promise.all(done);
  await Promise.all(workers.map((w) => w.terminate()));
  assert.deepEqual(dropped, [0, 0]);
  const snap = keys.snapshot(nowNs).sort((a, b) => a.key.localeCompare(b.key));
  assert.deepEqual(
    snap.map((s) => s.key),
    keyNames,
  );
  const total = snap.reduce((s, x) => s + x.allowed, 0);
  const refused = snap.reduce((s, x) => s + x.refused, 0);
  assert.equal(total, 2 * ops, 'every allowed sample counted');
  assert.equal(refused, 2 * 2 * Math.ceil(ops / 3), 'every refused sample counted');
});
