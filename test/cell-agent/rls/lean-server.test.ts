// The agent's lean RLS server (gRPC framing on node:http2) as clients meet it: a grpcio (C-core)
// client, the corners of gRPC's wire format spoken by hand over node:http2's client (deadlines,
// the compression flag, the message bound, one message per unary call, content types, unknown
// methods, percent-encoded messages), and a graceful stop that lets a call in flight finish.
// (grpc-js clients: test/cell-agent/agent/agent-grpc.test.ts runs against the same server.)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import http2 from 'node:http2';
import { connect } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAgentConfig } from '../../../cell-agent/agent-config.js';
import { startAgent } from '../../../cell-agent/agent-main.js';
import type { AgentHandle } from '../../../cell-agent/agent-main.js';
import { decodeGrpcMessage, frameMessage } from '../../../cell-agent/rls/grpc-wire.js';
import {
  decodeRateLimitResponse,
  encodeHealthCheckRequest,
  encodeRateLimitRequest,
} from '../../../cell-agent/rls/rls-codec.js';
import type { RlsRequest } from '../../../cell-agent/messages/rls-messages.js';
import { RlsClient, d, grpcError, unixTarget } from '../../../testkit/rls-client.js';
import { captureLogger } from '../../../testkit/logs.js';
import { type TempDir, tempDir } from '../../../testkit/temp-dir.js';

const RLS = '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit';
const RULES =
  'domain: lean\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2, name: two}\n  - key: free\n    rate_limit: {unlimited: true}\n';
const MAX_MESSAGE = 4096;
const GRPCIO_CLIENT = fileURLToPath(new URL('./grpcio-client.py', import.meta.url));

let dir: TempDir;
let agent: AgentHandle;
let socketPath: string;

/** HealthCheckResponse {status = 1 (varint)}: the one field a server sends. */
function decodeHealthCheckResponse(bytes: Buffer): { ok: boolean; value: { status: number } } {
  if (bytes.length === 0) return { ok: true, value: { status: 0 } };
  return { ok: bytes.length === 2 && bytes[0] === 0x08, value: { status: bytes[1] ?? -1 } };
}

const request = (value: string, domain = 'lean'): RlsRequest => ({
  domain,
  descriptors: [{ entries: [{ key: 'k', value }], limit: null, hitsAddend: null }],
  hitsAddend: 0,
});

before(async () => {
  dir = tempDir('cq-lean-');
  mkdirSync(join(dir.path, 'rules'));
  writeFileSync(join(dir.path, 'rules', 'lean.yaml'), RULES);
  socketPath = join(dir.path, 'rls.sock');
  agent = await startAgent(
    parseAgentConfig({
      cell: 'lean-cell',
      rules: join(dir.path, 'rules'),
      rlsSocket: socketPath,
      rlsListen: '127.0.0.1:0',
      tableCapacity: 1000,
      lagThresholdMs: 0,
      maxMessageBytes: MAX_MESSAGE,
    }),
    captureLogger().logger,
  );
});

after(async () => {
  await agent.stop();
  dir.remove();
});

// ---- grpcio ---------------------------------------------------------------------------------------

interface PyCall {
  method: string;
  request: string;
  timeout?: number;
  stream?: boolean;
  take?: number;
}
interface PyResult {
  code: number;
  details: string;
  responses: string[];
}

/** A Python 3 that has grpcio (Debian's python3-grpcio installs it for /usr/bin/python3). */
function pythonWithGrpc(): string | null {
  for (const py of ['/usr/bin/python3', 'python3']) {
    const r = spawnSync(py, ['-c', 'import grpc'], { encoding: 'utf8' });
    if (r.status === 0) return py;
  }
  return null;
}

void test('a grpcio client: decisions over TCP and the Unix socket, request errors with their status, health Check and Watch', (t) => {
  const python = pythonWithGrpc();
  if (python === null) {
    t.skip('python3 with grpcio is not installed (Debian: apt-get install python3-grpcio)');
    return;
  }
  const run = (target: string, calls: PyCall[]): PyResult[] => {
    const r = spawnSync(python, [GRPCIO_CLIENT], {
      input: JSON.stringify({ target, calls }),
      encoding: 'utf8',
      timeout: 30_000,
    });
    assert.equal(r.status, 0, r.stderr);
    return JSON.parse(r.stdout) as PyResult[];
  };
  const hex = (b: Uint8Array): string => Buffer.from(b).toString('hex');
  const check = (value: string): PyCall => ({ method: RLS, request: hex(encodeRateLimitRequest(request(value))) });
  const tcp = agent.endpoints.rlsTcp[0] ?? '';
  const results = run(tcp, [
    check('py'),
    check('py'),
    check('py'),
    { method: RLS, request: hex(encodeRateLimitRequest({ domain: '', descriptors: [], hitsAddend: 0 })) },
    { method: RLS, request: '0a7f0102' },
    { method: RLS, request: hex(encodeRateLimitRequest(request('x'.repeat(MAX_MESSAGE)))) },
    { method: '/grpc.health.v1.Health/Check', request: hex(encodeHealthCheckRequest({ service: '' })) },
    { method: '/grpc.health.v1.Health/Check', request: hex(encodeHealthCheckRequest({ service: 'nope' })) },
    {
      method: '/grpc.health.v1.Health/Watch',
      request: hex(encodeHealthCheckRequest({ service: '' })),
      stream: true,
      take: 1,
    },
    { method: '/no.Such/Method', request: '' },
  ]);
  const decoded = results.slice(0, 3).map((r) => {
    assert.equal(r.code, 0, r.details);
    const d = decodeRateLimitResponse(Buffer.from(r.responses[0] ?? '', 'hex'));
    assert.ok(d.ok);
    return [d.value.overallCode, d.value.statuses[0]?.limitRemaining, d.value.statuses[0]?.currentLimit?.name];
  });
  assert.deepEqual(
    decoded,
    [
      [1, 1, 'two'],
      [1, 0, 'two'],
      [2, 0, 'two'],
    ],
    'OK, OK, OVER_LIMIT from one bucket of 2',
  );
  assert.deepEqual(
    results[3],
    { code: 2, details: 'rate limit domain must not be empty', responses: [] },
    'UNKNOWN, as envoyproxy/ratelimit',
  );
  assert.equal(results[4]?.code, 3);
  assert.match(results[4]?.details ?? '', /^malformed RateLimitRequest: /);
  assert.equal(results[5]?.code, 8, 'RESOURCE_EXHAUSTED over the message bound');
  assert.match(results[5]?.details ?? '', /larger than max \(\d+ vs\. 4096\)/);
  const health = decodeHealthCheckResponse(Buffer.from(results[6]?.responses[0] ?? '', 'hex'));
  assert.deepEqual(health, { ok: true, value: { status: 1 } }, 'SERVING');
  assert.equal(results[7]?.code, 5, 'NOT_FOUND for an unknown service');
  assert.deepEqual(
    decodeHealthCheckResponse(Buffer.from(results[8]?.responses[0] ?? '', 'hex')),
    { ok: true, value: { status: 1 } },
    'Watch streams SERVING first',
  );
  assert.equal(results[9]?.code, 12, 'UNIMPLEMENTED');

  const uds = run(`unix://${socketPath}`, [check('py')]);
  assert.equal(uds[0]?.code, 0);
  const d = decodeRateLimitResponse(Buffer.from(uds[0]?.responses[0] ?? '', 'hex'));
  assert.ok(d.ok && d.value.overallCode === 2, 'the Unix socket decides on the same bucket');
});

// ---- the wire format by hand ----------------------------------------------------------------------

interface RawAnswer {
  status: number;
  headers: http2.IncomingHttpHeaders;
  trailers: http2.IncomingHttpHeaders | null;
  body: Buffer;
  grpcStatus: number | null;
  grpcMessage: string | null;
}

/** One stream: headers, then `send(stream)` writes the body as it likes. */
function raw(
  session: http2.ClientHttp2Session,
  headers: http2.OutgoingHttpHeaders,
  send: (s: http2.ClientHttp2Stream) => void,
): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const stream = session.request({
      ':method': 'POST',
      ':path': RLS,
      'content-type': 'application/grpc',
      te: 'trailers',
      ...headers,
    });
    let head: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders | null = null;
    const chunks: Buffer[] = [];
    stream.on('response', (h: http2.IncomingHttpHeaders) => {
      head = h;
    });
    stream.on('trailers', (h: http2.IncomingHttpHeaders) => {
      trailers = h;
    });
    stream.on('data', (c: Buffer) => {
      chunks.push(c);
    });
    stream.on('error', reject);
    stream.on('close', () => {
      const status = trailers ?? head;
      const code = status['grpc-status'];
      const message = status['grpc-message'];
      resolve({
        status: Number(head[':status']),
        headers: head,
        trailers,
        body: Buffer.concat(chunks),
        grpcStatus: code === undefined ? null : Number(code),
        grpcMessage: typeof message === 'string' ? decodeGrpcMessage(message) : null,
      });
    });
    send(stream);
  });
}

void test('wire format: deadlines, compression refused, the message bound, one message per call, content type, unknown methods', async () => {
  const session = http2.connect(`http://${agent.endpoints.rlsTcp[0] ?? ''}`);
  session.on('error', () => undefined);
  try {
    const message = frameMessage(encodeRateLimitRequest(request('raw')));
    const ok = await raw(session, { 'grpc-timeout': '5S' }, (s) => s.end(message));
    assert.equal(ok.status, 200);
    assert.equal(ok.headers['content-type'], 'application/grpc');
    assert.equal(ok.headers['grpc-accept-encoding'], undefined, 'said by the status answers only');
    assert.equal(ok.grpcStatus, 0, 'grpc-status 0 in the trailers');
    assert.equal(ok.body[0], 0);
    assert.equal(ok.body.readUInt32BE(1), ok.body.length - 5, 'one length-prefixed message');
    const answer = decodeRateLimitResponse(ok.body.subarray(5));
    assert.ok(answer.ok && answer.value.overallCode === 1);

    // The body split anywhere, even inside the prefix, is one message.
    const split = await raw(session, {}, (s) => {
      s.write(message.subarray(0, 2));
      setImmediate(() => {
        s.write(message.subarray(2, 7));
        setImmediate(() => s.end(message.subarray(7)));
      });
    });
    assert.equal(split.grpcStatus, 0);

    // A deadline and a request that arrives in parts, the last a few turns of the event loop later
    // (the server's deadline timer is armed only for a request not complete by the end of its turn).
    const slow = await raw(session, { 'grpc-timeout': '5S' }, (s) => {
      s.write(message.subarray(0, 3));
      setTimeout(() => s.end(message.subarray(3)), 30);
    });
    assert.equal(slow.grpcStatus, 0, 'answered: the rest came within the deadline');
    const partial = await raw(session, { 'grpc-timeout': '150m' }, (s) => s.write(message.subarray(0, 3)));
    assert.equal(partial.grpcStatus, 4, 'DEADLINE_EXCEEDED: the rest never came');

    const started = Date.now();
    const late = await raw(session, { 'grpc-timeout': '150m' }, () => undefined);
    assert.equal(late.grpcStatus, 4, 'DEADLINE_EXCEEDED: the request never came');
    assert.ok(Date.now() - started >= 140, 'not before the deadline');

    const malformedTimeout = await raw(session, { 'grpc-timeout': '12x' }, (s) => s.end(message));
    assert.equal(malformedTimeout.grpcStatus, 13);
    assert.match(malformedTimeout.grpcMessage ?? '', /malformed grpc-timeout/);

    const compressed = Buffer.from(message);
    compressed[0] = 1;
    const gz = await raw(session, { 'grpc-encoding': 'gzip' }, (s) => s.end(compressed));
    assert.equal(gz.grpcStatus, 12, 'UNIMPLEMENTED');
    assert.match(gz.grpcMessage ?? '', /compressed messages are not supported/);
    assert.equal(gz.headers['grpc-accept-encoding'], 'identity');

    const tooBig = Buffer.alloc(5);
    tooBig.writeUInt32BE(MAX_MESSAGE + 1, 1);
    const big = await raw(session, {}, (s) => s.write(tooBig)); // the rest never sent: refused on the prefix alone
    assert.equal(big.grpcStatus, 8);
    assert.equal(big.grpcMessage, `received message larger than max (${MAX_MESSAGE + 1} vs. ${MAX_MESSAGE})`);

    const two = await raw(session, {}, (s) => s.end(Buffer.concat([message, message])));
    assert.equal(two.grpcStatus, 12);
    const none = await raw(session, {}, (s) => s.end());
    assert.equal(none.grpcStatus, 12);
    const truncated = await raw(session, {}, (s) => s.end(message.subarray(0, message.length - 1)));
    assert.equal(truncated.grpcStatus, 13);
    assert.match(truncated.grpcMessage ?? '', /ended inside a message/);

    const json = await raw(session, { 'content-type': 'application/json' }, (s) => s.end('{}'));
    assert.equal(json.status, 415);
    const unknown = await raw(session, { ':path': '/x.Y/Z' }, (s) => s.end(message));
    assert.equal(unknown.grpcStatus, 12);
    assert.equal(unknown.grpcMessage, 'the server does not implement the method /x.Y/Z');

    // A message outside printable ASCII is percent-encoded on the wire and reads back as it was.
    const bad = await raw(session, {}, (s) =>
      s.end(
        frameMessage(
          encodeRateLimitRequest({
            domain: 'lean',
            descriptors: [{ entries: [{ key: 'k', value: 'é'.repeat(5000) }], limit: null, hitsAddend: null }],
            hitsAddend: 0,
          }),
        ),
      ),
    );
    assert.equal(bad.grpcStatus, 8, 'over the bound before anything else');
    const invalid = await raw(session, {}, (s) =>
      s.end(
        frameMessage(
          encodeRateLimitRequest({
            domain: 'lean',
            descriptors: Array.from({ length: 65 }, () => ({
              entries: [{ key: 'ü', value: '%' }],
              limit: null,
              hitsAddend: null,
            })),
            hitsAddend: 0,
          }),
        ),
      ),
    );
    assert.equal(invalid.grpcStatus, 3);
    assert.match(invalid.grpcMessage ?? '', /65 descriptors/);

    const after = await raw(session, {}, (s) =>
      s.end(
        frameMessage(
          encodeRateLimitRequest({
            ...request('x'),
            descriptors: [{ entries: [{ key: 'free', value: 'x' }], limit: null, hitsAddend: null }],
          }),
        ),
      ),
    );
    assert.equal(after.grpcStatus, 0, 'the connection still serves after every refusal');
  } finally {
    session.close();
  }
});

void test('stop: a call in flight finishes, then the socket is removed', async () => {
  const d2 = tempDir('cq-lean-stop-');
  const rules = d2.file('r.yaml', RULES);
  const sock = join(d2.path, 'stop.sock');
  const second = await startAgent(
    parseAgentConfig({ cell: 'stop', rules, rlsSocket: sock, tableCapacity: 100, lagThresholdMs: 0 }),
    captureLogger().logger,
  );
  const session = http2.connect('http://localhost', { createConnection: () => connect(sock) });
  session.on('error', () => undefined);
  try {
    await new Promise((resolve) => session.once('connect', resolve));
    const message = frameMessage(
      encodeRateLimitRequest({
        ...request('x'),
        descriptors: [{ entries: [{ key: 'free', value: 'x' }], limit: null, hitsAddend: null }],
      }),
    );
    let release: () => void = () => undefined;
    const inFlight = raw(session, {}, (s) => {
      s.write(message.subarray(0, 3));
      release = () => s.end(message.subarray(3));
    });
    // The server reads frames in order: once it acks a PING sent after the request's HEADERS, the call is open there.
    await new Promise<void>((resolve, reject) => session.ping((error) => (error === null ? resolve() : reject(error))));
    const stopping = second.stop();
    release();
    const answer = await inFlight;
    assert.equal(answer.grpcStatus, 0, 'answered during the stop');
    await stopping;
    assert.equal(existsSync(sock), false, 'the socket is removed');
  } finally {
    session.destroy();
    d2.remove();
  }
});

void test('the grpc-js variant (--rls-server grpc-js) serves the same contract', async () => {
  const d3 = tempDir('cq-grpcjs-');
  const sock = join(d3.path, 'g.sock');
  const variant = await startAgent(
    parseAgentConfig({
      cell: 'g',
      rules: d3.file('r.yaml', RULES),
      rlsSocket: sock,
      rlsServer: 'grpc-js',
      tableCapacity: 100,
      lagThresholdMs: 0,
    }),
    captureLogger().logger,
  );
  const client = new RlsClient(unixTarget(sock));
  try {
    const first = await client.check({ domain: 'lean', descriptors: [d(['k', 'g'])] });
    assert.deepEqual([first.overall_code, first.statuses[0]?.limit_remaining], ['OK', 1]);
    assert.equal((await grpcError(client.check({ domain: '', descriptors: [d(['k', 'g'])] }))).code, 2);
  } finally {
    client.close();
    await variant.stop();
    d3.remove();
  }
});
