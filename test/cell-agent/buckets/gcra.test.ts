// GCRA math on a fake clock: exact integer bounds, runtime re-configuration, start policies.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import {
  gcraInitialTat,
  gcraLevel,
  gcraReconfigure,
  gcraStepInto,
  gcraStepNumber,
  gcraTake,
  isBlocked,
  limitFromInterval,
  limitFromRate,
  limitPerUnit,
  MAX_WINDOW_NS,
  NEVER_NS,
  NUMBER_STEP_MAX_NS,
  newGcraNumberScratch,
  newGcraScratch,
  UNIT_NS,
  type GcraLimit,
  type TimeUnit,
} from '../../../cell-agent/buckets/gcra.js';

const S = 1_000_000_000n;

void test('limitPerUnit: T = ceil(unit / requests), burst defaults to one unit, starts full', () => {
  const l = limitPerUnit(5, 'second');
  assert.deepEqual({ ...l }, { intervalNs: 200_000_000n, burst: 5n, windowNs: S, start: 'full' });
  assert.equal(limitPerUnit(3, 'second').intervalNs, 333_333_334n); // rounded up: admits less, never more
  assert.equal(limitPerUnit(60, 'minute').intervalNs, S);
  assert.equal(limitPerUnit(24, 'day').intervalNs, 3600n * S);
  assert.equal(limitPerUnit(1, 'year').intervalNs, 365n * 86_400n * S);
  assert.equal(UNIT_NS.month, 30n * 86_400n * S);
  assert.equal(limitPerUnit(10, 'second', { burst: 2, start: 'empty' }).burst, 2n);
  assert.equal(limitPerUnit(10, 'second', { start: 'empty' }).start, 'empty');
  assert.equal(isBlocked(limitPerUnit(0, 'second')), true);
  assert.equal(isBlocked(limitPerUnit(10, 'second', { burst: 0 })), true);
  assert.throws(() => limitPerUnit(1.5, 'second'), RangeError);
  assert.throws(() => limitPerUnit(-1, 'second'), RangeError);
  assert.throws(() => limitPerUnit(1, 'year', { burst: 3 }), RangeError); // 3 years > MAX_WINDOW_NS
  assert.equal(limitPerUnit(1, 'year', { burst: 2 }).windowNs <= MAX_WINDOW_NS, true);
});

void test('limitFromRate: (rate/s, burst) slices start empty; fractional rates round down', () => {
  const l = limitFromRate(500, 1000);
  assert.deepEqual({ ...l }, { intervalNs: 2_000_000n, burst: 1000n, windowNs: 2n * S, start: 'empty' });
  assert.equal(limitFromRate(0.5, 2).intervalNs, 2n * S);
  assert.equal(limitFromRate(333.3333333, 10).intervalNs, 3_000_001n); // µ-rate floored, T ceiled
  assert.equal(limitFromRate(10, 2.9).burst, 2n);
  assert.equal(limitFromRate(10, 5, { start: 'full' }).start, 'full');
  assert.equal(isBlocked(limitFromRate(0, 100)), true);
  assert.equal(isBlocked(limitFromRate(100, 0.5)), true);
  assert.equal(isBlocked(limitFromRate(1e-7, 100)), true);
  assert.equal(limitFromRate(1e12, 1e9).intervalNs, 1n); // capped at 1e9/s
  assert.throws(() => limitFromRate(Number.NaN, 1), RangeError);
  assert.throws(() => limitFromRate(1, -1), RangeError);
});

void test('empty vs full start: a global slice releases no burst at start, a local rule does', () => {
  const full = limitPerUnit(10, 'second'); // T = 100 ms, b = 10
  const empty = limitFromRate(10, 10);
  const t0 = 5n * S;
  let tat = gcraInitialTat(full, t0);
  let n = 0;
  for (let r = gcraTake(tat, t0, full); r.allowed; r = gcraTake(tat, t0, full)) {
    tat = r.tat;
    n++;
  }
  assert.equal(n, 10);
  tat = gcraInitialTat(empty, t0);
  assert.equal(gcraTake(tat, t0, empty).allowed, false);
  assert.equal(gcraTake(tat, t0, empty, 0).remaining, 0);
  assert.equal(gcraTake(tat, t0 + 99_999_999n, empty).allowed, false);
  assert.equal(gcraTake(tat, t0 + 100_000_000n, empty).allowed, true); // one token after T
  // Empty since an earlier instant (the shared table passes its start): refilled meanwhile.
  assert.equal(gcraInitialTat(empty, t0, t0 - S), t0);
  assert.equal(gcraInitialTat(empty, t0, t0 - S / 2n), t0 + S / 2n);
  assert.equal(gcraInitialTat(empty, t0, t0 + S), t0 + S); // "since" in the future: empty now
});

void test('hits = 0 checks without counting; hits > burst is never allowed; rate 0 is always over', () => {
  const l = limitFromInterval(1000n, 4n);
  const r0 = gcraTake(0n, 0n, l, 0);
  assert.deepEqual(
    { allowed: r0.allowed, tat: r0.tat, remaining: r0.remaining },
    { allowed: true, tat: 0n, remaining: 4 },
  );
  const r1 = gcraTake(0n, 0n, l, 3);
  assert.deepEqual([r1.allowed, r1.remaining, r1.resetNs, r1.tat], [true, 1, 3000n, 3000n]);
  const r2 = gcraTake(r1.tat, 0n, l, 2);
  assert.deepEqual([r2.allowed, r2.remaining, r2.retryAfterNs, r2.tat], [false, 1, 1000n, 3000n]);
  assert.equal(gcraTake(0n, 0n, l, 5).retryAfterNs, NEVER_NS);
  const blocked = limitPerUnit(0, 'second');
  for (const hits of [0, 1, 7]) {
    const b = gcraTake(0n, 123n, blocked, hits);
    assert.deepEqual([b.allowed, b.remaining, b.retryAfterNs], [false, 0, NEVER_NS]);
  }
  assert.throws(() => gcraTake(0n, 0n, l, -1), RangeError);
});

const units: TimeUnit[] = ['second', 'minute', 'hour'];

const limitArb = fc.record({
  requests: fc.integer({ min: 1, max: 5_000 }),
  unit: fc.constantFrom(...units),
  burst: fc.integer({ min: 1, max: 30 }),
  start: fc.constantFrom('full' as const, 'empty' as const),
});

/** Arrivals: gap as a fraction (per mille) of T, so sequences probe every regime of the bucket. */
const arrivalsArb = fc.array(
  fc.record({ gapPermille: fc.integer({ min: 0, max: 3_000 }), hits: fc.integer({ min: 0, max: 35 }) }),
  {
    minLength: 1,
    maxLength: 150,
  },
);

interface Admitted {
  readonly t: bigint;
  readonly hits: bigint;
}

void test('property: over any window of length W at most r·W + b are admitted (integer check)', () => {
  fc.assert(
    fc.property(limitArb, arrivalsArb, fc.bigInt({ min: 0n, max: 10n ** 15n }), (spec, arrivals, t0) => {
      const limit = limitPerUnit(spec.requests, spec.unit, { burst: spec.burst, start: spec.start });
      const unitNs = UNIT_NS[spec.unit];
      const r = BigInt(spec.requests);
      const b = BigInt(spec.burst);
      let now = t0;
      let tat = gcraInitialTat(limit, now);
      const admitted: Admitted[] = [];
      for (const a of arrivals) {
        now += (limit.intervalNs * BigInt(a.gapPermille)) / 1000n;
        const d = gcraTake(tat, now, limit, a.hits);
        if (d.allowed) {
          tat = d.tat;
          if (a.hits > 0) admitted.push({ t: now, hits: BigInt(a.hits) });
        } else {
          assert.equal(d.tat, tat);
        }
      }
      // The busiest window of length W starts and ends at admitted arrivals: check every pair.
      for (let i = 0; i < admitted.length; i++) {
        let sum = 0n;
        const ti = admitted[i]?.t ?? 0n;
        for (let j = i; j < admitted.length; j++) {
          const e = admitted[j];
          if (e === undefined) break;
          sum += e.hits;
          // sum ≤ r·W/unit + b  ⇔  (sum − b)·unit ≤ r·W
          assert.ok((sum - b) * unitNs <= r * (e.t - ti), `window [${ti}, ${e.t}] admitted ${sum}`);
        }
        // An empty start releases no burst: from t0 on, at most r·(t − t0).
        if (spec.start === 'empty') {
          let total = 0n;
          for (let j = 0; j <= i; j++) total += admitted[j]?.hits ?? 0n;
          assert.ok(total * unitNs <= r * (ti - t0), `empty start admitted ${total} by ${ti - t0} ns`);
        }
      }
    }),
    { numRuns: 300 },
  );
});

void test('property: saturating demand is admitted exactly: b + floor(t/T) (full), floor(t/T) (empty)', () => {
  fc.assert(
    fc.property(
      fc.bigInt({ min: 1n, max: 40n }),
      fc.bigInt({ min: 1n, max: 12n }),
      fc.constantFrom('full' as const, 'empty' as const),
      (T, b, start) => {
        const limit = limitFromInterval(T, b, start);
        let tat = gcraInitialTat(limit, 0n);
        let count = 0n;
        for (let t = 0n; t <= 25n * T; t++) {
          for (;;) {
            const d = gcraTake(tat, t, limit, 1);
            if (!d.allowed) break;
            tat = d.tat;
            count++;
          }
          assert.equal(count, (start === 'full' ? b : 0n) + t / T, `t=${t}`);
        }
      },
    ),
    { numRuns: 60 },
  );
});

void test('property: retryAfter is exact and remaining matches what can be taken', () => {
  fc.assert(
    fc.property(
      fc.bigInt({ min: 1n, max: 10_000n }),
      fc.bigInt({ min: 1n, max: 20n }),
      arrivalsArb,
      fc.integer({ min: 1, max: 25 }),
      (T, b, arrivals, want) => {
        const limit = limitFromInterval(T, b);
        let now = 0n;
        let tat = gcraInitialTat(limit, now);
        for (const a of arrivals) {
          now += (T * BigInt(a.gapPermille)) / 1000n;
          const d = gcraTake(tat, now, limit, a.hits);
          if (d.allowed) tat = d.tat;
        }
        const level = gcraLevel(tat, now, limit);
        assert.equal(gcraTake(tat, now, limit, 0).remaining, level);
        assert.equal(gcraTake(tat, now, limit, level).allowed, true);
        const d = gcraTake(tat, now, limit, want);
        if (d.allowed) return;
        if (BigInt(want) > b) {
          assert.equal(d.retryAfterNs, NEVER_NS);
          return;
        }
        assert.equal(gcraTake(tat, now + d.retryAfterNs, limit, want).allowed, true);
        assert.equal(gcraTake(tat, now + d.retryAfterNs - 1n, limit, want).allowed, false);
      },
    ),
    { numRuns: 300 },
  );
});

void test("property: the hot path's step on numbers answers exactly as the bigint step, up to 2^52 ns", () => {
  const MAX = BigInt(NUMBER_STEP_MAX_NS);
  // Limits and debts spread over the whole domain, its edges included (T = 1, D = 2^52, debt = 2^52).
  const edge = (max: bigint): fc.Arbitrary<bigint> =>
    fc.oneof(
      fc.bigInt({ min: 1n, max }),
      fc.bigInt({ min: 1n, max: 1000n }),
      fc.bigInt({ min: max - 1000n > 1n ? max - 1000n : 1n, max }),
    );
  const caseArb = edge(MAX).chain((D) =>
    fc.record({
      D: fc.constant(D),
      T: fc.oneof(fc.constant(1n), fc.constant(D), fc.bigInt({ min: 1n, max: D })),
      debt: fc.oneof(fc.constant(0n), edge(MAX), fc.bigInt({ min: 0n, max: D + 10n })),
      hits: fc.oneof(fc.integer({ min: 0, max: 3 }), fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER })),
    }),
  );
  const big = newGcraScratch();
  const num = newGcraNumberScratch();
  fc.assert(
    fc.property(caseArb, ({ D: window, T: t, debt }) => {
      // Make D an exact multiple of T, as every GcraLimit's D = T·b is.
      const burst = window / t;
      const D = t * burst;
      const debtIn = debt > MAX ? MAX : debt;
      for (const hits of [0, 1, 2, Number(burst), Number(burst) + 1, Number.MAX_SAFE_INTEGER]) {
        const now = 10n ** 12n;
        const b = gcraStepInto(big, now + debtIn, now, t, D, BigInt(hits));
        const n = gcraStepNumber(num, Number(debtIn), Number(t), Number(D), Number(burst), hits);
        assert.equal(n.allowed, b.allowed);
        assert.equal(n.remaining, b.remaining);
        assert.equal(BigInt(n.resetNs), b.resetNs);
        assert.equal(n.retryAfterNs === Infinity ? NEVER_NS : BigInt(n.retryAfterNs), b.retryAfterNs);
        if (b.allowed && hits > 0) assert.equal(now + BigInt(n.nextDebt), b.tat);
      }
    }),
    { numRuns: 2000 },
  );
});

void test('runtime rate change keeps the bucket level (no tokens created or lost)', () => {
  const a = limitFromInterval(100n, 10n); // D = 1000
  let tat = gcraInitialTat(a, 0n);
  tat = gcraTake(tat, 0n, a, 6).tat; // level 4
  assert.equal(gcraLevel(tat, 0n, a), 4);
  const slower = limitFromInterval(1000n, 10n);
  const t2 = gcraReconfigure(tat, 0n, a, slower);
  assert.equal(gcraLevel(t2, 0n, slower), 4); // keeping the raw TAT would have given 9
  assert.equal(gcraLevel(t2, 999n, slower), 4);
  assert.equal(gcraLevel(t2, 1000n, slower), 5); // refills at the new rate
  const faster = limitFromInterval(10n, 10n);
  const t3 = gcraReconfigure(tat, 0n, a, faster);
  assert.equal(gcraLevel(t3, 0n, faster), 4);
  assert.equal(gcraLevel(t3, 10n, faster), 5);
  assert.equal(gcraReconfigure(tat, 0n, a, limitFromInterval(100n, 10n)), tat);
});

void test('a shrunk burst is clamped at once; a grown burst adds no tokens', () => {
  const a = limitFromInterval(100n, 10n);
  const full = gcraInitialTat(a, 0n);
  const small = limitFromInterval(100n, 3n);
  const clamped = gcraReconfigure(full, 0n, a, small);
  assert.equal(gcraLevel(clamped, 0n, small), 3);
  let tat = clamped;
  let n = 0;
  for (let d = gcraTake(tat, 0n, small); d.allowed; d = gcraTake(tat, 0n, small)) {
    tat = d.tat;
    n++;
  }
  assert.equal(n, 3);
  // Level 2 of 10, shrink to 3: stays 2.
  const low = gcraTake(full, 0n, a, 8).tat;
  assert.equal(gcraLevel(gcraReconfigure(low, 0n, a, small), 0n, small), 2);
  // Grow 10 → 20 on a full bucket: still 10 now, 20 only after refilling 10 more tokens.
  const big = limitFromInterval(100n, 20n);
  const grown = gcraReconfigure(full, 0n, a, big);
  assert.equal(gcraLevel(grown, 0n, big), 10);
  assert.equal(gcraLevel(grown, 1000n, big), 20);
});

void test('switching to rate 0 empties the bucket; switching back starts empty', () => {
  const a = limitFromInterval(100n, 10n);
  const zero = limitPerUnit(0, 'second');
  const z = gcraReconfigure(gcraInitialTat(a, 0n), 50n, a, zero);
  assert.equal(gcraTake(z, 50n, zero).allowed, false);
  const back = gcraReconfigure(z, 10_000n, zero, a);
  assert.equal(gcraLevel(back, 10_000n, a), 0);
  assert.equal(gcraLevel(back, 10_100n, a), 1);
});

const paramsArb = fc.record({ T: fc.bigInt({ min: 1n, max: 100_000n }), b: fc.bigInt({ min: 1n, max: 40n }) });

void test('property: re-configuration keeps level min(L, b′), rounding only downwards', () => {
  fc.assert(
    fc.property(
      paramsArb,
      paramsArb,
      fc.integer({ min: 0, max: 1000 }),
      fc.bigInt({ min: 0n, max: 10n ** 12n }),
      (p, q, debtPermille, now) => {
        const from = limitFromInterval(p.T, p.b);
        const to = limitFromInterval(q.T, q.b);
        const tat = now + (from.windowNs * BigInt(debtPermille)) / 1000n;
        const L = gcraLevel(tat, now, from); // floor of the exact level
        const t2 = gcraReconfigure(tat, now, from, to);
        const L2 = gcraLevel(t2, now, to);
        const expect = Math.min(L, Number(q.b));
        assert.ok(L2 <= expect && L2 >= expect - 1, `L=${L} b'=${q.b} → ${L2}`);
        assert.equal(t2 - now <= to.windowNs, true);
      },
    ),
    { numRuns: 500 },
  );
});

void test('property: with limits changing at runtime, any window admits ≤ max burst + Σ refill of each limit', () => {
  const eventArb = fc.record({
    gapPermille: fc.integer({ min: 0, max: 2_000 }),
    hits: fc.integer({ min: 1, max: 12 }),
    change: fc.option(fc.integer({ min: 0, max: 2 }), { freq: 8 }),
  });
  fc.assert(
    fc.property(
      fc.array(paramsArb, { minLength: 3, maxLength: 3 }),
      fc.array(eventArb, { minLength: 1, maxLength: 120 }),
      (ps, events) => {
        const limits: GcraLimit[] = ps.map((p) => limitFromInterval(p.T, p.b));
        const first = limits[0];
        if (first === undefined) return;
        const bMax = ps.reduce((m, p) => (p.b > m ? p.b : m), 0n);
        const P = ps.reduce((m, p) => m * p.T, 1n); // common denominator of the refill rates
        let limit = first;
        let now = 0n;
        let tat = gcraInitialTat(limit, now);
        const segments: { start: bigint; T: bigint }[] = [{ start: 0n, T: limit.intervalNs }];
        const admitted: Admitted[] = [];
        for (const e of events) {
          now += (limit.intervalNs * BigInt(e.gapPermille)) / 1000n;
          if (e.change !== null) {
            const next = limits[e.change] ?? limit;
            tat = gcraReconfigure(tat, now, limit, next);
            limit = next;
            segments.push({ start: now, T: limit.intervalNs });
          }
          const d = gcraTake(tat, now, limit, e.hits);
          if (d.allowed) {
            tat = d.tat;
            admitted.push({ t: now, hits: BigInt(e.hits) });
          }
        }
        /** P × (tokens refilled in [a, z]) = Σ overlap_k · P / T_k. */
        const refillTimesP = (a: bigint, z: bigint): bigint => {
          let acc = 0n;
          segments.forEach((seg, k) => {
            const end = segments[k + 1]?.start ?? z;
            const lo = seg.start > a ? seg.start : a;
            const hi = end < z ? end : z;
            if (hi > lo) acc += (hi - lo) * (P / seg.T);
          });
          return acc;
        };
        for (let i = 0; i < admitted.length; i++) {
          let sum = 0n;
          const ti = admitted[i]?.t ?? 0n;
          for (let j = i; j < admitted.length; j++) {
            const e = admitted[j];
            if (e === undefined) break;
            sum += e.hits;
            assert.ok((sum - bMax) * P <= refillTimesP(ti, e.t), `window [${ti}, ${e.t}] admitted ${sum}`);
          }
        }
      },
    ),
    { numRuns: 200 },
  );
});
