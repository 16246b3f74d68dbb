// The whole-system quota simulation (test/sim/quota-sim.ts) over the real LeaseService, LeaseClient,
// Decider and BucketTable: a clean run finds nothing while its faults really happen; a seed replays
// exactly; each planted bug (one per breach found so far) is caught within a bounded number of seeds,
// with evidence; and the command's contract (--list-bugs, --bug NAME exits non-zero on a catch).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { resolve } from 'node:path';
import { PLANTED_BUGS, runQuotaSimulation, type PlantedBug, type QuotaSimResult } from './quota-sim.js';

const cli = resolve(import.meta.dirname, 'quota-sim-cli.ts');

function describe(r: QuotaSimResult): string {
  return r.ok
    ? `seed ${r.seed} ok`
    : `seed ${r.seed}: ${r.violation?.kind ?? '?'}: ${r.violation?.message ?? ''}; faults: ${r.faults.join('; ')}`;
}

void test('clean: 12 seeds find no violation, and their faults really happen', async (t) => {
  const totals = {
    leaderChanges: 0,
    mainStalls: 0,
    sigstops: 0,
    restarts: 0,
    definitionChanges: 0,
    evictions: 0,
    admitted: 0,
  };
  let tightest = 0;
  for (let seed = 1; seed <= 12; seed++) {
    const r = await runQuotaSimulation({ seed });
    assert.equal(r.ok, true, describe(r));
    for (const k of Object.keys(totals) as (keyof typeof totals)[]) totals[k] += r.stats[k];
    tightest = Math.max(tightest, r.stats.maxWindowRatio);
  }
  t.diagnostic(
    `faults over 12 seeds: ${JSON.stringify(totals)}; tightest 1 s window ${(tightest * 100).toFixed(1)} % of its bound`,
  );
  for (const [k, v] of Object.entries(totals)) assert.ok(v > 0, `${k} happened in some seed`);
  assert.ok(tightest > 0.5 && tightest <= 1, 'the load presses on the bound');
});

// Seeds that once found a violation, clean since the fix (each its own story in the commit log).
// 10223: a worker took lease batch 3 after batch 4 (the simulated port let a message due just after
// a SIGSTOP overtake one the stall deferred) and decided on the replaced 41.2/s grant for a second.
const FOUND_SEEDS = [10223];

void test(`seeds that found a violation once stay clean: ${FOUND_SEEDS.join(', ')}`, async () => {
  for (const seed of FOUND_SEEDS) {
    const r = await runQuotaSimulation({ seed });
    assert.equal(r.ok, true, describe(r));
    assert.ok(r.stats.sigstops > 0, `seed ${seed} still draws its SIGSTOP`);
  }
});

void test('a seed replays exactly; another seed is another run', async () => {
  const a = await runQuotaSimulation({ seed: 42 });
  const b = await runQuotaSimulation({ seed: 42 });
  assert.deepEqual(a, b);
  const c = await runQuotaSimulation({ seed: 43 });
  assert.notDeepEqual(a.stats, c.stats);
});

// Seeds each planted bug needed when this was written (from seed 1), and the bound asserted here.
const WITHIN: Record<PlantedBug, number> = {
  'rule-path-buckets': 5, // caught at seed 1
  'uncounted-static-share': 5, // 1
  'full-start-moved-grant': 5, // 1
  'deadline-off-hot-path': 10, // 2
  'release-by-wall-clock': 40, // 13
  'forged-ack': 15, // 5
  'floor-as-of-now': 10, // 3
  'forged-release': 5, // 1
};

for (const bug of PLANTED_BUGS) {
  void test(`planted bug ${bug}: caught within ${WITHIN[bug]} seeds, with the excess in the evidence`, async (t) => {
    let caught: QuotaSimResult | undefined;
    for (let seed = 1; seed <= WITHIN[bug] && caught === undefined; seed++) {
      const r = await runQuotaSimulation({ seed, bug });
      if (!r.ok) caught = r;
    }
    assert.notEqual(caught, undefined, `${bug} not caught in ${WITHIN[bug]} seeds`);
    const v = caught?.violation;
    t.diagnostic(describe(caught as QuotaSimResult));
    assert.ok(
      v !== undefined && (v.kind === 'bound' || v.kind === 'cell-bound' || v.kind === 'cell-tokens'),
      `caught by a bound: ${v?.kind}`,
    );
    assert.ok((v.evidence['admitted'] as number) > (v.evidence['bound'] as number), 'the evidence shows the excess');
    // The same seed without the bug is clean: the catch is the bug's, not the simulation's.
    const clean = await runQuotaSimulation({ seed: caught?.seed ?? 0 });
    assert.equal(clean.ok, true, describe(clean));
  });
}

void test('the command: --list-bugs, --bug NAME exits 1 on a catch, a clean run exits 0', () => {
  const run = (args: string[]): { status: number | null; out: string } => {
    const r = spawnSync(process.execPath, ['--import', 'tsx', cli, ...args], { encoding: 'utf8', timeout: 120_000 });
    return { status: r.status, out: `${r.stdout}${r.stderr}` };
  };
  const list = run(['--list-bugs']);
  assert.equal(list.status, 0, list.out);
  assert.deepEqual(list.out.trim().split('\n'), [...PLANTED_BUGS]);
  const bug = run(['--bug', 'rule-path-buckets', '--seeds', '5']);
  assert.equal(bug.status, 1, bug.out);
  assert.match(bug.out, /caught rule-path-buckets at seed \d+/);
  assert.match(bug.out, /replay: npm run sim:quota -- --seed \d+ --bug rule-path-buckets/);
  const clean = run(['--seeds', '1']);
  assert.equal(clean.status, 0, clean.out);
  assert.match(clean.out, /1 passed, 0 failed/);
  assert.equal(run(['--bug', 'no-such-bug']).status, 2);
});
