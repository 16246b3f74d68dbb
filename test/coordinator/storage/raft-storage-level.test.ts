// Conformance of the LevelDB-backed Raft storage: round trips, truncation, snapshots, compaction,
// reopening, identity, and what happens with torn or corrupted records.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { EntryKind } from '../../../coordinator/raft/index.js';
import { LevelRaftStorage, StorageCorruptionError, StorageIdentityError } from '../../../coordinator/storage/index.js';
import { crc32, crc32IsNative, crc32Portable } from '../../../coordinator/storage/crc32.js';
import {
  describeKey,
  entryKey,
  entryIndexOfKey,
  hardKey,
  metaKey,
  snapKey,
} from '../../../coordinator/storage/storage-codec.js';
import {
  assertSameState,
  bootstrapData,
  captureLogger,
  ent,
  ents,
  options,
  save,
  snap,
  withRawDb,
  withTempDir,
} from './storage-helpers.js';

const rawKeys = async (dir: string): Promise<string[]> => {
  const keys: string[] = [];
  await withRawDb(dir, async (db) => {
    for await (const k of db.keys()) keys.push(describeKey(k));
  });
  return keys;
};

/** Flips one byte of the record under `key` (a torn or bit-rotten write). */
const flipByte = (dir: string, key: Uint8Array, at = -1) =>
  withRawDb(dir, async (db) => {
    const v = await db.get(key);
    assert.ok(v !== undefined, `no record under ${describeKey(key)}`);
    const copy = new Uint8Array(v);
    const i = ((at % copy.length) + copy.length) % copy.length;
    copy[i] = (copy[i] ?? 0) ^ 0x5a;
    await db.put(key, copy);
  });

const delKey = (dir: string, key: Uint8Array) => withRawDb(dir, (db) => db.del(key));

void test('crc32: native and portable agree, and match the standard check value', () => {
  const check = new TextEncoder().encode('123456789');
  assert.equal(crc32Portable(check), 0xcbf43926);
  assert.equal(crc32(check), 0xcbf43926);
  assert.equal(typeof crc32IsNative, 'boolean');
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 300 }), fc.uint8Array({ maxLength: 50 }), (a, b) => {
      assert.equal(crc32Portable(b, crc32Portable(a)), crc32(b, crc32(a)));
      const ab = new Uint8Array([...a, ...b]);
      assert.equal(crc32Portable(ab), crc32Portable(b, crc32Portable(a)));
    }),
    { numRuns: 200 },
  );
});

void test('entry keys sort bytewise in index order and round-trip', () => {
  fc.assert(
    fc.property(fc.maxSafeNat(), fc.maxSafeNat(), (a, b) => {
      const ka = Buffer.from(entryKey(a));
      const kb = Buffer.from(entryKey(b));
      assert.equal(Math.sign(Buffer.compare(ka, kb)), Math.sign(a - b));
      assert.equal(entryIndexOfKey(ka), a);
    }),
    { numRuns: 300 },
  );
  assert.equal(describeKey(entryKey(42)), 'log/42');
  assert.deepEqual([describeKey(metaKey), describeKey(hardKey), describeKey(snapKey)], ['meta', 'hard', 'snap']);
});

void test('a new directory starts from the bootstrap conf-only snapshot and records its identity', async () => {
  await withTempDir(async (dir) => {
    const fixed = new Uint8Array(16).map((_, i) => i + 1);
    const s = await LevelRaftStorage.open(dir, options({ randomBytes: () => fixed, now: () => Date.UTC(2030, 0, 2) }));
    const st = await s.load();
    assert.deepEqual(st.hardState, { term: 0, vote: null, commit: 0 });
    assert.deepEqual(st.snapshot.meta, { index: 0, term: 0, conf: { voters: ['n1', 'n2', 'n3'], learners: [] } });
    assert.deepEqual([...st.snapshot.data], [...bootstrapData]);
    assert.deepEqual(st.entries, []);
    assert.deepEqual(st.meta, {
      clusterId: 'test-cluster',
      nodeId: 'n1',
      incarnation: '0102030405060708090a0b0c0d0e0f10',
      createdAt: '2030-01-02T00:00:00.000Z',
      fresh: true,
      incarnationConfirmed: false,
      repairs: [],
      voteBarrier: 0,
    });
    await s.close();

    // Reopened: not fresh, same incarnation; the bootstrap option is ignored now.
    const again = await LevelRaftStorage.open(
      dir,
      options({ bootstrap: { conf: { voters: ['x'], learners: [] }, data: new Uint8Array(0) } }),
    );
    const st2 = await again.load();
    assert.equal(st2.meta.fresh, false);
    assert.equal(st2.meta.incarnation, '0102030405060708090a0b0c0d0e0f10');
    assert.deepEqual(st2.snapshot.meta.conf.voters, ['n1', 'n2', 'n3']);
    await again.confirmIncarnation();
    await again.close();
    const third = await LevelRaftStorage.open(dir, options());
    assert.equal(third.meta().incarnationConfirmed, true);
    await third.close();
  });
});

void test('a wiped and recreated directory gets a new incarnation', async () => {
  const incarnations: string[] = [];
  for (let i = 0; i < 2; i++) {
    await withTempDir(async (dir) => {
      const s = await LevelRaftStorage.open(dir, options());
      assert.match(s.meta().incarnation, /^[0-9a-f]{32}$/);
      incarnations.push(s.meta().incarnation);
      await s.close();
    });
  }
  assert.notEqual(incarnations[0], incarnations[1]);
});

void test('hard state and entries round-trip across reopen', async () => {
  await withTempDir(async (dir) => {
    const s = await LevelRaftStorage.open(dir, options());
    await s.load();
    const entries = [
      ent(1, 1, EntryKind.Noop, 0),
      ent(2, 1, EntryKind.Normal, 300),
      ent(3, 1, EntryKind.Conf),
      ent(4, 2),
    ];
    await s.save(save({ hardState: { term: 2, vote: 'n2', commit: 2 }, entries }));
    await s.save(save({ hardState: { term: 2, vote: 'n2', commit: 3 }, mustSync: false }));
    const expected = {
      hardState: { term: 2, vote: 'n2', commit: 3 },
      snapshot: snap(0, 0, ['n1', 'n2', 'n3'], bootstrapData),
      entries,
    };
    assertSameState(await s.load(), expected, 'before reopen');
    await s.close();
    await assert.rejects(s.save(save({ entries: [ent(5, 2)] })), /closed/);

    const r = await LevelRaftStorage.open(dir, options());
    const st = await r.load();
    assertSameState(st, expected, 'after reopen');
    assert.ok(
      st.entries.every((e) => Object.getPrototypeOf(e.data) === Uint8Array.prototype),
      'entry data is a plain Uint8Array',
    );
    await r.save(save({ hardState: { term: 3, vote: null, commit: 3 } }));
    await r.close();
    const r2 = await LevelRaftStorage.open(dir, options());
    assert.deepEqual((await r2.load()).hardState, { term: 3, vote: null, commit: 3 });
    await r2.close();
  });
});

void test('entries overwrite from their first index and drop the stored tail above', async () => {
  await withTempDir(async (dir) => {
    const s = await LevelRaftStorage.open(dir, options());
    await s.save(save({ hardState: { term: 1, vote: 'n1', commit: 4 }, entries: ents(1, 10, 1) }));
    await s.save(save({ hardState: { term: 2, vote: 'n3', commit: 4 }, entries: ents(6, 7, 2) }));
    const st = await s.load();
    assert.deepEqual(
      st.entries.map((e) => [e.index, e.term]),
      [
        [1, 1],
        [2, 1],
        [3, 1],
        [4, 1],
        [5, 1],
        [6, 2],
        [7, 2],
      ],
    );
    assert.deepEqual([...(st.entries[5]?.data ?? [])], [...ent(6, 2).data]);
    await s.close();
    const keys = await rawKeys(dir);
    assert.deepEqual(
      keys.filter((k) => k.startsWith('log/')),
      ['log/1', 'log/2', 'log/3', 'log/4', 'log/5', 'log/6', 'log/7'],
    );
    // Appending right after the last index, and overwriting the last one only.
    const r = await LevelRaftStorage.open(dir, options());
    await r.save(save({ entries: [ent(7, 3), ent(8, 3)], hardState: { term: 3, vote: null, commit: 4 } }));
    assert.deepEqual(
      (await r.load()).entries.map((e) => e.term),
      [1, 1, 1, 1, 1, 2, 3, 3],
    );
    await r.close();
  });
});

void test('an installed snapshot replaces every stored entry', async () => {
  await withTempDir(async (dir) => {
    const s = await LevelRaftStorage.open(dir, options());
    await s.save(save({ hardState: { term: 1, vote: 'n1', commit: 6 }, entries: ents(1, 10, 1) }));
    const installed = snap(20, 3, ['n1', 'n2', 'n4'], new Uint8Array([9, 9, 9]));
    await s.save(save({ snapshot: installed, hardState: { term: 3, vote: null, commit: 20 } }));
    let st = await s.load();
    assert.deepEqual(st.snapshot, installed);
    assert.deepEqual(st.entries, []);
    assert.deepEqual(s.stats().lastStoredIndex - s.stats().firstStoredIndex + 1, 0);
    // Snapshot and the entries after it in one Ready.
    await s.save(
      save({ snapshot: snap(25, 3), entries: ents(26, 27, 3), hardState: { term: 3, vote: null, commit: 26 } }),
    );
    st = await s.load();
    assert.equal(st.snapshot.meta.index, 25);
    assert.deepEqual(
      st.entries.map((e) => e.index),
      [26, 27],
    );
    await s.close();
    assert.deepEqual(
      (await rawKeys(dir)).filter((k) => k.startsWith('log/')),
      ['log/26', 'log/27'],
    );
    const r = await LevelRaftStorage.open(dir, options());
    assert.equal((await r.load()).snapshot.meta.index, 25);
    await r.close();
  });
});

void test('compaction keeps trailing entries, returns only those after the snapshot, and ignores a stale snapshot', async () => {
  await withTempDir(async (dir) => {
    const s = await LevelRaftStorage.open(dir, options());
    await s.save(save({ hardState: { term: 1, vote: 'n1', commit: 10 }, entries: ents(1, 10, 1) }));
    assert.equal(await s.compact(snap(8, 1), 6), true);
    let st = await s.load();
    assert.equal(st.snapshot.meta.index, 8);
    assert.deepEqual(
      st.entries.map((e) => e.index),
      [9, 10],
    );
    assert.deepEqual([s.stats().firstStoredIndex, s.stats().lastStoredIndex], [6, 10]);
    assert.equal(await s.compact(snap(5, 1), 1), false, 'older than the stored snapshot');
    await s.close();
    assert.deepEqual(
      (await rawKeys(dir)).filter((k) => k.startsWith('log/')),
      ['log/6', 'log/7', 'log/8', 'log/9', 'log/10'],
      'raw keys iterate in index order',
    );

    const r = await LevelRaftStorage.open(dir, options());
    st = await r.load();
    assert.deepEqual([st.snapshot.meta.index, ...st.entries.map((e) => e.index)], [8, 9, 10]);
    // Compact everything, then the log continues after the snapshot.
    assert.equal(await r.compact(snap(10, 1), 100), true);
    assert.deepEqual((await r.load()).entries, []);
    await r.save(save({ entries: ents(11, 12, 2), hardState: { term: 2, vote: null, commit: 11 } }));
    assert.deepEqual(
      (await r.load()).entries.map((e) => e.index),
      [11, 12],
    );
    await assert.rejects(r.compact(snap(12, 1), 12), /does not match/, 'snapshot term must match the stored entry');
    await r.close();
  });
});

void test('save rejects a Ready that would break the log, without writing anything', async () => {
  await withTempDir(async (dir) => {
    const s = await LevelRaftStorage.open(dir, options());
    await s.save(save({ hardState: { term: 1, vote: 'n1', commit: 0 }, entries: ents(1, 3, 1) }));
    await assert.rejects(s.save(save({ entries: ents(5, 6, 1) })), /gap/);
    await assert.rejects(s.save(save({ entries: [ent(4, 1), ent(6, 1)] })), /contiguous/);
    await assert.rejects(s.save(save({ hardState: { term: 1, vote: 'n1', commit: 4 } })), /past the last index/);
    await s.compact(snap(2, 1), 3);
    await assert.rejects(s.save(save({ entries: [ent(2, 1)] })), /at or below the snapshot/);
    // Still usable.
    await s.save(save({ entries: [ent(4, 1)], hardState: { term: 1, vote: 'n1', commit: 4 } }));
    assert.deepEqual(
      (await s.load()).entries.map((e) => e.index),
      [3, 4],
    );
    await s.close();
  });
});

void test('synced batches report their duration and size; unsynced ones do not', async () => {
  await withTempDir(async (dir) => {
    const syncs: [number, number][] = [];
    const s = await LevelRaftStorage.open(dir, options({ onSync: (ms, bytes) => syncs.push([ms, bytes]) }));
    await s.save(save({ entries: ents(1, 4, 1), hardState: { term: 1, vote: null, commit: 0 } }));
    assert.equal(syncs.length, 1);
    const [ms, bytes] = syncs[0] ?? [NaN, NaN];
    assert.ok(ms >= 0 && bytes > 4 * 16, `ms ${ms} bytes ${bytes}`);
    assert.deepEqual(s.lastSync, { ms, bytes });
    await s.save(save({ hardState: { term: 1, vote: null, commit: 2 }, mustSync: false }));
    assert.equal(syncs.length, 1);
    await s.save(save({})); // nothing to persist: no write at all
    await s.compact(snap(2, 1), 1);
    assert.equal(syncs.length, 2, 'compaction is synced');
    await s.close();
  });
});

void test('a directory of another node or cluster is refused, and left untouched', async () => {
  await withTempDir(async (dir) => {
    const s = await LevelRaftStorage.open(dir, options());
    await s.save(save({ entries: ents(1, 3, 1), hardState: { term: 1, vote: 'n1', commit: 1 } }));
    await s.close();
    await flipByte(dir, entryKey(3)); // a torn tail: must not be "repaired" by the wrong node
    await assert.rejects(LevelRaftStorage.open(dir, options({ nodeId: 'n2' })), (err: unknown) => {
      assert.ok(err instanceof StorageIdentityError);
      assert.equal(err.code, 'STORAGE_IDENTITY_MISMATCH');
      assert.match(err.message, /belongs to node 'n1'.*not 'n2'/);
      return true;
    });
    await assert.rejects(
      LevelRaftStorage.open(dir, options({ clusterId: 'other' })),
      /belongs to cluster 'test-cluster', not 'other'/,
    );
    assert.ok((await rawKeys(dir)).includes('log/3'));
    const r = await LevelRaftStorage.open(dir, options());
    assert.equal(r.meta().repairs.length, 1);
    await r.close();
  });
});

// ---------------------------------------------------------------------------------------------
// Torn writes and corruption

/** A store with entries 1..10 of term 1 and the given commit, closed. */
async function prepared(dir: string, commit: number): Promise<void> {
  const s = await LevelRaftStorage.open(dir, options());
  await s.save(save({ entries: ents(1, 10, 1), hardState: { term: 1, vote: 'n1', commit } }));
  await s.close();
}

async function expectCorrupt(dir: string, key: string, reason: RegExp): Promise<void> {
  await assert.rejects(LevelRaftStorage.open(dir, options()), (err: unknown) => {
    assert.ok(err instanceof StorageCorruptionError, `expected StorageCorruptionError, got ${String(err)}`);
    assert.equal(err.code, 'STORAGE_CORRUPT');
    assert.equal(err.key, key);
    assert.ok(err.message.includes(`key ${key}`), err.message);
    assert.match(err.message, reason);
    return true;
  });
}

void test('a corrupt last entry above the commit index is truncated and reported', async () => {
  await withTempDir(async (dir) => {
    await prepared(dir, 7);
    await flipByte(dir, entryKey(10));
    const logger = captureLogger();
    const s = await LevelRaftStorage.open(dir, options({ logger }));
    const st = await s.load();
    assert.deepEqual(
      st.entries.map((e) => e.index),
      [1, 2, 3, 4, 5, 6, 7, 8, 9],
    );
    assert.equal(st.meta.repairs.length, 1);
    const rep = st.meta.repairs[0];
    assert.equal(rep?.key, 'log/10');
    assert.equal(rep.truncatedFrom, 10);
    assert.equal(rep.removedRecords, 1);
    assert.equal(rep.commit, 7);
    assert.match(rep.reason, /checksum mismatch/);
    assert.equal(logger.lines.length, 1);
    assert.match(logger.lines[0] ?? '', /corrupt log record above the commit index/);
    // The log continues from the repaired tail.
    await s.save(save({ entries: [ent(10, 2)], hardState: { term: 2, vote: null, commit: 7 } }));
    await s.close();
    const r = await LevelRaftStorage.open(dir, options());
    const st2 = await r.load();
    assert.deepEqual(st2.meta.repairs, []);
    assert.deepEqual(
      st2.entries.map((e) => e.term),
      [1, 1, 1, 1, 1, 1, 1, 1, 1, 2],
    );
    await r.close();
  });
});

void test('a corrupt record above commit sets a durable vote barrier at the highest stored index, lifted only once commit reaches it', async () => {
  await withTempDir(async (dir) => {
    await prepared(dir, 4);
    await flipByte(dir, entryKey(6)); // entries 6..10 are lost; any of them may have been acknowledged
    const logger = captureLogger();
    let s = await LevelRaftStorage.open(dir, options({ logger }));
    assert.equal(s.meta().voteBarrier, 10);
    assert.match(
      logger.lines.join('\n'),
      /must not vote until its commit index reaches the vote barrier.*"voteBarrier":10/,
    );
    await s.close();
    // A crash before the node caught up: the barrier is still there on the next open (nothing is repaired now).
    s = await LevelRaftStorage.open(dir, options());
    assert.deepEqual(s.meta().repairs, []);
    assert.equal(s.meta().voteBarrier, 10);
    // The leader re-sends 6..12; the commit index it reports reaches 9 first, then 12.
    await s.save(save({ entries: ents(6, 12, 1), hardState: { term: 1, vote: 'n1', commit: 9 } }));
    await assert.rejects(s.clearVoteBarrier(9), /commit 9 has not reached the vote barrier 10/);
    assert.equal(s.meta().voteBarrier, 10);
    await s.save(save({ hardState: { term: 1, vote: 'n1', commit: 12 } }));
    await s.clearVoteBarrier(12);
    await s.close();
    s = await LevelRaftStorage.open(dir, options());
    assert.equal(s.meta().voteBarrier, 0);
    await s.close();
  });
});

void test('a missing entry above the commit index truncates the log from the gap', async () => {
  await withTempDir(async (dir) => {
    await prepared(dir, 5);
    await delKey(dir, entryKey(7));
    const s = await LevelRaftStorage.open(dir, options());
    const st = await s.load();
    assert.deepEqual(
      st.entries.map((e) => e.index),
      [1, 2, 3, 4, 5, 6],
    );
    assert.deepEqual(
      st.meta.repairs.map((r) => [r.key, r.truncatedFrom, r.removedRecords]),
      [['log/7', 7, 3]],
    );
    assert.match(st.meta.repairs[0]?.reason ?? '', /missing \(the next stored entry is 8\)/);
    await s.close();
    assert.deepEqual((await rawKeys(dir)).filter((k) => k.startsWith('log/')).length, 6);
  });
});

void test('cut-short, misplaced and semantically impossible records above commit are torn tails too', async () => {
  await withTempDir(async (dir) => {
    await prepared(dir, 3);
    // A record cut short.
    await withRawDb(dir, async (db) => {
      const v = await db.get(entryKey(9));
      assert.ok(v);
      await db.put(entryKey(9), v.subarray(0, 7));
    });
    let s = await LevelRaftStorage.open(dir, options());
    assert.deepEqual(
      s.meta().repairs.map((r) => r.truncatedFrom),
      [9],
    );
    await s.close();
    // A valid record stored under another key: the checksum covers the key.
    await withRawDb(dir, async (db) => {
      const v = await db.get(entryKey(7));
      assert.ok(v);
      await db.put(entryKey(8), v);
    });
    s = await LevelRaftStorage.open(dir, options());
    assert.deepEqual(
      s.meta().repairs.map((r) => [r.key, r.truncatedFrom]),
      [['log/8', 8]],
    );
    // An entry whose term is past the hard state's term cannot have been written by Raft.
    await s.save(save({ entries: [ent(8, 1)] }));
    await s.close();
    await withRawDb(dir, async (db) => {
      const { encodeEntry } = await import('../../../coordinator/storage/storage-codec.js');
      await db.put(entryKey(8), encodeEntry(ent(8, 5)));
    });
    s = await LevelRaftStorage.open(dir, options());
    assert.deepEqual(
      s.meta().repairs.map((r) => r.truncatedFrom),
      [8],
    );
    assert.match(s.meta().repairs[0]?.reason ?? '', /above the hard state's term/);
    await s.close();
  });
});

void test('corruption at or below the commit index is fatal and names the key', async () => {
  await withTempDir(async (dir) => {
    await prepared(dir, 5);
    await flipByte(dir, entryKey(5), 6);
    await expectCorrupt(dir, 'log/5', /checksum mismatch.*at or below the commit index 5/);
  });
  await withTempDir(async (dir) => {
    await prepared(dir, 5);
    await delKey(dir, entryKey(3));
    await expectCorrupt(dir, 'log/3', /missing.*commit index 5/);
  });
  await withTempDir(async (dir) => {
    // The committed tail itself is gone.
    await prepared(dir, 10);
    await delKey(dir, entryKey(10));
    await expectCorrupt(dir, 'log/10', /commit index is 10/);
  });
  await withTempDir(async (dir) => {
    // Trailing entries below a snapshot are committed too.
    const s = await LevelRaftStorage.open(dir, options());
    await s.save(save({ entries: ents(1, 10, 1), hardState: { term: 1, vote: 'n1', commit: 4 } }));
    await s.compact(snap(4, 1), 2);
    await s.close();
    await flipByte(dir, entryKey(3));
    await expectCorrupt(dir, 'log/3', /checksum mismatch/);
  });
});

void test('a damaged hard state, snapshot or identity record is fatal', async () => {
  for (const [key, name] of [
    [hardKey, 'hard'],
    [snapKey, 'snap'],
    [metaKey, 'meta'],
  ] as const) {
    await withTempDir(async (dir) => {
      await prepared(dir, 2);
      await flipByte(dir, key, 5);
      await expectCorrupt(dir, name, /checksum mismatch/);
    });
    await withTempDir(async (dir) => {
      await prepared(dir, 2);
      await delKey(dir, key);
      await expectCorrupt(dir, name, /missing/);
    });
  }
  await withTempDir(async (dir) => {
    await prepared(dir, 2);
    await withRawDb(dir, (db) => db.put(new TextEncoder().encode('zzz'), new Uint8Array([1])));
    await expectCorrupt(dir, '0x7a7a7a', /unknown key/);
  });
});

void test('single-byte damage anywhere is either repaired above commit or refused, never loaded silently', async () => {
  // Damage one byte of each record in turn (at varying offsets, the checksum included); reopening
  // must either repair a tail above the commit index (and then hold exactly the entries before it)
  // or throw StorageCorruptionError.
  const keys = [hardKey, snapKey, metaKey, ...Array.from({ length: 10 }, (_, i) => entryKey(i + 1))];
  await withTempDir(async (base) => {
    for (const [n, key] of keys.entries()) {
      const dir = `${base}/r${n}`;
      await prepared(dir, 5);
      await flipByte(dir, key, n * 5);
      const idx = entryIndexOfKey(key);
      try {
        const s = await LevelRaftStorage.open(dir, options());
        const st = await s.load();
        await s.close();
        assert.ok(idx !== undefined && idx > 5, `opened although ${describeKey(key)} was damaged`);
        assert.deepEqual(
          st.entries.map((e) => e.index),
          Array.from({ length: idx - 1 }, (_, i) => i + 1),
        );
        assert.equal(st.meta.repairs.length, 1);
      } catch (err) {
        assert.ok(err instanceof StorageCorruptionError, String(err));
        assert.ok(idx === undefined || idx <= 5, `refused although ${describeKey(key)} is above commit`);
      }
    }
  });
});
