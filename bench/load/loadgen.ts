// The load generator: a process of its own (forked by bench/load/loadgen-client.ts), so it never
// shares an event loop with the server it measures. gRPC requests are encoded once per tenant
// before the run (rls-wire.ts); no gRPC library, no protobuf library, no per-request encoding.
// Two HTTP/2 clients (LoadJob.client):
//   raw    shared/h2-raw.ts: a request is a copy of a per-tenant HEADERS+DATA template with its
//          stream id written in, all requests of one event-loop turn in one socket write; answers
//          are read at the frame level. About 5 µs of generator CPU per request here.
//   http2  node:http2: `session.request(headers)` and one `end(frame)` of a ready Buffer; the
//          answer is read only as far as the gRPC status and the overall_code. About 8× the CPU
//          of raw, about what the grpc-js server spends per request.
//
// A target may be several addresses of one server (the agent with one socket per worker): its
// sessions are spread over them, session k to address k mod n, so each worker gets its share of
// the streams, as Envoy spreads its checks over every endpoint of the cluster.
//
// Several targets (servers) in one job take turns, LoadJob.sliceMs at a time, round-robin, each
// with its own connections and counters: on a shared machine a noisy second then lands on all of
// them alike instead of on whichever was being measured.
//
// Two modes (LoadJob.mode):
//   closed  `concurrency` requests always in flight over `sessions` HTTP/2 connections during a
//           target's turn; its throughput is the number of answers during its turns inside the
//           measurement window divided by the time of those turns.
//   paced   open loop: request i is scheduled at t0 + i/rate whatever happens to earlier ones, and
//           its latency is taken from that *scheduled* time to the answer, so a stall of the server
//           (or of the generator) shows up in the figures instead of being hidden by sending later
//           (no coordinated omission). Between sends the generator sleeps with setTimeout while the
//           next send is > 1.5 ms away and spins with setImmediate otherwise; its own lateness
//           (actual − scheduled send time) is reported apart as sendLag. (setTimeout alone was
//           tried: ~1.3 ms more on every latency from timer granularity, and no steadier when
//           the machine is loaded.)
//
// Every request started is accounted for exactly once: sent = ok + errors. Requests still
// unanswered `drainTimeoutMs` after the last send are counted as errors (their sessions destroyed).
import { AsyncResource } from 'node:async_hooks';
import http2 from 'node:http2';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import {
  RLS_PATH,
  CODE_OK,
  CODE_OVER_LIMIT,
  DEGRADED_FLAG,
  FAIL_OPEN_FLAG,
  decodeResponse,
  tenantFrames,
} from '../../testkit/load/rls-wire.js';
import {
  targetAddresses,
  type FromLoadGen,
  type LatencySummary,
  type LoadJob,
  type PhaseResult,
  type ToLoadGen,
} from './loadgen-protocol.js';
import {
  RawH2Session,
  grpcRequestHeaderBlock,
  requestTemplate,
  type RequestTemplate,
  type StreamSink,
} from '../../shared/h2-raw.js';
import { Rng } from '../../testkit/random.js';

const HEADERS: http2.OutgoingHttpHeaders = {
  ':method': 'POST',
  ':path': RLS_PATH,
  'content-type': 'application/grpc',
  te: 'trailers',
};

const MAX_ERROR_SAMPLES = 5;
const CLOSED_SAMPLES = 500_000;

/**
 * Node's ClientHttp2Session.request() wraps every request's start in AsyncResource#bind, which
 * defines a deprecated `asyncResource` accessor pair on each bound function (two util.deprecate
 * wrappers per request: ~6 % of this process's CPU in a profile). Nothing here reads that
 * property, so this process — the generator only, never a server under test — binds without it.
 */
function leanAsyncResourceBind(): void {
  const proto = AsyncResource.prototype as unknown as {
    bind: (fn: (...args: unknown[]) => unknown, thisArg?: unknown) => unknown;
    runInAsyncScope: (fn: (...args: unknown[]) => unknown, thisArg: unknown, ...args: unknown[]) => unknown;
  };
  proto.bind = function bind(this: AsyncResource, fn: (...args: unknown[]) => unknown, thisArg?: unknown): unknown {
    // eslint-disable-next-line @typescript-eslint/no-this-alias
    const resource = this;
    if (thisArg !== undefined) return (...args: unknown[]) => resource.runInAsyncScope(fn, thisArg, ...args);
    return function (this: unknown, ...args: unknown[]) {
      return resource.runInAsyncScope(fn, this, ...args);
    };
  };
}

function send(msg: FromLoadGen): void {
  if (process.send !== undefined && process.connected) process.send(msg);
}

function connect(target: string): Promise<http2.ClientHttp2Session> {
  return new Promise((resolve, reject) => {
    const options: http2.SecureClientSessionOptions = {
      settings: { initialWindowSize: 1 << 20, enablePush: false },
      peerMaxConcurrentStreams: 10_000,
    };
    const session = target.startsWith('/')
      ? http2.connect('http://localhost', { ...options, createConnection: () => net.connect(target) })
      : http2.connect(`http://${target}`, options);
    const onError = (err: Error): void => reject(err);
    session.once('error', onError);
    session.once('connect', () => {
      session.off('error', onError);
      session.on('error', () => undefined); // per-stream errors are counted where they surface
      session.setLocalWindowSize(16 << 20);
      resolve(session);
    });
  });
}

function closeSession(session: http2.ClientHttp2Session): Promise<void> {
  if (session.closed || session.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    session.once('close', () => resolve());
    session.close();
  });
}

function summarize(samples: Float64Array, n: number): LatencySummary | null {
  if (n === 0) return null;
  const s = samples.slice(0, n).sort();
  const at = (q: number): number =>
    Math.round((s[Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1))] ?? 0) * 1000 * 10) / 10;
  return { samples: n, p50Us: at(0.5), p90Us: at(0.9), p99Us: at(0.99), p999Us: at(0.999), maxUs: at(1) };
}

/** A seeded uniform pick over [0, n). */
function tenantPicker(seed: number, n: number): () => number {
  const rng = new Rng(seed);
  return () => rng.int(n);
}

/** One request in flight. The stream's listeners are shared functions (no closures per request) that find it under CALL. */
class Call {
  status = -1;
  body: Buffer | null = null;
  error: string | null = null;
  finished = false;
  /** When it was sent (ms, performance.now()): the closed loop's latency with perTenant. */
  readonly sentAt = performance.now();
  constructor(
    readonly run: Run,
    /** Paced: the scheduled send time (ms, performance.now()); closed: NaN. */
    readonly scheduled: number,
    readonly inWindow: boolean,
    readonly tenant: number,
  ) {}
}

const CALL = Symbol('call');
type CallStream = http2.ClientHttp2Stream & { [CALL]?: Call };

function onResponse(this: CallStream, headers: http2.IncomingHttpHeaders): void {
  const call = this[CALL];
  const gs = headers['grpc-status'];
  if (call !== undefined && gs !== undefined) call.status = Number(gs);
}
function onData(this: CallStream, chunk: Buffer): void {
  const call = this[CALL];
  if (call !== undefined) call.body = call.body === null ? chunk : Buffer.concat([call.body, chunk]);
}
function onTrailers(this: CallStream, trailers: http2.IncomingHttpHeaders): void {
  const call = this[CALL];
  const gs = trailers['grpc-status'];
  if (call !== undefined) call.status = gs === undefined ? -1 : Number(gs);
}
function onError(this: CallStream, err: Error): void {
  const call = this[CALL];
  if (call !== undefined) call.error = err.message;
}
function onClose(this: CallStream): void {
  const call = this[CALL];
  if (call !== undefined) call.run.complete(call);
}

/** The measurement window, in performance.now() ms, shared by the runs of a job once connected. */
interface Window {
  start: number;
  end: number;
}

function overlap(a0: number, a1: number, w: Window): number {
  return Math.max(0, Math.min(a1, w.end) - Math.max(a0, w.start));
}

/** One target of a job: its sessions, counters, and what to do when a request completes. */
class Run implements StreamSink {
  sent = 0;
  ok = 0;
  errors = 0;
  allowed = 0;
  overLimit = 0;
  unknownCode = 0;
  degraded = 0;
  inFlight = 0;
  measuredCompletions = 0;
  /** Closed loop: time this target was active inside the window; paced: its slices inside the window. */
  measuredMs = 0;
  latencyCount = 0;
  readonly latencies: Float64Array;
  lagCount = 0;
  readonly lags: Float64Array;
  sentInWindow = 0;
  /** Closed loop: while true (this target's slice), every completion starts a replacement. */
  active = false;
  private activeSince = 0;
  readonly errorSamples: string[] = [];
  failOpen = 0;
  readonly tenantAllowed: number[];
  readonly tenantFailOpen: number[];
  private nextSession = 0;
  private readonly pick: () => number;
  /** Filled by the caller after connecting: node:http2 sessions, or raw ones. */
  sessions: http2.ClientHttp2Session[] = [];
  rawSessions: RawH2Session[] = [];

  constructor(
    readonly job: LoadJob,
    private readonly frames: readonly Buffer[],
    private readonly templates: readonly RequestTemplate[],
    private readonly window: Window,
    capacity: number,
    /** Called whenever this run has nothing in flight (the job's drain waits on it). */
    private readonly onIdle: () => void,
    private readonly onComplete: () => void,
  ) {
    this.pick = tenantPicker(job.seed, job.tenants);
    // Closed loop with perTenant: latency samples of the window's completions, up to CLOSED_SAMPLES.
    this.latencies = new Float64Array(job.mode === 'closed' && job.perTenant === true ? CLOSED_SAMPLES : capacity);
    this.lags = new Float64Array(capacity);
    this.tenantAllowed = job.perTenant === true ? new Array<number>(job.tenants).fill(0) : [];
    this.tenantFailOpen = job.perTenant === true ? new Array<number>(job.tenants).fill(0) : [];
  }

  noteError(msg: string): void {
    if (this.errorSamples.length < MAX_ERROR_SAMPLES && !this.errorSamples.includes(msg)) this.errorSamples.push(msg);
  }

  /** Closed loop: this target's turn — `concurrency` requests in flight until deactivate(). */
  activate(now: number): void {
    this.active = true;
    this.activeSince = now;
    for (let i = 0; i < this.job.concurrency; i++) this.issue(Number.NaN, false);
  }

  deactivate(now: number): void {
    if (!this.active) return;
    this.active = false;
    this.measuredMs += overlap(this.activeSince, now, this.window);
  }

  /** Paced: one send, due at `scheduled`, actually sent at `now`. */
  send(scheduled: number, now: number): void {
    const inWindow = scheduled >= this.window.start && scheduled < this.window.end;
    if (inWindow) {
      this.sentInWindow++;
      this.lags[this.lagCount++] = now - scheduled;
    }
    this.issue(scheduled, inWindow);
  }

  issue(scheduled: number, inWindow: boolean): void {
    const tenant = this.pick();
    this.sent++;
    this.inFlight++;
    const call = new Call(this, scheduled, inWindow, tenant);
    if (this.job.client === 'raw') {
      const raw = this.rawSessions[this.nextSession++ % this.rawSessions.length];
      const template = this.templates[tenant];
      if (raw === undefined || template === undefined) throw new Error('unreachable');
      raw.request(template, call);
      return;
    }
    const session = this.sessions[this.nextSession++ % this.sessions.length];
    const frame = this.frames[tenant];
    if (session === undefined || frame === undefined) throw new Error('unreachable');
    let stream: CallStream;
    try {
      stream = session.request(HEADERS, { endStream: false });
    } catch (err) {
      call.error = `request failed: ${(err as Error).message}`;
      this.complete(call);
      return;
    }
    stream[CALL] = call;
    stream.on('response', onResponse);
    stream.on('data', onData);
    stream.on('trailers', onTrailers);
    stream.on('error', onError);
    stream.on('close', onClose);
    stream.end(frame);
  }

  /** The raw client's completion (StreamSink). */
  streamDone(token: unknown, body: Buffer | null, error: string | null): void {
    const call = token as Call;
    call.body = body;
    call.error = error;
    call.status = error === null ? 0 : -2;
    this.complete(call);
  }

  /** Runs exactly once per request. */
  complete(call: Call): void {
    if (call.finished) return;
    call.finished = true;
    this.inFlight--;
    const at = performance.now();
    let failed = false;
    if (call.status !== 0 || call.body === null) {
      failed = true;
      this.noteError(
        call.error ??
          (call.status === -1
            ? 'no grpc-status'
            : call.status !== 0
              ? `grpc-status ${call.status}`
              : 'no response message'),
      );
    } else {
      const decoded = decodeResponse(call.body);
      const code = decoded < 0 ? decoded : decoded & 0xffff;
      if (decoded >= 0 && (decoded & DEGRADED_FLAG) !== 0) this.degraded++;
      const failOpen = decoded >= 0 && code === CODE_OK && (decoded & FAIL_OPEN_FLAG) !== 0;
      if (failOpen) this.failOpen++;
      if (this.job.perTenant === true && code === CODE_OK && at >= this.window.start && at < this.window.end) {
        this.tenantAllowed[call.tenant] = (this.tenantAllowed[call.tenant] ?? 0) + 1;
        if (failOpen) this.tenantFailOpen[call.tenant] = (this.tenantFailOpen[call.tenant] ?? 0) + 1;
      }
      if (code === CODE_OK) this.allowed++;
      else if (code === CODE_OVER_LIMIT) this.overLimit++;
      else if (code >= 0) this.unknownCode++;
      else {
        failed = true;
        this.noteError('undecodable response');
      }
    }
    if (failed) this.errors++;
    else this.ok++;
    this.onComplete();
    if (this.job.mode === 'closed') {
      // Counted only during this target's own turn: answers trailing in after it are not its throughput.
      if (this.active && at >= this.window.start && at < this.window.end) {
        this.measuredCompletions++;
        if (this.job.perTenant === true && !failed && this.latencyCount < this.latencies.length)
          this.latencies[this.latencyCount++] = at - call.sentAt;
      }
      if (this.active) this.issue(Number.NaN, false);
    } else {
      if (at >= this.window.start && at < this.window.end) this.measuredCompletions++;
      if (call.inWindow && !failed) this.latencies[this.latencyCount++] = at - call.scheduled;
    }
    if (this.inFlight === 0) this.onIdle();
  }

  result(cpuPct: number): PhaseResult {
    const seconds = this.measuredMs / 1000;
    return {
      sent: this.sent,
      ok: this.ok,
      errors: this.errors,
      allowed: this.allowed,
      overLimit: this.overLimit,
      unknownCode: this.unknownCode,
      degraded: this.degraded,
      measuredCompletions: this.measuredCompletions,
      measuredMs: Math.round(this.measuredMs),
      throughput: seconds > 0 ? Math.round(this.measuredCompletions / seconds) : 0,
      latency:
        this.job.mode === 'paced' || this.job.perTenant === true ? summarize(this.latencies, this.latencyCount) : null,
      sendLag: this.job.mode === 'paced' ? summarize(this.lags, this.lagCount) : null,
      offeredRate: this.job.mode === 'paced' && seconds > 0 ? Math.round(this.sentInWindow / seconds) : 0,
      generatorCpuPct: cpuPct,
      errorSamples: this.errorSamples,
      ...(this.job.perTenant === true
        ? { failOpen: this.failOpen, tenantAllowed: this.tenantAllowed, tenantFailOpen: this.tenantFailOpen }
        : {}),
    };
  }
}

function sleepUntil(t: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, t - performance.now())));
}

/**
 * Runs one job: the same load against each target in turn, `sliceMs` at a time (round-robin over
 * the targets for n × (warm-up + measurement)), so every target sees the same mix of quiet and
 * noisy moments of a shared machine. One target: a plain run. Returns one result per target.
 */
export async function runJob(
  job: LoadJob,
  onProgress: (phase: 'warmup' | 'measure' | 'drain', elapsedMs: number, completed: number, inFlight: number) => void,
): Promise<PhaseResult[]> {
  if (job.mode === 'closed' && !(job.concurrency >= 1)) throw new Error('closed mode needs concurrency ≥ 1');
  if (job.mode === 'paced' && !(job.rate > 0)) throw new Error('paced mode needs rate > 0');
  if (job.targets.length === 0) throw new Error('no target');
  const n = job.targets.length;
  const slice = n === 1 ? Number.POSITIVE_INFINITY : job.sliceMs;
  if (!(slice > 0)) throw new Error('sliceMs must be > 0');
  const frames = tenantFrames(job.domain, job.tenants);
  const headerBlock = grpcRequestHeaderBlock(RLS_PATH, 'localhost');
  const templates = job.client === 'raw' ? frames.map((f) => requestTemplate(headerBlock, f)) : [];

  const interval = job.mode === 'paced' ? 1000 / job.rate : 0;
  const total = job.mode === 'paced' ? Math.ceil((n * (job.warmupMs + job.measureMs)) / interval) : 0;
  const window: Window = { start: 0, end: 0 };
  let completed = 0;
  let drainWaiter: (() => void) | null = null;
  const inFlight = (): number => runs.reduce((k, r) => k + r.inFlight, 0);
  const onIdle = (): void => {
    if (drainWaiter !== null && inFlight() === 0) drainWaiter();
  };
  const runs = job.targets.map(() => new Run(job, frames, templates, window, total, onIdle, () => completed++));
  const destroyAll = (reason: string): void => {
    for (const r of runs) {
      for (const s of r.sessions) s.destroy();
      for (const s of r.rawSessions) s.destroy(reason);
    }
  };
  try {
    for (const [i, run] of runs.entries()) {
      // A target with several addresses (one socket per worker): session k goes to address k mod n.
      const addresses = targetAddresses(job.targets[i] ?? '');
      if (addresses.length === 0) throw new Error(`target ${i} has no address`);
      for (let k = 0; k < Math.max(1, job.sessions, addresses.length); k++) {
        const address = addresses[k % addresses.length] ?? '';
        try {
          if (job.client === 'raw') run.rawSessions.push(await RawH2Session.connect(address, run));
          else run.sessions.push(await connect(address));
        } catch (err) {
          throw new Error(`connect ${address}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
        }
      }
    }
  } catch (err) {
    destroyAll('connect failed');
    throw err;
  }

  const cpuStart = process.cpuUsage();
  const t0 = performance.now() + 1;
  window.start = t0 + n * job.warmupMs;
  window.end = window.start + n * job.measureMs;
  const progressTimer =
    job.progressEveryMs > 0
      ? setInterval(() => {
          const now = performance.now();
          onProgress(
            now < window.start ? 'warmup' : now < window.end ? 'measure' : 'drain',
            Math.round(now - t0),
            completed,
            inFlight(),
          );
        }, job.progressEveryMs)
      : null;

  try {
    if (job.mode === 'closed') {
      let current: Run | undefined;
      for (let k = 0; ; k++) {
        const now = performance.now();
        current?.deactivate(now);
        current = runs[k % n];
        current?.activate(now);
        const next = t0 + (k + 1) * slice;
        if (next >= window.end) {
          await sleepUntil(window.end);
          break;
        }
        await sleepUntil(next);
      }
      current?.deactivate(performance.now());
    } else {
      // Each target's share of the window, slice by slice.
      const sliceLen = Number.isFinite(slice) ? slice : window.end - t0;
      for (let j = 0; t0 + j * sliceLen < window.end; j++) {
        const from = t0 + j * sliceLen;
        const run = runs[j % n];
        if (run !== undefined) run.measuredMs += overlap(from, from + sliceLen, window);
      }
      let next = 0;
      await new Promise<void>((resolve) => {
        const tick = (): void => {
          const now = performance.now();
          while (next < total && t0 + next * interval <= now) {
            const scheduled = t0 + next * interval;
            next++;
            runs[n === 1 ? 0 : Math.floor((scheduled - t0) / slice) % n]?.send(scheduled, now);
          }
          if (next >= total) {
            resolve();
            return;
          }
          const wait = t0 + next * interval - performance.now();
          if (wait > 1.5) setTimeout(tick, wait - 1);
          else setImmediate(tick);
        };
        tick();
      });
    }
    // Drain: wait for the answers still outstanding, then give up on them.
    if (inFlight() > 0) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          drainWaiter = null;
          resolve();
        }, job.drainTimeoutMs);
        drainWaiter = () => {
          clearTimeout(timer);
          drainWaiter = null;
          resolve();
        };
      });
    }
    if (inFlight() > 0) {
      const reason = `unanswered after the ${job.drainTimeoutMs} ms drain`;
      for (const r of runs) if (r.inFlight > 0) r.noteError(`${r.inFlight} ${reason}`);
      await new Promise<void>((resolve) => {
        drainWaiter = resolve;
        destroyAll(reason);
        setTimeout(resolve, 1000);
      });
    }
  } finally {
    if (progressTimer !== null) clearInterval(progressTimer);
    await Promise.all(runs.flatMap((r) => [...r.sessions.map(closeSession), ...r.rawSessions.map((s) => s.close())]));
  }
  const cpu = process.cpuUsage(cpuStart);
  const wallUs = (performance.now() - t0) * 1000;
  const cpuPct = Math.round(((cpu.user + cpu.system) / wallUs) * 1000) / 10;
  return runs.map((r) => r.result(cpuPct));
}

function main(): void {
  leanAsyncResourceBind();
  process.on('disconnect', () => process.exit(0));
  let queue = Promise.resolve();
  process.on('message', (msg: ToLoadGen) => {
    if (msg.type === 'exit') {
      process.exit(0);
    }
    const { id, job } = msg;
    queue = queue.then(async () => {
      try {
        const results = await runJob(job, (phase, elapsedMs, completed, inFlight) =>
          send({ type: 'progress', id, phase, elapsedMs, completed, inFlight }),
        );
        send({ type: 'result', id, results });
      } catch (err) {
        send({ type: 'failed', id, message: err instanceof Error ? err.message : String(err) });
      }
    });
  });
  send({ type: 'ready', pid: process.pid });
}

if (process.send !== undefined) main();
