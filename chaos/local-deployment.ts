// The deployment a drill runs against: three coordinator replicas and one agent per cell, real
// processes on loopback started from this checkout (`node --import tsx cli/main.ts ...`), with a
// fault proxy (chaos/fault-proxy.ts) on every path a fault may cut:
//
//   coordinator i → coordinator j   one proxy per ordered pair: replica i's --peers names j at it,
//                                   so i→j and j→i can be cut apart (a one-way cut)
//   agent of cell c → coordinator j one proxy per pair: the agent's --coordinators is
//                                   j=PROXY,... so it follows a leader by id to its own proxy
//
// With `tls` (npm run chaos -- --tls, or CELLQUOTA_CHAOS_TLS=1) every replica runs with mutual TLS
// and its lease service on a port of its own (--lease-listen), and each agent with its cell's
// certificate (made under <dir>/pki by scripts/make-certs.sh); the proxies forward the TLS bytes.
//
// The admin API is not proxied: the drill's admin clients are operators, not part of the fault.
// Every process writes its output to <dir>/logs/<name>.log, kept as evidence next to the timeline.
//
// The agents' Unix sockets go into a short folder of their own under the system's temporary folder,
// not under <dir>: a socket path has at most 107 bytes (sun_path), and a checkout some 60 characters
// deep (a CI runner's workspace) would otherwise put `<dir>/<drill>/cell-a.sock` past it.
import { spawn, type ChildProcess } from 'node:child_process';
import {
  createWriteStream,
  existsSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  writeFileSync,
  type WriteStream,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { agentLeaseStatus, type AgentLeaseStatus } from './agent-lease-probe.js';
import { FaultProxy } from './fault-proxy.js';
import { freePort } from '../testkit/ports.js';
import { sleep, waitFor } from '../testkit/wait.js';
import { runningTargets, type DrillSpec, type DrillTarget } from './drill-target.js';
import { makeLocalPki, type LocalPki } from '../shared/make-certs.js';

const cliPath = resolve(import.meta.dirname, '../cli/main.ts');
/**
 * Longest Unix socket path the agents may be given: sun_path holds 108 bytes with the NUL on Linux
 * (104 on the BSDs), and an agent with several workers appends `.N` to its socket.
 */
const MAX_SOCKET_PATH = 100;

export interface DeploymentOptions {
  /** Where data and logs go (created). */
  readonly dir: string;
  readonly coordinators: readonly string[];
  readonly cells: readonly string[];
  /** The drill tenant's global quota (req/s) and burst. */
  readonly quota: number;
  readonly burst: number;
  /** Share of the quota split evenly over the cells as floors. */
  readonly floorFraction: number;
  /** The load the drills offer, req/s per cell in the order of `cells`. */
  readonly offered: readonly number[];
  /** Extra environment per coordinator id (e.g. a failing-disk shim). */
  readonly coordinatorEnv?: Readonly<Record<string, Readonly<Record<string, string>>>>;
  /** Mutual TLS everywhere, the lease service on its own port. */
  readonly tls?: boolean;
}

export const TENANT = 'acme';
export const DOMAIN = 'api';
export const TIER = 'gold';

interface Proc {
  readonly name: string;
  proc: ChildProcess | null;
  log: WriteStream;
  exit: { code: number | null; signal: string | null } | null;
  paused: boolean;
}

export interface CoordinatorInfo extends Proc {
  readonly id: string;
  readonly peerPort: number;
  readonly adminPort: number;
  /** The lease service's own port (with tls), else the peer port. */
  readonly leasePort: number;
  readonly dataDir: string;
}

export interface AgentInfo extends Proc {
  readonly cell: string;
  readonly socket: string;
  readonly httpPort: number;
}

export class LocalDeployment implements DrillTarget {
  readonly coordinators = new Map<string, CoordinatorInfo>();
  readonly agents = new Map<string, AgentInfo>();
  /** `${from}>${to}` → the proxy replica `from` reaches replica `to` through. */
  readonly peerProxies = new Map<string, FaultProxy>();
  /** `${cell}>${to}` → the proxy the agent of `cell` reaches replica `to` through. */
  readonly agentProxies = new Map<string, FaultProxy>();
  /** Extra environment per coordinator id, applied when it (re)starts. */
  readonly coordinatorEnv = new Map<string, Readonly<Record<string, string>>>();
  private readonly logDir: string;
  /** The agents' sockets (short, under the temporary folder); removed by stop(). */
  private readonly socketDir: string;
  private pki: LocalPki | null = null;

  private constructor(readonly opts: DeploymentOptions) {
    this.logDir = join(opts.dir, 'logs');
    this.socketDir = mkdtempSync(join(tmpdir(), 'cq-'));
    for (const [id, env] of Object.entries(opts.coordinatorEnv ?? {})) this.coordinatorEnv.set(id, env);
    runningTargets.add(this); // from before its first process starts, so an interrupted start is stopped too
  }

  get spec(): DrillSpec {
    // The agents run with the default --overload-allowance 1: each cell's allowance is its floor
    // (quota·floorFraction split evenly), one second deep.
    const floor = (this.opts.quota * this.opts.floorFraction) / this.opts.cells.length;
    const failOpenAllowance = {
      rate: floor * this.opts.cells.length,
      depth: Math.max(1, Math.floor(floor)) * this.opts.cells.length,
    };
    return {
      cells: this.opts.cells,
      coordinators: this.opts.coordinators,
      tenant: TENANT,
      domain: DOMAIN,
      quota: this.opts.quota,
      burst: this.opts.burst,
      offered: this.opts.offered,
      adminTier: TIER,
      adminToken: null,
      failOpenAllowance,
    };
  }

  rlsTargets(): string[] {
    return this.opts.cells.map((c) => this.agent(c).socket);
  }

  /** The replicas running and not paused. */
  adminUrls(): string[] {
    return this.opts.coordinators
      .filter((id) => this.coordinator(id).proc !== null && !this.coordinator(id).paused)
      .map((id) => this.adminUrl(id));
  }

  static async create(opts: DeploymentOptions): Promise<LocalDeployment> {
    const d = new LocalDeployment(opts);
    try {
      mkdirSync(d.logDir, { recursive: true });
      if (opts.tls === true) d.pki = makeLocalPki(join(opts.dir, 'pki'), opts.coordinators, opts.cells);
      for (const id of opts.coordinators) {
        const peerPort = await freePort();
        d.coordinators.set(id, {
          id,
          name: `coordinator-${id}`,
          peerPort,
          adminPort: await freePort(),
          leasePort: opts.tls === true ? await freePort() : peerPort,
          dataDir: join(opts.dir, 'data', id),
          proc: null,
          log: d.openLog(`coordinator-${id}`),
          exit: null,
          paused: false,
        });
      }
      for (const from of opts.coordinators) {
        for (const to of opts.coordinators) {
          if (from === to) continue;
          d.peerProxies.set(
            `${from}>${to}`,
            await FaultProxy.start({
              target: { host: '127.0.0.1', port: d.coordinator(to).peerPort },
              listen: { host: '127.0.0.1', port: await freePort() },
              name: `${from}>${to}`,
            }),
          );
        }
      }
      for (const cell of opts.cells) {
        for (const to of opts.coordinators) {
          d.agentProxies.set(
            `${cell}>${to}`,
            await FaultProxy.start({
              target: { host: '127.0.0.1', port: d.coordinator(to).leasePort },
              listen: { host: '127.0.0.1', port: await freePort() },
              name: `${cell}>${to}`,
            }),
          );
        }
        const socket = join(d.socketDir, `${cell}.sock`);
        if (Buffer.byteLength(socket) > MAX_SOCKET_PATH) {
          throw new Error(
            `the agent socket ${socket} is longer than ${MAX_SOCKET_PATH} bytes: set TMPDIR to a shorter folder`,
          );
        }
        d.agents.set(cell, {
          cell,
          name: `agent-${cell}`,
          socket,
          httpPort: await freePort(),
          proc: null,
          log: d.openLog(`agent-${cell}`),
          exit: null,
          paused: false,
        });
      }
      writeFileSync(
        join(opts.dir, 'rules.yaml'),
        `domain: ${DOMAIN}\ndescriptors:\n  - key: tenant\n    global: true\n`,
      );
    } catch (e) {
      await d.stop();
      throw e;
    }
    return d;
  }

  private openLog(name: string): WriteStream {
    return createWriteStream(join(this.logDir, `${name}.log`), { flags: 'a' });
  }

  coordinator(id: string): CoordinatorInfo {
    const c = this.coordinators.get(id);
    if (c === undefined) throw new Error(`no coordinator ${id}`);
    return c;
  }

  agent(cell: string): AgentInfo {
    const a = this.agents.get(cell);
    if (a === undefined) throw new Error(`no agent for cell ${cell}`);
    return a;
  }

  adminUrl(id: string): string {
    return `http://127.0.0.1:${this.coordinator(id).adminPort}`;
  }

  agentUrl(cell: string): string {
    return `http://127.0.0.1:${this.agent(cell).httpPort}`;
  }

  /** Every proxy between replica `id` and the other replicas, both directions. */
  peerLinks(id: string): { outbound: FaultProxy[]; inbound: FaultProxy[] } {
    const outbound: FaultProxy[] = [];
    const inbound: FaultProxy[] = [];
    for (const [key, p] of this.peerProxies) {
      const [from, to] = key.split('>');
      if (from === id) outbound.push(p);
      if (to === id) inbound.push(p);
    }
    return { outbound, inbound };
  }

  /** The proxies between a cell's agent and every replica. */
  cellLinks(cell: string): FaultProxy[] {
    return [...this.agentProxies].filter(([k]) => k.startsWith(`${cell}>`)).map(([, p]) => p);
  }

  private spawnLogged(p: Proc, args: readonly string[], env: Readonly<Record<string, string>> = {}): void {
    if (p.proc !== null) throw new Error(`${p.name} is already running`);
    p.log.write(`\n==== ${new Date().toISOString()} start: ${args.join(' ')}\n`);
    const proc = spawn(process.execPath, ['--import', 'tsx', cliPath, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ...env },
    });
    proc.stdout.pipe(p.log, { end: false });
    proc.stderr.pipe(p.log, { end: false });
    p.exit = null;
    p.paused = false;
    proc.on('exit', (code, signal) => {
      p.log.write(`\n==== ${new Date().toISOString()} exit: code ${code} signal ${signal}\n`);
      if (p.proc === proc) {
        p.proc = null;
        p.exit = { code, signal };
      }
    });
    p.proc = proc;
  }

  startCoordinator(id: string): void {
    const c = this.coordinator(id);
    const peers = this.opts.coordinators
      .map(
        (to) => `${to}=127.0.0.1:${to === id ? c.peerPort : (this.peerProxies.get(`${id}>${to}`) as FaultProxy).port}`,
      )
      .join(',');
    const adminPeers = this.opts.coordinators.map((to) => `${to}=${this.adminUrl(to)}`).join(',');
    this.spawnLogged(
      c,
      [
        'coordinator',
        '--id',
        id,
        '--peers',
        peers,
        '--data-dir',
        c.dataDir,
        '--admin',
        `127.0.0.1:${c.adminPort}`,
        '--admin-peers',
        adminPeers,
        '--floor-cells',
        String(this.opts.cells.length),
        '--log-level',
        'info',
        ...(this.pki === null
          ? []
          : [
              '--tls-ca',
              this.pki.ca,
              '--tls-cert',
              this.pki.replica(id).cert,
              '--tls-key',
              this.pki.replica(id).key,
              '--lease-listen',
              `127.0.0.1:${c.leasePort}`,
            ]),
      ],
      this.coordinatorEnv.get(id) ?? {},
    );
  }

  startAgent(cell: string): void {
    const a = this.agent(cell);
    const coordinators = this.opts.coordinators
      .map((to) => `${to}=127.0.0.1:${(this.agentProxies.get(`${cell}>${to}`) as FaultProxy).port}`)
      .join(',');
    // No tenants file: the tier and tenant come from the admin API (a fresh agent refuses a key until
    // its first grant, so it can never push the cells over the quota).
    this.spawnLogged(a, [
      'agent',
      '--cell',
      cell,
      '--rules',
      join(this.opts.dir, 'rules.yaml'),
      '--rls-socket',
      a.socket,
      '--http',
      `127.0.0.1:${a.httpPort}`,
      '--workers',
      '1',
      '--coordinators',
      coordinators,
      '--log-level',
      'info',
      ...(this.pki === null
        ? []
        : ['--tls-ca', this.pki.ca, '--tls-cert', this.pki.cell(cell).cert, '--tls-key', this.pki.cell(cell).key]),
    ]);
  }

  /** Starts everything, sets up the tier and tenant, and waits until every agent holds a lease. */
  async start(progress: (msg: string) => void): Promise<void> {
    progress(`starting ${this.opts.coordinators.length} coordinators`);
    for (const id of this.opts.coordinators) this.startCoordinator(id);
    const leader = await this.waitForLeader(60_000);
    progress(
      `leader ${leader}; tier ${TIER} (${this.opts.quota}/s, burst ${this.opts.burst}, floors ${this.opts.floorFraction}) and tenant ${TENANT}`,
    );
    await this.adminWrite('PUT', `/v1/tiers/${TIER}`, {
      rate: this.opts.quota,
      burst: this.opts.burst,
      floorFraction: this.opts.floorFraction,
    });
    await this.adminWrite('PUT', `/v1/tenants/${TENANT}`, { tier: TIER });
    progress(`starting ${this.opts.cells.length} agents`);
    for (const cell of this.opts.cells) this.startAgent(cell);
    for (const cell of this.opts.cells) await this.waitForAgent(cell, true, 60_000);
  }

  /** Waits until the agent serves (socket and /healthz), and, if `leased`, holds a lease. */
  async waitForAgent(cell: string, leased: boolean, timeoutMs: number): Promise<void> {
    const a = this.agent(cell);
    await waitFor(
      `agent ${cell} serving${leased ? ' with a lease' : ''}`,
      async () => {
        if (a.proc === null) throw new Error(`agent ${cell} exited: ${JSON.stringify(a.exit)}`);
        if (!existsSync(a.socket)) return false;
        const h = await fetch(`${this.agentUrl(cell)}/healthz`, { signal: AbortSignal.timeout(1000) });
        if (!h.ok) return false;
        if (!leased) return true;
        const metrics = await (
          await fetch(`${this.agentUrl(cell)}/metrics`, { signal: AbortSignal.timeout(1000) })
        ).text();
        return /^cellquota_agent_lease_state 1$/m.test(metrics);
      },
      { timeoutMs, everyMs: 200, fatal: (e) => e instanceof Error && e.message.includes('exited') },
    );
  }

  /** The slice the agent decides with for the drill tenant, null when unreachable. */
  agentLease(cell: string, timeoutMs = 500): Promise<AgentLeaseStatus | null> {
    return agentLeaseStatus(this.agentUrl(cell), timeoutMs);
  }

  async agentQuota(cell: string, timeoutMs = 500): Promise<{ source: string; rate: number; burst: number } | null> {
    try {
      const r = await fetch(`${this.agentUrl(cell)}/v1/quotas/tenant/${TENANT}`, {
        signal: AbortSignal.timeout(timeoutMs),
      });
      if (!r.ok) return null;
      return (await r.json()) as { source: string; rate: number; burst: number };
    } catch {
      return null;
    }
  }

  /** Each live replica's view of the cluster (stale read), null when it does not answer. */
  async clusterViews(
    timeoutMs = 500,
  ): Promise<Map<string, { leader: string | null; term: number; role: string } | null>> {
    const out = new Map<string, { leader: string | null; term: number; role: string } | null>();
    await Promise.all(
      this.opts.coordinators.map(async (id) => {
        const c = this.coordinator(id);
        if (c.proc === null || c.paused) {
          out.set(id, null);
          return;
        }
        try {
          const r = await fetch(`${this.adminUrl(id)}/v1/cluster?stale=true`, {
            signal: AbortSignal.timeout(timeoutMs),
          });
          out.set(id, r.ok ? ((await r.json()) as { leader: string | null; term: number; role: string }) : null);
        } catch {
          out.set(id, null);
        }
      }),
    );
    return out;
  }

  /** The leader named by the replica with the highest term among those that answer (null: none). */
  async leader(timeoutMs = 500): Promise<string | null> {
    let best: { leader: string | null; term: number } | null = null;
    for (const v of (await this.clusterViews(timeoutMs)).values()) {
      if (v !== null && (best === null || v.term > best.term || (v.term === best.term && best.leader === null)))
        best = v;
    }
    return best?.leader ?? null;
  }

  /** Polls until the live, unpaused replicas agree on a leader among them. */
  async waitForLeader(timeoutMs = 20_000): Promise<string> {
    let last = '';
    const until = Date.now() + timeoutMs;
    while (Date.now() < until) {
      const views = [...(await this.clusterViews()).entries()].filter(([, v]) => v !== null);
      const named = new Set(views.map(([, v]) => v?.leader ?? null));
      const [only] = [...named];
      if (views.length > 0 && named.size === 1 && typeof only === 'string') {
        const c = this.coordinators.get(only);
        if (c !== undefined && c.proc !== null && !c.paused) return only;
      }
      last = JSON.stringify(views);
      await sleep(100);
    }
    throw new Error(`no agreed leader within ${timeoutMs} ms (last views: ${last})`);
  }

  /** A write through any live replica, following the redirect to the leader; retried for 20 s. */
  async adminWrite(method: string, path: string, body: unknown): Promise<void> {
    const until = Date.now() + 20_000;
    let last = '';
    while (Date.now() < until) {
      for (const id of this.opts.coordinators) {
        const c = this.coordinator(id);
        if (c.proc === null || c.paused) continue;
        try {
          const r = await fetch(`${this.adminUrl(id)}${path}`, {
            method,
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify(body),
            signal: AbortSignal.timeout(5000),
          });
          const text = await r.text();
          if (r.ok) return;
          last = `${r.status} ${text}`;
        } catch (e) {
          last = String(e);
        }
      }
      await sleep(200);
    }
    throw new Error(`${method} ${path} did not succeed within 20 s: ${last}`);
  }

  /** Sends a signal to a coordinator; SIGKILL/SIGTERM wait for the exit. */
  async signalCoordinator(id: string, signal: 'SIGKILL' | 'SIGTERM' | 'SIGSTOP' | 'SIGCONT'): Promise<void> {
    await signalProc(this.coordinator(id), signal);
  }

  async signalAgent(cell: string, signal: 'SIGKILL' | 'SIGTERM' | 'SIGSTOP' | 'SIGCONT'): Promise<void> {
    await signalProc(this.agent(cell), signal);
  }

  /** Heals every proxy, resumes what is paused, kills every process, stops the proxies. */
  async stop(): Promise<void> {
    runningTargets.delete(this);
    const all: Proc[] = [...this.agents.values(), ...this.coordinators.values()];
    for (const p of all) {
      if (p.paused && p.proc !== null) p.proc.kill('SIGCONT');
      p.paused = false;
    }
    await Promise.all(all.map((p) => signalProc(p, 'SIGKILL')));
    await Promise.all([...this.peerProxies.values(), ...this.agentProxies.values()].map((p) => p.stop()));
    await Promise.all(all.map((p) => new Promise<void>((ok) => p.log.end(ok))));
    rmSync(this.socketDir, { recursive: true, force: true });
  }
}

async function signalProc(p: Proc, signal: 'SIGKILL' | 'SIGTERM' | 'SIGSTOP' | 'SIGCONT'): Promise<void> {
  const proc = p.proc;
  if (proc === null) return;
  if (signal === 'SIGSTOP' || signal === 'SIGCONT') {
    proc.kill(signal);
    p.paused = signal === 'SIGSTOP';
    p.log.write(`\n==== ${new Date().toISOString()} ${signal}\n`);
    return;
  }
  const exited = new Promise<void>((ok) => proc.once('exit', () => ok()));
  if (p.paused) proc.kill('SIGCONT');
  p.paused = false;
  proc.kill(signal);
  const timer = signal === 'SIGTERM' ? setTimeout(() => proc.kill('SIGKILL'), 10_000) : null;
  await exited;
  if (timer !== null) clearTimeout(timer);
}
