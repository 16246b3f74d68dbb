// cellquota/fastify in a real fastify app listening on loopback: the seed's layout (two limiter
// instances on prefixes, global and per-IP levels), the client address behind trusted proxies, IPv6
// and IPv4-mapped peers, the draft-10 headers, and the options users of @fastify/rate-limit expect.
import http from 'node:http';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Fastify from 'fastify';
import type { FastifyInstance } from 'fastify';
import { Registry } from 'prom-client';
import cellquota from '../../embedded/fastify.js';
import type { CellquotaFastifyOptions } from '../../embedded/fastify.js';
import { createLimiter } from '../../embedded/limiter.js';
import {
  ADMIN_RULES,
  REGISTRY_RULES,
  assertRefused,
  bothLevels,
  get,
  parseRateLimitHeaders,
  seedScenario,
  statuses,
} from './embedded-harness.js';

const PER_IP = {
  domain: 'edge',
  descriptors: [{ key: 'remote_address', rate_limit: { unit: 'minute', requests_per_unit: 3 } }],
};

async function listen(app: FastifyInstance, host = '127.0.0.1'): Promise<string> {
  await app.listen({ host, port: 0 });
  const addr = app.server.address();
  assert.ok(addr !== null && typeof addr === 'object');
  return `http://${host.includes(':') ? `[${host === '::' ? '::1' : host}]` : host}:${addr.port}`;
}

/** One app, one limiter on the whole app. */
async function single(
  opts: Partial<CellquotaFastifyOptions>,
  host = '127.0.0.1',
): Promise<{ app: FastifyInstance; url: string }> {
  const app = Fastify();
  await app.register(cellquota, { rules: PER_IP, ...opts } as CellquotaFastifyOptions);
  app.get('/', (request, reply) => {
    void reply.send({ ok: true, policies: request.cellquota?.policies.length ?? null });
  });
  app.get('/health', { config: { cellquota: false } }, (_request, reply) => {
    void reply.send('up');
  });
  return { app, url: await listen(app, host) };
}

void test('the seed layout: /v2 and /auth share one limiter, /admin has its own; both levels must pass', async () => {
  const app = Fastify();
  const registry = await createLimiter({ rules: REGISTRY_RULES, name: 'registry' });
  const trusted = { trustedProxies: ['127.0.0.1', '::1'] };
  for (const prefix of ['/v2', '/auth']) {
    await app.register(
      async (scope) => {
        await scope.register(cellquota, { limiter: registry, descriptors: bothLevels('registry'), ...trusted });
        scope.get('/*', (_request, reply) => {
          void reply.send('ok');
        });
      },
      { prefix },
    );
  }
  await app.register(
    async (scope) => {
      await scope.register(cellquota, {
        rules: ADMIN_RULES,
        name: 'admin',
        descriptors: bothLevels('admin'),
        ...trusted,
      });
      scope.get('/*', (_request, reply) => {
        void reply.send('ok');
      });
    },
    { prefix: '/admin' },
  );
  app.get('/', (_request, reply) => {
    void reply.send('not limited');
  });
  const url = await listen(app);
  try {
    await seedScenario(url);
    assert.deepEqual(
      await statuses(30, `${url}/`, '203.0.113.10'),
      new Array<number>(30).fill(200),
      'routes outside the contexts are not limited',
    );
  } finally {
    await app.close();
    await registry.close();
  }
});

void test('X-Forwarded-For from an untrusted peer is ignored: every spoofed address counts against the peer', async () => {
  const { app, url } = await single({});
  try {
    const got = [];
    for (let i = 0; i < 5; i++) got.push((await get(url, `198.51.100.${i}`)).status);
    assert.deepEqual(got, [200, 200, 200, 429, 429]);
  } finally {
    await app.close();
  }
});

void test('a chain of trusted proxies: the rightmost untrusted entry is the client', async () => {
  const { app, url } = await single({ trustedProxies: ['127.0.0.1', '10.0.0.0/8'] });
  try {
    assert.deepEqual(await statuses(4, url, '198.51.100.7, 10.1.2.3, 10.9.9.9'), [200, 200, 200, 429]);
    assert.equal((await get(url, '6.6.6.6, 198.51.100.7, 10.1.2.3')).status, 429, 'prepending does not help');
    assert.equal((await get(url, '198.51.100.8, 10.1.2.3')).status, 200, 'another client behind the same proxies');
    // Every hop trusted: the request came from inside; the leftmost is the client.
    assert.deepEqual(await statuses(4, url, '10.5.5.5, 10.1.2.3'), [200, 200, 200, 429]);
  } finally {
    await app.close();
  }
});

void test('one keep-alive connection: from a trusted proxy each request is its own client; from anyone else the peer', async () => {
  const { app, url } = await single({ trustedProxies: ['127.0.0.1'] });
  const { app: open, url: openUrl } = await single({});
  let connections = 0;
  for (const a of [app, open]) a.server.on('connection', () => connections++);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  const status = (u: string, xff: string): Promise<number> =>
    new Promise((resolve, reject) => {
      http
        .get(u, { agent, headers: { 'x-forwarded-for': xff } }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        })
        .on('error', reject);
    });
  try {
    const proxied = [];
    for (const client of ['198.51.100.1', '198.51.100.2', '198.51.100.1', '198.51.100.2', '198.51.100.1'])
      proxied.push(await status(url, client));
    proxied.push(await status(url, '198.51.100.1'), await status(url, '198.51.100.2'));
    assert.deepEqual(proxied, [200, 200, 200, 200, 200, 429, 200], 'two clients behind one proxy connection');
    const spoofed = [];
    for (let i = 0; i < 4; i++) spoofed.push(await status(openUrl, `203.0.113.${i}`));
    assert.deepEqual(spoofed, [200, 200, 200, 429], 'an untrusted peer rotating X-Forwarded-For is one client');
    assert.equal(connections, 2, 'one connection to each app');
  } finally {
    agent.destroy();
    await Promise.all([app.close(), open.close()]);
  }
});

void test('IPv6 peers are grouped by /64; IPv4-mapped peers are IPv4 (a trusted 127.0.0.1 matches ::ffff:127.0.0.1)', async () => {
  // Listening on :: makes IPv4 clients arrive as ::ffff:127.0.0.1.
  const { app, url } = await single({ trustedProxies: ['127.0.0.1'] }, '::');
  const port = new URL(url).port;
  const v4 = `http://127.0.0.1:${port}/`;
  try {
    assert.deepEqual(
      await statuses(4, v4, '2001:db8:1:2::1'),
      [200, 200, 200, 429],
      'the mapped peer is the trusted 127.0.0.1, so X-Forwarded-For is read',
    );
    assert.equal((await get(v4, '2001:db8:1:2:ffff:ffff:ffff:ffff')).status, 429, 'the same /64');
    assert.equal((await get(v4, '2001:db8:1:3::1')).status, 200, 'another /64');
    assert.equal((await get(v4, '::ffff:192.0.2.9')).status, 200);
    assert.deepEqual(await statuses(3, v4, '192.0.2.9'), [200, 200, 429], 'a mapped client address is the IPv4 one');
    // ::1 is not trusted here: its own /64 is the key, whatever it forwards.
    assert.deepEqual(
      [
        (await get(url, '203.0.113.1')).status,
        (await get(url, '203.0.113.2')).status,
        (await get(url, '203.0.113.3')).status,
        (await get(url, '203.0.113.4')).status,
      ],
      [200, 200, 200, 429],
    );
  } finally {
    await app.close();
  }
});

void test('headers: draft-10 fields on admitted and refused answers, the legacy trio as an option, none at all, and a route that opts out', async () => {
  const { app, url } = await single({});
  const legacy = await single({ headers: 'legacy' });
  const both = await single({ headers: 'both', headersOnAllowed: false });
  try {
    const first = await get(url);
    assert.equal(first.status, 200);
    const h = parseRateLimitHeaders(first.headers);
    assert.deepEqual(h.policies, [{ name: 'remote_address', q: 3, w: 60 }]);
    assert.equal(h.states[0]?.r, 2);
    assert.equal(first.headers.get('ratelimit-limit'), null);
    await get(url);
    await get(url);
    assertRefused(await get(url), 'remote_address');
    assert.equal(
      (await get(`${url}/health`)).headers.get('ratelimit'),
      null,
      'config: { cellquota: false } skips the route',
    );

    const l = await get(legacy.url);
    assert.deepEqual(
      [l.headers.get('ratelimit-limit'), l.headers.get('ratelimit-remaining'), l.headers.get('ratelimit-reset')],
      ['3', '2', '20'],
    );
    assert.equal(l.headers.get('ratelimit-policy'), null);

    const b = await get(both.url);
    assert.equal(b.headers.get('ratelimit'), null, 'headersOnAllowed: false');
    await get(both.url);
    await get(both.url);
    const refused = await get(both.url);
    assertRefused(refused, 'remote_address');
    assert.equal(refused.headers.get('ratelimit-remaining'), '0');
  } finally {
    await Promise.all([app.close(), legacy.app.close(), both.app.close()]);
  }
});

void test('refusals: custom body and status, the onRefused hook, shadow mode, allow-list, request.cellquota', async () => {
  const refusedSeen: string[] = [];
  const custom = await single({
    trustedProxies: ['127.0.0.1'],
    allowList: ['192.0.2.0/24', '2001:db8:ffff::/48'],
    body: { errors: [{ code: 'TOOMANYREQUESTS', message: 'rate limit exceeded' }] },
    onRefused: (request, reply, decision) => {
      refusedSeen.push(`${request.url} ${decision?.retryAfterSeconds ?? '?'}`);
      void reply.header('docker-distribution-api-version', 'registry/2.0');
    },
  });
  const registry = new Registry();
  const shadow = await single({ shadow: true, registry });
  try {
    await statuses(3, custom.url, '203.0.113.1');
    const r = await get(custom.url, '203.0.113.1');
    assert.equal(r.status, 429);
    assert.deepEqual(JSON.parse(r.body), { errors: [{ code: 'TOOMANYREQUESTS', message: 'rate limit exceeded' }] });
    assert.equal(r.headers.get('docker-distribution-api-version'), 'registry/2.0');
    assert.deepEqual(refusedSeen, [`/ ${r.headers.get('retry-after')}`]);
    const listed = await statuses(10, custom.url, '192.0.2.50');
    assert.deepEqual(listed, new Array<number>(10).fill(200), 'allow-listed IPv4');
    assert.deepEqual(
      await statuses(10, custom.url, '2001:db8:ffff:1::5'),
      new Array<number>(10).fill(200),
      'allow-listed IPv6 (checked on the address, not its /64)',
    );
    assert.equal(
      (JSON.parse((await get(custom.url, '192.0.2.50')).body) as { policies: unknown }).policies,
      null,
      'request.cellquota is null when not checked',
    );

    assert.deepEqual(await statuses(6, shadow.url), [200, 200, 200, 200, 200, 200], 'shadow mode never refuses');
    const text = await registry.metrics();
    assert.match(text, /cellquota_embedded_shadow_refusals_total\{limiter="edge"\} 3/);
    assert.match(text, /cellquota_embedded_decisions_total\{limiter="edge",verdict="over_limit",scope="local"\} 3/);
    assert.match(text, /cellquota_embedded_decisions_total\{limiter="edge",verdict="ok",scope="local"\} 3/);
  } finally {
    await Promise.all([custom.app.close(), shadow.app.close()]);
  }
});

void test('an internal error fails open: marked, counted, logged at most once a second', async () => {
  const lines: string[] = [];
  const logger = { warn: () => undefined, info: () => undefined, error: (_o: object, msg: string) => lines.push(msg) };
  const registry = new Registry();
  const { app, url } = await single({
    registry,
    logger,
    descriptors: (request) => {
      if (request.headers['x-boom'] !== undefined) throw new Error('boom');
      return [[{ key: 'remote_address', value: 'x' }]];
    },
  });
  try {
    const started = Date.now();
    for (let i = 0; i < 5; i++) {
      const r = await get(url, undefined, { 'x-boom': '1' });
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('x-ratelimit-fail-open'), 'true');
    }
    assert.ok(
      lines.length >= 1 && lines.length <= 1 + Math.floor((Date.now() - started) / 1000),
      `at most one log line a second: ${lines.length}`,
    );
    assert.match(await registry.metrics(), /cellquota_embedded_fail_open_total\{limiter="edge",reason="error"\} 5/);
    assert.equal((await get(url)).headers.get('x-ratelimit-fail-open'), null);
  } finally {
    await app.close();
  }
});

void test('bad options are refused at registration with every bad option named', async () => {
  const app = Fastify();
  await assert.rejects(async () => {
    await app.register(cellquota, { rules: PER_IP, trustedProxies: ['10.0.0.0/33'] });
    await app.ready();
  }, /prefix length must be 0\.\.32/);
  const app2 = Fastify();
  await assert.rejects(
    async () => {
      await app2.register(cellquota, { rules: PER_IP, headers: 'draft-99' as 'none', ipv6Prefix: 200 });
      await app2.ready();
    },
    (e: Error) => /headers/.test(e.message) && /ipv6Prefix/.test(e.message),
  );
  await app.close().catch(() => undefined);
  await app2.close().catch(() => undefined);
});
