// Issue 12 with real processes: three coordinators (test/coordinator/cluster/cluster-harness.ts) and
// cell agents started with --coordinators and rules only (no tenants file); checks over each
// agent's Envoy RLS Unix socket (shared/h2-raw.ts).
//
//   `npm run bench -- agent-tenants`   resident memory of one agent that has seen N distinct tenants
//        (1,000,000, or CELLQUOTA_BENCH_TENANTS; smoke 20,000), all of them held by the coordinators (bulk import, POST
//        /v1/tenants batches of 2,000): each tenant checked a few times in turn, RSS of the agent
//        process (/proc/PID/status VmRSS) sampled along, with what bounds it: the bucket table
//        (keys, evictions, its fixed capacity), the grants the lease client holds, the demand keys
//        the leader did not keep (--max-demand-keys).
//   `npm run bench -- coordinator-bound`   for findings 1, 2 and 3 of the issue, the largest 1 s
//        window (of send time) admitted by the two agents together for one quota, against
//        rate·(1 s + u) + burst (u the longest admitted answer's latency in that window):
//          1. one tenant reached through two domains, two rule paths and four request shapes;
//          2. after PUT /v1/tiers lowers the tier's rate (100 → 40): measured from one lease TTL
//             plus a round after the PUT, against the new rate (before that the old rate is counted
//             until every cell acknowledged, as the model says), and the transition against the old;
//          3. full start: rate 10, burst 50; cell-a drains, cell-b starts 0.6 s later (a grant moved
//             in, a new bucket), then the tenant is deleted and re-created under load.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { CoordinatorCluster } from '../testkit/coordinator-cluster.js';
import { AgentProcess } from '../testkit/agent-process.js';
import { sleep, waitFor } from '../testkit/wait.js';
import {
  RawH2Session,
  grpcRequestHeaderBlock,
  requestTemplate,
  type RequestTemplate,
  type StreamSink,
} from '../shared/h2-raw.js';
import {
  CODE_OK,
  FAIL_OPEN_FLAG,
  RLS_PATH,
  decodeResponse,
  encodeRateLimitRequest,
  grpcFrame,
  type WireEntry,
} from '../testkit/load/rls-wire.js';
import { machineLine, type BenchReport } from './bench-report.js';
import { DEFAULT_MAX_LEASE_KEYS } from '../cell-agent/lease/held-keys.js';

const IDS = ['n1', 'n2', 'n3'];
const BIN_MS = 100;

function startAgent(root: string, cell: string, rules: string, coordinators: string): Promise<AgentProcess> {
  return AgentProcess.start({
    cell,
    rules,
    coordinators,
    rlsSocket: join(root, `${cell}.sock`),
    logLevel: process.env['CELLQUOTA_BENCH_AGENT_LOG_LEVEL'] ?? 'warn',
  });
}

function socketOf(a: AgentProcess): string {
  if (a.rlsSocket === undefined) throw new Error(`agent ${a.cell} has no RLS socket`);
  return a.rlsSocket;
}

interface LeaseView {
  readonly state: string;
  readonly grants: number;
  readonly suspendedGrants: number;
  readonly released: number;
  readonly reportsOk: number;
  readonly reportsFailed: number;
  readonly reportBytes: number;
  readonly answerBytes: number;
}

/**
 * The coordinators as the agent-tenants run sees them: the highest Raft term any replica reports, the leader's slices
 * for `cell` (cellquota_ledger_slices; NaN when the build has no such metric or no replica answers within 10 s) and the
 * released slices dropped, summed over the replicas (each counts those it dropped as leader).
 */
async function coordinatorView(
  c: CoordinatorCluster,
  cell: string,
): Promise<{ term: number; slices: number; dropped: number }> {
  let term = NaN;
  let slices = NaN;
  let dropped = NaN;
  for (const id of IDS) {
    const text = await fetch(`${c.adminUrl(id)}/metrics`, { signal: AbortSignal.timeout(10_000) })
      .then((r) => r.text())
      .catch(() => '');
    const num = (re: RegExp): number => {
      const m = re.exec(text);
      return m === null ? NaN : Number(m[1]);
    };
    const t = num(/^cellquota_raft_term (\S+)$/m);
    if (!(t <= term)) term = t;
    const d = num(/^cellquota_lease_released_slices_dropped_total (\S+)$/m);
    if (!Number.isNaN(d)) dropped = (Number.isNaN(dropped) ? 0 : dropped) + d;
    if (num(/^cellquota_raft_is_leader (\S+)$/m) === 1)
      slices = num(new RegExp(`^cellquota_ledger_slices\\{cell="${cell}"\\} (\\S+)$`, 'm'));
  }
  return { term, slices, dropped };
}

/** The agent's lease client status (/healthz), NaN where the build does not say. */
async function leaseView(a: AgentProcess): Promise<LeaseView> {
  const h = (await (await fetch(`${a.url}/healthz`, { signal: AbortSignal.timeout(5000) })).json()) as {
    lease?: Partial<LeaseView> | null;
  };
  const l = h.lease ?? {};
  return {
    state: l.state ?? '?',
    grants: l.grants ?? NaN,
    suspendedGrants: l.suspendedGrants ?? NaN,
    released: l.released ?? NaN,
    reportsOk: l.reportsOk ?? NaN,
    reportsFailed: l.reportsFailed ?? NaN,
    reportBytes: l.reportBytes ?? NaN,
    answerBytes: l.answerBytes ?? NaN,
  };
}

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m === null ? NaN : Number(m[1]) / 1024;
}

async function waitServing(agents: readonly AgentProcess[]): Promise<void> {
  for (const a of agents) {
    await a.waitHealthy(90_000);
    await waitFor(`agent ${a.cell} leased`, async () => (await a.metric('cellquota_agent_lease_state')) === 1, {
      timeoutMs: 90_000,
      everyMs: 200,
      context: () => a.describe(),
    });
  }
}

function template(domain: string, descriptors: readonly (readonly WireEntry[])[]): RequestTemplate {
  return requestTemplate(
    grpcRequestHeaderBlock(RLS_PATH, 'localhost'),
    grpcFrame(encodeRateLimitRequest(domain, descriptors)),
  );
}

// ---- agent-tenants ------------------------------------------------------------------------------

/** Answers counted; `done` resolves once `expected` answers came back. */
class Counter implements StreamSink {
  answered = 0;
  ok = 0;
  /** Later checks (token AGAIN) answered OK: tenants admitted on a grant. */
  okAgain = 0;
  errors = 0;
  streamDone(token: unknown, body: Buffer | null, error: string | null): void {
    this.answered++;
    if (error !== null || body === null) this.errors++;
    else if ((decodeResponse(body) & 0xffff) === CODE_OK) {
      this.ok++;
      if (token === AGAIN) this.okAgain++;
    }
  }
}

/** The token of a tenant's later checks. */
const AGAIN = Symbol('again');
/** A tenant is checked again this long after its previous check: a report interval (500 ms) and a round, and some. */
const AGAIN_AFTER_MS = 900;
/**
 * Checks per tenant: the first is refused (the agent holds nothing for it; the refusal is its demand),
 * the second meets the grant with a new bucket, which starts empty for a global quota (DESIGN: no
 * restart releases an extra burst) and is refused too; the third meets what the bucket filled since.
 */
const CHECKS_PER_TENANT = 3;

/** The agent's warnings and errors (JSON log lines of level ≥ 40), by message, with a count. */
function agentWarnings(output: string): string {
  const byMsg = new Map<string, number>();
  for (const line of output.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const l = JSON.parse(line) as { level?: number; msg?: string };
      if ((l.level ?? 0) >= 40) byMsg.set(l.msg ?? '?', (byMsg.get(l.msg ?? '?') ?? 0) + 1);
    } catch {
      // not a log line
    }
  }
  return byMsg.size === 0 ? 'none' : [...byMsg].map(([m, n]) => `${n} × "${m.slice(0, 120)}"`).join('; ');
}

export interface AgentTenantsOptions {
  readonly smoke: boolean;
  readonly progress: (msg: string) => void;
  readonly tenants?: number;
}

export async function runAgentTenantsBench(opts: AgentTenantsOptions): Promise<BenchReport> {
  // CELLQUOTA_BENCH_TENANTS: a smaller full run (1,000,000 takes about an hour on a 2-core machine).
  const n = opts.tenants ?? (Number(process.env['CELLQUOTA_BENCH_TENANTS']) || (opts.smoke ? 20_000 : 1_000_000));
  const rounds = CHECKS_PER_TENANT;
  const loadBefore = os.loadavg()[0] ?? 0;
  const c = await CoordinatorCluster.create(IDS, ['--floor-cells', '2']);
  let agent: AgentProcess | null = null;
  let session: RawH2Session | null = null;
  try {
    writeFileSync(join(c.root, 'rules.yaml'), 'domain: api\ndescriptors:\n  - key: tenant\n    global: true\n');
    c.startAll();
    await c.waitForLeader(90_000);
    await c.write('PUT', '/v1/tiers/gold', { rate: 100, burst: 100, floorFraction: 0.5 });
    opts.progress(`importing ${n.toLocaleString('en-US')} tenants (POST /v1/tenants, 2,000 a batch)`);
    const t0 = performance.now();
    const leader = await c.waitForLeader();
    for (let i = 0; i < n; i += 2000) {
      const tenants = Array.from({ length: Math.min(2000, n - i) }, (_, j) => ({ id: `t-${i + j}`, tier: 'gold' }));
      const r = await fetch(`${c.adminUrl(leader)}/v1/tenants`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ tenants }),
      });
      const body = (await r.json()) as { failed?: unknown[] };
      if (r.status !== 200 || (body.failed?.length ?? 0) > 0)
        throw new Error(`POST /v1/tenants: ${r.status} ${JSON.stringify(body).slice(0, 300)}`);
      if (i % 200_000 === 0 && i > 0) opts.progress(`  ${i.toLocaleString('en-US')} imported`);
    }
    const importS = (performance.now() - t0) / 1000;
    const termAfterImport = (await coordinatorView(c, 'cell-a')).term;
    const coordinators = IDS.map((id) => `127.0.0.1:${c.replica(id).peerPort}`).join(',');
    agent = await startAgent(c.root, 'cell-a', join(c.root, 'rules.yaml'), coordinators);
    await waitServing([agent]);
    const pid = agent.proc.pid ?? 0;
    const baseline = rssMiB(pid);
    const capacity = await agent.metric('cellquota_agent_bucket_table_capacity');
    const maxLeaseKeys = process.env['CELLQUOTA_MAX_LEASE_KEYS'] ?? `${DEFAULT_MAX_LEASE_KEYS} (default)`;
    const sink = new Counter();
    session = await RawH2Session.connect(socketOf(agent), sink);
    interface Sample {
      seen: number;
      rss: number;
      heap: number;
      external: number;
      keys: number;
      lease: LeaseView;
      /** The highest Raft term, and the leader's ledger slices for the agent's cell. */
      term: number;
      slices: number;
      /** Encoded bytes per report (and per answer) since the previous sample. */
      reportB: number;
      answerB: number;
    }
    const samples: Sample[] = [];
    let prevLease: LeaseView | null = null;
    const sample = async (seen: number): Promise<void> => {
      if (agent === null) return;
      const l = await leaseView(agent);
      const cv = await coordinatorView(c, 'cell-a');
      const calls =
        prevLease === null ? NaN : l.reportsOk + l.reportsFailed - prevLease.reportsOk - prevLease.reportsFailed;
      const per = (now: number, before: number | undefined): number =>
        calls > 0 && before !== undefined ? Math.round((now - before) / calls) : NaN;
      samples.push({
        seen,
        rss: rssMiB(pid),
        heap: (await agent.metric('nodejs_heap_size_used_bytes')) / 2 ** 20,
        external: (await agent.metric('nodejs_external_memory_bytes')) / 2 ** 20,
        keys: await agent.metric('cellquota_agent_bucket_table_keys'),
        lease: l,
        term: cv.term,
        slices: cv.slices,
        reportB: per(l.reportBytes, prevLease?.reportBytes),
        answerB: per(l.answerBytes, prevLease?.answerBytes),
      });
      prevLease = l;
      const s = samples[samples.length - 1];
      opts.progress(
        `  ${seen.toLocaleString('en-US')} tenants seen: RSS ${s?.rss.toFixed(0)} MiB (main heap ${s?.heap.toFixed(0)}), table keys ${s?.keys}, lease grants ${l.grants} (+${l.suspendedGrants} suspended), released ${l.released}, reports ${l.reportsOk} ok / ${l.reportsFailed} failed, ${s?.reportB} B/report, ${s?.answerB} B/answer; lease ${l.state}, Raft term ${cv.term}, leader's slices for cell-a ${cv.slices}`,
      );
    };
    await sample(0);
    const step = Math.max(1000, Math.floor(n / 10));
    const batch = 2000;
    let sent = 0;
    const driveStart = performance.now();
    // Each batch of tenants is checked once (refused: the agent holds nothing for them, and reports
    // the refusals as demand), then again at least AGAIN_AFTER_MS later, and once more after as long,
    // pipelined behind the next batches' first checks: by then a report and a round have granted
    // them, so the agent holds grants for most tenants it has seen (the later checks answered OK
    // count the tenants admitted on them).
    let pending: { templates: RequestTemplate[]; at: number; left: number }[] = [];
    const again = async (all: boolean): Promise<void> => {
      for (const p of pending) {
        const wait = p.at + AGAIN_AFTER_MS - performance.now();
        if (wait > 0 && !all && p !== pending[0]) continue;
        if (wait > 0) await sleep(wait);
        for (const t of p.templates) session?.request(t, AGAIN);
        sent += p.templates.length;
        p.left--;
        p.at = performance.now();
      }
      pending = pending.filter((p) => p.left > 0);
    };
    for (let from = 0; from < n; from += batch) {
      const templates = Array.from({ length: Math.min(batch, n - from) }, (_, j) =>
        template('api', [[{ key: 'tenant', value: `t-${from + j}` }]]),
      );
      const at = performance.now();
      for (const t of templates) session.request(t, null);
      sent += templates.length;
      await again(false);
      while (sink.answered < sent) await new Promise((res) => setTimeout(res, 5));
      pending.push({ templates, at, left: rounds - 1 });
      if ((from + batch) % step < batch) await sample(Math.min(n, from + batch));
    }
    while (pending.length > 0) await again(true);
    while (sink.answered < sent) await new Promise((res) => setTimeout(res, 5));
    const driveS = (performance.now() - driveStart) / 1000;
    await new Promise((r) => setTimeout(r, 5000));
    await sample(n);
    const last = samples[samples.length - 1];
    const evictions = await agent.metric('cellquota_agent_bucket_evictions_total');
    const coord = await coordinatorView(c, 'cell-a');
    const droppedVelocity = await agent.metric('cellquota_agent_velocity_dropped_total');
    let demandDropped = NaN;
    for (const id of IDS) {
      const text = await (await fetch(`${c.adminUrl(id)}/metrics`)).text().catch(() => '');
      const m = /^cellquota_lease_demand_keys_dropped_total (\S+)$/m.exec(text);
      if (m !== null && Number(m[1]) > 0) demandDropped = Number(m[1]);
      else if (m !== null && Number.isNaN(demandDropped)) demandDropped = 0;
    }
    const growth =
      samples.length > 2
        ? (((samples[samples.length - 1]?.rss ?? 0) - (samples[1]?.rss ?? 0)) /
            Math.max(1, n - (samples[1]?.seen ?? 0))) *
          1e6
        : NaN;
    return {
      name: 'agent-tenants',
      title: `Resident memory of an agent that has seen ${n.toLocaleString('en-US')} distinct tenants held by the coordinators${opts.smoke ? ' (smoke)' : ''}`,
      rows: samples.map((s) => ({
        'tenants seen': s.seen,
        'RSS MiB': Math.round(s.rss),
        'main heap used MiB': Math.round(s.heap),
        'main external MiB': Math.round(s.external),
        'table keys': s.keys,
        'lease grants held': s.lease.grants,
        'suspended grants': s.lease.suspendedGrants,
        'keys released': s.lease.released,
        'reports ok': s.lease.reportsOk,
        'reports failed': s.lease.reportsFailed,
        lease: s.lease.state,
        'Raft term': s.term,
        'leader slices (cell)': s.slices,
        'report B/round': s.reportB,
        'answer B/round': s.answerB,
      })),
      notes: [
        `Machine: ${machineLine()}; 1-min load ${loadBefore.toFixed(1)} before, ${(os.loadavg()[0] ?? 0).toFixed(1)} after.`,
        `Agent: 1 worker, --coordinators (3 real coordinators), rules only; bucket table capacity ${capacity} (fixed shared memory, allocated at start: part of the baseline RSS ${baseline.toFixed(0)} MiB). Tenants imported in ${importS.toFixed(0)} s; ${sent.toLocaleString('en-US')} checks (${rounds} per tenant, batches of ${batch}) in ${driveS.toFixed(0)} s; ${sink.errors} errors, ${sink.ok.toLocaleString('en-US')} admitted (${sink.okAgain.toLocaleString('en-US')} of them on a later check: a tenant's first check is refused, the agent holding nothing for it; its second meets a new, empty bucket).`,
        `Agent warnings and errors: ${agentWarnings(agent.output)}.`,
        `Coordinators: Raft term ${termAfterImport} after the import, ${coord.term} at the end (${coord.term - termAfterImport} elections while the agent ran); the leader's ledger slices for cell-a at the end ${coord.slices} (cellquota_ledger_slices), released slices dropped ${coord.dropped} (cellquota_lease_released_slices_dropped_total, summed over the replicas); the agent's lease at the end: ${last?.lease.state}, ${last?.lease.grants} grants in force, reports ${last?.lease.reportsOk} ok / ${last?.lease.reportsFailed} failed.`,
        `After all ${n.toLocaleString('en-US')}: RSS ${last?.rss.toFixed(0)} MiB (${growth.toFixed(1)} MiB per million tenants past the first sample); table keys ${last?.keys}, evictions ${evictions}; lease grants held ${last?.lease.grants} (+${last?.lease.suspendedGrants} suspended, ${last?.lease.released} keys released past --max-lease-keys ${maxLeaseKeys}); velocity keys dropped ${droppedVelocity}; demand keys the leader did not keep (--max-demand-keys) ${demandDropped}.`,
      ],
    };
  } finally {
    await session?.close();
    dumpLogs(c, agent === null ? [] : [agent]);
    if (agent !== null) await agent.kill();
    await c.cleanup();
  }
}

/** CELLQUOTA_BENCH_LOGS=DIR: every process's kept output to DIR/<name>.log (what went wrong in a run). */
function dumpLogs(c: CoordinatorCluster, agents: readonly AgentProcess[]): void {
  const dir = process.env['CELLQUOTA_BENCH_LOGS'];
  if (dir === undefined || dir === '') return;
  mkdirSync(dir, { recursive: true });
  for (const id of IDS) writeFileSync(join(dir, `${id}.log`), c.replica(id).output);
  for (const a of agents) writeFileSync(join(dir, `${a.cell}.log`), a.output);
}

// ---- coordinator-bound ---------------------------------------------------------------------------

interface Bin {
  admitted: number;
  sent: number;
  failOpen: number;
  errors: number;
  maxLatencyMs: number;
}

/** Open-loop paced checks per cell (each cell cycles through its request shapes), binned by send time. */
class Paced implements StreamSink {
  readonly bins: Bin[] = [];
  readonly t0 = performance.now();
  private readonly sessions: RawH2Session[] = [];
  private shapes: RequestTemplate[][] = [];
  private rates: number[] = [];
  private credit: number[] = [];
  private next: number[] = [];
  private timer: NodeJS.Timeout | null = null;
  private last = 0;
  private inFlight = 0;

  static async connect(agents: readonly AgentProcess[]): Promise<Paced> {
    const p = new Paced();
    for (const a of agents) p.sessions.push(await RawH2Session.connect(socketOf(a), p));
    p.rates = agents.map(() => 0);
    p.credit = agents.map(() => 0);
    p.next = agents.map(() => 0);
    p.shapes = agents.map(() => []);
    return p;
  }

  now(): number {
    return performance.now() - this.t0;
  }

  set(cell: number, rate: number, shapes?: RequestTemplate[]): void {
    this.rates[cell] = rate;
    if (shapes !== undefined) this.shapes[cell] = shapes;
  }

  start(): void {
    this.last = this.now();
    this.timer = setInterval(() => this.tick(), 5);
  }

  private bin(at: number): Bin {
    const i = Math.floor(at / BIN_MS);
    while (this.bins.length <= i) this.bins.push({ admitted: 0, sent: 0, failOpen: 0, errors: 0, maxLatencyMs: 0 });
    return this.bins[i] as Bin;
  }

  private tick(): void {
    const now = this.now();
    const dt = Math.min(100, now - this.last) / 1000;
    this.last = now;
    for (let c = 0; c < this.sessions.length; c++) {
      const shapes = this.shapes[c] ?? [];
      const due = (this.credit[c] ?? 0) + (this.rates[c] ?? 0) * dt;
      const k = Math.floor(due);
      this.credit[c] = due - k;
      if (k === 0 || shapes.length === 0) continue;
      this.bin(now).sent += k;
      for (let i = 0; i < k; i++) {
        const t = shapes[(this.next[c] = ((this.next[c] ?? 0) + 1) % shapes.length)] as RequestTemplate;
        this.inFlight++;
        this.sessions[c]?.request(t, now);
      }
    }
  }

  streamDone(token: unknown, body: Buffer | null, error: string | null): void {
    this.inFlight--;
    const at = token as number;
    const b = this.bin(at);
    if (error !== null || body === null) {
      b.errors++;
      return;
    }
    const r = decodeResponse(body);
    if (r < 0) b.errors++;
    else if ((r & 0xffff) === CODE_OK && (r & FAIL_OPEN_FLAG) !== 0) b.failOpen++;
    else if ((r & 0xffff) === CODE_OK) {
      b.admitted++;
      b.maxLatencyMs = Math.max(b.maxLatencyMs, this.now() - at);
    }
  }

  async stop(): Promise<void> {
    if (this.timer !== null) clearInterval(this.timer);
    const end = Date.now() + 3000;
    while (this.inFlight > 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
    await Promise.all(this.sessions.map((s) => s.close()));
  }

  /** The 1 s window (of send time) in [fromMs, toMs) with the most admitted over rate·(1 s + u) + burst. */
  worst(
    fromMs: number,
    toMs: number,
    rate: number,
    burst: number,
  ): { admitted: number; limit: number; slackMs: number; errors: number; failOpen: number } {
    let worst = { admitted: 0, limit: rate + burst, slackMs: 0, errors: 0, failOpen: 0 };
    let margin = -Infinity;
    let errors = 0;
    let failOpen = 0;
    for (let i = Math.ceil(fromMs / BIN_MS); (i + 10) * BIN_MS <= toMs && i + 10 <= this.bins.length; i++) {
      let admitted = 0;
      let slack = 0;
      for (let j = i; j < i + 10; j++) {
        const b = this.bins[j] as Bin;
        admitted += b.admitted;
        slack = Math.max(slack, b.maxLatencyMs);
      }
      errors += this.bins[i]?.errors ?? 0;
      failOpen += this.bins[i]?.failOpen ?? 0;
      const limit = rate * (1 + slack / 1000) + burst;
      if (admitted - limit > margin) {
        margin = admitted - limit;
        worst = { admitted, limit, slackMs: slack, errors: 0, failOpen: 0 };
      }
    }
    return { ...worst, errors, failOpen };
  }
}

const RULES_API = `domain: api
descriptors:
  - key: tenant
    global: true
  - key: route
    value: upload
    descriptors:
      - key: tenant
        global: true
`;
const RULES_WEB = `domain: web
descriptors:
  - key: customer
    global: true
`;

export async function runCoordinatorBoundBench(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
}): Promise<BenchReport> {
  const scale = opts.smoke ? 0.5 : 1;
  const loadBefore = os.loadavg()[0] ?? 0;
  const c = await CoordinatorCluster.create(IDS, ['--floor-cells', '2']);
  const agents: AgentProcess[] = [];
  let load: Paced | null = null;
  try {
    const rules = join(c.root, 'rules');
    mkdirSync(rules);
    writeFileSync(join(rules, 'api.yaml'), RULES_API);
    writeFileSync(join(rules, 'web.yaml'), RULES_WEB);
    c.startAll();
    await c.waitForLeader(90_000);
    const put = async (path: string, body: unknown): Promise<void> => {
      const r = await c.write('PUT', path, body);
      if (r.status !== 200) throw new Error(`PUT ${path}: ${r.status} ${JSON.stringify(r.body)}`);
    };
    await put('/v1/tiers/gold', { rate: 20, burst: 10, floorFraction: 0.5 });
    await put('/v1/tiers/demo', { rate: 100, burst: 100, floorFraction: 0.5 });
    await put('/v1/tiers/deep', { rate: 10, burst: 50, floorFraction: 0.5 });
    await put('/v1/tenants/acme', { tier: 'gold' });
    await put('/v1/tenants/lowered', { tier: 'demo' });
    await put('/v1/tenants/fresh', { tier: 'deep' });
    const coordinators = IDS.map((id) => `127.0.0.1:${c.replica(id).peerPort}`).join(',');
    opts.progress('starting 2 agents (--coordinators, rules only)');
    for (const cell of ['cell-a', 'cell-b']) agents.push(await startAgent(c.root, cell, rules, coordinators));
    await waitServing(agents);
    load = await Paced.connect(agents);
    load.start();
    const rows: Record<string, number | string>[] = [];
    const row = (finding: string, what: string, rate: number, burst: number, w: ReturnType<Paced['worst']>): void => {
      rows.push({
        finding,
        measured: what,
        'rate/s': rate,
        burst,
        'largest 1 s admitted': w.admitted,
        'rate·(1 s+u) + burst': Math.round(w.limit * 10) / 10,
        'u ms': Math.round(w.slackMs),
        within: w.admitted <= w.limit ? 'yes' : 'NO',
        errors: w.errors,
        'fail-open': w.failOpen,
      });
      opts.progress(`  ${finding} ${what}: ${w.admitted} admitted in the worst 1 s against ${w.limit.toFixed(1)}`);
    };

    // 1. One tenant through two domains, two rule paths, four request shapes, on both cells.
    opts.progress('finding 1: acme (20/s, burst 10) through 4 request shapes on both cells, 100/s each');
    const shapes1 = [
      template('api', [[{ key: 'tenant', value: 'acme' }]]),
      template('api', [
        [
          { key: 'route', value: 'upload' },
          { key: 'tenant', value: 'acme' },
        ],
      ]),
      template('web', [[{ key: 'customer', value: 'acme' }]]),
      template('api', [
        [{ key: 'tenant', value: 'acme' }],
        [
          { key: 'route', value: 'upload' },
          { key: 'tenant', value: 'acme' },
        ],
      ]),
    ];
    let from = load.now();
    load.set(0, 100, shapes1);
    load.set(1, 100, shapes1);
    await sleep(10_000 * scale);
    load.set(0, 0);
    load.set(1, 0);
    row('1', 'one tenant, 2 domains, 2 rule paths, 4 shapes, 2 cells', 20, 10, load.worst(from, load.now(), 20, 10));
    await sleep(1500);

    // 2. Lowering the tier's rate with PUT /v1/tiers (100 → 40): the floors and grants follow.
    opts.progress('finding 2: lowered (tier demo 100/s → 40/s) with cell-a at 150/s and cell-b at 40/s');
    const shapes2 = [template('api', [[{ key: 'tenant', value: 'lowered' }]])];
    from = load.now();
    load.set(0, 150, shapes2);
    load.set(1, 40, shapes2);
    await sleep(6000 * scale);
    const putAt = load.now();
    await put('/v1/tiers/demo', { rate: 40, burst: 40, floorFraction: 0.5 });
    const settled = load.now() + 3000 + 1000; // one lease TTL and the skew margin: every old grant acknowledged or expired
    await sleep(Math.max(0, settled - load.now()) + 10_000 * scale);
    load.set(0, 0);
    load.set(1, 0);
    const end2 = load.now();
    row('2', 'before the PUT (rate 100)', 100, 100, load.worst(from, putAt, 100, 100));
    row(
      '2',
      'the transition (PUT + TTL + margin), against the old rate',
      100,
      100,
      load.worst(putAt, settled + 1000, 100, 100),
    );
    row('2', 'after it, against the new rate 40', 40, 40, load.worst(settled, end2, 40, 40));
    await sleep(1500);

    // 3. Full start: cell-a drains the burst, cell-b starts 0.6 s later; then delete + re-create under load.
    opts.progress(
      'finding 3: fresh (10/s, burst 50): cell-a drains, cell-b starts 0.6 s later; delete and re-create under load',
    );
    const shapes3 = [template('api', [[{ key: 'tenant', value: 'fresh' }]])];
    from = load.now();
    load.set(0, 200, shapes3);
    await sleep(600);
    load.set(1, 200, shapes3);
    await sleep(6000 * scale);
    const r1 = await c.write('DELETE', '/v1/tenants/fresh');
    if (r1.status !== 200) throw new Error(`DELETE fresh: ${r1.status}`);
    await sleep(2000);
    await put('/v1/tenants/fresh', { tier: 'deep' });
    await sleep(8000 * scale);
    load.set(0, 0);
    load.set(1, 0);
    row('3', 'new buckets, a grant moved in, delete + re-create', 10, 50, load.worst(from, load.now(), 10, 50));
    return {
      name: 'coordinator-bound',
      title: `The bound for findings 1–3 of issue 12: largest 1 s window admitted by two agents together${opts.smoke ? ' (smoke)' : ''}`,
      rows,
      notes: [
        `Machine: ${machineLine()}; 1-min load ${loadBefore.toFixed(1)} before, ${(os.loadavg()[0] ?? 0).toFixed(1)} after.`,
        '3 coordinators (--floor-cells 2) and 2 agents (1 worker each, --coordinators, rules only: domains api and web, tenant global through two rule paths, customer global in web) as real processes; open-loop checks over each agent\'s RLS Unix socket, binned by send time in 100 ms bins; a window\'s bound is rate·(1 s + u) + burst with u the longest latency of an admitted answer sent in it (the decision lies between send and answer). Fail-open answers (overload) are counted apart and not in "admitted".',
      ],
    };
  } finally {
    await load?.stop();
    await Promise.all(agents.map((a) => a.kill()));
    await c.cleanup();
  }
}
