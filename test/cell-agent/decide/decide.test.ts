// The decision in-process, on a virtual clock: envoyproxy/ratelimit's evaluation semantics
// (docs/envoy-ratelimit-rules.md §3) on GCRA buckets, all-or-nothing across levels,
// global quotas with static slices, caps and the unknown-tenant policies.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import { Decider, overrideKey } from '../../../cell-agent/decide/decide.js';
import type { Decision, DeciderOptions } from '../../../cell-agent/decide/decide.js';
import { parseQuotaFile, parseUnknownTenantPolicy } from '../../../cell-agent/decide/quota-file.js';
import { StaticQuotas, reportedLimit } from '../../../cell-agent/decide/quotas.js';
import type { UnknownTenantPolicy } from '../../../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';
import type { RlsDescriptor, RlsRequest } from '../../../cell-agent/messages/rls-messages.js';
import { VelocityKeys, VelocityTable } from '../../../cell-agent/velocity/velocity-table.js';

const S = 1_000_000_000n;

interface Harness {
  readonly decider: Decider;
  readonly clock: { now: bigint };
  readonly refused: Map<string, number>;
  readonly velocity: VelocityKeys;
  decide(req: RlsRequest): Decision;
  check(domain: string, ...descriptors: RlsDescriptor[]): Decision;
  /** Global buckets start empty when created: checks these descriptors with 0 hits (creating their
   * buckets), then lets 1000 s pass so that every bucket is full. */
  fill(domain: string, ...descriptors: RlsDescriptor[]): void;
}

function harness(
  rules: string,
  opts: {
    tenants?: unknown;
    share?: number;
    unknown?: UnknownTenantPolicy;
    headers?: boolean;
    startNs?: bigint;
    capacity?: number;
    tableFull?: 'open' | 'closed';
  } = {},
): Harness {
  const clock = { now: 10n * S };
  const table = new BucketTable({ capacity: opts.capacity ?? 1000, startNs: opts.startNs ?? 0n });
  const quotas = new StaticQuotas(parseQuotaFile(opts.tenants ?? {}), {
    staticShare: opts.share ?? 1,
    unknownTenant: opts.unknown ?? { kind: 'deny' },
  });
  const vt = VelocityTable.create({ capacity: 64, startNs: 0n });
  const velocity = new VelocityKeys(vt);
  vt.onNewKey = (s, g, k) => velocity.learn(s, g, k);
  const refused = new Map<string, number>();
  const options: DeciderOptions = {
    bounds: DEFAULT_REQUEST_BOUNDS,
    responseHeaders: opts.headers ?? false,
    tableFull: opts.tableFull ?? 'open',
    staticSlices: true,
  };
  const decider = new Decider(
    {
      table,
      quotas,
      clock: () => clock.now,
      velocity: vt,
      onRefused: (k, h) => refused.set(k, (refused.get(k) ?? 0) + h),
    },
    options,
  );
  decider.setRules(compileRules([parseRulesYaml(rules, 'rules.yaml')]));
  const decide = (req: RlsRequest): Decision => {
    const r = decider.decide(req);
    if (!r.ok) throw new Error(`unexpected failure: ${r.failure.message}`);
    return r.decision;
  };
  const check = (domain: string, ...descriptors: RlsDescriptor[]): Decision =>
    decide({ domain, descriptors, hitsAddend: 0 });
  const fill = (domain: string, ...descriptors: RlsDescriptor[]): void => {
    for (const d of descriptors) check(domain, { ...d, hitsAddend: 0 });
    clock.now += 1000n * S;
  };
  return { decider, clock, refused, velocity, decide, check, fill };
}

function desc(spec: string, extra: Partial<RlsDescriptor> = {}): RlsDescriptor {
  const entries = spec.split(',').map((pair) => {
    const at = pair.indexOf('=');
    return { key: pair.slice(0, at), value: pair.slice(at + 1) };
  });
  return { entries, limit: null, hitsAddend: null, ...extra };
}

const codes = (d: Decision): string =>
  d.response.statuses.map((s) => (s.code === 1 ? 'OK' : s.code === 2 ? 'OVER' : '?')).join(',');
const overall = (d: Decision): string => (d.response.overallCode === 1 ? 'OK' : 'OVER_LIMIT');

const BASIC = `
domain: basic
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 3, name: three}
  - key: key2
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: nested
    value: a
    descriptors:
      - key: sub
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: whitelisted
`;

void test('counting per unit: requests_per_unit tokens, refilled continuously over the unit', () => {
  const h = harness(BASIC);
  const seen = [1, 2, 3, 4].map(() => h.check('basic', desc('key1=value1')));
  assert.deepEqual(seen.map(overall), ['OK', 'OK', 'OK', 'OVER_LIMIT']);
  assert.deepEqual(
    seen.map((d) => d.response.statuses[0]?.limitRemaining),
    [2, 1, 0, 0],
  );
  assert.deepEqual(seen[0]?.response.statuses[0]?.currentLimit, { requestsPerUnit: 3, unit: 2, name: 'three' });
  assert.equal(seen[0]?.response.statuses[0]?.durationUntilReset?.seconds, 20, 'one token of 3/min refills in 20 s');
  assert.equal(
    seen[3]?.response.statuses[0]?.durationUntilReset?.seconds,
    20,
    'a refused request can pass again in 20 s',
  );
  assert.equal(seen[3]?.retryAfterNs, 20n * S);
  h.clock.now += 20n * S;
  assert.equal(overall(h.check('basic', desc('key1=value1'))), 'OK');
  assert.equal(overall(h.check('basic', desc('key1=value1'))), 'OVER_LIMIT');
  // Key-only descriptors count per value.
  assert.deepEqual(
    [1, 2, 3].map(() => overall(h.check('basic', desc('key2=a')))),
    ['OK', 'OK', 'OVER_LIMIT'],
  );
  assert.equal(overall(h.check('basic', desc('key2=b'))), 'OK');
  assert.equal(h.refused.get('basic|key2=a'), 1, 'the refusal is reported for the throttling log');
});

void test('no rule, unknown domain, unlimited, requests_per_unit 0, whitelisted', () => {
  const h = harness(BASIC);
  const d = h.check('basic', desc('nothing=here'), desc('free=x'), desc('whitelisted=y'));
  assert.equal(overall(d), 'OK');
  assert.deepEqual(d.response.statuses, [
    { code: 1, currentLimit: null, limitRemaining: 0, durationUntilReset: null },
    { code: 1, currentLimit: null, limitRemaining: 4294967295, durationUntilReset: null },
    { code: 1, currentLimit: null, limitRemaining: 0, durationUntilReset: null },
  ]);
  assert.equal(overall(h.check('elsewhere', desc('key1=value1'))), 'OK');
  assert.equal(overall(h.check('basic', desc('zero=1'))), 'OVER_LIMIT');
});

void test('nested descriptors match at the request depth; wildcards with share_threshold share one counter', () => {
  const h = harness(BASIC);
  assert.equal(overall(h.check('basic', desc('nested=a'))), 'OK', 'the shallower node has no limit');
  assert.equal(overall(h.check('basic', desc('nested=a,sub=1'))), 'OK');
  assert.equal(overall(h.check('basic', desc('nested=a,sub=1'))), 'OVER_LIMIT');
  assert.equal(overall(h.check('basic', desc('nested=a,sub=2'))), 'OK', 'per value');
  assert.equal(overall(h.check('basic', desc('nested=b,sub=1'))), 'OK', 'no rule for nested=b');
  assert.equal(overall(h.check('basic', desc('path=/files/a'))), 'OK');
  assert.equal(overall(h.check('basic', desc('path=/files/b'))), 'OK');
  assert.equal(overall(h.check('basic', desc('path=/files/c'))), 'OVER_LIMIT', 'all /files/* share one counter');
  assert.equal(overall(h.check('basic', desc('path=/other'))), 'OK');
});

void test('shadow_mode reports OK while its counter is exhausted; replaces drops the replaced limit', () => {
  const h = harness(BASIC);
  assert.equal(overall(h.check('basic', desc('shadow=x'))), 'OK');
  const d = h.check('basic', desc('shadow=x'));
  assert.equal(overall(d), 'OK');
  assert.deepEqual(d.response.statuses[0], {
    code: 1,
    currentLimit: { requestsPerUnit: 1, unit: 2, name: '' },
    limitRemaining: 0,
    durationUntilReset: { seconds: 60, nanos: 0 },
  });
  assert.equal(h.refused.size, 0, 'a shadow refusal is not throttling');

  const r = harness(`
domain: r
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 1, name: small}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 100, name: big, replaces: [{name: small}]}
`);
  assert.equal(overall(r.check('r', desc('a=1'))), 'OK');
  assert.equal(overall(r.check('r', desc('a=1'))), 'OVER_LIMIT');
  const both = r.check('r', desc('a=1'), desc('b=1'));
  assert.equal(overall(both), 'OK', 'with b present, a is replaced');
  assert.deepEqual(both.response.statuses[0], {
    code: 1,
    currentLimit: null,
    limitRemaining: 0,
    durationUntilReset: null,
  });
  assert.equal(both.response.statuses[1]?.limitRemaining, 99);
});

void test('hits_addend: request level (0 means 1), descriptor level overrides it, descriptor 0 checks without counting', () => {
  const h = harness(`
domain: h
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
`);
  const req = (hits: number, dh: number | null = null): Decision =>
    h.decide({ domain: 'h', hitsAddend: hits, descriptors: [desc('k=1', { hitsAddend: dh })] });
  assert.equal(req(0).response.statuses[0]?.limitRemaining, 9, 'request hits_addend 0 counts 1');
  assert.equal(req(4).response.statuses[0]?.limitRemaining, 5);
  assert.equal(req(4, 2).response.statuses[0]?.limitRemaining, 3, 'the descriptor hits_addend wins');
  for (let i = 0; i < 3; i++)
    assert.equal(req(9, 0).response.statuses[0]?.limitRemaining, 3, 'descriptor 0: a check that counts nothing');
  assert.equal(overall(req(4)), 'OVER_LIMIT', '4 hits do not fit in 3');
  assert.equal(req(0, 0).response.statuses[0]?.limitRemaining, 3, 'a refused request consumed nothing');
  assert.equal(overall(req(3)), 'OK');
  assert.equal(overall(req(0, 0)), 'OVER_LIMIT', 'an empty bucket: the check says a request would not pass');
  assert.equal(overall(req(11)), 'OVER_LIMIT');
});

void test("limit override: the request's own limit, counted apart from the configured rule, never in shadow mode", () => {
  const h = harness(`
domain: o
descriptors:
  - key: k
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
`);
  const over = (): Decision => h.check('o', desc('k=v', { limit: { requestsPerUnit: 2, unit: 2 } }));
  const first = over();
  assert.deepEqual(first.response.statuses[0], {
    code: 1,
    currentLimit: { requestsPerUnit: 2, unit: 2, name: '' },
    limitRemaining: 1,
    durationUntilReset: { seconds: 30, nanos: 0 },
  });
  assert.equal(overall(over()), 'OK');
  assert.equal(overall(over()), 'OVER_LIMIT', 'no shadow mode for an override');
  assert.equal(h.check('o', desc('k=v')).response.statuses[0]?.limitRemaining, 999, "the rule's counter is separate");
  assert.equal(overrideKey('o', [{ key: 'k', value: 'v' }]), '~o|o|k=v');
  // Not in a domain without rules: envoyproxy/ratelimit looks the domain up first, "no limit".
  assert.deepEqual(h.check('none', desc('x=y', { limit: { requestsPerUnit: 0, unit: 1 } })).response.statuses[0], {
    code: 1,
    currentLimit: null,
    limitRemaining: 0,
    durationUntilReset: null,
  });
});

void test('all or nothing: when one descriptor is over the limit, no other counter is consumed', () => {
  const h = harness(BASIC);
  assert.equal(overall(h.check('basic', desc('nested=a,sub=x'))), 'OK');
  for (let i = 0; i < 5; i++) {
    const d = h.check('basic', desc('key1=value1'), desc('nested=a,sub=x'));
    assert.equal(overall(d), 'OVER_LIMIT');
    assert.equal(codes(d), 'OK,OVER');
    assert.equal(d.response.statuses[0]?.limitRemaining, 3, 'key1 still has its 3 tokens');
  }
  assert.equal(h.check('basic', desc('key1=value1')).response.statuses[0]?.limitRemaining, 2);
});

void test('quota_mode: over only if every quota-mode descriptor is over', () => {
  const h = harness(`
domain: q
descriptors:
  - key: a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
`);
  h.check('q', desc('a=1'));
  const d = h.check('q', desc('a=1'), desc('b=1'));
  assert.equal(codes(d), 'OVER,OK');
  assert.equal(overall(d), 'OK', 'b still has quota');
  assert.equal(h.check('q', desc('b=1')).response.statuses[0]?.limitRemaining, 3, 'b was consumed by the OK request');
  assert.equal(overall(h.check('q', desc('a=1'))), 'OVER_LIMIT');
});

void test('RateLimit-* headers: the over-limit status, else the fewest remaining; absent without a limit', () => {
  const h = harness(BASIC, { headers: true });
  const d = h.check('basic', desc('key1=value1'), desc('key2=x'));
  assert.deepEqual(d.response.responseHeadersToAdd, [
    { key: 'RateLimit-Limit', value: '2' },
    { key: 'RateLimit-Remaining', value: '1' },
    { key: 'RateLimit-Reset', value: '1' },
  ]);
  h.check('basic', desc('zero=1'));
  const over = h.check('basic', desc('key1=value1'), desc('zero=1'));
  assert.deepEqual(
    over.response.responseHeadersToAdd.filter((x) => x.key.startsWith('RateLimit-')).map((x) => x.value),
    ['0', '0', '0'],
    'requests_per_unit 0: never resets',
  );
  assert.deepEqual(h.check('basic', desc('free=1')).response.responseHeadersToAdd, []);
});

void test('request errors: empty domain and descriptors as envoyproxy/ratelimit; bounds as INVALID_ARGUMENT', () => {
  const h = harness(BASIC);
  const fail = (req: RlsRequest): { code: number; message: string } => {
    const r = h.decider.decide(req);
    assert.equal(r.ok, false, 'a failure');
    return r.ok ? { code: -1, message: '' } : r.failure;
  };
  assert.deepEqual(fail({ domain: '', descriptors: [desc('a=b')], hitsAddend: 0 }), {
    code: 2,
    message: 'rate limit domain must not be empty',
  });
  assert.deepEqual(fail({ domain: 'basic', descriptors: [], hitsAddend: 0 }), {
    code: 2,
    message: 'rate limit descriptor list must not be empty',
  });
  assert.equal(fail({ domain: 'x'.repeat(257), descriptors: [desc('a=b')], hitsAddend: 0 }).code, 3);
  assert.match(
    fail({ domain: 'basic', descriptors: Array.from({ length: 65 }, () => desc('a=b')), hitsAddend: 0 }).message,
    /65 descriptors, more than the maximum of 64/,
  );
  assert.match(
    fail({
      domain: 'basic',
      descriptors: [desc(Array.from({ length: 17 }, (_, i) => `k${i}=v`).join(','))],
      hitsAddend: 0,
    }).message,
    /descriptor 0 has 17 entries/,
  );
  assert.match(
    fail({
      domain: 'basic',
      descriptors: [desc('a=b'), { entries: [{ key: 'k'.repeat(257), value: '' }], limit: null, hitsAddend: null }],
      hitsAddend: 0,
    }).message,
    /descriptor 1 entry 0: key is 257 characters/,
  );
  assert.match(
    fail({
      domain: 'basic',
      descriptors: [{ entries: [{ key: 'k', value: 'v'.repeat(4097) }], limit: null, hitsAddend: null }],
      hitsAddend: 0,
    }).message,
    /value is 4097 characters/,
  );
  assert.match(
    fail({ domain: 'basic', descriptors: [desc('a=b', { limit: { requestsPerUnit: 1, unit: 0 } })], hitsAddend: 0 })
      .message,
    /unit 0, not one of SECOND/,
  );
  const none = new Decider(
    {
      table: new BucketTable({ capacity: 10 }),
      quotas: StaticQuotas.empty({ staticShare: 1, unknownTenant: { kind: 'deny' } }),
      clock: () => 0n,
    },
    h.decider.options,
  );
  assert.deepEqual(none.decide({ domain: 'basic', descriptors: [desc('a=b')], hitsAddend: 0 }), {
    ok: false,
    failure: { code: 2, message: 'no rate limit configuration loaded' },
  });
});

const GLOBAL_RULES = `
domain: api
descriptors:
  - key: tenant
    global: true
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 2}
`;
const TENANTS = {
  tiers: { bronze: { rate: 10, burst: 4 }, gold: { rate: 100, burst: 10, cap: { rate: 10, burst: 6 } } },
  tenants: { acme: 'gold', globex: 'gold', initech: { tier: 'bronze', burst: 2 } },
};

void test("global quota: the tenant's tier slice, counted once per request, marked degraded (static slice)", () => {
  const h = harness(GLOBAL_RULES, { tenants: { tiers: TENANTS.tiers, tenants: { acme: 'bronze' } } });
  h.fill('api', desc('tenant=acme'));
  // Envoy sends both descriptors: the tenant quota is taken once, the per-address rule once.
  const d = h.check('api', desc('tenant=acme'), desc('tenant=acme,remote_address=1.1.1.1'));
  assert.equal(overall(d), 'OK');
  assert.equal(d.scope, 'global');
  assert.equal(d.degraded, true);
  assert.deepEqual(d.response.responseHeadersToAdd, [{ key: 'x-ratelimit-degraded', value: 'true' }]);
  assert.deepEqual(d.response.statuses[0], {
    code: 1,
    currentLimit: { requestsPerUnit: 10, unit: 1, name: 'bronze' },
    limitRemaining: 3,
    durationUntilReset: { seconds: 1, nanos: 0 },
  });
  assert.equal(d.response.statuses[1]?.limitRemaining, 1, 'per-address rule, 2/hour');
  // The nested descriptor alone still takes from the tenant's quota (every level it belongs to).
  const nestedOnly = h.check('api', desc('tenant=acme,remote_address=2.2.2.2'));
  assert.equal(
    nestedOnly.response.statuses[0]?.limitRemaining,
    1,
    'the fewest remaining: its own rule (2/hour) has 1 left, the tenant 2',
  );
  assert.deepEqual(
    [1, 2, 3].map(() => overall(h.check('api', desc('tenant=acme')))),
    ['OK', 'OK', 'OVER_LIMIT'],
    'burst 4, 2 used',
  );
  assert.equal(h.refused.get('tenant/acme'), 1);
  const velocity = h.velocity.snapshot(h.clock.now);
  assert.deepEqual(velocity, [{ key: 'tenant/acme', allowed: 4, refused: 1 }]);
  h.clock.now += S / 10n;
  assert.equal(overall(h.check('api', desc('tenant=acme'))), 'OK', 'rate 10/s: one token per 100 ms');
});

void test('global quotas start empty; local rules start full', () => {
  const startNs = 10n * S;
  const h = harness(GLOBAL_RULES, { tenants: { tiers: TENANTS.tiers, tenants: { acme: 'bronze' } }, startNs });
  const d = h.check('api', desc('tenant=acme,remote_address=1.1.1.1'));
  assert.equal(overall(d), 'OVER_LIMIT', 'no token for the tenant at start');
  assert.equal(d.response.statuses[0]?.currentLimit?.name, 'bronze');
  h.clock.now += S / 10n;
  assert.equal(
    overall(h.check('api', desc('tenant=acme,remote_address=1.1.1.1'))),
    'OK',
    'one token after 100 ms; the local rule was full',
  );
  h.clock.now += S;
  assert.equal(
    h.check('api', desc('tenant=acme'), desc('tenant=acme,remote_address=1.1.1.1')).response.statuses[1]
      ?.limitRemaining,
    0,
  );
});

void test('levels: tenant, tier cap and domain cap must all pass; a refusal at one consumes nothing at the others', () => {
  const h = harness(GLOBAL_RULES, { tenants: { ...TENANTS, domainCap: { rate: 1, burst: 9 } } });
  // gold tenants: 10 each, the gold cap 6 together, the domain cap 9.
  h.fill('api', desc('tenant=acme'), desc('tenant=globex'), desc('tenant=initech'));
  const take = (t: string): string => overall(h.check('api', desc(`tenant=${t}`)));
  assert.deepEqual(
    [1, 2, 3, 4].map(() => take('acme')),
    ['OK', 'OK', 'OK', 'OK'],
  );
  assert.deepEqual(
    [1, 2, 3].map(() => take('globex')),
    ['OK', 'OK', 'OVER_LIMIT'],
    'the gold cap (6) is shared',
  );
  const capped = h.check('api', desc('tenant=globex'));
  assert.equal(capped.response.statuses[0]?.currentLimit?.name, 'tier-cap:gold', 'the refusing level is reported');
  assert.deepEqual(
    [1, 2, 3].map(() => take('initech')),
    ['OK', 'OK', 'OVER_LIMIT'],
    'bronze with a tenant burst override of 2',
  );
  // 8 taken from the domain cap (9): one left. acme's own quota has 6 left, the gold cap none.
  h.clock.now += 10n * S; // gold cap refills to 6 (rate 10), domain cap to 9 (rate 1)
  assert.deepEqual(
    [1, 2, 3, 4, 5, 6, 7].map(() => take('acme')),
    ['OK', 'OK', 'OK', 'OK', 'OK', 'OK', 'OVER_LIMIT'],
  );
  assert.deepEqual(
    [1, 2, 3].map(() => take('initech')),
    ['OK', 'OK', 'OVER_LIMIT'],
    'domain cap: 9 - 6 = 3 left, initech burst 2',
  );
  assert.equal(take('globex'), 'OVER_LIMIT', 'gold cap empty');
  assert.equal(h.check('api', desc('tenant=acme')).response.statuses[0]?.limitRemaining, 0);
});

void test('static share: each level gets share × rate and floor(share × burst)', () => {
  const q = new StaticQuotas(parseQuotaFile(TENANTS), { staticShare: 0.34, unknownTenant: { kind: 'deny' } });
  const acme = q.resolve('acme');
  assert.equal(acme.kind, 'quota');
  if (acme.kind !== 'quota') return;
  assert.equal(acme.tenant.burst, 3);
  assert.ok(Math.abs(acme.tenant.rate - 34) < 1e-9, 'rate 34');
  assert.equal(acme.tier.cap?.burst, 2);
  assert.deepEqual(reportedLimit(0.5, 'x'), { requestsPerUnit: 30, unit: 2, name: 'x' });
  assert.deepEqual(
    new StaticQuotas(parseQuotaFile({ tiers: { t: { rate: 1, burst: 2 } } }), {
      staticShare: 0.3,
      unknownTenant: { kind: 'deny' },
    }).zeroSlices(),
    ['tier t'],
  );
  const h = harness(GLOBAL_RULES, {
    tenants: { tiers: { gold: { rate: 100, burst: 10 } }, tenants: { acme: 'gold' } },
    share: 0.5,
  });
  h.fill('api', desc('tenant=acme'));
  assert.deepEqual(
    [1, 2, 3, 4, 5, 6].map(() => overall(h.check('api', desc('tenant=acme')))),
    ['OK', 'OK', 'OK', 'OK', 'OK', 'OVER_LIMIT'],
    'half of burst 10',
  );
});

void test('unknown tenants: deny, allow, or a default tier', () => {
  const deny = harness(GLOBAL_RULES, { tenants: TENANTS, unknown: { kind: 'deny' } });
  const denied = deny.check('api', desc('tenant=stranger'), desc('x=y'));
  assert.equal(overall(denied), 'OVER_LIMIT');
  assert.deepEqual(denied.response.statuses[0], {
    code: 2,
    currentLimit: { requestsPerUnit: 0, unit: 1, name: 'unknown-tenant' },
    limitRemaining: 0,
    durationUntilReset: null,
  });
  assert.equal(deny.refused.get('tenant/stranger'), 1);

  const allow = harness(GLOBAL_RULES, {
    tenants: { ...TENANTS, domainCap: { rate: 1, burst: 2 } },
    unknown: { kind: 'allow' },
  });
  allow.fill('api', desc('tenant=stranger'));
  assert.deepEqual(
    [1, 2, 3].map(() => overall(allow.check('api', desc('tenant=stranger')))),
    ['OK', 'OK', 'OVER_LIMIT'],
    'allow: only the domain cap',
  );

  const tier = harness(GLOBAL_RULES, { tenants: TENANTS, unknown: { kind: 'tier', tier: 'bronze' } });
  tier.fill('api', desc('tenant=s1'), desc('tenant=s2'));
  assert.deepEqual(
    [1, 2, 3, 4, 5].map(() => overall(tier.check('api', desc('tenant=s1')))),
    ['OK', 'OK', 'OK', 'OK', 'OVER_LIMIT'],
    'bronze burst 4',
  );
  assert.equal(overall(tier.check('api', desc('tenant=s2'))), 'OK', 'each unknown tenant has its own bucket');
  assert.deepEqual(parseUnknownTenantPolicy('tier:gold'), { kind: 'tier', tier: 'gold' });
  assert.equal(parseUnknownTenantPolicy('maybe'), null);
  assert.throws(
    () =>
      new StaticQuotas(parseQuotaFile(TENANTS), { staticShare: 1, unknownTenant: { kind: 'tier', tier: 'platinum' } }),
    /tier 'platinum'/,
  );
  assert.throws(() => parseQuotaFile({ tiers: {}, tenants: { a: 'nope' } }), /tenants\.a: unknown tier 'nope'/);
});

void test('an override never lifts a global quota', () => {
  const h = harness(GLOBAL_RULES, { tenants: { tiers: TENANTS.tiers, tenants: { acme: 'bronze' } } });
  const withOverride = (): Decision =>
    h.check('api', desc('tenant=acme', { limit: { requestsPerUnit: 1000, unit: 1 } }));
  h.fill('api', desc('tenant=acme'));
  assert.deepEqual(
    [1, 2, 3, 4, 5].map(() => overall(withOverride())),
    ['OK', 'OK', 'OK', 'OK', 'OVER_LIMIT'],
  );
});

void test('table full: fail open (counted, degraded) or closed, as configured', () => {
  const rules = `
domain: t
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
`;
  for (const policy of ['open', 'closed'] as const) {
    const h = harness(rules, { capacity: 1, tableFull: policy });
    assert.equal(overall(h.check('t', desc('k=1'))), 'OK');
    const d = h.check('t', desc('k=2'));
    assert.equal(d.tableFull, true);
    assert.equal(overall(d), policy === 'open' ? 'OK' : 'OVER_LIMIT');
    assert.equal(d.degraded, true);
  }
});
