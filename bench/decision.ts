// `npm run bench -- decision`: the in-process decision, one call at a time, in this process:
//   take()             BucketTable.take with the key as a string (hashed whole)
//   takeKey()          the hot path's take: the same key written in parts into the table's hash stream
//   decide (fast)      Decider.decide, one descriptor [{remote_address: <ip>}] counted in one local
//                      bucket: the fast path (decideOneLocal)
//   decide (general)   the same requests with `fastPath: false`: plan, levels, evaluate (today's path
//                      before the fast path, kept for this comparison)
//   decide (global)    one descriptor [{tenant: <id>}] on a `global: true` rule with static slices (a
//                      tenant quota and its tier cap: the general path)
// 10,000 client addresses / 1,000 tenants over a table of 100,000 buckets, every limit far above the
// offered rate (every call admitted: the cost of deciding). Each variant runs in rounds interleaved
// with the others (so a noisy neighbour hits all alike); single calls are timed with
// process.hrtime.bigint() and the cost of the two timer reads (measured alike) is subtracted; a
// batch's mean per call has no timer cost. Target (docs/targets.md): take() and a whole decision
// ≤ 1 µs p99.
import os from 'node:os';
import { BucketTable } from '../cell-agent/buckets/bucket-table.js';
import { limitFromRate } from '../cell-agent/buckets/gcra.js';
import { Decider } from '../cell-agent/decide/decide.js';
import { parseQuotaFile } from '../cell-agent/decide/quota-file.js';
import { StaticQuotas } from '../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../cell-agent/decide/request-check.js';
import { compileRules } from '../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../cell-agent/rules/rules-schema.js';
import type { RlsRequest } from '../cell-agent/messages/rls-messages.js';
import { percentiles } from './agent-memory.js';
import type { Percentiles } from './agent-memory.js';
import { machineLine } from './bench-report.js';
import type { BenchReport } from './bench-report.js';

const RULES = `domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: tenant
    global: true
`;
const TENANTS = {
  tiers: { big: { rate: 1e9, burst: 1e9 } },
  tenants: Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`t${i}`, { tier: 'big' }])),
};

interface Variant {
  readonly name: string;
  /** Runs call i (its own key and request). */
  readonly call: (i: number) => void;
  readonly single: number[];
  readonly batchMean: number[];
}

export function runDecisionBench(opts: { smoke: boolean; progress: (msg: string) => void }): BenchReport {
  const rounds = opts.smoke ? 4 : 20;
  const perRound = opts.smoke ? 5_000 : 50_000;
  let now = 10_000_000_000n;
  const clock = (): bigint => now;
  const table = new BucketTable({ capacity: 100_000, seed: 42 });
  const rules = compileRules([parseRulesYaml(RULES, 'bench-rules.yaml')]);
  const quotas = new StaticQuotas(parseQuotaFile(TENANTS), { staticShare: 1, unknownTenant: { kind: 'deny' } });
  const decider = (fastPath: boolean): Decider => {
    const d = new Decider(
      { table, quotas, clock },
      {
        bounds: DEFAULT_REQUEST_BOUNDS,
        responseHeaders: false,
        tableFull: 'open',
        staticSlices: true,
        cell: 'bench',
        fastPath,
      },
    );
    d.setRules(rules);
    return d;
  };
  const fast = decider(true);
  const general = decider(false);
  const ips = Array.from({ length: 10_000 }, (_, i) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`);
  const keys = ips.map((ip) => `bench|remote_address=${ip}`);
  const ipRequests: RlsRequest[] = ips.map((ip) => ({
    domain: 'bench',
    hitsAddend: 0,
    descriptors: [{ entries: [{ key: 'remote_address', value: ip }], limit: null, hitsAddend: null }],
  }));
  const tenantRequests: RlsRequest[] = Array.from({ length: 1000 }, (_, i) => ({
    domain: 'bench',
    hitsAddend: 0,
    descriptors: [{ entries: [{ key: 'tenant', value: `t${i}` }], limit: null, hitsAddend: null }],
  }));
  const limit = limitFromRate(1e9, 1e9, { start: 'full' });
  // A spread of keys, the same sequence for every variant (a stride coprime with the key count).
  const at = (i: number, n: number): number => (i * 7919) % n;
  let admitted = 0;
  const variants: Variant[] = [
    {
      name: 'take()',
      call: (i) => {
        if (table.take(keys[at(i, keys.length)] ?? '', limit, 1, now).allowed) admitted++;
      },
      single: [],
      batchMean: [],
    },
    {
      name: 'takeKey()',
      call: (i) => {
        const k = table.beginKey();
        if (k === null) throw new Error('the table has a custom hasher');
        k.raw('bench|remote_address=');
        k.escaped(ips[at(i, ips.length)] ?? '');
        if (table.takeKey(limit, 1, now).allowed) admitted++;
      },
      single: [],
      batchMean: [],
    },
    {
      name: 'decide (fast)',
      call: (i) => {
        const r = fast.decide(ipRequests[at(i, ipRequests.length)] as RlsRequest);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
      single: [],
      batchMean: [],
    },
    {
      name: 'decide (general)',
      call: (i) => {
        const r = general.decide(ipRequests[at(i, ipRequests.length)] as RlsRequest);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
      single: [],
      batchMean: [],
    },
    {
      name: 'decide (global)',
      call: (i) => {
        const r = fast.decide(tenantRequests[at(i, tenantRequests.length)] as RlsRequest);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
      single: [],
      batchMean: [],
    },
  ];
  // Warm-up: every bucket created, every function optimized.
  for (const v of variants) {
    for (let i = 0; i < 30_000; i++) {
      now += 1_000n; // global buckets start empty: they refill as time passes
      v.call(i);
    }
  }
  admitted = 0; // (the first check of each tenant, on its new empty bucket, is refused by design)
  const timer = new Float64Array(100_000);
  for (let i = 0; i < timer.length; i++) {
    const s = process.hrtime.bigint();
    timer[i] = Number(process.hrtime.bigint() - s);
  }
  const timerNs = percentiles(timer).p50;
  let calls = 0;
  for (let round = 0; round < rounds; round++) {
    for (const v of variants) {
      for (let i = 0; i < perRound; i++) {
        now += 1_000n;
        const s = process.hrtime.bigint();
        v.call(i + round);
        v.single.push(Math.max(0, Number(process.hrtime.bigint() - s) - timerNs));
      }
      for (let b = 0; b < perRound / 100; b++) {
        now += 1_000n;
        const s = process.hrtime.bigint();
        for (let i = 0; i < 100; i++) v.call(b * 100 + i + round);
        v.batchMean.push(Number(process.hrtime.bigint() - s) / 100);
      }
      calls += 2 * perRound;
    }
    if (round % 5 === 4 || round === rounds - 1) opts.progress(`round ${round + 1}/${rounds}`);
  }
  if (admitted !== calls) throw new Error(`expected every measured call admitted, ${calls - admitted} refused`);
  const stats = variants.map((v) => ({
    v,
    single: percentiles(Float64Array.from(v.single)),
    batch: percentiles(Float64Array.from(v.batchMean)),
  }));
  const ns = (p: Percentiles, q: keyof Percentiles): number => Math.round(p[q]);
  const byName = (n: string): { single: Percentiles; batch: Percentiles } | undefined =>
    stats.find((s) => s.v.name === n);
  const fastP = byName('decide (fast)');
  const generalP = byName('decide (general)');
  return {
    name: 'decision',
    title: 'In-process decision: one call at a time',
    rows: stats.map(({ v, single, batch }) => ({
      call: v.name,
      'p50 ns': ns(single, 'p50'),
      'p99 ns': ns(single, 'p99'),
      'p99.9 ns': ns(single, 'p999'),
      'batch mean p50 ns': ns(batch, 'p50'),
      'batch mean p99 ns': ns(batch, 'p99'),
    })),
    notes: [
      machineLine(),
      `${rounds} rounds × ${perRound.toLocaleString('en')} single calls + ${perRound.toLocaleString('en')} in batches of 100 per variant, interleaved; timer cost ${timerNs} ns subtracted from single calls; load average ${os.loadavg()[0]?.toFixed(2)} at the end.`,
      fastP !== undefined && generalP !== undefined
        ? `decide fast / general path: p50 ${(fastP.single.p50 / generalP.single.p50).toFixed(2)}, p99 ${(fastP.single.p99 / generalP.single.p99).toFixed(2)}; target take() and decision ≤ 1,000 ns p99.`
        : '',
    ].filter((n) => n !== ''),
  };
}
