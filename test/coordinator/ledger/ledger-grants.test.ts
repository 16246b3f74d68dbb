import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Ledger } from '../../../coordinator/ledger/ledger.js';
import type { QuotaState } from '../../../coordinator/ledger/ledger.js';
import type { Grant } from '../../../coordinator/ledger/ledger-commands.js';
import { Driver } from './ledger-helpers.js';

const KEY = 'tenant/acme';
const LEASE = 3000;
const MARGIN = 1000;

/** gold: 1000 req/s, burst 1000, floors 20% over 2 expected cells (100 each); cells a, b (slots) and c (none). */
function setup(): Driver {
  const d = Driver.create({ floorCells: 2, skewMarginMs: MARGIN });
  d.ok({ type: 'putTier', name: 'gold', rate: 1000, burst: 1000, floorFraction: 0.2 });
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
  for (const c of ['a', 'b', 'c']) d.ok({ type: 'registerCell', cellId: c, nowMs: 0 });
  return d;
}

function g(cellId: string, rate: number, epoch: number, extra: Partial<Grant> = {}): Grant {
  return { key: KEY, cellId, rate, burst: rate, epoch, leaseExpiresAtMs: LEASE, ...extra };
}

function state(d: Driver, key = KEY): QuotaState {
  const s = d.ledger.getQuotaState(key);
  assert.ok(s);
  return s;
}

function counted(d: Driver, key = KEY): Record<string, number> {
  return Object.fromEntries(state(d, key).cells.map((c) => [c.cellId, c.countedRate]));
}

void test('grants within the quota are applied; a round that would exceed it is refused and changes nothing', () => {
  const d = setup();
  d.ok({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 500, 1), g('b', 300, 1)] });
  assert.deepEqual(counted(d), { a: 500, b: 300, c: 0 });
  assert.equal(state(d).countedRate, 800);
  const msg = d.err(
    { type: 'reportAndGrant', nowMs: 10, acks: [{ key: KEY, cellId: 'a', epoch: 1 }], grants: [g('c', 300, 1)] },
    'QUOTA_EXCEEDED',
  );
  assert.match(msg, /tenant\/acme/);
  assert.equal(d.ledger.nowMs, 0, 'the refused round did not advance the clock');
  d.ok({ type: 'reportAndGrant', nowMs: 10, grants: [g('c', 200, 1)] });
  assert.equal(state(d).countedRate, 1000);
  // Burst is bounded separately.
  d.err({ type: 'reportAndGrant', nowMs: 10, grants: [g('c', 200, 2, { burst: 201 })] }, 'QUOTA_EXCEEDED');
});

void test('a grant below the floor is counted at the floor; unregistered floor slots are reserved', () => {
  const d = Driver.create({ floorCells: 3, skewMarginMs: MARGIN });
  d.ok({ type: 'putTier', name: 'gold', rate: 900, burst: 900, floorFraction: 1 / 3 });
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
  d.ok({ type: 'registerCell', cellId: 'a', nowMs: 0 });
  d.ok({ type: 'registerCell', cellId: 'b', nowMs: 0 });
  assert.equal(state(d).unregisteredSlots, 1);
  d.ok({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 0, 1), g('b', 700, 1)] });
  assert.deepEqual(counted(d), { a: 100, b: 700 });
  assert.ok(Math.abs(state(d).countedRate - 900) < 1e-9, 'a + b + the free slot (100)');
  d.err({ type: 'reportAndGrant', nowMs: 0, grants: [g('b', 701, 2)] }, 'QUOTA_EXCEEDED');
  // A third cell takes the free slot: nobody's floor changes, the sum stays.
  d.ok({ type: 'registerCell', cellId: 'c', nowMs: 1 });
  assert.deepEqual(counted(d), { a: 100, b: 700, c: 100 });
  assert.equal(state(d).unregisteredSlots, 0);
});

void test('a shrink keeps counting the old grant until the cell acknowledges it', () => {
  const d = setup();
  d.ok({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 500, 1), g('b', 300, 1)] });
  d.ok({ type: 'reportAndGrant', nowMs: 100, grants: [g('a', 200, 2)] });
  assert.deepEqual(counted(d), { a: 500, b: 300, c: 0 }, 'a may still be on its old grant');
  assert.equal(state(d).cells[0]?.acknowledged, false);
  d.err({ type: 'reportAndGrant', nowMs: 200, grants: [g('b', 600, 2)] }, 'QUOTA_EXCEEDED');
  // A stale acknowledgement (epoch 1) releases nothing.
  d.err(
    { type: 'reportAndGrant', nowMs: 200, acks: [{ key: KEY, cellId: 'a', epoch: 1 }], grants: [g('b', 600, 2)] },
    'QUOTA_EXCEEDED',
  );
  // Shrink first: the acknowledgement in the same round frees the capacity the grant uses.
  const r = d.ok({
    type: 'reportAndGrant',
    nowMs: 200,
    acks: [{ key: KEY, cellId: 'a', epoch: 2 }],
    grants: [g('b', 600, 2)],
  });
  assert.equal(r.kind === 'round' && r.acked, 1);
  assert.deepEqual(counted(d), { a: 200, b: 600, c: 0 });
});

void test('an unacknowledged grant is released only once its lease has surely expired (expiry + skew margin)', () => {
  const d = setup();
  d.ok({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 500, 1), g('b', 400, 1)] });
  d.ok({ type: 'reportAndGrant', nowMs: 100, grants: [g('a', 0, 2)] });
  d.ok({ type: 'expireLeases', nowMs: LEASE + MARGIN - 1 });
  assert.equal(counted(d)['a'], 500);
  d.err(
    { type: 'reportAndGrant', nowMs: LEASE + MARGIN - 1, grants: [g('c', 200, 1, { leaseExpiresAtMs: 9000 })] },
    'QUOTA_EXCEEDED',
  );
  const r = d.ok({ type: 'expireLeases', nowMs: LEASE + MARGIN });
  assert.deepEqual(r, { kind: 'expired', nowMs: LEASE + MARGIN, expiredCells: ['a', 'b'] });
  assert.deepEqual(counted(d), { a: 100, b: 100, c: 0 }, 'expired cells are on their floors');
  assert.equal(d.ledger.getCell('a')?.leaseExpiresAtMs, null);
  // Renewing the lease later does not bring the released grants back.
  d.ok({ type: 'reportAndGrant', nowMs: 5000, leases: [{ cellId: 'a', leaseExpiresAtMs: 8000 }] });
  assert.deepEqual(counted(d), { a: 100, b: 100, c: 0 });
  assert.equal(d.ledger.getCell('a')?.lastReportAtMs, 5000);
  d.ok({ type: 'reportAndGrant', nowMs: 5000, grants: [g('c', 800, 1, { leaseExpiresAtMs: 8000 })] });
  // A renewal keeps a grant alive past its own lease.
  d.ok({ type: 'reportAndGrant', nowMs: 8000, leases: [{ cellId: 'c', leaseExpiresAtMs: 11000 }] });
  d.ok({ type: 'expireLeases', nowMs: 9500 });
  assert.equal(counted(d)['c'], 800);
});

void test('the time in a round comes from the command; the clock never runs backwards', () => {
  const d = setup();
  d.ok({ type: 'expireLeases', nowMs: 10_000 });
  d.ok({ type: 'reportAndGrant', nowMs: 5_000, grants: [g('a', 500, 1, { leaseExpiresAtMs: 12_000 })] });
  assert.equal(d.ledger.nowMs, 10_000);
  // A grant whose lease has already surely expired counts for nothing (the agent will not use it).
  const r = d.ok({ type: 'reportAndGrant', nowMs: 10_000, grants: [g('b', 900, 1, { leaseExpiresAtMs: 1_000 })] });
  assert.deepEqual(r.kind === 'round' ? r.expiredCells : null, ['b']);
  assert.deepEqual(counted(d), { a: 500, b: 100, c: 0 });
});

void test('round validation: unknown cells and quotas, stale epochs, duplicates', () => {
  const d = setup();
  d.ok({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 100, 5)] });
  d.err({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 100, 5)] }, 'CONFLICT');
  d.err({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 100, 4)] }, 'CONFLICT');
  d.err({ type: 'reportAndGrant', nowMs: 0, grants: [g('zz', 100, 1)] }, 'NOT_FOUND');
  d.err({ type: 'reportAndGrant', nowMs: 0, grants: [g('b', 100, 1, { key: 'tenant/nobody' })] }, 'NOT_FOUND');
  d.err({ type: 'reportAndGrant', nowMs: 0, leases: [{ cellId: 'zz', leaseExpiresAtMs: 1 }] }, 'NOT_FOUND');
  d.err({ type: 'reportAndGrant', nowMs: 0, grants: [g('b', 1, 1), g('b', 2, 2)] }, 'INVALID');
  d.err(
    {
      type: 'reportAndGrant',
      nowMs: 0,
      leases: [
        { cellId: 'a', leaseExpiresAtMs: 1 },
        { cellId: 'a', leaseExpiresAtMs: 2 },
      ],
    },
    'INVALID',
  );
  // Unknown or mismatched acknowledgements are ignored, not errors.
  const r = d.ok({
    type: 'reportAndGrant',
    nowMs: 0,
    acks: [
      { key: KEY, cellId: 'b', epoch: 1 },
      { key: 'tenant/x', cellId: 'a', epoch: 1 },
      { key: KEY, cellId: 'a', epoch: 9 },
    ],
  });
  assert.ok(r.kind === 'round' && r.acked === 0 && r.ignoredAcks === 3);
});

void test('lowering a quota: nothing is revoked by fiat, only shrinks are accepted until the cells fit the new limit', () => {
  const d = setup();
  d.ok({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 500, 1), g('b', 300, 1), g('c', 200, 1)] });
  d.ok({ type: 'putTier', name: 'gold', rate: 500, burst: 1000, floorFraction: 0.2 });
  let s = state(d);
  assert.equal(s.rate, 500);
  assert.equal(s.ceilingRate, 1000, 'the cells may still use 1000');
  d.err({ type: 'reportAndGrant', nowMs: 10, grants: [g('c', 201, 2)] }, 'QUOTA_EXCEEDED');
  d.ok({ type: 'reportAndGrant', nowMs: 10, grants: [g('a', 250, 2), g('b', 150, 2), g('c', 100, 2)] });
  assert.equal(state(d).ceilingRate, 1000);
  // Acknowledgements and growth in the same round: the freed capacity may not be handed out above the new limit.
  d.err(
    { type: 'reportAndGrant', nowMs: 20, acks: [{ key: KEY, cellId: 'a', epoch: 2 }], grants: [g('c', 300, 3)] },
    'QUOTA_EXCEEDED',
  );
  d.ok({ type: 'reportAndGrant', nowMs: 20, acks: [{ key: KEY, cellId: 'a', epoch: 2 }] });
  s = state(d);
  assert.equal(s.ceilingRate, 750, 'the ceiling ratchets down as old grants are released');
  d.ok({
    type: 'reportAndGrant',
    nowMs: 30,
    acks: [
      { key: KEY, cellId: 'b', epoch: 2 },
      { key: KEY, cellId: 'c', epoch: 2 },
    ],
  });
  s = state(d);
  assert.equal(s.countedRate, 500);
  assert.equal(s.ceilingRate, 500, 'the transition is over');
  d.err({ type: 'reportAndGrant', nowMs: 40, grants: [g('c', 101, 3)] }, 'QUOTA_EXCEEDED');
  // Raising it again is immediate.
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold', rate: 2000, burst: 2000 });
  d.ok({ type: 'reportAndGrant', nowMs: 40, grants: [g('c', 1500, 3)] });
});

void test('a floor shrink is counted at the old floor until acknowledged, even after the lease expired', () => {
  const d = setup();
  d.ok({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 100, 1)] });
  assert.equal(state(d).cells[0]?.floorRate, 100);
  d.ok({ type: 'putTier', name: 'gold', rate: 1000, burst: 1000, floorFraction: 0.1 });
  d.ok({ type: 'expireLeases', nowMs: 60_000 });
  const s = state(d);
  assert.equal(s.floorRate, 50);
  assert.deepEqual(counted(d), { a: 100, b: 50, c: 0 }, 'a, cut off, still falls back to the floor it knew');
  d.ok({ type: 'reportAndGrant', nowMs: 60_000, grants: [g('a', 0, 2, { leaseExpiresAtMs: 63_000 })] });
  assert.equal(state(d).cells[0]?.floorRate, 50, 'the new grant delivers the new floor');
  assert.equal(counted(d)['a'], 100);
  d.ok({ type: 'reportAndGrant', nowMs: 60_100, acks: [{ key: KEY, cellId: 'a', epoch: 2 }] });
  assert.equal(counted(d)['a'], 50);
});

void test('a deleted tenant keeps its counted slices until released; re-creating it counts them', () => {
  const d = setup();
  d.ok({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 600, 1), g('b', 300, 1)] });
  d.ok({ type: 'deleteTenant', id: 'acme' });
  assert.deepEqual(d.ledger.activeQuotaKeys(), [KEY]);
  d.err({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 1, 2)] }, 'NOT_FOUND');
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold', rate: 100 });
  assert.equal(state(d).ceilingRate, 900, 'the old incarnation may still be in use');
  d.ok({ type: 'deleteTenant', id: 'acme' });
  // Zero grants and acknowledgements release them.
  d.ok({ type: 'reportAndGrant', nowMs: 10, grants: [g('a', 0, 2), g('b', 0, 2)] });
  d.ok({
    type: 'reportAndGrant',
    nowMs: 20,
    acks: [
      { key: KEY, cellId: 'a', epoch: 2 },
      { key: KEY, cellId: 'b', epoch: 2 },
    ],
  });
  assert.deepEqual(d.ledger.activeQuotaKeys(), []);
});

void test('caps are global quotas of their own', () => {
  const d = setup();
  d.ok({ type: 'putTierCap', tier: 'gold', rate: 2000, burst: 2000 });
  d.ok({ type: 'putDomainCap', domain: 'api', rate: 3000, burst: 3000, floorFraction: 0.5 });
  d.ok({
    type: 'reportAndGrant',
    nowMs: 0,
    grants: [g('a', 2000, 1, { key: 'tier/gold' }), g('b', 1500, 1, { key: 'domain/api' })],
  });
  d.err({ type: 'reportAndGrant', nowMs: 0, grants: [g('c', 1, 1, { key: 'tier/gold' })] }, 'QUOTA_EXCEEDED');
  assert.deepEqual(counted(d, 'domain/api'), { a: 750, b: 1500, c: 0 });
  d.ok({ type: 'reportAndGrant', nowMs: 0, grants: [g('c', 750, 1, { key: 'domain/api' })] });
  d.err({ type: 'reportAndGrant', nowMs: 0, grants: [g('c', 751, 2, { key: 'domain/api' })] }, 'QUOTA_EXCEEDED');
});

void test('with assertInvariants, a state that breaks the bound throws LedgerInvariantError', () => {
  const d = setup();
  d.ok({ type: 'reportAndGrant', nowMs: 0, grants: [g('a', 900, 1)] });
  // No command can reach a state over the bound, so tamper with a snapshot (its loader runs the same check):
  // lower the tier's rate under the grant already made. b's floor becomes 10.
  const l = Ledger.restore(d.ledger.snapshot());
  l.checkInvariants();
  const bytes = Buffer.from(d.ledger.snapshot());
  // The tier's rate 1000 is stored as a msgpack uint16 (cd 03 e8); make it 100 (cd 00 64).
  const at = bytes.indexOf(Buffer.from([0xa4, ...Buffer.from('gold'), 0xcd, 0x03, 0xe8]));
  assert.ok(at >= 0);
  bytes[at + 6] = 0x00;
  bytes[at + 7] = 0x64;
  assert.throws(() => Ledger.restore(bytes), /cells may use rate 910, over 100/);
});
