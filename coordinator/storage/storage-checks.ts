// The checks both storage layouts share (LevelDB only, format 1, raft-storage-level.ts; LevelDB
// beside the append-only log, format 2, raft-storage.ts): what a Ready or a compaction may ask
// for, which log records are impossible, whose directory this is, and opening LevelDB.
import { ClassicLevel } from 'classic-level';
import type { Entry, NodeId, Ready, Snapshot } from '../raft/index.js';
import type { StoredMeta } from './storage-codec.js';
import { StorageCorruptionError, StorageIdentityError } from './storage-errors.js';

/** What a Ready asks storage to persist (a Ready itself fits). */
export type ReadyToPersist = Pick<Ready, 'hardState' | 'entries' | 'snapshot' | 'mustSync'>;

/** The stored log's shape: entry records span [first, last] (empty when last < first). */
export interface LogShape {
  readonly first: number;
  readonly last: number;
  readonly snapIndex: number;
  readonly snapTerm: number;
}

/**
 * Throws (before anything is written) when the Ready would leave a gap, overwrite at or below the
 * snapshot, go back to an older snapshot, or commit past the last index. Returns the shape after it.
 */
export function checkSave(s: LogShape, rd: ReadyToPersist): LogShape {
  let { first, last, snapIndex, snapTerm } = s;
  const snap = rd.snapshot;
  if (snap !== null) {
    if (snap.meta.index < snapIndex)
      throw new Error(`save: installed snapshot at ${snap.meta.index} is older than the stored one at ${snapIndex}`);
    snapIndex = snap.meta.index;
    snapTerm = snap.meta.term;
    first = snapIndex + 1;
    last = snapIndex;
  }
  const e0 = rd.entries[0];
  if (e0 !== undefined) {
    const lastIndex = Math.max(snapIndex, last);
    if (e0.index <= snapIndex)
      throw new Error(`save: entry ${e0.index} is at or below the snapshot index ${snapIndex}`);
    if (e0.index > lastIndex + 1)
      throw new Error(`save: entry ${e0.index} would leave a gap after the last index ${lastIndex}`);
    for (const [i, e] of rd.entries.entries()) {
      if (e.index !== e0.index + i) throw new Error(`save: entries are not contiguous at ${e.index}`);
    }
    // Nothing stored to continue: whatever is stored lies below the snapshot and is dropped.
    if (last < first || e0.index > last + 1) first = e0.index;
    last = e0.index + rd.entries.length - 1;
  }
  const hard = rd.hardState;
  if (hard !== null) {
    const lastIndex = Math.max(snapIndex, last);
    if (hard.commit > lastIndex)
      throw new Error(`save: hard state commit ${hard.commit} is past the last index ${lastIndex}`);
  }
  return { first, last, snapIndex, snapTerm };
}

/**
 * Checks a compaction to `snapshot` against the stored log (`termAt` gives a stored entry's term,
 * undefined if not stored). Returns false for a snapshot older than the stored one (ignored).
 */
export function checkCompact(s: LogShape, snapshot: Snapshot, termAt: (index: number) => number | undefined): boolean {
  const idx = snapshot.meta.index;
  if (idx < s.snapIndex) return false;
  if (idx > Math.max(s.snapIndex, s.last))
    throw new Error(`compact: snapshot at ${idx} is past the last stored index ${s.last}`);
  if (idx === s.snapIndex && snapshot.meta.term !== s.snapTerm) {
    throw new Error(
      `compact: snapshot term ${snapshot.meta.term} at ${idx} does not match the stored snapshot's term ${s.snapTerm}`,
    );
  }
  if (idx >= s.first && idx <= s.last && termAt(idx) !== snapshot.meta.term)
    throw new Error(`compact: snapshot term ${snapshot.meta.term} at ${idx} does not match the stored entry`);
  return true;
}

/** Why entry `e`, following `prev` in the log, cannot be one storage wrote; null when it can. */
export function entryProblem(
  prev: Entry | undefined,
  e: Entry,
  snapshot: Snapshot['meta'],
  hardTerm: number,
): string | null {
  if (prev !== undefined && e.term < prev.term) return `term ${e.term} is below the previous entry's term ${prev.term}`;
  if (e.index === snapshot.index && e.term !== snapshot.term)
    return `term ${e.term} differs from the snapshot's term ${snapshot.term} at the same index`;
  if (e.index > snapshot.index && e.term < snapshot.term)
    return `term ${e.term} is below the snapshot's term ${snapshot.term}`;
  if (e.term > hardTerm) return `term ${e.term} is above the hard state's term ${hardTerm}`;
  return null;
}

/** Refuses a directory that belongs to another node or cluster (checked before anything is written). */
export function checkIdentity(
  dir: string,
  m: StoredMeta,
  identity: { readonly nodeId: NodeId; readonly clusterId: string },
): void {
  if (m.nodeId !== identity.nodeId) {
    throw new StorageIdentityError(
      dir,
      `the data directory belongs to node '${m.nodeId}' (incarnation ${m.incarnation}), ` +
        `not '${identity.nodeId}': refusing to open it`,
    );
  }
  if (m.clusterId !== identity.clusterId) {
    throw new StorageIdentityError(
      dir,
      `the data directory belongs to cluster '${m.clusterId}', not '${identity.clusterId}': refusing to open it`,
    );
  }
}

export type LevelDb = ClassicLevel<Uint8Array, Uint8Array>;

/** Opens (creating if needed) the LevelDB in `dir`; LevelDB's own corruption becomes StorageCorruptionError. */
export async function openLevel(dir: string): Promise<LevelDb> {
  const db: LevelDb = new ClassicLevel<Uint8Array, Uint8Array>(dir, {
    keyEncoding: 'view',
    valueEncoding: 'view',
    createIfMissing: true,
  });
  try {
    await db.open();
  } catch (err) {
    throw asCorruption(dir, err);
  }
  return db;
}

/** StorageCorruptionError for LevelDB's corruption (abstract-level may wrap it in `cause`), else `err`. */
export function asCorruption(dir: string, err: unknown): unknown {
  if (err instanceof StorageCorruptionError) return err;
  for (
    let e = err, depth = 0;
    typeof e === 'object' && e !== null && depth < 5;
    e = (e as { cause?: unknown }).cause, depth++
  ) {
    if ((e as { code?: unknown }).code === 'LEVEL_CORRUPTION')
      return new StorageCorruptionError(dir, '(database)', `LevelDB reports corruption: ${errMessage(err)}`, {
        cause: err,
      });
  }
  return err;
}

export function errMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
