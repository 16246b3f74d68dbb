// Scenarios of the allocator, each against a real ledger (AllocSim), plus its input checks.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { allocateRound, AllocatorInputError, AllocatorWorkspace } from '../../../coordinator/allocator/allocator.js';
import type { AllocatorInput } from '../../../coordinator/allocator/allocator.js';
import { AllocatorInputBuilder, allocatorCells } from '../../../coordinator/allocator/allocator-input.js';
import type { LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';
import { AllocSim } from './alloc-harness.js';

const KEY = 'tenant/t';

function sim(
  opts: {
    rate?: number;
    burst?: number;
    ff?: number;
    cells?: string[];
    floorCells?: number;
    extra?: LedgerCommandInput[];
    quotas?: { key: string; parent: string | null }[];
  } = {},
): AllocSim {
  const rate = opts.rate ?? 1000;
  return new AllocSim({
    floorCells: opts.floorCells ?? 3,
    skewMarginMs: 1000,
    leaseTtlMs: 3000,
    cells: opts.cells ?? ['a', 'b', 'c'],
    setup: [
      { type: 'putTier', name: 'gold', rate, burst: opts.burst ?? rate, floorFraction: opts.ff ?? 0.3 },
      { type: 'putTenant', id: 't', tier: 'gold' },
      ...(opts.extra ?? []),
    ],
    quotas: opts.quotas ?? [{ key: KEY, parent: null }],
  });
}

const levels = (s: AllocSim, cells = ['a', 'b', 'c'], key = KEY): number[] =>
  cells.map((c) => Math.round(s.level(key, c) * 1000) / 1000);

void test('only changed slices get grants, each with the next epoch and a fresh lease; bursts follow rates', () => {
  const s = sim({ rate: 1000, burst: 2000 });
  const d = { a: 500, b: 100, c: 0 } as Record<string, number>;
  const r1 = s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.deepEqual(
    r1.grants.map((g) => [g.cellId, g.rate, g.burst, g.epoch, g.leaseExpiresAtMs]),
    [
      ['a', 600, 1200, 1, r1.nowMs + 3000],
      ['b', 100, 240, 1, r1.nowMs + 3000],
    ],
    'a: demand × 1.2, burst in proportion (2 per req/s); b (demand 100, floor 100, not refusing): the rate step to 120 is under the hysteresis, but its burst (floor 200) lags its target (240) by more than 5%; c keeps its floors',
  );
  const r2 = s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.equal(r2.grants.length, 0, 'steady: nothing changes');
  d['b'] = 300;
  const r3 = s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.deepEqual(
    r3.grants.map((g) => [g.cellId, g.rate, g.burst, g.epoch]),
    [
      ['a', 540, 1080, 2],
      ['b', 300, 600, 2],
    ],
    'Σ wants 1060 > 1000: headroom is split (a 540, b 360); a shrinks, b grows into the free 200 only',
  );
  const r4 = s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.deepEqual(
    r4.grants.map((g) => [g.cellId, g.rate, g.epoch]),
    [['b', 360, 3]],
    'a acknowledged: b takes the rest',
  );
  const st = s.state(KEY);
  assert.equal(st.cells.reduce((x, v) => x + v.burst, 0) <= st.burst, true, 'Σ bursts within the quota burst');
});

void test('hysteresis: small wobbles change nothing; a refusing cell still gets a small grow', () => {
  const s = sim({ rate: 1000 });
  const d = { a: 300, b: 300, c: 300 } as Record<string, number>;
  for (let r = 0; r < 3; r++) s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.deepEqual(levels(s), [333.333, 333.333, 333.333], 'Σ wants 1080 > 1000: all at the fair share');
  // Demand moves by 3% of the quota: below the 5% threshold, and nobody refuses more than before.
  d['a'] = 280;
  d['b'] = 310;
  assert.equal(s.round({ demand: (_k, c) => d[c] ?? 0 }).grants.length, 0);
  // An idle quota far below its limit: a cell at 100 req/s of a 120 grant goes to 104, no change.
  const t = sim({ rate: 1000, ff: 0 });
  const e = { a: 100, b: 0, c: 0 } as Record<string, number>;
  t.round({ demand: (_k, c) => e[c] ?? 0 });
  assert.equal(t.level(KEY, 'a'), 120);
  e['a'] = 104;
  assert.equal(t.round({ demand: (_k, c) => e[c] ?? 0 }).grants.length, 0, 'headroom covers it');
  // Refusing (demand above its level): grows although the step (10 of 1000) is under the threshold.
  e['a'] = 130;
  const r = t.round({ demand: (_k, c) => e[c] ?? 0 });
  assert.deepEqual(
    r.grants.map((g) => [g.cellId, g.rate]),
    [['a', 156]],
  );
});

void test('a starved cell makes the others give up even excesses below the hysteresis threshold', () => {
  const cells = ['a', 'b', 'c', 'd', 'e', 'f'];
  const s = sim({ rate: 600, ff: 0, cells, floorCells: 6 });
  const d = Object.fromEntries(cells.map((c) => [c, 200])) as Record<string, number>;
  d['f'] = 0;
  for (let r = 0; r < 4; r++) s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.deepEqual(
    levels(s, cells),
    [120, 120, 120, 120, 120, 0],
    'demands first: no headroom while the quota is short',
  );
  // f's demand rises to 100: its fair share is 100, the others must give 18.8 each (< 30, the threshold).
  d['f'] = 100;
  const r1 = s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.equal(r1.out.stats.forcedShrinks, 5, 'all five shrink although each gives less than the threshold');
  s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.deepEqual(levels(s, cells), [100, 100, 100, 100, 100, 100]);
});

void test('a shrink frees nothing until acknowledged; no further shrink is sent while one is pending', () => {
  const s = sim({ rate: 1000, ff: 0 });
  const d = { a: 800, b: 0, c: 0 } as Record<string, number>;
  for (let r = 0; r < 2; r++) s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.equal(s.level(KEY, 'a'), 960);
  d['a'] = 300;
  d['b'] = 500;
  const noAck = (_k: string, c: string): boolean => c !== 'a';
  const r1 = s.round({ demand: (_k, c) => d[c] ?? 0, acks: noAck });
  assert.deepEqual(
    r1.grants.map((g) => [g.cellId, g.rate]),
    [
      ['a', 360],
      ['b', 40],
    ],
    'a shrinks; b only gets what is free (1000 − 960)',
  );
  d['a'] = 100;
  const r2 = s.round({ demand: (_k, c) => d[c] ?? 0, acks: noAck });
  assert.equal(r2.out.stats.waitingAck, 1, 'a is not shrunk again before it acknowledges');
  assert.equal(
    r2.grants.some((g) => g.cellId === 'a'),
    false,
  );
  const r3 = s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.deepEqual(
    r3.grants.map((g) => [g.cellId, g.rate]),
    [
      ['a', 120],
      ['b', 600],
    ],
    'a acknowledges in this round: b grows into what a gave back, and a shrinks further',
  );
});

void test('a cell that stops reporting gets no grant; its capacity returns once its lease surely expired', () => {
  const s = sim({ rate: 900, ff: 0 });
  const d = { a: 400, b: 400, c: 0 } as Record<string, number>;
  for (let r = 0; r < 2; r++) s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.deepEqual(levels(s), [445.5, 445.5, 0], 'c: a 9 req/s headroom step is under the hysteresis');
  d['a'] = 900;
  const reports = (c: string): boolean => c !== 'b';
  const r1 = s.round({ demand: (_k, c) => d[c] ?? 0, reports });
  assert.equal(
    r1.grants.some((g) => g.cellId === 'b'),
    false,
  );
  assert.equal(s.level(KEY, 'a'), 454.5, 'b may still be using its 445.5: a grows only into the free 9');
  // b's lease (3 s) plus the skew margin (1 s) pass: the ledger releases it and a grows.
  for (let r = 0; r < 8; r++) s.round({ demand: (_k, c) => d[c] ?? 0, reports });
  assert.deepEqual(levels(s), [900, 0, 0]);
});

void test('reports spread over rounds (one cell per round, as agents report every 500 ms and rounds run every 100 ms): the cells still converge to the fair split', () => {
  // Found by the chaos drills: with only the reporting cell's target computed, against what the
  // silent cells hold, a cell that grabbed the quota first kept it and a later one stayed on its floor.
  const s = sim({ rate: 600, ff: 0.3 });
  const cells = ['a', 'b', 'c'];
  const d = { a: 450, b: 0, c: 0 } as Record<string, number>;
  let round = 0;
  const next = (): void => {
    const turn = cells[round++ % 3] as string;
    s.round({ demand: (_k, c) => d[c] ?? 0, reports: (c) => c === turn });
  };
  for (let r = 0; r < 9; r++) next();
  assert.equal(s.level(KEY, 'a') > 400, true, `a alone takes most of the quota: ${levels(s).join(', ')}`);
  d['b'] = 270;
  d['c'] = 180;
  for (let r = 0; r < 30; r++) next();
  // Max-min fair with floors 60: c 180, a and b 210 each.
  const lv = levels(s);
  assert.equal(
    Math.abs((lv[0] ?? 0) - 210) <= 0.05 * 600 &&
      Math.abs((lv[1] ?? 0) - 210) <= 0.05 * 600 &&
      (lv[2] ?? 0) >= 180 * 0.95,
    true,
    `converged to 210 / 210 / 180: ${lv.join(', ')}`,
  );
  assert.equal(lv.reduce((x, y) => x + y, 0) <= 600 * (1 + 1e-9), true, `within the quota: ${lv.join(', ')}`);
});

void test('a lowered quota: no cell grows while the cells may use more than the new limit; shrinks bring it back', () => {
  const s = sim({ rate: 1000, ff: 0 });
  const d = { a: 400, b: 400, c: 0 } as Record<string, number>;
  for (let r = 0; r < 2; r++) s.round({ demand: (_k, c) => d[c] ?? 0 });
  s.ok({ type: 'putTier', name: 'gold', rate: 500, burst: 500, floorFraction: 0 });
  d['c'] = 300;
  const r1 = s.round({ demand: (_k, c) => d[c] ?? 0 });
  assert.deepEqual(
    r1.grants.map((g) => [g.cellId, Math.round(g.rate * 100) / 100]),
    [
      ['a', 166.67],
      ['b', 166.67],
    ],
    'only shrinks while over the limit (c, refusing, waits)',
  );
  for (let r = 0; r < 3; r++) s.round({ demand: (_k, c) => d[c] ?? 0 });
  const lv = ['a', 'b', 'c'].map((c) => s.level(KEY, c));
  assert.equal(lv.reduce((x, y) => x + y, 0) <= 500 * (1 + 1e-9), true, `back within the limit: ${lv.join(', ')}`);
  assert.equal((lv[2] ?? 0) >= 150, true, `c got its share: ${lv.join(', ')}`);
});

void test('hierarchy: a tier cap is allocated first, its tenants share its per-cell level', () => {
  const s = sim({
    rate: 1000,
    ff: 0,
    cells: ['a', 'b'],
    floorCells: 2,
    extra: [
      { type: 'putTenant', id: 'u', tier: 'gold' },
      { type: 'putTierCap', tier: 'gold', rate: 600, burst: 600, floorFraction: 0 },
    ],
    quotas: [
      { key: KEY, parent: 'tier/gold' },
      { key: 'tenant/u', parent: 'tier/gold' },
      { key: 'tier/gold', parent: null },
    ],
  });
  const d: Record<string, Record<string, number>> = { [KEY]: { a: 400, b: 0 }, 'tenant/u': { a: 400, b: 100 } };
  const demand = (k: string, c: string): number =>
    k === 'tier/gold' ? (d[KEY]?.[c] ?? 0) + (d['tenant/u']?.[c] ?? 0) : (d[k]?.[c] ?? 0);
  for (let r = 0; r < 3; r++) s.round({ demand });
  // The cap (600): demand 800 at a, 100 at b → demands first, b's 100, a the rest (500). At a, the two
  // tenants (400 each) share 500: 250 each; at b, u's 100 takes all of it.
  assert.deepEqual(levels(s, ['a', 'b'], 'tier/gold'), [500, 100]);
  assert.deepEqual(levels(s, ['a', 'b'], KEY), [250, 0]);
  assert.deepEqual(levels(s, ['a', 'b'], 'tenant/u'), [250, 100]);
});

void test('input checks: sizes, parents, cycles, tuning', () => {
  const cells = allocatorCells(
    [
      {
        id: 'a',
        slot: 0,
        registeredAtMs: 0,
        lastReportAtMs: null,
        leaseExpiresAtMs: null,
        leaseLive: false,
        removing: false,
      },
    ],
    new Set(['a']),
  );
  const quota = (key: string, parent: string | null): Parameters<AllocatorInputBuilder['addQuota']>[0] => ({
    key,
    rate: 10,
    burst: 10,
    floorRate: 0,
    floorBurst: 0,
    ceilingRate: 10,
    ceilingBurst: 10,
    countedRate: 0,
    countedBurst: 0,
    parent,
  });
  const slice = { rate: 0, burst: 0, epoch: 0, acknowledged: true, countedRate: 0, countedBurst: 0 };
  const build = (qs: [string, string | null][], tuning?: Record<string, number>): AllocatorInput => {
    const b = new AllocatorInputBuilder(cells);
    for (const [k, p] of qs) b.addQuota(quota(k, p), [slice], [1]);
    return b.build({ nowMs: 0, leaseTtlMs: 3000, skewMarginMs: 1000, ...(tuning === undefined ? {} : { tuning }) });
  };
  assert.throws(() => allocateRound(build([['tenant/x', 'tier/nope']])), AllocatorInputError);
  assert.throws(
    () =>
      allocateRound(
        build([
          ['tier/a', 'tier/b'],
          ['tier/b', 'tier/a'],
        ]),
      ),
    /cycle/,
  );
  assert.throws(
    () =>
      allocateRound(
        build([
          ['tier/a', null],
          ['tier/a', null],
          ['tenant/x', 'tier/a'],
        ]),
      ),
    /twice/,
  );
  assert.throws(() => allocateRound(build([['tenant/x', null]], { headroomFactor: 0.5 })), /headroomFactor/);
  const ok = build([['tenant/x', null]]);
  assert.throws(() => allocateRound({ ...ok, slices: { ...ok.slices, demand: new Float64Array(0) } }), /slices.demand/);
  assert.throws(() => new AllocatorInputBuilder(cells).addQuota(quota('tenant/x', null), [], [1]), AllocatorInputError);
  // A workspace may serve rounds of any size, in any order.
  const ws = new AllocatorWorkspace();
  const big = build([
    ['tier/a', null],
    ['tenant/x', 'tier/a'],
    ['tenant/y', 'tier/a'],
  ]);
  assert.deepEqual(allocateRound(big, ws), allocateRound(big));
  assert.deepEqual(allocateRound(ok, ws), allocateRound(ok));
  assert.deepEqual(allocateRound(big, ws), allocateRound(big));
});
