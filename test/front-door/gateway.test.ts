// `cellquota gateway` in front of a real upstream: the same per-visitor behaviour as nginx and Caddy
// with forward-auth, a streamed upload and download, a WebSocket, the connection cap, the probe
// port, the CLI's settings.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { WebSocket } from 'ws';
import { parseGatewayConfig } from '../../cell-agent/gateway/gateway-config.js';
import { startGateway } from '../../cell-agent/gateway/gateway-main.js';
import type { GatewayHandle } from '../../cell-agent/gateway/gateway-main.js';
import { runGatewayCommand } from '../../cell-agent/gateway/gateway-cli.js';
import { PER_MINUTE, perVisitorLimits, send, startUpstream, visitors } from './front-door-helpers.js';
import type { Upstream } from './front-door-helpers.js';
import { captureLogger } from '../../testkit/logs.js';
import { waitFor } from '../../testkit/wait.js';
import { type TempDir, tempDir } from '../../testkit/temp-dir.js';

const RULES = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: ${PER_MINUTE}}
`;

let dir: TempDir;
let upstream: Upstream;
let gateway: GatewayHandle;
const visitor = visitors(100);
const captured = captureLogger();

before(async () => {
  dir = tempDir('cq-gateway-');
  upstream = await startUpstream();
  gateway = await startGateway(
    parseGatewayConfig({
      listen: '127.0.0.1:0',
      upstream: upstream.url,
      rules: dir.file('rules.yaml', RULES),
      health: '127.0.0.1:0',
      maxConnectionsPerClient: '3',
      connectionExempt: '127.0.0.2',
      throttleLogIntervalMs: '200',
      // The test's own HTTP client runs on the gateway's event loop (its first requests compile undici
      // there): exact counts need the overload guard off here; its policy is tested on its own.
      lagThresholdMs: '0',
    }),
    captured.logger,
  );
});

after(async () => {
  await gateway.stop();
  await upstream.close();
  dir.remove();
});

void test("the gateway decides under the agent's overload policy: bounded by default, open or another allowance when asked", () => {
  assert.deepEqual(gateway.agent.check.overload, { policy: 'bounded', allowance: 1 });
  const open = parseGatewayConfig({
    listen: '127.0.0.1:0',
    upstream: upstream.url,
    rules: 'r.yaml',
    overloadPolicy: 'open',
    overloadAllowance: '0.5',
    lagThresholdMs: '20',
  });
  assert.deepEqual(
    [open.overloadPolicy, open.overloadAllowance, open.lagThresholdMs],
    ['open', 0.5, 20],
    "validated by the agent's declaration of these settings, then passed on to the embedded agent",
  );
  assert.throws(
    () =>
      parseGatewayConfig({ listen: '127.0.0.1:0', upstream: upstream.url, rules: 'r.yaml', overloadAllowance: '1000' }),
    /overloadAllowance/,
    "the agent's range applies to the gateway's flag",
  );
});

void test('per-visitor limits, a spoofed X-Forwarded-For chain, 429 with Retry-After; throttling logged per client', async () => {
  await perVisitorLimits(gateway.url, visitor);
  const line = await waitFor('a throttled log line naming the visitor', () =>
    captured.lines.find(
      (l) => l['msg'] === 'throttled' && typeof l['key'] === 'string' && l['key'].includes('remote_address=127.0.0.'),
    ),
  );
  assert.ok(Number(line['refused']) >= 1 && line['intervalMs'] === 200, JSON.stringify(line));
  // the upstream saw the visitor in X-Forwarded-For, appended by the gateway
  assert.ok(upstream.hits.includes('127.0.0.100'), upstream.hits.join(' '));
});

void test('a streamed upload and a streamed download pass through whole', async () => {
  const chunks = Array.from({ length: 64 }, (_, i) => Buffer.alloc(16 * 1024, i));
  const up = await send(`${gateway.url}/upload`, {
    from: visitor(),
    method: 'POST',
    chunks,
    headers: { 'content-type': 'application/octet-stream' },
  });
  assert.equal(up.status, 200, up.body);
  assert.deepEqual(JSON.parse(up.body), { bytes: 64 * 16 * 1024 });
  const down = await send(`${gateway.url}/stream?chunks=4`, { from: visitor() });
  assert.equal(down.status, 200);
  assert.equal(down.body.length, 4 * 1024);
});

function openWs(url: string, from: string): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { localAddress: from });
    ws.once('open', () => resolve(ws));
    ws.once('unexpected-response', (_req, res) =>
      reject(new Error(`status ${res.statusCode} retry-after ${res.headers['retry-after'] ?? '-'}`)),
    );
    ws.once('error', reject);
  });
}

void test("a WebSocket is passed through; a refused visitor's upgrade gets 429", async () => {
  const v = visitor();
  const ws = await openWs(`${gateway.url.replace('http', 'ws')}/chat`, v);
  const echoed = new Promise<string>((r) => ws.once('message', (data: Buffer) => r(data.toString())));
  ws.send('hello through the gateway');
  assert.equal(await echoed, 'hello through the gateway');
  ws.close();
  for (let i = 0; i < PER_MINUTE - 1; i++) assert.equal((await send(`${gateway.url}/x`, { from: v })).status, 200);
  await assert.rejects(openWs(`${gateway.url.replace('http', 'ws')}/chat`, v), /status 429 retry-after \d+/);
});

function rawConnection(
  url: string,
  from: string,
): Promise<{ data: () => string; closed: Promise<void>; end: () => void }> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    let data = '';
    const s = connect({ host: u.hostname, port: Number(u.port), localAddress: from });
    const closed = new Promise<void>((r) => s.once('close', () => r()));
    s.on('data', (c: Buffer) => (data += c.toString()));
    s.once('connect', () => resolve({ data: () => data, closed, end: () => s.destroy() }));
    s.once('error', reject);
  });
}

void test('connections per client are capped, exempt addresses are not', async () => {
  const v = visitor();
  const held = [
    await rawConnection(gateway.url, v),
    await rawConnection(gateway.url, v),
    await rawConnection(gateway.url, v),
  ];
  const over = await rawConnection(gateway.url, v);
  await over.closed;
  assert.match(over.data(), /^HTTP\/1\.1 429 Too Many Requests\r\nRetry-After: 1\r\n/);
  // another visitor is not affected; the exempt address may hold more
  const other = await send(`${gateway.url}/y`, { from: visitor() });
  assert.equal(other.status, 200);
  const exempt = await Promise.all(Array.from({ length: 5 }, () => rawConnection(gateway.url, '127.0.0.2')));
  const r = await send(`${gateway.url}/z`, { from: '127.0.0.2' });
  assert.equal(r.status, 200);
  for (const c of [...held, ...exempt]) c.end();
  // once closed, the visitor may connect again
  await waitFor('the visitor to be admitted again', async () =>
    (await send(`${gateway.url}/again`, { from: v })).status === 200 ? true : undefined,
  );
  const metrics = await send(`${gateway.healthUrl}/metrics`);
  const refused = /^cellquota_gateway_connections_refused_total (\d+)$/m.exec(metrics.body);
  assert.ok(
    refused !== null && Number(refused[1]) >= 1,
    refused?.[0] ?? 'no cellquota_gateway_connections_refused_total',
  );
});

void test('/healthz and /metrics on their own port, answering for the gateway', async () => {
  const h = await send(`${gateway.healthUrl}/healthz`);
  assert.equal(h.status, 200);
  assert.equal((JSON.parse(h.body) as { status: string }).status, 'ok');
  const m = await send(`${gateway.healthUrl}/metrics`);
  assert.match(m.body, /cellquota_gateway_requests_total\{verdict="refused"\} [1-9]/);
  assert.match(m.body, /cellquota_gateway_requests_total\{verdict="allowed"\} [1-9]/);
  assert.match(m.body, /cellquota_agent_/);
  // the proxy port does not answer /healthz itself: it goes to the app like any path
  const proxied = await send(`${gateway.url}/healthz`, { from: visitor() });
  assert.equal((JSON.parse(proxied.body) as { path: string }).path, '/healthz');
});

void test('the CLI: every setting from CELLQUOTA_*, a bad one named with its source', async () => {
  const out: string[] = [];
  const err: string[] = [];
  const io = {
    stdout: { write: (t: string) => out.push(t) },
    stderr: { write: (t: string) => err.push(t) },
    signals: process,
  };
  const rules = dir.file('cli-rules.yaml', RULES);
  assert.equal(
    await runGatewayCommand(
      [],
      { CELLQUOTA_LISTEN: '127.0.0.1:0', CELLQUOTA_UPSTREAM: 'ftp://x', CELLQUOTA_RULES: rules },
      io,
    ),
    2,
  );
  assert.match(err.join(''), /CELLQUOTA_UPSTREAM: 'ftp:\/\/x': the upstream is http:\/\/ or https:\/\//);
  assert.equal(
    await runGatewayCommand(
      ['--upstream', upstream.url, '--rules', rules, '--listen', '127.0.0.1:0'],
      { CELLQUOTA_CONNECTION_EXEMPT: '10.0.0.0/33' },
      io,
    ),
    2,
  );
  assert.match(err.join(''), /CELLQUOTA_CONNECTION_EXEMPT: bad connection exemption "10.0.0.0\/33"/);
  assert.equal(await runGatewayCommand(['--help'], {}, io), 0);
  assert.match(out.join(''), /--max-connections-per-client .*\[CELLQUOTA_MAX_CONNECTIONS_PER_CLIENT\]/);
});
