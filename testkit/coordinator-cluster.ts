// Real coordinator processes on loopback for the multi-process tests: started from the CLI source
// (node --import tsx cli/main.ts coordinator ...), each with its own data dir, peer port and admin
// port; killed with SIGKILL or stopped with SIGTERM; their output kept for assertions.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { freePort } from './ports.js';
import { waitFor } from './wait.js';

const cliPath = resolve(import.meta.dirname, '../cli/main.ts');

export interface Replica {
  readonly id: string;
  readonly peerPort: number;
  readonly adminPort: number;
  dataDir: string;
  proc: ChildProcess | null;
  output: string;
}

export interface HttpResult {
  status: number;
  body: Record<string, unknown>;
  headers: Headers;
}

export class CoordinatorCluster {
  readonly root: string;
  readonly replicas = new Map<string, Replica>();
  /** Sent by waitForLeader and write (not by http, so tests can check what happens without it). */
  authToken: string | undefined;
  /** Pass --admin-peers (every replica's admin URL) to each replica; false: leave it to derive them. */
  listAdminPeers = true;

  private constructor(
    root: string,
    private readonly extraArgs: readonly string[],
    /** Arguments of one replica only (its certificate, its lease port). */
    private readonly argsOf: (r: Replica) => readonly string[] = () => [],
  ) {
    this.root = root;
  }

  static async create(
    ids: readonly string[],
    extraArgs: readonly string[] = [],
    argsOf?: (r: Replica) => readonly string[],
  ): Promise<CoordinatorCluster> {
    const c = new CoordinatorCluster(mkdtempSync(join(tmpdir(), 'cq-cluster-')), extraArgs, argsOf);
    for (const id of ids) {
      c.replicas.set(id, {
        id,
        peerPort: await freePort(),
        adminPort: await freePort(),
        dataDir: join(c.root, id),
        proc: null,
        output: '',
      });
    }
    return c;
  }

  replica(id: string): Replica {
    const r = this.replicas.get(id);
    if (r === undefined) throw new Error(`no replica ${id}`);
    return r;
  }

  peersFlag(ids: readonly string[] = [...this.replicas.keys()]): string {
    return ids.map((id) => `${id}=127.0.0.1:${this.replica(id).peerPort}`).join(',');
  }

  adminPeersFlag(): string {
    return [...this.replicas.values()].map((r) => `${r.id}=http://127.0.0.1:${r.adminPort}`).join(',');
  }

  adminUrl(id: string): string {
    return `http://127.0.0.1:${this.replica(id).adminPort}`;
  }

  /** `env`: extra environment variables for this replica's process only (e.g. a fault shim's). */
  start(
    id: string,
    opts: { join?: boolean; peers?: readonly string[]; env?: Readonly<Record<string, string>> } = {},
  ): void {
    const r = this.replica(id);
    if (r.proc !== null) throw new Error(`${id} is already running`);
    const args = [
      '--import',
      'tsx',
      cliPath,
      'coordinator',
      '--id',
      id,
      '--peers',
      this.peersFlag(opts.peers),
      '--data-dir',
      r.dataDir,
      '--admin',
      `127.0.0.1:${r.adminPort}`,
      ...(this.listAdminPeers ? ['--admin-peers', this.adminPeersFlag()] : []),
      '--log-level',
      'info',
      ...(opts.join === true ? ['--join'] : []),
      ...this.extraArgs,
      ...this.argsOf(r),
    ];
    const proc = spawn(process.execPath, args, {
      stdio: ['ignore', 'pipe', 'pipe'],
      ...(opts.env === undefined ? {} : { env: { ...process.env, ...opts.env } }),
    });
    r.output = '';
    proc.stdout.on('data', (b: Buffer) => (r.output += b.toString()));
    proc.stderr.on('data', (b: Buffer) => (r.output += b.toString()));
    proc.on('exit', () => {
      if (r.proc === proc) r.proc = null;
    });
    r.proc = proc;
  }

  startAll(): void {
    for (const id of this.replicas.keys()) this.start(id);
  }

  async kill(id: string, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const r = this.replica(id);
    const proc = r.proc;
    if (proc === null) return;
    const exited = new Promise<void>((ok) => proc.once('exit', () => ok()));
    proc.kill(signal);
    await exited;
    r.proc = null;
  }

  async stopAll(): Promise<void> {
    await Promise.all([...this.replicas.keys()].map((id) => this.kill(id, 'SIGKILL')));
  }

  async cleanup(): Promise<void> {
    await this.stopAll();
    rmSync(this.root, { recursive: true, force: true });
  }

  async http(
    id: string,
    method: string,
    path: string,
    body?: unknown,
    headers: Record<string, string> = {},
  ): Promise<HttpResult> {
    const res = await fetch(`${this.adminUrl(id)}${path}`, {
      method,
      redirect: 'manual',
      headers: { ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      ...(body === undefined ? {} : { body: typeof body === 'string' ? body : JSON.stringify(body) }),
      signal: AbortSignal.timeout(10_000),
    });
    const text = await res.text();
    let parsed: Record<string, unknown>;
    try {
      parsed = text.length > 0 ? (JSON.parse(text) as Record<string, unknown>) : {};
    } catch {
      parsed = { raw: text };
    }
    return { status: res.status, body: parsed, headers: res.headers };
  }

  /** Polls until every running replica names the same leader; returns it. */
  async waitForLeader(timeoutMs = 20_000, among: readonly string[] = [...this.replicas.keys()]): Promise<string> {
    let last = '';
    return waitFor(
      'an agreed leader',
      async () => {
        const seen = new Set<string | null>();
        let answered = 0;
        for (const id of among) {
          if (this.replica(id).proc === null) continue;
          try {
            const r = await this.http(id, 'GET', '/v1/cluster?stale=true', undefined, this.adminAuth());
            if (r.status === 200) {
              answered++;
              seen.add((r.body['leader'] as string | null) ?? null);
            }
          } catch {
            // not up yet
          }
        }
        const [only] = [...seen];
        if (
          answered > 0 &&
          seen.size === 1 &&
          typeof only === 'string' &&
          among.includes(only) &&
          this.replica(only).proc !== null
        )
          return only;
        last = JSON.stringify([...seen]);
        return undefined;
      },
      { timeoutMs, everyMs: 100, context: () => `last seen: ${last}` },
    );
  }

  /** A write sent to the leader, following one redirect if leadership moved. */
  async write(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<HttpResult> {
    const leader = await this.waitForLeader();
    const h = { ...this.adminAuth(), ...headers };
    let r = await this.http(leader, method, path, body, h);
    if (r.status === 307) {
      const loc = r.headers.get('location') ?? '';
      const target = [...this.replicas.values()].find((x) => loc.startsWith(this.adminUrl(x.id)));
      if (target !== undefined) r = await this.http(target.id, method, path, body, h);
    }
    return r;
  }

  /** The admin API headers this cluster's writes carry (its bearer token, when it has one). */
  adminAuth(): Record<string, string> {
    return this.authToken === undefined ? {} : { authorization: `Bearer ${this.authToken}` };
  }
}
