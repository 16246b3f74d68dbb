// The parent's handle on one server under test running in testkit/processes/host.ts: fork, start,
// stop (asked, then SIGKILL), and a synchronous kill for the last-resort exit handler. The child's
// output is passed on prefixed with the server's name; its last lines go into a failed start's error.
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { FromHost, ToHost } from './host.js';
import type { ServerOptions } from './server-module.js';

const HOST = fileURLToPath(new URL('./host.ts', import.meta.url));
const REPO_ROOT = fileURLToPath(new URL('../..', import.meta.url));

export class ServerProcess {
  private exited = false;

  private constructor(
    readonly name: string,
    private readonly child: ChildProcess,
    readonly description: string,
    /** Every address the server answers on (several for the agent with several workers). */
    readonly endpoints: readonly string[],
  ) {}

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Forks the host, starts `modulePath` at `target`, resolves once it serves. */
  static async start(
    name: string,
    modulePath: string,
    target: string,
    options: ServerOptions,
    log: (line: string) => void,
    timeoutMs = 30_000,
  ): Promise<ServerProcess> {
    const child = fork(HOST, [], {
      cwd: REPO_ROOT,
      execArgv: [...(options.nodeFlags ?? []), '--import', 'tsx'],
      stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
    });
    const tail: string[] = [];
    const onOutput = (chunk: Buffer): void => {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line.trim() === '') continue;
        tail.push(line);
        if (tail.length > 20) tail.shift();
        log(`[${name}] ${line}`);
      }
    };
    child.stdout?.on('data', onOutput);
    child.stderr?.on('data', onOutput);
    let rejectEarly: (err: Error) => void = () => undefined;
    const onEarlyExit = (code: number | null, signal: NodeJS.Signals | null): void =>
      rejectEarly(
        new Error(
          `${name}: exited before it was ready (${signal ?? code})${tail.length > 0 ? ':\n' + tail.join('\n') : ''}`,
        ),
      );
    child.once('exit', onEarlyExit);
    try {
      const ready = await new Promise<{ description: string; endpoints: readonly string[] }>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`${name}: not ready after ${timeoutMs} ms`)), timeoutMs);
        rejectEarly = (err) => {
          clearTimeout(timer);
          reject(err);
        };
        child.once('error', reject);
        child.on('message', (msg: FromHost) => {
          if (msg.type === 'ready') {
            clearTimeout(timer);
            resolve({ description: msg.description, endpoints: msg.endpoints.length > 0 ? msg.endpoints : [target] });
          } else if (msg.type === 'failed') {
            clearTimeout(timer);
            reject(new Error(`${name}: ${msg.message}`));
          }
        });
        child.send({ type: 'start', modulePath, target, options } satisfies ToHost);
      });
      child.off('exit', onEarlyExit);
      const proc = new ServerProcess(name, child, ready.description, ready.endpoints);
      child.once('exit', () => {
        proc.exited = true;
      });
      return proc;
    } catch (err) {
      child.off('exit', onEarlyExit);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      throw err;
    }
  }

  get alive(): boolean {
    return !this.exited && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Asks the server to stop; SIGKILL after `graceMs`. Safe to call twice. */
  async stop(graceMs = 5000): Promise<void> {
    if (!this.alive) return;
    const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    try {
      if (this.child.connected) this.child.send({ type: 'stop' } satisfies ToHost);
      else this.child.kill('SIGTERM');
    } catch {
      this.child.kill('SIGTERM');
    }
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await exited;
    clearTimeout(timer);
  }

  killNow(): void {
    if (this.alive) this.child.kill('SIGKILL');
  }
}
