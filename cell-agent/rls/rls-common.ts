// What both RLS servers (the lean node:http2 one and the grpc-js one) share: the service names, the
// listen options and the handle, the gRPC health state, and binding a Unix socket safely.
//
// Unix socket: bound under a temporary name in the same directory, given its mode (and owner, when
// configured), then renamed onto the configured path — so the path never exists with the wrong
// permissions, and a stale socket left by a crashed agent is replaced atomically. A path that is
// in use by a live server, or that is not a socket, is an error. On stop the socket is removed if
// it is still ours (same inode).
import { chmod, chown, lstat, rename, stat, unlink } from 'node:fs/promises';
import { connect } from 'node:net';
import { basename, dirname, join, resolve } from 'node:path';
import { threadId } from 'node:worker_threads';
import { SERVING_STATUS } from './rls-codec.js';
import { CellquotaError } from '../../shared/errors.js';

export const RLS_SERVICE_NAME = 'envoy.service.ratelimit.v3.RateLimitService';
export const RLS_METHOD_PATH = `/${RLS_SERVICE_NAME}/ShouldRateLimit`;
export const HEALTH_SERVICE_NAME = 'grpc.health.v1.Health';
/** Longest Unix socket path (sun_path holds 108 bytes including the terminating NUL). */
export const MAX_UNIX_PATH_BYTES = 107;

/** Which implementation serves the RLS: the lean node:http2 server (default) or grpc-js. */
export const RLS_SERVER_KINDS = ['lean', 'grpc-js'] as const;
export type RlsServerKind = (typeof RLS_SERVER_KINDS)[number];

export interface UnixListen {
  readonly path: string;
  /** Permission bits, e.g. 0o660. */
  readonly mode: number;
  readonly uid?: number | undefined;
  readonly gid?: number | undefined;
}

export interface TcpListen {
  readonly host: string;
  readonly port: number;
}

export interface RlsListenOptions {
  readonly unix?: UnixListen | undefined;
  readonly tcp?: TcpListen | undefined;
  /** Largest request message accepted (bytes). */
  readonly maxMessageBytes: number;
  /** Default 'lean'. */
  readonly server?: RlsServerKind | undefined;
}

export interface RlsEndpoints {
  /** The Unix socket path, if bound. */
  readonly unix: string | null;
  /** host:port actually bound (port 0 resolved), if bound. */
  readonly tcp: string | null;
}

export interface RlsServerHandle {
  readonly endpoints: RlsEndpoints;
  /** Health status of both services ('' and the RLS). */
  setServing(serving: boolean): void;
  /** Stops accepting, lets in-flight calls finish for up to graceMs, then closes everything. */
  stop(graceMs: number): Promise<void>;
}

/**
 * The handle of a server that listens now: health SERVING; stop() runs once (later calls get the same
 * promise), turns health NOT_SERVING and ends the Watch streams, then `shutdown(graceMs)`.
 */
export function listeningHandle(
  endpoints: RlsEndpoints,
  health: HealthState,
  shutdown: (graceMs: number) => Promise<void>,
): RlsServerHandle {
  health.set(true);
  let stopped: Promise<void> | null = null;
  return {
    endpoints,
    setServing: (serving) => health.set(serving),
    stop: (graceMs) => {
      stopped ??= (async () => {
        health.set(false);
        health.endWatches();
        await shutdown(graceMs);
      })();
      return stopped;
    },
  };
}

/** host:port as clients dial it (IPv6 hosts in brackets). */
export function tcpEndpoint(host: string, port: number): string {
  return `${host.includes(':') ? `[${host}]` : host}:${port}`;
}

// ---- gRPC health (grpc.health.v1.Health) --------------------------------------------------------

export interface HealthWatcher {
  readonly service: string;
  write(status: number): void;
}

/**
 * envoyproxy/ratelimit's health service name (`NewHealthChecker(health.NewServer(), "ratelimit", …)`), which
 * deployments migrating from it probe.
 */
export const RATELIMIT_HEALTH_NAME = 'ratelimit';
/** The service names the health service knows: the whole server, the RLS, and envoyproxy/ratelimit's name. */
export const HEALTH_SERVICE_NAMES: readonly string[] = Object.freeze(['', RLS_SERVICE_NAME, RATELIMIT_HEALTH_NAME]);

export class HealthState {
  private serving = false;
  private readonly watchers = new Set<HealthWatcher>();

  /** The status of a service name, null for a service this server does not know. */
  statusOf(service: string): number | null {
    if (!HEALTH_SERVICE_NAMES.includes(service)) return null;
    return this.serving ? SERVING_STATUS.SERVING : SERVING_STATUS.NOT_SERVING;
  }

  all(): Map<string, number> {
    const s = this.serving ? SERVING_STATUS.SERVING : SERVING_STATUS.NOT_SERVING;
    return new Map(HEALTH_SERVICE_NAMES.map((name) => [name, s]));
  }

  set(serving: boolean): void {
    if (this.serving === serving) return;
    this.serving = serving;
    for (const w of this.watchers) w.write(this.statusOf(w.service) ?? SERVING_STATUS.SERVICE_UNKNOWN);
  }

  watch(w: HealthWatcher): () => void {
    this.watchers.add(w);
    return () => this.watchers.delete(w);
  }

  endWatches(): void {
    this.watchers.clear();
  }
}

// ---- Unix sockets ---------------------------------------------------------------------------------

export class SocketPathError extends CellquotaError {
  readonly code = 'RLS_SOCKET_PATH';
  constructor(message: string) {
    super(message);
    this.name = 'SocketPathError';
  }
}

export interface BoundUnix {
  readonly path: string;
  readonly ino: number;
}

/**
 * Binds a Unix socket at listen.path: `listenAt(tmp)` makes the server listen on a temporary path, renamed into place
 * once its mode is set.
 */
export async function bindUnix(listen: UnixListen, listenAt: (tmpPath: string) => Promise<void>): Promise<BoundUnix> {
  const path = resolve(listen.path);
  const tmp = join(
    dirname(path),
    `.cq-${process.pid.toString(36)}-${threadId.toString(36)}-${basename(path).slice(0, 8)}.tmp`,
  );
  for (const p of [path, tmp]) {
    if (Buffer.byteLength(p) > MAX_UNIX_PATH_BYTES) {
      throw new SocketPathError(`unix socket path ${p} is longer than ${MAX_UNIX_PATH_BYTES} bytes`);
    }
  }
  await checkSocketPath(path);
  await unlink(tmp).catch(ignoreMissing);
  await listenAt(tmp);
  try {
    await chmod(tmp, listen.mode);
    if (listen.uid !== undefined || listen.gid !== undefined) await chown(tmp, listen.uid ?? -1, listen.gid ?? -1);
    await rename(tmp, path);
  } catch (error) {
    await unlink(tmp).catch(ignoreMissing);
    throw error;
  }
  const info = await stat(path);
  return { path, ino: info.ino };
}

/** Fails if `path` exists and is not a stale socket. */
async function checkSocketPath(path: string): Promise<void> {
  let info;
  try {
    info = await lstat(path);
  } catch (error) {
    if (isCode(error, 'ENOENT')) return;
    throw error;
  }
  if (!info.isSocket()) throw new SocketPathError(`${path} exists and is not a socket; refusing to replace it`);
  const live = await new Promise<boolean>((done) => {
    const socket = connect({ path });
    const finish = (result: boolean): void => {
      socket.destroy();
      done(result);
    };
    socket.once('connect', () => finish(true));
    socket.once('error', () => finish(false));
    socket.setTimeout(1000, () => finish(true));
  });
  if (live) throw new SocketPathError(`${path} is in use by a running server`);
}

/** Removes the socket file if it is still the one we bound (same inode). */
export async function removeIfOurs(bound: BoundUnix): Promise<void> {
  try {
    const info = await stat(bound.path);
    if (info.ino === bound.ino) await unlink(bound.path);
  } catch {
    // gone already
  }
}

function ignoreMissing(error: unknown): void {
  if (!isCode(error, 'ENOENT')) throw error;
}

function isCode(error: unknown, code: string): boolean {
  return typeof error === 'object' && error !== null && (error as { code?: unknown }).code === code;
}
