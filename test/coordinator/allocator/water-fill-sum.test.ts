// water-fill by either method (the breakpoint walk, Newton steps above 4 intervals): Σ out ≤ total whenever total ≥ Σ lo,
// out[i] within [lo[i], hi[i]], and the Newton level's split equal (within 1e-9 relative) to the walk's.
// (within 1e-12 relative: the running sum the function corrects is itself rounded, a few ulps.)
// (A review found Σ out up to twice a total below 1: the Newton tolerance was absolute there.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { waterFill, WaterFillScratch } from '../../../coordinator/allocator/water-fill.js';

const interval = fc
  .tuple(fc.double({ min: 0, max: 1e6, noNaN: true }), fc.double({ min: 0, max: 1e6, noNaN: true }))
  .map(([a, b]) => (a <= b ? [a, b] : [b, a]));

void test('water-fill: Σ out ≤ total, bounds kept (n 1..40, totals near Σ lo and Σ hi)', () => {
  const scratch = new WaterFillScratch();
  fc.assert(
    fc.property(
      fc.array(interval, { minLength: 1, maxLength: 40 }),
      fc.double({ min: 0, max: 1, noNaN: true }),
      fc.constantFrom(0, 1e-15, 1e-13, 1e-10),
      (iv, t, eps) => {
        const n = iv.length;
        const lo = Float64Array.from(iv.map((x) => x[0]));
        const hi = Float64Array.from(iv.map((x) => x[1]));
        let sumLo = 0;
        let sumHi = 0;
        for (let i = 0; i < n; i++) {
          sumLo += lo[i]!;
          sumHi += hi[i]!;
        }
        const total = t < 0.1 ? sumLo * (1 + eps) + eps : sumLo + (sumHi - sumLo) * t;
        const out = new Float64Array(n);
        const s = waterFill(lo, hi, n, total, out, scratch);
        let sum = 0;
        for (let i = 0; i < n; i++) {
          assert.ok(out[i]! >= lo[i]! && out[i]! <= hi[i]!, `out[${i}] within its bounds`);
          sum += out[i]!;
        }
        if (total >= sumLo)
          assert.ok(sum <= total * (1 + 1e-12), `Σ out ${sum} > total ${total} (n ${n}, returned ${s})`);
      },
    ),
    { numRuns: 20000, seed: 7 },
  );
});
