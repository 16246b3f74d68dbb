// dropReleasedSlices (command format 7): the ledger drops a cell's slice of a key the cell's agent released, only
// when the release names the slice's current epoch and the slice's floors are within the cell's floor slot; the
// cell's epoch mark rises so a later slice of the key starts above it; below the format the command changes nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Ledger } from '../../../coordinator/ledger/ledger.js';
import { RELEASED_SLICES_FORMAT, CELL_TOMBSTONE_FORMAT } from '../../../coordinator/ledger/ledger-commands.js';
import { Driver } from './ledger-helpers.js';

const KEY = 'tenant/acme';
const LEASE = 10_000;

/** gold 100/s burst 100, floor fraction φ over 2 floor cells, cells a and b, `epochs` grants of acme to a (acked). */
function setup(opts: { raise?: boolean; floorFraction?: number; epochs?: number } = {}): Driver {
  const d = Driver.create({ floorCells: 2 });
  if (opts.raise !== false) d.ok({ type: 'raiseCommandFormat', format: RELEASED_SLICES_FORMAT });
  d.ok({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: opts.floorFraction ?? 0 });
  d.ok({ type: 'putTenant', id: 'acme', tier: 'gold' });
  d.ok({ type: 'registerCell', cellId: 'a', nowMs: 0 });
  d.ok({ type: 'registerCell', cellId: 'b', nowMs: 0 });
  for (let epoch = 1; epoch <= (opts.epochs ?? 1); epoch++) grant(d, 'a', epoch, 20 + epoch);
  return d;
}

function grant(d: Driver, cellId: string, epoch: number, rate: number, ack = true): void {
  d.ok({
    type: 'reportAndGrant',
    nowMs: d.index,
    leases: [{ cellId, leaseExpiresAtMs: LEASE }],
    grants: [{ key: KEY, cellId, rate, burst: rate, epoch, leaseExpiresAtMs: LEASE }],
  });
  if (ack) d.ok({ type: 'reportAndGrant', nowMs: d.index, acks: [{ key: KEY, cellId, epoch }] });
}

function drop(d: Driver, epoch: number, cellId = 'a'): { dropped: number; kept: number } {
  const v = d.ok({ type: 'dropReleasedSlices', releases: [{ key: KEY, cellId, epoch }] });
  assert.equal(v.kind, 'slicesDropped');
  return v.kind === 'slicesDropped' ? { dropped: v.dropped, kept: v.kept } : { dropped: -1, kept: -1 };
}

void test('below command format 7 dropReleasedSlices is refused and changes nothing (a log never raised applies as before)', () => {
  for (const format of [null, CELL_TOMBSTONE_FORMAT]) {
    const d = setup({ raise: false, epochs: 2 });
    if (format !== null) d.ok({ type: 'raiseCommandFormat', format });
    const msg = d.err({ type: 'dropReleasedSlices', releases: [{ key: KEY, cellId: 'a', epoch: 2 }] }, 'INVALID');
    assert.match(msg, /format 7/);
    assert.equal(d.ledger.getSlice(KEY, 'a')?.epoch, 2, 'the slice is still counted');
    assert.equal(d.ledger.cellSliceCount('a'), 1);
  }
});

void test('the epoch guard: a release of an older epoch (a newer grant in flight) drops nothing; of the current epoch, the slice goes and the cell counts its floor slot', () => {
  const d = setup({ epochs: 3, floorFraction: 0.2 });
  assert.equal(d.ledger.getSlice(KEY, 'a')?.countedRate, 23);
  assert.deepEqual(drop(d, 2), { dropped: 0, kept: 1 }, 'epoch 3 was granted after the release of 2');
  assert.deepEqual(drop(d, 4), { dropped: 0, kept: 1 }, 'an epoch the slice never had');
  assert.deepEqual(drop(d, 1, 'b'), { dropped: 0, kept: 1 }, 'no slice on b');
  assert.equal(d.ledger.getSlice(KEY, 'a')?.epoch, 3);
  // An unacknowledged grant on top (epoch 4, not acked): the agent cannot have released 4 without holding it.
  grant(d, 'a', 4, 30, false);
  assert.deepEqual(drop(d, 3), { dropped: 0, kept: 1 }, 'the release of 3 while 4 is in flight');
  assert.deepEqual(drop(d, 4), { dropped: 1, kept: 0 });
  assert.equal(d.ledger.cellSliceCount('a'), 0);
  assert.equal(d.ledger.hasSlices(KEY), false);
  const view = d.ledger.getSlice(KEY, 'a');
  assert.equal(view?.epoch, 0);
  // Without a slice the cell is counted at its floor slot: 0.2 × 100 / 2.
  assert.equal(view?.countedRate, 10);
  assert.equal(d.ledger.getQuotaState(KEY)?.countedRate, 20, 'both slots at the floor');
});

void test('epochs only grow: a dropped slice raises the epoch mark, a later first grant starts above it, and a stale release of the old epoch drops nothing', () => {
  const d = setup({ epochs: 5 });
  assert.deepEqual(drop(d, 5), { dropped: 1, kept: 0 });
  // The cell asks again: the round's first grant says epoch 1; the ledger takes it above the mark.
  d.ok({
    type: 'reportAndGrant',
    nowMs: d.index,
    leases: [{ cellId: 'a', leaseExpiresAtMs: LEASE }],
    grants: [{ key: KEY, cellId: 'a', rate: 0, burst: 0, epoch: 1, leaseExpiresAtMs: LEASE }],
  });
  assert.equal(d.ledger.getSlice(KEY, 'a')?.epoch, 6);
  assert.deepEqual(drop(d, 5), { dropped: 0, kept: 1 }, 'a late copy of the release');
  assert.equal(d.ledger.getSlice(KEY, 'a')?.epoch, 6);
});

void test('floors: a slice whose stamped or held floor is above the cell floor slot now (a lowered tier not yet acknowledged) is kept', () => {
  const d = setup({ epochs: 1, floorFraction: 0.5 });
  // The tier is lowered: the slice's stamped floor (25) is above the new slot floor (0.5 × 40 / 2 = 10).
  d.ok({ type: 'putTier', name: 'gold', rate: 40, burst: 40, floorFraction: 0.5 });
  assert.deepEqual(drop(d, 1), { dropped: 0, kept: 1 });
  // Re-granted at the new definition and acknowledged: the held floor is the slot's, the release drops it.
  grant(d, 'a', 2, 5);
  assert.equal(d.ledger.getSlice(KEY, 'a')?.floorRate, 10);
  assert.deepEqual(drop(d, 2), { dropped: 1, kept: 0 });
  assert.equal(d.ledger.getSlice(KEY, 'a')?.countedRate, 10);
});

void test('snapshots round-trip a ledger with dropped slices, and the restored one continues epochs above the mark', () => {
  const d = setup({ epochs: 4 });
  grant(d, 'b', 1, 10);
  assert.deepEqual(drop(d, 4), { dropped: 1, kept: 0 });
  const bytes = d.ledger.snapshot();
  const restored = new Driver(Ledger.restore(bytes, { assertInvariants: true }));
  restored.index = d.index;
  assert.deepEqual(Buffer.from(restored.ledger.snapshot()), Buffer.from(bytes));
  assert.equal(restored.ledger.commandFormat, RELEASED_SLICES_FORMAT);
  assert.equal(restored.ledger.cellSliceCount('a'), 0);
  assert.equal(restored.ledger.cellSliceCount('b'), 1);
  for (const x of [d, restored]) {
    x.ok({
      type: 'reportAndGrant',
      nowMs: x.index,
      leases: [{ cellId: 'a', leaseExpiresAtMs: LEASE }],
      grants: [{ key: KEY, cellId: 'a', rate: 0, burst: 0, epoch: 1, leaseExpiresAtMs: LEASE }],
    });
  }
  assert.equal(d.ledger.getSlice(KEY, 'a')?.epoch, 5);
  assert.equal(restored.ledger.getSlice(KEY, 'a')?.epoch, 5);
  assert.deepEqual(Buffer.from(restored.ledger.snapshot()), Buffer.from(d.ledger.snapshot()));
});

void test('an implicit tenant whose last slice is dropped leaves the implicit count (--max-implicit-tenants)', () => {
  const d = Driver.create({ floorCells: 2 });
  d.ok({ type: 'raiseCommandFormat', format: RELEASED_SLICES_FORMAT });
  d.ok({ type: 'putTier', name: 'gold', rate: 100, burst: 100 });
  d.ok({ type: 'putSettings', unknownTenant: 'tier:gold' });
  d.ok({ type: 'registerCell', cellId: 'a', nowMs: 0 });
  d.ok({
    type: 'reportAndGrant',
    nowMs: 1,
    leases: [{ cellId: 'a', leaseExpiresAtMs: LEASE }],
    grants: [{ key: 'tenant/x', cellId: 'a', rate: 5, burst: 5, epoch: 1, leaseExpiresAtMs: LEASE }],
  });
  assert.equal(d.ledger.implicitTenantCount, 1);
  const v = d.ok({ type: 'dropReleasedSlices', releases: [{ key: 'tenant/x', cellId: 'a', epoch: 1 }] });
  assert.deepEqual(v, { kind: 'slicesDropped', dropped: 1, kept: 0 });
  assert.equal(d.ledger.implicitTenantCount, 0);
});

void test('a cell beyond floorCells (no floor slot) is counted at 0 once its released slice is dropped; a release naming an unknown cell is left alone', () => {
  const d = setup({ epochs: 1, floorFraction: 0.5 });
  d.ok({ type: 'registerCell', cellId: 'c', nowMs: d.index });
  assert.equal(d.ledger.getCell('c')?.slot, null, 'two floor slots, taken by a and b');
  grant(d, 'c', 1, 7);
  assert.equal(d.ledger.getSlice(KEY, 'c')?.floorRate, 0);
  assert.equal(d.ledger.getSlice(KEY, 'c')?.countedRate, 7);
  assert.deepEqual(drop(d, 1, 'c'), { dropped: 1, kept: 0 });
  assert.equal(d.ledger.getSlice(KEY, 'c')?.countedRate, 0);
  const v = d.ok({ type: 'dropReleasedSlices', releases: [{ key: KEY, cellId: 'nope', epoch: 1 }] });
  assert.deepEqual(v, { kind: 'slicesDropped', dropped: 0, kept: 1 });
});
