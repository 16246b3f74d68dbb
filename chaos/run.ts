// `npm run chaos [-- --drill NAME[,NAME...]] [--out DIR] [--p99-ms N] [--keep-data] [--list]`: runs the
// drills (all by default) one after the other against a fresh local deployment each, prints progress
// and a verdict per drill, and writes <out>/<drill>/{timeline.json,timeline.svg,verdict.json,logs/}.
// Exit status 0 when every verdict holds, 1 when one fails, 2 on bad arguments.
//
// Against a deployment by address (staging): `--target FILE --fault CMD [--heal CMD]
// [--fault-seconds N] [--recovery-seconds N] [--recovery-limit-seconds N]` (chaos/remote-deployment.ts
// for the file; the fault is the operator's command, run by the shell).
import { writeFileSync, mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { runDrill, runDrillOn, type DrillResult } from './drill-runner.js';
import { externalDrill } from './drills/external.js';
import { DRILLS } from './drills/index.js';
import { RemoteDeployment, loadTargetFile, type TargetFile } from './remote-deployment.js';
import { stopRunningTargets } from './drill-target.js';

const usage = `usage: npm run chaos -- [--drill NAME[,NAME...]] [--out DIR] [--p99-ms N] [--keep-data] [--tls] [--list]
       npm run chaos -- --target FILE --fault CMD [--heal CMD] [--fault-seconds 30] [--recovery-seconds 15] [--recovery-limit-seconds 10] [--out DIR]
drills: ${DRILLS.map((d) => d.name).join(', ')}`;

let values: {
  drill?: string;
  out: string;
  'p99-ms': string;
  'keep-data': boolean;
  tls: boolean;
  list: boolean;
  help: boolean;
  target?: string;
  fault?: string;
  heal?: string;
  'fault-seconds': string;
  'recovery-seconds': string;
  'recovery-limit-seconds': string;
};
try {
  values = parseArgs({
    options: {
      drill: { type: 'string' },
      out: { type: 'string', default: 'chaos/results' },
      'p99-ms': { type: 'string', default: '1.5' },
      'keep-data': { type: 'boolean', default: false },
      // Mutual TLS between every process and the lease service on its own port (the cost of TLS).
      tls: { type: 'boolean', default: process.env['CELLQUOTA_CHAOS_TLS'] === '1' },
      list: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
      target: { type: 'string' },
      fault: { type: 'string' },
      heal: { type: 'string' },
      'fault-seconds': { type: 'string', default: '30' },
      'recovery-seconds': { type: 'string', default: '15' },
      'recovery-limit-seconds': { type: 'string', default: '10' },
    },
  }).values;
} catch (e) {
  console.error(`${e instanceof Error ? e.message : String(e)}\n${usage}`);
  process.exit(2);
}
if (values.help) {
  console.log(usage);
  process.exit(0);
}
if (values.list) {
  for (const d of DRILLS) console.log(`${d.name.padEnd(24)} ${d.title}`);
  process.exit(0);
}
let interrupted = false;
// SIGINT (Ctrl-C) or SIGTERM: the running deployment's coordinators, agents and proxies are stopped, then the runner
// exits (130 / 143); the same signal again leaves at once.
for (const [signal, code] of [
  ['SIGINT', 130],
  ['SIGTERM', 143],
] as const) {
  process.on(signal, () => {
    if (interrupted) process.exit(code);
    interrupted = true;
    console.log(`\n${signal}: stopping the deployment (its coordinators and agents); ${signal} again to leave now`);
    void stopRunningTargets().finally(() => process.exit(code));
  });
}

if (values.target !== undefined) {
  const seconds = (flag: 'fault-seconds' | 'recovery-seconds' | 'recovery-limit-seconds'): number => {
    const n = Number(values[flag]);
    if (!(n >= 0 && n <= 3600)) {
      console.error(`--${flag} must be a number of seconds in [0, 3600], got '${values[flag]}'\n${usage}`);
      process.exit(2);
    }
    return n;
  };
  if (values.fault === undefined || values.fault.trim() === '' || values.drill !== undefined) {
    console.error(
      `${values.drill !== undefined ? '--drill runs local drills; with --target give the fault as --fault CMD' : '--target needs --fault CMD (the command that injects the fault)'}\n${usage}`,
    );
    process.exit(2);
  }
  let target: TargetFile;
  try {
    target = loadTargetFile(values.target);
  } catch (e) {
    console.error(`${e instanceof Error ? e.message : String(e)}\n${usage}`);
    process.exit(2);
  }
  const p99Limit = Number(values['p99-ms']);
  const drill = externalDrill({
    fault: values.fault,
    heal: values.heal ?? null,
    faultSeconds: seconds('fault-seconds'),
    recoverySeconds: seconds('recovery-seconds'),
    recoveryLimitSeconds: seconds('recovery-limit-seconds'),
  });
  const out = resolve(values.out);
  mkdirSync(out, { recursive: true });
  console.log(`▶ ${drill.name}: ${drill.title}`);
  const r = await runDrillOn(
    drill,
    { out, p99LimitMs: p99Limit > 0 ? p99Limit : 1.5, keepData: true, progress: (m) => console.log(`  ${m}`) },
    () => Promise.resolve(new RemoteDeployment(target)),
  );
  for (const v of r.verdicts) console.log(`    ${v.ok ? 'ok  ' : 'FAIL'} ${v.name}: ${v.detail}`);
  console.log(
    `${r.ok ? '✔' : '✘'} ${drill.name} ${r.ok ? 'passed' : 'FAILED'} in ${r.seconds.toFixed(0)} s — ${join(r.dir, 'timeline.svg')}`,
  );
  process.exit(r.ok ? 0 : 1);
}

const names =
  values.drill === undefined
    ? DRILLS.map((d) => d.name)
    : values.drill
        .split(',')
        .map((s) => s.trim())
        .filter((s) => s !== '');
const unknown = names.filter((n) => !DRILLS.some((d) => d.name === n));
const p99 = Number(values['p99-ms']);
if (unknown.length > 0 || names.length === 0 || !(p99 > 0)) {
  console.error(
    `${unknown.length > 0 ? `unknown drill(s): ${unknown.join(', ')}` : names.length === 0 ? 'no drill named' : `--p99-ms must be a positive number, got '${values['p99-ms']}'`}\n${usage}`,
  );
  process.exit(2);
}

const out = resolve(values.out);
mkdirSync(out, { recursive: true });
const results: DrillResult[] = [];
const started = Date.now();
for (const name of names) {
  if (interrupted) break;
  const drill = DRILLS.find((d) => d.name === name);
  if (drill === undefined) continue;
  console.log(`▶ ${drill.name}: ${drill.title}`);
  const r = await runDrill(drill, {
    out,
    p99LimitMs: p99,
    keepData: values['keep-data'],
    tls: values.tls,
    progress: (m) => console.log(`  ${m}`),
  });
  results.push(r);
  if (r.skipped !== undefined) console.log(`– ${drill.name}: SKIPPED (${r.skipped})`);
  else {
    for (const v of r.verdicts) console.log(`    ${v.ok ? 'ok  ' : 'FAIL'} ${v.name}: ${v.detail}`);
    console.log(
      `${r.ok ? '✔' : '✘'} ${drill.name} ${r.ok ? 'passed' : 'FAILED'} in ${r.seconds.toFixed(0)} s — ${join(r.dir, 'timeline.svg')}`,
    );
  }
}
const failed = results.filter((r) => !r.ok);
writeFileSync(
  join(out, 'summary.json'),
  JSON.stringify({ finishedAt: new Date().toISOString(), seconds: (Date.now() - started) / 1000, results }, null, 2),
);
console.log(
  `\n${results.length - failed.length} of ${results.length} drills passed in ${((Date.now() - started) / 1000).toFixed(0)} s${failed.length > 0 ? `; failed: ${failed.map((r) => r.drill).join(', ')}` : ''}. Results in ${out}`,
);
process.exit(failed.length > 0 ? 1 : 0);
