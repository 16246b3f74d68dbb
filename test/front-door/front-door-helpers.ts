// Real front doors for the tests: an upstream app (node:http: echoes what reached it, counts a
// streamed body, answers WebSocket upgrades), nginx and Caddy from Debian's packages started on free
// loopback ports with configs written here, and a visitor client that connects from its own
// loopback address (127.0.0.X), so each visitor is a different peer as on the internet.
import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, request } from 'node:http';
import type { IncomingHttpHeaders, Server } from 'node:http';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';
import { WebSocketServer } from 'ws';
import { freePort } from '../../testkit/ports.js';
import { waitListening } from '../../testkit/ports.js';

export { freePort };

export function have(command: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${command}`], { stdio: 'ignore' }).status === 0;
}

/** Why a test of a real proxy is skipped (the package is missing), or false. */
export function missing(...commands: string[]): string | false {
  const absent = commands.filter((c) => !have(c));
  return absent.length === 0
    ? false
    : `${absent.join(', ')} not installed (apt-get install ${absent.join(' ')}; .ci/run installs them)`;
}

export interface Upstream {
  readonly port: number;
  readonly url: string;
  /** Requests that reached the app, by visitor (X-Forwarded-For's last entry, else the peer). */
  readonly hits: string[];
  close(): Promise<void>;
}

/**
 * The app behind the proxy. `GET /...` → 200 JSON {path, xff}; `POST /upload` reads the body as it
 * streams and answers {bytes}; `GET /stream?chunks=N` answers N chunks of 1 KiB, 20 ms apart; an
 * upgrade to WebSocket echoes every message back.
 */
export async function startUpstream(): Promise<Upstream> {
  const hits: string[] = [];
  const server: Server = createServer((req, res) => {
    const xff = req.headers['x-forwarded-for'];
    hits.push(typeof xff === 'string' ? (xff.split(',').pop() ?? '').trim() : (req.socket.remoteAddress ?? ''));
    if (req.method === 'POST') {
      let bytes = 0;
      req.on('data', (c: Buffer) => {
        bytes += c.length;
      });
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ bytes }));
      });
      return;
    }
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname === '/stream') {
      const chunks = Number(url.searchParams.get('chunks') ?? '3');
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      let sent = 0;
      const timer = setInterval(() => {
        res.write(Buffer.alloc(1024, 97));
        if (++sent >= chunks) {
          clearInterval(timer);
          res.end();
        }
      }, 20);
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ path: req.url, xff: xff ?? null }));
  });
  server.keepAliveTimeout = 30_000;
  const wss = new WebSocketServer({ server });
  wss.on('connection', (ws) => ws.on('message', (data, binary) => ws.send(data, { binary })));
  const port = await freePort();
  await new Promise<void>((r) => server.listen(port, '127.0.0.1', r));
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    hits,
    close: () =>
      new Promise<void>((r) => {
        for (const c of wss.clients) c.terminate();
        wss.close();
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

export interface Reply {
  readonly status: number;
  readonly headers: IncomingHttpHeaders;
  readonly body: string;
}

export interface SendOptions {
  /** The visitor's own address (127.0.0.X): the TCP peer the proxy sees. */
  readonly from?: string;
  readonly method?: string;
  readonly headers?: Record<string, string>;
  /** A body written in chunks (streamed, no content-length). */
  readonly chunks?: readonly Buffer[];
  readonly timeoutMs?: number;
}

/** One HTTP/1.1 request on a fresh connection. */
export function send(url: string, opts: SendOptions = {}): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      {
        method: opts.method ?? 'GET',
        headers: opts.headers,
        localAddress: opts.from,
        agent: false,
        timeout: opts.timeoutMs ?? 10_000,
      },
      (res) => {
        const parts: Buffer[] = [];
        res.on('data', (c: Buffer) => parts.push(c));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts).toString('utf8') }),
        );
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`timeout: ${url}`)));
    req.on('error', reject);
    if (opts.chunks === undefined) {
      req.end();
      return;
    }
    const chunks = [...opts.chunks];
    const next = (): void => {
      const c = chunks.shift();
      if (c === undefined) {
        req.end();
        return;
      }
      req.write(c);
      setTimeout(next, 5);
    };
    next();
  });
}

export interface ProxyProcess {
  readonly port: number;
  readonly url: string;
  output(): string;
  stop(): Promise<void>;
}

function stopProcess(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve();
  return new Promise<void>((r) => {
    const timer = setTimeout(() => proc.kill('SIGKILL'), 5_000);
    proc.once('exit', () => {
      clearTimeout(timer);
      r();
    });
    proc.kill('SIGTERM');
  });
}

/** nginx (`nginx -p DIR -c nginx.conf`, foreground), `http` the inside of its http block. */
export async function startNginx(dir: string, port: number, http: string): Promise<ProxyProcess> {
  mkdirSync(join(dir, 'logs'), { recursive: true });
  const conf = `worker_processes 1;
error_log ${join(dir, 'logs/error.log')} warn;
pid ${join(dir, 'nginx.pid')};
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path ${join(dir, 'body')};
  proxy_temp_path ${join(dir, 'proxy')};
  fastcgi_temp_path ${join(dir, 'fastcgi')};
  uwsgi_temp_path ${join(dir, 'uwsgi')};
  scgi_temp_path ${join(dir, 'scgi')};
${http}
}
`;
  writeFileSync(join(dir, 'nginx.conf'), conf);
  let out = '';
  const proc = spawn('nginx', ['-p', dir, '-c', join(dir, 'nginx.conf'), '-g', 'daemon off;'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  proc.stdout.on('data', (c: Buffer) => (out += c.toString()));
  proc.stderr.on('data', (c: Buffer) => (out += c.toString()));
  const output = (): string => {
    let log = '';
    try {
      log = readFileSync(join(dir, 'logs/error.log'), 'utf8');
    } catch {
      // not written yet
    }
    return `${out}${log}`;
  };
  await waitListening(port, 'nginx', { proc, context: output });
  return { port, url: `http://127.0.0.1:${port}`, output, stop: () => stopProcess(proc) };
}

/** Caddy (`caddy run` with this Caddyfile text; its data under DIR). */
export async function startCaddy(dir: string, port: number, caddyfile: string): Promise<ProxyProcess> {
  mkdirSync(dir, { recursive: true });
  const file = join(dir, 'Caddyfile');
  writeFileSync(file, caddyfile);
  let out = '';
  const env = { ...process.env, HOME: dir, XDG_DATA_HOME: join(dir, 'data'), XDG_CONFIG_HOME: join(dir, 'config') };
  const proc = spawn('caddy', ['run', '--config', file, '--adapter', 'caddyfile'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env,
  });
  proc.stdout.on('data', (c: Buffer) => (out += c.toString()));
  proc.stderr.on('data', (c: Buffer) => (out += c.toString()));
  await waitListening(port, 'caddy', { proc, context: () => out });
  return { port, url: `http://127.0.0.1:${port}`, output: () => out, stop: () => stopProcess(proc) };
}

const EXAMPLES = fileURLToPath(new URL('../../deploy/examples/front-door/', import.meta.url));

/** Replaces `from` in `text`, insisting that it is there (an example that changed fails loudly). */
function swap(text: string, from: string, to: string): string {
  assert.ok(text.includes(from), `the example no longer contains ${from}`);
  return text.split(from).join(to);
}

/** deploy/examples/front-door/nginx/cellquota.conf with this test's ports. */
export function nginxExample(port: number, upstreamPort: number, agent: number | { unix: string }): string {
  let conf = readFileSync(join(EXAMPLES, 'nginx/cellquota.conf'), 'utf8');
  conf = swap(conf, 'listen 80;', `listen 127.0.0.1:${port};`);
  conf = swap(conf, '127.0.0.1:8080', `127.0.0.1:${upstreamPort}`);
  return swap(conf, '127.0.0.1:9091', typeof agent === 'number' ? `127.0.0.1:${agent}` : `unix:${agent.unix}`);
}

/** deploy/examples/front-door/caddy/Caddyfile with this test's ports, bound to 127.0.0.1. */
export function caddyExample(port: number, upstreamPort: number, agentPort: number): string {
  let conf = readFileSync(join(EXAMPLES, 'caddy/Caddyfile'), 'utf8');
  conf = swap(conf, '\n:80 {\n', `\nhttp://127.0.0.1:${port} {\n\tbind 127.0.0.1\n`);
  conf = swap(conf, '127.0.0.1:8080', `127.0.0.1:${upstreamPort}`);
  return swap(conf, '127.0.0.1:9091', `127.0.0.1:${agentPort}`);
}

/** The per-visitor limit the front-door tests configure: a rule on remote_address. */
export const PER_MINUTE = 5;

/** Fresh visitor addresses 127.0.0.<first>, 127.0.0.<first+1>, ... */
export function visitors(first: number): () => string {
  let next = first;
  return () => `127.0.0.${next++}`;
}

/**
 * The behaviour every front door must show, with PER_MINUTE per remote_address: `url` is the front
 * door's, `visitor` hands out fresh 127.0.0.X addresses.
 */
export async function perVisitorLimits(url: string, visitor: () => string): Promise<void> {
  const a = visitor();
  const b = visitor();
  for (let i = 0; i < PER_MINUTE; i++) {
    const r = await send(`${url}/items/${i}`, { from: a });
    assert.equal(r.status, 200, `request ${i} of visitor ${a}: ${r.status} ${r.body}`);
    assert.equal((JSON.parse(r.body) as { path: string }).path, `/items/${i}`, 'reached the upstream');
    assert.equal(r.headers['ratelimit-limit'], String(PER_MINUTE));
    assert.equal(r.headers['ratelimit-remaining'], String(PER_MINUTE - 1 - i));
  }
  const refused = await send(`${url}/items/x`, { from: a });
  assert.equal(refused.status, 429, refused.body);
  const retry = Number(refused.headers['retry-after']);
  assert.ok(
    Number.isInteger(retry) && retry >= 1 && retry <= 60 / PER_MINUTE,
    `Retry-After ${refused.headers['retry-after']}`,
  );
  assert.equal(refused.headers['ratelimit-remaining'], '0');
  // A forged X-Forwarded-For chain does not make A someone else: the proxy appends A's address.
  for (const forged of ['203.0.113.9', '198.51.100.1, 10.0.0.1', '127.0.0.1', 'garbage, 127.0.0.1']) {
    const r = await send(`${url}/items/forged`, {
      from: a,
      headers: { 'x-forwarded-for': forged, 'x-real-ip': '203.0.113.10' },
    });
    assert.equal(r.status, 429, `forged X-Forwarded-For ${forged}: ${r.status}`);
  }
  // B is another visitor with its own allowance.
  const rb = await send(`${url}/items/b`, { from: b, headers: { 'x-forwarded-for': a } });
  assert.equal(rb.status, 200, rb.body);
  assert.equal(rb.headers['ratelimit-remaining'], String(PER_MINUTE - 1));
}
