// The round's post-condition checks (coordinator/allocator/postconditions.ts) refuse what would
// break the bound: every property test runs them on every round (an AllocatorInvariantError would
// fail it); these show that they do fail on a violating decision.
import assert from 'node:assert/strict';
import test from 'node:test';
import { AllocatorInvariantError } from '../../../coordinator/allocator/allocator-types.js';
import type { AllocatorQuota } from '../../../coordinator/allocator/allocator-types.js';
import { checkQuotaGrants } from '../../../coordinator/allocator/postconditions.js';
import { F_EMIT_RATE, Scratch } from '../../../coordinator/allocator/round-context.js';

const quota: AllocatorQuota = {
  key: 'tenant/a',
  rate: 100,
  burst: 100,
  floorRate: 10,
  floorBurst: 10,
  ceilingRate: 100,
  ceilingBurst: 100,
  countedRate: 100,
  countedBurst: 100,
  parent: null,
};

/** Two reporting cells with floors 10, counted at `u` each, both sent new rates `rates` (bursts unchanged at 10). */
function decided(u: number, rates: [number, number]): Scratch {
  const sc = new Scratch(2);
  for (let j = 0; j < 2; j++) {
    sc.fl[j] = 10;
    sc.flb[j] = 10;
    sc.u[j] = u;
    sc.ub[j] = 10;
    sc.nr[j] = rates[j] as number;
    sc.nb[j] = 10;
    sc.flags[j] = F_EMIT_RATE;
  }
  return sc;
}

void test('post-conditions: grows within the free capacity pass; one req/s beyond it, a grant under the floor or not finite throws', () => {
  // Σu = 40 of 100: 60 free. One cell shrinks to 10, the other grows from 20 to 80 (+60).
  assert.doesNotThrow(() => checkQuotaGrants(quota, decided(20, [10, 80]), 2, 40, 20));
  assert.throws(() => checkQuotaGrants(quota, decided(20, [10, 81]), 2, 40, 20), AllocatorInvariantError);
  // Over a lowered quota (Σu 120 > 100) nothing may grow at all.
  assert.throws(() => checkQuotaGrants(quota, decided(60, [60, 61]), 2, 120, 20), AllocatorInvariantError);
  assert.doesNotThrow(() => checkQuotaGrants(quota, decided(60, [60, 50]), 2, 120, 20));
  assert.throws(() => checkQuotaGrants(quota, decided(20, [9, 20]), 2, 40, 20), /below the floor/);
  assert.throws(() => checkQuotaGrants(quota, decided(20, [Number.NaN, 20]), 2, 40, 20), AllocatorInvariantError);
});
