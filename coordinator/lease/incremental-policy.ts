// The lease round's default grant policy: the allocator over what CHANGED, not over every quota.
//
// A full round (grant-policy.ts `allocatorPolicy`) recomputes every quota some cell holds a slice
// of, each round: O(quotas × cells), ~1 s for a million tenants × 16 cells. But the allocator's
// decision for a quota depends only on that quota's row (its definition, ceiling, slices, the
// cells' demands and acknowledgements), its parent cap's, and the cells' state (registration,
// floor slots, leases); and a quota the allocator reports *settled* (AllocatorOutput.unsettled = 0:
// nothing sent, no acknowledgement awaited, nobody starved or held below target) gets nothing from
// a later round with the same inputs, whichever cells report. So this policy keeps a WORKING SET:
//
//   - a quota enters it when one of its inputs changes: the ledger lists the keys whose slices,
//     definition or ceiling changed since the last round (Ledger.takeTouchedKeys), the lease service
//     the keys whose demand moved (RoundDemands.changedKeys, with its dead-band), plus this entry's
//     acknowledgements; `since` = this round;
//   - every round computes exactly the working set (plus, for a key under a tier cap, the whole
//     family: the cap is split over all its tenants at every cell);
//   - a quota that the round leaves unsettled stays, with `since` just after this round; a settled
//     one leaves once every cell with a live lease has reported in some round at or after its
//     `since` (grants go only to reporting cells, and a cell's decision may depend on who reports
//     with it — a starved cell makes small excesses elsewhere shrink — so each cell must have been
//     computed with the quota settled);
//   - anything that changes every quota at once — a cell registered, a floor slot, a lease released
//     or lapsing, a tier's definition, more changes than the ledger tracks, a new term (the lease
//     service forgets its demands) — makes the round full: every quota once, then back to the
//     changes.
// A round then costs O(changed quotas × cells): a tenant whose demand and grants are steady costs
// nothing. `test/coordinator/lease/incremental-policy.test.ts` checks, over random rounds against a
// real ledger, that this policy sends exactly the full round's grants.
//
// Two more things keep the Raft log compact (docs/quota-model.md, "Log volume"):
//   - grants are rounded to float32 towards the current grant (grant-rounding.ts): 4 bytes a number
//     in the compact entry, never more than the unrounded grant; a grant the rounding leaves equal to
//     the current one is not sent;
//   - a round carries at most `maxGrantsPerRound` allocator grants (default 5,000 ≈ 100 KB of entry,
//     1 MB/s of log at 10 rounds/s). Beyond it the grants go by priority — parent caps, then cells
//     refusing traffic (largest shortfall first), then shrinks (they free capacity for the next
//     round), then the rest by the size of the move — and the others wait in the working set for a
//     later round. Any subset of a round's grants is accepted by the ledger (leaving out a grow
//     lowers what is counted; a shrink frees nothing until acknowledged anyway), so the budget costs
//     rebalancing speed, never the bound. Definition grants (a cell's first grant of a quota, new
//     definitions, wind-downs) are outside the budget: they have their own limit,
//     MAX_DEFINITION_GRANTS_PER_ROUND.
import { allocateRoundColumns, AllocatorInputBuffers, AllocatorWorkspace } from '../allocator/index.js';
import type { AllocatorInput, AllocatorQuota, GrantColumns } from '../allocator/index.js';
import type { Ledger } from '../ledger/ledger.js';
import type { Grant } from '../ledger/ledger-commands.js';
import { buildRoundInputOf, definitionGrants } from './grant-policy.js';
import type { GrantPolicy, RoundDemands } from './grant-policy.js';
import { SelectionScratch, selectGrants } from './grant-selection.js';

export { grantPriority } from './grant-selection.js';

/** Default most allocator grants per round (≈ 100 KB of compact entry at ~20 B a grant). */
export const DEFAULT_MAX_GRANTS_PER_ROUND = 5_000;

export interface IncrementalPolicyOptions {
  /** Most allocator grants one round carries (≥ 1); the rest wait for later rounds, by priority. */
  readonly maxGrantsPerRound?: number;
  /** Round every grant to float32 towards the current grant (default true). */
  readonly float32?: boolean;
}

export interface IncrementalPolicyStats {
  rounds: number;
  fullRounds: number;
  /** Quotas computed in the last round, and in all rounds. */
  lastQuotas: number;
  quotas: number;
  /** Allocator grants left for a later round by the budget (all rounds). */
  deferredGrants: number;
  /** Allocator grants not sent because float32 rounding left them equal to the current grant. */
  unchangedGrants: number;
  /** Keys in the working set after the last round. */
  workingSet: number;
}

const F_RELEASED = 1;
const F_LAPSED = 2;

export class IncrementalAllocatorPolicy {
  readonly stats: IncrementalPolicyStats = {
    rounds: 0,
    fullRounds: 0,
    lastQuotas: 0,
    quotas: 0,
    deferredGrants: 0,
    unchangedGrants: 0,
    workingSet: 0,
  };
  private readonly maxGrants: number;
  private readonly float32: boolean;
  /** Quota key → the round since which its inputs are unchanged. */
  private readonly working = new Map<string, number>();
  private round = 0;
  /** Cell → the last round it reported in. */
  private readonly lastReport = new Map<string, number>();
  private cellSignature = '';
  private readonly cellFlags = new Map<string, number>();
  /** The definition grants stopped at their limit: look at every demand again next round. */
  private definitionBacklog = true;
  private readonly workspace = new AllocatorWorkspace();
  /** The round's input columns and the selection's buffers, reused from round to round. */
  private readonly inputBuffers = new AllocatorInputBuffers();
  private readonly selection = new SelectionScratch();
  /**
   * Parent cap key → the keys last seen with it as parent (a superset of its family: every key is
   * re-read when it enters the working set, the whole index at a full round; members are checked
   * against the ledger when used). Replaces a walk over every key of the ledger each round.
   */
  private readonly childrenOf = new Map<string, Set<string>>();
  private readonly parentOf = new Map<string, string>();

  constructor(opts: IncrementalPolicyOptions = {}) {
    const max = opts.maxGrantsPerRound ?? DEFAULT_MAX_GRANTS_PER_ROUND;
    if (!Number.isSafeInteger(max) || max < 1) throw new RangeError('maxGrantsPerRound must be a positive integer');
    this.maxGrants = max;
    this.float32 = opts.float32 ?? true;
  }

  /** The policy as the lease service calls it. */
  readonly policy: GrantPolicy = (ledger, demands, nowMs) => this.compute(ledger, demands, nowMs);

  private compute(ledger: Ledger, demands: RoundDemands, nowMs: number): Grant[] {
    const r = ++this.round;
    this.stats.rounds++;
    const touched = ledger.takeTouchedKeys();
    const cells = ledger.listCells();
    for (const id of demands.reported) this.lastReport.set(id, r);
    // Cell-wide changes make the round full.
    let full = touched === null || demands.changedKeys === undefined;
    const signature = cells.map((c) => `${c.id}:${c.slot ?? '-'}`).join(',');
    if (signature !== this.cellSignature) full = true;
    this.cellSignature = signature;
    const skew = ledger.config.skewMarginMs;
    for (const c of cells) {
      const e = c.leaseExpiresAtMs;
      const f = (e !== null && nowMs >= e + skew ? F_RELEASED : 0) | (e === null || nowMs >= e ? F_LAPSED : 0);
      // A flip, or a cell without a live lease reporting (it rejoins: every quota may owe it a grant).
      if (this.cellFlags.get(c.id) !== f || ((f & F_LAPSED) !== 0 && demands.reported.has(c.id))) full = true;
      this.cellFlags.set(c.id, f);
    }
    if (full) {
      this.stats.fullRounds++;
      this.working.clear();
      this.childrenOf.clear();
      this.parentOf.clear();
      for (const k of ledger.activeQuotaKeys()) this.enter(k, r);
      for (const k of demands.byKey.keys()) this.enter(k, r);
    } else {
      for (const k of touched ?? []) this.enter(k, r);
      for (const k of demands.changedKeys ?? []) this.enter(k, r);
      for (const a of demands.acks) this.enter(a.key, r);
    }
    if (cells.length === 0 || demands.reported.size === 0) return [];

    // The round's keys: the working set's keys that the full round would compute (a slice or a
    // demand, a quota), and every family with a member among them; each key's definition is read
    // once here (the gather and the definition grants take the parents from `keys`).
    const keys = new Map<string, string | null>();
    const parents = new Set<string>();
    for (const k of this.working.keys()) {
      const def = ledger.definition(k);
      const parent = def?.parent ?? null;
      this.index(k, parent);
      if (def === undefined || (!ledger.hasSlices(k) && !demands.byKey.has(k))) {
        this.working.delete(k); // retired (definition grants wind it down) or nothing to allocate
        continue;
      }
      keys.set(k, parent);
      if (parent !== null) parents.add(parent);
      if (k.charCodeAt(1) === 105 && k.startsWith('tier/')) parents.add(k); // 'i': tenant/… keys skip the string op
    }
    if (parents.size > 0 && !full) {
      // The families: the keys indexed under each parent that still have it and something to allocate.
      for (const p of parents)
        for (const k of this.childrenOf.get(p) ?? []) {
          if (keys.has(k) || ledger.definition(k)?.parent !== p) continue;
          if (!ledger.hasSlices(k) && !demands.byKey.has(k)) continue;
          keys.set(k, p);
          if (!this.working.has(k)) this.working.set(k, r);
        }
    }
    const input = buildRoundInputOf(ledger, demands, nowMs, keys, this.inputBuffers);
    let grants: Grant[] = [];
    if (input !== null) {
      const out = allocateRoundColumns(input, this.workspace);
      this.stats.lastQuotas = input.quotas.length;
      this.stats.quotas += input.quotas.length;
      grants = this.finish(input, out.changes, r);
      this.settle(input, out.unsettled, cells, demands, r);
    } else this.stats.lastQuotas = 0;
    // First grants: a (key, cell) pair gets demand only through that cell's report, and a quota
    // appears only through a touched key, so the round's keys and the changed ones cover them.
    let firstGrantKeys: Iterable<string> = demands.byKey.keys();
    if (!full && !this.definitionBacklog) {
      const more = [...(demands.changedKeys ?? [])].filter((k) => !keys.has(k));
      firstGrantKeys = more.length === 0 ? keys.keys() : [...keys.keys(), ...more];
    }
    const d = definitionGrants(ledger, demands, nowMs, grants, firstGrantKeys, keys);
    this.definitionBacklog = !d.complete;
    this.stats.workingSet = this.working.size;
    return d.grants;
  }

  /** A key enters the working set (since round r); the round's key loop indexes its parent. */
  private enter(key: string, r: number): void {
    this.working.set(key, r);
  }

  /** Indexes `key` under its parent cap (as the ledger has it now), or under none. */
  private index(key: string, parent: string | null): void {
    const before = this.parentOf.get(key);
    if (before === parent) return;
    if (before !== undefined) this.childrenOf.get(before)?.delete(key);
    if (parent === null) {
      this.parentOf.delete(key);
      return;
    }
    this.parentOf.set(key, parent);
    let set = this.childrenOf.get(parent);
    if (set === undefined) this.childrenOf.set(parent, (set = new Set()));
    set.add(key);
  }

  /** Float32 rounding, unchanged grants dropped, the budget applied; deferred keys stay in the working set. */
  private finish(input: AllocatorInput, cols: GrantColumns, r: number): Grant[] {
    const sel = selectGrants(input, cols, this.maxGrants, this.float32, this.selection);
    this.stats.unchangedGrants += sel.unchanged;
    this.stats.deferredGrants += sel.deferred;
    for (const q of sel.deferredRows) this.working.set((input.quotas[q] as AllocatorQuota).key, r);
    return sel.grants;
  }

  /** Keys the round left unsettled stay (since = now); settled ones leave once every live cell reported since. */
  private settle(
    input: AllocatorInput,
    unsettled: Uint8Array,
    cells: ReturnType<Ledger['listCells']>,
    demands: RoundDemands,
    r: number,
  ): void {
    let minReport = r;
    for (const c of cells) {
      const lapsed = ((this.cellFlags.get(c.id) ?? 0) & F_LAPSED) !== 0;
      if (lapsed && !demands.reported.has(c.id)) continue;
      const last = this.lastReport.get(c.id) ?? -1;
      if (last < minReport) minReport = last;
    }
    input.quotas.forEach((q, i) => {
      if (unsettled[i] === 1) {
        // The cells that reported in this round saw it unsettled: each must report again after it.
        this.working.set(q.key, r + 0.5);
        return;
      }
      const since = this.working.get(q.key);
      if (since !== undefined && since <= minReport) this.working.delete(q.key);
    });
  }
}

/** A fresh incremental allocator policy (state per lease service: one per coordinator). */
export function createAllocatorPolicy(opts: IncrementalPolicyOptions = {}): GrantPolicy {
  return new IncrementalAllocatorPolicy(opts).policy;
}
