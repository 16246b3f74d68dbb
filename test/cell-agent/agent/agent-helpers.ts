// Helpers for the end-to-end agent tests: temp directories, a real gRPC client of Envoy's RLS built
// with @grpc/proto-loader from proto/envoy/**, a capturing logger, and small polling utilities.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { pino } from 'pino';
import type { Logger } from 'pino';

export const PROTO_DIR = fileURLToPath(new URL('../../../proto', import.meta.url));

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

const packageDefinition = protoLoader.loadSync(['envoy/service/ratelimit/v3/rls.proto', 'grpc/health/v1/health.proto'], {
  includeDirs: [PROTO_DIR],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
});
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
      const fn = (this.client as unknown as Record<string, (r: RequestIn, o: grpc.CallOptions, cb: (e: grpc.ServiceError | null, r: ResponseOut) => void) => void>)['ShouldRateLimit'];
      if (fn === undefined) throw new Error('no ShouldRateLimit');
      fn.call(this.client, req, { deadline: Date.now() + deadlineMs }, (error, res) => (error !== null ? reject(error) : resolve(res)));
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

export interface TempDir {
  readonly path: string;
  file(name: string, text: string): string;
  remove(): void;
}

export function tempDir(prefix = 'cq-agent-'): TempDir {
  const path = mkdtempSync(join(tmpdir(), prefix));
  return {
    path,
    file: (name, text) => {
      const p = join(path, name);
      writeFileSync(p, text);
      return p;
    },
    remove: () => rmSync(path, { recursive: true, force: true }),
  };
}

export interface CapturedLogger {
  readonly logger: Logger;
  readonly lines: Record<string, unknown>[];
}

/** A pino logger whose records are kept in memory (parsed). */
export function captureLogger(level = 'info'): CapturedLogger {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line.trim() !== '') lines.push(JSON.parse(line) as Record<string, unknown>);
      }
      cb();
    },
  });
  return { logger: pino({ level }, stream), lines };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Polls `probe` until it returns a non-undefined value or the timeout passes. */
export async function eventually<T>(probe: () => Promise<T | undefined> | T | undefined, timeoutMs = 10_000, everyMs = 25): Promise<T> {
  const until = Date.now() + timeoutMs;
  let last: unknown = null;
  for (;;) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (error) {
      last = error;
    }
    if (Date.now() > until) throw new Error(`condition not met within ${timeoutMs} ms${last === null ? '' : `: ${last instanceof Error ? last.message : JSON.stringify(last)}`}`);
    await sleep(everyMs);
  }
}

export function d(...pairs: [string, string][]): DescriptorIn {
  return { entries: pairs.map(([key, value]) => ({ key, value })) };
}
