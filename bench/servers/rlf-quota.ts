// One global quota counted in ONE redis-server by every process that answers RLS checks: what a
// user would pick instead of cells with leased slices — the accuracy benchmark's "central Redis
// counter" variant (bench/accuracy.ts, testkit/accuracy-scenario.ts mode 'central-redis': one of
// these per cell, each a process of its own, all on the same redis-server).
//
// rate-limiter-flexible's RateLimiterRedis (ioredis, default client settings) with points =
// quota, duration = 1 s, key = the descriptor value (tenant). rate-limiter-flexible has no token
// bucket or GCRA store: RateLimiterRedis is a FIXED window — its Lua script does
// `SET key 0 EX duration NX; INCRBY key 1`, so the window opens at the first request after the
// key expired and every request inside it counts against `points`. Any 1 s window that straddles
// two of its windows may therefore admit up to 2 × points (points at the end of one, points at the
// start of the next); under steady overload it admits the first `points` of each window at once
// and refuses the rest of it. (BurstyRateLimiter only adds a second fixed window on top.)
//
// Answers: overall_code OK or OVER_LIMIT with the limit, the remaining points and the time to the
// window's reset; a request without the descriptor (or another domain) is answered OK with no
// limit; a Redis error is a gRPC UNAVAILABLE (Envoy with failure_mode_deny false would let it pass).
import * as grpc from '@grpc/grpc-js';
import { Redis } from 'ioredis';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import type { RunningServer, ServerOptions } from '../../testkit/processes/server-module.js';
import {
  startRlsServer,
  stopRlsServer,
  type DescriptorStatusMsg,
  type RateLimitResponseMsg,
  type ShouldRateLimit,
} from './rls-grpc.js';

const NO_LIMIT: RateLimitResponseMsg = { overallCode: 'OK', statuses: [{ code: 'OK' }] };

export async function start(target: string, options: ServerOptions): Promise<RunningServer> {
  const quota = options.quota;
  if (quota === undefined) throw new Error('rlf-quota: no quota in the options');
  if (options.redisSocket === undefined) throw new Error('rlf-quota: no redisSocket');
  const redis = new Redis({ path: options.redisSocket, lazyConnect: true, maxRetriesPerRequest: 1 });
  redis.on('error', () => undefined); // surfaces as failed consume() calls
  await redis.connect();
  // The same keyPrefix in every process: one counter per tenant, shared by all of them.
  const limiter = new RateLimiterRedis({
    storeClient: redis,
    keyPrefix: `quota:${quota.domain}:${quota.key}`,
    points: quota.points,
    duration: quota.durationSec,
  });
  const status = (code: 'OK' | 'OVER_LIMIT', res: RateLimiterRes): DescriptorStatusMsg => {
    const ms = Math.max(0, Math.round(res.msBeforeNext));
    return {
      code,
      currentLimit: { requestsPerUnit: quota.points / quota.durationSec, unit: 'SECOND' },
      limitRemaining: res.remainingPoints,
      durationUntilReset: { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1_000_000 },
    };
  };
  const handler: ShouldRateLimit = (call, callback) => {
    const req = call.request;
    let value: string | null = null;
    if (req.domain === quota.domain)
      for (const d of req.descriptors) for (const e of d.entries) if (e.key === quota.key) value ??= e.value;
    if (value === null) {
      callback(null, NO_LIMIT);
      return;
    }
    limiter.consume(value, Math.max(1, req.hitsAddend)).then(
      (res) => callback(null, { overallCode: 'OK', statuses: [status('OK', res)] }),
      (rej: unknown) => {
        if (rej instanceof RateLimiterRes)
          callback(null, { overallCode: 'OVER_LIMIT', statuses: [status('OVER_LIMIT', rej)] });
        else callback({ code: grpc.status.UNAVAILABLE, details: rej instanceof Error ? rej.message : String(rej) });
      },
    );
  };
  const server = await startRlsServer(target, handler);
  return {
    description: `rate-limiter-flexible RateLimiterRedis (fixed window: ${quota.points} points per ${quota.durationSec} s per ${quota.domain}/${quota.key} value) on a shared redis-server over a Unix socket`,
    stop: async () => {
      await stopRlsServer(server);
      redis.disconnect();
    },
  };
}
