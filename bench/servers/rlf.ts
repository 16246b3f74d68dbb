// rate-limiter-flexible behind the same grpc-js handler as the ceiling: RateLimiterMemory, or
// RateLimiterRedis (ioredis, default client settings) on the redis-server the benchmark started.
// The rules are bench-rules.ts's: a fixed window of 1e9 points per second per tenant, and in the
// limited domain 1 point per hour for tenants ending in an odd digit. The answer carries, like the
// agent's, the limit, the remaining points and the time to reset.
import * as grpc from '@grpc/grpc-js';
import { Redis } from 'ioredis';
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes, type RateLimiterAbstract } from 'rate-limiter-flexible';
import {
  DOMAIN_LIMITED,
  DOMAIN_UNLIMITED,
  LIMITED_PER_HOUR,
  TENANT_KEY,
  UNLIMITED_PER_SECOND,
  isLimitedTenant,
} from './bench-rules.js';
import type { RunningServer, ServerOptions } from '../../testkit/processes/server-module.js';
import {
  startRlsServer,
  stopRlsServer,
  type DescriptorStatusMsg,
  type RateLimitRequestMsg,
  type RateLimitResponseMsg,
  type ShouldRateLimit,
} from './rls-grpc.js';

const NO_LIMIT: RateLimitResponseMsg = { overallCode: 'OK', statuses: [{ code: 'OK' }] };

function tenantOf(req: RateLimitRequestMsg): string | null {
  for (const d of req.descriptors) for (const e of d.entries) if (e.key === TENANT_KEY) return e.value;
  return null;
}

function status(code: 'OK' | 'OVER_LIMIT', res: RateLimiterRes, limited: boolean): DescriptorStatusMsg {
  const ms = Math.max(0, res.msBeforeNext);
  return {
    code,
    currentLimit: limited
      ? { requestsPerUnit: LIMITED_PER_HOUR, unit: 'HOUR' }
      : { requestsPerUnit: UNLIMITED_PER_SECOND, unit: 'SECOND' },
    limitRemaining: res.remainingPoints,
    durationUntilReset: { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1_000_000 },
  };
}

export async function start(target: string, options: ServerOptions): Promise<RunningServer> {
  const store = options.store ?? 'memory';
  let redis: Redis | null = null;
  const make = (keyPrefix: string, points: number, duration: number): RateLimiterAbstract => {
    if (redis === null) return new RateLimiterMemory({ keyPrefix, points, duration });
    return new RateLimiterRedis({ storeClient: redis, keyPrefix, points, duration });
  };
  if (store === 'redis') {
    if (options.redisSocket === undefined) throw new Error('rlf redis: no redisSocket');
    const client = new Redis({ path: options.redisSocket, lazyConnect: true, maxRetriesPerRequest: 1 });
    client.on('error', () => undefined); // surfaces as failed consume() calls
    await client.connect();
    redis = client;
  }
  const limiters = {
    [DOMAIN_UNLIMITED]: make(`${DOMAIN_UNLIMITED}`, UNLIMITED_PER_SECOND, 1),
    [DOMAIN_LIMITED]: make(`${DOMAIN_LIMITED}`, UNLIMITED_PER_SECOND, 1),
    limited: make(`${DOMAIN_LIMITED}-1h`, LIMITED_PER_HOUR, 3600),
  };

  const handler: ShouldRateLimit = (call, callback) => {
    const req = call.request;
    const value = tenantOf(req);
    const domainLimiter =
      req.domain === DOMAIN_UNLIMITED
        ? limiters[DOMAIN_UNLIMITED]
        : req.domain === DOMAIN_LIMITED
          ? limiters[DOMAIN_LIMITED]
          : null;
    if (value === null || domainLimiter === null) {
      callback(null, NO_LIMIT);
      return;
    }
    const limited = isLimitedTenant(req.domain, value);
    (limited ? limiters.limited : domainLimiter).consume(value).then(
      (res) => callback(null, { overallCode: 'OK', statuses: [status('OK', res, limited)] }),
      (rej: unknown) => {
        if (rej instanceof RateLimiterRes)
          callback(null, { overallCode: 'OVER_LIMIT', statuses: [status('OVER_LIMIT', rej, limited)] });
        else callback({ code: grpc.status.UNAVAILABLE, details: rej instanceof Error ? rej.message : String(rej) });
      },
    );
  };
  const server = await startRlsServer(target, handler);
  return {
    description:
      store === 'redis'
        ? 'rate-limiter-flexible RateLimiterRedis (ioredis, default options) on a local redis-server over a Unix socket'
        : 'rate-limiter-flexible RateLimiterMemory',
    stop: async () => {
      await stopRlsServer(server);
      if (redis !== null) redis.disconnect();
    },
  };
}
