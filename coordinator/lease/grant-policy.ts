// The grant computation of one lease round, as one injected function: `(ledger, demands, nowMs) →
// Grant[]`. The default is the allocator (coordinator/allocator: max-min fair, shrink before grow,
// mirroring the ledger's counting rule so its rounds are accepted); tests may inject anything. Whatever
// the policy returns, the ledger refuses a round that would break the bound (QUOTA_EXCEEDED), and the
// lease service then retries the round without grants, so a wrong policy costs rebalancing, never
// safety.
import { AllocatorInputBuilder, allocateRound, allocatorCells } from '../allocator/index.js';
import type { AllocatorInput, AllocatorInputBuffers } from '../allocator/index.js';
import type { Ledger, SliceView } from '../ledger/ledger.js';
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

/** A round's keys, each with a quota, mapped to its parent cap key (`Ledger.definition(key).parent`). */
export type RoundKeys = ReadonlyMap<string, string | null>;

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
  const known = new Map<string, string | null>();
  for (const k of keys) {
    if (known.has(k)) continue;
    const def = ledger.definition(k);
    if (def !== undefined) known.set(k, def.parent);
  }
  return buildRoundInputOf(ledger, demands, nowMs, known, buffers);
}

/**
 * buildRoundInput for keys whose definitions the caller has read in this round (each key's quota
 * and parent read once a round, not again here). Parents missing from `keys` are added.
 */
export function buildRoundInputOf(
  ledger: Ledger,
  demands: RoundDemands,
  nowMs: number,
  keys: RoundKeys,
  buffers?: AllocatorInputBuffers,
): AllocatorInput | null {
  const wanted = withParents(ledger, keys);
  if (wanted.size === 0) return null;
  const cells = allocatorCells(ledger.listCells(), demands.reported);
  const index = new Map(cells.map((c, i) => [c.id, i]));
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
  const take = (v: number, cellId: string): void => {
    const i = index.get(cellId);
    if (i !== undefined && Number.isFinite(v) && v > 0) demand[i] = v;
  };
  const read = ledger.quotaColumnsReader();
  for (const [key, parent] of wanted) {
    demand.fill(0);
    demands.byKey.get(key)?.forEach(take); // forEach: no entry array per cell
    // Read into the columns (no object per slice), counted as after this entry's acknowledgements.
    builder.addQuotaColumns(key, demand, parent, read, ackedBy.size === 0 ? undefined : ackedBy.get(key));
  }
  return builder.build({ nowMs, leaseTtlMs: demands.leaseTtlMs, skewMarginMs: ledger.config.skewMarginMs });
}

/**
 * `keys` with every parent chain they need, each parent (with a quota) right after its first child
 * (the rows' order). `keys` itself when no key has a parent (a round without caps).
 */
function withParents(ledger: Ledger, keys: RoundKeys): RoundKeys {
  let any = false;
  for (const p of keys.values())
    if (p !== null) {
      any = true;
      break;
    }
  if (!any) return keys;
  const wanted = new Map<string, string | null>();
  for (const [key, parent] of keys) {
    if (wanted.has(key)) continue;
    wanted.set(key, parent);
    for (let p = parent; p !== null && !wanted.has(p);) {
      const pp = keys.has(p) ? (keys.get(p) as string | null) : ledger.definition(p)?.parent;
      if (pp === undefined) break; // the parent has no quota
      wanted.set(p, pp);
      p = pp;
    }
  }
  return wanted;
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
 * A grant of `slice` as it stands, one epoch higher: what the ledger counts does not change (a deleted quota's slice
 * gets zero, which winds it down). Used to re-send a slice under a new definition or a new epoch.
 */
export function sameSliceNextEpoch(
  ledger: Ledger,
  key: string,
  cellId: string,
  slice: SliceView,
  leaseExpiresAtMs: number,
): Grant {
  const live = ledger.getQuota(key) !== undefined;
  return {
    key,
    cellId,
    rate: live ? slice.rate : 0,
    burst: live ? slice.burst : 0,
    epoch: slice.epoch + 1,
    leaseExpiresAtMs,
  };
}

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
 * `withQuota`: keys known to have a quota this round (the round's keys), not looked up again.
 */
export function definitionGrants(
  ledger: Ledger,
  demands: RoundDemands,
  nowMs: number,
  grants: Grant[],
  firstGrantKeys: Iterable<string>,
  withQuota?: { has(key: string): boolean },
): { grants: Grant[]; complete: boolean } {
  // The (cell, key) pairs the round grants already: made only when a first grant is wanted (most
  // rounds want none, and the round's grants are thousands).
  let taken: Set<string> | null = null;
  const isTaken = (cellId: string, key: string): boolean => {
    if (taken === null) {
      taken = new Set<string>();
      for (const g of grants) taken.add(`${g.cellId}\u0000${g.key}`);
    }
    return taken.has(`${cellId}\u0000${key}`);
  };
  const leaseExpiresAtMs = nowMs + demands.leaseTtlMs;
  let added = 0;
  // A cell asking for a quota it holds no slice of (its refusals are its demand) gets a first grant
  // even when the allocator leaves it at its floor: the grant is how it learns the definition and
  // the floor. A zero grant: the cell uses max(grant, floor), which the ledger counts already.
  // A key held at every registered cell needs no first grant when every reporting cell is registered.
  const cells = ledger.listCells().length;
  let reportedRegistered = true;
  for (const id of demands.reported) if (ledger.getCell(id) === undefined) reportedRegistered = false;
  for (const key of firstGrantKeys) {
    const byCell = demands.byKey.get(key);
    if (byCell === undefined || (withQuota?.has(key) !== true && ledger.getQuota(key) === undefined)) continue;
    const held = ledger.sliceEpochs(key);
    if (reportedRegistered && held !== undefined && held.size === cells) continue;
    for (const [cellId, d] of byCell) {
      if (!(d > 0) || !demands.reported.has(cellId) || (held?.get(cellId)?.epoch ?? 0) !== 0) continue;
      if (isTaken(cellId, key)) continue;
      if (added >= MAX_DEFINITION_GRANTS_PER_ROUND) return { grants, complete: false };
      grants.push({ key, cellId, rate: 0, burst: 0, epoch: 1, leaseExpiresAtMs });
      (taken as Set<string> | null)?.add(`${cellId}\u0000${key}`);
      added++;
    }
  }
  for (const cellId of [...demands.reported].sort()) {
    for (const key of ledger.staleSliceKeys(cellId)) {
      if (added >= MAX_DEFINITION_GRANTS_PER_ROUND) return { grants, complete: false };
      if (isTaken(cellId, key)) continue;
      const s = ledger.getSlice(key, cellId);
      if (s === undefined) continue;
      grants.push(sameSliceNextEpoch(ledger, key, cellId, s, leaseExpiresAtMs));
      added++;
    }
  }
  return { grants, complete: true };
}
