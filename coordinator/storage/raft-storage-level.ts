// Durable Raft storage on LevelDB (classic-level).
//
// One Raft Ready = one atomic LevelDB batch (snapshot, then entries, then hard state), written with
// `sync: true` when the Ready says mustSync, so term, vote and entries are on disk before the
// caller sends the messages that depend on them. Every record carries a CRC-32 (storage-codec.ts
// has the key layout and framing). At open the whole store is read and checked:
//   - a bad record or a gap in the log strictly above the commit index: LevelDB batches are atomic,
//     so this is corruption, not a torn write, and the lost entries may have been acknowledged and
//     counted toward a commit. The tail is truncated and, in the same synced batch, meta records a
//     vote barrier (the highest index that was stored): the node must not vote until its commit
//     index has reached it, i.e. until a leader has given it back every entry it may have
//     acknowledged (protocol-aware recovery, Alagappan et al., FAST '18). Reported in
//     meta.repairs and through the logger;
//   - a bad record or gap at or below the commit index, an unreadable hard state, snapshot or meta
//     record, or an unknown key is fatal: StorageCorruptionError, naming the key.
// A new (empty) directory is initialised, atomically, with the node's identity (meta), a conf-only
// snapshot at index 0 and an empty hard state.
//
// Operations are serialised: each waits for the previous one, so batches reach LevelDB in call
// order. A failed write leaves the storage unusable (like a failed fsync, the state on disk is then
// unknown): every later call rejects; the process should restart and reopen.
import { randomBytes as cryptoRandomBytes } from 'node:crypto';
import type { ConfState, Entry, HardState, NodeId, RaftInitialState, Snapshot } from '../raft/index.js';
import {
  decodeEntry,
  decodeHardState,
  decodeMeta,
  decodeSnapshot,
  describeKey,
  encodeEntry,
  encodeHardState,
  encodeMeta,
  encodeSnapshot,
  entryIndexOfKey,
  entryKey,
  hardKey,
  isEntryKey,
  metaKey,
  snapKey,
  levelFormatVersion,
  bytesEqual,
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
  type LogShape,
  type ReadyToPersist,
} from './storage-checks.js';

export { StorageCorruptionError, StorageFormatError, StorageIdentityError } from './storage-errors.js';

/** A corrupt log tail above the commit index found at open and removed. */
export interface StorageRepair {
  /** The first key found bad or missing (e.g. 'log/42'). */
  readonly key: string;
  /** Why: the checksum failure, or the gap. */
  readonly reason: string;
  /** Entries at or above this index were deleted. */
  readonly truncatedFrom: number;
  /** How many stored entry records were deleted. */
  readonly removedRecords: number;
  /** The commit index (the hard state's, or the snapshot's if higher) the tail lay above. */
  readonly commit: number;
  /** Format 2 only: a torn write at the end of the log, never synced (no vote barrier needed). */
  readonly torn?: boolean;
}

/** The node's identity as this data directory records it, and what opening it found. */
export interface StorageMeta {
  readonly clusterId: string;
  readonly nodeId: NodeId;
  /** 128 random bits (hex), new each time the directory is initialised: a wiped and recreated dir gets a new one. */
  readonly incarnation: string;
  /** ISO 8601 time the directory was initialised. */
  readonly createdAt: string;
  /** True when this open created the directory's state (nothing was there before). */
  readonly fresh: boolean;
  /**
   * False until the caller calls confirmIncarnation(). A node whose incarnation is unconfirmed and
   * whose id the cluster already knows may have forgotten votes it gave (its directory was wiped):
   * it must not vote until it has caught up. This survives restarts, so a crash between a fresh
   * start and the caller's decision does not turn the node into one that "remembers".
   */
  readonly incarnationConfirmed: boolean;
  /** Log tails removed when the directory was opened (empty normally). */
  readonly repairs: readonly StorageRepair[];
  /**
   * 0, or the index the node's commit index must reach before it may vote: a repair removed entries
   * up to this index that it may have acknowledged. Survives restarts until clearVoteBarrier().
   */
  readonly voteBarrier: number;
}

export interface StorageLogger {
  warn(fields: object, msg: string): void;
}

export interface LevelRaftStorageOptions {
  readonly nodeId: NodeId;
  readonly clusterId: string;
  /**
   * Used only when the directory is new: the conf-only snapshot at index 0 it starts from (a
   * bootstrapping member lists the initial voters; a node that will join by conf change passes an
   * empty ConfState). Default: no voters, no learners, empty data.
   */
  readonly bootstrap?: { readonly conf: ConfState; readonly data: Uint8Array };
  /** Random source for the incarnation (default node:crypto randomBytes). */
  readonly randomBytes?: (n: number) => Uint8Array;
  /** Wall clock in ms since the epoch, for createdAt (default Date.now). */
  readonly now?: () => number;
  /** Called after every synced batch with its duration (ms, wall time of the write + fsync) and size. */
  readonly onSync?: (ms: number, bytes: number) => void;
  /** Where repairs are reported (default: console.warn). pino's logger fits. */
  readonly logger?: StorageLogger;
}

export type { ReadyToPersist } from './storage-checks.js';

export interface SyncStat {
  readonly ms: number;
  readonly bytes: number;
}

export interface StorageStats {
  readonly hardState: HardState;
  readonly snapshotIndex: number;
  readonly snapshotTerm: number;
  /**
   * Stored entry records span [firstStoredIndex, lastStoredIndex] (empty when last < first); may start at or below
   * the snapshot.
   */
  readonly firstStoredIndex: number;
  readonly lastStoredIndex: number;
  readonly lastSync: SyncStat | null;
}

type Loaded = RaftInitialState & { readonly meta: StorageMeta };

type DB = LevelDb;
type BatchOp = { type: 'put'; key: Uint8Array; value: Uint8Array } | { type: 'del'; key: Uint8Array };

const defaultBootstrap = { conf: { voters: [], learners: [] }, data: new Uint8Array(0) } as const;
const defaultLogger: StorageLogger = {
  warn: (fields, msg) => console.warn(`${msg} ${JSON.stringify(fields)}`),
};

export class LevelRaftStorage {
  readonly dir: string;
  private readonly db: DB;
  private readonly opts: LevelRaftStorageOptions;
  private readonly logger: StorageLogger;

  private storedMeta: StoredMeta;
  private fresh: boolean;
  private repairs: StorageRepair[] = [];
  private hard: HardState;
  private snapIndex: number;
  private snapTerm: number;
  /** Stored entry records are exactly [first, last]; empty when last < first. */
  private first: number;
  private last: number;

  /** What open() read, handed out by the first load() unless something was written since. */
  private cached: Loaded | null;
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;
  private failure: Error | null = null;
  private lastSyncStat: SyncStat | null = null;

  private constructor(dir: string, db: DB, opts: LevelRaftStorageOptions, loaded: Loaded, storedMeta: StoredMeta) {
    this.dir = dir;
    this.db = db;
    this.opts = opts;
    this.logger = opts.logger ?? defaultLogger;
    this.storedMeta = storedMeta;
    this.fresh = loaded.meta.fresh;
    this.repairs = [...loaded.meta.repairs];
    this.hard = loaded.hardState;
    this.snapIndex = loaded.snapshot.meta.index;
    this.snapTerm = loaded.snapshot.meta.term;
    this.first = 0;
    this.last = -1;
    this.cached = loaded;
  }

  /**
   * Opens (creating if needed) the storage in `dir`, checks it, repairs a torn tail, and refuses a
   * directory that belongs to another node or cluster.
   */
  static async open(dir: string, opts: LevelRaftStorageOptions): Promise<LevelRaftStorage> {
    const db = await openLevel(dir);
    try {
      const logger = opts.logger ?? defaultLogger;
      const identity = { nodeId: opts.nodeId, clusterId: opts.clusterId };
      let scan = await scanStore(dir, db, logger, identity);
      let fresh = false;
      if (scan === null) {
        await initialise(db, opts);
        fresh = true;
        scan = await scanStore(dir, db, logger, identity);
        if (scan === null) throw new Error(`raft storage at ${dir}: initialisation wrote nothing`);
      }
      const m = scan.storedMeta;
      const loaded: Loaded = { ...scan.state, meta: toMeta(m, fresh, scan.repairs) };
      const s = new LevelRaftStorage(dir, db, opts, loaded, m);
      s.first = scan.first;
      s.last = scan.last;
      return s;
    } catch (err) {
      await db.close().catch(() => undefined);
      throw err;
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
      const scan = await scanStore(this.dir, this.db, this.logger, this.opts);
      if (scan === null) throw new StorageCorruptionError(this.dir, 'meta', 'the store is empty');
      this.repairs.push(...scan.repairs);
      this.storedMeta = scan.storedMeta;
      this.first = scan.first;
      this.last = scan.last;
      return { ...scan.state, meta: this.meta() };
    });
  }

  /** The identity and what opening found. */
  meta(): StorageMeta {
    return toMeta(this.storedMeta, this.fresh, this.repairs);
  }

  /**
   * Persists one Ready as one atomic batch: the snapshot (an installed snapshot replaces the whole
   * log), then the entries (dropping stored entries at or above entries[0].index), then the hard
   * state. Synced when rd.mustSync. Resolves once LevelDB has accepted (and, if synced, fsync'd) it.
   */
  save(rd: ReadyToPersist): Promise<void> {
    return this.run(async () => {
      checkSave(this.shape(), rd);
      const ops: BatchOp[] = [];
      let { first, last, snapIndex, snapTerm } = this;
      const snap = rd.snapshot;
      if (snap !== null) {
        ops.push({ type: 'put', key: snapKey, value: encodeSnapshot(snap) });
        for (let i = first; i <= last; i++) ops.push({ type: 'del', key: entryKey(i) });
        snapIndex = snap.meta.index;
        snapTerm = snap.meta.term;
        first = snapIndex + 1;
        last = snapIndex;
      }
      const e0 = rd.entries[0];
      if (e0 !== undefined) {
        if (last < first || e0.index > last + 1) {
          // Nothing stored to continue: whatever is stored lies below the snapshot, drop it.
          for (let i = first; i <= last; i++) ops.push({ type: 'del', key: entryKey(i) });
          first = e0.index;
        }
        for (const e of rd.entries) ops.push({ type: 'put', key: entryKey(e.index), value: encodeEntry(e) });
        const newLast = e0.index + rd.entries.length - 1;
        for (let i = newLast + 1; i <= last; i++) ops.push({ type: 'del', key: entryKey(i) });
        last = newLast;
      }
      const hard = rd.hardState;
      if (hard !== null) {
        ops.push({ type: 'put', key: hardKey, value: encodeHardState(hard) });
      }
      if (ops.length === 0) return;
      await this.write(ops, rd.mustSync);
      this.first = first;
      this.last = last;
      this.snapIndex = snapIndex;
      this.snapTerm = snapTerm;
      if (hard !== null) this.hard = hard;
    });
  }

  /**
   * Stores the application's snapshot (taken by RaftNode.compact) and deletes entries below
   * `keepFrom` in the same synced batch; entries in [keepFrom, snapshot index] stay as trailing
   * entries for lagging followers. A snapshot older than the stored one is ignored (returns false).
   */
  compact(snapshot: Snapshot, keepFrom: number): Promise<boolean> {
    return this.run(async () => {
      const idx = snapshot.meta.index;
      let stored: number | undefined;
      if (idx >= this.first && idx <= this.last) {
        const raw = await this.db.get(entryKey(idx));
        const e = raw === undefined ? undefined : decodeEntry(entryKey(idx), raw);
        stored = e?.ok === true ? e.value.term : undefined;
      }
      if (!checkCompact(this.shape(), snapshot, (i) => (i === idx ? stored : undefined))) return false;
      const keep = Math.min(keepFrom, idx + 1);
      const ops: BatchOp[] = [{ type: 'put', key: snapKey, value: encodeSnapshot(snapshot) }];
      let { first, last } = this;
      const delTo = Math.min(keep - 1, last);
      for (let i = first; i <= delTo; i++) ops.push({ type: 'del', key: entryKey(i) });
      if (keep > first) first = keep;
      if (last < first) last = first - 1;
      await this.write(ops, true);
      this.first = first;
      this.last = last;
      this.snapIndex = idx;
      this.snapTerm = snapshot.meta.term;
      return true;
    });
  }

  /** Records, durably, that the caller has decided this incarnation may vote (see StorageMeta). */
  confirmIncarnation(): Promise<void> {
    return this.run(async () => {
      if (this.storedMeta.confirmed) return;
      const m: StoredMeta = { ...this.storedMeta, confirmed: true };
      await this.write([{ type: 'put', key: metaKey, value: encodeMeta(m) }], true);
      this.storedMeta = m;
    });
  }

  /**
   * Lifts the vote barrier, durably, once the node's commit index (learned from a leader) has
   * reached it: its log again holds every entry it may have acknowledged before the repair.
   */
  clearVoteBarrier(commit: number): Promise<void> {
    return this.run(async () => {
      const barrier = this.storedMeta.voteBarrier;
      if (barrier === 0) return;
      if (commit < barrier)
        throw new Error(`clearVoteBarrier: commit ${commit} has not reached the vote barrier ${barrier}`);
      const m: StoredMeta = { ...this.storedMeta, voteBarrier: 0 };
      await this.write([{ type: 'put', key: metaKey, value: encodeMeta(m) }], true);
      this.storedMeta = m;
    });
  }

  /** The last synced batch's duration and size (null before the first). */
  get lastSync(): SyncStat | null {
    return this.lastSyncStat;
  }

  stats(): StorageStats {
    return {
      hardState: this.hard,
      snapshotIndex: this.snapIndex,
      snapshotTerm: this.snapTerm,
      firstStoredIndex: this.first,
      lastStoredIndex: this.last,
      lastSync: this.lastSyncStat,
    };
  }

  /** Waits for pending operations, then closes the database. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.queue.catch(() => undefined);
    await this.db.close();
  }

  // ---------------------------------------------------------------------------------------------

  private shape(): LogShape {
    return { first: this.first, last: this.last, snapIndex: this.snapIndex, snapTerm: this.snapTerm };
  }

  private run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(new Error(`raft storage at ${this.dir} is closed`));
    const next = this.queue.then(() => {
      if (this.failure !== null)
        throw new Error(`raft storage at ${this.dir} failed earlier and must be reopened: ${this.failure.message}`, {
          cause: this.failure,
        });
      return fn();
    });
    this.queue = next.catch(() => undefined);
    return next;
  }

  private async write(ops: BatchOp[], sync: boolean): Promise<void> {
    this.cached = null;
    let bytes = 0;
    for (const op of ops) bytes += op.key.length + (op.type === 'put' ? op.value.length : 0);
    const t0 = performance.now();
    try {
      await this.db.batch(ops, { sync });
    } catch (err) {
      this.failure = err instanceof Error ? err : new Error(String(err));
      throw err;
    }
    if (sync) {
      const ms = performance.now() - t0;
      this.lastSyncStat = { ms, bytes };
      this.opts.onSync?.(ms, bytes);
    }
  }
}

// -----------------------------------------------------------------------------------------------
// Initialisation and the check at open

async function initialise(db: DB, opts: LevelRaftStorageOptions): Promise<void> {
  const random = opts.randomBytes ?? ((n: number) => cryptoRandomBytes(n));
  const bytes = random(16);
  if (bytes.length !== 16) throw new Error('randomBytes(16) returned the wrong number of bytes');
  const meta: StoredMeta = {
    format: levelFormatVersion,
    clusterId: opts.clusterId,
    nodeId: opts.nodeId,
    incarnation: Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('hex'),
    createdAt: new Date((opts.now ?? Date.now)()).toISOString(),
    confirmed: false,
    voteBarrier: 0,
    logStart: 0,
  };
  const boot = opts.bootstrap ?? defaultBootstrap;
  const snapshot: Snapshot = {
    meta: { index: 0, term: 0, conf: { voters: [...boot.conf.voters], learners: [...boot.conf.learners] } },
    data: boot.data,
  };
  const hard: HardState = { term: 0, vote: null, commit: 0 };
  await db.batch(
    [
      { type: 'put', key: metaKey, value: encodeMeta(meta) },
      { type: 'put', key: snapKey, value: encodeSnapshot(snapshot) },
      { type: 'put', key: hardKey, value: encodeHardState(hard) },
    ],
    { sync: true },
  );
}

interface Scan {
  readonly storedMeta: StoredMeta;
  readonly state: RaftInitialState;
  readonly first: number;
  readonly last: number;
  readonly repairs: StorageRepair[];
}

interface Problem {
  /** The first index that is bad or missing. */
  readonly index: number;
  readonly key: string;
  readonly reason: string;
}

/**
 * Reads and checks the whole store; repairs a torn tail. Null if the store is empty. The identity is
 * checked before anything is repaired: a directory that is not ours is never written to.
 */
async function scanStore(
  dir: string,
  db: DB,
  logger: StorageLogger,
  identity: { readonly nodeId: NodeId; readonly clusterId: string },
): Promise<Scan | null> {
  let metaRaw: Uint8Array | undefined;
  let hardRaw: Uint8Array | undefined;
  let snapRaw: Uint8Array | undefined;
  const entryRecords: { key: Uint8Array; value: Uint8Array }[] = [];
  try {
    for await (const [key, value] of db.iterator()) {
      if (isEntryKey(key)) {
        if (entryIndexOfKey(key) === undefined)
          throw new StorageCorruptionError(dir, describeKey(key), 'malformed log key');
        entryRecords.push({ key, value });
      } else if (bytesEqual(key, metaKey)) metaRaw = value;
      else if (bytesEqual(key, hardKey)) hardRaw = value;
      else if (bytesEqual(key, snapKey)) snapRaw = value;
      else throw new StorageCorruptionError(dir, describeKey(key), 'unknown key');
    }
  } catch (err) {
    throw asCorruption(dir, err);
  }
  if (metaRaw === undefined && hardRaw === undefined && snapRaw === undefined && entryRecords.length === 0) return null;

  if (metaRaw === undefined) throw new StorageCorruptionError(dir, 'meta', 'missing from a non-empty store');
  const meta = decodeMeta(metaRaw);
  if (!meta.ok) throw new StorageCorruptionError(dir, 'meta', meta.reason);
  const m = meta.value;
  if (m.format !== levelFormatVersion) {
    throw new StorageFormatError(dir, `on-disk format ${m.format}, this build reads format ${levelFormatVersion}`);
  }
  checkIdentity(dir, m, identity);
  if (hardRaw === undefined) throw new StorageCorruptionError(dir, 'hard', 'missing');
  const hardD = decodeHardState(hardRaw);
  if (!hardD.ok) throw new StorageCorruptionError(dir, 'hard', hardD.reason);
  if (snapRaw === undefined) throw new StorageCorruptionError(dir, 'snap', 'missing');
  const snapD = decodeSnapshot(snapRaw);
  if (!snapD.ok) throw new StorageCorruptionError(dir, 'snap', snapD.reason);
  const hard = hardD.value;
  const snapshot = snapD.value;
  const S = snapshot.meta.index;
  const commit = Math.max(hard.commit, S);

  // Walk the log in index order. `good` stays contiguous; the first problem ends the walk.
  const good: Entry[] = [];
  let problem: Problem | null = null;
  let problemAt = entryRecords.length;
  for (const [pos, { key, value }] of entryRecords.entries()) {
    const index = entryIndexOfKey(key) ?? -1;
    const prev = good.at(-1);
    const expected = prev === undefined ? (index > S + 1 ? S + 1 : index) : prev.index + 1;
    if (index !== expected) {
      problem = { index: expected, key: `log/${expected}`, reason: `missing (the next stored entry is ${index})` };
    } else {
      const d = decodeEntry(key, value);
      if (!d.ok) problem = { index, key: describeKey(key), reason: d.reason };
      else {
        const e = d.value;
        const reason = entryProblem(prev, e, snapshot.meta, hard.term);
        if (reason !== null) problem = { index, key: describeKey(key), reason };
        else good.push(e);
      }
    }
    if (problem !== null) {
      problemAt = pos;
      break;
    }
  }

  const repairs: StorageRepair[] = [];
  let storedMeta = m;
  if (problem !== null) {
    if (problem.index <= commit) {
      throw new StorageCorruptionError(
        dir,
        problem.key,
        `${problem.reason}; it is at or below the commit index ${commit}, so committed data is lost`,
      );
    }
    const tail = entryRecords.slice(problemAt);
    // The highest index stored: every entry up to it may have been acknowledged to a leader.
    const lastStored = Math.max(problem.index, ...tail.map(({ key }) => entryIndexOfKey(key) ?? 0));
    storedMeta = { ...m, voteBarrier: Math.max(m.voteBarrier, lastStored) };
    await db.batch(
      [
        ...tail.map(({ key }) => ({ type: 'del' as const, key })),
        { type: 'put' as const, key: metaKey, value: encodeMeta(storedMeta) },
      ],
      { sync: true },
    );
    const repair: StorageRepair = {
      key: problem.key,
      reason: problem.reason,
      truncatedFrom: problem.index,
      removedRecords: tail.length,
      commit,
    };
    logger.warn(
      { dir, ...repair, voteBarrier: storedMeta.voteBarrier },
      'raft storage: corrupt log record above the commit index; tail truncated, and the node must not vote ' +
        'until its commit index reaches the vote barrier',
    );
    repairs.push(repair);
  }

  const lastEntry = good.at(-1);
  const lastIndex = Math.max(S, lastEntry?.index ?? 0);
  if (hard.commit > lastIndex) {
    throw new StorageCorruptionError(
      dir,
      `log/${lastIndex + 1}`,
      `missing, but the hard state's commit index is ${hard.commit}: ` +
        `committed entries ${lastIndex + 1}..${hard.commit} are lost`,
    );
  }
  const first = good[0]?.index ?? S + 1;
  const last = lastEntry?.index ?? first - 1;
  return {
    storedMeta,
    state: { hardState: hard, snapshot, entries: good.filter((e) => e.index > S) },
    first,
    last,
    repairs,
  };
}

export function toMeta(m: StoredMeta, fresh: boolean, repairs: readonly StorageRepair[]): StorageMeta {
  return {
    clusterId: m.clusterId,
    nodeId: m.nodeId,
    incarnation: m.incarnation,
    createdAt: m.createdAt,
    fresh,
    incarnationConfirmed: m.confirmed,
    repairs: [...repairs],
    voteBarrier: m.voteBarrier,
  };
}
