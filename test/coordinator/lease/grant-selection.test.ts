// The lease round's grant selection (coordinator/lease/grant-selection.ts) read from the allocator's
// grant columns: within the budget it sends exactly the grants a plain reading would — every grant
// rounded to float32 towards the current one, those left unchanged dropped, the rest ranked by
// grantPriority (ties to the earlier grant) and cut at the budget — and it reports each deferred
// quota once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { GrantColumns, roundTowards } from '../../../coordinator/allocator/index.js';
import type { AllocatorInput, AllocatorQuota } from '../../../coordinator/allocator/index.js';
import { grantPriority, selectGrants } from '../../../coordinator/lease/grant-selection.js';
import type { Grant } from '../../../coordinator/ledger/ledger-commands.js';

const N = 3;

function world(quotas: number, current: number[]): AllocatorInput {
  const size = quotas * N;
  const qs: AllocatorQuota[] = Array.from({ length: quotas }, (_, q) => ({
    key: q === 0 ? 'tier/gold' : `tenant/t${q}`,
    rate: 100,
    burst: 100,
    floorRate: 5,
    floorBurst: 5,
    ceilingRate: 100,
    ceilingBurst: 100,
    countedRate: 0,
    countedBurst: 0,
    parent: null,
  }));
  const grantRate = Float64Array.from({ length: size }, (_, i) => current[i % current.length] as number);
  return {
    nowMs: 1000,
    leaseTtlMs: 3000,
    skewMarginMs: 100,
    cells: Array.from({ length: N }, (_, c) => ({
      id: `c${c}`,
      hasFloor: c !== 2,
      reported: true,
      leaseExpiresAtMs: 5000,
    })),
    quotas: qs,
    slices: {
      grantRate,
      grantBurst: grantRate.slice(),
      epoch: Float64Array.from({ length: size }, (_, i) => i % 4),
      acknowledged: new Uint8Array(size).fill(1),
      countedRate: new Float64Array(size),
      countedBurst: new Float64Array(size),
      demand: Float64Array.from({ length: size }, (_, i) => (current[(i * 7) % current.length] as number) * 1.5),
    },
  };
}

/** The reference: objects for every grant, a comparator sort, the first `max`, in the round's order. */
function reference(input: AllocatorInput, cols: GrantColumns, max: number): Grant[] {
  const kept: { g: Grant; i: number; at: number }[] = [];
  for (let g = 0; g < cols.count; g++) {
    const q = cols.row[g] as number;
    const c = cols.cell[g] as number;
    const i = q * N + c;
    const cur = input.slices.grantRate[i] as number;
    const curB = input.slices.grantBurst[i] as number;
    const rate = roundTowards(cols.rate[g] as number, cur);
    const burst = roundTowards(cols.burst[g] as number, curB);
    if ((input.slices.epoch[i] as number) > 0 && rate === cur && burst === curB) continue;
    kept.push({ g: cols.grant(input, g, rate, burst), i, at: kept.length });
  }
  const score = (x: (typeof kept)[number]): number => {
    const q = input.quotas[Math.floor(x.i / N)] as AllocatorQuota;
    const floor = input.cells[x.i % N]?.hasFloor === true ? q.floorRate : 0;
    return grantPriority(x.g, q.rate, input.slices.grantRate[x.i] as number, floor, input.slices.demand[x.i] as number);
  };
  return kept
    .map((x) => ({ ...x, p: score(x) }))
    .sort((a, b) => b.p - a.p || a.at - b.at)
    .slice(0, max)
    .sort((a, b) => a.at - b.at)
    .map((x) => x.g);
}

void test('the grants sent from the columns are the plain reading: float32, unchanged dropped, by priority within the budget', () => {
  const level = fc.constantFrom(0, 5, 10, 10.000001, 50, 99.5);
  fc.assert(
    fc.property(
      fc.integer({ min: 1, max: 8 }),
      fc.array(level, { minLength: 1, maxLength: 24 }),
      fc.array(fc.record({ q: fc.nat(), c: fc.nat({ max: N - 1 }), rate: level, burst: level }), { maxLength: 40 }),
      fc.integer({ min: 1, max: 50 }),
      (quotas, current, pushes, max) => {
        const input = world(quotas, current);
        const cols = new GrantColumns();
        cols.reset(4000);
        const seen = new Set<number>();
        for (const p of pushes) {
          const i = (p.q % quotas) * N + p.c;
          if (seen.has(i)) continue; // one grant per slice, as the allocator makes them
          seen.add(i);
          cols.push(p.q % quotas, p.c, p.rate, p.burst);
        }
        const got = selectGrants(input, cols, max, true);
        const want = reference(input, cols, max);
        assert.deepEqual(got.grants, want);
        const all = reference(input, cols, Infinity);
        assert.equal(got.deferred, all.length - want.length);
        const sent = new Set(want.map((g) => `${g.key}|${g.cellId}`));
        const deferredKeys = [
          ...new Set(all.filter((g) => !sent.has(`${g.key}|${g.cellId}`)).map((g) => g.key)),
        ].sort();
        assert.deepEqual(got.deferredRows.map((q) => (input.quotas[q] as AllocatorQuota).key).sort(), deferredKeys);
      },
    ),
    { numRuns: 300 },
  );
});
