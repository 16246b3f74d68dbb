// Agent memory and in-process decision latency of the shared bucket table.
//
//   npx tsx bench/agent-memory.ts                 # 100,000 and 1,000,000 buckets, one child process each
//   npx tsx bench/agent-memory.ts --buckets N     # one size, in this process
//   options: --calls N (timed take() calls, default 1,000,000), --batch N (calls per timed batch, 100)
//
// For each size: a table with capacity N is created and filled with N tenant buckets (a global
// slice limit, 500 req/s, burst 1000); resident memory (RSS) and the SharedArrayBuffer's bytes are
// printed. Then take() is called on random existing tenants, timed with process.hrtime.bigint():
// in batches (per-call mean of each batch: no timer overhead in the figure) and one call at a time
// (timer overhead, measured alike on an empty call, subtracted). Report only: no assertion; the
// target (1M buckets < 256 MiB, decision ≤ 1 µs p99 on production hardware) is for the reader.
// JSON at the end (last line of stdout).
import { spawnSync } from 'node:child_process';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import os from 'node:os';
import { BucketTable } from '../cell-agent/buckets/bucket-table.js';
import { limitFromRate } from '../cell-agent/buckets/gcra.js';
import type { BenchReport } from './bench-report.js';
import { Rng } from '../testkit/random.js';

const MiB = 1024 * 1024;

export interface SizeResult {
  readonly buckets: number;
  readonly sabBytes: number;
  readonly sabMiB: number;
  readonly bytesPerBucket: number;
  readonly rssBaselineMiB: number;
  readonly rssMiB: number;
  readonly rssDeltaMiB: number;
  readonly heapUsedMiB: number;
  readonly fillMs: number;
  readonly filled: number;
  readonly tableFull: number;
  readonly latency: LatencyResult;
}

export interface LatencyResult {
  readonly calls: number;
  readonly batch: number;
  /** Per-call mean within each batch of `batch` calls, ns. */
  readonly batchMeanNs: Percentiles;
  /** Single calls, timer overhead subtracted, ns. */
  readonly singleCallNs: Percentiles;
  readonly timerOverheadNs: number;
  readonly allowedShare: number;
}

export interface Percentiles {
  readonly p50: number;
  readonly p90: number;
  readonly p99: number;
  readonly p999: number;
  readonly max: number;
}

export function percentiles(samples: Float64Array): Percentiles {
  const s = Float64Array.from(samples).sort();
  const at = (q: number): number => Math.round((s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? 0) * 10) / 10;
  return { p50: at(0.5), p90: at(0.9), p99: at(0.99), p999: at(0.999), max: at(1) };
}

function mib(bytes: number): number {
  return Math.round((bytes / MiB) * 10) / 10;
}

let sink = 0;

function tenantKey(i: number): string {
  const key = `tenant:${i}`;
  // Reading a character makes V8 flatten a concatenated string now, outside the timed region, as a
  // key decoded from a request would already be flat.
  sink ^= key.charCodeAt(key.length - 1);
  return key;
}

export function measureSize(buckets: number, calls: number, batch: number): SizeResult {
  const rssBaseline = process.memoryUsage().rss;
  const startNs = process.hrtime.bigint();
  const table = new BucketTable({ capacity: buckets, startNs });
  const limit = limitFromRate(500, 1000); // a global slice: starts empty
  const t0 = process.hrtime.bigint();
  let tableFull = 0;
  for (let i = 0; i < buckets; i++) {
    if (table.take(tenantKey(i), limit, 1, t0).verdict === 'table-full') tableFull++;
  }
  const fillMs = Number(process.hrtime.bigint() - t0) / 1e6;
  const mem = process.memoryUsage();
  const sabBytes = table.bytes();

  // Latency on random existing tenants; keys built (outside the timed region) per batch.
  const random = new Rng(0x5eed).asRandom();
  const batches = Math.max(1, Math.floor(calls / batch));
  const batchMean = new Float64Array(batches);
  const keys: string[] = new Array<string>(batch);
  let allowed = 0;
  const base = startNs + 10_000_000_000n; // 10 s after start: buckets have refilled
  let now = base;
  for (let w = 0; w < 20_000; w++) table.take(tenantKey(Math.floor(random() * buckets)), limit, 1, now); // warm-up
  for (let b = 0; b < batches; b++) {
    for (let j = 0; j < batch; j++) keys[j] = tenantKey(Math.floor(random() * buckets));
    now += 1_000n;
    const s = process.hrtime.bigint();
    for (let j = 0; j < batch; j++) if (table.take(keys[j] ?? '', limit, 1, now).allowed) allowed++;
    batchMean[b] = Number(process.hrtime.bigint() - s) / batch;
  }
  // Single calls: each timed alone; the cost of the two timer reads is measured the same way.
  const singles = Math.min(200_000, calls);
  const overhead = new Float64Array(singles);
  for (let i = 0; i < singles; i++) {
    const s = process.hrtime.bigint();
    overhead[i] = Number(process.hrtime.bigint() - s);
  }
  const timerOverheadNs = percentiles(overhead).p50;
  const single = new Float64Array(singles);
  for (let i = 0; i < singles; i++) {
    const key = tenantKey(Math.floor(random() * buckets));
    now += 100n;
    const s = process.hrtime.bigint();
    table.take(key, limit, 1, now);
    single[i] = Math.max(0, Number(process.hrtime.bigint() - s) - timerOverheadNs);
  }
  return {
    buckets,
    sabBytes,
    sabMiB: mib(sabBytes),
    bytesPerBucket: Math.round((sabBytes / buckets) * 10) / 10,
    rssBaselineMiB: mib(rssBaseline),
    rssMiB: mib(mem.rss),
    rssDeltaMiB: mib(mem.rss - rssBaseline),
    heapUsedMiB: mib(mem.heapUsed),
    fillMs: Math.round(fillMs),
    filled: table.size(),
    tableFull,
    latency: {
      calls: batches * batch,
      batch,
      batchMeanNs: percentiles(batchMean),
      singleCallNs: percentiles(single),
      timerOverheadNs,
      allowedShare: Math.round((allowed / (batches * batch)) * 1000) / 1000,
    },
  };
}

function line(r: SizeResult): string {
  const l = r.latency;
  return [
    `${r.buckets.toLocaleString('en')} buckets: SAB ${r.sabMiB} MiB (${r.bytesPerBucket} B/bucket), RSS ${r.rssMiB} MiB (+${r.rssDeltaMiB} MiB over ${r.rssBaselineMiB}), heap ${r.heapUsedMiB} MiB, fill ${r.fillMs} ms, table-full ${r.tableFull}`,
    `  take() over ${l.calls.toLocaleString('en')} calls: batch-of-${l.batch} mean p50 ${l.batchMeanNs.p50} ns, p99 ${l.batchMeanNs.p99} ns, max ${l.batchMeanNs.max} ns; single call p50 ${l.singleCallNs.p50} ns, p99 ${l.singleCallNs.p99} ns, p99.9 ${l.singleCallNs.p999} ns (timer ${l.timerOverheadNs} ns subtracted)`,
  ].join('\n');
}

const SELF = fileURLToPath(import.meta.url);

/** Each size in a child process of its own, so one size's memory does not count in another's RSS. */
export function runSizes(sizes: readonly number[], calls: number, batch: number): SizeResult[] {
  return sizes.map((n) => {
    const child = spawnSync(
      process.execPath,
      [
        ...process.execArgv,
        SELF,
        '--buckets',
        String(n),
        '--calls',
        String(calls),
        '--batch',
        String(batch),
        '--json-only',
      ],
      {
        encoding: 'utf8',
        maxBuffer: 16 * MiB,
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    if (child.status !== 0) throw new Error(`child for ${n} buckets exited with ${child.status}`);
    const last = child.stdout.trim().split('\n').pop() ?? '';
    return JSON.parse(last) as SizeResult;
  });
}

/** For bench/run.ts: the same figures as a BenchReport. */
export function runAgentMemoryBench(opts: { smoke: boolean; progress: (msg: string) => void }): BenchReport {
  const sizes = opts.smoke ? [10_000, 100_000] : [100_000, 1_000_000];
  opts.progress(`sizes ${sizes.join(', ')}`);
  const results = runSizes(sizes, opts.smoke ? 100_000 : 1_000_000, 100);
  return {
    name: 'agent-memory',
    title: 'Agent bucket table: memory and in-process take() latency',
    rows: results.map((r) => ({
      buckets: r.buckets,
      'SAB MiB': r.sabMiB,
      'B/bucket': r.bytesPerBucket,
      'RSS MiB': r.rssMiB,
      'RSS delta MiB': r.rssDeltaMiB,
      'take p50 ns (batch mean)': r.latency.batchMeanNs.p50,
      'take p99 ns (batch mean)': r.latency.batchMeanNs.p99,
      'take p99 ns (single)': r.latency.singleCallNs.p99,
    })),
    notes: [
      'target: 1M buckets < 256 MiB resident; in-process decision ≤ 1 µs p99 (production hardware)',
      `machine: ${os.cpus().length} CPUs`,
    ],
  };
}

function main(): void {
  const { values } = parseArgs({
    options: {
      buckets: { type: 'string', multiple: true },
      calls: { type: 'string', default: '1000000' },
      batch: { type: 'string', default: '100' },
      'json-only': { type: 'boolean', default: false },
    },
  });
  const calls = Number(values.calls);
  const batch = Number(values.batch);
  if (!Number.isSafeInteger(calls) || calls < 1 || !Number.isSafeInteger(batch) || batch < 1)
    throw new RangeError('--calls and --batch take positive integers');
  let results: SizeResult[];
  if (values.buckets !== undefined) {
    const sizes = values.buckets.flatMap((b) => b.split(',')).map((b) => Number(b.replace(/_/g, '')));
    if (sizes.some((n) => !Number.isSafeInteger(n) || n < 1)) throw new RangeError('--buckets takes positive integers');
    results = sizes.map((n) => measureSize(n, calls, batch));
  } else {
    results = runSizes([100_000, 1_000_000], calls, batch);
  }
  if (!values['json-only']) {
    console.log(`agent-memory: ${os.cpus().length} × ${os.cpus()[0]?.model ?? 'cpu'}, Node ${process.version}`);
    for (const r of results) console.log(line(r));
  }
  console.log(
    JSON.stringify(
      values['json-only'] && results.length === 1
        ? results[0]
        : { machine: { cpus: os.cpus().length, node: process.version }, results },
    ),
  );
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === SELF) {
  main();
  if (sink === -1) console.log(''); // keep the flattening reads alive
}
