// Forward-auth: the question nginx (`auth_request`), Caddy (`forward_auth`), Traefik (`ForwardAuth`)
// and Envoy (`ext_authz`, HTTP mode) ask before forwarding a request, and the answer. Shared by the
// agent's `/v1/forward-auth` route and the gateway, so both decide the same request the same way.
//
// The question (headers of the auth request):
//   client   shared/client-address.ts over the socket peer, X-Forwarded-For and X-Real-IP
//   method   X-Forwarded-Method, else the auth request's own method (nginx and Envoy keep it)
//   host     X-Forwarded-Host, else Host
//   uri      X-Forwarded-Uri, else X-Original-URI (nginx), else the auth request's own path with the
//            `/v1/forward-auth` prefix removed (Envoy's ext_authz appends the original path)
// The answer: 200 with RateLimit-Limit / -Remaining / -Reset when allowed; when refused 429 (or the
// `denyStatus`, for nginx, which passes only 401/403 on) with Retry-After in whole seconds (≥ 1) and
// the same RateLimit headers; x-ratelimit-degraded / x-ratelimit-fail-open as the check API.
import { clientAddress } from '../../shared/client-address.js';
import type { AddressSet } from '../../shared/client-address.js';
import type { CheckOutcome } from '../decide/check-service.js';
import { DEGRADED_HEADER, FAIL_OPEN_HEADER, rateLimitHeaders } from '../decide/decide.js';
import type { ForwardedRequest } from './routes.js';

export const FORWARD_AUTH_PATH = '/v1/forward-auth';
/** Statuses a refusal may be given as (`--forward-auth-deny-status`). */
export const DENY_STATUSES = [429, 401, 403] as const;
export type DenyStatus = (typeof DENY_STATUSES)[number];
/** The longest forwarded URI / host looked at; longer ones are cut (they are only matched). */
const MAX_URI_LENGTH = 8192;
const MAX_HOST_LENGTH = 512;

export interface ClientKeyOptions {
  readonly trusted: AddressSet;
  readonly ipv6Prefix?: number;
}

type Headers = Readonly<Record<string, string | string[] | undefined>>;

function first(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

/**
 * The forwarded request an auth request asks about. `headers` are Node's (lower-case names),
 * `peer` the socket's remote address, `method` / `url` the auth request's own.
 */
export function forwardedRequest(
  headers: Headers,
  peer: string | undefined,
  method: string,
  url: string,
  opts: ClientKeyOptions,
): ForwardedRequest {
  const client = clientAddress({
    peer,
    forwardedFor: headers['x-forwarded-for'],
    realIp: headers['x-real-ip'],
    trusted: opts.trusted,
    ...(opts.ipv6Prefix === undefined ? {} : { ipv6Prefix: opts.ipv6Prefix }),
  });
  const fm = first(headers['x-forwarded-method']);
  const fh = first(headers['x-forwarded-host']) ?? first(headers['host']) ?? '';
  let uri = first(headers['x-forwarded-uri']) ?? first(headers['x-original-uri']);
  if (uri === undefined) {
    uri = url.startsWith(FORWARD_AUTH_PATH) ? url.slice(FORWARD_AUTH_PATH.length) : url;
    if (!uri.startsWith('/')) uri = `/${uri.startsWith('?') ? '' : uri}`;
  }
  return {
    client,
    method: (fm ?? method).trim().toUpperCase().slice(0, 32),
    host: fh.trim().toLowerCase().replace(/\.$/, '').slice(0, MAX_HOST_LENGTH),
    uri: uri.slice(0, MAX_URI_LENGTH),
    header: (name) => {
      const v = headers[name];
      return Array.isArray(v) ? v.join(', ') : v;
    },
  };
}

/** The HTTP answer to a decided check (an 'answer' outcome). */
export interface FrontDoorAnswer {
  readonly allowed: boolean;
  readonly status: number;
  /**
   * Its headers in node:http's flat form (name, value, name, value, …), this answer's own array:
   * a caller may push its own (content-length) and hand it to `writeHead` as it is.
   */
  readonly headers: string[];
}

/** Retry-After in whole seconds, at least 1. */
export function retryAfterSeconds(retryAfterNs: bigint): number {
  return Math.max(1, Number((retryAfterNs + 999_999_999n) / 1_000_000_000n));
}

export function answerFor(out: Extract<CheckOutcome, { kind: 'answer' }>, denyStatus: DenyStatus): FrontDoorAnswer {
  const headers: string[] = [];
  for (const h of rateLimitHeaders(out.response.statuses)) headers.push(h.key, h.value);
  for (const h of out.response.responseHeadersToAdd) {
    if (h.key === DEGRADED_HEADER || h.key === FAIL_OPEN_HEADER) headers.push(h.key, h.value);
  }
  if (!out.overLimit) return { allowed: true, status: 200, headers };
  headers.push('Retry-After', String(retryAfterSeconds(out.retryAfterNs)));
  return { allowed: false, status: denyStatus, headers };
}
