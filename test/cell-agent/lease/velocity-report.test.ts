// Delta lease reports (issue 12): a report carries only the demand that moved beyond the dead-band,
// within a byte budget, with sweeps; a model of the leader (what the lease service does with a
// report: set what it carries, drop what a finished sweep did not restamp) must end up with every
// key's demand within the dead-band of the agent's, and every report encodes within the budget.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import {
  VelocityReporter,
  DEAD_BAND_FRACTION,
  DEAD_BAND_MIN,
  type ReportPage,
} from '../../../cell-agent/lease/velocity-report.js';
import { loadQuotaLeaseService } from '../../../shared/lease-proto.js';
import type { VelocityMessage } from '../../../shared/lease-proto.js';

const svc = loadQuotaLeaseService();

/** The leader's side, as lease-service.ts keeps it: key → [demand, sweep stamp]. */
class LeaderModel {
  readonly demand = new Map<string, [number, number]>();
  take(page: ReportPage): void {
    for (const v of page.velocity) {
      const d = v.allowedPerS + v.refusedPerS;
      if (d > 0) this.demand.set(v.key, [d, page.sweep]);
      else this.demand.delete(v.key);
    }
    if (page.sweepDone) for (const [k, [, s]] of [...this.demand]) if (s < page.sweep) this.demand.delete(k);
  }
}

function encodedBytes(page: ReportPage): number {
  return svc.report.requestSerialize({
    cellId: 'cell-a',
    incarnation: 'i',
    sentAtMs: 0,
    acks: page.acks,
    velocity: page.velocity,
    velocitySweep: page.sweep,
    velocitySweepDone: page.sweepDone,
  }).length;
}

const keyArb = fc.integer({ min: 0, max: 59 }).map((i) => `tenant/t-${i}${'x'.repeat((i % 7) * 15)}`);
const velocityArb = fc.uniqueArray(
  fc.record({
    key: keyArb,
    allowedPerS: fc.oneof(fc.constant(0), fc.double({ min: 0, max: 1000, noNaN: true })),
    refusedPerS: fc.constant(0),
  }),
  { selector: (v) => v.key, maxLength: 40 },
);

void test('delta reports: after the reports settle the leader holds every key within the dead-band, each report within its byte budget', () => {
  fc.assert(
    fc.property(
      fc.array(fc.record({ velocity: velocityArb, delivered: fc.boolean(), resync: fc.boolean() }), {
        minLength: 1,
        maxLength: 25,
      }),
      fc.integer({ min: 300, max: 3000 }),
      (steps, budget) => {
        const r = new VelocityReporter({ budgetBytes: budget, fullSweepEvery: 7 });
        const leader = new LeaderModel();
        const check = (page: ReportPage): void =>
          assert.ok(encodedBytes(page) <= budget + 64, `report of ${encodedBytes(page)} B over the ${budget} B budget`);
        for (const s of steps) {
          const page = r.page(s.velocity, new Map());
          check(page);
          if (!s.delivered) continue; // lost: nothing changes on either side
          leader.take(page);
          r.delivered(page);
          if (s.resync) r.resync();
        }
        // Settle on the last velocity: report until nothing more is pending and no sweep runs.
        const last = steps[steps.length - 1]?.velocity ?? [];
        for (let i = 0; i < 200; i++) {
          const page = r.page(last, new Map());
          check(page);
          leader.take(page);
          r.delivered(page);
          if (!page.more && !r.sweeping() && page.velocity.length === 0) break;
        }
        const want = new Map(last.filter((v) => v.allowedPerS > 0).map((v) => [v.key, v.allowedPerS]));
        for (const [k, d] of want) {
          const got = leader.demand.get(k)?.[0] ?? 0;
          assert.ok(
            Math.abs(got - d) <= Math.max(DEAD_BAND_MIN, DEAD_BAND_FRACTION * Math.max(got, d)) + 1e-9,
            `${k}: leader ${got}, agent ${d}`,
          );
        }
        for (const k of leader.demand.keys())
          assert.ok(want.has(k), `${k}: quiet on the agent, still a demand on the leader`);
      },
    ),
    { numRuns: 300 },
  );
});

void test('delta reports: a steady cell of 100,000 keys sends only what moved; every report stays under 1 MiB', () => {
  const keys = Array.from({ length: 100_000 }, (_, i) => `tenant/tenant-${i}`);
  const v = (bump: (i: number) => number): VelocityMessage[] =>
    keys.map((key, i) => ({ key, allowedPerS: 37.5 + bump(i), refusedPerS: 2.5 }));
  const r = new VelocityReporter();
  // The first sweep: every key, over several reports of at most 1 MiB.
  let pages = 0;
  let sent = 0;
  for (;;) {
    const page = r.page(
      v(() => 0),
      new Map(),
    );
    assert.ok(encodedBytes(page) <= 1024 * 1024, `sweep page of ${encodedBytes(page)} B`);
    r.delivered(page);
    pages++;
    sent += page.velocity.length;
    if (page.sweepDone) break;
    assert.ok(pages < 20);
  }
  assert.equal(sent, 100_000, 'the sweep sent every key once');
  assert.ok(pages > 1, 'a 100,000-key sweep is split');
  // Steady: nothing moves, nothing is sent; 1% move: only those.
  assert.equal(
    r.page(
      v(() => 0),
      new Map(),
    ).velocity.length,
    0,
  );
  const moved = r.page(
    v((i) => (i % 100 === 0 ? 5 : 0.01)),
    new Map(),
  );
  assert.equal(moved.velocity.length, 1000, 'the 1% that moved beyond the dead-band, not the 0.01/s noise');
});
