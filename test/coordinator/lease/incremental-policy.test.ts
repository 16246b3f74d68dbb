// The incremental lease round (coordinator/lease/incremental-policy.ts) against the full one
// (grant-policy.ts `allocatorPolicy`, every quota every round): over random sequences of rounds on
// a real ledger — cells reporting in random subsets, demands appearing, moving and vanishing,
// acknowledgements prompt, late or never, a tier cap over some tenants, tenants and tiers changed
// by an operator, a cell going silent until its lease runs out — the incremental round sends
// exactly the full round's grants, while computing only what changed once the quotas are steady.
// Then the budget: a round over `maxGrantsPerRound` sends that many, by priority, and the rest in
// later rounds; float32 rounding never raises a grant above the unrounded one.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { Ledger } from '../../../coordinator/ledger/ledger.js';
import type { Grant, GrantAck, LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';
import { AllocatorInputBuilder, allocatorCells } from '../../../coordinator/allocator/index.js';
import { allocatorPolicy, buildRoundInput } from '../../../coordinator/lease/grant-policy.js';
import type { RoundDemands } from '../../../coordinator/lease/grant-policy.js';
import { IncrementalAllocatorPolicy } from '../../../coordinator/lease/incremental-policy.js';

const TTL = 3000;
const CELLS = ['a', 'b', 'c', 'd'];

let index = 0;
function apply(l: Ledger, cmd: LedgerCommandInput): void {
  const r = l.apply(cmd, ++index);
  assert.ok(r.ok, `${cmd.type}: ${r.ok ? '' : r.error.message}`);
}

const sortGrants = (gs: readonly Grant[]): string[] =>
  gs.map((g) => `${g.key}|${g.cellId}|${g.rate}|${g.burst}|${g.epoch}|${g.leaseExpiresAtMs}`).sort();

interface Step {
  readonly reporters: boolean[];
  readonly moves: { tenant: number; cell: number; demand: number }[];
  readonly ackProb: number;
  readonly op: number;
}

const step = fc.record({
  reporters: fc.array(fc.boolean(), { minLength: CELLS.length, maxLength: CELLS.length }),
  moves: fc.array(
    fc.record({
      tenant: fc.nat({ max: 11 }),
      cell: fc.nat({ max: CELLS.length - 1 }),
      demand: fc.oneof(fc.constant(0), fc.double({ min: 0.5, max: 900, noNaN: true })),
    }),
    { maxLength: 6 },
  ),
  ackProb: fc.constantFrom(0, 0.5, 1),
  op: fc.nat({ max: 30 }),
});

/**
 * The round's input as buildRoundInput reads it (slices into columns, Ledger.readQuotaColumns) is
 * the input made from the ledger's QuotaState objects (getQuotaState, addQuotaState).
 */
function assertColumnsRead(l: Ledger, demands: RoundDemands, now: number): void {
  const keys = [...new Set([...l.activeQuotaKeys(), ...demands.byKey.keys()])];
  const got = buildRoundInput(l, demands, now, keys);
  const cells = allocatorCells(l.listCells(), demands.reported);
  const acked = new Map<string, Float64Array>();
  for (const a of demands.acks) {
    const i = cells.findIndex((c) => c.id === a.cellId);
    let row = acked.get(a.key);
    if (row === undefined) acked.set(a.key, (row = new Float64Array(cells.length)));
    row[i] = a.epoch;
  }
  const b = new AllocatorInputBuilder(cells);
  for (const q of got?.quotas ?? []) {
    const state = l.getQuotaState(q.key);
    assert.ok(state !== undefined);
    const d = demands.byKey.get(q.key);
    const demand = cells.map((c) => {
      const v = d?.get(c.id) ?? 0;
      return v > 0 ? v : 0;
    });
    const ackedEpochs = acked.get(q.key);
    b.addQuotaState(state, demand, { parent: q.parent, ...(ackedEpochs === undefined ? {} : { ackedEpochs }) });
  }
  const want = b.build({ nowMs: now, leaseTtlMs: TTL, skewMarginMs: l.config.skewMarginMs });
  if (got === null) assert.equal(want.quotas.length, 0);
  else assert.deepEqual(got, want);
}

void test("the incremental round sends exactly the full round's grants, round after round", () => {
  fc.assert(
    fc.property(fc.array(step, { minLength: 10, maxLength: 40 }), fc.boolean(), (steps: Step[], capped) => {
      index = 0;
      const l = new Ledger({ floorCells: 3, assertInvariants: true });
      apply(l, { type: 'putTier', name: 'gold', rate: 1000, burst: 2000, floorFraction: 0.3 });
      apply(l, { type: 'putTier', name: 'bronze', rate: 100, burst: 100, floorFraction: 0 });
      if (capped) apply(l, { type: 'putTierCap', tier: 'gold', rate: 1500, burst: 3000, floorFraction: 0.2 });
      for (let t = 0; t < 10; t++) apply(l, { type: 'putTenant', id: `t${t}`, tier: t % 3 === 0 ? 'bronze' : 'gold' });
      for (const c of CELLS) apply(l, { type: 'registerCell', cellId: c, nowMs: 0 });
      const inc = new IncrementalAllocatorPolicy({ float32: false, maxGrantsPerRound: 1 << 20 });
      const byKey = new Map<string, Map<string, number>>();
      let changed: Set<string> | undefined;
      let now = 1000;
      let outstanding: GrantAck[] = [];
      let silent = -1; // a cell that stops reporting for a while (its lease runs out)
      for (const s of steps) {
        now += 100;
        // Operator changes, now and then.
        if (s.op === 1)
          apply(l, { type: 'putTier', name: 'gold', rate: 800 + (now % 400), burst: 2000, floorFraction: 0.3 });
        else if (s.op === 2) apply(l, { type: 'putTenant', id: 't10', tier: 'gold' });
        else if (s.op === 3) apply(l, { type: 'putTenant', id: 't1', tier: 'gold', rate: 300 + (now % 7) });
        else if (s.op === 4) silent = silent < 0 ? 2 : -1;
        const reported = new Set(CELLS.filter((c, i) => s.reporters[i] === true && i !== silent));
        for (const m of s.moves) {
          const cellId = CELLS[m.cell] as string;
          if (!reported.has(cellId)) continue; // demand arrives only with a report
          const key = `tenant/t${m.tenant}`;
          let row = byKey.get(key);
          if (m.demand > 0) {
            if (row === undefined) byKey.set(key, (row = new Map<string, number>()));
            row.set(cellId, m.demand);
          } else {
            if (row?.delete(cellId) !== true) continue;
            if (row.size === 0) byKey.delete(key);
          }
          changed?.add(key);
        }
        if (reported.size === 0) continue;
        // Acknowledgements of the reporting cells' outstanding grants.
        const acks: GrantAck[] = [];
        const keep: GrantAck[] = [];
        for (const a of outstanding) {
          const sl = l.getSlice(a.key, a.cellId);
          if (sl === undefined || sl.epoch !== a.epoch) continue;
          if (reported.has(a.cellId) && (s.ackProb === 1 || (s.ackProb > 0 && (a.epoch + now / 100) % 2 === 0))) {
            if (!sl.acknowledged) acks.push(a);
          } else keep.push(a);
        }
        const demands: RoundDemands = { reported, byKey, acks, leaseTtlMs: TTL, changedKeys: changed };
        assertColumnsRead(l, demands, now);
        const full = allocatorPolicy(l, demands, now);
        const got = inc.policy(l, demands, now);
        assert.deepEqual(sortGrants(got), sortGrants(full), `round at ${now}`);
        changed = new Set();
        const grants = full.filter((g) => reported.has(g.cellId));
        apply(l, {
          type: 'reportAndGrant',
          nowMs: now,
          leases: [...reported].map((cellId) => ({ cellId, leaseExpiresAtMs: now + TTL })),
          acks,
          grants,
        });
        outstanding = [
          ...keep,
          ...grants.map((g) => ({
            key: g.key,
            cellId: g.cellId,
            epoch: l.getSlice(g.key, g.cellId)?.epoch ?? g.epoch,
          })),
        ];
      }
    }),
    { numRuns: 60 },
  );
});

void test('steady quotas cost nothing: after convergence a round computes only the quotas whose demand moved', () => {
  index = 0;
  const l = new Ledger({ floorCells: 2, assertInvariants: true });
  apply(l, { type: 'putTier', name: 'gold', rate: 1000, burst: 1000, floorFraction: 0.2 });
  for (let t = 0; t < 200; t++) apply(l, { type: 'putTenant', id: `t${t}`, tier: 'gold' });
  for (const c of ['a', 'b']) apply(l, { type: 'registerCell', cellId: c, nowMs: 0 });
  const inc = new IncrementalAllocatorPolicy();
  const byKey = new Map<string, Map<string, number>>();
  for (let t = 0; t < 200; t++)
    byKey.set(
      `tenant/t${t}`,
      new Map([
        ['a', 100 + t],
        ['b', 300 - t],
      ]),
    );
  const reported = new Set(['a', 'b']);
  let changed: Set<string> | undefined;
  let now = 1000;
  const run = (): Grant[] => {
    now += 100;
    const acks = [...l.activeQuotaKeys()].flatMap((key) =>
      ['a', 'b'].flatMap((cellId) => {
        const s = l.getSlice(key, cellId);
        return s !== undefined && s.epoch > 0 && !s.acknowledged ? [{ key, cellId, epoch: s.epoch }] : [];
      }),
    );
    const grants = inc.policy(l, { reported, byKey, acks, leaseTtlMs: TTL, changedKeys: changed }, now);
    changed = new Set();
    apply(l, {
      type: 'reportAndGrant',
      nowMs: now,
      leases: [...reported].map((cellId) => ({ cellId, leaseExpiresAtMs: now + TTL })),
      acks,
      grants,
    });
    return grants;
  };
  let rounds = 0;
  while (run().length > 0 || inc.stats.workingSet > 0) {
    rounds++;
    assert.ok(rounds < 20, `converged within 20 rounds (working set ${inc.stats.workingSet})`);
  }
  const computed = inc.stats.quotas;
  run();
  assert.equal(inc.stats.lastQuotas, 0, 'a quiet round computes nothing');
  assert.equal(inc.stats.quotas, computed);
  byKey.get('tenant/t7')?.set('a', 900);
  changed?.add('tenant/t7');
  const g = run();
  assert.equal(inc.stats.lastQuotas, 1, 'one moved demand: one quota computed');
  assert.deepEqual([...new Set(g.map((x) => x.key))], ['tenant/t7']);
});

void test('the budget sends the most urgent grants first and the rest in later rounds; float32 never rounds a grant up', () => {
  index = 0;
  const l = new Ledger({ floorCells: 2, assertInvariants: true });
  apply(l, { type: 'putTier', name: 'gold', rate: 1000, burst: 1000 });
  for (let t = 0; t < 50; t++) apply(l, { type: 'putTenant', id: `t${t}`, tier: 'gold' });
  for (const c of ['a', 'b']) apply(l, { type: 'registerCell', cellId: c, nowMs: 0 });
  const reported = new Set(['a', 'b']);
  const byKey = new Map<string, Map<string, number>>();
  for (let t = 0; t < 50; t++)
    byKey.set(
      `tenant/t${t}`,
      new Map([
        ['a', 10 + t * 3.3],
        ['b', 7.77 * (t + 1)],
      ]),
    );
  const unbounded = allocatorPolicy(l, { reported, byKey, acks: [], leaseTtlMs: TTL }, 1000);
  const inc = new IncrementalAllocatorPolicy({ maxGrantsPerRound: 30 });
  let now = 1000;
  const seen = new Map<string, Grant>();
  let changed: Set<string> | undefined;
  for (let r = 0; r < 10; r++) {
    const grants = inc.policy(l, { reported, byKey, acks: [], leaseTtlMs: TTL, changedKeys: changed }, now);
    changed = new Set();
    const allocatorGrants = grants.filter((g) => g.rate > 0);
    assert.ok(allocatorGrants.length <= 30, `at most 30 allocator grants in a round: ${allocatorGrants.length}`);
    for (const g of grants) seen.set(`${g.key}|${g.cellId}`, g);
    apply(l, {
      type: 'reportAndGrant',
      nowMs: now,
      leases: [...reported].map((cellId) => ({ cellId, leaseExpiresAtMs: now + TTL })),
      grants,
    });
    now += 100;
  }
  for (const u of unbounded) {
    const g = seen.get(`${u.key}|${u.cellId}`);
    assert.ok(g !== undefined, `${u.key} on ${u.cellId} granted within 10 rounds`);
    assert.ok(g.rate <= u.rate && g.rate > u.rate * (1 - 1e-6), `${u.key}: ${g.rate} rounded down from ${u.rate}`);
    assert.equal(Math.fround(g.rate), g.rate, 'a float32');
  }
  assert.ok(inc.stats.deferredGrants > 0, 'some grants waited');
});
