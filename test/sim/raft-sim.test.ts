// The seeded simulation over a few hundred seeds (3 and 5 nodes), replay determinism, and the
// proof that the checkers are not blind: a planted bug must be found within a bounded number of
// seeds. `npm run sim -- --seeds N` runs more.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runSimulation, type SimResult } from './raft-sim.js';

const seedsInTest = Number(process.env['CELLQUOTA_SIM_SEEDS'] ?? 400);

function describe(r: SimResult): string {
  return `seed ${r.seed}: ${r.violation?.message ?? 'ok'} — replay with: npm run sim -- --seed ${r.seed}`;
}

void test(`simulation: ${seedsInTest} seeds with faults find no safety, liveness or linearizability violation`, () => {
  const failures: string[] = [];
  let ops = 0;
  let crashes = 0;
  let snapshots = 0;
  let leaderTerms = 0;
  for (let seed = 1; seed <= seedsInTest; seed++) {
    const r = runSimulation({ seed });
    if (!r.ok) failures.push(describe(r));
    ops += r.stats.opsCompleted;
    crashes += r.stats.crashes;
    snapshots += r.stats.snapshotsInstalled;
    leaderTerms += r.stats.leaderTerms;
  }
  assert.deepEqual(failures, []);
  // The runs must actually exercise what they claim to.
  assert.ok(ops > seedsInTest * 50, `client operations completed: ${ops}`);
  assert.ok(crashes > seedsInTest, `crashes: ${crashes}`);
  assert.ok(snapshots > 10, `snapshots installed on lagging followers: ${snapshots}`);
  assert.ok(leaderTerms > seedsInTest * 2, `leader terms: ${leaderTerms}`);
});

void test('simulation: five-node clusters with membership churn', () => {
  const failures: string[] = [];
  let changes = 0;
  for (let seed = 10_001; seed <= 10_060; seed++) {
    const r = runSimulation({ seed, nodeCount: 5, membershipChurn: true });
    if (!r.ok) failures.push(describe(r));
    changes += r.stats.membershipChanges;
  }
  assert.deepEqual(failures, []);
  assert.ok(changes > 20, `membership changes: ${changes}`);
});

void test('simulation: a seed replays the same run exactly', () => {
  for (const seed of [7, 42, 1234]) {
    const a = runSimulation({ seed });
    const b = runSimulation({ seed });
    assert.deepEqual(a.stats, b.stats);
    assert.ok(a.stats.events > 1000);
  }
});

void test('planted bug: a vote that is not persisted is caught (two leaders in one term) within 300 seeds', () => {
  let found: SimResult | undefined;
  for (let seed = 1; seed <= 300 && found === undefined; seed++) {
    const r = runSimulation({ seed, plantedBugs: { skipVotePersist: true }, checkHistory: false });
    if (!r.ok) found = r;
  }
  assert.ok(found !== undefined, 'the simulation did not notice the unpersisted vote');
  assert.equal(found.violation?.kind, 'election-safety', describe(found));
});

void test('a clean network without faults: every operation completes and the history is linearizable', () => {
  const r = runSimulation({ seed: 99, faults: 0 });
  assert.equal(r.ok, true, describe(r));
  assert.equal(r.stats.crashes, 0);
  assert.ok(r.stats.opsCompleted > 100);
});
