// The two fastest chaos drills, run exactly as an operator runs them (`npm run chaos -- --drill ...`,
// here through tsx): real coordinators and agents on loopback, the fault injected, every verdict
// computed. The run must pass, and leave its evidence: a timeline, its chart and the verdicts per
// drill, and every process's log. (All nine drills: `npm run chaos`, about 5 minutes.)
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { test } from 'node:test';
import type { Timeline } from '../../chaos/timeline.js';

const runPath = resolve(import.meta.dirname, '../../chaos/run.ts');
const DRILLS = ['leader-kill', 'agent-restart'];

void test(`chaos drills ${DRILLS.join(' and ')} pass with their evidence written`, { timeout: 240_000 }, async () => {
  const out = mkdtempSync(join(tmpdir(), 'cq-chaos-'));
  try {
    const proc = spawn(process.execPath, ['--import', 'tsx', runPath, '--drill', DRILLS.join(','), '--out', out], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    proc.stdout.on('data', (b: Buffer) => (output += b.toString()));
    proc.stderr.on('data', (b: Buffer) => (output += b.toString()));
    const code = await new Promise<number | null>((ok) => proc.on('exit', (c) => ok(c)));
    assert.equal(code, 0, `npm run chaos exited ${code}:\n${output.slice(-6000)}`);
    assert.match(output, /2 of 2 drills passed/, output.slice(-3000));
    for (const drill of DRILLS) {
      const dir = join(out, drill);
      const verdict = JSON.parse(readFileSync(join(dir, 'verdict.json'), 'utf8')) as {
        ok: boolean;
        verdicts: { name: string; ok: boolean }[];
      };
      assert.equal(verdict.ok, true, `${drill}: ${JSON.stringify(verdict.verdicts)}`);
      assert.deepEqual(
        ['bound', 'latency', 'errors', 'recovery', 'admin writes'].filter(
          (n) => !verdict.verdicts.some((v) => v.name === n),
        ),
        [],
        `${drill}: every invariant was judged`,
      );
      const timeline = JSON.parse(readFileSync(join(dir, 'timeline.json'), 'utf8')) as Timeline;
      assert.equal(timeline.samples.length > 50, true, `${drill}: ${timeline.samples.length} samples`);
      assert.equal(
        timeline.events.some((e) => e.kind === 'fault'),
        true,
        `${drill}: the fault is marked`,
      );
      assert.equal(
        timeline.samples.some((s) => s.leader !== null),
        true,
        `${drill}: the leader is known`,
      );
      const svg = readFileSync(join(dir, 'timeline.svg'), 'utf8');
      assert.match(svg, /<svg [^>]*xmlns="http:\/\/www.w3.org\/2000\/svg"/, `${drill}: an SVG chart`);
      assert.match(svg, /<\/svg>\s*$/, `${drill}: a whole SVG document`);
      for (const log of ['coordinator-n1', 'coordinator-n2', 'coordinator-n3', 'agent-cell-a'])
        assert.equal(existsSync(join(dir, 'logs', `${log}.log`)), true, `${drill}: ${log}.log kept`);
      assert.equal(existsSync(join(dir, 'data')), false, `${drill}: data directories removed (--keep-data keeps them)`);
    }
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});

void test('npm run chaos: an unknown drill name is refused with the list, exit 2', async () => {
  const proc = spawn(process.execPath, ['--import', 'tsx', runPath, '--drill', 'no-such-drill'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  proc.stdout.on('data', (b: Buffer) => (output += b.toString()));
  proc.stderr.on('data', (b: Buffer) => (output += b.toString()));
  const code = await new Promise<number | null>((ok) => proc.on('exit', (c) => ok(c)));
  assert.equal(code, 2, output);
  assert.match(output, /unknown drill\(s\): no-such-drill/);
  assert.match(
    output,
    /leader-kill, leader-pause, coordinator-partition, cell-cutoff, coordinators-down, slow-coordinator, agent-restart, rolling-restart, failing-disk/,
  );
});
