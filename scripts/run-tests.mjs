#!/usr/bin/env node
// Runs every test file (test/**/*.test.ts) with Node's own test runner, TypeScript loaded by tsx.
// Node 20's --test does not expand globs, so the files are listed here. Extra arguments are passed
// on (e.g. `npm run test:only -- --test-name-pattern raft`); a path argument restricts the files.
import { readdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
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

const args = process.argv.slice(2);
const pathArgs = args.filter((a) => !a.startsWith('-'));
const flagArgs = args.filter((a) => a.startsWith('-'));
const files = (pathArgs.length > 0 ? pathArgs.flatMap((p) => (statSync(p).isDirectory() ? findTests(p) : [p])) : findTests('test')).sort();
if (files.length === 0) {
  console.error('no test files found');
  process.exit(1);
}
const result = spawnSync(process.execPath, ['--import', 'tsx', '--test', '--test-reporter=spec', ...flagArgs, ...files.map((f) => resolve(f))], { stdio: 'inherit' });
process.exit(result.status ?? 1);
