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
import type { Entry, HardState, NodeId, RaftInitialState, Snapshot } from '../raft/index.js';
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
  type ReadyToPersist,
} from './storage-checks.js';
import {
  defaultLogger,
  newIdentity,
  StorageBase,
  toMeta,
  type LevelRaftStorageOptions,
  type Loaded,
  type OpenedState,
  type StorageLogger,
  type StorageRepair,
} from './storage-base.js';

type DB = LevelDb;
type BatchOp = { type: 'put'; key: Uint8Array; value: Uint8Array } | { type: 'del'; key: Uint8Array };

export class LevelRaftStorage extends StorageBase {
  private readonly db: DB;
  private readonly logger: StorageLogger;

  private constructor(dir: string, db: DB, opts: LevelRaftStorageOptions, s: OpenedState) {
    super(dir, opts, s);
    this.db = db;
    this.logger = opts.logger ?? defaultLogger;
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
      return new LevelRaftStorage(dir, db, opts, {
        meta: m,
        fresh,
        repairs: scan.repairs,
        hard: scan.state.hardState,
        snapshot: scan.state.snapshot.meta,
        first: scan.first,
        last: scan.last,
        loaded,
      });
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

  protected async writeMeta(m: StoredMeta): Promise<void> {
    await this.write([{ type: 'put', key: metaKey, value: encodeMeta(m) }], true);
  }

  protected async closeStores(): Promise<void> {
    await this.db.close();
  }

  // ---------------------------------------------------------------------------------------------

  private async write(ops: BatchOp[], sync: boolean): Promise<void> {
    this.cached = null;
    let bytes = 0;
    for (const op of ops) bytes += op.key.length + (op.type === 'put' ? op.value.length : 0);
    const t0 = performance.now();
    await this.guard(() => this.db.batch(ops, { sync }));
    if (sync) this.noteSync(performance.now() - t0, bytes);
  }
}

// -----------------------------------------------------------------------------------------------
// Initialisation and the check at open

async function initialise(db: DB, opts: LevelRaftStorageOptions): Promise<void> {
  const { meta, snapshot } = newIdentity(opts, levelFormatVersion, 0);
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
