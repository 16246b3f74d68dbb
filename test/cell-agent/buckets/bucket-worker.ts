// Worker thread for the concurrency tests: attaches the shared bucket table and hammers it on
// command. Started by bucket-concurrency.test.ts through the tsx loader (its startWorker); driven
// by messages from the test.
import { parentPort } from 'node:worker_threads';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
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

parentPort?.on('message', (cmd: RunCommand) => {
  if (cmd.kind !== 'run') return;
  parentPort?.postMessage({ kind: 'done', result: run(cmd) });
});
