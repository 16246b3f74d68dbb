// Recovery from a bad disk, with three real coordinator processes on loopback:
//   - a corrupt log record above the commit index: the replica truncates the tail and refuses to
//     vote until a leader has brought its commit index past what it held (protocol-aware recovery);
//   - a wiped data directory after a full-cluster restart, when no peer has applied the
//     incarnation record yet: stale "unknown" answers must not make the wiped node vote.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { rmSync } from 'node:fs';
import { RaftStorage } from '../../../coordinator/storage/index.js';
import { findLogEntry, flipFileByte } from './storage-helpers.js';
import { CoordinatorCluster } from '../../../testkit/coordinator-cluster.js';
import { waitFor } from '../../../testkit/wait.js';

const ids = ['n1', 'n2', 'n3'];
const clusterId = 'cellquota'; // the CLI's default
const quiet = { warn: () => undefined };

/**
 * Lowers a stopped replica's persisted commit index (legal: followers learn the commit index from
 * the leader and may persist it late), so entries above it are not applied at restart. Returns the
 * last stored index.
 */
async function lowerCommit(dataDir: string, id: string, commit: number): Promise<number> {
  const s = await RaftStorage.open(dataDir, { nodeId: id, clusterId, logger: quiet });
  try {
    const st = s.stats();
    const to = Math.max(commit, st.snapshotIndex);
    await s.save({ hardState: { ...st.hardState, commit: to }, entries: [], snapshot: null, mustSync: true });
    return st.lastStoredIndex;
  } finally {
    await s.close();
  }
}

async function clusterView(
  c: CoordinatorCluster,
  id: string,
): Promise<{ leader: string | null; votingRefused: boolean; commitIndex: number }> {
  const r = await c.http(id, 'GET', '/v1/cluster?stale=true');
  assert.equal(r.status, 200);
  return r.body as { leader: string | null; votingRefused: boolean; commitIndex: number };
}

void test('a corrupt log record above the commit index: the replica votes only after a leader brought it past the lost entries', async () => {
  const c = await CoordinatorCluster.create(ids);
  try {
    c.startAll();
    // Generous: three replicas starting on a loaded machine take most of the default 20 s.
    await c.waitForLeader(60_000);
    for (let i = 0; i < 5; i++)
      assert.equal((await c.write('PUT', `/v1/tiers/t${i}`, { rate: 10 + i, burst: 10 })).status, 200);
    const leader = await c.waitForLeader();
    const top = (await clusterView(c, leader)).commitIndex;
    await waitFor(
      'every replica to hold the writes',
      async () => (await Promise.all(ids.map((id) => clusterView(c, id)))).every((v) => v.commitIndex >= top),
      { timeoutMs: 20_000, everyMs: 100 },
    );
    await c.stopAll();

    // n3's disk: entries above its (lowered) commit index, one of them corrupt.
    const victim = 'n3';
    const dir = c.replica(victim).dataDir;
    const last = await lowerCommit(dir, victim, top - 3);
    assert.ok(last >= top, `n3 stored ${last}`);
    const rec = await findLogEntry(dir, top - 1);
    await flipFileByte(rec.file, rec.bodyEnd - 1);

    // n3 comes back with n2 only: two voters of three, but n3 must not vote, so there is no leader.
    c.start(victim);
    c.start('n2');
    await waitFor(
      'the repair and the refusal',
      () =>
        Promise.resolve(new RegExp(`not voting until the commit index reaches ${last}`).test(c.replica(victim).output)),
      { timeoutMs: 20_000, everyMs: 100 },
    );
    assert.equal((await clusterView(c, victim)).votingRefused, true);
    assert.equal((await c.http(victim, 'GET', '/readyz')).status, 503);
    await waitFor('n2 to answer', async () => (await clusterView(c, 'n2')).votingRefused === false, {
      timeoutMs: 20_000,
      everyMs: 100,
    });
    // Several election timeouts (at most 1 s each at the defaults) pass without a leader: n2 cannot win without n3's vote.
    for (const until = Date.now() + 4000; Date.now() < until;) {
      for (const id of [victim, 'n2'])
        assert.equal((await clusterView(c, id)).leader, null, `${id} sees no leader while n3 refuses to vote`);
      await new Promise((r) => setTimeout(r, 200));
    }

    // n1 returns: n1 and n2 elect a leader, which brings n3's commit index past the lost entries.
    c.start('n1');
    await c.waitForLeader(30_000, ['n1', 'n2']);
    await waitFor('n3 to catch up and vote', async () => !(await clusterView(c, victim)).votingRefused, {
      timeoutMs: 30_000,
      everyMs: 100,
    });
    assert.match(c.replica(victim).output, new RegExp(`caught up past the repaired log \\(commit \\d+ >= ${last}\\)`));
    assert.ok((await clusterView(c, victim)).commitIndex >= last);

    // Then it is a voter like any other: without n1, n2 and n3 elect a leader and take writes.
    await c.kill('n1');
    const next = await c.waitForLeader(30_000, ['n2', victim]);
    assert.ok(next === 'n2' || next === victim);
    assert.equal((await c.write('PUT', '/v1/tiers/after', { rate: 1, burst: 1 })).status, 200);
    const tier = await c.http(victim, 'GET', '/v1/tiers/t4');
    assert.equal(tier.status, 200, JSON.stringify(tier.body));
  } finally {
    await c.cleanup();
  }
});

void test('a wiped data directory after a full-cluster restart is found even when no peer has applied its incarnation record yet', async () => {
  const c = await CoordinatorCluster.create(ids);
  try {
    c.startAll();
    const leader = await c.waitForLeader(60_000);
    await waitFor(
      'incarnations recorded',
      async () =>
        Object.keys((await c.http(leader, 'GET', '/v1/internal/incarnations')).body['incarnations'] as object)
          .length === 3,
      { timeoutMs: 20_000, everyMs: 100 },
    );
    await c.stopAll();

    const victim = 'n3';
    // The survivors restart with nothing applied past the bootstrap entry: their stale answer for n3 is "unknown".
    for (const id of ['n1', 'n2']) await lowerCommit(c.replica(id).dataDir, id, 1);
    rmSync(c.replica(victim).dataDir, { recursive: true, force: true });
    c.startAll();

    await waitFor('the refusal', () => Promise.resolve(/must not vote/.test(c.replica(victim).output)), {
      timeoutMs: 30_000,
      everyMs: 100,
    });
    const out = c.replica(victim).output;
    assert.match(out, /"basis":"linearizable read on n[12]"/);
    assert.doesNotMatch(out, /data directory confirmed/);
    assert.equal((await clusterView(c, victim)).votingRefused, true);
    // The other two serve.
    assert.equal((await c.write('PUT', '/v1/tiers/still', { rate: 1, burst: 1 })).status, 200);
  } finally {
    await c.cleanup();
  }
});
