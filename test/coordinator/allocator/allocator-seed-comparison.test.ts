// The worked example of coordinator/allocator/README.md, computed: the seed design's borrowing rule
// (a cell above 75% of its slice borrows from a cell below 20%) against this allocator, on one quota
// of 600 req/s over three cells that start on even slices of 200. The numbers asserted here are the
// ones the README quotes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AllocSim } from './alloc-harness.js';

/**
 * The seed rule, as literally as it is stated: every 500 ms, a cell whose admitted rate is above 75%
 * of its slice borrows from a cell below 20%; the seed does not say how much moves, so this takes
 * half of the lender's unused slice per round (moving all of it would leave the lender no room at
 * all). Returns the slices after each round.
 */
function seedRule(demand: number[], slices: number[], rounds: number): number[][] {
  const out: number[][] = [];
  const s = slices.slice();
  for (let r = 0; r < rounds; r++) {
    const util = s.map((v, i) => Math.min(demand[i] ?? 0, v) / v);
    for (let b = 0; b < s.length; b++) {
      if ((util[b] ?? 0) <= 0.75) continue;
      const lender = util.findIndex((u) => u < 0.2);
      if (lender < 0) continue;
      const unused = (s[lender] ?? 0) - Math.min(demand[lender] ?? 0, s[lender] ?? 0);
      const moved = unused / 2;
      s[lender] = (s[lender] ?? 0) - moved;
      s[b] = (s[b] ?? 0) + moved;
      util[lender] = Math.min(demand[lender] ?? 0, s[lender] ?? 0) / (s[lender] ?? 1);
    }
    out.push(s.slice());
  }
  return out;
}

/** The allocator against a ledger, from the same start (grants of 200 each), floors 30% (60 each). */
function ours(demand: number[], rounds: number): number[][] {
  const cells = ['a', 'b', 'c'];
  const sim = new AllocSim({
    floorCells: 3,
    skewMarginMs: 1000,
    leaseTtlMs: 3000,
    cells,
    setup: [
      { type: 'putTier', name: 'gold', rate: 600, burst: 600, floorFraction: 0.3 },
      { type: 'putTenant', id: 't', tier: 'gold' },
    ],
    quotas: [{ key: 'tenant/t', parent: null }],
  });
  sim.ok({
    type: 'reportAndGrant',
    nowMs: sim.nowMs,
    leases: cells.map((cellId) => ({ cellId, leaseExpiresAtMs: sim.nowMs + 3000 })),
    grants: cells.map((cellId) => ({
      key: 'tenant/t',
      cellId,
      rate: 200,
      burst: 200,
      epoch: 1,
      leaseExpiresAtMs: sim.nowMs + 3000,
    })),
  });
  for (const c of cells)
    sim.ok({ type: 'reportAndGrant', nowMs: sim.nowMs, acks: [{ key: 'tenant/t', cellId: c, epoch: 1 }] });
  const out: number[][] = [];
  for (let r = 0; r < rounds; r++) {
    sim.round({ demand: (_k, c) => demand[cells.indexOf(c)] ?? 0 });
    out.push(cells.map((c) => sim.level('tenant/t', c)));
  }
  return out;
}

const admitted = (slices: number[], demand: number[]): number =>
  slices.reduce((s, v, i) => s + Math.min(v, demand[i] ?? 0), 0);

void test('seed example 1: nobody is below 20%, so the seed rule never moves anything; max-min fairness does in two rounds', () => {
  const demand = [450, 100, 50];
  const seed = seedRule(demand, [200, 200, 200], 4);
  assert.deepEqual(seed.at(-1), [200, 200, 200]);
  assert.equal(admitted(seed.at(-1) ?? [], demand), 350);
  const alloc = ours(demand, 4);
  // Round 1: b and c shrink (their capacity is not free until they acknowledge); round 2: a grows.
  assert.deepEqual(alloc[0], [200, 100, 60]);
  assert.deepEqual(alloc[1], [440, 100, 60]);
  assert.deepEqual(alloc[3], [440, 100, 60], 'and stays');
  assert.equal(admitted(alloc[1] ?? [], demand), 590);
});

void test('seed example 2: the seed rule borrows once, then the lender is above 20% and the starved cell stays short', () => {
  const demand = [450, 100, 30];
  const seed = seedRule(demand, [200, 200, 200], 4);
  assert.deepEqual(seed[0], [285, 200, 115]);
  assert.deepEqual(seed.at(-1), [285, 200, 115], 'c is at 26% of its slice: no more borrowing');
  assert.equal(admitted(seed.at(-1) ?? [], demand), 415);
  const alloc = ours(demand, 4);
  assert.deepEqual(alloc[1], [440, 100, 60]);
  assert.equal(admitted(alloc[1] ?? [], demand), 570);
});
