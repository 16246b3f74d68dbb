// The running agent over real sockets: a gRPC client built from proto/envoy/** (proto-loader) on the
// Unix socket and on TCP, with envoyproxy/ratelimit-style rules; request errors and input bounds;
// garbage bytes; health; hot reload; global tenant quotas on static slices; the HTTP API.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { parseAgentConfig } from '../../../cell-agent/agent-config.js';
import { startAgent } from '../../../cell-agent/agent-main.js';
import type { AgentHandle } from '../../../cell-agent/agent-main.js';
import { HealthClient, RlsClient, d, grpcError, unixTarget } from '../../../testkit/rls-client.js';
import type { ResponseOut } from '../../../testkit/rls-client.js';
import { type CapturedLogger, captureLogger } from '../../../testkit/logs.js';
import { waitFor } from '../../../testkit/wait.js';
import { type TempDir, tempDir } from '../../../testkit/temp-dir.js';

const BASIC = `
domain: basic
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 3, name: three}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: nested
    value: a
    descriptors:
      - key: sub
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /img/*
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: small
    rate_limit: {unit: hour, requests_per_unit: 1, name: small}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 100, name: big, replaces: [{name: small}]}
  - key: hits
    rate_limit: {unit: hour, requests_per_unit: 10}
`;

const API = `
domain: api
descriptors:
  - key: tenant
    global: true
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 2}
`;

const TENANTS = `
tiers:
  bronze: {rate: 100, burst: 100}
  slow: {rate: 0.5, burst: 100}
tenants:
  acme: bronze
  sloth: slow
`;

const RELOAD_V1 = 'domain: reload\ndescriptors:\n  - key: r\n    rate_limit: {unit: hour, requests_per_unit: 1}\n';
const RELOAD_V2 = 'domain: reload\ndescriptors:\n  - key: r\n    rate_limit: {unit: hour, requests_per_unit: 100}\n';

let dir: TempDir;
let agent: AgentHandle;
let uds: RlsClient;
let tcp: RlsClient;
let log: CapturedLogger;
let socketPath: string;

before(async () => {
  dir = tempDir();
  const rulesDir = join(dir.path, 'rules');
  mkdirSync(rulesDir);
  writeFileSync(join(rulesDir, 'basic.yaml'), BASIC);
  writeFileSync(join(rulesDir, 'api.yaml'), API);
  writeFileSync(join(rulesDir, 'reload.yaml'), RELOAD_V1);
  socketPath = join(dir.path, 'rls.sock');
  log = captureLogger();
  agent = await startAgent(
    parseAgentConfig({
      cell: 'test-cell',
      rules: rulesDir,
      tenants: dir.file('tenants.yaml', TENANTS),
      staticShare: 0.5,
      unknownTenant: 'tier:bronze',
      rlsSocket: socketPath,
      socketMode: '0600',
      rlsListen: '127.0.0.1:0',
      http: '127.0.0.1:0',
      responseHeaders: true,
      tableCapacity: 10_000,
      lagThresholdMs: 0,
      maxMessageBytes: 64 * 1024,
      httpBodyLimit: 4096,
      rulesDebounceMs: 50,
    }),
    log.logger,
  );
  uds = new RlsClient(unixTarget(socketPath));
  tcp = new RlsClient(agent.endpoints.rlsTcp[0] ?? '');
});

after(async () => {
  uds.close();
  tcp.close();
  await agent.stop();
  dir.remove();
});

const codes = (r: ResponseOut): string => r.statuses.map((s) => s.code).join(',');
const header = (r: ResponseOut, key: string): string | undefined =>
  r.response_headers_to_add.find((h) => h.key === key)?.value;

void test('endpoints: the Unix socket (mode 0600) and a TCP port; both serve the same buckets', async () => {
  assert.deepEqual(agent.endpoints.rlsUnix, [socketPath]);
  assert.equal(agent.endpoints.rlsTcp.length, 1);
  assert.equal(statSync(socketPath).mode & 0o777, 0o600);
  const a = await uds.check({ domain: 'basic', descriptors: [d(['key1', 'value1'])] });
  assert.equal(a.overall_code, 'OK');
  assert.deepEqual(a.statuses[0], {
    code: 'OK',
    current_limit: { name: 'three', requests_per_unit: 3, unit: 'MINUTE' },
    limit_remaining: 2,
    duration_until_reset: { seconds: 20, nanos: 0 },
    quota: null,
  });
  const b = await tcp.check({ domain: 'basic', descriptors: [d(['key1', 'value1'])] });
  assert.equal(b.statuses[0]?.limit_remaining, 1, 'TCP counts in the same bucket');
  await uds.check({ domain: 'basic', descriptors: [d(['key1', 'value1'])] });
  const over = await tcp.check({ domain: 'basic', descriptors: [d(['key1', 'value1'])] });
  assert.equal(over.overall_code, 'OVER_LIMIT');
  assert.deepEqual(
    over.response_headers_to_add.map((h) => [h.key, h.value]),
    [
      ['RateLimit-Limit', '3'],
      ['RateLimit-Remaining', '0'],
      ['RateLimit-Reset', '20'],
      ['x-ratelimit-refused-by', 'local-rule'],
      ['x-ratelimit-refused-limit', 'three'],
      ['x-ratelimit-cell', 'test-cell'],
    ],
    'over the limit: the RateLimit headers and why (which level, which cell)',
  );
});

void test('matching: per-value keys, nested descriptors, wildcards, unlimited, shadow mode, replaces', async () => {
  const check = (...descriptors: ReturnType<typeof d>[]): Promise<ResponseOut> =>
    uds.check({ domain: 'basic', descriptors });
  assert.deepEqual(
    await Promise.all([1, 2, 3].map(() => check(d(['remote_address', '10.0.0.1'])))).then((rs) =>
      rs.map((r) => r.overall_code).sort(),
    ),
    ['OK', 'OK', 'OVER_LIMIT'],
  );
  assert.equal((await check(d(['remote_address', '10.0.0.2']))).overall_code, 'OK', 'another value, another counter');
  assert.equal((await check(d(['nested', 'a'], ['sub', 'x']))).overall_code, 'OK');
  assert.equal((await check(d(['nested', 'a'], ['sub', 'x']))).overall_code, 'OVER_LIMIT');
  assert.equal((await check(d(['nested', 'a']))).statuses[0]?.current_limit, null, 'no limit at the shallower level');
  assert.equal((await check(d(['path', '/files/1']))).overall_code, 'OK');
  assert.equal((await check(d(['path', '/files/2']))).overall_code, 'OK');
  assert.equal((await check(d(['path', '/files/3']))).overall_code, 'OVER_LIMIT', 'share_threshold: one counter');
  assert.equal((await check(d(['path', '/img/1']))).overall_code, 'OK');
  assert.equal((await check(d(['path', '/img/2']))).overall_code, 'OK', 'without share_threshold: per value');
  const free = await check(d(['free', 'x']));
  assert.deepEqual(
    [free.statuses[0]?.code, free.statuses[0]?.limit_remaining, free.statuses[0]?.current_limit],
    ['OK', 4294967295, null],
  );
  await check(d(['shadow', 'x']));
  const shadow = await check(d(['shadow', 'x']));
  assert.deepEqual(
    [shadow.overall_code, shadow.statuses[0]?.code, shadow.statuses[0]?.limit_remaining],
    ['OK', 'OK', 0],
  );
  await check(d(['small', 'x']));
  assert.equal((await check(d(['small', 'x']))).overall_code, 'OVER_LIMIT');
  const replaced = await check(d(['small', 'x']), d(['big', 'x']));
  assert.equal(replaced.overall_code, 'OK', 'small is replaced by big');
  assert.equal(codes(replaced), 'OK,OK');
  assert.equal(replaced.statuses[0]?.current_limit, null);
});

void test('hits_addend at request and descriptor level, 0 = check without counting; limit overrides', async () => {
  const hits = (request: number, descriptor?: number): Promise<ResponseOut> =>
    uds.check({
      domain: 'basic',
      hits_addend: request,
      descriptors: [
        {
          entries: [{ key: 'hits', value: 'h' }],
          ...(descriptor === undefined ? {} : { hits_addend: { value: descriptor } }),
        },
      ],
    });
  assert.equal((await hits(4)).statuses[0]?.limit_remaining, 6);
  assert.equal((await hits(4, 0)).statuses[0]?.limit_remaining, 6, 'descriptor hits_addend 0: nothing counted');
  assert.equal((await hits(0, 5)).statuses[0]?.limit_remaining, 1);
  assert.equal((await hits(2)).overall_code, 'OVER_LIMIT');
  assert.equal((await hits(0)).statuses[0]?.limit_remaining, 0);
  const override = (): Promise<ResponseOut> =>
    uds.check({
      domain: 'basic',
      descriptors: [{ entries: [{ key: 'key1', value: 'value1' }], limit: { requests_per_unit: 2, unit: 'HOUR' } }],
    });
  const o1 = await override();
  assert.deepEqual(o1.statuses[0]?.current_limit, { name: '', requests_per_unit: 2, unit: 'HOUR' });
  assert.equal(o1.statuses[0]?.limit_remaining, 1);
  await override();
  assert.equal((await override()).overall_code, 'OVER_LIMIT');
});

void test('errors as envoyproxy/ratelimit: empty domain, empty descriptor list', async () => {
  assert.deepEqual(await grpcError(uds.check({ domain: '', descriptors: [d(['a', 'b'])] })), {
    code: grpc.status.UNKNOWN,
    details: 'rate limit domain must not be empty',
  });
  assert.deepEqual(await grpcError(uds.check({ domain: 'basic', descriptors: [] })), {
    code: grpc.status.UNKNOWN,
    details: 'rate limit descriptor list must not be empty',
  });
});

void test('input bounds: INVALID_ARGUMENT with a message; an oversize message: RESOURCE_EXHAUSTED', async () => {
  const many = await grpcError(
    uds.check({ domain: 'basic', descriptors: Array.from({ length: 65 }, () => d(['a', 'b'])) }),
  );
  assert.equal(many.code, grpc.status.INVALID_ARGUMENT);
  assert.match(many.details, /65 descriptors, more than the maximum of 64/);
  const entries = await grpcError(
    uds.check({
      domain: 'basic',
      descriptors: [{ entries: Array.from({ length: 17 }, (_, i) => ({ key: `k${i}`, value: 'v' })) }],
    }),
  );
  assert.match(entries.details, /descriptor 0 has 17 entries/);
  const key = await grpcError(uds.check({ domain: 'basic', descriptors: [d(['k'.repeat(300), 'v'])] }));
  assert.match(key.details, /key is 300 characters long/);
  const value = await grpcError(uds.check({ domain: 'basic', descriptors: [d(['k', 'v'.repeat(5000)])] }));
  assert.match(value.details, /value is 5000 characters long/);
  const domain = await grpcError(uds.check({ domain: 'x'.repeat(300), descriptors: [d(['k', 'v'])] }));
  assert.match(domain.details, /domain is 300 characters long/);
  const big = await grpcError(
    uds.check({ domain: 'basic', descriptors: Array.from({ length: 20 }, () => d(['k', 'v'.repeat(4000)])) }),
  );
  assert.equal(big.code, grpc.status.RESOURCE_EXHAUSTED);
});

void test('garbage: undecodable payloads get INVALID_ARGUMENT; raw bytes on the socket do not disturb the server', async () => {
  const raw = new grpc.Client(unixTarget(socketPath), grpc.credentials.createInsecure());
  try {
    const call = (payload: Buffer): Promise<{ code: number; details: string }> =>
      grpcError(
        new Promise((resolve, reject) => {
          raw.makeUnaryRequest(
            '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit',
            (b: Buffer) => b,
            (b: Buffer) => b,
            payload,
            (error, value) => (error !== null ? reject(error) : resolve(value)),
          );
        }),
      );
    const bad = await call(Buffer.from([0x0a, 0x7f, 0x01, 0x02]));
    assert.equal(bad.code, grpc.status.INVALID_ARGUMENT);
    assert.match(bad.details, /^malformed RateLimitRequest: /);
    for (let i = 0; i < 20; i++) {
      const bytes = Buffer.from(Array.from({ length: 1 + ((i * 7) % 40) }, (_, j) => (i * 31 + j * 17) & 0xff));
      await call(bytes).catch(() => undefined);
    }
  } finally {
    raw.close();
  }
  const junk = [
    Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'),
    Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 131) & 0xff)),
    Buffer.concat([
      Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'),
      Buffer.from(Array.from({ length: 512 }, (_, i) => (i * 7) & 0xff)),
    ]),
  ];
  for (const bytes of junk) {
    await new Promise<void>((resolve) => {
      const s = connect({ path: socketPath });
      s.on('error', () => resolve());
      s.on('close', () => resolve());
      s.on('connect', () => {
        s.write(bytes);
        setTimeout(() => s.destroy(), 200);
      });
    });
  }
  const ok = await uds.check({ domain: 'basic', descriptors: [d(['free', 'still'])] });
  assert.equal(ok.overall_code, 'OK', 'still serving');
  const metrics = await agent.metricsText();
  assert.match(metrics, /cellquota_agent_rejected_requests_total\{reason="malformed"\} ([1-9]\d*)/);
});

void test('gRPC health: Check and Watch; also under envoyproxy/ratelimit\'s name "ratelimit"', async () => {
  const health = new HealthClient(unixTarget(socketPath), grpc.credentials.createInsecure());
  try {
    const check = (service: string): Promise<{ status: string }> =>
      new Promise((resolve, reject) => {
        (
          health as unknown as { Check: (r: unknown, cb: (e: Error | null, r: { status: string }) => void) => void }
        ).Check({ service }, (e, r) => (e !== null ? reject(e) : resolve(r)));
      });
    assert.deepEqual(await check(''), { status: 'SERVING' });
    assert.deepEqual(await check('envoy.service.ratelimit.v3.RateLimitService'), { status: 'SERVING' });
    assert.deepEqual(
      await check('ratelimit'),
      { status: 'SERVING' },
      'the name envoyproxy/ratelimit registers and deployments probe',
    );
    assert.equal((await grpcError(check('nope'))).code, grpc.status.NOT_FOUND);
    const watch = (health as unknown as { Watch: (r: unknown) => grpc.ClientReadableStream<{ status: string }> }).Watch(
      { service: '' },
    );
    const first = await new Promise<{ status: string }>((resolve) => watch.once('data', resolve));
    assert.deepEqual(first, { status: 'SERVING' });
    watch.on('error', () => undefined);
    watch.cancel();
  } finally {
    health.close();
  }
});

void test("global tenant quotas: the tier's static slice, started empty, marked degraded; unknown tenants on the default tier", async () => {
  // acme: bronze 100/s burst 100, share 0.5 → 50/s, burst 50. The bucket started empty with the
  // agent; wait until it is full.
  await waitFor('tenant acme to refill to 50', async () => {
    const r = await uds.check({
      domain: 'api',
      descriptors: [{ entries: [{ key: 'tenant', value: 'acme' }], hits_addend: { value: 0 } }],
    });
    return (r.statuses[0]?.limit_remaining ?? 0) >= 50 ? r : undefined;
  });
  const first = await uds.check({ domain: 'api', hits_addend: 45, descriptors: [d(['tenant', 'acme'])] });
  assert.equal(first.overall_code, 'OK');
  assert.deepEqual(first.statuses[0]?.current_limit, { name: 'bronze', requests_per_unit: 50, unit: 'SECOND' });
  assert.equal(header(first, 'x-ratelimit-degraded'), 'true', 'a static slice is a degraded answer');
  const second = await uds.check({ domain: 'api', hits_addend: 45, descriptors: [d(['tenant', 'acme'])] });
  assert.equal(second.overall_code, 'OVER_LIMIT', 'at most 50 in the bucket (refilling at 50/s)');
  // Every level: the nested per-address rule and the tenant quota.
  const nested = await uds.check({
    domain: 'api',
    descriptors: [d(['tenant', 'acme']), d(['tenant', 'acme'], ['remote_address', '1.2.3.4'])],
  });
  assert.equal(codes(nested), 'OK,OK');
  // A slow tier: 0.25/s at this share, so its bucket, empty at start, holds almost nothing yet.
  const slow = await uds.check({ domain: 'api', hits_addend: 10, descriptors: [d(['tenant', 'sloth'])] });
  assert.equal(slow.overall_code, 'OVER_LIMIT', 'global buckets start empty');
  assert.deepEqual(slow.statuses[0]?.current_limit, { name: 'slow', requests_per_unit: 15, unit: 'MINUTE' });
  // An unknown tenant gets bronze (its own bucket).
  const stranger = await uds.check({
    domain: 'api',
    descriptors: [{ entries: [{ key: 'tenant', value: 'stranger' }], hits_addend: { value: 0 } }],
  });
  assert.equal(stranger.statuses[0]?.current_limit?.name, 'bronze');
  const velocity = await waitFor('the velocity of tenant/acme', () =>
    agent.velocity().find((v) => v.key === 'tenant/acme'),
  );
  assert.ok(velocity.allowed >= 46 && velocity.refused >= 45, `velocity ${JSON.stringify(velocity)}`);
  assert.match(
    await agent.metricsText(),
    /cellquota_agent_global_velocity_tokens_per_second\{quota="tenant\/acme",outcome="allowed"\}/,
  );
});

void test('hot reload: a changed rule applies in the workers; a broken file keeps the last good rules', async () => {
  const rulesFile = join(dir.path, 'rules', 'reload.yaml');
  const limitOf = async (): Promise<number | undefined> =>
    (await uds.check({ domain: 'reload', descriptors: [d(['r', 'x'])] })).statuses[0]?.current_limit?.requests_per_unit;
  assert.equal(await limitOf(), 1);
  const before = agent.rulesStatus().main;
  writeFileSync(rulesFile, RELOAD_V2);
  await waitFor('the reloaded limit 100', async () => ((await limitOf()) === 100 ? true : undefined));
  const status = agent.rulesStatus();
  assert.notEqual(status.main, before);
  assert.deepEqual(status.workers, [status.main]);
  writeFileSync(
    rulesFile,
    'domain: reload\ndescriptors:\n  - key: r\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n',
  );
  await waitFor('a failed reload in the metrics', async () =>
    /cellquota_agent_config_reloads_total\{result="failure"\} [1-9]/.test(await agent.metricsText()) ? true : undefined,
  );
  assert.equal(await limitOf(), 100, 'the last good rules stay in force');
  assert.equal(agent.rulesStatus().main, status.main);
  assert.ok(
    log.lines.some(
      (l) =>
        l['msg'] === 'rules reload failed; keeping the last good rules' &&
        /invalid rate limit unit 'fortnight'/.test(String(l['error'])),
    ),
    'the failure is logged',
  );
  writeFileSync(rulesFile, RELOAD_V1);
  await waitFor('the reloaded limit 1', async () => ((await limitOf()) === 1 ? true : undefined));
});

void test('HTTP API: /v1/check 200 and 429 with RateLimit headers and Retry-After; errors as JSON', async () => {
  const base = agent.endpoints.http ?? '';
  const post = (body: unknown, raw?: string): Promise<Response> =>
    fetch(`${base}/v1/check`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: raw ?? JSON.stringify(body),
    });
  const body = { domain: 'basic', descriptors: [{ entries: [{ key: 'remote_address', value: '192.0.2.1' }] }] };
  const ok = await post(body);
  assert.equal(ok.status, 200);
  assert.equal(ok.headers.get('ratelimit-limit'), '2');
  assert.equal(ok.headers.get('ratelimit-remaining'), '1');
  assert.equal(ok.headers.get('ratelimit-reset'), '1800');
  const okJson = (await ok.json()) as {
    overall_code: string;
    statuses: { code: string; current_limit: { unit: string }; duration_until_reset: string }[];
  };
  assert.equal(okJson.overall_code, 'OK');
  assert.equal(okJson.statuses[0]?.current_limit.unit, 'HOUR');
  assert.equal(okJson.statuses[0]?.duration_until_reset, '1800s');
  // The HTTP API and gRPC share the buckets.
  await uds.check({ domain: 'basic', descriptors: [d(['remote_address', '192.0.2.1'])] });
  const limited = await post(body);
  assert.equal(limited.status, 429);
  assert.equal(limited.headers.get('retry-after'), '1800');
  assert.equal(limited.headers.get('ratelimit-remaining'), '0');
  assert.equal(((await limited.json()) as { overall_code: string }).overall_code, 'OVER_LIMIT');
  const tenant = await post({
    domain: 'api',
    descriptors: [{ entries: [{ key: 'tenant', value: 'acme' }], hits_addend: 0 }],
  });
  assert.equal(tenant.headers.get('x-ratelimit-degraded'), 'true');

  const expectError = async (
    res: Response,
    status: number,
    error: string,
  ): Promise<{ message: string; details: unknown }> => {
    assert.equal(res.status, status);
    const j = (await res.json()) as { error: string; message: string; details: unknown };
    assert.equal(j.error, error);
    assert.equal(typeof j.message, 'string');
    assert.ok('details' in j, 'details present');
    return j;
  };
  await expectError(await post(null, '{"domain": '), 400, 'bad_request');
  const invalid = await expectError(
    await post({ domain: 'basic', descriptors: [{ entries: [{ key: 1 }] }] }),
    400,
    'validation_failed',
  );
  assert.ok(Array.isArray(invalid.details) && invalid.details.length > 0, 'zod issues as details');
  assert.equal(
    (await expectError(await post({ domain: '', descriptors: [{ entries: [] }] }), 400, 'bad_request')).message,
    'rate limit domain must not be empty',
  );
  assert.match(
    (
      await expectError(
        await post({ domain: 'basic', descriptors: Array.from({ length: 65 }, () => ({ entries: [] })) }),
        400,
        'invalid_argument',
      )
    ).message,
    /65 descriptors/,
  );
  await expectError(
    await post({ domain: 'basic', descriptors: [{ entries: [{ key: 'k', value: 'v'.repeat(5000) }] }] }),
    413,
    'payload_too_large',
  );
  await expectError(await fetch(`${base}/v1/nothing`), 404, 'not_found');

  const metrics = await fetch(`${base}/metrics`);
  assert.equal(metrics.status, 200);
  const text = await metrics.text();
  for (const name of [
    'cellquota_agent_decisions_total{verdict="ok",scope="local"}',
    'cellquota_agent_decisions_total{verdict="over_limit",scope="local"}',
    'cellquota_agent_decision_duration_seconds_bucket{le="+Inf"}',
    'cellquota_agent_bucket_table_keys',
    'cellquota_agent_bucket_evictions_total',
    'cellquota_agent_bucket_busy_refusals_total 0',
    'cellquota_agent_config_reloads_total{result="success"}',
    'cellquota_agent_static_slice_decisions_total',
    'cellquota_agent_workers_serving 1',
  ]) {
    assert.ok(text.includes(name), `metrics have ${name}`);
  }
  // The slice in force for a global quota: here the static share (no coordinator): bronze 100/s × 0.5.
  const quota = await fetch(`${base}/v1/quotas/tenant/acme`);
  assert.equal(quota.status, 200);
  assert.deepEqual(await quota.json(), { key: 'tenant/acme', source: 'static', rate: 50, burst: 50 });
  assert.equal((await fetch(`${base}/v1/quotas/tenant/nobody`)).status, 404, 'a tenant this cell does not know');
  const badKey = await fetch(`${base}/v1/quotas/user/acme`);
  assert.equal(badKey.status, 400);
  assert.match(((await badKey.json()) as { message: string }).message, /KIND\/NAME with KIND tenant, tier or domain/);
  const health = await fetch(`${base}/healthz`);
  assert.equal(health.status, 200);
  assert.deepEqual(((await health.json()) as { status: string; workers: unknown }).workers, { serving: 1, total: 1 });
});

void test('a second agent on the same socket is refused; a stale socket file is replaced; the socket is removed on stop', async () => {
  const rules = dir.file(
    'one.yaml',
    'domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n',
  );
  await assert.rejects(
    startAgent(
      parseAgentConfig({ cell: 'twin', rules, rlsSocket: socketPath, tableCapacity: 100, lagThresholdMs: 0 }),
      captureLogger().logger,
    ),
    /in use by a running server/,
  );
  assert.equal(
    (await uds.check({ domain: 'basic', descriptors: [d(['free', 'x'])] })).overall_code,
    'OK',
    'the first agent is untouched',
  );
  const regular = dir.file('not-a-socket', 'x');
  await assert.rejects(
    startAgent(
      parseAgentConfig({ cell: 'twin', rules, rlsSocket: regular, tableCapacity: 100, lagThresholdMs: 0 }),
      captureLogger().logger,
    ),
    /is not a socket/,
  );
  // A stale socket (its server gone without removing it) is replaced.
  const stale = join(dir.path, 'stale.sock');
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(join(dir.path, 'tmp.sock'), resolve));
  renameSync(join(dir.path, 'tmp.sock'), stale);
  await new Promise((resolve) => server.close(resolve));
  assert.equal(statSync(stale).isSocket(), true, 'a stale socket file');
  const twin = await startAgent(
    parseAgentConfig({ cell: 'twin', rules, rlsSocket: stale, tableCapacity: 100, lagThresholdMs: 0 }),
    captureLogger().logger,
  );
  const client = new RlsClient(unixTarget(stale));
  try {
    assert.equal((await client.check({ domain: 'x', descriptors: [d(['k', 'v'])] })).overall_code, 'OK');
  } finally {
    client.close();
    await twin.stop();
  }
  assert.throws(() => statSync(stale), /ENOENT/, 'removed on stop');
});
