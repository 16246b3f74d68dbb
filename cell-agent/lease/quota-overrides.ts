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
// deeper bucket through. applyLeaseEntries() re-configures the main thread's existing buckets at
// once (a limit A → B → C with no check under B must not skip B).
//
// A leased grant's floor takes over from the grant at the END OF ITS LEASE, not when someone next
// looks: the floor's limit names the grant and asks the lease deadline for that instant (gcra.ts's
// LimitSuccession, LeaseDeadline.endedAt), so the bucket of a key nobody checked since the deadline
// passed is re-configured as of the deadline — by a worker's first check under the floor, by the
// expiry's floors, by an answer whose lease was already over, or by the next lease's grant
// (applyLeaseEntries closes the ended lease first), however late the main thread runs. Left to
// "now", that time refilled at the grant's rate while the ledger counts the cell at its floor.
//
// Applying never throws: a rate and burst whose GCRA window the bucket table cannot hold (burst/rate
// beyond MAX_GCRA_WINDOW_S; the admin API refuses such quotas, but an older coordinator or a tiny
// rate's rounding could still send one) is clamped to the deepest bucket that fits — fewer tokens
// than granted, never more — and reported back so the caller can log it.
import { MAX_GCRA_WINDOW_NS } from '../../shared/gcra-window.js';
import { planted } from '../../shared/planted-bugs.js';
import type { BucketTable } from '../buckets/bucket-table.js';
import { globalBucketKey } from '../decide/decide.js';
import { limitFromRate, succeeding } from '../buckets/gcra.js';
import type { GcraParams } from '../buckets/gcra.js';
import type { OverrideSlice } from '../decide/quotas.js';
import type { LeaseDeadline } from './lease-deadline.js';
import { reportedLimit } from '../decide/quotas.js';

/** Largest rate a quota may have (the ledger's MAX_RATE): the limit an admitted unknown tenant runs on. */
const ALLOW_RATE = 1e9;

/**
 * One key's entry: a slice (`leased` = a live grant; false: a floor or a pending zero, the agent is
 * fail-static there), the removal of a key, or an unknown tenant the coordinator's policy admits.
 */
export type OverrideEntry =
  | {
      readonly key: string;
      readonly rate: number;
      readonly burst: number;
      readonly leased: boolean;
      readonly parent?: string | null;
      readonly epoch?: number;
      /**
       * A leased grant: the lease generation it arrived in (lease-deadline.ts) and the floor the deciders fall to once
       * that lease ended.
       */
      readonly lease?: number;
      readonly floorRate?: number;
      readonly floorBurst?: number;
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

  /** `deadline`: this thread's view of the lease's end, which a leased grant's floor takes over at
   * (null: as of the take that meets it; tests of the table alone). */
  constructor(private readonly deadline: LeaseDeadline | null = null) {}

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
      const lease = e.leased && e.lease !== undefined ? e.lease : null;
      const floor =
        lease !== null
          ? sliceOf(e.key, e.floorRate ?? 0, e.floorBurst ?? 0, false, epoch, parent, null, null, clamped)
          : null;
      const slice = sliceOf(e.key, e.rate, e.burst, e.leased, epoch, parent, lease, floor, clamped);
      this.map.set(
        e.key,
        floor === null || lease === null ? slice : { ...slice, floor: this.floorAtLeaseEnd(floor, slice, lease) },
      );
    }
    return clamped;
  }

  /** The floor, taking over from the grant at the end of lease `lease` (see the header). */
  private floorAtLeaseEnd(floor: OverrideSlice, grant: OverrideSlice, lease: number): OverrideSlice {
    const d = this.deadline;
    if (d === null || planted['floor-as-of-now']) return floor;
    return {
      ...floor,
      limit: succeeding(floor.limit, { from: grant.limit, since: (nowNs) => d.endedAt(lease, nowNs) }),
    };
  }

  /**
   * The slice of this table the deciders decide on at `nowNs`: a leased grant's floor once its lease
   * is no longer live (decide.ts's rule, read from the same shared deadline), else the slice itself.
   * Off the hot path (applyLeaseEntries).
   */
  inForce(o: OverrideSlice, nowNs: bigint): OverrideSlice {
    const d = this.deadline;
    return o.lease !== null && o.floor !== null && d !== null && !d.live(o.lease, nowNs) ? o.floor : o;
  }

  /** Every entry, for a (re)started worker. */
  entries(): OverrideEntry[] {
    return [...this.given.values()];
  }
}

/**
 * The main thread's apply (agent-main.ts, the embedded limiter): applies `entries` to `overrides`
 * and re-configures at once the existing bucket of every key whose entry changed, so a smaller limit
 * clamps and refills at its own rate from now on. Left to the next check, a bucket whose limit went
 * A → B → C with no check under B would go from A straight to C: B's clamp skipped and the time under
 * B refilled at A's rate (found by the quota simulation, seed 108). A key whose entry is still a
 * leased grant whose lease has ended first takes its floor as of the lease's end (the header), so the
 * next grant starts from what the floor refilled. Keys without a bucket get none (a 0-hit check on a
 * present key only re-configures it). Returns the entries that had to be clamped (apply()). Every
 * thread applies through here (the workers too: a worker that decided on an older entry meanwhile
 * may have put a bucket back under it, and must not leave it there until its next check). A key
 * whose new entry is a grant of a lease already over is re-configured to that grant's floor, never
 * back to the grant: the entry may reach a worker long after the lease ended.
 */
export function applyLeaseEntries(
  table: BucketTable,
  overrides: QuotaOverrides,
  entries: readonly OverrideEntry[],
  nowNs: bigint,
): ClampedEntry[] {
  let stuck: string | null = null;
  for (const e of entries) {
    const was = overrides.get(e.key);
    const succession = was?.floor?.limit.succeeds;
    if (was === undefined || was.floor === null || succession === undefined || succession.since(nowNs) === null)
      continue;
    const key = globalBucketKey(e.key);
    // Twice at most: a worker whose clock reading predates the lease's end may have put the bucket
    // back under the grant between the two (it decided, rightly, on the grant then).
    for (let attempt = 0; attempt < 2 && table.keptUnder(key, was.limit); attempt++)
      table.take(key, was.floor.limit, 0, nowNs);
    if (table.keptUnder(key, was.limit) && !sameLimit(was.limit, was.floor.limit)) stuck ??= e.key;
  }
  const clamped = overrides.apply(entries);
  for (const e of entries) {
    const o = overrides.get(e.key);
    if (o === undefined) continue;
    const key = globalBucketKey(e.key);
    // Under the limit the deciders use now: an entry that arrives after its lease ended (a worker
    // reading its port late, after SIGCONT) must not put a bucket already on the floor back under
    // the grant, where it would refill at the grant's rate until someone meets it (issue 13: seeds
    // 1742, 2360, 4308 of the quota simulation).
    if (table.has(key)) table.take(key, overrides.inForce(o, nowNs).limit, 0, nowNs);
  }
  // Applied all the same (the entries are in force); the caller treats it as a failed apply.
  if (stuck !== null)
    throw new Error(`assertion: the bucket of ${stuck} was still kept under the grant of a lease that ended`);
  return clamped;
}

function sameLimit(a: GcraParams, b: GcraParams): boolean {
  return a.intervalNs === b.intervalNs && a.windowNs === b.windowNs;
}

/** One key's slice, its burst clamped to what the bucket table holds (recorded in `clamped`). */
function sliceOf(
  key: string,
  rateIn: number,
  burstIn: number,
  leased: boolean,
  epoch: number | null,
  parent: string | null,
  lease: number | null,
  floor: OverrideSlice | null,
  clamped: ClampedEntry[],
): OverrideSlice {
  const rate = Number.isFinite(rateIn) ? Math.max(0, rateIn) : 0;
  const wanted = Number.isFinite(burstIn) ? Math.max(0, Math.floor(burstIn + 1e-9)) : 0;
  const burst = Math.min(wanted, deepestBurst(rate));
  if (burst < wanted) clamped.push({ key, rate, burst: wanted, appliedBurst: burst });
  return {
    limit: limitFromRate(rate, burst, { start: planted['full-start-moved-grant'] ? 'full' : 'empty' }),
    currentLimit: reportedLimit(rate, key),
    rate,
    burst,
    leased,
    epoch,
    lease,
    floor,
    parent,
    unknown: false,
  };
}

/** The largest whole burst whose window T·burst fits the bucket table at this rate (as limitFromRate computes T). */
function deepestBurst(rate: number): number {
  const microRate = BigInt(Math.floor(rate * 1e6));
  if (microRate === 0n) return Number.MAX_SAFE_INTEGER; // a blocked limit: no window at all
  const intervalNs = (1_000_000n * 1_000_000_000n + microRate - 1n) / microRate;
  const most = MAX_GCRA_WINDOW_NS / intervalNs;
  return most > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(most);
}
