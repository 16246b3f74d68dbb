// Crash test: a child process saves batches in a loop and is killed with SIGKILL at a random
// moment. Reopened, the storage must hold exactly the state after the last batch the child
// reported as saved, or after the one batch it may have had in flight: nothing reported is lost,
// and no batch is half there.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { assertSameState, layouts, withTempDir } from './storage-helpers.js';
import { applyOp, crashBootstrap, newWorkloadModel, nextOp } from './crash-workload.js';

const repoRoot = fileURLToPath(new URL('../../../', import.meta.url));
const childScript = fileURLToPath(new URL('./crash-child.ts', import.meta.url));

/** Runs the child until a random moment after it has started saving, kills it, returns the last k it reported. */
async function runAndKill(dir: string, layout: string, killAfterMs: number): Promise<number> {
  const child = spawn(process.execPath, ['--import', 'tsx', childScript, dir, layout], {
    cwd: repoRoot,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (err += d));
  const exited = new Promise<NodeJS.Signals | number | null>((resolve) =>
    child.on('exit', (code, signal) => resolve(signal ?? code)),
  );
  // Wait until it has reported its first batch (startup is slow and uninteresting), then a random delay.
  const started = Date.now();
  while (!out.includes('done 1\n')) {
    if (child.exitCode !== null) throw new Error(`child exited early (${child.exitCode}): ${err}`);
    if (Date.now() - started > 15_000) throw new Error(`child did not start: ${err}`);
    await sleep(5);
  }
  await sleep(killAfterMs);
  child.kill('SIGKILL');
  assert.equal(await exited, 'SIGKILL', `child ended on its own: ${err}`);
  // Only complete lines count: a line cut off by the kill was not reported.
  const lines = out.split('\n').slice(0, -1);
  const last = lines.at(-1);
  assert.match(last ?? '', /^done \d+$/);
  return Number(last?.slice(5));
}

for (const layout of layouts)
  void test(`${layout.name}: a child killed with SIGKILL mid-loop loses no batch it reported, and leaves no half batch`, async (t) => {
    const runs = 2;
    for (let run = 0; run < runs; run++) {
      await withTempDir(async (dir) => {
        const killAfterMs = 20 + Math.floor(Math.random() * 400);
        const reported = await runAndKill(dir, layout.name, killAfterMs);
        const model = newWorkloadModel();
        for (let k = 1; k <= reported; k++) applyOp(model, nextOp(model, k));
        const afterReported = model.clone();
        applyOp(model, nextOp(model, reported + 1));
        const afterInFlight = model;

        const s = await layout.open(dir, {
          nodeId: 'n1',
          clusterId: 'crash',
          bootstrap: crashBootstrap,
          logger: { warn: () => undefined },
        });
        try {
          const st = await s.load();
          assert.equal(st.meta.fresh, false);
          assert.deepEqual(st.meta.repairs, []);
          let matched = 'the last reported batch';
          try {
            assertSameState(st, afterReported.load(), `run ${run}: after ${reported} reported batches`);
          } catch {
            assertSameState(
              st,
              afterInFlight.load(),
              `run ${run}: after ${reported} reported batches plus the one in flight`,
            );
            matched = 'the batch in flight';
          }
          t.diagnostic(
            `run ${run}: killed after ${killAfterMs} ms, ${reported} batches reported, disk matches ${matched} (last index ${st.entries.at(-1)?.index ?? st.snapshot.meta.index})`,
          );
          assert.ok(reported > 1, `run ${run}: child reported ${reported} batches`);
        } finally {
          await s.close();
        }
      });
    }
  });
