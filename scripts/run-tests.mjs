#!/usr/bin/env node
// Runs every test file (test/**/*.test.ts) with Node's own test runner, TypeScript loaded by tsx.
// Node 20's --test does not expand globs, so the files are listed here. Extra arguments are passed
// on (e.g. `npm run test:only -- --test-name-pattern raft`); a path argument restricts the files.
// `--fast` leaves out the folders whose tests run many processes for long (see SLOW_FOLDERS): what CI
// runs a second time on the current Node LTS (`npm run test:fast`). The fast files run two at a time, then the
// slow ones one at a time (below).
import { readdirSync, statSync } from 'node:fs';
import { join, resolve, sep } from 'node:path';
import { spawnSync } from 'node:child_process';

function findTests(dir) {
  const out = [];
  for (const name of readdirSync(dir)) {
    const full = join(dir, name);
    if (statSync(full).isDirectory()) out.push(...findTests(full));
    else if (name.endsWith('.test.ts')) out.push(full);
  }
  return out;
}

/** Left out by --fast: the benchmarks' smoke tests, the chaos drills, the end-to-end accuracy runs,
 * the front doors (real nginx, Caddy), the browser tests, the embedded limiter's replicas, and the
 * tests on a real three-coordinator cluster. */
const SLOW_FOLDERS = [
  'test/bench',
  'test/chaos',
  'test/e2e',
  'test/front-door',
  'test/ui',
  'test/embedded',
  'test/coordinator/cluster',
  'test/coordinator/lease',
  'test/cli',
];

const args = process.argv.slice(2);
const fast = args.includes('--fast');
const pathArgs = args.filter((a) => !a.startsWith('-'));
const flagArgs = args.filter((a) => a.startsWith('-') && a !== '--fast');
const isSlow = (file) => SLOW_FOLDERS.some((dir) => file === dir || file.startsWith(`${dir}/`));
const files = (
  pathArgs.length > 0 ? pathArgs.flatMap((p) => (statSync(p).isDirectory() ? findTests(p) : [p])) : findTests('test')
)
  .filter((f) => !fast || !isSlow(f.split(sep).join('/')))
  .sort();
if (files.length === 0) {
  console.error('no test files found');
  process.exit(1);
}

function runFiles(list, extraFlags) {
  if (list.length === 0) return 0;
  const result = spawnSync(
    process.execPath,
    ['--import', 'tsx', '--test', '--test-reporter=spec', ...extraFlags, ...flagArgs, ...list.map((f) => resolve(f))],
    { stdio: 'inherit' },
  );
  return result.status ?? 1;
}

// The fast files (unit, property and simulation tests, a few short-lived processes each) run two at a time, which
// took the fast part from 3m03s to 2m10s on a 2-CPU machine; the slow ones one at a time (Node's default on 2 CPUs),
// as their processes, loads and timing verdicts assume the machine to themselves. An explicit --test-concurrency
// applies to every file.
const ownConcurrency = flagArgs.some((a) => a.startsWith('--test-concurrency'));
const isSlowFile = (f) => isSlow(f.split(sep).join('/'));
const fastFiles = ownConcurrency ? files : files.filter((f) => !isSlowFile(f));
const slowFiles = ownConcurrency ? [] : files.filter(isSlowFile);
const fastStatus = runFiles(fastFiles, ownConcurrency ? [] : ['--test-concurrency=2']);
const slowStatus = runFiles(slowFiles, []);
process.exit(fastStatus !== 0 ? fastStatus : slowStatus);
