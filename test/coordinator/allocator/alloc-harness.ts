// A small world for the allocator's tests: a real Ledger, cells whose agents receive the grants of
// each round and acknowledge them in a later round, and the allocator run every round on the
// ledger's committed state. Every round's grants go through `ledger.apply({type:'reportAndGrant'})`,
// exactly as the coordinator's leader would propose them.
import assert from 'node:assert/strict';
import { Ledger } from '../../../coordinator/ledger/ledger.js';
import type { QuotaState } from '../../../coordinator/ledger/ledger.js';
import type { Grant, GrantAck, LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';
import { allocateRound, allocateRoundWith } from '../../../coordinator/allocator/allocator.js';
import type { AllocatorOutput, AllocatorTuning } from '../../../coordinator/allocator/allocator.js';
import { AllocatorInputBuilder, allocatorCells } from '../../../coordinator/allocator/allocator-input.js';

export interface SimOptions {
  readonly floorCells: number;
  readonly skewMarginMs: number;
  readonly leaseTtlMs: number;
  readonly cells: readonly string[];
  readonly setup: readonly LedgerCommandInput[];
  /** The quotas the allocator handles, with their parents. */
  readonly quotas: readonly { readonly key: string; readonly parent: string | null }[];
  readonly tuning?: Partial<AllocatorTuning>;
}

export interface RoundOptions {
  readonly dtMs?: number;
  /** Demand (req/s) of a quota at a cell this round. */
  readonly demand: (key: string, cellId: string) => number;
  /** Whether the cell reports this round (default: all do). */
  readonly reports?: (cellId: string) => boolean;
  /** Whether a reporting cell acknowledges the grant it holds for a quota (default: always). */
  readonly acks?: (key: string, cellId: string) => boolean;
  /** Count this round's acknowledgements when computing the grants (default true). */
  readonly sameRoundAcks?: boolean;
  /**
   * The agents are answered before this round's entry commits (default false): they receive the
   * grants of the previous round only, so an acknowledgement reaches the ledger two rounds after its
   * grant, when a newer grant may already be there (and the acknowledgement is ignored).
   */
  readonly lateDelivery?: boolean;
}

export interface RoundResult {
  readonly out: AllocatorOutput;
  readonly grants: Grant[];
  readonly reporting: Set<string>;
  readonly nowMs: number;
}

export class AllocSim {
  readonly ledger: Ledger;
  index = 0;
  nowMs = 1_000;
  /** Per cell: quota key → the epoch the agent holds and has not acknowledged yet. */
  readonly unacked = new Map<string, Map<string, number>>();

  constructor(readonly opts: SimOptions) {
    this.ledger = new Ledger({ floorCells: opts.floorCells, skewMarginMs: opts.skewMarginMs, assertInvariants: true });
    for (const cmd of opts.setup) this.ok(cmd);
    for (const c of opts.cells) {
      this.ok({ type: 'registerCell', cellId: c, nowMs: this.nowMs });
      this.unacked.set(c, new Map());
    }
  }

  ok(cmd: LedgerCommandInput): void {
    const r = this.ledger.apply(cmd, ++this.index);
    if (!r.ok) assert.fail(`${cmd.type} refused: ${r.error.code} ${r.error.message}`);
  }

  state(key: string): QuotaState {
    const s = this.ledger.getQuotaState(key);
    if (s === undefined) assert.fail(`no quota ${key}`);
    return s;
  }

  /** A cell's level of a quota as the agent may use it: max(floor, grant while the lease is live). */
  level(key: string, cellId: string): number {
    const st = this.state(key);
    const v = st.cells.find((c) => c.cellId === cellId);
    if (v === undefined) assert.fail(`no cell ${cellId}`);
    const floor = v.slot === null ? 0 : st.floorRate;
    const live = this.ledger.getCell(cellId)?.leaseLive ?? false;
    return Math.max(floor, live ? v.rate : 0);
  }

  levelBurst(key: string, cellId: string): number {
    const st = this.state(key);
    const v = st.cells.find((c) => c.cellId === cellId);
    if (v === undefined) assert.fail(`no cell ${cellId}`);
    const floor = v.slot === null ? 0 : st.floorBurst;
    const live = this.ledger.getCell(cellId)?.leaseLive ?? false;
    return Math.max(floor, live ? v.burst : 0);
  }

  round(o: RoundOptions): RoundResult {
    this.nowMs += o.dtMs ?? 500;
    const nowMs = this.nowMs;
    const reporting = new Set(this.opts.cells.filter((c) => o.reports?.(c) ?? true));
    // The acknowledgements the reporting agents send with this round.
    const acks: GrantAck[] = [];
    for (const c of reporting) {
      const held = this.unacked.get(c) as Map<string, number>;
      for (const [key, epoch] of [...held]) {
        if (o.acks?.(key, c) ?? true) {
          acks.push({ key, cellId: c, epoch });
          held.delete(key);
        }
      }
    }
    const cellViews = this.ledger.listCells();
    const cells = allocatorCells(cellViews, reporting);
    const b = new AllocatorInputBuilder(cells, this.opts.quotas.length);
    const sameRound = o.sameRoundAcks ?? true;
    for (const q of this.opts.quotas) {
      const st = this.state(q.key);
      const demand = cells.map((c) => o.demand(q.key, c.id));
      const ackedEpochs = cells.map((c) => acks.find((a) => a.key === q.key && a.cellId === c.id)?.epoch ?? 0);
      b.addQuotaState(st, demand, sameRound ? { parent: q.parent, ackedEpochs } : { parent: q.parent });
    }
    if (o.lateDelivery === true) this.deliver(reporting);
    const input = b.build({
      nowMs,
      leaseTtlMs: this.opts.leaseTtlMs,
      skewMarginMs: this.opts.skewMarginMs,
      ...(this.opts.tuning === undefined ? {} : { tuning: this.opts.tuning }),
    });
    const out = allocateRound(input);
    // The one-pass common case and the general path agree (to floating-point rounding: the two
    // paths add the same shares in a different order).
    const staged = allocateRoundWith(input, { fastPath: false, localDecisions: false });
    const diff = firstDifference(staged, out, '');
    assert.equal(
      diff,
      null,
      `the shortcuts (one-pass common case, local decisions) and the staged general path differ at ${diff ?? ''}`,
    );
    const cmd: LedgerCommandInput = {
      type: 'reportAndGrant',
      nowMs,
      leases: [...reporting].map((cellId) => ({ cellId, leaseExpiresAtMs: nowMs + this.opts.leaseTtlMs })),
      acks,
      grants: out.grants,
    };
    const r = this.ledger.apply(cmd, ++this.index);
    if (!r.ok) assert.fail(`round at ${nowMs} refused: ${r.error.code} ${r.error.message}`);
    this.ledger.checkInvariants();
    if (o.lateDelivery !== true) this.deliver(reporting);
    return { out, grants: out.grants, reporting, nowMs };
  }

  /** The reporting agents receive the grants now in force (the lease response). */
  private deliver(reporting: ReadonlySet<string>): void {
    for (const c of reporting) {
      const held = this.unacked.get(c) as Map<string, number>;
      for (const q of this.opts.quotas) {
        const v = this.state(q.key).cells.find((x) => x.cellId === c);
        if (v !== undefined && v.epoch > 0 && !v.acknowledged) held.set(q.key, v.epoch);
        else held.delete(q.key);
      }
    }
  }
}

/**
 * Reference max-min fair split with floors, independent of the allocator's water-filling: bisection
 * on the level λ of Σ clamp(λ, lo, max(lo, hi)) = capacity.
 */
export function referenceMaxMin(lo: readonly number[], hi: readonly number[], capacity: number): number[] {
  const h = hi.map((v, i) => Math.max(v, lo[i] ?? 0));
  const sum = (lambda: number): number => h.reduce((s, v, i) => s + Math.min(v, Math.max(lo[i] ?? 0, lambda)), 0);
  if (sum(0) >= capacity) return lo.slice();
  if (sum(Math.max(...h)) <= capacity) return h;
  let a = 0;
  let b = Math.max(...h);
  for (let k = 0; k < 200; k++) {
    const m = (a + b) / 2;
    if (sum(m) <= capacity) a = m;
    else b = m;
  }
  return h.map((v, i) => Math.min(v, Math.max(lo[i] ?? 0, a)));
}

/** The path of the first difference between two values, numbers compared to a relative 1e-9; null if none. */
export function firstDifference(a: unknown, b: unknown, path: string): string | null {
  if (typeof a === 'number' && typeof b === 'number') {
    if (a === b || Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(a), Math.abs(b))) return null;
    return `${path}: ${a} vs ${b}`;
  }
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null)
    return a === b ? null : `${path}: ${String(a)} vs ${String(b)}`;
  if (Array.isArray(a) !== Array.isArray(b)) return `${path}: array vs object`;
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  if (ka.length !== kb.length) return `${path}: ${ka.length} vs ${kb.length} entries`;
  for (const k of ka) {
    const d = firstDifference((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k], `${path}.${k}`);
    if (d !== null) return d;
  }
  return null;
}
