// The coordinator's snapshot encoded in steps (CoordinatorState.snapshotSteps, as the Raft driver
// takes it off the event loop's critical path): the state is copied when the steps are made, and
// the ledger keeps applying entries between the steps — new and changed tenants, grants that
// change slices in place, a new cell, a lowered tier, a member record. The bytes must be exactly
// the snapshot of the state at the index the copy was taken at: those of a second replica fed the
// same entries up to that index and no further, restorable, and restoring to that state.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CoordinatorState, encodeMemberRecord } from '../../../coordinator/node/coordinator-state.js';
import { encodeCommand } from '../../../coordinator/ledger/ledger-commands.js';
import type { Grant, LedgerCommandInput } from '../../../coordinator/ledger/ledger-commands.js';

const CELLS = ['eu', 'us', 'ap'];
const OPTIONS = { floorCells: 4 };

function feeder(states: CoordinatorState[]): {
  apply: (cmd: LedgerCommandInput | Uint8Array) => void;
  index: () => number;
} {
  let index = 0;
  return {
    apply: (cmd) => {
      index++;
      const data = cmd instanceof Uint8Array ? cmd : encodeCommand(cmd);
      for (const s of states) {
        const r = s.apply(data, index);
        assert.ok(r.ok, `entry ${index}: ${r.ok ? '' : r.error.message}`);
      }
    },
    index: () => index,
  };
}

const grants = (from: number, to: number, rate: number, epoch: number, now: number): Grant[] => {
  const out: Grant[] = [];
  for (let t = from; t < to; t++)
    for (const cellId of CELLS.slice(0, 2))
      out.push({ key: `tenant/t${t}`, cellId, rate, burst: 2 * rate, epoch, leaseExpiresAtMs: now + 3_000 });
  return out;
};

void test('a snapshot encoded in steps while entries keep applying is exactly the state at its index', () => {
  const live = new CoordinatorState(OPTIONS);
  const twin = new CoordinatorState(OPTIONS);
  const both = feeder([live, twin]);
  both.apply({ type: 'putTier', name: 'gold', rate: 1_000, burst: 2_000, floorFraction: 0.2 });
  for (let b = 0; b < 9_000; b += 1_000)
    both.apply({
      type: 'putTenants',
      tenants: Array.from({ length: 1_000 }, (_, k) => ({
        id: `t${((b + k) * 7) % 9_000}`,
        tier: 'gold',
        ...((b + k) % 4 === 0 ? { rate: 500, burst: 900 } : {}),
      })),
    });
  for (const cellId of CELLS.slice(0, 2)) both.apply({ type: 'registerCell', cellId, nowMs: 0 });
  both.apply(encodeMemberRecord('n1', 'aaaaaaaa'));
  const leases = CELLS.slice(0, 2).map((cellId) => ({ cellId, leaseExpiresAtMs: 13_000 }));
  both.apply({ type: 'reportAndGrant', nowMs: 10_000, leases, grants: grants(0, 4_000, 50, 1, 10_000) });
  const atIndex = both.index();

  const steps = live.snapshotSteps();
  // From here on only the live replica applies entries: between every two steps, one more.
  let index = atIndex;
  const applyLive = (cmd: LedgerCommandInput | Uint8Array): void => {
    index++;
    const r = live.apply(cmd instanceof Uint8Array ? cmd : encodeCommand(cmd), index);
    assert.ok(r.ok, `entry ${index}: ${r.ok ? '' : r.error.message}`);
  };
  const changes: (() => void)[] = [
    // Grants change the slices' records in place (the copy must not see them).
    () => applyLive({ type: 'reportAndGrant', nowMs: 10_100, leases, grants: grants(0, 3_000, 60, 2, 10_100) }),
    () =>
      applyLive({
        type: 'putTenants',
        tenants: [
          { id: 't1', tier: 'gold', rate: 10, burst: 20 },
          { id: 'zz', tier: 'gold' },
        ],
      }),
    () => applyLive({ type: 'registerCell', cellId: 'ap', nowMs: 10_200 }),
    () => applyLive({ type: 'putTier', name: 'gold', rate: 400, burst: 800, floorFraction: 0.2 }),
    () => applyLive(encodeMemberRecord('n2', 'bbbbbbbb')),
    () => applyLive({ type: 'deleteTenant', id: 't2' }),
  ];
  let stepCount = 0;
  let r = steps.next();
  while (r.done !== true) {
    const change = changes[stepCount];
    if (change !== undefined) change();
    else
      applyLive({
        type: 'putTenants',
        tenants: [
          { id: `n${stepCount}`, tier: 'gold' },
          { id: `t${stepCount}`, tier: 'gold', rate: 7, burst: 9 },
        ],
      });
    stepCount++;
    r = steps.next();
  }
  const bytes = r.value;
  assert.ok(stepCount > 10, `encoded in ${stepCount} steps, with entries applied between them`);
  const expected = twin.snapshot();
  assert.deepEqual(Buffer.from(bytes), Buffer.from(expected), 'the bytes of the state at the index');
  assert.notDeepEqual(Buffer.from(live.snapshot()), Buffer.from(expected), 'the live state did move on');

  const restored = new CoordinatorState(OPTIONS);
  restored.restore(bytes);
  assert.deepEqual(Buffer.from(restored.snapshot()), Buffer.from(expected));
  assert.equal(restored.ledger.appliedIndex, atIndex);
  assert.equal(restored.ledger.getTenant('t1')?.rate, twin.ledger.getTenant('t1')?.rate);
  assert.equal(restored.ledger.getSlice('tenant/t0', 'eu')?.rate, 50);
  assert.deepEqual(restored.incarnations(), { n1: 'aaaaaaaa' });
});
