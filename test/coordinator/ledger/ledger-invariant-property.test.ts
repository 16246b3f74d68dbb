// Property: random rounds of grant changes, acknowledgements, lease renewals, lease expiries, time
// advances and registrations never produce a state over the bound, and a round is refused exactly
// when it would break it. The check is made twice: by the ledger itself (assertInvariants) and by an
// independent model written here, which keeps, per quota and cell, the whole list of grants the cell
// may still be using instead of the ledger's running maxima.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { BOUND_TOLERANCE, Ledger } from '../../../coordinator/ledger/ledger.js';
import { assertUnchanged } from './ledger-helpers.js';
import type { Grant, GrantAck, LeaseRenewal, LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';

const K = 3; // floorCells
const MARGIN = 500;
const CELLS = ['c0', 'c1', 'c2', 'c3'];
interface Quota {
  key: string;
  rate: number;
  burst: number;
  ff: number;
}
const QUOTAS: Quota[] = [
  { key: 'tenant/t1', rate: 1000, burst: 800, ff: 0.3 },
  { key: 'tenant/t2', rate: 400, burst: 800, ff: 0.3 },
  { key: 'tenant/t3', rate: 300, burst: 300, ff: 0 },
  { key: 'tier/gold', rate: 1200, burst: 1200, ff: 0.5 },
];
const SETUP: LedgerCommandInput[] = [
  { type: 'putTier', name: 'gold', rate: 1000, burst: 800, floorFraction: 0.3 },
  { type: 'putTier', name: 'silver', rate: 300, burst: 300 },
  { type: 'putTenant', id: 't1', tier: 'gold' },
  { type: 'putTenant', id: 't2', tier: 'gold', rate: 400 },
  { type: 'putTenant', id: 't3', tier: 'silver' },
  { type: 'putTierCap', tier: 'gold', rate: 1200, burst: 1200, floorFraction: 0.5 },
  { type: 'registerCell', cellId: 'c0', nowMs: 0 },
  { type: 'registerCell', cellId: 'c1', nowMs: 0 },
];

// ---- the independent model ----------------------------------------------------------------------

interface Held {
  epoch: number;
  rate: number;
  burst: number;
  floorRate: number;
  floorBurst: number;
  alive: boolean;
}

class Model {
  now = 0;
  registered: string[] = ['c0', 'c1'];
  lease = new Map<string, number | null>();
  /** Per quota and cell: every grant since the last effective acknowledgement, newest last. */
  held = new Map<string, Held[]>();

  clone(): Model {
    const m = new Model();
    m.now = this.now;
    m.registered = [...this.registered];
    m.lease = new Map(this.lease);
    m.held = new Map([...this.held].map(([k, v]) => [k, v.map((h) => ({ ...h }))]));
    return m;
  }
  slot(cell: string): boolean {
    return this.registered.indexOf(cell) < K;
  }
  floor(q: Quota, cell: string | null): [number, number] {
    if (cell !== null && !this.slot(cell)) return [0, 0];
    return [(q.ff * q.rate) / K, (q.ff * q.burst) / K];
  }
  epoch(key: string, cell: string): number {
    return this.held.get(`${key}|${cell}`)?.at(-1)?.epoch ?? 0;
  }
  live(cell: string): boolean {
    const l = this.lease.get(cell) ?? null;
    return l !== null && this.now < l + MARGIN;
  }
  advance(t: number): void {
    this.now = Math.max(this.now, t);
    for (const c of this.registered) {
      if ((this.lease.get(c) ?? null) === null || this.live(c)) continue;
      this.lease.set(c, null);
      for (const [k, hs] of this.held) if (k.endsWith(`|${c}`)) for (const h of hs) h.alive = false;
    }
  }
  usage(q: Quota): [number, number] {
    let r = 0;
    let b = 0;
    for (const c of this.registered) {
      const [fr, fb] = this.floor(q, c);
      let ur = fr;
      let ub = fb;
      for (const h of this.held.get(`${q.key}|${c}`) ?? []) {
        ur = Math.max(ur, h.floorRate);
        ub = Math.max(ub, h.floorBurst);
        if (h.alive && this.live(c)) {
          ur = Math.max(ur, h.rate);
          ub = Math.max(ub, h.burst);
        }
      }
      r += ur;
      b += ub;
    }
    const free = K - Math.min(K, this.registered.length);
    const [fr, fb] = this.floor(q, null);
    return [r + free * fr, b + free * fb];
  }
  /** Applies a round; returns the error code it expects, or null (applied). */
  round(nowMs: number, leases: LeaseRenewal[], acks: GrantAck[], grants: Grant[]): string | null {
    for (const l of leases) if (!this.registered.includes(l.cellId)) return 'NOT_FOUND';
    for (const g of grants) {
      if (!this.registered.includes(g.cellId)) return 'NOT_FOUND';
      if (g.epoch <= this.epoch(g.key, g.cellId)) return 'CONFLICT';
    }
    const next = this.clone();
    next.advance(nowMs);
    for (const a of acks) {
      const hs = next.held.get(`${a.key}|${a.cellId}`);
      if (hs !== undefined && hs.at(-1)?.epoch === a.epoch) next.held.set(`${a.key}|${a.cellId}`, hs.slice(-1));
    }
    for (const l of leases)
      next.lease.set(l.cellId, Math.max(next.lease.get(l.cellId) ?? -Infinity, l.leaseExpiresAtMs));
    for (const g of grants) {
      const q = QUOTAS.find((x) => x.key === g.key) as Quota;
      const [fr, fb] = next.floor(q, g.cellId);
      const id = `${g.key}|${g.cellId}`;
      next.held.set(id, [
        ...(next.held.get(id) ?? []),
        { epoch: g.epoch, rate: g.rate, burst: g.burst, floorRate: fr, floorBurst: fb, alive: true },
      ]);
      next.lease.set(g.cellId, Math.max(next.lease.get(g.cellId) ?? -Infinity, g.leaseExpiresAtMs));
    }
    next.advance(next.now);
    for (const q of QUOTAS) {
      const [r, b] = next.usage(q);
      if (r > q.rate * (1 + BOUND_TOLERANCE) || b > q.burst * (1 + BOUND_TOLERANCE)) return 'QUOTA_EXCEEDED';
    }
    Object.assign(this, next);
    return null;
  }
}

// ---- random steps -------------------------------------------------------------------------------

const grantArb = fc.record({
  q: fc.nat({ max: QUOTAS.length - 1 }),
  cell: fc.nat({ max: CELLS.length - 1 }),
  rate: fc.integer({ min: 0, max: 120 }), // percent of the quota
  burst: fc.integer({ min: 0, max: 120 }),
  stale: fc.integer({ min: 0, max: 99 }).map((n) => n < 12),
  lease: fc.integer({ min: 0, max: 4000 }),
});
const ackArb = fc.record({
  q: fc.nat({ max: QUOTAS.length - 1 }),
  cell: fc.nat({ max: CELLS.length - 1 }),
  old: fc.boolean(),
});
const stepArb = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('round' as const),
      dt: fc.integer({ min: 0, max: 800 }),
      grants: fc.array(grantArb, { maxLength: 3 }),
      acks: fc.array(ackArb, { maxLength: 3 }),
      renew: fc.array(fc.nat({ max: CELLS.length - 1 }), { maxLength: 2 }),
    }),
  },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant('expire' as const), dt: fc.integer({ min: 0, max: 3000 }) }) },
  {
    weight: 1,
    arbitrary: fc.record({ kind: fc.constant('register' as const), cell: fc.nat({ max: CELLS.length - 1 }) }),
  },
);
type Step = typeof stepArb extends fc.Arbitrary<infer T> ? T : never;

function toRound(
  step: Extract<Step, { kind: 'round' }>,
  model: Model,
  ledger: Ledger,
): { nowMs: number; leases: LeaseRenewal[]; acks: GrantAck[]; grants: Grant[] } {
  const nowMs = model.now + step.dt;
  const seen = new Set<string>();
  const grants: Grant[] = [];
  for (const x of step.grants) {
    const q = QUOTAS[x.q] as Quota;
    const cellId = CELLS[x.cell] as string;
    if (seen.has(`${q.key}|${cellId}`)) continue;
    seen.add(`${q.key}|${cellId}`);
    const current = ledger.getSlice(q.key, cellId)?.epoch ?? 0;
    grants.push({
      key: q.key,
      cellId,
      rate: Math.round((q.rate * x.rate) / 100),
      burst: Math.round((q.burst * x.burst) / 100),
      epoch: x.stale ? Math.max(1, current) : current + 1,
      leaseExpiresAtMs: nowMs + x.lease,
    });
  }
  const acks: GrantAck[] = step.acks.map((a) => {
    const q = QUOTAS[a.q] as Quota;
    const cellId = CELLS[a.cell] as string;
    const e = ledger.getSlice(q.key, cellId)?.epoch ?? 0;
    return { key: q.key, cellId, epoch: Math.max(1, a.old ? e - 1 : e) };
  });
  const leases = [...new Set(step.renew)].map((c) => ({ cellId: CELLS[c] as string, leaseExpiresAtMs: nowMs + 3000 }));
  return { nowMs, leases, acks, grants };
}

void test('property: grants, acknowledgements, expiries and time never break the bound; a round is refused exactly when it would', () => {
  let refused = 0;
  let applied = 0;
  fc.assert(
    fc.property(fc.array(stepArb, { minLength: 1, maxLength: 60, size: 'medium' }), (steps) => {
      const ledger = new Ledger({ floorCells: K, skewMarginMs: MARGIN, assertInvariants: true });
      let index = 0;
      for (const c of SETUP) assert.ok(ledger.apply(c, ++index).ok);
      const model = new Model();
      for (const step of steps) {
        if (step.kind === 'register') {
          const cellId = CELLS[step.cell] as string;
          assert.ok(ledger.apply({ type: 'registerCell', cellId, nowMs: model.now }, ++index).ok);
          if (!model.registered.includes(cellId)) model.registered.push(cellId);
        } else if (step.kind === 'expire') {
          assert.ok(ledger.apply({ type: 'expireLeases', nowMs: model.now + step.dt }, ++index).ok);
          model.advance(model.now + step.dt);
        } else {
          const r = toRound(step, model, ledger);
          const before = ledger.snapshot();
          const expected = model.round(r.nowMs, r.leases, r.acks, r.grants);
          const got = ledger.apply({ type: 'reportAndGrant', ...r }, ++index);
          assert.equal(got.ok ? null : got.error.code, expected, got.ok ? 'applied' : got.error.message);
          if (!got.ok) {
            refused++;
            assertUnchanged(before, ledger);
          } else applied++;
        }
        // Both views agree on what every cell may be using, and it is within every quota.
        assert.equal(ledger.nowMs, model.now);
        for (const q of QUOTAS) {
          const s = ledger.getQuotaState(q.key);
          assert.ok(s);
          const [r, b] = model.usage(q);
          assert.ok(
            Math.abs(s.countedRate - r) <= 1e-9 * q.rate,
            `${q.key}: ledger counts ${s.countedRate}, model ${r}`,
          );
          assert.ok(
            Math.abs(s.countedBurst - b) <= 1e-9 * q.burst,
            `${q.key}: ledger counts burst ${s.countedBurst}, model ${b}`,
          );
          assert.ok(
            r <= q.rate * (1 + BOUND_TOLERANCE) && b <= q.burst * (1 + BOUND_TOLERANCE),
            `${q.key} over the bound`,
          );
        }
      }
      ledger.checkInvariants();
    }),
    { numRuns: 150 },
  );
  assert.ok(refused > 50 && applied > 50, `both outcomes exercised (refused ${refused}, applied ${applied})`);
});
