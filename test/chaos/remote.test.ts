// `npm run chaos -- --target FILE --fault CMD --heal CMD`: the drill against a deployment reached by
// address. Here the "staging" deployment is a local one started by the test (three coordinators, three
// agents); the drill knows it only through the target file, and the fault is a shell command
// (SIGSTOP of the coordinator leader, SIGCONT to heal) as an operator would give it.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import { loadTargetFile } from '../../chaos/remote-deployment.js';

const runPath = resolve(import.meta.dirname, '../../chaos/run.ts');
const stagingPath = resolve(import.meta.dirname, 'staging-deployment.ts');

async function runChaos(args: readonly string[]): Promise<{ code: number | null; output: string }> {
  const proc = spawn(process.execPath, ['--import', 'tsx', runPath, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  proc.stdout.on('data', (b: Buffer) => (output += b.toString()));
  proc.stderr.on('data', (b: Buffer) => (output += b.toString()));
  const code = await new Promise<number | null>((ok) => proc.on('exit', (c) => ok(c)));
  return { code, output };
}

void test("a drill by address: the operator's fault command, the same verdicts", { timeout: 180_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'cq-remote-'));
  // The "staging" deployment runs in a process of its own, as a real one would.
  const staging = spawn(process.execPath, ['--import', 'tsx', stagingPath, dir], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stagingOutput = '';
  staging.stderr.on('data', (b: Buffer) => (stagingOutput += b.toString()));
  try {
    const ready = await new Promise<{ target: string; leaderPid: number | null }>((ok, fail) => {
      let buf = '';
      staging.stdout.on('data', (b: Buffer) => {
        buf += b.toString();
        const line = buf.split('\n').find((l) => l.startsWith('{'));
        if (line !== undefined) ok(JSON.parse(line) as { target: string; leaderPid: number | null });
      });
      staging.once('exit', (code) =>
        fail(new Error(`staging deployment exited ${code}: ${stagingOutput.slice(-3000)}`)),
      );
    });
    assert.equal(typeof ready.leaderPid, 'number', 'the leader runs');
    const pid = ready.leaderPid as number;
    const out = join(dir, 'out');
    const r = await runChaos([
      '--target',
      ready.target,
      '--fault',
      `kill -STOP ${pid}`,
      '--heal',
      `kill -CONT ${pid}`,
      '--fault-seconds',
      '5',
      '--recovery-seconds',
      '6',
      '--recovery-limit-seconds',
      '6',
      '--out',
      out,
    ]);
    assert.equal(r.code, 0, `exit ${r.code}:\n${r.output.slice(-5000)}`);
    const verdict = JSON.parse(readFileSync(join(out, 'external', 'verdict.json'), 'utf8')) as {
      ok: boolean;
      verdicts: { name: string; ok: boolean }[];
    };
    assert.deepEqual(
      ['bound', 'latency', 'errors', 'recovery', 'admin writes', 'fault command', 'heal command'].filter(
        (n) => !verdict.verdicts.some((v) => v.name === n),
      ),
      [],
      JSON.stringify(verdict.verdicts),
    );
    assert.match(readFileSync(join(out, 'external', 'timeline.svg'), 'utf8'), /<\/svg>\s*$/);
  } finally {
    if (staging.exitCode === null) {
      const exited = new Promise<void>((ok) => staging.once('exit', () => ok()));
      staging.kill('SIGTERM');
      const timer = setTimeout(() => staging.kill('SIGKILL'), 20_000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dir, { recursive: true, force: true });
  }
});

void test('a target file with a mistake is refused with the field named, exit 2', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'cq-remote-bad-'));
  try {
    const bad = join(dir, 'bad.yaml');
    writeFileSync(
      bad,
      'tenant: acme\ndomain: api\nquota: -1\nburst: 10\ncells: []\ncoordinators:\n  - {id: n1, admin: not-a-url}\n',
    );
    assert.throws(() => loadTargetFile(bad), /quota: .*; cells: .*; coordinators\.0\.admin: /);
    const r = await runChaos(['--target', bad, '--fault', 'true']);
    assert.equal(r.code, 2, r.output);
    assert.match(r.output, /quota/);
    const noFault = await runChaos(['--target', bad]);
    assert.equal(noFault.code, 2, noFault.output);
    assert.match(noFault.output, /--target needs --fault CMD/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
