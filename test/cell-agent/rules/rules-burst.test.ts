// Our `burst` extension of `rate_limit`: a bucket deeper (or shallower) than one unit's worth of
// requests, as the decision applies it; and the load-time errors it can raise.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import { Decider } from '../../../cell-agent/decide/decide.js';
import { StaticQuotas } from '../../../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { RULES_ERROR_CODES, RulesError } from '../../../cell-agent/rules/rules-errors.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';

const S = 1_000_000_000n;

function decider(rules: string): { admit(n: number): number; clock: { now: bigint } } {
  const clock = { now: 5n * S };
  const d = new Decider(
    {
      table: new BucketTable({ capacity: 64, startNs: 0n }),
      quotas: StaticQuotas.empty({ staticShare: 1, unknownTenant: { kind: 'deny' } }),
      clock: () => clock.now,
    },
    { bounds: DEFAULT_REQUEST_BOUNDS, responseHeaders: false, tableFull: 'open', staticSlices: true },
  );
  d.setRules(compileRules([parseRulesYaml(rules, 'rules.yaml')]));
  return {
    clock,
    admit(n) {
      let ok = 0;
      for (let i = 0; i < n; i++) {
        const r = d.decide({
          domain: 'd',
          descriptors: [{ entries: [{ key: 'ip', value: '203.0.113.9' }], limit: null, hitsAddend: null }],
          hitsAddend: 0,
        });
        assert.ok(r.ok);
        if (!r.decision.overLimit) ok++;
      }
      return ok;
    },
  };
}

void test('burst: 50 per second in a bucket of 100 admits 100 at once, then 50 a second', () => {
  const h = decider(
    'domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 50, burst: 100}\n',
  );
  assert.equal(h.admit(150), 100);
  h.clock.now += S;
  assert.equal(h.admit(150), 50);
  h.clock.now += 2n * S;
  assert.equal(h.admit(150), 100, 'refilled to the burst after 2 s, not beyond');
});

void test('burst below requests_per_unit: a shallower bucket at the same rate', () => {
  const h = decider(
    'domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 60, burst: 5}\n',
  );
  assert.equal(h.admit(20), 5);
  h.clock.now += 3n * S;
  assert.equal(h.admit(20), 3);
});

void test('without burst the bucket holds one unit of requests (unchanged)', () => {
  const h = decider('domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 50}\n');
  assert.equal(h.admit(150), 50);
});

void test('burst errors: below 1, not an integer, with unlimited, a refill longer than the table allows', () => {
  const load = (rateLimit: string): unknown => {
    try {
      compileRules([parseRulesYaml(`domain: d\ndescriptors:\n  - key: ip\n    rate_limit: ${rateLimit}\n`, 'r.yaml')]);
      return null;
    } catch (error) {
      assert.ok(error instanceof RulesError);
      return [error.code, error.message];
    }
  };
  assert.deepEqual(load('{unit: second, requests_per_unit: 5, burst: 0}'), [
    RULES_ERROR_CODES.INVALID_TYPE,
    "r.yaml:4:61: config error, 'burst' must be at least 1",
  ]);
  assert.deepEqual(
    (load('{unit: second, requests_per_unit: 5, burst: 1.5}') as unknown[])[0],
    RULES_ERROR_CODES.INVALID_TYPE,
  );
  assert.deepEqual(load('{unlimited: true, burst: 5}'), [
    RULES_ERROR_CODES.UNLIMITED_WITH_UNIT,
    'r.yaml:4:17: should not specify burst when unlimited',
  ]);
  assert.deepEqual(
    (load('{unit: year, requests_per_unit: 1, burst: 4000000000}') as unknown[])[0],
    RULES_ERROR_CODES.BOUND_EXCEEDED,
  );
});
