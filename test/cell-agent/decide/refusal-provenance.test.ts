// Every refusal says why: which level refused (a local rule by name, the tenant quota, the tier cap,
// an unknown tenant), whether the cell decided on a lease (with its epoch), a floor or a static
// share, and which cell — in the answer's response_headers_to_add (Envoy passes them with its 429),
// in the Decision, and to the throttling log's callback. Admitted answers carry none of it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import {
  CELL_HEADER,
  DECIDED_ON_HEADER,
  Decider,
  REFUSED_BY_HEADER,
  REFUSED_LIMIT_HEADER,
  type Decision,
} from '../../../cell-agent/decide/decide.js';
import type { Refusal } from '../../../cell-agent/messages/refusal.js';
import { parseQuotaFile } from '../../../cell-agent/decide/quota-file.js';
import { StaticQuotas } from '../../../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { QuotaOverrides } from '../../../cell-agent/lease/quota-overrides.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';

const S = 1_000_000_000n;
const RULES = `
domain: api
descriptors:
  - key: tenant
    global: true
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1, name: per-address}
`;
const TENANTS = {
  tiers: { gold: { rate: 10, burst: 2, cap: { rate: 10, burst: 3 } } },
  tenants: { acme: 'gold', globex: 'gold' },
};

function setup(overrides: QuotaOverrides | null) {
  const now = { ns: 10n * S };
  const refusals: { key: string; why: Refusal }[] = [];
  const decider = new Decider(
    {
      table: new BucketTable({ capacity: 100, startNs: 0n }),
      quotas: new StaticQuotas(parseQuotaFile(TENANTS), { staticShare: 1, unknownTenant: { kind: 'deny' } }),
      clock: () => now.ns,
      onRefused: (key, _h, why) => refusals.push({ key, why }),
      overrides,
    },
    {
      bounds: DEFAULT_REQUEST_BOUNDS,
      responseHeaders: false,
      tableFull: 'open',
      staticSlices: overrides === null,
      cell: 'eu-west',
    },
  );
  decider.setRules(compileRules([parseRulesYaml(RULES, 'rules.yaml')]));
  const check = (key: string, value: string, hits: number | null = null): Decision => {
    const r = decider.decide({
      domain: 'api',
      descriptors: [{ entries: [{ key, value }], limit: null, hitsAddend: hits }],
      hitsAddend: 0,
    });
    if (!r.ok) throw new Error(r.failure.message);
    return r.decision;
  };
  /** Global buckets start empty when created: a 0-hit check creates them, then 1 s lets them fill. */
  const fill = (...tenants: string[]): void => {
    for (const t of tenants) check('tenant', t, 0);
    now.ns += S;
  };
  return { check, fill, refusals, now };
}

function headers(d: Decision): Record<string, string> {
  return Object.fromEntries(
    d.response.responseHeadersToAdd
      .filter((h) => h.key.startsWith('x-ratelimit-') && h.key !== 'x-ratelimit-degraded')
      .map((h) => [h.key, h.value]),
  );
}

void test('a local rule refuses: named, no lease, the cell', () => {
  const s = setup(null);
  assert.deepEqual(headers(s.check('remote_address', '1.1.1.1')), {}, 'admitted: no provenance');
  const d = s.check('remote_address', '1.1.1.1');
  assert.equal(d.overLimit, true);
  assert.deepEqual(headers(d), {
    [REFUSED_BY_HEADER]: 'local-rule',
    [REFUSED_LIMIT_HEADER]: 'per-address',
    [CELL_HEADER]: 'eu-west',
  });
  assert.deepEqual(d.refusal, {
    level: 'local-rule',
    limit: 'per-address',
    decidedOn: null,
    epoch: null,
    cell: 'eu-west',
  });
  assert.equal(s.refusals[0]?.why.level, 'local-rule');
});

void test('the tier cap and the tenant quota on static shares; an unknown tenant', () => {
  const s = setup(null);
  // Global buckets start empty: the tenant (burst 2) and the cap (burst 3) fill at 10/s.
  s.fill('acme', 'globex');
  for (let i = 0; i < 2; i++) assert.equal(s.check('tenant', 'acme').overLimit, false);
  const tenant = s.check('tenant', 'acme');
  assert.deepEqual(headers(tenant), {
    [REFUSED_BY_HEADER]: 'tenant-quota',
    [REFUSED_LIMIT_HEADER]: 'tenant/acme',
    [DECIDED_ON_HEADER]: 'static-share',
    [CELL_HEADER]: 'eu-west',
  });
  // globex has its own tokens, the tier's cap (3, two used by acme) has one left, then none.
  assert.equal(s.check('tenant', 'globex').overLimit, false);
  const cap = s.check('tenant', 'globex');
  assert.equal(cap.refusal?.level, 'tier-cap');
  assert.equal(cap.refusal?.limit, 'tier/gold');
  const unknown = s.check('tenant', 'nobody');
  assert.equal(unknown.refusal?.level, 'unknown-tenant');
  assert.equal(unknown.refusal?.decidedOn, null);
});

void test("on a lease the epoch is named; after the lease, the floor with the grant's epoch", () => {
  const overrides = new QuotaOverrides();
  overrides.apply([{ key: 'tenant/acme', rate: 10, burst: 1, leased: true, epoch: 7 }]);
  const s = setup(overrides);
  s.fill('acme');
  assert.equal(s.check('tenant', 'acme').overLimit, false);
  const leased = s.check('tenant', 'acme');
  assert.equal(headers(leased)[DECIDED_ON_HEADER], 'lease epoch=7');
  assert.deepEqual(leased.refusal, {
    level: 'tenant-quota',
    limit: 'tenant/acme',
    decidedOn: 'lease',
    epoch: 7,
    cell: 'eu-west',
  });
  overrides.apply([{ key: 'tenant/acme', rate: 1, burst: 1, leased: false, epoch: 7 }]);
  const floor = s.check('tenant', 'acme');
  assert.equal(headers(floor)[DECIDED_ON_HEADER], 'floor epoch=7');
  assert.equal(s.refusals.at(-1)?.why.decidedOn, 'floor');
});
