// Matching (docs/envoy-ratelimit-rules.md §2 and §3): each test names the rule of the reference it checks.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import type { RuleSet } from '../../../cell-agent/rules/rules-compile.js';
import {
  applyReplaces,
  matchDescriptor,
  matchRequest,
  matchWithAncestors,
} from '../../../cell-agent/rules/rules-match.js';
import type { DescriptorEntry } from '../../../cell-agent/rules/rules-match.js';

function compile(...texts: string[]): RuleSet {
  return compileRules(texts.map((text, i) => parseRulesYaml(text, `rules-${i}.yaml`)));
}

/** `k=v,k2=v2` → entries. */
function entries(spec: string): DescriptorEntry[] {
  return spec.split(',').map((pair) => {
    const at = pair.indexOf('=');
    return { key: pair.slice(0, at), value: pair.slice(at + 1) };
  });
}

function ruleId(ruleSet: RuleSet, spec: string, domain = 'test-domain'): string | null {
  return matchDescriptor(ruleSet, domain, entries(spec))?.ruleId ?? null;
}

const PRECEDENCE = compile(`
domain: test-domain
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: key1
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: key1
    value: foobar
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: key1
    value: fo*
    rate_limit: {unit: second, requests_per_unit: 4}
`);

void test('§2.3 per level: exact value > wildcard > key-only', () => {
  assert.equal(ruleId(PRECEDENCE, 'key1=foobar'), 'test-domain.key1_foobar');
  assert.equal(ruleId(PRECEDENCE, 'key1=foobaz'), 'test-domain.key1_foo*');
  assert.equal(ruleId(PRECEDENCE, 'key1=other'), 'test-domain.key1');
  assert.equal(ruleId(PRECEDENCE, 'key2=foobar'), null);
});

void test('§2.3b wildcards are tried in YAML order, first match wins', () => {
  // `foo*` is written before `fo*`, so `fooX` takes `foo*`; `fox` only matches `fo*`.
  assert.equal(ruleId(PRECEDENCE, 'key1=fooX'), 'test-domain.key1_foo*');
  assert.equal(ruleId(PRECEDENCE, 'key1=fox'), 'test-domain.key1_fo*');
  const reversed = compile(`
domain: test-domain
descriptors:
  - {key: key1, value: fo*, rate_limit: {unit: second, requests_per_unit: 4}}
  - {key: key1, value: foo*, rate_limit: {unit: second, requests_per_unit: 2}}
`);
  assert.equal(ruleId(reversed, 'key1=fooX'), 'test-domain.key1_fo*');
});

void test('§2.3b wildcard patterns: trailing, middle and multiple `*`', () => {
  const ruleSet = compile(`
domain: test-domain
descriptors:
  - {key: a, value: foo*, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: b, value: bar*b, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: c, value: foo*bar*baz, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: d, value: "*", rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: e, value: "*.example.com", rate_limit: {unit: second, requests_per_unit: 1}}
`);
  const cases: [string, boolean][] = [
    ['a=foo', true],
    ['a=foobar', true],
    ['a=fo', false],
    ['a=xfoo', false],
    ['b=barb', true],
    ['b=bar-b', true],
    ['b=barbb', true],
    ['b=bar', false],
    ['b=barbx', false],
    ['b=xbarb', false],
    ['c=foobarbaz', true],
    ['c=foo1bar2baz', true],
    ['c=foobazbarbaz', true],
    ['c=foobaz', false],
    ['c=foobarbazx', false],
    ['d=', true],
    ['d=anything', true],
    ['e=api.example.com', true],
    ['e=example.com', false],
    ['e=api.example.com.evil', false],
  ];
  for (const [spec, matches] of cases) assert.equal(ruleId(ruleSet, spec) !== null, matches, spec);
  // A regex metacharacter in a pattern is a literal character.
  const literal = compile(`
domain: test-domain
descriptors:
  - {key: p, value: "a.c(*", rate_limit: {unit: second, requests_per_unit: 1}}
`);
  assert.equal(ruleId(literal, 'p=a.c(x'), 'test-domain.p_a.c(*');
  assert.equal(ruleId(literal, 'p=abc(x'), null);
});

const NESTED = compile(`
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    descriptors:
      - key: subkey2
        rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    rate_limit: {unit: hour, requests_per_unit: 30}
    descriptors:
      - key: subkey
        value: deep
        rate_limit: {unit: day, requests_per_unit: 40}
  - key: key3
    rate_limit: {unit: second, requests_per_unit: 50}
`);

void test('§2.4 the limit is the one of the node matched at the last entry: request depth = config depth', () => {
  assert.equal(ruleId(NESTED, 'key1=value1,subkey1=x'), 'test-domain.key1_value1.subkey1');
  assert.equal(ruleId(NESTED, 'key2=a'), 'test-domain.key2');
  assert.equal(ruleId(NESTED, 'key2=a,subkey=deep'), 'test-domain.key2.subkey_deep');
  // A shallower limit is not used for a longer request...
  assert.equal(ruleId(NESTED, 'key2=a,subkey=other'), null);
  assert.equal(ruleId(NESTED, 'key3=a,more=b'), null, 'a node without children stops a longer request');
  // ...and a branch without its own limit gives none to a shorter one.
  assert.equal(ruleId(NESTED, 'key1=value1'), null);
  assert.equal(ruleId(NESTED, 'key1=value1,subkey1=x,extra=y'), null);
});

void test('§2.5 no backtracking: an exact match at level 1 hides the key-only sibling for level 2', () => {
  assert.equal(ruleId(NESTED, 'key1=other,subkey2=x'), 'test-domain.key1.subkey2');
  assert.equal(ruleId(NESTED, 'key1=value1,subkey2=x'), null);
});

void test('§2.1 and §2.6: unknown domain and empty descriptor → no limit', () => {
  assert.equal(ruleId(NESTED, 'key3=a', 'other-domain'), null);
  assert.equal(matchDescriptor(NESTED, 'test-domain', []), null);
  const withAncestors = matchWithAncestors(NESTED, 'test-domain', []);
  assert.deepEqual(withAncestors, { match: null, ancestors: [] });
});

void test('a descriptor without rate_limit is "effectively whitelisted": no limit', () => {
  const ruleSet = compile(`
domain: test-domain
descriptors:
  - key: internal
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 1}
`);
  assert.equal(matchDescriptor(ruleSet, 'test-domain', entries('internal=yes')), null);
});

void test('limits: unit case-insensitive with unit seconds, requests_per_unit 0, unlimited', () => {
  const ruleSet = compile(`
domain: test-domain
descriptors:
  - {key: s, rate_limit: {unit: SeCoNd, requests_per_unit: 7}}
  - {key: w, rate_limit: {unit: week, requests_per_unit: 1}}
  - {key: mo, rate_limit: {unit: MONTH, requests_per_unit: 1}}
  - {key: y, rate_limit: {unit: year, requests_per_unit: 1}}
  - {key: zero, rate_limit: {unit: minute, requests_per_unit: 0}}
  - {key: free, rate_limit: {unlimited: true, requests_per_unit: 99, name: free}}
`);
  const limit = (spec: string) => matchDescriptor(ruleSet, 'test-domain', entries(spec))?.limit;
  assert.deepEqual(limit('s=a'), { kind: 'rate', requestsPerUnit: 7, unit: 'SECOND', unitSeconds: 1 });
  assert.deepEqual(limit('w=a'), { kind: 'rate', requestsPerUnit: 1, unit: 'WEEK', unitSeconds: 604_800 });
  assert.deepEqual(limit('mo=a'), { kind: 'rate', requestsPerUnit: 1, unit: 'MONTH', unitSeconds: 2_592_000 });
  assert.deepEqual(limit('y=a'), { kind: 'rate', requestsPerUnit: 1, unit: 'YEAR', unitSeconds: 31_536_000 });
  assert.deepEqual(limit('zero=a'), { kind: 'rate', requestsPerUnit: 0, unit: 'MINUTE', unitSeconds: 60 });
  assert.deepEqual(limit('free=a'), { kind: 'unlimited' });
  assert.equal(matchDescriptor(ruleSet, 'test-domain', entries('free=a'))?.name, 'free');
});

void test('shadow_mode, detailed_metric, quota_mode and metadata are carried to the match', () => {
  const ruleSet = compile(`
domain: test-domain
descriptors:
  - key: key1
    shadow_mode: true
    quota_mode: yes
    metadata: {team: edge, tags: [a, 1, true, ~], since: 2020-01-01}
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: key2
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
`);
  const one = matchDescriptor(ruleSet, 'test-domain', entries('key1=a'));
  assert.equal(one?.shadowMode, true);
  assert.equal(one?.quotaMode, true);
  assert.equal(one?.detailedMetric, false);
  assert.deepEqual(one?.rule.metadata, { team: 'edge', tags: ['a', 1, true, null], since: '2020-01-01' });
  assert.equal(one?.metricKey, 'test-domain.key1');
  const two = matchDescriptor(ruleSet, 'test-domain', entries('key2=unspecified_value'));
  assert.equal(two?.shadowMode, false);
  assert.equal(two?.detailedMetric, true);
  // envoyproxy/ratelimit's stats key: `test-domain.key2_unspecified_value` with detailed_metric.
  assert.equal(two?.metricKey, 'test-domain.key2_unspecified_value');
  assert.equal(two?.ruleId, 'test-domain.key2');
});

void test('value_to_metric puts the request value of that level into the stats key', () => {
  const ruleSet = compile(`
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
`);
  assert.equal(
    matchDescriptor(ruleSet, 'test-domain', entries('route=orders,method=GET'))?.metricKey,
    'test-domain.route_orders.method_GET',
  );
  assert.equal(
    matchDescriptor(ruleSet, 'test-domain', entries('path=/api/x,user=u1'))?.metricKey,
    'test-domain.path_/api/*.user',
  );
});

void test("§3 replaces: a matched limit named in another matched limit's replaces is dropped", () => {
  const ruleSet = compile(`
domain: test-domain
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 10, name: general}
  - key: key2
    rate_limit: {unit: second, requests_per_unit: 100, name: vip, replaces: [{name: general}]}
  - key: key3
    rate_limit: {unit: second, requests_per_unit: 5}
`);
  const m = (spec: string) => matchDescriptor(ruleSet, 'test-domain', entries(spec));
  assert.deepEqual(
    applyReplaces([m('key1=a'), m('key3=a')]).map((x) => x?.ruleId ?? null),
    ['test-domain.key1', 'test-domain.key3'],
  );
  assert.deepEqual(
    applyReplaces([m('key1=a'), m('key2=a'), m('key3=a'), null]).map((x) => x?.ruleId ?? null),
    [null, 'test-domain.key2', 'test-domain.key3', null],
  );
  assert.equal(m('key2=a')?.name, 'vip');
  assert.deepEqual(m('key2=a')?.replaces, ['general']);
  // matchRequest applies it too.
  assert.deepEqual(
    matchRequest(ruleSet, 'test-domain', [entries('key1=a'), entries('key2=b')]).matches.map((x) => x?.ruleId ?? null),
    [null, 'test-domain.key2'],
  );
});

void test('counting: key-only and wildcard rules count per distinct value; share_threshold shares one counter', () => {
  const ruleSet = compile(`
domain: domain
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: files
    value: files/*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: shared
    value: files/*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tree
    value: t*
    share_threshold: true
    descriptors:
      - key: leaf
        rate_limit: {unit: second, requests_per_unit: 1}
`);
  const bucket = (spec: string) => matchDescriptor(ruleSet, 'domain', entries(spec))?.bucketKey;
  assert.equal(bucket('user=alice'), 'domain|user=alice');
  assert.equal(bucket('user=bob'), 'domain|user=bob');
  assert.equal(bucket('files=files/a'), 'domain|files=files/a');
  assert.notEqual(bucket('files=files/a'), bucket('files=files/b'));
  assert.equal(bucket('shared=files/a'), 'domain|shared~files/*');
  assert.equal(bucket('shared=files/b'), bucket('shared=files/a'));
  // share_threshold on a wildcard above the rate_limit is kept for that entry (envoyproxy/ratelimit tracks it per index).
  assert.equal(bucket('tree=t1,leaf=x'), 'domain|tree~t*|leaf=x');
  assert.equal(bucket('tree=t2,leaf=x'), 'domain|tree~t*|leaf=x');
  assert.equal(matchDescriptor(ruleSet, 'domain', entries('shared=files/a'))?.metricKey, 'domain.shared_files/*');
});

void test('bucket keys are injective: separators inside keys and values are escaped', () => {
  const ruleSet = compile(`
domain: d
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: a|b=c
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
`);
  const one = matchDescriptor(ruleSet, 'd', [
    { key: 'a', value: 'x|b=y' },
    { key: 'b', value: 'z' },
  ])?.bucketKey;
  const two = matchDescriptor(ruleSet, 'd', [
    { key: 'a', value: 'x' },
    { key: 'b', value: 'y|b=z' },
  ])?.bucketKey;
  assert.equal(one, 'd|a=x\\|b\\=y|b=z');
  assert.equal(two, 'd|a=x|b=y\\|b\\=z');
  assert.equal(matchDescriptor(ruleSet, 'd', [{ key: 'k', value: 'x~y\\' }])?.bucketKey, 'd|k=x\\~y\\\\');
  assert.equal(matchDescriptor(ruleSet, 'd', [{ key: 'a|b=c', value: '' }])?.bucketKey, 'd|a\\|b\\=c=');
});

void test('a wildcard matches its own key only (envoyproxy/ratelimit tests the pattern on `key_value` and can match across the `_`)', () => {
  const ruleSet = compile(`
domain: d
descriptors:
  - {key: x, value: "y*", rate_limit: {unit: second, requests_per_unit: 3}}
  - {key: a_b, value: c, rate_limit: {unit: second, requests_per_unit: 1}}
`);
  assert.equal(ruleId(ruleSet, 'x=yz', 'd'), 'd.x_y*');
  // `x_y*` would match the request `x_y=z` (`x_y_z`) in a string-concatenating matcher.
  assert.equal(ruleId(ruleSet, 'x_y=z', 'd'), null);
  assert.equal(ruleId(ruleSet, 'a_b=c', 'd'), 'd.a_b_c');
  assert.equal(ruleId(ruleSet, 'a=b_c', 'd'), null);
});

const DESIGN_EXAMPLE = compile(`
domain: api
descriptors:
  - key: tenant
    global: true
    descriptors:
      - key: remote_address          # a local, per-cell limit nested under the tenant
        rate_limit: {unit: second, requests_per_unit: 50}
`);

void test('global: [tenant] matches the global rule, with the entry that selects the quota', () => {
  const match = matchDescriptor(DESIGN_EXAMPLE, 'api', entries('tenant=acme'));
  assert.equal(match?.ruleId, 'api.tenant');
  assert.deepEqual(match?.limit, { kind: 'global' });
  assert.deepEqual(match?.global, { entryIndex: 0, key: 'tenant', value: 'acme' });
  assert.equal(match?.bucketKey, 'api|tenant=acme');
  assert.equal(match?.rule.global, true);
});

void test("global: [tenant, remote_address] matches the nested local rule; matchWithAncestors adds the tenant's global rule", () => {
  const deep = entries('tenant=acme,remote_address=1.2.3.4');
  const match = matchDescriptor(DESIGN_EXAMPLE, 'api', deep);
  assert.equal(match?.ruleId, 'api.tenant.remote_address');
  assert.equal(match?.global, null);
  assert.deepEqual(match?.limit, { kind: 'rate', requestsPerUnit: 50, unit: 'SECOND', unitSeconds: 1 });
  assert.equal(match?.bucketKey, 'api|tenant=acme|remote_address=1.2.3.4');

  const withAncestors = matchWithAncestors(DESIGN_EXAMPLE, 'api', deep);
  assert.equal(withAncestors.match?.ruleId, 'api.tenant.remote_address');
  assert.deepEqual(
    withAncestors.ancestors.map((a) => [a.ruleId, a.bucketKey, a.global]),
    [['api.tenant', 'api|tenant=acme', { entryIndex: 0, key: 'tenant', value: 'acme' }]],
  );
  // The deepest match is not repeated among the ancestors.
  assert.deepEqual(matchWithAncestors(DESIGN_EXAMPLE, 'api', entries('tenant=acme')).ancestors, []);
  // The global rule applies even when the deeper entries match nothing.
  const unmatched = matchWithAncestors(DESIGN_EXAMPLE, 'api', entries('tenant=acme,path=/x'));
  assert.equal(unmatched.match, null);
  assert.deepEqual(
    unmatched.ancestors.map((a) => a.ruleId),
    ['api.tenant'],
  );
  // Also for a request longer than any rule can be deep.
  const long = entries(['tenant=acme', ...Array.from({ length: 10 }, (_, i) => `k${i}=v`)].join(','));
  assert.deepEqual(
    matchWithAncestors(DESIGN_EXAMPLE, 'api', long).ancestors.map((a) => a.bucketKey),
    ['api|tenant=acme'],
  );
  assert.equal(matchDescriptor(DESIGN_EXAMPLE, 'api', long), null);
});

void test('global: matchRequest takes one token from the tenant quota per request, not one per descriptor', () => {
  const both = matchRequest(DESIGN_EXAMPLE, 'api', [
    entries('tenant=acme'),
    entries('tenant=acme,remote_address=1.2.3.4'),
  ]);
  assert.deepEqual(
    both.matches.map((m) => m?.ruleId ?? null),
    ['api.tenant', 'api.tenant.remote_address'],
  );
  assert.deepEqual(both.extraGlobals, []);
  const deepOnly = matchRequest(DESIGN_EXAMPLE, 'api', [
    entries('tenant=acme,remote_address=1.2.3.4'),
    entries('tenant=acme,remote_address=5.6.7.8'),
    entries('tenant=beta,remote_address=1.2.3.4'),
  ]);
  assert.deepEqual(
    deepOnly.extraGlobals.map((g) => [g.descriptorIndex, g.match.bucketKey]),
    [
      [0, 'api|tenant=acme'],
      [2, 'api|tenant=beta'],
    ],
  );
});

void test('global nested under a local branch, and a local limit above a global one keeps the depth rule', () => {
  const ruleSet = compile(`
domain: api
descriptors:
  - key: region
    rate_limit: {unit: second, requests_per_unit: 1000}
    descriptors:
      - key: tenant
        global: true
        shadow_mode: true
`);
  const withAncestors = matchWithAncestors(ruleSet, 'api', entries('region=eu,tenant=acme'));
  assert.equal(withAncestors.match?.ruleId, 'api.region.tenant');
  assert.deepEqual(withAncestors.match?.global, { entryIndex: 1, key: 'tenant', value: 'acme' });
  assert.equal(withAncestors.match?.shadowMode, true);
  assert.deepEqual(withAncestors.ancestors, [], 'the local region limit is not an ancestor rule');
});

void test('the compiled RuleSet is immutable', () => {
  const root = DESIGN_EXAMPLE.domains.get('api')?.root;
  assert.ok(root !== undefined);
  assert.throws(() => (root.keyOnly as Map<string, unknown>).set('x', null), TypeError);
  assert.throws(() => (DESIGN_EXAMPLE.domains as Map<string, unknown>).delete('api'), TypeError);
  assert.ok(Object.isFrozen(DESIGN_EXAMPLE));
  assert.ok(Object.isFrozen(DESIGN_EXAMPLE.rules));
  for (const rule of DESIGN_EXAMPLE.rules) {
    assert.ok(Object.isFrozen(rule));
    assert.ok(Object.isFrozen(rule.children));
  }
  assert.deepEqual(
    DESIGN_EXAMPLE.rules.map((r) => [r.id, r.depth, r.kind, r.file, r.pos?.line]),
    [
      ['api.tenant', 0, 'key', 'rules-0.yaml', 4],
      ['api.tenant.remote_address', 1, 'key', 'rules-0.yaml', 7],
    ],
  );
});

void test("the walk's memo (the last domain, the last few levels' keys) never answers from another rule set, domain or level", () => {
  // Two rule sets of one domain (as before and after a reload): the same keys, other rules.
  const before = compile(`
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    value: x
    rate_limit: {unit: second, requests_per_unit: 2}
`);
  const after = compile(`
domain: d
descriptors:
  - key: a
    value: v
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 4}
`);
  const other = compile(`
domain: e
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 5}
`);
  const limitOf = (set: RuleSet, domain: string, spec: string): string => {
    const m = matchDescriptor(set, domain, entries(spec));
    return m === null || m.limit.kind !== 'rate' ? 'none' : `${m.limit.requestsPerUnit}/${m.limit.unit.toLowerCase()}`;
  };
  // Interleaved, and with more distinct (level, key) pairs than the memo holds, twice over.
  const expected: [RuleSet, string, string, string][] = [
    [before, 'd', 'a=v', '1/second'],
    [after, 'd', 'a=v', '3/minute'],
    [after, 'd', 'a=w', 'none'],
    [before, 'd', 'a=w', '1/second'],
    [before, 'd', 'b=x', '2/second'],
    [after, 'd', 'b=x', '4/second'],
    [before, 'd', 'b=y', 'none'],
    [other, 'e', 'a=v', '5/hour'],
    [other, 'd', 'a=v', 'none'],
    [before, 'e', 'a=v', 'none'],
    [before, 'd', 'c=1', 'none'],
    [after, 'd', 'c=1', 'none'],
    [PRECEDENCE, 'test-domain', 'key1=foobar', '3/second'],
  ];
  for (let round = 0; round < 3; round++) {
    for (const [set, domain, spec, want] of expected)
      assert.equal(limitOf(set, domain, spec), want, `${domain} ${spec}`);
    for (const [set, domain, spec, want] of [...expected].reverse())
      assert.equal(limitOf(set, domain, spec), want, `${domain} ${spec} (reversed)`);
  }
});
