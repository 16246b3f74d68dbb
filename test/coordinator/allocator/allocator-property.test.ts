// Properties of the allocator on its own and in rounds against a real ledger:
// - water-filling agrees with an independent bisection;
// - on arbitrary slice states (not only those a ledger run reaches), what the ledger would count
//   after the round never exceeds the quota (or, over a lowered quota, never rises), every grant is
//   at least the floor, only reporting cells get grants, epochs step by one, and the output is
//   deterministic and leaves the input untouched;
// - convergence: with steady demands the grants stop changing after a few rounds;
// - max-min fairness once converged: no cell is held below min(demand, fair share) while another sits
//   above its fair share;
// - a cell whose demand moves gets ≥ 90% of min(its demand, its fair share) within 4 rounds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { allocateRound, allocateRoundWith, DEFAULT_TUNING } from '../../../coordinator/allocator/allocator.js';
import type { AllocatorCell, AllocatorInput, AllocatorQuota } from '../../../coordinator/allocator/allocator.js';
import { waterFill, WaterFillScratch } from '../../../coordinator/allocator/water-fill.js';
import { AllocSim, firstDifference, referenceMaxMin } from './alloc-harness.js';

// ---- water-filling ------------------------------------------------------------------------------

void test('waterFill: the max-min fair split with floors, as an independent bisection finds it (both methods: n ≤ 4 and larger)', () => {
  const scratch = new WaterFillScratch();
  fc.assert(
    fc.property(
      fc.oneof(
        fc.array(
          fc.tuple(fc.double({ min: 0, max: 1000, noNaN: true }), fc.double({ min: 0, max: 1000, noNaN: true })),
          { minLength: 1, maxLength: 80 },
        ),
        fc.array(fc.tuple(fc.constantFrom(0, 0, 1, 5), fc.double({ min: 0, max: 1000, noNaN: true })), {
          minLength: 65,
          maxLength: 600,
        }),
      ),
      fc.double({ min: 0, max: 1, noNaN: true }),
      (pairs, frac) => {
        const lo = pairs.map(([a, b]) => Math.min(a, b));
        const hi = pairs.map(([a, b]) => Math.max(a, b));
        const sLo = lo.reduce((s, v) => s + v, 0);
        const sHi = hi.reduce((s, v) => s + v, 0);
        const total = sLo + frac * (sHi - sLo);
        const out = new Float64Array(lo.length);
        const sum = waterFill(Float64Array.from(lo), Float64Array.from(hi), lo.length, total, out, scratch);
        const ref = referenceMaxMin(lo, hi, total);
        const tol = 1e-9 * Math.max(1, sHi);
        assert.equal(sum <= total + tol, true, `sum ${sum} over ${total}`);
        assert.equal(Math.abs(sum - total) <= 1e-7 * Math.max(1, sHi), true, `sum ${sum} != ${total}`);
        for (let i = 0; i < lo.length; i++) {
          const v = out[i] as number;
          assert.equal(
            v >= (lo[i] as number) - tol && v <= (hi[i] as number) + tol,
            true,
            `share ${i} = ${v} outside [${lo[i]}, ${hi[i]}]`,
          );
          assert.equal(
            Math.abs(v - (ref[i] as number)) <= 1e-6 * Math.max(1, sHi),
            true,
            `share ${i}: ${v} vs reference ${ref[i]}`,
          );
        }
      },
    ),
    { numRuns: 250 },
  );
});

// ---- arbitrary slice states ---------------------------------------------------------------------

interface RawSlice {
  grant: number;
  grantB: number;
  extra: number;
  extraB: number;
  acked: boolean;
  demand: number;
  epoch: number;
}
interface RawQuota {
  rate: number;
  burstRatio: number;
  ff: number;
  slices: RawSlice[];
  transition: boolean;
}

const rawSlice = fc.record({
  grant: fc.oneof(fc.constant(0), fc.double({ min: 0.001, max: 1, noNaN: true })),
  grantB: fc.oneof(fc.constant(0), fc.double({ min: 0.001, max: 1, noNaN: true })),
  extra: fc.constantFrom(0, 0, 0.1, 0.5),
  extraB: fc.constantFrom(0, 0, 0.2),
  acked: fc.boolean(),
  demand: fc.oneof(fc.constant(0), fc.double({ min: 0, max: 1.5, noNaN: true })),
  epoch: fc.integer({ min: 0, max: 50 }),
});

const rawInput = fc.record({
  n: fc.integer({ min: 1, max: 8 }),
  floorCells: fc.integer({ min: 1, max: 8 }),
  reported: fc.array(fc.boolean(), { minLength: 8, maxLength: 8 }),
  expired: fc.array(fc.constantFrom(false, false, false, true), { minLength: 8, maxLength: 8 }),
  quotas: fc.array(
    fc.record({
      rate: fc.double({ min: 0.5, max: 1e6, noNaN: true }),
      burstRatio: fc.double({ min: 0.1, max: 4, noNaN: true }),
      ff: fc.constantFrom(0, 0.2, 0.5, 1),
      slices: fc.array(rawSlice, { minLength: 8, maxLength: 8 }),
      transition: fc.constantFrom(false, false, false, true),
    }),
    { minLength: 1, maxLength: 4 },
  ),
  nested: fc.boolean(),
});

/**
 * A state the ledger could hold: grants scaled so that Σ counted fits the quota (or, in a
 * transition after the quota was lowered, exceeds it by up to 30%); a cell is counted at
 * max(floor, its grant, an older larger grant it has not acknowledged yet).
 */
function rawInputValue(v: {
  n: number;
  floorCells: number;
  reported: boolean[];
  expired: boolean[];
  quotas: RawQuota[];
  nested: boolean;
}): AllocatorInput {
  const n = v.n;
  const cells: AllocatorCell[] = Array.from({ length: n }, (_, c) => ({
    id: `c${c}`,
    hasFloor: c < v.floorCells,
    reported: v.reported[c] ?? true,
    // An expired lease: the round's first step in the ledger releases it.
    leaseExpiresAtMs: v.expired[c] === true ? 1_000 : 10_000,
  }));
  const nq = v.quotas.length;
  const cols = {
    grantRate: new Float64Array(nq * n),
    grantBurst: new Float64Array(nq * n),
    epoch: new Float64Array(nq * n),
    acknowledged: new Uint8Array(nq * n),
    countedRate: new Float64Array(nq * n),
    countedBurst: new Float64Array(nq * n),
    demand: new Float64Array(nq * n),
  };
  const quotas: AllocatorQuota[] = v.quotas.map((q, qi) => {
    const R = q.rate;
    const B = Math.max(1, R * q.burstRatio);
    const fr = (q.ff * R) / v.floorCells;
    const fb = (q.ff * B) / v.floorCells;
    const unregistered = Math.max(0, v.floorCells - n);
    const slices = q.slices.slice(0, n);
    const heldR = slices.map((s) => s.grant * (1 + (s.acked ? 0 : s.extra)));
    const heldB = slices.map((s) => s.grantB * (1 + (s.acked ? 0 : s.extraB)));
    const sr = heldR.reduce((a, b) => a + b, 0);
    const sb = heldB.reduce((a, b) => a + b, 0);
    const room = q.transition ? R * 1.3 : R * (1 - q.ff);
    const roomB = q.transition ? B * 1.3 : B * (1 - q.ff);
    const kR = sr > 0 ? room / sr : 0;
    const kB = sb > 0 ? roomB / sb : 0;
    let tr = unregistered * fr;
    let tb = unregistered * fb;
    slices.forEach((s, c) => {
      const i = qi * n + c;
      const f = c < v.floorCells ? fr : 0;
      const f2 = c < v.floorCells ? fb : 0;
      cols.grantRate[i] = s.grant * kR;
      cols.grantBurst[i] = s.grantB * kB;
      cols.epoch[i] = s.epoch;
      cols.acknowledged[i] = s.acked ? 1 : 0;
      cols.countedRate[i] = Math.max(f, (heldR[c] as number) * kR);
      cols.countedBurst[i] = Math.max(f2, (heldB[c] as number) * kB);
      cols.demand[i] = s.demand * R;
      tr += cols.countedRate[i];
      tb += cols.countedBurst[i];
    });
    return {
      key: `tenant/q${qi}`,
      rate: R,
      burst: B,
      floorRate: fr,
      floorBurst: fb,
      ceilingRate: Math.max(R, tr),
      ceilingBurst: Math.max(B, tb),
      countedRate: tr,
      countedBurst: tb,
      parent: v.nested && qi > 0 ? 'tenant/q0' : null,
    };
  });
  return { nowMs: 5_000, leaseTtlMs: 3_000, skewMarginMs: 1_000, cells, quotas, slices: cols };
}

void test('on arbitrary states the round keeps the ledger bound, floors, epochs, and is deterministic', () => {
  fc.assert(
    fc.property(rawInput, (raw) => {
      const input = rawInputValue(raw);
      const before = JSON.stringify({
        ...input,
        slices: Object.fromEntries(
          Object.entries(input.slices).map(([k, a]) => [k, Array.from(a as ArrayLike<number>)]),
        ),
      });
      const out = allocateRound(input);
      const again = allocateRound(input);
      assert.deepEqual(again, out, 'same input, same output');
      const diff = firstDifference(allocateRoundWith(input, { fastPath: false, localDecisions: false }), out, '');
      assert.equal(
        diff,
        null,
        `the shortcuts (one-pass common case, local decisions) and the staged general path agree (to rounding): ${diff ?? ''}`,
      );
      const after = JSON.stringify({
        ...input,
        slices: Object.fromEntries(
          Object.entries(input.slices).map(([k, a]) => [k, Array.from(a as ArrayLike<number>)]),
        ),
      });
      assert.equal(after, before, 'the input is not modified');
      const n = input.cells.length;
      input.quotas.forEach((q, qi) => {
        // The ledger's check, mirrored: the entry first releases every lease that surely expired (those
        // cells fall to their floors), then each grant x raises its cell's u to max(u, x); the round is
        // accepted if Σu ≤ the quota, or (over a lowered quota) if Σu did not rise.
        const uR: number[] = [];
        const uB: number[] = [];
        let reserved = q.countedRate;
        let reservedB = q.countedBurst;
        input.cells.forEach((cell, c) => {
          const i = qi * n + c;
          const released = cell.leaseExpiresAtMs !== null && input.nowMs >= cell.leaseExpiresAtMs + input.skewMarginMs;
          reserved -= input.slices.countedRate[i] as number;
          reservedB -= input.slices.countedBurst[i] as number;
          uR.push(released ? (cell.hasFloor ? q.floorRate : 0) : (input.slices.countedRate[i] as number));
          uB.push(released ? (cell.hasFloor ? q.floorBurst : 0) : (input.slices.countedBurst[i] as number));
        });
        const sum = (a: number[]): number => a.reduce((x, y) => x + y, 0);
        const beforeR = reserved + sum(uR);
        const beforeB = reservedB + sum(uB);
        for (const g of out.grants.filter((x) => x.key === q.key)) {
          const c = input.cells.findIndex((x) => x.id === g.cellId);
          const cell = input.cells[c] as AllocatorCell;
          const i = qi * n + c;
          assert.equal(cell.reported, true, `grant to ${g.cellId}, which did not report`);
          assert.equal(g.epoch, (input.slices.epoch[i] as number) + 1);
          assert.equal(g.leaseExpiresAtMs, input.nowMs + input.leaseTtlMs);
          const fr = cell.hasFloor ? q.floorRate : 0;
          const fb = cell.hasFloor ? q.floorBurst : 0;
          assert.equal(
            g.rate >= fr - 1e-9 && g.burst >= fb - 1e-9,
            true,
            `grant ${g.rate}/${g.burst} below floor ${fr}/${fb}`,
          );
          uR[c] = Math.max(uR[c] as number, g.rate);
          uB[c] = Math.max(uB[c] as number, g.burst);
        }
        const afterR = reserved + sum(uR);
        const afterB = reservedB + sum(uB);
        const tol = 1 + 1e-9;
        assert.equal(
          afterR <= q.rate * tol || afterR <= beforeR * tol,
          true,
          `${q.key}: counted rate ${afterR} after the round, limit ${q.rate}, before ${beforeR}`,
        );
        assert.equal(
          afterB <= q.burst * tol || afterB <= beforeB * tol,
          true,
          `${q.key}: counted burst ${afterB} after the round, limit ${q.burst}, before ${beforeB}`,
        );
      });
    }),
    { numRuns: 500 },
  );
});

// ---- rounds against a ledger --------------------------------------------------------------------

const MAX_SIM_CELLS = 10;
/** A demand as a fraction of the quota: idle, small, around a fair share, or over the whole quota. */
const demandFrac = fc.oneof(
  fc.constant(0),
  fc.double({ min: 0, max: 0.05, noNaN: true }),
  fc.double({ min: 0, max: 0.4, noNaN: true }),
  fc.double({ min: 0, max: 1.5, noNaN: true }),
);
const steadyWorld = fc.record({
  cells: fc.integer({ min: 2, max: MAX_SIM_CELLS }),
  floorCells: fc.integer({ min: 1, max: MAX_SIM_CELLS }),
  rate: fc.integer({ min: 10, max: 20_000 }),
  ff: fc.constantFrom(0, 0.1, 0.3),
  demands: fc.array(demandFrac, { minLength: MAX_SIM_CELLS, maxLength: MAX_SIM_CELLS }),
  /** New demand of a cell: a fresh fraction of the quota, or its old demand scaled by `scale`. */
  moves: fc.array(
    fc.record({
      cell: fc.nat(),
      frac: fc.option(demandFrac, { nil: null }),
      scale: fc.double({ min: 0.5, max: 2, noNaN: true }),
    }),
    { minLength: 1, maxLength: 3 },
  ),
  sameRoundAcks: fc.boolean(),
  lateDelivery: fc.boolean(),
});
type SteadyWorld = typeof steadyWorld extends fc.Arbitrary<infer T> ? T : never;

function makeSim(w: SteadyWorld): { sim: AllocSim; cells: string[] } {
  const cells = Array.from({ length: w.cells }, (_, i) => `c${i}`);
  const sim = new AllocSim({
    floorCells: w.floorCells,
    skewMarginMs: 1000,
    leaseTtlMs: 3000,
    cells,
    setup: [
      { type: 'putTier', name: 'gold', rate: w.rate, burst: w.rate, floorFraction: w.ff },
      { type: 'putTenant', id: 't', tier: 'gold' },
    ],
    quotas: [{ key: 'tenant/t', parent: null }],
  });
  return { sim, cells };
}

/** Rounds until a round emits nothing and the next two do not either; returns the count before the quiet. */
function settle(sim: AllocSim, demand: (c: string) => number, w: SteadyWorld, maxRounds: number): number {
  let quiet = 0;
  for (let r = 1; r <= maxRounds; r++) {
    const res = sim.round({
      demand: (_k, c) => demand(c),
      sameRoundAcks: w.sameRoundAcks,
      lateDelivery: w.lateDelivery,
    });
    quiet = res.grants.length === 0 ? quiet + 1 : 0;
    if (quiet === 3) return r - 3;
  }
  return Infinity;
}

function fairShares(sim: AllocSim, cells: string[], demand: (c: string) => number): number[] {
  const st = sim.state('tenant/t');
  const lo = st.cells.map((v) => (v.slot === null ? 0 : st.floorRate));
  const hi = cells.map((c) => Math.min(st.rate, demand(c)));
  return referenceMaxMin(lo, hi, st.rate - st.unregisteredSlots * st.floorRate);
}

void test('convergence: with steady demands the grants stop changing within 4 rounds, also after demands move', () => {
  fc.assert(
    fc.property(steadyWorld, (w) => {
      const { sim, cells } = makeSim(w);
      const dem = cells.map((_, i) => (w.demands[i] ?? 0) * w.rate);
      const d = (c: string): number => dem[Number(c.slice(1))] ?? 0;
      const first = settle(sim, d, w, 20);
      assert.equal(first <= 4, true, `from the floors: still changing after ${first} rounds`);
      for (const m of w.moves) {
        const i = m.cell % cells.length;
        dem[i] = m.frac === null ? Math.min(w.rate, (dem[i] ?? 0) * m.scale) : m.frac * w.rate;
      }
      // Shrink before grow: a move may take a shrink, its acknowledgement (up to two rounds late with
      // late delivery and no same-round accounting), then the grow.
      const again = settle(sim, d, w, 20);
      assert.equal(again <= 4, true, `after the demands moved: still changing after ${again} rounds`);
    }),
    { numRuns: 250 },
  );
});

void test('max-min fairness once converged: nobody below min(demand, fair share) while another holds more than its share', () => {
  fc.assert(
    fc.property(steadyWorld, (w) => {
      const { sim, cells } = makeSim(w);
      const d = (c: string): number => (w.demands[Number(c.slice(1))] ?? 0) * w.rate;
      settle(sim, d, w, 20);
      const fair = fairShares(sim, cells, d);
      const st = sim.state('tenant/t');
      const levels = cells.map((c) => sim.level('tenant/t', c));
      const thr = Math.max(DEFAULT_TUNING.hysteresisMinRate, DEFAULT_TUNING.hysteresisFraction * w.rate);
      // Changes below the smallest step are never sent: a cell may miss its share by that much.
      const eps = 1e-9 * w.rate + Math.max(DEFAULT_TUNING.minStepRate, DEFAULT_TUNING.minStepFraction * w.rate);
      const short = cells.some((c, i) => (levels[i] as number) < (1 - DEFAULT_TUNING.starveTolerance) * d(c) - eps);
      cells.forEach((c, i) => {
        const lvl = levels[i] as number;
        const want = Math.min(d(c), fair[i] as number);
        assert.equal(
          lvl >= (1 - DEFAULT_TUNING.starveTolerance) * want - eps,
          true,
          `${c}: level ${lvl} below 95% of min(demand ${d(c)}, fair ${fair[i]})`,
        );
        if (short) {
          const floor = st.cells[i]?.slot === null ? 0 : st.floorRate;
          assert.equal(
            lvl <= Math.max(floor, fair[i] as number) + thr + eps,
            true,
            `${c}: level ${lvl} above its fair share ${fair[i]} (+ hysteresis ${thr}) while another cell is short`,
          );
        }
      });
    }),
    { numRuns: 250 },
  );
});

void test('a cell whose demand moves gets ≥ 90% of min(demand, fair share) within 4 rounds of 500 ms', () => {
  fc.assert(
    fc.property(steadyWorld, (w) => {
      const { sim, cells } = makeSim(w);
      const dem = cells.map((_, i) => (w.demands[i] ?? 0) * w.rate);
      const d = (c: string): number => dem[Number(c.slice(1))] ?? 0;
      settle(sim, d, w, 20);
      const moved = new Set<number>();
      for (const m of w.moves) {
        const i = m.cell % cells.length;
        dem[i] = m.frac === null ? Math.min(w.rate, (dem[i] ?? 0) * m.scale) : m.frac * w.rate;
        moved.add(i);
      }
      const fair = fairShares(sim, cells, d);
      const step = 1e-9 * w.rate + Math.max(DEFAULT_TUNING.minStepRate, DEFAULT_TUNING.minStepFraction * w.rate);
      let ok = false;
      let detail = '';
      for (let r = 1; r <= 4 && !ok; r++) {
        sim.round({ demand: (_k, c) => d(c), sameRoundAcks: w.sameRoundAcks, lateDelivery: w.lateDelivery });
        ok = [...moved].every((i) => {
          const c = cells[i] as string;
          return sim.level('tenant/t', c) >= 0.9 * Math.min(d(c), fair[i] as number) - step;
        });
        detail = [...moved]
          .map(
            (i) =>
              `${cells[i]}: level ${sim.level('tenant/t', cells[i] as string)}, demand ${d(cells[i] as string)}, fair ${fair[i]}`,
          )
          .join('; ');
      }
      assert.equal(ok, true, `after 4 rounds: ${detail}`);
    }),
    { numRuns: 250 },
  );
});
