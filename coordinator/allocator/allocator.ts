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
// ## Cost, and the modules
//
// O(quotas × cells) for the quotas given — the incremental lease round (coordinator/lease/
// incremental-policy.ts) gives only those whose inputs changed. The input is columnar (typed
// arrays, quota-major) and nothing is allocated per slice: the grants come out in columns
// (grant-output.ts), and `Grant` objects are made only for those a caller takes. Per quota
// (quota-round.ts): read the cells into per-cell scratch columns (cell-read.ts); targets are the
// wants when they all fit (the common case), else split (water-fill.ts); decisions are local when
// every grow fits (the common case), else staged (grows water-filled, starvation, bursts) — one set
// of rules for both (cell-decision.ts), and a test checks that the shortcuts give the staged
// code's output. A tier or domain cap over many tenants is split per cell over contiguous scratch
// segments (cap-children.ts); parents go first (hierarchy-order.ts). The post-conditions are
// checked as the round runs (postconditions.ts). Reuse one AllocatorWorkspace across rounds.
// Figures: bench/allocator.ts.

import { DEFAULT_TUNING } from './allocator-types.js';
import type {
  AllocatorCell,
  AllocatorInput,
  AllocatorOutput,
  AllocatorQuota,
  AllocatorStats,
  AllocatorTuning,
} from './allocator-types.js';
import { CapScratch, capChildren } from './cap-children.js';
import { Thresholds } from './cell-decision.js';
import { QuotaReader } from './cell-read.js';
import { GrantColumns } from './grant-output.js';
import { quotaOrder } from './hierarchy-order.js';
import { checkChildren } from './postconditions.js';
import { constsOf, Scratch } from './round-context.js';
import type { Ctx } from './round-context.js';
import { allocateQuota } from './quota-round.js';
import { validateInput } from './validate-input.js';

export {
  AllocatorInputError,
  AllocatorInvariantError,
  DEFAULT_TUNING,
  type AllocatorCell,
  type AllocatorInput,
  type AllocatorOutput,
  type AllocatorQuota,
  type AllocatorSlices,
  type AllocatorStats,
  type AllocatorTuning,
} from './allocator-types.js';
export { GrantColumns } from './grant-output.js';

/**
 * Reusable buffers for a round (per-slice levels and parent caps, per-cell scratch, the output
 * columns). Purely a cache: a round's result never depends on what a workspace held before, so one
 * workspace may serve every round (the coordinator keeps one; a 100,000 × 16 round with caps would
 * otherwise allocate ~80 MB of typed arrays each time, which the garbage collector then has to
 * reclaim). Not for two rounds at once.
 */
export class AllocatorWorkspace {
  /** @internal */ levelRate = new Float64Array(0);
  /** @internal */ levelBurst = new Float64Array(0);
  /** @internal */ capRate = new Float64Array(0);
  /** @internal */ capBurst = new Float64Array(0);
  /** @internal */ readonly cap = new CapScratch();
  /** @internal */ scratch: Scratch | null = null;
  /** @internal */ readonly reader = new QuotaReader();
  /** @internal */ readonly thresholds = new Thresholds();
  /** @internal */ readonly out = new GrantColumns();
  /** @internal */ unsettled = new Uint8Array(0);

  /** @internal */
  slices(size: number): void {
    if (this.levelRate.length >= size) return;
    this.levelRate = new Float64Array(size);
    this.levelBurst = new Float64Array(size);
    this.capRate = new Float64Array(size);
    this.capBurst = new Float64Array(size);
  }

  /** @internal The round's per-quota settled flags, zeroed (valid until the next round). */
  unsettledFlags(nq: number): Uint8Array {
    if (this.unsettled.length < nq) this.unsettled = new Uint8Array(Math.max(nq, 2 * this.unsettled.length));
    const flags = this.unsettled.subarray(0, nq);
    flags.fill(0);
    return flags;
  }

  /** @internal */
  cellScratch(n: number): Scratch {
    if (this.scratch === null || this.scratch.idx.length < n) this.scratch = new Scratch(n);
    return this.scratch;
  }
}

/** A round's result in columns (allocateRoundColumns): the grants stay in the workspace's buffers. */
export interface AllocatorColumnsOutput {
  /** The changed grants, in columns; valid until the next round on the same workspace. */
  readonly changes: GrantColumns;
  readonly stats: AllocatorStats;
  /** AllocatorOutput.unsettled, the workspace's; valid until the next round on the same workspace. */
  readonly unsettled: Uint8Array;
}

/**
 * Computes one rebalancing round. Returns only the grants that change, each with epoch = current + 1
 * and leaseExpiresAtMs = nowMs + leaseTtlMs. Throws AllocatorInputError on malformed input (sizes,
 * non-finite numbers, an unknown or repeated parent, a parent cycle), AllocatorInvariantError if a
 * post-condition fails (a bug). `workspace`: reusable buffers (optional; see AllocatorWorkspace).
 */
export function allocateRound(input: AllocatorInput, workspace?: AllocatorWorkspace): AllocatorOutput {
  return allocateRoundWith(input, { fastPath: true, localDecisions: true }, workspace);
}

/**
 * allocateRound with the grants in columns, no `Grant` object made: for a caller that sends only
 * some of them (the incremental lease round, within its budget). `changes` is the workspace's.
 */
export function allocateRoundColumns(input: AllocatorInput, workspace: AllocatorWorkspace): AllocatorColumnsOutput {
  return run(input, { fastPath: true, localDecisions: true }, workspace);
}

/**
 * allocateRound with internal switches, for tests: `fastPath: false` water-fills every quota's
 * targets even when every want fits; `localDecisions: false` always takes the staged decisions.
 * Both shortcuts must give output identical to the general, staged code.
 */
export function allocateRoundWith(
  input: AllocatorInput,
  options: { readonly fastPath: boolean; readonly localDecisions: boolean },
  workspace: AllocatorWorkspace = new AllocatorWorkspace(),
): AllocatorOutput {
  const r = run(input, options, workspace);
  return { grants: r.changes.grants(input), stats: r.stats, unsettled: r.unsettled.slice() };
}

function run(
  input: AllocatorInput,
  options: { readonly fastPath: boolean; readonly localDecisions: boolean },
  workspace: AllocatorWorkspace,
): AllocatorColumnsOutput {
  const tuning: AllocatorTuning = { ...DEFAULT_TUNING, ...input.tuning };
  const { cells, quotas, slices } = input;
  const n = cells.length;
  const nq = quotas.length;
  validateInput(input, tuning);

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
  const { order, childStart, children } = quotaOrder(quotas);
  const anyParent = childStart !== null;
  const total = nq * n;
  if (anyParent) {
    workspace.slices(total);
    workspace.capRate.fill(Infinity, 0, total);
    workspace.capBurst.fill(Infinity, 0, total);
  }
  const out = workspace.out;
  out.reset(input.nowMs + input.leaseTtlMs);
  const ctx: Ctx = {
    n,
    leaseExpiresAtMs: input.nowMs + input.leaseTtlMs,
    cells,
    quotas,
    s: slices,
    k: constsOf(tuning),
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
    out,
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
  const { reader, thresholds } = workspace;
  const unsettled = workspace.unsettledFlags(nq);
  const st = ctx.stats;
  for (let k = 0; k < nq; k++) {
    const q = order[k] as number;
    const g0 = out.count;
    const w0 = st.waitingAck;
    const s0 = st.starved + st.burstShort;
    const b0 = st.growBlockedRate;
    allocateQuota(ctx, q, reader, thresholds);
    // Settled: nothing sent, nobody waiting for an acknowledgement, starved, or held below its
    // target by more than the smallest step (see AllocatorOutput.unsettled).
    const qq = quotas[q] as AllocatorQuota;
    const step = Math.max(tuning.minStepRate, tuning.minStepFraction * qq.rate);
    if (
      out.count !== g0 ||
      st.waitingAck !== w0 ||
      st.starved + st.burstShort !== s0 ||
      st.growBlockedRate - b0 >= step
    )
      unsettled[q] = 1;
    if (childStart !== null && children !== null) {
      const from = childStart[q] as number;
      const to = childStart[q + 1] as number;
      if (to > from) capChildren(ctx, q, children.subarray(from, to), workspace.cap);
    }
  }
  // The caps' post-condition, once their children are allocated.
  if (childStart !== null && children !== null) {
    for (let q = 0; q < nq; q++) {
      const from = childStart[q] as number;
      const to = childStart[q + 1] as number;
      if (to > from) checkChildren(ctx, q, children.subarray(from, to));
    }
  }
  st.grants = out.count;
  return { changes: out, stats: st, unsettled };
}
