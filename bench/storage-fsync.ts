// Synced-save latency of the Raft storage in each layout — the append-only log (format 2, what
// nodes run) and LevelDB alone (format 1) — one Ready with 1 entry, and one with 64 entries, each
// written with a hard state as one synced write, 500 times; then a Ready that moves only the commit
// index (not synced). A raw append+fdatasync of the same number of bytes to a plain file in the same
// directory is the baseline (what the disk itself costs, an append that grows the file).
// Run: npx tsx bench/storage-fsync.ts   (prints JSON; times in ms)
import { mkdtemp, rm } from 'node:fs/promises';
import { closeSync, fdatasyncSync, openSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EntryKind, type Entry } from '../coordinator/raft/index.js';
import { LevelRaftStorage, RaftStorage } from '../coordinator/storage/index.js';
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

type Layout = typeof RaftStorage | typeof LevelRaftStorage;

async function benchStorage(
  layout: Layout,
  dir: string,
  perBatch: number,
): Promise<{ save: Summary; commitOnly: Summary; batchBytes: number }> {
  let batchBytes = 0;
  const s = await layout.open(dir, {
    nodeId: 'n1',
    clusterId: 'bench',
    onSync: (_ms, bytes) => (batchBytes = bytes),
    logger: { warn: () => undefined },
  });
  await s.load();
  const data = new Uint8Array(entryBytes).map((_, i) => i & 0xff);
  const samples: number[] = [];
  const commitOnly: number[] = [];
  let next = 1;
  for (let it = 0; it < iterations + 20; it++) {
    const entries: Entry[] = [];
    for (let i = 0; i < perBatch; i++) entries.push({ index: next + i, term: 1, kind: EntryKind.Normal, data });
    next += perBatch;
    const t0 = performance.now();
    await s.save({
      entries,
      hardState: { term: 1, vote: 'n1', commit: next - 1 - perBatch },
      snapshot: null,
      mustSync: true,
    });
    const t1 = performance.now();
    await s.save({
      entries: [],
      hardState: { term: 1, vote: 'n1', commit: next - 1 },
      snapshot: null,
      mustSync: false,
    });
    if (it >= 20) {
      // the first 20 warm up
      samples.push(t1 - t0);
      commitOnly.push(performance.now() - t1);
    }
  }
  await s.close();
  return { save: summarize(samples), commitOnly: summarize(commitOnly), batchBytes };
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
  const layouts: Record<string, unknown> = {};
  for (const [name, layout] of [
    ['log (format 2)', RaftStorage],
    ['LevelDB (format 1)', LevelRaftStorage],
  ] as const) {
    const one = await benchStorage(layout, join(base, `${layout.name}-one`), 1);
    const many = await benchStorage(layout, join(base, `${layout.name}-many`), 64);
    const rawOne = benchRawFsync(join(base, `${layout.name}-raw-one`), one.batchBytes);
    const rawMany = benchRawFsync(join(base, `${layout.name}-raw-many`), many.batchBytes);
    layouts[name] = {
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
      commitOnlySave: one.commitOnly,
    };
  }
  console.log(
    JSON.stringify(
      {
        bench: 'storage-fsync',
        node: process.version,
        crc32: crc32IsNative ? 'node:zlib' : 'portable',
        iterations,
        entryBytes,
        unit: 'ms',
        layouts,
      },
      null,
      2,
    ),
  );
} finally {
  await rm(base, { recursive: true, force: true });
}
