// The accuracy scenario with real processes, shared by test/e2e/accuracy.test.ts and
// bench/accuracy.ts: three coordinators (optional), one cell agent per cell, one tenant with a global
// quota Q, and ONE lean load generator (this process) that sends Envoy RLS checks over each agent's
// Unix socket (shared/h2-raw.ts: gRPC frames prepared once, answers read at the frame level),
// paced (open loop) at a rate per cell that can be changed at any time. Every answer is counted in
// 100 ms bins per cell (sent, admitted, refused, errors, degraded), in the bin its check was SENT in
// (whenever the answer came back); the analysis helpers below turn the bins into rates, windows
// (with the admitted answers' latency as the slack of the bound) and convergence times.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CoordinatorCluster } from './coordinator-cluster.js';
import { makeLocalPki } from '../shared/make-certs.js';
import {
  RawH2Session,
  grpcRequestHeaderBlock,
  requestTemplate,
  type RequestTemplate,
  type StreamSink,
} from '../shared/h2-raw.js';
import {
  CODE_OK,
  CODE_OVER_LIMIT,
  DEGRADED_FLAG,
  FAIL_OPEN_FLAG,
  RLS_PATH,
  decodeResponse,
  encodeRateLimitRequest,
  grpcFrame,
} from './load/rls-wire.js';
import { RedisServer, findRedisServer } from './processes/redis-server.js';
import { ServerProcess } from './processes/server-process.js';
import { freePort } from './ports.js';
import { waitFor } from './wait.js';

const agentCli = resolve(import.meta.dirname, '../cell-agent/agent-cli.ts');
export const BIN_MS = 100;

export interface ScenarioOptions {
  /** The tenant's quota (req/s). */
  readonly quota: number;
  readonly burst: number;
  readonly cells: readonly string[];
  /** Leased from three coordinators (floorFraction of the quota split over the cells as floors), or
   * every agent alone on a static share of the quota (no coordinator at all), or — no agent at
   * all — one RLS server per cell (each a process of its own running `serverModule`, e.g.
   * bench/servers/rlf-quota.ts) all counting in ONE redis-server: rate-limiter-flexible's RateLimiterRedis, a fixed window of
   * `quota` points per 1 s (the burst is not used: a fixed window has none). Needs redis-server
   * (on PATH or $REDIS_SERVER): Scenario.start throws when there is none. */
  readonly mode:
    /** tls (default: CELLQUOTA_E2E_TLS=1): mutual TLS everywhere, the lease service on its own port. */
    | { readonly kind: 'leased'; readonly floorFraction: number; readonly tls?: boolean }
    | { readonly kind: 'static'; readonly share: number }
    | { readonly kind: 'central-redis'; readonly serverModule: string };
}

/** Where the checks of one cell go: an agent's socket, or a central-redis RLS server's. */
export interface CellTarget {
  readonly cell: string;
  readonly socket: string;
}

export interface RunningAgent {
  readonly cell: string;
  readonly socket: string;
  readonly httpUrl: string;
  readonly proc: ChildProcess;
  output: string;
}

export class Scenario {
  /** Mode 'central-redis': the shared redis-server and the RLS server of each cell (no agents). */
  redis: RedisServer | null = null;
  readonly rlsServers: { readonly cell: string; readonly socket: string; readonly proc: ServerProcess }[] = [];

  private constructor(
    readonly opts: ScenarioOptions,
    readonly root: string,
    readonly cluster: CoordinatorCluster | null,
    readonly agents: RunningAgent[],
  ) {}

  /** The socket of each cell, in the order of opts.cells: its agent's, or its RLS server's. */
  targets(): CellTarget[] {
    return this.opts.mode.kind === 'central-redis'
      ? this.rlsServers.map((r) => ({ cell: r.cell, socket: r.socket }))
      : this.agents.map((a) => ({ cell: a.cell, socket: a.socket }));
  }

  /** Starts everything and waits until every agent serves (and, leased, holds a lease). */
  static async start(opts: ScenarioOptions, progress: (msg: string) => void = () => undefined): Promise<Scenario> {
    const tls = opts.mode.kind === 'leased' && (opts.mode.tls ?? process.env['CELLQUOTA_E2E_TLS'] === '1');
    const leasePorts = new Map<string, number>();
    if (tls) for (const id of ['n1', 'n2', 'n3']) leasePorts.set(id, await freePort());
    const pkiDir = (dataDir: string): string => join(dataDir, '..', 'pki');
    const cluster =
      opts.mode.kind === 'leased'
        ? await CoordinatorCluster.create(['n1', 'n2', 'n3'], ['--floor-cells', String(opts.cells.length)], (r) =>
            tls
              ? [
                  '--tls-ca',
                  join(pkiDir(r.dataDir), 'ca.pem'),
                  '--tls-cert',
                  join(pkiDir(r.dataDir), `replica-${r.id}.pem`),
                  '--tls-key',
                  join(pkiDir(r.dataDir), `replica-${r.id}.key`),
                  '--lease-listen',
                  `127.0.0.1:${leasePorts.get(r.id) ?? 0}`,
                ]
              : [],
          )
        : null;
    const root = cluster?.root ?? mkdtempSync(join(tmpdir(), 'cq-accuracy-'));
    const s = new Scenario(opts, root, cluster, []);
    try {
      if (opts.mode.kind === 'central-redis') {
        const bin = findRedisServer();
        if (bin === null)
          throw new Error('central-redis: redis-server is not installed (not on PATH, $REDIS_SERVER unset)');
        progress(
          `starting redis-server (${bin}) and ${opts.cells.length} RLS servers counting in it (rate-limiter-flexible RateLimiterRedis, ${opts.quota} points per 1 s)`,
        );
        s.redis = await RedisServer.start(bin, root);
        const redisSocket = s.redis.socket;
        const quota = { domain: 'api', key: 'tenant', points: opts.quota, durationSec: 1 };
        let output = '';
        const keep = (line: string): void => {
          output = (output + line + '\n').slice(-20_000);
        };
        const serverModule = opts.mode.serverModule;
        const started = await Promise.allSettled(
          opts.cells.map(async (cell) => {
            const socket = join(root, `${cell}.sock`);
            const proc = await ServerProcess.start(
              cell,
              serverModule,
              socket,
              { scratchDir: root, store: 'redis', redisSocket, quota },
              keep,
            );
            s.rlsServers.push({ cell, socket, proc });
          }),
        );
        const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
        if (failed !== undefined)
          throw new Error(
            `central-redis: an RLS server did not start: ${String(failed.reason)}\n${output.slice(-2000)}`,
          );
        s.rlsServers.sort((a, b) => opts.cells.indexOf(a.cell) - opts.cells.indexOf(b.cell));
        return s;
      }
      writeFileSync(join(root, 'rules.yaml'), 'domain: api\ndescriptors:\n  - key: tenant\n    global: true\n');
      let coordinators: string | null = null;
      let agentTls: (cell: string) => string[] = () => [];
      let share: number;
      if (cluster !== null && opts.mode.kind === 'leased') {
        const pki = tls ? makeLocalPki(join(root, 'pki'), ['n1', 'n2', 'n3'], opts.cells) : null;
        agentTls = (cell) =>
          pki === null ? [] : ['--tls-ca', pki.ca, '--tls-cert', pki.cell(cell).cert, '--tls-key', pki.cell(cell).key];
        progress(`starting 3 coordinators${tls ? ' (mutual TLS, leases on their own port)' : ''}`);
        cluster.startAll();
        await cluster.waitForLeader(60_000);
        const tier = await cluster.write('PUT', '/v1/tiers/gold', {
          rate: opts.quota,
          burst: opts.burst,
          floorFraction: opts.mode.floorFraction,
        });
        if (tier.status !== 200) throw new Error(`PUT tier: ${tier.status} ${JSON.stringify(tier.body)}`);
        const tenant = await cluster.write('PUT', '/v1/tenants/acme', { tier: 'gold' });
        if (tenant.status !== 200) throw new Error(`PUT tenant: ${tenant.status} ${JSON.stringify(tenant.body)}`);
        coordinators = [...cluster.replicas.values()]
          .map((r) => (tls ? `${r.id}=127.0.0.1:${leasePorts.get(r.id) ?? 0}` : `127.0.0.1:${r.peerPort}`))
          .join(',');
        share = 0; // unused: leased agents take every quota and floor from the coordinators
      } else {
        // Alone: the tenant comes from a tenants file, at a static share of it.
        writeFileSync(
          join(root, 'tenants.yaml'),
          `tiers:\n  gold: {rate: ${opts.quota}, burst: ${opts.burst}}\ntenants:\n  acme: gold\n`,
        );
        share = opts.mode.kind === 'static' ? opts.mode.share : 1;
      }
      progress(`starting ${opts.cells.length} agents (${coordinators === null ? `static share ${share}` : 'leased'})`);
      for (const cell of opts.cells) s.agents.push(await startAgent(root, cell, share, coordinators, agentTls(cell)));
      for (const a of s.agents) {
        await waitFor(
          `agent ${a.cell} serving`,
          async () => existsSync(a.socket) && (await fetch(`${a.httpUrl}/healthz`)).ok,
          { timeoutMs: 60_000, everyMs: 200, context: () => a.output },
        );
        if (coordinators !== null)
          await waitFor(
            `agent ${a.cell} leased`,
            async () => (await agentMetric(a, 'cellquota_agent_lease_state')) === 1,
            { timeoutMs: 60_000, everyMs: 200, context: () => a.output },
          );
      }
      return s;
    } catch (err) {
      await s.stop();
      throw err;
    }
  }

  /** The slice per cell as the coordinators' ledger has it (stale read on any replica): the rate the
   * cell may use, max(grant, floor). */
  async slices(): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    if (this.cluster === null) return out;
    for (const r of this.cluster.replicas.values()) {
      if (r.proc === null) continue;
      try {
        const t = await this.cluster.http(r.id, 'GET', '/v1/tenants/acme?stale=true');
        const slices = (t.body['slices'] ?? []) as { cellId: string; rate: number; floorRate: number }[];
        for (const sl of slices) out.set(sl.cellId, Math.round(Math.max(sl.rate, sl.floorRate) * 10) / 10);
        return out;
      } catch {
        // try the next replica
      }
    }
    return out;
  }

  async stop(): Promise<void> {
    await Promise.allSettled(this.rlsServers.map((r) => r.proc.stop(2000)));
    await this.redis?.stop();
    for (const a of this.agents) {
      if (a.proc.exitCode === null && a.proc.signalCode === null) {
        const exited = new Promise<void>((ok) => a.proc.once('exit', () => ok()));
        a.proc.kill('SIGKILL');
        await exited;
      }
    }
    if (this.cluster !== null) await this.cluster.cleanup();
    else rmSync(this.root, { recursive: true, force: true });
  }
}

async function startAgent(
  root: string,
  cell: string,
  share: number,
  coordinators: string | null,
  extra: readonly string[] = [],
): Promise<RunningAgent> {
  const port = await freePort();
  const socket = join(root, `${cell}.sock`);
  // With coordinators no tenants file: every tenant comes from the admin API.
  const args = [
    '--import',
    'tsx',
    agentCli,
    '--cell',
    cell,
    '--rules',
    join(root, 'rules.yaml'),
    '--rls-socket',
    socket,
    '--http',
    `127.0.0.1:${port}`,
    '--workers',
    '1',
    '--lag-threshold-ms',
    '0',
    ...(coordinators === null
      ? ['--tenants', join(root, 'tenants.yaml'), '--static-share', String(share)]
      : ['--coordinators', coordinators]),
    ...extra,
  ];
  const proc = spawn(process.execPath, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, CELLQUOTA_LOG_LEVEL: 'warn' },
  });
  const agent: RunningAgent = { cell, socket, httpUrl: `http://127.0.0.1:${port}`, proc, output: '' };
  const keep = (b: Buffer): void => {
    agent.output = (agent.output + b.toString()).slice(-20_000);
  };
  proc.stdout.on('data', keep);
  proc.stderr.on('data', keep);
  return agent;
}

export async function agentMetric(agent: RunningAgent, name: string): Promise<number | null> {
  const text = await (await fetch(`${agent.httpUrl}/metrics`, { signal: AbortSignal.timeout(2000) })).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m === null ? null : Number(m[1]);
}

/** Counts of one cell over one 100 ms bin (by the time the answer arrived; `sent` by send time). */
/** Counts of one cell's checks SENT in one 100 ms bin, with what came back for them whenever it came
 * (so a stall of this process cannot bunch answers into a window they were not decided in). */
export interface Bin {
  sent: number;
  admitted: number;
  refused: number;
  errors: number;
  degraded: number;
  /** OK answers given without a decision (x-ratelimit-fail-open): not in `admitted`. */
  failOpen: number;
  /** The longest latency of an admitted answer, ms: its decision lies within [send, send + this]. */
  maxAdmittedLatencyMs: number;
}

const emptyBin = (): Bin => ({
  sent: 0,
  admitted: 0,
  refused: 0,
  errors: 0,
  degraded: 0,
  failOpen: 0,
  maxAdmittedLatencyMs: 0,
});

interface Sent {
  readonly cell: number;
  readonly at: number;
}

/**
 * Paced checks for tenant `acme` over every cell's socket: each cell has a rate (req/s) that may be
 * changed at any time; a 5 ms timer sends what is due (fractional credit carried over), so a cell
 * gets its rate whatever the answers do (open loop). One HTTP/2 connection per cell.
 */
export class PacedLoad implements StreamSink {
  readonly bins: Bin[][];
  private readonly sessions: RawH2Session[] = [];
  private readonly template: RequestTemplate;
  private rates: number[];
  private credit: number[];
  private timer: NodeJS.Timeout | null = null;
  private last = 0;
  readonly t0: number;
  private inFlight = 0;

  private constructor(readonly cells: readonly string[]) {
    this.bins = cells.map(() => []);
    this.rates = cells.map(() => 0);
    this.credit = cells.map(() => 0);
    this.template = requestTemplate(
      grpcRequestHeaderBlock(RLS_PATH, 'localhost'),
      grpcFrame(encodeRateLimitRequest('api', [[{ key: 'tenant', value: 'acme' }]])),
    );
    this.t0 = performance.now();
  }

  /** One connection per cell: to its agent (a RunningAgent is a CellTarget), or to whatever Scenario.targets() names. */
  static async connect(cells: readonly CellTarget[]): Promise<PacedLoad> {
    const load = new PacedLoad(cells.map((a) => a.cell));
    for (const a of cells) load.sessions.push(await RawH2Session.connect(a.socket, load));
    return load;
  }

  /** ms since the load was created (the bins' time base). */
  now(): number {
    return performance.now() - this.t0;
  }

  setRates(rates: readonly number[]): void {
    this.rates = [...rates];
  }

  start(): void {
    this.last = this.now();
    this.timer = setInterval(() => this.tick(), 5);
  }

  private bin(cell: number, atMs: number): Bin {
    const row = this.bins[cell] as Bin[];
    const i = Math.floor(atMs / BIN_MS);
    while (row.length <= i) row.push(emptyBin());
    return row[i] as Bin;
  }

  private tick(): void {
    const now = this.now();
    const dt = Math.min(100, now - this.last) / 1000;
    this.last = now;
    for (let c = 0; c < this.sessions.length; c++) {
      const due = (this.credit[c] ?? 0) + (this.rates[c] ?? 0) * dt;
      const n = Math.floor(due);
      this.credit[c] = due - n;
      if (n === 0) continue;
      this.bin(c, now).sent += n;
      const session = this.sessions[c] as RawH2Session;
      for (let i = 0; i < n; i++) {
        this.inFlight++;
        session.request(this.template, { cell: c, at: now } satisfies Sent);
      }
    }
  }

  streamDone(token: unknown, body: Buffer | null, error: string | null): void {
    this.inFlight--;
    const sent = token as Sent;
    const b = this.bin(sent.cell, sent.at);
    if (error !== null || body === null) {
      b.errors++;
      return;
    }
    const r = decodeResponse(body);
    if ((r & DEGRADED_FLAG) !== 0 && r >= 0) b.degraded++;
    const code = r < 0 ? -1 : r & 0xffff;
    if (code === CODE_OK && (r & FAIL_OPEN_FLAG) !== 0) b.failOpen++;
    else if (code === CODE_OK) {
      b.admitted++;
      b.maxAdmittedLatencyMs = Math.max(b.maxAdmittedLatencyMs, this.now() - sent.at);
    } else if (code === CODE_OVER_LIMIT) b.refused++;
    else b.errors++;
  }

  /** Stops sending, waits (≤ 2 s) for the answers in flight, closes the connections. */
  async stop(): Promise<void> {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    const until = Date.now() + 2000;
    while (this.inFlight > 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
    await Promise.all(this.sessions.map((s) => s.close()));
  }

  /** Sums of cell `cell` (or of every cell when null) over [fromMs, toMs). */
  sum(cell: number | null, fromMs: number, toMs: number): Bin {
    const out = emptyBin();
    const rows = cell === null ? this.bins : [this.bins[cell] ?? []];
    for (const row of rows) {
      for (let i = Math.floor(fromMs / BIN_MS); i < Math.ceil(toMs / BIN_MS) && i < row.length; i++) {
        const b = row[i];
        if (b === undefined) continue;
        out.sent += b.sent;
        out.admitted += b.admitted;
        out.refused += b.refused;
        out.errors += b.errors;
        out.degraded += b.degraded;
        out.failOpen += b.failOpen;
        out.maxAdmittedLatencyMs = Math.max(out.maxAdmittedLatencyMs, b.maxAdmittedLatencyMs);
      }
    }
    return out;
  }

  /** Admitted per second by `cell` in consecutive steps of `stepMs` over [fromMs, toMs) (bins aligned). */
  trace(cell: number, fromMs: number, toMs: number, stepMs = 200): number[] {
    const out: number[] = [];
    for (let t = Math.ceil(fromMs / BIN_MS) * BIN_MS; t + stepMs <= toMs; t += stepMs)
      out.push(Math.round(this.admittedRate(cell, t, t + stepMs)));
    return out;
  }

  /** Admitted per second by `cell` (every cell when null) over [fromMs, toMs). */
  admittedRate(cell: number | null, fromMs: number, toMs: number): number {
    return this.sum(cell, fromMs, toMs).admitted / ((toMs - fromMs) / 1000);
  }

  /** The most admitted (all cells) in any window of `windowMs` (whole bins) within [fromMs, toMs). */
  maxWindow(fromMs: number, toMs: number, windowMs = 1000): number {
    return this.worstWindow(fromMs, toMs, 0, 0, windowMs).admitted;
  }

  /**
   * The window of send time closest to (or furthest over) the bound: checks sent within `windowMs`
   * and admitted were decided within windowMs + u, u the longest admitted latency among them, so the
   * bound for them is quota·(windowMs + u) + burst — exact whatever this process's scheduling was.
   */
  worstWindow(
    fromMs: number,
    toMs: number,
    quota: number,
    burst: number,
    windowMs = 1000,
  ): { admitted: number; limit: number; slackMs: number } {
    let worst = { admitted: 0, limit: quota * (windowMs / 1000) + burst, slackMs: 0 };
    let margin = -Infinity;
    for (let t = Math.ceil(fromMs / BIN_MS) * BIN_MS; t + windowMs <= toMs; t += BIN_MS) {
      let slack = 0;
      for (const row of this.bins) {
        for (let i = Math.floor(t / BIN_MS); i < Math.ceil((t + windowMs) / BIN_MS) && i < row.length; i++)
          slack = Math.max(slack, row[i]?.maxAdmittedLatencyMs ?? 0);
      }
      const admitted = this.sum(null, t, t + windowMs).admitted;
      const limit = quota * ((windowMs + slack) / 1000) + burst;
      if (admitted - limit > margin) {
        margin = admitted - limit;
        worst = { admitted, limit, slackMs: slack };
      }
    }
    return worst;
  }

  /**
   * ms from `fromMs` until cell `cell` first admits at ≥ `target` req/s over a window of `windowMs`
   * (default 200 ms: two bins; the window's end is the time reported, so the figure includes the
   * window itself), or null when it does not within [fromMs, toMs).
   */
  convergenceMs(cell: number, target: number, fromMs: number, toMs: number, windowMs = 200): number | null {
    for (let end = Math.ceil(fromMs / BIN_MS) * BIN_MS + windowMs; end <= toMs; end += BIN_MS) {
      if (this.admittedRate(cell, end - windowMs, end) >= target) return Math.round(end - fromMs);
    }
    return null;
  }
}

/**
 * What each cell may admit under max-min fairness: every cell keeps at least its floor (the ledger
 * counts a cell at max(grant, floor) whatever its demand), and the rest of the quota is water-filled
 * over the demands above the floors. This is "its demand" for a cell when the cells together want
 * more than the quota: a cell that wants more than its fair share is entitled to that share, no more.
 */
export function fairShares(demands: readonly number[], quota: number, floors: readonly number[]): number[] {
  const out = demands.map((_, i) => floors[i] ?? 0);
  let free = quota - out.reduce((a, b) => a + b, 0);
  let open = demands.map((d, i) => i).filter((i) => (demands[i] ?? 0) > (out[i] ?? 0));
  while (free > 1e-9 && open.length > 0) {
    const each = free / open.length;
    const next: number[] = [];
    for (const i of open) {
      const want = (demands[i] ?? 0) - (out[i] ?? 0);
      const give = Math.min(want, each);
      out[i] = (out[i] ?? 0) + give;
      free -= give;
      if (want > each) next.push(i);
    }
    if (next.length === open.length) break;
    open = next;
  }
  return out;
}
