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

export class SimDisk {
  private durable: DiskState;
  private volatile: DiskState;
  syncs = 0;

  constructor(initial: DiskState) {
    this.durable = clone(initial);
    this.volatile = clone(initial);
  }

  writeSnapshot(snapshot: Snapshot, keepEntriesFrom: number): void {
    this.volatile.snapshot = snapshot;
    this.volatile.entries = this.volatile.entries.filter((e) => e.index >= keepEntriesFrom);
  }

  /** Installing a leader's snapshot replaces the whole log. */
  installSnapshot(snapshot: Snapshot): void {
    this.volatile.snapshot = snapshot;
    this.volatile.entries = [];
  }

  writeEntries(entries: readonly Entry[]): void {
    const first = entries[0];
    if (first === undefined) return;
    const kept = this.volatile.entries.filter((e) => e.index < first.index);
    this.volatile.entries = [...kept, ...entries];
  }

  writeHardState(hard: HardState): void {
    this.volatile.hard = hard;
  }

  sync(): void {
    this.durable = clone(this.volatile);
    this.syncs++;
  }

  /** Power loss: unsynced writes are gone. */
  crash(): void {
    this.volatile = clone(this.durable);
  }

  /** What a restarting node reads back. */
  load(): { hard: HardState; snapshot: Snapshot; entries: Entry[] } {
    const s = this.durable;
    const entries = s.entries.filter((e) => e.index > s.snapshot.meta.index);
    return { hard: s.hard, snapshot: s.snapshot, entries };
  }
}

function clone(s: DiskState): DiskState {
  return { hard: s.hard, snapshot: s.snapshot, entries: [...s.entries] };
}
