// `npm run bench -- decision`: the in-process decision, one call at a time, in this process:
//   fixed work          reference: 400 steps of integer arithmetic on locals (no memory, no call): what
//                       the method and the machine add to ANY call of about this length (the timer
//                       reads, interrupts, a neighbour on the core); its p99 / p50 is the method's floor
//   bare CAS            reference: the two cache lines a take touches (a key group's line read, then a
//                       slot's sequence word read and compare-and-swapped, its TAT written, published)
//                       at the same spread of 10,000 positions over a buffer of the table's size: the
//                       memory floor of a take, with no hashing, lookup or GCRA step
//   take()              BucketTable.take with the key as a string (hashed whole)
//   takeKey()           the hot path's take: the same key written in parts into the table's hash stream
//   takeKey() head      the same with the rule's constant head (`bench|remote_address=`) written by
//                       head(): its hash state memoized (what the decision's fast paths do)
//   takeKey() head 256  the same over 256 keys: buckets and strings in the CPU's caches (the code's
//                       cost without the cache misses of a spread of 10,000 keys)
//   decide (fast)       Decider.decide, one descriptor [{remote_address: <ip>}] counted in one local
//                       bucket: the fast path (decideOneLocal)
//   decide (general)    the same requests with `fastPath: false`: plan, levels, evaluate (the path
//                       before the fast path, kept for this comparison)
//   decide (global)     one descriptor [{tenant: <id>}] on a `global: true` rule with static slices (a
//                       tenant quota and its tier cap: the general path)
//   decide (leased)     the same request where the coordinator's entries hold a live leased grant for
//                       each of the 1,000 tenants (CoordinatedQuotas, QuotaOverrides, a lease deadline
//                       far ahead), no tier or domain cap: the global fast path (decideOneGlobal), what
//                       an agent or an embedded replica with coordinators decides on
//   decide (leased, general) the same requests with `fastPath: false`
//   decide 2 (fast)     two descriptors [{limiter: all}], [{remote_address: <ip>}], each counted in a
//                       local bucket (Envoy's two-descriptor check, the embedded registry example):
//                       decideLocals, all or nothing
//   decide 2 (general)  the same requests with `fastPath: false` (the path they took before)
//   check, bytes to bytes (OK) / (refused)  what a serving thread does between reading a request
//                       and writing its answer, as the lean RLS server does it:
//                       decodeRateLimitRequestReused of the request's bytes (one descriptor
//                       [{remote_address: <ip>}]), CheckService.checkInPlace (statistics, the
//                       throttling counts of a refusal) and encodeRateLimitResponse as a framed gRPC
//                       message; (refused): the same addresses under `refused_address`, one request
//                       an hour, so every call after the warm-up is a refusal with its provenance
//                       headers (issue 21: what a refusal costs beside an admission)
//   check, bytes to bytes (refused 256)  the same over 256 of those addresses: clients refused again
//                       and again, whose bucket keys and refused-limit headers the decider keeps
//                       (cell-agent/decide/refused-keys.ts; over the 10,000 it keeps almost none:
//                       each key comes back after ten others of its set)
//   limiter.check()     the embedded limiter (createLimiter, embedded/limiter.ts) with the same local
//                       rule: its wrapper, CheckService and the fast path (issue 17: ≤ 1 µs median).
//                       Its input is built per call as the fastify plugin and express middleware
//                       build it from a request (embedded/http-gate.ts): the peer's address string
//                       through clientAddress() (no trusted proxies: read and returned as it is), then
//                       the default descriptors `[[{ key: 'remote_address', value: client }]]` and the
//                       `{ descriptors }` argument — fresh objects, the address just read, in cache as
//                       in an app that has just handled the request's socket and headers (outside the
//                       single calls' timer; inside the batches' times and alloc B/call, as the app
//                       pays it: ~184 B)
//   limiter.check() reused entry  the row as measured before: ONE descriptor object reused for every
//                       call, its value set to one of 10,000 pre-built address strings that nothing
//                       has read since the last time the spread came round to it (the string's cache
//                       miss is inside the timed call: the benchmark's own, not what an app pays)
//   limiter.checkInPlace() limiter.check()'s input, its answer in the limiter's reused decision object
//   decide (fast) in place Decider.decideInPlace on the fast path: the admission in reused objects
//   limiter.check() 256 limiter.check() over 256 client addresses (the embedded benchmark's count)
//   limiter.check() 2   the two descriptors above through the limiter, built per call as the embedded
//                       README's `both()` builds them ([[{limiter: all}], [{remote_address: client}]])
// Then the embedded benchmark's own measurement (bench/check-cost.ts: CPU time over batches of 10,000
// checks, median batch) over 256 and over 10,000 addresses, in a note: the two benchmarks side by side.
// 10,000 client addresses / 1,000 tenants over tables of 100,000 buckets, every limit far above the
// offered rate but the refused rows' (every call admitted: the cost of deciding; every call of the
// refused rows refused). The request (or key) of a call is set up before its timer starts, as a
// decoder hands one over: in cache, its strings flat; the buckets are wherever the spread of 10,000
// keys leaves them. Each variant runs in rounds interleaved with the
// others (so a noisy neighbour hits all alike); single calls are timed with performance.now() (a
// double: the timer allocates nothing, where process.hrtime.bigint() allocated a BigInt per read, two
// per timed call, so the timer's own garbage brought scavenges into the calls it timed), their times
// kept in a preallocated array, and the cost of the two timer reads (measured alike, ~60–75 ns here)
// is subtracted; batches of 10 calls timed whole (the timer's cost / 10, a slow call still in its
// batch at a tenth of its weight) and of 100 give means per call without the timer. Allocation per call: young-generation bytes over batches of 100 calls (a batch during
// which a scavenge ran is left out, and counted), less an empty batch's.
// Targets (docs/targets.md): take() and a whole decision ≤ 1 µs p99; the embedded decision ≤ 1 µs
// median. (The table before issue 21, a BigInt64 state word, was compared here until that comparison
// was made, bench/README.md: take() 0.85–0.92 × its p50 and p99; its frozen copy is removed.)
import os from 'node:os';
import v8 from 'node:v8';
import { BucketTable } from '../cell-agent/buckets/bucket-table.js';
import { fmix32 } from '../cell-agent/buckets/key-hash.js';
import { limitFromRate } from '../cell-agent/buckets/gcra.js';
import type { ElapsedClock } from '../cell-agent/buckets/elapsed-clock.js';
import { Decider } from '../cell-agent/decide/decide.js';
import { CheckService } from '../cell-agent/decide/check-service.js';
import { StatsWriter, createStatsShared } from '../cell-agent/observe/stats.js';
import { ThrottleCounts } from '../cell-agent/observe/throttle-log.js';
import {
  decodeRateLimitRequestReused,
  encodeRateLimitRequest,
  encodeRateLimitResponse,
} from '../cell-agent/rls/rls-codec.js';
import { createRootLogger } from '../shared/logging.js';
import { CoordinatedQuotas, StaticQuotas } from '../cell-agent/decide/quotas.js';
import { LeaseDeadline, deadlineWriter } from '../cell-agent/lease/lease-deadline.js';
import { QuotaOverrides } from '../cell-agent/lease/quota-overrides.js';
import { parseQuotaFile } from '../cell-agent/decide/quota-file.js';
import { DEFAULT_REQUEST_BOUNDS } from '../cell-agent/decide/request-check.js';
import { compileRules } from '../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../cell-agent/rules/rules-schema.js';
import type { RlsRequest } from '../cell-agent/messages/rls-messages.js';
import { createLimiter } from '../embedded/limiter.js';
import type { CheckInput, Descriptor } from '../embedded/limiter.js';
import { defaultDescriptors } from '../embedded/http-gate.js';
import { clientAddress, parseTrustedProxies } from '../shared/client-address.js';
import { CHECK_COST_RULES, checkCostNs } from './check-cost.js';
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
  - key: limiter
    value: all
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: refused_address
    rate_limit: {unit: hour, requests_per_unit: 1}
`;
const TENANTS = {
  tiers: { big: { rate: 1e9, burst: 1e9 } },
  tenants: Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`t${i}`, { tier: 'big' }])),
};

/** The fixed-work reference's steps (about a take's length here: ~400–450 ns). */
const FIXED_WORK_STEPS = 400;
/** Calls per small batch (the p99 of their means: the method's resolution beside the single calls'). */
const SMALL_BATCH = 10;
const NO_P: Percentiles = { p50: NaN, p90: NaN, p99: NaN, p999: NaN, max: NaN };

interface Variant {
  readonly name: string;
  /** Sets up call i outside the timed region (its key or request, in cache as a decoder leaves it). */
  readonly prepare: (i: number) => void;
  /** Runs the call prepared last. */
  readonly call: () => void;
  /** The single calls' times, preallocated (growing an array while measuring would allocate). */
  readonly single: Float64Array;
  singles: number;
  readonly batchMean: number[];
  readonly smallBatchMean: number[];
  readonly bytes: number[];
}

/** A request whose one entry's value the bench sets before each call. */
interface MutableRequest {
  readonly request: RlsRequest;
  readonly entry: { key: string; value: string };
}

function oneEntryRequest(key: string): MutableRequest {
  const entry = { key, value: '' };
  return {
    entry,
    request: { domain: 'bench', hitsAddend: 0, descriptors: [{ entries: [entry], limit: null, hitsAddend: null }] },
  };
}

function newSpaceUsed(): number {
  for (const s of v8.getHeapSpaceStatistics()) if (s.space_name === 'new_space') return s.space_used_size;
  return 0;
}

export async function runDecisionBench(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
}): Promise<BenchReport> {
  const rounds = opts.smoke ? 4 : 20;
  const perRound = opts.smoke ? 5_000 : 50_000;
  let now = 10_000_000_000n;
  const clock = (): bigint => now;
  // The deciders' clock as a number (what HrtimeClock gives in production), set by the bench with
  // `now`: its read() reads nothing, so the decide rows leave the clock read out as they always did
  // (the limiter.check() rows read the real clock, HrtimeClock, once per check).
  const elapsed: ElapsedClock = { originNs: 0n, elapsed: new Float64Array([Number(now)]), read: () => {} };
  const tick = (): void => {
    now += 1_000n;
    (elapsed.elapsed[0] as number) += 1_000;
  };
  const table = new BucketTable({ capacity: 100_000, seed: 42 });
  const rules = compileRules([parseRulesYaml(RULES, 'bench-rules.yaml')]);
  const quotas = new StaticQuotas(parseQuotaFile(TENANTS), { staticShare: 1, unknownTenant: { kind: 'deny' } });
  const decider = (fastPath: boolean): Decider => {
    const d = new Decider(
      { table, quotas, clock, elapsed },
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
  // A serving thread's check, bytes to bytes (the lean RLS server's work between reading the request
  // and writing the answer): decode into reused objects, CheckService.checkInPlace (statistics,
  // throttling counts), encode as a framed gRPC message. Its decider counts refusals as the agent's
  // does; the counts are drained outside the timed calls, as the worker drains them every second.
  const throttle = new ThrottleCounts();
  const served = new Decider(
    { table, quotas, clock, elapsed, onRefused: (k, hits, why) => throttle.add(k, hits, why) },
    fast.options,
  );
  served.setRules(rules);
  const service = new CheckService(
    served,
    new StatsWriter(createStatsShared(1), 0),
    null,
    createRootLogger({ level: 'silent', name: 'bench' }),
    {
      throttle,
      cell: 'bench',
    },
  );
  let wireRequest: Buffer = Buffer.alloc(0);
  const wire = (key: string): Buffer[] =>
    ips.map((address) =>
      encodeRateLimitRequest({
        domain: 'bench',
        hitsAddend: 0,
        descriptors: [{ entries: [{ key, value: address }], limit: null, hitsAddend: null }],
      }),
    );
  // With coordinators: every tenant holds a leased grant (its own table: the static rows' buckets stay apart).
  const leaseDeadline = LeaseDeadline.create();
  const leaseWriter = deadlineWriter(leaseDeadline, 0n);
  const leaseGeneration = leaseWriter.currentGeneration();
  leaseWriter.renew(Number(now / 1_000_000n) + 3_600_000); // an hour: longer than any run
  const leasedTable = new BucketTable({ capacity: 100_000, seed: 42 });
  const leasedDecider = (fastPath: boolean): Decider => {
    const overrides = new QuotaOverrides(LeaseDeadline.attach(leaseDeadline.shared));
    overrides.apply(
      Array.from({ length: 1000 }, (_, i) => ({
        key: `tenant/t${i}`,
        rate: 1e9,
        burst: 1e9,
        leased: true,
        epoch: 1,
        lease: leaseGeneration,
        floorRate: 1,
        floorBurst: 1,
      })),
    );
    const d = new Decider(
      {
        table: leasedTable,
        quotas: new CoordinatedQuotas(overrides),
        clock,
        elapsed,
        overrides,
        deadline: LeaseDeadline.attach(leaseDeadline.shared),
      },
      {
        bounds: DEFAULT_REQUEST_BOUNDS,
        responseHeaders: false,
        tableFull: 'open',
        staticSlices: false,
        cell: 'bench',
        fastPath,
      },
    );
    d.setRules(rules);
    return d;
  };
  const leasedFast = leasedDecider(true);
  const leasedGeneral = leasedDecider(false);
  const limiter = await createLimiter({
    rules: {
      domain: 'bench',
      descriptors: [
        { key: 'remote_address', rate_limit: { unit: 'second', requests_per_unit: 1e9 } },
        { key: 'limiter', value: 'all', rate_limit: { unit: 'second', requests_per_unit: 1e9 } },
      ],
    },
    tableCapacity: 100_000,
  });
  // Flat strings (a template literal may build a rope; reading a character flattens it), as decoded.
  const flat = (text: string): string => (text.charCodeAt(0) >= 0 ? text : '');
  const ips = Array.from({ length: 10_000 }, (_, i) => flat(`10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`));
  const keys = ips.map((ip) => flat(`bench|remote_address=${ip}`));
  const tenants = Array.from({ length: 1000 }, (_, i) => flat(`t${i}`));
  const limit = limitFromRate(1e9, 1e9, { start: 'full' });
  // A spread of keys, the same sequence for every variant (a stride coprime with the key count).
  const at = (i: number, n: number): number => (i * 7919) % n;
  let admitted = 0;
  let key = '';
  let ip = '';
  const ipReq = oneEntryRequest('remote_address');
  const tenantReq = oneEntryRequest('tenant');
  const checkEntry = { key: 'remote_address', value: '' };
  const checkInput = { descriptors: [[checkEntry]] };
  const pairEntry = { key: 'remote_address', value: '' };
  const pairReq: RlsRequest = {
    domain: 'bench',
    hitsAddend: 0,
    descriptors: [
      { entries: [{ key: 'limiter', value: 'all' }], limit: null, hitsAddend: null },
      { entries: [pairEntry], limit: null, hitsAddend: null },
    ],
  };
  // A request's input as the embedded integrations build it from its peer address (http-gate.ts).
  const noProxies = parseTrustedProxies([]);
  let requestInput: CheckInput = { descriptors: [] };
  const fromRequest = (peer: string): void => {
    const client = clientAddress({ peer, trusted: noProxies, ipv6Prefix: 64 });
    requestInput = { descriptors: defaultDescriptors(client) };
  };
  const bothFromRequest = (peer: string): void => {
    const client = clientAddress({ peer, trusted: noProxies, ipv6Prefix: 64 });
    const both: readonly Descriptor[] = [
      [{ key: 'limiter', value: 'all' }],
      [{ key: 'remote_address', value: client }],
    ];
    requestInput = { descriptors: both };
  };
  const ips256 = ips.slice(0, 256);
  const admittedWire = wire('remote_address');
  const refusedWire = wire('refused_address');
  const refused256 = refusedWire.slice(0, 256);
  /** A check bytes to bytes, counted in `admitted` when it is answered as its row expects. */
  const serve = (expectRefused: boolean) => (): void => {
    const decoded = decodeRateLimitRequestReused(wireRequest);
    if (!decoded.ok) throw new Error(decoded.error);
    const out = service.checkInPlace(decoded.value);
    if (out.kind !== 'answer') throw new Error(out.message);
    const answer = out.encoded ?? encodeRateLimitResponse(out.response, true);
    if (answer.length > 0 && out.overLimit === expectRefused) admitted++;
  };
  const variant = (name: string, prepare: (i: number) => void, call: () => void): Variant => ({
    name,
    prepare,
    call,
    single: new Float64Array(rounds * perRound),
    singles: 0,
    batchMean: [],
    smallBatchMean: [],
    bytes: [],
  });
  /** A bytes-to-bytes row over refused requests; the throttling counts drained as the worker drains them. */
  const refusedRow = (name: string, wires: readonly Buffer[]): Variant =>
    variant(
      name,
      (i) => {
        wireRequest = wires[at(i, wires.length)] ?? wireRequest;
        if (i % 1000 === 0) throttle.drain();
      },
      serve(true),
    );
  const byKey = (i: number): void => {
    key = keys[at(i, keys.length)] ?? '';
  };
  const byIp = (i: number): void => {
    ip = ips[at(i, ips.length)] ?? '';
    spreadIndex = i;
  };
  const takeHead = (): void => {
    const k = table.beginKey();
    if (k === null) throw new Error('the table has a custom hasher');
    k.head('bench|remote_address=');
    k.escaped(ip);
    if (table.takeKeyAt(limit, 1, elapsed.elapsed).allowed) admitted++;
  };
  // The reference CAS's buffer (the table's size, its first fifth the key groups' lines, the rest 32-byte
  // records, as the table lays them out) and 10,000 positions of each, spread as a hash spreads keys.
  const bare = new Int32Array(new SharedArrayBuffer(BucketTable.bytesFor(100_000)));
  const keyWords = Math.floor(bare.length / 5);
  const groupAt = Int32Array.from(
    { length: 10_000 },
    (_, i) => ((fmix32(i + 1) >>> 0) % Math.floor(keyWords / 16)) * 16,
  );
  const recordAt = Int32Array.from(
    { length: 10_000 },
    (_, i) => keyWords + ((fmix32(~i) >>> 0) % Math.floor((bare.length - keyWords) / 8)) * 8,
  );
  let spreadIndex = 0;
  let fixedSink = 0;
  const variants: Variant[] = [
    variant('fixed work', byIp, () => {
      let x = admitted | 1;
      for (let i = 0; i < FIXED_WORK_STEPS; i++) x = (Math.imul(x, 0x9e3779b1) + i) | 0;
      fixedSink ^= x;
      admitted++;
    }),
    variant('bare CAS', byIp, () => {
      // The key group's line, then the slot's record line: read the words, compare-and-swap the
      // sequence word, write the TAT, publish (the seqlock's writes, nothing else).
      const j = at(spreadIndex, groupAt.length);
      const g = groupAt[j] ?? 0;
      const rec = recordAt[j] ?? 0;
      if (Atomics.load(bare, g) === -1) throw new Error('bare CAS: a key word was written');
      const v = Atomics.load(bare, rec);
      const tat = Atomics.load(bare, rec + 1) + 1;
      if (Atomics.compareExchange(bare, rec, v, v + 1) !== v) throw new Error('bare CAS: lost a race alone');
      Atomics.store(bare, rec + 1, tat);
      Atomics.store(bare, rec, v + 2);
      admitted++;
    }),
    variant('take()', byKey, () => {
      if (table.take(key, limit, 1, now).allowed) admitted++;
    }),
    variant('takeKey()', byIp, () => {
      const k = table.beginKey();
      if (k === null) throw new Error('the table has a custom hasher');
      k.raw('bench|remote_address=');
      k.escaped(ip);
      if (table.takeKeyAt(limit, 1, elapsed.elapsed).allowed) admitted++;
    }),
    variant('takeKey() head', byIp, takeHead),
    variant(
      'takeKey() head 256',
      (i) => {
        ip = ips256[at(i, ips256.length)] ?? '';
      },
      takeHead,
    ),
    variant(
      'decide (fast)',
      (i) => {
        ipReq.entry.value = ips[at(i, ips.length)] ?? '';
      },
      () => {
        const r = fast.decide(ipReq.request);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
    ),
    variant(
      'decide (general)',
      (i) => {
        ipReq.entry.value = ips[at(i, ips.length)] ?? '';
      },
      () => {
        const r = general.decide(ipReq.request);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
    ),
    variant(
      'decide (global)',
      (i) => {
        tenantReq.entry.value = tenants[at(i, tenants.length)] ?? '';
      },
      () => {
        const r = fast.decide(tenantReq.request);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
    ),
    variant(
      'decide (leased)',
      (i) => {
        tenantReq.entry.value = tenants[at(i, tenants.length)] ?? '';
      },
      () => {
        const r = leasedFast.decide(tenantReq.request);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
    ),
    variant(
      'decide (leased, general)',
      (i) => {
        tenantReq.entry.value = tenants[at(i, tenants.length)] ?? '';
      },
      () => {
        const r = leasedGeneral.decide(tenantReq.request);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
    ),
    variant(
      'decide 2 (fast)',
      (i) => {
        pairEntry.value = ips[at(i, ips.length)] ?? '';
      },
      () => {
        const r = fast.decide(pairReq);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
    ),
    variant(
      'decide 2 (general)',
      (i) => {
        pairEntry.value = ips[at(i, ips.length)] ?? '';
      },
      () => {
        const r = general.decide(pairReq);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
    ),
    variant(
      'check, bytes to bytes (OK)',
      (i) => {
        wireRequest = admittedWire[at(i, admittedWire.length)] ?? wireRequest;
      },
      serve(false),
    ),
    refusedRow('check, bytes to bytes (refused)', refusedWire),
    refusedRow('check, bytes to bytes (refused 256)', refused256),
    variant(
      'limiter.check()',
      (i) => {
        fromRequest(ips[at(i, ips.length)] ?? '');
      },
      () => {
        if (limiter.check(requestInput).allowed) admitted++;
      },
    ),
    variant(
      'limiter.check() reused entry',
      (i) => {
        checkEntry.value = ips[at(i, ips.length)] ?? '';
      },
      () => {
        if (limiter.check(checkInput).allowed) admitted++;
      },
    ),
    variant(
      'limiter.checkInPlace()',
      (i) => {
        fromRequest(ips[at(i, ips.length)] ?? '');
      },
      () => {
        if (limiter.checkInPlace(requestInput).allowed) admitted++;
      },
    ),
    variant(
      'decide (fast) in place',
      (i) => {
        ipReq.entry.value = ips[at(i, ips.length)] ?? '';
      },
      () => {
        const r = fast.decideInPlace(ipReq.request);
        if (r.ok && !r.decision.overLimit) admitted++;
      },
    ),
    variant(
      'limiter.check() 256',
      (i) => {
        fromRequest(ips256[at(i, ips256.length)] ?? '');
      },
      () => {
        if (limiter.check(requestInput).allowed) admitted++;
      },
    ),
    variant(
      'limiter.check() 2',
      (i) => {
        bothFromRequest(ips[at(i, ips.length)] ?? '');
      },
      () => {
        if (limiter.check(requestInput).allowed) admitted++;
      },
    ),
  ];
  // Warm-up: every bucket created, every function optimized.
  for (const v of variants) {
    for (let i = 0; i < 30_000; i++) {
      tick(); // global buckets start empty: they refill as time passes
      v.prepare(i);
      v.call();
    }
  }
  admitted = 0; // (the first check of each tenant, on its new empty bucket, is refused by design)
  const timer = new Float64Array(100_000);
  for (let i = 0; i < timer.length; i++) {
    const s = performance.now();
    timer[i] = (performance.now() - s) * 1e6;
  }
  const timerNs = percentiles(timer).p50;
  // The young-generation bytes an empty batch shows (the statistics call itself).
  const emptyBytes: number[] = [];
  for (let i = 0; i < 200; i++) {
    const u0 = newSpaceUsed();
    const u1 = newSpaceUsed();
    if (u1 >= u0) emptyBytes.push(u1 - u0);
  }
  const baseBytes = percentiles(Float64Array.from(emptyBytes)).p50;
  // A batch whose young generation shrank met a scavenge.
  let gcBatches = 0;
  let batches = 0;
  let calls = 0;
  for (let round = 0; round < rounds; round++) {
    for (const v of variants) {
      for (let i = 0; i < perRound; i++) {
        tick();
        v.prepare(i + round);
        const s = performance.now();
        v.call();
        v.single[v.singles++] = Math.max(0, (performance.now() - s) * 1e6 - timerNs);
      }
      // Batches of SMALL_BATCH calls: the timer's cost (and its noise) divided by SMALL_BATCH, a
      // slow call (a scavenge, a preemption) still in its batch's mean at 1/SMALL_BATCH of its weight.
      for (let b = 0; b < perRound / SMALL_BATCH; b++) {
        tick();
        const s = performance.now();
        for (let i = 0; i < SMALL_BATCH; i++) {
          v.prepare(b * SMALL_BATCH + i + round);
          v.call();
        }
        v.smallBatchMean.push(((performance.now() - s) * 1e6) / SMALL_BATCH);
      }
      for (let b = 0; b < perRound / 100; b++) {
        tick();
        const u0 = newSpaceUsed();
        const s = performance.now();
        for (let i = 0; i < 100; i++) {
          v.prepare(b * 100 + i + round);
          v.call();
        }
        const t = (performance.now() - s) * 1e6;
        const u1 = newSpaceUsed();
        v.batchMean.push(t / 100);
        batches++;
        if (u1 >= u0) v.bytes.push(Math.max(0, u1 - u0 - baseBytes) / 100);
        else gcBatches++;
      }
      calls += 3 * perRound;
    }
    if (round % 5 === 4 || round === rounds - 1) opts.progress(`round ${round + 1}/${rounds}`);
  }
  await limiter.close();
  // The embedded benchmark's measurement, in this run (its own limiter: a fresh table, as there).
  const costs: string[] = [];
  for (const addresses of [256, 10_000]) {
    for (const levels of [1, 2] as const) {
      const l = await createLimiter({ rules: CHECK_COST_RULES, tableCapacity: 100_000 });
      checkCostNs(l, { levels, addresses, iterations: opts.smoke ? 20_000 : 100_000 }); // warm-up
      const ns = checkCostNs(l, { levels, addresses, iterations: opts.smoke ? 50_000 : 500_000 });
      costs.push(
        `${levels} level${levels === 1 ? '' : 's'} over ${addresses.toLocaleString('en')} addresses ${Math.round(ns)} ns`,
      );
      await l.close();
    }
  }
  // (The fixed work's result is kept and read, so that the compiler cannot drop its loop.)
  if (!Number.isSafeInteger(fixedSink)) throw new Error('fixed work: no result');
  if (admitted !== calls) {
    throw new Error(
      `expected every measured call admitted (refused in the refused rows), ${calls - admitted} answered otherwise`,
    );
  }
  const stats = variants.map((v) => ({
    v,
    single: percentiles(v.single.subarray(0, v.singles)),
    batch: percentiles(Float64Array.from(v.batchMean)),
    small: percentiles(Float64Array.from(v.smallBatchMean)),
    bytes: percentiles(Float64Array.from(v.bytes)),
  }));
  const ns = (p: Percentiles, q: keyof Percentiles): number => Math.round(p[q]);
  const byName = (n: string): { single: Percentiles; batch: Percentiles } | undefined =>
    stats.find((s) => s.v.name === n);
  const ratio = (after: string, was: string, q: 'p50' | 'p99', qWas: 'p50' | 'p99' = q): string => {
    const a = byName(after);
    const b = byName(was);
    return a === undefined || b === undefined ? '?' : (a.single[q] / b.single[qWas]).toFixed(2);
  };
  const fastP = byName('decide (fast)');
  const generalP = byName('decide (general)');
  const cpuLine = `the embedded benchmark's measurement of check() (bench/check-cost.ts: CPU time per call, median of batches of 10,000 back-to-back calls) in this run: ${costs.join('; ')}.`;
  return {
    name: 'decision',
    title: 'In-process decision: one call at a time',
    rows: stats.map(({ v, single, batch, small, bytes }) => ({
      call: v.name,
      'p50 ns': ns(single, 'p50'),
      'p99 ns': ns(single, 'p99'),
      'p99.9 ns': ns(single, 'p999'),
      [`batch of ${SMALL_BATCH} mean p50 ns`]: ns(small, 'p50'),
      [`batch of ${SMALL_BATCH} mean p99 ns`]: ns(small, 'p99'),
      'batch mean p50 ns': ns(batch, 'p50'),
      'batch mean p99 ns': ns(batch, 'p99'),
      'alloc B/call': Math.round(bytes.p50),
    })),
    notes: [
      machineLine(),
      `${rounds} rounds × ${perRound.toLocaleString('en')} single calls (performance.now(), the timer allocates nothing) + ${perRound.toLocaleString('en')} in batches of ${SMALL_BATCH} + ${perRound.toLocaleString('en')} in batches of 100 per variant, interleaved; timer cost ${timerNs} ns subtracted from single calls; load average ${os.loadavg()[0]?.toFixed(2)} at the end.`,
      `the method's floor: fixed work p99 / p50 ${ratio('fixed work', 'fixed work', 'p99', 'p50')} (the timer, interrupts and neighbours add that much to any call's p99); the memory floor of a take at this spread (bare CAS) p50 ${ns(byName('bare CAS')?.single ?? NO_P, 'p50')}, p99 ${ns(byName('bare CAS')?.single ?? NO_P, 'p99')} ns; takeKey() head over 10,000 / 256 keys p50 ${ratio('takeKey() head', 'takeKey() head 256', 'p50')}, p99 ${ratio('takeKey() head', 'takeKey() head 256', 'p99')} (what the cache misses of the spread cost).`,
      `one leased global quota, fast / general path: p50 ${ratio('decide (leased)', 'decide (leased, general)', 'p50')}, p99 ${ratio('decide (leased)', 'decide (leased, general)', 'p99')}; two descriptors, fast / general path: p50 ${ratio('decide 2 (fast)', 'decide 2 (general)', 'p50')}, p99 ${ratio('decide 2 (fast)', 'decide 2 (general)', 'p99')}; limiter.check() 256 / 10,000 addresses: p50 ${ratio('limiter.check() 256', 'limiter.check()', 'p50')}; over 10,000 addresses, the input built per call from the address / one reused entry set to a pre-built string: p50 ${ratio('limiter.check()', 'limiter.check() reused entry', 'p50')}, p99 ${ratio('limiter.check()', 'limiter.check() reused entry', 'p99')}.`,
      cpuLine,
      fastP !== undefined && generalP !== undefined
        ? `decide fast / general path: p50 ${(fastP.single.p50 / generalP.single.p50).toFixed(2)}, p99 ${(fastP.single.p99 / generalP.single.p99).toFixed(2)}; target take() and decision ≤ 1,000 ns p99, limiter.check() ≤ 1,000 ns median.`
        : '',
      `batches of 100 calls during which a scavenge ran: ${gcBatches} of ${batches} (the single calls' p99 is one call in 100: a scavenge every ${gcBatches > 0 ? Math.round((batches * 100) / gcBatches).toLocaleString('en') : 'n/a'} calls cannot make it).`,
    ].filter((n) => n !== ''),
  };
}
