// Building the allocator's columnar input, from plain objects or straight from the ledger's
// `QuotaState` / `CellView` reads. Pure: no I/O, no clock.
//
// Acknowledgements of the same round. A reportAndGrant entry applies its acks before its grants, so a
// shrink acknowledged in this round frees its capacity for this round's grants. `addQuotaState` takes
// the epochs the cells acknowledge in this round and counts each slice as the ledger will once the
// ack is applied: an ack of the current epoch collapses what is held to the current grant and its
// stamped floor, so u becomes max(cell floor, stamped floor, current grant). It applies the ledger's
// own rule (the ack counts only if its epoch is the slice's current epoch), and only ever lowers u,
// so a round built this way is accepted exactly when the acks go into the same entry. Put those acks
// in the entry (`acks`), or do not pass them here.

import { countedAfterAck } from '../ledger/ledger.js';
import type { CellView, QuotaState, SliceView } from '../ledger/ledger.js';
import { AllocatorInputError } from './allocator-types.js';
import type {
  AllocatorCell,
  AllocatorInput,
  AllocatorQuota,
  AllocatorSlices,
  AllocatorTuning,
} from './allocator-types.js';

/** One cell's part of one quota, as the ledger shows it (a SliceView fits). */
export interface SliceInput {
  readonly rate: number;
  readonly burst: number;
  readonly epoch: number;
  readonly acknowledged: boolean;
  readonly countedRate: number;
  readonly countedBurst: number;
}

export interface RoundParams {
  readonly nowMs: number;
  readonly leaseTtlMs: number;
  readonly skewMarginMs: number;
  readonly tuning?: Partial<AllocatorTuning>;
}

export interface QuotaStateOptions {
  /** The enclosing cap's key (tenant → its tier cap, tier cap → its domain cap), if any. */
  readonly parent?: string | null;
  /** Per cell (same order): the epoch the cell acknowledges in this round's entry (0 / NaN: none). */
  readonly ackedEpochs?: ArrayLike<number>;
}

/** The allocator's cells from the ledger's `listCells()` (registration order) and this round's reporters. */
export function allocatorCells(views: readonly CellView[], reported: ReadonlySet<string>): AllocatorCell[] {
  return views.map((v) => ({
    id: v.id,
    hasFloor: v.slot !== null,
    reported: reported.has(v.id),
    leaseExpiresAtMs: v.leaseExpiresAtMs,
  }));
}

type InputColumns = {
  grantRate: Float64Array;
  grantBurst: Float64Array;
  epoch: Float64Array;
  acknowledged: Uint8Array;
  countedRate: Float64Array;
  countedBurst: Float64Array;
  demand: Float64Array;
};

function inputColumns(size: number): InputColumns {
  return {
    grantRate: new Float64Array(size),
    grantBurst: new Float64Array(size),
    epoch: new Float64Array(size),
    acknowledged: new Uint8Array(size),
    countedRate: new Float64Array(size),
    countedBurst: new Float64Array(size),
    demand: new Float64Array(size),
  };
}

/**
 * Column buffers that builders reuse from round to round (a 10,000-quota × 16-cell input is 9 MB of
 * typed arrays; made afresh each round at a million tenants' heap it brings collections into the
 * round). An input built on them is valid until the next builder on the same buffers writes.
 */
export class AllocatorInputBuffers {
  /** @internal */ cols: InputColumns = inputColumns(0);

  /** @internal Columns of at least `size` entries, the first `keep` of the current ones kept. */
  ensure(size: number, keep: number): InputColumns {
    if (this.cols.grantRate.length >= size) return this.cols;
    const next = inputColumns(Math.max(size, 2 * this.cols.grantRate.length));
    if (keep > 0)
      for (const k of Object.keys(next) as (keyof InputColumns)[]) next[k].set(this.cols[k].subarray(0, keep));
    this.cols = next;
    return next;
  }
}

/** Accumulates quotas into the columnar AllocatorInput (columns grow by doubling). */
export class AllocatorInputBuilder {
  private readonly n: number;
  private readonly quotas: AllocatorQuota[] = [];
  private capacity: number;
  private cols: InputColumns;
  private readonly buffers: AllocatorInputBuffers;

  /** `buffers`: reused column buffers (the input built is then valid until their next use). */
  constructor(
    readonly cells: readonly AllocatorCell[],
    expectedQuotas = 16,
    buffers: AllocatorInputBuffers = new AllocatorInputBuffers(),
  ) {
    this.n = cells.length;
    this.buffers = buffers;
    this.capacity = Math.max(1, expectedQuotas);
    this.cols = buffers.ensure(this.capacity * this.n, 0);
  }

  get quotaCount(): number {
    return this.quotas.length;
  }

  private row(): number {
    const at = this.quotas.length * this.n;
    if (this.quotas.length === this.capacity) {
      this.capacity *= 2;
      this.cols = this.buffers.ensure(this.capacity * this.n, at);
    }
    return at;
  }

  /** Adds a quota; `slices` and `demand` are per cell, in the builder's cell order. */
  addQuota(quota: AllocatorQuota, slices: readonly SliceInput[], demand: ArrayLike<number>): void {
    if (slices.length !== this.n || demand.length !== this.n)
      throw new AllocatorInputError(`quota ${quota.key}: expected ${this.n} slices and demands`);
    const base = this.row();
    const c = this.cols;
    for (let i = 0; i < this.n; i++) {
      const sl = slices[i] as SliceInput;
      c.grantRate[base + i] = sl.rate;
      c.grantBurst[base + i] = sl.burst;
      c.epoch[base + i] = sl.epoch;
      c.acknowledged[base + i] = sl.acknowledged ? 1 : 0;
      c.countedRate[base + i] = sl.countedRate;
      c.countedBurst[base + i] = sl.countedBurst;
      c.demand[base + i] = demand[i] as number;
    }
    this.quotas.push(quota);
  }

  /**
   * Adds a quota from the ledger's `getQuotaState(key)`; its cells must be the builder's cells, in
   * order. With `ackedEpochs`, the slices are counted as after this round's acknowledgements.
   */
  addQuotaState(state: QuotaState, demand: ArrayLike<number>, opts: QuotaStateOptions = {}): void {
    if (state.cells.length !== this.n)
      throw new AllocatorInputError(`quota ${state.key}: ${state.cells.length} cells, expected ${this.n}`);
    let countedRate = state.countedRate;
    let countedBurst = state.countedBurst;
    const acked = opts.ackedEpochs;
    const slices: SliceInput[] = state.cells.map((v: SliceView, i) => {
      if (v.cellId !== this.cells[i]?.id)
        throw new AllocatorInputError(`quota ${state.key}: cell ${i} is ${v.cellId}, expected ${this.cells[i]?.id}`);
      const e = acked?.[i];
      if (acked === undefined || v.epoch === 0 || e !== v.epoch || v.acknowledged) return v;
      const floorRate = v.slot === null ? 0 : state.floorRate;
      const floorBurst = v.slot === null ? 0 : state.floorBurst;
      const r = countedAfterAck(v.countedRate, floorRate, v.floorRate, v.rate);
      const b = countedAfterAck(v.countedBurst, floorBurst, v.floorBurst, v.burst);
      countedRate -= v.countedRate - r;
      countedBurst -= v.countedBurst - b;
      return { rate: v.rate, burst: v.burst, epoch: v.epoch, acknowledged: true, countedRate: r, countedBurst: b };
    });
    const quota: AllocatorQuota = {
      key: state.key,
      rate: state.rate,
      burst: state.burst,
      floorRate: state.floorRate,
      floorBurst: state.floorBurst,
      ceilingRate: state.ceilingRate,
      ceilingBurst: state.ceilingBurst,
      countedRate: Math.max(0, countedRate),
      countedBurst: Math.max(0, countedBurst),
      parent: opts.parent ?? null,
    };
    this.addQuota(quota, slices, demand);
  }

  /**
   * Adds quota `key` by having `read` write its slice columns for the builder's cells, in order, at
   * row offset `at` (a Ledger.quotaColumnsReader does) and return the quota's figures; `read`
   * returning undefined adds nothing. The same row as addQuotaState (`ackedEpochs` passed on to
   * `read`, which counts the slices as after them), and no object per slice (one `read` serves every
   * key of a round).
   */
  addQuotaColumns(
    key: string,
    demand: ArrayLike<number>,
    parent: string | null,
    read: (
      key: string,
      cols: AllocatorSlices,
      at: number,
      ackedEpochs?: ArrayLike<number>,
    ) => Omit<AllocatorQuota, 'key' | 'parent'> | undefined,
    ackedEpochs?: ArrayLike<number>,
  ): boolean {
    if (demand.length !== this.n) throw new AllocatorInputError(`quota ${key}: expected ${this.n} demands`);
    const base = this.row();
    const f = read(key, this.cols, base, ackedEpochs);
    if (f === undefined) return false;
    const d = this.cols.demand;
    for (let i = 0; i < this.n; i++) d[base + i] = demand[i] as number;
    this.quotas.push({
      key,
      rate: f.rate,
      burst: f.burst,
      floorRate: f.floorRate,
      floorBurst: f.floorBurst,
      ceilingRate: f.ceilingRate,
      ceilingBurst: f.ceilingBurst,
      countedRate: Math.max(0, f.countedRate),
      countedBurst: Math.max(0, f.countedBurst),
      parent,
    });
    return true;
  }

  build(round: RoundParams): AllocatorInput {
    const size = this.quotas.length * this.n;
    const c = this.cols;
    const slices: AllocatorSlices = {
      grantRate: c.grantRate.subarray(0, size),
      grantBurst: c.grantBurst.subarray(0, size),
      epoch: c.epoch.subarray(0, size),
      acknowledged: c.acknowledged.subarray(0, size),
      countedRate: c.countedRate.subarray(0, size),
      countedBurst: c.countedBurst.subarray(0, size),
      demand: c.demand.subarray(0, size),
    };
    const base = {
      nowMs: round.nowMs,
      leaseTtlMs: round.leaseTtlMs,
      skewMarginMs: round.skewMarginMs,
      cells: this.cells,
      quotas: [...this.quotas],
      slices,
    };
    return round.tuning === undefined ? base : { ...base, tuning: round.tuning };
  }
}
