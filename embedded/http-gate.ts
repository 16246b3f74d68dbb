// What the fastify plugin and the express middleware share: from an HTTP request to a decision and
// the response headers. The client address is shared/client-address.ts (the same rules as the
// agent's forward-auth): the socket peer, or behind trusted proxies the rightmost untrusted
// X-Forwarded-For entry; IPv6 grouped by /64; IPv4-mapped IPv6 as IPv4.
//
// Headers (draft-ietf-httpapi-ratelimit-headers-10): `RateLimit-Policy` lists every policy the
// request met as `"name";q=<limit>;w=<window s>` and `RateLimit` their state as
// `"name";r=<remaining>;t=<reset s>` (Structured Field Lists of Strings with Integer parameters);
// `legacy` sends the older RateLimit-Limit / -Remaining / -Reset of the tightest policy instead.
// A refusal adds `Retry-After` (whole seconds, from when the refused hits would pass).
import type { IncomingHttpHeaders } from 'node:http';
import { z } from 'zod';
import { clientAddress, parseAddressList, parseTrustedProxies } from '../shared/client-address.js';
import type { AddressSet } from '../shared/client-address.js';
import type { Descriptor, LimitDecision, Limiter, PolicyStatus } from './limiter.js';
import { LimiterInputError, countersOf, createLimiter } from './limiter.js';
import type { LimiterLogger, LimiterOptions } from './options.js';
import { limiterOptionsOf, parseWith } from './options.js';

export type { Descriptor, LimitDecision, Limiter, PolicyStatus } from './limiter.js';

export type HeaderMode = 'draft-10' | 'legacy' | 'both' | 'none';

/** Options of the HTTP integrations (beside the limiter's own), for a request type `Req`. */
export interface HttpOptions<Req> {
  /** Addresses and CIDRs (IPv4, IPv6) of proxies allowed to say who the client is (X-Forwarded-For). */
  readonly trustedProxies?: readonly string[];
  /** IPv6 clients are grouped by this prefix (default 64; 128: every address on its own). */
  readonly ipv6Prefix?: number;
  /** Clients (addresses, CIDRs) never limited. */
  readonly allowList?: readonly string[];
  /** The descriptors of a request; default `[[{ key: 'remote_address', value: client }]]`. */
  readonly descriptors?: (request: Req, client: string) => readonly Descriptor[];
  /** Which rate-limit headers to send (default 'draft-10'). */
  readonly headers?: HeaderMode;
  /** Send them on admitted responses too (default true); a refusal always carries them (unless 'none'). */
  readonly headersOnAllowed?: boolean;
  /** Status of a refusal (default 429). */
  readonly statusCode?: number;
}

const NAME = /^[\x20-\x7e]{1,128}$/;

export const httpOptionsSchema = z.object({
  trustedProxies: z.array(z.string()).max(1024).default([]),
  ipv6Prefix: z.number().int().min(0).max(128).default(64),
  allowList: z.array(z.string()).max(1024).default([]),
  descriptors: z
    .custom<(request: unknown, client: string) => readonly Descriptor[]>(
      (v) => typeof v === 'function',
      'a function (request, client) => descriptors',
    )
    .optional(),
  headers: z.enum(['draft-10', 'legacy', 'both', 'none']).default('draft-10'),
  headersOnAllowed: z.boolean().default(true),
  statusCode: z.number().int().min(400).max(599).default(429),
});

export interface GateResult {
  readonly client: string;
  /** null: allow-listed (not checked). */
  readonly decision: LimitDecision | null;
  /** Refuse the request (status, Retry-After and headers to send). */
  readonly refused: boolean;
  /** [name, value] to set on the response. */
  readonly headers: readonly (readonly [string, string])[];
}

export const FAIL_OPEN_HEADER = 'x-ratelimit-fail-open';

/** Logs at most one line a second for a kind of failure, with the number suppressed since. */
export class RateLimitedLog {
  private last = 0;
  private suppressed = 0;
  constructor(private readonly logger: LimiterLogger) {}

  error(fields: Record<string, unknown>, msg: string): void {
    const now = Date.now();
    if (now - this.last < 1000) {
      this.suppressed++;
      return;
    }
    this.logger.error({ ...fields, suppressed: this.suppressed }, msg);
    this.last = now;
    this.suppressed = 0;
  }
}

const NO_HEADERS: readonly (readonly [string, string])[] = Object.freeze([]);

export class HttpGate<Req> {
  readonly statusCode: number;
  private readonly trusted: AddressSet;
  private readonly allow: AddressSet | null;
  private readonly ipv6Prefix: number;
  private readonly descriptors: ((request: Req, client: string) => readonly Descriptor[]) | null;
  private readonly mode: HeaderMode;
  private readonly onAllowed: boolean;
  private readonly errors: RateLimitedLog;

  constructor(
    readonly limiter: Limiter,
    options: HttpOptions<Req>,
    logger: LimiterLogger,
    what: string,
  ) {
    const o = parseWith(httpOptionsSchema, pick(options), what);
    this.trusted = parseTrustedProxies(o.trustedProxies);
    this.allow = o.allowList.length === 0 ? null : parseAddressList(o.allowList, 'allow-list');
    this.ipv6Prefix = o.ipv6Prefix;
    this.descriptors = (o.descriptors as ((request: Req, client: string) => readonly Descriptor[]) | undefined) ?? null;
    this.mode = o.headers;
    this.onAllowed = o.headersOnAllowed;
    this.statusCode = o.statusCode;
    this.errors = new RateLimitedLog(logger);
  }

  decide(request: Req, peer: string | undefined, headers: IncomingHttpHeaders): GateResult {
    const forwardedFor = headers['x-forwarded-for'];
    const realIp = headers['x-real-ip'];
    const client = clientAddress({ peer, forwardedFor, realIp, trusted: this.trusted, ipv6Prefix: this.ipv6Prefix });
    if (this.allow !== null) {
      const exact =
        this.ipv6Prefix === 128 || !client.includes(':')
          ? client
          : clientAddress({ peer, forwardedFor, realIp, trusted: this.trusted, ipv6Prefix: 128 });
      if (this.allow.has(exact)) return { client, decision: null, refused: false, headers: NO_HEADERS };
    }
    let decision: LimitDecision;
    try {
      const descriptors =
        this.descriptors === null ? [[{ key: 'remote_address', value: client }]] : this.descriptors(request, client);
      decision = this.limiter.check({ descriptors });
    } catch (error) {
      if (error instanceof LimiterInputError) {
        // Descriptors over the request bounds come from the request itself (a header copied into a
        // value): refusing them keeps a client from buying its way out of the limit with a long header.
        const c = countersOf(this.limiter);
        if (c !== undefined) c.invalidOutside++;
        this.errors.error(
          { limiter: this.limiter.name, error: error.message },
          'cellquota: descriptors over the request bounds; request refused',
        );
        return { client, decision: null, refused: true, headers: [['retry-after', '1']] };
      }
      const c = countersOf(this.limiter);
      if (c !== undefined) c.failOpenOutside++;
      this.errors.error(
        { limiter: this.limiter.name, err: error },
        'cellquota: building the descriptors failed; request let through (fail-open)',
      );
      return { client, decision: null, refused: false, headers: [[FAIL_OPEN_HEADER, 'true']] };
    }
    const refused = !decision.allowed;
    if (decision.failOpen) return { client, decision, refused: false, headers: [[FAIL_OPEN_HEADER, 'true']] };
    if (!refused && (!this.onAllowed || this.mode === 'none'))
      return { client, decision, refused, headers: NO_HEADERS };
    const out = rateLimitHeaders(decision.policies, this.mode);
    if (refused) out.push(['retry-after', String(decision.retryAfterSeconds)]);
    return { client, decision, refused, headers: out };
  }
}

function pick<Req>(o: HttpOptions<Req>): Record<string, unknown> {
  const { trustedProxies, ipv6Prefix, allowList, descriptors, headers, headersOnAllowed, statusCode } = o;
  return { trustedProxies, ipv6Prefix, allowList, descriptors, headers, headersOnAllowed, statusCode };
}

// ---- headers ------------------------------------------------------------------------------------
// Serialized here rather than through a structured-fields library: the values are fixed templates
// (a String and Integer parameters), and the policy names are cleaned to what sf-string allows. The
// tests parse every header with the structured-headers package.

/** A policy name as an sf-string: printable ASCII, `"` and `\` escaped; anything else becomes `_`. */
export function sfString(name: string): string {
  const clean = NAME.test(name) ? name : name.slice(0, 128).replace(/[^\x20-\x7e]/g, '_') || 'policy';
  return `"${clean.replace(/[\\"]/g, '\\$&')}"`;
}

/** The headers for the policies a request met, in `mode`. */
export function rateLimitHeaders(policies: readonly PolicyStatus[], mode: HeaderMode): [string, string][] {
  const out: [string, string][] = [];
  if (policies.length === 0 || mode === 'none') return out;
  if (mode === 'draft-10' || mode === 'both') {
    let policy = '';
    let state = '';
    const seen = new Set<string>();
    for (const p of policies) {
      let name = p.name;
      for (let n = 2; seen.has(name); n++) name = `${p.name}#${n}`;
      seen.add(name);
      const id = sfString(name);
      policy += `${policy === '' ? '' : ', '}${id};q=${p.limit};w=${p.windowSeconds}`;
      state += `${state === '' ? '' : ', '}${id};r=${p.remaining};t=${p.resetSeconds}`;
    }
    out.push(['ratelimit-policy', policy], ['ratelimit', state]);
  }
  if (mode === 'legacy' || mode === 'both') {
    // envoyproxy/ratelimit's choice: the first refused policy, else the one with the fewest remaining.
    let chosen = policies[0] as PolicyStatus;
    for (const p of policies) {
      if (p.overLimit) {
        chosen = p;
        break;
      }
      if (p.remaining < chosen.remaining) chosen = p;
    }
    out.push(
      ['ratelimit-limit', String(chosen.limit)],
      ['ratelimit-remaining', String(chosen.remaining)],
      ['ratelimit-reset', String(chosen.resetSeconds)],
    );
  }
  return out;
}

/** What both middlewares take: the limiter's options (unless `limiter` is given), the HTTP options, the refusal. */
export type GateOptions<Req> = (LimiterOptions | { readonly limiter: Limiter; readonly logger?: LimiterLogger }) &
  HttpOptions<Req> & {
    /** The body of a refusal: a value (sent as JSON unless a string) or a function of the request and decision. */
    readonly body?: unknown;
  };

/** The limiter given as `limiter`, or one started from the options (`own`: the middleware closes it). */
export async function limiterOf<Req>(
  options: GateOptions<Req>,
  logger: LimiterLogger,
): Promise<{ readonly limiter: Limiter; readonly own: boolean }> {
  if ('limiter' in options) return { limiter: options.limiter, own: false };
  return { limiter: await createLimiter(limiterOptionsOf(options, logger)), own: true };
}

/** What a refusal answers: `body` (a value, or a function of the request and the decision), else the default. */
export function refusalPayload<Req>(body: unknown, request: Req, decision: LimitDecision | null): unknown {
  if (typeof body === 'function') return (body as (q: Req, d: LimitDecision | null) => unknown)(request, decision);
  return body ?? defaultRefusalBody(decision);
}

/** The default refusal body (JSON). */
export function defaultRefusalBody(decision: LimitDecision | null): {
  statusCode: number;
  error: string;
  message: string;
  retryAfterSeconds: number;
} {
  const after = decision?.retryAfterSeconds ?? 1;
  return {
    statusCode: 429,
    error: 'Too Many Requests',
    message: `rate limit exceeded, retry in ${after} s`,
    retryAfterSeconds: after,
  };
}
