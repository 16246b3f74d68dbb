// The allocator: one rebalancing round of every global quota's slices over the cells. Pure and
// deterministic: no I/O, no clock (the round's time is an input), no randomness, no dependence on
// Map/Set iteration order beyond insertion order. The coordinator's leader runs it every sync
// interval on the ledger's committed state plus the cells' fresh reports, and proposes the grants it
// returns — only the changed ones — as ONE `reportAndGrant` Raft entry.
//
// ## Per quota, per round
//
// 1. Targets (max-min fair, water-filling). Demand d = allowed + refused velocity over the cell's last
//    500 ms window. The capacity C is the quota minus the unregistered floor slots. Every cell takes
//    part, also one that did not report this round (it gets no grant: a grant would renew its lease
//    and keep its capacity counted) with the demand it last reported, or its floor alone once its
//    lease is over — agents report every 500 ms and rounds run every 100 ms, so most rounds see one
//    cell, and splitting only what the silent cells hold would freeze whoever grabbed the quota
//    first (the chaos drills found that). Phase 1 splits C over the
//    demands, each cell at least its floor: cells that want less than the fair level get their
//    demand, the others share what is left equally (water-filling). Only if every demand fits does
//    phase 2 hand out headroom (want = max(d × 1.2, d + max(1 req/s, 1% of the quota)), at most the
//    quota) the same way; what is still left stays FREE in the quota, so a cell whose demand jumps
//    grows next round without waiting for anyone's acknowledgement. Headroom never takes capacity a
//    demand needs. Burst targets are proportional to the rate targets (burst × t / rate), split the
//    same way against the burst's own capacity: Σ bursts ≤ the quota's burst.
//
// 2. Shrink before grow, mirroring the ledger's counting rule exactly. The ledger counts a cell as
//    using u = max(floor, held floors, lease live ? the largest grant not acknowledged away : 0) and
//    refuses a round whose Σu would exceed the quota — or, while a lowered quota is still over its
//    limit, would rise at all. A grant x raises the cell's u to max(u, x); a shrink lowers nothing
//    until the cell acknowledges it or its lease surely expires. So:
//      - shrinks are sent at once but free nothing this round;
//      - grows are paid from FREE = rate − Σu (Σu as the ledger counts it, unregistered floor slots
//        included — for one cell, the same as `ceilingRate − Σ counted of the others`), except that a
//        cell grows up to its own u for nothing; FREE is split max-min fairly between the growers;
//      - over the limit (Σu > rate after an operator lowered the quota) nothing grows: the ledger then
//        compares with Σu after the entry's own releases and acknowledgements, which the allocator
//        cannot see exactly, and only shrinks are safe;
//      - a cell whose previous shrink is still unacknowledged gets no further shrink until it
//        acknowledges (a new epoch would make its pending acknowledgement stale, so the capacity
//        could never come free if demands kept moving); grows still go to it, free up to its u;
//      - a cell whose lease the entry will release (now ≥ lease + skew margin) is on its floors.
//    With this entry's acknowledgements counted (allocator-input.ts), a shrink acknowledged in round
//    k+1 is re-granted in that same round. Every round is accepted by the ledger (never
//    QUOTA_EXCEEDED) when applied to the state it was computed from: one round in flight at a time,
//    no operator change to a quota in between (else the round is refused whole, and the next one is
//    computed afresh), quota keys unique in the input.
//
// 3. Hysteresis. A change smaller than max(1 req/s, 5% of the quota) (bursts: of the burst) is not
//    sent, except: (a) a cell refusing traffic (demand above its level) gets any grow of at least
//    max(0.01 req/s, 0.1% of the quota) — a throttled cell is what rebalancing is for, and these
//    grows cannot churn: they need free capacity, which a converged quota does not have; a burst
//    more than 5% below its target is likewise regrown; (b) when a cell is starved — refusing, and
//    below 95% of min(its demand, its fair target) after this round — every cell above its target is
//    shrunk to it however small the excess (the shrinks "needed to make room"; bursts alike); (c) a
//    child above its parent's share at a cell is shrunk (4.). With steady demands the targets are
//    constant, every cell reaches its target, and nothing changes any more: from any state, within
//    4 rounds in the tests (2 when acknowledgements arrive in the next round's entry).
//
// 4. Hierarchy: tenant quotas inside tier caps inside a domain cap. The ledger keeps every key's
//    bound on its own and has no per-cell parent link, so the allocator adds it: each quota names its
//    parent key (a tenant its tier cap, a tier cap the domain cap); parents are allocated first; at
//    each cell the parent's new level (max(floor, grant)) is split max-min fairly over the children's
//    wants there (demands first, then headroom), and each child's target at that cell is capped at its
//    share; a child above its share is shrunk whatever the hysteresis or a pending acknowledgement
//    says. Hence at every reporting cell, after the round,
//        Σ_children max(floor, grant) ≤ max(parent's max(floor, grant), Σ_children floors)
//    — floors are outside the allocator's control (an agent may always use them), so the cap binds
//    above them. Bursts likewise. (One pass, not a joint optimum: a child that its own quota stops
//    below its share at a cell leaves that part of the parent unused this round.)
//
// ## Why not the seed design's rule
//
// Seed: a cell above 75% utilisation of its slice borrows from a cell below 20%. Utilisation
// (admitted / slice) saturates at 100%, so a throttled cell cannot show how much it wants and the
// amount to move is a guess; the rule is pairwise, so capacity held by a cell between 20% and 75% is
// never moved however starved another cell is; and it has no target to converge to. Here demand
// counts refusals, and the allocation is the max-min fair one, computed rather than approached by
// trades. Quota 600 req/s, three cells on slices of 200, demands 450 / 100 / 50: nobody is below 20%,
// so the seed rule moves nothing and the cells admit 350 req/s; this allocator (floors 60) shrinks
// the two quiet cells in round 1 and gives the busy one 440 in round 2: 590 admitted. With 450 / 100
// / 30 the seed borrows once (200 → 285, the lender 200 → 115) and stops, the lender now at 26%:
// 415 admitted against 570. (coordinator/allocator/README.md; computed in
// test/coordinator/allocator/allocator-seed-comparison.test.ts.)
//
// ## Cost
//
// O(quotas × cells): the input is columnar (typed arrays, quota-major) and nothing is allocated per
// slice but the output grants. Most quotas take `fastQuota`, one pass that decides every cell locally
// when no split binds; the others gather into per-cell scratch arrays, split (water-fill.ts), and
// again decide locally when the grows fit (`localDecisions`), else in stages (grows water-filled,
// starvation, bursts). The shortcuts are checked against the staged code for identical output.
// A tier or domain cap over many tenants is split per cell over contiguous scratch segments. Reuse
// one AllocatorWorkspace across rounds. Figures: bench/allocator.ts.

import type { Grant } from '../ledger/ledger-commands.js';
import { MAX_CELLS } from '../ledger/ledger-commands.js';
import { WaterFillScratch, waterFill } from './water-fill.js';
import { CellquotaError } from '../../shared/errors.js';

// ---- input --------------------------------------------------------------------------------------

/** Knobs of a round. All rates in requests/s, bursts in requests. */
export interface AllocatorTuning {
  /** Headroom over demand: a cell wants max(d × headroomFactor, d + minimum headroom). */
  readonly headroomFactor: number;
  /** The minimum headroom: max(headroomMinRate, headroomMinFraction × quota rate). */
  readonly headroomMinRate: number;
  readonly headroomMinFraction: number;
  /** Hysteresis: changes below max(hysteresisMinRate, hysteresisFraction × quota rate) are not sent. */
  readonly hysteresisFraction: number;
  readonly hysteresisMinRate: number;
  /** The same for bursts: max(hysteresisMinBurst, hysteresisFraction × quota burst). */
  readonly hysteresisMinBurst: number;
  /** A refusing cell below (1 − starveTolerance) × min(demand, target) is starved. */
  readonly starveTolerance: number;
  /** The smallest change ever sent: max(minStepRate, minStepFraction × quota) (bursts alike). */
  readonly minStepFraction: number;
  readonly minStepRate: number;
}

export const DEFAULT_TUNING: AllocatorTuning = Object.freeze({
  headroomFactor: 1.2,
  headroomMinRate: 1,
  headroomMinFraction: 0.01,
  hysteresisFraction: 0.05,
  hysteresisMinRate: 1,
  hysteresisMinBurst: 1,
  starveTolerance: 0.05,
  minStepFraction: 0.001,
  minStepRate: 0.01,
});

/** One registered cell, in the ledger's registration order (the order of `QuotaState.cells`). */
export interface AllocatorCell {
  readonly id: string;
  /** The cell holds a floor slot (ledger: `slot !== null`); otherwise its floors are 0. */
  readonly hasFloor: boolean;
  /**
   * The cell reported in this round (its demand is fresh and the round renews its lease). A cell
   * that did not report gets no grant: a grant would renew its lease and keep its capacity counted.
   */
  readonly reported: boolean;
  /** The cell's lease in the ledger (null: none). Used only to see a lease the round will release. */
  readonly leaseExpiresAtMs: number | null;
}

/** One global quota (ledger: `QuotaState`), plus its parent in the hierarchy. */
export interface AllocatorQuota {
  readonly key: string;
  readonly rate: number;
  readonly burst: number;
  /** The floor of a floor slot (cells without a slot have floor 0). */
  readonly floorRate: number;
  readonly floorBurst: number;
  /** The ledger's ceiling (the quota, or more while a lowered quota is still over its limit). */
  readonly ceilingRate: number;
  readonly ceilingBurst: number;
  /** Σu as the ledger counts it: all cells plus the unregistered floor slots. */
  readonly countedRate: number;
  readonly countedBurst: number;
  /** The enclosing cap's key (a tenant's tier cap, a tier cap's domain cap), or null. */
  readonly parent: string | null;
}

/**
 * Per quota and cell, quota-major: the entry of quota q and cell c is at index q × cells.length + c.
 * Columnar so that a round over 100,000 quotas × 16 cells reads flat memory and allocates nothing per
 * slice.
 */
export interface AllocatorSlices {
  /** The current grant (0 while the cell never got one). */
  readonly grantRate: Float64Array;
  readonly grantBurst: Float64Array;
  /** The current grant's epoch (0: none). */
  readonly epoch: Float64Array;
  /** 1: the cell acknowledged the current grant (no older, larger grant is still counted). */
  readonly acknowledged: Uint8Array;
  /** What the ledger counts the cell as possibly using (SliceView.countedRate/countedBurst). */
  readonly countedRate: Float64Array;
  readonly countedBurst: Float64Array;
  /** Allowed + refused velocity over the cell's last 500 ms window, req/s (NaN or < 0: 0). */
  readonly demand: Float64Array;
}

export interface AllocatorInput {
  /** The round's time (stamped by the leader; the same `nowMs` goes into the reportAndGrant entry). */
  readonly nowMs: number;
  /** Lease length given with each grant: leaseExpiresAtMs = nowMs + leaseTtlMs. */
  readonly leaseTtlMs: number;
  /** The ledger's skew margin (its config), to see which leases the round itself will release. */
  readonly skewMarginMs: number;
  readonly cells: readonly AllocatorCell[];
  readonly quotas: readonly AllocatorQuota[];
  readonly slices: AllocatorSlices;
  readonly tuning?: Partial<AllocatorTuning>;
}

// ---- output -------------------------------------------------------------------------------------

export interface AllocatorStats {
  readonly quotas: number;
  readonly slices: number;
  readonly reportedCells: number;
  /** Grants returned (changed slices). */
  readonly grants: number;
  /** Rate grows, rate shrinks past the hysteresis, shrinks forced to make room for a starved cell,
   * shrinks forced by a parent cap, grants that change only the burst. */
  readonly grows: number;
  readonly shrinks: number;
  readonly forcedShrinks: number;
  readonly parentShrinks: number;
  readonly burstOnly: number;
  /** Rate changes not sent because they are below the hysteresis threshold. */
  readonly suppressed: number;
  /** Shrinks held back until the cell acknowledges its previous, pending shrink. */
  readonly waitingAck: number;
  /** Reporting cells still starved after this round (they wait for acknowledgements). */
  readonly starved: number;
  /** Reporting cells short of their burst target after the burst grows (small excesses were shrunk for them). */
  readonly burstShort: number;
  /** Σ over growing cells of (target − new level): rate wanted but not free yet (shrink first). */
  readonly growBlockedRate: number;
  /** Reporting cells whose lease the round releases before its grants (treated as on floors). */
  readonly releasedCells: number;
}

export interface AllocatorOutput {
  /** The changed grants, each with the next epoch and a fresh lease; parents before children. */
  readonly grants: Grant[];
  readonly stats: AllocatorStats;
  /**
   * Per input quota (input order): 1 if the round sent it a grant, or left a reporting cell waiting
   * for an acknowledgement, starved, or held below its target by at least the smallest step. A quota
   * at 0 is settled: with the same inputs, a later round sends it nothing, whichever cells report
   * (targets do not depend on who reports; a cell's decision does only through the split of the
   * grows, and no grow is held back). The incremental lease round (coordinator/lease/
   * incremental-policy.ts) leaves settled quotas out of its rounds until an input changes.
   */
  readonly unsettled: Uint8Array;
}

export class AllocatorInputError extends CellquotaError {
  readonly code = 'ALLOCATOR_INPUT_INVALID';
}

// ---- the round ----------------------------------------------------------------------------------

/** Relative tolerance of float comparisons (far inside the ledger's own 1e-9 bound tolerance). */
const EPS = 1e-12;

type MutableStats = {
  -readonly [K in keyof AllocatorStats]: AllocatorStats[K];
};

/** Scratch arrays, one per-cell column each (size: the cell count). */
class Scratch {
  readonly fill = new WaterFillScratch();
  readonly idx: Int32Array;
  readonly fl: Float64Array;
  readonly flb: Float64Array;
  readonly cur: Float64Array;
  readonly curb: Float64Array;
  readonly u: Float64Array;
  readonly ub: Float64Array;
  readonly d: Float64Array;
  readonly lo: Float64Array;
  readonly hi1: Float64Array;
  readonly hi2: Float64Array;
  readonly t: Float64Array;
  readonly tb: Float64Array;
  readonly nr: Float64Array;
  readonly nb: Float64Array;
  readonly gl: Float64Array;
  readonly gh: Float64Array;
  readonly go: Float64Array;
  readonly gi: Int32Array;
  /** Bit flags per reporting cell (see F_*). */
  readonly flags: Uint8Array;
  /** localDecisions' flags, copied to `flags` only when it succeeds. */
  readonly lflags: Uint8Array;
  /** Per silent cell (at [k, n)): its burst cap and burst floor. */
  readonly pcapB: Float64Array;
  readonly pflb: Float64Array;
  constructor(n: number) {
    const f = (): Float64Array => new Float64Array(n);
    this.pcapB = f();
    this.pflb = f();
    this.idx = new Int32Array(n);
    this.fl = f();
    this.flb = f();
    this.cur = f();
    this.curb = f();
    this.u = f();
    this.ub = f();
    this.d = f();
    this.lo = f();
    this.hi1 = f();
    this.hi2 = f();
    this.t = f();
    this.tb = f();
    this.nr = f();
    this.nb = f();
    this.gl = f();
    this.gh = f();
    this.go = f();
    this.gi = new Int32Array(n);
    this.flags = new Uint8Array(n);
    this.lflags = new Uint8Array(n);
  }
}

const F_PENDING = 1; // an older, larger grant is still counted (unacknowledged shrink)
const F_EMIT_RATE = 2;
const F_EMIT_BURST = 4;
const F_SMALL_OVER = 8; // rate above target by less than the hysteresis
const F_SMALL_OVER_B = 16; // burst above target by less than the hysteresis
const F_REFUSING = 32;

interface Ctx {
  readonly n: number;
  readonly nowMs: number;
  readonly leaseExpiresAtMs: number;
  readonly cells: readonly AllocatorCell[];
  readonly quotas: readonly AllocatorQuota[];
  readonly s: AllocatorSlices;
  readonly tuning: AllocatorTuning;
  /** The tuning as one fixed-shape object, plus derived constants (read in the hot loops). */
  readonly k: Consts;
  readonly fastPath: boolean;
  readonly localDecisions: boolean;
  readonly reported: Uint8Array;
  readonly released: Uint8Array;
  /** 1: the cell has no live lease at the round's time (a silent one's demand is not counted). */
  readonly lapsed: Uint8Array;
  readonly hasFloor: Uint8Array;
  /** Per slice: the level after this round (max(floor, grant)), filled for parents only. */
  readonly levelRate: Float64Array | null;
  readonly levelBurst: Float64Array | null;
  /** Per slice: the cap a parent puts on this child at this cell (Infinity: none). */
  readonly capRate: Float64Array | null;
  readonly capBurst: Float64Array | null;
  readonly scratch: Scratch;
  readonly grants: Grant[];
  readonly stats: MutableStats;
}

interface Consts {
  readonly headroomFactor: number;
  readonly headroomMinRate: number;
  readonly headroomMinFraction: number;
  readonly hysteresisFraction: number;
  readonly hysteresisMinRate: number;
  readonly hysteresisMinBurst: number;
  readonly minStepFraction: number;
  readonly minStepRate: number;
  /** 1 − starveTolerance. */
  readonly keep: number;
}

/**
 * Reusable buffers for allocateRound (per-slice levels and parent caps, the hierarchy's per-cell
 * scratch). Purely a cache: a round's result never depends on what a workspace held before, so one
 * workspace may serve every round (the coordinator keeps one; a 100,000 × 16 round would otherwise
 * allocate ~80 MB of typed arrays each time, which the garbage collector then has to reclaim). Not
 * for two rounds at once.
 */
export class AllocatorWorkspace {
  /** @internal */ levelRate = new Float64Array(0);
  /** @internal */ levelBurst = new Float64Array(0);
  /** @internal */ capRate = new Float64Array(0);
  /** @internal */ capBurst = new Float64Array(0);
  /** @internal */ readonly cap = new CapScratch();
  /** @internal */ scratch: Scratch | null = null;

  /** @internal */
  slices(size: number): void {
    if (this.levelRate.length >= size) return;
    this.levelRate = new Float64Array(size);
    this.levelBurst = new Float64Array(size);
    this.capRate = new Float64Array(size);
    this.capBurst = new Float64Array(size);
  }

  /** @internal */
  cellScratch(n: number): Scratch {
    if (this.scratch === null || this.scratch.idx.length < n) this.scratch = new Scratch(n);
    return this.scratch;
  }
}

/**
 * Computes one rebalancing round. Returns only the grants that change, each with epoch = current + 1
 * and leaseExpiresAtMs = nowMs + leaseTtlMs. Throws AllocatorInputError on malformed input (sizes,
 * non-finite numbers, an unknown or repeated parent, a parent cycle). `workspace`: reusable buffers
 * (optional; see AllocatorWorkspace).
 */
export function allocateRound(input: AllocatorInput, workspace?: AllocatorWorkspace): AllocatorOutput {
  return allocateRoundWith(input, { fastPath: true, localDecisions: true }, workspace);
}

/**
 * allocateRound with internal switches, for tests: `fastPath: false` runs every quota through the
 * general path, `localDecisions: false` makes the general path always take its staged decisions.
 * Both shortcuts must give output identical to the general, staged code.
 */
export function allocateRoundWith(input: AllocatorInput, options: { readonly fastPath: boolean; readonly localDecisions: boolean }, workspace: AllocatorWorkspace = new AllocatorWorkspace()): AllocatorOutput {
  const tuning: AllocatorTuning = { ...DEFAULT_TUNING, ...input.tuning };
  const { cells, quotas, slices } = input;
  const n = cells.length;
  const nq = quotas.length;
  validate(input, tuning);

  const reported = new Uint8Array(n);
  const released = new Uint8Array(n);
  const lapsed = new Uint8Array(n);
  const hasFloor = new Uint8Array(n);
  let reportedCells = 0;
  let releasedCells = 0;
  for (let c = 0; c < n; c++) {
    const cell = cells[c] as AllocatorCell;
    hasFloor[c] = cell.hasFloor ? 1 : 0;
    if (cell.reported) {
      reported[c] = 1;
      reportedCells++;
    }
    // The round's first step in the ledger releases every lease that has surely expired by nowMs:
    // such a cell starts the round on its floors, whatever its grant was.
    if (cell.leaseExpiresAtMs !== null && input.nowMs >= cell.leaseExpiresAtMs + input.skewMarginMs) {
      released[c] = 1;
      if (cell.reported) releasedCells++;
    }
    // A cell without a live lease: when silent, its last demand no longer counts in the targets.
    if (cell.leaseExpiresAtMs === null || input.nowMs >= cell.leaseExpiresAtMs) lapsed[c] = 1;
  }

  // Hierarchy: parents first (by depth), in input order within a depth.
  const parentIdx = new Int32Array(nq).fill(-1);
  let anyParent = false;
  for (let q = 0; q < nq && !anyParent; q++) if ((quotas[q] as AllocatorQuota).parent !== null) anyParent = true;
  if (anyParent) {
    // Only the few parent keys are looked up (a map of every key would cost a round of 100,000
    // quotas more than the rest of the hierarchy work).
    const parents = new Map<string, number>();
    for (let q = 0; q < nq; q++) {
      const p = (quotas[q] as AllocatorQuota).parent;
      if (p !== null) parents.set(p, -1);
    }
    for (let q = 0; q < nq; q++) {
      const key = (quotas[q] as AllocatorQuota).key;
      const known = parents.get(key);
      if (known === undefined) continue;
      if (known !== -1) throw new AllocatorInputError(`quota ${key} appears twice`);
      parents.set(key, q);
    }
    for (let q = 0; q < nq; q++) {
      const p = (quotas[q] as AllocatorQuota).parent;
      if (p === null) continue;
      const pi = parents.get(p) ?? -1;
      if (pi < 0) throw new AllocatorInputError(`quota ${(quotas[q] as AllocatorQuota).key}: parent ${p} is not in the round`);
      parentIdx[q] = pi;
    }
  }
  let order: Int32Array;
  let childStart: Int32Array | null = null;
  let childList: Int32Array | null = null;
  if (!anyParent) {
    order = new Int32Array(nq);
    for (let q = 0; q < nq; q++) order[q] = q;
  } else {
    const depth = new Int32Array(nq).fill(-1);
    let maxDepth = 0;
    for (let q = 0; q < nq; q++) {
      let d = 0;
      let p = parentIdx[q] as number;
      while (p >= 0) {
        const known = depth[p] as number;
        if (known >= 0) {
          d += known + 1;
          break;
        }
        d++;
        if (d > nq) throw new AllocatorInputError(`quota ${(quotas[q] as AllocatorQuota).key}: its parents form a cycle`);
        p = parentIdx[p] as number;
      }
      depth[q] = d;
      if (d > maxDepth) maxDepth = d;
    }
    // Counting sort by depth (stable).
    const count = new Int32Array(maxDepth + 2);
    for (let q = 0; q < nq; q++) {
      const at = (depth[q] as number) + 1;
      count[at] = (count[at] as number) + 1;
    }
    for (let k = 1; k < count.length; k++) count[k] = (count[k] as number) + (count[k - 1] as number);
    order = new Int32Array(nq);
    for (let q = 0; q < nq; q++) {
      const at = depth[q] as number;
      const pos = count[at] as number;
      order[pos] = q;
      count[at] = pos + 1;
    }
    // Children lists (CSR).
    childStart = new Int32Array(nq + 1);
    for (let q = 0; q < nq; q++) {
      const p = parentIdx[q] as number;
      if (p >= 0) childStart[p + 1] = (childStart[p + 1] as number) + 1;
    }
    for (let q = 0; q < nq; q++) childStart[q + 1] = (childStart[q + 1] as number) + (childStart[q] as number);
    childList = new Int32Array(childStart[nq] as number);
    const fillAt = childStart.slice(0, nq);
    for (let q = 0; q < nq; q++) {
      const p = parentIdx[q] as number;
      if (p < 0) continue;
      const pos = fillAt[p] as number;
      childList[pos] = q;
      fillAt[p] = pos + 1;
    }
  }

  const total = nq * n;
  if (anyParent) {
    workspace.slices(total);
    workspace.capRate.fill(Infinity, 0, total);
    workspace.capBurst.fill(Infinity, 0, total);
  }
  const ctx: Ctx = {
    n,
    nowMs: input.nowMs,
    leaseExpiresAtMs: input.nowMs + input.leaseTtlMs,
    cells,
    quotas,
    s: slices,
    tuning,
    k: {
      headroomFactor: tuning.headroomFactor,
      headroomMinRate: tuning.headroomMinRate,
      headroomMinFraction: tuning.headroomMinFraction,
      hysteresisFraction: tuning.hysteresisFraction,
      hysteresisMinRate: tuning.hysteresisMinRate,
      hysteresisMinBurst: tuning.hysteresisMinBurst,
      minStepFraction: tuning.minStepFraction,
      minStepRate: tuning.minStepRate,
      keep: 1 - tuning.starveTolerance,
    },
    fastPath: options.fastPath,
    localDecisions: options.localDecisions,
    reported,
    released,
    lapsed,
    hasFloor,
    levelRate: anyParent ? workspace.levelRate : null,
    levelBurst: anyParent ? workspace.levelBurst : null,
    capRate: anyParent ? workspace.capRate : null,
    capBurst: anyParent ? workspace.capBurst : null,
    scratch: workspace.cellScratch(Math.max(1, n)),
    grants: [],
    stats: {
      quotas: nq,
      slices: total,
      reportedCells,
      grants: 0,
      grows: 0,
      shrinks: 0,
      forcedShrinks: 0,
      parentShrinks: 0,
      burstOnly: 0,
      suppressed: 0,
      waitingAck: 0,
      starved: 0,
      burstShort: 0,
      growBlockedRate: 0,
      releasedCells,
    },
  };
  const capScratch = anyParent ? workspace.cap : null;
  const unsettled = new Uint8Array(nq);
  const st = ctx.stats;
  for (let k = 0; k < nq; k++) {
    const q = order[k] as number;
    const g0 = ctx.grants.length;
    const w0 = st.waitingAck;
    const s0 = st.starved + st.burstShort;
    const b0 = st.growBlockedRate;
    const fast = ctx.fastPath ? fastQuota(ctx, q) : FAST_TRY_LOCAL;
    if (fast !== FAST_DONE) allocateQuota(ctx, q, fast === FAST_TRY_LOCAL);
    // Settled: nothing sent, nobody waiting for an acknowledgement, starved, or held below its
    // target by more than the smallest step (see AllocatorOutput.unsettled).
    const qq = quotas[q] as AllocatorQuota;
    const step = Math.max(tuning.minStepRate, tuning.minStepFraction * qq.rate);
    if (ctx.grants.length !== g0 || st.waitingAck !== w0 || st.starved + st.burstShort !== s0 || st.growBlockedRate - b0 >= step) unsettled[q] = 1;
    if (childStart !== null && childList !== null && capScratch !== null) {
      const from = childStart[q] as number;
      const to = childStart[q + 1] as number;
      if (to > from) capChildren(ctx, q, childList.subarray(from, to), capScratch);
    }
  }
  ctx.stats.grants = ctx.grants.length;
  return { grants: ctx.grants, stats: ctx.stats, unsettled };
}

function validate(input: AllocatorInput, tuning: AllocatorTuning): void {
  const n = input.cells.length;
  if (n > MAX_CELLS) throw new AllocatorInputError(`at most ${MAX_CELLS} cells`);
  const need = input.quotas.length * n;
  const s = input.slices;
  for (const [name, col] of Object.entries(s) as [string, Float64Array | Uint8Array][]) {
    if (col.length < need) throw new AllocatorInputError(`slices.${name} has ${col.length} entries, expected ${need}`);
  }
  if (!Number.isFinite(input.nowMs) || !Number.isFinite(input.leaseTtlMs) || input.leaseTtlMs <= 0) throw new AllocatorInputError('nowMs and leaseTtlMs must be finite, leaseTtlMs > 0');
  if (!Number.isFinite(input.skewMarginMs) || input.skewMarginMs < 0) throw new AllocatorInputError('skewMarginMs must be finite and ≥ 0');
  for (const [k, v] of Object.entries(tuning)) {
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw new AllocatorInputError(`tuning.${k} must be a finite number ≥ 0`);
  }
  if (tuning.headroomFactor < 1) throw new AllocatorInputError('tuning.headroomFactor must be ≥ 1');
  if (tuning.starveTolerance >= 1) throw new AllocatorInputError('tuning.starveTolerance must be < 1');
  for (const q of input.quotas) {
    const ok =
      q.rate > 0 &&
      q.rate < Infinity &&
      q.burst >= 0 &&
      q.burst < Infinity &&
      q.floorRate >= 0 &&
      q.floorRate < Infinity &&
      q.floorBurst >= 0 &&
      q.floorBurst < Infinity &&
      q.ceilingRate >= 0 &&
      q.ceilingRate < Infinity &&
      q.ceilingBurst >= 0 &&
      q.ceilingBurst < Infinity &&
      q.countedRate >= 0 &&
      q.countedRate < Infinity &&
      q.countedBurst >= 0 &&
      q.countedBurst < Infinity;
    if (!ok) throw new AllocatorInputError(`quota ${q.key}: rates and bursts must be finite, ≥ 0, rate > 0`);
  }
}

function allocateQuota(ctx: Ctx, qi: number, tryLocal: boolean): void {
  const q = ctx.quotas[qi] as AllocatorQuota;
  const { n, s, tuning, reported, released, lapsed, hasFloor } = ctx;
  const sc = ctx.scratch;
  const { idx, fl, flb, cur, curb, u, ub, d, lo, hi1, hi2, nr, nb, flags } = sc;
  const base = qi * n;
  const R = q.rate;
  const B = q.burst;
  const epsR = EPS * Math.max(1, R);
  const epsB = EPS * Math.max(1, B);
  const capR = ctx.capRate;
  const capB = ctx.capBurst;
  const headMin = Math.max(tuning.headroomMinRate, tuning.headroomMinFraction * R);
  const H = tuning.headroomFactor;
  const qFloorRate = q.floorRate;
  const qFloorBurst = q.floorBurst;
  const grantRate = s.grantRate;
  const grantBurst = s.grantBurst;
  const countedRate = s.countedRate;
  const countedBurst = s.countedBurst;
  const demand = s.demand;
  const acknowledged = s.acknowledged;
  const levelRate = ctx.levelRate;
  const levelBurst = ctx.levelBurst;

  // ---- gather -----------------------------------------------------------------------------------
  let givenR = 0;
  let givenB = 0;
  let sumU = 0;
  let sumUB = 0;
  let sum1 = 0;
  let sum2 = 0;
  let psum1 = 0;
  let psum2 = 0;
  let p = 0; // cells that did not report, at [n − p, n) of lo/hi1/hi2
  const pcapB = sc.pcapB;
  const pflb = sc.pflb;
  let k = 0; // reporting cells, compacted into idx[0..k)
  for (let c = 0; c < n; c++) {
    const i = base + c;
    const floored = hasFloor[c] === 1;
    const f = floored ? qFloorRate : 0;
    const fb = floored ? qFloorBurst : 0;
    const rel = released[c] === 1;
    const g = rel ? 0 : (grantRate[i] as number);
    const gb = rel ? 0 : (grantBurst[i] as number);
    const cr = countedRate[i] as number;
    const cb = countedBurst[i] as number;
    givenR += cr;
    givenB += cb;
    const lvl = g > f ? g : f;
    const lvlB = gb > fb ? gb : fb;
    // What the ledger counts never drops below the level of the current grant; take the larger, so
    // a caller's inconsistent input errs on the safe side.
    const uu = cr > lvl ? cr : lvl;
    const uub = cb > lvlB ? cb : lvlB;
    sumU += uu;
    sumUB += uub;
    if (reported[c] !== 1) {
      // A cell that did not report this round gets no grant, but it takes part in the targets with
      // the demand it last reported (a released one on its floor only), stored from the top of the
      // scratch arrays: otherwise each round would split only what the silent cells leave, and with
      // reports spread over rounds no cell's target would ever move (passiveWant).
      p++;
      const j = n - p;
      const w = passiveWant(rel || lapsed[c] === 1 ? 0 : (demand[i] as number), R, H, headMin, capR === null ? Infinity : (capR[i] as number), f);
      lo[j] = f;
      hi1[j] = w.h1;
      hi2[j] = w.h2;
      psum1 += w.h1;
      psum2 += w.h2;
      pcapB[j] = capB === null ? Infinity : (capB[i] as number);
      pflb[j] = fb;
      if (levelRate !== null && levelBurst !== null) {
        levelRate[i] = lvl;
        levelBurst[i] = lvlB;
      }
      continue;
    }
    idx[k] = c;
    fl[k] = f;
    flb[k] = fb;
    cur[k] = lvl;
    curb[k] = lvlB;
    u[k] = uu;
    ub[k] = uub;
    let dd = demand[i] as number;
    dd = dd > 0 ? (dd < R ? dd : R) : 0; // NaN → 0
    d[k] = dd;
    let fg = 0;
    if (acknowledged[i] !== 1 && (uu > lvl + epsR || uub > lvlB + epsB)) fg |= F_PENDING;
    if (dd > lvl + epsR) fg |= F_REFUSING;
    flags[k] = fg;
    // Phase-1 and phase-2 upper bounds: demand, then demand plus headroom; both under the parent cap.
    let want = dd * H;
    if (want < dd + headMin) want = dd + headMin;
    if (want > R) want = R;
    const cap = capR === null ? Infinity : (capR[i] as number);
    const h1 = dd < cap ? dd : cap;
    const h2 = want < cap ? want : cap;
    const x1 = h1 > f ? h1 : f;
    const x2 = h2 > f ? h2 : f;
    lo[k] = f;
    hi1[k] = x1;
    hi2[k] = x2;
    sum1 += x1;
    sum2 += x2;
    k++;
  }
  if (k === 0) return;
  // Unregistered floor slots (and anything else the ledger counts beyond the cells given).
  const reservedR = Math.max(0, q.countedRate - givenR);
  const reservedB = Math.max(0, q.countedBurst - givenB);
  const usedR = sumU + reservedR;
  const usedB = sumUB + reservedB;
  // Over the limit (an operator lowered the quota and old grants are still counted): the ledger then
  // accepts only rounds that do not raise Σu above its value after this entry's own releases and
  // acknowledgements, which the allocator cannot see exactly; so no cell grows at all until Σu is
  // back under the limit. (Under the limit, the check is Σu ≤ limit, and counting the pre-entry u —
  // an upper bound — is safe.)
  const overR = usedR > R + epsR;
  const overB = usedB > B + epsB;

  // ---- targets ----------------------------------------------------------------------------------
  // Max-min fair over every cell (reporting at [0, k), silent at [k, n): k + p = n); the reporting
  // cells' targets are t[0..k), the silent cells' targets count against the burst capacity below.
  const capacity = R - reservedR;
  // Usually every want fits (t = the wants, no split needed).
  let t: Float64Array = hi2;
  if (sum2 + psum2 > capacity) {
    t = sc.t;
    if (sum1 + psum1 <= capacity) waterFill(hi1, hi2, n, capacity, t, sc.fill);
    else waterFill(lo, hi1, n, capacity, t, sc.fill);
  }
  // Burst targets: proportional to the rate targets, under the burst's own capacity and parent cap.
  const ratio = B / R;
  let fixedB = 0;
  for (let j = k; j < n; j++) fixedB += passiveBurst(t[j] as number, ratio, pcapB[j] as number, pflb[j] as number);
  const capacityB = B - reservedB - fixedB;
  let sumB = 0;
  for (let j = 0; j < k; j++) {
    let want = (t[j] as number) * ratio;
    if (capB !== null) {
      const cap = capB[base + (idx[j] as number)] as number;
      if (want > cap) want = cap;
    }
    const f = flb[j] as number;
    const x = want > f ? want : f;
    lo[j] = f;
    hi1[j] = x;
    sumB += x;
  }
  let tb: Float64Array = hi1;
  if (sumB > capacityB) {
    tb = sc.tb;
    waterFill(lo, hi1, k, capacityB, tb, sc.fill);
  }

  // Usually, even when the targets needed a split, every cell's decision is local.
  if (tryLocal && ctx.localDecisions && localDecisions(ctx, q, base, k, t, tb, usedR, usedB)) {
    emitQuota(ctx, q, base, k);
    return;
  }

  const st = ctx.stats;
  // ---- rate -------------------------------------------------------------------------------------
  const thr = Math.max(tuning.hysteresisMinRate, tuning.hysteresisFraction * R);
  const step = Math.max(tuning.minStepRate, tuning.minStepFraction * R);
  const { gl, gh, go, gi } = sc;
  let ng = 0;
  for (let j = 0; j < k; j++) {
    const c0 = cur[j] as number;
    const tt = t[j] as number;
    let fg = flags[j] as number;
    nr[j] = c0;
    const cap = capR === null ? Infinity : (capR[base + (idx[j] as number)] as number);
    const bound = Math.max(fl[j] as number, cap);
    if (c0 > bound + EPS * bound) {
      // Above its parent's share at this cell: shrink whatever the hysteresis or a pending ack says
      // (tt ≤ bound: the parent cap is in the target's upper bound).
      nr[j] = tt;
      fg |= F_EMIT_RATE;
      st.parentShrinks++;
    } else if (tt < c0 - epsR) {
      if ((fg & F_PENDING) !== 0) {
        st.waitingAck++;
      } else if (c0 - tt >= thr) {
        nr[j] = tt;
        fg |= F_EMIT_RATE;
        st.shrinks++;
      } else {
        fg |= F_SMALL_OVER;
      }
    } else if (tt > c0 + epsR) {
      if ((fg & F_REFUSING) === 0 && tt - c0 < thr) {
        st.suppressed++;
      } else if (overR) {
        st.growBlockedRate += tt - c0;
      } else {
        const uu = u[j] as number;
        const free = tt < uu ? tt : uu; // up to its own counted use, a grow costs nothing
        gl[ng] = free > c0 ? free : c0;
        gh[ng] = tt;
        gi[ng] = j;
        ng++;
      }
    }
    flags[j] = fg;
  }
  if (ng > 0) {
    const freeR = R - usedR;
    let budget = 0;
    for (let m = 0; m < ng; m++) budget += gl[m] as number;
    // The growers' cost is what they rise above their counted use; the free levels are gl.
    waterFill(gl, gh, ng, budget + (freeR > 0 ? freeR : 0), go, sc.fill);
    for (let m = 0; m < ng; m++) {
      const j = gi[m] as number;
      const x = go[m] as number;
      const c0 = cur[j] as number;
      const dx = x - c0;
      st.growBlockedRate += (gh[m] as number) - x;
      const fg = flags[j] as number;
      if ((fg & F_REFUSING) !== 0 ? dx >= step : dx >= thr) {
        nr[j] = x;
        flags[j] = fg | F_EMIT_RATE;
        st.grows++;
      } else {
        st.suppressed++;
      }
    }
  }
  // Starvation: a refusing cell still below (1 − tol) × min(demand, target) after the grows makes
  // every over-target cell shrink, however small its excess.
  const keep = 1 - tuning.starveTolerance;
  let starved = 0;
  for (let j = 0; j < k; j++) {
    const dd = d[j] as number;
    const x = nr[j] as number;
    const tt = t[j] as number;
    if (dd > x + epsR && x < keep * (dd < tt ? dd : tt) - epsR) starved++;
  }
  st.starved += starved;
  if (starved > 0) {
    for (let j = 0; j < k; j++) {
      const fg = flags[j] as number;
      if ((fg & F_SMALL_OVER) !== 0) {
        nr[j] = t[j] as number;
        flags[j] = fg | F_EMIT_RATE;
        st.forcedShrinks++;
      }
    }
  }

  // ---- burst ------------------------------------------------------------------------------------
  const thrB = Math.max(tuning.hysteresisMinBurst, tuning.hysteresisFraction * B);
  const stepB = Math.max(tuning.minStepRate, tuning.minStepFraction * B);
  ng = 0;
  for (let j = 0; j < k; j++) {
    const c0 = curb[j] as number;
    const tt = tb[j] as number;
    let fg = flags[j] as number;
    const emitting = (fg & F_EMIT_RATE) !== 0;
    nb[j] = c0;
    const cap = capB === null ? Infinity : (capB[base + (idx[j] as number)] as number);
    const bound = Math.max(flb[j] as number, cap);
    if (c0 > bound + EPS * bound) {
      nb[j] = tt;
      fg |= F_EMIT_BURST;
      if (!emitting) st.parentShrinks++;
    } else if (tt < c0 - epsB) {
      if (emitting) {
        nb[j] = tt; // a grant goes out anyway: shrinking its burst costs nothing more
      } else if ((fg & F_PENDING) !== 0) {
        // wait for the acknowledgement (counted in waitingAck only for rates)
      } else if (c0 - tt >= thrB) {
        nb[j] = tt;
        fg |= F_EMIT_BURST;
      } else {
        fg |= F_SMALL_OVER_B;
      }
    } else if (tt > c0 + epsB) {
      if (overB) {
        // no burst grows while over the limit (see overR)
      } else if (emitting || tt - c0 >= thrB || c0 < keep * tt) {
        const uu = ub[j] as number;
        const free = tt < uu ? tt : uu;
        gl[ng] = free > c0 ? free : c0;
        gh[ng] = tt;
        gi[ng] = j;
        ng++;
      }
    }
    flags[j] = fg;
  }
  let burstShort = 0;
  if (ng > 0) {
    const freeB = B - usedB;
    let budget = 0;
    for (let m = 0; m < ng; m++) budget += gl[m] as number;
    waterFill(gl, gh, ng, budget + (freeB > 0 ? freeB : 0), go, sc.fill);
    for (let m = 0; m < ng; m++) {
      const j = gi[m] as number;
      const x = go[m] as number;
      const fg = flags[j] as number;
      const c0 = curb[j] as number;
      if ((fg & F_EMIT_RATE) !== 0 || x - c0 >= stepB) {
        nb[j] = x;
        flags[j] = fg | F_EMIT_BURST;
      }
      if ((nb[j] as number) < keep * (gh[m] as number) - epsB) burstShort++;
    }
  }
  ctx.stats.burstShort += burstShort;
  if (burstShort > 0) {
    for (let j = 0; j < k; j++) {
      const fg = flags[j] as number;
      if ((fg & F_SMALL_OVER_B) !== 0) {
        nb[j] = tb[j] as number;
        flags[j] = fg | F_EMIT_BURST;
      }
    }
  }

  emitQuota(ctx, q, base, k);
}

/**
 * The decisions of the staged code below when they are all local: every grow fits in the free
 * capacity, nobody ends starved or short of burst, and nothing grows while the quota is over its
 * limit. Then each cell's grant depends on its own target only; one pass decides them all. Returns
 * false, having changed nothing the staged code reads, otherwise. Same comparisons and sums, in the
 * same order, as the staged code, so both give identical grants (a test checks it).
 */
function localDecisions(ctx: Ctx, q: AllocatorQuota, base: number, k: number, t: Float64Array, tb: Float64Array, usedR: number, usedB: number): boolean {
  const { idx, fl, flb, cur, curb, u, ub, d, nr, nb, flags, lflags } = ctx.scratch;
  const kc = ctx.k;
  const R = q.rate;
  const B = q.burst;
  const epsR = EPS * Math.max(1, R);
  const epsB = EPS * Math.max(1, B);
  const capR = ctx.capRate;
  const capB = ctx.capBurst;
  const thr = Math.max(kc.hysteresisMinRate, kc.hysteresisFraction * R);
  const thrB = Math.max(kc.hysteresisMinBurst, kc.hysteresisFraction * B);
  const step = Math.max(kc.minStepRate, kc.minStepFraction * R);
  const stepB = Math.max(kc.minStepRate, kc.minStepFraction * B);
  const keep = kc.keep;
  let glR = 0;
  let ghR = 0;
  let glB = 0;
  let ghB = 0;
  let growersR = 0;
  let growersB = 0;
  let shrinks = 0;
  let grows = 0;
  let parentShrinks = 0;
  let suppressed = 0;
  let waitingAck = 0;
  for (let j = 0; j < k; j++) {
    const i = base + (idx[j] as number);
    const lvl = cur[j] as number;
    const lvlB = curb[j] as number;
    const tt = t[j] as number;
    const tbb = tb[j] as number;
    const fg0 = flags[j] as number;
    const pending = (fg0 & F_PENDING) !== 0;
    const refusing = (fg0 & F_REFUSING) !== 0;
    const f = fl[j] as number;
    const fb = flb[j] as number;
    const cap = capR === null ? Infinity : (capR[i] as number);
    const capBv = capB === null ? Infinity : (capB[i] as number);
    // Rate.
    let x = lvl;
    let fg = fg0 & (F_PENDING | F_REFUSING);
    const bound = f > cap ? f : cap;
    if (lvl > bound + EPS * bound) {
      x = tt;
      fg |= F_EMIT_RATE;
      parentShrinks++;
    } else if (tt < lvl - epsR) {
      if (pending) waitingAck++;
      else if (lvl - tt >= thr) {
        x = tt;
        fg |= F_EMIT_RATE;
        shrinks++;
      }
    } else if (tt > lvl + epsR) {
      if (refusing || tt - lvl >= thr) {
        const uu = u[j] as number;
        const free = tt < uu ? tt : uu;
        glR += free > lvl ? free : lvl;
        ghR += tt;
        growersR++;
        const dx = tt - lvl;
        if (refusing ? dx >= step : dx >= thr) {
          x = tt;
          fg |= F_EMIT_RATE;
          grows++;
        } else suppressed++;
      } else suppressed++;
    }
    const dd = d[j] as number;
    if (dd > x + epsR && x < keep * (dd < tt ? dd : tt) - epsR) return false;
    // Burst.
    let y = lvlB;
    const emitting = (fg & F_EMIT_RATE) !== 0;
    const boundB = fb > capBv ? fb : capBv;
    if (lvlB > boundB + EPS * boundB) {
      y = tbb;
      fg |= F_EMIT_BURST;
      if (!emitting) parentShrinks++;
    } else if (tbb < lvlB - epsB) {
      if (emitting) y = tbb;
      else if (!pending && lvlB - tbb >= thrB) {
        y = tbb;
        fg |= F_EMIT_BURST;
      }
    } else if (tbb > lvlB + epsB) {
      if (emitting || tbb - lvlB >= thrB || lvlB < keep * tbb) {
        const uub = ub[j] as number;
        const free = tbb < uub ? tbb : uub;
        glB += free > lvlB ? free : lvlB;
        ghB += tbb;
        growersB++;
        if (emitting || tbb - lvlB >= stepB) {
          y = tbb;
          fg |= F_EMIT_BURST;
        }
        if (y < keep * tbb - epsB) return false;
      }
    }
    nr[j] = x;
    nb[j] = y;
    lflags[j] = fg;
  }
  if (growersR > 0) {
    if (usedR > R + epsR) return false;
    const freeR = R - usedR;
    if (!(glR + (freeR > 0 ? freeR : 0) >= ghR)) return false;
  }
  if (growersB > 0) {
    if (usedB > B + epsB) return false;
    const freeB = B - usedB;
    if (!(glB + (freeB > 0 ? freeB : 0) >= ghB)) return false;
  }
  for (let j = 0; j < k; j++) flags[j] = lflags[j] as number;
  const st = ctx.stats;
  st.shrinks += shrinks;
  st.grows += grows;
  st.parentShrinks += parentShrinks;
  st.suppressed += suppressed;
  st.waitingAck += waitingAck;
  return true;
}

/** Writes the levels (for children's caps) and pushes a grant for every flagged reporting cell. */
function emitQuota(ctx: Ctx, q: AllocatorQuota, base: number, k: number): void {
  const { idx, nr, nb, flags } = ctx.scratch;
  const levelRate = ctx.levelRate;
  const levelBurst = ctx.levelBurst;
  const epoch = ctx.s.epoch;
  const cells = ctx.cells;
  const grants = ctx.grants;
  const lease = ctx.leaseExpiresAtMs;
  let burstOnly = 0;
  for (let j = 0; j < k; j++) {
    const c = idx[j] as number;
    const i = base + c;
    const fg = flags[j] as number;
    const r = nr[j] as number;
    const b = nb[j] as number;
    if (levelRate !== null && levelBurst !== null) {
      levelRate[i] = r;
      levelBurst[i] = b;
    }
    if ((fg & (F_EMIT_RATE | F_EMIT_BURST)) === 0) continue;
    if ((fg & F_EMIT_RATE) === 0) burstOnly++;
    grants.push({ key: q.key, cellId: (cells[c] as AllocatorCell).id, rate: r, burst: b, epoch: (epoch[i] as number) + 1, leaseExpiresAtMs: lease });
  }
  ctx.stats.burstOnly += burstOnly;
}

// ---- the common case in one pass ----------------------------------------------------------------

/** fastQuota's answers: done; not done, local decisions may do; not done, the staged decisions must. */
const FAST_DONE = 0;
const FAST_TRY_LOCAL = 1;
const FAST_STAGED = 2;

/**
 * The phase-1 and phase-2 upper bounds of a cell that did not report this round, from the demand it
 * last reported (0 for a cell whose lease the round releases): the same wants a reporting cell has.
 */
function passiveWant(demandRate: number, R: number, H: number, headMin: number, cap: number, f: number): { h1: number; h2: number } {
  const dd = demandRate > 0 ? (demandRate < R ? demandRate : R) : 0; // NaN → 0
  let want = dd * H;
  if (want < dd + headMin) want = dd + headMin;
  if (want > R) want = R;
  if (dd === 0) want = 0; // a silent cell without demand keeps only its floor in the targets
  const h1 = dd < cap ? dd : cap;
  const h2 = want < cap ? want : cap;
  return { h1: h1 > f ? h1 : f, h2: h2 > f ? h2 : f };
}

/** A silent cell's burst target for rate target `t` (as a reporting cell's, before any split). */
function passiveBurst(t: number, ratio: number, capB: number, fb: number): number {
  let want = t * ratio;
  if (want > capB) want = capB;
  return want > fb ? want : fb;
}

/**
 * The same round for one quota as the general path below, in one pass, for the common case where no
 * split binds: every cell's want fits (targets = wants, rates and bursts), every grow fits in the free
 * capacity, nobody is starved or short of burst, and the quota is not over its limit while something
 * grows. Then every cell's decision is local, and the answer is FAST_DONE. Otherwise it has written
 * nothing but the levels of non-reporting cells (which the general path writes alike) and answers
 * FAST_STAGED when the targets were the wants but the grows do not fit or the quota is over its limit
 * (localDecisions would fail the same way), else FAST_TRY_LOCAL. The sums and comparisons are made in
 * the same order as the general path's, so both give identical grants (a test checks it).
 */
function fastQuota(ctx: Ctx, qi: number): number {
  const q = ctx.quotas[qi] as AllocatorQuota;
  const n = ctx.n;
  const s = ctx.s;
  const kc = ctx.k;
  const { reported, released, lapsed, hasFloor } = ctx;
  const { idx, nr, nb, flags } = ctx.scratch;
  const base = qi * n;
  const R = q.rate;
  const B = q.burst;
  const epsR = EPS * (R > 1 ? R : 1);
  const epsB = EPS * (B > 1 ? B : 1);
  const capR = ctx.capRate;
  const capB = ctx.capBurst;
  const H = kc.headroomFactor;
  const headMin = Math.max(kc.headroomMinRate, kc.headroomMinFraction * R);
  const thr = Math.max(kc.hysteresisMinRate, kc.hysteresisFraction * R);
  const thrB = Math.max(kc.hysteresisMinBurst, kc.hysteresisFraction * B);
  const step = Math.max(kc.minStepRate, kc.minStepFraction * R);
  const stepB = Math.max(kc.minStepRate, kc.minStepFraction * B);
  const keep = kc.keep;
  const ratio = B / R;
  const qFloorRate = q.floorRate;
  const qFloorBurst = q.floorBurst;
  const grantRate = s.grantRate;
  const grantBurst = s.grantBurst;
  const countedRate = s.countedRate;
  const countedBurst = s.countedBurst;
  const demand = s.demand;
  const acknowledged = s.acknowledged;
  const levelRate = ctx.levelRate;
  const levelBurst = ctx.levelBurst;

  let givenR = 0;
  let givenB = 0;
  let sumU = 0;
  let sumUB = 0;
  let fixedR = 0;
  let fixedB = 0;
  let sumT = 0;
  let sumTb = 0;
  let glR = 0; // Σ free levels and Σ targets of the rate growers (as the general path sums them)
  let ghR = 0;
  let glB = 0;
  let ghB = 0;
  let growersR = 0;
  let growersB = 0;
  let shrinks = 0;
  let grows = 0;
  let parentShrinks = 0;
  let suppressed = 0;
  let waitingAck = 0;
  let k = 0;
  for (let c = 0; c < n; c++) {
    const i = base + c;
    const floored = hasFloor[c] === 1;
    const f = floored ? qFloorRate : 0;
    const fb = floored ? qFloorBurst : 0;
    const rel = released[c] === 1;
    const g = rel ? 0 : (grantRate[i] as number);
    const gb = rel ? 0 : (grantBurst[i] as number);
    const cr = countedRate[i] as number;
    const cb = countedBurst[i] as number;
    givenR += cr;
    givenB += cb;
    const lvl = g > f ? g : f;
    const lvlB = gb > fb ? gb : fb;
    const uu = cr > lvl ? cr : lvl;
    const uub = cb > lvlB ? cb : lvlB;
    sumU += uu;
    sumUB += uub;
    if (reported[c] !== 1) {
      // As in allocateQuota: a silent cell counts with its target, which is its want when all fit.
      const w = passiveWant(rel || lapsed[c] === 1 ? 0 : (demand[i] as number), R, H, headMin, capR === null ? Infinity : (capR[i] as number), f);
      fixedR += w.h2;
      fixedB += passiveBurst(w.h2, ratio, capB === null ? Infinity : (capB[i] as number), fb);
      if (levelRate !== null && levelBurst !== null) {
        levelRate[i] = lvl;
        levelBurst[i] = lvlB;
      }
      continue;
    }
    let dd = demand[i] as number;
    dd = dd > 0 ? (dd < R ? dd : R) : 0;
    const pending = acknowledged[i] !== 1 && (uu > lvl + epsR || uub > lvlB + epsB);
    const refusing = dd > lvl + epsR;
    let want = dd * H;
    if (want < dd + headMin) want = dd + headMin;
    if (want > R) want = R;
    const cap = capR === null ? Infinity : (capR[i] as number);
    const h2 = want < cap ? want : cap;
    const t = h2 > f ? h2 : f;
    sumT += t;
    let wantB = t * ratio;
    const capBv = capB === null ? Infinity : (capB[i] as number);
    if (wantB > capBv) wantB = capBv;
    const tb = wantB > fb ? wantB : fb;
    sumTb += tb;

    // Rate.
    let x = lvl;
    let fg = 0;
    const bound = f > cap ? f : cap;
    if (lvl > bound + EPS * bound) {
      x = t;
      fg = F_EMIT_RATE;
      parentShrinks++;
    } else if (t < lvl - epsR) {
      if (pending) waitingAck++;
      else if (lvl - t >= thr) {
        x = t;
        fg = F_EMIT_RATE;
        shrinks++;
      }
      // else: a small excess, shrunk only to make room for a starved cell (none here, see below)
    } else if (t > lvl + epsR) {
      if (refusing || t - lvl >= thr) {
        const free = t < uu ? t : uu;
        glR += free > lvl ? free : lvl;
        ghR += t;
        growersR++;
        const dx = t - lvl;
        if (refusing ? dx >= step : dx >= thr) {
          x = t;
          fg = F_EMIT_RATE;
          grows++;
        } else suppressed++;
      } else suppressed++;
    }
    // A starved cell makes the general path force small shrinks elsewhere.
    if (dd > x + epsR && x < keep * (dd < t ? dd : t) - epsR) return FAST_TRY_LOCAL;

    // Burst.
    let y = lvlB;
    const emitting = fg !== 0;
    const boundB = fb > capBv ? fb : capBv;
    if (lvlB > boundB + EPS * boundB) {
      y = tb;
      fg |= F_EMIT_BURST;
      if (!emitting) parentShrinks++;
    } else if (tb < lvlB - epsB) {
      if (emitting) y = tb;
      else if (!pending && lvlB - tb >= thrB) {
        y = tb;
        fg |= F_EMIT_BURST;
      }
    } else if (tb > lvlB + epsB) {
      if (emitting || tb - lvlB >= thrB || lvlB < keep * tb) {
        const free = tb < uub ? tb : uub;
        glB += free > lvlB ? free : lvlB;
        ghB += tb;
        growersB++;
        if (emitting || tb - lvlB >= stepB) {
          y = tb;
          fg |= F_EMIT_BURST;
        }
        if (y < keep * tb - epsB) return FAST_TRY_LOCAL; // short of burst: the general path forces shrinks
      }
    }
    idx[k] = c;
    nr[k] = x;
    nb[k] = y;
    flags[k] = fg;
    k++;
  }
  if (k === 0) return FAST_DONE;
  const reservedR = Math.max(0, q.countedRate - givenR);
  const reservedB = Math.max(0, q.countedBurst - givenB);
  const usedR = sumU + reservedR;
  const usedB = sumUB + reservedB;
  if (sumT > R - reservedR - fixedR) return FAST_TRY_LOCAL;
  if (sumTb > B - reservedB - fixedB) return FAST_TRY_LOCAL;
  if (growersR > 0) {
    if (usedR > R + epsR) return FAST_STAGED;
    const freeR = R - usedR;
    if (!(glR + (freeR > 0 ? freeR : 0) >= ghR)) return FAST_STAGED;
  }
  if (growersB > 0) {
    if (usedB > B + epsB) return FAST_STAGED;
    const freeB = B - usedB;
    if (!(glB + (freeB > 0 ? freeB : 0) >= ghB)) return FAST_STAGED;
  }
  const st = ctx.stats;
  st.shrinks += shrinks;
  st.grows += grows;
  st.parentShrinks += parentShrinks;
  st.suppressed += suppressed;
  st.waitingAck += waitingAck;
  emitQuota(ctx, q, base, k);
  return FAST_DONE;
}

// ---- hierarchy ----------------------------------------------------------------------------------

class CapScratch {
  lo = new Float64Array(64);
  hi1 = new Float64Array(64);
  hi2 = new Float64Array(64);
  out = new Float64Array(64);
  /** Per child: rate, burst/rate, floor rate, floor burst, minimum headroom. */
  rate = new Float64Array(64);
  ratio = new Float64Array(64);
  floorRate = new Float64Array(64);
  floorBurst = new Float64Array(64);
  headMin = new Float64Array(64);
  readonly fill = new WaterFillScratch();
  ensure(size: number, m: number): void {
    if (this.lo.length < size) {
      let next = this.lo.length;
      while (next < size) next *= 2;
      this.lo = new Float64Array(next);
      this.hi1 = new Float64Array(next);
      this.hi2 = new Float64Array(next);
      this.out = new Float64Array(next);
    }
    if (this.rate.length < m) {
      let next = this.rate.length;
      while (next < m) next *= 2;
      this.rate = new Float64Array(next);
      this.ratio = new Float64Array(next);
      this.floorRate = new Float64Array(next);
      this.floorBurst = new Float64Array(next);
      this.headMin = new Float64Array(next);
    }
  }
}

/** Children handled per block when moving values between their rows and the per-cell segments. */
const CAP_BLOCK = 256;

/**
 * After parent `p` is allocated: at each reporting cell, split the parent's new level over its
 * children's wants there (demands first, then headroom; floors as lower bounds) and store each
 * child's share as its cap at that cell — only where the children's wants or current levels would
 * not all fit. Bursts alike, each child wanting its burst share of its (capped) rate want.
 *
 * Memory layout: the children's rows are read once, in order, and their values written into one
 * contiguous segment per cell (scratch index c × m + x), so that each cell's split runs over
 * contiguous memory; the caps are written back row by row.
 */
function capChildren(ctx: Ctx, p: number, children: Int32Array, cs: CapScratch): void {
  const { n, s, quotas, k: kc, reported, released, hasFloor } = ctx;
  const levelRate = ctx.levelRate as Float64Array;
  const levelBurst = ctx.levelBurst as Float64Array;
  const capRate = ctx.capRate as Float64Array;
  const capBurst = ctx.capBurst as Float64Array;
  const m = children.length;
  cs.ensure(m * n, m);
  const { lo, hi1, hi2, out } = cs;
  const demand = s.demand;
  const grantRate = s.grantRate;
  const grantBurst = s.grantBurst;
  const H = kc.headroomFactor;
  const sumCur = new Float64Array(n);
  const sum1 = new Float64Array(n);
  const bind = new Uint8Array(n);
  // The children's constants, read once.
  for (let x = 0; x < m; x++) {
    const cq = quotas[children[x] as number] as AllocatorQuota;
    cs.rate[x] = cq.rate;
    cs.ratio[x] = cq.burst / cq.rate;
    cs.floorRate[x] = cq.floorRate;
    cs.floorBurst[x] = cq.floorBurst;
    cs.headMin[x] = Math.max(kc.headroomMinRate, kc.headroomMinFraction * cq.rate);
  }
  const cRate = cs.rate;
  const cRatio = cs.ratio;
  const cFloorRate = cs.floorRate;
  const cFloorBurst = cs.floorBurst;
  const cHeadMin = cs.headMin;
  // Rates: gather, a block of children at a time (their rows stay in cache while each cell's
  // segment is written sequentially).
  for (let x0 = 0; x0 < m; x0 += CAP_BLOCK) {
    const x1 = x0 + CAP_BLOCK < m ? x0 + CAP_BLOCK : m;
    for (let c = 0; c < n; c++) {
      if (reported[c] !== 1) continue;
      const floored = hasFloor[c] === 1;
      const rel = released[c] === 1;
      const seg = c * m;
      let sc = 0;
      let s1 = 0;
      for (let x = x0; x < x1; x++) {
        const i = (children[x] as number) * n + c;
        const R = cRate[x] as number;
        const f = floored ? (cFloorRate[x] as number) : 0;
        let dd = demand[i] as number;
        dd = dd > 0 ? (dd < R ? dd : R) : 0;
        let want = dd * H;
        const hm = dd + (cHeadMin[x] as number);
        if (want < hm) want = hm;
        if (want > R) want = R;
        const h1 = dd > f ? dd : f;
        const h2 = want > f ? want : f;
        const at = seg + x;
        lo[at] = f;
        hi1[at] = h1;
        hi2[at] = h2;
        const g = rel ? 0 : (grantRate[i] as number);
        const lvl = g > f ? g : f;
        sc += h2 > lvl ? h2 : lvl;
        s1 += h1;
      }
      sumCur[c] = (sumCur[c] as number) + sc;
      sum1[c] = (sum1[c] as number) + s1;
    }
  }
  // Rates: split where it binds.
  for (let c = 0; c < n; c++) {
    if (reported[c] !== 1) continue;
    const P = levelRate[p * n + c] as number;
    if (!((sumCur[c] as number) > P)) continue;
    bind[c] = 1;
    const from = c * m;
    const segLo = lo.subarray(from, from + m);
    const seg1 = hi1.subarray(from, from + m);
    const seg2 = hi2.subarray(from, from + m);
    const segOut = out.subarray(from, from + m);
    if ((sum1[c] as number) <= P) waterFill(seg1, seg2, m, P, segOut, cs.fill);
    else waterFill(segLo, seg1, m, P, segOut, cs.fill);
  }
  // Rates: write the caps back; bursts: gather (each child's burst share of its capped rate want).
  sumCur.fill(0);
  for (let x0 = 0; x0 < m; x0 += CAP_BLOCK) {
    const x1 = x0 + CAP_BLOCK < m ? x0 + CAP_BLOCK : m;
    for (let c = 0; c < n; c++) {
      if (reported[c] !== 1) continue;
      const floored = hasFloor[c] === 1;
      const rel = released[c] === 1;
      const binds = bind[c] === 1;
      const seg = c * m;
      let sb = 0;
      for (let x = x0; x < x1; x++) {
        const i = (children[x] as number) * n + c;
        const at = seg + x;
        let rateWant = hi2[at] as number;
        if (binds) {
          const cap = out[at] as number;
          capRate[i] = cap;
          if (cap < rateWant) rateWant = cap;
        }
        const fb = floored ? (cFloorBurst[x] as number) : 0;
        const want = rateWant * (cRatio[x] as number);
        const h = want > fb ? want : fb;
        lo[at] = fb;
        hi1[at] = h;
        const gb = rel ? 0 : (grantBurst[i] as number);
        const lvlB = gb > fb ? gb : fb;
        sb += h > lvlB ? h : lvlB;
      }
      sumCur[c] = (sumCur[c] as number) + sb;
    }
  }
  // Bursts: split where it binds, then write back.
  let anyBind = false;
  for (let c = 0; c < n; c++) {
    bind[c] = 0;
    if (reported[c] !== 1) continue;
    const PB = levelBurst[p * n + c] as number;
    if (!((sumCur[c] as number) > PB)) continue;
    bind[c] = 1;
    anyBind = true;
    const from = c * m;
    waterFill(lo.subarray(from, from + m), hi1.subarray(from, from + m), m, PB, out.subarray(from, from + m), cs.fill);
  }
  if (!anyBind) return;
  for (let x0 = 0; x0 < m; x0 += CAP_BLOCK) {
    const x1 = x0 + CAP_BLOCK < m ? x0 + CAP_BLOCK : m;
    for (let c = 0; c < n; c++) {
      if (bind[c] !== 1) continue;
      const seg = c * m;
      for (let x = x0; x < x1; x++) capBurst[(children[x] as number) * n + c] = out[seg + x] as number;
    }
  }
}
