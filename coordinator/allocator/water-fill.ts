// Water-filling: the one numeric routine behind every max-min fair split in the allocator.
//
// Given n bounded intervals [lo[i], hi[i]] and a total T, find the level λ with
//
//     Σ_i clamp(λ, lo[i], hi[i]) = T
//
// and write x[i] = clamp(λ, lo[i], hi[i]). Every x[i] is at least lo[i] and at most hi[i]; below the
// level everyone gets what they asked for (hi), above it nobody gets more than the level unless their
// lower bound says so. That is max-min fairness with floors: no x[i] can be raised without lowering
// some x[j] ≤ x[i]. If T ≤ Σ lo, x = lo (T is not honoured: lower bounds are hard); if T ≥ Σ hi, x = hi.
//
// The sum S(λ) is piecewise linear and non-decreasing with breakpoints at every lo and hi. For a
// handful of intervals we sort both lists (insertion sort on scratch arrays) and walk the
// breakpoints. Above that we solve S(λ) = T by Newton steps on the piecewise-linear S (each step is
// one O(n) pass giving S and its slope; a step that lands in the root's segment is exact),
// safeguarded by bisection of a bracket, so a handful of passes suffice — at the allocator's 16
// cells too: the two insertion sorts were a sixth of a round there (bench/allocator.ts, profiled),
// and they grow as n², up to tens of thousands of tenants under one cap at one cell.

/** Scratch buffers reused between calls (grown on demand). Not shared between concurrent callers. */
export class WaterFillScratch {
  los = new Float64Array(64);
  his = new Float64Array(64);

  ensure(n: number): void {
    if (this.los.length >= n) return;
    let size = this.los.length;
    while (size < n) size *= 2;
    this.los = new Float64Array(size);
    this.his = new Float64Array(size);
  }
}

/** Up to this n, sort and walk the breakpoints; above it, Newton steps. */
const SMALL = 4;

function sortPrefix(a: Float64Array, n: number): void {
  for (let i = 1; i < n; i++) {
    const v = a[i] as number;
    let j = i - 1;
    while (j >= 0 && (a[j] as number) > v) {
      a[j + 1] = a[j] as number;
      j--;
    }
    a[j + 1] = v;
  }
}

/**
 * Max-min fair split of `total` over the intervals [lo[i], hi[i]], i < n (lo[i] ≤ hi[i], all finite
 * and ≥ 0). Writes the shares to `out` (which may alias `hi` but not `lo`) and returns Σ out.
 */
export function waterFill(
  lo: Float64Array,
  hi: Float64Array,
  n: number,
  total: number,
  out: Float64Array,
  scratch: WaterFillScratch,
): number {
  let sumLo = 0;
  let sumHi = 0;
  for (let i = 0; i < n; i++) {
    sumLo += lo[i] as number;
    sumHi += hi[i] as number;
  }
  if (total <= sumLo) {
    for (let i = 0; i < n; i++) out[i] = lo[i] as number;
    return sumLo;
  }
  if (total >= sumHi) {
    for (let i = 0; i < n; i++) out[i] = hi[i] as number;
    return sumHi;
  }
  const level = n > SMALL ? newtonLevel(lo, hi, n, total, sumLo, sumHi) : walkLevel(lo, hi, n, total, sumLo, scratch);
  let sum = 0;
  for (let i = 0; i < n; i++) {
    const l = lo[i] as number;
    const h = hi[i] as number;
    const v = level < l ? l : level > h ? h : level;
    out[i] = v;
    sum += v;
  }
  // Float rounding (or the Newton steps' tolerance) may leave Σ out a hair above total; take it off the shares
  // above their floors, as much as each can give, until none is left, so that callers can rely on Σ out ≤ total
  // whenever total ≥ Σ lo (sum is recomputed: the subtractions round too).
  for (let pass = 0; sum > total && pass < 4; pass++) {
    let excess = sum - total;
    for (let i = 0; i < n && excess > 0; i++) {
      const v = out[i] as number;
      const l = lo[i] as number;
      const room = v - l;
      if (!(room > 0)) continue;
      if (room <= excess) {
        out[i] = l; // exactly the floor: v - room may round below it
        excess -= room;
      } else {
        const w = v - excess;
        out[i] = w < l ? l : w;
        excess = 0;
      }
    }
    sum = 0;
    for (let i = 0; i < n; i++) sum += out[i] as number;
  }
  return sum;
}

/** The level by sorting the breakpoints and walking them (small n). */
function walkLevel(
  lo: Float64Array,
  hi: Float64Array,
  n: number,
  total: number,
  sumLo: number,
  scratch: WaterFillScratch,
): number {
  scratch.ensure(n);
  const los = scratch.los;
  const his = scratch.his;
  for (let i = 0; i < n; i++) {
    los[i] = lo[i] as number;
    his[i] = hi[i] as number;
  }
  sortPrefix(los, n);
  sortPrefix(his, n);
  // Walk the breakpoints upwards from λ = min lo, where S = Σ lo.
  let a = 0; // next lo breakpoint
  let b = 0; // next hi breakpoint
  let level = los[0] as number;
  let s = sumLo;
  let slope = 0;
  let found = false;
  while (a < n || b < n) {
    const nextLo = a < n ? (los[a] as number) : Infinity;
    const nextHi = b < n ? (his[b] as number) : Infinity;
    const next = nextLo <= nextHi ? nextLo : nextHi;
    const sNext = s + slope * (next - level);
    if (slope > 0 && sNext >= total) {
      level += (total - s) / slope;
      found = true;
      break;
    }
    s = sNext;
    level = next;
    if (nextLo <= nextHi) {
      slope++;
      a++;
    } else {
      slope--;
      b++;
    }
  }
  if (!found) level = his[n - 1] as number; // unreachable: total < Σ hi
  return level;
}

/**
 * The level by safeguarded Newton steps on S(λ) = Σ clamp(λ, lo, hi) (large n). Σ lo < total < Σ hi.
 * Stops when S is within a relative 1e-13 of total or the bracket cannot shrink any more.
 */
function newtonLevel(
  lo: Float64Array,
  hi: Float64Array,
  n: number,
  total: number,
  sumLo: number,
  sumHi: number,
): number {
  let a = Infinity; // S(a) ≤ total
  let b = -Infinity; // S(b) ≥ total
  for (let i = 0; i < n; i++) {
    const l = lo[i] as number;
    const h = hi[i] as number;
    if (l < a) a = l;
    if (h > b) b = h;
  }
  const tol = 1e-13 * total; // relative, at every scale (total > Σ lo ≥ 0 here)
  let level = a + ((b - a) * (total - sumLo)) / (sumHi - sumLo);
  for (let iter = 0; iter < 100; iter++) {
    let s = 0;
    let slope = 0;
    for (let i = 0; i < n; i++) {
      const l = lo[i] as number;
      const h = hi[i] as number;
      if (level <= l) s += l;
      else if (level >= h) s += h;
      else {
        s += level;
        slope++;
      }
    }
    const diff = total - s;
    if (diff <= tol && diff >= -tol) break;
    if (diff > 0) a = level;
    else b = level;
    let next = slope > 0 ? level + diff / slope : (a + b) / 2;
    if (!(next > a && next < b)) next = (a + b) / 2;
    if (next === level || next <= a || next >= b) break;
    level = next;
  }
  return level;
}
