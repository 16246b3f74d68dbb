// The agent's HTTP API (fastify, main thread):
//
//   POST /v1/check   {"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}],
//                     "hits_addend"?: 1, "limit"?: {"requests_per_unit": 10, "unit": "MINUTE"}}],
//                     "hits_addend"?: 1}
//                    → 200 (OK) or 429 (OVER_LIMIT) with the decision as JSON (field names as
//                    protojson's original names: overall_code, statuses[].current_limit, ...),
//                    RateLimit-Limit / -Remaining / -Reset, Retry-After on 429 (whole seconds, ≥ 1),
//                    x-ratelimit-degraded: true when degraded.
//   ANY  /v1/forward-auth[/...]  forward-auth for nginx, Caddy, Traefik and Envoy ext_authz
//                    (cell-agent/front-door/forward-auth.ts): 200 with RateLimit headers, or the deny
//                    status (429 by default) with Retry-After; the request's body is not read.
//                    Served on node:http ahead of fastify (front-door/forward-auth-http.ts).
//   GET  /metrics    Prometheus text
//   GET  /healthz    200 {"status": "ok", ...} while every worker serves, else 503
//
// The same decision as the gRPC service (CheckService), on the same shared buckets. Every error is
// JSON {error, message, details}: 400 for a body that is not JSON, fails the schema (details: the
// zod issues) or the agent's request checks (empty domain, an input bound), 413 for a body over the
// limit, 415 for another content type, 404 / 405 for other routes.
import { createServer } from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import Fastify from 'fastify';
import type { FastifyError, FastifyInstance } from 'fastify';
import { z } from 'zod';
import type { Logger } from '../../shared/logging.js';
import type { CheckService } from '../decide/check-service.js';
import {
  CELL_HEADER,
  DECIDED_ON_HEADER,
  DEGRADED_HEADER,
  FAIL_OPEN_HEADER,
  PROVENANCE_HEADERS,
  REFUSED_BY_HEADER,
  REFUSED_LIMIT_HEADER,
  rateLimitHeaders,
} from '../decide/decide.js';
import { REQUEST_UNIT } from '../messages/rls-messages.js';
import type { RlsDescriptorStatus, RlsRequest, RlsResponse } from '../messages/rls-messages.js';
import { forwardAuthHandler, isForwardAuthUrl } from '../front-door/forward-auth-http.js';
import type { ForwardAuthDeps } from '../front-door/forward-auth-http.js';
import { UNIX_PEER, startForwardAuthSocket } from '../front-door/forward-auth-socket.js';
import type { UnixListen } from '../rls/rls-common.js';
import { MAX_UINT32 } from '../rules/rules-schema.js';
import { CellquotaError } from '../../shared/errors.js';

const REQUEST_UNIT_NAMES = ['SECOND', 'MINUTE', 'HOUR', 'DAY', 'MONTH', 'YEAR'] as const;
const RESPONSE_UNIT_NAMES: Record<number, string> = {
  0: 'UNKNOWN',
  1: 'SECOND',
  2: 'MINUTE',
  3: 'HOUR',
  4: 'DAY',
  5: 'MONTH',
  6: 'YEAR',
  7: 'WEEK',
};
const CODE_NAMES: Record<number, string> = { 0: 'UNKNOWN', 1: 'OK', 2: 'OVER_LIMIT' };

export const checkBodySchema = z.strictObject({
  domain: z.string(),
  descriptors: z.array(
    z.strictObject({
      entries: z.array(z.strictObject({ key: z.string(), value: z.string().default('') })),
      hits_addend: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).optional(),
      limit: z
        .strictObject({
          requests_per_unit: z.number().int().min(0).max(MAX_UINT32),
          unit: z.enum(REQUEST_UNIT_NAMES),
        })
        .optional(),
    }),
  ),
  hits_addend: z.number().int().min(0).max(MAX_UINT32).optional(),
});

export type CheckBody = z.output<typeof checkBodySchema>;

export interface HttpHealth {
  readonly ok: boolean;
  readonly details: Record<string, unknown>;
}

/** The slice of one global quota this cell decides with now. */
export interface QuotaInForce {
  readonly key: string;
  /** leased: a live grant; floor: the grant's floor (lease expired, fail-static); static: this
   * cell's static share (no grant yet, or no coordinator). */
  readonly source: 'leased' | 'floor' | 'static' | 'unknown-allowed';
  readonly rate: number;
  readonly burst: number;
}

export interface HttpApiDeps {
  readonly check: CheckService;
  /** The slice in force for a quota key (tenant/ID, tier/NAME, domain/NAME), null when none. */
  readonly quota?: (key: string) => QuotaInForce | null;
  readonly metrics: () => Promise<{ contentType: string; body: string }>;
  readonly health: () => HttpHealth;
  /** Serve /v1/forward-auth with these routes and trusted proxies. */
  readonly forwardAuth?: ForwardAuthDeps;
}

export interface HttpApiOptions {
  readonly host: string;
  readonly port: number;
  readonly bodyLimit: number;
  /** --forward-auth-socket: /v1/forward-auth also on this Unix socket (front-door/forward-auth-socket.ts). */
  readonly forwardAuthSocket?: UnixListen;
}

export interface HttpApiHandle {
  /** http://host:port */
  readonly url: string;
  readonly app: FastifyInstance;
  close(): Promise<void>;
}

/** The `error` of the API's error answers (docs/interfaces.md): a contract, never renamed. */
type AgentApiErrorCode =
  | 'validation_failed'
  | 'invalid_argument'
  | 'bad_request'
  | 'not_found'
  | 'payload_too_large'
  | 'unsupported_media_type'
  | 'internal'
  | 'error';

class ApiError extends CellquotaError {
  constructor(
    readonly statusCode: number,
    readonly code: AgentApiErrorCode,
    message: string,
    readonly details: unknown = null,
  ) {
    super(message);
  }
}

export function toRlsRequest(body: CheckBody): RlsRequest {
  return {
    domain: body.domain,
    hitsAddend: body.hits_addend ?? 0,
    descriptors: body.descriptors.map((d) => ({
      entries: d.entries.map((e) => ({ key: e.key, value: e.value })),
      hitsAddend: d.hits_addend ?? null,
      limit:
        d.limit === undefined ? null : { requestsPerUnit: d.limit.requests_per_unit, unit: REQUEST_UNIT[d.limit.unit] },
    })),
  };
}

function statusJson(s: RlsDescriptorStatus): Record<string, unknown> {
  const out: Record<string, unknown> = { code: CODE_NAMES[s.code] ?? 'UNKNOWN', limit_remaining: s.limitRemaining };
  if (s.currentLimit !== null) {
    out['current_limit'] = {
      requests_per_unit: s.currentLimit.requestsPerUnit,
      unit: RESPONSE_UNIT_NAMES[s.currentLimit.unit] ?? 'UNKNOWN',
      name: s.currentLimit.name,
    };
  }
  if (s.durationUntilReset !== null) out['duration_until_reset'] = `${s.durationUntilReset.seconds}s`;
  return out;
}

export function responseJson(r: RlsResponse): Record<string, unknown> {
  return {
    overall_code: CODE_NAMES[r.overallCode] ?? 'UNKNOWN',
    statuses: r.statuses.map(statusJson),
    response_headers_to_add: r.responseHeadersToAdd.map((h) => ({ key: h.key, value: h.value })),
    degraded: r.responseHeadersToAdd.some((h) => h.key === DEGRADED_HEADER),
    ...refusalJson(r),
  };
}

/** A refusal's provenance (from its headers) as `refused_by` {level, limit, decided_on, cell}. */
function refusalJson(r: RlsResponse): { refused_by?: Record<string, string | null> } {
  const get = (k: string): string | null => r.responseHeadersToAdd.find((h) => h.key === k)?.value ?? null;
  const level = get(REFUSED_BY_HEADER);
  if (level === null) return {};
  return {
    refused_by: { level, limit: get(REFUSED_LIMIT_HEADER), decided_on: get(DECIDED_ON_HEADER), cell: get(CELL_HEADER) },
  };
}

export async function startHttpApi(opts: HttpApiOptions, deps: HttpApiDeps, logger: Logger): Promise<HttpApiHandle> {
  const fa = deps.forwardAuth;
  // Forward-auth is answered on node:http ahead of fastify (front-door/forward-auth-http.ts).
  const lean = fa === undefined ? null : forwardAuthHandler(fa, deps.check, opts.bodyLimit, logger);
  const app = Fastify({
    logger: false,
    bodyLimit: opts.bodyLimit,
    return503OnClosing: true,
    ...(lean === null
      ? {}
      : {
          serverFactory: (handler: (req: IncomingMessage, res: ServerResponse) => void) => {
            const server = createServer((req, res) => {
              if (isForwardAuthUrl(req.url)) lean(req, res);
              else handler(req, res);
            });
            server.keepAliveTimeout = 72_000; // fastify's default for the servers it creates itself
            return server;
          },
        }),
  });

  app.setErrorHandler((error: FastifyError | ApiError, _request, reply) => {
    if (error instanceof ApiError) {
      void reply.code(error.statusCode).send({ error: error.code, message: error.message, details: error.details });
      return;
    }
    const status =
      typeof error.statusCode === 'number' && error.statusCode >= 400 && error.statusCode < 600
        ? error.statusCode
        : 500;
    const name: AgentApiErrorCode =
      status === 413
        ? 'payload_too_large'
        : status === 415
          ? 'unsupported_media_type'
          : status === 400
            ? 'bad_request'
            : status >= 500
              ? 'internal'
              : 'error';
    if (status >= 500) logger.error({ err: error }, 'http api error');
    void reply.code(status).send({
      error: name,
      message: status >= 500 ? 'internal error' : error.message,
      details: error.code === undefined ? null : { code: error.code },
    });
  });
  app.setNotFoundHandler((request, reply) => {
    void reply
      .code(404)
      .send({ error: 'not_found', message: `no route ${request.method} ${request.url}`, details: null });
  });

  app.post('/v1/check', (request, reply) => {
    const parsed = checkBodySchema.safeParse(request.body);
    if (!parsed.success) {
      throw new ApiError(
        400,
        'validation_failed',
        'the request body does not match the check schema',
        parsed.error.issues.map((i) => ({ path: i.path.map(String).join('.'), message: i.message })),
      );
    }
    const req = toRlsRequest(parsed.data);
    const out = deps.check.check(req);
    if (out.kind === 'error') throw new ApiError(400, out.code === 3 ? 'invalid_argument' : 'bad_request', out.message);
    const headers = rateLimitHeaders(out.response.statuses);
    for (const h of headers) void reply.header(h.key, h.value);
    for (const h of out.response.responseHeadersToAdd) {
      if (h.key === DEGRADED_HEADER || h.key === FAIL_OPEN_HEADER || PROVENANCE_HEADERS.includes(h.key))
        void reply.header(h.key, h.value);
    }
    if (out.overLimit) {
      const seconds = Number((out.retryAfterNs + 999_999_999n) / 1_000_000_000n);
      void reply.header('Retry-After', String(Math.max(1, seconds)));
      return reply.code(429).send(responseJson(out.response));
    }
    return reply.code(200).send(responseJson(out.response));
  });

  const quotaParams = z.strictObject({
    kind: z.enum(['tenant', 'tier', 'domain']),
    name: z
      .string()
      .min(1)
      .max(128)
      .regex(/^[a-zA-Z0-9._:-]+$/),
  });
  app.get('/v1/quotas/:kind/:name', (request, reply) => {
    const parsed = quotaParams.safeParse(request.params);
    if (!parsed.success)
      throw new ApiError(
        400,
        'bad_request',
        'the quota key is KIND/NAME with KIND tenant, tier or domain and NAME of letters, digits and . _ : -',
        z.treeifyError(parsed.error),
      );
    const key = `${parsed.data.kind}/${parsed.data.name}`;
    const q = deps.quota?.(key) ?? null;
    if (q === null) throw new ApiError(404, 'not_found', `no global quota ${key} in this cell`);
    return reply.code(200).send(q);
  });

  app.get('/metrics', async (_request, reply) => {
    const m = await deps.metrics();
    return reply.type(m.contentType).send(m.body);
  });

  app.get('/healthz', (_request, reply) => {
    const h = deps.health();
    return reply.code(h.ok ? 200 : 503).send({ status: h.ok ? 'ok' : 'degraded', ...h.details });
  });

  await app.listen({ host: opts.host, port: opts.port });
  const address = app.server.address();
  const port = typeof address === 'object' && address !== null ? address.port : opts.port;
  const host = opts.host.includes(':') ? `[${opts.host}]` : opts.host;
  let socket = null;
  if (opts.forwardAuthSocket !== undefined && fa !== undefined) {
    try {
      const overSocket = forwardAuthHandler(fa, deps.check, opts.bodyLimit, logger, UNIX_PEER);
      socket = await startForwardAuthSocket(opts.forwardAuthSocket, overSocket);
    } catch (error) {
      await app.close();
      throw error;
    }
  }
  const faSocket = socket;
  return {
    url: `http://${host}:${port}`,
    app,
    close: async () => {
      await Promise.all([app.close(), faSocket?.close()]);
    },
  };
}
