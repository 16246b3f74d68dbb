// The append-only log's tail (format 2) on real files: a write cut off at every byte offset of the
// last batch is cut back to the state before that batch (or kept whole), never misread; a damaged
// record is cut with a vote barrier above the commit index and refused at or below it; a format-1
// directory written by LevelRaftStorage (what earlier versions ran) is upgraded at open.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cp, mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { frameHeaderBytes } from '../../../coordinator/storage/log-frames.js';
import { SegmentLog } from '../../../coordinator/storage/log-segments.js';
import { join } from 'node:path';
import {
  LevelRaftStorage,
  RaftStorage,
  StorageCorruptionError,
  StorageFormatError,
} from '../../../coordinator/storage/index.js';
import {
  assertSameState,
  ents,
  findLogEntry,
  flipFileByte,
  options,
  save,
  StorageModel,
  withTempDir,
} from './storage-helpers.js';

const initial = (): StorageModel =>
  new StorageModel({
    meta: { index: 0, term: 0, conf: { voters: ['n1', 'n2', 'n3'], learners: [] } },
    data: new Uint8Array([0x91, 0x00]),
  });

/** Writes entries 1..8 (commit 4) and then one last batch 9..11 with a new term and commit 6. */
async function writeTwoBatches(dir: string): Promise<{ before: StorageModel; after: StorageModel }> {
  const before = initial();
  const s = await RaftStorage.open(dir, options());
  await s.load();
  const first = save({ entries: ents(1, 8, 1), hardState: { term: 1, vote: 'n1', commit: 4 } });
  await s.save(first);
  before.save(first);
  const after = before.clone();
  const last = save({ entries: ents(9, 11, 2), hardState: { term: 2, vote: 'n2', commit: 6 } });
  await s.save(last);
  after.save(last);
  await s.close();
  return { before, after };
}

void test('a write cut off at any byte of the last batch is cut back to the batch before it, or kept whole, never misread', async () => {
  await withTempDir(async (base) => {
    const golden = join(base, 'golden');
    const { before, after } = await writeTwoBatches(golden);
    const start = await findLogEntry(golden, 9);
    const file = start.file;
    const bytes = await readFile(file);
    let end = bytes.length;
    while (end > 0 && bytes[end - 1] === 0) end--;
    assert.ok(end > start.offset, 'the last batch is on disk');
    let kept = 0;
    let cut = 0;
    for (let at = start.offset; at <= end; at++) {
      const dir = join(base, `at-${at}`);
      await cp(golden, dir, { recursive: true });
      // What reached the disk: the batch up to `at`; the preallocated zeros after it.
      const torn = Buffer.from(bytes);
      torn.fill(0, at);
      await writeFile(join(dir, file.slice(golden.length)), torn);
      const s = await RaftStorage.open(dir, options());
      try {
        const st = await s.load();
        if (at >= end) {
          assertSameState(st, after.load(), `cut at ${at} (nothing missing)`);
          assert.deepEqual(st.meta.repairs, []);
          kept++;
        } else {
          assertSameState(st, before.load(), `cut at ${at}`);
          assert.equal(st.meta.voteBarrier, 0, 'a torn write needs no vote barrier');
          assert.ok(
            st.meta.repairs.every((r) => r.torn === true),
            JSON.stringify(st.meta.repairs),
          );
          cut++;
        }
      } finally {
        await s.close();
      }
      // Cut once, the log is clean: it reopens to the same state with nothing more to repair.
      const again = await RaftStorage.open(dir, options());
      try {
        assert.deepEqual(again.meta().repairs, []);
        assertSameState(await again.load(), at >= end ? after.load() : before.load(), `reopened after cut at ${at}`);
        await again.save(save({ entries: ents(at >= end ? 12 : 9, at >= end ? 12 : 9, 3), hardState: null }));
      } finally {
        await again.close();
      }
    }
    assert.ok(cut > 0 && kept === 1, `cut ${cut}, kept ${kept}`);
  });
});

void test('a damaged byte in a record above the commit index is cut with a vote barrier; at or below it, refused', async () => {
  await withTempDir(async (base) => {
    const golden = join(base, 'golden');
    const { before } = await writeTwoBatches(golden);
    // Entry 7 (above commit 6 after the last batch) damaged: 7..11 go, the barrier is 11.
    const above = join(base, 'above');
    await cp(golden, above, { recursive: true });
    const e7 = await findLogEntry(above, 7);
    await flipFileByte(e7.file, e7.bodyEnd - 1);
    const s = await RaftStorage.open(above, options());
    try {
      const st = await s.load();
      assert.equal(st.meta.voteBarrier, 11);
      assert.deepEqual(
        st.entries.map((e) => e.index),
        [1, 2, 3, 4, 5, 6],
      );
      assert.deepEqual(st.hardState, { term: 2, vote: 'n2', commit: 6 }, 'the hard state beyond the damage is kept');
      assert.equal(st.meta.repairs[0]?.torn, false);
      void before;
    } finally {
      await s.close();
    }
    const reopened = await RaftStorage.open(above, options());
    assert.equal(reopened.meta().voteBarrier, 11, 'the barrier is durable');
    await reopened.clearVoteBarrier(11).catch(() => undefined);
    await reopened.close();
    // Entry 5 (at or below commit 6): committed data lost — refused, naming the record.
    const below = join(base, 'below');
    await cp(golden, below, { recursive: true });
    const e5 = await findLogEntry(below, 5);
    await flipFileByte(e5.file, e5.offset + 12);
    await assert.rejects(RaftStorage.open(below, options()), (err: unknown) => {
      assert.ok(err instanceof StorageCorruptionError, String(err));
      assert.match(err.message, /at or below the commit index/);
      return true;
    });
  });
});

void test('a format-1 directory is upgraded at open, keeps its identity and state, and earlier versions then refuse it', async () => {
  await withTempDir(async (dir) => {
    const model = initial();
    const old = await LevelRaftStorage.open(dir, options());
    await old.load();
    const incarnation = old.meta().incarnation;
    await old.confirmIncarnation();
    for (const rd of [
      save({ entries: ents(1, 5, 1), hardState: { term: 1, vote: 'n1', commit: 3 } }),
      save({ entries: ents(4, 7, 2), hardState: { term: 2, vote: null, commit: 4 } }),
    ]) {
      await old.save(rd);
      model.save(rd);
    }
    await old.close();
    const s = await RaftStorage.open(dir, { ...options(), segmentBytes: 512 });
    try {
      const st = await s.load();
      assertSameState(st, model.load(), 'upgraded');
      assert.equal(st.meta.incarnation, incarnation);
      assert.equal(st.meta.incarnationConfirmed, true);
      assert.equal(st.meta.fresh, false);
      const more = save({ entries: ents(8, 30, 2), hardState: { term: 2, vote: null, commit: 20 } });
      await s.save(more);
      model.save(more);
    } finally {
      await s.close();
    }
    const again = await RaftStorage.open(dir, options());
    assertSameState(await again.load(), model.load(), 'after the upgrade, reopened');
    await again.close();
    await assert.rejects(LevelRaftStorage.open(dir, options()), StorageFormatError);
  });
});

void test('entries saved without a hard state after a new segment began are kept across reopen (the segment starts with the latest hard state)', async () => {
  await withTempDir(async (dir) => {
    const model = initial();
    const first = await RaftStorage.open(dir, { ...options(), segmentBytes: 512 });
    await first.load();
    await first.close();
    // Reopened: the term is then still 0 as of the open; it moves to 3 below, then entries come alone.
    const s = await RaftStorage.open(dir, { ...options(), segmentBytes: 512 });
    await s.load();
    const rds = [save({ entries: ents(1, 2, 3), hardState: { term: 3, vote: 'n1', commit: 1 } })];
    for (let i = 3; i <= 40; i += 2) rds.push(save({ entries: ents(i, i + 1, 3) }));
    for (const rd of rds) {
      await s.save(rd);
      model.save(rd);
    }
    await s.close();
    const again = await RaftStorage.open(dir, { ...options(), segmentBytes: 512 });
    try {
      const st = await again.load();
      assert.deepEqual(st.meta.repairs, []);
      assertSameState(st, model.load(), 'reopened');
    } finally {
      await again.close();
    }
  });
});

void test('a flipped bit at any byte of synced records above the commit index is damage (vote barrier), never a torn write; below it, refused', async () => {
  await withTempDir(async (base) => {
    const golden = join(base, 'golden');
    const model = initial();
    const s = await RaftStorage.open(golden, options());
    await s.load();
    for (const rd of [
      save({ entries: ents(1, 8, 1), hardState: { term: 1, vote: 'n1', commit: 4 } }),
      save({ entries: ents(9, 11, 2), hardState: { term: 2, vote: 'n2', commit: 6 } }),
      save({ entries: ents(12, 14, 2), hardState: { term: 2, vote: 'n2', commit: 6 } }),
    ]) {
      await s.save(rd);
      model.save(rd);
    }
    await s.close();
    const e5 = await findLogEntry(golden, 5);
    const e9 = await findLogEntry(golden, 9);
    const bytes = await readFile(e9.file);
    let end = bytes.length;
    while (end > 0 && bytes[end - 1] === 0) end--;
    // Padding after a record's trailer is covered by no check: a flip there changes nothing.
    const padding = new Set<number>();
    for (const seg of await SegmentLog.read(golden, 0))
      for (const f of seg.scan.frames)
        for (let p = f.offset + frameHeaderBytes + 2 + f.payload.length; p < f.end; p++) padding.add(p);
    const rel = e9.file.slice(golden.length);
    const tried = { damage: 0, refused: 0, padding: 0 };
    // Every byte of entry 5's record (below commit), then of the last two batches (above it).
    const positions = Array.from({ length: e5.end - e5.offset }, (_, k) => e5.offset + k);
    for (let p = e9.offset; p < end; p++) positions.push(p);
    for (const p of positions) {
      const dir = join(base, `at-${p}`);
      await cp(golden, dir, { recursive: true });
      await flipFileByte(join(dir, rel), p, 1 << (p % 8));
      const where = `bit ${p % 8} of byte ${p}`;
      if (padding.has(p)) {
        const st = await RaftStorage.open(dir, options());
        assertSameState(await st.load(), model.load(), where);
        await st.close();
        tried.padding++;
      } else if (p < e9.offset) {
        await assert.rejects(RaftStorage.open(dir, options()), StorageCorruptionError, where);
        tried.refused++;
      } else {
        const st = await RaftStorage.open(dir, options());
        try {
          const got = await st.load();
          assert.ok(got.meta.voteBarrier >= 14, `${where}: vote barrier ${got.meta.voteBarrier}`);
          assert.deepEqual(
            got.meta.repairs.map((r) => r.torn),
            [false],
            where,
          );
          const kept = got.entries.map((e) => e.index);
          assert.deepEqual(
            kept,
            Array.from({ length: kept.length }, (_, k) => k + 1),
            where,
          );
          assert.ok(kept.length >= 6, `${where}: committed entries kept`);
        } finally {
          await st.close();
        }
        tried.damage++;
      }
      await rm(dir, { recursive: true, force: true });
    }
    assert.ok(tried.damage > 0 && tried.refused > 0 && tried.padding > 0, JSON.stringify(tried));
  });
});

void test('a commit index moved without a sync is in the log after the next write, and after close', async () => {
  await withTempDir(async (dir) => {
    const s = await RaftStorage.open(dir, options());
    await s.load();
    await s.save(save({ entries: ents(1, 6, 1), hardState: { term: 1, vote: 'n1', commit: 2 } }));
    await s.save(save({ hardState: { term: 1, vote: 'n1', commit: 4 }, mustSync: false }));
    // A leader's next Ready: entries without a hard state. The directory as a crash would leave it
    // after that write (copied while the storage is open) has the commit index of the Ready before.
    await s.save(save({ entries: ents(7, 8, 1) }));
    const crashed = join(dir, 'crashed');
    await mkdir(crashed);
    for (const name of await readdir(dir))
      if (name !== 'crashed') await cp(join(dir, name), join(crashed, name), { recursive: true });
    await s.save(save({ hardState: { term: 1, vote: 'n1', commit: 6 }, mustSync: false }));
    await s.close();
    const c = await RaftStorage.open(crashed, options());
    assert.deepEqual((await c.load()).hardState, { term: 1, vote: 'n1', commit: 4 });
    assert.equal((await c.load()).entries.length, 8);
    await c.close();
    const r = await RaftStorage.open(dir, options());
    assert.deepEqual((await r.load()).hardState, { term: 1, vote: 'n1', commit: 6 }, 'written at close');
    await r.close();
  });
});
