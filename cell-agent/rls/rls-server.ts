// The gRPC server of one serving thread: Envoy's RateLimitService/ShouldRateLimit and the gRPC health
// service (grpc.health.v1.Health: Check, List, Watch), on a Unix socket and/or a TCP address.
//
// Messages are decoded and encoded by rls-codec.ts (no protobufjs on the hot path). An undecodable
// request is answered INVALID_ARGUMENT ("malformed RateLimitRequest: ..."); requests larger than
// maxMessageBytes are refused by grpc-js with RESOURCE_EXHAUSTED; bytes that are not HTTP/2 at all
// make grpc-js drop that connection — the server keeps serving the others.
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
import * as grpc from '@grpc/grpc-js';
import type { Logger } from '../../shared/logging.js';
import type { CheckService } from '../decide/check-service.js';
import {
  SERVING_STATUS,
  decodeHealthCheckRequest,
  decodeRateLimitRequest,
  decodeRateLimitResponse,
  encodeHealthCheckRequest,
  encodeHealthCheckResponse,
  encodeHealthListResponse,
  encodeRateLimitRequest,
  encodeRateLimitResponse,
} from './rls-codec.js';
import type { Decoded, RlsRequest, RlsResponse } from './rls-codec.js';

export const RLS_SERVICE_NAME = 'envoy.service.ratelimit.v3.RateLimitService';
export const RLS_METHOD_PATH = `/${RLS_SERVICE_NAME}/ShouldRateLimit`;
export const HEALTH_SERVICE_NAME = 'grpc.health.v1.Health';
/** Longest Unix socket path (sun_path holds 108 bytes including the terminating NUL). */
export const UNIX_PATH_MAX_BYTES = 107;

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

/** A grpc-js service definition for the RLS, for servers (decodes requests) and clients (encodes them). */
export const rlsServiceDefinition = {
  ShouldRateLimit: {
    path: RLS_METHOD_PATH,
    requestStream: false,
    responseStream: false,
    requestSerialize: (req: RlsRequest): Buffer => encodeRateLimitRequest(req),
    requestDeserialize: (bytes: Buffer): Decoded<RlsRequest> => decodeRateLimitRequest(bytes),
    responseSerialize: (res: RlsResponse): Buffer => encodeRateLimitResponse(res),
    responseDeserialize: (bytes: Buffer): Decoded<RlsResponse> => decodeRateLimitResponse(bytes),
  },
} as const;

const healthDefinition = {
  Check: {
    path: `/${HEALTH_SERVICE_NAME}/Check`,
    requestStream: false,
    responseStream: false,
    requestSerialize: (m: { service: string }): Buffer => encodeHealthCheckRequest(m),
    requestDeserialize: (b: Buffer): Decoded<{ service: string }> => decodeHealthCheckRequest(b),
    responseSerialize: (m: { status: number }): Buffer => encodeHealthCheckResponse(m),
    responseDeserialize: (b: Buffer): Buffer => b,
  },
  List: {
    path: `/${HEALTH_SERVICE_NAME}/List`,
    requestStream: false,
    responseStream: false,
    requestSerialize: (): Buffer => Buffer.alloc(0),
    requestDeserialize: (): null => null,
    responseSerialize: (m: ReadonlyMap<string, number>): Buffer => encodeHealthListResponse(m),
    responseDeserialize: (b: Buffer): Buffer => b,
  },
  Watch: {
    path: `/${HEALTH_SERVICE_NAME}/Watch`,
    requestStream: false,
    responseStream: true,
    requestSerialize: (m: { service: string }): Buffer => encodeHealthCheckRequest(m),
    requestDeserialize: (b: Buffer): Decoded<{ service: string }> => decodeHealthCheckRequest(b),
    responseSerialize: (m: { status: number }): Buffer => encodeHealthCheckResponse(m),
    responseDeserialize: (b: Buffer): Buffer => b,
  },
} as const;

class HealthState {
  private serving = false;
  private readonly watchers = new Set<{ service: string; write: (status: number) => void }>();

  statusOf(service: string): number | null {
    if (service !== '' && service !== RLS_SERVICE_NAME) return null;
    return this.serving ? SERVING_STATUS.SERVING : SERVING_STATUS.NOT_SERVING;
  }

  all(): Map<string, number> {
    const s = this.serving ? SERVING_STATUS.SERVING : SERVING_STATUS.NOT_SERVING;
    return new Map([['', s], [RLS_SERVICE_NAME, s]]);
  }

  set(serving: boolean): void {
    if (this.serving === serving) return;
    this.serving = serving;
    for (const w of this.watchers) w.write(this.statusOf(w.service) ?? SERVING_STATUS.SERVICE_UNKNOWN);
  }

  watch(w: { service: string; write: (status: number) => void }): () => void {
    this.watchers.add(w);
    return () => this.watchers.delete(w);
  }

  endWatches(): void {
    this.watchers.clear();
  }
}

function bindAsync(server: grpc.Server, address: string): Promise<number> {
  return new Promise((resolvePort, reject) => {
    server.bindAsync(address, grpc.ServerCredentials.createInsecure(), (error, port) => {
      if (error !== null) reject(error);
      else resolvePort(port);
    });
  });
}

/** Starts the server on the configured addresses. Rejects if any address cannot be bound. */
export async function startRlsServer(service: CheckService, opts: RlsListenOptions, logger: Logger): Promise<RlsServerHandle> {
  const server = new grpc.Server({
    'grpc.max_receive_message_length': opts.maxMessageBytes,
    'grpc.max_send_message_length': 4 * 1024 * 1024,
  });
  const health = new HealthState();

  server.addService(rlsServiceDefinition, {
    ShouldRateLimit: (call: grpc.ServerUnaryCall<Decoded<RlsRequest>, RlsResponse>, callback: grpc.sendUnaryData<RlsResponse>) => {
      const decoded = call.request;
      if (!decoded.ok) {
        service.rejected('malformed');
        callback({ code: grpc.status.INVALID_ARGUMENT, details: decoded.error });
        return;
      }
      const out = service.check(decoded.value);
      if (out.kind === 'error') callback({ code: out.code, details: out.message });
      else callback(null, out.response);
    },
  });

  server.addService(healthDefinition, {
    Check: (call: grpc.ServerUnaryCall<Decoded<{ service: string }>, { status: number }>, callback: grpc.sendUnaryData<{ status: number }>) => {
      const decoded = call.request;
      if (!decoded.ok) {
        callback({ code: grpc.status.INVALID_ARGUMENT, details: decoded.error });
        return;
      }
      const status = health.statusOf(decoded.value.service);
      if (status === null) callback({ code: grpc.status.NOT_FOUND, details: `unknown service '${decoded.value.service}'` });
      else callback(null, { status });
    },
    List: (_call: grpc.ServerUnaryCall<null, ReadonlyMap<string, number>>, callback: grpc.sendUnaryData<ReadonlyMap<string, number>>) => {
      callback(null, health.all());
    },
    Watch: (call: grpc.ServerWritableStream<Decoded<{ service: string }>, { status: number }>) => {
      const decoded = call.request;
      if (!decoded.ok) {
        call.emit('error', { code: grpc.status.INVALID_ARGUMENT, details: decoded.error });
        return;
      }
      const serviceName = decoded.value.service;
      const write = (status: number): void => {
        if (!call.cancelled && call.writable) call.write({ status });
      };
      write(health.statusOf(serviceName) ?? SERVING_STATUS.SERVICE_UNKNOWN);
      const unwatch = health.watch({ service: serviceName, write });
      call.on('cancelled', unwatch);
      call.on('close', unwatch);
    },
  });

  let unixBound: { path: string; ino: number } | null = null;
  let tcpEndpoint: string | null = null;
  try {
    if (opts.unix !== undefined) unixBound = await bindUnix(server, opts.unix);
    if (opts.tcp !== undefined) {
      const host = opts.tcp.host.includes(':') ? `[${opts.tcp.host}]` : opts.tcp.host;
      const port = await bindAsync(server, `${host}:${opts.tcp.port}`);
      tcpEndpoint = `${host}:${port}`;
    }
  } catch (error) {
    server.forceShutdown();
    if (unixBound !== null) await removeIfOurs(unixBound);
    throw error;
  }
  health.set(true);
  logger.debug({ unix: unixBound?.path ?? null, tcp: tcpEndpoint }, 'rls server listening');

  let stopped: Promise<void> | null = null;
  return {
    endpoints: { unix: unixBound?.path ?? null, tcp: tcpEndpoint },
    setServing: (serving) => health.set(serving),
    stop: (graceMs) => {
      stopped ??= (async () => {
        health.set(false);
        health.endWatches();
        await new Promise<void>((done) => {
          const timer = setTimeout(() => {
            server.forceShutdown();
            done();
          }, graceMs);
          server.tryShutdown(() => {
            clearTimeout(timer);
            done();
          });
        });
        // Open Watch streams and idle connections do not hold the shutdown past the grace period.
        server.forceShutdown();
        if (unixBound !== null) await removeIfOurs(unixBound);
      })();
      return stopped;
    },
  };
}

// ---- Unix sockets ---------------------------------------------------------------------------------

export class SocketPathError extends Error {
  readonly code = 'RLS_SOCKET_PATH';
  constructor(message: string) {
    super(message);
    this.name = 'SocketPathError';
  }
}

async function bindUnix(server: grpc.Server, listen: UnixListen): Promise<{ path: string; ino: number }> {
  const path = resolve(listen.path);
  const tmp = join(dirname(path), `.cq-${process.pid.toString(36)}-${threadId.toString(36)}-${basename(path).slice(0, 8)}.tmp`);
  for (const p of [path, tmp]) {
    if (Buffer.byteLength(p) > UNIX_PATH_MAX_BYTES) {
      throw new SocketPathError(`unix socket path ${p} is longer than ${UNIX_PATH_MAX_BYTES} bytes`);
    }
  }
  await checkSocketPath(path);
  await unlink(tmp).catch(ignoreMissing);
  await bindAsync(server, `unix:${tmp}`);
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

async function removeIfOurs(bound: { path: string; ino: number }): Promise<void> {
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
