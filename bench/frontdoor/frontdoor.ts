// `npm run bench -- frontdoor`: the front doors side by side, in one run, at one fixed concurrency,
// driven by one load client (wrk if installed, else autocannon; load-client.ts), keep-alive:
//   upstream direct · nginx alone · nginx limit_req · nginx + auth_request to the agent's
//   /v1/forward-auth · a bare proxy on @fastify/http-proxy · cellquota gateway (the same library)
// Every limiter is configured so that it decides every request and refuses none (a per-visitor
// limit far above the offered load): the cost of deciding is measured, not the cost of refusing.
// Targets (issue 18): forward-auth through nginx ≥ 0.7 × nginx limit_req; gateway ≥ 0.8 × bare proxy.
// Every process shares this machine's cores, so beside each throughput the CPU each process spent
// per request is given (/proc): on a small machine that, not the req/s alone, says what a front door
// costs.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { BenchReport } from '../bench-report.js';
import { armEmergencyStop } from '../emergency-stop.js';
import { freePort, waitListening } from '../../testkit/ports.js';
import { treeCpuSeconds } from '../../testkit/process-cpu.js';
import { autocannonClient, haveWrk, wrkClient } from './load-client.js';
import type { LoadClient } from './load-client.js';

const REPO = fileURLToPath(new URL('../..', import.meta.url));
const SERVERS = fileURLToPath(new URL('./frontdoor-servers.ts', import.meta.url));
const CLI = fileURLToPath(new URL('../../cli/main.ts', import.meta.url));
const NGINX_EXAMPLE = fileURLToPath(new URL('../../deploy/examples/front-door/nginx/cellquota.conf', import.meta.url));

export interface FrontDoorRow {
  readonly target: string;
  readonly reqPerSec: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly errors: number;
  readonly non2xx: number;
  /** CPU microseconds per request of the load client and of each process that served the row. */
  readonly cpuUsPerRequest: Readonly<Record<string, number>>;
}

export interface FrontDoorResult {
  readonly report: BenchReport;
  readonly rows: readonly FrontDoorRow[];
  readonly skipped: readonly string[];
}

function haveNginx(): Promise<boolean> {
  return new Promise((r) => {
    const p = spawn('nginx', ['-v'], { stdio: 'ignore' });
    p.once('error', () => r(false));
    p.once('exit', (code) => r(code === 0));
  });
}

export async function runFrontDoorBenchDetailed(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
  seconds?: number;
  connections?: number;
  /** The load client (default: wrk when installed, else autocannon). */
  client?: LoadClient;
}): Promise<FrontDoorResult> {
  const seconds = opts.seconds ?? (opts.smoke ? 1 : 8);
  const connections = opts.connections ?? (opts.smoke ? 8 : 32);
  const client = opts.client ?? (haveWrk() ? wrkClient : autocannonClient);
  const scratch = mkdtempSync(join(tmpdir(), 'cq-bench-frontdoor-'));
  const procs: ChildProcess[] = [];
  const stop = armEmergencyStop(
    () => {
      for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
    },
    scratch,
    opts.progress,
  );
  const named = new Map<string, ChildProcess>();
  const start = async (what: string, cmd: string, args: string[], port: number): Promise<void> => {
    let out = '';
    const p = spawn(cmd, args, { cwd: REPO, stdio: ['ignore', 'pipe', 'pipe'] });
    named.set(what, p);
    p.stdout?.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-4000)));
    p.stderr?.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-4000)));
    procs.push(p);
    await waitListening(port, what, { proc: p, timeoutMs: 30_000, context: () => out });
  };
  const rows: FrontDoorRow[] = [];
  const skipped: string[] = [];
  const measure = async (target: string, url: string, serving: readonly string[]): Promise<void> => {
    // a short warm-up (JIT, keep-alive pools), then the measured run
    await client.run(url, connections, opts.smoke ? 0.3 : 1);
    const cpu = (): Map<string, number> =>
      new Map(serving.map((what) => [what, treeCpuSeconds(named.get(what)?.pid) ?? 0] as const));
    const before = cpu();
    const r = await client.run(url, connections, seconds);
    const after = cpu();
    const perRequest = (cpuS: number): number => (r.requests > 0 ? Math.round((cpuS * 1e7) / r.requests) / 10 : 0);
    const cpuUsPerRequest: Record<string, number> = { client: perRequest(r.clientCpuSeconds) };
    for (const [what, t] of after) {
      cpuUsPerRequest[what] = perRequest(t - (before.get(what) ?? t));
    }
    rows.push({
      target,
      reqPerSec: Math.round(r.reqPerSec),
      p50Ms: r.p50Ms,
      p99Ms: r.p99Ms,
      errors: r.errors,
      non2xx: r.non2xx,
      cpuUsPerRequest,
    });
    opts.progress(
      `${target}: ${Math.round(r.reqPerSec)} req/s, p50 ${r.p50Ms} ms, p99 ${r.p99Ms} ms; CPU µs/request ` +
        cpuText(cpuUsPerRequest),
    );
  };
  try {
    const tsx = [process.execPath, '--import', 'tsx'] as const;
    const upPort = await freePort();
    await start('upstream', tsx[0], [...tsx.slice(1), SERVERS, 'upstream', String(upPort)], upPort);
    const upstream = `http://127.0.0.1:${upPort}`;
    const rules = join(scratch, 'rules.yaml');
    // far above any offered load: every request is decided, none refused
    writeFileSync(
      rules,
      'domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 100000000}\n',
    );

    await measure('upstream direct', `${upstream}/`, ['upstream']);

    if (await haveNginx()) {
      const agentPort = await freePort();
      // the scratch folder searchable by nginx's workers, which connect to the agent's socket in it
      chmodSync(scratch, 0o755);
      const agentSocket = join(scratch, 'forward-auth.sock');
      await start(
        'agent',
        tsx[0],
        [
          ...tsx.slice(1),
          CLI,
          'agent',
          '--cell',
          'bench',
          '--rules',
          rules,
          '--workers',
          '0',
          '--http',
          `127.0.0.1:${agentPort}`,
          '--forward-auth-socket',
          agentSocket,
          '--socket-mode',
          '0666', // nginx's workers run as another user
          '--trusted-proxies',
          '127.0.0.1',
          '--forward-auth-deny-status',
          '403',
          '--lag-threshold-ms',
          '0',
          '--log-level',
          'warn',
        ],
        agentPort,
      );
      const example = readFileSync(NGINX_EXAMPLE, 'utf8');
      const nginxPorts = {
        plain: await freePort(),
        limitReq: await freePort(),
        forwardAuth: await freePort(),
        forwardAuthUnix: await freePort(),
      };
      const dir = join(scratch, 'nginx');
      mkdirSync(join(dir, 'logs'), { recursive: true });
      const forwardAuth = swapAll(example, [
        ['listen 80;', `listen 127.0.0.1:${nginxPorts.forwardAuth};`],
        ['127.0.0.1:8080', `127.0.0.1:${upPort}`],
        ['127.0.0.1:9091', `127.0.0.1:${agentPort}`],
      ]);
      // the same example over the agent's Unix socket: its own agent upstream, the app's declared once
      const forwardAuthUnix = swapAll(example, [
        ['listen 80;', `listen 127.0.0.1:${nginxPorts.forwardAuthUnix};`],
        ['upstream app { server 127.0.0.1:8080; keepalive 32; }', ''],
        ['upstream cellquota {', 'upstream cellquota_unix {'],
        ['http://cellquota/', 'http://cellquota_unix/'],
        ['127.0.0.1:9091', `unix:${agentSocket}`],
      ]);
      const conf = `worker_processes 1;
error_log ${join(dir, 'logs/error.log')} warn;
pid ${join(dir, 'nginx.pid')};
events { worker_connections 4096; }
http {
  access_log off;
  # nginx closes a client connection after 1,000 requests by default; a close with a request in
  # flight counts as an error in autocannon, which is the load client's artefact, not the proxy's
  keepalive_requests 10000000;
  client_body_temp_path ${join(dir, 'body')}; proxy_temp_path ${join(dir, 'proxy')}; fastcgi_temp_path ${join(dir, 'fastcgi')}; uwsgi_temp_path ${join(dir, 'uwsgi')}; scgi_temp_path ${join(dir, 'scgi')};
  limit_req_zone $binary_remote_addr zone=visitors:10m rate=100000000r/s;
${forwardAuth}
${forwardAuthUnix}
  server {
    listen 127.0.0.1:${nginxPorts.plain};
    location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; }
  }
  server {
    listen 127.0.0.1:${nginxPorts.limitReq};
    location / { limit_req zone=visitors burst=100000000 nodelay; proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; }
  }
}
`;
      writeFileSync(join(dir, 'nginx.conf'), conf);
      await start(
        'nginx',
        'nginx',
        ['-p', dir, '-c', join(dir, 'nginx.conf'), '-g', 'daemon off;'],
        nginxPorts.forwardAuth,
      );
      await measure('nginx alone', `http://127.0.0.1:${nginxPorts.plain}/`, ['nginx', 'upstream']);
      await measure('nginx limit_req', `http://127.0.0.1:${nginxPorts.limitReq}/`, ['nginx', 'upstream']);
      await measure('nginx + forward-auth (agent)', `http://127.0.0.1:${nginxPorts.forwardAuth}/`, [
        'nginx',
        'agent',
        'upstream',
      ]);
      await measure('nginx + forward-auth (agent, unix socket)', `http://127.0.0.1:${nginxPorts.forwardAuthUnix}/`, [
        'nginx',
        'agent',
        'upstream',
      ]);
    } else {
      skipped.push('nginx rows: nginx is not installed (apt-get install nginx)');
    }

    const barePort = await freePort();
    await start('bare proxy', tsx[0], [...tsx.slice(1), SERVERS, 'bare-proxy', String(barePort), upstream], barePort);
    await measure('bare proxy (@fastify/http-proxy)', `http://127.0.0.1:${barePort}/`, ['bare proxy', 'upstream']);
    const gwPort = await freePort();
    const gwHealth = await freePort();
    await start(
      'gateway',
      tsx[0],
      [
        ...tsx.slice(1),
        CLI,
        'gateway',
        '--listen',
        `127.0.0.1:${gwPort}`,
        '--upstream',
        upstream,
        '--rules',
        rules,
        '--health',
        `127.0.0.1:${gwHealth}`,
        '--log-level',
        'warn',
      ],
      gwPort,
    );
    await measure('cellquota gateway', `http://127.0.0.1:${gwPort}/`, ['gateway', 'upstream']);
  } finally {
    stop.signalsOff();
    await Promise.all(
      procs.map(
        (p) =>
          new Promise<void>((r) => {
            if (p.exitCode !== null || p.signalCode !== null) return r();
            const t = setTimeout(() => p.kill('SIGKILL'), 5000);
            p.once('exit', () => {
              clearTimeout(t);
              r();
            });
            p.kill('SIGTERM');
          }),
      ),
    );
    stop.exitOff();
    rmSync(scratch, { recursive: true, force: true });
  }
  const by = (t: string): FrontDoorRow | undefined => rows.find((r) => r.target === t);
  const ratio = (a: string, b: string): string => {
    const x = by(a);
    const y = by(b);
    return x === undefined || y === undefined || y.reqPerSec === 0 ? 'n/a' : (x.reqPerSec / y.reqPerSec).toFixed(2);
  };
  const faVsLimitReq = ratio('nginx + forward-auth (agent)', 'nginx limit_req');
  const gwVsBare = ratio('cellquota gateway', 'bare proxy (@fastify/http-proxy)');
  const cpuOf = (t: string, ...what: string[]): number =>
    what.reduce((sum, w) => sum + (by(t)?.cpuUsPerRequest[w] ?? 0), 0);
  const lrCpu = cpuOf('nginx limit_req', 'nginx');
  const faCpu = cpuOf('nginx + forward-auth (agent)', 'nginx', 'agent');
  const faUnixCpu = cpuOf('nginx + forward-auth (agent, unix socket)', 'nginx', 'agent');
  const faUnixVsLimitReq = ratio('nginx + forward-auth (agent, unix socket)', 'nginx limit_req');
  const notes = [
    `${connections} keep-alive connections, ${seconds} s per target after a warm-up, load client ${client.name}; ` +
      "every process on this machine's loopback.",
    `nginx + forward-auth / nginx limit_req = ${faVsLimitReq} (target ≥ 0.7), over the agent's Unix socket ` +
      `${faUnixVsLimitReq}; ` +
      `gateway / bare proxy = ${gwVsBare} (target ≥ 0.8).`,
    'CPU µs/request: per process, from /proc (utime + stime over the measured run / requests answered); ' +
      'client is the load client. ' +
      (lrCpu > 0 && faCpu > 0
        ? `The front door's own CPU per request: nginx limit_req ${lrCpu.toFixed(1)}, nginx + agent ` +
          `${faCpu.toFixed(1)} (ratio ${(lrCpu / faCpu).toFixed(2)}), over the Unix socket ${faUnixCpu.toFixed(1)}` +
          (faUnixCpu > 0 ? ` (ratio ${(lrCpu / faUnixCpu).toFixed(2)}).` : '.')
        : ''),
    'Limits far above the offered load: every request is decided, none refused. nginx runs one worker; the agent (--workers 0, its HTTP port on the main thread) and the gateway one Node thread each.',
    ...skipped,
  ];
  const report: BenchReport = {
    name: 'frontdoor',
    title: 'Front door: forward-auth and gateway beside nginx and a bare proxy',
    rows: rows.map((r) => ({
      target: r.target,
      'req/s': r.reqPerSec,
      'p50 ms': r.p50Ms,
      'p99 ms': r.p99Ms,
      errors: r.errors,
      'non-2xx': r.non2xx,
      'CPU µs/request': cpuText(r.cpuUsPerRequest),
    })),
    notes,
  };
  return { report, rows, skipped };
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

/** `text` with every `from` replaced by its `to`; each `from` must occur (the example changed otherwise). */
function swapAll(text: string, pairs: readonly (readonly [string, string])[]): string {
  let out = text;
  for (const [from, to] of pairs) {
    if (!out.includes(from)) throw new Error(`the nginx example no longer contains ${from}`);
    out = out.split(from).join(to);
  }
  return out;
}
