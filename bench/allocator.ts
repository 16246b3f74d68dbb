// Allocator benchmark: the cost of one rebalancing round, and the size of the Raft entry it makes.
//
//   npm run bench -- allocator            (once bench/run.ts lists it)
//   npx tsx bench/allocator.ts [--smoke]  (stand-alone)
//
// For 10,000 and 100,000 tenants × 4 and 16 cells the columnar input is built directly (not through
// the ledger, so the figure is the allocator's own): tiers of 500 / 5,000 / 50,000 req/s, floors 30%
// of each quota, skewed demands (most tenants well under their quota, 5% over it). The state is first
// brought to convergence by running rounds and applying their grants as acknowledged at once; then
// about 10% of the slices' demands move, and the round that answers them is timed (median of a few
// runs: the allocator does not modify its input, so every run computes the same round). The quiet
// round (no demand moved) is timed too. The entry is `reportAndGrant` with that round's grants,
// encoded by ledger-commands' `encodeCommand` (validation included in its time). One more row adds
// the hierarchy: three tier caps under one domain cap, split at every cell.
import { allocateRound, allocateRoundColumns, AllocatorWorkspace } from '../coordinator/allocator/allocator.js';
import { AllocatorInputBuffers } from '../coordinator/allocator/allocator-input.js';
import type {
  AllocatorCell,
  AllocatorInput,
  AllocatorQuota,
  AllocatorSlices,
} from '../coordinator/allocator/allocator.js';
import { encodeCommand, encodeCommandV1 } from '../coordinator/ledger/ledger-commands.js';
import type { Grant, GrantAck, LedgerCommandInput } from '../coordinator/ledger/ledger-commands.js';
import { DEFAULT_MAX_GRANTS_PER_ROUND, IncrementalAllocatorPolicy } from '../coordinator/lease/incremental-policy.js';
import { allocatorPolicy, buildRoundInput } from '../coordinator/lease/grant-policy.js';
import type { RoundDemands } from '../coordinator/lease/grant-policy.js';
import { Ledger } from '../coordinator/ledger/ledger.js';
import { SelectionScratch, selectGrants } from '../coordinator/lease/grant-selection.js';
import type { GrantSelection } from '../coordinator/lease/grant-selection.js';
import type { BenchReport } from './bench-report.js';
import { Rng } from '../testkit/random.js';

type MutableQuota = { -readonly [K in keyof AllocatorQuota]: AllocatorQuota[K] };

interface World {
  readonly cells: AllocatorCell[];
  readonly quotas: MutableQuota[];
  readonly slices: AllocatorSlices;
  readonly index: Map<string, number>;
  readonly nowMs: number;
}

const TIERS = [
  { name: 'bronze', rate: 500, share: 0.6 },
  { name: 'silver', rate: 5_000, share: 0.3 },
  { name: 'gold', rate: 50_000, share: 0.1 },
];
const FLOOR_FRACTION = 0.3;

export function buildWorld(tenants: number, nCells: number, hierarchy: boolean, seed: number): World {
  const rand = new Rng(seed).asRandom();
  const cells: AllocatorCell[] = Array.from({ length: nCells }, (_, c) => ({
    id: `cell-${c}`,
    hasFloor: true,
    reported: true,
    leaseExpiresAtMs: 10_000,
  }));
  const quotas: MutableQuota[] = [];
  const tierOf: number[] = [];
  const caps: { tier: number; sum: number }[] = TIERS.map((_, tier) => ({ tier, sum: 0 }));
  for (let t = 0; t < tenants; t++) {
    const x = rand();
    const tier = x < 0.6 ? 0 : x < 0.9 ? 1 : 2;
    const rate = (TIERS[tier] as { rate: number }).rate;
    (caps[tier] as { sum: number }).sum += rate;
    tierOf.push(tier);
    quotas.push(
      quota(
        `tenant/t${t}`,
        rate,
        rate * 2,
        nCells,
        hierarchy ? `tier/${(TIERS[tier] as { name: string }).name}` : null,
      ),
    );
  }
  if (hierarchy) {
    // Tier caps at 40% of the sum of their tenants' quotas (they bind for busy tiers), the domain cap
    // at 80% of the tier caps' sum.
    let domain = 0;
    for (const c of caps) {
      const r = 0.4 * c.sum;
      domain += r;
      quotas.push(quota(`tier/${(TIERS[c.tier] as { name: string }).name}`, r, r, nCells, 'domain/api'));
    }
    quotas.push(quota('domain/api', 0.8 * domain, 0.8 * domain, nCells, null));
  }
  const nq = quotas.length;
  const size = nq * nCells;
  const slices: AllocatorSlices = {
    grantRate: new Float64Array(size),
    grantBurst: new Float64Array(size),
    epoch: new Float64Array(size),
    acknowledged: new Uint8Array(size).fill(1),
    countedRate: new Float64Array(size),
    countedBurst: new Float64Array(size),
    demand: new Float64Array(size),
  };
  // Every cell starts on its floors.
  quotas.forEach((q, qi) => {
    for (let c = 0; c < nCells; c++) {
      slices.countedRate[qi * nCells + c] = q.floorRate;
      slices.countedBurst[qi * nCells + c] = q.floorBurst;
    }
  });
  // Demands: most tenants well under their quota, a quarter around it, 5% over; skewed over cells.
  const weights = new Float64Array(nCells);
  for (let t = 0; t < tenants; t++) {
    const q = quotas[t] as MutableQuota;
    const x = rand();
    const frac = x < 0.7 ? rand() * 0.3 : x < 0.95 ? 0.3 + rand() * 0.6 : 1 + rand() * 2;
    let sw = 0;
    for (let c = 0; c < nCells; c++) {
      const w = rand() ** 3;
      weights[c] = w;
      sw += w;
    }
    for (let c = 0; c < nCells; c++)
      slices.demand[t * nCells + c] = sw > 0 ? (frac * q.rate * (weights[c] as number)) / sw : 0;
  }
  if (hierarchy) sumParentDemands(quotas, slices, nCells, tierOf, tenants);
  const index = new Map<string, number>();
  quotas.forEach((q, i) => index.set(q.key, i));
  return { cells, quotas, slices, index, nowMs: 1_000_000 };
}

function quota(key: string, rate: number, burst: number, floorCells: number, parent: string | null): MutableQuota {
  const floorRate = (FLOOR_FRACTION * rate) / floorCells;
  const floorBurst = (FLOOR_FRACTION * burst) / floorCells;
  return {
    key,
    rate,
    burst,
    floorRate,
    floorBurst,
    ceilingRate: rate,
    ceilingBurst: burst,
    countedRate: FLOOR_FRACTION * rate,
    countedBurst: FLOOR_FRACTION * burst,
    parent,
  };
}

/** A cap's demand at a cell is its children's there (what the agent's cap bucket sees). */
function sumParentDemands(
  quotas: MutableQuota[],
  s: AllocatorSlices,
  n: number,
  tierOf: number[],
  tenants: number,
): void {
  const tierBase = tenants;
  const domainRow = tenants + TIERS.length;
  for (let k = tierBase * n; k < (domainRow + 1) * n; k++) s.demand[k] = 0;
  for (let t = 0; t < tenants; t++) {
    const tr = tierBase + (tierOf[t] as number);
    for (let c = 0; c < n; c++) {
      const d = s.demand[t * n + c] as number;
      s.demand[tr * n + c] = (s.demand[tr * n + c] as number) + d;
      s.demand[domainRow * n + c] = (s.demand[domainRow * n + c] as number) + d;
    }
  }
  void quotas;
}

function input(w: World, nowMs: number): AllocatorInput {
  // Every cell reported in the previous round: its lease runs until then + the TTL.
  const cells = w.cells.map((c) => ({ ...c, leaseExpiresAtMs: nowMs - 500 + 3_000 }));
  return { nowMs, leaseTtlMs: 3_000, skewMarginMs: 1_000, cells, quotas: w.quotas, slices: w.slices };
}

/** Applies a round's grants as the ledger would once every cell acknowledged them. */
function applyAcknowledged(w: World, grants: readonly Grant[]): void {
  const n = w.cells.length;
  const cellIdx = new Map(w.cells.map((c, i) => [c.id, i]));
  const touched = new Set<number>();
  for (const g of grants) {
    const qi = w.index.get(g.key) as number;
    const c = cellIdx.get(g.cellId) as number;
    const i = qi * n + c;
    const q = w.quotas[qi] as MutableQuota;
    w.slices.grantRate[i] = g.rate;
    w.slices.grantBurst[i] = g.burst;
    w.slices.epoch[i] = g.epoch;
    w.slices.countedRate[i] = Math.max(q.floorRate, g.rate);
    w.slices.countedBurst[i] = Math.max(q.floorBurst, g.burst);
    touched.add(qi);
  }
  for (const qi of touched) {
    const q = w.quotas[qi] as MutableQuota;
    let r = 0;
    let b = 0;
    for (let c = 0; c < n; c++) {
      r += w.slices.countedRate[qi * n + c] as number;
      b += w.slices.countedBurst[qi * n + c] as number;
    }
    q.countedRate = r;
    q.countedBurst = b;
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
}

const ms = (v: number): number => Math.round(v * 10) / 10;
/** Lease rounds per second at the default --lease-round-ms (100). */
const ROUNDS_PER_S = 10;

function timeRound(
  inp: AllocatorInput,
  runs: number,
  ws: AllocatorWorkspace,
): { ms: number; best: number; cpuMs: number; grants: Grant[] } {
  const times: number[] = [];
  const cpu: number[] = [];
  let grants: Grant[] = [];
  for (let r = 0; r < runs; r++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    grants = allocateRound(inp, ws).grants;
    times.push(performance.now() - t0);
    const c = process.cpuUsage(c0);
    cpu.push((c.user + c.system) / 1000);
  }
  return { ms: median(times), best: Math.min(...times), cpuMs: median(cpu), grants };
}

export interface AllocatorBenchRow {
  readonly tenants: number;
  readonly cells: number;
  readonly hierarchy: boolean;
  readonly slices: number;
  readonly convergeRounds: number;
  readonly baselineMs: number;
  readonly quietMs: number;
  readonly quietCpuMs: number;
  readonly roundMs: number;
  readonly roundBestMs: number;
  readonly roundCpuMs: number;
  readonly changedGrants: number;
  readonly changedPct: number;
  readonly entryBytes: number;
  readonly bytesPerGrant: number;
  readonly encodeMs: number;
}

/**
 * The baseline: one pass reading every input column the allocator reads (the least any allocator
 * over this input has to do), median of `runs`.
 */
function baselinePass(w: World, runs: number): number {
  const s = w.slices;
  const times: number[] = [];
  let sink = 0;
  for (let r = 0; r < runs; r++) {
    const t0 = performance.now();
    let acc = 0;
    const size = w.quotas.length * w.cells.length;
    for (let i = 0; i < size; i++) {
      acc +=
        (s.grantRate[i] as number) +
        (s.grantBurst[i] as number) +
        (s.countedRate[i] as number) +
        (s.countedBurst[i] as number) +
        (s.demand[i] as number) +
        (s.acknowledged[i] as number);
    }
    sink += acc;
    times.push(performance.now() - t0);
  }
  if (sink === -1) console.log(sink); // keep the loop
  return median(times);
}

/** Moves the demand of a fraction `p` of the tenants' slices (deterministically for a given seed). */
function moveDemands(w: World, tenants: number, p: number, seed: number, base: Float64Array, hierarchy: boolean): void {
  const rand = new Rng(seed).asRandom();
  const n = w.cells.length;
  w.slices.demand.set(base);
  for (let t = 0; t < tenants; t++) {
    const q = w.quotas[t] as MutableQuota;
    for (let c = 0; c < n; c++) {
      const x = rand();
      const y = rand();
      if (x >= p) continue;
      const i = t * n + c;
      // A tenant's traffic at a cell falls, rises (by ×3 and 5% of its quota), or jumps anywhere.
      w.slices.demand[i] =
        y < 0.4
          ? (base[i] as number) * 0.2
          : y < 0.8
            ? (base[i] as number) * 3 + 0.05 * q.rate
            : (y - 0.8) * 5 * q.rate;
    }
  }
  if (hierarchy) {
    const tierOf = w.quotas.slice(0, tenants).map((q) => TIERS.findIndex((t) => q.parent === `tier/${t.name}`));
    sumParentDemands(w.quotas, w.slices, n, tierOf, tenants);
  }
}

/** Rounds applied as acknowledged at once, until a round changes nothing (or 12 rounds). */
export function converge(w: World, ws: AllocatorWorkspace): { rounds: number; now: number } {
  let now = w.nowMs;
  let rounds = 0;
  for (; rounds < 12; rounds++) {
    now += 500;
    const out = allocateRound(input(w, now), ws);
    if (out.grants.length === 0) break;
    applyAcknowledged(w, out.grants);
  }
  return { rounds, now: now + 500 };
}

export function measureAllocator(tenants: number, nCells: number, hierarchy: boolean, runs: number): AllocatorBenchRow {
  const w = buildWorld(tenants, nCells, hierarchy, 0xa110c + tenants + nCells);
  const ws = new AllocatorWorkspace(); // one per coordinator, reused by every round
  const { rounds: convergeRounds, now } = converge(w, ws);
  const baselineMs = baselinePass(w, runs);
  const quiet = timeRound(input(w, now), runs, ws);
  // Move demands so that about 10% of the slices get a new grant: try 10% of the slices, then scale
  // the fraction by how many grants that changed.
  const base = w.slices.demand.slice();
  const seed = 0xd1ce + tenants + nCells;
  const slices = w.quotas.length * nCells;
  moveDemands(w, tenants, 0.1, seed, base, hierarchy);
  const probe = allocateRound(input(w, now), ws).grants.length / slices;
  moveDemands(w, tenants, probe > 0 ? Math.min(1, (0.1 * 0.1) / probe) : 0.1, seed, base, hierarchy);
  const moved = timeRound(input(w, now), runs, ws);
  const t0 = performance.now();
  const bytes = encodeCommand({ type: 'reportAndGrant', nowMs: now, grants: moved.grants }).length;
  const encodeMs = performance.now() - t0;
  return {
    tenants,
    cells: nCells,
    hierarchy,
    slices,
    convergeRounds,
    baselineMs: ms(baselineMs),
    quietMs: ms(quiet.ms),
    quietCpuMs: ms(quiet.cpuMs),
    roundMs: ms(moved.ms),
    roundBestMs: ms(moved.best),
    roundCpuMs: ms(moved.cpuMs),
    changedGrants: moved.grants.length,
    changedPct: Math.round((1000 * moved.grants.length) / slices) / 10,
    entryBytes: bytes,
    bytesPerGrant: moved.grants.length > 0 ? Math.round(bytes / moved.grants.length) : 0,
    encodeMs: ms(encodeMs),
  };
}

// ---- incremental rounds and the log -------------------------------------------------------------

/**
 * The columnar input of the rows `rows` only (what the incremental round gathers from the ledger),
 * into `buffers`' columns (allocator-input.ts's AllocatorInputBuffers), reused from round to round as the lease round reuses its input buffers.
 */
export function subInput(
  w: World,
  rows: Int32Array,
  nowMs: number,
  buffers: AllocatorInputBuffers = new AllocatorInputBuffers(),
): AllocatorInput {
  const n = w.cells.length;
  const size = rows.length * n;
  const s = w.slices;
  // The production buffers (allocator-input.ts), as IncrementalAllocatorPolicy reuses them.
  const cols = buffers.ensure(size, 0);
  const sub: AllocatorSlices = {
    grantRate: cols.grantRate.subarray(0, size),
    grantBurst: cols.grantBurst.subarray(0, size),
    epoch: cols.epoch.subarray(0, size),
    acknowledged: cols.acknowledged.subarray(0, size),
    countedRate: cols.countedRate.subarray(0, size),
    countedBurst: cols.countedBurst.subarray(0, size),
    demand: cols.demand.subarray(0, size),
  };
  const quotas: AllocatorQuota[] = new Array<AllocatorQuota>(rows.length);
  // Element by element: a `subarray` per row and column (70,000 views at 10,000 rows) cost more than
  // the copy itself and made the round's garbage.
  for (let j = 0; j < rows.length; j++) {
    const from = (rows[j] as number) * n;
    const at = j * n;
    for (let c = 0; c < n; c++) {
      const i = from + c;
      const o = at + c;
      sub.grantRate[o] = s.grantRate[i] as number;
      sub.grantBurst[o] = s.grantBurst[i] as number;
      sub.epoch[o] = s.epoch[i] as number;
      sub.acknowledged[o] = s.acknowledged[i] as number;
      sub.countedRate[o] = s.countedRate[i] as number;
      sub.countedBurst[o] = s.countedBurst[i] as number;
      sub.demand[o] = s.demand[i] as number;
    }
    quotas[j] = w.quotas[rows[j] as number] as AllocatorQuota;
  }
  return { ...input(w, nowMs), quotas, slices: sub };
}

/** Moves the demands of a fraction `p` of the tenants, at every cell; returns their rows (sorted). */
export function moveTenants(w: World, tenants: number, p: number, seed: number): Int32Array {
  const rand = new Rng(seed).asRandom();
  const n = w.cells.length;
  const rows: number[] = [];
  for (let t = 0; t < tenants; t++) {
    if (rand() >= p) continue;
    rows.push(t);
    const q = w.quotas[t] as MutableQuota;
    for (let c = 0; c < n; c++) {
      const i = t * n + c;
      const y = rand();
      const d = w.slices.demand[i] as number;
      w.slices.demand[i] = y < 0.4 ? d * 0.2 : y < 0.8 ? d * 3 + 0.05 * q.rate : (y - 0.8) * 5 * q.rate;
    }
  }
  return Int32Array.from(rows);
}

/** Untimed incremental rounds before the timed ones (measureIncremental). */
const INCREMENTAL_WARM_UP = 5;

const grantId = (g: Grant): string => `${g.key}|${g.cellId}|${g.rate}|${g.burst}|${g.epoch}`;

export interface IncrementalBenchRow {
  readonly tenants: number;
  readonly cells: number;
  readonly changedTenantsPct: number;
  readonly fullMs: number;
  readonly fullCpuMs: number;
  readonly incrementalMs: number;
  readonly incrementalCpuMs: number;
  readonly quotasComputed: number;
  readonly grants: number;
  readonly sameGrants: boolean;
  /** The round's grants in the object form (format 1, the current log), compact (format 2, float32), and the budgeted round. */
  readonly entryV1Bytes: number;
  readonly entryV2Bytes: number;
  readonly budgetGrants: number;
  readonly budgetEntryBytes: number;
  /** The later acknowledgements of the budgeted round's shrinks (compact). */
  readonly budgetAckBytes: number;
}

/**
 * One round after a fraction of the tenants' demands moved: the full round (every quota: the
 * implementation before the incremental policy, kept as the baseline) against the incremental one
 * (gather the moved quotas' rows, allocate them) — their grants must be identical, since the other
 * quotas are settled — and the round's Raft entry: object form (format 1), compact (format 2, grants
 * rounded to float32 towards the current grant, as the lease round sends them), and within the
 * round budget (DEFAULT_MAX_GRANTS_PER_ROUND, by grantPriority) plus the acknowledgements its
 * shrinks will need.
 */
export function measureIncremental(
  tenants: number,
  nCells: number,
  fraction: number,
  runs: number,
  progress: (m: string) => void = () => undefined,
): IncrementalBenchRow {
  const w = buildWorld(tenants, nCells, false, 0x1ac + tenants + nCells);
  const ws = new AllocatorWorkspace();
  progress(`converging ${tenants} × ${nCells}`);
  const { now } = converge(w, ws);
  const rows = moveTenants(w, tenants, fraction, 0x5eed + tenants);
  progress(`incremental round over ${rows.length} quotas, then the full round over ${tenants}`);
  // The incremental round first: the full round's garbage would otherwise be collected during it.
  // Timed as the lease round does it: gather the rows, allocate them into grant columns, select the
  // grants it sends (float32 towards the current grant, unchanged ones dropped, the budget), with
  // `Grant` objects only for those.
  const ws2 = new AllocatorWorkspace();
  const buf = new AllocatorInputBuffers();
  const scratch = new SelectionScratch();
  const times: number[] = [];
  const cpu: number[] = [];
  const incremental = (): { input: AllocatorInput; sel: GrantSelection } => {
    const inp = subInput(w, rows, now, buf);
    const cols = allocateRoundColumns(inp, ws2).changes;
    return { input: inp, sel: selectGrants(inp, cols, DEFAULT_MAX_GRANTS_PER_ROUND, true, scratch) };
  };
  // Warm-up rounds, untimed: the JIT, and the collections that building and converging the world left due (at
  // 1,000,000 × 16 a ~1 GB heap whose major collection otherwise lands in the first timed rounds: 103 ms against
  // 73 ms in the same quiet sitting); then more timed runs than the full round's, the round being short.
  let { input: incInput, sel } = incremental();
  for (let r = 1; r < INCREMENTAL_WARM_UP; r++) ({ input: incInput, sel } = incremental());
  for (let r = 0; r < runs * 2 + 1; r++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    ({ input: incInput, sel } = incremental());
    times.push(performance.now() - t0);
    const c = process.cpuUsage(c0);
    cpu.push((c.user + c.system) / 1000);
  }
  // Every grant of the incremental round (unrounded, no budget), for the comparison with the full one.
  const inc = allocateRoundColumns(incInput, ws2).changes.grants(incInput);
  const unbudgeted = selectGrants(incInput, allocateRoundColumns(incInput, ws2).changes, Infinity, true).grants;
  const full = timeRound(input(w, now), runs, ws);
  const a = full.grants.map(grantId).sort();
  const b = inc.map(grantId).sort();
  const same = a.length === b.length && a.every((x, i) => x === b[i]);
  const n = w.cells.length;
  const cellIdx = new Map(w.cells.map((c, i) => [c.id, i]));
  const entryV1Bytes = encodeCommandV1({ type: 'reportAndGrant', nowMs: now, grants: full.grants }).length;
  const entryV2Bytes = encodeCommand({ type: 'reportAndGrant', nowMs: now, grants: unbudgeted }).length;
  const budget = sel.grants;
  const budgetEntryBytes = encodeCommand({ type: 'reportAndGrant', nowMs: now, grants: budget }).length;
  const shrinkAcks = budget
    .filter((g) => {
      const i = (w.index.get(g.key) as number) * n + (cellIdx.get(g.cellId) as number);
      return g.rate < (w.slices.grantRate[i] as number) || g.burst < (w.slices.grantBurst[i] as number);
    })
    .map((g) => ({ key: g.key, cellId: g.cellId, epoch: g.epoch }));
  const budgetAckBytes =
    shrinkAcks.length > 0 ? encodeCommand({ type: 'reportAndGrant', nowMs: now, acks: shrinkAcks }).length : 0;
  return {
    tenants,
    cells: nCells,
    changedTenantsPct: Math.round((1000 * rows.length) / tenants) / 10,
    fullMs: ms(full.ms),
    fullCpuMs: ms(full.cpuMs),
    incrementalMs: ms(median(times)),
    incrementalCpuMs: ms(median(cpu)),
    quotasComputed: rows.length,
    grants: inc.length,
    sameGrants: same,
    entryV1Bytes,
    entryV2Bytes,
    budgetGrants: budget.length,
    budgetEntryBytes,
    budgetAckBytes,
  };
}

// ---- the lease round's policy on a real ledger -------------------------------------------------

/** A ledger of `quotas` tenants (one tier) with a slice at each of `nCells` cells (rate 100, burst 200), all leased. */
function policyLedger(
  quotas: number,
  nCells: number,
): { l: Ledger; apply: (cmd: LedgerCommandInput) => void; cellIds: string[]; now: number; ttl: number } {
  const l = new Ledger({ floorCells: nCells });
  let index = 0;
  const apply = (cmd: LedgerCommandInput): void => {
    const r = l.apply(cmd, ++index);
    if (!r.ok) throw new Error(`${cmd.type}: ${r.error.message}`);
  };
  apply({ type: 'putTier', name: 'gold', rate: 5_000, burst: 10_000, floorFraction: FLOOR_FRACTION });
  for (let b = 0; b < quotas; b += 1_000)
    apply({
      type: 'putTenants',
      tenants: Array.from({ length: Math.min(1_000, quotas - b) }, (_, i) => ({ id: `t${b + i}`, tier: 'gold' })),
    });
  const cellIds = Array.from({ length: nCells }, (_, c) => `cell-${c}`);
  for (const c of cellIds) apply({ type: 'registerCell', cellId: c, nowMs: 0 });
  const now = 10_000;
  const ttl = 3_000;
  const grants: Grant[] = [];
  for (let t = 0; t < quotas; t++)
    for (const c of cellIds)
      grants.push({ key: `tenant/t${t}`, cellId: c, rate: 100, burst: 200, epoch: 1, leaseExpiresAtMs: now + ttl });
  apply({
    type: 'reportAndGrant',
    nowMs: now,
    leases: cellIds.map((cellId) => ({ cellId, leaseExpiresAtMs: now + ttl })),
    grants,
  });
  return { l, apply, cellIds, now, ttl };
}

export interface PolicySteadyRow {
  readonly tenants: number;
  readonly cells: number;
  /** Keys whose demand moved per round (median over the measured rounds), and quotas computed. */
  readonly changed: number;
  readonly computed: number;
  readonly cpuMs: number;
  readonly sent: number;
  readonly deferred: number;
}

/**
 * Steady lease rounds on a real ledger, each committed with the previous round's grants
 * acknowledged and every cell reporting every round: converged first (a policy without a budget),
 * then a fresh default policy (its first round full), then `rounds` rounds in each of which a
 * fraction `p` of the tenants' demands move at every cell. Reports per round (medians): keys
 * changed, quotas the policy computed (the working set: changed keys stay until settled and every
 * cell reported since, acknowledged ones come back, deferred ones stay), CPU, grants sent.
 */
export function measurePolicySteady(tenants: number, nCells: number, p: number, rounds: number): PolicySteadyRow {
  const { l, apply, cellIds, ttl } = policyLedger(tenants, nCells);
  let now = 10_100;
  const rand = new Rng(0x57ead + tenants).asRandom();
  const byKey = new Map<string, Map<string, number>>();
  for (let t = 0; t < tenants; t++)
    byKey.set(`tenant/t${t}`, new Map(cellIds.map((c) => [c, rand() * 300] as [string, number])));
  let acks: GrantAck[] = [];
  const round = (policy: IncrementalAllocatorPolicy, changedKeys: Set<string> | undefined): Grant[] => {
    const demands: RoundDemands = { reported: new Set(cellIds), byKey, acks, leaseTtlMs: ttl, changedKeys };
    const grants = policy.policy(l, demands, now);
    const leases = cellIds.map((cellId) => ({ cellId, leaseExpiresAtMs: now + ttl }));
    apply({ type: 'reportAndGrant', nowMs: now, leases, acks, grants });
    acks = grants.map((g) => ({ key: g.key, cellId: g.cellId, epoch: g.epoch }));
    now += 100;
    return grants;
  };
  const converge = new IncrementalAllocatorPolicy({ maxGrantsPerRound: Number.MAX_SAFE_INTEGER });
  for (let r = 0; r < 12 && (r < 2 || acks.length > 0); r++) round(converge, r === 0 ? undefined : new Set());
  const policy = new IncrementalAllocatorPolicy();
  round(policy, undefined);
  round(policy, new Set());
  const changed: number[] = [];
  const computed: number[] = [];
  const cpu: number[] = [];
  const sent: number[] = [];
  const deferred0 = policy.stats.deferredGrants;
  for (let r = 0; r < rounds; r++) {
    const moved = new Set<string>();
    for (let t = 0; t < tenants; t++) {
      if (rand() >= p) continue;
      const key = `tenant/t${t}`;
      moved.add(key);
      const row = byKey.get(key) as Map<string, number>;
      for (const c of cellIds) row.set(c, rand() * 600);
    }
    const c0 = process.cpuUsage();
    const grants = round(policy, moved);
    const c = process.cpuUsage(c0);
    changed.push(moved.size);
    computed.push(policy.stats.lastQuotas);
    cpu.push((c.user + c.system) / 1000);
    sent.push(grants.length);
  }
  return {
    tenants,
    cells: nCells,
    changed: median(changed),
    computed: median(computed),
    cpuMs: ms(median(cpu)),
    sent: median(sent),
    deferred: policy.stats.deferredGrants - deferred0,
  };
}

export interface PolicyBenchRow {
  readonly quotas: number;
  readonly cells: number;
  readonly gatherMs: number;
  readonly gatherCpuMs: number;
  readonly roundMs: number;
  readonly roundCpuMs: number;
  /** A fresh policy's first round (full: every quota, the working set built). */
  readonly firstRoundCpuMs: number;
  /** The stateless full round (grant-policy.ts allocatorPolicy, the reference). */
  readonly referenceCpuMs: number;
  readonly sent: number;
}

/**
 * The lease round as the coordinator runs it, on a real Ledger: `quotas` tenants with a slice at
 * every one of `nCells` cells, every one with a new demand at every cell (so every quota is in the
 * round, as the quotas that moved are in an incremental round: the round's work follows the quotas
 * it computes, not the ledger's size). Timed: an IncrementalAllocatorPolicy round between full rounds
 * (one policy; its first round, full, untimed; then rounds in which every key's demand changed): the
 * gather from the ledger (buildRoundInputOf), the allocator, the selection within the budget, the
 * definition grants; the gather alone (buildRoundInput); a fresh policy's first (full) round; and
 * the stateless full round (allocatorPolicy, the reference) over the same quotas.
 */
export function measurePolicyRound(quotas: number, nCells: number, runs: number): PolicyBenchRow {
  const { l, cellIds, now, ttl } = policyLedger(quotas, nCells);
  const rand = new Rng(0x90 + quotas).asRandom();
  const byKey = new Map<string, Map<string, number>>();
  for (let t = 0; t < quotas; t++)
    byKey.set(`tenant/t${t}`, new Map(cellIds.map((c) => [c, 20 + rand() * 500] as [string, number])));
  const demands: RoundDemands = {
    reported: new Set(cellIds),
    byKey,
    acks: [],
    leaseTtlMs: ttl,
    changedKeys: new Set(byKey.keys()),
  };
  const keys = [...byKey.keys()];
  const gather = timed(runs, () => buildRoundInput(l, demands, now + 100, keys));
  let sent = 0;
  // The lease round as it runs between full rounds: one policy, its first (full) round untimed, then
  // rounds in which every key's demand changed (nothing is applied: every round computes the same).
  const policy = new IncrementalAllocatorPolicy();
  const round = timed(runs, () => {
    sent = policy.policy(l, demands, now + 100).length;
  });
  const first = timed(runs, () => void new IncrementalAllocatorPolicy().policy(l, demands, now + 100));
  const reference = timed(runs, () => void allocatorPolicy(l, demands, now + 100));
  if (policy.stats.fullRounds !== 1) throw new Error('the timed policy rounds were not incremental');
  return {
    quotas,
    cells: nCells,
    gatherMs: ms(gather.ms),
    gatherCpuMs: ms(gather.cpuMs),
    roundMs: ms(round.ms),
    roundCpuMs: ms(round.cpuMs),
    firstRoundCpuMs: ms(first.cpuMs),
    referenceCpuMs: ms(reference.cpuMs),
    sent,
  };
}

/** Median wall and CPU time of `runs` calls of `f`, after one untimed call. */
function timed(runs: number, f: () => void): { ms: number; cpuMs: number } {
  f();
  const times: number[] = [];
  const cpu: number[] = [];
  for (let r = 0; r < runs; r++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    f();
    times.push(performance.now() - t0);
    const c = process.cpuUsage(c0);
    cpu.push((c.user + c.system) / 1000);
  }
  return { ms: median(times), cpuMs: median(cpu) };
}

export function runAllocatorBench(opts: { smoke: boolean; progress: (msg: string) => void }): BenchReport {
  const runs = opts.smoke ? 2 : 7;
  const sizes: [number, number, boolean][] = opts.smoke
    ? [
        [2_000, 4, false],
        [2_000, 16, true],
      ]
    : [
        [10_000, 4, false],
        [10_000, 16, false],
        [100_000, 4, false],
        [100_000, 16, false],
        [100_000, 16, true],
      ];
  const rows: Record<string, number | string>[] = [];
  for (const [tenants, cells, hierarchy] of sizes) {
    opts.progress(`allocator: ${tenants} tenants × ${cells} cells${hierarchy ? ' + tier and domain caps' : ''}`);
    const r = measureAllocator(tenants, cells, hierarchy, runs);
    rows.push({
      tenants: r.tenants,
      cells: r.cells,
      caps: r.hierarchy ? '3 tiers + domain' : 'none',
      slices: r.slices,
      'round ms': r.roundMs,
      'round best ms': r.roundBestMs,
      'round cpu ms': r.roundCpuMs,
      'grants changed': r.changedGrants,
      'changed %': r.changedPct,
      'quiet round ms': r.quietMs,
      'quiet cpu ms': r.quietCpuMs,
      'baseline ms': r.baselineMs,
      'round / baseline': Math.round((10 * r.roundMs) / Math.max(0.1, r.baselineMs)) / 10,
      'entry bytes': r.entryBytes,
      'bytes/grant': r.bytesPerGrant,
      'encode ms': r.encodeMs,
      'rounds to converge': r.convergeRounds,
    });
  }
  const incSizes: [number, number, number][] = opts.smoke
    ? [
        [20_000, 16, 0.01],
        [5_000, 16, 0.1],
      ]
    : [
        [1_000_000, 16, 0.01],
        [100_000, 16, 0.1],
      ];
  for (const [tenants, cells, p] of incSizes) {
    opts.progress(
      `allocator incremental: ${tenants} tenants × ${cells} cells, ${p * 100}% of the tenants' demands moved`,
    );
    const r = measureIncremental(tenants, cells, p, runs, opts.progress);
    const perS = (bytes: number): number => Math.round((bytes * ROUNDS_PER_S) / 1e4) / 100;
    rows.push({
      tenants: r.tenants,
      cells: r.cells,
      caps: 'none',
      variant: 'incremental vs full',
      'tenants changed %': r.changedTenantsPct,
      'full round ms': r.fullMs,
      'full cpu ms': r.fullCpuMs,
      'incremental round ms': r.incrementalMs,
      'incremental cpu ms': r.incrementalCpuMs,
      'full / incremental': Math.round((10 * r.fullMs) / Math.max(0.1, r.incrementalMs)) / 10,
      'quotas computed': r.quotasComputed,
      'grants changed': r.grants,
      'same grants': r.sameGrants ? 'yes' : 'NO',
      'entry v1 bytes': r.entryV1Bytes,
      'entry v2 bytes': r.entryV2Bytes,
      'v1 / v2': Math.round((10 * r.entryV1Bytes) / Math.max(1, r.entryV2Bytes)) / 10,
      'v1 MB/s @10 rounds/s': perS(r.entryV1Bytes),
      'v2 MB/s @10 rounds/s': perS(r.entryV2Bytes),
      'budget grants': r.budgetGrants,
      'budget entry + acks bytes': r.budgetEntryBytes + r.budgetAckBytes,
      'budget MB/s @10 rounds/s': perS(r.budgetEntryBytes + r.budgetAckBytes),
    });
  }
  const policySizes: [number, number][] = opts.smoke ? [[1_000, 16]] : [[10_000, 16]];
  for (const [quotas, cells] of policySizes) {
    opts.progress(`allocator: the lease round's policy on a real ledger, ${quotas} quotas × ${cells} cells`);
    const r = measurePolicyRound(quotas, cells, runs);
    rows.push({
      tenants: r.quotas,
      cells: r.cells,
      caps: 'none',
      variant: 'policy round on a ledger',
      'quotas computed': r.quotas,
      'policy round ms': r.roundMs,
      'policy round cpu ms': r.roundCpuMs,
      'gather ms': r.gatherMs,
      'gather cpu ms': r.gatherCpuMs,
      'first (full) round cpu ms': r.firstRoundCpuMs,
      'allocatorPolicy cpu ms': r.referenceCpuMs,
      'allocatorPolicy / policy round': Math.round((10 * r.referenceCpuMs) / Math.max(0.1, r.roundCpuMs)) / 10,
      'budget grants': r.sent,
    });
  }
  const steadySizes: [number, number, number][] = opts.smoke ? [[1_000, 16, 0.01]] : [[20_000, 16, 0.01]];
  for (const [tenants, cells, p] of steadySizes) {
    opts.progress(
      `allocator: steady lease rounds on a real ledger, ${tenants} tenants × ${cells} cells, ${p * 100}% moving`,
    );
    const r = measurePolicySteady(tenants, cells, p, opts.smoke ? 5 : 20);
    rows.push({
      tenants: r.tenants,
      cells: r.cells,
      caps: 'none',
      variant: 'steady policy rounds on a ledger',
      'tenants changed %': p * 100,
      'keys changed / round': r.changed,
      'quotas computed': r.computed,
      'computed / changed': Math.round((10 * r.computed) / Math.max(1, r.changed)) / 10,
      'policy round cpu ms': r.cpuMs,
      'budget grants': r.sent,
      'deferred grants': r.deferred,
    });
  }
  return {
    name: 'allocator',
    title:
      'Allocator: one rebalancing round (median of runs), and its reportAndGrant entry; incremental rounds and the log',
    rows,
    notes: [
      "Row 'policy round on a ledger': the lease round as the coordinator runs it (IncrementalAllocatorPolicy on a real Ledger): one round between full rounds (the policy's first, full round untimed; then every key's demand changed, so every quota is in the working set): the gather from the ledger (each key's definition read once in the round; slices read into columns by one Ledger.quotaColumnsReader), the allocator, the selection within the budget (Grant objects only for the grants sent), the definition grants (keys held at every cell skipped). 'first (full) round': a fresh policy's first round (every quota, the working set built: the row before issue 20's round work); 'allocatorPolicy': the stateless full round (grant-policy.ts), the reference, in the same run. The ledger holds exactly the quotas the round computes — 10,000 × 16, the quotas a 1,000,000 × 16 round at 1% (or 100,000 × 16 at 10%) computes: a round's work follows the quotas it computes, and a ledger of 1,000,000 tenants with a slice at each of 16 cells (16 M slices) does not fit this machine's memory beside the rest. Every quota's demand is new at every cell (all slices change, more than the ~108,000 of the converged 1 % row). 'gather': buildRoundInput alone.",
      "Row 'steady policy rounds on a ledger': IncrementalAllocatorPolicy over consecutive rounds on a real Ledger, each round committed (reportAndGrant with the previous round's grants acknowledged, every cell reporting every round), after convergence; each round a fraction of the tenants' demands move at every cell. 'quotas computed' (median per round) is the working set: a changed key is computed again when its acknowledgements arrive and stays until it is settled and every live cell reported since (cells reporting every 500 ms, 5 rounds, keep it longer than here), and keys with grants deferred by the budget stay too. 'computed / changed' is how far the round is from costing only what changed; at 1,000,000 × 16 with 1% moving, 10,000 keys a round want ~108,000 grants against the 5,000 budget, so the working set grows with the deferred ones ('deferred grants', summed over the measured rounds).",
      `Rows 'incremental vs full': a fraction of the tenants' demands moved at every cell (fall ×0.2, rise ×3 + 5% of the quota, or a jump anywhere); 'full round': allocateRound over every quota (the round before the incremental lease policy, kept as the baseline); 'incremental round': gather the moved quotas' rows (from the benchmark's columns: the ledger's gather is in the 'policy round on a ledger' row), allocate only them into grant columns and select the grants sent (float32, the budget; Grant objects only for those), as IncrementalAllocatorPolicy does, timed after ${INCREMENTAL_WARM_UP} untimed rounds (median of 2 × runs + 1); 'same grants': both rounds send identical grants (the other quotas are settled). Target: under 100 ms for 1,000,000 × 16 at 1% and 100,000 × 16 at 10%.`,
      `Log: 'entry v1' is the object form of the full round's grants (format 1, the log before); 'entry v2' the compact form (format 2, coordinator/ledger/round-codec.ts) of the grants as the lease round sends them (float32 towards the current grant, unchanged ones dropped); 'budget': the round within DEFAULT_MAX_GRANTS_PER_ROUND (${DEFAULT_MAX_GRANTS_PER_ROUND}) grants by grantPriority, plus the compact acknowledgements its shrinks will need; MB/s per replica at ${ROUNDS_PER_S} rounds/s if every round changed this much. Target: ≤ 1 MB/s at 100,000 × 16 with 10% changing (docs/quota-model.md, "Log volume").`,
      `Median of ${runs} runs of allocateRound on the same input (wall clock; 'cpu ms': this process's CPU time, which a shared, busy machine inflates less); one AllocatorWorkspace reused, as the coordinator does. The columnar input is built directly: building it from the ledger is not included (it is in the 'policy round on a ledger' row).`,
      "'round': the round after demands moved so that about 10% of the slices get a new grant (the grants are the output, so creating them is included); 'quiet round': the converged state, steady demands, no grant changes.",
      "'baseline': one pass reading the six input columns the allocator reads, on the same machine in the same run — the least any round over this input costs; 'round / baseline' is the machine-independent figure.",
      'Target (docs/targets.md): a round for 100,000 tenants × 16 cells in under 100 ms (production hardware).',
      "Entry ('entry bytes', first rows): encodeCommand({type: \"reportAndGrant\", nowMs, grants}) of the allocator's grants as they come (float64 numbers), in the compact form (format 2) since issue 20; encode ms includes its zod validation. The object form of the same grants (format 1, before) is ~93 B a grant: the 'entry v1 bytes' column of the incremental rows.",
      "Wall-clock figures on a machine shared with other builds are inflated (up to several times at load average 15); the CPU columns are this process's CPU time and move much less.",
    ],
  };
}

// Stand-alone: `npx tsx bench/allocator.ts [--smoke]`.
if (import.meta.url === `file://${process.argv[1] ?? ''}`) {
  const report = runAllocatorBench({
    smoke: process.argv.includes('--smoke'),
    progress: (m) => console.log(`  … ${m}`),
  });
  console.table(report.rows);
}
