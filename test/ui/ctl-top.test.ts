// `cellquota ctl top` as an operator runs it, against a real coordinator (one replica, with an admin
// token): it redraws each second with the leader and the bound; q on its input ends it with status
// 0, on a pipe and on a real terminal (a pty from util-linux `script`, where it must also leave the
// alternate screen); SIGINT (Ctrl-C on a pipe) ends it with status 0 too.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import { CoordinatorCluster } from '../../testkit/coordinator-cluster.js';
import { waitFor } from '../../testkit/wait.js';

const cli = resolve(import.meta.dirname, '../../cli/main.ts');
const TOKEN = 'top-test-token';
const hasScript = spawnSync('script', ['--version'], { stdio: 'ignore' }).status === 0;

interface Run {
  readonly proc: ChildProcess;
  out: string;
  readonly exited: Promise<number | null>;
}

function run(cmd: string, args: readonly string[]): Run {
  const proc = spawn(cmd, args, {
    stdio: ['pipe', 'pipe', 'pipe'],
    env: { ...process.env, CELLQUOTA_ADMIN_TOKEN: TOKEN, TERM: 'xterm' },
  });
  const r: Run = { proc, out: '', exited: new Promise((ok) => proc.once('exit', (code) => ok(code))) };
  proc.stdout?.on('data', (b: Buffer) => (r.out += b.toString()));
  proc.stderr?.on('data', (b: Buffer) => (r.out += b.toString()));
  return r;
}

async function exitsWithin(r: Run, ms: number): Promise<number | null> {
  const timer = new Promise<'timeout'>((ok) => setTimeout(() => ok('timeout'), ms).unref());
  const code = await Promise.race([r.exited, timer]);
  if (code === 'timeout') {
    r.proc.kill('SIGKILL');
    throw new Error(`ctl top did not exit within ${ms} ms; output:\n${r.out.slice(-2000)}`);
  }
  return code;
}

void test(
  'ctl top: redraws each second; q (pipe and pty) and SIGINT end it with status 0',
  { timeout: 120_000 },
  async () => {
    const c = await CoordinatorCluster.create(['n1'], ['--admin-token', TOKEN]);
    c.authToken = TOKEN;
    try {
      c.startAll();
      await c.waitForLeader(60_000);
      const top = ['--import', 'tsx', cli, 'ctl', 'top', '--admin', c.adminUrl('n1')];

      // On a pipe: frames one after another; q on stdin ends it.
      const piped = run(process.execPath, top);
      await waitFor(
        'two frames naming the leader',
        () => (piped.out.match(/leader n1 {2}term \d+/g) ?? []).length >= 2,
        { timeoutMs: 30_000 },
      );
      assert.match(piped.out, /bound +peak admitted ÷ \(rate·1s \+ burst\)/);
      assert.match(piped.out, /CELL +LAST REPORT/);
      piped.proc.stdin?.write('q');
      assert.equal(await exitsWithin(piped, 5000), 0, 'q ends it with status 0');

      // SIGINT (Ctrl-C without a terminal).
      const interrupted = run(process.execPath, top);
      await waitFor('a frame', () => interrupted.out.includes('leader n1'), { timeoutMs: 30_000 });
      interrupted.proc.kill('SIGINT');
      assert.equal(await exitsWithin(interrupted, 5000), 0, 'SIGINT ends it with status 0');

      // On a real terminal (a pty): the alternate screen, left again on q.
      if (hasScript) {
        const command = [process.execPath, ...top].map((a) => `'${a.replace(/'/g, "'\\''")}'`).join(' ');
        const onPty = run('script', ['-qfec', command, '/dev/null']);
        await waitFor('a frame on the pty', () => onPty.out.includes('leader n1'), { timeoutMs: 30_000 });
        assert.ok(onPty.out.includes('\u001b[?1049h'), 'it draws on the alternate screen');
        onPty.proc.stdin?.write('q');
        assert.equal(await exitsWithin(onPty, 5000), 0, 'q ends it with status 0 on a terminal');
        assert.ok(onPty.out.includes('\u001b[?1049l'), 'and it restores the screen');
      }
    } finally {
      await c.cleanup();
    }
  },
);
