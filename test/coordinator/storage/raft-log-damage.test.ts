// Damage to synced records of the append-only log (format 2) that could pass for a torn write or an
// unused segment: a sector of zeros inside a record followed by valid records, a last segment read
// as all zeros, and a damaged hard state written after entries of its new term. Each is cut above
// the commit index with a vote barrier covering what was synced (never silently dropped), or refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { cp, open, readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { RaftStorage, StorageCorruptionError } from '../../../coordinator/storage/index.js';
import { logDirName, SegmentLog } from '../../../coordinator/storage/log-segments.js';
import { frameHeaderBytes, RecordType } from '../../../coordinator/storage/log-frames.js';
import { ent, ents, findLogEntry, flipFileByte, options, save, withTempDir } from './storage-helpers.js';

const big = (from: number, to: number, term: number) =>
  Array.from({ length: to - from + 1 }, (_, k) => ent(from + k, term, undefined, 3000));

const segOpts = (segmentBytes?: number) => ({ ...options(), ...(segmentBytes === undefined ? {} : { segmentBytes }) });

/** Entries 1..8 (term 1, commit 4), then two synced batches 9..11 and 12..14 of term 2 (commit 6). */
async function writeBatches(dir: string, segmentBytes?: number): Promise<void> {
  const s = await RaftStorage.open(dir, segOpts(segmentBytes));
  await s.load();
  await s.save(save({ entries: big(1, 8, 1), hardState: { term: 1, vote: 'n1', commit: 4 } }));
  await s.save(save({ entries: big(9, 11, 2), hardState: { term: 2, vote: 'n2', commit: 6 } }));
  await s.save(save({ entries: big(12, 14, 2), hardState: { term: 2, vote: 'n2', commit: 6 } }));
  await s.close();
}

async function zeroRange(file: string, from: number, to: number): Promise<void> {
  const fh = await open(file, 'r+');
  try {
    await fh.write(new Uint8Array(to - from), 0, to - from, from);
  } finally {
    await fh.close();
  }
}

async function reopen(dir: string, segmentBytes?: number) {
  const s = await RaftStorage.open(dir, segOpts(segmentBytes));
  try {
    const st = await s.load();
    return { st, indexes: st.entries.map((e) => e.index) };
  } finally {
    await s.close();
  }
}

void test('a sector of zeros inside a synced record followed by valid records is damage: cut with a vote barrier', async () => {
  await withTempDir(async (base) => {
    const golden = join(base, 'golden');
    await writeBatches(golden);
    const dir = join(base, 'zeroed');
    await cp(golden, dir, { recursive: true });
    const e9 = await findLogEntry(dir, 9);
    const sector = Math.ceil((e9.offset + 16) / 512) * 512;
    assert.ok(sector + 512 < e9.bodyEnd, 'a whole sector inside entry 9');
    await zeroRange(e9.file, sector, sector + 512);
    const { st, indexes } = await reopen(dir);
    assert.deepEqual(indexes, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert.ok(st.meta.voteBarrier >= 14, `entries 9..14 were synced: barrier ${st.meta.voteBarrier}`);
    assert.deepEqual(
      st.meta.repairs.map((r) => r.torn),
      [false],
    );
    // The same sector zeroed in the last record written, with nothing after it: still a torn write.
    const tornDir = join(base, 'torn');
    await cp(golden, tornDir, { recursive: true });
    const e14 = await findLogEntry(tornDir, 14);
    // (the hard state after entry 14 is part of the same write, never synced: it is missing too)
    const hardAfter = (await SegmentLog.read(tornDir, 0))[0]!.scan.frames.at(-1)!;
    assert.equal(hardAfter.type, RecordType.Hard);
    await zeroRange(e14.file, hardAfter.offset, hardAfter.end);
    const s14 = Math.ceil((e14.offset + 16) / 512) * 512;
    await zeroRange(e14.file, s14, s14 + 512);
    const torn = await reopen(tornDir);
    assert.deepEqual(
      torn.indexes,
      Array.from({ length: 13 }, (_, k) => k + 1),
    );
    assert.equal(torn.st.meta.voteBarrier, 0);
    assert.deepEqual(
      torn.st.meta.repairs.map((r) => r.torn),
      [true],
    );
  });
});

void test('a last segment that reads as all zeros is damage (vote barrier), not an unused spare', async () => {
  await withTempDir(async (dir) => {
    await writeBatches(dir, 16 * 1024);
    const names = (await readdir(join(dir, logDirName))).sort();
    const lastSeg = join(dir, logDirName, names.at(-1)!);
    const e14 = await findLogEntry(dir, 14);
    assert.equal(e14.file, lastSeg, 'entry 14 is in the last segment');
    await zeroRange(lastSeg, 0, (await stat(lastSeg)).size);
    const { st, indexes } = await reopen(dir, 16 * 1024);
    assert.ok(st.meta.voteBarrier >= 14, `barrier ${st.meta.voteBarrier}`);
    assert.deepEqual(
      st.meta.repairs.map((r) => r.torn),
      [false],
    );
    assert.deepEqual(
      indexes,
      Array.from({ length: indexes.length }, (_, k) => k + 1),
    );
    assert.ok(indexes.length >= 6, 'committed entries kept');
    // Reopened: clean, the barrier durable.
    const again = await reopen(dir, 16 * 1024);
    assert.deepEqual(again.st.meta.repairs, []);
    assert.equal(again.st.meta.voteBarrier, st.meta.voteBarrier);
    // A rotation cut short before its opening records were synced (an empty next file): a spare, dropped.
    const seq = Number.parseInt(names.at(-1)!.slice(0, 16), 16) + 1;
    await (await open(join(dir, logDirName, `${seq.toString(16).padStart(16, '0')}.seg`), 'wx')).close();
    const spare = await reopen(dir, 16 * 1024);
    assert.deepEqual(spare.st.meta.repairs, []);
    assert.deepEqual(spare.indexes, again.indexes);
  });
});

void test('a segment that reads as all zeros below the commit index (a later segment says so) is refused', async () => {
  await withTempDir(async (dir) => {
    const s = await RaftStorage.open(dir, segOpts(16 * 1024));
    await s.load();
    await s.save(save({ entries: big(1, 14, 1), hardState: { term: 1, vote: 'n1', commit: 0 } }));
    // The next segment: entry 15 and the hard state committing 1..14.
    await s.save(save({ entries: big(15, 15, 1), hardState: { term: 1, vote: 'n1', commit: 14 } }));
    await s.close();
    const e14 = await findLogEntry(dir, 14);
    assert.notEqual(e14.file, (await findLogEntry(dir, 15)).file);
    await zeroRange(e14.file, 0, (await stat(e14.file)).size);
    await assert.rejects(RaftStorage.open(dir, segOpts(16 * 1024)), StorageCorruptionError);
  });
});

void test('a damaged hard state written after entries of its new term is cut with a vote barrier, not refused', async () => {
  await withTempDir(async (dir) => {
    const s = await RaftStorage.open(dir, options());
    await s.load();
    await s.save(save({ entries: ents(1, 8, 1), hardState: { term: 1, vote: 'n1', commit: 4 } }));
    // A follower of the term-2 leader: the term, its vote and the entries in one synced Ready.
    await s.save(save({ entries: ents(9, 11, 2), hardState: { term: 2, vote: 'n2', commit: 6 } }));
    await s.close();
    const last = (await SegmentLog.read(dir, 0)).at(-1)!;
    const hard = last.scan.frames.filter((f) => f.type === RecordType.Hard).at(-1)!;
    const file = join(dir, logDirName, `${last.seq.toString(16).padStart(16, '0')}.seg`);
    await flipFileByte(file, hard.offset + frameHeaderBytes + 2);
    const { st, indexes } = await reopen(dir);
    assert.deepEqual(indexes, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert.deepEqual(st.hardState, { term: 1, vote: 'n1', commit: 4 });
    assert.ok(st.meta.voteBarrier >= 11, `barrier ${st.meta.voteBarrier}`);
    assert.deepEqual(
      st.meta.repairs.map((r) => [r.torn, r.truncatedFrom]),
      [[false, 9]],
    );
    const again = await reopen(dir);
    assert.deepEqual(again.st.meta.repairs, []);
    assert.deepEqual(again.indexes, [1, 2, 3, 4, 5, 6, 7, 8]);
  });
});
