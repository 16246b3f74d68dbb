// The runtime part of the global quota table: per quota key (`tenant/<id>`, `tier/<name>`,
// `domain/<domain>`, as the coordinator names them), what this cell decides that quota with. The
// lease client computes the entries (a live grant; the grant's floor once the lease expired; a
// pending zero for a capped domain not granted yet; an unknown tenant the coordinator's policy
// admits) and the main thread posts them to every worker; each thread's Decider looks them up.
// Without coordinators there are no entries and every global quota runs on its static share
// (quotas.ts); with coordinators a key with no entry is refused until its first grant
// (CoordinatedQuotas).
//
// Changing a key's limit only changes the GcraLimit passed to take(): the bucket keeps its state,
// and a smaller burst clamps at once (the bucket module's rule), so a shrink never lets an old,
// deeper bucket through.
//
// Applying never throws: a rate and burst whose GCRA window the bucket table cannot hold (burst/rate
// beyond MAX_GCRA_WINDOW_S; the admin API refuses such quotas, but an older coordinator or a tiny
// rate's rounding could still send one) is clamped to the deepest bucket that fits — fewer tokens
// than granted, never more — and reported back so the caller can log it.
import { MAX_GCRA_WINDOW_NS } from '../../shared/gcra-window.js';
import { planted } from '../../shared/planted-bugs.js';
import type { BucketTable } from '../buckets/bucket-table.js';
import { globalBucketKey } from '../decide/decide.js';
import { limitFromRate } from '../buckets/gcra.js';
import type { OverrideSlice } from '../decide/quotas.js';
import { reportedLimit } from '../decide/quotas.js';

/** Largest rate a quota may have (the ledger's MAX_RATE): the limit an admitted unknown tenant runs on. */
const ALLOW_RATE = 1e9;

/**
 * One key's entry: a slice (`leased` = a live grant; false: a floor or a pending zero, the agent is
 * fail-static there), the removal of a key, or an unknown tenant the coordinator's policy admits.
 */
export type OverrideEntry =
  | {
    readonly key: string; readonly rate: number; readonly burst: number; readonly leased: boolean; readonly parent?: string | null; readonly epoch?: number;
    /**
     * A leased grant: the lease generation it arrived in (lease-deadline.ts) and the floor the deciders fall to once
     * that lease ended.
     */
    readonly lease?: number; readonly floorRate?: number; readonly floorBurst?: number;
  }
  | { readonly key: string; readonly remove: true }
  | { readonly key: string; readonly allowUnknown: true };

/** A key whose rate and burst had to be clamped to fit the bucket table. */
export interface ClampedEntry {
  readonly key: string;
  readonly rate: number;
  readonly burst: number;
  readonly appliedBurst: number;
}

const ALLOW_SLICE: OverrideSlice = Object.freeze({
  limit: limitFromRate(ALLOW_RATE, ALLOW_RATE, { start: 'full' }),
  currentLimit: { requestsPerUnit: 0, unit: 1, name: 'unknown-tenant:allow' },
  rate: ALLOW_RATE,
  burst: ALLOW_RATE,
  leased: true,
  epoch: null,
  lease: null,
  floor: null,
  parent: null,
  unknown: true,
});

export class QuotaOverrides {
  private readonly map = new Map<string, OverrideSlice>();
  private readonly given = new Map<string, OverrideEntry>();

  get size(): number {
    return this.map.size;
  }

  get(key: string): OverrideSlice | undefined {
    return this.map.get(key);
  }

  /** Applies the entries in order; returns the ones that had to be clamped (never throws for finite input). */
  apply(entries: readonly OverrideEntry[]): ClampedEntry[] {
    const clamped: ClampedEntry[] = [];
    for (const e of entries) {
      if ('remove' in e) {
        this.map.delete(e.key);
        this.given.delete(e.key);
        continue;
      }
      this.given.set(e.key, e);
      if ('allowUnknown' in e) {
        this.map.set(e.key, ALLOW_SLICE);
        continue;
      }
      const epoch = e.epoch ?? null;
      const parent = e.parent ?? null;
      const floor = e.leased && e.lease !== undefined ? sliceOf(e.key, e.floorRate ?? 0, e.floorBurst ?? 0, false, epoch, parent, null, null, clamped) : null;
      this.map.set(e.key, sliceOf(e.key, e.rate, e.burst, e.leased, epoch, parent, floor === null ? null : (e.lease ?? null), floor, clamped));
    }
    return clamped;
  }

  /** Every entry, for a (re)started worker. */
  entries(): OverrideEntry[] {
    return [...this.given.values()];
  }
}

/**
 * After apply(): re-configures at once the existing bucket of every key whose entry changed, so a
 * smaller limit clamps and refills at its own rate from now on. Left to the next check, a bucket
 * whose limit went A → B → C with no check under B would go from A straight to C: B's clamp skipped
 * and the time under B refilled at A's rate (found by the quota simulation, seed 108). Keys
 * without a bucket get none (a 0-hit check on a present key only re-configures it).
 */
export function reconfigureBuckets(table: BucketTable, overrides: QuotaOverrides, entries: readonly OverrideEntry[], nowNs: bigint): void {
  for (const e of entries) {
    const o = overrides.get(e.key);
    if (o === undefined) continue;
    const key = globalBucketKey(e.key);
    if (table.has(key)) table.take(key, o.limit, 0, nowNs);
  }
}

/** One key's slice, its burst clamped to what the bucket table holds (recorded in `clamped`). */
function sliceOf(key: string, rateIn: number, burstIn: number, leased: boolean, epoch: number | null, parent: string | null, lease: number | null, floor: OverrideSlice | null, clamped: ClampedEntry[]): OverrideSlice {
  const rate = Number.isFinite(rateIn) ? Math.max(0, rateIn) : 0;
  const wanted = Number.isFinite(burstIn) ? Math.max(0, Math.floor(burstIn + 1e-9)) : 0;
  const burst = Math.min(wanted, deepestBurst(rate));
  if (burst < wanted) clamped.push({ key, rate, burst: wanted, appliedBurst: burst });
  return { limit: limitFromRate(rate, burst, { start: planted['full-start-moved-grant'] ? 'full' : 'empty' }), currentLimit: reportedLimit(rate, key), rate, burst, leased, epoch, lease, floor, parent, unknown: false };
}

/** The largest whole burst whose window T·burst fits the bucket table at this rate (as limitFromRate computes T). */
function deepestBurst(rate: number): number {
  const microRate = BigInt(Math.floor(rate * 1e6));
  if (microRate === 0n) return Number.MAX_SAFE_INTEGER; // a blocked limit: no window at all
  const intervalNs = (1_000_000n * 1_000_000_000n + microRate - 1n) / microRate;
  const most = MAX_GCRA_WINDOW_NS / intervalNs;
  return most > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(most);
}
