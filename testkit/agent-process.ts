// A real cell agent process on loopback for the multi-process tests and benchmarks: started from the
// CLI source (node --import tsx cli/main.ts agent ...) with --coordinators and rules only, on a free
// HTTP port (and an RLS Unix socket when asked), its output kept (the last OUTPUT_KEPT characters),
// ready once /healthz answers. Beside CoordinatorCluster, which starts the coordinators it reports to.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { freePort } from './ports.js';
import { waitFor } from './wait.js';

const cliPath = resolve(import.meta.dirname, '../cli/main.ts');

/** Characters of an agent's output (stdout and stderr interleaved) kept for assertions and failure reports. */
export const OUTPUT_KEPT = 200_000;
/** Characters of the output a failure report quotes. */
const TAIL = 4_000;

export interface AgentProcessOptions {
  readonly cell: string;
  /** --rules: a file or a folder. */
  readonly rules: string;
  /** --coordinators: host:port,... (omit for an agent without coordinators). */
  readonly coordinators?: string;
  /** --workers (default 1). */
  readonly workers?: number;
  /** --rls-socket: the Envoy RLS service on this Unix socket too. */
  readonly rlsSocket?: string;
  /** --log-level (default info). */
  readonly logLevel?: string;
  /** Further flags, after the ones above. */
  readonly args?: readonly string[];
  /** Extra environment variables for this process only. */
  readonly env?: Readonly<Record<string, string>>;
}

export class AgentProcess {
  readonly cell: string;
  readonly url: string;
  readonly rlsSocket: string | undefined;
  readonly proc: ChildProcess;
  /** Resolves with the exit code (null when ended by a signal) once the process has exited. */
  readonly exit: Promise<number | null>;
  private out = '';
  private exitDescription: string | null = null;

  private constructor(opts: AgentProcessOptions, port: number) {
    this.cell = opts.cell;
    this.url = `http://127.0.0.1:${port}`;
    this.rlsSocket = opts.rlsSocket;
    const args = [
      '--import',
      'tsx',
      cliPath,
      'agent',
      '--cell',
      opts.cell,
      '--rules',
      opts.rules,
      '--http',
      `127.0.0.1:${port}`,
      ...(opts.coordinators === undefined ? [] : ['--coordinators', opts.coordinators]),
      ...(opts.rlsSocket === undefined ? [] : ['--rls-socket', opts.rlsSocket]),
      '--workers',
      String(opts.workers ?? 1),
      '--lag-threshold-ms',
      '0',
      '--log-level',
      opts.logLevel ?? 'info',
      ...(opts.args ?? []),
    ];
    this.proc = spawn(process.execPath, args, {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ...opts.env },
    });
    const keep = (b: Buffer): void => {
      this.out += b.toString();
      if (this.out.length > OUTPUT_KEPT * 2) this.out = this.out.slice(-OUTPUT_KEPT);
    };
    this.proc.stdout?.on('data', keep);
    this.proc.stderr?.on('data', keep);
    this.exit = new Promise((ok) =>
      this.proc.once('exit', (code, signal) => {
        this.exitDescription = signal === null ? `exit code ${code}` : `signal ${signal}`;
        ok(code);
      }),
    );
  }

  /** Spawns the agent (not yet serving: see waitHealthy). */
  static async start(opts: AgentProcessOptions): Promise<AgentProcess> {
    return new AgentProcess(opts, await freePort());
  }

  /** Its output so far (the last OUTPUT_KEPT characters at least). */
  get output(): string {
    return this.out.slice(-OUTPUT_KEPT);
  }

  /** How it ended ("exit code 1", "signal SIGKILL"), null while it runs. */
  get exited(): string | null {
    return this.exitDescription;
  }

  /** Whether it ended, and the end of its output: for the message of a failed wait or check. */
  describe(): string {
    const state = this.exitDescription === null ? 'running' : `exited (${this.exitDescription})`;
    return `agent ${this.cell} ${state}; last output:\n${this.out.slice(-TAIL)}`;
  }

  /** Polls until /healthz answers 200 (and the RLS socket exists); fails at once if the process exits. */
  async waitHealthy(timeoutMs = 60_000): Promise<void> {
    await waitFor(
      `agent ${this.cell} serving /healthz`,
      async () => {
        if (this.exitDescription !== null) throw new AgentExited(this.describe());
        if (this.rlsSocket !== undefined && !existsSync(this.rlsSocket)) return false;
        const r = await fetch(`${this.url}/healthz`, { signal: AbortSignal.timeout(2000) });
        await r.arrayBuffer();
        return r.ok;
      },
      { timeoutMs, everyMs: 100, context: () => this.describe(), fatal: (e) => e instanceof AgentExited },
    );
  }

  /** One sample of a metric from /metrics (the first series of that name), NaN if absent. */
  async metric(name: string): Promise<number> {
    const r = await fetch(`${this.url}/metrics`, { signal: AbortSignal.timeout(5000) });
    const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(await r.text());
    return m === null ? NaN : Number(m[1]);
  }

  /** Sends `signal` (default SIGKILL) and waits until the process has exited. */
  async kill(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    if (this.exitDescription === null) this.proc.kill(signal);
    await this.exit;
  }
}

/** A wait for an agent that ended: the wait stops at once, naming how and the output's end. */
export class AgentExited extends Error {}
