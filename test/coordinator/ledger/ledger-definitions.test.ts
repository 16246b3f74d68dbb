// The ledger as the one source of every definition an agent applies (issue 12): epochs that only
// grow for a (key, cell) across a delete and re-create; a deleted tenant's slices wound down by zero
// grants and then dropped (also from the snapshot); a changed definition re-granted to every cell at
// the new version, its old floor counted until acknowledged; quotas no agent can represent refused.
// Driven through the real ledger and the lease rounds' real grant policy (allocator + re-grants).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Ledger } from '../../../coordinator/ledger/ledger.js';
import type { Grant } from '../../../coordinator/ledger/ledger-commands.js';
import { TENANT_WIND_DOWN_FORMAT } from '../../../coordinator/ledger/ledger-commands.js';
import { allocatorPolicy } from '../../../coordinator/lease/grant-policy.js';
import { MAX_GCRA_WINDOW_S } from '../../../shared/gcra-window.js';
import { Driver } from './ledger-helpers.js';

const KEY = 'tenant/acme';
const TTL = 3000;

function setup(floorFraction = 0): Driver {
  const d = Driver.create({ floorCells: 2 });
  d.ok({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction });
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
  for (const cellId of ['a', 'b']) d.ok({ type: 'registerCell', cellId, nowMs: 0 });
  return d;
}

/** One lease round as the lease service runs it: renewals for the reporting cells, their acks, the policy's grants. */
function round(
  d: Driver,
  nowMs: number,
  demand: Record<string, number>,
  acks: { key: string; cellId: string; epoch: number }[] = [],
): Grant[] {
  const reported = new Set(Object.keys(demand));
  const byKey = new Map([[KEY, new Map(Object.entries(demand).filter(([, v]) => v > 0))]]);
  const grants = allocatorPolicy(d.ledger, { reported, byKey, acks, leaseTtlMs: TTL }, nowMs);
  d.ok({
    type: 'reportAndGrant',
    nowMs,
    leases: [...reported].map((cellId) => ({ cellId, leaseExpiresAtMs: nowMs + TTL })),
    acks,
    grants,
  });
  return grants;
}

function ackAll(grants: readonly Grant[]): { key: string; cellId: string; epoch: number }[] {
  return grants.map((g) => ({ key: g.key, cellId: g.cellId, epoch: g.epoch }));
}

void test('finding 6: epochs only grow for a (key, cell), across a delete and re-create', () => {
  const d = setup();
  d.ok({
    type: 'reportAndGrant',
    nowMs: 0,
    leases: [{ cellId: 'a', leaseExpiresAtMs: TTL }],
    grants: [{ key: KEY, cellId: 'a', rate: 50, burst: 50, epoch: 1, leaseExpiresAtMs: TTL }],
  });
  d.ok({
    type: 'reportAndGrant',
    nowMs: 10,
    grants: [{ key: KEY, cellId: 'a', rate: 0, burst: 0, epoch: 2, leaseExpiresAtMs: TTL }],
  });
  d.ok({ type: 'reportAndGrant', nowMs: 20, acks: [{ key: KEY, cellId: 'a', epoch: 2 }] });
  // The agent holds epoch 2 (a zero grant, acknowledged); the tenant is deleted: nothing on the slice
  // is counted any more, so it is dropped at once.
  d.ok({ type: 'deleteTenant', id: 'acme' });
  assert.equal(d.ledger.activeQuotaKeys().length, 0);
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
  // A grant proposed as the slice's first (epoch 1) continues above every epoch the cell held.
  d.ok({
    type: 'reportAndGrant',
    nowMs: 30,
    leases: [{ cellId: 'a', leaseExpiresAtMs: 30 + TTL }],
    grants: [{ key: KEY, cellId: 'a', rate: 50, burst: 50, epoch: 1, leaseExpiresAtMs: 30 + TTL }],
  });
  const s = d.ledger.getSlice(KEY, 'a');
  assert.ok(
    s !== undefined && s.epoch > 2,
    `the re-created tenant's epoch on cell a is above the 2 the agent holds: ${s?.epoch}`,
  );
  // And it survives a snapshot.
  assert.equal(Ledger.restore(d.ledger.snapshot()).getSlice(KEY, 'a')?.epoch, s.epoch);
});

void test("finding 7: a deleted tenant's slices get zero grants; once acknowledged they are dropped from the ledger and its snapshot", () => {
  const d = setup(0.5);
  let grants = round(d, 0, { a: 60, b: 35 });
  grants = round(d, 100, { a: 60, b: 35 }, ackAll(grants));
  round(d, 200, { a: 60, b: 35 }, ackAll(grants));
  assert.ok((d.ledger.getSlice(KEY, 'a')?.rate ?? 0) > 25, 'cell a holds a grant above its floor');
  d.ok({ type: 'deleteTenant', id: 'acme' });
  assert.deepEqual(d.ledger.activeQuotaKeys(), [KEY], 'still counted: the cells may use the grants');
  const windDown = round(d, 300, { a: 60, b: 35 });
  assert.deepEqual(
    windDown.map((g) => [g.cellId, g.rate, g.burst]).sort(),
    [
      ['a', 0, 0],
      ['b', 0, 0],
    ],
    'a zero grant per cell',
  );
  assert.ok(
    windDown.every((g) => d.ledger.getSlice(g.key, g.cellId)?.version === 0),
    'stamped as a wind-down grant',
  );
  round(d, 400, { a: 60, b: 35 }, ackAll(windDown));
  assert.deepEqual(d.ledger.activeQuotaKeys(), [], 'dropped once every cell acknowledged its zero grant');
  assert.deepEqual(Ledger.restore(d.ledger.snapshot()).activeQuotaKeys(), [], 'and gone from the snapshot');
  assert.deepEqual(round(d, 500, { a: 60, b: 35 }), [], 'nothing more to send');
});

void test('finding 2: a changed definition is re-granted at the new version; the old floor stays counted until the cell acknowledges it', () => {
  const d = setup(0.5);
  let grants = round(d, 0, { a: 40, b: 30 });
  round(d, 100, { a: 40, b: 30 }, ackAll(grants));
  const before = d.ledger.getSlice(KEY, 'a');
  assert.equal(before?.floorRate, 25);
  d.ok({ type: 'putTier', name: 'gold', rate: 40, burst: 40, floorFraction: 0.5 });
  const version = d.ledger.definition(KEY)?.version ?? 0;
  grants = round(d, 200, { a: 10, b: 10 });
  assert.ok(
    ['a', 'b'].every((c) => (d.ledger.getSlice(KEY, c)?.epoch ?? 0) > 0),
    'both cells hold slices',
  );
  for (const cellId of ['a', 'b']) {
    const g = grants.find((x) => x.cellId === cellId);
    assert.ok(g !== undefined, `cell ${cellId} is re-granted`);
    const s = d.ledger.getSlice(KEY, cellId);
    assert.equal(s?.version, version, 'stamped with the new definition');
    assert.equal(s?.floorRate, 10, 'with the new floor');
    assert.ok((s?.countedRate ?? 0) >= 25, `the old floor (25) is counted until acknowledged: ${s?.countedRate}`);
  }
  grants = round(d, 300, { a: 10, b: 10 }, ackAll(grants));
  round(d, 400, { a: 10, b: 10 }, ackAll(grants));
  for (const cellId of ['a', 'b']) {
    const s = d.ledger.getSlice(KEY, cellId);
    assert.ok(
      s !== undefined && s.countedRate <= 20 + 1e-9,
      `acknowledged: counted at the new numbers: ${s?.countedRate}`,
    );
  }
});

void test('finding 4: a quota whose GCRA window no agent can represent is refused, naming the limit', () => {
  const d = Driver.create();
  const msg = d.err({ type: 'putTier', name: 'huge', rate: 1, burst: 1e8 }, 'INVALID');
  assert.match(msg, /MAX_GCRA_WINDOW_S/);
  assert.match(msg, new RegExp(String(MAX_GCRA_WINDOW_S)));
  d.ok({ type: 'putTier', name: 'gold', rate: 1, burst: 1000 });
  assert.match(
    d.err({ type: 'putTenant', id: 'acme', tier: 'gold', burst: 1e8 }, 'INVALID'),
    /tenant acme: burst\/rate/,
  );
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold', burst: 1000, rate: 1 });
  d.ok({ type: 'putTenant', id: 'slow', tier: 'gold', burst: 5e7 });
  // Lowering the tier's rate would make a tenant's overrides unrepresentable: refused too.
  assert.match(d.err({ type: 'putTier', name: 'gold', rate: 0.1, burst: 1000 }, 'INVALID'), /tenant slow/);
});

void test('unknownTenant tier:NAME: an unknown tenant is granted, floored and counted as a tenant of NAME; the tier must exist and cannot be deleted while named; leaving the policy winds the slices down', () => {
  const d = setup(0.5);
  const KEY2 = 'tenant/stranger';
  // The tier must exist.
  assert.match(d.err({ type: 'putSettings', unknownTenant: 'tier:nope' }, 'NOT_FOUND'), /tier nope does not exist/);
  assert.equal(
    d.apply({ type: 'putSettings', unknownTenant: 'tier:' } as never).ok,
    false,
    'an empty tier name is invalid',
  );
  d.ok({ type: 'putSettings', unknownTenant: 'tier:gold' });
  assert.equal(d.ledger.settings.unknownTenant, 'tier:gold');
  // The tier the policy names cannot be deleted (a 409 at the admin API), even with no tenant on it.
  d.ok({ type: 'putTier', name: 'spare', rate: 10, burst: 10 });
  d.ok({ type: 'putSettings', unknownTenant: 'tier:spare' });
  assert.match(d.err({ type: 'deleteTier', name: 'spare' }, 'CONFLICT'), /unknown-tenant policy/);
  d.ok({ type: 'putSettings', unknownTenant: 'tier:gold' });
  d.ok({ type: 'deleteTier', name: 'spare' });
  // The stranger has gold's quota; grants beyond it are refused like a tenant's.
  assert.deepEqual(d.ledger.getQuota(KEY2), d.ledger.getQuota(KEY));
  const over = d.apply({
    type: 'reportAndGrant',
    nowMs: 10,
    leases: [{ cellId: 'a', leaseExpiresAtMs: 10 + TTL }],
    grants: [{ key: KEY2, cellId: 'a', rate: 80, burst: 80, epoch: 1, leaseExpiresAtMs: 10 + TTL }],
  });
  assert.equal(over.ok ? '' : over.error.code, 'QUOTA_EXCEEDED', "b's floor (25) + 80 > 100");
  const byKey = new Map([[KEY2, new Map([['a', 500]])]]);
  const grants = allocatorPolicy(d.ledger, { reported: new Set(['a']), byKey, acks: [], leaseTtlMs: TTL }, 20);
  assert.ok(
    grants.some((g) => g.key === KEY2 && g.rate > 0),
    `granted: ${JSON.stringify(grants)}`,
  );
  d.ok({ type: 'reportAndGrant', nowMs: 20, leases: [{ cellId: 'a', leaseExpiresAtMs: 20 + TTL }], grants });
  const s = d.ledger.getSlice(KEY2, 'a');
  assert.equal(s?.floorRate, 25, 'the floor of a gold tenant: 0.5 × 100 / 2 cells');
  assert.ok((s?.rate ?? 0) + 25 <= 100 + 1e-9);
  // Lowering gold lowers the stranger's quota too: its slices are re-granted at the new version.
  d.ok({ type: 'putTier', name: 'gold', rate: 40, burst: 40, floorFraction: 0.5 });
  assert.equal(d.ledger.getQuota(KEY2)?.rate, 40);
  assert.ok(d.ledger.staleSliceKeys('a').includes(KEY2), 'stale at the old definition');
  // Leaving the policy: the stranger's quota is gone, its slices get zero wind-down grants and are dropped once acknowledged.
  d.ok({ type: 'putSettings', unknownTenant: 'deny' });
  assert.equal(d.ledger.getQuota(KEY2), undefined);
  assert.ok(d.ledger.staleSliceKeys('a').includes(KEY2), 'to be wound down');
  assert.equal(d.ledger.definition(KEY2), undefined);
  // A snapshot keeps the policy and its version.
  d.ok({ type: 'putSettings', unknownTenant: 'tier:gold' });
  const restored = Ledger.restore(d.ledger.snapshot(), { assertInvariants: true });
  assert.deepEqual(restored.getQuota(KEY2), d.ledger.getQuota(KEY2));
  assert.equal(restored.settings.unknownTenant, 'tier:gold');
});

void test('retireImplicitTenants winds an implicit tenant down as a deletion: counted until its last slice is dropped, then an implicit tenant again; a defined tenant is left alone', () => {
  const d = setup(0.5);
  const S = 'tenant/stranger';
  d.ok({ type: 'putSettings', unknownTenant: 'tier:gold' });
  const grant = (nowMs: number, key: string, cellId: string, rate: number, epoch: number): void => {
    d.ok({
      type: 'reportAndGrant',
      nowMs,
      leases: [{ cellId, leaseExpiresAtMs: nowMs + TTL }],
      grants: [{ key, cellId, rate, burst: rate, epoch, leaseExpiresAtMs: nowMs + TTL }],
    });
  };
  grant(10, S, 'a', 30, 1);
  grant(10, S, 'b', 20, 1);
  assert.equal(d.ledger.implicitTenantCount, 1);
  // A defined tenant and a key nobody holds are not implicit tenants: left alone.
  assert.deepEqual(d.ok({ type: 'retireImplicitTenants', keys: [KEY, 'tenant/nobody'] }), {
    kind: 'implicitRetired',
    retired: 0,
    ignored: 2,
  });
  assert.notEqual(d.ledger.getQuota(KEY), undefined);
  d.ok({ type: 'retireImplicitTenants', keys: [S] });
  assert.equal(d.ledger.getQuota(S), undefined, 'no quota while winding down');
  assert.equal(d.ledger.isImplicitTenant(S), false);
  assert.equal(d.ledger.implicitTenantCount, 1, 'still counted: both cells may use their grants');
  // Only zero grants are accepted for it now.
  d.err(
    {
      type: 'reportAndGrant',
      nowMs: 20,
      grants: [{ key: S, cellId: 'a', rate: 10, burst: 10, epoch: 2, leaseExpiresAtMs: 20 + TTL }],
    },
    'NOT_FOUND',
  );
  // Cell a acknowledges its zero grant: its slice goes. Cell b goes silent past its lease (TTL + margin): its grant is
  // released but the floor stamped on it stays counted until b acknowledges its zero grant, as for a deletion.
  grant(20, S, 'a', 0, 2);
  d.ok({ type: 'reportAndGrant', nowMs: 30, acks: [{ key: S, cellId: 'a', epoch: 2 }] });
  assert.equal(d.ledger.getSlice(S, 'a'), undefined);
  assert.equal(d.ledger.implicitTenantCount, 1, "b's grant is still counted");
  const mid = Ledger.restore(d.ledger.snapshot(), { assertInvariants: true });
  assert.equal(mid.getQuota(S), undefined, 'the snapshot keeps the wind-down');
  const expired = 10 + TTL + 1000 + 1;
  d.ok({ type: 'expireLeases', nowMs: expired });
  assert.equal(d.ledger.implicitTenantCount, 1, "b's floor is still counted");
  grant(expired + 10, S, 'b', 0, 2);
  d.ok({ type: 'reportAndGrant', nowMs: expired + 20, acks: [{ key: S, cellId: 'b', epoch: 2 }] });
  assert.equal(d.ledger.holdsSlices(S), false);
  assert.equal(d.ledger.implicitTenantCount, 0);
  // Gone: asked for again it is a new implicit tenant, its epochs above every old one.
  assert.equal(d.ledger.getQuota(S)?.rate, 100);
  grant(expired + 30, S, 'a', 10, 1);
  assert.ok((d.ledger.getSlice(S, 'a')?.epoch ?? 0) > 2);
});

void test('unknownTenant tier:NAME: a deleted tenant of another tier winds down (not an implicit tenant by itself: the bound); taken back, its old grants are counted at the ceiling until acknowledged', () => {
  const d = Driver.create({ floorCells: 2 });
  d.ok({ type: 'raiseCommandFormat', format: TENANT_WIND_DOWN_FORMAT }); // the log at format 5 (the semantics tested)
  d.ok({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0 });
  d.ok({ type: 'putTier', name: 'platinum', rate: 1000, burst: 1000, floorFraction: 0 });
  d.ok({ type: 'putTenant', id: 'acme', tier: 'platinum' });
  for (const cellId of ['a', 'b']) d.ok({ type: 'registerCell', cellId, nowMs: 0 });
  d.ok({ type: 'putSettings', unknownTenant: 'tier:gold' });
  d.ok({
    type: 'reportAndGrant',
    nowMs: 10,
    leases: ['a', 'b'].map((cellId) => ({ cellId, leaseExpiresAtMs: 10 + TTL })),
    grants: ['a', 'b'].map((cellId) => ({ key: KEY, cellId, rate: 400, burst: 400, epoch: 1, leaseExpiresAtMs: TTL })),
  });
  // The ledger asserts its invariants on every command (Driver): the delete is accepted and consistent.
  d.ok({ type: 'deleteTenant', id: 'acme' });
  // Finding 3: not an implicit tenant of gold by itself — that would bypass --max-implicit-tenants.
  assert.equal(d.ledger.isImplicitTenant(KEY), false);
  assert.equal(d.ledger.isWindingDown(KEY), true);
  assert.equal(d.ledger.getQuota(KEY), undefined);
  assert.equal(d.ledger.implicitTenantCount, 1, 'counted while its slices are held');
  // The lease leader takes it back (cells still ask for it, within the bound).
  assert.deepEqual(d.ok({ type: 'reviveImplicitTenants', keys: [KEY] }), {
    kind: 'implicitRevived',
    revived: 1,
    ignored: 0,
  });
  assert.equal(d.ledger.isImplicitTenant(KEY), true);
  const after = d.ledger.getQuotaState(KEY);
  assert.equal(after?.rate, 100, 'the tier of the policy');
  assert.ok((after?.ceilingRate ?? 0) >= 800, 'the old grants are counted until acknowledged');
  Ledger.restore(d.ledger.snapshot(), { assertInvariants: true }); // its snapshot restores
  // The lease rounds shrink the old grants; once the cells acknowledge, the tier's quota holds.
  let grants = round(d, 20, { a: 500, b: 500 });
  assert.ok(grants.length > 0, 'the rounds are not refused');
  for (let t = 30; t < 200; t += 10) grants = round(d, t, { a: 500, b: 500 }, ackAll(grants));
  const settled = d.ledger.getQuotaState(KEY);
  assert.ok((settled?.countedRate ?? Infinity) <= 100 + 1e-9, `counted ${settled?.countedRate} against 100`);
  assert.equal(settled?.ceilingRate ?? 100, 100, 'the ceiling is back at the quota');
});

void test('unknownTenant set to tier:NAME finds a deleted tenant still winding down: it keeps winding down (the bound), and leaving the policy forgets the set', () => {
  const d = setup(0.5);
  d.ok({ type: 'raiseCommandFormat', format: TENANT_WIND_DOWN_FORMAT });
  d.ok({
    type: 'reportAndGrant',
    nowMs: 10,
    leases: [{ cellId: 'a', leaseExpiresAtMs: 10 + TTL }],
    grants: [{ key: KEY, cellId: 'a', rate: 40, burst: 40, epoch: 1, leaseExpiresAtMs: 10 + TTL }],
  });
  d.ok({ type: 'deleteTenant', id: 'acme' }); // under deny: winding down, no quota
  d.ok({ type: 'putSettings', unknownTenant: 'tier:gold' });
  assert.equal(d.ledger.isImplicitTenant(KEY), false, 'not an implicit tenant without the leader taking it');
  assert.equal(d.ledger.isWindingDown(KEY), true);
  assert.equal(d.ledger.getQuota(KEY), undefined);
  d.ok({ type: 'putSettings', unknownTenant: 'deny' });
  assert.equal(d.ledger.windingDownCount, 0);
  assert.equal(d.ledger.holdsSlices(KEY), true, 'its slice still winds down');
});

void test('finding 1: an implicit tenant is retirable only while every slice holder has a live lease; a wind-down stuck on a cut-off cell is cancelled by reviveImplicitTenants, the ceiling covering what the cut-off cell may still use', () => {
  const d = setup(0.5); // gold: 100/s, floor fraction 0.5, two floor slots: a floor of 25/s per cell
  const S = 'tenant/stranger';
  d.ok({ type: 'putSettings', unknownTenant: 'tier:gold' });
  const grant = (nowMs: number, cellId: string, rate: number, epoch: number, acks: number[] = []): void => {
    d.ok({
      type: 'reportAndGrant',
      nowMs,
      leases: [{ cellId, leaseExpiresAtMs: nowMs + TTL }],
      acks: acks.map((epoch) => ({ key: S, cellId, epoch })),
      grants: [{ key: S, cellId, rate, burst: rate, epoch, leaseExpiresAtMs: nowMs + TTL }],
    });
  };
  grant(10, 'a', 30, 1);
  grant(10, 'b', 20, 1);
  assert.equal(d.ledger.retirable(S), true, 'both holders are live');
  assert.equal(d.ledger.retirable(KEY), false, 'a defined tenant is never retired');
  // Cell b is cut off: past its lease (TTL + the 1 s margin) its grant is released, its stamped floor is not.
  const late = 10 + TTL + 1000 + 1;
  grant(late, 'a', 30, 2, [1]);
  assert.equal(d.ledger.retirable(S), false, "b's floor would keep the wind-down going until b acknowledges");
  // A wind-down that started while b was live and then got stuck on it (b cut off before acknowledging).
  const d2 = setup(0.5);
  d2.ok({ type: 'putSettings', unknownTenant: 'tier:gold' });
  for (const [cellId, rate] of [
    ['a', 30],
    ['b', 20],
  ] as const)
    d2.ok({
      type: 'reportAndGrant',
      nowMs: 10,
      leases: [{ cellId, leaseExpiresAtMs: 10 + TTL }],
      grants: [{ key: S, cellId, rate, burst: rate, epoch: 1, leaseExpiresAtMs: 10 + TTL }],
    });
  assert.equal(d2.ledger.retirable(S), true);
  d2.ok({ type: 'retireImplicitTenants', keys: [S] });
  // a takes its zero grant and acknowledges it (its slice goes); b never does, and its lease ends.
  d2.ok({
    type: 'reportAndGrant',
    nowMs: 20,
    leases: [{ cellId: 'a', leaseExpiresAtMs: 20 + TTL }],
    grants: [{ key: S, cellId: 'a', rate: 0, burst: 0, epoch: 2, leaseExpiresAtMs: 20 + TTL }],
  });
  d2.ok({ type: 'reportAndGrant', nowMs: 30, acks: [{ key: S, cellId: 'a', epoch: 2 }] });
  d2.ok({ type: 'expireLeases', nowMs: late });
  assert.equal(d2.ledger.holdsSlices(S), true, "stuck: b's floor is counted until b acknowledges");
  assert.equal(d2.ledger.getQuota(S), undefined, 'no quota while winding down: refused on every cell');
  // Demand comes back at a: the leader takes the key back. It has the tier's quota again, b's floor still counted.
  d2.ok({ type: 'reviveImplicitTenants', keys: [S, 'tenant/nobody'] });
  const back = d2.ledger.getQuotaState(S);
  assert.equal(back?.rate, 100);
  const b = back?.cells.find((c) => c.cellId === 'b');
  assert.equal(b?.countedRate, 25, "b's stamped floor is counted");
  assert.ok((back?.countedRate ?? Infinity) <= (back?.ceilingRate ?? 0) + 1e-9);
  // The healthy cell is granted again (a new slice, its epoch above the one it dropped), within the bound.
  d2.ok({
    type: 'reportAndGrant',
    nowMs: late + 10,
    leases: [{ cellId: 'a', leaseExpiresAtMs: late + 10 + TTL }],
    grants: [{ key: S, cellId: 'a', rate: 50, burst: 50, epoch: 1, leaseExpiresAtMs: late + 10 + TTL }],
  });
  assert.ok((d2.ledger.getSlice(S, 'a')?.epoch ?? 0) > 2);
  d2.err(
    {
      type: 'reportAndGrant',
      nowMs: late + 20,
      leases: [{ cellId: 'a', leaseExpiresAtMs: late + 20 + TTL }],
      grants: [{ key: S, cellId: 'a', rate: 80, burst: 80, epoch: 9, leaseExpiresAtMs: late + 20 + TTL }],
    },
    'QUOTA_EXCEEDED',
  );
  const restored = Ledger.restore(d2.ledger.snapshot(), { assertInvariants: true });
  assert.deepEqual(restored.getQuotaState(S), d2.ledger.getQuotaState(S));
});

void test('a deleted tenant revived before its zero grants reached the cells is re-granted at the tier of the policy: its parent cap and floors, not the old stamped definition', () => {
  const d = Driver.create({ floorCells: 2 });
  d.ok({ type: 'raiseCommandFormat', format: TENANT_WIND_DOWN_FORMAT });
  d.ok({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0.5 });
  d.ok({ type: 'putTierCap', tier: 'gold', rate: 1000, burst: 1000 });
  d.ok({ type: 'putTier', name: 'platinum', rate: 1000, burst: 1000, floorFraction: 0 });
  for (const cellId of ['a', 'b']) d.ok({ type: 'registerCell', cellId, nowMs: 0 });
  d.ok({ type: 'putSettings', unknownTenant: 'tier:gold' });
  // Created after the policy: its definition's version is above the implicit tenants' of gold.
  d.ok({ type: 'putTenant', id: 'acme', tier: 'platinum' });
  const grants = round(d, 10, { a: 40, b: 40 });
  round(d, 20, { a: 40, b: 40 }, ackAll(grants));
  assert.equal(d.ledger.getSlice(KEY, 'a')?.floorRate, 0, 'on platinum: no floor');
  d.ok({ type: 'deleteTenant', id: 'acme' });
  d.ok({ type: 'reviveImplicitTenants', keys: [KEY] }); // cells asked for it again before any zero grant went out
  assert.deepEqual(d.ledger.definition(KEY)?.parent, 'tier/gold');
  for (const cellId of ['a', 'b']) assert.deepEqual(d.ledger.staleSliceKeys(cellId), [KEY], `${cellId} is re-granted`);
  // The lease round re-grants it (within gold's quota, the same numbers): gold's floor and version stamped.
  const regrants = round(d, 30, { a: 40, b: 40 });
  assert.deepEqual(
    regrants.filter((g) => g.key === KEY).map((g) => g.cellId),
    ['a', 'b'],
  );
  for (const cellId of ['a', 'b']) {
    const s = d.ledger.getSlice(KEY, cellId);
    assert.equal(s?.floorRate, 25, `${cellId}: gold's floor (0.5 × 100 / 2)`);
    assert.equal(s?.version, d.ledger.definition(KEY)?.version);
  }
  assert.deepEqual(d.ledger.staleSliceKeys('a'), []);
});
