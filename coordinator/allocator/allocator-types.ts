// The allocator's public types: its input (cells, quotas, the columnar slices, tuning), its output
// (grants, statistics, which quotas are settled) and its errors. The algorithm is specified in
// allocator.ts.

import { CellquotaError } from '../../shared/errors.js';
import type { Grant } from '../ledger/ledger-commands.js';

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

/** Malformed input (sizes, non-finite numbers, an unknown or repeated parent, a parent cycle). */
export class AllocatorInputError extends CellquotaError {
  readonly code = 'ALLOCATOR_INPUT_INVALID';
}

/**
 * A post-condition of the round does not hold (a grant below its floor or not finite, a quota whose
 * counted use would rise above max(quota, what was counted before), children above their parent's
 * level at a cell). A bug: the round throws rather than propose grants that may break the bound.
 */
export class AllocatorInvariantError extends CellquotaError {
  readonly code = 'ALLOCATOR_INVARIANT';
  constructor(message: string) {
    super(`allocator post-condition violated: ${message}`);
  }
}
