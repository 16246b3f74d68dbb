// A replica catching up through a snapshot while the leader goes on writing and compacts mid-transfer
// (test/sim/raft-sim-catchup.ts): the transfer must end in a bounded virtual time near what the
// snapshot's bytes take on the link, with lost messages and a follower restart in the middle too.
// The planted bug (restart the transfer on every compaction, the behaviour before) must not finish.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { runCatchUp, type CatchUpOptions } from '../sim/raft-sim-catchup.js';

const snapshotBytes = 4 << 20;
const bytesPerMs = 4000;
/** What the snapshot's bytes alone take on the link. */
const wireMs = snapshotBytes / bytesPerMs;

function check(opts: CatchUpOptions, boundMs: number): void {
  const r = runCatchUp({ snapshotBytes, bytesPerMs, ...opts });
  const what = `seed ${opts.seed}: ${JSON.stringify(r)}`;
  assert.equal(r.caughtUp, true, `not caught up: ${what}`);
  assert.ok(r.catchUpMs <= boundMs, `caught up in ${Math.round(r.catchUpMs)} ms, over ${boundMs} ms: ${what}`);
  assert.ok(r.compactionsDuringTransfer >= 3, `the leader compacted mid-transfer only ${r.compactionsDuringTransfer} times: ${what}`);
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
  const r = runCatchUp({ seed: 1, snapshotBytes, bytesPerMs, boundMs: 20 * wireMs, plantedBugs: { restartSnapshotOnCompaction: true } });
  assert.equal(r.caughtUp, false, JSON.stringify(r));
  assert.equal(r.snapshotsInstalled, 0);
  assert.ok(r.snapshotChunkBytesSent > 10 * snapshotBytes, `sent ${r.snapshotChunkBytesSent} bytes of chunks`);
});
