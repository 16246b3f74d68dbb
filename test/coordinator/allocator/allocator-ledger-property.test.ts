// Property: every round the allocator proposes is accepted by a real Ledger (never QUOTA_EXCEEDED),
// and the ledger's invariants hold after it — over random quotas (tenants in tier caps in a domain
// cap), cell counts and floor slots, random demands, acknowledgement patterns (prompt, late, never),
// cells that stop reporting until their leases expire, long pauses, and operators changing a tier's
// rate mid-run. Each round also checks that every grant is at least the cell's floor and that, at
// every reporting cell, the children of a cap never sum above the cap's own level there (above their
// floors).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import type { LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';
import { AllocSim } from './alloc-harness.js';

interface World {
  cells: number;
  floorCells: number;
  goldRate: number;
  silverRate: number;
  ff: number;
  tenants: { tier: 'gold' | 'silver'; rate: number | null }[];
  goldCap: number | null;
  domainCap: number | null;
  rounds: {
    dt: number;
    changes: { q: number; c: number; frac: number }[];
    down: number[];
    ackP: number[];
    retier: number | null;
  }[];
  sameRoundAcks: boolean;
  lateDelivery: boolean;
}

const world: fc.Arbitrary<World> = fc.record({
  cells: fc.integer({ min: 2, max: 5 }),
  floorCells: fc.integer({ min: 1, max: 5 }),
  goldRate: fc.integer({ min: 20, max: 5000 }),
  silverRate: fc.integer({ min: 5, max: 500 }),
  ff: fc.constantFrom(0, 0.1, 0.3, 0.6),
  tenants: fc.array(
    fc.record({
      tier: fc.constantFrom<'gold' | 'silver'>('gold', 'silver'),
      rate: fc.option(fc.integer({ min: 3, max: 3000 }), { nil: null }),
    }),
    { minLength: 1, maxLength: 5 },
  ),
  goldCap: fc.option(fc.double({ min: 0.2, max: 1.5, noNaN: true }), { nil: null }),
  domainCap: fc.option(fc.double({ min: 0.2, max: 1.5, noNaN: true }), { nil: null }),
  rounds: fc.array(
    fc.record({
      dt: fc.constantFrom(500, 500, 500, 500, 250, 1500, 4500),
      changes: fc.array(fc.record({ q: fc.nat(), c: fc.nat(), frac: fc.double({ min: 0, max: 1.6, noNaN: true }) }), {
        maxLength: 6,
      }),
      down: fc.array(fc.nat({ max: 4 }), { maxLength: 2 }),
      ackP: fc.array(fc.constantFrom(1, 1, 0.7, 0.3, 0), { minLength: 5, maxLength: 5 }),
      retier: fc.option(fc.integer({ min: 10, max: 6000 }), { freq: 12, nil: null }),
    }),
    { minLength: 15, maxLength: 30 },
  ),
  sameRoundAcks: fc.boolean(),
  lateDelivery: fc.boolean(),
});

function run(w: World): void {
  const cells = Array.from({ length: w.cells }, (_, i) => `c${i}`);
  const setup: LedgerCommandInput[] = [
    { type: 'putTier', name: 'gold', rate: w.goldRate, burst: w.goldRate * 2, floorFraction: w.ff },
    { type: 'putTier', name: 'silver', rate: w.silverRate, burst: w.silverRate, floorFraction: w.ff },
  ];
  const quotas: { key: string; parent: string | null }[] = [];
  let goldSum = 0;
  let allSum = 0;
  w.tenants.forEach((t, i) => {
    setup.push(
      t.rate === null
        ? { type: 'putTenant', id: `t${i}`, tier: t.tier }
        : { type: 'putTenant', id: `t${i}`, tier: t.tier, rate: t.rate },
    );
    const r = t.rate ?? (t.tier === 'gold' ? w.goldRate : w.silverRate);
    allSum += r;
    if (t.tier === 'gold') goldSum += r;
  });
  const hasGoldCap = w.goldCap !== null && goldSum > 0;
  if (hasGoldCap)
    setup.push({
      type: 'putTierCap',
      tier: 'gold',
      rate: Math.max(1, goldSum * (w.goldCap ?? 1)),
      burst: Math.max(1, goldSum * (w.goldCap ?? 1)),
      floorFraction: w.ff,
    });
  if (w.domainCap !== null)
    setup.push({
      type: 'putDomainCap',
      domain: 'api',
      rate: Math.max(1, allSum * w.domainCap),
      burst: Math.max(1, allSum * w.domainCap),
      floorFraction: w.ff,
    });
  const domain = w.domainCap !== null ? 'domain/api' : null;
  if (domain !== null) quotas.push({ key: domain, parent: null });
  if (hasGoldCap) quotas.push({ key: 'tier/gold', parent: domain });
  w.tenants.forEach((t, i) =>
    quotas.push({ key: `tenant/t${i}`, parent: t.tier === 'gold' && hasGoldCap ? 'tier/gold' : domain }),
  );

  const sim = new AllocSim({ floorCells: w.floorCells, skewMarginMs: 500, leaseTtlMs: 1500, cells, setup, quotas });
  // Leaf demands; a parent's demand at a cell is the sum of its children's there.
  const leaves = quotas.filter((q) => q.key.startsWith('tenant/'));
  const demand = new Map<string, number>();
  const downUntil = new Map<string, number>();
  let rnd = 0;
  for (const r of w.rounds) {
    rnd++;
    for (const ch of r.changes) {
      const q = leaves[ch.q % leaves.length];
      if (q === undefined) continue;
      const rate = sim.state(q.key).rate;
      demand.set(`${q.key}|c${ch.c % w.cells}`, ch.frac * rate);
    }
    for (const dn of r.down) downUntil.set(`c${dn % w.cells}`, rnd + 1 + (dn % 4) * 3);
    if (r.retier !== null)
      sim.ok({ type: 'putTier', name: 'gold', rate: r.retier, burst: r.retier * 2, floorFraction: w.ff });
    const demandOf = (key: string, cellId: string): number => {
      if (key.startsWith('tenant/')) return demand.get(`${key}|${cellId}`) ?? 0;
      return quotas.filter((q) => q.parent === key).reduce((s, q) => s + demandOf(q.key, cellId), 0);
    };
    const res = sim.round({
      dtMs: r.dt,
      demand: demandOf,
      reports: (c) => (downUntil.get(c) ?? 0) < rnd,
      acks: (_key, c) => {
        const p = r.ackP[Number(c.slice(1))] ?? 1;
        return p >= 1 || (p > 0 && ((rnd * 7 + Number(c.slice(1)) * 13) % 10) / 10 < p);
      },
      sameRoundAcks: w.sameRoundAcks,
      lateDelivery: w.lateDelivery,
    });
    // Floors: no grant below the cell's floor.
    for (const g of res.grants) {
      const st = sim.state(g.key);
      const slot = st.cells.find((v) => v.cellId === g.cellId)?.slot ?? null;
      const fr = slot === null ? 0 : st.floorRate;
      const fb = slot === null ? 0 : st.floorBurst;
      assert.equal(g.rate >= fr * (1 - 1e-12), true, `grant ${g.key}/${g.cellId} rate ${g.rate} below floor ${fr}`);
      assert.equal(g.burst >= fb * (1 - 1e-12), true, `grant ${g.key}/${g.cellId} burst ${g.burst} below floor ${fb}`);
    }
    // Hierarchy at every reporting cell.
    for (const parent of quotas) {
      const children = quotas.filter((q) => q.parent === parent.key);
      if (children.length === 0) continue;
      for (const c of res.reporting) {
        let sum = 0;
        let floors = 0;
        let sumB = 0;
        let floorsB = 0;
        for (const ch of children) {
          const st = sim.state(ch.key);
          const slot = st.cells.find((v) => v.cellId === c)?.slot ?? null;
          sum += sim.level(ch.key, c);
          sumB += sim.levelBurst(ch.key, c);
          floors += slot === null ? 0 : st.floorRate;
          floorsB += slot === null ? 0 : st.floorBurst;
        }
        const cap = Math.max(sim.level(parent.key, c), floors);
        const capB = Math.max(sim.levelBurst(parent.key, c), floorsB);
        assert.equal(
          sum <= cap * (1 + 1e-9) + 1e-9,
          true,
          `round ${rnd}: children of ${parent.key} at ${c} sum to ${sum}, over ${cap}`,
        );
        assert.equal(
          sumB <= capB * (1 + 1e-9) + 1e-9,
          true,
          `round ${rnd}: children bursts of ${parent.key} at ${c} sum to ${sumB}, over ${capB}`,
        );
      }
    }
  }
}

void test('every allocator round is accepted by the ledger, within floors and parent caps', () => {
  fc.assert(fc.property(world, run), { numRuns: 200 });
});
