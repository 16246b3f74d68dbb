// `npm run bench -- embedded`: hello-world apps side by side in one run, each in a process of its own
// and driven by autocannon over loopback — fastify with no limiter, @fastify/rate-limit in memory and
// on Redis, cellquota local and coordinated; express with no limiter, express-rate-limit in memory and
// on Redis (rate-limit-redis), cellquota local and coordinated. Then the Redis variants again with
// redis-server paused (SIGSTOP) and the coordinated ones with every coordinator paused; and the
// in-process decision (createLimiter().check) timed in a loop. Targets (docs/targets.md): cellquota
// local ≥ 0.95 × the in-memory library, coordinated ≥ 1.3 × the Redis one, decision ≤ 1 µs median.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import autocannon from 'autocannon';
import { createLimiter } from '../../embedded/limiter.js';
import { CoordinatorCluster } from '../../testkit/coordinator-cluster.js';
import { machineLine, type BenchReport } from '../bench-report.js';
import { RedisServer, findRedisServer } from '../../testkit/processes/redis-server.js';
import type { AppSettings, Variant } from './embedded-app.js';

const APP = resolve(import.meta.dirname, 'embedded-app.ts');
const VARIANTS: readonly Variant[] = ['none', 'lib-memory', 'lib-redis', 'cellquota-local', 'cellquota-coordinated'];

interface Run {
  reqPerS: number;
  p50: number;
  p99: number;
  non2xx: number;
  errors: number;
}

async function startApp(settings: AppSettings): Promise<{ proc: ChildProcess; url: string }> {
  const proc = spawn(process.execPath, ['--import', 'tsx', APP, JSON.stringify(settings)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  return new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`app did not start: ${out.slice(-1000)}`)), 60_000);
    const on = (b: Buffer): void => {
      out += b.toString();
      const m = /listening (\S+)/.exec(out);
      if (m !== null) {
        clearTimeout(timer);
        ok({ proc, url: m[1] as string });
      }
    };
    proc.stdout?.on('data', on);
    proc.stderr?.on('data', on);
    proc.once('exit', (code) => fail(new Error(`app exited (${code}): ${out.slice(-1000)}`)));
  });
}

async function load(url: string, seconds: number): Promise<Run> {
  const r = await autocannon({ url, connections: 10, duration: seconds, timeout: 2 });
  return {
    reqPerS: Math.round(r.requests.average),
    p50: r.latency.p50,
    p99: r.latency.p99,
    non2xx: r.non2xx,
    errors: r.errors + r.timeouts,
  };
}

/** Median ns per check over batches of 10,000 (one or two levels), on the process's CPU time (a busy
 * machine preempts the loop; wall time would count the other processes' turns). */
async function decisionNs(levels: 1 | 2, iterations: number): Promise<number> {
  const l = await createLimiter({
    rules: {
      domain: 'd',
      descriptors: [
        { key: 'limiter', value: 'all', rate_limit: { unit: 'second', requests_per_unit: 4_000_000_000 } },
        { key: 'remote_address', rate_limit: { unit: 'second', requests_per_unit: 4_000_000_000 } },
      ],
    },
  });
  const ips = Array.from({ length: 256 }, (_, i) => `198.51.100.${i}`);
  const descs = ips.map((ip) =>
    levels === 1
      ? [[{ key: 'remote_address', value: ip }]]
      : [[{ key: 'limiter', value: 'all' }], [{ key: 'remote_address', value: ip }]],
  );
  const batches: number[] = [];
  const batch = 10_000;
  for (let b = 0; b < iterations / batch; b++) {
    const c0 = process.cpuUsage();
    for (let i = 0; i < batch; i++) l.check({ descriptors: descs[i & 255] as never });
    const c1 = process.cpuUsage(c0);
    batches.push(((c1.user + c1.system) * 1000) / batch);
  }
  await l.close();
  batches.sort((a, b) => a - b);
  return batches[Math.floor(batches.length / 2)] ?? NaN;
}

export async function runEmbeddedBench(opts: {
  smoke: boolean;
  progress: (msg: string) => void;
}): Promise<BenchReport> {
  const seconds = opts.smoke ? 1 : 5;
  const scratch = mkdtempSync(join(tmpdir(), 'cq-embedded-bench-'));
  const redisBin = findRedisServer();
  const redis = redisBin === null ? null : await RedisServer.start(redisBin, scratch);
  const cluster = await CoordinatorCluster.create(['n1', 'n2', 'n3']);
  const rows: Record<string, number | string>[] = [];
  const notes: string[] = [machineLine()];
  const apps: ChildProcess[] = [];
  try {
    cluster.startAll();
    await cluster.waitForLeader(60_000);
    await cluster.write('PUT', '/v1/tiers/big', { rate: 1_000_000, burst: 1_000_000, floorFraction: 0.5 });
    await cluster.write('PUT', '/v1/tenants/acme', { tier: 'big' });
    const coordinators = [...cluster.replicas.values()].map((r) => `127.0.0.1:${r.peerPort}`).join(',');
    const byKey = new Map<string, Run>();
    for (const framework of ['fastify', 'express'] as const) {
      for (const variant of VARIANTS) {
        if (variant === 'lib-redis' && redis === null) continue;
        const settings: AppSettings = {
          framework,
          variant,
          ...(redis === null ? {} : { redisSocket: redis.socket }),
          coordinators,
          cell: `bench-${framework}`,
        };
        const app = await startApp(settings);
        apps.push(app.proc);
        // warm-up (JIT, connections, the first lease; a global bucket is created empty, so the very
        // first check of a new quota key on a replica is refused by design: cell-agent/README.md)
        await load(app.url, opts.smoke ? 0.2 : 1);
        opts.progress(`${framework} ${variant}: ${seconds} s`);
        const run = await load(app.url, seconds);
        byKey.set(`${framework} ${variant}`, run);
        rows.push({
          framework,
          variant,
          condition: 'normal',
          'req/s': run.reqPerS,
          'p50 ms': run.p50,
          'p99 ms': run.p99,
          non2xx: run.non2xx,
          errors: run.errors,
        });
        if (variant === 'lib-redis' && redis?.pid !== undefined) {
          process.kill(redis.pid, 'SIGSTOP');
          const paused = await load(app.url, seconds).finally(() => process.kill(redis.pid as number, 'SIGCONT'));
          rows.push({
            framework,
            variant,
            condition: 'Redis paused',
            'req/s': paused.reqPerS,
            'p50 ms': paused.p50,
            'p99 ms': paused.p99,
            non2xx: paused.non2xx,
            errors: paused.errors,
          });
        }
        if (variant === 'cellquota-coordinated') {
          const pids = [...cluster.replicas.values()]
            .map((r) => r.proc?.pid)
            .filter((p): p is number => p !== undefined);
          for (const p of pids) process.kill(p, 'SIGSTOP');
          const paused = await load(app.url, seconds).finally(() => {
            for (const p of pids) process.kill(p, 'SIGCONT');
          });
          rows.push({
            framework,
            variant,
            condition: 'coordinators paused',
            'req/s': paused.reqPerS,
            'p50 ms': paused.p50,
            'p99 ms': paused.p99,
            non2xx: paused.non2xx,
            errors: paused.errors,
          });
        }
        app.proc.kill('SIGTERM');
      }
      const none = byKey.get(`${framework} none`);
      const mem = byKey.get(`${framework} lib-memory`);
      const red = byKey.get(`${framework} lib-redis`);
      const loc = byKey.get(`${framework} cellquota-local`);
      const coo = byKey.get(`${framework} cellquota-coordinated`);
      const lib = framework === 'fastify' ? '@fastify/rate-limit' : 'express-rate-limit';
      if (loc !== undefined && mem !== undefined)
        notes.push(
          `${framework}: cellquota local / ${lib} in memory = ${(loc.reqPerS / mem.reqPerS).toFixed(3)} (target ≥ 0.95)${none === undefined ? '' : `; no limiter ${none.reqPerS} req/s, cellquota local ${(loc.reqPerS / none.reqPerS).toFixed(3)} of it`}`,
        );
      if (coo !== undefined && red !== undefined)
        notes.push(
          `${framework}: cellquota coordinated / ${lib} on Redis = ${(coo.reqPerS / red.reqPerS).toFixed(3)} (target ≥ 1.3)`,
        );
      if (red === undefined) notes.push(`${framework}: redis-server not installed: the Redis rows are missing`);
    }
    const one = await decisionNs(1, opts.smoke ? 100_000 : 1_000_000);
    const two = await decisionNs(2, opts.smoke ? 100_000 : 1_000_000);
    rows.push({
      framework: 'in-process',
      variant: 'check(), 1 level',
      condition: 'normal',
      'ns/check median': Math.round(one),
    });
    rows.push({
      framework: 'in-process',
      variant: 'check(), 2 levels (global + per-IP)',
      condition: 'normal',
      'ns/check median': Math.round(two),
    });
    notes.push(
      `in-process decision: ${Math.round(one)} ns median with one level, ${Math.round(two)} ns with two (target ≤ 1,000 ns)`,
    );
    notes.push(
      'Redis paused: the libraries wait on each request until the client gives up (skipOnError / passOnStoreError then let it through); cellquota never waits on the coordinators (the paused rows): it keeps its grants until the lease runs out, then its floors.',
    );
  } finally {
    for (const p of apps) if (p.exitCode === null) p.kill('SIGKILL');
    await redis?.stop();
    await cluster.cleanup();
    rmSync(scratch, { recursive: true, force: true });
  }
  return {
    name: 'embedded',
    title: 'Embedded limiter: hello-world throughput and latency, side by side (autocannon, 10 connections, loopback)',
    rows,
    notes,
  };
}
