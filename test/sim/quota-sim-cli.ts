// `npx tsx test/sim/quota-sim-cli.ts --seeds N [--start S] [--seed S] [--scenario NAME] [--duration MS]
//   [--bug ignore-lease-expiry|refill-on-change|forge-acks] [--verbose]`
// Runs the deterministic quota simulation (quota-sim.ts) over many seeds and prints progress, the
// accuracy figures and a summary. A failure prints its seed, the violation with its evidence and the
// command that replays it; the exit code is 1 if any seed failed.
import { parseArgs } from 'node:util';
import { QUOTA_SCENARIOS, runQuotaSimulation, type QuotaPlantedBugs, type QuotaScenario, type QuotaSimResult } from './quota-sim.js';

const { values } = parseArgs({
  options: {
    seeds: { type: 'string', default: '300' },
    start: { type: 'string', default: '1' },
    seed: { type: 'string' },
    scenario: { type: 'string' },
    duration: { type: 'string' },
    bug: { type: 'string' },
    verbose: { type: 'boolean', default: false },
  },
});

function intArg(name: string, v: string | undefined, fallback: number): number {
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) {
    console.error(`--${name} must be a non-negative integer, got '${v}'`);
    process.exit(2);
  }
  return n;
}

const bugs: Record<string, QuotaPlantedBugs> = {
  'ignore-lease-expiry': { ignoreLeaseExpiry: true },
  'refill-on-change': { refillOnChange: true },
  'forge-acks': { forgeAcks: true },
};
const plantedBugs = values.bug === undefined ? undefined : bugs[values.bug];
if (values.bug !== undefined && plantedBugs === undefined) {
  console.error(`--bug must be one of ${Object.keys(bugs).join(', ')}`);
  process.exit(2);
}
const scenario = values.scenario as QuotaScenario | undefined;
if (scenario !== undefined && !QUOTA_SCENARIOS.includes(scenario)) {
  console.error(`--scenario must be one of ${QUOTA_SCENARIOS.join(', ')}`);
  process.exit(2);
}
const durationMs = values.duration === undefined ? undefined : intArg('duration', values.duration, 10_000);

const single = values.seed !== undefined;
const start = single ? intArg('seed', values.seed, 1) : intArg('start', values.start, 1);
const count = single ? 1 : intArg('seeds', values.seeds, 300);
const began = process.hrtime.bigint();
const failures: QuotaSimResult[] = [];
const perScenario = new Map<string, number>();
const steady: number[] = [];
const allocated: number[] = [];
const takeover: number[] = [];
let events = 0;
let lastReport = began;
for (let seed = start; seed < start + count; seed++) {
  const r = runQuotaSimulation({
    seed,
    ...(scenario === undefined ? {} : { scenario }),
    ...(durationMs === undefined ? {} : { durationMs }),
    ...(plantedBugs === undefined ? {} : { plantedBugs }),
  });
  events += r.stats.events;
  perScenario.set(r.stats.scenario, (perScenario.get(r.stats.scenario) ?? 0) + 1);
  if (r.stats.steadyAdmittedRate !== null) steady.push(r.stats.steadyAdmittedRate);
  if (r.stats.steadyAllocatedRate !== null) allocated.push(r.stats.steadyAllocatedRate);
  if (r.stats.takeoverMs !== null) takeover.push(r.stats.takeoverMs);
  if (!r.ok) {
    failures.push(r);
    console.log(`seed ${seed} (${r.stats.scenario}) FAILED: ${r.violation?.kind ?? '?'}: ${r.violation?.message ?? 'unknown'}`);
    console.log(`  at ${r.violation?.atMs.toFixed(3) ?? '?'} ms, evidence: ${JSON.stringify(r.violation?.evidence ?? {})}`);
    const extra = `${values.duration === undefined ? '' : ` --duration ${values.duration}`}${values.bug === undefined ? '' : ` --bug ${values.bug}`}`;
    console.log(`  replay: npx tsx test/sim/quota-sim-cli.ts --seed ${seed} --scenario ${r.stats.scenario}${extra}`);
  } else if (values.verbose || single) {
    console.log(`seed ${seed} ok ${JSON.stringify(r.stats)}`);
  }
  const now = process.hrtime.bigint();
  if (now - lastReport > 5_000_000_000n) {
    lastReport = now;
    console.log(`progress: ${seed - start + 1}/${count} seeds, ${failures.length} failed, ${(Number(now - began) / 1e9).toFixed(1)} s`);
  }
}
const quantile = (xs: number[], p: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))] ?? NaN;
};
if (steady.length > 0) {
  const mean = steady.reduce((a, b) => a + b, 0) / steady.length;
  console.log(`accuracy (skewed 70/20/10 at 3x the quota, from 4 s on): admitted/quota mean ${(mean / 200).toFixed(3)}, min ${(Math.min(...steady) / 200).toFixed(3)}, max ${(Math.max(...steady) / 200).toFixed(3)} over ${steady.length} runs`);
  const alloc = allocated.reduce((a, b) => a + b, 0) / Math.max(1, allocated.length);
  console.log(`  allocated (time-average of the rates in force)/quota mean ${(alloc / 200).toFixed(3)}, min ${(Math.min(...allocated) / 200).toFixed(3)}`);
}
if (takeover.length > 0) {
  console.log(`takeover (new cell's last 500 ms admitted >= 90% of its demand): median ${quantile(takeover, 0.5)} ms, p90 ${quantile(takeover, 0.9)} ms, max ${Math.max(...takeover)} ms over ${takeover.length} runs`);
}
const secs = Number(process.hrtime.bigint() - began) / 1e9;
console.log(`scenarios: ${[...perScenario].map(([k, v]) => `${k} ${v}`).join(', ')}`);
console.log(`${count - failures.length} passed, ${failures.length} failed (seeds ${start}..${start + count - 1}, ${events} events, ${secs.toFixed(1)} s)`);
process.exit(failures.length > 0 ? 1 : 0);
