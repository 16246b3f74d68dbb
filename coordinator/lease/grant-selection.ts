// Which of a round's allocator grants the lease round sends, read from the allocator's grant columns
// (allocateRoundColumns): each rounded to float32 towards the current grant, those the rounding
// leaves equal to the current grant dropped, and at most `maxGrants` kept, by priority (see
// `grantPriority`). `Grant` objects are made only for the grants sent: at a million tenants × 16
// cells with 1% moving, a round makes ~100,000 grants of which the budget sends 5,000, and making an
// object for each of the others cost a quarter of the round (bench/allocator.ts).
import { roundTowards } from '../allocator/index.js';
import type { AllocatorInput, AllocatorQuota, GrantColumns } from '../allocator/index.js';
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
  return priorityOf(isTenantKey(g.key), g.rate, quotaRate, currentRate, floorRate, demand);
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
 * Buffers of a selection, reused from round to round (a round of 100,000 grants otherwise makes
 * ~4 MB of typed arrays, which at a million tenants' heap brings collections into the round).
 * Purely a cache: a selection's result never depends on what it held. Not for two selections at once.
 */
export class SelectionScratch {
  /** @internal */ at = new Int32Array(0);
  /** @internal */ rates = new Float64Array(0);
  /** @internal */ bursts = new Float64Array(0);
  /** @internal */ score = new Float64Array(0);
  /** @internal */ work = new Float64Array(0);
  /** @internal */ rows = new Uint8Array(0);

  /** @internal */
  ensure(grants: number, quotas: number): void {
    if (this.at.length < grants) {
      const size = Math.max(grants, 2 * this.at.length);
      this.at = new Int32Array(size);
      this.rates = new Float64Array(size);
      this.bursts = new Float64Array(size);
      this.score = new Float64Array(size);
      this.work = new Float64Array(size);
    }
    if (this.rows.length < quotas) this.rows = new Uint8Array(Math.max(quotas, 2 * this.rows.length));
  }
}

/** `key` starts with 'tenant/' (compared code by code: the hot loop makes no string). */
function isTenantKey(key: string): boolean {
  return (
    key.length >= 7 &&
    key.charCodeAt(6) === 47 && // '/'
    key.charCodeAt(0) === 116 && // t
    key.charCodeAt(1) === 101 && // e
    key.charCodeAt(2) === 110 && // n
    key.charCodeAt(3) === 97 && // a
    key.charCodeAt(4) === 110 && // n
    key.charCodeAt(5) === 116 // t
  );
}

/**
 * The grants of `cols` (computed from `input`) that the round sends. Ties in priority go to the
 * grant made first, so the selection is deterministic. `scratch`: reusable buffers (optional).
 */
export function selectGrants(
  input: AllocatorInput,
  cols: GrantColumns,
  maxGrants: number,
  float32: boolean,
  scratch: SelectionScratch = new SelectionScratch(),
): GrantSelection {
  const n = input.cells.length;
  const s = input.slices;
  const count = cols.count;
  const nq = input.quotas.length;
  scratch.ensure(count, nq);
  // Kept grants: their column index, (rounded) numbers and, when the budget may bind, priority. The
  // grants come grouped by quota row: a row's key, rate and floor are read once.
  const { at, rates, bursts, score } = scratch;
  const scored = count > maxGrants;
  const { row: gRow, cell: gCell, rate: gRate, burst: gBurst } = cols;
  const { grantRate, grantBurst, epoch, demand } = s;
  let row = -1;
  let tenant = false;
  let quotaRate = 1;
  let floorRate = 0;
  let kept = 0;
  let unchanged = 0;
  for (let g = 0; g < count; g++) {
    const qi = gRow[g] as number;
    const c = gCell[g] as number;
    const i = qi * n + c;
    let rate = gRate[g] as number;
    let burst = gBurst[g] as number;
    const curRate = grantRate[i] as number;
    if (float32) {
      const curBurst = grantBurst[i] as number;
      rate = roundTowards(rate, curRate);
      burst = roundTowards(burst, curBurst);
      if ((epoch[i] as number) > 0 && rate === curRate && burst === curBurst) {
        unchanged++;
        continue;
      }
    }
    at[kept] = g;
    rates[kept] = rate;
    bursts[kept] = burst;
    if (scored) {
      if (qi !== row) {
        row = qi;
        const q = input.quotas[qi] as AllocatorQuota;
        tenant = isTenantKey(q.key);
        quotaRate = q.rate;
        floorRate = q.floorRate;
      }
      const floor = input.cells[c]?.hasFloor === true ? floorRate : 0;
      const p = priorityOf(tenant, rate, quotaRate, curRate, floor, demand[i] as number);
      score[kept] = Number.isNaN(p) ? 0 : p; // a zero quota's move is 0 / 0
    }
    kept++;
  }
  const grants: Grant[] = [];
  const deferredRow = scratch.rows;
  let deferred = 0;
  if (kept <= maxGrants) {
    for (let j = 0; j < kept; j++) grants.push(cols.grant(input, at[j] as number, rates[j], bursts[j]));
  } else {
    deferredRow.fill(0, 0, nq);
    // The `maxGrants` kept grants of highest priority, ties to the earlier grant: those above the
    // max-th highest score, then those at it in order (a selection in O(kept), not a sort).
    const work = scratch.work;
    work.set(score.subarray(0, kept));
    const threshold = kthLargest(work, kept, maxGrants);
    let atThreshold = maxGrants;
    for (let j = 0; j < kept; j++) if ((score[j] as number) > threshold) atThreshold--;
    for (let j = 0; j < kept; j++) {
      const g = at[j] as number;
      const sc = score[j] as number;
      if (sc > threshold || (sc === threshold && atThreshold-- > 0))
        grants.push(cols.grant(input, g, rates[j], bursts[j]));
      else {
        deferred++;
        deferredRow[gRow[g] as number] = 1;
      }
    }
  }
  const deferredRows: number[] = [];
  if (deferred > 0) for (let q = 0; q < nq; q++) if (deferredRow[q] === 1) deferredRows.push(q);
  return { grants, deferredRows, deferred, unchanged };
}

/** The k-th largest value of a[0, len) (1 ≤ k ≤ len, no NaN), by quickselect; reorders it. */
function kthLargest(a: Float64Array, len: number, k: number): number {
  const want = len - k; // its index in ascending order
  let lo = 0;
  let hi = len - 1;
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
