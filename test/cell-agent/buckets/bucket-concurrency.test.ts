// THE required property: several worker threads sharing one bucket table never admit more than
// rate × t + burst for a key, whatever the interleaving (lost CAS races, concurrent first inserts,
// evictions, re-configurations), and with an effectively unlimited limit they count exactly.
//
// Time is a shared virtual clock (a BigInt64 in a SharedArrayBuffer): every op advances it by a
// random step with Atomics.add and uses the result as its now. So the offered load is a fixed
// multiple of the rate however fast the machine is, every now lies in [0, final clock], and the
// bound for a key is floor(finalClock / T) + b. Workers are released together through Atomics.wait.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import type { Worker } from 'node:worker_threads';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import { limitFromInterval } from '../../../cell-agent/buckets/gcra.js';
import { startBucketWorker } from './bucket-worker.js';
import type { LimitSpec, RunCommand, RunResult } from './bucket-worker.js';

const WORKERS = 4;

let workers: Worker[] = [];

before(() => {
  workers = Array.from({ length: WORKERS }, () => startBucketWorker());
});

after(async () => {
  await Promise.all(workers.map((w) => w.terminate()));
});

interface Scenario {
  readonly table: BucketTable;
  readonly keys: readonly string[];
  readonly limits: readonly LimitSpec[];
  readonly ops: number;
  readonly maxHits: number;
  readonly maxStepNs: number;
  readonly startClockNs?: bigint;
  readonly hotKeys?: number;
  readonly hotShare?: number;
  readonly order?: 'random' | 'sweep';
}

interface Outcome {
  readonly results: RunResult[];
  readonly admitted: number[];
  readonly finalClock: bigint;
}

function once<T>(w: Worker, kind: string): Promise<T> {
  return new Promise((resolve, reject) => {
    const onMessage = (m: { kind: string; result?: unknown }): void => {
      if (m.kind !== kind) return;
      w.off('message', onMessage);
      w.off('error', reject);
      resolve(m.result as T);
    };
    w.on('message', onMessage);
    w.once('error', reject);
  });
}

async function hammer(sc: Scenario): Promise<Outcome> {
  const clock = new SharedArrayBuffer(8);
  new BigInt64Array(clock)[0] = sc.startClockNs ?? sc.table.startNs;
  const go = new SharedArrayBuffer(4);
  const ready = workers.map((w) => once<unknown>(w, 'ready'));
  const done = workers.map((w) => once<RunResult>(w, 'done'));
  workers.forEach((w, i) => {
    const cmd: RunCommand = {
      kind: 'run',
      table: sc.table.shared,
      clock,
      go,
      seed: 0x1234 + i * 7919,
      ops: sc.ops,
      keys: sc.keys,
      hotKeys: sc.hotKeys ?? 0,
      hotShare: sc.hotShare ?? 0,
      order: sc.order ?? 'random',
      limits: sc.limits,
      maxHits: sc.maxHits,
      maxStepNs: sc.maxStepNs,
    };
    w.postMessage(cmd);
  });
  await Promise.all(ready);
  const goArr = new Int32Array(go);
  Atomics.store(goArr, 0, 1);
  Atomics.notify(goArr, 0);
  const results = await Promise.all(done);
  const admitted = sc.keys.map((_, k) => results.reduce((sum, r) => sum + (r.admittedHits[k] ?? 0), 0));
  return { results, admitted, finalClock: new BigInt64Array(clock)[0] ?? 0n };
}

/** floor(elapsed / T) + b: the most a key may admit with nows in [start, finalClock]. */
function bound(elapsedNs: bigint, l: LimitSpec): number {
  return Number(elapsedNs / l.intervalNs + l.burst);
}

void test('4 workers on ONE key: never more than rate·t + burst, and close to it', async () => {
  const table = new BucketTable({ capacity: 16 });
  const limit: LimitSpec = { intervalNs: 1000n, burst: 50n, start: 'full' };
  const o = await hammer({ table, keys: ['tenant:acme'], limits: [limit], ops: 20_000, maxHits: 3, maxStepNs: 200 });
  const max = bound(o.finalClock - table.startNs, limit);
  const got = o.admitted[0] ?? 0;
  assert.ok(got <= max, `admitted ${got} > bound ${max}`);
  // Offered ~20x the rate: the bucket must not be starved by the races either (sanity, not exactness).
  assert.ok(got >= max * 0.5, `admitted only ${got} of ${max}`);
  assert.equal(
    o.results.every((r) => r.deniedOps > 0),
    true,
  );
});

void test('4 workers on a few keys, global (empty-start) limit: the bound holds per key', async () => {
  const table = new BucketTable({ capacity: 64, startNs: 5_000_000n });
  const limit: LimitSpec = { intervalNs: 700n, burst: 20n, start: 'empty' };
  const keys = ['t:a', 't:b', 't:c', 't:d'];
  const o = await hammer({ table, keys, limits: [limit], ops: 20_000, maxHits: 2, maxStepNs: 100 });
  keys.forEach((key, k) => {
    // Empty at startNs: no burst on top of the refill.
    const max = Number((o.finalClock - table.startNs) / limit.intervalNs);
    const got = o.admitted[k] ?? 0;
    assert.ok(got <= max, `${key}: admitted ${got} > bound ${max}`);
    assert.ok(got >= max * 0.5, `${key}: admitted only ${got} of ${max}`);
  });
});

void test('unlimited-ish limit, clock standing still: every hit counted exactly once', async () => {
  const table = new BucketTable({ capacity: 16, startNs: 0n });
  const limit: LimitSpec = { intervalNs: 1n, burst: 1_000_000_000_000n, start: 'full' };
  const now = 1_000_000n;
  const keys = ['one', 'two'];
  const o = await hammer({ table, keys, limits: [limit], ops: 20_000, maxHits: 5, maxStepNs: 0, startClockNs: now });
  const requested = o.results.reduce((s, r) => s + r.requestedHits, 0);
  assert.equal(
    o.admitted.reduce((a, b) => a + b, 0),
    requested,
  );
  assert.equal(
    o.results.every((r) => r.deniedOps === 0 && r.tableFull === 0),
    true,
  );
  const l = limitFromInterval(limit.intervalNs, limit.burst, limit.start);
  keys.forEach((key, k) => {
    // No lost update: the TAT advanced by exactly the admitted hits.
    const r = table.take(key, l, 0, now);
    assert.equal(BigInt(r.remaining), limit.burst - BigInt(o.admitted[k] ?? 0));
  });
});

void test('every hit counted exactly once on both arithmetic paths: a clock past 2^53 ns, a window past 2^52', async () => {
  // The decision runs on doubles where every value is below 2^53, on bigint elsewhere (bucket-table.ts):
  // both serialize their writes through the same slot sequence word.
  const startNs = 2n ** 53n - 500n;
  const now = startNs + 1_000_000n;
  const limits: LimitSpec[] = [
    { intervalNs: 1n, burst: 1_000_000_000_000n, start: 'full' }, // numbers (the clock split on bigint)
    { intervalNs: 2n ** 20n, burst: 2n ** 35n, start: 'full' }, // D = 2^55: bigint
  ];
  for (const limit of limits) {
    const table = new BucketTable({ capacity: 16, startNs });
    const keys = ['one', 'two'];
    const o = await hammer({ table, keys, limits: [limit], ops: 10_000, maxHits: 5, maxStepNs: 0, startClockNs: now });
    const requested = o.results.reduce((sum, r) => sum + r.requestedHits, 0);
    assert.equal(
      o.admitted.reduce((a, b) => a + b, 0),
      requested,
    );
    const l = limitFromInterval(limit.intervalNs, limit.burst, limit.start);
    keys.forEach((key, k) => {
      const r = table.take(key, l, 0, now);
      assert.equal(BigInt(r.remaining), limit.burst - BigInt(o.admitted[k] ?? 0));
    });
  }
});

void test('concurrent first inserts of the same keys: one bucket per key (exactly b admitted)', async () => {
  const limit: LimitSpec = { intervalNs: 1_000_000_000_000n, burst: 3n, start: 'full' };
  for (let round = 0; round < 6; round++) {
    const table = new BucketTable({ capacity: 2_000 });
    const keys = Array.from({ length: 1_000 }, (_, i) => `ip:10.${round}.${i >> 8}.${i & 255}`);
    // Every worker walks the keys in the same order, 4 times: they race on each key's first insert.
    const o = await hammer({ table, keys, limits: [limit], ops: 4_000, maxHits: 1, maxStepNs: 0, order: 'sweep' });
    assert.equal(table.size(), keys.length);
    keys.forEach((key, k) => {
      assert.equal(o.admitted[k], 3, `${key}: admitted ${o.admitted[k]}, burst 3 (a duplicate bucket admits more)`);
    });
  }
});

void test('churn through a small table (evictions + TableFull): the bound still holds for every key', async () => {
  const table = new BucketTable({ capacity: 32 });
  const limit: LimitSpec = { intervalNs: 2_000n, burst: 3n, start: 'full' };
  const keys = Array.from({ length: 200 }, (_, i) => `k${i}`);
  const o = await hammer({
    table,
    keys,
    limits: [limit],
    ops: 20_000,
    maxHits: 1,
    maxStepNs: 60,
    hotKeys: 4,
    hotShare: 0.5,
  });
  const max = bound(o.finalClock - table.startNs, limit);
  keys.forEach((key, k) => {
    const got = o.admitted[k] ?? 0;
    assert.ok(got <= max, `${key}: admitted ${got} > bound ${max}`);
  });
  assert.ok(table.evictions > 0, 'expected evictions');
  assert.equal(table.size() <= 32, true);
  for (let k = 0; k < 4; k++)
    assert.ok((o.admitted[k] ?? 0) >= max * 0.5, `hot key ${k} starved: ${o.admitted[k]} of ${max}`);
});

void test('two limits racing on one key (re-configuration under contention): no over-admission', async () => {
  const table = new BucketTable({ capacity: 16 });
  const a: LimitSpec = { intervalNs: 1_000n, burst: 20n, start: 'full' };
  const b: LimitSpec = { intervalNs: 1_500n, burst: 10n, start: 'full' };
  const o = await hammer({ table, keys: ['flappy'], limits: [a, b], ops: 10_000, maxHits: 2, maxStepNs: 200 });
  // Level-preserving re-configuration never creates tokens: the faster limit bounds everything.
  const max = bound(o.finalClock - table.startNs, a);
  assert.ok((o.admitted[0] ?? 0) <= max, `admitted ${o.admitted[0]} > ${max}`);
});
