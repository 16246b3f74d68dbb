// `npm run bench -- frontdoor`: the front doors side by side, in one run, at one fixed concurrency,
// driven by autocannon (keep-alive connections) from this process:
//   upstream direct · nginx alone · nginx limit_req · nginx + auth_request to the agent's
//   /v1/forward-auth · a bare proxy on @fastify/http-proxy · cellquota gateway (the same library)
// Every limiter is configured so that it decides every request and refuses none (a per-visitor
// limit far above the offered load): the cost of deciding is measured, not the cost of refusing.
// Targets (issue 18): forward-auth through nginx ≥ 0.7 × nginx limit_req; gateway ≥ 0.8 × bare proxy.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import type { BenchReport } from '../bench-report.js';
import { armEmergencyStop } from '../emergency-stop.js';
import { freePort, waitListening } from '../../testkit/ports.js';

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
}): Promise<FrontDoorResult> {
  const seconds = opts.seconds ?? (opts.smoke ? 1 : 8);
  const connections = opts.connections ?? (opts.smoke ? 8 : 32);
  const scratch = mkdtempSync(join(tmpdir(), 'cq-bench-frontdoor-'));
  const procs: ChildProcess[] = [];
  const stop = armEmergencyStop(
    () => {
      for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
    },
    scratch,
    opts.progress,
  );
  const start = async (what: string, cmd: string, args: string[], port: number): Promise<void> => {
    let out = '';
    const p = spawn(cmd, args, { cwd: REPO, stdio: ['ignore', 'pipe', 'pipe'] });
    p.stdout?.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-4000)));
    p.stderr?.on('data', (c: Buffer) => (out = (out + c.toString()).slice(-4000)));
    procs.push(p);
    await waitListening(port, what, { proc: p, timeoutMs: 30_000, context: () => out });
  };
  const rows: FrontDoorRow[] = [];
  const skipped: string[] = [];
  const measure = async (target: string, url: string): Promise<void> => {
    // a short warm-up (JIT, keep-alive pools), then the measured run
    await autocannon({ url, connections, duration: opts.smoke ? 0.3 : 1 });
    const r = await autocannon({ url, connections, duration: seconds });
    rows.push({
      target,
      reqPerSec: Math.round(r.requests.average),
      p50Ms: r.latency.p50,
      p99Ms: r.latency.p99,
      errors: r.errors + r.timeouts,
      non2xx: r.non2xx,
    });
    opts.progress(
      `${target}: ${Math.round(r.requests.average)} req/s, p50 ${r.latency.p50} ms, p99 ${r.latency.p99} ms`,
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

    await measure('upstream direct', `${upstream}/`);

    if (await haveNginx()) {
      const agentPort = await freePort();
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
      const { readFileSync } = await import('node:fs');
      const example = readFileSync(NGINX_EXAMPLE, 'utf8');
      const nginxPorts = { plain: await freePort(), limitReq: await freePort(), forwardAuth: await freePort() };
      const dir = join(scratch, 'nginx');
      mkdirSync(join(dir, 'logs'), { recursive: true });
      const forwardAuth = example
        .replace('listen 80;', `listen 127.0.0.1:${nginxPorts.forwardAuth};`)
        .split('127.0.0.1:8080')
        .join(`127.0.0.1:${upPort}`)
        .split('127.0.0.1:9091')
        .join(`127.0.0.1:${agentPort}`);
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
      await measure('nginx alone', `http://127.0.0.1:${nginxPorts.plain}/`);
      await measure('nginx limit_req', `http://127.0.0.1:${nginxPorts.limitReq}/`);
      await measure('nginx + forward-auth (agent)', `http://127.0.0.1:${nginxPorts.forwardAuth}/`);
    } else {
      skipped.push('nginx rows: nginx is not installed (apt-get install nginx)');
    }

    const barePort = await freePort();
    await start('bare proxy', tsx[0], [...tsx.slice(1), SERVERS, 'bare-proxy', String(barePort), upstream], barePort);
    await measure('bare proxy (@fastify/http-proxy)', `http://127.0.0.1:${barePort}/`);
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
    await measure('cellquota gateway', `http://127.0.0.1:${gwPort}/`);
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
  const notes = [
    `${connections} keep-alive connections, ${seconds} s per target after a warm-up, autocannon in the benchmark process; every process on this machine's loopback.`,
    `nginx + forward-auth / nginx limit_req = ${faVsLimitReq} (target ≥ 0.7); gateway / bare proxy = ${gwVsBare} (target ≥ 0.8).`,
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
