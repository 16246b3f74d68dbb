// Durable Raft storage, format 2: the log entries and the hard state in an append-only log of
// preallocated segment files (log-segments.ts, CRC-framed records: log-frames.ts), the node's
// identity and the latest snapshot in LevelDB beside it (classic-level).
//
// Why not LevelDB alone (format 1, raft-storage-level.ts): a synced LevelDB batch appends to
// LevelDB's own log, a file that grows, so every fdatasync also commits the file's new size
// through the filesystem journal, and LevelDB copies each batch into its memtable and later
// compacts it. `npx tsx bench/storage-fsync.ts` measures both layouts beside a raw fdatasync.
//
// One Raft Ready = one write of its records (entries, then the hard state) to the active segment,
// fdatasync'd when the Ready says mustSync, so term, vote and entries are on disk before the caller
// sends the messages that depend on them. An installed snapshot starts a new segment, then LevelDB
// records the snapshot and the new segment as where the log starts, in one synced batch — the point
// where the old log stops counting — then the Ready's records follow in the new segment.
// A compaction stores the snapshot and moves the log's start past segments holding only entries
// below `keepFrom`, in one synced batch, then deletes them.
//
// At open the log is replayed (a record for index i drops every stored entry at or above i, as a
// save does) and checked:
//   - a torn write (log-frames.ts: cut off by the end of the file, or a sector of it never
//     written, with no valid record after it) at the end of the log: it was never synced; the tail is
//     cut there (zeroed), reported in meta.repairs (torn: true) and the log, and no vote barrier is set;
//   - any other bad record, or an impossible one (storage-checks.ts), strictly above the commit
//     index: it may have been synced and acknowledged. The tail is cut there and meta records a
//     vote barrier at the highest index stored beyond it (read by skipping the bad record), exactly
//     as format 1 does (README.md); entries above the recovered hard state's term go with the cut;
//     a segment of zeros is damage too unless it is an unused spare (isSpare);
//   - the same at or below the commit index, a missing segment, a bad snapshot or meta
//     record, an unknown key: StorageCorruptionError.
// A format-1 directory (LevelDB only, written by earlier versions) is upgraded at open: its state,
// read and checked by LevelRaftStorage, is written to a new log, then one synced LevelDB batch
// removes the old records and marks the directory format 2. A crash before that batch leaves a
// format-1 directory, upgraded again at the next open. Earlier versions refuse a format-2 directory
// (StorageFormatError): a downgrade needs the data directory wiped and the node rejoined.
//
// Operations are serialised. A failed write leaves the storage unusable (like a failed fsync, the
// state on disk is then unknown): every later call rejects; the process should restart and reopen.
import type { Entry, HardState, Snapshot } from '../raft/index.js';
import { frameBytes, RecordType } from './log-frames.js';
import { SegmentLog, type LogRecord, type ReadSegment } from './log-segments.js';
import {
  decodeMeta,
  decodeSnapshot,
  describeKey,
  encodeMeta,
  encodeSnapshot,
  entryFromValue,
  hardStateFromValue,
  isEntryKey,
  levelFormatVersion,
  metaKey,
  packEntry,
  packHardState,
  snapKey,
  storageFormatVersion,
  unpack,
  bytesEqual,
  hardKey,
  type StoredMeta,
} from './storage-codec.js';
import { StorageCorruptionError, StorageFormatError } from './storage-errors.js';
import {
  asCorruption,
  checkCompact,
  checkIdentity,
  checkSave,
  entryProblem,
  openLevel,
  type LevelDb,
  type ReadyToPersist,
} from './storage-checks.js';
import { LevelRaftStorage } from './raft-storage-level.js';
import {
  defaultLogger,
  newIdentity,
  StorageBase,
  toMeta,
  type LevelRaftStorageOptions,
  type Loaded,
  type StorageRepair,
} from './storage-base.js';

export interface RaftStorageOptions extends LevelRaftStorageOptions {
  /** Size of a log segment file (default 64 MiB, log-segments.ts). */
  readonly segmentBytes?: number;
}

/** The smallest frame an entry can take (an empty entry at index 0, term 0). */
const minEntryFrameBytes = frameBytes(packEntry({ index: 0, term: 0, kind: 0, data: new Uint8Array(0) }).length);

const entryRecord = (e: Entry): LogRecord => ({ type: RecordType.Entry, payload: packEntry(e) });
const hardRecord = (h: HardState): LogRecord => ({ type: RecordType.Hard, payload: packHardState(h) });

export class RaftStorage extends StorageBase {
  private readonly db: LevelDb;
  private readonly log: SegmentLog;
  private logStart: number;
  /** `terms[i - first]` is stored entry i's term. */
  private terms: number[];
  /** The highest entry index written to each segment (segments without entries absent). */
  private readonly segmentTop = new Map<number, number>();
  /**
   * The hard state in memory moved (its commit index only: a Ready without mustSync) and is not
   * in the log yet: it goes with the next write (as etcd's WAL holds such a record in its buffer
   * until the next sync). Nothing waits for it: the commit index is not promised durable, and a
   * node that restarts with an older one learns it again from the leader.
   */
  private hardUnwritten = false;

  private constructor(dir: string, db: LevelDb, log: SegmentLog, opts: RaftStorageOptions, r: Replayed) {
    const first = r.entries[0]?.index ?? r.snapshot.meta.index + 1;
    super(dir, opts, {
      meta: r.meta,
      fresh: r.fresh,
      repairs: r.repairs,
      hard: r.hard,
      snapshot: r.snapshot.meta,
      first,
      last: first + r.entries.length - 1,
      loaded: {
        hardState: r.hard,
        snapshot: r.snapshot,
        entries: r.entries.filter((e) => e.index > r.snapshot.meta.index),
        meta: toMeta(r.meta, r.fresh, r.repairs),
      },
    });
    this.db = db;
    this.log = log;
    this.logStart = r.logStart;
    this.terms = r.entries.map((e) => e.term);
    for (const [seq, top] of r.segmentTop) this.segmentTop.set(seq, top);
    // Every new segment starts with the hard state as it is then (a Ready's entries often come
    // without a hard state: the replay must not find them above an older term and cut them as torn).
    log.setPreamble(() => [hardRecord(this.hard)]);
  }

  /**
   * Opens (creating if needed, upgrading a format-1 directory) the storage in `dir`, checks it,
   * cuts a torn or corrupt tail, and refuses a directory that belongs to another node or cluster.
   */
  static async open(dir: string, opts: RaftStorageOptions): Promise<RaftStorage> {
    let db = await openLevel(dir);
    let log: SegmentLog | null = null;
    try {
      const logger = opts.logger ?? defaultLogger;
      let fresh = false;
      let head = await readHead(dir, db);
      if (head === null) {
        await initialise(dir, db, opts);
        fresh = true;
        head = await readHead(dir, db);
      } else if (head.meta.format === levelFormatVersion) {
        checkIdentity(dir, head.meta, opts);
        await db.close();
        await upgrade(dir, opts);
        db = await openLevel(dir);
        head = await readHead(dir, db);
        logger.warn(
          { dir, from: levelFormatVersion, to: storageFormatVersion },
          'raft storage: data directory upgraded',
        );
      }
      if (head === null) throw new StorageCorruptionError(dir, 'meta', 'missing after initialisation');
      if (head.meta.format !== storageFormatVersion)
        throw new StorageFormatError(
          dir,
          `on-disk format ${head.meta.format}, this build reads formats ` +
            `${levelFormatVersion} and ${storageFormatVersion}`,
        );
      checkIdentity(dir, head.meta, opts);
      const opened = await SegmentLog.open(dir, head.logStart, segmentOptions(opts));
      log = opened.log;
      const r = await replay(dir, db, log, head, opened.segments, logger);
      return new RaftStorage(dir, db, log, opts, { ...r, fresh });
    } catch (err) {
      await log?.close().catch(() => undefined);
      await db.close().catch(() => undefined);
      throw asCorruption(dir, err);
    }
  }

  /** The state a (re)starting RaftNode is given: hard state, snapshot, entries after the snapshot. */
  load(): Promise<Loaded> {
    return this.run(async () => {
      const cached = this.cached;
      if (cached !== null) {
        this.cached = null;
        return cached;
      }
      const head = await readHead(this.dir, this.db);
      if (head === null) throw new StorageCorruptionError(this.dir, 'meta', 'the store is empty');
      const rp = replayLog(this.dir, head, await SegmentLog.read(this.dir, this.logStart));
      if (rp.stop !== null)
        throw new StorageCorruptionError(this.dir, `raft-log/${rp.stop.seq}@${rp.stop.offset}`, rp.stop.reason);
      const S = head.snapshot.meta.index;
      return {
        hardState: this.hard,
        snapshot: head.snapshot,
        entries: rp.entries.filter((e) => e.index > S),
        meta: this.meta(),
      };
    });
  }

  /**
   * Persists one Ready: an installed snapshot first (a new segment, then LevelDB's synced batch),
   * then the entries and the hard state as one append, fdatasync'd when rd.mustSync.
   */
  save(rd: ReadyToPersist): Promise<void> {
    return this.run(async () => {
      const next = checkSave(this.shape(), rd);
      const t0 = performance.now();
      let bytes = 0;
      const snap = rd.snapshot;
      if (snap !== null) {
        // The new segment's preamble carries the Ready's term and vote (its commit is not yet stored).
        const h = rd.hardState;
        if (h !== null) this.hard = { term: h.term, vote: h.vote, commit: this.hard.commit };
        const seq = await this.guard(() => this.log.rotate());
        bytes += await this.storeSnapshot(snap, seq);
        this.segmentTop.clear();
        this.terms = [];
        await this.guard(() => this.log.removeBelow(seq));
      }
      const records = rd.entries.map(entryRecord);
      if (rd.hardState !== null) records.push(hardRecord(rd.hardState));
      else if (this.hardUnwritten && records.length > 0) records.push(hardRecord(this.hard));
      if (snap === null && !rd.mustSync && rd.entries.length === 0) {
        // Only the commit index moved: written with the next write, not now.
        if (rd.hardState !== null) this.hardUnwritten = true;
      } else if (records.length > 0) {
        bytes += await this.guard(() => this.log.append(records, rd.mustSync));
        this.hardUnwritten = false;
      } else if (snap !== null) {
        this.hardUnwritten = false; // the new segment's preamble holds the current hard state
      }
      const e0 = rd.entries[0];
      if (e0 !== undefined) {
        const keep = e0.index - next.first;
        // Truncated in place: an append at the end (the usual case) keeps every term and copies none.
        if (keep <= 0) this.terms = [];
        else if (keep < this.terms.length) this.terms.length = keep;
        for (const e of rd.entries) this.terms.push(e.term);
        this.segmentTop.set(this.log.activeSeq, next.last);
      }
      this.first = next.first;
      this.last = next.last;
      this.snapIndex = next.snapIndex;
      this.snapTerm = next.snapTerm;
      if (rd.hardState !== null) this.hard = rd.hardState;
      this.cached = null;
      if (rd.mustSync || snap !== null) this.noteSync(performance.now() - t0, bytes);
    });
  }

  /**
   * Stores the application's snapshot (taken by RaftNode.compact) and moves the log's start past
   * the segments holding only entries below `keepFrom`, in one synced batch, then deletes them.
   * A snapshot older than the stored one is ignored (returns false).
   */
  compact(snapshot: Snapshot, keepFrom: number): Promise<boolean> {
    return this.run(async () => {
      if (!checkCompact(this.shape(), snapshot, (i) => this.termAt(i))) return false;
      const t0 = performance.now();
      const idx = snapshot.meta.index;
      const keep = Math.min(keepFrom, idx + 1);
      let start = this.log.activeSeq;
      for (const seq of this.log.segmentSeqs()) {
        if (seq >= this.logStart && seq < start && (this.segmentTop.get(seq) ?? -1) >= keep) start = seq;
      }
      const bytes = await this.storeSnapshot(snapshot, start);
      for (const seq of [...this.segmentTop.keys()]) if (seq < start) this.segmentTop.delete(seq);
      await this.guard(() => this.log.removeBelow(start));
      if (keep > this.first) {
        this.terms = this.terms.slice(Math.min(this.terms.length, keep - this.first));
        this.first = keep;
      }
      if (this.last < this.first) this.last = this.first - 1;
      this.snapIndex = idx;
      this.snapTerm = snapshot.meta.term;
      this.cached = null;
      this.noteSync(performance.now() - t0, bytes);
      return true;
    });
  }

  protected async writeMeta(m: StoredMeta): Promise<void> {
    await this.guard(() => this.db.put(metaKey, encodeMeta(m), { sync: true }));
  }

  protected async closeStores(): Promise<void> {
    // The commit index not yet in the log, written before closing — synced: a synced append syncs
    // only the pages it writes (O_DSYNC), so an unsynced record here could still be lost after the
    // next process's synced appends, leaving zeros before synced data (a log that refuses to start).
    if (this.hardUnwritten && !this.failed) await this.log.append([hardRecord(this.hard)], true).catch(() => undefined);
    this.hardUnwritten = false;
    await this.log.close().catch(() => undefined);
    await this.db.close();
  }

  // ---------------------------------------------------------------------------------------------

  private termAt(index: number): number | undefined {
    return index >= this.first && index <= this.last ? this.terms[index - this.first] : undefined;
  }

  /** The snapshot and where the log now starts, in one synced batch; returns the bytes written. */
  private async storeSnapshot(snapshot: Snapshot, logStart: number): Promise<number> {
    const value = encodeSnapshot(snapshot);
    const m: StoredMeta = { ...this.storedMeta, logStart };
    const meta = encodeMeta(m);
    await this.guard(() =>
      this.db.batch(
        [
          { type: 'put', key: snapKey, value },
          { type: 'put', key: metaKey, value: meta },
        ],
        { sync: true },
      ),
    );
    this.storedMeta = m;
    this.logStart = logStart;
    return value.length + meta.length;
  }
}

// -----------------------------------------------------------------------------------------------
// Opening: the LevelDB records, initialisation, the upgrade from format 1

interface Head {
  readonly meta: StoredMeta;
  /** A placeholder (index 0) in a format-1 directory, which is only upgraded. */
  readonly snapshot: Snapshot;
  readonly logStart: number;
}

function segmentOptions(opts: RaftStorageOptions): { segmentBytes?: number } {
  return opts.segmentBytes === undefined ? {} : { segmentBytes: opts.segmentBytes };
}

/** Reads and checks meta and snap; null for an empty store. A format-1 store is returned by its meta alone. */
async function readHead(dir: string, db: LevelDb): Promise<Head | null> {
  const raw = new Map<string, Uint8Array>();
  let legacy = false;
  for await (const [key, value] of db.iterator()) {
    if (bytesEqual(key, metaKey) || bytesEqual(key, snapKey)) raw.set(describeKey(key), value);
    else if (isEntryKey(key) || bytesEqual(key, hardKey)) legacy = true;
    else throw new StorageCorruptionError(dir, describeKey(key), 'unknown key');
  }
  const metaRaw = raw.get('meta');
  if (metaRaw === undefined) {
    if (raw.size === 0 && !legacy) return null;
    throw new StorageCorruptionError(dir, 'meta', 'missing from a non-empty store');
  }
  const meta = decodeMeta(metaRaw);
  if (!meta.ok) throw new StorageCorruptionError(dir, 'meta', meta.reason);
  const placeholder: Snapshot = {
    meta: { index: 0, term: 0, conf: { voters: [], learners: [] } },
    data: new Uint8Array(),
  };
  if (meta.value.format === levelFormatVersion) return { meta: meta.value, snapshot: placeholder, logStart: 0 };
  if (meta.value.format !== storageFormatVersion) return { meta: meta.value, snapshot: placeholder, logStart: 0 };
  if (legacy) throw new StorageCorruptionError(dir, 'log/', 'format-1 records in a format-2 store');
  const snapRaw = raw.get('snap');
  if (snapRaw === undefined) throw new StorageCorruptionError(dir, 'snap', 'missing');
  const snap = decodeSnapshot(snapRaw);
  if (!snap.ok) throw new StorageCorruptionError(dir, 'snap', snap.reason);
  if (meta.value.logStart < 1) throw new StorageCorruptionError(dir, 'meta', 'format 2 without a log start');
  return { meta: meta.value, snapshot: snap.value, logStart: meta.value.logStart };
}

/** Writes a new log (segment 1: the hard state, then `entries`), synced. */
async function writeFirstSegment(dir: string, opts: RaftStorageOptions, hard: HardState, entries: readonly Entry[]) {
  await SegmentLog.clear(dir);
  const { log } = await SegmentLog.open(dir, 1, segmentOptions(opts));
  try {
    await log.resume(1, 0, () => [hardRecord(hard)]);
    if (entries.length > 0) await log.append(entries.map(entryRecord), true);
  } finally {
    await log.close();
  }
}

async function initialise(dir: string, db: LevelDb, opts: RaftStorageOptions): Promise<void> {
  const { meta, snapshot } = newIdentity(opts, storageFormatVersion, 1);
  await writeFirstSegment(dir, opts, { term: 0, vote: null, commit: 0 }, []);
  await db.batch(
    [
      { type: 'put', key: metaKey, value: encodeMeta(meta) },
      { type: 'put', key: snapKey, value: encodeSnapshot(snapshot) },
    ],
    { sync: true },
  );
}

/**
 * Format 1 → 2: LevelRaftStorage reads and checks the directory (repairing as it always did), its
 * state goes to a new log, then one synced batch drops the format-1 records and marks format 2.
 * Entries kept below the snapshot for lagging followers are not carried over.
 */
async function upgrade(dir: string, opts: RaftStorageOptions): Promise<void> {
  const old = await LevelRaftStorage.open(dir, opts);
  let st: Loaded;
  try {
    st = await old.load();
  } finally {
    await old.close();
  }
  await writeFirstSegment(dir, opts, st.hardState, st.entries);
  const db = await openLevel(dir);
  try {
    const head = await readHead(dir, db);
    if (head === null) throw new StorageCorruptionError(dir, 'meta', 'vanished during the upgrade');
    const ops: { type: 'del'; key: Uint8Array }[] = [];
    for await (const key of db.keys()) if (isEntryKey(key) || bytesEqual(key, hardKey)) ops.push({ type: 'del', key });
    await db.batch(
      [
        ...ops,
        { type: 'put', key: metaKey, value: encodeMeta({ ...head.meta, format: storageFormatVersion, logStart: 1 }) },
      ],
      { sync: true },
    );
  } finally {
    await db.close();
  }
}

// -----------------------------------------------------------------------------------------------
// Replaying the log

interface Replayed {
  readonly meta: StoredMeta;
  readonly fresh: boolean;
  readonly repairs: StorageRepair[];
  readonly hard: HardState;
  readonly snapshot: Snapshot;
  readonly logStart: number;
  /** Stored entries, contiguous (may start at or below the snapshot index). */
  readonly entries: Entry[];
  readonly segmentTop: Map<number, number>;
}

/** Where the replay stopped at a bad or impossible record. */
interface Stop {
  readonly seq: number;
  readonly offset: number;
  /** The index the bad record held or would have held. */
  readonly index: number;
  readonly reason: string;
  readonly torn: boolean;
}

/** What a record holds, or why it cannot be one storage wrote. */
function readRecord(type: number, payload: Uint8Array): { entry?: Entry; hard?: HardState; header?: true } | string {
  if (type === RecordType.Header) return payload.length === 0 ? { header: true } : 'header record with a payload';
  const v = unpack(payload);
  if (!v.ok) return v.reason;
  if (type === RecordType.Entry) {
    const e = entryFromValue(v.value);
    return e.ok ? { entry: e.value } : e.reason;
  }
  if (type === RecordType.Hard) {
    const h = hardStateFromValue(v.value);
    return h.ok ? { hard: h.value } : h.reason;
  }
  return `unknown record type ${type}`;
}

const noSnapshot: Snapshot['meta'] = { index: -1, term: 0, conf: { voters: [], learners: [] } };

class LogReplay {
  entries: Entry[] = [];
  hard: HardState | null = null;
  readonly segmentTop = new Map<number, number>();
  stop: Stop | null = null;
  /** Where each entry's record is (to cut a log back to just before one). */
  readonly where = new WeakMap<Entry, { readonly seq: number; readonly offset: number }>();
  /** Beyond a stop: the highest entry index and the latest hard state that could still be read. */
  topBeyond = 0;
  hardBeyond: HardState | null = null;

  constructor(private readonly snapshot: Snapshot['meta']) {}

  /** Takes one record; returns why it is impossible (the replay stops there), or null. */
  take(seq: number, offset: number, type: number, payload: Uint8Array): string | null {
    const first = offset === 0;
    const r = readRecord(type, payload);
    if (typeof r === 'string') return r;
    if (first !== (r.header === true)) return first ? 'segment does not start with its header' : 'header mid-segment';
    if (r.hard !== undefined) this.hard = r.hard;
    const e = r.entry;
    if (e === undefined) return null;
    const S = this.snapshot.index;
    const head = this.entries[0];
    const prevIndex = this.entries.at(-1)?.index ?? -1;
    if (head === undefined || e.index < head.index) {
      if (e.index > S + 1) return `entry ${e.index} leaves a gap after the snapshot at ${S}`;
      this.entries = [e];
    } else if (e.index <= prevIndex) {
      this.entries.length = e.index - head.index;
      this.entries.push(e);
    } else if (e.index === prevIndex + 1) this.entries.push(e);
    else if (prevIndex < S && e.index === S + 1) this.entries = [e];
    else return `entry ${e.index} leaves a gap after ${prevIndex}`;
    // Only the order of terms here: a record may be overwritten later; the final log is checked against the
    // snapshot and the hard state once the replay is done.
    const problem = entryProblem(this.entries.at(-2), e, noSnapshot, Infinity);
    if (problem !== null) {
      this.entries.pop();
      return problem;
    }
    this.segmentTop.set(seq, Math.max(this.segmentTop.get(seq) ?? 0, e.index));
    this.where.set(e, { seq, offset });
    return null;
  }

  /** After a stop: what lies beyond (to bound what the node may have acknowledged). */
  takeBeyond(type: number, payload: Uint8Array): void {
    const r = readRecord(type, payload);
    if (typeof r === 'string') return;
    if (r.hard !== undefined) this.hardBeyond = r.hard;
    if (r.entry !== undefined) this.topBeyond = Math.max(this.topBeyond, r.entry.index);
  }
}

/** Replays the segments in order; stops at the first bad or impossible record (rp.stop). */
function replayLog(dir: string, head: Head, segments: readonly ReadSegment[]): Replay {
  const S = head.snapshot.meta.index;
  const rp = new LogReplay(head.snapshot.meta);
  const used = segments.filter((s, k) => !isSpare(s, k === segments.length - 1, segments[k - 1]));
  const lastUsed = used.at(-1)?.seq ?? head.logStart;
  let unreadableBytes = 0;
  for (const [k, seg] of used.entries()) {
    if (seg.seq !== head.logStart + k)
      throw new StorageCorruptionError(dir, `raft-log/${head.logStart + k}`, 'log segment missing');
    const { frames, beyond } = seg.scan;
    // A segment that reads as all zeros and is no spare lost what was written (maybe synced) in it.
    const lost = frames.length === 0 && seg.scan.bad === null;
    const bad = lost
      ? { offset: 0, reason: `the segment reads as all zeros (${seg.size} bytes)`, torn: false }
      : seg.scan.bad;
    if (lost) unreadableBytes += seg.size;
    if (rp.stop !== null) {
      for (const f of [...frames, ...beyond]) rp.takeBeyond(f.type, f.payload);
      unreadableBytes += seg.scan.unreadableTail;
      continue;
    }
    for (const f of frames) {
      if (rp.stop !== null) rp.takeBeyond(f.type, f.payload);
      else {
        const why = rp.take(seg.seq, f.offset, f.type, f.payload);
        if (why !== null)
          rp.stop = { seq: seg.seq, offset: f.offset, index: lastIndexOf(rp, S) + 1, reason: why, torn: false };
      }
    }
    if (bad !== null) {
      const torn = rp.stop === null && bad.torn && seg.seq === lastUsed;
      rp.stop ??= { seq: seg.seq, offset: bad.offset, index: lastIndexOf(rp, S) + 1, reason: bad.reason, torn };
      for (const f of beyond) rp.takeBeyond(f.type, f.payload);
      unreadableBytes += seg.scan.unreadableTail;
    }
  }
  return Object.assign(rp, { used, lastUsed, unreadableBytes });
}

/**
 * Whether a segment read as all zeros is an unused spare: a rotation (or a first segment) that
 * stopped before its opening records (header, hard state) were synced. It must be the last file:
 * a later segment is only created after this one was synced. And nothing can have been synced into
 * it: every write in a segment (log-segments.ts) comes after the opening write's fdatasync
 * resolved — the background zero extension is started only after that write's sync, and an
 * append only after the rotation returned — and each of them grows the file, so a file no larger
 * than its opening records held nothing but them, unsynced or lost. Those are the header and, in
 * a rotation, the hard state the previous segment ends with (synced there before the rotation);
 * its size is bounded with the previous segment's last vote and the largest term and commit.
 * Without a previous segment (the log's first) it is never a spare: the log then reads as missing.
 */
function isSpare(seg: ReadSegment, last: boolean, prev: ReadSegment | undefined): boolean {
  if (!last || prev === undefined || seg.scan.frames.length > 0 || seg.scan.bad !== null) return false;
  let vote: string | null = null;
  for (const f of [...prev.scan.frames, ...prev.scan.beyond]) {
    const r = f.type === RecordType.Hard ? readRecord(f.type, f.payload) : null;
    if (r !== null && typeof r !== 'string' && r.hard !== undefined) vote = r.hard.vote;
  }
  const widest = { term: Number.MAX_SAFE_INTEGER, vote, commit: Number.MAX_SAFE_INTEGER };
  return seg.size <= frameBytes(0) + frameBytes(packHardState(widest).length);
}

type Replay = LogReplay & {
  readonly used: readonly ReadSegment[];
  readonly lastUsed: number;
  /** Bytes beyond a damaged record no frame could be read from. */
  readonly unreadableBytes: number;
};

async function replay(
  dir: string,
  db: LevelDb,
  log: SegmentLog,
  head: Head,
  segments: readonly ReadSegment[],
  logger: { warn(fields: object, msg: string): void },
): Promise<Omit<Replayed, 'fresh'>> {
  const { snapshot } = head;
  const S = snapshot.meta.index;
  const rp = replayLog(dir, head, segments);
  const { used, lastUsed, unreadableBytes } = rp;
  if (used.length === 0) throw new StorageCorruptionError(dir, `raft-log/${head.logStart}`, 'log segment missing');
  if (rp.hard === null) throw new StorageCorruptionError(dir, `raft-log/${head.logStart}`, 'no hard state record');
  let hard: HardState = rp.hard;
  let meta = head.meta;
  const repairs: StorageRepair[] = [];
  let stop = rp.stop;
  // The hard state beyond a damaged record (it may have been synced) counts.
  const beyondHard = rp.hardBeyond;
  if (stop !== null && !stop.torn && beyondHard !== null && beyondHard.term >= hard.term) hard = beyondHard;
  // Entries above the hard state's term are above its commit index (a committed entry is never
  // overwritten, and one of a later term was written after it): of a torn write they were never
  // synced; before a damaged record (the hard state written after them lost) they go with the cut,
  // counted in the vote barrier below. Either way the log is cut at the first of them.
  let cutAt: { readonly seq: number; readonly offset: number } | undefined;
  for (let e = rp.entries.at(-1); e !== undefined && e.term > hard.term; e = rp.entries.at(-1)) {
    cutAt = rp.where.get(e);
    rp.entries.pop();
  }
  if (cutAt !== undefined && (stop === null || stop.torn))
    stop = {
      ...cutAt,
      index: lastIndexOf(rp, S) + 1,
      reason: stop?.reason ?? `entries above the hard state's term ${hard.term} with no hard state after them`,
      torn: true,
    };
  let resumeAt = { seq: lastUsed, offset: used.at(-1)?.scan.end ?? 0 };
  if (stop !== null) {
    const commit = Math.max(hard.commit, S);
    if (!stop.torn && stop.index <= commit) {
      throw new StorageCorruptionError(
        dir,
        `raft-log/${stop.seq}@${stop.offset}`,
        `${stop.reason}; it is at or below the commit index ${commit}, so committed data is lost`,
      );
    }
    const truncatedFrom = lastIndexOf(rp, S) + 1;
    if (!stop.torn) {
      // Bytes no frame could be read from may hold entries too: at most one per smallest entry frame.
      const known = Math.max(rp.topBeyond, stop.index - 1);
      const unread = Math.ceil(unreadableBytes / minEntryFrameBytes);
      meta = { ...meta, voteBarrier: Math.max(meta.voteBarrier, stop.index, known + unread) };
      await db.put(metaKey, encodeMeta(meta), { sync: true });
    }
    const repair: StorageRepair = {
      key: `raft-log/${stop.seq}@${stop.offset}`,
      reason: stop.torn ? `torn write: ${stop.reason}` : stop.reason,
      truncatedFrom,
      removedRecords: Math.max(rp.topBeyond, stop.index - 1) - truncatedFrom + 1,
      commit,
      torn: stop.torn,
    };
    logger.warn(
      { dir, ...repair, voteBarrier: meta.voteBarrier },
      stop.torn
        ? 'raft storage: torn write at the end of the log (never synced); tail cut'
        : 'raft storage: corrupt log record above the commit index; tail cut, and the node must not vote ' +
            'until its commit index reaches the vote barrier',
    );
    repairs.push(repair);
    resumeAt = cutAt ?? { seq: stop.seq, offset: stop.offset };
  }
  const lastIndex = lastIndexOf(rp, S);
  if (hard.commit > lastIndex) {
    throw new StorageCorruptionError(
      dir,
      `log/${lastIndex + 1}`,
      `missing, but the hard state's commit index is ${hard.commit}: ` +
        `committed entries ${lastIndex + 1}..${hard.commit} are lost`,
    );
  }
  for (const [k, e] of rp.entries.entries()) {
    const why = entryProblem(rp.entries[k - 1], e, snapshot.meta, hard.term);
    if (why !== null) throw new StorageCorruptionError(dir, `log/${e.index}`, why);
  }
  const finalHard = hard;
  await log.resume(resumeAt.seq, resumeAt.offset, () => [hardRecord(finalHard)]);
  // A cut tail (or a hard state read beyond a corrupt record) is written back as the log's last word.
  if (stop !== null && resumeAt.offset > 0) await log.append([hardRecord(hard)], true);
  return { meta, repairs, hard, snapshot, logStart: head.logStart, entries: rp.entries, segmentTop: rp.segmentTop };
}

function lastIndexOf(rp: LogReplay, S: number): number {
  return Math.max(S, rp.entries.at(-1)?.index ?? 0);
}
