// Three Raft nodes, each driven by the real driver over real LevelDB storage in temp dirs, with
// messages passed between them through the event loop. Checks the edge: persistence before
// send, group commit, proposals resolved with the state machine's result, linearizable reads,
// a stopped leader replaced, and a node restarted from its disk catching up.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RaftNode, type Message, type NodeId } from '../../../coordinator/raft/index.js';
import { LevelRaftStorage } from '../../../coordinator/storage/index.js';
import { RaftDriver, NotLeaderError, type ReplicatedStateMachine } from '../../../coordinator/node/raft-driver.js';
import { waitFor } from '../../../testkit/wait.js';

const enc = new TextEncoder();
const dec = new TextDecoder();

class KvMachine implements ReplicatedStateMachine<string | null> {
  kv = new Map<string, string>();
  apply(data: Uint8Array): string | null {
    const { k, v } = JSON.parse(dec.decode(data)) as { k: string; v: string };
    const prev = this.kv.get(k) ?? null;
    this.kv.set(k, v);
    return prev;
  }
  snapshot(): Uint8Array {
    return enc.encode(JSON.stringify([...this.kv]));
  }
  /** The same bytes as snapshot(), from a copy taken now, ten entries a step (the driver's stepped path). */
  snapshotSteps(): Generator<void, Uint8Array, void> {
    const copy = [...this.kv];
    return (function* () {
      const parts: string[] = [];
      for (const [i, e] of copy.entries()) {
        parts.push(JSON.stringify(e));
        if (i % 10 === 9) yield;
      }
      return enc.encode(`[${parts.join(',')}]`);
    })();
  }
  restore(data: Uint8Array): void {
    this.kv =
      data.byteLength === 0
        ? new Map<string, string>()
        : new Map<string, string>(JSON.parse(dec.decode(data)) as [string, string][]);
  }
}

interface Member {
  id: NodeId;
  dir: string;
  storage: LevelRaftStorage | null;
  driver: RaftDriver<string | null> | null;
  machine: KvMachine;
}

const ids = ['n1', 'n2', 'n3'];

async function startMember(m: Member, members: Map<NodeId, Member>): Promise<void> {
  const storage = await LevelRaftStorage.open(m.dir, {
    nodeId: m.id,
    clusterId: 'test',
    bootstrap: { conf: { voters: ids, learners: [] }, data: new Uint8Array(0) },
    logger: { warn: () => undefined },
  });
  const loaded = await storage.load();
  m.machine.restore(loaded.snapshot.data);
  let seed = ids.indexOf(m.id) + 1;
  const raft = new RaftNode(
    {
      id: m.id,
      electionTicks: 10,
      heartbeatTicks: 1,
      randomInt: (n) => {
        seed = (seed * 1103515245 + 12345) >>> 0;
        return seed % n;
      },
      preVote: true,
      checkQuorum: true,
      maxAppendBytes: 1 << 20,
      maxInflightAppends: 16,
      maxUncommittedBytes: 1 << 26,
      snapshotChunkBytes: 4096,
    },
    loaded,
  );
  const driver = new RaftDriver<string | null>({
    raft,
    storage,
    outbox: {
      send: (msgs: readonly Message[]) => {
        for (const msg of msgs) {
          setImmediate(() => members.get(msg.to)?.driver?.receive([msg]));
        }
      },
    },
    stateMachine: m.machine,
    appliedIndex: loaded.snapshot.meta.index,
    tickMs: 10,
    snapshotEveryEntries: 50,
    snapshotTrailingEntries: 5,
    requestTimeoutMs: 3000,
  });
  m.storage = storage;
  m.driver = driver;
  driver.start();
}

async function stopMember(m: Member): Promise<void> {
  const d = m.driver;
  m.driver = null;
  await d?.stop();
  await m.storage?.close();
  m.storage = null;
}

function leaderOf(members: Map<NodeId, Member>): Member | undefined {
  return [...members.values()].find((m) => m.driver?.status().role === 'leader');
}

void test('driver: three nodes on LevelDB elect, replicate, read linearizably, survive a leader stop and a restart', async () => {
  const root = mkdtempSync(join(tmpdir(), 'cellquota-driver-'));
  const members = new Map<NodeId, Member>(
    ids.map((id) => [id, { id, dir: join(root, id), storage: null, driver: null, machine: new KvMachine() }]),
  );
  try {
    for (const m of members.values()) await startMember(m, members);
    const leader = await waitFor('a leader', () => leaderOf(members), { everyMs: 10 });
    await waitFor(
      'every node to know the leader',
      () => ([...members.values()].every((m) => m.driver?.status().leader === leader.id) ? true : undefined),
      { everyMs: 10 },
    );

    // A follower refuses proposals and names the leader.
    const follower = [...members.values()].find((m) => m !== leader);
    await assert.rejects(
      follower?.driver?.propose(enc.encode(JSON.stringify({ k: 'x', v: '1' }))) ??
        Promise.reject(new Error('no follower')),
      (e: unknown) => e instanceof NotLeaderError && e.leader === leader.id,
    );

    // Many proposals at once: all resolve with the state machine's result, in order.
    const leaderDriver = leader.driver;
    assert.ok(leaderDriver !== null);
    const results = await Promise.all(
      Array.from({ length: 120 }, (_, i) =>
        leaderDriver.propose(enc.encode(JSON.stringify({ k: `k${i % 10}`, v: `v${i}` }))),
      ),
    );
    assert.equal(results.length, 120);
    assert.equal(results[0], null);
    assert.equal(results[10], 'v0', 'the 11th write to k0 returns the previous value');

    // A linearizable read on a follower sees every acknowledged write.
    const f = follower;
    assert.ok(f !== undefined);
    await f.driver?.linearizableRead();
    assert.equal(f.machine.kv.get('k9'), 'v119');

    // Stop the leader: the others elect a new one and keep accepting writes.
    await stopMember(leader);
    const next = await waitFor('a new leader', () => leaderOf(members), { everyMs: 10 });
    assert.notEqual(next.id, leader.id);
    await next.driver?.propose(enc.encode(JSON.stringify({ k: 'after', v: 'failover' })));

    // Restart the old leader from its disk (it compacted: snapshots every 50 entries): it catches up.
    await startMember(leader, members);
    await waitFor(
      'the restarted node to catch up',
      () => (leader.machine.kv.get('after') === 'failover' ? true : undefined),
      { everyMs: 10 },
    );
    assert.equal(leader.machine.kv.get('k9'), 'v119');
    const st = leader.driver?.status();
    assert.ok(st !== undefined && st.snapshotIndex > 0, 'the restarted node started from or received a snapshot');
  } finally {
    for (const m of members.values()) await stopMember(m);
    rmSync(root, { recursive: true, force: true });
  }
});
