// The edge around the pure Raft core: a clock that ticks it, storage that persists each Ready
// before its messages leave, a transport that carries them, and a state machine that applies the
// committed entries. Every input (tick, peer messages, proposal, read) goes through one queue and
// is stepped only when no Ready is outstanding, so the core's contract — no calls between ready()
// and advance() — holds even though persisting is asynchronous. While one Ready is being
// persisted, new inputs pile up and are handled together afterwards: that is the group commit
// (many proposals, one fsync). Committed entries are applied while their Ready is persisted (see
// pump()), so an answer never waits for an fsync that is not its own.
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { RaftNode } from '../raft/index.js';
import {
  EntryKind,
  sendBeforePersist,
  type ConfChange,
  type Entry,
  type Message,
  type NodeId,
  type Ready,
  type Snapshot,
} from '../raft/index.js';
import { CellquotaError } from '../../shared/errors.js';

export interface RaftPersistence {
  save(rd: Pick<Ready, 'hardState' | 'entries' | 'snapshot' | 'mustSync'>): Promise<void>;
  compact(snapshot: Snapshot, keepFrom: number): Promise<unknown>;
}

export interface RaftOutbox {
  send(messages: readonly Message[]): void;
}

/** The replicated application: applies committed commands deterministically. */
export interface ReplicatedStateMachine<R> {
  apply(data: Uint8Array, index: number): R;
  snapshot(): Uint8Array;
  /**
   * Optional: copies the state as applied now (synchronously, cheaply) and returns steps that
   * encode that copy into the bytes snapshot() would give now, one bounded step per `yield`. The
   * driver runs them between other work, so the state machine goes on applying entries meanwhile.
   */
  snapshotSteps?(): Generator<void, Uint8Array, void>;
  restore(data: Uint8Array): void;
}

/** The longest the driver runs a snapshot's encoding steps before it lets the event loop go on. */
const SNAPSHOT_STEP_BUDGET_MS = 8;

/** A snapshot being encoded off the driver's path (see maybeSnapshot). */
interface SnapshotJob {
  readonly point: ReturnType<RaftNode['snapshotPoint']>;
  readonly started: number;
  readonly loop: ReturnType<typeof monitorEventLoopDelay>;
  /** The longest synchronous piece so far: the copy, or one run of steps. */
  longestSyncMs: number;
  data: Uint8Array | null;
}

export interface RaftDriverOptions<R> {
  readonly raft: RaftNode;
  readonly storage: RaftPersistence;
  readonly outbox: RaftOutbox;
  readonly stateMachine: ReplicatedStateMachine<R>;
  /** The applied index the state machine was restored to (the snapshot's). */
  readonly appliedIndex: number;
  readonly tickMs: number;
  /** Take a snapshot after this many entries applied since the last one (0: never). */
  readonly snapshotEveryEntries: number;
  /** Entries kept below a snapshot for followers that lag a little. */
  readonly snapshotTrailingEntries: number;
  /** How long a proposal or read may wait before it fails with a timeout. */
  readonly requestTimeoutMs: number;
  readonly onLeaderChange?: (leader: NodeId | null, term: number) => void;
  /** After restoring the state machine from a leader's snapshot; `restoreMs`: the restore's time. */
  readonly onSnapshotInstalled?: (index: number, term: number, bytes: number, restoreMs: number) => void;
  /**
   * After a snapshot was taken and stored: `ms` in all (encode and write); `encodeMs` the longest
   * synchronous piece of it (the state machine's copy or one run of encoding steps; all of the
   * encoding for a state machine without snapshotSteps), during which the event loop serves
   * nothing; `loopMaxMs` the longest event-loop delay while it was taken and written.
   */
  readonly onSnapshotTaken?: (
    index: number,
    bytes: number,
    ms: number,
    stall: { readonly encodeMs: number; readonly loopMaxMs: number },
  ) => void;
  /** While a snapshot from the leader arrives in chunks: at most once a second, and when it is complete. */
  readonly onSnapshotProgress?: (index: number, receivedBytes: number, totalBytes: number) => void;
  /**
   * Called once when the driver stops for good: a persist (save/compact) failed — the error is a
   * RaftPersistError — or stepping/applying threw. Nothing the failed step was to persist was sent,
   * counted or acknowledged (the committed entries it carried were already durable on a majority
   * and may have been applied and answered); the owner must stop the process (crash-stop) and
   * restart from what is durable.
   */
  readonly onError?: (err: Error) => void;
}

export class NotLeaderError extends CellquotaError {
  readonly code = 'NOT_LEADER';
  constructor(
    readonly leader: NodeId | null,
    detail = 'not the leader',
  ) {
    super(`${detail}; leader: ${leader ?? 'unknown'}`);
    this.name = 'NotLeaderError';
  }
}

export class RaftRequestError extends CellquotaError {
  constructor(
    readonly code: 'TIMEOUT' | 'DROPPED' | 'STOPPED' | 'REFUSED',
    message: string,
  ) {
    super(message);
    this.name = 'RaftRequestError';
  }
}

/**
 * Persisting a Ready (or a compaction) failed: the disk state is unknown (a failed fsync may have
 * lost writes the kernel had accepted), so the node must not act on that Ready — no message that
 * depends on it is sent, none of its new entries is counted or acknowledged (only entries already
 * committed, durable on a majority, are applied while it is written) — and must not go on at all.
 */
export class RaftPersistError extends CellquotaError {
  readonly code = 'RAFT_PERSIST_FAILED' as const;
  constructor(
    readonly during: 'save' | 'compact' | 'confirm-incarnation' | 'clear-vote-barrier',
    cause: unknown,
  ) {
    super(`persisting raft state failed (${during}): ${cause instanceof Error ? cause.message : String(cause)}`, {
      cause,
    });
    this.name = 'RaftPersistError';
  }
}

interface QueuedInput {
  /** Fails the caller's promise if the input is never run (null: nobody waits on it). */
  readonly refuse: ((e: Error) => void) | null;
  readonly run: () => void;
}

interface PendingProposal<R> {
  readonly term: number;
  readonly resolve: (r: R) => void;
  readonly reject: (e: Error) => void;
  readonly timer: NodeJS.Timeout;
}

interface PendingRead {
  index: number;
  readonly resolve: () => void;
  readonly reject: (e: Error) => void;
  readonly timer: NodeJS.Timeout;
}

export class RaftDriver<R> {
  private readonly raft: RaftNode;
  private readonly opts: RaftDriverOptions<R>;
  private inputs: QueuedInput[] = [];
  private running = false;
  private stopped = false;
  private ticker: NodeJS.Timeout | null = null;
  private applied: number;
  private snapshotIndex: number;
  private readonly proposals = new Map<number, PendingProposal<R>>();
  private readonly reads = new Map<string, PendingRead>();
  private readsWaitingApply: PendingRead[] = [];
  private readSeq = 0;
  private lastLeader: NodeId | null = null;
  private lastTerm = 0;
  private fatal: Error | null = null;
  private lastSnapshotProgress = { at: 0, index: -1, bytes: -1 };
  private snapshotJob: SnapshotJob | null = null;

  constructor(opts: RaftDriverOptions<R>) {
    this.opts = opts;
    this.raft = opts.raft;
    this.applied = opts.appliedIndex;
    this.snapshotIndex = opts.appliedIndex;
  }

  start(): void {
    this.ticker = setInterval(() => this.enqueue(null, () => this.raft.tick()), this.opts.tickMs);
    this.ticker.unref();
    this.enqueue(null, () => undefined);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.ticker !== null) clearInterval(this.ticker);
    this.ticker = null;
    const err = new RaftRequestError('STOPPED', 'the node is stopping');
    for (const p of this.proposals.values()) {
      clearTimeout(p.timer);
      p.reject(err);
    }
    this.proposals.clear();
    for (const r of [...this.reads.values(), ...this.readsWaitingApply]) {
      clearTimeout(r.timer);
      r.reject(err);
    }
    this.reads.clear();
    this.readsWaitingApply = [];
    while (this.running) await new Promise((r) => setTimeout(r, 1));
    // Inputs queued behind the last step never run now.
    for (const input of this.inputs) input.refuse?.(err);
    this.inputs = [];
  }

  /** Messages from peers. */
  receive(messages: readonly Message[]): void {
    this.enqueue(null, () => {
      for (const m of messages) this.raft.step(m);
    });
  }

  /** Replicates a command; resolves with the state machine's result once it is applied here. */
  propose(data: Uint8Array): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      this.enqueue(reject, () => {
        const res = this.raft.propose(data);
        if (!res.ok) {
          if (res.reason === 'not-leader') reject(new NotLeaderError(res.leader));
          else reject(new RaftRequestError('REFUSED', `proposal refused: ${res.reason}`));
          return;
        }
        const timer = setTimeout(() => {
          if (this.proposals.delete(res.index))
            reject(new RaftRequestError('TIMEOUT', `not committed within ${this.opts.requestTimeoutMs} ms`));
        }, this.opts.requestTimeoutMs);
        this.proposals.set(res.index, { term: res.term, resolve, reject, timer });
      });
    });
  }

  /** Resolves once this node's state machine reflects every write committed before the call. */
  linearizableRead(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.enqueue(reject, () => {
        const ctx = `r${++this.readSeq}`;
        const timer = setTimeout(() => {
          const r = this.reads.get(ctx);
          if (r !== undefined) {
            this.reads.delete(ctx);
            reject(new RaftRequestError('TIMEOUT', `read not confirmed within ${this.opts.requestTimeoutMs} ms`));
          }
          this.readsWaitingApply = this.readsWaitingApply.filter((w) => w.timer !== timer);
        }, this.opts.requestTimeoutMs);
        this.reads.set(ctx, { index: -1, resolve, reject, timer });
        this.raft.readIndex(ctx);
      });
    });
  }

  proposeConfChange(cc: ConfChange): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.enqueue(reject, () => {
        const res = this.raft.proposeConfChange(cc);
        if (!res.ok) {
          if (res.reason === 'not-leader') reject(new NotLeaderError(res.leader));
          else reject(new RaftRequestError('REFUSED', 'detail' in res ? `${res.reason}: ${res.detail}` : res.reason));
          return;
        }
        const timer = setTimeout(() => {
          if (this.proposals.delete(res.index))
            reject(
              new RaftRequestError(
                'TIMEOUT',
                `membership change not committed within ${this.opts.requestTimeoutMs} ms`,
              ),
            );
        }, this.opts.requestTimeoutMs);
        this.proposals.set(res.index, { term: res.term, resolve: () => resolve(), reject, timer });
      });
    });
  }

  transferLeadership(to: NodeId): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.enqueue(reject, () => {
        const res = this.raft.transferLeadership(to);
        if (res.ok) resolve();
        else reject(new RaftRequestError('REFUSED', res.detail));
      });
    });
  }

  setVoting(allowed: boolean): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.enqueue(reject, () => {
        this.raft.setVoting(allowed);
        resolve();
      });
    });
  }

  status(): ReturnType<RaftNode['status']> {
    return this.raft.status();
  }

  /** Set when storage failed: the node stops rather than continue on state it could not persist. */
  failure(): Error | null {
    return this.fatal;
  }

  /**
   * Queues an input. A stopped or failed driver takes none: a request's promise is rejected at
   * once (`refuse`) rather than left pending forever; peer messages and ticks are dropped.
   */
  private enqueue(refuse: ((e: Error) => void) | null, input: () => void): void {
    if (this.stopped || this.fatal !== null) {
      refuse?.(
        new RaftRequestError(
          'STOPPED',
          this.fatal === null ? 'the node is stopping' : `node stopped: ${this.fatal.message}`,
        ),
      );
      return;
    }
    this.inputs.push({ refuse, run: input });
    if (!this.running) void this.pump();
  }

  private async pump(): Promise<void> {
    this.running = true;
    try {
      while (!this.stopped && (this.inputs.length > 0 || this.raft.hasReady())) {
        const batch = this.inputs;
        this.inputs = [];
        for (const [i, input] of batch.entries()) {
          try {
            input.run();
          } catch (err) {
            // The inputs after the one that threw never ran: put them back to be refused below.
            this.inputs = [...batch.slice(i + 1), ...this.inputs];
            throw err;
          }
        }
        this.reportSnapshotProgress();
        if (!this.raft.hasReady()) {
          await this.maybeSnapshot(); // a snapshot encoded meanwhile is stored now
          continue;
        }
        const rd = this.raft.ready();
        // A leader's replication goes out while its own write is in flight (thesis §10.2.1).
        const early = rd.softState.role === 'leader' ? rd.messages.filter(sendBeforePersist) : [];
        if (early.length > 0) this.opts.outbox.send(early);
        // Committed entries are applied (and their proposals answered) while this Ready is being
        // persisted, as etcd's server does: an entry is committed only once a majority has it
        // durably — the leader counts itself only for entries it has persisted (its match is the
        // core's stable index) and a follower acknowledges only after its save — so the
        // acknowledgement keeps the contract, and no unrelated fsync (the next proposals' entries,
        // a commit-index write) stands between a commit and its answer. A Ready that installs a
        // snapshot is applied after it is persisted, in order.
        // The write is handed to storage first, so its fsync is under way while the entries are
        // applied and the answers (HTTP replies) are written: those run as microtasks and would
        // otherwise reach the event loop, and the storage thread, before the write does.
        // If it rejects, nothing below runs: the Ready's messages (votes, append acks, the
        // leader's own progress) are never sent nor counted.
        const applyFirst = rd.snapshot === null;
        const saving = this.opts.storage.save(rd).catch((err: unknown) => {
          throw new RaftPersistError('save', err);
        });
        saving.catch(() => undefined); // awaited below; this only keeps a throw in applyReady from leaving it unhandled
        if (applyFirst) this.applyReady(rd);
        await saving;
        this.opts.outbox.send(early.length > 0 ? rd.messages.filter((m) => !early.includes(m)) : rd.messages);
        if (!applyFirst) this.applyReady(rd);
        this.raft.advance(rd);
        this.noticeLeader();
        await this.maybeSnapshot();
      }
    } catch (err) {
      // Fatal: the driver takes no more input (enqueue refuses it) and every waiting request
      // fails now. Whoever owns the process is told through onError and must stop it.
      this.fatal = err instanceof Error ? err : new Error(String(err));
      if (this.ticker !== null) clearInterval(this.ticker);
      this.ticker = null;
      const failed = new RaftRequestError('STOPPED', `node stopped: ${this.fatal.message}`);
      // Inputs that arrived while the failed write was in flight were never run.
      for (const input of this.inputs) input.refuse?.(failed);
      this.inputs = [];
      for (const p of this.proposals.values()) {
        clearTimeout(p.timer);
        p.reject(failed);
      }
      this.proposals.clear();
      for (const r of [...this.reads.values(), ...this.readsWaitingApply]) {
        clearTimeout(r.timer);
        r.reject(failed);
      }
      this.reads.clear();
      this.readsWaitingApply = [];
      this.opts.onError?.(this.fatal);
    } finally {
      this.running = false;
    }
  }

  private reportSnapshotProgress(): void {
    const report = this.opts.onSnapshotProgress;
    if (report === undefined) return;
    const p = this.raft.incomingSnapshotProgress();
    if (p === null) return;
    const now = performance.now();
    if (
      (p.index === this.lastSnapshotProgress.index && p.receivedBytes === this.lastSnapshotProgress.bytes) ||
      (now - this.lastSnapshotProgress.at < 1000 && p.receivedBytes < p.totalBytes)
    )
      return;
    this.lastSnapshotProgress = { at: now, index: p.index, bytes: p.receivedBytes };
    report(p.index, p.receivedBytes, p.totalBytes);
  }

  private applyReady(rd: Ready): void {
    if (rd.snapshot !== null) {
      const started = performance.now();
      this.opts.stateMachine.restore(rd.snapshot.data);
      this.applied = rd.snapshot.meta.index;
      this.snapshotIndex = rd.snapshot.meta.index;
      this.opts.onSnapshotInstalled?.(
        rd.snapshot.meta.index,
        rd.snapshot.meta.term,
        rd.snapshot.data.byteLength,
        performance.now() - started,
      );
      for (const [idx, p] of this.proposals) {
        if (idx <= this.applied) {
          clearTimeout(p.timer);
          p.reject(new RaftRequestError('DROPPED', 'outcome unknown: replaced by a snapshot from the leader'));
          this.proposals.delete(idx);
        }
      }
    }
    for (const e of rd.committedEntries) this.applyEntry(e);
    for (const rs of rd.readStates) {
      const r = this.reads.get(rs.ctx);
      if (r === undefined) continue;
      this.reads.delete(rs.ctx);
      r.index = rs.index;
      this.readsWaitingApply.push(r);
    }
    for (const ctx of rd.failedReads) {
      const r = this.reads.get(ctx);
      if (r === undefined) continue;
      this.reads.delete(ctx);
      clearTimeout(r.timer);
      r.reject(new NotLeaderError(this.raft.softState().leader, 'read not served'));
    }
    const still: PendingRead[] = [];
    for (const r of this.readsWaitingApply) {
      if (r.index <= this.applied) {
        clearTimeout(r.timer);
        r.resolve();
      } else {
        still.push(r);
      }
    }
    this.readsWaitingApply = still;
  }

  private applyEntry(e: Entry): void {
    let result: R | undefined;
    if (e.kind === EntryKind.Normal) result = this.opts.stateMachine.apply(e.data, e.index);
    this.applied = e.index;
    const p = this.proposals.get(e.index);
    if (p === undefined) return;
    this.proposals.delete(e.index);
    clearTimeout(p.timer);
    if (p.term !== e.term) {
      p.reject(new RaftRequestError('DROPPED', `lost to a leader change at index ${e.index}; not applied`));
      return;
    }
    p.resolve(result as R);
  }

  private noticeLeader(): void {
    const s = this.raft.softState();
    if (s.leader === this.lastLeader && s.term === this.lastTerm) return;
    const changed = s.leader !== this.lastLeader;
    this.lastLeader = s.leader;
    this.lastTerm = s.term;
    if (changed) this.opts.onLeaderChange?.(s.leader, s.term);
  }

  /**
   * Takes a snapshot once `snapshotEveryEntries` entries were applied since the last one. With a
   * state machine that has snapshotSteps, in three parts: the state is copied at the applied index
   * (synchronously), the copy is encoded in steps between other work (runSnapshotSteps: the node
   * goes on applying, answering and sending heartbeats), and the next time the pump comes here
   * the log is compacted to that index and the snapshot stored — unless a snapshot from the leader
   * installed meanwhile is at or past it. The snapshot is exactly the state at its index.
   */
  private async maybeSnapshot(): Promise<void> {
    const job = this.snapshotJob;
    if (job !== null) {
      if (job.data === null) return; // still encoding
      this.snapshotJob = null;
      await this.storeSnapshot(job, job.data);
      return;
    }
    const every = this.opts.snapshotEveryEntries;
    if (every <= 0 || this.applied - this.snapshotIndex < every) return;
    // The longest event-loop delay while the snapshot is taken and written (any cause), beside the
    // snapshot's own synchronous steps (the event loop serves nothing during them).
    const loop = monitorEventLoopDelay({ resolution: 10 });
    loop.enable();
    const started = performance.now();
    const point = this.raft.snapshotPoint();
    const sm = this.opts.stateMachine;
    if (sm.snapshotSteps === undefined) {
      const data = sm.snapshot();
      await this.storeSnapshot({ point, started, loop, longestSyncMs: performance.now() - started, data }, data);
      return;
    }
    const steps = sm.snapshotSteps();
    const next: SnapshotJob = { point, started, loop, longestSyncMs: performance.now() - started, data: null };
    this.snapshotJob = next;
    void this.runSnapshotSteps(next, steps);
  }

  /** Runs the encoding steps, SNAPSHOT_STEP_BUDGET_MS at a time, then wakes the pump to store it. */
  private async runSnapshotSteps(job: SnapshotJob, steps: Generator<void, Uint8Array, void>): Promise<void> {
    try {
      for (;;) {
        await new Promise<void>((resolve) => setImmediate(resolve));
        if (this.stopped || this.fatal !== null) {
          job.loop.disable();
          return;
        }
        const t0 = performance.now();
        let r = steps.next();
        while (r.done !== true && performance.now() - t0 < SNAPSHOT_STEP_BUDGET_MS) r = steps.next();
        job.longestSyncMs = Math.max(job.longestSyncMs, performance.now() - t0);
        if (r.done === true) {
          job.data = r.value;
          break;
        }
      }
    } catch (err) {
      // Encoding a copy of the state failed: a bug; stop as when stepping or applying throws.
      job.loop.disable();
      this.enqueue(null, () => {
        throw err;
      });
      return;
    }
    this.enqueue(null, () => undefined); // the pump stores it (maybeSnapshot)
  }

  private async storeSnapshot(job: SnapshotJob, data: Uint8Array): Promise<void> {
    // A snapshot installed from the leader while this one was encoded is newer: this one is dropped.
    if (job.point.index <= this.snapshotIndex) {
      job.loop.disable();
      return;
    }
    const snap = this.raft.compact(data, this.opts.snapshotTrailingEntries, job.point);
    // The core may keep more than the trailing entries (for a snapshot transfer in progress).
    try {
      await this.opts.storage.compact(snap, this.raft.firstIndex()).catch((err: unknown) => {
        throw new RaftPersistError('compact', err);
      });
    } finally {
      job.loop.disable();
    }
    this.snapshotIndex = snap.meta.index;
    const ms = performance.now() - job.started;
    // The histogram's max is in ns; it misses a stall that starts before it is enabled, hence the max with the steps'.
    const encodeMs = job.longestSyncMs;
    const loopMaxMs = Math.max(encodeMs, Number.isFinite(job.loop.max) ? job.loop.max / 1e6 : 0);
    this.opts.onSnapshotTaken?.(snap.meta.index, snap.data.byteLength, ms, { encodeMs, loopMaxMs });
  }
}
