import { test } from 'node:test';
import assert from 'node:assert/strict';
import v8 from 'node:v8';
import { pino } from 'pino';
import { releaseStartupMemory } from '../../shared/release-memory.js';

const MiB = 1024 * 1024;
const newSpace = (): number =>
  v8.getHeapSpaceStatistics().find((s) => s.space_name === 'new_space')!.physical_space_size;

/** What start-up does to a heap: many short-lived objects that survive a scavenge or two. */
function growYoungGeneration(): void {
  let kept: { i: number; s: string }[] = [];
  for (let i = 0; i < 400_000; i++) {
    kept.push({ i, s: `x${i}` });
    if (kept.length > 100_000) kept = kept.slice(50_000);
  }
}

void test('the young generation that start-up grew is given back, and the thread goes on', async () => {
  growYoungGeneration();
  const grown = newSpace();
  assert.ok(grown >= 4 * MiB, `the young generation grew to ${(grown / MiB).toFixed(1)} MiB`);
  const lines: string[] = [];
  const logger = pino({ level: 'debug' }, { write: (line: string) => void lines.push(line) });
  const released = await releaseStartupMemory(logger);
  assert.ok(released !== null, 'this Node has an inspector');
  assert.ok(
    newSpace() <= grown / 4,
    `young generation ${(grown / MiB).toFixed(1)} -> ${(newSpace() / MiB).toFixed(1)} MiB`,
  );
  assert.ok(released.heapAfter < released.heapBefore);
  assert.deepEqual(
    lines.map((l) => (JSON.parse(l) as { msg: string }).msg),
    ['start-up memory released'],
  );
  // The session is gone: a second release works the same, and the event loop still turns.
  assert.ok((await releaseStartupMemory(logger)) !== null);
  await new Promise((r) => setTimeout(r, 1));
});
