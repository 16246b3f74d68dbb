// CheckService: an exception inside the decision never escapes — the check is answered fail-open,
// marked degraded, counted and logged (rate-limited); overload answers without deciding.
import { test } from 'node:test';
import { performance } from 'node:perf_hooks';
import assert from 'node:assert/strict';
import { CheckService } from '../../../cell-agent/decide/check-service.js';
import type { Decider } from '../../../cell-agent/decide/decide.js';
import { DEFAULT_REQUEST_BOUNDS } from '../../../cell-agent/decide/request-check.js';
import { LagGuard } from '../../../cell-agent/observe/lag-guard.js';
import { StatsWriter, createStatsShared, readStats } from '../../../cell-agent/observe/stats.js';
import type { RlsRequest } from '../../../cell-agent/rls/rls-codec.js';
import { captureLogger } from '../agent/agent-helpers.js';

const REQ: RlsRequest = { domain: 'd', hitsAddend: 0, descriptors: [{ entries: [{ key: 'k', value: 'v' }], limit: null, hitsAddend: null }, { entries: [], limit: null, hitsAddend: null }] };

void test('an exception inside the decision is answered fail-open, counted and logged once a second', () => {
  const stats = createStatsShared(1);
  const cap = captureLogger();
  const throwing = { options: { bounds: DEFAULT_REQUEST_BOUNDS }, decide: () => { throw new Error('boom'); } } as unknown as Decider;
  const service = new CheckService(throwing, new StatsWriter(stats, 0), null, cap.logger);
  for (let i = 0; i < 3; i++) {
    const out = service.check(REQ);
    assert.equal(out.kind, 'answer');
    if (out.kind !== 'answer') return;
    assert.equal(out.verdict, 'degraded');
    assert.equal(out.response.overallCode, 1);
    assert.equal(out.response.statuses.length, 2);
    assert.deepEqual(out.response.responseHeadersToAdd, [{ key: 'x-ratelimit-degraded', value: 'true' }, { key: 'x-ratelimit-fail-open', value: 'true' }], 'degraded and marked fail-open (outside the bound)');
  }
  const t = readStats(stats);
  assert.equal(t.failOpen.error, 3);
  assert.equal(t.decisions.degraded.local, 3);
  assert.equal(cap.lines.filter((l) => l['msg'] === 'check failed inside the agent; answered fail-open').length, 1, 'logged once, the rest suppressed');
});

void test('overloaded: answered at once without calling the decider', () => {
  const stats = createStatsShared(1);
  let called = 0;
  const decider = { options: { bounds: DEFAULT_REQUEST_BOUNDS }, decide: () => { called++; throw new Error('not reached'); } } as unknown as Decider;
  const lag = new LagGuard({ thresholdMs: 10, intervalMs: 5 });
  const t0 = performance.now();
  lag.start(t0);
  try {
    lag.tick(t0 + 500); // the timer ran 495 ms late: the loop was blocked
    const service = new CheckService(decider, new StatsWriter(stats, 0), lag, captureLogger().logger);
    const out = service.check(REQ);
    assert.equal(out.kind === 'answer' && out.verdict, 'degraded');
  } finally {
    lag.stop();
  }
  assert.equal(called, 0);
  assert.equal(readStats(stats).failOpen.overload, 1);
});
