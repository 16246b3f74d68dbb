// A fake disk for one simulated node. Writes land in a volatile copy; `sync` makes them durable;
// a crash throws away everything not synced. The Raft persistence contract says a Ready with
// mustSync must be durable before its messages leave, so the simulated driver syncs exactly then,
// and a crash loses exactly what the contract allows to be lost (e.g. commit-only updates).
import type { Entry, HardState, Snapshot } from '../../coordinator/raft/index.js';

export interface DiskState {
  hard: HardState;
  snapshot: Snapshot;
  /** Entries the log holds, contiguous; may start at or below the snapshot index (trailing). */
  entries: Entry[];
}

type PendingWrite =
  | { readonly kind: 'entries'; readonly entries: readonly Entry[] }
  | { readonly kind: 'hard'; readonly hard: HardState }
  | { readonly kind: 'snapshot'; readonly snapshot: Snapshot; readonly keepEntriesFrom: number }
  | { readonly kind: 'install'; readonly snapshot: Snapshot };

export class SimDisk {
  private readonly durable: DiskState;
  /** Writes since the last sync, in order; a crash discards them. */
  private pending: PendingWrite[] = [];
  syncs = 0;

  constructor(initial: DiskState) {
    this.durable = { hard: initial.hard, snapshot: initial.snapshot, entries: [...initial.entries] };
  }

  writeSnapshot(snapshot: Snapshot, keepEntriesFrom: number): void {
    this.pending.push({ kind: 'snapshot', snapshot, keepEntriesFrom });
  }

  /** Installing a leader's snapshot replaces the whole log. */
  installSnapshot(snapshot: Snapshot): void {
    this.pending.push({ kind: 'install', snapshot });
  }

  writeEntries(entries: readonly Entry[]): void {
    if (entries.length > 0) this.pending.push({ kind: 'entries', entries });
  }

  writeHardState(hard: HardState): void {
    this.pending.push({ kind: 'hard', hard });
  }

  sync(): void {
    const d = this.durable;
    for (const w of this.pending) {
      switch (w.kind) {
        case 'hard':
          d.hard = w.hard;
          break;
        case 'install':
          d.snapshot = w.snapshot;
          d.entries = [];
          break;
        case 'snapshot':
          d.snapshot = w.snapshot;
          d.entries = d.entries.filter((e) => e.index >= w.keepEntriesFrom);
          break;
        case 'entries': {
          const first = w.entries[0];
          if (first === undefined) break;
          const base = d.entries[0]?.index;
          if (base !== undefined && first.index <= base) d.entries = [];
          else if (base !== undefined) d.entries.length = Math.min(d.entries.length, first.index - base);
          for (const e of w.entries) d.entries.push(e);
          break;
        }
      }
    }
    this.pending = [];
    this.syncs++;
  }

  /** Power loss: unsynced writes are gone. */
  crash(): void {
    this.pending = [];
  }

  /** What a restarting node reads back. */
  load(): { hard: HardState; snapshot: Snapshot; entries: Entry[] } {
    const s = this.durable;
    const entries = s.entries.filter((e) => e.index > s.snapshot.meta.index);
    return { hard: s.hard, snapshot: s.snapshot, entries };
  }
}
