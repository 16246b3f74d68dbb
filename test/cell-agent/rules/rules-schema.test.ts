// Parsing and validation of rules files (rules-schema.ts), and compile-time checks on RulesFiles
// built in code (rules-compile.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import {
  MAX_RULES_DESCRIPTORS_PER_FILE,
  MAX_RULES_FILE_BYTES,
  MAX_RULES_METADATA_DEPTH,
  MAX_RULES_REPLACES_PER_RULE,
  MAX_RULES_VALUE_LENGTH,
  parseRateLimitUnit,
  parseRulesObject,
  parseRulesYaml,
} from '../../../cell-agent/rules/rules-schema.js';
import type { RulesDescriptor } from '../../../cell-agent/rules/rules-schema.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { matchDescriptor } from '../../../cell-agent/rules/rules-match.js';
import { RULES_ERROR_CODES, RulesError } from '../../../cell-agent/rules/rules-errors.js';

function rejects(fn: () => unknown, code: string, message: string): void {
  assert.throws(fn, (error: unknown) => {
    assert.ok(error instanceof RulesError, String(error));
    assert.equal(error.message, message);
    assert.equal(error.code, code);
    return true;
  });
}

void test('a full file parses into a typed, positioned RulesFile', () => {
  const file = parseRulesYaml(
    `domain: api
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit:
      unit: Minute
      requests_per_unit: 100
      name: files
      replaces:
        - name: general
    descriptors:
      - key: method
`,
    'api.yaml',
  );
  assert.equal(file.file, 'api.yaml');
  assert.equal(file.domain, 'api');
  assert.deepEqual(file.pos, { line: 1, column: 9 });
  const [path] = file.descriptors;
  assert.ok(path !== undefined);
  assert.equal(path.key, 'path');
  assert.equal(path.value, '/files/*');
  assert.equal(path.shareThreshold, true);
  assert.equal(path.global, false);
  assert.deepEqual(path.pos, { line: 3, column: 5 });
  assert.deepEqual(
    { ...path.rateLimit, replaces: path.rateLimit?.replaces.map((r) => r.name) },
    {
      unit: 'Minute',
      requestsPerUnit: 100,
      unlimited: false,
      name: 'files',
      replaces: ['general'],
      pos: { line: 7, column: 7 },
      unitPos: { line: 7, column: 13 },
    },
  );
  assert.deepEqual(
    path.descriptors.map((d) => [d.key, d.value, d.rateLimit]),
    [['method', '', null]],
  );
});

void test("units: the seven of Envoy's enum, any case; nothing else", () => {
  for (const unit of ['second', 'MINUTE', 'Hour', 'day', 'week', 'month', 'year'])
    assert.ok(parseRateLimitUnit(unit) !== null, unit);
  for (const unit of ['', 'unknown', 'seconds', 'ms', 'constructor', '__proto__'])
    assert.equal(parseRateLimitUnit(unit), null, unit);
});

void test("scalars as Go's yaml.v2 reads them: YAML 1.1 booleans, strings keep their source text", () => {
  const file = parseRulesYaml(
    `domain: 2024
descriptors:
  - key: status
    value: 0123
    shadow_mode: yes
    detailed_metric: On
  - key: version
    value: 1.10
  - key: date
    value: 2020-01-01
  - key: empty
    value:
  - key: nulled
    value: ~
    rate_limit: ~
    descriptors: ~
  - key: quoted
    value: "007"
    rate_limit: {unit: second, requests_per_unit: 0x10}
`,
    'f.yaml',
  );
  assert.equal(file.domain, '2024');
  assert.deepEqual(
    file.descriptors.map((d) => d.value),
    ['0123', '1.10', '2020-01-01', '', '', '007'],
  );
  assert.equal(file.descriptors[0]?.shadowMode, true);
  assert.equal(file.descriptors[0]?.detailedMetric, true);
  assert.equal(file.descriptors[4]?.rateLimit, null);
  assert.equal(file.descriptors[5]?.rateLimit?.requestsPerUnit, 16);
});

void test('anchors and aliases are followed', () => {
  const file = parseRulesYaml(
    `domain: api
descriptors:
  - key: a
    rate_limit: &std {unit: second, requests_per_unit: 5}
  - key: b
    rate_limit: *std
`,
    'f.yaml',
  );
  assert.deepEqual(
    file.descriptors.map((d) => [d.key, d.rateLimit?.requestsPerUnit]),
    [
      ['a', 5],
      ['b', 5],
    ],
  );
});

void test('an alias bomb stops at the descriptor bound', () => {
  // 200 descriptors written once, referenced by 200 others: 40,401 descriptors from a few kilobytes.
  const leaves = Array.from({ length: 200 }, () => '{key: k}').join(', ');
  const branches = Array.from({ length: 200 }, () => '{key: k, descriptors: *l0}').join(', ');
  const bomb = `domain: api\ndescriptors:\n  - key: a\n    descriptors: &l0 [${leaves}]\n  - key: b\n    descriptors: [${branches}]\n`;
  assert.throws(
    () => parseRulesYaml(bomb, 'bomb.yaml'),
    (error: unknown) =>
      error instanceof RulesError &&
      error.code === RULES_ERROR_CODES.BOUND_EXCEEDED &&
      error.detail === `more than ${MAX_RULES_DESCRIPTORS_PER_FILE} descriptors in one file`,
  );
});

void test(`more than ${MAX_RULES_DESCRIPTORS_PER_FILE} descriptors in a file is an error`, () => {
  const many = Array.from({ length: MAX_RULES_DESCRIPTORS_PER_FILE + 1 }, (_, i) => `  - {key: k${i}}`).join('\n');
  rejects(
    () => parseRulesYaml(`domain: d\ndescriptors:\n${many}\n`, 'many.yaml'),
    RULES_ERROR_CODES.BOUND_EXCEEDED,
    `many.yaml:${MAX_RULES_DESCRIPTORS_PER_FILE + 3}:5: more than ${MAX_RULES_DESCRIPTORS_PER_FILE} descriptors in one file`,
  );
});

void test('other bounds: value length, replaces entries, metadata depth, file size', () => {
  rejects(
    () =>
      parseRulesYaml(
        `domain: d\ndescriptors:\n  - {key: k, value: ${'v'.repeat(MAX_RULES_VALUE_LENGTH + 1)}}\n`,
        'v.yaml',
      ),
    RULES_ERROR_CODES.BOUND_EXCEEDED,
    `v.yaml:3:21: config error, 'value' is longer than ${MAX_RULES_VALUE_LENGTH} characters`,
  );
  const replaces = Array.from({ length: MAX_RULES_REPLACES_PER_RULE + 1 }, (_, i) => `{name: r${i}}`).join(', ');
  assert.throws(
    () =>
      parseRulesYaml(
        `domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, replaces: [${replaces}]}\n`,
        'r.yaml',
      ),
    /r\.yaml:4:\d+: more than 64 entries in 'replaces'/,
  );
  const deep = `${'{a: '.repeat(MAX_RULES_METADATA_DEPTH)}1${'}'.repeat(MAX_RULES_METADATA_DEPTH)}`;
  assert.throws(
    () => parseRulesYaml(`domain: d\ndescriptors:\n  - {key: k, metadata: ${deep}}\n`, 'm.yaml'),
    /m\.yaml:3:\d+: metadata nested deeper than 16 levels/,
  );
  rejects(
    () => parseRulesYaml(`# ${'x'.repeat(MAX_RULES_FILE_BYTES)}`, 'big.yaml'),
    RULES_ERROR_CODES.FILE_TOO_LARGE,
    `big.yaml: file is larger than ${MAX_RULES_FILE_BYTES} bytes`,
  );
});

void test('parseRulesObject holds plain objects to the same rules (no positions)', () => {
  const file = parseRulesObject({ domain: 'api', descriptors: [{ key: 'tenant', global: true }] }, 'object');
  assert.equal(file.descriptors[0]?.global, true);
  assert.equal(file.descriptors[0]?.pos, undefined);
  rejects(
    () => parseRulesObject({ domain: 'api', descriptors: [{ key: 'k', rate_limits: {} }] }, 'object'),
    RULES_ERROR_CODES.UNKNOWN_KEY,
    "object: config error, unknown key 'rate_limits'",
  );
  rejects(
    () =>
      parseRulesObject(
        { domain: 'api', descriptors: [{ key: 'k', rate_limit: { unit: 'second', requests_per_unit: '5' } }] },
        'object',
      ),
    RULES_ERROR_CODES.INVALID_TYPE,
    "object: config error, 'requests_per_unit' must be an integer from 0 to 4294967295, found the string '5'",
  );
});

void test('compileRules checks RulesFiles built in code: global, empty key, depth', () => {
  const base: RulesDescriptor = {
    key: 'tenant',
    value: '',
    rateLimit: null,
    descriptors: [],
    shadowMode: false,
    detailedMetric: false,
    valueToMetric: false,
    shareThreshold: false,
    quotaMode: false,
    global: true,
    metadata: null,
  };
  const ruleSet = compileRules([{ file: 'code', domain: 'api', descriptors: [base] }]);
  assert.equal(matchDescriptor(ruleSet, 'api', [{ key: 'tenant', value: 'acme' }])?.limit.kind, 'global');
  rejects(
    () => compileRules([{ file: 'code', domain: 'api', descriptors: [{ ...base, value: 'acme' }] }]),
    RULES_ERROR_CODES.GLOBAL_WITH_VALUE,
    "code: descriptor 'tenant' has global: true and value 'acme'; global goes on a key-only descriptor (one global quota per distinct value of the key)",
  );
  rejects(
    () => compileRules([{ file: 'code', domain: 'api', descriptors: [{ ...base, global: false, key: '' }] }]),
    RULES_ERROR_CODES.EMPTY_KEY,
    'code: descriptor has empty key',
  );
  let deep: RulesDescriptor = { ...base, global: false };
  for (let i = 0; i < 9; i += 1) deep = { ...base, global: false, descriptors: [deep] };
  rejects(
    () => compileRules([{ file: 'code', domain: 'api', descriptors: [deep] }]),
    RULES_ERROR_CODES.BOUND_EXCEEDED,
    'code: descriptors are nested deeper than 8 levels',
  );
});

void test('the errors of a later file name that file; files compile in order', () => {
  const good = parseRulesYaml(
    'domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n',
    'a.yaml',
  );
  const bad = parseRulesYaml('domain: b\ndescriptors: [{key: k, rate_limit: {unit: fortnight}}]\n', 'b.yaml');
  rejects(
    () => compileRules([good, bad]),
    RULES_ERROR_CODES.INVALID_UNIT,
    "b.yaml:2:43: invalid rate limit unit 'fortnight'",
  );
  const ruleSet = compileRules([good, parseRulesYaml('domain: b\ndescriptors: []\n', 'b.yaml')], {
    fingerprint: 'abc',
  });
  assert.deepEqual(ruleSet.files, ['a.yaml', 'b.yaml']);
  assert.deepEqual([...ruleSet.domains.keys()], ['a', 'b']);
  assert.equal(ruleSet.fingerprint, 'abc');
});

void test('every error code is documented in cell-agent/rules/README.md', () => {
  const readme = readFileSync(new URL('../../../cell-agent/rules/README.md', import.meta.url), 'utf8');
  for (const code of Object.values(RULES_ERROR_CODES))
    assert.ok(readme.includes(`| \`${code}\` |`), `${code} is not in the README's table`);
});
