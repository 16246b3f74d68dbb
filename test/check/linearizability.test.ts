import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { checkLinearizable, kvModel } from '../../testkit/check/linearizability.js';
import type { KvInput, KvOutput, Model, Operation } from '../../testkit/check/linearizability.js';

type KvOp = Operation<KvInput, KvOutput>;

const put = (clientId: number, key: string, value: string, call: number, ret: number): KvOp => ({
  clientId,
  input: { kind: 'put', key, value },
  output: {},
  call,
  return: ret,
});
const get = (clientId: number, key: string, value: string | null, call: number, ret: number): KvOp => ({
  clientId,
  input: { kind: 'get', key },
  output: { value },
  call,
  return: ret,
});

const check = (ops: KvOp[], maxSteps?: number) =>
  checkLinearizable(kvModel, ops, maxSteps === undefined ? {} : { maxSteps });

function assertRejected(ops: KvOp[]): Extract<ReturnType<typeof check>, { ok: false }> {
  const r = check(ops);
  assert.equal(r.ok, false, `expected a violation, got ${JSON.stringify(r)}`);
  if (r.ok !== false) throw new Error('unreachable');
  return r;
}

void test('empty and sequential histories are linearizable', () => {
  assert.deepEqual(check([]), { ok: true });
  assert.deepEqual(
    check([
      get(0, 'x', null, 0, 1),
      put(0, 'x', '1', 2, 3),
      get(1, 'x', '1', 4, 5),
      put(1, 'x', '2', 6, 7),
      get(0, 'x', '2', 8, 9),
      get(0, 'y', null, 10, 11),
    ]),
    { ok: true },
  );
});

void test('a get concurrent with a put may see either value', () => {
  for (const seen of [null, '1']) {
    assert.deepEqual(check([put(0, 'x', '1', 0, 10), get(1, 'x', seen, 2, 5)]), { ok: true }, `get saw ${seen}`);
  }
  // Two concurrent gets may each see a different side of the put, in either order of their own.
  assert.deepEqual(check([put(0, 'x', '1', 0, 10), get(1, 'x', '1', 1, 9), get(2, 'x', null, 2, 8)]), { ok: true });
});

void test('a get after a completed put that still sees the old value is rejected', () => {
  const r = assertRejected([put(0, 'x', '1', 0, 1), get(1, 'x', null, 2, 3)]);
  assert.equal(r.partition, 0);
  assert.match(r.reason, /get\("x"\) -> null/);
  assert.deepEqual(
    r.longestPrefix.map((o) => o.input.kind),
    ['put'],
  );
});

void test('a stale read after a newer write completed is rejected', () => {
  assertRejected([put(0, 'x', '1', 0, 1), put(0, 'x', '2', 2, 3), get(1, 'x', '1', 4, 5)]);
  // New-then-old inversion: once a read saw the new value, a later read cannot see the old one.
  assertRejected([put(0, 'x', '1', 0, 100), get(1, 'x', '1', 10, 20), get(2, 'x', null, 30, 40)]);
  assert.deepEqual(check([put(0, 'x', '1', 0, 100), get(2, 'x', null, 10, 20), get(1, 'x', '1', 30, 40)]), {
    ok: true,
  });
});

void test('operations touching at the same instant are concurrent (calls sort before returns)', () => {
  assert.deepEqual(check([put(0, 'x', '1', 0, 5), get(1, 'x', null, 5, 6)]), { ok: true });
  assertRejected([put(0, 'x', '1', 0, 5), get(1, 'x', null, 6, 7)]);
});

void test('a read of a value that was never written is rejected', () => {
  assertRejected([get(0, 'x', 'ghost', 0, 1)]);
  assertRejected([put(0, 'x', '1', 0, 10), get(1, 'x', 'ghost', 1, 9)]);
  // ...even when that value was written to another key.
  assertRejected([put(0, 'y', '1', 0, 1), get(1, 'x', '1', 2, 3)]);
});

void test('unknown-outcome puts (return = Infinity) may take effect later, or never', () => {
  const timedOut = put(0, 'x', '1', 0, Infinity);
  // Never applied.
  assert.deepEqual(check([timedOut, get(1, 'x', null, 10, 11), get(1, 'x', null, 20, 21)]), { ok: true });
  // Applied long after the client gave up on it.
  assert.deepEqual(check([timedOut, get(1, 'x', null, 10, 11), get(1, 'x', '1', 1000, 1001)]), { ok: true });
  // Overwritten by a later put, then nothing else.
  assert.deepEqual(check([timedOut, put(1, 'x', '2', 5, 6), get(1, 'x', '1', 10, 11), get(1, 'x', '1', 12, 13)]), {
    ok: true,
  });
  // But it takes effect at most once, at one point: visible, then gone again, is a violation.
  assertRejected([timedOut, get(1, 'x', '1', 10, 11), get(1, 'x', null, 20, 21)]);
  // And not before it was called.
  assertRejected([get(1, 'x', '1', 0, 1), put(0, 'x', '1', 2, Infinity)]);
});

void test('hundreds of unknown-outcome puts on one key (coordinators down) end in a verdict', () => {
  // What a drill with every coordinator down leaves: writes that timed out, one of which a read saw.
  // Each one pending to the end made 2^k subsets for the search (it gave up after 5 million steps on
  // this history); the ones no read saw cannot change the verdict and are taken out first.
  const ops: KvOp[] = [put(0, 'x', 'v0', 0, 1)];
  for (let i = 0; i < 150; i++) {
    ops.push(put(1, 'x', `u${i}`, 2 + i * 10, Infinity));
    ops.push(get(2, 'x', i < 100 ? 'v0' : 'u99', 3 + i * 10, 8 + i * 10));
  }
  assert.deepEqual(check(ops, 100_000), { ok: true });
  // The unknown put a read saw still counts: it cannot be undone by a later read of the old value.
  const r = check([...ops, get(3, 'x', 'v0', 2000, 2001)], 100_000);
  assert.equal(r.ok, false, JSON.stringify(r).slice(0, 300));
});

void test('partitioning by key finds the one bad key among many', () => {
  const ops: KvOp[] = [];
  for (let k = 0; k < 200; k++) {
    const key = `k${k}`;
    const t = k * 3;
    ops.push(put(k % 7, key, 'a', t, t + 10), get((k + 1) % 7, key, k % 2 === 0 ? 'a' : null, t + 1, t + 5));
    ops.push(put(k % 5, key, 'b', t + 20, t + 21), get(k % 3, key, 'b', t + 22, t + 30));
  }
  assert.deepEqual(check(ops), { ok: true });
  ops.push(get(9, 'k137', 'a', 1000, 1001)); // 'b' completed long before
  const r = assertRejected(ops);
  assert.equal(r.partition, 137);
  assert.match(r.reason, /^partition 137: .*get\("k137"\) -> "a"/);
  assert.ok(r.longestPrefix.every((o) => o.input.key === 'k137'));
  assert.equal(r.longestPrefix.length, 4);
});

void test("the step budget runs out with 'unknown' on a hard history", () => {
  // 20 mutually concurrent puts of distinct values and an impossible read: 2^20 subsets to refute.
  const ops: KvOp[] = [];
  for (let i = 0; i < 20; i++) ops.push(put(i, 'x', `v${i}`, i, 100));
  ops.push(get(99, 'x', 'nope', 50, 60));
  const r = check(ops, 10_000);
  assert.equal(r.ok, 'unknown');
  // A violation in another partition still wins over 'unknown'.
  const r2 = check([...ops, put(0, 'y', '1', 0, 1), get(1, 'y', null, 2, 3)], 10_000);
  assert.equal(r2.ok, false);
});

void test('malformed operations are refused', () => {
  assert.throws(() => check([put(0, 'x', '1', 5, 5)]), RangeError);
  assert.throws(() => check([put(0, 'x', '1', Infinity, Infinity)]), RangeError);
  assert.throws(() => check([put(0, 'x', '1', 0, Number.NaN)]), RangeError);
});

void test('a model without partitioning: fetch-and-increment counter', () => {
  const counter: Model<number, 'inc', number> = {
    init: () => 0,
    step: (s, _i, out) => ({ ok: out === s + 1, state: s + 1 }),
    key: (s) => String(s),
  };
  const inc = (c: number, out: number, call: number, ret: number): Operation<'inc', number> => ({
    clientId: c,
    input: 'inc',
    output: out,
    call,
    return: ret,
  });
  assert.deepEqual(checkLinearizable(counter, [inc(0, 2, 0, 10), inc(1, 1, 1, 9), inc(2, 3, 11, 12)]), { ok: true });
  // An unknown-outcome op is never forced into the linearization, whatever output it carries.
  assert.deepEqual(checkLinearizable(counter, [inc(0, -1, 0, Infinity), inc(1, 1, 5, 6), inc(1, 2, 7, 8)]), {
    ok: true,
  });
  assert.deepEqual(checkLinearizable(counter, [inc(0, 1, 0, Infinity), inc(1, 2, 5, 6)]), { ok: true }); // applied
  assert.equal(checkLinearizable(counter, [inc(0, 1, 0, Infinity), inc(1, 3, 5, 6)]).ok, false);
  const r = checkLinearizable(counter, [inc(0, 1, 0, 10), inc(1, 1, 1, 9)]);
  assert.equal(r.ok, false);
  if (r.ok === false) assert.match(r.reason, /client 1: "inc" -> 1 \[1, 9\]/);
});

// ---------------------------------------------------------------------------------------------
// Property tests.

const KEYS = ['a', 'b', 'c'];
const VALUES = ['1', '2', '3'];
const arbCommand = fc.record({
  client: fc.nat(4),
  isPut: fc.boolean(),
  key: fc.constantFrom(...KEYS),
  value: fc.constantFrom(...VALUES),
});

/** Runs commands one after the other against a Map; each op gets its own non-overlapping interval. */
function sequentialHistory(
  cmds: { client: number; isPut: boolean; key: string; value: string }[],
  gaps: number[],
): KvOp[] {
  const store = new Map<string, string>();
  let t = 0;
  return cmds.map((c, i) => {
    const call = t + 1;
    const ret = call + 1 + (gaps[i] ?? 0);
    t = ret;
    if (c.isPut) {
      store.set(c.key, c.value);
      return put(c.client, c.key, c.value, call, ret);
    }
    return get(c.client, c.key, store.get(c.key) ?? null, call, ret);
  });
}

void test('property: sequential histories executed against a real map are linearizable', () => {
  fc.assert(
    fc.property(
      fc.array(arbCommand, { maxLength: 60, size: 'max' }),
      fc.array(fc.nat(5), { maxLength: 60, size: 'max' }),
      (cmds, gaps) => {
        assert.deepEqual(check(sequentialHistory(cmds, gaps)), { ok: true });
      },
    ),
    { numRuns: 300 },
  );
});

void test('property: a sequential history with one get answered wrongly is rejected', () => {
  fc.assert(
    fc.property(
      fc.array(arbCommand, { minLength: 1, maxLength: 60, size: 'max' }),
      fc.nat(),
      fc.nat(),
      (cmds, pick, wrongPick) => {
        const ops = sequentialHistory(cmds, []);
        const gets = ops.filter((o) => o.input.kind === 'get');
        fc.pre(gets.length > 0);
        const victim = gets[pick % gets.length] as KvOp;
        const truth = victim.output?.value ?? null;
        const wrong = [...VALUES, 'ghost', null].filter((v) => v !== truth);
        victim.output = { value: wrong[wrongPick % wrong.length] ?? null };
        const r = check(ops);
        assert.equal(r.ok, false);
        if (r.ok === false) assert.ok(r.longestPrefix.every((o) => o.input.key === victim.input.key));
      },
    ),
    { numRuns: 300 },
  );
});

const arbTimedCommand = fc.record({
  cmd: arbCommand,
  call: fc.nat(60),
  duration: fc.integer({ min: 1, max: 20 }),
  at: fc.double({ min: 0, max: 1, noNaN: true }), // linearization point within [call, return]
  unknown: fc.constantFrom<'no' | 'applied' | 'lost'>('no', 'no', 'no', 'applied', 'lost'),
});

void test('property: concurrent histories executed at points inside their intervals are linearizable', () => {
  fc.assert(
    fc.property(fc.array(arbTimedCommand, { maxLength: 40, size: 'max' }), (timed) => {
      const ops: KvOp[] = [];
      const points: { at: number; i: number; apply: () => void }[] = [];
      const store = new Map<string, string>();
      for (const [i, { cmd, call, duration, at, unknown }] of timed.entries()) {
        if (cmd.isPut) {
          const timedOut = unknown !== 'no';
          const op = put(cmd.client, cmd.key, cmd.value, call, timedOut ? Infinity : call + duration);
          ops.push(op);
          // A timed-out put that did take effect may do so any time after its call, even very late.
          const span = unknown === 'applied' ? 200 : duration;
          if (unknown !== 'lost') points.push({ at: call + at * span, i, apply: () => store.set(cmd.key, cmd.value) });
        } else {
          const op = get(cmd.client, cmd.key, null, call, call + duration);
          ops.push(op);
          points.push({
            at: call + at * duration,
            i,
            apply: () => {
              op.output = { value: store.get(cmd.key) ?? null };
            },
          });
        }
      }
      points.sort((a, b) => a.at - b.at || a.i - b.i);
      for (const p of points) p.apply();
      const r = check(ops);
      assert.deepEqual(r, { ok: true }, JSON.stringify(ops));
    }),
    { numRuns: 300 },
  );
});

/** Brute force: tries every order consistent with real time (touching intervals are concurrent). */
function bruteForce(ops: KvOp[]): boolean {
  const go = (remaining: KvOp[], store: Map<string, string>): boolean => {
    if (remaining.every((o) => o.return === Infinity)) return true;
    for (const o of remaining) {
      if (remaining.some((r) => r.return < o.call)) continue; // someone had to go first
      const rest = remaining.filter((r) => r !== o);
      if (o.input.kind === 'put') {
        if (go(rest, new Map(store).set(o.input.key, o.input.value))) return true;
      } else if ((store.get(o.input.key) ?? null) === (o.output?.value ?? null) && go(rest, store)) {
        return true;
      }
    }
    return false;
  };
  return go(ops, new Map());
}

void test('property: agrees with a brute-force search on small random histories', () => {
  const arbOp = fc
    .record({
      client: fc.nat(3),
      isPut: fc.boolean(),
      key: fc.constantFrom('a', 'b'),
      value: fc.constantFrom('1', '2', null),
      call: fc.nat(12),
      duration: fc.integer({ min: 1, max: 8 }),
      timedOut: fc.boolean(),
    })
    .map((o): KvOp =>
      o.isPut
        ? put(o.client, o.key, o.value ?? '3', o.call, o.timedOut ? Infinity : o.call + o.duration)
        : get(o.client, o.key, o.value, o.call, o.call + o.duration),
    );
  let accepted = 0;
  let rejected = 0;
  fc.assert(
    fc.property(fc.array(arbOp, { maxLength: 7, size: 'max' }), (ops) => {
      const expected = bruteForce(ops);
      const r = check(ops);
      assert.equal(r.ok, expected, JSON.stringify(ops));
      if (expected) accepted++;
      else rejected++;
    }),
    { numRuns: 1000 },
  );
  assert.ok(accepted > 100 && rejected > 100, `both outcomes exercised (${accepted} / ${rejected})`);
});
