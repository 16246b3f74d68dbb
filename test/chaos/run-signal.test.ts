// The chaos runner stops its deployment when it is told to stop: SIGTERM while a drill's coordinators
// and agents run, and every one of them is gone when the runner has exited (143).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { tempDir } from '../../testkit/temp-dir.js';
import { waitFor } from '../../testkit/wait.js';

const runner = resolve(import.meta.dirname, '../../chaos/run.ts');

/** The processes whose parent is `pid` (from /proc). */
function children(pid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid === pid) out.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

void test('chaos runner: SIGTERM during a drill stops its coordinators and agents, then exits 143', async () => {
  const out = tempDir('cq-chaos-signal-');
  const proc = spawn(process.execPath, ['--import', 'tsx', runner, '--drill', 'leader-kill', '--out', out.path], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  proc.stdout.on('data', (b: Buffer) => (output += b.toString()));
  proc.stderr.on('data', (b: Buffer) => (output += b.toString()));
  const exit = new Promise<number | null>((ok) => proc.once('exit', (code) => ok(code)));
  try {
    const pid = proc.pid ?? 0;
    // The deployment runs: 3 coordinators and the agents (and the load processes), children of the runner.
    const started = await waitFor('the deployment running', () => (children(pid).length >= 5 ? children(pid) : null), {
      timeoutMs: 120_000,
      everyMs: 200,
      context: () => output,
    });
    proc.kill('SIGTERM');
    assert.equal(await exit, 143, output.slice(-2000));
    await waitFor('every process of the deployment gone', () => started.every((p) => !alive(p)), {
      timeoutMs: 20_000,
      context: () => `still running: ${started.filter(alive).join(', ')}\n${output.slice(-2000)}`,
    });
    assert.match(output, /SIGTERM: stopping the deployment/);
  } finally {
    proc.kill('SIGKILL');
    out.remove();
  }
});
