// The parent's handle on the load generator process (bench/load/loadgen.ts): forks it with tsx,
// sends jobs one at a time over IPC, relays its progress, and ends it.
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { FromLoadGen, LoadJob, PhaseResult, ToLoadGen } from './loadgen-protocol.js';

const SCRIPT = fileURLToPath(new URL('./loadgen.ts', import.meta.url));
const REPO_ROOT = fileURLToPath(new URL('../..', import.meta.url));

export type ProgressFn = (p: Extract<FromLoadGen, { type: 'progress' }>) => void;

export class LoadGenerator {
  private nextId = 1;
  private readonly pending = new Map<
    number,
    { resolve: (r: readonly PhaseResult[]) => void; reject: (e: Error) => void; progress: ProgressFn }
  >();
  private exited = false;

  private constructor(private readonly child: ChildProcess) {
    child.on('message', (msg: FromLoadGen) => {
      if (msg.type === 'ready') return;
      const p = this.pending.get(msg.id);
      if (p === undefined) return;
      if (msg.type === 'progress') p.progress(msg);
      else {
        this.pending.delete(msg.id);
        if (msg.type === 'result') p.resolve(msg.results);
        else p.reject(new Error(`load generator: ${msg.message}`));
      }
    });
    child.on('exit', (code, signal) => {
      this.exited = true;
      for (const p of this.pending.values()) p.reject(new Error(`load generator exited (${signal ?? code})`));
      this.pending.clear();
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  static start(): Promise<LoadGenerator> {
    const child = fork(SCRIPT, [], {
      cwd: REPO_ROOT,
      execArgv: ['--import', 'tsx', '--max-semi-space-size=32'],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const gen = new LoadGenerator(child);
    return new Promise((resolve, reject) => {
      const onExit = (code: number | null): void =>
        reject(new Error(`load generator exited before it was ready (${code})`));
      child.once('exit', onExit);
      child.once('error', reject);
      const onMessage = (msg: FromLoadGen): void => {
        if (msg.type !== 'ready') return;
        child.off('message', onMessage);
        child.off('exit', onExit);
        child.off('error', reject);
        resolve(gen);
      };
      child.on('message', onMessage);
    });
  }

  /** Runs a job; one result per target, in the job's order. */
  run(job: LoadJob, progress: ProgressFn = () => undefined): Promise<readonly PhaseResult[]> {
    if (this.exited) return Promise.reject(new Error('load generator has exited'));
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, progress });
      const msg: ToLoadGen = { type: 'job', id, job };
      this.child.send(msg);
    });
  }

  /** Ends the process (asks, then SIGKILL after `graceMs`). Safe to call twice. */
  async stop(graceMs = 2000): Promise<void> {
    if (this.exited || this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    try {
      if (this.child.connected) this.child.send({ type: 'exit' } satisfies ToLoadGen);
    } catch {
      // channel already closed
    }
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await exited;
    clearTimeout(timer);
  }

  /** Synchronous last resort (process 'exit' handler). */
  killNow(): void {
    if (!this.exited && this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
  }
}
