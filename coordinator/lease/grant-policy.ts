// The grant computation of one lease round, as one injected function: `(ledger, demands, nowMs) →
// Grant[]`. The default is the allocator (coordinator/allocator: max-min fair, shrink before grow,
// mirroring the ledger's counting rule so its rounds are accepted); tests may inject anything. Whatever
// the policy returns, the ledger refuses a round that would break the bound (QUOTA_EXCEEDED), and the
// lease service then retries the round without grants, so a wrong policy costs rebalancing, never
// safety.
import { AllocatorInputBuilder, allocateRound, allocatorCells } from '../allocator/index.js';
import type { AllocatorInput, AllocatorInputBuffers } from '../allocator/index.js';
import type { Ledger, QuotaColumns } from '../ledger/ledger.js';
import type { Grant, GrantAck } from '../ledger/ledger-commands.js';

/** What the round knows besides the ledger. */
export interface RoundDemands {
  /** Cells whose lease this round renews (they reported since the last round). Only they get grants. */
  readonly reported: ReadonlySet<string>;
  /** Demand (allowed + refused per second over the cell's last 500 ms window) per quota key, per cell. */
  readonly byKey: ReadonlyMap<string, ReadonlyMap<string, number>>;
  /** The acknowledgements the same entry carries (applied before its grants). */
  readonly acks: readonly GrantAck[];
  /** Lease length given with each grant: leaseExpiresAtMs = nowMs + leaseTtlMs. */
  readonly leaseTtlMs: number;
  /**
   * The keys whose demand (in `byKey`) changed since the previous round — appeared, vanished, or
   * moved beyond the caller's dead-band — or undefined when unknown (the caller's memory was reset,
   * e.g. a new term): an incremental policy then computes a full round.
   */
  readonly changedKeys?: ReadonlySet<string> | undefined;
}

export type GrantPolicy = (ledger: Ledger, demands: RoundDemands, nowMs: number) => Grant[];

/** The enclosing cap of a quota key, if the ledger has it (a tenant's tier cap). */
function parentOf(ledger: Ledger, key: string): string | null {
  return ledger.definition(key)?.parent ?? null;
}

/**
 * The allocator's input for `keys` (those without a quota are left out) plus every parent they
 * need, read from the committed ledger, this round's demands and the same entry's acks. Null when
 * no key has a quota. `buffers`: reused column buffers (the input is then valid until their next use).
 */
export function buildRoundInput(
  ledger: Ledger,
  demands: RoundDemands,
  nowMs: number,
  keys: Iterable<string>,
  buffers?: AllocatorInputBuffers,
): AllocatorInput | null {
  const cells = allocatorCells(ledger.listCells(), demands.reported);
  const index = new Map(cells.map((c, i) => [c.id, i]));
  // Keep only keys with a quota; add parents so every parent is in the round.
  const wanted = new Map<string, string | null>();
  const add = (k: string): void => {
    if (wanted.has(k) || ledger.getQuota(k) === undefined) return;
    const parent = parentOf(ledger, k);
    wanted.set(k, parent);
    if (parent !== null) add(parent);
  };
  for (const k of keys) add(k);
  if (wanted.size === 0) return null;
  const ackedBy = new Map<string, Float64Array>();
  for (const a of demands.acks) {
    const i = index.get(a.cellId);
    if (i === undefined) continue;
    let row = ackedBy.get(a.key);
    if (row === undefined) ackedBy.set(a.key, (row = new Float64Array(cells.length)));
    row[i] = a.epoch;
  }
  const builder = new AllocatorInputBuilder(cells, wanted.size, buffers);
  const demand = new Float64Array(cells.length);
  const read = (key: string) => (cols: QuotaColumns, at: number) => ledger.readQuotaColumns(key, cols, at);
  for (const [key, parent] of wanted) {
    demand.fill(0);
    const d = demands.byKey.get(key);
    if (d !== undefined)
      for (const [cellId, v] of d) {
        const i = index.get(cellId);
        if (i !== undefined && Number.isFinite(v) && v > 0) demand[i] = v;
      }
    const acked = ackedBy.get(key);
    // Read into the columns (no object per slice); a key with acknowledgements in this entry
    // through its QuotaState, which the builder counts as after them.
    if (acked === undefined) builder.addQuotaColumns(key, demand, parent, read(key));
    else {
      const state = ledger.getQuotaState(key);
      if (state !== undefined) builder.addQuotaState(state, demand, { parent, ackedEpochs: acked });
    }
  }
  return builder.build({ nowMs, leaseTtlMs: demands.leaseTtlMs, skewMarginMs: ledger.config.skewMarginMs });
}

/**
 * The allocator over EVERY quota some cell holds a slice of or reports demand for, each round: the
 * stateless full round (the lease service's default is the incremental one, incremental-policy.ts,
 * which computes only what changed; this one stays as its reference and the benchmark's baseline).
 */
export const allocatorPolicy: GrantPolicy = (ledger, demands, nowMs) => {
  if (ledger.listCells().length === 0 || demands.reported.size === 0) return [];
  const keys = new Set<string>();
  for (const k of ledger.activeQuotaKeys()) keys.add(k);
  for (const k of demands.byKey.keys()) keys.add(k);
  const input = buildRoundInput(ledger, demands, nowMs, keys);
  return withDefinitionGrants(ledger, demands, nowMs, input === null ? [] : allocateRound(input).grants);
};

/** Most re-grants (new definitions, wind-downs) one round carries; the rest follow in the next rounds. */
export const MAX_DEFINITION_GRANTS_PER_ROUND = 20_000;

/**
 * Adds, for every reporting cell, a first grant for each quota it asks for but holds no slice of,
 * a grant for each slice stamped with an older definition of its
 * quota (a tier or tenant changed: same numbers, the new floor, version and parent) and a zero
 * grant for each slice of a deleted quota not yet wound down — unless the round already grants that
 * slice. A re-grant never raises what the ledger counts (the same numbers; a floor change is held at
 * the old value until acknowledged), so it is accepted in any state, also while a lowered quota is
 * still above its limit. The agent applies the new definition and acknowledges it; a deleted quota's
 * slice is dropped once its zero grant is acknowledged (or the cell's lease surely expired and
 * nothing on it is counted any more).
 */
export function withDefinitionGrants(ledger: Ledger, demands: RoundDemands, nowMs: number, grants: Grant[]): Grant[] {
  return definitionGrants(ledger, demands, nowMs, grants, demands.byKey.keys()).grants;
}

/**
 * withDefinitionGrants with the first grants looked for only among `firstGrantKeys` (keys of
 * `demands.byKey`); `complete` is false when MAX_DEFINITION_GRANTS_PER_ROUND stopped it early.
 */
export function definitionGrants(
  ledger: Ledger,
  demands: RoundDemands,
  nowMs: number,
  grants: Grant[],
  firstGrantKeys: Iterable<string>,
): { grants: Grant[]; complete: boolean } {
  const taken = new Set<string>();
  for (const g of grants) taken.add(`${g.cellId}\u0000${g.key}`);
  const leaseExpiresAtMs = nowMs + demands.leaseTtlMs;
  let added = 0;
  // A cell asking for a quota it holds no slice of (its refusals are its demand) gets a first grant
  // even when the allocator leaves it at its floor: the grant is how it learns the definition and
  // the floor. A zero grant: the cell uses max(grant, floor), which the ledger counts already.
  for (const key of firstGrantKeys) {
    const byCell = demands.byKey.get(key);
    if (byCell === undefined || ledger.getQuota(key) === undefined) continue;
    for (const [cellId, d] of byCell) {
      if (!(d > 0) || !demands.reported.has(cellId) || ledger.sliceEpoch(key, cellId) !== 0) continue;
      if (taken.has(`${cellId}\u0000${key}`)) continue;
      if (added >= MAX_DEFINITION_GRANTS_PER_ROUND) return { grants, complete: false };
      grants.push({ key, cellId, rate: 0, burst: 0, epoch: 1, leaseExpiresAtMs });
      taken.add(`${cellId}\u0000${key}`);
      added++;
    }
  }
  for (const cellId of [...demands.reported].sort()) {
    for (const key of ledger.staleSliceKeys(cellId)) {
      if (added >= MAX_DEFINITION_GRANTS_PER_ROUND) return { grants, complete: false };
      if (taken.has(`${cellId}\u0000${key}`)) continue;
      const s = ledger.getSlice(key, cellId);
      if (s === undefined) continue;
      const live = ledger.getQuota(key) !== undefined;
      grants.push({
        key,
        cellId,
        rate: live ? s.rate : 0,
        burst: live ? s.burst : 0,
        epoch: s.epoch + 1,
        leaseExpiresAtMs,
      });
      added++;
    }
  }
  return { grants, complete: true };
}
