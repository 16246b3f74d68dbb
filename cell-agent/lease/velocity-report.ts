// What one lease report carries, within a byte budget: the acknowledgements, then only the demand
// that changed (delta reports), with periodic full sweeps. Pure: no I/O, no clock.
//
// Why deltas: a report carrying every active key's velocity was 4.09 MB at 100,000 active tenants
// (bench/coordinator-source.ts), just under the coordinator's 4 MiB receive limit, so a busier cell
// failed every report. The leader already keeps each cell's demand per key between reports (a key
// absent from a report keeps its last value), so a report need only carry:
//   - a key whose demand (allowed + refused per second) moved beyond the dead-band from the value
//     last ACKNOWLEDGED to the leader: max(DEAD_BAND_MIN, DEAD_BAND_FRACTION × the larger of the
//     two) — the same 0.5% the leader itself ignores (lease-service.ts noteDemand), measured from
//     the acknowledged value, so small moves never accumulate unseen;
//   - a key that went quiet (sent once with 0);
//   - during a sweep, every key with demand: a sweep starts with every agent incarnation, when the
//     leader asks (velocity_resync: a leader of a new term holds no demand), and every
//     FULL_SWEEP_EVERY reports. Its last page is marked done, and the leader then drops whatever
//     demand of the cell the sweep did not restamp (a key dropped by --max-demand-keys, a lost
//     zero). So the leader's picture is never older than one sweep.
// Budget: acknowledgements first (they free capacity elsewhere), then the demand entries by size of
// the move, largest first, until REPORT_BUDGET_BYTES; what does not fit stays pending and goes in
// the next report (sent at once: `more`). Every report is thus below a quarter of the leader's
// 4 MiB receive limit whatever the number of keys.
//
// The bound: demand only shapes allocation. Every grant the leader proposes is checked by the
// ledger against the quota (sum of max(grant, floor) over the cells ≤ rate, burst likewise), so a
// stale or missing demand can make a split less fair for a sweep or an interval, never make the
// grants exceed the ceiling.
import type { AckMessage, VelocityMessage } from '../../shared/lease-proto.js';

/** The most bytes of acks and velocity one report carries (the coordinator takes up to 4 MiB). */
export const REPORT_BUDGET_BYTES = 1024 * 1024;
/** A full sweep every this many successful reports (10 s at the default 500 ms interval). */
export const FULL_SWEEP_EVERY = 20;
export const DEAD_BAND_MIN = 0.01;
export const DEAD_BAND_FRACTION = 0.005;

/** Upper bound of the protobuf bytes of one repeated entry (tag, length, fields): keys are ASCII. */
export function velocityEntryBytes(key: string): number {
  return 2 + 3 + 2 + key.length + 9 + 9;
}
export function ackEntryBytes(key: string): number {
  return 2 + 3 + 2 + key.length + 9;
}

export interface ReportPage {
  readonly acks: AckMessage[];
  readonly velocity: VelocityMessage[];
  /** The sweep this report belongs to (stamps every entry it carries on the leader). */
  readonly sweep: number;
  /** The last page of a sweep: every key with demand was sent in it. */
  readonly sweepDone: boolean;
  /** The first page of a sweep (nothing of it delivered yet). */
  readonly sweepStart: boolean;
  /** Something did not fit: report again at once. */
  readonly more: boolean;
}

export interface VelocityReporterOptions {
  readonly budgetBytes?: number;
  readonly fullSweepEvery?: number;
}

export class VelocityReporter {
  /** Key → the demand (req/s) the leader acknowledged last (absent: 0). */
  private readonly acked = new Map<string, number>();
  private sweep = 1;
  /** Keys sent in the running sweep; null: no sweep running. */
  private swept: Set<string> | null = new Set();
  private reportsSinceSweep = 0;
  /** A page of the running sweep was delivered (the next one is not its first). */
  private sweepPageDelivered = false;
  private readonly budget: number;
  private readonly every: number;

  constructor(opts: VelocityReporterOptions = {}) {
    this.budget = opts.budgetBytes ?? REPORT_BUDGET_BYTES;
    this.every = opts.fullSweepEvery ?? FULL_SWEEP_EVERY;
  }

  /** Starts a full sweep (unless one is running): the leader asked, or it is time. */
  resync(): void {
    if (this.swept !== null) return;
    this.sweep++;
    this.swept = new Set();
    this.sweepPageDelivered = false;
    this.reportsSinceSweep = 0;
  }

  sweeping(): boolean {
    return this.swept !== null;
  }

  /** How many keys the leader holds a demand of this agent for (as acknowledged). */
  size(): number {
    return this.acked.size;
  }

  /** The agent gave `key` back (held-keys.ts): its next demand is sent whatever the dead-band (the leader
   * takes the key's demand again from it; a stale value it holds is dropped by the next sweep). */
  forget(key: string): void {
    this.acked.delete(key);
  }

  /** The next report's content from the current velocity and the acknowledgements waiting. */
  page(current: readonly VelocityMessage[], pendingAcks: ReadonlyMap<string, number>): ReportPage {
    let left = this.budget;
    const acks: AckMessage[] = [];
    let more = false;
    for (const [key, epoch] of pendingAcks) {
      const b = ackEntryBytes(key);
      if (b > left) {
        more = true;
        break;
      }
      left -= b;
      acks.push({ key, epoch });
    }
    const candidates: { m: VelocityMessage; move: number }[] = [];
    const live = new Set<string>();
    for (const m of current) {
      const d = m.allowedPerS + m.refusedPerS;
      if (!(d > 0)) continue;
      live.add(m.key);
      const prev = this.acked.get(m.key) ?? 0;
      const move = Math.abs(d - prev);
      const unswept = this.swept !== null && !this.swept.has(m.key);
      if (unswept || move > Math.max(DEAD_BAND_MIN, DEAD_BAND_FRACTION * Math.max(d, prev)))
        candidates.push({ m, move: unswept ? Math.max(move, d) : move });
    }
    for (const [key, prev] of this.acked)
      if (!live.has(key)) candidates.push({ m: { key, allowedPerS: 0, refusedPerS: 0 }, move: prev });
    candidates.sort((a, b) => b.move - a.move);
    const velocity: VelocityMessage[] = [];
    let unsentLive = 0;
    for (const c of candidates) {
      const b = velocityEntryBytes(c.m.key);
      if (b > left) {
        more = true;
        if (live.has(c.m.key)) unsentLive++;
        continue;
      }
      left -= b;
      velocity.push(c.m);
    }
    // Done when no live key of the sweep is left unsent (keys sent earlier in it are restamped only
    // when they moved; the leader keeps their stamp of this sweep from then).
    const sweepDone = this.swept !== null && unsentLive === 0;
    return {
      acks,
      velocity,
      sweep: this.sweep,
      sweepDone,
      sweepStart: this.swept !== null && this.swept.size === 0 && !this.sweepPageDelivered,
      more,
    };
  }

  /** The report carrying `page` was answered: its values are what the leader holds. */
  delivered(page: ReportPage): void {
    for (const v of page.velocity) {
      const d = v.allowedPerS + v.refusedPerS;
      if (d > 0) this.acked.set(v.key, d);
      else this.acked.delete(v.key);
      if (page.sweep === this.sweep) this.swept?.add(v.key);
    }
    if (page.sweep === this.sweep && this.swept !== null) this.sweepPageDelivered = true;
    if (page.sweep === this.sweep && page.sweepDone && this.swept !== null) {
      // Keys acknowledged before the sweep and not restamped by it are dropped by the leader.
      for (const key of [...this.acked.keys()]) if (!this.swept.has(key)) this.acked.delete(key);
      this.swept = null;
    }
    if (++this.reportsSinceSweep >= this.every) this.resync();
  }
}
