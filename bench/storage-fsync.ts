// Synced-save latency of the LevelDB Raft storage: one Ready with 1 entry, and one with 64 entries,
// each written with a hard state as one synced batch, 500 times. A raw append+fdatasync of the same
// number of bytes to a plain file in the same directory is the baseline (what the disk itself costs).
// Run: npx tsx bench/storage-fsync.ts   (prints JSON; times in ms)
import { mkdtemp, rm } from 'node:fs/promises';
import { closeSync, fdatasyncSync, openSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EntryKind, type Entry } from '../coordinator/raft/index.js';
import { LevelRaftStorage } from '../coordinator/storage/index.js';
import { crc32IsNative } from '../coordinator/storage/crc32.js';

const iterations = 500;
const entryBytes = 256;

interface Summary {
  p50: number;
  p99: number;
  mean: number;
  max: number;
}

function summarize(samples: number[]): Summary {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
  const round = (x: number) => Math.round(x * 1000) / 1000;
  return {
    p50: round(at(0.5)),
    p99: round(at(0.99)),
    mean: round(s.reduce((a, b) => a + b, 0) / s.length),
    max: round(s.at(-1) ?? NaN),
  };
}

async function benchStorage(dir: string, perBatch: number): Promise<{ save: Summary; batchBytes: number }> {
  let batchBytes = 0;
  const s = await LevelRaftStorage.open(dir, {
    nodeId: 'n1',
    clusterId: 'bench',
    onSync: (_ms, bytes) => (batchBytes = bytes),
    logger: { warn: () => undefined },
  });
  await s.load();
  const data = new Uint8Array(entryBytes).map((_, i) => i & 0xff);
  const samples: number[] = [];
  let next = 1;
  for (let it = 0; it < iterations + 20; it++) {
    const entries: Entry[] = [];
    for (let i = 0; i < perBatch; i++) entries.push({ index: next + i, term: 1, kind: EntryKind.Normal, data });
    next += perBatch;
    const t0 = performance.now();
    await s.save({ entries, hardState: { term: 1, vote: 'n1', commit: next - 1 }, snapshot: null, mustSync: true });
    if (it >= 20) samples.push(performance.now() - t0); // the first 20 warm up
  }
  await s.close();
  return { save: summarize(samples), batchBytes };
}

function benchRawFsync(path: string, bytes: number): Summary {
  const fd = openSync(path, 'a');
  const buf = new Uint8Array(bytes).fill(7);
  const samples: number[] = [];
  for (let it = 0; it < iterations + 20; it++) {
    const t0 = performance.now();
    writeSync(fd, buf);
    fdatasyncSync(fd);
    if (it >= 20) samples.push(performance.now() - t0);
  }
  closeSync(fd);
  return summarize(samples);
}

const base = await mkdtemp(join(tmpdir(), 'cellquota-bench-storage-'));
try {
  const one = await benchStorage(join(base, 'one'), 1);
  const many = await benchStorage(join(base, 'many'), 64);
  const rawOne = benchRawFsync(join(base, 'raw-one'), one.batchBytes);
  const rawMany = benchRawFsync(join(base, 'raw-many'), many.batchBytes);
  console.log(
    JSON.stringify(
      {
        bench: 'storage-fsync',
        node: process.version,
        crc32: crc32IsNative ? 'node:zlib' : 'portable',
        iterations,
        entryBytes,
        unit: 'ms',
        syncedSave1Entry: {
          ...one.save,
          batchBytes: one.batchBytes,
          rawFdatasyncBaseline: rawOne,
          ratioP50: Math.round((one.save.p50 / rawOne.p50) * 100) / 100,
        },
        syncedSave64Entries: {
          ...many.save,
          batchBytes: many.batchBytes,
          rawFdatasyncBaseline: rawMany,
          ratioP50: Math.round((many.save.p50 / rawMany.p50) * 100) / 100,
        },
      },
      null,
      2,
    ),
  );
} finally {
  await rm(base, { recursive: true, force: true });
}
