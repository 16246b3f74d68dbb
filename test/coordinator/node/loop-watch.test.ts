// The coordinator's event-loop watch (coordinator/node/loop-watch.ts): a stall is reported, and a
// span that contains it is said to have been blocked for about that long (so a 'slow fsync' warning
// can tell the disk from the event loop); a span with no stall counts nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { watchEventLoop } from '../../../coordinator/node/loop-watch.js';
import { waitFor } from '../../../testkit/wait.js';

function block(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until);
}

void test('a stall of the event loop is reported and counted in the spans it overlaps', async () => {
  const stalls: number[] = [];
  const watch = watchEventLoop(200, (ms) => stalls.push(ms));
  try {
    await new Promise((r) => setTimeout(r, 120));
    const from = performance.now();
    block(600);
    // Before the watch's timer has run: the stall is counted already.
    const pending = watch.blockedDuring(from, performance.now());
    assert.ok(pending >= 400, `blocked ${pending} ms just after a 600 ms stall`);
    await waitFor('the stall reported', () => stalls.length > 0 || undefined, { timeoutMs: 5_000 });
    const to = performance.now();
    assert.ok((stalls[0] ?? 0) >= 400, `reported ${stalls[0]} ms`);
    const blocked = watch.blockedDuring(from, to);
    assert.ok(blocked >= 400 && blocked <= to - from, `blocked ${blocked} of ${to - from} ms`);
    assert.equal(watch.blockedDuring(to + 1, to + 100), 0);
  } finally {
    watch.stop();
  }
});
