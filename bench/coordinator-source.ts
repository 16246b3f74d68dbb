// `npm run bench -- coordinator-source`: the coordinator as the one source of every quota (issue 12).
//
//   PUT → admitted   three real coordinators and two real agents with rules only (no tenants
//                    file): for each of N tenants, the time from its PUT /v1/tenants/:id answer to
//                    the first check each agent admits on a leased grant (polled every 20 ms over
//                    HTTP); median and max over N (20; smoke 3). The agent learns a key by reporting
//                    its refusals, so this is about one report interval (500 ms) plus one round.
//   lease bytes      in process, over the real ledger and the lease protocol's real protobuf
//                    encoding, with T active tenants on a cell (100,000; smoke 2,000): the bytes of
//                    a report carrying velocity for all of them (what the agent sends each interval)
//                    and of a sweep and delta reports (the agent's own report builder); then the real
//                    paged messages: the real LeaseService (rounds every 100 ms) and LeaseClient over
//                    gRPC, each report and answer serialized as the transport sends it — a new
//                    incarnation's picture in pages, and steady exchanges with 1% of the demands
//                    moving each report (what a round costs).
import { writeFileSync } from 'node:fs';
import { pino } from 'pino';
import { join } from 'node:path';
import { Ledger } from '../coordinator/ledger/ledger.js';
import { loadQuotaLeaseService } from '../shared/lease-proto.js';
import type {
  GrantMessage,
  ReportRequestMessage,
  ReportResponseMessage,
  VelocityMessage,
} from '../shared/lease-proto.js';
import { REPORT_BUDGET_BYTES, VelocityReporter, type ReportPage } from '../cell-agent/lease/velocity-report.js';
import { CoordinatorCluster } from '../testkit/coordinator-cluster.js';
import { machineLine, type BenchReport } from './bench-report.js';
import { AgentProcess } from '../testkit/agent-process.js';
import { waitFor } from '../testkit/wait.js';
import { InstantBackend, putGoldTenants, serveLease } from '../testkit/instant-lease-backend.js';
import { LeaseService, MAX_ANSWER_GRANTS } from '../coordinator/lease/lease-service.js';
import { GrpcLeaseTransport, LeaseClient } from '../cell-agent/lease/lease-client.js';
import type { LeaseCallResult, LeaseTransport } from '../cell-agent/lease/lease-client.js';

const ids = ['n1', 'n2', 'n3'];

function quantile(xs: readonly number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
}

async function admitted(url: string, tenant: string): Promise<boolean> {
  try {
    const r = await fetch(`${url}/v1/check`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ domain: 'api', descriptors: [{ entries: [{ key: 'tenant', value: tenant }] }] }),
      signal: AbortSignal.timeout(2000),
    });
    await r.arrayBuffer();
    return r.status === 200 && r.headers.get('x-ratelimit-degraded') !== 'true';
  } catch {
    return false;
  }
}

interface PutToAdmitted {
  /** Per agent (cell-a, cell-b) and for both together (the later of the two): median and max in ms. */
  readonly perAgent: readonly { readonly cell: string; readonly median: number; readonly max: number }[];
  readonly median: number;
  readonly max: number;
}

async function putToAdmitted(n: number, progress: (msg: string) => void): Promise<PutToAdmitted> {
  const c = await CoordinatorCluster.create(ids, ['--floor-cells', '2']);
  const agents: AgentProcess[] = [];
  try {
    writeFileSync(join(c.root, 'rules.yaml'), 'domain: api\ndescriptors:\n  - key: tenant\n    global: true\n');
    c.startAll();
    await c.waitForLeader(60_000);
    await c.write('PUT', '/v1/tiers/gold', { rate: 100, burst: 100, floorFraction: 0.5 });
    const coordinators = ids.map((id) => `127.0.0.1:${c.replica(id).peerPort}`).join(',');
    for (const cell of ['cell-a', 'cell-b'])
      agents.push(
        await AgentProcess.start({ cell, rules: join(c.root, 'rules.yaml'), coordinators, logLevel: 'warn' }),
      );
    for (const a of agents) await a.waitHealthy(90_000);
    // Warm up: a first tenant, admitted on both agents (they are serving and leased).
    await c.write('PUT', '/v1/tenants/warm', { tier: 'gold' });
    for (const a of agents)
      await waitFor(`${a.cell} admits the first tenant`, () => admitted(a.url, 'warm'), {
        timeoutMs: 60_000,
        everyMs: 100,
        context: () => a.describe(),
      });
    const times = agents.map((): number[] => []);
    const both: number[] = [];
    for (let i = 0; i < n; i++) {
      const id = `t-${i}`;
      const r = await c.write('PUT', `/v1/tenants/${id}`, { tier: 'gold' });
      if (r.status !== 200) throw new Error(`PUT ${id}: ${r.status}`);
      const t0 = performance.now();
      const done = await Promise.all(
        agents.map(async (a) => {
          await waitFor(`${a.cell} admits ${id} on a lease`, () => admitted(a.url, id), {
            timeoutMs: 30_000,
            everyMs: 20,
            context: () => a.describe(),
          });
          return performance.now() - t0;
        }),
      );
      done.forEach((ms, j) => times[j]?.push(ms));
      both.push(Math.max(...done));
      progress(`tenant ${id}: ${agents.map((a, j) => `${a.cell} ${done[j]?.toFixed(0)} ms`).join(', ')}`);
    }
    return {
      perAgent: agents.map((a, j) => ({
        cell: a.cell,
        median: quantile(times[j] ?? [], 0.5),
        max: Math.max(...(times[j] ?? [])),
      })),
      median: quantile(both, 0.5),
      max: Math.max(...both),
    };
  } catch (err) {
    // Why it failed: each agent's state and the end of its output (an agent that died says how).
    for (const a of agents) progress(a.describe());
    throw err;
  } finally {
    await Promise.all(agents.map((a) => a.kill()));
    await c.cleanup();
  }
}

interface LeaseBytes {
  /** Every key's velocity in one message (what reports were before delta reports). */
  readonly oneMessage: number;
  /** A sweep (every key): its pages and the largest page's bytes, the total. */
  readonly sweepPages: number;
  readonly sweepMaxPage: number;
  readonly sweepTotal: number;
  /** Delta reports: nothing moved; 1% of the keys moved beyond the dead-band. */
  readonly steady: number;
  readonly onePercent: number;
  /** One answer carrying every slice, built by hand (what paged answers replaced). */
  readonly full: number;
}

function leaseBytes(tenants: number): LeaseBytes {
  const svc = loadQuotaLeaseService();
  const l = new Ledger({ floorCells: 2 });
  let index = 0;
  l.apply({ type: 'putTier', name: 'gold', rate: 100, burst: 100, floorFraction: 0.5 }, ++index);
  l.apply({ type: 'registerCell', cellId: 'cell-a', nowMs: 0 }, ++index);
  const keys: string[] = [];
  for (let i = 0; i < tenants; i++) {
    l.apply({ type: 'putTenant', id: `tenant-${i}`, tier: 'gold' }, ++index);
    keys.push(`tenant/tenant-${i}`);
  }
  l.apply(
    {
      type: 'reportAndGrant',
      nowMs: 1,
      leases: [{ cellId: 'cell-a', leaseExpiresAtMs: 3001 }],
      grants: keys.map((key) => ({ key, cellId: 'cell-a', rate: 40, burst: 40, epoch: 1, leaseExpiresAtMs: 3001 })),
    },
    ++index,
  );
  const grant = (key: string): GrantMessage => {
    const s = l.getSlice(key, 'cell-a');
    return {
      key,
      rate: s?.rate ?? 0,
      burst: s?.burst ?? 0,
      epoch: s?.epoch ?? 0,
      floorRate: s?.floorRate ?? 0,
      floorBurst: s?.floorBurst ?? 0,
      version: s?.version ?? 0,
      parent: '',
      deleted: false,
    };
  };
  const answer = (grants: GrantMessage[], full: boolean): ReportResponseMessage => ({
    leaderId: 'n1',
    leaseTtlMs: 3000,
    grants,
    ledgerIndex: index,
    unknownTenant: 'deny',
    unknownKeys: [],
    capsIncluded: false,
    capsVersion: 0,
    cappedDomains: [],
    full,
  });
  const velocity = (moved: (i: number) => boolean): VelocityMessage[] =>
    keys.map((key, i) => ({ key, allowedPerS: moved(i) ? 45 : 37.5, refusedPerS: 2.5 }));
  const request = (page: ReportPage): ReportRequestMessage => ({
    cellId: 'cell-a',
    incarnation: 'i',
    sentAtMs: Date.now(),
    acks: page.acks,
    velocity: page.velocity,
    failOpenTotal: 0,
    capsVersion: 0,
    wantFull: false,
    velocitySweep: page.sweep,
    velocitySweepDone: page.sweepDone,
    velocitySweepStart: page.sweepStart,
  });
  const bytesOf = (page: ReportPage): number => svc.report.requestSerialize(request(page)).length;
  const oneMessage = svc.report.requestSerialize({
    cellId: 'cell-a',
    incarnation: 'i',
    sentAtMs: Date.now(),
    acks: [],
    velocity: velocity(() => false),
    failOpenTotal: 0,
    capsVersion: 0,
    wantFull: false,
  }).length;
  // The agent's own report builder: a sweep first (a new incarnation), then delta reports.
  const reporter = new VelocityReporter();
  let sweepPages = 0;
  let sweepMaxPage = 0;
  let sweepTotal = 0;
  for (;;) {
    const page = reporter.page(
      velocity(() => false),
      new Map(),
    );
    const b = bytesOf(page);
    sweepPages++;
    sweepMaxPage = Math.max(sweepMaxPage, b);
    sweepTotal += b;
    reporter.delivered(page);
    if (page.sweepDone) break;
    if (sweepPages > 1000) throw new Error('the sweep does not end');
  }
  const steadyPage = reporter.page(
    velocity(() => false),
    new Map(),
  );
  const steady = bytesOf(steadyPage);
  reporter.delivered(steadyPage);
  const movedPage = reporter.page(
    velocity((i) => i % 100 === 0),
    new Map(),
  );
  const onePercent = bytesOf(movedPage);
  return {
    oneMessage,
    sweepPages,
    sweepMaxPage,
    sweepTotal,
    steady,
    onePercent,
    full: svc.report.responseSerialize(answer(keys.map(grant), true)).length,
  };
}

/** The real lease messages of an agent with T active tenants, by exchange (a report and its answer). */
interface PagedBytes {
  /** A new incarnation's picture: the answers until the agent held every grant, their largest and total bytes. */
  readonly pictureAnswers: number;
  readonly pictureMaxAnswer: number;
  readonly pictureTotal: number;
  /** Steady exchanges, 1% of the demands moving each report: bytes per exchange (report + answer), median and max. */
  readonly steadyExchanges: number;
  readonly steadyMedian: number;
  readonly steadyMax: number;
  readonly steadyAnswerMax: number;
  readonly steadyAnswerGrants: number;
}

/** The gRPC transport, recording the serialized bytes of every report and answer. */
class ByteCountingTransport implements LeaseTransport {
  readonly exchanges: { request: number; answer: number; grants: number; more: boolean }[] = [];
  private readonly svc = loadQuotaLeaseService();
  constructor(private readonly inner: LeaseTransport) {}
  async report(address: string, req: ReportRequestMessage, deadlineMs: number): Promise<LeaseCallResult> {
    const r = await this.inner.report(address, req, deadlineMs);
    if ('res' in r)
      this.exchanges.push({
        request: this.svc.report.requestSerialize(req).length,
        answer: this.svc.report.responseSerialize(r.res).length,
        grants: r.res.grants.length,
        more: r.res.more === true,
      });
    return r;
  }
  close(): void {
    this.inner.close();
  }
}

/**
 * The real LeaseService (rounds every 100 ms, over an in-process ledger applied at once) and the real
 * LeaseClient over gRPC (reports every 500 ms, paged answers): the bytes of the messages a round
 * really sends, as the agent's transport serializes them.
 */
async function pagedLeaseBytes(tenants: number, progress: (msg: string) => void): Promise<PagedBytes> {
  const backend = new InstantBackend();
  const keys = await putGoldTenants(backend, tenants);
  const service = new LeaseService({
    backend,
    logger: pino({ level: 'silent' }),
    expireEveryMs: 1e9,
    leaseTtlMs: 60_000,
  });
  const { address, server } = await serveLease(service);
  const transport = new ByteCountingTransport(new GrpcLeaseTransport());
  // Every tenant active: 1 refused a second each (what makes the leader grant it), 1% of them moving
  // beyond the dead-band every report once the picture is complete.
  let tick = 0;
  let moving = false;
  const client = new LeaseClient({
    cellId: 'cell-a',
    coordinators: [address],
    logger: pino({ level: 'silent' }),
    velocity: () => {
      tick++;
      return keys.map((key, i) => ({
        key,
        allowed: 0,
        refused: moving && i % 100 === tick % 100 ? 2 + (tick % 3) : 1,
      }));
    },
    deadlineMs: 20_000,
    transport,
    onOverrides: () => undefined,
  });
  try {
    client.start();
    await waitFor(`the agent holds all ${tenants} grants`, () => client.status().grants === tenants, {
      timeoutMs: 600_000,
      everyMs: 50,
    });
    const picture = transport.exchanges.slice();
    progress(`  picture: ${picture.length} answers`);
    moving = true;
    const from = transport.exchanges.length;
    await waitFor('20 steady exchanges', () => transport.exchanges.length >= from + 22, { timeoutMs: 120_000 });
    const steady = transport.exchanges.slice(from + 2, from + 22); // after the first moved demand is granted
    const sizes = steady.map((e) => e.request + e.answer).sort((a, b) => a - b);
    return {
      pictureAnswers: picture.length,
      pictureMaxAnswer: Math.max(...picture.map((e) => e.answer)),
      pictureTotal: picture.reduce((a, e) => a + e.request + e.answer, 0),
      steadyExchanges: steady.length,
      steadyMedian: quantile(sizes, 0.5),
      steadyMax: sizes[sizes.length - 1] ?? NaN,
      steadyAnswerMax: Math.max(...steady.map((e) => e.answer)),
      steadyAnswerGrants: Math.max(...steady.map((e) => e.grants)),
    };
  } finally {
    client.stop();
    service.stop();
    server.forceShutdown();
  }
}

export async function runCoordinatorSourceBench(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
}): Promise<BenchReport> {
  const n = opts.smoke ? 3 : 20;
  const tenants = opts.smoke ? 2_000 : 100_000;
  opts.progress(`lease message bytes with ${tenants} active tenants`);
  const bytes = leaseBytes(tenants);
  opts.progress(`the real paged lease messages with ${tenants} active tenants (LeaseService + LeaseClient over gRPC)`);
  const paged = await pagedLeaseBytes(tenants, opts.progress);
  opts.progress(`PUT → admitted on both agents, ${n} tenants`);
  const put = await putToAdmitted(n, opts.progress);
  return {
    name: 'coordinator-source',
    title: 'The coordinator as the one source of every quota: PUT to admitted, lease message bytes',
    rows: [
      { measure: `PUT → first leased admit on every agent, median (ms, n=${n})`, value: Math.round(put.median) },
      { measure: `PUT → first leased admit on every agent, max (ms, n=${n})`, value: Math.round(put.max) },
      ...put.perAgent.flatMap((a) => [
        { measure: `PUT → first leased admit on ${a.cell}, median (ms, n=${n})`, value: Math.round(a.median) },
        { measure: `PUT → first leased admit on ${a.cell}, max (ms, n=${n})`, value: Math.round(a.max) },
      ]),
      {
        measure: `report bytes if one message carried every velocity (${tenants} active tenants; before delta reports)`,
        value: bytes.oneMessage,
      },
      {
        measure: `sweep: reports (pages) for ${tenants} active tenants (at the start, on a leader's request, every 20 reports)`,
        value: bytes.sweepPages,
      },
      { measure: `sweep: largest report bytes (budget ${REPORT_BUDGET_BYTES})`, value: bytes.sweepMaxPage },
      { measure: 'sweep: bytes of all its reports', value: bytes.sweepTotal },
      { measure: `delta report bytes, ${tenants} active tenants, steady`, value: bytes.steady },
      { measure: `delta report bytes, ${tenants} active tenants, 1% changing`, value: bytes.onePercent },
      {
        measure: `a new incarnation's picture: answers (pages of at most ${MAX_ANSWER_GRANTS} grants) until it holds all ${tenants} grants`,
        value: paged.pictureAnswers,
      },
      { measure: "a new incarnation's picture: largest answer bytes", value: paged.pictureMaxAnswer },
      { measure: "a new incarnation's picture: bytes of all its reports and answers", value: paged.pictureTotal },
      {
        measure: `steady, 1% of ${tenants} demands moving each report: bytes per report + answer, median (n=${paged.steadyExchanges})`,
        value: Math.round(paged.steadyMedian),
      },
      { measure: 'steady: bytes per report + answer, max', value: paged.steadyMax },
      { measure: 'steady: largest answer bytes', value: paged.steadyAnswerMax },
      {
        measure: `one answer carrying every slice (${tenants}; what paging replaced, built by hand)`,
        value: bytes.full,
      },
    ],
    notes: [
      `Machine: ${machineLine()}.`,
      `Steady answers carried at most ${paged.steadyAnswerGrants} grants: with one cell the quota is all its own, so a moving demand moves no grant; the steady rows measure reports, acknowledgements and answer framing, not grants that move between cells.`,
      'Agents report every 500 ms; a key an agent holds nothing for is refused and reported, and the next round grants it: PUT → admitted is about one report interval plus one round (and the commit).',
      'Only grants newer than what the agent acknowledged travel in an answer. A report carries the acks and only the demand that moved beyond the dead-band (0.5%, ≥ 0.01/s) since the last answered report, within a 1 MiB budget (cell-agent/lease/velocity-report.ts); a sweep of every key runs over as many reports as the budget needs. The velocities here are synthetic and stable (37.5 + 2.5 /s each; 1% moved to 45 + 2.5): real traffic whose 500 ms counts fluctuate beyond 0.5% sends those keys too.',
    ],
  };
}
