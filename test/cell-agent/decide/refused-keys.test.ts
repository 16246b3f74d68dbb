// The refused bucket keys the one-descriptor fast path keeps by key hash (cell-agent/decide/
// refused-keys.ts): a refusal's x-ratelimit-refused-limit header, its Refusal.limit and the key the
// throttling log counts are the bucket key of THAT request, also when more keys are refused than the
// keeper holds (its sets evict), in any order, with the rule named or not — the same answers as the
// general path, which builds every key from the rules.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import { Decider, REFUSED_LIMIT_HEADER } from '../../../cell-agent/decide/decide.js';
import { MAX_KEPT_KEY, RefusedKeys, type RefusedKey } from '../../../cell-agent/decide/refused-keys.js';
import { parseQuotaFile } from '../../../cell-agent/decide/quota-file.js';
import { StaticQuotas } from '../../../cell-agent/decide/quotas.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import type { RlsRequest } from '../../../cell-agent/messages/rls-messages.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';

const words = (a: number, b: number, c: number): Int32Array => Int32Array.of(a, b, c);

/** keep() twice in a row, as two refusals of one key in a row: the second keeps it. */
function keptTwice(kept: RefusedKeys, w: Int32Array, key: string): RefusedKey {
  kept.keep(w, key);
  return kept.keep(w, key);
}

void test('RefusedKeys: a key refused twice in a row is kept under its three words, with a frozen header', () => {
  const kept = new RefusedKeys('x-h');
  assert.equal(kept.find(words(1, 2, 3)), null);
  const first = kept.keep(words(1, 2, 3), 'd|ip=1');
  assert.deepEqual(first, { key: 'd|ip=1', header: { key: 'x-h', value: 'd|ip=1' } });
  assert.equal(Object.isFrozen(first.header), false, 'refused once: answered, not kept');
  assert.equal(kept.find(words(1, 2, 3)), null);
  const k = kept.keep(words(1, 2, 3), 'd|ip=1');
  assert.deepEqual(k.header, { key: 'x-h', value: 'd|ip=1' });
  assert.equal(Object.isFrozen(k.header), true);
  assert.equal(kept.find(words(1, 2, 3)), k, 'the same object: its header encoding is kept by identity');
  // Same set (word 1), other words: not this key.
  assert.equal(kept.find(words(9, 2, 3)), null);
  assert.equal(kept.find(words(1, 2, 4)), null);
});

void test('RefusedKeys: keys taking turns in one set are not kept', () => {
  const kept = new RefusedKeys('x-h');
  for (let round = 0; round < 3; round++)
    for (const k of [1, 2, 3]) assert.equal(Object.isFrozen(kept.keep(words(k, 7, 0), `k${k}`).header), false);
  for (const k of [1, 2, 3]) assert.equal(kept.find(words(k, 7, 0)), null);
});

void test('RefusedKeys: a set holds its two most recent keys; a key over the bound is returned, not kept', () => {
  const kept = new RefusedKeys('x-h');
  // Word 1 picks the set: 5, 5 + 1024 and 5 + 2048 share one.
  const a = keptTwice(kept, words(1, 5, 0), 'a');
  const b = keptTwice(kept, words(2, 5 + 1024, 0), 'b');
  assert.equal(kept.find(words(1, 5, 0)), a);
  assert.equal(kept.find(words(2, 5 + 1024, 0)), b);
  keptTwice(kept, words(3, 5 + 2048, 0), 'c');
  assert.equal(kept.find(words(1, 5, 0)), null, 'the oldest of the set made room');
  assert.equal(kept.find(words(2, 5 + 1024, 0)), b);
  assert.equal(kept.find(words(3, 5 + 2048, 0))?.key, 'c');

  const long = 'k'.repeat(MAX_KEPT_KEY + 1);
  const l = keptTwice(kept, words(4, 6, 0), long);
  assert.equal(l.key, long);
  assert.equal(l.header.value, long);
  assert.equal(kept.find(words(4, 6, 0)), null);
});

const RULES = `
domain: d
descriptors:
  - key: ip
    value: "10.*"
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1, name: per-user}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 1}
`;

function decider(fastPath: boolean): { decider: Decider; refused: string[] } {
  const refused: string[] = [];
  const d = new Decider(
    {
      table: new BucketTable({ capacity: 20_000, seed: 11 }),
      quotas: new StaticQuotas(parseQuotaFile({ tiers: {}, tenants: {} }), {
        staticShare: 1,
        unknownTenant: { kind: 'deny' },
      }),
      clock: () => 5_000_000_000n,
      onRefused: (k, h, why) => refused.push(JSON.stringify([k, h, why])),
    },
    {
      bounds: DEFAULT_REQUEST_BOUNDS,
      responseHeaders: false,
      tableFull: 'open',
      staticSlices: true,
      cell: 'c',
      fastPath,
    },
  );
  d.setRules(compileRules([parseRulesYaml(RULES, 'rules.yaml')]));
  return { decider: d, refused };
}

// More distinct refused keys than the keeper's 2,048 entries, so its sets evict while refusals of
// evicted and kept keys interleave; values with the key format's special characters and a long one.
const KEYS = 3000;
function request(i: number): RlsRequest {
  const kind = i % 3;
  const entries =
    kind === 0
      ? [{ key: 'ip', value: `10.0.${i >> 8}.${i & 255}` }]
      : kind === 1
        ? [{ key: 'user', value: `u|${i}=~\\` }]
        : [{ key: 'path', value: i % 300 === 2 ? `/${'p'.repeat(MAX_KEPT_KEY)}${i}` : `/p/${i}` }];
  return { domain: 'd', hitsAddend: 1, descriptors: [{ entries, limit: null, hitsAddend: null }] };
}

/** `n` request indexes over the KEYS keys, in an order drawn from `seed` (a 32-bit LCG). */
function refusals(seed: number, n: number): number[] {
  let x = seed >>> 0;
  return Array.from({ length: n }, () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return x % KEYS;
  });
}

void test('the fast path refuses with each request its own bucket key, as the general path does', () => {
  fc.assert(
    fc.property(fc.integer(), (seed) => {
      const fast = decider(true);
      const general = decider(false);
      const order = refusals(seed, 2 * KEYS);
      // Every key's first request takes its one token; every later one is refused.
      let fromKept = 0;
      for (const i of [...Array.from({ length: KEYS }, (_, k) => k), ...order]) {
        const req = request(i);
        const a = fast.decider.decide(req);
        assert.deepEqual(a, general.decider.decide(req), JSON.stringify(req));
        const h = a.ok
          ? a.decision.response.responseHeadersToAdd.find((x) => x.key === REFUSED_LIMIT_HEADER)
          : undefined;
        if (h !== undefined && h.value !== 'per-user' && Object.isFrozen(h)) fromKept++;
      }
      // Both ways were taken: bucket keys answered from the keeper and bucket keys built for the answer
      // (the named rule's header is its own, frozen, kept by the rule).
      assert.equal(fromKept > order.length / 10, true, `${fromKept} of ${order.length} refusals from kept keys`);
      assert.equal(fromKept < order.length, true, `${fromKept} of ${order.length} refusals from kept keys`);
      assert.equal(fast.refused.length, order.length, 'every request after the first of its key was refused');
      assert.deepEqual(fast.refused, general.refused);
      // The header names the request's bucket (or its rule's name): one of each, written out.
      const limitOf = (i: number): string | undefined => {
        const d = fast.decider.decide(request(i));
        assert.equal(d.ok, true);
        return d.ok ? d.decision.response.responseHeadersToAdd.find((h) => h.key === REFUSED_LIMIT_HEADER)?.value : '';
      };
      assert.equal(limitOf(0), 'd|ip=10.0.0.0');
      assert.equal(limitOf(1), 'per-user');
      assert.equal(limitOf(5), 'd|path=/p/5');
    }),
    { numRuns: 4 },
  );
});
