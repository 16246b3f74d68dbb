import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Ledger, LedgerSnapshotError } from '../../../coordinator/ledger/ledger.js';
import {
  LedgerCommandError,
  CELL_TOMBSTONE_FORMAT,
  MAX_CELLS,
  MAX_NAME_LENGTH,
  decodeCommand,
  encodeCommand,
  parseQuotaKey,
  tenantKey,
} from '../../../coordinator/ledger/ledger-commands.js';
import type { LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';
import { Driver } from './ledger-helpers.js';

void test('tiers: create, read, replace, list, delete', () => {
  const d = Driver.create();
  const v = d.ok({ type: 'putTier', name: 'gold', rate: 500, burst: 1000, floorFraction: 0.5 });
  assert.deepEqual(v, {
    kind: 'tier',
    tier: { name: 'gold', rate: 500, burst: 1000, floorFraction: 0.5, cap: null, tenantCount: 0, updatedIndex: 1 },
    created: true,
  });
  d.ok({ type: 'putTier', name: 'bronze', rate: 50, burst: 50 });
  assert.equal(d.ledger.getTier('bronze')?.floorFraction, 0, 'floorFraction defaults to 0');
  const r = d.ok({ type: 'putTier', name: 'gold', rate: 600, burst: 1200 });
  assert.equal(r.kind === 'tier' && r.created, false);
  assert.deepEqual(d.ledger.getTier('gold'), {
    name: 'gold',
    rate: 600,
    burst: 1200,
    floorFraction: 0,
    cap: null,
    tenantCount: 0,
    updatedIndex: 3,
  });
  assert.deepEqual(
    d.ledger.listTiers().map((t) => t.name),
    ['bronze', 'gold'],
  );
  assert.deepEqual(d.ok({ type: 'deleteTier', name: 'bronze' }), { kind: 'deleted', what: 'tier', id: 'bronze' });
  assert.equal(d.ledger.getTier('bronze'), undefined);
  d.err({ type: 'deleteTier', name: 'bronze' }, 'NOT_FOUND');
});

void test('a tier in use cannot be deleted; a clear CONFLICT names the tenants', () => {
  const d = Driver.create();
  d.ok({ type: 'putTier', name: 'gold', rate: 500, burst: 1000 });
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
  d.ok({ type: 'putTenant', id: 'globex', tier: 'gold' });
  const msg = d.err({ type: 'deleteTier', name: 'gold' }, 'CONFLICT');
  assert.match(msg, /used by 2 tenant/);
  d.ok({ type: 'putTier', name: 'silver', rate: 100, burst: 100 });
  d.ok({ type: 'putTenant', id: 'acme', tier: 'silver' });
  d.ok({ type: 'deleteTenant', id: 'globex' });
  assert.equal(d.ledger.getTier('gold')?.tenantCount, 0);
  assert.equal(d.ledger.getTier('silver')?.tenantCount, 1);
  d.ok({ type: 'deleteTier', name: 'gold' });
});

void test('tenants: tier or overrides, slices per cell, errors', () => {
  const d = Driver.create({ floorCells: 2 });
  d.ok({ type: 'putTier', name: 'gold', rate: 500, burst: 1000, floorFraction: 0.4 });
  d.err({ type: 'putTenant', id: 'acme', tier: 'platinum' }, 'NOT_FOUND');
  const v = d.ok({ type: 'putTenant', id: 'acme', tier: 'gold', rate: 800 });
  assert.deepEqual(v, {
    kind: 'tenant',
    tenant: {
      id: 'acme',
      tier: 'gold',
      rate: 800,
      burst: null,
      quota: { rate: 800, burst: 1000, floorFraction: 0.4 },
      updatedIndex: 3,
    },
    created: true,
  });
  d.ok({ type: 'registerCell', cellId: 'eu-west', nowMs: 1000 });
  d.ok({ type: 'registerCell', cellId: 'us-east', nowMs: 1000 });
  d.ok({ type: 'registerCell', cellId: 'ap-south', nowMs: 1000 });
  const t = d.ledger.getTenant('acme');
  assert.ok(t);
  assert.deepEqual(
    t.slices.map((s) => [s.cellId, s.slot, s.floorRate, s.floorBurst, s.epoch]),
    [
      ['eu-west', 0, 160, 200, 0],
      ['us-east', 1, 160, 200, 0],
      ['ap-south', null, 0, 0, 0],
    ],
  );
  // Replace semantics: overrides left out go back to the tier's.
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
  assert.deepEqual(d.ledger.getTenant('acme')?.quota, { rate: 500, burst: 1000, floorFraction: 0.4 });
  d.err({ type: 'deleteTenant', id: 'nobody' }, 'NOT_FOUND');
  d.ok({ type: 'deleteTenant', id: 'acme' });
  assert.equal(d.ledger.getTenant('acme'), undefined);
  assert.equal(d.ledger.getQuota(tenantKey('acme')), undefined);
});

void test('listTenants pages in id order with a cursor', () => {
  const d = Driver.create();
  d.ok({ type: 'putTier', name: 't', rate: 10, burst: 10 });
  const ids = Array.from({ length: 25 }, (_, i) => `tenant-${String(i).padStart(3, '0')}`).reverse();
  for (const id of ids) d.ok({ type: 'putTenant', id, tier: 't' });
  const seen: string[] = [];
  let cursor: string | null = null;
  let pages = 0;
  do {
    const page: { tenants: { id: string }[]; nextCursor: string | null } = d.ledger.listTenants(
      cursor === null ? { limit: 10 } : { cursor, limit: 10 },
    );
    seen.push(...page.tenants.map((t) => t.id));
    cursor = page.nextCursor;
    pages++;
  } while (cursor !== null);
  assert.equal(pages, 3);
  assert.deepEqual(seen, [...ids].sort());
  d.ok({ type: 'deleteTenant', id: 'tenant-005' });
  assert.equal(d.ledger.listTenants({ cursor: 'tenant-004', limit: 1 }).tenants[0]?.id, 'tenant-006');
  assert.equal(d.ledger.listTenants({ limit: 1000 }).nextCursor, null);
});

void test('tier and domain caps', () => {
  const d = Driver.create();
  d.err({ type: 'putTierCap', tier: 'gold', rate: 10, burst: 10 }, 'NOT_FOUND');
  d.ok({ type: 'putTier', name: 'gold', rate: 500, burst: 1000 });
  d.ok({ type: 'putTierCap', tier: 'gold', rate: 5000, burst: 6000, floorFraction: 0.2 });
  assert.deepEqual(d.ledger.getTier('gold')?.cap, { rate: 5000, burst: 6000, floorFraction: 0.2 });
  assert.deepEqual(d.ledger.getQuota('tier/gold'), { rate: 5000, burst: 6000, floorFraction: 0.2 });
  d.ok({ type: 'putDomainCap', domain: 'api', rate: 100000, burst: 100000 });
  assert.equal(d.ledger.getDomainCap('api')?.rate, 100000);
  assert.deepEqual(
    d.ledger.listDomainCaps().map((c) => c.domain),
    ['api'],
  );
  d.ok({ type: 'deleteDomainCap', domain: 'api' });
  d.err({ type: 'deleteDomainCap', domain: 'api' }, 'NOT_FOUND');
  d.ok({ type: 'deleteTierCap', tier: 'gold' });
  d.err({ type: 'deleteTierCap', tier: 'gold' }, 'NOT_FOUND');
  d.ok({ type: 'putTierCap', tier: 'gold', rate: 5000, burst: 6000 });
  d.ok({ type: 'deleteTier', name: 'gold' });
  assert.equal(d.ledger.getQuota('tier/gold'), undefined, 'deleting the tier removes its cap');
});

void test('cells: registration is idempotent, floor slots go to the first floorCells cells, at most MAX_CELLS', () => {
  const d = Driver.create({ floorCells: 2 });
  const first = d.ok({ type: 'registerCell', cellId: 'c0', nowMs: 5 });
  assert.deepEqual(first, {
    kind: 'cell',
    cell: {
      id: 'c0',
      slot: 0,
      registeredAtMs: 5,
      lastReportAtMs: null,
      leaseExpiresAtMs: null,
      leaseLive: false,
      removing: false,
    },
    created: true,
  });
  const again = d.ok({ type: 'registerCell', cellId: 'c0', nowMs: 9 });
  assert.equal(again.kind === 'cell' && again.created, false);
  assert.equal(d.ledger.nowMs, 9);
  for (let i = 1; i < MAX_CELLS; i++) d.ok({ type: 'registerCell', cellId: `c${i}`, nowMs: 10 });
  assert.deepEqual(
    d.ledger
      .listCells()
      .slice(0, 3)
      .map((c) => [c.id, c.slot]),
    [
      ['c0', 0],
      ['c1', 1],
      ['c2', null],
    ],
  );
  d.err({ type: 'registerCell', cellId: 'one-too-many', nowMs: 11 }, 'LIMIT_EXCEEDED');
  assert.equal(d.ledger.nowMs, 10, 'a refused command does not advance the clock');
});

void test('cells: a removed cell gets no renewal or grant, stays counted while its lease lives, then is dropped and its floor slot goes to the next cell', () => {
  const d = Driver.create({ floorCells: 2, skewMarginMs: 100 });
  d.ok({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0.5 });
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
  for (const c of ['a', 'b', 'c']) d.ok({ type: 'registerCell', cellId: c, nowMs: 10 });
  assert.deepEqual(
    d.ledger.listCells().map((c) => [c.id, c.slot]),
    [
      ['a', 0],
      ['b', 1],
      ['c', null],
    ],
  );
  d.ok({
    type: 'reportAndGrant',
    nowMs: 20,
    leases: [{ cellId: 'b', leaseExpiresAtMs: 1000 }],
    grants: [{ key: 'tenant/acme', cellId: 'b', rate: 40, burst: 40, epoch: 1, leaseExpiresAtMs: 1000 }],
  });
  d.err({ type: 'removeCell', cellId: 'nobody', nowMs: 30 }, 'NOT_FOUND');
  const r = d.ok({ type: 'removeCell', cellId: 'b', nowMs: 30 });
  assert.deepEqual(
    r,
    { kind: 'cellRemoved', id: 'b', dropped: false, leaseExpiresAtMs: 1000, freedSlot: null },
    'a live lease: removing, not dropped',
  );
  assert.equal(d.ledger.getCell('b')?.removing, true);
  const counted = d.ledger.getQuotaState('tenant/acme')?.countedRate ?? 0;
  assert.ok(counted >= 40 + 25, `its live grant stays counted: ${counted}`);
  // A round built before the removal: its renewal and grant for b are ignored, the rest applies.
  d.ok({
    type: 'reportAndGrant',
    nowMs: 40,
    leases: [
      { cellId: 'b', leaseExpiresAtMs: 5000 },
      { cellId: 'a', leaseExpiresAtMs: 5000 },
    ],
    grants: [{ key: 'tenant/acme', cellId: 'b', rate: 50, burst: 50, epoch: 2, leaseExpiresAtMs: 5000 }],
  });
  assert.equal(d.ledger.getCell('b')?.leaseExpiresAtMs, 1000, 'no renewal for a removed cell');
  assert.equal(d.ledger.getSlice('tenant/acme', 'b')?.epoch, 1, 'no grant for a removed cell');
  assert.equal(d.ledger.getCell('a')?.leaseExpiresAtMs, 5000);
  d.ok({ type: 'expireLeases', nowMs: 1050 });
  assert.notEqual(d.ledger.getCell('b'), undefined, 'kept until expiry + skew margin');
  d.ok({ type: 'expireLeases', nowMs: 1101 });
  assert.equal(d.ledger.getCell('b'), undefined, 'dropped once its lease surely expired');
  assert.equal(d.ledger.getSlice('tenant/acme', 'b'), undefined, 'with its slices');
  assert.deepEqual(
    d.ledger.listCells().map((c) => [c.id, c.slot]),
    [
      ['a', 0],
      ['c', 1],
    ],
    'its floor slot went to the cell that had none',
  );
  // Removing a cell without a lease drops it at once; its slot is free for the next registration.
  assert.deepEqual(d.ok({ type: 'removeCell', cellId: 'c', nowMs: 1101 }), {
    kind: 'cellRemoved',
    id: 'c',
    dropped: true,
    leaseExpiresAtMs: null,
    freedSlot: 1,
  });
  d.ok({ type: 'registerCell', cellId: 'new', nowMs: 1200 });
  assert.equal(d.ledger.getCell('new')?.slot, 1, 'a new cell takes the freed floor slot');
  // The removal mark survives a snapshot.
  d.ok({ type: 'reportAndGrant', nowMs: 1300, leases: [{ cellId: 'new', leaseExpiresAtMs: 9000 }] });
  d.ok({ type: 'removeCell', cellId: 'new', nowMs: 1300 });
  const restored = Ledger.restore(d.ledger.snapshot(), { assertInvariants: true });
  assert.equal(restored.getCell('new')?.removing, true);
  assert.deepEqual(Buffer.from(restored.snapshot()), Buffer.from(d.ledger.snapshot()));
});

void test('invalid commands are refused deterministically, with a readable message', () => {
  const d = Driver.create();
  const bad: unknown[] = [
    { type: 'putTier', name: 'gold', rate: 0, burst: 10 },
    { type: 'putTier', name: 'gold', rate: 10, burst: 0.5 },
    { type: 'putTier', name: 'gold', rate: 10, burst: 10, floorFraction: 1.5 },
    { type: 'putTier', name: 'gold', rate: Number.POSITIVE_INFINITY, burst: 10 },
    { type: 'putTier', name: 'gold', rate: Number.NaN, burst: 10 },
    { type: 'putTier', name: 'has space', rate: 10, burst: 10 },
    { type: 'putTier', name: 'x'.repeat(MAX_NAME_LENGTH + 1), rate: 10, burst: 10 },
    { type: 'putTier', name: 'gold', rate: 10, burst: 10, extra: true },
    { type: 'putTenant', id: '', tier: 'gold' },
    {
      type: 'reportAndGrant',
      nowMs: 1,
      grants: [{ key: 'nokind', cellId: 'c', rate: 1, burst: 1, epoch: 1, leaseExpiresAtMs: 1 }],
    },
    {
      type: 'reportAndGrant',
      nowMs: 1,
      grants: [{ key: 'tenant/a', cellId: 'c', rate: -1, burst: 1, epoch: 1, leaseExpiresAtMs: 1 }],
    },
    {
      type: 'reportAndGrant',
      nowMs: 1,
      grants: [{ key: 'tenant/a', cellId: 'c', rate: 1, burst: 1, epoch: 0, leaseExpiresAtMs: 1 }],
    },
    { type: 'expireLeases', nowMs: -1 },
    { type: 'launchMissiles' },
    null,
    { type: 'putTier', name: 'gold', rate: 10, burst: 10, session: { clientId: 'c', seq: 0 } },
  ];
  for (const b of bad) d.err(b as LedgerCommandInput, 'INVALID');
  const msg = d.err({ type: 'putTier', name: 'gold', rate: -3, burst: 10 }, 'INVALID');
  assert.match(msg, /rate/);
  d.ok({ type: 'putTier', name: 'a.b_c:d-9', rate: 0.5, burst: 1 });
});

void test('commands round-trip through the msgpack encoding; garbage is refused', () => {
  const cmds: LedgerCommandInput[] = [
    {
      type: 'putTier',
      name: 'gold',
      rate: 500.25,
      burst: 1000,
      floorFraction: 0.5,
      session: { clientId: 'admin-1', seq: 7 },
    },
    { type: 'putTenant', id: 'acme', tier: 'gold', burst: 3 },
    { type: 'registerCell', cellId: 'eu', nowMs: 1_700_000_000_000 },
    {
      type: 'reportAndGrant',
      nowMs: 1_700_000_000_500,
      leases: [{ cellId: 'eu', leaseExpiresAtMs: 1_700_000_003_500 }],
      acks: [{ key: 'tenant/acme', cellId: 'eu', epoch: 3 }],
      grants: [
        { key: 'tenant/acme', cellId: 'eu', rate: 0.1, burst: 2, epoch: 4, leaseExpiresAtMs: 1_700_000_003_500 },
      ],
    },
    { type: 'expireLeases', nowMs: 12 },
  ];
  for (const c of cmds) assert.deepEqual(decodeCommand(encodeCommand(c)), c);
  assert.deepEqual(decodeCommand(encodeCommand({ type: 'expireLeases', nowMs: -0 })), {
    type: 'expireLeases',
    nowMs: 0,
  });
  assert.ok(
    Object.is((decodeCommand(encodeCommand({ type: 'expireLeases', nowMs: -0 })) as { nowMs: number }).nowMs, 0),
  );
  assert.throws(() => encodeCommand({ type: 'putTier', name: 'gold', rate: -1, burst: 1 }), LedgerCommandError);
  assert.throws(() => decodeCommand(new Uint8Array([0xc1])), LedgerCommandError);
  assert.throws(() => decodeCommand(encodeCommand(cmds[0] as LedgerCommandInput).subarray(0, 5)), LedgerCommandError);
  const ledger = new Ledger({ assertInvariants: true });
  const r = ledger.applyEncoded(new Uint8Array([1, 2, 3]), 1);
  assert.equal(r.ok ? 'ok' : r.error.code, 'INVALID');
  assert.equal(ledger.appliedIndex, 1);
  const r2 = ledger.applyEncoded(encodeCommand(cmds[0] as LedgerCommandInput), 2);
  assert.ok(r2.ok);
  assert.equal(parseQuotaKey('tenant/a/b'), undefined);
  assert.deepEqual(parseQuotaKey('domain/api'), { kind: 'domain', name: 'api' });
});

void test('log indexes must increase', () => {
  const l = new Ledger();
  l.apply({ type: 'expireLeases', nowMs: 1 }, 5);
  assert.throws(() => l.apply({ type: 'expireLeases', nowMs: 1 }, 5), RangeError);
  assert.throws(() => l.apply({ type: 'expireLeases', nowMs: 1 }, 4), RangeError);
  l.apply({ type: 'expireLeases', nowMs: 1 }, 9);
  assert.equal(l.appliedIndex, 9);
});

void test('a retried command (same clientId and seq) is applied once and answered with the first result', () => {
  const d = Driver.create();
  const s1 = { clientId: 'admin', seq: 1 };
  const first = d.apply({ type: 'putTier', name: 'gold', rate: 500, burst: 1000, session: s1 });
  assert.ok(first.ok);
  // The retry carries the same request; even a changed body does not apply again.
  const retry = d.apply({ type: 'putTier', name: 'gold', rate: 999, burst: 999, session: s1 });
  assert.deepEqual(retry, first);
  assert.equal(d.ledger.getTier('gold')?.rate, 500);
  // A non-idempotent command: creating then deleting; a retried delete does not fail with NOT_FOUND.
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
  const del = d.apply({ type: 'deleteTenant', id: 'acme', session: { clientId: 'admin', seq: 2 } });
  assert.ok(del.ok);
  assert.deepEqual(d.apply({ type: 'deleteTenant', id: 'acme', session: { clientId: 'admin', seq: 2 } }), del);
  // An error result is recorded too.
  const e = d.apply({ type: 'deleteTenant', id: 'acme', session: { clientId: 'admin', seq: 3 } });
  assert.equal(e.ok ? 'ok' : e.error.code, 'NOT_FOUND');
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
  assert.deepEqual(d.apply({ type: 'deleteTenant', id: 'acme', session: { clientId: 'admin', seq: 3 } }), e);
  assert.ok(d.ledger.getTenant('acme'), 'the retry did not delete the re-created tenant');
  // An older request than the last applied is refused.
  const stale = d.apply({ type: 'putTier', name: 'gold', rate: 1, burst: 1, session: { clientId: 'admin', seq: 1 } });
  assert.equal(stale.ok ? 'ok' : stale.error.code, 'STALE_SESSION');
  // Other clients are independent; the sessions survive a snapshot.
  const other = d.apply({ type: 'putTier', name: 'silver', rate: 5, burst: 5, session: { clientId: 'cli', seq: 1 } });
  const restored = new Driver(Ledger.restore(d.ledger.snapshot(), { assertInvariants: true }));
  restored.index = d.index;
  assert.deepEqual(
    restored.apply({ type: 'putTier', name: 'silver', rate: 6, burst: 6, session: { clientId: 'cli', seq: 1 } }),
    other,
  );
  assert.equal(restored.ledger.getTier('silver')?.rate, 5);
});

void test('the session table is bounded', () => {
  const d = Driver.create({ maxSessions: 2 });
  for (const c of ['a', 'b', 'c'])
    d.ok({ type: 'putTier', name: `t${c}`, rate: 1, burst: 1, session: { clientId: c, seq: 1 } });
  // a was evicted: its retry applies again (documented limit of a bounded table).
  const r = d.apply({ type: 'putTier', name: 'ta', rate: 2, burst: 2, session: { clientId: 'a', seq: 1 } });
  assert.ok(r.ok && r.value.kind === 'tier' && !r.value.created);
  assert.equal(d.ledger.getTier('ta')?.rate, 2);
});

void test('restore refuses bytes that are not a valid ledger snapshot', () => {
  assert.throws(() => Ledger.restore(new Uint8Array([0xc1])), LedgerSnapshotError);
  assert.throws(() => Ledger.restore(encodeCommand({ type: 'expireLeases', nowMs: 1 })), LedgerSnapshotError);
  const d = Driver.create();
  d.ok({ type: 'putTier', name: 'gold', rate: 5, burst: 5 });
  const snap = d.ledger.snapshot();
  const again = Ledger.restore(snap);
  assert.deepEqual(Buffer.from(again.snapshot()), Buffer.from(snap));
  assert.deepEqual(again.config, d.ledger.config);
});

void test('a cell removed and registered again under its id: epochs continue above every epoch it was issued (format 6, kept in snapshots); below it they start afresh', () => {
  const run = (raise: boolean): { epoch: number | undefined; restored: number | undefined } => {
    const d = Driver.create();
    if (raise) d.ok({ type: 'raiseCommandFormat', format: CELL_TOMBSTONE_FORMAT });
    d.ok({ type: 'putTier', name: 'gold', rate: 100, burst: 100 });
    d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
    d.ok({ type: 'registerCell', cellId: 'a', nowMs: 0 });
    for (let epoch = 1; epoch <= 7; epoch++)
      d.ok({
        type: 'reportAndGrant',
        nowMs: epoch,
        leases: [{ cellId: 'a', leaseExpiresAtMs: 1000 }],
        grants: [{ key: 'tenant/acme', cellId: 'a', rate: 10 + epoch, burst: 10, epoch, leaseExpiresAtMs: 1000 }],
        acks: [{ key: 'tenant/acme', cellId: 'a', epoch }],
      });
    d.ok({ type: 'removeCell', cellId: 'a', nowMs: 10 });
    d.ok({ type: 'expireLeases', nowMs: 5000 });
    assert.equal(d.ledger.getCell('a'), undefined, 'dropped');
    // The tombstone survives a snapshot taken while the cell is gone.
    const restored = new Driver(Ledger.restore(d.ledger.snapshot(), { assertInvariants: true }));
    restored.index = d.index;
    assert.deepEqual(Buffer.from(restored.ledger.snapshot()), Buffer.from(d.ledger.snapshot()));
    const regrant = (x: Driver): number | undefined => {
      x.ok({ type: 'registerCell', cellId: 'a', nowMs: 5001 });
      x.ok({
        type: 'reportAndGrant',
        nowMs: 5002,
        leases: [{ cellId: 'a', leaseExpiresAtMs: 9000 }],
        grants: [{ key: 'tenant/acme', cellId: 'a', rate: 0, burst: 0, epoch: 1, leaseExpiresAtMs: 9000 }],
      });
      return x.ledger.getSlice('tenant/acme', 'a')?.epoch;
    };
    return { epoch: regrant(d), restored: regrant(restored) };
  };
  assert.deepEqual(run(true), { epoch: 8, restored: 8 }, 'a first grant continues above epoch 7');
  assert.deepEqual(run(false), { epoch: 1, restored: 1 }, 'below format 6, as the builds before it');
});
