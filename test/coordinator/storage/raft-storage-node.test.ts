// The storage drives a real RaftNode: a single-voter node elects itself, commits proposals and
// compacts through the storage, and after a restart from load() it is back where it was.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RaftNode, Role, defaultRaftTuning, type RaftConfig } from '../../../coordinator/raft/index.js';
import { LevelRaftStorage } from '../../../coordinator/storage/index.js';
import { options, withTempDir } from './storage-helpers.js';

const cfg: RaftConfig = { ...defaultRaftTuning, id: 'n1', randomInt: () => 0 };
const storageOpts = options({ bootstrap: { conf: { voters: ['n1'], learners: [] }, data: new Uint8Array(0) } });

/** Persists and applies every Ready until the node has nothing more to do; returns the applied commands. */
async function drain(node: RaftNode, storage: LevelRaftStorage, applied: string[]): Promise<void> {
  while (node.hasReady()) {
    const rd = node.ready();
    await storage.save(rd);
    for (const e of rd.committedEntries) if (e.data.length > 0) applied.push(new TextDecoder().decode(e.data));
    node.advance(rd);
  }
}

void test('a RaftNode runs on the storage, compacts, and restarts from load()', async () => {
  await withTempDir(async (dir) => {
    let storage = await LevelRaftStorage.open(dir, storageOpts);
    let node = new RaftNode(cfg, await storage.load());
    const applied: string[] = [];
    for (let i = 0; i < 3 * cfg.electionTicks && node.status().role !== Role.Leader; i++) {
      node.tick();
      await drain(node, storage, applied);
    }
    assert.equal(node.status().role, Role.Leader);
    for (let i = 0; i < 20; i++) {
      const r = node.propose(new TextEncoder().encode(`cmd-${i}`));
      assert.ok(r.ok);
      await drain(node, storage, applied);
    }
    assert.equal(applied.length, 20);
    const before = node.status();
    assert.equal(before.commit, before.lastIndex);
    const snapshot = node.compact(new TextEncoder().encode(`state@${before.applied}`), 5);
    assert.equal(await storage.compact(snapshot, snapshot.meta.index - 5 + 1), true);
    await storage.close();

    storage = await LevelRaftStorage.open(dir, storageOpts);
    const loaded = await storage.load();
    assert.equal(loaded.meta.fresh, false);
    assert.equal(loaded.snapshot.meta.index, before.applied);
    assert.equal(new TextDecoder().decode(loaded.snapshot.data), `state@${before.applied}`);
    node = new RaftNode(cfg, loaded);
    const after = node.status();
    assert.deepEqual(
      [after.term, after.vote, after.commit, after.lastIndex],
      [before.term, before.vote, before.commit, before.lastIndex],
    );
    // It elects itself again in a later term and keeps going.
    for (let i = 0; i < 3 * cfg.electionTicks && node.status().role !== Role.Leader; i++) {
      node.tick();
      await drain(node, storage, applied);
    }
    assert.equal(node.status().role, Role.Leader);
    assert.ok(node.status().term > before.term);
    assert.ok(node.propose(new TextEncoder().encode('cmd-after')).ok);
    await drain(node, storage, applied);
    assert.equal(applied.at(-1), 'cmd-after');
    await storage.close();
    const final = await LevelRaftStorage.open(dir, storageOpts);
    const st = await final.load();
    assert.equal(st.hardState.commit, node.status().commit);
    assert.equal(st.entries.at(-1)?.index, node.status().lastIndex);
    await final.close();
  });
});
