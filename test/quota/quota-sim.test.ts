// The whole-system quota simulation (test/sim/quota-sim.ts): the real ledger, grant policy /
// allocator and GCRA, a modelled leader and modelled agents, over many seeds. Every run checks, after
// every event, that the limits the agents have in force never sum above the quota, that the ledger's
// invariants hold, that each agent uses no more than the ledger counts it at, and that no 1 s window
// admits more than rate × 1 s + burst. Planted bugs show the checkers are not blind, each on its own.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { QUOTA_SCENARIOS, runQuotaSimulation, type QuotaPlantedBugs, type QuotaSimResult } from '../sim/quota-sim.js';

function describe(r: QuotaSimResult): string {
  return r.ok ? 'ok' : `seed ${r.seed} (${r.stats.scenario}): ${r.violation?.kind ?? '?'}: ${r.violation?.message ?? ''} ${JSON.stringify(r.violation?.evidence ?? {})}`;
}

void test('400 seeds with scenarios drawn at random: no violation', (t) => {
  const seen = new Map<string, number>();
  const failed: string[] = [];
  for (let seed = 1; seed <= 400; seed++) {
    const r = runQuotaSimulation({ seed });
    seen.set(r.stats.scenario, (seen.get(r.stats.scenario) ?? 0) + 1);
    if (!r.ok) failed.push(describe(r));
  }
  assert.deepEqual(failed, []);
  t.diagnostic(`scenarios drawn: ${[...seen].map(([k, v]) => `${k} ${v}`).join(', ')}`);
  assert.equal(seen.size, QUOTA_SCENARIOS.length, 'every scenario is drawn');
});

void test('each named scenario, 10 seeds each: no violation, and the scenario really ran', (t) => {
  for (const scenario of QUOTA_SCENARIOS) {
    const steady: number[] = [];
    const takeover: number[] = [];
    for (let seed = 1000; seed < 1010; seed++) {
      const r = runQuotaSimulation({ seed, scenario });
      assert.equal(r.ok, true, describe(r));
      assert.equal(r.stats.scenario, scenario);
      assert.equal(r.stats.maxWindowAdmitted <= r.stats.bound, true, `window ${r.stats.maxWindowAdmitted} ≤ ${r.stats.bound}`);
      assert.equal(r.stats.admitted > 0, true, `seed ${seed} ${scenario} admits something`);
      if (scenario === 'partition' || scenario === 'outage') assert.equal(r.stats.reportsFailed > 0, true, `seed ${seed} ${scenario} loses reports`);
      if (scenario === 'failover' || scenario === 'outage') assert.equal(r.stats.leaderChanges >= 1, true, `seed ${seed} ${scenario} changes leader`);
      if (r.stats.steadyAdmittedRate !== null) steady.push(r.stats.steadyAdmittedRate);
      if (r.stats.takeoverMs !== null) takeover.push(r.stats.takeoverMs);
    }
    // Measured, not asserted (accuracy is a drill target, not a unit-test threshold).
    if (steady.length > 0) t.diagnostic(`${scenario}: admitted/quota from 4 s on: ${steady.map((v) => (v / 200).toFixed(3)).join(' ')}`);
    if (takeover.length > 0) t.diagnostic(`${scenario}: takeover to 90% of demand (ms, incl. the 500 ms window): ${takeover.join(' ')}`);
  }
});

void test('replay: the same seed gives the same run, another seed another run', () => {
  for (const seed of [7, 42, 1234]) {
    const a = runQuotaSimulation({ seed });
    const b = runQuotaSimulation({ seed });
    assert.deepEqual(a, b);
  }
  const x = runQuotaSimulation({ seed: 5, scenario: 'skewed' });
  const y = runQuotaSimulation({ seed: 6, scenario: 'skewed' });
  assert.notDeepEqual(x.stats, y.stats);
});

function firstFailure(bugs: QuotaPlantedBugs, checks: { allocation: boolean; undercount: boolean }, maxSeeds: number): QuotaSimResult | undefined {
  for (let seed = 1; seed <= maxSeeds; seed++) {
    const r = runQuotaSimulation({ seed, plantedBugs: bugs, checkAllocation: checks.allocation, checkUndercount: checks.undercount });
    if (!r.ok) return r;
  }
  return undefined;
}

void test('planted bug: agents that ignore lease expiry are caught by the Σ-of-agents allocation check within 40 seeds', (t) => {
  const r = firstFailure({ ignoreLeaseExpiry: true }, { allocation: true, undercount: false }, 40);
  assert.notEqual(r, undefined, 'no violation found in 40 seeds');
  t.diagnostic(`found at ${describe(r as QuotaSimResult)}`);
  assert.equal(r?.violation?.kind, 'allocation');
});

void test('planted bug: agents that ignore lease expiry are caught by the per-cell ledger cross-check within 40 seeds', (t) => {
  const r = firstFailure({ ignoreLeaseExpiry: true }, { allocation: false, undercount: true }, 40);
  assert.notEqual(r, undefined, 'no violation found in 40 seeds');
  t.diagnostic(`found at ${describe(r as QuotaSimResult)}`);
  assert.equal(r?.violation?.kind, 'undercount');
});

void test('planted bug: agents that ignore lease expiry are caught by the 1 s window bound alone within 40 seeds', (t) => {
  const r = firstFailure({ ignoreLeaseExpiry: true }, { allocation: false, undercount: false }, 40);
  assert.notEqual(r, undefined, 'no violation found in 40 seeds');
  t.diagnostic(`found at ${describe(r as QuotaSimResult)}`);
  assert.equal(r?.violation?.kind, 'bound');
  const ev = r?.violation?.evidence ?? {};
  assert.equal(typeof ev['admitted'], 'number');
  assert.equal((ev['admitted'] as number) > (ev['bound'] as number), true, 'the evidence shows the excess');
  assert.equal(Array.isArray(ev['perCell']), true, 'the evidence has per-cell counts');
});

void test('planted bug: a leader that forges acks (a grow before the shrink was applied) is caught by the Σ-of-agents check within 300 seeds', (t) => {
  const r = firstFailure({ forgeAcks: true }, { allocation: true, undercount: false }, 300);
  assert.notEqual(r, undefined, 'no violation found in 300 seeds');
  t.diagnostic(`found at ${describe(r as QuotaSimResult)}`);
  assert.equal(r?.violation?.kind, 'allocation');
});

void test('planted bug: buckets refilled on every limit change are caught by the window bound within 40 seeds', (t) => {
  const r = firstFailure({ refillOnChange: true }, { allocation: false, undercount: false }, 40);
  assert.notEqual(r, undefined, 'no violation found in 40 seeds');
  t.diagnostic(`found at ${describe(r as QuotaSimResult)}`);
  assert.equal(r?.violation?.kind, 'bound');
});
