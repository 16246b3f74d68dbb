// The grpc-js RLS server: Envoy's RateLimitService/ShouldRateLimit and the gRPC health service on
// @grpc/grpc-js, with the hand-written codec (rls-codec.ts). The agent's default is the lean
// node:http2 server (lean-server.ts); this one is kept as the `--rls-server grpc-js` variant, which
// bench/agent-rls.ts measures side by side with it ('agent-grpcjs'). Loaded only when chosen
// (rls-server.ts imports it dynamically), so a lean worker never loads grpc-js.
//
// An undecodable request is answered INVALID_ARGUMENT ("malformed RateLimitRequest: ..."); requests
// larger than maxMessageBytes are refused by grpc-js with RESOURCE_EXHAUSTED; bytes that are not
// HTTP/2 at all make grpc-js drop that connection — the server keeps serving the others.
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
import type { Decoded } from './rls-codec.js';
import type { RlsRequest, RlsResponse } from '../messages/rls-messages.js';
import {
  HEALTH_SERVICE_NAME,
  HealthState,
  RLS_METHOD_PATH,
  bindUnix,
  listeningHandle,
  removeIfOurs,
  tcpEndpoint,
} from './rls-common.js';
import type { BoundUnix, RlsListenOptions, RlsServerHandle } from './rls-common.js';

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

/** Check and Watch: a HealthCheckRequest in, HealthCheckResponse(s) out. */
const healthCheckMessages = {
  requestSerialize: (m: { service: string }): Buffer => encodeHealthCheckRequest(m),
  requestDeserialize: (b: Buffer): Decoded<{ service: string }> => decodeHealthCheckRequest(b),
  responseSerialize: (m: { status: number }): Buffer => encodeHealthCheckResponse(m),
  responseDeserialize: (b: Buffer): Buffer => b,
} as const;

const healthDefinition = {
  Check: { path: `/${HEALTH_SERVICE_NAME}/Check`, requestStream: false, responseStream: false, ...healthCheckMessages },
  List: {
    path: `/${HEALTH_SERVICE_NAME}/List`,
    requestStream: false,
    responseStream: false,
    requestSerialize: (): Buffer => Buffer.alloc(0),
    requestDeserialize: (): null => null,
    responseSerialize: (m: ReadonlyMap<string, number>): Buffer => encodeHealthListResponse(m),
    responseDeserialize: (b: Buffer): Buffer => b,
  },
  Watch: { path: `/${HEALTH_SERVICE_NAME}/Watch`, requestStream: false, responseStream: true, ...healthCheckMessages },
} as const;

function bindAsync(server: grpc.Server, address: string): Promise<number> {
  return new Promise((resolvePort, reject) => {
    server.bindAsync(address, grpc.ServerCredentials.createInsecure(), (error, port) => {
      if (error !== null) reject(error);
      else resolvePort(port);
    });
  });
}

/** Starts the server on the configured addresses. Rejects if any address cannot be bound. */
export async function startGrpcJsRlsServer(
  service: CheckService,
  opts: RlsListenOptions,
  logger: Logger,
): Promise<RlsServerHandle> {
  const server = new grpc.Server({
    'grpc.max_receive_message_length': opts.maxMessageBytes,
    'grpc.max_send_message_length': 4 * 1024 * 1024,
  });
  const health = new HealthState();

  server.addService(rlsServiceDefinition, {
    ShouldRateLimit: (
      call: grpc.ServerUnaryCall<Decoded<RlsRequest>, RlsResponse>,
      callback: grpc.sendUnaryData<RlsResponse>,
    ) => {
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
    Check: (
      call: grpc.ServerUnaryCall<Decoded<{ service: string }>, { status: number }>,
      callback: grpc.sendUnaryData<{ status: number }>,
    ) => {
      const decoded = call.request;
      if (!decoded.ok) {
        callback({ code: grpc.status.INVALID_ARGUMENT, details: decoded.error });
        return;
      }
      const status = health.statusOf(decoded.value.service);
      if (status === null)
        callback({ code: grpc.status.NOT_FOUND, details: `unknown service '${decoded.value.service}'` });
      else callback(null, { status });
    },
    List: (
      _call: grpc.ServerUnaryCall<null, ReadonlyMap<string, number>>,
      callback: grpc.sendUnaryData<ReadonlyMap<string, number>>,
    ) => {
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

  let unixBound: BoundUnix | null = null;
  let tcpBound: string | null = null;
  try {
    if (opts.unix !== undefined)
      unixBound = await bindUnix(opts.unix, async (tmp) => {
        await bindAsync(server, `unix:${tmp}`);
      });
    if (opts.tcp !== undefined) {
      const port = await bindAsync(server, tcpEndpoint(opts.tcp.host, opts.tcp.port));
      tcpBound = tcpEndpoint(opts.tcp.host, port);
    }
  } catch (error) {
    server.forceShutdown();
    if (unixBound !== null) await removeIfOurs(unixBound);
    throw error;
  }
  logger.debug({ unix: unixBound?.path ?? null, tcp: tcpBound }, 'rls server listening');
  return listeningHandle({ unix: unixBound?.path ?? null, tcp: tcpBound }, health, async (graceMs) => {
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
  });
}
