// The admin server's SerialQueue: tasks run one at a time in the order given, and a failed task neither blocks nor
// fails the ones after it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { SerialQueue } from '../../../coordinator/api/serial-queue.js';

void test('tasks run one at a time, in order; a rejection stays with its caller', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.array(fc.record({ ticks: fc.nat(3), fails: fc.boolean() }), { maxLength: 12 }),
      async (tasks) => {
        const q = new SerialQueue();
        const started: number[] = [];
        let running = 0;
        const results = tasks.map((t, i) =>
          q.run(async () => {
            running++;
            assert.equal(running, 1, 'one task at a time');
            started.push(i);
            for (let k = 0; k < t.ticks; k++) await Promise.resolve();
            running--;
            if (t.fails) throw new Error(`task ${i}`);
            return i;
          }),
        );
        const settled = await Promise.allSettled(results);
        assert.deepEqual(
          started,
          tasks.map((_, i) => i),
        );
        settled.forEach((s, i) => {
          if (tasks[i]?.fails) assert.equal(s.status === 'rejected' && (s.reason as Error).message, `task ${i}`);
          else assert.deepEqual(s, { status: 'fulfilled', value: i });
        });
      },
    ),
  );
});
