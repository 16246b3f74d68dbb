// A deterministic stream of Raft-shaped storage operations, shared by the crash child (which runs
// it against real storage until killed) and the parent test (which replays it on the model to know
// what the disk must hold after the last operation the child reported, or the one after it).
import type { Snapshot } from '../../../coordinator/raft/index.js';
import type { ReadyToPersist } from '../../../coordinator/storage/index.js';
import { ents, StorageModel } from './storage-helpers.js';

export const crashBootstrap = { conf: { voters: ['n1', 'n2', 'n3'], learners: [] }, data: new Uint8Array([1, 2, 3]) };

export type WorkloadOp =
  | { readonly kind: 'save'; readonly rd: ReadyToPersist }
  | { readonly kind: 'compact'; readonly snapshot: Snapshot; readonly keepFrom: number };

export function newWorkloadModel(): StorageModel {
  return new StorageModel({ meta: { index: 0, term: 0, conf: crashBootstrap.conf }, data: crashBootstrap.data });
}

/** Operation k (1, 2, ...) given the state after operations 1..k-1. */
export function nextOp(m: StorageModel, k: number): WorkloadOp {
  const S = m.snapshot.meta.index;
  const { term, commit } = m.hard;
  if (k % 25 === 0 && commit > S) {
    const t = m.termAt(commit) ?? 0;
    return {
      kind: 'compact',
      snapshot: {
        meta: { index: commit, term: t, conf: crashBootstrap.conf },
        data: new TextEncoder().encode(`snap@${commit}`),
      },
      keepFrom: commit - 3,
    };
  }
  const newTerm = k % 10 === 0 ? term + 1 : Math.max(term, 1);
  // Every tenth batch a new leader overwrites the uncommitted tail.
  const from = k % 10 === 0 ? Math.max(commit + 1, S + 1, m.lastIndex() - 2) : m.lastIndex() + 1;
  const count = 1 + ((k * 7) % 5);
  const newLast = from + count - 1;
  return {
    kind: 'save',
    rd: {
      entries: ents(from, newLast, newTerm),
      hardState: { term: newTerm, vote: 'n1', commit: Math.max(commit, newLast - 3) },
      snapshot: null,
      mustSync: true,
    },
  };
}

export function applyOp(m: StorageModel, op: WorkloadOp): void {
  if (op.kind === 'save') m.save(op.rd);
  else m.compact(op.snapshot, op.keepFrom);
}
