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
//     dropped (zero grants acknowledged or leases surely expired) — proposed only while the ledger finds
//     it retirable (every slice holder's lease live, so the wind-down ends within one lease);
//   - a winding-down key some cell reports demand for again (a retirement raced with new demand, a
//     holder was cut off before it acknowledged, a deleted tenant still asked for under tier:NAME) is
//     taken back (reviveImplicitTenants) before the round computes grants, while the count, which
//     includes it already, is within `max`: no cell is told it is gone while it is asked for.
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
  /** Winding-down keys proposed for taking back (demand came back). */
  revived = 0;
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
      else if (nowMs - last >= this.idleMs && out.length < MAX_RETIRE_PER_COMMAND && ledger.retirable(key))
        out.push(key);
    }
    return out;
  }

  /**
   * The winding-down keys some cell reports demand for (`demand`), at most MAX_RETIRE_PER_COMMAND: `revive` to take
   * back before the round's grants, or, while the ledger's count (which includes them: they hold slices) plus the
   * pending new ones is above `max`, `refused` (counted) — the caller then forgets their demand, so once their last
   * slice is gone they come back only through `admit`, as any new one. Looks through the smaller of the two sets.
   */
  wanted(ledger: Ledger, demand: ReadonlyMap<string, unknown>): { revive: string[]; refused: string[] } {
    const out: string[] = [];
    if (ledger.windingDownCount === 0 || demand.size === 0) return { revive: out, refused: [] };
    const keys = ledger.windingDownCount <= demand.size ? ledger.windingDownKeys() : demand.keys();
    for (const key of keys) {
      if (out.length >= MAX_RETIRE_PER_COMMAND) break;
      if (demand.has(key) && ledger.isWindingDown(key)) out.push(key);
    }
    if (out.length > 0 && ledger.implicitTenantCount + this.pending.size > this.max) {
      this.refused += out.length;
      return { revive: [], refused: out };
    }
    return { revive: out, refused: [] };
  }

  /** The proposal to take back `keys` committed. */
  noteRevived(keys: readonly string[]): void {
    this.revived += keys.length;
  }

  /** The proposal of `keys` committed. */
  noteRetired(keys: readonly string[]): void {
    this.retired += keys.length;
    for (const key of keys) this.lastDemandMs.delete(key);
  }
}
