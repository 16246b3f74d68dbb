// A thread that stops for good inside a claim's window (between the claim of a slot and its
// publish) must not leave that slot, or the insert stripe it held, locked for the others: a waiter
// gives up after its bound (the take is refused as busy: 'deny', counted, never 'table-full', which
// the default --table-full open would admit), and once the thread is gone, releaseThread — what the agent's supervisor
// (cell-agent/agent-workers.ts) calls on a worker's 'exit' — restores the slot. Real worker threads
// are stopped inside the window (a test hook parks them there): terminated, or killed by
// ERR_WORKER_OUT_OF_MEMORY. After the release every bucket reports exactly what a table that never
// saw the interrupted take reports (the property at the end), so no count moves and the bound holds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import type { ThreadRelease } from '../../../cell-agent/buckets/bucket-table.js';
import { limitFromInterval } from '../../../cell-agent/buckets/gcra.js';
import type { GcraLimit } from '../../../cell-agent/buckets/gcra.js';
import { waitFor } from '../../../testkit/wait.js';
import { startBucketWorker } from './bucket-worker.js';
import type { HoldCommand, LimitSpec, TakeSpec } from './bucket-worker.js';

const NOW = 1_000_000n;
const A: LimitSpec = { intervalNs: 1_000n, burst: 100n, start: 'full' };
const B: LimitSpec = { intervalNs: 2_000n, burst: 40n, start: 'full' };

const limitOf = (l: LimitSpec): GcraLimit => limitFromInterval(l.intervalNs, l.burst, l.start);

interface Stopped {
  /** What the supervisor's releaseThread found, or null if the take needed no claim. */
  readonly released: ThreadRelease | null;
  /** The take's verdict when it needed no claim (so the thread did not stop in a window). */
  readonly verdict: string | null;
  /** The worker's error code ('ERR_WORKER_OUT_OF_MEMORY' for an out-of-memory death). */
  readonly errorCode: string | null;
}

/**
 * A worker thread runs `take` on the table and stops for good at its first claim (`death`). While it
 * holds the claim, `whileHeld` runs in this thread; after its exit, releaseThread releases its hold.
 */
async function stopInWindow(
  table: BucketTable,
  take: TakeSpec,
  death: HoldCommand['death'],
  whileHeld: () => void = () => {},
): Promise<Stopped> {
  const worker = startBucketWorker(death === 'oom' ? { maxOldGenerationSizeMb: 48 } : undefined);
  const threadId = worker.threadId;
  const park = new Int32Array(new SharedArrayBuffer(8));
  let errorCode: string | null = null;
  let verdict: string | null = null;
  worker.on('error', (e: Error & { code?: string }) => {
    errorCode = e.code ?? e.message;
  });
  worker.on('message', (m: { kind: string; verdict?: string }) => {
    if (m.kind === 'unclaimed') verdict = m.verdict ?? null;
  });
  const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
  worker.postMessage({ kind: 'hold', table: table.shared, park: park.buffer, take, death } satisfies HoldCommand);
  const held = await waitFor('the worker in a claim window, or its take done', () =>
    Atomics.load(park, 0) !== 0 ? 'held' : verdict !== null ? 'done' : null,
  );
  if (held === 'done') {
    await worker.terminate();
    await exited;
    return { released: table.releaseThread(threadId), verdict, errorCode };
  }
  whileHeld();
  if (death === 'park') await worker.terminate();
  await exited;
  return { released: table.releaseThread(threadId), verdict: null, errorCode };
}

void test('a worker terminated holding an admission: waiters are refused as busy; released, the bucket is as before the claim', async () => {
  const table = new BucketTable({ capacity: 64, seed: 11 });
  const a = limitOf(A);
  assert.equal(table.take('k', a, 30, NOW).verdict, 'allow');
  let whileHeld = '';
  let retryNs = 0n;
  const stopped = await stopInWindow(table, { key: 'k', limit: A, hits: 5, nowNs: NOW }, 'park', () => {
    // Bounded: no admission on a slot whose writer does not publish, and no endless spin.
    const r = table.take('k', a, 1, NOW);
    whileHeld = r.verdict;
    retryNs = r.retryAfterNs;
  });
  assert.equal(whileHeld, 'deny');
  assert.ok(retryNs > 0n && retryNs <= 1_000_000_000n, `busy retry ${retryNs} ns`);
  assert.equal(table.busyRefusals, 1);
  assert.equal(stopped.released?.claim, 'admit');
  assert.equal(stopped.released?.stripes, 0);
  // The interrupted admission never counted: exactly 70 left, all of them takeable, then none.
  assert.equal(table.take('k', a, 0, NOW).remaining, 70);
  assert.equal(table.take('k', a, 70, NOW).verdict, 'allow');
  assert.equal(table.take('k', a, 1, NOW).verdict, 'deny');
  assert.equal(table.size(), 1);
});

void test('a worker out of memory while re-configuring a bucket: the old limit and level are back', async () => {
  const table = new BucketTable({ capacity: 64, seed: 12 });
  const a = limitOf(A);
  assert.equal(table.take('k', a, 10, NOW).verdict, 'allow');
  const stopped = await stopInWindow(table, { key: 'k', limit: B, hits: 0, nowNs: NOW }, 'oom');
  assert.equal(stopped.errorCode, 'ERR_WORKER_OUT_OF_MEMORY');
  assert.equal(stopped.released?.claim, 're-configure');
  assert.equal(table.keptUnder('k', limitOf(A)), true);
  assert.equal(table.take('k', a, 0, NOW).remaining, 90);
  // Re-configured now by this thread, as the dead one would have: level kept, clamped to B's burst.
  assert.equal(table.take('k', limitOf(B), 0, NOW).remaining, 40);
});

void test('a worker terminated inside an insert: its stripe is released and the key gets a bucket', async () => {
  const table = new BucketTable({ capacity: 64, seed: 13 });
  const a = limitOf(A);
  let whileHeld = '';
  const stopped = await stopInWindow(table, { key: 'new', limit: A, hits: 1, nowNs: NOW }, 'park', () => {
    // The same key's insert waits on the dead thread's stripe, then is refused as busy.
    whileHeld = table.take('new', a, 1, NOW).verdict;
  });
  assert.equal(whileHeld, 'deny');
  assert.deepEqual(
    { claim: stopped.released?.claim, stripes: stopped.released?.stripes },
    { claim: 'insert', stripes: 1 },
  );
  assert.equal(table.has('new'), false);
  assert.equal(table.take('new', a, 1, NOW).remaining, 99);
  assert.equal(table.has('new'), true);
});

void test('a worker terminated inside an eviction: the slot goes DEAD, and is the first one evicted', async () => {
  // Capacity 1: a second key must evict the first once it is full again.
  const table = new BucketTable({ capacity: 1, seed: 14 });
  const a = limitOf(A);
  assert.equal(table.take('old', a, 1, NOW).verdict, 'allow');
  const later = NOW + A.intervalNs; // 'old' is full again: evictable
  const stopped = await stopInWindow(table, { key: 'new', limit: A, hits: 1, nowNs: later }, 'park');
  assert.deepEqual(
    { claim: stopped.released?.claim, stripes: stopped.released?.stripes },
    { claim: 'evict', stripes: 1 },
  );
  assert.equal(table.has('old'), false);
  assert.equal(table.has('new'), false);
  // The DEAD slot is what the next insert takes; 'old' comes back full (it was full when evicted).
  assert.equal(table.take('old', a, 1, later).remaining, 99);
  assert.equal(table.evictions, 2);
  assert.equal(table.size(), 1);
});

interface Op {
  readonly key: number;
  readonly limit: number;
  readonly hits: number;
  readonly stepNs: number;
}

const LIMITS = [A, B, { intervalNs: 500n, burst: 3n, start: 'full' } as const];
const KEYS = ['k0', 'k1', 'k2', 'k3', 'k4', 'k5'];

void test('property: after any take is stopped in its window and released, every bucket reports as if it never ran', async () => {
  const op = fc.record({
    key: fc.nat(KEYS.length - 1),
    limit: fc.nat(LIMITS.length - 1),
    hits: fc.nat(4),
    stepNs: fc.nat(1_500),
  });
  await fc.assert(
    fc.asyncProperty(
      fc.array(op, { maxLength: 24 }),
      op,
      fc.constantFrom<HoldCommand['death']>('park', 'oom'),
      async (ops: Op[], last: Op, death) => {
        // Capacity 3 for 6 keys: inserts, evictions and re-configurations all happen.
        const real = new BucketTable({ capacity: 3, seed: 99 });
        const model = new BucketTable({ capacity: 3, seed: 99 });
        let now = NOW;
        for (const o of ops) {
          now += BigInt(o.stepNs);
          const l = limitOf(LIMITS[o.limit] ?? A);
          const key = KEYS[o.key] ?? '';
          assert.deepEqual(real.take(key, l, o.hits, now), model.take(key, l, o.hits, now));
        }
        now += BigInt(last.stepNs);
        const spec = LIMITS[last.limit] ?? A;
        const stopped = await stopInWindow(
          real,
          { key: KEYS[last.key] ?? '', limit: spec, hits: last.hits, nowNs: now },
          death,
        );
        if (stopped.verdict !== null) {
          // It needed no claim (refused, or a report): it ran to its end; so does the model's.
          assert.equal(stopped.verdict, model.take(KEYS[last.key] ?? '', limitOf(spec), last.hits, now).verdict);
        } else {
          assert.notEqual(stopped.released?.claim ?? null, null, 'a thread stopped in a window holds a claim');
        }
        for (const key of KEYS) {
          for (const l of LIMITS) {
            // 0-hit reports of 'full' limits create no bucket: the two tables stay comparable.
            const limit = limitOf(l);
            assert.equal(real.take(key, limit, 0, now).remaining, model.take(key, limit, 0, now).remaining, key);
            assert.notEqual(real.take(key, limit, 0, now).verdict, 'table-full', key);
          }
        }
      },
    ),
    { numRuns: 6, seed: 21 },
  );
});
