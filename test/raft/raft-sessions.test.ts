import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { ClientSessions } from '../../coordinator/raft/index.js';

void test('a retried request is recognised as a duplicate and answered with the first result', () => {
  const s = new ClientSessions<string>(10);
  assert.deepEqual(s.check('c1', 1), { kind: 'new' });
  s.record('c1', 1, 'created');
  assert.deepEqual(s.check('c1', 1), { kind: 'duplicate', result: 'created' });
  assert.deepEqual(s.check('c1', 2), { kind: 'new' });
  s.record('c1', 2, 'updated');
  assert.deepEqual(s.check('c1', 1), { kind: 'stale', lastSeq: 2 });
});

void test('the table is bounded and evicts the least recently applied client', () => {
  const s = new ClientSessions<number>(3);
  for (const [i, c] of ['a', 'b', 'c'].entries()) s.record(c, 1, i);
  s.record('a', 2, 9); // a is now the most recent
  s.record('d', 1, 4);
  assert.equal(s.size(), 3);
  assert.deepEqual(s.check('b', 1), { kind: 'new' }, 'b was evicted');
  assert.deepEqual(s.check('a', 2), { kind: 'duplicate', result: 9 });
});

void test('property: applying any sequence of requests with retries applies each (client, seq) exactly once, and snapshots preserve it', () => {
  fc.assert(
    fc.property(
      fc.array(fc.tuple(fc.integer({ min: 0, max: 4 }), fc.boolean()), { maxLength: 200 }),
      fc.integer({ min: 0, max: 200 }),
      (reqs, snapAt) => {
        let table = new ClientSessions<number>(100);
        const nextSeq = new Map<number, number>();
        let applied = 0;
        const seen = new Set<string>();
        for (const [i, [client, retry]] of reqs.entries()) {
          if (i === snapAt) table = ClientSessions.fromEntries(100, table.entries());
          const last = nextSeq.get(client) ?? 0;
          const seq = retry && last > 0 ? last : last + 1;
          nextSeq.set(client, seq);
          const c = table.check(`c${client}`, seq);
          if (c.kind === 'new') {
            applied++;
            table.record(`c${client}`, seq, applied);
            assert.ok(!seen.has(`${client}:${seq}`));
            seen.add(`${client}:${seq}`);
          } else {
            assert.equal(c.kind, 'duplicate');
          }
        }
        assert.equal(applied, seen.size);
      },
    ),
  );
});
