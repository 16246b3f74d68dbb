// The deciders' clock read as a number (cell-agent/buckets/elapsed-clock.ts): the same time line
// as process.hrtime.bigint(), exact, relative to the table's start.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BigintElapsedClock, HrtimeClock, exactElapsed } from '../../../cell-agent/buckets/elapsed-clock.js';

void test('HrtimeClock reads ns since its origin on process.hrtime.bigint()’s clock, as an integer between two bigint readings', () => {
  const origin = process.hrtime.bigint();
  const clock = new HrtimeClock(origin);
  for (let i = 0; i < 10_000; i++) {
    const before = process.hrtime.bigint();
    clock.read();
    const after = process.hrtime.bigint();
    const e = clock.elapsed[0] as number;
    assert.ok(Number.isSafeInteger(e) && exactElapsed(clock), `reading ${e}`);
    assert.ok(
      BigInt(e) >= before - origin && BigInt(e) <= after - origin,
      `${before - origin} ≤ ${e} ≤ ${after - origin}`,
    );
  }
});

void test('HrtimeClock is exact for an origin that is not a whole second, and monotonic', () => {
  // An origin with every nanosecond digit set, one second and a bit before now: the borrow across
  // the seconds field must come out right.
  const now = process.hrtime.bigint();
  const origin = now - 1_999_999_999n;
  const clock = new HrtimeClock(origin);
  let last = -1;
  for (let i = 0; i < 10_000; i++) {
    clock.read();
    const e = clock.elapsed[0] as number;
    assert.ok(e >= 1_999_999_999 && e >= last, `reading ${e} after ${last}`);
    last = e;
  }
  assert.throws(() => new HrtimeClock(-1n), RangeError);
});

void test('a reading past 2^53 − 1 ns since the origin is not exact (the Decider then decides on the bigint clock)', () => {
  let now = 2n ** 53n - 1n;
  const clock = new BigintElapsedClock(() => now, 0n);
  clock.read();
  assert.equal(clock.elapsed[0], Number.MAX_SAFE_INTEGER);
  assert.ok(exactElapsed(clock));
  now += 1n;
  clock.read();
  assert.ok(!exactElapsed(clock));
  const behind = new BigintElapsedClock(() => 5n, 10n);
  behind.read();
  assert.ok(!exactElapsed(behind), 'a reading before the origin');
});
