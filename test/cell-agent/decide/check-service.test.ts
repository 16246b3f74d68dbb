// CheckService: an exception inside the decision never escapes — the check is answered fail-open,
// marked degraded, counted and logged (rate-limited). Overloaded: the open policy answers OK without
// deciding; the bounded policy admits at most each key's fail-open allowance and refuses the rest.
import { HrtimeClock } from '../../../cell-agent/buckets/elapsed-clock.js';
import type { ElapsedClock } from '../../../cell-agent/buckets/elapsed-clock.js';
import { test } from 'node:test';
import { performance } from 'node:perf_hooks';
import assert from 'node:assert/strict';
import { BucketTable } from '../../../cell-agent/buckets/bucket-table.js';
import { CheckService, overloadAllowances } from '../../../cell-agent/decide/check-service.js';
import { Decider } from '../../../cell-agent/decide/decide.js';
import type { DeciderOptions } from '../../../cell-agent/decide/decide.js';
import { parseQuotaFile } from '../../../cell-agent/decide/quota-file.js';
import { StaticQuotas } from '../../../cell-agent/decide/quotas.js';
import { ThrottleCounts } from '../../../cell-agent/observe/throttle-log.js';
import { compileRules } from '../../../cell-agent/rules/rules-compile.js';
import { parseRulesYaml } from '../../../cell-agent/rules/rules-schema.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { LagGuard } from '../../../cell-agent/observe/lag-guard.js';
import { StatsWriter, createStatsShared, readStats } from '../../../cell-agent/observe/stats.js';
import type { RlsRequest } from '../../../cell-agent/messages/rls-messages.js';
import { encodeRateLimitResponse } from '../../../cell-agent/rls/rls-codec.js';
import { captureLogger } from '../../../testkit/logs.js';

const REQ: RlsRequest = {
  domain: 'd',
  hitsAddend: 0,
  descriptors: [
    { entries: [{ key: 'k', value: 'v' }], limit: null, hitsAddend: null },
    { entries: [], limit: null, hitsAddend: null },
  ],
};

void test('an exception inside the decision is answered fail-open, counted and logged once a second', () => {
  const stats = createStatsShared(1);
  const cap = captureLogger();
  const throwing = {
    options: { bounds: DEFAULT_REQUEST_BOUNDS },
    elapsedClock: new HrtimeClock(0n),
    decide: () => {
      throw new Error('boom');
    },
  } as unknown as Decider;
  const service = new CheckService(throwing, new StatsWriter(stats, 0), null, cap.logger);
  for (let i = 0; i < 3; i++) {
    const out = service.check(REQ);
    assert.equal(out.kind, 'answer');
    if (out.kind !== 'answer') return;
    assert.equal(out.verdict, 'degraded');
    assert.equal(out.response.overallCode, 1);
    assert.equal(out.response.statuses.length, 2);
    assert.deepEqual(
      out.response.responseHeadersToAdd,
      [
        { key: 'x-ratelimit-degraded', value: 'true' },
        { key: 'x-ratelimit-fail-open', value: 'true' },
      ],
      'degraded and marked fail-open (outside the bound)',
    );
  }
  const t = readStats(stats);
  assert.equal(t.failOpen.error, 3);
  assert.equal(t.decisions.degraded.local, 3);
  assert.equal(
    cap.lines.filter((l) => l['msg'] === 'check failed inside the agent; answered fail-open').length,
    1,
    'logged once, the rest suppressed',
  );
});

void test('overloaded, open policy: answered OK at once without calling the decider', () => {
  const stats = createStatsShared(1);
  let called = 0;
  const decider = {
    options: { bounds: DEFAULT_REQUEST_BOUNDS },
    elapsedClock: new HrtimeClock(0n),
    decide: () => {
      called++;
      throw new Error('not reached');
    },
  } as unknown as Decider;
  const lag = new LagGuard({ thresholdMs: 10, intervalMs: 5, backlog: 0 });
  const t0 = performance.now();
  lag.start(t0);
  try {
    lag.tick(t0 + 500); // the timer ran 495 ms late: the loop was blocked
    const service = new CheckService(decider, new StatsWriter(stats, 0), lag, captureLogger().logger, {
      overload: { policy: 'open', allowance: 1 },
    });
    const out = service.check(REQ);
    assert.equal(out.kind === 'answer' && out.verdict, 'degraded');
  } finally {
    lag.stop();
  }
  assert.equal(called, 0);
  assert.equal(readStats(stats).failOpen.overload, 1);
});

void test("a lag guard on the decider's clock: a check reads the clock twice (its start, shared with the guard, and its end), as without a guard", () => {
  const readsPerCheck = (withGuard: boolean): number => {
    const hr = new HrtimeClock(0n);
    let reads = 0;
    const elapsed: ElapsedClock = {
      originNs: 0n,
      elapsed: hr.elapsed,
      read: () => {
        reads++;
        hr.read();
      },
    };
    const table = new BucketTable({ capacity: 1000, startNs: 0n });
    const quotas = new StaticQuotas(parseQuotaFile({}), { staticShare: 1, unknownTenant: { kind: 'deny' } });
    const decider = new Decider(
      { table, quotas, clock: () => process.hrtime.bigint(), elapsed },
      { bounds: DEFAULT_REQUEST_BOUNDS, responseHeaders: false, tableFull: 'open', staticSlices: true },
    );
    decider.setRules(
      compileRules([
        parseRulesYaml(
          'domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n',
          'r.yaml',
        ),
      ]),
    );
    const lag = withGuard ? new LagGuard({ thresholdMs: 10, intervalMs: 5, backlog: 0 }, null, elapsed) : null;
    lag?.start();
    try {
      const service = new CheckService(decider, new StatsWriter(createStatsShared(1), 0), lag, captureLogger().logger, {
        overload: { policy: 'open', allowance: 1 },
      });
      const before = reads;
      // Any other clock the check reads (the guard's performance.now() before it shared the reading).
      const perfNow = Object.getOwnPropertyDescriptor(performance, 'now');
      let perfReads = 0;
      const realNow = performance.now.bind(performance);
      Object.defineProperty(performance, 'now', {
        configurable: true,
        value: () => {
          perfReads++;
          return realNow();
        },
      });
      let out;
      try {
        out = service.check({
          domain: 'd',
          hitsAddend: 0,
          descriptors: [{ entries: [{ key: 'k', value: 'v' }], limit: null, hitsAddend: null }],
        });
      } finally {
        if (perfNow === undefined) delete (performance as { now?: unknown }).now;
        else Object.defineProperty(performance, 'now', perfNow);
      }
      assert.equal(out.kind === 'answer' && out.verdict, 'ok');
      assert.equal(perfReads, 0, 'no performance.now()');
      return reads - before;
    } finally {
      lag?.stop();
    }
  };
  assert.equal(readsPerCheck(false), 2);
  assert.equal(readsPerCheck(true), 2, 'the guard reads no clock of its own');
});

// ---- the bounded policy, with a real decider on a virtual clock --------------------------------

const S = 1_000_000_000n;
const RULES = `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: tenant
    global: true
`;

function boundedHarness(allowance: number, tenants: unknown = {}) {
  const clock = { now: 10n * S };
  const table = new BucketTable({ capacity: 1000, startNs: 0n });
  const quotas = new StaticQuotas(parseQuotaFile(tenants), { staticShare: 0.5, unknownTenant: { kind: 'deny' } });
  const options: DeciderOptions = {
    bounds: DEFAULT_REQUEST_BOUNDS,
    responseHeaders: false,
    tableFull: 'open',
    staticSlices: true,
    cell: 'c1',
  };
  const decider = new Decider({ table, quotas, clock: () => clock.now }, options);
  decider.setRules(compileRules([parseRulesYaml(RULES, 'rules.yaml')]));
  const stats = createStatsShared(1);
  const throttle = new ThrottleCounts();
  const lag = new LagGuard({ thresholdMs: 10, intervalMs: 5, backlog: 0 });
  const service = new CheckService(decider, new StatsWriter(stats, 0), lag, captureLogger().logger, {
    overload: { policy: 'bounded', allowance },
    allowances: overloadAllowances(allowance, table, throttle),
    throttle,
    encode: (response) => encodeRateLimitResponse(response, true),
  });
  const t0 = performance.now();
  lag.start(t0);
  const overload = (): void => lag.tick(performance.now() + 500); // as if the timer ran 500 ms late
  const recover = (): void => {
    lag.tick(performance.now() + 5_000_000);
    lag.tick(performance.now() + 5_000_005); // on time again: caught up
  };
  const check = (...entries: [string, string][]): Answer => {
    const out = service.check({
      domain: 'd',
      hitsAddend: 0,
      descriptors: [{ entries: entries.map(([key, value]) => ({ key, value })), limit: null, hitsAddend: null }],
    });
    if (out.kind !== 'answer') throw new Error(out.message);
    return out;
  };
  return { clock, stats, throttle, lag, service, overload, recover, check };
}

type Answer = Extract<ReturnType<CheckService['check']>, { kind: 'answer' }>;
const header = (a: Answer, key: string): string | undefined =>
  a.response.responseHeadersToAdd.find((h) => h.key === key)?.value;

void test('bounded: while overloaded a key admits at most its allowance fail-open, the rest is refused with one constant answer, and its buckets are untouched', () => {
  const h = boundedHarness(1);
  try {
    h.overload();
    const answers = Array.from({ length: 100 }, () => h.check(['k', 'x']));
    const admitted = answers.filter((a) => !a.overLimit);
    assert.equal(admitted.length, 10, "the local rule's rate (10/s), one second deep, starting full like the rule");
    for (const a of admitted) {
      assert.equal(a.verdict, 'degraded');
      assert.equal(header(a, 'x-ratelimit-fail-open'), 'true', 'admitted without a decision: marked fail-open');
    }
    const refused = answers.filter((a) => a.overLimit);
    assert.equal(refused.length, 90);
    assert.equal(new Set(refused).size, 1, 'one shared answer object: nothing built per refusal');
    assert.equal(refused[0]?.response.overallCode, 2);
    assert.equal(header(refused[0], 'x-ratelimit-refused-by'), 'overload');
    assert.equal(header(refused[0], 'x-ratelimit-cell'), 'c1');
    assert.ok(
      refused[0]?.encoded !== undefined &&
        refused[0].encoded.equals(encodeRateLimitResponse(refused[0].response, true)),
      "pre-encoded with the transport's encoder",
    );
    // Half a second later (virtual clock): 5 more allowance tokens.
    h.clock.now += S / 2n;
    assert.equal(Array.from({ length: 20 }, () => h.check(['k', 'x'])).filter((a) => !a.overLimit).length, 5);
    // Caught up: decided by the rule's own bucket, which the overload never charged (full: 10).
    h.recover();
    const decided = Array.from({ length: 20 }, () => h.check(['k', 'x']));
    assert.equal(decided.filter((a) => !a.overLimit).length, 10);
    assert.equal(
      decided.some((a) => header(a, 'x-ratelimit-fail-open') !== undefined),
      false,
      'decisions are not fail-open',
    );
    const t = readStats(h.stats);
    assert.equal(t.failOpen.overload, 15);
    assert.equal(t.overloadRefused.allowance, 105);
    const drained = h.throttle.drain();
    assert.deepEqual(drained.failOpen, [['overload', 'd|k=x', 15]], 'fail-open answers counted per reason and key');
    assert.deepEqual(drained.overload, [['d|k=x', 105]], 'overload refusals counted per key for the throttling log');
  } finally {
    h.lag.stop();
  }
});

void test("bounded: a global quota's allowance is its floor (here the static share), starting empty; an unknown tenant has none", () => {
  const h = boundedHarness(1, { tiers: { t: { rate: 40, burst: 40 } }, tenants: { acme: 't' } });
  try {
    h.overload();
    assert.equal(
      h.check(['tenant', 'acme']).overLimit,
      true,
      'a new global allowance starts empty, like a global bucket',
    );
    h.clock.now += 10n * S;
    const answers = Array.from({ length: 100 }, () => h.check(['tenant', 'acme']));
    assert.equal(answers.filter((a) => !a.overLimit).length, 20, 'share 0.5 of 40/s: 20/s, one second deep');
    assert.equal(
      Array.from({ length: 10 }, () => h.check(['tenant', 'nobody'])).filter((a) => !a.overLimit).length,
      0,
      'a denied tenant gets nothing',
    );
    assert.deepEqual(h.throttle.drain().failOpen, [['overload', 'tenant/acme', 20]], 'counted under the quota key');
  } finally {
    h.lag.stop();
  }
});

void test('bounded with allowance 0: nothing is admitted while overloaded, and shed() refuses before decoding', () => {
  const h = boundedHarness(0);
  try {
    assert.equal(h.service.shed(), null, 'not overloaded: decode and decide');
    h.overload();
    const shed = h.service.shed();
    assert.ok(
      shed !== null && shed.overLimit && shed.response.statuses.length === 0,
      'a constant refusal without statuses',
    );
    assert.equal(Array.from({ length: 30 }, () => h.check(['k', 'x'])).filter((a) => !a.overLimit).length, 0);
    const t = readStats(h.stats);
    assert.equal(t.failOpen.overload, 0);
    assert.equal(t.overloadRefused.shed, 1);
    assert.equal(t.overloadRefused.allowance, 30);
  } finally {
    h.lag.stop();
  }
});

void test('bounded: a check with nothing to bound (no rule matched) is decided normally while overloaded', () => {
  const h = boundedHarness(1);
  try {
    h.overload();
    const a = h.check(['unknown-key', 'x']);
    assert.equal(a.overLimit, false);
    assert.equal(a.verdict, 'ok', 'a decision (no bucket involved), not a fail-open answer');
  } finally {
    h.lag.stop();
  }
});
