// Worker thread for the concurrency and dead-thread tests: attaches the shared bucket table and
// hammers it on command ('run'), or takes once and stops for good inside that take's claim window
// ('hold': parked until terminated, or running out of memory there). Started through the tsx loader
// by startBucketWorker(); driven by messages from the test.
import { parentPort } from 'node:worker_threads';
import type { ResourceLimits, Worker } from 'node:worker_threads';
import { moduleWorker } from '../../../shared/module-worker.js';
import { BucketTable, setClaimHookForTesting } from '../../../cell-agent/buckets/bucket-table.js';
import type { BucketTableShared } from '../../../cell-agent/buckets/bucket-table.js';
import { limitFromInterval } from '../../../cell-agent/buckets/gcra.js';
import type { GcraLimit, StartPolicy } from '../../../cell-agent/buckets/gcra.js';
import { Rng } from '../../../testkit/random.js';

export interface LimitSpec {
  readonly intervalNs: bigint;
  readonly burst: bigint;
  readonly start: StartPolicy;
}

export interface RunCommand {
  readonly kind: 'run';
  readonly table: BucketTableShared;
  /** BigInt64Array(1): the shared virtual clock, in ns on the table's clock. */
  readonly clock: SharedArrayBuffer;
  /** Int32Array(1): 0 until the test releases all workers at once. */
  readonly go: SharedArrayBuffer;
  readonly seed: number;
  readonly ops: number;
  readonly keys: readonly string[];
  /** Probability (0..1) that an op goes to one of the first `hotKeys` keys. */
  readonly hotKeys: number;
  readonly hotShare: number;
  /** 'sweep': every worker walks the keys in the same order (maximal races on first inserts). */
  readonly order: 'random' | 'sweep';
  /** One limit per op, drawn at random from these (normally one). */
  readonly limits: readonly LimitSpec[];
  readonly maxHits: number;
  /** Each op advances the clock by a random step in [0, maxStepNs] (0: the clock stands still). */
  readonly maxStepNs: number;
}

/** One take, as the 'hold' command runs it. */
export interface TakeSpec {
  readonly key: string;
  readonly limit: LimitSpec;
  readonly hits: number;
  readonly nowNs: bigint;
}

export interface HoldCommand {
  readonly kind: 'hold';
  readonly table: BucketTableShared;
  /** Int32Array(2): [0] becomes 1 + the slot once this thread holds it in a claim's window; [1] stays 0. */
  readonly park: SharedArrayBuffer;
  readonly take: TakeSpec;
  /** 'park': wait there until terminated; 'oom': allocate there until the heap limit kills the thread. */
  readonly death: 'park' | 'oom';
}

/** Starts this file as a worker thread (through tsx: shared/module-worker.ts). */
export function startBucketWorker(resourceLimits?: ResourceLimits): Worker {
  return moduleWorker(import.meta.url, './bucket-worker', resourceLimits === undefined ? {} : { resourceLimits });
}

export interface RunResult {
  readonly admittedHits: number[];
  readonly deniedOps: number;
  readonly tableFull: number;
  readonly requestedHits: number;
}

function run(cmd: RunCommand): RunResult {
  const table = BucketTable.attach(cmd.table);
  const clock = new BigInt64Array(cmd.clock);
  const go = new Int32Array(cmd.go);
  const limits: GcraLimit[] = cmd.limits.map((l) => limitFromInterval(l.intervalNs, l.burst, l.start));
  const random = new Rng(cmd.seed).asRandom();
  const admittedHits = new Array<number>(cmd.keys.length).fill(0);
  let deniedOps = 0;
  let tableFull = 0;
  let requestedHits = 0;
  parentPort?.postMessage({ kind: 'ready' });
  Atomics.wait(go, 0, 0);
  for (let i = 0; i < cmd.ops; i++) {
    const k =
      cmd.order === 'sweep'
        ? i % cmd.keys.length
        : cmd.hotKeys > 0 && random() < cmd.hotShare
          ? Math.floor(random() * cmd.hotKeys)
          : Math.floor(random() * cmd.keys.length);
    const key = cmd.keys[k] ?? '';
    const limit = limits[limits.length === 1 ? 0 : Math.floor(random() * limits.length)];
    if (limit === undefined) throw new Error('no limit');
    const hits = 1 + Math.floor(random() * cmd.maxHits);
    const step = cmd.maxStepNs > 0 ? BigInt(Math.floor(random() * (cmd.maxStepNs + 1))) : 0n;
    const now = step > 0n ? Atomics.add(clock, 0, step) + step : Atomics.load(clock, 0);
    requestedHits += hits;
    const r = table.take(key, limit, hits, now);
    if (r.verdict === 'allow') admittedHits[k] = (admittedHits[k] ?? 0) + hits;
    else if (r.verdict === 'table-full') tableFull++;
    else deniedOps++;
  }
  return { admittedHits, deniedOps, tableFull, requestedHits };
}

/** Takes once; at its first claim the hook stops this thread for good (the take never returns). */
function hold(cmd: HoldCommand): string {
  const table = BucketTable.attach(cmd.table);
  const park = new Int32Array(cmd.park);
  const hog: unknown[] = [];
  setClaimHookForTesting((slot) => {
    Atomics.store(park, 0, slot + 1);
    if (cmd.death === 'oom') for (;;) hog.push(new Array<number>(65_536).fill(slot));
    for (;;) Atomics.wait(park, 1, 0);
  });
  const { key, limit, hits, nowNs } = cmd.take;
  // Only when the take needed no claim (refused, or a report): the test sees its verdict.
  return table.take(key, limitFromInterval(limit.intervalNs, limit.burst, limit.start), hits, nowNs).verdict;
}

parentPort?.on('message', (cmd: RunCommand | HoldCommand) => {
  if (cmd.kind === 'hold') parentPort?.postMessage({ kind: 'unclaimed', verdict: hold(cmd) });
  else parentPort?.postMessage({ kind: 'done', result: run(cmd) });
});
