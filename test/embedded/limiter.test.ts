// createLimiter, framework-free: the decision, hits, bounds, options, metrics in the app's registry,
// and fail-open on an exception inside the decision.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { LimiterInputError, createLimiter } from '../../embedded/limiter.js';
import { LimiterOptionsError } from '../../embedded/options.js';

const RULES = {
  domain: 'api',
  descriptors: [{ key: 'user', rate_limit: { unit: 'minute', requests_per_unit: 10, burst: 4 } }],
};
const user = (v: string) => [[{ key: 'user', value: v }]];

void test('check: burst and hits, hits 0 asks without taking, the policy reported, retry-after in whole seconds', async () => {
  const l = await createLimiter({ rules: RULES });
  try {
    assert.equal(l.domain, 'api');
    const peek = l.check({ descriptors: user('a'), hits: 0 });
    assert.deepEqual([peek.allowed, peek.policies[0]?.remaining], [true, 4]);
    assert.equal(l.check({ descriptors: user('a'), hits: 3 }).allowed, true);
    const d = l.check({ descriptors: user('a'), hits: 2 });
    assert.equal(d.allowed, false);
    assert.equal(d.overLimit, true);
    assert.equal(d.retryAfterSeconds, 6, 'one more token in 6 s at 10 a minute');
    assert.deepEqual(
      d.policies[0] && { ...d.policies[0], ratePerSecond: Math.round(d.policies[0].ratePerSecond * 600) / 600 },
      {
        descriptor: 0,
        name: 'user',
        limit: 10,
        windowSeconds: 60,
        ratePerSecond: 1 / 6,
        burst: 4,
        remaining: 0,
        resetSeconds: 6,
        overLimit: true,
      },
    );
    assert.equal(l.check({ descriptors: user('a') }).allowed, true, 'the refused 2 took nothing: 1 left');
    assert.equal(l.check({ descriptors: user('b'), hits: 4 }).allowed, true);
    assert.deepEqual(l.check({ descriptors: [] }), {
      allowed: true,
      overLimit: false,
      retryAfterSeconds: 0,
      degraded: false,
      failOpen: false,
      policies: [],
    });
    assert.throws(() => l.check({ descriptors: user('x'.repeat(5000)) }), LimiterInputError);
    assert.throws(() => l.check({ descriptors: user('a'), hits: -1 }), LimiterInputError);
    assert.throws(() => l.check({ descriptors: user('a'), hits: 1.5 }), LimiterInputError);
  } finally {
    await l.close();
  }
});

void test('an exception inside the decision fails open: marked, counted, logged at most once a second', async () => {
  const lines: string[] = [];
  const registry = new Registry();
  const l = await createLimiter({
    rules: RULES,
    registry,
    logger: { warn: () => undefined, info: () => undefined, error: (_o, m) => lines.push(m) },
  });
  const started = Date.now();
  try {
    const poisoned = [
      [
        {
          key: 'user',
          get value(): string {
            throw new Error('boom');
          },
        },
      ],
    ];
    for (let i = 0; i < 4; i++) {
      const d = l.check({ descriptors: poisoned });
      assert.deepEqual([d.allowed, d.failOpen, d.degraded], [true, true, true]);
    }
    assert.ok(lines.length >= 1 && lines.length <= 1 + Math.floor((Date.now() - started) / 1000));
    assert.match(await registry.metrics(), /cellquota_embedded_fail_open_total\{limiter="api",reason="error"\} 4/);
  } finally {
    await l.close();
  }
});

void test("several limiters in the app's registry, told apart by name; a name twice is refused; close unregisters", async () => {
  const registry = new Registry();
  const a = await createLimiter({ rules: RULES, name: 'a', registry });
  const b = await createLimiter({ rules: RULES, name: 'b', registry });
  a.check({ descriptors: user('u') });
  b.check({ descriptors: user('u') });
  b.check({ descriptors: user('u') });
  const text = await registry.metrics();
  assert.match(text, /cellquota_embedded_decisions_total\{limiter="a",verdict="ok",scope="local"\} 1/);
  assert.match(text, /cellquota_embedded_decisions_total\{limiter="b",verdict="ok",scope="local"\} 2/);
  assert.match(text, /cellquota_embedded_bucket_table_keys\{limiter="b"\} 1/);
  await assert.rejects(createLimiter({ rules: RULES, name: 'a', registry }), /already registered/);
  await a.close();
  assert.doesNotMatch(await registry.metrics(), /limiter="a"/);
  await b.close();
});

void test('rules from a file, watched: a changed limit applies without a restart', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'cq-embedded-'));
  const file = join(dir, 'rules.yaml');
  await writeFile(
    file,
    'domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n',
  );
  const l = await createLimiter({ rules: file, watchRules: true });
  try {
    assert.deepEqual(
      [l.check({ descriptors: user('a') }).allowed, l.check({ descriptors: user('a') }).allowed],
      [true, false],
    );
    await writeFile(
      file,
      'domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n',
    );
    const deadline = Date.now() + 20_000;
    while (l.check({ descriptors: user('b'), hits: 0 }).policies[0]?.limit !== 100) {
      assert.ok(Date.now() < deadline, 'the new rules applied within 20 s');
      await new Promise((r) => setTimeout(r, 50));
    }
  } finally {
    await l.close();
    await rm(dir, { recursive: true, force: true });
  }
});

void test('bad options: each one named, nothing started', async () => {
  await assert.rejects(
    createLimiter({ rules: RULES, coordinators: '127.0.0.1:1' }),
    (e: Error) => e instanceof LimiterOptionsError && /cell: required with coordinators/.test(e.message),
  );
  // One source of truth: with coordinators the tiers, tenants, floors and unknown-tenant policy are theirs.
  await assert.rejects(
    createLimiter({
      rules: RULES,
      cell: 'c1',
      coordinators: '127.0.0.1:1',
      tenants: { tiers: {}, tenants: {} },
      staticShare: 0.5,
      unknownTenant: 'allow',
    }),
    (e: Error) =>
      e instanceof LimiterOptionsError &&
      ['tenants', 'staticShare', 'unknownTenant'].every((k) =>
        new RegExp(`${k}: not with coordinators: the coordinators hold every tier`).test(e.message),
      ),
  );
  await assert.rejects(
    createLimiter({ rules: RULES, tlsCa: '/nonexistent/ca.pem' }),
    (e: Error) => e instanceof LimiterOptionsError && /are for the coordinators/.test(e.message),
  );
  await assert.rejects(
    createLimiter({ rules: RULES, staticShare: 2, tableCapacity: 0 }),
    (e: Error) => /staticShare/.test(e.message) && /tableCapacity/.test(e.message),
  );
  await assert.rejects(
    createLimiter({
      rules: { domain: 'a', descriptors: [{ key: 'k', rate_limit: { unit: 'fortnight', requests_per_unit: 1 } }] },
    }),
    /invalid rate limit unit 'fortnight'/,
  );
  await assert.rejects(
    createLimiter({ rules: [RULES, { ...RULES, domain: 'other' }] }),
    /2 domains .* say which with the domain option/,
  );
  await assert.rejects(createLimiter({ rules: RULES, domain: 'nope' }), /no domain 'nope'/);
  await assert.rejects(createLimiter({ rules: RULES, bogus: 1 } as never), /bogus/);
});

void test('checkInPlace answers as check does, in one reused object; a decision from check() is the caller’s to keep', async () => {
  const rules = {
    domain: 'api',
    descriptors: [
      { key: 'user', rate_limit: { unit: 'minute', requests_per_unit: 10, burst: 3 } },
      { key: 'limiter', value: 'all', rate_limit: { unit: 'minute', requests_per_unit: 5, name: 'everyone' } },
      { key: 'free' },
    ],
  };
  const fresh = await createLimiter({ rules });
  const inPlace = await createLimiter({ rules });
  try {
    const all = [{ key: 'limiter', value: 'all' }];
    const steps = [
      { descriptors: user('a') },
      { descriptors: user('a'), hits: 0 },
      { descriptors: [[{ key: 'free', value: 'x' }]] },
      { descriptors: [all, [{ key: 'user', value: 'b' }]] },
      { descriptors: user('a'), hits: 2 },
      { descriptors: user('a') }, // refused: 3 taken
      { descriptors: [all, [{ key: 'user', value: 'c' }]], hits: 4 }, // refused by everyone: 1 left there
      { descriptors: user('b') },
      { descriptors: [] },
    ];
    const kept: unknown[] = [];
    const copies: unknown[] = [];
    let reused: unknown = null;
    for (const step of steps) {
      const a = fresh.check(step);
      const b = inPlace.checkInPlace(step);
      assert.deepEqual(b, a, JSON.stringify(step));
      kept.push(a);
      copies.push(structuredClone(a));
      if (step.descriptors.length > 0) {
        if (reused !== null) assert.equal(b, reused, 'the same object every time');
        reused = b;
      }
    }
    assert.deepEqual(kept, copies, 'the decisions check() returned are unchanged by later checks');
    assert.ok(kept.some((d) => (d as { overLimit: boolean }).overLimit));
  } finally {
    await fresh.close();
    await inPlace.close();
  }
});
