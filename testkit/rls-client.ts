// A real gRPC client of Envoy's RLS (and of the gRPC health service), built with @grpc/proto-loader
// from proto/envoy/** — what Envoy sends, as the agent's tests and the front-door tests send it.
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

export const PROTO_DIR = fileURLToPath(new URL('../proto', import.meta.url));

export interface Entry {
  key: string;
  value: string;
}
export interface DescriptorIn {
  entries: Entry[];
  limit?: { requests_per_unit: number; unit: string };
  hits_addend?: { value: number };
}
export interface RequestIn {
  domain: string;
  descriptors: DescriptorIn[];
  hits_addend?: number;
}
export interface StatusOut {
  code: string;
  current_limit: { name: string; requests_per_unit: number; unit: string } | null;
  limit_remaining: number;
  duration_until_reset: { seconds: number; nanos: number } | null;
}
export interface ResponseOut {
  overall_code: string;
  statuses: StatusOut[];
  response_headers_to_add: { key: string; value: string }[];
  request_headers_to_add: { key: string; value: string }[];
}

const packageDefinition = protoLoader.loadSync(
  ['envoy/service/ratelimit/v3/rls.proto', 'grpc/health/v1/health.proto'],
  {
    includeDirs: [PROTO_DIR],
    keepCase: true,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  },
);
const loaded = grpc.loadPackageDefinition(packageDefinition) as unknown as {
  envoy: { service: { ratelimit: { v3: { RateLimitService: grpc.ServiceClientConstructor } } } };
  grpc: { health: { v1: { Health: grpc.ServiceClientConstructor } } };
};
export const RateLimitServiceClient = loaded.envoy.service.ratelimit.v3.RateLimitService;
export const HealthClient = loaded.grpc.health.v1.Health;

export class RlsClient {
  readonly client: grpc.Client;
  constructor(readonly target: string) {
    this.client = new RateLimitServiceClient(target, grpc.credentials.createInsecure());
  }

  check(req: RequestIn, deadlineMs = 5000): Promise<ResponseOut> {
    return new Promise((resolve, reject) => {
      const fn = (
        this.client as unknown as Record<
          string,
          (r: RequestIn, o: grpc.CallOptions, cb: (e: grpc.ServiceError | null, r: ResponseOut) => void) => void
        >
      )['ShouldRateLimit'];
      if (fn === undefined) throw new Error('no ShouldRateLimit');
      fn.call(this.client, req, { deadline: Date.now() + deadlineMs }, (error, res) =>
        error !== null ? reject(error) : resolve(res),
      );
    });
  }

  close(): void {
    this.client.close();
  }
}

/** An error from a gRPC call (rejects), as {code, details}. */
export async function grpcError(p: Promise<unknown>): Promise<{ code: number; details: string }> {
  try {
    await p;
  } catch (error) {
    const e = error as grpc.ServiceError;
    return { code: e.code, details: e.details };
  }
  throw new Error('expected the call to fail');
}

export function unixTarget(path: string): string {
  return `unix:${path}`;
}

export function d(...pairs: [string, string][]): DescriptorIn {
  return { entries: pairs.map(([key, value]) => ({ key, value })) };
}
