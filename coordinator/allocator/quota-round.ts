// One quota's round: read the cells (cell-read.ts), split the targets where they do not all fit
// (water-fill.ts; usually they fit and the targets are the wants), then decide — locally when every
// grow fits (cell-decision.ts, the common case), else in stages: rate shrinks and grow candidates,
// the grows water-filled over the free capacity, starvation (small excesses shrunk for a starved
// cell), then bursts alike — and write the grants (grant-output.ts).

import type { AllocatorQuota } from './allocator-types.js';
import { burstTarget } from './cell-read.js';
import type { QuotaReader } from './cell-read.js';
import {
  M_FOLLOW,
  M_GROW,
  M_PARENT,
  M_SHRINK,
  M_SMALL_OVER,
  M_SUPPRESS,
  M_WAIT,
  burstMove,
  freeLevel,
  growSent,
  localDecisions,
  rateMove,
  starved,
} from './cell-decision.js';
import type { Thresholds } from './cell-decision.js';
import { emitQuota } from './grant-output.js';
import { F_EMIT_BURST, F_EMIT_RATE, F_PENDING, F_REFUSING, F_SMALL_OVER, F_SMALL_OVER_B } from './round-context.js';
import type { Ctx, Scratch } from './round-context.js';
import { waterFill } from './water-fill.js';

/** The round for quota `qi`. */
export function allocateQuota(ctx: Ctx, qi: number, rd: QuotaReader, th: Thresholds): void {
  const q = ctx.quotas[qi] as AllocatorQuota;
  const { n } = ctx;
  const sc = ctx.scratch;
  const { fl, hi1, hi2, flb, capb } = sc;
  // Reporting cells at [0, k), silent ones at [k, n). A silent cell gets no grant, but it takes
  // part in the targets with the demand it last reported: otherwise each round would split only what
  // the silent cells leave, and with reports spread over rounds no cell's target would ever move.
  rd.read(ctx, q, qi);
  const k = rd.k;
  if (k === 0) return;
  const { usedR, usedB } = rd;

  // ---- targets ----------------------------------------------------------------------------------
  // Max-min fair over every cell; the reporting cells' targets are t[0..k), the silent cells'
  // targets count against the burst capacity below.
  const capacity = q.rate - rd.reservedR;
  // Usually every want fits (t = the wants, no split needed).
  let t: Float64Array = hi2;
  if (rd.sum2 + rd.psum2 > capacity || !ctx.fastPath) {
    t = sc.t;
    if (rd.sum1 + rd.psum1 <= capacity) waterFill(hi1, hi2, n, capacity, t, sc.fill);
    else waterFill(fl, hi1, n, capacity, t, sc.fill);
  }
  // Burst targets: proportional to the rate targets, under the burst's own capacity and parent cap.
  const ratio = rd.ratio;
  let fixedB = 0;
  for (let j = k; j < n; j++) fixedB += burstTarget(t[j] as number, ratio, capb[j] as number, flb[j] as number);
  const capacityB = q.burst - rd.reservedB - fixedB;
  let sumB = 0;
  for (let j = 0; j < k; j++) {
    const f = flb[j] as number;
    const x = burstTarget(t[j] as number, ratio, capb[j] as number, f);
    hi1[j] = x;
    sumB += x;
  }
  let tb: Float64Array = hi1;
  if (sumB > capacityB || !ctx.fastPath) {
    tb = sc.tb;
    waterFill(flb, hi1, k, capacityB, tb, sc.fill);
  }

  // ---- decisions --------------------------------------------------------------------------------
  th.set(ctx.k, q.rate, q.burst);
  // Usually every cell's decision is local (all grows fit), even when the targets needed a split.
  if (!(
    ctx.localDecisions &&
    localDecisions(sc, k, t, tb, ctx.capRate, qi * n, q.rate, q.burst, usedR, usedB, rd.epsR, rd.epsB, th, ctx.stats)
  )) {
    stagedRate(ctx, q, qi * n, k, t, usedR, rd.epsR, th);
    stagedBurst(ctx, q, k, tb, usedB, rd.epsB, th);
  }
  emitQuota(ctx, q, qi, k, usedR, usedB);
}

/** Water-fills the grow candidates gl[0..ng) → gh over Σ gl + the free capacity, into go. */
function fillGrows(sc: Scratch, ng: number, limit: number, used: number): void {
  const { gl, gh, go } = sc;
  const free = limit - used;
  let budget = 0;
  for (let m = 0; m < ng; m++) budget += gl[m] as number;
  // The growers' cost is what they rise above their counted use; the free levels are gl.
  waterFill(gl, gh, ng, budget + (free > 0 ? free : 0), go, sc.fill);
}

/** Rates, in stages: shrinks and grow candidates, the grows water-filled, then starvation. */
function stagedRate(
  ctx: Ctx,
  q: AllocatorQuota,
  base: number,
  k: number,
  t: Float64Array,
  usedR: number,
  epsR: number,
  th: Thresholds,
): void {
  const { idx, fl, cur, u, d, nr, flags, gl, gh, go, gi } = ctx.scratch;
  const st = ctx.stats;
  const capR = ctx.capRate;
  // Over the limit (an operator lowered the quota and old grants are still counted): the ledger then
  // accepts only rounds that do not raise Σu above its value after this entry's own releases and
  // acknowledgements, which the allocator cannot see exactly; so no cell grows at all until Σu is
  // back under the limit. (Under the limit, the check is Σu ≤ limit, and counting the pre-entry u —
  // an upper bound — is safe.)
  const overR = usedR > q.rate + epsR;
  let ng = 0;
  for (let j = 0; j < k; j++) {
    const c0 = cur[j] as number;
    const tt = t[j] as number;
    let fg = flags[j] as number;
    nr[j] = c0;
    const cap = capR === null ? Infinity : (capR[base + (idx[j] as number)] as number);
    const f = fl[j] as number;
    const m = rateMove(c0, tt, f > cap ? f : cap, (fg & F_PENDING) !== 0, (fg & F_REFUSING) !== 0, th.thr, epsR);
    if (m === M_PARENT || m === M_SHRINK) {
      // Above its parent's share at this cell: shrink whatever the hysteresis or a pending ack says
      // (tt ≤ bound: the parent cap is in the target's upper bound).
      nr[j] = tt;
      fg |= F_EMIT_RATE;
      if (m === M_PARENT) st.parentShrinks++;
      else st.shrinks++;
    } else if (m === M_WAIT) st.waitingAck++;
    else if (m === M_SMALL_OVER) fg |= F_SMALL_OVER;
    else if (m === M_SUPPRESS) st.suppressed++;
    else if (m === M_GROW) {
      if (overR) st.growBlockedRate += tt - c0;
      else {
        gl[ng] = freeLevel(c0, tt, u[j] as number);
        gh[ng] = tt;
        gi[ng] = j;
        ng++;
      }
    }
    flags[j] = fg;
  }
  if (ng > 0) {
    fillGrows(ctx.scratch, ng, q.rate, usedR);
    for (let m = 0; m < ng; m++) {
      const j = gi[m] as number;
      const x = go[m] as number;
      st.growBlockedRate += (gh[m] as number) - x;
      const fg = flags[j] as number;
      if (growSent(x - (cur[j] as number), (fg & F_REFUSING) !== 0, th.step, th.thr)) {
        nr[j] = x;
        flags[j] = fg | F_EMIT_RATE;
        st.grows++;
      } else st.suppressed++;
    }
  }
  // Starvation: a refusing cell still below (1 − tol) × min(demand, target) after the grows makes
  // every over-target cell shrink, however small its excess.
  let nStarved = 0;
  for (let j = 0; j < k; j++) if (starved(d[j] as number, nr[j] as number, t[j] as number, th.keep, epsR)) nStarved++;
  st.starved += nStarved;
  if (nStarved > 0) {
    for (let j = 0; j < k; j++) {
      const fg = flags[j] as number;
      if ((fg & F_SMALL_OVER) !== 0) {
        nr[j] = t[j] as number;
        flags[j] = fg | F_EMIT_RATE;
        st.forcedShrinks++;
      }
    }
  }
}

/** Bursts, in stages, after the rates (a burst follows a rate that goes out anyway). */
function stagedBurst(
  ctx: Ctx,
  q: AllocatorQuota,
  k: number,
  tb: Float64Array,
  usedB: number,
  epsB: number,
  th: Thresholds,
): void {
  const { flb, curb, ub, capb, nb, flags, gl, gh, go, gi } = ctx.scratch;
  const st = ctx.stats;
  const overB = usedB > q.burst + epsB; // no burst grows while over the limit (see overR)
  let ng = 0;
  for (let j = 0; j < k; j++) {
    const c0 = curb[j] as number;
    const tt = tb[j] as number;
    let fg = flags[j] as number;
    const emitting = (fg & F_EMIT_RATE) !== 0;
    nb[j] = c0;
    const cap = capb[j] as number;
    const f = flb[j] as number;
    const m = burstMove(c0, tt, f > cap ? f : cap, emitting, (fg & F_PENDING) !== 0, th.thrB, th.keep, epsB);
    if (m === M_PARENT || m === M_SHRINK) {
      nb[j] = tt;
      fg |= F_EMIT_BURST;
      if (m === M_PARENT && !emitting) st.parentShrinks++;
    } else if (m === M_FOLLOW)
      nb[j] = tt; // a grant goes out anyway: shrinking its burst costs nothing more
    else if (m === M_SMALL_OVER) fg |= F_SMALL_OVER_B;
    else if (m === M_GROW && !overB) {
      gl[ng] = freeLevel(c0, tt, ub[j] as number);
      gh[ng] = tt;
      gi[ng] = j;
      ng++;
    }
    flags[j] = fg;
  }
  let burstShort = 0;
  if (ng > 0) {
    fillGrows(ctx.scratch, ng, q.burst, usedB);
    for (let m = 0; m < ng; m++) {
      const j = gi[m] as number;
      const x = go[m] as number;
      const fg = flags[j] as number;
      if ((fg & F_EMIT_RATE) !== 0 || x - (curb[j] as number) >= th.stepB) {
        nb[j] = x;
        flags[j] = fg | F_EMIT_BURST;
      }
      if ((nb[j] as number) < th.keep * (gh[m] as number) - epsB) burstShort++;
    }
  }
  st.burstShort += burstShort;
  if (burstShort > 0) {
    for (let j = 0; j < k; j++) {
      const fg = flags[j] as number;
      if ((fg & F_SMALL_OVER_B) !== 0) {
        nb[j] = tb[j] as number;
        flags[j] = fg | F_EMIT_BURST;
      }
    }
  }
}
