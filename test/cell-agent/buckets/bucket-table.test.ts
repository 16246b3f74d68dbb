// The shared bucket table on one thread: decisions equal the pure GCRA model, collisions, eviction of
// idle keys only, TableFull when everything is hot, memory bounds. (Threads: bucket-concurrency.test.ts.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import type { TakeResult } from '../../../cell-agent/buckets/bucket-table.js';
import {
  gcraInitialTat,
  gcraReconfigure,
  gcraTake,
  limitFromInterval,
  limitFromRate,
  limitPerUnit,
  NEVER_NS,
  type GcraLimit,
} from '../../../cell-agent/buckets/gcra.js';
import { hashKey } from '../../../cell-agent/buckets/key-hash.js';
import type { KeyHasher } from '../../../cell-agent/buckets/key-hash.js';

const MS = 1_000_000n;
const S = 1_000_000_000n;

function fnv1a64(key: string, seed: number): bigint {
  const M = (1n << 64n) - 1n;
  let h = 0xcbf29ce484222325n ^ BigInt(seed >>> 0);
  for (let i = 0; i < key.length; i++) {
    h ^= BigInt(key.charCodeAt(i));
    h = (h * 0x100000001b3n) & M;
  }
  return h;
}

void test('hashKey: words 0-1 are FNV-1a 64 over UTF-16 code units (checked against BigInt), word 2 is independent', () => {
  fc.assert(
    fc.property(fc.string({ unit: 'binary', maxLength: 40 }), fc.integer(), (key, seed) => {
      const out = new Int32Array(3);
      hashKey(key, seed, out);
      const got = (BigInt((out[0] ?? 0) >>> 0) << 32n) | BigInt((out[1] ?? 0) >>> 0);
      assert.equal(got, fnv1a64(key, seed));
    }),
    { numRuns: 300 },
  );
  const a = new Int32Array(3);
  const b = new Int32Array(3);
  hashKey('tenant:acme', 1, a);
  hashKey('tenant:acme', 2, b);
  assert.notDeepEqual([...a], [...b]); // seeded
  // No collisions among many similar keys on all 96 bits (nor on the 64-bit part).
  const seen = new Set<string>();
  for (let i = 0; i < 50_000; i++) {
    hashKey(`ip:10.${i >> 16}.${(i >> 8) & 255}.${i & 255}`, 7, a);
    seen.add(`${a[0]}:${a[1]}`);
  }
  assert.equal(seen.size, 50_000);
});

void test('basic decisions, remaining, reset and retry-after through the table', () => {
  const t = new BucketTable({ capacity: 100, startNs: 1_000n * S });
  const l = limitPerUnit(5, 'second'); // T = 200 ms, b = 5, full
  const now = 1_000n * S;
  const got: TakeResult[] = [];
  for (let i = 0; i < 6; i++) got.push(t.take('tenant:a', l, 1, now));
  assert.deepEqual(
    got.map((r) => r.verdict),
    ['allow', 'allow', 'allow', 'allow', 'allow', 'deny'],
  );
  assert.deepEqual(
    got.map((r) => r.remaining),
    [4, 3, 2, 1, 0, 0],
  );
  assert.equal(got[0]?.resetNs, 200n * MS);
  assert.equal(got[5]?.retryAfterNs, 200n * MS);
  assert.equal(got[5]?.resetNs, S);
  assert.equal(t.take('tenant:a', l, 1, now + 200n * MS).verdict, 'allow');
  assert.equal(t.take('tenant:a', l, 6, now + 10n * S).retryAfterNs, NEVER_NS);
  assert.equal(t.take('tenant:b', l, 0, now).remaining, 5);
  assert.equal(t.size(), 1); // hits = 0 on an unknown key creates no bucket
  assert.equal(t.has('tenant:b'), false);
  const zero = limitPerUnit(0, 'second');
  assert.equal(t.take('tenant:c', zero, 1, now).verdict, 'deny');
  assert.equal(t.take('tenant:c', zero, 0, now).retryAfterNs, NEVER_NS);
  assert.equal(t.size(), 1); // nor does a rate-0 limit
  assert.throws(() => t.take('x', l, 1, now - 1n), RangeError); // before startNs
  assert.throws(() => t.take('x', l, -1, now), RangeError);
  assert.throws(() => t.take('x', l, 1.5, now), RangeError);
  const malformed = { intervalNs: 1n, burst: 1n, start: 'full' } as unknown as GcraLimit; // no windowNs
  assert.throws(() => t.take('x', malformed, 1, now), TypeError);
});

type Model = Map<string, { tat: bigint; limit: GcraLimit }>;

/** The pure-GCRA model of one table (no eviction: capacity is ample). */
function modelTake(m: Model, key: string, limit: GcraLimit, hits: number, now: bigint): TakeResult {
  let b = m.get(key);
  if (b === undefined) {
    if (limit.intervalNs === 0n)
      return { verdict: 'deny', allowed: false, remaining: 0, resetNs: 0n, retryAfterNs: NEVER_NS };
    const tat = gcraInitialTat(limit, now); // 'empty': empty at creation
    if (hits === 0 && limit.start === 'full') {
      const d = gcraTake(tat, now, limit, 0);
      return { verdict: 'allow', allowed: true, remaining: d.remaining, resetNs: d.resetNs, retryAfterNs: 0n };
    }
    b = { tat, limit };
    m.set(key, b);
  }
  if (b.limit.intervalNs !== limit.intervalNs || b.limit.burst !== limit.burst) {
    b.tat = gcraReconfigure(b.tat, now, b.limit, limit);
    b.limit = limit;
  }
  const d = gcraTake(b.tat, now, limit, hits);
  if (limit.intervalNs === 0n)
    return { verdict: 'deny', allowed: false, remaining: 0, resetNs: 0n, retryAfterNs: NEVER_NS };
  if (d.allowed) b.tat = d.tat;
  return {
    verdict: d.allowed ? 'allow' : 'deny',
    allowed: d.allowed,
    remaining: d.remaining,
    resetNs: d.resetNs,
    retryAfterNs: d.retryAfterNs,
  };
}

void test('property: the table decides exactly as the pure GCRA model (limits change, rate 0, start policies)', () => {
  const limits: GcraLimit[] = [
    limitFromInterval(1_000n, 5n, 'full'),
    limitFromInterval(2_500n, 3n, 'full'),
    limitFromInterval(700n, 8n, 'empty'),
    limitFromRate(0, 10),
    limitFromInterval(1n, 1_000_000n, 'full'),
    // Windows over 2^52 ns (decided on bigint), and one at exactly 2^52 (the numeric step's edge).
    limitFromInterval(2n ** 50n, 8n, 'full'),
    limitFromInterval(2n ** 49n + 1n, 3n, 'empty'),
    limitFromInterval(2n ** 40n, 2n ** 12n, 'full'),
    // A burst kept as −T in the slot's x word (b ≥ 2^31).
    limitFromInterval(3n, 2n ** 33n, 'full'),
  ];
  const opArb = fc.record({
    key: fc.integer({ min: 0, max: 5 }),
    limit: fc.integer({ min: 0, max: limits.length - 1 }),
    hits: fc.oneof(fc.integer({ min: 0, max: 6 }), fc.constant(2 ** 33 + 1)),
    gap: fc.oneof(
      { weight: 8, arbitrary: fc.integer({ min: 0, max: 3_000 }) },
      { weight: 1, arbitrary: fc.integer({ min: 0, max: 2 ** 50 }) },
    ),
    // The hot path's takeKey() (numbers) instead of take(), where it decides; at: its time as a
    // number (takeKeyAt, an ElapsedClock's reading), where now − startNs is a safe integer.
    byKey: fc.boolean(),
    at: fc.boolean(),
  });
  // Table origins and clocks on both sides of 2^53 ns (numbers, then bigint for the time).
  const startArb = fc.oneof(
    fc.bigInt({ min: 0n, max: 10n ** 15n }),
    fc.bigInt({ min: 2n ** 53n - 10n ** 4n, max: 2n ** 53n + 10n ** 4n }),
    fc.bigInt({ min: 0n, max: 2n ** 56n }),
  );
  fc.assert(
    fc.property(startArb, fc.array(opArb, { minLength: 1, maxLength: 200 }), (startNs, ops) => {
      const table = new BucketTable({ capacity: 64, startNs });
      const model: Model = new Map();
      let now = startNs;
      for (const op of ops) {
        now += BigInt(op.gap);
        const limit = limits[op.limit] ?? limits[0];
        if (limit === undefined) return;
        const key = `k${op.key}`;
        const want = modelTake(model, key, limit, op.hits, now);
        if (op.byKey && BucketTable.keyTakes(limit)) {
          const k = table.beginKey();
          assert.ok(k !== null);
          k.raw(key);
          const rel = now - startNs;
          const r =
            op.at && rel <= BigInt(Number.MAX_SAFE_INTEGER)
              ? table.takeKeyAt(limit, op.hits, Float64Array.of(Number(rel)))
              : table.takeKey(limit, op.hits, now);
          assert.deepEqual(
            {
              verdict: r.verdict,
              allowed: r.allowed,
              remaining: r.remaining,
              resetNs: BigInt(r.resetNs),
              retryAfterNs: r.retryAfterNs === Infinity ? NEVER_NS : BigInt(r.retryAfterNs),
            },
            want,
          );
        } else {
          assert.deepEqual(table.take(key, limit, op.hits, now), want);
        }
      }
      assert.equal(table.size(), model.size);
      assert.equal(table.evictions, 0);
    }),
    { numRuns: 300 },
  );
});

void test('takeKeyAt decides at startNs + elapsed as takeKey does, up to elapsed 2^53 − 1; past it, a RangeError and nothing taken', () => {
  const limit = limitFromInterval(1_000n, 3n, 'full');
  const max = Number.MAX_SAFE_INTEGER;
  for (const startNs of [0n, 2n ** 53n - 7n, 2n ** 56n]) {
    const byNumber = new BucketTable({ capacity: 8, startNs, seed: 1 });
    const byBigint = new BucketTable({ capacity: 8, startNs, seed: 1 });
    const both = (rel: number, hits: number): void => {
      byNumber.beginKey()?.raw('k');
      const a = { ...byNumber.takeKeyAt(limit, hits, Float64Array.of(rel)) };
      byBigint.beginKey()?.raw('k');
      const b = { ...byBigint.takeKey(limit, hits, startNs + BigInt(rel)) };
      assert.deepEqual(a, b, `startNs ${startNs}, elapsed ${rel}`);
    };
    // Near the top of the exact range, one ns apart: the odd values a double would round away.
    for (const rel of [0, 1, 999, max - 4_001, max - 3_001, max - 2, max - 1, max]) {
      for (let i = 0; i < 4; i++) both(rel, 1);
    }
    both(max, 0);
    for (const bad of [max + 1, 2 ** 53 + 2, -1, 0.5, NaN, Infinity]) {
      byNumber.beginKey()?.raw('k');
      assert.throws(() => byNumber.takeKeyAt(limit, 1, Float64Array.of(bad)), RangeError, String(bad));
    }
    // The refused readings took nothing: the two tables still agree.
    both(max, 0);
  }
});

void test('a runtime limit change through the table keeps the level and clamps a shrunk burst', () => {
  const t = new BucketTable({ capacity: 8 });
  const a = limitFromInterval(100n, 10n);
  for (let i = 0; i < 6; i++) t.take('k', a, 1, 0n); // level 4
  const slower = limitFromInterval(1_000n, 10n);
  assert.equal(t.take('k', slower, 0, 0n).remaining, 4);
  const small = limitFromInterval(1_000n, 2n);
  assert.equal(t.take('k', small, 0, 0n).remaining, 2); // clamped at once
  assert.equal(t.take('k', small, 2, 0n).verdict, 'allow');
  assert.equal(t.take('k', small, 1, 0n).verdict, 'deny');
  assert.equal(t.take('k', limitPerUnit(0, 'second'), 1, 5_000n).verdict, 'deny'); // rate 0: emptied
  assert.equal(t.take('k', a, 0, 5_000n).remaining, 0); // back: starts empty
  assert.equal(t.take('k', a, 0, 5_100n).remaining, 1);
});

void test('global (empty-start) buckets are empty when created, however long the table has run; also after eviction', () => {
  const start = 50n * S;
  const t = new BucketTable({ capacity: 1, startNs: start });
  const g = limitFromRate(10, 5); // T = 100 ms, D = 500 ms
  assert.equal(t.take('early', g, 1, start).verdict, 'deny');
  assert.equal(t.take('early', g, 1, start + 100n * MS).verdict, 'allow');
  const other = new BucketTable({ capacity: 2, startNs: start });
  assert.equal(other.take('checked', g, 0, start + 300n * MS).remaining, 0, 'hits 0 on an absent key creates it empty');
  assert.equal(other.take('checked', g, 0, start + 500n * MS).remaining, 2, 'and it refills from then on');
  // 10 s later 'early' is full and idle: evicted for 'late', which starts empty (a grant that moved
  // in, a new tenant), not with a burst it never refilled.
  assert.equal(t.take('late', g, 5, start + 10n * S).verdict, 'deny');
  assert.equal(t.take('late', g, 1, start + 10n * S + 100n * MS).verdict, 'allow');
  assert.equal(t.evictions, 1);
  // 'early' comes back (evicting the full 'late' 20 s on), under a larger burst: empty again.
  assert.equal(t.take('early', limitFromRate(10, 50), 1, start + 30n * S).verdict, 'deny');
  assert.equal(t.evictions, 2);
  const local = limitPerUnit(5, 'second');
  assert.equal(
    new BucketTable({ capacity: 2, startNs: start }).take('local', local, 5, start).verdict,
    'allow',
    'local rules start full',
  );
});

void test('attach: another view of the same shared memory shares every bucket and counter', () => {
  const t = new BucketTable({ capacity: 8 });
  const view = BucketTable.attach(t.shared);
  const l = limitFromInterval(1_000n, 3n);
  assert.equal(t.take('k', l, 2, 0n).remaining, 1);
  assert.equal(view.take('k', l, 1, 0n).remaining, 0);
  assert.equal(t.take('k', l, 1, 0n).verdict, 'deny');
  assert.equal(view.size(), 1);
  assert.equal(view.capacity, 8);
  assert.equal(view.bytes(), t.bytes());
  assert.throws(() => BucketTable.attach({ buffer: new SharedArrayBuffer(64) }), TypeError);
});

/**
 * A weak hash for tests: every key lands in the same two home groups (word 1 and word 0 ^ word 2
 * fixed), keys differ only in words 0 and 2. 'same:*' keys all get one identical 96-bit hash.
 */
const crowdHasher: KeyHasher = (key, _seed, out) => {
  if (key.startsWith('same:')) {
    out[0] = 999;
    out[1] = 7;
    out[2] = 999 ^ 0x55;
    return;
  }
  const i = Number(key.slice(1));
  out[0] = 1_000 + i;
  out[1] = 7;
  out[2] = (1_000 + i) ^ 0x55;
};

void test('collisions: keys crowding the same groups keep distinct buckets, spill into overflow groups, then TableFull', () => {
  const t = new BucketTable({ capacity: 1_000, hasher: crowdHasher });
  const l = limitFromInterval(1_000n, 2n);
  // 2 home groups + 4 overflow groups of 8 slots: 48 keys fit.
  for (let i = 0; i < 48; i++) {
    assert.equal(t.take(`c${i}`, l, 2, 0n).verdict, 'allow', `c${i}`);
  }
  for (let i = 0; i < 48; i++) assert.equal(t.take(`c${i}`, l, 1, 0n).verdict, 'deny', `c${i} shares a bucket`);
  assert.equal(t.size(), 48);
  // All 48 are busy (drained): the 49th cannot be placed even though the table is nearly empty.
  assert.equal(t.take('c48', l, 1, 0n).verdict, 'table-full');
  assert.equal(t.has('c48'), false);
  // Once they have refilled (idle ≥ D), one is evicted for the newcomer.
  assert.equal(t.take('c48', l, 1, 2_000n).verdict, 'allow');
  assert.equal(t.evictions, 1);
  assert.equal(t.size(), 48);
  // Keys whose 96-bit hashes are identical DO share a bucket (the documented, ~n²/2^97 risk).
  const u = new BucketTable({ capacity: 16, hasher: crowdHasher });
  assert.equal(u.take('same:x', l, 2, 0n).verdict, 'allow');
  assert.equal(u.take('same:y', l, 1, 0n).verdict, 'deny');
});

void test('eviction takes only idle (full) buckets, least recently used first; busy ones keep their state', () => {
  const t = new BucketTable({ capacity: 4 });
  const l = limitFromInterval(100n * MS, 10n); // D = 1 s
  t.take('a', l, 10, 0n); // drained: full again at 1 s
  t.take('b', l, 10, 0n);
  t.take('c', l, 1, 0n); // full again at 100 ms
  t.take('d', l, 1, 2n * S + 500n * MS); // touched later: full again at 2.6 s
  assert.equal(t.take('e', l, 1, 50n * MS).verdict, 'table-full');
  assert.equal(t.evictions, 0);
  // At 500 ms only c is full; d's bucket is still drained at that (earlier) clock reading.
  assert.equal(t.take('e', l, 1, 500n * MS).verdict, 'allow');
  assert.equal(t.evictions, 1);
  assert.equal(t.has('c'), false);
  assert.deepEqual(
    ['a', 'b', 'd', 'e'].map((k) => t.has(k)),
    [true, true, true, true],
  );
  // a and b kept their state: at 500 ms they have refilled 5 tokens, not 10.
  assert.equal(t.take('a', l, 0, 500n * MS).remaining, 5);
  // At 5 s all are full; the least recently used (stamp of a/b/e ≈ 0 s, d ≈ 2.5 s) go first.
  t.take('f', l, 1, 5n * S);
  t.take('g', l, 1, 5n * S);
  t.take('h', l, 1, 5n * S);
  assert.equal(t.has('d'), true);
  assert.equal(t.evictions, 4);
  assert.equal(t.size(), 4);
  // An evicted key comes back as the full bucket it would have been: eviction changed nothing.
  assert.equal(t.take('c', l, 10, 6n * S).verdict, 'allow');
});

void test('a re-created bucket is never fuller than the evicted one, even for a lagging clock reading', () => {
  const t = new BucketTable({ capacity: 2 });
  const l = limitFromInterval(100n, 10n); // D = 1000 ns
  t.take('a', l, 10, 0n); // TAT 1000
  t.take('b', l, 1, 0n); // TAT 100
  assert.equal(t.take('c', l, 1, 5_000n).verdict, 'allow'); // evicts a or b (both full at 5000)
  const evicted = t.has('a') ? 'b' : 'a';
  assert.equal(t.evictions, 1);
  // A thread whose clock still reads 900 asks for the evicted key: the non-evicted bucket would
  // have had at most 9 tokens (a) at 900; the re-created one starts full only as of the eviction.
  const lagging = t.take(evicted, l, 1, 900n);
  assert.equal(lagging.verdict !== 'allow' || lagging.remaining <= 8, true);
  // At or after the eviction's now it is the full bucket the evicted one would be.
  assert.equal(t.take(evicted, l, 0, 6_000n).remaining, 10);
});

void test('memory: bytes are fixed by the capacity; 1M keys fit well under 256 MiB', () => {
  assert.equal(BucketTable.bytesFor(1_000_000) < 256 * 1024 * 1024, true);
  assert.equal(BucketTable.bytesFor(1_000_000) / 1_000_000 <= 64, true);
  const t = new BucketTable({ capacity: 10_000 });
  assert.equal(t.bytes(), BucketTable.bytesFor(10_000));
  assert.throws(() => new BucketTable({ capacity: 1_000_000, maxBytes: 1024 * 1024 }), RangeError);
  assert.throws(() => new BucketTable({ capacity: 0 }), RangeError);
  // The key count never exceeds the capacity, however many keys arrive.
  const l = limitFromInterval(S, 1n);
  const small = new BucketTable({ capacity: 100, seed: 42 });
  let full = 0;
  for (let i = 0; i < 1_000; i++) if (small.take(`ip:${i}`, l, 1, 0n).verdict === 'table-full') full++;
  assert.equal(small.size(), 100);
  assert.equal(full, 900);
});
