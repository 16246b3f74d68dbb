// One hello-world app under load for the embedded benchmark, in a process of its own: fastify or
// express, with no limiter, the usual library (in memory or on Redis), or cellquota (local rules, or a
// global quota leased from coordinators). The limits are far above the offered load: what is
// measured is what the limiter costs an admitted request. Settings: one JSON argument; prints
// `listening <url>`.
import express from 'express';
import Fastify from 'fastify';
import fastifyRateLimit from '@fastify/rate-limit';
import { rateLimit as expressRateLimit } from 'express-rate-limit';
import { RedisStore } from 'rate-limit-redis';
import { Redis } from 'ioredis';
import cellquota from '../../embedded/fastify.js';
import { rateLimit as cellquotaExpress } from '../../embedded/express.js';

export type Variant = 'none' | 'lib-memory' | 'lib-redis' | 'cellquota-local' | 'cellquota-coordinated';
export interface AppSettings {
  readonly framework: 'fastify' | 'express';
  readonly variant: Variant;
  readonly redisSocket?: string;
  readonly coordinators?: string;
  readonly cell?: string;
}

const LIMIT = 10_000_000; // per minute and client: never reached
const s = JSON.parse(process.argv[2] ?? '{}') as AppSettings;
const local = {
  rules: {
    domain: 'bench',
    descriptors: [{ key: 'remote_address', rate_limit: { unit: 'minute', requests_per_unit: LIMIT } }],
  },
};
const coordinated = {
  rules: { domain: 'bench', descriptors: [{ key: 'tenant', global: true }] },
  coordinators: s.coordinators ?? '',
  cell: s.cell ?? 'bench',
  // (tier 'big' and tenant 'acme' are the coordinators', written through their admin API by the benchmark)
  descriptors: () => [[{ key: 'tenant', value: 'acme' }]],
};
const redis =
  s.redisSocket === undefined
    ? null
    : new Redis({ path: s.redisSocket, maxRetriesPerRequest: 1, enableOfflineQueue: false, commandTimeout: 1000 });
// Connected before a store is built: with no offline queue, a command sent while the client is still
// connecting fails at once. rate-limit-redis loads its script in init() (called by rateLimit()); sent
// too early, that load failed, every increment then rethrew it and passOnStoreError let the request
// through with a stack trace on stderr — the baseline never reached Redis (about 120 req/s, limited by
// the logging, not by Redis).
if (redis !== null && redis.status !== 'ready')
  await new Promise<void>((ok, fail) => {
    redis.once('ready', ok);
    redis.once('error', fail);
  });

let url: string;
if (s.framework === 'fastify') {
  const app = Fastify();
  if (s.variant === 'lib-memory') await app.register(fastifyRateLimit, { max: LIMIT, timeWindow: 60_000 });
  if (s.variant === 'lib-redis')
    await app.register(fastifyRateLimit, { max: LIMIT, timeWindow: 60_000, redis: redis as Redis, skipOnError: true });
  if (s.variant === 'cellquota-local') await app.register(cellquota, local);
  if (s.variant === 'cellquota-coordinated') await app.register(cellquota, coordinated);
  app.get('/', (_request, reply) => {
    void reply.send('hello world');
  });
  url = await app.listen({ host: '127.0.0.1', port: 0 });
} else {
  const app = express();
  if (s.variant === 'lib-memory')
    app.use(expressRateLimit({ limit: LIMIT, windowMs: 60_000, standardHeaders: 'draft-8', legacyHeaders: false }));
  if (s.variant === 'lib-redis') {
    const client = redis as Redis;
    app.use(
      expressRateLimit({
        limit: LIMIT,
        windowMs: 60_000,
        standardHeaders: 'draft-8',
        legacyHeaders: false,
        passOnStoreError: true,
        store: new RedisStore({
          sendCommand: (command: string, ...args: string[]) => client.call(command, ...args) as never,
        }),
      }),
    );
  }
  if (s.variant === 'cellquota-local') app.use(cellquotaExpress(local));
  if (s.variant === 'cellquota-coordinated') app.use(cellquotaExpress(coordinated));
  app.get('/', (_req, res) => {
    res.send('hello world');
  });
  url = await new Promise<string>((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => {
      const a = server.address();
      resolve(`http://127.0.0.1:${typeof a === 'object' && a !== null ? a.port : 0}`);
    });
  });
}
console.log(`listening ${url}`);
process.on('SIGTERM', () => process.exit(0));
