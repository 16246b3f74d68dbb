// The runtime part of the global quota table: per quota key (`tenant/<id>`, `tier/<name>`,
// `domain/<domain>`, as the coordinator names them), the rate and burst this cell uses instead of its
// static share. The lease client computes the entries (a live grant, or the grant's floor once the
// lease expired) and the main thread posts them to every worker; each thread's Decider looks them up.
// A key with no entry runs on the static share (quotas.ts), as before any grant.
//
// Changing a key's limit only changes the GcraLimit passed to take(): the bucket keeps its state,
// and a smaller burst clamps at once (the bucket module's rule), so a shrink never lets an old,
// deeper bucket through.
import { limitFromRate } from '../buckets/gcra.js';
import type { QuotaSlice } from '../decide/quotas.js';
import { reportedLimit } from '../decide/quotas.js';

/** One key's entry: `leased` = a live grant (false: the grant's floor, the agent is fail-static). */
export type OverrideEntry =
  | { readonly key: string; readonly rate: number; readonly burst: number; readonly leased: boolean }
  | { readonly key: string; readonly remove: true };

export interface OverrideSlice extends QuotaSlice {
  readonly leased: boolean;
}

export class QuotaOverrides {
  private readonly map = new Map<string, OverrideSlice>();

  get size(): number {
    return this.map.size;
  }

  get(key: string): OverrideSlice | undefined {
    return this.map.get(key);
  }

  apply(entries: readonly OverrideEntry[]): void {
    for (const e of entries) {
      if ('remove' in e) {
        this.map.delete(e.key);
        continue;
      }
      const rate = Math.max(0, e.rate);
      const burst = Math.max(0, Math.floor(e.burst + 1e-9));
      this.map.set(e.key, { limit: limitFromRate(rate, burst, { start: 'empty' }), currentLimit: reportedLimit(rate, e.key), rate, burst, leased: e.leased });
    }
  }

  /** Every entry, for a (re)started worker. */
  entries(): OverrideEntry[] {
    return [...this.map].map(([key, s]) => ({ key, rate: s.rate, burst: s.burst, leased: s.leased }));
  }
}
