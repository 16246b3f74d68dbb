// `npm run bench -- frontdoor`: the front doors side by side, in one run, at one fixed concurrency,
// driven by one load client (wrk if installed, else autocannon; load-client.ts), keep-alive:
//   upstream direct · nginx alone · nginx limit_req · nginx + auth_request to the agent's
//   /v1/forward-auth (TCP, Unix socket) · the same to nginx's own `return 200` (the ceiling) and to
//   an empty node:http server (the floor of node:http) · a bare proxy on @fastify/http-proxy ·
//   cellquota gateway (the same library)
// Every limiter is configured so that it decides every request and refuses none (a per-visitor
// limit far above the offered load): the cost of deciding is measured, not the cost of refusing.
// Targets (issue 18): forward-auth through nginx ≥ 0.7 × nginx limit_req; gateway ≥ 0.8 × bare proxy.
// Every process is started first; then the targets take turns in rounds, round i starting at target
// i, so that no target always runs first, last or after the same other one (a single pass in
// sequence gave the gateway / bare proxy ratio 0.59, 0.73 and 1.27 in three runs). A row is the
// median round with the spread (min–max req/s); each ratio is given as the median of its per-round
// ratios (the two runs of a round a few seconds apart) with their range.
// Every process shares this machine's cores, so beside each throughput the CPU each process spent
// per request is given (/proc): on a small machine that, not the req/s alone, says what a front door
// costs.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os, { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { machineLine } from '../bench-report.js';
import type { BenchReport } from '../bench-report.js';
import { armEmergencyStop } from '../emergency-stop.js';
import { freePort, waitListening } from '../../testkit/ports.js';
import { treeCpuSeconds } from '../../testkit/process-cpu.js';
import { waitFor } from '../../testkit/wait.js';
import { nginxConf } from './frontdoor-nginx.js';
import type { NginxPorts } from './frontdoor-nginx.js';
import { autocannonClient, haveWrk, wrkClient } from './load-client.js';
import type { LoadClient } from './load-client.js';

const REPO = fileURLToPath(new URL('../..', import.meta.url));
const SERVERS = fileURLToPath(new URL('./frontdoor-servers.ts', import.meta.url));
const CLI = fileURLToPath(new URL('../../cli/main.ts', import.meta.url));
const NGINX_EXAMPLE = fileURLToPath(new URL('../../deploy/examples/front-door/nginx/cellquota.conf', import.meta.url));

/** Target names: rows of the report, and the pairs of its ratios. */
export const T = {
  upstream: 'upstream direct',
  nginx: 'nginx alone',
  limitReq: 'nginx limit_req',
  forwardAuth: 'nginx + forward-auth (agent)',
  forwardAuthUnix: 'nginx + forward-auth (agent, unix socket)',
  ceiling: 'nginx + auth_request to nginx return 200 (ceiling)',
  emptyNode: 'nginx + auth_request to empty node:http (unix socket)',
  bare: 'bare proxy (@fastify/http-proxy)',
  gateway: 'cellquota gateway',
} as const;

/** The ratios reported, [name, numerator, denominator, target or null]. */
const RATIOS: readonly (readonly [string, string, string, number | null])[] = [
  ['forward-auth / nginx limit_req', T.forwardAuth, T.limitReq, 0.7],
  ['forward-auth over the Unix socket / nginx limit_req', T.forwardAuthUnix, T.limitReq, 0.7],
  ['ceiling (auth answered by nginx itself) / nginx limit_req', T.ceiling, T.limitReq, null],
  ['empty node:http auth / nginx limit_req', T.emptyNode, T.limitReq, null],
  ['gateway / bare proxy', T.gateway, T.bare, 0.8],
];

export interface FrontDoorRow {
  readonly target: string;
  /** The median round's req/s. */
  readonly reqPerSec: number;
  /** Every round's req/s, in round order. */
  readonly rounds: readonly number[];
  /** p50 and p99 of the median round. */
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** Over all rounds. */
  readonly errors: number;
  readonly non2xx: number;
  /** CPU microseconds per request of the load client and of each process that served the row (medians). */
  readonly cpuUsPerRequest: Readonly<Record<string, number>>;
}

export interface FrontDoorRatio {
  readonly name: string;
  /** Median of the per-round ratios; NaN when a side is missing. */
  readonly median: number;
  readonly min: number;
  readonly max: number;
  readonly target: number | null;
}

export interface FrontDoorResult {
  readonly report: BenchReport;
  readonly rows: readonly FrontDoorRow[];
  readonly ratios: readonly FrontDoorRatio[];
  readonly skipped: readonly string[];
}

interface Target {
  readonly name: string;
  readonly url: string;
  readonly serving: readonly string[];
}

interface Run {
  readonly reqPerSec: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly errors: number;
  readonly non2xx: number;
  readonly cpu: Readonly<Record<string, number>>;
}

function haveNginx(): Promise<boolean> {
  return new Promise((r) => {
    const p = spawn('nginx', ['-v'], { stdio: 'ignore' });
    p.once('error', () => r(false));
    p.once('exit', (code) => r(code === 0));
  });
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/** Run sizes; CELLQUOTA_BENCH_ROUNDS and CELLQUOTA_BENCH_SECONDS lengthen or shorten a run. */
function sizes(opts: { smoke: boolean; seconds?: number; connections?: number; rounds?: number }): {
  rounds: number;
  seconds: number;
  connections: number;
} {
  const env = (k: string): string | undefined => process.env[k]?.trim() || undefined;
  const rounds = opts.rounds ?? Number(env('CELLQUOTA_BENCH_ROUNDS') ?? (opts.smoke ? 1 : 3));
  const seconds = opts.seconds ?? Number(env('CELLQUOTA_BENCH_SECONDS') ?? (opts.smoke ? 1 : 5));
  if (!Number.isInteger(rounds) || rounds < 1 || rounds > 50) throw new Error('CELLQUOTA_BENCH_ROUNDS: 1..50');
  if (!(seconds > 0 && seconds <= 60)) throw new Error('CELLQUOTA_BENCH_SECONDS: (0, 60]');
  return { rounds, seconds, connections: opts.connections ?? (opts.smoke ? 8 : 32) };
}

export async function runFrontDoorBenchDetailed(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
  seconds?: number;
  connections?: number;
  rounds?: number;
  /** The load client (default: wrk when installed, else autocannon). */
  client?: LoadClient;
}): Promise<FrontDoorResult> {
  const { rounds, seconds, connections } = sizes(opts);
  const client = opts.client ?? (haveWrk() ? wrkClient : autocannonClient);
  const scratch = mkdtempSync(join(tmpdir(), 'cq-bench-frontdoor-'));
  const load0 = loadavg();
  const procs: ChildProcess[] = [];
  const stop = armEmergencyStop(
    () => {
      for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
    },
    scratch,
    opts.progress,
  );
  const named = new Map<string, ChildProcess>();
  /** Starts a process; ready when `port` accepts, or when its output contains `port` (a string). */
  const start = async (what: string, cmd: string, args: string[], ready: number | string): Promise<void> => {
    let out = '';
    const p = spawn(cmd, args, { cwd: REPO, stdio: ['ignore', 'pipe', 'pipe'] });
    named.set(what, p);
    p.stdout?.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-4000)));
    p.stderr?.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-4000)));
    procs.push(p);
    if (typeof ready === 'number') {
      await waitListening(ready, what, { proc: p, timeoutMs: 30_000, context: () => out });
      return;
    }
    await waitFor(
      `${what}: '${ready}'`,
      () => {
        if (p.exitCode !== null || p.signalCode !== null) throw new Error(`${what} exited:\n${out}`);
        return out.includes(ready);
      },
      { timeoutMs: 30_000 },
    );
  };
  const targets: Target[] = [];
  const skipped: string[] = [];
  const once = async (t: Target, secs: number): Promise<Run> => {
    const cpu = (): Map<string, number> =>
      new Map(t.serving.map((what) => [what, treeCpuSeconds(named.get(what)?.pid) ?? 0] as const));
    const before = cpu();
    const r = await client.run(t.url, connections, secs);
    const after = cpu();
    const perRequest = (cpuS: number): number => (r.requests > 0 ? Math.round((cpuS * 1e7) / r.requests) / 10 : 0);
    const used: Record<string, number> = { client: perRequest(r.clientCpuSeconds) };
    for (const [what, x] of after) used[what] = perRequest(x - (before.get(what) ?? x));
    return { reqPerSec: r.reqPerSec, p50Ms: r.p50Ms, p99Ms: r.p99Ms, errors: r.errors, non2xx: r.non2xx, cpu: used };
  };
  const runs = new Map<string, Run[]>();
  try {
    const tsx = [process.execPath, '--import', 'tsx'] as const;
    const upPort = await freePort();
    await start('upstream', tsx[0], [...tsx.slice(1), SERVERS, 'upstream', String(upPort)], upPort);
    const upstream = `http://127.0.0.1:${upPort}`;
    targets.push({ name: T.upstream, url: `${upstream}/`, serving: ['upstream'] });
    const rules = join(scratch, 'rules.yaml');
    // far above any offered load: every request is decided, none refused
    writeFileSync(
      rules,
      'domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 100000000}\n',
    );

    if (await haveNginx()) {
      const agentPort = await freePort();
      // the scratch folder searchable by nginx's workers, which connect to the sockets in it
      chmodSync(scratch, 0o755);
      const agentSocket = join(scratch, 'forward-auth.sock');
      await start('agent', tsx[0], [...tsx.slice(1), CLI, ...agentArgs(rules, agentPort, agentSocket)], agentPort);
      const emptyNodeSocket = join(scratch, 'empty-auth.sock');
      await start(
        'empty auth',
        tsx[0],
        [...tsx.slice(1), SERVERS, 'empty-auth', emptyNodeSocket],
        `empty auth on ${emptyNodeSocket}`,
      );
      const ports: NginxPorts = {
        plain: await freePort(),
        limitReq: await freePort(),
        forwardAuth: await freePort(),
        unix: await freePort(),
        ceiling: await freePort(),
        emptyNode: await freePort(),
      };
      const dir = join(scratch, 'nginx');
      mkdirSync(join(dir, 'logs'), { recursive: true });
      const conf = nginxConf({
        example: readFileSync(NGINX_EXAMPLE, 'utf8'),
        dir,
        ports,
        upstreamPort: upPort,
        agentPort,
        agentSocket,
        ceilingSocket: join(scratch, 'ceiling.sock'),
        emptyNodeSocket,
      });
      writeFileSync(join(dir, 'nginx.conf'), conf);
      await start('nginx', 'nginx', ['-p', dir, '-c', join(dir, 'nginx.conf'), '-g', 'daemon off;'], ports.forwardAuth);
      const at = (port: number): string => `http://127.0.0.1:${port}/`;
      targets.push(
        { name: T.nginx, url: at(ports.plain), serving: ['nginx', 'upstream'] },
        { name: T.limitReq, url: at(ports.limitReq), serving: ['nginx', 'upstream'] },
        { name: T.forwardAuth, url: at(ports.forwardAuth), serving: ['nginx', 'agent', 'upstream'] },
        { name: T.forwardAuthUnix, url: at(ports.unix), serving: ['nginx', 'agent', 'upstream'] },
        { name: T.ceiling, url: at(ports.ceiling), serving: ['nginx', 'upstream'] },
        { name: T.emptyNode, url: at(ports.emptyNode), serving: ['nginx', 'empty auth', 'upstream'] },
      );
    } else {
      skipped.push('nginx rows: nginx is not installed (apt-get install nginx)');
    }

    const barePort = await freePort();
    await start('bare proxy', tsx[0], [...tsx.slice(1), SERVERS, 'bare-proxy', String(barePort), upstream], barePort);
    targets.push({ name: T.bare, url: `http://127.0.0.1:${barePort}/`, serving: ['bare proxy', 'upstream'] });
    const gwPort = await freePort();
    const gwHealth = await freePort();
    await start(
      'gateway',
      tsx[0],
      [...tsx.slice(1), CLI, 'gateway', '--listen', `127.0.0.1:${gwPort}`, '--upstream', upstream].concat([
        '--rules',
        rules,
        '--health',
        `127.0.0.1:${gwHealth}`,
        '--log-level',
        'warn',
      ]),
      gwPort,
    );
    targets.push({ name: T.gateway, url: `http://127.0.0.1:${gwPort}/`, serving: ['gateway', 'upstream'] });

    // a warm-up of every target (JIT, keep-alive pools; not in a smoke run), then the rounds
    if (!opts.smoke) for (const t of targets) await client.run(t.url, connections, 1);
    for (let round = 0; round < rounds; round++) {
      for (let k = 0; k < targets.length; k++) {
        const t = targets[(round + k) % targets.length] as Target;
        const r = await once(t, seconds);
        runs.set(t.name, [...(runs.get(t.name) ?? []), r]);
        opts.progress(
          `round ${round + 1}/${rounds} ${t.name}: ${Math.round(r.reqPerSec)} req/s, p50 ${r.p50Ms} ms, ` +
            `p99 ${r.p99Ms} ms; CPU µs/request ${cpuText(r.cpu)}`,
        );
      }
    }
  } finally {
    stop.signalsOff();
    await Promise.all(procs.map(stopProcess));
    stop.exitOff();
    rmSync(scratch, { recursive: true, force: true });
  }
  const rows = targets.map((t) => rowOf(t, runs.get(t.name) ?? []));
  const ratios = RATIOS.map(([name, a, b, target]) => ratioOf(name, runs.get(a), runs.get(b), target));
  const by = (t: string): FrontDoorRow | undefined => rows.find((r) => r.target === t);
  const cpuOf = (t: string, ...what: string[]): number =>
    what.reduce((sum, w) => sum + (by(t)?.cpuUsPerRequest[w] ?? 0), 0);
  const notes = [
    `${rounds} interleaved round(s) of ${seconds} s per target ${opts.smoke ? 'without' : 'after'} a warm-up of each; ${connections} ` +
      `keep-alive connections; load client ${client.name}; every process on this machine's loopback; ` +
      `${machineLine()}; load average ${load0} at the start, ${loadavg()} at the end.`,
    ...ratios.map(
      (r) =>
        `${r.name} = ${fmt(r.median)} (per round ${fmt(r.min)}–${fmt(r.max)})` +
        (r.target === null ? '' : ` (target ≥ ${r.target})`),
    ),
    'CPU µs/request: per process, from /proc (utime + stime over the run / requests answered), medians ' +
      'over the rounds; client is the load client. On a machine whose cores every process shares, ' +
      'throughput follows the sum. nginx + its auth service, CPU µs/request: ' +
      [
        ['limit_req', cpuOf(T.limitReq, 'nginx')],
        ['agent over TCP', cpuOf(T.forwardAuth, 'nginx', 'agent')],
        ['agent over the Unix socket', cpuOf(T.forwardAuthUnix, 'nginx', 'agent')],
        ['nginx answering itself', cpuOf(T.ceiling, 'nginx')],
        ['empty node:http', cpuOf(T.emptyNode, 'nginx', 'empty auth')],
      ]
        .filter(([, x]) => (x as number) > 0)
        .map(([k, x]) => `${k as string} ${(x as number).toFixed(1)}`)
        .join(', ') +
      '.',
    'Limits far above the offered load: every request is decided, none refused. nginx runs one worker; the ' +
      'agent (--workers 0, its HTTP port on the main thread) and the gateway one Node thread each.',
    ...skipped,
  ];
  const report: BenchReport = {
    name: 'frontdoor',
    title: 'Front door: forward-auth and gateway beside nginx and a bare proxy',
    rows: rows.map((r) => ({
      target: r.target,
      'req/s': r.reqPerSec,
      'req/s min–max': `${Math.min(...r.rounds)}–${Math.max(...r.rounds)}`,
      'p50 ms': r.p50Ms,
      'p99 ms': r.p99Ms,
      errors: r.errors,
      'non-2xx': r.non2xx,
      'CPU µs/request': cpuText(r.cpuUsPerRequest),
    })),
    notes,
  };
  return { report, rows, ratios, skipped };
}

function agentArgs(rules: string, port: number, socket: string): string[] {
  return [
    'agent',
    ...['--cell', 'bench', '--rules', rules, '--workers', '0', '--http', `127.0.0.1:${port}`],
    ...['--forward-auth-socket', socket, '--socket-mode', '0666'], // nginx's workers run as another user
    ...['--trusted-proxies', '127.0.0.1', '--forward-auth-deny-status', '403'],
    ...['--lag-threshold-ms', '0', '--log-level', 'warn'],
  ];
}

function rowOf(t: Target, runs: readonly Run[]): FrontDoorRow {
  const byRate = [...runs].sort((a, b) => a.reqPerSec - b.reqPerSec);
  const mid = byRate[Math.floor((byRate.length - 1) / 2)];
  const cpu: Record<string, number> = {};
  for (const what of ['client', ...t.serving])
    cpu[what] = Math.round(median(runs.map((r) => r.cpu[what] ?? 0)) * 10) / 10;
  return {
    target: t.name,
    reqPerSec: Math.round(median(runs.map((r) => r.reqPerSec))),
    rounds: runs.map((r) => Math.round(r.reqPerSec)),
    p50Ms: mid?.p50Ms ?? Number.NaN,
    p99Ms: mid?.p99Ms ?? Number.NaN,
    errors: runs.reduce((s, r) => s + r.errors, 0),
    non2xx: runs.reduce((s, r) => s + r.non2xx, 0),
    cpuUsPerRequest: cpu,
  };
}

function ratioOf(
  name: string,
  a: readonly Run[] | undefined,
  b: readonly Run[] | undefined,
  target: number | null,
): FrontDoorRatio {
  if (a === undefined || b === undefined || a.length !== b.length || a.length === 0)
    return { name, median: Number.NaN, min: Number.NaN, max: Number.NaN, target };
  const per = a.map((x, i) => x.reqPerSec / (b[i] as Run).reqPerSec);
  return { name, median: median(per), min: Math.min(...per), max: Math.max(...per), target };
}

function fmt(x: number): string {
  return Number.isFinite(x) ? x.toFixed(2) : 'n/a';
}

function loadavg(): string {
  return os
    .loadavg()
    .map((x) => x.toFixed(2))
    .join(' ');
}

function stopProcess(p: ChildProcess): Promise<void> {
  return new Promise<void>((r) => {
    if (p.exitCode !== null || p.signalCode !== null) return r();
    const t = setTimeout(() => p.kill('SIGKILL'), 5000);
    p.once('exit', () => {
      clearTimeout(t);
      r();
    });
    p.kill('SIGTERM');
  });
}

export async function runFrontDoorBench(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
}): Promise<BenchReport> {
  return (await runFrontDoorBenchDetailed(opts)).report;
}

function cpuText(cpu: Readonly<Record<string, number>>): string {
  const parts = Object.entries(cpu).map(([k, v]) => `${k} ${v.toFixed(1)}`);
  const total = Object.values(cpu).reduce((a, b) => a + b, 0);
  return `${parts.join(' · ')} = ${total.toFixed(1)}`;
}
