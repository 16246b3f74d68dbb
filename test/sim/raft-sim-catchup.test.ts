// A replica catching up through a snapshot while the leader goes on writing and compacts mid-transfer
// (test/sim/raft-sim-catchup.ts): the transfer must end in a bounded virtual time near what the
// snapshot's bytes take on the link, with lost messages and a follower restart in the middle too.
// The planted bug (restart the transfer on every compaction, the behaviour before) must not finish.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runCatchUp, type CatchUpOptions } from './raft-sim-catchup.js';

const snapshotBytes = 4 << 20;
const bytesPerMs = 4000;
/** What the snapshot's bytes alone take on the link. */
const wireMs = snapshotBytes / bytesPerMs;

function check(opts: CatchUpOptions, boundMs: number): void {
  const r = runCatchUp({ snapshotBytes, bytesPerMs, ...opts });
  const what = `seed ${opts.seed}: ${JSON.stringify(r)}`;
  assert.equal(r.caughtUp, true, `not caught up: ${what}`);
  assert.ok(r.catchUpMs <= boundMs, `caught up in ${Math.round(r.catchUpMs)} ms, over ${boundMs} ms: ${what}`);
  assert.ok(
    r.compactionsDuringTransfer >= 3,
    `the leader compacted mid-transfer only ${r.compactionsDuringTransfer} times: ${what}`,
  );
  assert.ok(r.snapshotsInstalled >= 1, what);
}

void test('catch-up: the leader compacts while its snapshot is on the wire, the follower still catches up in about the wire time', () => {
  for (let seed = 1; seed <= 8; seed++) check({ seed }, 1.3 * wireMs + 300);
});

void test('catch-up: with 10% of messages lost, lost chunks are resent and the follower catches up', () => {
  for (let seed = 101; seed <= 108; seed++) check({ seed, dropRate: 0.1 }, 2.5 * wireMs + 1000);
});

void test('catch-up: a follower that restarts mid-transfer starts again and catches up', () => {
  for (let seed = 201; seed <= 204; seed++) check({ seed, crashMidTransferAtMs: 300 + seed }, 2.5 * wireMs + 1000);
});

void test('planted bug: restarting the transfer on every compaction never catches up (the test can fail)', () => {
  const r = runCatchUp({
    seed: 1,
    snapshotBytes,
    bytesPerMs,
    boundMs: 20 * wireMs,
    plantedBugs: { restartSnapshotOnCompaction: true },
  });
  assert.equal(r.caughtUp, false, JSON.stringify(r));
  assert.equal(r.snapshotsInstalled, 0);
  assert.ok(r.snapshotChunkBytesSent > 10 * snapshotBytes, `sent ${r.snapshotChunkBytesSent} bytes of chunks`);
});

void test('catch-up from the log with large entries: a slow follower is not flooded with resent probes and appends', () => {
  const entryBytes = 200_000;
  for (let seed = 301; seed <= 304; seed++) {
    const r = runCatchUp({
      seed,
      snapshotEvery: 0,
      entryBytes,
      writeEveryMs: 100,
      downMs: 3000,
      maxAppendBytes: 1 << 20,
      bytesPerMs,
      boundMs: 30_000,
    });
    const what = `seed ${seed}: ${JSON.stringify(r)}`;
    assert.equal(r.caughtUp, true, what);
    assert.equal(r.snapshotsInstalled, 0, what);
    // Every write's entry crosses the link about once (before: ~4×, probes resent every heartbeat).
    assert.ok(
      r.appendBytesToLagging <= 3 * r.writes * entryBytes,
      `${r.appendBytesToLagging} append bytes for ${r.writes} writes: ${what}`,
    );
    assert.ok(r.catchUpMs <= 3500, what);
  }
});
