// The shape of a "server under test": a module exporting `start(target, options)`, run by
// bench/servers/host.ts in a process of its own. `target` is a Unix socket path (starts with '/')
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
}

export interface RunningServer {
  stop(): Promise<void>;
  /** One line on what runs (versions, settings), for the report's notes. */
  readonly description?: string;
}

export type StartServer = (target: string, options: ServerOptions) => Promise<RunningServer>;
