// The in-memory view of one node's Raft log. It mirrors what storage holds plus the entries not yet
// persisted ("unstable": index > stableIndex). The log may keep a tail of entries at or below the
// snapshot index (trailing entries, so a slightly lagging follower needs no snapshot); everything at
// or below baseIndex exists only inside the snapshot.
import type { Entry, Snapshot, SnapshotMeta } from './raft-types.js';
import { assert } from './raft-assert.js';

export class RaftLog {
  /** Entries baseIndex+1 .. lastIndex, contiguous. */
  private entries: Entry[] = [];
  private baseIndex: number;
  private baseTerm: number;
  /** The latest snapshot (installed or taken); its data is what a lagging follower receives. */
  private snap: Snapshot;
  /** A snapshot received from the leader that storage has not persisted yet. */
  pendingSnapshot: Snapshot | null = null;
  /** Entries at or below this index are durable. */
  stableIndex: number;
  committed: number;
  applied: number;

  constructor(snapshot: Snapshot, entries: readonly Entry[], commit: number) {
    this.snap = snapshot;
    this.baseIndex = snapshot.meta.index;
    this.baseTerm = snapshot.meta.term;
    for (const [i, e] of entries.entries()) {
      assert(e.index === this.baseIndex + 1 + i, `stored log is not contiguous at ${e.index}`);
      this.entries.push(e);
    }
    this.stableIndex = this.lastIndex();
    assert(commit <= this.lastIndex(), `stored commit ${commit} is past the last stored entry ${this.lastIndex()}`);
    this.committed = Math.max(commit, snapshot.meta.index);
    this.applied = snapshot.meta.index;
  }

  snapshot(): Snapshot {
    return this.snap;
  }

  snapshotMeta(): SnapshotMeta {
    return this.snap.meta;
  }

  /** The first index whose entry is still held (entries below it exist only in the snapshot). */
  firstIndex(): number {
    return this.baseIndex + 1;
  }

  lastIndex(): number {
    return this.baseIndex + this.entries.length;
  }

  lastTerm(): number {
    return this.term(this.lastIndex()) ?? 0;
  }

  /** The term of the entry at index, or undefined if it was compacted away or does not exist yet. */
  term(index: number): number | undefined {
    if (index === this.baseIndex) return this.baseTerm;
    if (index < this.baseIndex || index > this.lastIndex()) return undefined;
    return this.entries[index - this.baseIndex - 1]?.term;
  }

  entry(index: number): Entry | undefined {
    if (index <= this.baseIndex) return undefined;
    return this.entries[index - this.baseIndex - 1];
  }

  matchTerm(index: number, term: number): boolean {
    return this.term(index) === term;
  }

  /** Lexicographic (lastTerm, lastIndex) comparison of §5.4.1. */
  isUpToDate(lastIndex: number, lastTerm: number): boolean {
    const myTerm = this.lastTerm();
    return lastTerm > myTerm || (lastTerm === myTerm && lastIndex >= this.lastIndex());
  }

  /** Entries from `from` on, at most maxBytes (always at least one if any exist). Undefined if compacted. */
  slice(from: number, maxBytes: number, maxCount = Number.MAX_SAFE_INTEGER): Entry[] | undefined {
    if (from <= this.baseIndex) return undefined;
    const out: Entry[] = [];
    let bytes = 0;
    for (let i = from; i <= this.lastIndex() && out.length < maxCount; i++) {
      const e = this.entries[i - this.baseIndex - 1];
      assert(e !== undefined, 'log slice hole');
      bytes += entryBytes(e);
      if (out.length > 0 && bytes > maxBytes) break;
      out.push(e);
    }
    return out;
  }

  /** Appends at the end (leader proposals). */
  appendNew(entry: Entry): void {
    assert(entry.index === this.lastIndex() + 1, `append at ${entry.index} after ${this.lastIndex()}`);
    this.entries.push(entry);
  }

  /**
   * Follower append: if the entry at prevIndex has prevTerm, writes `entries` after it, truncating
   * only at the first real conflict (never dropping matching entries that follow). Returns the index
   * of the last entry known to match the leader, or undefined when prev does not match.
   */
  maybeAppend(prevIndex: number, prevTerm: number, entries: readonly Entry[]): number | undefined {
    if (!this.matchTerm(prevIndex, prevTerm)) return undefined;
    const newLast = prevIndex + entries.length;
    for (const e of entries) {
      const have = this.term(e.index);
      if (have === e.term) continue;
      if (have === undefined && e.index <= this.baseIndex) continue; // compacted: committed, identical
      assert(e.index > this.committed, `conflict at committed index ${e.index} (committed ${this.committed})`);
      this.truncateFrom(e.index);
      for (const rest of entries) if (rest.index >= e.index) this.entries.push(rest);
      break;
    }
    return newLast;
  }

  private truncateFrom(index: number): void {
    assert(index > this.baseIndex, 'truncating into the snapshot');
    this.entries.length = index - this.baseIndex - 1;
    if (this.stableIndex >= index) this.stableIndex = index - 1;
  }

  /** Fast back-off hint for a rejected append at prevIndex: the first index of the conflicting term. */
  conflictHint(prevIndex: number): { hintIndex: number; hintTerm: number } {
    const last = this.lastIndex();
    if (prevIndex > last) return { hintIndex: last + 1, hintTerm: 0 };
    const t = this.term(prevIndex);
    if (t === undefined) return { hintIndex: this.committed + 1, hintTerm: 0 };
    let i = prevIndex;
    while (i - 1 > this.baseIndex && this.term(i - 1) === t && i - 1 > this.committed) i--;
    return { hintIndex: i, hintTerm: t };
  }

  /** The last index in this log whose term is `term`, if any (used by the leader on a hint). */
  lastIndexOfTerm(term: number, atOrBelow: number): number | undefined {
    for (let i = Math.min(atOrBelow, this.lastIndex()); i > this.baseIndex; i--) {
      const t = this.term(i);
      if (t === term) return i;
      if (t !== undefined && t < term) return undefined;
    }
    return undefined;
  }

  commitTo(index: number): boolean {
    if (index <= this.committed) return false;
    assert(index <= this.lastIndex(), `commit ${index} past last index ${this.lastIndex()}`);
    this.committed = index;
    return true;
  }

  unstableEntries(): Entry[] {
    if (this.stableIndex >= this.lastIndex()) return [];
    return this.entries.slice(this.stableIndex - this.baseIndex);
  }

  /** Committed entries not yet applied, at most maxCount, only ones that will be durable after this Ready. */
  nextCommitted(maxCount: number): Entry[] {
    const from = Math.max(this.applied + 1, this.baseIndex + 1);
    const to = Math.min(this.committed, this.lastIndex(), from + maxCount - 1);
    if (to < from) return [];
    return this.entries.slice(from - this.baseIndex - 1, to - this.baseIndex);
  }

  /** Marks entries up to index durable, if the entry there is still the one that was persisted. */
  stableTo(index: number, term: number): void {
    if (this.term(index) === term && index > this.stableIndex) this.stableIndex = index;
  }

  appliedTo(index: number): void {
    assert(index <= this.committed, `applied ${index} past commit ${this.committed}`);
    if (index > this.applied) this.applied = index;
  }

  /** Installs a snapshot from the leader: the whole log is replaced by it. */
  restore(snapshot: Snapshot): void {
    this.entries = [];
    this.baseIndex = snapshot.meta.index;
    this.baseTerm = snapshot.meta.term;
    this.snap = snapshot;
    this.pendingSnapshot = snapshot;
    this.stableIndex = snapshot.meta.index;
    this.committed = Math.max(this.committed, snapshot.meta.index);
    // The snapshot replaces the state machine; nothing below it is applied separately.
    this.applied = snapshot.meta.index;
  }

  /**
   * The application took a snapshot at `snapshot.meta.index` (≤ applied). Entries below
   * `keepFrom` are dropped; entries in [keepFrom, snapshot index] stay for lagging followers.
   */
  compact(snapshot: Snapshot, keepFrom: number): void {
    const idx = snapshot.meta.index;
    assert(idx <= this.applied, `snapshot at ${idx} past applied ${this.applied}`);
    assert(this.term(idx) === snapshot.meta.term, 'snapshot term does not match the log');
    if (idx < this.snap.meta.index) return;
    this.snap = snapshot;
    const newBase = Math.min(Math.max(keepFrom - 1, this.baseIndex), idx);
    if (newBase > this.baseIndex) {
      const t = this.term(newBase);
      assert(t !== undefined, 'compaction base has no term');
      this.entries = this.entries.slice(newBase - this.baseIndex);
      this.baseIndex = newBase;
      this.baseTerm = t;
    }
  }

  /** Bytes of entries after `index` (for the uncommitted-size bound). */
  bytesAfter(index: number): number {
    let total = 0;
    for (let i = Math.max(index + 1, this.baseIndex + 1); i <= this.lastIndex(); i++) {
      const e = this.entries[i - this.baseIndex - 1];
      if (e) total += entryBytes(e);
    }
    return total;
  }
}

export function entryBytes(e: Entry): number {
  return e.data.byteLength + 24;
}
