// The lease leader's bound on implicit tenants (unknown-tenant policy tier:NAME): an unknown tenant a
// cell reports demand for becomes an implicit tenant once the round grants it a slice, and stays in the
// ledger while some cell holds one. Two rules keep their number bounded:
//
//   - at most `max` (--max-implicit-tenants): the ledger counts every tenant key with slices and no
//     record (Ledger.implicitTenantCount: implicit, winding down, or a deleted tenant's slices not yet
//     dropped) until its last slice is gone; demand for a new implicit tenant is taken only while that
//     count plus the new ones this leader has taken but not yet granted is below `max`. Beyond it the
//     tenant is treated as under the policy deny: no grant, so every agent refuses it (counted);
//   - an implicit tenant no cell reported demand for within `idleMs` (--implicit-tenant-idle-ms) is
//     wound down as a deletion (retireImplicitTenants), which frees its place once its last slice is
//     dropped (zero grants acknowledged or leases surely expired).
//
// Leader memory only: a new term starts every idle clock afresh (an idle tenant waits longer, never less).
import type { Ledger } from '../ledger/ledger.js';
import { MAX_RETIRE_PER_COMMAND } from '../ledger/ledger-commands.js';

/** Default most implicit tenants the ledger holds (--max-implicit-tenants). */
export const DEFAULT_MAX_IMPLICIT_TENANTS = 100_000;
/** Default time without demand after which an implicit tenant is wound down (--implicit-tenant-idle-ms). */
export const DEFAULT_IMPLICIT_TENANT_IDLE_MS = 300_000;
/** Longest idle time accepted (a day). */
export const MAX_IMPLICIT_TENANT_IDLE_MS = 86_400_000;

export class ImplicitTenants {
  /** Demand reports of new implicit tenants not taken because the bound was reached. */
  refused = 0;
  /** Implicit tenants proposed for winding down. */
  retired = 0;
  /** Implicit tenants whose demand this leader took and that hold no slice yet. */
  private readonly pending = new Set<string>();
  /** Implicit tenant → when this leader last saw some cell's demand for it (its own clock, ms). */
  private readonly lastDemandMs = new Map<string, number>();

  constructor(
    readonly max: number,
    readonly idleMs: number,
  ) {
    if (!Number.isSafeInteger(max) || max < 0) throw new RangeError('max implicit tenants must be an integer ≥ 0');
    if (!(idleMs > 0)) throw new RangeError('implicit tenant idle time must be > 0');
  }

  /** Forgets what this leader saw (a new term). */
  reset(): void {
    this.pending.clear();
    this.lastDemandMs.clear();
  }

  /**
   * Whether demand for `key`, which no cell reports demand for yet, may be taken: always for anything but a new
   * implicit tenant; for one, only below the bound (then it is counted as pending until its first slice).
   */
  admit(ledger: Ledger, key: string): boolean {
    if (this.pending.has(key) || !ledger.isImplicitTenant(key) || ledger.holdsSlices(key)) return true;
    if (ledger.implicitTenantCount + this.pending.size >= this.max) {
      this.refused++;
      return false;
    }
    this.pending.add(key);
    return true;
  }

  /**
   * The implicit tenants to wind down now (at most MAX_RETIRE_PER_COMMAND): those no cell reported demand for in the
   * last idleMs of this leader's clock. `hasDemand` tells whether some cell reports demand for a key now.
   */
  idle(ledger: Ledger, nowMs: number, hasDemand: (key: string) => boolean): string[] {
    for (const key of this.pending) if (ledger.holdsSlices(key) || !hasDemand(key)) this.pending.delete(key);
    for (const key of this.lastDemandMs.keys()) if (!ledger.isImplicitTenant(key)) this.lastDemandMs.delete(key);
    const out: string[] = [];
    for (const key of ledger.implicitTenantKeys()) {
      const last = this.lastDemandMs.get(key);
      if (last === undefined || hasDemand(key)) this.lastDemandMs.set(key, nowMs);
      else if (nowMs - last >= this.idleMs && out.length < MAX_RETIRE_PER_COMMAND) out.push(key);
    }
    return out;
  }

  /** The proposal of `keys` committed. */
  noteRetired(keys: readonly string[]): void {
    this.retired += keys.length;
    for (const key of keys) this.lastDemandMs.delete(key);
  }
}
