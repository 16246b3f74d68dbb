// The grpc-js side shared by the baseline servers: the RLS service definition loaded from the
// project's proto/envoy/service/ratelimit/v3/rls.proto with the project's proto-loader settings (as
// coordinator/transport/peer-proto.ts), a raw one that neither decodes nor encodes (the ceiling),
// binding to a Unix socket or TCP, and shutdown.
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

export const RLS_SERVICE = 'envoy.service.ratelimit.v3.RateLimitService';

export interface DescriptorEntryMsg {
  key: string;
  value: string;
}
export interface RateLimitRequestMsg {
  domain: string;
  descriptors: { entries: DescriptorEntryMsg[] }[];
  hitsAddend: number;
}
export type CodeName = 'UNKNOWN' | 'OK' | 'OVER_LIMIT';
export interface DescriptorStatusMsg {
  code: CodeName;
  currentLimit?: {
    requestsPerUnit: number;
    unit: 'SECOND' | 'MINUTE' | 'HOUR' | 'DAY' | 'WEEK' | 'MONTH' | 'YEAR';
    name?: string;
  };
  limitRemaining?: number;
  durationUntilReset?: { seconds: number; nanos: number };
}
export interface RateLimitResponseMsg {
  overallCode: CodeName;
  statuses: DescriptorStatusMsg[];
}

export type ShouldRateLimit = grpc.handleUnaryCall<RateLimitRequestMsg, RateLimitResponseMsg>;

let cached: grpc.ServiceDefinition | undefined;

export function loadRlsService(): grpc.ServiceDefinition {
  if (cached !== undefined) return cached;
  // The project's own wire-compatible RLS proto (the one the agent's codec is checked against).
  const protoRoot = fileURLToPath(new URL('../../proto/', import.meta.url));
  const protoPath = 'envoy/service/ratelimit/v3/rls.proto';
  const pkg = protoLoader.loadSync(protoPath, {
    includeDirs: [protoRoot],
    keepCase: false,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const def = pkg[RLS_SERVICE];
  if (def === undefined || !('ShouldRateLimit' in def)) throw new Error(`${protoPath} does not define ${RLS_SERVICE}`);
  cached = def;
  return def;
}

/** ShouldRateLimit with Buffers in and out: grpc-js framing only, no protobuf work at all. */
export function rawRlsService(): grpc.ServiceDefinition {
  const identity = (b: Buffer): Buffer => b;
  return {
    ShouldRateLimit: {
      path: `/${RLS_SERVICE}/ShouldRateLimit`,
      requestStream: false,
      responseStream: false,
      requestSerialize: identity,
      requestDeserialize: identity,
      responseSerialize: identity,
      responseDeserialize: identity,
    },
  };
}

/** grpc-js's address for a benchmark target: 'unix:/path' for a socket path, 'host:port' as is. */
export function grpcAddress(target: string): string {
  return target.startsWith('/') ? `unix:${target}` : target;
}

/** A grpc-js server (default options) with the RLS service bound to `target`, started. */
export async function startRlsServer<Req, Res>(
  target: string,
  handler: grpc.handleUnaryCall<Req, Res>,
  definition: grpc.ServiceDefinition = loadRlsService(),
): Promise<grpc.Server> {
  const server = new grpc.Server();
  server.addService(definition, { ShouldRateLimit: handler });
  await new Promise<number>((resolve, reject) => {
    server.bindAsync(grpcAddress(target), grpc.ServerCredentials.createInsecure(), (err, port) =>
      err !== null ? reject(err) : resolve(port),
    );
  });
  return server;
}

/** Graceful shutdown, forced after `graceMs`. */
export function stopRlsServer(server: grpc.Server, graceMs = 1000): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      server.forceShutdown();
      resolve();
    }, graceMs);
    server.tryShutdown(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}
