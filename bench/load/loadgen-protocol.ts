// Messages between the benchmark (parent) and the load generator process (bench/load/loadgen.ts),
// over the child_process IPC channel.

export type LoadMode = 'closed' | 'paced';

/** One server: its address, or all of its addresses (see LoadJob.targets). */
export type LoadTarget = string | readonly string[];

/** The addresses of a target. */
export function targetAddresses(target: LoadTarget): readonly string[] {
  return typeof target === 'string' ? [target] : target;
}

/** A target as one string, for messages. */
export function targetLabel(target: LoadTarget): string {
  return targetAddresses(target).join(' + ');
}

export interface LoadJob {
  /**
   * The servers under test. Each is one address — a Unix socket path (starting with '/') or
   * 'host:port' (TCP, cleartext HTTP/2) — or the list of addresses of one server that serves on
   * several sockets (the agent with several workers: one socket per worker); its `sessions` are
   * then spread over them round-robin (session k to address k mod n, at least one session per
   * address). With several servers they take turns `sliceMs` at a time, each getting
   * warmupMs + measureMs of load in all.
   */
  readonly targets: readonly LoadTarget[];
  readonly sliceMs: number;
  readonly domain: string;
  readonly tenants: number;
  /** 'closed': keep `concurrency` requests in flight. 'paced': send at `rate` req/s on a fixed schedule (open loop). */
  readonly mode: LoadMode;
  readonly concurrency: number;
  readonly rate: number;
  /** HTTP/2 connections per target (raised to its number of addresses); the streams are spread over them round-robin. */
  readonly sessions: number;
  /** 'http2': node:http2's client. 'raw': shared/h2-raw.ts, frames written and read directly. */
  readonly client: 'http2' | 'raw';
  readonly warmupMs: number;
  readonly measureMs: number;
  /** After the last send: how long to wait for outstanding answers before counting them as errors. */
  readonly drainTimeoutMs: number;
  /** Seed of the tenant order (testkit/random.ts). */
  readonly seed: number;
  /** Progress messages every this many ms (0: none). */
  readonly progressEveryMs: number;
  /**
   * Count answers per tenant (allowed, fail-open) for completions inside the window, and, in closed
   * mode, the latency of those completions too (send → answer; at most 500,000 samples). Optional:
   * off when absent (bench/overload.ts turns it on).
   */
  readonly perTenant?: boolean;
}

export interface LatencySummary {
  readonly samples: number;
  readonly p50Us: number;
  readonly p90Us: number;
  readonly p99Us: number;
  readonly p999Us: number;
  readonly maxUs: number;
}

export interface PhaseResult {
  /** Requests started (warm-up, measurement and drain together). Always sent = ok + errors. */
  readonly sent: number;
  /** gRPC status 0 with a response message (allowed, over limit, or an unknown code). */
  readonly ok: number;
  /** Any other outcome: a non-zero gRPC status, a reset stream, a bad body, a drain timeout. */
  readonly errors: number;
  readonly allowed: number;
  readonly overLimit: number;
  /** overall_code neither OK nor OVER_LIMIT (UNKNOWN = 0, which Envoy would treat as OK). */
  readonly unknownCode: number;
  /** Answers marked x-ratelimit-degraded: given fail-open, without a decision. */
  readonly degraded: number;
  /** Completions inside the measurement window (closed loop: during this target's turns only), and the time measured. */
  readonly measuredCompletions: number;
  readonly measuredMs: number;
  /** measuredCompletions per second. */
  readonly throughput: number;
  /** Paced: latency from the scheduled send time to the answer, for sends scheduled in the window. */
  readonly latency: LatencySummary | null;
  /** Paced: how late the generator itself sent (actual − scheduled send time). */
  readonly sendLag: LatencySummary | null;
  /** Paced: the rate actually offered in the window. */
  readonly offeredRate: number;
  /** CPU used by the generator process over the whole phase, % of one core. */
  readonly generatorCpuPct: number;
  readonly errorSamples: readonly string[];
  /** With perTenant: answers marked x-ratelimit-fail-open (OK without a decision), all phases. */
  readonly failOpen?: number;
  /** With perTenant: per tenant index, OK answers completed inside the window, and of those the fail-open ones. */
  readonly tenantAllowed?: readonly number[];
  readonly tenantFailOpen?: readonly number[];
}

export type ToLoadGen =
  { readonly type: 'job'; readonly id: number; readonly job: LoadJob } | { readonly type: 'exit' };

export type FromLoadGen =
  | { readonly type: 'ready'; readonly pid: number }
  | {
      readonly type: 'progress';
      readonly id: number;
      readonly phase: 'warmup' | 'measure' | 'drain';
      readonly elapsedMs: number;
      readonly completed: number;
      readonly inFlight: number;
    }
  | { readonly type: 'result'; readonly id: number; readonly results: readonly PhaseResult[] }
  | { readonly type: 'failed'; readonly id: number; readonly message: string };
