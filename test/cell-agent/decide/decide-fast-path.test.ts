// The decision's fast paths (one descriptor counted in one local bucket: Decider.decideOneLocal; two
// to four descriptors each counted in a local bucket of its own: Decider.decideLocals, all or
// nothing; the bucket keys hashed from the request's parts) give exactly the answer of the general
// path (`fastPath: false`): the same response, refusal, Retry-After and throttle-log calls, request
// after request on one virtual clock, for generated rule sets (nested keys, key-only, wildcard and
// share_threshold nodes, names, bursts, shadow and quota mode, replaces, global rules), request
// values holding the key format's special characters, and tables small enough to fill (both
// table-full policies).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import { hashKey, KeyHashStream, STATE_WORDS } from '../../../cell-agent/buckets/key-hash.js';
import { Decider } from '../../../cell-agent/decide/decide.js';
import { escapeKeyPart } from '../../../cell-agent/rules/rules-match.js';
import type { Decision } from '../../../cell-agent/decide/decide.js';
import { parseQuotaFile } from '../../../cell-agent/decide/quota-file.js';
import { StaticQuotas } from '../../../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';
import type { RlsRequest } from '../../../cell-agent/messages/rls-messages.js';

const S = 1_000_000_000n;
const VALUES = ['a', 'b', 'x|y', 'k=v', '~t', 'back\\slash', '', 'ü'];

const shared = new KeyHashStream();

void test('a key hashed in parts is the key hashed whole', () => {
  fc.assert(
    fc.property(
      fc.array(fc.tuple(fc.boolean(), fc.string({ unit: 'binary', maxLength: 12 })), { maxLength: 6 }),
      fc.integer(),
      fc.constantFrom('', 'd|ip=', 'd|user=', 'x'),
      fc.integer({ min: 0, max: 3 }),
      (parts, seed, head, saveAt) => {
        // One stream for many keys (its head memo kept across them), as a table's stream is.
        const stream = shared;
        const saved = new Int32Array(STATE_WORDS);
        stream.begin(seed);
        stream.head(head);
        let whole = head;
        parts.forEach(([escape, text], i) => {
          if (i === saveAt) {
            // Saved, overwritten by another key, restored: the key goes on as if never interrupted.
            stream.save(saved, 0);
            stream.begin(seed ^ 1);
            stream.head('d|ip=');
            stream.raw(text);
            stream.restore(saved, 0);
          }
          if (escape) stream.escaped(text);
          else stream.raw(text);
          whole += escape ? escapeKeyPart(text) : text;
        });
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

const descriptorArb = fc.record({
  entries: fc.array(fc.record({ key: fc.constantFrom('ip', 'user', 'path'), value: fc.constantFrom(...VALUES) }), {
    minLength: 1,
    maxLength: 2,
  }),
  hits: fc.option(fc.integer({ min: 0, max: 6 }), { nil: null }),
});

const stepArb = fc.record({
  // Mostly one descriptor (decideOneLocal), else two to four (decideLocals; four is its largest).
  descriptors: fc.oneof(
    fc.array(descriptorArb, { minLength: 1, maxLength: 1 }),
    fc.array(descriptorArb, { minLength: 2, maxLength: 4 }),
  ),
  requestHits: fc.integer({ min: 0, max: 3 }),
  advanceMs: fc.integer({ min: 0, max: 700 }),
});

type Step = { descriptors: Descriptor[]; requestHits: number; advanceMs: number };
type Descriptor = typeof descriptorArb extends fc.Arbitrary<infer D> ? D : never;

interface TableSpec {
  readonly capacity: number;
  readonly tableFull: 'open' | 'closed';
}

const tableArb: fc.Arbitrary<TableSpec> = fc.record({
  // 3 keys: the table fills, and a take meets 'table-full' (its policy applied, the answer marked).
  capacity: fc.constantFrom(64, 64, 3),
  tableFull: fc.constantFrom('open', 'closed'),
});

function deciderPair(
  yaml: string,
  fastPath: boolean,
  headers: boolean,
  spec: TableSpec = { capacity: 64, tableFull: 'open' },
): { decider: Decider; refused: string[]; clock: { now: bigint } } {
  const clock = { now: 10n * S };
  const table = new BucketTable({ capacity: spec.capacity, seed: 7 });
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
      tableFull: spec.tableFull,
      staticSlices: true,
      cell: 'c1',
      fastPath,
    },
  );
  decider.setRules(compileRules([parseRulesYaml(yaml, 'rules.yaml')]));
  return { decider, refused, clock };
}

/** Runs the steps through a fast-path and a general-path decider on the same rules: every answer and
 * every refusal report the same. */
function bothPathsAgree(specs: RuleSpec[], steps: readonly Step[], headers: boolean, spec: TableSpec): void {
  const yaml = rulesYaml(specs);
  const fast = deciderPair(yaml, true, headers, spec);
  const general = deciderPair(yaml, false, headers, spec);
  // decideInPlace (the embedded limiter's call) on a third decider: the same answers.
  const inPlace = deciderPair(yaml, true, headers, spec);
  for (const step of steps) {
    const req: RlsRequest = {
      domain: 'd|1',
      hitsAddend: step.requestHits,
      descriptors: step.descriptors.map((d) => ({ entries: d.entries, limit: null, hitsAddend: d.hits })),
    };
    const a = fast.decider.decide(req);
    const b = general.decider.decide(req);
    assert.deepEqual(a, b, `${yaml}\n${JSON.stringify(req)}`);
    assert.deepEqual(inPlace.decider.decideInPlace(req), b, `in place: ${yaml}\n${JSON.stringify(req)}`);
    fast.clock.now += BigInt(step.advanceMs) * 1_000_000n;
    general.clock.now = fast.clock.now;
    inPlace.clock.now = fast.clock.now;
  }
  assert.deepEqual(fast.refused, general.refused);
  assert.deepEqual(inPlace.refused, general.refused);
}

void test('the fast path answers exactly as the general path', () => {
  fc.assert(
    fc.property(
      fc.array(ruleArb, { minLength: 1, maxLength: 5 }),
      fc.array(stepArb, { minLength: 1, maxLength: 40 }),
      fc.boolean(),
      tableArb,
      bothPathsAgree,
    ),
    { numRuns: 400 },
  );
});

/** Rules where most descriptors are counted in one local bucket: a plain key-only rule for every key,
 * after a few generated ones (which come first, so some keys get a value, a mode or a child). */
const localRulesArb: fc.Arbitrary<RuleSpec[]> = fc.array(ruleArb, { maxLength: 3 }).chain((extra) =>
  fc
    .tuple(
      ...['ip', 'user', 'path'].map((key) =>
        fc.record({
          key: fc.constant(key),
          value: fc.constant(null),
          rpu: fc.integer({ min: 0, max: 4 }),
          name: fc.boolean(),
          burst: fc.option(fc.integer({ min: 1, max: 4 }), { nil: null }),
          mode: fc.constant<RuleSpec['mode']>('plain'),
          child: fc.boolean(),
        }),
      ),
    )
    .map((base) => [...extra, ...base]),
);

const localsStepArb = fc.record({
  descriptors: fc.array(descriptorArb, { minLength: 2, maxLength: 5 }),
  requestHits: fc.integer({ min: 0, max: 2 }),
  advanceMs: fc.integer({ min: 0, max: 400 }),
});

void test('several descriptors: the fast path answers exactly as the general path', () => {
  fc.assert(
    fc.property(
      localRulesArb,
      fc.array(localsStepArb, { minLength: 1, maxLength: 40 }),
      fc.boolean(),
      tableArb,
      bothPathsAgree,
    ),
    { numRuns: 300 },
  );
});

void test('across 2^53 ns after the table start (the number clock is no longer exact) the decisions stay the general path’s', () => {
  const yaml =
    'domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 3, name: per-ip}\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 2}\n';
  const fast = deciderPair(yaml, true, true);
  const general = deciderPair(yaml, false, true);
  fast.clock.now = 2n ** 53n - 2_000_000_001n;
  general.clock.now = fast.clock.now;
  const one: RlsRequest = {
    domain: 'edge',
    hitsAddend: 0,
    descriptors: [{ entries: [{ key: 'remote_address', value: '192.0.2.1' }], limit: null, hitsAddend: null }],
  };
  const two: RlsRequest = {
    ...one,
    descriptors: [...one.descriptors, { entries: [{ key: 'user', value: 'u' }], limit: null, hitsAddend: null }],
  };
  let refusedPast = 0;
  for (let i = 0; i < 40; i++) {
    const req = i % 3 === 0 ? two : one;
    const a = fast.decider.decide(req);
    assert.deepEqual(a, general.decider.decide(req), `at ${fast.clock.now}`);
    if (fast.clock.now > 2n ** 53n && a.ok && a.decision.overLimit) refusedPast++;
    fast.clock.now += 100_000_001n; // 0.1 s and 1 ns: readings a double cannot hold past 2^53
    general.clock.now = fast.clock.now;
  }
  assert.ok(refusedPast > 0, 'the limits refused past the boundary too');
  assert.deepEqual(fast.refused, general.refused);
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

void test('two descriptors (a shared limiter and a per-IP one): all or nothing on the fast path', () => {
  const yaml = [
    'domain: edge',
    'descriptors:',
    '  - key: limiter',
    '    value: all',
    '    rate_limit: {unit: minute, requests_per_unit: 3, name: global}',
    '  - key: remote_address',
    '    rate_limit: {unit: minute, requests_per_unit: 2, name: per-ip}',
    '',
  ].join('\n');
  const { decider, refused } = deciderPair(yaml, true, false);
  const req = (ip: string): RlsRequest => ({
    domain: 'edge',
    hitsAddend: 0,
    descriptors: [
      { entries: [{ key: 'limiter', value: 'all' }], limit: null, hitsAddend: null },
      { entries: [{ key: 'remote_address', value: ip }], limit: null, hitsAddend: null },
    ],
  });
  const verdicts: boolean[] = [];
  for (const ip of ['192.0.2.1', '192.0.2.1', '192.0.2.1', '192.0.2.2', '192.0.2.3']) {
    const r = decider.decide(req(ip));
    assert.ok(r.ok);
    verdicts.push(r.decision.overLimit);
  }
  // .1 twice, its third refused by per-ip (the global limiter keeps its token), .2 takes the last
  // global token, .3 is refused by the global limiter and keeps its own.
  assert.deepEqual(verdicts, [false, false, true, false, true]);
  assert.deepEqual(
    refused.map((r) => (JSON.parse(r) as unknown[])[0]),
    ['edge|remote_address=192.0.2.1', 'edge|limiter=all'],
  );
  const last = decider.decide(req('192.0.2.3'));
  assert.ok(last.ok);
  assert.deepEqual(
    last.decision.response.statuses.map((s) => [s.code, s.limitRemaining]),
    [
      [2, 0],
      [1, 2],
    ],
  );
});
