// The decision's global fast path (Decider.decideOneGlobal: one descriptor counted in one tenant
// quota alone, on a live leased grant) gives exactly the answer of the general path (`fastPath:
// false`), request after request on one virtual clock: the same decision, the same velocity records
// and throttle-log calls, for generated sequences of grants (leased or floors, with and without a
// lease generation and a floor), tier parents and their caps, domain caps, removals, lease renewals
// and ends, clock steps, and checks whose shape is or is not the common case (a nested path, a global
// ancestor, a limit override, 0 or several hits, another domain, an unknown
// tenant). Each decider has its own bucket table and coordinator entries; both read one lease deadline.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import { Decider } from '../../../cell-agent/decide/decide.js';
import type { Decision } from '../../../cell-agent/decide/decide.js';
import { CoordinatedQuotas } from '../../../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { LeaseDeadline, deadlineWriter } from '../../../cell-agent/lease/lease-deadline.js';
import { QuotaOverrides } from '../../../cell-agent/lease/quota-overrides.js';
import type { OverrideEntry } from '../../../cell-agent/lease/quota-overrides.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';
import type { RlsRequest } from '../../../cell-agent/messages/rls-messages.js';

const S = 1_000_000_000n;
const RULES = `domain: api
descriptors:
  - key: tenant
    global: true
  - key: app
    descriptors:
      - key: tenant
        global: true
  - key: org
    global: true
    descriptors:
      - key: tenant
        rate_limit: { unit: second, requests_per_unit: 100 }
  - key: ip
    rate_limit: { unit: second, requests_per_unit: 5 }
`;
const OTHER = `domain: other
descriptors:
  - key: tenant
    global: true
`;
const TENANTS = ['a', 'b', 'x|y'];

type Op =
  | {
      op: 'grant';
      key: string;
      rate: number;
      burst: number;
      leased: boolean;
      withLease: boolean;
      floor: number;
      parent: boolean;
      epoch: number;
    }
  | { op: 'remove'; key: string }
  | { op: 'renew'; ms: number }
  | { op: 'end' }
  | { op: 'step'; ns: number }
  | {
      op: 'check';
      tenant: string;
      shape: 'tenant' | 'app' | 'org' | 'override' | 'ip';
      domain: 'api' | 'other' | 'none';
      hits: number | null;
      requestHits: number;
      /** ns the clock moves first. */
      wait: number;
    };

const quotaKey = fc.oneof(
  { weight: 14, arbitrary: fc.constantFrom(...TENANTS, 'z').map((t) => `tenant/${t}`) },
  { weight: 1, arbitrary: fc.constant('tier/gold') },
  { weight: 1, arbitrary: fc.constantFrom('domain/api', 'domain/other') },
);

/** A grant's rate or burst: mostly one that admits something. */
const countArb = fc.oneof(
  { weight: 1, arbitrary: fc.constant(0) },
  { weight: 6, arbitrary: fc.integer({ min: 1, max: 40 }) },
);

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant('grant' as const),
      key: quotaKey,
      rate: countArb,
      burst: countArb,
      leased: fc.integer({ min: 0, max: 3 }).map((x) => x > 0),
      withLease: fc.boolean(),
      floor: fc.integer({ min: 0, max: 5 }),
      parent: fc.integer({ min: 0, max: 3 }).map((x) => x === 0),
      epoch: fc.integer({ min: 1, max: 5 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('remove' as const), key: quotaKey }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('renew' as const), ms: fc.integer({ min: 0, max: 3_000 }) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('end' as const) }) },
  {
    weight: 2,
    arbitrary: fc.record({ op: fc.constant('step' as const), ns: fc.integer({ min: 0, max: 1_500_000_000 }) }),
  },
  {
    weight: 8,
    arbitrary: fc.record({
      op: fc.constant('check' as const),
      tenant: fc.constantFrom(...TENANTS, 'z'),
      shape: fc.oneof(
        { weight: 8, arbitrary: fc.constant('tenant' as const) },
        { weight: 1, arbitrary: fc.constantFrom('app' as const, 'org' as const) },
        { weight: 1, arbitrary: fc.constantFrom('override' as const, 'ip' as const) },
      ),
      domain: fc.oneof(
        { weight: 8, arbitrary: fc.constant('api' as const) },
        { weight: 1, arbitrary: fc.constantFrom('other' as const, 'none' as const) },
      ),
      hits: fc.oneof(
        { weight: 4, arbitrary: fc.constant(null) },
        { weight: 1, arbitrary: fc.integer({ min: 0, max: 6 }) },
      ),
      requestHits: fc.integer({ min: 0, max: 3 }),
      wait: fc.oneof(fc.constant(0), fc.integer({ min: 0, max: 300_000_000 })),
    }),
  },
);

function requestOf(c: Extract<Op, { op: 'check' }>): RlsRequest {
  const tenant = { key: 'tenant', value: c.tenant };
  const entries =
    c.shape === 'app'
      ? [{ key: 'app', value: 'web' }, tenant]
      : c.shape === 'org'
        ? [{ key: 'org', value: 'o1' }, tenant]
        : c.shape === 'ip'
          ? [{ key: 'ip', value: c.tenant }]
          : [tenant];
  return {
    domain: c.domain,
    descriptors: [
      {
        entries,
        limit: c.shape === 'override' ? { requestsPerUnit: 3, unit: 1 } : null,
        hitsAddend: c.hits,
      },
    ],
    hitsAddend: c.requestHits,
  };
}

interface Side {
  readonly decider: Decider;
  readonly overrides: QuotaOverrides;
  readonly log: string[];
}

function side(fastPath: boolean, deadline: LeaseDeadline, now: { ns: bigint }): Side {
  const overrides = new QuotaOverrides(LeaseDeadline.attach(deadline.shared));
  const log: string[] = [];
  const decider = new Decider(
    {
      table: new BucketTable({ capacity: 64, startNs: 0n }),
      quotas: new CoordinatedQuotas(overrides),
      clock: () => now.ns,
      overrides,
      deadline: LeaseDeadline.attach(deadline.shared),
      velocity: {
        record: (key, allowed, refused, nowNs) => void log.push(`v ${key} +${allowed} -${refused} @${nowNs}`),
      },
      onRefused: (key, hits, why) => void log.push(`r ${key} ${hits} ${JSON.stringify(why)}`),
    },
    {
      bounds: DEFAULT_REQUEST_BOUNDS,
      responseHeaders: false,
      tableFull: 'open',
      staticSlices: false,
      cell: 'c1',
      fastPath,
    },
  );
  decider.setRules(compileRules([parseRulesYaml(RULES, 'api.yaml'), parseRulesYaml(OTHER, 'other.yaml')]));
  return { decider, overrides, log };
}

/** A decision as plain data, copied (decideInPlace's objects are overwritten by the next call);
 * a function (a limit's floor hook: each side's own) by its name. */
function plain(d: Decision): unknown {
  const copy = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(copy);
    if (typeof v === 'function') return `function ${v.name}`;
    if (v === null || typeof v !== 'object') return v;
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, copy(x)]));
  };
  return copy(d);
}

void test('the global fast path answers as the general path does, request after request', () => {
  let admittedLeased = 0;
  let checks = 0;
  fc.assert(
    fc.property(fc.array(opArb, { minLength: 1, maxLength: 80, size: 'max' }), fc.boolean(), (ops, inPlace) => {
      const now = { ns: 10n * S };
      const deadline = LeaseDeadline.create();
      const writer = deadlineWriter(deadline, 0n);
      const fast = side(true, deadline, now);
      const general = side(false, deadline, now);
      for (const op of ops) {
        if (op.op === 'grant' || op.op === 'remove') {
          let entry: OverrideEntry;
          if (op.op === 'remove') entry = { key: op.key, remove: true };
          else {
            const leaseOf = op.leased && op.withLease ? writer.currentGeneration() : undefined;
            entry = {
              key: op.key,
              rate: op.rate,
              burst: op.burst,
              leased: op.leased,
              epoch: op.epoch,
              ...(op.parent && op.key.startsWith('tenant/') ? { parent: 'tier/gold' } : {}),
              ...(leaseOf === undefined ? {} : { lease: leaseOf, floorRate: op.floor, floorBurst: op.floor }),
            };
          }
          fast.overrides.apply([entry]);
          general.overrides.apply([entry]);
        } else if (op.op === 'renew') {
          writer.renew(Number(now.ns / 1_000_000n) + op.ms);
        } else if (op.op === 'end') {
          writer.nextGeneration();
        } else if (op.op === 'step') {
          now.ns += BigInt(op.ns);
        } else {
          now.ns += BigInt(op.wait);
          const req = requestOf(op);
          const a = inPlace ? fast.decider.decideInPlace(req) : fast.decider.decide(req);
          const pa = a.ok ? plain(a.decision) : a;
          const b = general.decider.decide(req);
          assert.deepStrictEqual(pa, b.ok ? plain(b.decision) : b, `check ${JSON.stringify(op)}`);
          checks++;
          if (b.ok && b.decision.scope === 'global' && !b.decision.overLimit && !b.decision.degraded) admittedLeased++;
        }
        assert.deepStrictEqual(fast.log, general.log);
      }
    }),
    { numRuns: 400 },
  );
  // The common case the fast path decides is reached often enough for the comparison to mean something.
  assert.ok(admittedLeased > checks / 50, `${admittedLeased} leased global admissions of ${checks} checks`);
});

void test('a leased tenant is admitted on the fast path with the grant as its status, and its demand recorded', () => {
  const now = { ns: 10n * S };
  const deadline = LeaseDeadline.create();
  const writer = deadlineWriter(deadline, 0n);
  const s = side(true, deadline, now);
  s.overrides.apply([
    {
      key: 'tenant/a',
      rate: 10,
      burst: 10,
      leased: true,
      epoch: 2,
      lease: writer.currentGeneration(),
      floorRate: 1,
      floorBurst: 1,
    },
  ]);
  writer.renew(60_000);
  const req: RlsRequest = {
    domain: 'api',
    descriptors: [{ entries: [{ key: 'tenant', value: 'a' }], limit: null, hitsAddend: null }],
    hitsAddend: 0,
  };
  s.decider.decide({ ...req, hitsAddend: 0, descriptors: [{ ...req.descriptors[0]!, hitsAddend: 0 }] }); // creates the bucket
  now.ns += S; // refilled to its burst
  let admitted = 0;
  for (let i = 0; i < 15; i++) {
    const r = s.decider.decideInPlace(req);
    assert.ok(r.ok);
    if (!r.decision.overLimit) {
      admitted++;
      assert.equal(r.decision.scope, 'global');
      assert.equal(r.decision.degraded, false);
      assert.equal(r.decision.response.statuses[0]?.limitRemaining, 10 - admitted);
    }
  }
  assert.equal(admitted, 10, 'the grant: 10, burst 10');
  assert.equal(s.log.filter((l) => l.startsWith('v tenant/a +1 -0')).length, 10);
  assert.equal(s.log.filter((l) => l.startsWith('v tenant/a +0 -1')).length, 5);
});
