// Runs one drill against a DrillTarget — a fresh local deployment (chaos/local-deployment.ts) or one
// reached by address (chaos/remote-deployment.ts): the load over every cell's RLS server
// (chaos/load.ts), operators' admin writes (chaos/admin-workload.ts) and a sampler of the slices in
// force and the leader; then the drill's own script injects its fault and heals it. At the end the
// verdicts (chaos/verdicts.ts) are computed, and the timeline (JSON), its chart (SVG) and the
// verdicts are written to <out>/<drill>/, next to every process's log (local deployments).
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AdminWorkload } from './admin-workload.js';
import { ChaosLoad, type RecordedBin } from './load.js';
import { runningTargets, type DrillTarget } from './drill-target.js';
import { LocalDeployment } from './local-deployment.js';
import { sleep } from '../testkit/wait.js';
import { renderTimelineSvg } from './timeline-chart.js';
import type { Timeline, TimelineEvent, TimelineSample } from './timeline.js';
import {
  boundVerdict,
  errorsVerdict,
  latencyVerdict,
  quantile,
  recoveryVerdict,
  type ErrorExcuse,
  type Verdict,
} from './verdicts.js';

export const COORDINATORS = ['n1', 'n2', 'n3'] as const;
export const CELLS = ['cell-a', 'cell-b', 'cell-c'] as const;
/** The drill tenant: 600 req/s, burst 120 (the bound: 720 in any 1 s window), floors 30 %. */
export const QUOTA = 600;
export const BURST = 120;
export const FLOOR_FRACTION = 0.3;
/** 1.5 × the quota, skewed 50/30/20 over the cells. */
export const OFFERED = [450, 270, 180] as const;
const BIN_MS = 100;
const WARMUP_MS = 2000;
const SAMPLE_MS = 200;

export interface DrillOptions {
  readonly out: string;
  readonly p99LimitMs: number;
  readonly progress: (msg: string) => void;
  /** Keep the data directories (logs, timeline and chart are always kept). */
  readonly keepData: boolean;
  /** Mutual TLS between every process, the lease service on its own port (LocalDeployment). */
  readonly tls?: boolean;
}

export interface DrillContext<D extends DrillTarget = LocalDeployment> {
  readonly d: D;
  readonly admin: AdminWorkload;
  readonly load: ChaosLoad;
  /** ms since the drill started. */
  now(): number;
  sleep(ms: number): Promise<void>;
  progress(msg: string): void;
  /** Marks a fault as started; call the returned function when it is healed. */
  fault(label: string): () => void;
  note(label: string): void;
  /** Declares when the system should be back to normal allocation (default: the last heal). */
  healedAt(t: number): void;
  /** The checks of one cell between `from` and `to` are excused from the error count and the latency
   * (its agent is down or starting on purpose). */
  excuseErrors(cell: string, from: number, to: number): void;
  /** Every cell's latency between `from` and `to` is left out (and said so): a process starting on
   * this shared machine (not errors: those still count). */
  excuseLatency(from: number, to: number): void;
  /** A verdict of the drill's own (e.g. "the paused leader stepped down"). */
  check(name: string, ok: boolean, detail: string): void;
  /** The leader now (the replica with the highest term names it), waiting up to `timeoutMs`. */
  leader(timeoutMs?: number): Promise<string>;
}

export interface Drill<D extends DrillTarget = LocalDeployment> {
  readonly name: string;
  readonly title: string;
  /** Stated time for normal allocation to return after the fault heals. */
  readonly recoveryLimitMs: number;
  /** Extra environment per coordinator id (built before the deployment starts). */
  readonly coordinatorEnv?: (dir: string) => Promise<Record<string, Record<string, string>> | { skip: string }>;
  readonly run: (ctx: DrillContext<D>) => Promise<void>;
}

export interface DrillResult {
  readonly drill: string;
  readonly ok: boolean;
  readonly skipped?: string;
  readonly verdicts: readonly Verdict[];
  readonly seconds: number;
  readonly dir: string;
}

interface SamplerPoint {
  readonly t: number;
  readonly slices: Record<string, number | null>;
  readonly leased: Record<string, number | null>;
  readonly leader: string | null;
}

/** Runs a drill of the local deployment: three coordinators and three agents started here. */
export async function runDrill(drill: Drill, opts: DrillOptions): Promise<DrillResult> {
  return runDrillOn(drill, opts, (dir, env) =>
    LocalDeployment.create({
      dir,
      coordinators: COORDINATORS,
      cells: CELLS,
      quota: QUOTA,
      burst: BURST,
      floorFraction: FLOOR_FRACTION,
      offered: OFFERED,
      coordinatorEnv: env,
      tls: opts.tls === true,
    }),
  );
}

export async function runDrillOn<D extends DrillTarget>(
  drill: Drill<D>,
  opts: DrillOptions,
  makeTarget: (dir: string, env: Record<string, Record<string, string>>) => Promise<D>,
): Promise<DrillResult> {
  const dir = join(opts.out, drill.name);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const t0 = performance.now();
  const startedAt = new Date().toISOString();
  const now = (): number => performance.now() - t0;
  const progress = (msg: string): void =>
    opts.progress(`[${drill.name} ${(now() / 1000).toFixed(1).padStart(5)} s] ${msg}`);

  let env: Record<string, Record<string, string>> = {};
  if (drill.coordinatorEnv !== undefined) {
    const e = await drill.coordinatorEnv(dir);
    if ('skip' in e && typeof e.skip === 'string') {
      progress(`skipped: ${e.skip}`);
      return { drill: drill.name, ok: true, skipped: e.skip, verdicts: [], seconds: now() / 1000, dir };
    }
    env = e as Record<string, Record<string, string>>;
  }

  const d = await makeTarget(dir, env);
  runningTargets.add(d);
  const { cells, coordinators, tenant, domain, quota, burst, offered } = d.spec;
  const events: TimelineEvent[] = [];
  const points: SamplerPoint[] = [];
  const excuses: ErrorExcuse[] = [];
  const own: Verdict[] = [];
  let healed: number | null = null;
  let load: ChaosLoad | null = null;
  let admin: AdminWorkload | null = null;
  let sampler: NodeJS.Timeout | null = null;
  let failure: string | null = null;
  let loadStartedAt = 0;
  let lastLeader: string | null = null;
  try {
    await d.start(progress);
    const adminTier = d.spec.adminTier;
    if (adminTier !== null) {
      admin = new AdminWorkload({ urls: () => d.adminUrls(), tier: adminTier, token: d.spec.adminToken }, now);
      await admin.start();
    }
    load = await ChaosLoad.start({
      sockets: d.rlsTargets(),
      rates: offered,
      tenant,
      domain,
      binMs: BIN_MS,
      clock: now,
    });
    loadStartedAt = now();
    progress(
      `load ${offered.join('/')} req/s over ${cells.join(', ')} (quota ${quota}/s, burst ${burst})${admin === null ? '' : '; admin writes running'}`,
    );

    // The sampler: slices in force and lease state every SAMPLE_MS, the leader every other time.
    let busy = false;
    let tick = 0;
    sampler = setInterval(() => {
      if (busy) return;
      busy = true;
      const t = now();
      const askLeader = tick++ % 2 === 0;
      void Promise.all([
        Promise.all(cells.map((c) => d.agentQuota(c, 150))),
        askLeader ? d.leader(300) : Promise.resolve(lastLeader),
      ])
        .then(([quotas, leader]) => {
          lastLeader = leader;
          const slices: Record<string, number | null> = {};
          const leased: Record<string, number | null> = {};
          cells.forEach((c, i) => {
            const q = quotas[i];
            slices[c] = q === null || q === undefined ? null : q.rate;
            leased[c] = q === null || q === undefined ? null : q.source === 'leased' ? 1 : 0;
          });
          points.push({ t, slices, leased, leader });
        })
        .finally(() => {
          busy = false;
        });
    }, SAMPLE_MS);

    const loadRef = load;
    const adminRef = admin ?? new AdminWorkload({ urls: () => [], tier: '', token: null }, now);
    const ctx: DrillContext<D> = {
      d,
      admin: adminRef,
      load: loadRef,
      now,
      sleep,
      progress,
      fault(label) {
        const t = now();
        progress(`FAULT: ${label}`);
        const ev: { t: number; kind: 'fault'; label: string; end?: number } = { t, kind: 'fault', label };
        events.push(ev);
        return () => {
          ev.end = now();
          healed = ev.end;
          progress(`healed: ${label}`);
          events.push({ t: ev.end, kind: 'heal', label: `healed: ${label}` });
        };
      },
      note(label) {
        progress(label);
        events.push({ t: now(), kind: 'note', label });
      },
      healedAt(t) {
        healed = t;
      },
      excuseErrors(cell, from, to) {
        excuses.push({ cell: cells.indexOf(cell), from, to });
      },
      excuseLatency(from, to) {
        excuses.push({ cell: -1, from, to });
      },
      check(name, ok, detail) {
        progress(`${ok ? 'ok' : 'FAILED'} ${name}: ${detail}`);
        own.push({ name, ok, detail });
      },
      async leader(timeoutMs = 20_000) {
        return d.waitForLeader(timeoutMs);
      },
    };
    progress('steady state for 5 s');
    await sleep(5000);
    await drill.run(ctx);
  } catch (e) {
    failure = e instanceof Error ? (e.stack ?? e.message) : String(e);
    progress(`drill error: ${failure}`);
  } finally {
    if (sampler !== null) clearInterval(sampler);
    if (load !== null) await load.stop();
  }

  const verdicts: Verdict[] = [];
  if (failure !== null)
    verdicts.push({ name: 'drill ran', ok: false, detail: failure.split('\n').slice(0, 3).join(' | ') });
  if (admin !== null) {
    const summary = await admin.stop();
    const lin = await admin.check().catch((e: unknown) => ({ ok: false, detail: String(e) }));
    verdicts.push({
      name: 'admin writes',
      ok: lin.ok,
      detail: `${lin.detail}; ${summary.writesOk} acknowledged, ${summary.writesUnknown} unknown outcome, ${summary.writesFailed} refused; ${summary.readsOk} reads`,
    });
  }
  await d.stop();
  runningTargets.delete(d);

  const bins = load?.bins ?? [];
  const endAt = now();
  const samples = buildSamples(
    cells,
    points,
    bins.filter((b) => b.t > loadStartedAt),
  );
  const measured = bins.filter((b) => b.t > loadStartedAt);
  const firstFault = events.find((e) => e.kind === 'fault')?.t ?? null;
  verdicts.unshift(
    boundVerdict(measured, quota, burst, d.spec.failOpenAllowance ?? null),
    // Latency after the load's warm-up (connections, JIT): the first WARMUP_MS of answers are left out.
    latencyVerdict(
      measured.filter((b) => b.t > loadStartedAt + WARMUP_MS),
      opts.p99LimitMs,
      firstFault,
      excuses,
    ),
    errorsVerdict(measured, excuses),
    ...(healed === null ? [] : [recoveryVerdict(samples, measured, healed, drill.recoveryLimitMs, quota, endAt)]),
  );
  verdicts.push(...own);

  const timeline: Timeline = {
    drill: drill.name,
    title: drill.title,
    quota,
    bound: burst,
    cells,
    coordinators,
    startedAt,
    samples,
    events,
  };
  writeFileSync(join(dir, 'timeline.json'), JSON.stringify(timeline));
  writeFileSync(join(dir, 'timeline.svg'), renderTimelineSvg(timeline));
  const ok = verdicts.every((v) => v.ok);
  writeFileSync(
    join(dir, 'verdict.json'),
    JSON.stringify({ drill: drill.name, title: drill.title, ok, verdicts, startedAt, seconds: endAt / 1000 }, null, 2),
  );
  if (!opts.keepData) rmSync(join(dir, 'data'), { recursive: true, force: true });
  return { drill: drill.name, ok, verdicts, seconds: now() / 1000, dir };
}

/** One timeline sample per sampler point: the load bins since the previous point, as rates. */
function buildSamples(
  cells: readonly string[],
  points: readonly SamplerPoint[],
  bins: readonly RecordedBin[],
): TimelineSample[] {
  const out: TimelineSample[] = [];
  let prev = bins[0] === undefined ? 0 : bins[0].t - bins[0].durationMs;
  let bi = 0;
  for (const p of points) {
    if (p.t <= prev) continue;
    const window: RecordedBin[] = [];
    while (bi < bins.length && (bins[bi] as RecordedBin).t <= p.t) window.push(bins[bi++] as RecordedBin);
    const ms = window.reduce((a, b) => a + b.durationMs, 0);
    if (ms === 0) continue;
    const per = (f: (c: RecordedBin['cells'][number]) => number): Record<string, number> => {
      const o: Record<string, number> = {};
      cells.forEach((cell, i) => {
        o[cell] = Math.round(
          (window.reduce((a, b) => a + f(b.cells[i] as RecordedBin['cells'][number]), 0) / ms) * 1000,
        );
      });
      return o;
    };
    const lat = window.flatMap((b) => b.cells.flatMap((c) => c.latenciesUs)).sort((a, b) => a - b);
    const admitted = per((c) => c.admitted);
    const q = quantile(lat, 0.99);
    out.push({
      t: Math.round(p.t),
      admitted,
      refused: per((c) => c.refused),
      errors: per((c) => c.errors),
      degraded: per((c) => c.degraded),
      global: Object.values(admitted).reduce((a, b) => a + b, 0),
      p99Ms: q === null ? null : q / 1000,
      slices: p.slices,
      leased: p.leased,
      leader: p.leader,
    });
    prev = p.t;
  }
  return out;
}
