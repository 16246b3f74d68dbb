// The drill runner's side of the load: forks chaos/load-process.ts, tells it the agents' sockets and
// the rate per cell, and merges the bins it reports (bins of send time, keyed by wall-clock index) on
// the drill's clock: ms since the drill started.
import { fork, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import type { BinUpdate, LoadBin, LoadCommand, LoadMessage } from './load-protocol.js';

const loadProcessPath = resolve(import.meta.dirname, 'load-process.ts');

/** One bin of send time as the runner keeps it: [t - durationMs, t) on the drill's clock. */
export interface RecordedBin {
  readonly t: number;
  readonly durationMs: number;
  readonly cells: readonly LoadBin[];
}

export class ChaosLoad {
  private readonly byIndex = new Map<number, { t: number; durationMs: number; cells: LoadBin[] }>();
  private stopped: Promise<void> | null = null;

  private constructor(
    private readonly child: ChildProcess,
    /** Wall-clock ms (performance.timeOrigin-based) of the drill's t = 0. */
    private readonly epochZero: number,
    private readonly cellCount: number,
  ) {}

  /** Starts sending at `rates` (req/s per cell, in the order of `sockets`); `clock` is the drill's. */
  static async start(opts: {
    sockets: readonly string[];
    rates: readonly number[];
    tenant: string;
    domain: string;
    binMs: number;
    clock: () => number;
  }): Promise<ChaosLoad> {
    const child = fork(loadProcessPath, [], {
      execArgv: ['--import', 'tsx'],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const epochZero = performance.timeOrigin + performance.now() - opts.clock();
    const load = new ChaosLoad(child, epochZero, opts.sockets.length);
    const started = new Promise<void>((ok, fail) => {
      child.once('error', fail);
      child.once('exit', (code) => fail(new Error(`load process exited (${code}) before starting`)));
      child.on('message', (raw: unknown) => {
        const m = raw as LoadMessage;
        if (m.kind === 'started') ok();
        else if (m.kind === 'bins') load.merge(m.binMs, m.updates);
      });
    });
    load.send({
      kind: 'start',
      sockets: opts.sockets,
      rates: opts.rates,
      tenant: opts.tenant,
      domain: opts.domain,
      binMs: opts.binMs,
    });
    await started;
    return load;
  }

  private merge(binMs: number, updates: readonly BinUpdate[]): void {
    for (const u of updates) {
      let bin = this.byIndex.get(u.index);
      if (bin === undefined) {
        bin = {
          t: (u.index + 1) * binMs - this.epochZero,
          durationMs: binMs,
          cells: Array.from({ length: this.cellCount }, () => ({
            sent: 0,
            admitted: 0,
            refused: 0,
            errors: 0,
            degraded: 0,
            failOpen: 0,
            latenciesUs: [],
            maxAdmittedLatencyUs: 0,
          })),
        };
        this.byIndex.set(u.index, bin);
      }
      const c = bin.cells[u.cell];
      if (c === undefined) continue;
      c.sent += u.delta.sent;
      c.admitted += u.delta.admitted;
      c.refused += u.delta.refused;
      c.errors += u.delta.errors;
      c.degraded += u.delta.degraded;
      c.failOpen += u.delta.failOpen;
      for (const l of u.delta.latenciesUs) c.latenciesUs.push(l);
      c.maxAdmittedLatencyUs = Math.max(c.maxAdmittedLatencyUs, u.delta.maxAdmittedLatencyUs);
    }
  }

  /** Every bin so far, in time order (empty bins between them included, so windows stay honest). */
  get bins(): RecordedBin[] {
    const keys = [...this.byIndex.keys()].sort((a, b) => a - b);
    if (keys.length === 0) return [];
    const out: RecordedBin[] = [];
    const first = keys[0] as number;
    const last = keys[keys.length - 1] as number;
    const sample = this.byIndex.get(first) as RecordedBin;
    for (let i = first; i <= last; i++) {
      const b = this.byIndex.get(i);
      out.push(
        b ?? {
          t: sample.t + (i - first) * sample.durationMs,
          durationMs: sample.durationMs,
          cells: Array.from({ length: this.cellCount }, () => ({
            sent: 0,
            admitted: 0,
            refused: 0,
            errors: 0,
            degraded: 0,
            failOpen: 0,
            latenciesUs: [],
            maxAdmittedLatencyUs: 0,
          })),
        },
      );
    }
    return out;
  }

  private send(cmd: LoadCommand): void {
    if (this.child.connected) this.child.send(cmd);
  }

  setRates(rates: readonly number[]): void {
    this.send({ kind: 'rates', rates });
  }

  /** Stops sending, waits for the answers in flight and the last bin, ends the process. */
  stop(): Promise<void> {
    this.stopped ??= new Promise<void>((ok) => {
      if (this.child.exitCode !== null || this.child.signalCode !== null) {
        ok();
        return;
      }
      const timer = setTimeout(() => this.child.kill('SIGKILL'), 5000);
      this.child.once('exit', () => {
        clearTimeout(timer);
        ok();
      });
      this.send({ kind: 'stop' });
    });
    return this.stopped;
  }
}
