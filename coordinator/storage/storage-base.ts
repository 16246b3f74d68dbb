// What both storage layouts share (LevelDB only, format 1, raft-storage-level.ts; LevelDB beside
// the append-only log, format 2, raft-storage.ts): the types callers see, a new directory's
// identity and first snapshot, and StorageBase — operations serialised, a failed write refusing
// everything after it, the identity record's updates (confirmIncarnation, clearVoteBarrier), stats.
import { randomBytes as cryptoRandomBytes } from 'node:crypto';
import type { ConfState, HardState, NodeId, RaftInitialState, Snapshot } from '../raft/index.js';
import type { StoredMeta } from './storage-codec.js';
import type { LogShape } from './storage-checks.js';

/** A corrupt (or, format 2, torn) log tail above the commit index found at open and removed. */
export interface StorageRepair {
  /** The first key found bad or missing (e.g. 'log/42', or 'raft-log/3@4096' in format 2). */
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
  /** Called after every synced write with its duration (ms, wall time of the write + fsync) and size. */
  readonly onSync?: (ms: number, bytes: number) => void;
  /** Where repairs are reported (default: console.warn). pino's logger fits. */
  readonly logger?: StorageLogger;
}

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

export type Loaded = RaftInitialState & { readonly meta: StorageMeta };

export const defaultLogger: StorageLogger = {
  warn: (fields, msg) => console.warn(`${msg} ${JSON.stringify(fields)}`),
};

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

/** A new directory's identity record (a random incarnation) and its conf-only snapshot at index 0. */
export function newIdentity(
  opts: LevelRaftStorageOptions,
  format: number,
  logStart: number,
): { readonly meta: StoredMeta; readonly snapshot: Snapshot } {
  const random = opts.randomBytes ?? ((n: number) => cryptoRandomBytes(n));
  const bytes = random(16);
  if (bytes.length !== 16) throw new Error('randomBytes(16) returned the wrong number of bytes');
  const meta: StoredMeta = {
    format,
    clusterId: opts.clusterId,
    nodeId: opts.nodeId,
    incarnation: Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('hex'),
    createdAt: new Date((opts.now ?? Date.now)()).toISOString(),
    confirmed: false,
    voteBarrier: 0,
    logStart,
  };
  const boot = opts.bootstrap ?? { conf: { voters: [], learners: [] }, data: new Uint8Array(0) };
  const snapshot: Snapshot = {
    meta: { index: 0, term: 0, conf: { voters: [...boot.conf.voters], learners: [...boot.conf.learners] } },
    data: boot.data,
  };
  return { meta, snapshot };
}

/** What a layout's open() hands its StorageBase. */
export interface OpenedState {
  readonly meta: StoredMeta;
  readonly fresh: boolean;
  readonly repairs: readonly StorageRepair[];
  readonly hard: HardState;
  readonly snapshot: Snapshot['meta'];
  /** Stored entry records span [first, last] (empty when last < first). */
  readonly first: number;
  readonly last: number;
  /** What the first load() returns unless something was written since. */
  readonly loaded: Loaded;
}

export abstract class StorageBase {
  readonly dir: string;
  protected readonly opts: LevelRaftStorageOptions;
  protected storedMeta: StoredMeta;
  protected readonly fresh: boolean;
  protected readonly repairs: StorageRepair[];
  protected hard: HardState;
  protected snapIndex: number;
  protected snapTerm: number;
  /** Stored entry records are exactly [first, last]; empty when last < first. */
  protected first: number;
  protected last: number;
  /** What open() read, handed out by the first load() unless something was written since. */
  protected cached: Loaded | null;

  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;
  private failure: Error | null = null;
  private lastSyncStat: SyncStat | null = null;

  protected constructor(dir: string, opts: LevelRaftStorageOptions, s: OpenedState) {
    this.dir = dir;
    this.opts = opts;
    this.storedMeta = s.meta;
    this.fresh = s.fresh;
    this.repairs = [...s.repairs];
    this.hard = s.hard;
    this.snapIndex = s.snapshot.index;
    this.snapTerm = s.snapshot.term;
    this.first = s.first;
    this.last = s.last;
    this.cached = s.loaded;
  }

  /** Writes the identity record, synced. */
  protected abstract writeMeta(m: StoredMeta): Promise<void>;
  /** Closes what the layout holds open (called once every pending operation is done). */
  protected abstract closeStores(): Promise<void>;

  /** The identity and what opening found. */
  meta(): StorageMeta {
    return toMeta(this.storedMeta, this.fresh, this.repairs);
  }

  /** Records, durably, that the caller has decided this incarnation may vote (see StorageMeta). */
  confirmIncarnation(): Promise<void> {
    return this.run(async () => {
      if (this.storedMeta.confirmed) return;
      const m: StoredMeta = { ...this.storedMeta, confirmed: true };
      await this.writeMeta(m);
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
      await this.writeMeta(m);
      this.storedMeta = m;
    });
  }

  /** The last synced write's duration and size (null before the first). */
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

  /** Waits for pending operations, then closes the stores. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.queue.catch(() => undefined);
    await this.closeStores();
  }

  /** Whether a write failed (nothing more may be written). */
  protected get failed(): boolean {
    return this.failure !== null;
  }

  protected shape(): LogShape {
    return { first: this.first, last: this.last, snapIndex: this.snapIndex, snapTerm: this.snapTerm };
  }

  protected noteSync(ms: number, bytes: number): void {
    this.lastSyncStat = { ms, bytes };
    this.opts.onSync?.(ms, bytes);
  }

  /** Runs a write; a failure makes the storage refuse everything after it (the disk state is unknown). */
  protected async guard<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      this.failure = err instanceof Error ? err : new Error(String(err));
      throw err;
    }
  }

  /** Runs `fn` after every earlier operation; refuses once closed or after a failed write. */
  protected run<T>(fn: () => Promise<T>): Promise<T> {
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
}
