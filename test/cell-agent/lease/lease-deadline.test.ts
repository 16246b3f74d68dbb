// The lease's end in shared memory (issue 13, finding 1), as the deciders meet it: a leased grant is
// decided on while its lease lasts and on its floor from the nanosecond the deadline passed — with
// nobody posting floors — on every thread attached to the deadline; a grant of an older lease
// generation never rides on a newer lease, even before its thread saw the floors message.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import { Decider } from '../../../cell-agent/decide/decide.js';
import { CoordinatedQuotas } from '../../../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { LeaseDeadline, deadlineWriter } from '../../../cell-agent/lease/lease-deadline.js';
import { QuotaOverrides } from '../../../cell-agent/lease/quota-overrides.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';

const S = 1_000_000_000n;
const RULES = 'domain: api\ndescriptors:\n  - key: tenant\n    global: true\n';

function thread(table: BucketTable, deadline: LeaseDeadline, now: { ns: bigint }) {
  const overrides = new QuotaOverrides();
  const decider = new Decider(
    {
      table,
      quotas: new CoordinatedQuotas(overrides),
      clock: () => now.ns,
      overrides,
      deadline: LeaseDeadline.attach(deadline.shared),
    },
    { bounds: DEFAULT_REQUEST_BOUNDS, responseHeaders: false, tableFull: 'open', staticSlices: false },
  );
  decider.setRules(compileRules([parseRulesYaml(RULES, 'rules.yaml')]));
  /** Admitted out of n one-hit checks now, and whether they were decided on the lease. */
  const admit = (n: number, hits: number | null = null): { admitted: number; leased: boolean } => {
    let admitted = 0;
    let leased = true;
    for (let i = 0; i < n; i++) {
      const r = decider.decide({
        domain: 'api',
        descriptors: [{ entries: [{ key: 'tenant', value: 'acme' }], limit: null, hitsAddend: hits }],
        hitsAddend: 0,
      });
      if (!r.ok) throw new Error(r.failure.message);
      if (!r.decision.overLimit) admitted++;
      if (r.decision.degraded) leased = false;
    }
    return { admitted, leased };
  };
  /** A 0-hit check: creates the (empty-started) bucket. */
  const touch = (): void => void admit(1, 0);
  return { overrides, admit, touch };
}

void test('a leased grant holds until the deadline, then the floor, on every thread, without a floors message', () => {
  const now = { ns: 10n * S };
  const deadline = LeaseDeadline.create();
  const writer = deadlineWriter(deadline, 0n);
  const table = new BucketTable({ capacity: 64, startNs: 0n });
  const a = thread(table, deadline, now);
  const b = thread(table, deadline, now);
  const gen = writer.currentGeneration();
  const grant = {
    key: 'tenant/acme',
    rate: 100,
    burst: 100,
    leased: true,
    epoch: 3,
    lease: gen,
    floorRate: 5,
    floorBurst: 5,
  };
  a.overrides.apply([grant]);
  b.overrides.apply([grant]);
  writer.renew(12_000); // ms on the deciders' clock: the lease ends at 12 s
  a.touch();
  now.ns += S; // 11 s: the empty-started bucket refilled to its burst
  assert.deepEqual(a.admit(60), { admitted: 60, leased: true });
  assert.deepEqual(b.admit(60), { admitted: 40, leased: true }, 'one bucket for both threads, at the grant');
  now.ns = 12n * S; // the deadline: nobody told the threads
  now.ns += S; // a second on the floor: 5/s, burst 5
  assert.deepEqual(a.admit(50), { admitted: 5, leased: false });
  assert.deepEqual(b.admit(50), { admitted: 0, leased: false });
});

void test('a grant of an older lease generation stays on its floor when a newer lease renews the deadline', () => {
  const now = { ns: 10n * S };
  const deadline = LeaseDeadline.create();
  const writer = deadlineWriter(deadline, 0n);
  const table = new BucketTable({ capacity: 64, startNs: 0n });
  const t = thread(table, deadline, now);
  t.overrides.apply([
    {
      key: 'tenant/acme',
      rate: 100,
      burst: 100,
      leased: true,
      epoch: 3,
      lease: writer.currentGeneration(),
      floorRate: 5,
      floorBurst: 5,
    },
  ]);
  writer.renew(10_500);
  t.touch();
  now.ns = 11n * S;
  // The lease expired; the client forgot its grants and a new lease began before this thread applied
  // the floors (or the new grants): the old grant must not come back.
  writer.nextGeneration();
  writer.renew(20_000);
  now.ns = 12n * S;
  assert.deepEqual(t.admit(50), { admitted: 5, leased: false });
  // The new lease's grant, once applied, is in force.
  t.overrides.apply([
    {
      key: 'tenant/acme',
      rate: 100,
      burst: 100,
      leased: true,
      epoch: 4,
      lease: writer.currentGeneration(),
      floorRate: 5,
      floorBurst: 5,
    },
  ]);
  now.ns = 13n * S;
  assert.equal(t.admit(200).leased, true);
});
