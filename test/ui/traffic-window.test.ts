// The overshoot reconstruction (coordinator/api/traffic-window.ts), pure: reports in, windows and
// ratios out, on a simulated clock. Steady load gives the exact ratio; load over the bound is
// counted; jittered, overlapping reports never count the same admission twice; the history holds
// each cell's admitted rate against its slice.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { TrafficWindows, SETTLE_MS, HISTORY_POINTS, type QuotaLookup } from '../../coordinator/api/traffic-window.js';

const lookup = (rate: number, burst: number, limits: Record<string, number> = {}): QuotaLookup => ({
  quota: (key) => (key === 'tenant/a' ? { rate, burst } : undefined),
  cellLimit: (_key, cell) => limits[cell] ?? 0,
});

/** Each cell reports every `everyMs` (plus its jitter) the rate it admitted over the last 500 ms. */
function run(
  w: TrafficWindows,
  rates: Record<string, number>,
  untilMs: number,
  look: QuotaLookup,
  jitter: (cell: string, i: number) => number = () => 0,
  everyMs = 500,
): void {
  const t0 = 1_000_000;
  const events: { at: number; cell: string }[] = [];
  for (const cell of Object.keys(rates))
    for (let i = 1; t0 + i * everyMs < t0 + untilMs; i++) events.push({ at: t0 + i * everyMs + jitter(cell, i), cell });
  events.sort((a, b) => a.at - b.at);
  for (const e of events) {
    w.record(e.cell, e.at, [{ key: 'tenant/a', allowedPerS: rates[e.cell] ?? 0, refusedPerS: 5 }]);
    w.settle(e.at, look);
  }
  w.settle(t0 + untilMs + SETTLE_MS + 1000, look);
}

void test('steady load on two cells: the ratio is admitted ÷ (rate·1 s + burst), no window over the bound', () => {
  const w = new TrafficWindows();
  const look = lookup(100, 50, { east: 70, west: 30 });
  run(w, { east: 70, west: 30 }, 10_000, look);
  const t = w.traffic('tenant/a', 1_000_000 + 10_000);
  assert.ok(t !== null);
  assert.ok(Math.abs(t.peakRatio - 100 / 150) < 1e-3, `peak ${t.peakRatio} = 100/150`);
  assert.ok(t.windows > 50, `windows checked: ${t.windows}`);
  assert.equal(t.windowsOver, 0);
  assert.equal(w.totals().windowsOver, 0);
  assert.equal(t.admittedPerS, 100);
  assert.equal(t.refusedPerS, 10);
});

void test('cells admitting twice the bound: every full window is counted over it', () => {
  const w = new TrafficWindows();
  run(w, { east: 200, west: 100 }, 6_000, lookup(100, 50));
  const t = w.traffic('tenant/a', 1_006_000);
  assert.ok(t !== null);
  assert.ok(t.peakRatio > 1.9, `peak ${t.peakRatio}`);
  assert.ok(t.windowsOver > 30, `windows over: ${t.windowsOver}`);
  assert.equal(w.totals().windowsOver, t.windowsOver);
});

void test('jittered and overlapping reports never count an admission twice (property)', () => {
  fc.assert(
    fc.property(
      fc.record({ east: fc.integer({ min: 0, max: 300 }), west: fc.integer({ min: 0, max: 300 }) }),
      fc.array(fc.integer({ min: -200, max: 200 }), { minLength: 40, maxLength: 40 }),
      fc.integer({ min: 300, max: 700 }),
      (rates, jitters, everyMs) => {
        const w = new TrafficWindows();
        // A bound exactly the true admitted count per 1 s window: the ratio must never pass 1.
        const truth = rates.east + rates.west;
        run(
          w,
          rates,
          8_000,
          lookup(Math.max(1, truth), 0),
          (cell, i) => jitters[(i * (cell === 'east' ? 1 : 7)) % jitters.length] ?? 0,
          everyMs,
        );
        const t = w.traffic('tenant/a', 1_008_000);
        const peak = t?.peakRatio ?? 0;
        return peak <= 1 + 1e-3 && w.totals().windowsOver === 0;
      },
    ),
    { seed: 19, numRuns: 200 },
  );
});

void test("history: each cell's admitted rate per second against its slice and the quota", () => {
  const w = new TrafficWindows();
  run(w, { east: 60, west: 20 }, 8_000, lookup(100, 50, { east: 75, west: 25 }));
  const h = w.history('tenant/a', 1_000_000 + 8_000 + SETTLE_MS);
  assert.ok(h !== null);
  assert.equal(h.times.length, HISTORY_POINTS);
  const east = h.cells.find((c) => c.cellId === 'east');
  assert.ok(east !== undefined);
  const points = east.admitted
    .map((a, i) => ({ a, limit: east.limit[i], quota: h.quota[i] }))
    .filter((p) => p.a !== null);
  assert.ok(points.length >= 5, `seconds kept: ${points.length}`);
  // Full seconds inside the load: 60/s against a slice of 75 and the quota of 100.
  assert.ok(
    points.some((p) => Math.abs((p.a ?? 0) - 60) < 1e-3 && p.limit === 75 && p.quota === 100),
    JSON.stringify(points),
  );
  assert.equal(w.history('tenant/none', 1_010_000), null);
});

void test('bounded: past the cap new quotas are not followed, and counted', () => {
  const w = new TrafficWindows({ maxKeys: 2 });
  w.record('east', 1000, [
    { key: 'tenant/a', allowedPerS: 1, refusedPerS: 0 },
    { key: 'tenant/b', allowedPerS: 1, refusedPerS: 0 },
    { key: 'tenant/c', allowedPerS: 1, refusedPerS: 0 },
  ]);
  assert.equal(w.trackedKeys, 2);
  assert.equal(w.totals().untracked, 1);
  assert.equal(w.traffic('tenant/c', 1000), null);
});

void test('quiet quotas cost no ledger lookup, and histories past the cap are not made only to be dropped', () => {
  const w = new TrafficWindows({ maxHistoryKeys: 4 });
  let quotaLookups = 0;
  let histories = 0;
  const look: QuotaLookup = {
    quota: () => {
      quotaLookups++;
      return { rate: 100, burst: 50 };
    },
    cellLimit: () => 10,
  };
  const t0 = 2_000_000;
  // 200 quotas busy once, at the start; then one quota stays busy.
  for (let i = 0; i < 200; i++) w.record('east', t0, [{ key: `tenant/q${i}`, allowedPerS: 10, refusedPerS: 0 }]);
  for (let t = t0; t <= t0 + 6_000; t += 200) {
    w.record('east', t, [{ key: 'tenant/busy', allowedPerS: 20, refusedPerS: 0 }]);
    w.settle(t, look);
  }
  const quiet = w.traffic('tenant/q7', t0 + 6_000);
  assert.equal(quiet?.lastRatio, 0);
  assert.equal(quiet?.windows, 14, 'every window holding one of its 5 bins of traffic was counted (as before)');
  for (let i = 0; i < 200; i++) if (w.history(`tenant/q${i}`, t0 + 6_000) !== null) histories++;
  assert.ok(histories <= 4 + 64, `${histories} histories kept`);
  assert.notEqual(w.history('tenant/busy', t0 + 6_000), null, 'the busiest quota keeps its history');
  // Settling again later: only the busy quota (and those with a history) look the ledger up.
  quotaLookups = 0;
  w.record('east', t0 + 6_200, [{ key: 'tenant/busy', allowedPerS: 20, refusedPerS: 0 }]);
  w.settle(t0 + 6_200, look);
  assert.ok(quotaLookups <= 2 * (1 + histories), `${quotaLookups} quota lookups for 2 bins`);
});

void test('busiest(n) and maxPeakRatio are all() sorted by traffic then key, and its largest peak (property)', () => {
  fc.assert(
    fc.property(
      fc.array(
        fc.record({
          cell: fc.constantFrom('east', 'west'),
          key: fc.integer({ min: 0, max: 30 }),
          allowed: fc.constantFrom(0, 1, 5, 5, 20, 100),
          refused: fc.constantFrom(0, 1, 5),
          dt: fc.integer({ min: 0, max: 1500 }),
        }),
        { maxLength: 80 },
      ),
      fc.integer({ min: 0, max: 40 }),
      (reports, n) => {
        const w = new TrafficWindows();
        const look = lookup(30, 10);
        let t = 5_000_000;
        for (const r of reports) {
          t += r.dt;
          w.record(r.cell, t, [{ key: 'tenant/a', allowedPerS: r.allowed, refusedPerS: r.refused }]);
          w.record(r.cell, t, [{ key: `tenant/k${r.key}`, allowedPerS: r.allowed, refusedPerS: r.refused }]);
          w.settle(t, look);
        }
        const now = t + 700;
        const sorted = w
          .all(now)
          .sort(
            (a, b) => b.admittedPerS + b.refusedPerS - (a.admittedPerS + a.refusedPerS) || (a.key < b.key ? -1 : 1),
          );
        assert.deepEqual(w.busiest(now, n), sorted.slice(0, n));
        assert.equal(
          w.maxPeakRatio(now),
          sorted.reduce((m, q) => Math.max(m, q.peakRatio), 0),
        );
      },
    ),
    { numRuns: 200 },
  );
});
