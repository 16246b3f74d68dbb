// The shape of a "server under test": a module exporting `start(target, options)`, run by
// testkit/processes/host.ts in a process of its own. `target` is a Unix socket path (starts with '/')
// or 'host:port' for TCP; the server answers envoy.service.ratelimit.v3.RateLimitService/
// ShouldRateLimit there until stop() resolves.

export interface ServerOptions {
  /** A private directory the server may write to (rules files, ...); removed by the benchmark. */
  readonly scratchDir: string;
  /** rate-limiter-flexible's store (bench/servers/rlf.ts). */
  readonly store?: 'memory' | 'redis';
  /** The Unix socket of the redis-server the benchmark started (store 'redis'). */
  readonly redisSocket?: string;
  /** The ceiling's codec: none at all (default), or proto-loader/protobufjs. */
  readonly codec?: 'raw' | 'protobufjs';
  /**
   * bench/servers/rlf-quota.ts: one quota, rate-limiter-flexible points per duration, for each
   * value of descriptor entry `key` in `domain` (the accuracy benchmark's central-Redis variant).
   */
  readonly quota?: {
    readonly domain: string;
    readonly key: string;
    readonly points: number;
    readonly durationSec: number;
  };
  /** The agent's serving workers (bench/servers/agent.ts; default 1), each on a socket of its own. */
  readonly workers?: number;
  /** The agent's RLS server (bench/servers/agent.ts): 'lean' (default) or 'grpc-js'. */
  readonly rlsServer?: 'lean' | 'grpc-js';
  /** The agent's overload settings (bench/servers/agent.ts): given, the lag guard is on at the agent's
   * default threshold (unless lagThresholdMs says otherwise) with this policy; absent, it is off. */
  readonly overloadPolicy?: 'bounded' | 'open';
  readonly lagThresholdMs?: number;
  /** The agent's --worker-young-generation-mb (bench/servers/agent.ts); the agent's default when absent. */
  readonly workerYoungGenerationMb?: number;
  /** Node/V8 flags for the server's process (ServerProcess puts them before tsx's), e.g. --max-semi-space-size=1. */
  readonly nodeFlags?: readonly string[];
}

export interface RunningServer {
  stop(): Promise<void>;
  /** One line on what runs (versions, settings), for the report's notes. */
  readonly description?: string;
  /**
   * Every address it answers on, when that is more than `target` (the agent with several workers:
   * one socket per worker); the load generator spreads its connections over them. Default [target].
   */
  readonly endpoints?: readonly string[];
}

export type StartServer = (target: string, options: ServerOptions) => Promise<RunningServer>;
