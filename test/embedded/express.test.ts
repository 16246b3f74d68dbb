// cellquota/express in a real express app listening on loopback: the seed's layout on mounted
// paths, the client address behind trusted proxies, IPv6 peers, the draft-10 headers, start-up.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Server } from 'node:http';
import express from 'express';
import { rateLimit } from '../../embedded/express.js';
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

function listen(app: express.Express, host = '127.0.0.1'): Promise<{ server: Server; url: string }> {
  return new Promise((resolve, reject) => {
    const server = app.listen(0, host, () => {
      const addr = server.address();
      if (addr === null || typeof addr !== 'object') return reject(new Error('no address'));
      resolve({ server, url: `http://${host === '::' ? '[::1]' : host}:${addr.port}` });
    });
  });
}

const close = (s: Server): Promise<void> =>
  new Promise((resolve) => {
    s.closeAllConnections();
    s.close(() => resolve());
  });

void test('the seed layout on mounted paths: /v2 and /auth share one middleware, /admin has its own', async () => {
  const app = express();
  const trusted = { trustedProxies: ['127.0.0.1', '::1'] };
  const registry = rateLimit({
    rules: REGISTRY_RULES,
    name: 'registry',
    descriptors: bothLevels('registry'),
    ...trusted,
  });
  const admin = rateLimit({
    limiter: await createLimiter({ rules: ADMIN_RULES, name: 'admin' }),
    descriptors: bothLevels('admin'),
    ...trusted,
  });
  app.use('/v2', registry);
  app.use('/auth', registry);
  app.use('/admin', admin);
  app.get('/{*rest}', (_req, res) => {
    res.send('ok');
  });
  const { server, url } = await listen(app);
  try {
    await seedScenario(url);
    assert.deepEqual(
      await statuses(25, `${url}/`, '203.0.113.10'),
      new Array<number>(25).fill(200),
      'paths without the middleware are not limited',
    );
  } finally {
    await close(server);
    await registry.close();
    await (await admin.ready).close();
  }
});

void test('untrusted peers, trusted chains, IPv6 /64 and mapped IPv4, headers', async () => {
  const app = express();
  app.use(rateLimit({ rules: PER_IP, trustedProxies: ['127.0.0.1', '10.0.0.0/8'] }));
  app.get('/', (_req, res) => {
    res.json({ ok: true });
  });
  const { server, url } = await listen(app, '::');
  const v4 = url.replace('[::1]', '127.0.0.1');
  try {
    assert.deepEqual(await statuses(4, v4, '198.51.100.7, 10.1.2.3'), [200, 200, 200, 429]);
    assertRefused(await get(v4, '1.1.1.1, 198.51.100.7'), 'remote_address');
    assert.deepEqual(await statuses(4, v4, '2001:db8:1:2::1'), [200, 200, 200, 429]);
    assert.equal((await get(v4, '2001:db8:1:2::2')).status, 429, 'the same /64');
    // ::1 is not trusted: its forwarded addresses are ignored.
    const peer = [];
    for (let i = 0; i < 4; i++) peer.push((await get(`${url}/`, `203.0.113.${i}`)).status);
    assert.deepEqual(peer, [200, 200, 200, 429]);
    const h = parseRateLimitHeaders((await get(v4, '192.0.2.200')).headers);
    assert.deepEqual(h.policies, [{ name: 'remote_address', q: 3, w: 60 }]);
    assert.deepEqual(
      h.states.map((s) => s.r),
      [2],
    );
  } finally {
    await close(server);
  }
});

void test('a middleware whose limiter cannot start answers every request with the error, through next(err)', async () => {
  const app = express();
  const mw = rateLimit({ rules: '/nonexistent/rules.yaml' });
  app.use(mw);
  app.get('/', (_req, res) => {
    res.send('ok');
  });
  app.use((err: Error, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
    res.status(500).send(`limiter down: ${err.message.includes('/nonexistent/rules.yaml')}`);
  });
  const { server, url } = await listen(app);
  try {
    await assert.rejects(mw.ready, /nonexistent/);
    const r = await get(url);
    assert.deepEqual([r.status, r.body], [500, 'limiter down: true']);
  } finally {
    await close(server);
  }
});
