// Helpers shared by the storage tests: temp dirs, an in-memory model of the storage contract,
// entry builders, and raw access to the LevelDB underneath (to plant torn writes and corruption).
import { mkdtemp, open, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import assert from 'node:assert/strict';
import { ClassicLevel } from 'classic-level';
import {
  EntryKind,
  type Entry,
  type HardState,
  type RaftInitialState,
  type Snapshot,
} from '../../../coordinator/raft/index.js';
import {
  LevelRaftStorage,
  RaftStorage,
  type LevelRaftStorageOptions,
  type ReadyToPersist,
  type StorageLogger,
} from '../../../coordinator/storage/index.js';
import { logDirName, SegmentLog } from '../../../coordinator/storage/log-segments.js';
import { frameHeaderBytes, RecordType } from '../../../coordinator/storage/log-frames.js';
import { entryFromValue, unpack } from '../../../coordinator/storage/storage-codec.js';

/** Both on-disk layouts: the append-only log beside LevelDB (format 2, what nodes run) and LevelDB alone (format 1). */
export const layouts = [
  {
    name: 'log + LevelDB (format 2)',
    /** Small segments, so that tests rotate and compact across segment files. */
    open: (dir: string, o: LevelRaftStorageOptions) => RaftStorage.open(dir, { ...o, segmentBytes: 1024 }),
    trailingExact: false,
  },
  {
    name: 'LevelDB (format 1)',
    open: (dir: string, o: LevelRaftStorageOptions) => LevelRaftStorage.open(dir, o),
    trailingExact: true,
  },
] as const;

export async function withTempDir<T>(fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), 'cellquota-storage-'));
  try {
    return await fn(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

export const bootstrapData = new Uint8Array([0x91, 0x00]);

/** Collects what the storage logs, and keeps test output quiet. */
export function captureLogger(): StorageLogger & { readonly lines: string[] } {
  const lines: string[] = [];
  return { lines, warn: (fields, msg) => void lines.push(`${msg} ${JSON.stringify(fields)}`) };
}

export function options(over: Partial<LevelRaftStorageOptions> = {}): LevelRaftStorageOptions {
  return {
    nodeId: 'n1',
    clusterId: 'test-cluster',
    bootstrap: { conf: { voters: ['n1', 'n2', 'n3'], learners: [] }, data: bootstrapData },
    logger: captureLogger(),
    ...over,
  };
}

export function entryData(index: number, term: number, size = 16): Uint8Array {
  const head = new TextEncoder().encode(`${index}:${term}:`);
  const out = new Uint8Array(Math.max(size, head.length));
  out.set(head);
  for (let i = head.length; i < out.length; i++) out[i] = (index * 31 + term * 7 + i) & 0xff;
  return out;
}

export function ent(index: number, term: number, kind: EntryKind = EntryKind.Normal, size = 16): Entry {
  return { index, term, kind, data: entryData(index, term, size) };
}

/** Entries from..to inclusive, all of `term`. */
export function ents(from: number, to: number, term: number): Entry[] {
  const out: Entry[] = [];
  for (let i = from; i <= to; i++) out.push(ent(i, term));
  return out;
}

export function save(p: Partial<ReadyToPersist>): ReadyToPersist {
  return { hardState: null, entries: [], snapshot: null, mustSync: true, ...p };
}

export function snap(
  index: number,
  term: number,
  voters: string[] = ['n1', 'n2', 'n3'],
  data = new Uint8Array([index & 0xff, 7]),
): Snapshot {
  return { meta: { index, term, conf: { voters, learners: [] } }, data };
}

/** Opens the raw LevelDB under a (closed) storage directory. */
export async function withRawDb(
  dir: string,
  fn: (db: ClassicLevel<Uint8Array, Uint8Array>) => Promise<void>,
): Promise<void> {
  const db = new ClassicLevel<Uint8Array, Uint8Array>(dir, { keyEncoding: 'view', valueEncoding: 'view' });
  await db.open();
  try {
    await fn(db);
  } finally {
    await db.close();
  }
}

/** The model of what storage must hold (the same contract as testkit/raft/sim-disk.ts, without crashes). */
export class StorageModel {
  hard: HardState = { term: 0, vote: null, commit: 0 };
  snapshot: Snapshot;
  /** Stored entries, contiguous; may start at or below the snapshot index (trailing). */
  entries: Entry[] = [];

  constructor(initial: Snapshot) {
    this.snapshot = initial;
  }

  clone(): StorageModel {
    const m = new StorageModel(this.snapshot);
    m.hard = this.hard;
    m.entries = [...this.entries];
    return m;
  }

  lastIndex(): number {
    return Math.max(this.snapshot.meta.index, this.entries.at(-1)?.index ?? 0);
  }

  termAt(index: number): number | undefined {
    if (index === this.snapshot.meta.index) return this.snapshot.meta.term;
    return this.entries.find((e) => e.index === index)?.term;
  }

  save(rd: ReadyToPersist): void {
    if (rd.snapshot !== null) {
      this.snapshot = rd.snapshot;
      this.entries = [];
    }
    const e0 = rd.entries[0];
    if (e0 !== undefined) {
      let kept = this.entries.filter((e) => e.index < e0.index);
      if ((kept.at(-1)?.index ?? e0.index - 1) !== e0.index - 1) kept = [];
      this.entries = [...kept, ...rd.entries];
    }
    if (rd.hardState !== null) this.hard = rd.hardState;
  }

  compact(snapshot: Snapshot, keepFrom: number): boolean {
    if (snapshot.meta.index < this.snapshot.meta.index) return false;
    const keep = Math.min(keepFrom, snapshot.meta.index + 1);
    this.snapshot = snapshot;
    this.entries = this.entries.filter((e) => e.index >= keep);
    return true;
  }

  load(): RaftInitialState {
    const s = this.snapshot.meta.index;
    return { hardState: this.hard, snapshot: this.snapshot, entries: this.entries.filter((e) => e.index > s) };
  }
}

/** Asserts a loaded state equals the expected one (comparing plain data, not object identity). */
export function assertSameState(actual: RaftInitialState, expected: RaftInitialState, where = ''): void {
  const plain = (s: RaftInitialState) => ({
    hardState: { ...s.hardState },
    snapshot: {
      meta: {
        index: s.snapshot.meta.index,
        term: s.snapshot.meta.term,
        conf: { voters: [...s.snapshot.meta.conf.voters], learners: [...s.snapshot.meta.conf.learners] },
      },
      data: [...s.snapshot.data],
    },
    entries: s.entries.map((e) => ({ index: e.index, term: e.term, kind: e.kind, data: [...e.data] })),
  });
  assert.deepEqual(plain(actual), plain(expected), where);
}

/** Where entry `index` was last written in the append-only log of a (closed) format-2 directory. */
export async function findLogEntry(
  dir: string,
  index: number,
): Promise<{ file: string; offset: number; end: number; bodyEnd: number }> {
  let found: { file: string; offset: number; end: number; bodyEnd: number } | null = null;
  for (const seg of await SegmentLog.read(dir, 0)) {
    for (const f of seg.scan.frames) {
      if (f.type !== RecordType.Entry) continue;
      const v = unpack(f.payload);
      const e = v.ok ? entryFromValue(v.value) : null;
      if (e?.ok === true && e.value.index === index) {
        const file = join(dir, logDirName, `${seg.seq.toString(16).padStart(16, '0')}.seg`);
        found = { file, offset: f.offset, end: f.end, bodyEnd: f.offset + frameHeaderBytes + 2 + f.payload.length };
      }
    }
  }
  if (found === null) throw new Error(`entry ${index} is not in the log at ${dir}`);
  return found;
}

/** XORs the byte at `at` (absolute offset) of `file` with `mask`. */
export async function flipFileByte(file: string, at: number, mask = 0x5a): Promise<void> {
  const fh = await open(file, 'r+');
  try {
    const b = new Uint8Array(1);
    await fh.read(b, 0, 1, at);
    b[0] = (b[0] ?? 0) ^ mask;
    await fh.write(b, 0, 1, at);
  } finally {
    await fh.close();
  }
}
