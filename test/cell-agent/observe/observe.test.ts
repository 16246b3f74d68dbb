// Observability pieces without a running agent: the lag guard's overload rule, the per-thread
// statistics summed across regions, and the aggregated throttling log (one line per key per interval).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ElapsedClock } from '../../../cell-agent/buckets/elapsed-clock.js';
import { LagGuard } from '../../../cell-agent/observe/lag-guard.js';
import { LATENCY_BUCKETS_S, StatsWriter, createStatsShared, readStats } from '../../../cell-agent/observe/stats.js';
import {
  MAX_THROTTLE_KEYS,
  MAX_THROTTLE_LINES,
  ThrottleCounts,
  ThrottleLog,
} from '../../../cell-agent/observe/throttle-log.js';
import { captureLogger } from '../../../testkit/logs.js';

void test('lag guard (backlog 0): overloaded from a late tick until the next on-time one (no hold), a stalled loop too; episodes timed', () => {
  const episodes: number[] = [];
  let started = 0;
  const g = new LagGuard(
    { thresholdMs: 10, intervalMs: 5, backlog: 0 },
    { overloadStarted: () => started++, overloadEnded: (ms) => episodes.push(ms) },
  );
  assert.equal(g.overloaded(0), false, 'not started: never overloaded');
  g.start(995);
  try {
    g.tick(1000);
    g.tick(1005.5);
    assert.equal(g.overloaded(1006), false, 'on time');
    g.tick(1100); // 89.5 ms late
    assert.equal(g.overloaded(1101), true, 'right after a block');
    assert.equal(g.overloaded(1104), true, 'until the loop turns on time again');
    g.tick(1105);
    assert.equal(g.overloaded(1106), false, 'caught up: left at once, however long the block was');
    assert.equal(started, 1);
    assert.deepEqual(episodes, [1105 - (1005.5 + 5 + 10)], 'from when it fell behind to the on-time tick');
    assert.equal(g.overloaded(1105 + 5 + 10 + 1), true, 'no timer tick for longer than interval + threshold: a stall');
    assert.equal(started, 2, 'a stall starts an episode too');
    g.tick(1125);
    g.tick(1130);
    assert.equal(g.overloaded(1131), false);
    assert.equal(episodes.length, 2);
  } finally {
    g.stop();
  }
  assert.equal(new LagGuard({ thresholdMs: 0 }).overloaded(), false, 'threshold 0 disables the guard');
});

/** An ElapsedClock at `at.ns` (ns) that counts its readings. */
function countingClock(at: { ns: number }): ElapsedClock & { reads: number } {
  const clock = {
    originNs: 0n,
    elapsed: new Float64Array(1),
    reads: 0,
    read(): void {
      clock.reads++;
      clock.elapsed[0] = at.ns;
    },
  };
  return clock;
}

void test("lag guard on an elapsed clock: its ticks read that clock, and overloadedAt(it) decides at the check's own reading without reading it again", () => {
  const at = { ns: 1_000e6 };
  const clock = countingClock(at);
  const g = new LagGuard({ thresholdMs: 10, intervalMs: 5, backlog: 0 }, null, clock);
  g.start(); // at 1,000 ms on the clock
  try {
    at.ns += 100e6;
    g.tick(); // 95 ms late
    clock.read(); // the check's reading
    const reads = clock.reads;
    assert.equal(g.overloadedAt(clock), true, 'behind, at the reading');
    assert.equal(clock.reads, reads, 'no reading of its own');
    at.ns += 5e6;
    g.tick(); // on time: caught up
    clock.read();
    assert.equal(g.overloadedAt(clock), false);
    // A check on another clock (a different time line): the guard reads its own.
    const other = countingClock({ ns: 9e15 });
    other.read();
    const before = clock.reads;
    assert.equal(g.overloadedAt(other), false, "the other clock's reading is not taken for the guard's");
    assert.equal(clock.reads, before + 1);
    // A stall seen at the check's reading (no tick for longer than interval + threshold).
    at.ns += 16e6;
    clock.read();
    assert.equal(g.overloadedAt(clock), true);
  } finally {
    g.stop();
  }
});

void test("lag guard: behind is overloaded only with a backlog — a descheduled thread decides the few checks that queued, a flood's turn sheds beyond them", () => {
  const episodes: number[] = [];
  let started = 0;
  const g = new LagGuard(
    { thresholdMs: 10, intervalMs: 5, backlog: 3 },
    { overloadStarted: () => started++, overloadEnded: (ms) => episodes.push(ms) },
  );
  g.start(995);
  try {
    g.tick(1000);
    g.tick(1040); // 35 ms late: the process was descheduled (a busy machine), three checks queued
    assert.deepEqual(
      [g.overloaded(1040.1), g.overloaded(1040.2), g.overloaded(1040.3)],
      [false, false, false],
      'decided',
    );
    g.tick(1045);
    assert.equal(started, 0, 'no episode: nothing was waved through');
    assert.deepEqual(
      [g.overloaded(1046), g.overloaded(1046), g.overloaded(1047), g.overloaded(1047)],
      [false, false, false, false],
      'on time: decided whatever the count',
    );
    g.tick(1050);
    g.tick(1100); // late again, and this turn brings a flood
    const turn = Array.from({ length: 6 }, (_, i) => g.overloaded(1100 + i * 0.1));
    assert.deepEqual(turn, [false, false, false, true, true, true], 'beyond the backlog: the overload path');
    assert.equal(started, 1);
    g.tick(1105);
    assert.deepEqual(episodes, [1105 - (1050 + 5 + 10)], 'from when it fell behind to the on-time tick');
    // One long turn (no tick for 30 ms) with more checks than the backlog: a stall, overloaded too.
    const stall = Array.from({ length: 5 }, (_, i) => g.overloaded(1106 + i * 8));
    assert.deepEqual(stall, [false, false, false, true, true]);
    assert.equal(started, 2);
  } finally {
    g.stop();
  }
  assert.throws(() => new LagGuard({ backlog: -1 }), RangeError);
});

void test('stats: one region per thread, summed at read time', () => {
  const shared = createStatsShared(3);
  const a = new StatsWriter(shared, 0);
  const b = new StatsWriter(shared, 2);
  a.decision('ok', 'local', 0.000_02);
  a.decision('over_limit', 'global', 0.3);
  b.decision('ok', 'local', 0.002);
  b.decision('degraded', 'local', 0);
  b.failOpen('overload');
  a.rejected('malformed');
  b.rejected('invalid');
  b.staticSlice();
  const t = readStats(shared);
  assert.deepEqual(t.decisions, {
    ok: { local: 2, global: 0 },
    over_limit: { local: 0, global: 1 },
    degraded: { local: 1, global: 0 },
  });
  assert.equal(t.latencyCount, 4);
  assert.equal(t.latencyBuckets.length, LATENCY_BUCKETS_S.length + 1);
  assert.equal(t.latencyBuckets[0], 1, '0 s');
  assert.equal(t.latencyBuckets[1], 1, '20 µs');
  assert.equal(t.latencyBuckets[LATENCY_BUCKETS_S.length], 1, '0.3 s overflows');
  assert.deepEqual(t.failOpen, { overload: 1, error: 0, table_full: 0 });
  assert.deepEqual(t.rejected, { invalid: 1, malformed: 1 });
  assert.equal(t.staticSlice, 1);
  a.overloadStarted();
  assert.equal(readStats(shared).overloadedNow, 1);
  a.overloadEnded(250);
  b.overloadRefused('shed');
  const o = readStats(shared);
  assert.deepEqual(
    [o.overloadedNow, o.overloadMs, o.overloadEpisodes, o.overloadRefused.shed, o.overloadRefused.allowance],
    [0, 250, 1, 1, 0],
  );
  assert.throws(() => new StatsWriter(shared, 3), /out of range/);
});

void test('throttling log: one line per key per interval, merged across threads, bounded', () => {
  const cap = captureLogger();
  const log = new ThrottleLog(cap.logger, 'eu-west', 1000);
  const worker = new ThrottleCounts();
  const main = new ThrottleCounts();
  for (let i = 0; i < 500; i++) worker.add('api|tenant=acme', 1);
  for (let i = 0; i < 20; i++) main.add('api|tenant=acme', 2);
  main.add('api|tenant=globex', 1);
  log.merge(worker.drain());
  log.merge(main.drain());
  log.flush();
  const lines = cap.lines.filter((l) => l['msg'] === 'throttled');
  assert.deepEqual(
    lines.map((l) => [l['key'], l['refused'], l['cell']]),
    [
      ['api|tenant=acme', 540, 'eu-west'],
      ['api|tenant=globex', 1, 'eu-west'],
    ],
  );
  log.flush();
  assert.equal(cap.lines.length, 2, 'nothing new: nothing logged');
  const many = new ThrottleCounts();
  for (let i = 0; i < MAX_THROTTLE_LINES + 50; i++) many.add(`k${i}`, 1);
  log.merge(many.drain());
  log.flush();
  assert.equal(cap.lines.length, 2 + MAX_THROTTLE_LINES + 1, 'the rest in one summary line');
  assert.deepEqual(cap.lines.at(-1)?.['keys'], 50);
});

void test('throttling log: a line per key and provenance (the level, what a global level decided on); keys bounded per thread', () => {
  const cap = captureLogger();
  const log = new ThrottleLog(cap.logger, 'eu-west', 1000);
  const worker = new ThrottleCounts();
  const local = { level: 'local-rule', limit: 'per-ip', decidedOn: null, epoch: null, cell: 'eu-west' } as const;
  const lease = { level: 'tenant-quota', limit: 'tenant/acme', decidedOn: 'lease', epoch: 7, cell: 'eu-west' } as const;
  const floor = { ...lease, decidedOn: 'floor' } as const;
  for (let i = 0; i < 3; i++) worker.add('api|ip=1.2.3.4', 1, local);
  worker.add('tenant/acme', 5, lease);
  worker.add('tenant/acme', 2, floor);
  log.merge(worker.drain());
  const other = new ThrottleCounts();
  other.add('tenant/acme', 1, lease);
  log.merge(other.drain());
  log.flush();
  assert.deepEqual(
    cap.lines
      .filter((l) => l['msg'] === 'throttled')
      .map((l) => [l['key'], l['refused'], l['refusedBy'], l['decidedOn']]),
    [
      ['tenant/acme', 6, 'tenant-quota', 'lease epoch=7'],
      ['api|ip=1.2.3.4', 3, 'local-rule', undefined],
      ['tenant/acme', 2, 'tenant-quota', 'floor epoch=7'],
    ],
  );
  const many = new ThrottleCounts();
  for (let i = 0; i < MAX_THROTTLE_KEYS; i++) many.add(`k${i}`, 1, i % 2 === 0 ? local : lease);
  many.add('k0', 1, local);
  many.add('one-too-many', 4, local);
  many.add('one-too-many', 1, floor);
  const drained = many.drain();
  assert.equal(drained.counts.length, MAX_THROTTLE_KEYS, 'every key and provenance within the bound');
  assert.equal(drained.other, 5, 'past it: counted as other keys');
  assert.equal(many.empty, true, 'drained');
});

void test('throttling log: fail-open answers per reason and quota, overload refusals per key, and the time overloaded', () => {
  const cap = captureLogger();
  let totals = { overloadMs: 0, overloadEpisodes: 0, overloadRefused: 0, failOpenOverload: 0 };
  const log = new ThrottleLog(cap.logger, 'eu-west', 1000, () => totals);
  const worker = new ThrottleCounts();
  for (let i = 0; i < 7; i++) worker.addFailOpen('overload', 'tenant/acme');
  worker.addFailOpen('error', '(not matched)');
  worker.addOverload('tenant/acme', 1);
  worker.addOverload('tenant/acme', 2);
  log.merge(worker.drain());
  totals = { overloadMs: 1234, overloadEpisodes: 3, overloadRefused: 3, failOpenOverload: 7 };
  log.flush();
  const by = (msg: string): Record<string, unknown>[] => cap.lines.filter((l) => l['msg'] === msg);
  assert.deepEqual(
    by('answered fail-open').map((l) => [l['reason'], l['key'], l['failOpen']]),
    [
      ['overload', 'tenant/acme', 7],
      ['error', '(not matched)', 1],
    ],
  );
  assert.deepEqual(
    by('throttled').map((l) => [l['key'], l['refused'], l['refusedBy']]),
    [['tenant/acme', 3, 'overload']],
  );
  assert.deepEqual(
    by('overloaded').map((l) => [l['overloadedMs'], l['episodes'], l['refused'], l['failOpen']]),
    [[1234, 3, 3, 7]],
  );
  log.flush();
  assert.equal(by('overloaded').length, 1, 'nothing new: no line');
  assert.deepEqual(
    log.failOpenByQuota(),
    [
      { reason: 'overload', quota: 'tenant/acme', count: 7 },
      { reason: 'error', quota: '(not matched)', count: 1 },
    ],
    'running totals for the metric',
  );
});
