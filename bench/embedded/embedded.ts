// `npm run bench -- embedded`: hello-world apps side by side in one run, each in a process of its own
// and driven by autocannon over loopback — fastify with no limiter, @fastify/rate-limit in memory and
// on Redis, cellquota local and coordinated; express with no limiter, express-rate-limit in memory and
// on Redis (rate-limit-redis), cellquota local and coordinated. Then the Redis variants again with
// redis-server paused (SIGSTOP) and the coordinated ones with every coordinator paused; and the
// in-process decision (createLimiter().check) timed in a loop. Targets (docs/targets.md): cellquota
// local ≥ 0.95 × the in-memory library, coordinated ≥ 1.3 × the Redis one, decision ≤ 1 µs median.
// A target's figure is the median over rounds of the req/s ratio of the pair within one round, with
// a 95% interval of that median: met / not met when the interval is on one side of the target,
// undecided when it straddles it; the app's CPU per request, the same way, is the second measure.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import autocannon from 'autocannon';
import { createLimiter } from '../../embedded/limiter.js';
import { FAIL_OPEN_HEADER } from '../../embedded/http-gate.js';
import { CHECK_COST_RULES, checkCostNs } from '../check-cost.js';
import { CoordinatorCluster } from '../../testkit/coordinator-cluster.js';
import { machineLine, type BenchReport } from '../bench-report.js';
import { RedisServer, findRedisServer } from '../../testkit/processes/redis-server.js';
import type { AppSettings, Variant } from './embedded-app.js';

const APP = resolve(import.meta.dirname, 'embedded-app.ts');
const VARIANTS: readonly Variant[] = ['none', 'lib-memory', 'lib-redis', 'cellquota-local', 'cellquota-coordinated'];

interface Run {
  reqPerS: number;
  /** Latency of every 2xx response of the run, in ms (autocannon's own percentiles are whole ms). */
  p50: number;
  p99: number;
  non2xx: number;
  errors: number;
  /** The app's main thread on the CPU per request, µs (NaN where /proc is not there). */
  cpuUs: number;
}

interface App {
  readonly proc: ChildProcess;
  readonly url: string;
  /** Bytes the app wrote to stderr once listening (a limiter failing on every request says so there). */
  readonly stderrBytes: () => number;
}

/** CELLQUOTA_BENCH_CPU_PROF=DIR: every app writes a V8 CPU profile into DIR when it exits (node --cpu-prof). */
function profileArgs(): string[] {
  const dir = process.env['CELLQUOTA_BENCH_CPU_PROF']?.trim();
  return dir === undefined || dir === '' ? [] : ['--cpu-prof', `--cpu-prof-dir=${dir}`];
}

async function startApp(settings: AppSettings): Promise<App> {
  const proc = spawn(process.execPath, [...profileArgs(), '--import', 'tsx', APP, JSON.stringify(settings)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let listening = false;
  let stderrBytes = 0;
  return new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`app did not start: ${out.slice(-1000)}`)), 60_000);
    const on = (b: Buffer, stderr: boolean): void => {
      // Once listening, output is only counted: kept and searched, a chatty app would cost this
      // process (autocannon's) time that grows with everything it ever wrote.
      if (listening) {
        if (stderr) stderrBytes += b.length;
        return;
      }
      out += b.toString();
      const m = /listening (\S+)/.exec(out);
      if (m !== null) {
        listening = true;
        clearTimeout(timer);
        ok({ proc, url: m[1] as string, stderrBytes: () => stderrBytes });
      }
    };
    proc.stdout?.on('data', (b: Buffer) => on(b, false));
    proc.stderr?.on('data', (b: Buffer) => on(b, true));
    proc.once('exit', (code) => fail(new Error(`app exited (${code}): ${out.slice(-1000)}`)));
  });
}

/** Rate-limit headers on an admitted answer: the limiter under test ran (and did not fail open). */
const LIMITER_HEADER = /^(x-)?ratelimit(-|$)/i;

/** Throws unless a limited variant's answer is a 2xx that carries its limiter's headers (and none
 * says it failed open): a baseline whose store fails on every request measures only its error path. */
async function checkLimiterAnswers(url: string, variant: Variant): Promise<void> {
  const r = await fetch(url);
  await r.arrayBuffer();
  const names = [...r.headers.keys()];
  const limited = names.some((n) => LIMITER_HEADER.test(n));
  const failOpen = r.headers.has(FAIL_OPEN_HEADER);
  if (r.status < 200 || r.status > 299 || failOpen || limited !== (variant !== 'none'))
    throw new Error(
      `embedded bench: ${variant} at ${url} answered ${r.status} with headers ${names.join(', ')} ` +
        `(expected a 2xx ${variant === 'none' ? 'without' : 'with'} rate-limit headers, not failed open)`,
    );
}

const CONNECTIONS = 10;
const NO_ANSWER = 'no 2xx answer';
/** A paused run lasts at least this long: past the Redis client's 1 s command timeout. */
const PAUSED_MIN_S = 2;

/** ns the main thread of `pid` has run (Linux /proc/PID/schedstat), or NaN. */
function onCpuNs(pid: number | undefined): number {
  if (pid === undefined) return NaN;
  try {
    return Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[0]);
  } catch {
    return NaN;
  }
}

/** autocannon against `url` for `seconds`; `pid`: the app's process, whose CPU time is read around the run. */
async function load(url: string, seconds: number, pid?: number): Promise<Run> {
  const latencies: number[] = [];
  const cpu0 = onCpuNs(pid);
  const r = await new Promise<autocannon.Result>((ok, fail) => {
    const instance = autocannon({ url, connections: CONNECTIONS, duration: seconds, timeout: 2 }, (error, result) =>
      error === null || error === undefined ? ok(result) : fail(error as Error),
    );
    instance.on('response', (_client, statusCode, _bytes, ms) => {
      if (statusCode >= 200 && statusCode < 300) latencies.push(ms);
    });
  });
  const sorted = Float64Array.from(latencies).sort();
  const at = (q: number): number =>
    sorted.length === 0 ? NaN : round3(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number);
  return {
    reqPerS: Math.round(r.requests.average),
    cpuUs: round3((onCpuNs(pid) - cpu0) / 1000 / Math.max(1, r.requests.total)),
    p50: at(0.5),
    p99: at(0.99),
    non2xx: r.non2xx,
    errors: r.errors + r.timeouts,
  };
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 === 1 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/** a[i] / b[i] for the rounds both ran (finite, b > 0). */
function pairedRatios(a: readonly number[], b: readonly number[]): number[] {
  const out: number[] = [];
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const x = a[i] as number;
    const y = b[i] as number;
    if (Number.isFinite(x) && Number.isFinite(y) && y > 0) out.push(x / y);
  }
  return out;
}

/** The median of `xs` and a distribution-free interval of at least 95% for it (order statistics of
 * the binomial: the k-th smallest and k-th largest, for the largest k with P(Bin(n, ½) < k) ≤ 2.5%);
 * null with fewer than 6 values, where no such interval exists. */
export function medianInterval(xs: readonly number[]): { median: number; lo: number; hi: number } | null {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  if (n < 6) return null;
  let k = 0; // P(X <= k - 1) for X ~ Bin(n, 1/2), summed while it stays within 2.5%
  let tail = 0;
  let term = 1 / 2 ** n; // P(X = 0)
  while (tail + term <= 0.025) {
    tail += term;
    term = (term * (n - k)) / (k + 1);
    k++;
  }
  return { median: median(s), lo: s[k - 1] as number, hi: s[n - k] as number };
}

function ratioText(rs: readonly number[]): string {
  if (rs.length === 0) return 'n/a';
  const ci = medianInterval(rs);
  return ci === null
    ? `${median(rs).toFixed(3)} (${rs.length} round(s), too few for an interval)`
    : `${ci.median.toFixed(3)} (95% interval ${ci.lo.toFixed(3)}–${ci.hi.toFixed(3)}, ${rs.length} rounds)`;
}

/** The ratio and whether it meets `min`: met when the whole interval is at or above it, not met when
 * the whole interval is below, undecided when it straddles (run more rounds or a quieter machine). */
function verdictText(rs: readonly number[], min: number): string {
  if (rs.length === 0) return 'n/a';
  const ci = medianInterval(rs);
  const verdict =
    ci === null
      ? median(rs) >= min
        ? 'met on the median (too few rounds to be sure)'
        : 'not met on the median (too few rounds to be sure)'
      : ci.lo >= min
        ? 'met'
        : ci.hi < min
          ? 'not met'
          : `undecided (the interval contains ${min})`;
  return `${ratioText(rs)}, target ≥ ${min}: ${verdict}`;
}

/** Rounds of one variant: the median round (by req/s) gives p50/p99; the spread is min..max req/s. */
function summary(runs: readonly Run[]): Run & { min: number; max: number } {
  const byRate = [...runs].sort((a, b) => a.reqPerS - b.reqPerS);
  const mid = byRate[(byRate.length - 1) >> 1] as Run;
  return {
    reqPerS: Math.round(median(runs.map((r) => r.reqPerS))),
    cpuUs: round3(median(runs.map((r) => r.cpuUs))),
    p50: mid.p50,
    p99: mid.p99,
    non2xx: runs.reduce((a, r) => a + r.non2xx, 0),
    errors: runs.reduce((a, r) => a + r.errors, 0),
    min: byRate[0]?.reqPerS ?? NaN,
    max: byRate[byRate.length - 1]?.reqPerS ?? NaN,
  };
}

/** Median ns per check over batches of 10,000 (one or two levels), on the process's CPU time (a busy
 * machine preempts the loop; wall time would count the other processes' turns). */
async function decisionNs(levels: 1 | 2, iterations: number, addresses = 256): Promise<number> {
  const l = await createLimiter({ rules: CHECK_COST_RULES });
  try {
    return checkCostNs(l, { levels, addresses, iterations });
  } finally {
    await l.close();
  }
}

type Framework = AppSettings['framework'];
const LIBRARY: Readonly<Record<Framework, string>> = {
  fastify: '@fastify/rate-limit',
  express: 'express-rate-limit',
};

/** Run sizes; CELLQUOTA_BENCH_FRAMEWORKS (fastify,express), CELLQUOTA_BENCH_ROUNDS and
 * CELLQUOTA_BENCH_SECONDS narrow or lengthen a full run while working on one side. Many short rounds
 * rather than a few long ones: the verdict is the median of per-round ratios, whose interval narrows
 * with the number of rounds (12 give a 96% interval between the 3rd and the 10th of them). */
function sizes(smoke: boolean): {
  frameworks: Framework[];
  rounds: number;
  seconds: number;
  warmUp: number;
  rewarm: number;
} {
  const env = (k: string): string | undefined => process.env[k]?.trim() || undefined;
  const frameworks = (env('CELLQUOTA_BENCH_FRAMEWORKS') ?? 'fastify,express')
    .split(',')
    .map((f) => f.trim())
    .filter((f): f is Framework => f === 'fastify' || f === 'express');
  if (frameworks.length === 0) throw new Error('CELLQUOTA_BENCH_FRAMEWORKS: fastify, express or both');
  const rounds = Number(env('CELLQUOTA_BENCH_ROUNDS') ?? (smoke ? 1 : 12));
  const seconds = Number(env('CELLQUOTA_BENCH_SECONDS') ?? (smoke ? 0.5 : 1.5));
  if (!Number.isInteger(rounds) || rounds < 1 || rounds > 50) throw new Error('CELLQUOTA_BENCH_ROUNDS: 1..50');
  if (!(seconds > 0 && seconds <= 60)) throw new Error('CELLQUOTA_BENCH_SECONDS: (0, 60]');
  return { frameworks, rounds, seconds, warmUp: smoke ? 0.3 : 2, rewarm: smoke ? 0.1 : 0.3 };
}

export async function runEmbeddedBench(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
}): Promise<BenchReport> {
  const { frameworks, rounds, seconds, warmUp, rewarm } = sizes(opts.smoke);
  const scratch = mkdtempSync(join(tmpdir(), 'cq-embedded-bench-'));
  const redisBin = findRedisServer();
  const redis = redisBin === null ? null : await RedisServer.start(redisBin, scratch);
  const cluster = await CoordinatorCluster.create(['n1', 'n2', 'n3']);
  const rows: Record<string, number | string>[] = [];
  const notes: string[] = [
    machineLine(),
    `load average at the start: ${loadavg()
      .map((x) => x.toFixed(2))
      .join(' ')}`,
  ];
  const apps: ChildProcess[] = [];
  const row = (framework: string, variant: string, condition: string, r: Run, spread?: string): void => {
    rows.push({
      framework,
      variant,
      condition,
      'req/s': r.reqPerS,
      ...(spread === undefined ? {} : { 'req/s min–max': spread }),
      // No 2xx answer in the whole run (a library waiting on a paused Redis): no latency to give.
      'app CPU µs/req': Number.isFinite(r.cpuUs) ? Math.round(r.cpuUs * 10) / 10 : 'n/a',
      'p50 ms': Number.isFinite(r.p50) ? r.p50 : NO_ANSWER,
      'p99 ms': Number.isFinite(r.p99) ? r.p99 : NO_ANSWER,
      non2xx: r.non2xx,
      errors: r.errors,
    });
  };
  try {
    cluster.startAll();
    await cluster.waitForLeader(60_000);
    await cluster.write('PUT', '/v1/tiers/big', { rate: 1_000_000, burst: 1_000_000, floorFraction: 0.5 });
    await cluster.write('PUT', '/v1/tenants/acme', { tier: 'big' });
    const coordinators = [...cluster.replicas.values()].map((r) => `127.0.0.1:${r.peerPort}`).join(',');
    for (const framework of frameworks) {
      const variants = VARIANTS.filter((v) => v !== 'lib-redis' || redis !== null);
      // Every variant's app is up (in its own process) before the first measurement, and each one is
      // warmed up (JIT, connections, the first lease: a global bucket is created empty, so the very
      // first check of a new quota key on a replica is refused by design, cell-agent/README.md).
      const urls = new Map<Variant, string>();
      const procs = new Map<Variant, ChildProcess>();
      const chatty = new Map<Variant, () => number>();
      await Promise.all(
        variants.map(async (variant) => {
          const app = await startApp({
            framework,
            variant,
            ...(redis === null ? {} : { redisSocket: redis.socket }),
            coordinators,
            cell: `bench-${framework}`,
          });
          apps.push(app.proc);
          urls.set(variant, app.url);
          procs.set(variant, app.proc);
          chatty.set(variant, app.stderrBytes);
        }),
      );
      const url = (v: Variant): string => urls.get(v) as string;
      for (const v of variants) {
        await load(url(v), warmUp);
        await checkLimiterAnswers(url(v), v);
      }
      // Interleaved rounds: round i starts at variant i (so none is always first or last after
      // another's load), each run after a short re-warm of its own connections.
      const runs = new Map<Variant, Run[]>(variants.map((v) => [v, []]));
      for (let round = 0; round < rounds; round++) {
        for (let k = 0; k < variants.length; k++) {
          const v = variants[(round + k) % variants.length] as Variant;
          opts.progress(`${framework} round ${round + 1}/${rounds}: ${v}, ${seconds} s`);
          await load(url(v), rewarm);
          runs.get(v)?.push(await load(url(v), seconds, procs.get(v)?.pid));
        }
      }
      const got = new Map<Variant, ReturnType<typeof summary>>();
      for (const v of variants) {
        const s = summary(runs.get(v) ?? []);
        got.set(v, s);
        row(framework, v, 'normal', s, `${s.min}–${s.max}`);
      }
      // (before the paused runs, where a library's timeouts are logged by design)
      const noisy = variants.map((v) => [v, chatty.get(v)?.() ?? 0] as const).filter(([, n]) => n > 0);
      if (noisy.length > 0)
        notes.push(
          `${framework}: wrote to stderr while measured (an error path on every request?): ` +
            noisy.map(([v, n]) => `${v} ${n} bytes`).join(', '),
        );
      if (redis?.pid !== undefined && urls.has('lib-redis')) {
        const pid = redis.pid;
        process.kill(pid, 'SIGSTOP');
        const paused = await load(
          url('lib-redis'),
          Math.max(seconds, PAUSED_MIN_S),
          procs.get('lib-redis')?.pid,
        ).finally(() => process.kill(pid, 'SIGCONT'));
        row(framework, 'lib-redis', 'Redis paused', paused);
      }
      const pids = [...cluster.replicas.values()].map((r) => r.proc?.pid).filter((p): p is number => p !== undefined);
      for (const p of pids) process.kill(p, 'SIGSTOP');
      const paused = await load(
        url('cellquota-coordinated'),
        Math.max(seconds, PAUSED_MIN_S),
        procs.get('cellquota-coordinated')?.pid,
      ).finally(() => {
        for (const p of pids) process.kill(p, 'SIGCONT');
      });
      row(framework, 'cellquota-coordinated', 'coordinators paused', paused);
      for (const p of procs.values()) p.kill('SIGTERM');

      const lib = LIBRARY[framework];
      const rate = (v: Variant): number[] => (runs.get(v) ?? []).map((r) => r.reqPerS);
      const cpu = (v: Variant): number[] => (runs.get(v) ?? []).map((r) => r.cpuUs);
      const target = (a: Variant, b: Variant, what: string, min: number): void => {
        if (!runs.has(a) || !runs.has(b)) return;
        const byRate = pairedRatios(rate(a), rate(b));
        // CPU per request the other way round (b's over a's): above 1, `a` costs the app less than `b`.
        const byCpu = pairedRatios(cpu(b), cpu(a));
        notes.push(
          `${framework}: ${what} = ${verdictText(byRate, min)} — the target's figure: req/s of the two in ` +
            `the same round, median over rounds; second measure, app CPU per request (${b} ÷ ${a}): ` +
            `${verdictText(byCpu, min)}`,
        );
      };
      target('cellquota-local', 'lib-memory', `cellquota local ÷ ${lib} in memory`, 0.95);
      target('cellquota-coordinated', 'lib-redis', `cellquota coordinated ÷ ${lib} on Redis`, 1.3);
      // The most any limiter can reach against the library on Redis: the app with no limiter at all.
      // Where this ceiling is itself under 1.3 (a framework whose own cost per request dwarfs a Redis
      // round trip on a Unix socket), the coordinated target cannot be met on this machine by any limiter.
      if (runs.has('lib-redis'))
        notes.push(
          `${framework}: the ceiling of that target, no limiter ÷ ${lib} on Redis = ` +
            `${ratioText(pairedRatios(rate('none'), rate('lib-redis')))}`,
        );
      if (!urls.has('lib-redis')) notes.push(`${framework}: redis-server not installed: the Redis rows are missing`);
      const vsNone = (v: Variant): string => ratioText(pairedRatios(rate(v), rate('none')));
      notes.push(
        `${framework}: ÷ no limiter (req/s, median of per-round ratios): cellquota local ${vsNone('cellquota-local')}, ` +
          `${lib} in memory ${vsNone('lib-memory')}`,
      );
      const base = got.get('none')?.cpuUs ?? NaN;
      if (Number.isFinite(base))
        notes.push(
          `${framework}: the app's main thread on the CPU per request (median; less sensitive to other ` +
            `processes than req/s): ${variants
              .map((v) => {
                const c = got.get(v)?.cpuUs ?? NaN;
                return v === 'none' ? `none ${c.toFixed(1)} µs` : `${v} ${c.toFixed(1)} µs (+${(c - base).toFixed(1)})`;
              })
              .join(', ')}`,
        );
    }
    const checks = opts.smoke ? 100_000 : 1_000_000;
    const one = await decisionNs(1, checks);
    const two = await decisionNs(2, checks);
    const oneMany = await decisionNs(1, checks, 10_000);
    const twoMany = await decisionNs(2, checks, 10_000);
    for (const [variant, ns] of [
      ['check(), 1 level, 256 addresses', one],
      ['check(), 2 levels (global + per-IP), 256 addresses', two],
      ['check(), 1 level, 10,000 addresses', oneMany],
      ['check(), 2 levels (global + per-IP), 10,000 addresses', twoMany],
    ] as const)
      rows.push({ framework: 'in-process', variant, condition: 'normal', 'ns/check median': Math.round(ns) });
    notes.push(
      `in-process decision (CPU time per check, median of batches of 10,000, bench/check-cost.ts): ` +
        `${Math.round(one)} ns with one level, ${Math.round(two)} ns with two over 256 addresses; ` +
        `${Math.round(oneMany)} / ${Math.round(twoMany)} ns over 10,000 (target ≤ 1,000 ns; ` +
        `npm run bench -- decision has the per-call percentiles)`,
    );
    notes.push(
      `${rounds} interleaved round(s) of ${seconds} s per variant after a ${warmUp} s warm-up each ` +
        `(and ${rewarm} s before every run); a row's req/s is the median round, min–max the spread; p50/p99 ` +
        `are of the median round, over every 2xx response; a ratio is the median of the per-round ratios ` +
        `(both runs of a pair in one round, seconds apart), with a distribution-free 95% interval of that ` +
        `median; ${CONNECTIONS} connections; load average at ` +
        `the end: ${loadavg()
          .map((x) => x.toFixed(2))
          .join(' ')}.`,
    );
    notes.push(
      'Redis paused (SIGSTOP): the libraries wait on each request until the Redis client gives up ' +
        '(commandTimeout 1 s; skipOnError / passOnStoreError then let it through); cellquota never waits ' +
        'on the coordinators (the paused rows): it keeps its grants until the lease runs out, then its floors.',
    );
  } finally {
    for (const p of apps) if (p.exitCode === null) p.kill('SIGKILL');
    await redis?.stop();
    await cluster.cleanup();
    rmSync(scratch, { recursive: true, force: true });
  }
  return {
    name: 'embedded',
    title:
      'Embedded limiter: hello-world throughput and latency, side by side ' +
      `(autocannon, ${CONNECTIONS} connections, loopback)`,
    rows,
    notes,
  };
}
