// `npm run sim -- --seeds N [--start S] [--seed S] [--nodes 3|5] [--bug commit-rule|skip-vote]`
// Runs the deterministic Raft simulation over many seeds and prints progress and a summary. A
// failure prints its seed and the command that replays it; the exit code is 1 if any seed failed.
// `npm run sim -- --catch-up [--seeds N] [--drop P]` runs the snapshot catch-up scenario
// (raft-sim-catchup.ts) instead and prints each seed's virtual catch-up time.
import { parseArgs } from 'node:util';
import { runSimulation, type SimResult } from './raft-sim.js';
import { runCatchUp } from './raft-sim-catchup.js';
import type { PlantedBugs } from '../../coordinator/raft/index.js';

const { values } = parseArgs({
  options: {
    seeds: { type: 'string', default: '200' },
    start: { type: 'string', default: '1' },
    seed: { type: 'string' },
    nodes: { type: 'string' },
    bug: { type: 'string' },
    verbose: { type: 'boolean', default: false },
    'catch-up': { type: 'boolean', default: false },
    drop: { type: 'string', default: '0' },
  },
});

if (values['catch-up']) {
  const drop = Number(values.drop);
  if (!(drop >= 0 && drop < 1)) {
    console.error(`--drop must be in [0, 1), got '${values.drop}'`);
    process.exit(2);
  }
  const first = Number(values.seed ?? values.start);
  const n = values.seed === undefined ? Number(values.seeds) : 1;
  let failed = 0;
  for (let seed = first; seed < first + n; seed++) {
    const r = runCatchUp({ seed, dropRate: drop });
    if (!r.caughtUp) failed++;
    console.log(
      `seed ${seed}: ${r.caughtUp ? `caught up in ${Math.round(r.catchUpMs)} ms` : 'NOT caught up'} (virtual), target index ${r.targetIndex}, ${r.compactionsDuringTransfer} compactions on the leader mid-transfer, ${r.snapshotChunkBytesSent} snapshot bytes sent`,
    );
  }
  console.log(`${n - failed} caught up, ${failed} did not`);
  process.exit(failed > 0 ? 1 : 0);
}

function intArg(name: string, v: string | undefined, fallback: number): number {
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) {
    console.error(`--${name} must be a non-negative integer, got '${v}'`);
    process.exit(2);
  }
  return n;
}

const bugs: Record<string, PlantedBugs> = {
  'commit-rule': { commitPriorTermByCount: true },
  'skip-vote': { skipVotePersist: true },
};
const plantedBugs = values.bug === undefined ? undefined : bugs[values.bug];
if (values.bug !== undefined && plantedBugs === undefined) {
  console.error(`--bug must be one of ${Object.keys(bugs).join(', ')}`);
  process.exit(2);
}
const nodeCount = values.nodes === undefined ? undefined : (intArg('nodes', values.nodes, 3) as 3 | 5);
if (nodeCount !== undefined && nodeCount !== 3 && nodeCount !== 5) {
  console.error('--nodes must be 3 or 5');
  process.exit(2);
}

const single = values.seed !== undefined;
const start = single ? intArg('seed', values.seed, 1) : intArg('start', values.start, 1);
const count = single ? 1 : intArg('seeds', values.seeds, 200);
const began = process.hrtime.bigint();
const failures: SimResult[] = [];
let events = 0;
let lastReport = began;
for (let seed = start; seed < start + count; seed++) {
  const r = runSimulation({
    seed,
    ...(nodeCount === undefined ? {} : { nodeCount }),
    ...(plantedBugs === undefined ? {} : { plantedBugs }),
  });
  events += r.stats.events;
  if (!r.ok) {
    failures.push(r);
    console.log(`seed ${seed} FAILED: ${r.violation?.message ?? 'unknown'}`);
    console.log(
      `  replay: npm run sim -- --seed ${seed}${values.nodes === undefined ? '' : ` --nodes ${values.nodes}`}${values.bug === undefined ? '' : ` --bug ${values.bug}`}`,
    );
  } else if (values.verbose || single) {
    console.log(`seed ${seed} ok ${JSON.stringify(r.stats)}`);
  }
  const now = process.hrtime.bigint();
  if (now - lastReport > 5_000_000_000n) {
    lastReport = now;
    const done = seed - start + 1;
    console.log(
      `progress: ${done}/${count} seeds, ${failures.length} failed, ${(Number(now - began) / 1e9).toFixed(1)} s`,
    );
  }
}
const secs = Number(process.hrtime.bigint() - began) / 1e9;
console.log(
  `${count - failures.length} passed, ${failures.length} failed (seeds ${start}..${start + count - 1}, ${events} events, ${secs.toFixed(1)} s)`,
);
process.exit(failures.length > 0 ? 1 : 0);
