// `npm run bench [-- NAME ...] [--smoke]`: runs the named benchmarks (all by default), prints
// progress and a table per benchmark, and writes bench/results/bench-<time>.{json,md}.
import { parseArgs } from 'node:util';
import { runRaftCoreBench } from './raft-core.js';
import { runAgentMemoryBench } from './agent-memory.js';
import { runCoordinatorBench } from './coordinator.js';
import { runAllocatorBench } from './allocator.js';
import { runAccuracyBench } from './accuracy.js';
import { runAgentBench } from './agent-rls.js';
import { runCoordinatorMemoryBench } from './coordinator-memory.js';
import { runDecisionBench } from './decision.js';
import { toMarkdown, writeResults, type BenchReport } from './bench-report.js';

type BenchFn = (opts: { smoke: boolean; progress: (msg: string) => void }) => BenchReport | Promise<BenchReport>;

const benches: Record<string, BenchFn> = {
  'raft-core': runRaftCoreBench,
  'agent-memory': runAgentMemoryBench,
  coordinator: runCoordinatorBench,
  allocator: runAllocatorBench,
  accuracy: runAccuracyBench,
  agent: runAgentBench,
  'agent-idle-rss': async (o) => (await import('./agent-idle-rss.js')).runAgentIdleRssBench(o),
  cascade: async (o) => (await import('./cascade.js')).runCascadeBench(o),
  'coordinator-memory': runCoordinatorMemoryBench,
  'coordinator-million': async (o) => (await import('./coordinator-memory.js')).runCoordinatorMillionBench(o),
  'coordinator-source': async (o) => (await import('./coordinator-source.js')).runCoordinatorSourceBench(o),
  'agent-tenants': async (o) => (await import('./coordinator-source-real.js')).runAgentTenantsBench(o),
  'coordinator-bound': async (o) => (await import('./coordinator-source-real.js')).runCoordinatorBoundBench(o),
  frontdoor: async (o) => (await import('./frontdoor/frontdoor.js')).runFrontDoorBench(o),
  embedded: async (o) => (await import('./embedded/embedded.js')).runEmbeddedBench(o),
  decision: runDecisionBench,
  overload: async (o) => (await import('./overload.js')).runOverloadBench(o),
  'tenant-import': async (o) => (await import('./tenant-import.js')).runTenantImportBench(o),
};

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { smoke: { type: 'boolean', default: false }, out: { type: 'string', default: 'bench/results' } },
});
const names = positionals.length > 0 ? positionals : Object.keys(benches);
for (const n of names) {
  if (!(n in benches)) {
    console.error(`unknown benchmark '${n}'; known: ${Object.keys(benches).join(', ')}`);
    process.exit(2);
  }
}
const reports: BenchReport[] = [];
for (const n of names) {
  const fn = benches[n];
  if (fn === undefined) continue;
  const started = Date.now();
  console.log(`▶ ${n}${values.smoke ? ' (smoke)' : ''}`);
  reports.push(await fn({ smoke: values.smoke, progress: (msg) => console.log(`  … ${msg}`) }));
  console.log(`✔ ${n} in ${((Date.now() - started) / 1000).toFixed(1)} s`);
}
const command = `npm run bench -- ${process.argv.slice(2).join(' ')}`.trim();
console.log(toMarkdown(reports, command));
const files = writeResults(values.out, reports, command);
console.log(`results: ${files.json}, ${files.md}`);
