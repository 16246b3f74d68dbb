// What one round's steps share: the context (input columns, per-cell flags, the tuning's constants,
// the output), the per-cell scratch columns, the flag bits and the float tolerance.

import type {
  AllocatorCell,
  AllocatorQuota,
  AllocatorSlices,
  AllocatorStats,
  AllocatorTuning,
} from './allocator-types.js';
import type { GrantColumns } from './grant-output.js';
import { WaterFillScratch } from './water-fill.js';

/** Relative tolerance of float comparisons (far inside the ledger's own 1e-9 bound tolerance). */
export const EPS = 1e-12;

export type MutableStats = {
  -readonly [K in keyof AllocatorStats]: AllocatorStats[K];
};

/** Per reporting cell, bit flags (Scratch.flags). */
export const F_PENDING = 1; // an older, larger grant is still counted (unacknowledged shrink)
export const F_EMIT_RATE = 2;
export const F_EMIT_BURST = 4;
export const F_SMALL_OVER = 8; // rate above target by less than the hysteresis
export const F_SMALL_OVER_B = 16; // burst above target by less than the hysteresis
export const F_REFUSING = 32;
export const F_EMIT = F_EMIT_RATE | F_EMIT_BURST;

/** Scratch arrays, one per-cell column each (size: the cell count). */
export class Scratch {
  readonly fill = new WaterFillScratch();
  /**
   * Per cell as read (cell-read.ts): reporting cells compacted at [0, k), silent ones from the top,
   * at [n − p, n): the cell index, floors, levels, counted use, demand, the parent's caps.
   */
  readonly idx: Int32Array;
  readonly fl: Float64Array;
  readonly flb: Float64Array;
  readonly cur: Float64Array;
  readonly curb: Float64Array;
  readonly u: Float64Array;
  readonly ub: Float64Array;
  readonly d: Float64Array;
  readonly capb: Float64Array;
  /** Water-filling bounds (reporting cells at [0, k), silent ones at [k, n)). */
  readonly hi1: Float64Array;
  readonly hi2: Float64Array;
  /** Targets (when a split binds), the new rate and burst, and the grows' water-filling. */
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
  /** The local decisions' flags, copied to `flags` only when they all succeed. */
  readonly lflags: Uint8Array;
  constructor(n: number) {
    const f = (): Float64Array => new Float64Array(n);
    this.capb = f();
    this.idx = new Int32Array(n);
    this.fl = f();
    this.flb = f();
    this.cur = f();
    this.curb = f();
    this.u = f();
    this.ub = f();
    this.d = f();
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

/** The tuning as one fixed-shape object (read in the hot loops). */
export interface Consts {
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

export function constsOf(tuning: AllocatorTuning): Consts {
  return {
    headroomFactor: tuning.headroomFactor,
    headroomMinRate: tuning.headroomMinRate,
    headroomMinFraction: tuning.headroomMinFraction,
    hysteresisFraction: tuning.hysteresisFraction,
    hysteresisMinRate: tuning.hysteresisMinRate,
    hysteresisMinBurst: tuning.hysteresisMinBurst,
    minStepFraction: tuning.minStepFraction,
    minStepRate: tuning.minStepRate,
    keep: 1 - tuning.starveTolerance,
  };
}

export interface Ctx {
  readonly n: number;
  readonly leaseExpiresAtMs: number;
  readonly cells: readonly AllocatorCell[];
  readonly quotas: readonly AllocatorQuota[];
  readonly s: AllocatorSlices;
  readonly k: Consts;
  readonly fastPath: boolean;
  readonly localDecisions: boolean;
  readonly reported: Uint8Array;
  readonly released: Uint8Array;
  /** 1: the cell has no live lease at the round's time (a silent one's demand is not counted). */
  readonly lapsed: Uint8Array;
  readonly hasFloor: Uint8Array;
  /** Per slice: the level after this round (max(floor, grant)), filled when the round has parents. */
  readonly levelRate: Float64Array | null;
  readonly levelBurst: Float64Array | null;
  /** Per slice: the cap a parent puts on this child at this cell (Infinity: none). */
  readonly capRate: Float64Array | null;
  readonly capBurst: Float64Array | null;
  readonly scratch: Scratch;
  readonly out: GrantColumns;
  readonly stats: MutableStats;
}
