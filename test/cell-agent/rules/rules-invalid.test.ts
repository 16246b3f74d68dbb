// One fixture per invalid rules config (test/fixtures/rules/invalid/), each with its exact error, as
// envoyproxy/ratelimit's test/config/*.yaml. The first group are envoyproxy/ratelimit's own load-time
// errors, worded as it words them; then our shape checks, bounds and the `global` extension.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadRules } from '../../../cell-agent/rules/rules-load.js';
import { RULES_ERROR_CODES, RulesError } from '../../../cell-agent/rules/rules-errors.js';
import type { RulesErrorCode } from '../../../cell-agent/rules/rules-errors.js';

const FIXTURES = relative(process.cwd(), fileURLToPath(new URL('../../fixtures/rules/invalid/', import.meta.url)));
const C = RULES_ERROR_CODES;

/** fixture → [code, the message after the fixture's path (and, for a directory, after the file in it)]. */
const CASES: Record<string, readonly [RulesErrorCode, string]> = {
  // envoyproxy/ratelimit's load-time errors.
  'empty-domain.yaml': [C.EMPTY_DOMAIN, ':2:9: config file cannot have empty domain'],
  'empty-file.yaml': [C.EMPTY_DOMAIN, ': config file cannot have empty domain'],
  'duplicate-domain': [C.DUPLICATE_DOMAIN, "/b.yaml:2:9: duplicate domain 'test-domain' in config file"],
  'empty-key.yaml': [C.EMPTY_KEY, ':5:9: descriptor has empty key'],
  'duplicate-key.yaml': [C.DUPLICATE_KEY, ":6:5: duplicate descriptor composite key 'test-domain.key1_value1'"],
  'duplicate-key-nested.yaml': [
    C.DUPLICATE_KEY,
    ":8:9: duplicate descriptor composite key 'test-domain.key1_value1.subkey1'",
  ],
  'duplicate-composite-key-underscore.yaml': [
    C.DUPLICATE_KEY,
    ":7:5: duplicate descriptor composite key 'test-domain.a_b_c'",
  ],
  'duplicate-wildcard.yaml': [C.DUPLICATE_KEY, ":6:5: duplicate descriptor composite key 'test-domain.path_/files/*'"],
  'bad-unit.yaml': [C.INVALID_UNIT, ":5:13: invalid rate limit unit 'foo'"],
  'missing-unit.yaml': [C.INVALID_UNIT, ":5:7: invalid rate limit unit ''"],
  'unknown-unit-enum.yaml': [C.INVALID_UNIT, ":5:24: invalid rate limit unit 'unknown'"],
  'unlimited-with-unit.yaml': [C.UNLIMITED_WITH_UNIT, ':6:13: should not specify rate limit unit when unlimited'],
  'replaces-empty.yaml': [C.EMPTY_REPLACES, ':9:11: should not have an empty replaces entry'],
  'replaces-self.yaml': [C.REPLACES_SELF, ':10:11: replaces should not contain name of same descriptor'],
  'share-threshold-without-wildcard.yaml': [
    C.SHARE_THRESHOLD_WITHOUT_WILDCARD,
    ":3:5: share_threshold can only be used with wildcard values (containing '*'), but found key 'path_/files/a'",
  ],
  'share-threshold-key-only.yaml': [
    C.SHARE_THRESHOLD_WITHOUT_WILDCARD,
    ":3:5: share_threshold can only be used with wildcard values (containing '*'), but found key 'path'",
  ],
  'unknown-key.yaml': [C.UNKNOWN_KEY, ":4:5: config error, unknown key 'shadowmode'"],
  'unknown-key-rate-limit.yaml': [C.UNKNOWN_KEY, ":6:7: config error, unknown key 'requests_per_second'"],
  'key-not-string.yaml': [C.KEY_NOT_STRING, ':4:5: config error, key is not of type string: 5'],
  'list-not-map.yaml': [C.LIST_NOT_MAP, ':5:5: config error, yaml file contains list of type other than map: foo'],
  'bad-yaml.yaml': [
    C.YAML_INVALID,
    ':5:3: error loading config file: Flow map in block collection must be sufficiently indented and end with a }',
  ],
  'bad-yaml-indent.yaml': [
    C.YAML_INVALID,
    ':3:10: error loading config file: Nested mappings are not allowed in compact mappings',
  ],
  'duplicate-yaml-key.yaml': [C.YAML_INVALID, ':5:5: error loading config file: Map keys must be unique'],
  // Stricter than envoyproxy/ratelimit: a key of another level, types, YAML features.
  'misplaced-key.yaml': [
    C.UNKNOWN_KEY,
    ":5:5: config error, unknown key 'unit' in a descriptor (allowed here: key, value, rate_limit, descriptors, shadow_mode, detailed_metric, value_to_metric, share_threshold, quota_mode, metadata, global)",
  ],
  'merge-key.yaml': [C.UNKNOWN_KEY, ":6:5: config error, YAML merge keys ('<<') are not supported"],
  'multiple-documents.yaml': [C.YAML_INVALID, ':5:1: error loading config file: more than one YAML document in a file'],
  'not-utf8.yaml': [C.YAML_INVALID, ': error loading config file: not valid UTF-8'],
  'root-not-map.yaml': [
    C.INVALID_TYPE,
    ":1:1: config error, a rules file must be a map with 'domain' and 'descriptors', found a list",
  ],
  'descriptors-not-list.yaml': [
    C.INVALID_TYPE,
    ":3:3: config error, 'descriptors' must be a list of maps, found a map",
  ],
  'rate-limit-not-map.yaml': [
    C.INVALID_TYPE,
    ":4:17: config error, 'rate_limit' must be a map, found the string '5/second'",
  ],
  'key-is-map.yaml': [C.INVALID_TYPE, ":3:10: config error, 'key' must be a string, found a map"],
  'bool-not-bool.yaml': [
    C.INVALID_TYPE,
    ":4:18: config error, 'shadow_mode' must be true or false, found the string 'true'",
  ],
  'requests-per-unit-negative.yaml': [
    C.INVALID_TYPE,
    ":4:51: config error, 'requests_per_unit' must be an integer from 0 to 4294967295, found '-1'",
  ],
  'requests-per-unit-too-large.yaml': [
    C.INVALID_TYPE,
    ":5:51: config error, 'requests_per_unit' must be an integer from 0 to 4294967295, found '4294967296'",
  ],
  'requests-per-unit-fraction.yaml': [
    C.INVALID_TYPE,
    ":4:51: config error, 'requests_per_unit' must be an integer from 0 to 4294967295, found '2.5'",
  ],
  // Bounds.
  'too-deep.yaml': [C.BOUND_EXCEEDED, ':19:37: descriptors are nested deeper than 8 levels'],
  'key-too-long.yaml': [C.BOUND_EXCEEDED, ":3:10: config error, 'key' is longer than 256 characters"],
  // Our extension: global.
  'global-with-value.yaml': [
    C.GLOBAL_WITH_VALUE,
    ":3:5: descriptor 'tenant' has global: true and value 'acme'; global goes on a key-only descriptor (one global quota per distinct value of the key)",
  ],
  'global-with-rate-limit.yaml': [
    C.GLOBAL_WITH_RATE_LIMIT,
    ":5:17: descriptor 'tenant' has global: true and its own rate_limit; a global descriptor's limit comes from the coordinator (for key 'tenant', the tenant's tier quota), so remove rate_limit",
  ],
  'global-not-bool.yaml': [
    C.INVALID_TYPE,
    ":4:13: config error, 'global' must be true or false, found the string 'always'",
  ],
  // Global rules one bucket per quota key cannot enforce as written.
  'global-quota-mode.yaml': [
    C.GLOBAL_QUOTA_MODE,
    ":3:5: rule 'api.tenant' has global: true and quota_mode: true; a global quota is enforced on every path, and quota_mode would let other descriptors overrule it, so remove quota_mode",
  ],
  'global-nested.yaml': [
    C.GLOBAL_NESTED,
    ":6:9: rule 'api.tenant.team' has global: true under the global rule 'api.tenant' (FIXTURE:3:5); every global rule's value names a tenant quota, so one descriptor would be charged to two tenants: keep one global rule per path",
  ],
  'global-shadow-mixed': [
    C.GLOBAL_SHADOW_MIXED,
    "/b.yaml:5:9: rule 'web.route.tenant' has global: true with shadow_mode true, but the global rule 'api.tenant' (FIXTURE/a.yaml:3:5) has shadow_mode false; both can reach the same tenant quota, whose one bucket per cell cannot be enforced on one path and only observed on the other: give every global rule the same shadow_mode",
  ],
};

void test('every fixture in test/fixtures/rules/invalid has a case, and every case a fixture', () => {
  assert.deepEqual(readdirSync(FIXTURES).sort(), Object.keys(CASES).sort());
});

for (const [fixture, [code, suffix]] of Object.entries(CASES)) {
  void test(`invalid rules: ${fixture}`, async () => {
    const path = join(FIXTURES, fixture);
    await assert.rejects(loadRules(path), (error: unknown) => {
      assert.ok(error instanceof RulesError, `not a RulesError: ${String(error)}`);
      assert.equal(error.message, `${path}${suffix.replaceAll('FIXTURE', path)}`);
      assert.equal(error.code, code);
      return true;
    });
  });
}

void test('duplicate domain is accepted with mergeDomains', async () => {
  const ruleSet = await loadRules(join(FIXTURES, 'duplicate-domain'), { mergeDomains: true });
  assert.deepEqual(
    ruleSet.domains.get('test-domain')?.files.map((f) => f.slice(-6)),
    ['a.yaml', 'b.yaml'],
  );
  assert.deepEqual(
    ruleSet.rules.map((r) => r.id),
    ['test-domain.key1', 'test-domain.key2'],
  );
});
