// The hierarchy's per-cell split: once a cap (a tier's, a domain's) is allocated, its new level at
// each reporting cell is split max-min fairly over its children's wants there, and each child's
// share becomes its cap at that cell (header of allocator.ts, step 4).

import type { AllocatorQuota } from './allocator-types.js';
import { clampDemand, headroomMin, headroomWant } from './cell-read.js';
import type { Ctx } from './round-context.js';
import { WaterFillScratch, waterFill } from './water-fill.js';

/** Scratch of capChildren: per-cell segments of the children's bounds, and the children's constants. */
export class CapScratch {
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
  /** Per cell: Σ max(want, level) and Σ phase-1 wants of the children; 1 where the split binds. */
  sumCur = new Float64Array(64);
  sum1 = new Float64Array(64);
  bind = new Uint8Array(64);
  readonly fill = new WaterFillScratch();
  ensure(size: number, m: number, n: number): void {
    if (this.sumCur.length < n) {
      this.sumCur = new Float64Array(n);
      this.sum1 = new Float64Array(n);
      this.bind = new Uint8Array(n);
    }
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
 * Memory layout: the children's rows are read a block at a time (their rows stay in cache while
 * each cell's segment is written sequentially), their values written into one contiguous segment per
 * cell (scratch index c × m + x), so that each cell's split runs over contiguous memory; the caps
 * are written back row by row.
 */
export function capChildren(ctx: Ctx, p: number, children: Int32Array, cs: CapScratch): void {
  const { n, quotas, reported } = ctx;
  const levelRate = ctx.levelRate as Float64Array;
  const levelBurst = ctx.levelBurst as Float64Array;
  const m = children.length;
  cs.ensure(m * n, m, n);
  const { lo, hi1, hi2, out, sumCur, sum1, bind } = cs;
  // The children's constants, read once.
  for (let x = 0; x < m; x++) {
    const cq = quotas[children[x] as number] as AllocatorQuota;
    cs.rate[x] = cq.rate;
    cs.ratio[x] = cq.burst / cq.rate;
    cs.floorRate[x] = cq.floorRate;
    cs.floorBurst[x] = cq.floorBurst;
    cs.headMin[x] = headroomMin(ctx, cq.rate);
  }
  sumCur.fill(0, 0, n);
  sum1.fill(0, 0, n);
  bind.fill(0, 0, n);
  // Rates: gather, split where it binds.
  for (let x0 = 0; x0 < m; x0 += CAP_BLOCK) {
    const x1 = x0 + CAP_BLOCK < m ? x0 + CAP_BLOCK : m;
    for (let c = 0; c < n; c++) if (reported[c] === 1) gatherRates(ctx, cs, children, x0, x1, c);
  }
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
  sumCur.fill(0, 0, n);
  for (let x0 = 0; x0 < m; x0 += CAP_BLOCK) {
    const x1 = x0 + CAP_BLOCK < m ? x0 + CAP_BLOCK : m;
    for (let c = 0; c < n; c++) if (reported[c] === 1) gatherBursts(ctx, cs, children, x0, x1, c);
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
  const capBurst = ctx.capBurst as Float64Array;
  for (let x0 = 0; x0 < m; x0 += CAP_BLOCK) {
    const x1 = x0 + CAP_BLOCK < m ? x0 + CAP_BLOCK : m;
    for (let c = 0; c < n; c++) {
      if (bind[c] !== 1) continue;
      const seg = c * m;
      for (let x = x0; x < x1; x++) capBurst[(children[x] as number) * n + c] = out[seg + x] as number;
    }
  }
}

/** Children [x0, x1) at cell c: their rate bounds into the cell's segment; Σ max(want, level) and Σ demands. */
function gatherRates(ctx: Ctx, cs: CapScratch, children: Int32Array, x0: number, x1: number, c: number): void {
  const { n, s } = ctx;
  const { lo, hi1, hi2, rate, floorRate, headMin } = cs;
  const demand = s.demand;
  const grantRate = s.grantRate;
  const H = ctx.k.headroomFactor;
  const floored = ctx.hasFloor[c] === 1;
  const rel = ctx.released[c] === 1;
  const seg = c * children.length;
  let sc = 0;
  let s1 = 0;
  for (let x = x0; x < x1; x++) {
    const i = (children[x] as number) * n + c;
    const R = rate[x] as number;
    const f = floored ? (floorRate[x] as number) : 0;
    const dd = clampDemand(demand[i] as number, R);
    const want = headroomWant(dd, R, H, headMin[x] as number);
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
  cs.sumCur[c] = (cs.sumCur[c] as number) + sc;
  cs.sum1[c] = (cs.sum1[c] as number) + s1;
}

/** Children [x0, x1) at cell c: their rate caps written back (where the split bound), their burst bounds gathered. */
function gatherBursts(ctx: Ctx, cs: CapScratch, children: Int32Array, x0: number, x1: number, c: number): void {
  const { n, s } = ctx;
  const { lo, hi1, hi2, out, ratio, floorBurst } = cs;
  const capRate = ctx.capRate as Float64Array;
  const grantBurst = s.grantBurst;
  const floored = ctx.hasFloor[c] === 1;
  const rel = ctx.released[c] === 1;
  const binds = cs.bind[c] === 1;
  const seg = c * children.length;
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
    const fb = floored ? (floorBurst[x] as number) : 0;
    const want = rateWant * (ratio[x] as number);
    const h = want > fb ? want : fb;
    lo[at] = fb;
    hi1[at] = h;
    const gb = rel ? 0 : (grantBurst[i] as number);
    const lvlB = gb > fb ? gb : fb;
    sb += h > lvlB ? h : lvlB;
  }
  cs.sumCur[c] = (cs.sumCur[c] as number) + sb;
}
