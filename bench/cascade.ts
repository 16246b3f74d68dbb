// The central-store cascade (issue 6, item 2): what a rate limiter's callers see while the thing
// behind it is slowed, paused or stopped — a Redis-backed limiter whose Redis misbehaves, against
// cellquota whose coordinators do. Both get the same paced Envoy RLS checks over a Unix socket, and
// the same steps, one after the other:
//
//   step         redis-backed limiter (rlf-redis)                 cellquota (1 agent, 3 coordinators)
//   baseline     no fault                                         no fault
//   delay 1 ms   every Redis reply 1 ms late (fault proxy)        every coordinator reply to the agent 1 ms late
//   delay 100 ms the same, 100 ms                                 the same, 100 ms
//   delay 4 s    the same, 4 s                                    the same, 4 s
//   paused       CLIENT PAUSE <step> ALL on a direct connection   SIGSTOP of all three coordinators (SIGCONT after)
//   stopped      SIGKILL of redis-server (restarted after)        SIGKILL of all three coordinators (restarted after)
//
// Redis side: redis-server (Unix socket) ← FaultProxy (Unix socket) ← bench/servers/rlf.ts
// (RateLimiterRedis over ioredis, in a process of its own) ← the load. The fault proxy delays the
// server→client direction (delayDownMs), so every command's reply, i.e. every call, is late by the
// step's delay; order is kept, so a burst of commands is not serialized behind one another.
// (DEBUG SLEEP is off by default in Redis 7, hence the proxy; CLIENT PAUSE is the "Redis itself
// stops answering" case.)
//
// cellquota side: three coordinator processes (testkit/coordinator-cluster.ts) and one
// agent process (cell-agent/agent-cli.ts) leasing a global per-tenant quota; the agent's
// --coordinators are `n1=127.0.0.1:P1,...` with each Pi a FaultProxy in front of coordinator i's
// gRPC (peer) port, so every lease call — and the call that follows a leader hint, the agent mapping
// the leader's id to its own address for it — goes through a proxy. The coordinators talk to one
// another directly: the fault is "the coordinator is slow / gone, as this cell sees it".
//
// The load (a process of its own: this file, forked with CELLQUOTA_CASCADE_LOADER=1) is Envoy-like:
// paced at a fixed rate (open loop: request i is due at t0 + i/rate whatever happened to the others,
// its latency taken from that scheduled time — no coordinated omission), over two HTTP/2
// connections written and read at the frame level (shared/h2-raw.ts). Envoy gives up on a
// rate-limit call after 20 ms (its default RLS timeout) and then, by default (failure_mode_deny:
// false), lets the request through. The load does not cancel: it waits for the real answer (up to a
// drain after the step) so the figures show how late the limiter really is, and classifies each
// request as Envoy would have seen it — decided in time (OK / OVER_LIMIT within 20 ms), error, or
// over the deadline (a late answer, or none at all). "admitted %" is what Envoy lets through:
// everything but the in-time OVER_LIMIT answers.
//
//   npm run bench -- cascade [--smoke]
//   npx tsx bench/cascade.ts [--smoke] [--systems redis,cellquota]
import { fork, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { FaultProxy } from '../chaos/fault-proxy.js';
import { CoordinatorCluster } from '../testkit/coordinator-cluster.js';
import { agentMetric, type RunningAgent } from '../testkit/accuracy-scenario.js';
import type { BenchReport } from './bench-report.js';
import {
  RawH2Session,
  grpcRequestHeaderBlock,
  requestTemplate,
  type RequestTemplate,
  type StreamSink,
} from '../shared/h2-raw.js';
import {
  CODE_OK,
  CODE_OVER_LIMIT,
  DEGRADED_FLAG,
  RLS_PATH,
  decodeResponse,
  tenantFrames,
} from '../testkit/load/rls-wire.js';
import { DOMAIN_LIMITED } from './servers/bench-rules.js';
import { RedisServer, findRedisServer } from '../testkit/processes/redis-server.js';
import { ServerProcess } from '../testkit/processes/server-process.js';
import { armEmergencyStop } from './emergency-stop.js';
import { freePort } from '../testkit/ports.js';
import { sleep, waitFor } from '../testkit/wait.js';

// ------------------------------------------------------------------------------------------------
// Settings

/** Envoy's default timeout for a rate-limit service call. */
export const DEADLINE_MS = 20;
/** Offered load, req/s, the same for both systems. */
export const RATE = 500;
/** Tenants the load cycles through (round-robin: each gets RATE / TENANTS req/s). */
export const TENANTS = 10;
/** cellquota: each tenant's global quota (req/s) and burst; the floor is FLOOR_FRACTION of it (one cell). */
export const QUOTA = 25;
export const BURST = 25;
export const FLOOR_FRACTION = 0.5;
/** cellquota's domain (the agent's rules); rlf uses bench-rules.ts's limited domain. */
const CQ_DOMAIN = 'api';
const COORDINATOR_IDS = ['n1', 'n2', 'n3'] as const;
const LOADER_ENV = 'CELLQUOTA_CASCADE_LOADER';

export const SYSTEMS = ['redis', 'cellquota'] as const;
export type SystemName = (typeof SYSTEMS)[number];

export const STEP_NAMES = ['baseline', 'delay 1 ms', 'delay 100 ms', 'delay 4 s', 'paused', 'stopped'] as const;
export type StepName = (typeof STEP_NAMES)[number];

interface StepDef {
  readonly name: StepName;
  readonly kind: 'none' | 'delay' | 'paused' | 'stopped';
  readonly delayMs: number;
}

const STEPS: readonly StepDef[] = [
  { name: 'baseline', kind: 'none', delayMs: 0 },
  { name: 'delay 1 ms', kind: 'delay', delayMs: 1 },
  { name: 'delay 100 ms', kind: 'delay', delayMs: 100 },
  { name: 'delay 4 s', kind: 'delay', delayMs: 4000 },
  { name: 'paused', kind: 'paused', delayMs: 0 },
  { name: 'stopped', kind: 'stopped', delayMs: 0 },
];

interface Timing {
  readonly warmupMs: number;
  readonly measureMs: number;
  /** After the window: how long to wait for outstanding answers, beyond the step's delay. */
  readonly drainMs: number;
  /** Waiting for the system to be back to normal after a step (re-leased, backlog flushed). */
  readonly recoverTimeoutMs: number;
  /** Unmeasured load before the first step. */
  readonly primeMs: number;
  /** Unmeasured load after a step has recovered (cellquota: the coordinator sees the demand again and
   * grows the grant back from the floor before the next step); 0: none. */
  readonly reprimeMs: number;
}

const FULL: Timing = {
  warmupMs: 2000,
  measureMs: 5000,
  drainMs: 1500,
  recoverTimeoutMs: 30_000,
  primeMs: 3000,
  reprimeMs: 2000,
};
const SMOKE: Timing = {
  warmupMs: 300,
  measureMs: 1000,
  drainMs: 300,
  recoverTimeoutMs: 3000,
  primeMs: 1000,
  reprimeMs: 0,
};

// ------------------------------------------------------------------------------------------------
// The load process: protocol and measurement

export interface StepJob {
  /** Unix socket path of the RLS server. */
  readonly target: string;
  readonly domain: string;
  readonly tenants: number;
  readonly rate: number;
  readonly warmupMs: number;
  readonly measureMs: number;
  /** After the last send: wait this long for outstanding answers, then count them unanswered. */
  readonly drainMs: number;
  readonly deadlineMs: number;
  readonly sessions: number;
}

export interface LatencyMs {
  readonly p50: number;
  readonly p99: number;
  readonly p999: number;
  readonly max: number;
}

/** One step's figures, over the requests scheduled in the measurement window (sent = the sum of the exclusive outcomes). */
export interface StepMeasure {
  readonly sent: number;
  /** Answers with a decision (OK / OVER_LIMIT / other code) within the deadline. */
  readonly allowedInTime: number;
  readonly refusedInTime: number;
  /** Requests that ended in an error (gRPC status ≠ 0, reset, closed connection), whenever. */
  readonly errors: number;
  /** Answers with a decision that came after the deadline. */
  readonly late: number;
  /** Requests still unanswered when the drain ended. */
  readonly unanswered: number;
  /** Of all answers with a decision (in time or late). */
  readonly allowed: number;
  readonly refused: number;
  readonly degraded: number;
  /** Answers with a decision, latency from the scheduled send time; null when there were none. */
  readonly latency: LatencyMs | null;
  /** Allowed answers per tenant (index = tenant number). */
  readonly allowedByTenant: readonly number[];
  readonly windowMs: number;
  /** The generator's own lateness, p99 ms. */
  readonly sendLagP99: number;
  readonly errorSamples: readonly string[];
}

type ToLoader =
  | { readonly type: 'run'; readonly id: number; readonly job: StepJob }
  | {
      readonly type: 'probe';
      readonly id: number;
      readonly target: string;
      readonly domain: string;
      readonly timeoutMs: number;
    }
  | { readonly type: 'exit' };
type FromLoader =
  | { readonly type: 'ready' }
  | { readonly type: 'window-end'; readonly id: number }
  | { readonly type: 'result'; readonly id: number; readonly measure: StepMeasure }
  | { readonly type: 'probed'; readonly id: number; readonly ms: number | null }
  | { readonly type: 'failed'; readonly id: number; readonly message: string };

const round3 = (x: number): number => Math.round(x * 1000) / 1000;

function percentile(sorted: Float64Array, q: number): number {
  const n = sorted.length;
  return sorted[Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1))] ?? 0;
}

/** One step of paced load against one target. Every request is finished exactly once. */
class StepRun implements StreamSink {
  private readonly interval: number;
  private readonly total: number;
  private readonly state: Uint8Array; // 0 not sent, 1 in flight, 2 finished
  private readonly latencies: Float64Array;
  private readonly lags: Float64Array;
  private latencyCount = 0;
  private lagCount = 0;
  private inFlight = 0;
  private t0 = 0;
  private firstIn = 0;
  private endIn = 0;
  private closed = false;
  private idle: (() => void) | null = null;
  private readonly templates: RequestTemplate[];
  private readonly sessions: RawH2Session[] = [];
  private readonly counts = {
    allowedInTime: 0,
    refusedInTime: 0,
    errors: 0,
    late: 0,
    allowed: 0,
    refused: 0,
    degraded: 0,
  };
  private readonly byTenant: number[];
  private readonly errorSamples: string[] = [];

  constructor(private readonly job: StepJob) {
    this.interval = 1000 / job.rate;
    this.total = Math.ceil((job.warmupMs + job.measureMs) / this.interval);
    this.state = new Uint8Array(this.total);
    this.latencies = new Float64Array(this.total);
    this.lags = new Float64Array(this.total);
    this.byTenant = new Array<number>(job.tenants).fill(0);
    const header = grpcRequestHeaderBlock(RLS_PATH, 'localhost');
    this.templates = tenantFrames(job.domain, job.tenants).map((f) => requestTemplate(header, f));
  }

  private inWindow(i: number): boolean {
    return i >= this.firstIn && i < this.endIn;
  }

  streamDone(token: unknown, body: Buffer | null, error: string | null): void {
    const i = token as number;
    if (this.closed || this.state[i] !== 1) return;
    this.state[i] = 2;
    this.inFlight--;
    if (this.inWindow(i)) this.count(i, body, error, performance.now() - (this.t0 + i * this.interval));
    if (this.inFlight === 0) this.idle?.();
  }

  private count(i: number, body: Buffer | null, error: string | null, latency: number): void {
    const c = this.counts;
    const decoded = error === null && body !== null ? decodeResponse(body) : -1;
    if (decoded < 0) {
      c.errors++;
      const msg =
        error ??
        (body === null ? 'no response message' : `undecodable response (${body.subarray(0, 160).toString('hex')})`);
      if (this.errorSamples.length < 5 && !this.errorSamples.includes(msg)) this.errorSamples.push(msg);
      return;
    }
    const code = decoded & 0xffff;
    const inTime = latency <= this.job.deadlineMs;
    if ((decoded & DEGRADED_FLAG) !== 0) c.degraded++;
    this.latencies[this.latencyCount++] = latency;
    if (code === CODE_OVER_LIMIT) {
      c.refused++;
      if (inTime) c.refusedInTime++;
    } else {
      // OK, or UNKNOWN (0), which Envoy treats as OK.
      c.allowed++;
      this.byTenant[i % this.job.tenants] = (this.byTenant[i % this.job.tenants] ?? 0) + 1;
      if (inTime) c.allowedInTime++;
    }
    if (!inTime) c.late++;
    if (code !== CODE_OK && code !== CODE_OVER_LIMIT && this.errorSamples.length < 5)
      this.errorSamples.push(`overall_code ${code}`);
  }

  async run(onWindowEnd: () => void): Promise<StepMeasure> {
    const job = this.job;
    for (let k = 0; k < Math.max(1, job.sessions); k++)
      this.sessions.push(await RawH2Session.connect(job.target, this));
    this.t0 = performance.now() + 1;
    this.firstIn = Math.ceil(job.warmupMs / this.interval);
    this.endIn = this.total;
    let next = 0;
    await new Promise<void>((done) => {
      const tick = (): void => {
        const now = performance.now();
        while (next < this.total && this.t0 + next * this.interval <= now) {
          const i = next++;
          if (this.inWindow(i)) this.lags[this.lagCount++] = now - (this.t0 + i * this.interval);
          this.state[i] = 1;
          this.inFlight++;
          const session = this.sessions[i % this.sessions.length];
          const template = this.templates[i % job.tenants];
          if (session === undefined || template === undefined) throw new Error('unreachable');
          session.request(template, i);
        }
        if (next >= this.total) {
          done();
          return;
        }
        const wait = this.t0 + next * this.interval - performance.now();
        if (wait > 1.5) setTimeout(tick, wait - 1);
        else setImmediate(tick);
      };
      tick();
    });
    onWindowEnd();
    if (this.inFlight > 0) {
      await new Promise<void>((done) => {
        const timer = setTimeout(done, job.drainMs);
        this.idle = () => {
          clearTimeout(timer);
          done();
        };
      });
    }
    this.closed = true;
    let unanswered = 0;
    for (let i = this.firstIn; i < this.endIn; i++) if (this.state[i] === 1) unanswered++;
    if (unanswered > 0 && this.errorSamples.length < 5)
      this.errorSamples.push(`${unanswered} unanswered after the ${job.drainMs} ms drain`);
    for (const s of this.sessions) s.destroy('step over');
    const lat = this.latencies.slice(0, this.latencyCount).sort();
    const lags = this.lags.slice(0, this.lagCount).sort();
    return {
      sent: this.endIn - this.firstIn,
      ...this.counts,
      unanswered,
      latency:
        lat.length === 0
          ? null
          : {
              p50: round3(percentile(lat, 0.5)),
              p99: round3(percentile(lat, 0.99)),
              p999: round3(percentile(lat, 0.999)),
              max: round3(percentile(lat, 1)),
            },
      allowedByTenant: this.byTenant,
      windowMs: (this.endIn - this.firstIn) * this.interval,
      sendLagP99: lags.length === 0 ? 0 : round3(percentile(lags, 0.99)),
      errorSamples: this.errorSamples,
    };
  }
}

/** ms until `target` first answers a check with a decision (one request every 50 ms, each given 1 s), or null after `timeoutMs`. */
async function probe(target: string, domain: string, timeoutMs: number): Promise<number | null> {
  const t0 = performance.now();
  const template = requestTemplate(
    grpcRequestHeaderBlock(RLS_PATH, 'localhost'),
    tenantFrames(domain, 1)[0] ?? Buffer.alloc(0),
  );
  while (performance.now() - t0 < timeoutMs) {
    const answered = await new Promise<boolean>((done) => {
      let session: RawH2Session | null = null;
      const timer = setTimeout(() => finish(false), 1000);
      const finish = (ok: boolean): void => {
        clearTimeout(timer);
        session?.destroy('probe over');
        done(ok);
      };
      const sink: StreamSink = {
        streamDone: (_t, body, error) => finish(error === null && body !== null && decodeResponse(body) >= 0),
      };
      RawH2Session.connect(target, sink).then(
        (s) => {
          session = s;
          s.request(template, 0);
        },
        () => finish(false),
      );
    });
    if (answered) return Math.round(performance.now() - t0);
    await new Promise((r) => setTimeout(r, 50));
  }
  return null;
}

function loaderMain(): void {
  const send = (msg: FromLoader): void => {
    if (process.send !== undefined && process.connected) process.send(msg);
  };
  process.on('disconnect', () => process.exit(0));
  let queue = Promise.resolve();
  process.on('message', (msg: ToLoader) => {
    if (msg.type === 'exit') process.exit(0);
    queue = queue.then(async () => {
      try {
        if (msg.type === 'run') {
          const measure = await new StepRun(msg.job).run(() => send({ type: 'window-end', id: msg.id }));
          send({ type: 'result', id: msg.id, measure });
        } else {
          send({ type: 'probed', id: msg.id, ms: await probe(msg.target, msg.domain, msg.timeoutMs) });
        }
      } catch (err) {
        send({ type: 'failed', id: msg.id, message: err instanceof Error ? err.message : String(err) });
      }
    });
  });
  send({ type: 'ready' });
}

/** The parent's handle on the load process. */
class Loader {
  private nextId = 1;
  private readonly waiting = new Map<number, { onMessage: (msg: FromLoader) => void; reject: (err: Error) => void }>();
  private exited = false;

  private constructor(private readonly child: ChildProcess) {
    child.on('message', (msg: FromLoader) => {
      if (msg.type !== 'ready') this.waiting.get(msg.id)?.onMessage(msg);
    });
    child.on('exit', (code, signal) => {
      this.exited = true;
      for (const w of this.waiting.values()) w.reject(new Error(`cascade load process exited (${signal ?? code})`));
      this.waiting.clear();
    });
  }

  static start(): Promise<Loader> {
    const child = fork(fileURLToPath(import.meta.url), [], {
      cwd: fileURLToPath(new URL('..', import.meta.url)),
      execArgv: ['--import', 'tsx', '--max-semi-space-size=32'],
      env: { ...process.env, [LOADER_ENV]: '1' },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const loader = new Loader(child);
    return new Promise((ok, fail) => {
      const onExit = (code: number | null): void =>
        fail(new Error(`cascade load process exited before it was ready (${code})`));
      child.once('exit', onExit);
      child.once('error', fail);
      child.on('message', function onReady(msg: FromLoader) {
        if (msg.type !== 'ready') return;
        child.off('message', onReady);
        child.off('exit', onExit);
        child.off('error', fail);
        ok(loader);
      });
    });
  }

  private request<T>(
    make: (id: number) => ToLoader,
    handle: (msg: FromLoader, ok: (v: T) => void, fail: (e: Error) => void) => void,
  ): Promise<T> {
    if (this.exited) return Promise.reject(new Error('cascade load process has exited'));
    const id = this.nextId++;
    return new Promise<T>((ok, fail) => {
      const done = (): void => void this.waiting.delete(id);
      this.waiting.set(id, {
        onMessage: (msg) => {
          if (msg.type === 'failed') {
            done();
            fail(new Error(`cascade load: ${msg.message}`));
          } else {
            handle(
              msg,
              (v) => {
                done();
                ok(v);
              },
              fail,
            );
          }
        },
        reject: fail,
      });
      this.child.send(make(id));
    });
  }

  /** Runs a step; `onWindowEnd` is called when the last request has been sent (the fault may be lifted then). */
  run(job: StepJob, onWindowEnd: () => void): Promise<StepMeasure> {
    return this.request<StepMeasure>(
      (id) => ({ type: 'run', id, job }),
      (msg, ok) => {
        if (msg.type === 'window-end') onWindowEnd();
        else if (msg.type === 'result') ok(msg.measure);
      },
    );
  }

  probe(target: string, domain: string, timeoutMs: number): Promise<number | null> {
    return this.request<number | null>(
      (id) => ({ type: 'probe', id, target, domain, timeoutMs }),
      (msg, ok) => {
        if (msg.type === 'probed') ok(msg.ms);
      },
    );
  }

  async stop(): Promise<void> {
    if (this.exited || this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise<void>((ok) => this.child.once('exit', () => ok()));
    try {
      if (this.child.connected) this.child.send({ type: 'exit' } satisfies ToLoader);
    } catch {
      // channel closed
    }
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 2000);
    await exited;
    clearTimeout(timer);
  }

  killNow(): void {
    if (!this.exited && this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
  }
}

// ------------------------------------------------------------------------------------------------
// The systems under test

export interface StepResult {
  readonly system: SystemName;
  readonly step: StepName;
  readonly fault: string;
  /** null: the step did not run (system skipped, or it failed: see `note`). */
  readonly measure: StepMeasure | null;
  /** cellquota: the agent's cellquota_agent_lease_state sampled during the step (0 none, 1 leased, 2 expired). */
  readonly leaseStates: readonly number[];
  /** What happened after the fault was lifted (re-leased after …, answering again after …). */
  readonly note: string;
}

interface SystemUnderTest {
  readonly name: SystemName;
  /** The RLS Unix socket the load is sent to, and the domain of its requests. */
  readonly target: string;
  readonly domain: string;
  readonly description: string;
  faultText(step: StepDef, timing: Timing): string;
  /** Applies the step's fault (called just before the load starts). */
  apply(step: StepDef, timing: Timing): Promise<void>;
  /** Lifts it (called when the window ends, while the answers still drain). */
  lift(step: StepDef): Promise<void>;
  /** After the drain: waits until the system is back to normal; returns a note. */
  recover(step: StepDef, timing: Timing): Promise<string>;
  /** Samples the agent's lease state (cellquota), null elsewhere. */
  leaseState(): Promise<number | null>;
  stop(): Promise<void>;
  killNow(): void;
}

/** Until every proxy has delivered what it held (a lifted delay's backlog), at most `timeoutMs`. */
async function flushed(proxies: readonly FaultProxy[], timeoutMs: number): Promise<boolean> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (proxies.every((p) => p.stats().heldUp === 0 && p.stats().heldDown === 0)) return true;
    if (Date.now() > until) return false;
    await sleep(50);
  }
}

/** One inline command on a direct connection to redis; resolves with the first reply line. */
function redisCommand(socket: string, command: string, timeoutMs = 2000): Promise<string> {
  return new Promise((ok, fail) => {
    const conn = net.connect(socket);
    let buf = '';
    conn.setTimeout(timeoutMs, () => {
      conn.destroy();
      fail(new Error(`redis '${command}': no answer within ${timeoutMs} ms`));
    });
    conn.on('error', fail);
    conn.on('connect', () => conn.write(`${command}\r\n`));
    conn.on('data', (d) => {
      buf += d.toString('latin1');
      const at = buf.indexOf('\r\n');
      if (at >= 0) {
        conn.destroy();
        ok(buf.slice(0, at));
      }
    });
  });
}

const RLF_MODULE = fileURLToPath(new URL('./servers/rlf.ts', import.meta.url));

async function startRedisSide(
  bin: string,
  dir: string,
  log: (line: string) => void,
  progress: (msg: string) => void,
): Promise<SystemUnderTest> {
  progress(`redis: starting redis-server (${bin}) on a Unix socket, a fault proxy in front of it, and rlf-redis`);
  const redisDir = join(dir, 'redis');
  mkdirSync(redisDir, { recursive: true });
  let redis: RedisServer | null = await RedisServer.start(bin, redisDir);
  let proxy: FaultProxy | null = null;
  let rlf: ServerProcess | null = null;
  const stop = async (): Promise<void> => {
    await rlf?.stop();
    await proxy?.stop();
    await redis?.stop();
  };
  try {
    proxy = await FaultProxy.start({
      target: { path: redis.socket },
      listen: { path: join(dir, 'redis-proxy.sock') },
      name: 'redis',
    });
    const target = join(dir, 'rlf.sock');
    rlf = await ServerProcess.start(
      'rlf-redis',
      RLF_MODULE,
      target,
      { scratchDir: dir, store: 'redis', redisSocket: proxy.address },
      log,
    );
    const version = redis.version;
    const p = proxy;
    const r = rlf;
    const sut: SystemUnderTest = {
      name: 'redis',
      target,
      domain: DOMAIN_LIMITED,
      description: `rate-limiter-flexible RateLimiterRedis behind grpc-js (bench/servers/rlf.ts, its own process) on redis-server ${version} through a fault proxy (Unix sockets)`,
      faultText: (step, timing) =>
        step.kind === 'none'
          ? 'none'
          : step.kind === 'delay'
            ? `every Redis reply +${step.delayMs} ms (proxy)`
            : step.kind === 'paused'
              ? `CLIENT PAUSE ${timing.warmupMs + timing.measureMs} ALL`
              : 'SIGKILL redis-server, restarted after',
      apply: async (step, timing) => {
        if (step.kind === 'delay') p.set({ delayDownMs: step.delayMs });
        else if (step.kind === 'paused' && redis !== null) {
          // One pause for the whole step: CLIENT UNPAUSE cannot end it early (in Redis 7.0 a
          // CLIENT PAUSE ... ALL blocks every command, CLIENT UNPAUSE included, even on the
          // connection that paused).
          const reply = await redisCommand(redis.socket, `CLIENT PAUSE ${timing.warmupMs + timing.measureMs} ALL`);
          if (reply !== '+OK') throw new Error(`CLIENT PAUSE: ${reply}`);
        } else if (step.kind === 'stopped') await redis?.kill();
      },
      lift: async (step) => {
        p.heal();
        if (step.kind === 'stopped') redis = await RedisServer.start(bin, redisDir);
      },
      recover: async (step, timing) => {
        const t0 = Date.now();
        const ok = await flushed([p], timing.recoverTimeoutMs);
        const probed = await loaderProbe(target, DOMAIN_LIMITED, timing.recoverTimeoutMs);
        if (step.kind === 'none') return '';
        const parts = [
          ok ? '' : 'proxy backlog not flushed',
          probed === null
            ? `not answering ${timing.recoverTimeoutMs} ms after`
            : `answering ${((Date.now() - t0) / 1000).toFixed(1)} s after the fault was lifted`,
        ];
        return parts.filter((x) => x !== '').join('; ');
      },
      leaseState: () => Promise.resolve(null),
      stop,
      killNow: () => {
        r.killNow();
        redis?.killNow();
      },
    };
    return sut;
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Set while a benchmark runs: the loader, for the systems' recovery probes. */
let currentLoader: Loader | null = null;
function loaderProbe(target: string, domain: string, timeoutMs: number): Promise<number | null> {
  return currentLoader === null ? Promise.resolve(null) : currentLoader.probe(target, domain, timeoutMs);
}

const AGENT_CLI = resolve(import.meta.dirname, '../cell-agent/agent-cli.ts');

async function startCellquotaSide(
  log: (line: string) => void,
  progress: (msg: string) => void,
): Promise<SystemUnderTest> {
  const floorCells = 1;
  const cluster = await CoordinatorCluster.create([...COORDINATOR_IDS], ['--floor-cells', String(floorCells)]);
  const proxies: FaultProxy[] = [];
  let agent: RunningAgent | null = null;
  const killNow = (): void => {
    if (agent !== null && agent.proc.exitCode === null && agent.proc.signalCode === null) agent.proc.kill('SIGKILL');
    for (const r of cluster.replicas.values()) {
      if (r.proc === null) continue;
      r.proc.kill('SIGCONT');
      r.proc.kill('SIGKILL');
    }
  };
  const stop = async (): Promise<void> => {
    if (agent !== null && agent.proc.exitCode === null && agent.proc.signalCode === null) {
      const a = agent.proc;
      const exited = new Promise<void>((ok) => a.once('exit', () => ok()));
      a.kill('SIGKILL');
      await exited;
    }
    for (const r of cluster.replicas.values()) r.proc?.kill('SIGCONT');
    await cluster.cleanup();
    await Promise.all(proxies.map((p) => p.stop()));
  };
  try {
    const root = cluster.root;
    progress('cellquota: starting 3 coordinators');
    cluster.startAll();
    await cluster.waitForLeader(60_000);
    const tier = await cluster.write('PUT', '/v1/tiers/gold', {
      rate: QUOTA,
      burst: BURST,
      floorFraction: FLOOR_FRACTION,
    });
    if (tier.status !== 200) throw new Error(`PUT tier: ${tier.status} ${JSON.stringify(tier.body)}`);
    const tenants = Array.from({ length: TENANTS }, (_, i) => `tenant-${i}`);
    for (const t of tenants) {
      const res = await cluster.write('PUT', `/v1/tenants/${t}`, { tier: 'gold' });
      if (res.status !== 200) throw new Error(`PUT tenant ${t}: ${res.status} ${JSON.stringify(res.body)}`);
    }
    for (const r of cluster.replicas.values())
      proxies.push(
        await FaultProxy.start({ target: { host: '127.0.0.1', port: r.peerPort }, name: `coordinator ${r.id}` }),
      );
    const coordinators = [...cluster.replicas.values()].map((r, i) => `${r.id}=${proxies[i]?.address ?? ''}`).join(',');
    writeFileSync(join(root, 'rules.yaml'), `domain: ${CQ_DOMAIN}\ndescriptors:\n  - key: tenant\n    global: true\n`);
    const port = await freePort();
    const socket = join(root, 'agent.sock');
    // No tenants file: the tier and tenants come from the admin API above.
    const args = [
      '--import',
      'tsx',
      AGENT_CLI,
      '--cell',
      'cell-a',
      '--rules',
      join(root, 'rules.yaml'),
      '--rls-socket',
      socket,
      '--http',
      `127.0.0.1:${port}`,
      '--workers',
      '1',
      '--lag-threshold-ms',
      '0',
      '--coordinators',
      coordinators,
    ];
    progress(`cellquota: starting the agent, --coordinators ${coordinators} (fault proxies)`);
    const proc = spawn(process.execPath, args, {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, CELLQUOTA_LOG_LEVEL: 'warn' },
    });
    const a: RunningAgent = { cell: 'cell-a', socket, httpUrl: `http://127.0.0.1:${port}`, proc, output: '' };
    agent = a;
    const keep = (b: Buffer): void => {
      a.output = (a.output + b.toString()).slice(-20_000);
    };
    proc.stdout.on('data', keep);
    proc.stderr.on('data', keep);
    proc.once('exit', (code, signal) => {
      if (code !== 0 && signal !== 'SIGKILL') log(`[agent] exited (${signal ?? code}): ${a.output.slice(-1000)}`);
    });
    await waitFor('agent serving', async () => existsSync(socket) && (await fetch(`${a.httpUrl}/healthz`)).ok, {
      timeoutMs: 60_000,
      everyMs: 200,
      context: () => a.output,
    });
    await waitFor('agent leased', async () => (await agentMetric(a, 'cellquota_agent_lease_state')) === 1, {
      timeoutMs: 60_000,
      everyMs: 200,
      context: () => a.output,
    });

    const leaseState = async (): Promise<number | null> => {
      try {
        return await agentMetric(a, 'cellquota_agent_lease_state');
      } catch {
        return null;
      }
    };
    const signalAll = (signal: NodeJS.Signals): void => {
      for (const r of cluster.replicas.values()) r.proc?.kill(signal);
    };
    const sut: SystemUnderTest = {
      name: 'cellquota',
      target: socket,
      domain: CQ_DOMAIN,
      description: `cellquota: 1 agent (cell-agent/agent-cli.ts, 1 worker, lag guard off — --lag-threshold-ms 0 — so that on a busy machine its answers stay decisions rather than fail-open ones) leasing from 3 coordinators through one fault proxy each (TCP, --coordinators id=proxy); per-tenant quota ${QUOTA}/s burst ${BURST}, floor ${FLOOR_FRACTION * 100} % (${(QUOTA * FLOOR_FRACTION) / floorCells}/s for the one cell)`,
      faultText: (step) =>
        step.kind === 'none'
          ? 'none'
          : step.kind === 'delay'
            ? `every coordinator reply +${step.delayMs} ms (3 proxies)`
            : step.kind === 'paused'
              ? 'SIGSTOP all 3 coordinators, SIGCONT after'
              : 'SIGKILL all 3 coordinators, restarted after',
      apply: async (step) => {
        if (step.kind === 'delay') for (const p of proxies) p.set({ delayDownMs: step.delayMs });
        else if (step.kind === 'paused') signalAll('SIGSTOP');
        else if (step.kind === 'stopped') await cluster.stopAll();
      },
      lift: (step) => {
        for (const p of proxies) p.heal();
        if (step.kind === 'paused') signalAll('SIGCONT');
        else if (step.kind === 'stopped') cluster.startAll();
        return Promise.resolve();
      },
      recover: async (step, timing) => {
        const t0 = Date.now();
        const flushedOk = await flushed(proxies, timing.recoverTimeoutMs);
        let leased = false;
        while (Date.now() - t0 < timing.recoverTimeoutMs) {
          if ((await leaseState()) === 1) {
            leased = true;
            break;
          }
          await sleep(100);
        }
        if (step.kind === 'none') return leased ? '' : 'not leased after the step';
        const parts = [
          flushedOk ? '' : 'proxy backlog not flushed',
          leased
            ? `re-leased ${((Date.now() - t0) / 1000).toFixed(1)} s after the fault was lifted`
            : `not re-leased ${timing.recoverTimeoutMs / 1000} s after`,
        ];
        return parts.filter((x) => x !== '').join('; ');
      },
      leaseState,
      stop,
      killNow,
    };
    return sut;
  } catch (err) {
    await stop();
    throw err;
  }
}

// ------------------------------------------------------------------------------------------------
// Running the steps, and the report

async function runSteps(
  sut: SystemUnderTest,
  loader: Loader,
  timing: Timing,
  progress: (msg: string) => void,
): Promise<StepResult[]> {
  const out: StepResult[] = [];
  // Unmeasured load first: JIT and connections warm, and cellquota's coordinator has seen the
  // demand and granted the agent its slices before the baseline.
  progress(`${sut.name}: priming (${timing.primeMs} ms of load, not measured)`);
  await loader.run(
    {
      target: sut.target,
      domain: sut.domain,
      tenants: TENANTS,
      rate: RATE,
      warmupMs: 0,
      measureMs: timing.primeMs,
      drainMs: timing.drainMs,
      deadlineMs: DEADLINE_MS,
      sessions: 2,
    },
    () => undefined,
  );
  for (const step of STEPS) {
    const fault = sut.faultText(step, timing);
    progress(`${sut.name} · ${step.name}: ${fault}; ${timing.warmupMs} ms warm-up, ${timing.measureMs} ms measured`);
    const states: number[] = [];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const s = await sut.leaseState();
        if (s !== null) states.push(s);
        await sleep(200);
      }
    })();
    let measure: StepMeasure | null = null;
    let note = '';
    // Lifted exactly once: when the window ends, or after a failure.
    let lifted: Promise<unknown> | null = null;
    const lift = (): Promise<unknown> =>
      (lifted ??= sut.lift(step).then(
        () => null,
        (err: unknown) => err,
      ));
    try {
      await sut.apply(step, timing);
      const job: StepJob = {
        target: sut.target,
        domain: sut.domain,
        tenants: TENANTS,
        rate: RATE,
        warmupMs: timing.warmupMs,
        measureMs: timing.measureMs,
        drainMs: step.delayMs + timing.drainMs,
        deadlineMs: DEADLINE_MS,
        sessions: 2,
      };
      measure = await loader.run(job, () => void lift());
    } catch (err) {
      note = `failed: ${err instanceof Error ? err.message : String(err)}`;
    } finally {
      const liftError = await lift();
      if (liftError !== null)
        note = [
          note,
          `lifting the fault failed: ${liftError instanceof Error ? liftError.message : JSON.stringify(liftError)}`,
        ]
          .filter((x) => x !== '')
          .join('; ');
      sampling = false;
      await sampler;
    }
    const recovered = await sut
      .recover(step, timing)
      .catch((err: unknown) => `recovery check failed: ${err instanceof Error ? err.message : String(err)}`);
    note = [note, recovered].filter((x) => x !== '').join('; ');
    const r: StepResult = { system: sut.name, step: step.name, fault, measure, leaseStates: states, note };
    out.push(r);
    progress(`${sut.name} · ${step.name}: ${summaryLine(r)}${note !== '' ? ` (${note})` : ''}`);
    if (step.kind !== 'none' && timing.reprimeMs > 0 && step !== STEPS[STEPS.length - 1]) {
      await loader.run(
        {
          target: sut.target,
          domain: sut.domain,
          tenants: TENANTS,
          rate: RATE,
          warmupMs: 0,
          measureMs: timing.reprimeMs,
          drainMs: timing.drainMs,
          deadlineMs: DEADLINE_MS,
          sessions: 2,
        },
        () => undefined,
      );
    }
  }
  return out;
}

const pct = (n: number, of: number): number => (of > 0 ? Math.round((n / of) * 10_000) / 100 : 0);

function overDeadline(m: StepMeasure): number {
  return m.late + m.unanswered;
}

function summaryLine(r: StepResult): string {
  const m = r.measure;
  if (m === null) return 'did not run';
  const lat =
    m.latency === null ? 'no answers' : `p50 ${m.latency.p50} ms, p99 ${m.latency.p99} ms, max ${m.latency.max} ms`;
  return `${lat}; errors ${pct(m.errors, m.sent)} %, over ${DEADLINE_MS} ms ${pct(overDeadline(m), m.sent)} %, refused ${pct(m.refusedInTime, m.sent)} %${r.leaseStates.length > 0 ? `, lease: ${leaseText(r.leaseStates)}` : ''}`;
}

const LEASE_NAMES: Record<number, string> = { 0: 'none', 1: 'leased', 2: 'expired' };
function leaseText(states: readonly number[]): string {
  const seq: number[] = [];
  for (const s of states) if (seq[seq.length - 1] !== s) seq.push(s);
  return seq.map((s) => LEASE_NAMES[s] ?? String(s)).join('→');
}

/** The per-tenant bound over a window of `seconds`: r·W + b. */
function tenantBound(seconds: number): number {
  return QUOTA * seconds + BURST;
}

function toRow(r: StepResult): Record<string, number | string> {
  const m = r.measure;
  const base = { system: r.system === 'redis' ? 'rlf-redis' : 'cellquota', step: r.step, fault: r.fault };
  if (m === null) {
    return {
      ...base,
      requests: 0,
      'p50 ms': '—',
      'p99 ms': '—',
      'p99.9 ms': '—',
      'max ms': '—',
      'errors %': '—',
      [`over ${DEADLINE_MS} ms %`]: '—',
      'refused %': '—',
      'admitted %': '—',
      'degraded %': '—',
      'allowed/s per tenant': '—',
      'lease / notes': r.note,
    };
  }
  const seconds = m.windowMs / 1000;
  const perTenant = m.allowedByTenant.reduce((a, b) => a + b, 0) / Math.max(1, m.allowedByTenant.length) / seconds;
  const notes = [r.leaseStates.length > 0 ? `lease: ${leaseText(r.leaseStates)}` : '', r.note]
    .filter((x) => x !== '')
    .join('; ');
  return {
    ...base,
    requests: m.sent,
    'p50 ms': m.latency?.p50 ?? '—',
    'p99 ms': m.latency?.p99 ?? '—',
    'p99.9 ms': m.latency?.p999 ?? '—',
    'max ms': m.latency?.max ?? '—',
    'errors %': pct(m.errors, m.sent),
    [`over ${DEADLINE_MS} ms %`]: pct(overDeadline(m), m.sent),
    'refused %': pct(m.refusedInTime, m.sent),
    'admitted %': Math.round((100 - pct(m.refusedInTime, m.sent)) * 100) / 100,
    'degraded %': pct(m.degraded, m.sent),
    'allowed/s per tenant': Math.round(perTenant * 10) / 10,
    'lease / notes': notes,
  };
}

/** "Same latency": p99 within 1.5 × the baseline's, or within 1 ms of it (sub-millisecond figures are noise-bound on this machine). */
function sameLatency(p99: number, base: number): boolean {
  return p99 <= Math.max(1.5 * base, base + 1);
}

/** One line per fault step against the fault target of docs/targets.md, computed from the figures. */
export function verdicts(results: readonly StepResult[]): string[] {
  const lines: string[] = [];
  for (const system of SYSTEMS) {
    const mine = results.filter((r) => r.system === system);
    const base = mine.find((r) => r.step === 'baseline')?.measure ?? null;
    if (base === null || base.latency === null) {
      if (mine.length > 0) lines.push(`${system}: no baseline measured, no verdict`);
      continue;
    }
    const baseRefused = pct(base.refusedInTime, base.sent);
    let met = 0;
    let steps = 0;
    for (const r of mine) {
      if (r.step === 'baseline') continue;
      steps++;
      const m = r.measure;
      if (m === null) {
        lines.push(`${system} · ${r.step}: did not run (${r.note})`);
        continue;
      }
      const p99 = m.latency?.p99 ?? Number.POSITIVE_INFINITY;
      const same = m.latency !== null && sameLatency(p99, base.latency.p99);
      const failed = m.errors + overDeadline(m);
      const answering = failed === 0;
      const seconds = m.windowMs / 1000;
      const maxTenant = Math.max(0, ...m.allowedByTenant);
      const bound = tenantBound(seconds);
      const parts = [
        `p99 ${m.latency === null ? '—' : `${p99} ms = ${(p99 / Math.max(base.latency.p99, 1e-3)).toFixed(1)} × baseline`} ${same ? '✔' : '✘'}`,
        `${pct(m.errors, m.sent)} % errors + ${pct(overDeadline(m), m.sent)} % over ${DEADLINE_MS} ms ${answering ? '✔' : '✘'}`,
      ];
      let ok = same && answering;
      if (system === 'cellquota') {
        const perTenant =
          m.allowedByTenant.reduce((a, b) => a + b, 0) / Math.max(1, m.allowedByTenant.length) / seconds;
        const onFloors = r.leaseStates.includes(2);
        parts.push(
          `${onFloors ? `lease expired → floors (${perTenant.toFixed(1)}/s per tenant; floor ${QUOTA * FLOOR_FRACTION}, quota ${QUOTA})` : `still leased (${perTenant.toFixed(1)}/s per tenant, quota ${QUOTA})`}`,
        );
        const within = maxTenant <= bound;
        parts.push(
          `busiest tenant ${maxTenant} admitted in ${seconds.toFixed(1)} s ≤ r·W + b = ${bound.toFixed(0)} ${within ? '✔' : '✘'}`,
        );
        ok = ok && within;
      } else {
        const refused = pct(m.refusedInTime, m.sent);
        parts.push(
          `refused ${refused} % (baseline ${baseRefused} %)${failed > 0 ? `: with Envoy's failure_mode_deny false the ${pct(failed, m.sent)} % without a timely decision pass unchecked` : ''}`,
        );
      }
      if (ok) met++;
      // A miss while the generator itself could not keep its schedule may be the machine's doing.
      const noisy =
        !ok && m.sendLagP99 > DEADLINE_MS / 4
          ? ` (the generator itself sent late, p99 ${m.sendLagP99} ms: the machine was busy — rerun on a quiet one)`
          : '';
      lines.push(
        `${system === 'redis' ? 'rlf-redis' : 'cellquota'} · ${r.step}: ${parts.join('; ')} → ${ok ? 'meets' : 'misses'} the fault target${noisy}`,
      );
    }
    lines.push(
      `${system === 'redis' ? 'rlf-redis' : 'cellquota'}: meets the fault target ("keep answering with the same latency, on their floors, no quota exceeded beyond the bound") in ${met} of ${steps} fault steps.`,
    );
  }
  return lines;
}

export interface CascadeBenchOptions {
  readonly smoke: boolean;
  readonly progress: (msg: string) => void;
  readonly systems?: readonly SystemName[];
}

export interface CascadeBenchDetail {
  readonly report: BenchReport;
  readonly results: readonly StepResult[];
  readonly skipped: readonly { readonly system: SystemName; readonly reason: string }[];
}

export async function runCascadeBenchDetailed(opts: CascadeBenchOptions): Promise<CascadeBenchDetail> {
  const { smoke } = opts;
  const started = Date.now();
  const progress = (msg: string): void => opts.progress(`[${((Date.now() - started) / 1000).toFixed(1)} s] ${msg}`);
  const timing = smoke ? SMOKE : FULL;
  const systems = opts.systems ?? SYSTEMS;
  const results: StepResult[] = [];
  const skipped: { system: SystemName; reason: string }[] = [];
  const notes: string[] = [];
  const descriptions: string[] = [];
  const loadBefore = os.loadavg()[0] ?? 0;
  const scratch = mkdtempSync(join(os.tmpdir(), 'cq-cascade-'));
  const log = (line: string): void => progress(line);
  let loader: Loader | null = null;
  let sut: SystemUnderTest | null = null;
  const killAll = (): void => {
    loader?.killNow();
    sut?.killNow();
  };
  const emergency = armEmergencyStop(killAll, scratch, progress);
  const notRun = (system: SystemName, reason: string): void => {
    for (const step of STEPS)
      results.push({ system, step: step.name, fault: '—', measure: null, leaseStates: [], note: reason });
  };
  try {
    loader = await Loader.start();
    currentLoader = loader;
    for (const system of systems) {
      if (system === 'redis') {
        const bin = findRedisServer();
        if (bin === null) {
          const reason =
            'skipped: redis-server is not installed (not on PATH, $REDIS_SERVER unset): `apt-get install redis-server`';
          skipped.push({ system, reason });
          notRun(system, reason);
          continue;
        }
        const dir = join(scratch, 'redis-side');
        mkdirSync(dir, { recursive: true });
        try {
          sut = await startRedisSide(bin, dir, log, progress);
        } catch (err) {
          const reason = `skipped: the Redis side did not start: ${err instanceof Error ? err.message : String(err)}`;
          skipped.push({ system, reason });
          notRun(system, reason);
          continue;
        }
      } else {
        sut = await startCellquotaSide(log, progress);
      }
      try {
        descriptions.push(sut.description);
        results.push(...(await runSteps(sut, loader, timing, progress)));
      } finally {
        progress(`${sut.name}: stopping its processes`);
        await sut.stop();
        sut = null;
      }
    }
  } finally {
    emergency.signalsOff();
    currentLoader = null;
    await sut?.stop().catch(() => undefined);
    await loader?.stop();
    emergency.exitOff();
    rmSync(scratch, { recursive: true, force: true });
  }

  notes.push(
    `Load: ${RATE} req/s paced (open loop) over ${TENANTS} tenants round-robin, 2 HTTP/2 connections on the server's Unix socket, from a process of its own; per step ${timing.warmupMs} ms warm-up (fault already on) then ${timing.measureMs} ms measured; latency from each request's scheduled send time to its answer.`,
    `Deadline: ${DEADLINE_MS} ms (Envoy's default rate-limit call timeout). "over ${DEADLINE_MS} ms %" = answers later than that plus requests unanswered at the end of the drain (the step's delay + ${timing.drainMs} ms after the window); latency percentiles are over the answers that came (late ones included). "errors %" = gRPC errors and reset streams. "refused %" = OVER_LIMIT answers within the deadline; "admitted %" = what Envoy lets through (failure_mode_deny: false, its default: a request without a timely decision passes).`,
    `Faults are applied just before a step's warm-up and lifted when its window ends; the next step starts once the proxies have flushed their backlog and the system answers again (cellquota: the agent holds a lease again)${timing.reprimeMs > 0 ? `, after ${timing.reprimeMs} ms of unmeasured load (the coordinator grows the grant back from the floor once it sees the demand)` : ' (smoke: no re-priming, so a step may start with the grant still at the floor)'}; ${timing.primeMs} ms of unmeasured load precede the baseline. "allowed/s per tenant" = the limiter's own OK decisions per tenant and second (cellquota: quota ${QUOTA}/s, floor ${QUOTA * FLOOR_FRACTION}/s), whatever Envoy made of late ones.`,
    ...descriptions,
    "rate-limiter-flexible (11.x) with its defaults: no insuranceLimiter, no timeout of its own, rejectIfRedisNotReady false; ioredis defaults (no commandTimeout, offline queue on, reconnect with backoff) except maxRetriesPerRequest 1 (bench/servers/rlf.ts). rlf uses bench-rules.ts's limited domain: tenants ending in an odd digit get 1 request per hour, so about half is refused while Redis answers.",
    "Redis 7.0's CLIENT PAUSE ... ALL blocks every command, CLIENT UNPAUSE included (even on the connection that paused), so the pause is issued once for the step's exact length (warm-up + window).",
    `cellquota's agent renews every 500 ms with a per-call deadline of 400 ms and a 3 s lease: a reply later than that is a failed call, and the lease runs out ~3 s into a fault; "degraded %" counts answers given on the static floor (x-ratelimit-degraded). Bound per tenant: r·W + b = ${QUOTA}·W + ${BURST}.`,
  );
  for (const s of skipped) notes.push(`${s.system}: ${s.reason}`);
  notes.push(...verdicts(results));
  const lagged = results.filter((r) => r.measure !== null && r.measure.sendLagP99 > 1);
  if (lagged.length > 0)
    notes.push(
      `The generator itself ran late (send lag p99 > 1 ms) in: ${lagged.map((r) => `${r.system} ${r.step} ${r.measure?.sendLagP99} ms`).join(', ')} — the machine was busy; those latencies carry it.`,
    );
  notes.push(
    `Machine load (1-min load average, ${os.cpus().length} CPUs): ${loadBefore.toFixed(2)} before, ${(os.loadavg()[0] ?? 0).toFixed(2)} after.`,
  );
  for (const r of results)
    if (r.measure !== null && r.measure.errorSamples.length > 0)
      notes.push(`${r.system} · ${r.step}: ${r.measure.errorSamples.join('; ')}`);

  const report: BenchReport = {
    name: 'cascade',
    title: `Central-store cascade: rlf-redis vs cellquota under a slow, paused or stopped store/coordinator${smoke ? ' (smoke)' : ''}`,
    rows: results.map(toRow),
    notes,
  };
  return { report, results, skipped };
}

export async function runCascadeBench(opts: { smoke: boolean; progress: (msg: string) => void }): Promise<BenchReport> {
  return (await runCascadeBenchDetailed(opts)).report;
}

// ------------------------------------------------------------------------------------------------
// Entry points: the load process, or `npx tsx bench/cascade.ts`

if (process.env[LOADER_ENV] === '1' && process.send !== undefined) {
  loaderMain();
} else if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: { smoke: { type: 'boolean', default: false }, systems: { type: 'string', default: SYSTEMS.join(',') } },
  });
  const systems = values.systems.split(',').map((s) => s.trim());
  for (const s of systems) {
    if (!(SYSTEMS as readonly string[]).includes(s)) {
      console.error(`unknown system '${s}'; known: ${SYSTEMS.join(', ')}`);
      process.exit(2);
    }
  }
  const { toMarkdown } = await import('./bench-report.js');
  const { report } = await runCascadeBenchDetailed({
    smoke: values.smoke,
    systems: systems as SystemName[],
    progress: (m) => console.log(`  … ${m}`),
  });
  console.log(toMarkdown([report], `npx tsx bench/cascade.ts ${process.argv.slice(2).join(' ')}`.trim()));
}
