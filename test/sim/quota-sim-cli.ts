// `npm run sim:quota -- [--seeds N] [--start S] [--seed S] [--duration MS] [--bug NAME] [--list-bugs] [--verbose] [--trace]`
// Runs the whole-system quota simulation (quota-sim.ts: the real LeaseService, LeaseClient, Decider
// and BucketTable) over many seeds. A violation prints its seed, its evidence, the faults drawn and
// the command that replays it; the exit code is 1 if any seed found one (with --bug NAME: the
// planted bug was caught), 2 for bad arguments. --list-bugs prints the planted bugs, one a line.
import { parseArgs } from 'node:util';
import { PLANTED_BUGS, runQuotaSimulation, type PlantedBug } from './quota-sim.js';

const { values } = parseArgs({
  options: {
    seeds: { type: 'string', default: '200' },
    start: { type: 'string', default: '1' },
    seed: { type: 'string' },
    duration: { type: 'string' },
    bug: { type: 'string' },
    'list-bugs': { type: 'boolean', default: false },
    'stop-at-first': { type: 'boolean', default: false },
    verbose: { type: 'boolean', default: false },
    trace: { type: 'boolean', default: false },
  },
});

if (values['list-bugs']) {
  for (const b of PLANTED_BUGS) console.log(b);
  process.exit(0);
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

const bug = values.bug as PlantedBug | undefined;
if (bug !== undefined && !PLANTED_BUGS.includes(bug)) {
  console.error(`--bug must be one of ${PLANTED_BUGS.join(', ')} (--list-bugs)`);
  process.exit(2);
}
const durationMs = values.duration === undefined ? undefined : intArg('duration', values.duration, 10_000);
const single = values.seed !== undefined;
const start = single ? intArg('seed', values.seed, 1) : intArg('start', values.start, 1);
const count = single ? 1 : intArg('seeds', values.seeds, 200);
// With a planted bug the point is to catch it: stop at the first seed that does.
const stopAtFirst = values['stop-at-first'] || bug !== undefined;

const began = process.hrtime.bigint();
let failed = 0;
let ran = 0;
let events = 0;
let decisions = 0;
let dropped = 0;
let maxRatio = 0;
let lastReport = began;
for (let seed = start; seed < start + count; seed++) {
  const r = await runQuotaSimulation({
    seed,
    ...(durationMs === undefined ? {} : { durationMs }),
    ...(bug === undefined ? {} : { bug }),
    ...(values.trace ? { trace: (line: string) => console.log(line) } : {}),
  });
  ran++;
  events += r.stats.events;
  decisions += r.stats.decisions;
  dropped += r.stats.releasedSlicesDropped;
  if (r.ok) maxRatio = Math.max(maxRatio, r.stats.maxWindowRatio);
  if (!r.ok) {
    failed++;
    const v = r.violation;
    console.log(`seed ${seed} FAILED: ${v?.kind ?? '?'}: ${v?.message ?? ''}`);
    console.log(`  at ${v?.atMs.toFixed(3) ?? '?'} ms; faults: ${r.faults.join('; ') || 'none'}`);
    console.log(`  evidence: ${JSON.stringify(v?.evidence ?? {})}`);
    console.log(
      `  replay: npm run sim:quota -- --seed ${seed}${values.duration === undefined ? '' : ` --duration ${values.duration}`}${bug === undefined ? '' : ` --bug ${bug}`}`,
    );
    if (stopAtFirst) break;
  } else if (values.verbose || single) {
    console.log(`seed ${seed} ok ${JSON.stringify(r.stats)}; faults: ${r.faults.join('; ') || 'none'}`);
  }
  const now = process.hrtime.bigint();
  if (now - lastReport > 10_000_000_000n) {
    lastReport = now;
    const s = Number(now - began) / 1e9;
    console.log(
      `progress: ${ran}/${count} seeds, ${failed} failed, ${s.toFixed(1)} s (${(ran / s).toFixed(1)} seeds/s)`,
    );
  }
}
const secs = Number(process.hrtime.bigint() - began) / 1e9;
console.log(
  `${ran - failed} passed, ${failed} failed (seeds ${start}..${start + ran - 1}${bug === undefined ? '' : `, planted bug ${bug}`}; ${events} events, ${decisions} decisions, ${dropped} released slices dropped; tightest window ${(maxRatio * 100).toFixed(1)} % of its bound; ${secs.toFixed(1)} s, ${(ran / secs).toFixed(2)} seeds/s)`,
);
if (bug !== undefined)
  console.log(
    failed > 0 ? `caught ${bug} at seed ${start + ran - 1} (${ran} seeds)` : `${bug} NOT caught in ${ran} seeds`,
  );
process.exit(failed > 0 ? 1 : 0);
