// Worker supervision: the agent's N gRPC serving threads (agent-worker.ts), each on its own sockets.
// RlsWorkers starts them (each warms up, then binds, then reports 'ready'), restarts one that exits
// unexpectedly on the same sockets with back-off (250 ms doubling to 10 s), posts rules and
// overrides batches to the running ones, and stops them with a grace period.
//
// Overrides batches carry a sequence number: a batch counts as applied once every running worker
// has confirmed it (a worker that dies is restarted with the full table in its init), and only then
// does postOverrides resolve, so the lease client acknowledges a grant only once every thread
// decides with it.
//
// A worker that is gone (crashed, out of memory, terminated) may have died holding a bucket slot
// between its claim and its publish, or an insert stripe: on its 'exit' (when its last writes are
// visible and it can write no more), before any restart, the supervisor releases what its thread
// held in the shared bucket table (BucketTable.releaseThread: the slot's state before the claim put
// back, or the slot made DEAD; see bucket-table.ts "Dead threads") and frees its thread record.
import type { ResourceLimits, Worker } from 'node:worker_threads';
import { moduleWorker } from '../shared/module-worker.js';
import type { Logger } from '../shared/logging.js';
import type { BucketTable } from './buckets/bucket-table.js';
import type { MainToWorker, WorkerInit, WorkerToMain } from './agent-protocol.js';
import type { RulesSnapshot } from './agent-rules.js';
import type { OverrideEntry } from './lease/quota-overrides.js';
import type { RlsEndpoints } from './rls/rls-server.js';

const WORKER_START_TIMEOUT_MS = 30_000;
const WORKER_STOP_GRACE_MS = 2_000;
const MIN_RESTART_BACKOFF_MS = 250;
const MAX_RESTART_BACKOFF_MS = 10_000;

export interface RlsWorkersOptions {
  readonly count: number;
  /** Worker `index`'s init, at its first start and at every restart: the rules and overrides in force now. */
  readonly initFor: (index: number) => WorkerInit;
  /** The agent's logger (supervision events). */
  readonly log: Logger;
  /** Where the workers' own log lines are re-emitted. */
  readonly workerLog: Logger;
  /** A worker's throttling counts (merged into the main thread's throttling log). */
  readonly onThrottle: (m: Extract<WorkerToMain, { kind: 'throttle' }>) => void;
  /** A velocity key a worker learned (the velocity table's slot → key map lives in the main thread). */
  readonly onVelocityKey: (slot: number, gen: number, key: string) => void;
  /** Called at each restart of a crashed worker (the restarts metric). */
  readonly onRestart: () => void;
  /** Each worker's V8 heap limits (--worker-young-generation-mb); V8's defaults when absent. */
  readonly resourceLimits?: ResourceLimits;
  /** The bucket table the workers attach (a worker's hold in it is released when it exits). */
  readonly table: BucketTable;
}

interface WorkerSlot {
  readonly index: number;
  worker: Worker | null;
  serving: boolean;
  endpoints: RlsEndpoints | null;
  applied: string | null;
  /** The last overrides batch this worker decides with (confirmed, or given in its init). */
  overridesSeq: number;
  restarts: number;
  restartTimer: NodeJS.Timeout | null;
  stopped: (() => void) | null;
}

export class RlsWorkers {
  private readonly slots: WorkerSlot[];
  private stopping = false;
  private overrideSeq = 0;
  private readonly overrideWaiters: { readonly seq: number; readonly resolve: () => void }[] = [];

  constructor(private readonly options: RlsWorkersOptions) {
    this.slots = Array.from({ length: options.count }, (_, index) => ({
      index,
      worker: null,
      serving: false,
      endpoints: null,
      applied: null,
      overridesSeq: 0,
      restarts: 0,
      restartTimer: null,
      stopped: null,
    }));
  }

  /** Starts every worker; if one fails, stops them all and rejects with its error. */
  async start(): Promise<void> {
    const started = await Promise.allSettled(this.slots.map((slot) => this.startWorker(slot)));
    const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed === undefined) return;
    await this.stop();
    throw failed.reason;
  }

  /** Stops every worker (a grace period each, then terminate); no restart afterwards. */
  async stop(): Promise<void> {
    this.stopping = true;
    await Promise.all(this.slots.map((slot) => this.stopWorker(slot)));
  }

  get size(): number {
    return this.slots.length;
  }

  /** Workers serving now. */
  get serving(): number {
    return this.slots.filter((s) => s.serving).length;
  }

  /** True while every worker serves (always with no workers). */
  healthy(): boolean {
    return this.slots.every((s) => s.serving);
  }

  /** The sockets the workers serve on, in worker order. */
  endpoints(): { readonly unix: string[]; readonly tcp: string[] } {
    return {
      unix: this.slots.flatMap((s) =>
        s.endpoints?.unix === null || s.endpoints?.unix === undefined ? [] : [s.endpoints.unix],
      ),
      tcp: this.slots.flatMap((s) =>
        s.endpoints?.tcp === null || s.endpoints?.tcp === undefined ? [] : [s.endpoints.tcp],
      ),
    };
  }

  /** The fingerprint of the rules each worker has applied, in worker order. */
  rulesApplied(): (string | null)[] {
    return this.slots.map((s) => s.applied);
  }

  postRules(snapshot: RulesSnapshot): void {
    for (const slot of this.slots) slot.worker?.postMessage({ kind: 'rules', snapshot } satisfies MainToWorker);
  }

  /** The sequence number the next worker init's overrides table stands for. */
  get overridesSeq(): number {
    return this.overrideSeq;
  }

  /** Posts an overrides batch; resolves once every running worker has confirmed it. */
  postOverrides(entries: readonly OverrideEntry[]): Promise<void> {
    const seq = ++this.overrideSeq;
    for (const slot of this.slots) slot.worker?.postMessage({ kind: 'overrides', entries, seq } satisfies MainToWorker);
    return new Promise<void>((resolve) => {
      this.overrideWaiters.push({ seq, resolve });
      this.checkOverrideWaiters();
    });
  }

  /** Testing and drills: block worker `index`'s event loop for `ms`; resolves once it is blocked. */
  blockForTesting(index: number, ms: number): Promise<void> {
    return new Promise<void>((resolveBlocked, reject) => {
      const worker = this.slots[index]?.worker;
      if (worker === null || worker === undefined) {
        reject(new Error(`no running worker ${index}`));
        return;
      }
      const onMessage = (m: WorkerToMain): void => {
        if (m.kind !== 'blocking') return;
        worker.off('message', onMessage);
        resolveBlocked();
      };
      worker.on('message', onMessage);
      worker.postMessage({ kind: 'block', ms } satisfies MainToWorker);
    });
  }

  /** Testing: make worker `index` exit abruptly; it is restarted like after a crash. */
  crashForTesting(index: number): void {
    this.slots[index]?.worker?.postMessage({ kind: 'crash' } satisfies MainToWorker);
  }

  private checkOverrideWaiters(): void {
    for (let i = this.overrideWaiters.length - 1; i >= 0; i--) {
      const w = this.overrideWaiters[i];
      if (w === undefined || !this.slots.every((s) => s.worker === null || s.overridesSeq >= w.seq)) continue;
      this.overrideWaiters.splice(i, 1);
      w.resolve();
    }
  }

  private onMessage(slot: WorkerSlot, m: WorkerToMain): void {
    switch (m.kind) {
      case 'log':
        relayLog(this.options.workerLog, m.line);
        return;
      case 'throttle':
        this.options.onThrottle(m);
        return;
      case 'vkey':
        this.options.onVelocityKey(m.slot, m.gen, m.key);
        return;
      case 'overrides-applied':
        slot.overridesSeq = Math.max(slot.overridesSeq, m.seq);
        this.checkOverrideWaiters();
        return;
      case 'rules-applied':
        slot.applied = m.fingerprint;
        return;
      case 'rules-failed':
        this.options.log.error(
          { worker: slot.index, fingerprint: m.fingerprint, error: m.message },
          'a worker could not compile rules the main thread accepted; it keeps its previous rules',
        );
        return;
      case 'stopped':
        slot.serving = false;
        slot.stopped?.();
        return;
      case 'ready':
      case 'fatal':
        return; // handled by startWorker
      case 'blocking':
        return; // handled by blockForTesting
    }
  }

  private startWorker(slot: WorkerSlot): Promise<RlsEndpoints> {
    const log = this.options.log;
    return new Promise((resolveStart, rejectStart) => {
      const init = this.options.initFor(slot.index);
      slot.overridesSeq = this.overrideSeq; // init.overrides is the table as of this batch
      const worker = spawnWorker(init, this.options.resourceLimits);
      // Read now: a stopped Worker reports threadId -1.
      const threadId = worker.threadId;
      slot.worker = worker;
      let started = false;
      const timer = setTimeout(() => {
        if (started) return;
        started = true;
        rejectStart(new Error(`rls worker ${slot.index} did not start within ${WORKER_START_TIMEOUT_MS} ms`));
        void worker.terminate();
      }, WORKER_START_TIMEOUT_MS);
      worker.on('message', (m: WorkerToMain) => {
        if (!started && (m.kind === 'ready' || m.kind === 'fatal')) {
          started = true;
          clearTimeout(timer);
          if (m.kind === 'ready') {
            slot.serving = true;
            slot.endpoints = m.endpoints;
            slot.applied = init.rules.fingerprint;
            resolveStart(m.endpoints);
          } else {
            slot.worker = null;
            void worker.terminate();
            rejectStart(
              Object.assign(new Error(`rls worker ${slot.index}: ${m.message}`), {
                code: m.code ?? 'RLS_WORKER_FAILED',
              }),
            );
          }
          return;
        }
        this.onMessage(slot, m);
      });
      worker.on('error', (error) => {
        log.error({ worker: slot.index, err: error }, 'rls worker failed');
        if (!started) {
          started = true;
          clearTimeout(timer);
          rejectStart(error);
        }
      });
      worker.on('exit', (code) => {
        this.releaseHold(slot, threadId);
        const wasServing = slot.serving;
        slot.serving = false;
        slot.worker = null;
        slot.stopped?.();
        this.checkOverrideWaiters();
        if (!started) {
          started = true;
          clearTimeout(timer);
          rejectStart(new Error(`rls worker ${slot.index} exited with code ${code} while starting`));
          return;
        }
        if (this.stopping || !wasServing) return;
        const delay = Math.min(MAX_RESTART_BACKOFF_MS, MIN_RESTART_BACKOFF_MS * 2 ** Math.min(slot.restarts, 10));
        log.error(
          { worker: slot.index, exitCode: code, restartInMs: delay },
          'rls worker exited unexpectedly; restarting it',
        );
        this.scheduleRestart(slot, delay);
      });
    });
  }

  /** Releases what an exited worker's thread held in the bucket table (and its thread record). */
  private releaseHold(slot: WorkerSlot, threadId: number): void {
    const released = this.options.table.releaseThread(threadId);
    if (released !== null && (released.claim !== null || released.stripes > 0)) {
      this.options.log.warn(
        { worker: slot.index, slot: released.slot, claim: released.claim, stripes: released.stripes },
        'rls worker exited holding a bucket slot or insert stripe; released',
      );
    }
  }

  private scheduleRestart(slot: WorkerSlot, delay: number): void {
    const log = this.options.log;
    slot.restartTimer = setTimeout(() => {
      slot.restartTimer = null;
      if (this.stopping) return;
      slot.restarts++;
      this.options.onRestart();
      this.startWorker(slot).then(
        (endpoints) => log.info({ worker: slot.index, endpoints }, 'rls worker restarted'),
        (error: unknown) => {
          log.error({ worker: slot.index, err: error }, 'rls worker restart failed');
          if (!this.stopping) this.scheduleRestart(slot, Math.min(MAX_RESTART_BACKOFF_MS, delay * 2));
        },
      );
    }, delay);
    slot.restartTimer.unref();
  }

  private stopWorker(slot: WorkerSlot): Promise<void> {
    if (slot.restartTimer !== null) clearTimeout(slot.restartTimer);
    slot.restartTimer = null;
    const worker = slot.worker;
    if (worker === null) return Promise.resolve();
    return new Promise<void>((done) => {
      const timer = setTimeout(() => {
        void worker.terminate().then(() => done());
      }, WORKER_STOP_GRACE_MS + 3_000);
      slot.stopped = () => {
        clearTimeout(timer);
        slot.stopped = null;
        // The worker closes its port after 'stopped'; terminate makes sure the thread is gone.
        void worker.terminate().then(() => done());
      };
      worker.postMessage({ kind: 'stop', graceMs: WORKER_STOP_GRACE_MS } satisfies MainToWorker);
    });
  }
}

/** Starts agent-worker: the compiled .js next to this file, or the .ts source through tsx. */
function spawnWorker(init: WorkerInit, resourceLimits: ResourceLimits | undefined): Worker {
  return moduleWorker(import.meta.url, './agent-worker', {
    workerData: init,
    ...(resourceLimits === undefined ? {} : { resourceLimits }),
  });
}

const PINO_KEYS = new Set(['level', 'time', 'pid', 'hostname', 'msg']);
const PINO_LEVELS: Record<number, 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal'> = {
  10: 'trace',
  20: 'debug',
  30: 'info',
  40: 'warn',
  50: 'error',
  60: 'fatal',
};

/** Re-emits a worker's pino line through the agent's logger. */
function relayLog(logger: Logger, line: string): void {
  try {
    const record = JSON.parse(line) as Record<string, unknown>;
    const level = PINO_LEVELS[typeof record['level'] === 'number' ? record['level'] : 30] ?? 'info';
    const fields: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(record)) if (!PINO_KEYS.has(k)) fields[k] = v;
    logger[level](fields, typeof record['msg'] === 'string' ? record['msg'] : '');
  } catch {
    logger.info({ line }, 'worker log line');
  }
}
