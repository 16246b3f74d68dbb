// Client sessions for exactly-once application of retried writes (Raft dissertation §6.3).
// Each client numbers its requests 1, 2, 3 ... and has at most one outstanding; a retry reuses the
// number. Applying a command first asks the table: a number already applied returns the recorded
// result instead of applying twice. The table lives inside the replicated state machine (it is
// part of every snapshot), so every replica makes the same decision; eviction is deterministic
// (least recently applied first) and bounded.

export type SessionCheck<R> =
  | { readonly kind: 'new' }
  | { readonly kind: 'duplicate'; readonly result: R }
  | { readonly kind: 'stale'; readonly lastSeq: number };

export interface SessionEntry<R> {
  readonly clientId: string;
  readonly seq: number;
  readonly result: R;
}

export class ClientSessions<R> {
  /** Insertion order is least-recently-applied first. */
  private readonly sessions = new Map<string, { seq: number; result: R }>();

  constructor(private readonly maxSessions: number) {
    if (!Number.isInteger(maxSessions) || maxSessions < 1)
      throw new RangeError('maxSessions must be a positive integer');
  }

  check(clientId: string, seq: number): SessionCheck<R> {
    const s = this.sessions.get(clientId);
    if (s === undefined || seq > s.seq) return { kind: 'new' };
    if (seq === s.seq) return { kind: 'duplicate', result: s.result };
    return { kind: 'stale', lastSeq: s.seq };
  }

  record(clientId: string, seq: number, result: R): void {
    this.sessions.delete(clientId);
    this.sessions.set(clientId, { seq, result });
    while (this.sessions.size > this.maxSessions) {
      const oldest = this.sessions.keys().next();
      if (oldest.done === true) break;
      this.sessions.delete(oldest.value);
    }
  }

  size(): number {
    return this.sessions.size;
  }

  /** For snapshots: entries in eviction order. */
  entries(): SessionEntry<R>[] {
    return [...this.sessions].map(([clientId, s]) => ({ clientId, seq: s.seq, result: s.result }));
  }

  static fromEntries<R>(maxSessions: number, entries: readonly SessionEntry<R>[]): ClientSessions<R> {
    const t = new ClientSessions<R>(maxSessions);
    for (const e of entries) t.record(e.clientId, e.seq, e.result);
    return t;
  }
}
