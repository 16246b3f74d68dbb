// Reading one quota's cells at the start of its round (quota-round.ts), the step every decision
// path starts from: per cell its floor, its level max(floor, grant) (a released lease: the floor
// alone), what the ledger counts it as using, its demand, whether a shrink is pending or it is
// refusing traffic, its phase-1 / phase-2 wants under the parent's cap. Everything goes into the
// scratch columns (typed arrays: the hot loop allocates nothing).

import type { AllocatorQuota } from './allocator-types.js';
import { EPS, F_PENDING, F_REFUSING } from './round-context.js';
import type { Ctx } from './round-context.js';

/** A demand as the allocator takes it: NaN and negatives 0, at most the quota's rate. */
export function clampDemand(d: number, R: number): number {
  return d > 0 ? (d < R ? d : R) : 0; // NaN → 0
}

/** What a cell with demand `dd` wants with headroom: max(dd × H, dd + headMin), at most R. */
export function headroomWant(dd: number, R: number, H: number, headMin: number): number {
  let want = dd * H;
  if (want < dd + headMin) want = dd + headMin;
  return want > R ? R : want;
}

/** The burst target for rate target `t`: its burst share (t × burst/rate), under the cap, at least the floor. */
export function burstTarget(t: number, ratio: number, capB: number, fb: number): number {
  let want = t * ratio;
  if (want > capB) want = capB;
  return want > fb ? want : fb;
}

/** The minimum headroom of a quota of rate R. */
export function headroomMin(ctx: Ctx, R: number): number {
  return Math.max(ctx.k.headroomMinRate, ctx.k.headroomMinFraction * R);
}

/**
 * Reads one quota's cells into the scratch columns (`read`), for the round's steps after it: the
 * reporting cells compacted at [0, k), the silent ones from the top, at [n − p, n). Reused (one per
 * workspace); the per-quota results are its fields, valid until the next `read`.
 */
export class QuotaReader {
  /** The quota's burst/rate and tolerances. */
  ratio = 0;
  epsR = 0;
  epsB = 0;
  /** Reporting cells (at [0, k) of the scratch). */
  k = 0;
  /** Σ phase-1 and phase-2 wants of the reporting cells, and of the silent ones. */
  sum1 = 0;
  sum2 = 0;
  psum1 = 0;
  psum2 = 0;
  /** What the ledger counts beyond the cells given (unregistered floor slots), rate and burst. */
  reservedR = 0;
  reservedB = 0;
  /** Σu as the ledger counts it (the cells' u, at least their levels, plus the reserved). */
  usedR = 0;
  usedB = 0;

  /**
   * Reads quota `qi`'s cells into the scratch: per cell at its position, idx, fl / flb (floors),
   * cur / curb (levels max(floor, grant); a released lease: the floor), u / ub (what the ledger
   * counts, at least the level), d (demand), capb (the parent's burst cap), hi1 / hi2 (the
   * phase-1 and phase-2 wants, under the cap, at least the floor) and flags (F_PENDING,
   * F_REFUSING). A silent cell takes part in the targets with the demand it last reported (none
   * once its lease is over: its floor only) and gets no grant; its level is written for its
   * children's caps here.
   */
  read(ctx: Ctx, q: AllocatorQuota, qi: number): void {
    const n = ctx.n;
    const s = ctx.s;
    const sc = ctx.scratch;
    const { idx, fl, flb, cur, curb, u, ub, d, capb, hi1, hi2, flags } = sc;
    const { hasFloor, released, reported, lapsed, capRate, capBurst, levelRate, levelBurst } = ctx;
    const { grantRate, grantBurst, countedRate, countedBurst, demand, acknowledged } = s;
    const base = qi * n;
    const R = q.rate;
    const B = q.burst;
    const epsR = EPS * (R > 1 ? R : 1);
    const epsB = EPS * (B > 1 ? B : 1);
    const H = ctx.k.headroomFactor;
    const headMin = headroomMin(ctx, R);
    // The quota's floors read once (a property load in the loop was its largest cost).
    const qFloor = q.floorRate;
    const qFloorB = q.floorBurst;
    let givenR = 0;
    let givenB = 0;
    let sumU = 0;
    let sumUB = 0;
    let sum1 = 0;
    let sum2 = 0;
    let psum1 = 0;
    let psum2 = 0;
    let k = 0;
    let p = 0;
    for (let c = 0; c < n; c++) {
      const i = base + c;
      const floored = hasFloor[c] === 1;
      const f = floored ? qFloor : 0;
      const fb = floored ? qFloorB : 0;
      const rel = released[c] === 1;
      const g = rel ? 0 : (grantRate[i] as number);
      const gb = rel ? 0 : (grantBurst[i] as number);
      const cr = countedRate[i] as number;
      const cb = countedBurst[i] as number;
      givenR += cr;
      givenB += cb;
      const lvl = g > f ? g : f;
      const lvlB = gb > fb ? gb : fb;
      // What the ledger counts never drops below the level of the current grant; take the larger,
      // so a caller's inconsistent input errs on the safe side.
      const uu = cr > lvl ? cr : lvl;
      const uub = cb > lvlB ? cb : lvlB;
      sumU += uu;
      sumUB += uub;
      const cap = capRate === null ? Infinity : (capRate[i] as number);
      const reporting = reported[c] === 1;
      const dd = clampDemand(reporting || !(rel || lapsed[c] === 1) ? (demand[i] as number) : 0, R);
      // A silent cell without demand keeps only its floor in the targets (no headroom).
      const want = !reporting && dd === 0 ? 0 : headroomWant(dd, R, H, headMin);
      const h1 = dd < cap ? dd : cap;
      const h2 = want < cap ? want : cap;
      const x1 = h1 > f ? h1 : f;
      const x2 = h2 > f ? h2 : f;
      const j = reporting ? k++ : n - ++p;
      idx[j] = c;
      fl[j] = f;
      flb[j] = fb;
      cur[j] = lvl;
      curb[j] = lvlB;
      u[j] = uu;
      ub[j] = uub;
      d[j] = dd;
      capb[j] = capBurst === null ? Infinity : (capBurst[i] as number);
      hi1[j] = x1;
      hi2[j] = x2;
      if (reporting) {
        sum1 += x1;
        sum2 += x2;
        const pending = acknowledged[i] !== 1 && (uu > lvl + epsR || uub > lvlB + epsB);
        flags[j] = (pending ? F_PENDING : 0) | (dd > lvl + epsR ? F_REFUSING : 0);
      } else {
        psum1 += x1;
        psum2 += x2;
        flags[j] = 0;
        if (levelRate !== null && levelBurst !== null) {
          levelRate[i] = lvl;
          levelBurst[i] = lvlB;
        }
      }
    }
    this.ratio = B / R;
    this.epsR = epsR;
    this.epsB = epsB;
    this.k = k;
    this.sum1 = sum1;
    this.sum2 = sum2;
    this.psum1 = psum1;
    this.psum2 = psum2;
    this.reservedR = Math.max(0, q.countedRate - givenR);
    this.reservedB = Math.max(0, q.countedBurst - givenB);
    this.usedR = sumU + this.reservedR;
    this.usedB = sumUB + this.reservedB;
  }
}
