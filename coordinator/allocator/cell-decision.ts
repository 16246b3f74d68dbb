// One reporting cell's decision for one quota, given its level and its target: the rules of the
// header of allocator.ts (parent caps first, shrinks past the hysteresis unless one is pending,
// grows for refusing cells or past the hysteresis; bursts alike). `rateMove` and `burstMove`
// classify; the staged decisions (staged-quota.ts) act on the classes with the grows water-filled;
// `localDecisions` acts on them when every decision is local, with the same comparisons in the same
// order, so both give identical grants.

import { EPS, F_EMIT_BURST, F_EMIT_RATE, F_PENDING, F_REFUSING } from './round-context.js';
import type { Consts, MutableStats, Scratch } from './round-context.js';

/** Classes of a rate (or burst) move. */
export const M_NONE = 0;
/** Above the parent's share at this cell: shrink to the target whatever the rest says. */
export const M_PARENT = 1;
/** Shrink to the target (past the hysteresis, nothing pending). */
export const M_SHRINK = 2;
/** A shrink waits for the cell's pending acknowledgement. */
export const M_WAIT = 3;
/** Above the target by less than the hysteresis: shrunk only to make room for a starved cell. */
export const M_SMALL_OVER = 4;
/** A grow candidate (paid from free capacity). */
export const M_GROW = 5;
/** A grow below the hysteresis for a cell not refusing traffic: not sent. */
export const M_SUPPRESS = 6;
/** Bursts only: below the target while the rate changes anyway: follow the target at no cost. */
export const M_FOLLOW = 7;

/** The class of a rate move from level `lvl` to target `t` (bound: max(floor, parent's cap)). */
export function rateMove(
  lvl: number,
  t: number,
  bound: number,
  pending: boolean,
  refusing: boolean,
  thr: number,
  epsR: number,
): number {
  if (lvl > bound + EPS * bound) return M_PARENT;
  if (t < lvl - epsR) return pending ? M_WAIT : lvl - t >= thr ? M_SHRINK : M_SMALL_OVER;
  if (t > lvl + epsR) return refusing || t - lvl >= thr ? M_GROW : M_SUPPRESS;
  return M_NONE;
}

/** The class of a burst move from `lvlB` to `tb`; `emitting`: the rate goes out in this round. */
export function burstMove(
  lvlB: number,
  tb: number,
  boundB: number,
  emitting: boolean,
  pending: boolean,
  thrB: number,
  keep: number,
  epsB: number,
): number {
  if (lvlB > boundB + EPS * boundB) return M_PARENT;
  if (tb < lvlB - epsB) return emitting ? M_FOLLOW : pending ? M_WAIT : lvlB - tb >= thrB ? M_SHRINK : M_SMALL_OVER;
  if (tb > lvlB + epsB) return emitting || tb - lvlB >= thrB || lvlB < keep * tb ? M_GROW : M_NONE;
  return M_NONE;
}

/** The level up to which a grow from `lvl` to `t` is free: the cell's own counted use `u`. */
export function freeLevel(lvl: number, t: number, u: number): number {
  const free = t < u ? t : u;
  return free > lvl ? free : lvl;
}

/** A rate grow of `dx` is sent: at least the smallest step for a refusing cell, else the hysteresis. */
export function growSent(dx: number, refusing: boolean, step: number, thr: number): boolean {
  return refusing ? dx >= step : dx >= thr;
}

/** A refusing cell below (1 − tolerance) × min(demand, target) at rate x is starved. */
export function starved(dd: number, x: number, t: number, keep: number, epsR: number): boolean {
  return dd > x + epsR && x < keep * (dd < t ? dd : t) - epsR;
}

/** The per-quota thresholds of the decisions. */
export class Thresholds {
  thr = 0;
  thrB = 0;
  step = 0;
  stepB = 0;
  keep = 0;

  set(kc: Consts, R: number, B: number): void {
    this.thr = Math.max(kc.hysteresisMinRate, kc.hysteresisFraction * R);
    this.thrB = Math.max(kc.hysteresisMinBurst, kc.hysteresisFraction * B);
    this.step = Math.max(kc.minStepRate, kc.minStepFraction * R);
    this.stepB = Math.max(kc.minStepRate, kc.minStepFraction * B);
    this.keep = kc.keep;
  }
}

/**
 * The decisions of one quota's reporting cells (scratch [0, k), as cell-read.ts wrote them; `capR`:
 * the parents' caps, the quota's row at `base`) when all
 * are local: each grow is sent as is, no split, so each cell's decision depends on the cell alone.
 * Writes nr, nb and flags (F_EMIT_* added) and the statistics, and returns true, if every grow fits
 * in the free capacity, nobody ends starved or short of burst, and nothing grows while the quota is
 * over its limit; otherwise returns false having changed nothing the staged decisions read.
 */
export function localDecisions(
  sc: Scratch,
  k: number,
  t: Float64Array,
  tb: Float64Array,
  capR: Float64Array | null,
  base: number,
  R: number,
  B: number,
  usedR: number,
  usedB: number,
  epsR: number,
  epsB: number,
  th: Thresholds,
  st: MutableStats,
): boolean {
  const { idx, fl, flb, cur, curb, u, ub, d, capb, nr, nb, flags, lflags } = sc;
  const { thr, thrB, step, stepB, keep } = th;
  let glR = 0; // Σ free levels and Σ targets of the rate and burst growers
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
    const fg = flags[j] as number;
    const pending = (fg & F_PENDING) !== 0;
    const refusing = (fg & F_REFUSING) !== 0;
    const f = fl[j] as number;
    const cap = capR === null ? Infinity : (capR[base + (idx[j] as number)] as number);
    const lvl = cur[j] as number;
    const tt = t[j] as number;
    // Rate.
    let x = lvl;
    let emit = 0;
    const mr = rateMove(lvl, tt, f > cap ? f : cap, pending, refusing, thr, epsR);
    if (mr === M_PARENT) {
      x = tt;
      emit = F_EMIT_RATE;
      parentShrinks++;
    } else if (mr === M_WAIT) waitingAck++;
    else if (mr === M_SHRINK) {
      x = tt;
      emit = F_EMIT_RATE;
      shrinks++;
    } else if (mr === M_GROW) {
      glR += freeLevel(lvl, tt, u[j] as number);
      ghR += tt;
      growersR++;
      if (growSent(tt - lvl, refusing, step, thr)) {
        x = tt;
        emit = F_EMIT_RATE;
        grows++;
      } else suppressed++;
    } else if (mr === M_SUPPRESS) suppressed++;
    if (starved(d[j] as number, x, tt, keep, epsR)) return false;
    // Burst.
    const fb = flb[j] as number;
    const capB = capb[j] as number;
    const lvlB = curb[j] as number;
    const tbb = tb[j] as number;
    let y = lvlB;
    const emitting = emit !== 0;
    const mb = burstMove(lvlB, tbb, fb > capB ? fb : capB, emitting, pending, thrB, keep, epsB);
    if (mb === M_PARENT) {
      y = tbb;
      emit |= F_EMIT_BURST;
      if (!emitting) parentShrinks++;
    } else if (mb === M_FOLLOW) y = tbb;
    else if (mb === M_SHRINK) {
      y = tbb;
      emit |= F_EMIT_BURST;
    } else if (mb === M_GROW) {
      glB += freeLevel(lvlB, tbb, ub[j] as number);
      ghB += tbb;
      growersB++;
      if (emitting || tbb - lvlB >= stepB) {
        y = tbb;
        emit |= F_EMIT_BURST;
      }
      if (y < keep * tbb - epsB) return false; // short of burst
    }
    nr[j] = x;
    nb[j] = y;
    lflags[j] = fg | emit;
  }
  if (!fits(growersR, glR, ghR, R, usedR, epsR) || !fits(growersB, glB, ghB, B, usedB, epsB)) return false;
  for (let j = 0; j < k; j++) flags[j] = lflags[j] as number;
  st.shrinks += shrinks;
  st.grows += grows;
  st.parentShrinks += parentShrinks;
  st.suppressed += suppressed;
  st.waitingAck += waitingAck;
  return true;
}

/** Every grow fits in the free capacity (limit − used), and nothing grows while over the limit. */
function fits(growers: number, gl: number, gh: number, limit: number, used: number, eps: number): boolean {
  if (growers === 0) return true;
  if (used > limit + eps) return false;
  const free = limit - used;
  return gl + (free > 0 ? free : 0) >= gh;
}
