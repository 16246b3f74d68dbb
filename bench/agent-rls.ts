// `npm run bench -- agent`: the agent's RLS server against its ceiling and a common alternative,
// measured in one run on this machine (docs/targets.md: throughput ≥ 0.85 × an empty grpc-js
// handler on the same socket; p99 at a moderate paced rate within 1.5 × the ceiling's p99).
//
//   npx tsx bench/run.ts agent [--smoke]
//   npx tsx bench/agent-rls.ts [--smoke] [--servers ceiling,agent,agent-2w,rlf-memory,rlf-redis]
//        [--transport uds|tcp] [--client raw|http2] [--sessions N] [--rate N] [--concurrency 1,16,64]
//        [--seconds S] [--rounds N] [--variants unlimited,limited]
//
// Servers (each in a process of its own, testkit/processes/host.ts, all started before the first
// measurement and all stopped at the end, also on failure or Ctrl-C):
//   ceiling     grpc-js answering ShouldRateLimit with a constant OK (bench/servers/ceiling.ts)
//   agent       cell-agent/agent-main.ts startAgent, alone, on local rules (bench/servers/agent.ts)
//   agent-semi1 agent in a process started with --max-semi-space-size=1 (every isolate's young
//               generation at 1 MiB semi-spaces): what that setting, which brings the idle RSS under
//               96 MiB (bench/agent-idle-rss.ts), costs in throughput and p99
//   agent-young0 agent with --worker-young-generation-mb 0 (the serving thread's young generation as
//               V8 grows it, up to 48 MiB): what the default cap of 6 MiB (2 MiB semi-spaces), which
//               keeps the idle RSS under 96 MiB, costs the serving thread
//   agent-2w    the same with 2 serving workers, each on a socket of its own (<socket>, <socket>.1;
//               over TCP port, port + 1): the generator spreads its connections over both, as
//               Envoy does over the cluster's endpoints ("throughput grows with cores")
//   bare-h2     a bare node:http2 server answering a pre-encoded OK (bench/servers/bare-h2.ts)
//   bare-h2-2w  the same in 2 worker threads on 2 sockets, like agent-2w: what a second thread gives
//               a server that does nothing, on this machine
//   lean-transport the agent's lean RLS server in a worker thread like the agent's, decoding every
//               request and answering one constant (the agent's own answer bytes) instead of
//               deciding (bench/servers/lean-transport.ts): the agent's serving thread without the
//               decision
//   rlf-memory  rate-limiter-flexible RateLimiterMemory behind the same grpc-js handler
//   rlf-redis   RateLimiterRedis on a redis-server this benchmark starts (Unix socket, no
//               persistence); skipped, with a note, when redis-server is not installed
// The load generator (bench/load/loadgen.ts) is one more process: pre-encoded gRPC requests,
// streams spread over `sessions` HTTP/2 connections, written by shared/h2-raw.ts (default) or
// by node:http2's client (--client http2, about 8× the generator CPU per request: on this
// machine's two hyper-threads it takes CPU from the server under test; see h2-raw.ts). For every variant (bench: nothing is
// refused; bench-limited: ~50 % refused, see bench/servers/bench-rules.ts) and every phase — closed
// loop at each concurrency, then open loop at the paced rate — the servers are measured one after
// the other (the order rotating from phase to phase), so slow drift of a shared machine does not
// land on one server only. Rounds (3 by default) are interleaved; figures are medians over them with
// their spread, ratios the medians of per-round ratios (buildReport). Report only: the targets are
// evaluated in the notes, nothing is asserted.
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import { join } from 'node:path';
import { cpuSeconds } from '../testkit/process-cpu.js';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import type { BenchReport } from './bench-report.js';
import { LoadGenerator } from './load/loadgen-client.js';
import type { LoadJob, PhaseResult } from './load/loadgen-protocol.js';
import { DOMAIN_LIMITED, DOMAIN_UNLIMITED, TENANTS } from './servers/bench-rules.js';
import { RedisServer, findRedisServer } from '../testkit/processes/redis-server.js';
import type { ServerOptions } from '../testkit/processes/server-module.js';
import { ServerProcess } from '../testkit/processes/server-process.js';
import { armEmergencyStop } from './emergency-stop.js';

export const SERVER_NAMES = [
  'ceiling',
  'bare-h2',
  'bare-h2-2w',
  'lean-transport',
  'agent',
  'agent-grpcjs',
  'agent-2w',
  'agent-semi1',
  'agent-young0',
  'rlf-memory',
  'rlf-redis',
  'ceiling-pbjs',
] as const;
export type ServerName = (typeof SERVER_NAMES)[number];
/** Measured unless --servers says otherwise; 'ceiling-pbjs' and 'agent-semi1' only on request. */
export const DEFAULT_SERVERS: readonly ServerName[] = [
  'ceiling',
  'bare-h2',
  'bare-h2-2w',
  'lean-transport',
  'agent',
  'agent-grpcjs',
  'agent-2w',
  'agent-young0',
  'rlf-memory',
  'rlf-redis',
];
export const VARIANTS = ['unlimited', 'limited'] as const;
export type Variant = (typeof VARIANTS)[number];

const THROUGHPUT_TARGET = 0.85;
const P99_TARGET = 1.5;
/** Issue 21: the lean agent against the empty grpc-js handler and against a bare node:http2 answer. */
const LEAN_VS_CEILING = 1.25;
const LEAN_VS_BARE = 0.9;

export interface AgentBenchOptions {
  readonly smoke: boolean;
  readonly progress: (msg: string) => void;
  readonly servers?: readonly ServerName[];
  readonly variants?: readonly Variant[];
  readonly transport?: 'uds' | 'tcp';
  readonly sessions?: number;
  /** The load generator's HTTP/2 client (LoadJob.client). */
  readonly client?: 'http2' | 'raw';
  readonly concurrencies?: readonly number[];
  readonly pacedRate?: number;
  /** Length of each measurement window (warm-up is added), ms. */
  readonly measureMs?: number;
  /** Every phase is measured this many times, in interleaved rounds (server order reversed each round); medians are reported. */
  readonly rounds?: number;
}

export interface PhaseRecord {
  readonly round: number;
  readonly server: ServerName;
  readonly variant: Variant;
  readonly mode: 'closed' | 'paced';
  readonly concurrency: number;
  readonly rate: number;
  readonly result: PhaseResult;
  /** CPU of the server's process (plus redis-server's for rlf-redis) over the phase, % of one core; null where /proc is missing. */
  readonly serverCpuPct: number | null;
}

export interface AgentBenchResult {
  readonly report: BenchReport;
  readonly phases: readonly PhaseRecord[];
  readonly skipped: readonly { readonly server: ServerName; readonly reason: string }[];
}

interface Plan {
  readonly rounds: number;
  /** Servers take turns within a phase this many ms at a time. */
  readonly sliceMs: number;
  readonly concurrencies: readonly number[];
  readonly pacedRate: number;
  readonly closedWarmupMs: number;
  readonly closedMeasureMs: number;
  readonly pacedWarmupMs: number;
  readonly pacedMeasureMs: number;
  readonly drainTimeoutMs: number;
  readonly progressEveryMs: number;
}

function makePlan(opts: AgentBenchOptions): Plan {
  const smoke = opts.smoke;
  const measure = opts.measureMs;
  return {
    rounds: opts.rounds ?? (smoke ? 1 : 3),
    sliceMs: smoke ? 50 : 250,
    concurrencies: opts.concurrencies ?? (smoke ? [16] : [1, 16, 64]),
    pacedRate: opts.pacedRate ?? (smoke ? 1000 : 2000),
    closedWarmupMs: smoke ? 50 : 500,
    closedMeasureMs: measure ?? (smoke ? 200 : 2000),
    pacedWarmupMs: smoke ? 50 : 500,
    pacedMeasureMs: measure ?? (smoke ? 200 : 4000),
    drainTimeoutMs: smoke ? 2000 : 5000,
    progressEveryMs: smoke ? 0 : 1000,
  };
}

const MODULES: Record<ServerName, string> = {
  ceiling: fileURLToPath(new URL('./servers/ceiling.ts', import.meta.url)),
  'bare-h2': fileURLToPath(new URL('./servers/bare-h2.ts', import.meta.url)),
  'bare-h2-2w': fileURLToPath(new URL('./servers/bare-h2.ts', import.meta.url)),
  'lean-transport': fileURLToPath(new URL('./servers/lean-transport.ts', import.meta.url)),
  agent: fileURLToPath(new URL('./servers/agent.ts', import.meta.url)),
  'agent-grpcjs': fileURLToPath(new URL('./servers/agent.ts', import.meta.url)),
  'agent-2w': fileURLToPath(new URL('./servers/agent.ts', import.meta.url)),
  'agent-semi1': fileURLToPath(new URL('./servers/agent.ts', import.meta.url)),
  'agent-young0': fileURLToPath(new URL('./servers/agent.ts', import.meta.url)),
  'rlf-memory': fileURLToPath(new URL('./servers/rlf.ts', import.meta.url)),
  'rlf-redis': fileURLToPath(new URL('./servers/rlf.ts', import.meta.url)),
  'ceiling-pbjs': fileURLToPath(new URL('./servers/ceiling.ts', import.meta.url)),
};

/** agent-semi1's V8 flag: the setting bench/agent-idle-rss.ts measures the idle RSS with. */
const SEMI1_FLAG = '--max-semi-space-size=1';

const AGENT_MAIN = fileURLToPath(new URL('../cell-agent/agent-main.ts', import.meta.url));

// ---------------------------------------------------------------------------------------------
function freeTcpPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (addr !== null && typeof addr === 'object' ? resolve(addr.port) : reject(new Error('no port'))));
    });
  });
}

// ---------------------------------------------------------------------------------------------

function fmtInt(n: number): string {
  return Math.round(n).toLocaleString('en-US');
}

interface Running {
  readonly name: ServerName;
  readonly proc: ServerProcess;
  readonly target: string;
  /** Every address it serves on (agent-2w: one socket per worker); the generator spreads its connections over them. */
  readonly endpoints: readonly string[];
  readonly auxPid?: number | undefined;
  dead: string | null;
}

export async function runAgentBenchDetailed(opts: AgentBenchOptions): Promise<AgentBenchResult> {
  const plan = makePlan(opts);
  const progress = opts.progress;
  const transport = opts.transport ?? 'uds';
  const sessions = opts.sessions ?? 2;
  const client = opts.client ?? 'raw';
  const wanted = opts.servers ?? DEFAULT_SERVERS;
  const variants = opts.variants ?? VARIANTS;
  const skipped: { server: ServerName; reason: string }[] = [];
  const notes: string[] = [];
  const phases: PhaseRecord[] = [];
  const descriptions = new Map<ServerName, string>();

  const loadBefore = os.loadavg()[0] ?? 0;
  const scratch = mkdtempSync(join(os.tmpdir(), 'cq-bench-'));
  const running: Running[] = [];
  let loadgen: LoadGenerator | null = null;
  let redis: RedisServer | null = null;

  // Last resort: a synchronous kill of everything still running if this process exits or is
  // interrupted before the finally block below has stopped them.
  const killAll = (): void => {
    loadgen?.killNow();
    for (const r of running) r.proc.killNow();
    redis?.killNow();
  };
  const emergency = armEmergencyStop(killAll, scratch, progress);

  try {
    // --- which servers, and their targets
    const toStart: { name: ServerName; options: ServerOptions }[] = [];
    for (const name of wanted) {
      const dir = mkdtempSync(join(scratch, `${name}-`));
      if (
        name === 'agent' ||
        name === 'agent-2w' ||
        name === 'agent-grpcjs' ||
        name === 'agent-semi1' ||
        name === 'agent-young0'
      ) {
        if (!existsSync(AGENT_MAIN)) {
          skipped.push({ server: name, reason: 'cell-agent/agent-main.ts does not exist' });
          continue;
        }
        toStart.push({
          name,
          options: {
            scratchDir: dir,
            workers: name === 'agent-2w' ? 2 : 1,
            rlsServer: name === 'agent-grpcjs' ? 'grpc-js' : 'lean',
            // The young generation's cost (issue 21: idle RSS ≤ 96 MiB): 1 MiB semi-spaces in every isolate.
            ...(name === 'agent-semi1' ? { nodeFlags: [SEMI1_FLAG] } : {}),
            ...(name === 'agent-young0' ? { workerYoungGenerationMb: 0 } : {}),
          },
        });
      } else if (name === 'bare-h2-2w') {
        toStart.push({ name, options: { scratchDir: dir, workers: 2 } });
      } else if (name === 'ceiling-pbjs') {
        toStart.push({ name, options: { scratchDir: dir, codec: 'protobufjs' } });
      } else if (name === 'rlf-redis') {
        const bin = findRedisServer();
        if (bin === null) {
          skipped.push({
            server: name,
            reason: 'redis-server is not installed (not on PATH, $REDIS_SERVER unset): `apt-get install redis-server`',
          });
          continue;
        }
        progress(`starting redis-server (${bin}) on a Unix socket, --save '' --appendonly no`);
        try {
          redis = await RedisServer.start(bin, dir);
        } catch (err) {
          skipped.push({
            server: name,
            reason: `redis-server did not start: ${err instanceof Error ? err.message : String(err)}`,
          });
          continue;
        }
        descriptions.set(name, `redis-server ${redis.version}`);
        toStart.push({ name, options: { scratchDir: dir, store: 'redis', redisSocket: redis.socket } });
      } else {
        toStart.push({ name, options: { scratchDir: dir, store: 'memory' } });
      }
    }
    for (const s of skipped) progress(`skipping ${s.server}: ${s.reason}`);

    progress(
      `starting ${toStart.map((s) => s.name).join(', ') || 'no server'} and the load generator (${transport === 'uds' ? 'Unix sockets' : 'TCP on 127.0.0.1'})`,
    );
    // Started alongside the servers. (Children still starting when this process dies end
    // themselves: host.ts and loadgen.ts exit when their IPC channel closes.)
    const loadgenP = LoadGenerator.start();
    loadgenP.catch(() => undefined); // its failure is thrown by the await below, not reported as unhandled
    const started = await Promise.allSettled(
      toStart.map(async (s) => {
        const target = transport === 'uds' ? join(scratch, `${s.name}.sock`) : `127.0.0.1:${await freeTcpPort()}`;
        const proc = await ServerProcess.start(s.name, MODULES[s.name], target, s.options, progress);
        const r: Running = {
          name: s.name,
          proc,
          target,
          endpoints: proc.endpoints,
          auxPid: s.name === 'rlf-redis' ? redis?.pid : undefined,
          dead: null,
        };
        running.push(r);
        return r;
      }),
    );
    loadgen = await loadgenP;
    started.forEach((res, i) => {
      const name = toStart[i]?.name;
      if (name === undefined) return;
      if (res.status === 'rejected') {
        const reason = res.reason instanceof Error ? res.reason.message : String(res.reason);
        skipped.push({ server: name, reason: `failed to start: ${reason.split('\n')[0] ?? reason}` });
        progress(`${name} failed to start: ${reason}`);
      } else {
        const d = res.value.proc.description;
        descriptions.set(name, [d, descriptions.get(name)].filter((x) => x !== undefined && x !== '').join('; '));
      }
    });
    // Keep the planned order (ceiling first) whatever order the starts finished in.
    running.sort((a, b) => SERVER_NAMES.indexOf(a.name) - SERVER_NAMES.indexOf(b.name));

    // --- the measurements
    const phaseList: { mode: 'closed' | 'paced'; concurrency: number; rate: number }[] = [
      ...plan.concurrencies.map((c) => ({ mode: 'closed' as const, concurrency: c, rate: 0 })),
      { mode: 'paced' as const, concurrency: 0, rate: plan.pacedRate },
    ];
    // Every (round, variant, phase) step is one load-generator job in which the servers take turns;
    // who goes first rotates from step to step, and the order is reversed in even rounds.
    const steps: { round: number; variant: Variant; ph: (typeof phaseList)[number]; order: Running[] }[] = [];
    for (let round = 1; round <= plan.rounds; round++) {
      for (const variant of variants) {
        for (const ph of phaseList) {
          const k = steps.length;
          const order = running
            .map((_, i) => running[(i + k) % running.length])
            .filter((r): r is Running => r !== undefined);
          if (round % 2 === 0) order.reverse();
          steps.push({ round, variant, ph, order });
        }
      }
    }
    for (const [phaseIndex, { round, variant, ph, order }] of steps.entries()) {
      const domain = variant === 'unlimited' ? DOMAIN_UNLIMITED : DOMAIN_LIMITED;
      const what = `${variant} ${ph.mode === 'closed' ? `c=${ph.concurrency}` : `paced ${fmtInt(ph.rate)}/s`}`;
      const label = `${plan.rounds > 1 ? `round ${round}/${plan.rounds} ` : ''}${what}`;
      let alive = order.filter((r) => r.dead === null);
      // One job: the servers take turns, plan.sliceMs at a time. A server found gone is dropped
      // and the job run again without it.
      for (;;) {
        if (alive.length === 0) break;
        const job: LoadJob = {
          targets: alive.map((r) => r.endpoints),
          sliceMs: plan.sliceMs,
          domain,
          tenants: TENANTS,
          mode: ph.mode,
          concurrency: ph.concurrency,
          rate: ph.rate,
          sessions,
          client,
          warmupMs: ph.mode === 'closed' ? plan.closedWarmupMs : plan.pacedWarmupMs,
          measureMs: ph.mode === 'closed' ? plan.closedMeasureMs : plan.pacedMeasureMs,
          drainTimeoutMs: plan.drainTimeoutMs,
          seed: 0x5eed + phaseIndex,
          progressEveryMs: plan.progressEveryMs,
        };
        const cpu0 = alive.map(
          (r) => [cpuSeconds(r.proc.pid), r.auxPid !== undefined ? cpuSeconds(r.auxPid) : 0] as const,
        );
        const t0 = performance.now();
        let results: readonly PhaseResult[];
        try {
          progress(
            `${label}: ${alive.map((r) => r.name).join(', ')}${alive.length > 1 ? `, taking turns every ${plan.sliceMs} ms` : ''}`,
          );
          results = await loadgen.run(job, (p) =>
            progress(
              `${label}: ${p.phase} ${(p.elapsedMs / 1000).toFixed(1)} s, ${fmtInt(p.completed)} answers, ${p.inFlight} in flight`,
            ),
          );
        } catch (err) {
          const msg = err instanceof Error ? err.message : String(err);
          const gone = alive.filter((r) => !r.proc.alive || r.endpoints.some((e) => msg.includes(e)));
          if (gone.length === 0) throw err;
          for (const r of gone) {
            r.dead = `${label}: ${msg}`;
            notes.push(`${r.name} stopped answering during ${label} (${msg}); its remaining phases were not run.`);
            progress(`${r.name} is gone (${msg}); skipping its remaining phases`);
          }
          alive = alive.filter((r) => r.dead === null);
          continue;
        }
        // Each server was loaded for 1/n of the job's time: its CPU over that share.
        const shareS = (performance.now() - t0) / 1000 / alive.length;
        for (const [i, srv] of alive.entries()) {
          const result = results[i];
          if (result === undefined) continue;
          const [c0, a0] = cpu0[i] ?? [null, null];
          const c1 = cpuSeconds(srv.proc.pid);
          const a1 = srv.auxPid !== undefined ? cpuSeconds(srv.auxPid) : 0;
          const serverCpuPct =
            c0 !== null && c1 !== null && a0 !== null && a1 !== null
              ? Math.round(((c1 - c0 + (a1 - a0)) / shareS) * 100)
              : null;
          phases.push({
            round,
            server: srv.name,
            variant,
            mode: ph.mode,
            concurrency: ph.concurrency,
            rate: ph.rate,
            result,
            serverCpuPct,
          });
          const errs = result.errors > 0 ? `, ${fmtInt(result.errors)} errors (${result.errorSamples.join('; ')})` : '';
          if (ph.mode === 'closed') {
            progress(
              `${label} ${srv.name}: ${fmtInt(result.throughput)} req/s (server CPU ${serverCpuPct ?? '?'} % while loaded, generator CPU ${result.generatorCpuPct} %)${errs}`,
            );
          } else {
            const l = result.latency;
            progress(
              `${label} ${srv.name}: p50 ${l?.p50Us ?? '?'} µs, p99 ${l?.p99Us ?? '?'} µs, p99.9 ${l?.p999Us ?? '?'} µs at ${fmtInt(result.offeredRate)} req/s offered (send lag p99 ${result.sendLag?.p99Us ?? '?'} µs)${errs}`,
            );
          }
        }
        break;
      }
    }
  } finally {
    emergency.signalsOff();
    const stops: Promise<void>[] = [];
    if (loadgen !== null) stops.push(loadgen.stop());
    for (const r of running) stops.push(r.proc.stop());
    await Promise.allSettled(stops);
    await redis?.stop();
    emergency.exitOff();
    rmSync(scratch, { recursive: true, force: true });
    if (running.length > 0 || redis !== null)
      progress(`stopped ${[...running.map((r) => r.name), ...(redis !== null ? ['redis-server'] : [])].join(', ')}`);
  }

  notes.push(
    `Machine load (1-min load average, ${os.cpus().length} CPUs): ${loadBefore.toFixed(2)} before, ${(os.loadavg()[0] ?? 0).toFixed(2)} after — above ~2 (generator + one server) something else was running and the figures carry its noise.`,
  );
  const report = buildReport(opts, plan, transport, sessions, client, phases, skipped, notes, descriptions);
  for (const line of report.notes.filter((n) => n.startsWith('agent ÷ ceiling'))) progress(line);
  return { report, phases, skipped };
}

/** Median, least and greatest of some numbers (undefined for none). */
export interface Spread {
  readonly median: number;
  readonly min: number;
  readonly max: number;
  readonly n: number;
}

export function spreadOf(xs: readonly number[]): Spread | undefined {
  if (xs.length === 0) return undefined;
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  const median = s.length % 2 === 1 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
  return { median, min: s[0] as number, max: s[s.length - 1] as number, n: s.length };
}

/** "1.23 (per round 1.10–1.31)", or "1.23" with one round. */
function fmtSpread(x: Spread, digits = 2): string {
  return x.n > 1
    ? `${x.median.toFixed(digits)} (per round ${x.min.toFixed(digits)}–${x.max.toFixed(digits)})`
    : x.median.toFixed(digits);
}

function buildReport(
  opts: AgentBenchOptions,
  plan: Plan,
  transport: 'uds' | 'tcp',
  sessions: number,
  client: 'http2' | 'raw',
  phases: readonly PhaseRecord[],
  skipped: readonly { server: ServerName; reason: string }[],
  extraNotes: readonly string[],
  descriptions: ReadonlyMap<ServerName, string>,
): BenchReport {
  // Every figure is the median over the rounds, with its spread; every ratio is the median of the
  // per-round ratios, each taken within one round, where the two servers took turns 250 ms apart.
  const rounds = [...new Set(phases.map((p) => p.round))].sort((a, b) => a - b);
  const at = (
    server: ServerName,
    variant: Variant,
    round: number,
    mode: 'closed' | 'paced',
    concurrency?: number,
  ): PhaseRecord | undefined =>
    phases.find(
      (p) =>
        p.server === server &&
        p.round === round &&
        p.variant === variant &&
        p.mode === mode &&
        (concurrency === undefined || p.concurrency === concurrency),
    );
  /** A round's peak: its highest closed-loop throughput over the concurrencies. */
  const peakAt = (server: ServerName, variant: Variant, round: number): PhaseRecord | undefined =>
    phases
      .filter((p) => p.server === server && p.round === round && p.variant === variant && p.mode === 'closed')
      .reduce<PhaseRecord | undefined>(
        (b, p) => (b === undefined || p.result.throughput > b.result.throughput ? p : b),
        undefined,
      );
  const p99At = (server: ServerName, variant: Variant, round: number): number | undefined =>
    at(server, variant, round, 'paced')?.result.latency?.p99Us;
  const over = (f: (round: number) => number | undefined): Spread | undefined =>
    spreadOf(rounds.map(f).filter((x): x is number => x !== undefined && Number.isFinite(x)));
  const perRoundRatio = (
    a: (round: number) => number | undefined,
    b: (round: number) => number | undefined,
  ): Spread | undefined =>
    over((r) => {
      const x = a(r);
      const y = b(r);
      return x !== undefined && y !== undefined && y > 0 ? x / y : undefined;
    });
  const peakTput = (server: ServerName, variant: Variant) => (r: number) =>
    peakAt(server, variant, r)?.result.throughput;
  const closedTput = (server: ServerName, variant: Variant, c: number) => (r: number) =>
    at(server, variant, r, 'closed', c)?.result.throughput;
  /** The concurrency at which a server peaked in most rounds. */
  const peakC = (server: ServerName, variant: Variant): number | undefined => {
    const cs = rounds.map((r) => peakAt(server, variant, r)?.concurrency).filter((c): c is number => c !== undefined);
    return cs.sort((x, y) => cs.filter((c) => c === y).length - cs.filter((c) => c === x).length)[0];
  };
  const median = (x: Spread | undefined): number | string => (x === undefined ? '' : Math.round(x.median));
  const range = (x: Spread | undefined): string =>
    x === undefined ? '' : `${Math.round(x.min).toLocaleString('en-US')}–${Math.round(x.max).toLocaleString('en-US')}`;

  const rows: Record<string, number | string>[] = [];
  const servers = SERVER_NAMES.filter((s) => phases.some((p) => p.server === s));
  const variants = VARIANTS.filter((v) => phases.some((p) => p.variant === v));
  for (const variant of variants) {
    for (const server of servers) {
      const mine = phases.filter((p) => p.server === server && p.variant === variant);
      if (mine.length === 0) continue;
      const row: Record<string, number | string> = { variant, server };
      for (const c of plan.concurrencies) {
        const x = over(closedTput(server, variant, c));
        row[`c=${c} req/s`] = x === undefined ? '' : Math.round(x.median);
      }
      const pk = over(peakTput(server, variant));
      row['peak req/s min–max'] = range(pk);
      const pr = perRoundRatio(peakTput(server, variant), peakTput('ceiling', variant));
      row['peak ÷ ceiling'] = pr === undefined ? '' : pr.median.toFixed(2);
      row[`p50 µs @${plan.pacedRate}/s`] = median(over((r) => at(server, variant, r, 'paced')?.result.latency?.p50Us));
      const p99 = over((r) => p99At(server, variant, r));
      row['p99 µs'] = median(p99);
      row['p99 min–max'] = range(p99);
      row['p99.9 µs'] = median(over((r) => at(server, variant, r, 'paced')?.result.latency?.p999Us));
      const lr = perRoundRatio(
        (r) => p99At(server, variant, r),
        (r) => p99At('ceiling', variant, r),
      );
      row['p99 ÷ ceiling'] = lr === undefined ? '' : lr.median.toFixed(2);
      const ok = mine.reduce((n, p) => n + p.result.ok, 0);
      const refused = mine.reduce((n, p) => n + p.result.overLimit, 0);
      row['refused %'] = ok > 0 ? Math.round((refused / ok) * 1000) / 10 : '';
      row['requests'] = mine.reduce((n, p) => n + p.result.sent, 0);
      row['errors'] = mine.reduce((n, p) => n + p.result.errors, 0);
      row['degraded'] = mine.reduce((n, p) => n + p.result.degraded, 0);
      row['server CPU % @peak'] = median(over((r) => peakAt(server, variant, r)?.serverCpuPct ?? undefined));
      row['gen CPU % @peak'] = median(over((r) => peakAt(server, variant, r)?.result.generatorCpuPct));
      rows.push(row);
    }
  }

  const notes: string[] = [];
  const verdict = (ok: boolean): string => (opts.smoke ? '' : `: ${ok ? 'met' : 'NOT met'}`);
  const noVerdict = opts.smoke ? ' — smoke run (cold, a few hundred ms per server): no verdict' : '';
  for (const variant of variants) {
    const tr = perRoundRatio(peakTput('agent', variant), peakTput('ceiling', variant));
    if (tr === undefined) continue;
    let line = `agent ÷ ceiling (${variant}): throughput ${fmtSpread(tr)} at peak (agent ${fmtInt(over(peakTput('agent', variant))?.median ?? 0)} req/s at c=${peakC('agent', variant)}, ceiling ${fmtInt(over(peakTput('ceiling', variant))?.median ?? 0)} at c=${peakC('ceiling', variant)}; target ≥ ${THROUGHPUT_TARGET}${verdict(tr.median >= THROUGHPUT_TARGET)})`;
    const lr = perRoundRatio(
      (r) => p99At('agent', variant, r),
      (r) => p99At('ceiling', variant, r),
    );
    const ap = over((r) => p99At('agent', variant, r));
    const cp = over((r) => p99At('ceiling', variant, r));
    if (lr !== undefined && ap !== undefined && cp !== undefined)
      line += `; p99 at ${fmtInt(plan.pacedRate)} req/s ${Math.round(ap.median)} µs vs ${Math.round(cp.median)} µs = ${fmtSpread(lr)} × (target ≤ ${P99_TARGET} ×${verdict(lr.median <= P99_TARGET)}; ≤ 1 ms: ${ap.median <= 1000 ? 'yes' : 'no'})`;
    notes.push(line + noVerdict);
  }
  // Issue 21's targets for the lean server: >= 1.25 x the empty grpc-js handler (ceiling), >= 0.9 x a
  // bare node:http2 answer, p99 <= the ceiling's; the grpc-js agent beside it for comparison.
  for (const variant of variants) {
    const lean = over(peakTput('agent', variant));
    if (lean === undefined) continue;
    const parts: string[] = [];
    const vs = (other: ServerName, target: number | null): void => {
      const r = perRoundRatio(peakTput('agent', variant), peakTput(other, variant));
      if (r === undefined) return;
      parts.push(
        `÷ ${other} ${fmtSpread(r)}${target === null ? '' : ` (target ≥ ${target}${verdict(r.median >= target)})`}`,
      );
    };
    vs('ceiling', LEAN_VS_CEILING);
    vs('bare-h2', LEAN_VS_BARE);
    vs('agent-grpcjs', null);
    const lr = perRoundRatio(
      (r) => p99At('agent', variant, r),
      (r) => p99At('ceiling', variant, r),
    );
    if (lr !== undefined) parts.push(`p99 ÷ the ceiling's ${fmtSpread(lr)} (target ≤ 1${verdict(lr.median <= 1)})`);
    if (parts.length > 0)
      notes.push(
        `lean agent (${variant}, peak ${fmtInt(lean.median)} req/s at c=${peakC('agent', variant)}): ${parts.join('; ')}${opts.smoke ? ' — smoke run: no verdict' : ''}`,
      );
  }
  // "Throughput grows with cores" (docs/targets.md): the agent with 2 workers against 1, at the highest
  // concurrency measured (c = 64 by default), where a second worker has the most to take.
  const cMax = Math.max(...plan.concurrencies);
  for (const variant of variants) {
    const r = perRoundRatio(closedTput('agent-2w', variant, cMax), closedTput('agent', variant, cMax));
    if (r === undefined) continue;
    const two = over(closedTput('agent-2w', variant, cMax));
    const one = over(closedTput('agent', variant, cMax));
    const cpu = (server: ServerName): number | string =>
      median(over((rd) => at(server, variant, rd, 'closed', cMax)?.serverCpuPct ?? undefined));
    const gen = (server: ServerName): number | string =>
      median(over((rd) => at(server, variant, rd, 'closed', cMax)?.result.generatorCpuPct));
    // What a second thread gives a server that does nothing at all, measured in the same jobs: the
    // most a second worker can give any node:http2 server on this machine.
    const bare = perRoundRatio(closedTput('bare-h2-2w', variant, cMax), closedTput('bare-h2', variant, cMax));
    const twoVsBare = perRoundRatio(closedTput('agent-2w', variant, cMax), closedTput('bare-h2-2w', variant, cMax));
    const bareNote =
      bare === undefined
        ? ''
        : `; agent-2w ÷ bare-h2-2w ${twoVsBare === undefined ? '—' : fmtSpread(twoVsBare)}; bare-h2-2w ÷ bare-h2 ${fmtSpread(bare)} (${fmtInt(over(closedTput('bare-h2-2w', variant, cMax))?.median ?? 0)} req/s at ${cpu('bare-h2-2w')} % CPU vs ${fmtInt(over(closedTput('bare-h2', variant, cMax))?.median ?? 0)} at ${cpu('bare-h2')} %): the same step for a server that does nothing`;
    notes.push(
      `agent-2w ÷ agent (${variant}, c=${cMax}): ${fmtSpread(r)} (target ≥ 1.4${verdict(r.median >= 1.4)}; 2 workers ${fmtInt(two?.median ?? 0)} req/s at ${cpu('agent-2w')} % CPU, 1 worker ${fmtInt(one?.median ?? 0)} req/s at ${cpu('agent')} % CPU; generator ${gen('agent-2w')} % / ${gen('agent')} %${bareNote}) — ` +
        `"throughput grows with cores" (docs/targets.md) means > 1 where the cores are there: with ${os.cpus().length} CPU(s) shared by the generator and the agent's workers, a ratio near 1 says the machine, not the agent, is the limit (look at the CPU columns: 2 workers cannot use 200 % when the generator takes one CPU).` +
        (opts.smoke ? ' — smoke run: no verdict' : ''),
    );
  }
  // Where the agent's gap to bare-h2 lies (issue 21), at c = cMax: lean-transport is the agent's own
  // serving thread with a constant answer instead of the decision, so lean-transport ÷ bare-h2 is what
  // the transport and the decoding cost, and agent ÷ lean-transport what the decision and the answer's
  // encoding cost. Per check: the server process's CPU over its throughput (CPU % of one core ÷ req/s),
  // the median over the rounds.
  for (const variant of variants) {
    const transportVsBare = perRoundRatio(
      closedTput('lean-transport', variant, cMax),
      closedTput('bare-h2', variant, cMax),
    );
    const agentVsTransport = perRoundRatio(
      closedTput('agent', variant, cMax),
      closedTput('lean-transport', variant, cMax),
    );
    if (transportVsBare === undefined && agentVsTransport === undefined) continue;
    const cpuPerCheck = (server: ServerName): Spread | undefined =>
      over((rd) => {
        const p = at(server, variant, rd, 'closed', cMax);
        const pct = p?.serverCpuPct;
        if (p === undefined || pct === null || pct === undefined || p.result.throughput <= 0) return undefined;
        return ((pct / 100) * 1e6) / p.result.throughput;
      });
    const perCheck: string[] = [];
    for (const server of ['bare-h2', 'lean-transport', 'agent'] as const) {
      const x = cpuPerCheck(server);
      if (x !== undefined) perCheck.push(`${server} ${x.median.toFixed(1)}`);
    }
    const parts = [
      ...(transportVsBare === undefined
        ? []
        : [`lean-transport ÷ bare-h2 ${fmtSpread(transportVsBare)} (the agent's transport and decoding)`]),
      ...(agentVsTransport === undefined
        ? []
        : [`agent ÷ lean-transport ${fmtSpread(agentVsTransport)} (the decision and the answer's encoding)`]),
      ...(perCheck.length === 0 ? [] : [`server CPU µs a check: ${perCheck.join(', ')}`]),
    ];
    notes.push(
      `where the agent's time goes (${variant}, c=${cMax}): ${parts.join('; ')}` +
        (opts.smoke ? ' — smoke run: no verdict' : ''),
    );
  }
  // The young generation's cost: the same agent with 1 MiB semi-spaces in every isolate (SEMI1_FLAG),
  // and with the serving thread's young generation uncapped (V8's), at its peak and paced p99, against
  // the default cap (the idle RSS each gives: npm run bench -- agent-idle-rss).
  const smaller: readonly [ServerName, string][] = [
    ['agent-semi1', SEMI1_FLAG],
    ['agent-young0', '--worker-young-generation-mb 0'],
  ];
  for (const variant of variants) {
    for (const [name, how] of smaller) {
      const r = perRoundRatio(peakTput(name, variant), peakTput('agent', variant));
      if (r === undefined) continue;
      const sp = over((rd) => p99At(name, variant, rd));
      const bp = over((rd) => p99At('agent', variant, rd));
      notes.push(
        `${name} (${how}) ÷ agent (${variant}): throughput ${fmtSpread(r)} ` +
          `(${fmtInt(over(peakTput(name, variant))?.median ?? 0)} vs ${fmtInt(over(peakTput('agent', variant))?.median ?? 0)} req/s at their peaks)` +
          (bp !== undefined && sp !== undefined
            ? `, paced p99 ${Math.round(sp.median)} vs ${Math.round(bp.median)} µs`
            : '') +
          (opts.smoke ? ' — smoke run: no verdict' : ''),
      );
    }
  }
  if (!phases.some((p) => p.server === 'agent') && (opts.servers ?? DEFAULT_SERVERS).includes('agent'))
    notes.push('agent ÷ ceiling: not computed, the agent row was skipped (see below).');
  for (const s of skipped) notes.push(`skipped ${s.server}: ${s.reason}`);
  notes.push(...extraNotes);
  notes.push(
    `Transport: ${transport === 'uds' ? 'Unix domain sockets' : 'TCP on 127.0.0.1'}; ${sessions} HTTP/2 connection(s) per run (agent-2w: at least one per worker socket, spread round-robin over them); every server in a process of its own, the load generator in another (${client === 'raw' ? 'shared/h2-raw.ts: HTTP/2 frames written from per-tenant templates, answers read at the frame level' : 'node:http2 client'}, gRPC requests encoded once before the run).`,
    `Within a phase the servers take turns every ${plan.sliceMs} ms (round-robin, each getting the warm-up and the measurement time below in all), so a noisy moment of the machine lands on all of them; every phase is run ${plan.rounds} time(s), the rounds interleaved (round 1 runs every phase and variant, then round 2, ...; the order of the servers rotates from phase to phase and is reversed in even rounds). Every figure is the median over the rounds (a peak is a round's highest closed-loop throughput; p50, p99 and p99.9 each the median of the rounds' own), min–max columns give the spread; every ratio is the median of the per-round ratios (both servers of a ratio measured in the same job, 250 ms turns apart), with their range, and a verdict is on that median. Requests and errors add up all rounds.`,
    `Closed loop: c requests always in flight during a server's turn, ${plan.closedWarmupMs} ms warm-up, then answers during its turns counted over ${plan.closedMeasureMs} ms. Paced: open loop at ${fmtInt(plan.pacedRate)} req/s, ${plan.pacedWarmupMs} ms warm-up, ${plan.pacedMeasureMs} ms measured; latency from each request's scheduled send time to its answer (no coordinated omission).`,
    `Requests: one descriptor [{tenant: tenant-N}] over ${fmtInt(TENANTS)} tenants; variant unlimited = domain '${DOMAIN_UNLIMITED}', one rule of 1e9 req/s (nothing refused); variant limited = domain '${DOMAIN_LIMITED}', tenants ending in an odd digit limited to 1 request per hour (~50 % refused).`,
  );
  const lags = phases
    .filter((p) => p.mode === 'paced' && p.result.sendLag !== null)
    .map((p) => p.result.sendLag?.p99Us ?? 0);
  if (lags.length > 0)
    notes.push(
      `Generator send lag (actual − scheduled send) p99: at most ${Math.max(...lags)} µs over the paced runs; it is inside every latency figure alike.`,
    );
  notes.push(
    "CPU %: of one core; a server's over its share of the phase (warm-up included; rlf-redis includes redis-server), the generator's over the whole phase. A server well below 100 % at its peak was not the bottleneck: the machine (shared cores, other work) or the generator was.",
  );
  for (const [name, d] of descriptions) notes.push(`${name}: ${d}`);
  return {
    name: 'agent',
    title: 'Agent RLS server vs. an empty grpc-js handler (ceiling) and rate-limiter-flexible',
    rows,
    notes,
  };
}

/** The `npm run bench -- agent` entry (bench/run.ts). */
export async function runAgentBench(opts: { smoke: boolean; progress: (msg: string) => void }): Promise<BenchReport> {
  return (await runAgentBenchDetailed(opts)).report;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      smoke: { type: 'boolean', default: false },
      servers: { type: 'string' },
      variants: { type: 'string' },
      transport: { type: 'string', default: 'uds' },
      sessions: { type: 'string' },
      rate: { type: 'string' },
      concurrency: { type: 'string' },
      seconds: { type: 'string' },
      rounds: { type: 'string' },
      client: { type: 'string', default: 'raw' },
      out: { type: 'string', default: 'bench/results' },
    },
  });
  const servers = values.servers?.split(',').map((s) => s.trim());
  for (const s of servers ?? [])
    if (!(SERVER_NAMES as readonly string[]).includes(s))
      throw new Error(`unknown server '${s}'; known: ${SERVER_NAMES.join(', ')}`);
  const variants = values.variants?.split(',').map((v) => v.trim());
  for (const v of variants ?? [])
    if (!(VARIANTS as readonly string[]).includes(v))
      throw new Error(`unknown variant '${v}'; known: ${VARIANTS.join(', ')}`);
  if (values.transport !== 'uds' && values.transport !== 'tcp') throw new Error('--transport is uds or tcp');
  if (values.client !== 'raw' && values.client !== 'http2') throw new Error('--client is raw or http2');
  const num = (v: string | undefined, what: string): number | undefined => {
    if (v === undefined) return undefined;
    const n = Number(v);
    if (!(n > 0)) throw new Error(`${what} must be a positive number`);
    return n;
  };
  const concurrencies = values.concurrency?.split(',').map((c) => num(c, '--concurrency') ?? 1);
  const seconds = num(values.seconds, '--seconds');
  const sessions = num(values.sessions, '--sessions');
  const rate = num(values.rate, '--rate');
  const rounds = num(values.rounds, '--rounds');
  const { toMarkdown, writeResults } = await import('./bench-report.js');
  const result = await runAgentBenchDetailed({
    smoke: values.smoke,
    progress: (m) => console.log(`  … ${m}`),
    transport: values.transport,
    client: values.client,
    ...(rounds !== undefined ? { rounds: Math.round(rounds) } : {}),
    ...(servers !== undefined ? { servers: servers as ServerName[] } : {}),
    ...(variants !== undefined ? { variants: variants as Variant[] } : {}),
    ...(concurrencies !== undefined ? { concurrencies } : {}),
    ...(seconds !== undefined ? { measureMs: seconds * 1000 } : {}),
    ...(sessions !== undefined ? { sessions } : {}),
    ...(rate !== undefined ? { pacedRate: rate } : {}),
  });
  const command = `npx tsx bench/agent-rls.ts ${process.argv.slice(2).join(' ')}`.trim();
  console.log(toMarkdown([result.report], command));
  const files = writeResults(values.out, [result.report], command);
  console.log(`results: ${files.json}, ${files.md}`);
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) await main();
