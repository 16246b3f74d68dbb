// The decision's fast path (one descriptor counted in one local bucket: Decider.decideOneLocal, the
// bucket key hashed from the request's parts) gives exactly the answer of the general path
// (`fastPath: false`): the same response, refusal, Retry-After and throttle-log calls, request after
// request on one virtual clock, for generated rule sets (nested keys, key-only, wildcard and
// share_threshold nodes, names, bursts, shadow and quota mode, replaces, global rules) and request
// values holding the key format's special characters.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import { hashKey, KeyHashStream } from '../../../cell-agent/buckets/key-hash.js';
import { Decider, escapeKeyPart } from '../../../cell-agent/decide/decide.js';
import type { Decision } from '../../../cell-agent/decide/decide.js';
import { parseQuotaFile } from '../../../cell-agent/decide/quota-file.js';
import { StaticQuotas } from '../../../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';
import type { RlsRequest } from '../../../cell-agent/messages/rls-messages.js';

const S = 1_000_000_000n;
const VALUES = ['a', 'b', 'x|y', 'k=v', '~t', 'back\\slash', '', 'ü'];

void test('a key hashed in parts is the key hashed whole', () => {
  fc.assert(
    fc.property(
      fc.array(fc.tuple(fc.boolean(), fc.string({ unit: 'binary', maxLength: 12 })), { maxLength: 6 }),
      fc.integer(),
      (parts, seed) => {
        const stream = new KeyHashStream();
        stream.begin(seed);
        let whole = '';
        for (const [escape, text] of parts) {
          if (escape) stream.escaped(text);
          else stream.raw(text);
          whole += escape ? escapeKeyPart(text) : text;
        }
        const a = new Int32Array(3);
        const b = new Int32Array(3);
        stream.end(a);
        hashKey(whole, seed, b);
        assert.deepEqual([...a], [...b]);
      },
    ),
    { numRuns: 500 },
  );
});

interface RuleSpec {
  key: string;
  value: string | null;
  rpu: number;
  name: boolean;
  burst: number | null;
  mode: 'plain' | 'shadow' | 'quota' | 'replaces' | 'global' | 'share';
  child: boolean;
}

const ruleArb: fc.Arbitrary<RuleSpec> = fc.record({
  key: fc.constantFrom('ip', 'user', 'path'),
  value: fc.option(fc.constantFrom('a', 'b', 'x*'), { nil: null }),
  rpu: fc.integer({ min: 0, max: 5 }),
  name: fc.boolean(),
  burst: fc.option(fc.integer({ min: 1, max: 4 }), { nil: null }),
  mode: fc.constantFrom('plain', 'plain', 'plain', 'shadow', 'quota', 'replaces', 'global', 'share'),
  child: fc.boolean(),
});

function rulesYaml(specs: readonly RuleSpec[]): string {
  const seen = new Set<string>();
  const lines = ['domain: "d|1"', 'descriptors:'];
  specs.forEach((r, i) => {
    const id = `${r.key}=${r.value ?? ''}`;
    if (seen.has(id)) return;
    seen.add(id);
    lines.push(`  - key: ${r.key}`);
    if (r.value !== null) lines.push(`    value: "${r.value}"`);
    if (r.mode === 'share' && r.value === 'x*') lines.push('    share_threshold: true');
    if (r.mode === 'global' && r.value === null) lines.push('    global: true');
    else {
      const name = r.name ? `, name: "rule ${i}"` : '';
      const burst = r.burst === null ? '' : `, burst: ${Math.max(r.burst, r.rpu)}`;
      const replaces = r.mode === 'replaces' && r.name ? `, replaces: [{name: "rule ${i + 1}"}]` : '';
      lines.push(`    rate_limit: {unit: second, requests_per_unit: ${r.rpu}${name}${burst}${replaces}}`);
      if (r.mode === 'shadow') lines.push('    shadow_mode: true');
      if (r.mode === 'quota') lines.push('    quota_mode: true');
    }
    if (r.child)
      lines.push('    descriptors:', '      - key: ip', '        rate_limit: {unit: second, requests_per_unit: 2}');
  });
  return lines.join('\n') + '\n';
}

const stepArb = fc.record({
  entries: fc.array(fc.record({ key: fc.constantFrom('ip', 'user', 'path'), value: fc.constantFrom(...VALUES) }), {
    minLength: 1,
    maxLength: 2,
  }),
  hits: fc.option(fc.integer({ min: 0, max: 6 }), { nil: null }),
  requestHits: fc.integer({ min: 0, max: 3 }),
  advanceMs: fc.integer({ min: 0, max: 700 }),
});

function deciderPair(
  yaml: string,
  fastPath: boolean,
  headers: boolean,
): { decider: Decider; refused: string[]; clock: { now: bigint } } {
  const clock = { now: 10n * S };
  const table = new BucketTable({ capacity: 64, seed: 7 });
  const quotas = new StaticQuotas(
    parseQuotaFile({ tiers: { t: { rate: 3, burst: 3 } }, tenants: { a: { tier: 't' } } }),
    { staticShare: 1, unknownTenant: { kind: 'deny' } },
  );
  const refused: string[] = [];
  const decider = new Decider(
    { table, quotas, clock: () => clock.now, onRefused: (k, h, why) => refused.push(JSON.stringify([k, h, why])) },
    {
      bounds: DEFAULT_REQUEST_BOUNDS,
      responseHeaders: headers,
      tableFull: 'open',
      staticSlices: true,
      cell: 'c1',
      fastPath,
    },
  );
  decider.setRules(compileRules([parseRulesYaml(yaml, 'rules.yaml')]));
  return { decider, refused, clock };
}

void test('the fast path answers exactly as the general path', () => {
  fc.assert(
    fc.property(
      fc.array(ruleArb, { minLength: 1, maxLength: 5 }),
      fc.array(stepArb, { minLength: 1, maxLength: 40 }),
      fc.boolean(),
      (specs, steps, headers) => {
        const yaml = rulesYaml(specs);
        const fast = deciderPair(yaml, true, headers);
        const general = deciderPair(yaml, false, headers);
        for (const step of steps) {
          const req: RlsRequest = {
            domain: 'd|1',
            hitsAddend: step.requestHits,
            descriptors: [{ entries: step.entries, limit: null, hitsAddend: step.hits }],
          };
          const a = fast.decider.decide(req);
          const b = general.decider.decide(req);
          assert.deepEqual(a, b, `${yaml}\n${JSON.stringify(req)}`);
          fast.clock.now += BigInt(step.advanceMs) * 1_000_000n;
          general.clock.now = fast.clock.now;
        }
        assert.deepEqual(fast.refused, general.refused);
      },
    ),
    { numRuns: 300 },
  );
});

void test('the fast path is taken for the common case and refuses like the general path', () => {
  const yaml =
    'domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2, name: per-ip}\n';
  const { decider, refused } = deciderPair(yaml, true, true);
  const req: RlsRequest = {
    domain: 'edge',
    hitsAddend: 0,
    descriptors: [{ entries: [{ key: 'remote_address', value: '192.0.2.1' }], limit: null, hitsAddend: null }],
  };
  const answers: Decision[] = [];
  for (let i = 0; i < 3; i++) {
    const r = decider.decide(req);
    assert.ok(r.ok);
    answers.push(r.decision);
  }
  assert.deepEqual(
    answers.map((d) => d.overLimit),
    [false, false, true],
  );
  assert.deepEqual(answers[2]?.refusal, {
    level: 'local-rule',
    limit: 'per-ip',
    decidedOn: null,
    epoch: null,
    cell: 'c1',
  });
  assert.equal(answers[2]?.retryAfterNs, 30n * S);
  assert.deepEqual(
    refused.map((r) => (JSON.parse(r) as unknown[])[0]),
    ['edge|remote_address=192.0.2.1'],
  );
});
