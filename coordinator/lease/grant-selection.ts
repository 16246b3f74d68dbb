// Which of a round's allocator grants the lease round sends, read from the allocator's grant columns
// (allocateRoundColumns): each rounded to float32 towards the current grant, those the rounding
// leaves equal to the current grant dropped, and at most `maxGrants` kept, by priority (see
// `grantPriority`). `Grant` objects are made only for the grants sent: at a million tenants × 16
// cells with 1% moving, a round makes ~100,000 grants of which the budget sends 5,000, and making an
// object for each of the others cost a quarter of the round (bench/allocator.ts).
import { roundTowards } from '../allocator/index.js';
import type { AllocatorInput, GrantColumns } from '../allocator/index.js';
import type { Grant } from '../ledger/ledger-commands.js';

export interface GrantSelection {
  /** The grants sent, in the round's order. */
  readonly grants: Grant[];
  /** Input rows (quotas) with a grant left for a later round by the budget, each once, ascending. */
  readonly deferredRows: number[];
  /** Grants left for a later round by the budget. */
  readonly deferred: number;
  /** Grants not sent because float32 rounding left them equal to the current grant. */
  readonly unchanged: number;
}

/**
 * The order in which a round over its budget sends grants (higher first): caps (tier and domain
 * keys), then grows for cells refusing traffic (largest shortfall, relative to the quota, first),
 * then shrinks (they free capacity once acknowledged), then the rest by the size of the move.
 */
export function grantPriority(
  g: Pick<Grant, 'key' | 'rate'>,
  quotaRate: number,
  currentRate: number,
  floorRate: number,
  demand: number,
): number {
  return priorityOf(g.key.startsWith('tenant/'), g.rate, quotaRate, currentRate, floorRate, demand);
}

function priorityOf(
  tenant: boolean,
  rate: number,
  quotaRate: number,
  currentRate: number,
  floorRate: number,
  demand: number,
): number {
  const move = Math.abs(rate - currentRate) / quotaRate;
  const level = Math.max(currentRate, floorRate);
  if (!tenant) return 10 + move;
  if (rate > currentRate && demand > level) return 4 + Math.min(1, (demand - level) / quotaRate);
  if (rate < currentRate) return 2 + Math.min(1, move);
  return Math.min(1, move);
}

/**
 * The grants of `cols` (computed from `input`) that the round sends. Ties in priority go to the
 * grant made first, so the selection is deterministic.
 */
export function selectGrants(
  input: AllocatorInput,
  cols: GrantColumns,
  maxGrants: number,
  float32: boolean,
): GrantSelection {
  const n = input.cells.length;
  const s = input.slices;
  const count = cols.count;
  // Kept grants: their column index and (rounded) numbers.
  const at = new Int32Array(count);
  const rates = new Float64Array(count);
  const bursts = new Float64Array(count);
  let kept = 0;
  let unchanged = 0;
  for (let g = 0; g < count; g++) {
    const i = (cols.row[g] as number) * n + (cols.cell[g] as number);
    let rate = cols.rate[g] as number;
    let burst = cols.burst[g] as number;
    if (float32) {
      const curRate = s.grantRate[i] as number;
      const curBurst = s.grantBurst[i] as number;
      rate = roundTowards(rate, curRate);
      burst = roundTowards(burst, curBurst);
      if ((s.epoch[i] as number) > 0 && rate === curRate && burst === curBurst) {
        unchanged++;
        continue;
      }
    }
    at[kept] = g;
    rates[kept] = rate;
    bursts[kept] = burst;
    kept++;
  }
  const take = new Uint8Array(kept);
  if (kept <= maxGrants) take.fill(1);
  else selectByPriority(input, cols, at, rates, kept, maxGrants, take);
  const grants: Grant[] = [];
  const deferredRow = new Uint8Array(input.quotas.length);
  let deferred = 0;
  for (let j = 0; j < kept; j++) {
    const g = at[j] as number;
    if (take[j] === 1) grants.push(cols.grant(input, g, rates[j], bursts[j]));
    else {
      deferred++;
      deferredRow[cols.row[g] as number] = 1;
    }
  }
  const deferredRows: number[] = [];
  if (deferred > 0) for (let q = 0; q < deferredRow.length; q++) if (deferredRow[q] === 1) deferredRows.push(q);
  return { grants, deferredRows, deferred, unchanged };
}

/**
 * Marks in `take` the `max` kept grants of highest priority, ties to the earlier grant: those above
 * the max-th highest score, then those at it in order. (A selection in O(kept), not a comparator
 * sort of 100,000 indexes.)
 */
function selectByPriority(
  input: AllocatorInput,
  cols: GrantColumns,
  at: Int32Array,
  rates: Float64Array,
  kept: number,
  max: number,
  take: Uint8Array,
): void {
  const n = input.cells.length;
  const s = input.slices;
  const score = new Float64Array(kept);
  // The grants come grouped by quota row: its key, rate and floor are read once per row.
  let row = -1;
  let tenant = false;
  let quotaRate = 1;
  let floorRate = 0;
  for (let j = 0; j < kept; j++) {
    const g = at[j] as number;
    const qi = cols.row[g] as number;
    if (qi !== row) {
      row = qi;
      const q = input.quotas[qi];
      tenant = q?.key.startsWith('tenant/') === true;
      quotaRate = q?.rate ?? 1;
      floorRate = q?.floorRate ?? 0;
    }
    const c = cols.cell[g] as number;
    const i = qi * n + c;
    const floor = input.cells[c]?.hasFloor === true ? floorRate : 0;
    const p = priorityOf(tenant, rates[j] as number, quotaRate, s.grantRate[i] as number, floor, s.demand[i] as number);
    score[j] = Number.isNaN(p) ? 0 : p; // a zero quota's move is 0 / 0
  }
  const threshold = kthLargest(score.slice(), max);
  let taken = 0;
  for (let j = 0; j < kept; j++)
    if ((score[j] as number) > threshold) {
      take[j] = 1;
      taken++;
    }
  for (let j = 0; j < kept && taken < max; j++)
    if (score[j] === threshold) {
      take[j] = 1;
      taken++;
    }
}

/** The k-th largest value of `a` (1 ≤ k ≤ a.length, no NaN), by quickselect; reorders `a`. */
function kthLargest(a: Float64Array, k: number): number {
  const want = a.length - k; // its index in ascending order
  let lo = 0;
  let hi = a.length - 1;
  while (lo < hi) {
    const pivot = a[(lo + hi) >>> 1] as number;
    let i = lo;
    let j = hi;
    while (i <= j) {
      while ((a[i] as number) < pivot) i++;
      while ((a[j] as number) > pivot) j--;
      if (i <= j) {
        const t = a[i] as number;
        a[i] = a[j] as number;
        a[j] = t;
        i++;
        j--;
      }
    }
    if (want <= j) hi = j;
    else if (want >= i) lo = i;
    else return a[want] as number;
  }
  return a[want] as number;
}
